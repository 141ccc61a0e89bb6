//! The part every datagram backend shares: sending frames as chunks through
//! UDP, reassembling received chunks, proving neighbours to be leap nodes,
//! and loss recovery (NACKs, the buffer of recent frames, probes). A backend
//! only supplies the receive path (a UDP socket, AF_XDP sockets, a BPF ring
//! buffer) through [`DatagramLink::recv_with`].
//!
//! On a hostile network:
//! - frames are taken from one source only: the configured previous node,
//!   or else the first source that proved to be a leap node or sent a valid
//!   chunk, whichever came first, locked (every other
//!   source is dropped and counted as `wrong_source`) until it proves to be
//!   gone and another source proves to be a leap node
//!   ([`crate::frame::relock`]), or the operator releases it; NACKs only
//!   from the next node, and only once it is proven a leap node;
//! - a neighbour counts as a leap node only once it echoed a random nonce
//!   ([`crate::frame::peer`]); until then leap sends and reads chunks exactly
//!   as the original does (no flags, NACKs, probes or CRC);
//! - between proven leap nodes every frame carries a CRC32C, checked before
//!   delivery;
//! - a NACK costs bounded work: each chunk it names is re-sent at most once,
//!   in paced bursts, and NACKs per frame are limited;
//! - a datagram may be a chunk train (several chunks back to back, see
//!   [`leap_common::chunk::train`]): each chunk is taken as if it had come
//!   alone, so a hostile train costs what its chunks sent singly would.
//!   Trains are *sent* only to a next node proven to take them, no longer
//!   than its announced size and the path MTU allow.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_PAYLOAD_MAX, ChunkHeader, ChunkKind, flags};
use leap_common::hello::{Hello, caps};
use socket2::Socket;

pub use super::config::Reliability;
use super::config::UdpConfig;
use super::lend::OwnedBuf;
use super::ready::Readiness;
use super::send::UdpSender;
use super::{FrameKind, Received, Result, Stats, TransportError};
use crate::frame::peer::{Peer, random_u64};
use crate::frame::reliable::{
    NACK_ALL, NackAnswer, NackDecision, NackTimer, ProbeTimer, RETX_BURST, RetransmitBuffer, decode_nack, encode_nack,
    ranges,
};
use crate::frame::relock::SourceLock;
use crate::frame::{Push, Reassembler};

/// Longest a receive sleeps before it looks at its timers again.
const WAKE_TICK: Duration = Duration::from_millis(20);

/// Rate at which queued retransmissions leave, in bytes per second (a burst
/// of [`RETX_BURST`] chunks, then a pause): a NACK for a whole large frame
/// does not become one burst that overflows the receiver again.
const RETX_PACE_BYTES_PER_S: u64 = 500_000_000;

/// How long the first frame waits for the next node to prove that it is a
/// leap node (once per link; an original node costs this once).
const FIRST_PROOF_WAIT: Duration = Duration::from_millis(100);
/// How often the path MTU towards a next node that takes trains is read
/// again (an operator may change an interface's MTU while leap runs).
const MTU_RECHECK: Duration = Duration::from_secs(1);

/// Log lines about the same kind of trouble: at most one a second, with the
/// number of those left out.
#[derive(Debug, Default)]
struct LogLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    fn warn(&mut self, what: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed += 1;
            return;
        }
        if self.suppressed > 0 {
            log::warn!("{what} ({} more like it not shown)", self.suppressed);
        } else {
            log::warn!("{what}");
        }
        self.last = Some(now);
        self.suppressed = 0;
    }
}

/// Sending, reassembly and loss recovery of one datagram backend.
#[derive(Debug)]
pub struct DatagramLink {
    socket: Arc<Socket>,
    sender: UdpSender,
    reasm: Reassembler,
    cfg: UdpConfig,
    stats: Stats,
    retx: Option<RetransmitBuffer>,
    nack: NackTimer,
    probe: ProbeTimer,
    done: Option<Received>,
    /// The previous node: configured, or the first source, locked.
    prev: Option<SocketAddr>,
    /// The lock on the first source, when no previous node is configured
    /// (open until a source proves itself or sends a chunk).
    lock: Option<SourceLock>,
    next_peer: Peer,
    /// `None` while the previous node is unknown, or when it is `next`.
    prev_peer: Option<Peer>,
    epoch: u64,
    caps: u32,
    pace_due: Instant,
    burst: Box<[u16; RETX_BURST]>,
    send_log: LogLimit,
    /// Datagrams taken so far, and whether the last look at the receive
    /// path found it empty: a frame counts as stalled only then (a node
    /// that was not scheduled for a while has its chunks queued, not lost).
    taken: u64,
    drained: bool,
    drain_first: bool,
    nack_buf: Box<[u8; CHUNK_DATAGRAM_MAX]>,
    /// Frames written in place by [`Self::send_with`] that are not kept.
    tx: OwnedBuf,
    /// When the last frame was sent (the driver looks more often then).
    last_send: Option<Instant>,
    /// The first frame waited for the next node's proof (once per link).
    proof_waited: bool,
    /// A socket connected to the next node, to read the path MTU from.
    route: Option<crate::sys::udp::RouteProbe>,
    /// When the trains are sized to the path MTU again.
    mtu_due: Instant,
}

/// A path MTU as the log says it: the number, or "unknown".
struct MtuText(Option<usize>);

impl std::fmt::Display for MtuText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(m) => write!(f, "{m}"),
            None => f.write_str("unknown"),
        }
    }
}

impl DatagramLink {
    /// A link sending from `socket` to `cfg.next`; `gso` allows UDP GSO
    /// (still only if the kernel has it).
    pub fn new(socket: Socket, cfg: UdpConfig, gso: bool) -> Self {
        let reliable = cfg.reliability == Reliability::Reliable && !cfg.original_compat;
        let sender = UdpSender::new(&socket, cfg.next, gso && cfg.gso);
        let mut caps = 0;
        if reliable {
            caps |= caps::RELIABLE;
        }
        if cfg.crc {
            caps |= caps::CRC;
        }
        if cfg.trains && !cfg.original_compat {
            caps = caps::with_train_bytes(caps, cfg.rx_train_bytes);
        }
        let route = match crate::sys::udp::RouteProbe::connect(cfg.listen, cfg.next) {
            Ok(r) => Some(r),
            Err(e) => {
                log::debug!("{}: no route to {} to read the path MTU from ({e})", cfg.listen, cfg.next);
                None
            }
        };
        let prev_peer = cfg.prev.filter(|&p| p != cfg.next).map(Peer::new);
        Self {
            reasm: Reassembler::with_window(cfg.max_frame_len, cfg.window),
            retx: reliable.then(|| RetransmitBuffer::new(cfg.keep_frames)),
            socket: Arc::new(socket),
            sender,
            stats: Stats::default(),
            nack: NackTimer::default(),
            probe: ProbeTimer::default(),
            done: None,
            prev: cfg.prev,
            // Without a previous node, the hellos of the node that will send
            // to us are answered before its first frame (so that it sends
            // that frame as to a leap node, kept for NACKs).
            lock: cfg.prev.is_none().then(|| SourceLock::unlocked(Instant::now())),
            next_peer: Peer::new(cfg.next),
            prev_peer,
            epoch: random_u64(),
            caps,
            pace_due: Instant::now(),
            burst: Box::new([0; RETX_BURST]),
            send_log: LogLimit::default(),
            taken: 0,
            drained: true,
            drain_first: false,
            nack_buf: Box::new([0; CHUNK_DATAGRAM_MAX]),
            tx: OwnedBuf::default(),
            last_send: None,
            proof_waited: false,
            route,
            mtu_due: Instant::now(),
            cfg,
        }
    }

