//! Choosing and opening a backend by name, for the CLI, the ring runner and
//! embedders that take the transport from configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::tcp::{TcpConfig, TcpFraming, TcpTransport};
use super::udp::{UdpConfig, UdpTransport};
use super::{Result, Transport};

/// The ways to move a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// Reliable TCP stream.
    Tcp,
    /// UDP in the LEAP chunk format.
    Udp,
    /// XDP program steering chunks into AF_XDP sockets.
    Xdp,
    /// XDP program copying chunks into a BPF ring buffer.
    XdpRingbuf,
    /// The `leap_kmod` kernel module (`/dev/leap_tensor`).
    Kmod,
}

impl TransportKind {
    /// Every kind, in the order of the docs.
    pub const ALL: [TransportKind; 5] = [Self::Tcp, Self::Udp, Self::Xdp, Self::XdpRingbuf, Self::Kmod];

    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Xdp => "xdp",
            Self::XdpRingbuf => "xdp-ringbuf",
            Self::Kmod => "kmod",
        }
    }

    /// Whether frames travel as LEAP chunks (and so can be lost).
    pub fn is_datagram(self) -> bool {
        self != Self::Tcp
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TransportKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown transport `{s}`; choose one of: {}", names.join(", "))
        })
    }
}

/// Where a node sits in the ring.
#[derive(Clone, Debug)]
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

/// How to open a backend.
#[derive(Clone, Debug)]
pub struct Options {
    /// Frame size (TCP raw framing needs it; datagram backends size buffers).
    pub frame_len: usize,
    /// Receive deadline.
    pub recv_timeout: Option<Duration>,
    /// Time allowed to connect (TCP).
    pub setup_timeout: Duration,
    /// TCP wire framing.
    pub tcp_framing: TcpFraming,
    /// Send chunks with `reserved = 0` like the original.
    pub original_compat: bool,
    /// Spin on non-blocking receives this long before sleeping.
    pub spin: Duration,
    /// XDP object to load instead of the embedded one.
    pub xdp_object: Option<PathBuf>,
    /// XDP attach mode: `auto`, `drv` or `skb`.
    pub xdp_mode: String,
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
    pub reliability: super::datagram::Reliability,
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
}

impl Default for Options {
    fn default() -> Self {
        Self {
            frame_len: 16392,
            recv_timeout: Some(Duration::from_secs(1)),
            setup_timeout: Duration::from_secs(30),
            tcp_framing: TcpFraming::Raw,
            original_compat: false,
            spin: Duration::ZERO,
            xdp_object: None,
            xdp_mode: "auto".into(),
            xdp_queues: None,
            xdp_vlans: Vec::new(),
            xdp_pin: false,
            reliability: super::datagram::Reliability::Reliable,
            gso: true,
            crc: true,
            cpus: Vec::new(),
            inflight: 1,
            window: None,
            keep_frames: None,
            window_memory: crate::frame::window::DEFAULT_WINDOW_MEMORY,
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

/// Opens a backend of `kind` for `ep`.
///
/// # Errors
///
/// What the backend reports, or [`super::TransportError::Unsupported`] for a
/// backend this build does not have.
pub fn open(kind: TransportKind, ep: &Endpoint, opts: &Options) -> Result<Box<dyn Transport>> {
    match kind {
        TransportKind::Tcp => {
            let mut c = TcpConfig::new(ep.listen, ep.next, opts.frame_len);
            c.prev = ep.prev.map(|a| a.ip());
            c.framing = opts.tcp_framing;
            c.recv_timeout = opts.recv_timeout;
            c.setup_timeout = opts.setup_timeout;
            Ok(Box::new(TcpTransport::connect(c)?))
        }
        TransportKind::Udp => Ok(Box::new(UdpTransport::bind(udp_config(ep, opts))?)),
        TransportKind::Xdp => Ok(Box::new(super::xdp::open_endpoint(super::xdp::Delivery::Xsk, ep, opts)?)),
        TransportKind::XdpRingbuf => Ok(Box::new(super::xdp::open_endpoint(super::xdp::Delivery::RingBuf, ep, opts)?)),
        TransportKind::Kmod => Ok(Box::new(super::kmod::open_endpoint(ep, opts)?)),
    }
}
