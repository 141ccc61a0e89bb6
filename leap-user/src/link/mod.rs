//! The datagram link without I/O: everything a datagram peer decides
//! (what a received datagram means, what to send next, when to wake), with
//! no socket, no clock and no thread of its own. Time is an argument,
//! datagrams to send come out of [`Link::poll_transmit`], what happened
//! comes out of [`Link::poll_event`], timers as [`Link::poll_timeout`].
//!
//! This is issue 23's quinn-proto split. Every datagram backend runs on a
//! link: `transport/datagram.rs` (`DatagramLink`) hands it every datagram,
//! runs its timers and sends what it says; only the first copy of a frame
//! is still sent by `datagram.rs` itself (see the checklist).
//!
//! # What a [`Link`] owns
//!
//! - the reassembly ([`Reassembler`]: the expected frame, the side slots of
//!   the window, the drop counters);
//! - the neighbour proofs ([`Peer`] for the next node and, when it is
//!   another address, for the previous one), this process's epoch and caps;
//! - the source lock ([`SourceLock`]) when no previous node is configured;
//! - loss recovery: the receiver's [`NackTimer`], the sender's
//!   [`RetransmitBuffer`] (frames kept for NACKs), [`ProbeTimer`] and the
//!   pace of retransmissions;
//! - the sender's seq and the frames queued to go out (a sketch, see below);
//! - the chunks-per-train to the next node, sized to a path MTU that the
//!   driver passes in ([`Link::set_path_mtu`]);
//! - the counters ([`Stats`]);
//! - with a ring key ([`LinkConfig::auth`]), the seals and the opener of
//!   its datagrams (see "Keyed links").
//!
//! # Keyed links
//!
//! A keyed link seals every datagram as it leaves [`Link::poll_transmit`]
//! (a hello or NACK when it leaves, not when it was decided; each chunk of
//! a train alone; a retransmission or probe again, with a new packet
//! number) and opens every datagram [`Link::handle`] takes before anything
//! else reads it: what does not verify is counted (`drops.bad_tag`,
//! `drops.replayed`, `drops.unkeyed`) and changes nothing. Its frames go in
//! the keyed format from the first ([`flags::AUTH`], no CRC), proven next
//! node or not, and a verified chunk's flags are taken before the previous
//! node proved itself (only a holder of the key can write them). An
//! unkeyed link refuses keyed chunks. See `transport::datagram_auth` for
//! the trailer, the keys and why no nonce is used twice.
//!
//! # API
//!
//! Receive:
//! - [`Link::begin_recv`]`(out)`: a receive call starts with the caller's
//!   buffer; the frame if it was already complete in a side slot;
//! - [`Link::handle`]`(now, src, datagram, out)`: one datagram (a chunk, a
//!   train, a hello, a NACK). `out` is the receive call's buffer (the
//!   expected frame is written there, as today, with no extra copy);
//!   `None` (the driver, between calls) puts every chunk in a side slot;
//! - [`Link::handle_timeout`]`(now)`: runs the timers as a receive call
//!   does (`service` in `datagram.rs`); [`Link::drive`]`(now)` as the
//!   driver does between calls (`service_background`: never gives a frame
//!   up, says whether a receive would);
//! - [`Link::deadline_passed`]`(out)` / [`Link::suspend`]`(out)`: a receive
//!   call ends without a frame;
//! - [`Link::poll_event`]: [`Event::Frame`] (complete in `out`),
//!   [`Event::Lost`], [`Event::Proven`], [`Event::Restarted`],
//!   [`Event::Relocked`];
//! - [`Link::release_source`]`(now)`: the operator's release of the lock;
//! - [`Link::set_keys`]`(keys, now)`: new ring keys, between datagrams.
//!
//! Send (a sketch): [`Link::send`]`(now, kind, frame)` keeps the frame
//! (in the retransmit buffer when it is kept for NACKs, else in a queue of
//! its own) and queues its chunks.
//!
//! Both: [`Link::poll_transmit`]`(now, buf)` writes the next datagram into
//! `buf` (hellos and NACKs first, then chunks and trains, then paced
//! retransmissions and probes) and says where it goes;
//! [`Link::poll_timeout`] says when the timers want to run next.
//!
//! # How the driver will use it
//!
//! One loop per backend (the next session's "one I/O driver"): wait on the
//! receive path until the earliest of [`Link::poll_timeout`], the receive
//! call's deadline and a tick; hand every datagram to [`Link::handle`];
//! call [`Link::handle_timeout`] (in a call) or [`Link::drive`] (between
//! calls); then drain [`Link::poll_transmit`] into `sendmmsg`/GSO batches
//! (trains and GSO segment sizes decided there) and [`Link::poll_event`]
//! into what the receive call returns.
//!
//! # Ported from `datagram.rs`, and what is not yet (checklist)
//!
//! Ported (same timings, bounds and counters):
//! - [x] `handle`/`take_piece`/`take_chunk`: trains split, oversize counted,
//!   hellos apart, NACKs only from `nack_from`/next and only once it is
//!   proven, source lock from the first valid chunk (not from a NACK),
//!   `reserved` ignored until the previous node is proven, NACKs from the
//!   previous node dropped, the data length rule, push or stash, counters
//!   (`chunks_received`, `chunks_recovered`, `copied_bytes`);
//! - [x] `hello`/`stranger_hello`: answers, proofs, restarts (retransmit
//!   buffer cleared and probes stopped for a restarted next node,
//!   reassembly resynced for a restarted previous node), the resync when
//!   the previous node is first proven before any frame, the lock's probe;
//! - [x] `relock`, `restart_prev`, `release_source`;
//! - [x] `send_hellos` (challenges, relock polled with them);
//! - [x] `answer_nack`, `pace_retransmits` (500 MB/s in bursts of
//!   [`RETX_BURST`]), the probe of the last frame (`service_sender`);
//! - [x] `send_nack` (holes first, then all missing; all for a CRC failure
//!   or nothing received), `nack_gaps_ahead`;
//! - [x] `service`, `service_background`, `recovering`, `lost`,
//!   `deadline_passed` (restart inferred from old seqs for an unproven
//!   sender), `nothing_yet` (as [`Link::suspend`]), `recv_begin`;
//! - [x] `reserved_for`, `train_fit`/`size_trains` (MTU passed in);
//! - [x] the first frame's wait for the next node's proof
//!   (`await_next_proof`, [`FIRST_PROOF_WAIT`]): the frame is held (a
//!   copy) instead of blocking the caller, and queued at the proof or at
//!   the end of the wait; the next node is challenged at once;
//! - [x] the open lock before the first frame (`SourceLock::unlocked`,
//!   the candidate's proof kept when its first chunk takes the lock, the
//!   relock right after a stranger's hello), with `datagram.rs`'s log lines;
//! - [x] `recheck_trains`, with the MTU as an input: the driver reads it
//!   when [`Link::mtu_due`] says ([`Link::set_path_mtu`]) and after a
//!   refused GSO send ([`Link::train_refused`], which says whether to turn
//!   GSO off); GSO itself and the route probe stay the driver's.
//!
//! Wired (`DatagramLink` in `transport/datagram.rs` holds a [`Link`]):
//! - [x] every datagram of every backend goes through [`Link::handle`]
//!   (`take_batch`, `train`, `datagram`), receive calls through
//!   [`Link::begin_recv`], [`Link::handle_timeout`],
//!   [`Link::deadline_passed`], [`Link::suspend`], the driver thread
//!   through [`Link::drive`]; hellos, NACKs, retransmissions and probes
//!   leave through [`Link::poll_transmit`] (retransmissions and probes in
//!   one `sendmmsg` a burst, GSO where the kernel can, as before);
//! - [x] send errors: the link counts a transmit as sent when it hands it
//!   out; the driver gives a failed one back ([`Link::transmit_failed`]:
//!   `send_errors`, and the rate-limited log lines of `datagram.rs`);
//! - [x] the path MTU: read by the driver when it builds the link, when a
//!   hello comes from the next node (it may prove it: trains are sized to
//!   the MTU then), when [`Link::mtu_due`] says, and after a refused GSO
//!   send;
//! - [x] the first copy of a frame is sent by the driver (`UdpSender`,
//!   from the caller's memory or written in place by `send_with`, GSO
//!   trains of [`Link::train_chunks`]) as the link decides
//!   ([`Link::next_frame`]: seq, `reserved`, kept or not), kept in
//!   [`Link::retx_mut`], counted by [`Link::frame_sent`] (which uses the
//!   seq up); the first frame's wait for the proof blocks the sender
//!   (`await_next_proof`) as before, the link challenging
//!   ([`Link::poll_hellos`]). A frame written in place that turns out too
//!   long for a CRC trailer (within 4 bytes of the format's largest) uses
//!   its seq up; `datagram.rs` reused it for the next frame;
//! - [x] the driver's, by design: the receive call's spin, the `drained`
//!   bookkeeping ([`Link::set_rx_empty`]), `WAKE_TICK`, `DRIVE_TICK`, the
//!   readiness eventfd, `poll_once`, `kernel_drops` ([`Link::stats_mut`]),
//!   GRO segment cutting (`take_batch`), the once-a-second limit on
//!   send-failure log lines.
//!
//! Not yet (still only in `datagram.rs`, or differing from it):
//! - [ ] the first copy of a frame through [`Link::send`] and
//!   [`Link::poll_transmit`] (and the link's wait without blocking): the
//!   driver sends it itself; [`Link::send`] and its held frames are used
//!   only by the tests;
//! - [ ] `frames_received` is counted when the link completes a frame, not
//!   when the receive call returns it (the same total once it is
//!   delivered);
//! - [ ] a frame within 4 bytes of the format's largest (about 91 MB) is
//!   refused even when it would go without a CRC (its format is decided
//!   only when it leaves);
//! - [ ] `send_with`/`begin_send`/`finish_send` (frames written in place):
//!   [`Link::send`] copies the frame once (into the kept slot, as `send`
//!   does, or into a queue when it is not kept, which `send` does not); a
//!   keyed driver's frame written in place into the kept slot is queued
//!   from there by [`Link::send_kept`], not copied;
//! - [ ] one I/O driver: `datagram.rs` still holds the driver
//!   (`DatagramLink`, `Shared`, `Driver`, the receive loop), named as
//!   before (not yet `transport/driver.rs`); the halves, the async layer
//!   and `UdpTransport`/`XdpTransport` still delegate to it as before;
//! - [ ] one configuration: [`LinkConfig`] is filled by hand; it should
//!   come from the one typed configuration, and [`Stats`] should move below
//!   `transport` (it is named from there for now);
//! - [ ] [`Link::poll_timeout`] is what the last [`Link::handle_timeout`]
//!   found ([`Link::drive`] does not update it); hellos and NACKs are
//!   queued as 1 412-byte boxes (reused once they left), and
//!   [`Link::poll_transmit`] hands out one datagram at a time (GSO
//!   batching is the driver's).
//!
//! # Observed while porting (behaviour kept, tests pin it)
//!
//! - Between receive calls the driver NACKs the expected frame only by its
//!   progress in the call's buffer, which is empty then (the chunks wait
//!   in a side slot): a frame that arrives damaged while the caller
//!   computes is repaired once the next call begins, and if a later
//!   frame's chunks show up first the driver asks for the expected frame
//!   whole (`NACK_ALL`), even when its slot holds most of it.
//! - The reassembly starts at the first seq it sees (as the original's
//!   does): frames overtaken by a later one before any was taken are
//!   dropped as stale.
//! - A source locked from its first chunk is read as the original until
//!   it proved to be a leap node (a few hellos, well under a millisecond
//!   on a LAN): frames that arrive meanwhile are best effort, a hole in
//!   them gives them up instead of a NACK.
//! - A node with no previous node configured keeps its source lock open
//!   ([`SourceLock::unlocked`]) and answers the hellos of any source until
//!   one proves itself (it takes the lock, [`Event::Relocked`] from
//!   `None`) or sends a valid chunk: the first frame to it waits only for
//!   that proof and goes as to a leap node, kept for NACKs. A first send
//!   challenges the next node at once ([`Peer::challenge_now`]).
//! - The sender cannot tell a delivered frame from a lost tail: after its
//!   last frame it probes six times (25 ms doubling), each probe a stale
//!   chunk at the receiver.
//!
//! # Tests
//!
//! `tests.rs`: links on a fake clock joined by a simulated channel (a
//! seeded PRNG decides loss, duplication and delay jitter; a filter can
//! drop or alter chosen datagrams), two or three links, no sockets; they
//! run in well under a second (`cargo test -p leap --lib link`).

