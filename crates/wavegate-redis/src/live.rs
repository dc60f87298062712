//! An upstream's live settings in the store (`lua/live.lua`): read by every process about once
//! a second, changed by an operator (the `Upstream` handle, the `wavegate` tool).
//!
//! The settings sit in one hash per upstream (`…:{upstream}:live`) with an epoch and a
//! version ([`LiveStamp`]). A process sends the epoch and version it applied; the script
//! answers the settings only when either differs, so the look each process takes every second
//! is one small script call. The epoch is new whenever the store lost the hash (`FLUSHALL`, an
//! eviction, an empty restart) and the versions started over, so a version seen before the
//! loss is never taken for one seen after it. A change
//! also announces itself on the fleet's channel of live changes (the upstream's name on
//! [`UpstreamKeys::changes`](crate::UpstreamKeys::changes)), so processes look at once rather
//! than at their next second.
//!
//! A live limit reaches the wave's scripts as the base limit each process sends them
//! ([`SharedGate::set_live`]); their `rebase` (`lua/wave.lua`) keeps what the wave learned
//! below it. A live rate reaches them as its budget's rate, and their `rebudget` keeps the
//! units each budget holds.

use std::num::NonZeroU32;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;
use wavegate_core::{LiveChange, LiveSetting, LiveSettings, LiveStamp, LiveValue, QUOTA_SPENT, duration_ms};

use crate::calls::{CONFIG_ARGS, Call, Reply};
use crate::error::StoreError;
use crate::scripts::scripts;
use crate::shared_gate::SharedGate;
use crate::shared_gate::classes_arg;

/// The field of the live settings that marks the last fleet-wide reset of a spent quota.
const QUOTA_RESET: &str = "quota_reset";

/// `live.lua`, reading: the epoch and version the process applied (`None`: none yet; an
/// epoch of 0 is sent as none).
pub(crate) fn read<'a>(key: &'a str, known: Option<LiveStamp>) -> Call<'a> {
    let epoch = known.map(|k| k.epoch).filter(|e| *e != 0).map(|e| e.to_string()).unwrap_or_default();
    Call::new(&[key]).arg("read").arg(epoch).arg(known.map(|k| k.version.to_string()).unwrap_or_default())
}

/// `live.lua`, changing: set or clear a setting, announced on `channel`.
pub(crate) fn change<'a>(key: &'a str, change: &LiveChange, channel: &'a str) -> Call<'a> {
    let call = Call::new(&[key]);
    match change.value() {
        Some((value, ttl)) => {
            call.arg("set").arg(change.name()).arg(value).arg(ttl.map_or(0, duration_ms)).arg(channel)
        }
        None => call.arg("clear").arg(change.name()).arg("").arg("").arg(channel),
    }
}

