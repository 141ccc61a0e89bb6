//! One AF_XDP socket on one receive queue (xdpilone): its UMEM, fill ring
//! and RX ring. Zero-copy where the driver supports it, copy mode
//! otherwise; need-wakeup; frames go back on the fill ring as soon as their
//! chunk has been copied into the frame being assembled.

use crate::transport::SyscallError;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use leap_common::chunk::TRAIN_DATAGRAM_MAX;
use leap_common::xdp::wire::{ETH_HLEN, IPV4_HLEN_MAX, UDP_HLEN, VLAN_HLEN};
use xdpilone::{DeviceQueue, IfInfo, RingRx, Socket, SocketConfig, Umem, UmemConfig, User};

use super::XdpError;
use crate::sys::xdp::{self as sys, UmemArea};

/// Settings of an [`XskSocket`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct XskConfig {
    /// UMEM frames (each holds one packet).
    pub frames: u32,
    /// Bytes per frame: a power of two, 2048 or 4096.
    pub frame_size: u32,
    /// Entries of the fill and RX rings (a power of two).
    pub ring_size: u32,
    /// How to treat zero-copy.
    pub zero_copy: ZeroCopy,
}

impl Default for XskConfig {
    fn default() -> Self {
        Self { frames: 4096, frame_size: 2048, ring_size: 2048, zero_copy: ZeroCopy::Auto }
    }
}

/// `XDP_USE_SG` of `<linux/if_xdp.h>`: multi-buffer packets (kernel ≥ 6.6).
const XDP_USE_SG: u16 = 1 << 4;
/// `XDP_PKT_CONTD` in a descriptor's `options`: the packet continues in the
/// next descriptor.
const XDP_PKT_CONTD: u32 = 1 << 0;
/// Bytes of the largest packet worth gathering: a train of the most chunks
/// behind the longest headers leap parses.
pub const GATHER_MAX: usize = ETH_HLEN + VLAN_HLEN + IPV4_HLEN_MAX + UDP_HLEN + TRAIN_DATAGRAM_MAX;
/// `XDP_PACKET_HEADROOM`: what the kernel keeps free at the start of every
/// UMEM frame in copy mode.
const XDP_PACKET_HEADROOM: usize = 256;

/// Packet bytes the kernel puts in one frame of `frame_size` bytes.
const fn bytes_per_frame(frame_size: u32) -> usize {
    (frame_size as usize).saturating_sub(XDP_PACKET_HEADROOM)
}

/// Bytes of a UDP payload that fit one frame of `frame_size` bytes behind
/// the kernel's headroom and Ethernet, one VLAN tag, IPv6 and UDP headers
/// (what a socket without multi-buffer can take).
pub const fn payload_per_frame(frame_size: u32) -> usize {
    bytes_per_frame(frame_size).saturating_sub(ETH_HLEN + VLAN_HLEN + leap_common::xdp::wire::IPV6_HLEN + UDP_HLEN)
}

/// Puts the descriptors of a multi-buffer packet back together: copies
/// every piece (so that its frame can go back to the kernel at once) up to
/// the largest packet worth taking, and drops, counted, a packet that is
/// longer or has more pieces than such a packet needs (one that never ends
/// is cut off there; its remaining pieces are skipped).
#[derive(Debug)]
struct Gather {
    bytes: Vec<u8>,
    /// Descriptors of the packet so far.
    pieces: u32,
    /// Most descriptors a packet of [`GATHER_MAX`] bytes takes.
    max_pieces: u32,
    /// The current packet is being skipped.
    discarding: bool,
    /// Packets dropped.
    dropped: u64,
}

impl Gather {
    fn new(frame_size: u32) -> Self {
        let max_pieces = GATHER_MAX.div_ceil(bytes_per_frame(frame_size).max(1)) as u32;
        Self { bytes: Vec::new(), pieces: 0, max_pieces, discarding: false, dropped: 0 }
    }

    /// Whether no packet is half gathered.
    fn is_idle(&self) -> bool {
        self.pieces == 0
    }

