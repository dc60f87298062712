//! The scheduler on any tokio runtime, without an actix system: `#[tokio::test]` (both
//! flavours) and a runtime built by hand, in local and shared mode (a real redis-server),
//! calls through the mock provider, which counts what really runs at once; the actors' own
//! thread ends with the last handle.
//!
//! Every test takes `SERIAL`: one of them counts the process's `wavegate-actors` threads.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::join_all;
use tokio::sync::Mutex;
use wavegate::{Mode, Outcome, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{HttpReply, MockUpstream, MockUpstreamConfig, http_get};

mod common;

static SERIAL: Mutex<()> = Mutex::const_new(());

const LIMIT: u32 = 3;
const CALLS: usize = 30;

fn mock() -> MockUpstream {
    MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(20), ..Default::default() })
        .expect("mock provider")
}

fn config() -> UpstreamConfig {
    UpstreamConfig::builder("llm").limit(LIMIT).max_wait(Duration::from_secs(10)).build().expect("valid config")
}

fn local() -> Scheduler {
    common::isolated().upstream(config()).build().expect("scheduler")
}

/// What an HTTP reply means: its status and `Retry-After`; an I/O error is a transport failure.
fn by_reply(result: &Result<HttpReply, io::Error>) -> Outcome {
    match result {
        Ok(reply) => Outcome::from_status(reply.status, reply.retry_after.as_deref(), SystemTime::now()),
        Err(error) => wavegate::UpstreamError::outcome(error),
    }
}

/// One call through `llm` to the mock.
async fn one_call(llm: &Upstream, addr: SocketAddr) -> Result<HttpReply, wavegate::Error<io::Error>> {
    llm.request().classify(by_reply).call(|_| http_get(addr, "/", Duration::from_secs(5))).await
}

/// `CALLS` calls at once from the current task; every one answered 200.
async fn calls_at_once(llm: &Upstream, addr: SocketAddr) {
    let replies = join_all((0..CALLS).map(|_| one_call(llm, addr))).await;
    for reply in replies {
        assert_eq!(reply.expect("a call").status, 200);
    }
}

fn assert_limit_held_and_used(mock: &MockUpstream, limit: u32) {
    assert_eq!(mock.served(), CALLS as u64);
    let max = mock.max_in_flight();
    assert!(max <= limit as usize, "the provider saw {max} calls at once with a limit of {limit}");
    assert_eq!(max, limit as usize, "the limit was never used in full");
}

#[tokio::test]
async fn a_current_thread_tokio_test_calls_through_the_scheduler() {
    let _serial = SERIAL.lock().await;
    let mock = mock();
    let scheduler = local();
    let llm = scheduler.upstream("llm").expect("configured");
    calls_at_once(&llm, mock.addr()).await;
    assert_limit_held_and_used(&mock, LIMIT);
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Local);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_thread_tokio_test_calls_from_spawned_tasks() {
    let _serial = SERIAL.lock().await;
    let mock = mock();
    let scheduler = local();
    let addr = mock.addr();
    // Each call on a task of its own: the call future is `Send`.
    let tasks: Vec<_> = (0..CALLS)
        .map(|_| {
            let llm = scheduler.upstream("llm").expect("configured");
            tokio::spawn(async move { one_call(&llm, addr).await })
        })
        .collect();
    for task in join_all(tasks).await {
        assert_eq!(task.expect("task").expect("a call").status, 200);
    }
    assert_limit_held_and_used(&mock, LIMIT);
}

