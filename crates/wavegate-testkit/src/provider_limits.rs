//! A provider's requests and tokens windows, and the headers it announces them with.
//!
//! The accounting of [`MockProvider`](crate::MockProvider) (and of the scenario runner's
//! provider): fixed windows that start with the first request, a requests budget and a tokens
//! budget per window, an optional spent quota. Every answer says what is left the way the
//! providers do:
//!
//! * OpenAI ([`HeaderStyle::OpenAi`]) sends `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the
//!   reset a duration such as `6m0s` or `1.25s`; a refused call's body has the error `code`
//!   `rate_limit_exceeded` (or `insufficient_quota`), as OpenAI's "Rate limits" guide and
//!   "Error codes" page describe them.
//! * Anthropic ([`HeaderStyle::Anthropic`]) sends `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`,
//!   the reset an RFC 3339 date-time in whole seconds (rounded up); a refused call's body has
//!   the error `type` `rate_limit_error`, as Anthropic's "Rate limits" and "Errors" pages do.
//! * The IETF draft ([`HeaderStyle::Ietf`], draft-ietf-httpapi-ratelimit-headers 08 and later)
//!   sends `RateLimit-Policy: "default";q=<limit>;w=<window s>` and
//!   `RateLimit: "default";r=<left>;t=<reset s, rounded up>` for the requests window (the
//!   fields carry no unit; a tokens budget is enforced but not announced). Its window is in
//!   whole seconds.
//!
//! OpenAI and Anthropic document their limits per minute and their headers do not name the
//! window, so the mock sends their `…-limit-…` headers only for one-minute windows: a shorter
//! window (for quick tests) is announced by what is left and the reset only, as a provider
//! that told its limit would be read as per minute.
//!
//! A refusal also carries `retry-after` (whole seconds, rounded up) and costs nothing.

use std::time::{Duration, Instant, SystemTime};

/// Which provider's headers to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// OpenAI's `x-ratelimit-*`.
    OpenAi,
    /// Anthropic's `anthropic-ratelimit-*`.
    Anthropic,
    /// The IETF draft's `RateLimit` and `RateLimit-Policy` (requests only).
    Ietf,
}

impl HeaderStyle {
    /// Parses `openai` or `anthropic`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "openai" => Some(HeaderStyle::OpenAi),
            "anthropic" => Some(HeaderStyle::Anthropic),
            "ietf" => Some(HeaderStyle::Ietf),
            _ => None,
        }
    }

    /// `openai`, `anthropic` or `ietf`.
    pub const fn as_str(self) -> &'static str {
        match self {
            HeaderStyle::OpenAi => "openai",
            HeaderStyle::Anthropic => "anthropic",
            HeaderStyle::Ietf => "ietf",
        }
    }
}

/// The budgets a provider enforces and announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderLimits {
    /// The headers it speaks.
    pub style: HeaderStyle,
    /// Requests per window (`None`: no such budget, and no such headers).
    pub requests: Option<u64>,
    /// Tokens per window (`None`: no such budget, and no such headers).
    pub tokens: Option<u64>,
    /// The window: one minute for "per minute" budgets.
    pub window: Duration,
    /// Every call is refused with a spent quota (OpenAI's `insufficient_quota`).
    pub quota_exhausted: bool,
}

/// What the provider answers one call, before its service time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// 200 when admitted, 429 when refused.
    pub status: u16,
    /// The rate-limit headers (and `retry-after` on a refusal).
    pub headers: Vec<(String, String)>,
    /// The body: empty on a 200, the provider's error object on a refusal.
    pub body: String,
}

/// The provider's windows as it counts them.
#[derive(Debug, Clone, Default)]
pub struct WindowCounter {
    /// When the first window began (the first call).
    origin: Option<Instant>,
    /// The current window's number, and what it has used.
    index: u64,
    requests: u64,
    tokens: u64,
}

