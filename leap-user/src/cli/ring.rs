//! `leap ring`: a whole ring on this host, every frame checked.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;

use super::{TransportArg, TransportArgs};
use crate::ring::{Placement, Progress, RingConfig, RingReport, run};

/// Arguments of `leap ring`.
#[derive(Debug, Clone, Args)]
pub struct RingArgs {
    /// Backend to use.
    #[arg(long, value_enum)]
    pub transport: TransportArg,
    /// Nodes in the ring, head included.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Bytes per frame (8-byte header + activations).
    #[arg(long, default_value_t = 16392)]
    pub frame_size: usize,
    /// Frames to drive around the ring.
    #[arg(long, default_value_t = 1000)]
    pub frames: u64,
    /// Frames in flight at once.
    #[arg(long, default_value_t = 1)]
    pub inflight: usize,
    /// All nodes on 127.0.0.1 (the default).
    #[arg(long, conflicts_with = "netns")]
    pub loopback: bool,
    /// One network namespace per node, linked by veth pairs (root).
    #[arg(long)]
    pub netns: bool,
    /// Simulated compute per worker per frame, microseconds.
    #[arg(long, default_value_t = 0)]
    pub compute_us: u64,
    /// Port (namespaces: every node; loopback: first of consecutive ports;
    /// 0: free ports on loopback, 9999 in namespaces).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Abort when no frame comes back for this many seconds.
    #[arg(long, default_value_t = 10)]
    pub stall_timeout_s: u64,
    /// Drop this percent of datagrams on every link (with --netns; nftables).
    #[arg(long, default_value_t = 0.0, value_name = "PCT")]
    pub loss: f64,
    /// Skip the RESIZE_CHAIN / ACK round before the data.
    #[arg(long)]
    pub no_control: bool,
    /// Run every node with exactly the capabilities the packaged unit grants
    /// (CAP_BPF, CAP_NET_ADMIN, CAP_NET_RAW; CAP_IPC_LOCK for
    /// its LimitMEMLOCK=infinity), as root only sets up the namespaces.
    #[arg(long)]
    pub unit_caps: bool,
    /// Move frames through the copying API (`recv_prev` into a buffer of the
    /// node, `send_next` from it) instead of the lending one (`relay`,
    /// `send_next_with`, `recv_prev_lent`), to compare their copies.
    #[arg(long)]
    pub copying_api: bool,
    /// MTU of the namespaces' veths, bytes (with --netns; e.g. 9000 for
    /// jumbo frames, where chunk trains carry up to six chunks a datagram).
    #[arg(long, value_name = "BYTES")]
    pub mtu: Option<u32>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Backend options.
    #[command(flatten)]
    pub transport_args: TransportArgs,
}

impl RingArgs {
    /// The ring these arguments describe.
    pub fn config(&self) -> RingConfig {
        let mut c = RingConfig::new(self.transport.into(), self.nodes, self.frame_size, self.frames);
        c.inflight = self.inflight;
        c.compute = Duration::from_micros(self.compute_us);
        c.placement = if self.netns { Placement::Netns } else { Placement::Loopback };
        c.port = self.port;
        c.options = self.transport_args.options(self.frame_size);
        c.stall_timeout = Duration::from_secs(self.stall_timeout_s.max(1));
        c.control = !self.no_control;
        c.loss_pct = self.loss;
        c.unit_caps = self.unit_caps;
        c.copying = self.copying_api;
        c.mtu = self.mtu;
        c
    }
}

/// Runs `leap ring`.
///
/// # Errors
///
/// Bad arguments, a failed node, or corrupt frames.
pub fn main(args: &RingArgs) -> Result<()> {
    let mut cfg = args.config();
    cfg.options.ring_key = args.transport_args.keys()?;
    cfg.validate()?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(cfg.frames);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} frames ({per_sec})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message(format!("{} x{}", cfg.transport, cfg.nodes));
        b
    });
    if let Some(b) = &bar {
        let b = b.clone();
        cfg.progress = Some(Progress(Arc::new(move |n| b.set_position(n))));
    }
    let report = run(&cfg);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let report = report?;
    print_report(&report, args.json)?;
    if report.frames_corrupt > 0 {
        bail!("{} corrupt frames delivered", report.frames_corrupt);
    }
    Ok(())
}

/// Prints a report for people, or as one JSON line.
///
/// # Errors
///
/// Serialisation failure (not expected).
pub fn print_report(r: &RingReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    println!(
        "{} ring, {} nodes ({:?}), {} B frames, {} in flight",
        r.transport, r.nodes, r.placement, r.frame_size, r.inflight
    );
    println!(
        "frames: {} sent, {} delivered, {} corrupt, {} lost",
        r.frames_sent, r.frames_delivered, r.frames_corrupt, r.frames_lost
    );
    println!(
        "round trip: p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us",
        r.rtt_us.p50, r.rtt_us.p90, r.rtt_us.p99, r.rtt_us.max
    );
    println!(
        "{:.0} round trips/s, {:.3} Gbit/s, {:.1} us CPU per frame, {:.2} datagrams per frame",
        r.round_trips_per_s, r.gbit_per_s, r.cpu_us_per_frame, r.datagrams_per_frame
    );
    if r.stats.drops.total() > 0 {
        println!("dropped datagrams: {:?}", r.stats.drops);
    }
    Ok(())
}
