//! Redis Cluster (feature `cluster`): upstreams on different masters, their limits shared
//! through the cluster client, a slot moved under a running scheduler (`MOVED` followed), and
//! one master lost under load: only its upstreams fall back.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use wavegate::{Error, ErrorKind, Mode, Scheduler, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, RedisCluster, http_get};

/// One upstream name per master: the first of `u0`, `u1`, … whose keys each master serves.
fn one_upstream_per_master(cluster: &RedisCluster) -> Vec<String> {
    let mut names = vec![String::new(); 3];
    for i in 0..200 {
        let name = format!("u{i}");
        let node = cluster.node_of(&format!("wavegate:{{{name}}}:permits")).expect("slot owner");
        if names[node].is_empty() {
            names[node] = name;
        }
        if names.iter().all(|n| !n.is_empty()) {
            return names;
        }
    }
    panic!("no spread over the masters: {names:?}");
}

fn upstream(name: &str) -> UpstreamConfig {
    UpstreamConfig::builder(name)
        .limit(2)
        .renewed_lease(Duration::from_secs(3))
        .max_wait(Duration::from_millis(300))
        .build()
        .expect("config")
}

fn held_on(cluster: &mut RedisCluster, node: usize, upstream: &str) -> usize {
    let mut con = cluster.nodes()[node].connection().expect("node");
    redis::cmd("ZCARD").arg(format!("wavegate:{{{upstream}}}:permits")).query(&mut con).expect("ZCARD")
}

fn scheduler(cluster: &RedisCluster, names: &[String]) -> Scheduler {
    let mut builder = Scheduler::builder().redis_cluster(cluster.urls());
    for name in names {
        builder = builder.upstream(upstream(name));
    }
    builder.build().expect("scheduler on the cluster")
}

#[actix::test]
async fn upstreams_on_three_masters_share_their_limits() {
    let mut cluster = RedisCluster::start(3).expect("a 3-master cluster");
    let names = one_upstream_per_master(&cluster);
    let (a, b) = (scheduler(&cluster, &names), scheduler(&cluster, &names));
    assert_eq!(a.store_health().expect("store").topology, "cluster");
    let mut held = Vec::new();
    for name in &names {
        held.push(a.upstream(name).expect("configured").request().acquire().await.expect("permit"));
        held.push(a.upstream(name).expect("configured").request().acquire().await.expect("permit"));
        // The limit (2) is shared: the other scheduler waits and gives up.
        let refused = b.upstream(name).expect("configured").request().acquire().await;
        assert_eq!(refused.as_ref().map_err(Error::kind).err(), Some(ErrorKind::WaitedTooLong), "{name}: {refused:?}");
    }
    for (node, name) in names.iter().enumerate() {
        assert_eq!(held_on(&mut cluster, node, name), 2, "{name}'s permits live on master {node}");
    }
    // A release on one scheduler lets the other in (woken through the cluster's pub/sub).
    let name = names[1].clone();
    let waiter = {
        let b = b.clone();
        actix::spawn(
            async move { b.upstream(&name).expect("configured").request().acquire().await.map(|p| p.succeeded()) },
        )
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.clear();
    waiter.await.expect("task").expect("the waiter gets a released permit");
    assert_eq!((a.mode().await.expect("mode"), b.mode().await.expect("mode")), (Mode::Shared, Mode::Shared));
}

#[actix::test]
async fn a_slot_moved_to_another_master_is_followed() {
    let mut cluster = RedisCluster::start(3).expect("a 3-master cluster");
    let names = one_upstream_per_master(&cluster);
    let scheduler = scheduler(&cluster, &names);
    let name = &names[0];
    let held = scheduler.upstream(name).expect("configured").request().acquire().await.expect("permit");
    assert_eq!(held_on(&mut cluster, 0, name), 1);

    // Move the upstream's slot (and its keys) from master 0 to master 1, as a resharding does.
    let key = format!("wavegate:{{{name}}}:permits");
    let id = |cluster: &mut RedisCluster, node: usize| -> String {
        let mut con = cluster.nodes()[node].connection().expect("node");
        redis::cmd("CLUSTER").arg("MYID").query(&mut con).expect("MYID")
    };
    let (from, to) = (id(&mut cluster, 0), id(&mut cluster, 1));
    let mut source = cluster.nodes()[0].connection().expect("source");
    let mut target = cluster.nodes()[1].connection().expect("target");
    let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key).query(&mut source).expect("KEYSLOT");
    redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("IMPORTING").arg(&from).exec(&mut target).expect("IMPORTING");
    redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("MIGRATING").arg(&to).exec(&mut source).expect("MIGRATING");
    let keys: Vec<String> =
        redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100).query(&mut source).expect("GETKEYSINSLOT");
    assert!(!keys.is_empty());
    let port = cluster.nodes()[1].port();
    let mut migrate = redis::cmd("MIGRATE");
    migrate.arg("127.0.0.1").arg(port).arg("").arg(0).arg(5000).arg("KEYS");
    for key in &keys {
        migrate.arg(key);
    }
    migrate.exec(&mut source).expect("MIGRATE");
    for node in 0..3 {
        let mut con = cluster.nodes()[node].connection().expect("node");
        redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("NODE").arg(&to).exec(&mut con).expect("SETSLOT NODE");
    }

    // The client still thinks master 0 serves the slot: its next command is answered MOVED.
    let second =
        scheduler.upstream(name).expect("configured").request().acquire().await.expect("a permit after the move");
    assert_eq!(held_on(&mut cluster, 1, name), 2, "both permits are on the new master");
    let mut old = cluster.nodes()[0].connection().expect("node");
    let moved = redis::cmd("ZCARD").arg(&key).query::<usize>(&mut old).expect_err("the old master redirects");
    assert_eq!(moved.code(), Some("MOVED"), "{moved}");
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared, "a redirect is not an outage");
    held.succeeded();
    second.succeeded();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(held_on(&mut cluster, 1, name), 0);
}

