//! Reassembly of LEAP chunks into frames, in sequence order, straight into
//! the caller's buffer.
//!
//! The frame the caller waits for (the *expected* seq) is written directly
//! into the buffer given to [`Reassembler::push`]. Chunks of the next few
//! frames that arrive early are kept in a small window of side slots and
//! moved into the caller's buffer by [`Reassembler::begin`]. Chunks of
//! frames already delivered or given up are dropped as stale; chunks too far
//! ahead are dropped and make the expected frame count as overtaken.
//! Nothing here allocates after the side slots have been used once.

use leap_common::chunk::{CHUNK_PAYLOAD_MAX, ChunkHeader, ChunkKind, FRAME_LEN_MAX};
use leap_common::control::ControlMessage;

use crate::transport::{Drops, FrameKind, Received};

/// Consecutive chunks far behind the expected seq that mean the sender
/// restarted.
const RESTART_EVIDENCE: u32 = 8;

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
    /// Length of the frame once its last chunk arrived.
    len: Option<usize>,
    kind: FrameKind,
    from_leap: bool,
    bitmap: Vec<u64>,
}

impl Assembly {
    fn new(max_chunks: usize) -> Self {
        Self {
            seq: 0,
            total: 0,
            received: 0,
            len: None,
            kind: FrameKind::Data,
            from_leap: false,
            bitmap: vec![0; max_chunks.div_ceil(64)],
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
        self.len = None;
        self.kind = FrameKind::Data;
        self.from_leap = false;
    }

    fn has(&self, id: u16) -> bool {
        self.bitmap[usize::from(id) / 64] & (1 << (id % 64)) != 0
    }

    /// Takes a chunk into `buf`; `Err` is the drop reason's counter.
    fn put(&mut self, hdr: &ChunkHeader, payload: &[u8], buf: &mut [u8], drops: &mut Drops) -> bool {
        let kind = match hdr.kind() {
            ChunkKind::Control => FrameKind::Control,
            _ => FrameKind::Data,
        };
        if self.total == 0 {
            if usize::from(hdr.total_chunks) > self.bitmap.len() * 64 {
                drops.too_large += 1;
                return false;
            }
            self.total = hdr.total_chunks;
            self.kind = kind;
            self.from_leap = hdr.from_leap();
        } else if hdr.total_chunks != self.total || kind != self.kind {
            drops.total_mismatch += 1;
            return false;
        }
        if self.has(hdr.chunk_id) {
            drops.duplicate += 1;
            return false;
        }
        let at = usize::from(hdr.chunk_id) * CHUNK_PAYLOAD_MAX;
        let Some(dst) = buf.get_mut(at..at + payload.len()) else {
            drops.too_large += 1;
            return false;
        };
        dst.copy_from_slice(payload);
        self.bitmap[usize::from(hdr.chunk_id) / 64] |= 1 << (hdr.chunk_id % 64);
        self.received += 1;
        if hdr.chunk_id + 1 == self.total {
            self.len = Some(at + payload.len());
        }
        true
    }

    /// Copies the chunks received so far from `src` to `dst`.
    fn copy_received(&self, src: &[u8], dst: &mut [u8]) {
        let full = usize::from(self.total) * CHUNK_PAYLOAD_MAX;
        let end = self.len.unwrap_or(full).min(src.len()).min(dst.len());
        if self.received == self.total || u32::from(self.received) * 2 >= u32::from(self.total) {
            dst[..end].copy_from_slice(&src[..end]);
            return;
        }
        for id in 0..self.total {
            if self.has(id) {
                let at = usize::from(id) * CHUNK_PAYLOAD_MAX;
                let to = (at + CHUNK_PAYLOAD_MAX).min(end);
                dst[at..to].copy_from_slice(&src[at..to]);
            }
        }
    }

    fn missing(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.total).filter(|&id| !self.has(id))
    }
}

/// A side slot: assembly state plus its own buffer, allocated on first use.
#[derive(Debug)]
struct Slot {
    asm: Assembly,
    buf: Vec<u8>,
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
    far_behind: u32,
    placed_since_check: u64,
    unplaced_since_check: u64,
    drops: Drops,
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
        let max_chunks = max_frame_len.div_ceil(CHUNK_PAYLOAD_MAX);
        let slots = (0..window).map(|_| Slot { asm: Assembly::new(max_chunks), buf: Vec::new() }).collect();
        Self {
            max_frame_len,
            window,
            expected: None,
            cur: Assembly::new(max_chunks),
            slots,
            overtaken: false,
            ahead: false,
            peer_reliable: false,
            far_behind: 0,
            placed_since_check: 0,
            unplaced_since_check: 0,
            drops: Drops::default(),
        }
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

    /// Whether a chunk far ahead showed that the expected frame will not
    /// complete in order (the sender moved on).
    pub fn is_overtaken(&self) -> bool {
        self.overtaken
    }

    /// Whether chunks of frames after the expected one arrived: the sender
    /// has moved on, so what the expected frame lacks is lost, not late.
    pub fn saw_ahead(&self) -> bool {
        self.ahead
    }

    /// Whether the last chunk came from a leap sender that keeps its frames
    /// for retransmission (so NACKs are worth sending).
    pub fn peer_reliable(&self) -> bool {
        self.peer_reliable
    }

