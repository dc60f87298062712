//! The wave machine's specification tables, run against the Rust implementation, and a check
//! that the tables catch an implementation that gets the rules wrong.

use wavegate_core::spec::{GateModel, ModelStatus, Step, WaveModel, cases, run_case};
use wavegate_core::{Admission, WaveSignal, WindowReport};

#[test]
fn local_gate_passes_every_case() {
    let cases = cases();
    assert!(cases.len() >= 8, "the spec lost cases");
    for case in &cases {
        let mut model = GateModel::new(case);
        if let Err(failure) = run_case(case, &mut model) {
            panic!("{failure}");
        }
    }
}

/// A wrong implementation: it treats every 429 as news, whatever its wave.
struct CutsOnLate429s(GateModel);

impl WaveModel for CutsOnLate429s {
    type Error = std::convert::Infallible;
    fn acquire(&mut self, permit: &str, tokens: u64) -> Result<Admission, Self::Error> {
        self.0.acquire(permit, tokens)
    }
    fn finish(&mut self, permit: &str, _wave: u64, signal: WaveSignal, delta: i64) -> Result<bool, Self::Error> {
        let current = self.0.status()?.wave;
        self.0.finish(permit, current, signal, delta)
    }
    fn advance(&mut self, ms: u64) -> Result<(), Self::Error> {
        self.0.advance(ms)
    }
    fn status(&mut self) -> Result<ModelStatus, Self::Error> {
        self.0.status()
    }
    fn report_window(&mut self, report: WindowReport, tokens_each: u64) -> Result<(), Self::Error> {
        self.0.report_window(report, tokens_each)
    }
}

/// A wrong implementation: its clock stands still, so cooldowns and leases never end.
struct ClockStandsStill(GateModel);

impl WaveModel for ClockStandsStill {
    type Error = std::convert::Infallible;
    fn acquire(&mut self, permit: &str, tokens: u64) -> Result<Admission, Self::Error> {
        self.0.acquire(permit, tokens)
    }
    fn finish(&mut self, permit: &str, wave: u64, signal: WaveSignal, delta: i64) -> Result<bool, Self::Error> {
        self.0.finish(permit, wave, signal, delta)
    }
    fn advance(&mut self, _ms: u64) -> Result<(), Self::Error> {
        Ok(())
    }
    fn status(&mut self) -> Result<ModelStatus, Self::Error> {
        self.0.status()
    }
    fn report_window(&mut self, report: WindowReport, tokens_each: u64) -> Result<(), Self::Error> {
        self.0.report_window(report, tokens_each)
    }
}

#[test]
fn the_tables_catch_a_machine_that_cuts_on_late_429s() {
    let failing: Vec<&str> = cases()
        .iter()
        .filter(|case| run_case(case, &mut CutsOnLate429s(GateModel::new(case))).is_err())
        .map(|case| case.name)
        .collect();
    assert!(failing.iter().any(|name| name.contains("seed walk-through")), "{failing:?}");
    assert!(failing.iter().any(|name| name.contains("late 429")), "{failing:?}");
}

#[test]
fn the_tables_catch_a_machine_whose_clock_stands_still() {
    for case in cases() {
        let uses_time = case.steps.iter().any(|step| matches!(step, Step::Advance { .. }));
        let failed = run_case(&case, &mut ClockStandsStill(GateModel::new(&case))).is_err();
        assert_eq!(failed, uses_time, "case `{}`", case.name);
    }
}

/// A wrong implementation: it mishears what the provider says, passing each window report
/// through `hear` first (`None`: it does not listen at all).
struct Mishears(GateModel, fn(WindowReport) -> Option<WindowReport>);

impl WaveModel for Mishears {
    type Error = std::convert::Infallible;
    fn acquire(&mut self, permit: &str, tokens: u64) -> Result<Admission, Self::Error> {
        self.0.acquire(permit, tokens)
    }
    fn finish(&mut self, permit: &str, wave: u64, signal: WaveSignal, delta: i64) -> Result<bool, Self::Error> {
        self.0.finish(permit, wave, signal, delta)
    }
    fn advance(&mut self, ms: u64) -> Result<(), Self::Error> {
        self.0.advance(ms)
    }
    fn status(&mut self) -> Result<ModelStatus, Self::Error> {
        self.0.status()
    }
    fn report_window(&mut self, report: WindowReport, tokens_each: u64) -> Result<(), Self::Error> {
        match (self.1)(report) {
            Some(heard) => self.0.report_window(heard, tokens_each),
            None => Ok(()),
        }
    }
}

/// Deaf to the provider's windows.
fn deaf_to_windows(_: WindowReport) -> Option<WindowReport> {
    None
}

/// Listens to the windows but not to the limits announced.
fn deaf_to_limits(report: WindowReport) -> Option<WindowReport> {
    Some(WindowReport { limits: Default::default(), ..report })
}

#[test]
fn the_tables_catch_a_machine_deaf_to_the_providers_windows() {
    let window_cases: Vec<_> = cases().into_iter().filter(|case| case.name.starts_with("provider window")).collect();
    assert_eq!(window_cases.len(), 4);
    for case in &window_cases {
        assert!(run_case(case, &mut Mishears(GateModel::new(case), deaf_to_windows)).is_err(), "{}", case.name);
    }
}

#[test]
fn the_tables_catch_a_machine_deaf_to_the_announced_limits() {
    let limit_cases: Vec<_> = cases().into_iter().filter(|case| case.name.starts_with("learned limit")).collect();
    assert_eq!(limit_cases.len(), 4);
    for case in &limit_cases {
        // The looser announced limit changes nothing: a deaf machine passes that one.
        let deaf_passes = case.name.contains("never loosens");
        assert_eq!(
            run_case(case, &mut Mishears(GateModel::new(case), deaf_to_limits)).is_ok(),
            deaf_passes,
            "{}",
            case.name
        );
    }
}
