//! The coordinator actor: owns the shared store connection and every upstream's permits.
//!
//! One acquire loop per upstream serves all of this process's waiters in FIFO order: only the
//! head of the queue is asked for at any time, so Redis load grows with the number of
//! processes, not with the number of waiting callers. A denial says why: during a COOLDOWN the
//! loop sleeps until it ends (with a little jitter); at the limit it waits for a release — its
//! own (immediately) or another process's (announced on pub/sub) — with a slow poll as a safety
//! net. A lease watchdog renews this process's permits every third of their lease in one call
//! per upstream.

mod pubsub;
mod waiters;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Handler, MessageResult, SpawnHandle, WrapFuture};
use rand::Rng;
use wavegate_core::{Admission, Clock, DenyReason, LocalGate, MonotonicClock, UpstreamConfig, WaveSignal, duration_ms};
use wavegate_redis::{SharedGate, Store, StoreError};

use crate::error::Error;
use crate::ids::PermitIds;
use crate::messages::{Acquire, Finish, Grant, ReadMode, ReadStatus, Wake};
use crate::status::{Mode, UpstreamStatus};
use waiters::{Waiter, Waiters};

/// How long to wait before asking again at the limit when no release is announced.
const AT_LIMIT_POLL: (Duration, Duration) = (Duration::from_millis(250), Duration::from_millis(500));
/// How long to wait before asking again after a store error.
const STORE_ERROR_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(150));
/// The most jitter added to the end of a cooldown, so the fleet does not ask at one instant.
const COOLDOWN_JITTER: Duration = Duration::from_millis(50);

/// One upstream, as the coordinator keeps it.
#[derive(Debug)]
struct Slot {
    config: UpstreamConfig,
    local: LocalGate,
    shared: Option<SharedGate>,
    waiters: Waiters,
    /// Permits this process holds: id → wave.
    held: HashMap<String, u64>,
    /// An acquire script call is in flight.
    pumping: bool,
    /// A wake arrived while a call was in flight: ask again as soon as it returns.
    wake_pending: bool,
    retry_timer: Option<SpawnHandle>,
    cooldown_until: Option<Instant>,
}

/// The coordinator actor.
#[derive(Debug)]
pub(crate) struct Coordinator {
    slots: Vec<Slot>,
    clock: MonotonicClock,
    ids: PermitIds,
    store: Option<Store>,
    mode: Mode,
}

impl Coordinator {
    pub(crate) fn new(upstreams: Vec<UpstreamConfig>, store: Option<Store>) -> Self {
        let slots = upstreams
            .into_iter()
            .map(|config| Slot {
                local: LocalGate::new(config.wave().clone()),
                shared: store.as_ref().map(|s| SharedGate::new(s.clone(), config.name(), config.wave())),
                config,
                waiters: Waiters::default(),
                held: HashMap::new(),
                pumping: false,
                wake_pending: false,
                retry_timer: None,
                cooldown_until: None,
            })
            .collect();
        let mode = if store.is_some() { Mode::Shared } else { Mode::Local };
        Self { slots, clock: MonotonicClock::new(), ids: PermitIds::new(), store, mode }
    }

    fn shared_gate(&self, upstream: usize) -> Option<SharedGate> {
        match self.mode {
            Mode::Shared => self.slots[upstream].shared.clone(),
            Mode::Local => None,
        }
    }

