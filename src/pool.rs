//! Pools: one logical upstream over several keys or deployments, each a configured upstream.
//!
//! Every member is a full upstream — its own limit, wave, budgets, breaker, provider windows
//! and spent-quota refusal, shared in Redis under its own name — so a member can be a real
//! upstream underneath (an API key, an Azure deployment). A pooled request goes to the member
//! with the most headroom (this process's view, the fleet's permits as last heard; or by weight, or in order: [`PoolPolicy`]), and on a 429,
//! a 5xx, a transport failure or a refusal of the member (breaker open, quota spent, retry
//! budget spent, no permit in time) it moves to another member, within its deadline. Only when
//! every member refused it in a round does it wait: for the shortest `Retry-After` it was told
//! (bounded like a cooldown) or a backoff, then tries them all again. Each attempt is reported
//! to its member (its wave, breaker and windows learn from it); metrics and status are per
//! member (names from the configuration), plus `wavegate_pool_picks_total{pool, member}` and
//! `wavegate_pool_moves_total{pool, member, reason}`. A member that can never take the
//! request (it lacks its priority class, or its estimate never fits) is left out of the next
//! rounds, and a request no member can take ends at once.
//!
//! A pooled request is built like an upstream's ([`RequestBuilder`]: tokens, priority, tenant,
//! deadline, classify, meter) and ends with `call` (the closure is also told the member),
//! `call_stream` (the same, for a streamed answer that holds its member's permit to its end) or
//! `acquire` (a permit of one member, [`Permit::upstream`] names it).
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

use wavegate_core::{LiveChange, LiveError, MemberView, Outcome, PoolPolicy, UnknownUpstream};

use crate::attempt::{Attempt, acquire_permit};
use futures_util::Stream;

use crate::call::{Kept, attempt_on};
use crate::classify::{Classify, Meter, Reserved};
use crate::engine::clock::{self, Instant};
use crate::engine::request::{AttemptKind, Request};
use crate::error::{Error, ErrorKind};
use crate::handle::{Inner, PoolSlot};
use crate::held::Hold;
use crate::metrics;
use crate::permit::Permit;
use crate::pool_membership::PoolMembership;
use crate::request_builder::{RequestBuilder, ToPool};
use crate::status::UpstreamStatus;
use crate::stream::{HeldStream, StreamMeter};

/// The shortest wait when every member refused a request in a round and none said when to
/// come back.
const ROUND_WAIT_MIN: Duration = Duration::from_millis(50);
/// How long a spillover request waits at a member while a later one has room: long enough for
/// the member's gate to answer (the store's default command timeout), so a member the fleet
/// has filled passes the request on instead of holding it.
const SPILL_PATIENCE: Duration = Duration::from_millis(250);

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

    /// The members in force now, in the order a [`PoolPolicy::Spillover`] pool tries them, with
    /// their weights: the configured ones with their live weights (those taken out left out),
    /// then the upstreams put in live. See [`set_member`](Self::set_member).
    pub fn members_in_force(&self) -> Vec<(&str, u32)> {
        in_force(&self.inner, self.slot())
            .into_iter()
            .map(|(upstream, weight)| (self.inner.upstreams[upstream].name().as_str(), weight))
            .collect()
    }

    /// Sets `member`'s weight in this pool, fleet-wide, until changed: 0 takes it out (the
    /// pool's requests no longer pick it; calls already on it finish there), 1..=1000 puts it
    /// in with that weight — also an upstream of this scheduler the pool was not configured
    /// with, which then comes after the configured members. Stored with the member upstream's
    /// live settings ([`LiveChange::pool_member`](wavegate_core::LiveChange::pool_member)),
    /// under its version, which it answers; every process of the fleet applies it within a
    /// second of the change (at once where the announcement reaches it) and logs it once. A
    /// pooled request reads the members when it starts. Taking out every member leaves the
    /// pool on its configured members (logged as a warning). See `docs/operations.md`.
    ///
    /// ```
    /// use wavegate::{PoolConfig, Scheduler, UpstreamConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let scheduler = Scheduler::builder()
    ///     .upstream(UpstreamConfig::builder("key-a").limit(4).build()?)
    ///     .upstream(UpstreamConfig::builder("key-b").limit(4).build()?)
    ///     .pool(PoolConfig::builder("gpt").member("key-a", 1).member("key-b", 1).build()?)
    ///     .build()?;
    /// let gpt = scheduler.pool("gpt")?;
    /// gpt.set_member("key-a", 0).await?; // key-a out, e.g. while its deployment is replaced
    /// assert_eq!(gpt.members_in_force(), [("key-b", 1)]);
    /// gpt.clear_member("key-a").await?;
    /// assert_eq!(gpt.members_in_force(), [("key-a", 1), ("key-b", 1)]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::UnknownUpstream`] when `member` is not an upstream of this scheduler;
    /// [`ErrorKind::InvalidSetting`] for a weight above 1000; otherwise as
    /// [`Upstream::set_limit`](crate::Upstream::set_limit) (the store unavailable: nothing
    /// changed).
    pub async fn set_member(&self, member: &str, weight: u32) -> Result<u64, Error> {
        self.change(member, LiveChange::pool_member(self.name(), weight, None)).await
    }

    /// Sets `member`'s weight in this pool for `ttl` only (an override): when it runs out,
    /// every process goes back to the configured membership. Otherwise as
    /// [`set_member`](Self::set_member).
    ///
    /// # Errors
    ///
    /// As [`set_member`](Self::set_member); also [`ErrorKind::InvalidSetting`] for a `ttl`
    /// under 1 ms or over 7 days.
    pub async fn override_member(&self, member: &str, weight: u32, ttl: Duration) -> Result<u64, Error> {
        self.change(member, LiveChange::pool_member(self.name(), weight, Some(ttl))).await
    }

    /// Drops `member`'s live weight in this pool: back to its configured weight if it is a
    /// configured member, out of the pool if it was only put in live. Answers the new version.
    ///
    /// # Errors
    ///
    /// As [`set_member`](Self::set_member).
    pub async fn clear_member(&self, member: &str) -> Result<u64, Error> {
        self.change(member, Ok(LiveChange::ClearPoolMember { pool: self.name().to_owned() })).await
    }

    async fn change(&self, member: &str, change: Result<LiveChange, LiveError>) -> Result<u64, Error> {
        let Some(upstream) = self.inner.upstreams.iter().position(|u| u.name().as_str() == member) else {
            let known = self.inner.upstreams.iter().map(|u| u.name().to_string()).collect::<Vec<_>>().join(", ");
            return Err(UnknownUpstream { name: member.to_owned(), known }.into());
        };
        let change = change.map_err(|error| Error::invalid_setting(member, error))?;
        self.inner.engine.change_live(upstream, change).await
    }

    /// A pooled request: say what it needs (the same builder as an upstream's request), then
    /// `call` it (the closure is told the member) or `acquire` a permit of a member.
    pub fn request(&self) -> RequestBuilder<'_, ToPool> {
        RequestBuilder::new(&self.inner, ToPool(self.index))
    }
}

