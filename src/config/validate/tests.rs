//! Validation as data: YAML in, problems out, with no file, socket or clock: one row per rule.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::{validate, Host};
use crate::config::{Config, ConfigProblem, RawConfig, UpstreamTls};

/// (YAML, the path of one expected problem, a fragment of its message).
#[rustfmt::skip]
const REJECTED: &[(&str, &str, &str)] = &[
    // server
    ("server: { listen: [] }", "server.listen", "at least one listen address"),
    ("server: { listen: nowhere }", "server.listen", "invalid listen address \"nowhere\""),
    ("server: { listen: [\"127.0.0.1:80\", \"unknown.internal:80\"] }", "server.listen[1]", "invalid listen address"),
    ("server: { workers: 0 }", "server.workers", "must be `auto` or a number from 1 to 1024"),
    ("server: { workers: many }", "server.workers", "must be `auto`"),
    ("server: { max_connections: 0 }", "server.max_connections", "must be at least 1"),
    ("server: { max_connections_per_ip: 0 }", "server.max_connections_per_ip", "must be at least 1"),
    ("server: { encoded_separators: allow }", "server.encoded_separators", "use reject or decode"),
    // server.tls
    ("server: { tls: { cert: a.pem } }", "server.tls", "`cert` and `key` go together"),
    ("server: { tls: {} }", "server.tls", "needs `cert` and `key`, `certs`, or `acme`"),
    // server.tls.acme
    ("server: { tls: { acme: { domains: [\"*.a.test\", b.test] } } }", "server.tls.acme.domains[0]", "a wildcard needs dns-01"),
    ("server: { tls: { acme: { domains: [localhost, b.test] } } }", "server.tls.acme.domains[0]", "is not a DNS name a CA can validate"),
    ("server: { tls: { acme: { domains: [] } } }", "server.tls.acme.domains", "an empty list orders nothing"),
    ("server: { tls: { acme: {} } }", "server.tls.acme.domains", "no domain to order"),
    ("server: { tls: { acme: { domains: [a.test], directory: \"http://ca.test/dir\" } } }", "server.tls.acme.directory", "is not an https:// URL"),
    ("server: { tls: { acme: { domains: [a.test], email: ops } } }", "server.tls.acme.email", "is not an email address"),
    ("server: { tls: { acme: { domains: [a.test], challenge: dns-01 } } }", "server.tls.acme.challenge", "unknown challenge \"dns-01\""),
    ("server: { tls: { acme: { domains: [a.test], challenge: http-01 } } }", "server.tls.acme.challenge", "http-01 needs a plain listener"),
    ("server: { tls: { acme: { domains: [a.test], renew_before: 10s } } }", "server.tls.acme.renew_before", "must be at least 1m"),
    ("server: { tls: { acme: { domains: [a.test] } } }\nstore: { backend: redis, url: \"redis://127.0.0.1:6379\" }", "server.tls.acme.shared_key_file", "required with store.backend: redis"),
    ("server: { tls: { cert: a.pem, key: a.key, listen: [] } }", "server.tls.listen", "an empty list would serve no TLS"),
    ("server: { listen: \"127.0.0.1:8443\", tls: { cert: a.pem, key: a.key, listen: [\"127.0.0.1:8443\"] } }", "server.tls.listen[0]", "127.0.0.1:8443 is also in server.listen"),
    ("server: { tls: { cert: a.pem, key: a.key, listen: bad } }", "server.tls.listen", "invalid listen address"),
    ("server: { tls: { cert: a.pem, key: a.key, redirect_plain: true } }", "server.tls.redirect_plain", "needs server.tls.listen"),
    // admin
    ("admin: { listen: nowhere }", "admin.listen", "invalid listen address"),
    ("server: { listen: \"0.0.0.0:8080\" }\nadmin: { listen: \"127.0.0.1:8080\" }", "admin.listen", "the admin API must never be on the public port"),
    ("admin: { token: \"\" }", "admin.token", "an empty token would let anyone in"),
    ("admin: { token: a, token_file: /run/secrets/b }", "admin.token_file", "not both"),
    ("admin: { listen: \"0.0.0.0:9901\" }", "admin.listen", "needs admin.token or admin.token_file"),
    // store
    ("store: { backend: etcd }", "store.backend", "unknown backend \"etcd\" (sqlite, memory or redis)"),
    ("store: { backend: redis, url: \"http://cache\" }", "store.url", "is not a redis:// or rediss:// URL"),
    ("store: { on_error: retry }", "store.on_error", "unknown policy \"retry\""),
    ("store: { backend: redis, url: \"redis://a\", cluster: [\"redis://b\"] }", "store.cluster", "`url` and `cluster` contradict"),
    ("store: { backend: redis, sentinel: { master: m, nodes: [\"redis://s:26379\"] }, cluster: [\"redis://b\"] }", "store.cluster", "`sentinel` and `cluster` contradict"),
    ("store: { backend: redis, cluster: [] }", "store.cluster", "an empty list names no node"),
    ("store: { backend: redis, cluster: [\"http://b\"] }", "store.cluster[0]", "is not a redis:// or rediss:// URL"),
    ("store: { backend: redis, cluster: [\"redis://b:7000/2\"] }", "store.cluster[0]", "a Redis Cluster has only database 0"),
    ("store: { backend: redis, cluster: [\"redis://b:7000\", \"rediss://c:7000\"] }", "store.cluster", "mixes redis:// and rediss://"),
    ("store: { backend: redis, sentinel: { nodes: [\"redis://s:26379\"] } }", "store.sentinel.master", "needs the name the sentinels monitor"),
    ("store: { backend: redis, sentinel: { master: m } }", "store.sentinel.nodes", "needs at least one sentinel URL"),
    ("store: { backend: redis, sentinel: { master: m, nodes: [\"s:26379\"] } }", "store.sentinel.nodes[0]", "is not a redis:// or rediss:// URL"),
    ("store: { backend: memory, cluster: [\"redis://b\"] }", "store.cluster", "`cluster` belongs to `backend: redis`"),
    ("store: { backend: sqlit }", "store.backend", "unknown backend \"sqlit\" (sqlite, memory or redis); did you mean `sqlite`?"),
    ("store: { flush_interval: 0s }", "store.flush_interval", "must be greater than zero"),
    ("store: { prune_interval: 0s }", "store.prune_interval", "must be greater than zero"),
    ("store: { max_keys: 100 }", "store.max_keys", "100 is too small: at least 128"),
    ("store: { backend: sqlite, url: \"redis://cache:6379/0\" }", "store.url", "`url` belongs to `backend: redis`, and this store is `backend: sqlite`: remove it, or set `backend: redis`"),
    ("store: { timeout: 1s }", "store.timeout", "`timeout` belongs to `backend: redis`, and this store is `backend: sqlite`"),
    ("store: { backend: memory, path: a.db }", "store.path", "`path` belongs to `backend: sqlite`, and this store is `backend: memory`"),
    ("store: { backend: redis, flush_interval: 1s }", "store.flush_interval", "`flush_interval` belongs to `backend: sqlite`, and this store is `backend: redis`"),
    // `backend:` written after the keys it decides about.
    ("store: { url: \"redis://cache:6379/0\", backend: memory }", "store.url", "`url` belongs to `backend: redis`, and this store is `backend: memory`"),
    ("store: { path: a.db, timeout: 1s, backend: redis }", "store.path", "`path` belongs to `backend: sqlite`, and this store is `backend: redis`"),
    // identity
    ("identity: { api_key_header: \"X Key\" }", "identity.api_key_header", "invalid header name"),
    ("identity: { ipv6_prefix: 0 }", "identity.ipv6_prefix", "must be between 1 and 128"),
    ("identity: { ipv6_prefix: 129 }", "identity.ipv6_prefix", "must be between 1 and 128"),
    ("identity: { api_keys: [k1, \"sha256:12\"] }", "identity.api_keys[1]", "`sha256:` must be followed by the 64 hex digits"),
    ("identity: { api_keys: [\" \"] }", "identity.api_keys[0]", "an API key cannot be empty"),
    ("identity: { unknown_keys: { limit: 0 } }", "identity.unknown_keys.limit", "must be at least 1"),
    ("identity: { unknown_keys: { window: 0s } }", "identity.unknown_keys.window", "must be greater than zero"),
    ("identity: { trusted_proxies: [10.0.0.0/33] }", "identity.trusted_proxies[0]", "invalid CIDR or IP address"),
    ("identity: { exempt: [10.0.0.1, office] }", "identity.exempt[1]", "invalid CIDR or IP address \"office\""),
    // upstreams
    ("upstreams: { app: { url: \"http://a b\" } }", "upstreams.app.url", "invalid URL"),
    ("upstreams: { app: { url: \"ftp://a\" } }", "upstreams.app.url", "must start with http://, https:// or fastcgi://"),
    ("upstreams: { app: { url: \"http://a/?x=1\" } }", "upstreams.app.url", "cannot carry a query string"),
    ("upstreams: { app: { servers: [\"http://a\", \"gopher://b\"] } }", "upstreams.app.servers[1]", "must start with http://"),
    ("upstreams: { app: { servers: [] } }", "upstreams.app.servers", "lists no server"),
    ("upstreams: { app: { url: \"http://a\", servers: [\"http://b\"] } }", "upstreams.app", "`url` and `servers` contradict each other"),
    ("upstreams: { app: {} }", "upstreams.app", "needs `url` or `servers`"),
    ("upstreams: { app: { servers: [\"http://a\", \"https://b\"] } }", "upstreams.app.servers", "every server needs the same scheme"),
    ("upstreams: { app: { url: \"http://a\", insecure_skip_verify: true } }", "upstreams.app.insecure_skip_verify", "applies to https:// upstreams only"),
    ("upstreams: { app: { url: \"http://a\", ca: ca.pem } }", "upstreams.app.ca", "applies to https:// upstreams only"),
    ("upstreams: { app: { url: \"https://a\", ca: ca.pem, insecure_skip_verify: true } }", "upstreams.app", "`ca` and `insecure_skip_verify` contradict each other"),
    ("upstreams: { app: { url: \"http://a\", fallback: /index.php } }", "upstreams.app.fallback", "applies to fastcgi:// upstreams only"),
    ("upstreams: { \"my app\": { url: \"http://a\" } }", "upstreams.my app", "an upstream name uses only letters, digits, `_` and `-`"),
    ("upstreams: { \"app\\nx\": { url: \"http://a\" } }", "upstreams.app\nx", "an upstream name uses only letters, digits, `_` and `-`"),
    // limiters
    ("limiters: { \"per ip\": { limit: 1, window: 1s } }", "limiters.per ip", "uses only letters, digits, `_` and `-`"),
    ("limiters: { a: { algorithm: gcra, limit: 1 } }", "limiters.a.algorithm", "unknown algorithm \"gcra\" (fixed_window, sliding_window, token_bucket, leaky_bucket or concurrency)"),
    ("limiters: { a: { algorithm: token_bucket, capacity: 5, refill_per_second: 1, limit: 3 } }", "limiters.a.limit", "`limit` does not apply to token_bucket"),
    ("limiters: { a: { algorithm: concurrency, max_in_flight: 5, window: 1s } }", "limiters.a.window", "`window` does not apply to concurrency"),
    ("limiters: { a: { limit: 5 } }", "limiters.a", "fixed_window needs `window`"),
    ("limiters: { a: { algorithm: leaky_bucket, leak_per_second: 1 } }", "limiters.a", "leaky_bucket needs `capacity`"),
    ("limiters: { a: { limit: 0, window: 1s } }", "limiters.a.limit", "must be at least 1"),
    ("limiters: { a: { limit: 1, window: 0s } }", "limiters.a.window", "must be greater than zero"),
    ("limiters: { a: { algorithm: sliding_window, limit: 100001, window: 1s } }", "limiters.a.limit", "keeps an exact log of 8 bytes per request; at most 100000"),
    ("limiters: { a: { algorithm: token_bucket, capacity: 0, refill_per_second: 1 } }", "limiters.a.capacity", "must be at least 1"),
    ("limiters: { a: { algorithm: token_bucket, capacity: 1, refill_per_second: -1 } }", "limiters.a.refill_per_second", "must be a number greater than 0 and at most 1e9"),
    ("limiters: { a: { algorithm: leaky_bucket, capacity: 1, leak_per_second: 2e9 } }", "limiters.a.leak_per_second", "at most 1e9"),
    ("limiters: { a: { algorithm: concurrency, max_in_flight: 0 } }", "limiters.a.max_in_flight", "must be at least 1"),
    // lease
    ("limiters: { a: { algorithm: concurrency, max_in_flight: 2, lease: { max: 10 } } }", "limiters.a.lease", "`lease` applies to fixed_window, sliding_window and token_bucket; concurrency counts requests in flight"),
    ("limiters: { a: { algorithm: leaky_bucket, capacity: 2, leak_per_second: 1, lease: { max: 10 } } }", "limiters.a.lease", "leaky_bucket spaces requests out"),
    ("limiters: { a: { limit: 5, window: 1m, lease: {} } }", "limiters.a.lease", "`lease` needs `max`"),
    ("limiters: { a: { limit: 5, window: 1m, lease: { max: 0 } } }", "limiters.a.lease.max", "must be between 1 and 1000"),
    ("limiters: { a: { limit: 5, window: 1m, lease: { max: 1001 } } }", "limiters.a.lease.max", "must be between 1 and 1000"),
    ("limiters: { a: { limit: 5, window: 1m, count: { status: 401 }, lease: { max: 10 } } }", "limiters.a.lease", "`lease` and `count` do not go together"),
    ("limiters: { a: { algorithm: token_bucket, capacity: 5, refill_per_second: 1e-10 } }", "limiters.a.refill_per_second", "1e-10 per second is too slow to limit: with capacity 5, a full bucket's tokens must come back within 36500d (100 years), the longest time tollgate counts; the smallest value here is 1.59e-9"),
    ("limiters: { a: { algorithm: leaky_bucket, capacity: 1, leak_per_second: 1e-300 } }", "limiters.a.leak_per_second", "1e-300 per second is too slow to limit: with capacity 1, a full queue must drain within 36500d (100 years), the longest time tollgate counts; the smallest value here is 3.18e-10"),
    ("limiters: { a: { algorithm: leaky_bucket, capacity: 0, leak_per_second: 1e-10 } }", "limiters.a.leak_per_second", "the smallest value here is 3.18e-10"),
    ("limiters: { a: { limit: 1, window: 1s, mode: shadw } }", "limiters.a.mode", "unknown mode \"shadw\" (enforce or shadow); did you mean `shadow`?"),
    ("limiters: { a: { limit: 1, window: 1s, key: [] } }", "limiters.a.key", "a key list needs at least one part"),
    ("limiters: { a: { limit: 1, window: 1s, key: who } }", "limiters.a.key", "unknown key \"who\" (client, ip, api_key, route, global, pass, asn, country or header:<Name>)"),
    ("limiters: { a: { limit: 1, window: 1s, key: [ip, route, ip] } }", "limiters.a.key[2]", "key part \"ip\" is listed twice"),
    ("limiters: { a: { limit: 1, window: 1s, key: \"header:X Tenant\" } }", "limiters.a.key", "invalid header name"),
    ("limiters: { a: { limit: 1, window: 1s, mode: dry_run } }", "limiters.a.mode", "unknown mode \"dry_run\" (enforce or shadow)"),
    ("limiters: { a: { limit: 1, window: 1s, overrides: [{ key: k, limit: 2 }, { key: k, limit: 3 }] } }", "limiters.a.overrides[1].key", "this key already has an override"),
    ("limiters: { a: { limit: 1, window: 1s, overrides: [{ key: k, limit: 0 }] } }", "limiters.a.overrides[0].limit", "must be at least 1"),
    // routes
    ("routes: [{ name: a, respond: { status: 200 } }, { name: a, respond: { status: 200 } }]", "routes[1].name", "route name \"a\" is used twice"),
    ("routes: [{ name: \"\", respond: { status: 200 } }]", "routes[0].name", "a route needs a name"),
    ("routes: [{ name: \"log\\nin\", respond: { status: 200 } }]", "routes[0].name", "route name \"log\\nin\" may use only letters, digits, `_` and `-`"),
    ("routes: [{ name: wp.login, respond: { status: 200 } }]", "routes[0].name", "may use only letters, digits, `_` and `-`"),
    ("routes: [{ name: a, match: { path: a }, respond: { status: 200 } }]", "routes[0].match.path", "\"a\" must start with /"),
    ("routes: [{ name: a, match: { path_prefix: api }, respond: { status: 200 } }]", "routes[0].match.path_prefix", "must start with /"),
    ("routes: [{ name: a, match: { path: /a, path_prefix: /b }, respond: { status: 200 } }]", "routes[0].match", "use one of `path`, `path_prefix` and `path_regex`"),
    ("routes: [{ name: a, match: { methods: [GET, \"PO ST\"] }, respond: { status: 200 } }]", "routes[0].match.methods[1]", "invalid method \"PO ST\""),
    ("routes: [{ name: a, match: { query: { \"\": x } }, respond: { status: 200 } }]", "routes[0].match.query", "a query parameter needs a name"),
    ("routes: [{ name: a, upstream: nowhere }]", "routes[0].upstream", "no upstream named \"nowhere\""),
    ("routes: [{ name: a, respond: { status: 1000 } }]", "routes[0].respond.status", "invalid status 1000"),
    ("upstreams: { app: { url: \"http://a\" } }\nroutes: [{ name: a, upstream: app, respond: { status: 200 } }]", "routes[0]", "a route has one of `upstream`, `respond` and `redirect`"),
    ("routes: [{ name: a, match: { path_regex: '^/(a' }, respond: { status: 200 } }]", "routes[0].match.path_regex", "invalid regular expression"),
    ("routes: [{ name: a, match: { path_regex: '(a)\\1' }, respond: { status: 200 } }]", "routes[0].match.path_regex", "backreferences are not supported"),
    ("routes: [{ name: a, match: { path_regex: 'a{1000}{1000}' }, respond: { status: 200 } }]", "routes[0].match.path_regex", "the most a route may take"),
    ("routes: [{ name: a, match: { path_regex: '^/(a)$' }, redirect: { to: '/$2' } }]", "routes[0].redirect.to", "has 1 group(s)"),
    ("routes: [{ name: a, match: { path_regex: '^/(a)$' }, redirect: { to: '/${99999999999999999999}' } }]", "routes[0].redirect.to", "names capture"),
    ("routes: [{ name: a, match: { path_regex: '^/(.*)$' }, redirect: { to: 'https://$1/' } }]", "routes[0].redirect.to", "cannot choose the host"),
    ("routes: [{ name: a, redirect: { to: '//evil.example/' } }]", "routes[0].redirect.to", "another host"),
    ("routes: [{ name: a, redirect: { to: '/x', status: 200 } }]", "routes[0].redirect.status", "301, 302, 303, 307 or 308"),
    ("routes: [{ name: a, respond: { status: 200 }, rewrite: { to: '/x' } }]", "routes[0].rewrite", "this route answers itself"),
    ("upstreams: { app: { url: \"http://a\" } }\nroutes: [{ name: a, upstream: app, rewrite: { to: '/x', unless_exists: true } }]", "routes[0].rewrite.unless_exists", "FastCGI"),
    ("routes: [{ name: a, respond: { status: 200 }, access: { deny: [example.com] } }]", "routes[0].access.deny[0]", "not an address"),
    ("routes: [{ name: a, respond: { status: 200 }, headers: { response: { set: { Content-Length: '1' } } } }]", "routes[0].headers.response.set.Content-Length", "frames the message"),
    ("headers: { request: { remove: ['bad name'] } }\nroutes: [{ name: a, respond: { status: 200 } }]", "headers.request.remove[0]", "not a header name"),
    ("routes: [{ name: a, respond: { status: 200 }, auth: { basic: { realm: 'a\"b', users_file: /x } } }]", "routes[0].auth.basic.realm", "may not hold"),
    ("routes: [{ name: a }]", "routes[0]", "a route needs `upstream`, `respond` or `redirect`"),
    ("routes: [{ name: a, respond: { status: 200 }, limiters: [missing] }]", "routes[0].limiters[0]", "no limiter named \"missing\""),
    ("limiters: { l: { limit: 1, window: 1s, key: ip } }\nroutes: [{ name: a, respond: { status: 200 }, limiters: [l, l] }]", "routes[0].limiters[1]", "limiter \"l\" is listed twice"),
    // log
    ("log: { format: xml }", "log.format", "unknown format \"xml\" (text or json)"),
];

