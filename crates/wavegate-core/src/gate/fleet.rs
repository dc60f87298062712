//! The fleet-wide choice of class and tenant at a gate: the twin of `fleet_classes`,
//! `add_offers`, `cap_classes`, `choose_grant`, `hand_out` and `process_to_wake` in
//! `lua/priority.lua`, over the gate's permits and waiting list instead of Redis keys.
//!
//! The choice of class itself is [`next_class`](crate::priority::next_class) and of tenant
//! [`next_tenant`](crate::tenant::next_tenant) (their tables are checked against the Lua
//! functions on their own); this module gathers what they choose among, and hands the free
//! permits out one by one as the script does.

use crate::class_budget::ClassBudgets;
use crate::gcra::Budgets;
use crate::ledger::PermitLedger;
use crate::permit_id::text::{class_of, member_instance, renewed_every_second, tenant_of};
use crate::priority::{ClassTurns, ClassView, PriorityClass, next_class, stride};
use crate::tenant::{NO_TENANT, TenantView, next_tenant};

use super::waiting::WaitingList;

/// A waiting member's part of a tenant's demand.
#[derive(Debug, Clone)]
struct Owner {
    member: String,
    demand: u32,
    since_ms: u64,
}

/// One tenant of a class, as the choice sees it.
#[derive(Debug, Clone)]
struct Tenant {
    tag: String,
    view: TenantView,
    /// The members waiting for it, in the order they started waiting.
    owners: Vec<Owner>,
}

/// One class, as the choice sees it.
#[derive(Debug, Clone)]
pub(crate) struct Class {
    pub(crate) view: ClassView,
    tenants: Vec<Tenant>,
}

impl Class {
    fn tenant(&mut self, tag: &str) -> &mut Tenant {
        let at = match self.tenants.iter().position(|t| t.tag == tag) {
            Some(at) => at,
            None => {
                let view = TenantView { in_flight: 0, demand: 0, since_ms: u64::MAX };
                self.tenants.push(Tenant { tag: tag.to_owned(), view, owners: Vec::new() });
                self.tenants.len() - 1
            }
        };
        &mut self.tenants[at]
    }

    fn next_tenant(&self) -> Option<usize> {
        let views: Vec<TenantView> = self.tenants.iter().map(|t| t.view).collect();
        next_tenant(&views)
    }

    /// The tag of the tenant the class's next permit goes to ([`NO_TENANT`] when none).
    fn next_tag(&self) -> &str {
        self.next_tenant().map_or(NO_TENANT, |t| self.tenants[t].tag.as_str())
    }
}

/// A gate's classes: their configuration, and where a class name or an id falls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config<'a> {
    pub(crate) classes: &'a [PriorityClass],
    pub(crate) default: usize,
    pub(crate) count_window_ms: u64,
}

impl Config<'_> {
    /// The index of class `name`, if it is one.
    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c.name() == name)
    }

    /// The class an id or a class name falls in: its own, else the default one.
    pub(crate) fn index_or_default(&self, name: Option<&str>) -> usize {
        name.and_then(|name| self.index(name)).unwrap_or(self.default)
    }
}

/// One head a process asks for, as the gate reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head<'a> {
    pub(crate) id: &'a str,
    /// The class name sent with it (`''` without classes).
    pub(crate) class: &'a str,
    pub(crate) tokens: u64,
    /// Of `tokens`, the answer's output (the input and output budgets).
    pub(crate) output: u64,
    pub(crate) waiting: u32,
}

/// The member `<class>|<instance>`.
pub(crate) fn member(class: &str, instance: &str) -> String {
    format!("{class}|{instance}")
}

/// The fleet's classes at `limit`: in flight from the permits, waiting from the fresh
/// members, and per class its tenants (`fleet_classes`). With `renewed_only`, a permit in the
/// three-field form counts only while its lease ends at least the count window ahead.
pub(crate) fn classes(
    config: Config<'_>,
    limit: u32,
    now_ms: u64,
    renewed_only: bool,
    ledger: &PermitLedger,
    waiting: &WaitingList,
) -> Vec<Class> {
    let mut classes: Vec<Class> = config
        .classes
        .iter()
        .map(|c| Class {
            view: ClassView {
                weight: c.weight_value().get(),
                reserved: c.reserved_at(limit),
                in_flight: 0,
                demand: 0,
                since_ms: 0,
                pass: 0,
            },
            tenants: Vec::new(),
        })
        .collect();
    let counted_from = renewed_only.then(|| now_ms.saturating_add(config.count_window_ms));
    for (id, permit) in ledger.iter() {
        if counted_from.is_none_or(|from| permit.expires_ms >= from) || !renewed_every_second(id) {
            let class = &mut classes[config.index_or_default(class_of(id))];
            class.view.in_flight += 1;
            class.tenant(tenant_of(id)).view.in_flight += 1;
        }
    }
    for member in waiting.fresh(now_ms) {
        let (Some(i), Some(since_ms)) = (class_of(member).and_then(|c| config.index(c)), waiting.since(member)) else {
            continue;
        };
        let offers = match waiting.offers(member) {
            Some(offers) => offers.by_tenant.clone(),
            None => vec![(NO_TENANT.to_owned(), 1)],
        };
        let class = &mut classes[i];
        for (tag, count) in offers {
            if count == 0 {
                continue;
            }
            if class.view.demand == 0 || since_ms < class.view.since_ms {
                class.view.since_ms = since_ms;
            }
            class.view.demand += count;
            let tenant = class.tenant(&tag);
            tenant.view.demand += count;
            tenant.view.since_ms = tenant.view.since_ms.min(since_ms);
            tenant.owners.push(Owner { member: member.to_owned(), demand: count, since_ms });
        }
    }
    for class in &mut classes {
        class.tenants.sort_by(|x, y| x.tag.cmp(&y.tag));
        for tenant in &mut class.tenants {
            tenant.owners.sort_by(|x, y| (x.since_ms, &x.member).cmp(&(y.since_ms, &y.member)));
        }
    }
    classes
}

