//! Where a YAML path such as `routes[1].limiters[0]` sits in the text: its line and column, for error messages.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver};
use yaml_rust2::scanner::Marker;

enum PathFrame {
    Map { prefix: String, key: Option<String> },
    Seq { prefix: String, index: usize },
}

/// Every path of one document and where its node starts (1-based line and column),
/// filled by [`super::scan::scan`] as it reads the text.
#[derive(Default)]
pub struct Index {
    marks: HashMap<String, (usize, usize)>,
    /// Where each mapping key itself is written (`marks` holds its value's place).
    keys: HashMap<String, (usize, usize)>,
    stack: Vec<PathFrame>,
    /// The first document has ended: serde reads only one, so later ones are not indexed.
    done: bool,
}

impl Index {
    /// The location of `path`, or of its closest ancestor that exists.
    pub fn find(&self, path: &str) -> Option<(usize, usize)> {
        let mut p = path;
        loop {
            if let Some(m) = self.marks.get(p) {
                return Some(*m);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }

    /// Where the key that ends `path` is written (an unknown key is shown there, not at its value).
    pub fn find_key(&self, path: &str) -> Option<(usize, usize)> {
        self.keys.get(path).copied()
    }

    /// Whether `path` is a node of the document.
    pub fn has(&self, path: &str) -> bool {
        self.marks.contains_key(path)
    }

    /// The path the next node takes, and whether that node is a map key.
    fn next_path(&mut self) -> (Option<String>, bool) {
        match self.stack.last_mut() {
            None => (Some(String::new()), false),
            Some(PathFrame::Map { prefix, key }) => match key.take() {
                None => (None, true),
                Some(k) => (Some(join(prefix, &k)), false),
            },
            Some(PathFrame::Seq { prefix, index }) => {
                let p = format!("{prefix}[{index}]");
                *index += 1;
                (Some(p), false)
            }
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

impl MarkedEventReceiver for Index {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.done {
            return;
        }
        let pos = (mark.line(), mark.col() + 1);
        match ev {
            Event::Scalar(value, ..) => {
                let (path, is_key) = self.next_path();
                if is_key {
                    if let Some(PathFrame::Map { prefix, key }) = self.stack.last_mut() {
                        let path = join(prefix, &value);
                        self.keys.entry(path.clone()).or_insert(pos);
                        self.marks.entry(path).or_insert(pos);
                        *key = Some(value);
                    }
                } else if let Some(p) = path {
                    if value.is_empty() {
                        // An empty value (`strict:` and nothing after it) is
                        // marked where the next line starts; its key is the place.
                        self.marks.entry(p).or_insert(pos);
                    } else {
                        self.marks.insert(p, pos);
                    }
                }
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let (path, _) = self.next_path();
                let prefix = path.unwrap_or_default();
                self.marks.entry(prefix.clone()).or_insert(pos);
                self.stack.push(if matches!(ev, Event::MappingStart(..)) {
                    PathFrame::Map { prefix, key: None }
                } else {
                    PathFrame::Seq { prefix, index: 0 }
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            Event::Alias(_) => {
                self.next_path();
            }
            Event::DocumentEnd => self.done = true,
            _ => {}
        }
    }
}