/// `per_master` upstream names per master: the first of `u0`, `u1`, … whose keys each serves.
fn upstreams_per_master(cluster: &RedisCluster, per_master: usize) -> Vec<Vec<String>> {
    let mut names = vec![Vec::new(); 3];
    for i in 0..1_000 {
        let name = format!("u{i}");
        let node = cluster.node_of(&format!("wavegate:{{{name}}}:permits")).expect("slot owner");
        if names[node].len() < per_master {
            names[node].push(name);
        }
        if names.iter().all(|n| n.len() == per_master) {
            return names;
        }
    }
    panic!("no spread over the masters: {names:?}");
}

/// The limit of each upstream in the outage test: two schedulers, so a fallback share of 2.
const LIMIT: u32 = 4;

/// Losing one master under load from two schedulers: only the upstreams whose slots it serves
/// fall back (the others stay shared the whole time and keep sharing their limit); once it is
/// restarted (empty) its upstreams reconcile — a permit held through the outage is registered
/// on it again — and share again. No call fails. The master killed is the one that holds the
/// instances key, so the heartbeats are lost too and must not switch the others.
#[actix::test]
async fn losing_one_master_puts_only_its_upstreams_in_fallback() {
    let mut cluster = RedisCluster::start(3).expect("a 3-master cluster");
    let by_master = upstreams_per_master(&cluster, 2);
    let victim = cluster.node_of("wavegate:instances").expect("the instances key's master");
    let names: Vec<String> = by_master.iter().flatten().cloned().collect();
    let lost: HashSet<String> = by_master[victim].iter().cloned().collect();
    let config = |name: &str| {
        UpstreamConfig::builder(name)
            .limit(LIMIT)
            .renewed_lease(Duration::from_secs(3))
            .max_wait(Duration::from_secs(10))
            .build()
            .expect("config")
    };
    let build = || {
        let mut builder = Scheduler::builder().redis_cluster(cluster.urls());
        for name in &names {
            builder = builder.upstream(config(name));
        }
        builder.build().expect("scheduler on the cluster")
    };
    let schedulers = [build(), build()];
    // One mock per upstream: its max in flight is the upstream's, across both schedulers.
    let mocks: Vec<MockUpstream> = names
        .iter()
        .map(|_| {
            MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(20), ..Default::default() })
                .expect("mock")
        })
        .collect();
    let held = schedulers[0]
        .upstream(&by_master[victim][0])
        .expect("configured")
        .request()
        .acquire()
        .await
        .expect("a permit held through the outage");
    // Both processes heartbeat (each counts 2 live) before the load starts.
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let stop = Rc::new(Cell::new(false));
    let (calls, failed) = (Rc::new(Cell::new(0u64)), Rc::new(RefCell::new(Vec::new())));
    let mut tasks = Vec::new();
    for scheduler in &schedulers {
        for (index, name) in names.iter().enumerate() {
            for _ in 0..4 {
                let handle = scheduler.upstream(name).expect("configured");
                let addr = mocks[index].addr();
                let (stop, calls, failed) = (stop.clone(), calls.clone(), failed.clone());
                let name = name.clone();
                tasks.push(actix::spawn(async move {
                    while !stop.get() {
                        let reply = handle.request().call(|_| http_get(addr, "/", Duration::from_secs(5))).await;
                        calls.set(calls.get() + 1);
                        match reply {
                            Ok(reply) if reply.status == 200 => {}
                            other => failed.borrow_mut().push(format!("{name}: {other:?}")),
                        }
                    }
                }));
            }
        }
    }
    // Every 10 ms, each upstream's mode on both schedulers: the survivors' must never leave
    // shared mode; record when the lost master's upstreams fall back and share again.
    let modes_seen: Rc<RefCell<Vec<(Instant, String, Mode)>>> = Rc::default();
    let watcher = {
        let (schedulers, names, stop, seen) = (schedulers.clone(), names.clone(), stop.clone(), modes_seen.clone());
        actix::spawn(async move {
            let mut last = vec![Mode::Shared; names.len() * 2];
            while !stop.get() {
                for (s, scheduler) in schedulers.iter().enumerate() {
                    for (u, name) in names.iter().enumerate() {
                        let mode = scheduler.upstream(name).expect("configured").mode().await.expect("mode");
                        if mode != last[s * names.len() + u] {
                            last[s * names.len() + u] = mode;
                            seen.borrow_mut().push((Instant::now(), format!("{s}/{name}"), mode));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let wait_for = |want: Mode| {
        let schedulers = schedulers.clone();
        let lost = lost.clone();
        async move {
            let started = Instant::now();
            loop {
                let mut all = true;
                for scheduler in &schedulers {
                    for name in &lost {
                        all &= scheduler.upstream(name).expect("configured").mode().await.expect("mode") == want;
                    }
                }
                if all {
                    return started.elapsed();
                }
                assert!(started.elapsed() < Duration::from_secs(10), "the lost master's upstreams not {want} in 10 s");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let before_kill = calls.get();

    cluster.nodes()[victim].kill().expect("kill -9 the master");
    let to_fallback = wait_for(Mode::Fallback).await;
    assert_eq!(schedulers[0].mode().await.expect("mode"), Mode::Fallback, "the process reports its least shared mode");
    for status in schedulers[0].statuses().await.expect("statuses") {
        let want = if lost.contains(&status.upstream) { Mode::Fallback } else { Mode::Shared };
        assert_eq!(status.mode, want, "{}'s status", status.upstream);
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let during = calls.get();
    cluster.nodes()[victim].restart().expect("the master back, empty, with its slots");
    let to_shared = wait_for(Mode::Shared).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.set(true);
    for task in tasks {
        task.await.expect("caller");
    }
    watcher.await.expect("watcher");
    let total = calls.get();
    println!(
        "master {victim} killed: its upstreams {lost:?} in fallback on both schedulers {to_fallback:?} after the kill, \
         shared again {to_shared:?} after the restart; calls: {before_kill} before the kill, {} in the outage, {total} in all",
        during - before_kill
    );
    for (index, name) in names.iter().enumerate() {
        let master = by_master.iter().position(|names| names.contains(name)).expect("a master");
        println!("{name} (master {master}): max in flight at its mock {}", mocks[index].max_in_flight());
    }

    assert!(failed.borrow().is_empty(), "calls failed: {:?}", failed.borrow());
    let survivors_switched: Vec<_> = modes_seen
        .borrow()
        .iter()
        .filter(|(_, who, _)| !lost.iter().any(|name| who.ends_with(&format!("/{name}"))))
        .cloned()
        .collect();
    assert!(survivors_switched.is_empty(), "upstreams of the live masters left shared mode: {survivors_switched:?}");
    for (index, name) in names.iter().enumerate() {
        let max = mocks[index].max_in_flight();
        // Shared: the limit across both; in fallback each holds its share (limit ÷ 2 live).
        assert!(max <= LIMIT as usize, "{name}: {max} in flight at its mock, limit {LIMIT}");
        if !lost.contains(name) {
            assert!(max >= 3, "{name}: both schedulers' callers reached its mock ({max})");
        }
    }
    assert!(during > before_kill, "the calls went on during the outage");
    // The permit held through the outage is registered on the restarted master; nothing else is left.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (master, names) in by_master.iter().enumerate() {
        for name in names {
            let want = usize::from(*name == by_master[victim][0]);
            assert_eq!(held_on(&mut cluster, master, name), want, "{name}'s permits on master {master}");
        }
    }
    held.succeeded();
}
