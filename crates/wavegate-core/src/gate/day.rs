//! The requests and tokens per day budgets (Groq's and Cerebras's RPD and TPD), besides the
//! per-minute ones: an ask takes one request and its estimate from them, together with the
//! other budgets or not at all; a refusal is the requests' or the tokens' (its wait may be
//! hours). The usage settles the tokens per day as it settles the tokens per minute.
//! `lua/acquire.lua`'s `day_check`, `lua/finish.lua` and `lua/status.lua` are the twins.

use crate::gcra::{Budgets, DayBudget, Gcra};

use super::{DayLeft, LocalGate};

/// A day budget's answer to an ask: the new TAT to keep (`None` without the budget), or the ms
/// to wait.
pub(super) type DayCheck = Result<Option<u64>, u64>;

impl LocalGate {
    /// Whether one request and `tokens` fit the day budgets in force at `now_us`: the requests'
    /// and the tokens' answers.
    pub(super) fn day_check(&self, budgets: Budgets, tokens: u64, now_us: u64) -> [DayCheck; 2] {
        let in_debt = self.fleet.is_some();
        let check = |budget: Option<DayBudget>, tat: u64, cost: u64| {
            budget
                .map(|b| {
                    let gcra = Gcra::daily(b);
                    if in_debt { gcra.check_in_debt(tat, now_us, cost) } else { gcra.check(tat, now_us, cost) }
                })
                .transpose()
        };
        [
            check(budgets.requests_per_day, self.requests_day_tat, 1),
            check(budgets.tokens_per_day, self.tokens_day_tat, tokens),
        ]
    }

    /// Keeps the TATs a passed [`day_check`](Self::day_check) gave.
    pub(super) fn day_charge(&mut self, requests: Option<u64>, tokens: Option<u64>) {
        if let Some(tat) = requests {
            self.requests_day_tat = tat;
        }
        if let Some(tat) = tokens {
            self.tokens_day_tat = tat;
        }
    }

    /// Whether `tokens` are above the tokens per day burst in force (in a fallback the
    /// fleet's): such an ask never fits.
    pub(super) fn day_exceeds_burst(&self, tokens: u64, now_ms: u64) -> bool {
        self.ceiling_budgets(now_ms).tokens_per_day.is_some_and(|b| tokens > b.burst())
    }

    /// Charges requests and tokens used elsewhere since `began_ms` to the day budgets
    /// ([`Gcra::charge_since`]): unlike a minute's, a day's units used an hour ago are still
    /// spent, in debt if they must (a day of it at most); the refill since `began_ms` paid for
    /// part of them. `reconcile.lua` is the twin.
    pub(super) fn charge_day(&mut self, requests: u64, tokens: u64, began_ms: u64, now_ms: u64) {
        let (began_us, now_us) = (began_ms.saturating_mul(1000), now_ms.saturating_mul(1000));
        let budgets = self.budgets(now_ms);
        if let Some(budget) = budgets.requests_per_day.filter(|_| requests > 0) {
            self.requests_day_tat = Gcra::daily(budget).charge_since(self.requests_day_tat, began_us, now_us, requests);
        }
        if let Some(budget) = budgets.tokens_per_day.filter(|_| tokens > 0) {
            self.tokens_day_tat = Gcra::daily(budget).charge_since(self.tokens_day_tat, began_us, now_us, tokens);
        }
    }

    /// A fallback's day budgets (this gate's: the share's) start from what the store said was
    /// left of the fleet's at `at_ms`: `left ÷ processes` each (rule 4 of the fallback).
    pub(super) fn start_day_share(&mut self, left: DayLeft, processes: u32, at_ms: u64) {
        let at_us = at_ms.saturating_mul(1000);
        let budgets = self.budgets(at_ms);
        let share = |left: u64| left / u64::from(processes.max(1));
        if let (Some(budget), Some(left)) = (budgets.requests_per_day, left.requests) {
            self.requests_day_tat = Gcra::daily(budget).tat_leaving(share(left), at_us);
        }
        if let (Some(budget), Some(left)) = (budgets.tokens_per_day, left.tokens) {
            self.tokens_day_tat = Gcra::daily(budget).tat_leaving(share(left), at_us);
        }
    }

    /// Leaves the day budgets at most what a process last heard is left of them (`left`, as of
    /// `now_ms`: [`DayLeft::at`]), for a store that lost the state that process counted on
    /// (`FLUSHALL`, an empty restart): a day the fleet spent stays spent through the loss, the
    /// most spent view of the processes that carry theirs back winning. `reconcile.lua` is the
    /// twin (it carries a view back only when its generation is not the store's).
    pub fn carry_back_day(&mut self, left: DayLeft, now_ms: u64) {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        if let (Some(budget), Some(left)) = (budgets.requests_per_day, left.requests) {
            self.requests_day_tat = self.requests_day_tat.max(Gcra::daily(budget).tat_leaving(left, now_us));
        }
        if let (Some(budget), Some(left)) = (budgets.tokens_per_day, left.tokens) {
            self.tokens_day_tat = self.tokens_day_tat.max(Gcra::daily(budget).tat_leaving(left, now_us));
        }
    }

