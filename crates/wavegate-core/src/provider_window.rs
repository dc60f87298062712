//! The provider's announced windows, as the fleet keeps them: "R left until T".
//!
//! A response that says how many requests (or tokens) are left in the provider's window and
//! when it resets ([`WindowReport`], from [`ProviderSignals`](crate::ProviderSignals)) tells
//! the whole fleet what it may still send. [`ProviderWindows`] keeps that (next to the permits:
//! in Redis in shared mode, `lua/provider_window.lua`; in the [`LocalGate`](crate::LocalGate)
//! in local mode and in a fallback), counts each grant down, and refuses a grant once nothing
//! is left until the window resets — so the next 429 does not happen.
//!
//! The rules (the spec tables check both twins):
//!
//! * A report of `R` left with a reset in `D`: the provider counted `R` at the reporting call's
//!   admission (providers charge at admission: OpenAI, Anthropic, every counting gateway), so
//!   what it could not count yet is what the fleet granted after that call's grant. From the
//!   first report on, every grant is counted ([`SentCount`]) and each permit keeps the count
//!   right after its own grant (its mark): `R` minus the grants made since the mark (one
//!   request each, the tokens each reserved) is what is left. A permit with no mark (granted
//!   before the first report, or by another gate) falls back on the calls still in flight
//!   besides it: one request each, for tokens as much as the reporting call reserved each.
//!   (Counting every call in flight charged twice the calls the provider admitted before the
//!   reporting one: with 32 calls of 2,100 tokens in flight, 67k tokens held back.) The window
//!   ends at now + `D`.
//! * A window ends at most [`MAX_RESET`] after the report that announced it (a day): no answer
//!   can pause the fleet for longer, and no end reaches the store as a number it cannot return.
//! * A report of the same window (ending within [`SAME_WINDOW_MS`] of the known end) only ever
//!   lowers what is left: responses arrive out of order, and an older answer must not hand back
//!   what a newer one took. A report of a later window replaces the known one, and so does one
//!   that ends earlier: an older answer's end, read on arrival, only ever lies later than the
//!   truth, so an earlier end is the provider's newer word (a 200 saying 999 left for the next
//!   minute ends a pause a `Retry-After` of a day started). A report of a refilled bucket that
//!   would be full again when a running fixed window ends is a report of that window: a
//!   provider that counts in fixed windows and speaks OpenAI's headers is proved fixed by its
//!   first answers of a window ([`Window::refills`](crate::Window::refills)), and its later
//!   ones, with less left, would otherwise read like a refill it does not give.
//! * A grant costs one request and its token estimate from what is left while the window runs.
//! * While a window runs with less left than a grant needs, every grant is refused until its
//!   end ([`DenyReason::ProviderWindow`](crate::DenyReason::ProviderWindow)); a window whose
//!   end has passed says nothing any more.
//! * OpenAI's and Anthropic's resets are not a window's end but the time until a continuously refilled bucket
//!   is full again ([`WindowLeft::refills_to`], its limit): what is left grows back linearly
//!   toward the limit until then, so grants go on at the provider's refill rate instead of
//!   stopping until the "reset" (issue 23: 5 s of near silence every 55 s). With a mark, what
//!   the answer says is as of the reporting call's grant, and the bucket has grown back since
//!   (a call of 2 s at 10k tokens a second: 20k); were the provider's count taken when it
//!   answered instead, the grants made meanwhile (taken off) and the growth (added) cancel out
//!   at the bucket's bottom, where the fleet sends at the refill rate. A grant re-bases
//!   the bucket at its time, keeping the rate; a full bucket says nothing; a running bucket
//!   that has less left now than a report says keeps its word (answers arrive out of order);
//!   a report of a fixed window replaces it (a `Retry-After` pause). The bounds hold as for
//!   fixed windows: full at most a day after the report or grant, what is left and the limit
//!   at most [`MAX_WINDOW_LEFT`].
//!
//! ```
//! use wavegate_core::{ProviderWindows, WindowReport};
//!
//! let mut windows = ProviderWindows::default();
//! // "0 requests left, the window resets in 30 s", with nobody else in flight.
//! let spent = WindowReport::spent_for(std::time::Duration::from_secs(30));
//! windows.report(spent, 1_000, 0, 0, None);
//! assert_eq!(windows.wait_ms(2_000, 0, 0), Some(29_000));
//! assert_eq!(windows.wait_ms(31_000, 0, 0), None);
//! ```

use std::time::Duration;

use crate::clock::duration_ms;
use crate::learned_limit::LearnedLimits;
use crate::signals::{MAX_RESET, ProviderSignals};

/// How far a report's window end may lie past the known one and still be the same window:
/// RFC 3339 resets (Anthropic) are often whole seconds, so one window's end is read up to a
/// second apart.
pub const SAME_WINDOW_MS: u64 = 1_000;

/// The longest a window runs after the report that announced it, in milliseconds: [`MAX_RESET`].
pub const MAX_WINDOW_MS: u64 = MAX_RESET.as_secs() * 1_000;

