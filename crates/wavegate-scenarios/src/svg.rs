//! One picture per scenario, written by hand as SVG: a panel per strategy with the
//! provider's in-flight count over time (from its own records), wavegate's limit over time
//! (from the status poller), the hidden capacity, the scenario's event and every 429.

use std::fmt::Write as _;

use crate::report::{Mark, Row, RunResult};
use crate::scenario::{Scenario, Sizes};
use crate::stats::in_flight_bins;

const WIDTH: f64 = 960.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 24.0;
const HEADER: f64 = 64.0;
const PANEL: f64 = 178.0;
const PLOT_TOP: f64 = 26.0;
const PLOT_HEIGHT: f64 = 112.0;
const BINS: usize = 440;

const SERVED: &str = "#1f5fa8";
const OPEN: &str = "#f4b183";
const LIMIT: &str = "#2e8b3a";
const RATE_LIMITED: &str = "#d62728";

/// The picture of one scenario.
pub(crate) fn draw(scenario: &Scenario, sizes: &Sizes, results: &[RunResult]) -> String {
    let plot_width = WIDTH - LEFT - RIGHT;
    let height = HEADER + PANEL * results.len() as f64 + 34.0;
    let span = results.iter().map(RunResult::completion_s).fold(1.0, f64::max);
    let (span, step) = axis(span);
    let y_max = f64::from(scenario.limit.max(scenario.peak_capacity() as u32)) * 2.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}: {}</text>"#,
        scenario.name,
        escape(scenario.title)
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="38">{} jobs of {}–{} ms, {} processes × {} callers. In flight at the provider per {:.0} ms, 429s as red ticks under each panel.</text>"#,
        sizes.jobs,
        sizes.service_ms.0,
        sizes.service_ms.1,
        sizes.processes,
        sizes.callers,
        span * 1000.0 / BINS as f64
    );
    legend(&mut svg, 54.0);
    for (i, result) in results.iter().enumerate() {
        let top = HEADER + PANEL * i as f64;
        panel(&mut svg, scenario, sizes, result, top, span, step, y_max, plot_width);
    }
    let _ = writeln!(svg, "</svg>");
    svg
}

/// The x axis' end and tick step for a run of `span` seconds.
fn axis(span: f64) -> (f64, f64) {
    let step = [1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0]
        .into_iter()
        .find(|s| span / s <= 12.0)
        .unwrap_or(600.0);
    ((span / step).ceil() * step, step)
}