/// A machine with two cores on which one name resolves.
fn host() -> Host {
    Host {
        cores: 2,
        resolved: HashMap::from([(
            "tollgate.internal:8080".to_string(),
            SocketAddr::from(([10, 0, 0, 1], 8080)),
        )]),
    }
}

fn validated(yaml: &str) -> Result<Config, Vec<ConfigProblem>> {
    let raw: RawConfig = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
    validate(&raw, &host()).map_err(|e| e.problems)
}

#[test]
fn every_rule_rejects_its_mistake_at_its_path() {
    for &(yaml, path, fragment) in REJECTED {
        let problems = validated(yaml).err().unwrap_or_default();
        assert!(
            problems
                .iter()
                .any(|p| p.path == path && p.message.contains(fragment)),
            "{yaml}\n  expected {path}: …{fragment}…\n  got {problems:#?}"
        );
        assert!(
            problems.iter().all(|p| p.location.is_none()),
            "validation locates nothing; parse does: {problems:?}"
        );
    }
}

#[test]
fn each_row_is_rejected_for_its_own_reason_only() {
    // A row that fails for a second reason would hide whether its rule works.
    for &(yaml, path, _) in REJECTED {
        let problems = validated(yaml).err().unwrap_or_default();
        assert!(
            problems.iter().all(|p| p.path == path),
            "{yaml}: {problems:#?}"
        );
    }
}

