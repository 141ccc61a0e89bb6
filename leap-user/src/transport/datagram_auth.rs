//! Tags for the datagrams of a keyed ring (udp, xdp, xdp-ringbuf): every
//! datagram a keyed node sends carries a trailer, and a keyed node checks
//! it before the datagram may change any state.
//!
//! The link (`crate::link`) seals every datagram it sends with [`Seals`]
//! and opens every datagram it takes with [`Opener`] before anything else
//! looks at it; this module holds the trailer, the keys, the replay window
//! and the epoch rule, tested alone.
//!
//! In a chunk the trailer is the last 32 bytes of the payload
//! (`leap_common::chunk::flags::AUTH`): a keyed chunk is still a valid
//! LEAP chunk of at most 1 412 bytes, trains keep their stride, and each
//! chunk of a train is checked alone.
//!
//! # The trailer
//!
//! ```text
//! datagram | epoch (8, big-endian) | packet number (8, big-endian) | tag (16)
//! ```
//!
//! `epoch` names one run of the sending process, `packet number` counts
//! its datagrams from 0 (one counter for every destination, see
//! [`Seals`]). The key is derived with
//! HKDF-SHA256 from the ring key, the epoch, the sender's and the
//! receiver's addresses, so a datagram moved to another node, sent back to
//! its sender, or taken from another run does not verify. The tag is
//! AES-256-GCM's over the datagram and the trailer's first 16 bytes (with
//! `KeySet::encrypt`, under a key of its own: the datagram after its first
//! [`CLEAR_LEN`] bytes is encrypted in place, those bytes and the trailer's
//! first 16 are associated data), the
//! nonce the packet number: within one key (one epoch, one direction) the
//! number only grows, so a (key, nonce) pair is never used twice; two runs
//! of a process get different keys because their epochs differ.
//!
//! # Checks, in order, each before any state changes
//!
//! 1. The trailer is there (else `short`).
//! 2. The epoch is the sender's current one or newer (else `stale_epoch`:
//!    a datagram recorded before the sender restarted). Epochs grow: the
//!    start time in milliseconds since 1970 in the high bits, random low
//!    bits. A node whose clock stepped back behind its last run is refused
//!    until the clock passes it again; it logs why.
//! 3. The tag verifies under the ring key, else under the previous key
//!    during a rotation (else `bad_tag`). A new epoch costs one HKDF per
//!    key; the keys of at most [`PEERS`] senders are kept, so a flood of
//!    made-up epochs or addresses costs bounded work and memory.
//! 4. The packet number is inside the replay window and not seen before
//!    (else `replayed`); only now does the window move and, for a newer
//!    epoch, the sender's state reset.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use ring_crypto::aead;

use super::ring_key::{KeySet, RingKey, TAG_LEN, derive_key, frame_nonce, seal_into, tags_equal};

/// Bytes a keyed datagram carries after its payload.
pub const TRAILER_LEN: usize = 8 + 8 + TAG_LEN;
/// Packet numbers behind the highest one seen that are still taken (once).
pub const REPLAY_WINDOW: u64 = 1024;
/// Senders whose keys and windows are kept.
pub const PEERS: usize = 8;

/// Why a datagram of a keyed ring was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Shorter than its trailer.
    #[error("shorter than a keyed datagram's trailer")]
    Short,
    /// An epoch older than the sender's current one.
    #[error("from an older run of its sender")]
    StaleEpoch,
    /// The tag did not verify under any key held.
    #[error("its tag does not verify")]
    BadTag,
    /// A packet number already taken or too old for the window.
    #[error("replayed or too old")]
    Replayed,
}

/// An epoch for this run of the process: milliseconds since 1970 in the
/// high 44 bits (enough until the year 2527), 20 random bits below. (Two
/// runs of one node are more than a millisecond apart: binding its
/// sockets alone takes longer.) Microseconds would not fit: shifted by 20
/// bits they overflow, and the epoch would wrap every 203 days.
///
/// # Errors
///
/// The random source failed.
pub fn new_epoch() -> std::io::Result<u64> {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut r = [0u8; 4];
    getrandom::fill(&mut r).map_err(std::io::Error::other)?;
    Ok((ms << 20) | u64::from(u32::from_le_bytes(r) & 0xF_FFFF))
}

