//! What each script is sent and how its reply is read, as pure functions.
//!
//! Every script call of [`SharedGate`](crate::SharedGate) and [`Store`](crate::Store) is built
//! here — its `KEYS` and `ARGV` in the order the script's opening contract lists them — and
//! every reply is read here, field by field with typed errors. Nothing here talks to Redis,
//! so the argument counts the Rust side sends can be checked against the counts each script
//! checks (`tests` below, on a real server), and the twins' agreement tests can drive a
//! script with exactly what the gate would send.

use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};
use wavegate_core::{
    Admission, BudgetStatus, DenyReason, Instance, LearnedLimit, LearnedLimitStatus, LearnedStatus, RateLimitEffect,
    Transition, WaveSignal, WaveState, WindowReport, duration_ms,
};

use crate::error::StoreError;
use crate::keys::UpstreamKeys;

/// How many config arguments every script but renew, report_window and heartbeat takes
/// (`CONFIG_ARGS` in `lua/wave.lua`).
pub(crate) const CONFIG_ARGS: usize = 14;

/// One script call: its keys and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call<'a> {
    pub(crate) keys: Vec<&'a str>,
    pub(crate) args: Vec<String>,
}

impl<'a> Call<'a> {
    fn new(keys: &[&'a str]) -> Self {
        Self { keys: keys.to_vec(), args: Vec::new() }
    }

    fn arg(mut self, arg: impl ToString) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// The call as an invocation of `script`.
    pub(crate) fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        invocation.key(&self.keys[..]).arg(&self.args[..]);
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
    pub(crate) waiting: u32,
}

/// `acquire.lua`: the config, then the first head's id, the lease, its tokens and the
/// instance; with classes, its class and callers waiting, then (class, id, tokens, waiting)
/// for each other head. Without classes only the first head is sent.
pub(crate) fn acquire<'a>(
    keys: &'a UpstreamKeys,
    config: &[String],
    instance: &str,
    lease: Duration,
    heads: &[Head<'_>],
    classes: bool,
) -> Call<'a> {
    let mut call = Call::new(&keys.waiting_script_keys());
    call.args.extend(config.iter().cloned());
    let Some((first, rest)) = heads.split_first() else { return call };
    call = call.arg(first.id).arg(duration_ms(lease)).arg(first.tokens).arg(instance);
    if classes {
        call = call.arg(first.class).arg(first.waiting);
        for head in rest {
            call = call.arg(head.class).arg(head.id).arg(head.tokens).arg(head.waiting);
        }
    }
    call
}

/// Reads an acquire's reply: which of the `heads` sent it answers (the script names it; an id
/// that was not sent is an unexpected reply), the answer, and the permits held after it.
pub(crate) fn read_acquire(reply: &[Value], heads: &[Head<'_>]) -> Result<(usize, Admission, u32), StoreError> {
    const COMMAND: &str = "acquire";
    let r = Reply::new(COMMAND, reply);
    let (admission, in_flight, id) = match r.int(0)? {
        1 => {
            r.expect_len(6)?;
            (Admission::Granted { wave: r.uint(1)?, state: r.state(2)?, limit: r.u32(3)? }, r.u32(4)?, r.string(5)?)
        }
        0 => {
            r.expect_len(5)?;
            let name = r.string(1)?;
            let reason = DenyReason::parse(&name)
                .ok_or_else(|| StoreError::unexpected(COMMAND, format!("unknown denial reason {name:?}")))?;
            (Admission::Denied { reason, retry_after_ms: r.uint(2)? }, r.u32(3)?, r.string(4)?)
        }
        other => return Err(StoreError::unexpected(COMMAND, format!("first field is {other}, not 0 or 1"))),
    };
    let index = heads
        .iter()
        .position(|head| head.id == id)
        .ok_or_else(|| StoreError::unexpected(COMMAND, format!("the reply names {id:?}, which was not asked for")))?;
    Ok((index, admission, in_flight))
}

/// `finish.lua`: the config, the id, its wave, the outcome, its `Retry-After`, the release
/// channel and the token delta.
pub(crate) fn finish<'a>(
    keys: &'a UpstreamKeys,
    config: &[String],
    id: &str,
    wave: u64,
    signal: WaveSignal,
    token_delta: i64,
) -> Call<'a> {
    let (outcome, retry_after) = match signal {
        WaveSignal::Success => ("success", String::new()),
        WaveSignal::RateLimited { retry_after } => {
            ("rate_limited", retry_after.map(|d| duration_ms(d).to_string()).unwrap_or_default())
        }
        WaveSignal::Neutral => ("neutral", String::new()),
    };
    let mut call = Call::new(&keys.waiting_script_keys());
    call.args.extend(config.iter().cloned());
    call.arg(id).arg(wave).arg(outcome).arg(retry_after).arg(&keys.released).arg(token_delta)
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
    /// The process the release woke (published on the release channel): the one the
    /// fleet-wide choice of class reaches, or without classes the one that waited longest;
    /// `None` when nobody waits, the id was not held, or the instance id is not one
    /// [`Instance::new`] accepts.
    pub wake: Option<Instance>,
}

