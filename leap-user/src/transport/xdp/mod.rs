//! The XDP fast path: the `leap-ebpf` program picks LEAP chunks off the NIC
//! before the kernel's UDP stack and hands them to user space through an
//! AF_XDP socket per receive queue (`xdp`) or a BPF ring buffer
//! (`xdp-ringbuf`). Chunks feed the shared [`Reassembler`]; frames leave
//! through the UDP backend's sending path (GSO / `sendmmsg`).
//!
//! ```no_run
//! use leap::transport::Transport;
//! use leap::transport::udp::UdpConfig;
//! use leap::transport::xdp::{Delivery, XdpTransport, XdpTransportConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let udp = UdpConfig::new("10.0.0.1:9999".parse()?, "10.0.0.2:9999".parse()?);
//! let mut t = XdpTransport::open(XdpTransportConfig::new("veth0", udp, Delivery::Xsk))?;
//! let mut buf = vec![0u8; 16392];
//! let got = t.recv_prev(&mut buf)?;
//! # let _ = got; Ok(()) }
//! ```

mod counters;
mod error;
pub mod object;
pub mod packet;
pub mod program;
mod ringbuf;
mod sys;
pub mod xsk;

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, ChunkHeader, ChunkKind, flags};
use leap_common::xdp::{self as map, PeerRule, RingRecord, cfg};
use socket2::Socket;

pub use self::counters::XdpCounters;
pub use self::error::XdpError;
pub use self::object::ObjectSource;
pub use self::program::{AttachMode, AttachedMode, PinnedProgram, XdpProgram};
pub use self::ringbuf::RingReader;
pub use self::xsk::{XskConfig, XskSocket, ZeroCopy};
use super::udp::{UdpConfig, UdpSender, bind_socket};
use super::{FrameKind, Received, Result, Stats, Transport, TransportError};
use crate::frame::{Push, Reassembler};
use crate::sys::udp::RxBatch;

/// How chunks reach user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Delivery {
    /// Redirected into AF_XDP sockets (`--transport xdp`).
    Xsk,
    /// Copied into a BPF ring buffer (`--transport xdp-ringbuf`).
    RingBuf,
}

impl Delivery {
    /// The transport name.
    pub fn transport_name(self) -> &'static str {
        match self {
            Self::Xsk => "xdp",
            Self::RingBuf => "xdp-ringbuf",
        }
    }

    fn config_value(self) -> u32 {
        match self {
            Self::Xsk => map::delivery::XSK,
            Self::RingBuf => map::delivery::RING_BUF,
        }
    }
}

/// Settings of an [`XdpTransport`].
#[derive(Clone, Debug)]
pub struct XdpTransportConfig {
    /// Addresses, deadlines, frame limit and sending options, as for UDP.
    /// `udp.prev`, when set, turns the program's peer filter on.
    pub udp: UdpConfig,
    /// Interface to attach to (the one chunks arrive on).
    pub iface: String,
    /// AF_XDP or ring buffer.
    pub delivery: Delivery,
    /// Native, generic or either.
    pub mode: AttachMode,
    /// Which object to load.
    pub object: ObjectSource,
    /// Receive queues to bind AF_XDP sockets to.
    pub queues: Vec<u32>,
    /// AF_XDP socket settings.
    pub xsk: XskConfig,
    /// Where NACKs come from (the next node's sending address); defaults to
    /// `udp.next`. Only used with the peer filter.
    pub nack_from: Option<SocketAddr>,
    /// Ring-buffer mode: wake the reader every this many records (and at
    /// the end of every frame).
    pub wakeup_every: u32,
    /// Drop malformed and wrong-source chunks in the program instead of
    /// passing them to the kernel.
    pub drop_rejected: bool,
    /// aya-log debug events from the program.
    pub log: bool,
    /// Pin the program and its maps under `/sys/fs/bpf/leap/<iface>/`
    /// while the transport lives, for `leap xdp status|stats`.
    pub pin: bool,
}

impl XdpTransportConfig {
    /// Defaults: auto mode, queue 0, embedded object, rejected chunks dropped.
    pub fn new(iface: &str, udp: UdpConfig, delivery: Delivery) -> Self {
        Self {
            udp,
            iface: iface.to_string(),
            delivery,
            mode: AttachMode::Auto,
            object: ObjectSource::Default,
            queues: vec![0],
            xsk: XskConfig::default(),
            nack_from: None,
            wakeup_every: 32,
            drop_rejected: true,
            log: false,
            pin: false,
        }
    }
}

