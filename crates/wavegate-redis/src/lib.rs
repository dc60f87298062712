//! wavegate's shared store: one upstream's permits and 429 wave state in Redis.
//!
//! * [`Keyspace`] / [`UpstreamKeys`]: where things live; every key of an upstream shares the
//!   hash tag `{upstream}`, so the scripts run on Redis Cluster.
//! * The Lua scripts in `lua/` (the wave machine written once, plus acquire, finish, renew and
//!   status), compiled in, preloaded, reloaded on `NOSCRIPT`.
//! * [`Store`]: the connection, with a connect timeout, a command timeout and no slow
//!   reconnect loop, so a dead or hung server costs one bounded command.
//! * [`SharedGate`]: the script calls for one upstream, taking and answering in
//!   wavegate-core's types ([`Ask`](wavegate_core::Ask) → [`Decision`](wavegate_core::Decision));
//!   [`StoreError::is_outage`] tells the caller when to fail open, and
//!   [`StoreError::rejection`] when the server rejects wavegate (credentials, ACL rights,
//!   version) rather than being out of reach.
//! * [`Store::check`]: the startup check (version ≥ 6.2, scripts, rights, configuration
//!   claims); [`Store::health`]: what the store knows about its server.
//! * Deployments: one server (`redis://`, `rediss://` with the `tls` feature) or a primary
//!   found through Sentinel ([`StoreConfig::sentinel`]).
//!
//! The scripts are the shared twin of [`wavegate_core::LocalGate`] and pass the same tables
//! (`wavegate_core::spec`, the `spec` feature); this crate's tests run them against a real
//! server, check that the twins agree on random scenarios of several processes, and tie the
//! argument counts and constants the two sides share.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use wavegate_core::{Ask, Decision, Instance, PermitId, UpstreamConfig, WaveSignal};
//! use wavegate_redis::{SharedGate, Store, StoreConfig};
//!
//! let upstream = UpstreamConfig::builder("openai").build()?;
//! let store = Store::connect(StoreConfig::new("redis://127.0.0.1:6379/")).await?;
//! let instance = Instance::random();
//! let gate = SharedGate::new(store, upstream.name(), upstream.wave()).for_instance(instance.as_str());
//! let id = PermitId::new(None, &instance, 42, None);
//! let asked = [Ask { id: id.clone(), tokens: 0, output: 0, waiting: 1 }];
//! if let Decision::Granted { wave, .. } = gate.acquire(&asked, Duration::from_secs(30)).await? {
//!     // ... call the provider ...
//!     gate.finish(&id, wave, WaveSignal::Success, 0).await?;
//! }
//! # Ok(()) }
//! ```

#[cfg(test)]
mod agreement;
mod calls;
mod check_paths;
mod cluster;
mod config_claim;
mod connection;
mod day_word;
mod error;
mod health;
mod keys;
mod live;
mod processes;
mod releases;
mod scripts;
mod sentinel;
mod shared_gate;
mod startup;
mod store_clock;

pub use config_claim::{CLAIM_SETTINGS, CONFIG_CLAIM_TTL};
pub use connection::{Heartbeat, Store, StoreConfig};
pub use error::{Rejection, StoreError};
pub use health::StoreHealth;
pub use keys::{Keyspace, UpstreamKeys};
pub use processes::{LiveProcess, live_processes};
pub use releases::{HandedPermit, ReleaseSubscription, WakeMessage};
pub use scripts::preload;
pub use sentinel::SentinelConfig;
pub use shared_gate::{Acquired, ClassAsk, Finished, HandOff, Reconciled, SharedGate, SharedStatus};
pub use startup::{MIN_REDIS_VERSION, ServerInfo};
pub use store_clock::store_now_ms;
