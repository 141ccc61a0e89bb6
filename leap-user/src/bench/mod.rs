//! `leap bench`: every transport x frame size x mode (latency: one frame in
//! flight; throughput: several) around a ring on this host, repeated, with
//! the floor of one 64-byte datagram per hop measured in the same run, so
//! that figures compare as ratios measured together.

pub mod floor;
pub mod profile;
pub mod report;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::netns::Topology;
use crate::ring::{Percentiles, Placement, RingConfig, RingReport};
use crate::transport::open::{Options, TransportKind};

/// Frame sizes measured by default: Llama-3-8B and -70B steps, a prefill
/// chunk, a megabyte.
pub const DEFAULT_SIZES: [usize; 4] = [16_392, 32_776, 262_152, 1_048_584];
/// Frames in flight in throughput mode.
pub const THROUGHPUT_INFLIGHT: usize = 8;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Transports, in report order.
    pub transports: Vec<TransportKind>,
    /// Frame sizes.
    pub sizes: Vec<usize>,
    /// Ring size.
    pub nodes: usize,
    /// Repetitions of every combination (medians are reported).
    pub repeat: usize,
    /// Shorter runs (about a minute in all).
    pub quick: bool,
    /// Namespaces (root) or loopback.
    pub placement: Placement,
    /// Backend options (XDP object, spin, ...).
    pub options: Options,
    /// Where this runs, for the report ("host", "vm").
    pub site: String,
    /// Profile one extra latency run per transport with this `perf` and
    /// keep the raw reports in this directory.
    pub profile: Option<(PathBuf, PathBuf)>,
}

/// One transport x size x mode, medians over the repeats.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchRow {
    /// Backend.
    pub transport: String,
    /// Where it ran ("host" or "vm").
    pub site: String,
    /// Bytes per frame.
    pub frame_size: usize,
    /// "latency" or "throughput".
    pub mode: String,
    /// Frames in flight.
    pub inflight: usize,
    /// Repetitions behind the medians.
    pub repeats: usize,
    /// Frames per repetition.
    pub frames: u64,
    /// Median over repeats of each percentile.
    pub rtt_us: Percentiles,
    /// Median round trips per second.
    pub round_trips_per_s: f64,
    /// Median Gbit/s.
    pub gbit_per_s: f64,
    /// Median CPU time per frame, all nodes, user + system.
    pub cpu_us_per_frame: f64,
    /// Frames lost, summed over repeats.
    pub frames_lost: u64,
    /// Frames corrupt, summed over repeats (must be 0).
    pub frames_corrupt: u64,
    /// Chunks retransmitted, summed over repeats.
    pub retransmits: u64,
    /// p50 / TCP's p50 at the same size, mode and site.
    pub p50_vs_tcp: Option<f64>,
    /// p50 / the floor's p50 at the same site.
    pub p50_vs_floor: Option<f64>,
    /// Gbit/s / TCP's at the same size, mode and site.
    pub gbit_vs_tcp: Option<f64>,
}

/// The floor at one site.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Floor {
    /// "host" or "vm".
    pub site: String,
    /// Round trips of one 64-byte datagram around the ring.
    pub rtt_us: Percentiles,
    /// Hops per round trip.
    pub hops: usize,
}

/// What the CRC32C on every frame costs: the same ring with and without
/// it, runs interleaved, at the first frame size, one frame in flight.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CrcCost {
    /// Backend.
    pub transport: String,
    /// Where.
    pub site: String,
    /// Bytes per frame.
    pub frame_size: usize,
    /// Pairs of runs behind the medians.
    pub repeats: usize,
    /// Median round trip p50 with the CRC (the default).
    pub p50_crc_us: f64,
    /// ... and without (`--no-crc`).
    pub p50_no_crc_us: f64,
    /// Median CPU per frame, all nodes, with and without.
    pub cpu_crc_us: f64,
    /// ... without.
    pub cpu_no_crc_us: f64,
}

/// A transport not measured, and why.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Skipped {
    /// Backend.
    pub transport: String,
    /// Where.
    pub site: String,
    /// Why.
    pub reason: String,
}

