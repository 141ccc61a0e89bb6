//! `leap bench`: every transport x frame size x mode (latency: one frame in
//! flight; throughput: several) around a ring on this host, in interleaved
//! rounds (each round runs every transport once, the order rotating), with
//! the floor of one 64-byte datagram per hop measured in the same rounds
//! and rotation, so that figures compare as ratios measured together.
//! With a ring key, the key floor (sealing and opening every datagram of a
//! frame, [`key_floor`]) is measured in the floor's slot too, so that a
//! keyed row's extra over the plain one reads next to what the
//! cryptography alone takes.

pub mod floor;
pub mod key_floor;
pub mod profile;
pub mod programs;
pub mod report;
pub mod sched;
pub mod ssh;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::programs::{RingProgram, SEP};
use crate::netns::Topology;
use crate::ring::{Percentiles, Placement, RingConfig, RingReport};
use crate::transport::open::{Options, TransportKind};
use crate::transport::ring_key::KeySet;

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
    /// Rounds: each runs every transport once per size and mode, the order
    /// rotating from round to round; medians over the rounds are reported.
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
    /// MTU of the namespaces' veth pairs (`None`: 1500).
    pub mtu: Option<u32>,
    /// Programs that run the same ring as one process per node (the
    /// bindings' examples, Rust's `bench-member`): rows `KIND·NAME` in
    /// the same rounds, one frame in flight.
    pub programs: Vec<RingProgram>,
}

/// A transport as the benchmark runs it: as configured, or with busy
/// polling (`udp+bp`, when `options.busy_poll` is set) in the same rounds,
/// so that the two compare within one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Backend.
    pub kind: TransportKind,
    /// Run with `options.busy_poll`; without it, busy polling is off.
    pub busy_poll: bool,
    /// Run by this program of [`BenchConfig::programs`], one process per
    /// node, instead of `leap ring`'s threads.
    pub program: Option<usize>,
    /// With the ring key of `options.ring_key`: frames tagged (`tcp+key`,
    /// `udp+key`, ...) or encrypted (`tcp+enc`, `udp+enc`, ...), in the same
    /// rounds as the plain ring.
    pub key: KeyMode,
}

/// How an [`Entry`] uses the ring key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyMode {
    /// No key.
    #[default]
    Plain,
    /// Every frame tagged.
    Tagged,
    /// Every frame encrypted.
    Encrypted,
}

/// Whether a backend can run keyed in this version.
pub fn has_key(k: TransportKind) -> bool {
    !key_modes(k).is_empty()
}

/// The keyed modes a backend runs: tcp tags or encrypts its frames, the
/// datagram backends on the link every datagram; the kernel module cannot
/// take a key.
pub fn key_modes(k: TransportKind) -> &'static [KeyMode] {
    match k {
        TransportKind::Kmod => &[],
        _ => &[KeyMode::Tagged, KeyMode::Encrypted],
    }
}

impl Entry {
    /// `kind` without busy polling.
    pub fn plain(kind: TransportKind) -> Self {
        Self { kind, busy_poll: false, program: None, key: KeyMode::Plain }
    }

    /// [`Self::all`], each plain entry followed by the same ring run by
    /// each of `programs` programs, then the keyed entries when `keyed`.
    pub fn with_programs(kinds: &[TransportKind], busy_poll: bool, programs: usize, keyed: bool) -> Vec<Self> {
        let mut v = Vec::new();
        for e in Self::all(kinds, busy_poll) {
            v.push(e);
            if !e.busy_poll {
                v.extend((0..programs).map(|p| Self { program: Some(p), ..e }));
            }
        }
        if keyed {
            for &kind in kinds {
                for &key in key_modes(kind) {
                    v.push(Self { key, ..Self::plain(kind) });
                }
            }
        }
        v
    }

    /// Its name in the report: `udp`, `udp+bp`, `udp·c`.
    pub fn label(&self, programs: &[RingProgram]) -> String {
        match self.program.and_then(|p| programs.get(p)) {
            Some(p) => format!("{self}{SEP}{}", p.name),
            None => self.to_string(),
        }
    }

    /// The entries measured for `kinds`: each as it is, and the datagram
    /// backends again with busy polling when `busy_poll` is on.
    pub fn all(kinds: &[TransportKind], busy_poll: bool) -> Vec<Self> {
        let mut v: Vec<Self> = kinds.iter().map(|&k| Self::plain(k)).collect();
        if busy_poll {
            v.extend(kinds.iter().filter(|k| has_crc(**k)).map(|&kind| Self { busy_poll: true, ..Self::plain(kind) }));
        }
        v
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = match self.key {
            KeyMode::Plain => "",
            KeyMode::Tagged => "+key",
            KeyMode::Encrypted => "+enc",
        };
        write!(f, "{}{}{key}", self.kind, if self.busy_poll { "+bp" } else { "" })
    }
}

