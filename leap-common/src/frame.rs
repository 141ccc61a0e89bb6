//! The application frame header that precedes the activations.

/// `{ i32 pos; i32 flags }` in host byte order, as the original engine sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FrameHeader {
    /// Token position of this inference step.
    pub pos: i32,
    /// [`FrameHeader::NO_REPLY`] or [`FrameHeader::REPLY`].
    pub flags: i32,
}

const _: () = assert!(core::mem::size_of::<FrameHeader>() == FrameHeader::LEN);

impl FrameHeader {
    /// Size on the wire.
    pub const LEN: usize = 8;
    /// No reply wanted.
    pub const NO_REPLY: i32 = 0;
    /// The tail sends the result back to the head.
    pub const REPLY: i32 = 1;

    /// The 8-byte wire form (host order).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.pos.to_ne_bytes());
        b[4..].copy_from_slice(&self.flags.to_ne_bytes());
        b
    }

    /// Reads the header from the start of a frame, if it is long enough.
    pub fn read(frame: &[u8]) -> Option<Self> {
        let b = frame.get(..Self::LEN)?;
        Some(Self {
            pos: i32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            flags: i32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        })
    }
}

/// Length of a frame carrying `dim` f32 activations.
pub const fn frame_len(dim: usize) -> usize {
    FrameHeader::LEN + dim * 4
}
