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

/// An HTTP provider whose answers stream: a body of 10 frames, one every 50 ms, that counts the
/// bodies open at once (until read to their end or dropped).
#[cfg(feature = "http")]
mod streamed {
    use super::*;
    use http_body::{Body, Frame};

    #[derive(Clone, Default)]
    pub(super) struct Streaming {
        pub(super) open: Arc<AtomicUsize>,
        pub(super) max: Arc<AtomicUsize>,
    }

    pub(super) struct SlowBody {
        left: usize,
        tick: Option<Pin<Box<tokio::time::Sleep>>>,
        open: Option<Arc<AtomicUsize>>,
    }

    impl SlowBody {
        fn close(&mut self) {
            if let Some(open) = self.open.take() {
                open.fetch_sub(1, SeqCst);
            }
        }
    }

    impl Drop for SlowBody {
        fn drop(&mut self) {
            self.close();
        }
    }

    impl Body for SlowBody {
        type Data = &'static [u8];
        type Error = io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<&'static [u8]>, io::Error>>> {
            if self.left == 0 {
                self.close();
                return Poll::Ready(None);
            }
            let tick = self.tick.get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(50))));
            if tick.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.tick = None;
            self.left -= 1;
            Poll::Ready(Some(Ok(Frame::data(&b"data: {\"choices\":[]}\n\n"[..]))))
        }
    }

    impl Service<()> for Streaming {
        type Response = http::Response<SlowBody>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = Result<http::Response<SlowBody>, io::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            let (open, max) = (self.open.clone(), self.max.clone());
            Box::pin(async move {
                max.fetch_max(open.fetch_add(1, SeqCst) + 1, SeqCst);
                let body = SlowBody { left: 10, tick: None, open: Some(open) };
                http::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .map_err(io::Error::other)
            })
        }
    }
}

/// With `hold_bodies`, a streamed response keeps its permit until its body ends or is dropped:
/// the provider never has more bodies open than the limit. Without it, the permit goes back
/// with the head and the bodies all stream at once.
#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_bodies_keep_the_permit_until_the_body_ends() {
    use http_body::Body;
    use wavegate::Reserved;

    async fn read_all<B: Body + Unpin>(mut body: B) -> usize {
        let mut frames = 0;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            assert!(frame.is_ok());
            frames += 1;
        }
        frames
    }

    let scheduler = scheduler(2);
    let llm = scheduler.upstream("llm").expect("configured");
    let provider = streamed::Streaming::default();
    let held = WavegateLayer::new(llm.clone(), wavegate::ByError).hold_bodies(Reserved).layer(provider.clone());
    let frames = join_all((0..6).map(|_| {
        let mut service = held.clone();
        async move {
            let response = service.call(()).await.expect("a response");
            read_all(response.into_body()).await
        }
    }))
    .await;
    assert_eq!(frames, vec![10; 6]);
    assert_eq!(provider.max.load(SeqCst), 2, "bodies open at once with a limit of 2");
    assert_eq!(llm.status().await.expect("status").in_flight_local, 0);

    // A body dropped midway gives its permit back at once.
    let mut service = held.clone();
    let response = service.call(()).await.expect("a response");
    assert_eq!(llm.status().await.expect("status").in_flight_local, 1);
    drop(response);
    assert_eq!(llm.status().await.expect("status").in_flight_local, 0);

    // The layer without `hold_bodies`: the permit goes with the head.
    let unheld = streamed::Streaming::default();
    let plain = WavegateLayer::new(llm.clone(), wavegate::ByError).layer(unheld.clone());
    join_all((0..6).map(|_| {
        let mut service = plain.clone();
        async move { read_all(service.call(()).await.expect("a response").into_body()).await }
    }))
    .await;
    assert!(unheld.max.load(SeqCst) > 2, "without hold_bodies the bodies were still limited");
}
