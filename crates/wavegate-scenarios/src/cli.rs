//! The runner's command line.

use std::path::PathBuf;
use std::time::Duration;

use crate::scenario::{SCENARIOS, Scenario, Sizes};
use crate::strategy::{STRATEGIES, Strategy};

impl Options {
    /// The strategies `scenario` runs: the command line's, or the scenario's own list, or all.
    pub(crate) fn strategies_for(&self, scenario: &Scenario) -> Vec<&'static Strategy> {
        if !self.strategies.is_empty() {
            return self.strategies.clone();
        }
        let own: Vec<&'static Strategy> =
            scenario.compare.iter().filter_map(|name| crate::strategy::find(name)).collect();
        if own.is_empty() { STRATEGIES.iter().collect() } else { own }
    }
}

pub(crate) const USAGE: &str = "\
wavegate-scenarios: the same job list under each strategy, on a mock provider process with a
hidden capacity, P worker processes x C callers and a real redis-server (never port 6379).

usage: wavegate-scenarios [--quick] [options]

  --quick               smoke sizes: 2 processes x 25 callers, 200 jobs (default: 4 x 50, 800 jobs)
  --scenario NAME       run only this scenario (repeatable): hidden-capacity, redis-outage, worker-crash,
                        cap-20ms, cap-200ms, cap-2s, cap-plain-429, cap-moves, nginx, rate-window,
                        provider-headers, provider-headers-anthropic, pool-3-keys, learned-tighter,
                        learned-looser, no-cap, openai-like, openai-like-budgets, openai-like-stream,
                        openai-like-stream-over-cap, anthropic-like, anthropic-like-budgets
  --strategy NAME       run only this strategy (repeatable): naive, semaphore, wavegate-seed,
                        wavegate-adaptive, oracle (default: each scenario's own list)
  --repeat N            run each scenario N times and report the median ratios (default 1)
  --jobs N              jobs in the job list (default: the scenario's own, a tenth with --quick)
  --processes P         worker processes
  --callers C           concurrent callers per worker process
  --service-ms A-B      service time per job, drawn in [A, B] ms (or one number)
  --rpm N               also give the provider a requests-per-minute budget
  --lease-ms N          wavegate's renewed permit lease (default 5000)
  --out DIR             where the pictures go (default target/scenarios)
  --help                this text
";

/// What the runner was asked to do.
#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) sizes: Sizes,
    pub(crate) scenarios: Vec<&'static Scenario>,
    /// The strategies named on the command line; empty: each scenario's own list.
    pub(crate) strategies: Vec<&'static Strategy>,
    pub(crate) repeat: usize,
    pub(crate) out: PathBuf,
}

/// Parses the arguments (without the program name); `Ok(None)` for `--help`.
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let args: Vec<String> = args.into_iter().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut sizes = if quick { Sizes::quick() } else { Sizes::full() };
    let (mut scenarios, mut strategies) = (Vec::new(), Vec::new());
    let mut out = PathBuf::from("target/scenarios");
    let mut repeat = 1;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| v.parse::<u64>().map_err(|_| format!("{name}: {v:?} is not a number"));
        match arg.as_str() {
            "--help" | "-h" => return Ok(None),
            "--quick" => {}
            "--scenario" => {
                let name = value("--scenario")?;
                let found = SCENARIOS.iter().find(|s| s.name == name).ok_or_else(|| format!("no scenario {name:?}"))?;
                scenarios.push(found);
            }
            "--strategy" => {
                let name = value("--strategy")?;
                let found =
                    STRATEGIES.iter().find(|s| s.name == name).ok_or_else(|| format!("no strategy {name:?}"))?;
                strategies.push(found);
            }
            "--jobs" => {
                sizes.jobs = number("--jobs", value("--jobs")?)?;
                sizes.jobs_given = true;
            }
            "--repeat" => repeat = number("--repeat", value("--repeat")?)?.max(1) as usize,
            "--processes" => sizes.processes = number("--processes", value("--processes")?)? as usize,
            "--callers" => {
                sizes.callers = number("--callers", value("--callers")?)? as usize;
                sizes.callers_given = true;
            }
            "--service-ms" => {
                let v = value("--service-ms")?;
                let (a, b) = v.split_once('-').unwrap_or((&v, &v));
                sizes.service_ms = (number("--service-ms", a.to_string())?, number("--service-ms", b.to_string())?);
                sizes.service_given = true;
                if sizes.service_ms.0 > sizes.service_ms.1 {
                    return Err(format!("--service-ms {v}: the low end is above the high end"));
                }
            }
            "--rpm" => sizes.rpm = Some(number("--rpm", value("--rpm")?)? as u32),
            "--lease-ms" => sizes.lease = Duration::from_millis(number("--lease-ms", value("--lease-ms")?)?),
            "--out" => out = PathBuf::from(value("--out")?),
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    if sizes.processes < 2 {
        return Err("--processes must be at least 2 (the crash scenario kills one)".into());
    }
    if sizes.callers == 0 || sizes.jobs == 0 {
        return Err("--callers and --jobs must be positive".into());
    }
    if scenarios.is_empty() {
        scenarios = SCENARIOS.iter().collect();
    }
    Ok(Some(Options { quick, sizes, scenarios, strategies, repeat, out }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn quick_and_overrides() {
        let options = parse(args(&["--quick", "--jobs", "40", "--service-ms", "20-40", "--scenario", "worker-crash"]))
            .expect("valid")
            .expect("not help");
        assert!(options.quick);
        assert_eq!((options.sizes.jobs, options.sizes.service_ms, options.sizes.processes), (40, (20, 40), 2));
        assert_eq!(options.scenarios.len(), 1);
        assert!(options.strategies.is_empty(), "each scenario's own list");
        assert!(options.sizes.jobs_given && options.sizes.service_given);
        assert!(parse(args(&["--help"])).expect("valid").is_none());
        assert!(parse(args(&["--bogus"])).is_err());
        assert!(parse(args(&["--processes", "1"])).is_err());
        assert!(parse(args(&["--strategy", "nope"])).is_err());
    }
}
