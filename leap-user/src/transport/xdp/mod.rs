//! The XDP fast path: the `leap-ebpf` program picks LEAP chunks off the NIC
//! before the kernel's UDP stack and hands them to user space through an
//! AF_XDP socket per receive queue (`xdp`) or a BPF ring buffer
//! (`xdp-ringbuf`). Whatever the program passes to the kernel instead (a
//! queue without a socket, NACKs arriving on another interface) is read from
//! the node's UDP socket. Every chunk feeds the shared [`DatagramLink`]
//! (the I/O around the link that decides reassembly and loss recovery),
//! and frames leave through its UDP sending path (GSO / `sendmmsg`).
//!
//! Only what the kernel would accept reaches reassembly: the program drops
//! chunks to another host's MAC or address, on a VLAN the node was not
//! given, from a v4-mapped IPv6 source, or with a bad IPv4 header checksum
//! (counted in its counters); user space checks every frame and record
//! again and verifies the UDP checksum ([`packet`], counted in the drops).
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
use crate::sys::xdp as sys;
use crate::transport::SyscallError;
pub use sys::{ETH_FLAG_RXVLAN, ETH_FLAG_TXVLAN, if_offload_flags, netns_socket, set_if_offload_flags};
pub mod xsk;

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, ChunkKind, TRAIN_DATAGRAM_MAX};
use leap_common::xdp::{self as map, Counter, PeerRule, RingRecord, cfg};

pub use self::counters::{CounterReader, XdpCounters};
pub use self::error::{XdpError, check_queues, check_vlan};
pub use self::object::ObjectSource;
pub use self::packet::{Reject, RxFilter};
pub use self::program::{AttachMode, AttachedMode, PinnedProgram, ProgramKind, XdpProgram};
pub use self::ringbuf::{Piece, RingReader, TrainGather};
pub use self::xsk::{XskConfig, XskSocket, ZeroCopy};
use super::config::UdpConfig;
use super::datagram::{DatagramLink, RxPath};
use super::halves::{DatagramCore, DatagramReceiver, DatagramSender};
use super::udp::bind_socket;
use super::{BackendCounters, FrameKind, Halves, Lent, Received, Result, Stats, Transport, TransportError};
use crate::sys::udp::RxBatch;

/// How chunks reach user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
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

/// Whether a UDP checksum field holding only the pseudo-header sum (what a
/// `CHECKSUM_PARTIAL` sender leaves there) is accepted; see [`packet`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartialChecksums {
    /// Accepted on veth, whose peer hands over what its sender wrote, and
    /// refused on every other driver, where a correct sender's packet
    /// carries a complete checksum.
    #[default]
    Auto,
    /// Always accepted.
    Accept,
    /// Always refused.
    Refuse,
}

/// Settings of an [`XdpTransport`].
#[derive(Clone, Debug)]
#[non_exhaustive]
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
    /// Bytes of the BPF ring buffer (ring-buffer mode; a power of two of
    /// at least a page). `None`: the object's own size.
    pub ring_bytes: Option<u32>,
    /// Ring-buffer mode: wake the reader every this many records per CPU,
    /// besides the end of every frame and every loss-recovery chunk. Each
    /// wake-up costs an interrupt, so only large frames, which would fill
    /// the ring before their end, need more than those. 0 or 1: every
    /// record.
    pub wakeup_every: u32,
    /// Drop malformed and wrong-source chunks in the program instead of
    /// passing them to the kernel.
    pub drop_rejected: bool,
    /// aya-log debug events from the program: loads its variant with the
    /// events, which kernels before 6.17 take only with `CAP_PERFMON`
    /// (without it, the program without them, saying so once).
    pub log: bool,
    /// Pin the program and its maps under `/sys/fs/bpf/leap/<iface>/`
    /// while the transport lives, for `leap xdp status|stats`.
    pub pin: bool,
    /// VLAN IDs a tagged chunk may carry (the interface's VLANs, when the
    /// program sits on their parent). Empty: untagged chunks only.
    pub vlans: Vec<u16>,
    /// Partial UDP checksums.
    pub partial_checksums: PartialChecksums,
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
            ring_bytes: None,
            wakeup_every: 256,
            drop_rejected: true,
            log: false,
            pin: false,
            vlans: Vec::new(),
            partial_checksums: PartialChecksums::Auto,
        }
    }
}