/// The most a window can have left: more than any provider announces, and a number every
/// twin (Lua's doubles included) keeps exactly.
pub const MAX_WINDOW_LEFT: u64 = 1_000_000_000_000_000;

/// What is left of one window, relative to the response that said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowLeft {
    /// Requests (or tokens) left.
    pub remaining: u64,
    /// Milliseconds from the response until the window resets.
    pub reset_ms: u64,
    /// For a continuously refilled bucket (OpenAI's headers), the limit it refills to: what is
    /// left grows back to it linearly over `reset_ms`. `None`: a fixed window that ends after
    /// `reset_ms` (Anthropic, the IETF fields, a `Retry-After`).
    pub refills_to: Option<u64>,
}

impl WindowLeft {
    /// `remaining` left of a fixed window that ends in `reset_ms`.
    pub const fn fixed(remaining: u64, reset_ms: u64) -> Self {
        Self { remaining, reset_ms, refills_to: None }
    }
}

/// What one response said is left of the provider's requests and tokens windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WindowReport {
    /// The requests window, when the response gave its remaining count and reset.
    pub requests: Option<WindowLeft>,
    /// The tokens window, likewise (not reported when the input and output parts are: each
    /// part is then tracked on its own).
    pub tokens: Option<WindowLeft>,
    /// Anthropic's input tokens window on its own, when the response gave the input and the
    /// output windows both: a grant needs its input part of it.
    pub input: Option<WindowLeft>,
    /// Anthropic's output tokens window on its own: a grant needs its output part (its
    /// `max_tokens`) of it, and what a settlement gives back of the output returns to it
    /// (Anthropic adjusts the output charged to what was used at the end of each call).
    pub output: Option<WindowLeft>,
    /// The limits the response announced with a known window (they tighten the budgets; see
    /// [`LearnedBudgets`](crate::LearnedBudgets)). Carried with the windows so one report
    /// (one script call in shared mode) says all of it.
    pub limits: LearnedLimits,
    /// The answer refused its call (a 429), which had reserved `(tokens, output of them)`:
    /// the provider counted none of it, so the windows take it back
    /// ([`ProviderWindows::refuse`]) before they take the answer in (which did not count it
    /// either; its settlement then gives nothing back to them). `None`: the answer served its
    /// call, or nothing is known of its reservation.
    pub refused: Option<(u64, u64)>,
}

impl WindowReport {
    /// What `signals` say is left (each window that came with both a remaining count and a
    /// reset) and the limits they announce. `None` when they said neither.
    pub fn from_signals(signals: &ProviderSignals) -> Option<Self> {
        let left = |w: crate::signals::Window| {
            let refills_to = if w.refills { w.limit } else { None };
            w.left().map(|(remaining, reset)| WindowLeft { remaining, reset_ms: duration_ms(reset), refills_to })
        };
        let (input, output) = match (left(signals.input), left(signals.output)) {
            (Some(input), Some(output)) => (Some(input), Some(output)),
            _ => (None, None),
        };
        let report = Self {
            requests: left(signals.requests),
            // The parts are tracked apart: their sum, folded at the share of the more used one,
            // would admit a small prompt with an output the output bucket no longer holds, and
            // could not take back what a settlement gives back of the output alone.
            tokens: if input.is_some() { None } else { left(signals.tokens) },
            input,
            output,
            limits: LearnedLimits::from_signals(signals),
            refused: None,
        };
        (!report.is_empty()).then_some(report)
    }

    /// A spent requests window for `reset` (a rate-window 429 that named no window), at most
    /// [`MAX_RESET`].
    pub fn spent_for(reset: Duration) -> Self {
        Self {
            requests: Some(WindowLeft::fixed(0, duration_ms(reset.min(MAX_RESET)))),
            tokens: None,
            input: None,
            output: None,
            limits: LearnedLimits::default(),
            refused: None,
        }
    }

    /// Whether the report says nothing.
    pub const fn is_empty(&self) -> bool {
        self.requests.is_none()
            && self.tokens.is_none()
            && self.input.is_none()
            && self.output.is_none()
            && self.limits.is_empty()
    }
}

