//! One upstream's queue of callers waiting for a permit in this process: one queue per
//! priority class (one in all without classes), bounded, with a deadline per waiter.
//!
//! Within a class the earliest deadline is served first: a queue is kept in the order of its
//! waiters' wait bounds (a caller's deadline, or for one without a deadline of its own its
//! ask plus the upstream's `max_wait`, whichever comes first), callers with the same bound in
//! arrival order — so first in first out when nobody names a deadline shorter than `max_wait`.
//! Tenant fairness comes before it: callers that name a tenant are served tenant by tenant,
//! the next being the waiter with the earliest deadline among the tenants that hold the fewest
//! permits here (callers without a tenant count as one tenant). A tenant cannot jump ahead of
//! the fair order by naming short deadlines; within its turn, its most urgent caller goes
//! first. Across the fleet the order stays the store's (it chooses among the processes' heads).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use actix::SpawnHandle;
use tokio::sync::oneshot;
use wavegate_core::{Ask, BreakerTicket, PermitId, TenantTag};

use crate::engine::clock::Instant;
use crate::engine::grant::Grant;
use crate::error::Error;
use crate::shadow::RetryCovered;

/// A caller waiting for a permit.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The permit id it will hold (its class and tenant inside).
    pub(crate) id: PermitId,
    pub(crate) enqueued: Instant,
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<Result<Grant, Error>>,
    /// Tokens to reserve.
    pub(crate) tokens: u64,
    /// Of `tokens`, the answer's output (the output budget).
    pub(crate) output: u64,
    /// Its priority class (index in the upstream's classes; 0 without classes).
    pub(crate) class: usize,
    /// Its tenant within the class, if it names one.
    pub(crate) tenant: Option<TenantTag>,
    /// Its breaker ticket (given back as "ignored" if no permit comes).
    pub(crate) ticket: Option<BreakerTicket>,
    /// When it first reached the head of the queue (the first ask that included it).
    pub(crate) at_head: Option<Instant>,
    /// Nobody waited in this process when it came: granted at its first ask, it did not wait
    /// for the limit at all (see [`GrantInfo::at_once`](crate::engine::grant::GrantInfo)).
    pub(crate) alone: bool,
    /// It is the ghost of a call in shadow (the call went at once): that call's verdict on
    /// its failure, told when the ghost is known not to be granted at once.
    pub(crate) ghost: Option<RetryCovered>,
    /// The timer that answers it at its deadline; cancelled when it is answered before.
    pub(crate) deadline_timer: Option<SpawnHandle>,
}

/// At most how many tenants of a class a process offers the store in one ask (the rest wait
/// for a later ask; the local order decides which come first).
pub(crate) const TENANT_HEADS: usize = 4;

/// A class and a tenant of it (`None`: the callers that named no tenant).
type TenantKey = (usize, Option<TenantTag>);

/// The waiters, one queue per priority class, and the permits held per tenant.
#[derive(Debug)]
pub(crate) struct Waiters {
    queues: Vec<VecDeque<Waiter>>,
    /// Waiters that name a tenant, per class: while there are none, a class is plain FIFO.
    with_tenant: Vec<usize>,
    /// Permits held by this process's callers: id → (class, tenant; `None` for callers that
    /// named none, who count as one tenant).
    held: HashMap<PermitId, TenantKey>,
    /// How many of them each (class, tenant) holds; entries go when they reach 0.
    held_by: HashMap<TenantKey, u32>,
    /// The breaker tickets of waiters dropped because their caller went away.
    abandoned: Vec<BreakerTicket>,
}

impl Default for Waiters {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Waiters {
    /// Queues for `classes` classes (at least one).
    pub(crate) fn new(classes: usize) -> Self {
        let classes = classes.max(1);
        Self {
            queues: (0..classes).map(|_| VecDeque::new()).collect(),
            with_tenant: vec![0; classes],
            held: HashMap::new(),
            held_by: HashMap::new(),
            abandoned: Vec::new(),
        }
    }

    /// Drops the waiters whose caller gave up, keeping the tenant count right.
    fn retain_live(&mut self, class: usize) {
        let queue = &mut self.queues[class];
        if !queue.iter().any(|w| w.reply.is_closed()) {
            return;
        }
        let (gone, kept): (Vec<Waiter>, Vec<Waiter>) = queue.drain(..).partition(|w| w.reply.is_closed());
        *queue = kept.into();
        self.with_tenant[class] -= gone.iter().filter(|w| w.tenant.is_some()).count();
        // Their breaker tickets go back unused (a half-open probe slot is not lost).
        self.abandoned.extend(gone.into_iter().filter_map(|mut w| w.ticket.take()));
    }