    /// Serves the head of the queue: locally in a loop, or with one script call in flight.
    fn pump(&mut self, upstream: usize, ctx: &mut Context<Self>) {
        loop {
            self.expire(upstream, Instant::now());
            let slot = &mut self.slots[upstream];
            if slot.pumping {
                slot.wake_pending = true;
                return;
            }
            let Some(head) = slot.waiters.head() else { return };
            let id = head.id.clone();
            if let Some(timer) = slot.retry_timer.take() {
                ctx.cancel_future(timer);
            }
            let lease = slot.config.permit_ttl();
            let shared = self.shared_gate(upstream);
            if let Some(gate) = shared {
                let slot = &mut self.slots[upstream];
                slot.pumping = true;
                slot.wake_pending = false;
                let asked = id.clone();
                let call = async move { gate.acquire(&asked, lease).await };
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    act.slots[upstream].pumping = false;
                    match result {
                        Ok(acquired) => {
                            if act.on_admission(upstream, id, acquired.admission, ctx)
                                || act.slots[upstream].wake_pending
                            {
                                act.pump(upstream, ctx);
                            }
                        }
                        Err(error) => act.on_store_error(upstream, "acquire", &error, ctx),
                    }
                }));
                return;
            }
            let now_ms = self.clock.now_ms();
            let admission = self.slots[upstream].local.acquire(&id, now_ms, duration_ms(lease));
            if !self.on_admission(upstream, id, admission, ctx) {
                return;
            }
        }
    }

    /// Applies an acquire's answer; returns whether the next waiter may be served now.
    fn on_admission(&mut self, upstream: usize, id: String, admission: Admission, ctx: &mut Context<Self>) -> bool {
        let now = Instant::now();
        match admission {
            Admission::Granted { wave, state, limit } => {
                let slot = &mut self.slots[upstream];
                slot.cooldown_until = None;
                let Some(waiter) = slot.waiters.pop_if(&id) else {
                    // The caller gave up while the script ran: give the permit back.
                    self.release(upstream, id, wave, WaveSignal::Neutral, ctx);
                    return true;
                };
                slot.held.insert(id.clone(), wave);
                let grant = Grant { id, wave, state, limit, waited: now.saturating_duration_since(waiter.enqueued) };
                if let Err(Ok(grant)) = waiter.reply.send(Ok(grant)) {
                    slot.held.remove(&grant.id);
                    self.release(upstream, grant.id, wave, WaveSignal::Neutral, ctx);
                }
                true
            }
            Admission::Denied { reason: DenyReason::Cooldown, retry_after_ms } => {
                let rest = Duration::from_millis(retry_after_ms);
                self.slots[upstream].cooldown_until = Some(now + rest);
                let jitter = COOLDOWN_JITTER.mul_f64(rand::rng().random::<f64>());
                self.retry_in(upstream, rest + jitter, ctx);
                false
            }
            Admission::Denied { reason: DenyReason::AtLimit, .. } => {
                self.retry_in(upstream, jittered(AT_LIMIT_POLL), ctx);
                false
            }
        }
    }

    fn on_store_error(&mut self, upstream: usize, command: &'static str, error: &StoreError, ctx: &mut Context<Self>) {
        tracing::warn!(upstream = %self.slots[upstream].config.name(), command, %error, "shared store error");
        self.retry_in(upstream, jittered(STORE_ERROR_RETRY), ctx);
    }

    fn retry_in(&mut self, upstream: usize, after: Duration, ctx: &mut Context<Self>) {
        let slot = &mut self.slots[upstream];
        if let Some(timer) = slot.retry_timer.take() {
            ctx.cancel_future(timer);
        }
        slot.retry_timer = Some(ctx.run_later(after, move |act, ctx| {
            act.slots[upstream].retry_timer = None;
            act.pump(upstream, ctx);
        }));
    }

    /// Answers the waiters whose deadline has passed.
    fn expire(&mut self, upstream: usize, now: Instant) {
        let slot = &mut self.slots[upstream];
        let expired = slot.waiters.take_expired(now);
        if expired.is_empty() {
            return;
        }
        let retry_after = slot.cooldown_until.map(|until| until.saturating_duration_since(now));
        for waiter in expired {
            Waiters::time_out(waiter, slot.config.name().as_str(), now, retry_after);
        }
    }

    /// Releases a permit and reports its outcome; serves the queue again once it is done.
    fn release(&mut self, upstream: usize, id: String, wave: u64, signal: WaveSignal, ctx: &mut Context<Self>) {
        match self.shared_gate(upstream) {
            Some(gate) => {
                let call = async move { gate.finish(&id, wave, signal).await };
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    if let Err(error) = result {
                        act.on_store_error(upstream, "finish", &error, ctx);
                    }
                    act.pump(upstream, ctx);
                }));
            }
            None => {
                let now_ms = self.clock.now_ms();
                self.slots[upstream].local.finish(&id, wave, signal, now_ms);
            }
        }
    }

    /// The lease watchdog: renews every permit this process holds for `upstream`.
    fn renew(&mut self, upstream: usize, ctx: &mut Context<Self>) {
        let slot = &mut self.slots[upstream];
        if slot.held.is_empty() {
            return;
        }
        let ids: Vec<String> = slot.held.keys().cloned().collect();
        let lease = slot.config.permit_ttl();
        let shared = self.shared_gate(upstream);
        match shared {
            Some(gate) => {
                let call = async move { gate.renew(&ids, lease).await };
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    if let Err(error) = result {
                        act.on_store_error(upstream, "renew", &error, ctx);
                    }
                }));
            }
            None => {
                let now_ms = self.clock.now_ms();
                self.slots[upstream].local.renew(ids.iter().map(String::as_str), now_ms, duration_ms(lease));
            }
        }
    }

    fn local_status(&mut self, upstream: usize) -> UpstreamStatus {
        let now_ms = self.clock.now_ms();
        let slot = &mut self.slots[upstream];
        let (snapshot, held) = slot.local.status(now_ms);
        UpstreamStatus {
            upstream: slot.config.name().to_string(),
            mode: self.mode,
            state: snapshot.state,
            limit: snapshot.limit,
            wave: snapshot.wave,
            cooldown_remaining: Duration::from_millis(snapshot.cooldown_until_ms.saturating_sub(now_ms)),
            in_flight_local: slot.held.len(),
            in_flight_fleet: u32::try_from(held).ok(),
            queue_depth: slot.waiters.len(),
            breaker: "closed",
        }
    }
}

