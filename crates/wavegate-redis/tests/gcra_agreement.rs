//! The Lua and the Rust GCRA agree, number for number, on random sequences of checks,
//! settlements, charges (of grants and of past usage) and reads (the Lua functions are the ones the scripts use, from
//! `lua/wave.lua`, run on a real redis-server with explicit times).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use wavegate_core::{Gcra, RateBudget};
use wavegate_testkit::RedisServer;

/// Runs a sequence of operations through wave.lua's GCRA functions.
const DRIVER: &str = r#"
local b = budget(tonumber(ARGV[1]), tonumber(ARGV[2]))
local tat = 0
local out = {}
for i = 3, #ARGV, 3 do
  local op, now, x = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if op == 'check' then
    local new_tat, wait = gcra_check(b, tat, now, x)
    if new_tat then
      tat = new_tat
      table.insert(out, 'ok ' .. string.format('%.0f', tat))
    else
      table.insert(out, 'wait ' .. string.format('%.0f', wait))
    end
  elseif op == 'settle' then
    tat = gcra_settle(b, tat, now, x)
    table.insert(out, 'tat ' .. string.format('%.0f', tat))
  elseif op == 'charge' then
    tat = gcra_charge(b, tat, now, x)
    table.insert(out, 'tat ' .. string.format('%.0f', tat))
  elseif op == 'charge_past' then
    tat = gcra_charge_past(b, tat, now, x)
    table.insert(out, 'tat ' .. string.format('%.0f', tat))
  else
    local remaining, next_ms = gcra_remaining(b, tat, now)
    table.insert(out, 'left ' .. string.format('%.0f', remaining) .. ' ' .. string.format('%.0f', next_ms))
  end
end
return out
"#;

#[derive(Debug, Clone)]
enum Op {
    Check(u64),
    Settle(i64),
    Charge(u64),
    ChargePast(u64),
    Remaining,
}

fn op() -> impl Strategy<Value = (Op, u64)> {
    let op = prop_oneof![
        4 => (0u64..2_000).prop_map(Op::Check),
        2 => (-2_000i64..2_000).prop_map(Op::Settle),
        1 => (0u64..500).prop_map(Op::Charge),
        1 => (0u64..5_000).prop_map(Op::ChargePast),
        1 => Just(Op::Remaining),
    ];
    // Time moves forward by 0 to 3 s between operations (µs).
    (op, 0u64..3_000_000)
}

fn rust(gcra: &Gcra, ops: &[(Op, u64)]) -> Vec<String> {
    let mut tat = 0u64;
    ops.iter()
        .map(|(op, now)| match op {
            Op::Check(cost) => match gcra.check(tat, *now, *cost) {
                Ok(new_tat) => {
                    tat = new_tat;
                    format!("ok {tat}")
                }
                Err(wait) => format!("wait {wait}"),
            },
            Op::Settle(delta) => {
                tat = gcra.settle(tat, *now, *delta);
                format!("tat {tat}")
            }
            Op::Charge(units) => {
                tat = gcra.charge(tat, *now, *units);
                format!("tat {tat}")
            }
            Op::ChargePast(units) => {
                tat = gcra.charge_past(tat, *now, *units);
                format!("tat {tat}")
            }
            Op::Remaining => {
                let (left, next) = gcra.remaining(tat, *now);
                format!("left {left} {next}")
            }
        })
        .collect()
}

#[test]
fn lua_and_rust_gcra_agree_on_random_sequences() {
    let server = RedisServer::start().expect("redis-server");
    let con = std::cell::RefCell::new(server.connection().expect("connection"));
    let script = format!("{}\n{DRIVER}", include_str!("../../../lua/wave.lua"));
    let mut runner = TestRunner::new(Config { cases: 200, ..Config::default() });
    let strategy = (1u32..100_000, 1u32..5_000, proptest::collection::vec(op(), 1..60));
    runner
        .run(&strategy, |(rate, burst, steps)| {
            // Absolute times around a realistic epoch in µs (Redis TIME × 1000 as the scripts use).
            let mut now = 1_764_000_000_000_000u64;
            let ops: Vec<(Op, u64)> = steps
                .into_iter()
                .map(|(op, gap)| {
                    now += gap;
                    (op, now)
                })
                .collect();
            let gcra = Gcra::new(RateBudget::new(rate, burst).expect("non-zero"));
            let expected = rust(&gcra, &ops);
            let mut command = redis::cmd("EVAL");
            command.arg(&script).arg(0).arg(rate).arg(burst);
            for (op, now) in &ops {
                let (name, x) = match op {
                    Op::Check(cost) => ("check", *cost as i64),
                    Op::Settle(delta) => ("settle", *delta),
                    Op::Charge(units) => ("charge", *units as i64),
                    Op::ChargePast(units) => ("charge_past", *units as i64),
                    Op::Remaining => ("remaining", 0),
                };
                command.arg(name).arg(*now).arg(x);
            }
            let got: Vec<String> =
                command.query(&mut *con.borrow_mut()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(got, expected, "rate {}/min, burst {}", rate, burst);
            Ok(())
        })
        .expect("Lua and Rust disagree");
}
