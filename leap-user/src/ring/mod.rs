//! The ring runtime: the head sends frames (header + activations) and checks
//! what comes back; each worker receives, "computes" for a while and
//! forwards; the tail sends back to the head. [`run`] starts a whole ring on
//! this host (loopback ports, or one network namespace per node) with one
//! thread per node, for `leap ring`, the benchmark and the tests.

pub mod control;
pub mod latency;
pub mod node;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::netns::Topology;
use crate::transport::open::{Endpoint, Options, TransportKind};
use crate::transport::{BackendCounters, Stats};

pub use latency::RttHistogram;
pub use node::{HeadConfig, HeadReport, NeighbourPolicy, WorkerConfig, run_head, run_worker};

/// Where the nodes of a local ring live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// All on 127.0.0.1, one port each.
    Loopback,
    /// One network namespace per node, linked by veth pairs.
    Netns,
    /// One node per host, each run by a `leap serve` agent
    /// (`leap bench --hosts`); [`run`] does not start these.
    Hosts,
}

/// A ring to run on this host.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RingConfig {
    /// Backend.
    pub transport: TransportKind,
    /// Nodes, head included (>= 2).
    pub nodes: usize,
    /// Bytes per frame (header + activations).
    pub frame_size: usize,
    /// Frames the head drives around.
    pub frames: u64,
    /// Frames in flight at once.
    pub inflight: usize,
    /// Simulated compute per worker per frame.
    pub compute: Duration,
    /// Loopback or namespaces.
    pub placement: Placement,
    /// Port (namespaces: every node; loopback: first of consecutive ports,
    /// 0 to pick free ones).
    pub port: u16,
    /// Backend options.
    pub options: Options,
    /// Abort when no frame comes back for this long.
    pub stall_timeout: Duration,
    /// Send a RESIZE_CHAIN first and wait for its ACK.
    pub control: bool,
    /// Called with the number of frames done so far.
    pub progress: Option<Progress>,
    /// Percent of datagrams dropped on every link (namespaces only).
    pub loss_pct: f64,
    /// Percent of datagram sends that fail with EPERM at the output hook
    /// (namespaces only): sends that fail part-way, for tests.
    pub send_fault_pct: f64,
    /// Each node opens its transport and runs with exactly the packaged
    /// unit's capabilities ([`crate::sys::UNIT_CAPS`]), not as root.
    pub unit_caps: bool,
    /// Move frames through the copying API instead of the lending one (to
    /// compare what each copies).
    pub copying: bool,
    /// MTU of the namespaces' veths (`None`: 1500).
    pub mtu: Option<u32>,
    /// Per-node changes to [`Self::options`] (rings [`run`] starts): node `i` (0 = head) opens
    /// its transport with the options after every `f` listed for `i` ran
    /// on them, e.g. `(1, |o| o.trains = false)` for a mixed ring.
    pub node_options: Vec<(usize, NodeOptions)>,
}

/// A change to one node's options (see [`RingConfig::node_options`]).
pub type NodeOptions = fn(&mut Options);

