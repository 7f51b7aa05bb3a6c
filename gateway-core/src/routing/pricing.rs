//! Credits from token counts. Prices are integer micro-dollars per million tokens and the
//! exchange rate is integer credits per dollar, so a turn's charge is one exact integer
//! division, rounded up once per turn (never per token).

use crds::config::Pricing;

use crate::conversation::CacheWrites;
use store::usage::TokenUsage;

/// micro-dollars per dollar times tokens per million.
const SCALE: u128 = 1_000_000 * 1_000_000;

#[derive(Clone, Copy, Debug, Default)]
pub struct Price {
    pricing: Pricing,
    credits_per_usd: u64,
}

impl Price {
    pub fn new(pricing: Pricing, credits_per_usd: u64) -> Self {
        Self {
            pricing,
            credits_per_usd,
        }
    }

    /// This price at `per_million` millionths of itself (a batch item's): every rate scales
    /// alike, through the credits a dollar buys.
    pub fn per_million(&self, per_million: u32) -> Price {
        let scaled = u128::from(self.credits_per_usd) * u128::from(per_million) / 1_000_000;
        Price::new(self.pricing, u64::try_from(scaled).unwrap_or(u64::MAX))
    }

    pub fn credits(&self, usage: &TokenUsage) -> u64 {
        let p = &self.pricing;
        let one_hour = usage
            .cache_creation_1h_input_tokens
            .min(usage.cache_creation_input_tokens);
        let five_minutes = usage.cache_creation_input_tokens - one_hour;
        let weighted = u128::from(usage.input_tokens) * u128::from(p.input_micros_per_mtok)
            + u128::from(usage.output_tokens) * u128::from(p.output_micros_per_mtok)
            + u128::from(five_minutes) * u128::from(p.cache_write_micros_per_mtok)
            + u128::from(one_hour) * u128::from(p.cache_write_1h())
            + u128::from(usage.cache_read_input_tokens) * u128::from(p.cache_read_micros_per_mtok);
        let credits = (weighted * u128::from(self.credits_per_usd)).div_ceil(SCALE);
        u64::try_from(credits).unwrap_or(u64::MAX)
    }

    /// Credits that `tokens` read from the prompt cache cost less than the same tokens as
    /// fresh input (rounded down: a saving is never overstated).
    pub fn saved_by_cache_reads(&self, tokens: u64) -> u64 {
        let p = &self.pricing;
        let per_mtok = p
            .input_micros_per_mtok
            .saturating_sub(p.cache_read_micros_per_mtok);
        let saved =
            u128::from(tokens) * u128::from(per_mtok) * u128::from(self.credits_per_usd) / SCALE;
        u64::try_from(saved).unwrap_or(u64::MAX)
    }

    /// Input price of the ceiling: a request that asks for prompt caching may have any part of
    /// its input written to the cache it names, which costs more than plain input.
    fn ceiling_input_price(&self, caching: CacheWrites) -> u64 {
        let p = &self.pricing;
        match caching {
            CacheWrites::None => p.input_micros_per_mtok,
            CacheWrites::FiveMinutes => p.input_micros_per_mtok.max(p.cache_write_micros_per_mtok),
            CacheWrites::OneHour => p
                .input_micros_per_mtok
                .max(p.cache_write_micros_per_mtok)
                .max(p.cache_write_1h()),
        }
    }

    /// The most a turn can cost: every input token (at the cache-write price when the request
    /// asks for caching) and every allowed output token.
    pub fn ceiling(&self, input_tokens: u32, max_tokens: u32, caching: CacheWrites) -> u64 {
        let input_price = self.ceiling_input_price(caching);
        Price::new(
            Pricing {
                input_micros_per_mtok: input_price,
                ..self.pricing
            },
            self.credits_per_usd,
        )
        .credits(&TokenUsage {
            input_tokens,
            output_tokens: max_tokens,
            ..TokenUsage::default()
        })
    }

