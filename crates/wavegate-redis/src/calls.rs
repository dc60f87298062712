//! What each script is sent and how its reply is read, as pure functions.
//!
//! Every script call of [`SharedGate`](crate::SharedGate) and [`Store`](crate::Store) is built
//! here — its `KEYS` and `ARGV` in the order the script's opening contract lists them — and
//! every reply is read here, field by field with typed errors. Nothing here talks to Redis,
//! so the argument counts the Rust side sends can be checked against the counts each script
//! checks (`tests` below, on a real server), and the twins' agreement tests can drive a
//! script with exactly what the gate would send.

use std::borrow::Cow;
use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};
use wavegate_core::{
    Admission, BudgetStatus, DayLeft, DenyReason, Instance, LearnedLimit, LearnedLimitStatus, LearnedStatus,
    OutageUsage, PermitId, RateLimitEffect, ServedSpan, TokenDelta, Transition, WaveSignal, WaveState, WindowReport,
    duration_ms,
};

use crate::error::StoreError;
use crate::keys::UpstreamKeys;

/// How many config arguments every script but renew, report_window and heartbeat takes
/// (`CONFIG_ARGS` in `lua/wave.lua`).
pub(crate) const CONFIG_ARGS: usize = 18;

/// One script call: its keys and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call<'a> {
    pub(crate) keys: Vec<&'a str>,
    /// The arguments; the configuration's are borrowed, not copied.
    pub(crate) args: Vec<Cow<'a, str>>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(keys: &[&'a str]) -> Self {
        Self { keys: keys.to_vec(), args: Vec::new() }
    }

    /// The call with the configuration arguments first.
    fn with_config(keys: &[&'a str], config: &'a [String]) -> Self {
        let mut call = Self::new(keys);
        call.args.extend(config.iter().map(|arg| Cow::Borrowed(arg.as_str())));
        call
    }

    pub(crate) fn arg(mut self, arg: impl ToString) -> Self {
        self.args.push(Cow::Owned(arg.to_string()));
        self
    }

    /// The call as an invocation of `script`.
    pub(crate) fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        invocation.key(&self.keys[..]);
        for arg in &self.args {
            invocation.arg(arg.as_ref());
        }
        invocation
    }
}

/// One head of an acquire, as sent: its class (`''` without classes), id, tokens and callers
/// waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head<'a> {
    pub(crate) class: &'a str,
    pub(crate) id: &'a str,
    pub(crate) tokens: u64,
    /// Of `tokens`, the answer's output (the output budget; the rest is the input's).
    pub(crate) output: u64,
    pub(crate) waiting: u32,
}

impl Head<'_> {
    /// The cost as the script reads it: `<tokens>`, or `<tokens>:<output>` with an output part.
    fn cost(&self) -> String {
        if self.output == 0 { self.tokens.to_string() } else { format!("{}:{}", self.tokens, self.output) }
    }
}

/// `acquire.lua`: the config, then the first head's id, the lease, its tokens, the instance
/// and the generation of the state last seen (`''` for none); with classes, its class and
/// callers waiting, then (class, id, tokens, waiting) for each other head. Without classes
/// only the first head is sent.
pub(crate) fn acquire<'a>(
    keys: &'a UpstreamKeys,
    config: &'a [String],
    (instance, generation): (&str, &str),
    lease: Duration,
    heads: &[Head<'_>],
    classes: bool,
) -> Call<'a> {
    let mut call = Call::with_config(&keys.waiting_script_keys(), config);
    let Some((first, rest)) = heads.split_first() else { return call };
    call = call.arg(first.id).arg(duration_ms(lease)).arg(first.cost()).arg(instance).arg(generation);
    if classes {
        call = call.arg(first.class).arg(first.waiting);
        for head in rest {
            call = call.arg(head.class).arg(head.id).arg(head.cost()).arg(head.waiting);
        }
    }
    call
}

/// What an acquire answered: which head, how, the permits held after it, the generation of the
/// state and, with a day budget, what is left of the day.
pub(crate) type AcquireReply = (usize, Admission, u32, String, Option<DayLeft>);

