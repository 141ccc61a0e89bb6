//! A ring key, and the mutual proof of it that a TCP connection between
//! two ring members makes before any frame crosses it.
//!
//! Whoever connects (the previous node, sending to its next) and whoever
//! accepts each show that they hold the key, on nonces both chose for this
//! connection, so a recorded exchange proves nothing on another:
//!
//! ```text
//! connecting  -> accepting   "LEAPKEY1" | nc            (8 + 32 bytes)
//! accepting   -> connecting  ns | MAC(key, "s" | nc | ns)  (32 + 32)
//! connecting  -> accepting   MAC(key, "c" | nc | ns)       (32)
//! ```
//!
//! MAC is keyed BLAKE2s-256 (RustCrypto's `blake2`), compared in constant
//! time. The connecting side sends no frame before it has checked the
//! accepting side's MAC, so a member aimed at a service that is not a leap
//! member of the same run forwards nothing to it but the 40-byte hello; the
//! accepting side takes no frame from a connection that has not proven the
//! key, and goes on accepting. Each read has a deadline, so a peer that
//! stops mid-way costs bounded time.
//!
//! This authenticates the connection's ends, not its frames: a keyed
//! transport that tags every frame is the next step.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use blake2::Blake2sMac256;
use blake2::digest::{KeyInit, Mac};

/// Bytes of a ring key.
pub const KEY_LEN: usize = 32;
/// What a connecting member sends first.
const MAGIC: &[u8; 8] = b"LEAPKEY1";
const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;

/// A secret every member of one ring holds (`leap bench --hosts` makes a
/// fresh one per run and hands it to each member inside its authenticated
/// session). Its `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingKey([u8; KEY_LEN]);

impl fmt::Debug for RingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RingKey(..)")
    }
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

    fn mac(&self, side: u8, nc: &[u8; NONCE_LEN], ns: &[u8; NONCE_LEN]) -> Blake2sMac256 {
        let mut m = <Blake2sMac256 as KeyInit>::new_from_slice(&self.0).expect("a 32-byte key fits BLAKE2s");
        m.update(&[side]);
        m.update(nc);
        m.update(ns);
        m
    }
}

