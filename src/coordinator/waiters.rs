//! One upstream's queue of callers waiting for a permit in this process: FIFO, bounded, with
//! a deadline per waiter.

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
    /// When it first reached the head of the queue.
    pub(crate) at_head: Option<Instant>,
    /// The timer that answers it at its deadline; cancelled when it is answered before.
    pub(crate) deadline_timer: Option<SpawnHandle>,
}

/// FIFO of waiters.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    queue: VecDeque<Waiter>,
}

impl Waiters {
    /// Callers still waiting (those that gave up are dropped first).
    pub(crate) fn len(&mut self) -> usize {
        self.queue.retain(|w| !w.reply.is_closed());
        self.queue.len()
    }

    pub(crate) fn push(&mut self, waiter: Waiter) {
        self.queue.push_back(waiter);
    }

    /// The first waiter whose caller is still there (callers that gave up are dropped); marks
    /// when it reached the head.
    pub(crate) fn head(&mut self, now: Instant) -> Option<&Waiter> {
        while self.queue.front().is_some_and(|w| w.reply.is_closed()) {
            self.queue.pop_front();
        }
        let head = self.queue.front_mut()?;
        head.at_head.get_or_insert(now);
        Some(head)
    }

    /// Answers and removes the head if it is the waiter `id`; returns its deadline timer.
    pub(crate) fn fail_head(&mut self, id: &str, error: Error) -> Option<SpawnHandle> {
        let waiter = self.pop_if(id)?;
        let _ = waiter.reply.send(Err(error));
        waiter.deadline_timer
    }

    /// Removes the head if it is the waiter `id`.
    pub(crate) fn pop_if(&mut self, id: &str) -> Option<Waiter> {
        if self.queue.front().is_some_and(|w| w.id == id) { self.queue.pop_front() } else { None }
    }

    /// Removes every waiter whose deadline has passed.
    pub(crate) fn take_expired(&mut self, now: Instant) -> Vec<Waiter> {
        // Called on every turn of the acquire loop: leave the queue alone when nothing expired.
        if !self.queue.iter().any(|w| w.deadline <= now) {
            return Vec::new();
        }
        let (expired, kept): (Vec<Waiter>, Vec<Waiter>) = self.queue.drain(..).partition(|w| w.deadline <= now);
        self.queue = kept.into();
        expired
    }

    /// Answers a waiter that timed out.
    pub(crate) fn time_out(waiter: Waiter, upstream: &str, now: Instant, retry_after: Option<Duration>) {
        let waited = now.saturating_duration_since(waiter.enqueued);
        let _ = waiter.reply.send(Err(Error::WaitedTooLong { upstream: upstream.to_owned(), waited, retry_after }));
    }
}
