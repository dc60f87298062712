//! The permit guard: capacity that goes back on drop, and an explicit outcome report.

use std::sync::Arc;
use std::time::Duration;

use wavegate_core::{CallResult, Outcome, WaveSignal, WaveState};

use crate::engine::clock::Instant;
use crate::engine::grant::Grant;
use crate::quota::QuotaBlock;

/// A permit to make one call to an upstream.
///
/// Report how the call went with [`report`](Permit::report) (or [`succeeded`](Permit::succeeded));
/// that releases the permit, feeds the shared wave (a 429 cuts the limit for the whole fleet)
/// and the upstream's circuit breaker. A permit dropped without a report is released as a
/// neutral outcome: capacity is never lost, but nothing is learned either — except once
/// [`request_sent`](Permit::request_sent) said the request is at the provider: then a permit
/// dropped without a report (its caller was cancelled mid-call) stays held until the provider
/// has plausibly finished (the upstream's `cancelled_call_hold`, by default its call timeout),
/// because the provider goes on serving the request.
#[must_use = "a permit holds capacity until it is reported or dropped"]
#[derive(Debug)]
pub struct Permit {
    grant: Grant,
    name: Arc<str>,
    granted_at: Instant,
    quota: QuotaRef,
}

/// An upstream's spent-quota refusal, and how long a spent quota sets it for.
#[derive(Debug, Clone)]
pub(crate) struct QuotaRef {
    pub(crate) block: Arc<QuotaBlock>,
    pub(crate) pause: Duration,
    /// The longest a `Retry-After` alone may pause the fleet: the upstream's `max_cooldown`.
    pub(crate) retry_after_cap: Duration,
    /// The provider keeps a served request's whole estimate charged (`keeps_estimate`).
    pub(crate) keeps_estimate: bool,
    /// What a cached input read weighs (`cache_read_weight`; unset: as reported).
    pub(crate) cache_read_weight: Option<f64>,
}

impl Permit {
    pub(crate) fn new(grant: Grant, name: Arc<str>, quota: QuotaRef) -> Self {
        Self { grant, name, granted_at: Instant::now(), quota }
    }

    /// The upstream the permit is for (a pool's member, for a pooled `acquire`).
    pub fn upstream(&self) -> &str {
        &self.name
    }

    /// The wave the permit was issued in (its 429 is reported against this wave).
    pub fn wave(&self) -> u64 {
        self.grant.info().wave
    }

    /// The wave state when the permit was granted.
    pub fn state(&self) -> WaveState {
        self.grant.info().state
    }

    /// The limit when the permit was granted.
    pub fn limit(&self) -> u32 {
        self.grant.info().limit
    }

    /// The permit's id (unique across the fleet).
    pub fn id(&self) -> &str {
        self.grant.info().id.as_str()
    }

    /// How long the caller waited for this permit in all: [`queue_wait`](Self::queue_wait)
    /// plus [`permit_wait`](Self::permit_wait).
    pub fn waited(&self) -> Duration {
        self.queue_wait() + self.permit_wait()
    }

    /// How long the caller waited behind other callers of this process.
    pub fn queue_wait(&self) -> Duration {
        self.grant.info().queue_wait
    }

    /// How long the caller waited at the head of the queue for the limit or a cooldown.
    pub fn permit_wait(&self) -> Duration {
        self.grant.info().permit_wait
    }

    /// In shadow: whether a retry after this attempt goes without a ghost of its own
    /// (`Grant::shadow_covers_retry`).
    pub(crate) fn shadow_covers_retry(&self) -> Option<crate::shadow::RetryCovered> {
        self.grant.shadow_covers_retry()
    }

    /// Whether it is a pass of shadow mode: granted at once, holding nothing, while its ghost
    /// waits for the permit the call would have held; its report reaches the policy when that
    /// permit would have been released (see [`UpstreamStatus::shadow`](crate::UpstreamStatus::shadow)).
    pub fn is_shadow(&self) -> bool {
        self.grant.is_shadow()
    }

    /// Tokens reserved for this permit at acquire.
    pub fn reserved_tokens(&self) -> u64 {
        self.grant.info().tokens
    }

    /// Of the [reserved tokens](Self::reserved_tokens), those reserved for the answer's output
    /// ([`RequestBuilder::output_tokens`](crate::RequestBuilder::output_tokens)).
    pub fn reserved_output_tokens(&self) -> u64 {
        self.grant.info().output
    }

    /// Says that the request is on its way to the provider: from now on, a permit dropped
    /// without a report stays held until the provider has plausibly finished with it (the
    /// upstream's `cancelled_call_hold`), since a cancelled caller does not stop the provider's
    /// work. `call`, the tower layer and the reqwest middleware say it themselves.
    pub fn request_sent(&mut self) {
        self.grant.mark_in_service();
    }

    /// Reports the call's outcome and releases the permit. The token reservation is kept as
    /// the usage, except for a 429 or another 4xx, which the provider did not process: those
    /// give it back. Use [`report_usage`](Self::report_usage) when the usage is known.
    ///
    /// What the provider said comes along: "R left until T" holds the fleet's grants until T
    /// once nothing is left, a spent quota refuses the upstream in this process (see
    /// [`ErrorKind::QuotaExhausted`](crate::ErrorKind::QuotaExhausted)), unreadable signals are counted.
    pub fn report(self, outcome: Outcome) {
        let unprocessed = matches!(outcome, Outcome::RateLimited { .. } | Outcome::ClientError { .. });
        let actual = if unprocessed { 0 } else { self.reserved_tokens() };
        self.report_usage(outcome, actual);
    }

