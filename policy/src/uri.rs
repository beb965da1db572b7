//! MCP resource URIs: one parser that refuses what could be read two ways,
//! and the grant rule over what it returns (path segments, never string
//! prefixes).
//!
//! Why this file exists: resource grants used to be string prefixes, so
//! `file:///public/*` admitted `file:///public/../secret/k`, its encoded
//! forms (`%2e%2e`, `..%2f`), and `file:///public-x/a`. A server resolves
//! such a URI to somewhere the grant never named. Rather than guess how a
//! server normalises, [`ResourceUri::parse`] refuses every ambiguous form
//! (dot segments, encoded `/` or `\`, backslashes, empty segments, control
//! bytes, malformed or double escapes, non-UTF-8, a missing scheme, and
//! characters whose compatibility form is one of those: `．．` (U+FF0E),
//! `‥` (U+2025), `／` (U+FF0F), `∕` (U+2215), which a server that applies
//! NFKC or Windows' best-fit conversion reads as `..` or `/`) and
//! returns the rest in one canonical form: scheme and host lowercased, the
//! path percent-decoded exactly once and split into segments.
//!
//! [`ResourcePattern`] is a grant entry over that form: exact (canonical on
//! both sides), `scheme:*` or `scheme://*` (the whole scheme), `*` (all), or
//! `<uri>/*`, which admits the URIs strictly under `<uri>` by whole segments.
//! [`ResourceMatcher`] is a grant's list of them; `McpGrant` uses it for
//! calling and listing alike.

use crate::pattern::{NamePattern, PatternList};
use std::fmt;

/// Why a resource URI (or a resource pattern) was refused: a short reason
/// fit to show an agent; it never echoes the URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UriError {
    reason: &'static str,
}

impl UriError {
    fn new(reason: &'static str) -> UriError {
        UriError { reason }
    }

    /// The reason, e.g. "a `.` or `..` path segment".
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason)
    }
}

impl std::error::Error for UriError {}

/// A resource URI that can be read one way only, in canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceUri {
    scheme: String,
    authority: Option<String>,
    segments: Vec<String>,
    /// `?query#fragment` as sent (escapes checked, not decoded); may be empty.
    tail: String,
    canonical: String,
}

impl ResourceUri {
    /// Parses `uri`: `scheme ":" ["//" authority] path ["?" query] ["#"
    /// fragment]`. Refuses, with the reason, anything ambiguous: see the
    /// module docs. Linear; never panics.
    pub fn parse(uri: &str) -> Result<ResourceUri, UriError> {
        if uri.chars().any(char::is_control) {
            return Err(UriError::new("a control character"));
        }
        if uri.contains('\\') {
            return Err(UriError::new("a backslash"));
        }
        let colon = uri
            .find(':')
            .ok_or(UriError::new("no scheme (`scheme:...`)"))?;
        let scheme = &uri[..colon];
        if !is_scheme(scheme) {
            return Err(UriError::new("no scheme (`scheme:...`)"));
        }
        let rest = &uri[colon + 1..];
        let (hier, tail) = rest.split_at(rest.find(['?', '#']).unwrap_or(rest.len()));
        check_tail(tail)?;
        let (authority, path) = match hier.strip_prefix("//") {
            Some(after) => {
                let end = after.find('/').unwrap_or(after.len());
                let (auth, path) = after.split_at(end);
                if auth.contains('%') {
                    return Err(UriError::new("a percent-escape in the authority"));
                }
                // The host is case-insensitive; user information is not.
                let auth = match auth.rfind('@') {
                    Some(at) => format!("{}{}", &auth[..=at], auth[at + 1..].to_ascii_lowercase()),
                    None => auth.to_ascii_lowercase(),
                };
                (Some(auth), path)
            }
            None => (None, hier),
        };
        let path = decode_path(path)?;
        let segments: Vec<String> = path.split('/').map(str::to_string).collect();
        let last = segments.len() - 1;
        for (i, seg) in segments.iter().enumerate() {
            // Empty: only before a leading `/` or after a trailing one.
            if seg.is_empty() && i != 0 && i != last {
                return Err(UriError::new("an empty path segment (`//`)"));
            }
            let head = seg.split(';').next().unwrap_or("");
            if head.contains('.') && head.bytes().all(|b| b == b'.' || b == b' ') {
                return Err(UriError::new("a `.` or `..` path segment"));
            }
            if !seg.is_ascii() {
                compatibility_segment(seg)?;
            }
        }
        let scheme = scheme.to_ascii_lowercase();
        let mut canonical = String::with_capacity(uri.len());
        canonical.push_str(&scheme);
        canonical.push(':');
        if let Some(a) = &authority {
            canonical.push_str("//");
            canonical.push_str(a);
        }
        // Re-escape only what would change how the canonical form reads.
        for c in path.chars() {
            match c {
                '%' => canonical.push_str("%25"),
                '?' => canonical.push_str("%3F"),
                '#' => canonical.push_str("%23"),
                c => canonical.push(c),
            }
        }
        canonical.push_str(tail);
        Ok(ResourceUri {
            scheme,
            authority,
            segments,
            tail: tail.to_string(),
            canonical,
        })
    }