/// Everything `leap bench` measured.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct BenchReport {
    /// `leap` version.
    pub leap_version: String,
    /// `uname -r` per site.
    pub kernels: Vec<(String, String)>,
    /// Loopback or namespaces.
    pub placement: String,
    /// Ring size.
    pub nodes: usize,
    /// Per combination.
    pub rows: Vec<BenchRow>,
    /// Per site.
    pub floors: Vec<Floor>,
    /// What was not measured.
    pub skipped: Vec<Skipped>,
    /// Where the CPU went, per transport (`--profile`).
    #[serde(default)]
    pub profiles: Vec<profile::Profile>,
    /// What the CRC32C costs, per datagram transport.
    #[serde(default)]
    pub crc_costs: Vec<CrcCost>,
    /// Remarks for the reader (e.g. which figures come from an emulated VM).
    pub notes: Vec<String>,
    /// The hosts of a benchmark across hosts, with their capabilities.
    #[serde(default)]
    pub hosts: Vec<BenchHost>,
}

/// Where the benchmark's rings run: on this host ([`LocalRings`]) or across
/// hosts (`crate::serve::coordinator::HostRings`). [`run_on`] drives the same
/// matrix over either.
pub trait Rings {
    /// `(site, kernel release)` of every machine involved.
    fn kernels(&self) -> Vec<(String, String)>;
    /// Why `kind` cannot run, if it cannot.
    fn unavailable(&self, kind: TransportKind) -> Option<String>;
    /// The floor: one 64-byte datagram per hop, `rounds` times.
    ///
    /// # Errors
    ///
    /// A failure that should stop the benchmark.
    fn floor(&mut self, nodes: usize, rounds: usize) -> Result<FloorOutcome, String>;
    /// Runs one ring and reports what its head measured.
    ///
    /// # Errors
    ///
    /// The ring failing (recorded as a skipped row).
    fn run(&mut self, rc: &RingConfig) -> Result<RingReport, String>;
    /// The hosts the rings span, with what each can run (none: this host).
    fn hosts(&self) -> Vec<BenchHost> {
        Vec::new()
    }
    /// Remarks for the report about where the rings ran.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// One host of a benchmark across hosts (`leap bench --hosts`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchHost {
    /// Name in the report.
    pub name: String,
    /// Its agent's control address.
    pub control: String,
    /// Its ring member's data address.
    pub data: String,
    /// The interface its frames arrive on.
    pub iface: Option<String>,
    /// What its agent reported.
    pub capabilities: crate::serve::capabilities::HostCapabilities,
}

/// What came of measuring the floor.
#[derive(Clone, Debug)]
pub enum FloorOutcome {
    /// Measured.
    Measured(Percentiles),
    /// Not measurable where the rings run, and why (said in the report).
    NotMeasurable(String),
}

/// Rings on this host: loopback or namespaces, as `cfg.placement` says.
#[derive(Debug)]
pub struct LocalRings<'a> {
    cfg: &'a BenchConfig,
}

impl<'a> LocalRings<'a> {
    /// Rings as `cfg` places them.
    pub fn new(cfg: &'a BenchConfig) -> Self {
        Self { cfg }
    }
}

impl Rings for LocalRings<'_> {
    fn kernels(&self) -> Vec<(String, String)> {
        vec![(self.cfg.site.clone(), kernel_release())]
    }

    fn unavailable(&self, kind: TransportKind) -> Option<String> {
        unavailable(kind, self.cfg.placement, &self.cfg.options)
    }

    fn floor(&mut self, nodes: usize, rounds: usize) -> Result<FloorOutcome, String> {
        let topo = match self.cfg.placement {
            Placement::Netns => {
                Some(Topology::ring(&format!("lf{}", std::process::id() % 100_000), nodes).map_err(|e| e.to_string())?)
            }
            Placement::Loopback => None,
            Placement::Hosts => return Err("LocalRings cannot place rings on other hosts".into()),
        };
        crate::sys::check_cpus(&self.cfg.options.cpus).map_err(|e| format!("--cpus: {e}"))?;
        floor::measure(topo.as_ref(), nodes, rounds, &self.cfg.options.cpus).map(FloorOutcome::Measured)
    }

    fn run(&mut self, rc: &RingConfig) -> Result<RingReport, String> {
        crate::ring::run(rc).map_err(|e| e.to_string())
    }
}

