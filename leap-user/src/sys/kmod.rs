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
    BANK_LEN, BankMetadata, HALF_LEN, IOCTL_GET_BANK_SRC, IOCTL_GET_INFO, IOCTL_RELEASE_BANK, IOCTL_SEND,
    IOCTL_SEND_FRAME, IOCTL_SET_DEST, IOCTL_SET_FRAME_TIMEOUT, IOCTL_SET_PEER, IOCTL_SET_PORT, IOCTL_SET_TX_PORT,
    IOCTL_WAIT_DATA, IOCTL_WAIT_FRAME, Info, MMAP_LEN, Peer, RX_BANKS, Send, TX_OFFSET, WAIT_FOREVER, Wait,
};
use memmap2::{MmapOptions, MmapRaw};

/// One open file of the device (one ring node) and its mapped buffer.
///
/// The module writes into banks that are not held by user space at any
/// time, so the buffer is shared memory: it is only ever read or written
/// through raw copies, never through Rust references that the kernel could
/// change underneath.
#[derive(Debug)]
pub struct Device {
    map: MmapRaw,
    file: File,
}

/// `ioctl(fd, request, arg)` returning the non-negative result or the OS error.
fn ioctl(fd: BorrowedFd<'_>, request: u32, arg: *mut libc::c_void) -> io::Result<libc::c_int> {
    // SAFETY: every caller passes a request number of leap_kmod together
    // with a pointer to a live value of exactly the type that request's
    // `_IOC` size encodes (or null for `_IO` requests), which the kernel
    // reads and writes only within that size.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request.into(), arg) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn ioctl_in<T>(fd: BorrowedFd<'_>, request: u32, value: &T) -> io::Result<libc::c_int> {
    ioctl(fd, request, std::ptr::from_ref(value).cast_mut().cast())
}

fn ioctl_inout<T>(fd: BorrowedFd<'_>, request: u32, value: &mut T) -> io::Result<libc::c_int> {
    ioctl(fd, request, std::ptr::from_mut(value).cast())
}

impl Device {
    /// Opens the device at `path` (normally [`leap_common::kmod::DEVICE_PATH`])
    /// and maps its whole buffer.
    ///
    /// # Errors
    ///
    /// `open` (ENOENT when the module is not loaded, EPERM without
    /// `CAP_NET_ADMIN` in this network namespace, EBUSY when the module's
    /// limit of open files is reached) or `mmap`.
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
    /// ENOTTY from a module without the call (the original).
    pub fn info(&self, scope: u32) -> io::Result<Info> {
        let mut info = Info { scope, ..Info::default() };
        ioctl_inout(self.file.as_fd(), IOCTL_GET_INFO, &mut info)?;
        Ok(info)
    }

    /// Binds the listening (and sending) UDP port.
    ///
    /// # Errors
    ///
    /// EADDRINUSE when another socket holds the port, EINVAL for port 0.
    pub fn set_port(&self, port: u16) -> io::Result<()> {
        ioctl_in(self.file.as_fd(), IOCTL_SET_PORT, &port).map(drop)
    }

    /// Sets the next node's address and port.
    ///
    /// # Errors
    ///
    /// As the ioctls.
    pub fn set_dest(&self, addr: Ipv4Addr, port: u16) -> io::Result<()> {
        let raw = u32::from_ne_bytes(addr.octets());
        ioctl_in(self.file.as_fd(), IOCTL_SET_DEST, &raw)?;
        ioctl_in(self.file.as_fd(), IOCTL_SET_TX_PORT, &port).map(drop)
    }

    /// Accepts chunks only from this sender (`None`: any address / port).
    ///
    /// # Errors
    ///
    /// ENOTTY from a module without the filter.
    pub fn set_peer(&self, addr: Option<Ipv4Addr>, port: Option<u16>) -> io::Result<()> {
        let peer = Peer { addr: addr.map_or(0, |a| u32::from_ne_bytes(a.octets())), port: port.unwrap_or(0), _pad: 0 };
        ioctl_in(self.file.as_fd(), IOCTL_SET_PEER, &peer).map(drop)
    }

    /// Time after which an incomplete frame is reported lost.
    ///
    /// # Errors
    ///
    /// EINVAL above 60 s.
    pub fn set_frame_timeout(&self, timeout: Duration) -> io::Result<()> {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX).max(1);
        ioctl_in(self.file.as_fd(), IOCTL_SET_FRAME_TIMEOUT, &ms).map(drop)
    }

    /// The original `LEAP_IOCTL_WAIT_DATA`: blocks until a bank is complete
    /// and returns its index; the bank is released by the next call.
    ///
    /// # Errors
    ///
    /// ETIMEDOUT when the oldest pending frame was lost, EINTR on a signal.
    pub fn wait_data(&self) -> io::Result<usize> {
        ioctl(self.file.as_fd(), IOCTL_WAIT_DATA, std::ptr::null_mut()).map(|b| b as usize)
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
        match ioctl_inout(self.file.as_fd(), IOCTL_WAIT_FRAME, &mut w) {
            Ok(_) => Ok(Some(w)),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Gives a held bank back to the module.
    ///
    /// # Errors
    ///
    /// EINVAL when the bank is not held.
    pub fn release_bank(&self, bank: u32) -> io::Result<()> {
        ioctl_in(self.file.as_fd(), IOCTL_RELEASE_BANK, &bank).map(drop)
    }

    /// The original `LEAP_IOCTL_SEND`: sends the first `len` bytes of the TX
    /// area as one frame.
    ///
    /// # Errors
    ///
    /// ENOTCONN before [`Self::set_port`], EDESTADDRREQ before
    /// [`Self::set_dest`], EINVAL for a bad length, or the socket's error.
    pub fn send(&self, len: u32) -> io::Result<()> {
        ioctl_in(self.file.as_fd(), IOCTL_SEND, &len).map(drop)
    }

    /// Sends the first `len` bytes of the TX area as one frame whose chunks
    /// carry `flags` in the header's `reserved` field; returns its seq.
    ///
    /// # Errors
    ///
    /// As [`Self::send`].
    pub fn send_frame(&self, len: u32, flags: u16) -> io::Result<u16> {
        let mut s = Send { len, flags, seq: 0 };
        ioctl_inout(self.file.as_fd(), IOCTL_SEND_FRAME, &mut s)?;
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
        ioctl_inout(self.file.as_fd(), IOCTL_GET_BANK_SRC, &mut m)?;
        Ok(m)
    }

    /// Copies `out.len()` bytes from `offset` of receive bank `bank`.
    ///
    /// # Panics
    ///
    /// When the range is outside the bank.
    pub fn read_bank(&self, bank: usize, offset: usize, out: &mut [u8]) {
        assert!(bank < RX_BANKS && offset <= BANK_LEN && out.len() <= BANK_LEN - offset, "outside bank {bank}");
        // SAFETY: the range lies inside the mapping (checked above; the map
        // is MMAP_LEN long), `out` is a distinct Rust buffer. The module
        // leaves a held bank alone; reading a bank it is writing yields some
        // bytes, never undefined behaviour for plain u8 copies.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(bank * BANK_LEN + offset), out.as_mut_ptr(), out.len())
        }
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

    /// Copies the whole receive half (all 64 banks) into `out`.
    ///
    /// # Panics
    ///
    /// When `out` is not [`HALF_LEN`] bytes long.
    pub fn read_all_banks(&self, out: &mut [u8]) {
        assert_eq!(out.len(), HALF_LEN);
        // SAFETY: as in `read_bank`: the first HALF_LEN bytes of the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr(), out.as_mut_ptr(), HALF_LEN) }
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

impl AsFd for Device {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}