/// Opens the XDP backend for a ring endpoint (`leap ring --transport
/// xdp|xdp-ringbuf`): attaches to `ep.iface` and listens on `ep.listen`.
///
/// # Errors
///
/// [`XdpError::NeedsInterface`] without an interface, else
/// as [`XdpTransport::open`].
pub fn open_endpoint(
    delivery: Delivery,
    ep: &super::config::Endpoint,
    opts: &super::config::Options,
) -> Result<XdpTransport> {
    let iface = ep.iface.as_deref().ok_or(XdpError::NeedsInterface { transport: delivery.transport_name() })?;
    let mut cfg = XdpTransportConfig::new(iface, super::config::udp_config(ep, opts), delivery);
    cfg.mode = opts.xdp_mode;
    cfg.object = ObjectSource::from_option(opts.xdp_object.clone());
    cfg.pin = opts.xdp_pin;
    cfg.vlans = opts.xdp_vlans.clone();
    cfg.queues = match &opts.xdp_queues {
        Some(q) => q.clone(),
        None => (0..rx_queue_count(iface).min(map::MAX_QUEUES)).collect(),
    };
    (cfg.xsk, cfg.ring_bytes) = buffers_for(opts.frame_len, opts.inflight);
    cfg.xsk = per_queue(cfg.xsk, cfg.queues.len());
    log::info!("{iface}: AF_XDP sockets on receive queue(s) {:?}", cfg.queues);
    XdpTransport::open(cfg)
}

/// Frames a receiver buffers before its reader catches up, at least.
const BUFFERED_FRAMES: usize = 8;

/// AF_XDP ring and UMEM sizes and ring-buffer bytes that hold every one of
/// `inflight` frames of `frame_len` bytes (at least [`BUFFERED_FRAMES`]),
/// within bounds (at most 8192 ring entries, a 32 MiB UMEM per socket, a
/// 32 MiB ring buffer). With the defaults alone, several megabyte frames in
/// flight overflowed the rings, and every overflow came back as
/// retransmissions.
pub fn buffers_for(frame_len: usize, inflight: usize) -> (XskConfig, Option<u32>) {
    let frames = inflight.max(BUFFERED_FRAMES);
    let chunks = frame_len.div_ceil(leap_common::chunk::CHUNK_PAYLOAD_MAX).max(1) * frames;
    let mut xsk = XskConfig::default();
    let ring = (chunks.next_power_of_two() as u32).clamp(xsk.ring_size, 8192);
    xsk.ring_size = ring;
    xsk.frames = xsk.frames.max(2 * ring);
    let record = size_of::<leap_common::xdp::RingRecord>() + 8;
    let bytes = ((chunks * record).next_power_of_two() as u32).clamp(leap_common::xdp::RING_BYTES, 32 << 20);
    (xsk, Some(bytes))
}

/// UMEM frames each AF_XDP socket keeps at least when several share the
/// work: 1024 frames of 2 KiB (2 MiB, 512 ring entries).
const QUEUE_FRAMES_MIN: u32 = 1024;

/// Splits one socket's AF_XDP sizes ([`buffers_for`]) over `queues`
/// sockets: each gets its share of the frames, at least
/// [`QUEUE_FRAMES_MIN`], with rings of half its frames. One LEAP link is
/// one UDP flow, which RSS puts on one queue, so the sockets of the other
/// queues mostly idle: a full UMEM each (8 MiB by default) would lock
/// 512 MiB on a 64-queue NIC, the split locks at most 128 MiB there
/// (8 MiB up to 4 queues).
pub fn per_queue(xsk: XskConfig, queues: usize) -> XskConfig {
    let n = u32::try_from(queues.max(1)).unwrap_or(u32::MAX);
    if n == 1 {
        return xsk;
    }
    let frames = (xsk.frames / n).max(QUEUE_FRAMES_MIN).next_power_of_two().min(xsk.frames);
    XskConfig { frames, ring_size: xsk.ring_size.min(frames / 2).max(1), ..xsk }
}

/// Receive queues of an interface in the calling thread's network
/// namespace (`ETHTOOL_GCHANNELS`; else `/sys/class/net/IF/queues/rx-*`,
/// which shows sysfs's namespace), at least 1.
pub fn rx_queue_count(iface: &str) -> u32 {
    if let Ok(n) = sys::if_rx_queues(iface)
        && n > 0
    {
        return n;
    }
    std::fs::read_dir(std::path::Path::new("/sys/class/net").join(iface).join("queues"))
        .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with("rx-")).count() as u32)
        .unwrap_or(1)
        .max(1)
}

