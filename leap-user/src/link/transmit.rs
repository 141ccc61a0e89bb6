//! What a [`super::Link`] hands its driver to send, and the queues it
//! keeps until then.

use std::net::SocketAddr;

use leap_common::chunk::CHUNK_DATAGRAM_MAX;
use leap_common::hello::Hello;

use crate::frame::Chunker;
use crate::transport::datagram_auth::Seals;

/// What a datagram written by [`super::Link::poll_transmit`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransmitKind {
    /// A hello (a challenge or an answer).
    Hello,
    /// A NACK to the previous node.
    Nack,
    /// This many chunks of a frame's first copy (more than one: a train).
    Chunks(u16),
    /// A chunk re-sent in answer to a NACK.
    Retransmit,
    /// The last chunk of the last frame, again (a tail-loss probe).
    Probe,
}

/// One datagram to send: `len` bytes at the start of the caller's buffer,
/// to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where it goes.
    pub to: SocketAddr,
    /// Its length.
    pub len: usize,
    /// What it is.
    pub kind: TransmitKind,
}

/// A hello or a NACK, encoded when it was decided.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) to: SocketAddr,
    pub(super) kind: TransmitKind,
    pub(super) len: usize,
    pub(super) bytes: Box<[u8; CHUNK_DATAGRAM_MAX]>,
    /// Sealed with the current ring key even to a neighbour last heard
    /// under the previous one (a node's announcement of new keys).
    pub(super) current_key: bool,
}

impl Queued {
    /// An empty one in `bytes` (memory of an earlier one, or `None`).
    pub(super) fn empty(to: SocketAddr, kind: TransmitKind, bytes: Option<Box<[u8; CHUNK_DATAGRAM_MAX]>>) -> Self {
        Self { to, kind, len: 0, bytes: bytes.unwrap_or_else(|| Box::new([0; CHUNK_DATAGRAM_MAX])), current_key: false }
    }

    pub(super) fn hello(h: &Hello, to: SocketAddr, bytes: Option<Box<[u8; CHUNK_DATAGRAM_MAX]>>) -> Self {
        let mut q = Self::empty(to, TransmitKind::Hello, bytes);
        let b = h.to_bytes();
        q.bytes[..b.len()].copy_from_slice(&b);
        q.len = b.len();
        q
    }

    pub(super) fn buf(&mut self) -> &mut [u8; CHUNK_DATAGRAM_MAX] {
        &mut self.bytes
    }
}

/// A frame whose chunks still have to go out (its first copy).
#[derive(Debug)]
pub(super) struct Outgoing {
    pub(super) seq: u16,
    pub(super) reserved: u16,
    pub(super) next_id: u16,
    pub(super) total: u16,
    /// Chunks per datagram.
    pub(super) train: usize,
    /// The frame and its trailer when it is not kept for NACKs (else it is
    /// in the retransmit buffer).
    pub(super) data: Option<Vec<u8>>,
}

/// Chunks of a kept frame to send again (a paced burst, or a probe).
#[derive(Debug)]
pub(super) struct Resend {
    pub(super) seq: u16,
    pub(super) ids: Vec<u16>,
    pub(super) at: usize,
    pub(super) kind: TransmitKind,
}

impl Resend {
    /// Chunks `ids`, kept in `v` (memory of an earlier one).
    pub(super) fn new(seq: u16, ids: &[u16], kind: TransmitKind, mut v: Vec<u16>) -> Self {
        v.clear();
        v.extend_from_slice(ids);
        Self { seq, ids: v, at: 0, kind }
    }
}

impl Outgoing {
    /// Writes the next datagram (up to `train` chunks of `frame ++
    /// trailer`) into `buf`, each chunk sealed to `seal`'s destination when
    /// keyed; returns its length and the chunks in it.
    pub(super) fn write(
        &mut self,
        frame: &[u8],
        trailer: &[u8],
        buf: &mut [u8],
        mut seal: Option<(&mut Seals, SocketAddr, bool)>,
    ) -> (usize, usize) {
        let Some(chunker) = Chunker::with_trailer(self.seq, self.reserved, frame, &[], trailer) else {
            self.next_id = self.total;
            return (0, 0);
        };
        let (mut len, mut n) = (0, 0);
        while n < self.train && self.next_id < chunker.total() {
            let w = write_chunk(&chunker, self.next_id, &mut buf[len..]);
            len += match &mut seal {
                // Each chunk alone: it verifies alone, trains keep the
                // 1 412-byte stride.
                Some((s, to, previous)) => s.seal(*to, *previous, &mut buf[len..], w),
                None => w,
            };
            self.next_id += 1;
            n += 1;
        }
        (len, n)
    }
}

/// Writes chunk `id` of frame `seq` (sent with `reserved`) into `buf`.
pub(super) fn write_one(
    seq: u16,
    reserved: u16,
    frame: &[u8],
    trailer: &[u8],
    id: u16,
    buf: &mut [u8],
) -> Option<usize> {
    let chunker = Chunker::with_trailer(seq, reserved, frame, &[], trailer)?;
    (id < chunker.total()).then(|| write_chunk(&chunker, id, buf))
}

fn write_chunk(chunker: &Chunker<'_>, id: u16, buf: &mut [u8]) -> usize {
    chunker.chunk(id).expect("id below total").write(buf)
}
