//! The part every datagram backend shares: sending frames as chunks through
//! UDP, reassembling received chunks, and loss recovery (NACKs, the buffer
//! of recent frames, probes). A backend only supplies the receive path (a
//! UDP socket, AF_XDP sockets, a BPF ring buffer) through
//! [`DatagramLink::recv_with`].

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, ChunkHeader, ChunkKind, flags};
use socket2::Socket;

use super::udp::{UdpConfig, UdpSender};
use super::{FrameKind, Received, Result, Stats, TransportError};
use crate::frame::reliable::{
    NACK_ALL, NackDecision, NackTimer, ProbeTimer, RetransmitBuffer, decode_nack, encode_nack, ranges,
};
use crate::frame::{Push, Reassembler};

/// Longest a receive sleeps before it looks at its timers again.
const WAKE_TICK: Duration = Duration::from_millis(20);

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
    last_src: Option<SocketAddr>,
    nack_buf: Box<[u8; CHUNK_DATAGRAM_MAX]>,
}

impl DatagramLink {
    /// A link sending from `socket` to `cfg.next`; `gso` allows UDP GSO
    /// (still only if the kernel has it).
    pub fn new(socket: Socket, cfg: UdpConfig, gso: bool) -> Self {
        let reliable = cfg.reliability == Reliability::Reliable && !cfg.original_compat;
        let reserved = match (cfg.original_compat, reliable) {
            (true, _) => 0,
            (false, true) => flags::LEAP | flags::RELIABLE,
            (false, false) => flags::LEAP,
        };
        let sender = UdpSender::new(&socket, cfg.next, gso && cfg.gso, reserved);
        Self {
            reasm: Reassembler::with_window(cfg.max_frame_len, cfg.window),
            retx: reliable.then(|| RetransmitBuffer::new(cfg.keep_frames)),
            socket,
            sender,
            stats: Stats::default(),
            nack: NackTimer::default(),
            probe: ProbeTimer::default(),
            done: None,
            last_src: None,
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
    /// datagram is cut at its segment size. Returns the datagrams taken.
    pub fn take_batch(&mut self, rx: &crate::sys::udp::RxBatch, gro: bool, out: &mut [u8]) -> u64 {
        let mut taken = 0;
        for i in 0..rx.len() {
            let (bytes, meta, src) = rx.get(i);
            if meta.truncated {
                self.count_oversize();
                continue;
            }
            let seg = if gro { meta.segment.map_or(bytes.len(), usize::from).max(1) } else { bytes.len().max(1) };
            for d in bytes.chunks(seg) {
                self.datagram(src, d, out);
                taken += 1;
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

    /// Sends a frame to the next node (and keeps it for NACKs).
    ///
    /// # Errors
    ///
    /// As [`UdpSender::send`].
    pub fn send(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> Result<()> {
        let seq = self.sender.next_seq();
        let chunks = self.sender.send(&self.socket, kind, head, tail)?;
        if let Some(retx) = &mut self.retx {
            retx.store(seq, self.sender.reserved_for(kind), head, tail);
            self.probe.sent(Instant::now(), &self.cfg.timers, seq);
        }
        self.stats.frames_sent += 1;
        self.stats.chunks_sent += u64::from(chunks);
        self.stats.bytes_sent += (head.len() + tail.len()) as u64;
        Ok(())
    }

    /// Takes one received datagram (UDP payload) from `src`.
    pub fn datagram(&mut self, src: Option<SocketAddr>, datagram: &[u8], out: &mut [u8]) {
        let (hdr, payload) = match ChunkHeader::parse(datagram) {
            Ok(x) => x,
            Err(e) => return self.reasm.drops_mut().count_parse(e),
        };
        if hdr.kind() == ChunkKind::Nack {
            let from = self.cfg.nack_from.unwrap_or(self.cfg.next);
            if self.cfg.prev.is_some() && src != Some(from) {
                self.reasm.drops_mut().wrong_source += 1;
                return;
            }
            self.stats.nacks_received += 1;
            self.answer_nack(&hdr, payload);
            return;
        }
        if let Some(prev) = self.cfg.prev
            && src != Some(prev)
        {
            self.reasm.drops_mut().wrong_source += 1;
            return;
        }
        // Data rule: every chunk but the last of a frame is full.
        let last = hdr.chunk_id + 1 == hdr.total_chunks;
        if (last && payload.is_empty()) || (!last && payload.len() != leap_common::chunk::CHUNK_PAYLOAD_MAX) {
            self.reasm.drops_mut().bad_length += 1;
            return;
        }
        self.last_src = src.or(self.last_src);
        let r = if self.done.is_some() { self.reasm.stash(&hdr, payload) } else { self.reasm.push(&hdr, payload, out) };
        if r != Push::Dropped {
            self.stats.chunks_received += 1;
        }
        if let Push::Complete(got) = r {
            self.done = Some(got);
        }
    }

    fn answer_nack(&mut self, hdr: &ChunkHeader, payload: &[u8]) {
        let Some(retx) = &self.retx else { return };
        let Some(ranges) = decode_nack(hdr, payload) else {
            self.reasm.drops_mut().bad_length += 1;
            return;
        };
        let Some((frame, reserved)) = retx.get(hdr.seq) else { return };
        let ids = ranges.flat_map(|(first, count)| {
            let end = if (first, count) == NACK_ALL { u16::MAX } else { first.saturating_add(count) };
            first..end
        });
        match self.sender.resend(&self.socket, hdr.seq, reserved, frame, ids) {
            Ok(n) => self.stats.retransmits += u64::from(n),
            Err(e) => log::debug!("retransmission of seq {} failed: {e}", hdr.seq),
        }
    }

    fn send_nack(&mut self, seq: u16) {
        let Some(to) = self.cfg.prev.or(self.last_src) else { return };
        let len = if self.reasm.progress().1 == 0 {
            encode_nack(seq, [NACK_ALL], &mut self.nack_buf)
        } else {
            encode_nack(seq, ranges(self.reasm.missing()), &mut self.nack_buf)
        };
        if len > 0 && self.socket.send_to(&self.nack_buf[..len], &to.into()).is_ok() {
            self.stats.nacks_sent += 1;
        }
    }

    /// Runs the loss-recovery timers: NACKs of the expected frame, probes of
    /// the last frame sent. Returns when to look again.
    fn service(&mut self, now: Instant) -> Result<Option<Instant>> {
        let mut next = None;
        if let Some(exp) = self.reasm.expected()
            && self.cfg.reliability == Reliability::Reliable
            && self.reasm.peer_reliable()
        {
            match self.nack.poll(now, &self.cfg.timers, exp, self.reasm.progress(), self.reasm.saw_ahead()) {
                NackDecision::Wait(t) => next = t,
                NackDecision::Send => {
                    self.send_nack(exp);
                    next = Some(now + self.cfg.timers.nack_delay);
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
            next = Some(now + (limit - idle));
        } else if self.reasm.is_overtaken() {
            return Err(self.lost());
        }
        if self.retx.is_some() {
            let (probe, due) = self.probe.poll(now, &self.cfg.timers);
            if let Some(seq) = probe
                && let Some((frame, reserved)) = self.retx.as_ref().and_then(|r| r.get(seq))
            {
                let last = leap_common::chunk::chunks_for(frame.len()).unwrap_or(1) - 1;
                if let Ok(n) = self.sender.resend(&self.socket, seq, reserved, frame, std::iter::once(last)) {
                    self.stats.probes += u64::from(n);
                }
            }
            next = earliest(next, due);
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
            let wait = if now.duration_since(start) < self.cfg.spin {
                None
            } else {
                let until = earliest(earliest(timer, deadline), Some(now + WAKE_TICK)).unwrap_or(now);
                Some(until.saturating_duration_since(now).max(Duration::from_micros(50)))
            };
            pump(self, out, wait).map_err(|e| TransportError::io(call, e))?;
        }
    }

    fn deadline_passed(&mut self, out: &[u8]) -> TransportError {
        self.stats.timeouts += 1;
        let recovering = self.cfg.reliability == Reliability::Reliable && self.reasm.peer_reliable();
        if self.reasm.has_partial() && !recovering {
            return self.lost();
        }
        self.reasm.resync_if_lost();
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