#[test]
fn a_listen_name_is_taken_from_the_host_survey_and_auto_workers_from_its_cores() {
    let c = validated("server: { listen: \"tollgate.internal:8080\", workers: auto }").unwrap();
    assert_eq!(
        c.server.listen,
        vec![SocketAddr::from(([10, 0, 0, 1], 8080))]
    );
    assert_eq!(c.server.workers, 2);
    assert_eq!(validated("{}").unwrap().server.workers, 2);
}

#[test]
fn validation_reads_none_of_the_files_the_config_names() {
    let c = validated(
        "server: { tls: { cert: /nonexistent/a.pem, key: /nonexistent/a.key } }\n\
         admin: { token_file: /nonexistent/token }\n\
         identity: { api_keys_file: /nonexistent/keys }\n\
         upstreams: { app: { url: \"https://a\", ca: /nonexistent/ca.pem } }\n",
    )
    .expect("missing files are the loader's problem");
    let tls = c.server.tls.expect("tls");
    assert_eq!(tls.certs[0].cert.to_str(), Some("/nonexistent/a.pem"));
    assert!(tls.loaded.pick(None).is_none(), "no pair read yet");
    assert_eq!(c.admin.token, None);
    let (keys, content) = c.identity.api_keys_file.expect("key file named");
    assert_eq!(keys.to_str(), Some("/nonexistent/keys"));
    assert!(content.is_empty());
    assert!(matches!(&c.upstreams[0].tls, UpstreamTls::Ca { certs, .. } if certs.is_empty()));
}