fn addr_bytes(a: SocketAddr) -> [u8; 18] {
    let mut b = [0u8; 18];
    match a {
        SocketAddr::V4(v4) => b[..16].copy_from_slice(&v4.ip().to_ipv6_mapped().octets()),
        SocketAddr::V6(v6) => b[..16].copy_from_slice(&v6.ip().octets()),
    }
    b[16..].copy_from_slice(&a.port().to_be_bytes());
    b
}

/// The key of the datagrams of `epoch` from `from` to `to`, tagged or
/// (`encrypt`) encrypted: another key for each.
fn direction_key(key: &RingKey, epoch: u64, from: SocketAddr, to: SocketAddr, encrypt: bool) -> aead::LessSafeKey {
    let (e, f, t) = (epoch.to_be_bytes(), addr_bytes(from), addr_bytes(to));
    let label: &[u8] = if encrypt { b"leap encrypted datagrams v1" } else { b"leap datagrams v1" };
    derive_key(key, label, &[&e, &f, &t])
}

/// Bytes at the start of an encrypted datagram that stay in clear (a
/// chunk's header: the XDP program and the train rule read it; the start
/// of a hello: its magic), authenticated as associated data.
pub const CLEAR_LEN: usize = leap_common::chunk::CHUNK_HEADER_LEN;

/// The associated data of an encrypted datagram: its clear start, then the
/// trailer's first 16 bytes.
fn clear_aad(clear: &[u8], head: &[u8; 16]) -> ([u8; CLEAR_LEN + 16], usize) {
    let mut aad = [0u8; CLEAR_LEN + 16];
    aad[..clear.len()].copy_from_slice(clear);
    aad[clear.len()..clear.len() + 16].copy_from_slice(head);
    (aad, clear.len() + 16)
}

/// Whether `body` (a datagram without its trailer) verifies under `key`
/// with trailer `head` and `got`. Encrypted (`encrypt`): `scratch` then
/// holds the datagram in clear.
#[allow(clippy::too_many_arguments, reason = "the trailer's parts and the mode, each needed")]
fn verify(
    key: &aead::LessSafeKey,
    pn: u64,
    body: &[u8],
    head: &[u8; 16],
    got: &[u8; TAG_LEN],
    encrypt: bool,
    scratch: &mut Vec<u8>,
) -> bool {
    if !encrypt {
        return tags_equal(&tag(key, pn, body, head, scratch), got);
    }
    let c = body.len().min(CLEAR_LEN);
    let (aad, n) = clear_aad(&body[..c], head);
    scratch.clear();
    scratch.extend_from_slice(body);
    let tag = aead::Tag::from(*got);
    key.open_in_place_separate_tag(frame_nonce(0, pn), aead::Aad::from(&aad[..n]), tag, &mut scratch[c..], 0..).is_ok()
}

/// The tag of `datagram` with the trailer's first 16 bytes `head`: AES-GCM
/// over both as plaintext, the ciphertext thrown away (as
/// `ring_key::seal_into` explains, the receiver computes it again).
fn tag(key: &aead::LessSafeKey, pn: u64, datagram: &[u8], head: &[u8; 16], scratch: &mut Vec<u8>) -> [u8; TAG_LEN] {
    scratch.clear();
    scratch.extend_from_slice(datagram);
    scratch.extend_from_slice(head);
    seal_into(key, frame_nonce(0, pn), scratch).expect("a datagram is far below AES-GCM's length limit")
}

/// Seals every datagram one run of a node sends, to any destination.
///
/// # Why a (key, nonce) pair is never used twice
///
/// The nonce is the packet number, and one counter numbers every datagram
/// this run seals, whatever its destination: within one key (one epoch,
/// one source, one destination) a number is used at most once, also when
/// the key of a destination is dropped from the cache below and derived
/// again, and a retransmission is sealed again with a new number (never the
/// first copy's trailer). Another run of the process has another epoch
/// ([`new_epoch`] grows from run to run), so other keys; two links of one
/// process have other source addresses (one socket each), so other keys.
/// 2^64 datagrams are centuries at any line rate.
pub struct Seals {
    encrypt: bool,
    current: RingKey,
    previous: Option<RingKey>,
    epoch: u64,
    from: SocketAddr,
    pn: u64,
    /// Keys of recent destinations, and whether each is the previous key
    /// (at most [`PEERS`]).
    dirs: Vec<(SocketAddr, bool, aead::LessSafeKey)>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Seals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seals")
            .field("epoch", &self.epoch)
            .field("from", &self.from)
            .field("pn", &self.pn)
            .finish_non_exhaustive()
    }
}

