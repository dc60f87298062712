//! The errors' words and hints.

use std::io;

use super::*;

fn timeout() -> Outcome {
    Outcome::from_transport(TransportError::Timeout)
}

#[test]
fn it_is_one_pointer_wide() {
    assert_eq!(std::mem::size_of::<Error<io::Error>>(), std::mem::size_of::<usize>());
}

#[test]
fn the_codes_are_stable() {
    let codes: [(Error, &str); 11] = [
        (Error::from(UnknownUpstream { name: "x".into(), known: "y".into() }), "unknown_upstream"),
        (Error::queue_full("x", 2), "queue_full"),
        (Error::waited_too_long("x", Duration::ZERO, None), "waited_too_long"),
        (Error::breaker_open("x", Duration::ZERO), "breaker_open"),
        (Error::retry_budget_spent("x", 1, "transient"), "retry_budget_spent"),
        (Error::deadline_passed("x", 1), "deadline_passed"),
        (Error::upstream_failed("x", Outcome::ServerError { status: 500 }, 1, None), "upstream_error"),
        (Error::insufficient_capacity("x", Budget::TokensPerMinute, 2, 1), "insufficient_capacity"),
        (Error::quota_exhausted("x", 1, Duration::ZERO), "quota_exhausted"),
        (Error::unknown_class("x", "c", Vec::new()), "unknown_class"),
        (Error::stopped(), "stopped"),
    ];
    for (error, code) in codes {
        assert_eq!(error.code(), code, "{error:?}");
        assert_eq!(error.kind().to_string(), code);
    }
}

#[test]
fn a_call_timeout_and_a_deadline_say_they_timed_out() {
    let timed_out: Error = Error::upstream_failed("llm", timeout(), 3, None);
    assert!(timed_out.is_timeout() && timed_out.is_retryable() && !timed_out.is_overload());
    assert!(timed_out.to_string().contains("timed out"), "{timed_out}");
    assert!(timed_out.to_string().contains("after 3 attempts"), "{timed_out}");
    let deadline: Error = Error::deadline_passed("llm", 1);
    assert!(deadline.is_timeout());
    assert!(deadline.to_string().contains("timed out") && deadline.to_string().contains("deadline"), "{deadline}");
    let failed: Error = Error::upstream_failed("llm", Outcome::ServerError { status: 500 }, 1, None);
    assert!(!failed.is_timeout() && !failed.is_retryable());
    assert_eq!(failed.to_string(), "upstream `llm` failed (server_error (500)) after 1 attempt");
    assert!(!Error::<Infallible>::waited_too_long("llm", Duration::ZERO, None).is_timeout());
}

#[test]
fn the_source_is_the_callers_error_or_the_unknown_name() {
    let error = Error::upstream_failed("llm", Outcome::ClientError { status: 400 }, 1, Some(io::Error::other("bad")));
    assert_eq!(std::error::Error::source(&error).map(ToString::to_string).as_deref(), Some("bad"));
    let error = error.map_source(|e| e.kind());
    assert_eq!(error.source_error(), Some(&io::ErrorKind::Other));
    let plain = error.clone().without_source();
    assert_eq!((plain.kind(), plain.upstream_status(), plain.attempts()), (ErrorKind::Upstream, Some(400), Some(1)));
    assert_eq!(error.split_source().ok(), Some(io::ErrorKind::Other));
    let unknown: Error = UnknownUpstream { name: "lmm".into(), known: "llm".into() }.into();
    assert_eq!(unknown.upstream(), Some("lmm"));
    let source = std::error::Error::source(&unknown).expect("the unknown name");
    assert!(source.downcast_ref::<UnknownUpstream>().is_some());
}

#[test]
fn the_budget_and_the_classes_are_typed() {
    let error: Error = Error::insufficient_capacity("llm", Budget::FallbackShare, 600, 500);
    assert_eq!((error.budget(), error.requested(), error.burst()), (Some(Budget::FallbackShare), Some(600), Some(500)));
    assert!(error.is_retryable() && !error.to_string().contains("never"), "{error}");
    let error: Error = Error::insufficient_capacity("llm", Budget::TokensPerMinute, 600, 500);
    assert!(!error.is_retryable() && error.to_string().contains("tokens_per_minute burst of 500"), "{error}");
    let error: Error = Error::unknown_class("llm", "urgent", vec!["interactive".into(), "batch".into()]);
    assert_eq!(error.class(), Some("urgent"));
    assert_eq!(error.known_classes().map(<[String]>::len), Some(2));
    assert!(error.to_string().contains("interactive, batch"), "{error}");
}

#[test]
fn the_attempts_are_counted_where_the_kind_counts_them() {
    let error: Error = Error::quota_exhausted("llm", 0, Duration::from_secs(60)).with_attempts(2);
    assert_eq!((error.attempts(), error.retry_after()), (Some(2), Some(Duration::from_secs(60))));
    let error: Error = Error::breaker_open("llm", Duration::from_secs(5)).with_attempts(2);
    assert_eq!(error.attempts(), None);
    assert_eq!(Error::<Infallible>::queue_full("llm", 4).retry_after(), Some(DEFAULT_RETRY_AFTER));
    assert_eq!(Error::<Infallible>::stopped().retry_after(), None);
    assert_eq!(Error::<Infallible>::stopped().upstream(), None);
}