    /// Whether the expected frame has some, but not all, of its chunks.
    pub fn has_partial(&self) -> bool {
        !self.cur.is_empty() && !self.cur.is_complete()
    }

    /// `(received, total)` of the expected frame (total 0: nothing yet).
    pub fn progress(&self) -> (u16, u16) {
        (self.cur.received, self.cur.total)
    }

    /// Chunk ids still missing from the expected frame (for a NACK).
    pub fn missing(&self) -> impl Iterator<Item = u16> + '_ {
        self.cur.missing()
    }

    /// Starts a receive call with the caller's buffer: moves whatever arrived
    /// early for the expected frame into `out`. Returns the frame if it is
    /// already complete.
    pub fn begin(&mut self, out: &mut [u8]) -> Option<Received> {
        self.placed_since_check = 0;
        self.unplaced_since_check = 0;
        let exp = self.expected?;
        // Chunks in `cur` belong to a previous call's buffer unless `suspend`
        // moved them to a slot: they cannot be used with this buffer.
        self.cur.reset(exp);
        let i = self.slot_index(exp);
        let slot = &mut self.slots[i];
        if slot.asm.is_empty() || slot.asm.seq != exp {
            return None;
        }
        let need = slot.asm.len.unwrap_or((usize::from(slot.asm.total) - 1) * CHUNK_PAYLOAD_MAX + 1);
        if need > out.len() {
            self.drops.too_large += 1;
            slot.asm.reset(exp);
            return None;
        }
        slot.asm.copy_received(&slot.buf, out);
        std::mem::swap(&mut self.cur, &mut slot.asm);
        slot.asm.reset(exp);
        if self.cur.is_complete() { Some(self.finish(out)) } else { None }
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
        self.peer_reliable = hdr.has(leap_common::chunk::flags::RELIABLE);
        let exp = *self.expected.get_or_insert(hdr.seq);
        if self.cur.is_empty() && self.cur.seq != exp {
            self.cur.reset(exp);
        }
        let d = hdr.seq.wrapping_sub(exp) as i16;
        if d < 0 && i32::from(d) < -4 * i32::from(self.window) {
            // Far behind: legitimate duplicates are a few frames old, so a
            // run of these means the sender restarted and counts from 0.
            self.far_behind += 1;
            if self.far_behind >= RESTART_EVIDENCE {
                self.resync();
                return self.place(hdr, payload, out);
            }
        }
        if d < 0 {
            self.drops.stale += 1;
            self.unplaced_since_check += 1;
            return Push::Dropped;
        }
        self.far_behind = 0;
        if d > 0 {
            self.ahead = true;
        }
        if d as u16 >= self.window {
            self.drops.out_of_window += 1;
            self.unplaced_since_check += 1;
            self.overtaken = true;
            return Push::Dropped;
        }
        if let (0, Some(out)) = (d, out) {
            if !self.cur.put(hdr, payload, out, &mut self.drops) {
                return Push::Dropped;
            }
            self.placed_since_check += 1;
            return if self.cur.is_complete() { Push::Complete(self.finish(out)) } else { Push::Stored };
        }
        let i = self.slot_index(hdr.seq);
        let max = self.max_frame_len;
        let slot = &mut self.slots[i];
        if slot.asm.seq != hdr.seq {
            slot.asm.reset(hdr.seq);
        }
        if slot.buf.len() < max {
            slot.buf.resize(max, 0);
        }
        if !slot.asm.put(hdr, payload, &mut slot.buf, &mut self.drops) {
            return Push::Dropped;
        }
        self.placed_since_check += 1;
        Push::Stored
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
        let max = self.max_frame_len;
        let slot = &mut self.slots[i];
        if slot.buf.len() < max {
            slot.buf.resize(max, 0);
        }
        self.cur.copy_received(out, &mut slot.buf);
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

    /// After a deadline with no progress: if only stale or far-away chunks
    /// arrived (the sender restarted, or we lost track), forgets the seq we
    /// were locked on so that the next chunk starts afresh. Returns whether
    /// it did.
    pub fn resync_if_lost(&mut self) -> bool {
        let lost = self.placed_since_check == 0 && self.unplaced_since_check > 0 && self.cur.is_empty();
        self.placed_since_check = 0;
        self.unplaced_since_check = 0;
        if lost {
            self.resync();
        }
        lost
    }

    /// Forgets all state (e.g. the previous node restarted).
    pub fn resync(&mut self) {
        self.expected = None;
        self.overtaken = false;
        self.ahead = false;
        self.far_behind = 0;
        self.cur.reset(0);
        for s in &mut self.slots {
            s.asm.reset(0);
        }
    }

    fn finish(&mut self, out: &[u8]) -> Received {
        let len = self.cur.len.expect("complete frame has its last chunk");
        let mut kind = self.cur.kind;
        if !self.cur.from_leap && ControlMessage::decode_frame(&out[..len]).is_ok() {
            kind = FrameKind::Control;
        }
        self.advance();
        Received { len, kind }
    }

    fn advance(&mut self) {
        let next = self.expected.unwrap_or(0).wrapping_add(1);
        self.expected = Some(next);
        self.cur.reset(next);
        self.overtaken = false;
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