/// Why a connection did not prove the ring key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProofError {
    /// The peer does not speak the keyed handshake (an unkeyed node, an
    /// original node, or another service).
    #[error("the peer is not a keyed leap member (no LEAPKEY1 hello)")]
    NotKeyed,
    /// The peer answered with a proof of another key.
    #[error("the peer holds another ring key")]
    WrongKey,
    /// Reading or writing failed, or the deadline passed.
    #[error("ring-key handshake: {0}")]
    Io(#[from] io::Error),
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

/// The connecting side: proves `key` to the node it connected to and checks
/// that node's proof, within `deadline` per step.
///
/// # Errors
///
/// [`ProofError`]: nothing may be sent on the stream then.
pub fn prove_connecting(s: &mut TcpStream, key: &RingKey, deadline: Duration) -> Result<(), ProofError> {
    with_deadline(s, deadline, |s| {
        let nc = nonce()?;
        let mut hello = [0; MAGIC.len() + NONCE_LEN];
        hello[..MAGIC.len()].copy_from_slice(MAGIC);
        hello[MAGIC.len()..].copy_from_slice(&nc);
        s.write_all(&hello)?;
        let mut answer = [0; NONCE_LEN + MAC_LEN];
        read_or(s, &mut answer, ProofError::NotKeyed)?;
        let ns: [u8; NONCE_LEN] = answer[..NONCE_LEN].try_into().expect("split at NONCE_LEN");
        key.mac(b's', &nc, &ns).verify_slice(&answer[NONCE_LEN..]).map_err(|_| ProofError::WrongKey)?;
        s.write_all(&key.mac(b'c', &nc, &ns).finalize().into_bytes())?;
        Ok(())
    })
}

/// The accepting side: checks the connecting node's hello and proof of
/// `key`, proving it too, within `deadline` per step.
///
/// # Errors
///
/// [`ProofError`]: the connection must be dropped unread.
pub fn prove_accepting(s: &mut TcpStream, key: &RingKey, deadline: Duration) -> Result<(), ProofError> {
    with_deadline(s, deadline, |s| {
        let mut hello = [0; MAGIC.len() + NONCE_LEN];
        read_or(s, &mut hello, ProofError::NotKeyed)?;
        if &hello[..MAGIC.len()] != MAGIC {
            return Err(ProofError::NotKeyed);
        }
        let nc: [u8; NONCE_LEN] = hello[MAGIC.len()..].try_into().expect("split at MAGIC");
        let ns = nonce()?;
        let mut answer = [0; NONCE_LEN + MAC_LEN];
        answer[..NONCE_LEN].copy_from_slice(&ns);
        answer[NONCE_LEN..].copy_from_slice(&key.mac(b's', &nc, &ns).finalize().into_bytes());
        s.write_all(&answer)?;
        let mut proof = [0; MAC_LEN];
        read_or(s, &mut proof, ProofError::WrongKey)?;
        key.mac(b'c', &nc, &ns).verify_slice(&proof).map_err(|_| ProofError::WrongKey)
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

    /// Runs the accepting side with `accept_key` on a loopback listener and
    /// the connecting side with `connect_key`; both results.
    fn pair(
        accept_key: RingKey,
        connect: impl FnOnce(&mut TcpStream) -> Result<(), ProofError> + Send + 'static,
    ) -> (Result<(), ProofError>, Result<(), ProofError>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            connect(&mut s)
        });
        let (mut s, _) = l.accept().unwrap();
        let a = prove_accepting(&mut s, &accept_key, LIMIT);
        drop(s);
        (a, c.join().unwrap())
    }

    #[test]
    fn the_same_key_proves_both_ends() {
        let k = RingKey::random().unwrap();
        let k2 = k.clone();
        let (a, c) = pair(k, move |s| prove_connecting(s, &k2, LIMIT));
        a.unwrap();
        c.unwrap();
    }

    #[test]
    fn another_key_is_refused_on_both_ends() {
        let (a, c) = pair(RingKey::from_bytes([1; 32]), |s| prove_connecting(s, &RingKey::from_bytes([2; 32]), LIMIT));
        assert!(matches!(c, Err(ProofError::WrongKey)), "{c:?}");
        // The connecting side stops before its proof: the accepting side
        // sees the connection end.
        assert!(matches!(a, Err(ProofError::WrongKey)), "{a:?}");
    }

    #[test]
    fn an_unkeyed_peer_gets_nothing_and_is_refused() {
        // A raw-framing sender writes frame bytes at once.
        let (a, _) = pair(RingKey::from_bytes([1; 32]), |s| {
            s.write_all(&[0xAB; 64]).unwrap();
            Ok(())
        });
        assert!(matches!(a, Err(ProofError::NotKeyed)), "{a:?}");
    }

    #[test]
    fn a_service_that_is_not_a_member_gets_only_the_hello() {
        // The connecting member talks to a plain server that reads what it
        // is sent and answers with garbage: the member refuses it and
        // sends nothing after the 40-byte hello.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(&[0x55; 64]).unwrap();
            let mut got = Vec::new();
            s.set_read_timeout(Some(LIMIT)).unwrap();
            let _ = s.read_to_end(&mut got);
            got
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let r = prove_connecting(&mut s, &RingKey::from_bytes([3; 32]), LIMIT);
        assert!(matches!(r, Err(ProofError::WrongKey)), "{r:?}");
        drop(s);
        let got = server.join().unwrap();
        assert_eq!(got.len(), MAGIC.len() + NONCE_LEN, "only the hello reached the service");
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
        let r = prove_connecting(&mut s, &RingKey::from_bytes([4; 32]), Duration::from_millis(200));
        assert!(matches!(r, Err(ProofError::Io(_))), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(2), "bounded by the deadline");
    }

    #[test]
    fn debug_never_shows_the_key() {
        assert_eq!(format!("{:?}", RingKey::from_bytes([7; 32])), "RingKey(..)");
    }
}