    /// Chunks per datagram to the next node (1 until it proved it takes
    /// trains, and always with trains off).
    pub fn train_chunks(&self) -> usize {
        self.sender.train()
    }

    /// Sizes the trains to the next node after it proved to be a leap node
    /// (again): the largest it takes, within the path MTU, none with trains
    /// off or when it takes none.
    fn size_trains(&mut self) {
        let next = self.cfg.next;
        self.mtu_due = Instant::now() + MTU_RECHECK;
        let Some((k, mtu)) = self.train_fit() else {
            self.sender.set_train(1);
            let why = if self.cfg.trains { "it takes no trains" } else { "trains are off here" };
            log::info!("one chunk per datagram to {next} ({why})");
            return;
        };
        self.sender.set_train(k);
        let mtu = mtu.map_or_else(|| "unknown".into(), |m| m.to_string());
        if k == 1 {
            log::info!("one chunk per datagram to {next} (path MTU {mtu}: no room for a train)");
        } else {
            log::info!("trains of {k} chunks to {next} (path MTU {mtu})");
        }
    }

    /// Chunks per train to the next node and the path MTU they fit (None:
    /// no trains to it, by either side's choice).
    fn train_fit(&self) -> Option<(usize, Option<usize>)> {
        let peer_bytes = self.next_peer.proven().map_or(0, |p| caps::train_bytes(p.caps));
        if !self.cfg.trains || self.cfg.original_compat || peer_bytes == 0 {
            return None;
        }
        let next = self.cfg.next;
        let mtu = self.route.as_ref().and_then(|r| r.mtu().ok());
        let path =
            mtu.map_or(CHUNK_DATAGRAM_MAX, |m| m.saturating_sub(crate::sys::udp::ip_udp_headers(next.is_ipv6())));
        Some((leap_common::chunk::train_chunks_for(peer_bytes.min(path)), mtu))
    }

    /// Sizes the trains to the path MTU again once a second, and at once when
    /// the kernel refused to segment them: an interface whose MTU fell (9000
    /// to 1500, say) gets single chunks, one whose MTU rose gets trains.
    /// Where the trains still fit and the kernel refused them anyway, GSO is
    /// what fails: it is turned off.
    fn recheck_trains(&mut self, now: Instant) {
        let refused = self.sender.take_train_refused();
        if !refused && now < self.mtu_due {
            return;
        }
        self.mtu_due = now + MTU_RECHECK;
        let Some((k, mtu)) = self.train_fit() else { return };
        let (next, was) = (self.cfg.next, self.sender.train());
        // Written only into the log lines: this runs every second on the
        // send path, which allocates nothing.
        let mtu = MtuText(mtu);
        if k != was {
            self.sender.set_train(k);
            log::info!("path MTU to {next} is now {mtu}: {k} chunk(s) per datagram, {was} before");
        } else if refused {
            self.sender.disable_gso(&format_args!("it refused trains of {k} chunks within the path MTU {mtu}"));
        }
    }

    /// The UDP socket frames leave from.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The UDP socket, shared (a receive path waits on it without the link).
    pub fn shared_socket(&self) -> Arc<Socket> {
        Arc::clone(&self.socket)
    }

    /// The settings.
    pub fn config(&self) -> &UdpConfig {
        &self.cfg
    }

    /// Whether GSO is in use.
    pub fn gso(&self) -> bool {
        self.sender.gso()
    }

    /// The previous node frames are taken from (configured, or learned from
    /// the first valid chunk and locked).
    pub fn prev(&self) -> Option<SocketAddr> {
        self.prev
    }

    /// How long the first frame waits for the next node's proof.
    pub const FIRST_PROOF_WAIT: Duration = FIRST_PROOF_WAIT;

    /// Whether the first frame still has to wait for the next node's proof
    /// (see [`Self::FIRST_PROOF_WAIT`]).
    pub fn awaits_proof(&self) -> bool {
        !self.proof_waited && !self.cfg.original_compat && !self.next_is_leap()
    }

    /// Before an event loop waits for the next node's proof its own way:
    /// the next challenge goes out at once (see [`Self::await_next_proof`]).
    #[cfg(feature = "tokio")]
    pub(crate) fn proof_wait_begins(&mut self) {
        self.next_peer.challenge_now();
    }

    /// Marks the wait for the next node's proof as done (an event loop
    /// waited its own way while the driver exchanged hellos).
    pub fn proof_wait_done(&mut self) {
        self.proof_waited = true;
    }

    /// Whether the next node proved to be a leap node.
    pub fn next_is_leap(&self) -> bool {
        self.next_peer.proven().is_some()
    }

    /// Whether the previous node proved to be a leap node.
    pub fn prev_is_leap(&self) -> bool {
        self.prev_proven().is_some()
    }

    fn prev_proven(&self) -> Option<crate::frame::peer::Proven> {
        match (&self.prev_peer, self.prev) {
            (Some(p), _) => p.proven(),
            (None, Some(prev)) if prev == self.cfg.next => self.next_peer.proven(),
            _ => None,
        }
    }

