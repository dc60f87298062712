//! Requests-per-minute and tokens-per-minute budgets: GCRA with a cost.
//!
//! The generic cell rate algorithm keeps one number per budget, the *theoretical arrival time*
//! (TAT): when the budget would be back to full if nothing else were admitted. A request of
//! cost `n` fits if, after adding `n` emission intervals, the TAT is no further than the burst
//! tolerance ahead of now. It is exact at every edge: in any window of length `W` it admits
//! at most `burst + W ÷ interval` units (a fixed window would let 2 × the rate through around
//! its boundary). A denial knows exactly when the request would fit.
//!
//! Time is in **microseconds** and the TAT is kept as an integer, so the Lua twin in
//! `lua/wave.lua` computes bit-for-bit the same results with the same operations (a property
//! test checks it). Token reservations are settled after the call: a refund moves the TAT
//! back (never below now, so it cannot create more than a full burst), an extra charge moves
//! it forward (debt that later requests wait for).
//!
//! ```
//! use wavegate_core::{Gcra, RateBudget};
//!
//! // 600 requests per minute (one per 100 ms), bursts of 2.
//! let budget = RateBudget::new(600, 2).unwrap();
//! let gcra = Gcra::new(budget);
//! let mut tat = 0;
//! let now = 1_000_000; // µs
//! tat = gcra.check(tat, now, 1).unwrap();
//! tat = gcra.check(tat, now, 1).unwrap();
//! assert_eq!(gcra.check(tat, now, 1), Err(100)); // the third must wait 100 ms
//! assert!(gcra.check(tat, now + 100_000, 1).is_ok());
//! ```

use std::num::{NonZeroU32, NonZeroU64};

/// How far past its burst a day budget's TAT may run (µs): a day of debt, from usage settled
/// above its reservation or charged back after an outage (`wave.lua`'s `DAY_MOST_DEBT`).
pub const DAY_MOST_DEBT_US: u64 = 86_400_000_000;

/// A validated per-minute budget: `per_minute` units a minute, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateBudget {
    per_minute: NonZeroU32,
    burst: NonZeroU32,
}

impl RateBudget {
    /// A budget of `per_minute` units a minute with bursts of up to `burst`; `None` if either
    /// is zero.
    pub fn new(per_minute: u32, burst: u32) -> Option<Self> {
        Some(Self { per_minute: NonZeroU32::new(per_minute)?, burst: NonZeroU32::new(burst)? })
    }

    /// Units per minute.
    pub fn per_minute(&self) -> u32 {
        self.per_minute.get()
    }

    /// The most units at once.
    pub fn burst(&self) -> u32 {
        self.burst.get()
    }
}

/// A validated per-day budget (Groq's and Cerebras's requests and tokens per day):
/// `per_day` units a day, at most `burst` at once. Refilled continuously, as those providers
/// refill theirs: a burst of a whole day's units lets up to `burst + per_day` through in any
/// 24 hours, as the provider does; a smaller burst spreads the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayBudget {
    per_day: NonZeroU64,
    burst: NonZeroU64,
}

impl DayBudget {
    /// A budget of `per_day` units a day with bursts of up to `burst`; `None` if either is
    /// zero.
    pub fn new(per_day: u64, burst: u64) -> Option<Self> {
        Some(Self { per_day: NonZeroU64::new(per_day)?, burst: NonZeroU64::new(burst)? })
    }

    /// Units per day.
    pub fn per_day(&self) -> u64 {
        self.per_day.get()
    }

    /// The most units at once.
    pub fn burst(&self) -> u64 {
        self.burst.get()
    }
}

