//! The tower layer (feature `tower`): a service's requests each hold a permit while they
//! run, counted by the service itself; its errors come back typed; its results feed the wave.
//!
//! Run with `cargo test -p wavegate --features tower --test tower_layer` (CI does).
#![cfg(feature = "tower")]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use tower_layer::Layer;
use tower_service::Service;
use wavegate::middleware::tower::WavegateLayer;
use wavegate::{Outcome, Scheduler, UpstreamConfig};

mod common;

/// A provider as a service: answers the status it is asked for after 20 ms (0: an I/O error),
/// counting the calls it serves at once.
#[derive(Clone, Default)]
struct Provider {
    in_flight: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Service<u16> for Provider {
    type Response = u16;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<u16, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, status: u16) -> Self::Future {
        let (in_flight, max) = (self.in_flight.clone(), self.max.clone());
        Box::pin(async move {
            let now = in_flight.fetch_add(1, SeqCst) + 1;
            max.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            in_flight.fetch_sub(1, SeqCst);
            if status == 0 { Err(io::Error::from(io::ErrorKind::ConnectionReset)) } else { Ok(status) }
        })
    }
}

fn by_status(result: &Result<u16, io::Error>) -> Outcome {
    match result {
        Ok(status) => Outcome::from_status(*status, Some("0"), SystemTime::now()),
        Err(error) => wavegate::UpstreamError::outcome(error),
    }
}

fn scheduler(limit: u32) -> Scheduler {
    let upstream =
        UpstreamConfig::builder("llm").limit(limit).max_wait(Duration::from_secs(10)).build().expect("config");
    common::isolated().upstream(upstream).build().expect("scheduler")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_the_layer_never_exceed_the_limit() {
    let scheduler = scheduler(3);
    let provider = Provider::default();
    let service = WavegateLayer::new(scheduler.upstream("llm").expect("configured"), by_status).layer(provider.clone());
    let calls = (0..30).map(|_| {
        let mut service = service.clone();
        tokio::spawn(async move { service.call(200).await })
    });
    for reply in join_all(calls).await {
        assert_eq!(reply.expect("task").expect("a call"), 200);
    }
    assert_eq!(provider.max.load(SeqCst), 3, "the service saw more (or fewer) than the limit at once");
}

#[tokio::test]
async fn the_services_error_comes_back_typed_and_a_429_cuts_the_limit() {
    let scheduler = scheduler(4);
    let llm = scheduler.upstream("llm").expect("configured");
    let mut service = WavegateLayer::new(llm.clone(), by_status).layer(Provider::default());
    let error = service.call(0).await.expect_err("an I/O error");
    let (Some(source), Some(1)) = (error.source_error(), error.attempts()) else { panic!("{error:?}") };
    assert_eq!(source.kind(), io::ErrorKind::ConnectionReset);
    // A 429 comes back as the service's answer (no retry in the layer) and reaches the wave.
    assert_eq!(service.call(429).await.expect("an answer"), 429);
    assert!(llm.status().await.expect("status").limit < 4);
    assert_eq!(llm.status().await.expect("status").in_flight_local, 0, "every permit was released");
}