/// Reads an acquire's reply: which of the `heads` sent it answers (the script names it; an id
/// that was not sent is an unexpected reply), the answer, the permits held after it and the
/// generation of the state (see `generation` in `lua/wave.lua`).
pub(crate) fn read_acquire(reply: &[Value], heads: &[Head<'_>]) -> Result<AcquireReply, StoreError> {
    const COMMAND: &str = "acquire";
    let r = Reply::new(COMMAND, reply);
    let (admission, in_flight, id, generation, day) = match r.int(0)? {
        1 => {
            r.expect_len_or_one_more(7)?;
            let granted = Admission::Granted { wave: r.uint(1)?, state: r.state(2)?, limit: r.u32(3)? };
            (granted, r.u32(4)?, r.string(5)?, r.string(6)?, r.day_left(7)?)
        }
        0 => {
            r.expect_len_or_one_more(6)?;
            let name = r.string(1)?;
            let reason = DenyReason::parse(&name)
                .ok_or_else(|| StoreError::unexpected(COMMAND, format!("unknown denial reason {name:?}")))?;
            let denied = Admission::Denied { reason, retry_after_ms: r.uint(2)? };
            (denied, r.u32(3)?, r.string(4)?, r.string(5)?, r.day_left(6)?)
        }
        other => return Err(StoreError::unexpected(COMMAND, format!("first field is {other}, not 0 or 1"))),
    };
    let index = heads
        .iter()
        .position(|head| head.id == id)
        .ok_or_else(|| StoreError::unexpected(COMMAND, format!("the reply names {id:?}, which was not asked for")))?;
    Ok((index, admission, in_flight, generation, day))
}

/// `finish.lua`: the config, the id, its wave, the outcome, its `Retry-After`, the head of the
/// wake-up channels, the token delta and the generation of the state last seen (`''` for none).
/// Which releases hand their freed permit on (`finish.lua`'s `hand_off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOff {
    /// Whether or not the woken process hears its wake-up: the Rust twin's rule.
    Always,
    /// Only when the wake-up reached a subscriber (one server, or behind Sentinel: `PUBLISH`
    /// counts them).
    WhenHeard,
    /// Never (a Cluster: `PUBLISH` counts only the subscribers of its own node).
    Never,
}

impl HandOff {
    /// The script's argument.
    pub(crate) fn as_arg(self) -> &'static str {
        match self {
            HandOff::Always => "all",
            HandOff::WhenHeard => "heard",
            HandOff::Never => "none",
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn finish<'a>(
    keys: &'a UpstreamKeys,
    config: &'a [String],
    (id, generation): (&str, &str),
    hand_off: HandOff,
    wave: u64,
    signal: WaveSignal,
    token_delta: TokenDelta,
    report: Option<(WindowReport, u64)>,
) -> Call<'a> {
    let served;
    let (outcome, retry_after) = match signal {
        WaveSignal::Success => ("success", String::new()),
        WaveSignal::ServedSuccess { at_most, span } => {
            served = match span {
                Some(span) => format!("served:{at_most}:{}", span_arg(span)),
                None => format!("served:{at_most}"),
            };
            (served.as_str(), String::new())
        }
        WaveSignal::RateLimited { retry_after } => {
            ("rate_limited", retry_after.map(|d| duration_ms(d).to_string()).unwrap_or_default())
        }
        WaveSignal::Went { span, served: was } => {
            let kind = if was { 's' } else { 'r' };
            served = format!("went:{kind}:{}", span_arg(span));
            (served.as_str(), String::new())
        }
        WaveSignal::RateLimitedAmong { retry_after, span } => {
            served = format!("rate_limited_among:{}", span_arg(span));
            (served.as_str(), retry_after.map(|d| duration_ms(d).to_string()).unwrap_or_default())
        }
        WaveSignal::Neutral => ("neutral", String::new()),
    };
    let call = Call::with_config(&keys.finish_script_keys(), config)
        .arg(id)
        .arg(wave)
        .arg(outcome)
        .arg(retry_after)
        .arg(&keys.wakes)
        .arg(token_delta.to_arg())
        .arg(generation)
        .arg(hand_off.as_arg());
    match report {
        Some((report, tokens_each)) => with_report(call, id, report, tokens_each, false),
        None => call,
    }
}

/// A call's span as `finish.lua`'s outcomes take it: `<went>:<ended>` in Unix ms (the
/// store's clock: [`store_now_ms`](crate::store_now_ms)).
fn span_arg(span: ServedSpan) -> String {
    format!("{}:{}", span.went_ms, span.ended_ms)
}

/// What finishing a permit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Whether the permit was still held.
    pub held: bool,
    /// The effect of a 429, if the outcome was one.
    pub rate_limit: Option<RateLimitEffect>,
    /// A state change caused by a success, if any.
    pub transition: Option<Transition>,
    /// The state after the call.
    pub status: SharedStatus,
    /// The process the release woke (on its own wake-up channel): the one the
    /// fleet-wide choice of class reaches, or without classes the one that waited longest;
    /// `None` when nobody waits, the id was not held, or the instance id is not one
    /// [`Instance::new`] accepts.
    pub wake: Option<Instance>,
    /// The permit the release granted to the process it woke, in the wave of
    /// [`status`](Self::status) (the hand-off, `finish.lua`'s `hand_off`); `None` when it
    /// granted none.
    pub handed: Option<PermitId>,
}

