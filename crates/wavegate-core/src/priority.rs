//! Priority classes: which waiting class a free permit goes to.
//!
//! An upstream may split its callers into classes (e.g. `interactive` and `batch`), each with
//! a **weight** and an optional **reserved share** of the limit. When callers of several
//! classes wait, each free permit goes to the class that is furthest below its share:
//!
//! 1. classes below their reserve (in flight < `reserve_percent` of the current limit, rounded
//!    down) come first, the one that has used the smallest part of its reserve first;
//! 2. then weighted turns over the grants (stride scheduling): each class has a *pass*, a
//!    virtual time that a grant advances by `STRIDE_SCALE / weight`, and the next permit goes
//!    to the class whose pass after it would be smallest. With weights 3 and 1 and both
//!    waiting, interactive gets three grants for each of batch's, at any limit (a limit of 1,
//!    a fallback's share of 2): no class starves. A class that starts waiting is lifted to the
//!    current virtual time, so an idle class banks no credit, and a heavier class that starts
//!    waiting under a flood of a lighter one is served at the next free permit;
//! 3. ties go to the class that has waited longest, then to the class listed first.
//!
//! Only classes with callers waiting take part, so an idle class's share is borrowed by the
//! others and a reserve is kept only while its class waits. Within a class callers are served
//! first in, first out.
//!
//! The choice is one pure function, [`choose_class`], with a twin in `lua/priority.lua` that
//! the shared-mode scripts run inside Redis (so the choice is atomic across the fleet); both
//! pass the same table, `cases` (the `spec` feature).
//!
//! ```
//! use wavegate_core::priority::{ClassTurns, ClassView, choose_class};
//!
//! // Limit 10, all in flight for batch (weight 1), which has had 50 grants; interactive
//! // (weight 3) starts waiting.
//! let mut turns = ClassTurns::new(2);
//! let view = |weight, in_flight, demand| ClassView { weight, reserved: 0, in_flight, demand, since_ms: 0, pass: 0 };
//! let mut classes = [view(3, 0, 0), view(1, 10, 200)];
//! for _ in 0..50 {
//!     turns.observe(&mut classes);
//!     turns.granted(1, 1);
//! }
//! classes[0].demand = 1;
//! turns.observe(&mut classes); // interactive is lifted to the virtual time: no banked credit
//! // The next free permit goes to interactive, whoever asks ...
//! assert_eq!(choose_class(&mut classes.clone(), 1, |_| true), Some(0));
//! // ... and a batch caller asking for it is told to wait.
//! assert_eq!(choose_class(&mut classes, 1, |class| class == 1), None);
//! ```

use std::cmp::Ordering;
use std::fmt;
use std::num::NonZeroU32;

use crate::config::{ConfigError, UpstreamName};

/// A configured priority class: its name, weight and reserved share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityClass {
    name: UpstreamName,
    weight: NonZeroU32,
    reserve_percent: u8,
    budget_percent: u8,
}

impl PriorityClass {
    /// The longest class name accepted (it becomes part of permit ids and a metric label).
    pub const MAX_NAME_LEN: usize = 32;