/// What the node accepts, as its kernel would: the interface's MAC, the
/// listening address (every address of the namespace when it listens on
/// the wildcard), the configured VLANs, and partial checksums on veth.
///
/// # Errors
///
/// As [`host_filter_for`].
pub fn host_filter(cfg: &XdpTransportConfig) -> Result<RxFilter, XdpError> {
    host_filter_for(&cfg.iface, Some(cfg.udp.listen.ip()), &cfg.vlans, cfg.partial_checksums)
}

/// What a socket bound to `listen` on a host whose chunks arrive on
/// `iface` accepts: `iface`'s MAC, `listen` (or, for a wildcard address or
/// `None`, every address of the current network namespace of its family;
/// both families for `None` and `::`), the VLANs `vlans`, and partial UDP
/// checksums as `partial` says. Loopback addresses (`127.0.0.0/8`, `::1`)
/// count only when `iface` is a loopback interface: the kernel drops a
/// packet to one that arrives on any other ("martian destination"). Logs
/// what it chose, once.
///
/// # Errors
///
/// [`XdpError::Syscall`] when the interface's MAC or the host's addresses
/// cannot be read, [`XdpError::TooManyLocalAddrs`] or [`XdpError::TooManyVlans`] for more than
/// the program's maps hold, [`XdpError::BadVlan`] for a VLAN ID beyond 4095.
pub fn host_filter_for(
    iface: &str,
    listen: Option<std::net::IpAddr>,
    vlans: &[u16],
    partial: PartialChecksums,
) -> Result<RxFilter, XdpError> {
    let mac =
        sys::if_hwaddr(iface).map_err(|source| XdpError::Syscall(SyscallError::new("ioctl(SIOCGIFHWADDR)", source)))?;
    let on_loopback =
        sys::if_is_loopback(iface).map_err(|source| XdpError::Syscall(SyscallError::new("getifaddrs", source)))?;
    let local: Vec<std::net::IpAddr> = match listen {
        Some(ip) if !ip.is_unspecified() => vec![ip],
        _ => {
            let all = sys::host_addrs().map_err(|source| XdpError::Syscall(SyscallError::new("getifaddrs", source)))?;
            // A wildcard IPv4 socket takes IPv4 only; a wildcard IPv6 one both.
            all.into_iter().filter(|a| !listen.is_some_and(|l| l.is_ipv4()) || a.is_ipv4()).collect()
        }
    };
    let local: Vec<_> = local.into_iter().filter(|a| on_loopback || !a.is_loopback()).collect();
    if local.len() > map::MAX_LOCAL_ADDRS as usize {
        return Err(XdpError::TooManyLocalAddrs { found: local.len(), max: map::MAX_LOCAL_ADDRS });
    }
    if vlans.len() > map::MAX_VLANS as usize {
        return Err(XdpError::TooManyVlans { found: vlans.len(), max: map::MAX_VLANS });
    }
    vlans.iter().try_for_each(|&v| error::check_vlan(v))?;
    let driver = sys::if_driver(iface).unwrap_or_else(|e| {
        log::debug!("{iface}: no driver name ({e})");
        String::new()
    });
    let partial_checksums = match partial {
        PartialChecksums::Auto => driver == "veth",
        PartialChecksums::Accept => true,
        PartialChecksums::Refuse => false,
    };
    log::info!(
        "{iface}: XDP takes chunks to {} at {:?}, VLANs {:?}; partial UDP checksums {} (driver {driver:?})",
        mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"),
        local,
        vlans,
        if partial_checksums { "accepted" } else { "refused" },
    );
    Ok(RxFilter { mac: Some(mac), local: Some(local), vlans: vlans.to_vec(), partial_checksums })
}

enum Rx {
    Xsk(Vec<XskSocket>),
    Ring(RingReader),
}

/// UDP payload bytes the linear program takes in one buffer in native mode:
/// a page, less XDP's headroom, the `skb_shared_info` tail and the headers.
const LINEAR_PAYLOAD_MAX: usize = 4096 - 256 - 320 - 66;

/// Whole chunks of a train of at most `bytes` (at least one).
fn train_bytes(bytes: usize) -> usize {
    leap_common::chunk::train_chunks_for(bytes) * CHUNK_DATAGRAM_MAX
}

/// Chunks taken from the receive path per batch.
const BATCH: u32 = 64;
/// Without sleeping, look at the UDP socket every this many pumps.
const KERNEL_EVERY: u32 = 16;