/// An upstream's optional rate budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budgets {
    /// Requests per minute.
    pub requests: Option<RateBudget>,
    /// Tokens per minute (reserved as an estimate at acquire, settled after the call).
    pub tokens: Option<RateBudget>,
    /// Input tokens per minute, apart from the output (Anthropic's ITPM): an ask's estimate
    /// less its output part ([`Ask::output`](crate::Ask::output)).
    pub input: Option<RateBudget>,
    /// Output tokens per minute, apart from the input (Anthropic's OTPM): an ask's output
    /// part (its `max_tokens`).
    pub output: Option<RateBudget>,
    /// Requests per day, besides the per-minute budget (Groq's and Cerebras's RPD).
    pub requests_per_day: Option<DayBudget>,
    /// Tokens per day, besides the per-minute budget (Groq's and Cerebras's TPD): an ask's
    /// estimate, settled as the tokens budget is.
    pub tokens_per_day: Option<DayBudget>,
}

impl Budgets {
    /// Each budget scaled to `share` processes' worth: `max(1, rate ÷ share)` a minute and
    /// `max(1, burst ÷ share)` at once, for a process in fallback.
    pub fn share(&self, processes: u32) -> Budgets {
        let n = processes.max(1);
        let scale = |b: RateBudget| RateBudget::new((b.per_minute() / n).max(1), (b.burst() / n).max(1)).unwrap_or(b);
        Budgets {
            requests: self.requests.map(scale),
            tokens: self.tokens.map(scale),
            input: self.input.map(scale),
            output: self.output.map(scale),
            requests_per_day: self.requests_per_day.map(|b| scale_day(b, n)),
            tokens_per_day: self.tokens_per_day.map(|b| scale_day(b, n)),
        }
    }
}

fn scale_day(budget: DayBudget, processes: u32) -> DayBudget {
    let n = u64::from(processes);
    DayBudget::new((budget.per_day() / n).max(1), (budget.burst() / n).max(1)).unwrap_or(budget)
}

/// A budget's TAT carried across a change of its rate from `from` to `to` units a minute (a
/// live change, a rolling deploy): the units it holds stay the same, so the budget is neither
/// reset (a raise would otherwise wait out the old debt at the new interval's tolerance) nor
/// given a second burst (a cut would otherwise read the same time ahead as fewer units). A
/// TAT not after `now` (a full budget) or a rate of 0 (no budget) is kept. `wave.lua`'s
/// `rescale_tat` is the Lua twin (table `spec::rescale_cases`).
///
/// ```
/// use wavegate_core::rescale_tat;
///
/// // 30 s ahead at 60 a minute is 30 units; at 120 a minute they take 15 s.
/// assert_eq!(rescale_tat(130_000_000, 100_000_000, 60, 120), 115_000_000);
/// ```
pub fn rescale_tat(tat_us: u64, now_us: u64, from: u32, to: u32) -> u64 {
    rescale_units(tat_us, now_us, u64::from(from), u64::from(to))
}

/// [`rescale_tat`] for rates in any unit (a day budget's per day).
pub(crate) fn rescale_units(tat_us: u64, now_us: u64, from: u64, to: u64) -> u64 {
    if tat_us <= now_us || from == to || from == 0 || to == 0 {
        return tat_us;
    }
    let ahead = ((tat_us - now_us) as f64 * from as f64 / to as f64).floor();
    now_us.saturating_add(ahead as u64)
}

/// The GCRA arithmetic for one budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gcra {
    /// Microseconds per unit.
    interval_us: f64,
    /// How far ahead of now the TAT may run: `burst × interval`.
    tolerance_us: f64,
    burst: u64,
}

impl Gcra {
    /// The arithmetic for `budget`.
    pub fn new(budget: RateBudget) -> Self {
        let interval_us = 60_000_000.0 / f64::from(budget.per_minute());
        Self { interval_us, tolerance_us: f64::from(budget.burst()) * interval_us, burst: u64::from(budget.burst()) }
    }

    /// The arithmetic for a day `budget` (`wave.lua`'s `day_budget` is the twin).
    pub fn daily(budget: DayBudget) -> Self {
        let interval_us = 86_400_000_000.0 / budget.per_day() as f64;
        Self { interval_us, tolerance_us: budget.burst() as f64 * interval_us, burst: budget.burst() }
    }

