//! Reassembly of LEAP chunks into frames, in sequence order, straight into
//! the caller's buffer.
//!
//! The frame the caller waits for (the *expected* seq) is written directly
//! into the buffer given to [`Reassembler::push`]. Chunks of the next few
//! frames that arrive early are kept in a small window of side slots and
//! moved into the caller's buffer by [`Reassembler::begin`]. Chunks of
//! frames already delivered or given up are dropped as stale; chunks too far
//! ahead are dropped.
//!
//! A chunk that is dropped changes nothing but a drop counter: not the
//! expected seq, not what is known of the sender. Only a long run of chunks
//! too far ahead (the sender really moved on) gives the expected frame up,
//! and only a long run of chunks far behind, with nothing placed, counts as
//! evidence of a restarted sender ([`Reassembler::resync_if_restarted`]).
//! Every chunk costs bounded work and lands inside the smaller of the
//! caller's buffer and `max_frame_len`.
//!
//! Frames sent with [`flags::CRC`] carry `frame ++ crc32c(frame)` in their
//! chunks; the CRC is checked before the frame is delivered, and a frame
//! whose check fails is dropped, counted and reported by
//! [`Reassembler::take_corrupt`] so that it can be fetched again.
//! Nothing here allocates after the side slots have held the largest frame.

use leap_common::chunk::{
    CHUNK_PAYLOAD_MAX, CRC_TRAILER_LEN, ChunkHeader, ChunkKind, FRAME_LEN_MAX, KEYED_PAYLOAD_MAX, chunks_for_stride,
    flags, frame_bytes_per_chunk,
};
use leap_common::control::ControlMessage;

use super::types::{Drops, FrameKind, Received};

/// Chunks far behind the expected seq, with none placed in between, that
/// count as evidence that the sender restarted (a restarted sender sends
/// whole frames; a few stale or forged chunks are not enough).
pub const RESTART_EVIDENCE: u32 = 64;

/// Chunks beyond the window, with none placed in between, that show the
/// sender has moved on past the expected frame.
pub const FAR_AHEAD_EVIDENCE: u32 = 64;

/// Default number of frames that can be in assembly at once.
pub const DEFAULT_WINDOW: u16 = 8;

/// What became of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Push {
    /// Stored; its frame is not complete yet.
    Stored,
    /// The expected frame is complete in the caller's buffer.
    Complete(Received),
    /// Dropped, and counted in [`Reassembler::drops`].
    Dropped,
}

/// A frame given up before it was complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostFrame {
    /// Its sequence number.
    pub seq: u16,
    /// Chunks that never arrived (all of them if none did).
    pub missing: u16,
    /// Chunks of the frame (0 if no chunk arrived).
    pub total: u16,
}

/// Assembly state of one frame.
#[derive(Debug)]
struct Assembly {
    seq: u16,
    /// 0 while no chunk has arrived.
    total: u16,
    received: u16,
    /// One past the highest chunk id received.
    high: u16,
    /// Length of the frame once its last chunk arrived.
    len: Option<usize>,
    kind: FrameKind,
    from_leap: bool,
    /// Chunks carry `frame ++ crc` ([`flags::CRC`]).
    crc: bool,
    /// The last 3 bytes of chunk `total - 2` and the last (up to 4) bytes of
    /// the last chunk, right-aligned, with its payload length: where the CRC
    /// trailer is once the frame is complete.
    pen_tail: [u8; 3],
    last_tail: [u8; CRC_TRAILER_LEN],
    last_len: usize,
    /// Largest frame.
    max_len: usize,
    /// Its gaps were reported by [`Reassembler::gaps_ahead`].
    nacked: bool,
    /// Frame bytes per chunk (fewer in a keyed ring's chunks), from the
    /// first chunk taken.
    stride: usize,
    bitmap: Vec<u64>,
}

