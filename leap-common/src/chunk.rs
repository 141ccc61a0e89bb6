//! The LEAP chunk: 12-byte big-endian header + at most 1400 payload bytes,
//! byte-compatible with the original UDP transport and kernel module.

/// "LEAP" in ASCII, big-endian on the wire.
pub const LEAP_MAGIC: u32 = 0x4C45_4150;
/// Size of [`ChunkHeader`] on the wire.
pub const CHUNK_HEADER_LEN: usize = 12;
/// Largest payload of one chunk; every chunk but the last of a frame is full.
pub const CHUNK_PAYLOAD_MAX: usize = 1400;
/// Largest datagram leap sends or accepts.
pub const CHUNK_DATAGRAM_MAX: usize = CHUNK_HEADER_LEN + CHUNK_PAYLOAD_MAX;

/// Bits of the header's `reserved` field. The original always sends 0, so a
/// chunk with [`flags::LEAP`] clear is from an original peer and the other
/// bits are ignored.
pub mod flags {
    /// The sender is a leap node: the other bits are meaningful.
    pub const LEAP: u16 = 0x8000;
    /// The sender keeps its recent frames and answers NACKs.
    pub const RELIABLE: u16 = 0x4000;
    /// This chunk is a retransmission answering a NACK.
    pub const RETRANSMIT: u16 = 0x2000;
    /// The frame is followed by its CRC32C ([`super::CRC_TRAILER_LEN`]
    /// bytes, little-endian) on the wire: the chunks carry `frame ++ crc`.
    pub const CRC: u16 = 0x1000;
    /// The chunk ends with a ring-key trailer ([`super::AUTH_TRAILER_LEN`]
    /// bytes inside its payload): a keyed ring's chunk carries at most
    /// [`super::KEYED_PAYLOAD_MAX`] bytes of the frame, and the frame no
    /// CRC (the tag replaces it).
    pub const AUTH: u16 = 0x0800;
    /// Mask of the packet kind (see [`super::ChunkKind`]).
    pub const KIND_MASK: u16 = 0x000F;
}

/// What a chunk carries, from the `reserved` field of a leap sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ChunkKind {
    /// Part of a data frame (also every chunk of an original peer).
    Data = 0,
    /// Part of a control frame (0xC0DE marker + [`crate::control::ControlMessage`]).
    Control = 1,
    /// A request for missing chunks, sent back to the previous node.
    Nack = 2,
}

/// The decoded chunk header (host-order fields).
///
/// The wire form is 12 bytes, big-endian: magic, seq_id, chunk_id,
/// total_chunks, reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ChunkHeader {
    /// Frame number, per sender, wrapping at 65536.
    pub seq: u16,
    /// Index of this chunk in the frame, `< total_chunks`.
    pub chunk_id: u16,
    /// Number of chunks in the frame, `ceil(frame_len / 1400)`.
    pub total_chunks: u16,
    /// The `reserved` field: 0 from the original, [`flags`] from leap.
    pub reserved: u16,
}

/// Why a datagram is not a valid LEAP chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkError {
    /// Shorter than the 12-byte header.
    Short,
    /// The first four bytes are not "LEAP".
    BadMagic,
    /// `total_chunks` is 0.
    ZeroTotal,
    /// `chunk_id >= total_chunks`.
    BadChunkId,
    /// More than 1400 payload bytes.
    Oversize,
    /// A chunk that is not the last of its frame must carry exactly 1400
    /// bytes; the last carries at least one.
    BadLength,
}

impl ChunkHeader {
    /// Header of a data chunk sent by leap (no reliability).
    pub const fn data(seq: u16, chunk_id: u16, total_chunks: u16) -> Self {
        Self { seq, chunk_id, total_chunks, reserved: flags::LEAP }
    }

