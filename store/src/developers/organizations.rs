//! Organizations: an account is owned by the dashboard users whose account it is, each with a
//! role, and joined by invitation. The rules of who may do what are here, once, for both
//! stores and the pages: the stores check the member rules (an admin never touches an owner,
//! an organization keeps an owner) in the same step as the change.

use serde::Serialize;
use serde_json::{json, Value};
use time::OffsetDateTime;

use super::User;
use crate::accounts::KeyHash;
use crate::audit::{Action, Actor, AuditEntry};

/// A member's role in the organization that owns an account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Billing, members, everything.
    Owner,
    /// Keys, caps, members other than owners, the audit log.
    Admin,
    /// Creates and revokes their own keys; sees usage.
    Developer,
    /// Top-ups, invoices and usage; no keys.
    Billing,
}

pub const ROLES: [Role; 4] = [Role::Owner, Role::Admin, Role::Developer, Role::Billing];

/// What a page or form needs beyond being a member (the overview and usage need nothing more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    /// Create keys, and revoke one's own.
    Keys,
    /// See and revoke every key of the account.
    AllKeys,
    /// Top-ups, checkouts, auto-reload.
    Billing,
    /// List, invite, change and remove members.
    Members,
    /// Read the account's audit log.
    Audit,
}

impl Role {
    pub fn as_str(self) -> String {
        crate::db::name_of(&self)
    }

    pub fn parse(name: &str) -> Option<Self> {
        crate::db::parse_name(&ROLES, name)
    }

    pub fn may(self, permission: Permission) -> bool {
        use Permission::*;
        match self {
            Role::Owner => true,
            Role::Admin => matches!(permission, Keys | AllKeys | Members | Audit),
            Role::Developer => permission == Keys,
            Role::Billing => permission == Billing,
        }
    }

    /// Whether a member in this role may move a member in role `from` to `to` (`None`:
    /// remove them) or, with `from` absent, invite someone as `to`: owners may do anything,
    /// admins anything that neither touches nor makes an owner, others nothing.
    pub fn may_manage(self, from: Option<Role>, to: Option<Role>) -> bool {
        match self {
            Role::Owner => true,
            Role::Admin => from != Some(Role::Owner) && to != Some(Role::Owner),
            Role::Developer | Role::Billing => false,
        }
    }
}

/// An invitation to join an account's organization, mailed as a link.
#[derive(Clone, Debug)]
pub struct Invitation {
    /// SHA-256 of the link's token; the token itself is never stored.
    pub token_hash: KeyHash,
    pub account_id: String,
    /// Trimmed and lower-cased: only a user of this email may accept it.
    pub email: String,
    pub role: Role,
    /// The email of the member who sent it.
    pub invited_by: String,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
}

/// How many invitations may be sent within [`InvitationLimits::window`]: by one organization,
/// and to one address (from every organization). Counted from the audit log's
/// `invitation_sent` rows, so a withdrawn invitation still counts: withdrawing and inviting
/// again sends another mail.
#[derive(Clone, Copy, Debug)]
pub struct InvitationLimits {
    pub per_organization: u32,
    pub per_address: u32,
    pub window: time::Duration,
}

/// Which of the [`InvitationLimits`] an invitation would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvitationLimit {
    Organization,
    Address,
}

/// What following an invitation came to.
#[derive(Debug)]
pub enum Acceptance {
    /// The user is a member now (their sessions ended): the user after.
    Accepted(User),
    /// No such invitation: never sent, expired, or already accepted.
    Unknown,
    /// The invitation is for another email; it stays.
    WrongEmail,
    /// The user is the last owner of an organization with other members, which would be
    /// left without one; the invitation stays.
    LastOwner,
}

/// What a change to a member came to.
#[derive(Debug)]
pub enum MemberChange {
    /// Done: the member as they were before.
    Done(User),
    Refused(Refusal),
}

/// Why a change to a member was not made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    NoSuchMember,
    /// The acting member's role does not allow it (an admin and an owner).
    NotAllowed,
    /// It would leave the organization without an owner.
    LastOwner,
    /// The member already has that role: nothing changed, nothing audited.
    Unchanged,
}

