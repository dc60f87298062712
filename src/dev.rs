//! Lower-level types: the parts of the values the rest of the API hands out, and what the
//! engine's own methods on them answer. Most users never name these; a library built on
//! wavegate (a status page, a custom classifier, a test of its own) may.
//!
//! * an [`Outcome`](crate::Outcome)'s parts: [`Transient`] (the kind of a transient failure),
//!   [`ProviderSignals`](crate::ProviderSignals)' [`Window`]s and what could not be read in
//!   them ([`Unreadable`], [`SignalKind`]);
//! * a status's parts: the learned limits ([`LearnedLimitStatus`], [`LearnedLimit`]);
//! * what the scheduler derives from an outcome for its state machines
//!   ([`Outcome::wave_signal`](crate::Outcome::wave_signal) → [`WaveSignal`],
//!   [`Outcome::breaker_result`](crate::Outcome::breaker_result) → [`CallResult`],
//!   [`Outcome::window_report`](crate::Outcome::window_report) → [`WindowReport`],
//!   [`WindowLeft`], [`LearnedLimits`]);
//! * what a pool's policy looks at ([`MemberView`]) and checks a pool against
//!   ([`UpstreamSet`]);
//! * the Redis keys of one upstream (feature `redis`: `UpstreamKeys`, from
//!   `Keyspace::upstream`);
//! * a request builder's target ([`ToUpstream`], [`ToPool`]), for code that names the
//!   builder's type.

pub use wavegate_core::{
    CallResult, LearnedLimit, LearnedLimitStatus, LearnedLimits, MemberView, SignalKind, Transient, Unreadable,
    UpstreamSet, WaveSignal, Window, WindowLeft, WindowReport,
};
#[cfg(feature = "redis")]
pub use wavegate_redis::UpstreamKeys;

pub use crate::request_builder::{ToPool, ToUpstream};