/// Reads a finish's reply, for a permit reported against `wave`.
pub(crate) fn read_finish(reply: &[Value], wave: u64) -> Result<Finished, StoreError> {
    const COMMAND: &str = "finish";
    let r = Reply::new(COMMAND, reply);
    r.expect_len(11)?;
    let status = SharedStatus {
        limit: r.u32(3)?,
        wave: r.uint(4)?,
        state: r.state(5)?,
        cooldown_remaining: Duration::from_millis(r.uint(6)?),
        in_flight: r.u32(8)?,
        budgets: BudgetStatus::default(),
        learned: LearnedStatus::default(),
    };
    let rate_limit = match r.string(1)?.as_str() {
        "cut" => Some(RateLimitEffect::Cut {
            from: r.u32(2)?,
            to: status.limit,
            wave: status.wave,
            cooldown: status.cooldown_remaining,
        }),
        "late" => Some(RateLimitEffect::Late { reported: wave, current: status.wave }),
        "none" => None,
        other => return Err(StoreError::unexpected(COMMAND, format!("unknown effect {other:?}"))),
    };
    let changed_from = r.string(7)?;
    let transition = if changed_from.is_empty() {
        None
    } else {
        let from = WaveState::parse(&changed_from)
            .ok_or_else(|| StoreError::unexpected(COMMAND, format!("unknown state {changed_from:?}")))?;
        Some(Transition { from, to: status.state, limit: status.limit })
    };
    // The wake is a courtesy (the waiter polls too): an instance name this crate would not
    // make is not an error of the release.
    let wake = Some(r.string(9)?).filter(|name| !name.is_empty()).and_then(|name| Instance::new(name).ok());
    // The woken process hears of the grant on its channel; this is what the releaser learns.
    // An id that does not read back (a hand edit) is not an error of the release: its lease ends it.
    let handed = Some(r.string(10)?).filter(|id| !id.is_empty()).and_then(|id| PermitId::parse(&id).ok());
    Ok(Finished { held: r.int(0)? == 1, rate_limit, transition, status, wake, handed })
}

/// `renew.lua`: the lease, the generation of the state last seen (`''` for none), then the ids.
pub(crate) fn renew<'a>(
    keys: &'a UpstreamKeys,
    (lease, generation): (Duration, &str),
    ids: impl IntoIterator<Item = &'a str>,
) -> Call<'a> {
    let mut call = Call::new(&keys.script_keys()).arg(duration_ms(lease)).arg(generation);
    call.args.extend(ids.into_iter().map(Cow::Borrowed));
    call
}

/// `status.lua`: the config.
pub(crate) fn status<'a>(keys: &'a UpstreamKeys, config: &'a [String]) -> Call<'a> {
    Call::with_config(&keys.waiting_script_keys(), config)
}

/// The shared state of one upstream, as read with Redis time applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedStatus {
    /// The state.
    pub state: WaveState,
    /// The current limit.
    pub limit: u32,
    /// The current wave id.
    pub wave: u64,
    /// The rest of the cooldown (zero outside COOLDOWN).
    pub cooldown_remaining: Duration,
    /// Permits held across the fleet.
    pub in_flight: u32,
    /// What is left of the rate budgets in force (filled by
    /// [`SharedGate::status`](crate::SharedGate::status); empty otherwise).
    pub budgets: BudgetStatus,
    /// The limits the provider announced, as the fleet keeps them (filled by
    /// [`SharedGate::status`](crate::SharedGate::status); empty otherwise).
    pub learned: LearnedStatus,
}

