//! Loss recovery between leap nodes, as pure logic: the NACK wire format,
//! the sender's buffer of recent frames that answers NACKs, and the timers
//! that decide when a receiver asks and when a sender probes.
//!
//! A leap sender in reliable mode sets [`flags::RELIABLE`] on its chunks and
//! keeps its last frames. Its receiver notices missing chunks (a frame idle
//! with holes, or chunks of later frames arriving first) and sends a NACK
//! back: a chunk header of kind [`ChunkKind::Nack`] for the frame's seq whose
//! payload lists the missing chunk ids as ranges. Original peers never set
//! the flag, so with them the receiver stays best-effort.

use std::time::{Duration, Instant};

use leap_common::chunk::{CHUNK_HEADER_LEN, CHUNK_PAYLOAD_MAX, ChunkHeader, ChunkKind, flags};

/// Most ranges one NACK carries (4 bytes each).
pub const NACK_MAX_RANGES: usize = CHUNK_PAYLOAD_MAX / 4;
/// A range meaning "every chunk of the frame" (the receiver saw none).
pub const NACK_ALL: (u16, u16) = (0, u16::MAX);

/// Writes a NACK for `seq` asking for `missing` (ascending chunk ids) into
/// `out`; returns the datagram length, or 0 if nothing is missing.
pub fn encode_nack(
    seq: u16,
    missing: impl IntoIterator<Item = (u16, u16)>,
    out: &mut [u8; CHUNK_HEADER_LEN + CHUNK_PAYLOAD_MAX],
) -> usize {
    let mut n = 0usize;
    for (first, count) in missing.into_iter().take(NACK_MAX_RANGES) {
        let at = CHUNK_HEADER_LEN + n * 4;
        out[at..at + 2].copy_from_slice(&first.to_be_bytes());
        out[at + 2..at + 4].copy_from_slice(&count.to_be_bytes());
        n += 1;
    }
    if n == 0 {
        return 0;
    }
    let hdr = ChunkHeader { seq, chunk_id: 0, total_chunks: n as u16, reserved: flags::LEAP | ChunkKind::Nack as u16 };
    hdr.write(&mut out[..]);
    CHUNK_HEADER_LEN + n * 4
}

/// The ranges `(first, count)` of a NACK's payload; `None` if malformed.
pub fn decode_nack<'a>(hdr: &ChunkHeader, payload: &'a [u8]) -> Option<impl Iterator<Item = (u16, u16)> + 'a> {
    if payload.len() != usize::from(hdr.total_chunks) * 4 || payload.is_empty() {
        return None;
    }
    Some(payload.chunks_exact(4).map(|r| (u16::from_be_bytes([r[0], r[1]]), u16::from_be_bytes([r[2], r[3]]))))
}

/// Groups ascending ids into `(first, count)` ranges.
pub fn ranges(ids: impl IntoIterator<Item = u16>) -> impl Iterator<Item = (u16, u16)> {
    let mut ids = ids.into_iter().peekable();
    std::iter::from_fn(move || {
        let first = ids.next()?;
        let mut count = 1u16;
        while ids.peek() == Some(&first.wrapping_add(count)) && count < u16::MAX - 1 {
            ids.next();
            count += 1;
        }
        Some((first, count))
    })
}

/// Chunks one NACK answer (or one paced burst) sends at most.
pub const RETX_BURST: usize = 64;
/// NACKs answered per kept frame, at most; later ones are refused (a
/// receiver that NACKs the same frame this often has given up long ago).
pub const NACKS_PER_FRAME: u32 = 64;
/// A chunk re-sent less than this long ago is not re-sent again for a later
/// NACK: the answer to the first one is still on its way.
pub const RESEND_HOLDOFF: Duration = Duration::from_micros(500);
/// Chunks of a kept frame re-sent over its whole life, at most, in copies of
/// the frame: whatever NACKs arrive (from the next node, or from anyone
/// spoofing its address), a frame costs at most this many times its size in
/// retransmissions, plus [`RETX_SLACK`] chunks. Later NACKs of it are
/// refused (and counted). A real link loses a few percent at most: two
/// copies leave room for the loss of retransmissions too, and the slack for
/// a small frame fetched again whole more than twice (a CRC that failed
/// again and again on a link that corrupts).
pub const RETX_BUDGET: u32 = 2;
/// Chunks a frame may be re-sent beyond [`RETX_BUDGET`] copies of it (one
/// burst): what a small frame gets at most is a few of its copies, 90 KB.
pub const RETX_SLACK: u32 = RETX_BURST as u32;

