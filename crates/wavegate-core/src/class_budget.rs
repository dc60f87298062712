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

/// The state of one capped class's budgets: its share and the theoretical arrival times. The
/// budgets themselves are its share of the upstream's budgets in force at each use (tightened
/// by what the provider announced), so a capped class never takes more than its share of a
/// tighter real budget.
#[derive(Debug, Clone, Copy)]
struct ClassBudget {
    percent: u8,
    requests_tat_us: u64,
    tokens_tat_us: u64,
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
    /// Full budgets for the capped `classes` of an upstream; each is its share of the budgets
    /// passed at each use (the upstream's in force, or a fallback's share of them).
    pub fn new(classes: &[PriorityClass]) -> Self {
        let classes = classes
            .iter()
            .map(|class| {
                let percent = class.budget_percent_value();
                (percent < 100).then_some(ClassBudget { percent, requests_tat_us: 0, tokens_tat_us: 0 })
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

    /// The arithmetic of class `class`'s requests and tokens budgets, its shares of `budgets`.
    fn gcras(&self, class: usize, budgets: Budgets) -> Option<(ClassBudget, Option<Gcra>, Option<Gcra>)> {
        let Some(Some(held)) = self.classes.get(class) else { return None };
        let share = |b: Option<RateBudget>| b.map(|b| Gcra::new(class_share(b, held.percent)));
        Some((*held, share(budgets.requests), share(budgets.tokens)))
    }

    /// `None` if class `class` can take one request reserving `tokens` now under its share of
    /// `budgets`, else how many milliseconds until it can.
    pub fn wait_ms(&self, class: usize, budgets: Budgets, now_ms: u64, tokens: u64) -> Option<u64> {
        let (held, requests, tokens_gcra) = self.gcras(class, budgets)?;
        let now_us = now_ms.saturating_mul(1000);
        let check = |gcra: Gcra, tat_us: u64, cost: u64| {
            if self.in_debt { gcra.check_in_debt(tat_us, now_us, cost) } else { gcra.check(tat_us, now_us, cost) }
        };
        let wait =
            |gcra: Option<Gcra>, tat_us: u64, cost: u64| gcra.map_or(0, |g| check(g, tat_us, cost).err().unwrap_or(0));
        let wait = wait(requests, held.requests_tat_us, 1).max(wait(tokens_gcra, held.tokens_tat_us, tokens));
        (wait > 0).then_some(wait)
    }

    /// The tokens burst of class `class`'s own budget under `budgets` (the largest estimate it
    /// can ever take), if it has one.
    pub fn tokens_burst(&self, class: usize, budgets: Budgets) -> Option<u64> {
        self.gcras(class, budgets).and_then(|(_, _, tokens)| tokens).map(|gcra| gcra.burst())
    }

    /// Charges a grant of one request reserving `tokens` to class `class` (after
    /// [`wait_ms`](Self::wait_ms) said it fits under `budgets`).
    pub fn charge(&mut self, class: usize, budgets: Budgets, now_ms: u64, tokens: u64) {
        let Some((_, requests, tokens_gcra)) = self.gcras(class, budgets) else { return };
        let Some(Some(held)) = self.classes.get_mut(class) else { return };
        let now_us = now_ms.saturating_mul(1000);
        if let Some(gcra) = requests {
            held.requests_tat_us = gcra.charge(held.requests_tat_us, now_us, 1);
        }
        if let Some(gcra) = tokens_gcra {
            held.tokens_tat_us = gcra.charge(held.tokens_tat_us, now_us, tokens);
        }
    }

    /// Carries every class's TATs across a change of the upstream's budgets from `from` to
    /// `to` (each class's share of each: see [`rescale_tat`](crate::rescale_tat)).
    pub fn rescale(&mut self, from: Budgets, to: Budgets, now_us: u64) {
        for held in self.classes.iter_mut().flatten() {
            let rates = |f: Option<RateBudget>, t: Option<RateBudget>| {
                Some((class_share(f?, held.percent).per_minute(), class_share(t?, held.percent).per_minute()))
            };
            if let Some((f, t)) = rates(from.requests, to.requests) {
                held.requests_tat_us = crate::gcra::rescale_tat(held.requests_tat_us, now_us, f, t);
            }
            if let Some((f, t)) = rates(from.tokens, to.tokens) {
                held.tokens_tat_us = crate::gcra::rescale_tat(held.tokens_tat_us, now_us, f, t);
            }
        }
    }

    /// Settles a token reservation of class `class`: `delta` more tokens (negative: fewer)
    /// were used than reserved.
    pub fn settle(&mut self, class: usize, budgets: Budgets, delta: i64, now_ms: u64) {
        let Some((_, _, Some(gcra))) = self.gcras(class, budgets) else { return };
        if let Some(Some(held)) = self.classes.get_mut(class) {
            held.tokens_tat_us = gcra.settle(held.tokens_tat_us, now_ms.saturating_mul(1000), delta);
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
        let budgets = Budgets { requests: RateBudget::new(600, 8), tokens: None, ..Budgets::default() };
        let mut held = ClassBudgets::new(&classes);
        assert!(!held.is_capped(0) && held.is_capped(1));
        // Batch: 150 a minute (one per 400 ms), bursts of 2.
        for _ in 0..2 {
            assert_eq!(held.wait_ms(1, budgets, 0, 0), None);
            held.charge(1, budgets, 0, 0);
        }
        assert_eq!(held.wait_ms(1, budgets, 0, 0), Some(400));
        assert_eq!(held.wait_ms(1, budgets, 400, 0), None);
        assert_eq!(held.wait_ms(0, budgets, 0, 0), None, "interactive has no budget of its own");
        held.charge(0, budgets, 0, 0);
        assert_eq!(held.wait_ms(0, budgets, 0, 0), None);
        // A tighter budget in force (a limit the provider announced): the class's share of it.
        let tighter = Budgets { requests: RateBudget::new(60, 4), tokens: None, ..Budgets::default() };
        assert_eq!(held.wait_ms(1, budgets, 400, 0), None);
        assert_eq!(held.wait_ms(1, tighter, 400, 0), Some(400), "a quarter of 60 a minute (one per 4 s), bursts of 1");
    }
}