/// A callback told how many frames are done.
#[derive(Clone)]
pub struct Progress(pub Arc<dyn Fn(u64) + Send + Sync>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

impl RingConfig {
    /// A ring with defaults for everything but the essentials.
    pub fn new(transport: TransportKind, nodes: usize, frame_size: usize, frames: u64) -> Self {
        Self {
            transport,
            nodes,
            frame_size,
            frames,
            inflight: 1,
            compute: Duration::ZERO,
            placement: Placement::Loopback,
            port: 0,
            options: Options { frame_len: frame_size, ..Options::default() },
            stall_timeout: Duration::from_secs(10),
            control: true,
            progress: None,
            loss_pct: 0.0,
            send_fault_pct: 0.0,
            unit_caps: false,
            copying: false,
            mtu: None,
            node_options: Vec::new(),
        }
    }

    /// The options node `i` opens its transport with: [`Self::options`]
    /// after its [`Self::node_options`].
    pub fn options_for(&self, i: usize) -> Options {
        let mut o = self.options.clone();
        for (_, f) in self.node_options.iter().filter(|(n, _)| *n == i) {
            f(&mut o);
        }
        o
    }

    /// Checks the settings; the message names the flag and the fix.
    ///
    /// # Errors
    ///
    /// [`RingError::Config`] describing the first problem.
    pub fn validate(&self) -> Result<(), RingError> {
        self.problem().map_or(Ok(()), |p| Err(RingError::Config(p)))
    }

    /// The first problem of the settings, described.
    fn problem(&self) -> Option<String> {
        if self.nodes < 2 {
            return Some(format!("--nodes {}: a ring needs at least 2 nodes (a head and a worker)", self.nodes));
        }
        if self.nodes > 64 {
            return Some(format!("--nodes {}: at most 64 nodes on one host", self.nodes));
        }
        let min = leap_common::control::CONTROL_FRAME_MIN;
        if self.frame_size < min || self.frame_size > MAX_FRAME {
            return Some(format!(
                "--frame-size {}: must be {min}..={MAX_FRAME} bytes (a control message must fit; \
                 Llama-3-8B frames are 16392)",
                self.frame_size
            ));
        }
        if self.frames == 0 {
            return Some("--frames 0: drive at least one frame".into());
        }
        if self.loss_pct != 0.0 && self.placement != Placement::Netns {
            return Some(format!("--loss {}: loss is injected on veth links; add --netns", self.loss_pct));
        }
        if self.send_fault_pct != 0.0 && self.placement != Placement::Netns {
            return Some("send faults are injected by nftables in the nodes' namespaces; use namespaces".into());
        }
        if !(0.0..=50.0).contains(&self.loss_pct) {
            return Some(format!("--loss {}: must be 0..=50 percent", self.loss_pct));
        }
        if let Some(mtu) = self.mtu {
            if self.placement != Placement::Netns {
                return Some(format!(
                    "--mtu {mtu}: sets the MTU of the namespaces' veths; add --netns (loopback's is 65536)"
                ));
            }
            if !(1280..=65535).contains(&mtu) {
                return Some(format!("--mtu {mtu}: must be 1280..=65535 bytes (9000 makes a jumbo-frame ring)"));
            }
        }
        if let Some((i, _)) = self.node_options.iter().find(|(i, _)| *i >= self.nodes) {
            return Some(format!("per-node options for node {i} of a ring of {}", self.nodes));
        }
        if self.inflight == 0 || self.inflight > 64 {
            return Some(format!("--inflight {}: must be 1..=64", self.inflight));
        }
        if matches!(self.transport, TransportKind::Udp | TransportKind::Xdp | TransportKind::XdpRingbuf) {
            let opts = Options { inflight: self.inflight, ..self.options.clone() };
            if let Err(e) = opts.windows() {
                return Some(format!(
                    "--inflight {} with --frame-size {} (--window, --keep-frames, --window-memory-mib): {e}",
                    self.inflight, self.frame_size
                ));
            }
        }
        None
    }
}

/// How long the head waits for a frame before counting it lost (or, with
/// retries, sending it again), and whether it retries: at once and never
/// over best-effort datagrams; after the NACK give-up time plus a margin,
/// with retries, when the hops recover losses (reliable datagrams, TCP).
pub fn loss_policy(transport: TransportKind, reliability: crate::transport::config::Reliability) -> (Duration, bool) {
    use crate::transport::config::Reliability;
    match (transport.is_datagram(), reliability) {
        (true, Reliability::BestEffort) => (Duration::ZERO, false),
        _ => (crate::frame::reliable::Timers::default().give_up * 2, true),
    }
}

/// Largest frame `leap ring` drives.
pub const MAX_FRAME: usize = 64 << 20;

/// Round-trip time percentiles, microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// The exact percentiles of `samples` (nanoseconds), which it sorts
    /// (runs record into an [`RttHistogram`] instead, in bounded memory).
    pub fn of(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
        let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64 / 1000.0;
        Self { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: at(1.0), mean }
    }
}

