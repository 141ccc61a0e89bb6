//! `leap stats`: a running node's counters, from its stats socket.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

/// Arguments of `leap stats`.
#[derive(Debug, Clone, Args)]
pub struct StatsArgs {
    /// The node's stats socket (`--stats-socket` / `node.stats_socket`).
    #[arg(long, value_name = "PATH", default_value = "/run/leap/leap.sock")]
    pub socket: PathBuf,
    /// Print JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Release the node's lock on the source it takes frames from (a
    /// datagram node with no previous node configured locks onto the first
    /// source): the next source that sends a valid chunk is taken.
    #[arg(long, conflicts_with = "reload_keys")]
    pub release_source: bool,
    /// Make the node read its ring key files (key_file, previous_key_file)
    /// again and use them from now on, as `kill -HUP` does; a file that
    /// cannot be used leaves the keys in use.
    #[arg(long)]
    pub reload_keys: bool,
}

/// Runs `leap stats`.
///
/// # Errors
///
/// The node is not running or the socket is not a leap node's.
pub fn main(args: &StatsArgs) -> Result<()> {
    if args.release_source {
        let v = crate::telemetry::release_source(&args.socket)
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.socket.display()))?;
        if args.json {
            println!("{v}");
        } else if v["released"] == true {
            println!(
                "released the lock on {}; the next source that sends a valid chunk is taken",
                v["source"].as_str().unwrap_or("?")
            );
        } else {
            println!("nothing released: {}", v["reason"].as_str().or(v["error"].as_str()).unwrap_or("?"));
        }
        return Ok(());
    }
    if args.reload_keys {
        let v = crate::telemetry::reload_keys(&args.socket)
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.socket.display()))?;
        if args.json {
            println!("{v}");
        } else if v["reloaded"] == true {
            println!("reloaded: the node now uses {}", v["keys"].as_str().unwrap_or("?"));
        } else {
            anyhow::bail!("keys not reloaded: {}", v["reason"].as_str().or(v["error"].as_str()).unwrap_or("?"));
        }
        return Ok(());
    }
    let v = crate::telemetry::query_stats(&args.socket).map_err(|e| match e {
        e @ crate::telemetry::StatsQueryError::Connect { .. } => anyhow::anyhow!(e),
        e => anyhow::anyhow!("{}: {e}", args.socket.display()),
    })?;
    if args.json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "node {} ({}, {}), up {:.0} s, {} frames",
        v["node"],
        v["role"],
        v["transport"],
        v["uptime_s"].as_f64().unwrap_or(0.0),
        v["frames"]
    );
    if let Some(s) = v["stats"].as_object() {
        for (k, val) in s {
            if k != "drops" {
                println!("  {k:<16} {val}");
            }
        }
        if let Some(d) = s.get("drops").and_then(|d| d.as_object()) {
            let nz: Vec<String> =
                d.iter().filter(|(_, v)| v.as_u64() != Some(0)).map(|(k, v)| format!("{k}={v}")).collect();
            println!("  drops            {}", if nz.is_empty() { "none".into() } else { nz.join(" ") });
        }
    }
    if !v["backend"].is_null() {
        println!("  backend          {}", v["backend"]);
    }
    Ok(())
}
