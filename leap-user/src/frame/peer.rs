//! Proof that a neighbour is a leap node, as pure logic: the challenges a
//! node sends with [`Hello`] datagrams, the answers it gives, and what it
//! concludes.
//!
//! Until a neighbour's address has echoed a random nonce this node sent it,
//! the neighbour is treated as the original LEAP: chunks to it carry exactly
//! what the original sends, its `reserved` field is ignored, no NACKs or
//! probes are exchanged. The original never sends a hello and never echoes
//! one (it starts with no LEAP magic), so neither its echo of `reserved` nor
//! anything else it does can pass for a leap node. A proven neighbour that
//! shows a new epoch, proven the same way, has restarted.

use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leap_common::hello::Hello;

/// First wait between challenges of an unproven neighbour, doubling up to
/// [`CHALLENGE_MAX_INTERVAL`].
pub const CHALLENGE_INTERVAL: Duration = Duration::from_millis(5);
/// Longest wait between challenges of a neighbour that does not answer (an
/// original node gets one 40-byte hello a second, which it ignores).
pub const CHALLENGE_MAX_INTERVAL: Duration = Duration::from_secs(1);
/// Least time between two answers to the same neighbour: hellos cost
/// bounded work, whoever sends them.
pub const ANSWER_GAP: Duration = Duration::from_micros(500);

/// A random, non-zero 64-bit value from the operating system's random
/// source (`getrandom(2)`): nonces that prove a neighbour and epochs must
/// not be guessable from outside.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Err(e) = getrandom::fill(&mut b) {
        // getrandom(2) fails only on kernels older than 3.17 without
        // /dev/urandom; std's per-process random SipHash keys over a
        // counter are the best left there.
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| log::warn!("getrandom failed ({e}); hello nonces come from std's hasher keys"));
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return std::collections::hash_map::RandomState::new().hash_one(n).max(1);
    }
    u64::from_ne_bytes(b).max(1)
}

/// What a proven neighbour announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proven {
    /// Its process epoch.
    pub epoch: u64,
    /// Its [`leap_common::hello::caps`].
    pub caps: u32,
}

/// What an incoming hello changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HelloOutcome {
    /// Send this back to the neighbour.
    pub reply: Option<Hello>,
    /// The neighbour has just been proven a leap node.
    pub proven: bool,
    /// ... and it is a new process at the same address (it restarted).
    pub restarted: bool,
}

/// One neighbour's state.
#[derive(Debug)]
pub struct Peer {
    addr: SocketAddr,
    nonce: u64,
    proven: Option<Proven>,
    /// A hello claimed a new epoch: challenge again before believing it.
    verifying: bool,
    next_challenge: Option<Instant>,
    interval: Duration,
    last_answer: Option<Instant>,
}

impl Peer {
    /// A neighbour at `addr`, unproven; the first challenge is due at once.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            nonce: random_u64(),
            proven: None,
            verifying: false,
            next_challenge: None,
            interval: CHALLENGE_INTERVAL,
            last_answer: None,
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it proved, if it did.
    pub fn proven(&self) -> Option<Proven> {
        self.proven
    }

    /// A challenge to send now, if one is due (an unproven neighbour, or one
    /// that claimed to have restarted); and when the next one is due.
    pub fn challenge(&mut self, now: Instant, epoch: u64, caps: u32) -> (Option<Hello>, Option<Instant>) {
        if self.proven.is_some() && !self.verifying {
            return (None, None);
        }
        let due = *self.next_challenge.get_or_insert(now);
        if now < due {
            return (None, Some(due));
        }
        let next = now + self.interval;
        self.next_challenge = Some(next);
        self.interval = (self.interval * 2).min(CHALLENGE_MAX_INTERVAL);
        (Some(Hello { echo: 0, nonce: self.nonce, epoch, caps }), Some(next))
    }

    /// A challenge to send now, outside the schedule (a node that took new
    /// ring keys tells its neighbours so, and hears their answer under the
    /// new key); an answer proves nothing new for the same epoch.
    pub fn announce(&self, epoch: u64, caps: u32) -> Hello {
        Hello { echo: 0, nonce: self.nonce, epoch, caps }
    }

    /// Makes the next challenge due at once, the wait between challenges
    /// starting over (unless it is proven): a node about to send its first
    /// frame asks now, instead of after the backed-off wait that an earlier
    /// challenge, sent before the neighbour was listening, left.
    pub fn challenge_now(&mut self) {
        if self.proven.is_none() || self.verifying {
            self.next_challenge = None;
            self.interval = CHALLENGE_INTERVAL;
        }
    }

