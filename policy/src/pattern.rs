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

    /// The entry as the config wrote it (`gpt-4o`, `search_*`).
    pub fn as_config(&self) -> String {
        match self {
            NamePattern::Exact(e) => e.clone(),
            NamePattern::Prefix(p) => format!("{p}*"),
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

    /// The first entry admitting `name`: what a metric may be labelled with
    /// (the config's text, never the agent's).
    pub fn matching(&self, name: &str) -> Option<&NamePattern> {
        self.0.iter().find(|p| p.matches(name))
    }

    /// Path allowlists match by whole segments: `/orders*` admits `/orders`
    /// and `/orders/7`, never `/orders-admin/purge`; `/v1/city/*` admits
    /// `/v1/city` and everything below it. A string prefix would let a
    /// grant for one resource admit its longer-named neighbours.
    pub fn allows_path(&self, path: &str) -> bool {
        self.0.iter().any(|p| match p {
            NamePattern::Exact(e) => e == path,
            NamePattern::Prefix(pre) if pre.is_empty() || pre == "/" => true,
            NamePattern::Prefix(pre) => match pre.strip_suffix('/') {
                Some(dir) => path == dir || path.starts_with(pre.as_str()),
                None => {
                    path == pre
                        || path
                            .strip_prefix(pre.as_str())
                            .is_some_and(|rest| rest.starts_with('/'))
                }
            },
        })
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
    fn path_prefixes_end_at_a_segment_boundary() {
        let l = PatternList::parse(&["/orders*", "/v1/city/*", "/health"]).unwrap();
        for ok in [
            "/orders",
            "/orders/",
            "/orders/7/cancel",
            "/v1/city",
            "/v1/city/",
            "/v1/city/Paris",
            "/health",
        ] {
            assert!(l.allows_path(ok), "{ok}");
        }
        for bad in [
            "/orders-admin/purge",
            "/ordersx",
            "/v1/cityx",
            "/v1/cit",
            "/health/x",
            "/healthz",
            "/",
            "",
        ] {
            assert!(!l.allows_path(bad), "{bad}");
        }
        assert!(PatternList::parse(&["/*"])
            .unwrap()
            .allows_path("/anything/below"));
    }

    #[test]
    fn bad_patterns_are_rejected_with_position() {
        assert_eq!(PatternList::parse(&["ok", "a*b"]).unwrap_err().0, 1);
        assert!(PatternList::parse(&["**"]).is_err());
        assert!(PatternList::parse(&[""]).is_err());
        assert!(!PatternList::default().allows("x"));
    }
}
