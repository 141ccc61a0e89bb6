//! `leap node`: one ring member, for a ring across machines, configured by
//! flags or by a TOML file (`--config`, flags override it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use super::config::{self, NodePlan};
use super::{TransportArg, TransportArgs};
use crate::ring::{HeadConfig, NeighbourPolicy, WorkerConfig, run_head, run_worker};
use crate::telemetry::{self, Telemetry};
use crate::transport::Transport;
use crate::transport::config::AttachMode;
use crate::transport::open::{Endpoint, Options, TransportKind, open};

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
    /// TOML file describing the ring and this member (flags override it).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Validate the configuration (and privileges) and exit.
    #[arg(long)]
    pub check: bool,
    /// Backend (with --config: only this one, no fallback).
    #[arg(long, value_enum, required_unless_present = "config")]
    pub transport: Option<TransportArg>,
    /// This node's address (listen / bind / source), e.g. 10.0.0.1:9999.
    #[arg(long, value_name = "ADDR:PORT", required_unless_present = "config")]
    pub listen: Option<SocketAddr>,
    /// The next node's address.
    #[arg(long, value_name = "ADDR:PORT", required_unless_present = "config")]
    pub next: Option<SocketAddr>,
    /// Accept frames only from this address (the previous node).
    #[arg(long, value_name = "ADDR:PORT")]
    pub prev: Option<SocketAddr>,
    /// Interface where frames arrive (XDP attaches there).
    #[arg(long)]
    pub iface: Option<String>,
    /// Head or worker (with --config: the first member is the head).
    #[arg(long, value_enum)]
    pub role: Option<Role>,
    /// Bytes per frame.
    #[arg(long)]
    pub frame_size: Option<usize>,
    /// Head: frames to drive (0: until stopped).
    #[arg(long)]
    pub frames: Option<u64>,
    /// Frames in flight: the head sends this many at once, and every
    /// member's window and frames kept for NACKs follow it (give every
    /// member the same value).
    #[arg(long)]
    pub inflight: Option<usize>,
    /// Head: number of workers for the RESIZE_CHAIN round (0: skip it).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Worker: simulated compute per frame, microseconds.
    #[arg(long)]
    pub compute_us: Option<u64>,
    /// When a neighbour goes silent (no frame within --timeout-ms) or its
    /// connection closes: keep waiting for it, or exit non-zero.
    #[arg(long, value_enum)]
    pub on_neighbour_loss: Option<NeighbourArg>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Unix socket for `leap stats`.
    #[arg(long, value_name = "PATH")]
    pub stats_socket: Option<PathBuf>,
    /// Head: print the result as one JSON line.
    #[arg(long)]
    pub json: bool,
    /// Backend options.
    #[command(flatten)]
    pub transport_args: TransportArgs,
}

/// Everything `leap node` needs, from the file and the flags.
struct Resolved {
    name: String,
    role: Role,
    order: Vec<TransportKind>,
    fallback: bool,
    ep: Endpoint,
    opts: Options,
    frame_size: usize,
    frames: u64,
    inflight: usize,
    compute: Duration,
    policy: NeighbourPolicy,
    metrics: Option<SocketAddr>,
    stats_socket: Option<PathBuf>,
}