    /// The kind of the chunk. Chunks of original peers are always data.
    pub const fn kind(&self) -> ChunkKind {
        if self.reserved & flags::LEAP == 0 {
            return ChunkKind::Data;
        }
        match self.reserved & flags::KIND_MASK {
            1 => ChunkKind::Control,
            2 => ChunkKind::Nack,
            _ => ChunkKind::Data,
        }
    }

    /// Whether the sender is a leap node (as opposed to the original).
    pub const fn from_leap(&self) -> bool {
        self.reserved & flags::LEAP != 0
    }

    /// Whether the given flag bit is set by a leap sender.
    pub const fn has(&self, flag: u16) -> bool {
        self.from_leap() && self.reserved & flag == flag
    }

    /// Writes the 12-byte wire form into `out[..12]`.
    ///
    /// # Panics
    ///
    /// If `out` is shorter than [`CHUNK_HEADER_LEN`].
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&LEAP_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.seq.to_be_bytes());
        out[6..8].copy_from_slice(&self.chunk_id.to_be_bytes());
        out[8..10].copy_from_slice(&self.total_chunks.to_be_bytes());
        out[10..12].copy_from_slice(&self.reserved.to_be_bytes());
    }

    /// The wire form as an array.
    #[inline]
    pub fn to_bytes(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        self.write(&mut b);
        b
    }

    /// Parses the header only: magic, `total_chunks != 0`,
    /// `chunk_id < total_chunks`, payload length <= 1400.
    ///
    /// # Errors
    ///
    /// The first rule the datagram breaks, as a [`ChunkError`].
    #[inline]
    pub fn parse(datagram: &[u8]) -> Result<(Self, &[u8]), ChunkError> {
        if datagram.len() < CHUNK_HEADER_LEN {
            return Err(ChunkError::Short);
        }
        let be16 = |i: usize| u16::from_be_bytes([datagram[i], datagram[i + 1]]);
        let magic = u32::from_be_bytes([datagram[0], datagram[1], datagram[2], datagram[3]]);
        if magic != LEAP_MAGIC {
            return Err(ChunkError::BadMagic);
        }
        let hdr = Self { seq: be16(4), chunk_id: be16(6), total_chunks: be16(8), reserved: be16(10) };
        let payload = &datagram[CHUNK_HEADER_LEN..];
        if hdr.total_chunks == 0 {
            return Err(ChunkError::ZeroTotal);
        }
        if hdr.chunk_id >= hdr.total_chunks {
            return Err(ChunkError::BadChunkId);
        }
        if payload.len() > CHUNK_PAYLOAD_MAX {
            return Err(ChunkError::Oversize);
        }
        Ok((hdr, payload))
    }

    /// [`Self::parse`] plus the data-chunk length rule: every chunk but the
    /// last carries exactly 1400 bytes, the last at least one.
    ///
    /// # Errors
    ///
    /// As [`Self::parse`], and [`ChunkError::BadLength`].
    #[inline]
    pub fn parse_data(datagram: &[u8]) -> Result<(Self, &[u8]), ChunkError> {
        let (hdr, payload) = Self::parse(datagram)?;
        let last = hdr.chunk_id + 1 == hdr.total_chunks;
        let ok = if last { !payload.is_empty() } else { payload.len() == CHUNK_PAYLOAD_MAX };
        if !ok {
            return Err(ChunkError::BadLength);
        }
        Ok((hdr, payload))
    }
}

/// Bytes of a keyed ring's trailer at the end of every datagram (chunk,
/// hello, NACK): epoch (8), packet number (8), AES-GCM tag (16).
pub const AUTH_TRAILER_LEN: usize = 32;
/// Bytes of a frame one keyed chunk ([`flags::AUTH`]) carries: a full keyed
/// chunk is still [`CHUNK_DATAGRAM_MAX`] bytes on the wire, its trailer
/// inside the 1400-byte payload, so trains keep their stride.
pub const KEYED_PAYLOAD_MAX: usize = CHUNK_PAYLOAD_MAX - AUTH_TRAILER_LEN;