    /// Sends the outcome to the engine: a 429 settles as refused (the provider counted none of
    /// it, whatever usage was reported: the budgets take the whole reservation back, and the
    /// provider's windows too — with the answer's report when it has one, before it is taken
    /// in, else at the settlement), anything else as `used`.
    fn finish_with(self, outcome: Outcome, used: crate::engine::grant::TokensUsed) {
        use crate::engine::grant::TokensUsed;
        use wavegate_core::WindowsBack;
        crate::provider_signals::observe(&self.name, &outcome, &self.quota.block, self.quota.pause);
        crate::metrics::upstream_call(&self.name, outcome.label(), self.granted_at.elapsed());
        let window = self.window_report(&outcome);
        let used = match (&outcome, &window) {
            (Outcome::RateLimited { .. }, None) => TokensUsed::Refused(WindowsBack::Reservation),
            (Outcome::RateLimited { .. }, Some(_)) => TokensUsed::Refused(WindowsBack::Nothing),
            _ => used,
        };
        self.grant.finish(outcome.wave_signal(), outcome.breaker_result(), used, window);
    }

    /// Reports the call's outcome and the tokens it really used, and releases the permit:
    /// the difference with the reservation is refunded or charged to the tokens budget.
    /// An upstream that [keeps the estimate](crate::config::UpstreamConfigBuilder::keeps_estimate)
    /// charged refunds nothing below the reservation of a request it served.
    pub fn report_usage(self, outcome: Outcome, tokens: u64) {
        let unprocessed = matches!(outcome, Outcome::RateLimited { .. } | Outcome::ClientError { .. });
        let tokens =
            if self.quota.keeps_estimate && !unprocessed { tokens.max(self.reserved_tokens()) } else { tokens };
        self.finish_with(outcome, tokens.into());
    }

    /// [`report_usage`](Self::report_usage) with the usage in its two parts, as LLM providers
    /// report it (`input_tokens` and `output_tokens`): the tokens budget is settled with their
    /// sum, the [input](crate::config::UpstreamConfigBuilder::input_tokens_per_minute) and
    /// [output](crate::config::UpstreamConfigBuilder::output_tokens_per_minute) budgets each
    /// with its own part. An upstream that keeps the estimate charged refunds neither part
    /// below its reservation for a request it served.
    pub fn report_usage_parts(self, outcome: Outcome, input: u64, output: u64) {
        let unprocessed = matches!(outcome, Outcome::RateLimited { .. } | Outcome::ClientError { .. });
        let (input, output) = if self.quota.keeps_estimate && !unprocessed {
            let reserved_output = self.reserved_output_tokens().min(self.reserved_tokens());
            (input.max(self.reserved_tokens() - reserved_output), output.max(reserved_output))
        } else {
            (input, output)
        };
        self.finish_with(outcome, crate::engine::grant::TokensUsed::Parts(input, output));
    }

    /// [`report_usage_parts`](Self::report_usage_parts) with the usage an answer reported,
    /// its cached input reads weighed as the upstream's
    /// [`cache_read_weight`](crate::config::UpstreamConfigBuilder::cache_read_weight) says
    /// ([`StreamUsage::input_counted`](crate::StreamUsage::input_counted)). For a whole
    /// answer's JSON body, [`StreamUsage::of_body`](crate::StreamUsage::of_body) reads it.
    #[cfg(feature = "sse")]
    pub fn report_stream_usage(self, outcome: Outcome, usage: wavegate_core::StreamUsage) {
        let input = usage.input_counted(self.quota.cache_read_weight);
        self.report_usage_parts(outcome, input, usage.output);
    }

    /// What `outcome` says is left of the provider's windows, for this permit's reservation.
    fn window_report(&self, outcome: &Outcome) -> Option<wavegate_core::WindowReport> {
        outcome.window_report_for(self.quota.retry_after_cap, self.reserved_tokens(), self.reserved_output_tokens())
    }

    /// What a cached input read weighs for this permit's upstream, if set.
    pub(crate) fn cache_read_weight(&self) -> Option<f64> {
        self.quota.cache_read_weight
    }

    /// Releases the permit at once, with no outcome and the reservation standing as the usage:
    /// a streamed answer its caller dropped before its end. Unlike a drop after
    /// [`request_sent`](Self::request_sent), nothing stays held: the answer was streaming, so
    /// dropping it closed the connection, which is how a client stops a generation.
    pub(crate) fn release_unfinished(self) {
        let reserved = self.reserved_tokens();
        self.grant.finish(WaveSignal::Neutral, CallResult::Ignored, reserved, None);
    }

    /// Reports a success (using the reserved tokens) and releases the permit.
    pub fn succeeded(self) {
        crate::metrics::upstream_call(&self.name, "success", self.granted_at.elapsed());
        let reserved = self.reserved_tokens();
        self.grant.finish(WaveSignal::Success, CallResult::Success, reserved, None);
    }
}
