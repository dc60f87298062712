//! A provider with Anthropic's rate-limit semantics: requests, input tokens and output tokens
//! per minute, each a bucket refilled continuously, enforced separately.
//!
//! Anthropic's "Rate limits" page: limits are per minute for requests (RPM), input tokens
//! (ITPM) and output tokens (OTPM), measured with the token bucket algorithm ("your capacity is
//! continuously replenished up to your maximum limit, rather than being reset at fixed
//! intervals"). A request is admitted only if each bucket holds its cost: 1 request, its input
//! tokens, and its `max_tokens` of output ("OTPM rate limits are estimated based on `max_tokens`
//! at the beginning of each request and adjusted at the end of the request to reflect the
//! actual number of output tokens used"). Every answer carries
//! `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}`,
//! the reset being the RFC 3339 time (whole seconds, rounded up) when that bucket is fully
//! replenished; `tokens-*` are those of the most restrictive token limit (the one with the
//! smaller share left). A refusal is a 429 with Anthropic's error body
//! (`"type":"rate_limit_error"`) and a `retry-after` in whole seconds; it costs nothing.
//!
//! There is no hidden cap and no transient error here (see [`crate::OpenAiBucket`] for those).

use std::time::{Duration, Instant, SystemTime};

use crate::provider_limits::{Answer, rfc3339_ceil};

/// What the provider enforces per key, per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnthropicLimits {
    /// Requests per minute.
    pub requests_per_minute: u64,
    /// Input tokens per minute (ITPM).
    pub input_tokens_per_minute: u64,
    /// Output tokens per minute (OTPM).
    pub output_tokens_per_minute: u64,
}

/// The three buckets of one key, as Anthropic counts them.
#[derive(Debug, Clone)]
pub struct AnthropicBucket {
    limits: AnthropicLimits,
    /// What each bucket holds (requests, input, output) at `at`.
    held: [f64; 3],
    at: Option<Instant>,
    in_flight: usize,
    max_in_flight: usize,
    input_charged: u64,
    output_charged: u64,
    refused: u64,
    /// The buckets' state after the last arrival or end of a call (when, and what they held).
    last: Option<(Instant, [f64; 3])>,
    longest_silence: Duration,
}

impl AnthropicBucket {
    /// Full buckets (a minute's worth), nothing in flight.
    pub fn new(limits: AnthropicLimits) -> Self {
        Self {
            limits,
            held: Self::sizes_of(&limits).map(|s| s as f64),
            at: None,
            in_flight: 0,
            max_in_flight: 0,
            input_charged: 0,
            output_charged: 0,
            refused: 0,
            last: None,
            longest_silence: Duration::ZERO,
        }
    }

    fn sizes_of(limits: &AnthropicLimits) -> [u64; 3] {
        [limits.requests_per_minute, limits.input_tokens_per_minute, limits.output_tokens_per_minute]
    }

    /// The limits it enforces.
    pub fn limits(&self) -> AnthropicLimits {
        self.limits
    }