/// The XDP transport: chunks arrive through the XDP program (AF_XDP or ring
/// buffer) and, for whatever the program passes, through the UDP socket;
/// sending, reassembly and loss recovery are the shared [`DatagramLink`].
pub struct XdpTransport {
    // Pins first, then the sockets (their XSKMAP entries go with them, in
    // the core's receive path; the driver thread is joined first), then the
    // program.
    _pins: Option<program::MapPins>,
    core: DatagramCore<XdpRx>,
    program: XdpProgram,
    /// What user space checks every chunk against.
    filter: RxFilter,
    cfg: XdpTransportConfig,
    mode: AttachedMode,
    zero_copy: bool,
    /// Chunks taken from the UDP socket.
    via_kernel: Arc<AtomicU64>,
    /// Warnings about chunks on queues without a socket (at most 1).
    no_socket_warnings: Arc<AtomicU64>,
    /// See [`Self::rx_train_bytes`].
    rx_train_bytes: usize,
}

/// The XDP transport's receive path: the AF_XDP sockets or the ring buffer,
/// and the UDP socket for what the program passes.
pub struct XdpRx {
    rx: Rx,
    socket: Arc<socket2::Socket>,
    filter: RxFilter,
    port: u16,
    /// Datagrams that reached the UDP socket instead (a queue without an
    /// AF_XDP socket, NACKs arriving on another interface, ...).
    kernel_rx: RxBatch,
    /// Pumps since the UDP socket was last read.
    kernel_age: u32,
    /// Whether the last wait saw the UDP socket readable.
    udp_ready: bool,
    /// Busy polling asked for: drive the AF_XDP queues while spinning.
    busy_poll: bool,
    via_kernel: Arc<AtomicU64>,
    /// Watches for chunks on queues without a socket (AF_XDP only).
    watch: Option<QueueWatch>,
    /// Ring-buffer mode: the records of chunk trains, put back together.
    trains: TrainGather,
}

/// How often the receive path looks at the program's `no_socket` counter.
const NO_SOCKET_CHECK: Duration = Duration::from_secs(1);

/// Warns once when LEAP chunks arrive on a receive queue without an
/// AF_XDP socket: the program passes them to the kernel, and they reach
/// the node through its UDP socket, the slow way. Looks at most every
/// [`NO_SOCKET_CHECK`], from the receive path (whichever thread drains).
struct QueueWatch {
    counters: CounterReader,
    next: Instant,
    seen: u64,
    warnings: Arc<AtomicU64>,
    iface: String,
    queues: Vec<u32>,
    port: u16,
    v6: bool,
}

impl QueueWatch {
    fn check(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        self.next = now + NO_SOCKET_CHECK;
        let Some(n) = self.counters.get(Counter::NoSocket) else { return };
        if n > self.seen && self.warnings.load(Ordering::Relaxed) == 0 {
            self.warnings.store(1, Ordering::Relaxed);
            let (iface, port, q) = (&self.iface, self.port, self.queues[0]);
            let flow = if self.v6 { "udp6" } else { "udp4" };
            log::warn!(
                "{iface}: {} LEAP chunks arrived on receive queues without an AF_XDP socket (bound: {:?}) and \
                 took the kernel's slower path; bind every queue (--xdp-queues all, the default) or steer LEAP \
                 traffic to a bound queue: ethtool -N {iface} flow-type {flow} dst-port {port} action {q}",
                n - self.seen,
                self.queues
            );
        }
        self.seen = n;
    }
}

impl std::fmt::Debug for XdpRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpRx").field("port", &self.port).finish_non_exhaustive()
    }
}

/// An [`XdpTransport`] driven by tokio.
#[cfg(feature = "tokio")]
pub type AsyncXdp = super::asyncio::AsyncDatagram<XdpRx>;

/// The sending half of a split [`XdpTransport`].
pub type XdpSendHalf = DatagramSender<XdpRx>;
/// The receiving half of a split [`XdpTransport`]; the program stays
/// attached while it lives.
pub type XdpRecvHalf = DatagramReceiver<XdpRx>;

impl RxPath for XdpRx {
    fn wait(&mut self, wait: Duration) -> io::Result<()> {
        self.udp_ready = wait_any(&mut self.rx, self.socket.as_fd(), wait)?;
        Ok(())
    }

