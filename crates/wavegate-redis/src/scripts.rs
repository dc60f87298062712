//! The Lua scripts from `lua/`, compiled in and loaded once.
//!
//! Each upstream script is `lua/wave.lua` (the state machine, written once),
//! `lua/provider_window.lua` (the provider's announced windows), `lua/learned_limit.lua`
//! (the limits it announced) and `lua/budget_turn.lua` (the turn at the budgets' next room)
//! followed by the script's body (and, for the two that take a provider's report in,
//! `lua/window_report.lua` before it);
//! `heartbeat.lua` and `live.lua` stand alone. [`redis::Script`] sends `EVALSHA` and on `NOSCRIPT` (a
//! restarted or flushed server) loads the script and retries, so a script flush is never an
//! outage. [`preload`] loads all of them at start so the first calls do not pay for it.

use std::sync::OnceLock;

use redis::Script;
use redis::aio::ConnectionLike;

macro_rules! wave_script {
    ($($body:literal),+) => {
        concat!(
            include_str!("../../../lua/wave.lua"),
            "\n",
            include_str!("../../../lua/provider_window.lua"),
            "\n",
            include_str!("../../../lua/learned_limit.lua"),
            "\n",
            include_str!("../../../lua/budget_turn.lua"),
            "\n",
            $(include_str!(concat!("../../../lua/", $body)), "\n",)+
        )
    };
}

/// A script that also chooses among priority classes: `wave.lua`, `priority.lua`,
/// `fleet.lua` (the fleet's counts by class and tenant), `provider_window.lua`,
/// `learned_limit.lua`, `budget_turn.lua`, the body.
macro_rules! priority_script {
    ($($body:literal),+) => {
        concat!(
            include_str!("../../../lua/wave.lua"),
            "\n",
            include_str!("../../../lua/priority.lua"),
            "\n",
            include_str!("../../../lua/fleet.lua"),
            "\n",
            include_str!("../../../lua/provider_window.lua"),
            "\n",
            include_str!("../../../lua/learned_limit.lua"),
            "\n",
            include_str!("../../../lua/budget_turn.lua"),
            "\n",
            $(include_str!(concat!("../../../lua/", $body)), "\n",)+
        )
    };
}

/// The scripts.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) finish: Script,
    pub(crate) renew: Script,
    pub(crate) status: Script,
    pub(crate) reconcile: Script,
    pub(crate) heartbeat: Script,
    pub(crate) report_window: Script,
    pub(crate) live: Script,
}

/// Each script's source, as it is sent.
pub(crate) mod source {
    pub(crate) const ACQUIRE: &str = priority_script!("acquire.lua");
    pub(crate) const FINISH: &str = priority_script!("window_report.lua", "finish.lua");
    pub(crate) const RENEW: &str = wave_script!("renew.lua");
    pub(crate) const STATUS: &str = priority_script!("status.lua");
    pub(crate) const RECONCILE: &str = wave_script!("reconcile.lua");
    pub(crate) const HEARTBEAT: &str = include_str!("../../../lua/heartbeat.lua");
    pub(crate) const REPORT_WINDOW: &str = wave_script!("window_report.lua", "report_window.lua");
    pub(crate) const LIVE: &str = include_str!("../../../lua/live.lua");
}

/// The source of the script a store command names (`acquire`, `finish`, ...), if it names one.
pub(crate) fn source_of(command: &str) -> Option<&'static str> {
    Some(match command {
        "acquire" => source::ACQUIRE,
        "finish" => source::FINISH,
        "renew" => source::RENEW,
        "status" => source::STATUS,
        "reconcile" => source::RECONCILE,
        "heartbeat" => source::HEARTBEAT,
        "report_window" => source::REPORT_WINDOW,
        "live" => source::LIVE,
        _ => return None,
    })
}

/// The command (lowercased) that line `line` (1-based) of `source` runs, if it runs one
/// (`redis.call('X'` or `redis.pcall('X'`).
pub(crate) fn command_at(source: &str, line: usize) -> Option<String> {
    let text = source.lines().nth(line.checked_sub(1)?)?;
    let at = text.find("redis.call(").map(|at| at + "redis.call(".len());
    let at = at.or_else(|| text.find("redis.pcall(").map(|at| at + "redis.pcall(".len()))?;
    let rest = text[at..].trim_start();
    let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let end = rest[1..].find(quote)?;
    Some(rest[1..=end].to_lowercase())
}

