//! A provider with OpenAI's rate-limit semantics: a bucket per key refilled continuously.
//!
//! OpenAI's "Rate limits" guide describes requests and tokens limits per minute enforced as
//! buckets that refill continuously (not fixed windows): a key starts with a full bucket (a
//! minute's worth), each bucket grows back at `limit / 60 s` up to its limit, and a request is
//! admitted only if both buckets hold its cost at once: 1 request, and its prompt tokens plus
//! its `max_tokens` (the estimate is charged at admission and stays charged). Every answer
//! carries `x-ratelimit-limit-{requests,tokens}`, `x-ratelimit-remaining-{requests,tokens}` and
//! `x-ratelimit-reset-{requests,tokens}`: the time until that bucket is **full again**, in Go's
//! duration form (`6m0s`, `1.25s`, `120ms`). A refusal is a 429 with OpenAI's error body
//! (`"code":"rate_limit_exceeded"`, `"type"` `requests` or `tokens`, a message naming the
//! limit), `retry-after` (whole seconds, rounded up) and `retry-after-ms`; it costs nothing.
//!
//! Besides the buckets, [`OpenAiBucket`] has what the headers do not say: a hidden cap on the
//! calls served at once (over it: a 429 with no rate-limit headers and no `retry-after`), and a
//! seeded share of transient 500s (OpenAI's `server_error`): a 500 is decided after admission,
//! so its cost stays charged, and it carries the headers like any admitted answer.
//!
//! The bucket also keeps the **longest silence**: between two consecutive arrivals, the time
//! during which the buckets (as the headers of the earlier answer describe them, refilled
//! since) already held the next call's cost and nothing was sent; a fleet that follows the
//! headers exactly has none. A gap does not count while `busy_at` calls (the fleet's own
//! concurrency limit; by default the hidden cap) were being served: then no call could be sent.

use std::time::{Duration, Instant};

use crate::provider_limits::{Answer, go_duration};

/// What the provider enforces per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLimits {
    /// Requests per minute (the requests bucket's size; refilled at this per 60 s).
    pub requests_per_minute: u64,
    /// Tokens per minute (the tokens bucket's size; refilled at this per 60 s).
    pub tokens_per_minute: u64,
    /// Calls served at once beyond which a call is refused (hidden; `None`: no cap).
    pub concurrency: Option<usize>,
    /// Admitted calls answered with a transient 500, per thousand (seeded, reproducible).
    pub errors_per_mille: u32,
    /// The seed of the 500s.
    pub seed: u64,
    /// Calls in flight at which a gap between arrivals is not a silence: the fleet could send
    /// nothing (its own concurrency limit; `None`: the hidden cap, or never).
    pub busy_at: Option<usize>,
}

/// The buckets of one key, as OpenAI counts them.
#[derive(Debug, Clone)]
pub struct OpenAiBucket {
    limits: BucketLimits,
    /// What each bucket held at `at` (requests, tokens).
    requests: f64,
    tokens: f64,
    at: Option<Instant>,
    in_flight: usize,
    admitted: u64,
    /// The last arrival, and the buckets right after its decision.
    last: Option<(Instant, f64, f64)>,
    longest_silence: Duration,
    /// When the calls in flight last fell below `busy_at`, if they reached it since the last
    /// arrival.
    freed: Option<Instant>,
    charged: u64,
    max_in_flight: usize,
    /// Refusals by the hidden cap, and by the buckets.
    refused_cap: u64,
    refused_budget: u64,
}

impl OpenAiBucket {
    /// Full buckets (a minute's worth), nothing in flight.
    pub fn new(limits: BucketLimits) -> Self {
        Self {
            limits,
            requests: limits.requests_per_minute as f64,
            tokens: limits.tokens_per_minute as f64,
            at: None,
            in_flight: 0,
            admitted: 0,
            last: None,
            longest_silence: Duration::ZERO,
            freed: None,
            charged: 0,
            max_in_flight: 0,
            refused_cap: 0,
            refused_budget: 0,
        }
    }

    /// The limits it enforces.
    pub fn limits(&self) -> BucketLimits {
        self.limits
    }

