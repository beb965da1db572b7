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

    /// Every price is a finite number, not negative.
    pub fn is_valid(&self) -> bool {
        [self.input, self.output, self.cache_read, self.cache_write]
            .iter()
            .all(|p| p.is_finite() && *p >= 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cents(d: f64) -> i64 {
        (d * 100.0).round() as i64
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