#[test]
fn a_walkable_route_is_a_warning_with_its_path_not_a_problem() {
    let c = validated(
        "limiters: { per_key: { limit: 5, window: 60s, key: api_key } }\n\
         routes: [{ name: open, respond: { status: 200 }, limiters: [per_key] }]\n",
    )
    .unwrap();
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert_eq!(c.warnings[0].path, "routes[0].limiters");
    assert!(c.warnings[0]
        .message
        .contains("keys on a value the client chooses"));
}

#[test]
fn a_rate_too_slow_to_limit_is_refused_and_the_smallest_rate_it_names_is_accepted() {
    for (too_slow, smallest) in [
        (
            "limiters: { a: { algorithm: token_bucket, capacity: 5, refill_per_second: 1e-9 } }",
            "limiters: { a: { algorithm: token_bucket, capacity: 5, refill_per_second: 1.59e-9 } }",
        ),
        (
            "limiters: { a: { algorithm: leaky_bucket, capacity: 1, leak_per_second: 3e-10 } }",
            "limiters: { a: { algorithm: leaky_bucket, capacity: 1, leak_per_second: 3.18e-10 } }",
        ),
    ] {
        let problems = validated(too_slow).err().unwrap_or_default();
        assert!(
            problems.len() == 1 && problems[0].message.contains("the smallest value here is"),
            "{too_slow}: {problems:?}"
        );
        let named = problems[0].message.rsplit(' ').next().unwrap();
        assert!(smallest.contains(named), "{named} is the value tried next");
        assert!(
            validated(smallest).is_ok(),
            "{smallest}: {:?}",
            validated(smallest).err()
        );
    }
}

