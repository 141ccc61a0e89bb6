//! A ring key, the mutual proof of it that a TCP connection between two
//! ring members makes before any frame crosses it, and the tag (and
//! optionally the encryption) of every frame on that connection.
//!
//! # The handshake
//!
//! Whoever connects (the previous node, sending to its next) and whoever
//! accepts each show that they hold a key, on nonces both chose for this
//! connection, so a recorded exchange proves nothing on another:
//!
//! ```text
//! connecting -> accepting   hello  = "LEAPKEY2" | flags | nc | id(current) | id(previous)  (8+1+32+8+8)
//! accepting  -> connecting  answer = ns | flags | id(chosen) | MAC(k, "s" | hello | ns | flags | id)  (32+1+8+32)
//! connecting -> accepting   MAC(k, "c" | hello | answer)                                          (32)
//! ```
//!
//! `id(k)` names a key without showing it (the first 8 bytes of a keyed
//! BLAKE2s of a constant). The accepting side chooses the first key of the
//! hello's that it holds too, so during a rotation a node that already
//! proves with the new key still meets one that holds only the old (see
//! [`KeySet::previous`]). `flags` says whether frames are encrypted: both
//! ends must agree, and each checks it. MAC is keyed BLAKE2s-256
//! (RustCrypto's `blake2`), compared in constant time.
//!
//! The connecting side sends no frame before it has checked the accepting
//! side's MAC, so a member aimed at a service that is not a leap member of
//! the same ring forwards nothing to it but the 57-byte hello; the
//! accepting side takes no frame from a connection that has not proven the
//! key, and goes on accepting. Each read has a deadline, so a peer that
//! stops mid-way costs bounded time.
//!
//! # Frames
//!
//! Both ends then derive one key per direction with HKDF-SHA256 (`ring`):
//! the chosen ring key as input, `nc | ns` as salt, the direction as info.
//! Every frame carries a 16-byte AES-256-GCM tag ([`Sealer`], [`Opener`]),
//! with the frame encrypted when `flags` says so (see [`seal_into`] for
//! the tag of a frame sent in clear). The nonce is the frame's kind and its number on
//! this connection in this direction. It never repeats under one key: the
//! number only grows (a connection that would reach 2^64 frames fails
//! instead), and every connection has keys of its own because both ends
//! put fresh random nonces into the salt, so a restarted node or a new
//! connection never reuses a (key, nonce) pair, which is what GCM's
//! security rests on. The receiver counts the same way, so a frame
//! replayed, dropped, reordered or moved from another connection or the
//! other direction fails its tag, and a frame whose tag fails ends the
//! connection.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use blake2::Blake2sMac256;
use blake2::digest::{KeyInit, Mac};
use ring_crypto::{aead, hkdf};

/// Bytes of a ring key.
pub const KEY_LEN: usize = 32;
/// Bytes of the tag after every frame of a keyed connection.
pub const TAG_LEN: usize = 16;
/// What a connecting member sends first.
const MAGIC: &[u8; 8] = b"LEAPKEY2";
const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;
/// Bytes of a key's id ([`RingKey::id`]).
pub const ID_LEN: usize = 8;
const HELLO_LEN: usize = MAGIC.len() + 1 + NONCE_LEN + 2 * ID_LEN;
const ANSWER_LEN: usize = NONCE_LEN + 1 + ID_LEN + MAC_LEN;
/// `flags`: frames are encrypted.
const ENCRYPT: u8 = 1;
/// `flags`: frames carry no tag (the key proves the ends only).
const UNTAGGED: u8 = 2;

/// A secret every member of one ring holds (`leap bench --hosts` makes a
/// fresh one per run and hands it to each member inside its authenticated
/// session; operators make one with `leap key new`). Its `Debug` never
/// shows the bytes.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingKey([u8; KEY_LEN]);

impl fmt::Debug for RingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RingKey(..)")
    }
}

/// Why a key file was not taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// As for the benchmark token: the file's type, owner or mode.
    #[error(transparent)]
    File(#[from] crate::secret_file::SecretFileError),
    /// Not 64 hexadecimal digits.
    #[error(
        "the key file {path} does not hold a key: write 64 hexadecimal digits (make one with `leap key new {path}`)"
    )]
    Malformed {
        /// The file.
        path: String,
    },
}

