//! Model prices and context windows: the built-in catalog
//! (`gateway/data/prices.yaml`, compiled in) with the config's `models:`
//! entries laid over it, field by field.
//!
//! Looked up by the model name sent upstream, exact names first, then the
//! longest matching `prefix*`; each fact (price, window) comes from the
//! first entry that has it, so a config entry that only sets
//! `max_output_tokens` for `gpt-4o` does not hide `gpt-4o*`'s price.

use super::runtime::Errs;
use super::spec::{self, PriceSpec};
use loopgate_policy::{NamePattern, Price};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The built-in catalog, as shipped.
const BUILT_IN: &str = include_str!("../../data/prices.yaml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    /// When the prices were taken (YYYY-MM-DD).
    taken: String,
    models: BTreeMap<String, EntrySpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntrySpec {
    input: f64,
    output: f64,
    #[serde(default)]
    cache_read: Option<f64>,
    #[serde(default)]
    cache_write: Option<f64>,
    #[serde(default)]
    context_window: Option<u64>,
    #[serde(default)]
    max_output: Option<u64>,
}

/// The date the built-in prices were taken.
pub fn built_in_date() -> String {
    serde_yaml::from_str::<CatalogFile>(BUILT_IN)
        .map(|c| c.taken)
        .unwrap_or_default()
}

/// The built-in prices are called stale past this many days: prices
/// change, and `loopgate check` says so.
pub const STALE_AFTER_DAYS: u64 = 90;

/// How many whole days old the built-in prices are at `now` (`None` when
/// the catalog's date cannot be read, or lies in the future).
pub fn built_in_age_days(now: std::time::SystemTime) -> Option<u64> {
    let taken = days_since_epoch(&built_in_date())?;
    let today = now.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() / 86_400;
    u64::try_from(i64::try_from(today).ok()? - taken).ok()
}

/// Days from 1970-01-01 to a `YYYY-MM-DD` date in the proleptic Gregorian
/// calendar (Howard Hinnant's `days_from_civil`).
fn days_since_epoch(date: &str) -> Option<i64> {
    let mut parts = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (parts.next()??, parts.next()??, parts.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// What the catalog knows of one model name (or `prefix*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceEntry {
    /// The catalog's name for it: a bounded metrics label.
    pub label: Arc<str>,
    pub price: Option<Price>,
    pub context_window: Option<u64>,
    /// The model's own output maximum: the output a request without an
    /// output limit may produce.
    pub max_output: Option<u64>,
}

/// Prices and windows by model name.
#[derive(Debug, Default)]
pub struct PriceTable {
    exact: HashMap<String, PriceEntry, ahash::RandomState>,
    /// Longest first.
    prefixes: Vec<(String, PriceEntry)>,
}

impl PriceTable {
    /// `model`'s entries, most specific first.
    fn entries<'s, 'm>(
        &'s self,
        model: &'m str,
    ) -> impl Iterator<Item = &'s PriceEntry> + use<'s, 'm> {
        let prefixed = self
            .prefixes
            .iter()
            .filter(move |(p, _)| model.starts_with(p.as_str()))
            .map(|(_, e)| e);
        self.exact.get(model).into_iter().chain(prefixed)
    }

    /// The first of `model`'s entries, most specific first, for which
    /// `f` says something.
    fn first<'a, T>(&'a self, model: &str, f: impl Fn(&'a PriceEntry) -> Option<T>) -> Option<T> {
        self.entries(model).find_map(f)
    }

    /// The catalog's name for `model` (its most specific entry).
    pub fn label(&self, model: &str) -> Option<&Arc<str>> {
        self.first(model, |e| Some(&e.label))
    }

    /// `model`'s price, with the name of the entry it came from.
    pub fn price(&self, model: &str) -> Option<(&Arc<str>, Price)> {
        self.first(model, |e| e.price.map(|p| (&e.label, p)))
    }

    /// Whether every name starting with `prefix` has a price: a `q*` entry
    /// with a price, `q` a prefix of `prefix`, covers them all (names more
    /// specific may have their own, never none).
    pub fn prices_all_under(&self, prefix: &str) -> bool {
        self.prefixes
            .iter()
            .any(|(q, e)| prefix.starts_with(q.as_str()) && e.price.is_some())
    }

    /// `model`'s context window, and its output maximum when known.
    pub fn window(&self, model: &str) -> Option<(u64, Option<u64>)> {
        // One walk of the entries (this runs on every model call): each
        // field from the most specific entry that sets it.
        let (mut window, mut max_output) = (None, None);
        for e in self.entries(model) {
            window = window.or(e.context_window);
            max_output = max_output.or(e.max_output);
            if window.is_some() && max_output.is_some() {
                break;
            }
        }
        Some((window?, max_output))
    }

    fn entry(&mut self, name: &str) -> Result<&mut PriceEntry, String> {
        let fresh = || PriceEntry {
            label: Arc::from(name),
            ..PriceEntry::default()
        };
        match NamePattern::parse(name)? {
            NamePattern::Exact(n) => Ok(self.exact.entry(n).or_insert_with(fresh)),
            NamePattern::Prefix(p) => {
                let i = match self.prefixes.iter().position(|(q, _)| *q == p) {
                    Some(i) => i,
                    None => {
                        self.prefixes.push((p, fresh()));
                        self.prefixes.len() - 1
                    }
                };
                Ok(&mut self.prefixes[i].1)
            }
        }
    }
}

/// A price as written, checked; errors are pushed at `at`.
pub(super) fn price(errs: &mut Errs, at: &str, p: &PriceSpec) -> Option<Price> {
    let price = Price {
        input: p.input,
        output: p.output,
        cache_read: p.cache_read.unwrap_or(p.input),
        cache_write: p.cache_write.unwrap_or(p.input),
    };
    for (field, v) in [
        ("input", price.input),
        ("output", price.output),
        ("cache_read", price.cache_read),
        ("cache_write", price.cache_write),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            errs.push(
                format!("{at}.{field}"),
                "must be a price in US dollars per million tokens, 0 or more",
            );
        }
    }
    price.is_valid().then_some(price)
}