    /// The largest `max_tokens` whose ceiling fits in `credits`, capped at `cap`.
    pub fn affordable_output(
        &self,
        credits: u64,
        input_tokens: u32,
        cap: u32,
        caching: CacheWrites,
    ) -> u32 {
        let p = &self.pricing;
        if p.output_micros_per_mtok == 0 || self.credits_per_usd == 0 {
            return cap;
        }
        let input_price = self.ceiling_input_price(caching);
        let budget = u128::from(credits) * SCALE;
        let input_cost =
            u128::from(input_tokens) * u128::from(input_price) * u128::from(self.credits_per_usd);
        let per_output = u128::from(p.output_micros_per_mtok) * u128::from(self.credits_per_usd);
        let tokens = budget.saturating_sub(input_cost) / per_output;
        u32::try_from(tokens).unwrap_or(u32::MAX).min(cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sonnet() -> Price {
        Price::new(
            Pricing {
                input_micros_per_mtok: 3_000_000,
                output_micros_per_mtok: 15_000_000,
                cache_write_micros_per_mtok: 3_750_000,
                cache_read_micros_per_mtok: 300_000,
                cache_write_1h_micros_per_mtok: None,
            },
            100_000,
        )
    }

    #[test]
    fn half_the_price_bills_half_the_credits_of_every_kind_of_token() {
        let usage = TokenUsage {
            input_tokens: 10_000,
            output_tokens: 2_000,
            cache_read_input_tokens: 4_000,
            cache_creation_input_tokens: 1_000,
            ..TokenUsage::default()
        };
        let full = sonnet().credits(&usage);
        assert_eq!(full, 6_495);
        assert_eq!(
            sonnet().per_million(500_000).credits(&usage),
            full.div_ceil(2)
        );
        assert_eq!(sonnet().per_million(1_000_000).credits(&usage), full);
    }

    #[test]
    fn one_hour_cache_writes_are_billed_at_their_own_price_and_default_to_twice_the_input() {
        // 1,000 writes of which 400 to the 1-hour cache: 600 at $3.75/M and 400 at $6/M
        // (twice the $3 input) = $0.00465 = 465 credits.
        let usage = TokenUsage {
            cache_creation_input_tokens: 1_000,
            cache_creation_1h_input_tokens: 400,
            ..TokenUsage::default()
        };
        assert_eq!(sonnet().credits(&usage), 465);
        let priced = Price::new(
            Pricing {
                cache_write_1h_micros_per_mtok: Some(5_000_000),
                ..sonnet().pricing
            },
            100_000,
        );
        // 600 at $3.75/M and 400 at $5/M = $0.00425.
        assert_eq!(priced.credits(&usage), 425);
    }

    #[test]
    fn a_caching_turn_is_reserved_at_the_price_of_the_cache_it_names() {
        // 1,000 input tokens that may all go to the cache: $3.75/M for the 5-minute one, $6/M
        // for the 1-hour one.
        assert_eq!(sonnet().ceiling(1_000, 0, CacheWrites::FiveMinutes), 375);
        assert_eq!(sonnet().ceiling(1_000, 0, CacheWrites::OneHour), 600);
    }

    #[test]
    fn a_turn_is_rounded_up_once_to_a_whole_credit() {
        // 1,000 input at $3/M = $0.003 = 300 credits; 100 output at $15/M = 150 credits.
        let usage = TokenUsage {
            input_tokens: 1_000,
            output_tokens: 100,
            ..TokenUsage::default()
        };
        assert_eq!(sonnet().credits(&usage), 450);
        let one = TokenUsage {
            input_tokens: 1,
            ..TokenUsage::default()
        };
        assert_eq!(sonnet().credits(&one), 1);
    }

    #[test]
    fn without_caching_the_ceiling_is_the_list_price_of_input_and_max_tokens() {
        let usage = TokenUsage {
            input_tokens: 1_000,
            output_tokens: 100,
            ..TokenUsage::default()
        };
        assert_eq!(
            sonnet().ceiling(1_000, 100, CacheWrites::None),
            sonnet().credits(&usage)
        );
    }

    #[test]
    fn with_caching_the_ceiling_covers_any_split_of_input_between_fresh_and_cache_write() {
        let price = sonnet();
        let all_cache_write = TokenUsage {
            cache_creation_input_tokens: 1_000,
            output_tokens: 100,
            ..TokenUsage::default()
        };
        let ceiling = price.ceiling(1_000, 100, CacheWrites::FiveMinutes);
        assert!(price.credits(&all_cache_write) <= ceiling);
        let all_one_hour = TokenUsage {
            cache_creation_1h_input_tokens: 1_000,
            ..all_cache_write
        };
        let ceiling = price.ceiling(1_000, 100, CacheWrites::OneHour);
        assert!(price.credits(&all_one_hour) <= ceiling);
    }

    #[test]
    fn affordable_output_is_the_largest_max_tokens_within_the_credits() {
        let price = sonnet();
        for caching in [
            CacheWrites::None,
            CacheWrites::FiveMinutes,
            CacheWrites::OneHour,
        ] {
            let tokens = price.affordable_output(1_000, 1_000, u32::MAX, caching);
            assert!(price.ceiling(1_000, tokens, caching) <= 1_000);
            assert!(price.ceiling(1_000, tokens + 1, caching) > 1_000);
        }
        assert_eq!(
            price.affordable_output(1_000_000, 10, 64, CacheWrites::None),
            64
        );
    }
}
