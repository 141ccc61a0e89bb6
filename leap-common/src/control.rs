//! In-band control messages (layer re-assignment), compatible with the
//! original: a frame padded with zeros to the frame size whose first two
//! bytes are the u16 0xC0DE (host order), followed by a packed 162-byte
//! message in host byte order.

/// The u16 marker at the start of a control frame (host order).
pub const CONTROL_MARKER: u16 = 0xC0DE;
/// Most workers a RESIZE_CHAIN message can describe.
pub const MAX_WORKERS: usize = 16;
/// Size of the packed message after the marker.
pub const CONTROL_MSG_LEN: usize = 162;
/// Marker + message: the least a control frame can be.
pub const CONTROL_FRAME_MIN: usize = 2 + CONTROL_MSG_LEN;
const RANGE_LEN: usize = 9;

const _: () = assert!(1 + 4 + 4 + 1 + 4 + 4 + MAX_WORKERS * RANGE_LEN == CONTROL_MSG_LEN);

/// The message type byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ControlType {
    /// One worker changes its layers.
    ResizeLayers = 1,
    /// Every worker takes `ranges[worker_index]` and forwards.
    ResizeChain = 2,
    /// The tail's answer to a RESIZE_CHAIN, travelling back to the head.
    Ack = 3,
}

/// Layers assigned to one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LayerRange {
    /// First layer (inclusive).
    pub start_layer: i32,
    /// Last layer (exclusive, as the engine uses it).
    pub end_layer: i32,
    /// This worker is the tail of the ring.
    pub is_tail: bool,
}

/// A decoded control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlMessage {
    /// What to do.
    pub kind: ControlType,
    /// RESIZE_LAYERS: first layer.
    pub split_layer: i32,
    /// RESIZE_LAYERS: end layer.
    pub end_layer: i32,
    /// RESIZE_LAYERS: the receiver becomes the tail.
    pub is_tail: bool,
    /// RESIZE_CHAIN: index of the worker that reads this message.
    pub worker_index: i32,
    /// RESIZE_CHAIN: number of workers in `ranges`.
    pub total_workers: i32,
    /// RESIZE_CHAIN: one range per worker.
    pub ranges: [LayerRange; MAX_WORKERS],
}

/// Why bytes are not a valid control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// Fewer than marker + 162 bytes.
    Short,
    /// The first two bytes are not 0xC0DE.
    NoMarker,
    /// The type byte is not 1, 2 or 3.
    BadType(u8),
    /// A boolean byte other than 0 or 1.
    BadBool,
    /// `total_workers` outside 0..=16 or `worker_index` outside 0..=total.
    BadWorkers,
    /// A range or split with start > end, or a negative layer.
    BadRange,
}

impl ControlMessage {
    /// An empty message of the given type.
    pub const fn new(kind: ControlType) -> Self {
        Self {
            kind,
            split_layer: 0,
            end_layer: 0,
            is_tail: false,
            worker_index: 0,
            total_workers: 0,
            ranges: [LayerRange { start_layer: 0, end_layer: 0, is_tail: false }; MAX_WORKERS],
        }
    }

    /// Whether a frame starts with the control marker. Only a hint: a data
    /// frame may start with the same bytes; see [`Self::decode_frame`].
    pub fn has_marker(frame: &[u8]) -> bool {
        frame.len() >= 2 && u16::from_ne_bytes([frame[0], frame[1]]) == CONTROL_MARKER
    }

    /// Checks the fields for consistency.
    ///
    /// # Errors
    ///
    /// [`ControlError::BadWorkers`] or [`ControlError::BadRange`].
    pub fn validate(&self) -> Result<(), ControlError> {
        if !(0..=MAX_WORKERS as i32).contains(&self.total_workers)
            || !(0..=self.total_workers).contains(&self.worker_index)
        {
            return Err(ControlError::BadWorkers);
        }
        if self.split_layer < 0 || self.end_layer < self.split_layer {
            return Err(ControlError::BadRange);
        }
        for r in &self.ranges[..self.total_workers as usize] {
            if r.start_layer < 0 || r.end_layer < r.start_layer {
                return Err(ControlError::BadRange);
            }
        }
        Ok(())
    }

