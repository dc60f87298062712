//! `wavegate status`, `clear-window`, `set`, `shadow` and their mistakes, run as the real binary against a real
//! redis-server that two schedulers (two processes of a fleet, as far as the store can tell)
//! share.

use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use wavegate::{Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::RedisServer;

fn wavegate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wavegate")).args(args).output().expect("the wavegate binary runs")
}

fn status(url: &str) -> Value {
    let out = wavegate(&["status", "--json", "--redis", url]);
    assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn upstream<'a>(fleet: &'a Value, name: &str) -> &'a Value {
    fleet["upstreams"].as_array().expect("upstreams").iter().find(|u| u["name"] == name).expect("listed")
}

#[actix::test]
async fn status_shows_the_fleet_and_clear_window_frees_it() {
    let redis = RedisServer::start().expect("redis-server");
    let llm = || {
        UpstreamConfig::builder("llm")
            .limit(8)
            .class("interactive", 3)
            .class("batch", 1)
            .requests_per_minute(600, 20)
            .build()
            .expect("valid")
    };
    let img = || UpstreamConfig::builder("img").limit(3).build().expect("valid");
    let build = || Scheduler::builder().upstream(llm()).upstream(img()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let interactive =
        a.upstream("llm").expect("llm").request().priority("interactive").acquire().await.expect("permit");
    let batch = b.upstream("llm").expect("llm").request().priority("batch").acquire().await.expect("permit");
    let image = b.upstream("img").expect("img").request().acquire().await.expect("permit");
    // A rate-window 429 on a third llm permit: a window for the fleet.
    let refused = a.upstream("llm").expect("llm").request().acquire().await.expect("permit");
    refused.report(Outcome::from_status(429, Some("20"), SystemTime::now()).with_error_code("rate_limit_exceeded"));
    // The report and the claims reach the store in the background: wait for both.
    let started = Instant::now();
    let fleet = loop {
        let fleet = status(&redis.url());
        let ready = fleet["upstreams"].as_array().is_some_and(|u| u.len() == 2)
            && !upstream(&fleet, "llm")["windows"]["requests"].is_null();
        if ready {
            break fleet;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "the fleet never showed: {fleet}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("{fleet:#}");
    let processes = fleet["processes"].as_array().expect("processes");
    assert!(processes.len() >= 2, "two live processes");
    assert!(processes.iter().all(|p| p["mode"] == "shared"), "each told its mode: {processes:?}");
    let llm_view = upstream(&fleet, "llm");
    assert_eq!((llm_view["limit"].as_u64(), llm_view["in_flight"].as_u64()), (Some(8), Some(2)));
    let classes: Vec<(&str, u64)> = llm_view["classes"]
        .as_array()
        .expect("classes")
        .iter()
        .map(|c| (c["name"].as_str().expect("name"), c["in_flight"].as_u64().expect("count")))
        .collect();
    assert_eq!(classes, [("interactive", 1), ("batch", 1)]);
    assert!(llm_view["budgets"]["requests"]["available"].as_u64().is_some());
    let window = &llm_view["windows"]["requests"];
    assert_eq!(window["left"].as_u64(), Some(0));
    assert!(window["ends_in_ms"].as_u64().is_some_and(|ms| ms > 10_000 && ms <= 20_000), "{window}");
    assert_eq!(upstream(&fleet, "img")["in_flight"].as_u64(), Some(1));
    // For a person: one line per upstream and its window, with the command that clears it.
    let text = wavegate(&["status", "--redis", &redis.url()]);
    let text = String::from_utf8_lossy(&text.stdout);
    println!("{text}");
    assert!(text.contains("llm: NORMAL limit 8") && text.contains("wavegate clear-window llm"), "{text}");

    let cleared = wavegate(&["clear-window", "llm", "--redis", &redis.url()]);
    assert!(cleared.status.success(), "{}", String::from_utf8_lossy(&cleared.stderr));
    assert!(upstream(&status(&redis.url()), "llm")["windows"]["requests"].is_null(), "the window is gone");
    // The fleet admits again within about a second.
    let asked = Instant::now();
    b.upstream("llm").expect("llm").request().acquire().await.expect("admitted after the clear").succeeded();
    assert!(asked.elapsed() < Duration::from_secs(3), "{:?}", asked.elapsed());
    drop((interactive, batch, image));
}

#[test]
fn mistakes_are_usage_errors_and_an_unreachable_store_is_a_store_error() {
    let unknown = wavegate(&["stats"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown command"));
    let help = wavegate(&["--help"]);
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("clear-window UPSTREAM"));
    // A port nothing listens on: a clear error, exit 1, within the connect bound.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let started = Instant::now();
    let down = wavegate(&["status", "--redis", &format!("redis://127.0.0.1:{port}")]);
    assert_eq!(down.status.code(), Some(1), "{}", String::from_utf8_lossy(&down.stderr));
    assert!(started.elapsed() < Duration::from_secs(5));
    let bad = wavegate(&["clear-window", "no such name", "--redis", &format!("redis://127.0.0.1:{port}")]);
    assert_ne!(bad.status.code(), Some(0));
}

/// `set`: a live limit every scheduler applies within a second, shown by `status`; an override
/// that reverts; back to the configured limit; a name no process configures is refused.
#[actix::test]
async fn set_changes_the_fleets_limit_live() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let build = || {
        let llm = UpstreamConfig::builder("llm").limit(8).requests_per_minute(600, 20).build().expect("valid");
        Scheduler::builder().upstream(llm).redis(url.clone()).build().expect("scheduler")
    };
    let (a, b) = (build(), build());
    let set = |extra: &[&str]| {
        let mut args = vec!["set", "llm", "--redis", &url];
        args.extend_from_slice(extra);
        wavegate(&args)
    };
    let applied_by_both = |limit: u32| {
        let (a, b) = (a.upstream("llm").expect("llm"), b.upstream("llm").expect("llm"));
        async move {
            let started = Instant::now();
            loop {
                let (sa, sb) = (a.status().await.expect("status"), b.status().await.expect("status"));
                if sa.base_limit == limit && sb.base_limit == limit {
                    return (started.elapsed(), sa);
                }
                assert!(started.elapsed() < Duration::from_secs(3), "not applied: {sa:?} {sb:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    let out = set(&["--limit", "3", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reply: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    println!("{reply}");
    assert_eq!(
        (reply["setting"].as_str(), reply["value"].as_u64(), reply["version"].as_u64()),
        (Some("limit"), Some(3), Some(1))
    );
    assert_eq!(reply["live"]["limit"]["value"].as_u64(), Some(3));
    let (took, seen) = applied_by_both(3).await;
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!((seen.limit, seen.configured_limit, seen.live_version), (3, 8, 1));
    let view = upstream(&status(&url), "llm").clone();
    assert_eq!((view["limit"].as_u64(), view["live"]["limit"]["value"].as_u64()), (Some(3), Some(3)));
    let text = wavegate(&["status", "--redis", &url]);
    let text = String::from_utf8_lossy(&text.stdout);
    println!("{text}");
    assert!(
        text.contains("llm: NORMAL limit 3 (configured 8)") && text.contains("live limit 3 until changed"),
        "{text}"
    );

    // An override for a second, then the configured limit again.
    let out = set(&["--limit", "5", "--for", "1s"]);
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}");
    assert!(said.contains("llm: limit 5 for 1.0s, then back to the configured one (version 2)"), "{said}");
    applied_by_both(5).await;
    let (took, seen) = applied_by_both(8).await;
    assert_eq!(seen.live_version, 3, "reverted under a version of its own");
    assert!(took < Duration::from_secs(3), "{took:?}");

    let out = set(&["--limit", "4"]);
    assert!(out.status.success());
    applied_by_both(4).await;
    let out = set(&["--limit", "configured", "--json"]);
    let reply: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!((reply["value"].as_str(), reply["live"]["limit"].is_null()), (Some("configured"), true), "{reply}");
    applied_by_both(8).await;

    // A budget's rate: shown by status; a budget the upstream does not have is refused.
    let out = set(&["--requests-per-minute", "300", "--for", "10m"]);
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}");
    assert!(said.contains("llm: requests per minute 300 for 600.0s"), "{said}");
    let view = upstream(&status(&url), "llm").clone();
    let live = &view["live"]["requests_per_minute"];
    assert_eq!(live["value"].as_u64(), Some(300), "{view}");
    assert!(live["for_ms"].as_u64().is_some_and(|ms| ms > 590_000 && ms <= 600_000), "{live}");
    let text = wavegate(&["status", "--redis", &url]);
    let text = String::from_utf8_lossy(&text.stdout);
    println!("{text}");
    assert!(text.contains("live requests per minute 300 for"), "{text}");
    let said = set(&["--requests-burst", "5"]);
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(said.contains("llm: requests burst 5 until changed"), "{said}");
    let view = upstream(&status(&url), "llm").clone();
    assert_eq!(view["live"]["requests_burst"]["value"].as_u64(), Some(5), "{view}");
    let no_burst = set(&["--tokens-burst", "300"]);
    assert_eq!(no_burst.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_burst.stderr).contains("no budget tokens_burst"), "{no_burst:?}");
    let none = set(&["--tokens-per-minute", "300"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no budget tokens_per_minute"), "{none:?}");

    let classless = set(&["--weight", "batch=2"]);
    assert_eq!(classless.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&classless.stderr).contains("no priority class \"batch\""), "{classless:?}");

    // Shadow mode, fleet-wide: both schedulers let a call through at once, then hold again.
    let shadow = wavegate(&["shadow", "on", "llm", "--redis", &url, "--for", "1h"]);
    let said = String::from_utf8_lossy(&shadow.stdout);
    println!("{said}");
    assert!(said.contains("llm: shadow on for 3600.0s, then back to the configured mode"), "{said}");
    let in_shadow = |on: bool| {
        let (a, b) = (a.upstream("llm").expect("llm"), b.upstream("llm").expect("llm"));
        async move {
            let started = Instant::now();
            while a.status().await.expect("status").shadow.upstream != on
                || b.status().await.expect("status").shadow.upstream != on
            {
                assert!(started.elapsed() < Duration::from_secs(1), "shadow {on} not applied within 1 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    in_shadow(true).await;
    let view = upstream(&status(&url), "llm").clone();
    assert_eq!(view["live"]["shadow"]["value"].as_u64(), Some(1), "{view}");
    let text = wavegate(&["status", "--redis", &url]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("live shadow on for") && text.contains("wavegate shadow configured llm"), "{text}");
    assert!(wavegate(&["shadow", "configured", "llm", "--redis", &url]).status.success());
    in_shadow(false).await;
    let no_class = wavegate(&["shadow", "on", "llm", "--class", "batch", "--redis", &url]);
    assert_eq!(no_class.status.code(), Some(1), "no class batch: {no_class:?}");

    let typo = wavegate(&["set", "lmm", "--limit", "3", "--redis", &url]);
    assert_eq!(typo.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&typo.stderr).contains("no live process configures \"lmm\""));
    let zero = wavegate(&["set", "llm", "--limit", "0", "--redis", &url]);
    assert_eq!(zero.status.code(), Some(2), "a usage error, before the store");
}

/// A spent quota met by one process refuses the upstream in every process (told through the
/// store); `reset-quota`: the tool
/// lifts the refusal in every one of them within a second.
#[actix::test]
async fn reset_quota_lifts_the_refusal_in_every_process() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let build = || {
        let llm = UpstreamConfig::builder("llm").limit(4).max_wait(Duration::from_millis(200)).build().expect("valid");
        Scheduler::builder().upstream(llm).redis(url.clone()).build().expect("scheduler")
    };
    let (a, b) = (build(), build());
    // a meets the spent quota; b is refused too, without an attempt of its own: a told the fleet.
    let permit = a.upstream("llm").expect("llm").request().acquire().await.expect("permit");
    permit.report(Outcome::from_status(429, None, SystemTime::now()).with_error_code("insufficient_quota"));
    let refused = a.upstream("llm").expect("llm").request().acquire().await.expect_err("refused");
    assert_eq!(refused.kind(), wavegate::ErrorKind::QuotaExhausted, "{refused}");
    let started = Instant::now();
    loop {
        match b.upstream("llm").expect("llm").request().acquire().await {
            Err(refused) if refused.kind() == wavegate::ErrorKind::QuotaExhausted => break,
            other => assert!(started.elapsed() < Duration::from_secs(1), "b not refused within 1 s: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("b refused {:?} after a met the spent quota", started.elapsed());
    let text = wavegate(&["status", "--redis", &url]);
    let text = String::from_utf8_lossy(&text.stdout);
    println!("{text}");
    assert!(text.contains("quota spent: every process refuses it for") && text.contains("reset-quota llm"), "{text}");
    let out = wavegate(&["reset-quota", "llm", "--redis", &url]);
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}");
    assert!(out.status.success() && said.contains("spent-quota refusals lifted"), "{said} {out:?}");
    let started = Instant::now();
    for scheduler in [&a, &b] {
        let llm = scheduler.upstream("llm").expect("llm");
        loop {
            match llm.request().acquire().await {
                Ok(permit) => {
                    permit.succeeded();
                    break;
                }
                Err(error) => assert!(started.elapsed() < Duration::from_secs(2), "still refused: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!("both admit {:?} after the reset", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(1));
    let typo = wavegate(&["reset-quota", "lmm", "--redis", &url]);
    assert_eq!(typo.status.code(), Some(1));
}

/// `top`: a fleet of four processes and ten upstreams on one screen, refreshed.
#[actix::test]
async fn top_shows_four_processes_and_ten_upstreams_at_a_glance() {
    let redis = RedisServer::start().expect("redis-server");
    let names: Vec<String> = (0..10).map(|i| format!("api-{i}")).collect();
    let build = || {
        let mut builder = Scheduler::builder().redis(redis.url());
        for (i, name) in names.iter().enumerate() {
            let config = UpstreamConfig::builder(name.as_str()).limit(4 + i as u32);
            let config = if i % 3 == 0 { config.requests_per_minute(600, 20) } else { config };
            builder = builder.upstream(config.build().expect("valid"));
        }
        builder.build().expect("scheduler")
    };
    let fleet: Vec<Scheduler> = (0..4).map(|_| build()).collect();
    let mut permits = Vec::new();
    for (i, scheduler) in fleet.iter().enumerate() {
        for name in names.iter().take(3 + i) {
            permits.push(scheduler.upstream(name).expect("configured").request().acquire().await.expect("permit"));
        }
    }
    // The claims and heartbeats reach the store in the background.
    let started = Instant::now();
    while status(&redis.url())["upstreams"].as_array().is_none_or(|u| u.len() < 10)
        || status(&redis.url())["processes"].as_array().is_none_or(|p| p.len() < 4)
    {
        assert!(started.elapsed() < Duration::from_secs(15), "the fleet never showed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut top = Command::new(env!("CARGO_BIN_EXE_wavegate"))
        .args(["top", "--every", "0.2", "--redis", &redis.url()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("top runs");
    tokio::time::sleep(Duration::from_millis(700)).await;
    top.kill().expect("top stops");
    let out = top.wait_with_output().expect("its output");
    let screens = String::from_utf8_lossy(&out.stdout);
    let screen = screens.rsplit("\x1b[2J\x1b[H").next().expect("a screen");
    println!("{screen}");
    assert!(screens.matches("\x1b[2J\x1b[H").count() >= 2, "refreshed: {screens}");
    assert!(screen.contains("4 live process(es) (4 shared)"), "{screen}");
    let lines: Vec<&str> = screen.lines().filter(|l| l.starts_with("api-")).collect();
    assert_eq!(lines.len(), 10, "{screen}");
    // api-0 is held by all four processes, api-5 by one, api-6 by none; api-0 has a budget.
    let api0 = lines.iter().find(|l| l.starts_with("api-0 ")).expect("api-0");
    assert!(api0.contains("NORMAL") && api0.contains("req "), "{api0}");
    let in_flight = |line: &str| line.split_whitespace().nth(3).map(str::to_owned);
    assert_eq!(in_flight(api0).as_deref(), Some("4"), "{api0}");
    let api5 = lines.iter().find(|l| l.starts_with("api-5 ")).expect("api-5");
    assert_eq!(in_flight(api5).as_deref(), Some("1"), "{api5}");
    let api6 = lines.iter().find(|l| l.starts_with("api-6 ")).expect("api-6");
    assert_eq!(in_flight(api6).as_deref(), Some("0"), "{api6}");
    assert!(screen.lines().count() <= 30, "one screen: {} lines", screen.lines().count());
    drop(permits);
}

/// A FLUSHALL while the fleet refuses a spent quota, then `reset-quota`: the reset must
/// still lift the refusal everywhere within a second (it is announced), though the store's
/// live version starts over — at the version (2) both processes applied before the flush: the
/// live settings' epoch, new after the flush, tells them apart.
#[actix::test]
async fn reset_quota_after_a_flushall_still_lifts_the_refusal() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let build = || {
        let llm = UpstreamConfig::builder("llm").limit(4).max_wait(Duration::from_millis(200)).build().expect("valid");
        Scheduler::builder().upstream(llm).redis(url.clone()).build().expect("scheduler")
    };
    let (a, b) = (build(), build());
    let permit = a.upstream("llm").expect("llm").request().acquire().await.expect("permit");
    permit.report(Outcome::from_status(429, None, SystemTime::now()).with_error_code("insufficient_quota"));
    // Another live change: the fleet is at version 2 (the spent quota told, then this).
    let version = a.upstream("llm").expect("llm").set_limit(3).await.expect("live limit");
    assert_eq!(version, 2);
    let started = Instant::now();
    while b.upstream("llm").expect("llm").status().await.expect("status").live_version < version {
        assert!(started.elapsed() < Duration::from_secs(2), "b never applied version 2");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(b.upstream("llm").expect("llm").status().await.expect("status").quota_exhausted_for.is_some());
    let mut con = redis.connection().expect("connection");
    redis::cmd("FLUSHALL").exec(&mut con).expect("FLUSHALL");
    // The operator resets as soon as the CLI knows the upstream again (its claim is renewed).
    let started = Instant::now();
    loop {
        let out = wavegate(&["reset-quota", "llm", "--redis", &url]);
        if out.status.success() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "{out:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reset = Instant::now();
    for scheduler in [&a, &b] {
        let llm = scheduler.upstream("llm").expect("llm");
        while let Some(left) = llm.status().await.expect("status").quota_exhausted_for {
            let version = llm.status().await.expect("status").live_version;
            assert!(
                reset.elapsed() < Duration::from_secs(2),
                "still refused for {left:?} {:?} after the reset (version {version})",
                reset.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    println!("the refusal lifted in both processes {:?} after the reset", reset.elapsed());
}

/// `set UPSTREAM --pool POOL=...`: a member taken out of a pool for the fleet (both schedulers
/// within a second), shown by `status`, then back as configured.
#[actix::test]
async fn set_takes_a_pool_member_out_for_the_fleet_and_back() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let build = || {
        let mut builder = Scheduler::builder().redis(url.clone());
        for key in ["key-a", "key-b"] {
            builder = builder.upstream(UpstreamConfig::builder(key).limit(4).build().expect("valid"));
        }
        let pool = wavegate::PoolConfig::builder("llm").member("key-a", 1).member("key-b", 2).build().expect("pool");
        builder.pool(pool).build().expect("scheduler")
    };
    let (a, b) = (build(), build());
    let in_force = |want: Vec<(&'static str, u32)>| {
        let (a, b) = (a.pool("llm").expect("llm"), b.pool("llm").expect("llm"));
        async move {
            let started = Instant::now();
            while a.members_in_force() != want || b.members_in_force() != want {
                assert!(started.elapsed() < Duration::from_secs(1), "not applied within 1 s: {want:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            started.elapsed()
        }
    };
    let out = wavegate(&["set", "key-a", "--pool", "llm=out", "--for", "10m", "--json", "--redis", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reply: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    println!("{reply}");
    assert_eq!(reply["live"]["pools"]["llm"]["weight"].as_u64(), Some(0), "{reply}");
    let took = in_force(vec![("key-b", 2)]).await;
    println!("both schedulers left key-a {took:?} after the tool returned");
    let text = wavegate(&["status", "--redis", &url]);
    let text = String::from_utf8_lossy(&text.stdout);
    println!("{text}");
    assert!(text.contains("live weight in pool llm out for"), "{text}");
    assert!(text.contains("wavegate set key-a --pool llm=configured"), "{text}");
    let said = wavegate(&["set", "key-a", "--pool", "llm=5", "--redis", &url]);
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(said.contains("key-a: weight in pool llm 5 until changed"), "{said}");
    in_force(vec![("key-a", 5), ("key-b", 2)]).await;
    assert!(wavegate(&["set", "key-a", "--pool", "llm=configured", "--redis", &url]).status.success());
    in_force(vec![("key-a", 1), ("key-b", 2)]).await;
    let bad = wavegate(&["set", "key-a", "--pool", "llm=1001", "--redis", &url]);
    assert_eq!(bad.status.code(), Some(2), "a usage error, before the store");
}

#[test]
fn a_claim_of_another_version_is_named_not_dropped() {
    let redis = RedisServer::start().expect("redis-server");
    // A process of an older build claimed `old` with fewer settings (before the day budgets).
    let mut settings = vec!["10"; 16];
    settings.push("fallback:-");
    let mut con = redis.connection().expect("connection");
    redis::cmd("SET").arg("wavegate:{old}:config").arg(settings.join("|")).exec(&mut con).expect("SET");
    let fleet = status(&redis.url());
    let unreadable = &fleet["unreadable_upstreams"][0];
    assert_eq!(unreadable["upstream"], "old", "{fleet}");
    assert_eq!(unreadable["claimed_settings"], 17);
    assert_eq!(unreadable["read_settings"], wavegate_redis::CLAIM_SETTINGS);
    assert_eq!(fleet["unknown_upstreams"].as_array().map(Vec::len), Some(0), "not 'no live process': {fleet}");
    let text = wavegate(&["status", "--redis", &redis.url()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("old: claimed by a process of another wavegate version (17 settings"), "{text}");
}
