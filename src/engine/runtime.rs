//! Where the actors run: on the caller's actix system when there is one, on a thread of their
//! own otherwise.
//!
//! actix starts an actor with `spawn_local`, which panics outside a tokio `LocalSet`: a plain
//! `#[tokio::main]` service, an axum app or a `#[tokio::test]` has none. So
//! [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) looks for an actix arbiter on
//! the current thread (`Arbiter::try_current`, set on actix-web's workers, under
//! `#[actix::main]` and `#[actix::test]`); if there is one, the actors start on it, as they
//! always did. If there is none, it starts a small actix `System` on a dedicated thread
//! (`wavegate-actors`) and the actors run there. Either way callers reach the actors only by
//! messages (`Addr` is `Send`) and poll their own futures in their own task, so the caller's
//! runtime may be anything tokio: current-thread or multi-thread.
//!
//! The dedicated thread belongs to the scheduler: when the last handle on it goes away
//! ([`Scheduler`](crate::Scheduler) clones, [`Upstream`](crate::Upstream) handles, calls in
//! progress), its system is told to stop and the thread ends, dropping the actors and their
//! Redis connections. Before that, the drop waits (at most `DRAIN_BOUND`, 1 s) until the
//! releases already sent to Redis have their replies, so a process that exits right after
//! its last call does not leave that permit to its lease.

use std::sync::mpsc;
use std::time::Duration;

use actix::{Arbiter, ArbiterHandle, System};

/// The name of the thread that runs the actors when there is no actix system around.
pub(crate) const ACTOR_THREAD: &str = "wavegate-actors";

/// How long `build()` waits for its actor thread to come up.
const THREAD_START: Duration = Duration::from_secs(5);

/// The actors' own thread and its actix system; stopping the system ends the thread.
#[derive(Debug)]
pub(crate) struct ActorThread {
    system: System,
}

impl ActorThread {
    /// Starts an actix system on a new thread and returns once it runs.
    fn spawn() -> std::io::Result<Self> {
        let (started, running) = mpsc::channel();
        std::thread::Builder::new().name(ACTOR_THREAD.to_string()).spawn(move || {
            let runner = System::new();
            if started.send(System::current()).is_ok()
                && let Err(error) = runner.run()
            {
                tracing::error!(%error, "wavegate's actor thread stopped with an error");
            }
        })?;
        let system = running.recv_timeout(THREAD_START).map_err(|error| {
            std::io::Error::other(format!("the actor thread did not start within {THREAD_START:?}: {error}"))
        })?;
        Ok(Self { system })
    }
}

impl Drop for ActorThread {
    fn drop(&mut self) {
        // The thread ends once its system has stopped; nothing here blocks.
        self.system.stop();
    }
}

/// The arbiter the actors start on: the current thread's, if it has one, else a new actor
/// thread's (returned too: it stops when dropped).
pub(crate) fn arbiter() -> std::io::Result<(ArbiterHandle, Option<ActorThread>)> {
    Ok(match Arbiter::try_current() {
        Some(arbiter) => (arbiter, None),
        None => {
            let thread = ActorThread::spawn()?;
            (thread.system.arbiter().clone(), Some(thread))
        }
    })
}