    fn ready_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        let udp = self.socket.as_fd();
        match &self.rx {
            Rx::Xsk(socks) => sys::epoll_set(socks.iter().map(XskSocket::fd).chain([udp])),
            Rx::Ring(ring) => sys::epoll_set([ring.fd(), udp]),
        }
    }

    fn prepare_wait(&mut self) {
        if let Rx::Xsk(socks) = &mut self.rx {
            socks.iter_mut().for_each(XskSocket::kick);
        }
        // The UDP socket may hold what the program passed: read it next time.
        self.udp_ready = true;
    }

    fn drain(&mut self, link: &mut DatagramLink, mut out: Option<&mut [u8]>) -> io::Result<()> {
        let Self { rx, socket, filter, port, kernel_rx, kernel_age, udp_ready, busy_poll, via_kernel, watch, trains } =
            self;
        let port = *port;
        let mut foreign = 0u64;
        // Hellos come through the UDP socket, chunks through XDP: until the
        // previous node is proven, read the socket first, so that its
        // proof (sent before its first frame) is taken before the chunks
        // that rely on it. Taken after them, its first frame would be read
        // as the original's (its CRC trailer taken for data, the frame too
        // long) and fetched again.
        if !link.prev_is_leap() {
            *kernel_age = 0;
            *udp_ready = false;
            kernel_rx.recv(socket.as_fd(), false)?;
            via_kernel.fetch_add(link.take_batch(kernel_rx, false, out.as_deref_mut()), Ordering::Relaxed);
        }
        match rx {
            Rx::Xsk(socks) => {
                for s in socks.iter_mut() {
                    // Spinning with busy polling: an empty ring gets one
                    // NAPI round before it is looked at (bounded by the
                    // spin, see `DatagramLink::recv_poll`).
                    if *busy_poll && !s.has_rx() {
                        s.busy_poll();
                    }
                    s.recv(BATCH, |frame| match filter.admit_frame(frame) {
                        // The UDP checksum covered the whole datagram; now
                        // its chunks, one by one.
                        Ok(d) if d.dst_port() == port => {
                            link.train(Some(d.src), d.payload, out.as_deref_mut());
                        }
                        Ok(_) => foreign += 1,
                        Err(r) => r.count(link.drops_mut()),
                    });
                    // Multi-buffer packets too long for any train, or that
                    // never ended.
                    for _ in 0..s.take_dropped_packets() {
                        link.count_oversize();
                    }
                }
            }
            Rx::Ring(ring) => {
                ring.recv(BATCH as usize, |rec: &RingRecord| match trains.push(rec) {
                    Piece::Whole => match filter.admit_record(rec) {
                        Ok((src, d)) if rec.dst_port == port => {
                            link.train(Some(src), d, out.as_deref_mut());
                        }
                        Ok(_) => foreign += 1,
                        Err(r) => r.count(link.drops_mut()),
                    },
                    Piece::Pending => {}
                    // The UDP checksum covers the whole train: check it,
                    // then take the chunks one by one.
                    Piece::Complete(first, d) => match filter.admit_payload(first, d) {
                        Ok(src) if first.dst_port == port => {
                            link.train(Some(src), d, out.as_deref_mut());
                        }
                        Ok(_) => foreign += 1,
                        Err(r) => r.count(link.drops_mut()),
                    },
                    Piece::Broken => Reject::NotUdp.count(link.drops_mut()),
                });
            }
        }
        // Not for this node's port: cannot happen unless the maps were
        // changed behind our back.
        if foreign > 0 {
            link.count_foreign(foreign);
        }
        if let Some(w) = watch {
            w.check(Instant::now());
        }
        *kernel_age += 1;
        if std::mem::take(udp_ready) || *kernel_age >= KERNEL_EVERY {
            *kernel_age = 0;
            kernel_rx.recv(socket.as_fd(), false)?;
            // The socket has no UDP_GRO, but a datagram may be a chunk train
            // (one the ring buffer had no room for, or from a node sending
            // trains to a queue without an AF_XDP socket).
            via_kernel.fetch_add(link.take_batch(kernel_rx, false, out), Ordering::Relaxed);
        }
        Ok(())
    }
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
    /// [`XdpError`] for anything XDP, wrapped in [`super::TransportError::Xdp`];
    /// the UDP socket's errors likewise.
    pub fn open(cfg: XdpTransportConfig) -> Result<Self> {
        let udp = &cfg.udp;
        super::udp::check_max_frame_len(udp.max_frame_len)?;
        super::udp::check_key(udp)?;
        error::check_queues(&cfg.queues)?;
        let mut udp_cfg = cfg.udp.clone();
        super::udp::settle_windows(&mut udp_cfg).map_err(super::udp::UdpError::Window)?;
        let filter = host_filter(&cfg)?;
        let socket = bind_socket(udp.listen)?;
        let busy_poll = udp.busy_poll.is_some()
            && super::udp::enable_busy_poll(socket.as_fd(), udp.busy_poll, &format!("{} {}", cfg.iface, udp.listen));
        let port = udp.listen.port();
        let ring_bytes = if cfg.delivery == Delivery::RingBuf { cfg.ring_bytes } else { None };
        let mut program = XdpProgram::load_logged(&cfg.object, ring_bytes, cfg.log)?;
        program.add_port(port)?;
        program.accept_only(&filter)?;
        let mut flags = cfg::LOCAL_ONLY | if cfg.drop_rejected { cfg::DROP_REJECTED } else { 0 };
        if let Some(prev) = udp.prev {
            flags |= cfg::PEER_FILTER;
            program.allow_peer(prev, port, PeerRule::allow(&[ChunkKind::Data, ChunkKind::Control]))?;
            program.allow_peer(udp.nack_from.unwrap_or(udp.next), port, PeerRule::allow(&[ChunkKind::Nack]))?;
        }
        if cfg.log && program.logs() {
            flags |= cfg::LOG;
            program.enable_log()?;
        }
        let rx = match cfg.delivery {
            Delivery::Xsk => {
                let mut socks = Vec::with_capacity(cfg.queues.len());
                for &q in &cfg.queues {
                    let s = XskSocket::open(&cfg.iface, q, &cfg.xsk)?;
                    super::udp::enable_busy_poll(s.fd(), udp.busy_poll, &format!("{} queue {q}", cfg.iface));
                    program.register_xsk(q, s.fd())?;
                    socks.push(s);
                }
                Rx::Xsk(socks)
            }
            Delivery::RingBuf => Rx::Ring(RingReader::new(program.take_ring_buf()?)),
        };
        let zero_copy = matches!(&rx, Rx::Xsk(s) if s.iter().all(XskSocket::zero_copy));
        // The largest train this receive path takes whole, announced in
        // hellos: a ring-buffer record per chunk takes any train; an AF_XDP
        // socket without multi-buffer only what fits one UMEM frame; the
        // linear program (a kernel without multi-buffer XDP) only what fits
        // one page-sized buffer in native mode.
        let mut rx_train_bytes = match &rx {
            Rx::Ring(_) => TRAIN_DATAGRAM_MAX,
            Rx::Xsk(socks) => socks.iter().map(XskSocket::max_payload).min().unwrap_or(CHUNK_DATAGRAM_MAX),
        };
        if program.kind() == ProgramKind::Linear {
            rx_train_bytes = rx_train_bytes.min(LINEAR_PAYLOAD_MAX);
        }
        // Never more than configured.
        udp_cfg.rx_train_bytes = train_bytes(rx_train_bytes.min(udp_cfg.rx_train_bytes));
        program.configure(&map::XdpConfig {
            delivery: cfg.delivery.config_value(),
            flags,
            wakeup_every: cfg.wakeup_every,
            mac: filter.mac.unwrap_or_default(),
            ..map::XdpConfig::default()
        })?;
        let mode = program.attach(&cfg.iface, cfg.mode)?;
        // Pins let `leap xdp status|stats` see a running node; without them
        // the node still runs.
        let pins = if cfg.pin {
            program
                .pin_running()
                .map_err(|e| {
                    log::warn!("{}: cannot pin the running program ({e}); `leap xdp stats` will not see it", cfg.iface)
                })
                .ok()
        } else {
            None
        };
        // A receiver in generic mode sees GSO super-packets whole and cannot
        // hand them to XDP chunk by chunk; every node of a ring runs the same
        // mode, so segment in software unless attached natively.
        let link = DatagramLink::new(socket, udp_cfg, mode == AttachedMode::Drv);
        log::debug!(
            "{} on {}: {} ({}) in {} mode, {}, GSO {}",
            cfg.delivery.transport_name(),
            cfg.iface,
            program.kind(),
            if program.kind() == ProgramKind::Frags { "multi-buffer" } else { "linear" },
            mode,
            if zero_copy { "zero-copy" } else { "copy" },
            link.gso()
        );
        let via_kernel = Arc::new(AtomicU64::new(0));
        let no_socket_warnings = Arc::new(AtomicU64::new(0));
        let watch = match cfg.delivery {
            Delivery::Xsk => match program.counter_reader() {
                Ok(counters) => Some(QueueWatch {
                    seen: counters.get(Counter::NoSocket).unwrap_or(0),
                    counters,
                    next: Instant::now() + NO_SOCKET_CHECK,
                    warnings: Arc::clone(&no_socket_warnings),
                    iface: cfg.iface.clone(),
                    queues: cfg.queues.clone(),
                    port,
                    v6: udp.listen.is_ipv6(),
                }),
                Err(e) => {
                    log::debug!("{}: no watch on queues without a socket ({e})", cfg.iface);
                    None
                }
            },
            Delivery::RingBuf => None,
        };
        let path = XdpRx {
            rx,
            socket: link.shared_socket(),
            filter: filter.clone(),
            port,
            kernel_rx: RxBatch::new(16, TRAIN_DATAGRAM_MAX + 1),
            kernel_age: 0,
            udp_ready: false,
            busy_poll,
            via_kernel: Arc::clone(&via_kernel),
            watch,
            trains: TrainGather::default(),
        };
        let core = DatagramCore::new(link, path, cfg.delivery.transport_name(), "poll")
            .map_err(|e| TransportError::io("spawn driver", e))?;
        Ok(Self {
            _pins: pins,
            core,
            program,
            filter,
            mode,
            zero_copy,
            via_kernel,
            no_socket_warnings,
            rx_train_bytes,
            cfg,
        })
    }

    /// How the program is attached.
    pub fn attached_mode(&self) -> AttachedMode {
        self.mode
    }

    /// Which program is attached: [`ProgramKind::Frags`] unless the kernel
    /// refused multi-buffer XDP.
    pub fn program_kind(&self) -> ProgramKind {
        self.program.kind()
    }

    /// The largest chunk train (UDP payload bytes) this node's receive
    /// path takes, as announced in its hellos.
    pub fn rx_train_bytes(&self) -> usize {
        self.rx_train_bytes
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

    /// What every chunk is checked against before reassembly.
    pub fn rx_filter(&self) -> &RxFilter {
        &self.filter
    }

    /// The program, e.g. to change its peer rules while running.
    pub fn program_mut(&mut self) -> &mut XdpProgram {
        &mut self.program
    }

    /// Chunks that arrived through the kernel's UDP socket rather than
    /// through XDP (the program passed them: no AF_XDP socket at their
    /// queue, or they came in on another interface, like NACKs from the
    /// next node).
    pub fn chunks_via_kernel(&self) -> u64 {
        self.via_kernel.load(Ordering::Relaxed)
    }

    /// The receive queues with an AF_XDP socket (empty in ring-buffer mode).
    pub fn queues(&self) -> &[u32] {
        if self.cfg.delivery == Delivery::Xsk { &self.cfg.queues } else { &[] }
    }

    /// Times the receive path warned that LEAP chunks arrive on a queue
    /// without an AF_XDP socket (the program's `no_socket` grew): 0 or 1,
    /// the warning is given once.
    pub fn no_socket_warnings(&self) -> u64 {
        self.no_socket_warnings.load(Ordering::Relaxed)
    }

    /// The same transport driven by the current tokio runtime.
    ///
    /// # Errors
    ///
    /// No runtime, or registering the descriptors failed.
    #[cfg(feature = "tokio")]
    pub fn into_async(self) -> io::Result<AsyncXdp> {
        let Self { _pins, core, program, .. } = self;
        super::asyncio::AsyncDatagram::keeping(core, Some(Box::new((program, _pins))))
    }

    /// Splits into a sender and a receiver for two threads. The program
    /// stays attached until the receiver is dropped (it holds the program).
    pub fn into_halves(self) -> (XdpSendHalf, XdpRecvHalf) {
        let Self { _pins, core, program, .. } = self;
        let (s, mut r) = core.split();
        r.keep_alive(Box::new((program, _pins)));
        (s, r)
    }
}

