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
pub struct BankMetadata {
    /// Bank index (in).
    pub bank_idx: i32,
    /// Source IPv4 address, network order (out).
    pub saddr: u32,
    /// Source UDP port, host order (out).
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
}