/// The warnings of a valid document, as (path, message).
fn warnings(yaml: &str) -> Vec<(String, String)> {
    validated(yaml)
        .unwrap_or_else(|e| panic!("{yaml}: {e:#?}"))
        .warnings
        .into_iter()
        .map(|w| (w.path, w.message))
        .collect()
}

/// Two routes, `first` then `second`, each `{ name, <match> }`, with a limiter each.
fn two_routes(first: &str, second: &str) -> String {
    format!(
        "limiters: {{ per_ip: {{ limit: 5, window: 60s, key: ip }} }}\n\
         routes:\n  - {{ name: first, match: {first}, respond: {{ status: 200 }}, limiters: [per_ip] }}\n  \
         - {{ name: second, match: {second}, respond: {{ status: 200 }}, limiters: [per_ip] }}\n"
    )
}

#[test]
fn a_login_route_behind_a_catch_all_is_a_warning_that_says_what_to_do() {
    let w = warnings(&two_routes(
        "{ path_prefix: / }",
        "{ path: /login.php, methods: [POST] }",
    ));
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, "routes[1].name");
    assert_eq!(
        w[0].1,
        "route \"second\" is never reached: route \"first\" (routes[0]) comes first and matches every request it would, so its limiters never run; move \"second\" above \"first\" or narrow \"first\"'s `match`"
    );
    // The other way round, each route has requests of its own.
    assert!(warnings(&two_routes(
        "{ path: /login.php, methods: [POST] }",
        "{ path_prefix: / }"
    ))
    .is_empty());
}

