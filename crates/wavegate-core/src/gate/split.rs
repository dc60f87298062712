//! The input and output tokens budgets (Anthropic's ITPM and OTPM), apart from the tokens
//! budget: an ask's estimate less its output part is reserved from the input budget, its
//! output part (the request's `max_tokens`) from the output one, together with the requests
//! and tokens budgets or not at all; the usage settles each. `lua/acquire.lua`'s
//! `split_check` and `lua/finish.lua` are the twins.

use crate::gcra::{Budgets, Gcra, RateBudget};
use crate::token_delta::TokenDelta;

use super::LocalGate;

/// An ask's (input, output) parts of `tokens`, `output` of them the answer's.
pub(super) fn parts(tokens: u64, output: u64) -> (u64, u64) {
    let output = output.min(tokens);
    (tokens - output, output)
}

impl LocalGate {
    /// Whether `parts` (input, output) fit the input and output budgets in force at
    /// `now_us`: the new TATs to keep (`None` for a budget there is not), or the ms to wait.
    pub(super) fn split_check(
        &self,
        budgets: Budgets,
        parts: (u64, u64),
        now_us: u64,
    ) -> Result<[Option<u64>; 2], u64> {
        let in_debt = self.fleet.is_some();
        let check = |budget: Option<RateBudget>, tat: u64, cost: u64| {
            budget
                .map(|b| {
                    let gcra = Gcra::new(b);
                    if in_debt { gcra.check_in_debt(tat, now_us, cost) } else { gcra.check(tat, now_us, cost) }
                })
                .transpose()
        };
        let input = check(budgets.input, self.input_tat, parts.0);
        let output = check(budgets.output, self.output_tat, parts.1);
        match (input, output) {
            (Ok(input), Ok(output)) => Ok([input, output]),
            (input, output) => Err(input.err().unwrap_or(0).max(output.err().unwrap_or(0))),
        }
    }

    /// Keeps the TATs a passed [`split_check`](Self::split_check) gave.
    pub(super) fn split_charge(&mut self, tats: [Option<u64>; 2]) {
        if let Some(tat) = tats[0] {
            self.input_tat = tat;
        }
        if let Some(tat) = tats[1] {
            self.output_tat = tat;
        }
    }

    /// Whether `parts` (input, output) are above the bursts in force (in a fallback the
    /// fleet's): such an ask never fits.
    pub(super) fn split_exceeds_burst(&self, parts: (u64, u64), now_ms: u64) -> bool {
        let ceiling = self.ceiling_budgets(now_ms);
        let above = |budget: Option<RateBudget>, cost: u64| budget.is_some_and(|b| cost > u64::from(b.burst()));
        above(ceiling.input, parts.0) || above(ceiling.output, parts.1)
    }

    /// Charges `parts` (input, output) used elsewhere to their budgets: they leave them empty
    /// at most ([`Gcra::charge_past`], as [`charge`](LocalGate::charge) does).
    pub(super) fn charge_split(&mut self, parts: (u64, u64), now_ms: u64) {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        if let Some(budget) = budgets.input {
            self.input_tat = Gcra::new(budget).charge_past(self.input_tat, now_us, parts.0);
        }
        if let Some(budget) = budgets.output {
            self.output_tat = Gcra::new(budget).charge_past(self.output_tat, now_us, parts.1);
        }
    }

    /// Settles `delta`'s input and output parts on their budgets.
    pub(super) fn split_settle(&mut self, delta: TokenDelta, now_ms: u64) {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        if let Some(budget) = budgets.input.filter(|_| delta.input() != 0) {
            self.input_tat = Gcra::new(budget).settle(self.input_tat, now_us, delta.input());
        }
        if let Some(budget) = budgets.output.filter(|_| delta.output != 0) {
            self.output_tat = Gcra::new(budget).settle(self.output_tat, now_us, delta.output);
        }
    }

    /// What is left of the input and output budgets now (available, ms until one more is).
    pub(super) fn split_status(&self, now_ms: u64) -> [Option<(u64, u64)>; 2] {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        [
            budgets.input.map(|b| Gcra::new(b).remaining(self.input_tat, now_us)),
            budgets.output.map(|b| Gcra::new(b).remaining(self.output_tat, now_us)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::{Ask, Decision, DenyReason, FallbackStart, Instance, LocalGate, PermitId, UpstreamConfig};

    #[test]
    fn a_fallback_charges_the_recent_grants_output_to_its_share() {
        // 600 output tokens a minute, 100 at once; two processes: each share 300 a minute, 50.
        let config = UpstreamConfig::builder("claude").output_tokens_per_minute(600, 100).build().expect("valid");
        let me = Instance::new("me").expect("instance");
        let ask = [Ask { id: PermitId::new(None, &me, 1, None), tokens: 10, output: 10, waiting: 1 }];
        let start = |recent: Vec<(u64, u64, u64)>| FallbackStart::<String> {
            live: Some(2),
            recent_grants: recent,
            ..FallbackStart::default()
        };
        // Nothing granted lately: the share's burst is there.
        let mut fresh = LocalGate::fallback(&config, start(Vec::new()), 1_000_000).gate;
        assert!(fresh.acquire(&me, &ask, 30_000, 1_000_000).is_granted());
        // 100 of output granted 10 ms before the switch: the share is empty, no fresh burst.
        let mut charged = LocalGate::fallback(&config, start(vec![(999_990, 150, 100)]), 1_000_000).gate;
        match charged.acquire(&me, &ask, 30_000, 1_000_000) {
            Decision::Denied { reason, .. } => assert_eq!(reason, DenyReason::TokenBudget),
            granted => panic!("the recent output was not charged: {granted:?}"),
        }
    }
}