impl Seals {
    /// The seals of `epoch` ([`new_epoch`]) from `from` with `keys`.
    pub fn new(keys: &KeySet, epoch: u64, from: SocketAddr) -> Self {
        Self {
            encrypt: keys.encrypt,
            current: keys.current.clone(),
            previous: keys.previous.clone(),
            epoch,
            from,
            pn: 0,
            dirs: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Seals with `keys` from the next datagram on (new key files read by a
    /// running node). The epoch and the packet number go on: a key derived
    /// again for a ring key used before (the old current key now held as
    /// previous) never meets a packet number it has sealed.
    pub fn set_keys(&mut self, keys: &KeySet) {
        self.encrypt = keys.encrypt;
        self.current = keys.current.clone();
        self.previous = keys.previous.clone();
        self.dirs.clear();
    }

    /// Whether the set holds a previous key.
    pub fn has_previous(&self) -> bool {
        self.previous.is_some()
    }

    /// Whether a datagram to a destination whose own datagrams used the
    /// previous key (`Some(true)`), the current one (`Some(false)`), or
    /// that was not heard yet (`None`) is sealed with the previous key.
    ///
    /// A rotation without a lost frame: every node, one at a time, gets
    /// the new key with the old one as `previous`; it seals with the old
    /// key to a neighbour not heard yet or heard under the old key (one
    /// that may hold only the old), with the new key to one heard under
    /// the new key, and takes both. Once `previous` is dropped everywhere,
    /// only the new key is left.
    pub fn use_previous(&self, heard: Option<bool>) -> bool {
        self.previous.is_some() && heard.unwrap_or(true)
    }

    /// Writes the trailer of `buf[..len]`, a datagram to `to`, into
    /// `buf[len..]` (and, with `encrypt`, encrypts `buf[CLEAR_LEN..len]` in
    /// place); returns the sealed length (`len` + [`TRAILER_LEN`]).
    ///
    /// # Panics
    ///
    /// If `buf` has no room for the trailer.
    pub fn seal(&mut self, to: SocketAddr, previous: bool, buf: &mut [u8], len: usize) -> usize {
        let previous = previous && self.previous.is_some();
        let i = match self.dirs.iter().position(|(a, p, _)| *a == to && *p == previous) {
            Some(i) => i,
            None => {
                if self.dirs.len() >= PEERS {
                    self.dirs.remove(0);
                }
                let key = if previous { self.previous.as_ref().unwrap_or(&self.current) } else { &self.current };
                self.dirs.push((to, previous, direction_key(key, self.epoch, self.from, to, self.encrypt)));
                self.dirs.len() - 1
            }
        };
        let pn = self.pn;
        self.pn += 1;
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&self.epoch.to_be_bytes());
        head[8..].copy_from_slice(&pn.to_be_bytes());
        let key = &self.dirs[i].2;
        let t = if self.encrypt {
            let c = len.min(CLEAR_LEN);
            let (aad, n) = clear_aad(&buf[..c], &head);
            let t = key
                .seal_in_place_separate_tag(frame_nonce(0, pn), aead::Aad::from(&aad[..n]), &mut buf[c..len])
                .expect("a datagram is far below AES-GCM's length limit");
            t.as_ref().try_into().expect("AES-256-GCM tags are 16 bytes")
        } else {
            tag(key, pn, &buf[..len], &head, &mut self.scratch)
        };
        buf[len..len + 16].copy_from_slice(&head);
        buf[len + 16..len + TRAILER_LEN].copy_from_slice(&t);
        len + TRAILER_LEN
    }
}

/// Which packet numbers of one epoch were taken: the highest, and a bit per
/// number in the [`REPLAY_WINDOW`] below it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    /// One more than the highest number taken (0: none yet).
    top: u64,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl ReplayWindow {
    /// Whether `pn` may be taken (new, and not too old).
    pub fn fresh(&self, pn: u64) -> bool {
        if pn >= self.top {
            return true;
        }
        let age = self.top - 1 - pn;
        age < REPLAY_WINDOW && self.bits[(pn % REPLAY_WINDOW / 64) as usize] & (1 << (pn % 64)) == 0
    }

    /// Takes `pn` (after [`Self::fresh`] said yes).
    pub fn take(&mut self, pn: u64) {
        if pn >= self.top {
            // Clear the numbers the window moves over: at most all of it.
            let moved = (pn + 1 - self.top).min(REPLAY_WINDOW);
            for k in 0..moved {
                let n = self.top + k;
                self.bits[(n % REPLAY_WINDOW / 64) as usize] &= !(1 << (n % 64));
            }
            self.top = pn + 1;
        }
        self.bits[(pn % REPLAY_WINDOW / 64) as usize] |= 1 << (pn % 64);
    }
}

/// One sender as the opener knows it.
struct Peer {
    from: SocketAddr,
    epoch: u64,
    /// The key that verified this epoch's last datagram (current or
    /// previous), and during a rotation the other one: a sender that
    /// holds both moves from the old to the new when it hears the new.
    key: aead::LessSafeKey,
    other: Option<aead::LessSafeKey>,
    /// The ring keys `key` and `other` come from (kept so that new keys
    /// set on a running node ([`Opener::set_keys`]) derive them again).
    ring: RingKey,
    other_ring: Option<RingKey>,
    previous: bool,
    /// A datagram of this epoch verified under the current key since the
    /// keys were last set: the sender holds it, and datagrams of its under
    /// the previous key that arrive later were sealed before it moved.
    heard_current: bool,
    window: ReplayWindow,
    /// For eviction: the opener's count of datagrams taken when this peer
    /// last sent one.
    last: u64,
}

/// Checks the trailers of the datagrams arriving at `to`.
pub struct Opener {
    keys: KeySet,
    to: SocketAddr,
    peers: Vec<Peer>,
    taken: u64,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener").field("to", &self.to).field("peers", &self.peers.len()).finish_non_exhaustive()
    }
}

/// A datagram that verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// Bytes of the datagram without its trailer.
    pub len: usize,
    /// The sender started a newer run (its epoch moved).
    pub new_epoch: bool,
    /// It was tagged with the previous key (a ring changing keys).
    pub previous_key: bool,
}

