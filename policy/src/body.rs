//! Body inspection: the few facts admission needs from a JSON request body.
//!
//! The body is walked once with serde and nothing but the fields we judge is
//! kept: `messages` is checked to be an array and counted, never copied, so a
//! multi-megabyte context costs one pass and no tree allocation. A field we
//! judge that appears twice at the top level is refused: a provider might
//! read the other copy than the gateway did.

use crate::decision::{Deny, DenyCode};
use crate::endpoint::Endpoint;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// What admission learned from a body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BodyFacts {
    pub model: String,
    /// `"stream": true` was requested.
    pub stream: bool,
    /// Number of entries in `messages`, when present.
    pub messages: Option<usize>,
}

/// Checks the body of `endpoint` and extracts its facts.
pub fn inspect_body(endpoint: Endpoint, body: &[u8]) -> Result<BodyFacts, Deny> {
    let raw: RawFacts = {
        let mut de = serde_json::Deserializer::from_slice(body);
        let raw = de.deserialize_map_facts().map_err(|e| {
            if e.is_data() && e.to_string().starts_with(DUPLICATE) {
                Deny::new(DenyCode::InvalidJson, e.to_string())
            } else if e.is_data() && e.to_string().starts_with(NOT_OBJECT) {
                Deny::new(DenyCode::InvalidJson, "request body must be a JSON object")
            } else {
                Deny::new(
                    DenyCode::InvalidJson,
                    format!("request body is not valid JSON: {e}"),
                )
            }
        })?;
        de.end().map_err(|e| {
            Deny::new(
                DenyCode::InvalidJson,
                format!("request body is not valid JSON: {e}"),
            )
        })?;
        raw
    };
    let model = match raw.model {
        None => {
            return Err(Deny::new(
                DenyCode::MissingModel,
                "request body must contain a string field `model`",
            ))
        }
        Some(Kind::Str(s)) if !s.is_empty() => s,
        Some(Kind::Str(_)) => {
            return Err(Deny::new(
                DenyCode::MissingModel,
                "`model` must not be empty",
            ))
        }
        Some(other) => {
            return Err(Deny::new(
                DenyCode::MissingModel,
                format!("`model` must be a string, got {}", other.name()),
            ))
        }
    };
    let messages = match raw.messages {
        None if endpoint.needs_messages() => {
            return Err(Deny::new(
                DenyCode::InvalidMessages,
                "request body must contain a `messages` array",
            ))
        }
        None => None,
        Some(Kind::Array(n)) => Some(n),
        Some(other) if endpoint.needs_messages() => {
            return Err(Deny::new(
                DenyCode::InvalidMessages,
                format!("`messages` must be an array, got {}", other.name()),
            ))
        }
        Some(_) => None,
    };
    let stream = matches!(raw.stream, Some(Kind::Bool(true)));
    Ok(BodyFacts {
        model,
        stream,
        messages,
    })
}

const DUPLICATE: &str = "duplicate field";
const NOT_OBJECT: &str = "not an object";

#[derive(Default)]
struct RawFacts {
    model: Option<Kind>,
    messages: Option<Kind>,
    stream: Option<Kind>,
}

trait DeserializeFacts {
    fn deserialize_map_facts(&mut self) -> Result<RawFacts, serde_json::Error>;
}

impl<'de, R: serde_json::de::Read<'de>> DeserializeFacts for serde_json::Deserializer<R> {
    fn deserialize_map_facts(&mut self) -> Result<RawFacts, serde_json::Error> {
        de::Deserializer::deserialize_any(self, FactsVisitor)
    }
}

struct FactsVisitor;

