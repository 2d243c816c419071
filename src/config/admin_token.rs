//! Who may call the admin API: the exposure rule for `admin.listen`, `admin.token` and `admin.token_file`.
//!
//! The rule is pure (it only sees what the YAML says); reading the token
//! file is the loader's job (`load.rs`) and happens after validation, on
//! every load and reload, so a rotated secret is picked up by `SIGHUP` or
//! `POST /reload`.

use std::net::SocketAddr;
use std::path::Path;

/// What is wrong with this admin section, as (YAML path, message).
pub(super) fn problems(
    listen: SocketAddr,
    token: Option<&str>,
    token_file: Option<&Path>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if token == Some("") {
        out.push((
            "admin.token",
            "an empty token would let anyone in; remove the key or set a value".to_string(),
        ));
    }
    if token.is_some() && token_file.is_some() {
        out.push((
            "admin.token_file",
            "set admin.token or admin.token_file, not both".to_string(),
        ));
    }
    if token.is_none() && token_file.is_none() && !listen.ip().is_loopback() {
        out.push((
            "admin.listen",
            format!(
                "{listen} is reachable from other hosts, so the admin API (counter resets, reloads) needs \
                 admin.token or admin.token_file; or listen on 127.0.0.1"
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::parse;

    fn problems(yaml: &str) -> Vec<String> {
        match parse(yaml) {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn an_admin_listener_off_loopback_needs_a_token() {
        for listen in ["0.0.0.0:9901", "[::]:9901", "192.0.2.1:9901"] {
            let errs = problems(&format!("admin: {{ listen: \"{listen}\" }}\n"));
            assert_eq!(errs.len(), 1, "{listen}: {errs:?}");
            assert!(
                errs[0].contains("admin.listen") && errs[0].contains("needs admin.token"),
                "{errs:?}"
            );
            assert!(errs[0].starts_with("line 1"), "located: {errs:?}");
        }
        assert!(problems("admin: { listen: \"0.0.0.0:9901\", token: s3cret }\n").is_empty());
        assert!(problems("admin: { listen: \"127.0.0.2:9901\" }\n").is_empty());
        assert!(problems("admin: { listen: \"[::1]:9901\" }\n").is_empty());
    }

    #[test]
    fn a_token_file_is_read_by_the_loader_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-a-secret\n").unwrap();
        let yaml = format!(
            "admin: {{ listen: \"0.0.0.0:9901\", token_file: \"{}\" }}\n",
            file.display()
        );
        let c = parse(&yaml).unwrap();
        assert_eq!(c.admin.token.as_deref(), Some("from-a-secret"));
        std::fs::write(&file, "  \n").unwrap();
        let errs = problems(&yaml);
        assert!(
            errs.len() == 1 && errs[0].contains("admin.token_file") && errs[0].contains("is empty"),
            "{errs:?}"
        );
        let missing = yaml.replace("token\"", "nowhere\"");
        let errs = problems(&missing);
        assert!(
            errs.len() == 1 && errs[0].contains("cannot read"),
            "{errs:?}"
        );
    }

    #[test]
    fn a_token_and_a_token_file_together_are_an_error() {
        let errs = problems("admin: { token: a, token_file: /run/secrets/b }\n");
        assert!(errs.iter().any(|e| e.contains("not both")), "{errs:?}");
    }
}
