//! The oracles: strategies that know the provider's truth and follow it, no Redis. Each
//! process takes a static share of what the provider allows (the fleet's processes are
//! equally loaded, so the shares are all used).
//!
//! * [`Oracle`]: the hidden capacity (followed through `X-Capacity`) and the rate window.
//! * [`BucketOracle`]: OpenAI's buckets ([`crate::scenario::Bucket`]): its share of the
//!   requests and tokens buckets, full at the start and refilled continuously, a call sent
//!   exactly when the share holds its cost (prompt + `max_tokens`), callers served in arrival
//!   order, and its share of the hidden cap (or of the configured limit, if lower). With
//!   Anthropic's buckets it takes only its share of the limit ([`BucketOracle::slot`]) and
//!   the call waits at the provider, in arrival order across the fleet, until the provider's
//!   buckets hold it (the provider's `queue=1`): static shares of an 8,000-token output
//!   bucket would hold a 2,000-token call back until a process's whole share is free.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wavegate_testkit::HttpReply;

use crate::scenario::Bucket;
use crate::worker::WorkerEnv;

/// This process's share of `total` among `processes` (the first ones take the remainder),
/// at least 1.
pub(crate) fn share_of(total: usize, index: usize, processes: usize) -> usize {
    (total / processes + usize::from(index < total % processes)).max(1)
}

/// The oracle's limiter: its share of the capacity the provider announces, and of the rate
/// window. Single-threaded (the worker's callers run on one actix system).
pub(crate) struct Oracle {
    index: usize,
    processes: usize,
    /// The configured limit, which the oracle respects as well.
    limit: usize,
    share: Cell<usize>,
    in_flight: Cell<usize>,
    freed: tokio::sync::Notify,
    /// Calls this process may have admitted in any window, and the window.
    rate: Option<(usize, Duration)>,
    /// When its recent calls were answered (the provider admitted each before that moment,
    /// so a window counted from here never overlaps the provider's), and the calls sent and
    /// not answered yet.
    answered: std::cell::RefCell<std::collections::VecDeque<std::time::Instant>>,
    unanswered: Cell<usize>,
}

impl Oracle {
    pub(crate) fn new(env: &WorkerEnv) -> Self {
        // It respects the configured limit too: the best a fleet can do under it.
        let share = if env.oracle_capacity == 0 {
            env.callers
        } else {
            share_of(env.oracle_capacity.min(env.limit as usize), env.index, env.processes)
        };
        Self {
            index: env.index,
            processes: env.processes,
            limit: env.limit as usize,
            share: Cell::new(share),
            in_flight: Cell::new(0),
            freed: tokio::sync::Notify::new(),
            rate: env.oracle_rate.map(|(calls, seconds)| {
                (share_of(calls as usize, env.index, env.processes), Duration::from_secs(seconds))
            }),
            answered: Default::default(),
            unanswered: Cell::new(0),
        }
    }

    /// Waits for a place in this process's share, then for room in its rate window.
    pub(crate) async fn acquire(&self) {
        loop {
            if self.in_flight.get() < self.share.get() {
                self.in_flight.set(self.in_flight.get() + 1);
                break;
            }
            self.freed.notified().await;
        }
        if let Some((calls, window)) = self.rate {
            loop {
                let wait_until = {
                    let now = std::time::Instant::now();
                    let mut answered = self.answered.borrow_mut();
                    while answered.front().is_some_and(|t| now.duration_since(*t) >= window) {
                        answered.pop_front();
                    }
                    if answered.len() + self.unanswered.get() < calls {
                        self.unanswered.set(self.unanswered.get() + 1);
                        None
                    } else {
                        // Full: wait for the oldest answer to leave the window, or for an
                        // answer (a refused call frees its place at once).
                        Some(answered.front().map_or(now + Duration::from_millis(5), |oldest| *oldest + window))
                    }
                };
                match wait_until {
                    None => break,
                    Some(until) => tokio::time::sleep_until(until.into()).await,
                }
            }
        }
    }

    /// Gives the place back and follows the capacity the answer announced. A served call
    /// enters this process's window at its answer; a refused one did not enter the provider's.
    pub(crate) fn release(&self, reply: Option<&HttpReply>) {
        self.in_flight.set(self.in_flight.get() - 1);
        if self.rate.is_some() {
            self.unanswered.set(self.unanswered.get() - 1);
            if reply.is_some_and(|r| r.status == 200) {
                self.answered.borrow_mut().push_back(std::time::Instant::now());
            }
        }
        if let Some(total) = reply.and_then(|r| r.header("X-Capacity")).and_then(|c| c.parse::<usize>().ok()) {
            self.share.set(share_of(total.min(self.limit), self.index, self.processes));
        }
        self.freed.notify_waiters();
    }
}

/// The oracle of a provider with OpenAI's buckets.
pub(crate) struct BucketOracle {
    /// This process's share of the hidden cap (or of the configured limit, if lower).
    slots: Arc<Semaphore>,
    /// Callers take their turn in arrival order.
    turn: tokio::sync::Mutex<()>,
    /// Its share of each bucket, per minute (requests, tokens).
    share: (f64, f64),
    /// What its share holds (requests, tokens) at the instant.
    level: RefCell<(f64, f64, Instant)>,
}

impl BucketOracle {
    pub(crate) fn new(env: &WorkerEnv, bucket: &Bucket) -> Self {
        let processes = env.processes.max(1) as f64;
        let share = (f64::from(bucket.rpm) / processes, f64::from(bucket.tpm) / processes);
        let cap = if bucket.cap > 0 { (bucket.cap as usize).min(env.limit as usize) } else { env.limit as usize };
        Self {
            slots: Arc::new(Semaphore::new(share_of(cap, env.index, env.processes))),
            turn: tokio::sync::Mutex::new(()),
            share,
            level: RefCell::new((share.0, share.1, Instant::now())),
        }
    }

    /// Its share refilled to now.
    fn refill(&self) -> (f64, f64) {
        let mut level = self.level.borrow_mut();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(level.2).as_secs_f64();
        level.0 = (level.0 + elapsed * self.share.0 / 60.0).min(self.share.0);
        level.1 = (level.1 + elapsed * self.share.1 / 60.0).min(self.share.1);
        level.2 = now;
        (level.0, level.1)
    }

    /// Waits for its turn and a place under the cap (or the limit), nothing else.
    pub(crate) async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        let _turn = self.turn.lock().await;
        self.slots.clone().acquire_owned().await.ok()
    }

    /// Waits for its turn, a place under the cap, and until its share holds `cost` tokens and
    /// a request; takes them. The place is held until the permit is dropped (the answer).
    pub(crate) async fn acquire(&self, cost: u64) -> Option<OwnedSemaphorePermit> {
        let _turn = self.turn.lock().await;
        let permit = self.slots.clone().acquire_owned().await.ok()?;
        let cost = (cost as f64).min(self.share.1);
        loop {
            let (requests, tokens) = self.refill();
            if requests >= 1.0 && tokens >= cost {
                let mut level = self.level.borrow_mut();
                level.0 -= 1.0;
                level.1 -= cost;
                return Some(permit);
            }
            let wait_requests = (1.0 - requests).max(0.0) / (self.share.0 / 60.0);
            let wait_tokens = (cost - tokens).max(0.0) / (self.share.1 / 60.0);
            let wait = Duration::from_secs_f64(wait_requests.max(wait_tokens).min(60.0));
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_the_total() {
        assert_eq!((share_of(8, 0, 4), share_of(10, 1, 4), share_of(10, 2, 4), share_of(2, 3, 4)), (2, 3, 2, 1));
    }
}
