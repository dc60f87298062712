//! Properties of the provider-signal parser: it never panics, whatever the bytes; what it
//! returns is within bounds; what it reads back is what was written; and a malformed value is
//! said, never silently taken for something else. The last test is a fuzz-style run: valid
//! headers mutated byte by byte.

use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use wavegate_core::{MAX_RESET, Outcome, ProviderSignals, RateLimitKind, SignalKind};

const NAMES: &[&str] = &[
    "retry-after",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "ratelimit",
    "ratelimit-policy",
];

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn read(headers: &[(String, Vec<u8>)]) -> ProviderSignals {
    ProviderSignals::from_headers(headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())), now())
}

fn assert_bounded(signals: &ProviderSignals) {
    for window in [signals.requests, signals.tokens] {
        if let (Some(limit), Some(remaining)) = (window.limit, window.remaining) {
            assert!(remaining <= limit, "remaining {remaining} above limit {limit}");
        }
        if let Some(reset) = window.reset {
            assert!(reset <= MAX_RESET, "reset {reset:?} above the clamp");
        }
    }
    if let Some(until) = signals.exhausted_for() {
        assert!(until <= MAX_RESET.max(signals.retry_after.unwrap_or_default()));
    }
}

/// A header value a provider might send, valid or not.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        (0u64..100_000, 0u32..1000).prop_map(|(s, ms)| format!("{}m{}.{:03}s", s / 60, s % 60, ms).into_bytes()),
        "[0-9hms.]{0,12}".prop_map(String::into_bytes),
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|[+-][0-9]{2}:[0-9]{2})"
            .prop_map(String::into_bytes),
        "\"[a-z]{1,5}\";r=[0-9]{1,25};t=[0-9]{1,25}(, \"[a-z]\";r=[0-9]{1,3})?".prop_map(String::into_bytes),
        "(limit|remaining|reset)=[0-9-]{0,5}(, (limit|remaining|reset)=[0-9]{0,5}){0,3}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..40),
        ".{0,30}".prop_map(String::into_bytes),
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let name = prop_oneof![
        proptest::sample::select(NAMES).prop_map(str::to_string),
        proptest::sample::select(NAMES).prop_map(|n| n.to_ascii_uppercase()),
        "[a-z-]{0,40}",
    ];
    proptest::collection::vec((name, value()), 0..12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_and_stays_in_bounds(headers in headers()) {
        let signals = read(&headers);
        assert_bounded(&signals);
        // Every way of using them is total too.
        for status in [200, 429, 503, 529] {
            for code in [None, Some("insufficient_quota"), Some("rate_limit_error")] {
                let outcome = Outcome::from_signals(status, code, signals);
                let _ = outcome.window_report(std::time::Duration::from_secs(60));
                let _ = outcome.wave_signal();
                let _ = outcome.to_string();
            }
        }
    }

    #[test]
    fn openai_resets_read_back(ms in 0u64..86_400_000) {
        let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        let written = format!("{h}h{m}m{s}.{frac:03}s");
        let headers = vec![("x-ratelimit-reset-tokens".to_string(), written.clone().into_bytes())];
        let signals = read(&headers);
        prop_assert_eq!(signals.tokens.reset, Some(Duration::from_millis(ms)), "{}", written);
        prop_assert!(signals.unreadable.is_empty());
    }

    #[test]
    fn anthropic_resets_read_back(secs in 0u64..86_400, offset_min in -720i64..=720) {
        let at = 1_700_000_000 + secs as i64;
        let local = at + offset_min * 60;
        let (days, rem) = (local.div_euclid(86_400), local.rem_euclid(86_400));
        let (y, mo, d) = civil_from_days(days);
        let sign = if offset_min < 0 { '-' } else { '+' };
        let written = format!(
            "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}{sign}{:02}:{:02}",
            rem / 3600, rem / 60 % 60, rem % 60, offset_min.abs() / 60, offset_min.abs() % 60
        );
        let headers = vec![("anthropic-ratelimit-requests-reset".to_string(), written.clone().into_bytes())];
        let signals = read(&headers);
        prop_assert_eq!(signals.requests.reset, Some(Duration::from_secs(secs)), "{}", written);
    }

    #[test]
    fn a_malformed_value_is_said_never_taken(garbage in "[a-z ]{1,10}", which in 0usize..NAMES.len()) {
        let name = NAMES[which];
        let headers = vec![(name.to_string(), garbage.into_bytes())];
        let signals = read(&headers);
        prop_assert!(!signals.unreadable.is_empty(), "{} went unsaid", name);
        prop_assert!(signals.is_empty() || name.starts_with("ratelimit"), "{:?}", signals);
    }

    #[test]
    fn mutated_valid_headers_never_panic(seed in proptest::collection::vec((0usize..6, any::<u8>(), 0usize..32), 0..8)) {
        let mut headers: Vec<(String, Vec<u8>)> = [
            ("x-ratelimit-limit-requests", "600"),
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-reset-requests", "6m0.5s"),
            ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:14:20.25Z"),
            ("ratelimit", "\"default\";r=3;t=9"),
            ("retry-after", "Tue, 14 Nov 2023 22:14:00 GMT"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
        for (header, byte, at) in seed {
            let value = &mut headers[header].1;
            let at = at % (value.len() + 1);
            if byte % 3 == 0 && at < value.len() { value.remove(at); } else { value.insert(at, byte); }
        }
        assert_bounded(&read(&headers));
    }
}

#[test]
fn an_insufficient_quota_with_a_spent_window_is_a_rate_window() {
    let headers = vec![
        ("x-ratelimit-remaining-tokens".to_string(), b"0".to_vec()),
        ("x-ratelimit-reset-tokens".to_string(), b"41s".to_vec()),
    ];
    let outcome = Outcome::from_signals(429, Some("insufficient_quota"), read(&headers));
    assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::RateWindow));
    let report = outcome.window_report(std::time::Duration::from_secs(60)).expect("the spent window");
    assert_eq!(report.tokens.map(|t| (t.remaining, t.reset_ms)), Some((0, 41_000)));
    assert!(!read(&headers).unreadable.contains(SignalKind::TokensReset));
}

/// Inverse of days_from_civil (H. Hinnant).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}
