//! A provider's stream events, read into typed structs that borrow from
//! the event's bytes (no `serde_json::Value` tree per event: a text delta
//! costs no allocation unless its text holds an escape).
//!
//! Every field is a [`Field`], read the way `Value::get` and `as_str` /
//! `as_u64` read a tree: any JSON value is accepted where the field is,
//! and one of another shape reads as [`Field::Other`] (the translator then
//! decides, as it did on the tree, whether that is malformed). So a field
//! of an unexpected type never fails the parse by itself; malformed JSON,
//! a non-object event and a key given twice among the fields read do.
//! Fields the translator does not read are skipped unread (they reach
//! neither the agent nor any other reader, so a key given twice among
//! them cannot be read two ways).

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize as Derive;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// One field of an event.
#[derive(Debug, Default)]
pub(crate) enum Field<T> {
    /// Not in the object.
    #[default]
    Absent,
    Null,
    /// Of the shape expected.
    Is(T),
    /// Any other value.
    Other,
}

impl<T> Field<T> {
    /// The value, when of the shape expected (`get` + `as_*`).
    pub fn get(&self) -> Option<&T> {
        match self {
            Field::Is(t) => Some(t),
            _ => None,
        }
    }

    /// In the object, null or not (`get(..).is_some()`).
    pub fn present(&self) -> bool {
        !matches!(self, Field::Absent)
    }

    /// In the object and not null.
    pub fn given(&self) -> bool {
        matches!(self, Field::Is(_) | Field::Other)
    }
}

impl Field<Cow<'_, str>> {
    pub fn str(&self) -> Option<&str> {
        self.get().map(|s| &**s)
    }
}

impl Field<u64> {
    pub fn u64(&self) -> Option<u64> {
        self.get().copied()
    }
}

/// What a [`Field`] expects: each reader says which JSON values have its
/// shape; the others are skipped.
pub(crate) trait Shape<'de>: Sized {
    fn borrowed_str(_s: &'de str) -> Option<Self> {
        None
    }
    /// A string that had to be unescaped.
    fn transient_str(_s: &str) -> Option<Self> {
        None
    }
    fn u64(_n: u64) -> Option<Self> {
        None
    }
    fn map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

impl<'de: 'a, 'a> Shape<'de> for Cow<'a, str> {
    fn borrowed_str(s: &'de str) -> Option<Self> {
        Some(Cow::Borrowed(s))
    }
    fn transient_str(s: &str) -> Option<Self> {
        Some(Cow::Owned(s.to_owned()))
    }
}

impl Shape<'_> for u64 {
    fn u64(n: u64) -> Option<Self> {
        Some(n)
    }
}

/// An array's elements: the first kept inline (a stream's chunk has one
/// choice, and usually one tool call), the rest in a list.
#[derive(Debug)]
pub(crate) struct Few<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Few<T> {
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(self.rest.iter())
    }
}

impl<'de, T: Deserialize<'de>> Shape<'de> for Few<T> {
    fn seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut few = Few {
            first: None,
            rest: Vec::new(),
        };
        while let Some(e) = seq.next_element()? {
            match few.first {
                None => few.first = Some(e),
                Some(_) => few.rest.push(e),
            }
        }
        Ok(Some(few))
    }
}

/// An object read into a derived struct.
macro_rules! object {
    ($($ty:ident $(<$a:lifetime>)?),* $(,)?) => {$(
        impl<'de $(: $a, $a)?> Shape<'de> for $ty $(<$a>)? {
            fn map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
                Self::deserialize(MapAccessDeserializer::new(map)).map(Some)
            }
        }
    )*};
}

impl<'de, T: Shape<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FieldVisitor(PhantomData))
    }
}

struct FieldVisitor<T>(PhantomData<T>);

fn shaped<T, E>(v: Option<T>) -> Result<Field<T>, E> {
    Ok(v.map_or(Field::Other, Field::Is))
}

impl<'de, T: Shape<'de>> Visitor<'de> for FieldVisitor<T> {
    type Value = Field<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Field<T>, E> {
        Ok(Field::Other)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Field<T>, E> {
        Ok(Field::Other)
    }
    fn visit_u64<E>(self, n: u64) -> Result<Field<T>, E> {
        shaped(T::u64(n))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Field<T>, E> {
        Ok(Field::Other)
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Field<T>, E> {
        shaped(T::borrowed_str(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Field<T>, E> {
        shaped(T::transient_str(s))
    }
    fn visit_unit<E>(self) -> Result<Field<T>, E> {
        Ok(Field::Null)
    }
    fn visit_none<E>(self) -> Result<Field<T>, E> {
        Ok(Field::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Field<T>, A::Error> {
        T::seq(seq).and_then(shaped)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Field<T>, A::Error> {
        T::map(map).and_then(shaped)
    }
}

/// An event's data: one JSON object (anything else is malformed).
pub(crate) fn parse<'a, T: Deserialize<'a>>(data: &'a [u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice::<Object<T>>(data).map(|o| o.0)
}

struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Object)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

// ----- OpenAI chunks ------------------------------------------------------

/// A `chat.completion.chunk` (or an error in its place).
#[derive(Debug, Derive)]
pub(crate) struct Chunk<'a> {
    #[serde(default, borrow)]
    pub id: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub model: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub error: Field<ErrorBody<'a>>,
    #[serde(default)]
    pub usage: Field<OpenAiUsage>,
    #[serde(default, borrow)]
    pub choices: Field<Few<Field<Choice<'a>>>>,
}

#[derive(Debug, Derive)]
pub(crate) struct Choice<'a> {
    #[serde(default)]
    pub index: Field<u64>,
    #[serde(default, borrow)]
    pub delta: Field<Delta<'a>>,
    #[serde(default, borrow)]
    pub finish_reason: Field<Cow<'a, str>>,
}

#[derive(Debug, Derive)]
pub(crate) struct Delta<'a> {
    #[serde(default, borrow)]
    pub content: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub refusal: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub tool_calls: Field<Few<Field<ToolCall<'a>>>>,
}

#[derive(Debug, Derive)]
pub(crate) struct ToolCall<'a> {
    #[serde(default)]
    pub index: Field<u64>,
    #[serde(default, borrow)]
    pub id: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub function: Field<Function<'a>>,
}

#[derive(Debug, Derive)]
pub(crate) struct Function<'a> {
    #[serde(default, borrow)]
    pub name: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub arguments: Field<Cow<'a, str>>,
}

#[derive(Debug, Derive)]
pub(crate) struct OpenAiUsage {
    #[serde(default)]
    pub prompt_tokens: Field<u64>,
    #[serde(default)]
    pub completion_tokens: Field<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Field<PromptDetails>,
}

#[derive(Debug, Derive)]
pub(crate) struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Field<u64>,
}

/// An error object, of either family.
#[derive(Debug, Derive)]
pub(crate) struct ErrorBody<'a> {
    #[serde(default, borrow)]
    pub message: Field<Cow<'a, str>>,
    #[serde(default, borrow, rename = "type")]
    pub ty: Field<Cow<'a, str>>,
}

