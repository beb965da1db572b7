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
//! 4. every non-ASCII character left is replaced by its confusable
//!    prototype (the UTS #39 skeleton of that character, through the
//!    `unicode-security` crate, ASCII in it lower-cased): Cyrillic `а е і о
//!    р с` and Greek `ο α ι ν ρ` become the Latin letters they look like, so
//!    `іgnore prevіous` (Cyrillic `і`) reads `ignore previous`;
//! 5. every run of whitespace (any Unicode `White_Space`, NFKC's output
//!    included, so U+00A0 and U+3000 too) becomes one ASCII space.
//!
//! Step 4 maps character by character, so text that holds a phrase still
//! holds it once both are mapped: the plain match is kept, and what is
//! added is only text that looks like the phrase. Two decisions narrow
//! UTS #39 for running text:
//! - ASCII is kept as it is. The skeleton maps `0` to `O`, `1`, `I` and `|`
//!   to `l`, and `m` to `rn`; after case folding that would make the phrase
//!   `o1` match the date `2024-01-15` (`2o24-ol-l5`) and the phrase `bum`
//!   match `burn`. Look-alike digits and `rn` are ordinary ASCII text, not
//!   a disguise another script provides. A non-ASCII character whose
//!   prototype is `rn` (an `m` look-alike NFKC does not fold, such as
//!   Armenian `ՠ`) is written `m`, so it matches the ASCII letter.
//! - UTS #39 is case-sensitive (`I` and `l` share a prototype, `i` has its
//!   own); matching is not. A letter is mapped by its small form, so a
//!   Cyrillic or Greek phrase still matches its capitals and `ІGNORE`
//!   (Cyrillic `І`, small `і`) reads `ignore`. A letter whose small form
//!   imitates no Latin letter but whose capital does (Cyrillic `Н Т В М К`,
//!   Greek `Η Τ Κ Μ Ε Χ`) is mapped, in both cases, to the Latin letter the
//!   capital imitates, so `DEVELOPER МODE` (Cyrillic `М`) is caught and the
//!   mapping stays case-blind; a capital's prototype `l` is read as `I`.
//!   Left out: Greek `Ν`/`ν` and `Υ`/`υ` imitate different Latin letters in
//!   each case (N and v, Y and u) and follow the small form; the palochka
//!   `Ӏ` and Lisu `ꓲ`, which look like both `I` and `l`, read `l`.
//!
//! Non-Latin text is changed in what is compared, not in what is sent: a
//! Russian or Greek sentence matches only phrases written in it, or a
//! Latin phrase every letter of which it imitates.
//!
//! Cost: pure-ASCII text, the usual case, takes a fast path with the same
//! result: no NFKC, no skeleton, only ASCII lower case, control removal and
//! whitespace collapse. Other text is mapped in one pass through a table
//! built once ([`Prototypes`]: the fold and prototype of every character
//! below U+20000, and whether NFKC leaves it alone), a lookup per
//! character; only text holding a character NFKC may change (a combining
//! mark, a compatibility form) goes through NFKC first. Every step writes
//! into the caller's buffer, a bounded number of bytes per input character.

use std::sync::OnceLock;
use unicode_normalization::{is_nfkc_quick, IsNormalized, UnicodeNormalization};

/// Appends the normalised form of `s` to `out`.
pub fn normalize_into(s: &str, out: &mut String) {
    if s.is_ascii() {
        ascii_into(s.as_bytes(), out);
        return;
    }
    out.reserve(s.len());
    let start = out.len();
    let table = prototypes();
    let mut w = Writer { out, space: false };
    // One pass while every character is one NFKC leaves alone and nothing
    // composes with (most text in any script); else again through NFKC.
    for c in s.chars() {
        if c.is_ascii() {
            w.ascii(c);
            continue;
        }
        match table.entry(c) {
            Some(e) if e & UNSTABLE == 0 => w.entry(c, e),
            _ => {
                w.out.truncate(start);
                w.space = false;
                // NFKC can produce invisible characters (the halfwidth
                // Hangul filler U+FFA0 becomes U+1160): the table has them
                // write nothing.
                for c in s.chars().filter(|c| !is_invisible(*c)).nfkc() {
                    w.char(c);
                }
                return;
            }
        }
    }
}

