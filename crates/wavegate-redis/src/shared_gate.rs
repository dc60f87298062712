//! One upstream's permits and wave state in Redis: the shared twin of
//! [`LocalGate`](wavegate_core::LocalGate).
//!
//! Every method is one script call, bounded by the command timeout, and answers in
//! wavegate-core's types. Replies are checked field by field; a reply of the wrong shape is a
//! [`StoreError::UnexpectedReply`], never a panic.

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::Value;
use wavegate_core::{
    Admission, Ask, Budgets, DayBudget, DayLeft, Decision, OutageUsage, PermitId, ProviderWindows, RateBudget,
    TokenDelta, TrackedWindow, UpstreamConfig, UpstreamName, WaveConfig, WaveSignal, WaveState, WindowReport,
    duration_ms,
};

use wavegate_core::priority::PriorityClass;

use crate::calls::{self, CONFIG_ARGS, Head, Reply};
pub use crate::calls::{Finished, HandOff, SharedStatus};
use crate::connection::Store;
use crate::day_word::DayWord;
use crate::error::StoreError;
use crate::keys::UpstreamKeys;
use crate::scripts::scripts;

/// The classes' configuration argument (see `read_config` in `lua/wave.lua`):
/// `[*]name:weight:reserve[:budget]` joined by `,`, the default marked `*`, then `@<ms>`, the
/// counting window, unless zero.
pub(crate) fn classes_arg(classes: &[PriorityClass], default: usize, count_window: Duration) -> String {
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
    entries.join(",")
}

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
    /// Which releases hand their freed permit on ([`HandOff`]): only with a wake-up heard, or
    /// never on a Cluster.
    hand_off: HandOff,
    /// The name of the class that takes permits whose id names none (with classes).
    default_class: Option<String>,
    /// The generation of the upstream's state this process last saw ('' before the first
    /// reply), shared by the clones: every script but status sends it, and one whose state
    /// has another (or none) answers [`StoreError::StateLost`] (see `generation` in
    /// `lua/wave.lua`). Learned from the first acquire, replaced by each reconciliation.
    generation: Arc<Mutex<String>>,
    /// The configured fallback limit, claimed with the scripts' configuration
    /// ([`for_upstream`](Self::for_upstream) sets it).
    pub(crate) fallback_limit: Option<u32>,
    /// The live values sent instead of the configured ones (0: none), by
    /// [`LIVE_ARGS`](crate::live::LIVE_ARGS), shared by the clones: see
    /// [`set_live`](Self::set_live).
    pub(crate) live_args: Arc<[AtomicU32; 5]>,
    /// The priority classes as configured (with the default's index and the counting window),
    /// from which a live change of their weights and reserves is rendered.
    pub(crate) class_config: Option<Arc<(Vec<PriorityClass>, usize, Duration)>>,
    /// The classes' argument with their live weights and reserves, when any is in force.
    pub(crate) live_classes: Arc<Mutex<Option<String>>>,
    /// What the store last said is left of the day budgets, and when (acquire replies say it,
    /// with a day budget), shared by the clones: see [`day_left`](Self::day_left) and
    /// [`hold_day_word`](Self::hold_day_word).
    day_word: Arc<Mutex<DayWord>>,
}

impl SharedGate {
    /// The gate of upstream `name`, with its wave configuration and no rate budgets.
    pub fn new(store: Store, name: &UpstreamName, wave: &WaveConfig) -> Self {
        Self::with_budgets(store, name, wave, Budgets::default())
    }