    /// Takes one piece; `more`: the packet continues (`XDP_PKT_CONTD`).
    /// Returns the whole packet after its last piece, unless it was
    /// dropped.
    fn piece(&mut self, bytes: &[u8], more: bool) -> Option<&[u8]> {
        if self.pieces == 0 {
            self.bytes.clear();
            self.discarding = false;
        }
        self.pieces += 1;
        if !self.discarding {
            if self.bytes.len() + bytes.len() <= GATHER_MAX && self.pieces <= self.max_pieces {
                self.bytes.extend_from_slice(bytes);
            } else {
                self.discarding = true;
                self.dropped += 1;
            }
        }
        if more {
            return None;
        }
        self.pieces = 0;
        (!self.discarding).then_some(&self.bytes[..])
    }
}

/// Zero-copy policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ZeroCopy {
    /// Try zero-copy, fall back to copy mode (logged once).
    #[default]
    Auto,
    /// Copy mode only.
    Off,
    /// Zero-copy or fail.
    Required,
}

/// `xdpilone::Umem` holds a raw pointer to the area and so is not `Send`.
struct SendUmem(#[allow(dead_code, reason = "kept alive for the sockets sharing it")] Umem);

// SAFETY: `Umem` only stores the area's address and a shared socket fd; it
// never dereferences the pointer on its own, and the area (`UmemArea`) is
// owned by the same `XskSocket`, which moves between threads as a whole.
unsafe impl Send for SendUmem {}

/// An AF_XDP socket bound to `(iface, queue)`, receiving only.
pub struct XskSocket {
    // Field order is drop order: rings and sockets before the UMEM area.
    rx: RingRx,
    fq: DeviceQueue,
    user: User,
    _umem: SendUmem,
    area: UmemArea,
    iface: String,
    queue: u32,
    zero_copy: bool,
    frame_size: u32,
    frames: u32,
    /// Frame addresses to give back to the fill ring.
    recycle: Vec<u64>,
    /// Bound with `XDP_USE_SG`: packets may span several descriptors.
    sg: bool,
    /// Multi-buffer packets being put back together.
    gather: Gather,
}

impl std::fmt::Debug for XskSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskSocket")
            .field("iface", &self.iface)
            .field("queue", &self.queue)
            .field("zero_copy", &self.zero_copy)
            .field("sg", &self.sg)
            .field("huge_pages", &self.area.is_huge())
            .finish_non_exhaustive()
    }
}

/// How often and how long to retry `bind` while the kernel still frees the
/// previous socket of the queue (`EBUSY`).
const BIND_RETRIES: u32 = 50;
const BIND_RETRY_WAIT: Duration = Duration::from_millis(20);

