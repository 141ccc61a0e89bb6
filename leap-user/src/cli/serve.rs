//! `leap serve`: the agent each host runs for `leap bench --hosts`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use crate::serve::agent::{AgentConfig, Limits, serve};
use crate::serve::allow::{AllowList, ServeFile};
use crate::serve::{capabilities, protocol};

/// The agent's config file when `--config` is not given (used if it exists).
pub const DEFAULT_CONFIG: &str = "/etc/leap/serve.toml";

/// Arguments of `leap serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Control address to listen on (the only socket the agent opens by
    /// itself; use the host's management address, never 0.0.0.0 on an
    /// untrusted network).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// File with this host's token (first line, 16..=1024 bytes; a regular
    /// file, not a symbolic link, owned by root or the service user, mode
    /// 0600 or stricter). It keys the handshake and is never sent.
    #[arg(long, default_value = "/etc/leap/serve.token", value_name = "PATH")]
    pub token_file: PathBuf,
    /// The agent's config file (TOML): `[allow]` with `networks`, `ports`,
    /// `interfaces` and `loopback`, what ring members may reach; read from
    /// /etc/leap/serve.toml when that exists and no path is given. Keys left
    /// out: the interfaces holding --listen's address and their networks,
    /// ports from 1024, no loopback.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// XDP object to load instead of the embedded one.
    #[arg(long, value_name = "PATH")]
    pub xdp_object: Option<PathBuf>,
    /// Coordinator sessions (authenticated) open at once; handshakes in
    /// progress are bounded apart (32) and never displace a session.
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
    let default = std::path::Path::new(DEFAULT_CONFIG);
    let config = args.config.clone().or_else(|| default.exists().then(|| default.into()));
    let file: ServeFile = match &config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
        }
        None => ServeFile::default(),
    };
    let allow = AllowList::from_config(&file.allow, args.listen)
        .map_err(|e| anyhow::anyhow!("{}: [allow]: {e}", config.as_deref().unwrap_or("defaults".as_ref()).display()))?;
    let object_ok =
        args.xdp_object.as_ref().is_some_and(|p| p.is_file()) || crate::transport::xdp::object::embedded().is_some();
    if args.check {
        println!("{}", serde_json::to_string_pretty(&capabilities::probe(object_ok))?);
        eprintln!("leap serve: members may use {}", describe(&allow));
        return Ok(());
    }
    log::info!("leap serve: members may use {}", describe(&allow));
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
    let cfg = AgentConfig { listen: args.listen, token, limits, xdp_object: args.xdp_object.clone(), allow };
    serve(cfg, &stop)?;
    Ok(())
}

fn describe(a: &AllowList) -> String {
    let nets: Vec<String> = a.networks.iter().map(|n| n.to_string()).collect();
    let ports: Vec<String> = a.ports.iter().map(|(x, y)| format!("{x}-{y}")).collect();
    format!(
        "networks [{}], ports [{}], interfaces [{}], loopback {}",
        nets.join(", "),
        ports.join(", "),
        a.interfaces.join(", "),
        if a.loopback { "allowed" } else { "refused" }
    )
}
