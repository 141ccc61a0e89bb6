//! UDP in the LEAP chunk format, byte-compatible with the original: one
//! `sendmmsg` per frame (GSO super-datagrams where the kernel can), batched
//! `recvmmsg` receive (with GRO where it can), shared reassembly.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, ChunkHeader, ChunkKind, FRAME_LEN_MAX, flags};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{FrameKind, Received, Result, Stats, Transport, TransportError};
use crate::frame::{Chunker, Push, Reassembler};
use crate::sys::udp::{RxBatch, TxBatch, enable_gro, gso_supported, set_int};

/// Socket buffer size asked for (the original used 8 MiB).
pub const SOCKET_BUFFER: usize = 8 << 20;
/// How often a blocking receive wakes up to check its deadline.
const WAKE_TICK: Duration = Duration::from_millis(20);

/// Settings of a [`UdpTransport`].
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// Address to bind: chunks arrive here and leave from here.
    pub listen: SocketAddr,
    /// The next node.
    pub next: SocketAddr,
    /// Accept chunks only from this address (the previous node's sending
    /// address); `None` accepts any source.
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
    /// Frames in assembly at once (window of the reassembler).
    pub window: u16,
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
            window: crate::frame::reassembly::DEFAULT_WINDOW,
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
    Ok(s)
}

/// The sending half: chunks frames and hands them to the kernel in one
/// `sendmmsg` each. Shared with the XDP backend, which receives elsewhere.
#[derive(Debug)]
pub struct UdpSender {
    next: SockAddr,
    seq: u16,
    reserved: u16,
    gso: bool,
    batch: TxBatch,
    headers: Vec<[u8; CHUNK_HEADER_LEN]>,
}

impl UdpSender {
    /// A sender to `next`; `gso` if the socket supports it (checked).
    pub fn new(socket: &Socket, next: SocketAddr, gso: bool, reserved: u16) -> Self {
        let gso = gso && gso_supported(socket.as_fd());
        Self { next: next.into(), seq: 0, reserved, gso, batch: TxBatch::new(), headers: Vec::new() }
    }

    /// Whether GSO is in use.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Sends one frame (`head ++ tail`) as chunks; returns the chunk count.
    ///
    /// # Errors
    ///
    /// [`TransportError::BadFrameLen`] or the `sendmmsg` error.
    pub fn send(&mut self, socket: &Socket, kind: FrameKind, head: &[u8], tail: &[u8]) -> Result<u16> {
        let mut reserved = self.reserved;
        if reserved & flags::LEAP != 0 && kind == FrameKind::Control {
            reserved |= ChunkKind::Control as u16;
        }
        let len = head.len() + tail.len();
        let chunker = Chunker::new(self.seq, reserved, head, tail).ok_or(TransportError::BadFrameLen(len))?;
        let total = chunker.total();
        self.headers.clear();
        self.headers.extend(chunker.clone().map(|c| c.header.to_bytes()));
        let headers = &self.headers;
        let datagrams = || chunker.clone().zip(headers.iter()).map(|(c, h)| [&h[..], c.pieces[0], c.pieces[1]]);
        let seg = self.gso.then_some(CHUNK_DATAGRAM_MAX as u16);
        match self.batch.send(socket.as_fd(), &self.next, datagrams(), seg) {
            Ok(()) => {}
            Err(e) if seg.is_some() && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                log::warn!("UDP GSO failed on this path ({e}); sending one datagram per chunk from now on");
                self.gso = false;
                self.batch
                    .send(socket.as_fd(), &self.next, datagrams(), None)
                    .map_err(|e| TransportError::io("sendmmsg", e))?;
            }
            Err(e) => return Err(TransportError::io("sendmmsg", e)),
        }
        self.seq = self.seq.wrapping_add(1);
        Ok(total)
    }
}

/// The UDP transport: one socket bound to the node's address, sending to the
/// next node and receiving from the previous one.
#[derive(Debug)]
pub struct UdpTransport {
    socket: Socket,
    cfg: UdpConfig,
    sender: UdpSender,
    reasm: Reassembler,
    rx: RxBatch,
    /// Next datagram of `rx` not yet processed.
    rx_next: usize,
    gro: bool,
    stats: Stats,
}