#[test]
fn shadowing_follows_path_prefix_method_host_and_query_subsumption() {
    let shadowed = [
        ("{}", "{ path: /a }"),
        ("{ path_prefix: /api }", "{ path_prefix: /api/v1 }"),
        ("{ path_prefix: /api/ }", "{ path: /api }"),
        ("{ path: /a }", "{ path: /a, methods: [GET] }"),
        (
            "{ path: /wp-login.php }",
            "{ path_prefix: /wp-login.php/x }",
        ),
        (
            "{ path_prefix: /, methods: [GET, POST] }",
            "{ path: /login, methods: [POST] }",
        ),
        ("{ host: a.example }", "{ host: a.example, path: /a }"),
        (
            "{ query: { action: login } }",
            "{ query: { action: login, x: \"1\" } }",
        ),
    ];
    for (first, second) in shadowed {
        let w = warnings(&two_routes(first, second));
        assert!(
            w.len() == 1 && w[0].0 == "routes[1].name",
            "{first} / {second}: {w:?}"
        );
    }
    let reachable = [
        ("{ path_prefix: /api }", "{ path_prefix: /apiary }"),
        ("{ path: /a }", "{ path_prefix: /a }"),
        ("{ path: /login }", "{ path: /login/x }"),
        ("{ methods: [GET] }", "{ path: /a, methods: [POST] }"),
        ("{ methods: [GET] }", "{ path: /a }"),
        ("{ host: a.example }", "{ path: /a }"),
        ("{ host: a.example }", "{ host: b.example }"),
        ("{ query: { action: login } }", "{ path: /a }"),
    ];
    for (first, second) in reachable {
        assert!(
            warnings(&two_routes(first, second)).is_empty(),
            "{first} / {second}"
        );
    }
}