/// What `leap ring --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct RingReport {
    /// Backend name.
    pub transport: String,
    /// Loopback or namespaces.
    pub placement: Placement,
    /// Nodes in the ring.
    pub nodes: usize,
    /// Bytes per frame.
    pub frame_size: usize,
    /// Frames in flight.
    pub inflight: usize,
    /// Frames the head sent.
    pub frames_sent: u64,
    /// Frames that came back intact.
    pub frames_delivered: u64,
    /// Frames that came back with wrong bytes (must be 0).
    pub frames_corrupt: u64,
    /// Frames that never came back.
    pub frames_lost: u64,
    /// Frames the head sent again after a node lost them.
    pub frames_resent: u64,
    /// Late copies of re-sent frames (not errors).
    pub frames_duplicate: u64,
    /// Round-trip times.
    pub rtt_us: Percentiles,
    /// Completed round trips per second.
    pub round_trips_per_s: f64,
    /// Frame bits delivered per second (one direction of the ring).
    pub gbit_per_s: f64,
    /// Wall time of the data phase.
    pub elapsed_s: f64,
    /// The data phase, from its first send to its last frame back (for
    /// profiles; not printed).
    #[serde(skip)]
    pub data_phase: Option<(std::time::Instant, std::time::Instant)>,
    /// CPU time (user + sys) of all node threads per delivered frame.
    pub cpu_us_per_frame: f64,
    /// Chunks retransmitted on all hops.
    pub retransmits: u64,
    /// Datagrams per frame sent, over all nodes (a chunk train counts once;
    /// 12 for 16 392-byte frames without trains).
    pub datagrams_per_frame: f64,
    /// The RESIZE_CHAIN came back as an ACK from the tail.
    pub control_ack: Option<bool>,
    /// Counters summed over all nodes.
    pub stats: Stats,
    /// XDP program counters, summed over nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp: Option<BackendCounters>,
    /// Kernel module counters, summed over nodes, when the module was used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kmod: Option<BackendCounters>,
}

/// Why a ring run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// Bad settings.
    #[error("{0}")]
    Config(String),
    /// The namespaces could not be built.
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    /// A node failed.
    #[error("node {node}: {error}")]
    Node {
        /// Its index (0 = head).
        node: usize,
        /// What happened.
        #[source]
        error: NodeError,
    },
}