    /// The breaker tickets of waiters whose caller went away, to give back as unused.
    pub(crate) fn take_abandoned_tickets(&mut self) -> Vec<BreakerTicket> {
        std::mem::take(&mut self.abandoned)
    }

    /// Where the next waiter of `class` to serve is: the front (the earliest deadline), or
    /// (with tenants) the earliest deadline among the tenants holding the fewest permits.
    fn next_position(&self, class: usize) -> Option<usize> {
        let queue = &self.queues[class];
        if self.with_tenant[class] == 0 {
            return (!queue.is_empty()).then_some(0);
        }
        let held = |tenant: &Option<TenantTag>| self.held_by.get(&(class, *tenant)).copied().unwrap_or(0);
        queue
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.reply.is_closed())
            .min_by_key(|(i, w)| (held(&w.tenant), *i))
            .map(|(i, _)| i)
    }

    /// A permit was granted to `waiter`: counted for its tenant (or for the callers that
    /// named none).
    pub(crate) fn granted(&mut self, waiter: &Waiter) {
        let key = (waiter.class, waiter.tenant);
        self.held.insert(waiter.id.clone(), key);
        *self.held_by.entry(key).or_default() += 1;
    }

    /// The permit `id` was released.
    pub(crate) fn released(&mut self, id: &PermitId) {
        if let Some(key) = self.held.remove(id)
            && let Some(count) = self.held_by.get_mut(&key)
        {
            *count -= 1;
            if *count == 0 {
                self.held_by.remove(&key);
            }
        }
    }

    /// Callers still waiting (those that gave up are dropped first).
    pub(crate) fn len(&mut self) -> usize {
        self.purge_gone();
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// Drops the waiters whose caller gave up (their tickets go to the abandoned ones).
    pub(crate) fn purge_gone(&mut self) {
        for class in 0..self.queues.len() {
            self.retain_live(class);
        }
    }

    /// Callers of each class still waiting.
    pub(crate) fn lens(&mut self) -> Vec<usize> {
        (0..self.queues.len())
            .map(|class| {
                self.retain_live(class);
                self.queues[class].len()
            })
            .collect()
    }

    /// Queues `waiter` in its class, by its deadline (see the module docs).
    pub(crate) fn push(&mut self, mut waiter: Waiter) {
        let class = waiter.class.min(self.queues.len() - 1);
        waiter.class = class;
        self.with_tenant[class] += usize::from(waiter.tenant.is_some());
        let queue = &mut self.queues[class];
        // Earliest deadline first; after every waiter with the same bound (arrival order).
        let at = queue.partition_point(|w| w.deadline <= waiter.deadline);
        queue.insert(at, waiter);
    }

    /// Every waiter, class by class, each class in the order it is served (without tenants).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Waiter> {
        self.queues.iter().flatten()
    }

    /// Every waiter, to change in place (its queue and place stay).
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Waiter> {
        self.queues.iter_mut().flatten()
    }

    /// The first waiter of `class` whose caller is still there (callers that gave up are
    /// dropped); marks when it reached the head.
    pub(crate) fn head_of(&mut self, class: usize, now: Instant) -> Option<&Waiter> {
        if class >= self.queues.len() {
            return None;
        }
        if self.queues[class].front().is_some_and(|w| w.reply.is_closed()) {
            self.retain_live(class);
        }
        let position = self.next_position(class)?;
        let head = &mut self.queues[class][position];
        head.at_head.get_or_insert(now);
        Some(head)
    }