/// Opens the XDP backend for a ring endpoint (`leap ring --transport
/// xdp|xdp-ringbuf`): attaches to `ep.iface` and listens on `ep.listen`.
///
/// # Errors
///
/// [`XdpError::Config`] without an interface or with an unknown mode, else
/// as [`XdpTransport::open`].
pub fn open_endpoint(
    delivery: Delivery,
    ep: &super::open::Endpoint,
    opts: &super::open::Options,
) -> Result<XdpTransport> {
    let iface = ep.iface.as_deref().ok_or_else(|| {
        XdpError::Config(format!("--transport {} needs the interface frames arrive on", delivery.transport_name()))
    })?;
    let mode = <AttachMode as clap::ValueEnum>::from_str(&opts.xdp_mode, true)
        .map_err(|_| XdpError::Config(format!("unknown XDP mode {:?}: auto, drv or skb", opts.xdp_mode)))?;
    let mut cfg = XdpTransportConfig::new(iface, super::open::udp_config(ep, opts), delivery);
    cfg.mode = mode;
    cfg.object = ObjectSource::from_option(opts.xdp_object.clone());
    XdpTransport::open(cfg)
}

enum Rx {
    Xsk(Vec<XskSocket>),
    Ring(RingReader),
}

/// Chunks taken from the receive path per batch.
const BATCH: u32 = 64;
/// Longest sleep between deadline checks.
const WAKE_TICK: Duration = Duration::from_millis(20);

/// The XDP transport: receive through the XDP program, send through UDP.
pub struct XdpTransport {
    // Pins first, then the sockets (their XSKMAP entries go with them),
    // then the program.
    _pins: Option<program::MapPins>,
    rx: Rx,
    program: XdpProgram,
    socket: Socket,
    sender: UdpSender,
    reasm: Reassembler,
    cfg: XdpTransportConfig,
    mode: AttachedMode,
    stats: Stats,
    zero_copy: bool,
    /// Datagrams that reached the UDP socket instead (a queue without an
    /// AF_XDP socket, NACKs arriving on another interface, ...).
    kernel_rx: RxBatch,
    /// `poll` saw the UDP socket readable.
    kernel_ready: bool,
    /// Chunks taken from the UDP socket.
    via_kernel: u64,
}

