//! Priority classes: which waiting class a free permit goes to.
//!
//! An upstream may split its callers into classes (e.g. `interactive` and `batch`), each with
//! a **weight** and an optional **reserved share** of the limit. When callers of several
//! classes wait, each free permit goes to the class that is furthest below its share:
//!
//! 1. classes below their reserve (in flight < `reserve_percent` of the current limit, rounded
//!    down) come first, the one that has used the smallest part of its reserve first;
//! 2. then the class with the smallest `(in flight + 1) / weight` — the usage it would have
//!    after this grant, per unit of weight (a weighted fair share: with weights 3 and 1 and
//!    both waiting, the limit is shared 3 : 1);
//! 3. ties go to the class that has waited longest, then to the class listed first.
//!
//! Only classes with callers waiting take part, so an idle class's share is borrowed by the
//! others and a reserve is kept only while its class waits. Within a class callers are served
//! first in, first out.
//!
//! The choice is one pure function, [`choose_class`], with a twin in `lua/priority.lua` that
//! the shared-mode scripts run inside Redis (so the choice is atomic across the fleet); both
//! pass the same table, [`cases`].
//!
//! ```
//! use wavegate_core::priority::{ClassView, choose_class};
//!
//! // Limit 10, all in flight for batch (weight 1); interactive (weight 3) starts waiting.
//! let mut classes = [
//!     ClassView { weight: 3, reserved: 0, in_flight: 0, demand: 1, since_ms: 500 },
//!     ClassView { weight: 1, reserved: 0, in_flight: 10, demand: 200, since_ms: 0 },
//! ];
//! // The next free permit goes to interactive, whoever asks.
//! assert_eq!(choose_class(&mut classes, 1, |_| true), Some(0));
//! // A batch caller asking for it is told to wait.
//! let mut classes = [
//!     ClassView { weight: 3, reserved: 0, in_flight: 0, demand: 1, since_ms: 500 },
//!     ClassView { weight: 1, reserved: 0, in_flight: 10, demand: 200, since_ms: 0 },
//! ];
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
        Ok(Self { name, weight: NonZeroU32::MIN, reserve_percent: 0 })
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

    /// The permits reserved for it at `limit`.
    pub fn reserved_at(&self, limit: u32) -> u32 {
        reserved_at(limit, self.reserve_percent)
    }
}

impl fmt::Display for PriorityClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (weight {}, reserve {} %)", self.name, self.weight, self.reserve_percent)
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
        // The smaller usage per unit of weight after a grant, (in flight + 1) / weight.
        (false, false) => (u64::from(a.in_flight) + 1)
            .saturating_mul(u64::from(b.weight.max(1)))
            .cmp(&(u64::from(b.in_flight) + 1).saturating_mul(u64::from(a.weight.max(1)))),
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
        classes[class].in_flight += 1;
        classes[class].demand -= 1;
    }
    None
}

/// One case of the class choice: the classes, the room, the asker's classes, the answer.
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