mod transmit;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leap_common::chunk::{
    CHUNK_DATAGRAM_MAX, CRC_TRAILER_LEN, ChunkHeader, ChunkKind, KEYED_PAYLOAD_MAX, chunks_for_stride, flags,
    frame_bytes_per_chunk,
};
use leap_common::hello::{HELLO_LEN, Hello, caps};

use crate::frame::peer::{Peer, Proven, random_u64};
use crate::frame::reliable::{
    NACK_ALL, NackAnswer, NackDecision, NackTimer, ProbeTimer, RETX_BURST, RetransmitBuffer, Timers, decode_nack,
    encode_nack, ranges,
};
use crate::frame::relock::SourceLock;
use crate::frame::types::{Drops, FrameKind, Received};
use crate::frame::{LostFrame, Push, Reassembler};
use crate::transport::Stats;
use crate::transport::datagram_auth::{Opener, Refused, Seals, TRAILER_LEN};
use crate::transport::ring_key::{KeyChangeError, KeySet};

use transmit::{Outgoing, Queued, Resend};
pub use transmit::{Transmit, TransmitKind};

/// Rate at which queued retransmissions leave, in bytes per second (a burst
/// of [`RETX_BURST`] chunks, then a pause).
pub const RETX_PACE_BYTES_PER_S: u64 = 500_000_000;

/// How long the first frame waits for the next node to prove that it is a
/// leap node (once per link).
pub const FIRST_PROOF_WAIT: Duration = Duration::from_millis(100);

/// How often the path MTU towards a next node that takes trains is read
/// again.
pub const MTU_RECHECK: Duration = Duration::from_secs(1);

/// How long after sending a frame the driver keeps looking often (the next
/// node's NACKs for it come within that).
pub const BUSY_AFTER_SEND: Duration = Duration::from_secs(1);

/// How often a keyed link logs refused unkeyed datagrams, and datagrams
/// under the previous key.
pub const KEY_LOG_EVERY: Duration = Duration::from_secs(10);

/// The ring key of a keyed link: every datagram it sends is sealed, every
/// datagram it takes is opened before it changes anything (see
/// `transport::datagram_auth`).
#[derive(Clone, Debug)]
pub struct LinkAuth {
    /// The ring's keys (a previous one accepted during a rotation).
    pub keys: KeySet,
    /// This node's address as its neighbours send to it and see it send
    /// (the keys are bound to both ends' addresses).
    pub local: SocketAddr,
    /// This run's epoch (`datagram_auth::new_epoch`: grows from run to run).
    pub epoch: u64,
}

/// What a link is configured with: the part of `UdpConfig` it decides on.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// The next node (frames go there; NACKs come from there).
    pub next: SocketAddr,
    /// The previous node; `None`: the first source is locked.
    pub prev: Option<SocketAddr>,
    /// Where NACKs come from (default: `next`).
    pub nack_from: Option<SocketAddr>,
    /// Largest frame to receive.
    pub max_frame_len: usize,
    /// Frames in assembly at once (already derived: not 0).
    pub window: u16,
    /// Frames kept for NACKs (already derived: not 0).
    pub keep_frames: usize,
    /// Keep frames, answer NACKs, send them (`Reliability::Reliable`).
    pub reliable: bool,
    /// Loss-recovery timers.
    pub timers: Timers,
    /// Exactly the original: no hellos, flags, NACKs, trains.
    pub original_compat: bool,
    /// CRC32C between proven leap nodes.
    pub crc: bool,
    /// Send trains to a next node that takes them.
    pub trains: bool,
    /// The largest train this node takes (announced in hellos).
    pub rx_train_bytes: usize,
    /// A keyed ring: every datagram sealed and checked, no CRC, never the
    /// original's format (`None`: unkeyed).
    pub auth: Option<LinkAuth>,
}

impl LinkConfig {
    /// Defaults as `UdpConfig::new`, with a window of 16 and 32 kept frames.
    pub fn new(next: SocketAddr) -> Self {
        Self {
            next,
            prev: None,
            nack_from: None,
            max_frame_len: 1 << 20,
            window: 16,
            keep_frames: 32,
            reliable: true,
            timers: Timers::default(),
            original_compat: false,
            crc: true,
            trains: true,
            rx_train_bytes: leap_common::chunk::TRAIN_DATAGRAM_MAX,
            auth: None,
        }
    }
}