    /// Takes a hello that came from this neighbour's address.
    pub fn on_hello(&mut self, h: &Hello, now: Instant, epoch: u64, caps: u32) -> HelloOutcome {
        let mut out = HelloOutcome::default();
        if h.echo != 0 && h.echo == self.nonce {
            let before = self.proven;
            self.proven = Some(Proven { epoch: h.epoch, caps: h.caps });
            self.nonce = random_u64();
            self.verifying = false;
            self.interval = CHALLENGE_INTERVAL;
            self.next_challenge = None;
            out.proven = before.is_none() || before.is_some_and(|b| b.epoch != h.epoch);
            out.restarted = before.is_some_and(|b| b.epoch != h.epoch);
        } else if self.proven.is_some_and(|p| p.epoch != h.epoch) && !self.verifying {
            // Maybe a restart, maybe a forgery: believe it once proven.
            self.verifying = true;
            self.interval = CHALLENGE_INTERVAL;
            self.next_challenge = None;
        }
        if h.nonce != 0 && self.last_answer.is_none_or(|t| now.saturating_duration_since(t) >= ANSWER_GAP) {
            self.last_answer = Some(now);
            let challenge = if self.proven.is_none() || self.verifying { self.nonce } else { 0 };
            out.reply = Some(Hello { echo: h.nonce, nonce: challenge, epoch, caps });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn two_leap_nodes_prove_each_other_in_three_hellos() {
        let now = Instant::now();
        let (mut a_sees_b, mut b_sees_a) = (Peer::new(addr(2)), Peer::new(addr(1)));
        let (c, _) = a_sees_b.challenge(now, 11, 3);
        let c = c.unwrap();
        let r = b_sees_a.on_hello(&c, now, 22, 3);
        assert!(!r.proven);
        let r = a_sees_b.on_hello(&r.reply.unwrap(), now, 11, 3);
        assert!(r.proven && !r.restarted);
        assert_eq!(a_sees_b.proven(), Some(Proven { epoch: 22, caps: 3 }));
        let r = b_sees_a.on_hello(&r.reply.unwrap(), now, 22, 3);
        assert!(r.proven);
        assert_eq!(b_sees_a.proven().unwrap().epoch, 11);
        // Proven: no more challenges, no reply without a nonce.
        assert_eq!(a_sees_b.challenge(now, 11, 3).0, None);
        assert_eq!(r.reply, None);
    }

    #[test]
    fn an_echo_of_anything_but_our_nonce_proves_nothing() {
        let now = Instant::now();
        let mut p = Peer::new(addr(2));
        let r = p.on_hello(&Hello { echo: 12345, nonce: 0, epoch: 1, caps: 3 }, now, 9, 3);
        assert!(!r.proven && r.reply.is_none());
        assert!(p.proven().is_none());
    }

    #[test]
    fn a_claimed_restart_is_believed_only_once_proven() {
        let now = Instant::now();
        let mut p = Peer::new(addr(2));
        let nonce = p.challenge(now, 9, 3).0.unwrap().nonce;
        p.on_hello(&Hello { echo: nonce, nonce: 0, epoch: 1, caps: 3 }, now, 9, 3);
        // A forged hello with another epoch: a new challenge, no restart yet.
        let r = p.on_hello(&Hello { echo: 0, nonce: 77, epoch: 2, caps: 3 }, now, 9, 3);
        assert!(!r.restarted);
        let challenge = r.reply.unwrap();
        assert_eq!(challenge.echo, 77);
        assert_ne!(challenge.nonce, 0);
        assert_eq!(p.proven().unwrap().epoch, 1);
        // The real restarted node answers it.
        let r = p.on_hello(&Hello { echo: challenge.nonce, nonce: 0, epoch: 2, caps: 3 }, now, 9, 3);
        assert!(r.restarted);
    }

    #[test]
    fn a_challenge_is_due_at_once_when_asked_for() {
        let t0 = Instant::now();
        let mut p = Peer::new(addr(2));
        for ms in 0..3000 {
            let _ = p.challenge(t0 + Duration::from_millis(ms), 1, 0);
        }
        let now = t0 + Duration::from_millis(3000);
        assert!(p.challenge(now, 1, 0).0.is_none(), "backed off");
        p.challenge_now();
        assert!(p.challenge(now, 1, 0).0.is_some());
        assert_eq!(p.challenge(now, 1, 0).1, Some(now + CHALLENGE_INTERVAL), "the wait starts over");
    }

    #[test]
    fn challenges_back_off_and_answers_are_rate_limited() {
        let t0 = Instant::now();
        let mut p = Peer::new(addr(2));
        let mut sent = 0;
        for ms in 0..10_000 {
            if p.challenge(t0 + Duration::from_millis(ms), 1, 0).0.is_some() {
                sent += 1;
            }
        }
        assert!(sent <= 20, "{sent} challenges in 10 s");
        let h = Hello { echo: 0, nonce: 5, epoch: 1, caps: 0 };
        let replies = (0..100).filter(|_| p.on_hello(&h, t0, 1, 0).reply.is_some()).count();
        assert_eq!(replies, 1);
    }
}
