//! What an in-process gate proves about the earliest grant (see [`crate::deadline`]).

use super::LocalGate;
use crate::deadline::Hold;
use crate::gcra::{DayBudget, Gcra, RateBudget};
use crate::wave::{DenyReason, WaveState};

impl LocalGate {
    /// A proved lower bound on the time until an ask of `tokens` can be granted at `now_ms`
    /// (`None`: it may be granted now, or nothing proves otherwise). `refundable` is every
    /// token the permits held here reserved, when the caller knows it (`None`: the tokens
    /// budget proves nothing). The latest of:
    ///
    /// * the rest of a cooldown;
    /// * the provider's windows, while no permit is held (no answer can end them sooner);
    /// * the requests budget's next room, and the tokens budget's with `refundable` counted
    ///   as refunded at once ([`Gcra::earliest_ms`]), each under the loosest budget that may
    ///   be in force before then (the configured one, should a learned limit be forgotten;
    ///   nothing when only a learned limit makes the budget);
    /// * the same for the requests and tokens per day.
    ///
    /// ```
    /// use wavegate_core::{Ask, DenyReason, Instance, LocalGate, PermitId, UpstreamConfig};
    ///
    /// let config = UpstreamConfig::builder("llm").limit(5).requests_per_minute(60, 1).build()?;
    /// let mut gate = LocalGate::for_upstream(&config);
    /// let me = Instance::new("me").unwrap();
    /// let ask = [Ask { id: PermitId::new(None, &me, 1, None), tokens: 0, output: 0, waiting: 1 }];
    /// assert!(gate.acquire(&me, &ask, 30_000, 0).is_granted());
    /// // One request a second, burst 1: the next cannot come before 1 s.
    /// let hold = gate.proven_hold(0, Some(0), 0).expect("a proof");
    /// assert_eq!((hold.reason, hold.wait_ms), (DenyReason::RequestBudget, 1_000));
    /// # Ok::<(), wavegate_core::ConfigError>(())
    /// ```
    pub fn proven_hold(&self, tokens: u64, refundable: Option<u64>, now_ms: u64) -> Option<Hold> {
        let snapshot = self.machine.snapshot();
        let cooldown = (snapshot.state == WaveState::Cooldown)
            .then(|| Hold::of(DenyReason::Cooldown, snapshot.cooldown_until_ms.saturating_sub(now_ms)))
            .flatten();
        let running = self.ledger.iter().any(|(_, permit)| permit.expires_ms > now_ms);
        let window = if running { None } else { self.windows.least_wait_ms(now_ms, tokens) }
            .and_then(|wait| Hold::of(DenyReason::ProviderWindow, wait));
        let now_us = now_ms.saturating_mul(1000);
        let (in_force, configured) = (self.budgets(now_ms), self.configured);
        let earliest = |in_force: Option<RateBudget>, configured: Option<RateBudget>, tat, cost, refund, debt| {
            // The budget in force now, or the configured one once a learned limit is gone.
            let wait = |budget: RateBudget| Gcra::new(budget).earliest_ms(tat, now_us, cost, refund, debt);
            Some(wait(in_force?).min(wait(configured?)))
        };
        let requests = earliest(in_force.requests, configured.requests, self.requests_tat, 1, 0, false)
            .and_then(|wait| Hold::of(DenyReason::RequestBudget, wait));
        let debt = self.fleet.is_some();
        let tokens_hold = refundable
            .and_then(|refund| earliest(in_force.tokens, configured.tokens, self.tokens_tat, tokens, refund, debt))
            .and_then(|wait| Hold::of(DenyReason::TokenBudget, wait));
        // The day budgets (never learned: in force as configured).
        let day = |budget: Option<DayBudget>, tat, cost, refund| {
            Some(Gcra::daily(budget?).earliest_ms(tat, now_us, cost, refund, debt))
        };
        let requests_day = day(in_force.requests_per_day, self.requests_day_tat, 1, 0)
            .and_then(|wait| Hold::of(DenyReason::RequestBudget, wait));
        let tokens_day = refundable
            .and_then(|refund| day(in_force.tokens_per_day, self.tokens_day_tat, tokens, refund))
            .and_then(|wait| Hold::of(DenyReason::TokenBudget, wait));
        [window, requests, tokens_hold, requests_day, tokens_day].into_iter().fold(cooldown, Hold::latest)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Ask, DenyReason, Instance, LocalGate, PermitId, UpstreamConfig, WaveSignal, WindowReport};

    fn ask(me: &Instance, n: u64, tokens: u64) -> [Ask; 1] {
        [Ask { id: PermitId::new(None, me, n, None), tokens, output: 0, waiting: 1 }]
    }

