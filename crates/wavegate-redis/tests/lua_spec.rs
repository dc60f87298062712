//! The Lua scripts against the gates' specification tables, through `SharedGate`'s entry
//! points, on a real redis-server, with Redis `TIME` as the clock (time passes by sleeping).
//!
//! A permit's report followed by its release goes as the engine sends them: one `finish.lua`
//! call carrying the report. Any other step after a report sends it alone first.

use std::collections::HashMap;
use std::time::Duration;

use tokio::runtime::Runtime;
use wavegate_core::spec::{ModelStatus, Released, SpecCase, WaveModel, cases, run_case};
use wavegate_core::{
    Ask, Budgets, Decision, Instance, LiveSetting, LiveSettings, LiveValue, PermitId, TokenDelta, UpstreamName,
    WaveSignal, WindowReport,
};
use wavegate_redis::{HandOff, SharedGate, Store, StoreConfig, StoreError};
use wavegate_testkit::RedisServer;

/// The scripts of one upstream, one `SharedGate` per process asking.
struct LuaModel {
    runtime: Runtime,
    gate: SharedGate,
    by_instance: HashMap<Instance, SharedGate>,
    lease: Duration,
    /// A permit's report not sent yet: it rides on the permit's release if that comes next.
    pending: Option<(PermitId, WindowReport, u64)>,
    /// How many reports rode on a release.
    joined: usize,
}

impl LuaModel {
    fn new(runtime: Runtime, store: &Store, name: &UpstreamName, case: &SpecCase) -> Self {
        // The twin hands permits on whether or not anybody hears the wake-up: so does this gate.
        let gate = SharedGate::with_budgets(store.clone(), name, &case.wave_config(), case.budgets());
        let mut gate = gate.with_hand_off(HandOff::Always);
        if !case.classes.is_empty() {
            gate = gate.with_classes(&case.priority_classes(), case.default_class, case.class_window());
        }
        Self {
            runtime,
            gate,
            by_instance: HashMap::new(),
            lease: Duration::from_millis(case.lease_ms),
            pending: None,
            joined: 0,
        }
    }

    /// Sends a report held back, alone (the step after it is not its permit's release).
    fn send_pending(&mut self) -> Result<(), StoreError> {
        match self.pending.take() {
            Some((id, report, tokens_each)) => {
                self.runtime.block_on(self.gate.report_window(id.as_str(), report, tokens_each)).map(drop)
            }
            None => Ok(()),
        }
    }
}

impl WaveModel for LuaModel {
    type Error = StoreError;

    fn acquire(&mut self, instance: &Instance, asks: &[Ask]) -> Result<Decision, StoreError> {
        self.send_pending()?;
        let base = &self.gate;
        let gate =
            self.by_instance.entry(instance.clone()).or_insert_with(|| base.clone().for_instance(instance.as_str()));
        self.runtime.block_on(gate.acquire(asks, self.lease))
    }

    fn finish(
        &mut self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        delta: TokenDelta,
    ) -> Result<Released, StoreError> {
        let report = match self.pending.take() {
            Some((reported, report, tokens_each)) if &reported == id => Some((report, tokens_each)),
            other => {
                self.pending = other;
                self.send_pending()?;
                None
            }
        };
        self.joined += usize::from(report.is_some());
        let finished = self.runtime.block_on(self.gate.finish_reporting(id, wave, signal, delta, report))?;
        Ok(Released {
            held: finished.held,
            wake: finished.wake,
            handed: finished.handed.map(|id| (id, finished.status.wave)),
        })
    }

    fn renew(&mut self, ids: &[PermitId]) -> Result<Vec<PermitId>, StoreError> {
        self.send_pending()?;
        self.runtime.block_on(self.gate.renew(ids, self.lease))
    }

    fn advance(&mut self, ms: u64) -> Result<(), StoreError> {
        self.send_pending()?;
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    }

    fn now_ms(&mut self) -> Result<u64, StoreError> {
        // The test's server runs on this host: its TIME is this clock.
        Ok(wavegate_redis::store_now_ms())
    }

    fn set_budgets(&mut self, budgets: Budgets) -> Result<(), StoreError> {
        self.send_pending()?;
        // As a process applies a live rate or burst: sent to the scripts in the budgets'
        // arguments (the gate's clones, one per instance, share them).
        let value = |value: u32| LiveValue { value: u64::from(value), remaining: None };
        let mut live = LiveSettings::empty(1);
        for (budget, rate, burst) in [
            (budgets.requests, LiveSetting::RequestsPerMinute, LiveSetting::RequestsBurst),
            (budgets.tokens, LiveSetting::TokensPerMinute, LiveSetting::TokensBurst),
        ] {
            if let Some(budget) = budget {
                live = live.with(rate, value(budget.per_minute())).with(burst, value(budget.burst()));
            }
        }
        self.gate.set_live(&live);
        Ok(())
    }

