//! `headers:` rules: set, add and remove on the request (before it is forwarded) and on the response (in one place, whoever answered).

use http::{HeaderMap, HeaderName, HeaderValue};

/// One direction's rules, applied in the order remove → set → add.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderRules {
    /// Replace every value of the name with this one.
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Add one more value.
    pub add: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
}

/// `headers: { request, response }` of a route or of the whole site.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    pub request: Option<HeaderRules>,
    pub response: Option<HeaderRules>,
}

impl HeaderRules {
    /// Applies the rules to a request's headers or an upstream's answer.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
    }

    /// Applies the rules to one of tollgate's own answers: they add what the
    /// answer lacks and never replace nor remove a header tollgate wrote on
    /// it (a 429's `Cache-Control: no-store`, a redirect's `Location`, a
    /// 401's `WWW-Authenticate`).
    pub fn apply_to_own(&self, headers: &mut HeaderMap) {
        for (name, value) in self.set.iter().chain(&self.add) {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> HeaderRules {
        HeaderRules {
            set: vec![(
                HeaderName::from_static("cache-control"),
                HeaderValue::from_static("max-age=60"),
            )],
            add: vec![(
                HeaderName::from_static("x-a"),
                HeaderValue::from_static("2"),
            )],
            remove: vec![HeaderName::from_static("x-powered-by")],
        }
    }

    #[test]
    fn upstream_answers_get_every_rule() {
        let mut h = HeaderMap::new();
        h.insert("x-powered-by", HeaderValue::from_static("PHP"));
        h.insert("cache-control", HeaderValue::from_static("no-cache"));
        h.insert("x-a", HeaderValue::from_static("1"));
        rules().apply(&mut h);
        assert!(!h.contains_key("x-powered-by"));
        assert_eq!(h["cache-control"], "max-age=60");
        assert_eq!(h.get_all("x-a").iter().count(), 2);
    }

    #[test]
    fn own_answers_keep_what_tollgate_wrote() {
        let mut h = HeaderMap::new();
        h.insert("cache-control", HeaderValue::from_static("no-store"));
        rules().apply_to_own(&mut h);
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["x-a"], "2");
    }
}