    /// A class of weight 1 and no reserve. The name follows the rules of upstream names
    /// (`A-Z a-z 0-9 _ - .`) and has at most [`MAX_NAME_LEN`](Self::MAX_NAME_LEN) characters.
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        if name.len() > Self::MAX_NAME_LEN {
            return Err(ConfigError::InvalidClass { class: name, reason: "it is longer than 32 characters".into() });
        }
        let name = UpstreamName::new(name).map_err(|error| match error {
            ConfigError::InvalidName { name, reason } => {
                ConfigError::InvalidClass { class: name, reason: reason.into() }
            }
            other => other,
        })?;
        Ok(Self { name, weight: NonZeroU32::MIN, reserve_percent: 0, budget_percent: 100 })
    }

    /// Its weight: with several classes waiting, the limit is shared in proportion to the
    /// weights. At least 1 (refused otherwise), at most 1000.
    pub fn weight(mut self, weight: u32) -> Result<Self, ConfigError> {
        match NonZeroU32::new(weight).filter(|w| w.get() <= 1000) {
            Some(weight) => {
                self.weight = weight;
                Ok(self)
            }
            None => Err(ConfigError::InvalidClass {
                class: self.name.to_string(),
                reason: format!("weight {weight} is outside 1..=1000"),
            }),
        }
    }

    /// The part of the current limit kept for this class while it waits, in percent (rounded
    /// down to whole permits). At most 100; the reserves of an upstream's classes must not add
    /// up to more than 100.
    pub fn reserve_percent(mut self, percent: u8) -> Result<Self, ConfigError> {
        if percent > 100 {
            return Err(ConfigError::InvalidClass {
                class: self.name.to_string(),
                reason: format!("reserve {percent} % is above 100 %"),
            });
        }
        self.reserve_percent = percent;
        Ok(self)
    }

    /// The most of the upstream's rate budgets (requests and tokens per minute, rate and
    /// burst alike) this class may use, in percent, 1..=100 (100, the default: no cap of its
    /// own). A cap holds even when the class is alone, so that the rest of the budget is there
    /// when another class's callers arrive (rate budgets cannot be taken back).
    pub fn budget_percent(mut self, percent: u8) -> Result<Self, ConfigError> {
        if !(1..=100).contains(&percent) {
            return Err(ConfigError::InvalidClass {
                class: self.name.to_string(),
                reason: format!("budget share {percent} % is outside 1..=100 %"),
            });
        }
        self.budget_percent = percent;
        Ok(self)
    }

    /// The class's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The class's weight.
    pub fn weight_value(&self) -> NonZeroU32 {
        self.weight
    }

    /// The class's reserved share of the limit, in percent.
    pub fn reserve_percent_value(&self) -> u8 {
        self.reserve_percent
    }

    /// The most of the upstream's rate budgets the class may use, in percent (100: no cap).
    pub fn budget_percent_value(&self) -> u8 {
        self.budget_percent
    }

    /// The permits reserved for it at `limit`.
    pub fn reserved_at(&self, limit: u32) -> u32 {
        reserved_at(limit, self.reserve_percent)
    }
}

impl fmt::Display for PriorityClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (weight {}, reserve {} %", self.name, self.weight, self.reserve_percent)?;
        if self.budget_percent < 100 {
            write!(f, ", at most {} % of the rate budgets", self.budget_percent)?;
        }
        write!(f, ")")
    }
}

/// The permits a reserve of `percent` keeps at `limit`: rounded down.
pub fn reserved_at(limit: u32, percent: u8) -> u32 {
    (u64::from(limit) * u64::from(percent) / 100) as u32
}

/// Checks an upstream's classes: unique names and reserves that add up to at most 100 %.
pub(crate) fn validate(upstream: &str, classes: &[PriorityClass]) -> Result<(), ConfigError> {
    for (i, class) in classes.iter().enumerate() {
        if classes[..i].iter().any(|other| other.name == class.name) {
            return Err(ConfigError::InvalidClass {
                class: class.name.to_string(),
                reason: format!("upstream `{upstream}` lists it twice"),
            });
        }
    }
    let total: u32 = classes.iter().map(|c| u32::from(c.reserve_percent)).sum();
    if total > 100 {
        return Err(ConfigError::InvalidClass {
            class: classes.iter().map(|c| c.name.to_string()).collect::<Vec<_>>().join(", "),
            reason: format!(
                "their reserves add up to {total} % of upstream `{upstream}`'s limit; keep the sum at most 100 %"
            ),
        });
    }
    Ok(())
}

/// The virtual time one grant costs a class of weight 1 (a class of weight `w` pays
/// `STRIDE_SCALE / w`). Weights are at most 1000, so every stride is at least 1000.
pub const STRIDE_SCALE: u64 = 1_000_000;