/// Reads a `read` reply: `None` when its epoch and version are `known`. An epoch or a version
/// that is not a count up to [`LiveStamp::MAX`] is an unexpected reply.
pub(crate) fn read_reply(reply: &[Value], known: Option<LiveStamp>) -> Result<Option<LiveSettings>, StoreError> {
    const COMMAND: &str = "live";
    let r = Reply::new(COMMAND, reply);
    let epoch = r.string(0)?;
    let epoch = match epoch.as_str() {
        "" => 0,
        digits => digits
            .parse::<u64>()
            .ok()
            .filter(|e| (1..=LiveStamp::MAX).contains(e))
            .filter(|_| digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0'))
            .ok_or_else(|| {
                let shown: String = digits.chars().take(40).collect();
                StoreError::unexpected(COMMAND, format!("epoch {shown:?} is not a count"))
            })?,
    };
    let version = r.uint(1)?;
    if version > LiveStamp::MAX {
        return Err(StoreError::unexpected(COMMAND, format!("version {version}")));
    }
    let stamp = LiveStamp { epoch, version };
    if known == Some(stamp) && reply.len() == 2 {
        return Ok(None);
    }
    if reply.len() % 3 != 2 {
        return Err(StoreError::unexpected(COMMAND, format!("{} fields, not 2 + 3 per setting", reply.len())));
    }
    let mut settings = LiveSettings::empty(version).in_epoch(epoch);
    for at in (2..reply.len()).step_by(3) {
        let name = r.string(at)?;
        let value: u64 = r
            .string(at + 1)?
            .parse()
            .map_err(|_| StoreError::unexpected(COMMAND, format!("{name} is not a number")))?;
        let remaining = u64::try_from(r.int(at + 2)?).ok().map(Duration::from_millis);
        // A setting this build does not know (a newer tool's) is not this process's to apply.
        settings = settings.with_named(&name, LiveValue { value, remaining });
    }
    Ok(Some(settings))
}

impl SharedGate {
    /// The upstream's live settings, when their epoch and version are not `known` (the ones
    /// this process applied, [`LiveSettings::stamp`]; `None` reads them whatever their
    /// version). An override whose time is up is dropped by this read (for the fleet) and the
    /// settings come back without it. After the store lost them (`FLUSHALL`, an empty
    /// restart) they come back in another epoch — empty until a change is made — whatever
    /// their version.
    pub async fn live(&self, known: Option<LiveStamp>) -> Result<Option<LiveSettings>, StoreError> {
        const COMMAND: &str = "live";
        let call = read(&self.keys.live, known);
        let reply: Vec<Value> = self.store.invoke(COMMAND, &call.invocation(&scripts().live)).await?;
        read_reply(&reply, known)
    }

    /// Stores `change` for the fleet and announces it; answers the new version.
    pub async fn change_live(&self, change: &LiveChange) -> Result<u64, StoreError> {
        const COMMAND: &str = "live";
        let call = self::change(&self.keys.live, change, &self.keys.changes);
        let version: i64 = self.store.invoke(COMMAND, &call.invocation(&scripts().live)).await?;
        u64::try_from(version).map_err(|_| StoreError::unexpected(COMMAND, format!("version {version}")))
    }

    /// Tells the fleet the upstream's quota is spent: every process refuses it for `pause`
    /// (announced: at once; else within its next look at the live settings), until the pause
    /// ends or an operator's [`reset_quota_fleet`](Self::reset_quota_fleet). Answers the new
    /// version.
    pub async fn spend_quota_fleet(&self, pause: Duration) -> Result<u64, StoreError> {
        const COMMAND: &str = "live";
        let ttl = duration_ms(pause).clamp(1, duration_ms(LiveChange::MAX_TTL));
        let call = Call::new(&[&self.keys.live]).arg("set").arg(QUOTA_SPENT).arg(1).arg(ttl).arg(&self.keys.changes);
        let version: i64 = self.store.invoke(COMMAND, &call.invocation(&scripts().live)).await?;
        u64::try_from(version).map_err(|_| StoreError::unexpected(COMMAND, format!("version {version}")))
    }

    /// Lifts every process's refusal of the upstream for a spent quota (an operator's reset,
    /// fleet-wide): the spent quota told to the fleet is dropped, and a new mark `marker` (any
    /// positive number other than the last, e.g. the time) set in the live settings, which
    /// each process applies within a second. Answers the new version.
    pub async fn reset_quota_fleet(&self, marker: u64) -> Result<u64, StoreError> {
        const COMMAND: &str = "live";
        let clear = Call::new(&[&self.keys.live]).arg("clear").arg(QUOTA_SPENT).arg("").arg("").arg(&self.keys.changes);
        let _: i64 = self.store.invoke(COMMAND, &clear.invocation(&scripts().live)).await?;
        let call =
            Call::new(&[&self.keys.live]).arg("set").arg(QUOTA_RESET).arg(marker.max(1)).arg(0).arg(&self.keys.changes);
        let version: i64 = self.store.invoke(COMMAND, &call.invocation(&scripts().live)).await?;
        u64::try_from(version).map_err(|_| StoreError::unexpected(COMMAND, format!("version {version}")))
    }

    /// Sends the scripts `settings`' live values from now on, for this gate and its clones: the
    /// live limit as the base limit, a live rate or burst as its budget's (only for a budget
    /// the gate is configured with); what `settings` leaves unset, as configured.
    pub fn set_live(&self, settings: &LiveSettings) {
        for (slot, (_, setting)) in self.live_args.iter().zip(LIVE_ARGS) {
            slot.store(settings.get_u32(setting).map_or(0, NonZeroU32::get), Ordering::Relaxed);
        }
        // The classes' live weights and reserves, rendered as the classes' argument when they
        // fit the configured classes (the same rule as the processes': LiveSettings::apply_to).
        let classes = self.class_config.as_ref().and_then(|config| {
            let (classes, default, window) = &**config;
            settings.classes_applied(classes).map(|applied| classes_arg(&applied, *default, *window))
        });
        *self.live_classes.lock().unwrap_or_else(PoisonError::into_inner) = classes;
    }

    /// The live limit this gate sends, if one is set.
    pub fn live_limit(&self) -> Option<NonZeroU32> {
        self.live_values().find(|(field, _)| *field == 0).map(|(_, value)| value)
    }

    /// The live values this gate sends now: (the configuration argument each replaces, the
    /// value). A rate for a budget the gate is not configured with (`"0"`) is not sent.
    pub(crate) fn live_values(&self) -> impl Iterator<Item = (usize, NonZeroU32)> + '_ {
        self.live_args.iter().zip(LIVE_ARGS).filter_map(|(slot, (field, _))| {
            let value = NonZeroU32::new(slot.load(Ordering::Relaxed))?;
            (self.config_args[field] != "0").then_some((field, value))
        })
    }

    /// The classes' argument with their live weights and reserves, when any is in force.
    fn live_classes(&self) -> Option<String> {
        self.live_classes.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Which of the configuration's arguments (by index) hold a live value now.
    pub(crate) fn live_fields(&self) -> Vec<usize> {
        let classes = self.live_classes().map(|_| CONFIG_ARGS - 1);
        self.live_values().map(|(field, _)| field).chain(classes).collect()
    }

    /// Puts the live values, if any, in `call`'s configuration arguments (which come first).
    pub(crate) fn send_live(&self, call: &mut Call<'_>) {
        for (field, value) in self.live_values() {
            if let Some(arg) = call.args.get_mut(field) {
                *arg = value.get().to_string().into();
            }
        }
        if let (Some(classes), Some(arg)) = (self.live_classes(), call.args.get_mut(CONFIG_ARGS - 1)) {
            *arg = classes.into();
        }
    }
}

/// The configuration arguments a live value replaces (`read_config` in `lua/wave.lua`): the
/// base limit, the requests budget's rate and burst, the tokens budget's (a rate or burst of
/// `"0"`, no budget, is never replaced: a live value changes a budget, it does not make one).
pub(crate) const LIVE_ARGS: [(usize, LiveSetting); 5] = [
    (0, LiveSetting::Limit),
    (5, LiveSetting::RequestsPerMinute),
    (6, LiveSetting::RequestsBurst),
    (7, LiveSetting::TokensPerMinute),
    (8, LiveSetting::TokensBurst),
];

#[cfg(test)]
mod tests {
    use wavegate_core::{UpstreamConfig, UpstreamName};
    use wavegate_testkit::RedisServer;

    use super::*;
    use crate::connection::{Store, StoreConfig};

    #[test]
    fn the_script_takes_what_the_rust_side_sends_and_refuses_one_more() {
        let server = RedisServer::start().expect("redis-server");
        let mut con = server.connection().expect("connection");
        let script = &scripts().live;
        let set = LiveChange::set(LiveSetting::Limit, 3, Some(Duration::from_secs(5))).expect("valid");
        for call in [
            read("k", Some(LiveStamp { epoch: 1_764_000_000_000_000, version: 2 })),
            read("k", None),
            change("k", &set, "ch"),
            change("k", &LiveChange::Clear(LiveSetting::Limit), "ch"),
        ] {
            assert!(call.invocation(script).invoke::<Value>(&mut con).is_ok(), "{call:?}");
            let mut more = call.clone();
            more.args.push("0".into());
            let refused = more.invocation(script).invoke::<Value>(&mut con);
            assert!(matches!(&refused, Err(e) if e.to_string().contains("expected")), "{refused:?}");
        }
    }

    #[test]
    fn a_change_is_versioned_read_once_and_an_override_reverts_for_the_fleet() {
        let server = RedisServer::start().expect("redis-server");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
        let config = UpstreamConfig::builder("live").limit(10).build().expect("valid");
        let one = SharedGate::for_upstream(store.clone(), &config);
        let other = SharedGate::for_upstream(store, &config);
        runtime.block_on(async {
            assert_eq!(one.live(None).await.expect("read"), Some(LiveSettings::empty(0)));
            let nothing = Some(LiveStamp::default());
            assert_eq!(one.live(nothing).await.expect("read"), None, "nothing new");
            let brief = LiveChange::set(LiveSetting::Limit, 4, Some(Duration::from_millis(300))).expect("valid");
            assert_eq!(one.change_live(&brief).await.expect("set"), 1);
            let seen = other.live(nothing).await.expect("read").expect("a new version");
            assert_eq!(seen.version, 1);
            assert_ne!(seen.epoch, 0, "an epoch is written with the first version");
            let at = |version| Some(LiveStamp { epoch: seen.epoch, version });
            let in_epoch = |version| Some(LiveSettings::empty(version).in_epoch(seen.epoch));
            let limit = seen.limit.expect("a live limit");
            assert_eq!(limit.value, 4);
            assert!(limit.remaining.is_some_and(|r| r <= Duration::from_millis(300)), "{limit:?}");
            assert_eq!(other.live(at(1)).await.expect("read"), None);
            tokio::time::sleep(Duration::from_millis(350)).await;
            // The first look after the end reverts it, under a new version, for everyone.
            assert_eq!(other.live(at(1)).await.expect("read"), in_epoch(2));
            assert_eq!(one.live(at(1)).await.expect("read"), in_epoch(2));
            assert_eq!(one.live(at(2)).await.expect("read"), None);
            let kept = LiveChange::set(LiveSetting::Limit, 7, None).expect("valid");
            assert_eq!(one.change_live(&kept).await.expect("set"), 3);
            let seen = other.live(at(2)).await.expect("read").expect("new");
            assert_eq!(seen.limit, Some(LiveValue { value: 7, remaining: None }));
            assert_eq!(one.change_live(&LiveChange::Clear(LiveSetting::Limit)).await.expect("clear"), 4);
            assert_eq!(other.live(at(3)).await.expect("read"), in_epoch(4));
            // Two versions: the spent quota told to the fleet is dropped, then the mark is set.
            assert_eq!(one.reset_quota_fleet(77).await.expect("reset"), 6);
            let seen = other.live(at(4)).await.expect("read").expect("new");
            assert_eq!((seen.quota_reset, seen.limit), (Some(77), None));
            // Another version of another epoch is new; the same version of another epoch too.
            assert!(other.live(Some(LiveStamp { epoch: 1, version: 6 })).await.expect("read").is_some());
        });
    }

    /// After `FLUSHALL` the versions start over: the settings come back empty (in no epoch),
    /// then a change made since, whose version is one a process applied before, is new to it
    /// (another epoch). A hash written by a build without epochs gets one at its next change.
    #[test]
    fn a_flushed_store_starts_a_new_epoch_so_an_old_version_is_never_taken_for_a_new_one() {
        let server = RedisServer::start().expect("redis-server");
        let mut con = server.connection().expect("connection");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
        let config = UpstreamConfig::builder("flushed").limit(10).build().expect("valid");
        let gate = SharedGate::for_upstream(store, &config);
        let limit = |value, ttl| LiveChange::set(LiveSetting::Limit, value, ttl).expect("valid");
        let applied = runtime.block_on(async {
            gate.change_live(&limit(3, None)).await.expect("set");
            gate.change_live(&limit(5, Some(Duration::from_secs(60)))).await.expect("override");
            gate.live(None).await.expect("read").expect("settings")
        });
        assert_eq!((applied.version, applied.limit.map(|l| l.value)), (2, Some(5)));
        redis::cmd("FLUSHALL").exec(&mut con).expect("FLUSHALL");
        runtime.block_on(async {
            // Nothing set since: the settings are gone, and say so whatever the version applied.
            let gone = gate.live(Some(applied.stamp())).await.expect("read");
            assert_eq!(gone, Some(LiveSettings::empty(0)), "back to the configured values");
            // Two changes since: version 2 again, in a new epoch.
            gate.change_live(&limit(3, None)).await.expect("set");
            assert_eq!(gate.change_live(&limit(6, Some(Duration::from_secs(60)))).await.expect("override"), 2);
            let seen = gate.live(Some(applied.stamp())).await.expect("read").expect("new to a process at version 2");
            assert_eq!((seen.version, seen.limit.map(|l| l.value)), (2, Some(6)));
            assert!(seen.epoch > applied.epoch, "{} after {}", seen.epoch, applied.epoch);
            assert_eq!(gate.live(Some(seen.stamp())).await.expect("read"), None);
        });
        // A hash without an epoch (a build before them): its next change writes one.
        let key = gate.keys.live.clone();
        redis::cmd("DEL").arg(&key).exec(&mut con).expect("DEL");
        redis::cmd("HSET").arg(&key).arg("version").arg(5).arg("limit").arg(4).exec(&mut con).expect("HSET");
        runtime.block_on(async {
            let old = gate.live(None).await.expect("read").expect("settings");
            assert_eq!((old.epoch, old.version, old.limit.map(|l| l.value)), (0, 5, Some(4)));
            assert_eq!(gate.live(Some(old.stamp())).await.expect("read"), None);
            assert_eq!(gate.change_live(&limit(7, None)).await.expect("set"), 6);
            let seen = gate.live(Some(old.stamp())).await.expect("read").expect("new");
            assert!(seen.epoch != 0 && seen.version == 6, "{seen:?}");
        });
        // What the hash should not hold is refused, by the script and by the Rust side.
        for (field, value) in [("epoch", "12ab"), ("epoch", "0"), ("epoch", "99999999999999999"), ("version", "-1")] {
            redis::cmd("DEL").arg(&key).exec(&mut con).expect("DEL");
            redis::cmd("HSET").arg(&key).arg(field).arg(value).exec(&mut con).expect("HSET");
            let read = runtime.block_on(gate.live(None));
            assert!(matches!(&read, Err(e) if e.to_string().contains("not a count")), "{field} {value}: {read:?}");
            let set = runtime.block_on(gate.change_live(&limit(3, None)));
            assert!(set.is_err(), "{field} {value}: {set:?}");
        }
        let epoch_setting = Call::new(&[&key]).arg("set").arg("epoch").arg(1).arg(0).arg("ch");
        let refused = epoch_setting.invocation(&scripts().live).invoke::<Value>(&mut con);
        assert!(matches!(&refused, Err(e) if e.to_string().contains("bad setting")), "{refused:?}");
    }

    #[test]
    fn a_reply_out_of_bounds_is_unexpected_never_a_panic() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let max = i64::try_from(LiveStamp::MAX).expect("fits");
        let bad: [Vec<Value>; 9] = [
            vec![],
            vec![bulk("")],
            vec![bulk("12x"), Value::Int(1)],
            vec![bulk("+12"), Value::Int(1)],
            vec![bulk("012"), Value::Int(1)],
            vec![bulk("99999999999999999999999"), Value::Int(1)],
            vec![bulk(""), Value::Int(-1)],
            vec![bulk("1"), Value::Int(max + 1)],
            vec![bulk("1"), Value::Int(1), bulk("limit")],
        ];
        for reply in bad {
            let read = read_reply(&reply, None);
            assert!(matches!(read, Err(StoreError::UnexpectedReply { .. })), "{reply:?}: {read:?}");
        }
        let top = LiveStamp { epoch: LiveStamp::MAX, version: LiveStamp::MAX };
        let reply = [bulk(&LiveStamp::MAX.to_string()), Value::Int(max)];
        assert_eq!(read_reply(&reply, Some(top)).expect("in bounds"), None);
        let read = read_reply(&reply, None).expect("in bounds").expect("settings");
        assert_eq!(read.stamp(), top);
    }

    /// A live rate's change keeps the units the budget holds, in both twins: `rebudget` in
    /// the scripts, `LocalGate::set_budgets` in process.
    #[test]
    fn a_changed_rate_keeps_the_units_held_in_both_twins() {
        use wavegate_core::{Ask, Instance, LocalGate, PermitId};
        let server = RedisServer::start().expect("redis-server");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
        let config = UpstreamConfig::builder("rated").limit(100).requests_per_minute(60, 10).build().expect("valid");
        let gate = SharedGate::for_upstream(store, &config).for_instance("alpha");
        let mut local = LocalGate::for_upstream(&config);
        let me = Instance::new("alpha").expect("valid");
        let lease = Duration::from_secs(30);
        // Seven of the ten spent in both.
        for n in 0..7 {
            let ask = [Ask { id: PermitId::new(None, &me, n, None), tokens: 0, output: 0, waiting: 1 }];
            runtime.block_on(gate.acquire(&ask, lease)).expect("acquire");
            local.acquire(&me, &ask, 30_000, 0);
        }
        let shared_left = || runtime.block_on(gate.status()).expect("status").budgets.requests.expect("a budget");
        assert_eq!(shared_left().0, 3);
        assert_eq!(local.budget_status(0).requests.map(|r| r.0), Some(3));
        for (per_minute, left) in [(120, 3), (30, 3), (90, 3), (60, 3)] {
            let settings = LiveSettings::empty(1)
                .with(LiveSetting::RequestsPerMinute, LiveValue { value: per_minute, remaining: None });
            gate.set_live(&settings);
            local.set_budgets(settings.apply_to(&config).budgets(), 0);
            // The seven spent stay spent at every rate (within the few ms the test takes, a
            // budget of 10 at these rates refills less than one).
            assert_eq!(shared_left().0, left, "the store at {per_minute} a minute");
            assert_eq!(local.budget_status(0).requests.map(|r| r.0), Some(left), "in process at {per_minute}");
        }
    }

    #[test]
    fn a_live_limit_is_the_base_the_scripts_are_sent() {
        let server = RedisServer::start().expect("redis-server");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
        let name = UpstreamName::new("based").expect("valid");
        let config = UpstreamConfig::builder(name.as_str()).limit(10).build().expect("valid");
        let gate = SharedGate::for_upstream(store, &config);
        let clone = gate.clone();
        let three = LiveSettings::empty(1).with(LiveSetting::Limit, LiveValue { value: 3, remaining: None });
        // A rate for a budget it does not have is not sent (the script would refuse a rate
        // without a burst).
        let rpm = three.with(LiveSetting::RequestsPerMinute, LiveValue { value: 60, remaining: None });
        gate.set_live(&rpm);
        runtime.block_on(async {
            assert_eq!(clone.status().await.expect("status").limit, 3, "clones send it too");
            gate.set_live(&LiveSettings::empty(2));
            assert_eq!(clone.status().await.expect("status").limit, 10);
        });
    }
}