/// What the link tells its driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The expected frame is complete in the receive call's buffer.
    Frame(Received),
    /// The expected frame was given up (inside a receive call only).
    Lost(LostFrame),
    /// A neighbour proved to be a leap node (`next`: the next node).
    Proven { addr: SocketAddr, next: bool },
    /// A proven neighbour restarted (a new epoch, proven).
    Restarted { addr: SocketAddr, next: bool },
    /// Frames are now taken from `to` (the lock moved), `from` held it.
    Relocked { from: Option<SocketAddr>, to: SocketAddr },
}

/// A keyed link's seals, opener and rate-limited log lines.
#[derive(Debug)]
struct Auth {
    seals: Seals,
    opener: Opener,
    /// When an unkeyed datagram was last logged.
    unkeyed_log: Option<Instant>,
    /// When a datagram under the previous key was last logged.
    previous_log: Option<Instant>,
    /// When the previous key last sealed or opened a datagram.
    previous_used: Option<Instant>,
    /// An encrypted datagram in clear, once opened.
    clear: Vec<u8>,
}

impl Auth {
    /// Whether a line rate-limited by `last` may be logged now.
    fn due(last: &mut Option<Instant>, now: Instant) -> bool {
        if last.is_some_and(|t| now.duration_since(t) < KEY_LOG_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Whether a datagram to `to` is sealed with the previous key (noted
    /// as its last use at `now`).
    fn use_previous(&mut self, to: SocketAddr, now: Instant) -> bool {
        let previous = self.seals.use_previous(self.opener.used_previous(to));
        if previous {
            self.previous_used = Some(now);
        }
        previous
    }

    /// Seals `buf[..len]` to `to` when keyed; returns the length to send.
    fn seal(auth: &mut Option<Self>, now: Instant, to: SocketAddr, buf: &mut [u8], len: usize) -> usize {
        Self::seal_with(auth, now, to, buf, len, false)
    }

    /// As [`Self::seal`]; `current_key`: with the current key whatever was
    /// heard from `to`.
    fn seal_with(
        auth: &mut Option<Self>,
        now: Instant,
        to: SocketAddr,
        buf: &mut [u8],
        len: usize,
        current_key: bool,
    ) -> usize {
        match auth {
            Some(a) if len > 0 => {
                let previous = !current_key && a.use_previous(to, now);
                a.seals.seal(to, previous, buf, len)
            }
            _ => len,
        }
    }
}

/// Whether a datagram that did not verify looks like one from a node
/// without the key (an unkeyed leap node's hello or chunk, an original
/// peer's chunk) rather than a forgery of a keyed one. The original echoes
/// the flags of the last chunk it took, `AUTH` included, and sends on the
/// bytes it took, trailers and all: a chunk marked keyed whose trailer
/// carries this node's own epoch (its own chunk, come back through a node
/// that does not check tags) counts as unkeyed too. Either way it is
/// refused.
fn looks_unkeyed(d: &[u8], own_epoch: u64) -> bool {
    let own_trailer = || {
        d.len() >= TRAILER_LEN && {
            let at = d.len() - TRAILER_LEN;
            u64::from_be_bytes(d[at..at + 8].try_into().expect("8 bytes")) == own_epoch
        }
    };
    (Hello::is_hello(d) && d.len() == HELLO_LEN)
        || ChunkHeader::parse(d).is_ok_and(|(h, _)| !h.has(flags::AUTH) || own_trailer())
}

/// One datagram peer's decisions, without I/O (see the module docs).
#[derive(Debug)]
pub struct Link {
    cfg: LinkConfig,
    reasm: Reassembler,
    stats: Stats,
    retx: Option<RetransmitBuffer>,
    nack: NackTimer,
    probe: ProbeTimer,
    /// A frame complete in the receive call's buffer, not yet taken by a
    /// new call: later chunks go to side slots.
    done: bool,
    prev: Option<SocketAddr>,
    lock: Option<SourceLock>,
    next_peer: Peer,
    prev_peer: Option<Peer>,
    epoch: u64,
    caps: u32,
    pace_due: Option<Instant>,
    /// Chunks per datagram to the next node.
    train: usize,
    path_mtu: Option<usize>,
    mtu_due: Option<Instant>,
    /// Whether the last look at the receive path found it empty.
    drained: bool,
    drain_first: bool,
    last_send: Option<Instant>,
    proof_waited: bool,
    seq: u16,
    /// Hellos and NACKs to send, first out.
    control: VecDeque<Queued>,
    /// Frames (first copies) whose chunks still have to go out.
    outgoing: VecDeque<Outgoing>,
    /// Retransmissions and probes: `(seq, chunk ids)`, paced.
    resend: VecDeque<Resend>,
    events: VecDeque<Event>,
    /// Memory of unkept frames that left, to reuse.
    spare: Vec<Vec<u8>>,
    burst: Box<[u16; RETX_BURST]>,
    /// What the last [`Self::handle_timeout`] found.
    timeout: Option<Instant>,
    /// Frames held for the next node's proof, and until when.
    held: VecDeque<(u16, FrameKind, Vec<u8>)>,
    held_until: Option<Instant>,
    /// Memory of hellos and NACKs that left, and of chunk lists sent
    /// again, to reuse (the receive path allocates nothing once warm).
    #[allow(clippy::vec_box, reason = "each box moves into a queued hello or NACK and back, never copied")]
    free_bytes: Vec<Box<[u8; CHUNK_DATAGRAM_MAX]>>,
    free_ids: Vec<Vec<u16>>,
    /// The ring key's state (`None`: unkeyed).
    auth: Option<Auth>,
    /// When an unkeyed link last logged a keyed chunk it refused.
    keyed_log: Option<Instant>,
}

impl Link {
    /// A link with a random epoch.
    pub fn new(cfg: LinkConfig, now: Instant) -> Self {
        Self::with_epoch(cfg, now, random_u64())
    }

    /// A link with `epoch` (a restarted process has another).
    pub fn with_epoch(cfg: LinkConfig, now: Instant, epoch: u64) -> Self {
        let reliable = cfg.reliable && !cfg.original_compat;
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
        let prev_peer = cfg.prev.filter(|&p| p != cfg.next).map(Peer::new);
        debug_assert!(cfg.auth.is_none() || !cfg.original_compat, "a keyed link never speaks the original's format");
        let auth = cfg.auth.as_ref().map(|a| Auth {
            seals: Seals::new(&a.keys, a.epoch, a.local),
            opener: Opener::new(a.keys.clone(), a.local),
            unkeyed_log: None,
            previous_log: None,
            previous_used: None,
            clear: Vec::new(),
        });
        Self {
            auth,
            keyed_log: None,
            reasm: Reassembler::with_window(cfg.max_frame_len, cfg.window),
            retx: reliable.then(|| RetransmitBuffer::new(cfg.keep_frames)),
            stats: Stats::default(),
            nack: NackTimer::default(),
            probe: ProbeTimer::default(),
            done: false,
            prev: cfg.prev,
            // Without a previous node, the hellos of the node that will send
            // to us are answered before its first frame (so that it sends
            // that frame as to a leap node, kept for NACKs).
            lock: cfg.prev.is_none().then(|| SourceLock::unlocked(now)),
            next_peer: Peer::new(cfg.next),
            prev_peer,
            epoch,
            caps,
            pace_due: None,
            train: 1,
            path_mtu: None,
            mtu_due: None,
            drained: true,
            drain_first: false,
            last_send: None,
            proof_waited: false,
            seq: 0,
            control: VecDeque::new(),
            outgoing: VecDeque::new(),
            resend: VecDeque::new(),
            events: VecDeque::new(),
            spare: Vec::new(),
            burst: Box::new([0; RETX_BURST]),
            timeout: None,
            held: VecDeque::new(),
            held_until: None,
            free_bytes: Vec::new(),
            free_ids: Vec::new(),
            cfg,
        }
    }

    /// The settings.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Counters, drops of the reassembly included.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.drops = *self.reasm.drops();
        s.copied_bytes += self.reasm.copied();
        s
    }

    /// The counters the driver keeps (`kernel_drops`, `send_errors`).
    pub fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }

    /// The drop counters, for refusals before a datagram reaches the link.
    pub fn drops_mut(&mut self) -> &mut Drops {
        self.reasm.drops_mut()
    }

    /// Counts a datagram larger than any chunk (truncated by the receive path).
    pub fn count_oversize(&mut self) {
        self.reasm.drops_mut().oversize += 1;
    }

    /// The previous node frames are taken from.
    pub fn prev(&self) -> Option<SocketAddr> {
        self.prev
    }

    /// Whether the link is keyed (every datagram sealed and checked).
    pub fn keyed(&self) -> bool {
        self.auth.is_some()
    }

    /// This process's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the next node proved to be a leap node.
    pub fn next_is_leap(&self) -> bool {
        self.next_peer.proven().is_some()
    }

    /// Whether the previous node proved to be a leap node.
    pub fn prev_is_leap(&self) -> bool {
        self.prev_proven().is_some()
    }

    fn prev_proven(&self) -> Option<Proven> {
        match (&self.prev_peer, self.prev) {
            (Some(p), _) => p.proven(),
            (None, Some(prev)) if prev == self.cfg.next => self.next_peer.proven(),
            _ => None,
        }
    }

    /// Whether the first frame still has to wait for the next node's proof
    /// (at most [`FIRST_PROOF_WAIT`], once).
    pub fn awaits_proof(&self) -> bool {
        !self.proof_waited && !self.cfg.original_compat && !self.next_is_leap()
    }

    /// Marks the wait for the next node's proof as done.
    pub fn proof_wait_done(&mut self) {
        self.proof_waited = true;
    }

    /// Before a driver waits for the next node's proof its own way: the
    /// next challenge is due at once.
    pub fn proof_wait_begins(&mut self) {
        self.next_peer.challenge_now();
    }

    /// Queues the challenges that are due (and moves the source lock if a
    /// candidate won it); returns when the next one is.
    pub fn poll_hellos(&mut self, now: Instant) -> Option<Instant> {
        self.send_hellos(now)
    }

    /// Chunks per datagram to the next node.
    pub fn train_chunks(&self) -> usize {
        self.train
    }

    /// When the driver should read the path MTU again, if trains are sent.
    pub fn mtu_due(&self) -> Option<Instant> {
        self.mtu_due.filter(|_| self.train_fit().is_some())
    }

    /// The path MTU towards the next node (`None`: unknown), read by the
    /// driver: trains are sized to it at once.
    pub fn set_path_mtu(&mut self, now: Instant, mtu: Option<usize>) {
        self.path_mtu = mtu;
        self.mtu_due = Some(now + MTU_RECHECK);
        if let Some(k) = self.train_fit() {
            self.resize_trains(k, mtu);
        }
    }

    /// Trains of `k` chunks from now on, logged when that changes.
    fn resize_trains(&mut self, k: usize, mtu: Option<usize>) {
        if k != self.train {
            log::info!(
                "path MTU to {} is now {}: {k} chunk(s) per datagram, {} before",
                self.cfg.next,
                MtuText(mtu),
                self.train
            );
            self.train = k;
        }
    }

    /// The kernel refused to segment a train (a GSO send failed with
    /// `EIO`, `EINVAL` or `EMSGSIZE`); `mtu` is the path MTU read again.
    /// Trains are sized to it; returns whether they still fit, in which
    /// case GSO is what fails and the driver turns it off
    /// (`recheck_trains` in `datagram.rs`).
    pub fn train_refused(&mut self, now: Instant, mtu: Option<usize>) -> bool {
        self.path_mtu = mtu;
        self.mtu_due = Some(now + MTU_RECHECK);
        let Some(k) = self.train_fit() else { return false };
        if k == self.train {
            return true;
        }
        self.resize_trains(k, mtu);
        false
    }

    /// Chunks per train to the next node (None: no trains, by either
    /// side's choice).
    fn train_fit(&self) -> Option<usize> {
        let peer_bytes = self.next_peer.proven().map_or(0, |p| caps::train_bytes(p.caps));
        if !self.cfg.trains || self.cfg.original_compat || peer_bytes == 0 {
            return None;
        }
        let path = self
            .path_mtu
            .map_or(CHUNK_DATAGRAM_MAX, |m| m.saturating_sub(crate::sys::udp::ip_udp_headers(self.cfg.next.is_ipv6())));
        Some(leap_common::chunk::train_chunks_for(peer_bytes.min(path)))
    }

    /// Sizes the trains to the next node after it proved to be a leap node
    /// (again): the largest it takes, within the path MTU, none with trains
    /// off or when it takes none.
    fn size_trains(&mut self, now: Instant) {
        let next = self.cfg.next;
        self.mtu_due = Some(now + MTU_RECHECK);
        let Some(k) = self.train_fit() else {
            self.train = 1;
            let why = if self.cfg.trains { "it takes no trains" } else { "trains are off here" };
            log::info!("one chunk per datagram to {next} ({why})");
            return;
        };
        self.train = k;
        let mtu = MtuText(self.path_mtu);
        if k == 1 {
            log::info!("one chunk per datagram to {next} (path MTU {mtu}: no room for a train)");
        } else {
            log::info!("trains of {k} chunks to {next} (path MTU {mtu})");
        }
    }

    /// What happened, oldest first.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ----- receive -----

    /// Starts a receive call into `out`: the frame if it is already there
    /// (counted as received).
    pub fn begin_recv(&mut self, out: &mut [u8]) -> Option<Received> {
        self.done = false;
        let got = self.reasm.begin(out)?;
        self.delivered(got);
        Some(got)
    }

    fn delivered(&mut self, got: Received) {
        self.stats.frames_received += 1;
        self.stats.bytes_received += got.len as u64;
    }

    /// Takes one datagram from `src` (a chunk, a train, a hello, a NACK);
    /// returns the chunks it was meant to carry (0 for a hello, or a
    /// datagram longer than any train). A chunk of the expected frame goes
    /// into `out`; others, and all without `out`, to side slots.
    pub fn handle(
        &mut self,
        now: Instant,
        src: Option<SocketAddr>,
        datagram: &[u8],
        mut out: Option<&mut [u8]>,
    ) -> u64 {
        let keyed = self.auth.is_some();
        if keyed && src.is_none() {
            // No address: nothing to check a tag against.
            self.reasm.drops_mut().wrong_source += 1;
            return 0;
        }
        if !keyed && Hello::is_hello(datagram) {
            // A keyed hello is opened first, in `take_piece`.
            self.hello(now, src, datagram);
            return 0;
        }
        if datagram.len() <= CHUNK_DATAGRAM_MAX || (!keyed && self.cfg.original_compat) {
            return u64::from(self.take_piece(now, src, datagram, out));
        }
        // A train: each chunk taken (keyed: opened) alone.
        match leap_common::chunk::train(datagram) {
            Ok(train) => {
                let mut n = 0;
                for piece in train {
                    n += 1;
                    self.take_piece(now, src, piece, out.as_deref_mut());
                }
                n
            }
            Err(e) => {
                self.reasm.drops_mut().count_parse(e);
                0
            }
        }
    }

    /// Takes one chunk (of a train, or alone), opened first when keyed;
    /// returns whether it was meant as a chunk (not a hello).
    fn take_piece(&mut self, now: Instant, src: Option<SocketAddr>, piece: &[u8], out: Option<&mut [u8]>) -> bool {
        match src.filter(|_| self.auth.is_some()) {
            Some(src) => self.open_one(now, src, piece, out),
            None => {
                self.take_chunk(now, src, piece, out);
                true
            }
        }
    }

    /// Opens one sealed datagram (a hello, a NACK, a chunk) and takes what
    /// it carries; returns whether it was meant as a chunk.
    fn open_one(&mut self, now: Instant, src: SocketAddr, piece: &[u8], out: Option<&mut [u8]>) -> bool {
        let auth = self.auth.as_mut().expect("a keyed link");
        let opened = match auth.opener.open(src, piece) {
            Ok(o) => o,
            Err(r) => {
                let unkeyed = looks_unkeyed(piece, self.cfg.auth.as_ref().map_or(0, |a| a.epoch));
                let d = self.reasm.drops_mut();
                if unkeyed {
                    d.unkeyed += 1;
                    if Auth::due(&mut auth.unkeyed_log, now) {
                        log::warn!(
                            "refusing {src}: it sends without the ring key (an unkeyed leap node or an original \
                             peer); every node of a keyed ring needs the key (key_file)"
                        );
                    }
                } else {
                    match r {
                        Refused::Short | Refused::BadTag => d.bad_tag += 1,
                        Refused::StaleEpoch | Refused::Replayed => d.replayed += 1,
                    }
                }
                return !Hello::is_hello(piece);
            }
        };
        if opened.previous_key {
            auth.previous_used = Some(now);
        }
        if opened.previous_key && Auth::due(&mut auth.previous_log, now) {
            log::info!(
                "ring key: {src} still uses the previous key (last seen now; drop previous_key_file once this stops)"
            );
        }
        // Encrypted: the datagram in clear is the opener's (swapped out
        // and back, so that nothing is allocated once warm).
        let mut clear = std::mem::take(&mut auth.clear);
        let inner = if auth.opener.encrypts() {
            auth.opener.swap_clear(&mut clear);
            &clear[..opened.len]
        } else {
            &piece[..opened.len]
        };
        let chunk = if Hello::is_hello(inner) {
            let queued = self.control.len();
            self.hello(now, Some(src), inner);
            if !opened.previous_key {
                // The answer goes back under the key the hello came under:
                // a neighbour announcing new keys hears them, whatever
                // other datagrams of its arrive meanwhile.
                self.control.iter_mut().skip(queued).for_each(|q| q.current_key = true);
            }
            false
        } else {
            match ChunkHeader::parse(inner) {
                Ok((h, _)) if h.has(flags::AUTH) => self.take_chunk(now, Some(src), inner, out),
                // Sealed by a key holder, yet not marked keyed: not ours.
                Ok(_) => self.reasm.drops_mut().unkeyed += 1,
                Err(e) => self.reasm.drops_mut().count_parse(e),
            }
            true
        };
        if let Some(a) = self.auth.as_mut() {
            if a.opener.encrypts() {
                a.opener.swap_clear(&mut clear);
            }
            a.clear = clear;
        }
        chunk
    }

    fn take_chunk(&mut self, now: Instant, src: Option<SocketAddr>, datagram: &[u8], out: Option<&mut [u8]>) {
        let (mut hdr, payload) = match ChunkHeader::parse(datagram) {
            Ok(x) => x,
            Err(e) => return self.reasm.drops_mut().count_parse(e),
        };
        if self.auth.is_none() && hdr.has(flags::AUTH) {
            // A keyed node's chunk (data and a trailer this node cannot
            // check): never taken as data.
            self.reasm.drops_mut().unkeyed += 1;
            if Auth::due(&mut self.keyed_log, now) {
                log::warn!(
                    "refusing keyed chunks from {}: this node has no ring key (key_file); \
                     every node of a keyed ring needs the key",
                    src.map_or_else(|| "?".into(), |a| a.to_string())
                );
            }
            return;
        }
        let from_next = src == Some(self.cfg.nack_from.unwrap_or(self.cfg.next));
        if hdr.kind() == ChunkKind::Nack && from_next && self.next_is_leap() && !self.cfg.original_compat {
            self.stats.nacks_received += 1;
            self.answer_nack(now, &hdr, payload);
            return;
        }
        match (self.prev, src) {
            (Some(prev), Some(src)) if prev == src => {}
            (None, Some(_)) if self.lock.as_ref().is_some_and(|l| !l.chunk_may_take(now)) => {
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
                    self.lock = Some(SourceLock::new(src, now, self.stats.chunks_received));
                }
            }
            _ => {
                self.reasm.drops_mut().wrong_source += 1;
                return;
            }
        }
        // A keyed chunk verified: its flags are a key holder's, proven or not.
        if (self.prev_proven().is_none() && self.auth.is_none()) || self.cfg.original_compat {
            hdr.reserved = 0;
        } else if hdr.kind() == ChunkKind::Nack {
            self.reasm.drops_mut().wrong_source += 1;
            return;
        }
        let last = hdr.chunk_id + 1 == hdr.total_chunks;
        if (last && payload.is_empty()) || (!last && payload.len() != frame_bytes_per_chunk(hdr.reserved)) {
            self.reasm.drops_mut().bad_length += 1;
            return;
        }
        let r = match out {
            Some(out) if !self.done => self.reasm.push(&hdr, payload, out),
            _ => self.reasm.stash(&hdr, payload),
        };
        if r != Push::Dropped {
            self.stats.chunks_received += 1;
            if hdr.reserved & flags::RETRANSMIT != 0 {
                self.stats.chunks_recovered += 1;
            }
            self.stats.copied_bytes += payload.len() as u64;
        }
        if let Push::Complete(got) = r {
            self.done = true;
            self.delivered(got);
            self.events.push_back(Event::Frame(got));
        }
    }

