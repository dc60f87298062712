//! A worker of the drawn run: the drawn upstream, its callers each in a class, with a tenant, a
//! token estimate and a deadline drawn per call, calling the hostile provider until the end;
//! then it reports what its callers submitted and got, the latest any call ended past its
//! deadline, and answers the orchestrator's commands.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wavegate::Scheduler;
use wavegate_testkit::http_get;

use crate::common::{classify, env};
use crate::draw::Drawn;
use crate::fleet::{report_mode_changes, serve_commands, unix_ms};

/// A call that ends this long after its deadline is late.
pub(crate) const DEADLINE_SLACK_MS: u64 = 500;

/// The code a caller's call that got the provider's non-200 answer back is counted under.
fn answered(status: u16) -> &'static str {
    match status {
        402 => "answered_402",
        429 => "answered_429",
        _ => "answered_other",
    }
}

#[derive(Default)]
struct Tally {
    submitted: u64,
    ok: u64,
    codes: BTreeMap<&'static str, u64>,
    over_ms: i64,
    late: u64,
}

pub(crate) fn worker_main() {
    let system = actix::System::new();
    system.block_on(async {
        let seed: u64 = env("SEED").parse().expect("SEED");
        let index: usize = env("INDEX").parse().expect("INDEX");
        let drawn = Drawn::from_seed(seed);
        let mock: SocketAddr = env("MOCK_ADDR").parse().expect("MOCK_ADDR");
        let scheduler =
            Scheduler::builder().upstream(drawn.upstream()).redis(env("REDIS_URL")).build().expect("scheduler");
        report_mode_changes(scheduler.clone());
        let start_ms: u64 = env("START_MS").parse().expect("START_MS");
        let end_ms: u64 = env("END_MS").parse().expect("END_MS");
        tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(unix_ms()))).await;
        let names = drawn.class_names();
        let mut tasks = Vec::new();
        for caller in 0..drawn.callers {
            let llm = scheduler.upstream("mock").expect("configured");
            let class = names[(index * drawn.callers + caller) % names.len()].clone();
            let drawn = drawn.clone();
            let mut rng =
                SmallRng::seed_from_u64(seed ^ ((index as u64) << 32) ^ caller as u64 ^ u64::from(std::process::id()));
            tasks.push(actix::spawn(async move {
                let mut tally = Tally::default();
                while unix_ms() < end_ms {
                    tally.submitted += 1;
                    let estimate = rng.random_range(drawn.estimate.0..=drawn.estimate.1);
                    let tenant = rng.random_range(0..drawn.tenants.max(1));
                    let deadline = Duration::from_millis(rng.random_range(drawn.deadline_ms.0..=drawn.deadline_ms.1));
                    let path = format!("/v1/chat?tokens={estimate}&class={class}&tenant={tenant}&w={index}");
                    let mut request = llm.request().timeout(deadline);
                    if !drawn.classes.is_empty() {
                        request = request.priority(&class);
                    }
                    if drawn.tenants > 0 {
                        request = request.tenant(format!("t{tenant}"));
                    }
                    if drawn.tpm.is_some() {
                        request = request.tokens(estimate);
                    }
                    let started = Instant::now();
                    let result =
                        request.classify(classify).call(|_| http_get(mock, &path, Duration::from_secs(10))).await;
                    let took = started.elapsed();
                    let over = took.as_millis() as i64 - deadline.as_millis() as i64;
                    tally.over_ms = tally.over_ms.max(over);
                    if over > DEADLINE_SLACK_MS as i64 {
                        tally.late += 1;
                    }
                    match result {
                        Ok(reply) if reply.status == 200 => tally.ok += 1,
                        // The provider's own answer, given back to the caller as it is.
                        Ok(reply) => *tally.codes.entry(answered(reply.status)).or_default() += 1,
                        Err(error) => {
                            *tally.codes.entry(error.code()).or_default() += 1;
                            // A refusal at once (a spent quota, a budget never fits) would
                            // spin: such a caller comes back a little later.
                            if took < Duration::from_millis(10) {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                }
                tally
            }));
        }
        let mut all = Tally { over_ms: i64::MIN, ..Tally::default() };
        for task in tasks {
            // A caller task that panicked would lose its calls: they stay submitted.
            if let Ok(t) = task.await {
                all.submitted += t.submitted;
                all.ok += t.ok;
                all.over_ms = all.over_ms.max(t.over_ms);
                all.late += t.late;
                for (code, n) in t.codes {
                    *all.codes.entry(code).or_default() += n;
                }
            }
        }
        let err: u64 = all.codes.values().sum();
        // A call cut by its deadline while at the provider keeps its permit for the
        // cancelled-call hold: every permit is back after it.
        tokio::time::sleep(drawn.cancelled_call_hold + Duration::from_millis(300)).await;
        let codes: Vec<String> = all.codes.iter().map(|(c, n)| format!("code:{c}={n}")).collect();
        let held = scheduler
            .upstream("mock")
            .expect("configured")
            .status()
            .await
            .map(|s| s.in_flight_local)
            .unwrap_or(usize::MAX);
        println!(
            "RESULT submitted={} ok={} err={err} held={held} over_ms={} late={} {}",
            all.submitted,
            all.ok,
            all.over_ms.max(0),
            all.late,
            codes.join(" ")
        );
        serve_commands(scheduler).await;
    });
}
