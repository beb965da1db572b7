//! Blocked phrases: one multi-pattern automaton (aho-corasick) over message
//! text, so the cost of a scan does not grow with the number of phrases.
//!
//! Matching ignores case. With ASCII-only phrases the automaton folds ASCII
//! case itself and scans the text in place; when a phrase has non-ASCII
//! letters, phrases and text are lower-cased (Unicode) before matching.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

#[derive(Debug)]
pub struct PhraseMatcher {
    ac: AhoCorasick,
    phrases: Vec<String>,
    unicode: bool,
}

impl PhraseMatcher {
    pub fn new<S: AsRef<str>>(phrases: &[S]) -> Result<PhraseMatcher, String> {
        let phrases: Vec<String> = phrases.iter().map(|p| p.as_ref().to_string()).collect();
        if let Some(i) = phrases.iter().position(|p| p.trim().is_empty()) {
            return Err(format!("phrase {i} is empty"));
        }
        // Body inspection joins strings with NUL to search them at once.
        if let Some(i) = phrases.iter().position(|p| p.contains('\0')) {
            return Err(format!("phrase {i} holds a NUL character"));
        }
        let unicode = phrases.iter().any(|p| !p.is_ascii());
        let patterns: Vec<String> = if unicode {
            phrases.iter().map(|p| p.to_lowercase()).collect()
        } else {
            phrases.clone()
        };
        let ac = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostFirst)
            .build(&patterns)
            .map_err(|e| format!("cannot build the phrase matcher: {e}"))?;
        Ok(PhraseMatcher {
            ac,
            phrases,
            unicode,
        })
    }

    /// The index of the first phrase found in `text`.
    pub fn find(&self, text: &str) -> Option<usize> {
        let m = if self.unicode && !text.is_ascii() {
            self.ac.find(&text.to_lowercase())
        } else {
            self.ac.find(text)
        };
        m.map(|m| m.pattern().as_usize())
    }

    pub fn phrase(&self, index: usize) -> &str {
        &self.phrases[index]
    }

    pub fn len(&self) -> usize {
        self.phrases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.phrases.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_phrases_ignoring_case() {
        let m = PhraseMatcher::new(&["ignore previous instructions", "DAN mode"]).unwrap();
        assert_eq!(m.find("please IGNORE Previous Instructions now"), Some(0));
        assert_eq!(m.find("enable dan MODE"), Some(1));
        assert_eq!(m.find("ignore the previous instructions"), None);
        assert_eq!(m.find(""), None);
        assert_eq!(m.phrase(1), "DAN mode");
    }

    #[test]
    fn unicode_phrases_fold_case_too() {
        let m = PhraseMatcher::new(&["ИГНОРИРУЙ", "ignore"]).unwrap();
        assert_eq!(m.find("пожалуйста игнорируй это"), Some(0));
        assert_eq!(m.find("IGNORE"), Some(1));
        assert_eq!(m.find("Ärger"), None);
    }

    #[test]
    fn empty_phrases_are_refused() {
        assert!(PhraseMatcher::new(&["ok", " "]).is_err());
        assert!(PhraseMatcher::new(&["ok", "a\0b"]).is_err());
    }
}
