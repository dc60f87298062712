//! What this process sees of each upstream's room, for pools choosing a member.

use std::time::Instant;

use actix::{Context, Handler, Message, MessageResult};
use wavegate_core::Clock;

use super::Coordinator;
use crate::status::Mode;

/// Read the room of `upstreams` as this process sees it (no Redis round trip).
#[derive(Debug, Message)]
#[rtype(result = "Vec<Headroom>")]
pub(crate) struct ReadHeadroom {
    pub(crate) upstreams: Vec<usize>,
}

/// One upstream's room: its current limit, this process's calls in flight and waiting, and
/// whether no one can be admitted for now (a cooldown, a budget, a spent provider window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Headroom {
    pub(crate) limit: u32,
    pub(crate) busy: usize,
    pub(crate) blocked: bool,
}

impl Handler<ReadHeadroom> for Coordinator {
    type Result = MessageResult<ReadHeadroom>;

    fn handle(&mut self, read: ReadHeadroom, _: &mut Context<Self>) -> Self::Result {
        let now = Instant::now();
        let now_ms = self.clock.now_ms();
        let rooms = read
            .upstreams
            .into_iter()
            .map(|upstream| {
                let mode = self.mode_of(upstream);
                let slot = &mut self.slots[upstream];
                let limit = match (mode, slot.last_shared.state) {
                    (Mode::Shared, Some((_, limit))) => limit,
                    (Mode::Shared, None) => slot.config.limit().get(),
                    _ => slot.local.machine().snapshot().limit,
                };
                Headroom {
                    limit,
                    busy: slot.held.len() + slot.waiters.len(),
                    // Refused for now: the gate said so, a cooldown runs, or the provider said a
                    // window is spent (as this process heard it).
                    blocked: slot.blocked_until.is_some_and(|until| until > now)
                        || slot.cooldown_until.is_some_and(|until| until > now)
                        || slot.local.provider_windows().wait_ms(now_ms, 0).is_some(),
                }
            })
            .collect();
        MessageResult(rooms)
    }
}