    #[test]
    fn the_tokens_budget_counts_every_reserved_token_as_refundable() {
        // 600 tokens a minute (10 a second), burst 100.
        let config = UpstreamConfig::builder("llm").limit(5).tokens_per_minute(600, 100).build().expect("valid");
        let mut gate = LocalGate::for_upstream(&config);
        let me = Instance::new("me").unwrap();
        assert!(gate.acquire(&me, &ask(&me, 1, 100), 30_000, 0).is_granted());
        // 100 more tokens: 10 s at the least, nothing refundable.
        let wait = |gate: &LocalGate, refund| gate.proven_hold(100, refund, 0).map(|h| (h.reason, h.wait_ms));
        assert_eq!(wait(&gate, Some(0)), Some((DenyReason::TokenBudget, 10_000)));
        // The running call may settle at 40 tokens: 60 back, 4 s at the least.
        assert_eq!(wait(&gate, Some(60)), Some((DenyReason::TokenBudget, 4_000)));
        // All 100 may come back: no proof; an unknown refund proves nothing either.
        assert_eq!(wait(&gate, Some(100)), None);
        assert_eq!(wait(&gate, None), None);
    }

    #[test]
    fn a_window_proves_nothing_while_a_call_can_still_answer() {
        let config = UpstreamConfig::builder("llm").limit(5).build().expect("valid");
        let mut gate = LocalGate::for_upstream(&config);
        let me = Instance::new("me").unwrap();
        let Some(crate::Decision::Granted { id, wave, .. }) = Some(gate.acquire(&me, &ask(&me, 1, 0), 30_000, 0))
        else {
            panic!("granted")
        };
        gate.report_window(id.as_str(), WindowReport::spent_for(std::time::Duration::from_secs(30)), 0, 0);
        assert_eq!(gate.proven_hold(0, Some(0), 10), None, "the permit held may answer");
        gate.finish(&id, wave, WaveSignal::Success, 0, 20);
        let hold = gate.proven_hold(0, Some(0), 1_000).expect("nothing can end it now");
        assert_eq!((hold.reason, hold.wait_ms), (DenyReason::ProviderWindow, 29_000));
    }

    #[test]
    fn a_learned_limit_that_may_be_forgotten_proves_only_what_the_configured_budget_does() {
        use crate::{LearnedBudgets, LearnedLimit, LearnedLimits};
        // The provider announced 2 requests a minute (burst 2).
        let announced = LearnedLimit { limit: 2, window_ms: 60_000 };
        let mut learned = LearnedBudgets::default();
        learned.report(LearnedLimits { requests: Some(announced), tokens: None, ..LearnedLimits::default() }, 0);
        let me = Instance::new("me").unwrap();
        let drained = |config: &UpstreamConfig| {
            let mut gate = LocalGate::for_upstream(config).with_learned(learned, 1);
            assert!(gate.acquire(&me, &ask(&me, 1, 0), 30_000, 0).is_granted());
            assert!(gate.acquire(&me, &ask(&me, 2, 0), 30_000, 0).is_granted());
            assert!(!gate.acquire(&me, &ask(&me, 3, 0), 30_000, 0).is_granted(), "the learned budget refuses");
            gate
        };
        // No configured budget: the learned one alone may be forgotten, so it proves nothing.
        let bare = UpstreamConfig::builder("llm").limit(5).build().expect("valid");
        assert_eq!(drained(&bare).proven_hold(0, Some(0), 0), None);
        // A configured 60 a minute, burst 2: the TAT the learned budget left (60 s ahead) holds
        // either way (the configured budget would need 59 s), so the sooner, 30 s, is proved.
        let configured = UpstreamConfig::builder("llm").limit(5).requests_per_minute(60, 2).build().expect("valid");
        let hold = drained(&configured).proven_hold(0, Some(0), 0).expect("the configured budget proves");
        assert_eq!((hold.reason, hold.wait_ms), (DenyReason::RequestBudget, 30_000));
        // A configured 120 a minute, burst 120: room in 500 ms once the learned one is gone.
        let loose = UpstreamConfig::builder("llm").limit(5).requests_per_minute(120, 120).build().expect("valid");
        let hold = drained(&loose).proven_hold(0, Some(0), 0).expect("the configured budget proves");
        assert_eq!(hold.wait_ms, 500);
    }

    #[test]
    fn a_spent_day_proves_hours() {
        // 2 requests a day, both at once; 1,000 tokens a day.
        let config = UpstreamConfig::builder("groq")
            .limit(5)
            .requests_per_day(2, 2)
            .tokens_per_day(1_000, 1_000)
            .build()
            .expect("valid");
        let mut gate = LocalGate::for_upstream(&config);
        let me = Instance::new("me").unwrap();
        assert!(gate.acquire(&me, &ask(&me, 1, 900), 30_000, 0).is_granted());
        // 200 more tokens: 100 short, 100 × 86.4 s, or nothing proved if the call refunds.
        let hold = gate.proven_hold(200, Some(0), 0).expect("the tokens per day prove");
        assert_eq!((hold.reason, hold.wait_ms), (DenyReason::TokenBudget, 8_640_000));
        assert_eq!(gate.proven_hold(200, Some(900), 0), None);
        assert!(gate.acquire(&me, &ask(&me, 2, 0), 30_000, 0).is_granted());
        // Both requests of the day spent: half a day for the third.
        let hold = gate.proven_hold(0, Some(900), 0).expect("the requests per day prove");
        assert_eq!((hold.reason, hold.wait_ms), (DenyReason::RequestBudget, 43_200_000));
    }
}