/// What one grant advances the pass of a class of `weight` by.
pub fn stride(weight: u32) -> u64 {
    STRIDE_SCALE / u64::from(weight.max(1))
}

/// One class as the choice sees it, across the fleet (or in one process in local mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassView {
    /// Its weight (at least 1).
    pub weight: u32,
    /// Permits reserved for it at the current limit.
    pub reserved: u32,
    /// Its permits in flight.
    pub in_flight: u32,
    /// Its callers waiting (0: it takes no part).
    pub demand: u32,
    /// Since when its longest waiter waits (ms, any common clock): ties go to the earliest.
    pub since_ms: u64,
    /// Its place in the weighted turns ([`ClassTurns`]): the virtual time of its last grant,
    /// lifted to the current one when it started waiting.
    pub pass: u64,
}

/// Whether class `a` comes before class `b` for the next permit (both waiting).
fn before(a: &ClassView, ia: usize, b: &ClassView, ib: usize) -> bool {
    let a_reserved = a.in_flight < a.reserved;
    let b_reserved = b.in_flight < b.reserved;
    let by_share = match (a_reserved, b_reserved) {
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // Both below their reserve: the smaller used part of it, (in flight + 1) / reserved.
        (true, true) => (u64::from(a.in_flight) + 1)
            .saturating_mul(u64::from(b.reserved))
            .cmp(&(u64::from(b.in_flight) + 1).saturating_mul(u64::from(a.reserved))),
        // Weighted turns: the smaller pass after this grant.
        (false, false) => a.pass.saturating_add(stride(a.weight)).cmp(&b.pass.saturating_add(stride(b.weight))),
    };
    by_share.then(a.since_ms.cmp(&b.since_ms)).then(ia.cmp(&ib)) == Ordering::Less
}

/// The waiting class the next free permit goes to, if any waits.
pub fn next_class(classes: &[ClassView]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, class) in classes.iter().enumerate() {
        if class.demand == 0 {
            continue;
        }
        if best.is_none_or(|b| before(class, i, &classes[b], b)) {
            best = Some(i);
        }
    }
    best
}

/// Hands out `room` free permits one by one to the waiting classes, in the order above, and
/// returns the first class for which `asked` holds (the asker's classes), or `None` when all
/// the room goes to others first. `classes` is updated as if the permits before it had been
/// granted (in flight up, demand down).
pub fn choose_class(classes: &mut [ClassView], room: u32, asked: impl Fn(usize) -> bool) -> Option<usize> {
    for _ in 0..room {
        let class = next_class(classes)?;
        if asked(class) {
            return Some(class);
        }
        let view = &mut classes[class];
        // A grant through the reserve is outside the turns (see [`by_reserve`]).
        if !by_reserve(view) {
            view.pass = view.pass.saturating_add(stride(view.weight));
        }
        view.in_flight += 1;
        view.demand -= 1;
    }
    None
}

/// Whether the next permit of `class` is granted through its reserve (it holds fewer than
/// its reserve). Such a grant is outside the turns: it advances neither the class's pass nor
/// the virtual time, so a class that keeps refilling its reserve does not run the turns ahead
/// of the others (which would let a lighter class, far behind, take every permit from a
/// heavier one that starts waiting).
pub fn by_reserve(class: &ClassView) -> bool {
    class.in_flight < class.reserved
}

/// The weighted turns of an upstream's classes, kept from one choice to the next (in the
/// coordinator in local mode and fallback; its twin in Redis, in `lua/priority.lua`, for the
/// fleet): each class's pass, whether it was waiting at the last choice, and the virtual time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassTurns {
    passes: Vec<u64>,
    waiting: Vec<bool>,
    virtual_time: u64,
}

impl ClassTurns {
    /// Turns for `classes` classes, all idle.
    pub fn new(classes: usize) -> Self {
        Self { passes: vec![0; classes], waiting: vec![false; classes], virtual_time: 0 }
    }

