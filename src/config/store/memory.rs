//! `backend: memory`: no keys of its own.

use serde::de::MapAccess;
use serde_json::Value;

use super::{Section, Shown, Validate};
use crate::config::validate::Validator;

/// `backend: memory` takes no key of its own.
#[derive(Debug, Clone, Default)]
pub struct RawMemory;

/// The memory store: nothing to set.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryConfig;

impl Section for RawMemory {
    const NAME: &'static str = "memory";
    const KEYS: &'static [&'static str] = &[];
    const SHARED: bool = false;
    type Config = MemoryConfig;

    fn read<'de, A: MapAccess<'de>>(&mut self, _key: &str, _map: &mut A) -> Result<(), A::Error> {
        Ok(())
    }

    fn given(&self) -> Vec<bool> {
        Vec::new()
    }

    fn view(_config: Option<&MemoryConfig>, _shown: &Shown) -> Vec<(&'static str, Value)> {
        Vec::new()
    }
}

impl Validate for RawMemory {
    fn validate(&self, _v: &mut Validator) -> MemoryConfig {
        MemoryConfig
    }
}