/// Reads a status reply: the status, and per priority class (in flight, callers waiting).
pub(crate) fn read_status(reply: &[Value]) -> Result<(SharedStatus, Vec<(u32, u32)>), StoreError> {
    const COMMAND: &str = "status";
    let r = Reply::new(COMMAND, reply);
    // The fields before the classes': the wave (8), the budgets (4), the learned limits (4 × 3),
    // the input and output budgets (4), the day budgets (4).
    const BEFORE_CLASSES: usize = 32;
    if reply.len() < BEFORE_CLASSES || !reply.len().is_multiple_of(2) {
        let got = reply.len();
        return Err(StoreError::unexpected(COMMAND, format!("{got} fields, expected {BEFORE_CLASSES} and pairs")));
    }
    let learned = |at: usize| -> Result<Option<LearnedLimitStatus>, StoreError> {
        if r.int(at)? < 0 {
            return Ok(None);
        }
        let limit = LearnedLimit { limit: r.uint(at)?, window_ms: r.uint(at + 1)? };
        Ok(Some(LearnedLimitStatus::new(limit, Duration::from_millis(r.uint(at + 2)?))))
    };
    let classes = (BEFORE_CLASSES..reply.len())
        .step_by(2)
        .map(|at| Ok((r.u32(at)?, r.u32(at + 1)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let budget = |at: usize| -> Result<Option<(u64, u64)>, StoreError> {
        if r.int(at)? < 0 { Ok(None) } else { Ok(Some((r.uint(at)?, r.uint(at + 1)?))) }
    };
    let status = SharedStatus {
        state: r.state(0)?,
        limit: r.u32(1)?,
        wave: r.uint(2)?,
        cooldown_remaining: Duration::from_millis(r.uint(3)?),
        in_flight: r.u32(7)?,
        budgets: BudgetStatus::new(budget(8)?, budget(10)?)
            .with_split(budget(24)?, budget(26)?)
            .with_day(budget(28)?, budget(30)?),
        learned: LearnedStatus::new(learned(12)?, learned(15)?).with_parts(learned(18)?, learned(21)?),
    };
    Ok((status, classes))
}

/// `reconcile.lua`: the config, the lease, the usage, the state carried back (`STATE:limit`,
/// or `''`), the day carried back, the usage's id (16 hex digits, `''` for none), how many to
/// adopt, the ids to adopt, the ids to drop.
pub(crate) fn reconcile<'a>(
    keys: &'a UpstreamKeys,
    config: &'a [String],
    (adopt, drop): (&'a [String], &'a [String]),
    lease: Duration,
    usage: OutageUsage,
    (carried, generation): (Option<(WaveState, u32)>, &str),
) -> Call<'a> {
    let carried = carried.map(|(state, limit)| format!("{}:{limit}", state.as_str())).unwrap_or_default();
    let mut call = Call::with_config(&keys.script_keys(), config)
        .arg(duration_ms(lease))
        .arg(usage.requests)
        .arg(usage.tokens)
        .arg(duration_ms(usage.began_ago))
        .arg(carried)
        .arg(usage.day_left.map(|left| day_left_arg(left, generation)).unwrap_or_default())
        .arg(if usage.id == 0 { String::new() } else { format!("{:016x}", usage.id) })
        .arg(adopt.len());
    call.args.extend(adopt.iter().chain(drop).map(|id| Cow::Borrowed(id.as_str())));
    call
}

/// What is left of the day budgets as `reconcile.lua` takes it, with the generation it was
/// heard in: `'<requests>:<tokens>:<generation>'`, each count empty when unknown.
fn day_left_arg(left: DayLeft, generation: &str) -> String {
    let part = |left: Option<u64>| left.map(|n| n.to_string()).unwrap_or_default();
    format!("{}:{}:{generation}", part(left.requests), part(left.tokens))
}

/// `report_window.lua`: the report's arguments ([`with_report`]).
pub(crate) fn report_window<'a>(
    keys: &'a UpstreamKeys,
    id: &str,
    report: WindowReport,
    tokens_each: u64,
    clear: bool,
) -> Call<'a> {
    with_report(Call::new(&keys.script_keys()), id, report, tokens_each, clear)
}

/// `call` followed by the arguments of a provider's report (`window_report.lua`, which both
/// `report_window.lua` and `finish.lua` take): each window's remaining and reset, the tokens each, the reporting id,
/// each announced limit and its window (`''` for what the report does not say), whether the
/// windows kept are cleared first (an operator's clear, with an empty report), the limit
/// each window refills to when it is a continuously refilled bucket (`'0'`: a fixed window),
/// the input and output tokens limits announced with their windows (Anthropic's), the input
/// and output windows (each remaining, reset and the limit it refills to), then the refused
/// call's reservation (`'<tokens>:<output>'`, `''` when the answer served its call).
fn with_report<'a>(call: Call<'a>, id: &str, report: WindowReport, tokens_each: u64, clear: bool) -> Call<'a> {
    let side = |left: Option<wavegate_core::WindowLeft>| {
        // Clamped here as in the script: no number reaches the store that it cannot return.
        left.map_or((String::new(), String::new()), |l| {
            let remaining = l.remaining.min(wavegate_core::MAX_WINDOW_LEFT);
            (remaining.to_string(), l.reset_ms.min(wavegate_core::MAX_WINDOW_MS).to_string())
        })
    };
    let limit = |learned: Option<LearnedLimit>| {
        learned.map_or((String::new(), String::new()), |l| (l.limit.to_string(), l.window_ms.to_string()))
    };
    let (requests, requests_reset) = side(report.requests);
    let (tokens, tokens_reset) = side(report.tokens);
    let (requests_limit, requests_window) = limit(report.limits.requests);
    let (tokens_limit, tokens_window) = limit(report.limits.tokens);
    let (input_limit, input_window) = limit(report.limits.input);
    let (output_limit, output_window) = limit(report.limits.output);
    let refills_to = |left: Option<wavegate_core::WindowLeft>| {
        left.and_then(|l| l.refills_to).map_or(0, |to| to.min(wavegate_core::MAX_WINDOW_LEFT))
    };
    call.arg(requests)
        .arg(requests_reset)
        .arg(tokens)
        .arg(tokens_reset)
        .arg(tokens_each)
        .arg(id)
        .arg(requests_limit)
        .arg(requests_window)
        .arg(tokens_limit)
        .arg(tokens_window)
        .arg(if clear { "1" } else { "0" })
        .arg(refills_to(report.requests))
        .arg(refills_to(report.tokens))
        .arg(input_limit)
        .arg(input_window)
        .arg(output_limit)
        .arg(output_window)
        .arg(side(report.input).0)
        .arg(side(report.input).1)
        .arg(refills_to(report.input))
        .arg(side(report.output).0)
        .arg(side(report.output).1)
        .arg(refills_to(report.output))
        .arg(report.refused.map(|(tokens, output)| format!("{tokens}:{}", output.min(tokens))).unwrap_or_default())
}

