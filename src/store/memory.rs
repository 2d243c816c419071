//! The memory backend: the in-process table alone, lost on restart.

use crate::config::store::RawMemory;
use crate::config::{LimiterConfig, MemoryConfig};
use crate::limiter::Nanos;
use crate::store::backend::{Backend, Local};
use crate::store::StoreError;

/// Every decision is the local one (the seam's defaults); nothing persists.
pub struct Memory;

impl Backend for Memory {
    type Section = RawMemory;

    fn open(
        _config: &MemoryConfig,
        _local: &Local,
        _limiters: &[LimiterConfig],
        _now: Nanos,
    ) -> Result<Memory, StoreError> {
        Ok(Memory)
    }
}
