//! Blocked phrases: one multi-pattern automaton (aho-corasick) over request
//! text, so the cost of a scan does not grow with the number of phrases.
//!
//! Phrases and text are compared after the same normalisation
//! ([`crate::normalize`]: invisible characters removed, NFKC, case folded,
//! other scripts' letters mapped to their UTS #39 confusable prototypes,
//! whitespace runs collapsed to one space), so `ｉｇｎｏｒｅ`, `IGNORE`,
//! `ig\u{AD}nore`, `ig\u{200B}nore` and `іgnоre` (Cyrillic `і` and `о`) all
//! match the phrase `ignore`, and `ignore   previous` matches
//! `ignore previous`. The mapping is one character at a time, so every
//! plain match is still a match and one automaton over one buffer serves
//! both; what it adds is text that looks like a phrase. A phrase is also trimmed
//! after normalisation: its leading and trailing spaces would only make it
//! miss at the start or end of a string.
//!
//! Text is searched as it is normalised ([`PhraseSearch`]), through a
//! window of about [`WINDOW`] bytes: however long a string and however
//! much normalisation expands it (U+FDFA becomes 18 characters), what is
//! held at once stays that size, and the phrase found is the one a search
//! of the whole normalised text finds.

use crate::normalize::{normalize, normalize_streaming, prepare};
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

#[derive(Debug)]
pub struct PhraseMatcher {
    ac: AhoCorasick,
    phrases: Vec<String>,
    /// The longest normalised phrase, in bytes.
    longest: usize,
}

/// Normalised text searched at once, unless a phrase is longer.
pub const WINDOW: usize = 32 * 1024;

impl PhraseMatcher {
    pub fn new<S: AsRef<str>>(phrases: &[S]) -> Result<PhraseMatcher, String> {
        let phrases: Vec<String> = phrases.iter().map(|p| p.as_ref().to_string()).collect();
        // Body inspection joins strings with NUL to search them at once.
        if let Some(i) = phrases.iter().position(|p| p.contains('\0')) {
            return Err(format!("phrase {i} holds a NUL character"));
        }
        // Text will be mapped through the prototype table: built here, at
        // configuration load, not on the first request that needs it.
        prepare();
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
        let longest = patterns.iter().map(|p| p.len()).max().unwrap_or(0);
        Ok(PhraseMatcher {
            ac,
            phrases,
            longest,
        })
    }

    /// The index of the first phrase found in `text`, normalised here.
    pub fn find(&self, text: &str) -> Option<usize> {
        let mut search = PhraseSearch::new(self, text.len());
        search.push(text);
        search.finish()
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

/// A search of several strings, each normalised and searched as it comes:
/// the first phrase found in their text in order, no match spanning two
/// of them (they are joined with NUL, which normalisation removes and no
/// phrase holds).
///
/// Normalised text is searched whenever [`WINDOW`] bytes of it are held,
/// and all of it dropped but the tail a longer match may still start in
/// (one byte short of the longest phrase). A match found in a window is
/// taken only when the longest phrase starting where it starts would also
/// fit in the window; else the search waits for more text. So the phrase
/// found is the leftmost-first match of the whole text, as one search of
/// it would report, and the cost per byte does not depend on how the text
/// is cut.
pub struct PhraseSearch<'m> {
    matcher: &'m PhraseMatcher,
    text: String,
    window: usize,
    /// Bytes to reserve on the first string (the most text there can be).
    hint: usize,
    found: Option<usize>,
}

impl<'m> PhraseSearch<'m> {
    /// A search with `matcher`, for text of at most about `hint` bytes.
    pub fn new(matcher: &'m PhraseMatcher, hint: usize) -> PhraseSearch<'m> {
        PhraseSearch {
            matcher,
            text: String::new(),
            window: WINDOW.max(2 * matcher.longest),
            hint,
            found: None,
        }
    }

    /// Normalises and searches `s`, apart from the strings before it.
    pub fn push(&mut self, s: &str) {
        if self.found.is_some() {
            return;
        }
        if self.text.capacity() == 0 {
            // One allocation for a body's short text, not one per doubling.
            self.text
                .reserve(self.hint.min(self.window + crate::normalize::PIECE));
        }
        if s.len() <= crate::normalize::PIECE && self.text.len() < self.window && s.is_ascii() {
            // The usual short string: no window to mind while it is written.
            crate::normalize::normalize_ascii(s, &mut self.text);
        } else {
            let (matcher, found) = (self.matcher, &mut self.found);
            normalize_streaming(s, &mut self.text, self.window, &mut |text| {
                matcher.drain(text, found)
            });
        }
        self.text.push('\0');
        if self.text.len() >= self.window {
            self.matcher.drain(&mut self.text, &mut self.found);
        }
    }

    /// The phrase found, if any (one found before the end is final).
    pub fn found(&self) -> Option<usize> {
        self.found
    }

    /// Searches what is left; the first phrase found in all the text.
    pub fn finish(&mut self) -> Option<usize> {
        if self.found.is_none() && !self.text.is_empty() {
            self.found = self.matcher.search_window(&mut self.text, true);
        }
        self.text.clear();
        self.found
    }
}

impl PhraseMatcher {
    /// Searches a full window, or drops it once a phrase was found.
    fn drain(&self, text: &mut String, found: &mut Option<usize>) {
        match found {
            None => *found = self.search_window(text, false),
            Some(_) => text.clear(),
        }
    }

