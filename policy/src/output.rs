//! The output limit as the target of each attempt reads it.
//!
//! Admission judges a body's output limit once
//! ([`crate::rules::AgentRules::check_body`] returns an [`OutputLimit`]).
//! Which field carries it, and how large it may be, depends on where the
//! call goes: OpenAI's reasoning models refuse `max_tokens` and read only
//! `max_completion_tokens`; many OpenAI-compatible servers read only
//! `max_tokens` (and would silently ignore the other, leaving the output
//! unbounded); every provider refuses a value above the model's own output
//! maximum. A fallback target or a watchdog degrade can send the call to
//! another model, so [`OutputLimit::edit`] is asked per attempt, with that
//! attempt's [`TargetOutput`], and the edit is applied with
//! [`crate::rewrite::apply_limit_edit`].
//!
//! The rules, in the words of the README:
//! - the limit always travels under the field the target reads; the other
//!   spellings (numbers or `null`) are removed, so a target never sees two;
//! - a limit the gateway inserts is capped at the target model's maximum;
//! - the agent's own value is forwarded as sent to the model it named (the
//!   provider's own answer tells it the truth), and capped only where the
//!   gateway chose another model (a target's rename, a fallback, a degrade)
//!   or the model's settings say so (`clamp_requested`): the model can never
//!   produce more than its maximum, so the cap changes nothing but the 400.

use std::fmt;

/// A top-level field that bounds output tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitField {
    /// Chat completions (every OpenAI-style server), completions, Anthropic messages.
    MaxTokens,
    /// Chat completions on OpenAI (required by its reasoning models).
    MaxCompletionTokens,
    /// Responses.
    MaxOutputTokens,
}

impl LimitField {
    pub const ALL: [LimitField; 3] = [
        LimitField::MaxTokens,
        LimitField::MaxCompletionTokens,
        LimitField::MaxOutputTokens,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LimitField::MaxTokens => "max_tokens",
            LimitField::MaxCompletionTokens => "max_completion_tokens",
            LimitField::MaxOutputTokens => "max_output_tokens",
        }
    }

    pub fn from_name(name: &str) -> Option<LimitField> {
        LimitField::ALL.into_iter().find(|f| f.name() == name)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for LimitField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`LimitField`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitFields(u8);

impl LimitFields {
    pub fn insert(&mut self, f: LimitField) {
        self.0 |= f.bit();
    }

    pub fn contains(self, f: LimitField) -> bool {
        self.0 & f.bit() != 0
    }

    pub fn without(self, f: LimitField) -> LimitFields {
        LimitFields(self.0 & !f.bit())
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = LimitField> {
        LimitField::ALL
            .into_iter()
            .filter(move |f| self.contains(*f))
    }
}

impl FromIterator<LimitField> for LimitFields {
    fn from_iter<I: IntoIterator<Item = LimitField>>(iter: I) -> Self {
        let mut s = LimitFields::default();
        for f in iter {
            s.insert(f);
        }
        s
    }
}

/// Whether OpenAI's chat completions API refuses `max_tokens` for `model`
/// and needs `max_completion_tokens`: its reasoning models, the `o1`, `o3`,
/// `o4` and `gpt-5` families (dated and fine-tuned names included:
/// `o3-mini-2025-01-31`, `gpt-5.1`, `ft:o4-mini:org::id`).
pub fn openai_needs_max_completion_tokens(model: &str) -> bool {
    let m = model.strip_prefix("ft:").unwrap_or(model);
    let family = |prefix: &str, seps: &[char]| {
        m.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(seps))
    };
    ["o1", "o3", "o4"].iter().any(|p| family(p, &['-', ':'])) || family("gpt-5", &['-', '.', ':'])
}

/// The body's output limit as admission judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputLimit {
    /// Limit fields at the top level of the body, numbers or `null`.
    pub present: LimitFields,
    /// The agent's own limit per completion, and the field it sent it in.
    pub asked: Option<(LimitField, u64)>,
    /// The agent's configured limit per completion, to set when the body
    /// sets none. `None`: nothing to set (no limit configured, the rule in
    /// dry-run, or an endpoint without output).
    pub insert: Option<u64>,
}

/// What the target of one attempt accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetOutput {
    /// The field it reads the limit from.
    pub field: LimitField,
    /// The model's own output maximum, when known.
    pub max_output: Option<u64>,
    /// Lower the agent's own value to `max_output` too (the gateway chose
    /// this model, or the model's settings say so).
    pub clamp_asked: bool,
}

/// How one attempt's body must change: fields removed, then one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitEdit {
    pub remove: LimitFields,
    pub set: Option<(LimitField, u64)>,
}

