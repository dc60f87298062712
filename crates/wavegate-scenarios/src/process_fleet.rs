//! The worker processes of the `mixed` and `scale` runs: this binary started again with a
//! role, each one's stdout read line by line onto one channel, every one killed (by its own
//! pid) when the fleet is dropped; and the runs' numeric options.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use crate::ROLE_ENV;

/// Worker processes of one run.
pub(crate) struct ProcessFleet {
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
    lines: Receiver<(usize, Option<String>)>,
}

impl ProcessFleet {
    /// Starts `count` workers with `role`, worker `i` with the environment `envs(i)`.
    pub(crate) fn spawn(
        role: &str,
        count: usize,
        envs: impl Fn(usize) -> Vec<(&'static str, String)>,
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let (tx, lines) = channel();
        let mut fleet = Self { children: Vec::new(), stdins: Vec::new(), lines };
        for i in 0..count {
            let mut command = Command::new(&exe);
            command.env(ROLE_ENV, role).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
            for (key, value) in envs(i) {
                command.env(key, value);
            }
            let mut child = command.spawn().map_err(|e| format!("cannot start a worker: {e}"))?;
            let stdout = child.stdout.take().ok_or("no stdout")?;
            fleet.stdins.push(child.stdin.take().ok_or("no stdin")?);
            fleet.children.push(child);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send((i, Some(line)));
                }
                let _ = tx.send((i, None));
            });
        }
        Ok(fleet)
    }

    /// Sends `line` to every worker.
    pub(crate) fn send_all(&mut self, line: &str) -> Result<(), String> {
        for stdin in &mut self.stdins {
            writeln!(stdin, "{line}").and_then(|()| stdin.flush()).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Waits until every worker said `word`, within `within`; hands every other line to
    /// `other`.
    pub(crate) fn wait_all(&self, word: &str, within: Duration, mut other: impl FnMut(&str)) -> Result<(), String> {
        let deadline = Instant::now() + within;
        let mut said = vec![false; self.children.len()];
        while !said.iter().all(|s| *s) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((i, Some(line))) if line == word => said[i] = true,
                Ok((_, Some(line))) => other(&line),
                Ok((i, None)) if !said[i] => return Err(format!("worker {i} ended before `{word}`")),
                Ok((_, None)) => {}
                Err(_) => return Err(format!("no `{word}` from every worker within {within:?}")),
            }
        }
        Ok(())
    }
}

impl Drop for ProcessFleet {
    fn drop(&mut self) {
        self.stdins.clear();
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The number after `name` on the command line, or `default`.
pub(crate) fn option(args: &[String], name: &str, default: f64) -> Result<f64, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{name} needs a number")),
        None => Ok(default),
    }
}