    /// Before a choice: a class that starts waiting is lifted to the virtual time (an idle
    /// class banks no credit); a class that waits no more is marked idle. Sets each view's
    /// pass.
    pub fn observe(&mut self, views: &mut [ClassView]) {
        for (i, view) in views.iter_mut().enumerate().take(self.passes.len()) {
            let waits = view.demand > 0;
            if waits && !self.waiting[i] {
                self.passes[i] = self.passes[i].max(self.virtual_time);
            }
            self.waiting[i] = waits;
            view.pass = self.passes[i];
        }
    }

    /// After a grant to `class` (of `weight`) by the turns (not one [`by_reserve`]): the
    /// virtual time moves to its pass, which advances by its stride.
    pub fn granted(&mut self, class: usize, weight: u32) {
        if let Some(pass) = self.passes.get_mut(class) {
            self.virtual_time = self.virtual_time.max(*pass);
            *pass = pass.saturating_add(stride(weight));
        }
    }
}

/// One case of the class choice: the classes, the room, the asker's classes, the answer.
#[cfg(any(test, feature = "spec"))]
#[derive(Debug, Clone)]
pub struct ChoiceCase {
    /// What the case shows.
    pub name: &'static str,
    /// The classes, in configured order.
    pub classes: Vec<ClassView>,
    /// Free permits.
    pub room: u32,
    /// The asker's classes (indices).
    pub asked: Vec<usize>,
    /// The class granted, or `None` (the asker waits).
    pub expect: Option<usize>,
}

