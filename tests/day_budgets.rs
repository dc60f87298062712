//! Requests and tokens per day (Groq's and Cerebras's RPD and TPD) through the public API: a
//! fleet on one Redis spends a day's requests exactly once, the callers beyond them are
//! refused at once with the time they would have needed (hours), and the tokens per day are
//! reserved and settled as the per-minute ones; a day the fleet spent stays spent through
//! outages of the store.

use std::time::{Duration, Instant};

use wavegate::{Budget, ErrorKind, Mode, Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::RedisServer;

mod common;

fn success() -> Outcome {
    Outcome::from_status(200, None, std::time::SystemTime::now())
}

/// 12 requests a day, all at once (the provider's own bucket), and a per-minute budget that
/// never binds here.
fn groq() -> UpstreamConfig {
    UpstreamConfig::builder("groq")
        .limit(50)
        .requests_per_minute(1_000, 1_000)
        .requests_per_day(12, 12)
        .build()
        .expect("config")
}

#[actix::test]
async fn a_fleet_spends_a_days_requests_once_and_refuses_the_rest_at_once() {
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(groq()).redis(redis.url()).build().expect("scheduler");
    let fleet = [build(), build(), build()];
    // 30 callers across three processes, each ready to wait 2 s.
    let calls = (0..30usize).map(|k| {
        let upstream = fleet[k % 3].upstream("groq").expect("groq");
        async move {
            let asked = Instant::now();
            match upstream.request().timeout(Duration::from_secs(2)).acquire().await {
                Ok(permit) => {
                    permit.report(success());
                    Ok(())
                }
                Err(error) => Err((error, asked.elapsed())),
            }
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let granted = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(granted, 12, "the fleet granted other than the day's 12 requests");
    for (error, took) in answers.into_iter().filter_map(Result::err) {
        assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error}");
        // One more request in 2 hours (a day ÷ 12): far beyond the 2 s anyone would wait.
        let needed = error.needed().expect("the time it would have needed");
        assert!(needed > Duration::from_secs(3_600), "{error}: needed {needed:?}");
        assert!(took < Duration::from_millis(1_500), "refused after {took:?}, not at once: {error}");
    }
    let status = fleet[0].upstream("groq").expect("groq").status().await.expect("status");
    let (left, next_ms) = status.budgets.requests_per_day.expect("a requests per day budget in the status");
    assert_eq!(left, 0);
    assert!(next_ms > 3_600_000 && next_ms <= 7_200_000, "one more in {next_ms} ms");
}

#[actix::test]
async fn tokens_per_day_are_reserved_settled_and_bound_an_estimate() {
    let config = UpstreamConfig::builder("groq").limit(50).tokens_per_day(10_000, 5_000).build().expect("config");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let groq = scheduler.upstream("groq").expect("groq");
    // Above the day's burst: refused at once, naming the budget.
    let error = groq.request().tokens(5_001).acquire().await.expect_err("above the day's burst");
    assert_eq!((error.kind(), error.budget()), (ErrorKind::InsufficientCapacity, Some(Budget::TokensPerDay)));
    // Nine calls reserving 1,000 and using 500: the burst of 5,000 holds them all, as each
    // gives back half (without the settlement it would hold five).
    for k in 0..9 {
        let permit = groq
            .request()
            .tokens(1_000)
            .timeout(Duration::from_millis(500))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("call {k}: {e}"));
        permit.report_usage(success(), 500);
    }
    let status = groq.status().await.expect("status");
    assert_eq!(status.budgets.tokens_per_day.map(|(left, _)| left), Some(500));
    // 500 left: the next 1,000 wait for 500 more of the day (1.2 hours), refused at once.
    let started = Instant::now();
    let error = groq.request().tokens(1_000).timeout(Duration::from_secs(5)).acquire().await.expect_err("spent");
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    assert!(error.needed().is_some_and(|n| n > Duration::from_secs(4_000)), "{error}");
}

/// Asks `tries` times in a row, each ready to wait `wait`: how many were granted (each used at
/// once) and the shortest time a refused one was told it would have needed.
async fn spend(upstream: &wavegate::Upstream, tries: usize, wait: Duration) -> (usize, Option<Duration>) {
    let (mut granted, mut needed) = (0, None::<Duration>);
    for _ in 0..tries {
        match upstream.request().timeout(wait).acquire().await {
            Ok(permit) => {
                permit.report(success());
                granted += 1;
            }
            Err(error) => {
                let told = error.needed().unwrap_or_default();
                needed = Some(needed.map_or(told, |n| n.min(told)));
            }
        }
    }
    (granted, needed)
}

/// `outages` times: Redis stops (SIGSTOP), each process spends what its fallback lets it (up to
/// 7), Redis comes back and every process shares again; after each, the fleet has been granted
/// at most the day of 8 (`granted` before the first).
async fn spend_through_outages(
    redis: &mut RedisServer,
    fleet: &[Scheduler],
    groq: &[wavegate::Upstream],
    outages: usize,
    mut granted: usize,
) {
    for outage in 0..outages {
        redis.pause().expect("SIGSTOP");
        for (scheduler, upstream) in fleet.iter().zip(groq) {
            granted += spend(upstream, 1, Duration::from_millis(300)).await.0;
            common::wait_for_mode(scheduler, Mode::Fallback, Duration::from_secs(5)).await;
            granted += spend(upstream, 6, Duration::from_millis(300)).await.0;
        }
        redis.resume().expect("SIGCONT");
        for scheduler in fleet {
            common::wait_for_mode(scheduler, Mode::Shared, Duration::from_secs(10)).await;
        }
        println!("after outage {outage}: {granted} granted of a day of 8");
        assert!(granted <= 8, "outage {outage}: {granted} requests granted of a day of 8");
    }
}

/// 8 requests a day, all at once.
fn day_of_8() -> UpstreamConfig {
    UpstreamConfig::builder("groq").limit(50).requests_per_day(8, 8).build().expect("config")
}

#[actix::test]
async fn a_day_the_fleet_spent_stays_spent_through_an_outage() {
    let mut redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(day_of_8()).redis(redis.url()).build().expect("scheduler");
    let fleet = [build(), build()];
    let groq: Vec<_> = fleet.iter().map(|s| s.upstream("groq").expect("groq")).collect();
    // The fleet spends its day: 6 here, 2 there, then each is refused for hours.
    assert_eq!(spend(&groq[0], 6, Duration::from_millis(500)).await.0, 6);
    assert_eq!(spend(&groq[1], 3, Duration::from_millis(500)).await.0, 2);
    assert_eq!(spend(&groq[0], 1, Duration::from_millis(500)).await.0, 0);

    // Redis stops answering: each process falls back to its share of the fleet's day, which is
    // spent (before, each took a share of a fresh day less its own recent grants: the process
    // that had spent 2 took 2 more).
    redis.pause().expect("SIGSTOP");
    for (scheduler, upstream) in fleet.iter().zip(&groq) {
        let _ = spend(upstream, 1, Duration::from_millis(300)).await;
        common::wait_for_mode(scheduler, Mode::Fallback, Duration::from_secs(5)).await;
        let (granted, needed) = spend(upstream, 4, Duration::from_millis(300)).await;
        assert_eq!(granted, 0, "a fallback handed out requests of a day the fleet had spent");
        let needed = needed.expect("refused");
        assert!(needed > Duration::from_secs(3_600), "told {needed:?}, not hours");
    }
    redis.resume().expect("SIGCONT");
    for scheduler in &fleet {
        common::wait_for_mode(scheduler, Mode::Shared, Duration::from_secs(10)).await;
    }
    let status = groq[0].status().await.expect("status");
    assert_eq!(status.budgets.requests_per_day.map(|(left, _)| left), Some(0));
}

#[actix::test]
async fn a_flapping_store_hands_out_no_fresh_day() {
    let mut redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(day_of_8()).redis(redis.url()).build().expect("scheduler");
    let fleet = [build(), build()];
    let groq: Vec<_> = fleet.iter().map(|s| s.upstream("groq").expect("groq")).collect();
    // Each hears the store once (6 of 8 left).
    let mut granted = 0;
    for upstream in &groq {
        granted += spend(upstream, 1, Duration::from_millis(500)).await.0;
    }
    // Three outages in a row: each process spends what its fallback lets it, then the store
    // comes back and is told. The day is spent once in all: 8 requests, not 8 per outage.
    // (Within a minute a process's recent grants alone would hold this; what the store said
    // holds it for grants of any age: spec case "the day's share is what is left divided".)
    spend_through_outages(&mut redis, &fleet, &groq, 3, granted).await;
    // Back in shared mode the store knows the day is spent.
    assert_eq!(spend(&groq[0], 2, Duration::from_millis(300)).await.0, 0);
    assert_eq!(groq[1].status().await.expect("status").budgets.requests_per_day.map(|(left, _)| left), Some(0));
}

/// A process whose last word on the day came from a refusal (the fleet at its limit) counts its
/// fallback's grants against that word: when the store flaps again before it hears another,
/// its next fallback starts from that word less them. (It counted them against its older word,
/// so the next fallback found none after the refusal's and handed the same share out twice: 11
/// requests of a day of 8.)
#[actix::test]
async fn a_fallback_after_a_refusals_word_counts_its_grants_against_it() {
    let mut redis = RedisServer::start().expect("redis-server");
    let config = || UpstreamConfig::builder("groq").limit(2).requests_per_day(8, 8).build().expect("config");
    let build = || Scheduler::builder().upstream(config()).redis(redis.url()).build().expect("scheduler");
    let fleet = [build(), build()];
    let groq: Vec<_> = fleet.iter().map(|s| s.upstream("groq").expect("groq")).collect();
    // The first holds both permits; the second is refused at the limit: its word on the day
    // (6 left) comes from that refusal.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(groq[0].request().timeout(Duration::from_millis(500)).acquire().await.expect("a permit"));
    }
    assert!(groq[1].request().timeout(Duration::from_millis(200)).acquire().await.is_err());
    drop(held);
    // Both processes are known alive before the store goes away (shares of two).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let granted = 2;
    spend_through_outages(&mut redis, &fleet, &groq, 2, granted).await;
}

/// Redis forgets everything (`FLUSHALL`; an empty restart is the same) after the fleet spent its
/// day: the processes find their upstream's state gone, and each carries back what it last heard
/// is left of the day when it reconciles, so the day stays spent. (Before, the store started a
/// fresh day: 8 more requests of a day of 8.) A process that last heard the day before the
/// others spent it carries its older view: the bound is the fallback's, per process what the
/// store had not counted of the others when it last heard it.
#[actix::test]
async fn a_store_that_forgets_its_state_keeps_the_day_spent() {
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(day_of_8()).redis(redis.url()).build().expect("scheduler");
    let fleet = [build(), build()];
    let groq: Vec<_> = fleet.iter().map(|s| s.upstream("groq").expect("groq")).collect();
    assert_eq!(spend(&groq[0], 5, Duration::from_millis(500)).await.0, 5);
    assert_eq!(spend(&groq[1], 4, Duration::from_millis(500)).await.0, 3);
    // Both have heard that nothing is left.
    assert_eq!(spend(&groq[0], 1, Duration::from_millis(300)).await.0, 0);
    let mut con = redis.connection().expect("connection");
    redis::cmd("FLUSHALL").exec(&mut con).expect("FLUSHALL");
    let mut granted = 0;
    for _ in 0..3 {
        for upstream in &groq {
            granted += spend(upstream, 3, Duration::from_millis(300)).await.0;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for scheduler in &fleet {
        common::wait_for_mode(scheduler, Mode::Shared, Duration::from_secs(10)).await;
    }
    granted += spend(&groq[0], 2, Duration::from_millis(300)).await.0;
    assert_eq!(granted, 0, "{granted} requests granted after the store forgot a spent day of 8");
    let status = groq[1].status().await.expect("status");
    assert_eq!(status.budgets.requests_per_day.map(|(left, _)| left), Some(0));
}

/// 86,400 requests a day (one a second), bursts of 10: one process, idle through most of an
/// outage (its share full: a full bucket banks no refill), spends its whole share at the end.
async fn spend_a_share_at_an_outages_end(redis: &mut RedisServer) -> (Scheduler, wavegate::Upstream, usize, Instant) {
    let config = UpstreamConfig::builder("groq").limit(50).requests_per_day(86_400, 10).build().expect("config");
    let scheduler = Scheduler::builder().upstream(config).redis(redis.url()).build().expect("scheduler");
    let groq = scheduler.upstream("groq").expect("groq");
    // The store speaks once (9 left), then the day refills to full.
    assert_eq!(spend(&groq, 1, Duration::from_millis(500)).await.0, 1);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    redis.pause().expect("SIGSTOP");
    // Nothing asked of the stopped server (an acquire queued there would run on its resume):
    // the heartbeat finds the outage.
    common::wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let started = Instant::now();
    let spent = spend(&groq, 12, Duration::from_millis(20)).await.0;
    (scheduler, groq, spent, started)
}

/// Review 33, finding 1: charged as if used from the outage's start, the share spent at its end
/// was paid by 12 s of a refill it never banked, and the store handed out a second burst at
/// once (20 in 0.3 s of a day of 1 a second, burst 10).
#[actix::test]
async fn a_share_spent_at_an_outages_end_is_not_paid_by_a_refill_it_never_banked() {
    let mut redis = RedisServer::start().expect("redis-server");
    let (scheduler, groq, in_fallback, started) = spend_a_share_at_an_outages_end(&mut redis).await;
    redis.resume().expect("SIGCONT");
    common::wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(10)).await;
    let in_shared = spend(&groq, 12, Duration::from_millis(20)).await.0;
    let took = started.elapsed();
    let bound = 10 + took.as_secs_f64().ceil() as usize;
    println!("fallback {in_fallback} + shared {in_shared} granted in {took:?}; rate × w + burst = {bound}");
    assert!(in_fallback + in_shared <= bound, "{} granted in {took:?} (bound {bound})", in_fallback + in_shared);
}

/// Review 33, finding 2: back in shared mode without a new word, a second outage started its
/// share from the old word less the first one's use charged at the word's time, so the refill
/// since paid for it and a second share was handed out at once.
#[actix::test]
async fn a_second_outage_right_after_hands_out_no_second_share() {
    let mut redis = RedisServer::start().expect("redis-server");
    let (scheduler, groq, first, started) = spend_a_share_at_an_outages_end(&mut redis).await;
    redis.resume().expect("SIGCONT");
    common::wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(10)).await;
    redis.pause().expect("SIGSTOP");
    common::wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(10)).await;
    let second = spend(&groq, 12, Duration::from_millis(20)).await.0;
    let took = started.elapsed();
    redis.resume().expect("SIGCONT");
    let bound = 10 + took.as_secs_f64().ceil() as usize;
    println!("first fallback {first} + second fallback {second} in {took:?}; rate × w + burst = {bound}");
    assert!(first + second <= bound, "{} granted in {took:?} (bound {bound})", first + second);
}
