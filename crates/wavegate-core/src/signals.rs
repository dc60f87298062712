//! What a provider says about its rate limits, read from a response's headers.
//!
//! Providers say far more than "429": how many requests and tokens are left in their current
//! window and when it resets. This module reads the formats below into one shape,
//! [`ProviderSignals`]: a requests [`Window`], a tokens [`Window`] and `Retry-After`. It is
//! pure (headers in as name/value pairs, time in as a [`SystemTime`]), never panics, clamps
//! absurd values and ignores malformed ones — and says which it ignored
//! ([`ProviderSignals::unreadable`]), so the caller can count and log them.
//!
//! | header | format | source |
//! |---|---|---|
//! | `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` and the same with `-tokens` | integers; the reset a duration such as `6m0s`, `1.2s`, `20ms`: the time until the continuously refilled bucket is full again ([`Window::refills`]) | OpenAI, "Rate limits" guide, section "Rate limits in headers" (<https://platform.openai.com/docs/guides/rate-limits>) |
//! | `anthropic-ratelimit-requests-limit`, `-remaining`, `-reset` and the same for `tokens`, `input-tokens`, `output-tokens` | integers; the reset an RFC 3339 date-time: when the continuously replenished bucket is full again ([`Window::refills`]) | Anthropic, "Rate limits", section "Response headers" (<https://docs.anthropic.com/en/api/rate-limits>) |
//! | `RateLimit` and `RateLimit-Policy` | `"name";r=50;t=30` and `"name";q=100;w=60` (structured-field lists, draft 08 and later), or the older dictionary `limit=100, remaining=50, reset=30` (draft 07) | IETF draft-ietf-httpapi-ratelimit-headers (<https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/>) |
//! | `Retry-After` | delay-seconds or an HTTP-date | RFC 9110 §10.2.3, see [`parse_retry_after`] |
//! | `retry-after-ms`, `x-ms-retry-after-ms` | milliseconds, possibly with a fraction; they win over `Retry-After` (finer, and sent with it) | OpenAI (its SDKs read `retry-after-ms` first), Azure OpenAI ("Azure OpenAI quotas and limits": the `retry-after-ms` and `x-ms-retry-after-ms` response headers) |
//!
//! The IETF fields carry no unit; they are read as a requests window. Anthropic's three token
//! windows (`tokens`, `input-tokens`, `output-tokens`) are read apart ([`ProviderSignals::input`],
//! [`ProviderSignals::output`], each tracked on its own by
//! [`ProviderWindows`](crate::ProviderWindows) when both are sent) and also folded into one
//! tokens window: the tightest (least remaining), whose limit is the input and output limits
//! together when both are sent (an estimate counts both: the output limit alone would refuse a
//! prompt Anthropic serves). Azure OpenAI sends `-1` for "no such limit": read as absent, not as
//! unreadable.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use wavegate_core::{ProviderSignals, SignalKind};
//!
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
//! let headers = [
//!     ("x-ratelimit-limit-requests", "600"),
//!     ("x-ratelimit-remaining-requests", "0"),
//!     ("x-ratelimit-reset-requests", "6m0s"),
//!     ("x-ratelimit-remaining-tokens", "soon"),
//! ];
//! let signals = ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), now);
//! assert_eq!(signals.requests.limit, Some(600));
//! assert_eq!(signals.requests.remaining, Some(0));
//! assert_eq!(signals.requests.reset, Some(Duration::from_secs(360)));
//! assert_eq!(signals.exhausted_for(), Some(Duration::from_secs(360)));
//! assert_eq!(signals.unreadable.iter().collect::<Vec<_>>(), [SignalKind::TokensRemaining]);
//! ```

use std::time::{Duration, SystemTime};

use crate::retry_after::parse_retry_after;

/// The longest reset a provider is believed: a window that resets later than this is clamped
/// to it (a daily window is the longest one the providers above document).
pub const MAX_RESET: Duration = Duration::from_secs(24 * 60 * 60);

/// The window of OpenAI's and Anthropic's `…-limit-…` headers: one minute, as both document.
///
/// * OpenAI, "Rate limits" guide (<https://platform.openai.com/docs/guides/rate-limits>):
///   limits are measured as RPM, RPD, TPM, TPD (and IPM); the headers' example is
///   `x-ratelimit-limit-requests: 60` with `x-ratelimit-reset-requests: 1s` — 60 a minute,
///   one back each second. The headers name no window; should one carry a longer window's
///   limit (a per-day one), read as per minute it is a budget *looser* than the real one,
///   never tighter, so the guess can only fail on the harmless side.
/// * Anthropic, "Rate limits" (<https://docs.anthropic.com/en/api/rate-limits>): limits are
///   "measured in requests per minute (RPM), input tokens per minute (ITPM), and output tokens
///   per minute (OTPM)", enforced as a token bucket; `anthropic-ratelimit-*-limit` is "the
///   maximum number of requests (tokens) allowed within any rate limit period".
///
/// A limit per second read as per minute would throttle 60 ×: the IETF fields carry their own
/// window (`w=`), and headers of other providers are not learned from.
pub const DOCUMENTED_PERIOD: Duration = Duration::from_secs(60);

