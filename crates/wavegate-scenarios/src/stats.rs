//! Percentiles and the provider's in-flight count over time, from its recorded requests.

use crate::provider::Request;

/// The `p`-th percentile (0–100) of `values` by nearest rank; `None` when empty.
pub(crate) fn percentile(values: &mut [f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    Some(values[rank.clamp(1, values.len()) - 1])
}

/// The most requests open at once among `requests` for which `keep` holds.
pub(crate) fn max_in_flight(requests: &[Request], keep: impl Fn(&Request) -> bool) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::new();
    for r in requests.iter().filter(|r| keep(r)) {
        events.push((r.start, 1));
        events.push((r.end.max(r.start), -1));
    }
    // At one instant, ends before starts: back-to-back calls do not overlap.
    events.sort_unstable();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        max = max.max(now);
    }
    max as usize
}

/// The most requests open at once in each of `bins` equal bins of `[from, to)` (µs), among
/// the requests for which `keep` holds.
pub(crate) fn in_flight_bins(
    requests: &[Request],
    from: u64,
    to: u64,
    bins: usize,
    keep: impl Fn(&Request) -> bool,
) -> Vec<usize> {
    let mut out = vec![0usize; bins];
    if bins == 0 || to <= from {
        return out;
    }
    let width = (to - from) as f64 / bins as f64;
    let bin_of = |t: u64| -> usize { (((t.saturating_sub(from)) as f64 / width) as usize).min(bins - 1) };
    let mut events: Vec<(u64, i32)> = Vec::new();
    for r in requests.iter().filter(|r| keep(r)) {
        events.push((r.start, 1));
        events.push((r.end.max(r.start), -1));
    }
    events.sort_unstable();
    let level = |now: i32| now.max(0) as usize;
    let (mut now, mut filled) = (0i32, 0usize); // bins [0, filled) have the level carried into them
    for (t, delta) in events {
        if t >= to {
            break;
        }
        if t >= from {
            let bin = bin_of(t);
            while filled < bin {
                out[filled] = out[filled].max(level(now));
                filled += 1;
            }
            // The level carried into this bin counts unless it changes right at its start.
            if filled == bin {
                let bin_start = from as f64 + bin as f64 * width;
                if t as f64 > bin_start {
                    out[bin] = out[bin].max(level(now));
                }
                filled += 1;
            }
        }
        now += delta;
        if t >= from {
            let bin = bin_of(t);
            out[bin] = out[bin].max(level(now));
        }
    }
    while filled < bins {
        out[filled] = out[filled].max(level(now));
        filled += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> Request {
        Request { start, end, status: 200 }
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), Some(50.0));
        assert_eq!(percentile(&mut v, 99.0), Some(99.0));
        assert_eq!(percentile(&mut v, 100.0), Some(100.0));
        assert_eq!(percentile(&mut [], 50.0), None);
        assert_eq!(percentile(&mut [3.0], 99.0), Some(3.0));
    }

    #[test]
    fn in_flight_counts_overlaps_only() {
        let requests = [r(0, 10), r(5, 15), r(10, 20), r(30, 40)];
        assert_eq!(max_in_flight(&requests, |_| true), 2);
        assert_eq!(max_in_flight(&[r(0, 10), r(10, 20)], |_| true), 1, "back to back is not at once");
        // Bins of 10 µs over [0, 40): [0,10) has 2 at once, [10,20) 2, [20,30) 0, [30,40) 1.
        assert_eq!(in_flight_bins(&requests, 0, 40, 4, |_| true), vec![2, 2, 0, 1]);
        // A long request spans bins without events.
        assert_eq!(in_flight_bins(&[r(0, 100)], 0, 40, 4, |_| true), vec![1, 1, 1, 1]);
    }
}
