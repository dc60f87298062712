//! `rediss://`: a real `redis-server --tls-port` with a certificate made for the test.

use std::time::Duration;

use wavegate::{BuildError, Mode, Rejection, Scheduler, StoreConfig, UpstreamConfig};
use wavegate_testkit::TlsRedisServer;

fn upstream() -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(1)
        .renewed_lease(Duration::from_secs(3))
        .max_wait(Duration::from_secs(5))
        .build()
        .expect("valid config")
}

#[actix::test]
async fn permits_are_shared_over_tls() {
    let mut redis = TlsRedisServer::start().expect("redis-server with TLS");
    let mut config = StoreConfig::new(redis.url());
    config.root_certificate = Some(redis.root_certificate().expect("CA"));
    let scheduler = Scheduler::builder().upstream(upstream()).store(config).build().expect("scheduler over TLS");
    let llm = scheduler.upstream("llm").expect("configured");
    let first = llm.request().acquire().await.expect("permit");
    // A waiter is woken by the release announced on the TLS connection's pub/sub.
    let waiter = {
        let llm = llm.clone();
        actix::spawn(async move { llm.request().acquire().await.map(|p| p.succeeded()) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The state is in the TLS server (read on its plain port).
    let mut con = redis.server().connection().expect("plain connection");
    let held: usize = redis::cmd("ZCARD").arg("wavegate:{llm}:permits").query(&mut con).expect("ZCARD");
    assert_eq!(held, 1);
    first.succeeded();
    waiter.await.expect("task").expect("the waiter gets the permit");
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared);
    // Its connections (commands and pub/sub) are on the TLS port.
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).expect("CLIENT LIST");
    let tls = format!("laddr=127.0.0.1:{} ", redis.tls_port());
    let (on_tls, plain): (Vec<&str>, Vec<&str>) =
        clients.lines().filter(|c| !c.contains("cmd=client|list")).partition(|c| c.contains(&tls));
    assert!(on_tls.len() >= 2 && plain.is_empty(), "TLS: {on_tls:?}; plain: {plain:?}");
}

#[actix::test]
async fn a_server_certificate_nobody_trusts_is_refused() {
    let redis = TlsRedisServer::start().expect("redis-server with TLS");
    // The system's roots do not include the test's CA.
    let built = Scheduler::builder().upstream(upstream()).redis(redis.url()).build();
    match built {
        Err(BuildError::Rejected(error)) => {
            println!("{error}");
            assert_eq!(error.rejection(), Some(Rejection::Tls));
        }
        Err(other) => panic!("expected a TLS rejection, got {other}"),
        Ok(_) => panic!("an untrusted certificate must fail build()"),
    }
}