impl<'a, C, M> RequestBuilder<'a, ToPool, C, M> {
    /// Runs the request: `f` is told the member (its upstream name, borrowed from the pool:
    /// which key or deployment to use) and the attempt. Each attempt runs as
    /// [`RequestBuilder::call`] runs one on an upstream; see the module docs for how members
    /// are picked and left. The deadline defaults to the longest total timeout of the members.
    pub async fn call<F, Fut, T, E>(self, f: F) -> Result<T, Error<E>>
    where
        F: FnMut(&'a str, Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
        M: Meter<T>,
    {
        self.run(f, &self.meter, false).await.map(|(value, _, _)| value)
    }

    /// Runs the request like [`call`](Self::call), for an answer that is a stream: as
    /// [`RequestBuilder::call_stream`] on an upstream, the last value becomes a
    /// [`HeldStream`] holding its member's permit until the stream ends or is dropped.
    pub async fn call_stream<F, Fut, T, E, S, I, SE>(
        self,
        f: F,
        into_stream: impl FnOnce(T) -> S,
    ) -> Result<HeldStream<S, M>, Error<E>>
    where
        F: FnMut(&'a str, Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
        S: Stream<Item = Result<I, SE>>,
        M: StreamMeter<I>,
    {
        let (value, kept, member) = self.run(f, &Reserved, true).await?;
        Ok(HeldStream::new(into_stream(value), self.meter, Hold::new(member, kept)))
    }

    /// The pooled call's loop; with `keep`, a success's permit stays held ([`Kept`]).
    async fn run<F, Fut, T, E, M2>(&self, mut f: F, meter: &M2, keep: bool) -> Result<(T, Kept, &'a str), Error<E>>
    where
        F: FnMut(&'a str, Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
        M2: Meter<T>,
    {
        let mut round = Round::new(self.inner, self.target.0, &self.request);
        let mut kind = AttemptKind::First;
        loop {
            let (member, permit) = round.next_permit(&self.request, kind).await?;
            let config = &self.inner.upstreams[member];
            let member_name: &'a str = config.name().as_str();
            round.attempts += 1;
            let mut on_member = |attempt| f(member_name, attempt);
            let timeout = config.call_timeout();
            let ran = attempt_on(
                permit,
                &mut on_member,
                round.attempts,
                round.deadline,
                timeout,
                &self.classify,
                meter,
                keep,
            );
            let Some((outcome, result, held)) = ran.await else {
                return Err(Error::deadline_passed(round.name, round.attempts));
            };
            let moves = match outcome {
                Outcome::RateLimited { .. } => Some(("rate_limited", AttemptKind::AfterRateLimit)),
                // A call that is not safe to repeat moves on only if it never left.
                Outcome::Transient { .. } | Outcome::ServerError { .. }
                    if config.retries_transient() || outcome.never_sent() =>
                {
                    Some((outcome.label(), AttemptKind::AfterTransient))
                }
                _ => None,
            };
            let source = match result {
                Some(Ok(value)) if moves.is_none() => {
                    return Ok((value, Kept { outcome, attempts: round.attempts, held }, member_name));
                }
                Some(Err(source)) => Some(source),
                _ => None,
            };
            let error = Error::upstream_failed(member_name, outcome, round.attempts, source);
            let Some((reason, next)) = moves else { return Err(error) };
            metrics::pool_move(round.name, member_name, reason);
            round.refused(member, outcome.retry_after());
            round.last = Some(error);
            kind = next;
        }
    }

    /// A permit of one member for a call the caller makes itself ([`Permit::upstream`] names
    /// the member): the member with the most room first, the next when one refuses (breaker,
    /// spent quota, no permit in time), within the deadline (or the longest `max_wait` of the
    /// members).
    pub async fn acquire(self) -> Result<Permit, Error> {
        let mut request = self.request;
        let inner = self.inner;
        let members = in_force(inner, &inner.pools[self.target.0]);
        let longest = members.iter().map(|&(m, _)| inner.upstreams[m].max_wait()).max().unwrap_or_default();
        let by = clock::after(Instant::now(), longest);
        request.deadline = Some(request.deadline.map_or(by, |deadline| deadline.min(by)));
        let mut round = Round::new(inner, self.target.0, &request);
        round.next_permit(&request, AttemptKind::First).await.map(|(_, permit)| permit)
    }
}

/// One pooled request's walk over the members: who refused it this round, what it was told.
struct Round<'a, E> {
    inner: &'a Inner,
    slot: &'a PoolSlot,
    name: &'a str,
    /// The members in force when the request started (upstream index, weight), in order.
    members: Vec<(usize, u32)>,
    deadline: Instant,
    refused: Vec<bool>,
    /// Members that refused the request for good (a class they lack, an estimate they can
    /// never fit): skipped in the next rounds.
    never: Vec<bool>,
    told_wait: Option<Duration>,
    rounds: u32,
    attempts: u32,
    /// The last refusal or failure, told when nothing else can be.
    last: Option<Error<E>>,
}

impl<'a, E> Round<'a, E> {
    fn new(inner: &'a Inner, pool: usize, request: &Request) -> Self {
        let slot = &inner.pools[pool];
        let members = in_force(inner, slot);
        let longest = members.iter().map(|&(m, _)| inner.upstreams[m].total_timeout()).max().unwrap_or_default();
        let deadline = request.deadline.unwrap_or_else(|| clock::after(Instant::now(), longest));
        Round {
            inner,
            slot,
            name: slot.config.name().as_str(),
            deadline,
            refused: vec![false; members.len()],
            never: vec![false; members.len()],
            members,
            told_wait: None,
            rounds: 0,
            attempts: 0,
            last: None,
        }
    }

    /// `member` refused the request, or failed it, saying when to come back if it did.
    fn refused(&mut self, member: usize, retry_after: Option<Duration>) {
        if let Some(at) = self.members.iter().position(|&(m, _)| m == member) {
            self.refused[at] = true;
        }
        if let Some(after) = retry_after {
            self.told_wait = Some(self.told_wait.map_or(after, |told| told.min(after)));
        }
    }

    /// The end of the walk: the last refusal or failure, or the deadline.
    fn give_up(&mut self) -> Error<E> {
        self.last.take().unwrap_or_else(|| Error::deadline_passed(self.name, self.attempts))
    }

    /// A permit of the best member that has not refused this round (waiting between rounds
    /// when every member refused), or the error that ends the request.
    async fn next_permit(&mut self, request: &Request, kind: AttemptKind) -> Result<(usize, Permit), Error<E>> {
        let (inner, slot) = (self.inner, self.slot);
        let weights: Vec<u32> = self.members.iter().map(|&(_, weight)| weight).collect();
        let members: Vec<usize> = self.members.iter().map(|&(member, _)| member).collect();
        let members = &members[..];
        loop {
            let now = Instant::now();
            if now >= self.deadline {
                return Err(self.give_up());
            }
            let spent: Vec<Option<Duration>> = members.iter().map(|&m| inner.quota[m].remaining()).collect();
            if spent.iter().all(Option::is_some) {
                // Every key's quota is spent: no round can help.
                let retry_after = spent.iter().flatten().min().copied().unwrap_or_default();
                return Err(Error::quota_exhausted(self.name, self.attempts, retry_after));
            }
            if self.never.iter().all(|n| *n) {
                // No member can ever take it.
                return Err(self.give_up());
            }
            if self.refused.iter().all(|r| *r) {
                // Every member said no in this round: wait as told (or a backoff), then again.
                let cooldown_max = members.iter().map(|&m| inner.upstreams[m].wave().cooldown.max()).min();
                let backoff = inner.upstreams[members[0]].backoff().delay(self.rounds, &mut rand::rng());
                let wait = self.told_wait.unwrap_or(backoff).max(ROUND_WAIT_MIN).min(cooldown_max.unwrap_or(backoff));
                if clock::after(now, wait) >= self.deadline {
                    return Err(self.give_up());
                }
                tokio::time::sleep(wait).await;
                self.refused.clone_from(&self.never);
                self.told_wait = None;
                self.rounds += 1;
            }
            let rooms = inner.engine.headroom(members).await.map_err(Error::widen)?;
            let views: Vec<MemberView> = (0..members.len())
                .map(|i| MemberView {
                    headroom: rooms[i].free(),
                    weight: weights[i],
                    available: !self.refused[i] && !rooms[i].blocked,
                    picked: slot.picked[members[i]].load(Ordering::Relaxed),
                })
                .collect();
            let order = slot.config.policy().order(&views);
            // The best member this round has not heard no from (a blocked one waits in its queue).
            let Some(&pick) = order.iter().find(|&&i| !self.refused[i]) else { continue };
            let member = members[pick];
            let config = &inner.upstreams[member];
            slot.picked[member].fetch_add(1, Ordering::Relaxed);
            metrics::pool_pick(self.name, config.name().as_str());
            let mut wait_until = self.deadline.min(clock::after(Instant::now(), config.max_wait()));
            let later_has_room = order
                .iter()
                .skip_while(|&&i| i != pick)
                .skip(1)
                .any(|&i| !self.refused[i] && views[i].available && views[i].headroom > 0);
            if slot.config.policy() == PoolPolicy::Spillover && later_has_room {
                wait_until = wait_until.min(clock::after(Instant::now(), SPILL_PATIENCE));
            }
            match acquire_permit(inner, member, request, kind, wait_until).await {
                Ok(permit) => return Ok((member, permit)),
                Err(error) if error.kind() == ErrorKind::Stopped => return Err(error.widen()),
                Err(error) => {
                    // A refusal of this member (breaker, quota, retry budget, class, no permit
                    // in time): another member may take it.
                    metrics::pool_move(self.name, config.name().as_str(), error.code());
                    self.refused(member, error.retry_after());
                    if matches!(error.kind(), ErrorKind::UnknownClass | ErrorKind::InsufficientCapacity)
                        && !error.is_retryable()
                    {
                        self.never[pick] = true;
                    }
                    self.last = Some(error.with_attempts(self.attempts).widen());
                }
            }
        }
    }
}

/// The members of `slot` in force now: the configured ones with their live weights, without
/// those taken out, then the upstreams put in live (`pool_membership.rs`). When every member
/// was taken out, the configured members: a pool with none would refuse every request, which
/// no operator means (take the pool's callers elsewhere instead).
fn in_force(inner: &Inner, slot: &PoolSlot) -> Vec<(usize, u32)> {
    let members = members_in_force(slot, &inner.membership);
    let all_out = members.is_empty();
    // Said once each time it starts, not at every request.
    if all_out && !slot.all_out.swap(true, Ordering::Relaxed) {
        tracing::warn!(pool = %slot.config.name(), "every member of the pool is taken out live: using the configured members");
    } else if !all_out {
        slot.all_out.store(false, Ordering::Relaxed);
    }
    if all_out {
        return slot.members.iter().copied().zip(slot.config.members().iter().map(|(_, weight)| *weight)).collect();
    }
    members
}

/// The members of `slot` in force now, given every upstream's `membership`: (upstream index,
/// weight), the configured members first (those not taken out), then the upstreams put in.
fn members_in_force(slot: &PoolSlot, membership: &[Arc<PoolMembership>]) -> Vec<(usize, u32)> {
    let pool = slot.config.name().as_str();
    let configured = slot
        .members
        .iter()
        .zip(slot.config.members())
        .map(|(&upstream, (_, weight))| (upstream, membership[upstream].weight(pool).unwrap_or(*weight)));
    let joined = (0..membership.len())
        .filter(|upstream| !slot.members.contains(upstream))
        .filter_map(|upstream| membership[upstream].weight(pool).map(|weight| (upstream, weight)));
    configured.chain(joined).filter(|&(_, weight)| weight > 0).collect()
}