impl Opener {
    /// An opener for the datagrams to `to` with `keys`.
    pub fn new(keys: KeySet, to: SocketAddr) -> Self {
        Self { keys, to, peers: Vec::new(), taken: 0, scratch: Vec::new() }
    }

    /// Whether the datagrams are encrypted (else tagged in clear).
    pub fn encrypts(&self) -> bool {
        self.keys.encrypt
    }

    /// After [`Self::open`] of an encrypted datagram: swaps the datagram in
    /// clear (its first [`Opened::len`] bytes) into `into`.
    pub fn swap_clear(&mut self, into: &mut Vec<u8>) {
        std::mem::swap(&mut self.scratch, into);
    }

    /// Whether `from` is to be taken as holding only the previous key: the
    /// last datagram that verified from it used the previous key, and none
    /// of its run did under the current key since the keys were set
    /// (`None`: none kept). Sticky once the current key was heard, so that
    /// old-key datagrams still in flight from a sender that has moved do
    /// not send this node back to the old key towards it.
    pub fn used_previous(&self, from: SocketAddr) -> Option<bool> {
        self.peers.iter().find(|p| p.from == from).map(|p| p.previous && !p.heard_current)
    }

    /// Takes `keys` in place of the keys held (new key files read by a
    /// running node), between two datagrams. Each known sender keeps its
    /// epoch and replay window (a datagram taken before is still refused);
    /// its keys are derived again from the new set: the ring key that
    /// verified its last datagram stays first if the set still holds it,
    /// else the new current key; the other key of the set is tried next,
    /// so a sender that moves keys is followed as before.
    pub fn set_keys(&mut self, keys: KeySet) {
        let encrypt = keys.encrypt;
        for p in &mut self.peers {
            let held = |k: &RingKey| *k == keys.current || keys.previous.as_ref() == Some(k);
            let ring = if held(&p.ring) { p.ring.clone() } else { keys.current.clone() };
            let other_ring = std::iter::once(&keys.current).chain(&keys.previous).find(|k| **k != ring).cloned();
            p.key = direction_key(&ring, p.epoch, p.from, self.to, encrypt);
            p.other = other_ring.as_ref().map(|k| direction_key(k, p.epoch, p.from, self.to, encrypt));
            p.previous = ring != keys.current;
            p.heard_current = !p.previous;
            p.ring = ring;
            p.other_ring = other_ring;
        }
        self.keys = keys;
    }

