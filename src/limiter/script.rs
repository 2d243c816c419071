//! What an algorithm hands the Redis store's script: whole numbers its Lua computes with exactly, and what its `.lua` part must define.
//!
//! The Redis store (`src/store/redis.rs`) runs every limiter of a request in
//! one atomic Lua script, assembled at build time from a head (time, the
//! helpers every algorithm shares, the registry), one part per algorithm
//! (`limiter/<name>.lua`, beside its `.rs`) and the modes that dispatch
//! through the registry. An algorithm's part registers one table under its
//! [`super::Rule::SCRIPT_TAG`], in a block of its own:
//!
//! ```lua
//! do
//!   local fw = { type = 'hash' }   -- its key's Redis type: hash, list or zset
//!   algorithms.fw = fw
//!   function fw.load(k, p, ok, shape) return st end     -- `ok`: the key holds its state
//!   function fw.check(k, p, st) return ruling, ns end   -- 0 allow, 1 delay, 2 deny
//!   function fw.record(k, a, st, admitted) end          -- a.p, a.shape, a.member
//!   function fw.quota(k, p, st) return remaining, reset_after end
//!   function fw.refund(k, place, units, span, decided) return 0 or 1 end  -- `count:`, leases
//!   function fw.release(k, member, span, ticket, shape) return 0 or 1 end -- a slot, a place
//!   function fw.lease(k, a, st, size, term) return units end             -- `lease:`
//! end
//! ```
//!
//! `refund`, `release` and `lease` only where the algorithm accepts `count:`,
//! holds something ([`super::Hold`]) or takes `lease:`. `p` are the five
//! numbers of [`super::Rule::script_params`]; `st.mark` is reported as the
//! outcome's mark. Lua numbers are doubles: an instant is kept as a decimal
//! string and only handled relative to now, exact while below [`MAX_EXACT`].

use super::Nanos;

/// Lua computes with doubles: relative nanoseconds must stay below 2^53 (~104 days).
pub const MAX_EXACT: u64 = 1 << 53;

/// `ns` if the script can still add it to an instant exactly (at most ~52
/// days, half of [`MAX_EXACT`]), else `Err(ns)`.
pub fn exact(ns: Nanos) -> Result<Nanos, Nanos> {
    if ns < MAX_EXACT / 2 {
        Ok(ns)
    } else {
        Err(ns)
    }
}

pub fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NANOS_PER_SEC;

    #[test]
    fn fixed_window_parameters_keep_lua_arithmetic_exact() {
        assert_eq!(gcd(NANOS_PER_SEC, 60 * NANOS_PER_SEC), NANOS_PER_SEC);
        assert_eq!(gcd(NANOS_PER_SEC, 1_500_000_000), 500_000_000);
        assert_eq!(gcd(NANOS_PER_SEC, 7), 1);
    }
}