/// `heartbeat.lua`: the instance, the ttl (at least 1 ms) and the length of a turn as the
/// fleet's gauge reader (zero: no part in it).
pub(crate) fn heartbeat<'a>(
    instances: &'a str,
    instance: &str,
    ttl: Duration,
    reader_turn: Duration,
    mode: Option<(&str, &str)>,
) -> Call<'a> {
    let call = Call::new(&[instances]).arg(instance).arg(duration_ms(ttl).max(1)).arg(duration_ms(reader_turn));
    match mode {
        Some((now, before)) => call.arg(now).arg(before),
        None => call,
    }
}

/// A script's array reply, read field by field with typed errors.
pub(crate) struct Reply<'a> {
    command: &'static str,
    fields: &'a [Value],
}

impl<'a> Reply<'a> {
    pub(crate) fn new(command: &'static str, fields: &'a [Value]) -> Self {
        Self { command, fields }
    }

    pub(crate) fn expect_len(&self, len: usize) -> Result<(), StoreError> {
        if self.fields.len() == len {
            Ok(())
        } else {
            Err(StoreError::unexpected(self.command, format!("{} fields, expected {len}", self.fields.len())))
        }
    }

    /// Exactly `len` fields, or one more (an optional last field).
    pub(crate) fn expect_len_or_one_more(&self, len: usize) -> Result<(), StoreError> {
        if self.fields.len() == len + 1 { Ok(()) } else { self.expect_len(len) }
    }

    /// What is left of the day budgets, `'<requests>:<tokens>'` (each empty without its budget;
    /// `day_left` in `lua/wave.lua`), if the reply has field `index`.
    pub(crate) fn day_left(&self, index: usize) -> Result<Option<DayLeft>, StoreError> {
        if index >= self.fields.len() {
            return Ok(None);
        }
        let text = self.string(index)?;
        let part = |part: &str| -> Result<Option<u64>, StoreError> {
            if part.is_empty() {
                return Ok(None);
            }
            part.parse().map(Some).map_err(|_| {
                StoreError::unexpected(self.command, format!("field {index} is not <requests>:<tokens> left: {text:?}"))
            })
        };
        match text.split_once(':') {
            Some((requests, tokens)) => Ok(Some(DayLeft { requests: part(requests)?, tokens: part(tokens)? })),
            None => Err(StoreError::unexpected(
                self.command,
                format!("field {index} is not <requests>:<tokens> left: {text:?}"),
            )),
        }
    }

    fn field(&self, index: usize) -> Result<&'a Value, StoreError> {
        self.fields.get(index).ok_or_else(|| {
            StoreError::unexpected(self.command, format!("missing field {index} of {}", self.fields.len()))
        })
    }

    pub(crate) fn int(&self, index: usize) -> Result<i64, StoreError> {
        match self.field(index)? {
            Value::Int(n) => Ok(*n),
            other => Err(StoreError::unexpected(self.command, format!("field {index} is {other:?}, not an integer"))),
        }
    }

    pub(crate) fn uint(&self, index: usize) -> Result<u64, StoreError> {
        let n = self.int(index)?;
        u64::try_from(n).map_err(|_| StoreError::unexpected(self.command, format!("field {index} is negative: {n}")))
    }

    pub(crate) fn u32(&self, index: usize) -> Result<u32, StoreError> {
        let n = self.int(index)?;
        u32::try_from(n).map_err(|_| StoreError::unexpected(self.command, format!("field {index} out of range: {n}")))
    }

    pub(crate) fn string(&self, index: usize) -> Result<String, StoreError> {
        match self.field(index)? {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone())
                .map_err(|_| StoreError::unexpected(self.command, format!("field {index} is not UTF-8"))),
            Value::SimpleString(s) => Ok(s.clone()),
            other => Err(StoreError::unexpected(self.command, format!("field {index} is {other:?}, not a string"))),
        }
    }

    pub(crate) fn state(&self, index: usize) -> Result<WaveState, StoreError> {
        let name = self.string(index)?;
        WaveState::parse(&name).ok_or_else(|| StoreError::unexpected(self.command, format!("unknown state {name:?}")))
    }
}

/// The numbers that tie the two sides: what the Rust side sends each script, against what
/// the script checks and uses.
#[cfg(test)]
mod tests {
    use wavegate_core::{UpstreamConfig, WindowLeft};
    use wavegate_testkit::RedisServer;

    use super::*;
    use crate::connection::{Store, StoreConfig};
    use crate::scripts::{scripts, source};
    use crate::shared_gate::SharedGate;

    /// Runs `call` of `script`; the error's text if the script refused it.
    fn run(con: &mut redis::Connection, script: &Script, call: &Call<'_>) -> Result<Value, String> {
        call.invocation(script).invoke::<Value>(con).map_err(|e| e.to_string())
    }

    fn refused_for_its_arguments(result: &Result<Value, String>) -> bool {
        matches!(result, Err(e) if e.contains("expected"))
    }

