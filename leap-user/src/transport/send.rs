//! The sending half of every datagram backend: chunks frames and hands
//! them to the kernel through a UDP socket, one `sendmmsg` per frame (GSO
//! super-datagrams where the kernel can), several chunks per datagram
//! (chunk trains) to a next node that takes them.

use std::net::SocketAddr;
use std::os::fd::AsFd;

use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, TRAIN_CHUNKS_MAX, flags};
use socket2::{SockAddr, Socket};

use super::{Result, TransportError};
use crate::frame::Chunker;
use crate::sys::udp::{TxBatch, gso_supported};

/// The sending half: chunks frames and hands them to the kernel in one
/// `sendmmsg` each. Shared by the datagram backends (UDP, XDP).
#[derive(Debug)]
pub struct UdpSender {
    next: SockAddr,
    gso: bool,
    /// Chunks per datagram of a frame's first copy to a proven leap node.
    train: usize,
    /// The kernel refused a GSO send of trains (the path MTU fell below
    /// them, say): the link sizes them again (see [`Self::take_train_refused`]).
    train_refused: bool,
    batch: TxBatch,
    headers: Vec<[u8; CHUNK_HEADER_LEN]>,
}

/// What one frame's send handed to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Chunks of the frame.
    pub chunks: u16,
    /// Datagrams on the wire (a train counts once; GSO segments each).
    pub datagrams: u16,
}

impl UdpSender {
    /// A sender to `next`; `gso` if the socket supports it (checked).
    pub fn new(socket: &Socket, next: SocketAddr, gso: bool) -> Self {
        let gso = gso && gso_supported(socket.as_fd());
        Self { next: next.into(), gso, train: 1, train_refused: false, batch: TxBatch::new(), headers: Vec::new() }
    }

    /// Sends frames to a proven leap node as trains of `chunks` chunks per
    /// datagram (clamped to 1..=[`TRAIN_CHUNKS_MAX`]; 1: one chunk per
    /// datagram, as to the original). Frames whose `reserved` lacks
    /// [`flags::LEAP`] always go one chunk per datagram.
    pub fn set_train(&mut self, chunks: usize) {
        self.train = chunks.clamp(1, TRAIN_CHUNKS_MAX);
    }

    /// Chunks per datagram to a proven leap node (see [`Self::set_train`]).
    pub fn train(&self) -> usize {
        self.train
    }

    /// Whether GSO is in use.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Whether the kernel refused a GSO send of trains since the last call.
    /// That frame went out without GSO; GSO stays on until
    /// [`Self::disable_gso`], so the caller can first size the trains to
    /// the path MTU again.
    pub fn take_train_refused(&mut self) -> bool {
        std::mem::take(&mut self.train_refused)
    }

    /// Sends one datagram per segment from now on (`why` is logged).
    pub fn disable_gso(&mut self, why: &dyn std::fmt::Display) {
        if self.gso {
            log::warn!("UDP GSO failed on this path ({why}); sending one datagram per segment from now on");
            self.gso = false;
        }
    }

