//! Reads the token counts out of one JSON document (a response body, or
//! one SSE `data:` payload) without decoding the rest of it.
//!
//! Only the top level and the three usage carriers (`usage`,
//! `message.usage`, `response.usage`) are read. Every other value is
//! skipped by finding its end: a string by its closing quote, a container
//! by its matching bracket. A full serde pass cost ~6k instructions per
//! chat completion (callgrind), nearly all of it decoding and validating
//! text that is never used; this reader needs a fraction of that.
//!
//! On valid JSON it learns exactly what serde's typed reading (which it
//! replaced, and which the tests keep as the oracle) learns:
//! - counts are non-negative integers that fit in a `u64`; any other value
//!   (a string, a negative, a fraction, `null`) is "not reported";
//! - a carrier that is not an object is skipped;
//! - a carrier, or a count in one, given twice makes the document unread,
//!   as serde refuses duplicate fields: the two copies disagree, and the
//!   estimate stands rather than a guess.
//!
//! A document whose top-level structure does not close is not read either.
//! Skipped values are not validated: a malformed string elsewhere in a
//! response does not hide the usage beside it.

/// The counts one usage object carries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fields {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Anthropic: prompt tokens read from the cache, beside `input_tokens`.
    pub cache_read_input_tokens: Option<u64>,
    /// Anthropic: prompt tokens written to the cache, beside `input_tokens`.
    pub cache_creation_input_tokens: Option<u64>,
    /// OpenAI chat and completions: `prompt_tokens_details.cached_tokens`,
    /// the part of `prompt_tokens` read from the cache.
    pub prompt_cached: Option<u64>,
    /// The Responses API: `input_tokens_details.cached_tokens`, the part
    /// of `input_tokens` read from the cache.
    pub input_cached: Option<u64>,
}

/// The usage objects one document carries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub usage: Option<Fields>,
    pub message: Option<Fields>,
    pub response: Option<Fields>,
}

/// The counts in `doc`, or `None` when it is not a readable JSON object.
pub(crate) fn read_counts(doc: &[u8]) -> Option<Counts> {
    let mut r = Reader { b: doc, i: 0 };
    r.ws();
    if !r.eat(b'{') {
        return None;
    }
    let mut counts = Counts::default();
    let mut seen = 0u8;
    r.members(|r, key| {
        let (bit, slot) = match key {
            Key::Usage => (1, &mut counts.usage),
            Key::Message => (2, &mut counts.message),
            Key::Response => (4, &mut counts.response),
            _ => return r.skip_value(),
        };
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
        *slot = if bit == 1 {
            r.fields()?
        } else {
            r.wrapped_fields()?
        };
        Some(())
    })?;
    r.ws();
    (r.i == r.b.len()).then_some(counts)
}

/// A member name, as far as this reader cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Usage,
    Message,
    Response,
    PromptTokens,
    CompletionTokens,
    InputTokens,
    OutputTokens,
    CacheRead,
    CacheCreation,
    PromptDetails,
    InputDetails,
    CachedTokens,
    Other,
}

impl Key {
    fn of(name: &[u8]) -> Key {
        match name {
            b"usage" => Key::Usage,
            b"message" => Key::Message,
            b"response" => Key::Response,
            b"prompt_tokens" => Key::PromptTokens,
            b"completion_tokens" => Key::CompletionTokens,
            b"input_tokens" => Key::InputTokens,
            b"output_tokens" => Key::OutputTokens,
            b"cache_read_input_tokens" => Key::CacheRead,
            b"cache_creation_input_tokens" => Key::CacheCreation,
            b"prompt_tokens_details" => Key::PromptDetails,
            b"input_tokens_details" => Key::InputDetails,
            b"cached_tokens" => Key::CachedTokens,
            _ => Key::Other,
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.i += usize::from(hit);
        hit
    }

    /// Skips JSON whitespace.
    #[inline]
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// The members of an object whose `{` was just read, each handed to
    /// `each` with the reader at its value; `each` must consume the value.
    fn members(&mut self, mut each: impl FnMut(&mut Self, Key) -> Option<()>) -> Option<()> {
        self.ws();
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            self.ws();
            let key = self.key()?;
            self.ws();
            if !self.eat(b':') {
                return None;
            }
            self.ws();
            each(self, key)?;
            self.ws();
            if self.eat(b',') {
                continue;
            }
            return self.eat(b'}').then_some(());
        }
    }

