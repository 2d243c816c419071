//! What a rejected config says: every problem with its YAML path and, once located, its line and column.

use std::fmt;
use std::path::{Path, PathBuf};

use super::locate;

/// Every problem found in one config file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    pub problems: Vec<ConfigProblem>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Where in the document, e.g. `routes[1].limiters[0]`.
    pub path: String,
    /// 1-based line and column, when known.
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = Printable(&self.path);
        match (self.location, self.path.is_empty()) {
            (Some((line, col)), false) => {
                write!(f, "line {line} column {col}: {path}: {}", self.message)
            }
            (Some((line, col)), true) => write!(f, "line {line} column {col}: {}", self.message),
            (None, false) => write!(f, "{path}: {}", self.message),
            (None, true) => write!(f, "{}", self.message),
        }
    }
}

/// A path as printed: a key may hold any character, and a newline in a
/// name must not split the line of a log record or of `check`'s output.
struct Printable<'a>(&'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self
            .file
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "config".into());
        let n = self.problems.len();
        write!(f, "{file}: {n} error{}", if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            write!(f, "\n  {file}: {p}")?;
        }
        Ok(())
    }
}

impl ConfigProblem {
    /// A problem at a YAML path, not located in the text yet.
    pub fn at(path: impl Into<String>, message: impl Into<String>) -> ConfigProblem {
        ConfigProblem {
            path: path.into(),
            location: None,
            message: message.into(),
        }
    }
}

impl ConfigError {
    /// One problem that belongs to no YAML path (an unreadable file, a syntax error).
    pub(super) fn single(
        file: Option<&Path>,
        message: String,
        location: Option<(usize, usize)>,
    ) -> Self {
        ConfigError {
            file: file.map(Path::to_path_buf),
            problems: vec![ConfigProblem {
                path: String::new(),
                location,
                message,
            }],
        }
    }

    /// Problems found in a document not read from a file (yet).
    pub(super) fn new(problems: Vec<ConfigProblem>) -> Self {
        ConfigError {
            file: None,
            problems,
        }
    }
}

/// Gives each problem the line and column of its path in the text.
pub(super) fn locate_all(problems: &mut [ConfigProblem], index: &locate::Index) {
    for p in problems {
        p.location = p.location.or_else(|| index.find(&p.path));
    }
}
