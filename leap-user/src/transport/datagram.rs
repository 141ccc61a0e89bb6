//! The I/O every datagram backend shares around its [`Link`] (which makes
//! every decision: reassembly, proving neighbours to be leap nodes, the
//! source lock, loss recovery with NACKs, the buffer of recent frames and
//! probes): the UDP socket and sender (GSO, `sendmmsg`), the clock, the path
//! MTU, the receive calls, the driver thread and the readiness descriptor.
//! A backend only supplies the receive path (a UDP socket, AF_XDP sockets, a
//! BPF ring buffer) through [`RxPath`].
//!
//! On a hostile network (decided by the link):
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

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, ChunkHeader, TRAIN_DATAGRAM_MAX, flags};
use leap_common::hello::Hello;
use socket2::Socket;

pub use super::config::Reliability;
use super::config::UdpConfig;
use super::lend::OwnedBuf;
use super::ready::Readiness;
use super::send::UdpSender;
use super::{FrameKind, Received, Result, Stats, TransportError};
use crate::frame::LostFrame;
use crate::frame::reliable::RETX_BURST;
use crate::link::{Event, FIRST_PROOF_WAIT, FrameHead, Link, LinkConfig, MtuText, Transmit, TransmitKind};

/// Longest a receive sleeps before it looks at its timers again.
const WAKE_TICK: Duration = Duration::from_millis(20);

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

/// The I/O of one datagram backend around its [`Link`]: the socket and the
/// sender (GSO, `sendmmsg`), the clock, the path MTU, what the link says to
/// send. Every decision (reassembly, proofs, the source lock, NACKs,
/// retransmissions, probes) is the link's; the first copy of a frame is
/// still sent from here (see the link's checklist).
#[derive(Debug)]
pub struct DatagramLink {
    socket: Arc<Socket>,
    sender: UdpSender,
    link: Link,
    cfg: UdpConfig,
    /// A frame the link completed in the receive call's buffer, not yet
    /// delivered.
    done: Option<Received>,
    /// A frame the link gave up inside a receive call, not yet reported.
    lost: Option<LostFrame>,
    send_log: LogLimit,
    /// Datagrams handed to the link so far (to tell whether a look at the
    /// receive path found it empty).
    taken: u64,
    /// Frames written in place by [`Self::send_with`] that are not kept.
    tx: OwnedBuf,
    /// Where the link writes what it sends: room for a burst of
    /// retransmissions, then a train.
    out: Box<[u8]>,
    /// The datagrams of a burst in [`Self::out`], sent in one `sendmmsg`.
    burst: Vec<std::ops::Range<usize>>,
    /// A socket connected to the next node, to read the path MTU from.
    route: Option<crate::sys::udp::RouteProbe>,
}

impl DatagramLink {
    /// A link sending from `socket` to `cfg.next`; `gso` allows UDP GSO
    /// (still only if the kernel has it).
    pub fn new(socket: Socket, cfg: UdpConfig, gso: bool) -> Self {
        let sender = UdpSender::new(&socket, cfg.next, gso && cfg.gso);
        let route = match crate::sys::udp::RouteProbe::connect(cfg.listen, cfg.next) {
            Ok(r) => Some(r),
            Err(e) => {
                log::debug!("{}: no route to {} to read the path MTU from ({e})", cfg.listen, cfg.next);
                None
            }
        };
        let now = Instant::now();
        let local = socket.local_addr().ok().and_then(|a| a.as_socket()).unwrap_or(cfg.listen);
        let mut link = Link::new(link_config(&cfg, local), now);
        link.set_path_mtu(now, route.as_ref().and_then(|r| r.mtu().ok()));
        Self {
            socket: Arc::new(socket),
            sender,
            link,
            cfg,
            done: None,
            lost: None,
            send_log: LogLimit::default(),
            taken: 0,
            tx: OwnedBuf::default(),
            out: vec![0; RETX_BURST * CHUNK_DATAGRAM_MAX + TRAIN_DATAGRAM_MAX].into_boxed_slice(),
            burst: Vec::with_capacity(RETX_BURST),
            route,
        }
    }