/// One tracked window: what is left until when (clock milliseconds; 0: none known).
///
/// A fixed window (`refills_to` 0) keeps `left` until `until_ms`. A continuously refilled
/// bucket (`refills_to` its limit `L`) had `left` at `at_ms` and is full again at `until_ms`:
/// in between, what is left grows linearly from `left` to `L`
/// ([`level`](Self::level)); a grant re-bases it at the grant's time, keeping the rate.
/// The arithmetic is one sequence of IEEE doubles, the same in the Lua twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TrackedWindow {
    /// What is left (at `at_ms`, for a refilled bucket).
    pub left: u64,
    /// When the window ends (a fixed window) or the bucket is full again, in clock
    /// milliseconds (0: no window known).
    pub until_ms: u64,
    /// When `left` was last known, in clock milliseconds (a refilled bucket's base).
    pub at_ms: u64,
    /// The limit a continuously refilled bucket grows back to; 0 for a fixed window.
    pub refills_to: u64,
    /// Whether what is left came from an answer without a mark (each other call in flight
    /// counted at the reporting call's reservation: a rough count, low when the calls in flight
    /// reserved less): the next answer with a mark replaces it even when it says more.
    pub rough: bool,
    /// Which calls `left` has taken off in full: every grant after this place in the count of
    /// grants (the mark of the answer it came from; for an answer without a mark, the count
    /// when it came). A call the provider refused is given back only as far as it was taken
    /// off ([`ProviderWindows::refuse`]): an answer to a call granted after it did not count
    /// it and did not take it off. An answer with a mark that is not taken in (the window
    /// knows less) moves it up to its mark all the same: given back, a call it did not count
    /// would lift the window above what it said. `None`: none known (every call in full).
    pub base: Option<u64>,
    /// For a level from an answer without a mark: what it took off for each call in flight then
    /// (the reporting call's reservation; one request): such a call, refused, gives back no
    /// more. `None` for an answer with a mark.
    pub each: Option<u64>,
    /// What was taken off beyond what was left (an answer's count or a grant floored at 0):
    /// what a refused call gives back pays it first, so a refusal never lifts the window above
    /// what the provider had (the calls in that debt are the ones it refuses).
    pub debt: u64,
}

/// What is left less what was taken off beyond it, as one signed number.
fn signed(left: u64, debt: u64) -> i128 {
    i128::from(left) - i128::from(debt)
}

/// What a report's count could not include: what was granted after it (`spent`), and with the
/// reporting call's mark (`given_back` is `Some`) what was given back since, for a window that
/// takes it back; `as_of_ms`: when the count was taken.
#[derive(Debug, Clone, Copy)]
struct WindowCost {
    spent: u64,
    given_back: Option<u64>,
    as_of_ms: u64,
    /// The place in the count of grants after which the report took every grant off in full.
    base: u64,
    /// Without a mark: what it took off for each call in flight.
    each: Option<u64>,
}

impl WindowCost {
    /// What a report of `remaining` leaves, at most `most`, once the grants it could not count
    /// are taken off (and with a mark what was given back since is added): the level, and what
    /// those grants took off beyond it (the debt).
    fn leaves(&self, remaining: u64, most: u64) -> (u64, u64) {
        let counted = remaining.saturating_add(self.given_back.unwrap_or(0)).min(most);
        (counted.saturating_sub(self.spent), self.spent.saturating_sub(counted))
    }
}

impl TrackedWindow {
    /// Whether the window says anything at `now_ms`: before its end, and for a refilled bucket
    /// only while it is not full.
    fn runs(&self, now_ms: u64) -> bool {
        now_ms < self.until_ms && (self.refills_to == 0 || self.left < self.refills_to)
    }

    /// What is left at `now_ms` while the window runs: `left` for a fixed window; for a
    /// refilled bucket `left` plus what grew back since `at_ms`, rounded down, at most the
    /// limit.
    pub fn level(&self, now_ms: u64) -> u64 {
        if self.refills_to == 0 || !self.runs(now_ms) {
            return self.left;
        }
        let (to, left) = (self.refills_to as f64, self.left as f64);
        let since = now_ms.saturating_sub(self.at_ms) as f64;
        let span = (self.until_ms - self.at_ms.min(self.until_ms - 1)) as f64;
        let grown = (left + (to - left) * since / span).floor();
        (grown as u64).min(self.refills_to)
    }

    /// Takes in `left`, said of the provider's count at `cost.as_of_ms` (at most `now_ms`: the
    /// reporting call's admission when known), with `cost.spent` granted since. `given_back`
    /// is `Some` for a report that comes with the reporting call's mark (exact as of its
    /// grant): what settlements gave back since, for a window that takes it back (else 0).
    fn report(&mut self, left: WindowLeft, now_ms: u64, cost: WindowCost) {
        let WindowCost { given_back, base, each, .. } = cost;
        let until = now_ms.saturating_add(left.reset_ms.min(MAX_WINDOW_MS));
        // A running fixed window that ends when this bucket would be full again is that
        // window: its end proved it fixed (see `Window::refills`), and a report nearer its end
        // reads like a refill only because less is left.
        let known_fixed = self.refills_to == 0 && self.runs(now_ms) && until.abs_diff(self.until_ms) <= SAME_WINDOW_MS;
        if let Some(to) = left.refills_to.filter(|to| *to > 0 && !known_fixed) {
            let cost = WindowCost { as_of_ms: cost.as_of_ms.min(now_ms), ..cost };
            return self.report_refill(left, to.min(MAX_WINDOW_LEFT), now_ms, cost);
        }
        let (estimate, debt) = cost.leaves(left.remaining, MAX_WINDOW_LEFT);
        if left.reset_ms == 0 {
            // It resets now: nothing to keep.
            return;
        }
        if known_fixed {
            if signed(estimate, debt) < signed(self.left, self.debt) {
                (self.left, self.debt, self.base, self.each) = (estimate, debt, Some(base), each);
            } else {
                self.saw(base, each);
            }
            self.until_ms = self.until_ms.max(until);
        } else {
            *self = TrackedWindow {
                left: estimate,
                until_ms: until,
                at_ms: now_ms,
                refills_to: 0,
                rough: given_back.is_none(),
                base: Some(base),
                each,
                debt,
            };
        }
    }