    /// `call` with one argument fewer, and with one more.
    fn off_by_one<'a>(call: &Call<'a>) -> [Call<'a>; 2] {
        let mut fewer = call.clone();
        fewer.args.pop();
        let mut more = call.clone();
        more.args.push("0".into());
        [fewer, more]
    }

    /// An upstream with budgets and classes, as a process configures it.
    fn gate(store: &Store) -> SharedGate {
        let config = UpstreamConfig::builder("contract")
            .limit(4)
            .requests_per_minute(600, 10)
            .tokens_per_minute(60_000, 1_000)
            .class("interactive", 3)
            .class("batch", 1)
            .class_budget("batch", 50)
            .build()
            .expect("valid");
        SharedGate::with_budgets(store.clone(), config.name(), config.wave(), config.budgets())
            .with_classes(config.classes(), config.default_class(), config.class_count_window())
            .for_instance("alpha")
    }

    #[test]
    fn every_script_takes_exactly_the_arguments_the_rust_side_sends() {
        let server = RedisServer::start().expect("redis-server");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
        let gate = gate(&store);
        let mut con = server.connection().expect("connection");
        let (keys, config) = (&gate.keys, &gate.config_args[..]);
        assert_eq!(config.len(), CONFIG_ARGS);
        let lease = Duration::from_secs(30);
        let heads = [
            Head { class: "interactive", id: "interactive|alpha:1|-", tokens: 10, output: 0, waiting: 2 },
            Head { class: "batch", id: "batch|alpha:2|-", tokens: 10, output: 0, waiting: 1 },
        ];
        let report = WindowReport {
            requests: Some(WindowLeft::fixed(5, 1_000)),
            input: Some(WindowLeft { remaining: 40, reset_ms: 1_000, refills_to: Some(50) }),
            output: Some(WindowLeft::fixed(5, 1_000)),
            ..WindowReport::default()
        };
        let instances = store.config().keyspace.instances();
        let s = scripts();
        // (script, a call as the Rust side sends it, whether the script takes a fixed count);
        // for the scripts that take a list of ids, the call without any.
        let calls = [
            ("acquire, one head", &s.acquire, acquire(keys, config, ("alpha", ""), lease, &heads[..1], false), true),
            ("acquire, class form", &s.acquire, acquire(keys, config, ("alpha", ""), lease, &heads[..1], true), true),
            ("acquire, two classes", &s.acquire, acquire(keys, config, ("alpha", ""), lease, &heads, true), true),
            (
                "finish",
                &s.finish,
                finish(
                    keys,
                    config,
                    ("x", ""),
                    HandOff::WhenHeard,
                    1,
                    WaveSignal::RateLimited { retry_after: None },
                    (-3).into(),
                    None,
                ),
                true,
            ),
            (
                "finish with its answer's report",
                &s.finish,
                finish(
                    keys,
                    config,
                    ("x", ""),
                    HandOff::Never,
                    1,
                    WaveSignal::Success,
                    (-3).into(),
                    Some((report, 10)),
                ),
                true,
            ),
            ("status", &s.status, status(keys, config), true),
            ("report_window", &s.report_window, report_window(keys, "x", report, 10, false), true),
            ("heartbeat", &s.heartbeat, heartbeat(&instances, "alpha", lease, lease, None), true),
            (
                "heartbeat with a mode",
                &s.heartbeat,
                heartbeat(&instances, "alpha", lease, lease, Some(("shared", ""))),
                true,
            ),
            ("renew", &s.renew, renew(keys, (lease, ""), []), false),
            (
                "reconcile",
                &s.reconcile,
                reconcile(
                    keys,
                    config,
                    (&[], &[]),
                    lease,
                    OutageUsage::new(1, 2, Duration::from_millis(3)),
                    (None, ""),
                ),
                false,
            ),
        ];
        for (name, script, call, fixed) in &calls {
            let sent = run(&mut con, script, call);
            assert!(sent.is_ok(), "{name}: the script refused what the Rust side sends: {sent:?}");
            let [fewer, more] = off_by_one(call);
            let fewer = run(&mut con, script, &fewer);
            assert!(refused_for_its_arguments(&fewer), "{name}: one argument fewer was taken: {fewer:?}");
            if *fixed {
                let more = run(&mut con, script, &more);
                assert!(refused_for_its_arguments(&more), "{name}: one argument more was taken: {more:?}");
            }
        }
        // The lists: renew takes any number of ids, reconcile as many as it is told to adopt
        // and then the ones to drop.
        assert!(run(&mut con, &s.renew, &renew(keys, (lease, ""), ["x", "y"])).is_ok());
        let adopt = ["a".to_owned(), "b".to_owned()];
        let dropped = ["c".to_owned()];
        let carried = Some((WaveState::Degraded, 2));
        let full = reconcile(
            keys,
            config,
            (&adopt, &dropped),
            lease,
            OutageUsage::new(1, 2, Duration::from_millis(3))
                .with_day_left(Some(DayLeft { requests: Some(3), tokens: None })),
            (carried, "17"),
        );
        assert!(run(&mut con, &s.reconcile, &full).is_ok());
        let mut short =
            reconcile(keys, config, (&adopt, &[]), lease, OutageUsage::new(1, 2, Duration::from_millis(3)), (None, ""));
        short.args.pop();
        let short = run(&mut con, &s.reconcile, &short);
        assert!(matches!(&short, Err(e) if e.contains("fewer ids than the adopt count")), "{short:?}");
    }

    #[test]
    fn a_reply_is_mapped_back_to_the_ask_it_names_and_an_unknown_one_is_unexpected() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let heads = [
            Head { class: "interactive", id: "interactive|a:1|-", tokens: 100, output: 0, waiting: 1 },
            Head { class: "batch", id: "batch|a:2|-", tokens: 5_000, output: 0, waiting: 1 },
        ];
        let denial = |id: &str| {
            vec![Value::Int(0), text("tokens_exceed_burst"), Value::Int(0), Value::Int(3), text(id), text("g")]
        };
        let (index, admission, in_flight, _, day) =
            read_acquire(&denial("batch|a:2|-"), &heads).expect("a denial of batch");
        assert_eq!(day, None, "no day budget, nothing said of it");
        assert_eq!(index, 1, "the denial answers the head it names, not the first");
        assert_eq!(admission, Admission::Denied { reason: DenyReason::TokensExceedBurst, retry_after_ms: 0 });
        assert_eq!(in_flight, 3);
        let granted = vec![
            Value::Int(1),
            Value::Int(4),
            text("NORMAL"),
            Value::Int(10),
            Value::Int(4),
            text("interactive|a:1|-"),
            text("g"),
        ];
        assert_eq!(read_acquire(&granted, &heads).expect("a grant").0, 0);
        // With a day budget, what is left of the day follows; anything else there is unexpected.
        for (said, left) in [
            ("3:", Some(DayLeft { requests: Some(3), tokens: None })),
            (":1000000000000", Some(DayLeft { requests: None, tokens: Some(1_000_000_000_000) })),
            ("0:7", Some(DayLeft { requests: Some(0), tokens: Some(7) })),
            ("3", None),
            ("-1:", None),
            ("x:2", None),
        ] {
            let mut reply = granted.clone();
            reply.push(text(said));
            match (read_acquire(&reply, &heads), left) {
                (Ok(read), Some(left)) => assert_eq!(read.4, Some(left), "{said:?}"),
                (Err(StoreError::UnexpectedReply { .. }), None) => {}
                (other, _) => panic!("{said:?}: {other:?}"),
            }
        }
        for reply in [denial("batch|b:9|-"), denial("")] {
            let error = read_acquire(&reply, &heads).expect_err("an id that was not asked for");
            assert!(matches!(error, StoreError::UnexpectedReply { .. }), "{error:?}");
        }
        // An older script's denial, naming nothing, is not read as the first head's.
        let unnamed = vec![Value::Int(0), text("at_limit"), Value::Int(0), Value::Int(3), text("g")];
        assert!(matches!(read_acquire(&unnamed, &heads), Err(StoreError::UnexpectedReply { .. })));
    }

    /// The highest `KEYS[n]` the code of `source` reads (comments left out).
    fn keys_used(source: &str) -> usize {
        source
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .flat_map(|code| code.match_indices("KEYS[").map(move |(at, _)| &code[at + 5..]))
            .filter_map(|rest| rest.split(']').next()?.parse::<usize>().ok())
            .max()
            .unwrap_or(0)
    }

    /// How many keys the script's opening contract lists (`KEYS[n]` in its leading comments).
    fn keys_documented(source: &str) -> usize {
        source
            .lines()
            .skip_while(|line| !line.starts_with("-- ") || line.contains("wave.lua"))
            .take_while(|line| line.starts_with("--"))
            .flat_map(|line| line.match_indices("KEYS[").map(move |(at, _)| &line[at + 5..]))
            .filter_map(|rest| rest.split(']').next()?.split("..").last()?.parse::<usize>().ok())
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn every_script_is_sent_the_keys_it_uses_and_documents() {
        let keys = crate::keys::Keyspace::default().upstream(&wavegate_core::UpstreamName::new("k").expect("valid"));
        let config = vec![String::new(); CONFIG_ARGS];
        let lease = Duration::from_secs(1);
        let head = [Head { class: "", id: "x", tokens: 0, output: 0, waiting: 1 }];
        let report = WindowReport::default();
        // (the script's own body, its whole source, the keys the Rust side sends)
        let scripts = [
            (
                include_str!("../../../lua/acquire.lua"),
                source::ACQUIRE,
                acquire(&keys, &config, ("", ""), lease, &head, false).keys.len(),
            ),
            (
                include_str!("../../../lua/finish.lua"),
                source::FINISH,
                finish(&keys, &config, ("x", ""), HandOff::Always, 1, WaveSignal::Neutral, 0.into(), Some((report, 0)))
                    .keys
                    .len(),
            ),
            (include_str!("../../../lua/status.lua"), source::STATUS, status(&keys, &config).keys.len()),
            (include_str!("../../../lua/renew.lua"), source::RENEW, renew(&keys, (lease, ""), ["x"]).keys.len()),
            (
                include_str!("../../../lua/reconcile.lua"),
                source::RECONCILE,
                reconcile(&keys, &config, (&[], &[]), lease, OutageUsage::NONE, (None, "")).keys.len(),
            ),
            (
                include_str!("../../../lua/report_window.lua"),
                source::REPORT_WINDOW,
                report_window(&keys, "x", report, 0, false).keys.len(),
            ),
            (source::HEARTBEAT, source::HEARTBEAT, heartbeat("instances", "x", lease, lease, None).keys.len()),
        ];
        for (body, whole, sent) in scripts {
            let name = body.lines().next().unwrap_or("");
            assert!(keys_used(whole) <= sent, "{name}: reads KEYS[{}] but is sent {sent}", keys_used(whole));
            assert!(
                keys_documented(body) <= sent,
                "{name}: documents KEYS[{}] but is sent {sent}",
                keys_documented(body)
            );
            assert!(keys_documented(body) >= keys_used(body), "{name}: reads keys its contract does not list");
        }
        // What each contract lists: the scripts that keep the waiting list all seven (finish an
        // eighth, the fleet's served calls in shadow mode), the others
        // the permits, the state and the waves (and are sent the fourth too), the heartbeat
        // its own key.
        let documented: Vec<usize> = [
            include_str!("../../../lua/acquire.lua"),
            include_str!("../../../lua/finish.lua"),
            include_str!("../../../lua/status.lua"),
            include_str!("../../../lua/renew.lua"),
            include_str!("../../../lua/reconcile.lua"),
            include_str!("../../../lua/report_window.lua"),
            source::HEARTBEAT,
        ]
        .into_iter()
        .map(keys_documented)
        .collect();
        assert_eq!(documented, [7, 8, 7, 3, 3, 3, 1]);
        assert_eq!(keys_used(source::ACQUIRE), 7);
        assert_eq!(keys_used(source::FINISH), 8);
    }
}

