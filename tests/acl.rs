//! Redis that answers but rejects wavegate — a wrong password, an ACL user without a right the
//! scripts need, a server too old — and the minimal ACL user of `docs/redis.md`; the key
//! prefix, and two applications that configure one upstream differently.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use wavegate::{BuildError, Mode, Rejection, Scheduler, StoreConfig, UpstreamConfig};
use wavegate_testkit::RedisServer;

mod common;
use common::wait_for_mode;

/// The minimal user as `docs/redis.md` documents it (the rules after `ACL SETUSER wavegate
/// on >secret`, for the default prefix), read from the document itself so the two cannot drift.
fn minimal_user() -> String {
    let doc = include_str!("../docs/redis.md");
    let start = doc.find("ACL SETUSER wavegate on >secret ").expect("docs/redis.md documents the user");
    let block = &doc[start..];
    let block = &block[..block.find("```").expect("the user's code block ends")];
    let rules = block.split_whitespace().skip(4).collect::<Vec<_>>().join(" ");
    format!("on {rules} ")
}

fn upstream(name: &str, limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder(name)
        .limit(limit)
        .renewed_lease(Duration::from_secs(3))
        .max_wait(Duration::from_secs(5))
        .build()
        .expect("valid config")
}

/// Creates (or changes) ACL user `name` with password `password` and `rules`.
fn set_user(redis: &RedisServer, name: &str, password: &str, rules: &str) {
    let mut con = redis.connection().expect("connection");
    let mut command = redis::cmd("ACL");
    command.arg("SETUSER").arg(name).arg("reset").arg(format!(">{password}"));
    for rule in rules.split_whitespace() {
        command.arg(rule);
    }
    command.exec(&mut con).expect("ACL SETUSER");
}

fn url(redis: &RedisServer, user: &str, password: &str) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{}/", redis.port())
}

fn rejection(result: Result<Scheduler, BuildError>) -> (Rejection, String) {
    match result {
        Err(BuildError::Rejected(error)) => (error.rejection().expect("a rejection"), error.to_string()),
        Err(other) => panic!("expected a rejection, got {other}"),
        Ok(_) => panic!("expected a rejection, the scheduler was built"),
    }
}

#[actix::test]
async fn a_wrong_password_fails_build_with_its_own_error() {
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "right", &minimal_user());
    let built = Scheduler::builder().upstream(upstream("llm", 4)).redis(url(&redis, "app", "wrong")).build();
    let (reason, message) = rejection(built);
    println!("{message}");
    assert_eq!(reason, Rejection::Authentication);
    assert!(message.contains("password"), "the message should say what to check: {message}");
}

#[actix::test]
async fn a_user_without_a_right_the_scripts_need_fails_build() {
    let redis = RedisServer::start().expect("redis-server");
    // Each misses one thing: a command inside the scripts, the key pattern, the channels.
    let cases = [
        ("no_zadd", minimal_user().replace("+zadd ", "")),
        ("no_hset", minimal_user().replace("+hset ", "")),
        ("other_keys", minimal_user().replace("~wavegate:", "~other:")),
        ("no_script_load", minimal_user().replace("+script|load ", "")),
    ];
    for (user, rules) in cases {
        set_user(&redis, user, "pw", &rules);
        println!("{user}:");
        let built = Scheduler::builder().upstream(upstream("llm", 4)).redis(url(&redis, user, "pw")).build();
        let (reason, message) = rejection(built);
        println!("  {message}");
        assert_eq!(reason, Rejection::Permission, "{user}: {message}");
        assert!(message.contains("docs/redis.md"), "{message}");
    }
}

#[actix::test]
async fn a_user_without_channel_rights_is_only_warned_about() {
    // The scripts publish with `pcall` and waiters poll too: wavegate works, only slower to
    // wake another process (tests/switches.rs checks the release still wakes a local waiter).
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "pw", &minimal_user().replace("&wavegate:", "&other:"));
    let scheduler =
        Scheduler::builder().upstream(upstream("llm", 4)).redis(url(&redis, "app", "pw")).build().expect("built");
    scheduler.upstream("llm").expect("configured").request().acquire().await.expect("permit").succeeded();
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared);
    assert_eq!(scheduler.store_health().expect("a store").rejected, None);
}

