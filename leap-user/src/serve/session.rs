//! The secure session under the control protocol: a Noise handshake keyed
//! by the host's token, then every message of the connection sealed in
//! Noise transport records. The token itself never crosses the wire.
//!
//! The pattern is `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`:
//! - `NN`: neither side has a static key. The token is the only secret an
//!   operator manages (one file per host), so there is no key to
//!   distribute, pin or rotate; both ephemerals still give every session
//!   fresh keys and forward secrecy (`ee`).
//! - `psk0`: the pre-shared key (a BLAKE2s hash of the token) is mixed in
//!   before the coordinator's first message, so that message's payload is
//!   already encrypted and authenticated under the token. The agent checks
//!   it before it sends a single byte back: a coordinator with a wrong
//!   token gets a closed connection and nothing else, and an agent (or
//!   whoever answers on its port) that does not hold the token sees an
//!   ephemeral public key and an AEAD tag, never the token. The agent's
//!   answer is authenticated under the token and `ee` in turn, so the
//!   coordinator knows it talks to a holder of this host's token.
//! - ChaCha20-Poly1305 and BLAKE2s: constant-time in software on every CPU
//!   (no AES-NI needed), and the smallest dependency set of snow's
//!   resolver (no ring, no AES).
//!
//! What remains true of any pre-shared-key protocol: a peer that records a
//! first message can try to guess a *weak* token offline; tokens are at
//! least 16 bytes, and the README asks for 32 random ones.
//!
//! On the wire: the handshake messages are [`HANDSHAKE_MAGIC`], a u16
//! (big-endian) length and the Noise message; after it, records of a u16
//! length and a Noise transport message, whose plaintexts, in order, form
//! the stream of [`super::protocol`] messages. Each direction has its own
//! key and nonce counter, so the reading and the writing half of a
//! connection each own theirs.

use std::io::{self, Read, Write};
use std::sync::Arc;

use blake2::Digest;
use snow::{HandshakeState, StatelessTransportState};

/// The Noise protocol name.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Bound into the handshake hash: both sides must speak this protocol.
pub const PROLOGUE: &[u8] = b"leap serve 2";
/// First bytes of both handshake messages ("leap serve noise", version 1).
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"LSN1";
/// Bytes before a handshake message: magic and u16 length.
pub const HANDSHAKE_HEADER: usize = 6;
/// A handshake message of this protocol: ephemeral key and empty payload's
/// tag.
pub const HANDSHAKE_LEN: usize = 32 + TAG_LEN;
/// The AEAD tag of every record.
pub const TAG_LEN: usize = 16;
/// Largest Noise message.
pub const MAX_RECORD: usize = 65_535;
/// Largest plaintext per record.
pub const MAX_RECORD_PLAIN: usize = MAX_RECORD - TAG_LEN;

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The socket failed, timed out or closed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer does not speak this protocol.
    #[error("not a leap serve handshake (bad magic)")]
    BadMagic,
    /// The peer's handshake message does not authenticate under the token.
    #[error("the handshake does not authenticate with this token")]
    WrongToken,
    /// The Noise state machine refused something.
    #[error("noise: {0}")]
    Noise(String),
}

impl From<snow::Error> for HandshakeError {
    fn from(e: snow::Error) -> Self {
        match e {
            snow::Error::Decrypt => Self::WrongToken,
            other => Self::Noise(other.to_string()),
        }
    }
}

/// The 32-byte pre-shared key of `token`: BLAKE2s-256 of a label and the
/// token (tokens are 16..=1024 bytes; Noise takes exactly 32).
pub fn psk(token: &str) -> [u8; 32] {
    let mut h = blake2::Blake2s256::new();
    h.update(b"leap serve psk v1\0");
    h.update(token.as_bytes());
    h.finalize().into()
}

fn builder_state(token: &str, initiator: bool) -> Result<HandshakeState, HandshakeError> {
    let key = psk(token);
    let params = NOISE_PARAMS.parse().map_err(|e: snow::Error| HandshakeError::Noise(e.to_string()))?;
    let b = snow::Builder::new(params).psk(0, &key)?.prologue(PROLOGUE)?;
    Ok(if initiator { b.build_initiator()? } else { b.build_responder()? })
}