/// A duration drawn uniformly from `[low, high]`.
fn jittered((low, high): (Duration, Duration)) -> Duration {
    low + (high - low).mul_f64(rand::rng().random::<f64>())
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        for (upstream, slot) in self.slots.iter().enumerate() {
            if slot.config.renews_leases() {
                let every = slot.config.permit_ttl() / 3;
                ctx.run_interval(every, move |act, ctx| act.renew(upstream, ctx));
            }
        }
        if let Some(store) = &self.store {
            let channels = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.shared.as_ref().map(|g| (g.keys().released.clone(), i)));
            pubsub::spawn_listener(store.config().clone(), channels.collect(), ctx.address());
            let store = store.clone();
            ctx.spawn(async move { store.preload_scripts().await }.into_actor(self).map(|result, _, _| {
                if let Err(error) = result {
                    tracing::warn!(%error, "could not preload the scripts; they will load on first use");
                }
            }));
        }
    }
}

impl Handler<Acquire> for Coordinator {
    type Result = ();

    fn handle(&mut self, acquire: Acquire, ctx: &mut Context<Self>) {
        let upstream = acquire.upstream;
        let now = Instant::now();
        let slot = &mut self.slots[upstream];
        let capacity = slot.config.queue_capacity().get();
        if slot.waiters.len() >= capacity {
            let name = slot.config.name().to_string();
            let _ = acquire.reply.send(Err(Error::QueueFull { upstream: name, capacity }));
            return;
        }
        let id = self.ids.next_id();
        let slot = &mut self.slots[upstream];
        slot.waiters.push(Waiter { id, enqueued: now, deadline: acquire.deadline, reply: acquire.reply });
        ctx.run_later(acquire.deadline.saturating_duration_since(now), move |act, _| {
            act.expire(upstream, Instant::now());
        });
        self.pump(upstream, ctx);
    }
}

impl Handler<Finish> for Coordinator {
    type Result = ();

    fn handle(&mut self, finish: Finish, ctx: &mut Context<Self>) {
        self.slots[finish.upstream].held.remove(&finish.id);
        self.release(finish.upstream, finish.id, finish.wave, finish.signal, ctx);
        if self.shared_gate(finish.upstream).is_none() {
            self.pump(finish.upstream, ctx);
        }
    }
}

impl Handler<Wake> for Coordinator {
    type Result = ();

    fn handle(&mut self, wake: Wake, ctx: &mut Context<Self>) {
        if wake.upstream < self.slots.len() {
            self.pump(wake.upstream, ctx);
        }
    }
}

impl Handler<ReadStatus> for Coordinator {
    type Result = ();

    fn handle(&mut self, read: ReadStatus, ctx: &mut Context<Self>) {
        let mut status = self.local_status(read.upstream);
        match self.shared_gate(read.upstream) {
            Some(gate) => {
                let call = async move { gate.status().await };
                ctx.spawn(call.into_actor(self).map(move |result, _, _| {
                    match result {
                        Ok(shared) => {
                            status.state = shared.state;
                            status.limit = shared.limit;
                            status.wave = shared.wave;
                            status.cooldown_remaining = shared.cooldown_remaining;
                            status.in_flight_fleet = Some(shared.in_flight);
                        }
                        Err(_) => status.in_flight_fleet = None,
                    }
                    let _ = read.reply.send(status);
                }));
            }
            None => {
                let _ = read.reply.send(status);
            }
        }
    }
}

impl Handler<ReadMode> for Coordinator {
    type Result = MessageResult<ReadMode>;

    fn handle(&mut self, _: ReadMode, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.mode)
    }
}
