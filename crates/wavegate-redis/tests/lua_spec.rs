//! The Lua scripts against the gates' specification tables, through `SharedGate`'s entry
//! points, on a real redis-server, with Redis `TIME` as the clock (time passes by sleeping).

use std::collections::HashMap;
use std::time::Duration;

use tokio::runtime::Runtime;
use wavegate_core::spec::{ModelStatus, Released, SpecCase, WaveModel, cases, run_case};
use wavegate_core::{Ask, Decision, Instance, PermitId, UpstreamName, WaveSignal, WindowReport};
use wavegate_redis::{SharedGate, Store, StoreConfig, StoreError};
use wavegate_testkit::RedisServer;

/// The scripts of one upstream, one `SharedGate` per process asking.
struct LuaModel {
    runtime: Runtime,
    gate: SharedGate,
    by_instance: HashMap<Instance, SharedGate>,
    lease: Duration,
}

impl LuaModel {
    fn new(runtime: Runtime, store: &Store, name: &UpstreamName, case: &SpecCase) -> Self {
        let mut gate = SharedGate::with_budgets(store.clone(), name, &case.wave_config(), case.budgets());
        if !case.classes.is_empty() {
            gate = gate.with_classes(&case.priority_classes(), case.default_class, case.class_window());
        }
        Self { runtime, gate, by_instance: HashMap::new(), lease: Duration::from_millis(case.lease_ms) }
    }
}

impl WaveModel for LuaModel {
    type Error = StoreError;

    fn acquire(&mut self, instance: &Instance, asks: &[Ask]) -> Result<Decision, StoreError> {
        let base = &self.gate;
        let gate =
            self.by_instance.entry(instance.clone()).or_insert_with(|| base.clone().for_instance(instance.as_str()));
        self.runtime.block_on(gate.acquire(asks, self.lease))
    }

    fn finish(&mut self, id: &PermitId, wave: u64, signal: WaveSignal, delta: i64) -> Result<Released, StoreError> {
        let finished = self.runtime.block_on(self.gate.finish(id, wave, signal, delta))?;
        Ok(Released { held: finished.held, wake: finished.wake })
    }

    fn renew(&mut self, ids: &[PermitId]) -> Result<Vec<PermitId>, StoreError> {
        self.runtime.block_on(self.gate.renew(ids, self.lease))
    }

    fn advance(&mut self, ms: u64) -> Result<(), StoreError> {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    }

    fn status(&mut self) -> Result<ModelStatus, StoreError> {
        let (s, classes) = self.runtime.block_on(self.gate.status_with_classes())?;
        Ok(ModelStatus { state: s.state, limit: s.limit, wave: s.wave, in_flight: s.in_flight as usize, classes })
    }

    fn report_window(&mut self, report: WindowReport, tokens_each: u64) -> Result<(), StoreError> {
        self.runtime.block_on(self.gate.report_window("", report, tokens_each)).map(drop)
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
    for (index, case) in cases.iter().enumerate() {
        // A fresh upstream (fresh keys) per case.
        let name = UpstreamName::new(format!("spec-{index}")).expect("valid name");
        let mut model = LuaModel::new(runtime.take().expect("runtime"), &store, &name, case);
        let result = run_case(case, &mut model);
        runtime = Some(model.runtime);
        if let Err(failure) = result {
            failures.push(failure.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
