//! Rewriting top-level fields of a JSON body that admission already
//! validated: the `model`, for routes that rename the model per target
//! ([`replace_model`]), and a field the gateway sets, such as the agent's
//! output limit as the target reads it ([`insert_field`], [`remove_field`],
//! [`apply_limit_edit`]), and an OpenAI-family stream's
//! `stream_options.include_usage` ([`with_stream_usage`]). Only the bytes of that one member change (or are
//! added or removed); everything else is copied as it was, so the provider
//! sees the agent's body byte for byte apart from the rewritten field.

use crate::output::LimitEdit;

/// The body with its top-level `"model"` value replaced by `model`, or
/// `None` if the body has no top-level `model` (or is not a JSON object).
pub fn replace_model(body: &[u8], model: &str) -> Option<Vec<u8>> {
    let (start, end) = top_level_value(body, "model")?;
    let new = serde_json::to_vec(model).ok()?;
    let mut out = Vec::with_capacity(body.len() - (end - start) + new.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(&new);
    out.extend_from_slice(&body[end..]);
    Some(out)
}

/// The body with top-level field `key` set to `value`: the value replaced
/// where the key is present (e.g. `"max_tokens": null`), else the field
/// inserted right after the opening `{` (`{"max_tokens":100,` + the rest).
/// `None` if the body is not a JSON object.
///
/// Meant for bodies [`crate::inspect_body`] accepted, which have no
/// duplicate judged keys: on such a body the result is valid JSON with
/// exactly one `key`. The key is written as a JSON string (escaped as
/// needed).
pub fn insert_field<T: serde::Serialize + ?Sized>(
    body: &[u8],
    key: &str,
    value: &T,
) -> Option<Vec<u8>> {
    let new = serde_json::to_vec(value).ok()?;
    if let Some((start, end)) = top_level_value(body, key) {
        let mut out = Vec::with_capacity(body.len() - (end - start) + new.len());
        out.extend_from_slice(&body[..start]);
        out.extend_from_slice(&new);
        out.extend_from_slice(&body[end..]);
        return Some(out);
    }
    let open = skip_ws(body, 0);
    if body.get(open) != Some(&b'{') {
        return None;
    }
    let empty = body.get(skip_ws(body, open + 1)) == Some(&b'}');
    let key = serde_json::to_vec(key).ok()?;
    let mut out = Vec::with_capacity(body.len() + key.len() + new.len() + 2);
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(&key);
    out.push(b':');
    out.extend_from_slice(&new);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(&body[open + 1..]);
    Some(out)
}

/// The body asking an OpenAI-family provider for its stream's usage:
/// `stream_options.include_usage` set to `true`, the agent's other stream
/// options kept. `None` when it asks already, or when its `stream_options`
/// is neither an object nor `null` (the provider judges that as sent), or
/// the body is not a JSON object.
pub fn with_stream_usage(body: &[u8]) -> Option<Vec<u8>> {
    let options = stream_usage_options(body)?;
    insert_field(body, "stream_options", &options)
}

/// Whether [`with_stream_usage`] would change the body: it does not ask
/// for its stream's usage, and can be made to.
pub fn lacks_stream_usage(body: &[u8]) -> bool {
    stream_usage_options(body).is_some()
}

/// The `stream_options` that ask for the usage, when the body's do not.
fn stream_usage_options(body: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    use serde_json::Value;
    if body.get(skip_ws(body, 0)) != Some(&b'{') {
        return None;
    }
    let mut options = match top_level_value(body, "stream_options") {
        None => serde_json::Map::new(),
        Some((start, end)) => match serde_json::from_slice(body.get(start..end)?).ok()? {
            Value::Null => serde_json::Map::new(),
            Value::Object(o) => o,
            _ => return None,
        },
    };
    if options.get("include_usage") == Some(&Value::Bool(true)) {
        return None;
    }
    options.insert("include_usage".into(), Value::Bool(true));
    Some(options)
}

/// The body without its top-level member `key` (and the comma that
/// separated it); the body unchanged where there is no such member. `None`
/// if the body is not a JSON object.
pub fn remove_field(body: &[u8], key: &str) -> Option<Vec<u8>> {
    let open = skip_ws(body, 0);
    if body.get(open) != Some(&b'{') {
        return None;
    }
    let Some((key_start, _, end)) = top_level_member(body, key) else {
        return Some(body.to_vec());
    };
    let after = skip_ws(body, end);
    let (from, to) = if body.get(after) == Some(&b',') {
        // `"k":v, "next"`: the member and its comma go.
        (key_start, skip_ws(body, after + 1))
    } else {
        // The last member: the comma before it goes, if any.
        let mut i = key_start;
        while i > open + 1 && body[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        match body.get(i.wrapping_sub(1)) {
            Some(b',') if i > open + 1 => (i - 1, end),
            _ => (key_start, end),
        }
    };
    let mut out = Vec::with_capacity(body.len() - (to - from));
    out.extend_from_slice(&body[..from]);
    out.extend_from_slice(&body[to..]);
    Some(out)
}

/// The body with an output-limit edit applied (see [`crate::output`]):
/// each field in `edit.remove` removed, then `edit.set` set. `None` if the
/// body is not a JSON object.
pub fn apply_limit_edit(body: &[u8], edit: &LimitEdit) -> Option<Vec<u8>> {
    let mut out = None::<Vec<u8>>;
    for f in edit.remove.iter() {
        out = Some(remove_field(out.as_deref().unwrap_or(body), f.name())?);
    }
    if let Some((f, v)) = edit.set {
        out = Some(insert_field(out.as_deref().unwrap_or(body), f.name(), &v)?);
    }
    Some(out.unwrap_or_else(|| body.to_vec()))
}

/// Byte span of the value of top-level key `key` in a JSON object.
fn top_level_value(b: &[u8], key: &str) -> Option<(usize, usize)> {
    top_level_member(b, key).map(|(_, start, end)| (start, end))
}

/// Where top-level member `key` of a JSON object starts (its key's opening
/// quote), and its value's byte span.
fn top_level_member(b: &[u8], key: &str) -> Option<(usize, usize, usize)> {
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(b, i);
        match b.get(i)? {
            b'}' => return None,
            b',' => {
                i += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let key_start = i;
        let key_end = string_end(b, i)?;
        let raw_key = &b[i..key_end];
        let is_key = if raw_key.contains(&b'\\') {
            serde_json::from_slice::<String>(raw_key).ok()? == key
        } else {
            &raw_key[1..raw_key.len() - 1] == key.as_bytes()
        };
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let value_end = value_end(b, i)?;
        if is_key {
            return Some((key_start, i, value_end));
        }
        i = value_end;
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// `b[i]` is `"`: the index just past the closing quote.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match b.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index just past the value starting at `b[i]`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while let Some(c) = b.get(j) {
                if matches!(c, b',' | b'}' | b']') || c.is_ascii_whitespace() {
                    break;
                }
                j += 1;
            }
            Some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_stream_is_made_to_ask_for_its_usage_keeping_its_other_options() {
        let ask = |b: &str| with_stream_usage(b.as_bytes()).map(|v| String::from_utf8(v).unwrap());
        assert_eq!(
            ask(r#"{"model":"m","stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_usage":true},"model":"m","stream":true}"#)
        );
        assert_eq!(
            ask(r#"{"stream_options":null,"stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_usage":true},"stream":true}"#)
        );
        assert_eq!(
            ask(r#"{"stream_options":{"include_usage":false,"x":1},"stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_usage":true,"x":1},"stream":true}"#)
        );
        // Asked already, or options the provider must judge as sent.
        for same in [
            r#"{"stream_options":{"include_usage":true}}"#,
            r#"{"stream_options":"yes"}"#,
            r#"[1]"#,
        ] {
            assert_eq!(ask(same), None, "{same}");
            assert!(!lacks_stream_usage(same.as_bytes()), "{same}");
        }
        // A key that only appears in the prompt is not the option.
        assert!(lacks_stream_usage(
            br#"{"messages":[{"content":"\"stream_options\":{\"include_usage\":true}"}]}"#
        ));
    }

    #[test]
    fn replaces_only_the_top_level_model() {
        let body = br#"{ "messages":[{"role":"user","content":"use \"model\": x","model":"inner"}],
            "metadata":{"model":"nested"}, "model" : "gpt-4o", "stream":true}"#;
        let out = replace_model(body, "llama3.1").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "llama3.1");
        assert_eq!(v["metadata"]["model"], "nested");
        assert_eq!(v["messages"][0]["model"], "inner");
        // Everything but the value is byte for byte the same.
        let s = String::from_utf8(out).unwrap();
        assert_eq!(
            s.replace("\"llama3.1\"", "\"gpt-4o\""),
            std::str::from_utf8(body).unwrap()
        );
    }

    #[test]
    fn escaped_keys_and_awkward_values() {
        let out =
            replace_model(br#"{"a":[1,{"b":"}"}],"mod\u0065l":"x","z":null}"#, "q\"y").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "q\"y");
        assert_eq!(v["a"][1]["b"], "}");
        assert!(replace_model(br#"{"models":"x"}"#, "y").is_none());
        assert!(replace_model(b"[1]", "y").is_none());
        assert!(replace_model(b"", "y").is_none());
    }

    #[test]
    fn inserts_a_field_after_the_opening_brace() {
        let body = br#" {"model":"m","messages":[{"max_tokens":1}]}"#;
        let out = insert_field(body, "max_tokens", &100u64).unwrap();
        assert_eq!(
            out,
            br#" {"max_tokens":100,"model":"m","messages":[{"max_tokens":1}]}"#
        );
        assert_eq!(insert_field(b"{ }", "n", &1).unwrap(), br#"{"n":1 }"#);
        assert_eq!(insert_field(b"{}", "a\"b", &1).unwrap(), br#"{"a\"b":1}"#);
        // A key already there (null, as inspection lets through) is replaced.
        let out = insert_field(
            br#"{"model":"m","max_tokens" : null,"x":1}"#,
            "max_tokens",
            &7,
        );
        assert_eq!(out.unwrap(), br#"{"model":"m","max_tokens" : 7,"x":1}"#);
        assert!(insert_field(b"[1]", "n", &1).is_none());
        assert!(insert_field(b"", "n", &1).is_none());
        assert!(insert_field(b"  ", "n", &1).is_none());
    }

    #[test]
    fn removes_a_member_and_its_comma() {
        let cases: [(&str, &str); 6] = [
            (r#"{"max_tokens":1,"model":"m"}"#, r#"{"model":"m"}"#),
            (
                r#"{"model":"m", "max_tokens" : null }"#,
                r#"{"model":"m" }"#,
            ),
            (
                r#"{"model":"m","max_tokens":1,"x":2}"#,
                r#"{"model":"m","x":2}"#,
            ),
            (r#" { "max_tokens" : [1] } "#, r#" {  } "#),
            (
                r#"{"model":"m","x":{"max_tokens":1}}"#,
                r#"{"model":"m","x":{"max_tokens":1}}"#,
            ),
            (r#"{"max_tokens":1,"a":2}"#, r#"{"a":2}"#),
        ];
        for (body, want) in cases {
            let out = remove_field(body.as_bytes(), "max_tokens").unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), want, "{body}");
        }
        assert!(remove_field(b"[1]", "max_tokens").is_none());
    }

    #[test]
    fn a_limit_edit_renames_and_sets() {
        use crate::output::{LimitEdit, LimitField::*};
        let body = br#"{"model":"o3-mini","max_tokens":300,"messages":[]}"#;
        let edit = LimitEdit {
            remove: [MaxTokens].into_iter().collect(),
            set: Some((MaxCompletionTokens, 300)),
        };
        assert_eq!(
            apply_limit_edit(body, &edit).unwrap(),
            br#"{"max_completion_tokens":300,"model":"o3-mini","messages":[]}"#
        );
        let only_remove = LimitEdit { set: None, ..edit };
        assert_eq!(
            apply_limit_edit(body, &only_remove).unwrap(),
            br#"{"model":"o3-mini","messages":[]}"#
        );
    }

    proptest::proptest! {
        #[test]
        fn removed_fields_leave_valid_json_without_them(
            key in "[a-z]{1,3}",
            fields in proptest::collection::btree_map("[a-z]{1,3}", 0u32..9, 0..6),
            pad in "[ \n\t]{0,3}",
        ) {
            let body = serde_json::to_string(&fields).unwrap()
                .replace(',', &format!("{pad},{pad}"))
                .replace(':', &format!("{pad}:{pad}"));
            let body = format!("{pad}{body}{pad}");
            let out = remove_field(body.as_bytes(), &key).unwrap();
            let v: Value = serde_json::from_slice(&out).unwrap();
            let mut want = fields.clone();
            want.remove(&key);
            proptest::prop_assert_eq!(v, serde_json::to_value(&want).unwrap());
        }

        #[test]
        fn remove_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = remove_field(&body, "max_tokens");
        }

        #[test]
        fn inserted_fields_are_valid_json_with_one_copy(
            key in "[a-z_\"\\\\]{1,12}",
            value in 0u64..u64::MAX,
            fields in proptest::collection::btree_map("[a-z]{1,6}", 0u32..9, 0..5),
            pad in "[ \n\t]{0,3}",
        ) {
            let body = serde_json::to_string(&fields).unwrap().replace(',', &format!(",{pad}"));
            let body = format!("{pad}{body}{pad}");
            let out = insert_field(body.as_bytes(), &key, &value).unwrap();
            let v: Value = serde_json::from_slice(&out).unwrap();
            proptest::prop_assert_eq!(&v[key.as_str()], &Value::from(value));
            // Nothing else changed: one more key, or the same keys.
            let expected = fields.len() + usize::from(!fields.contains_key(&key));
            proptest::prop_assert_eq!(v.as_object().map(|o| o.len()), Some(expected));
        }

        #[test]
        fn insert_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = insert_field(&body, "max_tokens", &1u64);
        }

        #[test]
        fn output_is_valid_json_with_the_new_model(
            model in "[a-zA-Z0-9 ._\"\\\\-]{0,20}",
            pad in "[ \n\t]{0,3}",
            extra in "[a-z]{1,8}",
        ) {
            let body = format!(r#"{{{pad}"{extra}":{{"model":[1,"]"]}},{pad}"model"{pad}:{pad}"old"{pad},"x":[{pad}]}}"#);
            let out = replace_model(body.as_bytes(), &model).unwrap();
            let v: Value = serde_json::from_slice(&out).unwrap();
            proptest::prop_assert_eq!(v["model"].as_str().unwrap(), model.as_str());
        }

        #[test]
        fn never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = replace_model(&body, "m");
        }
    }
}
