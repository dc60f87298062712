//! Deadlines that refuse early, earliest deadline first, and the expected wait (issue 23, item
//! 7), through the public API: local mode, and shared mode on a real redis-server.
//!
//! A refusal "at once" is checked against a bound far below the caller's own wait (under
//! 100 ms against 300–500 ms): a refusal that only came at the deadline fails it. Each proof
//! has its counterpart where the proof does not hold and the caller waits and is served (a
//! budget with room just before the deadline, tokens a running call may give back, a window a
//! running call may end). The figure itself (how soon) is measured in release by
//! `examples/deadline_refusals.rs` (docs/guarantees.md, "Deadlines").

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use wavegate::config::UpstreamConfigBuilder;
use wavegate::{Error, ErrorKind, Outcome, ProviderSignals, Scheduler, UpstreamConfig};
use wavegate_testkit::RedisServer;

mod common;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn x() -> UpstreamConfigBuilder {
    UpstreamConfig::builder("x").limit(10).max_wait(Duration::from_secs(10))
}

fn local(config: UpstreamConfigBuilder) -> Scheduler {
    common::isolated().upstream(config.build().expect("valid")).build().expect("scheduler")
}

async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let value = future.await;
    (value, started.elapsed())
}

fn ok() -> Outcome {
    Outcome::success(200)
}

/// A refusal told at once: `DeadlinePassed` (the bound was the request's deadline), with the
/// time it would have needed, in `(low, high]`.
fn assert_refused_early(error: &Error, elapsed: Duration, low: Duration, high: Duration) {
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error:?}");
    let needed = error.needed().unwrap_or_else(|| panic!("refused early, with the time needed: {error:?}"));
    assert!(needed > low && needed <= high, "needed {needed:?}, not in ({low:?}, {high:?}]: {error:?}");
    assert_eq!(error.retry_after(), Some(needed), "{error:?}");
    assert!(elapsed < ms(100), "refused after {elapsed:?}, not at once");
}

// A request is never given back: a requests budget without room before the deadline is a
// proof. One a second, burst 1.
#[actix::test]
async fn a_requests_budget_without_room_before_the_deadline_refuses_at_once() {
    let s = local(x().requests_per_minute(60, 1));
    let llm = s.upstream("x").expect("configured");
    llm.request().acquire().await.expect("the burst").succeeded();
    let (result, elapsed) = timed(llm.request().timeout(ms(300)).acquire()).await;
    assert_refused_early(&result.expect_err("no room for 1 s"), elapsed, ms(600), ms(1_000));
    // No deadline of its own: the upstream's max_wait is the bound, the error an overload.
    let s2 = local(x().requests_per_minute(60, 1).max_wait(ms(300)));
    let short = s2.upstream("x").expect("configured");
    short.request().acquire().await.expect("the burst").succeeded();
    let (result, elapsed) = timed(short.request().acquire()).await;
    let error = result.expect_err("no room within max_wait");
    assert_eq!((error.kind(), error.waited()), (ErrorKind::WaitedTooLong, Some(Duration::ZERO)), "{error:?}");
    assert!(error.needed().is_some_and(|n| n > ms(600)) && elapsed < ms(100), "{error:?} after {elapsed:?}");
    // Room comes just before the deadline: the caller waits for it and is served.
    let (result, elapsed) = timed(llm.request().timeout(ms(1_200)).acquire()).await;
    result.expect("room comes before the deadline").succeeded();
    assert!(elapsed > ms(400) && elapsed < ms(1_150), "served after {elapsed:?}");
}

// A settlement may give back what running calls reserved: tokens held by a call in flight
// prove nothing; once nothing runs, the bucket's next room is a proof. 10 tokens a second,
// burst 100.
#[actix::test]
async fn tokens_a_running_call_may_give_back_prove_nothing_until_it_ends() {
    let s = local(x().tokens_per_minute(600, 100));
    let llm = s.upstream("x").expect("configured");
    let running = llm.request().tokens(100).acquire().await.expect("the whole bucket");
    // The bucket is empty, but the running call may use fewer tokens than it reserved.
    let waiter = {
        let llm = llm.clone();
        tokio::spawn(async move { timed(llm.request().tokens(100).timeout(ms(3_000)).acquire()).await })
    };
    tokio::time::sleep(ms(300)).await;
    assert!(!waiter.is_finished(), "refused although the running call may give its tokens back");
    // It used none: all 100 come back, and the waiter is served at once.
    running.report_usage(ok(), 0);
    let (result, elapsed) = tokio::time::timeout(ms(1_000), waiter).await.expect("served").expect("task");
    let permit = result.expect("the refund made room");
    assert!(elapsed < ms(800), "served after {elapsed:?}");
    // It uses all it reserved: nothing runs, nothing can come back; 10 s until 100 tokens.
    permit.report_usage(ok(), 100);
    let (result, elapsed) = timed(llm.request().tokens(100).timeout(ms(500)).acquire()).await;
    assert_refused_early(&result.expect_err("no room for 10 s"), elapsed, ms(9_000), ms(10_000));
    // A small estimate fits sooner: 10 tokens in 1 s, within a deadline of 2 s.
    let (result, elapsed) = timed(llm.request().tokens(10).timeout(ms(2_000)).acquire()).await;
    result.expect("10 tokens come back within a second").report_usage(ok(), 10);
    assert!(elapsed > ms(500) && elapsed < ms(1_500), "served after {elapsed:?}");
}