    /// The canonical form: equal for two URIs exactly when they name the
    /// same resource under these rules.
    pub fn as_str(&self) -> &str {
        &self.canonical
    }

    /// The scheme, lowercased.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The authority (host lowercased), `Some("")` for `file:///...`, `None`
    /// without `//`.
    pub fn authority(&self) -> Option<&str> {
        self.authority.as_deref()
    }

    /// The decoded path split on `/`: `/a/b` is `["", "a", "b"]`.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// `?query#fragment` as sent, or empty.
    pub fn tail(&self) -> &str {
        &self.tail
    }
}

impl fmt::Display for ResourceUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

/// RFC 3986: `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`.
fn is_scheme(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'))
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte a `%` at `i` encodes.
fn escape_at(s: &[u8], i: usize) -> Option<u8> {
    let hi = hex(*s.get(i + 1)?)?;
    let lo = hex(*s.get(i + 2)?)?;
    Some(hi << 4 | lo)
}

/// Every `%` starts a well-formed escape.
fn check_escapes(s: &str) -> Result<(), UriError> {
    let b = s.as_bytes();
    for (i, _) in s.match_indices('%') {
        escape_at(b, i).ok_or(UriError::new("a malformed percent-escape"))?;
    }
    Ok(())
}

/// The query and fragment are passed as sent, but a server that
/// normalises the whole string (or reads a parameter as a path) would
/// resolve a dot segment in them: `file:///public/a?/../../secret/k` is
/// `/secret/k` to it. So, decoded once, no piece between `/ \ ? # & = ;`
/// may be `.` or `..` (or dots and spaces), and no escape may be double.
fn check_tail(tail: &str) -> Result<(), UriError> {
    check_escapes(tail)?;
    let b = tail.as_bytes();
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'%' => {
                // Well formed: checked above.
                decoded.push(escape_at(b, i).unwrap_or(0));
                i += 3;
            }
            c => {
                decoded.push(c);
                i += 1;
            }
        }
    }
    let dots = |decoded: &[u8]| {
        decoded
            .split(|c| matches!(c, b'/' | b'\\' | b'?' | b'#' | b'&' | b'=' | b';'))
            .any(|piece| piece.contains(&b'.') && piece.iter().all(|&c| c == b'.' || c == b' '))
    };
    // What a server that applies NFKC or a best-fit conversion reads.
    let compatible =
        (!decoded.is_ascii()).then(|| compatibility_form(&String::from_utf8_lossy(&decoded)));
    if dots(&decoded) || compatible.is_some_and(|c| dots(c.as_bytes())) {
        return Err(UriError::new(
            "a `.` or `..` segment in the query or fragment",
        ));
    }
    if (0..decoded.len()).any(|i| decoded[i] == b'%' && escape_at(&decoded, i).is_some()) {
        return Err(UriError::new("a double-encoded percent-escape (%25XX)"));
    }
    Ok(())
}

/// Characters with no compatibility decomposition that Windows' best-fit
/// conversion (and a reader who sees them) takes for `/` or `\`.
const BEST_FIT: [(char, char); 8] = [
    ('\u{2044}', '/'),  // fraction slash
    ('\u{2215}', '/'),  // division slash
    ('\u{2571}', '/'),  // box drawings light diagonal
    ('\u{29F8}', '/'),  // big solidus
    ('\u{2216}', '\\'), // set minus
    ('\u{2572}', '\\'), // box drawings light diagonal upper left
    ('\u{29F5}', '\\'), // reverse solidus operator
    ('\u{29F9}', '\\'), // big reverse solidus
];

/// `s` as a server that normalises it reads it: NFKC, then [`BEST_FIT`].
fn compatibility_form(s: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    s.nfkc()
        .map(|c| {
            BEST_FIT
                .iter()
                .find(|(from, _)| *from == c)
                .map_or(c, |(_, to)| *to)
        })
        .collect()
}