/// Checks a change of `member` (of the organization `members`) to `to` (`None`: removal) by
/// a member in role `acting`: `None` when it may go ahead.
pub(super) fn refusal(
    members: &[(String, Role)],
    member: &User,
    to: Option<Role>,
    acting: Role,
) -> Option<Refusal> {
    if to == Some(member.role) {
        return Some(Refusal::Unchanged);
    }
    if !acting.may_manage(Some(member.role), to) {
        return Some(Refusal::NotAllowed);
    }
    let owners_after = members
        .iter()
        .filter(|(id, role)| {
            let role = if *id == member.id { to } else { Some(*role) };
            role == Some(Role::Owner)
        })
        .count();
    (owners_after == 0).then_some(Refusal::LastOwner)
}

/// Whether `user` may leave their organization (of `members`) for another: not as its last
/// owner while others remain in it.
pub(super) fn may_leave(members: &[(String, Role)], user: &User) -> bool {
    let others = members.iter().filter(|(id, _)| *id != user.id);
    user.role != Role::Owner
        || others.clone().count() == 0
        || others.into_iter().any(|(_, role)| *role == Role::Owner)
}

fn entry(by: &Actor, account_id: &str, action: Action, target: &str) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: account_id.to_owned(),
        action,
        target: target.to_owned(),
        before: Value::Null,
        after: Value::Null,
    }
}

pub(super) fn invitation_sent(invitation: &Invitation, by: &Actor) -> AuditEntry {
    AuditEntry {
        after: json!({ "role": invitation.role }),
        ..entry(
            by,
            &invitation.account_id,
            Action::InvitationSent,
            &invitation.email,
        )
    }
}

pub(super) fn invitation_withdrawn(invitation: &Invitation, by: &Actor) -> AuditEntry {
    AuditEntry {
        before: json!({ "role": invitation.role }),
        ..entry(
            by,
            &invitation.account_id,
            Action::InvitationWithdrawn,
            &invitation.email,
        )
    }
}

pub(super) fn invitation_accepted(before: &User, after: &User, by: &Actor) -> AuditEntry {
    AuditEntry {
        before: json!({ "account_id": before.account_id, "role": before.role }),
        after: json!({ "account_id": after.account_id, "role": after.role }),
        ..entry(
            by,
            &after.account_id,
            Action::InvitationAccepted,
            &after.email,
        )
    }
}

pub(super) fn role_changed(before: &User, to: Role, by: &Actor) -> AuditEntry {
    AuditEntry {
        before: json!({ "role": before.role }),
        after: json!({ "role": to }),
        ..entry(
            by,
            &before.account_id,
            Action::MemberRoleChanged,
            &before.email,
        )
    }
}

pub(super) fn removed(before: &User, by: &Actor) -> AuditEntry {
    AuditEntry {
        before: json!({ "role": before.role }),
        ..entry(by, &before.account_id, Action::MemberRemoved, &before.email)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_has_the_permissions_of_its_description() {
        use Permission::*;
        let all = [Keys, AllKeys, Billing, Members, Audit];
        let granted = |role: Role| all.into_iter().filter(|p| role.may(*p)).collect::<Vec<_>>();
        assert_eq!(granted(Role::Owner), all);
        assert_eq!(granted(Role::Admin), [Keys, AllKeys, Members, Audit]);
        assert_eq!(granted(Role::Developer), [Keys]);
        assert_eq!(granted(Role::Billing), [Billing]);
    }

    #[test]
    fn admins_manage_everyone_but_owners_and_never_make_one() {
        use Role::*;
        assert!(Owner.may_manage(Some(Owner), None));
        assert!(Admin.may_manage(Some(Developer), Some(Admin)));
        assert!(Admin.may_manage(None, Some(Billing)));
        assert!(!Admin.may_manage(Some(Owner), Some(Developer)));
        assert!(!Admin.may_manage(Some(Developer), Some(Owner)));
        assert!(!Admin.may_manage(None, Some(Owner)));
        assert!(!Developer.may_manage(None, Some(Developer)));
        assert!(!Billing.may_manage(Some(Developer), None));
    }
}
