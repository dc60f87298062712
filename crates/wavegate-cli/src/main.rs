//! `wavegate`: an operator's view of a wavegate fleet from its Redis.
//!
//! ```text
//! wavegate status [--json]            every upstream, fleet-wide
//! wavegate top [--every SECONDS]      the same, refreshed
//! wavegate clear-window UPSTREAM      forget a provider window for the whole fleet
//! wavegate set UPSTREAM --limit N [--for 10m]   change a limit live for the whole fleet
//! wavegate reset-quota UPSTREAM       lift a spent quota's refusal in every process
//! ```
//!
//! It reads the keys the processes write, through the same store crate (TLS with the `tls`
//! feature, credentials in the URL, Sentinel, Cluster with the `cluster` feature): each
//! upstream's claimed configuration (which the status script needs), its shared state, its
//! provider windows, its live settings, and the live processes' heartbeats; `set` writes the live
//! settings as `Upstream::set_limit` does (`lua/live.lua`). Exit status: 0, 1 on a store error,
//! 2 on a usage error.

mod args;
mod fleet;
mod render;
mod table;

use std::process::ExitCode;

use wavegate_redis::{Keyspace, SentinelConfig, Store, StoreConfig};

use crate::args::{Args, Command, USAGE};

fn store_config(args: &Args) -> StoreConfig {
    let mut config = if !args.cluster.is_empty() {
        StoreConfig::cluster(args.cluster.clone())
    } else {
        StoreConfig::new(args.redis.clone())
    };
    if let Some((master, sentinels)) = &args.sentinel {
        config.sentinel = Some(SentinelConfig { master: master.clone(), sentinels: sentinels.clone() });
    }
    config.keyspace = Keyspace::new(args.prefix.clone());
    config
}

async fn run(args: Args) -> Result<(), String> {
    let store = Store::connect(store_config(&args)).await.map_err(|e| format!("cannot reach the store: {e}"))?;
    match args.command {
        Command::Help => unreachable!("answered before"),
        Command::Status => {
            let fleet = fleet::read(&store, &args.upstreams).await.map_err(|e| e.to_string())?;
            print!("{}", if args.json { render::json(&fleet) + "\n" } else { render::text(&fleet) });
        }
        Command::Top { every } => loop {
            let fleet = fleet::read(&store, &args.upstreams).await;
            match (&fleet, args.json) {
                (Ok(fleet), true) => println!("{}", render::json(fleet)),
                // Clear the screen, home the cursor, then the view.
                (Ok(fleet), false) => print!("\x1b[2J\x1b[H{}", table::table(fleet)),
                (Err(error), _) => eprintln!("store: {error}"),
            }
            tokio::time::sleep(every).await;
        },
        Command::Set { upstream, change } => {
            let set = fleet::set(&store, &upstream, &change).await.map_err(|e| e.to_string())?;
            print!(
                "{}",
                if args.json {
                    render::set_json(&upstream, &change, &set) + "\n"
                } else {
                    render::set_text(&upstream, &change, &set)
                }
            );
        }
        Command::ResetQuota { upstream } => {
            let version = fleet::reset_quota(&store, &upstream).await.map_err(|e| e.to_string())?;
            if args.json {
                println!("{}", serde_json::json!({ "upstream": upstream, "quota_reset": true, "version": version }));
            } else {
                println!(
                    "{upstream}: spent-quota refusals lifted and provider windows cleared for the fleet (version \
                     {version}; every process within a second)"
                );
            }
        }
        Command::ClearWindow { upstream } => {
            fleet::clear_window(&store, &upstream).await.map_err(|e| e.to_string())?;
            println!("{upstream}: provider windows cleared for the fleet (every process looks again within a second)");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let env_redis = std::env::var("WAVEGATE_REDIS_URL").ok();
    let args = match args::parse(std::env::args().skip(1), env_redis) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("wavegate: {error}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.command == Command::Help {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("wavegate: no runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wavegate: {error}");
            ExitCode::FAILURE
        }
    }
}
