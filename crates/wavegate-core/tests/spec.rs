//! The gates' specification tables, run against the Rust twin, and a check that the tables
//! catch an implementation that gets the rules wrong.

use wavegate_core::spec::{GateModel, ModelStatus, Released, Step, WaveModel, cases, run_case};
use wavegate_core::{Ask, Decision, Instance, PermitId, TokenDelta, WaveSignal, WindowLeft, WindowReport};

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

/// A gate model with one thing wrong: `Wrong` changes what the model is told or answers.
struct Wrong<W>(GateModel, W);

/// What a wrong model changes (each method: the right model's behaviour by default).
trait Mistake {
    fn acquire(&mut self, model: &mut GateModel, instance: &Instance, asks: &[Ask]) -> Decision {
        model.acquire(instance, asks).unwrap_or_else(|e| match e {})
    }
    fn finish(
        &mut self,
        model: &mut GateModel,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        delta: TokenDelta,
    ) -> Released {
        model.finish(id, wave, signal, delta).unwrap_or_else(|e| match e {})
    }
    fn advance(&mut self, model: &mut GateModel, ms: u64) {
        model.advance(ms).unwrap_or_else(|e| match e {});
    }
    fn report_window(&mut self, model: &mut GateModel, id: Option<&PermitId>, report: WindowReport, tokens_each: u64) {
        model.report_window(id, report, tokens_each).unwrap_or_else(|e| match e {});
    }
}

impl<W: Mistake> WaveModel for Wrong<W> {
    type Error = std::convert::Infallible;
    fn acquire(&mut self, instance: &Instance, asks: &[Ask]) -> Result<Decision, Self::Error> {
        Ok(self.1.acquire(&mut self.0, instance, asks))
    }
    fn finish(
        &mut self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        delta: TokenDelta,
    ) -> Result<Released, Self::Error> {
        Ok(self.1.finish(&mut self.0, id, wave, signal, delta))
    }
    fn renew(&mut self, ids: &[PermitId]) -> Result<Vec<PermitId>, Self::Error> {
        self.0.renew(ids)
    }
    fn advance(&mut self, ms: u64) -> Result<(), Self::Error> {
        self.1.advance(&mut self.0, ms);
        Ok(())
    }
    fn now_ms(&mut self) -> Result<u64, Self::Error> {
        self.0.now_ms()
    }
    fn set_budgets(&mut self, budgets: wavegate_core::Budgets) -> Result<(), Self::Error> {
        self.0.set_budgets(budgets)
    }
    fn status(&mut self) -> Result<ModelStatus, Self::Error> {
        self.0.status()
    }
    fn report_window(
        &mut self,
        id: Option<&PermitId>,
        report: WindowReport,
        tokens_each: u64,
    ) -> Result<(), Self::Error> {
        self.1.report_window(&mut self.0, id, report, tokens_each);
        Ok(())
    }
}

/// Treats every 429 as news, whatever its wave.
struct CutsOnLate429s;

impl Mistake for CutsOnLate429s {
    fn finish(
        &mut self,
        model: &mut GateModel,
        id: &PermitId,
        _: u64,
        signal: WaveSignal,
        delta: TokenDelta,
    ) -> Released {
        let current = model.status().unwrap_or_else(|e| match e {}).wave;
        model.finish(id, current, signal, delta).unwrap_or_else(|e| match e {})
    }
}

#[test]
fn the_tables_catch_a_machine_that_cuts_on_late_429s() {
    let failing: Vec<&str> = cases()
        .iter()
        .filter(|case| run_case(case, &mut Wrong(GateModel::new(case), CutsOnLate429s)).is_err())
        .map(|case| case.name)
        .collect();
    assert!(failing.iter().any(|name| name.contains("seed walk-through")), "{failing:?}");
    assert!(failing.iter().any(|name| name.contains("late 429")), "{failing:?}");
}

/// Its clock stands still, so cooldowns, leases and budgets never end.
struct ClockStandsStill;

impl Mistake for ClockStandsStill {
    fn advance(&mut self, _: &mut GateModel, _: u64) {}
}

