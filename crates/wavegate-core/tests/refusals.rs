//! A refused call's give-back in the Rust twin: once per permit (the twin of
//! `crates/wavegate-redis/tests/refusals.rs`'s second test; review 34).

use wavegate_core::{
    Ask, Decision, Instance, LocalGate, PermitId, TokenDelta, UpstreamConfig, WaveSignal, WindowLeft, WindowReport,
    WindowsBack,
};

/// A second finish of the same refused permit (a retried release) gives nothing back again.
#[test]
fn a_second_finish_of_a_refused_permit_gives_nothing_back_again() {
    let config = UpstreamConfig::builder("refused").limit(10).build().expect("valid");
    let mut gate = LocalGate::for_upstream(&config);
    let instance = Instance::new("i").expect("instance");
    let report = WindowReport { tokens: Some(WindowLeft::fixed(10_000, 60_000)), ..WindowReport::default() };
    gate.report_window("", report, 0, 0);
    let id = PermitId::new(None, &instance, 1, None);
    let ask = Ask { id: id.clone(), tokens: 4_000, output: 0, waiting: 1 };
    let Decision::Granted { wave, .. } = gate.acquire(&instance, &[ask], 30_000, 0) else { panic!("granted") };
    let refused = TokenDelta::refused((4_000, 0), WindowsBack::Reservation);
    let first = gate.finish(&id, wave, WaveSignal::Neutral, refused, 1);
    let once = gate.provider_windows().tokens.left;
    let second = gate.finish(&id, wave, WaveSignal::Neutral, refused, 2);
    let twice = gate.provider_windows().tokens.left;
    println!("held {} then {}; tokens left {once} then {twice}", first.held, second.held);
    assert_eq!(twice, once, "a finish of a permit no longer held gave the reservation back again");
}
