//! `identity.geoip` and `identity.crowdsec` as written.

use serde::Deserialize;

use super::{Dur, Text};

/// `identity.geoip: { asn_db, country_db, check_every }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGeoip {
    pub asn_db: Option<Text>,
    pub country_db: Option<Text>,
    /// How often the files are checked for a new version (default 60s).
    pub check_every: Option<Dur>,
}

/// `identity.crowdsec: { url, api_key_file, poll_every, timeout, max_decisions, push }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCrowdsec {
    pub url: Option<Text>,
    pub api_key_file: Option<Text>,
    pub poll_every: Option<Dur>,
    pub timeout: Option<Dur>,
    pub max_decisions: Option<u64>,
    pub push: Option<RawPush>,
}

/// `identity.crowdsec.push: { machine_id, password_file, queue }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPush {
    pub machine_id: Option<Text>,
    pub password_file: Option<Text>,
    pub queue: Option<u64>,
}