    /// Sends frame `seq` (`head ++ tail`, then `trailer` on the wire) as
    /// chunks whose headers carry `reserved` (leap flags, or 0 to send
    /// exactly like the original), in trains where `reserved` has
    /// [`flags::LEAP`] and [`Self::set_train`] allows them; returns the chunk
    /// and datagram counts.
    ///
    /// # Errors
    ///
    /// [`TransportError::BadFrameLen`] (nothing sent) or the `sendmmsg`
    /// error.
    pub fn send(
        &mut self,
        socket: &Socket,
        seq: u16,
        reserved: u16,
        head: &[u8],
        tail: &[u8],
        trailer: &[u8],
    ) -> Result<Sent> {
        let len = head.len() + tail.len();
        let chunker =
            Chunker::with_trailer(seq, reserved, head, tail, trailer).ok_or(TransportError::BadFrameLen(len))?;
        let chunks = chunker.total();
        // Never a train to a node not proven to take them (the original
        // would read only the first chunk of each).
        let k = if reserved & flags::LEAP != 0 { self.train } else { 1 };
        let datagrams = usize::from(chunks).div_ceil(k) as u16;
        self.headers.clear();
        self.headers.extend(chunker.clone().map(|c| c.header.to_bytes()));
        let (headers, n) = (&self.headers, usize::from(chunks));
        let chunker = &chunker;
        // Datagram d: chunks [d*k, (d+1)*k), each its header and payload.
        let trains = move || {
            (0..n.div_ceil(k)).map(move |d| {
                (d * k..((d + 1) * k).min(n)).flat_map(move |i| {
                    chunker
                        .chunk(i as u16)
                        .into_iter()
                        .flat_map(move |c| [&headers[i][..], c.pieces[0], c.pieces[1], c.pieces[2]])
                })
            })
        };
        let seg = (k * CHUNK_DATAGRAM_MAX) as u16;
        if k > 1 && self.gso {
            // A refused train keeps GSO on: the link sizes trains again first.
            match self.batch.send(socket.as_fd(), &self.next, trains(), Some(seg)) {
                Ok(()) => return Ok(Sent { chunks, datagrams }),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE)) => {
                    log::debug!("GSO send of trains of {k} refused ({e}); sent one datagram per train");
                    self.train_refused = true;
                    let mut off = false;
                    Self::send_batch(&mut self.batch, &mut off, socket, &self.next, trains, seg)?;
                }
                Err(e) => return Err(TransportError::io("sendmmsg", e)),
            }
        } else {
            Self::send_batch(&mut self.batch, &mut self.gso, socket, &self.next, trains, seg)?;
        }
        Ok(Sent { chunks, datagrams })
    }

    /// Sends datagrams of one chunk each, already written (retransmitted
    /// chunks, probes), in one `sendmmsg` (GSO super-datagrams where the
    /// kernel can).
    ///
    /// # Errors
    ///
    /// The `sendmmsg` error.
    pub fn send_datagrams<'a, F, I, D>(&mut self, socket: &Socket, datagrams: F) -> Result<()>
    where
        F: Fn() -> I,
        I: Iterator<Item = D>,
        D: IntoIterator<Item = &'a [u8]>,
    {
        Self::send_batch(&mut self.batch, &mut self.gso, socket, &self.next, datagrams, CHUNK_DATAGRAM_MAX as u16)
    }

    /// Hands `datagrams()` to the kernel, as GSO super-datagrams of `seg`
    /// bytes per segment while `gso` holds; a path that cannot segment
    /// turns GSO off for good.
    fn send_batch<'a, F, I, D>(
        batch: &mut TxBatch,
        gso: &mut bool,
        socket: &Socket,
        next: &SockAddr,
        datagrams: F,
        seg: u16,
    ) -> Result<()>
    where
        F: Fn() -> I,
        I: Iterator<Item = D>,
        D: IntoIterator<Item = &'a [u8]>,
    {
        let seg = gso.then_some(seg);
        match batch.send(socket.as_fd(), next, datagrams(), seg) {
            Ok(()) => Ok(()),
            Err(e) if seg.is_some() && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE)) => {
                log::warn!("UDP GSO failed on this path ({e}); sending one datagram per segment from now on");
                *gso = false;
                batch.send(socket.as_fd(), next, datagrams(), None).map_err(|e| TransportError::io("sendmmsg", e))
            }
            Err(e) => Err(TransportError::io("sendmmsg", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::Duration;

    use super::*;

    /// Sends one 16 392-byte frame from a sender with trains of `train`
    /// chunks and returns the sizes of the datagrams that arrived.
    fn datagram_sizes(train: usize, reserved: u16, gso: bool) -> (Sent, Vec<usize>) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let tx = Socket::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let mut s = UdpSender::new(&tx, rx.local_addr().unwrap(), gso);
        s.set_train(train);
        let frame = vec![7u8; 16_392];
        let sent = s.send(&tx, 0, reserved, &frame[..8], &frame[8..], &[]).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut sizes = Vec::new();
        // The receiving socket has no GRO: a GSO super-datagram arrives as
        // its segments. Bounded: at most the 12 chunks, each within 200 ms.
        for _ in 0..12 {
            let Ok(n) = rx.recv(&mut buf) else { break };
            sizes.push(n);
        }
        (sent, sizes)
    }

    #[test]
    fn a_jumbo_frame_goes_as_two_trains_of_six() {
        for gso in [false, true] {
            let (sent, sizes) = datagram_sizes(6, flags::LEAP, gso);
            assert_eq!(sent, Sent { chunks: 12, datagrams: 2 });
            // Six full chunks, then five full and the short last one.
            assert_eq!(sizes, [6 * 1412, 5 * 1412 + 12 + 16_392 - 11 * 1400], "gso {gso}");
        }
    }

    #[test]
    fn one_chunk_per_datagram_without_trains_or_to_the_original() {
        let (sent, sizes) = datagram_sizes(1, flags::LEAP, false);
        assert_eq!(sent, Sent { chunks: 12, datagrams: 12 });
        assert_eq!(sizes.len(), 12);
        // A frame in the original's format (`reserved` 0) is never a train.
        let (sent, sizes) = datagram_sizes(6, 0, true);
        assert_eq!(sent, Sent { chunks: 12, datagrams: 12 });
        assert!(sizes.iter().all(|&n| n <= CHUNK_DATAGRAM_MAX), "{sizes:?}");
    }

    #[test]
    fn a_gro_super_datagram_of_trains_splits_into_the_frames_chunks() {
        use crate::sys::udp::{RxBatch, enable_gro, wait_readable};
        let rx = Socket::from(UdpSocket::bind("127.0.0.1:0").unwrap());
        if !enable_gro(rx.as_fd()) {
            // A kernel without UDP GRO has nothing to split; CI's has it.
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "this kernel lacks UDP GRO");
            return;
        }
        let tx = Socket::from(UdpSocket::bind("127.0.0.1:0").unwrap());
        let to = rx.local_addr().unwrap().as_socket().unwrap();
        let mut s = UdpSender::new(&tx, to, true);
        assert!(s.gso(), "loopback takes UDP GSO");
        s.set_train(6);
        let frame: Vec<u8> = (0..16_392u32).map(|i| i as u8).collect();
        s.send(&tx, 0, flags::LEAP, &frame, &[], &[]).unwrap();
        assert!(wait_readable(rx.as_fd(), Duration::from_secs(1)).unwrap());
        let mut batch = RxBatch::new(4, 65536);
        assert_eq!(batch.recv(rx.as_fd(), false).unwrap(), 1, "one super-datagram");
        let (bytes, meta, _) = batch.get(0);
        assert_eq!(meta.segment, Some(6 * 1412));
        assert_eq!(bytes.len(), 6 * 1412 + 5 * 1412 + 12 + 992);
        // Cut at the segment size, then each segment at its chunks: the
        // frame's 12 chunks in order, the bytes whole.
        let mut joined = Vec::new();
        let mut ids = Vec::new();
        for seg in bytes.chunks(usize::from(meta.segment.unwrap())) {
            for c in leap_common::chunk::train(seg).unwrap() {
                let (h, payload) = leap_common::chunk::ChunkHeader::parse(c).unwrap();
                ids.push(h.chunk_id);
                joined.extend_from_slice(payload);
            }
        }
        assert_eq!(ids, (0..12).collect::<Vec<u16>>());
        assert!(joined == frame);
    }

    #[test]
    fn gso_super_datagrams_stay_within_the_kernel_limits() {
        use crate::sys::udp::{GSO_MAX_BYTES, gso_segments_max};
        for k in 1..=TRAIN_CHUNKS_MAX {
            let seg = k * CHUNK_DATAGRAM_MAX;
            let n = gso_segments_max(seg);
            // UDP_MAX_SEGMENTS is 64 on 6.x kernels; a UDP payload at most
            // 65 487 bytes (IPv6; 65 507 over IPv4).
            assert!((1..=64).contains(&n) && n * seg <= GSO_MAX_BYTES && n * seg <= 65_487, "k {k}: {n} segments");
        }
        assert_eq!(gso_segments_max(CHUNK_DATAGRAM_MAX), 44);
        assert_eq!(gso_segments_max(6 * CHUNK_DATAGRAM_MAX), 7);
    }
}
