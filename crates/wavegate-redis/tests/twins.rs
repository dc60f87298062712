//! The two wave machines — `WaveMachine` (Rust, local mode) and `lua/wave.lua` (shared mode) —
//! agree state for state on random sequences: admissions, successes, 429s (current and late),
//! the passage of time. The Lua functions are the ones the scripts use, run on a real
//! redis-server with explicit times, the state saved to and read back from a Redis hash after
//! every step (so the storage is checked too). Every recovery, every field of the state.
//!
//! The test also proves it can fail: one-line mutants of `wave.lua` must be caught.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use wavegate_core::{Admission, RateLimitEffect, Recovery, UpstreamConfig, WaveConfig, WaveMachine, WaveSnapshot};
use wavegate_testkit::RedisServer;

/// Runs a sequence of steps through wave.lua's machine. ARGV: the CONFIG_ARGS config entries, then
/// per step: op, time advance (ms), wave lag (0: the current wave), in-flight selector, value.
const DRIVER: &str = r#"
local config = read_config(1)
redis.call('DEL', KEYS[2])
local s = fresh_state(config)
local now = 1764000000000
local out = {}
local function in_flight(selector, value)
  if selector == 0 then return s.limit elseif selector == 1 then return s.limit + 1
  elseif selector == 2 then return math.floor(s.limit / 2) else return value end
end
for i = CONFIG_ARGS + 1, #ARGV, 5 do
  local op, advance = ARGV[i], tonumber(ARGV[i + 1])
  local lag, selector, value = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  now = now + advance
  local tag = math.max(s.wave - lag, 0)
  local answer
  local held = in_flight(selector, value)
  if op == 'admit' then
    poll(s, now)
    local denial, wait = wave_denial(s, now, held)
    if denial then answer = 'denied ' .. denial .. ' ' .. wait else answer = 'granted ' .. s.wave end
  elseif op == 'success' then
    local changed = on_success(s, tag, held, now, config)
    answer = 'success ' .. tostring(changed ~= nil)
  elseif op == 'limited' then
    local retry_after = nil
    if value >= 0 then retry_after = value end
    local effect = on_rate_limited(s, tag, now, retry_after, config)
    local cooldown = 0
    if effect == 'cut' and s.state == 'COOLDOWN' then cooldown = s.cooldown_until - now end
    answer = effect .. ' ' .. cooldown
  else
    answer = 'poll ' .. tostring(poll(s, now))
  end
  save_state(s, config)
  s = load_state(config, now)
  table.insert(out, string.format('%s | %s %d %d %.0f %d %d %d %d %d %.0f %.0f %d %d %s', answer, s.state,
    s.limit, s.wave, s.cooldown_until - 1764000000000, s.successes, s.step, s.threshold, s.ceiling, s.good,
    s.retest_at - 1764000000000, s.spacing, s.rounds, s.retest_rounds, tostring(s.on_trial)))
end
return out
"#;

const EPOCH_MS: u64 = 1_764_000_000_000;

#[derive(Debug, Clone, Copy)]
enum Op {
    Admit,
    Success,
    Limited,
    Poll,
}

#[derive(Debug, Clone, Copy)]
struct StepIn {
    op: Op,
    advance_ms: u64,
    lag: u64,
    selector: u32,
    /// The in-flight count for selector 3; the Retry-After in ms for a 429 (-1: none).
    value: i64,
}

fn step() -> impl Strategy<Value = StepIn> {
    let op = prop_oneof![3 => Just(Op::Admit), 8 => Just(Op::Success), 2 => Just(Op::Limited), 1 => Just(Op::Poll)];
    let advance = prop_oneof![6 => Just(0u64), 3 => 0u64..50, 2 => 0u64..3_000];
    let lag = prop_oneof![8 => Just(0u64), 1 => 1u64..3];
    (op, advance, lag, 0u32..4, -1i64..20).prop_map(|(op, advance_ms, lag, selector, value)| {
        let value = match op {
            Op::Limited if value >= 0 => value * 150,
            _ => value,
        };
        StepIn { op, advance_ms, lag, selector, value }
    })
}

