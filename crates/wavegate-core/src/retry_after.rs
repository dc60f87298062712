//! Parsing the HTTP `Retry-After` header.
//!
//! RFC 9110 allows two forms: delay-seconds (`120`) and an HTTP-date
//! (`Wed, 21 Oct 2015 07:28:00 GMT`, plus the two obsolete date forms). Providers also send
//! fractions (`1.5`). Anything else is a typed error, never a panic; the caller decides to
//! fall back to its own cooldown. Values are not clamped here: see
//! [`CooldownPolicy`](crate::CooldownPolicy) for the bounds.

use std::time::{Duration, SystemTime};

/// Why a `Retry-After` value could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryAfterError {
    /// The header was present but empty.
    #[error("Retry-After is empty")]
    Empty,
    /// A number of seconds below zero.
    #[error("Retry-After is negative: {0:?}")]
    Negative(String),
    /// Neither delay-seconds nor an HTTP-date.
    #[error("Retry-After is neither delay-seconds nor an HTTP-date: {0:?}")]
    Malformed(String),
}

/// Parses a `Retry-After` value into the delay from `now`.
///
/// A date in the past gives a zero delay; a number too large for a [`Duration`] saturates.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use wavegate_core::parse_retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_400);
/// assert_eq!(parse_retry_after("7", now), Ok(Duration::from_secs(7)));
/// assert_eq!(parse_retry_after("0.25", now), Ok(Duration::from_millis(250)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Ok(Duration::from_secs(80))
/// );
/// assert!(parse_retry_after("soon", now).is_err());
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Result<Duration, RetryAfterError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(RetryAfterError::Empty);
    }
    if let Some(delay) = parse_seconds(value)? {
        return Ok(delay);
    }
    match httpdate::parse_http_date(value) {
        Ok(at) => Ok(at.duration_since(now).unwrap_or(Duration::ZERO)),
        Err(_) => Err(RetryAfterError::Malformed(truncate(value))),
    }
}

/// `Ok(None)` when `value` is not numeric at all (it may be a date).
fn parse_seconds(value: &str) -> Result<Option<Duration>, RetryAfterError> {
    let (negative, digits) = match value.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, value.strip_prefix('+').unwrap_or(value)),
    };
    let (whole, fraction) = match digits.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (digits, None),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let numeric = all_digits(whole)
        && fraction.is_none_or(|f| all_digits(f) && !f.is_empty())
        && !(whole.is_empty() && fraction.is_none());
    if !numeric {
        return Ok(None);
    }
    if negative {
        return Err(RetryAfterError::Negative(truncate(value)));
    }
    let whole_secs = if whole.is_empty() {
        0
    } else {
        // Only digits: parse fails only on overflow, which saturates.
        whole.parse::<u64>().unwrap_or(u64::MAX)
    };
    let nanos = fraction.map_or(0, |f| {
        let mut nanos = 0u32;
        for (i, b) in f.bytes().take(9).enumerate() {
            nanos += u32::from(b - b'0') * 10u32.pow(8 - i as u32);
        }
        nanos
    });
    Ok(Some(Duration::new(whole_secs, nanos)))
}

fn truncate(value: &str) -> String {
    value.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_400) // 2015-10-21 07:26:40 GMT
    }

    #[test]
    fn delay_seconds() {
        assert_eq!(parse_retry_after("0", now()), Ok(Duration::ZERO));
        assert_eq!(parse_retry_after(" 30 ", now()), Ok(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("+3", now()), Ok(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("1.5", now()), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after(".5", now()), Ok(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("2.", now()).ok(), None);
    }

    #[test]
    fn huge_saturates_instead_of_panicking() {
        let huge = "99999999999999999999999999999";
        assert_eq!(parse_retry_after(huge, now()), Ok(Duration::new(u64::MAX, 0)));
        assert_eq!(parse_retry_after("1.0000000000000000001", now()), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn negative_is_an_error() {
        assert!(matches!(parse_retry_after("-5", now()), Err(RetryAfterError::Negative(_))));
    }

    #[test]
    fn http_dates_all_three_forms() {
        for date in ["Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15 07:28:00 GMT", "Wed Oct 21 07:28:00 2015"] {
            assert_eq!(parse_retry_after(date, now()), Ok(Duration::from_secs(80)), "{date}");
        }
    }

    #[test]
    fn past_date_is_zero() {
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now()), Ok(Duration::ZERO));
    }

    #[test]
    fn garbage_is_malformed() {
        for bad in ["soon", "1e3", "0x10", "12 s", "Wed, 32 Oct 2015 07:28:00 GMT", "١٢"] {
            assert!(matches!(parse_retry_after(bad, now()), Err(RetryAfterError::Malformed(_))), "{bad}");
        }
        assert_eq!(parse_retry_after("   ", now()), Err(RetryAfterError::Empty));
    }
}
