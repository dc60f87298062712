//! The coordinator actor's state, its start, the heartbeat, and the messages it answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Handler, MessageResult, WeakAddr, WrapFuture};
use wavegate_core::Instance;

use super::domains::{self, Domain};
#[cfg(feature = "redis")]
use super::pubsub;
use crate::engine::clock::Instant;
use crate::engine::lane::{Lane, ReadMode, StoreTrouble};
use crate::engine::store::{self, SharedGate, Store, StoreError};
use crate::metrics;
use crate::status::Mode;

/// How often a process proves it is alive (and learns how many others are).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How long a process counts as live after its last heartbeat: much longer than the beat, so
/// a process cut off from the store for a while (a partial outage, a long pause) is still
/// counted by the others when they compute their fallback shares. A process that is gone for
/// good makes the others' shares smaller (the safe side) for this long.
pub(crate) const HEARTBEAT_TTL: Duration = Duration::from_secs(30);
/// How long a turn as the fleet's gauge reader lasts unless the next heartbeat renews it: a
/// reader that stops (killed, paused, cut off) is replaced within this.
const GAUGE_READER_TURN: Duration = Duration::from_secs(3);
/// How often each upstream's configuration is claimed (the claim stands for a minute).
const CONFIG_CLAIM_EVERY: Duration = Duration::from_secs(10);

/// The coordinator actor.
#[derive(Debug)]
pub(crate) struct Coordinator {
    pub(super) store: Option<Store>,
    pub(super) instance: Instance,
    /// Each upstream's lane (held weakly: the lanes live as long as the handles and permits).
    pub(super) lanes: Vec<WeakAddr<Lane>>,
    /// Each upstream's shared gate (shared mode), for the probe on a Cluster and the claims.
    pub(super) gates: Vec<Option<SharedGate>>,
    /// The failure domains: each has its mode.
    pub(super) domains: Vec<Domain>,
    /// Each upstream's failure domain.
    pub(super) domain_of: Vec<usize>,
    /// Live processes at the last heartbeat; unknown until one succeeds. Never below the
    /// highest count seen within a heartbeat's lifetime (see [`Coordinator::note_live`]).
    pub(super) live_instances: Option<u32>,
    /// The highest live count seen, and when: it stands for [`HEARTBEAT_TTL`].
    pub(super) live_peak: Option<(u32, Instant)>,
    /// When a rejection of the store was last logged.
    pub(super) rejection_logged: Option<Instant>,
    /// When a failed heartbeat that switches no mode (a Cluster's) was last logged.
    pub(super) heartbeat_logged: Option<Instant>,
    /// Whether this process reads the shared gauges for the fleet (told by each heartbeat;
    /// read by the lanes).
    pub(super) gauge_reader: Arc<AtomicBool>,
    /// Whether this process hears the live changes announced (set by the listener; read by
    /// the lanes).
    #[cfg_attr(not(feature = "redis"), expect(dead_code, reason = "only a shared store announces changes"))]
    pub(super) hears_changes: Arc<AtomicBool>,
    /// The live count last noted, for the lanes (0: none yet).
    pub(super) fleet_size: Arc<AtomicU32>,
    /// The mode the last heartbeat told the fleet (`""`: none yet).
    pub(super) mode_told: String,
}

impl Coordinator {
    pub(crate) fn new(
        store: Option<Store>,
        instance: Instance,
        lanes: Vec<WeakAddr<Lane>>,
        gates: Vec<Option<SharedGate>>,
        live: Option<u32>,
        (gauge_reader, hears_changes, fleet_size): (Arc<AtomicBool>, Arc<AtomicBool>, Arc<AtomicU32>),
    ) -> Self {
        let mode = if store.is_some() { Mode::Shared } else { Mode::Local };
        let cluster = store.as_ref().is_some_and(store::is_cluster);
        let (domains, domain_of) = domains::split(lanes.len(), cluster, mode);
        let mut coordinator = Self {
            store,
            instance,
            lanes,
            gates,
            domains,
            domain_of,
            live_instances: None,
            live_peak: None,
            rejection_logged: None,
            heartbeat_logged: None,
            gauge_reader,
            hears_changes,
            fleet_size,
            mode_told: String::new(),
        };
        if let Some(live) = live {
            coordinator.note_live(live);
        }
        coordinator
    }

    /// The domain whose mode the heartbeat's failures switch: the whole store on one server.
    /// On a Cluster none: the instances key lives on one master, whose loss must not put the
    /// upstreams of the others in fallback (see [`Coordinator::heartbeat`]).
    pub(super) fn heartbeat_domain(&self) -> Option<usize> {
        let cluster = self.store.as_ref().is_some_and(store::is_cluster);
        (!cluster).then_some(0)
    }

