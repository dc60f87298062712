//! The fleet's counts by class and tenant (`lua/fleet.lua`, and the permits' counts in
//! `lua/wave.lua`) on a real redis-server: kept up to date by the scripts as permits and
//! waiting members come and go (no recount on the way), and built again from the permits and
//! the members when they are deleted, unreadable, do not add up or are due, so that the
//! fleet-wide choice recovers.

use std::time::Duration;

use tokio::runtime::Runtime;
use wavegate_core::{Admission, DenyReason, OutageUsage, UpstreamConfig, WaveSignal};
use wavegate_redis::{ClassAsk, SharedGate, Store, StoreConfig};
use wavegate_testkit::RedisServer;

const LEASE: Duration = Duration::from_secs(30);

/// How old the counts may grow before they are built again (`PC_REBUILD` and
/// `WAITING_REBUILD` in `lua/fleet.lua`).
const PC_REBUILD_MS: u64 = 10_000;
const WAITING_REBUILD_MS: u64 = 5_000;

fn ask<'a>(class: &'a str, id: &'a str, waiting: u32) -> ClassAsk<'a> {
    ClassAsk { class, id, tokens: 0, waiting }
}

/// Three processes of upstream `name`, limit 2: `interactive` (weight 3) and `batch` (weight 1,
/// half the limit reserved).
struct Fleet {
    runtime: Runtime,
    server: RedisServer,
    alpha: SharedGate,
    beta: SharedGate,
    gamma: SharedGate,
}

impl Fleet {
    fn start() -> Self {
        let server = RedisServer::start().expect("redis-server");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
        let config = UpstreamConfig::builder("counts")
            .limit(2)
            .class("interactive", 3)
            .class("batch", 1)
            .reserve("batch", 50)
            .build()
            .expect("valid");
        let gate = |instance: &str| {
            SharedGate::with_budgets(store.clone(), config.name(), config.wave(), config.budgets())
                .with_classes(config.classes(), config.default_class(), config.class_count_window())
                .for_instance(instance)
        };
        let (alpha, beta, gamma) = (gate("alpha"), gate("beta"), gate("gamma"));
        Self { runtime, server, alpha, beta, gamma }
    }

    fn con(&self) -> redis::Connection {
        self.server.connection().expect("connection")
    }

    fn now_ms(&self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut self.con()).expect("TIME");
        secs * 1_000 + micros / 1_000
    }

    fn acquire(&self, gate: &SharedGate, class: &str, id: &str, waiting: u32) -> Admission {
        let (acquired, _) =
            self.runtime.block_on(gate.acquire_among(&[ask(class, id, waiting)], LEASE)).expect("acquire");
        acquired.admission
    }

    fn finish(&self, gate: &SharedGate, id: &str) -> Option<String> {
        let finished = self.runtime.block_on(gate.finish_text(id, 1, WaveSignal::Success, 0)).expect("finish");
        finished.wake.map(|instance| instance.as_str().to_owned())
    }

    /// alpha holds both permits (interactive); beta's batch caller and gamma's interactive
    /// caller wait.
    fn full_with_two_waiting(&self) {
        for n in 1..=2 {
            let admission = self.acquire(&self.alpha, "interactive", &format!("interactive|alpha:{n}|-"), 1);
            assert!(matches!(admission, Admission::Granted { .. }), "{admission:?}");
        }
        for (gate, class, id) in
            [(&self.beta, "batch", "batch|beta:1|-"), (&self.gamma, "interactive", "interactive|gamma:1|-")]
        {
            let admission = self.acquire(gate, class, id, 1);
            assert!(matches!(admission, Admission::Denied { reason: DenyReason::AtLimit, .. }), "{admission:?}");
        }
    }

    /// alpha ends a call: the free permit is batch's (below its reserve), whatever gamma's
    /// weight. Returns whom the release woke and whether gamma's ask right after it was granted.
    fn release_and_probe(&self) -> (Option<String>, bool) {
        let woken = self.finish(&self.alpha, "interactive|alpha:1|-");
        let gamma = self.acquire(&self.gamma, "interactive", "interactive|gamma:1|-", 1);
        (woken, matches!(gamma, Admission::Granted { .. }))
    }

    fn field(&self, key: &str, field: &str) -> Option<String> {
        redis::cmd("HGET").arg(key).arg(field).query(&mut self.con()).expect("HGET")
    }

    fn set_field(&self, key: &str, field: &str, value: &str) {
        let _: () = redis::cmd("HSET").arg(key).arg(field).arg(value).query(&mut self.con()).expect("HSET");
    }
}

/// A corruption of the waiting counts: (the fleet, Redis's time now, the counts' generation).
type Lie = dyn Fn(&Fleet, u64, &str);

/// The first field of a count's text: when it was built.
fn built(text: &str) -> &str {
    text.split(';').next().expect("a field")
}