    /// Whether `cost` units fit now: `Ok(new TAT)` to store, or `Err(ms to wait)`. A cost
    /// larger than the burst never fits: see [`fits_ever`](Self::fits_ever).
    pub fn check(&self, tat_us: u64, now_us: u64, cost: u64) -> Result<u64, u64> {
        let base = tat_us.max(now_us) as f64;
        let new_tat = (base + cost as f64 * self.interval_us).floor();
        let ahead = new_tat - now_us as f64;
        if ahead > self.tolerance_us {
            let wait_ms = ((ahead - self.tolerance_us) / 1000.0).ceil();
            return Err(wait_ms as u64);
        }
        Ok(new_tat as u64)
    }

    /// [`check`](Self::check), but a cost above the burst is not refused for ever: it is
    /// admitted when the budget is full (the TAT not after now), into debt (the TAT runs
    /// `cost` intervals ahead, further than the burst tolerance), so what comes next waits
    /// until the debt is paid back; until the budget is full again it waits (`Err`, the ms
    /// until it is). The rate holds: in any window of length `W` at most `max(burst, cost) +
    /// W ÷ interval` units. For a gate that holds a share of a budget (a fallback), whose
    /// burst may be smaller than an estimate the whole budget fits.
    pub fn check_in_debt(&self, tat_us: u64, now_us: u64, cost: u64) -> Result<u64, u64> {
        if cost <= self.burst {
            return self.check(tat_us, now_us, cost);
        }
        if tat_us > now_us {
            return Err((tat_us - now_us).div_ceil(1000));
        }
        Ok(self.charge(tat_us, now_us, cost))
    }

    /// The burst: the most units that fit at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether `cost` units can fit at all (cost ≤ burst).
    pub fn fits_ever(&self, cost: u64) -> bool {
        cost <= self.burst
    }

    /// Settles a reservation: `delta` more units (negative: a refund) than were reserved.
    pub fn settle(&self, tat_us: u64, now_us: u64, delta: i64) -> u64 {
        if delta >= 0 {
            (tat_us.max(now_us) as f64 + delta as f64 * self.interval_us).floor() as u64
        } else {
            let refunded = (tat_us as f64 + delta as f64 * self.interval_us).floor().max(0.0) as u64;
            refunded.max(tat_us.min(now_us))
        }
    }

    /// A lower bound on the milliseconds until `cost` units can fit, proved from the TAT: even
    /// if `refundable` units reserved by calls still running were all settled back at once
    /// ([`settle`](Self::settle) with a refund: the lowest TAT they can leave), and whatever
    /// is granted meanwhile (a grant and its own refund never lower the TAT below where it
    /// was), no room comes sooner; 0 when it may fit now. `in_debt` is the rule of
    /// [`check_in_debt`](Self::check_in_debt) (a fallback's share). Only a change of the rate
    /// or the burst ([`rescale_tat`], a learned limit forgotten) can bring room sooner.
    ///
    /// ```
    /// use wavegate_core::{Gcra, RateBudget};
    ///
    /// let gcra = Gcra::new(RateBudget::new(600, 10).expect("a budget")); // 10 a second, burst 10
    /// let empty = gcra.charge(0, 0, 10); // all 10 spent at 0
    /// assert_eq!(gcra.earliest_ms(empty, 0, 5, 0, false), 500); // 5 more in half a second
    /// // Up to 3 units may still be given back by calls in flight: 200 ms at the least.
    /// assert_eq!(gcra.earliest_ms(empty, 0, 5, 3, false), 200);
    /// ```
    pub fn earliest_ms(&self, tat_us: u64, now_us: u64, cost: u64, refundable: u64, in_debt: bool) -> u64 {
        let lowest = match i64::try_from(refundable) {
            Ok(0) => tat_us,
            Ok(units) => self.settle(tat_us, now_us, -units),
            Err(_) => tat_us.min(now_us),
        };
        let check = if in_debt { self.check_in_debt(lowest, now_us, cost) } else { self.check(lowest, now_us, cost) };
        check.err().unwrap_or(0)
    }

    /// Adds `units` just granted to the budget (their check passed).
    pub fn charge(&self, tat_us: u64, now_us: u64, units: u64) -> u64 {
        (tat_us.max(now_us) as f64 + units as f64 * self.interval_us).floor() as u64
    }

