//! The gate that takes over when the shared store goes away: this process's share of the
//! fleet's, carrying what the store last said.
//!
//! One function, [`LocalGate::fallback`], with these rules (each pinned by a case of
//! `wavegate_core::spec::fallback_cases`, the `spec` feature):
//!
//! 1. **the share of the limit**: `max(1, limit ÷ live processes)` (or the configured
//!    `fallback_limit`); with no heartbeat seen yet, as many processes as the limit (each
//!    takes the `fallback_limit`, else 1), so the fleet in fallback never sends more than
//!    the limit;
//! 2. **the budgets' share**: the configured rate budgets, the classes' own shares of them and
//!    the limits learned from the provider are all divided by the same number of processes;
//! 3. **recent grants charged**: this process's grants of the last minute are charged to its
//!    share as they happened (to the input and output budgets too), so a switch (or a flapping
//!    store) hands out no fresh burst;
//! 4. **the day budgets' share starts from what the store last said is left** (its acquire
//!    replies say it): `left ÷ processes` of each, refilling at the share's rate from when it
//!    was said; this process's grants since then (however old, those of earlier fallbacks too)
//!    are charged to it, in debt if they must (a day's units stay spent). So a day the fleet
//!    has spent stays spent through an outage, and a store that flaps hands out no fresh day.
//!    A process that never heard the store starts with a full share, its recent grants
//!    charged;
//! 5. **a shared cooldown in force goes on**: COOLDOWN for the rest of it, at half the share
//!    (at least 1), the threshold there;
//! 6. **a recovery in progress goes on** (PROBE, DEGRADED): at the share of its limit,
//!    `max(1, limit × share ÷ base)`;
//! 7. **each held permit is adopted**, its wave mapped to the new numbering: the fallback's
//!    own wave in NORMAL, the one before otherwise ([`LocalGate::adopt`]); a permit of a
//!    shared wave older than the last one seen stays older (its 429 is late here too);
//! 8. **an estimate above the share's burst is admitted in debt**: the largest estimate that
//!    fits is the fleet's burst in force (the configured one tightened by a learned limit;
//!    for a capped class its share of the configured one), as in shared mode; one above the
//!    share's own burst waits until the share's bucket is full, then is admitted and the
//!    bucket goes into debt, so the calls after it wait until it is paid back
//!    ([`Gcra::check_in_debt`](crate::Gcra::check_in_debt)). So 20 processes whose tokens
//!    share has a burst of 800 still send calls of 4,000 tokens, one per 24 s each at 10,000
//!    a minute, instead of refusing them for the whole outage; the fleet stays within its
//!    rate (each share within `estimate + rate × W` in any window `W`).

use std::num::NonZeroU32;

use crate::charge_start::ChargeStart;
use crate::class_budget::class_share;
use crate::clock::duration_ms;
use crate::config::UpstreamConfig;
use crate::gcra::{Budgets, DayBudget, Gcra};
use crate::learned_limit::LearnedBudgets;
use crate::provider_window::ProviderWindows;
use crate::wave::WaveState;

use super::{LocalGate, split};

/// What a process last saw of the shared store's wave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LastShared {
    /// The last state and limit seen, if any.
    pub state: Option<(WaveState, u32)>,
    /// The last shared wave seen (0: none yet).
    pub wave: u64,
    /// What is left of a shared cooldown seen in force, in ms (`None` or 0: none runs).
    pub cooldown_left_ms: Option<u64>,
}

/// What the shared store last said is left of the fleet's day budgets (the acquire script's
/// replies say it, granted or denied): a fallback's day shares start from it (rule 4 of
/// [`LocalGate::fallback`]'s module).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DayLeft {
    /// Requests left of the requests per day budget (`None`: the store has none).
    pub requests: Option<u64>,
    /// Tokens left of the tokens per day budget (`None`: the store has none).
    pub tokens: Option<u64>,
}

