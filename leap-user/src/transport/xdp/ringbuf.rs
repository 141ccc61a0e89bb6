//! Reading the chunks the XDP program copied into its BPF ring buffer.
//!
//! The program submits records without waking the reader except every
//! N-th record and the last chunk of a frame, so a blocked reader wakes
//! about once per frame; [`RingReader::wait`] bounds the sleep anyway.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use leap_common::xdp::RingRecord;

use super::sys;

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