    /// A report of a bucket refilled continuously to `to`: `remaining` now, full in
    /// `reset_ms`. What is left after the others in flight are counted (and what was given
    /// back since added) is full again after the same rate has refilled it (at most a day).
    /// A running refilled bucket that has no more left now keeps its word (answers arrive out
    /// of order, and calls granted before the reporting one may reach the provider after it:
    /// neither its count nor the grants since its mark have them), unless its word is a rough
    /// one and the report comes with a mark (a cold start's answers, each counting 23 others
    /// at 12,000 tokens, held a fleet's input at 0 for a minute while the provider's bucket
    /// refilled); a fixed window is replaced.
    fn report_refill(&mut self, left: WindowLeft, to: u64, now_ms: u64, cost: WindowCost) {
        let WindowCost { given_back, as_of_ms, base, each, .. } = cost;
        let remaining = left.remaining.min(to);
        let (estimate, debt) = cost.leaves(remaining, to);
        if left.reset_ms == 0 || estimate >= to {
            // Full now: nothing to keep.
            return;
        }
        let reset = left.reset_ms.min(MAX_WINDOW_MS);
        let full_in = if remaining < to {
            (reset as f64 * (to - estimate) as f64 / (to - remaining) as f64).ceil() as u64
        } else {
            reset
        };
        let until = as_of_ms.saturating_add(full_in.clamp(1, MAX_WINDOW_MS));
        if until <= now_ms {
            // Full again by now.
            return;
        }
        let marked = given_back.is_some();
        let reported = TrackedWindow {
            left: estimate,
            until_ms: until,
            at_ms: as_of_ms,
            refills_to: to,
            rough: !marked,
            base: Some(base),
            each,
            debt,
        };
        let keeps_word = !(self.rough && marked) && self.refills_to > 0 && self.runs(now_ms);
        if keeps_word && signed(self.level(now_ms), self.debt) <= signed(reported.level(now_ms), reported.debt) {
            self.saw(base, each);
            return;
        }
        *self = reported;
    }

    fn wait_ms(&self, now_ms: u64, need: u64) -> Option<u64> {
        if !self.runs(now_ms) || self.level(now_ms) >= need {
            return None;
        }
        let to_end = self.until_ms - now_ms;
        if self.refills_to == 0 || need > self.refills_to {
            return Some(to_end);
        }
        // When the bucket has grown back to `need`, at the same rate.
        let (to, left) = (self.refills_to as f64, self.left as f64);
        let span = (self.until_ms - self.at_ms.min(self.until_ms - 1)) as f64;
        let at = (self.at_ms as f64 + (need as f64 - left) * span / (to - left)).ceil() as u64;
        Some(at.saturating_sub(now_ms).clamp(1, to_end))
    }

    fn charge(&mut self, now_ms: u64, cost: u64) {
        if !self.runs(now_ms) {
            return;
        }
        let level = self.level(now_ms);
        self.debt = self.debt.saturating_add(cost.saturating_sub(level)).min(MAX_WINDOW_LEFT);
        if self.refills_to == 0 {
            self.left = self.left.saturating_sub(cost);
            return;
        }
        self.rebase(now_ms, level.saturating_sub(cost));
    }

    /// An answer whose call has the mark at `base` (`each` is `None`: it had one) was not
    /// taken in (the window knows less is
    /// left): a call granted before it and refused later may be one it did not count, which
    /// the window would then give back above what the answer said is left. It is not given
    /// back (which errs low).
    fn saw(&mut self, base: u64, each: Option<u64>) {
        if each.is_none() {
            self.base = Some(self.base.map_or(base, |known| known.max(base)));
        }
    }

    /// What `left` has taken off of a call granted at `place` in the count of grants (`None`:
    /// before the count started) that reserved `cost` here: see [`base`](Self::base) and
    /// [`each`](Self::each).
    fn took_off(&self, place: Option<u64>, cost: u64) -> u64 {
        match (self.base, place) {
            (None, _) => cost,
            (Some(base), Some(place)) if place > base => cost,
            _ => self.each.map_or(0, |each| cost.min(each)),
        }
    }

    /// Takes back `back` given back at `now_ms` (at most the limit a refilled bucket grows
    /// back to).
    fn credit(&mut self, now_ms: u64, back: u64) {
        if !self.runs(now_ms) {
            return;
        }
        // What was taken off beyond what was left comes back first.
        let paid = back.min(self.debt);
        self.debt -= paid;
        let back = back - paid;
        if back == 0 {
            return;
        }
        if self.refills_to == 0 {
            self.left = self.left.saturating_add(back).min(MAX_WINDOW_LEFT);
            return;
        }
        self.rebase(now_ms, self.level(now_ms).saturating_add(back).min(self.refills_to));
    }

