//! Pools: one logical upstream over several keys or deployments of one model.
//!
//! Real deployments spread load over several API keys or deployments, each with its own quota
//! (LiteLLM's router, Portkey, Azure backend pools). A pool names configured upstreams as its
//! members; each member keeps everything an upstream has — its limit, wave, budgets, breaker,
//! provider windows, in Redis under its own name — and a pooled request goes to the member with
//! the most headroom ([`PoolPolicy::MostHeadroom`], the default) or by weight
//! ([`PoolPolicy::Weighted`]), and moves to another member on a 429 or a 5xx, within its
//! deadline. This module is the pure part: the validated configuration and the choice.
//!
//! ```
//! use wavegate_core::{MemberView, PoolConfig, PoolPolicy};
//!
//! let pool = PoolConfig::builder("gpt").member("gpt-key-a", 1).member("gpt-key-b", 1).build()?;
//! let views = [
//!     MemberView { headroom: 2, weight: 1, available: true, picked: 0 },
//!     MemberView { headroom: 7, weight: 1, available: true, picked: 0 },
//! ];
//! assert_eq!(pool.policy().order(&views), vec![1, 0]);
//! # Ok::<(), wavegate_core::PoolConfigError>(())
//! ```

use crate::config::{UpstreamName, UpstreamSet};

/// How a pooled request picks its member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum PoolPolicy {
    /// The member with the most headroom (free permits) per unit of weight, ties to the one
    /// picked least (the default).
    #[default]
    MostHeadroom,
    /// Each member in proportion to its weight (the member furthest below its weighted share
    /// of the picks so far), whatever its headroom; a member that is not available is skipped.
    Weighted,
    /// Ordered spillover: the members in the order they were added (a primary deployment,
    /// then its overflow): the first available one with headroom; when none has, the first
    /// available one (the request waits there). Weights are not used.
    Spillover,
}

/// What a process knows of one member when it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberView {
    /// Free permits as this process sees them (the limit minus calls in flight and waiting);
    /// negative when callers already wait for it.
    pub headroom: i64,
    /// The member's weight.
    pub weight: u32,
    /// False when it cannot take a call now (cooling down, a spent provider window or quota, a
    /// breaker open, or it just refused this request).
    pub available: bool,
    /// How many requests this process sent it so far.
    pub picked: u64,
}

impl PoolPolicy {
    /// The members to try, best first: the available ones by the policy, then the others (a
    /// request that finds none available waits for the best of those).
    pub fn order(self, views: &[MemberView]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..views.len()).collect();
        if self == PoolPolicy::Spillover {
            // Stable: among equals, the configured order.
            order.sort_by_key(|&i| (!views[i].available, views[i].headroom <= 0));
            return order;
        }
        let weight = |i: usize| u64::from(views[i].weight.max(1));
        order.sort_by(|&a, &b| {
            let (va, vb) = (&views[a], &views[b]);
            vb.available.cmp(&va.available).then_with(|| match self {
                PoolPolicy::MostHeadroom => {
                    // headroom ÷ weight, compared without division; then the least picked.
                    let (ha, hb) = (i128::from(va.headroom), i128::from(vb.headroom));
                    (hb * i128::from(weight(a))).cmp(&(ha * i128::from(weight(b)))).then_with(|| {
                        (u128::from(va.picked) * u128::from(weight(b)))
                            .cmp(&(u128::from(vb.picked) * u128::from(weight(a))))
                    })
                }
                PoolPolicy::Weighted => (u128::from(va.picked) * u128::from(weight(b)))
                    .cmp(&(u128::from(vb.picked) * u128::from(weight(a)))),
                PoolPolicy::Spillover => std::cmp::Ordering::Equal,
            })
        });
        order
    }
}