    fn status(&mut self) -> Result<ModelStatus, StoreError> {
        self.send_pending()?;
        let (s, classes) = self.runtime.block_on(self.gate.status_with_classes())?;
        Ok(ModelStatus { state: s.state, limit: s.limit, wave: s.wave, in_flight: s.in_flight as usize, classes })
    }

    fn report_window(
        &mut self,
        id: Option<&PermitId>,
        report: WindowReport,
        tokens_each: u64,
    ) -> Result<(), StoreError> {
        self.send_pending()?;
        match id {
            // Held back: it rides on the permit's release if that is the next step.
            Some(id) => {
                self.pending = Some((id.clone(), report, tokens_each));
                Ok(())
            }
            None => self.runtime.block_on(self.gate.report_window("", report, tokens_each)).map(drop),
        }
    }
}

#[test]
fn lua_scripts_pass_every_case() {
    let server = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
    let cases = cases();
    assert!(cases.len() >= 8);
    let mut runtime = Some(runtime);
    let mut failures = Vec::new();
    let mut joined = 0;
    for (index, case) in cases.iter().enumerate() {
        // A fresh upstream (fresh keys) per case.
        let name = UpstreamName::new(format!("spec-{index}")).expect("valid name");
        let mut model = LuaModel::new(runtime.take().expect("runtime"), &store, &name, case);
        let result = run_case(case, &mut model).and_then(|()| {
            // A report the case ends with is still sent (and must not fail).
            model.send_pending().map_err(|e| wavegate_core::spec::SpecFailure {
                case: case.name,
                step: case.steps.len(),
                expected: "the last report taken in".to_string(),
                got: format!("model error: {e}"),
            })
        });
        joined += model.joined;
        runtime = Some(model.runtime);
        if let Err(failure) = result {
            failures.push(failure.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The cases where a permit's report and its release go together in one script call.
    assert!(joined >= 2, "only {joined} reports rode on a release");
}

const WAVE_LUA: &str = include_str!("../../../lua/wave.lua");

/// Runs `carry_back` of `wave.lua` on one case: ARGV = store state, limit, wave, carried state,
/// carried limit, base. Answers the state, limit, whether it changed, and the threshold.
const CARRY_BACK_DRIVER: &str = r"
local s = { state = ARGV[1], limit = tonumber(ARGV[2]), wave = tonumber(ARGV[3]), threshold = tonumber(ARGV[2]),
  successes = 0 }
local changed = carry_back(s, ARGV[4], tonumber(ARGV[5]), { base = tonumber(ARGV[6]) })
return { s.state, s.limit, changed and 1 or 0, s.threshold }
";

#[test]
fn lua_carry_back_passes_its_table() {
    use wavegate_core::spec::carry_back_cases;
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    let source = format!("{WAVE_LUA}\n{CARRY_BACK_DRIVER}");
    for case in carry_back_cases() {
        let (state, limit, wave) = case.store;
        let (carried, carried_limit) = case.carried;
        let (got_state, got_limit, changed, threshold): (String, u32, i64, u32) = redis::cmd("EVAL")
            .arg(&source)
            .arg(0)
            .arg(state.as_str())
            .arg(limit)
            .arg(wave)
            .arg(carried.as_str())
            .arg(carried_limit)
            .arg(case.base)
            .query(&mut con)
            .expect("the driver runs");
        let expect = (case.expect.0.as_str().to_owned(), case.expect.1, i64::from(case.expect.2));
        assert_eq!((got_state, got_limit, changed), expect, "{}", case.name);
        if case.expect.2 {
            assert_eq!(threshold, got_limit, "{}: the limit is the threshold", case.name);
        }
    }
}

/// Runs `rebase` of `wave.lua` on one case: ARGV = state, limit, threshold, ceiling, good, old
/// base, new base. Answers the state, limit, threshold, ceiling and good.
const REBASE_DRIVER: &str = r"
local s = { state = ARGV[1], limit = tonumber(ARGV[2]), threshold = tonumber(ARGV[3]), ceiling = tonumber(ARGV[4]),
  good = tonumber(ARGV[5]) }
rebase(s, tonumber(ARGV[6]), { base = tonumber(ARGV[7]) })
return { s.state, s.limit, s.threshold, s.ceiling, s.good }
";

#[test]
fn lua_rebase_passes_its_table() {
    use wavegate_core::spec::rebase_cases;
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    let source = format!("{WAVE_LUA}\n{REBASE_DRIVER}");
    for case in rebase_cases() {
        let (state, limit, threshold, ceiling, good) = case.before;
        let (got_state, got_limit, got_threshold, got_ceiling, got_good): (String, u32, u32, u32, u32) =
            redis::cmd("EVAL")
                .arg(&source)
                .arg(0)
                .arg(state.as_str())
                .arg(limit)
                .arg(threshold)
                .arg(ceiling)
                .arg(good)
                .arg(case.old_base)
                .arg(case.new_base)
                .query(&mut con)
                .expect("the driver runs");
        assert_eq!(got_state, state.as_str(), "{}: the state stays", case.name);
        assert_eq!((got_limit, got_threshold, got_ceiling, got_good), case.expect, "{}", case.name);
    }
}

#[test]
fn lua_rescale_tat_passes_its_table() {
    use wavegate_core::spec::rescale_cases;
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    let source = format!(
        "{WAVE_LUA}\nreturn string.format('%.0f', rescale_tat(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])))"
    );
    for case in rescale_cases() {
        let got: String = redis::cmd("EVAL")
            .arg(&source)
            .arg(0)
            .arg(case.tat_us)
            .arg(case.now_us)
            .arg(case.rates.0)
            .arg(case.rates.1)
            .query(&mut con)
            .expect("the driver runs");
        assert_eq!(got, case.expect_us.to_string(), "{}", case.name);
    }
}

/// A store that forgot an upstream's state under a process that saw it: every script but
/// status refuses with `StateLost` and writes nothing; a reconciliation rebuilds it (the held
/// permit registered again, the stepped-back limit carried back) and the scripts serve again.
#[test]
fn a_state_flushed_under_a_process_is_refused_as_lost_until_it_reconciles() {
    use wavegate_core::{OutageUsage, UpstreamConfig, WaveState};
    let server = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
    let config = UpstreamConfig::builder("flushed").limit(4).build().expect("valid");
    let gate = SharedGate::new(store.clone(), config.name(), config.wave()).for_instance("alpha");
    let lease = Duration::from_secs(3);
    let me = Instance::new("alpha").expect("instance");
    let held = PermitId::new(None, &me, 1, None);
    let granted = runtime.block_on(gate.acquire(&[Ask { id: held.clone(), tokens: 0, output: 0, waiting: 1 }], lease));
    assert!(matches!(granted, Ok(Decision::Granted { .. })), "{granted:?}");
    assert!(!gate.generation().is_empty(), "the first reply tells the generation");
    let mut con = server.connection().expect("connection");
    let () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");

    let other = PermitId::new(None, &me, 2, None);
    let lost = |result: Result<(), StoreError>, what: &str| match result {
        Err(error) => assert!(error.is_state_lost() && error.is_outage(), "{what}: {error:?}"),
        Ok(()) => panic!("{what}: served against a flushed state"),
    };
    lost(
        runtime.block_on(gate.acquire(&[Ask { id: other.clone(), tokens: 0, output: 0, waiting: 1 }], lease)).map(drop),
        "acquire",
    );
    lost(runtime.block_on(gate.renew(std::slice::from_ref(&held), lease)).map(drop), "renew");
    lost(runtime.block_on(gate.finish(&other, 1, WaveSignal::Success, 0)).map(drop), "finish");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    assert!(keys.is_empty(), "a refusal writes nothing: {keys:?}");

    let before = gate.generation();
    let carried = Some((WaveState::Degraded, 2));
    let reconciled = runtime
        .block_on(gate.reconcile_carrying(&[held.as_str().to_owned()], &[], lease, OutageUsage::NONE, carried))
        .expect("reconcile");
    assert_eq!((reconciled.state, reconciled.limit, reconciled.in_flight), (WaveState::Degraded, 2, 1));
    assert_ne!(gate.generation(), before, "the reconciliation tells the new generation");
    let next = runtime.block_on(gate.acquire(&[Ask { id: other, tokens: 0, output: 0, waiting: 1 }], lease));
    assert!(matches!(next, Ok(Decision::Granted { limit: 2, .. })), "served again after the reconciliation: {next:?}");
    let status = runtime.block_on(gate.status()).expect("status");
    assert_eq!((status.state, status.limit, status.in_flight), (WaveState::Degraded, 2, 2));
}
