//! One upstream's queue of callers waiting for a permit in this process: FIFO within each
//! priority class (one queue per class; one in all without classes), bounded, with a
//! deadline per waiter.

use std::collections::VecDeque;
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
    /// When it first reached the head of the queue.
    pub(crate) at_head: Option<Instant>,
    /// The timer that answers it at its deadline; cancelled when it is answered before.
    pub(crate) deadline_timer: Option<SpawnHandle>,
}

/// The waiters, one FIFO per priority class.
#[derive(Debug)]
pub(crate) struct Waiters {
    queues: Vec<VecDeque<Waiter>>,
}

impl Default for Waiters {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Waiters {
    /// Queues for `classes` classes (at least one).
    pub(crate) fn new(classes: usize) -> Self {
        Self { queues: (0..classes.max(1)).map(|_| VecDeque::new()).collect() }
    }

    /// Callers still waiting (those that gave up are dropped first).
    pub(crate) fn len(&mut self) -> usize {
        self.queues
            .iter_mut()
            .map(|queue| {
                queue.retain(|w| !w.reply.is_closed());
                queue.len()
            })
            .sum()
    }

    /// Callers of each class still waiting.
    pub(crate) fn lens(&mut self) -> Vec<usize> {
        self.queues
            .iter_mut()
            .map(|queue| {
                queue.retain(|w| !w.reply.is_closed());
                queue.len()
            })
            .collect()
    }

    pub(crate) fn push(&mut self, waiter: Waiter) {
        let class = waiter.class.min(self.queues.len() - 1);
        self.queues[class].push_back(waiter);
    }

    /// The first waiter of `class` whose caller is still there (callers that gave up are
    /// dropped); marks when it reached the head.
    pub(crate) fn head_of(&mut self, class: usize, now: Instant) -> Option<&Waiter> {
        let queue = self.queues.get_mut(class)?;
        while queue.front().is_some_and(|w| w.reply.is_closed()) {
            queue.pop_front();
        }
        let head = queue.front_mut()?;
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

    /// Removes a head (of any class) if it is the waiter `id`.
    pub(crate) fn pop_if(&mut self, id: &str) -> Option<Waiter> {
        let queue = self.queues.iter_mut().find(|queue| queue.front().is_some_and(|w| w.id == id))?;
        queue.pop_front()
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
        expired
    }

    /// Answers a waiter that timed out.
    pub(crate) fn time_out(waiter: Waiter, upstream: &str, now: Instant, retry_after: Option<Duration>) {
        let waited = now.saturating_duration_since(waiter.enqueued);
        let _ = waiter.reply.send(Err(Error::WaitedTooLong { upstream: upstream.to_owned(), waited, retry_after }));
    }
}
