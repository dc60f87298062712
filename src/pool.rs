//! Pools: one logical upstream over several keys or deployments, each a configured upstream.
//!
//! Every member is a full upstream — its own limit, wave, budgets, breaker, provider windows
//! and spent-quota refusal, shared in Redis under its own name — so a member can be a real
//! upstream underneath (an API key, an Azure deployment). A pooled request goes to the member
//! with the most headroom as this process sees it (or by weight, [`PoolPolicy`]), and on a 429,
//! a 5xx, a transport failure or a refusal of the member (breaker open, quota spent, retry
//! budget spent, no permit in time) it moves to another member, within its deadline. Only when
//! every member refused it in a round does it wait: for the shortest `Retry-After` it was told
//! (bounded like a cooldown) or a backoff, then tries them all again. Each attempt is reported
//! to its member (its wave, breaker and windows learn from it); metrics and status are per
//! member (names from the configuration), plus `wavegate_pool_picks_total{pool, member}` and
//! `wavegate_pool_moves_total{pool, member, reason}`.
//!
//! ```
//! use wavegate::PoolConfig;
//! use wavegate::{Outcome, Scheduler, UpstreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::builder()
//!     .upstream(UpstreamConfig::builder("gpt-key-a").limit(4).build()?)
//!     .upstream(UpstreamConfig::builder("gpt-key-b").limit(4).build()?)
//!     .pool(PoolConfig::builder("gpt").member("gpt-key-a", 1).member("gpt-key-b", 1).build()?)
//!     .build()?;
//! let gpt = scheduler.pool("gpt")?;
//! // The closure is told which member (key) to use.
//! let answer = gpt.request().call(|member, _attempt| async move { Ok::<_, Outcome>(format!("via {member}")) }).await?;
//! assert!(answer.starts_with("via gpt-key-"));
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use wavegate_core::{MemberView, Outcome, TransportError, UnknownUpstream};

use crate::attempt::{Attempt, acquire_permit};
use crate::classify::{ByError, Classify, Meter, Reserved};
use crate::engine::clock::{self, Instant};
use crate::engine::request::{AttemptKind, Request};
use crate::error::Error;
use crate::handle::{Inner, PoolSlot};
use crate::metrics;
use crate::status::UpstreamStatus;

/// The shortest wait when every member refused a request in a round and none said when to
/// come back.
const ROUND_WAIT_MIN: Duration = Duration::from_millis(50);

/// The handle of one pool, resolved once ([`Scheduler::pool`](crate::Scheduler::pool)).
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
    index: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("name", &self.name()).finish()
    }
}

impl Pool {
    pub(crate) fn new(inner: Arc<Inner>, index: usize) -> Self {
        Self { inner, index }
    }

    pub(crate) fn find(inner: &Arc<Inner>, name: &str) -> Result<Self, UnknownUpstream> {
        match inner.pools.iter().position(|p| p.config.name().as_str() == name) {
            Some(index) => Ok(Self::new(inner.clone(), index)),
            None => Err(UnknownUpstream {
                name: name.to_string(),
                known: inner.pools.iter().map(|p| p.config.name().to_string()).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    fn slot(&self) -> &PoolSlot {
        &self.inner.pools[self.index]
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        self.slot().config.name().as_str()
    }

    /// The members' names, in configured order.
    pub fn members(&self) -> impl Iterator<Item = &str> {
        self.slot().config.members().iter().map(|(name, _)| name.as_str())
    }

    /// Every member's status, in configured order.
    pub async fn status(&self) -> Result<Vec<UpstreamStatus>, Error> {
        let mut all = Vec::with_capacity(self.slot().members.len());
        for &member in &self.slot().members {
            all.push(self.inner.status(member).await?);
        }
        Ok(all)
    }

    /// A pooled request: say what it needs, then [`call`](PoolRequest::call) it.
    pub fn request(&self) -> PoolRequest<'_> {
        PoolRequest { pool: self, tokens: 0, deadline: None, classify: ByError, meter: Reserved }
    }
}

/// One pooled request being described; see [`Pool::request`].
#[derive(Debug)]
#[must_use = "a request does nothing until `call` is awaited"]
pub struct PoolRequest<'p, C = ByError, M = Reserved> {
    pool: &'p Pool,
    tokens: u64,
    deadline: Option<Instant>,
    classify: C,
    meter: M,
}

impl<'p, C, M> PoolRequest<'p, C, M> {
    /// Tokens to reserve at the member for each attempt (its tokens budget and the provider's
    /// tokens window).
    pub fn tokens(mut self, estimate: u64) -> Self {
        self.tokens = estimate;
        self
    }

    /// When the whole request must be over (moves between members included). Default: the
    /// longest total timeout of the members.
    pub fn deadline(mut self, deadline: std::time::Instant) -> Self {
        self.deadline = Some(clock::from_std(deadline));
        self
    }

    /// How the result is classified (default [`ByError`]).
    pub fn classify<C2>(self, classify: C2) -> PoolRequest<'p, C2, M> {
        PoolRequest { pool: self.pool, tokens: self.tokens, deadline: self.deadline, classify, meter: self.meter }
    }

    /// How the tokens really used are read from a success (default: the reservation).
    pub fn meter<M2>(self, meter: M2) -> PoolRequest<'p, C, M2> {
        PoolRequest { pool: self.pool, tokens: self.tokens, deadline: self.deadline, classify: self.classify, meter }
    }