    /// A member name. Names are compared decoded, as serde compares them:
    /// an escaped name (`"usag\u0065"`) is decoded first (rare, so slow).
    #[inline]
    fn key(&mut self) -> Option<Key> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        let escaped = self.skip_string_rest()?;
        let raw = &self.b[start..self.i - 1];
        if !escaped {
            return Some(Key::of(raw));
        }
        let decoded: String = serde_json::from_slice(&self.b[start - 1..self.i]).ok()?;
        Some(Key::of(decoded.as_bytes()))
    }

    /// `message` or `response`: an object whose `usage` is read; anything
    /// else is skipped.
    fn wrapped_fields(&mut self) -> Option<Option<Fields>> {
        if !self.eat(b'{') {
            self.skip_value()?;
            return Some(None);
        }
        let mut usage = None;
        let mut seen = false;
        self.members(|r, key| {
            if key != Key::Usage {
                return r.skip_value();
            }
            if std::mem::replace(&mut seen, true) {
                return None;
            }
            usage = r.fields()?;
            Some(())
        })?;
        Some(usage)
    }

    /// A usage object's counts; `Some(None)` when the value is not an object.
    fn fields(&mut self) -> Option<Option<Fields>> {
        if !self.eat(b'{') {
            self.skip_value()?;
            return Some(None);
        }
        let mut f = Fields::default();
        let mut seen = 0u8;
        self.members(|r, key| {
            let (bit, slot, nested) = match key {
                Key::PromptTokens => (1, &mut f.prompt_tokens, false),
                Key::CompletionTokens => (2, &mut f.completion_tokens, false),
                Key::InputTokens => (4, &mut f.input_tokens, false),
                Key::OutputTokens => (8, &mut f.output_tokens, false),
                Key::CacheRead => (16, &mut f.cache_read_input_tokens, false),
                Key::CacheCreation => (32, &mut f.cache_creation_input_tokens, false),
                Key::PromptDetails => (64, &mut f.prompt_cached, true),
                Key::InputDetails => (128, &mut f.input_cached, true),
                _ => return r.skip_value(),
            };
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            *slot = if nested {
                r.cached()?
            } else {
                r.count_value()?
            };
            Some(())
        })?;
        Some(Some(f))
    }

    /// A count value: `Some(None)` when it is not a count.
    fn count_value(&mut self) -> Option<Option<u64>> {
        let start = self.i;
        self.skip_value()?;
        Some(count(&self.b[start..self.i]))
    }

    /// A `*_tokens_details` object's `cached_tokens`; `Some(None)` when
    /// the value is not an object or has no count there.
    fn cached(&mut self) -> Option<Option<u64>> {
        if !self.eat(b'{') {
            self.skip_value()?;
            return Some(None);
        }
        let mut cached = None;
        let mut seen = false;
        self.members(|r, key| {
            if key != Key::CachedTokens {
                return r.skip_value();
            }
            if std::mem::replace(&mut seen, true) {
                return None;
            }
            cached = r.count_value()?;
            Some(())
        })?;
        Some(cached)
    }

    /// Moves past one value of any kind.
    #[inline]
    fn skip_value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.i += 1;
                self.skip_string_rest().map(drop)
            }
            b'{' | b'[' => self.skip_container(),
            _ => {
                // A number or a literal: up to the next delimiter.
                let start = self.i;
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.i += 1;
                }
                (self.i > start).then_some(())
            }
        }
    }

    /// Moves past the rest of a string whose opening quote was read;
    /// `Some(true)` when it held an escape.
    #[inline]
    fn skip_string_rest(&mut self) -> Option<bool> {
        let mut escaped = false;
        loop {
            let at = self.i + find_quote_or_backslash(self.b.get(self.i..)?)?;
            if self.b[at] == b'"' {
                self.i = at + 1;
                return Some(escaped);
            }
            // A backslash and the byte it escapes (a `\uXXXX`'s digits
            // hold no quote or backslash).
            escaped = true;
            self.i = at + 2;
        }
    }

    /// Moves past an object or array, matching brackets outside strings.
    fn skip_container(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            self.i += find_quote_or_bracket(self.b.get(self.i..)?)?;
            let c = self.b[self.i];
            self.i += 1;
            match c {
                b'"' => {
                    self.skip_string_rest()?;
                }
                b'{' | b'[' => depth += 1,
                _ => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(());
                    }
                }
            }
        }
    }
}

