//! One upstream's permits and wave state in Redis: the shared twin of
//! [`LocalGate`](wavegate_core::LocalGate).
//!
//! Every method is one script call, bounded by the command timeout, and answers in
//! wavegate-core's types. Replies are checked field by field; a reply of the wrong shape is a
//! [`StoreError::UnexpectedReply`], never a panic.

use std::time::Duration;

use redis::Value;
use wavegate_core::{
    Admission, BudgetStatus, Budgets, DenyReason, LearnedLimit, LearnedLimitStatus, LearnedStatus, ProviderWindows,
    RateBudget, RateLimitEffect, TrackedWindow, Transition, UpstreamName, WaveConfig, WaveSignal, WaveState,
    WindowReport, duration_ms,
};

use wavegate_core::priority::PriorityClass;

use crate::connection::Store;
use crate::error::StoreError;
use crate::keys::UpstreamKeys;
use crate::scripts::scripts;

/// How many config arguments every script but renew takes (`CONFIG_ARGS` in `lua/wave.lua`).
const CONFIG_ARGS: usize = 14;

/// One priority class's part of an [`acquire_among`](SharedGate::acquire_among): the head of
/// this process's callers of the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassAsk<'a> {
    /// The class's name.
    pub class: &'a str,
    /// The head's permit id, `<class>|...`.
    pub id: &'a str,
    /// Tokens to reserve for it.
    pub tokens: u64,
    /// This process's callers of the class waiting, the head included (at least 1).
    pub waiting: u32,
}

/// The answer to an acquire, with the number of permits held after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// Granted or denied, as the wave machine decided.
    pub admission: Admission,
    /// Permits held across the fleet after the call.
    pub in_flight: u32,
}

/// What finishing a permit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// Whether the permit was still held.
    pub held: bool,
    /// The effect of a 429, if the outcome was one.
    pub rate_limit: Option<RateLimitEffect>,
    /// A state change caused by a success, if any.
    pub transition: Option<Transition>,
    /// The state after the call.
    pub status: SharedStatus,
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
    /// What is left of the rate budgets in force (filled by [`SharedGate::status`]; empty
    /// otherwise).
    pub budgets: BudgetStatus,
    /// The limits the provider announced, as the fleet keeps them (filled by
    /// [`SharedGate::status`]; empty otherwise).
    pub learned: LearnedStatus,
}

/// What a reconciliation left in the shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    /// The shared wave now.
    pub wave: u64,
    /// The wave the adopted permits report against: `wave` in NORMAL, the one before
    /// otherwise (calls older than the last cut say nothing new).
    pub adopted_wave: u64,
    /// The shared state.
    pub state: WaveState,
    /// The shared limit.
    pub limit: u32,
    /// Permits held across the fleet after the call.
    pub in_flight: u32,
}

/// One upstream's scripts, bound to its keys and wave configuration.
#[derive(Debug, Clone)]
pub struct SharedGate {
    pub(crate) store: Store,
    pub(crate) name: String,
    pub(crate) keys: UpstreamKeys,
    /// The config arguments every script but renew takes, rendered once.
    pub(crate) config_args: [String; CONFIG_ARGS],
    /// This process's instance id, put on the waiting list at the limit ('' for none).
    instance: String,
}

impl SharedGate {
    /// The gate of upstream `name`, with its wave configuration and no rate budgets.
    pub fn new(store: Store, name: &UpstreamName, wave: &WaveConfig) -> Self {
        Self::with_budgets(store, name, wave, Budgets::default())
    }

    /// The gate of upstream `name`, with its wave configuration and rate budgets.
    pub fn with_budgets(store: Store, name: &UpstreamName, wave: &WaveConfig, budgets: Budgets) -> Self {
        let keys = store.config().keyspace.upstream(name);
        let ladder = wave.cooldown.ladder().iter().map(|step| duration_ms(*step).to_string()).collect::<Vec<_>>();
        let rate = |b: Option<RateBudget>| b.map_or((0, 0), |b| (b.per_minute(), b.burst()));
        let (requests, requests_burst) = rate(budgets.requests);
        let (tokens, tokens_burst) = rate(budgets.tokens);
        let config_args = [
            wave.base_limit.to_string(),
            wave.probe_successes.to_string(),
            ladder.join(","),
            duration_ms(wave.cooldown.min()).to_string(),
            duration_ms(wave.cooldown.max()).to_string(),
            requests.to_string(),
            requests_burst.to_string(),
            tokens.to_string(),
            tokens_burst.to_string(),
            wave.recovery.as_str().to_string(),
            duration_ms(wave.retest_after).to_string(),
            duration_ms(wave.retest_max).to_string(),
            wave.retest_rounds_max.to_string(),
            String::new(),
        ];
        Self { store, name: name.as_str().to_owned(), keys, config_args, instance: String::new() }
    }