    /// Searches a window of normalised text (see [`PhraseSearch`]): a
    /// match no longer phrase could displace, or, with `last`, any match;
    /// else drops all but the tail a match may still start in.
    fn search_window(&self, text: &mut String, last: bool) -> Option<usize> {
        if let Some(m) = self.ac.find(text.as_str()) {
            if last || m.start() + self.longest <= text.len() {
                return Some(m.pattern().as_usize());
            }
        }
        if !last {
            let mut cut = text.len().saturating_sub(self.longest.saturating_sub(1));
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.drain(..cut);
        }
        None
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

    #[test]
    fn homoglyph_spellings_match() {
        let m = PhraseMatcher::new(&["ignore previous instructions", "developer mode"]).unwrap();
        for text in [
            "please \u{456}gnore prev\u{456}ous \u{456}nstruct\u{456}ons", // Cyrillic і
            "IGN\u{41E}RE PREVIOUS INSTRUCTIONS",                          // Cyrillic О
            "ign\u{3BF}re previous instructions",                          // Greek ο
            "ｉｇｎｏｒｅ ｐｒｅｖｉｏｕｓ ｉｎｓｔｒｕｃｔｉｏｎｓ",      // fullwidth
            "\u{456}g\u{200B}n\u{43E}re previ\u{3BF}us instru\u{441}tions", // mixed
        ] {
            assert_eq!(m.find(text), Some(0), "{text:?}");
        }
        assert_eq!(
            m.find("enable d\u{435}v\u{435}l\u{43E}p\u{435}r mod\u{435}"),
            Some(1)
        );
        // A phrase written with a homoglyph matches the plain spelling too.
        let m = PhraseMatcher::new(&["d\u{435}veloper mode"]).unwrap();
        assert_eq!(m.find("DEVELOPER MODE"), Some(0));
    }

    #[test]
    fn ordinary_non_latin_text_does_not_match() {
        let m = PhraseMatcher::new(&[
            "ignore previous instructions",
            "developer mode",
            "pay",
            "cop",
            "ИГНОРИРУЙ",
        ])
        .unwrap();
        for text in [
            "Привет! Расскажи, пожалуйста, о погоде в Москве на выходных.",
            "Проигнорировать предыдущие инструкции нельзя.",
            "Καλημέρα, τι κάνεις; Πες μου για τον καιρό στην Αθήνα.",
            "Ο προγραμματιστής διάβασε τις οδηγίες.",
            "Доброе утро, Ѕофия, ёлка",
            "日本語のテキストです。",
        ] {
            assert_eq!(m.find(text), None, "{text:?}");
        }
        // Non-Latin phrases still match their own script in any case.
        assert_eq!(m.find("пожалуйста игнорируй это"), Some(4));
    }

    #[test]
    fn ascii_look_alikes_are_not_homoglyphs() {
        // UTS #39 would map 0 to O, 1 to l and m to rn; applied to ASCII
        // after case folding they would block dates and ordinary words.
        let m = PhraseMatcher::new(&["o1", "bum", "ignore"]).unwrap();
        assert_eq!(m.find("meeting on 2024-01-15"), None);
        assert_eq!(m.find("do not burn the logs"), None);
        assert_eq!(m.find("1gn0re"), None);
    }

    #[test]
    fn matches_across_search_windows_are_found_as_one_search_finds_them() {
        // The first phrase is preferred where both start: a window that
        // ends inside it must not report the second.
        let m = PhraseMatcher::new(&["abcdefgh", "abc", "zz"]).unwrap();
        for filler in ["x", "\u{FDFA}", "\u{FF58}", "x\u{301}"] {
            let unit = normalize(filler).len();
            for shift in 0..24 {
                let n = (WINDOW - shift) / unit;
                let text = format!("{}abcdefgh zz", filler.repeat(n));
                assert_eq!(m.find(&text), Some(0), "{filler:?} {shift}");
                let text = format!("{}abcdefg zz", filler.repeat(n));
                assert_eq!(m.find(&text), Some(1), "{filler:?} {shift}");
                let text = format!("{}ab cdefgh zz", filler.repeat(n));
                assert_eq!(m.find(&text), Some(2), "{filler:?} {shift}");
            }
        }
        // In strings after a long one, in order.
        let mut search = PhraseSearch::new(&m, 0);
        search.push(&"y".repeat(3 * WINDOW));
        search.push("ab");
        search.push("c zz abc");
        assert_eq!(search.finish(), Some(2));
    }

    /// Latin letters and look-alikes from other scripts (Cyrillic, Greek),
    /// small and capital.
    const LOOK_ALIKES: &[(char, &[char])] = &[
        ('a', &['\u{430}', '\u{3B1}', '\u{410}', '\u{391}']),
        ('b', &['\u{412}', '\u{392}']),
        ('c', &['\u{441}', '\u{421}']),
        ('e', &['\u{435}', '\u{415}', '\u{395}']),
        ('h', &['\u{41D}', '\u{397}', '\u{4BB}']),
        ('i', &['\u{456}', '\u{3B9}', '\u{406}', '\u{399}']),
        ('j', &['\u{458}', '\u{408}']),
        ('k', &['\u{41A}', '\u{39A}']),
        ('m', &['\u{41C}', '\u{39C}']),
        ('o', &['\u{43E}', '\u{3BF}', '\u{41E}', '\u{39F}']),
        ('p', &['\u{440}', '\u{3C1}', '\u{420}', '\u{3A1}']),
        ('s', &['\u{455}', '\u{405}']),
        ('t', &['\u{422}', '\u{3A4}']),
        ('v', &['\u{3BD}']),
        ('x', &['\u{445}', '\u{3C7}', '\u{425}', '\u{3A7}']),
        ('y', &['\u{443}', '\u{423}']),
        ('z', &['\u{396}']),
    ];

    proptest::proptest! {
        /// A phrase is found in any text that writes it with look-alikes,
        /// in any case, between any other words.
        #[test]
        fn look_alike_spellings_are_found(
            phrase in "[a-z]{1,8}( [a-z]{1,8}){0,3}",
            picks in proptest::collection::vec(0usize..8, 40),
            before in "[ -~а-яα-ω]{0,20}",
            after in "[ -~а-яα-ω]{0,20}",
        ) {
            let m = PhraseMatcher::new(&[&phrase]).unwrap();
            let mut disguised = String::new();
            for (i, c) in phrase.chars().enumerate() {
                let pick = picks[i % picks.len()];
                match LOOK_ALIKES.iter().find(|(l, _)| *l == c) {
                    Some((_, alikes)) if pick < alikes.len() => disguised.push(alikes[pick]),
                    _ if pick % 2 == 0 => disguised.push(c.to_ascii_uppercase()),
                    _ => disguised.push(c),
                }
            }
            let text = format!("{before} {disguised} {after}");
            proptest::prop_assert_eq!(m.find(&text), Some(0), "{:?}", text);
        }
    }
}
