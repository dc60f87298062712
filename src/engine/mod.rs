//! The engine (crate-private): one lane actor per upstream over one gate interface, and a
//! coordinator actor for what is fleet-wide.
//!
//! ```text
//! handle ── Acquire(Request) ──► Lane           admission once; queue; the gate in charge:
//!                                 │                 Gate::Local (in process) or Gate::Shared
//!        ◄── Grant | Error ─────── │                 (the Lua scripts), one Ask, one Decision
//! Grant ─── Finish ─────────────► Lane           release to the same gate; breaker; budgets
//! Lane ──── StoreTrouble ───────► Coordinator    an outage switches the failure domain
//! Coordinator ── Switch / Reconcile ──► Lanes    which gate is in charge, under which epoch
//! ```
//!
//! Time is tokio's everywhere (`clock.rs`), so tokio's paused time drives the engine in tests.

pub(crate) mod clock;
mod coordinator;
mod gate;
pub(crate) mod grant;
pub(crate) mod lane;
mod process_gate;
pub(crate) mod request;
mod runtime;
pub(crate) mod store;
mod wake;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32};

use actix::{Actor, Addr, AsyncContext, Context};
use tokio::sync::oneshot;
use wavegate_core::{Instance, LiveChange, UpstreamConfig};

use self::clock::Instant;
use self::coordinator::{Coordinator, ReadLive};
use self::grant::Grant;
use self::lane::{
    Acquire, ChangeLive, ClearWindows, Drain, DrainReply, Lane, LaneSetup, ReadHeadroom, ReadMode, ReadStatus,
};
use self::request::{AttemptKind, Request};
use self::store::Store;
use crate::error::Error;
use crate::history::HistoryRing;
use crate::pool_membership::PoolMembership;
use crate::quota::QuotaBlock;
use crate::status::{Mode, UpstreamStatus};
#[cfg(feature = "redis")]
pub(crate) use coordinator::HEARTBEAT_TTL;
pub(crate) use lane::{DRAIN_BOUND, Headroom};
pub(crate) use runtime::{ACTOR_THREAD, ActorThread};

/// What each upstream's lane shares with the handles, by upstream index.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shared<'a> {
    /// The spent quotas (`quota.rs`).
    pub(crate) quotas: &'a [Arc<QuotaBlock>],
    /// The second-by-second histories (`history.rs`).
    pub(crate) histories: &'a [Arc<HistoryRing>],
    /// The live weights in pools (`pool_membership.rs`).
    pub(crate) membership: &'a [Arc<PoolMembership>],
}

/// The engine of one scheduler: its actors, and the thread they run on when it owns one.
#[derive(Debug)]
pub(crate) struct Engine {
    coordinator: Addr<Coordinator>,
    lanes: Vec<Addr<Lane>>,
    /// The actors' own thread, when `build()` found no actix system; it stops with the engine.
    _thread: Option<ActorThread>,
}

impl Engine {
    /// Starts a lane per upstream and the coordinator: on the current thread's actix arbiter if
    /// there is one (actix-web, `#[actix::main]`), else on a thread of their own.
    /// In local mode, the lanes share the process's in-process gates of `namespace` (`None`:
    /// gates of their own). `process` is this process's instance in the store and the live
    /// processes its startup heartbeat counted (`None`: unknown yet).
    pub(crate) fn start(
        upstreams: &[UpstreamConfig],
        store: Option<Store>,
        namespace: Option<&str>,
        shared: Shared<'_>,
        process: (Instance, Option<u32>),
    ) -> std::io::Result<Self> {
        let Shared { quotas, histories, membership } = shared;
        let namespace: Option<Arc<str>> = namespace.map(Arc::from);
        let (arbiter, thread) = runtime::arbiter()?;
        let (instance, live) = process;
        // The coordinator's mailbox first, so the lanes can be given its address (as actix's
        // `start_in_arbiter` does, with the actor made afterwards).
        let (sender, receiver) = actix::dev::channel::channel(16);
        let coordinator = Addr::new(sender);
        let gates: Vec<_> = upstreams
            .iter()
            .map(|config| store.as_ref().map(|store| store::shared_gate(store, config, instance.as_str())))
            .collect();
        // Set by the coordinator's heartbeats: whether this process reads the shared gauges.
        let gauge_reader = Arc::new(AtomicBool::new(false));
        // Set by the coordinator's listener: whether this process hears the live changes
        // announced (its subscription is made).
        let hears_changes = Arc::new(AtomicBool::new(false));
        // Set by the coordinator's heartbeats: the processes live in the fleet (0: not known).
        let fleet_size = Arc::new(AtomicU32::new(0));
        let lanes: Vec<Addr<Lane>> = upstreams
            .iter()
            .enumerate()
            .map(|(upstream, config)| {
                let setup = LaneSetup {
                    upstream,
                    config: config.clone(),
                    instance: instance.clone(),
                    shared: gates[upstream].clone(),
                    store: store.clone(),
                    namespace: namespace.clone(),
                    quota: quotas[upstream].clone(),
                    history: histories[upstream].clone(),
                    membership: membership[upstream].clone(),
                    coordinator: coordinator.clone().recipient(),
                    gauge_reader: gauge_reader.clone(),
                    hears_changes: hears_changes.clone(),
                    fleet_size: fleet_size.clone(),
                };
                Lane::start_in_arbiter(&arbiter, move |ctx| Lane::new(setup, ctx.address().downgrade().recipient()))
            })
            .collect();
        let weak = lanes.iter().map(Addr::downgrade).collect();
        let actor = Coordinator::new(store, instance, weak, gates, live, (gauge_reader, hears_changes, fleet_size));
        arbiter.spawn_fn(move || {
            let context = Context::with_receiver(receiver);
            actix::spawn(context.into_future(actor));
        });
        Ok(Self { coordinator, lanes, _thread: thread })
    }