    /// Chunks per datagram to the next node (1 until it proved it takes
    /// trains, and always with trains off).
    pub fn train_chunks(&self) -> usize {
        self.sender.train()
    }

    fn path_mtu(&self) -> Option<usize> {
        self.route.as_ref().and_then(|r| r.mtu().ok())
    }

    /// Sizes the trains to the path MTU again once a second, and at once when
    /// the kernel refused to segment them: an interface whose MTU fell (9000
    /// to 1500, say) gets single chunks, one whose MTU rose gets trains.
    /// Where the trains still fit and the kernel refused them anyway, GSO is
    /// what fails: it is turned off.
    fn recheck_trains(&mut self, now: Instant) {
        if self.sender.take_train_refused() {
            let mtu = self.path_mtu();
            if self.link.train_refused(now, mtu) {
                let k = self.link.train_chunks();
                self.sender
                    .disable_gso(&format_args!("it refused trains of {k} chunks within the path MTU {}", MtuText(mtu)));
            }
        } else if self.link.mtu_due().is_some_and(|due| now >= due) {
            let mtu = self.path_mtu();
            self.link.set_path_mtu(now, mtu);
        }
        self.sender.set_train(self.link.train_chunks());
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
        self.link.prev()
    }

    /// How long the first frame waits for the next node's proof.
    pub const FIRST_PROOF_WAIT: Duration = FIRST_PROOF_WAIT;

    /// Whether the first frame still has to wait for the next node's proof
    /// (see [`Self::FIRST_PROOF_WAIT`]).
    pub fn awaits_proof(&self) -> bool {
        self.link.awaits_proof()
    }

    /// Before an event loop waits for the next node's proof its own way:
    /// the next challenge goes out at once (see [`Self::await_next_proof`]).
    #[cfg(feature = "tokio")]
    pub(crate) fn proof_wait_begins(&mut self) {
        self.link.proof_wait_begins();
    }

    /// Marks the wait for the next node's proof as done (an event loop
    /// waited its own way while the driver exchanged hellos).
    pub fn proof_wait_done(&mut self) {
        self.link.proof_wait_done();
    }

    /// Whether the next node proved to be a leap node.
    pub fn next_is_leap(&self) -> bool {
        self.link.next_is_leap()
    }

    /// Whether the previous node proved to be a leap node.
    pub fn prev_is_leap(&self) -> bool {
        self.link.prev_is_leap()
    }

    /// Counters, drops of the reassembly included.
    pub fn stats(&self) -> Stats {
        self.link.stats()
    }