/// A 200 whose IETF `RateLimit` header says the provider's window has 0 requests left for
/// `reset_s` seconds.
fn window_spent_for(reset_s: u64) -> Outcome {
    let value = format!("limit=10, remaining=0, reset={reset_s}");
    let signals = ProviderSignals::from_headers([("ratelimit", value.as_bytes())], SystemTime::now());
    Outcome::from_signals(200, None, signals)
}

// The provider's window: an answer of a call still running may end it sooner (a newer word),
// so it is a proof only once no call runs.
#[actix::test]
async fn a_spent_window_refuses_at_once_only_when_no_running_call_can_end_it() {
    let s = local(x());
    let llm = s.upstream("x").expect("configured");
    let running = llm.request().acquire().await.expect("a call that runs on");
    llm.request().acquire().await.expect("a permit").report(window_spent_for(20));
    let (result, elapsed) = timed(llm.request().timeout(ms(400)).acquire()).await;
    let error = result.expect_err("the window runs");
    assert_eq!((error.kind(), error.needed()), (ErrorKind::DeadlinePassed, None), "{error:?}");
    assert!(elapsed >= ms(380), "refused after {elapsed:?}, while a running call could end the window");
    running.report(ok());
    let (result, elapsed) = timed(llm.request().timeout(ms(400)).acquire()).await;
    assert_refused_early(&result.expect_err("nothing can end the window"), elapsed, ms(15_000), ms(20_000));
}

// The fleet's budget as last read (shared mode, two processes on one Redis): B's first ask is
// refused by the store and B is told at once; its next ask at admission; one after the denial
// is 100 ms old after asking the store again; a caller who can wait past the room is served.
#[actix::test]
async fn the_fleet_s_budgets_as_last_read_refuse_at_once() {
    let redis = RedisServer::start().expect("redis-server");
    let config = || x().requests_per_minute(60, 1).tokens_per_minute(600, 100).build().expect("valid");
    let build = || Scheduler::builder().upstream(config()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let (llm_a, llm_b) = (a.upstream("x").expect("configured"), b.upstream("x").expect("configured"));
    llm_a.request().tokens(100).acquire().await.expect("the burst").report_usage(ok(), 100);
    let (result, elapsed) = timed(llm_b.request().timeout(ms(300)).acquire()).await;
    assert_refused_early(&result.expect_err("the fleet's budget is spent"), elapsed, ms(500), ms(10_000));
    let (result, elapsed) = timed(llm_b.request().timeout(ms(300)).acquire()).await;
    assert_refused_early(&result.expect_err("known now"), elapsed, ms(500), ms(10_000));
    // Heard a while ago (over 100 ms): B asks the store again at once, not at its next look
    // (up to a second later), and is told in one round trip.
    tokio::time::sleep(ms(200)).await;
    let (result, elapsed) = timed(llm_b.request().timeout(ms(300)).acquire()).await;
    assert_refused_early(&result.expect_err("asked again: still spent"), elapsed, ms(300), ms(10_000));
    // 10 tokens: a second for the requests budget and for the tokens budget.
    let (result, elapsed) = timed(llm_b.request().tokens(10).timeout(ms(2_500)).acquire()).await;
    result.expect("room comes before the deadline").report_usage(ok(), 10);
    assert!(elapsed > ms(300) && elapsed < ms(2_000), "served after {elapsed:?}");
    // A call in flight in the fleet may give tokens back: no proof from the tokens budget.
    let running = llm_a.request().tokens(0).timeout(ms(3_000)).acquire().await.expect("a running call");
    let (result, elapsed) = timed(llm_b.request().tokens(100).timeout(ms(2_500)).acquire()).await;
    let error = result.expect_err("100 tokens need 10 s");
    assert!(elapsed >= ms(2_400), "refused after {elapsed:?}, while a running call could give tokens back");
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error:?}");
    running.succeeded();
}