/// One transport x size x mode, medians over the rounds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
    /// Rounds behind the medians.
    pub repeats: usize,
    /// Frames per repetition.
    pub frames: u64,
    /// Median over the rounds of each percentile.
    pub rtt_us: Percentiles,
    /// Each round's p50, in round order (round `i` of every transport ran
    /// under the same conditions).
    #[serde(default)]
    pub round_p50_us: Vec<f64>,
    /// Spread of the round p50s: (max - min) / median, in percent.
    #[serde(default)]
    pub p50_spread_pct: f64,
    /// Median round trips per second.
    pub round_trips_per_s: f64,
    /// Median Gbit/s.
    pub gbit_per_s: f64,
    /// Each round's Gbit/s, in round order.
    #[serde(default)]
    pub round_gbit_per_s: Vec<f64>,
    /// Median CPU time per frame, all nodes, user + system.
    pub cpu_us_per_frame: f64,
    /// Frames lost, summed over repeats.
    pub frames_lost: u64,
    /// Frames corrupt, summed over repeats (must be 0).
    pub frames_corrupt: u64,
    /// Chunks retransmitted, summed over repeats.
    pub retransmits: u64,
    /// Frames the head sent again after waiting for them for the loss
    /// policy's time (seconds, in reliable mode): each is a stall of the
    /// ring. Summed over the rounds.
    #[serde(default)]
    pub frames_resent: u64,
    /// Frame bytes copied in user space per frame byte moved across a hop,
    /// all nodes and rounds summed (None: no bytes moved).
    #[serde(default)]
    pub copies_per_hop: Option<f64>,
    /// Datagrams that carried frames' first copies per frame sent, all
    /// nodes and rounds summed (None: a stream, such as TCP, or no frame
    /// sent).
    #[serde(default)]
    pub datagrams_per_frame: Option<f64>,
    /// p50 / TCP's p50 at the same size, mode and site: the median of the
    /// per-round ratios when both have rounds.
    pub p50_vs_tcp: Option<f64>,
    /// Spread of the per-round ratios: (max - min) / median, in percent.
    #[serde(default)]
    pub p50_vs_tcp_spread_pct: Option<f64>,
    /// A ring program's row (`udp·c`): p50 / the p50 of the same ring
    /// run by Rust as processes (`udp·rust`), the median of the per-round
    /// ratios.
    #[serde(default)]
    pub p50_vs_rust: Option<f64>,
    /// Spread of those per-round ratios, in percent.
    #[serde(default)]
    pub p50_vs_rust_spread_pct: Option<f64>,
    /// A ring program's row: p50 / the p50 of `leap ring`'s threads on the
    /// same transport (`udp`), the median of the per-round ratios.
    #[serde(default)]
    pub p50_vs_threads: Option<f64>,
    /// Spread of those per-round ratios, in percent.
    #[serde(default)]
    pub p50_vs_threads_spread_pct: Option<f64>,
    /// The floor's p50 in each of this row's rounds, in round order: the
    /// floor runs in the same rotation as the rings (empty in reports
    /// from before, and where the floor is not measured).
    #[serde(default)]
    pub round_floor_p50_us: Vec<f64>,
    /// p50 / the floor's p50: the median of the per-round ratios when the
    /// floor ran in this row's rounds, else the ratio to the site's floor.
    pub p50_vs_floor: Option<f64>,
    /// Gbit/s / TCP's at the same size, mode and site (median of the
    /// per-round ratios when both have rounds).
    pub gbit_vs_tcp: Option<f64>,
    /// A keyed datagram row (`udp+key`, `xdp+enc`): the key floor in each
    /// of its rounds, in round order: sealing and opening every datagram
    /// of one frame once (one hop) with its key mode, in microseconds
    /// ([`key_floor`]; empty for other rows and where it is not measured).
    #[serde(default)]
    pub round_key_floor_us: Vec<f64>,
    /// The median of [`Self::round_key_floor_us`]: the cryptography of one
    /// hop.
    #[serde(default)]
    pub key_floor_us: Option<f64>,
    /// [`Self::key_floor_us`] times the ring's hops: the cryptography's
    /// share of a round trip.
    #[serde(default)]
    pub key_floor_round_trip_us: Option<f64>,
    /// The frame's bits over [`Self::key_floor_us`]: what one core can
    /// seal and open (a node seals what it opened), the keyed ring's
    /// ceiling.
    #[serde(default)]
    pub key_floor_gbit_per_s: Option<f64>,
    /// A keyed row: its p50 minus the plain row's (same transport, size,
    /// mode and site), the median of the per-round differences.
    #[serde(default)]
    pub p50_over_plain_us: Option<f64>,
    /// A keyed row: p50 / the plain row's, the median of the per-round
    /// ratios.
    #[serde(default)]
    pub p50_vs_plain: Option<f64>,
    /// A keyed row: Gbit/s / the plain row's, the median of the per-round
    /// ratios.
    #[serde(default)]
    pub gbit_vs_plain: Option<f64>,
}