    /// A refilled bucket with `left` at `now_ms`, at the same rate: full again once what is
    /// missing has grown back.
    fn rebase(&mut self, now_ms: u64, left: u64) {
        let (to, old_left) = (self.refills_to as f64, self.left as f64);
        let span = (self.until_ms - self.at_ms.min(self.until_ms - 1)) as f64;
        let full_in = ((to - left as f64) * span / (to - old_left)).ceil() as u64;
        *self = TrackedWindow {
            left,
            until_ms: now_ms.saturating_add(full_in.clamp(1, MAX_WINDOW_MS)),
            at_ms: now_ms,
            ..*self
        };
    }
}

/// What the fleet has granted since the first report: one request and its token estimate
/// (and of it, the output part) per grant, whether a window ran or not, and the output that
/// settlements gave back; each at most [`MAX_WINDOW_LEFT`].
///
/// A permit keeps the count as it stood right after its own grant (its mark); what its
/// answer says is left was counted by the provider at that call's admission, so the grants
/// made after the mark are exactly what the answer could not count yet, and the output given
/// back after it what the answer could not count back ([`ProviderWindows::report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct SentCount {
    /// Grants made.
    pub requests: u64,
    /// Tokens they reserved.
    pub tokens: u64,
    /// Of them, the output part (`max_tokens`).
    pub output: u64,
    /// Output tokens settlements gave back (an answer that used less than its `max_tokens`).
    pub given_back: u64,
    /// When the last of them was counted (clock ms): for a mark, its permit's grant.
    pub at_ms: u64,
}

impl SentCount {
    /// What was granted (and given back) after `mark` was taken from this count; `None` when
    /// `mark` lies ahead of it (the count started over since: a store that lost its state).
    pub fn since(self, mark: SentCount) -> Option<SentCount> {
        Some(SentCount {
            requests: self.requests.checked_sub(mark.requests)?,
            tokens: self.tokens.checked_sub(mark.tokens)?,
            output: self.output.checked_sub(mark.output)?,
            given_back: self.given_back.checked_sub(mark.given_back)?,
            at_ms: self.at_ms,
        })
    }

    fn add(&mut self, tokens: u64, output: u64, now_ms: u64) {
        self.requests = self.requests.saturating_add(1).min(MAX_WINDOW_LEFT);
        self.tokens = self.tokens.saturating_add(tokens).min(MAX_WINDOW_LEFT);
        self.output = self.output.saturating_add(output.min(tokens)).min(MAX_WINDOW_LEFT);
        self.at_ms = now_ms;
    }
}

/// The provider's requests and tokens windows as the fleet knows them; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ProviderWindows {
    /// The requests window.
    pub requests: TrackedWindow,
    /// The tokens window (an estimate in all).
    pub tokens: TrackedWindow,
    /// The input tokens window (Anthropic's, an estimate less its output part).
    pub input: TrackedWindow,
    /// The output tokens window (Anthropic's, an estimate's output part); it takes back what
    /// settlements give back of the output.
    pub output: TrackedWindow,
    /// What was granted since the first report (`None` before it: nothing is counted for an
    /// upstream whose answers never say what is left).
    pub sent: Option<SentCount>,
}

impl ProviderWindows {
    /// Takes in a report made at `now_ms` by a call whose permit carries `mark` (the count
    /// right after its grant, if it was taken), with `others_in_flight` other calls still
    /// running, the reporting call having reserved `tokens_each` tokens.
    ///
    /// With a mark, the calls the answer could not count are the grants made since it, at
    /// what they reserved (each part at its own), and the output window gets back what was
    /// given back since; without one (a permit granted before the first report, or in another
    /// gate), every other call in flight, each assumed to reserve `tokens_each` in each part.
    /// A report of the input and output parts ends the tokens window (the parts are tracked
    /// instead). The first report starts the count of grants.
    pub fn report(
        &mut self,
        report: WindowReport,
        now_ms: u64,
        others_in_flight: u32,
        tokens_each: u64,
        mark: Option<SentCount>,
    ) {
        if let Some((tokens, output)) = report.refused {
            // Before the answer is taken in: it did not count its call either.
            self.refuse(tokens, output, mark.map(|m| m.requests), now_ms);
        }
        let others = u64::from(others_in_flight);
        let since = self.sent.zip(mark).and_then(|(sent, mark)| Some((sent.since(mark)?, mark.at_ms)));
        // The cost of each window (requests, tokens, input, output) the answer could not count,
        // as of when, and with a mark what was given back since (the report is then exact as
        // of its call's grant; without one it only ever lowers a running bucket).
        // With a mark, every grant after it is taken off in full; without one, each call in
        // flight at the reporting call's reservation, and every grant after the count as it
        // stands now.
        let (costs, as_of_ms, given_back, base, each) = match since.zip(mark) {
            Some(((s, at), mark)) => {
                let costs = [s.requests, s.tokens, s.tokens.saturating_sub(s.output), s.output];
                (costs, at, Some(s.given_back), mark.requests, None)
            }
            None => {
                let each = others.saturating_mul(tokens_each);
                ([others, each, each, each], now_ms, None, self.sent.map_or(0, |s| s.requests), Some(tokens_each))
            }
        };
        let [requests, tokens, input, output] = costs;
        let marked = given_back.map(|_| 0);
        let cost = |spent, given_back, each| WindowCost { spent, given_back, as_of_ms, base, each };
        if let Some(left) = report.requests {
            self.requests.report(left, now_ms, cost(requests, marked, each.map(|_| 1)));
        }
        if let Some(left) = report.tokens {
            self.tokens.report(left, now_ms, cost(tokens, marked, each));
        }
        if report.input.is_some() && report.output.is_some() {
            self.tokens = TrackedWindow::default();
        }
        if let Some(left) = report.input {
            self.input.report(left, now_ms, cost(input, marked, each));
        }
        if let Some(left) = report.output {
            self.output.report(left, now_ms, cost(output, given_back, each));
        }
        self.sent.get_or_insert_with(SentCount::default);
    }