#[test]
fn the_tables_catch_a_machine_whose_clock_stands_still() {
    for case in cases() {
        let uses_time = case.steps.iter().any(|step| matches!(step, Step::Advance { .. }));
        let failed = run_case(&case, &mut Wrong(GateModel::new(&case), ClockStandsStill)).is_err();
        // The cases of several processes also advance only to order their asks.
        let processes = case.steps.iter().any(|step| matches!(step, Step::AcquireAmong { .. }));
        if !processes {
            assert_eq!(failed, uses_time, "case `{}`", case.name);
        } else if !uses_time {
            assert!(!failed, "case `{}`", case.name);
        }
    }
}

/// Mishears what the provider says, passing each window report through `hear` first (`None`:
/// it does not listen at all).
struct Mishears(fn(WindowReport) -> Option<WindowReport>);

impl Mistake for Mishears {
    fn report_window(&mut self, model: &mut GateModel, id: Option<&PermitId>, report: WindowReport, tokens_each: u64) {
        if let Some(heard) = (self.0)(report) {
            model.report_window(id, heard, tokens_each).unwrap_or_else(|e| match e {});
        }
    }
}

/// Settles every call otherwise: `delta` as the wrong model reads it.
struct Missettles(fn(TokenDelta) -> TokenDelta);

impl Mistake for Missettles {
    fn finish(
        &mut self,
        model: &mut GateModel,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        delta: TokenDelta,
    ) -> Released {
        model.finish(id, wave, signal, (self.0)(delta)).unwrap_or_else(|e| match e {})
    }
}

/// Keeps the output a settlement gives back to itself: the output window never sees it.
fn keeps_what_is_given_back(delta: TokenDelta) -> TokenDelta {
    TokenDelta::new(delta.total, delta.output.max(0))
}

/// Settles a call the provider refused as a mere refund: its windows keep it charged.
fn keeps_a_refusal_charged(delta: TokenDelta) -> TokenDelta {
    TokenDelta::new(delta.total, delta.output)
}

/// Forgets which call answered: every call in flight is taken as not counted yet by the
/// provider (the calls admitted before the answering one, and that one, charged twice).
struct ForgetsWhoAnswered;

impl Mistake for ForgetsWhoAnswered {
    fn report_window(&mut self, model: &mut GateModel, _: Option<&PermitId>, report: WindowReport, tokens_each: u64) {
        model.report_window(None, report, tokens_each).unwrap_or_else(|e| match e {});
    }
}

#[test]
fn the_tables_catch_a_gate_that_forgets_which_call_answered() {
    let failing: Vec<&str> = cases()
        .iter()
        .filter(|case| run_case(case, &mut Wrong(GateModel::new(case), ForgetsWhoAnswered)).is_err())
        .map(|case| case.name)
        .collect();
    assert!(
        failing.contains(&"provider window: an answer leaves out only what was granted after its own call"),
        "{failing:?}"
    );
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
    assert_eq!(window_cases.len(), 19);
    for case in &window_cases {
        assert!(run_case(case, &mut Wrong(GateModel::new(case), Mishears(deaf_to_windows))).is_err(), "{}", case.name);
    }
}

/// Folds the input and output windows into one tokens window of their sum, at the share left
/// of the more used part (as wavegate did before they were tracked apart).
fn folds_the_parts(report: WindowReport) -> Option<WindowReport> {
    let (Some(input), Some(output)) = (report.input, report.output) else { return Some(report) };
    let (input_to, output_to) = (input.refills_to.unwrap_or(1), output.refills_to.unwrap_or(1));
    let share = (input.remaining as f64 / input_to as f64).min(output.remaining as f64 / output_to as f64);
    let to = input_to + output_to;
    let tokens = WindowLeft {
        remaining: (to as f64 * share) as u64,
        reset_ms: input.reset_ms.max(output.reset_ms),
        refills_to: Some(to),
    };
    Some(WindowReport { tokens: Some(tokens), input: None, output: None, ..report })
}

#[test]
fn the_tables_catch_a_gate_blind_to_the_output_given_back_or_that_folds_the_parts() {
    let name =
        "provider window: Anthropic's input and output are tracked apart; the output takes back what is given back";
    let case = cases().into_iter().find(|case| case.name == name).expect("the case");
    assert!(run_case(&case, &mut Wrong(GateModel::new(&case), Missettles(keeps_what_is_given_back))).is_err());
    assert!(run_case(&case, &mut Wrong(GateModel::new(&case), Mishears(folds_the_parts))).is_err());
}

