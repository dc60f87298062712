//! The configuration a drawn nemesis seed runs: the fleet, the upstream's settings (limit,
//! classes with weights, reserves and budget shares, tenants, requests and tokens per minute,
//! requests per day, cooldowns, quota pause, waits, deadlines) and the provider (its headers, its windows and how
//! they flip, how hostile its answers are). Drawn from the seed alone, so the orchestrator and
//! every worker draw the same one.

use std::fmt;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wavegate::UpstreamConfig;
use wavegate_testkit::{HeaderStyle, ProviderLimits};

#[derive(Debug, Clone)]
pub(crate) struct Class {
    pub(crate) name: String,
    pub(crate) weight: u32,
    pub(crate) reserve: u8,
    /// Its share of the rate budgets, percent (100: uncapped).
    pub(crate) budget: u8,
}

#[derive(Debug, Clone)]
pub(crate) struct Drawn {
    pub(crate) processes: usize,
    pub(crate) callers: usize,
    pub(crate) limit: u32,
    pub(crate) service: Duration,
    /// None: no classes (every caller in the one class, called `c0` in the record).
    pub(crate) classes: Vec<Class>,
    pub(crate) tenants: u32,
    /// (per minute, burst).
    pub(crate) rpm: Option<(u32, u32)>,
    pub(crate) tpm: Option<(u32, u32)>,
    /// A requests-per-day budget (per day, burst): a day that binds within the run (its burst
    /// spent in seconds, then its refill of a few requests a second), through every fault.
    pub(crate) rpd: Option<(u64, u64)>,
    /// Token estimates are drawn in this range (inclusive) when `tpm` is set.
    pub(crate) estimate: (u64, u64),
    pub(crate) max_cooldown: Duration,
    pub(crate) quota_pause: Duration,
    pub(crate) max_wait: Duration,
    /// How long a call cut by its deadline at the provider keeps its permit.
    pub(crate) cancelled_call_hold: Duration,
    /// Each call's deadline is drawn in this range (ms).
    pub(crate) deadline_ms: (u64, u64),
    pub(crate) style: HeaderStyle,
    pub(crate) window: Duration,
    /// The provider's requests per window: tight and generous, flipping every 2–5 s.
    pub(crate) provider_requests: (u64, u64),
    pub(crate) provider_tokens: Option<(u64, u64)>,
    /// The chance that one answer is made hostile.
    pub(crate) hostility: f64,
    /// How far the provider's clock is off (its dated resets), ms.
    pub(crate) skew_ms: i64,
}

