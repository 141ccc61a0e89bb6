//! Reading the chunks the XDP program copied into its BPF ring buffer.
//!
//! The program submits records without waking the reader except every
//! N-th record and the last chunk of a frame, so a blocked reader wakes
//! about once per frame; [`RingReader::wait`] bounds the sleep anyway.
//!
//! A chunk train comes as one record per chunk; [`TrainGather`] puts the
//! pieces back together so that the UDP checksum, which covers the whole
//! datagram, can be checked.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use leap_common::chunk::{CHUNK_DATAGRAM_MAX, TRAIN_CHUNKS_MAX};
use leap_common::xdp::{MAX_QUEUES, RingRecord};

use crate::sys::xdp as sys;

/// The consumer side of `LEAP_RING`.
pub struct RingReader {
    ring: RingBuf<MapData>,
    /// Records too short to be a `RingRecord` (a foreign producer).
    pub short_records: u64,
}

impl std::fmt::Debug for RingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingReader").field("short_records", &self.short_records).finish_non_exhaustive()
    }
}

impl RingReader {
    /// Reads from `ring`.
    pub fn new(ring: RingBuf<MapData>) -> Self {
        Self { ring, short_records: 0 }
    }

    /// Calls `f` with up to `max` records; returns how many there were.
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&RingRecord)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else { break };
            n += 1;
            let Some(bytes) = item.get(..size_of::<RingRecord>()) else {
                self.short_records += 1;
                continue;
            };
            // Ring-buffer records are 8-byte aligned, so the cast holds; a
            // copy covers any other case.
            match bytemuck::try_from_bytes::<RingRecord>(bytes) {
                Ok(rec) => f(rec),
                Err(_) => f(&bytemuck::pod_read_unaligned::<RingRecord>(bytes)),
            }
        }
        n
    }

    /// The ring's descriptor (readable when records wait).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.ring.as_fd()
    }

    /// Waits until the ring has data or `timeout` passes.
    ///
    /// # Errors
    ///
    /// The `poll` error.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        sys::poll_readable([self.ring.as_fd()], timeout).map(|m| m != 0)
    }
}

/// What [`TrainGather::push`] made of a record.
#[derive(Debug)]
pub enum Piece<'a> {
    /// A datagram of one chunk: check and take the record as it is.
    Whole,
    /// A piece of a train whose other pieces are still to come.
    Pending,
    /// The last piece of a train: the first record (addresses, ports,
    /// checksum field) and the whole UDP payload.
    Complete(&'a RingRecord, &'a [u8]),
    /// A piece that does not continue the train of its receive queue, or
    /// an impossible tag: dropped (count it).
    Broken,
}

/// The train being gathered on one receive queue.
#[derive(Debug)]
struct TrainSlot {
    queue: u32,
    first: RingRecord,
    bytes: Vec<u8>,
    next: u8,
    pieces: u8,
}

impl TrainSlot {
    fn key(&self) -> (u32, [u8; 16], u16) {
        (self.queue, self.first.src_addr, self.first.src_port)
    }
}

/// Puts the records of chunk trains back together, per receive queue and
/// sender (see [`RingRecord::train`]); at most one train per queue and
/// sender is pending, and at most `MAX_QUEUES` trains in all.
#[derive(Debug, Default)]
pub struct TrainGather {
    slots: Vec<TrainSlot>,
    /// Trains left incomplete: the ring buffer ran full half-way, so the
    /// program passed the datagram to the kernel's UDP socket, which
    /// delivers all of it (not an error).
    pub abandoned: u64,
}