/// A decoded path segment with characters outside ASCII: refused when its
/// [`compatibility_form`] is a dot segment or holds a character that
/// would change how the path is split or decoded (`/ \ % ? #`), since a
/// server that normalises would resolve it somewhere the grant never
/// named.
fn compatibility_segment(seg: &str) -> Result<(), UriError> {
    let form = compatibility_form(seg);
    if form.contains(['/', '\\']) {
        return Err(UriError::new(
            "a character that reads as `/` or `\\` once normalised (NFKC or best fit)",
        ));
    }
    if form.contains(['%', '?', '#']) {
        return Err(UriError::new(
            "a character that reads as `%`, `?` or `#` once normalised (NFKC)",
        ));
    }
    let head = form.split(';').next().unwrap_or("");
    if head.contains('.') && head.chars().all(|c| c == '.' || c.is_whitespace()) {
        return Err(UriError::new(
            "a path segment that reads as `.` or `..` once normalised (NFKC)",
        ));
    }
    Ok(())
}

/// Percent-decodes `path` exactly once, refusing what decoding would make
/// ambiguous.
fn decode_path(path: &str) -> Result<String, UriError> {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c != b'%' {
            out.push(c);
            i += 1;
            continue;
        }
        let d = escape_at(b, i).ok_or(UriError::new("a malformed percent-escape"))?;
        match d {
            b'/' => return Err(UriError::new("an encoded `/` (%2F) in the path")),
            b'\\' => return Err(UriError::new("an encoded backslash (%5C) in the path")),
            0..=0x1f | 0x7f => return Err(UriError::new("an encoded control byte")),
            _ => out.push(d),
        }
        i += 3;
    }
    let decoded = String::from_utf8(out)
        .map_err(|_| UriError::new("a path that is not UTF-8 once decoded"))?;
    if decoded.chars().any(char::is_control) {
        return Err(UriError::new("an encoded control character"));
    }
    let d = decoded.as_bytes();
    if decoded
        .match_indices('%')
        .any(|(i, _)| escape_at(d, i).is_some())
    {
        return Err(UriError::new("a double-encoded percent-escape (%25XX)"));
    }
    Ok(decoded)
}

/// One resource grant entry, over canonical URIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourcePattern {
    /// `*`: every (unambiguous) URI.
    Any,
    /// `scheme:*` or `scheme://*`: every URI of the scheme (lowercased).
    Scheme(String),
    /// A URI without `*`: that URI, compared in canonical form.
    Exact(ResourceUri),
    /// `<uri>/*`: the URIs strictly under `<uri>` by whole segments, with at
    /// least one more non-empty segment (any query).
    Under {
        /// Lowercased.
        scheme: String,
        /// As in [`ResourceUri::authority`].
        authority: Option<String>,
        /// The decoded segments of `<uri>`'s path.
        segments: Vec<String>,
    },
}

impl ResourcePattern {
    /// Reads one grant entry (`*` only at the end, as [`NamePattern`]). A
    /// prefix must end in `/*` or name a whole scheme: `file:///public*`
    /// would be a string prefix (admitting `file:///public-x`) and is
    /// refused, as is an entry whose URI [`ResourceUri::parse`] refuses.
    pub fn parse(entry: &str) -> Result<ResourcePattern, String> {
        let p = NamePattern::parse(entry)?;
        ResourcePattern::from_name_pattern(&p).map_err(|e| format!("`{entry}`: {e}"))
    }

    /// The resource reading of an already parsed entry.
    pub fn from_name_pattern(p: &NamePattern) -> Result<ResourcePattern, String> {
        let invalid = |e: UriError| format!("not an unambiguous resource URI: {e}");
        match p {
            NamePattern::Exact(s) => ResourceUri::parse(s)
                .map(ResourcePattern::Exact)
                .map_err(invalid),
            NamePattern::Prefix(s) if s.is_empty() => Ok(ResourcePattern::Any),
            NamePattern::Prefix(s) => {
                let whole = s.strip_suffix("//").unwrap_or(s);
                if let Some(scheme) = whole.strip_suffix(':').filter(|sc| is_scheme(sc)) {
                    return Ok(ResourcePattern::Scheme(scheme.to_ascii_lowercase()));
                }
                if !s.ends_with('/') {
                    return Err(
                        "a resource prefix must end in `/*` (by path segments) or be `scheme:*`"
                            .into(),
                    );
                }
                let u = ResourceUri::parse(s).map_err(invalid)?;
                if !u.tail.is_empty() {
                    return Err("a `/*` resource prefix takes no query or fragment".into());
                }
                let mut segments = u.segments;
                // The empty segment after the trailing `/`.
                segments.pop();
                Ok(ResourcePattern::Under {
                    scheme: u.scheme,
                    authority: u.authority,
                    segments,
                })
            }
        }
    }

