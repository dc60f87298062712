//! The configuration from TOML and the environment (feature `config`): the example file in
//! `docs/` builds, the environment overrides it, and what cannot work is refused with the
//! builders' own messages.
//!
//! Run with `cargo test -p wavegate --features config --test settings` (CI does).
#![cfg(feature = "config")]

use std::time::Duration;

use wavegate::settings::{RateSetting, Settings, parse_duration};
use wavegate::{Mode, Scheduler};

const EXAMPLE: &str = include_str!("../docs/wavegate.example.toml");

#[test]
fn the_example_file_reads_and_every_key_reaches_the_configuration() {
    let settings = Settings::from_toml(EXAMPLE).expect("the example parses");
    assert_eq!(settings.redis.as_deref(), Some("redis://127.0.0.1:6379/"));
    assert_eq!(settings.redis_command_timeout, Some(Duration::from_millis(250)));
    let openai = &settings.upstreams["openai"];
    assert_eq!(openai.tokens_per_minute, Some(RateSetting { per_minute: 200_000, burst: 16_000 }));
    let config = openai.config("openai").expect("valid");
    assert_eq!(config.limit().get(), 10);
    assert_eq!(config.max_wait(), Duration::from_secs(25));
    assert_eq!(config.call_timeout(), Duration::from_secs(120));
    assert_eq!(config.total_timeout(), Duration::from_secs(150));
    assert!(config.retries_transient());
    assert!(config.renews_leases());
    assert_eq!(config.permit_ttl(), Duration::from_secs(3));
    assert_eq!(config.fallback_limit().map(|l| l.get()), Some(2));
    assert_eq!(config.queue_capacity().get(), 1024);
    let classes: Vec<_> =
        config.classes().iter().map(|c| (c.name(), c.weight_value().get(), c.reserve_percent_value())).collect();
    assert_eq!(classes, [("interactive", 3, 20), ("batch", 1, 0)]);
    assert_eq!(config.default_class(), 1);
    assert_eq!(config.budgets().tokens.map(|b| (b.per_minute(), b.burst())), Some((200_000, 16_000)));
    assert_eq!(config.budgets().requests.map(|b| (b.per_minute(), b.burst())), Some((500, 20)));
    assert_eq!(settings.upstreams["images"].config("images").expect("valid").limit().get(), 2);
}

#[tokio::test]
async fn the_environment_overrides_the_file_and_the_scheduler_builds() {
    let file = "[upstreams.llm]\nlimit = 10\nmax_wait = \"5s\"\n";
    let env = [
        ("WAVEGATE__UPSTREAMS__LLM__LIMIT", "4"),
        ("WAVEGATE__UPSTREAMS__LLM__TOKENS_PER_MINUTE__PER_MINUTE", "60000"),
        ("WAVEGATE__UPSTREAMS__LLM__TOKENS_PER_MINUTE__BURST", "1000"),
        ("WAVEGATE__UPSTREAMS__EMBED__LIMIT", "2"),
        ("WAVEGATE__UPSTREAMS__EMBED__RETRY_TRANSIENT", "false"),
        ("PATH", "/usr/bin"), // not ours: ignored
    ];
    let settings = Settings::from_sources(Some(file), env).expect("settings");
    let scheduler: Scheduler = settings.builder().expect("valid").build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    assert_eq!(llm.config().limit().get(), 4, "the environment wins");
    assert_eq!(llm.config().max_wait(), Duration::from_secs(5), "the file's value stays");
    assert_eq!(llm.config().budgets().tokens.map(|b| b.burst()), Some(1_000));
    let embed = scheduler.upstream("embed").expect("from the environment alone");
    assert_eq!(embed.config().limit().get(), 2);
    assert!(!embed.config().retries_transient(), "not safe to repeat, from the environment");
    assert!(llm.config().retries_transient(), "retried by default");
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Local);
}