    /// Checks `datagram` from `from` (the checks of the module's docs) and
    /// returns the length of what it carries.
    ///
    /// # Errors
    ///
    /// [`Refused`]: nothing changed.
    pub fn open(&mut self, from: SocketAddr, datagram: &[u8]) -> Result<Opened, Refused> {
        let len = datagram.len().checked_sub(TRAILER_LEN).ok_or(Refused::Short)?;
        let (body, trailer) = datagram.split_at(len);
        let head: &[u8; 16] = trailer[..16].try_into().expect("16 bytes");
        let got: &[u8; TAG_LEN] = trailer[16..].try_into().expect("16 bytes");
        let epoch = u64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
        let pn = u64::from_be_bytes(head[8..].try_into().expect("8 bytes"));
        let known = self.peers.iter().position(|p| p.from == from);
        let encrypt = self.keys.encrypt;
        let check = |key: &aead::LessSafeKey, scratch: &mut Vec<u8>| verify(key, pn, body, head, got, encrypt, scratch);
        if let Some(i) = known {
            let p = &self.peers[i];
            if epoch < p.epoch {
                return Err(Refused::StaleEpoch);
            }
            if epoch == p.epoch {
                if !p.window.fresh(pn) {
                    return Err(Refused::Replayed);
                }
                if !check(&p.key, &mut self.scratch) {
                    if !p.other.as_ref().is_some_and(|k| check(k, &mut self.scratch)) {
                        return Err(Refused::BadTag);
                    }
                    let p = &mut self.peers[i];
                    std::mem::swap(&mut p.key, p.other.as_mut().expect("checked"));
                    std::mem::swap(&mut p.ring, p.other_ring.as_mut().expect("derived with other"));
                    p.previous = !p.previous;
                }
                self.taken += 1;
                let p = &mut self.peers[i];
                p.heard_current |= !p.previous;
                p.window.take(pn);
                p.last = self.taken;
                return Ok(Opened { len, new_epoch: false, previous_key: p.previous });
            }
        }
        // A sender not known, or a newer epoch of one: derive its keys.
        let candidates =
            std::iter::once((&self.keys.current, false)).chain(self.keys.previous.iter().map(|k| (k, true)));
        let mut found = None;
        for (k, previous) in candidates {
            let key = direction_key(k, epoch, from, self.to, encrypt);
            if check(&key, &mut self.scratch) {
                found = Some((key, previous));
                break;
            }
        }
        let (key, previous) = found.ok_or(Refused::BadTag)?;
        let (ring, other_ring) = match (&self.keys.previous, previous) {
            (Some(old), true) => (old.clone(), Some(self.keys.current.clone())),
            (Some(old), false) => (self.keys.current.clone(), Some(old.clone())),
            (None, _) => (self.keys.current.clone(), None),
        };
        let other = other_ring.as_ref().map(|k| direction_key(k, epoch, from, self.to, encrypt));
        self.taken += 1;
        let mut window = ReplayWindow::default();
        window.take(pn);
        let heard_current = !previous;
        let peer =
            Peer { from, epoch, key, other, ring, other_ring, previous, heard_current, window, last: self.taken };
        match known {
            Some(i) => self.peers[i] = peer,
            None if self.peers.len() < PEERS => self.peers.push(peer),
            None => {
                let oldest = (0..self.peers.len()).min_by_key(|&i| self.peers[i].last).expect("PEERS > 0");
                self.peers[oldest] = peer;
            }
        }
        Ok(Opened { len, new_epoch: known.is_some(), previous_key: previous })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: u8) -> KeySet {
        KeySet::new(RingKey::from_bytes([k; 32]))
    }

    fn a() -> SocketAddr {
        "10.0.0.1:7000".parse().unwrap()
    }

    fn b() -> SocketAddr {
        "10.0.0.2:7000".parse().unwrap()
    }

    /// [`Seals`] to one destination, sealing the current key's way.
    struct Sealer {
        seals: Seals,
        to: SocketAddr,
    }

    impl Sealer {
        fn new(keys: &KeySet, epoch: u64, from: SocketAddr, to: SocketAddr) -> Self {
            Self { seals: Seals::new(keys, epoch, from), to }
        }
    }