/// Bytes of a frame every chunk but the last carries, for chunks sent with
/// `reserved`: [`KEYED_PAYLOAD_MAX`] with [`flags::AUTH`] from a leap
/// sender, else [`CHUNK_PAYLOAD_MAX`].
pub const fn frame_bytes_per_chunk(reserved: u16) -> usize {
    if reserved & flags::LEAP != 0 && reserved & flags::AUTH != 0 { KEYED_PAYLOAD_MAX } else { CHUNK_PAYLOAD_MAX }
}

/// As [`chunks_for`], with `per_chunk` bytes per chunk
/// ([`frame_bytes_per_chunk`]).
pub const fn chunks_for_stride(len: usize, per_chunk: usize) -> Option<u16> {
    if len == 0 || per_chunk == 0 {
        return None;
    }
    let n = len.div_ceil(per_chunk);
    if n > u16::MAX as usize { None } else { Some(n as u16) }
}

/// Number of chunks a frame of `len` bytes needs (`ceil(len / 1400)`), or
/// `None` when that does not fit the u16 `total_chunks` field or `len` is 0.
pub const fn chunks_for(len: usize) -> Option<u16> {
    if len == 0 {
        return None;
    }
    let n = len.div_ceil(CHUNK_PAYLOAD_MAX);
    if n > u16::MAX as usize { None } else { Some(n as u16) }
}

/// Largest frame the chunk format can describe (65535 full chunks).
pub const FRAME_LEN_MAX: usize = u16::MAX as usize * CHUNK_PAYLOAD_MAX;

/// Most chunks one datagram carries as a train (see [`train`]). Six full
/// chunks (8 472 bytes) fit the UDP payload of a 9 000-byte MTU; the bound
/// also bounds the XDP program's walk over a train.
pub const TRAIN_CHUNKS_MAX: usize = 6;
/// Largest train: [`TRAIN_CHUNKS_MAX`] full chunks.
pub const TRAIN_DATAGRAM_MAX: usize = TRAIN_CHUNKS_MAX * CHUNK_DATAGRAM_MAX;

/// Chunks per train that fit `udp_payload` bytes: 1..=[`TRAIN_CHUNKS_MAX`].
pub const fn train_chunks_for(udp_payload: usize) -> usize {
    let n = udp_payload / CHUNK_DATAGRAM_MAX;
    if n == 0 {
        1
    } else if n > TRAIN_CHUNKS_MAX {
        TRAIN_CHUNKS_MAX
    } else {
        n
    }
}

/// The chunks of one datagram.
///
/// Between leap nodes that agreed on it (see `hello::caps::TRAINS`), one
/// datagram may carry several chunks back to back, each with its own
/// 12-byte header: a *train*. Every chunk but the last of a train is full
/// ([`CHUNK_DATAGRAM_MAX`] bytes), so the train splits without a length
/// field; the last takes the rest. A datagram of at most
/// [`CHUNK_DATAGRAM_MAX`] bytes (everything the original sends) is one
/// chunk. A longer one is a train only when every piece after the first
/// starts with the LEAP magic and the last holds at least a header: one
/// chunk with more than 1400 bytes behind its header is an oversize chunk,
/// as the original, the kernel module and the XDP program see it, and none
/// of it is taken. Each piece must still be parsed and validated on its
/// own.
///
/// # Errors
///
/// [`ChunkError::Oversize`] for a datagram longer than
/// [`TRAIN_DATAGRAM_MAX`], or longer than a chunk and not a train.
pub fn train(datagram: &[u8]) -> Result<Train<'_>, ChunkError> {
    if datagram.len() > TRAIN_DATAGRAM_MAX {
        return Err(ChunkError::Oversize);
    }
    if datagram.len() > CHUNK_DATAGRAM_MAX {
        let tail = datagram.len() % CHUNK_DATAGRAM_MAX;
        let magic = LEAP_MAGIC.to_be_bytes();
        let later = datagram[CHUNK_DATAGRAM_MAX..].chunks(CHUNK_DATAGRAM_MAX);
        if (tail != 0 && tail < CHUNK_HEADER_LEN) || later.into_iter().any(|p| !p.starts_with(&magic)) {
            return Err(ChunkError::Oversize);
        }
    }
    Ok(Train { rest: datagram, first: true })
}

