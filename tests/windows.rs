//! The provider's windows when features meet: a window from one answer is clamped (a
//! `Retry-After` alone by the upstream's `max_cooldown`, anything by a day), the provider's next
//! plausible answer ends it, an operator can clear it, and every process refused by it keeps
//! looking, so none needs a restart; a caller refused meanwhile is told when to come back.

use std::time::{Duration, Instant, SystemTime};

use wavegate::{ErrorKind, Outcome, ProviderSignals, Scheduler, UpstreamConfig};

mod common;

/// The longest a `Retry-After` alone may pause the fleet here.
const MAX_COOLDOWN: Duration = Duration::from_secs(30);

fn upstream() -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(10)
        .max_cooldown(MAX_COOLDOWN)
        // Beyond the longest window (the cap): a caller without a deadline of its own waits for
        // a window to end (or be cleared) instead of being told at once that it cannot.
        .max_wait(Duration::from_secs(40))
        .build()
        .expect("valid")
}

/// A rate-window 429 whose only word on when is `Retry-After: retry_after`.
fn rate_window_429(retry_after: &str) -> Outcome {
    Outcome::from_status(429, Some(retry_after), SystemTime::now()).with_error_code("rate_limit_exceeded")
}

/// Asks `s` for a permit with a short timeout: refused while a window runs, with the hint.
async fn refused_with_hint(s: &Scheduler) -> Duration {
    let llm = s.upstream("llm").expect("configured");
    let error = llm.request().timeout(Duration::from_millis(300)).acquire().await.expect_err("a window runs");
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error}");
    error.retry_after().expect("a hint")
}

/// How long `s` takes to be granted a permit, started now (at most its `max_wait`).
async fn granted_after(s: &Scheduler) -> Duration {
    let llm = s.upstream("llm").expect("configured");
    let started = Instant::now();
    let permit = llm.request().acquire().await.expect("granted once the window is gone");
    permit.succeeded();
    started.elapsed()
}

/// OpenAI's headers on a 200: the bucket's limit, what is left and the time until it is full.
fn ok_with_bucket(limit: u64, left: u64, full_in_ms: u64) -> Outcome {
    let values = [limit.to_string(), left.to_string(), format!("{full_in_ms}ms")];
    let names = ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"];
    let headers = names.iter().zip(&values).map(|(name, value)| (*name, value.as_bytes()));
    Outcome::from_signals(200, None, ProviderSignals::from_headers(headers, SystemTime::now()))
}

// Issue 23: OpenAI's reset is the time until a continuously refilled bucket is full again.
// Read as the end of a window, a drained bucket stopped the fleet for the whole refill (a
// minute here); read as a refill, calls go on at the provider's rate, and never beyond it.
#[actix::test]
async fn openai_s_reset_is_a_refill_and_nothing_stalls_waiting_for_it() {
    let s = Scheduler::builder().upstream(upstream()).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    // The provider: 600 requests a minute, refilled continuously (one back every 100 ms), 10
    // left at the start.
    let (limit, full_ms) = (600.0_f64, 60_000.0_f64);
    let started = Instant::now();
    let (mut level, mut at) = (10.0, started);
    let (mut grants, mut over) = (Vec::new(), 0);
    while started.elapsed() < Duration::from_millis(2_000) {
        let permit = llm.request().timeout(Duration::from_secs(3)).acquire().await.expect("a permit");
        let now = Instant::now();
        grants.push(now);
        level = (level + now.duration_since(at).as_secs_f64() * 1_000.0 * limit / full_ms).min(limit);
        at = now;
        if level < 1.0 {
            over += 1; // the provider would have answered 429
        }
        level = (level - 1.0).max(0.0);
        let full_in_ms = ((limit - level) * full_ms / limit).ceil() as u64;
        permit.report(ok_with_bucket(600, level.floor() as u64, full_in_ms));
    }
    let longest = grants.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default();
    println!("{} calls in 2 s, longest gap {longest:?}, {over} beyond the bucket", grants.len());
    assert_eq!(over, 0, "never beyond the provider's bucket");
    assert!(longest < Duration::from_millis(400), "a stall of {longest:?} waiting for a refill");
    assert!(grants.len() >= 24, "{} calls in 2 s where the provider allows 30", grants.len());
    assert!(grants.len() <= 31, "{} calls in 2 s where the provider allows 30", grants.len());
}

