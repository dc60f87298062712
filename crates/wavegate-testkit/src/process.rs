//! Low-level process control: signals, bounded waits and `/proc` state.

use std::io;
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::HarnessError;

/// Sends `sig` to process `pid`.
pub(crate) fn send_signal(pid: u32, sig: Signal) -> Result<(), HarnessError> {
    let signal_error = |source: io::Error| HarnessError::Signal { signal: sig.as_str(), pid, source };
    let raw =
        i32::try_from(pid).map_err(|_| signal_error(io::Error::new(io::ErrorKind::InvalidInput, "pid overflow")))?;
    signal::kill(Pid::from_raw(raw), sig).map_err(|errno| signal_error(errno.into()))
}

/// Polls `child` until it exits, for at most `timeout`; reaps it.
pub(crate) fn wait_exit(
    child: &mut Child,
    timeout: Duration,
    action: &'static str,
) -> Result<ExitStatus, HarnessError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout { action, timeout });
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// SIGKILLs `child` (also when it is stopped) and reaps it, waiting at most
/// `timeout`.
pub(crate) fn kill_and_reap(child: &mut Child, timeout: Duration) -> Result<ExitStatus, HarnessError> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    child.kill()?;
    wait_exit(child, timeout, "exit after SIGKILL")
}

/// Waits until the process is (or is no longer) in the stopped state, for at
/// most `timeout`.
///
/// Signal delivery is asynchronous; without this, a command sent right after
/// `pause()` could in theory still be served. On systems without `/proc` the
/// state cannot be observed and this returns immediately.
pub(crate) fn wait_stopped_state(pid: u32, stopped: bool, timeout: Duration) -> Result<(), HarnessError> {
    let deadline = Instant::now() + timeout;
    loop {
        match proc_state(pid) {
            None => return Ok(()),
            Some(state) if (state == 'T') == stopped => return Ok(()),
            Some(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                action: if stopped { "stop after SIGSTOP" } else { "continue after SIGCONT" },
                timeout,
            });
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// The one-letter state of `pid` from `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`…).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces or ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_running_in_proc() {
        if std::path::Path::new("/proc/self/stat").exists() {
            let state = proc_state(std::process::id()).unwrap();
            assert!(matches!(state, 'R' | 'S' | 'D'), "state {state}");
        }
    }

    #[test]
    fn signalling_a_missing_pid_is_an_error() {
        // pid_max on Linux is at most 2^22, so this pid cannot exist.
        let err = send_signal(i32::MAX as u32, Signal::SIGCONT).unwrap_err();
        assert!(matches!(err, HarnessError::Signal { signal: "SIGCONT", .. }), "{err}");
    }
}
