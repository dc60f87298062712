//! A gate's waiting list: the processes (instances) waiting at its limit.
//!
//! The twin of the scripts' `KEYS[4]` (member → since when it waits), `KEYS[5]` (member →
//! when it last asked) and `KEYS[6]` (member → how many of its callers wait, and of which
//! tenants), in `lua/acquire.lua`, `lua/finish.lua` and `lua/priority.lua`. A member is the
//! instance itself without classes, `<class>|<instance>` with them.

use std::collections::HashMap;

/// How recently a waiting process must have asked to take part in the choice of class (ms):
/// a process that waits asks again at least every 500 ms, so one that died or stopped waiting
/// holds nothing back for longer than that. `PRIORITY_FRESH` in `lua/priority.lua`.
pub const PRIORITY_FRESH_MS: u64 = 1_500;

/// How long a process stays on the waiting list without asking again (ms); a process that
/// keeps asking keeps its place however long it waits. `WAITING_TTL` in `lua/wave.lua`.
pub const WAITING_TTL_MS: u64 = 10_000;

/// What a waiting member offers: how many of its callers wait, and how many of each tenant
/// (tag, count), as `KEYS[6]` keeps it (`<member>` and `<member>>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offers {
    pub(crate) count: u32,
    pub(crate) by_tenant: Vec<(String, u32)>,
}

/// The ask a process without classes last made at the limit: the permit a release may hand it
/// (`h:<instance>` in `KEYS[6]`: `'<lease> <tokens> <output> <id>'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaitingHead {
    pub(crate) id: String,
    pub(crate) lease_ms: u64,
    pub(crate) tokens: u64,
    pub(crate) output: u64,
}

/// The waiting list.
#[derive(Debug, Clone, Default)]
pub(crate) struct WaitingList {
    since: HashMap<String, u64>,
    seen: HashMap<String, u64>,
    offers: HashMap<String, Offers>,
    heads: HashMap<String, WaitingHead>,
}

impl WaitingList {
    /// Puts `member` on the list from `now_ms`, keeping the place of one already there
    /// (`ZADD NX`).
    pub(crate) fn join(&mut self, member: &str, now_ms: u64) {
        self.since.entry(member.to_owned()).or_insert(now_ms);
    }

    /// Moves a member already on the list to the back of it (`ZADD XX`).
    pub(crate) fn move_to_back(&mut self, member: &str, now_ms: u64) {
        if let Some(since) = self.since.get_mut(member) {
            *since = now_ms;
        }
    }

    /// Records that `member` asked at `now_ms`.
    pub(crate) fn saw(&mut self, member: &str, now_ms: u64) {
        self.seen.insert(member.to_owned(), now_ms);
    }

    /// Whether `member` has asked (and was not taken off since).
    pub(crate) fn has_asked(&self, member: &str) -> bool {
        self.seen.contains_key(member)
    }

    /// Sets what `member` offers.
    pub(crate) fn offer(&mut self, member: &str, offers: Offers) {
        self.offers.insert(member.to_owned(), offers);
    }

    /// What `member` offers, if it said.
    pub(crate) fn offers(&self, member: &str) -> Option<&Offers> {
        self.offers.get(member)
    }

    /// Records the ask `member` made at the limit (the last one replaces an earlier one).
    pub(crate) fn set_head(&mut self, member: &str, head: WaitingHead) {
        self.heads.insert(member.to_owned(), head);
    }

    /// Since when `member` waits, if it is on the list.
    pub(crate) fn since(&self, member: &str) -> Option<u64> {
        self.since.get(member).copied()
    }

    /// Takes `member` off the list.
    pub(crate) fn remove(&mut self, member: &str) {
        self.since.remove(member);
        self.seen.remove(member);
        self.offers.remove(member);
        self.heads.remove(member);
    }

    /// The members that asked within [`PRIORITY_FRESH_MS`] of `now_ms`.
    pub(crate) fn fresh(&self, now_ms: u64) -> impl Iterator<Item = &str> {
        let from = now_ms.saturating_sub(PRIORITY_FRESH_MS);
        self.seen.iter().filter(move |(_, seen)| **seen >= from).map(|(member, _)| member.as_str())
    }

    /// Takes off the members that have not asked for [`WAITING_TTL_MS`].
    pub(crate) fn drop_stale(&mut self, now_ms: u64) {
        let Some(until) = now_ms.checked_sub(WAITING_TTL_MS) else { return };
        let gone: Vec<String> = self.seen.iter().filter(|(_, seen)| **seen <= until).map(|(m, _)| m.clone()).collect();
        for member in gone {
            self.remove(&member);
        }
    }

    /// Takes off and returns the member that has waited longest (ties: the first by name;
    /// `ZPOPMIN`), with the ask it last made at the limit, if it left one.
    pub(crate) fn pop_longest(&mut self) -> Option<(String, Option<WaitingHead>)> {
        let member = self.since.iter().min_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0))).map(|(member, _)| member.clone())?;
        let head = self.heads.remove(&member);
        self.remove(&member);
        Some((member, head))
    }
}