#[actix::test]
async fn a_retry_after_of_a_day_pauses_this_process_at_most_max_cooldown_and_an_operator_clears_it() {
    let s = common::isolated().upstream(upstream()).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    llm.request().acquire().await.expect("a permit").report(rate_window_429("86400"));
    let hint = refused_with_hint(&s).await;
    assert!(hint > MAX_COOLDOWN - Duration::from_secs(5) && hint <= MAX_COOLDOWN, "told to come back in {hint:?}");
    // The operator clears it: the waiting caller is served at once.
    let waiting = granted_after(&s);
    let clear = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        llm.clear_window().await.expect("cleared");
    };
    let (waited, ()) = tokio::join!(waiting, clear);
    assert!(waited < Duration::from_secs(2), "served {waited:?} after the clear");
}

#[cfg(feature = "redis")]
mod fleet {
    use wavegate_testkit::RedisServer;

    use super::*;

    /// A 200 saying, as OpenAI does, that `remaining` requests are left until `reset`.
    fn ok_with_requests_left(remaining: &str, reset: &str) -> Outcome {
        let headers = [
            ("x-ratelimit-remaining-requests", remaining.as_bytes()),
            ("x-ratelimit-reset-requests", reset.as_bytes()),
        ];
        Outcome::from_signals(200, None, ProviderSignals::from_headers(headers, SystemTime::now()))
    }