    /// The heads of every class with a waiter, as asks (callers that gave up are dropped
    /// first): one per class, with how many of its callers wait, when no waiter of the class
    /// names a tenant; else one per tenant for up to [`TENANT_HEADS`] tenants (the next to serve
    /// here first, then the tenants holding the fewest permits here), each with how many of that
    /// tenant's callers wait, so the gate can choose among the fleet's tenants.
    pub(crate) fn heads(&mut self, now: Instant) -> Vec<Ask> {
        let mut heads = Vec::new();
        let ask = |waiter: &Waiter, waiting: usize| Ask {
            id: waiter.id.clone(),
            tokens: waiter.tokens,
            output: waiter.output,
            waiting: u32::try_from(waiting).unwrap_or(u32::MAX),
        };
        for class in 0..self.queues.len() {
            self.retain_live(class);
            let Some(first) = self.head_of(class, now) else { continue };
            let first = ask(first, 1);
            if self.with_tenant[class] == 0 {
                let waiting = u32::try_from(self.queues[class].len()).unwrap_or(u32::MAX);
                heads.push(Ask { waiting, ..first });
                continue;
            }
            let id = first.id;
            // Each tenant's first waiter (its earliest deadline) and how many of its callers
            // wait, in queue order.
            // One pass over the queue, a map lookup per waiter: the cost does not grow with the
            // number of tenants.
            let mut tenants: Vec<(Option<TenantTag>, usize, usize)> = Vec::new();
            let mut index: HashMap<Option<TenantTag>, usize> = HashMap::new();
            for (at, waiter) in self.queues[class].iter().enumerate() {
                match index.get(&waiter.tenant) {
                    Some(&k) => tenants[k].2 += 1,
                    None => {
                        index.insert(waiter.tenant, tenants.len());
                        tenants.push((waiter.tenant, at, 1));
                    }
                }
            }
            let held = |tenant: &Option<TenantTag>| self.held_by.get(&(class, *tenant)).copied().unwrap_or(0);
            tenants.sort_by_key(|(tenant, at, _)| (self.queues[class][*at].id != id, held(tenant), *at));
            for (_, at, count) in tenants.into_iter().take(TENANT_HEADS) {
                let waiter = &mut self.queues[class][at];
                waiter.at_head.get_or_insert(now);
                heads.push(ask(waiter, count));
            }
        }
        heads
    }

    /// The waiter `id`, if it waits (looked for from the back: this is asked right after its
    /// push, and a caller with no deadline of its own is usually last).
    pub(crate) fn get_mut(&mut self, id: &PermitId) -> Option<&mut Waiter> {
        self.queues.iter_mut().find_map(|queue| queue.iter_mut().rev().find(|w| w.id == *id))
    }

    /// Removes the waiter `id`, wherever it is (the one a grant names: with tenants, the next
    /// of its class may have changed while the store was asked).
    pub(crate) fn take(&mut self, id: &PermitId) -> Option<Waiter> {
        let (class, at) = self.queues.iter().enumerate().find_map(|(class, queue)| {
            // Nearly always the front: look there first.
            if queue.front().is_some_and(|w| w.id == *id) {
                return Some((class, 0));
            }
            queue.iter().position(|w| w.id == *id).map(|at| (class, at))
        })?;
        let waiter = self.queues[class].remove(at)?;
        self.with_tenant[class] -= usize::from(waiter.tenant.is_some());
        Some(waiter)
    }

    /// Removes every waiter whose deadline has passed.
    pub(crate) fn take_expired(&mut self, now: Instant) -> Vec<Waiter> {
        // Called on every turn of the acquire loop: leave the queues alone when nothing expired.
        let mut expired = Vec::new();
        for queue in &mut self.queues {
            if !queue.iter().any(|w| w.deadline <= now) {
                continue;
            }
            let (gone, kept): (Vec<Waiter>, Vec<Waiter>) = queue.drain(..).partition(|w| w.deadline <= now);
            *queue = kept.into();
            expired.extend(gone);
        }
        for (class, queue) in self.queues.iter().enumerate() {
            self.with_tenant[class] = queue.iter().filter(|w| w.tenant.is_some()).count();
        }
        expired
    }