// Earliest deadline first within a class; a caller without a deadline counts with max_wait.
#[actix::test]
async fn waiters_are_served_earliest_deadline_first() {
    let s = local(x().limit(1));
    let llm = s.upstream("x").expect("configured");
    let holder = llm.request().acquire().await.expect("the only permit");
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Arrival order a, b, c, d; bounds 5 s, 2 s, 3 s, none (max_wait: 10 s).
    for (depth, (name, timeout)) in
        [("a", Some(5_000)), ("b", Some(2_000)), ("c", Some(3_000)), ("d", None)].into_iter().enumerate()
    {
        let (caller, served) = (llm.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let request = caller.request();
            let request = match timeout {
                Some(t) => request.timeout(ms(t)),
                None => request,
            };
            let permit = request.acquire().await.expect("served in time");
            served.lock().expect("lock").push(name);
            permit.succeeded();
        }));
        let started = Instant::now();
        while llm.status().await.expect("status").queue_depth <= depth {
            assert!(started.elapsed() < ms(500), "{name} never queued");
            tokio::time::sleep(ms(1)).await;
        }
    }
    holder.succeeded();
    for task in tasks {
        tokio::time::timeout(ms(2_000), task).await.expect("served").expect("task");
    }
    assert_eq!(*served.lock().expect("lock"), ["b", "c", "a", "d"]);
}

// The status: each class's queue and an expected wait (an estimate: the callers ahead at the
// recent pace of grants), unknown while nothing says the pace.
#[actix::test]
async fn the_status_shows_each_class_s_queue_and_expected_wait() {
    let s = local(x().limit(1).class("interactive", 3).class("batch", 1).default_class("batch"));
    let llm = s.upstream("x").expect("configured");
    let holder = llm.request().acquire().await.expect("the only permit");
    let waiting = {
        let llm = llm.clone();
        tokio::spawn(async move { llm.request().timeout(ms(3_000)).acquire().await.map(|p| p.succeeded()) })
    };
    let class = |status: &wavegate::UpstreamStatus, name: &str| {
        status.classes.iter().find(|c| c.class == name).cloned().expect("the class")
    };
    let started = Instant::now();
    let status = loop {
        let status = llm.status().await.expect("status");
        if class(&status, "batch").waiting == 1 {
            break status;
        }
        assert!(started.elapsed() < ms(500), "never queued");
        tokio::time::sleep(ms(1)).await;
    };
    // One grant so far: no pace known, so no estimate for a queue that is not empty.
    assert_eq!(class(&status, "batch").expected_wait, None, "{status:?}");
    assert_eq!(class(&status, "interactive").expected_wait, Some(Duration::ZERO), "nobody waits there");
    holder.succeeded();
    tokio::time::timeout(ms(1_000), waiting).await.expect("served").expect("task").expect("permit");
    // A pace: permits held 50 ms each, one after the other.
    for _ in 0..6 {
        let permit = llm.request().acquire().await.expect("a permit");
        tokio::time::sleep(ms(50)).await;
        permit.succeeded();
    }
    let holder = llm.request().acquire().await.expect("the only permit");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let llm = llm.clone();
        tasks
            .push(tokio::spawn(async move { llm.request().timeout(ms(5_000)).acquire().await.map(|p| p.succeeded()) }));
    }
    let started = Instant::now();
    let status = loop {
        let status = llm.status().await.expect("status");
        if class(&status, "batch").waiting == 4 {
            break status;
        }
        assert!(started.elapsed() < ms(500), "never queued");
        tokio::time::sleep(ms(1)).await;
    };
    let batch = class(&status, "batch");
    let expected = batch.expected_wait.expect("a pace is known");
    // Four callers ahead, one grant every ~40 ms (the 6 held 50 ms each, and the quicker
    // grants before and after; the machine may be slow: a wide bound).
    assert!(expected >= ms(100) && expected < ms(1_500), "expected {expected:?}: {status:?}");
    assert_eq!(status.queue_depth, 4);
    assert_eq!(status.expected_wait, Some(expected), "one class waits: the upstream's pace is its");
    holder.succeeded();
    for task in tasks {
        tokio::time::timeout(ms(2_000), task).await.expect("served").expect("task").expect("permit");
    }
}