    /// The gate of upstream `name`, with its wave configuration and rate budgets.
    pub fn with_budgets(store: Store, name: &UpstreamName, wave: &WaveConfig, budgets: Budgets) -> Self {
        let keys = store.config().keyspace.upstream(name);
        let hand_off = if store.config().cluster_nodes.is_empty() { HandOff::WhenHeard } else { HandOff::Never };
        let ladder = wave.cooldown.ladder().iter().map(|step| duration_ms(*step).to_string()).collect::<Vec<_>>();
        let rate = |b: Option<RateBudget>| b.map_or((0, 0), |b| (b.per_minute(), b.burst()));
        let (requests, requests_burst) = rate(budgets.requests);
        let (tokens, tokens_burst) = rate(budgets.tokens);
        let split = |b: Option<RateBudget>| b.map_or(String::new(), |b| format!("{}:{}", b.per_minute(), b.burst()));
        let day = |b: Option<DayBudget>| b.map_or(String::new(), |b| format!("{}:{}", b.per_day(), b.burst()));
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
            split(budgets.input),
            split(budgets.output),
            day(budgets.requests_per_day),
            day(budgets.tokens_per_day),
            String::new(),
        ];
        Self {
            store,
            name: name.as_str().to_owned(),
            keys,
            config_args,
            hand_off,
            instance: String::new(),
            default_class: None,
            generation: Arc::default(),
            fallback_limit: None,
            live_args: Arc::default(),
            class_config: None,
            live_classes: Arc::default(),
            day_word: Arc::default(),
        }
    }

    /// The gate of `config`'s upstream as every process of the fleet configures it: its wave,
    /// its rate budgets, its priority classes (if any) and its fallback limit (which the
    /// configuration claim includes). The startup check and the engine build their gates here,
    /// so the configuration each claims is the same.
    pub fn for_upstream(store: Store, config: &UpstreamConfig) -> Self {
        let gate = Self::with_budgets(store, config.name(), config.wave(), config.budgets());
        let mut gate = if config.classes().is_empty() {
            gate
        } else {
            gate.with_classes(config.classes(), config.default_class(), config.class_count_window())
        };
        gate.fallback_limit = config.fallback_limit().map(|limit| limit.get());
        gate
    }

    /// Acquires on behalf of process `instance`: when the limit is reached it joins the
    /// upstream's waiting list, and a release announces the process that waited longest, so
    /// one process asks again instead of all of them.
    pub fn for_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// Which releases hand their freed permit on: by default only with a wake-up a subscriber
    /// heard, never on a Cluster. (Tests that compare the scripts with the Rust twin, which
    /// has no subscribers, hand on always.)
    #[doc(hidden)]
    pub fn with_hand_off(mut self, hand_off: HandOff) -> Self {
        self.hand_off = hand_off;
        self
    }

    /// The channel on which a release anywhere in the fleet wakes this gate's process (see
    /// [`UpstreamKeys::wake_channel`]): the message is the upstream's name.
    pub fn wake_channel(&self) -> String {
        self.keys.wake_channel(&self.instance)
    }

    /// Shares the permits among priority `classes` (the upstream's, in configured order; the
    /// one at `default` takes permits whose id names no class): see [`acquire_among`](Self::acquire_among).
    /// A permit counts in its class's share of the fleet only while its lease ends at least
    /// `count_window` ahead (renewed lately: [`UpstreamConfig::class_count_window`]); zero counts
    /// every permit.
    ///
    /// [`UpstreamConfig::class_count_window`]: wavegate_core::UpstreamConfig::class_count_window
    pub fn with_classes(mut self, classes: &[PriorityClass], default: usize, count_window: Duration) -> Self {
        self.config_args[CONFIG_ARGS - 1] = classes_arg(classes, default, count_window);
        self.default_class = classes.get(default).or(classes.first()).map(|c| c.name().to_owned());
        self.class_config = Some(Arc::new((classes.to_vec(), default, count_window)));
        self
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The upstream's keys.
    pub fn keys(&self) -> &UpstreamKeys {
        &self.keys
    }

    /// The generation of the upstream's state this process last saw (`""` before the first
    /// reply that told it).
    pub fn generation(&self) -> String {
        self.generation.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// What the store last said is left of the fleet's day budgets, and when: the last acquire
    /// reply that said it (`None` before one did, or without a day budget). A fallback's day
    /// shares start from it ([`FallbackStart::day_left`](wavegate_core::FallbackStart::day_left)),
    /// so a day the fleet spent stays spent through an outage. (A reconciliation's reply does
    /// not say it: the processes that reconcile after it would not be in it, while every
    /// process's last acquire is of the same time, before the outage.)
    pub fn day_left(&self) -> Option<(DayLeft, Instant)> {
        self.day_word.lock().unwrap_or_else(PoisonError::into_inner).said()
    }

    /// A fallback begins: replies that come back from now on (requests the store ran before it
    /// heard of the fallback's grants) do not replace [`day_left`](Self::day_left), so the
    /// fallback's use counted against it is not forgotten, until
    /// [`release_day_word`](Self::release_day_word).
    pub fn hold_day_word(&self) {
        self.day_word.lock().unwrap_or_else(PoisonError::into_inner).hold();
    }

    /// The store heard the fallback's use (its reconciliation answered, or shared mode resumed
    /// without one): replies to requests sent from now on say the day again.
    pub fn release_day_word(&self) {
        self.day_word.lock().unwrap_or_else(PoisonError::into_inner).release();
    }

    fn learn_day_left(&self, left: Option<DayLeft>, sent: Instant) {
        if let Some(left) = left {
            self.day_word.lock().unwrap_or_else(PoisonError::into_inner).heard(left, sent);
        }
    }

    /// Takes the generation a reply told: the first one seen, or (`replace`) a reconciliation's.
    fn learn_generation(&self, generation: String, replace: bool) {
        let mut known = self.generation.lock().unwrap_or_else(PoisonError::into_inner);
        if replace || known.is_empty() {
            *known = generation;
        }
    }

    /// Asks for one permit on behalf of this process's waiting callers (the twin of
    /// [`LocalGate::acquire`](wavegate_core::LocalGate::acquire); `lua/acquire.lua`): one
    /// [`Ask`] per head it offers. With classes (after [`with_classes`](Self::with_classes))
    /// the fleet-wide choice of class and tenant decides which head, if any, is granted;
    /// without classes a process has one head, and only the first ask is sent. The decision
    /// names the ask it answers: the one granted, or the one refused (an estimate that can
    /// never fit is refused first, naming its ask; otherwise the one the choice reached, else
    /// the first). A reply naming an id that was not asked for is a
    /// [`StoreError::UnexpectedReply`]. Sending an id already held grants it again (never a
    /// second permit) and charges nothing again.
    pub async fn acquire(&self, asks: &[Ask], lease: Duration) -> Result<Decision, StoreError> {
        let classes = self.default_class.is_some();
        let asks = if classes { asks } else { &asks[..asks.len().min(1)] };
        let heads: Vec<Head<'_>> = asks
            .iter()
            .map(|ask| Head {
                class: ask.id.class().or(self.default_class.as_deref()).unwrap_or(""),
                id: ask.id.as_str(),
                tokens: ask.tokens,
                output: ask.output,
                waiting: ask.waiting,
            })
            .collect();
        let (index, admission, in_flight) = self.acquire_heads(&heads, lease, classes).await?;
        Ok(Decision::new(asks[index].id.clone(), admission, in_flight))
    }

    /// Sends an acquire of `heads` and reads its reply: which head it answers, and how.
    async fn acquire_heads(
        &self,
        heads: &[Head<'_>],
        lease: Duration,
        classes: bool,
    ) -> Result<(usize, Admission, u32), StoreError> {
        const COMMAND: &str = "acquire";
        if heads.is_empty() {
            return Err(StoreError::unexpected(COMMAND, "nothing to ask for"));
        }
        let generation = self.generation();
        let mut call =
            calls::acquire(&self.keys, &self.config_args, (&self.instance, &generation), lease, heads, classes);
        self.send_live(&mut call);
        let sent = Instant::now();
        let reply: Vec<Value> = self.store.invoke(COMMAND, &call.invocation(&scripts().acquire)).await?;
        let (index, admission, in_flight, generation, day_left) = calls::read_acquire(&reply, heads)?;
        self.learn_generation(generation, false);
        self.learn_day_left(day_left, sent);
        Ok((index, admission, in_flight))
    }

    /// Asks for permit `id` by its text, without classes (kept until the engine moves to
    /// [`acquire`](Self::acquire)).
    #[doc(hidden)]
    pub async fn acquire_text(&self, id: &str, lease: Duration, tokens: u64) -> Result<Acquired, StoreError> {
        let head = Head { class: "", id, tokens, output: 0, waiting: 1 };
        let (_, admission, in_flight) = self.acquire_heads(&[head], lease, false).await?;
        Ok(Acquired { admission, in_flight })
    }

    /// Asks for one permit for several priority classes' heads by their texts (kept until the
    /// engine moves to [`acquire`](Self::acquire)). The id returned is the ask the reply
    /// answers, granted or denied.
    #[doc(hidden)]
    pub async fn acquire_among(
        &self,
        asks: &[ClassAsk<'_>],
        lease: Duration,
    ) -> Result<(Acquired, Option<String>), StoreError> {
        let heads: Vec<Head<'_>> = asks
            .iter()
            .map(|a| Head { class: a.class, id: a.id, tokens: a.tokens, output: 0, waiting: a.waiting })
            .collect();
        let (index, admission, in_flight) = self.acquire_heads(&heads, lease, true).await?;
        Ok((Acquired { admission, in_flight }, Some(heads[index].id.to_owned())))
    }

    /// Releases permit `id` (idempotent), reports its outcome for `wave` and settles its
    /// token reservation: `token_delta` more tokens (negative: fewer) than reserved, on the
    /// upstream's tokens budget and its class's (its input and output parts on the input and
    /// output budgets). Says which process the release woke (the
    /// twin of [`LocalGate::finish`](wavegate_core::LocalGate::finish); `lua/finish.lua`).
    pub async fn finish(
        &self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: impl Into<TokenDelta>,
    ) -> Result<Finished, StoreError> {
        self.finish_text(id.as_str(), wave, signal, token_delta).await
    }

    /// [`finish`](Self::finish) by the id's text (kept until the engine moves to
    /// [`finish`](Self::finish)).
    #[doc(hidden)]
    pub async fn finish_text(
        &self,
        id: &str,
        wave: u64,
        signal: WaveSignal,
        token_delta: impl Into<TokenDelta>,
    ) -> Result<Finished, StoreError> {
        self.finish_with_report(id, wave, signal, token_delta.into(), None).await
    }

    /// [`finish`](Self::finish), taking in first what the call's answer said of the provider's
    /// windows (`report`, with the tokens the call reserved), as
    /// [`report_window`](Self::report_window) would have just before: one round trip for the
    /// answer and its release. Send the report with the first attempt only: a release sent
    /// again (its first reply lost) must not take the same answer in twice.
    pub async fn finish_reporting(
        &self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: impl Into<TokenDelta>,
        report: Option<(WindowReport, u64)>,
    ) -> Result<Finished, StoreError> {
        self.finish_with_report(id.as_str(), wave, signal, token_delta.into(), report).await
    }

    async fn finish_with_report(
        &self,
        id: &str,
        wave: u64,
        signal: WaveSignal,
        token_delta: TokenDelta,
        report: Option<(WindowReport, u64)>,
    ) -> Result<Finished, StoreError> {
        const COMMAND: &str = "finish";
        let generation = self.generation();
        let ids = (id, generation.as_str());
        let mut call =
            calls::finish(&self.keys, &self.config_args, ids, self.hand_off, wave, signal, token_delta, report);
        self.send_live(&mut call);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &call.invocation(&scripts().finish)).await?;
        calls::read_finish(&reply, wave)
    }

    /// Extends the leases of `ids`, permits whose calls are still running (one call for the
    /// batch); an id the store no longer lists is registered again. Returns the ids that were
    /// (the caller releases any whose call ended while the renewal was on its way); an id in
    /// the reply that was not sent is a [`StoreError::UnexpectedReply`].
    pub async fn renew(&self, ids: &[PermitId], lease: Duration) -> Result<Vec<PermitId>, StoreError> {
        let again = self.renew_ids(ids.iter().map(PermitId::as_str), lease).await?;
        again
            .into_iter()
            .map(|text| {
                ids.iter().find(|id| id.as_str() == text).cloned().ok_or_else(|| {
                    StoreError::unexpected("renew", format!("the reply names {text:?}, which was not sent"))
                })
            })
            .collect()
    }

    /// [`renew`](Self::renew) by the ids' texts (kept until the engine moves to
    /// [`renew`](Self::renew)).
    #[doc(hidden)]
    pub async fn renew_text(&self, ids: &[String], lease: Duration) -> Result<Vec<String>, StoreError> {
        self.renew_ids(ids.iter().map(String::as_str), lease).await
    }

    async fn renew_ids<'a>(
        &'a self,
        ids: impl ExactSizeIterator<Item = &'a str>,
        lease: Duration,
    ) -> Result<Vec<String>, StoreError> {
        const COMMAND: &str = "renew";
        if ids.len() == 0 {
            return Ok(Vec::new());
        }
        let generation = self.generation();
        let call = calls::renew(&self.keys, (lease, &generation), ids);
        self.store.invoke(COMMAND, &call.invocation(&scripts().renew)).await
    }

    /// After an outage: registers `adopt` (permits still in flight here) in the current wave
    /// with a fresh lease, drops `drop` (permits that finished during the outage), and
    /// charges the requests and tokens `usage` counts to the budgets (the day budgets from the
    /// latest start the usage's times allow: [`OutageUsage`]).
    pub async fn reconcile(
        &self,
        adopt: &[String],
        drop: &[String],
        lease: Duration,
        usage: OutageUsage,
    ) -> Result<Reconciled, StoreError> {
        self.reconcile_carrying(adopt, drop, lease, usage, None).await
    }

    /// [`reconcile`](Self::reconcile), carrying back the state and limit this process last saw
    /// in the store: if the store forgot its state (an empty restart, `FLUSHALL`, an
    /// eviction), a recovery in progress is put back
    /// ([`WaveMachine::carry_back`](wavegate_core::WaveMachine::carry_back)). The generation of
    /// the state it leaves is this gate's from now on.
    pub async fn reconcile_carrying(
        &self,
        adopt: &[String],
        drop: &[String],
        lease: Duration,
        usage: OutageUsage,
        carried: Option<(WaveState, u32)>,
    ) -> Result<Reconciled, StoreError> {
        const COMMAND: &str = "reconcile";
        let generation = self.generation();
        let mut call =
            calls::reconcile(&self.keys, &self.config_args, (adopt, drop), lease, usage, (carried, &generation));
        self.send_live(&mut call);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &call.invocation(&scripts().reconcile)).await?;
        let r = Reply::new(COMMAND, &reply);
        r.expect_len(6)?;
        self.learn_generation(r.string(5)?, true);
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
    /// the windows as kept, what is left now and their ends relative to now (an end of 0: no
    /// window runs; a refilled bucket's end: the time until it is full). The
    /// limits it announced are kept for the fleet too (`lua/learned_limit.lua`).
    pub async fn report_window(
        &self,
        id: &str,
        report: WindowReport,
        tokens_each: u64,
    ) -> Result<ProviderWindows, StoreError> {
        self.windows_call(calls::report_window(&self.keys, id, report, tokens_each, false)).await
    }

    /// Forgets the provider's windows kept for the fleet (an operator's clear, for a window a
    /// broken answer set): every process's next ask is granted as if no report had come.
    /// Returns the windows as kept afterwards (none running).
    pub async fn clear_windows(&self) -> Result<ProviderWindows, StoreError> {
        self.windows_call(calls::report_window(&self.keys, "", WindowReport::default(), 0, true)).await
    }

    async fn windows_call(&self, call: calls::Call<'_>) -> Result<ProviderWindows, StoreError> {
        const COMMAND: &str = "report_window";
        let reply: Vec<Value> = self.store.invoke(COMMAND, &call.invocation(&scripts().report_window)).await?;
        let r = Reply::new(COMMAND, &reply);
        r.expect_len(8)?;
        let window = |at: usize| -> Result<TrackedWindow, StoreError> {
            Ok(TrackedWindow { left: r.uint(at)?, until_ms: r.uint(at + 1)?, ..TrackedWindow::default() })
        };
        Ok(ProviderWindows {
            requests: window(0)?,
            tokens: window(2)?,
            input: window(4)?,
            output: window(6)?,
            sent: None,
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
        let mut call = calls::status(&self.keys, &self.config_args);
        self.send_live(&mut call);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &call.invocation(&scripts().status)).await?;
        calls::read_status(&reply)
    }
}
