//! The ioctl and mmap ABI of `/dev/leap_tensor` (kernel module `leap_kmod`),
//! mirrored from `kmod/leap_uapi.h`. A test compiles a C program against the
//! header and compares its sizes, offsets and ioctl numbers with these.

/// Device node created by the module.
pub const DEVICE_PATH: &str = "/dev/leap_tensor";
/// Bytes of one half of the mapping (receive banks, then transmit area).
pub const HALF_LEN: usize = 8 << 20;
/// Bytes of the whole mapping: RX banks then TX staging area.
pub const MMAP_LEN: usize = 2 * HALF_LEN;
/// Number of receive banks.
pub const RX_BANKS: usize = 64;
/// Bytes of one receive bank.
pub const BANK_LEN: usize = HALF_LEN / RX_BANKS;
/// Offset of the transmit staging area in the mapping.
pub const TX_OFFSET: usize = HALF_LEN;

const _: () = assert!(BANK_LEN == 128 * 1024);

/// ioctl type ("magic") of the module.
pub const IOCTL_MAGIC: u8 = b'k';

const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)` as Linux defines it on x86, arm64 and riscv.
pub const fn ioc(dir: u32, nr: u8, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((IOCTL_MAGIC as u32) << 8) | nr as u32
}

/// `{ int bank_idx; u32 saddr; u16 sport; }`: who sent the frame in a bank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct BankMetadata {
    /// Bank index (in).
    pub bank_idx: i32,
    /// Source IPv4 address, network order (out).
    pub saddr: u32,
    /// Source UDP port, network order as in the original (out): apply
    /// `u16::from_be`.
    pub sport: u16,
    /// Explicit tail padding of the C struct.
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<BankMetadata>() == 12);

/// `_IO('k', 1)`: block until a bank is complete; returns its index.
pub const IOCTL_WAIT_DATA: u32 = ioc(IOC_NONE, 1, 0);
/// `_IOW('k', 2, unsigned int)`: next node's IPv4 address, network order.
pub const IOCTL_SET_DEST: u32 = ioc(IOC_WRITE, 2, 4);
/// `_IOW('k', 3, unsigned short)`: listening port, host order.
pub const IOCTL_SET_PORT: u32 = ioc(IOC_WRITE, 3, 2);
/// `_IOW('k', 4, unsigned int)`: send that many bytes of the TX area.
pub const IOCTL_SEND: u32 = ioc(IOC_WRITE, 4, 4);
/// `_IOW('k', 5, unsigned short)`: next node's port, host order.
pub const IOCTL_SET_TX_PORT: u32 = ioc(IOC_WRITE, 5, 2);
/// `_IOWR('k', 6, struct leap_bank_metadata)`: sender of a bank.
pub const IOCTL_GET_BANK_SRC: u32 = ioc(IOC_READ | IOC_WRITE, 6, core::mem::size_of::<BankMetadata>());

/// ABI version reported by [`IOCTL_GET_INFO`] (`LEAP_ABI_VERSION`).
pub const ABI_VERSION: u32 = 1;
/// Most chunks of a frame, as the original: a frame may fill the whole bank
/// (93 chunks of 1400 bytes and a last one of 872).
pub const BANK_CHUNKS_MAX: usize = BANK_LEN.div_ceil(crate::chunk::CHUNK_PAYLOAD_MAX);
/// Largest frame the module can receive into one bank: the whole bank.
pub const BANK_FRAME_MAX: usize = BANK_LEN;
const _: () = assert!(BANK_CHUNKS_MAX == 94 && BANK_FRAME_MAX == 131_072);

/// Feature bits of [`Info::features`] (`LEAP_FEAT_*`).
pub mod features {
    /// State per open file and per network namespace.
    pub const PER_OPEN: u64 = 1 << 0;
    /// [`super::IOCTL_RELEASE_BANK`].
    pub const RELEASE_BANK: u64 = 1 << 1;
    /// [`super::IOCTL_SET_PEER`].
    pub const PEER_FILTER: u64 = 1 << 2;
    /// [`super::IOCTL_WAIT_FRAME`].
    pub const WAIT_FRAME: u64 = 1 << 3;
    /// Incomplete frames are reported after a timeout.
    pub const LOST_REPORT: u64 = 1 << 4;
    /// UDP checksums verified on receive.
    pub const RX_CSUM: u64 = 1 << 5;
    /// UDP checksums sent.
    pub const TX_CSUM: u64 = 1 << 6;
    /// IPv4 fragments are reassembled by the stack, then taken.
    pub const FRAGMENTS: u64 = 1 << 7;
    /// [`super::IOCTL_SEND_FRAME`].
    pub const SEND_FRAME: u64 = 1 << 8;
    /// `poll()` reports complete frames.
    pub const POLL: u64 = 1 << 9;
    /// [`super::IOCTL_SET_FRAME_TIMEOUT`].
    pub const FRAME_TIMEOUT: u64 = 1 << 10;
    /// Only datagrams the stack delivers to this host reach the module.
    pub const LOCAL_ONLY: u64 = 1 << 11;
    /// With no peer set, the first sender is learnt and locked.
    pub const SENDER_LOCK: u64 = 1 << 12;
    /// Chunk trains ([`crate::chunk::train`]) are split and each chunk taken.
    pub const TRAINS: u64 = 1 << 13;
}

/// `struct leap_counters`: what the module did with chunks and frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Counters {
    /// Chunks copied into a bank.
    pub rx_chunks: u64,
    /// Chunks already received, ignored.
    pub rx_duplicates: u64,
    /// Banks that got all their chunks.
    pub rx_frames_completed: u64,
    /// Banks handed to user space.
    pub rx_frames_delivered: u64,
    /// Frames reported lost (incomplete after the timeout, or overtaken).
    pub rx_frames_timed_out: u64,
    /// Lost reports that found the report queue full.
    pub rx_lost_overflow: u64,
    /// LEAP chunks of other kinds (NACK, ...) left alone.
    pub rx_passthrough: u64,
    /// Datagrams to the port without the LEAP magic.
    pub rx_not_leap: u64,
    /// Shorter than the chunk header.
    pub drop_short: u64,
    /// `chunk_id >= total_chunks`, or `total_chunks == 0`.
    pub drop_bad_chunk_id: u64,
    /// Payload over 1400 bytes.
    pub drop_oversize: u64,
    /// A non-last chunk not exactly 1400 bytes, or an empty last chunk.
    pub drop_bad_length: u64,
    /// `total_chunks` disagreeing within a frame.
    pub drop_total_mismatch: u64,
    /// `total_chunks * 1400` over the bank size.
    pub drop_too_big: u64,
    /// Not from the configured peer.
    pub drop_peer: u64,
    /// Unused: the stack drops datagrams with a wrong UDP checksum before
    /// the module sees them (UDP `InCsumErrors`).
    pub drop_bad_checksum: u64,
    /// The bank still holds a frame user space has not released.
    pub drop_bank_busy: u64,
    /// Older seq than the frame in the bank.
    pub drop_stale: u64,
    /// Another sender for a frame already started.
    pub drop_source_mismatch: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Chunks sent.
    pub tx_chunks: u64,
    /// Failed sends.
    pub tx_errors: u64,
    /// No peer set: not the first sender, which is locked.
    pub drop_stranger: u64,
    /// Broadcast or multicast datagrams to the port.
    pub drop_not_unicast: u64,
    /// Room for more counters.
    pub _reserved: [u64; 8],
}
const _: () = assert!(core::mem::size_of::<Counters>() == 256);

impl Counters {
    /// Chunks dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.drop_short
            + self.drop_bad_chunk_id
            + self.drop_oversize
            + self.drop_bad_length
            + self.drop_total_mismatch
            + self.drop_too_big
            + self.drop_peer
            + self.drop_bad_checksum
            + self.drop_bank_busy
            + self.drop_stale
            + self.drop_source_mismatch
            + self.drop_stranger
            + self.drop_not_unicast
    }
}

/// [`Info::scope`]: counters of this open file.
pub const INFO_SCOPE_FILE: u32 = 0;
/// [`Info::scope`]: counters summed over the module since it was loaded
/// (every node's, in every namespace): EPERM unless the file's opener and
/// the caller hold `CAP_NET_ADMIN` in the initial user namespace.
pub const INFO_SCOPE_MODULE: u32 = 1;

/// `struct leap_info`: versioned discovery and counters ([`IOCTL_GET_INFO`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Info {
    /// [`ABI_VERSION`] of the loaded module (out).
    pub abi_version: u32,
    /// `sizeof(struct leap_info)` in the module (out).
    pub info_size: u32,
    /// [`features`] bits (out).
    pub features: u64,
    /// [`INFO_SCOPE_FILE`] or [`INFO_SCOPE_MODULE`] (in).
    pub scope: u32,
    /// Files open on the device (out); with [`INFO_SCOPE_FILE`], those in
    /// this file's network namespace.
    pub open_files: u32,
    /// Number of receive banks (out).
    pub rx_banks: u32,
    /// Bytes of one bank (out).
    pub bank_size: u32,
    /// Bytes of the TX area (out).
    pub tx_size: u32,
    /// Largest chunk payload (out).
    pub chunk_payload_max: u32,
    /// This file's frame timeout in ms (out).
    pub frame_timeout_ms: u32,
    /// Listening port, host order, 0 unset (out).
    pub port: u16,
    /// Next node's port, host order (out).
    pub tx_port: u16,
    /// Next node's IPv4 address, network order (out).
    pub dest_addr: u32,
    /// Peer filter address, network order, 0 any (out).
    pub peer_addr: u32,
    /// Peer filter port, host order, 0 any (out).
    pub peer_port: u16,
    /// Padding.
    pub _pad0: u16,
    /// The `busy_wait_limit` module parameter (out).
    pub busy_wait_limit: u32,
    /// Counters of the scope asked for (out).
    pub counters: Counters,
}
const _: () = assert!(core::mem::size_of::<Info>() == 320);

/// `struct leap_peer`: accept chunks only from this sender ([`IOCTL_SET_PEER`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Peer {
    /// IPv4 address, network order; 0 any.
    pub addr: u32,
    /// UDP port, host order; 0 any.
    pub port: u16,
    /// Padding.
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<Peer>() == 8);

/// [`Wait::timeout_ms`]: block until something arrives.
pub const WAIT_FOREVER: u32 = u32::MAX;
/// [`Wait::status`]: `bank` holds a complete frame.
pub const WAIT_STATUS_FRAME: u32 = 0;
/// [`Wait::status`]: frame `seq` timed out incomplete; `bank` is -1.
pub const WAIT_STATUS_LOST: u32 = 1;

/// `struct leap_wait`: the oldest complete frame or lost-frame report
/// ([`IOCTL_WAIT_FRAME`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Wait {
    /// Milliseconds to wait: 0 poll, [`WAIT_FOREVER`] block (in).
    pub timeout_ms: u32,
    /// [`WAIT_STATUS_FRAME`] or [`WAIT_STATUS_LOST`] (out).
    pub status: u32,
    /// Bank index, -1 when lost (out).
    pub bank: i32,
    /// Frame bytes received (out).
    pub len: u32,
    /// Sender IPv4 address, network order (out).
    pub saddr: u32,
    /// Sender port, host order (out).
    pub sport: u16,
    /// Frame seq (out).
    pub seq: u16,
    /// `total_chunks` of the frame (out).
    pub total_chunks: u16,
    /// The chunks' `reserved` field (out).
    pub flags: u16,
    /// Chunks received; less than `total_chunks` when lost (out).
    pub chunks: u32,
}
const _: () = assert!(core::mem::size_of::<Wait>() == 32);

/// `struct leap_send`: send bytes of the TX area as one frame
/// ([`IOCTL_SEND_FRAME`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Send {
    /// Bytes, 1 ..= [`HALF_LEN`] (in).
    pub len: u32,
    /// `reserved` field to put on the wire (in).
    pub flags: u16,
    /// Seq the frame went out with (out).
    pub seq: u16,
}
const _: () = assert!(core::mem::size_of::<Send>() == 8);

/// `_IOWR('k', 7, struct leap_info)`: ABI version, features, counters.
pub const IOCTL_GET_INFO: u32 = ioc(IOC_READ | IOC_WRITE, 7, core::mem::size_of::<Info>());
/// `_IOW('k', 8, __u32)`: give a bank back to the module.
pub const IOCTL_RELEASE_BANK: u32 = ioc(IOC_WRITE, 8, 4);
/// `_IOW('k', 9, struct leap_peer)`: accept only this sender.
pub const IOCTL_SET_PEER: u32 = ioc(IOC_WRITE, 9, core::mem::size_of::<Peer>());
/// `_IOWR('k', 10, struct leap_wait)`: wait for a frame or a lost report.
pub const IOCTL_WAIT_FRAME: u32 = ioc(IOC_READ | IOC_WRITE, 10, core::mem::size_of::<Wait>());
/// `_IOW('k', 11, __u32)`: frame timeout in ms (0: module default).
pub const IOCTL_SET_FRAME_TIMEOUT: u32 = ioc(IOC_WRITE, 11, 4);
/// `_IOWR('k', 12, struct leap_send)`: send a frame with given flags.
pub const IOCTL_SEND_FRAME: u32 = ioc(IOC_READ | IOC_WRITE, 12, core::mem::size_of::<Send>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn original_ioctl_numbers() {
        assert_eq!(IOCTL_WAIT_DATA, 0x6b01);
        assert_eq!(IOCTL_SET_DEST, 0x4004_6b02);
        assert_eq!(IOCTL_SET_PORT, 0x4002_6b03);
        assert_eq!(IOCTL_SEND, 0x4004_6b04);
        assert_eq!(IOCTL_SET_TX_PORT, 0x4002_6b05);
        assert_eq!(IOCTL_GET_BANK_SRC, 0xc00c_6b06);
    }

    #[test]
    fn new_ioctls_are_numbered_from_7() {
        assert_eq!(IOCTL_GET_INFO, 0xc140_6b07);
        assert_eq!(IOCTL_RELEASE_BANK, 0x4004_6b08);
        assert_eq!(IOCTL_SET_PEER, 0x4008_6b09);
        assert_eq!(IOCTL_WAIT_FRAME, 0xc020_6b0a);
        assert_eq!(IOCTL_SET_FRAME_TIMEOUT, 0x4004_6b0b);
        assert_eq!(IOCTL_SEND_FRAME, 0xc008_6b0c);
    }
}
