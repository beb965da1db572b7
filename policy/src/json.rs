//! The one strict JSON parser for what agents send: a `serde_json::Value`
//! built in one linear pass that refuses what servers could read two ways.
//!
//! Why this file exists: `serde_json::from_slice::<Value>` keeps the *last*
//! of two equal keys, while other JSON parsers keep the first. A body like
//! `{"params":{"name":"delete_file","name":"read_file"}}` would be judged as
//! `read_file` and run as `delete_file` by a first-wins server. [`parse`]
//! refuses any duplicated key, in any object at any depth (keys compared
//! after unescaping, so `"n\u0061me"` duplicates `"name"`).
//!
//! It also owns the one depth rule, [`MAX_DEPTH`], so that nesting is
//! refused by a clear error of ours, long before `serde_json`'s own
//! recursion limit (128) and far before the stack could overflow; and
//! [`check_depth`], a byte scan applying the same rule for callers that
//! parse with their own visitor (`serde::de::IgnoredAny` checks no depth
//! at all).

use crate::decision::clip;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};
use std::cell::RefCell;
use std::fmt;

/// The deepest nesting of arrays and objects accepted: `[[1]]` has depth 2,
/// a scalar depth 0.
///
/// Why 64: MCP and LLM API envelopes nest three or four levels, and tool
/// arguments (JSON Schema fragments, documents) rarely pass twenty; 64
/// leaves ample room. It is half of `serde_json`'s recursion limit (128),
/// so ours is always the rule that fires, with our message; and it bounds
/// every recursive walk the gateway does afterwards over a parsed value
/// (`strip_noise`, serialisation, drop) to 64 frames on any worker stack.
pub const MAX_DEPTH: usize = 64;

/// Why a body was refused. The messages name at most a key, clipped to 100
/// bytes: never a large part of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonError {
    /// Not JSON (or trailing data after it): `serde_json`'s message, which
    /// gives the position, never the input.
    Syntax(String),
    /// An object holds `key` twice.
    DuplicateKey {
        /// The key, clipped to 100 bytes.
        key: String,
        /// 1-based line of the second occurrence.
        line: usize,
        /// 1-based column of the second occurrence.
        column: usize,
    },
    /// Arrays and objects nested deeper than [`MAX_DEPTH`].
    TooDeep {
        /// 1-based line where the limit was crossed.
        line: usize,
        /// 1-based column where the limit was crossed.
        column: usize,
    },
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonError::Syntax(e) => write!(f, "{e}"),
            JsonError::DuplicateKey { key, line, column } => write!(
                f,
                "duplicate key `{key}` at line {line} column {column}: \
                 refused, since servers disagree on which one counts"
            ),
            JsonError::TooDeep { line, column } => write!(
                f,
                "JSON nested deeper than {MAX_DEPTH} levels at line {line} column {column}"
            ),
        }
    }
}

impl std::error::Error for JsonError {}

/// Parses `bytes` as one JSON document into a [`Value`], refusing duplicate
/// keys anywhere and nesting deeper than [`MAX_DEPTH`]. On every document
/// without either it returns exactly what `serde_json::from_slice` returns.
/// Linear in the input; never panics.
pub fn parse(bytes: &[u8]) -> Result<Value, JsonError> {
    let fault = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let seed = Seed {
        depth: 0,
        fault: &fault,
    };
    let result = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    result.map_err(|e| {
        let (line, column) = (e.line(), e.column());
        match fault.into_inner() {
            Some(Fault::Duplicate(key)) => JsonError::DuplicateKey { key, line, column },
            Some(Fault::TooDeep) => JsonError::TooDeep { line, column },
            None => JsonError::Syntax(e.to_string()),
        }
    })
}

