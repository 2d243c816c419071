//! The module map in `src/lib.rs` holds: each module reaches (`crate::<module>`) only modules listed below its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Edges that point up the map, each a cycle still to undo (the map says
/// why); the test fails once one is gone, so the list cannot outlive it.
const CYCLES: &[(&str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Each module of the map and its line (a `- ` item, continued lines included).
fn map_lines(lib: &str) -> BTreeMap<String, usize> {
    let mut lines = BTreeMap::new();
    let (mut items, mut in_item) = (0, false);
    for text in lib.lines().map_while(|l| l.strip_prefix("//!")) {
        let text = text.trim_start();
        if text.starts_with("- ") {
            items += 1;
            in_item = true;
        } else if text.is_empty() {
            in_item = false;
        }
        if !in_item {
            continue;
        }
        let n = items;
        for name in text.split("[`").skip(1).filter_map(|t| t.split_once("`]:")) {
            lines.insert(name.0.to_string(), n);
        }
    }
    lines
}

/// The `.rs` files under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ reads") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules a file's code (comments left out) names as `crate::<module>`
/// or inside `crate::{...}`.
fn reached(code: &str) -> BTreeSet<String> {
    let ident = |t: &str| -> String {
        t.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for rest in line.split("crate::").skip(1) {
            match rest.strip_prefix('{') {
                Some(group) => {
                    let group = group.split('}').next().unwrap_or_default();
                    names.extend(group.split(',').map(ident));
                }
                None => {
                    names.insert(ident(rest));
                }
            }
        }
    }
    names
}

#[test]
fn every_module_reaches_only_modules_listed_below_it_in_the_lib_map() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs reads");
    let map = map_lines(&lib);
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    let listed: BTreeSet<String> = map.keys().cloned().collect();
    assert_eq!(declared, listed, "every module is on the map, once");

    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut up = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(src()).unwrap();
        let first = relative.iter().next().unwrap().to_string_lossy();
        let module = first.trim_end_matches(".rs");
        let Some(&own) = map.get(module) else {
            continue; // lib.rs and main.rs
        };
        let code = std::fs::read_to_string(file).unwrap();
        for other in reached(&code) {
            match map.get(&other) {
                Some(&line) if other != module && line <= own => {
                    up.insert((module.to_string(), other, relative.display().to_string()));
                }
                _ => {}
            }
        }
    }
    let unnamed: Vec<_> = up
        .iter()
        .filter(|(from, to, _)| !CYCLES.contains(&(from.as_str(), to.as_str())))
        .collect();
    assert!(
        unnamed.is_empty(),
        "modules reaching up the map (from, to, file): {unnamed:#?}"
    );
    for (from, to) in CYCLES {
        assert!(
            up.iter().any(|(f, t, _)| f == from && t == to),
            "{from} -> {to} no longer points up: take it off CYCLES and the map"
        );
    }
}