    /// The store's end of the requests window of `llm`, in ms from the store's now.
    fn window_left_ms(redis: &RedisServer) -> Option<i64> {
        let mut con = redis.connection().expect("connection");
        let key = common::wave_key(redis, "llm");
        let until: Option<i64> = redis::cmd("HGET").arg(&key).arg("pw_requests_until").query(&mut con).expect("HGET");
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).expect("TIME");
        until.map(|until| until - (secs * 1_000 + micros / 1_000))
    }

    /// Waits until the store holds a requests window ending after `more_than` ms.
    async fn stored_window(redis: &RedisServer, more_than: i64) -> i64 {
        let asked = Instant::now();
        loop {
            if let Some(left) = window_left_ms(redis).filter(|left| *left > more_than) {
                return left;
            }
            assert!(asked.elapsed() < Duration::from_secs(2), "the window report never reached the store");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    // A call the provider refused (a 429) was charged to the provider's windows at its grant;
    // the provider counted none of it. Kept charged, it held the fleet's windows low until the
    // bucket was full again (Anthropic-like: up to 7.7 s of silence with room at the provider).
    #[actix::test]
    async fn a_call_the_provider_refused_gives_its_request_back_to_the_fleets_window() {
        let redis = RedisServer::start().expect("redis-server");
        let build = || Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
        let (a, b) = (build(), build());
        let llm = a.upstream("llm").expect("configured");
        // 2 requests left of a bucket of 10 full again in a minute: one back every 7.5 s.
        llm.request().acquire().await.expect("first").report(ok_with_bucket(10, 2, 60_000));
        let refused = llm.request().acquire().await.expect("one of the two");
        let served = llm.request().acquire().await.expect("the other");
        let other = b.upstream("llm").expect("configured");
        let waiter = actix::spawn(async move { other.request().timeout(Duration::from_secs(3)).acquire().await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The provider refuses the first (a rate window's 429 without headers): it counted
        // none of it, so the fleet has one request again (seen by a waiter within its look
        // again, a second), and only one.
        let at = Instant::now();
        refused.report(Outcome::from_status(429, None, SystemTime::now()).with_error_code("rate_limit_exceeded"));
        served.succeeded();
        let permit = waiter.await.expect("the task").expect("the refused call's request came back to the fleet");
        assert!(at.elapsed() < Duration::from_millis(1_500), "granted {:?} after the refusal", at.elapsed());
        permit.succeeded();
        let more = llm.request().timeout(Duration::from_millis(1_500)).acquire().await;
        assert!(more.is_err(), "more than the refused call's request came back");
    }

    /// A window this process knew in shared mode still holds in its fallback (review 34: the
    /// fallback's gate started without the windows, and sent into one that was spent).
    #[actix::test]
    async fn a_fallback_keeps_the_provider_window_it_knew() {
        let mut redis = RedisServer::start().expect("redis-server");
        let config = UpstreamConfig::builder("llm")
            .limit(4)
            .renewed_lease(Duration::from_secs(3))
            .max_wait(Duration::from_secs(5))
            .build()
            .expect("valid");
        let scheduler = Scheduler::builder().upstream(config).redis(redis.url()).build().expect("scheduler");
        let llm = scheduler.upstream("llm").expect("configured");
        let permit = llm.request().acquire().await.expect("a permit while healthy");
        let other = llm.request().acquire().await.expect("another permit while healthy");
        // 0 of 1 request left, full again in 20 s: nothing may go for 20 s.
        permit.report(ok_with_bucket(1, 0, 20_000));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let shared = llm.request().timeout(Duration::from_millis(300)).acquire().await;
        assert!(shared.is_err(), "shared mode keeps the window");
        redis.pause().expect("SIGSTOP");
        // Its release times out: the process falls back.
        other.succeeded();
        common::wait_for_mode(&scheduler, wavegate::Mode::Fallback, Duration::from_secs(3)).await;
        let during = llm.request().timeout(Duration::from_millis(1_500)).acquire().await;
        redis.resume().expect("SIGCONT");
        let error = during.map(drop).expect_err("the provider's window (0 left for 20 s) still runs in the fallback");
        assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error}");
    }

    #[actix::test]
    async fn one_answer_pauses_the_fleet_no_longer_than_its_clamp_and_the_next_answer_or_a_clear_ends_it() {
        let redis = RedisServer::start().expect("redis-server");
        let build = || Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
        let (a, b) = (build(), build());
        let llm = a.upstream("llm").expect("configured");
        let first = llm.request().acquire().await.expect("a permit");
        let second = llm.request().acquire().await.expect("another");
        // One 429 with a day's Retry-After: the fleet's window is the cooldown cap, not a day.
        first.report(rate_window_429("86400"));
        let left = stored_window(&redis, 0).await;
        assert!(left <= MAX_COOLDOWN.as_millis() as i64, "the window ends in {left} ms");
        let hint = refused_with_hint(&b).await;
        assert!(hint > Duration::from_secs(20) && hint <= MAX_COOLDOWN, "B is told to come back in {hint:?}");
        // B waits; the provider's next answer (999 left this minute) ends the pause for B too.
        let waiting = granted_after(&b);
        let answer = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            second.report(ok_with_requests_left("999", "60s"));
        };
        let (waited, ()) = tokio::join!(waiting, answer);
        assert!(waited < Duration::from_secs(3), "B was served {waited:?} after the provider's next answer");
        eprintln!(
            "window stored for {left} ms, B told {hint:?}, served {waited:?} after B began waiting (the answer 200 ms in)"
        );

        // Another day's pause, then an operator clears it from A: B, refused by it, sees it.
        llm.request().acquire().await.expect("a permit").report(rate_window_429("86400"));
        stored_window(&redis, 20_000).await;
        refused_with_hint(&b).await;
        let waiting = granted_after(&b);
        let clear = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            llm.clear_window().await.expect("cleared");
        };
        let (waited, ()) = tokio::join!(waiting, clear);
        assert!(waited < Duration::from_secs(3), "B was served {waited:?} after the clear");
        eprintln!("served {waited:?} after B began waiting (the clear 200 ms in)");

        // An absurd number in the store (written by hand, or by an older version) is read as a
        // day at most: no acquire fails on it, and a clear ends it.
        let mut con = redis.connection().expect("connection");
        let key = common::wave_key(&redis, "llm");
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("pw_requests_left")
            .arg("0")
            .arg("pw_requests_until")
            .arg("18446744073709551616")
            .query(&mut con)
            .expect("HSET");
        let hint = refused_with_hint(&b).await;
        assert!(hint <= Duration::from_secs(86_400), "{hint:?}");
        assert_eq!(a.mode().await.expect("mode"), wavegate::Mode::Shared, "no store error");
        llm.clear_window().await.expect("cleared");
        // B heard the window just now: for 100 ms that refuses B's callers by itself; later
        // ones make B ask the store, which says the window is gone.
        tokio::time::sleep(Duration::from_millis(150)).await;
        granted_after(&b).await;
        // Retry-After beyond any integer: clamped like the rest.
        llm.request().acquire().await.expect("a permit").report(rate_window_429("99999999999999999999"));
        let left = stored_window(&redis, 0).await;
        assert!(left <= MAX_COOLDOWN.as_millis() as i64, "{left}");
        llm.clear_window().await.expect("cleared");
        granted_after(&b).await;
    }

    /// The store's now, in ms.
    fn store_now_ms(con: &mut redis::Connection) -> i64 {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
        secs * 1_000 + micros / 1_000
    }

    #[actix::test]
    async fn every_deadline_read_back_from_the_store_is_clamped_and_stays_put() {
        // What a backward jump of Redis TIME (a failover to a replica with a slow clock), an
        // older version or a hand can leave: deadlines years ahead.
        let redis = RedisServer::start().expect("redis-server");
        let config = UpstreamConfig::builder("llm")
            .limit(10)
            .max_cooldown(MAX_COOLDOWN)
            .requests_per_minute(600, 10)
            .max_wait(Duration::from_secs(20))
            .build()
            .expect("valid");
        let build = || Scheduler::builder().upstream(config.clone()).redis(redis.url()).build().expect("scheduler");
        let s = build();
        let llm = s.upstream("llm").expect("configured");
        llm.request().acquire().await.expect("a permit").succeeded();
        let key = common::wave_key(&redis, "llm");
        let mut con = redis.connection().expect("connection");
        let years = store_now_ms(&mut con) + 10 * 365 * 86_400_000;
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("state")
            .arg("COOLDOWN")
            .arg("cooldown_until")
            .arg(years)
            .arg("requests_tat")
            .arg(years * 1_000)
            .query(&mut con)
            .expect("HSET");
        let hint = refused_with_hint(&s).await;
        assert!(hint <= MAX_COOLDOWN, "a cooldown of ten years read as {hint:?}");
        let read = |con: &mut redis::Connection, field: &str| -> i64 {
            redis::cmd("HGET").arg(&key).arg(field).query(con).expect("HGET")
        };
        // Clamped once and saved: the end no longer moves with now.
        let cooldown = read(&mut con, "cooldown_until");
        let now = store_now_ms(&mut con);
        assert!(cooldown <= now + MAX_COOLDOWN.as_millis() as i64, "cooldown ends {} ms ahead", cooldown - now);
        // Out of the cooldown by hand: the budget's TAT is read next, at most the tolerance (1 s)
        // and a minute of debt ahead.
        // (Another process: this one waits out the cooldown it was told of.)
        let _: () = redis::cmd("HSET").arg(&key).arg("state").arg("NORMAL").query(&mut con).expect("HSET");
        let other = build();
        refused_with_hint(&other).await;
        let tat = read(&mut con, "requests_tat");
        let now = store_now_ms(&mut con);
        assert!(tat <= (now + 61_000) * 1_000, "the requests budget's TAT lies {} ms ahead", tat / 1_000 - now);
        tokio::time::sleep(Duration::from_millis(300)).await;
        refused_with_hint(&build()).await;
        assert_eq!(read(&mut con, "requests_tat"), tat, "the clamped TAT moved with now");
    }

    // Issue 22: an answer's report of the provider's windows rode in a script call of its own,
    // beside the release it came with (three script calls per call of an LLM provider: acquire,
    // report, release). It now rides on the release: two, and the window reaches the store all
    // the same.
    #[actix::test]
    async fn an_answers_report_rides_on_its_release() {
        let redis = RedisServer::start().expect("redis-server");
        let s = Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
        let llm = s.upstream("llm").expect("configured");
        // The first call starts the store's count of grants; the script calls are counted after it.
        llm.request().acquire().await.expect("first").report(ok_with_bucket(1_000, 900, 6_000));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut con = redis.connection().expect("connection");
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con).expect("RESETSTAT");
        const CALLS: u64 = 30;
        for left in (0..CALLS).rev() {
            let permit = llm.request().acquire().await.expect("a permit");
            permit.report(ok_with_bucket(1_000, 100 + left, 54_000));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let scripts = common::script_calls(&mut con);
        // An acquire and a release per call, and a few heartbeats and gauge reads.
        assert!(scripts <= 2 * CALLS + 6, "{scripts} script calls for {CALLS} calls with a report each");
        // The last answer's window is the store's: 100 left of a bucket full in 54 s, less
        // nothing granted since.
        let key = common::wave_key(&redis, "llm");
        let left: Option<i64> = redis::cmd("HGET").arg(&key).arg("pw_requests_left").query(&mut con).expect("HGET");
        assert_eq!(left, Some(100), "the last answer's report did not reach the store");
    }
}