/// The normalised form of `s`.
pub fn normalize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    normalize_into(s, &mut out);
    out
}

/// Writes characters after NFKC: case folding, prototypes, whitespace.
struct Writer<'a> {
    out: &'a mut String,
    /// The last character written was a space.
    space: bool,
}

impl Writer<'_> {
    /// One character after NFKC.
    fn char(&mut self, c: char) {
        if c.is_ascii() {
            self.ascii(c);
        } else {
            match prototypes().entry(c) {
                Some(e) => self.entry(c, e),
                None if is_invisible(c) => {}
                None if c.is_whitespace() => self.ascii(' '),
                None => self.fresh(|w| w.fold(c, 1)),
            }
        }
    }

    /// Writes what the table stores for `c`.
    fn entry(&mut self, c: char, e: u32) {
        match e & TAG {
            ONE => match char::from_u32(e >> 2 & 0x1F_FFFF) {
                Some(' ') => self.ascii(' '),
                Some(f) => {
                    self.out.push(f);
                    self.space = false;
                }
                None => {}
            },
            TEXT => {
                let table = prototypes();
                let (offset, len) = ((e >> 7 & 0xFF_FFFF) as usize, (e >> 2 & 31) as usize);
                if let Some(t) = table.text.get(offset..offset + len) {
                    self.fresh(|w| w.out.push_str(t));
                }
            }
            _ => match e & !UNSTABLE {
                ITSELF => {
                    self.out.push(c);
                    self.space = false;
                }
                SPACE => self.ascii(' '),
                NOTHING => {}
                _ => self.fresh(|w| w.fold(c, 1)),
            },
        }
    }

    /// Writes through `write` what a writer that has just written a letter
    /// would (the form the table stores); at a word's start only a leading
    /// space differs.
    fn fresh(&mut self, write: impl FnOnce(&mut Writer)) {
        let start = self.out.len();
        write(&mut Writer {
            out: &mut *self.out,
            space: false,
        });
        if self.out.len() > start {
            if self.space && self.out.as_bytes()[start] == b' ' {
                self.out.remove(start);
            }
            self.space = self.out.ends_with(' ');
        }
    }

    fn ascii(&mut self, c: char) {
        if c.is_ascii_whitespace() {
            if !self.space {
                self.out.push(' ');
                self.space = true;
            }
        } else if c.is_ascii_control() {
        } else {
            self.out.push(c.to_ascii_lowercase());
            self.space = false;
        }
    }

    /// Case-folds a non-ASCII character and writes the prototype of what
    /// the fold gives.
    fn fold(&mut self, c: char, depth: u8) {
        match c {
            'ß' | 'ẞ' => {
                self.ascii('s');
                self.ascii('s');
            }
            'ς' => self.prototype('σ', depth),
            _ => {
                for l in c.to_lowercase() {
                    if l.is_ascii() {
                        self.ascii(l);
                    } else {
                        self.prototype(l, depth);
                    }
                }
            }
        }
    }

    /// The UTS #39 skeleton of one non-ASCII, case-folded character. A
    /// prototype that case folding would change (Greek `Γ` for Canadian
    /// syllabics `ᒥ`) is folded and mapped once more, as
    /// the same letter written directly would be. A letter whose small form
    /// imitates no Latin letter but whose capital does (`н`: `Н` is `H`)
    /// is written as that Latin letter.
    fn prototype(&mut self, c: char, depth: u8) {
        let mut buf = [0u8; 4];
        let start = self.out.len();
        let space = self.space;
        let mut latin = true;
        for p in unicode_security::skeleton(c.encode_utf8(&mut buf)) {
            if p.is_ascii() {
                self.ascii(p);
                continue;
            }
            latin = false;
            if p != c && depth > 0 && folds(p) {
                self.fold(p, depth - 1);
            } else if let Some(l) = capital_look(p).filter(|_| p != c) {
                self.ascii(l);
            } else {
                self.out.push(p);
                self.space = false;
            }
        }
        if latin {
            if &self.out[start..] == "rn" {
                self.out.truncate(start);
                self.out.push('m');
            }
        } else if let Some(l) = capital_look(c) {
            self.out.truncate(start);
            self.space = space;
            self.ascii(l);
        }
    }
}

