//! UDP in the LEAP chunk format, byte-compatible with the original: one
//! `sendmmsg` per frame (GSO super-datagrams where the kernel can), batched
//! `recvmmsg` receive (with GRO where it can), shared reassembly.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, FRAME_LEN_MAX, flags};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::datagram::{DatagramLink, Reliability};
use super::{FrameKind, Received, Result, Stats, Transport, TransportError};
use crate::frame::Chunker;
use crate::frame::chunker::ChunkRef;
use crate::frame::reliable::Timers;
use crate::frame::window::{DEFAULT_WINDOW_MEMORY, WindowError, Windows};
use crate::sys::udp::{RxBatch, TxBatch, enable_gro, gso_supported, set_int, wait_readable};

/// Socket buffer size asked for (the original used 8 MiB).
pub const SOCKET_BUFFER: usize = 8 << 20;

/// Settings of a [`UdpTransport`].
#[derive(Debug, Clone)]
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
    /// from `inflight` ([`Windows`]).
    pub window: u16,
    /// Loss recovery.
    pub reliability: Reliability,
    /// Loss-recovery timers.
    pub timers: Timers,
    /// Where NACKs come from (default: `next`); NACKs from anywhere else
    /// are dropped.
    pub nack_from: Option<SocketAddr>,
    /// Frames kept to answer NACKs; 0: derived from `inflight` ([`Windows`]).
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
            window_memory: DEFAULT_WINDOW_MEMORY,
            crc: true,
        }
    }
}