/// Frames a handshake message.
fn handshake_frame(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HANDSHAKE_HEADER + msg.len());
    out.extend_from_slice(&HANDSHAKE_MAGIC);
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// Checks a handshake header; returns the message length.
///
/// # Errors
///
/// [`HandshakeError::BadMagic`], or a length this protocol never sends.
pub fn parse_handshake_header(h: &[u8; HANDSHAKE_HEADER]) -> Result<usize, HandshakeError> {
    if h[..4] != HANDSHAKE_MAGIC {
        return Err(HandshakeError::BadMagic);
    }
    let len = u16::from_be_bytes([h[4], h[5]]) as usize;
    if len != HANDSHAKE_LEN {
        return Err(HandshakeError::Noise(format!("handshake message of {len} bytes, expected {HANDSHAKE_LEN}")));
    }
    Ok(len)
}

/// The coordinator's side, before any I/O: its first message.
#[derive(Debug)]
pub struct Initiator(HandshakeState);

impl Initiator {
    /// Starts a handshake with `token`; returns the bytes to send first.
    ///
    /// # Errors
    ///
    /// [`HandshakeError::Noise`] (never with this crate's parameters).
    pub fn start(token: &str) -> Result<(Self, Vec<u8>), HandshakeError> {
        let mut hs = builder_state(token, true)?;
        let mut buf = [0u8; 256];
        let n = hs.write_message(&[], &mut buf)?;
        Ok((Self(hs), handshake_frame(&buf[..n])))
    }

    /// Takes the agent's answer (the message after its header).
    ///
    /// # Errors
    ///
    /// [`HandshakeError::WrongToken`]: the agent does not hold the token.
    pub fn finish(mut self, msg: &[u8]) -> Result<(Sealer, Opener), HandshakeError> {
        let mut buf = [0u8; 256];
        self.0.read_message(msg, &mut buf)?;
        split(self.0)
    }
}

/// The agent's side: checks the coordinator's first message (the header
/// already read) and returns its answer, framed.
///
/// # Errors
///
/// [`HandshakeError::WrongToken`]: the coordinator does not hold the token;
/// nothing is to be sent back.
pub fn respond(token: &str, msg: &[u8]) -> Result<(Sealer, Opener, Vec<u8>), HandshakeError> {
    let mut hs = builder_state(token, false)?;
    let mut buf = [0u8; 256];
    hs.read_message(msg, &mut buf)?;
    let n = hs.write_message(&[], &mut buf)?;
    let answer = handshake_frame(&buf[..n]);
    let (s, o) = split(hs)?;
    Ok((s, o, answer))
}

fn split(hs: HandshakeState) -> Result<(Sealer, Opener), HandshakeError> {
    let state = Arc::new(hs.into_stateless_transport_mode()?);
    Ok((Sealer { state: state.clone(), nonce: 0 }, Opener { state, nonce: 0 }))
}

/// Seals the plaintext stream one direction carries.
pub struct Sealer {
    state: Arc<StatelessTransportState>,
    nonce: u64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("nonce", &self.nonce).finish_non_exhaustive()
    }
}

impl Sealer {
    /// `plain` as records, ready to be written.
    ///
    /// # Panics
    ///
    /// Never: a record's plaintext fits its buffer by construction.
    pub fn seal(&mut self, plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plain.len() + (plain.len() / MAX_RECORD_PLAIN + 1) * (2 + TAG_LEN));
        let mut buf = vec![0u8; MAX_RECORD];
        for part in plain.chunks(MAX_RECORD_PLAIN) {
            let n = self.state.write_message(self.nonce, part, &mut buf).expect("a record fits its buffer");
            self.nonce += 1;
            out.extend_from_slice(&(n as u16).to_be_bytes());
            out.extend_from_slice(&buf[..n]);
        }
        out
    }
}

/// Opens the records of the other direction.
pub struct Opener {
    state: Arc<StatelessTransportState>,
    nonce: u64,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener").field("nonce", &self.nonce).finish_non_exhaustive()
    }
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Opener {
    /// The length of the record whose 2-byte header is `h`.
    ///
    /// # Errors
    ///
    /// A length shorter than a tag.
    pub fn record_len(h: [u8; 2]) -> io::Result<usize> {
        let len = u16::from_be_bytes(h) as usize;
        if len < TAG_LEN {
            return Err(invalid("session record shorter than its tag"));
        }
        Ok(len)
    }

    /// Decrypts and authenticates one record (in order).
    ///
    /// # Errors
    ///
    /// `InvalidData`: forged, replayed, reordered or corrupted.
    pub fn open(&mut self, record: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; record.len()];
        let n = self
            .state
            .read_message(self.nonce, record, &mut out)
            .map_err(|_| invalid("session record failed authentication"))?;
        self.nonce += 1;
        out.truncate(n);
        Ok(out)
    }
}