impl OutputLimit {
    /// The change `target` needs, or `None` when the body goes as it is
    /// (see the module docs for the rules).
    pub fn edit(&self, target: &TargetOutput) -> Option<LimitEdit> {
        let cap = |v: u64| target.max_output.map_or(v, |m| v.min(m));
        let value = match (self.asked, self.insert) {
            (Some((_, v)), _) if target.clamp_asked => Some(cap(v)),
            (Some((_, v)), _) => Some(v),
            (None, Some(v)) => Some(cap(v)),
            (None, None) => None,
        };
        let remove = self.present.without(target.field);
        let already = value.is_some() && self.asked == value.map(|v| (target.field, v));
        let set = value.filter(|_| !already).map(|v| (target.field, v));
        (set.is_some() || !remove.is_empty()).then_some(LimitEdit { remove, set })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LimitField::*;

    #[test]
    fn reasoning_models_are_recognised_by_family() {
        for m in [
            "o1",
            "o1-mini",
            "o3-mini",
            "o3-mini-2025-01-31",
            "o4-mini",
            "gpt-5",
            "gpt-5-mini",
            "gpt-5.1",
            "gpt-5-nano-2025-08-07",
            "ft:o4-mini:acme::abc123",
        ] {
            assert!(openai_needs_max_completion_tokens(m), "{m}");
        }
        for m in [
            "gpt-4o",
            "gpt-4o-mini",
            "gpt-4.1",
            "o10",
            "o3x",
            "gpt-50",
            "ft:gpt-4o:acme::x",
            "my-o3-mini",
            "",
        ] {
            assert!(!openai_needs_max_completion_tokens(m), "{m}");
        }
    }

    fn target(field: LimitField, max: Option<u64>, clamp: bool) -> TargetOutput {
        TargetOutput {
            field,
            max_output: max,
            clamp_asked: clamp,
        }
    }

    fn fields(f: &[LimitField]) -> LimitFields {
        f.iter().copied().collect()
    }

    #[test]
    fn an_inserted_limit_goes_under_the_targets_field_capped_at_its_maximum() {
        let inserted = OutputLimit {
            insert: Some(8192),
            ..OutputLimit::default()
        };
        assert_eq!(
            inserted.edit(&target(MaxCompletionTokens, Some(4096), false)),
            Some(LimitEdit {
                remove: LimitFields::default(),
                set: Some((MaxCompletionTokens, 4096))
            })
        );
        assert_eq!(
            inserted.edit(&target(MaxTokens, None, false)).unwrap().set,
            Some((MaxTokens, 8192))
        );
        // A `null` in another spelling goes; one in the target's is replaced.
        let with_null = OutputLimit {
            present: fields(&[MaxTokens]),
            ..inserted
        };
        assert_eq!(
            with_null.edit(&target(MaxCompletionTokens, None, false)),
            Some(LimitEdit {
                remove: fields(&[MaxTokens]),
                set: Some((MaxCompletionTokens, 8192))
            })
        );
        assert_eq!(
            with_null.edit(&target(MaxTokens, None, false)),
            Some(LimitEdit {
                remove: LimitFields::default(),
                set: Some((MaxTokens, 8192))
            })
        );
    }

    #[test]
    fn the_agents_own_value_is_renamed_and_capped_only_where_the_gateway_chose_the_model() {
        let asked = OutputLimit {
            present: fields(&[MaxTokens]),
            asked: Some((MaxTokens, 30_000)),
            insert: None,
        };
        // The target reads it as sent: nothing changes.
        assert_eq!(asked.edit(&target(MaxTokens, Some(16_384), false)), None);
        // Another spelling: renamed, value kept.
        assert_eq!(
            asked.edit(&target(MaxCompletionTokens, Some(16_384), false)),
            Some(LimitEdit {
                remove: fields(&[MaxTokens]),
                set: Some((MaxCompletionTokens, 30_000))
            })
        );
        // Another model than the agent named: capped.
        assert_eq!(
            asked.edit(&target(MaxTokens, Some(16_384), true)),
            Some(LimitEdit {
                remove: LimitFields::default(),
                set: Some((MaxTokens, 16_384))
            })
        );
        // Capping a value already below the maximum changes nothing.
        assert_eq!(asked.edit(&target(MaxTokens, Some(100_000), true)), None);
    }

    #[test]
    fn nothing_to_set_leaves_the_body_unless_a_null_is_misspelled() {
        assert_eq!(
            OutputLimit::default().edit(&target(MaxTokens, Some(1), true)),
            None
        );
        let null = OutputLimit {
            present: fields(&[MaxTokens]),
            ..OutputLimit::default()
        };
        assert_eq!(null.edit(&target(MaxTokens, None, false)), None);
        assert_eq!(
            null.edit(&target(MaxCompletionTokens, None, false)),
            Some(LimitEdit {
                remove: fields(&[MaxTokens]),
                set: None
            })
        );
    }

    proptest::proptest! {
        #[test]
        fn the_edited_limit_is_in_the_targets_field_and_within_its_maximum(
            present in 0u8..8,
            asked in proptest::option::of((0usize..3, 0u64..200_000)),
            insert in proptest::option::of(1u64..200_000),
            field in 0usize..3,
            max in proptest::option::of(1u64..100_000),
            clamp in proptest::bool::ANY,
        ) {
            let mut present = LimitFields(present);
            let asked = asked.map(|(i, v)| (LimitField::ALL[i], v));
            if let Some((f, _)) = asked {
                present.insert(f);
            }
            let limit = OutputLimit { present, asked, insert: insert.filter(|_| asked.is_none()) };
            let t = target(LimitField::ALL[field], max, clamp);
            // The fields the body has after the edit, and the target's value.
            let (after, value) = match limit.edit(&t) {
                None => (present, asked.map(|(_, v)| v)),
                Some(e) => {
                    let mut after = LimitFields(present.0 & !e.remove.0);
                    let mut value = asked.filter(|(f, _)| after.contains(*f)).map(|(_, v)| v);
                    if let Some((f, v)) = e.set {
                        proptest::prop_assert_eq!(f, t.field);
                        after.insert(f);
                        value = Some(v);
                    }
                    (after, value)
                }
            };
            // Only the target's spelling is left.
            proptest::prop_assert!(after.without(t.field).is_empty());
            match (asked, limit.insert) {
                (Some((_, v)), _) => {
                    let want = if clamp { max.map_or(v, |m| v.min(m)) } else { v };
                    proptest::prop_assert_eq!(value, Some(want));
                }
                (None, Some(v)) => proptest::prop_assert_eq!(value, Some(max.map_or(v, |m| v.min(m)))),
                (None, None) => proptest::prop_assert!(value.is_none()),
            }
        }
    }
}