#[test]
fn a_limiter_no_route_uses_is_a_warning_at_the_limiter() {
    let w = warnings("limiters: { used: { limit: 5, window: 60s, key: ip }, spare: { limit: 5, window: 60s, key: ip } }\nroutes: [{ name: a, respond: { status: 200 }, limiters: [used] }]\n");
    assert_eq!(
        w,
        [(
            "limiters.spare".to_string(),
            "no route lists limiter \"spare\", so it limits nothing; add it to a route's `limiters` or remove it".to_string()
        )]
    );
}

#[test]
fn a_ban_or_count_on_a_key_the_client_chooses_is_a_warning() {
    let doc = |key: &str, identity: &str| {
        format!(
            "{identity}limiters:\n  logins: {{ limit: 5, window: 15m, key: {key}, count: {{ status: [401] }}, ban: {{ after: 3, for: 1h }} }}\n  per_ip: {{ limit: 50, window: 1m, key: ip }}\nroutes: [{{ name: login, respond: {{ status: 200 }}, limiters: [per_ip, logins] }}]\n"
        )
    };
    let w = warnings(&doc("\"header:X-Username\"", ""));
    let paths: Vec<&str> = w.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        ["limiters.logins.ban", "limiters.logins.count"],
        "{w:?}"
    );
    assert_eq!(
        w[0].1,
        "`ban` on limiter \"logins\", keyed only on values the client chooses (header:x-username): anyone can get a victim banned by sending the victim's value; add `ip` to the key (e.g. `key: [ip, header:x-username]`)"
    );
    let unverified = warnings(&doc("[route, api_key]", ""));
    assert_eq!(unverified.len(), 2, "{unverified:?}");
    assert!(unverified[0]
        .1
        .contains("no identity.api_keys or api_keys_file verifies api_key"));
    // A key that names the sender (the IP, or a verified API key) cannot be turned on a victim.
    assert!(warnings(&doc("[ip, \"header:X-Username\"]", "")).is_empty());
    assert!(warnings(&doc("api_key", "identity: { api_keys: [k1] }\n")).is_empty());
}

