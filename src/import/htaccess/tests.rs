use super::*;

fn site(text: &str) -> Site {
    translate(
        text,
        &Options {
            root: "/var/www".into(),
            upstream_url: "fastcgi://127.0.0.1:9000".into(),
            prefix: "/".into(),
        },
    )
}

#[test]
fn files_patterns_match_the_last_segment_of_a_path() {
    let re = regex::Regex::new(&files_regex(r"^(wp-config\.php|\.ht.*)$")).unwrap();
    assert!(re.is_match("/wp-config.php"));
    assert!(re.is_match("/a/.htpasswd"));
    assert!(!re.is_match("/wp-config.php.txt"));
    assert_eq!(drop_lookarounds(r"^\.(?!well-known).*$"), r"^\..*$");
}

#[test]
fn wordpress_rules_become_a_front_controller_without_a_warning() {
    let s = site("RewriteEngine On\nRewriteBase /\nRewriteRule ^index\\.php$ - [L]\nRewriteCond %{REQUEST_FILENAME} !-f\nRewriteCond %{REQUEST_FILENAME} !-d\nRewriteRule . /index.php [L]\n");
    assert_eq!(s.front, Some(("/index.php".into(), false)));
    assert!(
        s.findings.iter().all(|f| f.severity == Severity::Note),
        "{:?}",
        s.findings
    );
}

#[test]
fn an_untranslatable_line_is_named() {
    let s = site("SetEnvIf Referer bad bad_ref\n");
    assert_eq!(s.findings.len(), 1);
    assert_eq!(
        (s.findings[0].line, s.findings[0].severity),
        (1, Severity::Warning)
    );
}

#[test]
fn partial_ipv4_entries_are_networks() {
    assert_eq!(ip_entry("10.1"), "10.1.0.0/16");
    assert_eq!(ip_entry("192.0.2.7"), "192.0.2.7");
    assert_eq!(ip_entry("2001:db8::/32"), "2001:db8::/32");
}
