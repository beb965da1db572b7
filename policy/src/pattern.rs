//! Allowlist names: exact by default, a prefix only where written as `prefix*`.
//!
//! `gpt-4o` admits exactly `gpt-4o`, never `gpt-4o-2024-05-13` or `gpt-4o-mini`;
//! write `gpt-4o*` to mean the family. A lone `*` admits everything.

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    Exact(String),
    Prefix(String),
}

impl NamePattern {
    /// Parses an entry. A `*` anywhere but at the end is rejected rather than
    /// silently treated as a literal.
    pub fn parse(s: &str) -> Result<NamePattern, String> {
        if s.is_empty() {
            return Err("must not be empty".into());
        }
        match s.find('*') {
            None => Ok(NamePattern::Exact(s.to_string())),
            Some(i) if i == s.len() - 1 => Ok(NamePattern::Prefix(s[..i].to_string())),
            Some(_) => Err(format!(
                "`{s}`: `*` is only allowed once, at the end (`prefix*`)"
            )),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(e) => e == name,
            NamePattern::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// An allowlist. Empty admits nothing (fail closed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatternList(Vec<NamePattern>);

impl PatternList {
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<PatternList, (usize, String)> {
        items
            .iter()
            .enumerate()
            .map(|(i, s)| NamePattern::parse(s.as_ref()).map_err(|e| (i, e)))
            .collect::<Result<Vec<_>, _>>()
            .map(PatternList)
    }

    pub fn allows(&self, name: &str) -> bool {
        self.0.iter().any(|p| p.matches(name))
    }

    pub fn patterns(&self) -> &[NamePattern] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_never_matches_longer_names() {
        let l = PatternList::parse(&["gpt-4o"]).unwrap();
        assert!(l.allows("gpt-4o"));
        assert!(!l.allows("gpt-4o-2024-05-13"));
        assert!(!l.allows("gpt-4o-mini"));
        assert!(!l.allows("gpt-4"));
        assert!(!l.allows("GPT-4o"));
        assert!(!l.allows(""));
    }

    #[test]
    fn prefix_only_when_written() {
        let l = PatternList::parse(&["gpt-4o*", "claude-3-5-sonnet-latest"]).unwrap();
        assert!(l.allows("gpt-4o"));
        assert!(l.allows("gpt-4o-2024-05-13"));
        assert!(!l.allows("gpt-4"));
        assert!(l.allows("claude-3-5-sonnet-latest"));
        assert!(!l.allows("claude-3-5-sonnet"));
        let all = PatternList::parse(&["*"]).unwrap();
        assert!(all.allows("anything"));
    }

    #[test]
    fn bad_patterns_are_rejected_with_position() {
        assert_eq!(PatternList::parse(&["ok", "a*b"]).unwrap_err().0, 1);
        assert!(PatternList::parse(&["**"]).is_err());
        assert!(PatternList::parse(&[""]).is_err());
        assert!(!PatternList::default().allows("x"));
    }
}
