//! `leap xdp attach|detach|status|stats`: the XDP program's lifecycle for
//! operators. `attach` pins the program under `/sys/fs/bpf/leap/<iface>/`
//! so that it stays after leap exits; `detach` removes the pins and with
//! them the program.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use leap_common::xdp::{XdpConfig, cfg, delivery};

use crate::transport::xdp::{AttachMode, ObjectSource, PartialChecksums, PinnedProgram, XdpProgram, host_filter_for};

/// Arguments of `leap xdp`.
#[derive(Debug, Clone, Args)]
pub struct XdpArgs {
    /// What to do.
    #[command(subcommand)]
    pub cmd: XdpCmd,
}

/// `leap xdp` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum XdpCmd {
    /// Load the program, attach it to an interface and pin it there.
    Attach(AttachArgs),
    /// Detach the program leap pinned on an interface.
    Detach {
        /// The interface.
        #[arg(long)]
        iface: String,
    },
    /// Show where leap's program is attached, in which mode, on which ports.
    Status {
        /// Only this interface (default: every one leap pinned).
        #[arg(long)]
        iface: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the program's decision counters, summed over CPUs.
    Stats {
        /// The interface.
        #[arg(long)]
        iface: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `leap xdp attach`.
#[derive(Debug, Clone, Args)]
pub struct AttachArgs {
    /// Interface to attach to.
    #[arg(long)]
    pub iface: String,
    /// Attach mode: native, generic, or native with fallback.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub mode: AttachMode,
    /// UDP port(s) of LEAP chunks to watch (repeat for several).
    #[arg(long = "port", default_value = "9999")]
    pub ports: Vec<u16>,
    /// Drop malformed LEAP chunks instead of passing them to the kernel.
    #[arg(long)]
    pub drop_malformed: bool,
    /// XDP object to load instead of the embedded one.
    #[arg(long, value_name = "PATH")]
    pub xdp_object: Option<PathBuf>,
    /// VLAN ID a tagged chunk may carry (repeat for several; default:
    /// untagged chunks only).
    #[arg(long = "vlan", value_name = "ID", value_parser = clap::value_parser!(u16).range(0..=4095))]
    pub vlans: Vec<u16>,
}

/// Runs `leap xdp ...`.
///
/// # Errors
///
/// Whatever fails, with context for the user.
pub fn main(args: &XdpArgs) -> Result<()> {
    match &args.cmd {
        XdpCmd::Attach(a) => attach(a),
        XdpCmd::Detach { iface } => {
            let p = PinnedProgram::open(iface)?;
            let mode = p.mode();
            p.unpin().with_context(|| format!("detaching from {iface}"))?;
            println!("detached leap's XDP program ({mode} mode) from {iface}");
            Ok(())
        }
        XdpCmd::Status { iface, json } => status(iface.as_deref(), *json),
        XdpCmd::Stats { iface, json } => {
            let c = PinnedProgram::open(iface)?.counters()?;
            if *json {
                println!("{}", serde_json::json!({ "iface": iface, "xdp": c }));
            } else {
                print!("{c}");
            }
            Ok(())
        }
    }
}

fn attach(a: &AttachArgs) -> Result<()> {
    if a.ports.is_empty() {
        bail!("give at least one --port");
    }
    let mut prog = XdpProgram::load(&ObjectSource::from_option(a.xdp_object.clone()))?;
    for &p in &a.ports {
        prog.add_port(p)?;
    }
    // Only chunks for this host (its MAC on the interface, any of its
    // addresses, the VLANs given), as the kernel would take them.
    let host = host_filter_for(&a.iface, None, &a.vlans, PartialChecksums::Auto)?;
    prog.accept_only(&host)?;
    // No AF_XDP socket is bound until a leap node opens one: chunks are
    // counted and passed to the kernel (`no_socket`) meanwhile.
    let flags = cfg::LOCAL_ONLY | if a.drop_malformed { cfg::DROP_REJECTED } else { 0 };
    let mac = host.mac.unwrap_or_default();
    prog.configure(&XdpConfig { delivery: delivery::XSK, flags, mac, ..XdpConfig::default() })?;
    let mode = prog.attach(&a.iface, a.mode)?;
    let kind = prog.kind();
    let dir = prog.pin().with_context(|| format!("pinning the program on {}", a.iface))?;
    println!("attached leap's XDP program ({kind}) to {} in {mode} mode; pinned at {}", a.iface, dir.display());
    Ok(())
}

fn status(iface: Option<&str>, json: bool) -> Result<()> {
    let ifaces = match iface {
        Some(i) => vec![i.to_string()],
        None => PinnedProgram::list(),
    };
    let mut rows = Vec::new();
    for i in &ifaces {
        let p = match PinnedProgram::open(i) {
            Ok(p) => p,
            Err(e) if iface.is_some() => return Err(e.into()),
            Err(e) => {
                log::warn!("{i}: {e}");
                continue;
            }
        };
        let (link_id, prog_id) = p.ids()?;
        let owner = match (p.is_persistent(), p.is_live()?) {
            (true, _) => "leap xdp attach",
            (false, true) => "running leap node",
            (false, false) => "stale (node gone; `leap xdp detach` removes the pins)",
        };
        let config = p.config()?;
        let delivery = match config.delivery {
            delivery::XSK => "af_xdp",
            delivery::RING_BUF => "ringbuf",
            _ => "pass",
        };
        // Which entry point: the multi-buffer one unless the kernel refused it.
        let program = p.kind()?.map(|k| k.name());
        rows.push(serde_json::json!({
            "iface": p.iface(),
            "mode": p.mode().name(),
            "program": program,
            "link_id": link_id,
            "prog_id": prog_id,
            "ports": p.ports()?,
            "delivery": delivery,
            "peer_filter": config.flags & cfg::PEER_FILTER != 0,
            "drop_rejected": config.flags & cfg::DROP_REJECTED != 0,
            "local_only": config.flags & cfg::LOCAL_ONLY != 0,
            "pinned": p.dir(),
            "owner": owner,
        }));
    }
    if json {
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    if rows.is_empty() {
        println!("leap's XDP program is not attached anywhere");
    }
    for r in rows {
        println!(
            "{}: {} mode, program {}, ports {}, delivery {}, prog id {}, link id {}, pinned at {} by {}",
            r["iface"].as_str().unwrap_or_default(),
            r["mode"].as_str().unwrap_or_default(),
            r["program"].as_str().unwrap_or("unknown"),
            r["ports"],
            r["delivery"].as_str().unwrap_or_default(),
            r["prog_id"],
            r["link_id"],
            r["pinned"].as_str().unwrap_or_default(),
            r["owner"].as_str().unwrap_or_default(),
        );
    }
    Ok(())
}
