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
//! built once ([`Prototypes`]: the fold and prototype of every character,
//! whether NFKC leaves it alone, and what NFKC makes of a compatibility
//! character on its own), one or two lookups per character; only the
//! stretches around a character NFKC may join with the one before it (a
//! combining mark, a Hangul vowel jamo) go through NFKC, from the boundary
//! before to a boundary after ([`normalize_streaming`]). So the work per
//! input byte is bounded by the largest expansion (U+FDFA: 18 characters),
//! never by the string's length, and a caller that searches as text comes
//! ([`crate::phrases::PhraseSearch`]) holds a window of it, not a copy.

use std::sync::OnceLock;
use unicode_normalization::{is_nfkc_quick, IsNormalized, UnicodeNormalization};

/// Appends the normalised form of `s` to `out`.
pub fn normalize_into(s: &str, out: &mut String) {
    normalize_streaming(s, out, usize::MAX, &mut |_| {});
}

/// The normalised form of `s`.
pub fn normalize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    normalize_into(s, &mut out);
    out
}

/// Appends the normalised form of `s`, ASCII, to `out`: what
/// [`normalize_into`] writes, on the fast path short text takes.
#[inline]
pub(crate) fn normalize_ascii(s: &str, out: &mut String) {
    ascii_into(s.as_bytes(), &mut Writer { out, space: false });
}

/// Input bytes written between two chances to drain.
pub(crate) const PIECE: usize = 4096;

/// Appends the normalised form of `s` to `out` as [`normalize_into`] does,
/// a piece at a time: whenever `out` holds `window` bytes or more at a
/// point where what it holds is final, `drain(out)` is called, which may
/// remove any part of `out` from its start (a search keeps only the tail a
/// match may still start in). So a long string is normalised through a
/// buffer of about `window` bytes plus one piece's output, however much
/// NFKC and the prototypes expand it.
///
/// Text is final before each character NFKC cannot join with what comes
/// before it (a boundary: ASCII, most letters of any script, and the
/// compatibility characters whose decomposition starts with such a
/// letter, such as U+FDFA and the fullwidth forms): from one boundary to
/// the next the text is normalised on its own. A character that may join
/// with the one before it (a combining mark, a Hangul vowel jamo) sends
/// the text back to the last boundary, and from there to a boundary
/// followed by another through NFKC, in [Stream-Safe Text
/// Format](https://unicode.org/reports/tr15/#Stream_Safe_Text_Format)
/// (after 30 non-starters in a row a combining grapheme joiner, which
/// normalisation removes, stops canonical reordering), so that NFKC's own
/// buffers stay bounded too. Every other character costs one or two table
/// lookups.
pub fn normalize_streaming(
    s: &str,
    out: &mut String,
    window: usize,
    drain: &mut dyn FnMut(&mut String),
) {
    let mut w = Writer { out, space: false };
    let b = s.as_bytes();
    if s.is_ascii() {
        for piece in b.chunks(PIECE) {
            if w.out.len() >= window {
                drain(w.out);
            }
            ascii_into(piece, &mut w);
        }
        return;
    }
    w.out.reserve(s.len().min(window));
    let table = prototypes();
    // The last boundary: where a character that joins with what precedes
    // it sends normalisation back to.
    let mut mark = Mark {
        input: 0,
        output: w.out.len(),
        space: false,
    };
    // Characters from `base` on; a long run of ASCII, or a stretch NFKC
    // must see whole, is taken at once and the walk resumes after it.
    let mut base = 0;
    let mut chars = s.char_indices();
    while let Some((k, c)) = chars.next() {
        let i = base + k;
        let resume = if c.is_ascii() {
            if b.len() - i >= LONG_RUN && b[i..i + LONG_RUN].is_ascii() {
                let end = b[i..]
                    .iter()
                    .position(|c| !c.is_ascii())
                    .map_or(b.len(), |n| i + n);
                w.ascii_run(b, i, end, &mut mark, window, drain);
                Some(end)
            } else {
                // Between words of another script: a byte at a time.
                if ascii_visible(c as u8) {
                    if w.out.len() >= window {
                        drain(w.out);
                    }
                    mark = Mark {
                        input: i,
                        output: w.out.len(),
                        space: w.space,
                    };
                }
                w.ascii(c);
                None
            }
        } else {
            let e = table.entry(c).unwrap_or(0);
            if e & UNSTABLE == 0 {
                // Invisible (NOTHING): removed before NFKC, so no boundary
                // either.
                if e != NOTHING {
                    if w.out.len() >= window {
                        drain(w.out);
                    }
                    mark = Mark {
                        input: i,
                        output: w.out.len(),
                        space: w.space,
                    };
                    w.entry(c, e);
                }
                None
            } else if e & ALONE != 0 {
                if w.out.len() >= window {
                    drain(w.out);
                }
                mark = Mark {
                    input: i,
                    output: w.out.len(),
                    space: w.space,
                };
                w.alone(table.alone(c));
                None
            } else {
                let (end, inert) = table.region_end(s, mark.input, i);
                w.out.truncate(mark.output);
                w.space = mark.space;
                let region = &s[mark.input..end];
                if inert {
                    w.compose(region, table, window, drain);
                } else {
                    w.region(region, window, drain);
                }
                Some(end)
            }
        };
        if let Some(end) = resume {
            base = end;
            chars = s[end..].char_indices();
        }
    }
}

