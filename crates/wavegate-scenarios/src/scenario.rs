//! The scenarios and the sizes of a run.

use std::time::Duration;

/// What breaks during a run, at a share of the jobs done.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Event {
    /// Nothing: the provider's hidden capacity is the whole story.
    Nothing,
    /// Redis is killed (`kill -9`) once `kill_at` of the jobs are done and restarted, empty,
    /// once `restart_at` are. Only the strategies that use Redis notice.
    RedisOutage { kill_at: f64, restart_at: f64 },
    /// One worker process (the last) is killed with `kill -9` once `at` of the jobs are done;
    /// the jobs it was running are lost by definition.
    WorkerCrash { at: f64 },
}

/// One scenario: a provider and what happens to the fleet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    /// Short name, used on the command line and in file names.
    pub(crate) name: &'static str,
    /// One line on what it shows.
    pub(crate) title: &'static str,
    /// Calls the provider serves at once; beyond that it answers 429 (hidden from wavegate).
    pub(crate) capacity: usize,
    /// The limit wavegate is configured with.
    pub(crate) limit: u32,
    pub(crate) event: Event,
}

/// Every scenario, in the order they run.
pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "hidden-capacity",
        title: "the provider serves 8 at once; wavegate is configured with a limit of 10",
        capacity: 8,
        limit: 10,
        event: Event::Nothing,
    },
    Scenario {
        name: "redis-outage",
        title: "Redis killed at 30 % of the jobs, restarted empty at 60 % (capacity = limit = 10)",
        capacity: 10,
        limit: 10,
        event: Event::RedisOutage { kill_at: 0.3, restart_at: 0.6 },
    },
    Scenario {
        name: "worker-crash",
        title: "kill -9 of one worker at 50 % of the jobs (capacity = limit = 10)",
        capacity: 10,
        limit: 10,
        event: Event::WorkerCrash { at: 0.5 },
    },
];

/// How big a run is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sizes {
    /// Worker processes.
    pub(crate) processes: usize,
    /// Concurrent callers per worker process.
    pub(crate) callers: usize,
    /// Jobs in the job list.
    pub(crate) jobs: u64,
    /// Service time of a served call, drawn per job from `[min, max]` ms.
    pub(crate) service_ms: (u64, u64),
    /// The provider's requests-per-minute budget, if any (beyond it: 429).
    pub(crate) rpm: Option<u32>,
    /// The `Retry-After` the provider sends with a 429, in seconds.
    pub(crate) retry_after_s: u32,
    /// wavegate's renewed permit lease.
    pub(crate) lease: Duration,
}

impl Sizes {
    /// The full run: 4 processes × 50 callers (200 callers), 800 jobs of 100–200 ms.
    pub(crate) fn full() -> Self {
        Self {
            processes: 4,
            callers: 50,
            jobs: 800,
            service_ms: (100, 200),
            rpm: None,
            retry_after_s: 1,
            lease: Duration::from_secs(5),
        }
    }

    /// The smoke run: 2 processes × 25 callers, 200 jobs.
    pub(crate) fn quick() -> Self {
        Self { processes: 2, callers: 25, jobs: 200, ..Self::full() }
    }

    /// The service time of every job, in ms, in job order.
    pub(crate) fn service_times(&self) -> Vec<u64> {
        (0..self.jobs).map(|id| crate::protocol::service_ms(id, self.service_ms)).collect()
    }
}
