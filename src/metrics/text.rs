//! The Prometheus text exposition format, written in one place: family headers, samples and label escaping.
//!
//! Every renderer of `/metrics` (the registry, the process sample, the
//! upstream gauges) goes through these, so the format cannot drift between them.

use std::fmt::{Display, Write as _};

/// A label value as the text format wants it: backslash, quote and newline escaped.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `k1="v1",k2="v2"` with the values escaped: the inside of a series' braces.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    let mut key = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        let _ = write!(key, "{k}=\"{}\"", escape(v));
    }
    key
}

/// The `# HELP` and `# TYPE` lines that open a family.
pub fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample line; `labels` is the inside of the braces (see [`labels`]), empty for none.
pub fn sample(out: &mut String, name: &str, labels: &str, value: impl Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}