impl Assembly {
    fn new(max_len: usize) -> Self {
        // Keyed chunks carry the fewest bytes: room for the most chunks.
        let max_chunks = chunks_for_stride(max_len + CRC_TRAILER_LEN, KEYED_PAYLOAD_MAX).unwrap_or(u16::MAX);
        Self {
            seq: 0,
            total: 0,
            received: 0,
            high: 0,
            len: None,
            kind: FrameKind::Data,
            from_leap: false,
            crc: false,
            pen_tail: [0; 3],
            last_tail: [0; CRC_TRAILER_LEN],
            last_len: 0,
            max_len,
            nacked: false,
            stride: CHUNK_PAYLOAD_MAX,
            bitmap: vec![0; usize::from(max_chunks).div_ceil(64)],
        }
    }

    fn is_empty(&self) -> bool {
        self.total == 0
    }

    fn is_complete(&self) -> bool {
        self.total != 0 && self.received == self.total
    }

    fn reset(&mut self, seq: u16) {
        let words = usize::from(self.total).div_ceil(64);
        self.bitmap[..words].fill(0);
        self.seq = seq;
        self.total = 0;
        self.received = 0;
        self.high = 0;
        self.len = None;
        self.kind = FrameKind::Data;
        self.from_leap = false;
        self.crc = false;
        self.nacked = false;
        self.stride = CHUNK_PAYLOAD_MAX;
    }

    fn has(&self, id: u16) -> bool {
        self.bitmap[usize::from(id) / 64] & (1 << (id % 64)) != 0
    }

    /// The shortest frame the chunks received so far allow (to check that
    /// it fits a buffer before the last chunk is known).
    fn min_len(&self) -> usize {
        self.len.unwrap_or_else(|| {
            let full = (usize::from(self.total) - 1) * self.stride + 1;
            if self.crc { full.saturating_sub(CRC_TRAILER_LEN).max(1) } else { full }
        })
    }

    /// Takes a chunk into `buf` (which holds at most `max_len` bytes of the
    /// frame); returns whether it was taken, counting the reason if not.
    fn put(&mut self, hdr: &ChunkHeader, payload: &[u8], buf: &mut [u8], drops: &mut Drops) -> bool {
        let kind = match hdr.kind() {
            ChunkKind::Control => FrameKind::Control,
            _ => FrameKind::Data,
        };
        let crc = hdr.has(flags::CRC);
        let stride = frame_bytes_per_chunk(hdr.reserved);
        let limit = buf.len().min(self.max_len);
        if self.total == 0 {
            // Exactly as many chunks as a frame that fits can have.
            let most = chunks_for_stride(if crc { limit + CRC_TRAILER_LEN } else { limit }, stride).unwrap_or(0);
            if hdr.total_chunks > most {
                drops.too_large += 1;
                return false;
            }
        } else if hdr.total_chunks != self.total || kind != self.kind || crc != self.crc || stride != self.stride {
            drops.total_mismatch += 1;
            return false;
        }
        // `chunk_id < total_chunks <= max_chunks` (parsed, checked above).
        if self.has(hdr.chunk_id) {
            drops.duplicate += 1;
            return false;
        }
        let at = usize::from(hdr.chunk_id) * stride;
        let last = hdr.chunk_id + 1 == hdr.total_chunks;
        // Bytes of the frame in this chunk; with a CRC, the stream is
        // `frame ++ crc` and the frame ends 4 bytes before it.
        let (keep, len) = if !crc {
            (payload.len(), last.then_some(at + payload.len()))
        } else if last {
            let Some(len) = (at + payload.len()).checked_sub(CRC_TRAILER_LEN).filter(|&l| l >= 1) else {
                drops.bad_length += 1;
                return false;
            };
            (len.saturating_sub(at), Some(len))
        } else if hdr.chunk_id + 2 == hdr.total_chunks {
            // Its last bytes may be the start of the trailer: those need not
            // fit the buffer.
            (payload.len().min(limit.saturating_sub(at)), None)
        } else {
            (payload.len(), None)
        };
        if len.is_some_and(|l| l > limit) || (crc && !last && keep + 3 < payload.len()) {
            drops.too_large += 1;
            return false;
        }
        // (A last chunk of nothing but trailer bytes may start past the end.)
        if keep > 0 {
            let Some(dst) = buf.get_mut(at..at + keep) else {
                drops.too_large += 1;
                return false;
            };
            dst.copy_from_slice(&payload[..keep]);
        }
        if self.total == 0 {
            self.total = hdr.total_chunks;
            self.kind = kind;
            self.crc = crc;
            self.stride = stride;
            self.from_leap = hdr.from_leap();
        }
        if crc && hdr.chunk_id + 2 == hdr.total_chunks {
            self.pen_tail.copy_from_slice(&payload[payload.len() - 3..]);
        }
        if crc && last {
            let n = payload.len().min(CRC_TRAILER_LEN);
            self.last_tail = [0; CRC_TRAILER_LEN];
            self.last_tail[CRC_TRAILER_LEN - n..].copy_from_slice(&payload[payload.len() - n..]);
            self.last_len = payload.len();
        }
        self.bitmap[usize::from(hdr.chunk_id) / 64] |= 1 << (hdr.chunk_id % 64);
        self.received += 1;
        self.high = self.high.max(hdr.chunk_id + 1);
        if len.is_some() {
            self.len = len;
        }
        true
    }

