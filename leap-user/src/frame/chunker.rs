//! Splits a frame given as several parts (header, payload, and the CRC
//! trailer of a leap frame) into LEAP chunks without copying: each chunk is
//! its 12-byte header followed by up to three borrowed slices of the parts.

use leap_common::chunk::{CHUNK_HEADER_LEN, ChunkHeader, FRAME_LEN_MAX, chunks_for_stride, frame_bytes_per_chunk};

/// One chunk of a frame: its header and up to three payload slices (a chunk
/// spans several parts when they are shorter than a chunk).
#[derive(Debug, Clone, Copy)]
pub struct ChunkRef<'a> {
    /// The header to put in front.
    pub header: ChunkHeader,
    /// Payload pieces, in order; any may be empty.
    pub pieces: [&'a [u8]; 3],
}

impl ChunkRef<'_> {
    /// Payload bytes of this chunk.
    pub fn payload_len(&self) -> usize {
        self.pieces.iter().map(|p| p.len()).sum()
    }

    /// Appends the payload to `out`.
    pub fn extend_payload(&self, out: &mut Vec<u8>) {
        for p in self.pieces {
            out.extend_from_slice(p);
        }
    }

    /// Datagram length (header + payload).
    pub fn datagram_len(&self) -> usize {
        CHUNK_HEADER_LEN + self.payload_len()
    }

    /// Writes the datagram (header, then payload) at the start of `buf`;
    /// returns its length.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`Self::datagram_len`].
    pub fn write(&self, buf: &mut [u8]) -> usize {
        self.header.write(buf);
        let mut at = CHUNK_HEADER_LEN;
        for p in self.pieces {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        at
    }
}

/// Iterator over the chunks of a frame made of `head` then `tail` (then a
/// trailer).
#[derive(Debug, Clone)]
pub struct Chunker<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    trailer: &'a [u8],
    seq: u16,
    reserved: u16,
    next: u16,
    total: u16,
    /// Bytes of the stream per chunk (fewer in a keyed ring's chunks, whose
    /// trailer is added when they are sealed).
    stride: usize,
}

impl<'a> Chunker<'a> {
    /// Chunks of the frame `head ++ tail` with sequence number `seq`; every
    /// header carries `reserved` (leap flags, or 0 to look like the original).
    /// `None` if the frame is empty or too long for the format.
    pub fn new(seq: u16, reserved: u16, head: &'a [u8], tail: &'a [u8]) -> Option<Self> {
        Self::with_trailer(seq, reserved, head, tail, &[])
    }

    /// As [`Self::new`], with `trailer` (the CRC of a frame sent with
    /// [`leap_common::chunk::flags::CRC`]) after the frame. `None` also if the
    /// frame itself is empty. With [`leap_common::chunk::flags::AUTH`] in
    /// `reserved`, each chunk carries
    /// [`leap_common::chunk::KEYED_PAYLOAD_MAX`] bytes (room for the
    /// trailer its sealing appends).
    pub fn with_trailer(seq: u16, reserved: u16, head: &'a [u8], tail: &'a [u8], trailer: &'a [u8]) -> Option<Self> {
        let frame = head.len() + tail.len();
        let len = frame + trailer.len();
        if frame == 0 || len > FRAME_LEN_MAX {
            return None;
        }
        let stride = frame_bytes_per_chunk(reserved);
        let total = chunks_for_stride(len, stride)?;
        Some(Self { head, tail, trailer, seq, reserved, next: 0, total, stride })
    }

    /// Number of chunks of the frame.
    pub fn total(&self) -> u16 {
        self.total
    }

    /// The chunk with index `id` (for retransmission), if it exists.
    pub fn chunk(&self, id: u16) -> Option<ChunkRef<'a>> {
        if id >= self.total {
            return None;
        }
        let start = usize::from(id) * self.stride;
        let end = (start + self.stride).min(self.head.len() + self.tail.len() + self.trailer.len());
        // The part [from, from + len) of the stream, clipped to this chunk.
        let piece = |part: &'a [u8], from: usize| -> &'a [u8] {
            let lo = start.clamp(from, from + part.len()) - from;
            let hi = end.clamp(from, from + part.len()) - from;
            &part[lo..hi]
        };
        let (hl, tl) = (self.head.len(), self.tail.len());
        let pieces = [piece(self.head, 0), piece(self.tail, hl), piece(self.trailer, hl + tl)];
        let header = ChunkHeader { seq: self.seq, chunk_id: id, total_chunks: self.total, reserved: self.reserved };
        Some(ChunkRef { header, pieces })
    }
}

impl<'a> Iterator for Chunker<'a> {
    type Item = ChunkRef<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let c = self.chunk(self.next)?;
        self.next += 1;
        Some(c)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::from(self.total - self.next);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Chunker<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_both_parts_in_order() {
        let head = [1u8; 8];
        let tail: Vec<u8> = (0..16384u32).map(|i| i as u8).collect();
        let mut whole = head.to_vec();
        whole.extend_from_slice(&tail);
        let chunks: Vec<_> = Chunker::new(5, 0, &head, &tail).unwrap().collect();
        assert_eq!(chunks.len(), 12);
        let mut joined = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.header.chunk_id as usize, i);
            assert_eq!(c.header.total_chunks, 12);
            assert_eq!(c.header.seq, 5);
            if i < 11 {
                assert_eq!(c.payload_len(), 1400);
            }
            c.extend_payload(&mut joined);
        }
        assert_eq!(joined, whole);
        assert_eq!(chunks[11].payload_len(), 16392 - 11 * 1400);
    }

    #[test]
    fn empty_and_oversized_frames_have_no_chunks() {
        assert!(Chunker::new(0, 0, &[], &[]).is_none());
        assert!(Chunker::with_trailer(0, 0, &[], &[], &[1, 2, 3, 4]).is_none());
    }

    #[test]
    fn trailer_follows_the_frame_across_a_chunk_boundary() {
        // 1398 frame bytes + 4: the trailer straddles chunks 0 and 1.
        let tail = vec![7u8; 1390];
        let c: Vec<_> = Chunker::with_trailer(1, 0, &[1u8; 8], &tail, &[0xA, 0xB, 0xC, 0xD]).unwrap().collect();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].payload_len(), 1400);
        assert_eq!(c[0].pieces[2], &[0xA, 0xB]);
        assert_eq!(c[1].pieces, [&[][..], &[][..], &[0xC, 0xD][..]]);
    }
}
