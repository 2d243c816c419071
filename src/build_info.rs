//! What `tollgate --version` says: the crate version, and the commit and build date `dist/build` sets.

use std::sync::OnceLock;

/// The version in Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit the binary was built from, when the build set `TOLLGATE_BUILD_COMMIT`
/// (`dist/build` does). Read at compile time: a plain `cargo build` runs no git,
/// so it neither needs one nor rebuilds on every commit.
pub const COMMIT: Option<&str> = option_env!("TOLLGATE_BUILD_COMMIT");
/// The UTC date and time of the build, when the build set `TOLLGATE_BUILD_DATE`.
pub const DATE: Option<&str> = option_env!("TOLLGATE_BUILD_DATE");
/// The Rust target the binary was built for, when the build set `TOLLGATE_BUILD_TARGET`.
pub const TARGET: Option<&str> = option_env!("TOLLGATE_BUILD_TARGET");

/// `0.1.0 (commit 1a2b3c4d5e6f, built 2026-12-01T15:04:05Z, x86_64-unknown-linux-musl)`,
/// or `0.1.0 (built from source)` for a build that set none of them.
pub fn version() -> &'static str {
    static LINE: OnceLock<String> = OnceLock::new();
    LINE.get_or_init(|| describe(VERSION, COMMIT, DATE, TARGET))
}

fn describe(
    version: &str,
    commit: Option<&str>,
    date: Option<&str>,
    target: Option<&str>,
) -> String {
    // An empty variable (`TOLLGATE_BUILD_COMMIT=`) counts as unset.
    fn given(v: Option<&str>) -> Option<&str> {
        v.map(str::trim).filter(|v| !v.is_empty())
    }
    let parts: Vec<String> = [
        given(commit).map(|c| format!("commit {c}")),
        given(date).map(|d| format!("built {d}")),
        given(target).map(str::to_string),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        format!("{version} (built from source)")
    } else {
        format!("{version} ({})", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn a_dist_build_names_its_commit_date_and_target() {
        assert_eq!(
            describe(
                "0.1.0",
                Some("1a2b3c4"),
                Some("2026-12-01T15:04:05Z"),
                Some("x86_64-unknown-linux-musl")
            ),
            "0.1.0 (commit 1a2b3c4, built 2026-12-01T15:04:05Z, x86_64-unknown-linux-musl)"
        );
    }

    #[test]
    fn a_plain_cargo_build_says_it_was_built_from_source() {
        assert_eq!(
            describe("0.1.0", None, None, None),
            "0.1.0 (built from source)"
        );
        assert_eq!(
            describe("0.1.0", Some(""), None, None),
            "0.1.0 (built from source)"
        );
    }
}