    /// Does this entry admit `uri`?
    pub fn admits(&self, uri: &ResourceUri) -> bool {
        match self {
            ResourcePattern::Any => true,
            ResourcePattern::Scheme(s) => uri.scheme == *s,
            ResourcePattern::Exact(e) => e.canonical == uri.canonical,
            ResourcePattern::Under {
                scheme,
                authority,
                segments,
            } => {
                uri.scheme == *scheme
                    && uri.authority == *authority
                    && uri.segments.len() > segments.len()
                    && uri.segments[..segments.len()] == segments[..]
                    && !uri.segments[segments.len()].is_empty()
            }
        }
    }
}

/// A grant's resource entries, read once; admits a URI when any entry does.
/// Empty admits nothing (fail closed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceMatcher(Vec<ResourcePattern>);

impl ResourceMatcher {
    /// Strict: the first entry that is not a valid resource pattern, with
    /// its index. For config validation.
    pub fn parse(list: &PatternList) -> Result<ResourceMatcher, (usize, String)> {
        list.patterns()
            .iter()
            .enumerate()
            .map(|(i, p)| ResourcePattern::from_name_pattern(p).map_err(|e| (i, e)))
            .collect::<Result<Vec<_>, _>>()
            .map(ResourceMatcher)
    }

    /// Lenient: an invalid entry admits nothing, the others apply. What the
    /// judge uses, so that a grant never admits more than it says.
    pub fn lenient(list: &PatternList) -> ResourceMatcher {
        ResourceMatcher(
            list.patterns()
                .iter()
                .filter_map(|p| ResourcePattern::from_name_pattern(p).ok())
                .collect(),
        )
    }

    /// Does any entry admit `uri`?
    pub fn allows(&self, uri: &ResourceUri) -> bool {
        self.0.iter().any(|p| p.admits(uri))
    }

    /// Parses `uri` and says whether it is admitted; an ambiguous URI is an
    /// error, whatever the grant.
    pub fn check(&self, uri: &str) -> Result<bool, UriError> {
        ResourceUri::parse(uri).map(|u| self.allows(&u))
    }

    /// The entries.
    pub fn patterns(&self) -> &[ResourcePattern] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn matcher(entries: &[&str]) -> ResourceMatcher {
        ResourceMatcher::parse(&PatternList::parse(entries).unwrap()).unwrap()
    }

