//! Checks on the YAML text before serde reads it: no key given twice in one mapping, no absurd nesting.
//!
//! serde fills a map from the last of two equal keys, so a limiter defined
//! twice would silently take the second definition; YAML says keys are
//! unique, so a repeated key is an error naming both places. Nesting is
//! capped so a hostile or broken file (100,000 `[`) is refused at once
//! instead of costing the YAML reader quadratic time.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};

use super::locate::Index;
use super::ConfigProblem;

/// Deeper than any tollgate config needs (it uses about 6 levels).
pub const MAX_DEPTH: usize = 64;

enum Frame {
    Map {
        path: String,
        /// Keys seen so far, with their 1-based line and column.
        keys: HashMap<String, (usize, usize)>,
        /// The key whose value comes next; `None` when a key comes next.
        key: Option<String>,
    },
    Seq {
        path: String,
        index: usize,
    },
}

/// Every repeated key, or the first place nesting goes too deep. A text the
/// YAML reader cannot read passes here: serde reports it with more detail.
/// The same pass fills `index` with where each path is written, so the text
/// is read by this YAML reader once.
pub fn scan(text: &str, index: &mut Index) -> Vec<ConfigProblem> {
    let mut problems = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = match parser.next_token() {
            Ok(e) => e,
            // The YAML reader has a nesting cap of its own, met when it
            // reads ahead through a run of brackets before we count them.
            Err(e) if e.info().contains("recursion limit") => {
                problems.push(too_deep((e.marker().line(), e.marker().col() + 1)));
                return problems;
            }
            Err(_) => return problems,
        };
        index.on_event(event.clone(), mark);
        let pos = (mark.line(), mark.col() + 1);
        // Scalars and aliases as mapping keys; everything else is a value.
        let is_key = matches!(stack.last(), Some(Frame::Map { key: None, .. }));
        match event {
            Event::StreamEnd => return problems,
            Event::Scalar(value, ..) if is_key => {
                problems.extend(key_written(&mut stack, value, pos));
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                if stack.len() >= MAX_DEPTH {
                    problems.push(too_deep(pos));
                    return problems;
                }
                // A collection used as a mapping key is not something a
                // tollgate config has; its path is just the parent's.
                let path = value_path(&mut stack, is_key);
                stack.push(if matches!(event, Event::MappingStart(..)) {
                    Frame::Map {
                        path,
                        keys: HashMap::new(),
                        key: None,
                    }
                } else {
                    Frame::Seq { path, index: 0 }
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
            }
            Event::Scalar(..) | Event::Alias(_) => {
                value_path(&mut stack, is_key);
            }
            _ => {}
        }
    }
}

/// A mapping key read at `pos`: kept as the key now open, and a problem
/// if the mapping already has it.
fn key_written(stack: &mut [Frame], value: String, pos: (usize, usize)) -> Option<ConfigProblem> {
    let Some(Frame::Map { path, keys, key }) = stack.last_mut() else {
        return None;
    };
    let problem = match keys.get(&value) {
        Some((line, col)) => Some(ConfigProblem {
            path: join(path, &value),
            location: Some(pos),
            message: format!(
                "duplicate key `{value}` (first defined at line {line} column {col}); \
                 only one definition is allowed"
            ),
        }),
        None => {
            keys.insert(value.clone(), pos);
            None
        }
    };
    *key = Some(value);
    problem
}

/// The path of the value now starting, moving its parent on to the next slot.
/// Paths are only built for collections, whose depth is capped, so building
/// them costs at most `MAX_DEPTH` segments each.
fn value_path(stack: &mut [Frame], is_key: bool) -> String {
    match stack.last_mut() {
        None => String::new(),
        Some(Frame::Map { path, key, .. }) => {
            if is_key {
                return path.clone();
            }
            match key.take() {
                Some(k) => join(path, &k),
                None => path.clone(),
            }
        }
        Some(Frame::Seq { path, index }) => {
            let p = format!("{path}[{index}]");
            *index += 1;
            p
        }
    }
}

fn too_deep(location: (usize, usize)) -> ConfigProblem {
    ConfigProblem {
        path: String::new(),
        location: Some(location),
        message: format!("nested more than {MAX_DEPTH} levels deep"),
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Vec<ConfigProblem> {
        super::scan(text, &mut Index::default())
    }

    #[test]
    fn a_limiter_defined_twice_is_named_with_both_places() {
        let yaml = "limiters:\n  strict: { limit: 5, window: 60s }\n  other: { limit: 1, window: 1s }\n  strict: { limit: 500000, window: 60s }\n";
        let p = scan(yaml);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].path, "limiters.strict");
        assert_eq!(p[0].location, Some((4, 3)));
        assert!(p[0].message.contains("line 2 column 3"), "{}", p[0].message);
    }

    #[test]
    fn repeated_keys_are_found_at_any_depth_and_in_flow_style() {
        let yaml = "routes:\n  - name: a\n    match: { path: /a, path: /b }\n  - name: b\n    name: c\nserver: {}\nserver: {}\n";
        let paths: Vec<String> = scan(yaml).into_iter().map(|p| p.path).collect();
        assert_eq!(paths, ["routes[0].match.path", "routes[1].name", "server"]);
    }

    #[test]
    fn the_same_key_in_different_mappings_is_fine() {
        let yaml =
            "routes:\n  - { name: a, match: { path: /a } }\n  - { name: b, match: { path: /b } }\n";
        assert!(scan(yaml).is_empty());
    }

    #[test]
    fn deep_nesting_is_refused_at_the_cap() {
        let ok = format!(
            "a: {}{}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(scan(&ok).is_empty());
        let over = format!("a: {}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(scan(&over).len(), 1);
        let deep = format!("a: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        let p = scan(&deep);
        assert_eq!(p.len(), 1);
        assert!(p[0].message.contains("nested more than 64"));
    }
}