/// Why a transport cannot run here, if it cannot.
pub fn unavailable(kind: TransportKind, placement: Placement, opts: &Options) -> Option<String> {
    let root = crate::sys::is_root();
    match kind {
        TransportKind::Tcp | TransportKind::Udp => None,
        TransportKind::Xdp | TransportKind::XdpRingbuf => {
            if !root {
                Some("XDP needs root (CAP_BPF, CAP_NET_ADMIN)".into())
            } else if placement != Placement::Netns {
                Some("the XDP paths are measured on veth between namespaces (add --netns / run as root)".into())
            } else if opts.xdp_object.is_none() && crate::transport::xdp::object::embedded().is_none() {
                Some("no XDP object: build with `cargo xtask build` or pass --xdp-object PATH".into())
            } else {
                None
            }
        }
        TransportKind::Kmod => (!std::path::Path::new(leap_common::kmod::DEVICE_PATH).exists()).then(|| {
            "leap_kmod is not loaded (/dev/leap_tensor missing); `cargo xtask bench` measures it in the VM".into()
        }),
    }
}

/// Frames per run: enough for stable percentiles, bounded in bytes so that
/// megabyte frames do not take minutes.
fn frames_for(size: usize, quick: bool, throughput: bool) -> u64 {
    let (min, max, bytes) = if quick { (100, 500, 64 << 20) } else { (300, 3000, 512 << 20) };
    let max = if throughput { max * 2 } else { max };
    ((bytes / size) as u64).clamp(min, max)
}

