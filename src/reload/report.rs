//! What `tollgate reload` prints for the admin API's answer to `POST /reload`, and its exit status.
//!
//! Pure (the binary does the HTTP exchange), so the rules are tested here:
//! every warning of an applied config is printed, never dropped; a rejected
//! reload prints each error; `--strict` fails on any warning (the server
//! refuses such a config when asked with `?strict=true`; should an older
//! one apply it anyway, the command still exits 1 and says so).

use serde_json::Value;

/// Lines for stdout and stderr, and whether the command succeeded.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub out: Vec<String>,
    pub err: Vec<String>,
    pub ok: bool,
}

/// Reads the answer to `POST /reload` (its status line and body).
pub fn report(status_line: &str, body: &str, strict: bool) -> Report {
    let answer: Value = serde_json::from_str(body).unwrap_or_default();
    let version = &answer["version"];
    let mut r = Report::default();
    if status_line.starts_with("HTTP/1.1 200") {
        let warnings = strings(&answer["warnings"]);
        for w in &warnings {
            r.err.push(format!("warning: {w}"));
        }
        let n = warnings.len();
        r.out.push(match n {
            0 => format!("reloaded: config version {version}"),
            _ => format!(
                "reloaded: config version {version}, with {n} warning{}",
                plural(n)
            ),
        });
        r.ok = !(strict && n > 0);
        if !r.ok {
            r.err.push(format!(
                "{n} warning{} and --strict: not ok (this tollgate applied the config anyway)",
                plural(n)
            ));
        }
        return r;
    }
    match answer["errors"].as_array() {
        Some(_) => {
            r.err.push(format!(
                "reload rejected; config version {version} stays in force:"
            ));
            r.err
                .extend(strings(&answer["errors"]).iter().map(|e| format!("  {e}")));
        }
        None => r.err.push(format!("reload failed: {status_line}\n{body}")),
    }
    r
}

fn strings(list: &Value) -> Vec<&str> {
    list.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APPLIED_WITH_A_WARNING: &str = r#"{"result":"ok","version":5,"warnings":["line 9 column 11: routes[1].name: route \"login\" is never reached: route \"all\" (routes[0]) matches every request it would"]}"#;

    #[test]
    fn an_applied_reload_prints_every_warning_and_succeeds() {
        let r = report("HTTP/1.1 200 OK", APPLIED_WITH_A_WARNING, false);
        assert!(r.ok);
        assert_eq!(r.out, ["reloaded: config version 5, with 1 warning"]);
        assert_eq!(r.err.len(), 1, "{:?}", r.err);
        assert!(
            r.err[0].starts_with(
                "warning: line 9 column 11: routes[1].name: route \"login\" is never reached"
            ),
            "{:?}",
            r.err
        );
    }

    #[test]
    fn an_applied_reload_without_warnings_says_only_its_version() {
        let r = report(
            "HTTP/1.1 200 OK",
            r#"{"result":"ok","version":2,"warnings":[]}"#,
            true,
        );
        assert_eq!(
            r,
            Report {
                out: vec!["reloaded: config version 2".into()],
                err: vec![],
                ok: true
            }
        );
    }

    #[test]
    fn strict_fails_on_a_warning_even_when_the_server_applied_the_config() {
        let r = report("HTTP/1.1 200 OK", APPLIED_WITH_A_WARNING, true);
        assert!(!r.ok);
        assert!(
            r.err.last().unwrap().contains("--strict: not ok"),
            "{:?}",
            r.err
        );
    }

    #[test]
    fn a_rejected_reload_prints_each_error_and_fails() {
        let body = r#"{"result":"error","version":4,"errors":["warning (strict: not applied): routes[1].name: never reached","x"]}"#;
        let r = report("HTTP/1.1 422 Unprocessable Entity", body, true);
        assert!(!r.ok);
        assert_eq!(
            r.err,
            [
                "reload rejected; config version 4 stays in force:",
                "  warning (strict: not applied): routes[1].name: never reached",
                "  x"
            ]
        );
    }

    #[test]
    fn an_answer_that_is_not_the_api_s_is_shown_whole() {
        let r = report("HTTP/1.1 403 Forbidden", "nope", false);
        assert!(!r.ok);
        assert_eq!(r.err, ["reload failed: HTTP/1.1 403 Forbidden\nnope"]);
    }
}