    fn sealed(s: &mut Sealer, body: &[u8]) -> Vec<u8> {
        let mut d = body.to_vec();
        d.resize(body.len() + TRAILER_LEN, 0);
        let n = s.seals.seal(s.to, false, &mut d, body.len());
        assert_eq!(n, d.len());
        d
    }

    #[test]
    fn sealed_datagrams_open_once_in_any_order_within_the_window() {
        let mut s = Sealer::new(&keys(1), 5, a(), b());
        let mut o = Opener::new(keys(1), b());
        let ds: Vec<Vec<u8>> = (0..100u8).map(|i| sealed(&mut s, &[i; 300])).collect();
        // Reordered: evens then odds, each once.
        for i in (0..100).step_by(2).chain((1..100).step_by(2)) {
            let got = o.open(a(), &ds[i]).unwrap();
            assert_eq!(got.len, 300);
            assert_eq!(&ds[i][..got.len], &[i as u8; 300][..]);
        }
        // Every one again: replays.
        for d in &ds {
            assert_eq!(o.open(a(), d), Err(Refused::Replayed));
        }
    }

    #[test]
    fn altered_moved_or_reflected_datagrams_fail_and_change_nothing() {
        let mut s = Sealer::new(&keys(1), 5, a(), b());
        let mut o = Opener::new(keys(1), b());
        let d = sealed(&mut s, b"LEAP chunk");
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 0x01;
            assert!(o.open(a(), &bad).is_err(), "byte {i} altered");
        }
        // From another address, or to another node, or back to its sender.
        assert_eq!(o.open("10.0.0.3:7000".parse().unwrap(), &d), Err(Refused::BadTag));
        assert_eq!(Opener::new(keys(1), "10.0.0.3:7000".parse().unwrap()).open(a(), &d), Err(Refused::BadTag));
        assert_eq!(Opener::new(keys(1), a()).open(b(), &d), Err(Refused::BadTag));
        // Another key.
        assert_eq!(Opener::new(keys(2), b()).open(a(), &d), Err(Refused::BadTag));
        assert_eq!(o.open(a(), &d[..TRAILER_LEN - 1]), Err(Refused::Short));
        // None of it moved anything: the intact datagram is still taken.
        assert_eq!(o.open(a(), &d).unwrap().len, 10);
    }

    #[test]
    fn a_newer_epoch_resets_the_sender_and_an_older_one_is_refused() {
        let mut o = Opener::new(keys(1), b());
        let mut first = Sealer::new(&keys(1), 100, a(), b());
        let old = sealed(&mut first, b"before the restart");
        let old2 = sealed(&mut first, b"also before");
        assert!(!o.open(a(), &old).unwrap().new_epoch);
        let mut second = Sealer::new(&keys(1), 200, a(), b());
        let d = sealed(&mut second, b"after");
        assert!(o.open(a(), &d).unwrap().new_epoch, "packet number 0 again, in a new epoch");
        assert_eq!(o.open(a(), &old2), Err(Refused::StaleEpoch), "recorded before the restart");
        // A forged newer epoch (no key) does not move the sender.
        let forged = sealed(&mut Sealer::new(&keys(9), 300, a(), b()), b"x");
        assert_eq!(o.open(a(), &forged), Err(Refused::BadTag));
        assert!(o.open(a(), &sealed(&mut second, b"still")).is_ok());
    }

    #[test]
    fn a_rotation_takes_both_keys_and_says_which() {
        let (old, new) = (RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
        let moved = KeySet { previous: Some(old.clone()), ..KeySet::new(new.clone()) };
        let mut o = Opener::new(moved, b());
        let from_old = sealed(&mut Sealer::new(&KeySet::new(old), 1, a(), b()), b"old");
        let got = o.open(a(), &from_old).unwrap();
        assert!(got.previous_key);
        let c: SocketAddr = "10.0.0.3:7000".parse().unwrap();
        let from_new = sealed(&mut Sealer::new(&KeySet::new(new), 1, c, b()), b"new");
        assert!(!o.open(c, &from_new).unwrap().previous_key);
    }

    #[test]
    fn seals_number_every_datagram_once_across_destinations() {
        let c: SocketAddr = "10.0.0.3:7000".parse().unwrap();
        let mut s = Seals::new(&keys(1), 7, a());
        let (mut ob, mut oc) = (Opener::new(keys(1), b()), Opener::new(keys(1), c));
        let mut pns = Vec::new();
        for i in 0..3 * PEERS as u16 {
            // Many destinations: keys are dropped and derived again.
            let to = if i % 2 == 0 { b() } else { SocketAddr::from(([10, 0, 2, 1], 1000 + i)) };
            let mut buf = [i as u8; 64 + TRAILER_LEN];
            let n = s.seal(to, false, &mut buf, 64);
            assert_eq!(n, 64 + TRAILER_LEN);
            pns.push(u64::from_be_bytes(buf[72..80].try_into().unwrap()));
            if to == b() {
                assert_eq!(ob.open(a(), &buf).unwrap().len, 64);
                assert_eq!(ob.open(a(), &buf), Err(Refused::Replayed));
                assert_eq!(oc.open(a(), &buf), Err(Refused::BadTag), "sealed for another node");
            }
        }
        let mut sorted = pns.clone();
        sorted.dedup();
        assert_eq!(sorted, pns, "one counter for every destination: strictly growing");
        assert!(pns.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_sender_moving_to_the_new_key_within_its_run_is_followed() {
        let (old, new) = (RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
        let both = KeySet { previous: Some(old), ..KeySet::new(new) };
        let mut o = Opener::new(both.clone(), b());
        let mut s = Seals::new(&both, 3, a());
        let mut seal = |previous: bool| {
            let mut d = [9u8; 20 + TRAILER_LEN];
            s.seal(b(), previous, &mut d, 20);
            d
        };
        assert!(o.open(a(), &seal(true)).unwrap().previous_key);
        assert_eq!(o.used_previous(a()), Some(true));
        assert!(!o.open(a(), &seal(false)).unwrap().previous_key, "the same run, now the new key");
        assert_eq!(o.used_previous(a()), Some(false));
        assert!(o.open(a(), &seal(true)).unwrap().previous_key);
        assert_eq!(o.used_previous(b()), None);
    }

    const YEAR_2025_MS: u64 = 1_735_689_600_000;

    #[test]
    fn epochs_grow_from_run_to_run_and_hold_the_time_in_milliseconds() {
        let a = new_epoch().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_epoch().unwrap();
        assert!(a < b, "{a:#x} {b:#x}");
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!((YEAR_2025_MS..=now_ms).contains(&(b >> 20)), "no wrap of the time shifted up: {b:#x}");
    }

    #[test]
    fn keys_set_on_a_running_node_take_effect_between_datagrams_and_keep_the_window() {
        let (k1, k2) = (RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
        let both = KeySet { previous: Some(k1.clone()), ..KeySet::new(k2.clone()) };
        let mut o = Opener::new(KeySet::new(k1.clone()), b());
        let mut s = Seals::new(&KeySet::new(k1.clone()), 3, a());
        let mut pns = Vec::new();
        let mut seal = |s: &mut Seals, previous: bool| {
            let mut d = [9u8; 20 + TRAILER_LEN];
            s.seal(b(), previous, &mut d, 20);
            pns.push(u64::from_be_bytes(d[28..36].try_into().unwrap()));
            d
        };
        let before = seal(&mut s, false);
        assert!(!o.open(a(), &before).unwrap().previous_key);
        // The receiver moves first: the sender's K1 is now its previous key.
        o.set_keys(both.clone());
        assert_eq!(o.open(a(), &before), Err(Refused::Replayed), "the window survives new keys");
        assert!(o.open(a(), &seal(&mut s, false)).unwrap().previous_key);
        assert_eq!(o.used_previous(a()), Some(true));
        // The sender moves: K1 to a neighbour heard under K1, then K2.
        s.set_keys(&both);
        assert!(s.use_previous(Some(true)) && !s.use_previous(Some(false)));
        assert!(o.open(a(), &seal(&mut s, true)).unwrap().previous_key);
        assert!(!o.open(a(), &seal(&mut s, false)).unwrap().previous_key, "followed onto K2");
        // A K1 datagram sealed before it moved, arriving late, is taken but
        // does not send the receiver back to K1 towards it.
        assert!(o.open(a(), &seal(&mut s, true)).unwrap().previous_key);
        assert_eq!(o.used_previous(a()), Some(false), "sticky once K2 was heard");
        // Both drop K1: K2 passes, a K1 datagram of the same run does not.
        o.set_keys(KeySet::new(k2.clone()));
        let stale = seal(&mut s, true);
        s.set_keys(&KeySet::new(k2));
        assert!(!s.use_previous(None));
        assert_eq!(o.open(a(), &stale), Err(Refused::BadTag), "K1 is no longer held");
        assert!(!o.open(a(), &seal(&mut s, false)).unwrap().previous_key);
        assert!(pns.windows(2).all(|w| w[0] < w[1]), "packet numbers go on across new keys: {pns:?}");
    }

    #[test]
    fn encrypted_datagrams_keep_their_header_in_clear_and_open_to_the_same_bytes() {
        let k = KeySet { encrypt: true, ..keys(4) };
        let mut s = Seals::new(&k, 9, a());
        let mut o = Opener::new(k, b());
        let body: Vec<u8> = (0..200u8).collect();
        let mut d = body.clone();
        d.resize(200 + TRAILER_LEN, 0);
        assert_eq!(s.seal(b(), false, &mut d, 200), 200 + TRAILER_LEN);
        assert_eq!(d[..CLEAR_LEN], body[..CLEAR_LEN], "the header stays in clear");
        assert_ne!(d[CLEAR_LEN..200], body[CLEAR_LEN..], "the rest does not");
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 0x80;
            assert!(o.open(a(), &bad).is_err(), "byte {i} altered");
        }
        // A tagging (not encrypting) node with the same key refuses it.
        assert_eq!(Opener::new(keys(4), b()).open(a(), &d), Err(Refused::BadTag));
        let got = o.open(a(), &d).unwrap();
        let mut clear = Vec::new();
        o.swap_clear(&mut clear);
        assert_eq!(&clear[..got.len], &body[..]);
        assert_eq!(o.open(a(), &d), Err(Refused::Replayed));
        // Shorter than the clear part: all of it clear, still tagged.
        let mut short = [7u8; 5 + TRAILER_LEN];
        s.seal(b(), false, &mut short, 5);
        assert_eq!(o.open(a(), &short).unwrap().len, 5);
    }

    #[test]
    fn the_window_at_its_edges() {
        let mut w = ReplayWindow::default();
        assert!(w.fresh(0));
        w.take(0);
        assert!(!w.fresh(0));
        w.take(REPLAY_WINDOW);
        // 0 is now exactly one window behind the top: too old.
        assert!(!w.fresh(0));
        assert!(w.fresh(1), "REPLAY_WINDOW - 1 behind: still taken once");
        w.take(1);
        assert!(!w.fresh(1));
        // A jump far ahead clears every bit it moves over.
        w.take(10 * REPLAY_WINDOW);
        for pn in 9 * REPLAY_WINDOW + 1..10 * REPLAY_WINDOW {
            assert!(w.fresh(pn), "{pn}");
        }
        assert!(!w.fresh(9 * REPLAY_WINDOW));
        // Near the end of the number space.
        let mut w = ReplayWindow::default();
        w.take(u64::MAX - 1);
        assert!(w.fresh(u64::MAX - 2) && !w.fresh(u64::MAX - 1));
    }

    #[test]
    fn the_window_agrees_with_a_set_on_random_orders() {
        // A seeded xorshift drives packet numbers around a moving top.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut w = ReplayWindow::default();
        let mut seen = std::collections::BTreeSet::new();
        let mut top = 0u64;
        for _ in 0..20_000 {
            let pn = (top + next() % 64).saturating_sub(next() % (REPLAY_WINDOW + 200));
            let model = !seen.contains(&pn) && (pn >= top || top - 1 - pn < REPLAY_WINDOW);
            assert_eq!(w.fresh(pn), model, "pn {pn} top {top}");
            if model {
                w.take(pn);
                seen.insert(pn);
                top = top.max(pn + 1);
            }
        }
    }

    #[test]
    fn made_up_senders_cost_bounded_memory() {
        let mut o = Opener::new(keys(1), b());
        for i in 0..100u16 {
            let from = SocketAddr::from(([10, 0, 1, 1], 1000 + i));
            let d = sealed(&mut Sealer::new(&keys(1), 1, from, b()), b"x");
            o.open(from, &d).unwrap();
            assert!(o.peers.len() <= PEERS);
        }
    }

    #[test]
    fn epochs_grow_from_run_to_run() {
        let e1 = new_epoch().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(new_epoch().unwrap() > e1);
    }
}