impl<'de> Visitor<'de> for FactsVisitor {
    type Value = RawFacts;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFacts, A::Error> {
        let mut facts = RawFacts::default();
        while let Some(key) = map.next_key::<KeyName>()? {
            let slot = match key {
                KeyName::Model => &mut facts.model,
                KeyName::Messages => &mut facts.messages,
                KeyName::Stream => &mut facts.stream,
                KeyName::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(de::Error::custom(format!(
                    "{DUPLICATE} `{}` in request body",
                    key.name()
                )));
            }
            *slot = Some(map.next_value_seed(KindSeed)?);
        }
        Ok(facts)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawFacts, A::Error> {
        Err(de::Error::custom(NOT_OBJECT))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<RawFacts, E> {
        Err(E::custom(NOT_OBJECT))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<RawFacts, E> {
        Err(E::custom(NOT_OBJECT))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<RawFacts, E> {
        Err(E::custom(NOT_OBJECT))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<RawFacts, E> {
        Err(E::custom(NOT_OBJECT))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<RawFacts, E> {
        Err(E::custom(NOT_OBJECT))
    }
    fn visit_unit<E: de::Error>(self) -> Result<RawFacts, E> {
        Err(E::custom(NOT_OBJECT))
    }
}

enum KeyName {
    Model,
    Messages,
    Stream,
    Other,
}

impl KeyName {
    fn name(&self) -> &'static str {
        match self {
            KeyName::Model => "model",
            KeyName::Messages => "messages",
            KeyName::Stream => "stream",
            KeyName::Other => "?",
        }
    }
}

impl<'de> de::Deserialize<'de> for KeyName {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<KeyName, E> {
                Ok(match s {
                    "model" => KeyName::Model,
                    "messages" => KeyName::Messages,
                    "stream" => KeyName::Stream,
                    _ => KeyName::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// The shape of a judged value; strings are kept, containers only counted.
enum Kind {
    Str(String),
    Bool(bool),
    Number,
    Null,
    Array(usize),
    Object,
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Str(_) => "a string",
            Kind::Bool(_) => "a boolean",
            Kind::Number => "a number",
            Kind::Null => "null",
            Kind::Array(_) => "an array",
            Kind::Object => "an object",
        }
    }
}

struct KindSeed;

impl<'de> DeserializeSeed<'de> for KindSeed {
    type Value = Kind;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Kind, D::Error> {
        d.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Kind, E> {
        Ok(Kind::Str(s.to_string()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Kind, E> {
        Ok(Kind::Str(s))
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Kind, E> {
        Ok(Kind::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Kind, E> {
        Ok(Kind::Number)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Kind, E> {
        Ok(Kind::Number)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Kind, E> {
        Ok(Kind::Number)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        let mut n = 0;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
        }
        Ok(Kind::Array(n))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Kind::Object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<BodyFacts, Deny> {
        inspect_body(Endpoint::ChatCompletions, body.as_bytes())
    }

    #[test]
    fn extracts_facts() {
        let f = chat(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"},{}],"stream":true,"x":{"y":[1,2]}}"#).unwrap();
        assert_eq!(f.model, "gpt-4o");
        assert!(f.stream);
        assert_eq!(f.messages, Some(2));
        let f = inspect_body(Endpoint::Embeddings, br#"{"model":"e","input":"x"}"#).unwrap();
        assert_eq!(f.messages, None);
        assert!(!f.stream);
    }

    #[test]
    fn escaped_model_names_are_decoded() {
        let f = chat(r#"{"model":"gpt\u002d4o","messages":[]}"#).unwrap();
        assert_eq!(f.model, "gpt-4o");
    }

    #[test]
    fn malformed_bodies_are_refused_with_codes() {
        let cases = [
            ("", DenyCode::InvalidJson),
            ("{", DenyCode::InvalidJson),
            ("{} x", DenyCode::InvalidJson),
            ("[1]", DenyCode::InvalidJson),
            ("\"s\"", DenyCode::InvalidJson),
            ("null", DenyCode::InvalidJson),
            (r#"{"messages":[]}"#, DenyCode::MissingModel),
            (r#"{"model":3,"messages":[]}"#, DenyCode::MissingModel),
            (r#"{"model":"","messages":[]}"#, DenyCode::MissingModel),
            (r#"{"model":"m"}"#, DenyCode::InvalidMessages),
            (
                r#"{"model":"m","messages":"hi"}"#,
                DenyCode::InvalidMessages,
            ),
            (r#"{"model":"m","messages":{}}"#, DenyCode::InvalidMessages),
            (
                r#"{"model":"a","model":"b","messages":[]}"#,
                DenyCode::InvalidJson,
            ),
        ];
        for (body, code) in cases {
            assert_eq!(chat(body).unwrap_err().code, code, "{body}");
        }
    }

    #[test]
    fn duplicate_model_is_named() {
        let d = chat(r#"{"model":"a","messages":[],"model":"b"}"#).unwrap_err();
        assert!(
            d.message.contains("duplicate field `model`"),
            "{}",
            d.message
        );
    }

    #[test]
    fn large_bodies_are_counted_not_copied() {
        let msg = format!(r#"{{"role":"user","content":"{}"}}"#, "a".repeat(1000));
        let body = format!(
            r#"{{"model":"m","messages":[{}]}}"#,
            vec![msg; 3000].join(",")
        );
        assert_eq!(chat(&body).unwrap().messages, Some(3000));
    }

    #[test]
    fn no_panic_on_arbitrary_bytes() {
        for body in [
            &b"\xff\xfe"[..],
            b"{\"model\":\"\xff\"}",
            b"\0",
            b"{\"a\":1e999999}",
        ] {
            let _ = inspect_body(Endpoint::Messages, body);
        }
    }
}
