//! The fleet at a glance, for `top`: one line per upstream, the processes' modes summed up.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::fleet::{FleetView, UpstreamView, WindowView};

/// How many processes are listed one by one; beyond, only their modes are counted.
const PROCESSES_LISTED: usize = 8;

/// The fleet as one screen: a header with the live processes and their modes, then a line per
/// upstream (state, limit, calls in flight and waiting, budgets, the provider window that
/// runs, the live settings).
pub(crate) fn table(fleet: &FleetView) -> String {
    let mut out = String::new();
    let mut modes: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &fleet.processes {
        *modes.entry(p.mode.as_deref().unwrap_or("not told")).or_default() += 1;
    }
    let modes: Vec<String> = modes.iter().map(|(mode, n)| format!("{n} {mode}")).collect();
    let _ = writeln!(
        out,
        "wavegate fleet `{}`: {} live process(es){}",
        fleet.prefix,
        fleet.processes.len(),
        if modes.is_empty() { String::new() } else { format!(" ({})", modes.join(", ")) }
    );
    for p in fleet.processes.iter().take(PROCESSES_LISTED) {
        let _ = writeln!(out, "  {:<44} {}", p.instance, p.mode.as_deref().unwrap_or("-"));
    }
    if fleet.processes.len() > PROCESSES_LISTED {
        let _ = writeln!(out, "  ... and {} more", fleet.processes.len() - PROCESSES_LISTED);
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<20} {:<9} {:>7} {:>9} {:>7} {:>5} {:<22} {:<18} LIVE",
        "UPSTREAM", "STATE", "LIMIT", "IN FLIGHT", "WAITING", "WAVE", "BUDGETS LEFT", "WINDOW"
    );
    for u in &fleet.upstreams {
        let _ = writeln!(out, "{}", line(u));
    }
    for name in &fleet.unknown {
        let _ = writeln!(out, "{name:<20} (no live process configures it)");
    }
    for (name, fields) in &fleet.unreadable {
        let _ = writeln!(out, "{name:<20} ({})", crate::render::unreadable_text(*fields));
    }
    out
}

/// One upstream's line.
fn line(u: &UpstreamView) -> String {
    let state = if u.cooldown_remaining.is_zero() {
        u.state.as_str().to_owned()
    } else {
        format!("{} {}", u.state.as_str(), secs(u.cooldown_remaining))
    };
    let limit =
        if u.limit == u.configured_limit { u.limit.to_string() } else { format!("{}/{}", u.limit, u.configured_limit) };
    // Callers waiting are counted fleet-wide per priority class only.
    let waiting = if u.classes.is_empty() {
        "-".to_owned()
    } else {
        u.classes.iter().map(|c| c.waiting).sum::<u32>().to_string()
    };
    let budgets: Vec<String> = [
        ("req", u.budgets.requests),
        ("tok", u.budgets.tokens),
        ("in", u.budgets.input),
        ("out", u.budgets.output),
        ("req/d", u.budgets.requests_per_day),
        ("tok/d", u.budgets.tokens_per_day),
    ]
    .into_iter()
    .filter_map(|(name, budget)| budget.map(|(available, _)| format!("{name} {}", short(available))))
    .collect();
    let window = [("req", u.windows[0]), ("tok", u.windows[1])]
        .into_iter()
        .filter_map(|(name, window)| window.map(|w| (name, w)))
        .min_by_key(|(_, w)| w.ends_in)
        .map_or("-".to_owned(), |(name, WindowView { left, ends_in })| {
            format!("{name} {} for {}", short(left), secs(ends_in))
        });
    let live = if u.live.is_empty() { "-".to_owned() } else { format!("v{}", u.live.version) };
    format!(
        "{:<20} {:<9} {:>7} {:>9} {:>7} {:>5} {:<22} {:<18} {live}",
        u.name,
        state,
        limit,
        u.in_flight,
        waiting,
        u.wave,
        if budgets.is_empty() { "-".to_owned() } else { budgets.join(" ") },
        window
    )
}

/// A count in at most five characters (`12.3k`, `4.5M`).
fn short(n: u64) -> String {
    match n {
        0..10_000 => n.to_string(),
        10_000..10_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

fn secs(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_short() {
        assert_eq!((short(9_999), short(12_345), short(45_000_000)), ("9999".into(), "12.3k".into(), "45.0M".into()));
    }
}