    /// Acquires on behalf of process `instance`: when the limit is reached it joins the
    /// upstream's waiting list, and a release announces the process that waited longest, so
    /// one process asks again instead of all of them.
    pub fn for_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// Shares the permits among priority `classes` (the upstream's, in configured order; the
    /// one at `default` takes permits whose id names no class): see [`acquire_among`](Self::acquire_among).
    /// A permit counts in its class's share of the fleet only while its lease ends at least
    /// `count_window` ahead (renewed lately: [`UpstreamConfig::class_count_window`]); zero counts
    /// every permit.
    ///
    /// [`UpstreamConfig::class_count_window`]: wavegate_core::UpstreamConfig::class_count_window
    pub fn with_classes(mut self, classes: &[PriorityClass], default: usize, count_window: Duration) -> Self {
        let mut entries: Vec<String> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mark = if i == default { "*" } else { "" };
                let (name, weight, reserve) = (c.name(), c.weight_value(), c.reserve_percent_value());
                match c.budget_percent_value() {
                    100 => format!("{mark}{name}:{weight}:{reserve}"),
                    share => format!("{mark}{name}:{weight}:{reserve}:{share}"),
                }
            })
            .collect();
        if !count_window.is_zero() {
            entries.push(format!("@{}", duration_ms(count_window)));
        }
        self.config_args[CONFIG_ARGS - 1] = entries.join(",");
        self
    }

    /// The upstream's keys.
    pub fn keys(&self) -> &UpstreamKeys {
        &self.keys
    }

    /// Asks for permit `id` with a lease of `lease`, reserving `tokens` of the tokens budget.
    /// Sending the same id again (after a lost reply) grants the same permit, never a second
    /// one, and charges nothing again.
    pub async fn acquire(&self, id: &str, lease: Duration, tokens: u64) -> Result<Acquired, StoreError> {
        let mut invocation = scripts().acquire.prepare_invoke();
        invocation
            .key(&self.keys.waiting_script_keys()[..])
            .arg(&self.config_args[..])
            .arg(id)
            .arg(duration_ms(lease))
            .arg(tokens)
            .arg(&self.instance);
        self.acquire_reply(&invocation).await.map(|(acquired, _)| acquired)
    }

    /// Asks for one permit for this process's callers of several priority classes at once
    /// (upstreams with classes, after [`with_classes`](Self::with_classes)): one `ask` per
    /// class with callers waiting, its head's permit id (which must start with `<class>|`),
    /// tokens, and how many of its callers wait. The fleet-wide choice of class decides which
    /// of them, if any, is granted; the reply names its id. Idempotent like
    /// [`acquire`](Self::acquire).
    pub async fn acquire_among(
        &self,
        asks: &[ClassAsk<'_>],
        lease: Duration,
    ) -> Result<(Acquired, Option<String>), StoreError> {
        const COMMAND: &str = "acquire";
        let Some((first, rest)) = asks.split_first() else {
            return Err(StoreError::unexpected(COMMAND, "nothing to ask for"));
        };
        let mut invocation = scripts().acquire.prepare_invoke();
        invocation
            .key(&self.keys.waiting_script_keys()[..])
            .arg(&self.config_args[..])
            .arg(first.id)
            .arg(duration_ms(lease))
            .arg(first.tokens)
            .arg(&self.instance)
            .arg(first.class)
            .arg(first.waiting);
        for ask in rest {
            invocation.arg(ask.class).arg(ask.id).arg(ask.tokens).arg(ask.waiting);
        }
        self.acquire_reply(&invocation).await
    }

    /// Sends an acquire and reads its reply: the answer and, for a grant, the id granted.
    async fn acquire_reply(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<(Acquired, Option<String>), StoreError> {
        const COMMAND: &str = "acquire";
        let reply: Vec<Value> = self.store.invoke(COMMAND, invocation).await?;
        let r = Reply::new(COMMAND, &reply);
        match r.int(0)? {
            1 => {
                r.expect_len(6)?;
                let admission = Admission::Granted { wave: r.uint(1)?, state: r.state(2)?, limit: r.u32(3)? };
                Ok((Acquired { admission, in_flight: r.u32(4)? }, Some(r.string(5)?)))
            }
            0 => {
                r.expect_len(4)?;
                let name = r.string(1)?;
                let reason = DenyReason::parse(&name)
                    .ok_or_else(|| StoreError::unexpected(COMMAND, format!("unknown denial reason {name:?}")))?;
                let admission = Admission::Denied { reason, retry_after_ms: r.uint(2)? };
                Ok((Acquired { admission, in_flight: r.u32(3)? }, None))
            }
            other => Err(StoreError::unexpected(COMMAND, format!("first field is {other}, not 0 or 1"))),
        }
    }

    /// Releases permit `id` (idempotent), reports its outcome for `wave` and settles its
    /// token reservation: `token_delta` more tokens (negative: fewer) than reserved.
    pub async fn finish(
        &self,
        id: &str,
        wave: u64,
        signal: WaveSignal,
        token_delta: i64,
    ) -> Result<Finished, StoreError> {
        const COMMAND: &str = "finish";
        let (outcome, retry_after) = match signal {
            WaveSignal::Success => ("success", String::new()),
            WaveSignal::RateLimited { retry_after } => {
                ("rate_limited", retry_after.map(|d| duration_ms(d).to_string()).unwrap_or_default())
            }
            WaveSignal::Neutral => ("neutral", String::new()),
        };
        let mut invocation = scripts().finish.prepare_invoke();
        invocation
            .key(&self.keys.waiting_script_keys()[..])
            .arg(&self.config_args[..])
            .arg(id)
            .arg(wave)
            .arg(outcome)
            .arg(retry_after)
            .arg(&self.keys.released)
            .arg(token_delta);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &invocation).await?;
        let r = Reply::new(COMMAND, &reply);
        r.expect_len(9)?;
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
        Ok(Finished { held: r.int(0)? == 1, rate_limit, transition, status })
    }

    /// Extends the leases of `ids`, permits whose calls are still running (one call for the
    /// batch); an id the store no longer lists is registered again. Returns the ids that were
    /// (the caller releases any whose call ended while the renewal was on its way).
    pub async fn renew(&self, ids: &[String], lease: Duration) -> Result<Vec<String>, StoreError> {
        const COMMAND: &str = "renew";
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = scripts().renew.prepare_invoke();
        invocation.key(&self.keys.script_keys()[..]).arg(duration_ms(lease)).arg(ids);
        self.store.invoke(COMMAND, &invocation).await
    }

    /// After an outage: registers `adopt` (permits still in flight here) in the current wave
    /// with a fresh lease, drops `drop` (permits that finished during the outage), and
    /// charges the `requests` and `tokens` used during the outage to the budgets.
    pub async fn reconcile(
        &self,
        adopt: &[String],
        drop: &[String],
        lease: Duration,
        (requests, tokens): (u64, u64),
    ) -> Result<Reconciled, StoreError> {
        const COMMAND: &str = "reconcile";
        let mut invocation = scripts().reconcile.prepare_invoke();
        invocation
            .key(&self.keys.script_keys()[..])
            .arg(&self.config_args[..])
            .arg(duration_ms(lease))
            .arg(requests)
            .arg(tokens)
            .arg(adopt.len())
            .arg(adopt)
            .arg(drop);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &invocation).await?;
        let r = Reply::new(COMMAND, &reply);
        r.expect_len(5)?;
        Ok(Reconciled {
            wave: r.uint(0)?,
            state: r.state(1)?,
            limit: r.u32(2)?,
            in_flight: r.u32(3)?,
            adopted_wave: r.uint(4)?,
        })
    }

    /// Takes in what the response to permit `id` said is left of the provider's windows
    /// (`lua/report_window.lua`): the fleet's grants then wait for the window's reset once
    /// nothing is left. The other permits held count as calls the provider may not have
    /// counted yet, each reserving `tokens_each` (what the reporting call reserved). Returns
    /// the windows as kept, their ends relative to now (an end of 0: no window runs). The
    /// limits it announced are kept for the fleet too (`lua/learned_limit.lua`).
    pub async fn report_window(
        &self,
        id: &str,
        report: WindowReport,
        tokens_each: u64,
    ) -> Result<ProviderWindows, StoreError> {
        const COMMAND: &str = "report_window";
        let side = |left: Option<wavegate_core::WindowLeft>| {
            left.map_or((String::new(), String::new()), |l| (l.remaining.to_string(), l.reset_ms.to_string()))
        };
        let (requests, requests_reset) = side(report.requests);
        let (tokens, tokens_reset) = side(report.tokens);
        let limit = |learned: Option<LearnedLimit>| {
            learned.map_or((String::new(), String::new()), |l| (l.limit.to_string(), l.window_ms.to_string()))
        };
        let (requests_limit, requests_window) = limit(report.limits.requests);
        let (tokens_limit, tokens_window) = limit(report.limits.tokens);
        let mut invocation = scripts().report_window.prepare_invoke();
        invocation
            .key(&self.keys.script_keys()[..])
            .arg(requests)
            .arg(requests_reset)
            .arg(tokens)
            .arg(tokens_reset)
            .arg(tokens_each)
            .arg(id)
            .arg(requests_limit)
            .arg(requests_window)
            .arg(tokens_limit)
            .arg(tokens_window);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &invocation).await?;
        let r = Reply::new(COMMAND, &reply);
        r.expect_len(4)?;
        Ok(ProviderWindows {
            requests: TrackedWindow { left: r.uint(0)?, until_ms: r.uint(1)? },
            tokens: TrackedWindow { left: r.uint(2)?, until_ms: r.uint(3)? },
        })
    }

    /// Whether the server that holds this upstream's keys answers: one `ZCARD` of its permits,
    /// routed by the upstream's hash-tagged key (on a Cluster, to the master that serves its
    /// slot, where a `PING` would go to every node), under the command timeout.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let key = self.keys.permits.clone();
        let timeout = self.store.config().command_timeout;
        self.store
            .bounded(
                "probe",
                timeout,
                |mut c| async move { redis::cmd("ZCARD").arg(key).query_async::<i64>(&mut c).await },
            )
            .await
            .map(|_| ())
    }

    /// The shared state, with Redis time applied (a cooldown past its end reads as PROBE).
    pub async fn status(&self) -> Result<SharedStatus, StoreError> {
        self.status_with_classes().await.map(|(status, _)| status)
    }

    /// [`status`](Self::status), and for each priority class (in configured order, after
    /// [`with_classes`](Self::with_classes)) the fleet's permits in flight and callers waiting
    /// (those of processes that asked within the last 1.5 s).
    pub async fn status_with_classes(&self) -> Result<(SharedStatus, Vec<(u32, u32)>), StoreError> {
        const COMMAND: &str = "status";
        let mut invocation = scripts().status.prepare_invoke();
        invocation.key(&self.keys.waiting_script_keys()[..]).arg(&self.config_args[..]);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &invocation).await?;
        let r = Reply::new(COMMAND, &reply);
        if reply.len() < 18 || !reply.len().is_multiple_of(2) {
            return Err(StoreError::unexpected(COMMAND, format!("{} fields, expected 18 and pairs", reply.len())));
        }
        let learned = |at: usize| -> Result<Option<LearnedLimitStatus>, StoreError> {
            if r.int(at)? < 0 {
                return Ok(None);
            }
            let limit = LearnedLimit { limit: r.uint(at)?, window_ms: r.uint(at + 1)? };
            Ok(Some(LearnedLimitStatus::new(limit, Duration::from_millis(r.uint(at + 2)?))))
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
            budgets: BudgetStatus::new(budget(8)?, budget(10)?),
            learned: LearnedStatus::new(learned(12)?, learned(15)?),
        };
        Ok((status, classes))
    }
}