fn config() -> impl Strategy<Value = WaveConfig> {
    (
        1u32..17,
        1u32..4,
        proptest::collection::vec(1u64..3_000, 1..5),
        1u64..200,
        prop_oneof![Just(Recovery::Adaptive), Just(Recovery::Seed)],
        1u64..1_500,
        1u64..8,
        1u32..40,
    )
        .prop_map(|(base, probe, ladder, min, recovery, retest_after, factor, rounds_max)| {
            let ladder: Vec<Duration> = ladder.into_iter().map(Duration::from_millis).collect();
            let max = ladder.iter().copied().max().expect("non-empty").max(Duration::from_millis(min));
            let wave = UpstreamConfig::builder("twins")
                .limit(base)
                .probe_successes(probe)
                .cooldown_ladder(ladder)
                .min_cooldown(Duration::from_millis(min))
                .max_cooldown(max)
                .recovery(recovery)
                .retest_spacing(Duration::from_millis(retest_after), Duration::from_millis(retest_after * factor))
                .build()
                .expect("a valid configuration")
                .wave()
                .clone();
            WaveConfig { retest_rounds_max: rounds_max, ..wave }
        })
}

fn config_args(config: &WaveConfig) -> Vec<String> {
    let ms = |d: Duration| d.as_millis().to_string();
    vec![
        config.base_limit.to_string(),
        config.probe_successes.to_string(),
        config.cooldown.ladder().iter().map(|d| ms(*d)).collect::<Vec<_>>().join(","),
        ms(config.cooldown.min()),
        ms(config.cooldown.max()),
        "0".into(),
        "0".into(),
        "0".into(),
        "0".into(),
        config.recovery.as_str().into(),
        ms(config.retest_after),
        ms(config.retest_max),
        config.retest_rounds_max.to_string(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    ]
}

fn line(answer: String, s: &WaveSnapshot) -> String {
    let rel = |t: u64| t as i128 - EPOCH_MS as i128;
    format!(
        "{answer} | {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
        s.state,
        s.limit,
        s.wave,
        rel(s.cooldown_until_ms),
        s.successes,
        s.step,
        s.threshold,
        s.ceiling,
        s.good,
        rel(s.retest_at_ms),
        s.spacing_ms,
        s.rounds,
        s.retest_rounds,
        s.on_trial
    )
}

fn rust(config: &WaveConfig, steps: &[StepIn]) -> Vec<String> {
    let mut m = WaveMachine::new(config.clone());
    let mut now = EPOCH_MS;
    steps
        .iter()
        .map(|step| {
            now += step.advance_ms;
            let s = m.snapshot();
            let tag = s.wave.saturating_sub(step.lag);
            let in_flight = match step.selector {
                0 => s.limit,
                1 => s.limit + 1,
                2 => s.limit / 2,
                _ => step.value.max(0) as u32,
            };
            let answer = match step.op {
                Op::Admit => match m.admit(now, in_flight) {
                    Admission::Granted { wave, .. } => format!("granted {wave}"),
                    Admission::Denied { reason, retry_after_ms } => {
                        format!("denied {} {retry_after_ms}", reason.as_str())
                    }
                },
                Op::Success => format!("success {}", m.on_success(tag, in_flight, now).is_some()),
                Op::Limited => {
                    let retry_after = u64::try_from(step.value).ok().map(Duration::from_millis);
                    match m.on_rate_limited(tag, now, retry_after) {
                        RateLimitEffect::Cut { cooldown, .. } => format!("cut {}", cooldown.as_millis()),
                        RateLimitEffect::Late { .. } => "late 0".to_string(),
                    }
                }
                Op::Poll => format!("poll {}", m.poll(now).is_some()),
            };
            line(answer, &m.snapshot())
        })
        .collect()
}

fn lua(
    con: &mut redis::Connection,
    source: &str,
    config: &WaveConfig,
    steps: &[StepIn],
) -> redis::RedisResult<Vec<String>> {
    let mut command = redis::cmd("EVAL");
    command.arg(source).arg(3).arg("twins:{u}:permits").arg("twins:{u}:state").arg("twins:{u}:waves");
    command.arg(config_args(config));
    for step in steps {
        let op = match step.op {
            Op::Admit => "admit",
            Op::Success => "success",
            Op::Limited => "limited",
            Op::Poll => "poll",
        };
        command.arg(op).arg(step.advance_ms).arg(step.lag).arg(step.selector).arg(step.value);
    }
    command.query(con)
}

/// Runs `cases` random sequences through both twins, with `wave_lua` as the Lua machine;
/// the first disagreement, if any.
fn disagreement(server: &RedisServer, wave_lua: &str, cases: u32) -> Option<String> {
    let con = std::cell::RefCell::new(server.connection().expect("connection"));
    let source = format!("{wave_lua}\n{DRIVER}");
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let strategy = (config(), proptest::collection::vec(step(), 1..250));
    runner
        .run(&strategy, |(config, steps)| {
            let expected = rust(&config, &steps);
            let got =
                lua(&mut con.borrow_mut(), &source, &config, &steps).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (i, (got, expected)) in got.iter().zip(&expected).enumerate() {
                prop_assert_eq!(got, expected, "step {} ({:?}) of {:?}", i, steps[i], config);
            }
            prop_assert_eq!(got.len(), expected.len());
            Ok(())
        })
        .err()
        .map(|e| e.to_string())
}

const WAVE_LUA: &str = include_str!("../../../lua/wave.lua");

#[test]
fn rust_and_lua_wave_machines_agree_on_random_sequences() {
    let server = RedisServer::start().expect("redis-server");
    if let Some(failure) = disagreement(&server, WAVE_LUA, 300) {
        panic!("the twins disagree: {failure}");
    }
}

#[test]
fn one_line_mutants_of_the_lua_twin_are_caught() {
    let server = RedisServer::start().expect("redis-server");
    let mutants = [
        ("s.limit > s.good", "s.limit >= s.good"),
        (
            "s.spacing = math.min(s.spacing * 2, config.retest_max)",
            "s.spacing = math.min(s.spacing * 3, config.retest_max)",
        ),
        ("if in_flight >= s.limit then\n    -- It held", "if in_flight > s.limit then\n    -- It held"),
        ("else next_limit = s.ceiling - 1 end", "else next_limit = s.ceiling end"),
        ("s.retest_at = now + s.spacing", "s.retest_at = now + config.retest_after"),
        ("if s.good > 0 then s.limit = s.good", "if s.good > 0 then s.limit = math.max(s.good - 1, 1)"),
        ("(config.adaptive and s.good > 0)", "(config.adaptive and s.good > 1)"),
        ("  s.on_trial = false\n  if in_flight * 2 < s.limit", "  if in_flight * 2 < s.limit"),
        ("'on_trial', s.on_trial and 1 or 0", "'on_trial', 0"),
        (
            "s.retest_rounds = math.min(s.retest_rounds * 2, config.retest_rounds_max)",
            "s.retest_rounds = math.min(s.retest_rounds + 1, config.retest_rounds_max)",
        ),
        ("  s.rounds = s.rounds + 1\n", "  s.rounds = s.rounds + 2\n"),
    ];
    for (original, mutant) in mutants {
        assert_eq!(WAVE_LUA.matches(original).count(), 1, "the mutant's original line is not unique: {original}");
        let mutated = WAVE_LUA.replacen(original, mutant, 1);
        assert!(disagreement(&server, &mutated, 300).is_some(), "the mutant `{mutant}` was not caught");
    }
}