/// The constants both twins keep: one Rust constant each, its Lua value read from the script.
#[cfg(test)]
mod constants {
    use super::CONFIG_ARGS;

    /// The value of `local <name> = <value>` in `source`.
    fn lua_constant<'a>(source: &'a str, name: &str) -> &'a str {
        let line = format!("local {name} = ");
        let at = source.find(&line).unwrap_or_else(|| panic!("no `{line}` in the script"));
        source[at + line.len()..].lines().next().unwrap_or("").trim()
    }

    fn lua_number(source: &str, name: &str) -> u64 {
        lua_constant(source, name).parse().unwrap_or_else(|_| panic!("{name} is not a number"))
    }

    #[test]
    fn the_twins_keep_the_same_constants() {
        let wave = include_str!("../../../lua/wave.lua");
        let priority = include_str!("../../../lua/priority.lua");
        let windows = include_str!("../../../lua/provider_window.lua");
        let learned = include_str!("../../../lua/learned_limit.lua");
        let finish = include_str!("../../../lua/finish.lua");
        assert_eq!(lua_number(wave, "CONFIG_ARGS"), CONFIG_ARGS as u64);
        assert_eq!(lua_number(wave, "WAITING_TTL"), wavegate_core::WAITING_TTL_MS);
        assert_eq!(lua_number(wave, "DAY_MOST_DEBT"), wavegate_core::DAY_MOST_DEBT_US);
        assert_eq!(lua_number(priority, "PRIORITY_FRESH"), wavegate_core::PRIORITY_FRESH_MS);
        assert_eq!(lua_number(priority, "STRIDE_SCALE"), wavegate_core::priority::STRIDE_SCALE);
        assert_eq!(lua_constant(priority, "NO_TENANT"), format!("'{}'", wavegate_core::tenant::NO_TENANT));
        assert_eq!(lua_number(windows, "PW_SAME_WINDOW"), wavegate_core::SAME_WINDOW_MS);
        assert_eq!(lua_number(windows, "PW_MAX_RESET"), wavegate_core::MAX_WINDOW_MS);
        assert_eq!(lua_number(windows, "PW_MOST_LEFT"), wavegate_core::MAX_WINDOW_LEFT);
        assert_eq!(lua_number(learned, "LL_KEPT_WINDOWS"), wavegate_core::KEPT_WINDOWS);
        assert_eq!(lua_number(learned, "LL_MAX"), u64::from(u32::MAX));
        assert_eq!(lua_number(finish, "SERVED_SPANS_KEEP_MS"), wavegate_core::SERVED_SPANS_KEEP_MS);
        assert_eq!(lua_number(finish, "SERVED_SPANS_MAX"), wavegate_core::SERVED_SPANS_MAX as u64);
        assert_eq!(lua_number(finish, "SERVED_SPANS_AHEAD_MS"), wavegate_core::SERVED_SPANS_AHEAD_MS);
        assert_eq!(lua_number(finish, "SPAN_MARGIN_MS"), wavegate_core::SPAN_MARGIN_MS);
    }
}
