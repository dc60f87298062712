//! A refused call's give-back in the Lua twin, against a real redis-server (review 34's
//! reproductions): a window whose base is missing (an older version wrote it) or unreadable gives
//! back nothing it cannot prove it took off, and a second finish of a refused permit gives back
//! nothing again.

use std::time::Duration;

use wavegate_core::{Admission, TokenDelta, UpstreamConfig, WaveSignal, WindowLeft, WindowReport, WindowsBack};
use wavegate_redis::{SharedGate, Store, StoreConfig};
use wavegate_testkit::RedisServer;

const LEASE: Duration = Duration::from_secs(30);

fn tokens(left: u64, reset_ms: u64) -> WindowReport {
    WindowReport { tokens: Some(WindowLeft::fixed(left, reset_ms)), ..WindowReport::default() }
}

async fn granted(gate: &SharedGate, id: &str, tokens: u64) -> u64 {
    match gate.acquire_text(id, LEASE, tokens).await.expect("acquire").admission {
        Admission::Granted { wave, .. } => wave,
        other => panic!("{id} not granted: {other:?}"),
    }
}

/// X (4,400) and Y (1,100) granted after the first report; Y's answer (3,000 left, nothing
/// granted since Y) sets the tokens window, based on Y's mark: X, granted before Y and refused,
/// was neither counted nor taken off. `tamper` then changes the stored base; X's 429 comes
/// (no report). Answers the tokens left.
async fn tokens_left_after_x_refused(server: &RedisServer, name: &str, tamper: Option<Option<&str>>) -> u64 {
    let config = UpstreamConfig::builder(name).limit(10).build().expect("valid");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let gate = SharedGate::for_upstream(store, &config);
    gate.report_window("", tokens(10_000, 60_000), 0).await.expect("first report");
    let wave = granted(&gate, "x", 4_400).await;
    granted(&gate, "y", 1_100).await;
    let after_y = gate.report_window("y", tokens(3_000, 59_000), 1_100).await.expect("y's answer");
    assert_eq!(after_y.tokens.left, 3_000);
    if let Some(base) = tamper {
        let client = redis::Client::open(server.url()).expect("client");
        let mut con = client.get_multiplexed_async_connection().await.expect("connection");
        let key = format!("wavegate:{{{name}}}:wave");
        let _: () = match base {
            // A window written by the older layout (no base field).
            None => redis::cmd("HDEL").arg(&key).arg("pw_tokens_base").query_async(&mut con).await,
            // A garbled field.
            Some(text) => redis::cmd("HSET").arg(&key).arg("pw_tokens_base").arg(text).query_async(&mut con).await,
        }
        .expect("tamper");
    }
    let refused = TokenDelta::refused((4_400, 0), WindowsBack::Reservation);
    gate.finish_text("x", wave, WaveSignal::Neutral, refused).await.expect("x refused");
    gate.report_window("", WindowReport::default(), 0).await.expect("read").tokens.left
}

#[tokio::test]
async fn a_missing_or_garbled_base_gives_back_nothing_the_window_never_took_off() {
    let server = RedisServer::start().expect("redis-server");
    let intact = tokens_left_after_x_refused(&server, "refused-intact", None).await;
    let older_layout = tokens_left_after_x_refused(&server, "refused-older", Some(None)).await;
    let garbled = tokens_left_after_x_refused(&server, "refused-garbled", Some(Some("garbage"))).await;
    println!("tokens left after X's 429: base intact {intact}, base missing {older_layout}, base garbled {garbled}");
    assert_eq!(intact, 3_000, "the provider said 3,000 and never counted X");
    assert_eq!(older_layout, 3_000, "a window without a base field (older layout) gave X back");
    assert_eq!(garbled, 3_000, "a garbled base gave X back");
}

/// A second finish of the same refused permit (a retried release) gives nothing back again.
#[tokio::test]
async fn a_second_finish_of_a_refused_permit_gives_nothing_back_again() {
    let server = RedisServer::start().expect("redis-server");
    let config = UpstreamConfig::builder("refused-twice").limit(10).build().expect("valid");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let gate = SharedGate::for_upstream(store, &config);
    gate.report_window("", tokens(10_000, 60_000), 0).await.expect("first report");
    let wave = granted(&gate, "x", 4_000).await;
    let refused = TokenDelta::refused((4_000, 0), WindowsBack::Reservation);
    let first = gate.finish_text("x", wave, WaveSignal::Neutral, refused).await.expect("x refused");
    let once = gate.report_window("", WindowReport::default(), 0).await.expect("read").tokens.left;
    let second = gate.finish_text("x", wave, WaveSignal::Neutral, refused).await.expect("x again");
    let twice = gate.report_window("", WindowReport::default(), 0).await.expect("read").tokens.left;
    println!("held {} then {}; tokens left {once} then {twice}", first.held, second.held);
    assert_eq!(twice, once, "a finish of a permit no longer held gave the reservation back again");
}