    /// What the buckets hold at `now` (requests, input, output), refilled since the last call.
    pub fn level(&mut self, now: Instant) -> [f64; 3] {
        let sizes = Self::sizes_of(&self.limits);
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            for (held, size) in self.held.iter_mut().zip(sizes) {
                *held = (*held + elapsed * size as f64 / 60.0).min(size as f64);
            }
        }
        self.at = Some(self.at.map_or(now, |at| at.max(now)));
        self.held
    }

    /// Whether the buckets hold a call of `input` tokens asking for up to `max_tokens` at
    /// `now` (nothing taken, nothing counted).
    pub fn holds(&mut self, now: Instant, input: u64, max_tokens: u64) -> bool {
        let held = self.level(now);
        held[0] >= 1.0 && held[1] >= input as f64 && held[2] >= max_tokens as f64
    }

    /// Admits or refuses a call of `input` tokens asking for up to `max_tokens` at `now`. A 200
    /// is in flight until [`AnthropicBucket::finished`], which adjusts its output.
    pub fn answer(&mut self, now: Instant, input: u64, max_tokens: u64) -> Answer {
        let held = self.level(now);
        let sizes = Self::sizes_of(&self.limits);
        let need = [1.0, input as f64, max_tokens as f64];
        if let Some((at, then)) = self.last {
            // When the buckets, as they were left at the last arrival or end, held this call.
            let waits: Option<Vec<f64>> = (0..3)
                .map(|i| {
                    let rate = sizes[i] as f64 / 60.0;
                    if need[i] > sizes[i] as f64 { None } else { Some((need[i] - then[i]).max(0.0) / rate.max(1e-9)) }
                })
                .collect();
            if let Some(waits) = waits {
                let room = at + secs(waits.into_iter().fold(0.0, f64::max));
                self.longest_silence = self.longest_silence.max(now.saturating_duration_since(room));
            }
        }
        let answer = self.decide(held, need, sizes);
        self.last = Some((now, self.held));
        answer
    }

    fn decide(&mut self, held: [f64; 3], need: [f64; 3], sizes: [u64; 3]) -> Answer {
        let (input, max_tokens) = (need[1] as u64, need[2] as u64);
        let short = (0..3).find(|&i| held[i] < need[i]);
        let Some(short) = short else {
            for (held, need) in self.held.iter_mut().zip(need) {
                *held -= need;
            }
            self.input_charged = self.input_charged.saturating_add(input);
            self.output_charged = self.output_charged.saturating_add(max_tokens);
            self.in_flight += 1;
            self.max_in_flight = self.max_in_flight.max(self.in_flight);
            return Answer { status: 200, headers: self.headers(), body: String::new() };
        };
        self.refused += 1;
        let (what, size) = (["requests", "input tokens", "output tokens"][short], sizes[short]);
        // A cost larger than the bucket can ever hold waits a minute, then is refused again.
        let wait = if need[short] > size as f64 {
            Duration::from_secs(60)
        } else {
            secs((need[short] - held[short]) / (size as f64 / 60.0))
        };
        let message = format!(
            "This request would exceed the rate limit for your organization of {size} {what} per minute. For \
             details, refer to: https://docs.claude.com/en/api/rate-limits."
        );
        let body = format!(r#"{{"type":"error","error":{{"type":"rate_limit_error","message":"{message}"}}}}"#);
        let mut headers = self.headers();
        headers.push(("retry-after".to_string(), wait.as_secs_f64().ceil().max(1.0).to_string()));
        Answer { status: 429, headers, body }
    }

    /// A served call of `max_tokens` that produced `output` tokens has ended at `now`: the
    /// output it did not use goes back to its bucket (Anthropic's adjustment at the end).
    pub fn finished(&mut self, now: Instant, max_tokens: u64, output: u64) {
        self.level(now);
        let unused = max_tokens.saturating_sub(output);
        self.held[2] = (self.held[2] + unused as f64).min(self.limits.output_tokens_per_minute as f64);
        self.output_charged = self.output_charged.saturating_sub(unused);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.last = Some((now, self.held));
    }

    /// The longest silence so far: between an arrival and the one before it (or the end of a
    /// call since), the time during which the buckets, refilled since, already held the next
    /// call's cost and nothing was sent. A fleet that waits for a "reset" while the buckets
    /// refill has long ones.
    pub fn longest_silence(&self) -> Duration {
        self.longest_silence
    }

    /// Calls being served now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The most calls served at once so far.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Input tokens charged so far.
    pub fn input_charged(&self) -> u64 {
        self.input_charged
    }

    /// Output tokens charged so far: `max_tokens` while a call runs, its output once it ended.
    pub fn output_charged(&self) -> u64 {
        self.output_charged
    }

    /// Calls refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Anthropic's headers for the buckets as they are now.
    fn headers(&self) -> Vec<(String, String)> {
        let sizes = Self::sizes_of(&self.limits);
        let wall = SystemTime::now();
        let family = |i: usize| {
            let (size, held) = (sizes[i], self.held[i].max(0.0));
            let to_full = if size == 0 { Duration::ZERO } else { secs((size as f64 - held) / (size as f64 / 60.0)) };
            (size, held.floor() as u64, rfc3339_ceil(wall + to_full))
        };
        let share = |i: usize| self.held[i].max(0.0) / sizes[i].max(1) as f64;
        // `tokens-*`: the most restrictive token limit now.
        let tightest = if share(2) < share(1) { 2 } else { 1 };
        let mut headers = Vec::with_capacity(12);
        for (name, i) in [("requests", 0), ("input-tokens", 1), ("output-tokens", 2), ("tokens", tightest)] {
            let (limit, remaining, reset) = family(i);
            headers.push((format!("anthropic-ratelimit-{name}-limit"), limit.to_string()));
            headers.push((format!("anthropic-ratelimit-{name}-remaining"), remaining.to_string()));
            headers.push((format!("anthropic-ratelimit-{name}-reset"), reset));
        }
        headers
    }
}

