//! The provider's hostility, as a hook on the mock provider's answers: its dated resets come
//! from a skewed clock (every answer), and a drawn share of answers is made absurd on purpose —
//! a 429's `Retry-After` huge, negative, garbage or an HTTP-date far away; a 200's "remaining"
//! negative, huge or garbage; a 402 with a spent quota's body. It counts what it did, and when
//! it told which worker (`w=` in the path) that the quota is spent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wavegate_testkit::{Answer, HeaderStyle, Hook, http_date, rfc3339_ceil};

use crate::fleet::unix_ms;

const QUOTA_BODY: &str = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;

#[derive(Debug, Default)]
pub(crate) struct Record {
    /// How many answers each kind of hostility rewrote.
    pub(crate) counts: BTreeMap<&'static str, u64>,
    /// (unix ms, worker index) of every answer that said the quota is spent.
    pub(crate) quota_told: Vec<(u64, usize)>,
}

/// A path's `key=` value.
pub(crate) fn query<'a>(path: &'a str, key: &str) -> Option<&'a str> {
    path.split_once('?')?.1.split('&').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// The hook: `hostility` of the answers rewritten, the dated resets `skew_ms` off.
pub(crate) fn hook(seed: u64, style: HeaderStyle, hostility: f64, skew_ms: i64, record: Arc<Mutex<Record>>) -> Hook {
    let rng = Mutex::new(SmallRng::seed_from_u64(seed ^ 0x0b57_11e0));
    Arc::new(move |answer: &mut Answer, path: &str| {
        let mut rng = rng.lock().expect("hook rng");
        let mut record = record.lock().expect("hook record");
        let now = SystemTime::now();
        if style == HeaderStyle::Anthropic && skew_ms != 0 {
            // Every dated reset from the provider's own (skewed) clock.
            for (name, value) in &mut answer.headers {
                if let Some(at) = name.ends_with("-reset").then(|| chrono_free_parse(value).ok()).flatten() {
                    *value = rfc3339_ceil(shift(at, skew_ms));
                }
            }
        }
        // A rate window's 429 is rare (the fleet waits for the window it announces): half of
        // them are made hostile, so each run sees a few absurd `Retry-After`s.
        let rate_429 = answer.status == 429 && !answer.body.contains("insufficient_quota");
        if rng.random_bool(if rate_429 { 0.5 } else { hostility }) {
            let kind = if rate_429 {
                let values = [
                    ("retry-after huge", "86400".to_string()),
                    ("retry-after overflow", "99999999999999999999".to_string()),
                    ("retry-after negative", "-30".to_string()),
                    ("retry-after garbage", "soon".to_string()),
                    ("retry-after date +1 year", http_date(now + Duration::from_secs(365 * 86_400))),
                    ("retry-after date -1 h", http_date(now - Duration::from_secs(3_600))),
                ];
                let (kind, value) = values[rng.random_range(0..values.len())].clone();
                answer.headers.retain(|(n, _)| n != "retry-after");
                answer.headers.push(("retry-after".into(), value));
                kind
            } else if answer.status == 200 && rng.random_bool(0.85) {
                let values = [
                    ("remaining negative", "-3"),
                    ("remaining huge", "99999999999999999999"),
                    ("remaining garbage", "lots"),
                ];
                let (kind, value) = values[rng.random_range(0..values.len())];
                for (name, v) in &mut answer.headers {
                    if name.contains("remaining") {
                        *v = value.to_string();
                    } else if name == "ratelimit" {
                        *v = format!("\"default\";r={value};t=1");
                    }
                }
                kind
            } else {
                answer.status = 402;
                answer.body = QUOTA_BODY.to_string();
                answer.headers.retain(|(n, _)| !n.contains("remaining") && n != "ratelimit");
                "402 insufficient_quota"
            };
            *record.counts.entry(kind).or_default() += 1;
        }
        if answer.body.contains("insufficient_quota") {
            let worker = query(path, "w").and_then(|w| w.parse().ok()).unwrap_or(usize::MAX);
            record.quota_told.push((unix_ms(), worker));
        }
    })
}

fn shift(at: SystemTime, ms: i64) -> SystemTime {
    if ms >= 0 { at + Duration::from_millis(ms as u64) } else { at - Duration::from_millis(ms.unsigned_abs()) }
}

/// `2023-11-14T22:13:21Z` as the mock writes it.
fn chrono_free_parse(text: &str) -> Result<SystemTime, ()> {
    let b = text.as_bytes();
    if b.len() != 20 || b[19] != b'Z' {
        return Err(());
    }
    let n = |r: std::ops::Range<usize>| text.get(r).and_then(|s| s.parse::<i64>().ok()).ok_or(());
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    // H. Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3_600 + mm * 60 + ss;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).map_err(|_| ())?))
}
