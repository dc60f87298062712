//! wavegate's shared store: one upstream's permits and 429 wave state in Redis.
//!
//! * [`Keyspace`] / [`UpstreamKeys`]: where things live; every key of an upstream shares the
//!   hash tag `{upstream}`, so the scripts run on Redis Cluster.
//! * The Lua scripts in `lua/` (the wave machine written once, plus acquire, finish, renew and
//!   status), compiled in, preloaded, reloaded on `NOSCRIPT`.
//! * [`Store`]: the connection, with a connect timeout, a command timeout and no slow
//!   reconnect loop, so a dead or hung server costs one bounded command.
//! * [`SharedGate`]: the four script calls for one upstream, answering in wavegate-core's
//!   types; [`StoreError::is_outage`] tells the caller when to fail open.
//!
//! The scripts implement the same wave machine as [`wavegate_core::LocalGate`] and pass the
//! same tables ([`wavegate_core::spec`]); this crate's tests run them against a real server.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use wavegate_core::{Admission, UpstreamConfig, WaveSignal};
//! use wavegate_redis::{SharedGate, Store, StoreConfig};
//!
//! let upstream = UpstreamConfig::builder("openai").build()?;
//! let store = Store::connect(StoreConfig::new("redis://127.0.0.1:6379/")).await?;
//! let gate = SharedGate::new(store, upstream.name(), upstream.wave());
//! let acquired = gate.acquire("worker-1:req-42", Duration::from_secs(30), 0).await?;
//! if let Admission::Granted { wave, .. } = acquired.admission {
//!     // ... call the provider ...
//!     gate.finish("worker-1:req-42", wave, WaveSignal::Success, 0).await?;
//! }
//! # Ok(()) }
//! ```

mod connection;
mod error;
mod keys;
mod releases;
mod scripts;
mod shared_gate;

pub use connection::{Store, StoreConfig};
pub use error::StoreError;
pub use keys::{Keyspace, UpstreamKeys};
pub use releases::ReleaseSubscription;
pub use scripts::preload;
pub use shared_gate::{Acquired, ClassAsk, Finished, Reconciled, SharedGate, SharedStatus};