/// Iterator over the chunks of a datagram, from [`train`].
#[derive(Clone, Debug)]
pub struct Train<'a> {
    rest: &'a [u8],
    first: bool,
}

impl<'a> Iterator for Train<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        // An empty datagram is still one (malformed) chunk.
        if self.rest.is_empty() && !self.first {
            return None;
        }
        self.first = false;
        let n = self.rest.len().min(CHUNK_DATAGRAM_MAX);
        let (piece, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(piece)
    }
}

/// Bytes of the CRC32C trailer a leap sender appends to a frame sent with
/// [`flags::CRC`].
pub const CRC_TRAILER_LEN: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_in_big_endian() {
        let h = ChunkHeader { seq: 0x0102, chunk_id: 3, total_chunks: 12, reserved: 0 };
        let b = h.to_bytes();
        assert_eq!(b, [0x4C, 0x45, 0x41, 0x50, 1, 2, 0, 3, 0, 12, 0, 0]);
        assert_eq!(ChunkHeader::parse(&b).unwrap().0, h);
    }

    #[test]
    fn malformed_headers_are_rejected() {
        let mut b = ChunkHeader::data(1, 0, 2).to_bytes();
        assert_eq!(ChunkHeader::parse(&b[..11]), Err(ChunkError::Short));
        b[0] = b'X';
        assert_eq!(ChunkHeader::parse(&b), Err(ChunkError::BadMagic));
        let b = ChunkHeader::data(1, 2, 2).to_bytes();
        assert_eq!(ChunkHeader::parse(&b), Err(ChunkError::BadChunkId));
        let b = ChunkHeader::data(1, 0, 0).to_bytes();
        assert_eq!(ChunkHeader::parse(&b), Err(ChunkError::ZeroTotal));
        let mut big = [0u8; CHUNK_DATAGRAM_MAX + 1];
        ChunkHeader::data(1, 0, 2).write(&mut big);
        assert_eq!(ChunkHeader::parse(&big), Err(ChunkError::Oversize));
    }

    #[test]
    fn data_chunks_must_be_full_except_the_last() {
        let mut d = [0u8; 100];
        ChunkHeader::data(1, 0, 2).write(&mut d);
        assert_eq!(ChunkHeader::parse_data(&d), Err(ChunkError::BadLength));
        ChunkHeader::data(1, 1, 2).write(&mut d);
        assert!(ChunkHeader::parse_data(&d).is_ok());
        assert_eq!(ChunkHeader::parse_data(&d[..12]), Err(ChunkError::BadLength));
    }

    #[test]
    fn original_chunks_are_data_whatever_the_low_bits() {
        let h = ChunkHeader { seq: 0, chunk_id: 0, total_chunks: 1, reserved: 1 };
        assert_eq!(h.kind(), ChunkKind::Data);
        let h = ChunkHeader { reserved: flags::LEAP | 1, ..h };
        assert_eq!(h.kind(), ChunkKind::Control);
    }

    /// `n` bytes of pieces that each start with a chunk header.
    fn train_of(n: usize) -> [u8; TRAIN_DATAGRAM_MAX + 1] {
        let mut d = [0u8; TRAIN_DATAGRAM_MAX + 1];
        let mut at = 0;
        while at < n && at + CHUNK_HEADER_LEN <= d.len() {
            ChunkHeader::data(1, 0, 2).write(&mut d[at..]);
            at += CHUNK_DATAGRAM_MAX;
        }
        d
    }

    #[test]
    fn only_pieces_that_are_all_chunks_make_a_train() {
        let mut d = train_of(3 * CHUNK_DATAGRAM_MAX);
        assert!(train(&d[..3 * CHUNK_DATAGRAM_MAX]).is_ok());
        assert!(train(&d[..CHUNK_DATAGRAM_MAX + 200]).is_ok());
        // A later piece without the magic: one oversize chunk, not a train.
        d[CHUNK_DATAGRAM_MAX] ^= 1;
        assert_eq!(train(&d[..3 * CHUNK_DATAGRAM_MAX]).err(), Some(ChunkError::Oversize));
        let d = train_of(3 * CHUNK_DATAGRAM_MAX);
        assert_eq!(train(&d[..2 * CHUNK_DATAGRAM_MAX + 11]).err(), Some(ChunkError::Oversize));
        assert!(train(&d[..2 * CHUNK_DATAGRAM_MAX + 12]).is_ok());
        // One chunk with 1401..3000 bytes behind its header, as the flood
        // and the original's oversize chunks look.
        let mut one = [0u8; CHUNK_DATAGRAM_MAX + 100];
        ChunkHeader::data(1, 0, 4).write(&mut one);
        assert_eq!(train(&one).err(), Some(ChunkError::Oversize));
    }

    #[test]
    fn trains_split_into_full_chunks_and_a_last_one() {
        let d = train_of(2 * CHUNK_DATAGRAM_MAX + 100);
        let mut t = train(&d[..2 * CHUNK_DATAGRAM_MAX + 100]).unwrap().map(<[u8]>::len);
        assert_eq!(
            [t.next(), t.next(), t.next(), t.next()],
            [Some(CHUNK_DATAGRAM_MAX), Some(CHUNK_DATAGRAM_MAX), Some(100), None]
        );
        let d = train_of(2 * CHUNK_DATAGRAM_MAX);
        assert_eq!(train(&d[..2 * CHUNK_DATAGRAM_MAX]).unwrap().count(), 2);
        // What the original sends is one chunk, however short.
        let mut t = train(&d[..5]).unwrap().map(<[u8]>::len);
        assert_eq!([t.next(), t.next()], [Some(5), None]);
        let mut t = train(&[]).unwrap().map(<[u8]>::len);
        assert_eq!([t.next(), t.next()], [Some(0), None]);
        let big = train_of(TRAIN_DATAGRAM_MAX + 1);
        assert_eq!(train(&big).err(), Some(ChunkError::Oversize));
        assert_eq!(train(&big[..TRAIN_DATAGRAM_MAX]).unwrap().count(), TRAIN_CHUNKS_MAX);
    }

    #[test]
    fn train_size_follows_the_mtu() {
        assert_eq!(train_chunks_for(1472), 1);
        assert_eq!(train_chunks_for(0), 1);
        assert_eq!(train_chunks_for(9000 - 28), 6);
        assert_eq!(train_chunks_for(65507), TRAIN_CHUNKS_MAX);
        assert_eq!(train_chunks_for(4096 - 256 - 42), 2);
    }

    #[test]
    fn chunk_count_matches_the_original() {
        assert_eq!(chunks_for(16392), Some(12));
        assert_eq!(chunks_for(1400), Some(1));
        assert_eq!(chunks_for(1401), Some(2));
        assert_eq!(chunks_for(0), None);
        assert_eq!(chunks_for_stride(16392, KEYED_PAYLOAD_MAX), Some(12));
        assert_eq!(chunks_for_stride(1368 * 12 + 1, KEYED_PAYLOAD_MAX), Some(13));
        assert_eq!(frame_bytes_per_chunk(flags::LEAP | flags::AUTH), 1368);
        assert_eq!(frame_bytes_per_chunk(flags::AUTH), 1400, "the original's chunks have no flags");
        assert_eq!(chunks_for(FRAME_LEN_MAX), Some(u16::MAX));
        assert_eq!(chunks_for(FRAME_LEN_MAX + 1), None);
    }
}