    fn hello(&mut self, now: Instant, src: Option<SocketAddr>, datagram: &[u8]) {
        if self.cfg.original_compat {
            self.reasm.drops_mut().bad_magic += 1;
            return;
        }
        let Ok(h) = Hello::parse(datagram) else {
            self.reasm.drops_mut().bad_magic += 1;
            return;
        };
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
            Some(a) => return self.stranger_hello(now, a, &h),
            None => {
                self.reasm.drops_mut().wrong_source += 1;
                return;
            }
        };
        let Some(addr) = src else { return };
        self.stats.hellos_received += 1;
        if let Some(reply) = outcome.reply {
            self.queue_hello(reply, addr);
        }
        if outcome.proven {
            log::info!(
                "{} node {addr} is a leap node{}",
                if is_next { "next" } else { "previous" },
                if outcome.restarted { " (restarted)" } else { "" }
            );
            if is_next {
                self.size_trains(now);
                self.release_held(now);
            }
            if !outcome.restarted {
                self.events.push_back(Event::Proven { addr, next: is_next });
            }
        }
        if outcome.proven && !outcome.restarted && is_prev && self.stats.frames_received == 0 {
            self.reasm.resync();
        }
        if outcome.restarted {
            self.events.push_back(Event::Restarted { addr, next: is_next });
            if is_next && let Some(retx) = &mut self.retx {
                retx.clear();
                self.probe = ProbeTimer::default();
                self.resend.clear();
            }
            if is_prev {
                self.restart_prev();
            }
        }
    }

    fn stranger_hello(&mut self, now: Instant, src: SocketAddr, h: &Hello) {
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
            self.queue_hello(reply, src);
        }
        if let Some((probe, locked)) = out.probe {
            log::info!(
                "{src} proved to be a leap node while {locked} was quiet; asking {locked} whether it is still there"
            );
            self.queue_hello(probe, locked);
        }
        // Nothing locked (at start, or released): a source that just proved
        // itself takes the lock now, before the chunks of its first frame
        // (the driver hands them over next, maybe in the same batch).
        self.relock(now);
    }

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
        self.events.push_back(Event::Relocked { from: old, to: peer.addr() });
        self.prev = Some(peer.addr());
        self.prev_peer = Some(peer);
        self.restart_prev();
        None
    }

    fn restart_prev(&mut self) {
        self.reasm.resync();
        self.nack = NackTimer::default();
    }

    /// Takes new ring keys (key files read again by a running node) from
    /// the next datagram on: later datagrams are sealed and opened with
    /// `keys`. Nothing in flight is lost: a frame's chunks already sealed
    /// were sealed with a key the next node held when it was heard, and
    /// with a previous key in `keys` the link seals with it to a neighbour
    /// not heard under the new one (see `Seals::use_previous`). Logs the
    /// change and when the previous key was last used.
    ///
    /// # Errors
    ///
    /// [`KeyChangeError`]: an unkeyed link, or `encrypt` changed; the keys
    /// in use stay.
    pub fn set_keys(&mut self, keys: KeySet, now: Instant) -> Result<(), KeyChangeError> {
        let (Some(a), Some(cfg)) = (self.auth.as_mut(), self.cfg.auth.as_mut()) else {
            return Err(KeyChangeError::Unkeyed);
        };
        if keys.encrypt != cfg.keys.encrypt {
            return Err(KeyChangeError::Encryption);
        }
        let last = match (a.previous_used, a.seals.has_previous()) {
            (_, false) => String::new(),
            (Some(t), true) => {
                format!("; the previous key was last used {:.1} s ago", now.saturating_duration_since(t).as_secs_f64())
            }
            (None, true) => "; the previous key was not used since it was set".into(),
        };
        log::info!("ring key: now {} (was {}){last}", keys.describe(), cfg.keys.describe());
        let new_current = keys.current != cfg.keys.current;
        a.seals.set_keys(&keys);
        a.opener.set_keys(keys.clone());
        a.previous_used = None;
        a.previous_log = None;
        cfg.keys = keys;
        if new_current && !self.cfg.original_compat {
            // A neighbour holding both keys seals to this node with the old
            // one until it hears the new one from here: say it now, so that
            // by the time the old key is dropped nothing uses it. A
            // neighbour without the new key yet refuses this hello (one
            // `bad_tag`); its own announcement, when it gets the key, is
            // answered under the new one.
            let (epoch, caps) = (self.epoch, self.caps);
            let mut to = vec![(self.next_peer.announce(epoch, caps), self.cfg.next)];
            if let Some(p) = &self.prev_peer {
                to.push((p.announce(epoch, caps), p.addr()));
            }
            for (h, addr) in to {
                let mut q = Queued::hello(&h, addr, self.free_bytes.pop());
                q.current_key = true;
                self.control.push_back(q);
            }
        }
        Ok(())
    }

    /// Releases a lock taken on the first source; returns the source that
    /// held it.
    pub fn release_source(&mut self, now: Instant) -> Option<SocketAddr> {
        let old = self.lock.as_ref()?.source()?;
        self.lock = Some(SourceLock::released(now));
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

    fn queue_hello(&mut self, h: Hello, to: SocketAddr) {
        let q = Queued::hello(&h, to, self.free_bytes.pop());
        self.control.push_back(q);
    }

    /// Queues the challenges that are due; returns when the next one is.
    fn send_hellos(&mut self, now: Instant) -> Option<Instant> {
        if self.cfg.original_compat {
            return None;
        }
        let (epoch, caps) = (self.epoch, self.caps);
        let (h, mut due) = self.next_peer.challenge(now, epoch, caps);
        due = earliest(due, self.relock(now));
        if let Some(h) = h {
            self.queue_hello(h, self.cfg.next);
        }
        if let Some(p) = &mut self.prev_peer {
            let (h, d) = p.challenge(now, epoch, caps);
            let to = p.addr();
            due = earliest(due, d);
            if let Some(h) = h {
                self.queue_hello(h, to);
            }
        }
        due
    }

    fn answer_nack(&mut self, now: Instant, hdr: &ChunkHeader, payload: &[u8]) {
        let Some(retx) = &mut self.retx else { return };
        let Some(ranges) = decode_nack(hdr, payload) else {
            self.reasm.drops_mut().bad_length += 1;
            return;
        };
        match retx.request(hdr.seq, ranges, now) {
            NackAnswer::Queued(_) => {
                self.pace_retransmits(now);
            }
            NackAnswer::Unknown => self.stats.nacks_unknown += 1,
            NackAnswer::Refused => self.stats.nacks_refused += 1,
        }
    }

    /// Queues one burst of retransmissions if the pace allows; returns when
    /// the next burst is due.
    fn pace_retransmits(&mut self, now: Instant) -> Option<Instant> {
        let retx = self.retx.as_mut()?;
        if !retx.has_pending() {
            return None;
        }
        if let Some(due) = self.pace_due
            && now < due
        {
            return Some(due);
        }
        let (seq, n) = retx.next_burst(&mut self.burst[..], now)?;
        let bytes = (n * CHUNK_DATAGRAM_MAX) as u64;
        let due = now + Duration::from_nanos(bytes * 1_000_000_000 / RETX_PACE_BYTES_PER_S);
        self.pace_due = Some(due);
        let v = self.free_ids.pop().unwrap_or_default();
        self.resend.push_back(Resend::new(seq, &self.burst[..n], TransmitKind::Retransmit, v));
        retx.has_pending().then_some(due)
    }

    /// Most ranges a NACK carries (fewer when keyed: its trailer must fit).
    fn nack_ranges(&self) -> usize {
        if self.auth.is_some() { KEYED_PAYLOAD_MAX / 4 } else { crate::frame::reliable::NACK_MAX_RANGES }
    }

    fn send_nack(&mut self, seq: u16, all: bool) {
        let Some(to) = self.prev else { return };
        let most = self.nack_ranges();
        let mut q = Queued::empty(to, TransmitKind::Nack, self.free_bytes.pop());
        let len = if all || self.reasm.progress().1 == 0 {
            encode_nack(seq, [NACK_ALL], q.buf())
        } else if self.nack.attempts() <= 1 && !self.reasm.saw_ahead() {
            encode_nack(seq, ranges(self.reasm.holes()).take(most), q.buf())
        } else {
            encode_nack(seq, ranges(self.reasm.missing()).take(most), q.buf())
        };
        if len == 0 {
            self.free_bytes.push(q.bytes);
            return;
        }
        q.len = len;
        self.control.push_back(q);
    }

    fn nack_gaps_ahead(&mut self) {
        let Some(to) = self.prev else { return };
        let most = self.nack_ranges();
        let (control, free) = (&mut self.control, &mut self.free_bytes);
        self.reasm.gaps_ahead(|seq, ids| {
            let mut q = Queued::empty(to, TransmitKind::Nack, free.pop());
            q.len = encode_nack(seq, ranges(ids).take(most), q.buf());
            control.push_back(q);
        });
    }

    fn recovering(&self) -> bool {
        self.cfg.reliable && !self.cfg.original_compat && self.prev_is_leap() && self.reasm.peer_reliable()
    }

    /// The driver looked at the receive path: `empty` if it found nothing.
    /// A frame counts as stalled only once the path was found empty.
    pub fn set_rx_empty(&mut self, empty: bool) {
        self.drained = empty;
    }

    /// Whether the receive path should be looked at again before sleeping
    /// (a frame looked stalled while it was not found empty).
    pub fn take_drain_first(&mut self) -> bool {
        std::mem::take(&mut self.drain_first)
    }

    /// Runs the timers inside a receive call: challenges, NACKs of the
    /// expected frame (and gaps ahead), giving up, probes, paced
    /// retransmissions. A frame given up is [`Event::Lost`]. Returns when
    /// to look again (also [`Self::poll_timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Instant> {
        let held = self.release_held(now);
        self.timeout = earliest(self.service(now), held);
        self.timeout
    }

    fn service(&mut self, now: Instant) -> Option<Instant> {
        let mut next = self.send_hellos(now);
        if let Some(seq) = self.reasm.take_corrupt() {
            if self.recovering() {
                self.send_nack(seq, true);
            } else {
                self.lost();
                return next;
            }
        }
        let stalled = self.reasm.has_partial() || self.reasm.saw_ahead() || self.reasm.is_overtaken();
        if stalled && !self.drained {
            self.drain_first = true;
        } else if let Some(exp) = self.reasm.expected()
            && self.recovering()
        {
            let ahead = self.reasm.saw_ahead() || self.reasm.is_overtaken();
            match self.nack.poll(now, &self.cfg.timers, exp, self.reasm.progress(), ahead) {
                NackDecision::Wait(t) => next = earliest(next, t),
                NackDecision::Send => {
                    self.send_nack(exp, false);
                    self.nack_gaps_ahead();
                    next = earliest(next, Some(now + self.cfg.timers.nack_delay));
                }
                NackDecision::GiveUp => {
                    self.lost();
                    return next;
                }
            }
        } else if let Some(exp) = self.reasm.expected()
            && self.reasm.has_partial()
        {
            let idle = self.nack.track(now, exp, self.reasm.progress());
            let limit = self.cfg.timers.best_effort_idle;
            if self.reasm.saw_ahead() || self.reasm.is_overtaken() || idle >= limit {
                self.lost();
                return next;
            }
            next = earliest(next, Some(now + (limit - idle)));
        } else if self.reasm.is_overtaken() {
            self.lost();
            return next;
        }
        if self.retx.is_some() && self.next_is_leap() {
            next = earliest(next, self.service_sender(now));
        }
        next
    }

    /// The timers between receive calls (the driver's): never gives a frame
    /// up; returns whether a receive would now give one up.
    pub fn drive(&mut self, now: Instant) -> bool {
        self.release_held(now);
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
            let idle = self.nack.track(now, exp, self.reasm.progress());
            loss_due = self.reasm.saw_ahead() || self.reasm.is_overtaken() || idle >= self.cfg.timers.best_effort_idle;
        }
        if self.retx.is_some() && self.next_is_leap() {
            self.service_sender(now);
        }
        loss_due || self.reasm.is_overtaken() || (self.reasm.is_corrupt() && !self.recovering())
    }

    fn service_sender(&mut self, now: Instant) -> Option<Instant> {
        let (probe, due) = self.probe.poll(now, &self.cfg.timers);
        if let Some(seq) = probe
            && let Some((frame, reserved, trailer)) = self.retx.as_ref().and_then(|r| r.get(seq))
        {
            let stride = frame_bytes_per_chunk(reserved);
            let last = chunks_for_stride(frame.len() + trailer.len(), stride).unwrap_or(1) - 1;
            let v = self.free_ids.pop().unwrap_or_default();
            self.resend.push_back(Resend::new(seq, &[last], TransmitKind::Probe, v));
        }
        earliest(due, self.pace_retransmits(now))
    }

    /// Whether a receive would deliver a frame at once.
    pub fn deliverable(&self) -> bool {
        self.done || self.reasm.ready()
    }

    /// Whether a frame is complete in a side slot (a new receive call's
    /// [`Self::begin_recv`] delivers it).
    pub fn slot_ready(&self) -> bool {
        self.reasm.ready()
    }

    /// Whether the driver should look often: a frame is being assembled,
    /// retransmissions wait, or a frame left recently.
    pub fn busy(&self, now: Instant) -> bool {
        self.reasm.has_partial()
            || self.retx.as_ref().is_some_and(RetransmitBuffer::has_pending)
            || self.last_send.is_some_and(|t| now.duration_since(t) < BUSY_AFTER_SEND)
    }

    fn lost(&mut self) -> LostFrame {
        let lost = self.reasm.abandon();
        self.stats.frames_lost += 1;
        self.events.push_back(Event::Lost(lost));
        lost
    }

    /// Ends a receive call that polled once without a frame: what arrived
    /// of the expected frame is kept for the next call.
    pub fn suspend(&mut self, out: &[u8]) {
        self.reasm.suspend(out);
    }

    /// Ends a receive call at its deadline: the frame given up (best
    /// effort, partial), or `None` (a timeout; what arrived is kept).
    pub fn deadline_passed(&mut self, out: &[u8]) -> Option<LostFrame> {
        self.stats.timeouts += 1;
        if self.reasm.has_partial() && !self.recovering() {
            let lost = self.reasm.abandon();
            self.stats.frames_lost += 1;
            return Some(lost);
        }
        if self.prev_proven().is_none() && self.reasm.resync_if_restarted() {
            log::info!("previous node restarted (its seqs started over); following it");
        }
        self.reasm.suspend(out);
        None
    }

    /// When the timers want to run next (challenges, NACK and give-up
    /// timers, probes, paced retransmissions, the lock's probe), as the
    /// last [`Self::handle_timeout`] found; `now` while datagrams wait in
    /// [`Self::poll_transmit`].
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        if !self.control.is_empty() || !self.outgoing.is_empty() || !self.resend.is_empty() {
            return Some(now);
        }
        earliest(self.timeout, self.held_until)
    }

    // ----- send (a sketch) -----

    /// The `reserved` field for a frame of `kind` to the next node: exactly
    /// the original's 0 until the next node proved to be a leap node.
    pub fn reserved_for(&self, kind: FrameKind) -> u16 {
        if self.auth.is_some() {
            // Keyed: never the original's format, and no CRC (the tag of
            // every chunk replaces it), proven next node or not.
            let mut r = flags::LEAP | flags::AUTH;
            if self.retx.is_some() {
                r |= flags::RELIABLE;
            }
            if kind == FrameKind::Control {
                r |= ChunkKind::Control as u16;
            }
            return r;
        }
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

    /// Queues a frame to the next node (kept for NACKs when the next node
    /// is a proven leap node and this one reliable); returns its seq.
    ///
    /// The first frame of a link waits up to [`FIRST_PROOF_WAIT`] for the
    /// next node to prove that it is a leap node (`await_next_proof` in
    /// `datagram.rs`, which blocks the caller meanwhile): it is held, with
    /// any frame sent after it, copied, and queued once the proof arrives
    /// or the wait is over, in the format the next node gets then.
    ///
    /// # Errors
    ///
    /// The frame's length when it is empty or too long for the format.
    pub fn send(&mut self, now: Instant, kind: FrameKind, frame: &[u8]) -> Result<u16, usize> {
        if !self.frame_len_ok(frame.len()) {
            return Err(frame.len());
        }
        if self.awaits_proof() {
            self.proof_waited = true;
            self.held_until = Some(now + FIRST_PROOF_WAIT);
            // Challenges sent before the next node listened were lost, and
            // left the next one up to a second away: ask now.
            self.next_peer.challenge_now();
        }
        if self.held_until.is_some() {
            self.send_hellos(now);
            let seq = self.seq;
            self.seq = self.seq.wrapping_add(1);
            self.stats.copied_bytes += frame.len() as u64;
            self.held.push_back((seq, kind, frame.to_vec()));
            self.release_held(now);
            return Ok(seq);
        }
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        self.queue_frame(now, seq, kind, frame, &[]);
        Ok(seq)
    }

    /// Whether a frame of `len` bytes fits the format (a keyed chunk
    /// carries fewer bytes of it, an unkeyed frame may need a CRC).
    pub fn frame_len_ok(&self, len: usize) -> bool {
        let most = if self.auth.is_some() {
            usize::from(u16::MAX) * KEYED_PAYLOAD_MAX
        } else {
            leap_common::chunk::FRAME_LEN_MAX - CRC_TRAILER_LEN
        };
        len != 0 && len <= most
    }

    /// As [`Self::send`] for the frame `head ++ tail`, for a driver whose
    /// first copies leave through [`Self::poll_transmit`] (a keyed link's,
    /// every chunk sealed there), after its own wait for the next node's
    /// proof ([`Self::proof_wait_done`]): the frame is queued at once.
    ///
    /// # Errors
    ///
    /// The frame's length when it is empty or too long for the format.
    pub fn send_parts(&mut self, now: Instant, kind: FrameKind, head: &[u8], tail: &[u8]) -> Result<u16, usize> {
        let len = head.len() + tail.len();
        if !self.frame_len_ok(len) {
            return Err(len);
        }
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        self.queue_frame(now, seq, kind, head, tail);
        Ok(seq)
    }

    /// As [`Self::send_parts`] for frame `seq` of `len` bytes that the
    /// driver wrote in place into the slot of [`Self::retx_mut`] that
    /// keeps it and committed there with `reserved` (both from
    /// [`Self::next_frame`], which said to keep it; no trailer): its chunks
    /// leave through [`Self::poll_transmit`] from that slot, never copied.
    ///
    /// # Errors
    ///
    /// The frame's length when it is empty or too long for the format.
    ///
    /// # Panics
    ///
    /// In debug builds, if the retransmit buffer does not hold frame `seq`.
    pub fn send_kept(&mut self, now: Instant, seq: u16, reserved: u16, len: usize) -> Result<u16, usize> {
        if !self.frame_len_ok(len) {
            return Err(len);
        }
        debug_assert!(
            self.retx.as_ref().and_then(|r| r.get(seq)).is_some_and(|(f, _, t)| f.len() == len && t.is_empty())
        );
        self.seq = seq.wrapping_add(1);
        self.send_hellos(now);
        self.queue_chunks(now, seq, reserved, len, 0, None);
        Ok(seq)
    }

    /// The frames kept for NACKs (`None`: not reliable), for a driver that
    /// sends first copies itself and keeps them here.
    pub fn retx_mut(&mut self) -> Option<&mut RetransmitBuffer> {
        self.retx.as_mut()
    }

    /// Before a driver sends a frame of `kind` itself (its first copy from
    /// the caller's memory, [`Self::frame_sent`] after): the challenges due
    /// are queued, and the frame's seq, its `reserved` field (the format
    /// the next node gets now) and whether it is kept for NACKs (in
    /// [`Self::retx_mut`]). The seq is used only by [`Self::frame_sent`].
    pub fn next_frame(&mut self, now: Instant, kind: FrameKind) -> FrameHead {
        self.send_hellos(now);
        let reserved = self.reserved_for(kind);
        FrameHead { seq: self.seq, reserved, keep: reserved & flags::LEAP != 0 && self.retx.is_some() }
    }

    /// A driver sent frame `seq` of `len` bytes itself, or tried to (the
    /// seq is used up): `kept` in [`Self::retx_mut`] (the driver counted
    /// that copy), it is probed; the link looks often for a while.
    pub fn frame_sent(&mut self, now: Instant, seq: u16, kept: bool, len: usize) {
        self.seq = seq.wrapping_add(1);
        if kept {
            self.probe.sent(now, &self.cfg.timers, seq);
        }
        self.last_send = Some(now);
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += len as u64;
    }

    /// The driver failed to send a transmit of `kind` (`datagrams` of them
    /// at once): they are counted as a send error instead of as sent.
    pub fn transmit_failed(&mut self, kind: TransmitKind, datagrams: u64) {
        let s = &mut self.stats;
        s.send_errors += 1;
        match kind {
            TransmitKind::Hello => s.hellos_sent = s.hellos_sent.saturating_sub(datagrams),
            TransmitKind::Nack => s.nacks_sent = s.nacks_sent.saturating_sub(datagrams),
            TransmitKind::Retransmit => s.retransmits = s.retransmits.saturating_sub(datagrams),
            TransmitKind::Probe => s.probes = s.probes.saturating_sub(datagrams),
            TransmitKind::Chunks(n) => {
                s.chunks_sent = s.chunks_sent.saturating_sub(u64::from(n) * datagrams);
                s.datagrams_sent = s.datagrams_sent.saturating_sub(datagrams);
            }
        }
    }

    /// Queues the frames held for the next node's proof once it arrived
    /// or the wait is over; returns when the wait ends otherwise.
    fn release_held(&mut self, now: Instant) -> Option<Instant> {
        let until = self.held_until?;
        if !self.next_is_leap() && now < until {
            return Some(until);
        }
        if !self.next_is_leap() && self.auth.is_some() {
            log::warn!(
                "next node {} did not prove that it holds the ring key within {FIRST_PROOF_WAIT:?}; \
                 sending it keyed chunks, which only a holder of the key takes",
                self.cfg.next
            );
        } else if !self.next_is_leap() {
            log::info!(
                "next node {} did not prove to be a leap node within {FIRST_PROOF_WAIT:?}; \
                 sending it the original format until it does",
                self.cfg.next
            );
        }
        self.held_until = None;
        while let Some((seq, kind, frame)) = self.held.pop_front() {
            self.queue_frame(now, seq, kind, &frame, &[]);
        }
        None
    }

    /// Queues frame `seq`, `head ++ tail` (of a valid length), in the
    /// format the next node gets now.
    fn queue_frame(&mut self, now: Instant, seq: u16, kind: FrameKind, head: &[u8], tail: &[u8]) {
        self.send_hellos(now);
        let reserved = self.reserved_for(kind);
        let crc = (reserved & flags::CRC != 0).then(|| crc32c::crc32c_append(crc32c::crc32c(head), tail).to_le_bytes());
        let trailer: &[u8] = crc.as_ref().map_or(&[], |c| c);
        let len = head.len() + tail.len();
        let kept = match &mut self.retx {
            Some(retx) if reserved & flags::LEAP != 0 => {
                retx.store(seq, reserved, head, tail, trailer);
                self.stats.copied_bytes += len as u64;
                true
            }
            _ => false,
        };
        let data = (!kept).then(|| {
            // A copy `datagram.rs` does not make (it sends from the
            // caller's memory at once): counted, as every copy is.
            self.stats.copied_bytes += len as u64;
            let mut v = self.spare.pop().unwrap_or_default();
            v.clear();
            v.extend_from_slice(head);
            v.extend_from_slice(tail);
            v.extend_from_slice(trailer);
            v
        });
        self.queue_chunks(now, seq, reserved, len, trailer.len(), data);
    }

    /// Queues the chunks of frame `seq` of `len` bytes and a trailer of
    /// `trailer` bytes, sent with `reserved`: from `data`, else from the
    /// retransmit buffer, which keeps it.
    fn queue_chunks(
        &mut self,
        now: Instant,
        seq: u16,
        reserved: u16,
        len: usize,
        trailer: usize,
        data: Option<Vec<u8>>,
    ) {
        let kept = data.is_none();
        let total = chunks_for_stride(len + trailer, frame_bytes_per_chunk(reserved)).expect("checked by send");
        let k = if reserved & flags::LEAP != 0 { self.train } else { 1 };
        self.outgoing.push_back(Outgoing { seq, reserved, next_id: 0, total, train: k, data });
        if kept {
            self.probe.sent(now, &self.cfg.timers, seq);
        }
        self.last_send = Some(now);
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += len as u64;
    }

    /// Writes the next datagram to send into `buf` (at least
    /// [`leap_common::chunk::TRAIN_DATAGRAM_MAX`] bytes): hellos and NACKs
    /// first, then frames' chunks (trains to a next node that takes them),
    /// then retransmissions and probes. Counted as sent.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`leap_common::chunk::TRAIN_DATAGRAM_MAX`].
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        assert!(buf.len() >= leap_common::chunk::TRAIN_DATAGRAM_MAX, "a transmit buffer too small for a train");
        if let Some(q) = self.control.pop_front() {
            buf[..q.len].copy_from_slice(&q.bytes[..q.len]);
            match q.kind {
                TransmitKind::Hello => self.stats.hellos_sent += 1,
                _ => self.stats.nacks_sent += 1,
            }
            if q.kind == TransmitKind::Nack && self.auth.is_some() {
                let r = u16::from_be_bytes([buf[10], buf[11]]) | flags::AUTH;
                buf[10..12].copy_from_slice(&r.to_be_bytes());
            }
            // Sealed as it leaves: a NACK or hello sent again has a new
            // packet number.
            let len = Auth::seal_with(&mut self.auth, now, q.to, buf, q.len, q.current_key);
            let t = Transmit { to: q.to, len, kind: q.kind };
            self.free_bytes.push(q.bytes);
            return Some(t);
        }
        while let Some(mut o) = self.outgoing.pop_front() {
            let data = o.data.take();
            let next = self.cfg.next;
            let seal = self.auth.as_mut().map(|a| {
                let previous = a.use_previous(next, now);
                (&mut a.seals, next, previous)
            });
            let (len, n) = match &data {
                Some(d) => o.write(d, &[], buf, seal),
                None => match self.retx.as_ref().and_then(|r| r.get(o.seq)) {
                    Some((frame, _, trailer)) => o.write(frame, trailer, buf, seal),
                    // A kept frame forgotten before it left (the next
                    // node restarted, or the buffer wrapped).
                    None => continue,
                },
            };
            o.data = data;
            self.stats.chunks_sent += n as u64;
            self.stats.datagrams_sent += 1;
            if o.next_id < o.total {
                self.outgoing.push_front(o);
            } else if let Some(d) = o.data {
                self.spare.push(d);
            }
            return Some(Transmit { to: self.cfg.next, len, kind: TransmitKind::Chunks(n as u16) });
        }
        while let Some(r) = self.resend.front_mut() {
            let (Some((frame, reserved, trailer)), Some(&id)) =
                (self.retx.as_ref().and_then(|b| b.get(r.seq)), r.ids.get(r.at))
            else {
                if let Some(r) = self.resend.pop_front() {
                    self.free_ids.push(r.ids);
                }
                continue;
            };
            r.at += 1;
            let Some(len) = transmit::write_one(r.seq, reserved | flags::RETRANSMIT, frame, trailer, id, buf) else {
                continue;
            };
            // A copy sent again is sealed again: a new packet number.
            let len = Auth::seal(&mut self.auth, now, self.cfg.next, buf, len);
            let kind = r.kind;
            match kind {
                TransmitKind::Probe => self.stats.probes += 1,
                _ => self.stats.retransmits += 1,
            }
            return Some(Transmit { to: self.cfg.next, len, kind });
        }
        None
    }
}

/// A frame a driver sends itself (see [`Link::next_frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHead {
    /// Its seq.
    pub seq: u16,
    /// Its chunks' `reserved` field (with [`flags::CRC`]: a CRC32C trailer).
    pub reserved: u16,
    /// Kept for NACKs in [`Link::retx_mut`].
    pub keep: bool,
}

/// The CRC32C trailer a frame with `reserved` flags carries (`None`: the
/// format has none).
pub(crate) fn crc_trailer(reserved: u16, frame: &[u8]) -> Option<[u8; leap_common::chunk::CRC_TRAILER_LEN]> {
    (reserved & flags::CRC != 0).then(|| crc32c::crc32c(frame).to_le_bytes())
}

/// A path MTU as the log says it: the number, or "unknown".
pub struct MtuText(pub Option<usize>);

impl std::fmt::Display for MtuText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(m) => write!(f, "{m}"),
            None => f.write_str("unknown"),
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
