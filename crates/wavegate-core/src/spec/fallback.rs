//! The fallback's table: the gate [`LocalGate::fallback`] starts with, one rule a case.

#[allow(unused_imports)]
use crate::gate::LocalGate;

/// One case of [`LocalGate::fallback`].
#[derive(Debug, Clone)]
pub struct FallbackCase {
    /// What the case shows.
    pub name: &'static str,
}

/// What a fallback case expects.
#[derive(Debug, Clone)]
pub struct FallbackExpect;

/// The fallback's table.
pub fn fallback_cases() -> Vec<FallbackCase> {
    Vec::new()
}