impl RingKey {
    /// The key of these bytes.
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// A fresh key from the operating system's random source.
    ///
    /// # Errors
    ///
    /// `getrandom(2)` failed.
    pub fn random() -> io::Result<Self> {
        let mut k = [0; KEY_LEN];
        getrandom::fill(&mut k).map_err(io::Error::other)?;
        Ok(Self(k))
    }

    /// The key's bytes.
    pub const fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// Reads a key file: 64 hexadecimal digits on the first line, in a
    /// regular file owned by root or this user, mode 0600 or stricter (the
    /// checks of the benchmark token).
    ///
    /// # Errors
    ///
    /// [`KeyFileError`], naming the fix.
    pub fn from_file(path: &Path) -> Result<Self, KeyFileError> {
        let text = crate::secret_file::read(path, "key", 2 * KEY_LEN + 2)?;
        let malformed = || KeyFileError::Malformed { path: path.display().to_string() };
        let hex = text.lines().next().unwrap_or("").trim();
        if hex.len() != 2 * KEY_LEN {
            return Err(malformed());
        }
        let mut k = [0; KEY_LEN];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(malformed)?, 16).map_err(|_| malformed())?;
        }
        Ok(Self(k))
    }

    /// The key as a key file's text (64 hexadecimal digits and a newline).
    pub fn to_file_text(&self) -> String {
        let mut s: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        s.push('\n');
        s
    }

    /// The key's name on the wire: it identifies the key and shows nothing
    /// of it.
    pub fn id(&self) -> [u8; ID_LEN] {
        let mut m = self.keyed();
        m.update(b"leap ring key id");
        let full = m.finalize().into_bytes();
        full[..ID_LEN].try_into().expect("BLAKE2s-256 is longer than an id")
    }

    fn keyed(&self) -> Blake2sMac256 {
        <Blake2sMac256 as KeyInit>::new_from_slice(&self.0).expect("a 32-byte key fits BLAKE2s")
    }

    fn mac(&self, parts: &[&[u8]]) -> Blake2sMac256 {
        let mut m = self.keyed();
        for p in parts {
            m.update(p);
        }
        m
    }
}

/// The keys of one member: the one it proves with, and during a rotation
/// the one it still accepts, and whether its frames are encrypted.
///
/// Rotating a ring's key without stopping it: give every node the new key
/// as `current` and the old one as `previous`, node by node (a running
/// transport takes them through [`crate::Transport::key_control`]: the
/// datagram transports from the next datagram, tcp from its next
/// connection, an established one keeping the key it proved, with a
/// warning once its node no longer holds that key); a
/// connection between a node that has moved and one that has not proves
/// the old key, and the moved node logs each time it does. When no such
/// line shows any more, drop `previous` everywhere.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeySet {
    /// The key this member proves first.
    pub current: RingKey,
    /// A key still accepted while the ring changes over.
    pub previous: Option<RingKey>,
    /// Frames are encrypted, not only tagged (both ends must agree).
    pub encrypt: bool,
    /// Frames carry tags (both ends must agree). Off, the key only proves
    /// the connection's ends (what `leap bench --hosts` uses for its
    /// per-run key, so that its tcp rows stay comparable with the unkeyed
    /// paths); `encrypt` turns it on.
    pub tag_frames: bool,
}

impl KeySet {
    /// One key, frames tagged, not encrypted.
    pub const fn new(current: RingKey) -> Self {
        Self { current, previous: None, encrypt: false, tag_frames: true }
    }

    /// One key that proves the connection's ends only (frames untagged).
    pub const fn proof_only(current: RingKey) -> Self {
        Self { current, previous: None, encrypt: false, tag_frames: false }
    }

    /// The keys of a rotation step for a running ring: `current` and, if
    /// given, `previous` read from their key files (checked as when
    /// opening), with this set's `encrypt` and tagging, which a ring keeps
    /// while it runs. What the bindings hand to
    /// [`crate::transport::KeyControl::set_keys`].
    ///
    /// # Errors
    ///
    /// [`KeyFileError`] of the file named first that cannot be used, with
    /// which of the two it is.
    pub fn reread(&self, current: &Path, previous: Option<&Path>) -> Result<Self, (&'static str, KeyFileError)> {
        let current = RingKey::from_file(current).map_err(|e| ("key_file", e))?;
        let previous = previous.map(RingKey::from_file).transpose().map_err(|e| ("previous_key_file", e))?;
        Ok(Self { current, previous, ..self.clone() })
    }