impl WindowCounter {
    /// Admits or refuses a call reserving `tokens` at `now`, and says what to answer.
    pub fn answer(&mut self, limits: &ProviderLimits, now: Instant, tokens: u64) -> Answer {
        let origin = *self.origin.get_or_insert(now);
        let window = limits.window.max(Duration::from_millis(1));
        let index = (now.duration_since(origin).as_nanos() / window.as_nanos()) as u64;
        if index != self.index {
            (self.index, self.requests, self.tokens) = (index, 0, 0);
        }
        let ends = origin + window * u32::try_from(index + 1).unwrap_or(u32::MAX);
        let reset = ends.saturating_duration_since(now);
        let fits_requests = limits.requests.is_none_or(|limit| self.requests < limit);
        let fits_tokens = limits.tokens.is_none_or(|limit| self.tokens.saturating_add(tokens) <= limit);
        let admitted = !limits.quota_exhausted && fits_requests && fits_tokens;
        if admitted {
            self.requests += 1;
            self.tokens = self.tokens.saturating_add(tokens);
        }
        let mut headers = Vec::new();
        let at = SystemTime::now() + reset;
        // The providers document their limits per minute: a limit header for a shorter window
        // would be read as per minute (see the module docs).
        let tell_limit = window == Duration::from_secs(60);
        for (family, limit, used) in
            [("requests", limits.requests, self.requests), ("tokens", limits.tokens, self.tokens)]
        {
            let Some(limit) = limit else { continue };
            let left = limit.saturating_sub(used);
            match limits.style {
                HeaderStyle::OpenAi => {
                    if tell_limit {
                        headers.push((format!("x-ratelimit-limit-{family}"), limit.to_string()));
                    }
                    headers.push((format!("x-ratelimit-remaining-{family}"), left.to_string()));
                    headers.push((format!("x-ratelimit-reset-{family}"), go_duration(reset)));
                }
                HeaderStyle::Anthropic => {
                    if tell_limit {
                        headers.push((format!("anthropic-ratelimit-{family}-limit"), limit.to_string()));
                    }
                    headers.push((format!("anthropic-ratelimit-{family}-remaining"), left.to_string()));
                    headers.push((format!("anthropic-ratelimit-{family}-reset"), rfc3339_ceil(at)));
                }
                HeaderStyle::Ietf if family == "requests" => {
                    let window_s = window.as_secs_f64().ceil().max(1.0);
                    headers.push(("ratelimit-policy".to_string(), format!("\"default\";q={limit};w={window_s}")));
                    let reset_s = reset.as_secs_f64().ceil();
                    headers.push(("ratelimit".to_string(), format!("\"default\";r={left};t={reset_s}")));
                }
                HeaderStyle::Ietf => {}
            }
        }
        if admitted {
            return Answer { status: 200, headers, body: String::new() };
        }
        let retry_after = if limits.quota_exhausted { Duration::from_secs(3600) } else { reset };
        headers.push(("retry-after".to_string(), retry_after.as_secs_f64().ceil().max(1.0).to_string()));
        let body = match (limits.style, limits.quota_exhausted) {
            (HeaderStyle::OpenAi, true) => {
                r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#
            }
            (HeaderStyle::OpenAi, false) => {
                r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#
            }
            (HeaderStyle::Anthropic | HeaderStyle::Ietf, true) => {
                r#"{"type":"error","error":{"type":"insufficient_quota","message":"quota exhausted"}}"#
            }
            (HeaderStyle::Anthropic | HeaderStyle::Ietf, false) => {
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"rate limited"}}"#
            }
        };
        Answer { status: 429, headers, body: body.to_string() }
    }
}

/// The error code of a provider's error body: OpenAI's `"code"`, else Anthropic's inner
/// `"type"` (a small scan, enough for the bodies above and the providers' documented ones).
pub fn error_code(body: &str) -> Option<&str> {
    let value_of = |key: &str| {
        let at = body.find(key)? + key.len();
        let rest = body[at..].trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
        rest.split('"').next()
    };
    value_of("\"code\"").or_else(|| {
        let inner = &body[body.find("\"error\"")?..];
        let at = inner.find("\"type\"")? + "\"type\"".len();
        inner[at..].trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?.split('"').next()
    })
}

/// `6m0s`, `1.25s`, `20ms`: how OpenAI writes a reset.
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (minutes, rest_ms) = (ms / 60_000, ms % 60_000);
    let seconds = format!("{}.{:03}", rest_ms / 1000, rest_ms % 1000);
    let seconds = seconds.trim_end_matches('0').trim_end_matches('.');
    if minutes > 0 { format!("{minutes}m{seconds}s") } else { format!("{seconds}s") }
}

