//! A priority class's own share of its upstream's rate budgets.
//!
//! A class may be capped at a percentage of the upstream's requests and tokens per minute
//! ([`PriorityClass::budget_percent`]): its own GCRA budgets, [`class_share`] of the
//! upstream's, charged besides the upstream's. A class whose own budget has nothing left now
//! takes no part in the choice of class (its permit goes to another class that waits), so a
//! batch flood capped at 50 % leaves the other half of the budget for interactive calls even
//! while no interactive caller waits yet — rate budgets cannot be taken back once spent.
//!
//! [`class_share`] has a twin in `lua/wave.lua` (`class_share`); both pass `cases` (the `spec` feature). In shared
//! mode the class budgets live in Redis beside the upstream's (`requests_tat|<class>`,
//! `tokens_tat|<class>` in the wave hash); in local mode and fallback, in [`ClassBudgets`].
//!
//! ```
//! use wavegate_core::class_budget::class_share;
//! use wavegate_core::RateBudget;
//!
//! let upstream = RateBudget::new(600, 20).unwrap();
//! let batch = class_share(upstream, 25);
//! assert_eq!((batch.per_minute(), batch.burst()), (150, 5));
//! ```

use crate::gcra::{Budgets, Gcra, RateBudget};
use crate::priority::PriorityClass;

/// `percent` of `budget`: rate and burst each scaled and rounded down, at least 1.
pub fn class_share(budget: RateBudget, percent: u8) -> RateBudget {
    let scale = |units: u32| ((u64::from(units) * u64::from(percent.min(100)) / 100).max(1)) as u32;
    RateBudget::new(scale(budget.per_minute()), scale(budget.burst())).unwrap_or(budget)
}

/// One case of [`class_share`]: (per minute, burst, percent) → (per minute, burst).
#[cfg(any(test, feature = "spec"))]
#[derive(Debug, Clone, Copy)]
pub struct ShareCase {
    /// The upstream's budget.
    pub budget: (u32, u32),
    /// The class's share, in percent.
    pub percent: u8,
    /// The class's budget.
    pub expect: (u32, u32),
}

/// The table both twins pass.
#[cfg(any(test, feature = "spec"))]
pub fn cases() -> Vec<ShareCase> {
    let case = |budget, percent, expect| ShareCase { budget, percent, expect };
    vec![
        case((600, 20), 25, (150, 5)),
        case((600, 20), 100, (600, 20)),
        case((10, 3), 10, (1, 1)),
        case((1_000_000, 50_000), 33, (330_000, 16_500)),
        case((7, 7), 50, (3, 3)),
        case((u32::MAX, u32::MAX), 99, (4_252_017_622, 4_252_017_622)),
    ]
}

/// One budget in process: its arithmetic and its theoretical arrival time.
#[derive(Debug, Clone, Copy)]
struct Held {
    gcra: Gcra,
    tat_us: u64,
}

impl Held {
    fn new(budget: RateBudget) -> Self {
        Self { gcra: Gcra::new(budget), tat_us: 0 }
    }
}

/// The budgets of one capped class.
#[derive(Debug, Clone, Copy)]
struct ClassBudget {
    requests: Option<Held>,
    tokens: Option<Held>,
}

/// The class budgets of one upstream in process (local mode, fallback): one entry per class,
/// `None` for a class without a cap.
#[derive(Debug, Clone, Default)]
pub struct ClassBudgets {
    classes: Vec<Option<ClassBudget>>,
    /// A share of the fleet's (a fallback): a tokens estimate above a class's own burst is
    /// taken in debt when its budget is full ([`Gcra::check_in_debt`]).
    in_debt: bool,
}

impl ClassBudgets {
    /// Full budgets for the capped `classes` of an upstream with `budgets` (the whole
    /// upstream's, or a fallback's share of them).
    pub fn new(classes: &[PriorityClass], budgets: Budgets) -> Self {
        let classes = classes
            .iter()
            .map(|class| {
                let percent = class.budget_percent_value();
                (percent < 100).then(|| ClassBudget {
                    requests: budgets.requests.map(|b| Held::new(class_share(b, percent))),
                    tokens: budgets.tokens.map(|b| Held::new(class_share(b, percent))),
                })
            })
            .collect();
        Self { classes, in_debt: false }
    }