    /// Whether frames carry tags.
    pub const fn tags(&self) -> bool {
        self.tag_frames || self.encrypt
    }

    fn flags(&self) -> u8 {
        let mut f = if self.encrypt { ENCRYPT } else { 0 };
        if !self.tags() {
            f |= UNTAGGED;
        }
        f
    }

    /// A short name of the keys for the log: the first bytes of each key's
    /// id (which shows nothing of the key).
    pub fn describe(&self) -> String {
        let short = |k: &RingKey| log_name(&k.id());
        match &self.previous {
            Some(p) => format!("key {} (previous {})", short(&self.current), short(p)),
            None => format!("key {}", short(&self.current)),
        }
    }

    /// Whether the key of id `id` ([`RingKey::id`]) is one of these.
    pub fn holds(&self, id: &[u8]) -> bool {
        self.by_id(id).is_some()
    }

    fn by_id(&self, id: &[u8]) -> Option<&RingKey> {
        std::iter::once(&self.current).chain(&self.previous).find(|k| k.id() == id)
    }

    fn is_previous(&self, k: &RingKey) -> bool {
        self.previous.as_ref() == Some(k) && *k != self.current
    }
}

/// A key's name in the log: the first bytes of its id
/// ([`RingKey::id`]), which shows nothing of the key.
pub(crate) fn log_name(id: &[u8]) -> String {
    id.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// Why new keys were not taken by an open transport
/// ([`crate::transport::KeyControl::set_keys`]); the keys in use stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyChangeError {
    /// The transport was opened without a key: a ring does not become
    /// keyed while it runs.
    #[error("this node runs without a ring key; a ring becomes keyed only when its nodes start with key_file")]
    Unkeyed,
    /// The new keys encrypt where the ring's do not, or the other way round.
    #[error("the new keys set `encrypt` unlike the running ring; change `encrypt` on every node alike, with a restart")]
    Encryption,
    /// The backend has no keys to change (kmod, or no transport open).
    #[error("this transport takes no ring key")]
    NotSupported,
}

/// Why a connection did not prove the ring key./// Why a connection did not prove the ring key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProofError {
    /// The peer does not speak the keyed handshake (an unkeyed node, an
    /// original node, or another service).
    #[error("the peer is not a keyed leap member (no LEAPKEY2 hello)")]
    NotKeyed,
    /// The peer answered with a proof of another key.
    #[error("the peer holds another ring key")]
    WrongKey,
    /// One end encrypts (or tags) frames and the other does not.
    #[error("the peer {peer}: set `encrypt` alike on every node of the ring")]
    Encryption {
        /// What the peer does: "uses encryption", "does not use encryption",
        /// "does not tag frames" or "tags frames".
        peer: &'static str,
    },
    /// Reading or writing failed, or the deadline passed.
    #[error("ring-key handshake: {0}")]
    Io(#[from] io::Error),
}

/// A frame whose tag did not verify: forged, altered, replayed or out of
/// order. Its bytes must not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a frame failed its ring-key tag (forged, altered, replayed or reordered)")]
pub struct Forged;

/// One direction of a keyed connection: its key, the number of its next
/// frame, and a buffer to run frames through AES-GCM.
struct Direction {
    key: aead::LessSafeKey,
    seq: u64,
    encrypt: bool,
    scratch: Vec<u8>,
}

impl fmt::Debug for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direction").field("seq", &self.seq).field("encrypt", &self.encrypt).finish_non_exhaustive()
    }
}

impl Direction {
    fn new(key: aead::LessSafeKey, encrypt: bool) -> Self {
        Self { key, seq: 0, encrypt, scratch: Vec::new() }
    }

    /// The nonce of the next frame, of kind `kind`; `None` after 2^64 - 1.
    fn next_nonce(&mut self, kind: u8) -> Option<aead::Nonce> {
        let seq = self.seq;
        self.seq = seq.checked_add(1)?;
        Some(frame_nonce(kind, seq))
    }
}

/// Tags (and encrypts) the frames of one direction of a keyed connection.
#[derive(Debug)]
pub struct Sealer(Direction);

/// Checks (and decrypts) the frames of one direction of a keyed
/// connection, in the order they were sealed.
#[derive(Debug)]
pub struct Opener(Direction);