/// An HTTP-date (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`) in whole seconds, rounded
/// down, as a `Retry-After` may carry it.
pub fn http_date(at: SystemTime) -> String {
    let secs = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"][(m - 1) as usize];
    format!("{weekday}, {d:02} {month} {y:04} {:02}:{:02}:{:02} GMT", rem / 3600, rem / 60 % 60, rem % 60)
}

/// An RFC 3339 date-time in whole seconds, rounded up, UTC (Anthropic's resets).
pub fn rfc3339_ceil(at: SystemTime) -> String {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() + u64::from(since.subsec_nanos() > 0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// The date of a day number since 1970-01-01 (H. Hinnant's `civil_from_days`).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(style: HeaderStyle) -> ProviderLimits {
        ProviderLimits {
            style,
            requests: Some(2),
            tokens: Some(100),
            window: Duration::from_secs(60),
            quota_exhausted: false,
        }
    }

    fn header<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
        answer.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn windows_count_requests_and_tokens_and_refill() {
        let (limits, mut counter, t0) = (limits(HeaderStyle::OpenAi), WindowCounter::default(), Instant::now());
        let first = counter.answer(&limits, t0, 60);
        assert_eq!(first.status, 200);
        assert_eq!(header(&first, "x-ratelimit-remaining-requests"), Some("1"));
        assert_eq!(header(&first, "x-ratelimit-remaining-tokens"), Some("40"));
        assert_eq!(header(&first, "x-ratelimit-reset-tokens"), Some("1m0s"));
        let too_many_tokens = counter.answer(&limits, t0 + Duration::from_secs(15), 60);
        assert_eq!(too_many_tokens.status, 429);
        assert_eq!(header(&too_many_tokens, "retry-after"), Some("45"));
        assert_eq!(header(&too_many_tokens, "x-ratelimit-reset-requests"), Some("45s"));
        assert_eq!(error_code(&too_many_tokens.body), Some("rate_limit_exceeded"));
        assert_eq!(counter.answer(&limits, t0 + Duration::from_secs(16), 40).status, 200);
        assert_eq!(counter.answer(&limits, t0 + Duration::from_secs(17), 0).status, 429, "2 requests per window");
        assert_eq!(counter.answer(&limits, t0 + Duration::from_secs(60), 60).status, 200, "a new window");
    }

    #[test]
    fn anthropic_style_and_a_spent_quota() {
        let mut limits = limits(HeaderStyle::Anthropic);
        let mut counter = WindowCounter::default();
        let answer = counter.answer(&limits, Instant::now(), 10);
        let reset = header(&answer, "anthropic-ratelimit-requests-reset").expect("a reset");
        assert!(reset.len() == 20 && reset.ends_with('Z'), "{reset}");
        limits.quota_exhausted = true;
        let refused = counter.answer(&limits, Instant::now(), 10);
        assert_eq!(refused.status, 429);
        assert_eq!(error_code(&refused.body), Some("insufficient_quota"));
        limits.style = HeaderStyle::OpenAi;
        assert_eq!(error_code(&counter.answer(&limits, Instant::now(), 1).body), Some("insufficient_quota"));
        assert_eq!(error_code(r#"{"type":"error","error":{"type":"overloaded_error"}}"#), Some("overloaded_error"));
    }

    #[test]
    fn ietf_fields_name_their_window_and_short_windows_hide_the_providers_limits() {
        let mut limits = limits(HeaderStyle::Ietf);
        limits.window = Duration::from_secs(2);
        let (mut counter, t0) = (WindowCounter::default(), Instant::now());
        let answer = counter.answer(&limits, t0, 0);
        assert_eq!(header(&answer, "ratelimit-policy"), Some("\"default\";q=2;w=2"));
        assert_eq!(header(&answer, "ratelimit"), Some("\"default\";r=1;t=2"));
        limits.style = HeaderStyle::OpenAi;
        let answer = counter.answer(&limits, t0, 0);
        assert_eq!(header(&answer, "x-ratelimit-limit-requests"), None, "not a one-minute window");
        assert_eq!(header(&answer, "x-ratelimit-remaining-requests"), Some("0"));
    }

    #[test]
    fn durations_and_dates_as_the_providers_write_them() {
        assert_eq!(go_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(go_duration(Duration::from_millis(1250)), "1.25s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_millis(61_500)), "1m1.5s");
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_001);
        assert_eq!(rfc3339_ceil(at), "2023-11-14T22:13:21Z");
        assert_eq!(
            http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
    }
}