/// One rate window as a response reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Window {
    /// The window's size (requests or tokens per window), when sent.
    pub limit: Option<u64>,
    /// What is left of it now (never above `limit`), when sent.
    pub remaining: Option<u64>,
    /// How long from the response until the window resets (at most [`MAX_RESET`]), when sent.
    pub reset: Option<Duration>,
    /// The window's length, when known: the IETF policy's `w=`, or [`DOCUMENTED_PERIOD`] for
    /// OpenAI's and Anthropic's limits. Only a limit with a known period is learned from
    /// ([`LearnedLimit`](crate::LearnedLimit)).
    pub period: Option<Duration>,
    /// Whether `reset` is the time until a continuously refilled bucket is full again
    /// (OpenAI's `x-ratelimit-reset-*` and Anthropic's `anthropic-ratelimit-*-reset`, both
    /// documented so: what is left grows back toward `limit` all along), rather than the end of
    /// a fixed window (the IETF fields, and a reset far later than such a bucket would need:
    /// see [`REFILL_SLACK`]).
    pub refills: bool,
}

impl Window {
    /// A window nothing was said about.
    pub const NONE: Window = Window { limit: None, remaining: None, reset: None, period: None, refills: false };

    /// Whether the response said nothing about this window.
    pub const fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset.is_none()
    }

    fn with_period(mut self, period: Option<Duration>) -> Self {
        if self.limit.is_some() {
            self.period = period;
        }
        self
    }

    /// Whether the window is spent: nothing remains.
    pub const fn is_exhausted(&self) -> bool {
        matches!(self.remaining, Some(0))
    }

    /// `remaining` left until `reset`, when the response gave both.
    pub fn left(&self) -> Option<(u64, Duration)> {
        Some((self.remaining?, self.reset?))
    }

    fn clamped(mut self) -> Self {
        if let (Some(limit), Some(remaining)) = (self.limit, self.remaining) {
            self.remaining = Some(remaining.min(limit));
        }
        self
    }

    /// Keeps [`Window::refills`] only when the reset fits a bucket refilled at its limit per
    /// period: one that is `remaining` of `limit` full is full again after about
    /// `(limit − remaining) ÷ limit × period`. A reset far later than that (more than twice
    /// it, plus [`REFILL_SLACK`]) is not such a bucket: the provider counts in fixed windows
    /// and says when the window ends (a gateway speaking OpenAI's headers over its own
    /// windows), or the limit is not per minute. Read as a refill, its
    /// `(limit − remaining) ÷ reset` would be a trickle the real provider does not give (it
    /// gives nothing until the reset, then everything), and an estimate that has taken off
    /// the calls still in flight would then wait for that trickle for many minutes: it is read
    /// as the end of a window instead, the reading that never sends early.
    fn refill_checked(mut self) -> Self {
        if let (true, Some(limit), Some(remaining), Some(reset), Some(period)) =
            (self.refills, self.limit, self.remaining, self.reset, self.period)
        {
            let spent = limit.saturating_sub(remaining) as f64 / limit.max(1) as f64;
            let full_after = period.mul_f64(spent.clamp(0.0, 1.0));
            self.refills = reset <= full_after.saturating_mul(2).saturating_add(REFILL_SLACK);
        }
        self
    }
}

/// How much later than a continuously refilled bucket would be full again its reset may be and
/// still be read as a refill ([`Window::refills`]): a reset sent in whole seconds, or a clock
/// a little off, is not taken for a fixed window.
pub const REFILL_SLACK: Duration = Duration::from_secs(1);

/// Which signal a header carried; used to say which ones could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SignalKind {
    /// `Retry-After`.
    RetryAfter,
    /// A requests window's limit.
    RequestsLimit,
    /// A requests window's remaining count.
    RequestsRemaining,
    /// A requests window's reset.
    RequestsReset,
    /// A tokens window's limit.
    TokensLimit,
    /// A tokens window's remaining count.
    TokensRemaining,
    /// A tokens window's reset.
    TokensReset,
    /// The IETF `RateLimit` field.
    RateLimit,
    /// The IETF `RateLimit-Policy` field.
    RateLimitPolicy,
}

impl SignalKind {
    const ALL: [SignalKind; 9] = [
        SignalKind::RetryAfter,
        SignalKind::RequestsLimit,
        SignalKind::RequestsRemaining,
        SignalKind::RequestsReset,
        SignalKind::TokensLimit,
        SignalKind::TokensRemaining,
        SignalKind::TokensReset,
        SignalKind::RateLimit,
        SignalKind::RateLimitPolicy,
    ];