    /// The CRC trailer of a complete frame sent with [`flags::CRC`].
    fn trailer(&self) -> u32 {
        let mut t = [0u8; CRC_TRAILER_LEN];
        let n = self.last_len.min(CRC_TRAILER_LEN);
        // The last chunk holds the trailer's last `n` bytes; the rest ends
        // chunk `total - 2`.
        t[CRC_TRAILER_LEN - n..].copy_from_slice(&self.last_tail[CRC_TRAILER_LEN - n..]);
        t[..CRC_TRAILER_LEN - n].copy_from_slice(&self.pen_tail[3 - (CRC_TRAILER_LEN - n)..]);
        u32::from_le_bytes(t)
    }

    /// Copies the chunks received so far from `src` to `dst`.
    /// Returns the bytes copied.
    fn copy_received(&self, src: &[u8], dst: &mut [u8]) -> u64 {
        let full = usize::from(self.total) * self.stride;
        let end = self.len.unwrap_or(full).min(src.len()).min(dst.len());
        if self.received == self.total || u32::from(self.received) * 2 >= u32::from(self.total) {
            dst[..end].copy_from_slice(&src[..end]);
            return end as u64;
        }
        let mut copied = 0;
        for id in 0..self.total {
            let at = usize::from(id) * self.stride;
            if self.has(id) && at < end {
                let to = (at + self.stride).min(end);
                dst[at..to].copy_from_slice(&src[at..to]);
                copied += (to - at) as u64;
            }
        }
        copied
    }

    fn missing(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.total).filter(|&id| !self.has(id))
    }
}

/// A side slot: assembly state plus its own buffer, allocated on first use
/// and grown to the frames it holds (see [`slot_len`]).
#[derive(Debug)]
struct Slot {
    asm: Assembly,
    buf: Vec<u8>,
}

/// Bytes a side slot needs for a frame of `total` chunks: what they can
/// carry, at most `max_frame_len`. Slots grow to the frames they hold, so
/// that a large window of small frames does not cost `max_frame_len` each.
fn slot_len(total: u16, max_frame_len: usize) -> usize {
    (usize::from(total) * CHUNK_PAYLOAD_MAX).min(max_frame_len)
}

/// Puts chunks back together into frames, delivered in sequence order.
#[derive(Debug)]
pub struct Reassembler {
    max_frame_len: usize,
    window: u16,
    expected: Option<u16>,
    cur: Assembly,
    slots: Vec<Slot>,
    overtaken: bool,
    ahead: bool,
    peer_reliable: bool,
    /// Consecutive chunks far behind / beyond the window, with none placed.
    far_behind: u32,
    far_ahead: u32,
    placed_since_check: u64,
    /// A frame whose CRC check failed (to fetch again).
    corrupt: Option<u16>,
    drops: Drops,
    /// Bytes moved between buffers (side slot to the caller's and back).
    copied: u64,
}

impl Reassembler {
    /// A reassembler for frames of at most `max_frame_len` bytes with
    /// [`DEFAULT_WINDOW`] frames in assembly.
    pub fn new(max_frame_len: usize) -> Self {
        Self::with_window(max_frame_len, DEFAULT_WINDOW)
    }