impl XskSocket {
    /// Creates the socket in the current network namespace and binds it to
    /// `(iface, queue)`.
    ///
    /// # Errors
    ///
    /// [`XdpError::Syscall`] naming the failed step, [`XdpError::XskSizes`]
    /// for sizes that cannot work.
    pub fn open(iface: &str, queue: u32, cfg: &XskConfig) -> Result<Self, XdpError> {
        if !cfg.frame_size.is_power_of_two()
            || !(2048..=4096).contains(&cfg.frame_size)
            || !cfg.ring_size.is_power_of_two()
            || cfg.frames < cfg.ring_size
        {
            return Err(XdpError::XskSizes {
                frame_size: cfg.frame_size,
                ring_size: cfg.ring_size,
                frames: cfg.frames,
            });
        }
        let tries: &[bool] = match cfg.zero_copy {
            ZeroCopy::Auto => &[true, false],
            ZeroCopy::Off => &[false],
            ZeroCopy::Required => &[true],
        };
        let mut last = None;
        for &zc in tries {
            match Self::open_sg(iface, queue, cfg, zc) {
                Ok(s) => {
                    if zc {
                        log::info!("{iface} queue {queue}: AF_XDP in zero-copy mode");
                    } else if cfg.zero_copy == ZeroCopy::Auto {
                        log::info!("{iface} queue {queue}: zero-copy AF_XDP not supported by the driver; copy mode");
                    }
                    return Ok(s);
                }
                Err(e @ XdpError::QueueBusy { .. }) => return Err(e),
                Err(e) => {
                    log::debug!(
                        "{iface} queue {queue}: AF_XDP {} bind failed: {e}",
                        if zc { "zero-copy" } else { "copy" }
                    );
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// Opens with `XDP_USE_SG` and, where the kernel refuses it (`EINVAL`
    /// before 6.6; `EOPNOTSUPP` from a zero-copy driver without it),
    /// without, saying so once.
    fn open_sg(iface: &str, queue: u32, cfg: &XskConfig, zero_copy: bool) -> Result<Self, XdpError> {
        match Self::open_once(iface, queue, cfg, zero_copy, true) {
            Err(XdpError::Syscall(e))
                if e.call == "bind" && matches!(e.errno(), Some(libc::EINVAL | libc::EOPNOTSUPP)) =>
            {
                let source = e.source;
                let s = Self::open_once(iface, queue, cfg, zero_copy, false)?;
                log::info!(
                    "{iface} queue {queue}: AF_XDP without multi-buffer (XDP_USE_SG: {source}): chunk trains \
                     only up to {} bytes of UDP payload",
                    payload_per_frame(cfg.frame_size)
                );
                Ok(s)
            }
            other => other,
        }
    }

    fn open_once(iface: &str, queue: u32, cfg: &XskConfig, zero_copy: bool, sg: bool) -> Result<Self, XdpError> {
        let err = |call: &'static str| {
            let on = xsk_name(iface, queue);
            move |source: io::Error| XdpError::Syscall(SyscallError::on(call, on, source))
        };
        let errno = |e: xdpilone::Errno| io::Error::from_raw_os_error(e.get_raw().abs());

        let area = UmemArea::new(cfg.frames as usize * cfg.frame_size as usize).map_err(err("mmap"))?;
        let umem_cfg = UmemConfig {
            fill_size: cfg.ring_size,
            complete_size: cfg.ring_size,
            frame_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
        };
        // SAFETY: `area` is a fresh page-aligned mapping of `frames *
        // frame_size` bytes that outlives the UMEM: both live in the returned
        // `XskSocket`, where `area` is dropped last.
        let umem = unsafe { Umem::new(umem_cfg, area.as_non_null()) }.map_err(|e| err("umem")(errno(e)))?;

        let name = CString::new(iface).map_err(|_| XdpError::NoInterface(iface.to_string()))?;
        let mut info = IfInfo::invalid();
        info.from_name(&name).map_err(|e| err("if_nametoindex")(errno(e)))?;
        info.set_queue(queue);
        let sock = Socket::with_shared(&info, &umem).map_err(|e| err("socket")(errno(e)))?;
        let mut fq = umem.fq_cq(&sock).map_err(|e| err("fill/completion rings")(errno(e)))?;
        let mode = if zero_copy { SocketConfig::XDP_BIND_ZEROCOPY } else { SocketConfig::XDP_BIND_COPY };
        let sock_cfg = SocketConfig {
            rx_size: std::num::NonZeroU32::new(cfg.ring_size),
            tx_size: None,
            bind_flags: mode | SocketConfig::XDP_BIND_NEED_WAKEUP | if sg { XDP_USE_SG } else { 0 },
        };
        let user = umem.rx_tx(&sock, &sock_cfg).map_err(|e| err("rx ring")(errno(e)))?;
        // Map the rx ring before binding: kernels before 6.x (6.1 among
        // them) refuse to mmap a ring of a bound socket with EBUSY.
        let rx = user.map_rx().map_err(|e| err("mmap rx ring")(errno(e)))?;

        // Hand every frame to the kernel before binding. `fill(n)` may
        // offer fewer slots than are free (it refreshes its view of the
        // ring only when its cached count runs out): loop, bounded.
        let fill_frames = cfg.ring_size.min(cfg.frames);
        let mut next = 0u32;
        for _ in 0..=fill_frames {
            if next == fill_frames {
                break;
            }
            let mut w = fq.fill(fill_frames - next);
            let n = w.insert((next..fill_frames).map(|i| u64::from(i) * u64::from(cfg.frame_size)));
            w.commit();
            next += n;
        }
        if next != fill_frames {
            return Err(XdpError::Syscall(SyscallError::on(
                "fill ring",
                xsk_name(iface, queue),
                io::Error::other(format!("only {next} of {fill_frames} frames accepted")),
            )));
        }

        let mut attempt = 0;
        loop {
            match umem.bind(&user) {
                Ok(()) => break,
                Err(e) if e.get_raw().abs() == libc::EBUSY && attempt < BIND_RETRIES => {
                    attempt += 1;
                    std::thread::sleep(BIND_RETRY_WAIT);
                }
                Err(e) if e.get_raw().abs() == libc::EBUSY => {
                    return Err(XdpError::QueueBusy { iface: iface.to_string(), queue });
                }
                Err(e) => return Err(err("bind")(errno(e))),
            }
        }
        let mut recycle = Vec::with_capacity(cfg.ring_size as usize);
        // Frames past the fill ring's size wait in `recycle` for room.
        recycle.extend((fill_frames..cfg.frames).map(|i| u64::from(i) * u64::from(cfg.frame_size)));
        Ok(Self {
            rx,
            fq,
            user,
            _umem: SendUmem(umem),
            area,
            iface: iface.to_string(),
            queue,
            zero_copy,
            frame_size: cfg.frame_size,
            frames: cfg.frames,
            recycle,
            sg,
            gather: Gather::new(cfg.frame_size),
        })
    }

    /// The socket, for the XSKMAP.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is owned by `self.user` (and shared with the
        // rings), open for as long as `self` lives, which bounds the borrow.
        unsafe { BorrowedFd::borrow_raw(self.user.as_raw_fd()) }
    }

    /// The receive queue.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Whether the socket runs in zero-copy mode.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Calls `f` with every received packet (at most `max` descriptors; the
    /// pieces of a multi-buffer packet gathered into one), then gives the
    /// frames back to the kernel. Returns how many descriptors there were.
    pub fn recv(&mut self, max: u32, mut f: impl FnMut(&[u8])) -> u32 {
        let mut n = 0;
        {
            let mut rx = self.rx.receive(max);
            while let Some(desc) = rx.read() {
                n += 1;
                // SAFETY: the descriptor came off the RX ring, so its frame
                // is ours until it goes back on the fill ring, which happens
                // (through `recycle`) only after `f` has returned or its
                // bytes were copied into `gather`.
                let Some(bytes) = (unsafe { self.area.get(desc.addr, desc.len) }) else {
                    // Never ours: nothing to give back.
                    log::warn!("{} queue {}: AF_XDP descriptor out of the UMEM", self.iface, self.queue);
                    continue;
                };
                let more = desc.options & XDP_PKT_CONTD != 0;
                if !more && self.gather.is_idle() {
                    // The usual case: one descriptor, one packet, no copy.
                    f(bytes);
                } else if let Some(packet) = self.gather.piece(bytes, more) {
                    f(packet);
                }
                // The address includes the in-frame offset: give back the
                // frame-aligned address.
                self.recycle.push(desc.addr - desc.addr % u64::from(self.frame_size));
            }
            rx.release();
        }
        self.refill();
        n
    }

    /// Whether the socket is bound with `XDP_USE_SG` (takes packets larger
    /// than one frame).
    pub fn multi_buffer(&self) -> bool {
        self.sg
    }

    /// Bytes of the largest UDP payload this socket takes whole.
    pub fn max_payload(&self) -> usize {
        if self.sg { TRAIN_DATAGRAM_MAX } else { payload_per_frame(self.frame_size).min(TRAIN_DATAGRAM_MAX) }
    }

    /// Multi-buffer packets dropped since the last call: longer than any
    /// train, or more pieces than such a packet needs (a packet that never
    /// ends is cut off there).
    pub fn take_dropped_packets(&mut self) -> u64 {
        std::mem::take(&mut self.gather.dropped)
    }

    /// Puts recycled frames back on the fill ring (as many as fit).
    fn refill(&mut self) {
        let mut rounds = 0;
        while !self.recycle.is_empty() && rounds < 4 {
            rounds += 1;
            let want = u32::try_from(self.recycle.len()).unwrap_or(u32::MAX);
            let mut w = self.fq.fill(want);
            let from = self.recycle.len() - want.min(w.capacity()) as usize;
            let n = w.insert(self.recycle[from..].iter().copied());
            w.commit();
            self.recycle.truncate(self.recycle.len() - n as usize);
            if n == 0 {
                break;
            }
        }
        self.kick();
    }

    /// Frames currently owned by user space (not on the fill ring).
    pub fn frames_out(&self) -> usize {
        self.recycle.len()
    }

    /// Total UMEM frames.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Whether the RX ring has descriptors waiting.
    pub fn has_rx(&self) -> bool {
        self.rx.available() > 0
    }

    /// Wakes the kernel if it waits for fill-ring entries (need-wakeup).
    pub fn kick(&mut self) {
        if self.fq.needs_wakeup() {
            self.fq.wake();
        }
    }

    /// Drives the kernel's side once without blocking: a
    /// `recv(MSG_DONTWAIT)` on the socket runs one NAPI busy-poll round on
    /// its queue when busy polling is on (`SO_BUSY_POLL`; the kernel's
    /// AF_XDP documentation and its `xdpsock` sample do the same), and
    /// wakes the driver otherwise. Errors (`EAGAIN`, `EOPNOTSUPP` on old
    /// kernels) are ignored: the next wait reports a broken socket.
    pub fn busy_poll(&mut self) {
        let _ = nix::sys::socket::recv(self.fd().as_raw_fd(), &mut [], nix::sys::socket::MsgFlags::MSG_DONTWAIT);
    }

    /// Waits until the RX ring is readable or `timeout` passes; returns
    /// whether it is readable.
    ///
    /// # Errors
    ///
    /// The `poll` error.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        if self.has_rx() {
            return Ok(true);
        }
        self.kick();
        sys::poll_readable([self.fd()], timeout).map(|m| m != 0)
    }