/// A process not on the waiting list yet joins the choice in memory: its heads, as the
/// waiting list would hold them (`add_offers`; appended, like the script, after the sort).
pub(crate) fn add_offers(config: Config<'_>, classes: &mut [Class], instance: &str, heads: &[Head<'_>], now_ms: u64) {
    for head in heads {
        let class = &mut classes[config.index_or_default(Some(head.class))];
        if head.waiting == 0 {
            continue;
        }
        if class.view.demand == 0 || now_ms < class.view.since_ms {
            class.view.since_ms = now_ms;
        }
        class.view.demand += head.waiting;
        let tenant = class.tenant(tenant_of(head.id));
        tenant.view.demand += head.waiting;
        tenant.view.since_ms = tenant.view.since_ms.min(now_ms);
        tenant.owners.push(Owner { member: member(head.class, instance), demand: head.waiting, since_ms: now_ms });
    }
}

/// A class with a budget of its own takes no part while that budget cannot take one more
/// request reserving `tokens(class)` (`cap_classes`).
pub(crate) fn cap(
    classes: &mut [Class],
    budgets: &ClassBudgets,
    in_force: Budgets,
    now_ms: u64,
    tokens: impl Fn(usize) -> u64,
) {
    for (i, class) in classes.iter_mut().enumerate() {
        if class.view.demand > 0 && budgets.is_capped(i) && budgets.wait_ms(i, in_force, now_ms, tokens(i)).is_some() {
            class.view.demand = 0;
        }
    }
}

/// Before a choice: the turns observe the classes (a class that starts waiting is lifted to
/// the virtual time) and each class gets its pass.
pub(crate) fn observe(turns: &mut ClassTurns, classes: &mut [Class]) {
    let mut views: Vec<ClassView> = classes.iter().map(|c| c.view).collect();
    turns.observe(&mut views);
    for (class, view) in classes.iter_mut().zip(views) {
        class.view.pass = view.pass;
    }
}

fn views(classes: &[Class]) -> Vec<ClassView> {
    classes.iter().map(|c| c.view).collect()
}

/// Hands class `c`'s next permit to its next tenant, as if granted; returns the member it
/// goes to (`hand_out`).
fn hand_out(classes: &mut [Class], c: usize) -> Option<String> {
    let class = &mut classes[c];
    // A grant through the reserve is outside the turns.
    if class.view.in_flight >= class.view.reserved {
        class.view.pass += stride(class.view.weight);
    }
    class.view.in_flight += 1;
    class.view.demand = class.view.demand.saturating_sub(1);
    let t = class.next_tenant()?;
    let tenant = &mut class.tenants[t];
    tenant.view.in_flight += 1;
    tenant.view.demand = tenant.view.demand.saturating_sub(1);
    let owner = tenant.owners.iter_mut().find(|o| o.demand > 0)?;
    owner.demand -= 1;
    Some(owner.member.clone())
}

/// Hands out `room` permits one by one, to the next class and within it the next tenant;
/// returns the asker's head the first of them reaches (`asked(class, tag)`), its class and
/// whether it is granted through the class's reserve (`choose_grant`).
pub(crate) fn choose_grant(
    classes: &mut [Class],
    room: u32,
    asked: impl Fn(usize, &str) -> Option<usize>,
) -> Option<(usize, usize, bool)> {
    for _ in 0..room {
        let c = next_class(&views(classes))?;
        if let Some(k) = asked(c, classes[c].next_tag()) {
            let view = classes[c].view;
            return Some((k, c, view.in_flight < view.reserved));
        }
        hand_out(classes, c);
    }
    None
}

/// The instance to wake for a freed permit with `room` permits free: the free permits are
/// handed out in order, and the owner of the last one (earlier ones went to processes woken
/// by earlier releases) is woken (`process_to_wake`, after its freshness check).
pub(crate) fn to_wake(classes: &mut [Class], room: i64) -> Option<String> {
    let mut last = None;
    for _ in 0..room.max(1) {
        let Some(c) = next_class(&views(classes)) else { break };
        last = hand_out(classes, c).or(last);
    }
    last.map(|member| member_instance(&member).to_owned())
}
