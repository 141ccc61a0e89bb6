//! The few raw system calls the XDP backend makes itself: interface lookup
//! (index, MAC, driver), the host's addresses, the BPF file system mount,
//! and the page-aligned UMEM area of AF_XDP.
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

/// Waits until one of `fds` (at most 16) is readable or `timeout` passes;
/// returns a bit mask of the readable ones (bit `i` for the `i`-th). `EINTR`
/// counts as "none yet".
///
/// # Errors
///
/// The `poll` error, or more than 16 descriptors.
/// An epoll set watching `fds` for input (level-triggered): readable itself
/// whenever one of them is, so one descriptor can stand for all in an event
/// loop.
///
/// # Errors
///
/// `epoll_create1` or `epoll_ctl`.
pub fn epoll_set<'a>(fds: impl IntoIterator<Item = std::os::fd::BorrowedFd<'a>>) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: plain system call without pointers.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `ep` was just returned by the kernel and is owned by nobody
    // else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) };
    for fd in fds {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd.as_raw_fd() as u64 };
        // SAFETY: `ev` is a valid epoll_event alive for the call; both
        // descriptors are open for its duration.
        if unsafe { libc::epoll_ctl(owned.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(owned)
}

pub fn poll_readable<'a>(
    fds: impl IntoIterator<Item = std::os::fd::BorrowedFd<'a>>,
    timeout: std::time::Duration,
) -> io::Result<u16> {
    use std::os::fd::AsRawFd;
    let mut pfds = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 16];
    let mut n = 0;
    for fd in fds {
        let slot = pfds.get_mut(n).ok_or_else(|| io::Error::other("poll: more than 16 descriptors"))?;
        *slot = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        n += 1;
    }
    // ppoll, not poll: loss-recovery timers wait for fractions of a
    // millisecond.
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `pfds[..n]` is valid writable memory of pollfd and `ts` a
    // valid timespec, both alive for the call; the descriptors are borrowed
    // for its duration; no signal mask is passed.
    let rc = unsafe { libc::ppoll(pfds.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    let mut mask = 0u16;
    for (i, p) in pfds[..n].iter().enumerate() {
        if p.revents != 0 {
            mask |= 1 << i;
        }
    }
    Ok(mask)
}

/// `BPF_PROG_TEST_RUN` from `linux/bpf.h`.
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The `test` member of `union bpf_attr` (kernel 5.10+ layout).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// Runs the XDP program `prog` once on `packet` without attaching it
/// (`BPF_PROG_TEST_RUN`); returns the action it chose.
///
/// # Errors
///
/// The `bpf` error (`EINVAL` for a packet shorter than Ethernet).
pub fn prog_test_run(prog: std::os::fd::BorrowedFd<'_>, packet: &[u8]) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut out = vec![0u8; packet.len() + 512];
    let mut attr = TestRunAttr {
        prog_fd: u32::try_from(prog.as_raw_fd()).map_err(io::Error::other)?,
        data_size_in: u32::try_from(packet.len()).map_err(io::Error::other)?,
        data_size_out: u32::try_from(out.len()).map_err(io::Error::other)?,
        data_in: packet.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ..TestRunAttr::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr.test` that outlives the call; its
    // pointers name `packet` (read) and `out` (written up to its size),
    // both alive for the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, &raw mut attr, size_of::<TestRunAttr>() as libc::c_uint)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr.retval)
}

/// `ifreq` for `name`, or `EINVAL` when the name does not fit.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: `ifreq` is plain data (a name and a union of plain data); all
    // zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() || name.as_bytes().contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

/// A datagram socket of the current network namespace, for interface
/// ioctls.
fn ioctl_socket() -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2) call; no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just opened and own alone.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The hardware (MAC) address of the interface `name` in the current
/// network namespace (`SIOCGIFHWADDR`).
///
/// # Errors
///
/// The `socket` or `ioctl` error (`ENODEV` for no such interface).
pub fn if_hwaddr(name: &str) -> io::Result<[u8; 6]> {
    use std::os::fd::AsRawFd;
    let sock = ioctl_socket()?;
    let mut req = ifreq(name)?;
    // SAFETY: `req` is a valid `ifreq` naming the interface, writable for
    // the kernel's answer; the socket is open.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member of the union.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data) {
        *d = s as u8;
    }
    Ok(mac)
}

/// `struct ethtool_drvinfo` of `linux/ethtool.h`.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}
const _: () = assert!(size_of::<EthtoolDrvinfo>() == 196);

/// `ETHTOOL_GDRVINFO`.
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
/// `SIOCETHTOOL`.
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// The driver name of the interface `name` (`"veth"`, `"mlx5_core"`, ...)
/// in the current network namespace (`ETHTOOL_GDRVINFO`).
///
/// # Errors
///
/// The `socket` or `ioctl` error (`EOPNOTSUPP` for a device without
/// ethtool support).
pub fn if_driver(name: &str) -> io::Result<String> {
    use std::os::fd::AsRawFd;
    let sock = ioctl_socket()?;
    let mut req = ifreq(name)?;
    // SAFETY: all-zero is a valid `ethtool_drvinfo` (integers and bytes).
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    req.ifr_ifru.ifru_data = (&raw mut info).cast();
    // SAFETY: `req` names the interface and points to `info`, a writable
    // `ethtool_drvinfo` that outlives the call; the socket is open.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &mut req) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(info.driver.len());
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// Every address configured on an interface of the current network
/// namespace (`getifaddrs`): the destinations the kernel accepts for a
/// socket bound to the wildcard address.
///
/// # Errors
///
/// The `getifaddrs` error.
pub fn host_addrs() -> io::Result<Vec<std::net::IpAddr>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for the list pointer.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive
        // until freeifaddrs below.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null `ifa_addr` points to a sockaddr whose
            // family says which struct it is.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a `sockaddr_in`.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a `sockaddr_in6`.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference
    // into the list outlives this point.
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_no_mac_and_unknown_interfaces_are_errors() {
        assert_eq!(if_hwaddr("lo").unwrap(), [0; 6]);
        assert_eq!(if_hwaddr("no-such-if0").unwrap_err().raw_os_error(), Some(libc::ENODEV));
        assert!(if_hwaddr("a-name-too-long-for-ifreq").is_err());
        assert!(if_driver("no-such-if0").is_err());
    }

    #[test]
    fn host_addresses_are_sorted_and_unique() {
        let a = host_addrs().unwrap();
        assert!(a.windows(2).all(|w| w[0] < w[1]), "{a:?}");
    }
}
