//! Blocked phrases: one multi-pattern automaton (aho-corasick) over request
//! text, so the cost of a scan does not grow with the number of phrases.
//!
//! Phrases and text are compared after the same normalisation
//! ([`crate::normalize`]: invisible characters removed, NFKC, case folded,
//! whitespace runs collapsed to one space), so `ｉｇｎｏｒｅ`, `IGNORE`,
//! `ig\u{AD}nore` and `ig\u{200B}nore` all match the phrase `ignore`, and
//! `ignore   previous` matches `ignore previous`. A phrase is also trimmed
//! after normalisation: its leading and trailing spaces would only make it
//! miss at the start or end of a string.

use crate::normalize::{normalize, normalize_into};
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

#[derive(Debug)]
pub struct PhraseMatcher {
    ac: AhoCorasick,
    phrases: Vec<String>,
}

impl PhraseMatcher {
    pub fn new<S: AsRef<str>>(phrases: &[S]) -> Result<PhraseMatcher, String> {
        let phrases: Vec<String> = phrases.iter().map(|p| p.as_ref().to_string()).collect();
        // Body inspection joins strings with NUL to search them at once.
        if let Some(i) = phrases.iter().position(|p| p.contains('\0')) {
            return Err(format!("phrase {i} holds a NUL character"));
        }
        let mut patterns = Vec::with_capacity(phrases.len());
        for (i, p) in phrases.iter().enumerate() {
            let n = normalize(p);
            let n = n.trim_matches(' ');
            if n.is_empty() {
                return Err(format!("phrase {i} is empty"));
            }
            patterns.push(n.to_string());
        }
        let ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostFirst)
            .build(&patterns)
            .map_err(|e| format!("cannot build the phrase matcher: {e}"))?;
        Ok(PhraseMatcher { ac, phrases })
    }

    /// The index of the first phrase found in `text`, normalised here.
    pub fn find(&self, text: &str) -> Option<usize> {
        let mut n = String::with_capacity(text.len());
        normalize_into(text, &mut n);
        self.find_normalized(&n)
    }

    /// The index of the first phrase found in text that has already been
    /// through [`normalize_into`] (possibly several strings joined with NUL,
    /// which no phrase holds, so no match spans two of them).
    pub fn find_normalized(&self, text: &str) -> Option<usize> {
        self.ac.find(text).map(|m| m.pattern().as_usize())
    }

    /// The phrase as configured.
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
        assert!(PhraseMatcher::new(&["\u{200B}\u{AD}"]).is_err());
    }

    #[test]
    fn phrases_are_normalised_like_text() {
        let m = PhraseMatcher::new(&["  Ignore\tPREVIOUS  ", "ｄａｎ mode"]).unwrap();
        for text in [
            "please ignore previous rules",
            "ｉｇｎｏｒｅ ｐｒｅｖｉｏｕｓ",
            "ig\u{200B}nore pre\u{AD}vious",
            "IgNoRe\n\n  \tprevious",
            "i\u{E0067}gnore previous",
        ] {
            assert_eq!(m.find(text), Some(0), "{text:?}");
        }
        assert_eq!(m.find("DAN   MODE"), Some(1));
        assert_eq!(m.find("ignoreprevious"), None);
    }
}
