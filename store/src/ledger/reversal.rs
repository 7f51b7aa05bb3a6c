//! Money going back to the payer: refunds and disputes of a confirmed top-up. Both ledgers
//! apply the same rules, written once here: the credits a reversal is worth (its share of the
//! top-up's credits), how much of it the balance can give up (never below zero, never below
//! what running turns hold; the rest is owed), and what each dispute stage does.

use serde::Serialize;
use time::OffsetDateTime;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReversalKind {
    Refund,
    /// A dispute opened: its amount is taken back while the bank decides.
    Dispute,
    /// A dispute won: what was taken back is returned.
    DisputeWon,
}

impl ReversalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refund => "refund",
            Self::Dispute => "dispute",
            Self::DisputeWon => "dispute_won",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Refund, Self::Dispute, Self::DisputeWon]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

/// One refund or dispute movement, as the billing history shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Reversal {
    /// Unique per movement, which is what makes it happen once.
    pub id: String,
    pub account_id: String,
    /// The top-up it reverses.
    pub reference: String,
    pub kind: ReversalKind,
    pub usd_cents: u64,
    /// Credits taken off the balance, or given back to it for a dispute won.
    pub credits: u64,
    /// Credits the balance could not give up (now owed), or, for a dispute won, owed
    /// credits cleared instead of being given back.
    pub owed: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DisputeStage {
    Opened,
    Won,
    Lost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DisputeStatus {
    Open,
    Won,
    Lost,
}

impl DisputeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Won => "won",
            Self::Lost => "lost",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Open, Self::Won, Self::Lost]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

/// Which way a dispute stage moves the disputed amount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Movement {
    TakeBack,
    GiveBack,
}

/// A dispute's next status and what the stage moves, from what is known of it. A stage that
/// arrives after the dispute closed moves nothing; a close seen before the opening moves
/// what the whole dispute moved (nothing when won, the amount when lost).
pub fn dispute_step(
    known: Option<DisputeStatus>,
    stage: DisputeStage,
) -> Option<(DisputeStatus, Option<Movement>)> {
    use DisputeStage as S;
    use DisputeStatus as D;
    match (known, stage) {
        (None, S::Opened) => Some((D::Open, Some(Movement::TakeBack))),
        (None, S::Won) => Some((D::Won, None)),
        (None, S::Lost) => Some((D::Lost, Some(Movement::TakeBack))),
        (Some(D::Open), S::Won) => Some((D::Won, Some(Movement::GiveBack))),
        (Some(D::Open), S::Lost) => Some((D::Lost, None)),
        (Some(_), _) => None,
    }
}

/// The credits `part_cents` of a top-up of `credits` for `whole_cents` are worth.
pub fn share(credits: u64, part_cents: u64, whole_cents: u64) -> u64 {
    if whole_cents == 0 {
        return 0;
    }
    let part = part_cents.min(whole_cents);
    u64::try_from(u128::from(credits) * u128::from(part) / u128::from(whole_cents))
        .unwrap_or(credits)
}

/// Of `wanted` credits, what a balance with `available` unheld credits gives up, and what
/// stays owed.
pub fn take(available: u64, wanted: u64) -> (u64, u64) {
    let taken = wanted.min(available);
    (taken, wanted - taken)
}

/// Of `credits` given back to an account that owes `owed`, what clears the debt and what
/// goes to the balance.
pub fn give(owed: u64, credits: u64) -> (u64, u64) {
    let cleared = credits.min(owed);
    (cleared, credits - cleared)
}

/// What of a top-up of `paid_cents` the payer has paid and kept after the reversals `moved`
/// (each one's kind and cents): its part of the lifetime top-up. A reversal moves the lifetime
/// by the change of this, so a dispute won after a full refund gives back nothing: the money
/// went back to the payer by the refund, and the dispute's opening took nothing more.
pub fn kept_cents(paid_cents: u64, moved: impl IntoIterator<Item = (ReversalKind, u64)>) -> u64 {
    let (taken, returned) = moved.into_iter().fold(
        (0u64, 0u64),
        |(taken, returned), (kind, cents)| match kind {
            ReversalKind::Refund | ReversalKind::Dispute => (taken.saturating_add(cents), returned),
            ReversalKind::DisputeWon => (taken, returned.saturating_add(cents)),
        },
    );
    paid_cents
        .saturating_add(returned)
        .saturating_sub(taken)
        .min(paid_cents)
}

/// `lifetime` once a top-up's kept part went from `before` to `after` cents.
pub fn moved_lifetime(lifetime: u64, before: u64, after: u64) -> u64 {
    lifetime.saturating_add(after).saturating_sub(before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reversal_is_worth_its_share_of_the_top_ups_credits() {
        assert_eq!(share(2_500_000, 1_000, 2_500), 1_000_000);
        assert_eq!(share(2_500_000, 2_500, 2_500), 2_500_000);
        assert_eq!(share(2_500_000, 9_999, 2_500), 2_500_000);
    }

    #[test]
    fn what_the_balance_cannot_give_up_is_owed_and_paid_back_first() {
        assert_eq!(take(300, 1_000), (300, 700));
        assert_eq!(take(5_000, 1_000), (1_000, 0));
        assert_eq!(give(700, 1_000), (700, 300));
        assert_eq!(give(0, 1_000), (0, 1_000));
    }

    #[test]
    fn a_top_up_keeps_what_was_neither_refunded_nor_held_by_a_dispute() {
        use ReversalKind as K;
        assert_eq!(kept_cents(100, []), 100);
        assert_eq!(kept_cents(100, [(K::Refund, 30)]), 70);
        assert_eq!(
            kept_cents(100, [(K::Dispute, 100), (K::DisputeWon, 100)]),
            100
        );
        let refunded_then_won = [(K::Refund, 100), (K::Dispute, 100), (K::DisputeWon, 100)];
        assert_eq!(kept_cents(100, refunded_then_won), 0);
        assert_eq!(kept_cents(100, [(K::Refund, 100), (K::Dispute, 100)]), 0);
    }

    #[test]
    fn each_dispute_stage_moves_money_once_in_any_order() {
        use DisputeStage as S;
        use DisputeStatus as D;
        let open = dispute_step(None, S::Opened);
        assert_eq!(open, Some((D::Open, Some(Movement::TakeBack))));
        assert_eq!(dispute_step(Some(D::Open), S::Opened), None);
        assert_eq!(
            dispute_step(Some(D::Open), S::Won),
            Some((D::Won, Some(Movement::GiveBack)))
        );
        assert_eq!(dispute_step(Some(D::Open), S::Lost), Some((D::Lost, None)));
        assert_eq!(dispute_step(None, S::Won), Some((D::Won, None)));
        assert_eq!(dispute_step(Some(D::Won), S::Opened), None);
        assert_eq!(
            dispute_step(None, S::Lost),
            Some((D::Lost, Some(Movement::TakeBack)))
        );
        assert_eq!(dispute_step(Some(D::Lost), S::Opened), None);
    }
}