/// Non-starters in a row that Stream-Safe Text Format allows.
const MAX_NONSTARTERS: usize = 30;

/// Canonical composition of characters in canonical order (UAX #15: a
/// character composes with the last starter unless a character between
/// them is a starter or has a combining class at least its own).
struct Composer {
    /// The last starter, composed with what followed it so far.
    composee: Option<char>,
    /// Non-starters after it that did not compose, in order.
    pending: [char; MAX_NONSTARTERS],
    pending_len: usize,
    /// The combining class of the last of `pending`.
    last_ccc: Option<u8>,
}

impl Composer {
    fn feed(&mut self, ch: char, ccc: u8, w: &mut Writer) {
        let Some(k) = self.composee else {
            if ccc == 0 {
                self.composee = Some(ch);
            } else {
                w.char(ch);
            }
            return;
        };
        if self.last_ccc.is_none_or(|l| l < ccc) {
            if let Some(r) = unicode_normalization::char::compose(k, ch) {
                self.composee = Some(r);
                return;
            }
        }
        if ccc == 0 {
            self.flush(w);
            self.composee = Some(ch);
        } else if self.pending_len < MAX_NONSTARTERS {
            self.pending[self.pending_len] = ch;
            self.pending_len += 1;
            self.last_ccc = Some(ccc);
        } else {
            // Never: runs are at most MAX_NONSTARTERS long here. Nothing
            // is dropped all the same.
            self.flush(w);
            w.char(ch);
        }
    }

    /// Writes the starter and what did not compose with it.
    fn flush(&mut self, w: &mut Writer) {
        if let Some(k) = self.composee.take() {
            w.char(k);
        }
        for &p in &self.pending[..self.pending_len] {
            w.char(p);
        }
        self.pending_len = 0;
        self.last_ccc = None;
    }
}

/// ASCII written in bulk when this many bytes of it come in a row.
const LONG_RUN: usize = 32;

/// Not an ASCII control that normalisation removes (whitespace is kept).
fn ascii_visible(c: u8) -> bool {
    !matches!(c, 0..=0x08 | 0x0e..=0x1f | 0x7f)
}

/// Where normalisation may start again: a boundary's input offset, the
/// output length before it was written, and whether a space had just been.
struct Mark {
    input: usize,
    output: usize,
    space: bool,
}

/// Writes characters after NFKC: case folding, prototypes, whitespace.
struct Writer<'a> {
    out: &'a mut String,
    /// The last character written was a space.
    space: bool,
}