/// Waits (up to `wait`) until the XDP receive path or the UDP socket has
/// data; returns whether the UDP socket is readable.
fn wait_any(rx: &mut Rx, udp: BorrowedFd<'_>, wait: Duration) -> io::Result<bool> {
    let (mask, udp_bit) = match rx {
        Rx::Xsk(socks) => {
            if socks.iter().any(XskSocket::has_rx) {
                return Ok(false);
            }
            socks.iter_mut().for_each(XskSocket::kick);
            let n = socks.len();
            (sys::poll_readable(socks.iter().map(XskSocket::fd).chain([udp]), wait)?, n)
        }
        Rx::Ring(ring) => (sys::poll_readable([ring.fd(), udp], wait)?, 1),
    };
    Ok(mask & (1 << udp_bit) != 0)
}

impl Transport for XdpTransport {
    fn name(&self) -> &'static str {
        self.cfg.delivery.transport_name()
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        self.core.send_parts(kind, header, payload)
    }

    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.core.send_with(kind, len, fill)
    }

    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        self.core.send_begin(kind, len)
    }

    fn send_next_commit(&mut self) -> Result<()> {
        self.core.send_commit()
    }

    fn ready_fd(&self) -> Result<std::os::fd::BorrowedFd<'_>> {
        self.core.ready_fd()
    }

    fn recv_prev(&mut self, out: &mut [u8]) -> Result<Received> {
        let res = self.core.recv(out);
        if self.cfg.log {
            self.program.flush_log();
        }
        res
    }

    fn relay(&mut self, control: &mut [u8], compute: &mut dyn FnMut(&[u8], &mut [u8])) -> Result<Received> {
        self.core.relay(control, compute)
    }

    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        if self.cfg.log {
            self.program.flush_log();
        }
        self.core.recv_lent()
    }

    fn split(self: Box<Self>) -> Result<Halves> {
        let (s, r) = self.into_halves();
        Ok(Halves { sender: Box::new(s), receiver: Box::new(r) })
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.core.set_recv_timeout(timeout);
    }

    fn set_frame_len(&mut self, len: usize) -> Result<()> {
        self.core.set_frame_len(len)
    }

    fn stats(&self) -> Stats {
        self.core.stats()
    }

    fn backend_counters(&self) -> Option<BackendCounters> {
        Some(BackendCounters::xdp(self.program.counters().ok()?, self.chunks_via_kernel()))
    }

    fn source_control(&self) -> Option<super::SourceControl> {
        Some(self.core.source_control())
    }

    fn key_control(&self) -> Option<super::KeyControl> {
        Some(self.core.key_control())
    }
}