#[test]
fn acme_names_default_to_the_exact_hosts_the_routes_match() {
    let config = validated(
        "server: { tls: { acme: {} } }\nroutes:\n  - { name: a, match: { host: Shop.Example }, respond: { status: 200 } }\n  - { name: w, match: { host: \"*.example\" }, respond: { status: 200 } }\n  - { name: b, match: { host: shop.example }, respond: { status: 200 } }",
    )
    .unwrap();
    let acme = config.server.tls.unwrap().acme.unwrap();
    assert_eq!(acme.domains, ["shop.example"]);
    assert_eq!(acme.directory, crate::config::acme::LETS_ENCRYPT);
    assert_eq!(
        acme.challenge,
        crate::config::acme::AcmeChallenge::TlsAlpn01
    );
}

#[test]
fn a_lease_on_a_window_or_a_bucket_is_accepted_with_its_max() {
    for algorithm in [
        "{ limit: 100, window: 1m",
        "{ algorithm: sliding_window, limit: 100, window: 1m",
        "{ algorithm: token_bucket, capacity: 100, refill_per_second: 10",
    ] {
        let yaml = format!("limiters: {{ a: {algorithm}, lease: {{ max: 50 }} }} }}\n");
        let config = validated(&yaml).unwrap_or_else(|p| panic!("{yaml}: {p:?}"));
        assert_eq!(
            config.limiters[0].lease,
            Some(crate::limiter::lease::Lease { max: 50 }),
            "{yaml}"
        );
    }
}
