//! The rescale's table: a budget's TAT carried across a change of its rate
//! ([`rescale_tat`](crate::rescale_tat), `wave.lua`'s `rescale_tat`), one rule a case.

/// One case: a TAT at `now` (µs), the rate before and after (units a minute), the TAT after.
#[derive(Debug, Clone, Copy)]
pub struct RescaleCase {
    /// The rule the case pins down.
    pub name: &'static str,
    /// The TAT before.
    pub tat_us: u64,
    /// Now.
    pub now_us: u64,
    /// The rate before, and after.
    pub rates: (u32, u32),
    /// The TAT after.
    pub expect_us: u64,
}

/// The cases both twins pass.
pub fn rescale_cases() -> Vec<RescaleCase> {
    let case = |name, tat_us, now_us, rates, expect_us| RescaleCase { name, tat_us, now_us, rates, expect_us };
    let now = 1_000_000_000;
    vec![
        case("a raise: the units held take less time", now + 30_000_000, now, (60, 120), now + 15_000_000),
        case("a cut: the units held take more time", now + 30_000_000, now, (60, 30), now + 60_000_000),
        case("a full budget stays full", now - 5_000_000, now, (60, 600), now - 5_000_000),
        case("a TAT at now stays", now, now, (60, 600), now),
        case("the same rate changes nothing", now + 7_000_001, now, (60, 60), now + 7_000_001),
        case("a budget that was not there keeps its TAT", now + 9_000_000, now, (0, 60), now + 9_000_000),
        case("a budget that goes keeps its TAT", now + 9_000_000, now, (60, 0), now + 9_000_000),
        case("rounded down to the µs", now + 1_000_000, now, (7, 3), now + 2_333_333),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescale_tat_passes_its_table() {
        for case in rescale_cases() {
            let got = crate::rescale_tat(case.tat_us, case.now_us, case.rates.0, case.rates.1);
            assert_eq!(got, case.expect_us, "{}", case.name);
        }
    }
}