    /// Settles `delta` more tokens than reserved (negative: fewer) on the tokens per day.
    pub(super) fn day_settle(&mut self, delta: i64, now_ms: u64) {
        if let Some(budget) = self.budgets(now_ms).tokens_per_day.filter(|_| delta != 0) {
            let now_us = now_ms.saturating_mul(1000);
            self.tokens_day_tat = Gcra::daily(budget).settle(self.tokens_day_tat, now_us, delta);
        }
    }

    /// What is left of the requests and tokens per day now (available, ms until one more is).
    pub(super) fn day_status(&self, now_ms: u64) -> [Option<(u64, u64)>; 2] {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        [
            budgets.requests_per_day.map(|b| Gcra::daily(b).remaining(self.requests_day_tat, now_us)),
            budgets.tokens_per_day.map(|b| Gcra::daily(b).remaining(self.tokens_day_tat, now_us)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::{Ask, Decision, DenyReason, Instance, LocalGate, PermitId, UpstreamConfig, WaveSignal};

    const DAY_MS: u64 = 86_400_000;

    fn ask(me: &Instance, n: u64, tokens: u64) -> [Ask; 1] {
        [Ask { id: PermitId::new(None, me, n, None), tokens, output: 0, waiting: 1 }]
    }

    #[test]
    fn a_day_budget_refuses_for_hours_once_spent_and_refills_continuously() {
        // 4 requests a day, all at once: the fifth waits a quarter of a day for one more.
        let config = UpstreamConfig::builder("groq").limit(100).requests_per_day(4, 4).build().expect("valid");
        let me = Instance::new("me").expect("instance");
        let mut gate = LocalGate::for_upstream(&config);
        let now = 1_000_000;
        for n in 0..4 {
            let granted = gate.acquire(&me, &ask(&me, n, 0), 30_000, now);
            assert!(granted.is_granted(), "request {n}: {granted:?}");
            gate.finish(&PermitId::new(None, &me, n, None), 1, WaveSignal::Success, 0, now);
        }
        match gate.acquire(&me, &ask(&me, 9, 0), 30_000, now) {
            Decision::Denied { reason, retry_after_ms, .. } => {
                assert_eq!(reason, DenyReason::RequestBudget);
                assert_eq!(retry_after_ms, DAY_MS / 4);
            }
            granted => panic!("a fifth request in the day: {granted:?}"),
        }
        assert_eq!(gate.budget_status(now).requests_per_day, Some((0, DAY_MS / 4)));
        assert!(gate.acquire(&me, &ask(&me, 10, 0), 30_000, now + DAY_MS / 4).is_granted());
    }

    #[test]
    fn the_largest_day_budget_still_counts_each_unit_and_a_larger_one_is_refused() {
        let me = Instance::new("me").expect("instance");
        let builder = || UpstreamConfig::builder("groq").limit(100);
        let config = builder().requests_per_day(crate::MAX_PER_DAY, 10).build().expect("one a microsecond");
        let mut gate = LocalGate::for_upstream(&config);
        let now = 1_000_000;
        for n in 0..10 {
            assert!(gate.acquire(&me, &ask(&me, n, 0), 30_000, now).is_granted(), "request {n}");
        }
        assert!(!gate.acquire(&me, &ask(&me, 10, 0), 30_000, now).is_granted(), "an 11th in a burst of 10");
        let refused = builder().requests_per_day(crate::MAX_PER_DAY + 1, 10).build().expect_err("above one a µs");
        assert!(refused.to_string().contains("requests_per_day"), "{refused}");
        assert!(builder().tokens_per_day(crate::MAX_PER_DAY + 1, 10).build().is_err());
    }

    #[test]
    fn tokens_per_day_are_reserved_settled_and_bound_an_estimate() {
        // 1,000 tokens a day, 600 at once.
        let config = UpstreamConfig::builder("groq").limit(100).tokens_per_day(1_000, 600).build().expect("valid");
        let me = Instance::new("me").expect("instance");
        let mut gate = LocalGate::for_upstream(&config);
        let now = 1_000_000;
        // Above the burst: never fits, refused at once.
        match gate.acquire(&me, &ask(&me, 0, 601), 30_000, now) {
            Decision::Denied { reason, .. } => assert_eq!(reason, DenyReason::TokensExceedBurst),
            granted => panic!("an estimate above the day's burst: {granted:?}"),
        }
        assert!(gate.acquire(&me, &ask(&me, 1, 500), 30_000, now).is_granted());
        // 500 reserved: 100 left; the answer used 200, 300 come back.
        assert_eq!(gate.budget_status(now).tokens_per_day.map(|s| s.0), Some(100));
        gate.finish(&PermitId::new(None, &me, 1, None), 1, WaveSignal::Success, -300, now);
        assert_eq!(gate.budget_status(now).tokens_per_day.map(|s| s.0), Some(400));
        match gate.acquire(&me, &ask(&me, 2, 450), 30_000, now) {
            Decision::Denied { reason, .. } => assert_eq!(reason, DenyReason::TokenBudget),
            granted => panic!("450 with 400 left: {granted:?}"),
        }
    }
}