impl Drawn {
    pub(crate) fn from_seed(seed: u64) -> Drawn {
        // A generator of its own: the fault schedule draws from another.
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0000);
        let limit = rng.random_range(4..=12);
        let service = Duration::from_millis(rng.random_range(50..=150));
        let n_classes = rng.random_range(0..=3usize);
        let rpm = rng.random_bool(0.7).then(|| {
            // From a third of what the limit could serve to a little more than it.
            let capacity = f64::from(limit) * 1_000.0 / service.as_millis() as f64 * 60.0;
            let per_minute = (capacity * rng.random_range(0.3..1.2)) as u32;
            (per_minute.max(60), rng.random_range(2..=limit * 2))
        });
        let estimate = (rng.random_range(10..=100u64), rng.random_range(150..=400u64));
        let tpm = rng.random_bool(0.5).then(|| {
            let capacity = f64::from(limit) * 1_000.0 / service.as_millis() as f64 * 60.0;
            let mean = (estimate.0 + estimate.1) as f64 / 2.0;
            let per_minute = (capacity * mean * rng.random_range(0.3..1.2)) as u32;
            // A burst that holds a capped class's largest estimate too (shares from 20 %).
            (per_minute.max(6_000), rng.random_range(estimate.1 as u32 * 5..=estimate.1 as u32 * 8))
        });
        let budgets = rpm.is_some() || tpm.is_some();
        let classes = (0..n_classes)
            .map(|i| Class {
                name: format!("c{i}"),
                weight: rng.random_range(1..=5),
                reserve: if rng.random_bool(0.35) { rng.random_range(10..=30) } else { 0 },
                // The default class (c0) is never capped, so the fleet can always use the
                // whole budget.
                budget: if i > 0 && budgets && rng.random_bool(0.5) { rng.random_range(20..=70) } else { 100 },
            })
            .collect();
        let window = Duration::from_millis(rng.random_range(1_000..=3_000));
        let per_window = |per_s: f64| (per_s * window.as_secs_f64()).max(1.0) as u64;
        let fleet_rate = f64::from(limit) * 1_000.0 / service.as_millis() as f64;
        // Tight: below what the configured budget lets through, so the provider refuses.
        let budget_rate = rpm.map_or(fleet_rate, |(per_minute, _)| fleet_rate.min(f64::from(per_minute) / 60.0));
        let provider_requests = (per_window(budget_rate * 0.4), per_window(fleet_rate * 3.0));
        let provider_tokens =
            tpm.map(|(per_minute, _)| (per_window(f64::from(per_minute) / 60.0 * 0.6), per_window(1e6)));
        let style = [HeaderStyle::OpenAi, HeaderStyle::Anthropic, HeaderStyle::Ietf][rng.random_range(0..3)];
        let deadline_lo = rng.random_range(800..=2_000);
        let mut drawn = Drawn {
            processes: rng.random_range(3..=4),
            callers: rng.random_range(8..=20),
            limit,
            service,
            classes,
            tenants: rng.random_range(0..=4),
            rpm,
            tpm,
            estimate,
            max_cooldown: Duration::from_millis(rng.random_range(3_000..=8_000)),
            quota_pause: Duration::from_millis(rng.random_range(1_500..=4_000)),
            max_wait: Duration::from_millis(rng.random_range(1_500..=6_000)),
            cancelled_call_hold: service * 3,
            deadline_ms: (deadline_lo, deadline_lo + rng.random_range(500..=5_000)),
            style,
            window,
            provider_requests,
            provider_tokens,
            hostility: rng.random_range(0.03..0.15),
            skew_ms: rng.random_range(-10_000..=10_000),
            rpd: None,
        };
        // Drawn last, so the seeds drawn before it keep the rest of their configuration.
        drawn.rpd = rng.random_bool(0.4).then(|| {
            let per_second = rng.random_range(2.0..=6.0f64).min(fleet_rate * 0.5);
            ((per_second * 86_400.0) as u64, rng.random_range(10..=40u64))
        });
        drawn
    }

    /// The upstream `mock` as every worker configures it.
    pub(crate) fn upstream(&self) -> UpstreamConfig {
        let mut b = UpstreamConfig::builder("mock")
            .limit(self.limit)
            .max_cooldown(self.max_cooldown)
            .cooldown_ladder([Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(3)])
            .quota_pause(self.quota_pause)
            .max_wait(self.max_wait)
            .call_timeout(Duration::from_secs(5))
            .cancelled_call_hold(self.cancelled_call_hold);
        if let Some((per_minute, burst)) = self.rpm {
            b = b.requests_per_minute(per_minute, burst);
        }
        if let Some((per_minute, burst)) = self.tpm {
            b = b.tokens_per_minute(per_minute, burst);
        }
        if let Some((per_day, burst)) = self.rpd {
            b = b.requests_per_day(per_day, burst);
        }
        for class in &self.classes {
            b = b.class(class.name.clone(), class.weight);
            if class.reserve > 0 {
                b = b.reserve(&class.name, class.reserve);
            }
            if class.budget < 100 {
                b = b.class_budget(&class.name, class.budget);
            }
        }
        b.build().expect("a drawn configuration is valid")
    }

    /// The provider's limits, tight or generous.
    pub(crate) fn provider(&self, tight: bool, quota_exhausted: bool) -> ProviderLimits {
        let pick = |(t, g): (u64, u64)| if tight { t } else { g };
        ProviderLimits {
            style: self.style,
            requests: Some(pick(self.provider_requests)),
            tokens: self.provider_tokens.map(pick),
            window: self.window,
            quota_exhausted,
        }
    }

    /// The names of the classes callers use (`c0` alone without classes).
    pub(crate) fn class_names(&self) -> Vec<String> {
        if self.classes.is_empty() { vec!["c0".into()] } else { self.classes.iter().map(|c| c.name.clone()).collect() }
    }

    pub(crate) fn weight_sum(&self) -> u32 {
        self.classes.iter().map(|c| c.weight).sum::<u32>().max(1)
    }
}

impl fmt::Display for Drawn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let classes: Vec<String> = self
            .classes
            .iter()
            .map(|c| format!("{} w{} reserve {}% budget {}%", c.name, c.weight, c.reserve, c.budget))
            .collect();
        write!(
            f,
            "{} processes × {} callers, limit {}, {} ms calls; classes [{}]; {} tenants; rpm {:?}; tpm {:?} \
             (estimates {}–{}); rpd {:?}; max_cooldown {} ms, quota_pause {} ms, max_wait {} ms, deadlines {}–{} ms; \
             provider {} window {} ms, requests {:?}, tokens {:?} per window, hostile {:.0} %, clock skew {} ms",
            self.processes,
            self.callers,
            self.limit,
            self.service.as_millis(),
            classes.join(", "),
            self.tenants,
            self.rpm,
            self.tpm,
            self.estimate.0,
            self.estimate.1,
            self.rpd,
            self.max_cooldown.as_millis(),
            self.quota_pause.as_millis(),
            self.max_wait.as_millis(),
            self.deadline_ms.0,
            self.deadline_ms.1,
            self.style.as_str(),
            self.window.as_millis(),
            self.provider_requests,
            self.provider_tokens,
            self.hostility * 100.0,
            self.skew_ms
        )
    }
}
