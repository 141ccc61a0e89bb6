//! Frames lent by a transport: the caller reads a received frame where the
//! transport put it (the module's receive bank, the transport's own
//! reassembly buffer) and gives it back by dropping it; and writes a frame to
//! send into memory the transport owns (the module's transmit area, the
//! retransmit buffer that keeps it for NACKs).

use std::fmt;
use std::ops::Deref;

use super::FrameKind;

/// Gives lent memory back to the transport (e.g. releases a receive bank of
/// the kernel module).
pub trait Release: Sync {
    /// Gives back what `token` names.
    fn release(&self, token: u32);
}

/// A received frame, lent by the transport until dropped.
///
/// Reading it costs no copy; while it lives, the transport cannot receive
/// again (it is borrowed), so a worker drops it once it has computed on it.
/// Frames that arrive meanwhile wait in the transport (or in the kernel).
pub struct Lent<'a> {
    bytes: &'a [u8],
    kind: FrameKind,
    release: Option<(&'a dyn Release, u32)>,
}

impl<'a> Lent<'a> {
    /// A frame in memory that needs no release.
    pub fn new(bytes: &'a [u8], kind: FrameKind) -> Self {
        Self { bytes, kind, release: None }
    }

    /// A frame whose memory `release` gets back (with `token`) when the frame
    /// is dropped.
    pub fn with_release(bytes: &'a [u8], kind: FrameKind, release: &'a dyn Release, token: u32) -> Self {
        Self { bytes, kind, release: Some((release, token)) }
    }

    /// Data or control.
    pub fn kind(&self) -> FrameKind {
        self.kind
    }

    /// The frame's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }
}

impl Deref for Lent<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some((r, token)) = self.release.take() {
            r.release(token);
        }
    }
}

impl fmt::Debug for Lent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent")
            .field("len", &self.bytes.len())
            .field("kind", &self.kind)
            .field("release", &self.release.map(|(_, t)| t))
            .finish()
    }
}

/// A buffer owned by a transport that grows to the largest frame it is asked
/// for and then stays: no allocation per frame.
#[derive(Debug, Default)]
pub struct OwnedBuf {
    buf: Vec<u8>,
}

impl OwnedBuf {
    /// `len` bytes of the buffer (grown once when needed; the contents are
    /// whatever the last frame left).
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        &mut self.buf[..len]
    }

    /// The whole buffer as it is.
    pub fn all(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The memory, handed out (the buffer is empty until given back).
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }

    /// A buffer over `buf`.
    pub fn from_vec(buf: Vec<u8>) -> Self {
        Self { buf }
    }
}