/// What went wrong in one node of a ring [`run`] starts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// Its thread could not be started.
    #[error("spawn: {0}")]
    Spawn(#[source] std::io::Error),
    /// Its thread panicked.
    #[error("{0} thread panicked")]
    Panicked(&'static str),
    /// It could not be pinned to its CPU.
    #[error("pinning node {node} to CPU {cpu}: {source}")]
    Pin {
        /// The node.
        node: usize,
        /// Its CPU.
        cpu: usize,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// It could not enter its network namespace.
    #[error("entering {}: {source}", path.display())]
    EnterNetns {
        /// The namespace.
        path: std::path::PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// It could not drop to the packaged unit's capabilities.
    #[error("keeping only the packaged unit's capabilities: {0}")]
    UnitCaps(#[source] std::io::Error),
    /// Its transport failed.
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
    /// The ring did not start: the first node that failed to open its
    /// transport, and why (every node reports it).
    #[error(transparent)]
    Start(Arc<NodeError>),
    /// Not every node opened its transport in time.
    #[error("timed out waiting for the other nodes to start")]
    StartTimeout,
}

/// Waits until every node has opened its transport, or one failed.
#[derive(Debug)]
struct Gate {
    state: Mutex<(usize, Option<Arc<NodeError>>)>,
    cv: Condvar,
    n: usize,
}

impl Gate {
    /// In the calling thread: enters the node's namespace, opens its
    /// transport, and waits until every node did (or one failed).
    fn open_node(
        &self,
        ns: Option<&std::path::Path>,
        cfg: &RingConfig,
        node: usize,
        ep: &Endpoint,
        timeout: Duration,
    ) -> Result<Box<dyn crate::transport::Transport>, NodeError> {
        let opened = (|| -> Result<Box<dyn crate::transport::Transport>, NodeError> {
            if let Some(ns) = ns {
                crate::netns::enter(ns).map_err(|source| NodeError::EnterNetns { path: ns.to_path_buf(), source })?;
            }
            if cfg.unit_caps {
                crate::sys::restrict_thread_caps(crate::sys::UNIT_CAPS).map_err(NodeError::UnitCaps)?;
            }
            Ok(crate::transport::open::open(cfg.transport, ep, &cfg.options_for(node))?)
        })();
        match opened {
            Ok(t) => self.arrive(None, timeout).map(|()| t),
            Err(e) => {
                // Every node reports the first failure: ours, unless another
                // node's came first.
                let e = Arc::new(e);
                Err(self.arrive(Some(e.clone()), timeout).err().unwrap_or(NodeError::Start(e)))
            }
        }
    }

    fn arrive(&self, failure: Option<Arc<NodeError>>, timeout: Duration) -> Result<(), NodeError> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        if failure.is_some() && g.1.is_none() {
            g.1 = failure;
        }
        self.cv.notify_all();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |g| g.0 < self.n && g.1.is_none())
            .unwrap_or_else(|p| p.into_inner());
        match &g.1 {
            Some(e) => Err(NodeError::Start(e.clone())),
            None if g.0 < self.n => Err(NodeError::StartTimeout),
            None => Ok(()),
        }
    }
}

/// Endpoints of every node (and the namespaces, if any, kept alive by the
/// returned topology).
pub(crate) fn layout(cfg: &RingConfig) -> Result<(Vec<Endpoint>, Option<Topology>), RingError> {
    let n = cfg.nodes;
    match cfg.placement {
        Placement::Hosts => {
            Err(RingError::Config("a ring across hosts runs through `leap serve` agents (`leap bench --hosts`)".into()))
        }
        Placement::Loopback => {
            let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
            let ports: Vec<u16> = (0..n)
                .map(|i| match cfg.port {
                    0 => crate::netns::loopback_port()
                        .ok_or_else(|| RingError::Config("no free loopback port: name one with --port".into())),
                    p => Ok(p.wrapping_add(i as u16)),
                })
                .collect::<Result<_, _>>()?;
            let addr = |i: usize| SocketAddr::new(lo, ports[i % n]);
            Ok((
                (0..n)
                    .map(|i| Endpoint {
                        listen: addr(i),
                        next: addr(i + 1),
                        prev: Some(addr(i + n - 1)),
                        iface: Some("lo".into()),
                    })
                    .collect(),
                None,
            ))
        }
        Placement::Netns => {
            let prefix = format!("lp{}", std::process::id() % 100_000);
            let mut topo = Topology::ring_with_mtu(&prefix, n, cfg.mtu)?;
            let port = if cfg.port == 0 { leap_common::DEFAULT_PORT } else { cfg.port };
            if cfg.loss_pct > 0.0 {
                topo.set_loss(cfg.loss_pct, port)?;
            }
            if cfg.send_fault_pct > 0.0 {
                topo.set_send_fault(cfg.send_fault_pct, port)?;
            }
            let nodes = topo.nodes();
            let addr = |i: usize| SocketAddr::new(IpAddr::V4(nodes[i % n].addr), port);
            let eps = (0..n)
                .map(|i| Endpoint {
                    listen: addr(i),
                    next: addr(i + 1),
                    prev: Some(addr(i + n - 1)),
                    iface: Some(nodes[i].rx_iface.clone()),
                })
                .collect();
            Ok((eps, Some(topo)))
        }
    }
}

/// Pins the calling node thread (node `i`) to its CPU of `cpus`, if any.
pub(crate) fn pin(cpus: &[usize], i: usize) -> Result<(), NodeError> {
    if cpus.is_empty() {
        return Ok(());
    }
    let cpu = cpus[i % cpus.len()];
    crate::sys::pin_thread(&[cpu]).map_err(|source| NodeError::Pin { node: i, cpu, source })
}

/// Starts node `i`'s thread the way every ring on this host starts its
/// nodes, `leap ring`'s and the benchmark floor's alike: named `name`,
/// scheduled as the calling thread (a new thread inherits its creator's
/// policy and priority, which `leap bench --sched` sets on its own), and
/// pinned to its CPU of `cpus` before `f` runs.
///
/// # Errors
///
/// The thread could not be started; a failure to pin comes back from the
/// thread as `f`'s error.
pub(crate) fn spawn_node<T, E>(
    name: String,
    cpus: &[usize],
    i: usize,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<Result<T, E>>>
where
    T: Send + 'static,
    E: From<NodeError> + Send + 'static,
{
    let cpus = cpus.to_vec();
    std::thread::Builder::new().name(name).spawn(move || {
        pin(&cpus, i)?;
        f()
    })
}

/// Runs a whole ring on this host and reports what the head measured.
///
/// # Errors
///
/// [`RingError`] for bad settings, namespace set-up failures, or a node
/// whose transport failed.
pub fn run(cfg: &RingConfig) -> Result<RingReport, RingError> {
    cfg.validate()?;
    crate::sys::check_cpus(&cfg.options.cpus).map_err(|e| RingError::Config(format!("--cpus: {e}")))?;
    let mut cfg = cfg.clone();
    // Every node's window and frames kept for NACKs follow the frames in flight.
    cfg.options.inflight = cfg.inflight;
    if cfg.loss_pct > 0.0 && cfg.options.gso {
        // A GSO super-datagram is one packet until the receiver splits it:
        // dropping it would lose up to 44 chunks at once. Per-chunk loss
        // needs per-chunk datagrams.
        log::info!("--loss: sending one datagram per chunk (GSO off) so that loss hits single chunks");
        cfg.options.gso = false;
    }
    let cfg = &cfg;
    let (eps, topo) = layout(cfg)?;
    let gate = Arc::new(Gate { state: Mutex::new((0, None)), cv: Condvar::new(), n: cfg.nodes });
    let stop = Arc::new(AtomicBool::new(false));
    let start_timeout = cfg.options.setup_timeout + Duration::from_secs(5);
    let mut workers = Vec::new();
    let cpus = cfg.options.cpus.clone();
    for (i, ep) in eps.iter().enumerate().skip(1) {
        let (ep, gate, stop, cfg) = (ep.clone(), gate.clone(), stop.clone(), cfg.clone());
        let ns = topo.as_ref().map(|t| t.nodes()[i].path());
        workers.push(
            spawn_node(format!("leap-node-{i}"), &cpus, i, move || {
                let mut t = gate.open_node(ns.as_deref(), &cfg, i, &ep, start_timeout)?;
                let wc = WorkerConfig {
                    frame_size: cfg.frame_size,
                    compute: cfg.compute,
                    copying: cfg.copying,
                    ..WorkerConfig::default()
                };
                // Like the head's: the data phase only, not opening the
                // transport (loading BPF, parsing BTF, connecting).
                let cpu0 = crate::sys::thread_cpu_time();
                let res = run_worker(&mut *t, &wc, &stop);
                let cpu1 = crate::sys::thread_cpu_time();
                res?;
                let cpu = (cpu1.0 + cpu1.1).saturating_sub(cpu0.0 + cpu0.1);
                Ok::<_, NodeError>((t.stats(), t.backend_counters(), cpu))
            })
            .map_err(|e| RingError::Node { node: i, error: NodeError::Spawn(e) })?,
        );
    }
    let head = {
        let (ep, gate, cfg2, stop) = (eps[0].clone(), gate.clone(), cfg.clone(), stop.clone());
        let ns = topo.as_ref().map(|t| t.nodes()[0].path());
        spawn_node("leap-head".into(), &cpus, 0, move || {
            let mut t = gate.open_node(ns.as_deref(), &cfg2, 0, &ep, start_timeout)?;
            let hc = HeadConfig {
                frame_size: cfg2.frame_size,
                frames: cfg2.frames,
                inflight: cfg2.inflight,
                stall_timeout: cfg2.stall_timeout,
                lost_after: Some(loss_policy(cfg2.transport, cfg2.options.reliability).0),
                retry: loss_policy(cfg2.transport, cfg2.options.reliability).1,
                control_workers: if cfg2.control { Some(cfg2.nodes - 1) } else { None },
                progress: cfg2.progress.clone(),
                telemetry: None,
                stop: None,
                pause: Duration::ZERO,
                copying: cfg2.copying,
            };
            let cpu0 = crate::sys::thread_cpu_time();
            let res = run_head(&mut *t, &hc);
            let cpu1 = crate::sys::thread_cpu_time();
            let cpu = (cpu1.0 + cpu1.1).saturating_sub(cpu0.0 + cpu0.1);
            // Tell the workers before our connections close, so that
            // they take the close for the end of the run.
            stop.store(true, Ordering::SeqCst);
            Ok::<_, NodeError>((res?, t.stats(), t.backend_counters(), cpu))
        })
        .map_err(|e| RingError::Node { node: 0, error: NodeError::Spawn(e) })?
    };
    let head_res = head.join().unwrap_or(Err(NodeError::Panicked("head")));
    stop.store(true, Ordering::SeqCst);
    let mut stats = Stats::default();
    let mut counters = Vec::new();
    let mut cpu = Duration::ZERO;
    let mut worker_err = None;
    for (i, w) in workers.into_iter().enumerate() {
        match w.join().unwrap_or(Err(NodeError::Panicked("worker"))) {
            Ok((s, c, t)) => {
                stats.add(&s);
                counters.extend(c);
                cpu += t;
            }
            Err(e) => worker_err = worker_err.or(Some(RingError::Node { node: i + 1, error: e })),
        }
    }
    drop(topo);
    let (head, hs, hc, hcpu) = head_res.map_err(|e| RingError::Node { node: 0, error: e })?;
    if let Some(e) = worker_err {
        return Err(e);
    }
    stats.add(&hs);
    counters.extend(hc);
    cpu += hcpu;
    let data_phase = head.started.map(|s| (s, s + head.elapsed));
    let mut rep = assemble(cfg, HeadSummary::of(head), stats, &counters, cpu);
    rep.data_phase = data_phase;
    Ok(rep)
}

/// What the head measured, without the samples: what crosses the wire
/// from a `leap serve` agent that ran the head.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct HeadSummary {
    /// Frames sent.
    pub sent: u64,
    /// Frames back intact.
    pub delivered: u64,
    /// Frames back with wrong bytes.
    pub corrupt: u64,
    /// Frames that never came back.
    pub lost: u64,
    /// Frames sent again.
    pub resent: u64,
    /// Late copies of re-sent frames.
    pub duplicates: u64,
    /// Round-trip times, measured at the head.
    pub rtt_us: Percentiles,
    /// Wall time of the data phase, seconds.
    pub elapsed_s: f64,
    /// Whether the control ACK came back (None: not tried).
    pub control_ack: Option<bool>,
}

impl HeadSummary {
    /// Summarises `head` (its round trips become percentiles).
    pub fn of(head: HeadReport) -> Self {
        Self {
            sent: head.sent,
            delivered: head.delivered,
            corrupt: head.corrupt,
            lost: head.lost,
            resent: head.resent,
            duplicates: head.duplicates,
            rtt_us: head.rtt.percentiles(),
            elapsed_s: head.elapsed.as_secs_f64(),
            control_ack: head.control_ack,
        }
    }
}

/// The ring's report from what its head measured and what every node
/// counted (`stats` and `cpu` summed over the nodes, `counters` one per
/// node), for rings on this host and across hosts alike.
pub fn assemble(
    cfg: &RingConfig,
    head: HeadSummary,
    stats: Stats,
    counters: &[BackendCounters],
    cpu: Duration,
) -> RingReport {
    let elapsed = head.elapsed_s.max(1e-9);
    let delivered = head.delivered;
    let backend = BackendCounters::sum(counters);
    let is_kmod = cfg.transport == TransportKind::Kmod;
    RingReport {
        transport: cfg.transport.as_str().into(),
        placement: cfg.placement,
        nodes: cfg.nodes,
        frame_size: cfg.frame_size,
        inflight: cfg.inflight,
        frames_sent: head.sent,
        frames_delivered: delivered,
        frames_corrupt: head.corrupt,
        frames_lost: head.lost,
        frames_resent: head.resent,
        frames_duplicate: head.duplicates,
        rtt_us: head.rtt_us,
        round_trips_per_s: delivered as f64 / elapsed,
        gbit_per_s: delivered as f64 * cfg.frame_size as f64 * 8.0 / elapsed / 1e9,
        elapsed_s: elapsed,
        data_phase: None,
        cpu_us_per_frame: if delivered == 0 { 0.0 } else { cpu.as_secs_f64() * 1e6 / delivered as f64 },
        retransmits: stats.retransmits,
        datagrams_per_frame: if stats.frames_sent == 0 {
            0.0
        } else {
            stats.datagrams_sent as f64 / stats.frames_sent as f64
        },
        control_ack: head.control_ack,
        stats,
        xdp: if is_kmod { None } else { backend },
        kmod: if is_kmod { backend } else { None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy and the CPUs it may run on.
    fn policy_and_cpus() -> (i32, Vec<usize>) {
        // SAFETY: no pointer is passed; pid 0 names the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        (policy, (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect())
    }

    #[test]
    fn node_threads_are_pinned_and_scheduled_as_the_thread_that_starts_them() {
        // SCHED_BATCH needs no privilege, and a new thread inherits it as
        // the ring's and the floor's nodes inherit `leap bench`'s SCHED_RR.
        std::thread::spawn(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param that outlives the
            // call; pid 0 names the calling thread.
            assert_eq!(unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) }, 0);
            let cpus = policy_and_cpus().1;
            let last = *cpus.last().unwrap();
            let node = |i| spawn_node(format!("t{i}"), &[cpus[0], last], i, || Ok::<_, NodeError>(policy_and_cpus()));
            assert_eq!(node(0).unwrap().join().unwrap().unwrap(), (libc::SCHED_BATCH, vec![cpus[0]]));
            assert_eq!(node(1).unwrap().join().unwrap().unwrap(), (libc::SCHED_BATCH, vec![last]));
            assert_eq!(node(2).unwrap().join().unwrap().unwrap(), (libc::SCHED_BATCH, vec![cpus[0]]));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_mtu_needs_namespaces_and_a_size_veth_takes() {
        let mut c = RingConfig::new(TransportKind::Udp, 3, 16392, 10);
        c.mtu = Some(9000);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--mtu 9000") && e.contains("--netns"), "{e}");
        c.placement = Placement::Netns;
        c.validate().unwrap();
        for bad in [576, 70_000] {
            c.mtu = Some(bad);
            assert!(c.validate().unwrap_err().to_string().contains("1280..=65535"));
        }
    }

    #[test]
    fn per_node_options_change_only_their_node() {
        let mut c = RingConfig::new(TransportKind::Udp, 3, 16392, 10);
        c.node_options.push((1, |o| o.trains = false));
        assert!(c.options_for(0).trains && !c.options_for(1).trains && c.options_for(2).trains);
        c.node_options.push((3, |o| o.crc = false));
        assert!(c.validate().unwrap_err().to_string().contains("node 3"));
    }

    #[test]
    fn windows_that_cannot_work_are_refused_naming_the_flags() {
        let mut c = RingConfig::new(TransportKind::Udp, 3, 16392, 10);
        c.inflight = 48;
        c.validate().unwrap();
        c.options.window = Some(16);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--window") && e.contains("set at least 64"), "{e}");
        // 64 MiB frames: 8 in flight need 16 + 16 of them, 2 GiB.
        let mut c = RingConfig::new(TransportKind::Udp, 3, MAX_FRAME, 10);
        c.inflight = 8;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--window-memory-mib") && e.contains("2048 MiB"), "{e}");
        c.options.window_memory = 2 << 30;
        c.validate().unwrap();
        // TCP keeps no window.
        c.transport = TransportKind::Tcp;
        c.options.window_memory = 1 << 20;
        c.validate().unwrap();
    }
}