#[actix::test]
async fn the_minimal_user_of_the_docs_can_do_everything() {
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "pw", &minimal_user());
    let scheduler = Scheduler::builder()
        .upstream(upstream("llm", 1))
        .redis(url(&redis, "app", "pw"))
        .build()
        .expect("the minimal user passes the startup check");
    let llm = scheduler.upstream("llm").expect("configured");
    let health = scheduler.store_health().expect("a store");
    assert_eq!(health.rejected, None);
    assert!(health.server.as_deref().is_some_and(|s| s.starts_with("redis 7")), "{:?}", health.server);
    // Permits, a waiter woken by a release (pub/sub), renewals and heartbeats, statuses.
    let first = llm.request().acquire().await.expect("permit");
    let waiter = {
        let llm = llm.clone();
        actix::spawn(async move { llm.request().acquire().await.map(|p| p.succeeded()) })
    };
    tokio::time::sleep(Duration::from_millis(1_200)).await; // a renewal and a heartbeat run
    first.succeeded();
    waiter.await.expect("task").expect("the waiter gets the permit");
    let status = llm.status().await.expect("status");
    assert_eq!(status.in_flight_fleet, Some(0));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared);
    assert_eq!(scheduler.store_health().expect("a store").rejected, None);
    // The log of the server would show NOPERM otherwise; the ACL log does.
    let mut con = redis.connection().expect("connection");
    let denied: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut con).expect("ACL LOG");
    assert!(denied.is_empty(), "the minimal user was denied something: {denied:?}");
}

#[actix::test]
async fn a_password_changed_at_runtime_shows_as_rejected_and_fails_open() {
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "pw", &minimal_user());
    let scheduler =
        Scheduler::builder().upstream(upstream("llm", 4)).redis(url(&redis, "app", "pw")).build().expect("scheduler");
    scheduler.upstream("llm").expect("configured").request().acquire().await.expect("permit").succeeded();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The password is rotated and the app's connections dropped: every reconnect fails.
    set_user(&redis, "app", "rotated", &minimal_user());
    let mut con = redis.connection().expect("connection");
    redis::cmd("CLIENT").arg("KILL").arg("USER").arg("app").exec(&mut con).expect("CLIENT KILL");
    let permit = scheduler.upstream("llm").expect("configured").request().acquire().await.expect("calls fail open");
    permit.succeeded();
    wait_for_mode(&scheduler, Mode::Rejected, Duration::from_secs(3)).await;
    let health = scheduler.store_health().expect("a store");
    let (reason, words) = health.rejected.expect("the rejection is shown");
    println!("rejected: {reason}: {words}");
    assert_eq!(reason, Rejection::Authentication);
    assert_eq!(scheduler.upstream("llm").expect("configured").status().await.expect("status").mode, Mode::Rejected);

    // Fixed: the probe finds the store again and the process shares again.
    set_user(&redis, "app", "pw", &minimal_user());
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    assert_eq!(scheduler.store_health().expect("a store").rejected, None);
}

#[actix::test]
async fn the_key_prefix_is_configured_and_shown() {
    let redis = RedisServer::start().expect("redis-server");
    let scheduler = Scheduler::builder()
        .redis(redis.url())
        .key_prefix("billing")
        .upstream(upstream("llm", 4))
        .build()
        .expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    assert_eq!(scheduler.store_health().expect("a store").key_prefix, "billing");
    let _permit = llm.request().acquire().await.expect("permit");
    let mut con = redis.connection().expect("connection");
    let held: usize = redis::cmd("ZCARD").arg("billing:{llm}:permits").query(&mut con).expect("ZCARD");
    let default: usize = redis::cmd("EXISTS").arg("wavegate:{llm}:permits").query(&mut con).expect("EXISTS");
    assert_eq!((held, default), (1, 0));
}