// ----- Anthropic events ---------------------------------------------------

/// Any Messages stream event: the fields of every type, each read only
/// by the type that has it.
#[derive(Debug, Derive)]
pub(crate) struct Event<'a> {
    #[serde(default, borrow, rename = "type")]
    pub ty: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub message: Field<Message<'a>>,
    #[serde(default)]
    pub index: Field<u64>,
    #[serde(default, borrow)]
    pub content_block: Field<ContentBlock<'a>>,
    #[serde(default, borrow)]
    pub delta: Field<EventDelta<'a>>,
    #[serde(default)]
    pub usage: Field<AnthropicUsage>,
    #[serde(default, borrow)]
    pub error: Field<ErrorBody<'a>>,
}

#[derive(Debug, Derive)]
pub(crate) struct Message<'a> {
    #[serde(default, borrow)]
    pub id: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub model: Field<Cow<'a, str>>,
    #[serde(default)]
    pub usage: Field<AnthropicUsage>,
}

#[derive(Debug, Derive)]
pub(crate) struct ContentBlock<'a> {
    #[serde(default, borrow, rename = "type")]
    pub ty: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub text: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub id: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub name: Field<Cow<'a, str>>,
    #[serde(default)]
    pub input: Field<Input>,
}

/// A `content_block_delta`'s or a `message_delta`'s `delta`.
#[derive(Debug, Derive)]
pub(crate) struct EventDelta<'a> {
    #[serde(default, borrow, rename = "type")]
    pub ty: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub text: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub partial_json: Field<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub stop_reason: Field<Cow<'a, str>>,
}

#[derive(Debug, Derive)]
pub(crate) struct AnthropicUsage {
    #[serde(default)]
    pub input_tokens: Field<u64>,
    #[serde(default)]
    pub output_tokens: Field<u64>,
    #[serde(default)]
    pub cache_read_input_tokens: Field<u64>,
    #[serde(default)]
    pub cache_creation_input_tokens: Field<u64>,
}

/// A `tool_use` block's `input`: normally `{}` (its arguments streamed),
/// rarely given whole, then read strictly (a key given twice refused) to
/// be written out again.
#[derive(Debug)]
pub(crate) enum Input {
    Empty,
    Whole(Value),
}

impl<'de> Shape<'de> for Input {
    fn map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        match crate::strict::visit_map(map)? {
            Value::Object(m) if m.is_empty() => Ok(Some(Input::Empty)),
            v => Ok(Some(Input::Whole(v))),
        }
    }
}

object!(
    Choice<'a>,
    Delta<'a>,
    ToolCall<'a>,
    Function<'a>,
    OpenAiUsage,
    PromptDetails,
    ErrorBody<'a>,
    Message<'a>,
    ContentBlock<'a>,
    EventDelta<'a>,
    AnthropicUsage,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_as_the_tree_read_them() {
        let c: Chunk = parse(br#"{"id":"a\"b","model":5,"choices":[{"index":0},7]}"#).unwrap();
        assert_eq!(c.id.str(), Some("a\"b"));
        assert!(matches!(c.model, Field::Other));
        assert!(!c.usage.present());
        let choices: Vec<_> = c.choices.get().unwrap().iter().collect();
        assert_eq!(choices.len(), 2);
        assert_eq!(choices[0].get().unwrap().index.u64(), Some(0));
        assert!(matches!(choices[1], Field::Other));
        // Unescaped strings are borrowed.
        let c: Chunk = parse(br#"{"id":"plain","error":null}"#).unwrap();
        assert!(matches!(c.id, Field::Is(Cow::Borrowed("plain"))));
        assert!(c.error.present() && !c.error.given());
        // Not an object, a known key twice, bad JSON: refused.
        assert!(parse::<Chunk>(br#"["a"]"#).is_err());
        assert!(parse::<Chunk>(br#"{"id":"a","id":"b"}"#).is_err());
        assert!(parse::<Chunk>(br#"{"choices":[{"index":0,"index":1}]}"#).is_err());
        assert!(parse::<Chunk>(br#"{"id":"a"} x"#).is_err());
        let e: Event = parse(br#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","input":{"b":1,"a":2}}}"#).unwrap();
        let b = e.content_block.get().unwrap();
        assert!(matches!(b.input.get(), Some(Input::Whole(_))));
        assert!(parse::<Event>(br#"{"content_block":{"input":{"k":1,"k":2}}}"#).is_err());
    }
}