    /// Runs the request: `f` is told the member (its upstream name, borrowed from the pool:
    /// which key or deployment to use) and the attempt. See the module docs for how members
    /// are picked and left.
    pub async fn call<F, Fut, T, E>(self, mut f: F) -> Result<T, Error<E>>
    where
        F: FnMut(&'p str, Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
        M: Meter<T>,
    {
        let pool: &'p Pool = self.pool;
        let inner: &'p Inner = &pool.inner;
        let slot = pool.slot();
        let pool_name = pool.name();
        let members = &slot.members;
        let longest = members.iter().map(|&m| inner.upstreams[m].total_timeout()).max().unwrap_or_default();
        let deadline = self.deadline.unwrap_or_else(|| clock::after(Instant::now(), longest));
        let mut refused = vec![false; members.len()];
        let mut told_wait: Option<Duration> = None;
        let mut attempts = 0u32;
        let mut last: Option<Error<E>> = None;
        let mut kind = AttemptKind::First;
        let mut rounds = 0u32;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(last.unwrap_or(Error::deadline_passed(pool_name, attempts)));
            }
            let spent: Vec<Option<Duration>> = members.iter().map(|&m| inner.quota[m].remaining()).collect();
            if spent.iter().all(Option::is_some) {
                // Every key's quota is spent: no round can help.
                let retry_after = spent.iter().flatten().min().copied().unwrap_or_default();
                return Err(Error::quota_exhausted(pool_name, attempts, retry_after));
            }
            if refused.iter().all(|r| *r) {
                // Every member said no in this round: wait as told (or a backoff), then again.
                let cooldown_max = members.iter().map(|&m| inner.upstreams[m].wave().cooldown.max()).min();
                let backoff = inner.upstreams[members[0]].backoff().delay(rounds, &mut rand::rng());
                let wait = told_wait.unwrap_or(backoff).max(ROUND_WAIT_MIN).min(cooldown_max.unwrap_or(backoff));
                if now + wait >= deadline {
                    return Err(last.unwrap_or(Error::deadline_passed(pool_name, attempts)));
                }
                tokio::time::sleep(wait).await;
                refused.iter_mut().for_each(|r| *r = false);
                told_wait = None;
                rounds += 1;
            }
            let rooms = inner.engine.headroom(members).await.map_err(Error::widen)?;
            let views: Vec<MemberView> = members
                .iter()
                .enumerate()
                .map(|(i, &m)| MemberView {
                    headroom: i64::from(rooms[i].limit) - rooms[i].busy as i64,
                    weight: slot.config.members()[i].1,
                    available: !refused[i] && !rooms[i].blocked && inner.quota[m].remaining().is_none(),
                    picked: slot.picked[i].load(Ordering::Relaxed),
                })
                .collect();
            let order = slot.config.policy().order(&views);
            // The best member this round has not heard no from (a blocked one waits in its queue).
            let Some(&pick) = order.iter().find(|&&i| !refused[i]) else { continue };
            let member = members[pick];
            let config = &inner.upstreams[member];
            let member_name = config.name().as_str();
            slot.picked[pick].fetch_add(1, Ordering::Relaxed);
            metrics::pool_pick(pool_name, member_name);
            let wait_until = deadline.min(clock::after(Instant::now(), config.max_wait()));
            let request = Request { tokens: self.tokens, ..Request::new(config.default_class()) };
            let mut permit = match acquire_permit(inner, member, &request, kind, wait_until).await {
                Ok(permit) => permit,
                Err(error) => {
                    // A refusal of this member (breaker, quota, retry budget, no permit in
                    // time): another member may take it.
                    metrics::pool_move(pool_name, member_name, error.code());
                    if let Some(after) = error.retry_after() {
                        told_wait = Some(told_wait.map_or(after, |t| t.min(after)));
                    }
                    refused[pick] = true;
                    last = Some(error.widen());
                    continue;
                }
            };
            attempts += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = config.call_timeout().min(remaining);
            let attempt = Attempt { number: attempts, wave: permit.wave(), timeout, waited: permit.waited() };
            permit.request_sent();
            let answer = tokio::time::timeout(timeout, f(member_name, attempt)).await;
            let (outcome, result) = match answer {
                Ok(result) => (self.classify.classify(&result), Some(result)),
                Err(_) => (Outcome::from_transport(TransportError::Timeout), None),
            };
            match (&outcome, &result) {
                (Outcome::Success { .. }, Some(Ok(value))) => {
                    let used = self.meter.tokens_used(value, self.tokens);
                    permit.report_usage(outcome, used);
                }
                _ => permit.report(outcome),
            }
            let moves = match outcome {
                Outcome::RateLimited { .. } => Some(("rate_limited", AttemptKind::AfterRateLimit)),
                Outcome::Transient { .. } | Outcome::ServerError { .. } => {
                    Some((outcome.label(), AttemptKind::AfterTransient))
                }
                _ => None,
            };
            let Some((reason, next)) = moves else {
                return match result {
                    Some(Ok(value)) => Ok(value),
                    Some(Err(source)) => Err(Error::upstream_failed(member_name, outcome, attempts, Some(source))),
                    None => Err(Error::upstream_failed(member_name, outcome, attempts, None)),
                };
            };
            metrics::pool_move(pool_name, member_name, reason);
            if let Some(after) = outcome.retry_after() {
                told_wait = Some(told_wait.map_or(after, |t| t.min(after)));
            }
            refused[pick] = true;
            last = Some(match result {
                Some(Err(source)) => Error::upstream_failed(member_name, outcome, attempts, Some(source)),
                _ => Error::upstream_failed(member_name, outcome, attempts, None),
            });
            kind = next;
        }
    }
}