/// The nonce of frame `seq` of kind `kind`: unique per key as long as
/// `seq` never repeats (see the module's docs).
pub(crate) fn frame_nonce(kind: u8, seq: u64) -> aead::Nonce {
    let mut n = [0; aead::NONCE_LEN];
    n[0] = kind;
    n[4..].copy_from_slice(&seq.to_be_bytes());
    aead::Nonce::assume_unique_for_key(n)
}

/// The tag of a frame that travels in clear is AES-GCM's tag of the frame
/// as plaintext (the ciphertext is thrown away), which the receiver
/// computes again from the frame it got and compares in constant time.
/// AES-GCM's tag authenticates the ciphertext, and the ciphertext is the
/// plaintext masked by a keystream fixed by (key, nonce): a frame altered
/// anywhere gives another ciphertext, which a forger without the key
/// cannot tag. Not passing the frame as associated data instead is a
/// matter of speed: `ring` hashes associated data a block at a time,
/// about four times slower here than its encryption, which interleaves
/// AES and GHASH over many blocks.
pub(crate) fn seal_into(key: &aead::LessSafeKey, nonce: aead::Nonce, frame: &mut [u8]) -> io::Result<[u8; TAG_LEN]> {
    let tag = key
        .seal_in_place_separate_tag(nonce, aead::Aad::empty(), frame)
        .map_err(|_| io::Error::other("AES-GCM refused a frame of this length"))?;
    Ok(tag.as_ref().try_into().expect("AES-256-GCM tags are 16 bytes"))
}

impl Sealer {
    /// Tags the frame made of `parts` (of kind `kind`: 0 data, 1
    /// control). Returns its tag, which goes after the frame, and, when the
    /// connection encrypts, the ciphertext to send in place of `parts`.
    ///
    /// # Errors
    ///
    /// Only when the connection has sealed 2^64 - 1 frames and must be
    /// opened again, or AES-GCM refuses a frame over 64 GiB.
    pub fn seal(&mut self, kind: u8, parts: &[&[u8]]) -> io::Result<([u8; TAG_LEN], Option<&[u8]>)> {
        let d = &mut self.0;
        let nonce = d.next_nonce(kind).ok_or_else(|| io::Error::other("2^64 frames on one keyed connection"))?;
        d.scratch.clear();
        for p in parts {
            d.scratch.extend_from_slice(p);
        }
        let tag = seal_into(&d.key, nonce, &mut d.scratch)?;
        Ok((tag, d.encrypt.then_some(&d.scratch[..])))
    }
}

impl Opener {
    /// Checks `frame`'s tag (decrypting it in place when the connection
    /// encrypts). The next frame is expected to be the one sealed after it,
    /// also when this one fails (the connection must end then).
    ///
    /// # Errors
    ///
    /// [`Forged`]: the frame's bytes are not the sender's.
    pub fn open(&mut self, kind: u8, frame: &mut [u8], tag: &[u8; TAG_LEN]) -> Result<(), Forged> {
        let d = &mut self.0;
        let nonce = d.next_nonce(kind).ok_or(Forged)?;
        if d.encrypt {
            let tag = aead::Tag::from(*tag);
            return d
                .key
                .open_in_place_separate_tag(nonce, aead::Aad::empty(), tag, frame, 0..)
                .map(|_| ())
                .map_err(|_| Forged);
        }
        d.scratch.clear();
        d.scratch.extend_from_slice(frame);
        let ours = seal_into(&d.key, nonce, &mut d.scratch).map_err(|_| Forged)?;
        if tags_equal(&ours, tag) { Ok(()) } else { Err(Forged) }
    }
}

/// Whether two tags are equal, in time that does not depend on where they
/// differ.
pub(crate) fn tags_equal(a: &[u8; TAG_LEN], b: &[u8; TAG_LEN]) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(&a[..], &b[..]))
}

/// The AES-256-GCM key HKDF-SHA256 derives from `secret` with `salt` and
/// the parts of `info`.
pub(crate) fn derive_key(secret: &RingKey, salt: &[u8], info: &[&[u8]]) -> aead::LessSafeKey {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(secret.bytes());
    let okm = prk.expand(info, &aead::AES_256_GCM).expect("32 bytes are within HKDF-SHA256's limit");
    aead::LessSafeKey::new(aead::UnboundKey::from(okm))
}