/// Errors setting up a UDP transport.
#[derive(Debug, thiserror::Error)]
pub enum UdpError {
    /// A socket call failed.
    #[error("{call} {addr}: {source}")]
    Socket {
        /// The call.
        call: &'static str,
        /// The address involved.
        addr: SocketAddr,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// The window or the frames kept for NACKs cannot work.
    #[error(transparent)]
    Window(#[from] WindowError),
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

impl From<UdpError> for TransportError {
    fn from(e: UdpError) -> Self {
        TransportError::Backend(Box::new(e))
    }
}

/// Opens a UDP socket bound to `addr` with large buffers.
///
/// # Errors
///
/// [`UdpError::Socket`] naming the failed call.
pub fn bind_socket(addr: SocketAddr) -> Result<Socket, UdpError> {
    let err = |call| move |source| UdpError::Socket { call, addr, source };
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(err("socket"))?;
    // Root can exceed net.core.[rw]mem_max; others get what the sysctl allows.
    let size = SOCKET_BUFFER as libc::c_int;
    if set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size).is_err() {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
    if set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, size).is_err() {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
    s.bind(&addr.into()).map_err(err("bind"))?;
    if !crate::sys::udp::enable_drop_count(s.as_fd()) {
        log::debug!("{addr}: the kernel does not report socket drops (SO_RXQ_OVFL)");
    }
    Ok(s)
}

/// The sending half: chunks frames and hands them to the kernel in one
/// `sendmmsg` each. Shared by the datagram backends (UDP, XDP).
#[derive(Debug)]
pub struct UdpSender {
    next: SockAddr,
    seq: u16,
    gso: bool,
    batch: TxBatch,
    headers: Vec<[u8; CHUNK_HEADER_LEN]>,
}

impl UdpSender {
    /// A sender to `next`; `gso` if the socket supports it (checked).
    pub fn new(socket: &Socket, next: SocketAddr, gso: bool) -> Self {
        let gso = gso && gso_supported(socket.as_fd());
        Self { next: next.into(), seq: 0, gso, batch: TxBatch::new(), headers: Vec::new() }
    }

    /// Whether GSO is in use.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// The seq the next frame gets.
    pub fn next_seq(&self) -> u16 {
        self.seq
    }

    /// Sends one frame (`head ++ tail`, then `trailer` on the wire) as chunks
    /// whose headers carry `reserved` (leap flags, or 0 to send exactly like
    /// the original); returns the chunk count. The frame's seq is used up
    /// even when sending fails part-way.
    ///
    /// # Errors
    ///
    /// [`TransportError::BadFrameLen`] (nothing sent, no seq used) or the
    /// `sendmmsg` error.
    pub fn send(&mut self, socket: &Socket, reserved: u16, head: &[u8], tail: &[u8], trailer: &[u8]) -> Result<u16> {
        let len = head.len() + tail.len();
        let chunker =
            Chunker::with_trailer(self.seq, reserved, head, tail, trailer).ok_or(TransportError::BadFrameLen(len))?;
        let total = chunker.total();
        self.seq = self.seq.wrapping_add(1);
        self.transmit(socket, chunker)?;
        Ok(total)
    }

    /// Sends chunks `ids` of an earlier frame `seq` again, flagged as
    /// retransmissions; returns how many were sent. Ids beyond the frame are
    /// skipped.
    ///
    /// # Errors
    ///
    /// The `sendmmsg` error.
    pub fn resend(
        &mut self,
        socket: &Socket,
        seq: u16,
        reserved: u16,
        frame: &[u8],
        trailer: &[u8],
        ids: impl Iterator<Item = u16>,
    ) -> Result<u64> {
        let Some(chunker) = Chunker::with_trailer(seq, reserved | flags::RETRANSMIT, frame, &[], trailer) else {
            return Ok(0);
        };
        let mut chunks = [None; 64];
        let mut sent = 0u64;
        let mut ids = ids.filter(|&id| id < chunker.total()).peekable();
        while ids.peek().is_some() {
            let mut n = 0;
            for id in ids.by_ref().take(chunks.len()) {
                chunks[n] = chunker.chunk(id);
                n += 1;
            }
            self.transmit(socket, chunks[..n].iter().flatten().copied())?;
            sent += n as u64;
        }
        Ok(sent)
    }

    fn transmit<'a, I>(&mut self, socket: &Socket, chunks: I) -> Result<()>
    where
        I: Iterator<Item = ChunkRef<'a>> + Clone,
    {
        self.headers.clear();
        self.headers.extend(chunks.clone().map(|c| c.header.to_bytes()));
        let headers = &self.headers;
        let datagrams =
            || chunks.clone().zip(headers.iter()).map(|(c, h)| [&h[..], c.pieces[0], c.pieces[1], c.pieces[2]]);
        let seg = self.gso.then_some(CHUNK_DATAGRAM_MAX as u16);
        match self.batch.send(socket.as_fd(), &self.next, datagrams(), seg) {
            Ok(()) => Ok(()),
            Err(e) if seg.is_some() && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                log::warn!("UDP GSO failed on this path ({e}); sending one datagram per chunk from now on");
                self.gso = false;
                self.batch
                    .send(socket.as_fd(), &self.next, datagrams(), None)
                    .map_err(|e| TransportError::io("sendmmsg", e))
            }
            Err(e) => Err(TransportError::io("sendmmsg", e)),
        }
    }
}

/// The UDP transport: one socket bound to the node's address, sending to the
/// next node and receiving from the previous one.
#[derive(Debug)]
pub struct UdpTransport {
    link: DatagramLink,
    rx: RxBatch,
    gro: bool,
    /// The socket's current `SO_RCVTIMEO`, to set it only once.
    rcvtimeo: Duration,
}

impl UdpTransport {
    /// Binds `cfg.listen` and prepares to send to `cfg.next`.
    ///
    /// # Errors
    ///
    /// [`UdpError`] when the socket cannot be set up, the frame limit is
    /// beyond what the chunk format can carry, or the window and the frames
    /// kept for NACKs cannot work ([`settle_windows`]).
    pub fn bind(mut cfg: UdpConfig) -> Result<Self, UdpError> {
        if cfg.max_frame_len == 0 || cfg.max_frame_len > FRAME_LEN_MAX {
            return Err(UdpError::Config(format!(
                "max frame length {} outside 1..={FRAME_LEN_MAX} (65535 chunks of 1400 bytes)",
                cfg.max_frame_len
            )));
        }
        settle_windows(&mut cfg)?;
        let socket = bind_socket(cfg.listen)?;
        let gro = cfg.gro && enable_gro(socket.as_fd());
        // With GRO one slot may hold a 64 KiB super-datagram.
        let rx = if gro { RxBatch::new(16, 65536) } else { RxBatch::new(64, CHUNK_DATAGRAM_MAX + 1) };
        let listen = cfg.listen;
        let link = DatagramLink::new(socket, cfg, true);
        log::debug!("udp {listen}: GSO {}, GRO {gro}", link.gso());
        Ok(Self { link, rx, gro, rcvtimeo: Duration::ZERO })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.link.socket().local_addr().ok().and_then(|a| a.as_socket())
    }

    /// Whether the next and the previous node proved to be leap nodes (until
    /// then they are spoken to exactly as the original would be). Hellos are
    /// answered inside [`Transport::recv_prev`].
    pub fn neighbours_are_leap(&self) -> (bool, bool) {
        (self.link.next_is_leap(), self.link.prev_is_leap())
    }
}

/// Waits at least this long block in `recvmmsg` with `SO_RCVTIMEO` (tick
/// granularity is fine there); shorter ones use `ppoll`.
const LONG_WAIT: Duration = Duration::from_millis(15);

impl Transport for UdpTransport {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        self.link.send(kind, header, payload)
    }

    fn recv_prev(&mut self, out: &mut [u8]) -> Result<Received> {
        let Self { link, rx, gro, rcvtimeo } = self;
        link.recv_with(out, "recvmmsg", |link, out, wait| {
            let fd = link.socket().as_fd();
            let block = match wait {
                None => false,
                // Short waits (loss-recovery timers) need ppoll's precision;
                // then take what arrived without blocking.
                Some(w) if w < LONG_WAIT => {
                    wait_readable(fd, w)?;
                    false
                }
                // Long waits block in recvmmsg itself: one system call.
                Some(_) => {
                    if *rcvtimeo != LONG_WAIT {
                        link.socket().set_read_timeout(Some(LONG_WAIT))?;
                        *rcvtimeo = LONG_WAIT;
                    }
                    true
                }
            };
            rx.recv(link.socket().as_fd(), block)?;
            link.take_batch(rx, *gro, out);
            Ok(())
        })
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.link.set_recv_timeout(timeout);
    }

    fn stats(&self) -> Stats {
        self.link.stats()
    }
}