/// One benchmark ring: no control round, a stall bound instead of hanging.
fn ring_config(cfg: &BenchConfig, kind: TransportKind, size: usize, frames: u64, inflight: usize) -> RingConfig {
    let mut rc = RingConfig::new(kind, cfg.nodes, size, frames);
    rc.inflight = inflight;
    rc.placement = cfg.placement;
    rc.options = Options { frame_len: size, ..cfg.options.clone() };
    rc.control = false;
    rc.stall_timeout = Duration::from_secs(20);
    rc
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the benchmark. `progress(done, total, label)` is called between runs.
///
/// # Errors
///
/// The floor or a ring run failing outright (a transport that cannot even
/// start is recorded as skipped instead).
pub fn run(cfg: &BenchConfig, progress: &dyn Fn(usize, usize, &str)) -> Result<BenchReport, String> {
    run_on(cfg, &mut LocalRings::new(cfg), progress)
}

/// [`run`], with the rings placed by `rings`.
///
/// # Errors
///
/// As [`run`].
pub fn run_on(
    cfg: &BenchConfig,
    rings: &mut dyn Rings,
    progress: &dyn Fn(usize, usize, &str),
) -> Result<BenchReport, String> {
    let mut rep = BenchReport {
        leap_version: env!("CARGO_PKG_VERSION").into(),
        kernels: rings.kernels(),
        hosts: rings.hosts(),
        notes: rings.notes(),
        placement: format!("{:?}", cfg.placement).to_lowercase(),
        nodes: cfg.nodes,
        ..Default::default()
    };
    let mut kinds = Vec::new();
    for &k in &cfg.transports {
        match rings.unavailable(k) {
            Some(reason) => rep.skipped.push(Skipped { transport: k.to_string(), site: cfg.site.clone(), reason }),
            None => kinds.push(k),
        }
    }
    let modes = [("latency", 1usize), ("throughput", THROUGHPUT_INFLIGHT)];
    let profiled = usize::from(cfg.profile.is_some());
    let crc_kinds = kinds.iter().filter(|k| has_crc(**k)).count();
    let crc_pairs = if cfg.options.crc { crc_runs(cfg) } else { 0 };
    let total = kinds.len() * (cfg.sizes.len() * modes.len() * cfg.repeat + profiled) + crc_kinds * 2 * crc_pairs + 1;
    let mut done = 0;
    progress(done, total, "floor");
    match rings.floor(cfg.nodes, if cfg.quick { 2000 } else { 10_000 })? {
        FloorOutcome::Measured(floor) => {
            rep.floors.push(Floor { site: cfg.site.clone(), rtt_us: floor, hops: cfg.nodes })
        }
        FloorOutcome::NotMeasurable(why) => rep.notes.push(format!("no floor at {}: {why}", cfg.site)),
    }
    done += 1;
    for &kind in &kinds {
        'sizes: for &size in &cfg.sizes {
            for (mode, inflight) in modes {
                let frames = frames_for(size, cfg.quick, inflight > 1);
                let mut runs: Vec<RingReport> = Vec::new();
                for r in 0..cfg.repeat {
                    progress(done, total, &format!("{kind} {size} B {mode} #{}", r + 1));
                    match rings.run(&ring_config(cfg, kind, size, frames, inflight)) {
                        Ok(x) => runs.push(x),
                        Err(e) => {
                            rep.skipped.push(Skipped {
                                transport: kind.to_string(),
                                site: cfg.site.clone(),
                                reason: format!("{size}-byte frames, {mode}: {e}"),
                            });
                            done += cfg.repeat - r;
                            continue 'sizes;
                        }
                    }
                    done += 1;
                }
                let m = |f: &dyn Fn(&RingReport) -> f64| median(runs.iter().map(f).collect());
                rep.rows.push(BenchRow {
                    transport: kind.to_string(),
                    site: cfg.site.clone(),
                    frame_size: size,
                    mode: mode.into(),
                    inflight,
                    repeats: runs.len(),
                    frames,
                    rtt_us: Percentiles {
                        p50: m(&|r| r.rtt_us.p50),
                        p90: m(&|r| r.rtt_us.p90),
                        p99: m(&|r| r.rtt_us.p99),
                        max: m(&|r| r.rtt_us.max),
                        mean: m(&|r| r.rtt_us.mean),
                    },
                    round_trips_per_s: m(&|r| r.round_trips_per_s),
                    gbit_per_s: m(&|r| r.gbit_per_s),
                    cpu_us_per_frame: m(&|r| r.cpu_us_per_frame),
                    frames_lost: runs.iter().map(|r| r.frames_lost).sum(),
                    frames_corrupt: runs.iter().map(|r| r.frames_corrupt).sum(),
                    retransmits: runs.iter().map(|r| r.retransmits).sum(),
                    p50_vs_tcp: None,
                    p50_vs_floor: None,
                    gbit_vs_tcp: None,
                });
            }
        }
        if let Some(&size) = cfg.sizes.first()
            && has_crc(kind)
            && crc_pairs > 0
        {
            match crc_cost(cfg, rings, kind, size, crc_pairs, &mut |label| {
                progress(done, total, label);
                done += 1;
            }) {
                Ok(c) => rep.crc_costs.push(c),
                Err(e) => rep.notes.push(format!("no CRC cost of {kind} at {}: {e}", cfg.site)),
            }
        }
        if let (Some((perf, dir)), Some(&size)) = (&cfg.profile, cfg.sizes.first()) {
            progress(done, total, &format!("{kind} {size} B latency under perf"));
            // Long enough for a few thousand samples whatever the latency.
            let frames = ((256usize << 20) / size).clamp(200, 10_000) as u64;
            match profile::record(perf, &ring_config(cfg, kind, size, frames, 1), &cfg.site, dir) {
                Ok(p) => rep.profiles.push(p),
                Err(e) => rep.notes.push(format!("no profile of {kind} at {}: {e}", cfg.site)),
            }
            done += 1;
        }
    }
    progress(total, total, "done");
    rep.compute_ratios();
    Ok(rep)
}

