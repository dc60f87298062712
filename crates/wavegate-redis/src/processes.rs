//! The fleet's live processes as their heartbeats keep them (`lua/heartbeat.lua`): each one's
//! instance, how long its last heartbeat still counts, and the mode it said it was in.

use std::collections::HashMap;
use std::time::Duration;

use crate::{Store, StoreError};

/// The band of the gauge reader's turns and the modes (`READER_BASE` of `lua/heartbeat.lua`):
/// a mode's score is it plus when it stops counting.
const READER_BASE: u64 = 1 << 50;
/// The longest mode text kept from the store (an operator's line, not a payload).
const MODE_MAX: usize = 200;

/// One live process of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveProcess {
    /// Its instance id.
    pub instance: String,
    /// How long its last heartbeat still counts.
    pub counts_for: Duration,
    /// The mode it said it was in (`shared`, `fallback 2/100`, ...), if it said one.
    pub mode: Option<String>,
}

/// The live processes at `now_ms` (the store's clock), sorted by instance.
///
/// # Errors
///
/// [`StoreError`] when the store does not answer or answers something else.
pub async fn live_processes(store: &Store, now_ms: u64) -> Result<Vec<LiveProcess>, StoreError> {
    let mut cmd = redis::cmd("ZRANGEBYSCORE");
    cmd.arg(store.config().keyspace.instances()).arg(now_ms).arg("+inf").arg("WITHSCORES");
    let members: Vec<(String, f64)> = store.query("ZRANGEBYSCORE", cmd).await?;
    Ok(read(members, now_ms))
}

/// The processes among `members` (member, score) at `now_ms`: the plain ones are instances
/// (instance ids hold no ':'); `mode:<instance>|<mode>` says a mode; `reader:<instance>` names
/// the gauge reader and is skipped. A mode whose process no longer counts is dropped.
fn read(members: Vec<(String, f64)>, now_ms: u64) -> Vec<LiveProcess> {
    let mut modes: HashMap<String, String> = HashMap::new();
    let mut processes = Vec::new();
    for (member, score) in members {
        let score = if score.is_finite() && score > 0.0 { score as u64 } else { 0 };
        if let Some(rest) = member.strip_prefix("mode:") {
            let Some((instance, mode)) = rest.split_once('|') else { continue };
            if score.saturating_sub(READER_BASE) > now_ms {
                // Read, not trusted: no control character reaches an operator's terminal.
                modes.insert(instance.to_owned(), mode.chars().filter(|c| !c.is_control()).take(MODE_MAX).collect());
            }
        } else if !member.contains(':') && score < READER_BASE {
            let counts_for = Duration::from_millis(score.saturating_sub(now_ms));
            processes.push(LiveProcess { instance: member, counts_for, mode: None });
        }
    }
    for process in &mut processes {
        process.mode = modes.remove(&process.instance);
    }
    processes.sort_by(|a, b| a.instance.cmp(&b.instance));
    processes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_into_processes_with_their_modes() {
        let base = READER_BASE as f64;
        let members = vec![
            ("b".to_owned(), 5_000.0),
            ("a".to_owned(), 4_000.0),
            ("reader:a".to_owned(), (1u64 << 50) as f64 + 9_000.0),
            ("mode:a|fallback\u{1b}[2J 1/3\n".to_owned(), base + 4_000.0),
            ("mode:gone|shared".to_owned(), base + 4_000.0),
            ("mode:b|shared".to_owned(), base + 500.0),
            ("mode:broken".to_owned(), base + 9_000.0),
        ];
        let processes = read(members, 1_000);
        let seen: Vec<(&str, u64, Option<&str>)> = processes
            .iter()
            .map(|p| (p.instance.as_str(), p.counts_for.as_millis() as u64, p.mode.as_deref()))
            .collect();
        assert_eq!(seen, [("a", 3_000, Some("fallback[2J 1/3")), ("b", 4_000, None)], "b's mode ran out");
    }
}
