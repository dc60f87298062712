//! Tenants within a priority class: which tenant's caller a permit of the class goes to.
//!
//! A request may name a tenant (a user, an API key) with `.tenant(key)`. Among the tenants of a
//! class that wait **anywhere in the fleet**, the next permit of the class goes to the tenant
//! holding the fewest permits in flight (fleet-wide in shared mode, the process's own in local
//! mode and fallback); ties go to the tenant that has waited longest, then to the one listed
//! first. Callers that name no tenant count as one tenant, [`NO_TENANT`]. Tenants have equal
//! weights.
//!
//! The key never leaves the process as such: permit ids and the waiting list in Redis carry
//! [`tenant_tag`], a 64-bit FNV-1a hash of it in hex, and metrics carry no tenant at all.
//!
//! [`next_tenant`] has a twin in `lua/priority.lua`; both pass `cases` (the `spec` feature).
//!
//! ```
//! use wavegate_core::tenant::{TenantView, next_tenant};
//!
//! // Tenant 0 holds 3 permits across the fleet, tenant 1 none: tenant 1's caller is next.
//! let tenants = [
//!     TenantView { in_flight: 3, demand: 40, since_ms: 0 },
//!     TenantView { in_flight: 0, demand: 2, since_ms: 900 },
//! ];
//! assert_eq!(next_tenant(&tenants), Some(1));
//! ```

/// The tag of the callers that name no tenant (they count as one tenant).
pub const NO_TENANT: &str = "-";

/// How a tenant key appears outside the process: 16 hex digits of its 64-bit FNV-1a hash
/// (stable across processes, builds and Rust versions; never [`NO_TENANT`]). The typed form
/// is [`TenantTag`](crate::TenantTag).
pub fn tenant_tag(key: &str) -> String {
    format!("{:016x}", tenant_hash(key))
}

/// The 64-bit FNV-1a hash of a tenant key, which [`tenant_tag`] writes in hex.
pub fn tenant_hash(key: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    key.bytes().fold(OFFSET, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
}

/// One tenant of a class as the choice sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantView {
    /// Its permits in flight in the class.
    pub in_flight: u32,
    /// Its callers waiting in the class (0: it takes no part).
    pub demand: u32,
    /// Since when its longest waiter waits (ms, any common clock).
    pub since_ms: u64,
}

/// The waiting tenant the class's next permit goes to, if any waits: the fewest permits in
/// flight, then the longest wait, then the first listed.
pub fn next_tenant(tenants: &[TenantView]) -> Option<usize> {
    tenants
        .iter()
        .enumerate()
        .filter(|(_, t)| t.demand > 0)
        .min_by_key(|(i, t)| (t.in_flight, t.since_ms, *i))
        .map(|(i, _)| i)
}

/// One case of the tenant choice.
#[cfg(any(test, feature = "spec"))]
#[derive(Debug, Clone)]
pub struct TenantCase {
    /// What the case shows.
    pub name: &'static str,
    /// The tenants, in the order they are listed.
    pub tenants: Vec<TenantView>,
    /// The tenant chosen, or `None`.
    pub expect: Option<usize>,
}

/// The table both twins pass ([`next_tenant`] and `lua/priority.lua`).
#[cfg(any(test, feature = "spec"))]
pub fn cases() -> Vec<TenantCase> {
    let t = |in_flight, demand, since_ms| TenantView { in_flight, demand, since_ms };
    vec![
        TenantCase { name: "nobody waits", tenants: vec![t(0, 0, 0), t(2, 0, 0)], expect: None },
        TenantCase {
            name: "the fewest permits in flight, although it waited less",
            tenants: vec![t(3, 40, 0), t(0, 2, 900)],
            expect: Some(1),
        },
        TenantCase {
            name: "a tenant that does not wait takes no part, however few it holds",
            tenants: vec![t(0, 0, 0), t(5, 1, 50)],
            expect: Some(1),
        },
        TenantCase { name: "equal: the longest wait", tenants: vec![t(1, 3, 70), t(1, 3, 20)], expect: Some(1) },
        TenantCase { name: "a full tie: the first listed", tenants: vec![t(2, 1, 5), t(2, 1, 5)], expect: Some(0) },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_of_the_table() {
        for case in cases() {
            assert_eq!(next_tenant(&case.tenants), case.expect, "{}", case.name);
        }
    }

    #[test]
    fn tags_are_stable_hex_and_never_the_untagged_mark() {
        // FNV-1a 64 of "" and of "a" (published test vectors).
        assert_eq!(tenant_tag(""), "cbf29ce484222325");
        assert_eq!(tenant_tag("a"), "af63dc4c8601ec8c");
        assert_ne!(tenant_tag("sk-live-1"), tenant_tag("sk-live-2"));
        assert!(tenant_tag("x").len() == 16 && tenant_tag("x") != NO_TENANT);
    }
}