/// Reads a finish's reply, for a permit reported against `wave`.
pub(crate) fn read_finish(reply: &[Value], wave: u64) -> Result<Finished, StoreError> {
    const COMMAND: &str = "finish";
    let r = Reply::new(COMMAND, reply);
    r.expect_len(10)?;
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
    Ok(Finished { held: r.int(0)? == 1, rate_limit, transition, status, wake })
}

/// `renew.lua`: the lease, then the ids.
pub(crate) fn renew<'a>(keys: &'a UpstreamKeys, lease: Duration, ids: impl IntoIterator<Item = &'a str>) -> Call<'a> {
    let mut call = Call::new(&keys.script_keys()).arg(duration_ms(lease));
    call.args.extend(ids.into_iter().map(str::to_owned));
    call
}

/// `status.lua`: the config.
pub(crate) fn status<'a>(keys: &'a UpstreamKeys, config: &[String]) -> Call<'a> {
    let mut call = Call::new(&keys.waiting_script_keys());
    call.args.extend(config.iter().cloned());
    call
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
    if reply.len() < 18 || !reply.len().is_multiple_of(2) {
        return Err(StoreError::unexpected(COMMAND, format!("{} fields, expected 18 and pairs", reply.len())));
    }
    let learned = |at: usize| -> Result<Option<LearnedLimitStatus>, StoreError> {
        if r.int(at)? < 0 {
            return Ok(None);
        }
        let limit = LearnedLimit { limit: r.uint(at)?, window_ms: r.uint(at + 1)? };
        Ok(Some(LearnedLimitStatus { limit, forgotten_in: Duration::from_millis(r.uint(at + 2)?) }))
    };
    let classes = (18..reply.len())
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
        budgets: BudgetStatus { requests: budget(8)?, tokens: budget(10)? },
        learned: LearnedStatus { requests: learned(12)?, tokens: learned(15)? },
    };
    Ok((status, classes))
}

/// `reconcile.lua`: the config, the lease, the usage, how many to adopt, the ids to adopt,
/// the ids to drop.
pub(crate) fn reconcile<'a>(
    keys: &'a UpstreamKeys,
    config: &[String],
    adopt: &[String],
    drop: &[String],
    lease: Duration,
    (requests, tokens): (u64, u64),
) -> Call<'a> {
    let mut call = Call::new(&keys.script_keys());
    call.args.extend(config.iter().cloned());
    let mut call = call.arg(duration_ms(lease)).arg(requests).arg(tokens).arg(adopt.len());
    call.args.extend(adopt.iter().chain(drop).cloned());
    call
}

/// `report_window.lua`: each window's remaining and reset, the tokens each, the reporting id,
/// each announced limit and its window (`''` for what the report does not say).
pub(crate) fn report_window<'a>(keys: &'a UpstreamKeys, id: &str, report: WindowReport, tokens_each: u64) -> Call<'a> {
    let side = |left: Option<wavegate_core::WindowLeft>| {
        left.map_or((String::new(), String::new()), |l| (l.remaining.to_string(), l.reset_ms.to_string()))
    };
    let limit = |learned: Option<LearnedLimit>| {
        learned.map_or((String::new(), String::new()), |l| (l.limit.to_string(), l.window_ms.to_string()))
    };
    let (requests, requests_reset) = side(report.requests);
    let (tokens, tokens_reset) = side(report.tokens);
    let (requests_limit, requests_window) = limit(report.limits.requests);
    let (tokens_limit, tokens_window) = limit(report.limits.tokens);
    Call::new(&keys.script_keys())
        .arg(requests)
        .arg(requests_reset)
        .arg(tokens)
        .arg(tokens_reset)
        .arg(tokens_each)
        .arg(id)
        .arg(requests_limit)
        .arg(requests_window)
        .arg(tokens_limit)
        .arg(tokens_window)
}

/// `heartbeat.lua`: the instance and the ttl (at least 1 ms).
pub(crate) fn heartbeat<'a>(instances: &'a str, instance: &str, ttl: Duration) -> Call<'a> {
    Call::new(&[instances]).arg(instance).arg(duration_ms(ttl).max(1))
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