/// Why a pool's configuration cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolConfigError {
    /// The pool's name is not a valid upstream name.
    #[error("pool `{0}`: the name must be 1 to 64 characters of [A-Za-z0-9_.-]")]
    BadName(String),
    /// No members.
    #[error("pool `{0}` has no members; add them with `.member(upstream, weight)`")]
    Empty(String),
    /// A member named twice.
    #[error("pool `{pool}` names member `{member}` twice")]
    Duplicate {
        /// The pool.
        pool: String,
        /// The member.
        member: String,
    },
    /// A weight of 0.
    #[error("pool `{pool}`: member `{member}` has weight 0; weights are 1 to 1000")]
    ZeroWeight {
        /// The pool.
        pool: String,
        /// The member.
        member: String,
    },
    /// A weight above 1000.
    #[error("pool `{pool}`: member `{member}` has weight {weight}; weights are 1 to 1000")]
    WeightTooLarge {
        /// The pool.
        pool: String,
        /// The member.
        member: String,
        /// The weight given.
        weight: u32,
    },
    /// A member that is not a configured upstream.
    #[error("pool `{pool}`: member `{member}` is not a configured upstream; configured: {known}")]
    UnknownMember {
        /// The pool.
        pool: String,
        /// The member.
        member: String,
        /// The configured upstreams, comma-separated.
        known: String,
    },
    /// Two pools of one scheduler have the same name.
    #[error("two pools are named `{0}`")]
    DuplicatePool(String),
    /// The pool has the name of an upstream (a request must name one or the other).
    #[error("pool `{0}` has the name of a configured upstream; give it a name of its own")]
    NameTaken(String),
}

/// A validated pool. Build it with [`PoolConfig::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    name: UpstreamName,
    members: Vec<(UpstreamName, u32)>,
    policy: PoolPolicy,
}

impl PoolConfig {
    /// The heaviest weight: 1000.
    pub const MAX_WEIGHT: u32 = 1000;

    /// A builder for the pool `name`, with no members and [`PoolPolicy::MostHeadroom`].
    pub fn builder(name: impl Into<String>) -> PoolConfigBuilder {
        PoolConfigBuilder { name: name.into(), members: Vec::new(), policy: PoolPolicy::default() }
    }

    /// The pool's name.
    pub fn name(&self) -> &UpstreamName {
        &self.name
    }

    /// The members (upstream names) and their weights, in configured order.
    pub fn members(&self) -> &[(UpstreamName, u32)] {
        &self.members
    }

    /// How a request picks its member.
    pub fn policy(&self) -> PoolPolicy {
        self.policy
    }

    /// Checks that every member is one of `upstreams` and the name is not.
    pub fn check_against(&self, upstreams: &UpstreamSet) -> Result<(), PoolConfigError> {
        if upstreams.get(self.name.as_str()).is_ok() {
            return Err(PoolConfigError::NameTaken(self.name.to_string()));
        }
        for (member, _) in &self.members {
            if upstreams.get(member.as_str()).is_err() {
                let known = upstreams.iter().map(|u| u.name().to_string()).collect::<Vec<_>>().join(", ");
                return Err(PoolConfigError::UnknownMember {
                    pool: self.name.to_string(),
                    member: member.to_string(),
                    known,
                });
            }
        }
        Ok(())
    }
}

/// Builds a [`PoolConfig`].
#[derive(Debug, Clone)]
#[must_use = "call `build()` to get the pool"]
pub struct PoolConfigBuilder {
    name: String,
    members: Vec<(String, u32)>,
    policy: PoolPolicy,
}

impl PoolConfigBuilder {
    /// Adds the configured upstream `upstream` as a member of weight `weight` (1 to 1000).
    pub fn member(mut self, upstream: impl Into<String>, weight: u32) -> Self {
        self.members.push((upstream.into(), weight));
        self
    }

