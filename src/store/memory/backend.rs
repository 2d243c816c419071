//! The memory backend: the in-process table alone, lost on restart.

use crate::store::backend::Backend;

/// Every decision is the local one (the seam's defaults); nothing persists.
pub struct Memory;

impl Backend for Memory {
    fn label(&self) -> &'static str {
        "memory"
    }
}
