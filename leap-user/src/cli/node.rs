//! `leap node`: one ring member, for a ring across machines.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use super::{TransportArg, TransportArgs};
use crate::ring::{HeadConfig, NeighbourPolicy, Percentiles, run_head, run_worker};
use crate::transport::open::{Endpoint, TransportKind, open};

/// The member's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Sends frames and checks what comes back.
    Head,
    /// Receives, computes, forwards.
    Worker,
}

/// `--on-neighbour-loss` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NeighbourArg {
    /// Wait for it to come back.
    Wait,
    /// Exit non-zero.
    Exit,
}

/// Arguments of `leap node`.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Backend to use.
    #[arg(long, value_enum)]
    pub transport: TransportArg,
    /// This node's address (listen / bind / source), e.g. 10.0.0.1:9999.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// The next node's address.
    #[arg(long, value_name = "ADDR:PORT")]
    pub next: SocketAddr,
    /// Accept frames only from this address (the previous node).
    #[arg(long, value_name = "ADDR:PORT")]
    pub prev: Option<SocketAddr>,
    /// Interface where frames arrive (XDP attaches there).
    #[arg(long)]
    pub iface: Option<String>,
    /// Head or worker.
    #[arg(long, value_enum, default_value = "worker")]
    pub role: Role,
    /// Bytes per frame.
    #[arg(long, default_value_t = 16392)]
    pub frame_size: usize,
    /// Head: frames to drive.
    #[arg(long, default_value_t = 1000)]
    pub frames: u64,
    /// Head: frames in flight.
    #[arg(long, default_value_t = 1)]
    pub inflight: usize,
    /// Head: number of workers for the RESIZE_CHAIN round (0: skip it).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Worker: simulated compute per frame, microseconds.
    #[arg(long, default_value_t = 0)]
    pub compute_us: u64,
    /// When a neighbour goes silent (no frame within --timeout-ms) or its
    /// connection closes: keep waiting for it, or exit non-zero.
    #[arg(long, value_enum, default_value = "wait")]
    pub on_neighbour_loss: NeighbourArg,
    /// Head: print the result as one JSON line.
    #[arg(long)]
    pub json: bool,
    /// Backend options.
    #[command(flatten)]
    pub transport_args: TransportArgs,
}

/// Runs `leap node`.
///
/// # Errors
///
/// Bad arguments or a transport failure.
pub fn main(args: &NodeArgs) -> Result<()> {
    let min = leap_common::control::CONTROL_FRAME_MIN;
    if args.frame_size < min || args.frame_size > crate::ring::MAX_FRAME {
        bail!("--frame-size {}: must be {min}..={} bytes", args.frame_size, crate::ring::MAX_FRAME);
    }
    let ep = Endpoint { listen: args.listen, next: args.next, prev: args.prev, iface: args.iface.clone() };
    let opts = args.transport_args.options(args.frame_size);
    let kind: TransportKind = args.transport.into();
    let mut t = open(kind, &ep, &opts).with_context(|| format!("opening the {kind} transport on {}", args.listen))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    match args.role {
        Role::Worker => {
            let policy = match args.on_neighbour_loss {
                NeighbourArg::Wait => NeighbourPolicy::Wait,
                NeighbourArg::Exit => NeighbourPolicy::Exit,
            };
            let layers = run_worker(&mut *t, args.frame_size, Duration::from_micros(args.compute_us), &stop, policy)
                .context("worker stopped")?;
            log::info!("worker stopped; layers {:?}", layers.range);
        }
        Role::Head => {
            let hc = HeadConfig {
                frame_size: args.frame_size,
                frames: args.frames,
                inflight: args.inflight.max(1),
                stall_timeout: Duration::from_secs(10),
                lost_after: Some(crate::ring::loss_policy(kind, opts.reliability).0),
                retry: crate::ring::loss_policy(kind, opts.reliability).1,
                control_workers: (args.workers > 0).then_some(args.workers),
                progress: None,
            };
            let mut rep = run_head(&mut *t, &hc)?;
            let rtt = Percentiles::of(&mut rep.rtts_ns);
            let out = serde_json::json!({
                "transport": kind.as_str(),
                "frame_size": args.frame_size,
                "frames_sent": rep.sent,
                "frames_delivered": rep.delivered,
                "frames_corrupt": rep.corrupt,
                "frames_lost": rep.lost,
                "frames_resent": rep.resent,
                "frames_duplicate": rep.duplicates,
                "rtt_us": rtt,
                "control_ack": rep.control_ack,
                "stats": t.stats(),
            });
            if args.json {
                println!("{out}");
            } else {
                println!("{}", serde_json::to_string_pretty(&out)?);
            }
            if rep.corrupt > 0 {
                bail!("{} corrupt frames", rep.corrupt);
            }
        }
    }
    if stop.load(Ordering::Relaxed) {
        log::info!("stopped by signal");
    }
    Ok(())
}
