//! `leap serve`: the agent each host runs for `leap bench --hosts`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use crate::serve::agent::{AgentConfig, Limits, serve};
use crate::serve::{capabilities, protocol};

/// Arguments of `leap serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Control address to listen on (the only socket the agent opens by
    /// itself; use the host's management address, never 0.0.0.0 on an
    /// untrusted network).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// File with the shared token (first line, 16..=1024 bytes, mode 0600).
    #[arg(long, default_value = "/etc/leap/serve.token", value_name = "PATH")]
    pub token_file: PathBuf,
    /// XDP object to load instead of the embedded one.
    #[arg(long, value_name = "PATH")]
    pub xdp_object: Option<PathBuf>,
    /// Coordinator connections open at once.
    #[arg(long, default_value_t = 8)]
    pub max_connections: usize,
    /// Longest run of one ring member, in seconds.
    #[arg(long, default_value_t = 600, value_name = "S")]
    pub max_run_s: u64,
    /// Print this host's capabilities as JSON, check the token file, and exit.
    #[arg(long)]
    pub check: bool,
}

/// Runs `leap serve`.
///
/// # Errors
///
/// An unusable token file, or the control address cannot be bound.
pub fn main(args: &ServeArgs) -> Result<()> {
    let token = protocol::read_token(&args.token_file)?;
    let object_ok =
        args.xdp_object.as_ref().is_some_and(|p| p.is_file()) || crate::transport::xdp::object::embedded().is_some();
    if args.check {
        println!("{}", serde_json::to_string_pretty(&capabilities::probe(object_ok))?);
        return Ok(());
    }
    if !(1..=256).contains(&args.max_connections) {
        anyhow::bail!("--max-connections {}: use 1..=256", args.max_connections);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let limits = Limits {
        max_connections: args.max_connections,
        max_run: Duration::from_secs(args.max_run_s.max(1)),
        ..Limits::default()
    };
    let cfg = AgentConfig { listen: args.listen, token, limits, xdp_object: args.xdp_object.clone() };
    serve(cfg, &stop)?;
    Ok(())
}
