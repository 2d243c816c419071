//! Validation of a limiter's `lease:` (raw YAML → [`Lease`]); pure, every problem with its path.

use serde::Deserialize;

use super::Validator;
use crate::limiter::lease::{Lease, MAX_UNITS};
use crate::limiter::{Algorithm, AlgorithmKind};

/// `lease: { max: 50 }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLease {
    pub max: Option<u64>,
}

impl Validator<'_> {
    /// A lease on an algorithm that counts units in a window or a bucket,
    /// without `count:` (which gives a unit back per answer, when a leased
    /// unit was never counted per request).
    pub(super) fn lease_rule(
        &mut self,
        name: &str,
        raw: &RawLease,
        algorithm: &Algorithm,
        counted: bool,
    ) -> Option<Lease> {
        let at = |field: &str| format!("limiters.{name}.lease{field}");
        let before = self.problems.len();
        if let Some(why) = algorithm.kind().lease_refusal() {
            self.err(
                at(""),
                format!(
                    "`lease` applies to {}; {} {why}",
                    AlgorithmKind::leasing(),
                    algorithm.name()
                ),
            );
        }
        if counted {
            self.err(
                at(""),
                "`lease` and `count` do not go together: `count` gives a request's unit back \
                 after its answer, and a leased unit is spent without asking the store",
            );
        }
        match raw.max {
            None => self.err(
                at(""),
                "`lease` needs `max` (the most units reserved at a time)",
            ),
            Some(max) if !(1..=MAX_UNITS).contains(&max) => {
                self.err(at(".max"), format!("must be between 1 and {MAX_UNITS}"))
            }
            Some(_) => {}
        }
        if self.problems.len() > before {
            return None;
        }
        raw.max.map(|max| Lease { max })
    }
}