    /// A stable snake_case label for metrics and logs: `retry_after`, `requests_limit`, ...
    pub const fn as_str(self) -> &'static str {
        match self {
            SignalKind::RetryAfter => "retry_after",
            SignalKind::RequestsLimit => "requests_limit",
            SignalKind::RequestsRemaining => "requests_remaining",
            SignalKind::RequestsReset => "requests_reset",
            SignalKind::TokensLimit => "tokens_limit",
            SignalKind::TokensRemaining => "tokens_remaining",
            SignalKind::TokensReset => "tokens_reset",
            SignalKind::RateLimit => "ratelimit",
            SignalKind::RateLimitPolicy => "ratelimit_policy",
        }
    }

    const fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The set of signals a response sent but that could not be read (malformed values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Unreadable(u16);

impl Unreadable {
    /// Nothing unreadable.
    pub const EMPTY: Unreadable = Unreadable(0);

    /// Whether every signal sent could be read.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `kind` was sent and could not be read.
    pub const fn contains(self, kind: SignalKind) -> bool {
        self.0 & kind.bit() != 0
    }

    /// Marks `kind` as unreadable.
    pub fn insert(&mut self, kind: SignalKind) {
        self.0 |= kind.bit();
    }

    /// The unreadable kinds.
    pub fn iter(self) -> impl Iterator<Item = SignalKind> {
        SignalKind::ALL.into_iter().filter(move |kind| self.contains(*kind))
    }
}

/// Everything a response said about the provider's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ProviderSignals {
    /// The requests window.
    pub requests: Window,
    /// The tokens window (the tightest of those sent; Anthropic's input and output windows
    /// folded into one of their sum).
    pub tokens: Window,
    /// Anthropic's input tokens window on its own (`anthropic-ratelimit-input-tokens-*`): its
    /// limit is learned as an input tokens budget.
    pub input: Window,
    /// Anthropic's output tokens window on its own (`anthropic-ratelimit-output-tokens-*`).
    pub output: Window,
    /// `Retry-After`, when usable.
    pub retry_after: Option<Duration>,
    /// The signals sent that could not be read.
    pub unreadable: Unreadable,
}

impl ProviderSignals {
    /// Nothing said.
    pub const NONE: ProviderSignals = ProviderSignals {
        requests: Window::NONE,
        tokens: Window::NONE,
        input: Window::NONE,
        output: Window::NONE,
        retry_after: None,
        unreadable: Unreadable::EMPTY,
    };

    /// Reads every header above from `headers` (name, raw value); names are matched without
    /// regard to case, unknown headers are skipped. Never panics.
    pub fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a [u8])>, now: SystemTime) -> Self {
        let mut reader = Reader::default();
        for (name, value) in headers {
            reader.header(name, value, now);
        }
        reader.finish()
    }

    /// Whether the response said nothing usable.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.tokens.is_empty() && self.retry_after.is_none()
    }

    /// How long until the provider takes requests again when a window is spent: the latest
    /// reset among the exhausted windows (or `Retry-After` when an exhausted window gave no
    /// reset). `None` when no window is spent.
    pub fn exhausted_for(&self) -> Option<Duration> {
        let spent = [self.requests, self.tokens].into_iter().filter(Window::is_exhausted);
        let mut until: Option<Duration> = None;
        for window in spent {
            let reset = window.reset.or(self.retry_after)?;
            until = Some(until.map_or(reset, |until| until.max(reset)));
        }
        until
    }
}

/// Which window a header's value belongs to, and which of its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Limit,
    Remaining,
    Reset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Requests,
    Tokens,
}

/// How a reset is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResetFormat {
    /// OpenAI: `6m0s`, `1.2s`, `20ms`.
    GoDuration,
    /// Anthropic: RFC 3339.
    Rfc3339,
}

#[derive(Debug, Default)]
struct Reader {
    requests: Window,
    /// Anthropic's token windows are read apart and folded at the end.
    tokens: Vec<Window>,
    retry_after: Option<Duration>,
    /// `retry-after-ms` or `x-ms-retry-after-ms`: wins over `Retry-After`.
    retry_after_ms: Option<Duration>,
    ietf: Window,
    policy_limit: Option<u64>,
    /// The IETF policy's window (`w=`), when it gave one.
    policy_window: Option<Duration>,
    /// Whether an OpenAI or Anthropic header was read (their windows are one minute).
    documented: bool,
    unreadable: Unreadable,
}

impl Reader {
    fn header(&mut self, name: &str, value: &[u8], now: SystemTime) {
        let name = name.trim().to_ascii_lowercase();
        let Ok(text) = std::str::from_utf8(value) else {
            if let Some(kind) = kind_of(&name) {
                self.unreadable.insert(kind);
            }
            return;
        };
        let text = text.trim();
        if name == "retry-after" {
            match parse_retry_after(text, now) {
                Ok(delay) => self.retry_after = Some(delay),
                Err(_) => self.unreadable.insert(SignalKind::RetryAfter),
            }
            return;
        }
        if name == "retry-after-ms" || name == "x-ms-retry-after-ms" {
            match parse_millis(text) {
                Some(delay) => self.retry_after_ms = Some(delay),
                None => self.unreadable.insert(SignalKind::RetryAfter),
            }
            return;
        }
        if name == "ratelimit" {
            match parse_ietf_ratelimit(text) {
                Some(window) => self.ietf = window,
                None => self.unreadable.insert(SignalKind::RateLimit),
            }
            return;
        }
        if name == "ratelimit-policy" {
            match parse_ietf_policy(text) {
                Some((limit, window)) => (self.policy_limit, self.policy_window) = (Some(limit), window),
                None => self.unreadable.insert(SignalKind::RateLimitPolicy),
            }
            return;
        }
        let Some((family, field, format, slot)) = classify_name(&name) else { return };
        self.documented = true;
        let kind = signal_kind(family, field);
        let window = match family {
            Family::Requests => &mut self.requests,
            Family::Tokens => {
                if self.tokens.len() <= slot {
                    self.tokens.resize(slot + 1, Window::default());
                }
                &mut self.tokens[slot]
            }
        };
        // OpenAI and Anthropic both document their reset as the time to a full bucket
        // (refilled continuously); `refill_checked` reads a reset too late for that as a
        // window's end.
        window.refills = true;
        let read = match field {
            Field::Limit | Field::Remaining => match parse_count(text) {
                Count::Value(n) => {
                    if field == Field::Limit {
                        window.limit = Some(n);
                    } else {
                        window.remaining = Some(n);
                    }
                    true
                }
                Count::NotApplicable => true,
                Count::Malformed => false,
            },
            Field::Reset => {
                let reset = match format {
                    ResetFormat::GoDuration => parse_go_duration(text),
                    ResetFormat::Rfc3339 => parse_rfc3339(text).map(|at| at.duration_since(now).unwrap_or_default()),
                };
                match reset {
                    Some(reset) => {
                        window.reset = Some(reset.min(MAX_RESET));
                        true
                    }
                    None => false,
                }
            }
        };
        if !read {
            self.unreadable.insert(kind);
        }
    }

