//! A secret that cannot be printed: `Debug` and `Display` show a placeholder
//! and there is no `Serialize`, so a provider key cannot leak through a log
//! line, an error message or a config dump by accident.

use std::fmt;

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The only way to the value: call sites that inject it upstream.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_formats_the_value() {
        let s = Secret::new("sk-live-123".into());
        assert!(!format!("{s:?} {s} {s:#?}").contains("sk-live"));
        assert_eq!(s.expose(), "sk-live-123");
    }
}