#[test]
fn a_runtime_built_by_hand_calls_through_the_scheduler() {
    let _serial = SERIAL.blocking_lock();
    let mock = mock();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    // Built outside any runtime, used inside one.
    let scheduler = local();
    runtime.block_on(async {
        let llm = scheduler.upstream("llm").expect("configured");
        calls_at_once(&llm, mock.addr()).await;
    });
    assert_limit_held_and_used(&mock, LIMIT);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_mode_from_tokio_two_schedulers_hold_one_limit() {
    use wavegate_testkit::RedisServer;
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start().expect("redis-server");
    let mock = mock();
    let build = || Scheduler::builder().upstream(config()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let llm_b = b.upstream("llm").expect("configured");
    let llm_a = a.upstream("llm").expect("configured");
    let (llm_a, llm_b) = (llm_a, llm_b);
    let addr = mock.addr();
    let calls = (0..CALLS).map(|i| {
        let llm = if i % 2 == 0 { llm_a.clone() } else { llm_b.clone() };
        tokio::spawn(async move { one_call(&llm, addr).await })
    });
    for task in join_all(calls).await {
        assert_eq!(task.expect("task").expect("a call").status, 200);
    }
    assert_eq!(a.mode().await.expect("mode"), Mode::Shared);
    assert_eq!(b.mode().await.expect("mode"), Mode::Shared);
    // Two coordinators, one limit: the provider never saw more than LIMIT at once.
    assert_limit_held_and_used(&mock, LIMIT);
}

/// The ids of this process's threads named `wavegate-actors`.
fn actor_threads() -> Vec<String> {
    let mut ids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == "wavegate-actors" {
            ids.push(task.file_name().to_string_lossy().into_owned());
        }
    }
    ids
}

async fn until_actor_threads(count: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let threads = actor_threads();
        if threads.len() == count {
            return threads;
        }
        assert!(start.elapsed() < Duration::from_secs(2), "{} actor threads, expected {count}", threads.len());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_actor_thread_ends_with_the_last_handle() {
    let _serial = SERIAL.lock().await;
    until_actor_threads(0).await; // those of the tests before have ended
    let scheduler = local();
    let threads = until_actor_threads(1).await;
    let llm = scheduler.upstream("llm").expect("configured");
    let copy = scheduler.clone();
    drop(scheduler);
    let permit = llm.request().acquire().await.expect("a permit");
    permit.succeeded();
    drop(copy);
    // The upstream handle still holds the scheduler: its thread runs and answers.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(actor_threads(), threads);
    assert_eq!(llm.status().await.expect("status").in_flight_local, 0);
    // A permit that outlives every handle does not keep the thread alive.
    let late = llm.request().acquire().await.expect("a permit");
    drop(llm);
    until_actor_threads(0).await;
    drop(late); // released to actors that are gone: nothing happens, nothing panics
}

#[actix::test]
async fn inside_an_actix_system_the_actors_run_on_its_arbiter() {
    let _serial = SERIAL.lock().await;
    // The threads of earlier tests' schedulers end shortly after their last handle: let them.
    let before = until_actor_threads(0).await.len();
    let scheduler = local();
    let llm = scheduler.upstream("llm").expect("configured");
    let permit = llm.request().acquire().await.expect("a permit");
    permit.succeeded();
    assert_eq!(actor_threads().len(), before, "a thread was started inside an actix system");
}

/// On an actix system of the app's own (`#[actix::main]`, actix-web), the last handle's drop
/// cannot block the arbiter to wait for the releases on their way: a release sent just before
/// the system stops is lost, and its permit holds a slot of the fleet's limit until its lease
/// ends, unless the app awaits `Scheduler::shutdown()` first.
#[cfg(feature = "redis")]
#[test]
fn on_the_apps_actix_system_shutdown_lands_the_last_release_before_it_stops() {
    use wavegate_testkit::RedisServer;
    let redis = RedisServer::start().expect("redis-server");
    let mut con = redis.connection().expect("direct connection");
    let mut held_after = |shutdown: bool| -> (usize, Duration) {
        let _: () = redis::cmd("DEL").arg("wavegate:{llm}:permits").query(&mut con).expect("DEL");
        let url = redis.url();
        let took = std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let scheduler = Scheduler::builder().upstream(config()).redis(url).build().expect("scheduler");
                scheduler.upstream("llm").expect("configured").request().acquire().await.expect("a permit").succeeded();
                let started = Instant::now();
                if shutdown {
                    scheduler.shutdown().await;
                }
                started.elapsed()
            }) // the app's system stops here, its actors with it
        })
        .join()
        .expect("the app's thread");
        let held: usize = redis::cmd("ZCARD").arg("wavegate:{llm}:permits").query(&mut con).expect("ZCARD");
        (held, took)
    };
    let (held, _) = held_after(false);
    assert_eq!(held, 1, "without shutdown the release never left: the permit waits for its lease");
    let (held, took) = held_after(true);
    assert_eq!(held, 0, "shutdown waited for the release's reply");
    assert!(took < Duration::from_millis(1_200), "bounded: {took:?}");
}
