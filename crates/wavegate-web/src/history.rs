//! The live status page (`/wavegate`) and the history it draws (`/wavegate/history`): each
//! upstream's last minutes as this process saw them (wavegate's `Scheduler::history`, one
//! sample a second, kept in process by the scheduler; reading it sends nothing to Redis).

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use wavegate::Scheduler;
use wavegate::history::{HISTORY_EVERY, HISTORY_SAMPLES, UpstreamHistory};

use crate::error::WebError;

/// The status page: one self-contained HTML document (inline CSS, inline SVG charts drawn by a
/// small inline script, nothing fetched from elsewhere) that reads the history endpoint under
/// its own path every second and redraws one card per upstream.
pub const PAGE_HTML: &str = include_str!("page.html");

/// The history body (`/wavegate/history`).
#[derive(Debug, Serialize)]
pub struct HistoryBody {
    /// When it was read, in milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// How far back the samples go at most, in milliseconds.
    pub window_ms: u64,
    /// The fleet's live processes as this process's last heartbeat counted (null in local
    /// mode, and before the first heartbeat).
    pub processes: Option<u32>,
    /// Every configured upstream, in configuration order.
    pub upstreams: Vec<UpstreamHistoryView>,
}

/// One upstream's history.
#[derive(Debug, Serialize)]
pub struct UpstreamHistoryView {
    /// The upstream's name.
    pub upstream: String,
    /// The configured limit (the limit in NORMAL).
    pub base_limit: u32,
    /// The mode at the last sample: `local`, `shared`, `fallback` or `rejected`.
    pub mode: &'static str,
    /// The wave state at the last sample: `NORMAL`, `COOLDOWN`, `PROBE` or `DEGRADED`.
    pub state: &'static str,
    /// The samples, one a second, oldest first, as columns.
    pub samples: SeriesView,
    /// The changes of mode and state, oldest first (the first: where the upstream started, or
    /// the oldest kept).
    pub changes: Vec<ChangeView>,
}

/// The samples of one upstream as columns: entry `i` of each is sample `i`.
#[derive(Debug, Default, Serialize)]
pub struct SeriesView {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: Vec<u64>,
    /// The limit.
    pub limit: Vec<u32>,
    /// Permits this process held.
    pub in_flight_local: Vec<u32>,
    /// Permits the fleet held, as last seen (null before the shared store said).
    pub in_flight_fleet: Vec<Option<u32>>,
    /// Callers of this process waiting.
    pub waiting: Vec<u32>,
    /// Permits granted in the second before.
    pub granted: Vec<u32>,
    /// Their mean wait, in milliseconds.
    pub wait_mean_ms: Vec<u32>,
    /// Their longest wait, in milliseconds.
    pub wait_max_ms: Vec<u32>,
    /// 429s reported in the second before.
    pub rate_limited: Vec<u32>,
}

/// A change of mode or wave state.
#[derive(Debug, Serialize)]
pub struct ChangeView {
    /// When it was seen, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The mode from then on.
    pub mode: &'static str,
    /// The state from then on.
    pub state: &'static str,
}

impl UpstreamHistoryView {
    fn new(history: UpstreamHistory, base_limit: u32) -> Self {
        let last = history.samples.last();
        let mode = last.map_or("local", |s| s.mode.as_str());
        let state = last.map_or("NORMAL", |s| s.state.as_str());
        let mut samples = SeriesView::default();
        for s in &history.samples {
            samples.at_ms.push(s.at_ms);
            samples.limit.push(s.limit);
            samples.in_flight_local.push(s.in_flight_local);
            samples.in_flight_fleet.push(s.in_flight_fleet);
            samples.waiting.push(s.waiting);
            samples.granted.push(s.granted);
            samples.wait_mean_ms.push(s.wait_mean_ms);
            samples.wait_max_ms.push(s.wait_max_ms);
            samples.rate_limited.push(s.rate_limited);
        }
        let changes = history
            .changes
            .iter()
            .map(|c| ChangeView { at_ms: c.at_ms, mode: c.mode.as_str(), state: c.state.as_str() })
            .collect();
        Self { upstream: history.upstream, base_limit, mode, state, samples, changes }
    }
}

/// Reads the scheduler's history (and its count of live processes).
pub async fn history(scheduler: &Scheduler) -> Result<HistoryBody, WebError> {
    let processes = scheduler.live_processes().await?;
    let upstreams = scheduler
        .history()
        .into_iter()
        .zip(scheduler.upstreams())
        .map(|(history, config)| UpstreamHistoryView::new(history, config.limit().get()))
        .collect();
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64);
    Ok(HistoryBody {
        now_ms,
        window_ms: HISTORY_SAMPLES as u64 * HISTORY_EVERY.as_millis() as u64,
        processes,
        upstreams,
    })
}