/// What a proven connection holds: its two directions' keys.
#[derive(Debug)]
pub struct Session {
    /// Frames this end sends.
    pub sealer: Sealer,
    /// Frames this end receives.
    pub opener: Opener,
    /// The key proven was the [`KeySet::previous`] one.
    pub used_previous: bool,
    /// The id ([`RingKey::id`]) of the key proven ([`KeySet::holds`]).
    pub key_id: [u8; ID_LEN],
}

/// The AES-256-GCM key of one direction.
fn direction_key(key: &RingKey, nc: &[u8], ns: &[u8], info: &'static [u8]) -> aead::LessSafeKey {
    let mut salt = [0; 2 * NONCE_LEN];
    salt[..NONCE_LEN].copy_from_slice(nc);
    salt[NONCE_LEN..].copy_from_slice(ns);
    derive_key(key, &salt, &[info])
}

fn session(key: &RingKey, keys: &KeySet, nc: &[u8], ns: &[u8], connecting: bool) -> Session {
    let c2s = direction_key(key, nc, ns, b"leap tcp frames, connecting to accepting");
    let s2c = direction_key(key, nc, ns, b"leap tcp frames, accepting to connecting");
    let (tx, rx) = if connecting { (c2s, s2c) } else { (s2c, c2s) };
    Session {
        sealer: Sealer(Direction::new(tx, keys.encrypt)),
        opener: Opener(Direction::new(rx, keys.encrypt)),
        used_previous: keys.is_previous(key),
        key_id: key.id(),
    }
}

fn nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0; NONCE_LEN];
    getrandom::fill(&mut n).map_err(io::Error::other)?;
    Ok(n)
}

/// Runs `f` with `deadline` on the stream's reads and writes, then clears it.
fn with_deadline<T>(
    s: &mut TcpStream,
    deadline: Duration,
    f: impl FnOnce(&mut TcpStream) -> Result<T, ProofError>,
) -> Result<T, ProofError> {
    let d = Some(deadline.max(Duration::from_millis(1)));
    s.set_read_timeout(d)?;
    s.set_write_timeout(d)?;
    let r = f(s);
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    r
}

fn encryption_mismatch(ours: u8, theirs: u8) -> ProofError {
    let peer = match (theirs & ENCRYPT != 0, theirs & UNTAGGED != 0) {
        (true, _) => "uses encryption",
        (false, _) if ours & ENCRYPT != 0 => "does not use encryption",
        (false, true) => "does not tag frames",
        (false, false) => "tags frames",
    };
    ProofError::Encryption { peer }
}

/// The connecting side: proves a key of `keys` to the node it connected to
/// and checks that node's proof, within `deadline` per step.
///
/// # Errors
///
/// [`ProofError`]: nothing may be sent on the stream then.
pub fn prove_connecting(s: &mut TcpStream, keys: &KeySet, deadline: Duration) -> Result<Session, ProofError> {
    with_deadline(s, deadline, |s| {
        let nc = nonce()?;
        let mut hello = [0; HELLO_LEN];
        hello[..8].copy_from_slice(MAGIC);
        hello[8] = keys.flags();
        hello[9..9 + NONCE_LEN].copy_from_slice(&nc);
        hello[9 + NONCE_LEN..9 + NONCE_LEN + ID_LEN].copy_from_slice(&keys.current.id());
        if let Some(p) = &keys.previous {
            hello[9 + NONCE_LEN + ID_LEN..].copy_from_slice(&p.id());
        }
        s.write_all(&hello)?;
        let mut answer = [0; ANSWER_LEN];
        read_or(s, &mut answer, ProofError::NotKeyed)?;
        let (ns, rest) = answer.split_at(NONCE_LEN);
        let (flags, rest) = rest.split_at(1);
        let (id, mac) = rest.split_at(ID_LEN);
        let key = keys.by_id(id).ok_or(ProofError::WrongKey)?;
        key.mac(&[b"s", &hello, ns, flags, id]).verify_slice(mac).map_err(|_| ProofError::WrongKey)?;
        if flags[0] != keys.flags() {
            return Err(encryption_mismatch(keys.flags(), flags[0]));
        }
        s.write_all(&key.mac(&[b"c", &hello, &answer]).finalize().into_bytes())?;
        Ok(session(key, keys, &nc, ns, true))
    })
}

