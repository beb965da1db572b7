//! A JSON document as the tokens a reader meets, in order, for consumers
//! that need all of a body but not a tree of it: the loop guard's
//! fingerprint reads a model call's body from the one pass that judges it
//! ([`crate::body::inspect_body_with`]) instead of parsing it again into a
//! `serde_json::Value`, whose nodes cost tens of bytes each (a body of
//! small nested objects grew ~100 times its size).

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// One token of a JSON document. Strings and keys are unescaped; numbers
/// are as `serde_json` reads them (non-negative integers as `U64`,
/// negative ones as `I64`, the rest as `F64`), as a `serde_json::Value`
/// would hold them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Token<'a> {
    ObjectStart,
    /// An object's key; its value's tokens follow.
    Key(&'a str),
    ObjectEnd,
    ArrayStart,
    ArrayEnd,
    Str(&'a str),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Null,
}

/// Takes a document's tokens, in order.
pub trait TokenSink {
    fn token(&mut self, t: Token<'_>);
}

/// Hands every token of `v` to `sink`, as reading its JSON would.
pub fn replay(v: &serde_json::Value, sink: &mut dyn TokenSink) {
    use serde_json::Value;
    match v {
        Value::Null => sink.token(Token::Null),
        Value::Bool(b) => sink.token(Token::Bool(*b)),
        Value::Number(n) => sink.token(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Token::U64(u),
            (None, Some(i)) => Token::I64(i),
            _ => Token::F64(n.as_f64().unwrap_or(0.0)),
        }),
        Value::String(s) => sink.token(Token::Str(s)),
        Value::Array(a) => {
            sink.token(Token::ArrayStart);
            for v in a {
                replay(v, sink);
            }
            sink.token(Token::ArrayEnd);
        }
        Value::Object(m) => {
            sink.token(Token::ObjectStart);
            for (k, v) in m {
                sink.token(Token::Key(k));
                replay(v, sink);
            }
            sink.token(Token::ObjectEnd);
        }
    }
}

/// Reads `bytes` as one JSON value (nothing after it but whitespace),
/// handing every token to `sink`; containers nested deeper than
/// [`crate::json::MAX_DEPTH`] are refused.
pub fn read(bytes: &[u8], sink: &mut dyn TokenSink) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Tokens { sink, depth: 0 }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| e.to_string())
}

struct Tokens<'a> {
    sink: &'a mut dyn TokenSink,
    depth: usize,
}

impl Tokens<'_> {
    fn enter<E: de::Error>(&mut self) -> Result<Tokens<'_>, E> {
        if self.depth >= crate::json::MAX_DEPTH {
            return Err(E::custom(format!(
                "nested deeper than {} levels",
                crate::json::MAX_DEPTH
            )));
        }
        Ok(Tokens {
            sink: &mut *self.sink,
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Tokens<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Tokens<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.sink.token(Token::Str(s));
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<(), E> {
        self.sink.token(Token::Bool(b));
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<(), E> {
        self.sink.token(Token::I64(n));
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<(), E> {
        self.sink.token(Token::U64(n));
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<(), E> {
        self.sink.token(Token::F64(n));
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.sink.token(Token::Null);
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut inner = self.enter()?;
        inner.sink.token(Token::ArrayStart);
        while seq.next_element_seed(inner.enter_same())?.is_some() {}
        inner.sink.token(Token::ArrayEnd);
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let mut inner = self.enter()?;
        inner.sink.token(Token::ObjectStart);
        while map.next_key_seed(KeyToken(&mut *inner.sink))?.is_some() {
            map.next_value_seed(inner.enter_same())?;
        }
        inner.sink.token(Token::ObjectEnd);
        Ok(())
    }
}

impl Tokens<'_> {
    /// A reader of this container's items, at its depth.
    fn enter_same(&mut self) -> Tokens<'_> {
        Tokens {
            sink: &mut *self.sink,
            depth: self.depth,
        }
    }
}

struct KeyToken<'a>(&'a mut dyn TokenSink);

impl<'de> DeserializeSeed<'de> for KeyToken<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyToken<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.0.token(Token::Key(s));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Vec<String>);

    impl TokenSink for Collect {
        fn token(&mut self, t: Token<'_>) {
            self.0.push(format!("{t:?}"));
        }
    }

    #[test]
    fn reading_and_replaying_give_the_same_tokens() {
        let text = r#"{"b":[1,-2,3.5,"x\u0041",true,null,{}],"a":{"k":[]}}"#;
        let mut read_tokens = Collect::default();
        read(text.as_bytes(), &mut read_tokens).unwrap();
        assert_eq!(
            read_tokens.0[..4],
            ["ObjectStart", "Key(\"b\")", "ArrayStart", "U64(1)"]
        );
        assert!(read_tokens.0.contains(&"Str(\"xA\")".to_string()));
        let mut replayed = Collect::default();
        // Keys in the order the document has them (a Value sorts them).
        let v: serde_json::Value = serde_json::from_str(r#"{"a":{"k":[]}}"#).unwrap();
        replay(&v, &mut replayed);
        let mut again = Collect::default();
        read(br#"{"a":{"k":[]}}"#, &mut again).unwrap();
        assert_eq!(replayed.0, again.0);
        assert!(read(b"[1] 2", &mut Collect::default()).is_err());
        let deep = "[".repeat(65) + &"]".repeat(65);
        assert!(read(deep.as_bytes(), &mut Collect::default()).is_err());
        let ok = "[".repeat(64) + &"]".repeat(64);
        assert!(read(ok.as_bytes(), &mut Collect::default()).is_ok());
    }
}