    fn finish(self) -> ProviderSignals {
        let documented = self.documented.then_some(DOCUMENTED_PERIOD);
        let mut requests = self.requests.with_period(documented);
        if requests.is_empty() {
            requests = self.ietf;
            if requests.limit.is_none() {
                requests.limit = self.policy_limit;
            }
            requests = requests.with_period(self.policy_window);
        }
        // An estimate is input and output together: with both of Anthropic's separate limits,
        // together they are what an estimate may reach in a minute (the output limit alone
        // would refuse a large prompt Anthropic serves).
        // What is left of them together: the combined limit at the share left of the more used
        // one (none left of either: none left at all).
        let (input_and_output, left_together) = match (self.tokens.get(1), self.tokens.get(2)) {
            (Some(input), Some(output)) => {
                let limit = input.limit.zip(output.limit).map(|(i, o)| i.saturating_add(o));
                let share = |w: &Window| w.limit.zip(w.remaining).map(|(l, r)| r.min(l) as f64 / l.max(1) as f64);
                let left = limit.zip(share(input).zip(share(output))).map(|(l, (i, o))| (l as f64 * i.min(o)) as u64);
                (limit, left)
            }
            _ => (None, None),
        };
        // Anthropic's input and output windows, each on its own as well.
        let part = |slot: usize| {
            self.tokens.get(slot).map_or(Window::NONE, |w| w.clamped().with_period(documented).refill_checked())
        };
        let (input, output) = (part(1), part(2));
        // The tightest token window: the least remaining (a window without a remaining
        // count only when none has one).
        let mut tokens = self
            .tokens
            .into_iter()
            .map(|w| w.clamped().with_period(documented))
            .filter(|w| !w.is_empty())
            .min_by_key(|w| (w.remaining.unwrap_or(u64::MAX), std::cmp::Reverse(w.reset)))
            .unwrap_or_default();
        if input_and_output.is_some() {
            tokens.limit = input_and_output;
            tokens.remaining = left_together.or(tokens.remaining);
            tokens = tokens.clamped();
        }
        ProviderSignals {
            requests: requests.clamped().refill_checked(),
            tokens: tokens.refill_checked(),
            input,
            output,
            retry_after: self.retry_after_ms.or(self.retry_after),
            unreadable: self.unreadable,
        }
    }
}

fn signal_kind(family: Family, field: Field) -> SignalKind {
    match (family, field) {
        (Family::Requests, Field::Limit) => SignalKind::RequestsLimit,
        (Family::Requests, Field::Remaining) => SignalKind::RequestsRemaining,
        (Family::Requests, Field::Reset) => SignalKind::RequestsReset,
        (Family::Tokens, Field::Limit) => SignalKind::TokensLimit,
        (Family::Tokens, Field::Remaining) => SignalKind::TokensRemaining,
        (Family::Tokens, Field::Reset) => SignalKind::TokensReset,
    }
}

fn kind_of(name: &str) -> Option<SignalKind> {
    match name {
        "retry-after" | "retry-after-ms" | "x-ms-retry-after-ms" => Some(SignalKind::RetryAfter),
        "ratelimit" => Some(SignalKind::RateLimit),
        "ratelimit-policy" => Some(SignalKind::RateLimitPolicy),
        _ => classify_name(name).map(|(family, field, ..)| signal_kind(family, field)),
    }
}

