//! The system calls the XDP backend (`transport::xdp`) makes itself, through nix where it has
//! them: interface lookup (index, MAC, driver), the host's addresses, the
//! BPF file system mount, waiting on sockets, and the page-aligned UMEM area
//! of AF_XDP. Every `unsafe` of the backend outside `xsk.rs` is here.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::ifaddrs::getifaddrs;
use nix::mount::{MsFlags, mount};
use nix::net::if_::if_nametoindex;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::statfs::{BPF_FS_MAGIC, statfs};
use nix::sys::time::TimeSpec;

/// The index of the interface `name`, `None` if there is none.
pub fn if_index(name: &str) -> Option<u32> {
    if_nametoindex(name).ok().filter(|&i| i != 0)
}

/// Whether `path` is on a BPF file system.
pub fn is_bpffs(path: &Path) -> bool {
    statfs(path).is_ok_and(|st| st.filesystem_type() == BPF_FS_MAGIC)
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
    mount(Some("bpf"), path, Some("bpf"), MsFlags::empty(), None::<&str>)?;
    log::info!("mounted a BPF file system at {}", path.display());
    Ok(())
}

/// Page size of the huge pages asked for: 2 MiB (`MAP_HUGE_2MB`), the one
/// x86-64 and arm64 (4 KiB base pages) both offer.
const HUGE_PAGE_SHIFT: u8 = 21;

/// Whether the first UMEM's choice of pages has been logged.
static UMEM_PAGES_LOGGED: AtomicBool = AtomicBool::new(false);

/// An anonymous, page-aligned, private mapping: the UMEM of AF_XDP sockets.
/// On huge pages when the system has some reserved (`vm.nr_hugepages`),
/// fewer TLB misses per packet; on normal pages otherwise.
#[derive(Debug)]
pub struct UmemArea {
    map: MmapRaw,
    /// Bytes asked for; the mapping may be longer (rounded to a huge page).
    len: usize,
    huge: bool,
}

impl UmemArea {
    /// Maps `len` bytes, populated, on huge pages if the system can give
    /// them, else on normal pages; the first area of the process logs which
    /// (one line).
    ///
    /// # Errors
    ///
    /// The `mmap` error with normal pages.
    pub fn new(len: usize) -> io::Result<Self> {
        let huge_len = len.next_multiple_of(1 << HUGE_PAGE_SHIFT);
        let huge = MmapOptions::new().len(huge_len).huge(Some(HUGE_PAGE_SHIFT)).populate().map_anon();
        let first = !UMEM_PAGES_LOGGED.swap(true, Ordering::Relaxed);
        let level = if first { log::Level::Info } else { log::Level::Debug };
        let (map, huge) = match huge {
            Ok(map) => {
                log::log!(level, "AF_XDP UMEM: {len} bytes on 2 MiB huge pages");
                (map, true)
            }
            Err(e) => {
                log::log!(level, "AF_XDP UMEM: no 2 MiB huge pages ({e}; see vm.nr_hugepages), using normal pages");
                (MmapOptions::new().len(len).populate().map_anon()?, false)
            }
        };
        Ok(Self { map: map.into(), len, huge })
    }

    /// Whether the area lies on huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// The whole area, for `xdpilone::Umem::new`: page-aligned (mmap).
    pub fn as_non_null(&self) -> NonNull<[u8]> {
        let ptr = NonNull::new(self.map.as_mut_ptr()).expect("mmap never maps address 0");
        NonNull::slice_from_raw_parts(ptr, self.len)
    }

    /// Bytes `offset..offset + len` of the area, `None` when out of bounds.
    ///
    /// # Safety
    ///
    /// The caller must own that part of the area for the lifetime of the
    /// slice: the kernel hands a frame to user space through the RX ring
    /// and does not write it again until it is put back on the fill ring,
    /// so the slice of a received descriptor must be gone before its frame
    /// is.
    pub unsafe fn get(&self, offset: u64, len: u32) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `start..end` lies within the mapping, which lives as long
        // as `self`; the caller owns the frame (see above), so the kernel
        // does not write it while the slice is alive.
        Some(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(start), end - start) })
    }
}