    /// How a request picks its member. Default [`PoolPolicy::MostHeadroom`].
    pub fn policy(mut self, policy: PoolPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Checks the pool on its own (the members against the upstreams: at the scheduler's build).
    pub fn build(self) -> Result<PoolConfig, PoolConfigError> {
        let name = UpstreamName::new(self.name.clone()).map_err(|_| PoolConfigError::BadName(self.name.clone()))?;
        if self.members.is_empty() {
            return Err(PoolConfigError::Empty(self.name));
        }
        let mut members: Vec<(UpstreamName, u32)> = Vec::with_capacity(self.members.len());
        for (member, weight) in self.members {
            let pool = || self.name.clone();
            if weight == 0 {
                return Err(PoolConfigError::ZeroWeight { pool: pool(), member });
            }
            if weight > PoolConfig::MAX_WEIGHT {
                return Err(PoolConfigError::WeightTooLarge { pool: pool(), member, weight });
            }
            let parsed = UpstreamName::new(member.clone()).map_err(|_| PoolConfigError::UnknownMember {
                pool: pool(),
                member: member.clone(),
                known: String::new(),
            })?;
            if members.iter().any(|(known, _)| known == &parsed) {
                return Err(PoolConfigError::Duplicate { pool: pool(), member });
            }
            members.push((parsed, weight));
        }
        Ok(PoolConfig { name, members, policy: self.policy })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamConfig;

    fn view(headroom: i64, weight: u32, available: bool, picked: u64) -> MemberView {
        MemberView { headroom, weight, available, picked }
    }

    #[test]
    fn spillover_takes_the_first_member_with_room_in_order() {
        let spill = PoolPolicy::Spillover;
        // The primary has room: it goes first, whatever the others' headroom or picks.
        assert_eq!(spill.order(&[view(1, 1, true, 50), view(9, 1, true, 0), view(5, 1, true, 0)]), [0, 1, 2]);
        // The primary is full: the next with room; the full ones after, in order.
        assert_eq!(spill.order(&[view(0, 1, true, 0), view(-2, 1, true, 0), view(3, 1, true, 0)]), [2, 0, 1]);
        // Not available (a cooldown, a spent window or quota): last, whatever its room.
        assert_eq!(spill.order(&[view(8, 1, false, 0), view(1, 1, true, 0)]), [1, 0]);
        // Nobody has room: the first available waits for it.
        assert_eq!(spill.order(&[view(0, 1, true, 0), view(0, 1, true, 0)]), [0, 1]);
    }

    #[test]
    fn most_headroom_first_per_weight_then_the_least_picked_and_unavailable_last() {
        let p = PoolPolicy::MostHeadroom;
        assert_eq!(p.order(&[view(3, 1, true, 0), view(5, 1, false, 0), view(4, 1, true, 0)]), vec![2, 0, 1]);
        // 4 free at weight 2 is 2 per unit: less than 3 at weight 1.
        assert_eq!(p.order(&[view(4, 2, true, 0), view(3, 1, true, 0)]), vec![1, 0]);
        // Equal headroom: the one picked least (per weight) goes first, so equal keys alternate.
        assert_eq!(p.order(&[view(5, 1, true, 9), view(5, 1, true, 3), view(5, 1, true, 4)]), vec![1, 2, 0]);
        assert_eq!(p.order(&[view(-2, 1, true, 0), view(-1, 1, true, 5)]), vec![1, 0], "least waiting first");
    }

    #[test]
    fn weighted_follows_the_weights_whatever_the_headroom() {
        let p = PoolPolicy::Weighted;
        let mut picked = [0u64; 2];
        for _ in 0..300 {
            let views = [view(0, 1, true, picked[0]), view(100, 2, true, picked[1])];
            picked[p.order(&views)[0]] += 1;
        }
        assert_eq!(picked, [100, 200]);
    }

    #[test]
    fn bad_pools_are_refused_with_what_to_change() {
        let b = || PoolConfig::builder("gpt");
        assert_eq!(b().build(), Err(PoolConfigError::Empty("gpt".into())));
        assert!(matches!(b().member("a", 0).build(), Err(PoolConfigError::ZeroWeight { .. })));
        assert!(matches!(b().member("a", 1001).build(), Err(PoolConfigError::WeightTooLarge { .. })));
        assert!(matches!(b().member("a", 1).member("a", 2).build(), Err(PoolConfigError::Duplicate { .. })));
        assert!(matches!(PoolConfig::builder("no spaces").member("a", 1).build(), Err(PoolConfigError::BadName(_))));
        let upstreams = UpstreamSet::new([
            UpstreamConfig::builder("a").build().unwrap(),
            UpstreamConfig::builder("gpt").build().unwrap(),
        ])
        .unwrap();
        let pool = b().member("a", 1).build().unwrap();
        assert_eq!(pool.check_against(&upstreams), Err(PoolConfigError::NameTaken("gpt".into())));
        let pool = PoolConfig::builder("p").member("a", 1).member("b", 1).build().unwrap();
        let error = pool.check_against(&upstreams).unwrap_err();
        assert_eq!(error.to_string(), "pool `p`: member `b` is not a configured upstream; configured: a, gpt");
    }
}
