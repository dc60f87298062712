//! The command line: what to do, and how to reach the fleet's store.

use std::time::Duration;

/// What the operator asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// Every upstream, fleet-wide, once.
    Status,
    /// The same, refreshed every `every` until interrupted.
    Top { every: Duration },
    /// Forget an upstream's provider windows for the whole fleet.
    ClearWindow { upstream: String },
    /// The usage.
    Help,
}

/// The parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Args {
    pub(crate) command: Command,
    /// The server (`redis://`, `rediss://` with `tls`), credentials in the URL.
    pub(crate) redis: String,
    /// The key prefix of the fleet.
    pub(crate) prefix: String,
    /// Behind Sentinel: the master's name and the sentinels.
    pub(crate) sentinel: Option<(String, Vec<String>)>,
    /// A Cluster's seed nodes.
    pub(crate) cluster: Vec<String>,
    /// The upstreams to show; empty: every one that claimed a configuration.
    pub(crate) upstreams: Vec<String>,
    /// Machine-readable output.
    pub(crate) json: bool,
}

/// How to use it.
pub(crate) const USAGE: &str = "\
usage: wavegate <command> [options]

commands:
  status                  every upstream, fleet-wide: limit, state, in flight and waiting per
                          class, budgets, learned limits, provider windows, live processes
  top [--every SECONDS]   the same, refreshed (default every 1 s) until interrupted
  clear-window UPSTREAM   forget UPSTREAM's provider windows for the whole fleet

options:
  --redis URL             the store (default $WAVEGATE_REDIS_URL, else redis://127.0.0.1:6379);
                          credentials in the URL (redis://user:password@host:port/db)
  --prefix PREFIX         the fleet's key prefix (default wavegate)
  --sentinel MASTER=HOST:PORT,...   find the primary through these sentinels
  --cluster URL,...       a Redis Cluster's seed nodes (needs the `cluster` feature)
  --upstream NAME         only this upstream (repeatable); needed on a Cluster
  --json                  one JSON document (status) or one per refresh (top)
";

/// Parses the arguments after the program's name; the error says what is wrong.
pub(crate) fn parse(args: impl IntoIterator<Item = String>, env_redis: Option<String>) -> Result<Args, String> {
    let mut args = args.into_iter();
    let mut parsed = Args {
        command: Command::Help,
        redis: env_redis.unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned()),
        prefix: "wavegate".to_owned(),
        sentinel: None,
        cluster: Vec::new(),
        upstreams: Vec::new(),
        json: false,
    };
    let mut every = Duration::from_secs(1);
    let mut positional = Vec::new();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--redis" => parsed.redis = value("--redis")?,
            "--prefix" => parsed.prefix = value("--prefix")?,
            "--upstream" => parsed.upstreams.push(value("--upstream")?),
            "--json" => parsed.json = true,
            "--cluster" => parsed.cluster = value("--cluster")?.split(',').map(str::to_owned).collect(),
            "--sentinel" => {
                let given = value("--sentinel")?;
                let (master, sentinels) = given
                    .split_once('=')
                    .ok_or_else(|| format!("--sentinel {given:?}: expected MASTER=HOST:PORT,..."))?;
                parsed.sentinel = Some((master.to_owned(), sentinels.split(',').map(str::to_owned).collect()));
            }
            "--every" => {
                let given = value("--every")?;
                let seconds: f64 = given.parse().map_err(|_| format!("--every {given:?}: expected seconds"))?;
                if !(0.1..=3600.0).contains(&seconds) {
                    return Err(format!("--every {given}: between 0.1 and 3600 seconds"));
                }
                every = Duration::from_secs_f64(seconds);
            }
            "-h" | "--help" | "help" => return Ok(Args { command: Command::Help, ..parsed }),
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            other => positional.push(other.to_owned()),
        }
    }
    parsed.command = match positional.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => Command::Help,
        ["status"] => Command::Status,
        ["top"] => Command::Top { every },
        ["clear-window", upstream] => Command::ClearWindow { upstream: upstream.to_owned() },
        ["clear-window"] => return Err("clear-window needs the upstream's name".to_owned()),
        [command, ..] => return Err(format!("unknown command {command:?} (status, top, clear-window)")),
    };
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, String> {
        parse(line.split_whitespace().map(str::to_owned), None)
    }

    #[test]
    fn commands_and_options() {
        let status = args("status --json --prefix app --upstream llm --upstream img").expect("valid");
        assert_eq!(status.command, Command::Status);
        assert!(status.json);
        assert_eq!((status.prefix.as_str(), status.upstreams.len()), ("app", 2));
        assert_eq!(args("top --every 2").expect("valid").command, Command::Top { every: Duration::from_secs(2) });
        let clear = args("clear-window llm --redis redis://h:1").expect("valid");
        assert_eq!(clear.command, Command::ClearWindow { upstream: "llm".to_owned() });
        assert_eq!(clear.redis, "redis://h:1");
        let sentinel = args("status --sentinel mymaster=a:1,b:2").expect("valid");
        assert_eq!(sentinel.sentinel, Some(("mymaster".to_owned(), vec!["a:1".to_owned(), "b:2".to_owned()])));
    }

    #[test]
    fn mistakes_say_what_is_wrong() {
        assert!(args("stat").unwrap_err().contains("unknown command"));
        assert!(args("status --bogus").unwrap_err().contains("--bogus"));
        assert!(args("clear-window").unwrap_err().contains("needs the upstream"));
        assert!(args("top --every 0").unwrap_err().contains("between"));
        assert!(args("status --redis").unwrap_err().contains("needs a value"));
        assert!(args("status --sentinel nope").unwrap_err().contains("MASTER="));
        assert_eq!(args("").expect("help").command, Command::Help);
    }
}