#[test]
fn the_counts_follow_grants_waiters_and_releases_without_a_recount() {
    let fleet = Fleet::start();
    fleet.full_with_two_waiting();
    let keys = fleet.alpha.keys().clone();
    let pc = fleet.field(&keys.wave, "pc").expect("the permits' counts are built at the first choice");
    let waiting = fleet.field(&keys.waiting_demand, "#waiting").expect("the waiting counts too");
    assert!(pc.ends_with(";2;interactive|-=2;"), "{pc}");
    // '<built>;<cutoff>;<generation>;' then one entry per class and tenant: callers, since, members.
    let generation = waiting.split(';').nth(2).expect("generation").to_owned();
    assert!(waiting.contains(";batch|-=1:") && waiting.contains(";interactive|-=1:"), "{waiting}");
    let (woken, gamma_granted) = fleet.release_and_probe();
    assert_eq!(woken.as_deref(), Some("beta"));
    assert!(!gamma_granted, "the free permit is batch's");
    assert!(matches!(fleet.acquire(&fleet.beta, "batch", "batch|beta:1|-", 1), Admission::Granted { .. }));
    // A renewal that registers a permit the store lost keeps the counts too.
    let again = fleet.runtime.block_on(fleet.alpha.renew_text(&["interactive|alpha:9|-".to_owned()], LEASE));
    assert_eq!(again.expect("renew"), ["interactive|alpha:9|-"]);
    // Kept, not counted again: the same build time and generation, the right figures.
    let after = fleet.field(&keys.wave, "pc").expect("pc");
    assert_eq!(built(&after), built(&pc), "the permits were counted again: {pc} -> {after}");
    assert!(after.ends_with(";3;batch|-=1;interactive|-=2;"), "{after}");
    let waiting_after = fleet.field(&keys.waiting_demand, "#waiting").expect("#waiting");
    assert_eq!(waiting_after.split(';').nth(2), Some(generation.as_str()), "{waiting} -> {waiting_after}");
    assert_eq!(built(&waiting_after), built(&waiting), "the members were counted again");
    // Only gamma's interactive caller still waits.
    assert!(waiting_after.contains(";interactive|-=1:") && !waiting_after.contains("batch|"), "{waiting_after}");
    let order: Vec<String> =
        redis::cmd("ZRANGE").arg(&keys.waiting_order).arg(0).arg(-1).query(&mut fleet.con()).expect("ZRANGE");
    assert_eq!(order.len(), 1, "{order:?}");
    assert!(order[0].starts_with("interactive|-|") && order[0].ends_with("|gamma"), "{order:?}");
    let (_, classes) = fleet.runtime.block_on(fleet.alpha.status_with_classes()).expect("status");
    assert_eq!(classes, [(2, 1), (1, 0)]);
}

#[test]
fn a_process_that_stops_asking_for_a_class_stops_counting_there_at_its_next_ask() {
    let fleet = Fleet::start();
    fleet.full_with_two_waiting();
    // gamma's callers: one interactive, one batch (a caller of each class waits).
    let both = [ask("interactive", "interactive|gamma:1|-", 1), ask("batch", "batch|gamma:2|-", 1)];
    let (acquired, _) = fleet.runtime.block_on(fleet.gamma.acquire_among(&both, LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Denied { .. }), "{acquired:?}");
    let (_, classes) = fleet.runtime.block_on(fleet.alpha.status_with_classes()).expect("status");
    assert_eq!(classes, [(2, 1), (0, 2)]);
    // Its batch caller gave up: the same interactive ask as before, nothing else changed.
    assert!(matches!(fleet.acquire(&fleet.gamma, "interactive", "interactive|gamma:1|-", 1), Admission::Denied { .. }));
    let (_, classes) = fleet.runtime.block_on(fleet.alpha.status_with_classes()).expect("status");
    assert_eq!(classes, [(2, 1), (0, 1)]);
}

#[test]
fn a_lie_the_counts_cannot_see_misleads_the_choice_so_the_repairs_below_are_not_vacuous() {
    // Counts that add up and are fresh are believed: batch "holds" both permits.
    let fleet = Fleet::start();
    fleet.full_with_two_waiting();
    let keys = fleet.alpha.keys().clone();
    fleet.set_field(&keys.wave, "pc", &format!("{};2;batch|-=2;", fleet.now_ms()));
    let (woken, gamma_granted) = fleet.release_and_probe();
    assert_eq!(woken.as_deref(), Some("gamma"), "the release believed the lie");
    // The release took an interactive permit off a count of 0: clamped at 0, the counts no
    // longer add up, and the next read counts the permits again.
    assert!(!gamma_granted, "the lie outlived the release");
}