/// Refuses `bytes` when arrays and objects nest deeper than [`MAX_DEPTH`],
/// by a byte scan that skips string contents (escaped quotes included).
/// For callers that parse with their own visitor: the scan's depth is never
/// below what a parser reaches, so a document it passes cannot take any
/// parser deeper. It judges nothing else (malformed JSON passes the scan).
pub fn check_depth(bytes: &[u8]) -> Result<(), String> {
    let mut depth = 0usize;
    let mut i = 0usize;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                // Skip to the closing quote; a backslash escapes the next byte.
                i += 1;
                loop {
                    let Some(rest) = bytes.get(i..) else {
                        return Ok(());
                    };
                    let Some(p) = memchr::memchr2(b'"', b'\\', rest) else {
                        return Ok(());
                    };
                    i += p;
                    if bytes.get(i) == Some(&b'\\') {
                        i += 2;
                    } else {
                        break;
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "JSON nested deeper than {MAX_DEPTH} levels (at byte {i})"
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// An upper bound of the bytes [`parse`] allocates at its peak for
/// `bytes` (the tree it builds and the parser's scratch), from one byte
/// scan that allocates nothing: what the gateway charges against its
/// memory before it builds the tree. A tree's cost per byte of body is
/// the body's shape's: `[0,0,...]` holds a 32-byte `Value` per 2 bytes,
/// `[{"a":0},...]` an object's first B-tree node (632 bytes) per 8, plain
/// text about its own size. `benches/tests/mcp_parse.rs` checks the bound
/// against what judging MCP bodies of the costliest shapes allocates.
///
/// Counted: each non-empty object, its first B-tree leaf
/// ([`COST_OF_OBJECT`]), and each member its share of the tree's nodes
/// ([`COST_PER_MEMBER`]); each non-empty array, its first block, and each
/// element its `Value` slot held three times while the array's buffer
/// doubles (old and new block at once: [`COST_PER_ELEMENT`]); each string
/// its bytes as written (never fewer than unescaped) and the allocator's
/// rounding ([`COST_PER_STRING`]); and the parser's scratch buffer for
/// an escaped string (one without escapes is copied straight from the
/// body), three times the longest escaped one (held twice while it
/// doubles, as much again as written). Nesting past 128 levels (which [`parse`] refuses) is counted
/// as objects, the costlier.
pub fn parse_cost(bytes: &[u8]) -> u64 {
    // Bit `d` set: the container at depth `d + 1` is an object.
    let (mut objects, mut depth) = (0u128, 0usize);
    // A container just opened whose first byte is not seen yet (object?).
    let mut opened: Option<bool> = None;
    let (mut cost, mut longest) = (size_of::<Value>() as u64, 0u64);
    let entry = |object: bool| match object {
        true => COST_PER_MEMBER,
        false => COST_PER_ELEMENT,
    };
    let mut i = 0usize;
    while let Some(&b) = bytes.get(i) {
        i += 1;
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        if let Some(object) = opened.take() {
            if !matches!(b, b']' | b'}') {
                cost += entry(object)
                    + if object {
                        COST_OF_OBJECT
                    } else {
                        COST_OF_ARRAY
                    };
            }
        }
        match b {
            b'"' => {
                let (start, mut escaped) = (i, false);
                loop {
                    let Some(p) = bytes.get(i..).and_then(|r| memchr::memchr2(b'"', b'\\', r))
                    else {
                        i = bytes.len();
                        break;
                    };
                    i += p;
                    if bytes.get(i) == Some(&b'\\') {
                        (i, escaped) = (i + 2, true);
                    } else {
                        break;
                    }
                }
                let len = i.min(bytes.len()).saturating_sub(start) as u64;
                cost += COST_PER_STRING + len;
                if escaped {
                    longest = longest.max(len);
                }
                i += 1;
            }
            b'[' | b'{' => {
                let object = b == b'{';
                if depth < 128 {
                    let bit = 1u128 << depth;
                    objects = if object {
                        objects | bit
                    } else {
                        objects & !bit
                    };
                }
                depth += 1;
                opened = Some(object);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' => {
                let object = depth > 128 || (depth > 0 && objects & (1u128 << (depth - 1)) != 0);
                cost += entry(object);
            }
            _ => {}
        }
    }
    cost + 3 * longest
}

/// [`parse_cost`]'s charge for a non-empty object: its first B-tree leaf
/// (`BTreeMap<String, Value>`: 11 keys of 24 bytes, 11 values of 32, a
/// parent pointer and lengths: 632 bytes).
pub const COST_OF_OBJECT: u64 = 640;
/// [`parse_cost`]'s charge for each member of an object: its share of the
/// B-tree, 56 bytes in a leaf at least five of eleven full, and the
/// internal nodes above (728 bytes, at least six children each).
pub const COST_PER_MEMBER: u64 = 160;
/// [`parse_cost`]'s charge for a non-empty array: its first block, room
/// for four values.
pub const COST_OF_ARRAY: u64 = 4 * 32;
/// [`parse_cost`]'s charge for each element of an array: its 32-byte
/// `Value` slot, held up to three times while the array's buffer doubles.
pub const COST_PER_ELEMENT: u64 = 3 * 32;
/// [`parse_cost`]'s charge for each string besides its bytes: the
/// allocator's rounding of a small block.
pub const COST_PER_STRING: u64 = 16;

/// What made the visitor fail, kept aside: `serde_json` only carries our
/// error as text, with its position.
enum Fault {
    Duplicate(String),
    TooDeep,
}

/// Builds a [`Value`] at `depth` (the arrays and objects around it).
#[derive(Clone, Copy)]
struct Seed<'f> {
    depth: usize,
    fault: &'f RefCell<Option<Fault>>,
}

impl<'f> Seed<'f> {
    /// The seed for the elements of an array or object opened here.
    fn enter<E: de::Error>(self) -> Result<Seed<'f>, E> {
        if self.depth >= MAX_DEPTH {
            *self.fault.borrow_mut() = Some(Fault::TooDeep);
            return Err(E::custom("too deep"));
        }
        Ok(Seed {
            depth: self.depth + 1,
            fault: self.fault,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // As serde_json's own Value visitor does.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        let mut obj = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match obj.entry(key) {
                Entry::Occupied(o) => {
                    let key = clip(o.key(), 100).to_string();
                    *self.fault.borrow_mut() = Some(Fault::Duplicate(key));
                    return Err(de::Error::custom("duplicate key"));
                }
                Entry::Vacant(v) => {
                    v.insert(map.next_value_seed(inner)?);
                }
            }
        }
        Ok(Value::Object(obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::time::{Duration, Instant};

    #[test]
    fn parse_cost_counts_what_a_tree_may_hold() {
        let base = size_of::<Value>() as u64;
        // Empty containers allocate nothing.
        assert_eq!(parse_cost(b"[]"), base);
        assert_eq!(parse_cost(b"{ }"), base);
        // Three elements: a first block and three slots.
        assert_eq!(
            parse_cost(b"[1, 2, 3]"),
            base + COST_OF_ARRAY + 3 * COST_PER_ELEMENT
        );
        // One member: a leaf, its share, the key.
        assert_eq!(
            parse_cost(br#"{"ab":1}"#),
            base + COST_OF_OBJECT + COST_PER_MEMBER + COST_PER_STRING + 2
        );
        // A comma inside a string is text; an escaped string is counted
        // for the parser's scratch too.
        assert_eq!(parse_cost(br#""a,b""#), base + COST_PER_STRING + 3);
        assert_eq!(parse_cost(br#""a\"b""#), base + COST_PER_STRING + 4 + 3 * 4);
        // Whatever the input, no panic (an unclosed string, stray closers).
        for bad in [&b"\"abc"[..], b"]]]}}", b"[\"\\", b"\\", b""] {
            assert!(parse_cost(bad) >= base);
        }
    }

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn parses_what_serde_json_parses() {
        let s = br#"{"a":[1,-2,3.5,1e300,"x\"y",null,true,{}],"b":{"c":18446744073709551615}}"#;
        assert_eq!(
            parse(s).unwrap(),
            serde_json::from_slice::<Value>(s).unwrap()
        );
        assert_eq!(parse(b" 7 ").unwrap(), json!(7));
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let cases: &[&[u8]] = &[
            br#"{"params":{"name":"delete_file","name":"read_file"}}"#,
            br#"{"method":"a","method":"b"}"#,
            br#"{"id":1,"jsonrpc":"2.0","id":2}"#,
            br#"[{"ok":1},{"params":{"arguments":{"x":[{"k":1,"k":2}]}}}]"#,
            br#"{"name":1,"n\u0061me":2}"#,
            br#"{"":1,"":2}"#,
        ];
        for c in cases {
            let e = parse(c).unwrap_err();
            assert!(
                matches!(e, JsonError::DuplicateKey { .. }),
                "{}: {e:?}",
                String::from_utf8_lossy(c)
            );
        }
        let e = parse(br#"{"params":{"name":"delete_file","name":"read_file"}}"#).unwrap_err();
        assert_eq!(
            e,
            JsonError::DuplicateKey {
                key: "name".into(),
                line: 1,
                column: 38
            }
        );
        assert!(e.to_string().contains("duplicate key `name`"), "{e}");
        // Equal values in different objects are fine.
        assert!(parse(br#"{"a":{"k":1},"b":{"k":1}}"#).is_ok());
    }

    #[test]
    fn a_long_duplicate_key_is_clipped_in_the_message() {
        let k = "k".repeat(10_000);
        let body = format!(r#"{{"{k}":1,"{k}":2}}"#);
        let e = parse(body.as_bytes()).unwrap_err();
        assert!(e.to_string().len() < 300, "{e}");
    }

    #[test]
    fn the_depth_rule_is_ours_and_exact() {
        assert!(parse(nested(MAX_DEPTH).as_bytes()).is_ok());
        assert!(check_depth(nested(MAX_DEPTH).as_bytes()).is_ok());
        let e = parse(nested(MAX_DEPTH + 1).as_bytes()).unwrap_err();
        assert!(matches!(e, JsonError::TooDeep { .. }), "{e:?}");
        assert!(e.to_string().contains("deeper than 64"), "{e}");
        assert!(check_depth(nested(MAX_DEPTH + 1).as_bytes()).is_err());
        let obj = format!("{}1{}", r#"{"a":"#.repeat(65), "}".repeat(65));
        assert!(matches!(
            parse(obj.as_bytes()),
            Err(JsonError::TooDeep { .. })
        ));
        assert!(check_depth(obj.as_bytes()).is_err());
    }

    #[test]
    fn a_very_deep_document_is_refused_quickly_without_overflow() {
        let t = Instant::now();
        let open = "[".repeat(100_000);
        assert!(matches!(
            parse(open.as_bytes()),
            Err(JsonError::TooDeep { .. })
        ));
        assert!(check_depth(open.as_bytes()).is_err());
        let mixed = "[{\"a\":".repeat(100_000);
        assert!(matches!(
            parse(mixed.as_bytes()),
            Err(JsonError::TooDeep { .. })
        ));
        assert!(check_depth(mixed.as_bytes()).is_err());
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn check_depth_skips_strings_and_escapes() {
        let brackets = "[".repeat(1000);
        assert!(check_depth(format!(r#"["{brackets}"]"#).as_bytes()).is_ok());
        assert!(check_depth(format!(r#"["\"{brackets}"]"#).as_bytes()).is_ok());
        assert!(check_depth(format!(r#"["\\\"{brackets}"]"#).as_bytes()).is_ok());
        // `\\` ends the escape: the quote after it closes the string.
        assert!(check_depth(format!(r#"["\\"{brackets}]"#).as_bytes()).is_err());
        // At the limit, with brackets and escaped quotes inside strings:
        // both rules pass it, one more level and both refuse.
        let at = |d: usize| format!("{}\"]]\\\"[[\"{}", "[".repeat(d), "]".repeat(d));
        assert!(check_depth(at(MAX_DEPTH).as_bytes()).is_ok());
        assert!(parse(at(MAX_DEPTH).as_bytes()).is_ok());
        assert!(check_depth(at(MAX_DEPTH + 1).as_bytes()).is_err());
        assert!(matches!(
            parse(at(MAX_DEPTH + 1).as_bytes()),
            Err(JsonError::TooDeep { .. })
        ));
        // Unterminated strings and lone backslashes end the scan safely.
        assert!(check_depth(b"[\"abc\\").is_ok());
        assert!(check_depth(b"\"").is_ok());
        assert!(check_depth(b"]]]]").is_ok());
    }

    #[test]
    fn syntax_errors_and_trailing_data_are_refused() {
        for c in [&b"{nope"[..], b"", b"[1,]", b"1 2", b"{\"a\":1}x", b"\xff"] {
            assert!(
                matches!(parse(c), Err(JsonError::Syntax(_))),
                "{}",
                String::from_utf8_lossy(c)
            );
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            (-1e300f64..1e300).prop_map(|f| json!(f)),
            "[a-z\"\\\\\u{e9}\u{1F600}\n]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(8, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-d]{0,3}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Documents without duplicate keys and within the depth rule parse
        /// exactly as serde_json parses them.
        #[test]
        fn agrees_with_serde_json(v in arb_json(), pretty in any::<bool>()) {
            let text = if pretty {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                serde_json::to_string(&v).unwrap()
            };
            let ours = parse(text.as_bytes());
            prop_assert_eq!(ours.ok(), serde_json::from_slice::<Value>(text.as_bytes()).ok());
            prop_assert!(check_depth(text.as_bytes()).is_ok());
        }

        /// On JSON-ish noise: never a panic; whatever we accept serde_json
        /// accepts identically; a syntax error is one for serde_json too.
        #[test]
        fn never_panics_and_never_accepts_more(s in "[\\[\\]{}\":,0-9a\\\\ eE.+-]{0,40}") {
            check_json_ish(s.as_bytes())?;
        }

        /// Deep bracket soup with strings and escapes: the same, and the
        /// scan agrees with the parser's depth rule.
        #[test]
        fn the_scan_and_the_parser_agree_on_depth(s in "(\\[|\\{\"a\":|\"\\\\\"\\[\"|1,|\\]|\\}){60,90}") {
            check_json_ish(s.as_bytes())?;
        }

        /// On arbitrary bytes: the same.
        #[test]
        fn never_panics_on_bytes(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            check_json_ish(&b)?;
        }
    }

    fn check_json_ish(b: &[u8]) -> Result<(), TestCaseError> {
        let theirs = serde_json::from_slice::<Value>(b);
        let scan = check_depth(b);
        let ours = parse(b);
        // The scan never passes what takes the parser too deep.
        if scan.is_ok() {
            let too_deep = matches!(ours, Err(JsonError::TooDeep { .. }));
            prop_assert!(!too_deep, "the scan passed what the parser found too deep");
        }
        match ours {
            Ok(v) => prop_assert_eq!(Some(v), theirs.ok()),
            Err(JsonError::Syntax(_)) => prop_assert!(theirs.is_err()),
            Err(_) => {}
        }
        Ok(())
    }
}