fn resolve(args: &NodeArgs) -> Result<Resolved> {
    let plan: Option<NodePlan> = match &args.config {
        Some(p) => Some(config::load(p).map_err(|e| anyhow::anyhow!("{e}"))?),
        None => None,
    };
    let file = plan.as_ref().map(|p| &p.file);
    let frame_size = args.frame_size.or(file.map(|f| f.ring.frame_size)).unwrap_or(16_392);
    let min = leap_common::control::CONTROL_FRAME_MIN;
    if frame_size < min || frame_size > crate::ring::MAX_FRAME {
        bail!("--frame-size {frame_size}: must be {min}..={} bytes", crate::ring::MAX_FRAME);
    }
    let mut opts = args.transport_args.options(frame_size);
    // `leap xdp status|stats` on this host see the node's program.
    opts.xdp_pin = true;
    if let Some(f) = file {
        let t = &f.transport;
        // Flags left at their defaults take the file's value.
        if args.transport_args.timeout_ms == 1000 {
            opts.recv_timeout = (t.recv_timeout_ms > 0).then(|| Duration::from_millis(t.recv_timeout_ms));
        }
        if args.transport_args.setup_timeout_s == 30 {
            opts.setup_timeout = Duration::from_secs(t.setup_timeout_s.max(1));
        }
        if args.transport_args.xdp_mode == AttachMode::Auto {
            // Checked when the file was read.
            opts.xdp_mode = t.xdp_mode.parse().unwrap_or_default();
        }
        if args.transport_args.xdp_object.is_none() {
            opts.xdp_object = t.xdp_object.clone();
        }
        if args.transport_args.xdp_vlans.is_empty() {
            opts.xdp_vlans = t.vlans.clone();
        }
        if args.transport_args.reliability == super::ReliabilityArg::Reliable {
            opts.reliability = t.reliability;
        }
        if args.transport_args.cpus.is_empty() {
            opts.cpus = f.node.cpus.clone();
        }
        if !args.transport_args.no_crc {
            opts.crc = t.crc;
        }
        if !args.transport_args.no_trains {
            opts.trains = t.trains;
        }
        if args.transport_args.window.is_none() {
            opts.window = t.window;
        }
        if args.transport_args.keep_frames.is_none() {
            opts.keep_frames = t.keep_frames;
        }
        if args.transport_args.window_memory_mib == crate::frame::window::DEFAULT_WINDOW_MEMORY >> 20
            && let Some(mib) = t.window_memory_mib
        {
            opts.window_memory = mib.saturating_mul(1 << 20);
        }
        if args.transport_args.tcp_source_port.is_none() {
            opts.tcp_source_port = t.tcp_source_port.filter(|&p| p > 0);
        }
        if args.transport_args.tcp_prev_port.is_none() {
            opts.tcp_prev_port = t.tcp_prev_port.filter(|&p| p > 0);
        }
        if args.transport_args.busy_poll.is_none() {
            opts.busy_poll = t.busy_poll_us.filter(|&us| us > 0).map(Duration::from_micros);
        }
        if args.transport_args.xdp_queues.0.is_none()
            && let Some(list) = t.queues.as_ref().and_then(|q| q.as_array())
        {
            opts.xdp_queues = Some(list.iter().filter_map(|v| v.as_integer()).map(|n| n as u32).collect());
        }
    }
    let inflight = args.inflight.or(file.map(|f| f.ring.inflight)).unwrap_or(1).max(1);
    opts.inflight = inflight;
    if let Err(e) = opts.windows() {
        bail!(
            "--inflight {inflight} with --frame-size {frame_size} (--window, --keep-frames, --window-memory-mib): {e}"
        );
    }
    let (order, fallback) = match (args.transport, &plan) {
        (Some(t), _) => (vec![TransportKind::from(t)], false),
        (None, Some(p)) => (p.order.clone(), true),
        (None, None) => bail!("--transport is required without --config"),
    };
    let listen = args.listen.or(plan.as_ref().map(|p| p.listen)).context("--listen is required without --config")?;
    let next = args.next.or(plan.as_ref().map(|p| p.next)).context("--next is required without --config")?;
    let prev = args.prev.or(plan.as_ref().and_then(|p| p.prev));
    let iface = args.iface.clone().or(file.and_then(|f| f.transport.interface.clone()));
    if let Some(i) = &iface
        && !std::path::Path::new("/sys/class/net").join(i).exists()
    {
        bail!("--iface {i}: no such interface on this host (see `ip link`)");
    }
    let role = args.role.unwrap_or(if plan.as_ref().is_some_and(|p| p.is_head) { Role::Head } else { Role::Worker });
    let policy = match args
        .on_neighbour_loss
        .map(|p| p == NeighbourArg::Exit)
        .or(file.and_then(|f| f.node.on_neighbour_loss.as_deref()).map(|p| p == "exit"))
    {
        Some(true) => NeighbourPolicy::Exit,
        _ => NeighbourPolicy::Wait,
    };
    let metrics = match args.metrics {
        Some(m) => Some(m),
        None => file.and_then(|f| f.node.metrics.as_deref()).map(|m| m.parse()).transpose()?,
    };
    Ok(Resolved {
        name: plan.as_ref().map_or_else(|| listen.to_string(), |p| p.name.clone()),
        role,
        order,
        fallback,
        ep: Endpoint { listen, next, prev, iface },
        opts,
        frame_size,
        frames: args.frames.or(file.map(|f| f.ring.frames)).unwrap_or(1000),
        inflight,
        compute: Duration::from_micros(args.compute_us.or(file.map(|f| f.ring.compute_us)).unwrap_or(0)),
        policy,
        metrics,
        stats_socket: args.stats_socket.clone().or(file.and_then(|f| f.node.stats_socket.clone())),
    })
}

/// The log level a config file asks for, if any (before logging starts).
pub fn config_log_level(args: &NodeArgs) -> Option<String> {
    let p = args.config.as_ref()?;
    config::load(p).ok()?.file.node.log
}