/// The accepting side: checks the connecting node's hello and proof of a
/// key of `keys`, proving it too, within `deadline` per step.
///
/// # Errors
///
/// [`ProofError`]: the connection must be dropped unread.
pub fn prove_accepting(s: &mut TcpStream, keys: &KeySet, deadline: Duration) -> Result<Session, ProofError> {
    with_deadline(s, deadline, |s| {
        let mut hello = [0; HELLO_LEN];
        read_or(s, &mut hello, ProofError::NotKeyed)?;
        if &hello[..8] != MAGIC {
            return Err(ProofError::NotKeyed);
        }
        let nc = &hello[9..9 + NONCE_LEN];
        let offered = [&hello[9 + NONCE_LEN..9 + NONCE_LEN + ID_LEN], &hello[9 + NONCE_LEN + ID_LEN..]];
        // Ours first: the newer key wins when both ends hold both.
        let chosen =
            std::iter::once(&keys.current).chain(&keys.previous).find(|k| offered.iter().any(|o| *o == k.id()));
        let ns = nonce()?;
        let mut answer = [0; ANSWER_LEN];
        answer[..NONCE_LEN].copy_from_slice(&ns);
        answer[NONCE_LEN] = keys.flags();
        let Some(key) = chosen else {
            // An answer with no key named: the connecting side reports
            // another key, not a broken peer.
            s.write_all(&answer)?;
            return Err(ProofError::WrongKey);
        };
        answer[NONCE_LEN + 1..NONCE_LEN + 1 + ID_LEN].copy_from_slice(&key.id());
        let mac = key.mac(&[b"s", &hello, &answer[..NONCE_LEN + 1 + ID_LEN]]).finalize().into_bytes();
        answer[NONCE_LEN + 1 + ID_LEN..].copy_from_slice(&mac);
        s.write_all(&answer)?;
        if hello[8] != keys.flags() {
            return Err(encryption_mismatch(keys.flags(), hello[8]));
        }
        let mut proof = [0; MAC_LEN];
        read_or(s, &mut proof, ProofError::WrongKey)?;
        key.mac(&[b"c", &hello, &answer]).verify_slice(&proof).map_err(|_| ProofError::WrongKey)?;
        Ok(session(key, keys, nc, &ns, false))
    })
}