#[actix::test]
async fn another_configuration_of_the_same_upstream_is_reported() {
    let redis = RedisServer::start().expect("redis-server");
    let first = Scheduler::builder().upstream(upstream("llm", 4)).redis(redis.url()).build().expect("first app");
    assert!(first.store_health().expect("a store").config_conflicts.is_empty());
    // The same name and prefix with another limit: the second sees the first's configuration.
    let second = Scheduler::builder().upstream(upstream("llm", 8)).redis(redis.url()).build().expect("second app");
    let conflicts = second.store_health().expect("a store").config_conflicts;
    println!("{conflicts:?}");
    assert!(conflicts.get("llm").is_some_and(|theirs| theirs.starts_with("4|")), "{conflicts:?}");
    // The same configuration again, or another prefix: no conflict.
    let third = Scheduler::builder().upstream(upstream("llm", 8)).redis(redis.url()).build().expect("third");
    assert!(third.store_health().expect("a store").config_conflicts.is_empty());
    let mut config = StoreConfig::new(redis.url());
    config.keyspace = wavegate::Keyspace::new("other-app");
    let fourth = Scheduler::builder().upstream(upstream("llm", 2)).store(config).build().expect("fourth");
    assert!(fourth.store_health().expect("a store").config_conflicts.is_empty());
}

/// A fake server that says it is Redis `version` to `HELLO` and OK to anything else.
fn fake_redis(version: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || serve_fake(stream, version));
        }
    });
    port
}

