//! The hello datagram: how two leap nodes prove to each other that they are
//! leap nodes before either uses anything beyond the original chunk format.
//!
//! The original UDP transport sends every chunk with the `reserved` field of
//! the last datagram it received, so flags in `reserved` prove nothing. A
//! hello cannot be produced by echoing: it does not start with the LEAP magic
//! (the original and the kernel module ignore it), and a node counts a
//! neighbour as leap only when that neighbour's address answers with the
//! random nonce this node sent it. Bytes 10 and 11 (where the original would
//! pick up a `reserved` value) are always zero.
//!
//! Wire form, 40 bytes, big-endian:
//!
//! | offset | field | meaning |
//! |---|---|---|
//! | 0 | magic `"LPHI"` | not a chunk |
//! | 4 | version (1), flags (0) | |
//! | 6 | 6 zero bytes | |
//! | 12 | echo: u64 | the nonce of the hello this answers, 0 if none |
//! | 20 | nonce: u64 | a challenge the receiver should echo, 0 if none |
//! | 28 | epoch: u64 | random per process: a new one means a restart |
//! | 36 | caps: u32 | [`caps`] of the sender; bits 16..32: the largest train it takes |

/// "LPHI" in ASCII, big-endian on the wire.
pub const HELLO_MAGIC: u32 = 0x4C50_4849;
/// The only version so far.
pub const HELLO_VERSION: u8 = 1;
/// Size of [`Hello`] on the wire.
pub const HELLO_LEN: usize = 40;

/// What a leap node can do, announced in its hellos.
pub mod caps {
    /// Keeps its recent frames and answers NACKs.
    pub const RELIABLE: u32 = 1;
    /// Checks a CRC32C trailer on received frames ([`crate::chunk::flags::CRC`]).
    pub const CRC: u32 = 2;
    /// Takes chunk trains ([`crate::chunk::train`]) of up to
    /// [`train_bytes`] bytes of UDP payload, a number carried in the top 16
    /// bits of the caps.
    pub const TRAINS: u32 = 4;
    /// Where the largest train a node takes sits in its caps.
    const TRAIN_BYTES_SHIFT: u32 = 16;

    /// `caps` announcing trains of up to `bytes` (at most 65 535) of UDP
    /// payload; 0 bytes, or fewer than two chunks, announce no trains.
    pub const fn with_train_bytes(caps: u32, bytes: usize) -> u32 {
        let caps = caps & !TRAINS & 0xFFFF;
        if bytes < 2 * crate::chunk::CHUNK_DATAGRAM_MAX {
            return caps;
        }
        let bytes = if bytes > 0xFFFF { 0xFFFF } else { bytes as u32 };
        caps | TRAINS | bytes << TRAIN_BYTES_SHIFT
    }

    /// The largest train a node with `caps` takes, in bytes of UDP payload;
    /// 0 when it takes none (one chunk per datagram).
    pub const fn train_bytes(caps: u32) -> usize {
        if caps & TRAINS == 0 { 0 } else { (caps >> TRAIN_BYTES_SHIFT) as usize }
    }
}

/// A decoded hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Hello {
    /// The nonce of the hello this one answers (0: none).
    pub echo: u64,
    /// A challenge to echo back (0: none).
    pub nonce: u64,
    /// The sender's process epoch.
    pub epoch: u64,
    /// The sender's [`caps`].
    pub caps: u32,
}

/// Why a datagram is not a hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelloError {
    /// Not [`HELLO_LEN`] bytes.
    Length,
    /// Not "LPHI".
    BadMagic,
    /// A version or flags this node does not know, or non-zero padding.
    Unknown,
}

impl Hello {
    /// Whether a datagram starts like a hello (it may still be malformed).
    pub fn is_hello(datagram: &[u8]) -> bool {
        datagram.len() >= 4 && u32::from_be_bytes([datagram[0], datagram[1], datagram[2], datagram[3]]) == HELLO_MAGIC
    }

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_be_bytes());
        b[4] = HELLO_VERSION;
        b[12..20].copy_from_slice(&self.echo.to_be_bytes());
        b[20..28].copy_from_slice(&self.nonce.to_be_bytes());
        b[28..36].copy_from_slice(&self.epoch.to_be_bytes());
        b[36..40].copy_from_slice(&self.caps.to_be_bytes());
        b
    }

    /// Parses a hello.
    ///
    /// # Errors
    ///
    /// The first rule the datagram breaks.
    pub fn parse(d: &[u8]) -> Result<Self, HelloError> {
        if d.len() != HELLO_LEN {
            return Err(HelloError::Length);
        }
        if !Self::is_hello(d) {
            return Err(HelloError::BadMagic);
        }
        if d[4] != HELLO_VERSION || d[5..12].iter().any(|&b| b != 0) {
            return Err(HelloError::Unknown);
        }
        let be64 = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&d[i..i + 8]);
            u64::from_be_bytes(w)
        };
        Ok(Self {
            echo: be64(12),
            nonce: be64(20),
            epoch: be64(28),
            caps: u32::from_be_bytes([d[36], d[37], d[38], d[39]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_never_looks_like_a_chunk() {
        let h = Hello { echo: 1, nonce: u64::MAX, epoch: 0x0102_0304_0506_0708, caps: caps::RELIABLE | caps::CRC };
        let b = h.to_bytes();
        assert_eq!(Hello::parse(&b), Ok(h));
        assert_ne!(&b[..4], &crate::chunk::LEAP_MAGIC.to_be_bytes());
        // Where the original picks up `reserved` from its last datagram.
        assert_eq!(&b[10..12], &[0, 0]);
    }

    #[test]
    fn train_size_travels_in_the_caps() {
        let c = caps::with_train_bytes(caps::RELIABLE | caps::CRC, 8972);
        assert_eq!(caps::train_bytes(c), 8972);
        assert_eq!(c & 0xFFFF, caps::RELIABLE | caps::CRC | caps::TRAINS);
        assert_eq!(caps::train_bytes(caps::with_train_bytes(caps::RELIABLE, 1472)), 0);
        assert_eq!(caps::train_bytes(caps::with_train_bytes(0, 100_000)), 0xFFFF);
        assert_eq!(caps::train_bytes(caps::RELIABLE), 0);
        let h = Hello { caps: c, ..Hello::default() };
        assert_eq!(Hello::parse(&h.to_bytes()).unwrap().caps, c);
    }

    #[test]
    fn malformed_hellos_are_rejected() {
        let b = Hello::default().to_bytes();
        assert_eq!(Hello::parse(&b[..39]), Err(HelloError::Length));
        let mut c = b;
        c[0] = b'X';
        assert_eq!(Hello::parse(&c), Err(HelloError::BadMagic));
        let mut c = b;
        c[4] = 2;
        assert_eq!(Hello::parse(&c), Err(HelloError::Unknown));
        let mut c = b;
        c[11] = 1;
        assert_eq!(Hello::parse(&c), Err(HelloError::Unknown));
    }
}
