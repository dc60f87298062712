//! The fleet for a person (a table per upstream) and for a script (one JSON document).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use wavegate_core::{ClassSetting, LearnedLimitStatus, LiveChange, LiveSetting, LiveSettings};

use crate::fleet::{FleetView, SetView, UpstreamView, WindowView};

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn window_json(window: Option<WindowView>) -> Value {
    window.map_or(Value::Null, |w| json!({ "left": w.left, "ends_in_ms": ms(w.ends_in) }))
}

fn budget_json(budget: Option<(u64, u64)>) -> Value {
    budget.map_or(Value::Null, |(available, next_ms)| json!({ "available": available, "next_in_ms": next_ms }))
}

fn learned_json(learned: Option<LearnedLimitStatus>) -> Value {
    learned.map_or(
        Value::Null,
        |l| json!({ "limit": l.limit.limit, "window_ms": l.limit.window_ms, "forgotten_in_ms": ms(l.forgotten_in) }),
    )
}

fn upstream_json(u: &UpstreamView) -> Value {
    json!({
        "name": u.name,
        "state": u.state.as_str(),
        "limit": u.limit,
        "configured_limit": u.configured_limit,
        "wave": u.wave,
        "cooldown_remaining_ms": ms(u.cooldown_remaining),
        "in_flight": u.in_flight,
        "classes": u.classes.iter().map(|c| json!({ "name": c.name, "in_flight": c.in_flight, "waiting": c.waiting })).collect::<Vec<_>>(),
        "budgets": {
            "requests": budget_json(u.budgets.requests),
            "tokens": budget_json(u.budgets.tokens),
            "input": budget_json(u.budgets.input),
            "output": budget_json(u.budgets.output),
            "requests_per_day": budget_json(u.budgets.requests_per_day),
            "tokens_per_day": budget_json(u.budgets.tokens_per_day),
        },
        "learned": {
            "requests": learned_json(u.learned.requests),
            "tokens": learned_json(u.learned.tokens),
            "input": learned_json(u.learned.input),
            "output": learned_json(u.learned.output),
        },
        "windows": { "requests": window_json(u.windows[0]), "tokens": window_json(u.windows[1]) },
        "fallback_limit": u.fallback_limit,
        "live": live_json(&u.live),
    })
}

fn live_json(live: &LiveSettings) -> Value {
    let value =
        |setting| live.get(setting).map_or(Value::Null, |l| json!({ "value": l.value, "for_ms": l.remaining.map(ms) }));
    let class_value = |v: Option<wavegate_core::LiveValue>| {
        v.map_or(Value::Null, |l| json!({ "value": l.value, "for_ms": l.remaining.map(ms) }))
    };
    let classes: serde_json::Map<String, Value> = live
        .classes
        .iter()
        .map(|(name, c)| (name.clone(), json!({ "weight": class_value(c.weight), "reserve": class_value(c.reserve), "shadow": class_value(c.shadow) })))
        .collect();
    json!({
        "version": live.version,
        "limit": value(LiveSetting::Limit),
        "requests_per_minute": value(LiveSetting::RequestsPerMinute),
        "tokens_per_minute": value(LiveSetting::TokensPerMinute),
        "requests_burst": value(LiveSetting::RequestsBurst),
        "tokens_burst": value(LiveSetting::TokensBurst),
        "shadow": value(LiveSetting::Shadow),
        "quota_spent_for_ms": live.quota_spent.and_then(|v| v.remaining).map(ms),
        "classes": classes,
        "pools": live.pools.iter().map(|(pool, l)| (pool.clone(), json!({ "weight": l.value, "for_ms": l.remaining.map(ms) }))).collect::<serde_json::Map<String, Value>>(),
    })
}