/// The Latin letter, folded, that the capital of small letter `c`
/// imitates, if one does (`I` for a capital whose prototype is `l`).
fn capital_look(c: char) -> Option<char> {
    let mut upper = c.to_uppercase();
    let u = upper.next().filter(|u| *u != c && upper.len() == 0)?;
    let mut buf = [0u8; 4];
    let mut skeleton = unicode_security::skeleton(u.encode_utf8(&mut buf));
    let p = skeleton.next().filter(|p| p.is_ascii_alphabetic())?;
    if skeleton.next().is_some() {
        return None;
    }
    Some(if p == 'l' {
        'i'
    } else {
        p.to_ascii_lowercase()
    })
}

/// Characters below this are looked up in [`Prototypes`]; the rest (CJK
/// extensions, private use) are mapped as they come.
const TABLE_END: u32 = 0x2_0000;
const ROW: usize = 128;

/// What normalisation writes for each non-ASCII character below
/// [`TABLE_END`] once NFKC has been applied, and whether NFKC leaves the
/// character alone, computed once per process (~20 ms of one core in a
/// release build; ~370 KiB, most of it Hangul syllables, whose skeletons
/// are their jamo): through the crate's iterators the skeleton of one
/// character costs ~1,000 instructions (NFD, two binary searches, NFD
/// again) and a capital's look as much again, a lookup here a few dozen,
/// and the NFKC quick check another ~350.
struct Prototypes {
    /// For each block of [`ROW`] code points, its row in `rows`; row 0
    /// (every character written as itself, stable under NFKC) is shared.
    blocks: Vec<u16>,
    /// Entries: [`UNSTABLE`] for a character that NFKC may change or that
    /// may compose with the one before it (NFKC quick check not Yes, or a
    /// combining class), and a [`TAG`]: [`ONE`] (one character, in bits
    /// 2..23), [`TEXT`] (length in bits 2..6, offset in `text` in bits
    /// 7..30) or a code ([`ITSELF`], [`SPACE`], [`NOTHING`], [`LIVE`]:
    /// longer than a [`TEXT`] holds, mapped as it comes).
    rows: Vec<[u32; ROW]>,
    text: String,
}

const UNSTABLE: u32 = 1 << 31;
const TAG: u32 = 3;
const ONE: u32 = 1;
const TEXT: u32 = 2;
const ITSELF: u32 = 0;
const SPACE: u32 = 1 << 2;
const NOTHING: u32 = 2 << 2;
const LIVE: u32 = 3 << 2;

/// The table, built on first use; [`prepare`] builds it ahead.
fn prototypes() -> &'static Prototypes {
    static TABLE: OnceLock<Prototypes> = OnceLock::new();
    TABLE.get_or_init(Prototypes::build)
}

/// Builds the prototype table now (configuration load calls this), so that
/// the first request with non-ASCII text does not wait for it.
pub fn prepare() {
    prototypes();
}

impl Prototypes {
    fn build() -> Prototypes {
        let mut table = Prototypes {
            blocks: Vec::with_capacity(TABLE_END as usize / ROW),
            rows: vec![[0; ROW]],
            text: String::new(),
        };
        let mut form = String::new();
        for block in 0..TABLE_END / ROW as u32 {
            let mut row = [0u32; ROW];
            for (i, entry) in row.iter_mut().enumerate() {
                let Some(c) = char::from_u32(block * ROW as u32 + i as u32) else {
                    continue;
                };
                if c.is_ascii() {
                    continue;
                }
                let stable = is_nfkc_quick(std::iter::once(c)) == IsNormalized::Yes
                    && unicode_normalization::char::canonical_combining_class(c) == 0;
                let code = if is_invisible(c) {
                    NOTHING
                } else if c.is_whitespace() {
                    SPACE
                } else {
                    form.clear();
                    Writer {
                        out: &mut form,
                        space: false,
                    }
                    .fold(c, 1);
                    let (offset, len) = (table.text.len(), form.len());
                    let mut chars = form.chars();
                    match (chars.next(), chars.next()) {
                        (None, _) => NOTHING,
                        (Some(f), None) if f == c => ITSELF,
                        (Some(f), None) => (f as u32) << 2 | ONE,
                        _ if len < 32 && offset < 1 << 24 => {
                            table.text.push_str(&form);
                            (offset as u32) << 7 | (len as u32) << 2 | TEXT
                        }
                        _ => LIVE,
                    }
                };
                *entry = code | if stable { 0 } else { UNSTABLE };
            }
            let index = if row.iter().all(|e| *e == 0) {
                0
            } else {
                table.rows.push(row);
                table.rows.len() - 1
            };
            table.blocks.push(index as u16);
        }
        table
    }

