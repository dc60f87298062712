//! The local-mode schedulers alive in this process, by upstream name.
//!
//! Local schedulers of one process that name an upstream in one namespace share its
//! in-process gate (`engine/process_gate.rs`), so they share one limit, as processes do
//! through Redis: building the scheduler inside actix-web's `HttpServer::new` factory (once per
//! worker) no longer sends the provider the limit times the workers. Each local scheduler
//! registers its upstreams here; the second one for a name says so in the log (once per name)
//! and [`UpstreamStatus::schedulers_in_process`](crate::UpstreamStatus) shows the count.
//! (Schedulers in shared mode share one limit through Redis and are not counted.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

static LIVE: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// One local scheduler's upstreams, counted while it lives.
#[derive(Debug)]
pub(crate) struct Registration {
    names: Vec<String>,
}

impl Registration {
    /// Counts a new local scheduler with these upstreams; warns for each name that another
    /// live local scheduler of this process already has.
    pub(crate) fn new(names: impl IntoIterator<Item = String>) -> Self {
        let names: Vec<String> = names.into_iter().collect();
        let mut live = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for name in &names {
            let count = live.entry(name.clone()).or_default();
            *count += 1;
            if *count > 1 && WARNED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(name.clone()) {
                tracing::info!(
                    upstream = %name,
                    schedulers = *count,
                    "{count} local-mode wavegate schedulers in this process name upstream `{name}`: they share one \
                     limit (one in-process gate per upstream and key prefix). Building the scheduler once and \
                     cloning it costs less",
                    count = *count,
                );
            }
        }
        Self { names }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for name in &self.names {
            if let Some(count) = live.get_mut(name) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    live.remove(name);
                }
            }
        }
    }
}

/// How many live local schedulers of this process name `upstream`.
pub(crate) fn live(upstream: &str) -> usize {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(upstream).copied().unwrap_or(0)
}