    /// The error of a waiter that timed out at `now`.
    pub(crate) fn timed_out(waiter: &Waiter, upstream: &str, now: Instant, retry_after: Option<Duration>) -> Error {
        let waited = now.saturating_duration_since(waiter.enqueued);
        Error::waited_too_long(upstream, waited, retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permit id named `name` (its instance), for readable assertions.
    fn pid(name: &str) -> PermitId {
        PermitId::new(None, &wavegate_core::Instance::new(name).unwrap(), 1, None)
    }

    fn waiter(id: &str, class: usize, tenant: Option<&str>) -> (Waiter, oneshot::Receiver<Result<Grant, Error>>) {
        let (reply, answer) = oneshot::channel();
        let now = Instant::now();
        let waiter = Waiter {
            alone: false,
            ghost: None,
            id: pid(id),
            enqueued: now,
            deadline: now + Duration::from_secs(60),
            reply,
            tokens: 0,
            output: 0,
            class,
            tenant: tenant.map(TenantTag::of),
            ticket: None,
            at_head: None,
            deadline_timer: None,
        };
        (waiter, answer)
    }

    #[test]
    fn tenants_take_turns_and_callers_without_one_count_as_one() {
        let mut waiters = Waiters::new(1);
        let mut answers = Vec::new();
        for (id, tenant) in [("a1", Some("a")), ("a2", Some("a")), ("n1", None), ("b1", Some("b")), ("n2", None)] {
            let (w, answer) = waiter(id, 0, tenant);
            answers.push(answer);
            waiters.push(w);
        }
        let now = Instant::now();
        let mut served = Vec::new();
        while let Some(head) = waiters.head_of(0, now) {
            let id = head.id.clone();
            let taken = waiters.take(&id).expect("the head is there");
            waiters.granted(&taken);
            served.push(id);
        }
        // a, then the untagged callers (holding none), then b, then a again (each holds 1),
        // then the second untagged caller.
        let names: Vec<&str> = served.iter().map(PermitId::instance).collect();
        assert_eq!(names, ["a1", "n1", "b1", "a2", "n2"]);
        assert_eq!(waiters.len(), 0);
        for id in &served {
            waiters.released(id);
        }
        assert!(waiters.held_by.is_empty() && waiters.held.is_empty());
    }

    #[test]
    fn the_earliest_deadline_goes_first_within_the_fair_order_of_tenants() {
        let mut waiters = Waiters::new(1);
        let mut answers = Vec::new();
        let now = Instant::now();
        // (id, tenant, deadline in s); tenant a already holds a permit here.
        for (id, tenant, due) in [("a1", "a", 10), ("b1", "b", 20), ("b2", "b", 5), ("a2", "a", 1), ("b3", "b", 5)] {
            let (mut w, answer) = waiter(id, 0, Some(tenant));
            w.deadline = now + Duration::from_secs(due);
            answers.push(answer);
            waiters.push(w);
        }
        let (held, _held) = waiter("h", 0, Some("a"));
        waiters.granted(&held);
        let mut served = Vec::new();
        while let Some(head) = waiters.head_of(0, now) {
            let id = head.id.clone();
            let taken = waiters.take(&id).expect("the head is there");
            waiters.granted(&taken);
            served.push(id);
        }
        // b first (it holds none), its most urgent caller (b2; b3 has the same bound and came
        // later); then a and b hold as many: the earliest deadline (a2 at 1 s), and so on.
        let names: Vec<&str> = served.iter().map(PermitId::instance).collect();
        assert_eq!(names, ["b2", "a2", "b3", "a1", "b1"]);
    }

    #[test]
    fn heads_offer_one_waiter_per_tenant_the_next_first_and_at_most_four() {
        let mut waiters = Waiters::new(1);
        let mut answers = Vec::new();
        let tenants = ["a", "a", "b", "c", "c", "c", "d", "e"];
        for (n, tenant) in tenants.iter().enumerate() {
            let (w, answer) = waiter(&format!("w{n}"), 0, Some(tenant));
            answers.push(answer);
            waiters.push(w);
        }
        // Tenant a holds a permit here: b is next, then the others by how few they hold.
        let (held, _held) = waiter("h", 0, Some("a"));
        waiters.granted(&held);
        let heads = waiters.heads(Instant::now());
        let offered: Vec<(&str, u32)> = heads.iter().map(|h| (h.id.instance(), h.waiting)).collect();
        assert_eq!(offered, [("w2", 1), ("w3", 3), ("w6", 1), ("w7", 1)]);
        // Without tenants: one head for the class, with every waiter counted.
        let mut plain = Waiters::new(1);
        for n in 0..3 {
            let (w, answer) = waiter(&format!("p{n}"), 0, None);
            answers.push(answer);
            plain.push(w);
        }
        let heads = plain.heads(Instant::now());
        assert_eq!(heads.iter().map(|h| (h.id.instance(), h.waiting)).collect::<Vec<_>>(), [("p0", 3)]);
    }

    #[test]
    fn a_grant_for_a_waiter_that_is_no_longer_next_still_reaches_it() {
        let mut waiters = Waiters::new(2);
        let (a1, _a1) = waiter("a1", 1, Some("a"));
        let (a0, _a0) = waiter("a0", 1, Some("a"));
        waiters.push(a0);
        let now = Instant::now();
        let granted = waiters.take(&pid("a0")).expect("a0");
        waiters.granted(&granted);
        waiters.push(a1);
        // Asked for a1; meanwhile tenant b's first caller arrives and becomes the next.
        assert_eq!(waiters.head_of(1, now).map(|w| w.id.clone()), Some(pid("a1")));
        let (b1, _b1) = waiter("b1", 1, Some("b"));
        waiters.push(b1);
        assert_eq!(waiters.head_of(1, now).map(|w| w.id.clone()), Some(pid("b1")));
        // The store's grant names a1: it is taken wherever it is, and the counts stay right.
        assert_eq!(waiters.take(&pid("a1")).map(|w| w.id), Some(pid("a1")));
        assert_eq!(waiters.with_tenant[1], 1);
        assert_eq!(waiters.lens(), [0, 1]);
    }
}