/// The reading half of a blocking session: [`Read`] yields the plaintext.
#[derive(Debug)]
pub struct SecureReader<R> {
    inner: R,
    opener: Opener,
    buf: Vec<u8>,
    pos: usize,
}

impl<R: Read> SecureReader<R> {
    /// Reads `inner` through `opener`.
    pub fn new(inner: R, opener: Opener) -> Self {
        Self { inner, opener, buf: Vec::new(), pos: 0 }
    }

    /// The stream underneath.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }
}

impl<R: Read> Read for SecureReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            let mut h = [0u8; 2];
            self.inner.read_exact(&mut h)?;
            let mut rec = vec![0u8; Opener::record_len(h)?];
            self.inner.read_exact(&mut rec)?;
            self.buf = self.opener.open(&rec)?;
            self.pos = 0;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The writing half of a blocking session: [`Write`] seals each write.
#[derive(Debug)]
pub struct SecureWriter<W> {
    inner: W,
    sealer: Sealer,
}

impl<W: Write> SecureWriter<W> {
    /// Writes to `inner` through `sealer`.
    pub fn new(inner: W, sealer: Sealer) -> Self {
        Self { inner, sealer }
    }

    /// The stream underneath.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }
}

impl<W: Write> Write for SecureWriter<W> {
    fn write(&mut self, plain: &[u8]) -> io::Result<usize> {
        // All of it at once: a record half written would desynchronise the
        // nonces, so a failed write ends the session anyway.
        self.inner.write_all(&self.sealer.seal(plain))?;
        Ok(plain.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Runs the coordinator's handshake on a blocking stream.
///
/// # Errors
///
/// [`HandshakeError`]; an agent that refuses the token closes the
/// connection (`Io` with `UnexpectedEof`).
pub fn initiate(stream: &mut (impl Read + Write), token: &str) -> Result<(Sealer, Opener), HandshakeError> {
    let (init, first) = Initiator::start(token)?;
    stream.write_all(&first)?;
    stream.flush()?;
    let mut h = [0u8; HANDSHAKE_HEADER];
    stream.read_exact(&mut h)?;
    let len = parse_handshake_header(&h)?;
    let mut msg = vec![0u8; len];
    stream.read_exact(&mut msg)?;
    init.finish(&msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "session-token-0123456789";

    #[test]
    fn both_sides_agree_and_every_record_is_authenticated() {
        let (init, first) = Initiator::start(T).unwrap();
        let h: [u8; HANDSHAKE_HEADER] = first[..HANDSHAKE_HEADER].try_into().unwrap();
        assert_eq!(parse_handshake_header(&h).unwrap(), HANDSHAKE_LEN);
        let (mut a_seal, a_open, answer) = respond(T, &first[HANDSHAKE_HEADER..]).unwrap();
        let (mut c_seal, mut c_open) = init.finish(&answer[HANDSHAKE_HEADER..]).unwrap();
        let big = vec![7u8; 200_000];
        let wire = c_seal.seal(&big);
        let mut r = SecureReader::new(&wire[..], a_open);
        let mut got = vec![0u8; big.len()];
        r.read_exact(&mut got).unwrap();
        assert_eq!(got, big);
        let back = a_seal.seal(b"hello");
        assert_eq!(c_open.open(&back[2..]).unwrap(), b"hello");
        // A replayed record fails: the nonce moved on.
        assert!(c_open.open(&back[2..]).is_err());
        // A flipped bit fails.
        let mut bad = a_seal.seal(b"again");
        bad[5] ^= 1;
        assert!(c_open.open(&bad[2..]).is_err());
    }

    #[test]
    fn a_wrong_token_fails_at_the_agent_before_it_answers() {
        let (_, first) = Initiator::start("another-token-0123456789").unwrap();
        assert!(matches!(respond(T, &first[HANDSHAKE_HEADER..]), Err(HandshakeError::WrongToken)));
    }

    #[test]
    fn an_agent_without_the_token_is_found_out_by_the_coordinator() {
        let (init, _) = Initiator::start(T).unwrap();
        let (_, first) = Initiator::start("another-token-0123456789").unwrap();
        let (_, _, answer) = respond("another-token-0123456789", &first[HANDSHAKE_HEADER..]).unwrap();
        assert!(matches!(init.finish(&answer[HANDSHAKE_HEADER..]), Err(HandshakeError::WrongToken)));
    }
}
