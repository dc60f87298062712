//! The Lua and the Rust learned limits agree, budget for budget, on random configurations,
//! announcements and times: the tighter budget in force (rate and burst), the learned one
//! alone when nothing is configured, none once forgotten. The Lua functions are the ones the
//! scripts use (`lua/learned_limit.lua` after `lua/wave.lua`), on a real redis-server with
//! explicit times, the limit stored in and read back from the wave state hash.
//!
//! The test also proves it can fail: one-line mutants of `learned_limit.lua` must be caught.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use wavegate_core::{Budgets, LearnedBudgets, LearnedLimit, LearnedLimits, RateBudget};
use wavegate_testkit::RedisServer;

/// Per case, seven ARGV: family, configured rate and burst (rate 0: none), learned limit
/// (0: none) and window, when it was reported, when the budget is read (ms).
const DRIVER: &str = r#"
local out = {}
for i = 1, #ARGV, 7 do
  redis.call('DEL', KEYS[2])
  state_cache = nil -- wave.lua's copy of KEYS[2]: a script never deletes it, this driver does
  local name = ARGV[i]
  local config = {}
  config[name] = budget(tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
  local limit, window = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  local at, now = tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  if limit > 0 then ll_report(at, name, limit, window) end
  ll_apply(config, now)
  local b = config[name]
  if b then table.insert(out, string.format('%.0f %.0f', b.rate, b.burst)) else table.insert(out, 'none') end
end
return out
"#;

#[derive(Debug, Clone)]
struct CaseIn {
    tokens: bool,
    configured: (u32, u32),
    learned: (u64, u64),
    at_ms: u64,
    after_ms: u64,
}

fn case() -> impl Strategy<Value = CaseIn> {
    let rate = prop_oneof![1 => Just(0u32), 3 => 1u32..5_000];
    let limit = prop_oneof![1 => Just(0u64), 6 => 1u64..6_000, 1 => 4_000_000_000u64..6_000_000_000];
    let window = prop_oneof![3 => 1u64..5_000, 1 => 5_000u64..200_000];
    (any::<bool>(), rate, 1u32..800, limit, window, 0u64..1_000_000, 0u64..4_000).prop_map(
        |(tokens, rate, burst, limit, window, at_ms, spread)| CaseIn {
            tokens,
            configured: (rate, burst),
            learned: (limit, window),
            at_ms,
            // Read from just after the report to past the three windows it is kept.
            after_ms: spread * window / 1_000,
        },
    )
}

fn rust(case: &CaseIn) -> String {
    let configured = RateBudget::new(case.configured.0, case.configured.1);
    let limit = (case.learned.0 > 0).then_some(LearnedLimit { limit: case.learned.0, window_ms: case.learned.1 });
    let (budgets, limits) = if case.tokens {
        (
            Budgets { requests: None, tokens: configured, ..Budgets::default() },
            LearnedLimits { requests: None, tokens: limit, ..LearnedLimits::default() },
        )
    } else {
        (
            Budgets { requests: configured, tokens: None, ..Budgets::default() },
            LearnedLimits { requests: limit, tokens: None, ..LearnedLimits::default() },
        )
    };
    let mut learned = LearnedBudgets::default();
    learned.report(limits, case.at_ms);
    let effective = learned.effective(budgets, case.at_ms + case.after_ms, 1);
    match if case.tokens { effective.tokens } else { effective.requests } {
        Some(b) => format!("{} {}", b.per_minute(), b.burst()),
        None => "none".to_string(),
    }
}

fn lua(con: &mut redis::Connection, source: &str, cases: &[CaseIn]) -> redis::RedisResult<Vec<String>> {
    let mut command = redis::cmd("EVAL");
    command.arg(source).arg(3).arg("ll:{u}:permits").arg("ll:{u}:state").arg("ll:{u}:waves");
    for case in cases {
        command
            .arg(if case.tokens { "tokens" } else { "requests" })
            .arg(case.configured.0)
            .arg(case.configured.1)
            .arg(case.learned.0)
            .arg(case.learned.1)
            .arg(case.at_ms)
            .arg(case.at_ms + case.after_ms);
    }
    command.query(con)
}

const WAVE_LUA: &str = include_str!("../../../lua/wave.lua");
const LEARNED_LUA: &str = include_str!("../../../lua/learned_limit.lua");

/// Runs random batches through both twins with `learned_lua`; the first disagreement.
fn disagreement(server: &RedisServer, learned_lua: &str, batches: u32) -> Option<String> {
    let con = std::cell::RefCell::new(server.connection().expect("connection"));
    let source = format!("{WAVE_LUA}\n{learned_lua}\n{DRIVER}");
    let mut runner = TestRunner::new(Config { cases: batches, failure_persistence: None, ..Config::default() });
    runner
        .run(&proptest::collection::vec(case(), 1..60), |cases| {
            let got = lua(&mut con.borrow_mut(), &source, &cases).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(got.len(), cases.len());
            for (got, case) in got.iter().zip(&cases) {
                prop_assert_eq!(got, &rust(case), "{:?}", case);
            }
            Ok(())
        })
        .err()
        .map(|e| e.to_string())
}

#[test]
fn lua_and_rust_learned_limits_agree_on_random_cases() {
    let server = RedisServer::start().expect("redis-server");
    if let Some(failure) = disagreement(&server, LEARNED_LUA, 200) {
        panic!("the twins disagree: {failure}");
    }
}

#[test]
fn one_line_mutants_of_the_learned_limits_are_caught() {
    let server = RedisServer::start().expect("redis-server");
    let mutants = [
        // Loosens a configured rate or burst.
        ("budget(math.min(b.rate, rate), math.min(b.burst, burst))", "budget(rate, math.min(b.burst, burst))"),
        ("budget(math.min(b.rate, rate), math.min(b.burst, burst))", "budget(math.min(b.rate, rate), burst)"),
        // Ignores the configuration: the learned limit alone.
        ("if b == nil then return budget(rate, burst) end", "do return budget(rate, burst) end"),
        // Creates no budget without a configured one.
        ("if b == nil then return budget(rate, burst) end", "if b == nil then return nil end"),
        // Never forgets, or keeps it one window too long.
        (
            "if limit and window and ends and now < ends then\n      local most",
            "if limit and window and ends then\n      local most",
        ),
        ("local LL_KEPT_WINDOWS = 3", "local LL_KEPT_WINDOWS = 4"),
        // Rounds the rate up (looser than the provider).
        ("math.floor(limit * 60000 / window)", "math.ceil(limit * 60000 / window)"),
        // Forgets the clamp of a huge limit.
        ("limit = math.max(1, math.min(limit, LL_MAX))", "limit = math.max(1, limit)"),
    ];
    for (original, mutant) in mutants {
        assert_eq!(LEARNED_LUA.matches(original).count(), 1, "the mutant's original line is not unique: {original}");
        let mutated = LEARNED_LUA.replacen(original, mutant, 1);
        assert!(disagreement(&server, &mutated, 200).is_some(), "the mutant `{mutant}` was not caught");
    }
}