    /// A permit of `upstream` for `request`, waiting at most until `wait_until`.
    pub(crate) async fn acquire(
        &self,
        upstream: usize,
        request: Request,
        kind: AttemptKind,
        wait_until: Instant,
    ) -> Result<Grant, Error> {
        let (reply, granted) = oneshot::channel();
        self.lanes[upstream].do_send(Acquire { request, kind, wait_until, reply });
        let mut grant = granted.await.map_err(|_| Error::stopped())??;
        grant.mark_received();
        Ok(grant)
    }

    /// `upstream`'s status as this process sees it (the shared store's part read in shared
    /// mode).
    pub(crate) async fn status(&self, upstream: usize) -> Result<UpstreamStatus, Error> {
        let (reply, answer) = oneshot::channel();
        self.lanes[upstream].do_send(ReadStatus { reply });
        answer.await.map_err(|_| Error::stopped())
    }

    /// Forgets `upstream`'s provider windows: for the fleet in shared mode, in this process's
    /// gate in local mode (and for its next fallback either way).
    pub(crate) async fn clear_windows(&self, upstream: usize) -> Result<(), Error> {
        let (reply, answer) = oneshot::channel();
        self.lanes[upstream].do_send(ClearWindows { reply });
        answer.await.map_err(|_| Error::stopped())?
    }

    /// Stores a live change of `upstream` (for the fleet in shared mode, for the process in
    /// local mode) and applies it here; answers its version.
    pub(crate) async fn change_live(&self, upstream: usize, change: LiveChange) -> Result<u64, Error> {
        let (reply, answer) = oneshot::channel();
        self.lanes[upstream].do_send(ChangeLive { change, reply });
        answer.await.map_err(|_| Error::stopped())?
    }

    /// Where `upstream`'s permits come from now, or (`None`) the process's least shared mode.
    pub(crate) async fn mode(&self, upstream: Option<usize>) -> Result<Mode, Error> {
        match upstream {
            Some(upstream) => self.lanes[upstream].send(ReadMode).await,
            None => self.coordinator.send(ReadMode).await,
        }
        .map_err(|_| Error::stopped())
    }

    /// How many processes are live, as the last heartbeat counted (no Redis round trip;
    /// `None` in local mode or before the first).
    pub(crate) async fn live_processes(&self) -> Result<Option<u32>, Error> {
        self.coordinator.send(ReadLive).await.map_err(|_| Error::stopped())
    }

    /// What this process sees of each of `upstreams`' room (no Redis round trip).
    pub(crate) async fn headroom(&self, upstreams: &[usize]) -> Result<Vec<Headroom>, Error> {
        let reads = upstreams.iter().map(|&u| self.lanes[u].send(ReadHeadroom));
        let rooms = futures_util::future::join_all(reads).await;
        if rooms.iter().any(Result::is_err) {
            return Err(Error::stopped());
        }
        Ok(rooms.into_iter().flatten().collect())
    }

    /// Waits (at most [`DRAIN_BOUND`] and a little) until no release is on its way to the
    /// shared store.
    pub(crate) async fn drain(&self) {
        let answers = self.lanes.iter().map(|lane| {
            let (reply, drained) = oneshot::channel();
            lane.do_send(Drain { reply: DrainReply::Async(reply) });
            drained
        });
        let all = futures_util::future::join_all(answers);
        let _ = tokio::time::timeout(DRAIN_BOUND + DRAIN_SLACK, all).await;
    }

    /// [`drain`](Self::drain) from a thread that may block (the last handle's drop): only when
    /// the actors run on a thread of their own, and not from it.
    pub(crate) fn drain_blocking(&self) {
        if self._thread.is_none() || std::thread::current().name() == Some(ACTOR_THREAD) {
            return;
        }
        let (reply, drained) = std::sync::mpsc::channel();
        let asked = self
            .lanes
            .iter()
            .filter(|lane| lane.try_send(Drain { reply: DrainReply::Blocking(reply.clone()) }).is_ok());
        let asked = asked.count();
        let until = std::time::Instant::now() + DRAIN_BOUND + DRAIN_SLACK;
        for _ in 0..asked {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if drained.recv_timeout(left).is_err() {
                return;
            }
        }
    }
}

/// How much longer than [`DRAIN_BOUND`] a drain waits for the lanes' answers.
const DRAIN_SLACK: std::time::Duration = std::time::Duration::from_millis(200);