#[cfg(test)]
mod buffer_tests {
    use super::*;

    #[test]
    fn buffers_grow_with_the_frame_within_bounds() {
        let (small, ring_small) = buffers_for(16_392, 1);
        assert_eq!((small.ring_size, small.frames), (2048, 4096), "16 KiB frames keep the defaults");
        assert_eq!(ring_small, Some(leap_common::xdp::RING_BYTES));
        let (big, ring_big) = buffers_for(1_048_584, 8);
        assert_eq!((big.ring_size, big.frames), (8192, 16384), "8 MiB frames in flight fit");
        assert_eq!(ring_big, Some(16 << 20));
        let (huge, ring_huge) = buffers_for(64 << 20, 1);
        assert_eq!((huge.ring_size, huge.frames), (8192, 16384), "capped");
        assert_eq!(ring_huge, Some(32 << 20), "capped");
        // Many small frames in flight: room for all of them.
        let (many, ring_many) = buffers_for(16_392, 64);
        assert_eq!((many.ring_size, many.frames), (2048, 4096));
        assert!(ring_many.unwrap() as usize >= 64 * 12 * size_of::<leap_common::xdp::RingRecord>());
        assert_eq!(buffers_for(1_048_584, 64).0.ring_size, 8192, "capped");
        for (x, r) in [(small, ring_small), (big, ring_big), (huge, ring_huge), (many, ring_many)] {
            assert!(x.ring_size.is_power_of_two() && x.frames >= x.ring_size);
            assert!(r.unwrap().is_power_of_two());
        }
    }

    #[test]
    fn sockets_per_queue_share_one_sockets_frames_down_to_a_floor() {
        let one = buffers_for(16_392, 1).0;
        assert_eq!(per_queue(one.clone(), 1).frames, one.frames, "one queue keeps everything");
        let two = per_queue(one.clone(), 2);
        assert_eq!((two.frames, two.ring_size), (2048, 1024));
        let many = per_queue(one.clone(), 64);
        assert_eq!((many.frames, many.ring_size), (QUEUE_FRAMES_MIN, QUEUE_FRAMES_MIN / 2));
        let umem = |x: &XskConfig, n: u64| u64::from(x.frames) * u64::from(x.frame_size) * n;
        assert_eq!(umem(&two, 2), umem(&one, 1), "two queues lock what one did");
        assert_eq!(umem(&many, 64), 128 << 20, "64 queues lock 128 MiB, not 512");
        for x in [two, many] {
            assert!(x.ring_size.is_power_of_two() && x.frames.is_power_of_two() && x.frames >= x.ring_size);
        }
    }
}