impl TrainGather {
    /// Takes one record.
    pub fn push(&mut self, rec: &RingRecord) -> Piece<'_> {
        let Some((index, pieces)) = rec.train_piece() else {
            return Piece::Whole;
        };
        let Some(data) = rec.datagram() else { return Piece::Broken };
        if !(2..=TRAIN_CHUNKS_MAX as u8).contains(&pieces) || index >= pieces {
            return Piece::Broken;
        }
        // One slot per receive queue and sender: in generic mode two CPUs
        // may run the program for one queue at once, but one sender's
        // datagrams on one queue come in order.
        let key = (rec.rx_queue, rec.src_addr, rec.src_port);
        let found = self.slots.iter().position(|s| s.key() == key);
        // Else an idle slot of another sender, else a new one.
        let pos = match found.or_else(|| self.slots.iter().position(|s| s.next == 0)) {
            Some(p) => p,
            None if self.slots.len() < MAX_QUEUES as usize => {
                self.slots.push(TrainSlot { queue: rec.rx_queue, first: *rec, bytes: Vec::new(), next: 0, pieces: 0 });
                self.slots.len() - 1
            }
            None => return Piece::Broken,
        };
        if found.is_none() {
            self.slots[pos].queue = rec.rx_queue;
            self.slots[pos].first = *rec;
        }
        let slot = &mut self.slots[pos];
        if index == 0 {
            if slot.next != 0 {
                self.abandoned += 1;
            }
            slot.first = *rec;
            slot.bytes.clear();
            slot.pieces = pieces;
        } else {
            let same = slot.next == index
                && slot.pieces == pieces
                && (slot.first.src_addr, slot.first.src_port, slot.first.dst_addr, slot.first.dst_port)
                    == (rec.src_addr, rec.src_port, rec.dst_addr, rec.dst_port)
                && (slot.first.family, slot.first.udp_check) == (rec.family, rec.udp_check);
            if !same {
                slot.next = 0;
                slot.bytes.clear();
                return Piece::Broken;
            }
        }
        // Every piece but the last is a full chunk.
        if index + 1 < pieces && data.len() != CHUNK_DATAGRAM_MAX {
            slot.next = 0;
            slot.bytes.clear();
            return Piece::Broken;
        }
        slot.bytes.extend_from_slice(data);
        if index + 1 < pieces {
            slot.next = index + 1;
            return Piece::Pending;
        }
        slot.next = 0;
        Piece::Complete(&slot.first, &slot.bytes)
    }
}

#[cfg(test)]
mod tests {
    use leap_common::xdp::train_tag;

    use super::*;

    fn piece(queue: u32, index: u8, pieces: u8, len: usize, fill: u8) -> RingRecord {
        let mut r =
            RingRecord { rx_queue: queue, len: len as u16, train: train_tag(index, pieces), ..Default::default() };
        r.data[..len].fill(fill);
        r
    }

    #[test]
    fn pieces_of_a_train_are_gathered_per_queue() {
        let mut g = TrainGather::default();
        assert!(matches!(g.push(&RingRecord { len: 20, ..Default::default() }), Piece::Whole));
        assert!(matches!(g.push(&piece(0, 0, 2, CHUNK_DATAGRAM_MAX, 1)), Piece::Pending));
        // Another queue's train interleaves.
        assert!(matches!(g.push(&piece(1, 0, 2, CHUNK_DATAGRAM_MAX, 7)), Piece::Pending));
        match g.push(&piece(0, 1, 2, 30, 2)) {
            Piece::Complete(first, bytes) => {
                assert_eq!(first.rx_queue, 0);
                assert_eq!(bytes.len(), CHUNK_DATAGRAM_MAX + 30);
                assert!(
                    bytes[..CHUNK_DATAGRAM_MAX].iter().all(|&b| b == 1)
                        && bytes[CHUNK_DATAGRAM_MAX..].iter().all(|&b| b == 2)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(g.push(&piece(1, 1, 2, 12, 8)), Piece::Complete(_, b) if b.len() == CHUNK_DATAGRAM_MAX + 12));
        assert_eq!(g.abandoned, 0);
    }

    #[test]
    fn broken_and_abandoned_trains_are_told_apart() {
        let mut g = TrainGather::default();
        // A piece out of order.
        assert!(matches!(g.push(&piece(0, 1, 3, CHUNK_DATAGRAM_MAX, 0)), Piece::Broken));
        // Impossible tags.
        assert!(matches!(g.push(&piece(0, 0, 7, CHUNK_DATAGRAM_MAX, 0)), Piece::Broken));
        assert!(matches!(g.push(&piece(0, 2, 2, CHUNK_DATAGRAM_MAX, 0)), Piece::Broken));
        // A short piece that is not the last.
        assert!(matches!(g.push(&piece(0, 0, 2, 100, 0)), Piece::Broken));
        // Another sender on the same queue, interleaved.
        let mut other = piece(0, 0, 2, CHUNK_DATAGRAM_MAX, 5);
        other.src_port = 4000;
        assert!(matches!(g.push(&other), Piece::Pending));
        other = piece(0, 1, 2, 12, 6);
        other.src_port = 4000;
        assert!(matches!(g.push(&other), Piece::Complete(_, b) if b.len() == CHUNK_DATAGRAM_MAX + 12));
        // A train cut short (the ring ran full): the next one starts over.
        assert!(matches!(g.push(&piece(0, 0, 3, CHUNK_DATAGRAM_MAX, 0)), Piece::Pending));
        assert!(matches!(g.push(&piece(0, 0, 2, CHUNK_DATAGRAM_MAX, 0)), Piece::Pending));
        assert_eq!(g.abandoned, 1);
        assert!(matches!(g.push(&piece(0, 1, 2, 12, 0)), Piece::Complete(..)));
    }
}