    /// These budgets are a share of the fleet's (a fallback): a tokens estimate above a
    /// class's own burst waits until the class's budget is full, then is taken in debt,
    /// instead of never fitting ([`Gcra::check_in_debt`]).
    pub fn in_debt(mut self) -> Self {
        self.in_debt = true;
        self
    }

    /// Whether class `class` has a budget of its own.
    pub fn is_capped(&self, class: usize) -> bool {
        matches!(self.classes.get(class), Some(Some(_)))
    }

    /// `None` if class `class` can take one request reserving `tokens` now, else how many
    /// milliseconds until it can.
    pub fn wait_ms(&self, class: usize, now_ms: u64, tokens: u64) -> Option<u64> {
        let Some(Some(budget)) = self.classes.get(class) else { return None };
        let now_us = now_ms.saturating_mul(1000);
        let check = |h: Held, cost| {
            if self.in_debt {
                h.gcra.check_in_debt(h.tat_us, now_us, cost)
            } else {
                h.gcra.check(h.tat_us, now_us, cost)
            }
        };
        let wait = |held: Option<Held>, cost: u64| held.map_or(0, |h| check(h, cost).err().unwrap_or(0));
        let wait = wait(budget.requests, 1).max(wait(budget.tokens, tokens));
        (wait > 0).then_some(wait)
    }

    /// The tokens burst of class `class`'s own budget (the largest estimate it can ever
    /// take), if it has one.
    pub fn tokens_burst(&self, class: usize) -> Option<u64> {
        match self.classes.get(class) {
            Some(Some(ClassBudget { tokens: Some(held), .. })) => Some(held.gcra.burst()),
            _ => None,
        }
    }

    /// Charges a grant of one request reserving `tokens` to class `class` (after
    /// [`wait_ms`](Self::wait_ms) said it fits).
    pub fn charge(&mut self, class: usize, now_ms: u64, tokens: u64) {
        let Some(Some(budget)) = self.classes.get_mut(class) else { return };
        let now_us = now_ms.saturating_mul(1000);
        if let Some(held) = &mut budget.requests {
            held.tat_us = held.gcra.charge(held.tat_us, now_us, 1);
        }
        if let Some(held) = &mut budget.tokens {
            held.tat_us = held.gcra.charge(held.tat_us, now_us, tokens);
        }
    }

    /// Settles a token reservation of class `class`: `delta` more tokens (negative: fewer)
    /// were used than reserved.
    pub fn settle(&mut self, class: usize, delta: i64, now_ms: u64) {
        if let Some(Some(ClassBudget { tokens: Some(held), .. })) = self.classes.get_mut(class) {
            held.tat_us = held.gcra.settle(held.tat_us, now_ms.saturating_mul(1000), delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_of_the_table() {
        for case in cases() {
            let budget = RateBudget::new(case.budget.0, case.budget.1).expect("valid");
            let share = class_share(budget, case.percent);
            assert_eq!((share.per_minute(), share.burst()), case.expect, "{case:?}");
        }
    }

    #[test]
    fn a_capped_class_waits_for_its_own_budget_and_an_uncapped_one_never() {
        let classes = [
            PriorityClass::new("interactive").unwrap(),
            PriorityClass::new("batch").unwrap().budget_percent(25).unwrap(),
        ];
        let budgets = Budgets { requests: RateBudget::new(600, 8), tokens: None };
        let mut held = ClassBudgets::new(&classes, budgets);
        assert!(!held.is_capped(0) && held.is_capped(1));
        // Batch: 150 a minute (one per 400 ms), bursts of 2.
        for _ in 0..2 {
            assert_eq!(held.wait_ms(1, 0, 0), None);
            held.charge(1, 0, 0);
        }
        assert_eq!(held.wait_ms(1, 0, 0), Some(400));
        assert_eq!(held.wait_ms(1, 400, 0), None);
        assert_eq!(held.wait_ms(0, 0, 0), None, "interactive has no budget of its own");
        held.charge(0, 0, 0);
        assert_eq!(held.wait_ms(0, 0, 0), None);
    }
}