/// `s` seconds rounded to the millisecond.
fn secs(s: f64) -> Duration {
    Duration::from_millis((s.max(0.0) * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider_limits::error_code;

    fn limits() -> AnthropicLimits {
        AnthropicLimits { requests_per_minute: 50, input_tokens_per_minute: 50_000, output_tokens_per_minute: 8_000 }
    }

    fn header<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
        answer.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn input_and_output_are_limited_apart_and_output_is_adjusted_at_the_end() {
        let (mut bucket, t0) = (AnthropicBucket::new(limits()), Instant::now());
        // 10,000 in / 2,000 out: within both limits, though 12,000 is more than the OTPM.
        let large = bucket.answer(t0, 10_000, 2_000);
        assert_eq!(large.status, 200);
        assert_eq!(header(&large, "anthropic-ratelimit-input-tokens-limit"), Some("50000"));
        assert_eq!(header(&large, "anthropic-ratelimit-input-tokens-remaining"), Some("40000"));
        assert_eq!(header(&large, "anthropic-ratelimit-output-tokens-remaining"), Some("6000"));
        // Output is the more used: 75 % left against 80 %.
        assert_eq!(header(&large, "anthropic-ratelimit-tokens-remaining"), Some("6000"));
        assert_eq!(header(&large, "anthropic-ratelimit-tokens-limit"), Some("8000"));
        let reset = header(&large, "anthropic-ratelimit-output-tokens-reset").expect("a reset");
        assert!(reset.len() == 20 && reset.ends_with('Z'), "{reset}");
        // Three more use all the output: 6,000 asked at admission.
        for _ in 0..3 {
            assert_eq!(bucket.answer(t0, 1_000, 2_000).status, 200);
        }
        let refused = bucket.answer(t0, 100, 100);
        assert_eq!(refused.status, 429);
        assert_eq!(error_code(&refused.body), Some("rate_limit_error"));
        assert!(refused.body.contains("8000 output tokens per minute"), "{}", refused.body);
        // 100 output tokens grow back in 0.75 s: retry after 1 s.
        assert_eq!(header(&refused, "retry-after"), Some("1"));
        assert!(!bucket.holds(t0, 100, 100) && bucket.holds(t0, 100, 0));
        // A call that used 500 of its 2,000 gives 1,500 back at its end.
        bucket.finished(t0, 2_000, 500);
        assert_eq!(bucket.answer(t0, 100, 1_500).status, 200);
        assert_eq!(bucket.output_charged(), 8_000 - 1_500 + 1_500);
        assert_eq!(bucket.input_charged(), 13_100);
        assert_eq!((bucket.in_flight(), bucket.max_in_flight(), bucket.refused()), (4, 4, 1));
    }

    #[test]
    fn buckets_refill_continuously_up_to_their_limit() {
        let (mut bucket, t0) = (AnthropicBucket::new(limits()), Instant::now());
        assert_eq!(bucket.answer(t0, 50_000, 0).status, 200);
        assert_eq!(bucket.answer(t0 + Duration::from_secs(6), 5_001, 0).status, 429, "5,000 grew back");
        assert_eq!(bucket.answer(t0 + Duration::from_secs(6), 4_999, 0).status, 200);
        assert_eq!(bucket.longest_silence(), Duration::ZERO, "sent the moment the bucket held it");
        // 5,000 more would have been there 6 s later; sent after 16 s: 10 s of silence.
        assert_eq!(bucket.answer(t0 + Duration::from_secs(22), 5_000, 0).status, 200);
        let silence = bucket.longest_silence().as_secs_f64();
        assert!((9.99..10.01).contains(&silence), "{silence}");
        assert_eq!(bucket.level(t0 + Duration::from_secs(600)), [50.0, 50_000.0, 8_000.0]);
        // More than a bucket holds is never admitted.
        assert_eq!(bucket.answer(t0 + Duration::from_secs(600), 60_000, 0).status, 429);
    }
}
