//! Redis down: fail open to a fair local share, then reconcile before going back — per failure
//! domain.
//!
//! On an outage the domain switches to **fallback**: each of its lanes gets this process's fair
//! share of its limit, `max(1, limit ÷ live processes last seen)` (or the configured
//! `fallback_limit`). A probe with backoff (never the request path) asks the store: on one
//! server a `PING` and a heartbeat for every upstream at once; on a Cluster, per upstream, a
//! `ZCARD` routed by its key to the master of its slot. Once it answers, each lane of the
//! domain **reconciles** its permits in the store; then the domain is shared again (a lane the
//! store refused to reconcile goes back anyway: its lease watchdog registers its permits
//! again). An outage during the reconciliation keeps the domain in fallback.

use std::time::Duration;

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};
use futures_util::FutureExt;
use futures_util::future::join_all;

use super::actor::{Coordinator, HEARTBEAT_TTL};
use super::domains::{self, PROBE_MIN};
use crate::engine::lane::{Reconcile, Switch};
use crate::engine::store::{self, StoreError};
use crate::metrics;
use crate::status::Mode;

/// The longest wait between probes.
const PROBE_MAX: Duration = Duration::from_secs(1);

impl Coordinator {
    /// Records a change of `domain`'s mode and tells its lanes.
    fn switch(&mut self, domain: usize, to: Mode) -> u64 {
        let d = &mut self.domains[domain];
        d.mode = to;
        d.epoch += 1;
        d.probe_backoff = PROBE_MIN;
        metrics::mode(domains::least_shared(&self.domains));
        self.domains[domain].epoch
    }

    /// Sends `switch` to each lane of `domain`.
    fn tell_lanes(&self, domain: usize, switch: impl Fn() -> Switch) {
        for &upstream in &self.domains[domain].upstreams {
            if let Some(lane) = self.lanes[upstream].upgrade() {
                lane.do_send(switch());
            }
        }
    }

    /// Switches `domain` from shared mode to local fallback (does nothing in any other mode).
    pub(super) fn enter_fallback(
        &mut self,
        domain: usize,
        command: &'static str,
        error: &StoreError,
        ctx: &mut Context<Self>,
    ) {
        if self.domains[domain].mode != Mode::Shared {
            return;
        }
        let epoch = self.switch(domain, Mode::Fallback);
        // Throttled across switches too: a right missing from one script only (shared, then
        // rejected, then shared again at each probe) must not log at every switch.
        self.log_rejection(command, error);
        let upstreams = self.domains[domain].upstreams.len();
        if error.is_state_lost() {
            // FLUSHALL, an eviction, an empty restart that dropped no connection: handled as an
            // empty restart, through the fallback to a reconciliation at the next probe.
            tracing::warn!(
                command,
                %error,
                upstreams,
                "the shared store lost its state: fallback share, then reconciling (as after an empty restart)"
            );
        } else {
            tracing::warn!(
                command,
                %error,
                live_instances = ?self.live_instances,
                upstreams,
                "shared store unreachable: switching to local fallback"
            );
        }
        let live = self.live_instances;
        self.tell_lanes(domain, || Switch::Fallback { epoch, live });
        self.schedule_probe(domain, ctx);
    }

    fn schedule_probe(&mut self, domain: usize, ctx: &mut Context<Self>) {
        let after = self.domains[domain].probe_backoff;
        self.domains[domain].probe_backoff = (after * 2).min(PROBE_MAX);
        ctx.run_later(after, move |act, ctx| act.probe(domain, ctx));
    }

    /// Asks the store whether `domain` is back; reconciles it if it is. The whole store (one
    /// server): `PING` and a heartbeat. One upstream of a Cluster: a command routed by its key
    /// to the master of its slot (the heartbeat beats on its own there).
    fn probe(&mut self, domain: usize, ctx: &mut Context<Self>) {
        if self.domains[domain].mode != Mode::Fallback || self.domains[domain].reconciling {
            return;
        }
        let Some(store) = self.store.clone() else { return };
        // The probe's heartbeat tells the mode too: a process the store answers but rejects
        // (a right taken) is counted live, and must not go on telling the `shared` of its last
        // heartbeat in shared mode.
        let told = domains::told(&self.domains, store::rejected(&store));
        let call = if self.heartbeat_domain() == Some(domain) {
            let instance = self.instance.to_string();
            let mode = Some((told.clone(), self.mode_told.clone()));
            async move {
                store::ping(&store).await?;
                store::heartbeat(&store, instance, HEARTBEAT_TTL, Duration::ZERO, mode)
                    .await
                    .map(|(live, _)| Some((live, told)))
            }
            .boxed_local()
        } else {
            let gates: Vec<_> = self.domains[domain].upstreams.iter().filter_map(|&u| self.gates[u].clone()).collect();
            async move {
                for gate in gates {
                    store::probe(&gate).await?;
                }
                Ok(None)
            }
            .boxed_local()
        };
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
            Ok(live) => {
                if let Some((live, told)) = live {
                    act.note_live(live);
                    act.mode_told = told;
                }
                act.reconcile(domain, ctx);
            }
            Err(error) => {
                act.log_rejection("probe", &error);
                act.schedule_probe(domain, ctx);
            }
        }));
    }

    /// Asks each lane of `domain` to reconcile; then shared again, unless the store went away.
    fn reconcile(&mut self, domain: usize, ctx: &mut Context<Self>) {
        self.domains[domain].reconciling = true;
        let epoch = self.domains[domain].epoch;
        let lanes: Vec<(usize, _)> = self.domains[domain]
            .upstreams
            .iter()
            .filter_map(|&u| self.lanes[u].upgrade().map(|lane| (u, lane)))
            .collect();
        let names: Vec<usize> = lanes.iter().map(|(u, _)| *u).collect();
        let call = join_all(lanes.into_iter().map(|(_, lane)| lane.send(Reconcile)));
        ctx.spawn(call.into_actor(self).map(move |answers, act, ctx| {
            act.domains[domain].reconciling = false;
            let mut outage = None;
            for (upstream, answer) in names.into_iter().zip(answers) {
                match answer {
                    Ok(Ok(report)) => tracing::info!(
                        upstream,
                        adopted = report.adopted,
                        dropped = report.dropped,
                        carried_429 = report.carried_429,
                        granted_during_outage = report.granted,
                        shared_in_flight = report.shared_in_flight,
                        "reconciled with the shared store"
                    ),
                    Ok(Err(error)) if error.is_outage() => outage = Some(error),
                    Ok(Err(error)) => {
                        // This one goes back without a reconciliation; the others go on.
                        tracing::error!(upstream, %error, "the store refused the reconciliation of this upstream");
                        metrics::redis_error("reconcile", error.label());
                    }
                    Err(_) => {} // the lane stopped
                }
            }
            match outage {
                None if act.domains[domain].epoch == epoch => {
                    let epoch = act.switch(domain, Mode::Shared);
                    tracing::info!(upstreams = act.domains[domain].upstreams.len(), "shared store back: shared mode");
                    act.tell_lanes(domain, || Switch::Shared { epoch });
                }
                None => act.tell_lanes(domain, || Switch::Abort),
                Some(error) => {
                    tracing::warn!(%error, "reconciliation failed; staying in fallback");
                    metrics::redis_error("reconcile", error.label());
                    act.tell_lanes(domain, || Switch::Abort);
                    act.schedule_probe(domain, ctx);
                }
            }
        }));
    }
}