/// The family, field, reset format and (for tokens) the slot of a provider header.
fn classify_name(name: &str) -> Option<(Family, Field, ResetFormat, usize)> {
    if let Some(rest) = name.strip_prefix("x-ratelimit-") {
        // OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}
        let (field, family) = rest.split_once('-')?;
        let field = match field {
            "limit" => Field::Limit,
            "remaining" => Field::Remaining,
            "reset" => Field::Reset,
            _ => return None,
        };
        let family = match family {
            "requests" => Family::Requests,
            "tokens" => Family::Tokens,
            _ => return None,
        };
        return Some((family, field, ResetFormat::GoDuration, 0));
    }
    if let Some(rest) = name.strip_prefix("anthropic-ratelimit-") {
        // Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
        let (family, field) = rest.rsplit_once('-')?;
        let field = match field {
            "limit" => Field::Limit,
            "remaining" => Field::Remaining,
            "reset" => Field::Reset,
            _ => return None,
        };
        let (family, slot) = match family {
            "requests" => (Family::Requests, 0),
            "tokens" => (Family::Tokens, 0),
            "input-tokens" => (Family::Tokens, 1),
            "output-tokens" => (Family::Tokens, 2),
            _ => return None,
        };
        return Some((family, field, ResetFormat::Rfc3339, slot));
    }
    None
}

enum Count {
    Value(u64),
    /// Azure OpenAI's `-1`: no such limit.
    NotApplicable,
    Malformed,
}

/// A non-negative integer; a number too large for a `u64` saturates (it is clamped later).
fn parse_count(text: &str) -> Count {
    if text == "-1" {
        return Count::NotApplicable;
    }
    if text.is_empty() || text.len() > 64 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Count::Malformed;
    }
    Count::Value(text.parse().unwrap_or(u64::MAX))
}

/// A number of milliseconds, possibly with a fraction (`1500`, `12.5`), as OpenAI's
/// `retry-after-ms` and Azure's `x-ms-retry-after-ms`: never negative; too large saturates;
/// anything else (a sign, an exponent, a unit, a second dot) is `None`.
fn parse_millis(text: &str) -> Option<Duration> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if text.len() > 64 || whole.is_empty() && fraction.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().unwrap_or(u64::MAX) };
    let mut nanos: u32 = 0;
    let mut scale: u32 = 100_000;
    for digit in fraction.bytes().take(6) {
        nanos += u32::from(digit - b'0') * scale;
        scale /= 10;
    }
    Some(Duration::from_millis(whole).saturating_add(Duration::from_nanos(u64::from(nanos))))
}

/// A Go-style duration as OpenAI writes its resets: one or more `<number><unit>` with units
/// `h`, `m`, `s`, `ms` (and `us`, `µs`, `ns`), the number possibly with a fraction (`1.2s`,
/// `6m0s`, `20ms`, `1h30m`). A bare `0` is zero. Too large saturates; anything else is `None`.
pub(crate) fn parse_go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() || text.len() > 64 {
        return None;
    }
    let mut total_ns: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        let (number, after) = rest.split_at(number_len);
        let unit_len =
            after.char_indices().find(|(_, c)| c.is_ascii_digit() || *c == '.').map_or(after.len(), |(i, _)| i);
        let (unit, next) = after.split_at(unit_len);
        let unit_ns: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().unwrap_or(u128::MAX / 2) };
        let mut part = whole.saturating_mul(unit_ns);
        let mut scale = unit_ns;
        for digit in fraction.bytes().take(18) {
            scale /= 10;
            part = part.saturating_add(u128::from(digit - b'0') * scale);
        }
        total_ns = total_ns.saturating_add(part);
        rest = next;
    }
    let secs = u64::try_from(total_ns / 1_000_000_000).unwrap_or(u64::MAX);
    Some(Duration::new(secs, (total_ns % 1_000_000_000) as u32))
}