    /// Writes marker + message into `out[..164]`; the caller pads the rest
    /// of the frame with zeros.
    ///
    /// # Errors
    ///
    /// [`ControlError::Short`] if `out` is too small, or a validation error.
    pub fn encode(&self, out: &mut [u8]) -> Result<(), ControlError> {
        self.validate()?;
        let out = out.get_mut(..CONTROL_FRAME_MIN).ok_or(ControlError::Short)?;
        let mut w = Writer { buf: out, at: 0 };
        w.put(&CONTROL_MARKER.to_ne_bytes());
        w.put(&[self.kind as u8]);
        w.put(&self.split_layer.to_ne_bytes());
        w.put(&self.end_layer.to_ne_bytes());
        w.put(&[u8::from(self.is_tail)]);
        w.put(&self.worker_index.to_ne_bytes());
        w.put(&self.total_workers.to_ne_bytes());
        for r in &self.ranges {
            w.put(&r.start_layer.to_ne_bytes());
            w.put(&r.end_layer.to_ne_bytes());
            w.put(&[u8::from(r.is_tail)]);
        }
        debug_assert_eq!(w.at, CONTROL_FRAME_MIN);
        Ok(())
    }

    /// Decodes marker + message from the start of a frame.
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`ControlError`].
    pub fn decode(frame: &[u8]) -> Result<Self, ControlError> {
        if frame.len() < CONTROL_FRAME_MIN {
            return Err(ControlError::Short);
        }
        if !Self::has_marker(frame) {
            return Err(ControlError::NoMarker);
        }
        let mut r = Reader { buf: frame, at: 2 };
        let kind = match r.u8() {
            1 => ControlType::ResizeLayers,
            2 => ControlType::ResizeChain,
            3 => ControlType::Ack,
            t => return Err(ControlError::BadType(t)),
        };
        let mut msg = Self::new(kind);
        msg.split_layer = r.i32();
        msg.end_layer = r.i32();
        msg.is_tail = r.bool()?;
        msg.worker_index = r.i32();
        msg.total_workers = r.i32();
        for range in &mut msg.ranges {
            range.start_layer = r.i32();
            range.end_layer = r.i32();
            range.is_tail = r.bool()?;
        }
        msg.validate()?;
        Ok(msg)
    }

    /// Decodes a whole control frame from a peer that cannot mark control
    /// frames out of band (the original, or TCP without framing): the
    /// message must be valid *and* the padding after it all zeros, so that a
    /// data frame whose `pos` happens to have 0xC0DE in its low bytes is not
    /// taken for control unless its activations are all zero too.
    ///
    /// # Errors
    ///
    /// As [`Self::decode`]; [`ControlError::NoMarker`] for non-zero padding.
    pub fn decode_frame(frame: &[u8]) -> Result<Self, ControlError> {
        let msg = Self::decode(frame)?;
        if frame[CONTROL_FRAME_MIN..].iter().any(|&b| b != 0) {
            return Err(ControlError::NoMarker);
        }
        Ok(msg)
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u8(&mut self) -> u8 {
        self.at += 1;
        self.buf[self.at - 1]
    }
    fn bool(&mut self) -> Result<bool, ControlError> {
        match self.u8() {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ControlError::BadBool),
        }
    }
    fn i32(&mut self) -> i32 {
        let b = &self.buf[self.at..self.at + 4];
        self.at += 4;
        i32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain() -> ControlMessage {
        let mut m = ControlMessage::new(ControlType::ResizeChain);
        m.total_workers = 2;
        m.ranges[0] = LayerRange { start_layer: 0, end_layer: 16, is_tail: false };
        m.ranges[1] = LayerRange { start_layer: 16, end_layer: 32, is_tail: true };
        m
    }

    #[test]
    fn control_round_trips_with_the_original_layout() {
        let mut f = [0u8; 16392];
        chain().encode(&mut f).unwrap();
        assert_eq!(u16::from_ne_bytes([f[0], f[1]]), 0xC0DE);
        assert_eq!(f[2], 2);
        // ranges[1].is_tail sits at 2 + 18 + 9 + 8.
        assert_eq!(f[2 + 18 + 9 + 8], 1);
        assert_eq!(ControlMessage::decode_frame(&f).unwrap(), chain());
    }

    #[test]
    fn invalid_control_is_rejected() {
        let mut f = [0u8; 200];
        chain().encode(&mut f).unwrap();
        let mut bad = f;
        bad[2] = 9;
        assert_eq!(ControlMessage::decode(&bad), Err(ControlError::BadType(9)));
        let mut bad = f;
        bad[11] = 7;
        assert_eq!(ControlMessage::decode(&bad), Err(ControlError::BadBool));
        let mut bad = f;
        bad[16..20].copy_from_slice(&40i32.to_ne_bytes());
        assert_eq!(ControlMessage::decode(&bad), Err(ControlError::BadWorkers));
        assert_eq!(ControlMessage::decode(&f[..100]), Err(ControlError::Short));
    }

    #[test]
    fn data_frame_with_marker_in_pos_is_not_control() {
        let mut f = [0u8; 200];
        f[..4].copy_from_slice(&0x0001_C0DEi32.to_ne_bytes());
        f[190] = 0x3f;
        assert!(ControlMessage::has_marker(&f));
        assert!(ControlMessage::decode_frame(&f).is_err());
    }
}