    /// How long until a grant reserving `tokens`, `output` of them its answer's, may be made,
    /// when a window refuses it now. A spent tokens (input, output) window refuses even a grant
    /// that reserves none.
    pub fn wait_ms(&self, now_ms: u64, tokens: u64, output: u64) -> Option<u64> {
        let output = output.min(tokens);
        self.wait_for(now_ms, [tokens, tokens - output, output])
    }

    /// The wait every grant reserving `tokens` sits out, however they split into input and
    /// output (each part needing one at least): a lower bound of [`wait_ms`](Self::wait_ms).
    pub fn least_wait_ms(&self, now_ms: u64, tokens: u64) -> Option<u64> {
        self.wait_for(now_ms, [tokens, 1, 1])
    }

    /// The longest wait of the running windows for one request and `[tokens, input, output]`
    /// (each needing one at least).
    fn wait_for(&self, now_ms: u64, [tokens, input, output]: [u64; 3]) -> Option<u64> {
        [
            self.requests.wait_ms(now_ms, 1),
            self.tokens.wait_ms(now_ms, tokens.max(1)),
            self.input.wait_ms(now_ms, input.max(1)),
            self.output.wait_ms(now_ms, output.max(1)),
        ]
        .into_iter()
        .flatten()
        .max()
    }

    /// Counts a grant reserving `tokens`, `output` of them its answer's, down from the running
    /// windows, and in what was granted since the first report. Answers the grant's mark
    /// (`None` before any report).
    pub fn charge(&mut self, now_ms: u64, tokens: u64, output: u64) -> Option<SentCount> {
        let output = output.min(tokens);
        self.requests.charge(now_ms, 1);
        self.tokens.charge(now_ms, tokens);
        self.input.charge(now_ms, tokens - output);
        self.output.charge(now_ms, output);
        if let Some(sent) = &mut self.sent {
            sent.add(tokens, output, now_ms);
        }
        self.sent
    }

    /// A settlement at `now_ms` gave back `output` tokens of an answer's output (it used less
    /// than it reserved; Anthropic adjusts its output bucket so at the call's end, before the
    /// answer is read): the output window takes them back now, and they are counted, so a later
    /// answer with a mark adds back what was given back after its call's grant.
    pub fn give_back(&mut self, output: u64, now_ms: u64) {
        self.output.credit(now_ms, output);
        if let Some(sent) = &mut self.sent {
            sent.given_back = sent.given_back.saturating_add(output).min(MAX_WINDOW_LEFT);
        }
    }

    /// A call the provider refused (a 429: it counted none of it) gives its whole reservation
    /// back at `now_ms`, `tokens` reserved and `output` of them its answer's, granted at
    /// `place` in the count of grants (its mark's `requests`; `None` without a mark): one
    /// request and each part to every running window that took it off
    /// ([`TrackedWindow::base`]: not one set by an answer to a call granted after it, which
    /// neither counted nor took it off). (Kept charged, a cold start's burst of 429s held the
    /// windows low until they were full again: the provider never charged those calls, and a
    /// running bucket is never raised by an answer.)
    ///
    /// Not counted for the marks: an answer to a call granted before a refused one, coming
    /// after the refusal, still takes the refused call off (it was granted after that call's
    /// mark), which errs low. Adding every refusal since a mark back would err high for calls
    /// granted before the mark and refused after it; telling the two apart needs each
    /// refusal's place kept until every earlier call has answered.
    pub fn refuse(&mut self, tokens: u64, output: u64, place: Option<u64>, now_ms: u64) {
        let output = output.min(tokens);
        for (window, back) in [
            (&mut self.requests, 1),
            (&mut self.tokens, tokens),
            (&mut self.input, tokens - output),
            (&mut self.output, output),
        ] {
            let back = window.took_off(place, back);
            window.credit(now_ms, back);
        }
    }

