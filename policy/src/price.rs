//! What a model call costs: a model's prices and the usage its provider
//! reported, in US dollars. Pure arithmetic; the catalog that says which
//! price applies to which model lives in the gateway's config.

use crate::usage::Usage;

/// A model's prices, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// Prompt tokens not read from the cache.
    pub input: f64,
    pub output: f64,
    /// Prompt tokens read from the cache (OpenAI's cached input, Anthropic's
    /// cache read).
    pub cache_read: f64,
    /// Prompt tokens written to the cache (Anthropic's cache write; OpenAI
    /// caches for free and reports none).
    pub cache_write: f64,
}

impl Price {
    /// The cost of `u` at these prices, in dollars. Cached tokens are
    /// priced as cached: OpenAI's `cached_tokens` are part of its
    /// `prompt_tokens` (so they leave the full-price input), Anthropic's
    /// cache reads and writes are reported beside `input_tokens`.
    pub fn cost(&self, u: &Usage) -> f64 {
        let full = u.input_tokens.saturating_sub(u.cached_input_tokens);
        let cached = u.cached_input_tokens.saturating_add(u.cache_read_tokens);
        (full as f64 * self.input
            + cached as f64 * self.cache_read
            + u.cache_write_tokens as f64 * self.cache_write
            + u.output_tokens as f64 * self.output)
            / 1e6
    }

    /// The cost of `u` in micro-dollars, rounded up: what a money budget
    /// is charged (see [`micros`]).
    pub fn cost_micros(&self, u: &Usage) -> u64 {
        micros(self.cost_picos(u))
    }

    /// The exact cost of `u` in pico-dollars (prices are whole pico-dollars
    /// per token, see [`picos`]): what [`usd_exact`] writes out.
    pub fn cost_picos(&self, u: &Usage) -> u128 {
        let full = u.input_tokens.saturating_sub(u.cached_input_tokens);
        let cached = u.cached_input_tokens.saturating_add(u.cache_read_tokens);
        // Saturating: counts are the upstream's and the agent's, prices
        // the config's; no product of them may wrap to a small cost.
        at(self.input, full)
            .saturating_add(at(self.cache_read, cached))
            .saturating_add(at(self.cache_write, u.cache_write_tokens))
            .saturating_add(at(self.output, u.output_tokens))
    }

    /// What a call is reserved before it runs, in micro-dollars (rounded
    /// up): its `prompt` estimate at the input price plus `output` tokens
    /// at the output price. Cached tokens are not known before the call;
    /// settlement prices them as reported.
    pub fn reserve_micros(&self, prompt: u64, output: u64) -> u64 {
        micros(at(self.input, prompt).saturating_add(at(self.output, output)))
    }

    /// How many output tokens `micros` pays for (rounded down); `None`
    /// when output is free.
    pub fn output_tokens_for(&self, micros: u64) -> Option<u64> {
        let per = picos(self.output);
        (per > 0).then(|| u64::try_from(u128::from(micros) * 1_000_000 / per).unwrap_or(u64::MAX))
    }

    /// The dearer of two prices, field by field: what a call that may be
    /// served by either costs at most.
    pub fn max(self, o: Price) -> Price {
        Price {
            input: self.input.max(o.input),
            output: self.output.max(o.output),
            cache_read: self.cache_read.max(o.cache_read),
            cache_write: self.cache_write.max(o.cache_write),
        }
    }

    /// Every price is a finite number, not negative.
    pub fn is_valid(&self) -> bool {
        [self.input, self.output, self.cache_read, self.cache_write]
            .iter()
            .all(|p| p.is_finite() && *p >= 0.0)
    }
}

/// Dollars per million tokens are micro-dollars per token; held as whole
/// pico-dollars per token, so money sums are exact integers (a price with
/// more than six decimals per million tokens is rounded to six).
fn picos(price: f64) -> u128 {
    if price.is_finite() && price > 0.0 {
        (price * 1e6).round() as u128
    } else {
        0
    }
}

/// `tokens` at `price` (dollars per million), in pico-dollars, saturating.
fn at(price: f64, tokens: u64) -> u128 {
    picos(price).saturating_mul(u128::from(tokens))
}

