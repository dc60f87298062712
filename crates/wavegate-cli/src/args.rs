//! The command line: what to do, and how to reach the fleet's store.

use std::time::Duration;

use wavegate_core::{ClassSetting, LiveChange, LiveSetting};

/// What the operator asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// Every upstream, fleet-wide, once.
    Status,
    /// The same, refreshed every `every` until interrupted.
    Top { every: Duration },
    /// Forget an upstream's provider windows for the whole fleet.
    ClearWindow { upstream: String },
    /// Change an upstream's setting live for the whole fleet.
    Set { upstream: String, change: LiveChange },
    /// Lift every process's refusal of an upstream for a spent quota, and its windows.
    ResetQuota { upstream: String },
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
  top [--every SECONDS]   the fleet at a glance, refreshed (default every 1 s) until
                          interrupted: the processes and their modes, a line per upstream
  clear-window UPSTREAM   forget UPSTREAM's provider windows for the whole fleet
  reset-quota UPSTREAM    lift every process's refusal of UPSTREAM for a spent quota (after
                          paying the bill) and forget its provider windows
  set UPSTREAM --limit N [--for DURATION]
                          change UPSTREAM's concurrency limit for the whole fleet (every
                          process within a second); with --for (e.g. 90s, 10m, 2h, 1d) only
                          that long, then back to the configured limit
  set UPSTREAM --limit configured
                          back to the configured limit now
  set UPSTREAM --requests-per-minute N|configured [--for DURATION]
  set UPSTREAM --tokens-per-minute N|configured [--for DURATION]
                          the same for the rate of a configured budget (its burst stays);
                          the units the budget holds are kept across the change
  set UPSTREAM --requests-burst N|configured [--for DURATION]
  set UPSTREAM --tokens-burst N|configured [--for DURATION]
                          the burst of a configured budget (its rate stays); what the budget
                          has spent stays spent: a lower burst admits less at once from now,
                          a higher one more, nothing is reset
  shadow on|off|configured UPSTREAM [--class CLASS] [--for DURATION]
                          shadow mode for UPSTREAM (or one priority class of it), fleet-wide:
                          no call is held back, what the policy would have done is recorded
                          (status, metrics); with --for only that long; `configured`: back to
                          what each process was built with
  set UPSTREAM --weight CLASS=N|configured [--for DURATION]
  set UPSTREAM --reserve CLASS=PERCENT|configured [--for DURATION]
                          a priority class's weight (1..=1000) or reserve (the reserves add
                          up to at most 100 %)
  set UPSTREAM --pool POOL=WEIGHT|out|configured [--for DURATION]
                          UPSTREAM's weight as a member of pool POOL (1..=1000; out: taken out
                          of the pool; an upstream the pool was not configured with joins it,
                          after its members); `configured`: as each process was built