/// The scripts, built on first use.
pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        acquire: Script::new(source::ACQUIRE),
        finish: Script::new(source::FINISH),
        renew: Script::new(source::RENEW),
        status: Script::new(source::STATUS),
        reconcile: Script::new(source::RECONCILE),
        heartbeat: Script::new(source::HEARTBEAT),
        report_window: Script::new(source::REPORT_WINDOW),
        live: Script::new(source::LIVE),
    })
}

/// Loads every script into the server's script cache (`SCRIPT LOAD`).
pub async fn preload<C: ConnectionLike>(connection: &mut C) -> redis::RedisResult<()> {
    let s = scripts();
    for script in [&s.acquire, &s.finish, &s.renew, &s.status, &s.reconcile, &s.heartbeat, &s.report_window, &s.live] {
        script.load_async(connection).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scripts_line_names_the_command_it_runs() {
        let line = source::RECONCILE.lines().position(|l| l.contains("redis.call('HDEL'")).expect("an HDEL") + 1;
        assert_eq!(command_at(source::RECONCILE, line).as_deref(), Some("hdel"));
        let line = source::FINISH.lines().position(|l| l.contains("redis.pcall('PUBLISH'")).expect("a PUBLISH") + 1;
        assert_eq!(command_at(source::FINISH, line).as_deref(), Some("publish"));
        assert_eq!(command_at(source::FINISH, 0), None);
        assert_eq!(command_at(source::FINISH, 1), None, "a comment");
        assert!(source_of("acquire").is_some() && source_of("SET").is_none());
    }

    /// The code of a line: without its comment and its string literals (roughly: quotes are
    /// not escaped in these scripts).
    fn code(line: &str) -> String {
        let mut out = String::new();
        let mut quote = None;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '\'' || c == '"' => quote = Some(c),
                None if c == '-' && chars.peek() == Some(&'-') => break,
                None => out.push(c),
            }
        }
        out
    }

    /// Whether `code` calls `name` (`name(` not inside another identifier).
    fn calls(code: &str, name: &str) -> bool {
        let pattern = format!("{name}(");
        code.match_indices(&pattern).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == ':')
        })
    }

    #[test]
    fn no_script_calls_a_local_function_before_defining_it() {
        // A local function called above its definition is a global there: nil, so the script
        // fails only when that path runs, after the writes before it (a day budget's reply once
        // did: every acquire failed after granting, and was granted again on the retry).
        let sources = [
            ("acquire", source::ACQUIRE),
            ("finish", source::FINISH),
            ("renew", source::RENEW),
            ("status", source::STATUS),
            ("reconcile", source::RECONCILE),
            ("heartbeat", source::HEARTBEAT),
            ("report_window", source::REPORT_WINDOW),
            ("live", source::LIVE),
        ];
        let mut found = Vec::new();
        for (script, source) in sources {
            let lines: Vec<String> = source.lines().map(code).collect();
            // Each local function's first definition (a later one may shadow it; a nested one
            // is taken as defined from its line on).
            let mut first = std::collections::BTreeMap::new();
            for (at, line) in lines.iter().enumerate() {
                let Some(rest) = line.trim_start().strip_prefix("local function ") else { continue };
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                first.entry(name).or_insert(at);
            }
            for (name, &at) in &first {
                for (before, earlier) in lines[..at].iter().enumerate() {
                    if calls(earlier, name) {
                        found.push(format!(
                            "{script}: {name} called on line {} before its definition on line {}",
                            before + 1,
                            at + 1
                        ));
                    }
                }
            }
        }
        assert!(found.is_empty(), "{found:#?}");
        // The check sees such a call.
        let lines = ["local function a() return b() end", "local function b() return 1 end"];
        assert!(calls(&code(lines[0]), "b") && !calls(&code("x = 'b()' -- b()"), "b") && !calls("ab()", "b"));
    }
}
