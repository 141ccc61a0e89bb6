//! Recovering the source lock, as pure logic.
//!
//! A node with no previous node configured takes frames from the first
//! source that proves to be a leap node (its hellos, sent before its first
//! frame, are answered and it is challenged back: so it sends that frame,
//! and recovers its losses, as to a leap node), or else from the first
//! source a valid chunk came from; from no other. That first source may
//! have been a spoofer, or the previous node may have moved (restarted on
//! another port, or on another host): without recovery the link would be
//! deaf for good. The lock moves to another source only when both hold:
//!
//! - the locked source is gone: it left a hello this node sent it (a fresh
//!   nonce) unanswered for [`PROBE_WAIT`]. A live leap node answers hellos
//!   even while it is idle, so a quiet head keeps its lock, and only a host
//!   that receives at the locked address can answer, so a spoofer cannot
//!   keep it for a source that is gone. A locked source that never proved to
//!   be a leap node (the original, or a spoofer's first chunk) cannot answer
//!   at all: it must also have sent nothing valid for [`SILENCE`], so an
//!   original previous node that is sending keeps its lock; a spoofer that
//!   keeps sending keeps it too, and there the operator releases the lock
//!   (`leap stats --release-source`);
//! - the new source proved to be a leap node: it sent hellos and echoed
//!   this node's nonce, so it receives at the address it sends from (a blind
//!   spoofer cannot).
//!
//! One candidate is tracked at a time, and hellos from it are answered at
//! most once per [`crate::frame::peer::ANSWER_GAP`]: however many strangers
//! send hellos, the work and the state stay bounded. A configured previous
//! node is never replaced this way.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leap_common::hello::Hello;

use super::peer::{CHALLENGE_MAX_INTERVAL, Peer};

/// How long the locked source must have been silent before another source
/// may take its place.
pub const SILENCE: Duration = Duration::from_secs(3);
/// How long the locked source has to answer the hello that asks whether it
/// is still there.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);
/// A candidate that sent no hello for this long is forgotten (a leap node
/// challenges an unproven next node at least once a second).
pub const CANDIDATE_IDLE: Duration = Duration::from_secs(3);

const _: () = assert!(CANDIDATE_IDLE.as_millis() > CHALLENGE_MAX_INTERVAL.as_millis());

/// After the operator released the lock, how long only a source that
/// proves to be a leap node may take it; then the first valid chunk's
/// source does again (an original previous node cannot prove anything).
pub const RELEASE_PROOF_WINDOW: Duration = Duration::from_secs(2);

/// What a hello from a source other than the locked one led to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StrangerHello {
    /// Send this back to the stranger (it was taken as a candidate).
    pub reply: Option<Hello>,
    /// Send this to the locked source: is it still there?
    pub probe: Option<(Hello, SocketAddr)>,
}

/// The lock on a source learned from the first valid chunk.
#[derive(Debug)]
pub struct SourceLock {
    /// `None` once the operator released it.
    locked: Option<SocketAddr>,
    /// When the count of chunks taken last changed (or the lock was taken).
    heard: Instant,
    chunks: u64,
    candidate: Option<Candidate>,
    /// When the probe of the locked source went out, and its nonce.
    probed: Option<Instant>,
    probe_nonce: u64,
    /// Released: until when only a proven leap node may take the lock.
    proof_only_until: Option<Instant>,
    /// Whether a source ever held the lock (not at start).
    held: bool,
}

#[derive(Debug)]
struct Candidate {
    peer: Peer,
    last: Instant,
}

impl SourceLock {
    /// The lock taken on `src` at `now`, with `chunks` taken so far.
    pub fn new(src: SocketAddr, now: Instant, chunks: u64) -> Self {
        Self {
            locked: Some(src),
            heard: now,
            chunks,
            candidate: None,
            probed: None,
            probe_nonce: 0,
            proof_only_until: None,
            held: true,
        }
    }

    /// No source yet (a node without a configured previous node, at start):
    /// the first source that proves to be a leap node takes the lock at
    /// once, or the first valid chunk's source, whichever comes first.
    pub fn unlocked(now: Instant) -> Self {
        Self { locked: None, held: false, ..Self::new(([0, 0, 0, 0], 0).into(), now, 0) }
    }

    /// Whether no source ever held the lock ([`Self::unlocked`], and nothing
    /// took it yet).
    pub fn never_held(&self) -> bool {
        !self.held
    }