impl Writer<'_> {
    /// Writes the ASCII bytes `b[start..end]`, draining before a piece
    /// that starts with a visible character, and moves `mark` to the last
    /// visible one (every ASCII character but a control is a boundary).
    fn ascii_run(
        &mut self,
        b: &[u8],
        start: usize,
        end: usize,
        mark: &mut Mark,
        window: usize,
        drain: &mut dyn FnMut(&mut String),
    ) {
        let visible = |c: &u8| ascii_visible(*c);
        let mut at = start;
        while at < end {
            let piece = &b[at..end.min(at + PIECE)];
            if let (Some(first), Some(last)) = (
                piece.iter().position(visible),
                piece.iter().rposition(visible),
            ) {
                if self.out.len() >= window {
                    drain(self.out);
                }
                ascii_into(&piece[first..last], self);
                *mark = Mark {
                    input: at + last,
                    output: self.out.len(),
                    space: self.space,
                };
                ascii_into(&piece[last..], self);
            }
            at += piece.len();
        }
    }

    /// Normalises `text`, from a boundary to a boundary, through NFKC.
    fn region(&mut self, text: &str, window: usize, drain: &mut dyn FnMut(&mut String)) {
        let table = prototypes();
        for c in text
            .chars()
            .filter(|c| !is_invisible(*c))
            .flat_map(|c| OwnOr::of(table, c))
            .stream_safe()
            .nfkc()
        {
            self.char(c);
            if self.out.len() >= window {
                drain(self.out);
            }
        }
    }

    /// Normalises `text`, from a boundary to a boundary, when NFKD leaves
    /// every character of it as it is and no run of non-starters is longer
    /// than Stream-Safe Text Format allows ([`Prototypes::region_end`]
    /// says): then NFKC is canonical ordering and composition, done here
    /// with the combining classes from the table, as
    /// `unicode_normalization`'s composition does it (checked against it
    /// by the tests).
    fn compose(
        &mut self,
        text: &str,
        table: &Prototypes,
        window: usize,
        drain: &mut dyn FnMut(&mut String),
    ) {
        let mut c = Composer {
            composee: None,
            pending: [' '; MAX_NONSTARTERS],
            pending_len: 0,
            last_ccc: None,
        };
        // A run of non-starters, in canonical order as it is gathered.
        let mut run = [(0u8, ' '); MAX_NONSTARTERS];
        let mut run_len = 0;
        for ch in text.chars() {
            let (kind, _, ccc) = table.class(ch);
            if kind == Kind::Invisible {
                continue;
            }
            if ccc != 0 {
                let mut at = run_len.min(MAX_NONSTARTERS - 1);
                while at > 0 && run[at - 1].0 > ccc {
                    run[at] = run[at - 1];
                    at -= 1;
                }
                run[at] = (ccc, ch);
                run_len = (run_len + 1).min(MAX_NONSTARTERS);
                continue;
            }
            for &(ccc, m) in &run[..run_len] {
                c.feed(m, ccc, self);
            }
            run_len = 0;
            c.feed(ch, 0, self);
            if self.out.len() >= window {
                drain(self.out);
            }
        }
        for &(ccc, m) in &run[..run_len] {
            c.feed(m, ccc, self);
        }
        c.flush(self);
    }

    /// Writes what [`Prototypes::alone`] stores for a character.
    fn alone(&mut self, e: u32) {
        let table = prototypes();
        let (offset, len) = ((e >> 8 & 0x7F_FFFF) as usize, (e & 0xFF) as usize);
        if let Some(t) = table.alone_text.get(offset..offset + len) {
            if !t.is_empty() {
                self.fresh(|w| w.out.push_str(t));
            }
        }
    }

    /// [`Writer::char`] without the table (what building it stores).
    fn char_live(&mut self, c: char) {
        if c.is_ascii() {
            self.ascii(c);
        } else if is_invisible(c) {
        } else if c.is_whitespace() {
            self.ascii(' ');
        } else {
            self.fresh(|w| w.fold(c, 1));
        }
    }

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
    #[inline(always)]
    fn entry(&mut self, c: char, e: u32) {
        if e & !(UNSTABLE | NO_COMPOSE) == ITSELF {
            self.out.push(c);
            self.space = false;
            return;
        }
        self.entry_other(c, e);
    }

    /// [`Writer::entry`] but for [`ITSELF`].
    fn entry_other(&mut self, c: char, e: u32) {
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
                let (offset, len) = ((e >> 7 & 0x3F_FFFF) as usize, (e >> 2 & 31) as usize);
                if let Some(t) = table.text.get(offset..offset + len) {
                    self.fresh(|w| w.out.push_str(t));
                }
            }
            _ => match e & !(UNSTABLE | ALONE | NO_COMPOSE) {
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
        // Vertical tab too: Unicode's White_Space, as in `ascii_into`.
        if c.is_ascii_whitespace() || c == '\x0b' {
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

/// Every character is looked up in [`Prototypes`].
const TABLE_END: u32 = 0x11_0000;
const ROW: usize = 128;

/// The code points whose entries are computed; every other one (planes 4
/// to 13, unassigned; planes 14 past its tags and variation selectors,
/// 15 and 16, private use) is stable and written as itself, which the
/// tests check against the mapping.
const COMPUTED: [std::ops::Range<u32>; 2] = [0..0x4_0000, 0xE_0000..0xE_1000];

/// What normalisation writes for each non-ASCII character once NFKC has
/// been applied, whether NFKC leaves the character alone, and what it
/// writes for a compatibility character NFKC changes on its own, computed
/// once per process (~45 ms of one core in a release build; ~0.5 MiB, most
/// of it Hangul syllables, whose skeletons are their jamo, and the CJK
/// extensions of planes 2 and 3, ~4,400 of whose ideographs have another
/// as prototype): through the crate's iterators the skeleton of one
/// character costs ~1,000 instructions (NFD, two binary searches, NFD
/// again) and a capital's look as much again, a lookup here a few dozen,
/// and the NFKC quick check another ~350.
struct Prototypes {
    /// For each block of [`ROW`] code points, its row in `rows`; row 0
    /// (every character written as itself, stable under NFKC) is shared.
    blocks: Vec<u16>,
    /// Entries: [`UNSTABLE`] for a character that NFKC may change or that
    /// may compose with the one before it (NFKC quick check not Yes, or a
    /// combining class), [`ALONE`] for one of those that is nonetheless a
    /// boundary (see [`Prototypes::alone`]), and a [`TAG`]: [`ONE`] (one
    /// character, in bits 2..23), [`TEXT`] (length in bits 2..6, offset in
    /// `text` in bits 7..28) or a code ([`ITSELF`], [`SPACE`], [`NOTHING`],
    /// [`LIVE`]: longer than a [`TEXT`] holds, mapped as it comes), and
    /// [`NO_COMPOSE`] for a character NFKD changes. An invisible
    /// character's entry is [`NOTHING`] alone.
    rows: Vec<[u32; ROW]>,
    text: String,
    /// Like `blocks` and `rows`: for an [`ALONE`] character, bit 31 and
    /// the length (bits 0..7) and offset in `alone_text` (bits 8..30) of
    /// what NFKC and the mapping make of the character on its own; for an
    /// unstable one that is no boundary, its canonical combining class.
    alone_blocks: Vec<u16>,
    alone_rows: Vec<[u32; ROW]>,
    alone_text: String,
    /// Characters read by their own prototype rather than NFKC's form
    /// ([`own_look`]), sorted, with that prototype: what
    /// [`Writer::region`] substitutes before NFKC.
    own: Vec<(char, String)>,
}

const UNSTABLE: u32 = 1 << 31;
/// Unstable, but with a boundary before it: NFKC never joins it with
/// what precedes, and written alone it is what `alone_text` holds.
const ALONE: u32 = 1 << 30;
/// [`Writer::compose`] does not take the character: NFKD changes it (it
/// has a decomposition), or it writes nothing though NFKC sees it (an
/// unassigned default-ignorable, which blocks composition across it).
const NO_COMPOSE: u32 = 1 << 29;
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

/// How a character takes part in finding boundaries.
#[derive(PartialEq, Eq)]
enum Kind {
    /// Removed before NFKC.
    Invisible,
    /// NFKC never joins it with what precedes.
    Boundary,
    /// It may join with what precedes.
    Joins,
}

impl Prototypes {
    fn build() -> Prototypes {
        let mut table = Prototypes {
            blocks: Vec::with_capacity(TABLE_END as usize / ROW),
            rows: vec![[0; ROW]],
            text: String::new(),
            alone_blocks: Vec::with_capacity(TABLE_END as usize / ROW),
            alone_rows: vec![[0; ROW]],
            alone_text: String::new(),
            own: Vec::new(),
        };
        let mut form = String::new();
        for block in 0..TABLE_END / ROW as u32 {
            let mut row = [0u32; ROW];
            let mut alone = [0u32; ROW];
            let first = block * ROW as u32;
            if COMPUTED.iter().any(|r| r.contains(&first)) {
                for (i, entry) in row.iter_mut().enumerate() {
                    let Some(c) = char::from_u32(first + i as u32) else {
                        continue;
                    };
                    if !c.is_ascii() {
                        (*entry, alone[i]) = table.entries(c, &mut form);
                    }
                }
            }
            for (rows, blocks, row) in [
                (&mut table.rows, &mut table.blocks, row),
                (&mut table.alone_rows, &mut table.alone_blocks, alone),
            ] {
                let index = if row.iter().all(|e| *e == 0) {
                    0
                } else {
                    rows.push(row);
                    rows.len() - 1
                };
                blocks.push(index as u16);
            }
        }
        table
    }

    /// The entry of non-ASCII `c` and, if it is [`ALONE`], its alone entry.
    fn entries(&mut self, c: char, form: &mut String) -> (u32, u32) {
        if is_invisible(c) {
            return (NOTHING, 0);
        }
        let ccc = unicode_normalization::char::canonical_combining_class(c);
        let stable = is_nfkc_quick(std::iter::once(c)) == IsNormalized::Yes && ccc == 0;
        let mut first = None;
        let mut no_compose = 0;
        unicode_normalization::char::decompose_compatible(c, |d| {
            first.get_or_insert(d);
            if d != c {
                no_compose = NO_COMPOSE;
            }
        });
        // A boundary: NFKD starts with a starter that composes with nothing
        // before it (for a character NFKD leaves alone: stable).
        let boundary = match first {
            Some(f) if f != c => {
                unicode_normalization::char::canonical_combining_class(f) == 0
                    && is_nfkc_quick(std::iter::once(f)) == IsNormalized::Yes
            }
            _ => stable,
        };
        let code = if c.is_whitespace() {
            SPACE
        } else {
            form.clear();
            Writer {
                out: &mut *form,
                space: false,
            }
            .fold(c, 1);
            let (offset, len) = (self.text.len(), form.len());
            let mut chars = form.chars();
            match (chars.next(), chars.next()) {
                (None, _) => NOTHING,
                (Some(f), None) if f == c => ITSELF,
                (Some(f), None) => (f as u32) << 2 | ONE,
                _ if len < 32 && offset < 1 << 22 => {
                    self.text.push_str(form);
                    (offset as u32) << 7 | (len as u32) << 2 | TEXT
                }
                _ => LIVE,
            }
        };
        if code == NOTHING {
            // Not invisible (those were answered above): NFKC sees it.
            no_compose = NO_COMPOSE;
        }
        let code = code | no_compose;
        if stable && boundary {
            return (code, 0);
        }
        if !boundary {
            return (code | UNSTABLE, ccc.into());
        }
        form.clear();
        let mut w = Writer {
            out: &mut *form,
            space: false,
        };
        for d in std::iter::once(c).nfkc() {
            w.char_live(d);
        }
        if let Some(own) = own_look(c, form) {
            form.clear();
            form.push_str(&own);
            self.own.push((c, own));
        }
        let (offset, len) = (self.alone_text.len(), form.len());
        if len > 0xFF || offset >= 1 << 23 {
            // Too long to store: normalised through NFKC as it comes.
            return (code | UNSTABLE, ccc.into());
        }
        self.alone_text.push_str(form);
        (
            code | UNSTABLE | ALONE,
            1 << 31 | (offset as u32) << 8 | len as u32,
        )
    }

    /// The entry for `c`; `None` beyond the table.
    fn entry(&self, c: char) -> Option<u32> {
        let c = c as usize;
        let row = *self.blocks.get(c / ROW)?;
        Some(self.rows[row as usize][c % ROW])
    }

    /// The alone entry of an [`ALONE`] character: NFKC changes it, but
    /// never joins it with what precedes, so between two boundaries it is
    /// normalised as it would be on its own (U+FDFA, fullwidth forms,
    /// ligatures, compatibility ideographs).
    fn alone(&self, c: char) -> u32 {
        let c = c as usize;
        let row = self.alone_blocks.get(c / ROW).copied().unwrap_or(0);
        self.alone_rows[row as usize][c % ROW]
    }

    /// How `c` takes part in finding boundaries, whether NFKD leaves it
    /// as it is, and its canonical combining class.
    fn class(&self, c: char) -> (Kind, bool, u8) {
        if c.is_ascii() {
            let kind = match ascii_visible(c as u8) {
                false => Kind::Invisible,
                true => Kind::Boundary,
            };
            return (kind, true, 0);
        }
        match self.entry(c).unwrap_or(0) {
            NOTHING => (Kind::Invisible, true, 0),
            e if e & UNSTABLE == 0 || e & ALONE != 0 => (Kind::Boundary, e & NO_COMPOSE == 0, 0),
            e => (Kind::Joins, e & NO_COMPOSE == 0, self.alone(c) as u8),
        }
    }

    /// Where the stretch NFKC must see whole ends, for a character at
    /// `from` that joins with what precedes, the last boundary being at
    /// `start`: at a boundary followed by another boundary (so that text
    /// with marks here and there goes through NFKC in a few long
    /// stretches, not one per mark), or at the end of `s`. And whether
    /// [`Writer::compose`] may normalise it: NFKD leaves every character
    /// as it is and no run of non-starters is longer than
    /// [`MAX_NONSTARTERS`].
    fn region_end(&self, s: &str, start: usize, from: usize) -> (usize, bool) {
        let mut inert = true;
        let mut run = 0;
        let mut boundary = None;
        for (k, c) in s[start..].char_indices() {
            let (kind, plain, ccc) = self.class(c);
            if kind == Kind::Invisible {
                continue;
            }
            inert &= plain;
            run = if ccc == 0 { 0 } else { run + 1 };
            inert &= run <= MAX_NONSTARTERS;
            if start + k <= from {
                continue;
            }
            match kind {
                Kind::Boundary => match boundary {
                    Some(at) => return (at, inert),
                    None => boundary = Some(start + k),
                },
                _ => boundary = None,
            }
        }
        (s.len(), inert)
    }
}

/// The prototype a compatibility character is read by when NFKC would
/// make it a letter of another script that looks different: Greek lunate
/// sigma `ϲ` (U+03F2) looks like `c` and is confusable with it, but NFKC
/// makes it `ς`, whose prototype is `o`, so `instruϲtions` would read
/// `instruotions`. Where UTS #39 gives the character itself a prototype that
/// is one ASCII letter and differs from what NFKC's form reads as (`now`), and
/// the two forms' skeletons differ (a font variant such as mathematical
/// bold `𝚴` has the skeleton of the letter NFKC gives, `Ν`, and keeps
/// reading as that letter does), the character's own prototype is taken:
/// U+03F2, U+03F9 and the vertical em dash U+FE31 (`l`), checked
/// exhaustively by the tests. NFKC forms that are ASCII are kept (`ſ`
/// reads `s`, the letter it is).
fn own_look(c: char, now: &str) -> Option<String> {
    let mut buf = [0u8; 4];
    let nfkc: String = std::iter::once(c).nfkc().collect();
    if nfkc.is_ascii() {
        return None;
    }
    let mut own = String::new();
    Writer {
        out: &mut own,
        space: false,
    }
    .fold(c, 1);
    if own.len() != 1 || own == now || !own.bytes().all(|b| b.is_ascii_alphabetic()) {
        return None;
    }
    let skeleton = unicode_security::skeleton(c.encode_utf8(&mut buf));
    skeleton
        .ne(unicode_security::skeleton(&nfkc))
        .then_some(own)
}

/// A character as [`Writer::region`] hands it to NFKC: its own prototype
/// for one [`own_look`] chose, else itself.
enum OwnOr<'t> {
    Own(std::str::Chars<'t>),
    Char(Option<char>),
}

impl<'t> OwnOr<'t> {
    fn of(table: &'t Prototypes, c: char) -> OwnOr<'t> {
        if c.is_ascii() || table.entry(c).is_none_or(|e| e & ALONE == 0) {
            return OwnOr::Char(Some(c));
        }
        match table.own.binary_search_by_key(&c, |(k, _)| *k) {
            Ok(i) => OwnOr::Own(table.own[i].1.chars()),
            Err(_) => OwnOr::Char(Some(c)),
        }
    }
}

impl Iterator for OwnOr<'_> {
    type Item = char;
    fn next(&mut self) -> Option<char> {
        match self {
            OwnOr::Own(chars) => chars.next(),
            OwnOr::Char(c) => c.take(),
        }
    }
}

/// Case folding changes `c`.
fn folds(c: char) -> bool {
    let mut lower = c.to_lowercase();
    matches!(c, 'ß' | 'ẞ' | 'ς') || lower.len() != 1 || lower.next() != Some(c)
}

fn ascii_into(b: &[u8], w: &mut Writer) {
    let out = &mut *w.out;
    out.reserve(b.len());
    let mut space = w.space;
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
    w.space = space;
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
    fn a_character_nfkc_would_give_another_look_reads_by_its_own_prototype() {
        // Issue 41 item 11: lunate sigma, small and capital, looks like `c`;
        // NFKC's sigma reads `o`.
        for s in [
            "instru\u{3F2}tions",
            "INSTRU\u{3F9}TIONS",
            "instru\u{3F2}\u{200B}tions",
            // Through NFKC with what joins it (a region), the same.
            "instru\u{3F2}\u{301}tions",
        ] {
            assert_eq!(normalize(s).replace('\u{301}', ""), "instructions", "{s:?}");
        }
        assert_eq!(
            normalize("e\u{301}\u{3F2}\u{301}"),
            normalize("e\u{301}c\u{301}")
        );
        // Every character so read, found exhaustively: NFKC makes it a
        // non-ASCII form whose skeleton differs from its own, and its own
        // prototype is ASCII letters that differ from what that form reads.
        let chosen: Vec<char> = prototypes().own.iter().map(|(c, _)| *c).collect();
        assert_eq!(chosen, ['\u{3F2}', '\u{3F9}', '\u{FE31}']);
        for (c, own) in &prototypes().own {
            assert_eq!(&normalize(&c.to_string()), own, "U+{:04X}", *c as u32);
            let mut s = String::new();
            normalize_streaming(&format!("ab{c}cd"), &mut s, 1, &mut |o| o.clear());
        }
        // Font variants keep NFKC's letter (bold capital Nu reads as Ν), and
        // an ASCII form is the letter: long s reads `s`.
        assert_eq!(normalize("\u{1D6B4}"), normalize("\u{39D}"));
        assert_eq!(normalize("\u{17F}"), "s");
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

    #[test]
    fn long_texts_stream_through_a_bounded_buffer() {
        // U+FDFA expands to 18 characters; a long run of combining marks
        // is one stretch for NFKC. Neither may grow the buffer past the
        // window and one piece's output.
        let marks: String = std::iter::once('a')
            .chain(std::iter::repeat_n('\u{301}', 100_000))
            .collect();
        for s in [
            "\u{FDFA}".repeat(100_000),
            marks,
            "a\u{301}".repeat(50_000),
            "\u{1100}\u{1161}\u{11A8}".repeat(30_000),
        ] {
            let (mut most, mut total) = (0, 0);
            let mut out = String::new();
            normalize_streaming(&s, &mut out, 1024, &mut |buf| {
                most = most.max(buf.len());
                total += buf.len();
                buf.clear();
            });
            total += out.len();
            assert_eq!(total, normalize(&s).len());
            assert!(most < 1024 + 18 * 4 * PIECE, "{most}");
            assert!(out.capacity() < 2 * (1024 + 18 * 4 * PIECE));
        }
        // Past 30 non-starters in a row, canonical reordering stops (as
        // in Stream-Safe Text Format); up to there it is NFKC's.
        let zalgo: String = std::iter::once('e')
            .chain(std::iter::repeat_n('\u{316}', 40))
            .chain(std::iter::once('\u{301}'))
            .collect();
        assert!(normalize(&zalgo).ends_with('\u{301}'));
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
            // NFKC, but for the characters read by their own prototype.
            let table = prototypes();
            for c in s.chars().filter(|c| !is_invisible(*c)).flat_map(|c| OwnOr::of(table, c)).nfkc() {
                w.char(c);
            }
            proptest::prop_assert_eq!(normalize(&s), slow);
        }

        /// Text that joins across boundaries (combining marks after
        /// letters, after compatibility characters and after invisible
        /// characters; Hangul jamo that compose into syllables) is
        /// normalised as NFKC over the whole string would.
        #[test]
        fn boundaries_agree_with_nfkc(s in "[a-zA-Z \t\x00-\x08\u{300}-\u{36f}\u{1100}-\u{1175}\u{11a8}-\u{11c2}\u{ac00}-\u{ac1f}\u{fdfa}\u{ff21}-\u{ff5a}\u{200b}\u{ad}\u{ffa0}\u{e9}\u{3b1}-\u{3c9}\u{f900}-\u{f910}\u{2f800}-\u{2f810}\u{1d400}-\u{1d420}]{0,40}") {
            let mut slow = String::new();
            let mut w = Writer { out: &mut slow, space: false };
            for c in s.chars().filter(|c| !is_invisible(*c)).nfkc() {
                w.char(c);
            }
            proptest::prop_assert_eq!(normalize(&s), slow);
        }

        /// Combining marks of every class, in any order, after letters
        /// they compose with or not, with the starters that compose with
        /// one another (Hangul jamo, Indic two-part vowels): the
        /// composition done here writes what NFKC does.
        #[test]
        fn composition_agrees_with_nfkc(s in proptest::collection::vec(proptest::sample::select(&[
            'a', 'e', 'o', 'u', 'A', 'C', 'n', 'S', 'z', 'i', ' ', '\u{3b1}', '\u{3c9}', '\u{438}',
            '\u{300}', '\u{301}', '\u{302}', '\u{303}', '\u{308}', '\u{30a}', '\u{30c}',
            '\u{316}', '\u{323}', '\u{327}', '\u{328}', '\u{31b}', '\u{334}', '\u{345}',
            '\u{35c}', '\u{1dce}', '\u{5b0}', '\u{e49}', '\u{306}', '\u{313}', '\u{342}',
            '\u{1100}', '\u{1161}', '\u{11a8}', '\u{ac00}', '\u{b47}', '\u{b3e}', '\u{b56}',
            '\u{b57}', '\u{9c7}', '\u{9be}', '\u{9d7}', '\u{cc6}', '\u{cd5}', '\u{cc2}',
            '\u{e9}', '\u{344}', '\u{34f}', '\u{200b}', '\u{1e00}', '\u{fb01}', '\u{2065}',
            '\u{fff0}', '\u{e0080}',
        ][..]), 0..48)) {
            let s: String = s.into_iter().collect();
            let mut slow = String::new();
            let mut w = Writer { out: &mut slow, space: false };
            for c in s.chars().filter(|c| !is_invisible(*c)).nfkc() {
                w.char(c);
            }
            proptest::prop_assert_eq!(normalize(&s), slow, "{:?}", s);
        }

        /// Normalising through a small window, drained at every chance,
        /// writes what normalising at once does.
        #[test]
        fn streaming_writes_what_normalising_at_once_does(
            s in "[a-z \t\x01\u{300}-\u{30f}\u{1100}-\u{1102}\u{1161}-\u{1163}\u{ac00}\u{fdfa}\u{ff41}-\u{ff45}\u{200b}\u{3b1}\u{410}]{0,60}",
            window in 1usize..16,
        ) {
            let mut drained = String::new();
            let mut out = String::new();
            normalize_streaming(&s, &mut out, window, &mut |buf| {
                drained.push_str(buf);
                buf.clear();
            });
            drained.push_str(&out);
            proptest::prop_assert_eq!(drained, normalize(&s));
        }

        /// Canonically equivalent spellings (composed, decomposed) normalise
        /// alike, and so does the NFKC form: the skeleton is taken after
        /// NFKC, one character at a time.
        #[test]
        fn equivalent_spellings_normalise_alike(s in "\\PC{0,30}") {
            let n = normalize(&s);
            proptest::prop_assert_eq!(&normalize(&s.nfd().collect::<String>()), &n);
            proptest::prop_assert_eq!(&normalize(&s.nfc().collect::<String>()), &n);
            // NFKC changes how a character read by its own prototype
            // looks (`ϲ` to `ς`): not the same text for a reader.
            if !prototypes().own.iter().any(|(c, _)| s.contains(*c)) {
                proptest::prop_assert_eq!(&normalize(&s.nfkc().collect::<String>()), &n);
            }
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