    /// As [`Self::new`] with `window` frames in assembly at once (rounded up
    /// to a power of two, at most 1024).
    pub fn with_window(max_frame_len: usize, window: u16) -> Self {
        let max_frame_len = max_frame_len.clamp(1, FRAME_LEN_MAX);
        // A power of two, so that `seq % window` stays consistent when seq wraps.
        let window = window.clamp(1, 1024).next_power_of_two();
        let slots = (0..window).map(|_| Slot { asm: Assembly::new(max_frame_len), buf: Vec::new() }).collect();
        Self {
            max_frame_len,
            window,
            expected: None,
            cur: Assembly::new(max_frame_len),
            slots,
            overtaken: false,
            ahead: false,
            peer_reliable: false,
            far_behind: 0,
            far_ahead: 0,
            placed_since_check: 0,
            corrupt: None,
            drops: Drops::default(),
            copied: 0,
        }
    }

    /// Bytes moved between buffers so far: chunks kept in a side slot and
    /// moved to the caller's buffer by [`Self::begin`], or the other way by
    /// [`Self::suspend`] (each chunk's first placement is not counted).
    pub fn copied(&self) -> u64 {
        self.copied
    }

    /// Drops counted so far.
    pub fn drops(&self) -> &Drops {
        &self.drops
    }

    /// Mutable drop counters, for backends that drop before reassembly
    /// (parse errors, wrong source).
    pub fn drops_mut(&mut self) -> &mut Drops {
        &mut self.drops
    }

    /// The sequence number to be delivered next, once locked on.
    pub fn expected(&self) -> Option<u16> {
        self.expected
    }

    /// Whether a run of chunks far ahead showed that the expected frame will
    /// not complete in order (the sender moved on).
    pub fn is_overtaken(&self) -> bool {
        self.overtaken
    }

    /// Whether chunks of frames after the expected one arrived: the sender
    /// has moved on, so what the expected frame lacks is lost, not late.
    pub fn saw_ahead(&self) -> bool {
        self.ahead
    }

    /// Whether the last chunk taken came from a leap sender that keeps its
    /// frames for retransmission (so NACKs are worth sending).
    pub fn peer_reliable(&self) -> bool {
        self.peer_reliable
    }

    /// Whether the expected frame has some, but not all, of its chunks.
    pub fn has_partial(&self) -> bool {
        !self.cur.is_empty() && !self.cur.is_complete()
    }

    /// Whether the expected frame is complete in its side slot: the next
    /// [`Self::begin`] delivers it (unless its CRC fails, or it does not fit
    /// the caller's buffer).
    pub fn ready(&self) -> bool {
        let Some(exp) = self.expected else { return false };
        let slot = &self.slots[self.slot_index(exp)];
        slot.asm.seq == exp && slot.asm.is_complete()
    }

    /// Whether a frame failed its CRC check and was not yet reported by
    /// [`Self::take_corrupt`].
    pub fn is_corrupt(&self) -> bool {
        self.corrupt.is_some()
    }

    /// `(received, total)` of the expected frame (total 0: nothing yet).
    pub fn progress(&self) -> (u16, u16) {
        (self.cur.received, self.cur.total)
    }

