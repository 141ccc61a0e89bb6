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
use super::source::{Given, Setting, Source, Spelled};
use super::{TransportArg, TransportArgs};
use crate::ring::{HeadConfig, NeighbourPolicy, WorkerConfig, run_head, run_worker};
use crate::telemetry::{self, Telemetry};
use crate::transport::Transport;
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
    // First: parsing takes each field's value out of the matches in order.
    /// Which of these were given on the command line (they win over the
    /// file, even at their default values).
    #[command(flatten)]
    pub given: Given,
    /// TOML file describing the ring and this member (flags override it).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print every effective setting, one per line as `NAME VALUE (SOURCE)`
    /// (NAME: the flag's long name; VALUE: as the flag takes it, `none` for
    /// nothing, lists comma-separated; SOURCE: flag, file or default, or env
    /// for a log level from RUST_LOG), then check the privileges each
    /// transport needs, and exit.
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
    /// Every setting above, where it came from (`--check` prints them).
    settings: Vec<Setting>,
}

/// Takes each setting from the flags, the node file and the defaults, in
/// that order, and lists what it took from where.
struct Layers<'a> {
    given: &'a Given,
    plan: Option<&'a NodePlan>,
    settings: Vec<Setting>,
}

impl Layers<'_> {
    /// The setting `name` (its flag's long name): the flag's value if the
    /// flag was given, even at its default value; else the file's if the
    /// file sets `key`; else the default, the file's own (`file`) when
    /// there is a file, the flag's (`flag`, not given) when there is none.
    fn pick<T: Spelled>(&mut self, name: &'static str, flag: T, key: &str, file: impl FnOnce(&NodePlan) -> T) -> T {
        let (value, source) = match self.plan {
            _ if self.given.contains(&flag_id(name)) => (flag, Source::Flag),
            Some(p) if p.file.keys.contains(key) => (file(p), Source::File),
            Some(p) => (file(p), Source::Default),
            None => (flag, Source::Default),
        };
        self.settings.push(Setting { name, value: value.spelled(), source });
        value
    }

    /// A setting that only a flag sets.
    fn flag<T: Spelled>(&mut self, name: &'static str, flag: T) -> T {
        let source = if self.given.contains(&flag_id(name)) { Source::Flag } else { Source::Default };
        self.settings.push(Setting { name, value: flag.spelled(), source });
        flag
    }
}

/// The clap id of the flag `--name`: its field's name.
fn flag_id(name: &str) -> String {
    name.replace('-', "_")
}