#[test]
fn what_cannot_work_is_refused_with_the_builders_messages() {
    // The builder's own check and message.
    let in_code = wavegate::UpstreamConfig::builder("llm").limit(0).build().expect_err("limit 0").to_string();
    let from_file =
        Settings::from_toml("[upstreams.llm]\nlimit = 0\n").expect("parses").builder().expect_err("refused");
    assert!(from_file.to_string().contains(&in_code), "{from_file} vs {in_code}");
    let from_env = Settings::from_sources(None, [("WAVEGATE__UPSTREAMS__LLM__LIMIT", "0")]).expect("parses");
    assert_eq!(from_env.builder().expect_err("refused").to_string(), from_file.to_string());
    // Unknown keys, wrong types and bad durations name what is wrong.
    let unknown = Settings::from_toml("[upstreams.llm]\nlimt = 3\n").expect_err("a typo").to_string();
    assert!(unknown.contains("limt"), "{unknown}");
    let typed = Settings::from_sources(None, [("WAVEGATE__UPSTREAMS__LLM__LIMIT", "ten")]).expect_err("not a number");
    assert!(typed.to_string().contains("limit"), "{typed}");
    let duration = Settings::from_toml("[upstreams.llm]\nmax_wait = \"5 parsecs\"\n").expect_err("no such unit");
    assert!(duration.to_string().contains("parsecs"), "{duration}");
    let shape = Settings::from_sources(Some("redis = \"redis://x/\"\n"), [("WAVEGATE__REDIS__URL", "y")]);
    assert!(shape.expect_err("redis is a string, not a table").to_string().contains("WAVEGATE__REDIS__URL"));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
    assert!(parse_duration("").is_err() && parse_duration("1.5s").is_err());
}

#[cfg(feature = "redis")]
#[actix::test]
async fn the_key_prefix_and_sentinel_come_from_the_file_and_the_environment() {
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let file = format!("redis = \"{}\"\nredis_prefix = \"billing\"\n[upstreams.llm]\nlimit = 2\n", redis.url());
    let settings = Settings::from_sources(Some(&file), std::iter::empty::<(&str, &str)>()).expect("settings");
    assert_eq!(settings.redis_prefix.as_deref(), Some("billing"));
    let scheduler = settings.builder().expect("builder").build().expect("scheduler");
    assert_eq!(scheduler.store_health().expect("a store").key_prefix, "billing");

    let env = [
        ("WAVEGATE__REDIS_SENTINEL__MASTER", "mymaster"),
        ("WAVEGATE__REDIS_SENTINEL__SENTINELS", "10.0.0.1:26379, 10.0.0.2:26379"),
    ];
    let settings = Settings::from_sources(None, env).expect("settings");
    let sentinel = settings.redis_sentinel.expect("sentinel settings");
    assert_eq!(sentinel.master, "mymaster");
    assert_eq!(sentinel.sentinels.to_vec(), ["10.0.0.1:26379", "10.0.0.2:26379"]);
    let listed =
        Settings::from_toml("[redis_sentinel]\nmaster = \"m\"\nsentinels = [\"a:1\", \"b:2\"]\n").expect("toml");
    assert_eq!(listed.redis_sentinel.expect("sentinel").sentinels.to_vec(), ["a:1", "b:2"]);
}

#[cfg(not(feature = "redis"))]
#[test]
fn a_redis_url_in_a_local_only_build_is_refused_with_what_to_change() {
    use wavegate::BuildError;
    let settings =
        Settings::from_toml("redis = \"redis://127.0.0.1:6390/\"\n[upstreams.llm]\nlimit = 2\n").expect("parses");
    let refused = settings.builder().expect_err("no redis in this build");
    assert!(
        matches!(refused, BuildError::RedisNotBuilt { ref url } if url == "redis://127.0.0.1:6390/"),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("`redis` feature"), "{refused}");
    // Without the URL the same settings run in local mode.
    assert!(Settings::from_toml("[upstreams.llm]\nlimit = 2\n").expect("parses").builder().is_ok());
}

#[test]
fn the_day_budgets_are_read_from_toml() {
    let settings = Settings::from_toml(
        r#"
        [upstreams.groq]
        limit = 20
        requests_per_day = { per_day = 14400 }
        tokens_per_day = { per_day = 500000, burst = 20000 }
        "#,
    )
    .expect("settings");
    let config = settings.upstreams["groq"].config("groq").expect("config");
    let day = config.budgets();
    assert_eq!(day.requests_per_day.map(|b| (b.per_day(), b.burst())), Some((14_400, 14_400)));
    assert_eq!(day.tokens_per_day.map(|b| (b.per_day(), b.burst())), Some((500_000, 20_000)));
    // A burst above the day is refused, saying what to change.
    let bad = Settings::from_toml("[upstreams.groq]\nrequests_per_day = { per_day = 10, burst = 11 }\n")
        .expect("settings")
        .builder()
        .expect_err("a burst above the day");
    assert!(bad.to_string().contains("requests_per_day"), "{bad}");
}