/// `read_exact`, with a peer that closes early reported as `closed`.
fn read_or(s: &mut TcpStream, buf: &mut [u8], closed: ProofError) -> Result<(), ProofError> {
    match s.read_exact(buf) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(closed),
        r => Ok(r?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const LIMIT: Duration = Duration::from_secs(5);

    fn keys(k: u8) -> KeySet {
        KeySet::new(RingKey::from_bytes([k; 32]))
    }

    /// Runs the accepting side with `accept` on a loopback listener and the
    /// connecting side `connect`; both results.
    fn pair<C: Send + 'static>(
        accept: KeySet,
        connect: impl FnOnce(&mut TcpStream) -> C + Send + 'static,
    ) -> (Result<Session, ProofError>, C) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            connect(&mut s)
        });
        let (mut s, _) = l.accept().unwrap();
        let a = prove_accepting(&mut s, &accept, LIMIT);
        drop(s);
        (a, c.join().unwrap())
    }

    fn proven(accept: KeySet, connect: KeySet) -> (Session, Session) {
        let (a, c) = pair(accept, move |s| prove_connecting(s, &connect, LIMIT));
        (a.unwrap(), c.unwrap())
    }

    #[test]
    fn the_same_key_proves_both_ends() {
        let k = KeySet::new(RingKey::random().unwrap());
        let (a, c) = proven(k.clone(), k);
        assert!(!a.used_previous && !c.used_previous);
    }

    #[test]
    fn another_key_is_refused_on_both_ends() {
        let (a, c) = pair(keys(1), |s| prove_connecting(s, &keys(2), LIMIT));
        assert!(matches!(c, Err(ProofError::WrongKey)), "{c:?}");
        assert!(matches!(a, Err(ProofError::WrongKey)), "{a:?}");
    }

    #[test]
    fn during_a_rotation_a_moved_node_meets_an_unmoved_one_on_the_old_key() {
        let (old, new) = (RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
        let moved = KeySet { previous: Some(old.clone()), ..KeySet::new(new.clone()) };
        // Moved node accepting, unmoved connecting, and the other way round.
        let (a, c) = proven(moved.clone(), KeySet::new(old.clone()));
        assert!(a.used_previous && !c.used_previous);
        let (a, c) = proven(KeySet::new(old.clone()), moved.clone());
        assert!(!a.used_previous && c.used_previous);
        // Two moved nodes use the new key.
        let (a, c) = proven(moved.clone(), moved);
        assert!(!a.used_previous && !c.used_previous);
        // After the changeover a node holding only the old key is out.
        let (a, c) = pair(KeySet::new(new), move |s| prove_connecting(s, &KeySet::new(old), LIMIT));
        assert!(matches!((&a, &c), (Err(ProofError::WrongKey), Err(ProofError::WrongKey))), "{a:?} {c:?}");
    }

    #[test]
    fn both_ends_must_agree_on_encryption() {
        let enc = KeySet { encrypt: true, ..keys(3) };
        let (a, c) = pair(keys(3), move |s| prove_connecting(s, &enc, LIMIT));
        assert!(matches!(c, Err(ProofError::Encryption { peer: "does not use encryption" })), "{c:?}");
        assert!(matches!(a, Err(ProofError::Encryption { peer: "uses encryption" })), "{a:?}");
        assert!(a.unwrap_err().to_string().contains("set `encrypt` alike"));
        // Tagged frames against a key that proves the ends only.
        let (a, c) = pair(keys(3), |s| prove_connecting(s, &KeySet::proof_only(RingKey::from_bytes([3; 32])), LIMIT));
        assert!(matches!(c, Err(ProofError::Encryption { peer: "tags frames" })), "{c:?}");
        assert!(matches!(a, Err(ProofError::Encryption { peer: "does not tag frames" })), "{a:?}");
    }

    #[test]
    fn an_unkeyed_peer_gets_nothing_and_is_refused() {
        // A raw-framing sender writes frame bytes at once.
        let (a, _) = pair(keys(1), |s| s.write_all(&[0xAB; 64]).unwrap());
        assert!(matches!(a, Err(ProofError::NotKeyed)), "{a:?}");
    }

    #[test]
    fn a_service_that_is_not_a_member_gets_only_the_hello() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(&[0x55; ANSWER_LEN]).unwrap();
            let mut got = Vec::new();
            s.set_read_timeout(Some(LIMIT)).unwrap();
            let _ = s.read_to_end(&mut got);
            got
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let r = prove_connecting(&mut s, &keys(3), LIMIT);
        assert!(matches!(r, Err(ProofError::WrongKey)), "{r:?}");
        drop(s);
        let got = server.join().unwrap();
        assert_eq!(got.len(), HELLO_LEN, "only the hello reached the service");
        assert_eq!(&got[..MAGIC.len()], MAGIC);
    }

    #[test]
    fn a_silent_peer_costs_at_most_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let _silent = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(s);
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let start = std::time::Instant::now();
        let r = prove_connecting(&mut s, &keys(4), Duration::from_millis(200));
        assert!(matches!(r, Err(ProofError::Io(_))), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(2), "bounded by the deadline");
    }

    #[test]
    fn debug_never_shows_the_key() {
        assert_eq!(format!("{:?}", RingKey::from_bytes([7; 32])), "RingKey(..)");
        assert!(!format!("{:?}", keys(7)).contains("7, 7"));
    }

    /// Frames sealed by one end open at the other, in order, in both
    /// directions, tagged or encrypted.
    #[test]
    fn frames_open_in_order_in_both_directions() {
        for encrypt in [false, true] {
            let k = KeySet { encrypt, ..keys(5) };
            let (mut a, mut c) = proven(k.clone(), k);
            for (i, len) in [1usize, 15, 16, 17, 16_392, 1 << 20].into_iter().enumerate() {
                let plain: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
                let (tag, cipher) = c.sealer.seal(0, &[&plain[..7.min(len)], &plain[7.min(len)..]]).unwrap();
                let mut f = cipher.map_or_else(|| plain.clone(), <[u8]>::to_vec);
                assert_eq!(f != plain, encrypt, "encrypted only when asked");
                a.opener.open(0, &mut f, &tag).unwrap();
                assert_eq!(f, plain);
                let (tag, cipher) = a.sealer.seal(1, &[&plain]).unwrap();
                let mut back = cipher.map_or_else(|| plain.clone(), <[u8]>::to_vec);
                c.opener.open(1, &mut back, &tag).unwrap();
                assert_eq!(back, plain);
            }
        }
    }

    #[test]
    fn altered_replayed_reordered_or_reflected_frames_fail() {
        for encrypt in [false, true] {
            let k = KeySet { encrypt, ..keys(6) };
            let (mut a, mut c) = proven(k.clone(), k);
            let frames: Vec<(Vec<u8>, [u8; TAG_LEN])> = (0..4u8)
                .map(|i| {
                    let f = vec![i; 64];
                    let (t, cipher) = c.sealer.seal(0, &[&f]).unwrap();
                    (cipher.map_or(f.clone(), <[u8]>::to_vec), t)
                })
                .collect();
            // A flipped bit in the frame.
            let (mut f, t) = frames[0].clone();
            f[10] ^= 1;
            assert_eq!(a.opener.open(0, &mut f, &t), Err(Forged));
            // The opener moved on: frame 0, even intact, is now a replay.
            let (mut f, t) = frames[0].clone();
            assert_eq!(a.opener.open(0, &mut f, &t), Err(Forged));
            // Frame 3 where frame 2 is expected: reordered.
            let (mut f, t) = frames[3].clone();
            assert_eq!(a.opener.open(0, &mut f, &t), Err(Forged));
            // Frame 3 in its place (the opener skipped to it) but of another
            // kind than sealed: a data frame passed off as control.
            let (mut f, t) = frames[3].clone();
            assert_eq!(a.opener.open(1, &mut f, &t), Err(Forged));
            // Reflected: a frame of this direction fed back to its sender.
            let (mut f, t) = frames[1].clone();
            assert_eq!(c.opener.open(0, &mut f, &t), Err(Forged));
        }
    }

    #[test]
    fn another_connection_with_the_same_key_has_other_frame_keys() {
        let (mut a1, mut c1) = proven(keys(8), keys(8));
        let (mut a2, _c2) = proven(keys(8), keys(8));
        let mut f = vec![9u8; 100];
        let (t, _) = c1.sealer.seal(0, &[&f]).unwrap();
        assert_eq!(a2.opener.open(0, &mut f.clone(), &t), Err(Forged), "moved to another connection");
        a1.opener.open(0, &mut f, &t).unwrap();
    }

    #[test]
    fn key_files_are_checked_and_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("leap-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("ring.key");
        let k = RingKey::random().unwrap();
        crate::secret_file::create(&p, &k.to_file_text()).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(RingKey::from_file(&p).unwrap(), k);
        assert!(crate::secret_file::create(&p, "x").is_err(), "never over an existing file");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = RingKey::from_file(&p).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        let bad = dir.join("bad.key");
        crate::secret_file::create(&bad, "not a key\n").unwrap();
        let e = RingKey::from_file(&bad).unwrap_err();
        assert!(matches!(e, KeyFileError::Malformed { .. }) && e.to_string().contains("leap key new"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rotation_step_reads_both_files_and_keeps_the_rings_mode() {
        let dir = std::env::temp_dir().join(format!("leap-reread-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (old, new) = (RingKey::random().unwrap(), RingKey::random().unwrap());
        let (po, pn, bad) = (dir.join("old.key"), dir.join("new.key"), dir.join("bad.key"));
        crate::secret_file::create(&po, &old.to_file_text()).unwrap();
        crate::secret_file::create(&pn, &new.to_file_text()).unwrap();
        crate::secret_file::create(&bad, "not a key\n").unwrap();
        let running = KeySet { encrypt: true, ..KeySet::new(old.clone()) };
        let step = running.reread(&pn, Some(&po)).unwrap();
        assert_eq!(step, KeySet { current: new.clone(), previous: Some(old.clone()), ..running.clone() });
        let last = step.reread(&pn, None).unwrap();
        assert_eq!((last.previous, last.encrypt, last.tag_frames), (None, true, true));
        let proof = KeySet::proof_only(old);
        assert!(!proof.reread(&pn, None).unwrap().tags(), "the tagging of the running ring stays");
        assert_eq!(running.reread(&bad, Some(&po)).unwrap_err().0, "key_file");
        assert_eq!(running.reread(&pn, Some(&bad)).unwrap_err().0, "previous_key_file");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
