//! One upstream's queue of callers waiting for a permit in this process: one queue per
//! priority class (one in all without classes), bounded, with a deadline per waiter. Within a
//! class, callers that name a tenant are served tenant by tenant: the next is the oldest
//! waiter of the tenant that holds the fewest permits here (callers without a tenant count as
//! one tenant), so first in first out when no tenant is named.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::SpawnHandle;
use tokio::sync::oneshot;

use crate::error::Error;
use crate::messages::Grant;

/// A caller waiting for a permit.
#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) id: String,
    pub(crate) enqueued: Instant,
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<Result<Grant, Error>>,
    /// Tokens to reserve.
    pub(crate) tokens: u64,
    /// Its priority class (index in the upstream's classes; 0 without classes).
    pub(crate) class: usize,
    /// Its tenant within the class, if it names one.
    pub(crate) tenant: Option<Arc<str>>,
    /// When it first reached the head of the queue.
    pub(crate) at_head: Option<Instant>,
    /// The timer that answers it at its deadline; cancelled when it is answered before.
    pub(crate) deadline_timer: Option<SpawnHandle>,
}

/// The waiters, one queue per priority class, and the permits held per tenant.
#[derive(Debug)]
pub(crate) struct Waiters {
    queues: Vec<VecDeque<Waiter>>,
    /// Waiters that name a tenant, per class: while there are none, a class is plain FIFO.
    with_tenant: Vec<usize>,
    /// Permits held by callers that named a tenant: id → (class, tenant).
    held: HashMap<String, (usize, Arc<str>)>,
    /// How many of them each (class, tenant) holds; entries go when they reach 0.
    held_by: HashMap<(usize, Arc<str>), u32>,
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
        }
    }

    /// Drops the waiters whose caller gave up, keeping the tenant count right.
    fn retain_live(&mut self, class: usize) {
        let queue = &mut self.queues[class];
        let before = queue.iter().filter(|w| w.tenant.is_some()).count();
        queue.retain(|w| !w.reply.is_closed());
        let after = queue.iter().filter(|w| w.tenant.is_some()).count();
        self.with_tenant[class] -= before - after;
    }

    /// Where the next waiter of `class` to serve is: the front, or (with tenants) the oldest
    /// waiter of the tenant holding the fewest permits.
    fn next_position(&self, class: usize) -> Option<usize> {
        let queue = &self.queues[class];
        if self.with_tenant[class] == 0 {
            return (!queue.is_empty()).then_some(0);
        }
        let held = |tenant: &Option<Arc<str>>| {
            let key = (class, tenant.clone().unwrap_or_else(|| Arc::from("")));
            self.held_by.get(&key).copied().unwrap_or(0)
        };
        queue
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.reply.is_closed())
            .min_by_key(|(i, w)| (held(&w.tenant), *i))
            .map(|(i, _)| i)
    }

    /// A permit was granted to `waiter`: counted for its tenant, if it named one.
    pub(crate) fn granted(&mut self, waiter: &Waiter) {
        if let Some(tenant) = &waiter.tenant {
            self.held.insert(waiter.id.clone(), (waiter.class, tenant.clone()));
            *self.held_by.entry((waiter.class, tenant.clone())).or_default() += 1;
        }
    }

    /// The permit `id` was released.
    pub(crate) fn released(&mut self, id: &str) {
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
        self.lens().into_iter().sum()
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

    pub(crate) fn push(&mut self, mut waiter: Waiter) {
        let class = waiter.class.min(self.queues.len() - 1);
        waiter.class = class;
        self.with_tenant[class] += usize::from(waiter.tenant.is_some());
        self.queues[class].push_back(waiter);
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

    /// The head of the only queue (an upstream without classes), or of the first class with
    /// a waiter.
    pub(crate) fn head(&mut self, now: Instant) -> Option<&Waiter> {
        let class = (0..self.queues.len()).find(|&class| self.head_of(class, now).is_some())?;
        self.head_of(class, now)
    }

    /// The head of every class with a waiter: (class, id, tokens, callers of the class
    /// waiting).
    pub(crate) fn heads(&mut self, now: Instant) -> Vec<(usize, String, u64, usize)> {
        (0..self.queues.len())
            .filter_map(|class| {
                let (id, tokens) = self.head_of(class, now).map(|head| (head.id.clone(), head.tokens))?;
                Some((class, id, tokens, self.queues[class].len()))
            })
            .collect()
    }

    /// Answers and removes a head if it is the waiter `id`; returns its deadline timer.
    pub(crate) fn fail_head(&mut self, id: &str, error: Error) -> Option<SpawnHandle> {
        let waiter = self.pop_if(id)?;
        let _ = waiter.reply.send(Err(error));
        waiter.deadline_timer
    }

    /// Removes the waiter `id` if it is the next of its class.
    pub(crate) fn pop_if(&mut self, id: &str) -> Option<Waiter> {
        let class = (0..self.queues.len())
            .find(|&class| self.next_position(class).is_some_and(|at| self.queues[class][at].id == id))?;
        let at = self.next_position(class)?;
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

    /// Answers a waiter that timed out.
    pub(crate) fn time_out(waiter: Waiter, upstream: &str, now: Instant, retry_after: Option<Duration>) {
        let waited = now.saturating_duration_since(waiter.enqueued);
        let _ = waiter.reply.send(Err(Error::WaitedTooLong { upstream: upstream.to_owned(), waited, retry_after }));
    }
}