fn serve_fake(stream: std::net::TcpStream, version: &str) {
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let Some(count) = line.trim().strip_prefix('*').and_then(|n| n.parse::<usize>().ok()) else { return };
        let mut words = Vec::new();
        for _ in 0..count {
            line.clear();
            reader.read_line(&mut line).expect("length");
            let len: usize = line.trim().trim_start_matches('$').parse().expect("bulk length");
            let mut word = vec![0; len + 2];
            reader.read_exact(&mut word).expect("bulk");
            words.push(String::from_utf8_lossy(&word[..len]).to_uppercase());
        }
        let reply = if words.first().is_some_and(|w| w == "HELLO") {
            format!("*4\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n${}\r\n{version}\r\n", version.len())
        } else {
            "+OK\r\n".to_owned()
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[actix::test]
async fn a_redis_older_than_6_2_is_refused_with_a_message() {
    let port = fake_redis("6.0.16");
    let built = Scheduler::builder().upstream(upstream("llm", 4)).redis(format!("redis://127.0.0.1:{port}/")).build();
    let (reason, message) = rejection(built);
    println!("{message}");
    assert_eq!(reason, Rejection::Version);
    assert!(message.contains("6.0.16") && message.contains("6.2"), "{message}");
}

#[cfg(not(feature = "tls"))]
#[actix::test]
async fn a_rediss_url_without_the_tls_feature_fails_build() {
    let built = Scheduler::builder().upstream(upstream("llm", 4)).redis("rediss://127.0.0.1:1/").build();
    let message = built.err().map(|e| e.to_string()).unwrap_or_default();
    println!("{message}");
    assert!(message.to_lowercase().contains("tls"), "the error should name TLS: {message:?}");
}

/// Counts the error events whose message starts with `prefix` (on the thread it is set on).
struct ErrorCounter {
    prefix: &'static str,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl tracing::Subscriber for ErrorCounter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::ERROR {
            let mut message = Message(String::new());
            event.record(&mut message);
            if message.0.starts_with(self.prefix) {
                self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[actix::test]
async fn a_lasting_rejection_is_logged_as_an_error_every_10_s() {
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = ErrorCounter { prefix: "the shared store rejects wavegate", count: count.clone() };
    let _guard = tracing::subscriber::set_default(counter);
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "pw", &minimal_user());
    let scheduler =
        Scheduler::builder().upstream(upstream("llm", 4)).redis(url(&redis, "app", "pw")).build().expect("scheduler");
    scheduler.upstream("llm").expect("configured").request().acquire().await.expect("permit").succeeded();
    set_user(&redis, "app", "rotated", &minimal_user());
    let mut con = redis.connection().expect("connection");
    redis::cmd("CLIENT").arg("KILL").arg("USER").arg("app").exec(&mut con).expect("CLIENT KILL");
    scheduler.upstream("llm").expect("configured").request().acquire().await.expect("calls fail open").succeeded();
    wait_for_mode(&scheduler, Mode::Rejected, Duration::from_secs(3)).await;
    // The probe is refused about once a second (after a 100 ms, 200 ms … backoff): logged at
    // the first refusal, then at the first one 10 s later; the third would come after 20 s.
    tokio::time::sleep(Duration::from_millis(12_000)).await;
    let logged = count.load(std::sync::atomic::Ordering::SeqCst);
    println!("{logged} error logs of the rejection in 12 s");
    assert_eq!(logged, 2, "once at the start and once after 10 s, not at every probe");
}

/// An upstream with everything a process configures per upstream that the fleet shares:
/// budgets, priority classes (one capped), a fallback limit.
fn classed_upstream(name: &str) -> UpstreamConfig {
    UpstreamConfig::builder(name)
        .limit(4)
        .renewed_lease(Duration::from_secs(3))
        .max_wait(Duration::from_secs(5))
        .requests_per_minute(6_000, 100)
        .tokens_per_minute(600_000, 20_000)
        .class("interactive", 3)
        .class("batch", 1)
        .class_budget("batch", 50)
        .fallback_limit(2)
        .build()
        .expect("valid config")
}

#[actix::test]
async fn identical_configurations_with_classes_never_conflict() {
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = ErrorCounter { prefix: "another process shares this upstream's keys", count: count.clone() };
    let _guard = tracing::subscriber::set_default(counter);
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(classed_upstream("llm")).redis(redis.url()).build().expect("built");
    // One alone, then a second identical one: neither sees a conflict, at the start (the
    // startup check's claim) nor at the engine's claims every 10 s.
    let first = build();
    let second = build();
    for scheduler in [&first, &second] {
        let llm = scheduler.upstream("llm").expect("configured");
        llm.request().priority("batch").tokens(10).acquire().await.expect("permit").succeeded();
    }
    tokio::time::sleep(Duration::from_millis(10_700)).await;
    for scheduler in [&first, &second] {
        let conflicts = scheduler.store_health().expect("a store").config_conflicts;
        assert!(conflicts.is_empty(), "an identical configuration seen as another: {conflicts:?}");
    }
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 0, "a false conflict was logged");
    // Another configuration of the classes (a weight) is a conflict.
    let other = UpstreamConfig::builder("llm")
        .limit(4)
        .renewed_lease(Duration::from_secs(3))
        .requests_per_minute(6_000, 100)
        .tokens_per_minute(600_000, 20_000)
        .class("interactive", 5)
        .class("batch", 1)
        .class_budget("batch", 50)
        .fallback_limit(2)
        .build()
        .expect("valid config");
    let third = Scheduler::builder().upstream(other).redis(redis.url()).build().expect("built");
    let conflicts = third.store_health().expect("a store").config_conflicts;
    assert!(conflicts.get("llm").is_some_and(|theirs| theirs.contains("interactive:3")), "{conflicts:?}");
    // And so is another fallback limit.
    let mut config = StoreConfig::new(redis.url());
    config.keyspace = wavegate::Keyspace::new("fallback-app");
    let plain =
        |fallback: u32| UpstreamConfig::builder("llm").limit(4).fallback_limit(fallback).build().expect("valid config");
    Scheduler::builder().upstream(plain(2)).store(config.clone()).build().expect("built");
    let fourth = Scheduler::builder().upstream(plain(3)).store(config).build().expect("built");
    assert!(fourth.store_health().expect("a store").config_conflicts.contains_key("llm"), "fallback limits differ");
}

/// The command names the rule allows (`+x`, `+x|sub`), lowercased.
fn allowed_commands(rules: &str) -> std::collections::BTreeSet<String> {
    rules.split_whitespace().filter_map(|rule| rule.strip_prefix('+')).map(str::to_lowercase).collect()
}

/// Every command a Lua source runs (`redis.call('X', …)` or `redis.pcall('X', …)`), lowercased.
/// A call whose command is not a quoted literal could not be checked: it fails the test.
fn script_commands(file: &str, source: &str) -> Vec<String> {
    let mut commands = Vec::new();
    for (at, _) in source.match_indices("redis.") {
        let rest = &source[at + "redis.".len()..];
        let Some(rest) = rest.strip_prefix("call(").or_else(|| rest.strip_prefix("pcall(")) else { continue };
        let rest = rest.trim_start();
        let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"');
        let quote = quote.unwrap_or_else(|| panic!("{file}: a redis call whose command is not a literal: {rest:.40}"));
        let name = &rest[1..rest[1..].find(quote).expect("a closing quote") + 1];
        commands.push(name.to_lowercase());
    }
    commands
}

/// Every command the scripts of `lua/` run (the files concatenated into them too), with the
/// first file that runs it.
fn lua_commands() -> std::collections::BTreeMap<String, String> {
    let mut used = std::collections::BTreeMap::<String, String>::new();
    let lua = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
    for entry in std::fs::read_dir(&lua).expect("lua/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "lua") {
            let file = path.file_name().expect("a name").to_string_lossy().into_owned();
            let source = std::fs::read_to_string(&path).expect("readable");
            for command in script_commands(&file, &source) {
                used.entry(command).or_insert(file.clone());
            }
        }
    }
    used
}

#[test]
fn the_documented_user_allows_every_command_wavegate_sends_and_no_other() {
    let allowed = allowed_commands(&minimal_user());
    let mut used = lua_commands();
    assert!(used.contains_key("zmscore") && used.contains_key("publish"), "the scripts were not read: {used:?}");
    // The commands the store sends itself (`redis::cmd("X")` outside its tests; SENTINEL goes
    // to the sentinels, which have no ACL user here).
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/wavegate-redis/src");
    for entry in std::fs::read_dir(&src).expect("crates/wavegate-redis/src") {
        let path = entry.expect("entry").path();
        let file = path.file_name().expect("a name").to_string_lossy().into_owned();
        if file == "agreement.rs" {
            continue; // a test module
        }
        let source = std::fs::read_to_string(&path).expect("readable");
        let code = source.split("#[cfg(test)]").next().unwrap_or("");
        for (at, _) in code.match_indices("redis::cmd(\"") {
            let rest = &code[at + "redis::cmd(\"".len()..];
            let name = rest[..rest.find('"').expect("a closing quote")].to_lowercase();
            if name != "sentinel" {
                used.entry(name).or_insert(file.clone());
            }
        }
    }
    // What redis-rs sends for us: scripts by SHA (loaded on NOSCRIPT), the release listener.
    for command in ["evalsha", "script|load", "subscribe"] {
        used.entry(command.to_owned()).or_insert_with(|| "redis-rs".to_owned());
    }
    let missing: Vec<String> =
        used.iter().filter(|(c, _)| !allowed.contains(*c)).map(|(c, f)| format!("{c} (sent by {f})")).collect();
    assert!(missing.is_empty(), "docs/redis.md's minimal user lacks {missing:?}");
    let unused: Vec<&String> = allowed.iter().filter(|c| !used.contains_key(*c)).collect();
    assert!(unused.is_empty(), "docs/redis.md's minimal user allows what nothing sends: {unused:?}");
}

#[actix::test]
async fn the_documented_key_and_channel_patterns_cover_one_prefix_and_not_the_ones_nested_in_it() {
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "pw", &minimal_user());
    let mut con = redis.connection().expect("connection");
    let mut dry_run = |args: &[&str]| -> bool {
        let reply: redis::Value =
            redis::cmd("ACL").arg("DRYRUN").arg("app").arg(args).query(&mut con).expect("ACL DRYRUN");
        matches!(reply, redis::Value::Okay) || matches!(&reply, redis::Value::SimpleString(s) if s == "OK")
    };
    let name = wavegate::config::UpstreamName::new("llm").expect("name");
    for (prefix, allowed) in [("wavegate", true), ("wavegate:other", false), ("wavegate-other", false)] {
        let keyspace = wavegate::Keyspace::new(prefix);
        let keys = keyspace.upstream(&name);
        let mut every = vec![keyspace.instances(), keys.config.clone()];
        every.extend(keys.finish_script_keys().iter().map(|k| (*k).to_owned()));
        for key in &every {
            assert_eq!(dry_run(&["HGET", key, "x"]), allowed, "key {key}");
        }
        let channel = keys.wake_channel("4242-0123abcd");
        assert_eq!(dry_run(&["PUBLISH", &channel, "x"]), allowed, "channel {channel}");
    }
}