/// What `set` did, as one JSON document.
pub(crate) fn set_json(upstream: &str, change: &LiveChange, set: &SetView) -> String {
    let (value, for_ms) = match change.value() {
        Some((value, ttl)) => (json!(value), ttl.map(ms)),
        None => (json!("configured"), None),
    };
    json!({
        "upstream": upstream,
        "setting": change.name(),
        "value": value,
        "for_ms": for_ms,
        "version": set.version,
        "live": live_json(&set.live),
    })
    .to_string()
}

/// What `set` did, for a person.
pub(crate) fn set_text(upstream: &str, change: &LiveChange, set: &SetView) -> String {
    let setting = match change {
        LiveChange::SetClass { class, setting, .. } | LiveChange::ClearClass { class, setting } => {
            format!("{} of class {class}", setting.as_str())
        }
        LiveChange::SetPoolMember { pool, .. } | LiveChange::ClearPoolMember { pool } => {
            format!("weight in pool {pool}")
        }
        _ => change.name().replace('_', " "),
    };
    let shadow = matches!(change.setting(), Some(LiveSetting::Shadow))
        || matches!(change, LiveChange::SetClass { setting: ClassSetting::Shadow, .. });
    let what = match change.value() {
        Some((value, ttl)) if shadow => {
            let until = ttl.map_or("until changed".to_owned(), |ttl| {
                format!("for {}, then back to the configured mode", secs(ttl))
            });
            format!("{setting} {} {until}", on_off(value))
        }
        Some((value, Some(ttl))) => format!("{setting} {value} for {}, then back to the configured one", secs(ttl)),
        Some((value, None)) => format!("{setting} {value} until changed"),
        None => format!("{setting} back to the configured one"),
    };
    format!("{upstream}: {what} (version {}); every process applies it within a second\n", set.version)
}