/// Opens the first backend in `order` that works here. With `fallback`,
/// each one that cannot run is logged once and the next tried; without, the
/// error is returned.
fn open_first(r: &Resolved) -> Result<(TransportKind, Box<dyn Transport>)> {
    let mut last = None;
    for &kind in &r.order {
        if let Some(why) = config::missing_privileges(kind) {
            if !r.fallback {
                bail!("{why}");
            }
            log::warn!("{kind} unavailable: {why}; trying the next transport");
            last = Some(anyhow::anyhow!(why));
            continue;
        }
        match open(kind, &r.ep, &r.opts) {
            Ok(t) => {
                log::info!("node {}: using {kind} on {}", r.name, r.ep.listen);
                return Ok((kind, t));
            }
            Err(e) if r.fallback => {
                log::warn!("{kind} unavailable: {e}; trying the next transport");
                last = Some(anyhow::anyhow!("{kind}: {e}"));
            }
            Err(e) => {
                return Err(anyhow::anyhow!(e).context(format!("opening the {kind} transport on {}", r.ep.listen)));
            }
        }
    }
    Err(last
        .unwrap_or_else(|| anyhow::anyhow!("no transport to try"))
        .context("no transport of transport.order works here"))
}

/// Runs `leap node`.
///
/// # Errors
///
/// Bad arguments or configuration, missing privileges, or a transport
/// failure.
pub fn main(args: &NodeArgs) -> Result<()> {
    let r = resolve(args)?;
    if args.check {
        let problems: Vec<Option<String>> = r
            .order
            .iter()
            .map(|k| {
                config::missing_privileges(*k).or_else(|| {
                    // Load the program as this process would: the verifier
                    // decides, under exactly these capabilities.
                    matches!(k, TransportKind::Xdp | TransportKind::XdpRingbuf)
                        .then(|| config::xdp_load_problem(r.opts.xdp_object.as_deref()))
                        .flatten()
                })
            })
            .collect();
        let usable: Vec<String> = r
            .order
            .iter()
            .zip(&problems)
            .map(|(k, p)| match p {
                Some(why) => format!("{k}: unavailable ({why})"),
                None => format!("{k}: ok"),
            })
            .collect();
        println!("configuration ok: node {} ({:?}) listens on {}, next {}", r.name, r.role, r.ep.listen, r.ep.next);
        for u in &usable {
            println!("  {u}");
        }
        if problems.iter().all(Option::is_some) {
            bail!("none of the transports can run here with these privileges");
        }
        return Ok(());
    }
    if !r.opts.cpus.is_empty() {
        // Before any thread starts: the telemetry threads inherit the mask.
        crate::sys::pin_thread(&r.opts.cpus).context("--cpus")?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let (kind, mut t) = open_first(&r)?;
    let role = if r.role == Role::Head { "head" } else { "worker" };
    let tel = Arc::new(Telemetry::new(&r.name, role, kind.as_str()));
    tel.set_source_control(t.source_control());
    // Its own thread: a slow client never holds up the frame loop.
    let servers = telemetry::serve(tel.clone(), r.metrics, r.stats_socket.as_deref(), telemetry::Limits::default())?;
    let res = run(&r, kind, &mut *t, &tel, &stop, args.json, args.workers);
    tel.publish(&*t, 0, true);
    // Detach (XDP), close sockets and the device before the servers go
    // (the stats socket's handle on the link too).
    tel.set_source_control(None);
    drop(t);
    servers.stop();
    res
}

fn run(
    r: &Resolved,
    kind: TransportKind,
    t: &mut dyn Transport,
    tel: &Arc<Telemetry>,
    stop: &Arc<AtomicBool>,
    json: bool,
    workers: usize,
) -> Result<()> {
    match r.role {
        Role::Worker => {
            let wc = WorkerConfig {
                frame_size: r.frame_size,
                compute: r.compute,
                policy: r.policy,
                telemetry: Some(tel.clone()),
                copying: false,
                max_frames: None,
            };
            let layers = run_worker(t, &wc, stop).context("worker stopped")?;
            log::info!("worker stopped; layers {:?}", layers.range);
        }
        Role::Head => {
            let (lost_after, retry) = crate::ring::loss_policy(kind, r.opts.reliability);
            let hc = HeadConfig {
                frame_size: r.frame_size,
                frames: if r.frames == 0 { u64::MAX / 2 } else { r.frames },
                inflight: r.inflight,
                stall_timeout: Duration::from_secs(10),
                lost_after: Some(lost_after),
                retry,
                control_workers: (workers > 0).then_some(workers),
                progress: None,
                telemetry: Some(tel.clone()),
                stop: Some(stop.clone()),
                pause: Duration::ZERO,
                copying: false,
            };
            let rep = run_head(t, &hc)?;
            let rtt = rep.rtt.percentiles();
            let out = serde_json::json!({
                "transport": kind.as_str(),
                "frame_size": r.frame_size,
                "frames_sent": rep.sent,
                "frames_delivered": rep.delivered,
                "frames_corrupt": rep.corrupt,
                "frames_lost": rep.lost,
                "frames_resent": rep.resent,
                "frames_duplicate": rep.duplicates,
                "rtt_us": rtt,
                "control_ack": rep.control_ack,
                "stats": t.stats(),
                "backend": t.backend_counters(),
            });
            if json {
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