#[actix::test]
async fn a_user_without_any_one_command_of_the_scripts_fails_build() {
    // Each command any script runs, removed in turn: build() finds it missing, whatever path
    // runs it (the classes' choice, a tenant, a budget, a provider's window, a wake-up), even
    // for an upstream without classes. It used to be found only under load (34–38 changes of
    // mode in 11 s, shared ↔ rejected, for zcount, zmscore and zrange).
    let redis = RedisServer::start().expect("redis-server");
    for (command, file) in lua_commands() {
        if command == "publish" {
            continue; // only announces a release, with `pcall`: a warning (see above)
        }
        let user = format!("no_{}", command.replace('|', "_"));
        set_user(&redis, &user, "pw", &minimal_user().replace(&format!("+{command} "), ""));
        let built = Scheduler::builder().upstream(upstream("llm", 4)).redis(url(&redis, &user, "pw")).build();
        let (reason, message) = match built {
            Err(BuildError::Rejected(error)) => (error.rejection(), error.to_string()),
            Err(other) => panic!("{command} ({file}): expected a rejection, got {other}"),
            Ok(_) => panic!("{command} ({file}): the scheduler was built without it"),
        };
        println!("{command}: {message}");
        assert_eq!(reason, Some(Rejection::Permission), "{command}: {message}");
        assert!(message.contains(&format!("+{command}")), "the message should say what to add: {message}");
    }
}