impl DayLeft {
    /// What is left at `now_ms` of `budgets`' days, of which this much was left at `at_ms` and
    /// `used` (requests, tokens) has been used since: the refill since pays for what it can.
    ///
    /// ```
    /// use wavegate_core::{Budgets, DayBudget, DayLeft};
    ///
    /// // 24 requests a day (one an hour), all at once; 4 left, 6 used since, 3 hours ago.
    /// let budgets = Budgets { requests_per_day: DayBudget::new(24, 24), ..Budgets::default() };
    /// let hour = 3_600_000;
    /// let then = DayLeft { requests: Some(4), tokens: None };
    /// assert_eq!(then.at(budgets, 10 * hour, (6, 0), 13 * hour), DayLeft { requests: Some(1), tokens: None });
    /// ```
    pub fn at(self, budgets: Budgets, at_ms: u64, used: (u64, u64), now_ms: u64) -> DayLeft {
        self.after(budgets, at_ms, (used, ChargeStart::default()), now_ms)
    }

    /// [`at`](Self::at), the use since charged from the latest start its times allow
    /// ([`ChargeStart`]; from `at_ms` before any): a use just before `now_ms` is not paid by
    /// the refill since `at_ms`.
    pub fn after(
        self,
        budgets: Budgets,
        at_ms: u64,
        ((requests, tokens), from): ((u64, u64), ChargeStart),
        now_ms: u64,
    ) -> DayLeft {
        let from_ms = from.at_ms().map_or(at_ms, |from| from.max(at_ms));
        let (at_us, from_us) = (at_ms.saturating_mul(1000), from_ms.saturating_mul(1000));
        let now_us = now_ms.saturating_mul(1000).max(from_us);
        let one = |budget: Option<DayBudget>, left: Option<u64>, used: u64| {
            let gcra = Gcra::daily(budget?);
            let tat = gcra.charge(gcra.tat_leaving(left?, at_us), from_us, used);
            Some(gcra.remaining(tat, now_us).0)
        };
        DayLeft {
            requests: one(budgets.requests_per_day, self.requests, requests),
            tokens: one(budgets.tokens_per_day, self.tokens, tokens),
        }
    }
}

/// What [`LocalGate::fallback`] starts from: what the process knows at the switch.
#[derive(Debug, Clone, Default)]
pub struct FallbackStart<K> {
    /// Live processes at the last heartbeat (`None`: no heartbeat has answered yet).
    pub live: Option<u32>,
    /// The shared wave as last seen.
    pub last_shared: LastShared,
    /// This process's grants of the last minute: (when, in the gate's clock ms; tokens
    /// reserved; of them, output).
    pub recent_grants: Vec<(u64, u64, u64)>,
    /// What the store last said is left of the day budgets, and when (in the gate's clock
    /// ms); `None` if it never said.
    pub day_left: Option<(DayLeft, u64)>,
    /// This process's requests and tokens used since `day_left` was said and not counted in
    /// it (fallbacks' grants, settlements above or below a reservation): charged to the day
    /// shares.
    pub day_used_since: (u64, u64),
    /// The latest start `day_used_since` can be charged from ([`ChargeStart`]: its uses'
    /// times, in the gate's clock ms); before none, from when `day_left` was said.
    pub day_used_from: ChargeStart,
    /// The limits learned from the provider, undivided (as the provider said them).
    pub learned: LearnedBudgets,
    /// The permits this process holds, each with the shared wave it was granted in.
    pub held: Vec<(K, u64)>,
    /// The provider's windows as this process knew them (its in-process gate's, from the
    /// answers it took in; not counting the fleet's grants since): a window that was spent
    /// stays spent through the outage.
    pub windows: ProviderWindows,
}

/// The gate a fallback starts with.
#[derive(Debug, Clone)]
pub struct Fallback<K> {
    /// The gate: this process's share, the store's last state carried, the held permits in.
    pub gate: LocalGate,
    /// Its limit: this process's share of the upstream's.
    pub share: NonZeroU32,
    /// How many processes the budgets were divided among.
    pub processes: u32,
    /// Each held permit with its wave in the gate's numbering.
    pub held: Vec<(K, u64)>,
}

impl LocalGate {
    /// This gate's budgets are a share of the fleet's `fleet` (configured, undivided): the
    /// largest estimate that fits is the fleet's burst in force, not the share's, and an
    /// estimate above the share's burst is admitted against the share's rate when its bucket
    /// is full, in debt (rule 8 of the module). [`fallback`](Self::fallback) sets it.
    pub fn with_fleet_budgets(mut self, fleet: Budgets) -> Self {
        self.fleet = Some(fleet);
        self.class_budgets = self.class_budgets.in_debt();
        self
    }