/// One stored frame.
#[derive(Debug, Default)]
struct Stored {
    seq: u16,
    reserved: u16,
    len: usize,
    valid: bool,
    data: Vec<u8>,
    /// The CRC trailer sent after the frame (`trailer_len` bytes of it).
    trailer: [u8; 4],
    trailer_len: u8,
    /// Chunks asked for and not sent yet.
    want: Vec<u64>,
    wanted: u32,
    /// Chunks re-sent since `resent_at`.
    resent: Vec<u64>,
    resent_at: Option<Instant>,
    nacks: u32,
    /// Chunks that may still be queued for re-sending ([`RETX_BUDGET`]).
    budget: u32,
}

impl Stored {
    fn total(&self) -> u16 {
        let stride = leap_common::chunk::frame_bytes_per_chunk(self.reserved);
        leap_common::chunk::chunks_for_stride(self.len + usize::from(self.trailer_len), stride).unwrap_or(0)
    }
}

fn bit(map: &[u64], id: u16) -> bool {
    map[usize::from(id) / 64] & (1 << (id % 64)) != 0
}

fn set_bit(map: &mut [u64], id: u16) {
    map[usize::from(id) / 64] |= 1 << (id % 64);
}

/// Sets the bits `[from, to)` of `want` that are clear in both maps, a word
/// at a time, at most `limit` of them (the lowest); returns how many it set.
fn want_range(want: &mut [u64], resent: &[u64], from: u16, to: u16, limit: u32) -> u32 {
    let (from, to) = (usize::from(from), usize::from(to));
    let mut set = 0;
    let mut w = from / 64;
    while w * 64 < to && set < limit {
        let lo = from.max(w * 64) - w * 64;
        let hi = to.min(w * 64 + 64) - w * 64;
        let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
        let mut new = mask & !want[w] & !resent[w];
        // At most 63 bits to clear.
        while new.count_ones() > limit - set {
            new &= !(1u64 << (63 - new.leading_zeros()));
        }
        want[w] |= new;
        set += new.count_ones();
        w += 1;
    }
    set
}

/// What became of a NACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NackAnswer {
    /// This many chunks are now queued for re-sending (0 if all were queued
    /// or re-sent a moment ago).
    Queued(u32),
    /// The frame is no longer kept (or never was).
    Unknown,
    /// Too many NACKs for this frame, or its retransmissions used up its
    /// [`RETX_BUDGET`]: ignored.
    Refused,
}

/// The sender's last frames, to answer NACKs, and the chunks asked for that
/// still have to go out. Buffers are reused: no allocation once every slot
/// has held a frame of the largest size.
///
/// A NACK costs bounded work whatever it holds: its ranges are clamped to the
/// frame's chunks and merged into one bitmap, so each chunk is queued at most
/// once, and [`Self::next_burst`] hands them out [`RETX_BURST`] at a time.
#[derive(Debug)]
pub struct RetransmitBuffer {
    slots: Vec<Stored>,
    /// Slots with wanted chunks (a bitmap over slots would do; few are).
    pending: u32,
}

impl RetransmitBuffer {
    /// Keeps the last `frames` frames (rounded up to a power of two).
    pub fn new(frames: usize) -> Self {
        let n = frames.clamp(1, 1024).next_power_of_two();
        Self { slots: (0..n).map(|_| Stored::default()).collect(), pending: 0 }
    }

    fn slot(&self, seq: u16) -> usize {
        usize::from(seq) % self.slots.len()
    }

    /// Keeps a copy of frame `seq` (`head ++ tail`), sent with `reserved` and
    /// followed on the wire by `trailer` (at most 4 bytes).
    pub fn store(&mut self, seq: u16, reserved: u16, head: &[u8], tail: &[u8], trailer: &[u8]) {
        let len = head.len() + tail.len();
        let data = self.slot_mut(seq, len);
        data[..head.len()].copy_from_slice(head);
        data[head.len()..].copy_from_slice(tail);
        self.commit(seq, reserved, len, trailer);
    }

