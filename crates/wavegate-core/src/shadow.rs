//! Shadow mode: an upstream (or some of its priority classes) whose whole policy runs —
//! permits, budgets, provider windows, the breaker, the wave's learning — but never holds a
//! call back. Each call in shadow starts at once; beside it, a *ghost* of it asks for a permit
//! as the call would have, waits in the same queue (fleet-wide in shared mode), and when it
//! is granted, holds the permit as long as the call took, then reports the call's outcome.
//! What the ghosts meet is what enforcing would have done: how long each call would have
//! waited, which would have been refused and why, where the learned limit would stand.
//!
//! Rolled out with [`UpstreamConfigBuilder::shadow`](crate::UpstreamConfigBuilder::shadow),
//! or switched live for the whole fleet ([`LiveChange::shadow`](crate::LiveChange::shadow)).

/// Which calls of an upstream run in shadow: all of them, or those of some priority classes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShadowScope {
    upstream: bool,
    /// The classes in shadow, by name, sorted, without repeats.
    classes: Vec<String>,
}

impl ShadowScope {
    /// Nothing in shadow: every call is held to the policy.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every call of the upstream in shadow.
    pub fn all() -> Self {
        Self { upstream: true, classes: Vec::new() }
    }

    /// Whether the whole upstream is in shadow.
    pub fn is_upstream(&self) -> bool {
        self.upstream
    }

    /// The priority classes in shadow on their own (the whole upstream aside), by name.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Whether nothing is in shadow.
    pub fn is_off(&self) -> bool {
        !self.upstream && self.classes.is_empty()
    }

    /// Whether a call of `class` (its name; `None` without classes) runs in shadow.
    pub fn covers(&self, class: Option<&str>) -> bool {
        self.upstream || class.is_some_and(|class| self.classes.iter().any(|c| c == class))
    }

    /// The same scope with the whole upstream in shadow or not.
    pub fn with_upstream(mut self, on: bool) -> Self {
        self.upstream = on;
        self
    }

    /// The same scope with class `class` in shadow or not.
    pub fn with_class(mut self, class: &str, on: bool) -> Self {
        match (self.classes.binary_search_by(|c| c.as_str().cmp(class)), on) {
            (Err(at), true) => self.classes.insert(at, class.to_owned()),
            (Ok(at), false) => {
                self.classes.remove(at);
            }
            _ => {}
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_covers_its_upstream_or_its_classes() {
        assert!(ShadowScope::none().is_off());
        assert!(!ShadowScope::none().covers(None));
        assert!(ShadowScope::all().covers(None) && ShadowScope::all().covers(Some("batch")));
        let batch = ShadowScope::none().with_class("batch", true).with_class("batch", true);
        assert_eq!(batch.classes(), ["batch"]);
        assert!(batch.covers(Some("batch")) && !batch.covers(Some("interactive")) && !batch.covers(None));
        assert!(batch.with_class("batch", false).is_off());
    }
}