/// The built-in catalog with the config's `models:` laid over it.
pub(super) fn build_prices(
    errs: &mut Errs,
    models: &BTreeMap<String, spec::ModelSpec>,
) -> PriceTable {
    let mut table = PriceTable::default();
    match serde_yaml::from_str::<CatalogFile>(BUILT_IN) {
        Ok(file) => {
            for (name, e) in file.models {
                let spec = PriceSpec {
                    input: e.input,
                    output: e.output,
                    cache_read: e.cache_read,
                    cache_write: e.cache_write,
                };
                let at = format!("built-in price catalog: models.{name}");
                let price = price(errs, &at, &spec);
                match table.entry(&name) {
                    Ok(entry) => {
                        entry.price = price;
                        entry.context_window = e.context_window;
                        entry.max_output = e.max_output;
                    }
                    Err(why) => errs.push(at, why),
                }
            }
        }
        // Only a broken build can get here (a test loads the file).
        Err(e) => errs.push("built-in price catalog", e.to_string()),
    }
    for (name, m) in models {
        let at = format!("models.{name}");
        let price = m
            .price
            .as_ref()
            .and_then(|p| price(errs, &format!("{at}.price"), p));
        if m.context_window == Some(0) {
            errs.push(format!("{at}.context_window"), "must be at least 1");
        }
        // A name that is not a pattern is reported by the model catalog.
        let Ok(entry) = table.entry(name) else {
            continue;
        };
        if price.is_some() {
            entry.price = price;
        }
        if let Some(w) = m.context_window.filter(|&w| w > 0) {
            entry.context_window = Some(w);
        }
        if let Some(o) = m.max_output_tokens.filter(|&o| o > 0) {
            entry.max_output = Some(o);
        }
    }
    table
        .prefixes
        .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(yaml: &str) -> (PriceTable, Vec<String>) {
        let models: BTreeMap<String, spec::ModelSpec> = serde_yaml::from_str(yaml).unwrap();
        let mut errs = Errs {
            file: "t.yaml",
            list: Vec::new(),
        };
        let t = build_prices(&mut errs, &models);
        (t, errs.list.iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn dates_count_days_from_the_epoch() {
        assert_eq!(days_since_epoch("1970-01-01"), Some(0));
        assert_eq!(days_since_epoch("2000-03-01"), Some(11_017));
        assert_eq!(days_since_epoch("2025-11-24"), Some(20_416));
        assert_eq!(days_since_epoch("2025-13-01"), None);
        assert_eq!(days_since_epoch("soon"), None);
        let day = |n: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(n * 86_400);
        let taken = days_since_epoch(&built_in_date()).unwrap() as u64;
        assert_eq!(built_in_age_days(day(taken + 91)), Some(91));
        assert_eq!(built_in_age_days(day(taken)), Some(0));
        assert_eq!(built_in_age_days(day(taken - 1)), None);
    }

    #[test]
    fn the_built_in_catalog_loads_and_is_dated() {
        let (t, errs) = table("{}");
        assert!(errs.is_empty(), "{errs:?}");
        let date = built_in_date();
        assert_eq!(date.len(), 10, "{date}");
        let (label, p) = t.price("gpt-4o-mini-2024-07-18").unwrap();
        assert_eq!(label.as_ref(), "gpt-4o-mini*");
        assert_eq!((p.input, p.cache_read, p.output), (0.15, 0.075, 0.6));
        let (label, p) = t.price("claude-sonnet-4-5-20250929").unwrap();
        assert_eq!(label.as_ref(), "claude-sonnet-4-5*");
        assert_eq!(p.cache_write, 3.75);
        assert_eq!(t.window("gpt-4o"), Some((128_000, Some(16_384))));
        assert!(t.price("llama3").is_none());
        assert!(t.label("llama3").is_none());
    }

    #[test]
    fn the_config_overrides_field_by_field_and_adds_models() {
        let (t, errs) = table(
            "gpt-4o: { max_output_tokens: 1000 }\n\
             \"gpt-4o-mini*\": { price: { input: 1, output: 2 } }\n\
             llama3: { price: { input: 0, output: 0 }, context_window: 8192 }\n",
        );
        assert!(errs.is_empty(), "{errs:?}");
        // The exact entry has no price: the family's stands.
        let (label, p) = t.price("gpt-4o").unwrap();
        assert_eq!((label.as_ref(), p.input), ("gpt-4o*", 2.5));
        assert_eq!(t.label("gpt-4o").map(|l| l.as_ref()), Some("gpt-4o"));
        assert_eq!(t.window("gpt-4o"), Some((128_000, Some(1000))));
        // Cache prices default to the input price.
        let (_, p) = t.price("gpt-4o-mini").unwrap();
        assert_eq!((p.input, p.cache_read, p.cache_write), (1.0, 1.0, 1.0));
        assert_eq!(t.price("llama3").unwrap().1, Price::default());
        assert_eq!(t.window("llama3"), Some((8192, None)));
    }

    #[test]
    fn bad_prices_are_named() {
        let (_, errs) = table("m: { price: { input: -1, output: .nan }, context_window: 0 }\n");
        assert!(
            errs.iter()
                .any(|e| e.contains("models.m.price.input: must be a price")),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|e| e.contains("models.m.price.output")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("models.m.context_window: must be at least 1")),
            "{errs:?}"
        );
    }
}
