//! How long a wave's COOLDOWN lasts.
//!
//! The provider's `Retry-After` comes first; without one, a ladder of growing steps (5, 10, 20,
//! 30 s by default), one step further for each new wave that starts before the upstream is back
//! in NORMAL. Both are bounded: a `Retry-After` of zero or one of a year are clamped to
//! `[min, max]`, so a broken header can neither disable the cooldown nor stop an upstream.

use std::time::Duration;

/// The cooldown ladder and its bounds. Built and validated through
/// [`UpstreamConfigBuilder`](crate::UpstreamConfigBuilder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CooldownPolicy {
    pub(crate) ladder: Vec<Duration>,
    pub(crate) min: Duration,
    pub(crate) max: Duration,
}

impl CooldownPolicy {
    /// The default ladder: 5, 10, 20, 30 seconds.
    pub const DEFAULT_LADDER: [Duration; 4] =
        [Duration::from_secs(5), Duration::from_secs(10), Duration::from_secs(20), Duration::from_secs(30)];
    /// The default shortest cooldown a `Retry-After` can ask for: 1 second.
    pub const DEFAULT_MIN: Duration = Duration::from_secs(1);
    /// The default longest cooldown: 60 seconds.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(60);

    /// The cooldown for the wave at ladder `step` (0 for a wave that starts from NORMAL).
    ///
    /// ```
    /// use std::time::Duration;
    /// use wavegate_core::CooldownPolicy;
    ///
    /// let policy = CooldownPolicy::default();
    /// assert_eq!(policy.duration(0, None), Duration::from_secs(5));
    /// assert_eq!(policy.duration(7, None), Duration::from_secs(30));
    /// assert_eq!(policy.duration(0, Some(Duration::from_secs(12))), Duration::from_secs(12));
    /// assert_eq!(policy.duration(0, Some(Duration::ZERO)), Duration::from_secs(1));
    /// assert_eq!(policy.duration(0, Some(Duration::MAX)), Duration::from_secs(60));
    /// ```
    pub fn duration(&self, step: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(asked) => asked.clamp(self.min, self.max),
            None => {
                let index = usize::try_from(step).unwrap_or(usize::MAX).min(self.ladder.len() - 1);
                self.ladder[index].min(self.max)
            }
        }
    }

    /// The ladder's steps, shortest wave first.
    pub fn ladder(&self) -> &[Duration] {
        &self.ladder
    }

    /// The shortest cooldown a `Retry-After` is clamped to.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The longest cooldown, for both `Retry-After` and the ladder.
    pub fn max(&self) -> Duration {
        self.max
    }
}

impl Default for CooldownPolicy {
    fn default() -> Self {
        Self { ladder: Self::DEFAULT_LADDER.to_vec(), min: Self::DEFAULT_MIN, max: Self::DEFAULT_MAX }
    }
}
