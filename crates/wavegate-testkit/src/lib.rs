//! Test harness for wavegate: real `redis-server` processes that tests can
//! break.
//!
//! wavegate must keep scheduling when Redis dies, hangs, restarts empty or
//! forgets its Lua scripts. Mocks cannot reproduce those failures faithfully,
//! so this crate starts a real `redis-server` per test, on a free port of
//! 127.0.0.1, in a temporary directory with persistence off, and lets the test
//! inflict them:
//!
//! | failure                         | method                                               |
//! |---------------------------------|------------------------------------------------------|
//! | crash (`kill -9`)               | [`RedisServer::kill`]                                |
//! | clean shutdown                  | [`RedisServer::stop`]                                |
//! | comes back empty, same address  | [`RedisServer::restart`]                             |
//! | hangs (no answers, no resets)   | [`RedisServer::pause`] / [`resume`]                  |
//! | script cache lost (`NOSCRIPT`)  | [`RedisServer::flush_scripts`]                       |
//! | network hangs, the server runs  | [`FaultProxy`] + [`Fault::BlackHole`]                |
//! | connections refused or reset    | [`Fault::Refuse`], [`FaultProxy::reset_connections`] |
//! | slow network                    | [`Fault::Latency`]                                   |
//! | command ran, reply lost         | [`Fault::DropNextReply`]                             |
//!
//! [`TlsRedisServer`] adds a TLS port with certificates made for the test (`openssl`), and
//! [`SentinelGroup`] a primary, a replica and three sentinels that can be made to fail over;
//! [`RedisCluster`] a cluster of masters.
//!
//! [`resume`]: RedisServer::resume
//!
//! Dropping a [`RedisServer`] kills its process and removes its directory.
//!
//! The last four rows break the network rather than the server: clients connect to a
//! [`FaultProxy`] (a TCP proxy on loopback, in front of the server) and the test switches its
//! [`Fault`]. Dropping the proxy closes its port and all its connections.
//!
//! [`MockUpstream`] is the other referee: an HTTP provider on loopback that counts the calls
//! it serves at once and answers 429 beyond a hidden capacity; [`http_get`] calls it.
//! [`MockProvider`] is a provider that announces its requests and tokens windows in OpenAI's
//! or Anthropic's headers ([`ProviderLimits`], [`HeaderStyle`]) and refuses beyond them.
//! [`MockSse`] streams its answers slowly as server-sent events (OpenAI's or Anthropic's, with
//! their final usage) and counts the streams it has open at once. [`OpenAiBucket`] is OpenAI's
//! accounting as its guide describes it (buckets refilled continuously, charged prompt +
//! `max_tokens` at admission, a hidden concurrency cap, seeded transient 500s), for a provider
//! process such as the scenario runner's; [`AnthropicBucket`] is Anthropic's (requests, input
//! and output tokens per minute in buckets refilled continuously, output charged `max_tokens`
//! at admission and adjusted to the output at the end).
//!
//! # Requirements
//!
//! A `redis-server` binary: on `PATH`, or named by the `WAVEGATE_REDIS_SERVER`
//! environment variable ([`REDIS_SERVER_ENV`]), or given to
//! [`RedisServerBuilder::binary`]. If it is missing, starting fails with
//! [`HarnessError::BinaryNotFound`], whose message says how to fix it.
//! Signals and `/proc` make this Unix-only (Linux in practice).
//!
//! # Example
//!
//! ```
//! use wavegate_testkit::RedisServer;
//!
//! let mut server = RedisServer::start()?;
//! let mut con = server.connection()?;
//! redis::cmd("SET").arg("k").arg("v").exec(&mut con)?;
//!
//! server.kill()?; // like kill -9
//! assert!(redis::cmd("PING").exec(&mut con).is_err());
//!
//! server.restart()?; // same port, empty dataset
//! let mut con = server.connection()?;
//! let value: Option<String> = redis::cmd("GET").arg("k").query(&mut con)?;
//! assert_eq!(value, None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod anthropic_bucket;
mod builder;
mod cluster;
mod error;
mod fault_proxy;
mod http;
mod log;
mod mock_provider;
mod mock_sse;
mod mock_upstream;
mod openai_bucket;
mod port;
mod process;
mod provider_limits;
mod sentinel;
mod server;
mod server_thread;
mod tls;

pub use anthropic_bucket::{AnthropicBucket, AnthropicLimits};
pub use builder::RedisServerBuilder;
pub use cluster::RedisCluster;
pub use error::HarnessError;
pub use fault_proxy::{Fault, FaultProxy};
pub use http::{HttpReply, http_get};
pub use mock_provider::{Hook, MockProvider, ProviderCall};
pub use mock_sse::{MockSse, MockSseConfig, SseStyle, http_chunk, sse_events};
pub use mock_upstream::{MockUpstream, MockUpstreamConfig, read_request_head};
pub use openai_bucket::{BucketLimits, OpenAiBucket};
pub use port::free_port;
pub use provider_limits::{Answer, HeaderStyle, ProviderLimits, WindowCounter, error_code, http_date, rfc3339_ceil};
pub use sentinel::{SentinelGroup, SentinelProcess};
pub use server::RedisServer;
pub use tls::{TestCertificates, TlsRedisServer};

/// The environment variable naming the `redis-server` binary to run when
/// [`RedisServerBuilder::binary`] is not used: `WAVEGATE_REDIS_SERVER`.
pub const REDIS_SERVER_ENV: &str = "WAVEGATE_REDIS_SERVER";
