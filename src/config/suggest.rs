//! "Did you mean …?": the defined name closest to a misspelt one, by edit distance.

/// The name among `defined` that `written` most likely misspells: the
/// closest by edit distance when at most half the longer name differs
/// (`token-bucket` → `token_bucket`, `phpfpm` → `php`), else one that the
/// written word contains or is contained in (`per_ip` → `ip`).
pub fn closest<'a>(written: &str, defined: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let written_lower = written.to_ascii_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for name in defined {
        if name == written {
            continue;
        }
        let lower = name.to_ascii_lowercase();
        let distance = edit_distance(&written_lower, &lower);
        let near = distance * 2 <= written.len().max(name.len());
        // A short word inside a long one says little: `x` is in `fixed_window`.
        let inside = (lower.len() >= 2 && written_lower.contains(&lower))
            || (written_lower.len() >= 3 && lower.contains(&written_lower));
        if (near || inside) && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, name));
        }
    }
    best.map(|(_, name)| name)
}

/// ` (did you mean `x`?)` when a defined name is close, else nothing: the
/// tail of an "unknown name" message.
pub fn hint<'a>(written: &str, defined: impl IntoIterator<Item = &'a str>) -> String {
    closest(written, defined)
        .map(|n| format!("; did you mean `{n}`?"))
        .unwrap_or_default()
}

/// Levenshtein distance over bytes (config names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closest_defined_name_is_suggested_and_a_far_one_is_not() {
        assert_eq!(closest("phpfpm", ["php", "app"]), Some("php"));
        assert_eq!(closest("per-ip", ["per_ip", "global"]), Some("per_ip"));
        assert_eq!(closest("per_ip", ["client", "ip", "api_key"]), Some("ip"));
        assert_eq!(
            closest("token-bucket", ["fixed_window", "token_bucket"]),
            Some("token_bucket")
        );
        assert_eq!(
            closest("limt", ["algorithm", "limit", "window"]),
            Some("limit")
        );
        assert_eq!(closest("gcra", ["fixed_window", "concurrency"]), None);
        assert_eq!(closest("x", ["fixed_window"]), None);
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", "abc"), 0);
    }
}