/// The table both twins pass ([`choose_class`] and `lua/priority.lua`). Passes are in units
/// of [`STRIDE_SCALE`] (`S`): a grant costs weight 1 `S`, weight 3 `S / 3`, weight 4 `S / 4`.
#[cfg(any(test, feature = "spec"))]
pub fn cases() -> Vec<ChoiceCase> {
    const S: u64 = STRIDE_SCALE;
    let class = |weight, reserved, in_flight, demand, since_ms, pass| ClassView {
        weight,
        reserved,
        in_flight,
        demand,
        since_ms,
        pass,
    };
    vec![
        ChoiceCase {
            name: "one class: whoever asks gets the room",
            classes: vec![class(1, 0, 3, 1, 0, 7 * S)],
            room: 1,
            asked: vec![0],
            expect: Some(0),
        },
        ChoiceCase {
            name: "no room: nobody",
            classes: vec![class(1, 0, 10, 5, 0, 0)],
            room: 0,
            asked: vec![0],
            expect: None,
        },
        ChoiceCase {
            name: "a batch flood holds every permit: interactive (weight 3, lifted to batch's last start) gets the next one, batch waits",
            // interactive: 9 S + S / 3 < batch: 10 S + S.
            classes: vec![class(3, 0, 0, 1, 900, 9 * S), class(1, 0, 10, 200, 0, 10 * S)],
            room: 1,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "... and interactive asking gets it",
            classes: vec![class(3, 0, 0, 1, 900, 9 * S), class(1, 0, 10, 200, 0, 10 * S)],
            room: 1,
            asked: vec![0],
            expect: Some(0),
        },
        ChoiceCase {
            name: "weights 3 : 1 both waiting: interactive while its pass after the grant is the smaller",
            // interactive 5 S + S / 3 < batch 5 S + S.
            classes: vec![class(3, 0, 5, 9, 100, 5 * S), class(1, 0, 2, 9, 0, 5 * S)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "weights 3 : 1: batch once interactive's three turns are used",
            // interactive 6 S + S / 3 > batch 5 S + S.
            classes: vec![class(3, 0, 6, 9, 0, 6 * S), class(1, 0, 1, 9, 100, 5 * S)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "the turns count grants, not permits in flight: batch holding nothing waits its turn",
            classes: vec![class(3, 0, 1, 9, 0, 4 * S), class(1, 0, 0, 9, 0, 5 * S)],
            room: 1,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "limit 1, weights 10 : 1: batch still gets its turn (no starvation at a small limit)",
            // interactive 12 S + S / 10 > batch 11 S + S.
            classes: vec![class(10, 0, 0, 9, 50, 12 * S + S / 10), class(1, 0, 0, 9, 0, 11 * S)],
            room: 1,
            asked: vec![1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "an idle class's share is borrowed: batch alone takes all the room",
            classes: vec![class(3, 0, 0, 0, 0, 0), class(1, 0, 9, 50, 0, 90 * S)],
            room: 1,
            asked: vec![1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "the same pass after the grant: the class that waited longest",
            classes: vec![class(1, 0, 2, 1, 700, 4 * S), class(1, 0, 2, 1, 300, 4 * S)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "a full tie: the class listed first",
            classes: vec![class(2, 0, 1, 1, 5, S), class(2, 0, 1, 1, 5, S)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "room for two: the first goes to interactive's one waiter, the second to batch",
            classes: vec![class(3, 0, 0, 1, 0, 8 * S), class(1, 0, 8, 100, 0, 8 * S)],
            room: 2,
            asked: vec![1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "room for two, interactive waits for two: batch waits",
            // interactive 8 S + S / 3, then 8 S + 2 S / 3, both before batch's 9 S.
            classes: vec![class(3, 0, 0, 2, 0, 8 * S), class(1, 0, 8, 100, 0, 8 * S)],
            room: 2,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "room for two, equal weights, both flooding: the first to the longest wait, the second to the other class",
            classes: vec![class(1, 0, 3, 5, 0, 2 * S), class(1, 0, 3, 5, 10, 2 * S)],
            room: 2,
            asked: vec![1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "below its reserve a class comes first, even when it is not its turn",
            classes: vec![class(9, 0, 0, 5, 0, 0), class(1, 2, 1, 5, 100, 50 * S)],
            room: 1,
            asked: vec![0],
            expect: None,
        },
        ChoiceCase {
            name: "a grant through the reserve is outside the turns: it does not spend the class's turn",
            // Room for two: class 0's reserve takes the first, its pass stays 0; the second is
            // by turns, S against S, and class 0 has waited longer.
            classes: vec![class(1, 1, 0, 5, 0, 0), class(1, 0, 3, 5, 10, 0)],
            room: 2,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "a reserve is not kept for a class that does not wait",
            classes: vec![class(1, 0, 8, 5, 0, 8 * S), class(1, 2, 0, 0, 0, 0)],
            room: 2,
            asked: vec![0],
            expect: Some(0),
        },
        ChoiceCase {
            name: "two classes below their reserves, the same used part of it: the longest wait",
            // (1 + 1) / 4 = (0 + 1) / 2: class 1 has waited longer.
            classes: vec![class(1, 4, 1, 3, 50, 0), class(1, 2, 0, 3, 10, 5 * S)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "two classes below their reserves: the smaller used part of it",
            // (2 + 1) / 4 < (1 + 1) / 2, although class 1 has waited longer.
            classes: vec![class(1, 4, 2, 3, 50, 5 * S), class(1, 2, 1, 3, 10, 0)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "at its reserve a class takes turns by weight again",
            // class 1 at its reserve of 2: 3 S + S; class 0: 3 S + S / 2.
            classes: vec![class(2, 0, 3, 5, 100, 3 * S), class(1, 2, 2, 5, 0, 3 * S)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "three classes, room for three: each permit to the smallest pass after it",
            // c0 (weight 4) S / 4, c2 (weight 2) S / 2 — c0 again at 2 S / 4 ties c2, listed
            // first — then c2: c1 (weight 1, pass after: S) gets none of the first three.
            classes: vec![class(4, 0, 0, 3, 0, 0), class(1, 0, 2, 5, 0, 0), class(2, 0, 0, 1, 0, 0)],
            room: 3,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "... nor the fourth (c0 at 3 S / 4 before c1 at S)",
            classes: vec![class(4, 0, 0, 3, 0, 0), class(1, 0, 2, 5, 0, 0), class(2, 0, 0, 1, 0, 0)],
            room: 4,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "... and with room for five c1 gets the fifth (c0's demand of 3 and c2's of 1 are met)",
            classes: vec![class(4, 0, 0, 3, 0, 0), class(1, 0, 2, 5, 0, 0), class(2, 0, 0, 1, 0, 0)],
            room: 5,
            asked: vec![1],
            expect: Some(1),
        },
    ]
}

/// One case of the weighted turns kept from choice to choice ([`ClassTurns`]): the classes'
/// weights and reserves, then steps, each the classes' demand and permits in flight; at each
/// step the turns observe the classes, the next class is chosen and, unless it is granted
/// through its reserve, charged its turn.
#[cfg(any(test, feature = "spec"))]
#[derive(Debug, Clone)]
pub struct TurnsCase {
    /// What the case shows.
    pub name: &'static str,
    /// Each class's weight.
    pub weights: Vec<u32>,
    /// Each class's reserve, in permits.
    pub reserved: Vec<u32>,
    /// Each step: (demand, in flight) per class.
    pub steps: Vec<(Vec<u32>, Vec<u32>)>,
    /// The class chosen at each step.
    pub expect: Vec<Option<usize>>,
}

#[cfg(any(test, feature = "spec"))]
impl TurnsCase {
    /// Runs the case on [`ClassTurns`] and [`next_class`]: the class chosen at each step.
    pub fn run(&self) -> Vec<Option<usize>> {
        let mut turns = ClassTurns::new(self.weights.len());
        self.steps
            .iter()
            .map(|(demand, in_flight)| {
                let mut views: Vec<ClassView> = (0..self.weights.len())
                    .map(|i| ClassView {
                        weight: self.weights[i],
                        reserved: self.reserved[i],
                        in_flight: in_flight[i],
                        demand: demand[i],
                        since_ms: 0,
                        pass: 0,
                    })
                    .collect();
                turns.observe(&mut views);
                let chosen = next_class(&views);
                if let Some(c) = chosen
                    && !by_reserve(&views[c])
                {
                    turns.granted(c, self.weights[c]);
                }
                chosen
            })
            .collect()
    }
}

/// The table of turns both twins pass ([`ClassTurns`] and `lua/priority.lua`).
#[cfg(any(test, feature = "spec"))]
pub fn turns_cases() -> Vec<TurnsCase> {
    let repeat = |n: usize, demand: Vec<u32>, in_flight: Vec<u32>| vec![(demand, in_flight); n];
    vec![
        TurnsCase {
            name: "weights 3 : 1 both waiting: three grants to one",
            weights: vec![3, 1],
            reserved: vec![0, 0],
            steps: repeat(8, vec![5, 5], vec![0, 0]),
            expect: [0, 0, 0, 1, 0, 0, 0, 1].map(Some).to_vec(),
        },
        TurnsCase {
            name: "an idle class banks no credit: lifted to the virtual time when it starts waiting",
            weights: vec![1, 1],
            reserved: vec![0, 0],
            steps: [repeat(3, vec![0, 5], vec![0, 0]), repeat(3, vec![5, 5], vec![0, 0])].concat(),
            // Without the lift class 0 (pass 0) would take the last three.
            expect: [1, 1, 1, 0, 0, 1].map(Some).to_vec(),
        },
        TurnsCase {
            name: "grants through a reserve do not run the turns ahead: a heavier class that starts waiting is next",
            weights: vec![3, 1, 10],
            reserved: vec![2, 0, 0],
            steps: [repeat(50, vec![5, 5, 0], vec![0, 8, 0]), vec![(vec![0, 5, 5], vec![2, 8, 0])]].concat(),
            expect: [vec![Some(0); 50], vec![Some(2)]].concat(),
        },
        TurnsCase {
            name: "nobody waits: no choice, no turn",
            weights: vec![2, 1],
            reserved: vec![0, 0],
            steps: repeat(2, vec![0, 0], vec![1, 1]),
            expect: vec![None, None],
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_of_the_table() {
        for case in cases() {
            let mut classes = case.classes.clone();
            let got = choose_class(&mut classes, case.room, |c| case.asked.contains(&c));
            assert_eq!(got, case.expect, "{}", case.name);
        }
    }

    /// Both classes always waiting, every call as long, at `limit`: when the limit is full
    /// the oldest permit ends, and the freed permit is chosen again. Interactive's share.
    fn interactive_share(weights: [u32; 2], limit: usize) -> f64 {
        let mut held = std::collections::VecDeque::new();
        let mut in_flight = [0u32; 2];
        let mut granted = [0u32; 2];
        let mut turns = ClassTurns::new(2);
        for _ in 0..1_200 {
            if held.len() == limit {
                let done: usize = held.pop_front().expect("full");
                in_flight[done] -= 1;
            }
            let mut views = [0, 1].map(|i| ClassView {
                weight: weights[i],
                reserved: 0,
                in_flight: in_flight[i],
                demand: 100,
                since_ms: 0,
                pass: 0,
            });
            turns.observe(&mut views);
            let class = next_class(&views).expect("both wait");
            turns.granted(class, weights[class]);
            granted[class] += 1;
            in_flight[class] += 1;
            held.push_back(class);
        }
        f64::from(granted[0]) / f64::from(granted[0] + granted[1])
    }

    #[test]
    fn weights_share_the_grants_in_proportion_at_any_limit() {
        for limit in [1, 2, 4, 12] {
            let share = interactive_share([3, 1], limit);
            assert!((share - 0.75).abs() < 0.01, "limit {limit}: interactive got {share:.3} of the grants");
            let share = interactive_share([10, 1], limit);
            assert!((share - 10.0 / 11.0).abs() < 0.01, "limit {limit}, 10 : 1: interactive got {share:.3}");
        }
    }

    #[test]
    fn every_case_of_the_turns_table() {
        for case in turns_cases() {
            assert_eq!(case.run(), case.expect, "{}", case.name);
        }
    }

    #[test]
    fn an_idle_class_banks_no_credit() {
        let mut turns = ClassTurns::new(2);
        let view = |demand| ClassView { weight: 1, reserved: 0, in_flight: 0, demand, since_ms: 0, pass: 0 };
        // Batch alone for 100 grants.
        for _ in 0..100 {
            let mut views = [view(0), view(5)];
            turns.observe(&mut views);
            turns.granted(1, 1);
        }
        // Then both wait, weights equal: they alternate instead of class 0 taking 100 in a row.
        let mut got = Vec::new();
        for _ in 0..6 {
            let mut views = [view(5), view(5)];
            turns.observe(&mut views);
            let class = next_class(&views).expect("both wait");
            turns.granted(class, 1);
            got.push(class);
        }
        assert!(got.iter().filter(|&&c| c == 0).count() <= 4, "{got:?}");
        assert!(got.contains(&1), "{got:?}");
    }

    #[test]
    fn validation_names_what_to_change() {
        assert!(PriorityClass::new("bad name").is_err());
        assert!(PriorityClass::new("x".repeat(33)).is_err());
        assert!(PriorityClass::new("batch").unwrap().weight(0).is_err());
        assert!(PriorityClass::new("batch").unwrap().reserve_percent(101).is_err());
        let a = PriorityClass::new("a").unwrap().reserve_percent(60).unwrap();
        let b = PriorityClass::new("b").unwrap().reserve_percent(50).unwrap();
        let error = validate("llm", &[a.clone(), b]).unwrap_err().to_string();
        assert!(error.contains("110 %") && error.contains("at most 100 %"), "{error}");
        assert!(validate("llm", &[a.clone(), a]).unwrap_err().to_string().contains("twice"));
        assert_eq!(reserved_at(10, 20), 2);
        assert_eq!(reserved_at(4, 20), 0);
    }
}
