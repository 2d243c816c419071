//! `GET /certificates`: every name `server.tls.acme` manages, with its certificate's dates, issuer and serial, and the last order attempt and its error.

use serde_json::{json, Value};

use crate::acme::state::Managed;
use crate::clock::iso8601;
use crate::snapshot::Snapshot;

/// The list, sorted by name; times are ISO 8601 (UTC), `null` when unknown.
pub fn list(managed: &Managed, snap: &Snapshot) -> Value {
    let acme = snap
        .config
        .server
        .tls
        .as_ref()
        .and_then(|t| t.acme.as_ref());
    let time = |t: Option<u64>| t.map(iso8601);
    let certificates: Vec<Value> = managed
        .statuses()
        .into_iter()
        .map(|(domain, s)| {
            json!({
                "domain": domain,
                "not_before": time(s.not_before),
                "not_after": time(s.not_after),
                "issuer": s.issuer,
                "serial": s.serial,
                "last_attempt": time(s.last_attempt),
                "last_error": s.last_error,
                "next_attempt": time(s.next_attempt),
                "renewals": s.renewals,
                "failures": s.failures,
            })
        })
        .collect();
    json!({
        "directory": acme.map(|a| a.directory.clone()),
        "challenge": acme.map(|a| a.challenge.as_str()),
        "certificates": certificates,
    })
}