    /// Counts a datagram larger than any chunk (truncated by the receive path).
    pub fn count_oversize(&mut self) {
        self.link.count_oversize();
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
            self.link.stats_mut().kernel_drops = u64::from(d);
        }
        let now = Instant::now();
        let mut taken = 0;
        for i in 0..rx.len() {
            let (bytes, meta, src) = rx.get(i);
            if meta.truncated {
                self.count_oversize();
                continue;
            }
            let seg = if gro { meta.segment.map_or(bytes.len(), usize::from).max(1) } else { bytes.len().max(1) };
            for d in bytes.chunks(seg) {
                taken += self.handle(now, src, d, out.as_deref_mut());
            }
        }
        self.flush();
        taken
    }

    /// The drop counters of the receive path, for refusals before a
    /// datagram reaches [`Self::train`].
    pub fn drops_mut(&mut self) -> &mut super::Drops {
        self.link.drops_mut()
    }

    /// Counts datagrams the receive path could not even parse as UDP.
    pub fn count_foreign(&mut self, n: u64) {
        self.link.drops_mut().short += n;
    }

    /// Sets the receive deadline.
    pub fn set_recv_timeout(&mut self, t: Option<Duration>) {
        self.cfg.recv_timeout = t;
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
        if self.link.keyed() {
            return self.send_keyed(kind, head, tail);
        }
        let FrameHead { seq, reserved, keep } = self.prepare_send(kind);
        let crc;
        let trailer: &[u8] = if reserved & flags::CRC != 0 {
            crc = crc32c::crc32c_append(crc32c::crc32c(head), tail).to_le_bytes();
            &crc
        } else {
            &[]
        };
        let res = self.sender.send(&self.socket, seq, reserved, head, tail, trailer);
        if matches!(res, Err(TransportError::BadFrameLen(_))) {
            return res.map(drop);
        }
        let kept = match self.link.retx_mut() {
            Some(retx) if keep => {
                retx.store(seq, reserved, head, tail, trailer);
                self.link.stats_mut().copied_bytes += (head.len() + tail.len()) as u64;
                true
            }
            _ => false,
        };
        self.sent(seq, kept, head.len() + tail.len(), res)
    }

    /// A keyed link's first copy: the link queues it (kept for NACKs, a
    /// copy; a frame written in place by [`Self::send_with`] is kept where
    /// it was written instead) and every chunk leaves sealed through
    /// [`Self::flush`], trains in bursts of one `sendmmsg`.
    fn send_keyed(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> Result<()> {
        let len = head.len() + tail.len();
        if !self.link.frame_len_ok(len) {
            return Err(TransportError::BadFrameLen(len));
        }
        self.prepare_send(kind);
        self.queue_keyed(kind, head, tail)
    }

    /// The second half of [`Self::send_keyed`], after [`Self::prepare_send`].
    fn queue_keyed(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> Result<()> {
        let now = Instant::now();
        self.link.send_parts(now, kind, head, tail).map_err(TransportError::BadFrameLen)?;
        self.flush();
        self.recheck_trains(now);
        Ok(())
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
        if self.link.keyed() && !self.link.frame_len_ok(len) {
            return Err(TransportError::BadFrameLen(len));
        }
        let FrameHead { seq, reserved, keep } = self.prepare_send(kind);
        let mut buf = match (self.link.retx_mut(), keep) {
            (Some(retx), true) => retx.take_slot(seq, len),
            _ => std::mem::take(&mut self.tx).into_vec(),
        };
        if buf.len() < len {
            buf.resize(len, 0);
        }
        Ok(SendSlot { seq, reserved, kind, keep, len, buf })
    }

    /// Sends the frame written into `slot` (see [`Self::begin_send`]).
    ///
    /// # Errors
    ///
    /// As [`Self::send`].
    pub fn finish_send(&mut self, slot: SendSlot) -> Result<()> {
        let SendSlot { seq, reserved, kind, keep, len, buf } = slot;
        if self.link.keyed() {
            // Prepared when the slot was handed out.
            return match (self.link.retx_mut(), keep) {
                (Some(retx), true) => {
                    // Written where it is kept: its chunks are sealed from
                    // there as they leave, the frame never copied.
                    retx.put_slot(seq, buf);
                    retx.commit(seq, reserved, len, &[]);
                    let now = Instant::now();
                    let res = self.link.send_kept(now, seq, reserved, len).map_err(TransportError::BadFrameLen);
                    self.flush();
                    self.recheck_trains(now);
                    res.map(drop)
                }
                _ => {
                    let res = self.queue_keyed(kind, &buf[..len], &[]);
                    self.tx = OwnedBuf::from_vec(buf);
                    res
                }
            };
        }
        let frame = &buf[..len];
        let crc = crate::link::crc_trailer(reserved, frame);
        let trailer: &[u8] = crc.as_ref().map_or(&[], |c| c);
        let res = self.sender.send(&self.socket, seq, reserved, frame, &[], trailer);
        match (self.link.retx_mut(), keep) {
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
        match (self.link.retx_mut(), slot.keep) {
            (Some(retx), true) => retx.put_slot(slot.seq, slot.buf),
            _ => self.tx = OwnedBuf::from_vec(slot.buf),
        }
    }

    /// Before a frame leaves: the first waits for the next node's proof,
    /// challenges go out when due. Returns what the link decided for it.
    fn prepare_send(&mut self, kind: FrameKind) -> FrameHead {
        if self.link.awaits_proof() {
            self.await_next_proof(FIRST_PROOF_WAIT);
        }
        // Waited (or not needed): the link's own wait never holds a frame
        // sent from here.
        self.link.proof_wait_done();
        let head = self.link.next_frame(Instant::now(), kind);
        self.flush();
        head
    }

    /// Counts a frame sent (or attempted) as `seq`; a failed send of a kept
    /// frame is recovered by NACKs.
    fn sent(&mut self, seq: u16, kept: bool, len: usize, res: Result<super::send::Sent>) -> Result<()> {
        let now = Instant::now();
        self.link.frame_sent(now, seq, kept, len);
        self.recheck_trains(now);
        let stats = self.link.stats_mut();
        match res {
            Ok(sent) => {
                stats.chunks_sent += u64::from(sent.chunks);
                stats.datagrams_sent += u64::from(sent.datagrams);
                Ok(())
            }
            Err(e) => {
                stats.send_errors += 1;
                if kept {
                    self.send_log.warn(format_args!("sending frame seq {seq} failed ({e}); recovering it by NACKs"));
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Takes one received datagram (UDP payload) from `src`, which may be a
    /// chunk train ([`leap_common::chunk::train`]; each chunk is taken on
    /// its own): a chunk of the expected frame goes into `out`, others (and
    /// all without `out`) to side slots of the reassembly. Returns the
    /// chunks it was meant to carry: 0 for a hello or a datagram longer
    /// than any train (counted as oversize).
    pub fn train(&mut self, src: Option<SocketAddr>, datagram: &[u8], out: Option<&mut [u8]>) -> u64 {
        let n = self.handle(Instant::now(), src, datagram, out);
        self.flush();
        n
    }

    /// Hands one datagram to the link (what it sends in answer goes out at
    /// the next [`Self::flush`]).
    fn handle(&mut self, now: Instant, src: Option<SocketAddr>, datagram: &[u8], out: Option<&mut [u8]>) -> u64 {
        self.taken += 1;
        if src == Some(self.cfg.next) && Hello::is_hello(datagram) {
            // It may prove the next node (again): its trains are sized to
            // the path MTU as it is now.
            let mtu = self.path_mtu();
            self.link.set_path_mtu(now, mtu);
        }
        self.link.handle(now, src, datagram, out)
    }

    /// Sends what the link has to send (hellos and NACKs one by one,
    /// retransmissions and probes in bursts of one `sendmmsg`) and takes
    /// what it has to say.
    fn flush(&mut self) {
        let now = Instant::now();
        let (mut at, mut kind) = (0, None);
        loop {
            // Room for another datagram of the burst (a train at most).
            let room = self.burst.len() < RETX_BURST && self.out.len() - at >= TRAIN_DATAGRAM_MAX;
            let t = if room { self.link.poll_transmit(now, &mut self.out[at..]) } else { None };
            let Some(t) = t else {
                let Some(k) = kind.take() else { break };
                let full = !room;
                self.send_burst(k);
                at = 0;
                if full {
                    continue;
                }
                break;
            };
            // First copies leave through here only from a keyed link.
            let burst = matches!(t.kind, TransmitKind::Retransmit | TransmitKind::Probe | TransmitKind::Chunks(_));
            if burst && t.to == self.cfg.next {
                if kind.is_some_and(|k| std::mem::discriminant(&k) != std::mem::discriminant(&t.kind)) {
                    self.send_burst(kind.take().expect("checked"));
                    self.out.copy_within(at..at + t.len, 0);
                    at = 0;
                }
                kind = Some(t.kind);
                self.burst.push(at..at + t.len);
                at += t.len;
            } else {
                if let Some(k) = kind.take() {
                    self.send_burst(k);
                }
                self.send_one(t, at);
                at = 0;
            }
        }
        self.sender.set_train(self.link.train_chunks());
        while let Some(e) = self.link.poll_event() {
            match e {
                Event::Frame(got) => self.done = Some(got),
                Event::Lost(l) => self.lost = Some(l),
                Event::Proven { .. } | Event::Restarted { .. } | Event::Relocked { .. } => {}
            }
        }
    }

    /// Sends the datagrams of [`Self::burst`] (all of `kind`) in one
    /// `sendmmsg`.
    fn send_burst(&mut self, kind: TransmitKind) {
        let (out, spans) = (&self.out, &self.burst);
        let res = self.sender.send_datagrams(&self.socket, || spans.iter().map(|r| [&out[r.clone()]]));
        if let Err(e) = res {
            self.link.transmit_failed(kind, spans.len() as u64);
            let seq = spans.first().and_then(|r| ChunkHeader::parse(&out[r.clone()]).ok()).map_or(0, |(h, _)| h.seq);
            match kind {
                TransmitKind::Probe => self.send_log.warn(format_args!("probe of seq {seq} failed: {e}")),
                TransmitKind::Chunks(_) => {
                    self.send_log.warn(format_args!("sending chunks of frame seq {seq} failed: {e}"));
                }
                _ => self.send_log.warn(format_args!("retransmission of seq {seq} failed: {e}")),
            }
        }
        self.burst.clear();
    }

    /// Sends the datagram `t` written at `at` in [`Self::out`] on its own.
    fn send_one(&mut self, t: Transmit, at: usize) {
        let bytes = &self.out[at..at + t.len];
        let Err(e) = self.socket.send_to(bytes, &t.to.into()) else { return };
        self.link.transmit_failed(t.kind, 1);
        let to = t.to;
        match t.kind {
            TransmitKind::Hello => self.send_log.warn(format_args!("hello to {to} failed: {e}")),
            TransmitKind::Nack => self.send_log.warn(format_args!("NACK to {to} failed: {e}")),
            _ => {
                let seq = ChunkHeader::parse(bytes).map_or(0, |(h, _)| h.seq);
                self.send_log.warn(format_args!("sending to {to} (seq {seq}) failed: {e}"));
            }
        }
    }

    /// Releases a lock taken on the first source (no previous node
    /// configured): the next valid chunk's source is taken again. Returns
    /// the source that held it.
    pub fn release_source(&mut self) -> Option<SocketAddr> {
        self.link.release_source(Instant::now())
    }

    /// See [`super::KeyControl::set_keys`].
    ///
    /// # Errors
    ///
    /// As [`crate::link::Link::set_keys`].
    pub fn set_keys(
        &mut self,
        keys: super::ring_key::KeySet,
    ) -> std::result::Result<(), super::ring_key::KeyChangeError> {
        self.link.set_keys(keys, Instant::now())
    }

    /// Before the first frame: gives the next node up to `limit` to prove
    /// that it is a leap node, answering hellos (and keeping any chunks that
    /// arrive) meanwhile. An original next node never answers: it then gets
    /// the original format, from the first frame on, until it does.
    fn await_next_proof(&mut self, limit: Duration) {
        self.link.proof_wait_done();
        // Challenges sent before the next node listened were lost, and left
        // the next one up to a second away: ask now.
        self.link.proof_wait_begins();
        let start = Instant::now();
        let mut rx = crate::sys::udp::RxBatch::new(4, 65536);
        while !self.link.next_is_leap() {
            let now = Instant::now();
            if now >= start + limit {
                log::info!(
                    "next node {} did not prove to be a leap node within {limit:?}; \
                     sending it the original format until it does",
                    self.cfg.next
                );
                return;
            }
            let due = earliest(self.link.poll_hellos(now), Some(start + limit)).unwrap_or(now);
            self.flush();
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

    /// What the driver does while the caller is away (computing): hellos,
    /// NACKs of the expected frame, probes, paced retransmissions (NACKs from
    /// the next node were answered as they were drained). Frames are given
    /// up only inside a receive call, which reports it: returns whether a
    /// receive would now give one up (for [`Self::deliverable`]).
    fn service_background(&mut self, now: Instant) -> bool {
        let loss_due = self.link.drive(now);
        self.flush();
        loss_due
    }

    /// Whether a receive would deliver a frame at once (the driver completed
    /// it, or a receive took it off the wire with the one it delivered).
    fn deliverable(&self) -> bool {
        self.done.is_some() || self.link.slot_ready()
    }

    /// Whether the driver should look often: a frame is being assembled,
    /// retransmissions wait, or a frame left recently (NACKs may come).
    fn busy(&self, now: Instant) -> bool {
        self.link.busy(now)
    }

    fn deadline_passed(&mut self, out: &[u8]) -> TransportError {
        match self.link.deadline_passed(out) {
            Some(lost) => lost_error(lost),
            None => TransportError::Timeout(self.cfg.recv_timeout.unwrap_or_default()),
        }
    }
}

/// The error a receive call returns for a frame given up.
fn lost_error(lost: LostFrame) -> TransportError {
    TransportError::FrameLost { seq: lost.seq, missing: lost.missing, total: lost.total }
}

/// What a link is configured with, out of the transport's settings.
fn link_config(cfg: &UdpConfig, local: SocketAddr) -> LinkConfig {
    let auth = cfg.ring_key.as_ref().map(|keys| {
        let epoch = super::datagram_auth::new_epoch().unwrap_or_else(|e| {
            // The clock alone still grows from run to run.
            log::warn!("no random bits for this run's ring-key epoch ({e}); using the clock alone");
            let us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros());
            (us as u64) << 20
        });
        crate::link::LinkAuth { keys: keys.clone(), local, epoch }
    });
    LinkConfig {
        next: cfg.next,
        prev: cfg.prev,
        nack_from: cfg.nack_from,
        max_frame_len: cfg.max_frame_len,
        window: cfg.window,
        keep_frames: cfg.keep_frames,
        reliable: cfg.reliability == Reliability::Reliable,
        timers: cfg.timers,
        original_compat: cfg.original_compat,
        crc: cfg.crc,
        trains: cfg.trains,
        rx_train_bytes: cfg.rx_train_bytes,
        auth,
    }
}

/// A frame being written in place, between [`DatagramLink::begin_send`] and
/// [`DatagramLink::finish_send`].
#[derive(Debug)]
pub struct SendSlot {
    seq: u16,
    reserved: u16,
    kind: FrameKind,
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
        self.lost = None;
        let start = Instant::now();
        match self.link.begin_recv(out) {
            Some(got) => Ok(Ok(got)),
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
            return Ok(RecvPoll::Ready(got));
        }
        let now = Instant::now();
        let timer = self.link.handle_timeout(now);
        self.flush();
        if let Some(lost) = self.lost.take() {
            return Err(lost_error(lost));
        }
        if call.deadline.is_some_and(|d| now >= d) {
            return Err(self.deadline_passed(out));
        }
        let spinning = spin && now.duration_since(call.start) < self.spin();
        Ok(RecvPoll::Wait(if spinning || self.link.take_drain_first() {
            None
        } else {
            let until = earliest(earliest(timer, call.deadline), Some(now + WAKE_TICK)).unwrap_or(now);
            Some(until.saturating_duration_since(now).max(Duration::from_micros(50)))
        }))
    }

    /// Ends a receive call that polled once and found no complete frame:
    /// what arrived of the expected frame is kept for the next call.
    fn nothing_yet(&mut self, out: &[u8]) -> TransportError {
        self.link.suspend(out);
        TransportError::Timeout(Duration::ZERO)
    }

    /// Hands what `rx` holds to the link; returns whether it took anything.
    fn recv_drain<R: RxPath + ?Sized>(&mut self, rx: &mut R, out: &mut [u8], call: &'static str) -> Result<bool> {
        let before = self.taken;
        rx.drain(self, Some(out)).map_err(|e| TransportError::io(call, e))?;
        let drained = self.taken == before;
        self.link.set_rx_empty(drained);
        Ok(!drained)
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
/// A receive call running this long waits for an idle previous node: the
/// driver stops looking every [`DRIVE_TICK`] and sleeps until the call ends
/// (shorter calls, a pipeline's, never make the caller wake the driver).
const LONG_CALL: Duration = Duration::from_millis(10);
/// Longest the driver sleeps while a long receive call runs (the call
/// ending wakes it sooner; this only bounds a wake-up that went astray).
const CALL_TICK: Duration = Duration::from_millis(250);

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
    /// The driver's thread, once it runs, and whether it sleeps until a
    /// receive call ends (the call wakes it then; see [`Self::drive_once`]).
    driver: std::sync::OnceLock<std::thread::Thread>,
    driver_waits: std::sync::atomic::AtomicBool,
    /// When the running receive call began, microseconds after `born`.
    call_began_us: std::sync::atomic::AtomicU64,
    born: Instant,
}

impl<R: RxPath> Shared<R> {
    /// Shares `link` and `rx`.
    pub fn new(link: DatagramLink, rx: R) -> Arc<Self> {
        Arc::new(Self {
            link: Mutex::new(link),
            rx: Mutex::new(RxSide { path: rx, left_at: Instant::now() }),
            receiving: std::sync::atomic::AtomicBool::new(false),
            ready: std::sync::OnceLock::new(),
            driver: std::sync::OnceLock::new(),
            driver_waits: std::sync::atomic::AtomicBool::new(false),
            call_began_us: std::sync::atomic::AtomicU64::new(0),
            born: Instant::now(),
        })
    }

    #[cfg(feature = "tokio")]
    /// Starts a receive call that waits its own way (async): the frame if
    /// it is already there. The driver stands back until [`Self::end_call`].
    pub fn begin_call(&self, out: &mut [u8]) -> std::result::Result<Result<Received>, RecvCall> {
        self.call_begins();
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
        self.wake_driver();
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
        self.call_begins();
        self.before_call();
        let res = recv(&self.link, &mut rx.path, out, call);
        rx.left_at = Instant::now();
        self.after_call();
        drop(rx);
        self.wake_driver();
        res
    }

    /// A receive call begins: when, for the driver ([`LONG_CALL`]).
    fn call_begins(&self) {
        let us = u64::try_from(self.born.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.call_began_us.store(us, std::sync::atomic::Ordering::Release);
    }

    /// A receive call ended: wakes the driver if it sleeps until then (only
    /// after a [`LONG_CALL`]: a pipeline receiving frame after frame never
    /// pays for the wake-up).
    fn wake_driver(&self) {
        if self.driver_waits.swap(false, std::sync::atomic::Ordering::AcqRel)
            && let Some(t) = self.driver.get()
        {
            t.unpark();
        }
    }

    /// A receive call runs: the driver looks again in [`DRIVE_TICK`] while
    /// the call is short, and once it is a [`LONG_CALL`] sleeps until it
    /// ends ([`CALL_TICK`] at most). `None`: the call ended meanwhile (look
    /// again now), so that a call ending between the driver's look and its
    /// flag cannot leave it asleep.
    fn wait_for_call(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering;
        let began = Duration::from_micros(self.call_began_us.load(Ordering::Acquire));
        if self.born.elapsed().saturating_sub(began) < LONG_CALL {
            return Some(DRIVE_TICK);
        }
        self.driver_waits.store(true, Ordering::Release);
        let ended = match self.rx.try_lock() {
            Ok(_) | Err(std::sync::TryLockError::Poisoned(_)) => !self.receiving.load(Ordering::Acquire),
            Err(std::sync::TryLockError::WouldBlock) => false,
        };
        if ended {
            self.driver_waits.store(false, Ordering::Release);
            return None;
        }
        Some(CALL_TICK)
    }

    /// One look by the driver: if no receive call runs and the caller has
    /// been away for a while, takes what arrived (answering NACKs) and runs
    /// the recovery timers. Returns when to look again: while a receive call
    /// runs (it runs the timers itself), not before it ends.
    pub fn drive_once(&self) -> Duration {
        let mut rx = match self.rx.try_lock() {
            Ok(rx) => rx,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return self.wait_for_call().unwrap_or(Duration::ZERO),
        };
        if self.receiving.load(std::sync::atomic::Ordering::Acquire) {
            drop(rx);
            return self.wait_for_call().unwrap_or(Duration::ZERO);
        }
        let now = Instant::now();
        let away = now.duration_since(rx.left_at);
        if away < DRIVE_GRACE {
            return DRIVE_GRACE - away;
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
            if let Some(shared) = weak.upgrade() {
                let _ = shared.driver.set(std::thread::current());
            }
            while !flag.load(Ordering::Acquire) {
                let Some(shared) = weak.upgrade() else { return };
                let tick = shared.drive_once();
                drop(shared);
                if !tick.is_zero() {
                    std::thread::park_timeout(tick);
                }
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
