//! What the processes say to each other: one line per message, `WORD key=value ...`, over
//! the children's stdin and stdout; times are microseconds since the Unix epoch, so every
//! process of the machine shares one clock.
//!
//! | from → to         | line                                                              |
//! |-------------------|-------------------------------------------------------------------|
//! | provider → runner | `LISTENING addr=127.0.0.1:PORT`, later `DUMPED n=N`                |
//! | runner → provider | `DUMP path=FILE` (writes every request's `start end status` there) |
//! | worker → runner   | `READY pid=PID`, `DONE ...` per job, `STATUS ...`, `FINISHED ...`  |
//! | runner → worker   | `GO t0=US`, `JOB id=N` (as many as it has free callers), `END`     |

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub(crate) fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The value of `key=` in a protocol line.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
}

/// The value of `key=` parsed as a number.
pub(crate) fn num<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    field(line, key).and_then(|v| v.parse().ok())
}

/// The service time of job `id` in milliseconds, drawn from `[min, max]` by a hash of the id:
/// the provider and the runner compute the same value, and every strategy sees the same
/// job list with the same service times.
pub(crate) fn service_ms(id: u64, (min, max): (u64, u64)) -> u64 {
    if max <= min {
        return min;
    }
    // splitmix64: a good spread for consecutive ids.
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    min + z % (max - min + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_found_by_key() {
        let line = "DONE id=7 ok=1 attempts=3 r429=2";
        assert_eq!(field(line, "id"), Some("7"));
        assert_eq!(num::<u32>(line, "attempts"), Some(3));
        assert_eq!(num::<u32>(line, "r429"), Some(2));
        assert_eq!(field(line, "r4"), None);
        assert_eq!(field(line, "missing"), None);
    }

    #[test]
    fn service_times_stay_in_range_and_spread() {
        let times: Vec<u64> = (0..1000).map(|id| service_ms(id, (100, 200))).collect();
        assert!(times.iter().all(|t| (100..=200).contains(t)));
        let mean = times.iter().sum::<u64>() as f64 / times.len() as f64;
        assert!((140.0..160.0).contains(&mean), "mean {mean}");
        assert_eq!(service_ms(5, (150, 150)), 150);
        assert_eq!(service_ms(5, (100, 200)), service_ms(5, (100, 200)));
    }
}