    /// The candidate's state if it is at `src`, taken (a chunk from it
    /// takes the lock first: its proof, half-way, goes on).
    pub fn take_candidate(&mut self, src: SocketAddr) -> Option<Peer> {
        if self.candidate.as_ref().is_some_and(|c| c.peer.addr() == src) {
            return self.candidate.take().map(|c| c.peer);
        }
        None
    }

    /// The lock released by the operator at `now`: for
    /// [`RELEASE_PROOF_WINDOW`] only a source that proves to be a leap node
    /// takes it, then the first valid chunk's source.
    pub fn released(now: Instant) -> Self {
        Self {
            locked: None,
            proof_only_until: Some(now + RELEASE_PROOF_WINDOW),
            ..Self::new(([0, 0, 0, 0], 0).into(), now, 0)
        }
    }

    /// The locked source (`None`: released).
    pub fn source(&self) -> Option<SocketAddr> {
        self.locked
    }

    /// Whether a chunk from an unknown source may take a released lock.
    pub fn chunk_may_take(&self, now: Instant) -> bool {
        self.locked.is_none() && self.proof_only_until.is_none_or(|t| now >= t)
    }

    /// The count of chunks taken (all from the locked source, or from
    /// someone spoofing its address) is `chunks` at `now`: if it moved, the
    /// source is not silent. Looked at only when a stranger asks, so the
    /// receive path pays nothing for it.
    pub fn observe(&mut self, now: Instant, chunks: u64) {
        if chunks != self.chunks {
            self.chunks = chunks;
            self.heard = self.heard.max(now);
        }
    }

    /// A hello from the locked source: if it echoes the probe, the source
    /// is there, and whoever asked to take its place waits again. Returns
    /// whether it did.
    pub fn locked_hello(&mut self, h: &Hello) -> bool {
        if self.probed.is_none() || h.echo == 0 || h.echo != self.probe_nonce {
            return false;
        }
        self.probed = None;
        self.candidate = None;
        true
    }

