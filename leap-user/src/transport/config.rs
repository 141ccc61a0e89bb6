//! Configuration shared by the backends: where a node sits in the ring
//! ([`Endpoint`]), how to open a backend ([`Options`]), the UDP settings
//! every datagram backend sends with ([`UdpConfig`]) and the small choices
//! they name. It sits below every backend, so that they and
//! [`super::open`] take it without importing each other.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::frame::reliable::Timers;

/// Whether lost chunks are recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reliability {
    /// Keep recent frames, answer NACKs, NACK what is missing from leap
    /// senders that keep theirs (the default between leap nodes).
    #[default]
    Reliable,
    /// The original's semantics with deadlines: a frame with a missing chunk
    /// is given up with a typed error.
    BestEffort,
}

/// How frames are delimited on the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TcpFraming {
    /// Back to back, fixed size: the original's wire.
    #[default]
    Raw,
    /// `u32` little-endian length, `u8` kind, 3 zero bytes, then the frame.
    Length,
}

/// How to attach: what the user asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum AttachMode {
    /// Native (driver) mode, else generic (SKB) mode with a warning.
    #[default]
    Auto,
    /// Native (driver) mode only.
    Drv,
    /// Generic (SKB) mode only.
    Skb,
}

impl AttachMode {
    /// The name on the command line and in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Drv => "drv",
            Self::Skb => "skb",
        }
    }
}

impl std::str::FromStr for AttachMode {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, UnknownName> {
        [Self::Auto, Self::Drv, Self::Skb].into_iter().find(|m| m.as_str() == s).ok_or_else(|| UnknownName {
            what: "XDP mode",
            name: s.into(),
            choices: &["auto", "drv", "skb"],
        })
    }
}

/// A name that selects none of the choices (of transports, XDP modes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}`; choose one of: {}", choices.join(", "))]
#[non_exhaustive]
pub struct UnknownName {
    /// What the name was to select.
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The names there are.
    pub choices: &'static [&'static str],
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Drv => "native (drv)",
            Self::Skb => "generic (skb)",
        })
    }
}

/// Settings of a [`UdpTransport`](super::udp::UdpTransport).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct UdpConfig {
    /// Address to bind: chunks arrive here and leave from here.
    pub listen: SocketAddr,
    /// The next node.
    pub next: SocketAddr,
    /// Accept chunks only from this address (the previous node's sending
    /// address). `None`: the first source a valid chunk comes from is
    /// locked in, and every other source is dropped and counted
    /// (`wrong_source`). No configuration accepts frames from anyone.
    pub prev: Option<SocketAddr>,
    /// Largest frame to receive.
    pub max_frame_len: usize,
    /// Receive deadline (`None`: wait forever).
    pub recv_timeout: Option<Duration>,
    /// Send chunks with `reserved = 0`, exactly like the original.
    pub original_compat: bool,
    /// Use UDP GSO when the kernel supports it.
    pub gso: bool,
    /// Use UDP GRO when the kernel supports it.
    pub gro: bool,
    /// Spin this long on non-blocking receives before sleeping.
    pub spin: Duration,
    /// Frames in assembly at once (window of the reassembler); 0: derived
    /// from `inflight` ([`Windows`](crate::frame::window::Windows)).
    pub window: u16,
    /// Loss recovery.
    pub reliability: Reliability,
    /// Loss-recovery timers.
    pub timers: Timers,
    /// Where NACKs come from (default: `next`); NACKs from anywhere else
    /// are dropped.
    pub nack_from: Option<SocketAddr>,
    /// Frames kept to answer NACKs; 0: derived from `inflight`.
    pub keep_frames: usize,
    /// Frames the ring keeps in flight (what `window` and `keep_frames`
    /// follow when derived).
    pub inflight: usize,
    /// Bytes the window and the frames kept may take at most (the largest
    /// frame each); derived sizes shrink to fit, sizes asked for that do
    /// not fit are refused.
    pub window_memory: usize,
    /// Send a CRC32C with every frame to a next node that checks it, and
    /// check it on frames received (between proven leap nodes only).
    pub crc: bool,
    /// Send chunk trains (several chunks per datagram, up to the path MTU)
    /// to a next node that proved it takes them; off: one chunk per
    /// datagram, and none announced.
    pub trains: bool,
    /// The largest train this node takes, in bytes of UDP payload (what its
    /// receive path can hold; 0: one chunk per datagram). Announced in
    /// hellos when `trains` is on; set by the backend at open.
    pub rx_train_bytes: usize,
    /// Busy-poll the receive sockets this long per wait (`SO_BUSY_POLL`,
    /// `SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL_BUDGET`) and spin that long
    /// before sleeping; `None`: sleep at once.
    pub busy_poll: Option<Duration>,
    /// A keyed ring: every datagram sent carries a tag of this key (each
    /// chunk 32 bytes of it, no CRC; with `encrypt`, everything after a
    /// chunk's header is encrypted), every datagram taken is checked before
    /// it changes anything; unkeyed peers are refused. Needs a `listen`
    /// address that is not a wildcard (the keys are bound to both ends'
    /// addresses) and not `original_compat`.
    pub ring_key: Option<super::ring_key::KeySet>,
}