impl UdpTransport {
    /// Binds `cfg.listen` and prepares to send to `cfg.next`.
    ///
    /// # Errors
    ///
    /// [`UdpError`] when the socket cannot be set up or the frame limit is
    /// beyond what the chunk format can carry.
    pub fn bind(cfg: UdpConfig) -> Result<Self, UdpError> {
        if cfg.max_frame_len == 0 || cfg.max_frame_len > FRAME_LEN_MAX {
            return Err(UdpError::Config(format!(
                "max frame length {} outside 1..={FRAME_LEN_MAX} (65535 chunks of 1400 bytes)",
                cfg.max_frame_len
            )));
        }
        let socket = bind_socket(cfg.listen)?;
        socket
            .set_read_timeout(Some(
                cfg.recv_timeout.map_or(WAKE_TICK, |t| t.min(WAKE_TICK)).max(Duration::from_millis(1)),
            ))
            .map_err(|source| UdpError::Socket { call: "setsockopt(SO_RCVTIMEO)", addr: cfg.listen, source })?;
        let gro = cfg.gro && enable_gro(socket.as_fd());
        let reserved = if cfg.original_compat { 0 } else { flags::LEAP };
        let sender = UdpSender::new(&socket, cfg.next, cfg.gso, reserved);
        log::debug!("udp {}: GSO {}, GRO {}", cfg.listen, sender.gso(), gro);
        // With GRO one slot may hold a 64 KiB super-datagram.
        let rx = if gro { RxBatch::new(16, 65536) } else { RxBatch::new(64, CHUNK_DATAGRAM_MAX + 1) };
        Ok(Self {
            reasm: Reassembler::with_window(cfg.max_frame_len, cfg.window),
            socket,
            sender,
            rx,
            rx_next: 0,
            gro,
            stats: Stats::default(),
            cfg,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.socket.local_addr().ok().and_then(|a| a.as_socket())
    }

    /// Takes datagrams `rx_next..` of the current batch; returns a complete
    /// frame as soon as one is. After completion, the rest of the batch is
    /// stashed for the next call.
    fn drain_batch(&mut self, out: &mut [u8]) -> Option<Received> {
        let mut done = None;
        while self.rx_next < self.rx.len() {
            let (bytes, meta, src) = self.rx.get(self.rx_next);
            self.rx_next += 1;
            if let Some(prev) = self.cfg.prev
                && src != Some(prev)
            {
                self.reasm.drops_mut().wrong_source += 1;
                continue;
            }
            if meta.truncated {
                self.reasm.drops_mut().oversize += 1;
                continue;
            }
            let seg = if self.gro { meta.segment.map_or(bytes.len(), usize::from).max(1) } else { bytes.len().max(1) };
            for d in bytes.chunks(seg) {
                let (hdr, payload) = match ChunkHeader::parse_data(d) {
                    Ok(x) => x,
                    Err(e) => {
                        self.reasm.drops_mut().count_parse(e);
                        continue;
                    }
                };
                if hdr.kind() == ChunkKind::Nack {
                    // Retransmission is negotiated by the reliability layer;
                    // a NACK reaching a best-effort node is only counted.
                    self.stats.nacks_received += 1;
                    continue;
                }
                let r =
                    if done.is_some() { self.reasm.stash(&hdr, payload) } else { self.reasm.push(&hdr, payload, out) };
                if r != Push::Dropped {
                    self.stats.chunks_received += 1;
                }
                if let Push::Complete(got) = r {
                    // The rest of this batch is stashed for later frames: it
                    // must not stay behind in `rx`, which the next call refills.
                    done = Some(got);
                }
            }
        }
        done
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

impl Transport for UdpTransport {
    fn name(&self) -> &'static str {
        "udp"
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
        let deadline = self.cfg.recv_timeout.map(|t| start + t);
        loop {
            if let Some(got) = self.drain_batch(out) {
                return self.delivered(got);
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
                return Err(TransportError::Timeout(self.cfg.recv_timeout.unwrap_or_default()));
            }
            let spin = now.duration_since(start) < self.cfg.spin;
            self.rx_next = 0;
            self.rx.recv(self.socket.as_fd(), !spin).map_err(|e| TransportError::io("recvmmsg", e))?;
        }
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.cfg.recv_timeout = timeout;
        let tick = timeout.map_or(WAKE_TICK, |t| t.min(WAKE_TICK)).max(Duration::from_millis(1));
        let _ = self.socket.set_read_timeout(Some(tick));
    }

    fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.drops = *self.reasm.drops();
        s
    }
}