impl std::fmt::Debug for XdpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpTransport")
            .field("iface", &self.cfg.iface)
            .field("delivery", &self.cfg.delivery)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl XdpTransport {
    /// Binds the UDP socket, loads and configures the program, opens the
    /// AF_XDP sockets (or the ring-buffer reader) and attaches.
    ///
    /// AF_XDP sockets are created in the calling thread's network
    /// namespace, which must be the interface's.
    ///
    /// # Errors
    ///
    /// [`XdpError`] for anything XDP, wrapped in [`TransportError::Backend`];
    /// the UDP socket's errors likewise.
    pub fn open(cfg: XdpTransportConfig) -> Result<Self> {
        let udp = &cfg.udp;
        if udp.max_frame_len == 0 || udp.max_frame_len > leap_common::chunk::FRAME_LEN_MAX {
            return Err(XdpError::Config(format!("max frame length {} out of range", udp.max_frame_len)).into());
        }
        if cfg.queues.is_empty() || cfg.queues.len() > 8 {
            return Err(XdpError::Config("between 1 and 8 receive queues".into()).into());
        }
        let socket = bind_socket(udp.listen)?;
        let port = udp.listen.port();
        let mut program = match cfg.delivery {
            Delivery::Xsk => XdpProgram::load(&cfg.object)?,
            Delivery::RingBuf => XdpProgram::load_multi_buffer(&cfg.object)?,
        };
        program.add_port(port)?;
        let mut flags = if cfg.drop_rejected { cfg::DROP_REJECTED } else { 0 };
        if let Some(prev) = udp.prev {
            flags |= cfg::PEER_FILTER;
            program.allow_peer(prev, port, PeerRule::allow(&[ChunkKind::Data, ChunkKind::Control]))?;
            program.allow_peer(cfg.nack_from.unwrap_or(udp.next), port, PeerRule::allow(&[ChunkKind::Nack]))?;
        }
        if cfg.log {
            flags |= cfg::LOG;
            program.enable_log()?;
        }
        let rx = match cfg.delivery {
            Delivery::Xsk => {
                let mut socks = Vec::with_capacity(cfg.queues.len());
                for &q in &cfg.queues {
                    let s = XskSocket::open(&cfg.iface, q, &cfg.xsk)?;
                    program.register_xsk(q, s.fd())?;
                    socks.push(s);
                }
                Rx::Xsk(socks)
            }
            Delivery::RingBuf => Rx::Ring(RingReader::new(program.take_ring_buf()?)),
        };
        let zero_copy = matches!(&rx, Rx::Xsk(s) if s.iter().all(XskSocket::zero_copy));
        program.configure(&map::XdpConfig {
            delivery: cfg.delivery.config_value(),
            flags,
            wakeup_every: cfg.wakeup_every,
            _reserved: 0,
        })?;
        let mode = program.attach(&cfg.iface, cfg.mode)?;
        let pins = if cfg.pin { Some(program.pin_running()?) } else { None };
        // A receiver in generic mode sees GSO super-packets whole and cannot
        // hand them to AF_XDP; every node of a ring runs the same mode, so
        // segment in software unless attached natively.
        let gso = udp.gso && mode == AttachedMode::Drv;
        let reserved = if udp.original_compat { 0 } else { flags::LEAP };
        let sender = UdpSender::new(&socket, udp.next, gso, reserved);
        log::debug!(
            "{} on {}: {} mode, {}, GSO {}",
            cfg.delivery.transport_name(),
            cfg.iface,
            mode,
            if zero_copy { "zero-copy" } else { "copy" },
            sender.gso()
        );
        Ok(Self {
            _pins: pins,
            rx,
            program,
            socket,
            sender,
            reasm: Reassembler::with_window(udp.max_frame_len, udp.window),
            mode,
            stats: Stats::default(),
            zero_copy,
            kernel_rx: RxBatch::new(16, CHUNK_DATAGRAM_MAX + 1),
            kernel_ready: false,
            via_kernel: 0,
            cfg,
        })
    }

    /// How the program is attached.
    pub fn attached_mode(&self) -> AttachedMode {
        self.mode
    }

    /// Whether every AF_XDP socket runs zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The program's counters.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`].
    pub fn xdp_counters(&self) -> Result<XdpCounters, XdpError> {
        self.program.counters()
    }

    /// The UDP socket frames leave from.
    pub fn send_socket(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// The program, e.g. to change its peer rules while running.
    pub fn program_mut(&mut self) -> &mut XdpProgram {
        &mut self.program
    }

    /// Chunks that arrived through the kernel's UDP socket rather than
    /// through XDP (the program passed them: no AF_XDP socket at their
    /// queue, or they came in on another interface).
    pub fn chunks_via_kernel(&self) -> u64 {
        self.via_kernel
    }

    /// Takes whatever the receive path holds; returns a complete frame as
    /// soon as one is (later chunks of the batch are stashed).
    fn drain(&mut self, out: &mut [u8]) -> Option<Received> {
        let Self { rx, reasm, stats, cfg, socket, kernel_rx, kernel_ready, via_kernel, .. } = self;
        let port = cfg.udp.listen.port();
        let prev = cfg.udp.prev;
        let nack_from = cfg.nack_from.unwrap_or(cfg.udp.next);
        let mut done = None;
        let mut take = |src: SocketAddr, datagram: &[u8]| {
            let (hdr, payload) = match ChunkHeader::parse_data(datagram) {
                Ok(x) => x,
                Err(e) => {
                    reasm.drops_mut().count_parse(e);
                    return;
                }
            };
            // The program filters too; this keeps user space honest if the
            // maps were changed behind its back.
            let allowed = if hdr.kind() == ChunkKind::Nack { nack_from } else { prev.unwrap_or(src) };
            if prev.is_some() && src != allowed {
                reasm.drops_mut().wrong_source += 1;
                return;
            }
            if hdr.kind() == ChunkKind::Nack {
                stats.nacks_received += 1;
                return;
            }
            let r = if done.is_some() { reasm.stash(&hdr, payload) } else { reasm.push(&hdr, payload, out) };
            if r != Push::Dropped {
                stats.chunks_received += 1;
            }
            if let Push::Complete(got) = r {
                done = Some(got);
            }
        };
        let mut foreign = 0u64;
        match rx {
            Rx::Xsk(socks) => {
                for s in socks {
                    s.recv(BATCH, |frame| match packet::parse_udp(frame) {
                        Some(d) if d.dst_port == port => take(d.src, d.payload),
                        _ => foreign += 1,
                    });
                }
            }
            Rx::Ring(ring) => {
                ring.recv(BATCH as usize, |rec: &RingRecord| match rec.datagram() {
                    Some(d) if rec.dst_port == port => take(rec.source(), d),
                    _ => foreign += 1,
                });
            }
        }
        let mut truncated = 0u64;
        if std::mem::take(kernel_ready) {
            match kernel_rx.recv(socket.as_fd(), false) {
                Ok(_) => {
                    for i in 0..kernel_rx.len() {
                        let (bytes, meta, src) = kernel_rx.get(i);
                        match src {
                            Some(src) if !meta.truncated => {
                                *via_kernel += 1;
                                take(src, bytes);
                            }
                            _ => truncated += 1,
                        }
                    }
                }
                Err(e) => log::warn!("recvmmsg on the UDP socket: {e}"),
            }
        }
        // Not for this node's port, or not UDP: cannot happen unless the
        // maps were changed behind our back.
        stats.drops.short += foreign;
        reasm.drops_mut().oversize += truncated;
        done
    }

    /// Sleeps until the receive path or the UDP socket has data, or
    /// `timeout` passes.
    fn wait(&mut self, timeout: Duration) -> Result<()> {
        let udp = self.socket.as_fd();
        let (mask, udp_bit) = match &mut self.rx {
            Rx::Xsk(socks) => {
                if socks.iter().any(XskSocket::has_rx) {
                    return Ok(());
                }
                socks.iter_mut().for_each(XskSocket::kick);
                let n = socks.len();
                (sys::poll_readable(socks.iter().map(XskSocket::fd).chain([udp]), timeout), n)
            }
            Rx::Ring(ring) => (sys::poll_readable([ring.fd(), udp], timeout), 1),
        };
        let mask = mask.map_err(|e| TransportError::io("poll", e))?;
        self.kernel_ready = mask & (1 << udp_bit) != 0;
        Ok(())
    }

    fn delivered(&mut self, got: Received) -> Result<Received> {
        self.stats.frames_received += 1;
        self.stats.bytes_received += got.len as u64;
        Ok(got)
    }

    fn lost(&mut self) -> TransportError {
        let lost = self.reasm.abandon();
        self.stats.frames_lost += 1;
        TransportError::FrameLost { seq: lost.seq, missing: lost.missing, total: lost.total }
    }
}

impl Transport for XdpTransport {
    fn name(&self) -> &'static str {
        self.cfg.delivery.transport_name()
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        let chunks = self.sender.send(&self.socket, kind, header, payload)?;
        self.stats.frames_sent += 1;
        self.stats.chunks_sent += u64::from(chunks);
        self.stats.bytes_sent += (header.len() + payload.len()) as u64;
        Ok(())
    }

    fn recv_prev(&mut self, out: &mut [u8]) -> Result<Received> {
        if let Some(got) = self.reasm.begin(out) {
            return self.delivered(got);
        }
        let start = Instant::now();
        let deadline = self.cfg.udp.recv_timeout.map(|t| start + t);
        loop {
            if let Some(got) = self.drain(out) {
                return self.delivered(got);
            }
            if self.cfg.log {
                self.program.flush_log();
            }
            if self.reasm.is_overtaken() {
                return Err(self.lost());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.stats.timeouts += 1;
                if self.reasm.has_partial() {
                    return Err(self.lost());
                }
                self.reasm.resync_if_lost();
                self.reasm.suspend(out);
                return Err(TransportError::Timeout(self.cfg.udp.recv_timeout.unwrap_or_default()));
            }
            if now.duration_since(start) < self.cfg.udp.spin {
                std::hint::spin_loop();
                continue;
            }
            let left = deadline.map_or(WAKE_TICK, |d| d.saturating_duration_since(now).min(WAKE_TICK));
            self.wait(left.max(Duration::from_millis(1)))?;
        }
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.cfg.udp.recv_timeout = timeout;
    }

    fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.drops = *self.reasm.drops();
        s.drops.short += self.stats.drops.short;
        s
    }

    fn backend_counters(&self) -> Option<serde_json::Value> {
        let mut j = self.program.counters().ok()?.to_json();
        if let Some(o) = j.as_object_mut() {
            o.insert("chunks_via_kernel".into(), self.via_kernel.into());
        }
        Some(j)
    }
}
