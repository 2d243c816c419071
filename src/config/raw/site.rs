//! The site rules as written: `redirect`, `rewrite`, `access`, `auth` and `headers` on a route, and `access` and `headers` at the top level.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::Text;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedirect {
    /// Not a [`Text`]: `${name}` names a capture here, not an environment variable.
    pub to: String,
    /// 301 (default), 302, 303, 307 or 308.
    pub status: Option<u16>,
    /// Add the request's query after `to`'s own (Apache's `QSA`).
    pub append_query: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRewrite {
    /// As [`RawRedirect::to`].
    pub to: String,
    /// Only when the path names no file or directory under the FastCGI root.
    pub unless_exists: Option<bool>,
    pub append_query: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccess {
    #[serde(default)]
    pub allow: Vec<Text>,
    #[serde(default)]
    pub deny: Vec<Text>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub basic: RawBasic,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBasic {
    pub realm: Option<Text>,
    pub users_file: Text,
    /// Send the client's `Authorization` header on to the upstream (default: removed).
    pub forward_authorization: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaders {
    pub request: Option<RawHeaderRules>,
    pub response: Option<RawHeaderRules>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderRules {
    #[serde(default)]
    pub set: BTreeMap<String, Text>,
    #[serde(default)]
    pub add: BTreeMap<String, Text>,
    #[serde(default)]
    pub remove: Vec<Text>,
}
