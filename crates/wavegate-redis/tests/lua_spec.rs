//! The Lua scripts against the wave machine's specification tables, on a real redis-server,
//! with Redis `TIME` as the clock (time passes by sleeping).

use std::time::Duration;

use tokio::runtime::Runtime;
use wavegate_core::spec::{ModelStatus, WaveModel, cases, run_case};
use wavegate_core::{Admission, UpstreamName, WaveSignal, WindowReport};
use wavegate_redis::{SharedGate, Store, StoreConfig, StoreError};
use wavegate_testkit::RedisServer;

struct LuaModel {
    runtime: Runtime,
    gate: SharedGate,
    lease: Duration,
}

impl WaveModel for LuaModel {
    type Error = StoreError;

    fn acquire(&mut self, permit: &str, tokens: u64) -> Result<Admission, StoreError> {
        self.runtime.block_on(self.gate.acquire_text(permit, self.lease, tokens)).map(|a| a.admission)
    }

    fn finish(&mut self, permit: &str, wave: u64, signal: WaveSignal, delta: i64) -> Result<bool, StoreError> {
        self.runtime.block_on(self.gate.finish_text(permit, wave, signal, delta)).map(|f| f.held)
    }

    fn advance(&mut self, ms: u64) -> Result<(), StoreError> {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    }

    fn status(&mut self) -> Result<ModelStatus, StoreError> {
        let s = self.runtime.block_on(self.gate.status())?;
        Ok(ModelStatus { state: s.state, limit: s.limit, wave: s.wave, in_flight: s.in_flight as usize })
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
    for (index, case) in cases.iter().enumerate() {
        // A fresh upstream (fresh keys) per case.
        let name = UpstreamName::new(format!("spec-{index}")).expect("valid name");
        let gate = SharedGate::with_budgets(store.clone(), &name, &case.wave_config(), case.budgets());
        let mut model =
            LuaModel { runtime: runtime.take().expect("runtime"), gate, lease: Duration::from_millis(case.lease_ms) };
        let result = run_case(case, &mut model);
        runtime = Some(model.runtime);
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }
}
