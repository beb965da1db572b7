//! Agent keys: stored only as SHA-256 digests, looked up by digest.
//!
//! The presented key is hashed once, the digest selects a candidate in a hash
//! map, and the candidate is then compared in constant time. Timing can at
//! most reveal something about a digest, never about a key, and there is no
//! linear scan over agents.

use sha2::{Digest, Sha256};
// ahash, not SipHash: these maps are looked up on every request, and keys
// agents influence (task ids) still get a randomly keyed, DoS-resistant hash.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
use std::fmt;
use subtle::ConstantTimeEq;

/// The SHA-256 digest of an agent key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyDigest([u8; 32]);

impl KeyDigest {
    /// Parses 64 hex digits (either case).
    pub fn from_hex(s: &str) -> Result<KeyDigest, String> {
        let s = s.trim();
        if s.len() != 64 {
            return Err(format!(
                "must be 64 hex digits (a SHA-256 digest, see `loopgate hash-key`), got {} characters",
                s.len()
            ));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out)
            .map_err(|_| "must contain only hex digits 0-9, a-f".to_string())?;
        Ok(KeyDigest(out))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn ct_eq(&self, other: &KeyDigest) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

// Digests are not secrets, but keep them out of casual debug output anyway.
impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyDigest({}..)", &self.to_hex()[..8])
    }
}

/// SHA-256 of a presented key.
pub fn hash_key(key: &[u8]) -> KeyDigest {
    KeyDigest(Sha256::digest(key).into())
}

/// Maps key digests to the value they identify (an agent).
#[derive(Debug, Clone)]
pub struct KeyIndex<T> {
    by_digest: HashMap<KeyDigest, T>,
}

impl<T> Default for KeyIndex<T> {
    fn default() -> Self {
        KeyIndex {
            by_digest: HashMap::default(),
        }
    }
}

impl<T> KeyIndex<T> {
    /// Adds a digest; returns the value already holding it, if any (two
    /// agents sharing one key is a configuration error).
    pub fn insert(&mut self, digest: KeyDigest, value: T) -> Option<T> {
        self.by_digest.insert(digest, value)
    }

    /// Finds the value for a presented key.
    pub fn lookup(&self, presented_key: &[u8]) -> Option<&T> {
        let digest = hash_key(presented_key);
        let (stored, value) = self.by_digest.get_key_value(&digest)?;
        // The map compared with `==`; confirm in constant time before trusting it.
        stored.ct_eq(&digest).then_some(value)
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // printf 'abc' | sha256sum
        assert_eq!(
            hash_key(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn hex_parsing_rejects_bad_input() {
        let good = hash_key(b"k").to_hex();
        assert_eq!(KeyDigest::from_hex(&good).unwrap(), hash_key(b"k"));
        assert_eq!(
            KeyDigest::from_hex(&good.to_uppercase()).unwrap(),
            hash_key(b"k")
        );
        assert!(KeyDigest::from_hex("abc").is_err());
        assert!(KeyDigest::from_hex(&"g".repeat(64)).is_err());
        assert!(KeyDigest::from_hex("").is_err());
    }

    #[test]
    fn lookup_finds_only_exact_keys() {
        let mut idx = KeyIndex::default();
        assert!(idx.insert(hash_key(b"alpha"), "a").is_none());
        idx.insert(hash_key(b"beta"), "b");
        assert_eq!(idx.lookup(b"alpha"), Some(&"a"));
        assert_eq!(idx.lookup(b"beta"), Some(&"b"));
        assert_eq!(idx.lookup(b"alph"), None);
        assert_eq!(idx.lookup(b"alpha "), None);
        assert_eq!(idx.lookup(b""), None);
        assert_eq!(idx.insert(hash_key(b"alpha"), "c"), Some("a"));
    }

    #[test]
    fn debug_does_not_print_the_whole_digest() {
        let s = format!("{:?}", hash_key(b"x"));
        assert!(s.len() < 30, "{s}");
    }
}
