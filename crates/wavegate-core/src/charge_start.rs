//! The latest start a usage can be charged to the day budgets from, so that no refill that never
//! happened pays for it.

use crate::gcra::{Budgets, DayBudget};

/// The latest start from which a usage, counted as it happened (an outage's fallback grants, a
/// process's use since the store last spoke), can be charged to the day budgets.
///
/// Charged from a start `S` ([`Gcra::charge_since`](crate::Gcra::charge_since)), `n` units leave
/// a day budget's TAT at `max(TAT, S) + n·T`. Used at the times they were, they would leave it at
/// `max(TAT + n·T, V)`, `V` the TAT they alone make (`T` the day's interval, each use
/// `V = max(V, t) + units·T`). `S` = the latest of `t − T·(units used before it)` over the uses
/// gives exactly that: a share used at the rate from an outage's start is charged from the start
/// (the refill the outage lasted paid for it), a share spent at its end is charged from the end
/// (charged from the start, 12 s of a refill the idle share never banked paid for it, and the
/// store handed out a second burst at once). Of the requests and tokens days, the later start.
///
/// ```
/// use wavegate_core::{Budgets, ChargeStart, DayBudget};
///
/// // 86,400 a day: one a second.
/// let budgets = Budgets { requests_per_day: DayBudget::new(86_400, 10), ..Budgets::default() };
/// // Ten used at 12 s: charged from 12 s.
/// let mut at_end = ChargeStart::default();
/// for k in 0..10 {
///     at_end.used(budgets, 12_000, (k, 0), (1, 0));
/// }
/// assert_eq!(at_end.at_ms(), Some(12_000));
/// // Ten used one a second from 3 s: charged from 3 s.
/// let mut spread = ChargeStart::default();
/// for k in 0..10 {
///     spread.used(budgets, 3_000 + 1_000 * k, (k, 0), (1, 0));
/// }
/// assert_eq!(spread.at_ms(), Some(3_000));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChargeStart {
    at_ms: Option<u64>,
}

impl ChargeStart {
    /// A use at `at_ms` of `used` (requests, tokens), `before` (requests, tokens) having been used
    /// since the count began, against `budgets`' days (none: nothing to charge, nothing kept).
    pub fn used(&mut self, budgets: Budgets, at_ms: u64, before: (u64, u64), used: (u64, u64)) {
        let start = |day: Option<DayBudget>, before: u64, used: u64| -> Option<u64> {
            let day = day.filter(|_| used > 0)?;
            let interval_ms = 86_400_000.0 / day.per_day().max(1) as f64;
            // Rounded down: a later start, never an earlier one.
            Some(at_ms.saturating_sub((before as f64 * interval_ms).floor() as u64))
        };
        let latest =
            [start(budgets.requests_per_day, before.0, used.0), start(budgets.tokens_per_day, before.1, used.1)]
                .into_iter()
                .flatten()
                .max();
        if let Some(latest) = latest {
            self.at_ms = Some(self.at_ms.map_or(latest, |at| at.max(latest)));
        }
    }

    /// The start to charge from, in the clock's milliseconds of the uses; `None` before any use
    /// of a day budget.
    pub fn at_ms(self) -> Option<u64> {
        self.at_ms
    }
}