    /// Chunk ids still missing from the expected frame (for a NACK).
    pub fn missing(&self) -> impl Iterator<Item = u16> + '_ {
        self.cur.missing()
    }

    /// Chunk ids missing from the expected frame below the highest one
    /// received: on an in-order path these are lost, while those above may
    /// still be on their way.
    pub fn holes(&self) -> impl Iterator<Item = u16> + '_ {
        let high = self.cur.high;
        self.cur.missing().take_while(move |&id| id < high)
    }

    /// Calls `f(seq, missing chunk ids)` for each frame after the expected
    /// one whose missing chunks are lost rather than late: those below the
    /// highest chunk received, or all of them once a later frame has
    /// chunks. Each frame is reported once while it waits in a side slot,
    /// so that its loss is recovered while the expected frame's is, not
    /// one frame after another.
    pub fn gaps_ahead(&mut self, mut f: impl FnMut(u16, &mut dyn Iterator<Item = u16>)) {
        let Some(exp) = self.expected else { return };
        let w = self.window;
        let mut later = false;
        for d in (1..w).rev() {
            let seq = exp.wrapping_add(d);
            let a = &mut self.slots[usize::from(seq % w)].asm;
            if a.is_empty() || a.seq != seq {
                continue;
            }
            let high = if later { a.total } else { a.high };
            later = true;
            if a.is_complete() || a.nacked || a.missing().next().is_none_or(|id| id >= high) {
                continue;
            }
            a.nacked = true;
            f(seq, &mut a.missing().take_while(|&id| id < high));
        }
    }

    /// Starts a receive call with the caller's buffer: moves whatever arrived
    /// early for the expected frame into `out`. Returns the frame if it is
    /// already complete.
    pub fn begin(&mut self, out: &mut [u8]) -> Option<Received> {
        self.placed_since_check = 0;
        let exp = self.expected?;
        // Chunks in `cur` belong to a previous call's buffer unless `suspend`
        // moved them to a slot: they cannot be used with this buffer.
        self.cur.reset(exp);
        let i = self.slot_index(exp);
        let slot = &mut self.slots[i];
        if slot.asm.is_empty() || slot.asm.seq != exp {
            return None;
        }
        if slot.asm.min_len() > out.len() {
            self.drops.too_large += 1;
            slot.asm.reset(exp);
            return None;
        }
        self.copied += slot.asm.copy_received(&slot.buf, out);
        std::mem::swap(&mut self.cur, &mut slot.asm);
        slot.asm.reset(exp);
        if self.cur.is_complete() { self.finish(out) } else { None }
    }

    /// Takes one chunk (header already parsed and length-checked with
    /// [`ChunkHeader::parse_data`]) into the frame it belongs to.
    pub fn push(&mut self, hdr: &ChunkHeader, payload: &[u8], out: &mut [u8]) -> Push {
        self.place(hdr, payload, Some(out))
    }

    /// As [`Self::push`], for chunks that arrive in the same batch after the
    /// expected frame completed: the caller's buffer now holds that frame, so
    /// every chunk goes to a side slot, even one of the (new) expected frame.
    pub fn stash(&mut self, hdr: &ChunkHeader, payload: &[u8]) -> Push {
        self.place(hdr, payload, None)
    }

    fn place(&mut self, hdr: &ChunkHeader, payload: &[u8], out: Option<&mut [u8]>) -> Push {
        let exp = self.expected.unwrap_or(hdr.seq);
        let d = hdr.seq.wrapping_sub(exp) as i16;
        if d < 0 {
            // Far behind: legitimate duplicates are a few frames old; a long
            // run of these is what a restarted sender looks like.
            if i32::from(d) < -4 * i32::from(self.window) {
                self.far_behind = self.far_behind.saturating_add(1);
            }
            self.drops.stale += 1;
            return Push::Dropped;
        }
        if d as u16 >= self.window {
            self.drops.out_of_window += 1;
            self.far_ahead = self.far_ahead.saturating_add(1);
            if self.far_ahead >= FAR_AHEAD_EVIDENCE && self.expected.is_some() {
                self.overtaken = true;
            }
            return Push::Dropped;
        }
        if self.expected.is_none() {
            self.expected = Some(exp);
            self.cur.reset(exp);
        } else if self.cur.is_empty() && self.cur.seq != exp {
            self.cur.reset(exp);
        }
        if let (0, Some(out)) = (d, out) {
            if !self.cur.put(hdr, payload, out, &mut self.drops) {
                return Push::Dropped;
            }
            self.taken(hdr, d);
            if !self.cur.is_complete() {
                return Push::Stored;
            }
            return match self.finish(out) {
                Some(got) => Push::Complete(got),
                None => Push::Dropped,
            };
        }
        let i = self.slot_index(hdr.seq);
        let need = slot_len(hdr.total_chunks, self.max_frame_len);
        let slot = &mut self.slots[i];
        if slot.asm.seq != hdr.seq {
            slot.asm.reset(hdr.seq);
        }
        if slot.buf.len() < need {
            slot.buf.resize(need, 0);
        }
        if !slot.asm.put(hdr, payload, &mut slot.buf, &mut self.drops) {
            return Push::Dropped;
        }
        self.taken(hdr, d);
        Push::Stored
    }

    /// Notes what a chunk that was taken says about the sender: only such a
    /// chunk may change it.
    fn taken(&mut self, hdr: &ChunkHeader, d: i16) {
        self.placed_since_check += 1;
        self.far_behind = 0;
        self.far_ahead = 0;
        self.peer_reliable = hdr.has(flags::RELIABLE);
        if d > 0 {
            self.ahead = true;
        }
    }

    /// Ends a receive call that did not complete its frame: keeps the chunks
    /// received into `out` so that the next call, with another buffer,
    /// continues the frame.
    pub fn suspend(&mut self, out: &[u8]) {
        let Some(exp) = self.expected else { return };
        if self.cur.is_empty() || self.cur.seq != exp {
            return;
        }
        let i = self.slot_index(exp);
        let need = slot_len(self.cur.total, self.max_frame_len);
        let slot = &mut self.slots[i];
        if slot.buf.len() < need {
            slot.buf.resize(need, 0);
        }
        self.copied += self.cur.copy_received(out, &mut slot.buf);
        std::mem::swap(&mut self.cur, &mut slot.asm);
        self.cur.reset(exp);
    }

    /// Gives up the expected frame (deadline passed, or overtaken) and moves
    /// on to the next seq.
    pub fn abandon(&mut self) -> LostFrame {
        let exp = self.expected.unwrap_or(0);
        let lost = LostFrame {
            seq: exp,
            total: self.cur.total,
            missing: if self.cur.total == 0 { 0 } else { self.cur.total - self.cur.received },
        };
        self.advance();
        lost
    }

    /// After a deadline with no progress: if a long run of chunks far behind
    /// the expected seq arrived and none was taken (a sender that restarted
    /// and counts from 0 again), forgets the seq we were locked on so that
    /// the next chunk starts afresh. Returns whether it did.
    ///
    /// A few stale chunks (late duplicates, tail-loss probes of frames
    /// already delivered, forged ones) never trigger it: they cannot make a
    /// frame the caller already had be delivered again.
    pub fn resync_if_restarted(&mut self) -> bool {
        let restarted = self.placed_since_check == 0 && self.far_behind >= RESTART_EVIDENCE && self.cur.is_empty();
        self.placed_since_check = 0;
        if restarted {
            self.resync();
        }
        restarted
    }

    /// The seq of a frame whose CRC check failed since the last call (it was
    /// dropped; in reliable mode it should be fetched again).
    pub fn take_corrupt(&mut self) -> Option<u16> {
        self.corrupt.take()
    }

    /// Forgets all state (e.g. the previous node restarted).
    pub fn resync(&mut self) {
        self.expected = None;
        self.overtaken = false;
        self.ahead = false;
        self.far_behind = 0;
        self.far_ahead = 0;
        self.corrupt = None;
        self.cur.reset(0);
        for s in &mut self.slots {
            s.asm.reset(0);
        }
    }

    /// Delivers the complete expected frame from `out`, or drops it if its
    /// CRC does not match (the expected seq stays, to be fetched again).
    fn finish(&mut self, out: &[u8]) -> Option<Received> {
        let len = self.cur.len?;
        if self.cur.crc && crc32c::crc32c(&out[..len]) != self.cur.trailer() {
            self.drops.bad_crc += 1;
            self.corrupt = self.expected;
            let exp = self.cur.seq;
            self.cur.reset(exp);
            return None;
        }
        let mut kind = self.cur.kind;
        if !self.cur.from_leap && ControlMessage::decode_frame(&out[..len]).is_ok() {
            kind = FrameKind::Control;
        }
        self.advance();
        Some(Received { len, kind })
    }

    fn advance(&mut self) {
        let next = self.expected.unwrap_or(0).wrapping_add(1);
        self.expected = Some(next);
        self.cur.reset(next);
        self.overtaken = false;
        self.corrupt = None;
        // Chunks of the new expected frame's successors may already be in
        // slots: the sender has moved on past it.
        let (w, e) = (self.window, next);
        self.ahead = (1..w).any(|d| {
            let s = &self.slots[usize::from(e.wrapping_add(d) % w)].asm;
            !s.is_empty() && s.seq == e.wrapping_add(d)
        });
    }

    fn slot_index(&self, seq: u16) -> usize {
        usize::from(seq % self.window)
    }
}
