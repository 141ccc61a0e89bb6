//! `/dev/leap_tensor` (kernel module `leap_kmod`): opening the device,
//! mapping its 16 MiB buffer and its ioctls, as thin safe wrappers. The ABI
//! types and numbers come from [`leap_common::kmod`].

use std::fs::{File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use leap_common::kmod::{
    BANK_LEN, BankMetadata, HALF_LEN, IOCTL_MAGIC, Info, MMAP_LEN, Peer, RX_BANKS, TX_OFFSET, WAIT_FOREVER, Wait,
};
use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;

/// One open file of the device (one ring node) and its mapped buffer.
///
/// The module writes into banks that are not held by user space at any
/// time, so the buffer is shared memory: receive banks are copied out with
/// volatile loads ([`Self::read_bank`]) or lent as slices only while held
/// ([`Self::held_bank`], which the module then leaves alone), and the TX
/// area, which the module only reads during a SEND, is written by its one
/// sender; never a Rust reference the kernel could change underneath.
#[derive(Debug)]
pub struct Device {
    map: MmapRaw,
    file: File,
}

/// Declares the module's ioctls as typed functions (nix's `ioctl_*!`, from
/// the `_IOC` direction, magic, number and argument type), and, for the
/// test against [`leap_common::kmod`], the request numbers of exactly those
/// triples.
macro_rules! kmod_ioctls {
    ($($(#[$doc:meta])* $dir:ident $name:ident($nr:literal $(, $ty:ty)?) = $abi:ident;)*) => {
        $(kmod_ioctls!(@fn $dir $(#[$doc])* $name, $nr $(, $ty)?);)*

        /// `(name, number in leap_common, number nix computes)` of every ioctl.
        #[cfg(test)]
        pub(super) const REQUESTS: &[(&str, u32, u32)] = &[
            $((stringify!($name), leap_common::kmod::$abi, kmod_ioctls!(@code $dir $nr $(, $ty)?) as u32),)*
        ];
    };
    (@fn none $(#[$doc:meta])* $name:ident, $nr:literal) => {
        nix::ioctl_none!($(#[$doc])* $name, IOCTL_MAGIC, $nr);
    };
    (@fn write $(#[$doc:meta])* $name:ident, $nr:literal, $ty:ty) => {
        nix::ioctl_write_ptr!($(#[$doc])* $name, IOCTL_MAGIC, $nr, $ty);
    };
    (@fn readwrite $(#[$doc:meta])* $name:ident, $nr:literal, $ty:ty) => {
        nix::ioctl_readwrite!($(#[$doc])* $name, IOCTL_MAGIC, $nr, $ty);
    };
    (@code none $nr:literal) => { nix::request_code_none!(IOCTL_MAGIC, $nr) };
    (@code write $nr:literal, $ty:ty) => { nix::request_code_write!(IOCTL_MAGIC, $nr, size_of::<$ty>()) };
    (@code readwrite $nr:literal, $ty:ty) => { nix::request_code_readwrite!(IOCTL_MAGIC, $nr, size_of::<$ty>()) };
}

/// `leap_kmod`'s ioctls (`kmod/leap_uapi.h`), each an `unsafe fn(fd, arg)`
/// whose argument type is the one its request number encodes. Callers
/// promise that `fd` is an open file of the device and that the pointer
/// names a live value for the duration of the call.
mod ioctl {
    use super::{BankMetadata, IOCTL_MAGIC, Info, Peer, Wait};

    kmod_ioctls! {
        /// `LEAP_IOCTL_WAIT_DATA`: block until a bank is complete; returns its index.
        none wait_data(1) = IOCTL_WAIT_DATA;
        /// `LEAP_IOCTL_SET_DEST`: next node's IPv4 address, network order.
        write set_dest(2, u32) = IOCTL_SET_DEST;
        /// `LEAP_IOCTL_SET_PORT`: listening port, host order.
        write set_port(3, u16) = IOCTL_SET_PORT;
        /// `LEAP_IOCTL_SEND`: send that many bytes of the TX area.
        write send(4, u32) = IOCTL_SEND;
        /// `LEAP_IOCTL_SET_TX_PORT`: next node's port, host order.
        write set_tx_port(5, u16) = IOCTL_SET_TX_PORT;
        /// `LEAP_IOCTL_GET_BANK_SRC`: sender of a bank.
        readwrite get_bank_src(6, BankMetadata) = IOCTL_GET_BANK_SRC;
        /// `LEAP_IOCTL_GET_INFO`: ABI version, features, counters.
        readwrite get_info(7, Info) = IOCTL_GET_INFO;
        /// `LEAP_IOCTL_RELEASE_BANK`: give a bank back to the module.
        write release_bank(8, u32) = IOCTL_RELEASE_BANK;
        /// `LEAP_IOCTL_SET_PEER`: accept only this sender.
        write set_peer(9, Peer) = IOCTL_SET_PEER;
        /// `LEAP_IOCTL_WAIT_FRAME`: wait for a frame or a lost report.
        readwrite wait_frame(10, Wait) = IOCTL_WAIT_FRAME;
        /// `LEAP_IOCTL_SET_FRAME_TIMEOUT`: frame timeout in ms.
        write set_frame_timeout(11, u32) = IOCTL_SET_FRAME_TIMEOUT;
        /// `LEAP_IOCTL_SEND_FRAME`: send a frame with given flags.
        readwrite send_frame(12, leap_common::kmod::Send) = IOCTL_SEND_FRAME;
    }
}

impl Device {
    /// Opens the device at `path` (normally [`leap_common::kmod::DEVICE_PATH`])
    /// and maps its whole buffer.
    ///
    /// # Errors
    ///
    /// `open` (ENOENT when the module is not loaded, EPERM without
    /// `CAP_NET_ADMIN` in the initial user namespace, EBUSY when this
    /// network namespace's or the module's limit of open files is reached)
    /// or `mmap`.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let map = MmapOptions::new().len(MMAP_LEN).map_raw(&file)?;
        Ok(Self { map, file })
    }

    /// `LEAP_IOCTL_GET_INFO` for `scope` ([`leap_common::kmod::INFO_SCOPE_FILE`]
    /// or [`leap_common::kmod::INFO_SCOPE_MODULE`]).
    ///
    /// # Errors
    ///
    /// ENOTTY from a module without the call (the original); EPERM for the
    /// module scope without `CAP_NET_ADMIN` in the initial user namespace
    /// (the opener's and the caller's).
    pub fn info(&self, scope: u32) -> io::Result<Info> {
        let mut info = Info { scope, ..Info::default() };
        // SAFETY: our open file of the device; `info` is a live `Info`, the
        // type GET_INFO encodes.
        unsafe { ioctl::get_info(self.file.as_raw_fd(), &mut info) }?;
        Ok(info)
    }

    /// Binds the listening (and sending) UDP port.
    ///
    /// # Errors
    ///
    /// EADDRINUSE when another socket holds the port, EINVAL for port 0.
    pub fn set_port(&self, port: u16) -> io::Result<()> {
        // SAFETY: our open file of the device; `port` is a live u16, the type
        // SET_PORT encodes.
        unsafe { ioctl::set_port(self.file.as_raw_fd(), &port) }?;
        Ok(())
    }

    /// Sets the next node's address and port.
    ///
    /// # Errors
    ///
    /// As the ioctls.
    pub fn set_dest(&self, addr: Ipv4Addr, port: u16) -> io::Result<()> {
        let raw = u32::from_ne_bytes(addr.octets());
        // SAFETY: our open file of the device; `raw` and `port` are a live
        // u32 and u16, the types SET_DEST and SET_TX_PORT encode.
        unsafe {
            ioctl::set_dest(self.file.as_raw_fd(), &raw)?;
            ioctl::set_tx_port(self.file.as_raw_fd(), &port)?;
        }
        Ok(())
    }

    /// Accepts chunks only from this sender (`None`: any address / port).
    ///
    /// # Errors
    ///
    /// ENOTTY from a module without the filter.
    pub fn set_peer(&self, addr: Option<Ipv4Addr>, port: Option<u16>) -> io::Result<()> {
        let peer = Peer { addr: addr.map_or(0, |a| u32::from_ne_bytes(a.octets())), port: port.unwrap_or(0), _pad: 0 };
        // SAFETY: our open file of the device; `peer` is a live `Peer`.
        unsafe { ioctl::set_peer(self.file.as_raw_fd(), &peer) }?;
        Ok(())
    }

    /// Time after which an incomplete frame is reported lost.
    ///
    /// # Errors
    ///
    /// EINVAL above 60 s.
    pub fn set_frame_timeout(&self, timeout: Duration) -> io::Result<()> {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX).max(1);
        // SAFETY: our open file of the device; `ms` is a live u32.
        unsafe { ioctl::set_frame_timeout(self.file.as_raw_fd(), &ms) }?;
        Ok(())
    }

    /// The original `LEAP_IOCTL_WAIT_DATA`: blocks until a bank is complete
    /// and returns its index; the bank is released by the next call.
    ///
    /// # Errors
    ///
    /// ETIMEDOUT when the oldest pending frame was lost, EINTR on a signal.
    pub fn wait_data(&self) -> io::Result<usize> {
        // SAFETY: our open file of the device; WAIT_DATA takes no argument.
        let bank = unsafe { ioctl::wait_data(self.file.as_raw_fd()) }?;
        Ok(bank as usize)
    }

    /// Waits up to `timeout` (`None`: forever) for the oldest complete frame
    /// or lost-frame report. A frame's bank stays held until
    /// [`Self::release_bank`]. `Ok(None)` when nothing came in time.
    ///
    /// # Errors
    ///
    /// EINTR on a signal, ENOTTY from the original module.
    pub fn wait_frame(&self, timeout: Option<Duration>) -> io::Result<Option<Wait>> {
        let timeout_ms = timeout.map_or(WAIT_FOREVER, |t| u32::try_from(t.as_millis()).unwrap_or(WAIT_FOREVER - 1));
        let mut w = Wait { timeout_ms, ..Wait::default() };
        // SAFETY: our open file of the device; `w` is a live `Wait`.
        match unsafe { ioctl::wait_frame(self.file.as_raw_fd(), &mut w) } {
            Ok(_) => Ok(Some(w)),
            Err(Errno::EAGAIN) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives a held bank back to the module.
    ///
    /// # Errors
    ///
    /// EINVAL when the bank is not held.
    pub fn release_bank(&self, bank: u32) -> io::Result<()> {
        // SAFETY: our open file of the device; `bank` is a live u32.
        unsafe { ioctl::release_bank(self.file.as_raw_fd(), &bank) }?;
        Ok(())
    }

    /// The original `LEAP_IOCTL_SEND`: sends the first `len` bytes of the TX
    /// area as one frame.
    ///
    /// # Errors
    ///
    /// ENOTCONN before [`Self::set_port`], EDESTADDRREQ before
    /// [`Self::set_dest`], EINVAL for a bad length, or the socket's error.
    pub fn send(&self, len: u32) -> io::Result<()> {
        // SAFETY: our open file of the device; `len` is a live u32.
        unsafe { ioctl::send(self.file.as_raw_fd(), &len) }?;
        Ok(())
    }

    /// Sends the first `len` bytes of the TX area as one frame whose chunks
    /// carry `flags` in the header's `reserved` field; returns its seq.
    ///
    /// # Errors
    ///
    /// As [`Self::send`].
    pub fn send_frame(&self, len: u32, flags: u16) -> io::Result<u16> {
        let mut s = leap_common::kmod::Send { len, flags, seq: 0 };
        // SAFETY: our open file of the device; `s` is a live `Send`.
        unsafe { ioctl::send_frame(self.file.as_raw_fd(), &mut s) }?;
        Ok(s.seq)
    }

    /// The original `LEAP_IOCTL_GET_BANK_SRC`: who sent the frame in a bank
    /// (`saddr` and `sport` in network order, as the original).
    ///
    /// # Errors
    ///
    /// EINVAL for a bank out of range.
    pub fn bank_src(&self, bank: i32) -> io::Result<BankMetadata> {
        let mut m = BankMetadata { bank_idx: bank, ..BankMetadata::default() };
        // SAFETY: our open file of the device; `m` is a live `BankMetadata`.
        unsafe { ioctl::get_bank_src(self.file.as_raw_fd(), &mut m) }?;
        Ok(m)
    }

    /// Copies `out.len()` bytes from `offset` of receive bank `bank`.
    ///
    /// A bank this file holds (delivered by `LEAP_IOCTL_WAIT_FRAME`, not
    /// released) is copied as the module left it. Any other bank may be
    /// written by the module during the copy: the copy is then still
    /// defined, but may mix bytes from before and after each write (torn at
    /// 8-byte words): only bytes, which mean a frame only if the bank was
    /// held (or the frame's own length and checksum say so).
    ///
    /// # Panics
    ///
    /// When the range is outside the bank.
    pub fn read_bank(&self, bank: usize, offset: usize, out: &mut [u8]) {
        assert!(bank < RX_BANKS && offset <= BANK_LEN && out.len() <= BANK_LEN - offset, "outside bank {bank}");
        // SAFETY: the range lies inside the mapping (checked above; the map
        // is MMAP_LEN long and lives as long as `self`) and inside the
        // receive half, to which no `&mut` exists (only `tx_area` hands one
        // out, past TX_OFFSET); `out` is a distinct Rust buffer.
        unsafe { copy_volatile(self.map.as_ptr().add(bank * BANK_LEN + offset), out) }
    }

    /// The first `len` bytes of receive bank `bank`, in place.
    ///
    /// # Panics
    ///
    /// When the range is outside the bank.
    ///
    /// # Safety
    ///
    /// The bank must be held by this file (delivered by
    /// `LEAP_IOCTL_WAIT_FRAME` and not released) for as long as the slice
    /// lives: the module writes only banks that no file holds, so the bytes
    /// cannot change under the reference.
    pub unsafe fn held_bank(&self, bank: usize, len: usize) -> &[u8] {
        assert!(bank < RX_BANKS && len <= BANK_LEN, "outside bank {bank}");
        // SAFETY: the range lies inside the mapping (checked above), which
        // lives as long as `self`; the caller guarantees the module does not
        // write it meanwhile (the bank is held).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(bank * BANK_LEN), len) }
    }

    /// The first `len` bytes of the TX area, to write a frame in place.
    ///
    /// # Panics
    ///
    /// When `len` is longer than the TX area.
    ///
    /// # Safety
    ///
    /// No other reference to the TX area may exist while the slice lives,
    /// and no SEND ioctl of this file may run meanwhile (the module reads
    /// the area then): one thread writes and sends, as a node's sender does.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn tx_area(&self, len: usize) -> &mut [u8] {
        assert!(len <= HALF_LEN, "{len} bytes do not fit the TX area");
        // SAFETY: TX_OFFSET + len <= MMAP_LEN and the mapping lives as long
        // as `self`; the module never writes the TX area, and the caller
        // guarantees that nobody else touches it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(TX_OFFSET), len) }
    }

    /// Copies the whole receive half (all 64 banks) into `out`. Banks the
    /// module writes meanwhile may come out torn, as with
    /// [`Self::read_bank`].
    ///
    /// # Panics
    ///
    /// When `out` is not [`HALF_LEN`] bytes long.
    pub fn read_all_banks(&self, out: &mut [u8]) {
        assert_eq!(out.len(), HALF_LEN);
        // SAFETY: as in `read_bank`: the first HALF_LEN bytes of the
        // mapping, the receive half.
        unsafe { copy_volatile(self.map.as_ptr(), out) }
    }

    /// Copies `parts` one after another into the TX area at offset 0 and
    /// returns the total length.
    ///
    /// # Panics
    ///
    /// When the parts are longer than the TX area.
    pub fn write_tx(&mut self, parts: &[&[u8]]) -> usize {
        // SAFETY: `self` is borrowed mutably: no other reference to the TX
        // area, and no SEND of this file, can exist meanwhile.
        unsafe { self.write_tx_shared(parts) }
    }

    /// As [`Self::write_tx`] through a shared reference.
    ///
    /// # Panics
    ///
    /// When the parts are longer than the TX area.
    ///
    /// # Safety
    ///
    /// As [`Self::tx_area`]: one writer and sender at a time.
    pub unsafe fn write_tx_shared(&self, parts: &[&[u8]]) -> usize {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        assert!(total <= HALF_LEN, "{total} bytes do not fit the TX area");
        let mut at = TX_OFFSET;
        for p in parts {
            // SAFETY: TX_OFFSET + total <= MMAP_LEN (checked above); the
            // module only reads the TX area during a SEND ioctl of this file,
            // which the caller guarantees does not run now.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), self.map.as_mut_ptr().add(at), p.len()) };
            at += p.len();
        }
        total
    }
}

/// Copies `out.len()` bytes from `src` with volatile loads: a byte at a time
/// up to the first 8-byte boundary, then a `u64` word at a time, then the
/// last bytes.
///
/// The module's buffer, mapped `MAP_SHARED`, lies outside every Rust
/// allocation and is written by the kernel on its own: memory of the kind
/// `read_volatile` is documented for (I/O memory). Each load is an
/// externally observable access that the compiler neither elides, merges,
/// repeats nor moves across the others, and returns whatever the memory
/// holds at that moment; every bit pattern is a valid `u8` and `u64`.
/// No Rust code writes the receive half, so there is no race between Rust
/// threads for volatile to leave undefined. A write by the module during
/// the copy can only make it a mix of old and new bytes, torn at word
/// boundaries. A plain `copy_nonoverlapping` would be a non-atomic read
/// racing that write, which Rust leaves undefined.
///
/// # Safety
///
/// `src..src + out.len()` lies inside a live mapping of the device that no
/// Rust `&mut` covers while the copy runs.
unsafe fn copy_volatile(src: *const u8, out: &mut [u8]) {
    const WORD: usize = size_of::<u64>();
    let head = src.align_offset(WORD).min(out.len());
    let (bytes, rest) = out.split_at_mut(head);
    for (i, b) in bytes.iter_mut().enumerate() {
        // SAFETY: i < out.len(): inside the range the caller vouches for.
        *b = unsafe { src.add(i).read_volatile() };
    }
    let mut words = rest.chunks_exact_mut(WORD);
    let mut at = head;
    for w in &mut words {
        // SAFETY: at + 8 <= out.len(), and src + at is 8-aligned (`head`
        // reached the boundary, and each step is one word).
        let v = unsafe { src.add(at).cast::<u64>().read_volatile() };
        w.copy_from_slice(&v.to_ne_bytes());
        at += WORD;
    }
    for (i, b) in words.into_remainder().iter_mut().enumerate() {
        // SAFETY: at + i < out.len().
        *b = unsafe { src.add(at + i).read_volatile() };
    }
}

impl AsFd for Device {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn volatile_copy_gives_the_bytes_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 64, 100, 191 - start] {
                let mut out = vec![0u8; len];
                // SAFETY: start + len <= 200, inside `src`, which nothing
                // else touches meanwhile.
                unsafe { super::copy_volatile(src.as_ptr().add(start), &mut out) };
                assert_eq!(out, src[start..start + len], "from {start}, {len} bytes");
            }
        }
    }

    #[test]
    fn nix_request_numbers_are_the_abi_ones() {
        for &(name, abi, nix) in super::ioctl::REQUESTS {
            assert_eq!(nix, abi, "{name}: nix computes {nix:#x}, leap_common::kmod has {abi:#x}");
        }
        assert_eq!(super::ioctl::REQUESTS.len(), 12);
    }
}
