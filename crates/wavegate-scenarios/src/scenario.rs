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

/// Budgets the provider enforces per minute and announces only through rate-limit headers
/// (wavegate is configured without budgets and learns them from the answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Announced {
    /// `openai` or `anthropic`: whose headers the provider speaks.
    pub(crate) style: &'static str,
    /// Requests per minute.
    pub(crate) rpm: u32,
    /// Tokens per minute.
    pub(crate) tpm: u32,
    /// Tokens every job reserves (sent in its query, reserved by wavegate as its estimate).
    pub(crate) tokens_per_job: u64,
    /// API keys, each with these budgets of its own; more than one: wavegate pools them (one
    /// upstream per key) and the provider counts each key's windows apart.
    pub(crate) keys: u32,
    /// A requests-per-minute budget configured in wavegate (bursts of a two-second's worth),
    /// which the announced limit tightens and never loosens; `None`: wavegate has none.
    pub(crate) configured_rpm: Option<u32>,
}

impl Announced {
    /// The calls one minute lets through, all keys together: the tighter of the two budgets
    /// of a key, times the keys.
    pub(crate) fn calls_per_minute(&self) -> u32 {
        let by_tokens = u64::from(self.tpm) / self.tokens_per_job.max(1);
        self.rpm.min(u32::try_from(by_tokens).unwrap_or(u32::MAX)).saturating_mul(self.keys.max(1))
    }

    /// The calls a minute wavegate should let through: what the provider allows, or less
    /// when wavegate's configured budget is tighter.
    pub(crate) fn budget_per_minute(&self) -> u32 {
        self.calls_per_minute().min(self.configured_rpm.unwrap_or(u32::MAX))
    }

    /// The configured budget's burst: two seconds' worth (at least 1).
    pub(crate) fn configured_burst(rpm: u32) -> u32 {
        (rpm / 30).max(1)
    }
}

/// A provider with OpenAI's semantics ([`wavegate_testkit::OpenAiBucket`]): requests and tokens
/// buckets refilled continuously, each call charged its prompt plus `max_tokens` at admission,
/// OpenAI's headers, a hidden concurrency cap and seeded transient 500s; its answers streamed
/// as server-sent events when `stream` is set. With `otpm` set, Anthropic's semantics instead
/// ([`wavegate_testkit::AnthropicBucket`]): `tpm` is then the input tokens per minute and
/// `otpm` the output tokens per minute, enforced apart, Anthropic's headers, no cap, no 500s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Requests per minute.
    pub(crate) rpm: u32,
    /// Tokens per minute (Anthropic: input tokens per minute).
    pub(crate) tpm: u32,
    /// The hidden cap on calls served at once (0: none).
    pub(crate) cap: u32,
    /// Transient 500s per thousand admitted calls.
    pub(crate) errors_per_mille: u32,
    /// A job's prompt, in tokens, drawn per job from this range.
    pub(crate) prompt: (u64, u64),
    /// Every job's `max_tokens` (but the large ones').
    pub(crate) max_tokens: u64,
    /// wavegate's configured budgets `(rpm, burst, tpm, burst)` as the docs advise; `None`:
    /// none, wavegate learns from the headers.
    pub(crate) budgets: Option<(u32, u32, u32, u32)>,
    /// Answers are streamed (OpenAI's chat-completion chunks, the last with `usage`), the
    /// generation lasting the call's service time.
    pub(crate) stream: bool,
    /// Output tokens per minute, enforced apart from the input (Anthropic); 0: OpenAI's
    /// semantics (one tokens bucket).
    pub(crate) otpm: u32,
    /// Every `large_every`-th job (ids 0, n, 2n, …) is a large one: [`LARGE_PROMPT`] in,
    /// `max_tokens` [`LARGE_OUTPUT`], all of it used; 0: none.
    pub(crate) large_every: u32,
}

/// A large call's prompt (issue 23's Anthropic target: 10,000 in / 2,000 out).
pub(crate) const LARGE_PROMPT: u64 = 10_000;
/// A large call's `max_tokens`, all used.
pub(crate) const LARGE_OUTPUT: u64 = 2_000;

impl Bucket {
    /// Whether job `id` is a large call.
    pub(crate) fn is_large(&self, id: u64) -> bool {
        self.large_every > 0 && id.is_multiple_of(u64::from(self.large_every))
    }