/// Backends whose frames carry the CRC32C between leap nodes.
fn has_crc(kind: TransportKind) -> bool {
    matches!(kind, TransportKind::Udp | TransportKind::Xdp | TransportKind::XdpRingbuf)
}

/// Pairs of runs (with, without) for the CRC's cost: small differences
/// need more samples than the other rows.
fn crc_runs(cfg: &BenchConfig) -> usize {
    if cfg.quick { 3 } else { cfg.repeat.max(3) }
}

/// Measures the CRC's cost: `pairs` latency runs with and without it,
/// interleaved so that the machine's drift hits both alike.
fn crc_cost(
    cfg: &BenchConfig,
    rings: &mut dyn Rings,
    kind: TransportKind,
    size: usize,
    pairs: usize,
    step: &mut dyn FnMut(&str),
) -> Result<CrcCost, String> {
    let frames = frames_for(size, cfg.quick, false);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for r in 0..pairs {
        for crc in [true, false] {
            step(&format!("{kind} {size} B latency, CRC {} #{}", if crc { "on" } else { "off" }, r + 1));
            let mut rc = ring_config(cfg, kind, size, frames, 1);
            rc.options.crc = crc;
            let rep = rings.run(&rc)?;
            if rep.frames_corrupt > 0 {
                return Err(format!("{} corrupt frames", rep.frames_corrupt));
            }
            if crc { with.push(rep) } else { without.push(rep) }
        }
    }
    let m = |v: &[RingReport], f: &dyn Fn(&RingReport) -> f64| median(v.iter().map(f).collect());
    Ok(CrcCost {
        transport: kind.to_string(),
        site: cfg.site.clone(),
        frame_size: size,
        repeats: pairs,
        p50_crc_us: m(&with, &|r| r.rtt_us.p50),
        p50_no_crc_us: m(&without, &|r| r.rtt_us.p50),
        cpu_crc_us: m(&with, &|r| r.cpu_us_per_frame),
        cpu_no_crc_us: m(&without, &|r| r.cpu_us_per_frame),
    })
}

impl BenchReport {
    /// Fills the ratio columns from rows measured at the same site.
    pub fn compute_ratios(&mut self) {
        let rows = self.rows.clone();
        for r in &mut self.rows {
            let tcp = rows
                .iter()
                .find(|t| t.transport == "tcp" && t.site == r.site && t.frame_size == r.frame_size && t.mode == r.mode);
            r.p50_vs_tcp = tcp.filter(|t| t.rtt_us.p50 > 0.0).map(|t| r.rtt_us.p50 / t.rtt_us.p50);
            r.gbit_vs_tcp = tcp.filter(|t| t.gbit_per_s > 0.0).map(|t| r.gbit_per_s / t.gbit_per_s);
            let floor = self.floors.iter().find(|f| f.site == r.site);
            r.p50_vs_floor = floor.filter(|f| f.rtt_us.p50 > 0.0).map(|f| r.rtt_us.p50 / f.rtt_us.p50);
        }
    }

    /// Adds another report's rows, floors, kernels and skips (e.g. the VM's).
    pub fn merge(&mut self, other: BenchReport) {
        self.kernels.extend(other.kernels);
        self.rows.extend(other.rows);
        self.floors.extend(other.floors);
        self.skipped.extend(other.skipped);
        self.profiles.extend(other.profiles);
        self.crc_costs.extend(other.crc_costs);
        self.notes.extend(other.notes);
        self.hosts.extend(other.hosts);
        self.compute_ratios();
    }

    /// Writes `report.json`, `report.md` and `report.svg` into `dir`.
    ///
    /// # Errors
    ///
    /// File-system errors.
    pub fn write(&self, dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join("report.json");
        std::fs::write(&json, serde_json::to_string_pretty(self).map_err(std::io::Error::other)?)?;
        let md = dir.join("report.md");
        std::fs::write(&md, report::markdown(self))?;
        let svg = dir.join("report.svg");
        std::fs::write(&svg, report::svg(self))?;
        Ok(vec![json, md, svg])
    }
}

/// `uname -r`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}