    /// Whether the locked source has been silent long enough for another
    /// source to be considered.
    pub fn silent(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.heard) >= SILENCE
    }

    /// A hello from `src`, not the locked source; `locked_is_leap` says
    /// whether the locked source proved to be a leap node. It is answered
    /// (and `src` challenged) only while the locked source may be gone (or
    /// the lock is released), and only for one candidate at a time; `None`
    /// means: drop it, as any datagram from a wrong source.
    pub fn stranger_hello(
        &mut self,
        src: SocketAddr,
        h: &Hello,
        now: Instant,
        locked_is_leap: bool,
        (epoch, caps): (u64, u32),
    ) -> Option<StrangerHello> {
        let open = match self.locked {
            None => true,
            Some(l) => l != src && (locked_is_leap || self.silent(now)),
        };
        if !open {
            return None;
        }
        match &self.candidate {
            Some(c) if c.peer.addr() != src && now.saturating_duration_since(c.last) < CANDIDATE_IDLE => return None,
            Some(c) if c.peer.addr() == src => {}
            _ => self.candidate = Some(Candidate { peer: Peer::new(src), last: now }),
        }
        let c = self.candidate.as_mut().expect("set above");
        c.last = now;
        let outcome = c.peer.on_hello(h, now, epoch, caps);
        let mut out = StrangerHello { reply: outcome.reply, probe: None };
        if c.peer.proven().is_some() && self.probed.is_none() {
            self.probed = Some(now);
            if let Some(locked) = self.locked {
                self.probe_nonce = super::peer::random_u64();
                out.probe = Some((Hello { echo: 0, nonce: self.probe_nonce, epoch, caps }, locked));
            }
        }
        Some(out)
    }

    /// When [`Self::poll`] may next move the lock, if a move is pending.
    pub fn due(&self) -> Option<Instant> {
        let wait = if self.locked.is_some() { PROBE_WAIT } else { Duration::ZERO };
        self.probed.map(|t| t + wait)
    }

    /// Moves the lock if it is due: the candidate proved to be a leap node
    /// and the locked source left the probe unanswered (or the lock was
    /// released). Returns the candidate, which is the new locked source, and
    /// the source that held the lock.
    pub fn poll(&mut self, now: Instant) -> Option<(Peer, Option<SocketAddr>)> {
        now.checked_duration_since(self.due()?)?;
        self.probed = None;
        let c = self.candidate.take()?;
        c.peer.proven()?;
        let old = self.locked.replace(c.peer.addr());
        self.proof_only_until = None;
        self.held = true;
        self.heard = now;
        Some((c.peer, old))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    /// A candidate at `src` that hellos, is challenged and echoes the nonce.
    fn prove(lock: &mut SourceLock, src: SocketAddr, now: Instant) -> StrangerHello {
        let first =
            lock.stranger_hello(src, &Hello { echo: 0, nonce: 7, epoch: 9, caps: 0 }, now, false, (1, 0)).unwrap();
        let challenge = first.reply.expect("answered").nonce;
        assert_ne!(challenge, 0);
        let later = now + Duration::from_millis(1);
        lock.stranger_hello(src, &Hello { echo: challenge, nonce: 8, epoch: 9, caps: 0 }, later, false, (1, 0)).unwrap()
    }

    #[test]
    fn a_live_source_keeps_its_lock() {
        let t0 = Instant::now();
        let mut lock = SourceLock::new(addr(1), t0, 0);
        let hello = Hello { echo: 0, nonce: 7, epoch: 9, caps: 0 };
        // Not silent yet: strangers' hellos are dropped.
        assert!(lock.stranger_hello(addr(2), &hello, t0 + SILENCE / 2, false, (1, 0)).is_none());
        let t1 = t0 + SILENCE;
        let out = prove(&mut lock, addr(2), t1);
        let (probe, to) = out.probe.expect("the locked source is asked once the candidate proved");
        assert_eq!(to, addr(1));
        // Chunks (maybe spoofed) and hellos that do not echo the probe
        // prove nothing.
        lock.observe(t1, 5);
        assert!(!lock.locked_hello(&Hello { echo: probe.nonce ^ 1, nonce: 3, epoch: 9, caps: 0 }));
        // It answers: no move, and the candidate is forgotten.
        assert!(lock.locked_hello(&Hello { echo: probe.nonce, nonce: 3, epoch: 9, caps: 0 }));
        assert!(lock.poll(t1 + PROBE_WAIT * 3).is_none());
        assert_eq!(lock.source(), Some(addr(1)));
        assert!(lock.due().is_none());
    }

    #[test]
    fn a_gone_source_gives_way_to_a_proven_leap_node() {
        let t0 = Instant::now();
        let mut lock = SourceLock::new(addr(1), t0, 0);
        let t1 = t0 + SILENCE;
        assert!(prove(&mut lock, addr(2), t1).probe.is_some());
        assert!(lock.poll(t1 + PROBE_WAIT / 2).is_none(), "too early");
        let (peer, old) = lock.poll(t1 + PROBE_WAIT + Duration::from_millis(1)).expect("moved");
        assert_eq!((peer.addr(), old, lock.source()), (addr(2), Some(addr(1)), Some(addr(2))));
        assert!(peer.proven().is_some());
    }

    #[test]
    fn a_leap_source_is_probed_at_once_and_chunks_from_its_address_do_not_keep_it() {
        let t0 = Instant::now();
        let mut lock = SourceLock::new(addr(1), t0, 0);
        let hello = Hello { echo: 0, nonce: 7, epoch: 9, caps: 0 };
        // The locked source proved to be a leap node: no silence needed,
        // only its answer counts.
        let first = lock.stranger_hello(addr(2), &hello, t0, true, (1, 0)).unwrap();
        let echo = Hello { echo: first.reply.unwrap().nonce, nonce: 8, epoch: 9, caps: 0 };
        assert!(lock.stranger_hello(addr(2), &echo, t0, true, (1, 0)).unwrap().probe.is_some());
        lock.observe(t0 + PROBE_WAIT / 2, 9);
        assert!(lock.poll(t0 + PROBE_WAIT).is_some());
    }

    #[test]
    fn a_silent_unproven_source_is_not_replaced_while_chunks_come() {
        let t0 = Instant::now();
        let mut lock = SourceLock::new(addr(1), t0, 0);
        let hello = Hello { echo: 0, nonce: 7, epoch: 9, caps: 0 };
        lock.observe(t0 + SILENCE, 1);
        assert!(lock.stranger_hello(addr(2), &hello, t0 + SILENCE + SILENCE / 2, false, (1, 0)).is_none());
    }

    #[test]
    fn an_unproven_stranger_never_takes_the_lock() {
        let t0 = Instant::now();
        let mut lock = SourceLock::new(addr(1), t0, 0);
        let t1 = t0 + SILENCE * 2;
        // Hellos without the echo (a blind spoofer cannot echo the nonce).
        for i in 0..100u64 {
            let h = Hello { echo: i + 1, nonce: 5, epoch: 9, caps: 0 };
            let out = lock.stranger_hello(addr(2), &h, t1 + Duration::from_millis(i), false, (1, 0)).unwrap();
            assert!(out.probe.is_none());
        }
        assert!(lock.poll(t1 + SILENCE).is_none());
        assert_eq!(lock.source(), Some(addr(1)));
    }

    #[test]
    fn one_candidate_at_a_time() {
        let t0 = Instant::now();
        let mut lock = SourceLock::new(addr(1), t0, 0);
        let t1 = t0 + SILENCE;
        let hello = Hello { echo: 0, nonce: 7, epoch: 9, caps: 0 };
        assert!(lock.stranger_hello(addr(2), &hello, t1, false, (1, 0)).is_some());
        // Others are dropped while the first is active...
        for port in 3..1000 {
            assert!(lock.stranger_hello(addr(port), &hello, t1 + Duration::from_millis(1), false, (1, 0)).is_none());
        }
        // ... and may take its place once it went quiet.
        assert!(lock.stranger_hello(addr(3), &hello, t1 + CANDIDATE_IDLE, false, (1, 0)).is_some());
    }

    #[test]
    fn a_released_lock_goes_to_a_proven_leap_node_at_once_then_to_any_chunk() {
        let t0 = Instant::now();
        let mut lock = SourceLock::released(t0);
        assert!(!lock.chunk_may_take(t0 + RELEASE_PROOF_WINDOW / 2));
        assert!(lock.chunk_may_take(t0 + RELEASE_PROOF_WINDOW));
        let out = prove(&mut lock, addr(2), t0);
        assert!(out.probe.is_none(), "nobody to ask");
        let (peer, old) = lock.poll(t0 + Duration::from_millis(1)).expect("taken at once");
        assert_eq!((peer.addr(), old, lock.source()), (addr(2), None, Some(addr(2))));
        assert!(!lock.chunk_may_take(t0 + RELEASE_PROOF_WINDOW * 2));
    }

    #[test]
    fn at_start_the_first_source_to_prove_itself_takes_the_lock_at_once() {
        let t0 = Instant::now();
        let mut lock = SourceLock::unlocked(t0);
        assert!(lock.never_held() && lock.source().is_none());
        assert!(lock.chunk_may_take(t0), "a chunk may still take it first");
        // Hellos before any chunk are answered (the sender proves us before
        // its first frame) and the sender is challenged back.
        let out = prove(&mut lock, addr(2), t0);
        assert!(out.probe.is_none(), "nobody to ask");
        // `prove` echoes the challenge 1 ms after it was sent.
        let proven_at = t0 + Duration::from_millis(1);
        let (peer, old) = lock.poll(proven_at).expect("taken at once");
        assert_eq!((peer.addr(), old, lock.source()), (addr(2), None, Some(addr(2))));
        assert!(peer.proven().is_some() && !lock.never_held());
        assert!(!lock.chunk_may_take(proven_at));
    }

    #[test]
    fn a_chunk_from_the_candidate_keeps_its_proof_going() {
        let t0 = Instant::now();
        let mut lock = SourceLock::unlocked(t0);
        let hello = Hello { echo: 0, nonce: 7, epoch: 9, caps: 0 };
        let challenge = lock.stranger_hello(addr(2), &hello, t0, false, (1, 0)).unwrap().reply.unwrap().nonce;
        assert!(lock.take_candidate(addr(3)).is_none());
        let mut peer = lock.take_candidate(addr(2)).expect("the candidate");
        let r = peer.on_hello(&Hello { echo: challenge, nonce: 0, epoch: 9, caps: 0 }, t0, 1, 0);
        assert!(r.proven, "the echo of the challenge sent before the chunk still proves it");
    }

    #[test]
    fn the_locked_source_itself_is_no_candidate() {
        let t0 = Instant::now();
        let mut lock = SourceLock::new(addr(1), t0, 0);
        let hello = Hello { echo: 0, nonce: 7, epoch: 9, caps: 0 };
        assert!(lock.stranger_hello(addr(1), &hello, t0 + SILENCE * 2, true, (1, 0)).is_none());
    }
}