/// The floor at one site.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Floor {
    /// "host" or "vm".
    pub site: String,
    /// Round trips of one 64-byte datagram around the ring: the median
    /// over its runs of each percentile.
    pub rtt_us: Percentiles,
    /// Hops per round trip.
    pub hops: usize,
    /// Each run's p50, in run order: one per round of every size and
    /// mode, in the rotation with the rings.
    #[serde(default)]
    pub round_p50_us: Vec<f64>,
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
    /// The floor: one 64-byte datagram per hop, `rounds` times, around
    /// the ring as the rings place it. Called in every round of every size
    /// and mode, as one more slot of the rotation, until it says it is not
    /// measurable.
    ///
    /// # Errors
    ///
    /// A failure that should stop the benchmark.
    fn floor(&mut self, nodes: usize, rounds: usize) -> Result<FloorOutcome, String>;
    /// The key floor ([`key_floor::measure`]): microseconds to seal and
    /// open every datagram of one frame of `size` bytes with `keys`, on
    /// the CPU of the ring's first node. Called in the floor's slot of
    /// every round. By default not measured (`None`): the rings run on
    /// other machines than this process.
    ///
    /// # Errors
    ///
    /// The measurement failing (said in the report's notes).
    fn key_floor(&mut self, keys: &KeySet, size: usize) -> Result<Option<f64>, String> {
        let _ = (keys, size);
        Ok(None)
    }
    /// Runs one ring and reports what its head measured.
    ///
    /// # Errors
    ///
    /// The ring failing (recorded as a skipped row).
    fn run(&mut self, rc: &RingConfig) -> Result<RingReport, String>;
    /// Runs one ring with `program` as every member, one process per node.
    ///
    /// # Errors
    ///
    /// The ring failing (recorded as a skipped row); by default, that
    /// these rings cannot run programs.
    fn run_program(&mut self, program: &RingProgram, rc: &RingConfig) -> Result<RingReport, String> {
        let _ = rc;
        Err(format!("ring programs ({}) run only in rings on this host", program.name))
    }
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
                let prefix = format!("lf{}", std::process::id() % 100_000);
                Some(Topology::ring_with_mtu(&prefix, nodes, self.cfg.mtu).map_err(|e| e.to_string())?)
            }
            Placement::Loopback => None,
            Placement::Hosts => return Err("LocalRings cannot place rings on other hosts".into()),
        };
        crate::sys::check_cpus(&self.cfg.options.cpus).map_err(|e| format!("--cpus: {e}"))?;
        floor::measure(topo.as_ref(), nodes, rounds, &self.cfg.options.cpus).map(FloorOutcome::Measured)
    }

    fn key_floor(&mut self, keys: &KeySet, size: usize) -> Result<Option<f64>, String> {
        key_floor::measure(keys, size, &self.cfg.options.cpus).map(Some)
    }

    fn run(&mut self, rc: &RingConfig) -> Result<RingReport, String> {
        crate::ring::run(rc).map_err(|e| e.to_string())
    }

    fn run_program(&mut self, program: &RingProgram, rc: &RingConfig) -> Result<RingReport, String> {
        programs::run(program, rc)
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

/// Receive deadline of the benchmark's rings at most: datagram workers
/// learn that the head is done only when a receive returns, so a run ends
/// up to one deadline after its last frame. Far above every round trip
/// measured; a frame half-received for this long counts as lost.
pub const RECV_TIMEOUT_MAX: Duration = Duration::from_millis(200);

/// One benchmark ring: no control round, a stall bound instead of hanging.
fn ring_config(cfg: &BenchConfig, e: Entry, size: usize, frames: u64, inflight: usize) -> RingConfig {
    let mut rc = RingConfig::new(e.kind, cfg.nodes, size, frames);
    rc.inflight = inflight;
    rc.placement = cfg.placement;
    rc.mtu = cfg.mtu;
    rc.options = Options {
        frame_len: size,
        recv_timeout: cfg.options.recv_timeout.map(|t| t.min(RECV_TIMEOUT_MAX)),
        busy_poll: cfg.options.busy_poll.filter(|_| e.busy_poll),
        ring_key: entry_keys(cfg, e.key),
        ..cfg.options.clone()
    };
    rc.control = false;
    rc.stall_timeout = Duration::from_secs(20);
    rc
}

/// The keys of a ring run in key mode `mode` (`None`: plain, or no key).
fn entry_keys(cfg: &BenchConfig, mode: KeyMode) -> Option<KeySet> {
    match mode {
        KeyMode::Plain => None,
        mode => {
            cfg.options.ring_key.clone().map(|k| KeySet { encrypt: mode == KeyMode::Encrypted, tag_frames: true, ..k })
        }
    }
}

/// The plain row's transport of a keyed row's (`udp` for `udp+key`).
pub(crate) fn plain_label(keyed: &str) -> Option<&str> {
    keyed.strip_suffix("+key").or_else(|| keyed.strip_suffix("+enc"))
}

/// The median (the mean of the middle two of an even count; 0 if empty).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// How far apart `v` lies: (max - min) / median, in percent (0 for fewer
/// than two values or a zero median).
fn spread_pct(v: &[f64]) -> f64 {
    let m = median(v.to_vec());
    if v.len() < 2 || m <= 0.0 {
        return 0.0;
    }
    let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    (hi - lo) / m * 100.0
}

/// Per-round ratios `a[i] / b[i]` of the rounds both have (round `i` of
/// both ran under the same conditions): their median and spread.
fn round_ratio(a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
    let r: Vec<f64> = a.iter().zip(b).filter(|(_, y)| **y > 0.0).map(|(x, y)| x / y).collect();
    (!r.is_empty()).then(|| (median(r.clone()), spread_pct(&r)))
}

/// User-space copies per hop: frame bytes copied in user space by every
/// node (sends and receives) per frame byte that crossed a hop (received
/// by a node), summed over `runs`. None when no byte moved.
pub fn copies_per_hop(runs: &[RingReport]) -> Option<f64> {
    let copied: u64 = runs.iter().map(|r| r.stats.copied_bytes).sum();
    let moved: u64 = runs.iter().map(|r| r.stats.bytes_received).sum();
    (moved > 0).then(|| copied as f64 / moved as f64)
}

/// Datagrams per frame sent, summed over `runs` (None when no datagram was
/// counted: a stream transport).
pub fn datagrams_per_frame(runs: &[RingReport]) -> Option<f64> {
    let datagrams: u64 = runs.iter().map(|r| r.stats.datagrams_sent).sum();
    let frames: u64 = runs.iter().map(|r| r.stats.frames_sent).sum();
    (datagrams > 0 && frames > 0).then(|| datagrams as f64 / frames as f64)
}

/// The row of `kind` at `size` and `mode` from its rounds, in round order.
fn row(
    cfg: &BenchConfig,
    entry: Entry,
    size: usize,
    mode: &str,
    inflight: usize,
    frames: u64,
    runs: &[RingReport],
) -> BenchRow {
    let m = |f: &dyn Fn(&RingReport) -> f64| median(runs.iter().map(f).collect());
    let round_p50_us: Vec<f64> = runs.iter().map(|r| r.rtt_us.p50).collect();
    BenchRow {
        transport: entry.label(&cfg.programs),
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
        p50_spread_pct: spread_pct(&round_p50_us),
        round_p50_us,
        round_trips_per_s: m(&|r| r.round_trips_per_s),
        gbit_per_s: m(&|r| r.gbit_per_s),
        round_gbit_per_s: runs.iter().map(|r| r.gbit_per_s).collect(),
        cpu_us_per_frame: m(&|r| r.cpu_us_per_frame),
        frames_lost: runs.iter().map(|r| r.frames_lost).sum(),
        frames_corrupt: runs.iter().map(|r| r.frames_corrupt).sum(),
        retransmits: runs.iter().map(|r| r.retransmits).sum(),
        frames_resent: runs.iter().map(|r| r.frames_resent).sum(),
        copies_per_hop: copies_per_hop(runs),
        datagrams_per_frame: datagrams_per_frame(runs),
        // The rounds' floors (set by `run_on`) and the comparisons with
        // other rows (`BenchReport::compute_ratios`) come later.
        ..BenchRow::default()
    }
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
    let mut plain = Vec::new();
    for &k in &cfg.transports {
        match rings.unavailable(k) {
            Some(reason) => rep.skipped.push(Skipped { transport: k.to_string(), site: cfg.site.clone(), reason }),
            None => plain.push(k),
        }
    }
    let kinds = Entry::with_programs(
        &plain,
        cfg.options.busy_poll.is_some(),
        cfg.programs.len(),
        cfg.options.ring_key.is_some(),
    );
    // Ring programs run one frame in flight: latency rows only.
    let in_mode = |e: &Entry, inflight: usize| inflight == 1 || e.program.is_none();
    let modes = [("latency", 1usize), ("throughput", THROUGHPUT_INFLIGHT)];
    let profiled: &[Entry] = if cfg.profile.is_some() { &kinds } else { &[] };
    let profiled: Vec<Entry> = profiled.iter().copied().filter(|e| !e.busy_poll && e.program.is_none()).collect();
    let crc_kinds = plain.iter().filter(|k| has_crc(**k)).count();
    let crc_pairs = if cfg.options.crc { crc_runs(cfg) } else { 0 };
    let rounds = cfg.repeat.max(1);
    let entries: usize = modes.iter().map(|&(_, inflight)| kinds.iter().filter(|e| in_mode(e, inflight)).count()).sum();
    let floors = cfg.sizes.len() * modes.len() * rounds;
    let total = entries * cfg.sizes.len() * rounds + floors + profiled.len() + crc_kinds * 2 * crc_pairs;
    let mut done = 0;
    // The floor is one more slot of every round's rotation, so that it
    // meets the machine at the same moments as the rings it is compared
    // with (a floor measured once, before them, could catch a slower or a
    // faster spell than theirs). Off once it proves not measurable here.
    let mut floor_on = true;
    let mut floor_runs: Vec<Percentiles> = Vec::new();
    let floor_trips = if cfg.quick { 1000 } else { 3000 };
    // The key floor of each key mode a keyed datagram row runs, with the
    // keys that row gets; off once it fails or is not measured here.
    let key_floors: Vec<(KeyMode, KeySet)> = [KeyMode::Tagged, KeyMode::Encrypted]
        .into_iter()
        .filter(|&m| kinds.iter().any(|e| e.key == m && has_crc(e.kind)))
        .filter_map(|m| Some((m, entry_keys(cfg, m)?)))
        .collect();
    let mut key_floor_on = true;
    for &size in &cfg.sizes {
        // A transport that failed at this size is not tried again at it.
        let mut failed = vec![false; kinds.len()];
        for (mode, inflight) in modes {
            let frames = frames_for(size, cfg.quick, inflight > 1);
            let mut runs: Vec<Vec<RingReport>> = vec![Vec::new(); kinds.len()];
            let active: Vec<usize> = (0..kinds.len()).filter(|&i| in_mode(&kinds[i], inflight)).collect();
            let mut floor_p50 = Vec::new();
            let mut key_floor_us: Vec<Vec<f64>> = vec![Vec::new(); key_floors.len()];
            for round in 0..rounds {
                // Every transport and the floor once per round, the order
                // rotating, so that the machine's drift (other work, clock
                // speed) hits all of them alike and none always runs first.
                let slots = active.len() + 1;
                for j in 0..slots {
                    let slot = (j + round) % slots;
                    if slot == active.len() {
                        done += 1;
                        for (k, (m, keys)) in key_floors.iter().enumerate() {
                            if !key_floor_on {
                                break;
                            }
                            match rings.key_floor(keys, size) {
                                Ok(Some(us)) => key_floor_us[k].push(us),
                                Ok(None) => key_floor_on = false,
                                Err(e) => {
                                    rep.notes.push(format!("no key floor ({m:?}) at {}: {e}", cfg.site));
                                    key_floor_on = false;
                                }
                            }
                        }
                        if !floor_on {
                            continue;
                        }
                        progress(done - 1, total, &format!("floor, {size} B {mode} round {}/{rounds}", round + 1));
                        match rings.floor(cfg.nodes, floor_trips)? {
                            FloorOutcome::Measured(p) => {
                                floor_p50.push(p.p50);
                                floor_runs.push(p);
                            }
                            FloorOutcome::NotMeasurable(why) => {
                                rep.notes.push(format!("no floor at {}: {why}", cfg.site));
                                floor_on = false;
                            }
                        }
                        continue;
                    }
                    let i = active[slot];
                    let kind = kinds[i];
                    let label = kind.label(&cfg.programs);
                    done += 1;
                    if failed[i] {
                        continue;
                    }
                    progress(done - 1, total, &format!("{label} {size} B {mode}, round {}/{rounds}", round + 1));
                    let rc = ring_config(cfg, kind, size, frames, inflight);
                    let ran = match kind.program {
                        Some(p) => rings.run_program(&cfg.programs[p], &rc),
                        None => rings.run(&rc),
                    };
                    match ran {
                        Ok(x) => runs[i].push(x),
                        Err(e) => {
                            rep.skipped.push(Skipped {
                                transport: label,
                                site: cfg.site.clone(),
                                reason: format!("{size}-byte frames, {mode}: {e}"),
                            });
                            failed[i] = true;
                            // Rounds pair up by index: a transport's rounds
                            // must be a prefix of every other's.
                            runs[i].clear();
                        }
                    }
                }
            }
            for (i, &kind) in kinds.iter().enumerate() {
                if !runs[i].is_empty() {
                    let mut r = row(cfg, kind, size, mode, inflight, frames, &runs[i]);
                    r.round_floor_p50_us = floor_p50.clone();
                    if has_crc(kind.kind)
                        && let Some(k) = key_floors.iter().position(|(m, _)| *m == kind.key)
                    {
                        r.round_key_floor_us = key_floor_us[k].clone();
                    }
                    rep.rows.push(r);
                }
            }
        }
    }
    if !floor_runs.is_empty() {
        let m = |f: &dyn Fn(&Percentiles) -> f64| median(floor_runs.iter().map(f).collect());
        rep.floors.push(Floor {
            site: cfg.site.clone(),
            rtt_us: Percentiles {
                p50: m(&|p| p.p50),
                p90: m(&|p| p.p90),
                p99: m(&|p| p.p99),
                max: m(&|p| p.max),
                mean: m(&|p| p.mean),
            },
            hops: cfg.nodes,
            round_p50_us: floor_runs.iter().map(|p| p.p50).collect(),
        });
    }
    for &kind in &plain {
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
    }
    // Each transport, and with a key each keyed ring, so that a keyed
    // row's extra shows where it goes.
    for &e in &profiled {
        if let (Some((perf, dir)), Some(&size)) = (&cfg.profile, cfg.sizes.first()) {
            let label = e.label(&cfg.programs);
            progress(done, total, &format!("{label} {size} B latency under perf"));
            // Long enough for a few thousand samples whatever the latency.
            let frames = ((256usize << 20) / size).clamp(200, 10_000) as u64;
            match profile::record(perf, &ring_config(cfg, e, size, frames, 1), &label, &cfg.site, dir) {
                Ok(p) => rep.profiles.push(p),
                Err(e) => rep.notes.push(format!("no profile of {label} at {}: {e}", cfg.site)),
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
            let mut rc = ring_config(cfg, Entry::plain(kind), size, frames, 1);
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

/// [`BenchReport::hops`] from its parts (also while its rows are changed).
fn hops_at(floors: &[Floor], nodes: usize, site: &str) -> usize {
    floors.iter().find(|f| f.site == site).map_or(nodes, |f| f.hops)
}

impl BenchReport {
    /// Hops of the ring at `site`: its floor's, else one per node.
    pub fn hops(&self, site: &str) -> usize {
        hops_at(&self.floors, self.nodes, site)
    }

    /// Fills the ratio columns from rows measured at the same site.
    pub fn compute_ratios(&mut self) {
        let rows = self.rows.clone();
        for r in &mut self.rows {
            // The row of ring `name` measured beside this one (the same
            // site, frame size and mode).
            let same = |name: &str| {
                rows.iter().find(|t| {
                    t.transport == name && t.site == r.site && t.frame_size == r.frame_size && t.mode == r.mode
                })
            };
            let tcp = same("tcp");
            // Round by round when both have rounds (the same round ran
            // under the same conditions), else the ratio of the medians.
            let p50 = tcp.and_then(|t| round_ratio(&r.round_p50_us, &t.round_p50_us));
            r.p50_vs_tcp =
                p50.map(|(v, _)| v).or_else(|| tcp.filter(|t| t.rtt_us.p50 > 0.0).map(|t| r.rtt_us.p50 / t.rtt_us.p50));
            r.p50_vs_tcp_spread_pct = p50.map(|(_, s)| s);
            r.gbit_vs_tcp = tcp
                .and_then(|t| round_ratio(&r.round_gbit_per_s, &t.round_gbit_per_s))
                .map(|(v, _)| v)
                .or_else(|| tcp.filter(|t| t.gbit_per_s > 0.0).map(|t| r.gbit_per_s / t.gbit_per_s));
            if let (base, Some(program)) = programs::split_label(&r.transport) {
                // A ring program against Rust: as processes (the same
                // layout) and as `leap ring`'s threads, round by round.
                let vs = |t: Option<&BenchRow>| t.and_then(|t| round_ratio(&r.round_p50_us, &t.round_p50_us));
                let rust = (program != programs::RUST).then(|| vs(same(&format!("{base}{SEP}{}", programs::RUST))));
                (r.p50_vs_rust, r.p50_vs_rust_spread_pct) =
                    rust.flatten().map_or((None, None), |(v, s)| (Some(v), Some(s)));
                (r.p50_vs_threads, r.p50_vs_threads_spread_pct) =
                    vs(same(base)).map_or((None, None), |(v, s)| (Some(v), Some(s)));
            }
            // Round by round when the floor ran in this row's rounds.
            let floor = self.floors.iter().find(|f| f.site == r.site);
            r.p50_vs_floor = round_ratio(&r.round_p50_us, &r.round_floor_p50_us)
                .map(|(v, _)| v)
                .or_else(|| floor.filter(|f| f.rtt_us.p50 > 0.0).map(|f| r.rtt_us.p50 / f.rtt_us.p50));
            // A keyed row against the plain one of its rounds, and the key
            // floor measured in them.
            if let Some(p) = plain_label(&r.transport).and_then(same) {
                let diffs: Vec<f64> = r.round_p50_us.iter().zip(&p.round_p50_us).map(|(k, p)| k - p).collect();
                r.p50_over_plain_us = (!diffs.is_empty()).then(|| median(diffs));
                r.p50_vs_plain = round_ratio(&r.round_p50_us, &p.round_p50_us).map(|(v, _)| v);
                r.gbit_vs_plain = round_ratio(&r.round_gbit_per_s, &p.round_gbit_per_s).map(|(v, _)| v);
            }
            r.key_floor_us = (!r.round_key_floor_us.is_empty()).then(|| median(r.round_key_floor_us.clone()));
            let hops = hops_at(&self.floors, self.nodes, &r.site);
            r.key_floor_round_trip_us = r.key_floor_us.map(|us| us * hops as f64);
            r.key_floor_gbit_per_s =
                r.key_floor_us.filter(|&us| us > 0.0).map(|us| r.frame_size as f64 * 8.0 / (us * 1e3));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{HeadSummary, assemble};
    use crate::transport::Stats;

    /// A report as a ring of `rc` would give, with this p50 and these
    /// counters.
    fn report(rc: &RingConfig, p50: f64, stats: Stats) -> RingReport {
        let head = HeadSummary {
            sent: rc.frames,
            delivered: rc.frames,
            rtt_us: Percentiles { p50, p90: p50, p99: p50, max: p50, mean: p50 },
            elapsed_s: 1.0,
            ..HeadSummary::default()
        };
        assemble(rc, head, stats, &[], Duration::from_millis(1))
    }

    /// Rings that answer from a script: round trip p50 = `p50(kind, n)`
    /// for the `n`th run of `kind`; every run is logged.
    struct Scripted {
        p50: fn(TransportKind, usize) -> f64,
        runs: Vec<(TransportKind, usize, usize)>,
        /// Whether each run busy-polled, in run order.
        busy: Vec<bool>,
        /// Each run's key: None, or whether it encrypted, in run order.
        keyed: Vec<Option<bool>>,
        /// Ring programs: p50 = `program_p50(name, n)` for the `n`th run
        /// of `name` on a transport.
        program_p50: fn(&str, usize) -> f64,
        /// Every run in order: the transport and the program (None:
        /// `leap ring`'s threads) with the frames in flight.
        order: Vec<(TransportKind, Option<String>, usize)>,
        /// The floor: p50 = `floor_p50(n)` for the `n`th floor run.
        floor_p50: fn(usize) -> f64,
        /// Floor runs so far.
        floors: usize,
        /// Added to the p50 of a tagged and of an encrypted ring.
        key_extra: [f64; 2],
        /// The key floor: `key_floor(encrypt, n)` for its `n`th run in
        /// that mode (`None`: not measured).
        key_floor: fn(bool, usize) -> Option<f64>,
        /// Key floor runs so far: whether each encrypted, in run order.
        key_floors: Vec<bool>,
    }

    impl Scripted {
        fn new(p50: fn(TransportKind, usize) -> f64) -> Self {
            Self {
                p50,
                runs: Vec::new(),
                busy: Vec::new(),
                keyed: Vec::new(),
                program_p50: |_, _| 1.0,
                order: Vec::new(),
                floor_p50: |_| 10.0,
                floors: 0,
                key_extra: [0.0; 2],
                key_floor: |_, _| None,
                key_floors: Vec::new(),
            }
        }
    }

    impl Rings for Scripted {
        fn kernels(&self) -> Vec<(String, String)> {
            Vec::new()
        }
        fn unavailable(&self, _: TransportKind) -> Option<String> {
            None
        }
        fn floor(&mut self, _: usize, _: usize) -> Result<FloorOutcome, String> {
            self.floors += 1;
            Ok(FloorOutcome::Measured(Percentiles { p50: (self.floor_p50)(self.floors - 1), ..Percentiles::default() }))
        }
        fn key_floor(&mut self, keys: &KeySet, _: usize) -> Result<Option<f64>, String> {
            let n = self.key_floors.iter().filter(|&&e| e == keys.encrypt).count();
            self.key_floors.push(keys.encrypt);
            Ok((self.key_floor)(keys.encrypt, n))
        }
        fn run(&mut self, rc: &RingConfig) -> Result<RingReport, String> {
            let n =
                self.runs.iter().filter(|r| r.0 == rc.transport && r.1 == rc.frame_size && r.2 == rc.inflight).count();
            self.runs.push((rc.transport, rc.frame_size, rc.inflight));
            self.busy.push(rc.options.busy_poll.is_some());
            self.keyed.push(rc.options.ring_key.as_ref().map(|k| k.encrypt));
            self.order.push((rc.transport, None, rc.inflight));
            let moved = rc.frames * rc.frame_size as u64 * rc.nodes as u64;
            let sent = rc.frames * rc.nodes as u64;
            // Datagram backends: 3 datagrams per 2 frames; TCP counts none.
            let datagrams = if rc.transport == TransportKind::Tcp { 0 } else { sent * 3 / 2 };
            let stats = Stats {
                bytes_received: moved,
                copied_bytes: 2 * moved,
                frames_sent: sent,
                datagrams_sent: datagrams,
                ..Stats::default()
            };
            let extra = rc.options.ring_key.as_ref().map_or(0.0, |k| self.key_extra[usize::from(k.encrypt)]);
            Ok(report(rc, (self.p50)(rc.transport, n) + extra, stats))
        }
        fn run_program(&mut self, program: &RingProgram, rc: &RingConfig) -> Result<RingReport, String> {
            let n = self.order.iter().filter(|o| o.0 == rc.transport && o.1.as_deref() == Some(&program.name)).count();
            self.order.push((rc.transport, Some(program.name.clone()), rc.inflight));
            if program.name == "broken" {
                return Err("exited (1)".into());
            }
            Ok(report(rc, (self.program_p50)(&program.name, n), Stats::default()))
        }
    }

    fn config(rounds: usize) -> BenchConfig {
        BenchConfig {
            transports: vec![TransportKind::Tcp, TransportKind::Udp],
            sizes: vec![16_392],
            nodes: 3,
            repeat: rounds,
            quick: true,
            placement: Placement::Loopback,
            options: Options { crc: false, ..Options::default() },
            site: "host".into(),
            profile: None,
            mtu: None,
            programs: Vec::new(),
        }
    }

    #[test]
    fn median_of_even_count_is_mean_of_middle_two() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn spread_is_range_over_median_in_percent() {
        assert_eq!(spread_pct(&[50.0]), 0.0);
        assert!((spread_pct(&[45.0, 50.0, 55.0]) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn copies_per_hop_divides_copied_by_moved_bytes_over_all_runs() {
        let rc = RingConfig::new(TransportKind::Udp, 3, 1000, 10);
        // 10 frames x 1000 B x 3 hops = 30 000 B moved per run.
        let run = |copied| report(&rc, 1.0, Stats { bytes_received: 30_000, copied_bytes: copied, ..Stats::default() });
        assert_eq!(copies_per_hop(&[run(30_000), run(90_000)]), Some(2.0));
        assert_eq!(copies_per_hop(&[run(0)]), Some(0.0));
        assert_eq!(copies_per_hop(&[report(&rc, 1.0, Stats::default())]), None);
    }

    #[test]
    fn rounds_interleave_transports_in_rotating_order() {
        let mut rings = Scripted::new(|_, _| 1.0);
        let cfg = config(3);
        run_on(&cfg, &mut rings, &|_, _, _| {}).unwrap();
        let latency: Vec<TransportKind> = rings.runs.iter().filter(|r| r.2 == 1).map(|r| r.0).collect();
        use TransportKind::{Tcp, Udp};
        assert_eq!(latency, [Tcp, Udp, Udp, Tcp, Tcp, Udp]);
    }

    #[test]
    fn ratio_to_tcp_is_the_median_of_per_round_ratios() {
        // The machine slows down from round to round; UDP is always 0.9x
        // TCP in the same round, which the ratio of medians would miss
        // (the medians come from different rounds when the order rotates).
        let mut rings = Scripted::new(|kind, n| {
            let level = [10.0, 40.0, 20.0, 30.0][n];
            if kind == TransportKind::Udp { 0.9 * level } else { level }
        });
        let rep = run_on(&config(4), &mut rings, &|_, _, _| {}).unwrap();
        let row = |t: &str| rep.rows.iter().find(|r| r.transport == t && r.mode == "latency").unwrap();
        let (tcp, udp) = (row("tcp"), row("udp"));
        assert_eq!(tcp.round_p50_us, [10.0, 40.0, 20.0, 30.0]);
        assert_eq!(tcp.rtt_us.p50, 25.0);
        assert!((tcp.p50_spread_pct - 120.0).abs() < 1e-9, "{}", tcp.p50_spread_pct);
        assert!((udp.p50_vs_tcp.unwrap() - 0.9).abs() < 1e-9);
        assert!(udp.p50_vs_tcp_spread_pct.unwrap() < 1e-9);
        assert_eq!(udp.copies_per_hop, Some(2.0));
        assert_eq!(rep.floors[0].rtt_us.p50, 10.0);
        let md = report::markdown(&rep);
        assert!(md.contains("Copies per hop"), "{md}");
        assert!(md.contains("2.00 / 2.00"), "{md}");
        assert!(md.contains("= 0.90x TCP, spread 0% over the rounds (target <= 0.85: **not met**)"), "{md}");
    }

    #[test]
    fn floor_runs_in_every_round_and_rows_compare_with_it_round_by_round() {
        // The machine drifts from round to round; UDP is always 4.5x the
        // floor of its round at one frame in flight, and the floor is
        // slower in the throughput rounds: the ratio to the floor's median
        // over all its runs would say 3.2x.
        let mut rings = Scripted::new(|kind, n| {
            let level = [10.0, 40.0, 20.0, 30.0][n];
            if kind == TransportKind::Udp { 0.9 * level } else { level }
        });
        rings.floor_p50 = |n| [10.0, 40.0, 20.0, 30.0][n % 4] / if n < 4 { 5.0 } else { 2.0 };
        let rep = run_on(&config(4), &mut rings, &|_, _, _| {}).unwrap();
        assert_eq!(rings.floors, 8, "one floor run per round of each size and mode");
        let floor = &rep.floors[0];
        assert_eq!(floor.round_p50_us, [2.0, 8.0, 4.0, 6.0, 5.0, 20.0, 10.0, 15.0]);
        assert_eq!(floor.rtt_us.p50, 7.0, "the median of the runs");
        let row = |t: &str, mode: &str| rep.rows.iter().find(|r| r.transport == t && r.mode == mode).unwrap();
        let udp = row("udp", "latency");
        assert_eq!(udp.round_floor_p50_us, [2.0, 8.0, 4.0, 6.0]);
        assert!((udp.p50_vs_floor.unwrap() - 4.5).abs() < 1e-9, "{:?}", udp.p50_vs_floor);
        assert!((row("tcp", "throughput").p50_vs_floor.unwrap() - 2.0).abs() < 1e-9);
        let md = report::markdown(&rep);
        assert!(md.contains("median of 8 runs, one in every round next to the rings (p50 2.0 to 20.0 us)"), "{md}");
    }

    #[test]
    fn busy_poll_runs_the_datagram_transports_again_in_the_same_rounds() {
        let mut rings = Scripted::new(|_, _| 1.0);
        let mut cfg = config(2);
        cfg.options.busy_poll = Some(Duration::from_micros(50));
        let rep = run_on(&cfg, &mut rings, &|_, _, _| {}).unwrap();
        use TransportKind::{Tcp, Udp};
        // Round 1: tcp, udp, udp+bp; round 2 rotated: udp, udp+bp, tcp.
        let latency: Vec<(TransportKind, bool)> =
            rings.runs.iter().zip(&rings.busy).filter(|(r, _)| r.2 == 1).map(|(r, &b)| (r.0, b)).collect();
        assert_eq!(latency, [(Tcp, false), (Udp, false), (Udp, true), (Udp, false), (Udp, true), (Tcp, false)]);
        let names: Vec<&str> = rep.rows.iter().filter(|r| r.mode == "latency").map(|r| r.transport.as_str()).collect();
        assert_eq!(names, ["tcp", "udp", "udp+bp"]);
        let bp = rep.rows.iter().find(|r| r.transport == "udp+bp").unwrap();
        assert_eq!(bp.datagrams_per_frame, Some(1.5));
        assert_eq!(bp.p50_vs_tcp, Some(1.0), "ratios to TCP from the same rounds");
        assert_eq!(rep.rows[0].datagrams_per_frame, None, "TCP is a stream");
    }

    #[test]
    fn a_key_adds_key_and_enc_rows_in_the_same_rounds_and_only_they_are_keyed() {
        let mut rings = Scripted::new(|k, _| if k == TransportKind::Tcp { 10.0 } else { 20.0 });
        let mut cfg = config(2);
        cfg.options.ring_key =
            Some(crate::transport::ring_key::KeySet::new(crate::transport::ring_key::RingKey::from_bytes([1; 32])));
        let rep = run_on(&cfg, &mut rings, &|_, _, _| {}).unwrap();
        let names: Vec<&str> = rep.rows.iter().filter(|r| r.mode == "latency").map(|r| r.transport.as_str()).collect();
        assert_eq!(names, ["tcp", "udp", "tcp+key", "tcp+enc", "udp+key", "udp+enc"]);
        // Per round: tcp and udp plain, then each tagged and encrypted
        // (rotated).
        let latency: Vec<(TransportKind, Option<bool>)> =
            rings.runs.iter().zip(&rings.keyed).filter(|(r, _)| r.2 == 1).map(|(r, &k)| (r.0, k)).collect();
        use TransportKind::{Tcp, Udp};
        assert_eq!(latency.len(), 12);
        assert_eq!(
            latency[..6],
            [(Tcp, None), (Udp, None), (Tcp, Some(false)), (Tcp, Some(true)), (Udp, Some(false)), (Udp, Some(true))]
        );
        assert!(key_modes(TransportKind::Kmod).is_empty() && !has_key(TransportKind::Kmod));
        let key = rep.rows.iter().find(|r| r.transport == "tcp+key").unwrap();
        assert_eq!(key.p50_vs_tcp, Some(1.0), "the keyed cost is read against tcp of the same rounds");
    }

    #[test]
    fn keyed_datagram_rows_carry_the_key_floor_of_their_rounds_beside_their_extra_over_plain() {
        let mut rings = Scripted::new(|k, _| if k == TransportKind::Tcp { 10.0 } else { 20.0 });
        rings.key_extra = [5.0, 8.0];
        // Tagged: 1 us in odd runs, 2 us in even ones; encrypted 4 us.
        rings.key_floor = |encrypt, n| Some(if encrypt { 4.0 } else { [1.0, 2.0][n % 2] });
        let mut cfg = config(3);
        cfg.options.ring_key = Some(KeySet::new(crate::transport::ring_key::RingKey::from_bytes([1; 32])));
        let rep = run_on(&cfg, &mut rings, &|_, _, _| {}).unwrap();
        // Once per mode in the floor's slot of every round of each mode.
        assert_eq!(rings.key_floors, [false, true].repeat(2 * 3));
        let row = |t: &str, mode: &str| rep.rows.iter().find(|r| r.transport == t && r.mode == mode).unwrap();
        let key = row("udp+key", "latency");
        assert_eq!(key.round_key_floor_us, [1.0, 2.0, 1.0], "the latency rounds' runs, in round order");
        assert_eq!(key.key_floor_us, Some(1.0));
        assert_eq!(key.key_floor_round_trip_us, Some(3.0), "one seal and open per hop, 3 hops");
        let gbit = key.key_floor_gbit_per_s.unwrap();
        assert!((gbit - 16_392.0 * 8.0 / 1e3).abs() < 1e-9, "{gbit}");
        assert_eq!(key.p50_over_plain_us, Some(5.0));
        assert_eq!(key.p50_vs_plain, Some(1.25));
        assert_eq!(row("udp+key", "throughput").round_key_floor_us, [2.0, 1.0, 2.0]);
        let enc = row("udp+enc", "latency");
        assert_eq!((enc.key_floor_us, enc.p50_over_plain_us), (Some(4.0), Some(8.0)));
        // TCP seals whole frames: its keyed rows have no datagram floor.
        let tcp = row("tcp+key", "latency");
        assert!(tcp.round_key_floor_us.is_empty() && tcp.key_floor_us.is_none());
        assert_eq!(tcp.p50_over_plain_us, Some(5.0));
        assert!(row("udp", "latency").p50_over_plain_us.is_none(), "a plain row has no plain row to compare with");
        let md = report::markdown(&rep);
        let table = md.split("## What the ring key costs").nth(1).expect("a key table");
        let line = table.lines().find(|l| l.starts_with("| udp+key | host |")).unwrap_or_else(|| panic!("{table}"));
        assert!(line.contains("| 5.0 us (1.25x) | 3.0 us (1.0 x 3) |"), "{line}");
        assert!(table.contains("| CPU/frame over plain, 8 in flight |"), "{table}");
        let header = table.lines().find(|l| l.starts_with("| transport |")).unwrap();
        assert_eq!(line.matches('|').count(), header.matches('|').count(), "a cell per column: {table}");
        let tcp_line = table.lines().find(|l| l.starts_with("| tcp+key |")).unwrap();
        assert!(tcp_line.contains("not measured"), "{tcp_line}");
    }

    #[test]
    fn rings_elsewhere_measure_no_key_floor_and_say_nothing_of_it() {
        let mut rings = Scripted::new(|_, _| 20.0);
        let mut cfg = config(2);
        cfg.options.ring_key = Some(KeySet::new(crate::transport::ring_key::RingKey::from_bytes([1; 32])));
        let rep = run_on(&cfg, &mut rings, &|_, _, _| {}).unwrap();
        assert_eq!(rings.key_floors.len(), 1, "asked once, then off");
        assert!(rep.rows.iter().all(|r| r.key_floor_us.is_none()));
    }

    #[test]
    fn without_busy_poll_no_bp_entries_and_nothing_busy_polls() {
        assert_eq!(Entry::all(&[TransportKind::Tcp, TransportKind::Xdp], false).len(), 2);
        let bp = Entry::all(&[TransportKind::Tcp, TransportKind::Xdp, TransportKind::Kmod], true);
        let names: Vec<String> = bp.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["tcp", "xdp", "kmod", "xdp+bp"]);
        let mut cfg = config(1);
        cfg.options.busy_poll = Some(Duration::from_micros(50));
        let rc = ring_config(&cfg, Entry::plain(TransportKind::Udp), 16_392, 10, 1);
        assert_eq!(rc.options.busy_poll, None, "the plain entry runs without busy polling");
        let rc = ring_config(&cfg, bp[3], 16_392, 10, 1);
        assert_eq!(rc.options.busy_poll, Some(Duration::from_micros(50)));
    }

    #[test]
    fn ring_programs_run_in_the_same_rounds_latency_only_and_compare_with_rust_processes() {
        // Round levels as the machine drifts; each ring a fixed factor of
        // the level of its round: tcp 1, rust processes 1.1, c 1.155.
        let mut rings = Scripted::new(|_, n| [10.0, 40.0, 20.0][n]);
        rings.program_p50 = |name, n| {
            let level = [10.0, 40.0, 20.0][n];
            match name {
                "rust" => 1.1 * level,
                _ => 1.155 * level,
            }
        };
        let mut cfg = config(3);
        cfg.transports = vec![TransportKind::Tcp];
        cfg.programs = ["rust=leap bench-member", "c=ring --copy", "broken=false"].map(|p| p.parse().unwrap()).into();
        let rep = run_on(&cfg, &mut rings, &|_, _, _| {}).unwrap();
        let name = |o: &(TransportKind, Option<String>, usize)| o.1.clone().unwrap_or_else(|| "threads".into());
        let latency: Vec<String> = rings.order.iter().filter(|o| o.2 == 1).map(name).collect();
        // Rotating; `broken` failed in round 1 and is not run again.
        assert_eq!(
            latency,
            ["threads", "rust", "c", "broken", "rust", "c", "threads", "c", "threads", "rust"],
            "{latency:?}"
        );
        assert!(rings.order.iter().filter(|o| o.2 > 1).all(|o| o.1.is_none()), "programs run latency only");
        let row = |t: &str| rep.rows.iter().find(|r| r.transport == t && r.mode == "latency").unwrap();
        let c = row("tcp·c");
        assert!((c.p50_vs_rust.unwrap() - 1.05).abs() < 1e-9, "{c:?}");
        assert!(c.p50_vs_rust_spread_pct.unwrap() < 1e-9);
        assert!((c.p50_vs_threads.unwrap() - 1.155).abs() < 1e-9);
        assert!((row("tcp·rust").p50_vs_threads.unwrap() - 1.1).abs() < 1e-9);
        assert_eq!(row("tcp·rust").p50_vs_rust, None);
        assert_eq!(row("tcp").p50_vs_threads, None);
        assert!(!rep.rows.iter().any(|r| r.transport.contains('·') && r.mode == "throughput"));
        assert!(rep.skipped.iter().any(|s| s.transport == "tcp·broken" && s.reason.contains("exited")));
        let md = report::markdown(&rep);
        assert!(md.contains("## Bindings"), "{md}");
        assert!(md.contains("| tcp·c | host | 16392 B |") && md.contains("1.050x (0%) | 1.155x (0%)"), "{md}");
        assert!(md.contains("`tcp·c` (host): target <= 1.05: 1.050x: met"), "{md}");
        let thr = md.split("## Throughput").nth(1).unwrap().split("## CPU").next().unwrap();
        assert!(!thr.contains('·'), "no throughput rows for programs: {thr}");
    }
}
