//! Configuration: strict YAML spec types (`spec`), validated into immutable
//! runtime snapshots (`runtime`). A snapshot is built completely or not at
//! all, so a bad file never replaces a running config. One module per kind
//! of section: `providers`, `routes` (with `prices`), `tools`, `mcp`,
//! `agents`, `listen`, `state`.

mod agents;
mod listen;
mod mcp;
pub mod prices;
mod providers;
mod routes;
pub mod runtime;
pub mod spec;
mod state;
mod tools;

pub use runtime::Config;
pub use spec::ProviderKind;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One problem in a config file, rendered as `FILE: path.to.field: why`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub path: String,
    pub why: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() || self.path == "." {
            "(top level)"
        } else {
            &self.path
        };
        write!(f, "{}: {}: {}", self.file, path, self.why)
    }
}

/// Every problem found in one file.
#[derive(Debug, Clone)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Where a running gateway reads its config, at start and at every
/// reload: the file, and values for environment variables the process
/// does not set (the demo's upstream key and admin token), so a reload
/// resolves `*_env` secrets exactly as the first load did.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    fallback: Arc<[(&'static str, String)]>,
}

impl Source {
    /// The file, with the process environment only.
    pub fn file(path: PathBuf) -> Source {
        Source::with_fallback(path, Vec::new())
    }

    /// The file, with `fallback` for variables the environment lacks.
    pub fn with_fallback(path: PathBuf, fallback: Vec<(&'static str, String)>) -> Source {
        Source {
            path,
            fallback: fallback.into(),
        }
    }

    /// A variable's value: the environment's, else the fallback's.
    pub fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().or_else(|| {
            self.fallback
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        })
    }

    /// Reads, parses and validates the file.
    pub fn load(&self) -> Result<Config, ConfigErrors> {
        load_with_env(&self.path, &|name| self.env(name))
    }
}

/// Reads, parses and validates a config file, resolving `*_env` secrets from
/// the process environment.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    load_with_env(path, &|name| std::env::var(name).ok())
}

/// As [`load`], with the environment injected (tests).
pub fn load_with_env(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: file.clone(),
            path: String::new(),
            why: format!("cannot read file: {e}"),
        }])
    })?;
    let spec = parse(&file, &text)?;
    runtime::build(&file, spec, env)
}

/// Parses YAML into the spec types; the error names the field path.
pub fn parse(file: &str, text: &str) -> Result<spec::ConfigSpec, ConfigErrors> {
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        // serde_yaml prefixes its message with its own (shorter) path; we
        // already print the full one. Its "at line L column C" stays.
        let inner = e.into_inner().to_string();
        let why = match inner.split_once(": ") {
            Some((head, rest)) if !head.contains(' ') => rest.to_string(),
            _ => inner,
        };
        ConfigErrors(vec![ConfigError {
            file: file.to_string(),
            path,
            why,
        }])
    })
}
