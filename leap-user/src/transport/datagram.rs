//! The part every datagram backend shares: sending frames as chunks through
//! UDP, reassembling received chunks, proving neighbours to be leap nodes,
//! and loss recovery (NACKs, the buffer of recent frames, probes). A backend
//! only supplies the receive path (a UDP socket, AF_XDP sockets, a BPF ring
//! buffer) through [`DatagramLink::recv_with`].
//!
//! On a hostile network:
//! - frames are taken from one source only: the configured previous node,
//!   or else the first source a valid chunk came from, locked for good
//!   (every other source is dropped and counted as `wrong_source`); NACKs
//!   only from the next node, and only once it is proven a leap node;
//! - a neighbour counts as a leap node only once it echoed a random nonce
//!   ([`crate::frame::peer`]); until then leap sends and reads chunks exactly
//!   as the original does (no flags, NACKs, probes or CRC);
//! - between proven leap nodes every frame carries a CRC32C, checked before
//!   delivery;
//! - a NACK costs bounded work: each chunk it names is re-sent at most once,
//!   in paced bursts, and NACKs per frame are limited.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_PAYLOAD_MAX, ChunkHeader, ChunkKind, flags};
use leap_common::hello::{Hello, caps};
use socket2::Socket;

use super::udp::{UdpConfig, UdpSender};
use super::{FrameKind, Received, Result, Stats, TransportError};
use crate::frame::peer::{Peer, random_u64};
use crate::frame::reliable::{
    NACK_ALL, NackAnswer, NackDecision, NackTimer, ProbeTimer, RETX_BURST, RetransmitBuffer, decode_nack, encode_nack,
    ranges,
};
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
    socket: Socket,
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
        let prev_peer = cfg.prev.filter(|&p| p != cfg.next).map(Peer::new);
        Self {
            reasm: Reassembler::with_window(cfg.max_frame_len, cfg.window),
            retx: reliable.then(|| RetransmitBuffer::new(cfg.keep_frames)),
            socket,
            sender,
            stats: Stats::default(),
            nack: NackTimer::default(),
            probe: ProbeTimer::default(),
            done: None,
            prev: cfg.prev,
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
            cfg,
        }
    }

    /// The UDP socket frames leave from.
    pub fn socket(&self) -> &Socket {
        &self.socket
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
        s
    }

    /// Counts a datagram larger than any chunk (truncated by the receive path).
    pub fn count_oversize(&mut self) {
        self.reasm.drops_mut().oversize += 1;
    }

    /// Feeds every datagram of a kernel receive batch to [`Self::datagram`]:
    /// truncated ones are counted as oversize, and with `gro` a coalesced
    /// datagram is cut at its segment size. Returns the datagrams taken as
    /// chunks (hellos not counted).
    pub fn take_batch(&mut self, rx: &crate::sys::udp::RxBatch, gro: bool, out: &mut [u8]) -> u64 {
        self.take_batch_into(rx, gro, Some(out))
    }

    /// As [`Self::take_batch`]; without a buffer every chunk goes to a side
    /// slot of the reassembly.
    fn take_batch_into(&mut self, rx: &crate::sys::udp::RxBatch, gro: bool, mut out: Option<&mut [u8]>) -> u64 {
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
                if self.take(src, d, out.as_deref_mut()) {
                    taken += 1;
                }
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
        if self.stats.frames_sent == 0 && !self.cfg.original_compat {
            self.await_next_proof(FIRST_PROOF_WAIT);
        }
        let now = Instant::now();
        self.send_hellos(now);
        let reserved = self.reserved_for(kind);
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
                self.probe.sent(now, &self.cfg.timers, seq);
                true
            }
            _ => false,
        };
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += (head.len() + tail.len()) as u64;
        match res {
            Ok(chunks) => {
                self.stats.chunks_sent += u64::from(chunks);
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

    /// Takes one received datagram (UDP payload) from `src`.
    pub fn datagram(&mut self, src: Option<SocketAddr>, datagram: &[u8], out: &mut [u8]) {
        self.take(src, datagram, Some(out));
    }

    /// Takes one datagram; returns whether it was meant as a chunk (not a
    /// hello), whatever became of it.
    fn take(&mut self, src: Option<SocketAddr>, datagram: &[u8], out: Option<&mut [u8]>) -> bool {
        self.taken += 1;
        if Hello::is_hello(datagram) {
            self.hello(src, datagram);
            return false;
        }
        self.take_chunk(src, datagram, out);
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
            (None, Some(src)) if hdr.kind() != ChunkKind::Nack => {
                log::info!("taking frames from {src} only (the first source; set the previous node to choose it)");
                self.prev = Some(src);
                if src != self.cfg.next {
                    self.prev_peer = Some(Peer::new(src));
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
                (self.prev_peer.as_mut().expect("checked").on_hello(&h, now, epoch, caps), false, true)
            }
            _ => {
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
                self.reasm.resync();
                self.nack = NackTimer::default();
            }
        }
    }

    /// Before the first frame: gives the next node up to `limit` to prove
    /// that it is a leap node, answering hellos (and keeping any chunks that
    /// arrive) meanwhile. An original next node never answers: it then gets
    /// the original format, from the first frame on, until it does.
    fn await_next_proof(&mut self, limit: Duration) {
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
                    self.take_batch_into(&rx, true, None);
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
        Ok(next)
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

    /// Receives the next frame into `out`. `pump(link, out, wait)` must take
    /// what the receive path holds and feed it to [`Self::datagram`]; with
    /// `Some(d)` it may first sleep up to `d` for something to arrive, with
    /// `None` it must not block.
    ///
    /// # Errors
    ///
    /// [`TransportError::Timeout`] at the deadline, [`TransportError::FrameLost`]
    /// when a frame is given up, or the pump's error (as `call`).
    pub fn recv_with<F>(&mut self, out: &mut [u8], call: &'static str, mut pump: F) -> Result<Received>
    where
        F: FnMut(&mut Self, &mut [u8], Option<Duration>) -> io::Result<()>,
    {
        self.done = None;
        if let Some(got) = self.reasm.begin(out) {
            return self.delivered(got);
        }
        let start = Instant::now();
        let deadline = self.cfg.recv_timeout.map(|t| start + t);
        loop {
            if let Some(got) = self.done.take() {
                return self.delivered(got);
            }
            let now = Instant::now();
            let timer = self.service(now)?;
            if deadline.is_some_and(|d| now >= d) {
                return Err(self.deadline_passed(out));
            }
            let wait = if now.duration_since(start) < self.cfg.spin || std::mem::take(&mut self.drain_first) {
                None
            } else {
                let until = earliest(earliest(timer, deadline), Some(now + WAKE_TICK)).unwrap_or(now);
                Some(until.saturating_duration_since(now).max(Duration::from_micros(50)))
            };
            let before = self.taken;
            pump(self, out, wait).map_err(|e| TransportError::io(call, e))?;
            self.drained = self.taken == before;
        }
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

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