// The budget turn (lua/budget_turn.lua) and a caller refused at once: b's large ask is refused
// by the fleet's tokens budget (room in 50 s) and its caller, whose deadline comes long before,
// is told at once and leaves. Had b's process taken the turn at that room, a's small ask, which
// the budget has room for a second later, would be refused `earlier_waiter` until b's time: 50 s
// for a turn nobody takes. A refusal longer than the turn's horizon (2 s) takes none.
// 10 tokens a second, burst 600.
#[actix::test]
async fn a_caller_refused_at_once_does_not_keep_the_budget_turn_from_the_others() {
    let redis = RedisServer::start().expect("redis-server");
    let config = || x().tokens_per_minute(600, 600).build().expect("valid");
    let build = || Scheduler::builder().upstream(config()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let (llm_a, llm_b) = (a.upstream("x").expect("configured"), b.upstream("x").expect("configured"));
    llm_a.request().tokens(600).acquire().await.expect("the burst").report_usage(ok(), 600);
    // The release reaches the store before b asks: with a call in flight the budget's wait is
    // no proof (a refund may come), and b would wait out its deadline instead of being told.
    let released = async {
        while llm_a.status().await.expect("status").in_flight_fleet != Some(0) {
            tokio::time::sleep(ms(5)).await;
        }
    };
    tokio::time::timeout(ms(2_000), released).await.expect("a's permit released in the store");
    let (result, elapsed) = timed(llm_b.request().tokens(500).timeout(ms(300)).acquire()).await;
    assert_refused_early(&result.expect_err("500 tokens need 50 s"), elapsed, ms(40_000), ms(60_000));
    // 1.2 s later the budget holds 12 tokens: a's 10 fit.
    tokio::time::sleep(ms(1_200)).await;
    let (result, elapsed) = timed(llm_a.request().tokens(10).timeout(ms(3_000)).acquire()).await;
    result.expect("room for 10 tokens now").report_usage(ok(), 10);
    assert!(elapsed < ms(500), "served after {elapsed:?}");
}

// The same in local mode, with a caller that gives up (its future dropped) instead of one
// refused at once: two schedulers of one process share the upstream's in-process gate (same
// key prefix, same configuration), each its own instance, and LocalGate keeps the turn as
// budget_turn.lua does.
#[actix::test]
async fn in_local_mode_a_caller_that_gave_up_does_not_keep_the_budget_turn_either() {
    let prefix = format!("review2-{}", std::process::id());
    let config = || x().max_wait(ms(60_000)).tokens_per_minute(600, 600).build().expect("valid");
    let build = || Scheduler::builder().key_prefix(prefix.clone()).upstream(config()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let (llm_a, llm_b) = (a.upstream("x").expect("configured"), b.upstream("x").expect("configured"));
    llm_a.request().tokens(600).acquire().await.expect("the burst").report_usage(ok(), 600);
    // 500 tokens need 50 s, within max_wait: b waits, and gives up after 300 ms.
    let gave_up = tokio::time::timeout(ms(300), llm_b.request().tokens(500).acquire()).await;
    assert!(gave_up.is_err(), "b waited: {gave_up:?}");
    tokio::time::sleep(ms(1_200)).await;
    let (result, elapsed) = timed(llm_a.request().tokens(10).timeout(ms(3_000)).acquire()).await;
    result.expect("room for 10 tokens now").report_usage(ok(), 10);
    assert!(elapsed < ms(500), "served after {elapsed:?}");
}

// A denial heard under the old settings proves nothing once a live change raised the rate: a
// caller right after the raise is served, not refused with the old rate's wait (the lane kept
// its last denial for 100 ms and refused from it). One a second, burst 1, then 1,000 a second.
#[actix::test]
async fn a_denial_heard_before_a_live_raise_refuses_no_one_after_it() {
    let s = local(x().requests_per_minute(60, 1));
    let llm = s.upstream("x").expect("configured");
    llm.request().acquire().await.expect("the burst").succeeded();
    // A waiter the gate denies (its next room in about a second): the lane hears the denial.
    let waiter = {
        let llm = llm.clone();
        actix::spawn(async move { llm.request().timeout(ms(5_000)).acquire().await.map(|p| p.succeeded()) })
    };
    tokio::time::sleep(ms(20)).await;
    let raise = wavegate::LiveChange::set(wavegate::LiveSetting::RequestsPerMinute, 60_000, None).expect("valid");
    llm.change_live(raise).await.expect("applied");
    let (served, elapsed) = timed(waiter).await;
    served.expect("the waiter's task").expect("served at the new rate");
    assert!(elapsed < ms(200), "the waiter was served {elapsed:?} after the raise");
    let (result, elapsed) = timed(llm.request().timeout(ms(300)).acquire()).await;
    result.unwrap_or_else(|e| panic!("refused {elapsed:?} after the raise: {e:?}")).succeeded();
}