    /// Counts this process as live and learns how many are. On one server it runs in shared
    /// mode only (in fallback the probe beats) and its failure is an outage of every upstream.
    /// On a Cluster it runs always, and its failure switches nothing: the instances key lives
    /// on one master, and only the upstreams whose slots that master serves are cut off by its
    /// loss (their own calls find out). Meanwhile the live count stays the last one seen.
    pub(super) fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        let Some(store) = self.store.clone() else { return };
        let domain = self.heartbeat_domain();
        if domain.is_some_and(|d| self.domains[d].mode != Mode::Shared) {
            return;
        }
        let epoch = domain.map_or(0, |d| self.domains[d].epoch);
        let instance = self.instance.to_string();
        let told = domains::told(&self.domains, store::rejected(&store));
        let mode = (told.clone(), self.mode_told.clone());
        let call = store::heartbeat(&store, instance, HEARTBEAT_TTL, GAUGE_READER_TURN, Some(mode));
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
            Ok((live, reader)) => {
                act.note_live(live);
                act.gauge_reader.store(reader, Ordering::Relaxed);
                act.mode_told = told;
            }
            Err(error) => {
                act.gauge_reader.store(false, Ordering::Relaxed);
                match domain {
                    Some(domain) => act.on_store_error(domain, epoch, "heartbeat", &error, ctx),
                    None => act.log_lost_heartbeat(&error),
                }
            }
        }));
    }

    /// Logs a heartbeat lost to an outage that switches no mode (a Cluster's instances master
    /// is down), at most once every [`HEARTBEAT_TTL`].
    pub(super) fn log_lost_heartbeat(&mut self, error: &StoreError) {
        metrics::redis_error("heartbeat", error.label());
        let now = Instant::now();
        if self.heartbeat_logged.is_some_and(|at| now.duration_since(at) < HEARTBEAT_TTL) {
            return;
        }
        self.heartbeat_logged = Some(now);
        tracing::warn!(
            %error,
            live_instances = ?self.live_instances,
            "heartbeat failed (the master of the instances key is out of reach): the fallback shares keep the \
             last live count seen"
        );
    }

    /// Takes a heartbeat's count of live processes. A process seen live counts for a
    /// heartbeat's lifetime even when the store forgot it (an empty restart wipes the list,
    /// and the others write theirs again only over the next second): the count used for the
    /// fallback's fair share falls only once the higher one is older than [`HEARTBEAT_TTL`].
    pub(super) fn note_live(&mut self, live: u32) {
        let live = live.max(1);
        let now = Instant::now();
        let counted = match self.live_peak {
            Some((peak, at)) if peak > live && now.duration_since(at) < HEARTBEAT_TTL => peak,
            _ => {
                self.live_peak = Some((live, now));
                live
            }
        };
        self.live_instances = Some(counted);
        self.fleet_size.store(counted, Ordering::Relaxed);
    }

    /// A store command of `domain`, made under `epoch`, failed: an outage switches the domain
    /// to fallback; anything else is the caller's to retry.
    pub(super) fn on_store_error(
        &mut self,
        domain: usize,
        epoch: u64,
        command: &'static str,
        error: &StoreError,
        ctx: &mut Context<Self>,
    ) {
        if epoch != self.domains[domain].epoch {
            return;
        }
        if command == "heartbeat" {
            metrics::redis_error(command, error.label());
        }
        if error.is_outage() {
            self.enter_fallback(domain, command, error, ctx);
        } else {
            tracing::error!(command, %error, "shared store error");
        }
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        metrics::mode(domains::least_shared(&self.domains));
        let Some(store) = self.store.clone() else { return };
        #[cfg(feature = "redis")]
        {
            // Every gate of this process has the same wake-up channel (its instance's) and
            // the same channel of live changes (its namespace's).
            let channel =
                self.gates.iter().flatten().next().map(|g| (store::wake_channel(g), store::changes_channel(g)));
            let lanes = self
                .gates
                .iter()
                .zip(&self.lanes)
                .filter_map(|(gate, lane)| gate.as_ref().map(|gate| (gate.name().to_owned(), lane.clone())));
            if let Some(channel) = channel {
                pubsub::spawn_listener(store.clone(), channel, lanes.collect(), self.hears_changes.clone());
            }
        }
        ctx.spawn(store::preload(&store).into_actor(self).map(|result, _, _| {
            if let Err(error) = result {
                tracing::warn!(%error, "could not preload the scripts; they will load on first use");
            }
        }));
        self.heartbeat(ctx);
        ctx.run_interval(HEARTBEAT_EVERY, |act, ctx| act.heartbeat(ctx));
        ctx.run_interval(CONFIG_CLAIM_EVERY, |act, ctx| act.claim_configs(ctx));
    }
}

impl Handler<StoreTrouble> for Coordinator {
    type Result = ();

    fn handle(&mut self, trouble: StoreTrouble, ctx: &mut Context<Self>) {
        let Some(&domain) = self.domain_of.get(trouble.upstream) else { return };
        self.on_store_error(domain, trouble.epoch, trouble.command, &trouble.error, ctx);
    }
}

impl Handler<ReadMode> for Coordinator {
    type Result = MessageResult<ReadMode>;

    /// The process's mode: the least shared of its upstreams' (see `domains::least_shared`);
    /// a fallback caused by a rejection is [`Mode::Rejected`].
    fn handle(&mut self, _: ReadMode, _: &mut Context<Self>) -> Self::Result {
        let mode = domains::least_shared(&self.domains);
        let rejected = self.store.as_ref().is_some_and(store::rejected);
        MessageResult(if mode == Mode::Fallback && rejected { Mode::Rejected } else { mode })
    }
}

/// How many processes are live, as the last heartbeat counted (`None`: none counted yet).
#[derive(Debug, actix::Message)]
#[rtype(result = "Option<u32>")]
pub(crate) struct ReadLive;

impl Handler<ReadLive> for Coordinator {
    type Result = MessageResult<ReadLive>;

    fn handle(&mut self, _: ReadLive, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.live_instances)
    }
}