    /// The budgets whose bursts bound an estimate at `now_ms`: the fleet's in a fallback, this
    /// gate's otherwise; each tightened by the learned limits.
    pub(super) fn ceiling_budgets(&self, now_ms: u64) -> Budgets {
        match self.fleet {
            Some(fleet) => self.learned.effective(fleet, now_ms, 1),
            None => self.budgets(now_ms),
        }
    }

    /// The tokens burst of class `class`'s own budget, if it has one: in a fallback its share
    /// of the fleet's budget in force, otherwise of this gate's.
    pub(super) fn class_tokens_burst(&self, class: usize, now_ms: u64) -> Option<u64> {
        match (self.fleet.and_then(|_| self.ceiling_budgets(now_ms).tokens), self.classes.get(class)) {
            (Some(tokens), Some(c)) if c.budget_percent_value() < 100 => {
                Some(u64::from(class_share(tokens, c.budget_percent_value()).burst()))
            }
            (Some(_), _) => None,
            (None, _) => self.class_budgets.tokens_burst(class, self.budgets(now_ms)),
        }
    }

    /// The gate that takes over `config`'s upstream when the shared store goes away at
    /// `now_ms`: see the module's rules.
    pub fn fallback<K: AsRef<str>>(config: &UpstreamConfig, start: FallbackStart<K>, now_ms: u64) -> Fallback<K> {
        let base = config.limit().get();
        // Until a heartbeat has told how many processes share the limit, assume the worst:
        // as many as the limit, so each takes one (or the configured fallback limit).
        let (share, processes) = match start.live {
            Some(live) => (config.fallback_share(live), live.max(1)),
            None => (config.fallback_limit().unwrap_or(NonZeroU32::MIN), base),
        };
        let mut wave = config.wave().clone();
        wave.base_limit = share;
        let mut gate = LocalGate::with_budgets(wave, config.budgets().share(processes))
            .with_learned(start.learned, processes)
            .with_classes(config.classes(), config.default_class(), config.class_count_window())
            .with_fleet_budgets(config.budgets());
        gate.windows = start.windows;
        if let Some((left, at_ms)) = start.day_left {
            gate.start_day_share(left, processes, at_ms);
            // Charged from the latest start its uses allow (from the word, a share spent just
            // before this fallback was paid by a refill it never banked: a second share).
            let (requests, tokens) = start.day_used_since;
            let from = start.day_used_from.at_ms().map_or(at_ms, |from| from.max(at_ms));
            gate.charge_day(requests, tokens, from, now_ms.max(from));
        }
        for &(at_ms, tokens, output) in &start.recent_grants {
            gate.charge_minute(1, tokens, at_ms);
            if start.day_left.is_none() {
                gate.charge_day(1, tokens, at_ms, at_ms);
            }
            gate.charge_split(split::parts(tokens, output), at_ms);
        }
        let last = start.last_shared;
        let mut snapshot = gate.machine().snapshot();
        if let Some(left) = last.cooldown_left_ms.filter(|left| *left > 0) {
            snapshot.state = WaveState::Cooldown;
            snapshot.limit = (share.get() / 2).max(1);
            snapshot.threshold = snapshot.limit;
            snapshot.cooldown_until_ms = now_ms.saturating_add(left);
            gate.machine_mut().restore(snapshot);
        } else if let Some((state @ (WaveState::Probe | WaveState::Degraded), limit)) = last.state {
            snapshot.state = state;
            snapshot.limit = (u64::from(limit) * u64::from(share.get()) / u64::from(base)).max(1) as u32;
            gate.machine_mut().restore(snapshot);
        }
        let lease_ms = duration_ms(config.permit_ttl());
        let held = start
            .held
            .into_iter()
            .map(|(id, shared_wave)| {
                let local = gate.adopt(id.as_ref(), now_ms, lease_ms);
                let wave = if shared_wave < last.wave { local.saturating_sub(1) } else { local };
                (id, wave)
            })
            .collect();
        Fallback { gate, share, processes, held }
    }
}