/// The fleet as one JSON document.
pub(crate) fn json(fleet: &FleetView) -> String {
    json!({
        "prefix": fleet.prefix,
        "processes": fleet.processes.iter().map(|p| json!({
            "instance": p.instance,
            "heartbeat_counts_for_ms": ms(p.counts_for),
            "mode": p.mode,
        })).collect::<Vec<_>>(),
        "upstreams": fleet.upstreams.iter().map(upstream_json).collect::<Vec<_>>(),
        "unknown_upstreams": fleet.unknown,
        "unreadable_upstreams": fleet.unreadable.iter().map(|(name, fields)| json!({
            "upstream": name,
            "claimed_settings": fields,
            "read_settings": wavegate_redis::CLAIM_SETTINGS,
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

fn secs(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

/// The fleet as a person reads it.
pub(crate) fn text(fleet: &FleetView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "wavegate fleet `{}`: {} live process(es)", fleet.prefix, fleet.processes.len());
    for p in &fleet.processes {
        let mode = p.mode.as_deref().unwrap_or("(mode not told: an older version)");
        let _ = writeln!(out, "  process {:<44} {mode}", p.instance);
    }
    if fleet.upstreams.is_empty() && fleet.unknown.is_empty() && fleet.unreadable.is_empty() {
        let _ = writeln!(out, "no upstream has claimed a configuration under this prefix (no live process?)");
    }
    for u in &fleet.upstreams {
        let _ = writeln!(out);
        let cooling = if u.cooldown_remaining.is_zero() {
            String::new()
        } else {
            format!(", cooling down {}", secs(u.cooldown_remaining))
        };
        let _ = writeln!(
            out,
            "{}: {} limit {} (configured {}), wave {}, {} in flight{}",
            u.name,
            u.state.as_str(),
            u.limit,
            u.configured_limit,
            u.wave,
            u.in_flight,
            cooling
        );
        for (class, live) in &u.live.classes {
            for (name, value) in [("weight", live.weight), ("reserve", live.reserve), ("shadow", live.shadow)] {
                let Some(value) = value else { continue };
                let until = value.remaining.map_or("until changed".to_owned(), |left| format!("for {}", secs(left)));
                if name == "shadow" {
                    let _ = writeln!(
                        out,
                        "  live shadow of class {class} {} {until} (version {}; wavegate shadow configured {} --class {class})",
                        on_off(value.value),
                        u.live.version,
                        u.name
                    );
                    continue;
                }
                let _ = writeln!(
                    out,
                    "  live {name} of class {class} {} {until} (version {}; wavegate set {} --{name} {class}=configured)",
                    value.value, u.live.version, u.name
                );
            }
        }
        for setting in LiveSetting::ALL {
            let Some(live) = u.live.get(setting) else { continue };
            let until = live.remaining.map_or("until changed".to_owned(), |left| format!("for {}", secs(left)));
            if setting == LiveSetting::Shadow {
                let (mode, version) = (on_off(live.value), u.live.version);
                let _ = writeln!(
                    out,
                    "  live shadow {mode} {until} (version {version}; wavegate shadow configured {})",
                    u.name
                );
                continue;
            }
            let (name, flag) = (setting.as_str().replace('_', " "), setting.as_str().replace('_', "-"));
            let _ = writeln!(
                out,
                "  live {name} {} {until} (version {}; wavegate set {} --{flag} configured)",
                live.value, u.live.version, u.name
            );
        }
        for (pool, live) in &u.live.pools {
            let until = live.remaining.map_or("until changed".to_owned(), |left| format!("for {}", secs(left)));
            let weight = if live.value == 0 { "out".to_owned() } else { live.value.to_string() };
            let _ = writeln!(
                out,
                "  live weight in pool {pool} {weight} {until} (version {}; wavegate set {} --pool {pool}=configured)",
                u.live.version, u.name
            );
        }
        if let Some(left) = u.live.quota_spent.and_then(|v| v.remaining) {
            let _ = writeln!(
                out,
                "  quota spent: every process refuses it for {} (wavegate reset-quota {})",
                secs(left),
                u.name
            );
        }
        for c in &u.classes {
            let _ = writeln!(out, "  class {:<16} {:>5} in flight {:>6} waiting", c.name, c.in_flight, c.waiting);
        }
        let budgets = [
            ("requests", u.budgets.requests),
            ("tokens", u.budgets.tokens),
            ("input", u.budgets.input),
            ("output", u.budgets.output),
            ("requests/day", u.budgets.requests_per_day),
            ("tokens/day", u.budgets.tokens_per_day),
        ];
        for (name, budget) in budgets {
            if let Some((available, next_ms)) = budget {
                let _ = writeln!(out, "  budget {name:<9} {available} available, one more in {next_ms} ms");
            }
        }
        for (name, learned) in u.learned.named() {
            if let Some(l) = learned {
                let _ = writeln!(
                    out,
                    "  learned {name:<8} {} per {} ms (forgotten in {})",
                    l.limit.limit,
                    l.limit.window_ms,
                    secs(l.forgotten_in)
                );
            }
        }
        for (name, window) in [("requests", u.windows[0]), ("tokens", u.windows[1])] {
            if let Some(w) = window {
                let _ = writeln!(
                    out,
                    "  window {name:<9} {} left for {} (wavegate clear-window {})",
                    w.left,
                    secs(w.ends_in),
                    u.name
                );
            }
        }
    }
    for name in &fleet.unknown {
        let _ = writeln!(out, "\n{name}: no configuration claimed in the store (no live process configures it)");
    }
    for (name, fields) in &fleet.unreadable {
        let _ = writeln!(out, "\n{name}: {}", unreadable_text(*fields));
    }
    out
}

/// Why a claim of `fields` settings is not shown.
pub(crate) fn unreadable_text(fields: usize) -> String {
    format!(
        "claimed by a process of another wavegate version ({fields} settings; this tool reads {}): \
         run the tool of the processes' version",
        wavegate_redis::CLAIM_SETTINGS
    )
}

/// A shadow mode's stored value as an operator says it.
fn on_off(value: u64) -> &'static str {
    if value == 1 { "on" } else { "off" }
}