/// An epoll set watching `fds` for input (level-triggered): readable itself
/// whenever one of them is, so one descriptor can stand for all in an event
/// loop.
///
/// # Errors
///
/// `epoll_create1` or `epoll_ctl`.
pub fn epoll_set<'a>(fds: impl IntoIterator<Item = std::os::fd::BorrowedFd<'a>>) -> io::Result<std::os::fd::OwnedFd> {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    for (i, fd) in fds.into_iter().enumerate() {
        ep.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))?;
    }
    Ok(ep.0)
}

/// Waits until one of `fds` (at most 16) is readable or `timeout` passes;
/// returns a bit mask of the readable ones (bit `i` for the `i`-th). `EINTR`
/// counts as "none yet". Allocates nothing.
///
/// # Errors
///
/// The `ppoll` error, or more than 16 descriptors.
pub fn poll_readable<'a>(
    fds: impl IntoIterator<Item = BorrowedFd<'a>>,
    timeout: std::time::Duration,
) -> io::Result<u16> {
    let mut fds = fds.into_iter();
    let Some(first) = fds.next() else {
        std::thread::sleep(timeout);
        return Ok(0);
    };
    // Slots past the last descriptor repeat the first one; only `..n` is
    // passed to the kernel.
    let mut pfds: [PollFd<'a>; 16] = std::array::from_fn(|_| PollFd::new(first, PollFlags::POLLIN));
    let mut n = 1;
    for fd in fds {
        let slot = pfds.get_mut(n).ok_or_else(|| io::Error::other("poll: more than 16 descriptors"))?;
        *slot = PollFd::new(fd, PollFlags::POLLIN);
        n += 1;
    }
    // ppoll, not poll: loss-recovery timers wait for fractions of a
    // millisecond.
    match ppoll(&mut pfds[..n], Some(TimeSpec::from_duration(timeout)), None) {
        Ok(_) => {}
        Err(Errno::EINTR) => return Ok(0),
        Err(e) => return Err(e.into()),
    }
    let mut mask = 0u16;
    for (i, p) in pfds[..n].iter().enumerate() {
        // Unknown revents bits count as an event too.
        if p.any().unwrap_or(true) {
            mask |= 1 << i;
        }
    }
    Ok(mask)
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
fn ioctl_socket() -> io::Result<OwnedFd> {
    Ok(socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?.into())
}

/// Interface ioctls, typed: each takes an `ifreq` naming the interface.
mod ioctl {
    nix::ioctl_readwrite_bad!(
        /// `SIOCGIFHWADDR`: the hardware address, into `ifr_hwaddr`.
        get_hwaddr,
        libc::SIOCGIFHWADDR,
        libc::ifreq
    );
    nix::ioctl_readwrite_bad!(
        /// `SIOCETHTOOL`: the ethtool command that `ifr_data` points to.
        ethtool,
        super::SIOCETHTOOL,
        libc::ifreq
    );
}

/// The hardware (MAC) address of the interface `name` in the current
/// network namespace (`SIOCGIFHWADDR`).
///
/// # Errors
///
/// The `socket` or `ioctl` error (`ENODEV` for no such interface).
pub fn if_hwaddr(name: &str) -> io::Result<[u8; 6]> {
    let sock = ioctl_socket()?;
    let mut req = ifreq(name)?;
    // SAFETY: the socket is open and `req` is a live `ifreq` naming the
    // interface, the argument SIOCGIFHWADDR reads and writes.
    unsafe { ioctl::get_hwaddr(sock.as_raw_fd(), &mut req) }?;
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
#[derive(Clone, Copy, bytemuck::Zeroable)]
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

/// A `linux/ethtool.h` command structure: its first field the `u32`
/// command, its size what that command reads and writes.
///
/// # Safety
///
/// Implement only for such `#[repr(C)]` plain-data structures.
unsafe trait EthtoolCmd {}
// SAFETY: the `#[repr(C)]` mirrors of `ethtool_drvinfo`, `ethtool_channels`
// and `ethtool_value` below, each checked against the kernel's size.
unsafe impl EthtoolCmd for EthtoolDrvinfo {}
// SAFETY: as above.
unsafe impl EthtoolCmd for EthtoolChannels {}
// SAFETY: as above.
unsafe impl EthtoolCmd for EthtoolValue {}

/// Runs the ethtool command in `cmd` on the interface `name` through
/// `sock` (which fixes the network namespace the name resolves in); the
/// kernel reads `cmd` and, for a query, fills it.
fn ethtool<T: EthtoolCmd>(sock: BorrowedFd<'_>, name: &str, cmd: &mut T) -> io::Result<()> {
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_data = std::ptr::from_mut(cmd).cast();
    // SAFETY: the socket is open; `req` names the interface and points to
    // `cmd`, an ethtool command structure of the size its command uses
    // (`EthtoolCmd`), writable and alive for the call.
    unsafe { ioctl::ethtool(sock.as_raw_fd(), &mut req) }?;
    Ok(())
}

/// The driver name of the interface `name` (`"veth"`, `"mlx5_core"`, ...)
/// in the current network namespace (`ETHTOOL_GDRVINFO`).
///
/// # Errors
///
/// The `socket` or `ioctl` error (`EOPNOTSUPP` for a device without
/// ethtool support).
pub fn if_driver(name: &str) -> io::Result<String> {
    let mut info: EthtoolDrvinfo = bytemuck::Zeroable::zeroed();
    info.cmd = ETHTOOL_GDRVINFO;
    ethtool(ioctl_socket()?.as_fd(), name, &mut info)?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(info.driver.len());
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// `struct ethtool_channels` of `linux/ethtool.h`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Zeroable)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}
const _: () = assert!(size_of::<EthtoolChannels>() == 36);

/// `ETHTOOL_GCHANNELS`.
const ETHTOOL_GCHANNELS: u32 = 0x0000_003c;

/// Receive queues of the interface `name` in the current network namespace
/// (`ETHTOOL_GCHANNELS`: receive-only plus combined channels). Unlike
/// `/sys/class/net`, which shows the namespace sysfs was mounted in, this
/// asks the calling thread's namespace.
///
/// # Errors
///
/// The `socket` or `ioctl` error (`EOPNOTSUPP` for a driver without
/// channel support).
pub fn if_rx_queues(name: &str) -> io::Result<u32> {
    let mut ch: EthtoolChannels = bytemuck::Zeroable::zeroed();
    ch.cmd = ETHTOOL_GCHANNELS;
    ethtool(ioctl_socket()?.as_fd(), name, &mut ch)?;
    Ok(ch.rx_count + ch.combined_count)
}

/// `struct ethtool_value` of `linux/ethtool.h`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Zeroable)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}
const _: () = assert!(size_of::<EthtoolValue>() == 8);

/// `ETHTOOL_GFLAGS`.
const ETHTOOL_GFLAGS: u32 = 0x0000_0025;
/// `ETHTOOL_SFLAGS`.
const ETHTOOL_SFLAGS: u32 = 0x0000_0026;
/// `ETH_FLAG_TXVLAN`: 802.1Q tags inserted by the NIC on transmit
/// (`tx-vlan-offload`).
pub const ETH_FLAG_TXVLAN: u32 = 1 << 7;
/// `ETH_FLAG_RXVLAN`: 802.1Q tags stripped by the NIC on receive and
/// handed over beside the packet (`rx-vlan-offload`): an XDP program does
/// not see them in the bytes.
pub const ETH_FLAG_RXVLAN: u32 = 1 << 8;

/// The offload flags (`ETH_FLAG_*`) of an interface, through a socket of
/// the network namespace the interface is in (`ETHTOOL_GFLAGS`).
///
/// # Errors
///
/// The `ioctl` error (`ENODEV` for no such interface).
pub fn if_offload_flags(sock: BorrowedFd<'_>, name: &str) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd: ETHTOOL_GFLAGS, data: 0 };
    ethtool(sock, name, &mut v)?;
    Ok(v.data)
}

/// Sets the offload flags (`ETH_FLAG_*`) of an interface (`ETHTOOL_SFLAGS`;
/// needs `CAP_NET_ADMIN`).
///
/// # Errors
///
/// The `ioctl` error: `EOPNOTSUPP` when a flag to change is fixed on this
/// device, `EPERM` without the capability.
pub fn set_if_offload_flags(sock: BorrowedFd<'_>, name: &str, flags: u32) -> io::Result<()> {
    ethtool(sock, name, &mut EthtoolValue { cmd: ETHTOOL_SFLAGS, data: flags })
}

/// A datagram socket of the calling thread's network namespace, for
/// [`if_offload_flags`] and [`set_if_offload_flags`]: interface names
/// resolve in the namespace the socket was made in, whichever thread uses
/// it later.
///
/// # Errors
///
/// The `socket` error.
pub fn netns_socket() -> io::Result<OwnedFd> {
    ioctl_socket()
}

/// Every address configured on an interface of the current network
/// namespace (`getifaddrs`): the destinations the kernel accepts for a
/// socket bound to the wildcard address.
///
/// # Errors
///
/// The `getifaddrs` error.
pub fn host_addrs() -> io::Result<Vec<IpAddr>> {
    let mut out: Vec<IpAddr> = getifaddrs()?
        .filter_map(|ifa| {
            let a = ifa.address?;
            a.as_sockaddr_in()
                .map(|sin| IpAddr::V4(sin.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|sin6| IpAddr::V6(sin6.ip())))
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Whether `name` is a loopback interface (`IFF_LOOPBACK`) of the current
/// network namespace; `false` when there is no such interface.
///
/// # Errors
///
/// The `getifaddrs` error.
pub fn if_is_loopback(name: &str) -> io::Result<bool> {
    Ok(getifaddrs()?
        .any(|ifa| ifa.interface_name == name && ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn loopback_has_no_mac_and_unknown_interfaces_are_errors() {
        assert_eq!(if_hwaddr("lo").unwrap(), [0; 6]);
        assert_eq!(if_hwaddr("no-such-if0").unwrap_err().raw_os_error(), Some(libc::ENODEV));
        assert!(if_hwaddr("a-name-too-long-for-ifreq").is_err());
        assert!(if_driver("no-such-if0").is_err());
        assert!(if_is_loopback("lo").unwrap());
        assert!(!if_is_loopback("no-such-if0").unwrap());
    }

    #[test]
    fn umem_area_is_page_aligned_and_bounds_its_frames() {
        let area = UmemArea::new(64 * 2048).unwrap();
        let whole = area.as_non_null();
        assert_eq!(whole.len(), 64 * 2048);
        let align = if area.is_huge() { 1 << HUGE_PAGE_SHIFT } else { 4096 };
        assert_eq!(whole.cast::<u8>().as_ptr() as usize % align, 0);
        // SAFETY: no kernel shares this area: every frame is ours.
        unsafe {
            assert_eq!(area.get(63 * 2048, 2048).map(<[u8]>::len), Some(2048));
            assert!(area.get(63 * 2048, 2049).is_none());
            assert!(area.get(u64::MAX, 1).is_none());
        }
    }

    #[test]
    fn poll_reports_which_descriptor_is_readable() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let t = std::time::Duration::from_millis(1);
        assert_eq!(poll_readable([a.as_fd(), b.as_fd()], t).unwrap(), 0);
        a.send_to(b"x", b.local_addr().unwrap()).unwrap();
        assert_eq!(poll_readable([a.as_fd(), b.as_fd()], t).unwrap(), 0b10);
        let many = vec![a.as_fd(); 17];
        assert!(poll_readable(many, t).is_err());
    }

    #[test]
    fn host_addresses_are_sorted_and_unique() {
        let a = host_addrs().unwrap();
        assert!(a.windows(2).all(|w| w[0] < w[1]), "{a:?}");
    }
}