    /// The memory that will keep frame `seq` of `len` bytes, to write the
    /// frame in place before sending it from there; then [`Self::commit`].
    /// The frame kept in that slot before (`seq` minus the buffer's size) is
    /// forgotten.
    pub fn slot_mut(&mut self, seq: u16, len: usize) -> &mut [u8] {
        let i = self.slot(seq);
        let s = &mut self.slots[i];
        if s.wanted > 0 {
            self.pending -= 1;
        }
        s.valid = false;
        s.wanted = 0;
        if s.data.len() < len {
            s.data.resize(len, 0);
        }
        &mut s.data[..len]
    }

    /// As [`Self::slot_mut`], but hands the slot's memory out (to write the
    /// frame without holding the buffer); give it back with
    /// [`Self::put_slot`] before [`Self::commit`].
    pub fn take_slot(&mut self, seq: u16, len: usize) -> Vec<u8> {
        self.slot_mut(seq, len);
        let i = self.slot(seq);
        std::mem::take(&mut self.slots[i].data)
    }

    /// Gives back the memory of [`Self::take_slot`].
    pub fn put_slot(&mut self, seq: u16, data: Vec<u8>) {
        let i = self.slot(seq);
        self.slots[i].data = data;
    }

    /// Keeps the `len` bytes written through [`Self::slot_mut`] as frame
    /// `seq`, sent with `reserved` and followed on the wire by `trailer` (at
    /// most 4 bytes).
    pub fn commit(&mut self, seq: u16, reserved: u16, len: usize, trailer: &[u8]) {
        let i = self.slot(seq);
        let s = &mut self.slots[i];
        debug_assert!(s.data.len() >= len && !s.valid);
        let tl = trailer.len().min(4);
        s.trailer[..tl].copy_from_slice(&trailer[..tl]);
        s.trailer_len = tl as u8;
        s.seq = seq;
        s.reserved = reserved;
        s.len = len;
        s.valid = true;
        s.nacks = 0;
        s.wanted = 0;
        s.resent_at = None;
        s.budget = RETX_BUDGET * u32::from(s.total()) + RETX_SLACK;
        let words = usize::from(s.total()).div_ceil(64);
        for map in [&mut s.want, &mut s.resent] {
            if map.len() < words {
                map.resize(words, 0);
            }
            map[..words].fill(0);
        }
    }

    /// Forgets every frame (the next node restarted: they were for the old
    /// process).
    pub fn clear(&mut self) {
        for s in &mut self.slots {
            s.valid = false;
            s.wanted = 0;
        }
        self.pending = 0;
    }

    /// Frame `seq`, the `reserved` it was sent with and its trailer, if kept.
    pub fn get(&self, seq: u16) -> Option<(&[u8], u16, &[u8])> {
        let s = &self.slots[self.slot(seq)];
        (s.valid && s.seq == seq).then(|| (&s.data[..s.len], s.reserved, &s.trailer[..usize::from(s.trailer_len)]))
    }

    /// Queues the chunks a NACK for `seq` names (`(first, count)` ranges,
    /// [`NACK_ALL`] for all), clamped to the frame and de-duplicated.
    pub fn request(&mut self, seq: u16, ranges: impl Iterator<Item = (u16, u16)>, now: Instant) -> NackAnswer {
        let i = self.slot(seq);
        let s = &mut self.slots[i];
        if !(s.valid && s.seq == seq) {
            return NackAnswer::Unknown;
        }
        if s.nacks >= NACKS_PER_FRAME || s.budget == 0 {
            return NackAnswer::Refused;
        }
        s.nacks += 1;
        let total = s.total();
        let words = usize::from(total).div_ceil(64);
        let recent = s.resent_at.is_some_and(|t| now.saturating_duration_since(t) < RESEND_HOLDOFF);
        if !recent {
            s.resent[..words].fill(0);
            s.resent_at = None;
        }
        let was_pending = s.wanted > 0;
        let mut queued = 0;
        // At most NACK_MAX_RANGES ranges, each walked over at most `total`
        // ids: bounded by the frame, not by what the ranges claim.
        for (first, count) in ranges.take(NACK_MAX_RANGES) {
            let end = if (first, count) == NACK_ALL { total } else { first.saturating_add(count).min(total) };
            queued += want_range(&mut s.want, &s.resent, first.min(end), end, s.budget - queued);
        }
        s.budget -= queued;
        s.wanted += queued;
        if !was_pending && s.wanted > 0 {
            self.pending += 1;
        }
        NackAnswer::Queued(queued)
    }

    /// Whether chunks wait to be re-sent.
    pub fn has_pending(&self) -> bool {
        self.pending > 0
    }