    /// Adds `units` used elsewhere in the past (e.g. during an outage, at most at the rate) to
    /// the budget: they leave it empty at most, never in debt for the time they took. (Charged
    /// at once, a 6 s outage at the full rate stalled the budget for 6 s more after it.)
    ///
    /// ```
    /// use wavegate_core::{Gcra, RateBudget};
    ///
    /// let gcra = Gcra::new(RateBudget::new(600, 10).expect("a budget")); // 10/s, burst 10
    /// let now = 1_000_000_000;
    /// // 60 requests of a 6 s outage: empty now, one more in 100 ms.
    /// let tat = gcra.charge_past(0, now, 60);
    /// assert_eq!(gcra.remaining(tat, now), (0, 100));
    /// ```
    pub fn charge_past(&self, tat_us: u64, now_us: u64, units: u64) -> u64 {
        let empty = (now_us as f64 + self.tolerance_us).floor() as u64;
        self.charge(tat_us, now_us, units).min(tat_us.max(empty))
    }

    /// Adds `units` used elsewhere since `began_us` (an outage's start) to a day budget: as if
    /// charged when it began, so the refill since then pays for what it can, and in debt for
    /// the rest, at most [`DAY_MOST_DEBT_US`] past the burst (`wave.lua`'s `most_debt`).
    ///
    /// ```
    /// use wavegate_core::{DayBudget, Gcra};
    ///
    /// let gcra = Gcra::daily(DayBudget::new(24, 24).expect("valid")); // 1 an hour, burst 24
    /// let hour = 3_600_000_000;
    /// let full = 100 * hour; // a full budget: its TAT long past
    /// // 12 used over the 12 hours of an outage: the refill paid for them, the day stays full.
    /// let tat = gcra.charge_since(0, full - 12 * hour, full, 12);
    /// assert_eq!(gcra.remaining(tat, full).0, 24);
    /// ```
    pub fn charge_since(&self, tat_us: u64, began_us: u64, now_us: u64, units: u64) -> u64 {
        let most = (now_us as f64 + self.tolerance_us).floor() as u64 + DAY_MOST_DEBT_US;
        self.charge(tat_us, began_us.min(now_us), units).min(most.max(tat_us))
    }

    /// The TAT that leaves `remaining` units available at `now_us` (all of the burst at most):
    /// the inverse of [`remaining`](Self::remaining).
    ///
    /// ```
    /// use wavegate_core::{DayBudget, Gcra};
    ///
    /// let gcra = Gcra::daily(DayBudget::new(1_000, 100).expect("valid"));
    /// let now = 5_000_000_000;
    /// assert_eq!(gcra.remaining(gcra.tat_leaving(40, now), now).0, 40);
    /// ```
    pub fn tat_leaving(&self, remaining: u64, now_us: u64) -> u64 {
        let spent = self.burst.saturating_sub(remaining) as f64 * self.interval_us;
        (now_us as f64 + spent).floor() as u64
    }