impl UdpConfig {
    /// Defaults: 1 s deadline, GSO and GRO on, frames up to 1 MiB.
    pub fn new(listen: SocketAddr, next: SocketAddr) -> Self {
        Self {
            listen,
            next,
            prev: None,
            max_frame_len: 1 << 20,
            recv_timeout: Some(Duration::from_secs(1)),
            original_compat: false,
            gso: true,
            gro: true,
            spin: Duration::ZERO,
            window: 0,
            reliability: Reliability::Reliable,
            timers: Timers::default(),
            nack_from: None,
            keep_frames: 0,
            inflight: 1,
            window_memory: crate::frame::window::DEFAULT_WINDOW_MEMORY,
            crc: true,
            trains: true,
            rx_train_bytes: leap_common::chunk::TRAIN_DATAGRAM_MAX,
            busy_poll: None,
            ring_key: None,
        }
    }
}

/// Where a node sits in the ring.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Endpoint {
    /// This node's address (listen / bind / source).
    pub listen: SocketAddr,
    /// The next node.
    pub next: SocketAddr,
    /// The previous node's sending address, to filter on (`None`: the
    /// first source is locked in).
    pub prev: Option<SocketAddr>,
    /// The interface on which frames arrive (XDP attaches there).
    pub iface: Option<String>,
}

impl Endpoint {
    /// A node listening on `listen` and sending to `next`, taking frames
    /// from the first source (locked in) and with no interface named.
    pub fn new(listen: SocketAddr, next: SocketAddr) -> Self {
        Self { listen, next, prev: None, iface: None }
    }

    /// Takes frames only from `prev`.
    #[must_use]
    pub fn with_prev(mut self, prev: SocketAddr) -> Self {
        self.prev = Some(prev);
        self
    }

    /// Frames arrive on `iface` (XDP attaches there).
    #[must_use]
    pub fn with_iface(mut self, iface: &str) -> Self {
        self.iface = Some(iface.into());
        self
    }
}