/// Keys whose string values carry generated output in an answer: OpenAI
/// chat `content`, `refusal`, `reasoning_content` and tool calls'
/// `arguments`, completions' `text`, Anthropic's `text`, `partial_json`
/// and `thinking` deltas, and the Responses API's string `delta`.
const OUTPUT_KEYS: [&[u8]; 8] = [
    b"content",
    b"text",
    b"delta",
    b"arguments",
    b"partial_json",
    b"thinking",
    b"refusal",
    b"reasoning_content",
];

/// Bytes of generated text in one JSON document (an SSE event's data, or
/// a whole answer): the string values of [`OUTPUT_KEYS`], as written
/// (an escape counts its bytes, so the count errs high, never low). One
/// pass that skips everything but strings; not validated.
pub(crate) fn output_text_bytes(doc: &[u8]) -> u64 {
    let mut total = 0u64;
    let mut at = 0;
    while let Some(q) = doc.get(at..).and_then(|r| memchr::memchr(b'"', r)) {
        let start = at + q + 1;
        let Some(end) = string_end(doc, start) else {
            break;
        };
        let after = skip_space(doc, end + 1);
        if doc.get(after) != Some(&b':') {
            // A value (or an array's element): not after an output key.
            at = end + 1;
            continue;
        }
        let value = skip_space(doc, after + 1);
        at = value;
        if doc.get(value) == Some(&b'"') && OUTPUT_KEYS.contains(&&doc[start..end]) {
            let Some(value_end) = string_end(doc, value + 1) else {
                break;
            };
            total = total.saturating_add((value_end - value - 1) as u64);
            at = value_end + 1;
        }
    }
    total
}

/// The index of the quote that closes the string whose text starts at `from`.
fn string_end(doc: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        let hit = at + find_quote_or_backslash(doc.get(at..)?)?;
        if doc[hit] == b'"' {
            return Some(hit);
        }
        // An escape: its next byte is never the string's end.
        at = hit + 2;
    }
}