#[actix::test]
async fn the_minimal_user_runs_classes_tenants_budgets_and_windows_under_load() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Instant, SystemTime};
    use wavegate::{Outcome, ProviderSignals};
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "pw", &minimal_user());
    let config = || {
        UpstreamConfig::builder("llm")
            .limit(4)
            .renewed_lease(Duration::from_secs(3))
            .max_wait(Duration::from_secs(10))
            .requests_per_minute(60_000, 200)
            .tokens_per_minute(3_000_000, 20_000)
            .class("interactive", 3)
            .class("batch", 1)
            .class_budget("batch", 50)
            .build()
            .expect("valid config")
    };
    // Two processes' schedulers, each with four callers of both classes and three tenants.
    let schedulers: Vec<Scheduler> = (0..2)
        .map(|_| Scheduler::builder().upstream(config()).redis(url(&redis, "app", "pw")).build().expect("built"))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for (s, scheduler) in schedulers.iter().enumerate() {
        for caller in 0..4usize {
            let llm = scheduler.upstream("llm").expect("configured");
            let (stop, calls, failed) = (stop.clone(), calls.clone(), failed.clone());
            tasks.push(actix::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let class = if (caller + n).is_multiple_of(2) { "interactive" } else { "batch" };
                    let tenant = format!("tenant-{}", (s + caller + n) % 3);
                    match llm.request().priority(class).tenant(tenant).tokens(100).acquire().await {
                        Ok(permit) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            // The provider says what is left of its windows, and its limits.
                            let headers = [
                                ("x-ratelimit-limit-requests", "100000"),
                                ("x-ratelimit-remaining-requests", "99000"),
                                ("x-ratelimit-reset-requests", "1s"),
                                ("x-ratelimit-limit-tokens", "10000000"),
                                ("x-ratelimit-remaining-tokens", "9900000"),
                                ("x-ratelimit-reset-tokens", "1s"),
                            ];
                            let signals = ProviderSignals::from_headers(
                                headers.iter().map(|(name, value)| (*name, value.as_bytes())),
                                SystemTime::now(),
                            );
                            permit.report_usage(Outcome::from_signals(200, None, signals), 80);
                            calls.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(error) => {
                            println!("failed: {error}");
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
        }
    }
    // Every 20 ms for 8 s: each scheduler's mode.
    let (started, mut changes, mut samples) = (Instant::now(), 0, 0);
    let mut last = vec![Mode::Shared; schedulers.len()];
    while started.elapsed() < Duration::from_secs(8) {
        for (s, scheduler) in schedulers.iter().enumerate() {
            let mode = scheduler.mode().await.expect("mode");
            if mode != last[s] {
                changes += 1;
                println!("scheduler {s}: {} -> {mode} at {:?}", last[s], started.elapsed());
                last[s] = mode;
            }
            samples += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("caller");
    }
    let (calls, failed) = (calls.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    println!("{calls} calls, {failed} failed, {changes} changes of mode in {samples} samples");
    let mut con = redis.connection().expect("connection");
    let denied: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut con).expect("ACL LOG");
    assert!(denied.is_empty(), "the minimal user was denied something: {denied:?}");
    assert_eq!(changes, 0, "the mode changed under load");
    assert_eq!(failed, 0, "calls failed");
    assert!(calls > 100, "too few calls to say anything: {calls}");
    for scheduler in &schedulers {
        let health = scheduler.store_health().expect("a store");
        assert_eq!((health.rejected, health.config_conflicts.len()), (None, 0));
        let status = scheduler.upstream("llm").expect("configured").status().await.expect("status");
        assert!(status.learned.requests.is_some(), "the provider's limits were kept: {:?}", status.learned);
    }
}

/// The modes the live processes told with their heartbeats (`mode:<instance>|<mode>` members
/// of the instances set), read as an operator's `wavegate status` reads them.
fn told_modes(redis: &RedisServer) -> Vec<String> {
    let mut con = redis.connection().expect("connection");
    let instances = StoreConfig::new(redis.url()).keyspace.instances();
    let members: Vec<String> = redis::cmd("ZRANGE").arg(&instances).arg(0).arg(-1).query(&mut con).expect("ZRANGE");
    members
        .iter()
        .filter_map(|m| m.strip_prefix("mode:"))
        .filter_map(|m| m.split_once('|'))
        .map(|(_, mode)| mode.to_owned())
        .collect()
}

#[actix::test]
async fn a_process_whose_rights_were_cut_does_not_go_on_telling_it_shares() {
    // The upstream's keys are taken from the user at runtime; the instances key is left, so
    // the probe's heartbeat still counts this process live. What it tells the fleet must say
    // it is not sharing (`rejected` or `fallback`), not the `shared` of its last heartbeat in shared mode.
    let redis = RedisServer::start().expect("redis-server");
    set_user(&redis, "app", "pw", &minimal_user());
    let scheduler =
        Scheduler::builder().upstream(upstream("llm", 4)).redis(url(&redis, "app", "pw")).build().expect("scheduler");
    scheduler.upstream("llm").expect("configured").request().acquire().await.expect("permit").succeeded();
    let started = std::time::Instant::now();
    while told_modes(&redis) != ["shared"] {
        assert!(started.elapsed() < Duration::from_secs(3), "no heartbeat told shared: {:?}", told_modes(&redis));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cut = minimal_user().replace("~wavegate:{*}:* ", "");
    set_user(&redis, "app", "pw", &cut);
    let mut con = redis.connection().expect("connection");
    redis::cmd("CLIENT").arg("KILL").arg("USER").arg("app").exec(&mut con).expect("CLIENT KILL");
    scheduler.upstream("llm").expect("configured").request().acquire().await.expect("calls fail open").succeeded();
    wait_for_mode(&scheduler, Mode::Rejected, Duration::from_secs(3)).await;
    let rejected = std::time::Instant::now();
    loop {
        let modes = told_modes(&redis);
        if !modes.is_empty() && modes.iter().all(|mode| mode != "shared") {
            break;
        }
        assert!(rejected.elapsed() < Duration::from_secs(5), "still told as sharing while rejected: {modes:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Fallback (the rejection is cleared by each probe's own successful heartbeat, so either
    // word may be the one told last).
    let modes = told_modes(&redis);
    assert!(modes.iter().all(|m| m.starts_with("rejected") || m.starts_with("fallback")), "{modes:?}");
}