#[test]
fn deleted_unreadable_or_stale_permit_counts_are_built_again_and_the_choice_recovers() {
    let lies: [&dyn Fn(u64) -> Option<String>; 6] = [
        &|_| None,                                                    // deleted (FLUSHALL of the field, an eviction)
        &|_| Some("garbage".to_owned()),                              // unreadable
        &|now| Some(format!("{now};2;batch|-=-2;")),                  // a negative count
        &|now| Some(format!("{now};2;batch|-=999;")),                 // counts that do not add up
        &|now| Some(format!("{now};5;batch|-=5;")),                   // more than the permits held
        &|now| Some(format!("{};2;batch|-=2;", now - PC_REBUILD_MS)), // due: as old as the bound
    ];
    for (k, lie) in lies.iter().enumerate() {
        let fleet = Fleet::start();
        fleet.full_with_two_waiting();
        let keys = fleet.alpha.keys().clone();
        match lie(fleet.now_ms()) {
            Some(text) => fleet.set_field(&keys.wave, "pc", &text),
            None => {
                let _: () = redis::cmd("HDEL").arg(&keys.wave).arg("pc").query(&mut fleet.con()).expect("HDEL");
            }
        }
        let (woken, gamma_granted) = fleet.release_and_probe();
        assert_eq!(woken.as_deref(), Some("beta"), "lie {k}");
        assert!(!gamma_granted, "lie {k}: the permit went to interactive");
        let pc = fleet.field(&keys.wave, "pc").expect("built again");
        assert!(pc.ends_with(";1;interactive|-=1;"), "lie {k}: {pc}");
    }
}

#[test]
fn deleted_unreadable_or_stale_waiting_counts_are_built_again_and_the_choice_recovers() {
    // Each lie hides beta's waiting batch caller (or the order of the members).
    let lies: [&Lie; 5] = [
        &|f, _, generation| f.set_field(&f.alpha.keys().waiting_demand, "#waiting", &format!("0;0;{generation};")),
        &|f, _, _| {
            let _: () = redis::cmd("HDEL")
                .arg(&f.alpha.keys().waiting_demand)
                .arg("#waiting")
                .query(&mut f.con())
                .expect("HDEL");
        },
        &|f, _, _| f.set_field(&f.alpha.keys().waiting_demand, "#waiting", "1;2;x;batch|-=oops;"),
        &|f, now, generation| {
            let due = now - WAITING_REBUILD_MS;
            f.set_field(
                &f.alpha.keys().waiting_demand,
                "#waiting",
                &format!("{due};{due};{generation};interactive|-=1:{due}:1;"),
            );
        },
        // The members' order lost: the release finds fewer members than counted.
        &|f, _, _| {
            let _: () = redis::cmd("DEL").arg(&f.alpha.keys().waiting_order).query(&mut f.con()).expect("DEL");
        },
    ];
    for (k, lie) in lies.iter().enumerate() {
        let fleet = Fleet::start();
        fleet.full_with_two_waiting();
        let keys = fleet.alpha.keys().clone();
        let waiting = fleet.field(&keys.waiting_demand, "#waiting").expect("#waiting");
        let generation = waiting.split(';').nth(2).expect("generation").to_owned();
        // The first lie (built at 0) is also the oldest: it must not count.
        lie(&fleet, fleet.now_ms(), &generation);
        let (woken, gamma_granted) = fleet.release_and_probe();
        assert_eq!(woken.as_deref(), Some("beta"), "lie {k}");
        assert!(!gamma_granted, "lie {k}: the permit went to interactive");
        assert!(
            matches!(fleet.acquire(&fleet.beta, "batch", "batch|beta:1|-", 1), Admission::Granted { .. }),
            "lie {k}"
        );
    }
    // A fresh lie that adds up is believed until it is due (the bound the repair keeps).
    let fleet = Fleet::start();
    fleet.full_with_two_waiting();
    let keys = fleet.alpha.keys().clone();
    let waiting = fleet.field(&keys.waiting_demand, "#waiting").expect("#waiting");
    let (cutoff, generation) = {
        let mut parts = waiting.split(';').skip(1);
        (parts.next().expect("cutoff").to_owned(), parts.next().expect("generation").to_owned())
    };
    let now = fleet.now_ms();
    fleet.set_field(&keys.waiting_demand, "#waiting", &format!("{now};{cutoff};{generation};interactive|-=1:{now}:1;"));
    let (woken, gamma_granted) = fleet.release_and_probe();
    assert_eq!(woken.as_deref(), Some("gamma"));
    assert!(gamma_granted);
}

#[test]
fn after_a_flushall_the_counts_start_again_from_what_the_processes_register() {
    let fleet = Fleet::start();
    fleet.full_with_two_waiting();
    let _: () = redis::cmd("FLUSHALL").query(&mut fleet.con()).expect("FLUSHALL");
    // Each process reconciles (registers the permits it holds) and asks again.
    let adopt = ["interactive|alpha:1|-".to_owned(), "interactive|alpha:2|-".to_owned()];
    for gate in [&fleet.alpha, &fleet.beta, &fleet.gamma] {
        let held: &[String] = if std::ptr::eq(gate, &fleet.alpha) { &adopt } else { &[] };
        fleet.runtime.block_on(gate.reconcile(held, &[], LEASE, OutageUsage::NONE)).expect("reconcile");
    }
    for (gate, class, id) in
        [(&fleet.beta, "batch", "batch|beta:1|-"), (&fleet.gamma, "interactive", "interactive|gamma:1|-")]
    {
        let admission = fleet.acquire(gate, class, id, 1);
        assert!(matches!(admission, Admission::Denied { reason: DenyReason::AtLimit, .. }), "{admission:?}");
    }
    let (woken, gamma_granted) = fleet.release_and_probe();
    assert_eq!(woken.as_deref(), Some("beta"));
    assert!(!gamma_granted);
}
