//! The test suite's own shape holds: no test function over 80 lines, and no wall-clock sleep of a second or more but where time itself is the subject.

use std::path::{Path, PathBuf};

/// The longest a function in `tests/` may be, in lines from `fn` to its closing brace.
const LONGEST: usize = 80;

/// Sleeps of a second or more that stay, each with why: the elapsed time
/// is the behaviour under test and cannot be made shorter from the config.
const TIMED: &[(&str, &str)] = &[(
    "faults.rs",
    "holds the SQLite lock past two of the store's fixed 5 s busy timeouts",
)];

/// The `.rs` files under `dir`, this one's subfolders included.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("tests/ reads") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn test_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(&root).unwrap().display().to_string();
            (
                name,
                std::fs::read_to_string(&p).expect("a test file reads"),
            )
        })
        .collect()
}

/// Each function's name, first line (1-based) and length: from its `fn`
/// line to the first line that is its indentation followed by `}`.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = &line[..line.len() - line.trim_start().len()];
        let head = line.trim_start();
        let head = head.strip_prefix("pub ").unwrap_or(head);
        let head = head.strip_prefix("async ").unwrap_or(head);
        let Some(rest) = head.strip_prefix("fn ") else {
            i += 1;
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{indent}}}");
        let end = (i..lines.len()).find(|&j| lines[j] == close).unwrap_or(i);
        found.push((name, i + 1, end - i + 1));
        i = end + 1;
    }
    found
}

/// The seconds a `sleep(Duration::from_secs(N))` or `from_millis(N)` on
/// `line` waits, when it names a literal.
fn slept(line: &str) -> Option<f64> {
    let (_, after) = line.split_once("sleep(")?;
    let literal = |prefix: &str| {
        let (_, rest) = after.split_once(prefix)?;
        let digits: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '_')
            .filter(|c| *c != '_')
            .collect();
        digits.parse::<f64>().ok()
    };
    literal("Duration::from_secs(")
        .or_else(|| literal("Duration::from_millis(").map(|ms| ms / 1000.0))
}

#[test]
fn no_test_function_is_over_eighty_lines() {
    let long: Vec<String> = test_files()
        .iter()
        .flat_map(|(file, text)| {
            functions(text)
                .into_iter()
                .filter(|(_, _, n)| *n > LONGEST)
                .map(move |(name, line, n)| format!("{file}:{line} {name}: {n} lines"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "split these into named steps:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_test_sleeps_a_second_or_more_but_where_time_is_the_subject() {
    let mut timed_seen = Vec::new();
    let mut found = Vec::new();
    for (file, text) in test_files() {
        for (i, line) in text.lines().enumerate() {
            if slept(line).is_some_and(|s| s >= 1.0) {
                if TIMED.iter().any(|(f, _)| *f == file) {
                    timed_seen.push(file.clone());
                } else {
                    found.push(format!("{file}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "wait on the event instead (tests/common/wait.rs):\n{}",
        found.join("\n")
    );
    // The list cannot outlive the sleeps it excuses.
    for (file, why) in TIMED {
        assert!(
            timed_seen.contains(&file.to_string()),
            "{file} ({why}) no longer sleeps: drop it from TIMED"
        );
    }
}

#[test]
fn the_counters_see_what_they_count() {
    let text = "fn short() {\n}\n\nasync fn long() {\n".to_string()
        + &"    x();\n".repeat(LONGEST)
        + "}\n";
    assert_eq!(
        functions(&text),
        [("short".into(), 1, 2), ("long".into(), 4, LONGEST + 2)]
    );
    // Spelled in pieces, so this file holds no sleep for the scan to find.
    let call = |f: &str, arg: &str| format!("{f}{}(Duration::{arg})", "sleep");
    assert_eq!(
        slept(&call("std::thread::", "from_millis(1_500)")),
        Some(1.5)
    );
    assert_eq!(slept(&call("tokio::time::", "from_secs(3)")), Some(3.0));
    assert_eq!(slept("let d = Duration::from_secs(3);"), None);
}