    /// Counters, drops of the reassembly included.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.drops = *self.reasm.drops();
        s.copied_bytes += self.reasm.copied();
        s
    }

    /// Counts a datagram larger than any chunk (truncated by the receive path).
    pub fn count_oversize(&mut self) {
        self.reasm.drops_mut().oversize += 1;
    }

    /// Feeds every datagram of a kernel receive batch to [`Self::train`]:
    /// truncated ones are counted as oversize, and with `gro` a coalesced
    /// datagram is cut at its segment size; each piece may be a chunk
    /// train. Returns the chunks the datagrams carried (hellos not
    /// counted). The XDP backends' UDP socket (no GRO) uses it for what
    /// their program passes.
    /// Without a buffer every chunk goes to a side slot of the reassembly.
    pub fn take_batch(&mut self, rx: &crate::sys::udp::RxBatch, gro: bool, mut out: Option<&mut [u8]>) -> u64 {
        if let Some(d) = rx.kernel_drops() {
            self.stats.kernel_drops = u64::from(d);
        }
        let mut taken = 0;
        for i in 0..rx.len() {
            let (bytes, meta, src) = rx.get(i);
            if meta.truncated {
                self.count_oversize();
                continue;
            }
            let seg = if gro { meta.segment.map_or(bytes.len(), usize::from).max(1) } else { bytes.len().max(1) };
            for d in bytes.chunks(seg) {
                taken += self.train(src, d, out.as_deref_mut());
            }
        }
        taken
    }

    /// The drop counters of the receive path, for refusals before a
    /// datagram reaches [`Self::datagram`].
    pub fn drops_mut(&mut self) -> &mut super::Drops {
        self.reasm.drops_mut()
    }

    /// Counts datagrams the receive path could not even parse as UDP.
    pub fn count_foreign(&mut self, n: u64) {
        self.reasm.drops_mut().short += n;
    }

    /// Sets the receive deadline.
    pub fn set_recv_timeout(&mut self, t: Option<Duration>) {
        self.cfg.recv_timeout = t;
    }

    /// The `reserved` field for a frame of `kind` to the next node: exactly
    /// the original's 0 until the next node proved to be a leap node.
    fn reserved_for(&self, kind: FrameKind) -> u16 {
        let Some(next) = self.next_peer.proven().filter(|_| !self.cfg.original_compat) else { return 0 };
        let mut r = flags::LEAP;
        if self.retx.is_some() {
            r |= flags::RELIABLE;
        }
        if self.cfg.crc && next.caps & caps::CRC != 0 {
            r |= flags::CRC;
        }
        if kind == FrameKind::Control {
            r |= ChunkKind::Control as u16;
        }
        r
    }

    /// Sends a frame to the next node (and keeps it for NACKs).
    ///
    /// Every attempt uses up a seq, so chunks of a frame that failed half-way
    /// never mix with the next frame. A send error after which the frame is
    /// kept for NACKs (reliable mode, leap next node) counts as loss: it is
    /// counted, logged at most once a second, and the frame is recovered like
    /// any lost chunk.
    ///
    /// # Errors
    ///
    /// As [`UdpSender::send`], unless the frame can be recovered by NACKs.
    pub fn send(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> Result<()> {
        let reserved = self.prepare_send(kind);
        let crc;
        let trailer: &[u8] = if reserved & flags::CRC != 0 {
            crc = crc32c::crc32c_append(crc32c::crc32c(head), tail).to_le_bytes();
            &crc
        } else {
            &[]
        };
        let seq = self.sender.next_seq();
        let res = self.sender.send(&self.socket, reserved, head, tail, trailer);
        if matches!(res, Err(TransportError::BadFrameLen(_))) {
            return res.map(drop);
        }
        let kept = match &mut self.retx {
            Some(retx) if reserved & flags::LEAP != 0 => {
                retx.store(seq, reserved, head, tail, trailer);
                self.stats.copied_bytes += (head.len() + tail.len()) as u64;
                true
            }
            _ => false,
        };
        self.sent(seq, kept, head.len() + tail.len(), res)
    }

    /// As [`Self::send`] for a frame of `len` bytes that `fill` writes in
    /// place: into the slot that keeps it for NACKs when it is kept, else
    /// into a buffer of the link. Sent from there, never copied.
    ///
    /// # Errors
    ///
    /// As [`Self::send`].
    pub fn send_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let mut slot = self.begin_send(kind, len)?;
        fill(slot.buf());
        self.finish_send(slot)
    }

    /// The first half of [`Self::send_with`]: the memory to write a frame of
    /// `len` bytes into, handed out so that the link need not stay locked
    /// while the caller writes (computes) it. Pass it to
    /// [`Self::finish_send`] before any other frame is sent.
    ///
    /// # Errors
    ///
    /// [`TransportError::BadFrameLen`].
    pub fn begin_send(&mut self, kind: FrameKind, len: usize) -> Result<SendSlot> {
        if len == 0 || len > leap_common::chunk::FRAME_LEN_MAX {
            return Err(TransportError::BadFrameLen(len));
        }
        let reserved = self.prepare_send(kind);
        let seq = self.sender.next_seq();
        let keep = reserved & flags::LEAP != 0 && self.retx.is_some();
        let mut buf = match (&mut self.retx, keep) {
            (Some(retx), true) => retx.take_slot(seq, len),
            _ => std::mem::take(&mut self.tx).into_vec(),
        };
        if buf.len() < len {
            buf.resize(len, 0);
        }
        Ok(SendSlot { seq, reserved, keep, len, buf })
    }

    /// Sends the frame written into `slot` (see [`Self::begin_send`]).
    ///
    /// # Errors
    ///
    /// As [`Self::send`].
    pub fn finish_send(&mut self, slot: SendSlot) -> Result<()> {
        let SendSlot { seq, reserved, keep, len, buf } = slot;
        debug_assert_eq!(seq, self.sender.next_seq(), "another frame was sent between begin_send and finish_send");
        let frame = &buf[..len];
        let crc;
        let trailer: &[u8] = if reserved & flags::CRC != 0 {
            crc = crc32c::crc32c(frame).to_le_bytes();
            &crc
        } else {
            &[]
        };
        let res = self.sender.send(&self.socket, reserved, frame, &[], trailer);
        match (&mut self.retx, keep) {
            (Some(retx), true) => {
                retx.put_slot(seq, buf);
                retx.commit(seq, reserved, len, trailer);
            }
            _ => self.tx = OwnedBuf::from_vec(buf),
        }
        self.sent(seq, keep, len, res)
    }

    /// Gives back the memory of a frame begun with [`Self::begin_send`] and
    /// not sent (its seq stays unused).
    pub fn discard_send(&mut self, slot: SendSlot) {
        match (&mut self.retx, slot.keep) {
            (Some(retx), true) => retx.put_slot(slot.seq, slot.buf),
            _ => self.tx = OwnedBuf::from_vec(slot.buf),
        }
    }

    /// Before a frame leaves: the first waits for the next node's proof,
    /// challenges go out when due. Returns the frame's `reserved` field.
    fn prepare_send(&mut self, kind: FrameKind) -> u16 {
        if !self.proof_waited && !self.cfg.original_compat {
            self.await_next_proof(FIRST_PROOF_WAIT);
        }
        self.send_hellos(Instant::now());
        self.reserved_for(kind)
    }

    /// Counts a frame sent (or attempted) as `seq`; a failed send of a kept
    /// frame is recovered by NACKs.
    fn sent(&mut self, seq: u16, kept: bool, len: usize, res: Result<super::send::Sent>) -> Result<()> {
        let now = Instant::now();
        if kept {
            self.probe.sent(now, &self.cfg.timers, seq);
        }
        self.last_send = Some(now);
        self.recheck_trains(now);
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += len as u64;
        match res {
            Ok(sent) => {
                self.stats.chunks_sent += u64::from(sent.chunks);
                self.stats.datagrams_sent += u64::from(sent.datagrams);
                Ok(())
            }
            Err(e) => {
                self.stats.send_errors += 1;
                if kept {
                    self.send_log.warn(format_args!("sending frame seq {seq} failed ({e}); recovering it by NACKs"));
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Takes one received datagram (UDP payload) from `src`: a chunk of the
    /// expected frame goes into `out`, others (and all without `out`) to
    /// side slots of the reassembly.
    pub fn datagram(&mut self, src: Option<SocketAddr>, datagram: &[u8], out: Option<&mut [u8]>) {
        self.take(src, datagram, out);
    }

    /// Takes one datagram that may be a chunk train
    /// ([`leap_common::chunk::train`]; [`Self::take`] splits it) and returns
    /// the chunks it was meant to carry: 0 for a hello or a datagram longer
    /// than any train (counted as oversize).
    pub fn train(&mut self, src: Option<SocketAddr>, datagram: &[u8], out: Option<&mut [u8]>) -> u64 {
        if !self.take(src, datagram, out) {
            return 0;
        }
        if datagram.len() <= CHUNK_DATAGRAM_MAX || self.cfg.original_compat {
            return 1;
        }
        leap_common::chunk::train(datagram).map_or(0, |t| t.count() as u64)
    }

    /// Takes one datagram, a single chunk or a train of them (each taken
    /// on its own); returns whether it was meant as chunks (not a hello),
    /// whatever became of it. A datagram longer than any train is dropped
    /// and counted as oversize.
    fn take(&mut self, src: Option<SocketAddr>, datagram: &[u8], mut out: Option<&mut [u8]>) -> bool {
        self.taken += 1;
        if Hello::is_hello(datagram) {
            self.hello(src, datagram);
            return false;
        }
        if datagram.len() <= CHUNK_DATAGRAM_MAX || self.cfg.original_compat {
            // What the original sends (and all an original-compatible node
            // reads: a longer datagram fails the chunk's length check).
            self.take_chunk(src, datagram, out);
            return true;
        }
        match leap_common::chunk::train(datagram) {
            Ok(train) => {
                for chunk in train {
                    self.take_chunk(src, chunk, out.as_deref_mut());
                }
            }
            Err(e) => self.reasm.drops_mut().count_parse(e),
        }
        true
    }

    fn take_chunk(&mut self, src: Option<SocketAddr>, datagram: &[u8], out: Option<&mut [u8]>) {
        let (mut hdr, payload) = match ChunkHeader::parse(datagram) {
            Ok(x) => x,
            Err(e) => return self.reasm.drops_mut().count_parse(e),
        };
        let from_next = src == Some(self.cfg.nack_from.unwrap_or(self.cfg.next));
        if hdr.kind() == ChunkKind::Nack && from_next && self.next_is_leap() && !self.cfg.original_compat {
            self.stats.nacks_received += 1;
            self.answer_nack(&hdr, payload);
            return;
        }
        match (self.prev, src) {
            (Some(prev), Some(src)) if prev == src => {}
            (None, Some(_)) if self.lock.as_ref().is_some_and(|l| !l.chunk_may_take(Instant::now())) => {
                // Released by the operator: a proven leap node first.
                self.reasm.drops_mut().wrong_source += 1;
                return;
            }
            (None, Some(src)) if hdr.kind() != ChunkKind::Nack => {
                log::info!("taking frames from {src} only (the first source; set the previous node to choose it)");
                self.prev = Some(src);
                // The source that hellos before its frame: its proof goes on.
                let candidate = self.lock.take().and_then(|mut l| l.take_candidate(src));
                if src != self.cfg.next {
                    self.prev_peer = Some(candidate.unwrap_or_else(|| Peer::new(src)));
                    self.lock = Some(SourceLock::new(src, Instant::now(), self.stats.chunks_received));
                }
            }
            _ => {
                self.reasm.drops_mut().wrong_source += 1;
                return;
            }
        }
        if self.prev_proven().is_none() || self.cfg.original_compat {
            // Not proven a leap node: read the chunk as the original would,
            // whatever its `reserved` says (the original echoes ours).
            hdr.reserved = 0;
        } else if hdr.kind() == ChunkKind::Nack {
            // A NACK from the previous node is meaningless: it sends to us.
            self.reasm.drops_mut().wrong_source += 1;
            return;
        }
        // Data rule: every chunk but the last of a frame is full.
        let last = hdr.chunk_id + 1 == hdr.total_chunks;
        if (last && payload.is_empty()) || (!last && payload.len() != CHUNK_PAYLOAD_MAX) {
            self.reasm.drops_mut().bad_length += 1;
            return;
        }
        let r = match out {
            Some(out) if self.done.is_none() => self.reasm.push(&hdr, payload, out),
            _ => self.reasm.stash(&hdr, payload),
        };
        if r != Push::Dropped {
            self.stats.chunks_received += 1;
            if hdr.reserved & flags::RETRANSMIT != 0 {
                self.stats.chunks_recovered += 1;
            }
            // Out of the receive path's buffer into the frame's.
            self.stats.copied_bytes += payload.len() as u64;
        }
        if let Push::Complete(got) = r {
            self.done = Some(got);
        }
    }

    /// A hello from `src`: answered, and it may prove a neighbour (or its
    /// restart).
    fn hello(&mut self, src: Option<SocketAddr>, datagram: &[u8]) {
        if self.cfg.original_compat {
            // Exactly the original: it ignores what is not a chunk.
            self.reasm.drops_mut().bad_magic += 1;
            return;
        }
        let Ok(h) = Hello::parse(datagram) else {
            self.reasm.drops_mut().bad_magic += 1;
            return;
        };
        let now = Instant::now();
        let (epoch, caps) = (self.epoch, self.caps);
        let (outcome, is_next, is_prev) = match src {
            Some(a) if a == self.cfg.next => {
                (self.next_peer.on_hello(&h, now, epoch, caps), true, self.prev == Some(a))
            }
            Some(a) if self.prev_peer.as_ref().is_some_and(|p| p.addr() == a) => {
                if let Some(lock) = &mut self.lock
                    && lock.locked_hello(&h)
                {
                    log::info!("previous node {a} answered: it keeps the lock");
                }
                (self.prev_peer.as_mut().expect("checked").on_hello(&h, now, epoch, caps), false, true)
            }
            Some(a) => return self.stranger_hello(a, &h, now),
            None => {
                self.reasm.drops_mut().wrong_source += 1;
                return;
            }
        };
        self.stats.hellos_received += 1;
        if let (Some(reply), Some(to)) = (outcome.reply, src) {
            self.send_hello(&reply, to);
        }
        if outcome.proven {
            log::info!(
                "{} node {} is a leap node{}",
                if is_next { "next" } else { "previous" },
                src.map_or_else(String::new, |a| a.to_string()),
                if outcome.restarted { " (restarted)" } else { "" }
            );
            if is_next {
                self.size_trains();
            }
        }
        if outcome.proven && !outcome.restarted && is_prev && self.stats.frames_received == 0 {
            // Whatever came from that address before it was proven (a
            // spoofer's chunks, say) may have locked the reassembly onto a
            // seq the real sender never uses: start from its chunks.
            self.reasm.resync();
        }
        if outcome.restarted {
            if is_next && let Some(retx) = &mut self.retx {
                // Its frames went to the old process.
                retx.clear();
                self.probe = ProbeTimer::default();
            }
            if is_prev {
                self.restart_prev();
            }
        }
    }

    /// A hello from a source that is neither neighbour: while the source
    /// lock may be moving ([`SourceLock::stranger_hello`]), answered and
    /// challenged; dropped otherwise.
    fn stranger_hello(&mut self, src: SocketAddr, h: &Hello, now: Instant) {
        let leap = self.prev_is_leap();
        let (chunks, epoch, caps) = (self.stats.chunks_received, self.epoch, self.caps);
        let Some(lock) = &mut self.lock else {
            self.reasm.drops_mut().wrong_source += 1;
            return;
        };
        lock.observe(now, chunks);
        let Some(out) = lock.stranger_hello(src, h, now, leap, (epoch, caps)) else {
            self.reasm.drops_mut().wrong_source += 1;
            return;
        };
        self.stats.hellos_received += 1;
        if let Some(reply) = out.reply {
            self.send_hello(&reply, src);
        }
        if let Some((probe, locked)) = out.probe {
            log::info!(
                "{src} proved to be a leap node while {locked} was quiet; asking {locked} whether it is still there"
            );
            self.send_hello(&probe, locked);
        }
        // Nothing locked (at start, or released): a source that just proved
        // itself takes the lock now, before the chunks of its first frame
        // (the receive path hands them over next, maybe in the same batch).
        self.relock(now);
    }

    /// Moves the source lock to a proven candidate once the locked source
    /// left its probe unanswered; returns when to look again.
    fn relock(&mut self, now: Instant) -> Option<Instant> {
        let lock = self.lock.as_mut()?;
        let first = lock.never_held();
        let Some((peer, old)) = lock.poll(now) else { return lock.due() };
        match old {
            None if first => log::info!(
                "taking frames from {} only (the first source, a leap node; set the previous node to choose it)",
                peer.addr()
            ),
            Some(old) => log::warn!(
                "previous node {old} did not answer for {:?}; taking frames from {} instead, which proved to be a leap node",
                crate::frame::relock::PROBE_WAIT,
                peer.addr()
            ),
            None => log::warn!("taking frames from {}, which proved to be a leap node", peer.addr()),
        }
        self.prev = Some(peer.addr());
        self.prev_peer = Some(peer);
        self.restart_prev();
        None
    }

    /// Frames from the previous node start afresh (it restarted, or another
    /// node took its place): reassembly takes its next chunks, NACK timers
    /// start over.
    fn restart_prev(&mut self) {
        self.reasm.resync();
        self.nack = NackTimer::default();
    }

    /// Releases a lock taken on the first source (no previous node
    /// configured): the next valid chunk's source is taken again. Returns
    /// the source that held it.
    pub fn release_source(&mut self) -> Option<SocketAddr> {
        let old = self.lock.as_ref()?.source()?;
        self.lock = Some(SourceLock::released(Instant::now()));
        self.prev = None;
        self.prev_peer = None;
        self.restart_prev();
        log::warn!(
            "released the lock on {old}: frames are taken from the first source that proves to be a leap node \
             within {:?}, then from the first that sends a valid chunk",
            crate::frame::relock::RELEASE_PROOF_WINDOW
        );
        Some(old)
    }

    /// Before the first frame: gives the next node up to `limit` to prove
    /// that it is a leap node, answering hellos (and keeping any chunks that
    /// arrive) meanwhile. An original next node never answers: it then gets
    /// the original format, from the first frame on, until it does.
    fn await_next_proof(&mut self, limit: Duration) {
        self.proof_waited = true;
        // Challenges sent before the next node listened were lost, and left
        // the next one up to a second away: ask now.
        self.next_peer.challenge_now();
        let start = Instant::now();
        let mut rx = crate::sys::udp::RxBatch::new(4, 65536);
        while !self.next_is_leap() {
            let now = Instant::now();
            if now >= start + limit {
                log::info!(
                    "next node {} did not prove to be a leap node within {limit:?}; \
                     sending it the original format until it does",
                    self.cfg.next
                );
                return;
            }
            let due = earliest(self.send_hellos(now), Some(start + limit)).unwrap_or(now);
            let fd = self.socket.as_fd();
            let wait = due.saturating_duration_since(now).max(Duration::from_micros(50));
            if crate::sys::udp::wait_readable(fd, wait).is_err() {
                return;
            }
            match rx.recv(fd, false) {
                // The kernel reports GRO segments only where GRO is on.
                Ok(_) => {
                    self.take_batch(&rx, true, None);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }

    fn send_hello(&mut self, h: &Hello, to: SocketAddr) {
        match self.socket.send_to(&h.to_bytes(), &to.into()) {
            Ok(_) => self.stats.hellos_sent += 1,
            Err(e) => {
                self.stats.send_errors += 1;
                self.send_log.warn(format_args!("hello to {to} failed: {e}"));
            }
        }
    }

    /// Sends the challenges that are due; returns when the next one is.
    fn send_hellos(&mut self, now: Instant) -> Option<Instant> {
        if self.cfg.original_compat {
            return None;
        }
        let (epoch, caps) = (self.epoch, self.caps);
        let (h, mut due) = self.next_peer.challenge(now, epoch, caps);
        due = earliest(due, self.relock(now));
        if let Some(h) = h {
            self.send_hello(&h, self.cfg.next);
        }
        if let Some(p) = &mut self.prev_peer {
            let (h, d) = p.challenge(now, epoch, caps);
            let to = p.addr();
            due = earliest(due, d);
            if let Some(h) = h {
                self.send_hello(&h, to);
            }
        }
        due
    }

    fn answer_nack(&mut self, hdr: &ChunkHeader, payload: &[u8]) {
        let Some(retx) = &mut self.retx else { return };
        let Some(ranges) = decode_nack(hdr, payload) else {
            self.reasm.drops_mut().bad_length += 1;
            return;
        };
        let now = Instant::now();
        match retx.request(hdr.seq, ranges, now) {
            NackAnswer::Queued(_) => {
                self.pace_retransmits(now);
            }
            NackAnswer::Unknown => self.stats.nacks_unknown += 1,
            NackAnswer::Refused => self.stats.nacks_refused += 1,
        }
    }

    /// Sends one burst of queued retransmissions if the pace allows; returns
    /// when the next burst is due.
    fn pace_retransmits(&mut self, now: Instant) -> Option<Instant> {
        let retx = self.retx.as_mut()?;
        if !retx.has_pending() {
            return None;
        }
        if now < self.pace_due {
            return Some(self.pace_due);
        }
        let (seq, n) = retx.next_burst(&mut self.burst[..], now)?;
        let (frame, reserved, trailer) = retx.get(seq)?;
        let bytes = (n * CHUNK_DATAGRAM_MAX) as u64;
        self.pace_due = now + Duration::from_nanos(bytes * 1_000_000_000 / RETX_PACE_BYTES_PER_S);
        match self.sender.resend(&self.socket, seq, reserved, frame, trailer, self.burst[..n].iter().copied()) {
            Ok(sent) => self.stats.retransmits += sent,
            Err(e) => {
                self.stats.send_errors += 1;
                self.send_log.warn(format_args!("retransmission of seq {seq} failed: {e}"));
            }
        }
        retx.has_pending().then_some(self.pace_due)
    }

    fn send_nack(&mut self, seq: u16, all: bool) {
        let Some(to) = self.prev else { return };
        let len = if all || self.reasm.progress().1 == 0 {
            encode_nack(seq, [NACK_ALL], &mut self.nack_buf)
        } else if self.nack.attempts() <= 1 && !self.reasm.saw_ahead() {
            // First ask only for the holes: the tail may still be coming
            // (the next NACK, or the sender's probe, covers it).
            encode_nack(seq, ranges(self.reasm.holes()), &mut self.nack_buf)
        } else {
            encode_nack(seq, ranges(self.reasm.missing()), &mut self.nack_buf)
        };
        if len == 0 {
            return;
        }
        match self.socket.send_to(&self.nack_buf[..len], &to.into()) {
            Ok(_) => self.stats.nacks_sent += 1,
            Err(e) => {
                self.stats.send_errors += 1;
                self.send_log.warn(format_args!("NACK to {to} failed: {e}"));
            }
        }
    }

    /// NACKs what later frames lack (once each while they wait): with many
    /// frames in flight their losses are then recovered together with the
    /// expected frame's.
    fn nack_gaps_ahead(&mut self) {
        let Some(to) = self.prev else { return };
        let (buf, socket, stats, log) = (&mut self.nack_buf, &self.socket, &mut self.stats, &mut self.send_log);
        self.reasm.gaps_ahead(|seq, ids| {
            let len = encode_nack(seq, ranges(ids), buf);
            match socket.send_to(&buf[..len], &to.into()) {
                Ok(_) => stats.nacks_sent += 1,
                Err(e) => {
                    stats.send_errors += 1;
                    log.warn(format_args!("NACK to {to} failed: {e}"));
                }
            }
        });
    }

    /// Whether lost chunks of the previous node's frames can be fetched again.
    fn recovering(&self) -> bool {
        self.cfg.reliability == Reliability::Reliable
            && !self.cfg.original_compat
            && self.prev_is_leap()
            && self.reasm.peer_reliable()
    }

    /// Runs the timers: challenges, NACKs of the expected frame, probes of
    /// the last frame sent, paced retransmissions. Returns when to look again.
    fn service(&mut self, now: Instant) -> Result<Option<Instant>> {
        let mut next = self.send_hellos(now);
        if let Some(seq) = self.reasm.take_corrupt() {
            if self.recovering() {
                // The CRC failed: every chunk is suspect, fetch them all.
                self.send_nack(seq, true);
            } else {
                return Err(self.lost());
            }
        }
        let stalled = self.reasm.has_partial() || self.reasm.saw_ahead() || self.reasm.is_overtaken();
        if stalled && !self.drained {
            // A frame may look stalled only because its chunks wait in the
            // receive path (a node that was not scheduled for a while):
            // look there first, without sleeping.
            self.drain_first = true;
        } else if let Some(exp) = self.reasm.expected()
            && self.recovering()
        {
            // Chunks far beyond the window show the sender moved on as well
            // (a window smaller than the frames in flight): without a NACK
            // the expected frame would never come.
            let ahead = self.reasm.saw_ahead() || self.reasm.is_overtaken();
            match self.nack.poll(now, &self.cfg.timers, exp, self.reasm.progress(), ahead) {
                NackDecision::Wait(t) => next = earliest(next, t),
                NackDecision::Send => {
                    self.send_nack(exp, false);
                    self.nack_gaps_ahead();
                    next = earliest(next, Some(now + self.cfg.timers.nack_delay));
                }
                NackDecision::GiveUp => return Err(self.lost()),
            }
        } else if let Some(exp) = self.reasm.expected()
            && self.reasm.has_partial()
        {
            // Best effort: nobody will send the missing chunks. Give the
            // frame up once the sender has moved on or it has been idle.
            let idle = self.nack.track(now, exp, self.reasm.progress());
            let limit = self.cfg.timers.best_effort_idle;
            if self.reasm.saw_ahead() || self.reasm.is_overtaken() || idle >= limit {
                return Err(self.lost());
            }
            next = earliest(next, Some(now + (limit - idle)));
        } else if self.reasm.is_overtaken() {
            return Err(self.lost());
        }
        if self.retx.is_some() && self.next_is_leap() {
            next = earliest(next, self.service_sender(now));
        }
        Ok(next)
    }

    /// Probes of the last frame sent and paced retransmissions; returns when
    /// to look again.
    fn service_sender(&mut self, now: Instant) -> Option<Instant> {
        let mut next = None;
        {
            let (probe, due) = self.probe.poll(now, &self.cfg.timers);
            if let Some(seq) = probe
                && let Some((frame, reserved, trailer)) = self.retx.as_ref().and_then(|r| r.get(seq))
            {
                let stream = frame.len() + trailer.len();
                let last = leap_common::chunk::chunks_for(stream).unwrap_or(1) - 1;
                match self.sender.resend(&self.socket, seq, reserved, frame, trailer, std::iter::once(last)) {
                    Ok(n) => self.stats.probes += n,
                    Err(e) => {
                        self.stats.send_errors += 1;
                        self.send_log.warn(format_args!("probe of seq {seq} failed: {e}"));
                    }
                }
            }
            next = earliest(next, due);
            next = earliest(next, self.pace_retransmits(now));
        }
        next
    }

    /// What the driver does while the caller is away (computing): hellos,
    /// NACKs of the expected frame, probes, paced retransmissions (NACKs from
    /// the next node were answered as they were drained). Frames are given
    /// up only inside a receive call, which reports it: returns whether a
    /// receive would now give one up (for [`Self::deliverable`]).
    fn service_background(&mut self, now: Instant) -> bool {
        self.send_hellos(now);
        let mut loss_due = false;
        if self.recovering() {
            if let Some(seq) = self.reasm.take_corrupt() {
                self.send_nack(seq, true);
            } else if let Some(exp) = self.reasm.expected() {
                match self.nack.poll(now, &self.cfg.timers, exp, self.reasm.progress(), self.reasm.saw_ahead()) {
                    NackDecision::Send => self.send_nack(exp, false),
                    NackDecision::GiveUp => loss_due = true,
                    NackDecision::Wait(_) => {}
                }
            }
        } else if let Some(exp) = self.reasm.expected()
            && self.reasm.has_partial()
        {
            // Best effort, as `service` decides inside a receive call.
            let idle = self.nack.track(now, exp, self.reasm.progress());
            loss_due = self.reasm.saw_ahead() || self.reasm.is_overtaken() || idle >= self.cfg.timers.best_effort_idle;
        }
        if self.retx.is_some() && self.next_is_leap() {
            self.service_sender(now);
        }
        loss_due || self.reasm.is_overtaken() || (self.reasm.is_corrupt() && !self.recovering())
    }

    /// Whether a receive would deliver a frame at once (the driver completed
    /// it, or a receive took it off the wire with the one it delivered).
    fn deliverable(&self) -> bool {
        self.done.is_some() || self.reasm.ready()
    }

    /// Whether the driver should look often: a frame is being assembled,
    /// retransmissions wait, or a frame left recently (NACKs may come).
    fn busy(&self, now: Instant) -> bool {
        self.reasm.has_partial()
            || self.retx.as_ref().is_some_and(RetransmitBuffer::has_pending)
            || self.last_send.is_some_and(|t| now.duration_since(t) < BUSY_AFTER_SEND)
    }

    fn lost(&mut self) -> TransportError {
        let lost = self.reasm.abandon();
        self.stats.frames_lost += 1;
        TransportError::FrameLost { seq: lost.seq, missing: lost.missing, total: lost.total }
    }

    fn delivered(&mut self, got: Received) -> Result<Received> {
        self.stats.frames_received += 1;
        self.stats.bytes_received += got.len as u64;
        Ok(got)
    }

    fn deadline_passed(&mut self, out: &[u8]) -> TransportError {
        self.stats.timeouts += 1;
        if self.reasm.has_partial() && !self.recovering() {
            return self.lost();
        }
        // A proven leap node's restart is proven by its hellos; only an
        // original sender's is inferred, from a long run of old seqs.
        if self.prev_proven().is_none() && self.reasm.resync_if_restarted() {
            log::info!("previous node restarted (its seqs started over); following it");
        }
        self.reasm.suspend(out);
        TransportError::Timeout(self.cfg.recv_timeout.unwrap_or_default())
    }
}

/// A frame being written in place, between [`DatagramLink::begin_send`] and
/// [`DatagramLink::finish_send`].
#[derive(Debug)]
pub struct SendSlot {
    seq: u16,
    reserved: u16,
    keep: bool,
    len: usize,
    buf: Vec<u8>,
}

impl SendSlot {
    /// The frame's bytes, to write (they hold whatever an earlier frame
    /// left).
    pub fn buf(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

/// How long after sending a frame the driver keeps looking every
/// [`DRIVE_TICK`] (the next node's NACKs for it come within that).
const BUSY_AFTER_SEND: Duration = Duration::from_secs(1);

/// What a datagram backend receives from (a UDP socket, AF_XDP sockets, a
/// BPF ring buffer): it waits without holding the link, then hands what
/// arrived to the link.
pub trait RxPath: Send {
    /// Sleeps until something may have arrived, at most `wait` (it may also
    /// receive already, to hand over in the next [`Self::drain`]).
    ///
    /// # Errors
    ///
    /// The failed system call.
    fn wait(&mut self, wait: Duration) -> io::Result<()>;

    /// Takes what arrived, without blocking, into `link`: the expected
    /// frame's chunks into `out`, everything else (all of it without `out`)
    /// into side slots.
    ///
    /// # Errors
    ///
    /// The failed system call.
    fn drain(&mut self, link: &mut DatagramLink, out: Option<&mut [u8]>) -> io::Result<()>;

    /// A descriptor that becomes readable when [`Self::drain`] may find
    /// something (a duplicate of the socket, or an epoll set).
    ///
    /// # Errors
    ///
    /// The failed system call.
    fn ready_fd(&self) -> io::Result<std::os::fd::OwnedFd>;

    /// Before waiting on [`Self::ready_fd`] outside [`Self::wait`].
    fn prepare_wait(&mut self) {}
}

/// Locks the link; a panic elsewhere while it was held leaves counters and
/// buffers that are still memory-safe to use.
pub(crate) fn lock(link: &Mutex<DatagramLink>) -> MutexGuard<'_, DatagramLink> {
    link.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A receive call in progress: when it started and its deadline.
#[derive(Clone, Copy, Debug)]
pub struct RecvCall {
    start: Instant,
    deadline: Option<Instant>,
    /// A zero deadline: poll once (see [`super::Transport::set_recv_timeout`]).
    once: bool,
}

/// What one look at a receive call found.
#[derive(Clone, Copy, Debug)]
enum RecvPoll {
    /// The frame is complete (and counted).
    Ready(Received),
    /// Wait this long for the receive path (`None`: look again at once).
    Wait(Option<Duration>),
}

#[cfg(feature = "tokio")]
/// What a receive step that must not block found (see [`Shared::try_recv`]).
#[derive(Clone, Copy, Debug)]
pub enum TryRecv {
    /// The frame is complete.
    Frame(Received),
    /// Datagrams were taken; look again at once.
    More,
    /// The receive path is empty: wait until it is readable, at most this
    /// long (timers), or not at all with `None`.
    Empty(Option<Duration>),
}

impl DatagramLink {
    /// Starts a receive call into `out`: the frame if it is already there.
    fn recv_begin(&mut self, out: &mut [u8]) -> std::result::Result<Result<Received>, RecvCall> {
        self.done = None;
        let start = Instant::now();
        match self.reasm.begin(out) {
            Some(got) => Ok(self.delivered(got)),
            None => {
                let once = self.cfg.recv_timeout.is_some_and(|t| t.is_zero());
                let deadline = self.cfg.recv_timeout.filter(|_| !once).map(|t| start + t);
                Err(RecvCall { start, deadline, once })
            }
        }
    }

    /// How long a blocking receive looks again at once before it sleeps:
    /// the configured spin, or the busy-poll time when that is longer.
    fn spin(&self) -> Duration {
        self.cfg.spin.max(self.cfg.busy_poll.unwrap_or_default())
    }

    /// Delivers a frame completed by the receive path, or runs the timers
    /// and says how long to wait; `spin`: look again at once for the first
    /// [`Self::spin`] of the call.
    fn recv_poll(&mut self, call: &RecvCall, out: &mut [u8], spin: bool) -> Result<RecvPoll> {
        if let Some(got) = self.done.take() {
            return self.delivered(got).map(RecvPoll::Ready);
        }
        let now = Instant::now();
        let timer = self.service(now)?;
        if call.deadline.is_some_and(|d| now >= d) {
            return Err(self.deadline_passed(out));
        }
        let spinning = spin && now.duration_since(call.start) < self.spin();
        Ok(RecvPoll::Wait(if spinning || std::mem::take(&mut self.drain_first) {
            None
        } else {
            let until = earliest(earliest(timer, call.deadline), Some(now + WAKE_TICK)).unwrap_or(now);
            Some(until.saturating_duration_since(now).max(Duration::from_micros(50)))
        }))
    }

    /// Ends a receive call that polled once and found no complete frame:
    /// what arrived of the expected frame is kept for the next call.
    fn nothing_yet(&mut self, out: &[u8]) -> TransportError {
        self.reasm.suspend(out);
        TransportError::Timeout(Duration::ZERO)
    }

    /// Hands what `rx` holds to the link; returns whether it took anything.
    fn recv_drain<R: RxPath + ?Sized>(&mut self, rx: &mut R, out: &mut [u8], call: &'static str) -> Result<bool> {
        let before = self.taken;
        rx.drain(self, Some(out)).map_err(|e| TransportError::io(call, e))?;
        self.drained = self.taken == before;
        Ok(!self.drained)
    }
}

/// Receives the next frame into `out` through `rx`. The link is locked only
/// while it works, never while `rx` sleeps, so a sender on another thread
/// is not held up by a waiting receiver.
///
/// # Errors
///
/// [`TransportError::Timeout`] at the deadline, [`TransportError::FrameLost`]
/// when a frame is given up, or the receive path's error (as `call`).
pub fn recv<R: RxPath + ?Sized>(
    link: &Mutex<DatagramLink>,
    rx: &mut R,
    out: &mut [u8],
    call: &'static str,
) -> Result<Received> {
    let rc = match lock(link).recv_begin(out) {
        Ok(got) => return got,
        Err(rc) => rc,
    };
    if rc.once {
        return poll_once(link, rx, &rc, out, call);
    }
    loop {
        let poll = lock(link).recv_poll(&rc, out, true)?;
        match poll {
            RecvPoll::Ready(got) => return Ok(got),
            RecvPoll::Wait(Some(w)) => rx.wait(w).map_err(|e| TransportError::io(call, e))?,
            RecvPoll::Wait(None) => {}
        }
        lock(link).recv_drain(rx, out, call)?;
    }
}

/// Batches a receive that polls once takes at most (while each brings
/// something): a flood cannot keep it from returning.
const POLL_ONCE_DRAINS: usize = 1024;

/// A receive call with a zero deadline: takes what has arrived, without
/// waiting, and delivers the frame if that completed it.
fn poll_once<R: RxPath + ?Sized>(
    link: &Mutex<DatagramLink>,
    rx: &mut R,
    rc: &RecvCall,
    out: &mut [u8],
    call: &'static str,
) -> Result<Received> {
    // XDP: wake the kernel's side of the AF_XDP queues and read the UDP
    // socket too (what the program passed).
    rx.prepare_wait();
    for _ in 0..POLL_ONCE_DRAINS {
        let mut l = lock(link);
        let took = l.recv_drain(rx, out, call)?;
        if let RecvPoll::Ready(got) = l.recv_poll(rc, out, false)? {
            return Ok(got);
        }
        if !took {
            break;
        }
    }
    let e = lock(link).nothing_yet(out);
    // The caller waits for readiness next.
    rx.prepare_wait();
    Err(e)
}

/// How often the driver looks while there is recovery work, and while
/// there is none.
pub const DRIVE_TICK: Duration = Duration::from_millis(1);
const IDLE_TICK: Duration = Duration::from_millis(20);

/// The caller must have been out of its receive call this long before the
/// driver steps in (a pipeline that receives again within it never meets
/// the driver).
const DRIVE_GRACE: Duration = Duration::from_millis(1);

/// The receive path with the time the caller last left a receive call.
#[derive(Debug)]
pub struct RxSide<R> {
    path: R,
    left_at: Instant,
}

/// The state a datagram transport's halves and its driver share: the link
/// (sending, reassembly, recovery) and the receive path, each behind its own
/// lock. Lock order: receive path, then link.
#[derive(Debug)]
pub struct Shared<R> {
    link: Mutex<DatagramLink>,
    rx: Mutex<RxSide<R>>,
    /// An async receive call waits for the receive path: the driver stands
    /// back (the call runs the timers and reads the path itself).
    receiving: std::sync::atomic::AtomicBool,
    /// The readiness descriptor, once asked for ([`Self::ready_fd`]).
    ready: std::sync::OnceLock<Readiness>,
}

impl<R: RxPath> Shared<R> {
    /// Shares `link` and `rx`.
    pub fn new(link: DatagramLink, rx: R) -> Arc<Self> {
        Arc::new(Self {
            link: Mutex::new(link),
            rx: Mutex::new(RxSide { path: rx, left_at: Instant::now() }),
            receiving: std::sync::atomic::AtomicBool::new(false),
            ready: std::sync::OnceLock::new(),
        })
    }

    #[cfg(feature = "tokio")]
    /// Starts a receive call that waits its own way (async): the frame if
    /// it is already there. The driver stands back until [`Self::end_call`].
    pub fn begin_call(&self, out: &mut [u8]) -> std::result::Result<Result<Received>, RecvCall> {
        self.receiving.store(true, std::sync::atomic::Ordering::Release);
        let res = self.link().recv_begin(out);
        if res.is_ok() {
            self.end_call();
        }
        res
    }

    #[cfg(feature = "tokio")]
    /// One step of a receive call that must not block. It never spins
    /// (neither `spin` nor busy polling's spin): an event loop waits for
    /// readiness instead.
    ///
    /// # Errors
    ///
    /// As [`recv`].
    pub fn try_recv(&self, rc: &RecvCall, out: &mut [u8], call: &'static str) -> Result<TryRecv> {
        let mut rx = self.rx();
        let mut link = lock(&self.link);
        let wait = match link.recv_poll(rc, out, false)? {
            RecvPoll::Ready(got) => return Ok(TryRecv::Frame(got)),
            RecvPoll::Wait(w) => w,
        };
        Ok(if link.recv_drain(&mut rx.path, out, call)? { TryRecv::More } else { TryRecv::Empty(wait) })
    }

    #[cfg(feature = "tokio")]
    /// Ends a receive call begun with [`Self::begin_call`] (however it
    /// ended): the driver may step in again.
    pub fn end_call(&self) {
        let mut rx = self.rx();
        rx.left_at = Instant::now();
        self.receiving.store(false, std::sync::atomic::Ordering::Release);
        self.after_call();
        drop(rx);
    }

    #[cfg(feature = "tokio")]
    /// A descriptor that becomes readable when the receive path may have
    /// something (the async layer's own: it runs the timers itself).
    ///
    /// # Errors
    ///
    /// `dup` or `epoll` failed.
    pub fn rx_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.rx().path.ready_fd()
    }

    /// The readiness descriptor of [`super::Transport::ready_fd`]: an epoll
    /// set of the receive path's descriptors and an eventfd that is set
    /// while the link holds a frame to deliver (completed by the driver, or
    /// taken off the wire by a receive with the one it delivered) or a
    /// loss to report, and cleared when a receive begins.
    ///
    /// # Errors
    ///
    /// `dup`, `epoll` or `eventfd` failed.
    pub fn ready_fd(&self) -> io::Result<BorrowedFd<'_>> {
        if let Some(r) = self.ready.get() {
            return Ok(r.fd());
        }
        // The receive path's lock orders this against receives and the
        // driver, which set and clear the eventfd under it.
        let rx = self.rx();
        if self.ready.get().is_none() {
            let r = Readiness::new([], vec![rx.path.ready_fd()?])?;
            r.update(lock(&self.link).deliverable());
            let _ = self.ready.set(r);
        }
        drop(rx);
        Ok(self.ready.get().expect("set above").fd())
    }

    /// A receive call begins (the receive path locked): it will find what
    /// the eventfd said.
    fn before_call(&self) {
        if let Some(r) = self.ready.get() {
            r.clear();
        }
    }

    /// A receive call ended (the receive path locked): frames it took off
    /// the wire beyond the one it delivered make the descriptor readable.
    fn after_call(&self) {
        if let Some(r) = self.ready.get() {
            r.update(lock(&self.link).deliverable());
        }
    }

    #[cfg(feature = "tokio")]
    /// Before an event loop waits on [`Self::ready_fd`]: wakes the kernel's
    /// side where the path needs it (AF_XDP fill rings).
    pub fn prepare_wait(&self) {
        self.rx().path.prepare_wait();
    }

    /// The link, locked.
    pub fn link(&self) -> MutexGuard<'_, DatagramLink> {
        lock(&self.link)
    }

    /// The receive path, locked (waits for a receive call on another thread
    /// to end).
    pub fn rx(&self) -> MutexGuard<'_, RxSide<R>> {
        self.rx.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Receives the next frame into `out` (see [`recv`]).
    ///
    /// # Errors
    ///
    /// As [`recv`].
    pub fn recv(&self, out: &mut [u8], call: &'static str) -> Result<Received> {
        let mut rx = self.rx();
        self.before_call();
        let res = recv(&self.link, &mut rx.path, out, call);
        rx.left_at = Instant::now();
        self.after_call();
        res
    }

    /// One look by the driver: if no receive call runs and the caller has
    /// been away for a while, takes what arrived (answering NACKs) and runs
    /// the recovery timers. Returns when to look again.
    pub fn drive_once(&self) -> Duration {
        let mut rx = match self.rx.try_lock() {
            Ok(rx) => rx,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return DRIVE_TICK,
        };
        let now = Instant::now();
        if now.duration_since(rx.left_at) < DRIVE_GRACE || self.receiving.load(std::sync::atomic::Ordering::Acquire) {
            return DRIVE_TICK;
        }
        let mut link = lock(&self.link);
        let drained = rx.path.wait(Duration::ZERO).and_then(|()| rx.path.drain(&mut link, None));
        if let Err(e) = drained {
            link.send_log.warn(format_args!("the driver's receive failed: {e}"));
        }
        let loss_due = link.service_background(now);
        if let Some(r) = self.ready.get() {
            if loss_due || link.deliverable() {
                // Only set here: a receive call clears it when it begins.
                r.signal();
            }
            // An event loop waits on the receive path's descriptors next.
            rx.path.prepare_wait();
        }
        if link.busy(now) { DRIVE_TICK } else { IDLE_TICK }
    }
}

/// A thread that drives loss recovery while the caller computes (see
/// [`Shared::drive_once`]); stopped and joined when dropped.
#[derive(Debug)]
pub struct Driver {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Driver {
    /// Starts driving `shared` until dropped (or until `shared` is gone).
    ///
    /// # Errors
    ///
    /// The thread could not be spawned.
    pub fn spawn<R: RxPath + 'static>(shared: &Arc<Shared<R>>, name: &str) -> io::Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(shared);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name(format!("leap-drive-{name}")).spawn(move || {
            while !flag.load(Ordering::Acquire) {
                let Some(shared) = weak.upgrade() else { return };
                let tick = shared.drive_once();
                drop(shared);
                std::thread::park_timeout(tick);
            }
        })?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
