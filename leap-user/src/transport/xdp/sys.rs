//! The few raw system calls the XDP backend makes itself: interface lookup,
//! the BPF file system mount, and the page-aligned UMEM area of AF_XDP.
//! Every `unsafe` of the backend outside `xsk.rs` is here.

use std::ffi::CString;
use std::io;
use std::path::Path;
use std::ptr::NonNull;

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The index of the interface `name`, `None` if there is none.
pub fn if_index(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

/// Whether `path` is on a BPF file system.
pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is NUL-terminated and `st` is writable memory of the right type.
    let rc = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: statfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast, reason = "f_type is i64 on x86_64 but not everywhere")]
    let ty = st.f_type as i64;
    ty == BPF_FS_MAGIC
}

/// Mounts a BPF file system at `path` unless one is there already (as
/// `bpftool` does).
///
/// # Errors
///
/// The `mount` error (`EPERM` when not root).
pub fn ensure_bpffs(path: &Path) -> io::Result<()> {
    if is_bpffs(path) {
        return Ok(());
    }
    std::fs::create_dir_all(path)?;
    let target = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: all strings are NUL-terminated and outlive the call; no data argument.
    let rc = unsafe { libc::mount(c"bpf".as_ptr(), target.as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    log::info!("mounted a BPF file system at {}", path.display());
    Ok(())
}

/// An anonymous, page-aligned, private mapping: the UMEM of AF_XDP sockets.
#[derive(Debug)]
pub struct UmemArea {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access to its
// bytes is synchronised by the AF_XDP rings (one owner per frame).
unsafe impl Send for UmemArea {}

impl UmemArea {
    /// Maps `len` bytes (rounded up by the kernel to pages).
    ///
    /// # Errors
    ///
    /// The `mmap` error.
    pub fn new(len: usize) -> io::Result<Self> {
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Self { ptr, len })
    }

    /// The whole area, for `xdpilone::Umem::new`.
    pub fn as_non_null(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.ptr, self.len)
    }

    /// Bytes `offset..offset + len` of the area, `None` when out of bounds.
    ///
    /// The caller must own that part of the area: the kernel hands a frame
    /// to user space through the RX ring and does not write it again until
    /// it is put back on the fill ring.
    pub fn get(&self, offset: u64, len: u32) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `start..end` lies within the mapping, which lives as long
        // as `self`; the frame is owned by user space (see above), so the
        // kernel does not write it while the slice is alive.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), end - start) })
    }
}

impl Drop for UmemArea {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; the sockets
        // using the area are dropped before it (field order of `XskSocket`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Waits until one of `fds` is readable or `timeout` passes; returns
/// whether one is. `EINTR` counts as "not yet".
///
/// # Errors
///
/// The `poll` error.
pub fn poll_readable(fds: &[std::os::fd::BorrowedFd<'_>], timeout: std::time::Duration) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut pfds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 8];
    if fds.len() > pfds.len() {
        return Err(io::Error::other("poll: more than 8 descriptors"));
    }
    for (p, fd) in pfds.iter_mut().zip(fds) {
        *p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    }
    let ms = libc::c_int::try_from(timeout.as_millis().max(u128::from(!timeout.is_zero()))).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfds[..fds.len()]` is valid writable memory of pollfd; the
    // descriptors are borrowed for the duration of the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(rc > 0)
}