/// Pico-dollars to micro-dollars, rounded up (never charged less).
fn micros(picos: u128) -> u64 {
    u64::try_from(picos.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Pico-dollars as a decimal number of dollars, exact and without trailing
/// zeros (`19350000` -> `0.00001935`, `0` -> `0`): a cost as a header
/// carries it, with no float rounding on the way.
pub fn usd_exact(picos: u128) -> String {
    const PER_DOLLAR: u128 = 1_000_000_000_000;
    let (whole, frac) = (picos / PER_DOLLAR, picos % PER_DOLLAR);
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:012}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Dollars as micro-dollars, rounded to the nearest (a budget as written).
pub fn usd_to_micros(usd: f64) -> Option<u64> {
    (0.0..=1e12)
        .contains(&usd)
        .then(|| (usd * 1e6).round() as u64)
}

/// Micro-dollars written as dollars for a message: at least two decimals,
/// up to six (`5.00`, `0.005`, `0.001002`).
pub fn fmt_usd(micros: u64) -> String {
    let s = format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000);
    let keep = s.trim_end_matches('0');
    let min = s.len() - 4;
    s[..keep.len().max(min)].to_string()
}

/// Micro-dollars as dollars (for messages, logs and the admin API).
pub fn micros_to_usd(micros: u64) -> f64 {
    micros as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cents(d: f64) -> i64 {
        (d * 100.0).round() as i64
    }

    #[test]
    fn absurd_counts_and_prices_saturate_never_wrap() {
        let huge = Usage {
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            cache_read_tokens: u64::MAX,
            cache_write_tokens: u64::MAX,
            ..Usage::default()
        };
        let dear = Price {
            input: 1e30,
            output: 1e30,
            cache_read: 1e30,
            cache_write: 1e30,
        };
        assert_eq!(dear.cost_picos(&huge), u128::MAX);
        assert_eq!(dear.cost_micros(&huge), u64::MAX);
        assert_eq!(dear.reserve_micros(u64::MAX, u64::MAX), u64::MAX);
        // At a real price, 2^64-1 output tokens is a huge cost, not a
        // wrapped small one.
        let p = Price {
            input: 1.0,
            output: 10.0,
            ..Price::default()
        };
        assert_eq!(p.reserve_micros(2, u64::MAX), u64::MAX);
        assert_eq!(p.reserve_micros(2, 100), 1002);
    }

    #[test]
    fn openai_cached_tokens_leave_the_full_price() {
        // gpt-4o: $2.50 in, $1.25 cached, $10 out per million.
        let p = Price {
            input: 2.5,
            output: 10.0,
            cache_read: 1.25,
            cache_write: 0.0,
        };
        let u = Usage {
            input_tokens: 100_000,
            output_tokens: 20_000,
            cached_input_tokens: 60_000,
            ..Usage::default()
        };
        // 40k * 2.5 + 60k * 1.25 + 20k * 10 = 0.10 + 0.075 + 0.20
        assert!((p.cost(&u) - 0.375).abs() < 1e-12);
        assert_eq!(cents(p.cost(&u)), 38);
    }

    #[test]
    fn anthropic_cache_reads_and_writes_are_beside_the_input() {
        // Claude Sonnet 4: $3 in, $15 out, $0.30 read, $3.75 write.
        let p = Price {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        };
        let u = Usage {
            input_tokens: 10_000,
            output_tokens: 2_000,
            cache_read_tokens: 100_000,
            cache_write_tokens: 20_000,
            ..Usage::default()
        };
        // 0.03 + 0.03 + 0.075 + 0.03
        assert!((p.cost(&u) - 0.165).abs() < 1e-12);
    }

    #[test]
    fn micro_dollars_are_exact_and_rounded_up() {
        // gpt-4o-mini: $0.15 in (0.15 * 1000 is 150.00000000000003 as f64),
        // $0.075 cached, $0.60 out.
        let p = Price {
            input: 0.15,
            output: 0.6,
            cache_read: 0.075,
            cache_write: 0.15,
        };
        assert_eq!(p.reserve_micros(1000, 100), 150 + 60);
        let u = Usage {
            input_tokens: 1000,
            cached_input_tokens: 400,
            output_tokens: 100,
            ..Usage::default()
        };
        // 600 * 0.15 + 400 * 0.075 + 100 * 0.6 = 90 + 30 + 60
        assert_eq!(p.cost_micros(&u), 180);
        // One token at $0.15/M is 0.15 micro-dollars: charged as 1.
        assert_eq!(p.reserve_micros(1, 0), 1);
        assert_eq!(p.output_tokens_for(60), Some(100));
        assert_eq!(p.output_tokens_for(59), Some(98));
        assert_eq!(Price::default().output_tokens_for(1), None);
        assert_eq!(usd_to_micros(1.5), Some(1_500_000));
        assert_eq!(fmt_usd(5_000_000), "5.00");
        assert_eq!(fmt_usd(5_000), "0.005");
        assert_eq!(fmt_usd(1_002), "0.001002");
        assert_eq!(fmt_usd(12_340_000), "12.34");
        assert_eq!(usd_to_micros(-1.0), None);
        assert_eq!(usd_to_micros(f64::NAN), None);
        let dear = p.max(Price {
            input: 3.0,
            output: 0.1,
            cache_read: 0.0,
            cache_write: 3.75,
        });
        assert_eq!(
            (dear.input, dear.output, dear.cache_write),
            (3.0, 0.6, 3.75)
        );
    }

    #[test]
    fn exact_dollars_have_no_float_rounding() {
        // gpt-4o-mini, 35 in and 8 out: 35 * 0.15 + 8 * 0.6 = 10.05 micro.
        let p = Price {
            input: 0.15,
            output: 0.6,
            ..Price::default()
        };
        let u = Usage {
            input_tokens: 35,
            output_tokens: 8,
            ..Usage::default()
        };
        assert_eq!(p.cost_picos(&u), 10_050_000);
        assert_eq!(usd_exact(p.cost_picos(&u)), "0.00001005");
        assert_eq!(p.cost_micros(&u), 11);
        assert_eq!(usd_exact(0), "0");
        assert_eq!(usd_exact(780_000_000_000), "0.78");
        assert_eq!(usd_exact(2_000_000_000_001), "2.000000000001");
        assert_eq!(usd_exact(3_000_000_000_000), "3");
    }

    #[test]
    fn free_and_invalid_prices() {
        let u = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            ..Usage::default()
        };
        assert_eq!(Price::default().cost(&u), 0.0);
        assert!(Price::default().is_valid());
        let bad = Price {
            input: -1.0,
            ..Price::default()
        };
        assert!(!bad.is_valid());
        let nan = Price {
            output: f64::NAN,
            ..Price::default()
        };
        assert!(!nan.is_valid());
        // A cached count above the input (a broken report) costs no less
        // than nothing.
        let odd = Usage {
            input_tokens: 1,
            cached_input_tokens: 5,
            ..Usage::default()
        };
        assert!(Price::default().cost(&odd) >= 0.0);
    }
}