fn skip_space(doc: &[u8], mut at: usize) -> usize {
    while doc.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

// Finding the next interesting byte eight bytes at a time (SWAR): a byte
// loop cost ~20 instructions per byte of response (callgrind), which made
// skipping as dear as parsing.
const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `w` that is zero. A borrow can only mark
/// bytes above a real zero, so the lowest mark is always exact.
#[inline]
fn zero_bytes(w: u64) -> u64 {
    w.wrapping_sub(LO) & !w & HI
}

/// The index of the first byte of `s` for which `hit` marks a match.
#[inline]
fn find_by(s: &[u8], hit: impl Fn(u64) -> u64) -> Option<usize> {
    let mut words = s.chunks_exact(8);
    let mut base = 0;
    for w in &mut words {
        let m = hit(u64::from_le_bytes(w.try_into().ok()?));
        if m != 0 {
            return Some(base + (m.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    // The last 0-7 bytes, padded with spaces (which match nothing).
    let tail = words
        .remainder()
        .iter()
        .rev()
        .fold(u64::from_le_bytes([b' '; 8]), |w, &c| {
            (w << 8) | u64::from(c)
        });
    let m = hit(tail);
    (m != 0).then(|| base + (m.trailing_zeros() / 8) as usize)
}

#[inline]
fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    find_by(s, |w| {
        zero_bytes(w ^ (LO * u64::from(b'"'))) | zero_bytes(w ^ (LO * u64::from(b'\\')))
    })
}

/// A quote or any bracket. `[` and `]` differ from `{` and `}` only in
/// bit 5, which no other byte pairs with them: setting it folds each
/// bracket pair into one comparison.
#[inline]
fn find_quote_or_bracket(s: &[u8]) -> Option<usize> {
    find_by(s, |w| {
        let folded = w | (LO * 0x20);
        zero_bytes(w ^ (LO * u64::from(b'"')))
            | zero_bytes(folded ^ (LO * u64::from(b'{')))
            | zero_bytes(folded ^ (LO * u64::from(b'}')))
    })
}

/// A token count: a non-negative integer that fits in a `u64`. Fractions,
/// exponents, negatives (serde reads `-0` as a float too) and overflowing
/// integers (a float to serde) are not counts.
fn count(lit: &[u8]) -> Option<u64> {
    if lit.is_empty() || !lit.iter().all(u8::is_ascii_digit) {
        return None;
    }
    lit.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// The serde-based reading this module replaced, kept as the oracle.
    mod oracle {
        use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
        use serde::Deserialize;
        use std::fmt;
        use std::marker::PhantomData;

        #[derive(Deserialize)]
        struct Carrier {
            #[serde(default)]
            usage: IfObject<UsageFields>,
            #[serde(default)]
            message: IfObject<Wrapper>,
            #[serde(default)]
            response: IfObject<Wrapper>,
        }
        #[derive(Deserialize)]
        struct Wrapper {
            #[serde(default)]
            usage: IfObject<UsageFields>,
        }
        #[derive(Deserialize)]
        struct UsageFields {
            #[serde(default)]
            prompt_tokens: Count,
            #[serde(default)]
            completion_tokens: Count,
            #[serde(default)]
            input_tokens: Count,
            #[serde(default)]
            output_tokens: Count,
            #[serde(default)]
            cache_read_input_tokens: Count,
            #[serde(default)]
            cache_creation_input_tokens: Count,
            #[serde(default)]
            prompt_tokens_details: IfObject<Details>,
            #[serde(default)]
            input_tokens_details: IfObject<Details>,
        }
        #[derive(Deserialize)]
        struct Details {
            #[serde(default)]
            cached_tokens: Count,
        }
        struct IfObject<T>(Option<T>);
        impl<T> Default for IfObject<T> {
            fn default() -> Self {
                IfObject(None)
            }
        }
        #[derive(Default)]
        struct Count(Option<u64>);
        trait Lenient<'de>: Default {
            fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Self::default())
            }
            fn from_u64(_: u64) -> Self {
                Self::default()
            }
        }
        impl<'de, T: Deserialize<'de>> Lenient<'de> for IfObject<T> {
            fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|t| IfObject(Some(t)))
            }
        }
        impl Lenient<'_> for Count {
            fn from_u64(n: u64) -> Self {
                Count(Some(n))
            }
        }
        struct LenientVisitor<T>(PhantomData<T>);
        impl<'de, T: Lenient<'de>> Visitor<'de> for LenientVisitor<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::from_map(map)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(T::default())
            }
            fn visit_u64<E>(self, n: u64) -> Result<T, E> {
                Ok(T::from_u64(n))
            }
            fn visit_i64<E>(self, n: i64) -> Result<T, E> {
                Ok(u64::try_from(n).map_or_else(|_| T::default(), T::from_u64))
            }
            fn visit_f64<E>(self, _: f64) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_unit<E>(self) -> Result<T, E> {
                Ok(T::default())
            }
        }
        impl<'de, T: Deserialize<'de>> Deserialize<'de> for IfObject<T> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(LenientVisitor(PhantomData))
            }
        }
        impl<'de> Deserialize<'de> for Count {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(LenientVisitor(PhantomData))
            }
        }

        pub fn read(doc: &[u8]) -> Option<super::Counts> {
            let c: Carrier = serde_json::from_slice(doc).ok()?;
            let fields = |u: &IfObject<UsageFields>| {
                u.0.as_ref().map(|u| super::Fields {
                    prompt_tokens: u.prompt_tokens.0,
                    completion_tokens: u.completion_tokens.0,
                    input_tokens: u.input_tokens.0,
                    output_tokens: u.output_tokens.0,
                    cache_read_input_tokens: u.cache_read_input_tokens.0,
                    cache_creation_input_tokens: u.cache_creation_input_tokens.0,
                    prompt_cached: u
                        .prompt_tokens_details
                        .0
                        .as_ref()
                        .and_then(|d| d.cached_tokens.0),
                    input_cached: u
                        .input_tokens_details
                        .0
                        .as_ref()
                        .and_then(|d| d.cached_tokens.0),
                })
            };
            let nested = |w: &IfObject<Wrapper>| w.0.as_ref().and_then(|w| fields(&w.usage));
            Some(super::Counts {
                usage: fields(&c.usage),
                message: nested(&c.message),
                response: nested(&c.response),
            })
        }
    }

    fn both(doc: &str) -> Option<Counts> {
        let ours = read_counts(doc.as_bytes());
        assert_eq!(ours, oracle::read(doc.as_bytes()), "{doc}");
        ours
    }

    #[test]
    fn reads_what_serde_reads() {
        let c = both(r#" {"id":"x","choices":[{"message":{"content":"usage: {\"prompt_tokens\":9}"}}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}} "#).unwrap();
        assert_eq!(c.usage.unwrap().prompt_tokens, Some(3));
        assert_eq!(c.usage.unwrap().completion_tokens, Some(4));
        let c = both(r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,"output_tokens":1}}}"#).unwrap();
        assert_eq!(c.message.unwrap().input_tokens, Some(25));
        let c = both(r#"{"response":{"usage":{"input_tokens":9,"output_tokens":2}},"usage":{}}"#)
            .unwrap();
        assert_eq!(c.response.unwrap().output_tokens, Some(2));
        assert_eq!(c.usage, Some(Fields::default()));
        // Cached and cache-write counts, flat (Anthropic) or in details (OpenAI).
        let c = both(r#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":4}}}"#).unwrap();
        assert_eq!(c.usage.unwrap().prompt_cached, Some(4));
        let c = both(r#"{"response":{"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":2}}}}"#).unwrap();
        assert_eq!(c.response.unwrap().input_cached, Some(2));
        let c = both(r#"{"usage":{"input_tokens":3,"cache_read_input_tokens":7,"cache_creation_input_tokens":5}}"#).unwrap();
        let u = c.usage.unwrap();
        assert_eq!(
            (u.cache_read_input_tokens, u.cache_creation_input_tokens),
            (Some(7), Some(5))
        );
        both(
            r#"{"usage":{"prompt_tokens_details":null,"input_tokens_details":[{"cached_tokens":1}]}}"#,
        );
        assert_eq!(
            both(r#"{"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}"#),
            None
        );
        // Escaped names are compared decoded.
        let c = both(r#"{"usag\u0065":{"prompt_tokens":5}}"#).unwrap();
        assert_eq!(c.usage.unwrap().prompt_tokens, Some(5));
        for odd in [
            r#"{"usage":null}"#,
            r#"{"usage":[1,2,{"prompt_tokens":3}]}"#,
            r#"{"usage":{"prompt_tokens":"12","completion_tokens":-3,"input_tokens":1.5,"output_tokens":-0}}"#,
            r#"{"usage":{"prompt_tokens":18446744073709551616,"completion_tokens":1e2}}"#,
            r#"{"response":true,"message":{"usage":7}}"#,
            r#"{}"#,
        ] {
            both(odd);
        }
    }

    #[test]
    fn unreadable_documents_teach_nothing() {
        // serde would read an array positionally as the struct; no provider
        // sends one, and here it teaches nothing.
        assert_eq!(read_counts(br#"[{"prompt_tokens":3}]"#), None);
        for bad in [
            "",
            r#""usage""#,
            r#"{"usage":"#,
            r#"{"usage":{"prompt_tokens":3}"#,
            r#"{"usage":{"prompt_tokens":3}} x"#,
            r#"{"usage" {"prompt_tokens":3}}"#,
            r#"{"a":"unterminated}"#,
            r#"{"a":1 "usage":{"prompt_tokens":3}}"#,
            // Repeated carriers and counts: serde refuses duplicate fields.
            r#"{"usage":{"prompt_tokens":3},"usage":{"prompt_tokens":4}}"#,
            r#"{"message":{"usage":{"input_tokens":1},"usage":{}}}"#,
            r#"{"usage":{"prompt_tokens":3,"prompt_tokens":4}}"#,
        ] {
            assert_eq!(both(bad), None, "{bad}");
        }
        // A repeated key nobody reads is fine, as for serde.
        assert!(both(r#"{"id":1,"id":2,"usage":{"total_tokens":1,"total_tokens":2}}"#).is_some());
    }

    #[test]
    fn finders_match_a_byte_loop() {
        let text: Vec<u8> = (0..=255u8).cycle().take(600).collect();
        for start in 0..300 {
            for end in start..start + 40 {
                let s = &text[start..end];
                assert_eq!(
                    find_quote_or_backslash(s),
                    s.iter().position(|c| matches!(c, b'"' | b'\\'))
                );
                assert_eq!(
                    find_quote_or_bracket(s),
                    s.iter()
                        .position(|c| matches!(c, b'"' | b'{' | b'}' | b'[' | b']'))
                );
            }
        }
    }

    #[test]
    fn counts() {
        assert_eq!(count(b"0"), Some(0));
        assert_eq!(count(b"18446744073709551615"), Some(u64::MAX));
        for no in [
            &b""[..],
            b"-1",
            b"-0",
            b"1.0",
            b"1e3",
            b"true",
            b"18446744073709551616",
        ] {
            assert_eq!(count(no), None);
        }
    }

    /// JSON values shaped like provider responses: the carrier names, count
    /// names and odd values turn up often.
    fn value() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("usage".to_string()),
            Just("message".to_string()),
            Just("response".to_string()),
            Just("prompt_tokens".to_string()),
            Just("completion_tokens".to_string()),
            Just("input_tokens".to_string()),
            Just("output_tokens".to_string()),
            Just("cache_read_input_tokens".to_string()),
            Just("prompt_tokens_details".to_string()),
            Just("cached_tokens".to_string()),
            "[a-z_\"\\\\{}\\[\\],: é\u{1}]{0,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (0u64..100).prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[a-z\"\\\\{}\\[\\],: é\u{1}\n]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                proptest::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Documents shaped like provider responses: carriers with counts,
    /// among other members, and sometimes odd values in their place.
    fn response() -> impl Strategy<Value = Value> {
        let count_key = prop_oneof![
            Just("prompt_tokens"),
            Just("completion_tokens"),
            Just("input_tokens"),
            Just("output_tokens"),
            Just("total_tokens"),
            Just("cache_read_input_tokens"),
            Just("cache_creation_input_tokens"),
            Just("prompt_tokens_details"),
            Just("input_tokens_details"),
        ];
        let count = prop_oneof![
            4 => (0u64..100_000).prop_map(Value::from),
            1 => (0u64..1000).prop_map(|n| json!({ "cached_tokens": n, "audio_tokens": 0 })),
            1 => value(),
        ];
        let fields = proptest::collection::vec((count_key, count), 0..5).prop_map(|kv| {
            Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        });
        let carrier = prop_oneof![4 => fields, 1 => value()];
        let wrapper = prop_oneof![
            3 => (carrier.clone(), value()).prop_map(|(u, other)| json!({ "id": other, "usage": u })),
            1 => value(),
        ];
        let pick = |v: Option<Value>| v.unwrap_or(Value::Null);
        (
            proptest::option::of(carrier),
            proptest::option::of(wrapper.clone()),
            proptest::option::of(wrapper),
            value(),
            value(),
        )
            .prop_map(move |(u, m, r, a, b)| {
                let mut o = serde_json::Map::new();
                o.insert("choices".into(), a);
                for (k, v) in [("usage", u), ("message", m), ("response", r)] {
                    if v.is_some() {
                        o.insert(k.into(), pick(v));
                    }
                }
                o.insert("z".into(), b);
                Value::Object(o)
            })
    }

    proptest! {
        #[test]
        fn same_counts_as_serde_on_any_json(
            v in prop_oneof![value(), response()],
            pretty in any::<bool>(),
        ) {
            let v = match v {
                Value::Object(_) => v,
                other => json!({ "usage": other, "x": 1 }),
            };
            let doc = if pretty {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                serde_json::to_string(&v).unwrap()
            };
            prop_assert_eq!(read_counts(doc.as_bytes()), oracle::read(doc.as_bytes()), "{}", doc);
        }

        #[test]
        fn finders_agree_with_a_byte_loop(s in proptest::collection::vec(any::<u8>(), 0..80)) {
            prop_assert_eq!(
                find_quote_or_backslash(&s),
                s.iter().position(|c| matches!(c, b'"' | b'\\'))
            );
            prop_assert_eq!(
                find_quote_or_bracket(&s),
                s.iter().position(|c| matches!(c, b'"' | b'{' | b'}' | b'[' | b']'))
            );
        }

        #[test]
        fn never_panics(doc in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = read_counts(&doc);
        }
    }
}