    /// What the buckets hold at `now` (requests, tokens), refilled since the last call.
    pub fn level(&mut self, now: Instant) -> (f64, f64) {
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.requests = (self.requests + elapsed * self.rate(self.limits.requests_per_minute))
                .min(self.limits.requests_per_minute as f64);
            self.tokens = (self.tokens + elapsed * self.rate(self.limits.tokens_per_minute))
                .min(self.limits.tokens_per_minute as f64);
        }
        self.at = Some(self.at.map_or(now, |at| at.max(now)));
        (self.requests, self.tokens)
    }

    /// Per second.
    fn rate(&self, per_minute: u64) -> f64 {
        per_minute as f64 / 60.0
    }

    /// How long until a bucket holding `held` of `limit` holds `need` (zero if it does; `None`
    /// if it never can).
    fn wait_for(&self, held: f64, need: f64, limit: u64) -> Option<Duration> {
        if need > limit as f64 {
            return None;
        }
        let rate = self.rate(limit);
        if held >= need {
            return Some(Duration::ZERO);
        }
        if rate <= 0.0 {
            return None;
        }
        Some(secs((need - held) / rate))
    }

    /// Admits or refuses a call of `prompt` tokens asking for up to `max_tokens` at `now`.
    /// A 200 holds a place under the hidden cap until [`OpenAiBucket::finished`].
    pub fn answer(&mut self, now: Instant, prompt: u64, max_tokens: u64) -> Answer {
        let cost = prompt.saturating_add(max_tokens);
        let (requests, tokens) = self.level(now);
        if let Some((at, r, t)) = self.last {
            // When the buckets, as the last answer left them, held this call's cost.
            let refill = |held: f64, need: f64, limit: u64| self.wait_for(held, need, limit);
            let room = refill(r, 1.0, self.limits.requests_per_minute)
                .zip(refill(t, cost as f64, self.limits.tokens_per_minute))
                .map(|(a, b)| (at + a.max(b)).max(self.freed.unwrap_or(at)));
            let busy = self.busy_at().is_some_and(|busy| self.in_flight >= busy);
            if let (Some(room), false) = (room, busy) {
                self.longest_silence = self.longest_silence.max(now.saturating_duration_since(room));
            }
        }
        let answer = self.decide(requests, tokens, cost);
        let (r, t) = (self.requests, self.tokens);
        self.last = Some((now, r, t));
        self.freed = None;
        answer
    }

    fn decide(&mut self, requests: f64, tokens: f64, cost: u64) -> Answer {
        if self.limits.concurrency.is_some_and(|cap| self.in_flight >= cap) {
            let body = r#"{"error":{"message":"Too many concurrent requests for this model.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
            self.refused_cap += 1;
            return Answer { status: 429, headers: Vec::new(), body: body.to_string() };
        }
        let (rpm, tpm) = (self.limits.requests_per_minute, self.limits.tokens_per_minute);
        let wait_requests = self.wait_for(requests, 1.0, rpm);
        let wait_tokens = self.wait_for(tokens, cost as f64, tpm);
        let short_of_requests = wait_requests != Some(Duration::ZERO);
        let short_of_tokens = wait_tokens != Some(Duration::ZERO);
        if !short_of_requests && !short_of_tokens {
            self.requests -= 1.0;
            self.tokens -= cost as f64;
            self.charged = self.charged.saturating_add(cost);
            self.admitted += 1;
            let mut answer = Answer { status: 200, headers: self.headers(), body: String::new() };
            if self.is_transient_error() {
                answer.status = 500;
                answer.body = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#.to_string();
            } else {
                self.in_flight += 1;
                self.max_in_flight = self.max_in_flight.max(self.in_flight);
            }
            return answer;
        }
        self.refused_budget += 1;
        let (kind, short, limit, used, wait) = if short_of_tokens {
            ("tokens", "tokens per min (TPM)", tpm, tpm as f64 - tokens, wait_tokens)
        } else {
            ("requests", "requests per min (RPM)", rpm, rpm as f64 - requests, wait_requests)
        };
        // A cost larger than the bucket can ever hold: OpenAI says the request is too large.
        let wait = wait.unwrap_or(Duration::from_secs(60)).max(Duration::from_millis(1));
        let requested = if kind == "tokens" { cost } else { 1 };
        let message = format!(
            "Rate limit reached for gpt-4o in organization org-mock on {short}: Limit {limit}, Used {}, Requested \
             {requested}. Please try again in {}.",
            used.max(0.0).ceil() as u64,
            go_duration(wait)
        );
        let body = format!(
            r#"{{"error":{{"message":"{message}","type":"{kind}","param":null,"code":"rate_limit_exceeded"}}}}"#
        );
        let mut headers = self.headers();
        headers.push(("retry-after".to_string(), wait.as_secs_f64().ceil().max(1.0).to_string()));
        headers.push(("retry-after-ms".to_string(), wait.as_millis().max(1).to_string()));
        Answer { status: 429, headers, body }
    }

    /// A served call's answer has been written at `now`: its place under the cap is free again.
    pub fn finished(&mut self, now: Instant) {
        if self.busy_at().is_some_and(|busy| self.in_flight == busy) {
            self.freed = Some(now);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The calls in flight at which the fleet could send nothing.
    fn busy_at(&self) -> Option<usize> {
        self.limits.busy_at.or(self.limits.concurrency)
    }

    /// Calls being served now (200s not finished).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The most calls served at once so far (for streamed answers: streams open at once).
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Calls refused by the hidden cap so far.
    pub fn refused_by_cap(&self) -> u64 {
        self.refused_cap
    }

    /// Calls refused by the requests or tokens bucket so far (a fleet that overshoots them).
    pub fn refused_by_budget(&self) -> u64 {
        self.refused_budget
    }

    /// The longest silence so far (see the module docs).
    pub fn longest_silence(&self) -> Duration {
        self.longest_silence
    }

    /// Tokens charged so far (every admitted call's prompt + `max_tokens`, 500s included).
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// Whether the admitted call just counted is one of the seeded transient 500s.
    fn is_transient_error(&self) -> bool {
        // splitmix64 of (seed, call number): reproducible and well spread.
        let mut z = self.limits.seed.wrapping_add(self.admitted.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        z % 1000 < u64::from(self.limits.errors_per_mille)
    }

    /// OpenAI's six headers for the buckets as they are now.
    fn headers(&self) -> Vec<(String, String)> {
        let mut headers = Vec::with_capacity(6);
        for (family, limit, held) in [
            ("requests", self.limits.requests_per_minute, self.requests),
            ("tokens", self.limits.tokens_per_minute, self.tokens),
        ] {
            let to_full =
                if limit == 0 { Duration::ZERO } else { secs((limit as f64 - held).max(0.0) / self.rate(limit)) };
            headers.push((format!("x-ratelimit-limit-{family}"), limit.to_string()));
            headers.push((format!("x-ratelimit-remaining-{family}"), (held.max(0.0).floor() as u64).to_string()));
            headers.push((format!("x-ratelimit-reset-{family}"), go_duration(to_full)));
        }
        headers
    }
}

/// `s` seconds rounded to the millisecond (the headers' precision; no float dust in them).
fn secs(s: f64) -> Duration {
    Duration::from_millis((s * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider_limits::error_code;

    fn limits() -> BucketLimits {
        BucketLimits {
            requests_per_minute: 60,
            tokens_per_minute: 6_000,
            concurrency: Some(2),
            errors_per_mille: 0,
            seed: 1,
            busy_at: None,
        }
    }

    fn header<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
        answer.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_full_bucket_is_spent_at_once_and_refills_continuously() {
        let (mut bucket, t0) = (OpenAiBucket::new(limits()), Instant::now());
        // The whole minute's worth at once: 5,000 tokens of 6,000.
        let first = bucket.answer(t0, 4_000, 1_000);
        assert_eq!(first.status, 200);
        assert_eq!(header(&first, "x-ratelimit-limit-tokens"), Some("6000"));
        assert_eq!(header(&first, "x-ratelimit-remaining-tokens"), Some("1000"));
        // 5,000 missing at 100 a second: full again in 50 s; one request at 1 a second.
        assert_eq!(header(&first, "x-ratelimit-reset-tokens"), Some("50s"));
        assert_eq!(header(&first, "x-ratelimit-remaining-requests"), Some("59"));
        assert_eq!(header(&first, "x-ratelimit-reset-requests"), Some("1s"));
        bucket.finished(t0);
        // 1.5 s later 150 tokens have grown back: 1,150 held, 1,200 asked: refused, 0.5 s to wait.
        let refused = bucket.answer(t0 + Duration::from_millis(1_500), 1_000, 200);
        assert_eq!(refused.status, 429);
        assert_eq!(header(&refused, "retry-after-ms"), Some("500"));
        assert_eq!(bucket.refused_by_budget(), 1);
        assert_eq!(header(&refused, "retry-after"), Some("1"));
        assert_eq!(header(&refused, "x-ratelimit-remaining-tokens"), Some("1150"));
        assert_eq!(header(&refused, "x-ratelimit-reset-tokens"), Some("48.5s"));
        assert_eq!(error_code(&refused.body), Some("rate_limit_exceeded"));
        assert!(refused.body.contains(r#""type":"tokens""#) && refused.body.contains("Requested 1200"));
        // It cost nothing: at 2 s exactly 1,200 are there.
        let admitted = bucket.answer(t0 + Duration::from_secs(2), 1_000, 200);
        assert_eq!(admitted.status, 200);
        assert_eq!(header(&admitted, "x-ratelimit-remaining-tokens"), Some("0"));
        assert_eq!(header(&admitted, "x-ratelimit-reset-tokens"), Some("1m0s"));
        assert_eq!(bucket.charged(), 6_200);
        // Never above the limit: after ten minutes the bucket is full, not ten minutes' worth.
        assert_eq!(bucket.level(t0 + Duration::from_secs(600)), (60.0, 6_000.0));
    }

    #[test]
    fn requests_run_out_too_and_say_so() {
        let limits = BucketLimits { requests_per_minute: 2, concurrency: None, ..limits() };
        let (mut bucket, t0) = (OpenAiBucket::new(limits), Instant::now());
        assert_eq!(bucket.answer(t0, 10, 0).status, 200);
        assert_eq!(bucket.answer(t0, 10, 0).status, 200);
        let refused = bucket.answer(t0 + Duration::from_secs(1), 10, 0);
        assert_eq!(refused.status, 429);
        assert!(refused.body.contains(r#""type":"requests""#), "{}", refused.body);
        // One request grows back in 30 s; 1 s of it has passed.
        assert_eq!(header(&refused, "retry-after-ms"), Some("29000"));
        assert_eq!(header(&refused, "x-ratelimit-reset-requests"), Some("59s"));
        assert_eq!(bucket.answer(t0 + Duration::from_secs(30), 10, 0).status, 200);
    }

    #[test]
    fn the_hidden_cap_refuses_without_headers() {
        let (mut bucket, t0) = (OpenAiBucket::new(limits()), Instant::now());
        assert_eq!(bucket.answer(t0, 10, 10).status, 200);
        assert_eq!(bucket.answer(t0, 10, 10).status, 200);
        let over = bucket.answer(t0, 10, 10);
        assert_eq!((over.status, over.headers.len()), (429, 0));
        assert_eq!((bucket.in_flight(), bucket.max_in_flight()), (2, 2));
        assert_eq!((bucket.refused_by_cap(), bucket.refused_by_budget()), (1, 0));
        bucket.finished(t0);
        assert_eq!(bucket.answer(t0, 10, 10).status, 200);
        assert_eq!(bucket.charged(), 60, "the refusal cost nothing");
    }

    #[test]
    fn transient_errors_are_seeded_charged_and_about_their_share() {
        let limits = BucketLimits {
            requests_per_minute: 1_000_000,
            tokens_per_minute: 1_000_000_000,
            concurrency: None,
            errors_per_mille: 5,
            seed: 7,
            busy_at: None,
        };
        let run = || {
            let (mut bucket, t0) = (OpenAiBucket::new(limits), Instant::now());
            let statuses: Vec<u16> = (0..20_000).map(|_| bucket.answer(t0, 1, 1).status).collect();
            (statuses, bucket.charged())
        };
        let (statuses, charged) = run();
        let errors = statuses.iter().filter(|s| **s == 500).count();
        assert!((60..=140).contains(&errors), "{errors} 500s in 20,000 (0.5 % is 100)");
        assert_eq!(charged, 40_000, "a 500 stays charged");
        assert_eq!(run().0, statuses, "the same seed, the same 500s");
    }

    #[test]
    fn the_longest_silence_counts_only_time_with_room() {
        let (mut bucket, t0) = (OpenAiBucket::new(limits()), Instant::now());
        // Spend everything but 1,000 tokens, then wait 20 s before a call of 1,000: room was
        // there all along, 20 s of silence.
        bucket.answer(t0, 5_000, 0);
        bucket.finished(t0);
        bucket.answer(t0 + Duration::from_secs(20), 1_000, 0);
        bucket.finished(t0);
        assert_eq!(bucket.longest_silence(), Duration::from_secs(20));
        // Now 2,000 held; a call of 4,000 needs 20 s of refill: sent after 25 s, 5 s of silence
        // (less than the 20 s kept).
        bucket.answer(t0 + Duration::from_secs(45), 4_000, 0);
        assert_eq!(bucket.longest_silence(), Duration::from_secs(20));
        let (mut tight, t0) = (OpenAiBucket::new(limits()), Instant::now());
        tight.answer(t0, 6_000, 0);
        tight.finished(t0);
        tight.answer(t0 + Duration::from_secs(10), 1_000, 0);
        assert_eq!(tight.longest_silence(), Duration::ZERO, "sent the moment the bucket held it");
        // Two at once is the fleet's limit: a gap while both are served is no silence; from the
        // moment one ends it is.
        let limits = BucketLimits { concurrency: Some(5), busy_at: Some(2), ..limits() };
        let (mut busy, t0) = (OpenAiBucket::new(limits), Instant::now());
        busy.answer(t0, 10, 0);
        busy.answer(t0, 10, 0);
        busy.finished(t0 + Duration::from_secs(3));
        busy.answer(t0 + Duration::from_secs(4), 10, 0);
        assert_eq!(busy.longest_silence(), Duration::from_secs(1));
    }
}