    /// Job `id`'s prompt tokens (the same for every strategy and the provider).
    pub(crate) fn prompt_of(&self, id: u64) -> u64 {
        if self.is_large(id) {
            return LARGE_PROMPT;
        }
        // Another stream of the same hash than the service times, so the two are unrelated.
        crate::protocol::service_ms(id ^ 0x5EED_5EED, self.prompt)
    }

    /// Job `id`'s `max_tokens`.
    pub(crate) fn max_tokens_of(&self, id: u64) -> u64 {
        if self.is_large(id) { LARGE_OUTPUT } else { self.max_tokens }
    }

    /// The output tokens job `id` generates (its answer's usage): a large call all its
    /// `max_tokens`, the others a quarter to all of it, drawn per job.
    pub(crate) fn output_of(&self, id: u64) -> u64 {
        let max = self.max_tokens_of(id);
        if self.is_large(id) { max } else { crate::protocol::service_ms(id ^ 0x0070_0070_0070, (max / 4, max)) }
    }

    /// What job `id` costs in tokens at admission: its prompt and its `max_tokens`.
    pub(crate) fn cost_of(&self, id: u64) -> u64 {
        self.prompt_of(id) + self.max_tokens_of(id)
    }

    /// Whether the provider speaks Anthropic's semantics.
    pub(crate) fn is_anthropic(&self) -> bool {
        self.otpm > 0
    }

    /// The one-field form a worker reads it from (14 numbers, `0,0,0,0` for no budgets).
    pub(crate) fn to_field(self) -> String {
        let (r, rb, t, tb) = self.budgets.unwrap_or_default();
        let (p0, p1) = self.prompt;
        let (rpm, tpm, cap, e, m) = (self.rpm, self.tpm, self.cap, self.errors_per_mille, self.max_tokens);
        let (stream, otpm, large) = (u8::from(self.stream), self.otpm, self.large_every);
        format!("{rpm},{tpm},{cap},{e},{p0},{p1},{m},{r},{rb},{t},{tb},{stream},{otpm},{large}")
    }

    /// Reads [`Bucket::to_field`]'s form.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let n: Vec<u64> = text.split(',').map(str::parse).collect::<Result<_, _>>().ok()?;
        let small = |v: u64| u32::try_from(v).ok();
        let [rpm, tpm, cap, e, p0, p1, m, r, rb, t, tb, stream, otpm, large] = n[..] else { return None };
        Some(Self {
            rpm: small(rpm)?,
            tpm: small(tpm)?,
            cap: small(cap)?,
            errors_per_mille: small(e)?,
            prompt: (p0, p1),
            max_tokens: m,
            budgets: (r > 0).then_some((small(r)?, small(rb)?, small(t)?, small(tb)?)),
            stream: stream == 1,
            otpm: small(otpm)?,
            large_every: small(large)?,
        })
    }

    /// The soonest the whole job list can be admitted, in seconds: the buckets start full
    /// and refill at their rate (the service time of the last call comes on top). With
    /// Anthropic's output bucket, the output counted is what the calls used (the rest of their
    /// `max_tokens` comes back at their end).
    pub(crate) fn admission_floor_s(&self, jobs: u64) -> f64 {
        let floor = |need: u64, per_minute: u32| {
            (need as f64 - f64::from(per_minute)).max(0.0) / (f64::from(per_minute.max(1)) / 60.0)
        };
        let by_requests = floor(jobs, self.rpm);
        if self.is_anthropic() {
            let input = floor((0..jobs).map(|id| self.prompt_of(id)).sum(), self.tpm);
            let output = floor((0..jobs).map(|id| self.output_of(id)).sum(), self.otpm);
            return by_requests.max(input).max(output);
        }
        by_requests.max(floor((0..jobs).map(|id| self.cost_of(id)).sum(), self.tpm))
    }
}