    /// The units available now, and the milliseconds until one more is (0 when full).
    pub fn remaining(&self, tat_us: u64, now_us: u64) -> (u64, u64) {
        let used = tat_us.saturating_sub(now_us) as f64;
        let remaining = ((self.tolerance_us - used) / self.interval_us).floor().clamp(0.0, self.burst as f64) as u64;
        if remaining >= self.burst {
            return (remaining, 0);
        }
        let next_us = used - (self.tolerance_us - (remaining + 1) as f64 * self.interval_us);
        (remaining, (next_us.max(0.0) / 1000.0).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tat_leaving_is_the_inverse_of_remaining() {
        for (per_day, burst) in
            [(1, 1), (7, 7), (1_000, 100), (14_400, 14_400), (500_000, 3_333), (86_400_000_000, 1_000_000)]
        {
            let gcra = Gcra::daily(DayBudget::new(per_day, burst).expect("valid"));
            for now in [0, 1, 999_999, 1_700_000_000_000_000] {
                for left in [0, 1, burst / 3, burst.saturating_sub(1), burst, burst + 5] {
                    let tat = gcra.tat_leaving(left, now);
                    assert_eq!(gcra.remaining(tat, now).0, left.min(burst), "{per_day}/{burst} at {now}, {left} left");
                }
            }
        }
    }

    fn gcra(per_minute: u32, burst: u32) -> Gcra {
        Gcra::new(RateBudget::new(per_minute, burst).expect("valid"))
    }

    #[test]
    fn never_more_than_burst_plus_rate_in_any_window() {
        // 600/min with a burst of 5, asked every 7 ms for 3 minutes.
        let g = gcra(600, 5);
        let mut tat = 0;
        let mut admitted = Vec::new();
        for step in 0..(180_000 / 7) {
            let now = 1_000_000_000 + step * 7_000;
            if let Ok(next) = g.check(tat, now, 1) {
                tat = next;
                admitted.push(now);
            }
        }
        for (i, start) in admitted.iter().enumerate() {
            let in_window = admitted[i..].iter().take_while(|t| **t < start + 60_000_000).count();
            assert!(in_window <= 605, "{in_window} in the minute from {start}");
        }
        assert!(admitted.len() >= 1_795, "the budget must be usable: {}", admitted.len());
    }

    #[test]
    fn a_denial_says_exactly_when() {
        let g = gcra(60, 1); // one a second
        let tat = g.check(0, 5_000_000, 1).expect("first");
        let wait = g.check(tat, 5_000_000, 1).expect_err("second");
        assert_eq!(wait, 1_000);
        assert_eq!(g.check(tat, 5_000_000 + 999_000, 1), Err(1));
        assert!(g.check(tat, 5_000_000 + 1_000_000, 1).is_ok());
    }

    #[test]
    fn refunds_and_extra_charges_change_what_comes_next() {
        let g = gcra(60_000, 1_000); // tokens: 1000 a minute... per ms one
        let now = 10_000_000;
        let tat = g.check(0, now, 800).expect("reserve 800");
        assert_eq!(g.remaining(tat, now).0, 200);
        let refunded = g.settle(tat, now, -500); // used 300
        assert_eq!(g.remaining(refunded, now).0, 700);
        let charged = g.settle(tat, now, 400); // used 1200
        assert_eq!(g.remaining(charged, now).0, 0);
        assert_eq!(g.check(charged, now, 1), Err(201));
        // A refund never makes more than a full burst.
        assert_eq!(g.settle(0, now, -10_000), 0);
        assert_eq!(g.remaining(g.settle(0, now, -10_000), now), (1_000, 0));
    }

    #[test]
    fn above_the_burst_in_debt_when_full_then_at_the_rate() {
        // 10,000 a minute (6 ms each), bursts of 800: a share of 200,000 among 20.
        let g = gcra(10_000, 800);
        let now = 1_000_000_000;
        assert_eq!(g.check(0, now, 4_000), Err(19_200), "check never admits it");
        let tat = g.check_in_debt(0, now, 4_000).expect("full: admitted in debt");
        assert_eq!(tat, now + 24_000_000);
        assert_eq!(g.check_in_debt(tat, now + 1_000, 4_000), Err(23_999), "until the debt is paid");
        assert_eq!(g.check_in_debt(tat, now + 1_000, 1), Err(19_205), "a small cost waits for the burst tolerance");
        assert!(g.check_in_debt(tat, now + 24_000_000, 4_000).is_ok(), "full again");
        // Not full: a large cost waits until it is, even when a small one would fit.
        let tat = g.check(0, now, 100).expect("100");
        assert_eq!(g.check_in_debt(tat, now, 4_000), Err(600));
        // Within the burst: as `check`.
        assert_eq!(g.check_in_debt(tat, now, 800), g.check(tat, now, 800));
    }

    #[test]
    fn too_large_never_fits() {
        let g = gcra(1_000, 100);
        assert!(!g.fits_ever(101));
        assert!(g.check(0, 1_000_000, 101).is_err());
        assert!(g.fits_ever(100));
    }
}