fn legend(svg: &mut String, y: f64) {
    let items = [
        (OPEN, "open requests (429s included)", "area"),
        (SERVED, "being served (200)", "line"),
        (LIMIT, "wavegate limit (status poll, one worker)", "line"),
        ("#888", "hidden capacity", "dash"),
        (RATE_LIMITED, "429", "tick"),
    ];
    let mut x = LEFT;
    for (colour, label, kind) in items {
        match kind {
            "area" => {
                let _ = write!(svg, r#"<rect x="{x}" y="{}" width="14" height="8" fill="{colour}"/>"#, y - 8.0);
            }
            "dash" => {
                let _ = write!(
                    svg,
                    r#"<line x1="{x}" y1="{}" x2="{}" y2="{}" stroke="{colour}" stroke-dasharray="4 3"/>"#,
                    y - 4.0,
                    x + 14.0,
                    y - 4.0
                );
            }
            "tick" => {
                let _ = write!(
                    svg,
                    r#"<line x1="{}" y1="{}" x2="{}" y2="{y}" stroke="{colour}"/>"#,
                    x + 7.0,
                    y - 9.0,
                    x + 7.0
                );
            }
            _ => {
                let _ = write!(
                    svg,
                    r#"<line x1="{x}" y1="{}" x2="{}" y2="{}" stroke="{colour}" stroke-width="2"/>"#,
                    y - 4.0,
                    x + 14.0,
                    y - 4.0
                );
            }
        }
        let _ = writeln!(svg, r#"<text x="{}" y="{y}">{label}</text>"#, x + 18.0);
        x += 26.0 + label.len() as f64 * 5.6;
    }
}

#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    scenario: &Scenario,
    sizes: &Sizes,
    result: &RunResult,
    top: f64,
    span: f64,
    step: f64,
    y_max: f64,
    plot_width: f64,
) {
    let row = Row::new(scenario, sizes, result);
    let plot_top = top + PLOT_TOP;
    let bottom = plot_top + PLOT_HEIGHT;
    let x_of = |seconds: f64| LEFT + (seconds / span).clamp(0.0, 1.0) * plot_width;
    let x_at = |t: u64| x_of(t.saturating_sub(result.t0) as f64 / 1e6);
    let y_of = |v: f64| bottom - (v.min(y_max) / y_max) * PLOT_HEIGHT;
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{}</text><text x="{}" y="{}">success {:.1} %, {} attempts, {:.1} % 429, done in {:.1} s ({:.2} × ideal), max in flight {}</text>"#,
        top + 16.0,
        result.strategy,
        LEFT + 130.0,
        top + 16.0,
        row.success_pct(),
        row.attempts,
        row.share_429_pct(),
        row.completion_s,
        row.completion_s / row.ideal_s,
        row.max_in_flight
    );
    // The event behind everything.
    if let (Some(killed), Some(restarted)) = (result.mark(Mark::RedisKilled), result.mark(Mark::RedisRestarted)) {
        let (a, b) = (x_at(killed), x_at(restarted));
        let _ = writeln!(
            svg,
            "<rect x=\"{a:.1}\" y=\"{plot_top}\" width=\"{:.1}\" height=\"{PLOT_HEIGHT}\" fill=\"#fff2b3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#8a6d00\">Redis down</text>",
            (b - a).max(1.0),
            a + 3.0,
            plot_top + 11.0
        );
    }
    if let Some(killed) = result.mark(Mark::WorkerKilled) {
        let x = x_at(killed);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{plot_top}\" x2=\"{x:.1}\" y2=\"{bottom}\" stroke=\"#555\" stroke-dasharray=\"2 2\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#555\">kill -9 worker</text>",
            x + 3.0,
            plot_top + 11.0
        );
    }
    // Axes and grid.
    let _ = writeln!(
        svg,
        "<rect x=\"{LEFT}\" y=\"{plot_top}\" width=\"{plot_width}\" height=\"{PLOT_HEIGHT}\" fill=\"none\" stroke=\"#bbb\"/>"
    );
    let mut t = 0.0;
    while t <= span + 1e-9 {
        let x = x_of(t);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{bottom}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#bbb\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{t:.0} s</text>",
            bottom + 3.0,
            bottom + 26.0
        );
        t += step;
    }
    let mut labels = vec![(0.0, "0".to_string()), (y_max, format!("{y_max:.0}"))];
    for (_, cap) in scenario.capacity_phases(sizes.jobs) {
        labels.push((cap as f64, format!("{cap}")));
    }
    if !scenario.capacity_phases(sizes.jobs).iter().any(|(_, cap)| *cap == scenario.limit as usize) {
        labels.push((f64::from(scenario.limit), format!("{}", scenario.limit)));
    }
    for (v, label) in labels {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{label}</text>",
            LEFT - 4.0,
            y_of(v) + 4.0
        );
    }
    // The provider's in-flight count.
    let to = result.t0 + (span * 1e6) as u64;
    let open = in_flight_bins(&result.requests, result.t0, to, BINS, |_| true);
    let served = in_flight_bins(&result.requests, result.t0, to, BINS, |r| r.status == 200);
    let bin_width = plot_width / BINS as f64;
    let mut area = format!("M{LEFT:.1},{bottom:.1}");
    for (i, v) in open.iter().enumerate() {
        let (x0, y) = (LEFT + i as f64 * bin_width, y_of(*v as f64));
        let _ = write!(area, " L{x0:.1},{y:.1} L{:.1},{y:.1}", x0 + bin_width);
    }
    let _ = write!(area, " L{:.1},{bottom:.1} Z", LEFT + plot_width);
    let _ = writeln!(svg, r#"<path d="{area}" fill="{OPEN}" stroke="none"/>"#);
    let _ = writeln!(
        svg,
        r#"<path d="{}" fill="none" stroke="{SERVED}" stroke-width="1.5"/>"#,
        steps(&served, bin_width, &y_of)
    );
    // The hidden capacity, phase by phase: a phase starts once the provider has admitted the
    // last call of the one before (its own records).
    let phases = scenario.capacity_phases(sizes.jobs);
    if !phases.is_empty() {
        let mut admitted: Vec<u64> = result.requests.iter().filter(|r| r.status == 200).map(|r| r.start).collect();
        admitted.sort_unstable();
        let mut path = String::new();
        for (i, (from, cap)) in phases.iter().enumerate() {
            let last_before = (*from as usize).saturating_sub(1);
            let x = if i == 0 { LEFT } else { admitted.get(last_before).map_or(LEFT + plot_width, |t| x_at(*t)) };
            let y = y_of(*cap as f64);
            if i == 0 {
                let _ = write!(path, "M{x:.1},{y:.1}");
            } else {
                let _ = write!(path, " H{x:.1} V{y:.1}");
            }
        }
        let _ = write!(path, " H{:.1}", LEFT + plot_width);
        let _ = writeln!(svg, "<path d=\"{path}\" fill=\"none\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>");
    }
    // wavegate's limit, as the poller saw it.
    if !result.status.is_empty() {
        let mut path = String::new();
        for (i, sample) in result.status.iter().enumerate() {
            let (x, y) = (x_at(sample.t), y_of(f64::from(sample.limit)));
            if i == 0 {
                let _ = write!(path, "M{x:.1},{y:.1}");
            } else {
                let _ = write!(path, " H{x:.1} V{y:.1}");
            }
        }
        let _ = writeln!(svg, r#"<path d="{path}" fill="none" stroke="{LIMIT}" stroke-width="1.5"/>"#);
    }
    let peak = open.iter().copied().max().unwrap_or(0);
    if peak as f64 > y_max {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#a0522d\">open requests peak at {peak} (clipped)</text>",
            LEFT + plot_width - 4.0,
            plot_top + 11.0
        );
    }
    // Every 429, as a tick under the plot (one per pixel column at most).
    let mut columns = std::collections::BTreeSet::new();
    for r in result.requests.iter().filter(|r| r.status == 429) {
        columns.insert(x_at(r.start).round() as i64);
    }
    let mut ticks = String::new();
    for x in columns {
        let _ = write!(ticks, "M{x},{:.1} V{:.1} ", bottom + 4.0, bottom + 12.0);
    }
    if !ticks.is_empty() {
        let _ = writeln!(svg, r#"<path d="{ticks}" stroke="{RATE_LIMITED}" stroke-width="1"/>"#);
    }
}

fn steps(values: &[usize], bin_width: f64, y_of: &impl Fn(f64) -> f64) -> String {
    let mut path = String::new();
    for (i, v) in values.iter().enumerate() {
        let (x0, y) = (LEFT + i as f64 * bin_width, y_of(*v as f64));
        let _ = write!(path, "{}{x0:.1},{y:.1} L{:.1},{y:.1}", if i == 0 { "M" } else { " L" }, x0 + bin_width);
    }
    path
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Request;
    use crate::report::{JobDone, StatusSample};

    #[test]
    fn a_picture_is_well_formed_svg() {
        let scenario = crate::scenario::SCENARIOS[1];
        let sizes = Sizes { jobs: 1, ..Sizes::quick() };
        let mut result = RunResult::new("wavegate-seed", 0, 1);
        result.jobs[0] =
            Some(JobDone { id: 0, ok: true, attempts: 1, rate_limited: 0, start: 0, success_start: 0, end: 2_000_000 });
        result.requests =
            vec![Request { start: 0, end: 100, status: 429 }, Request { start: 10, end: 2_000_000, status: 200 }];
        result.status = vec![StatusSample { t: 0, mode: "shared".into(), state: "NORMAL".into(), limit: 10 }];
        result.marks = vec![(500_000, Mark::RedisKilled), (1_000_000, Mark::RedisRestarted)];
        let svg = draw(&scenario, &sizes, &[result]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("Redis down") && svg.contains(RATE_LIMITED) && svg.contains(LIMIT));
        assert_eq!(svg.matches("<svg").count(), 1);
        assert_eq!(axis(37.0), (40.0, 5.0));
    }
}