/// One scenario: a provider and what happens to the fleet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scenario {
    /// Short name, used on the command line and in file names.
    pub(crate) name: &'static str,
    /// One line on what it shows.
    pub(crate) title: &'static str,
    /// Calls the provider serves at once at the start; beyond that it answers 429 (hidden from
    /// wavegate).
    pub(crate) capacity: usize,
    /// Later capacities: from this share of the jobs served on, this many at once.
    pub(crate) phases: &'static [(f64, usize)],
    /// A rate budget instead of (or besides) the capacity: this many calls in any window of
    /// this many seconds; beyond it a 429 until the window frees a call.
    pub(crate) rate: Option<(u32, u64)>,
    /// Requests and tokens budgets per minute (fixed windows from the first call), announced
    /// only in OpenAI's or Anthropic's headers.
    pub(crate) announced: Option<Announced>,
    /// OpenAI's buckets instead of the provider's own accounting (no other limit then).
    pub(crate) bucket: Option<Bucket>,
    /// The provider's 429s carry no `Retry-After` (as nginx's `limit_conn` answers).
    pub(crate) plain_429: bool,
    /// The capacity is enforced by a real nginx (`limit_conn`, plain 429s) in front of a
    /// provider without a cap, instead of by the provider itself.
    pub(crate) via_nginx: bool,
    /// The limit wavegate is configured with.
    pub(crate) limit: u32,
    pub(crate) event: Event,
    /// The scenario's own job count and service time (the command line's win when given).
    pub(crate) jobs: Option<u64>,
    pub(crate) service_ms: Option<(u64, u64)>,
    /// The scenario's own callers per process (the command line's win when given).
    pub(crate) callers: Option<usize>,
    /// The strategies it runs when the command line names none (empty: all).
    pub(crate) compare: &'static [&'static str],
}

/// The strategies compared in the capacity-learning scenarios: the floor, the default, the
/// seed's recovery for reference.
const LEARNING: &[&str] = &["oracle", "wavegate-adaptive", "wavegate-seed"];

const BASE: Scenario = Scenario {
    name: "",
    title: "",
    capacity: 8,
    phases: &[],
    rate: None,
    announced: None,
    bucket: None,
    plain_429: false,
    via_nginx: false,
    limit: 10,
    event: Event::Nothing,
    jobs: None,
    service_ms: None,
    callers: None,
    compare: &[],
};

