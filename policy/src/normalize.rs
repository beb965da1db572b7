//! Text normalisation for blocked-phrase matching: configured phrases and
//! request text go through the same [`normalize_into`], so that spellings a
//! model reads alike match alike.
//!
//! In order:
//! 1. invisible characters are removed: zero-width space / non-joiner /
//!    joiner (U+200B..U+200D), word joiner and invisible operators
//!    (U+2060..U+2064), BOM (U+FEFF), soft hyphen (U+00AD), bidi controls
//!    (U+200E, U+200F, U+202A..U+202E, U+2066..U+2069), Unicode tag
//!    characters (U+E0000..U+E007F), variation selectors, the other format
//!    characters listed in [`is_invisible`], and control characters that
//!    are not whitespace (NUL included: body inspection joins strings with
//!    NUL, so no text may carry one into the search);
//! 2. NFKC (compatibility composition: fullwidth `ｉｇｎｏｒｅ` becomes
//!    `ignore`, ligatures split, `ſ` becomes `s`);
//! 3. case folding: Unicode lower case plus the folds lower case misses
//!    (`ß`/`ẞ` to `ss`, final `ς` to `σ`);
//! 4. every run of whitespace (any Unicode `White_Space`, NFKC's output
//!    included, so U+00A0 and U+3000 too) becomes one ASCII space.
//!
//! Pure-ASCII text, the usual case, takes a fast path with the same result:
//! no NFKC, only ASCII lower case, control removal and whitespace collapse.

use unicode_normalization::UnicodeNormalization;

/// Appends the normalised form of `s` to `out`.
pub fn normalize_into(s: &str, out: &mut String) {
    if s.is_ascii() {
        ascii_into(s.as_bytes(), out);
        return;
    }
    let mut space = false;
    for c in s.chars().filter(|c| !is_invisible(*c)).nfkc() {
        if c.is_whitespace() {
            if !space {
                out.push(' ');
                space = true;
            }
            continue;
        }
        if is_invisible(c) {
            continue;
        }
        space = false;
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
            continue;
        }
        match c {
            'ß' | 'ẞ' => out.push_str("ss"),
            'ς' => out.push('σ'),
            _ => out.extend(c.to_lowercase()),
        }
    }
}

/// The normalised form of `s`.
pub fn normalize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    normalize_into(s, &mut out);
    out
}

fn ascii_into(b: &[u8], out: &mut String) {
    out.reserve(b.len());
    let mut space = false;
    for &c in b {
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => {
                if !space {
                    out.push(' ');
                    space = true;
                }
            }
            0..=0x1f | 0x7f => {}
            _ => {
                out.push(char::from(c.to_ascii_lowercase()));
                space = false;
            }
        }
    }
}

/// Characters removed before matching: they render as nothing (or are
/// controls), so they can hide inside a word without changing how a model
/// reads it.
pub fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' // soft hyphen
        | '\u{034F}' // combining grapheme joiner
        | '\u{061C}' // Arabic letter mark
        | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' // Hangul fillers
        | '\u{17B4}' | '\u{17B5}' // Khmer inherent vowels
        | '\u{180B}'..='\u{180F}' // Mongolian variation selectors, vowel separator
        | '\u{200B}'..='\u{200F}' // zero-width space, (non-)joiner, LRM, RLM
        | '\u{202A}'..='\u{202E}' // bidi embeddings and overrides
        | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
        | '\u{2066}'..='\u{206F}' // bidi isolates, deprecated format characters
        | '\u{FE00}'..='\u{FE0F}' // variation selectors
        | '\u{FEFF}' // BOM, zero-width no-break space
        | '\u{FFF9}'..='\u{FFFB}' // interlinear annotation
        | '\u{1BCA0}'..='\u{1BCA3}' // shorthand format controls
        | '\u{1D173}'..='\u{1D17A}' // musical format controls
        | '\u{E0000}'..='\u{E007F}' // tag characters
        | '\u{E0100}'..='\u{E01EF}' // variation selectors supplement
    ) || (c.is_control() && !c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evasions_normalise_to_the_plain_phrase() {
        for s in [
            "ignore previous",
            "IGNORE Previous",
            "ｉｇｎｏｒｅ ｐｒｅｖｉｏｕｓ",
            "ig\u{200B}nore pre\u{200C}vi\u{200D}ous",
            "ig\u{00AD}nore\u{2060} previous\u{FEFF}",
            "i\u{E0069}g\u{E0020}nore previous",
            "\u{202E}ignore\u{2066} previous\u{2069}",
            "ignore \t\n\r  previous",
            "ignore\u{00A0}\u{3000}previous",
            "ig\0nore\u{7f} previous",
        ] {
            assert_eq!(normalize(s), "ignore previous", "{s:?}");
        }
        assert_eq!(normalize("Straße"), "strasse");
        assert_eq!(normalize("ΟΔΟΣ"), normalize("οδος"));
        assert_eq!(normalize("ﬁle"), "file");
        assert_eq!(normalize("  a  "), " a ");
        assert_eq!(normalize(""), "");
    }

    proptest::proptest! {
        /// The ASCII fast path agrees with the general path.
        #[test]
        fn ascii_fast_path_agrees(s in "[ -~\t\n\r\x00-\x1f]{0,40}") {
            let mut slow = String::new();
            let mut space = false;
            for c in s.chars().filter(|c| !is_invisible(*c)).nfkc() {
                if c.is_whitespace() {
                    if !space { slow.push(' '); space = true; }
                } else if !is_invisible(c) {
                    space = false;
                    slow.extend(c.to_lowercase());
                }
            }
            proptest::prop_assert_eq!(normalize(&s), slow);
        }

        /// Normalising twice changes nothing more.
        #[test]
        fn idempotent(s in "\\PC{0,30}") {
            let once = normalize(&s);
            proptest::prop_assert_eq!(normalize(&once), once.clone());
        }
    }
}