/// A script's array reply, read field by field with typed errors.
struct Reply<'a> {
    command: &'static str,
    fields: &'a [Value],
}

impl<'a> Reply<'a> {
    fn new(command: &'static str, fields: &'a [Value]) -> Self {
        Self { command, fields }
    }

    fn expect_len(&self, len: usize) -> Result<(), StoreError> {
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

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        match self.field(index)? {
            Value::Int(n) => Ok(*n),
            other => Err(StoreError::unexpected(self.command, format!("field {index} is {other:?}, not an integer"))),
        }
    }

    fn uint(&self, index: usize) -> Result<u64, StoreError> {
        let n = self.int(index)?;
        u64::try_from(n).map_err(|_| StoreError::unexpected(self.command, format!("field {index} is negative: {n}")))
    }

    fn u32(&self, index: usize) -> Result<u32, StoreError> {
        let n = self.int(index)?;
        u32::try_from(n).map_err(|_| StoreError::unexpected(self.command, format!("field {index} out of range: {n}")))
    }

    fn string(&self, index: usize) -> Result<String, StoreError> {
        match self.field(index)? {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone())
                .map_err(|_| StoreError::unexpected(self.command, format!("field {index} is not UTF-8"))),
            Value::SimpleString(s) => Ok(s.clone()),
            other => Err(StoreError::unexpected(self.command, format!("field {index} is {other:?}, not a string"))),
        }
    }

    fn state(&self, index: usize) -> Result<WaveState, StoreError> {
        let name = self.string(index)?;
        WaveState::parse(&name).ok_or_else(|| StoreError::unexpected(self.command, format!("unknown state {name:?}")))
    }
}