/// Every scenario, in the order they run.
pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "hidden-capacity",
        title: "the provider serves 8 at once; wavegate is configured with a limit of 10",
        ..BASE
    },
    Scenario {
        name: "redis-outage",
        title: "Redis killed at 30 % of the jobs, restarted empty at 60 % (capacity = limit = 10)",
        capacity: 10,
        event: Event::RedisOutage { kill_at: 0.3, restart_at: 0.6 },
        ..BASE
    },
    Scenario {
        name: "worker-crash",
        title: "kill -9 of one worker at 50 % of the jobs (capacity = limit = 10)",
        capacity: 10,
        event: Event::WorkerCrash { at: 0.5 },
        ..BASE
    },
    Scenario {
        name: "cap-20ms",
        title: "(a) capacity 8 hidden behind limit 10, 20 ms calls, 429 + Retry-After: 1",
        jobs: Some(10_000),
        service_ms: Some((20, 20)),
        compare: LEARNING,
        ..BASE
    },
    Scenario {
        name: "cap-200ms",
        title: "(b) capacity 8 hidden behind limit 10, 200 ms calls, 429 + Retry-After: 1",
        jobs: Some(2_000),
        service_ms: Some((200, 200)),
        compare: LEARNING,
        ..BASE
    },
    Scenario {
        name: "cap-2s",
        title: "capacity 8 hidden behind limit 10, 2 s calls, 429 + Retry-After: 1",
        jobs: Some(400),
        service_ms: Some((2_000, 2_000)),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "cap-plain-429",
        title: "(c) capacity 8 hidden behind limit 10, 20 ms calls, a plain 429 (no Retry-After)",
        plain_429: true,
        jobs: Some(10_000),
        service_ms: Some((20, 20)),
        compare: LEARNING,
        ..BASE
    },
    Scenario {
        name: "cap-moves",
        title: "(d) limit 16; capacity 8, then 4 from a third of the jobs, then 12 from two thirds; 20 ms calls",
        limit: 16,
        phases: &[(1.0 / 3.0, 4), (2.0 / 3.0, 12)],
        jobs: Some(10_000),
        service_ms: Some((20, 20)),
        compare: LEARNING,
        ..BASE
    },
    Scenario {
        name: "nginx",
        title: "a real nginx in front: limit_conn 8, limit_conn_status 429 (plain), 200 ms calls, limit 10",
        via_nginx: true,
        plain_429: true,
        jobs: Some(2_000),
        service_ms: Some((200, 200)),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "rate-window",
        title: "(e) no concurrency cap; 500 calls in any 10 s window, then 429 + Retry-After until it frees one",
        capacity: 0,
        rate: Some((500, 10)),
        jobs: Some(2_000),
        service_ms: Some((20, 20)),
        compare: LEARNING,
        ..BASE
    },
    Scenario {
        name: "provider-headers",
        title: "600 requests/min and 100k tokens/min (200 tokens a call: 500 calls/min) announced only in OpenAI's \
                x-ratelimit-* headers; no concurrency cap; wavegate configured without budgets",
        capacity: 0,
        announced: Some(Announced {
            style: "openai",
            rpm: 600,
            tpm: 100_000,
            tokens_per_job: 200,
            keys: 1,
            configured_rpm: None,
        }),
        jobs: Some(2_000),
        service_ms: Some((20, 20)),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "provider-headers-anthropic",
        title: "the same budgets announced only in Anthropic's anthropic-ratelimit-* headers (resets in whole seconds)",
        capacity: 0,
        announced: Some(Announced {
            style: "anthropic",
            rpm: 600,
            tpm: 100_000,
            tokens_per_job: 200,
            keys: 1,
            configured_rpm: None,
        }),
        jobs: Some(2_000),
        service_ms: Some((20, 20)),
        compare: &["wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "pool-3-keys",
        title: "three API keys, each with the budgets of provider-headers (OpenAI headers), pooled by wavegate: one \
                upstream per key, a request to the key with the most headroom",
        capacity: 0,
        announced: Some(Announced {
            style: "openai",
            rpm: 600,
            tpm: 100_000,
            tokens_per_job: 200,
            keys: 3,
            configured_rpm: None,
        }),
        jobs: Some(6_000),
        service_ms: Some((20, 20)),
        compare: &["wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "learned-tighter",
        title: "wavegate configured for 1000 requests/min (bursts of 33); the provider allows 300/min and says so \
                only in OpenAI's x-ratelimit-* headers: the learned limit tightens the budget",
        capacity: 0,
        announced: Some(Announced {
            style: "openai",
            rpm: 300,
            tpm: 10_000_000,
            tokens_per_job: 1,
            keys: 1,
            configured_rpm: Some(1_000),
        }),
        jobs: Some(900),
        service_ms: Some((20, 20)),
        compare: &["wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "learned-looser",
        title: "wavegate configured for 100 requests/min (bursts of 3); the provider allows 300/min and says so in \
                OpenAI's headers: the configured budget stays (never loosened)",
        capacity: 0,
        announced: Some(Announced {
            style: "openai",
            rpm: 300,
            tpm: 10_000_000,
            tokens_per_job: 1,
            keys: 1,
            configured_rpm: Some(100),
        }),
        jobs: Some(300),
        service_ms: Some((20, 20)),
        compare: &["wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "no-cap",
        title: "(f) no hidden cap: the provider serves 16 at once, wavegate's limit is 10; 20 ms calls",
        capacity: 16,
        jobs: Some(10_000),
        service_ms: Some((20, 20)),
        compare: LEARNING,
        ..BASE
    },
    Scenario {
        name: "openai-like",
        title: "OpenAI's semantics: 400 requests/min and 600k tokens/min in buckets refilled continuously, a call \
                charged prompt (200-3,000) + max_tokens (500) at admission, x-ratelimit-* headers (reset = time to \
                a full bucket), a hidden cap of 48 at once, 0.5 % transient 500s; wavegate with no budgets, learning \
                from the headers; limit 32",
        capacity: 0,
        bucket: Some(OPENAI_LIKE),
        limit: 32,
        jobs: Some(500),
        service_ms: Some((500, 3_000)),
        callers: Some(25),
        compare: &["oracle", "wavegate-adaptive", "naive"],
        ..BASE
    },
    Scenario {
        name: "openai-like-budgets",
        title: "the same provider; wavegate configured as docs/guide.md advises (\"Choosing a burst\"): \
                requests_per_minute(400, 400), tokens_per_minute(600_000, 600_000) (a continuously refilled \
                bucket holds a minute's worth)",
        capacity: 0,
        bucket: Some(Bucket { budgets: Some((400, 400, 600_000, 600_000)), ..OPENAI_LIKE }),
        limit: 32,
        jobs: Some(500),
        service_ms: Some((500, 3_000)),
        callers: Some(25),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "openai-like-stream",
        title: "the openai-like provider, its answers streamed (server-sent chat-completion chunks over the call's \
                service time, the last with usage): the hidden cap (48) and the buckets held to each stream's \
                end; wavegate with no budgets, streams through call_stream, settled from the final usage; limit 32",
        capacity: 0,
        bucket: Some(Bucket { stream: true, ..OPENAI_LIKE }),
        limit: 32,
        jobs: Some(500),
        service_ms: Some((500, 3_000)),
        callers: Some(25),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "openai-like-stream-over-cap",
        title: "openai-like-stream with wavegate's limit at 64, above the provider's hidden cap of 48 (refused \
                with a 429 without rate-limit headers or retry-after): the cap learned from those 429s, with \
                streams held to their end",
        capacity: 0,
        bucket: Some(Bucket { stream: true, ..OPENAI_LIKE }),
        limit: 64,
        jobs: Some(500),
        service_ms: Some((500, 3_000)),
        callers: Some(25),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "anthropic-like",
        title: "Anthropic's semantics: 50 requests/min, 50,000 input tokens/min (ITPM) and 8,000 output tokens/min \
                (OTPM) enforced apart, buckets refilled continuously, output charged max_tokens at admission and \
                adjusted at the end, anthropic-ratelimit-* headers (RFC 3339 resets); every 6th call 10,000 in / \
                2,000 out, the others 500-3,000 in / up to 400 out; wavegate with no budgets; limit 32",
        capacity: 0,
        bucket: Some(ANTHROPIC_LIKE),
        limit: 32,
        jobs: Some(24),
        service_ms: Some((500, 3_000)),
        callers: Some(25),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
    Scenario {
        name: "anthropic-like-budgets",
        title: "anthropic-like with wavegate's budgets configured as the guide advises: requests_per_minute(50, 49), \
                input_tokens_per_minute(50_000, 49_000), output_tokens_per_minute(8_000, 7_840) (each burst 98 % of \
                the provider's bucket), each call's max_tokens its output part, settled from the answer's usage",
        capacity: 0,
        bucket: Some(Bucket { budgets: Some((50, 49, 50_000, 49_000)), ..ANTHROPIC_LIKE }),
        limit: 32,
        jobs: Some(24),
        service_ms: Some((500, 3_000)),
        callers: Some(25),
        compare: &["oracle", "wavegate-adaptive"],
        ..BASE
    },
];

/// The provider of the `openai-like` scenarios (issue 23's targets).
const OPENAI_LIKE: Bucket = Bucket {
    rpm: 400,
    tpm: 600_000,
    cap: 48,
    errors_per_mille: 5,
    prompt: (200, 3_000),
    max_tokens: 500,
    budgets: None,
    stream: false,
    otpm: 0,
    large_every: 0,
};

/// The provider of the `anthropic-like` scenario (Anthropic's tier 1 for a model: 50 RPM,
/// 50,000 ITPM, 8,000 OTPM).
const ANTHROPIC_LIKE: Bucket = Bucket {
    rpm: 50,
    tpm: 50_000,
    cap: 0,
    errors_per_mille: 0,
    prompt: (500, 3_000),
    max_tokens: 400,
    budgets: None,
    stream: false,
    otpm: 8_000,
    large_every: 6,
};

/// The capacity of the phase in force at call (or job) number `at`: the last of `phases`
/// (`(from, capacity)`, in order) that starts at or before it; `None` before the first or
/// without phases.
pub(crate) fn phase_at(phases: &[(u64, usize)], at: u64) -> Option<usize> {
    phases.iter().take_while(|(from, _)| *from <= at).last().map(|(_, cap)| *cap)
}

impl Scenario {
    /// The rate window the provider enforces, as (calls, seconds): its own, or the announced
    /// budgets' (the tighter of requests and tokens, per minute).
    pub(crate) fn rate_window(&self) -> Option<(u32, u64)> {
        self.rate.or(self.announced.map(|a| (a.budget_per_minute(), 60)))
    }

    /// The capacity phases the provider itself enforces (none when nginx does).
    pub(crate) fn provider_phases(&self, jobs: u64) -> Vec<(u64, usize)> {
        if self.via_nginx { Vec::new() } else { self.capacity_phases(jobs) }
    }

    /// The capacity phases for a run of `jobs`: `(served, capacity)`, empty for no cap.
    pub(crate) fn capacity_phases(&self, jobs: u64) -> Vec<(u64, usize)> {
        if self.capacity == 0 {
            return Vec::new();
        }
        let mut phases = vec![(0, self.capacity)];
        phases.extend(self.phases.iter().map(|(share, cap)| ((share * jobs as f64).round() as u64, *cap)));
        phases
    }

    /// The most calls that can be served at once over the run, for the pictures' scale.
    pub(crate) fn peak_capacity(&self) -> usize {
        self.phases.iter().map(|(_, cap)| *cap).chain([self.capacity]).max().unwrap_or(0)
    }

    /// The best completion the provider and the configured limit allow for `service` (ms, in
    /// job order), in seconds: each job's service time over the capacity of its phase or the
    /// limit, whichever is lower (a fleet that always keeps the provider full), and no sooner
    /// than the rate window lets the jobs through.
    pub(crate) fn ideal_s(&self, service: &[(u64, u64)], jobs: u64) -> f64 {
        let phases = self.capacity_phases(jobs);
        // A pool of keys has the limit once per key.
        let limit = self.limit.saturating_mul(self.announced.map_or(1, |a| a.keys.max(1)));
        let concurrency: f64 = service
            .iter()
            .map(|&(id, ms)| match phase_at(&phases, id) {
                None => ms as f64 / 1000.0 / f64::from(limit),
                Some(cap) => ms as f64 / 1000.0 / cap.min(limit as usize) as f64,
            })
            .sum();
        if let Some(bucket) = self.bucket {
            let longest = service.iter().map(|&(_, ms)| ms).max().unwrap_or(0) as f64 / 1000.0;
            return concurrency.max(bucket.admission_floor_s(jobs) + longest);
        }
        let rate = self.rate_window().map_or(0.0, |(calls, window_s)| {
            let n = service.len() as u64;
            let longest = service.iter().map(|&(_, ms)| ms).max().unwrap_or(0) as f64 / 1000.0;
            (n.div_ceil(u64::from(calls)).saturating_sub(1) * window_s) as f64 + longest
        });
        concurrency.max(rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_round_trips_and_prices_its_jobs() {
        for bucket in [OPENAI_LIKE, Bucket { budgets: Some((400, 20, 600_000, 16_000)), ..OPENAI_LIKE }] {
            assert_eq!(Bucket::parse(&bucket.to_field()), Some(bucket));
        }
        assert_eq!(Bucket::parse("1,2,3"), None);
        let costs: Vec<u64> = (0..500).map(|id| OPENAI_LIKE.cost_of(id)).collect();
        assert!(costs.iter().all(|c| (700..=3_500).contains(c)));
        let mean = costs.iter().sum::<u64>() as f64 / 500.0;
        assert!((1_900.0..2_300.0).contains(&mean), "mean {mean}");
        // ~1.05M tokens, 600k at once, 10k a second after: about 45 s.
        let floor = OPENAI_LIKE.admission_floor_s(500);
        assert!((35.0..55.0).contains(&floor), "{floor}");
    }

    #[test]
    fn the_anthropic_job_mix_has_its_large_calls() {
        let b = ANTHROPIC_LIKE;
        assert_eq!(Bucket::parse(&Bucket { stream: true, ..b }.to_field()), Some(Bucket { stream: true, ..b }));
        let large: Vec<u64> = (0..24).filter(|&id| b.is_large(id)).collect();
        assert_eq!(large, [0, 6, 12, 18]);
        assert_eq!((b.prompt_of(6), b.max_tokens_of(6), b.output_of(6), b.cost_of(6)), (10_000, 2_000, 2_000, 12_000));
        assert!((1..24).filter(|id| !b.is_large(*id)).all(|id| (100..=400).contains(&b.output_of(id))));
        assert!(b.max_tokens_of(1) == 400 && (500..=3_000).contains(&b.prompt_of(1)));
        // The output binds: 8,000 at once, then 133 a second.
        let floor = b.admission_floor_s(24);
        assert!((20.0..60.0).contains(&floor), "{floor}");
    }
}

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
    /// Whether the command line set the jobs (so a scenario's own count does not apply).
    pub(crate) jobs_given: bool,
    /// Whether the command line set the callers per process.
    pub(crate) callers_given: bool,
    /// Whether the command line set the service time.
    pub(crate) service_given: bool,
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
            jobs_given: false,
            callers_given: false,
            service_given: false,
        }
    }

    /// The sizes `scenario` runs with: its own job count (a tenth in a quick run) and service
    /// time, unless the command line gave them.
    pub(crate) fn for_scenario(&self, scenario: &Scenario, quick: bool) -> Self {
        let mut sizes = self.clone();
        if let (Some(jobs), false) = (scenario.jobs, self.jobs_given) {
            sizes.jobs = if quick { (jobs / 10).max(1) } else { jobs };
        }
        if let (Some(callers), false) = (scenario.callers, self.callers_given) {
            sizes.callers = callers;
        }
        if let (Some(service), false) = (scenario.service_ms, self.service_given) {
            sizes.service_ms = service;
        }
        sizes
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