    /// Takes up to `ids.len()` queued chunks of one frame (oldest slot
    /// first is not guaranteed; every queued chunk is taken eventually):
    /// returns the frame's seq and how many ids were written.
    pub fn next_burst(&mut self, ids: &mut [u16], now: Instant) -> Option<(u16, usize)> {
        if self.pending == 0 {
            return None;
        }
        let s = self.slots.iter_mut().find(|s| s.valid && s.wanted > 0)?;
        let total = s.total();
        let mut n = 0;
        for id in 0..total {
            if n == ids.len() {
                break;
            }
            if bit(&s.want, id) {
                s.want[usize::from(id) / 64] &= !(1 << (id % 64));
                set_bit(&mut s.resent, id);
                ids[n] = id;
                n += 1;
            }
        }
        s.wanted -= n as u32;
        s.resent_at = Some(now);
        if s.wanted == 0 {
            self.pending -= 1;
        }
        Some((s.seq, n))
    }
}

/// Timer settings of loss recovery.
#[derive(Clone, Copy, Debug)]
pub struct Timers {
    /// A frame with holes and no new chunk for this long is NACKed.
    pub nack_delay: Duration,
    /// Longest wait between NACKs of the same frame (doubling from `nack_delay`).
    pub nack_max_interval: Duration,
    /// Give a frame up after NACKing it for this long (the sender lost it too).
    pub give_up: Duration,
    /// The sender re-sends the last chunk of its last frame after this long,
    /// in case the frame's tail (or all of it) was lost.
    pub probe_delay: Duration,
    /// Probes per frame, each after twice the previous wait.
    pub probes: u32,
    /// Best effort: a frame with holes and no new chunk for this long is
    /// given up (chunks of one frame arrive back to back).
    pub best_effort_idle: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            nack_delay: Duration::from_micros(250),
            nack_max_interval: Duration::from_millis(50),
            give_up: Duration::from_secs(2),
            probe_delay: Duration::from_millis(25),
            probes: 6,
            best_effort_idle: Duration::from_millis(5),
        }
    }
}

/// Receiver side: when to NACK the expected frame.
#[derive(Debug, Default)]
pub struct NackTimer {
    seq: Option<u16>,
    progress: (u16, u16),
    last_progress: Option<Instant>,
    first_nack: Option<Instant>,
    next_due: Option<Instant>,
    attempts: u32,
}

/// What the receiver should do about the expected frame now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NackDecision {
    /// Nothing yet; look again at the given time (if any).
    Wait(Option<Instant>),
    /// Send a NACK now.
    Send,
    /// NACKs did not help for too long: give the frame up.
    GiveUp,
}

impl NackTimer {
    /// NACKs sent for the current frame so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Notes the expected frame's progress; returns how long it has made none.
    pub fn track(&mut self, now: Instant, seq: u16, progress: (u16, u16)) -> Duration {
        if self.seq != Some(seq) {
            *self = Self { seq: Some(seq), progress, last_progress: Some(now), ..Self::default() };
        } else if progress != self.progress {
            self.progress = progress;
            self.last_progress = Some(now);
        }
        now.saturating_duration_since(self.last_progress.unwrap_or(now))
    }

    /// Decides, given the expected frame's seq, its `(received, total)`
    /// progress and whether chunks of later frames arrived (the sender has
    /// moved on, so the missing ones are lost, not late).
    pub fn poll(&mut self, now: Instant, t: &Timers, seq: u16, progress: (u16, u16), ahead: bool) -> NackDecision {
        self.track(now, seq, progress);
        let (received, total) = progress;
        let incomplete = total != 0 && received < total;
        if !(incomplete || (total == 0 && ahead)) {
            return NackDecision::Wait(None);
        }
        // Chunks of later frames arriving first do not make the missing ones
        // lost at once: receive queues and batches reorder by tens of
        // microseconds, and a NACK for chunks still on their way costs a
        // burst of useless retransmissions. Only a frame that made no
        // progress for `nack_delay` is NACKed.
        let due = self.next_due.unwrap_or_else(|| self.last_progress.unwrap_or(now) + t.nack_delay);
        if now < due {
            return NackDecision::Wait(Some(due));
        }
        if self.first_nack.is_some_and(|f| now.duration_since(f) >= t.give_up) {
            return NackDecision::GiveUp;
        }
        self.first_nack.get_or_insert(now);
        self.attempts += 1;
        let backoff = t.nack_delay.saturating_mul(1 << self.attempts.min(16)).min(t.nack_max_interval);
        self.next_due = Some(now + backoff);
        NackDecision::Send
    }
}