options:
  --redis URL             the store (default $WAVEGATE_REDIS_URL, else redis://127.0.0.1:6379);
                          credentials in the URL (redis://user:password@host:port/db)
  --prefix PREFIX         the fleet's key prefix (default wavegate)
  --sentinel MASTER=HOST:PORT,...   find the primary through these sentinels
  --cluster URL,...       a Redis Cluster's seed nodes (needs the `cluster` feature)
  --upstream NAME         only this upstream (repeatable); needed on a Cluster
  --json                  one JSON document (status, set) or one per refresh (top)
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
    let (mut setting, mut ttl, mut class) = (None, None, None);
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
            "--limit"
            | "--requests-per-minute"
            | "--tokens-per-minute"
            | "--requests-burst"
            | "--tokens-burst"
            | "--weight"
            | "--reserve"
            | "--pool" => {
                if setting.is_some() {
                    return Err("set changes one setting at a time".to_owned());
                }
                setting = Some((arg.clone(), value(&arg)?));
            }
            "--class" => class = Some(value("--class")?),
            "--for" => {
                let given = value("--for")?;
                ttl = Some(duration(&given).ok_or_else(|| format!("--for {given:?}: expected e.g. 90s, 10m, 2h, 1d"))?);
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
        ["set", upstream] => Command::Set { upstream: upstream.to_owned(), change: change(setting, ttl)? },
        ["set"] => return Err("set needs the upstream's name".to_owned()),
        ["shadow", mode, upstream] => {
            Command::Set { upstream: upstream.to_owned(), change: shadow(mode, class.take(), ttl)? }
        }
        ["shadow", ..] => return Err("shadow needs on, off or configured, then the upstream's name".to_owned()),
        ["reset-quota", upstream] => Command::ResetQuota { upstream: upstream.to_owned() },
        ["reset-quota"] => return Err("reset-quota needs the upstream's name".to_owned()),
        [command, ..] => {
            return Err(format!("unknown command {command:?} (status, top, clear-window, set, shadow, reset-quota)"));
        }
    };
    if class.is_some() {
        return Err("--class goes with shadow only (set takes --weight CLASS=N, --reserve CLASS=N)".to_owned());
    }
    Ok(parsed)
}

/// The change `set` asks for: `--limit N` (with `--for`, an override) or `--limit configured`,
/// the same for a budget's rate, and `--weight CLASS=N` / `--reserve CLASS=N` for a class's.
fn change(setting: Option<(String, String)>, ttl: Option<Duration>) -> Result<LiveChange, String> {
    let (flag, given) = setting.ok_or(
        "set needs what to change: --limit N, --requests-per-minute N, --tokens-per-minute N, --requests-burst N, \
         --tokens-burst N, --weight CLASS=N, --reserve CLASS=N or --pool POOL=WEIGHT",
    )?;
    if flag == "--pool" {
        return pool_member(&given, ttl);
    }
    let class_setting = match flag.as_str() {
        "--weight" => Some(ClassSetting::Weight),
        "--reserve" => Some(ClassSetting::Reserve),
        _ => None,
    };
    let (class, given) = match class_setting {
        Some(_) => {
            let (class, value) = given
                .split_once('=')
                .ok_or_else(|| format!("{flag} {given:?}: expected CLASS=N or CLASS=configured"))?;
            (Some(class.to_owned()), value.to_owned())
        }
        None => (None, given),
    };
    if given == "configured" && ttl.is_some() {
        return Err(format!("{flag} configured takes no --for"));
    }
    let value = || given.parse::<u64>().map_err(|_| format!("{flag} {given:?}: expected a number or `configured`"));
    match (class_setting, class) {
        (Some(setting), Some(class)) if given == "configured" => Ok(LiveChange::ClearClass { class, setting }),
        (Some(setting), Some(class)) => {
            LiveChange::set_class(class, setting, value()?, ttl).map_err(|error| format!("{flag}: {error}"))
        }
        _ => {
            let setting = LiveSetting::parse(&flag.trim_start_matches("--").replace('-', "_"))
                .ok_or_else(|| format!("unknown setting {flag}"))?;
            if given == "configured" {
                return Ok(LiveChange::Clear(setting));
            }
            LiveChange::set(setting, value()?, ttl).map_err(|error| format!("{flag} {given}: {error}"))
        }
    }
}

/// The change `set UPSTREAM --pool POOL=WEIGHT|out|configured` asks for: the upstream's weight
/// as a member of the pool (`out`: 0, out of the pool; `configured`: as each process was built).
fn pool_member(given: &str, ttl: Option<Duration>) -> Result<LiveChange, String> {
    let (pool, value) = given
        .split_once('=')
        .ok_or_else(|| format!("--pool {given:?}: expected POOL=WEIGHT, POOL=out or POOL=configured"))?;
    if value == "configured" {
        if ttl.is_some() {
            return Err("--pool POOL=configured takes no --for".to_owned());
        }
        return Ok(LiveChange::ClearPoolMember { pool: pool.to_owned() });
    }
    let weight = match value {
        "out" => 0,
        _ => value
            .parse::<u32>()
            .map_err(|_| format!("--pool {given:?}: expected a weight (0..=1000), out or configured"))?,
    };
    LiveChange::pool_member(pool, weight, ttl).map_err(|error| format!("--pool {given}: {error}"))
}

/// The change `shadow on|off|configured` asks for, for the upstream or `class`.
fn shadow(mode: &str, class: Option<String>, ttl: Option<Duration>) -> Result<LiveChange, String> {
    let on = match mode {
        "on" => true,
        "off" => false,
        "configured" if ttl.is_some() => return Err("shadow configured takes no --for".to_owned()),
        "configured" => {
            return Ok(match class {
                Some(class) => LiveChange::ClearClass { class, setting: ClassSetting::Shadow },
                None => LiveChange::Clear(LiveSetting::Shadow),
            });
        }
        other => return Err(format!("shadow {other:?}: expected on, off or configured")),
    };
    match class {
        Some(class) => LiveChange::set_class(class, ClassSetting::Shadow, u64::from(on), ttl),
        None => LiveChange::shadow(on, ttl),
    }
    .map_err(|error| format!("shadow {mode}: {error}"))
}

/// A duration as an operator writes it: a number and a unit (`ms`, `s`, `m`, `h`, `d`).
pub(crate) fn duration(text: &str) -> Option<Duration> {
    let at = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(at);
    let number: u64 = number.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(number.checked_mul(ms)?))
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
        assert!(args("set").unwrap_err().contains("needs the upstream"));
        assert!(args("reset-quota").unwrap_err().contains("needs the upstream"));
        assert_eq!(args("reset-quota llm").expect("valid").command, Command::ResetQuota { upstream: "llm".to_owned() });
        assert!(args("set llm").unwrap_err().contains("--limit"));
        assert!(args("set llm --limit 0").unwrap_err().contains("at least 1"));
        assert!(args("set llm --limit x").unwrap_err().contains("a number"));
        assert!(args("set llm --limit 3 --for 10").unwrap_err().contains("90s"));
        assert!(args("set llm --limit 3 --for 0s").unwrap_err().contains("override"));
        assert!(args("set llm --limit 3 --for 8d").unwrap_err().contains("override"));
        assert!(args("set llm --limit configured --for 1m").unwrap_err().contains("no --for"));
    }

    #[test]
    fn set_and_its_durations() {
        let set = args("set llm --limit 4 --for 10m --json").expect("valid");
        let change = LiveChange::set(LiveSetting::Limit, 4, Some(Duration::from_secs(600))).expect("valid");
        assert_eq!(set.command, Command::Set { upstream: "llm".to_owned(), change });
        assert!(set.json);
        let kept = args("set llm --limit 12").expect("valid").command;
        let change = LiveChange::set(LiveSetting::Limit, 12, None).expect("valid");
        assert_eq!(kept, Command::Set { upstream: "llm".to_owned(), change });
        let rpm = args("set llm --requests-per-minute 300 --for 1h").expect("valid").command;
        let change =
            LiveChange::set(LiveSetting::RequestsPerMinute, 300, Some(Duration::from_secs(3_600))).expect("ok");
        assert_eq!(rpm, Command::Set { upstream: "llm".to_owned(), change });
        let tpm = args("set llm --tokens-per-minute configured").expect("valid").command;
        assert_eq!(
            tpm,
            Command::Set { upstream: "llm".to_owned(), change: LiveChange::Clear(LiveSetting::TokensPerMinute) }
        );
        assert!(args("set llm --limit 3 --tokens-per-minute 9").unwrap_err().contains("one setting"));
        let weight = args("set llm --weight batch=4 --for 10m").expect("valid").command;
        let change =
            LiveChange::set_class("batch", ClassSetting::Weight, 4, Some(Duration::from_secs(600))).expect("ok");
        assert_eq!(weight, Command::Set { upstream: "llm".to_owned(), change });
        let reserve = args("set llm --reserve interactive=configured").expect("valid").command;
        let change = LiveChange::ClearClass { class: "interactive".to_owned(), setting: ClassSetting::Reserve };
        assert_eq!(reserve, Command::Set { upstream: "llm".to_owned(), change });
        assert!(args("set llm --weight 4").unwrap_err().contains("CLASS=N"));
        let burst = args("set llm --tokens-burst 4000 --for 1h").expect("valid").command;
        let change = LiveChange::set(LiveSetting::TokensBurst, 4_000, Some(Duration::from_secs(3_600))).unwrap();
        assert_eq!(burst, Command::Set { upstream: "llm".to_owned(), change });
        let back = args("set llm --requests-burst configured").expect("valid").command;
        assert_eq!(
            back,
            Command::Set { upstream: "llm".to_owned(), change: LiveChange::Clear(LiveSetting::RequestsBurst) }
        );
        assert!(args("set llm --requests-burst 0").unwrap_err().contains("at least 1"));
        let out = args("set key-a --pool gpt=out --for 10m").expect("valid").command;
        let change = LiveChange::pool_member("gpt", 0, Some(Duration::from_secs(600))).unwrap();
        assert_eq!(out, Command::Set { upstream: "key-a".to_owned(), change });
        let back = args("set key-a --pool gpt=configured").expect("valid").command;
        let change = LiveChange::ClearPoolMember { pool: "gpt".to_owned() };
        assert_eq!(back, Command::Set { upstream: "key-a".to_owned(), change });
        assert!(args("set key-a --pool gpt=2000").unwrap_err().contains("above 1000"));
        assert!(args("set key-a --pool gpt").unwrap_err().contains("POOL=WEIGHT"));
        assert!(args("set key-a --pool gpt=configured --for 1m").unwrap_err().contains("no --for"));
        assert!(args("set llm --weight batch=0").unwrap_err().contains("outside"));
        assert!(args("set llm --reserve batch=101").unwrap_err().contains("outside"));
        let back = args("set llm --limit configured").expect("valid").command;
        assert_eq!(back, Command::Set { upstream: "llm".to_owned(), change: LiveChange::Clear(LiveSetting::Limit) });
        let on = args("shadow on llm --for 1h").expect("valid").command;
        let change = LiveChange::shadow(true, Some(Duration::from_secs(3_600))).expect("ok");
        assert_eq!(on, Command::Set { upstream: "llm".to_owned(), change });
        let batch = args("shadow off llm --class batch").expect("valid").command;
        let change = LiveChange::set_class("batch", ClassSetting::Shadow, 0, None).expect("ok");
        assert_eq!(batch, Command::Set { upstream: "llm".to_owned(), change });
        let back = args("shadow configured llm").expect("valid").command;
        assert_eq!(back, Command::Set { upstream: "llm".to_owned(), change: LiveChange::Clear(LiveSetting::Shadow) });
        assert!(args("shadow maybe llm").unwrap_err().contains("on, off or configured"));
        assert!(args("shadow on").unwrap_err().contains("upstream"));
        assert!(args("shadow configured llm --for 1m").unwrap_err().contains("no --for"));
        assert!(args("set llm --limit 3 --class batch").unwrap_err().contains("--class goes with shadow"));
        assert_eq!(duration("1500ms"), Some(Duration::from_millis(1_500)));
        assert_eq!(duration("2h"), Some(Duration::from_secs(7_200)));
        assert_eq!(duration("1d"), Some(Duration::from_secs(86_400)));
        for bad in ["", "10", "m", "1.5m", "10x", "-1s"] {
            assert_eq!(duration(bad), None, "{bad}");
        }
    }
}
