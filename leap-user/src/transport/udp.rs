//! UDP in the LEAP chunk format, byte-compatible with the original: one
//! `sendmmsg` per frame (GSO super-datagrams where the kernel can), batched
//! `recvmmsg` receive (with GRO where it can), shared reassembly.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use leap_common::chunk::{FRAME_LEN_MAX, TRAIN_DATAGRAM_MAX};
use socket2::{Domain, Protocol, Socket, Type};

pub use super::config::UdpConfig;
use super::datagram::{DatagramLink, RxPath};
use super::halves::{DatagramCore, DatagramReceiver, DatagramSender};
pub use super::send::UdpSender;
use super::{FrameKind, Halves, Lent, Received, Result, Stats, Transport};
use crate::frame::window::{WindowError, Windows};
use crate::sys::udp::{RxBatch, enable_gro, force_recv_buffer, force_send_buffer, wait_readable};

/// Socket buffer size asked for (the original used 8 MiB).
pub const SOCKET_BUFFER: usize = 8 << 20;

/// Errors setting up a UDP transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdpError {
    /// A socket call failed (on the listen address).
    #[error(transparent)]
    Syscall(super::SyscallError),
    /// A frame limit the chunk format cannot carry.
    #[error("max frame length {0} outside 1..={FRAME_LEN_MAX} (65535 chunks of 1400 bytes)")]
    MaxFrameLen(usize),
    /// The window or the frames kept for NACKs cannot work.
    #[error(transparent)]
    Window(#[from] WindowError),
    /// A ring key with settings a keyed ring cannot run with.
    #[error("a keyed datagram ring {0}")]
    Keyed(&'static str),
}

/// Whether a keyed ring can run with `cfg` (see [`UdpConfig::ring_key`]).
///
/// # Errors
///
/// [`UdpError::Keyed`]: a wildcard listen address, or `original_compat`.
pub fn check_key(cfg: &UdpConfig) -> Result<(), UdpError> {
    if cfg.ring_key.is_none() {
        return Ok(());
    }
    if cfg.listen.ip().is_unspecified() {
        return Err(UdpError::Keyed(
            "binds the node's own address, not a wildcard (its tags are bound to both ends' addresses)",
        ));
    }
    if cfg.original_compat {
        return Err(UdpError::Keyed("cannot speak the original's format (original_compat): it has no tags"));
    }
    Ok(())
}

/// Settles `cfg.window` and `cfg.keep_frames` (derived where 0, checked
/// against `cfg.inflight` and `cfg.window_memory`) and logs them.
///
/// # Errors
///
/// [`WindowError`] for sizes that cannot work.
pub fn settle_windows(cfg: &mut UdpConfig) -> Result<Windows, WindowError> {
    let size = |cap| Windows::new(cfg.inflight, cfg.max_frame_len, cfg.window, cfg.keep_frames, cap);
    let w = size(cfg.window_memory)?;
    let shrunk = size(usize::MAX).is_ok_and(|free| free != w);
    let what = format!(
        "{}: window {} frames, {} kept for NACKs ({} in flight, up to {} MiB)",
        cfg.listen,
        w.window,
        w.keep_frames,
        cfg.inflight,
        w.memory.div_ceil(1 << 20)
    );
    if shrunk {
        log::info!("{what}: smaller than derived, to stay within {} MiB", cfg.window_memory >> 20);
    } else {
        log::debug!("{what}");
    }
    (cfg.window, cfg.keep_frames) = (w.window, w.keep_frames);
    Ok(w)
}

/// Whether the chunk format carries frames of up to `len` bytes (every
/// datagram backend's limit).
///
/// # Errors
///
/// [`UdpError::MaxFrameLen`].
pub fn check_max_frame_len(len: usize) -> Result<(), UdpError> {
    if len == 0 || len > FRAME_LEN_MAX { Err(UdpError::MaxFrameLen(len)) } else { Ok(()) }
}

/// Opens a UDP socket bound to `addr` with large buffers.
///
/// # Errors
///
/// [`UdpError::Syscall`] naming the failed call.
pub fn bind_socket(addr: SocketAddr) -> Result<Socket, UdpError> {
    let err = |call| move |source| UdpError::Syscall(super::SyscallError::on(call, addr, source));
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(err("socket"))?;
    // Root can exceed net.core.[rw]mem_max; others get what the sysctl allows.
    if force_recv_buffer(s.as_fd(), SOCKET_BUFFER).is_err() {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
    if force_send_buffer(s.as_fd(), SOCKET_BUFFER).is_err() {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
    s.bind(&addr.into()).map_err(err("bind"))?;
    if let Err(e) = crate::sys::udp::ignore_path_mtu_hints(s.as_fd(), addr.is_ipv6()) {
        log::warn!("{addr}: spoofed ICMP can lower the path MTU of this socket's sends (IP_PMTUDISC_OMIT: {e})");
    }
    if !crate::sys::udp::enable_drop_count(s.as_fd()) {
        log::debug!("{addr}: the kernel does not report socket drops (SO_RXQ_OVFL)");
    }
    Ok(s)
}

/// Turns busy polling on for a receive socket (`what` names it in the log):
/// `SO_BUSY_POLL` for `busy` (see [`crate::sys::busy_poll::enable`]). Without
/// `CAP_NET_ADMIN` the kernel refuses; that is logged once per process, with
/// the fix, and the node keeps spinning for `busy` before it sleeps.
/// Returns whether the socket busy-polls.
pub(crate) fn enable_busy_poll(fd: std::os::fd::BorrowedFd<'_>, busy: Option<Duration>, what: &str) -> bool {
    use crate::sys::busy_poll;
    static REFUSED: std::sync::Once = std::sync::Once::new();
    let Some(busy) = busy else { return false };
    let us = u32::try_from(busy.as_micros()).unwrap_or(u32::MAX);
    match busy_poll::enable(fd, us, busy_poll::DEFAULT_BUDGET) {
        Ok(()) => true,
        Err(e) => {
            REFUSED.call_once(|| {
                let fix = if e.is_permission() {
                    "grant CAP_NET_ADMIN (the packaged unit does)"
                } else {
                    "a kernel with busy polling (CONFIG_NET_RX_BUSY_POLL, 5.11 or later)"
                };
                log::warn!(
                    "{what}: busy polling is off ({e}); the node only spins {us} us before sleeping: {fix}, \
                     or leave out --busy-poll"
                );
            });
            false
        }
    }
}

/// The UDP transport: one socket bound to the node's address, sending to the
/// next node and receiving from the previous one.
#[derive(Debug)]
pub struct UdpTransport {
    core: DatagramCore<UdpRx>,
}

/// The UDP transport's receive path: `recvmmsg` batches, with GRO where the
/// kernel has it.
#[derive(Debug)]
pub struct UdpRx {
    socket: Arc<Socket>,
    batch: RxBatch,
    gro: bool,
    /// The socket's current `SO_RCVTIMEO`, to set it only once.
    rcvtimeo: Duration,
    /// A blocking wait already received into `batch`.
    filled: bool,
}

/// Waits at least this long block in `recvmmsg` with `SO_RCVTIMEO` (tick
/// granularity is fine there); shorter ones use `ppoll`.
const LONG_WAIT: Duration = Duration::from_millis(15);

impl RxPath for UdpRx {
    fn wait(&mut self, wait: Duration) -> io::Result<()> {
        if wait < LONG_WAIT {
            // Short waits (loss-recovery timers) need ppoll's precision.
            wait_readable(self.socket.as_fd(), wait)?;
            return Ok(());
        }
        // Long waits block in recvmmsg itself: one system call.
        if self.rcvtimeo != LONG_WAIT {
            self.socket.set_read_timeout(Some(LONG_WAIT))?;
            self.rcvtimeo = LONG_WAIT;
        }
        self.batch.recv(self.socket.as_fd(), true)?;
        self.filled = true;
        Ok(())
    }

    fn ready_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.socket.as_fd().try_clone_to_owned()
    }

    fn drain(&mut self, link: &mut DatagramLink, out: Option<&mut [u8]>) -> io::Result<()> {
        if !std::mem::take(&mut self.filled) {
            self.batch.recv(self.socket.as_fd(), false)?;
        }
        link.take_batch(&self.batch, self.gro, out);
        Ok(())
    }
}

/// A [`UdpTransport`] driven by tokio.
#[cfg(feature = "tokio")]
pub type AsyncUdp = super::asyncio::AsyncDatagram<UdpRx>;

/// The sending half of a split [`UdpTransport`].
pub type UdpSendHalf = DatagramSender<UdpRx>;
/// The receiving half of a split [`UdpTransport`].
pub type UdpRecvHalf = DatagramReceiver<UdpRx>;

impl UdpTransport {
    /// Binds `cfg.listen` and prepares to send to `cfg.next`; starts the
    /// thread that runs loss recovery while the caller is not receiving.
    ///
    /// # Errors
    ///
    /// [`UdpError`] when the socket cannot be set up, the frame limit is
    /// beyond what the chunk format can carry, or the window and the frames
    /// kept for NACKs cannot work ([`settle_windows`]).
    pub fn bind(mut cfg: UdpConfig) -> Result<Self, UdpError> {
        check_max_frame_len(cfg.max_frame_len)?;
        check_key(&cfg)?;
        settle_windows(&mut cfg)?;
        let socket = bind_socket(cfg.listen)?;
        enable_busy_poll(socket.as_fd(), cfg.busy_poll, &format!("udp {}", cfg.listen));
        let gro = cfg.gro && enable_gro(socket.as_fd());
        // With GRO one slot may hold a 64 KiB super-datagram (of single
        // chunks or of trains); without, one train. One byte more shows a
        // longer datagram as truncated (dropped, counted as oversize).
        cfg.rx_train_bytes = cfg.rx_train_bytes.min(TRAIN_DATAGRAM_MAX);
        let batch = if gro { RxBatch::new(16, 65536) } else { RxBatch::new(64, TRAIN_DATAGRAM_MAX + 1) };
        let listen = cfg.listen;
        let link = DatagramLink::new(socket, cfg, true);
        log::debug!("udp {listen}: GSO {}, GRO {gro}", link.gso());
        let rx = UdpRx { socket: link.shared_socket(), batch, gro, rcvtimeo: Duration::ZERO, filled: false };
        let core = DatagramCore::new(link, rx, "udp", "recvmmsg")
            .map_err(|source| UdpError::Syscall(super::SyscallError::on("spawn driver", listen, source)))?;
        Ok(Self { core })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.core.shared().link().socket().local_addr().ok().and_then(|a| a.as_socket())
    }

    /// Whether the next and the previous node proved to be leap nodes (until
    /// then they are spoken to exactly as the original would be). Hellos are
    /// answered inside [`Transport::recv_prev`] and by the driver.
    pub fn neighbours_are_leap(&self) -> (bool, bool) {
        let link = self.core.shared().link();
        (link.next_is_leap(), link.prev_is_leap())
    }

    /// How frames leave for the next node: chunks per datagram (1 until it
    /// proved that it takes trains, and with trains off) and whether UDP GSO
    /// hands each frame's datagrams to the kernel at once.
    pub fn send_shape(&self) -> (usize, bool) {
        let link = self.core.shared().link();
        (link.train_chunks(), link.gso())
    }

    /// Splits into a sender and a receiver for two threads.
    pub fn into_halves(self) -> (UdpSendHalf, UdpRecvHalf) {
        self.core.split()
    }

    /// The same transport driven by the current tokio runtime.
    ///
    /// # Errors
    ///
    /// No runtime, or registering the socket failed.
    #[cfg(feature = "tokio")]
    pub fn into_async(self) -> io::Result<AsyncUdp> {
        super::asyncio::AsyncDatagram::new(self.core)
    }
}

impl Transport for UdpTransport {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn source_control(&self) -> Option<super::SourceControl> {
        Some(self.core.source_control())
    }

    fn key_control(&self) -> Option<super::KeyControl> {
        Some(self.core.key_control())
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
        self.core.recv(out)
    }

    fn relay(&mut self, control: &mut [u8], compute: &mut dyn FnMut(&[u8], &mut [u8])) -> Result<Received> {
        self.core.relay(control, compute)
    }

    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        self.core.recv_lent()
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

    fn split(self: Box<Self>) -> Result<Halves> {
        let (s, r) = self.into_halves();
        Ok(Halves { sender: Box::new(s), receiver: Box::new(r) })
    }
}