/// Takes a refusal's answer in without giving its reservation back first.
fn forgets_the_refused_call(report: WindowReport) -> Option<WindowReport> {
    Some(WindowReport { refused: None, ..report })
}

#[test]
fn the_tables_catch_a_gate_that_keeps_a_refused_call_charged_to_the_windows() {
    let name = "provider window: a call the provider refused gives its whole reservation back to every window";
    let case = cases().into_iter().find(|case| case.name == name).expect("the case");
    assert!(run_case(&case, &mut Wrong(GateModel::new(&case), Missettles(keeps_a_refusal_charged))).is_err());
    assert!(run_case(&case, &mut Wrong(GateModel::new(&case), Mishears(forgets_the_refused_call))).is_err());
}

/// Reads OpenAI's reset as the end of a fixed window (the stall of issue 23).
fn refill_as_window_end(report: WindowReport) -> Option<WindowReport> {
    let fixed = |left: Option<WindowLeft>| left.map(|l| WindowLeft { refills_to: None, ..l });
    Some(WindowReport { requests: fixed(report.requests), tokens: fixed(report.tokens), ..report })
}

#[test]
fn the_tables_catch_a_machine_that_reads_a_refill_as_a_window_end() {
    let refill_cases: Vec<_> = cases().into_iter().filter(|case| case.name.contains("refill")).collect();
    assert_eq!(refill_cases.len(), 2);
    for case in &refill_cases {
        let mut wrong = Wrong(GateModel::new(case), Mishears(refill_as_window_end));
        assert!(run_case(case, &mut wrong).is_err(), "{}", case.name);
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
            run_case(case, &mut Wrong(GateModel::new(case), Mishears(deaf_to_limits))).is_ok(),
            deaf_passes,
            "{}",
            case.name
        );
    }
}

/// Blames the first head for every denial (the bug of issue 20: a denial that names no id
/// charged to the first head).
struct BlamesTheFirstHead;

impl Mistake for BlamesTheFirstHead {
    fn acquire(&mut self, model: &mut GateModel, instance: &Instance, asks: &[Ask]) -> Decision {
        match model.acquire(instance, asks).unwrap_or_else(|e| match e {}) {
            Decision::Denied { reason, retry_after_ms, in_flight, .. } => {
                Decision::denied_for(asks[0].id.clone(), reason, retry_after_ms, in_flight)
            }
            granted => granted,
        }
    }
}

/// Wakes nobody: every waiter must wait for its poll.
struct WakesNobody;

impl Mistake for WakesNobody {
    fn finish(
        &mut self,
        model: &mut GateModel,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        delta: TokenDelta,
    ) -> Released {
        Released { wake: None, ..model.finish(id, wave, signal, delta).unwrap_or_else(|e| match e {}) }
    }
}

#[test]
fn the_tables_catch_a_gate_whose_denials_or_wakes_name_the_wrong_one() {
    let fails = |mistake: &dyn Fn(&wavegate_core::spec::SpecCase) -> bool, part: &str| {
        let failing: Vec<&str> = cases().iter().filter(|c| mistake(c)).map(|c| c.name).collect();
        assert!(failing.iter().any(|name| name.contains(part)), "{part}: {failing:?}");
    };
    fails(&|case| run_case(case, &mut Wrong(GateModel::new(case), BlamesTheFirstHead)).is_err(), "oversized head");
    fails(&|case| run_case(case, &mut Wrong(GateModel::new(case), BlamesTheFirstHead)).is_err(), "denial names");
    fails(&|case| run_case(case, &mut Wrong(GateModel::new(case), WakesNobody)).is_err(), "waited longest");
    fails(&|case| run_case(case, &mut Wrong(GateModel::new(case), WakesNobody)).is_err(), "weights 3 : 1");
}

#[test]
fn the_fallback_starts_as_its_table_says() {
    let cases = wavegate_core::spec::fallback_cases();
    assert!(cases.len() >= 15, "the fallback's table lost cases");
    let failures: Vec<String> = cases.iter().filter_map(|case| case.check().err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