    fn refused(uri: &str) -> &'static str {
        match ResourceUri::parse(uri) {
            Ok(u) => panic!("`{uri}` was accepted as `{u}`"),
            Err(e) => e.reason(),
        }
    }

    #[test]
    fn compatibility_dots_and_slashes_are_refused() {
        let dots = "a path segment that reads as `.` or `..` once normalised (NFKC)";
        let slash = "a character that reads as `/` or `\\` once normalised (NFKC or best fit)";
        for (u, why) in [
            ("file:///public/\u{FF0E}\u{FF0E}/secret", dots),
            ("file:///public/%EF%BC%8E%EF%BC%8E/secret", dots),
            ("file:///public/\u{FF0E}/secret", dots),
            ("file:///public/\u{2025}/secret", dots),
            ("file:///public/\u{2024}\u{2024}/secret", dots),
            ("file:///public/\u{2026}/secret", dots),
            ("file:///public/.\u{FE52}/secret", dots),
            ("file:///public/\u{FF0E}\u{FF0E};x/secret", dots),
            ("file:///public/\u{FF0E}\u{3000}\u{FF0E}/secret", dots),
            ("file:///public/..\u{FF0F}secret", slash),
            ("file:///public/a%EF%BC%8Fb", slash),
            ("file:///public/..\u{FF3C}secret", slash),
            ("file:///public/..\u{FE68}secret", slash),
            ("file:///public/..\u{2215}secret", slash),
            ("file:///public/..\u{2044}secret", slash),
            ("file:///public/..\u{29F5}secret", slash),
            (
                "file:///public/\u{FF05}2e\u{FF05}2e/x",
                "a character that reads as `%`, `?` or `#` once normalised (NFKC)",
            ),
            (
                "file:///public/a?x=\u{FF0E}\u{FF0E}\u{FF0F}secret",
                "a `.` or `..` segment in the query or fragment",
            ),
            (
                "file:///public/a#\u{2025}",
                "a `.` or `..` segment in the query or fragment",
            ),
        ] {
            assert_eq!(refused(u), why, "{u}");
        }
        // Other scripts' names, and dots inside a name, are not dot segments.
        let m = matcher(&["file:///public/*"]);
        for u in [
            "file:///public/\u{6587}\u{66F8}.txt",
            "file:///public/r\u{E9}sum\u{E9}.pdf",
            "file:///public/\u{FF41}\u{FF0E}txt",
            "file:///public/\u{2026}more",
        ] {
            assert_eq!(m.check(u), Ok(true), "{u}");
        }
    }

    #[test]
    fn ambiguous_uris_are_refused_with_a_reason() {
        let dots = "a `.` or `..` path segment";
        for u in [
            "file:///public/../secret/k",
            "file:///public/%2e%2e/secret/k",
            "file:///public/%2E%2E/secret/k",
            "file:///public/.%2e/secret/k",
            "file:///public/./../../secret",
            "file:///public/..;/secret",
            "file:///public/%2e%2e%3b/secret",
            "file:///public/..;x=1/secret",
            "file:///public/.",
            "file:///public/..",
            "file:///public/...",
            "file:///public/. ./x",
        ] {
            assert_eq!(refused(u), dots, "{u}");
        }
        assert_eq!(
            refused("file:///public/..%2fsecret"),
            "an encoded `/` (%2F) in the path"
        );
        assert_eq!(
            refused("file:///public/%2e%2e%2fsecret"),
            "an encoded `/` (%2F) in the path"
        );
        assert_eq!(refused("file:///public/..\\secret"), "a backslash");
        assert_eq!(refused("file:///public/a\\b"), "a backslash");
        assert_eq!(
            refused("file:///public/..%5csecret"),
            "an encoded backslash (%5C) in the path"
        );
        assert_eq!(
            refused("file:///public/%252e%252e/secret"),
            "a double-encoded percent-escape (%25XX)"
        );
        assert_eq!(
            refused("file:///public/%25%32%65"),
            "a double-encoded percent-escape (%25XX)"
        );
        assert_eq!(refused("file:///public//a"), "an empty path segment (`//`)");
        assert_eq!(refused("file:////public/a"), "an empty path segment (`//`)");
        assert_eq!(refused("file:///public/a\n"), "a control character");
        assert_eq!(refused("file:///public/a%00"), "an encoded control byte");
        assert_eq!(refused("file:///public/a%0a"), "an encoded control byte");
        assert_eq!(
            refused("file:///public/a%c2%85"),
            "an encoded control character"
        );
        assert_eq!(
            refused("file:///public/a%ff"),
            "a path that is not UTF-8 once decoded"
        );
        assert_eq!(refused("file:///public/a%2"), "a malformed percent-escape");
        assert_eq!(refused("file:///public/a%zz"), "a malformed percent-escape");
        assert_eq!(
            refused("file:///public/a?x=%"),
            "a malformed percent-escape"
        );
        let tail_dots = "a `.` or `..` segment in the query or fragment";
        for u in [
            "file:///public/a?/../../secret/k",
            "file:///public/a#/../../secret/k",
            "file:///public/a?x=/../../../etc/passwd",
            "file:///public/a?x=../../etc/passwd",
            "file:///public/a?%2e%2e/secret",
            "file:///public/a?x%2f..%2fsecret",
            "file:///public/a?x&..&y",
            "file:///public/a#.",
            "file:///public/a?p=%5c..%5csecret",
        ] {
            assert_eq!(refused(u), tail_dots, "{u}");
        }
        assert_eq!(
            refused("file:///public/a?p=%252e%252e"),
            "a double-encoded percent-escape (%25XX)"
        );
        // Ordinary queries and fragments pass.
        for u in [
            "file:///public/a?v=1.2",
            "file:///public/a?q=x.y&page=2#sec.3",
            "file:///public/a.txt#L10",
        ] {
            assert!(ResourceUri::parse(u).is_ok(), "{u}");
        }
        assert_eq!(refused("/public/a"), "no scheme (`scheme:...`)");
        assert_eq!(refused("public/a"), "no scheme (`scheme:...`)");
        assert_eq!(refused(":x"), "no scheme (`scheme:...`)");
        assert_eq!(refused("1x:y"), "no scheme (`scheme:...`)");
        assert_eq!(refused(""), "no scheme (`scheme:...`)");
        assert_eq!(
            refused("file://h%6fst/a"),
            "a percent-escape in the authority"
        );
    }

    #[test]
    fn the_canonical_form_is_decoded_once_and_lowercased_where_it_may_be() {
        let c = |u: &str| ResourceUri::parse(u).unwrap().as_str().to_string();
        assert_eq!(c("FILE:///public/a"), "file:///public/a");
        assert_eq!(c("file:///public/%61%20b"), "file:///public/a b");
        assert_eq!(
            c("https://User@EXAMPLE.com:8/A?Q=%41#F"),
            "https://User@example.com:8/A?Q=%41#F"
        );
        assert_eq!(c("file:///a%3fb"), "file:///a%3Fb");
        assert_eq!(c("file:///a?b"), "file:///a?b");
        assert_eq!(c("file:///100%25"), "file:///100%25");
        assert_eq!(c("file:///public/"), "file:///public/");
        assert_eq!(c("mem:notes/a"), "mem:notes/a");
        assert_eq!(c("file:///public/a.txt;v=1"), "file:///public/a.txt;v=1");
        assert_eq!(c("file:///public/.hidden"), "file:///public/.hidden");
        assert_eq!(c("file:///public/a..b"), "file:///public/a..b");
        let u = ResourceUri::parse("file:///public/a/").unwrap();
        assert_eq!(u.segments(), ["", "public", "a", ""]);
        assert_eq!(u.authority(), Some(""));
    }

    #[test]
    fn prefixes_match_by_segments() {
        let m = matcher(&["file:///public/*"]);
        let ok = |u: &str| m.check(u).unwrap();
        assert!(ok("file:///public/a"));
        assert!(ok("file:///public/a/b"));
        assert!(ok("file:///public/a/"));
        assert!(ok("FILE:///public/a"));
        assert!(ok("file:///public/%61"));
        assert!(ok("file:///public/a?x=1"));
        // A server normalising the whole string would leave the prefix.
        assert!(m.check("file:///public/a?x=../../secret").is_err());
        assert!(!ok("file:///public-x/a"));
        assert!(!ok("file:///public"));
        assert!(!ok("file:///public/"));
        assert!(!ok("file:///Public/a"));
        assert!(!ok("file://evil/public/a"));
        assert!(!ok("file:/public/a"));
        assert!(!ok("https:///public/a"));
        assert!(m.check("file:///public/../secret").is_err());
        assert!(m.check("file:///public//a").is_err());
    }

    #[test]
    fn exact_entries_compare_canonical_forms() {
        let m = matcher(&["FILE:///docs/%61.txt"]);
        assert!(m.check("file:///docs/a.txt").unwrap());
        assert!(m.check("file:///docs/%61.txt").unwrap());
        assert!(!m.check("file:///docs/a.txt/").unwrap());
        assert!(!m.check("file:///docs/a.txt2").unwrap());
        // `%3F` in the path is not a query.
        let m = matcher(&["file:///a%3Fb"]);
        assert!(!m.check("file:///a?b").unwrap());
        assert!(m.check("file:///a%3fb").unwrap());
    }

    #[test]
    fn whole_schemes_and_everything() {
        let m = matcher(&["ui:*", "https://*"]);
        assert!(m.check("UI://widget/a").unwrap());
        assert!(m.check("https://example.com/x").unwrap());
        assert!(!m.check("http://example.com/x").unwrap());
        assert!(!m.check("uix:a").unwrap());
        let all = matcher(&["*"]);
        assert!(all.check("anything:at/all").unwrap());
        assert!(all.check("file:///a/../b").is_err());
        let root = matcher(&["file:///*"]);
        assert!(root.check("file:///a").unwrap());
        assert!(!root.check("file://host/a").unwrap());
        let opaque = matcher(&["mem:notes/*"]);
        assert!(opaque.check("mem:notes/a").unwrap());
        assert!(!opaque.check("mem:/notes/a").unwrap());
        assert!(!opaque.check("mem:notes-x/a").unwrap());
    }

    #[test]
    fn bad_entries_are_refused_strictly_and_admit_nothing_leniently() {
        for bad in [
            "file:///public*",
            "file:///pub/../*",
            "public/*",
            "file:///public/?x/*",
            "file:///a//b/*",
        ] {
            assert!(ResourcePattern::parse(bad).is_err(), "{bad}");
        }
        let list = PatternList::parse(&["file:///public*", "file:///ok/*"]).unwrap();
        assert_eq!(ResourceMatcher::parse(&list).unwrap_err().0, 0);
        let m = ResourceMatcher::lenient(&list);
        assert!(!m.check("file:///public-x/a").unwrap());
        assert!(!m.check("file:///public/a").unwrap());
        assert!(m.check("file:///ok/a").unwrap());
        assert!(!ResourceMatcher::default().check("file:///a").unwrap());
    }

    /// What one piece of a generated URI makes of the whole under the
    /// grant `file:///public/*`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Piece {
        /// Read one way, and compatible with being under the prefix.
        In,
        /// Read one way, and outside the prefix whatever the rest is.
        Out,
        /// Readable more than one way (or not at all): refused.
        Ambiguous,
    }

    type Labelled = (&'static str, Piece);

    /// Mostly `In`, so that about a quarter of the URIs are admitted and
    /// the "admitted" direction is checked as often as the others.
    fn piece(
        inside: &'static [Labelled],
        outside: &'static [Labelled],
        ambiguous: &'static [Labelled],
    ) -> impl Strategy<Value = Labelled> {
        use proptest::sample::select;
        prop_oneof![
            8 => select(inside),
            1 => select(outside),
            1 => select(ambiguous),
        ]
    }

    /// A path segment after `/public`; an empty one is labelled where the
    /// URI is put together (it is `//` unless it is the last).
    fn segment() -> impl Strategy<Value = Labelled> {
        use proptest::sample::select;
        prop_oneof![
            10 => select(&[
                ("a", Piece::In), ("b.txt", Piece::In), ("%61", Piece::In),
                (".hidden", Piece::In), ("a..b", Piece::In), ("a;v=1", Piece::In),
                ("x%3fy", Piece::In), ("100%25", Piece::In), ("%e2%82%ac", Piece::In),
                ("a%20b", Piece::In), ("...x", Piece::In),
            ][..]),
            3 => select(&[
                (".", Piece::Ambiguous), ("..", Piece::Ambiguous), ("%2e", Piece::Ambiguous),
                ("%2E%2e", Piece::Ambiguous), (".%2e", Piece::Ambiguous), ("..;", Piece::Ambiguous),
                ("..;x=1", Piece::Ambiguous), ("...", Piece::Ambiguous), ("a%2fb", Piece::Ambiguous),
                ("a%5cb", Piece::Ambiguous), ("a\\b", Piece::Ambiguous), ("%252e", Piece::Ambiguous),
                ("%2541", Piece::Ambiguous), ("%", Piece::Ambiguous), ("%zz", Piece::Ambiguous),
                ("a%2", Piece::Ambiguous), ("%00", Piece::Ambiguous), ("%7f", Piece::Ambiguous),
                ("%ff", Piece::Ambiguous), ("%c2%85", Piece::Ambiguous), ("a\tb", Piece::Ambiguous),
            ][..]),
            1 => Just(("", Piece::In)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// URIs built from labelled pieces: `file:///public/*` admits one
        /// exactly when every piece reads one way and together they name
        /// something strictly under `/public` (refusing a valid one fails
        /// as surely as admitting an outside one); it refuses one exactly
        /// when a piece is ambiguous; an admitted URI's canonical form is
        /// inside the prefix and stable.
        #[test]
        fn admitted_exactly_when_under_the_prefix(
            scheme in piece(
                &[("file", Piece::In), ("FILE", Piece::In), ("File", Piece::In)],
                &[("https", Piece::Out), ("files", Piece::Out), ("f+ile", Piece::Out)],
                &[("fi%6ce", Piece::Ambiguous), ("", Piece::Ambiguous), ("1file", Piece::Ambiguous)],
            ),
            authority in piece(
                &[("//", Piece::In)],
                &[("//h", Piece::Out), ("//H", Piece::Out), ("", Piece::Out), ("//u@", Piece::Out)],
                &[("//h%6f", Piece::Ambiguous)],
            ),
            first in piece(
                &[("public", Piece::In), ("%70ublic", Piece::In), ("publi%63", Piece::In)],
                &[("Public", Piece::Out), ("public-x", Piece::Out), ("publicity", Piece::Out),
                  ("public.", Piece::Out), ("publ", Piece::Out), ("public;v=1", Piece::Out)],
                &[("..", Piece::Ambiguous), ("%2e%2e", Piece::Ambiguous), ("public%2fa", Piece::Ambiguous)],
            ),
            rest in proptest::collection::vec(segment(), 0..4),
            tail in prop_oneof![
                8 => proptest::sample::select(&[
                    ("", Piece::In), ("?q=1", Piece::In), ("#f", Piece::In),
                    ("?q=a%20b", Piece::In), ("?", Piece::In),
                ][..]),
                1 => proptest::sample::select(&[
                    ("?q=%", Piece::Ambiguous), ("#%zz", Piece::Ambiguous), ("?q=%2", Piece::Ambiguous),
                ][..]),
            ],
        ) {
            let mut path = format!("/{}", first.0);
            let mut pieces = vec![scheme.1, authority.1, first.1, tail.1];
            for (i, (seg, label)) in rest.iter().enumerate() {
                path.push('/');
                path.push_str(seg);
                let last = i + 1 == rest.len();
                pieces.push(match (*seg, last) {
                    // `//` inside the path is read two ways.
                    ("", false) => Piece::Ambiguous,
                    // A trailing `/` right after `/public` names nothing under it.
                    ("", true) if i == 0 => Piece::Out,
                    _ => *label,
                });
            }
            if rest.is_empty() {
                // `/public` itself is not under `/public`.
                pieces.push(Piece::Out);
            }
            let uri = format!("{}:{}{path}{}", scheme.0, authority.0, tail.0);
            let expected = if pieces.contains(&Piece::Ambiguous) {
                None
            } else {
                Some(!pieces.contains(&Piece::Out))
            };
            let m = matcher(&["file:///public/*"]);
            let got = m.check(&uri);
            prop_assert_eq!(got.ok(), expected, "{} ({:?}): {:?}", uri, pieces, got);
            if expected == Some(true) {
                let u = ResourceUri::parse(&uri).unwrap();
                prop_assert!(u.as_str().starts_with("file:///public/"), "{} -> {}", uri, u);
                let again = ResourceUri::parse(u.as_str()).unwrap();
                prop_assert_eq!(again.as_str(), u.as_str());
                prop_assert!(m.check(u.as_str()).unwrap());
            }
        }
    }

    proptest! {
        /// Random URIs from a hostile alphabet: whatever is admitted under
        /// `file:///public/*` is canonically inside it, and the canonical
        /// form is stable (parsing it again gives it back).
        #[test]
        fn nothing_outside_the_prefix_is_admitted(
            scheme in prop_oneof![Just("file"), Just("FILE"), Just("fi%6ce"), Just("")],
            auth in prop_oneof![Just("//"), Just("///"), Just("//h"), Just(""), Just("/")],
            segs in proptest::collection::vec(prop_oneof![
                Just("public"), Just("public-x"), Just("Public"), Just("a"), Just(""), Just("."),
                Just(".."), Just("%2e"), Just("%2E%2e"), Just("%2f"), Just("%5c"), Just("\\"),
                Just("..;"), Just("%3b"), Just("%252e"), Just("%25"), Just("%"), Just(";"),
                Just("%00"), Just("?"), Just("#"), Just("%3f"), Just("%61"), Just("%ff"),
            ], 0..6),
            tail in prop_oneof![Just(""), Just("/"), Just("?q=../x"), Just("#f")],
        ) {
            let uri = format!("{scheme}:{auth}{}{tail}", segs.join("/"));
            let m = matcher(&["file:///public/*"]);
            if let Ok(true) = m.check(&uri) {
                let u = ResourceUri::parse(&uri).unwrap();
                prop_assert!(u.as_str().starts_with("file:///public/"), "{} -> {}", uri, u);
                prop_assert_eq!(u.scheme(), "file");
                prop_assert_eq!(u.authority(), Some(""));
                prop_assert!(u.segments().len() > 2);
                prop_assert_eq!(&u.segments()[..2], &["".to_string(), "public".to_string()][..]);
                prop_assert!(!u.segments()[2].is_empty());
                for s in u.segments() {
                    prop_assert!(s != "." && s != ".." && !s.contains('/') && !s.contains('\\'));
                }
            }
            if let Ok(u) = ResourceUri::parse(&uri) {
                let again = ResourceUri::parse(u.as_str()).unwrap();
                prop_assert_eq!(again.as_str(), u.as_str());
            }
        }

        /// No input panics.
        #[test]
        fn never_panics(s in "\\PC{0,40}", b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = ResourceUri::parse(&s);
            let _ = ResourcePattern::parse(&s);
            let _ = ResourceUri::parse(&String::from_utf8_lossy(&b));
        }
    }
}
