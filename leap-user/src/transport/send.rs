//! The sending half of every datagram backend: chunks frames and hands
//! them to the kernel through a UDP socket, one `sendmmsg` per frame (GSO
//! super-datagrams where the kernel can).

use std::net::SocketAddr;
use std::os::fd::AsFd;

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, flags};
use socket2::{SockAddr, Socket};

use super::{Result, TransportError};
use crate::frame::Chunker;
use crate::frame::chunker::ChunkRef;
use crate::sys::udp::{TxBatch, gso_supported};

/// The sending half: chunks frames and hands them to the kernel in one
/// `sendmmsg` each. Shared by the datagram backends (UDP, XDP).
#[derive(Debug)]
pub struct UdpSender {
    next: SockAddr,
    seq: u16,
    gso: bool,
    batch: TxBatch,
    headers: Vec<[u8; CHUNK_HEADER_LEN]>,
}

impl UdpSender {
    /// A sender to `next`; `gso` if the socket supports it (checked).
    pub fn new(socket: &Socket, next: SocketAddr, gso: bool) -> Self {
        let gso = gso && gso_supported(socket.as_fd());
        Self { next: next.into(), seq: 0, gso, batch: TxBatch::new(), headers: Vec::new() }
    }

    /// Whether GSO is in use.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// The seq the next frame gets.
    pub fn next_seq(&self) -> u16 {
        self.seq
    }

    /// Sends one frame (`head ++ tail`, then `trailer` on the wire) as chunks
    /// whose headers carry `reserved` (leap flags, or 0 to send exactly like
    /// the original); returns the chunk count. The frame's seq is used up
    /// even when sending fails part-way.
    ///
    /// # Errors
    ///
    /// [`TransportError::BadFrameLen`] (nothing sent, no seq used) or the
    /// `sendmmsg` error.
    pub fn send(&mut self, socket: &Socket, reserved: u16, head: &[u8], tail: &[u8], trailer: &[u8]) -> Result<u16> {
        let len = head.len() + tail.len();
        let chunker =
            Chunker::with_trailer(self.seq, reserved, head, tail, trailer).ok_or(TransportError::BadFrameLen(len))?;
        let total = chunker.total();
        self.seq = self.seq.wrapping_add(1);
        self.transmit(socket, chunker)?;
        Ok(total)
    }

    /// Sends chunks `ids` of an earlier frame `seq` again, flagged as
    /// retransmissions; returns how many were sent. Ids beyond the frame are
    /// skipped.
    ///
    /// # Errors
    ///
    /// The `sendmmsg` error.
    pub fn resend(
        &mut self,
        socket: &Socket,
        seq: u16,
        reserved: u16,
        frame: &[u8],
        trailer: &[u8],
        ids: impl Iterator<Item = u16>,
    ) -> Result<u64> {
        let Some(chunker) = Chunker::with_trailer(seq, reserved | flags::RETRANSMIT, frame, &[], trailer) else {
            return Ok(0);
        };
        let mut chunks = [None; 64];
        let mut sent = 0u64;
        let mut ids = ids.filter(|&id| id < chunker.total()).peekable();
        while ids.peek().is_some() {
            let mut n = 0;
            for id in ids.by_ref().take(chunks.len()) {
                chunks[n] = chunker.chunk(id);
                n += 1;
            }
            self.transmit(socket, chunks[..n].iter().flatten().copied())?;
            sent += n as u64;
        }
        Ok(sent)
    }

    fn transmit<'a, I>(&mut self, socket: &Socket, chunks: I) -> Result<()>
    where
        I: Iterator<Item = ChunkRef<'a>> + Clone,
    {
        self.headers.clear();
        self.headers.extend(chunks.clone().map(|c| c.header.to_bytes()));
        let headers = &self.headers;
        let datagrams =
            || chunks.clone().zip(headers.iter()).map(|(c, h)| [&h[..], c.pieces[0], c.pieces[1], c.pieces[2]]);
        let seg = self.gso.then_some(CHUNK_DATAGRAM_MAX as u16);
        match self.batch.send(socket.as_fd(), &self.next, datagrams(), seg) {
            Ok(()) => Ok(()),
            Err(e) if seg.is_some() && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                log::warn!("UDP GSO failed on this path ({e}); sending one datagram per chunk from now on");
                self.gso = false;
                self.batch
                    .send(socket.as_fd(), &self.next, datagrams(), None)
                    .map_err(|e| TransportError::io("sendmmsg", e))
            }
            Err(e) => Err(TransportError::io("sendmmsg", e)),
        }
    }
}