    /// Forgets every window (an operator's clear): grants go on as if no report had come.
    /// The count of grants goes on (the marks of the permits held still refer to it).
    pub fn clear(&mut self) {
        *self = Self { sent: self.sent, ..Self::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests(remaining: u64, reset_ms: u64) -> WindowReport {
        WindowReport { requests: Some(WindowLeft::fixed(remaining, reset_ms)), ..WindowReport::default() }
    }

    /// The answers of a gateway that counts 100k tokens in fixed one-minute windows and speaks
    /// OpenAI's headers (reset: the window's end), read as they arrive.
    fn fixed_minute_in_openai_headers(remaining: u64, reset_ms: u64) -> WindowReport {
        let (remaining, reset) = (remaining.to_string(), format!("{reset_ms}ms"));
        let headers = [
            ("x-ratelimit-limit-tokens", "100000"),
            ("x-ratelimit-remaining-tokens", remaining.as_str()),
            ("x-ratelimit-reset-tokens", reset.as_str()),
        ];
        let now = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let signals = ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), now);
        WindowReport::from_signals(&signals).expect("a report")
    }

    #[test]
    fn a_fixed_window_told_in_openai_headers_is_spent_then_waited_for_not_trickled() {
        // The scenario provider-headers before the fix: 4 processes, limit 10, 200 tokens a
        // call. Read as a refill, the first answer (200 spent, "full" in 59 s) with 9 other
        // calls in flight promised 100k back over 10 minutes: after the window, one call every
        // 1.2 s, and jobs waited 5 minutes.
        let mut w = ProviderWindows::default();
        w.report(fixed_minute_in_openai_headers(99_800, 59_000), 1_000, 9, 200, None);
        let mut granted = 0;
        while w.wait_ms(1_000, 200, 0).is_none() {
            w.charge(1_000, 200, 0);
            granted += 1;
        }
        assert_eq!(granted, 490, "the window's 98,000 after the 9 in flight");
        // A later answer, nearer the end and with less left, is the same window.
        w.report(fixed_minute_in_openai_headers(2_000, 40_000), 20_000, 0, 200, w.sent);
        assert_eq!(w.wait_ms(20_000, 200, 0), Some(40_000), "nothing before the window's end");
        // At its end the whole next window may go.
        let after = 60_001;
        for _ in 0..400 {
            assert_eq!(w.wait_ms(after, 200, 0), None);
            w.charge(after, 200, 0);
        }
    }

    #[test]
    fn the_others_in_flight_are_counted_and_grants_count_down() {
        let mut w = ProviderWindows::default();
        w.report(requests(5, 10_000), 0, 3, 0, None);
        assert_eq!(
            w.requests,
            TrackedWindow {
                left: 2,
                until_ms: 10_000,
                at_ms: 0,
                refills_to: 0,
                rough: true,
                base: Some(0),
                each: Some(1),
                debt: 0
            }
        );
        assert_eq!(w.wait_ms(1, 0, 0), None);
        w.charge(1, 0, 0);
        w.charge(2, 0, 0);
        assert_eq!(w.wait_ms(3, 0, 0), Some(9_997));
        assert_eq!(w.wait_ms(10_000, 0, 0), None, "the window ended");
    }

    #[test]
    fn an_older_answer_of_the_same_window_never_raises_what_is_left() {
        let mut w = ProviderWindows::default();
        w.report(requests(3, 10_000), 0, 0, 0, None);
        w.report(requests(7, 9_500), 400, 0, 0, None);
        assert_eq!(w.requests.left, 3);
        // A later window replaces it.
        w.report(requests(50, 60_000), 11_000, 0, 0, None);
        assert_eq!(
            w.requests,
            TrackedWindow {
                left: 50,
                until_ms: 71_000,
                at_ms: 11_000,
                refills_to: 0,
                rough: true,
                base: Some(0),
                each: Some(1),
                debt: 0
            }
        );
    }

    #[test]
    fn an_earlier_end_shortens_the_window_and_no_window_outlives_a_day() {
        let mut w = ProviderWindows::default();
        // A Retry-After of a day, then a 200 saying 999 are left for the next minute.
        w.report(WindowReport::spent_for(Duration::from_secs(86_400)), 0, 0, 0, None);
        assert_eq!(w.wait_ms(1_000, 0, 0), Some(86_399_000));
        w.report(requests(999, 60_000), 2_000, 0, 0, None);
        assert_eq!(
            w.requests,
            TrackedWindow {
                left: 999,
                until_ms: 62_000,
                at_ms: 2_000,
                refills_to: 0,
                rough: true,
                base: Some(0),
                each: Some(1),
                debt: 0
            }
        );
        assert_eq!(w.wait_ms(2_000, 0, 0), None, "the provider's newer word ends the pause");
        // An absurd reset is a day at most, and the end stays a number the store can return.
        w.report(requests(0, u64::MAX), 3_000, 0, 0, None);
        assert_eq!(w.requests.until_ms, 3_000 + MAX_WINDOW_MS);
        assert_eq!(WindowReport::spent_for(Duration::MAX).requests.map(|r| r.reset_ms), Some(MAX_WINDOW_MS));
        w.clear();
        assert_eq!(w.wait_ms(4_000, 0, 0), None, "cleared");
    }

