//! Strict JSON: a `serde_json::Value` parsed with every object's keys
//! unique. serde_json keeps the last of two equal keys; another reader may
//! keep the first, so a body (or a tool call's `arguments`) with a key
//! given twice is refused rather than read one way.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// Parse `bytes` as one JSON value, refusing duplicate keys at any depth.
pub fn parse(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<Strict>(bytes).map(|s| s.0)
}

/// [`parse`] for a string (a tool call's `arguments`).
pub fn parse_str(s: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<Strict>(s).map(|s| s.0)
}

/// One JSON object, strictly, from a deserializer's map (a typed reader's
/// field that must be kept as a tree).
pub(crate) fn visit_map<'de, A: MapAccess<'de>>(map: A) -> Result<Value, A::Error> {
    StrictVisitor.visit_map(map).map(|s| s.0)
}

struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(Value::Number(v.into())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(Value::Number(v.into())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Strict, E> {
        Number::from_f64(v)
            .map(|n| Strict(Value::Number(n)))
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_none<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(Strict(e)) = seq.next_element()? {
            v.push(e);
        }
        Ok(Strict(Value::Array(v)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut m = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if m.contains_key(&k) {
                // The key is not named: it may be text from the request.
                return Err(de::Error::custom("a key given twice"));
            }
            let Strict(v) = map.next_value()?;
            m.insert(k, v);
        }
        Ok(Strict(Value::Object(m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert!(parse(br#"{"a":1,"a":2}"#).is_err());
        assert!(parse(br#"{"m":[{"x":{"b":1,"b":1}}]}"#).is_err());
        assert!(parse_str(r#"{"city":"Paris","city":"Rome"}"#).is_err());
        let v = parse(br#"{"a":[1,2.5,-3,"s",null,true,{"b":{}}]}"#).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a":[1,2.5,-3,"s",null,true,{"b":{}}]})
        );
    }

    #[test]
    fn the_message_names_no_key() {
        let e = parse(br#"{"secret text":1,"secret text":2}"#).unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