fn resolve(args: &NodeArgs, log_flag: &str) -> Result<Resolved> {
    let plan: Option<NodePlan> = match &args.config {
        Some(p) => Some(config::load(p).map_err(|e| anyhow::anyhow!("{e}"))?),
        None => None,
    };
    let mut l = Layers { given: &args.given, plan: plan.as_ref(), settings: Vec::new() };
    // Where this member sits in the ring.
    let transport = args.transport.map(|t| vec![TransportKind::from(t)]);
    let order = l.pick("transport", transport.clone().unwrap_or_default(), "transport.order", |p| p.order.clone());
    let fallback = transport.is_none();
    let listen = l.pick("listen", args.listen, "ring.members", |p| Some(p.listen));
    let next = l.pick("next", args.next, "ring.members", |p| Some(p.next));
    let prev = l.pick("prev", args.prev, "ring.members", |p| p.prev);
    let iface = l.pick("iface", args.iface.clone(), "transport.interface", |p| p.file.transport.interface.clone());
    let file_role = |p: &NodePlan| if p.is_head { Role::Head } else { Role::Worker };
    let role = l.pick("role", args.role.unwrap_or(Role::Worker), "ring.me", file_role);
    // What it runs.
    let frame_size =
        l.pick("frame-size", args.frame_size.unwrap_or(16_392), "ring.frame_size", |p| p.file.ring.frame_size);
    let frames = l.pick("frames", args.frames.unwrap_or(1000), "ring.frames", |p| p.file.ring.frames);
    let inflight =
        l.pick("inflight", args.inflight.unwrap_or(1).max(1), "ring.inflight", |p| p.file.ring.inflight.max(1));
    let compute_us = l.pick("compute-us", args.compute_us.unwrap_or(0), "ring.compute_us", |p| p.file.ring.compute_us);
    let file_policy = |p: &NodePlan| match p.file.node.on_neighbour_loss.as_deref() {
        Some("exit") => NeighbourArg::Exit,
        _ => NeighbourArg::Wait,
    };
    let loss = l.pick(
        "on-neighbour-loss",
        args.on_neighbour_loss.unwrap_or(NeighbourArg::Wait),
        "node.on_neighbour_loss",
        file_policy,
    );
    // Checked when the file was read.
    let metrics = l
        .pick("metrics", args.metrics, "node.metrics", |p| p.file.node.metrics.as_deref().and_then(|m| m.parse().ok()));
    let stats_socket =
        l.pick("stats-socket", args.stats_socket.clone(), "node.stats_socket", |p| p.file.node.stats_socket.clone());
    let (level, source) = log_level_of(&args.given, log_flag, plan.as_ref().map(|p| &p.file));
    l.settings.push(Setting { name: "log", value: level, source });
    l.flag("workers", args.workers);
    l.flag("json", args.json);
    // How it moves frames: the backend options, in the flags' order.
    let ta = &args.transport_args;
    let merged = TransportArgs {
        timeout_ms: l.pick("timeout-ms", ta.timeout_ms, "transport.recv_timeout_ms", |p| t(p).recv_timeout_ms),
        setup_timeout_s: l
            .pick("setup-timeout-s", ta.setup_timeout_s, "transport.setup_timeout_s", |p| t(p).setup_timeout_s),
        tcp_framing: l.flag("tcp-framing", ta.tcp_framing),
        tcp_source_port: l.pick("tcp-source-port", ta.tcp_source_port, "transport.tcp_source_port", |p| {
            t(p).tcp_source_port.filter(|&port| port > 0)
        }),
        tcp_prev_port: l.pick("tcp-prev-port", ta.tcp_prev_port, "transport.tcp_prev_port", |p| {
            t(p).tcp_prev_port.filter(|&port| port > 0)
        }),
        original_compat: l.flag("original-compat", ta.original_compat),
        key_file: l.pick("key-file", ta.key_file.clone(), "transport.key_file", |p| t(p).key_file.clone()),
        previous_key_file: l.pick(
            "previous-key-file",
            ta.previous_key_file.clone(),
            "transport.previous_key_file",
            |p| t(p).previous_key_file.clone(),
        ),
        encrypt: l.pick("encrypt", ta.encrypt, "transport.encrypt", |p| t(p).encrypt),
        spin_us: l.flag("spin-us", ta.spin_us),
        xdp_object: l.pick("xdp-object", ta.xdp_object.clone(), "transport.xdp_object", |p| t(p).xdp_object.clone()),
        xdp_mode: l.pick("xdp-mode", ta.xdp_mode, "transport.xdp_mode", |p| t(p).xdp_mode),
        xdp_queues: l.pick("xdp-queues", ta.xdp_queues.clone(), "transport.queues", |p| t(p).queues.clone()),
        xdp_vlans: l.pick("xdp-vlan", ta.xdp_vlans.clone(), "transport.vlans", |p| t(p).vlans.clone()),
        reliability: l.pick("reliability", ta.reliability, "transport.reliability", |p| t(p).reliability.into()),
        no_gso: l.flag("no-gso", ta.no_gso),
        no_crc: l.pick("no-crc", ta.no_crc, "transport.crc", |p| !t(p).crc),
        no_trains: l.pick("no-trains", ta.no_trains, "transport.trains", |p| !t(p).trains),
        // 0 is off, as in the file.
        busy_poll: l.pick("busy-poll", ta.busy_poll.filter(|&us| us > 0), "transport.busy_poll_us", |p| {
            t(p).busy_poll_us.filter(|&us| us > 0)
        }),
        cpus: l.pick("cpus", ta.cpus.clone(), "node.cpus", |p| p.file.node.cpus.clone()),
        window: l.pick("window", ta.window, "transport.window", |p| t(p).window),
        keep_frames: l
            .pick("keep-frames", ta.keep_frames, "transport.keep_frames", |p| t(p).keep_frames.map(|k| k as u64)),
        window_memory_mib: l.pick("window-memory-mib", ta.window_memory_mib, "transport.window_memory_mib", |p| {
            t(p).window_memory_mib.unwrap_or(crate::frame::window::DEFAULT_WINDOW_MEMORY >> 20)
        }),
    };
    let min = leap_common::control::CONTROL_FRAME_MIN;
    if frame_size < min || frame_size > crate::ring::MAX_FRAME {
        bail!("--frame-size {frame_size}: must be {min}..={} bytes", crate::ring::MAX_FRAME);
    }
    let mut opts = merged.options(frame_size);
    opts.ring_key = merged.keys()?;
    if opts.ring_key.is_none() && merged.encrypt {
        bail!("--encrypt (encrypt = true) needs a ring key: give --key-file (key_file = ...)");
    }
    // `leap xdp status|stats` on this host see the node's program.
    opts.xdp_pin = true;
    opts.inflight = inflight;
    if let Err(e) = opts.windows() {
        bail!(
            "--inflight {inflight} with --frame-size {frame_size} (--window, --keep-frames, --window-memory-mib): {e}"
        );
    }
    if order.is_empty() {
        bail!("--transport is required without --config");
    }
    let listen = listen.context("--listen is required without --config")?;
    let next = next.context("--next is required without --config")?;
    if let Some(i) = &iface
        && !std::path::Path::new("/sys/class/net").join(i).exists()
    {
        bail!("--iface {i}: no such interface on this host (see `ip link`)");
    }
    Ok(Resolved {
        name: plan.as_ref().map_or_else(|| listen.to_string(), |p| p.name.clone()),
        role,
        order,
        fallback,
        ep: Endpoint { listen, next, prev, iface },
        opts,
        frame_size,
        frames,
        inflight,
        compute: Duration::from_micros(compute_us),
        policy: if loss == NeighbourArg::Exit { NeighbourPolicy::Exit } else { NeighbourPolicy::Wait },
        metrics,
        stats_socket,
        settings: l.settings,
    })
}