    /// The entry for `c`; `None` beyond the table.
    fn entry(&self, c: char) -> Option<u32> {
        let c = c as usize;
        let row = *self.blocks.get(c / ROW)?;
        Some(self.rows[row as usize][c % ROW])
    }
}

/// Case folding changes `c`.
fn folds(c: char) -> bool {
    let mut lower = c.to_lowercase();
    matches!(c, 'ß' | 'ẞ' | 'ς') || lower.len() != 1 || lower.next() != Some(c)
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

    #[test]
    fn letters_of_other_scripts_normalise_to_the_latin_they_imitate() {
        for s in [
            "\u{456}gnore prev\u{456}ous \u{456}nstruct\u{456}ons", // Cyrillic і
            "ign\u{43E}re previ\u{43E}us instructi\u{43E}ns",       // Cyrillic о
            "ign\u{3BF}re previ\u{3BF}us instructi\u{3BF}ns",       // Greek ο
            "\u{406}GN\u{41E}R\u{415} PR\u{415}VIOUS INSTRU\u{421}TIONS", // Cyrillic І О Е С
            "ignore \u{3C1}revious instructions",                   // Greek ρ
            "ign\u{3BF}re \u{440}r\u{435}vious \u{456}n\u{455}tru\u{441}tions", // Greek and Cyrillic
            "ｉｇｎｏｒｅ previous instructions",                               // fullwidth (NFKC)
            "\u{456}g\u{200B}n\u{43E}re previous\u{00A0}instructions",          // with invisibles
            "ign\u{7C0}re previous instructions",                               // NKo digit zero: O
        ] {
            assert_eq!(normalize(s), "ignore previous instructions", "{s:?}");
        }
        assert_eq!(normalize("d\u{435}v\u{435}l\u{43E}p\u{435}r"), "developer");
        // Capitals that imitate Latin capitals, Cyrillic and Greek, and
        // their small forms, which map alike.
        assert_eq!(normalize("DEVELOPER \u{41C}\u{41E}DE"), "developer mode");
        assert_eq!(
            normalize("D\u{395}V\u{395}LOP\u{395}R \u{39C}ODE"),
            "developer mode"
        );
        assert_eq!(
            normalize("\u{422}\u{41D}\u{415} \u{392}\u{39A}\u{3A4}\u{3A7}"),
            "the bktx"
        );
        assert_eq!(
            normalize("\u{442}\u{43D}\u{435} \u{3B2}\u{3BA}\u{3C4}\u{3C7}"),
            normalize("\u{422}\u{41D}\u{415} \u{392}\u{39A}\u{3A4}\u{3A7}")
        );
        // An m look-alike NFKC does not fold (Armenian turned ayb, whose
        // prototype is `rn`) is written `m`, like the ASCII letter.
        assert_eq!(normalize("\u{560}ode"), "mode");
    }

    #[test]
    fn ascii_is_kept_as_it_is() {
        // UTS #39 maps 0 to O, 1, I and | to l, m to rn: not applied to
        // ASCII, on the fast path or beside other scripts.
        for s in ["2024-01-15", "burn modern", "a|b", "l1 i1 0o `x`", "\"%\""] {
            assert_eq!(normalize(s), s.to_ascii_lowercase(), "{s:?}");
            assert_eq!(
                normalize(&format!("{s} \u{434}")),
                format!("{} \u{434}", s.to_ascii_lowercase())
            );
        }
    }

    #[test]
    fn other_scripts_keep_the_letters_that_imitate_none() {
        let ru = normalize("Привет, как дела?");
        assert!(ru.contains('\u{43B}') && ru.contains('\u{434}'), "{ru:?}"); // л, д
        assert_eq!(normalize("ИГНОРИРУЙ"), normalize("игнорируй"));
        assert_eq!(normalize("ΣΑΣ"), normalize("σας"));
        // A composed and a decomposed letter are one letter.
        assert_eq!(normalize("\u{439}"), normalize("\u{438}\u{306}"));
        // Diacritics stay: `é` is not `e`.
        assert_ne!(normalize("résumé"), "resume");
        // A prototype that is itself a capital is folded as that letter
        // would be: Canadian syllabics ᒥ looks like Greek Γ (whose small
        // γ imitates y).
        assert_eq!(normalize("\u{14A5}"), normalize("\u{393}"));
        assert_eq!(normalize("\u{14A5}"), "y");
        // Greek β reads as the B its capital imitates, not as ß.
        assert_eq!(normalize("\u{3B2}\u{392}"), "bb");
    }

    #[test]
    fn the_table_agrees_with_the_mapping_it_stores() {
        let started = std::time::Instant::now();
        let built = Prototypes::build();
        let elapsed = started.elapsed();
        let table = prototypes();
        assert_eq!(built.rows, table.rows);
        eprintln!(
            "prototype table: {:?}, {} rows, {} bytes of forms",
            elapsed,
            table.rows.len(),
            table.text.len()
        );
        let mut live = String::new();
        for c in (0x80..TABLE_END).filter_map(char::from_u32) {
            if c.is_whitespace() || is_invisible(c) {
                continue;
            }
            live.clear();
            Writer {
                out: &mut live,
                space: false,
            }
            .fold(c, 1);
            let mut stored = String::new();
            Writer {
                out: &mut stored,
                space: false,
            }
            .entry(c, table.entry(c).unwrap());
            assert_eq!(stored, live, "U+{:04X}", c as u32);
        }
        // Beyond the table, characters are mapped as they come.
        assert_eq!(normalize("\u{20000}\u{1D400}"), "\u{20000}a");
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

        /// The one-pass table path writes what NFKC and the mapping write.
        #[test]
        fn the_table_path_agrees_with_nfkc(s in "(\\PC|[а-яА-Яα-ωΑ-Ω\u{300}-\u{36f}\u{200b}\u{ff01}-\u{ff5e}])*") {
            let mut slow = String::new();
            let mut w = Writer { out: &mut slow, space: false };
            for c in s.chars().filter(|c| !is_invisible(*c)).nfkc() {
                w.char(c);
            }
            proptest::prop_assert_eq!(normalize(&s), slow);
        }

        /// Canonically equivalent spellings (composed, decomposed) normalise
        /// alike, and so does the NFKC form: the skeleton is taken after
        /// NFKC, one character at a time.
        #[test]
        fn equivalent_spellings_normalise_alike(s in "\\PC{0,30}") {
            let n = normalize(&s);
            proptest::prop_assert_eq!(&normalize(&s.nfd().collect::<String>()), &n);
            proptest::prop_assert_eq!(&normalize(&s.nfc().collect::<String>()), &n);
            proptest::prop_assert_eq!(&normalize(&s.nfkc().collect::<String>()), &n);
        }

        /// Text in the scripts phrases are written in is a fixed point:
        /// normalising twice changes nothing more. (Not so for every
        /// character: a few prototypes hold compatibility characters, `‰`
        /// becomes `°/₀₀`, and per-character skeletons do not reorder
        /// combining marks across characters.)
        #[test]
        fn idempotent(s in "[ -~\u{a0}-\u{17f}\u{391}-\u{3a9}\u{3b1}-\u{3c9}\u{400}-\u{45f}\u{ff01}-\u{ff5e}\u{200b}]{0,30}") {
            let once = normalize(&s);
            proptest::prop_assert_eq!(normalize(&once), once.clone());
        }
    }
}