    fn refilling(remaining: u64, reset_ms: u64, to: u64) -> WindowReport {
        let requests = Some(WindowLeft { remaining, reset_ms, refills_to: Some(to) });
        WindowReport { requests, ..WindowReport::default() }
    }

    #[test]
    fn openai_s_reset_refills_the_bucket_instead_of_ending_a_window() {
        let mut w = ProviderWindows::default();
        // 0 of 60 left, full in 60 s: one back a second, not 0 for a minute.
        w.report(refilling(0, 60_000, 60), 0, 0, 0, None);
        assert_eq!(w.wait_ms(0, 0, 0), Some(1_000));
        assert_eq!(w.requests.level(30_000), 30);
        assert_eq!(w.wait_ms(30_000, 0, 0), None);
        w.charge(30_000, 0, 0);
        assert_eq!(w.requests.level(30_000), 29, "a grant costs one");
        assert_eq!(w.requests.until_ms, 61_000, "and is back a second later");
        assert_eq!(w.wait_ms(61_000, 0, 0), None, "full: nothing to say");
        // The others in flight are counted, and full comes later by what they cost.
        w.report(refilling(10, 50_000, 60), 100_000, 5, 0, None);
        assert_eq!(
            w.requests,
            TrackedWindow {
                left: 5,
                until_ms: 155_000,
                at_ms: 100_000,
                refills_to: 60,
                rough: true,
                base: Some(1),
                each: Some(1),
                debt: 0
            }
        );
        // Full, or an absurd reset: nothing kept beyond the bounds.
        let mut full = ProviderWindows::default();
        full.report(refilling(60, 1_000, 60), 0, 0, 0, None);
        assert_eq!(full.wait_ms(0, 0, 0), None);
        full.report(refilling(0, u64::MAX, u64::MAX), 0, 0, 0, None);
        assert_eq!(full.requests.until_ms, MAX_WINDOW_MS);
        assert_eq!(full.requests.refills_to, MAX_WINDOW_LEFT);
        assert!(full.wait_ms(0, 0, 0).is_some_and(|wait| wait <= MAX_WINDOW_MS));
    }

    #[test]
    fn tokens_need_what_the_grant_reserves() {
        let mut w = ProviderWindows::default();
        let tokens = Some(WindowLeft::fixed(1_000, 5_000));
        let report = WindowReport { tokens, ..WindowReport::default() };
        w.report(report, 0, 2, 300, None);
        assert_eq!(w.tokens.left, 400);
        assert_eq!(w.wait_ms(0, 400, 0), None);
        assert_eq!(w.wait_ms(0, 401, 0), Some(5_000));
        w.charge(0, 400, 0);
        assert_eq!(w.wait_ms(0, 0, 0), Some(5_000), "a spent tokens window refuses every grant");
    }

    fn parts(input: (u64, u64), output: (u64, u64)) -> WindowReport {
        let part =
            |(remaining, reset_ms): (u64, u64), to| Some(WindowLeft { remaining, reset_ms, refills_to: Some(to) });
        WindowReport { input: part(input, 50_000), output: part(output, 8_000), ..WindowReport::default() }
    }

    #[test]
    fn input_and_output_are_tracked_apart_and_the_output_takes_back_what_is_given_back() {
        let mut w = ProviderWindows::default();
        // A tokens window folded from both, then a report of the parts: the parts replace it.
        let folded = WindowReport { tokens: Some(WindowLeft::fixed(100, 60_000)), ..WindowReport::default() };
        w.report(folded, 0, 0, 0, None);
        w.report(parts((40_000, 12_000), (400, 57_000)), 0, 0, 0, None);
        assert_eq!(w.tokens, TrackedWindow::default(), "the folded window ends");
        // A small prompt with an output the output bucket no longer holds waits for the output.
        assert_eq!(w.wait_ms(0, 1_400, 400), None);
        assert_eq!(w.wait_ms(0, 1_500, 500), Some(750), "100 more output at 133 a second");
        // Two grants of 400 out, then one of them settles having used 100: 300 given back.
        let first = w.charge(0, 1_400, 400).expect("a mark");
        w.give_back(300, 0);
        // The answer to the first call: 0 output left as the provider counted at its
        // admission; the 300 given back since are back.
        w.report(parts((39_000, 13_000), (0, 60_000)), 500, 0, 0, Some(first));
        assert_eq!(w.output.left, 300, "what was given back since the call's grant");
        assert_eq!(w.input.left, 39_000);
        // An older answer (a report without a mark) never raises it.
        w.report(parts((49_000, 1_000), (7_000, 8_000)), 600, 0, 0, None);
        assert_eq!(w.output.level(600), 380, "300 and 100 ms of refill since the grant");
        // Without a mark each other call in flight counts its whole reservation in each part.
        let mut cold = ProviderWindows::default();
        cold.report(parts((40_000, 12_000), (4_000, 30_000)), 0, 2, 1_000, None);
        assert_eq!((cold.input.left, cold.output.left), (38_000, 2_000));
    }
}
