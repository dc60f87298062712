//! What a call used against what it reserved: in all, and of the answer's output.

/// Tokens used beyond a reservation (negative: fewer than reserved), in all (for the tokens
/// budget) and of the answer's output (for the output tokens budget); the input tokens budget
/// takes the rest ([`input`](Self::input)). An `i64` converts to a delta of the total alone
/// (all of it input).
///
/// ```
/// use wavegate_core::TokenDelta;
///
/// // 10,000 in and 2,000 out reserved; the meter says 10,500 were used in all: the prompt was
/// // counted before it was sent, so the output was 500, not 2,000.
/// let delta = TokenDelta::of_total(-1_500, 2_000);
/// assert_eq!((delta.total, delta.output, delta.input()), (-1_500, -1_500, 0));
/// // The provider's usage says 10,200 in and 300 out.
/// let delta = TokenDelta::of_usage((12_000, 2_000), (10_200, 300));
/// assert_eq!((delta.total, delta.output, delta.input()), (-1_500, -1_700, 200));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TokenDelta {
    /// Tokens used beyond the reservation, in all.
    pub total: i64,
    /// Of them, the answer's output.
    pub output: i64,
    /// What the provider's windows take back.
    pub windows: WindowsBack,
}

/// What a settlement gives back to the provider's windows
/// ([`ProviderWindows`](crate::ProviderWindows)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WindowsBack {
    /// The output given back (a negative [`TokenDelta::output`]) returns to the output window:
    /// the provider served the call and charges the output it made.
    #[default]
    Output,
    /// The provider refused the call (a 429) and counted none of it: its whole reservation
    /// returns to every window ([`ProviderWindows::refuse`](crate::ProviderWindows::refuse)).
    Reservation,
    /// Nothing: a refusal whose answer's report gave the reservation back already
    /// ([`WindowReport::refused`](crate::WindowReport::refused)).
    Nothing,
}

impl TokenDelta {
    /// `total` more tokens than reserved, `output` of them the answer's.
    pub const fn new(total: i64, output: i64) -> Self {
        Self { total, output, windows: WindowsBack::Output }
    }

    /// A call the provider refused, `reserved` (all, output) giving all of it back: to the
    /// budgets, and as `windows` says to the provider's windows.
    pub fn refused(reserved: (u64, u64), windows: WindowsBack) -> Self {
        let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Self { total: -signed(reserved.0), output: -signed(reserved.1.min(reserved.0)), windows }
    }

    /// The input's share of the delta: the total less the output.
    pub const fn input(&self) -> i64 {
        self.total.saturating_sub(self.output)
    }

    /// The delta when only the total used is known (a meter that counts no parts), `output`
    /// of the reservation having been the answer's: the input is taken to be as estimated (a
    /// prompt is counted before it is sent), the output takes the difference; a total below
    /// the input's estimate gives all of the output back and the rest from the input.
    pub fn of_total(total: i64, output_reserved: u64) -> Self {
        let most_back = i64::try_from(output_reserved).unwrap_or(i64::MAX);
        Self { total, output: total.max(-most_back), windows: WindowsBack::Output }
    }

    /// The delta when the provider said both parts: `reserved` (all, output) against `used`
    /// (input, output).
    pub fn of_usage(reserved: (u64, u64), used: (u64, u64)) -> Self {
        let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let (reserved_all, reserved_output) = (signed(reserved.0), signed(reserved.1.min(reserved.0)));
        let (used_input, used_output) = (signed(used.0), signed(used.1));
        Self {
            total: used_input.saturating_add(used_output).saturating_sub(reserved_all),
            output: used_output.saturating_sub(reserved_output),
            windows: WindowsBack::Output,
        }
    }

    /// Nothing to settle.
    pub const fn is_zero(&self) -> bool {
        self.total == 0 && self.output == 0 && matches!(self.windows, WindowsBack::Output)
    }

    /// The text the scripts read (`finish.lua`): `<total>`, `<total>:<output>` when the output
    /// moved, `<total>:<output>:refused` when the windows take the reservation back,
    /// `<total>:<output>:kept` when they take nothing back ([`WindowsBack`]).
    pub fn to_arg(&self) -> String {
        match self.windows {
            WindowsBack::Reservation => format!("{}:{}:refused", self.total, self.output),
            WindowsBack::Nothing => format!("{}:{}:kept", self.total, self.output),
            WindowsBack::Output if self.output == 0 => self.total.to_string(),
            WindowsBack::Output => format!("{}:{}", self.total, self.output),
        }
    }
}

impl From<i64> for TokenDelta {
    fn from(total: i64) -> Self {
        Self { total, output: 0, windows: WindowsBack::Output }
    }
}