/// Sender side: when to probe the last frame.
#[derive(Debug, Default)]
pub struct ProbeTimer {
    seq: Option<u16>,
    due: Option<Instant>,
    sent: u32,
}

impl ProbeTimer {
    /// A frame was sent: probe it later unless another frame follows.
    pub fn sent(&mut self, now: Instant, t: &Timers, seq: u16) {
        *self = Self { seq: Some(seq), due: Some(now + t.probe_delay), sent: 0 };
    }

    /// The seq to probe now, if a probe is due; and when to look again.
    pub fn poll(&mut self, now: Instant, t: &Timers) -> (Option<u16>, Option<Instant>) {
        let Some(due) = self.due else { return (None, None) };
        if now < due {
            return (None, Some(due));
        }
        self.sent += 1;
        self.due = (self.sent < t.probes).then(|| now + t.probe_delay.saturating_mul(1 << self.sent.min(16)));
        (self.seq, self.due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nack_round_trips() {
        let mut buf = [0u8; CHUNK_HEADER_LEN + CHUNK_PAYLOAD_MAX];
        let n = encode_nack(77, ranges([1, 2, 3, 7, 9, 10]), &mut buf);
        let (hdr, payload) = ChunkHeader::parse(&buf[..n]).unwrap();
        assert_eq!(hdr.kind(), ChunkKind::Nack);
        assert_eq!(hdr.seq, 77);
        let got: Vec<_> = decode_nack(&hdr, payload).unwrap().collect();
        assert_eq!(got, vec![(1, 3), (7, 1), (9, 2)]);
        assert_eq!(encode_nack(1, std::iter::empty(), &mut buf), 0);
    }

    #[test]
    fn retransmit_buffer_keeps_the_last_frames() {
        let mut b = RetransmitBuffer::new(4);
        for seq in 0..6u16 {
            b.store(seq, 1, &[seq as u8], &[9, 9], &[]);
        }
        assert!(b.get(1).is_none());
        assert_eq!(b.get(5), Some((&[5u8, 9, 9][..], 1, &[][..])));
    }

    fn drain(b: &mut RetransmitBuffer, now: Instant) -> Vec<u16> {
        let mut all = Vec::new();
        let mut ids = [0u16; RETX_BURST];
        while let Some((_, n)) = b.next_burst(&mut ids, now) {
            all.extend_from_slice(&ids[..n]);
        }
        all
    }

    #[test]
    fn a_nack_queues_each_chunk_of_the_frame_at_most_once() {
        let mut b = RetransmitBuffer::new(4);
        let frame = vec![1u8; 16392];
        b.store(3, 0, &frame, &[], &[1, 2, 3, 4]);
        let t0 = Instant::now();
        // 350 "all" ranges, overlapping and out-of-range ones: 12 chunks.
        let ranges = std::iter::repeat_n(NACK_ALL, 300).chain([(5, 100), (60000, 9), (11, u16::MAX)]);
        assert_eq!(b.request(3, ranges, t0), NackAnswer::Queued(12));
        let sent = drain(&mut b, t0);
        assert_eq!(sent, (0..12).collect::<Vec<_>>());
        // Asked again at once: the answer is on its way.
        assert_eq!(b.request(3, [NACK_ALL].into_iter(), t0), NackAnswer::Queued(0));
        // Later: re-sent once more.
        assert_eq!(b.request(3, [(2, 1)].into_iter(), t0 + RESEND_HOLDOFF), NackAnswer::Queued(1));
        assert_eq!(drain(&mut b, t0), vec![2]);
        assert_eq!(b.request(4, [(0, 1)].into_iter(), t0), NackAnswer::Unknown);
        for _ in 0..NACKS_PER_FRAME {
            b.request(3, [(0, 1)].into_iter(), t0);
        }
        assert_eq!(b.request(3, [(0, 1)].into_iter(), t0), NackAnswer::Refused);
    }

    #[test]
    fn a_frame_is_resent_at_most_its_budget_whatever_the_nacks() {
        // A 1 MiB frame (749 chunks) NACKed whole every 600 us (past the
        // hold-off) by whoever sends from the next node's address: at most
        // two copies of it go out over its life, then NACKs are refused.
        let mut b = RetransmitBuffer::new(4);
        let frame = vec![7u8; 1 << 20];
        b.store(9, 0, &frame, &[], &[]);
        let total = leap_common::chunk::chunks_for(frame.len()).unwrap();
        let t0 = Instant::now();
        let (mut sent, mut refused) = (0usize, 0);
        for i in 0..NACKS_PER_FRAME {
            let now = t0 + Duration::from_micros(600) * i;
            match b.request(9, [NACK_ALL].into_iter(), now) {
                NackAnswer::Queued(_) => sent += drain(&mut b, now).len(),
                NackAnswer::Refused => refused += 1,
                NackAnswer::Unknown => unreachable!("the frame is kept"),
            }
        }
        assert_eq!(sent, (RETX_BUDGET * u32::from(total) + RETX_SLACK) as usize);
        assert!(refused >= NACKS_PER_FRAME - RETX_BUDGET - 2, "{refused}");
        // A single chunk asked for after that: refused too.
        assert_eq!(b.request(9, [(3, 1)].into_iter(), t0 + Duration::from_secs(1)), NackAnswer::Refused);
        // The next frame in that slot has a budget of its own.
        b.store(13, 0, &frame[..1400], &[], &[]);
        assert_eq!(b.request(13, [NACK_ALL].into_iter(), t0), NackAnswer::Queued(1));
    }

    #[test]
    fn a_budget_left_over_is_spent_on_the_lowest_chunks_asked_for() {
        let mut b = RetransmitBuffer::new(4);
        let frame = vec![1u8; 1400 * 100];
        b.store(1, 0, &frame, &[], &[]);
        let t0 = Instant::now();
        let later = |k: u32| t0 + RESEND_HOLDOFF * k;
        assert_eq!(b.request(1, [NACK_ALL].into_iter(), t0), NackAnswer::Queued(100));
        drain(&mut b, t0);
        assert_eq!(b.request(1, [NACK_ALL].into_iter(), later(1)), NackAnswer::Queued(100));
        drain(&mut b, later(1));
        let left = RETX_SLACK - 30;
        assert_eq!(b.request(1, [(0, left as u16)].into_iter(), later(2)), NackAnswer::Queued(left));
        drain(&mut b, later(2));
        // 30 left: chunks 10..40 of the 50 asked for.
        assert_eq!(b.request(1, [(10, 50)].into_iter(), later(3)), NackAnswer::Queued(30));
        assert_eq!(drain(&mut b, later(3)), (10..40).collect::<Vec<_>>());
        assert_eq!(b.request(1, [(0, 1)].into_iter(), later(4)), NackAnswer::Refused);
    }

    #[test]
    fn nack_waits_for_idle_then_backs_off_then_gives_up() {
        let t = Timers::default();
        let mut n = NackTimer::default();
        let t0 = Instant::now();
        assert!(matches!(n.poll(t0, &t, 5, (3, 12), false), NackDecision::Wait(Some(_))));
        assert_eq!(n.poll(t0 + t.nack_delay, &t, 5, (3, 12), false), NackDecision::Send);
        assert!(matches!(n.poll(t0 + t.nack_delay, &t, 5, (3, 12), false), NackDecision::Wait(Some(_))));
        // Chunks of a later frame, none of this one: NACK once it stayed so.
        let mut m = NackTimer::default();
        assert!(matches!(m.poll(t0, &t, 6, (0, 0), true), NackDecision::Wait(Some(_))));
        assert_eq!(m.poll(t0 + t.nack_delay, &t, 6, (0, 0), true), NackDecision::Send);
        assert_eq!(n.poll(t0 + t.give_up * 2, &t, 5, (3, 12), false), NackDecision::GiveUp);
        // A complete or untouched frame needs nothing.
        assert_eq!(NackTimer::default().poll(t0, &t, 1, (0, 0), false), NackDecision::Wait(None));
    }

    #[test]
    fn probes_are_bounded() {
        let t = Timers::default();
        let mut p = ProbeTimer::default();
        let t0 = Instant::now();
        p.sent(t0, &t, 9);
        let mut now = t0;
        let mut probes = 0;
        for _ in 0..100 {
            now += Duration::from_secs(1);
            if p.poll(now, &t).0 == Some(9) {
                probes += 1;
            }
        }
        assert_eq!(probes, t.probes);
    }
}