/// The table both twins pass ([`choose_class`] and `lua/priority.lua`).
pub fn cases() -> Vec<ChoiceCase> {
    let class =
        |weight, reserved, in_flight, demand, since_ms| ClassView { weight, reserved, in_flight, demand, since_ms };
    vec![
        ChoiceCase {
            name: "one class: whoever asks gets the room",
            classes: vec![class(1, 0, 3, 1, 0)],
            room: 1,
            asked: vec![0],
            expect: Some(0),
        },
        ChoiceCase {
            name: "no room: nobody",
            classes: vec![class(1, 0, 10, 5, 0)],
            room: 0,
            asked: vec![0],
            expect: None,
        },
        ChoiceCase {
            name: "a batch flood holds every permit: interactive (weight 3) gets the next one, batch waits",
            classes: vec![class(3, 0, 0, 1, 900), class(1, 0, 10, 200, 0)],
            room: 1,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "... and interactive asking gets it",
            classes: vec![class(3, 0, 0, 1, 900), class(1, 0, 10, 200, 0)],
            room: 1,
            asked: vec![0],
            expect: Some(0),
        },
        ChoiceCase {
            name: "weights 3 : 1 both waiting: interactive until it holds three times batch's share",
            // (5 + 1) / 3 = 2 < (2 + 1) / 1 = 3: interactive.
            classes: vec![class(3, 0, 5, 9, 100), class(1, 0, 2, 9, 0)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "weights 3 : 1: batch once interactive is at its share",
            // (6 + 1) / 3 = 2.33 > (1 + 1) / 1 = 2: batch.
            classes: vec![class(3, 0, 6, 9, 0), class(1, 0, 1, 9, 100)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "an idle class's share is borrowed: batch alone takes all the room",
            classes: vec![class(3, 0, 0, 0, 0), class(1, 0, 9, 50, 0)],
            room: 1,
            asked: vec![1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "equal usage per weight: the class that waited longest",
            classes: vec![class(1, 0, 2, 1, 700), class(1, 0, 2, 1, 300)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "a full tie: the class listed first",
            classes: vec![class(2, 0, 1, 1, 5), class(2, 0, 1, 1, 5)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "room for two: the first goes to interactive's one waiter, the second to batch",
            classes: vec![class(3, 0, 0, 1, 0), class(1, 0, 8, 100, 0)],
            room: 2,
            asked: vec![1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "room for two, interactive waits for two: batch waits",
            classes: vec![class(3, 0, 0, 2, 0), class(1, 0, 8, 100, 0)],
            room: 2,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "below its reserve a class comes first, even with the smaller weight",
            classes: vec![class(9, 0, 0, 5, 0), class(1, 2, 1, 5, 100)],
            room: 1,
            asked: vec![0],
            expect: None,
        },
        ChoiceCase {
            name: "a reserve is not kept for a class that does not wait",
            classes: vec![class(1, 0, 8, 5, 0), class(1, 2, 0, 0, 0)],
            room: 2,
            asked: vec![0],
            expect: Some(0),
        },
        ChoiceCase {
            name: "two classes below their reserves, the same used part of it: the longest wait",
            // (1 + 1) / 4 = (0 + 1) / 2: class 1 has waited longer.
            classes: vec![class(1, 4, 1, 3, 50), class(1, 2, 0, 3, 10)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(1),
        },
        ChoiceCase {
            name: "two classes below their reserves: the smaller used part of it",
            // (2 + 1) / 4 < (1 + 1) / 2, although class 1 has waited longer.
            classes: vec![class(1, 4, 2, 3, 50), class(1, 2, 1, 3, 10)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "at its reserve a class competes by weight again",
            // class 1: at its reserve of 2, (2 + 1) / 1 = 3; class 0: (3 + 1) / 2 = 2.
            classes: vec![class(2, 0, 3, 5, 100), class(1, 2, 2, 5, 0)],
            room: 1,
            asked: vec![0, 1],
            expect: Some(0),
        },
        ChoiceCase {
            name: "three classes, room for three: each permit to the furthest below its share",
            // (in flight + 1) / weight before each permit: c0 1/4, c0 2/4 (ties c2's 1/2, listed
            // first), c2 1/2, c0 3/4, then c1 3/1: c1 asks and gets none of the first three.
            classes: vec![class(4, 0, 0, 3, 0), class(1, 0, 2, 5, 0), class(2, 0, 0, 1, 0)],
            room: 3,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "... nor the fourth (c0 at 3 / 4 before c1 at 3 / 1)",
            classes: vec![class(4, 0, 0, 3, 0), class(1, 0, 2, 5, 0), class(2, 0, 0, 1, 0)],
            room: 4,
            asked: vec![1],
            expect: None,
        },
        ChoiceCase {
            name: "... and with room for five c1 gets the fifth (c0's demand of 3 is met)",
            classes: vec![class(4, 0, 0, 3, 0), class(1, 0, 2, 5, 0), class(2, 0, 0, 1, 0)],
            room: 5,
            asked: vec![1],
            expect: Some(1),
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

    #[test]
    fn weights_share_a_saturated_limit_in_proportion() {
        // Limit 12, both classes always waiting, every call as long: when the limit is full
        // the oldest permit ends, and the freed permit is chosen again.
        let mut held = std::collections::VecDeque::new();
        let mut in_flight = [0u32; 2];
        let mut granted = [0u32; 2];
        for _ in 0..1_200 {
            if held.len() == 12 {
                let done: usize = held.pop_front().expect("full");
                in_flight[done] -= 1;
            }
            let views = [0, 1].map(|i| ClassView {
                weight: [3, 1][i],
                reserved: 0,
                in_flight: in_flight[i],
                demand: 100,
                since_ms: 0,
            });
            let class = next_class(&views).expect("both wait");
            granted[class] += 1;
            in_flight[class] += 1;
            held.push_back(class);
        }
        let share = f64::from(granted[0]) / f64::from(granted[0] + granted[1]);
        assert!((share - 0.75).abs() < 0.01, "interactive got {share:.3} of the grants");
        assert_eq!(in_flight, [9, 3], "the limit ends up shared 3 : 1");
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