/// How to open a backend.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// Frame size (TCP raw framing needs it; datagram backends size buffers).
    pub frame_len: usize,
    /// Receive deadline.
    pub recv_timeout: Option<Duration>,
    /// Time allowed to connect (TCP).
    pub setup_timeout: Duration,
    /// TCP wire framing.
    pub tcp_framing: TcpFraming,
    /// TCP: connect to the next node from this port (see
    /// [`super::tcp::TcpConfig::source_port`]).
    pub tcp_source_port: Option<u16>,
    /// TCP: accept the previous node only from this source port (see
    /// [`super::tcp::TcpConfig::prev_port`]).
    pub tcp_prev_port: Option<u16>,
    /// TCP: both ends of every connection prove this key before any frame
    /// (see [`super::tcp::TcpConfig::ring_key`]). The other backends do
    /// not use it yet.
    pub ring_key: Option<super::ring_key::KeySet>,
    /// Send chunks with `reserved = 0` like the original.
    pub original_compat: bool,
    /// Spin on non-blocking receives this long before sleeping.
    pub spin: Duration,
    /// XDP object to load instead of the embedded one.
    pub xdp_object: Option<PathBuf>,
    /// XDP attach mode.
    pub xdp_mode: AttachMode,
    /// AF_XDP receive queues (`None`: every receive queue of the interface).
    pub xdp_queues: Option<Vec<u32>>,
    /// VLAN IDs a tagged chunk may carry on the XDP path (empty: untagged
    /// chunks only).
    pub xdp_vlans: Vec<u16>,
    /// Pin the running XDP program and maps under `/sys/fs/bpf/leap/<iface>`
    /// while the node runs, so that `leap xdp status|stats` see it (what
    /// `leap node` does).
    pub xdp_pin: bool,
    /// Loss recovery of the datagram backends.
    pub reliability: Reliability,
    /// Use UDP GSO where the kernel has it (one super-datagram per up to 44
    /// chunks); off, every chunk is its own datagram down to the device.
    pub gso: bool,
    /// CRC32C on every frame between proven leap nodes.
    pub crc: bool,
    /// CPUs to pin node threads to (empty: no pinning). A ring puts node
    /// `i` on the `i % len`-th; `leap node` runs on all of them.
    pub cpus: Vec<usize>,
    /// Frames the ring keeps in flight: the datagram backends' window and
    /// frames kept for NACKs follow it.
    pub inflight: usize,
    /// Frames in assembly at once (`None`: derived from `inflight`).
    pub window: Option<u16>,
    /// Frames kept to answer NACKs (`None`: derived from `inflight`).
    pub keep_frames: Option<usize>,
    /// Bytes the window and the frames kept may take per link.
    pub window_memory: usize,
    /// Chunk trains between leap nodes (see [`UdpConfig::trains`]).
    pub trains: bool,
    /// Busy polling on the receive sockets (see [`UdpConfig::busy_poll`]).
    pub busy_poll: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            frame_len: 16392,
            recv_timeout: Some(Duration::from_secs(1)),
            setup_timeout: Duration::from_secs(30),
            tcp_framing: TcpFraming::Raw,
            tcp_source_port: None,
            tcp_prev_port: None,
            ring_key: None,
            original_compat: false,
            spin: Duration::ZERO,
            xdp_object: None,
            xdp_mode: AttachMode::Auto,
            xdp_queues: None,
            xdp_vlans: Vec::new(),
            xdp_pin: false,
            reliability: Reliability::Reliable,
            gso: true,
            crc: true,
            cpus: Vec::new(),
            inflight: 1,
            window: None,
            keep_frames: None,
            window_memory: crate::frame::window::DEFAULT_WINDOW_MEMORY,
            trains: true,
            busy_poll: None,
        }
    }
}

/// The UDP configuration matching an endpoint and options (shared by the
/// datagram backends that send through UDP).
pub fn udp_config(ep: &Endpoint, opts: &Options) -> UdpConfig {
    let mut c = UdpConfig::new(ep.listen, ep.next);
    c.prev = ep.prev;
    c.max_frame_len = opts.frame_len.max(1);
    c.recv_timeout = opts.recv_timeout;
    c.original_compat = opts.original_compat;
    c.spin = opts.spin;
    c.reliability = opts.reliability;
    c.gso = opts.gso;
    c.crc = opts.crc;
    c.inflight = opts.inflight.max(1);
    c.window = opts.window.unwrap_or(0);
    c.keep_frames = opts.keep_frames.unwrap_or(0);
    c.window_memory = opts.window_memory;
    c.trains = opts.trains;
    c.busy_poll = opts.busy_poll;
    c.ring_key.clone_from(&opts.ring_key);
    c
}

impl Options {
    /// The window and frames kept for NACKs a datagram backend opened with
    /// these options would use.
    ///
    /// # Errors
    ///
    /// As [`Windows::new`](crate::frame::window::Windows::new).
    pub fn windows(&self) -> Result<crate::frame::window::Windows, crate::frame::window::WindowError> {
        crate::frame::window::Windows::new(
            self.inflight,
            self.frame_len,
            self.window.unwrap_or(0),
            self.keep_frames.unwrap_or(0),
            self.window_memory,
        )
    }
}