/// An RFC 3339 date-time (`2026-12-01T11:05:24Z`, `2026-12-01T11:05:24.123+02:00`), as
/// Anthropic writes its resets. Anything else (or a date before 1970) is `None`.
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || bytes.len() > 40 || !text.is_ascii() {
        return None;
    }
    let digits = |from: usize, len: usize| -> Option<i64> {
        let part = text.get(from..from + len)?;
        if part.bytes().all(|b| b.is_ascii_digit()) { part.parse().ok() } else { None }
    };
    let expect = |at: usize, what: &[u8]| bytes.get(at).is_some_and(|b| what.contains(b));
    if !(expect(4, b"-") && expect(7, b"-") && expect(10, b"Tt ") && expect(13, b":") && expect(16, b":")) {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (hour, minute, second) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    // A leap second reads as the last second of its minute.
    let second = second.min(59);
    let mut at = 19;
    let mut nanos: u32 = 0;
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while bytes.get(at).is_some_and(u8::is_ascii_digit) {
            if at - start < 9 {
                nanos += u32::from(bytes[at] - b'0') * 10u32.pow(8 - (at - start) as u32);
            }
            at += 1;
        }
        if at == start {
            return None;
        }
    }
    let offset_s: i64 = match bytes.get(at)? {
        b'Z' | b'z' if at + 1 == bytes.len() => 0,
        sign @ (b'+' | b'-') if at + 6 == bytes.len() && bytes[at + 3] == b':' => {
            let (h, m) = (digits(at + 1, 2)?, digits(at + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let offset = h * 3600 + m * 60;
            if *sign == b'+' { offset } else { -offset }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    let secs = u64::try_from(secs).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `RateLimit`: the list form `"name";r=50;t=30` (draft 08 and later; several policies: the
/// tightest, least remaining) or the dictionary `limit=100, remaining=50, reset=30` (draft 07).
fn parse_ietf_ratelimit(text: &str) -> Option<Window> {
    if text.is_empty() || text.len() > 1024 {
        return None;
    }
    let mut best: Option<Window> = None;
    let mut dictionary = Window::default();
    let mut any = false;
    for item in text.split(',') {
        let item = item.trim();
        if let Some((key, value)) = item.split_once('=')
            && !item.contains(';')
        {
            // Draft 07's dictionary members.
            let value = parse_seconds_or_count(value.trim())?;
            match key.trim() {
                "limit" => dictionary.limit = Some(value),
                "remaining" => dictionary.remaining = Some(value),
                "reset" => dictionary.reset = Some(Duration::from_secs(value).min(MAX_RESET)),
                _ => {}
            }
            any = true;
            continue;
        }
        let mut window = Window::default();
        let mut params = item.split(';');
        params.next()?; // the policy's name (a string or a token)
        for param in params {
            let (key, value) = param.trim().split_once('=')?;
            let value = parse_seconds_or_count(value.trim())?;
            match key.trim() {
                "r" => window.remaining = Some(value),
                "t" => window.reset = Some(Duration::from_secs(value).min(MAX_RESET)),
                _ => {}
            }
        }
        // A policy without its remaining count says nothing usable.
        window.remaining?;
        any = true;
        best = Some(match best {
            Some(b) if b.remaining <= window.remaining => b,
            _ => window,
        });
    }
    if !any {
        return None;
    }
    Some(best.unwrap_or(dictionary))
}

/// `RateLimit-Policy`: the quota `q` of the first policy (draft 08+), or draft 07's leading
/// integer (`100;w=60`), and the policy's window `w` in seconds when given (at least 1 s, at
/// most [`MAX_RESET`]; a malformed or zero `w` is no window, the quota still read).
fn parse_ietf_policy(text: &str) -> Option<(u64, Option<Duration>)> {
    let first = text.split(',').next()?.trim();
    let mut params = first.split(';');
    let head = params.next()?.trim();
    let mut limit = head.parse::<u64>().ok();
    let mut window = None;
    for param in params {
        match param.trim().split_once('=') {
            Some(("q", value)) if limit.is_none() => limit = Some(parse_seconds_or_count(value.trim())?),
            Some(("w", value)) => {
                window = parse_seconds_or_count(value.trim())
                    .filter(|w| *w > 0)
                    .map(|w| Duration::from_secs(w).min(MAX_RESET));
            }
            _ => {}
        }
    }
    Some((limit?, window))
}

fn parse_seconds_or_count(text: &str) -> Option<u64> {
    match parse_count(text) {
        Count::Value(n) => Some(n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        // 2023-11-14T22:13:20Z
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn read(headers: &[(&str, &str)]) -> ProviderSignals {
        ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), now())
    }

    #[test]
    fn openai_durations() {
        let d = |text| parse_go_duration(text);
        assert_eq!(d("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(d("1.2s"), Some(Duration::from_millis(1200)));
        assert_eq!(d("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(d("1h2m3s"), Some(Duration::from_secs(3723)));
        assert_eq!(d("0"), Some(Duration::ZERO));
        assert_eq!(d("0s"), Some(Duration::ZERO));
        assert_eq!(d(".5s"), Some(Duration::from_millis(500)));
        for bad in ["", "s", "6", "6x", "1..2s", "-1s", "1.2.3s", "1 s", "."] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
        assert!(d("99999999999999999999999999999h").is_some(), "saturates");
    }

    #[test]
    fn rfc3339_dates() {
        let at = |text| parse_rfc3339(text);
        assert_eq!(at("2023-11-14T22:13:20Z"), Some(now()));
        assert_eq!(at("2023-11-14T22:13:50.5Z"), Some(now() + Duration::from_millis(30_500)));
        assert_eq!(at("2023-11-15T00:13:20+02:00"), Some(now()));
        assert_eq!(at("2023-11-14T20:13:20-02:00"), Some(now()));
        for bad in
            ["2023-13-14T22:13:20Z", "2023-02-29T00:00:00Z", "2023-11-14 22:13:20", "soon", "2023-11-14T22:13:20+2"]
        {
            assert_eq!(at(bad), None, "{bad:?}");
        }
        assert!(at("2024-02-29T00:00:00Z").is_some());
        assert_eq!(at("1969-12-31T23:59:59Z"), None);
    }

    #[test]
    fn openai_headers() {
        let s = read(&[
            ("x-ratelimit-limit-requests", "600"),
            ("x-ratelimit-remaining-requests", "599"),
            ("x-ratelimit-reset-requests", "100ms"),
            ("X-RateLimit-Limit-Tokens", "100000"),
            ("x-ratelimit-remaining-tokens", "99000"),
            ("x-ratelimit-reset-tokens", "600ms"),
        ]);
        assert_eq!(
            s.requests,
            Window {
                limit: Some(600),
                remaining: Some(599),
                reset: Some(Duration::from_millis(100)),
                period: Some(DOCUMENTED_PERIOD),
                refills: true
            }
        );
        assert_eq!(
            s.tokens,
            Window {
                limit: Some(100_000),
                remaining: Some(99_000),
                reset: Some(Duration::from_millis(600)),
                period: Some(DOCUMENTED_PERIOD),
                refills: true
            }
        );
        assert!(s.unreadable.is_empty());
        assert_eq!(s.exhausted_for(), None);
    }

    #[test]
    fn an_openai_reset_too_late_for_a_refill_is_a_window_end() {
        let refills = |remaining: &str, reset: &str| {
            let s = read(&[
                ("x-ratelimit-limit-tokens", "100000"),
                ("x-ratelimit-remaining-tokens", remaining),
                ("x-ratelimit-reset-tokens", reset),
            ]);
            s.tokens.refills
        };
        // Refilled at 100k a minute: 1,000 spent come back in 0.6 s, all of it in a minute.
        assert!(refills("99000", "600ms"));
        assert!(refills("0", "1m0s"));
        assert!(refills("50000", "30s"));
        // Whole seconds and a little clock trouble are no proof of a window.
        assert!(refills("99000", "1s"));
        assert!(refills("50000", "1m1s"));
        // 200 spent but full only in 59 s: a fixed window's end (or not a per-minute limit).
        assert!(!refills("99800", "59s"));
        assert!(!refills("50000", "2m"));
        // A requests window is judged alike; without a limit nothing can be judged.
        let s = read(&[
            ("x-ratelimit-limit-requests", "600"),
            ("x-ratelimit-remaining-requests", "590"),
            ("x-ratelimit-reset-requests", "45s"),
            ("x-ratelimit-remaining-tokens", "10"),
            ("x-ratelimit-reset-tokens", "45s"),
        ]);
        assert!(!s.requests.refills);
        assert!(s.tokens.refills, "no limit: no proof");
        let report = crate::WindowReport::from_signals(&s).expect("a report");
        assert_eq!(report.requests.map(|w| w.refills_to), Some(None), "read as a window's end");
    }

    #[test]
    fn anthropic_headers_fold_the_tightest_token_window() {
        let s = read(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:50Z"),
            ("anthropic-ratelimit-input-tokens-remaining", "5000"),
            ("anthropic-ratelimit-input-tokens-reset", "2023-11-14T22:13:30Z"),
            ("anthropic-ratelimit-output-tokens-remaining", "800"),
            ("anthropic-ratelimit-output-tokens-reset", "2023-11-14T22:13:25Z"),
            ("retry-after", "30"),
        ]);
        assert_eq!(s.requests.remaining, Some(0));
        assert_eq!(s.requests.reset, Some(Duration::from_secs(30)));
        assert_eq!(s.tokens.remaining, Some(800));
        assert_eq!(s.tokens.reset, Some(Duration::from_secs(5)));
        assert_eq!(s.retry_after, Some(Duration::from_secs(30)));
        assert_eq!(s.exhausted_for(), Some(Duration::from_secs(30)));
        // Anthropic documents its reset as the time its bucket is fully replenished, as OpenAI
        // does: 0 of 50 full in 30 s fits a refill of 50 a minute.
        assert!(s.requests.refills, "Anthropic's reset is the time to a full bucket");
        // One of 50 spent and full only in 50 s: a fixed window's end.
        let late = read(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:14:10Z"),
        ]);
        assert!(!late.requests.refills);
    }

    #[test]
    fn anthropic_input_and_output_limits_are_learned_together() {
        // ITPM 50,000 and OTPM 8,000: a 10,000-in / 2,000-out call fits what Anthropic serves.
        let s = read(&[
            ("anthropic-ratelimit-tokens-limit", "8000"),
            ("anthropic-ratelimit-tokens-remaining", "7000"),
            ("anthropic-ratelimit-input-tokens-limit", "50000"),
            ("anthropic-ratelimit-input-tokens-remaining", "40000"),
            ("anthropic-ratelimit-input-tokens-reset", "2023-11-14T22:13:30Z"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "7000"),
            ("anthropic-ratelimit-output-tokens-reset", "2023-11-14T22:13:25Z"),
        ]);
        assert_eq!(s.tokens.limit, Some(58_000), "both limits together");
        // 80 % of the input left, 87.5 % of the output: 80 % of both together.
        assert_eq!(s.tokens.remaining, Some(46_400), "what is left together, at the more used one's share");
        // And each on its own, learned as the input and output budgets' limits.
        assert_eq!((s.input.limit, s.input.remaining), (Some(50_000), Some(40_000)));
        assert_eq!((s.output.limit, s.output.remaining), (Some(8_000), Some(7_000)));
        let learned = crate::LearnedLimits::from_signals(&s);
        assert_eq!(learned.input.map(|l| (l.limit, l.window_ms)), Some((50_000, 60_000)));
        assert_eq!(learned.output.map(|l| (l.limit, l.window_ms)), Some((8_000, 60_000)));
        let s = read(&[
            ("anthropic-ratelimit-input-tokens-limit", "50000"),
            ("anthropic-ratelimit-input-tokens-remaining", "40000"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
        ]);
        assert_eq!(s.tokens.remaining, Some(0), "no output left: nothing left");
        // Only one of them sent: its own limit.
        let s = read(&[
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "7000"),
        ]);
        assert_eq!(s.tokens.limit, Some(8_000));
    }

    #[test]
    fn ietf_fields_both_drafts() {
        let s = read(&[("RateLimit-Policy", "\"default\";q=100;w=60"), ("RateLimit", "\"default\";r=0;t=12")]);
        let minute = Some(Duration::from_secs(60));
        assert_eq!(
            s.requests,
            Window {
                limit: Some(100),
                remaining: Some(0),
                reset: Some(Duration::from_secs(12)),
                period: minute,
                refills: false
            }
        );
        let s = read(&[("ratelimit", "limit=100, remaining=7, reset=3"), ("ratelimit-policy", "100;w=60")]);
        assert_eq!(
            s.requests,
            Window {
                limit: Some(100),
                remaining: Some(7),
                reset: Some(Duration::from_secs(3)),
                period: minute,
                refills: false
            }
        );
        let s = read(&[("ratelimit", "\"a\";r=9;t=1, \"b\";r=2;t=40")]);
        assert_eq!(s.requests.remaining, Some(2), "the tightest policy");
    }

    #[test]
    fn a_limit_has_a_period_only_when_its_window_is_known() {
        let s = read(&[("RateLimit-Policy", "\"burst\";q=10;w=2"), ("RateLimit", "\"burst\";r=3;t=1")]);
        assert_eq!((s.requests.limit, s.requests.period), (Some(10), Some(Duration::from_secs(2))));
        let s = read(&[("RateLimit-Policy", "\"p\";q=10"), ("RateLimit", "\"p\";r=3;t=1")]);
        assert_eq!((s.requests.limit, s.requests.period), (Some(10), None), "no w=: no period");
        let s = read(&[("RateLimit-Policy", "\"p\";q=10;w=0")]);
        assert_eq!((s.requests.limit, s.requests.period), (Some(10), None), "w=0 is no window");
        let s = read(&[
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-requests-remaining", "4"),
        ]);
        assert_eq!((s.tokens.limit, s.tokens.period), (Some(8_000), Some(DOCUMENTED_PERIOD)));
        assert_eq!(s.requests.period, None, "no limit: nothing to learn");
    }

    #[test]
    fn absurd_values_are_clamped_and_malformed_ones_said() {
        let s = read(&[
            ("x-ratelimit-limit-requests", "10"),
            ("x-ratelimit-remaining-requests", "99999999999999999999999"),
            ("x-ratelimit-reset-requests", "9999999h"),
            ("x-ratelimit-remaining-tokens", "-1"),
            ("x-ratelimit-limit-tokens", "ten"),
            ("retry-after", "soon"),
            ("ratelimit", ";;;"),
        ]);
        assert_eq!(s.requests.remaining, Some(10), "never above the limit");
        assert_eq!(s.requests.reset, Some(MAX_RESET));
        assert_eq!(s.tokens, Window::default(), "-1 is Azure's 'no such limit'");
        let unreadable: Vec<_> = s.unreadable.iter().collect();
        assert_eq!(unreadable, [SignalKind::RetryAfter, SignalKind::TokensLimit, SignalKind::RateLimit]);
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after_seconds() {
        let ms = Duration::from_millis;
        let s = read(&[("retry-after", "2"), ("retry-after-ms", "1500")]);
        assert_eq!(s.retry_after, Some(ms(1_500)), "OpenAI's milliseconds win");
        let s = read(&[("x-ms-retry-after-ms", "250"), ("Retry-After", "7")]);
        assert_eq!(s.retry_after, Some(ms(250)), "Azure's, whatever the order");
        assert!(s.unreadable.is_empty());
        let s = read(&[("Retry-After-Ms", " 12.5 ")]);
        assert_eq!(s.retry_after, Some(Duration::from_micros(12_500)));
        assert_eq!(read(&[("retry-after-ms", "0")]).retry_after, Some(Duration::ZERO));
        // Garbage is said, never a panic, never negative; a readable Retry-After still counts.
        for bad in ["-5", "soon", "", "1.2.3", ".", "1e3", "+3", "3 s"] {
            let s = read(&[("retry-after-ms", bad), ("retry-after", "3")]);
            assert_eq!(s.retry_after, Some(Duration::from_secs(3)), "{bad:?}");
            assert!(s.unreadable.contains(SignalKind::RetryAfter), "{bad:?}");
            let s = read(&[("x-ms-retry-after-ms", bad)]);
            assert_eq!(s.retry_after, None, "{bad:?}");
            assert!(s.unreadable.contains(SignalKind::RetryAfter), "{bad:?}");
        }
        let huge = read(&[("retry-after-ms", "99999999999999999999999999")]);
        assert!(huge.retry_after.is_some_and(|after| after >= Duration::from_secs(u64::MAX / 1_000 - 1)), "saturates");
        let headers: [(&str, &[u8]); 1] = [("retry-after-ms", b"\xff")];
        assert!(ProviderSignals::from_headers(headers, now()).unreadable.contains(SignalKind::RetryAfter));
    }

    #[test]
    fn non_utf8_values_are_unreadable_not_a_panic() {
        let headers: [(&str, &[u8]); 2] = [("x-ratelimit-reset-requests", b"\xff\xfe"), ("x-other", b"\xff")];
        let s = ProviderSignals::from_headers(headers, now());
        assert!(s.unreadable.contains(SignalKind::RequestsReset));
        assert!(s.requests.is_empty());
    }
}
