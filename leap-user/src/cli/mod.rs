//! The `leap` command line: argument definitions and one module per
//! subcommand.

pub mod bench;
pub mod bench_member;
pub mod capabilities;
pub mod config;
pub mod flood;
pub mod key;
pub mod kmod;
pub mod node;
pub mod ring;
pub mod serve;
pub mod source;
pub mod stats;
pub mod xdp;

use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::frame::window::DEFAULT_WINDOW_MEMORY;
use crate::transport::config::AttachMode;
use crate::transport::open::{Options, TransportKind};
use crate::transport::tcp::TcpFraming;

/// leap: moves activation frames around a pipeline-parallel ring.
#[derive(Debug, Parser)]
#[command(name = "leap", version, about, propagate_version = true)]
pub struct Cli {
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides.
    #[arg(long, global = true, default_value = "warn")]
    pub log: String,
    /// What to do.
    #[command(subcommand)]
    pub cmd: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a whole ring on this host and check every frame.
    Ring(ring::RingArgs),
    /// Run one ring member (for a ring across machines).
    Node(node::NodeArgs),
    /// Measure every transport and write report.json, report.md, report.svg.
    Bench(bench::BenchArgs),
    /// One ring member speaking `leap bench --ring-program`'s protocol:
    /// the bench's Rust ring as one process per node.
    BenchMember(bench_member::MemberArgs),
    /// Agent for `leap bench --hosts`: runs ring members on request of an
    /// authenticated coordinator.
    Serve(serve::ServeArgs),
    /// Show a running node's counters.
    Stats(stats::StatsArgs),
    /// Print what this host can run, as JSON (transports, interfaces,
    /// kernel): what `leap bench --hosts ssh://...` asks every host.
    Capabilities(capabilities::CapabilitiesArgs),
    /// Send random and malformed LEAP packets at a test address (for tests).
    #[command(hide = true)]
    Flood(flood::FloodArgs),
    /// Inspect the leap_kmod kernel module.
    Kmod(kmod::KmodArgs),
    /// Attach, detach and inspect the XDP program on an interface.
    Xdp(xdp::XdpArgs),
    /// Make and check ring keys (`--key-file`).
    Key(key::KeyArgs),
}

/// `--transport` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// Reliable TCP stream.
    Tcp,
    /// UDP in the LEAP chunk format.
    Udp,
    /// XDP + AF_XDP sockets.
    Xdp,
    /// XDP + BPF ring buffer.
    XdpRingbuf,
    /// The leap_kmod kernel module.
    Kmod,
}

impl From<TransportArg> for TransportKind {
    fn from(t: TransportArg) -> Self {
        match t {
            TransportArg::Tcp => TransportKind::Tcp,
            TransportArg::Udp => TransportKind::Udp,
            TransportArg::Xdp => TransportKind::Xdp,
            TransportArg::XdpRingbuf => TransportKind::XdpRingbuf,
            TransportArg::Kmod => TransportKind::Kmod,
        }
    }
}

/// `--tcp-framing` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FramingArg {
    /// Frames back to back, like the original.
    Raw,
    /// 8-byte length/kind prefix per frame (leap peers only).
    Length,
}

/// Backend options shared by `ring` and `node`.
#[derive(Debug, Clone, Args)]
pub struct TransportArgs {
    /// Receive deadline per frame, in milliseconds (0: none).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub timeout_ms: u64,
    /// Seconds allowed for connecting to the neighbours.
    #[arg(long, default_value_t = 30, value_name = "S")]
    pub setup_timeout_s: u64,
    /// TCP framing (both ends must agree).
    #[arg(long, value_enum, default_value = "raw")]
    pub tcp_framing: FramingArg,
    /// TCP: connect to the next node from this port of the listen address
    /// (the next node's --tcp-prev-port; not the listen port).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub tcp_source_port: Option<u16>,
    /// TCP: accept the previous node only from this source port (its
    /// --tcp-source-port): no other local user of its host can connect
    /// first in its place. Default: any port (original nodes use an
    /// ephemeral one).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub tcp_prev_port: Option<u16>,
    /// Send chunks exactly like the original (reserved field 0).
    #[arg(long)]
    pub original_compat: bool,
    /// A ring key file (64 hex digits, mode 0600; `leap key new FILE`
    /// makes one): tcp connections prove the key and every frame carries
    /// its tag; on udp, xdp and xdp-ringbuf every datagram does (kmod
    /// refuses a key).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<std::path::PathBuf>,
    /// The ring's previous key, still accepted while the ring changes keys
    /// node by node (each use is logged).
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub previous_key_file: Option<std::path::PathBuf>,
    /// Encrypt frames with the ring key (every node alike).
    #[arg(long, requires = "key_file")]
    pub encrypt: bool,
    /// Busy-poll receives this many microseconds before sleeping.
    #[arg(long, default_value_t = 0, value_name = "US")]
    pub spin_us: u64,
    /// XDP object to load instead of the embedded one.
    #[arg(long, value_name = "PATH")]
    pub xdp_object: Option<std::path::PathBuf>,
    /// XDP attach mode.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub xdp_mode: AttachMode,
    /// AF_XDP receive queues: `all` (every receive queue of the interface,
    /// up to 64) or a list such as `0,1`; `0` alone binds one socket and
    /// wants an ntuple rule steering LEAP traffic to queue 0 (README).
    #[arg(long, default_value = "all", value_parser = parse_queues)]
    pub xdp_queues: Queues,
    /// VLAN ID a tagged chunk may carry on the XDP path (repeat for
    /// several; default: untagged chunks only).
    #[arg(
        long = "xdp-vlan",
        id = "xdp_vlan",
        value_name = "ID",
        value_parser = clap::value_parser!(u16).range(0..=4095)
    )]
    pub xdp_vlans: Vec<u16>,
    /// Loss recovery of the datagram transports.
    #[arg(long, value_enum, default_value = "reliable")]
    pub reliability: ReliabilityArg,
    /// Send one datagram per chunk even where UDP GSO is available.
    #[arg(long)]
    pub no_gso: bool,
    /// No CRC32C on frames between leap nodes (on by default; a frame whose
    /// CRC fails is never delivered). `--no-crc=false` keeps it on over a
    /// node file's `crc = false`.
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true"
    )]
    pub no_crc: bool,
    /// One chunk per datagram: no chunk trains, even to leap nodes that
    /// take them (trains fill datagrams up to the path MTU).
    /// `--no-trains=false` keeps them on over a node file's `trains = false`.
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true"
    )]
    pub no_trains: bool,
    /// Busy-poll the receive sockets for US microseconds per wait
    /// (SO_BUSY_POLL, SO_PREFER_BUSY_POLL, SO_BUSY_POLL_BUDGET; these need
    /// CAP_NET_ADMIN) and spin as long before sleeping. Alone: 50. `leap
    /// node --busy-poll 0`: off, over a node file's `busy_poll_us`.
    #[arg(long, value_name = "US", num_args = 0..=1, default_missing_value = "50")]
    pub busy_poll: Option<u64>,
    /// Pin to these CPUs (comma-separated): ring node i runs on the
    /// (i mod n)-th, `leap node` on all of them.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub cpus: Vec<usize>,
    /// Datagram transports: frames in assembly at once (default: derived
    /// from the frames in flight, at least 16).
    #[arg(long, value_name = "FRAMES", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub window: Option<u16>,
    /// Datagram transports: frames kept to answer NACKs (default: twice the
    /// window).
    #[arg(long, value_name = "FRAMES", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub keep_frames: Option<u64>,
    /// Datagram transports: memory the window and the frames kept may take
    /// per link, in MiB (derived sizes shrink to fit).
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_WINDOW_MEMORY >> 20)]
    pub window_memory_mib: usize,
}