    /// The kernel's counters of this socket: `(rx_dropped,
    /// rx_ring_full, rx_fill_ring_empty)`.
    pub fn kernel_drops(&self) -> Option<(u64, u64, u64)> {
        let s = self.user.statistics_v2().ok()?;
        Some((s.rx_dropped, s.rx_ring_full, s.rx_fill_ring_empty_descs))
    }
}

/// What an AF_XDP socket's failed step was called on.
fn xsk_name(iface: &str, queue: u32) -> String {
    format!("the AF_XDP socket of {iface} queue {queue}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_of_a_multi_buffer_packet_are_gathered() {
        let mut g = Gather::new(2048);
        assert!(g.is_idle());
        assert_eq!(g.piece(&[1; 1792], true), None);
        assert!(!g.is_idle());
        assert_eq!(g.piece(&[2; 1792], true), None);
        let p = g.piece(&[3; 100], false).unwrap().to_vec();
        assert_eq!(p.len(), 1792 * 2 + 100);
        assert_eq!((p[0], p[1792], p[3584]), (1, 2, 3));
        assert!(g.is_idle());
        assert_eq!(g.dropped, 0);
        // A packet of one piece.
        assert_eq!(g.piece(&[4; 10], false), Some(&[4u8; 10][..]));
    }

    #[test]
    fn too_long_and_endless_packets_are_dropped_and_counted() {
        let mut g = Gather::new(2048);
        // Longer than any train: dropped, and its pieces skipped to its end.
        for _ in 0..4 {
            assert_eq!(g.piece(&[0; 1792], true), None);
        }
        assert_eq!(g.piece(&[0; 1792], true), None);
        assert_eq!(g.piece(&[0; 1792], false), None);
        assert_eq!(g.dropped, 1);
        // More pieces than a train needs, however small: cut off, counted once.
        for _ in 0..1000 {
            assert_eq!(g.piece(&[0; 1], true), None);
        }
        assert_eq!(g.dropped, 2);
        assert!(g.bytes.len() <= GATHER_MAX);
        // Its end is skipped too; the next packet is taken again.
        assert_eq!(g.piece(&[0; 1], false), None);
        assert_eq!(g.piece(&[9; 3], false), Some(&[9u8; 3][..]));
        assert_eq!(g.dropped, 2);
    }
}