/// The log level `leap node` runs at and where it came from: `RUST_LOG`,
/// else `--log` (`flag`) if given, else the file's `node.log`, else the
/// default. A file that cannot be read counts as none here; running the
/// node reports it.
pub fn log_level(args: &NodeArgs, flag: &str) -> (String, Source) {
    let plan = args.config.as_deref().and_then(|p| config::load(p).ok());
    log_level_of(&args.given, flag, plan.as_ref().map(|p| &p.file))
}

/// The node file's `[transport]`.
fn t(p: &NodePlan) -> &config::TransportSection {
    &p.file.transport
}

fn log_level_of(given: &Given, flag: &str, file: Option<&config::NodeFile>) -> (String, Source) {
    if let Ok(env) = std::env::var("RUST_LOG") {
        return (env, Source::Env);
    }
    match file.and_then(|f| f.node.log.clone()) {
        _ if given.contains("log") => (flag.to_owned(), Source::Flag),
        Some(level) => (level, Source::File),
        None => (flag.to_owned(), Source::Default),
    }
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
pub fn main(args: &NodeArgs, log: &str) -> Result<()> {
    let r = resolve(args, log)?;
    if args.check {
        // Before anything that may need privileges.
        for s in &r.settings {
            println!("{s}");
        }
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
    let reload: telemetry::KeyReload = {
        let (args, log, control, running) = (args.clone(), log.to_owned(), t.key_control(), r.opts.ring_key.clone());
        telemetry::KeyReload::new(move || reload_keys(&args, &log, control.as_ref(), running.as_ref()))
    };
    tel.set_key_reload(Some(reload.clone()));
    let hup = KeyReloadOnHangup::install(reload)?;
    // Its own thread: a slow client never holds up the frame loop.
    let servers = telemetry::serve(tel.clone(), r.metrics, r.stats_socket.as_deref(), telemetry::Limits::default())?;
    let res = run(&r, kind, &mut *t, &tel, &stop, args.json, args.workers);
    tel.publish(&*t, 0, true);
    // Detach (XDP), close sockets and the device before the servers go
    // (the stats socket's and SIGHUP's handles on the link too).
    tel.set_source_control(None);
    tel.set_key_reload(None);
    drop(hup);
    drop(t);
    servers.stop();
    res
}

/// Reads the key files again, as the node file and flags name them now, and
/// gives the keys to the transport; the line to log or to answer with.
/// A file that cannot be used keeps the keys in use.
fn reload_keys(
    args: &NodeArgs,
    log_flag: &str,
    control: Option<&crate::transport::KeyControl>,
    running: Option<&crate::transport::ring_key::KeySet>,
) -> std::result::Result<String, String> {
    let res = (|| {
        let Some(control) = control.filter(|_| running.is_some()) else {
            return Err("this node runs without a ring key; a ring becomes keyed only when its nodes start with \
                        key_file"
                .to_owned());
        };
        let keys = resolve(args, log_flag).map_err(|e| format!("{e:#}"))?.opts.ring_key.ok_or_else(|| {
            "key_file is no longer set; a keyed ring does not become unkeyed while it runs (restart the node)"
                .to_owned()
        })?;
        let what = keys.describe();
        control.set_keys(keys).map_err(|e| e.to_string())?;
        Ok(what)
    })();
    if let Err(e) = &res {
        log::warn!("ring key: reload refused, the keys in use stay: {e}");
    }
    res
}

/// A thread that reloads the ring keys on each `SIGHUP`, until dropped.
struct KeyReloadOnHangup {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KeyReloadOnHangup {
    fn install(reload: telemetry::KeyReload) -> Result<Self> {
        let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
            .context("installing the SIGHUP handler")?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("leap-sighup".into())
            .spawn(move || {
                for _ in signals.forever() {
                    // Logged inside (as refused), or here.
                    if let Ok(keys) = reload.reload() {
                        log::info!("ring key: SIGHUP: key files read again, now {keys}");
                    }
                }
            })
            .context("starting the SIGHUP thread")?;
        Ok(Self { handle, thread: Some(thread) })
    }
}

impl Drop for KeyReloadOnHangup {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::cli::{Cli, Command};

    fn node_args(args: &[&str]) -> NodeArgs {
        let argv = ["leap", "node", "--transport", "udp", "--listen", "127.0.0.1:9400", "--next", "127.0.0.1:9401"];
        match Cli::try_parse_from(argv.iter().chain(args)).unwrap().cmd {
            Command::Node(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn check_lists_every_flag_by_its_name_and_id() {
        let r = resolve(&node_args(&[]), "warn").unwrap();
        let names: Vec<&str> = r.settings.iter().map(|s| s.name).collect();
        let cmd = Cli::command();
        let node = cmd.find_subcommand("node").unwrap();
        for arg in node.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["config", "check", "help", "version"].contains(&long) {
                continue;
            }
            assert!(names.contains(&long), "--{long} is not listed");
            assert_eq!(arg.get_id().as_str(), flag_id(long), "--{long}: its id is not its name");
        }
        for name in &names {
            // `--log` is `leap`'s, for every subcommand.
            let known = *name == "log" || node.get_arguments().any(|a| a.get_long() == Some(name));
            assert!(known, "{name} is no flag of leap node");
            assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name} twice");
        }
    }

    #[test]
    fn a_flag_at_its_default_is_known_as_given() {
        let a = node_args(&["--timeout-ms", "1000", "--no-crc=false", "--reliability", "reliable"]);
        for id in ["timeout_ms", "no_crc", "reliability", "transport"] {
            assert!(a.given.contains(id), "{id}");
        }
        for id in ["setup_timeout_s", "no_trains", "xdp_mode", "window_memory_mib", "log"] {
            assert!(!a.given.contains(id), "{id}");
        }
    }
}