/// `--xdp-queues`: every receive queue, or the listed ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queues(pub Option<Vec<u32>>);

/// Parses `all` or a comma-separated list of queue numbers.
///
/// # Errors
///
/// A message naming the fix.
pub fn parse_queues(s: &str) -> Result<Queues, String> {
    if s == "all" {
        return Ok(Queues(None));
    }
    let max = leap_common::xdp::MAX_QUEUES;
    let q: Result<Vec<u32>, _> = s.split(',').map(|x| x.trim().parse::<u32>()).collect();
    match q {
        Ok(v) if crate::transport::xdp::check_queues(&v).is_ok() => Ok(Queues(Some(v))),
        _ => Err(format!("`{s}`: `all` or up to {max} queue numbers below {max}, such as 0,1 (0 alone: one queue)")),
    }
}

/// `--reliability` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReliabilityArg {
    /// NACK missing chunks, retransmit them (between leap nodes).
    Reliable,
    /// Give up frames with missing chunks (typed error, no hang).
    BestEffort,
}

impl From<crate::transport::config::Reliability> for ReliabilityArg {
    fn from(r: crate::transport::config::Reliability) -> Self {
        match r {
            crate::transport::config::Reliability::Reliable => Self::Reliable,
            crate::transport::config::Reliability::BestEffort => Self::BestEffort,
        }
    }
}

impl TransportArgs {
    /// The keys the key files name (`None`: an unkeyed ring).
    ///
    /// # Errors
    ///
    /// A key file that cannot be used, named with the fix.
    pub fn keys(&self) -> anyhow::Result<Option<crate::transport::ring_key::KeySet>> {
        use crate::transport::ring_key::{KeySet, RingKey};
        let Some(current) = &self.key_file else { return Ok(None) };
        let read = |p: &std::path::Path| RingKey::from_file(p).map_err(|e| anyhow::anyhow!("--key-file: {e}"));
        Ok(Some(KeySet {
            previous: self.previous_key_file.as_deref().map(read).transpose()?,
            encrypt: self.encrypt,
            ..KeySet::new(read(current)?)
        }))
    }

    /// Backend options for frames of `frame_len` bytes (the keys are
    /// [`Self::keys`]).
    pub fn options(&self, frame_len: usize) -> Options {
        Options {
            frame_len,
            recv_timeout: (self.timeout_ms > 0).then(|| Duration::from_millis(self.timeout_ms)),
            setup_timeout: Duration::from_secs(self.setup_timeout_s.max(1)),
            tcp_framing: match self.tcp_framing {
                FramingArg::Raw => TcpFraming::Raw,
                FramingArg::Length => TcpFraming::Length,
            },
            tcp_source_port: self.tcp_source_port,
            tcp_prev_port: self.tcp_prev_port,
            ring_key: None,
            original_compat: self.original_compat,
            spin: Duration::from_micros(self.spin_us),
            xdp_object: self.xdp_object.clone(),
            xdp_mode: self.xdp_mode,
            xdp_queues: self.xdp_queues.0.clone(),
            xdp_vlans: self.xdp_vlans.clone(),
            xdp_pin: false,
            reliability: match self.reliability {
                ReliabilityArg::Reliable => crate::transport::config::Reliability::Reliable,
                ReliabilityArg::BestEffort => crate::transport::config::Reliability::BestEffort,
            },
            gso: !self.no_gso,
            crc: !self.no_crc,
            cpus: self.cpus.clone(),
            inflight: 1,
            window: self.window,
            keep_frames: self.keep_frames.map(|k| k as usize),
            window_memory: self.window_memory_mib.saturating_mul(1 << 20),
            trains: !self.no_trains,
            busy_poll: self.busy_poll.map(Duration::from_micros),
        }
    }
}
