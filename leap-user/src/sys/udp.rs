//! Batched UDP I/O: `sendmmsg` with `UDP_SEGMENT` (GSO) control messages and
//! `recvmmsg` with `UDP_GRO`, over buffers owned by the batch so that no
//! call allocates after construction.
//!
//! The batches call `sendmmsg`/`recvmmsg` and walk the control messages
//! through `libc` themselves: nix's versions take the datagrams' slices and
//! control messages as fresh arrays per call, where these reuse their own
//! `iovec`/`mmsghdr` vectors. Socket options and `ppoll` go through nix.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::ptr;

use libc::{UDP_GRO, UDP_SEGMENT};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeSpec;
use nix::{setsockopt_impl, sockopt_impl};
use socket2::SockAddr;

/// Largest number of iovecs the kernel takes in one message.
const IOV_MAX: usize = 1024;
/// GSO: the kernel refuses more than `UDP_MAX_SEGMENTS` segments (64 on
/// 6.x kernels, 128 on newer ones) or a UDP payload beyond 64 KiB; leap
/// stays well below both.
pub const GSO_MAX_SEGMENTS: usize = 44;
/// GSO: most UDP payload bytes in one super-datagram (44 single chunks,
/// or 7 trains of six; below the 65 507 of IPv4 and 65 487 of IPv6).
pub const GSO_MAX_BYTES: usize = GSO_MAX_SEGMENTS * leap_common::chunk::CHUNK_DATAGRAM_MAX;
/// Most pieces one datagram may have (a train of six chunks, each a header
/// and up to three payload slices).
pub const PIECES_MAX: usize = 4 * leap_common::chunk::TRAIN_CHUNKS_MAX;

/// Segments of `seg` bytes one GSO super-datagram may carry.
pub const fn gso_segments_max(seg: usize) -> usize {
    let n = match GSO_MAX_BYTES.checked_div(seg) {
        Some(n) => n,
        None => GSO_MAX_SEGMENTS,
    };
    if n > GSO_MAX_SEGMENTS {
        GSO_MAX_SEGMENTS
    } else if n == 0 {
        1
    } else {
        n
    }
}

/// Control-message space of one message, 8-aligned as `cmsghdr` wants:
/// on receive a `UDP_GRO` int and an `SO_RXQ_OVFL` u32 (`CMSG_SPACE(4)` is
/// 24 bytes each), on send one `UDP_SEGMENT` u16 (`CMSG_SPACE(2)`, 24).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; CMSG_BUF_LEN]);

/// Bytes of a [`CmsgBuf`].
const CMSG_BUF_LEN: usize = 64;

/// A piece of a datagram to send.
pub type Piece<'a> = &'a [u8];

/// Outgoing datagrams, grouped into messages (one per datagram, or one GSO
/// super-datagram per group of equal-sized segments), sent with one
/// `sendmmsg` call per batch.
pub struct TxBatch {
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    ctrl: Vec<CmsgBuf>,
    /// (first iov index, iov count, gso segment size or 0)
    groups: Vec<(usize, usize, u16)>,
}

// SAFETY: the raw pointers in `iov` and `msgs` are only written and read
// inside `send`, where they point into borrowed data that outlives the call;
// between calls they are stale but never dereferenced.
unsafe impl Send for TxBatch {}

impl std::fmt::Debug for TxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxBatch").field("groups", &self.groups.len()).finish()
    }
}

impl Default for TxBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl TxBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self { iov: Vec::new(), msgs: Vec::new(), ctrl: Vec::new(), groups: Vec::new() }
    }

    /// Sends `datagrams` (each a list of at most [`PIECES_MAX`] pieces,
    /// header first) to `dst`. With `gso`, runs of full-size datagrams
    /// (`segment` bytes, the last of a run may be shorter) go out as GSO
    /// messages of up to [`gso_segments_max`] segments; without, one message
    /// per datagram. Returns when every datagram was handed to the kernel.
    ///
    /// # Errors
    ///
    /// The `sendmmsg` error; with GSO, `EIO`/`EINVAL`/`EMSGSIZE` (6.x
    /// kernels: a segment above the interface MTU) mean the path cannot
    /// segment at that size (the caller retries without).
    pub fn send<'a, I, D>(
        &mut self,
        fd: BorrowedFd<'_>,
        dst: &SockAddr,
        datagrams: I,
        gso: Option<u16>,
    ) -> io::Result<()>
    where
        I: IntoIterator<Item = D>,
        D: IntoIterator<Item = Piece<'a>>,
    {
        self.iov.clear();
        self.groups.clear();
        let mut seg_in_group = 0usize;
        let mut group_closed = true;
        let segs_max = gso_segments_max(gso.map_or(0, usize::from));
        for pieces in datagrams {
            let start = self.iov.len();
            let mut len = 0;
            for p in pieces.into_iter().filter(|p| !p.is_empty()) {
                len += p.len();
                self.iov.push(libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() });
            }
            let n = self.iov.len() - start;
            match gso {
                Some(seg) if !group_closed && seg_in_group < segs_max => {
                    let g = self.groups.last_mut().expect("open group");
                    g.1 += n;
                    seg_in_group += 1;
                    group_closed = len != usize::from(seg) || g.1 + PIECES_MAX > IOV_MAX;
                }
                Some(seg) => {
                    self.groups.push((start, n, seg));
                    seg_in_group = 1;
                    group_closed = len != usize::from(seg);
                }
                None => self.groups.push((start, n, 0)),
            }
        }
        self.msgs.clear();
        self.ctrl.resize(self.groups.len(), CmsgBuf([0; CMSG_BUF_LEN]));
        for (i, &(first, count, seg)) in self.groups.iter().enumerate() {
            // SAFETY: mmsghdr is plain data; all-zero is a valid value.
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_name = dst.as_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_namelen = dst.len();
            m.msg_hdr.msg_iov = self.iov[first..].as_mut_ptr();
            m.msg_hdr.msg_iovlen = count;
            if seg != 0 && count > 0 {
                let buf = &mut self.ctrl[i];
                m.msg_hdr.msg_control = buf.0.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE is a pure computation.
                m.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
                // SAFETY: msg_control points to a CmsgBuf (64 bytes,
                // 8-aligned), of which msg_controllen claims CMSG_SPACE(2):
                // room for the one cmsg carrying a u16 written here.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                    ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
                }
            }
            self.msgs.push(m);
        }
        let mut sent = 0;
        let mut full = NoBufs::default();
        while sent < self.msgs.len() {
            let rest = &mut self.msgs[sent..];
            // SAFETY: every msghdr points to `dst`, to iovecs in `self.iov`
            // that point into `datagrams`' slices (alive for this call), and
            // to control buffers in `self.ctrl`; the count is the slice length.
            let n = unsafe { libc::sendmmsg(fd.as_raw_fd(), rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if e.raw_os_error() == Some(libc::ENOBUFS) && full.wait(fd)? {
                    continue;
                }
                return Err(e);
            }
            full = NoBufs::default();
            sent += n as usize;
        }
        Ok(())
    }
}

/// Waiting out `ENOBUFS` (the device's or the qdisc's queue is full, or the
/// socket's send buffer): with `poll` for room in the socket, then a sleep
/// that doubles from [`NoBufs::FIRST`] to [`NoBufs::MOST`] while the queue
/// stays full (the socket may look writable while a queue below it is
/// not), never a spin; given up after [`NoBufs::LIMIT`] of waiting.
#[derive(Debug, Default)]
struct NoBufs {
    waited: std::time::Duration,
    next: std::time::Duration,
}

impl NoBufs {
    const FIRST: std::time::Duration = std::time::Duration::from_micros(20);
    const MOST: std::time::Duration = std::time::Duration::from_millis(2);
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

    /// Waits before the next try; `false` once [`Self::LIMIT`] is spent
    /// (the caller reports `ENOBUFS`).
    fn wait(&mut self, fd: BorrowedFd<'_>) -> io::Result<bool> {
        if self.waited >= Self::LIMIT {
            return Ok(false);
        }
        self.next = self.next.clamp(Self::FIRST, Self::MOST);
        let mut pfd = [PollFd::new(fd, PollFlags::POLLOUT)];
        let writable = match ppoll(&mut pfd, Some(TimeSpec::from_duration(self.next)), None) {
            Ok(n) => n > 0,
            Err(Errno::EINTR) => false,
            Err(e) => return Err(e.into()),
        };
        if writable {
            // Room in the socket, maybe not below it: sleep all the same.
            std::thread::sleep(self.next);
        }
        self.waited += self.next;
        self.next *= 2;
        Ok(true)
    }
}

/// One received datagram (or GRO super-datagram) in a [`RxBatch`].
#[derive(Debug, Clone, Copy)]
pub struct RxMeta {
    /// Bytes received.
    pub len: usize,
    /// GRO segment size, when the kernel coalesced several datagrams.
    pub segment: Option<u16>,
    /// The datagram was larger than the buffer (`MSG_TRUNC`).
    pub truncated: bool,
}

/// Buffers for `recvmmsg`: `count` slots of `slot_len` bytes each.
pub struct RxBatch {
    slot_len: usize,
    bufs: Vec<u8>,
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<CmsgBuf>,
    meta: Vec<RxMeta>,
    filled: usize,
    /// The socket's drop counter (`SO_RXQ_OVFL`), as last reported.
    kernel_drops: Option<u32>,
}

// SAFETY: the raw pointers point into the batch's own heap buffers, which
// move with it; they are refreshed before every call.
unsafe impl Send for RxBatch {}

impl std::fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxBatch").field("slots", &self.msgs.len()).field("filled", &self.filled).finish()
    }
}

impl RxBatch {
    /// `count` slots of `slot_len` bytes.
    pub fn new(count: usize, slot_len: usize) -> Self {
        let count = count.max(1);
        // SAFETY: plain C structs, all-zero is valid.
        let (msg, name): (libc::mmsghdr, libc::sockaddr_storage) = unsafe { (zeroed(), zeroed()) };
        Self {
            slot_len,
            bufs: vec![0; count * slot_len],
            iov: vec![libc::iovec { iov_base: ptr::null_mut(), iov_len: 0 }; count],
            msgs: vec![msg; count],
            names: vec![name; count],
            ctrl: vec![CmsgBuf([0; CMSG_BUF_LEN]); count],
            meta: vec![RxMeta { len: 0, segment: None, truncated: false }; count],
            kernel_drops: None,
            filled: 0,
        }
    }

    /// Receives up to `count` datagrams. With `wait`, blocks (up to the
    /// socket's `SO_RCVTIMEO`) for the first and takes what else is queued
    /// (`MSG_WAITFORONE`); without, returns at once (`MSG_DONTWAIT`).
    /// Returns how many arrived; 0 on timeout or when none is queued.
    ///
    /// # Errors
    ///
    /// The `recvmmsg` error, except `EAGAIN`/`EINTR`, which give 0.
    pub fn recv(&mut self, fd: BorrowedFd<'_>, wait: bool) -> io::Result<usize> {
        self.filled = 0;
        let base = self.bufs.as_mut_ptr();
        for i in 0..self.msgs.len() {
            // SAFETY: i * slot_len + slot_len <= bufs.len(), so the offset
            // stays inside the allocation.
            let slot = unsafe { base.add(i * self.slot_len) };
            self.iov[i] = libc::iovec { iov_base: slot.cast(), iov_len: self.slot_len };
            let h = &mut self.msgs[i].msg_hdr;
            h.msg_iov = &mut self.iov[i];
            h.msg_iovlen = 1;
            h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_control = self.ctrl[i].0.as_mut_ptr().cast();
            h.msg_controllen = self.ctrl[i].0.len();
            h.msg_flags = 0;
        }
        let flags = if wait { libc::MSG_WAITFORONE } else { libc::MSG_DONTWAIT };
        // SAFETY: every msghdr points to buffers owned by self, sized as
        // declared; the vector length is the count passed.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                self.msgs.len() as libc::c_uint,
                flags,
                ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for i in 0..n {
            let m = &self.msgs[i];
            let mut segment = None;
            // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG
            // macros walk within that length.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                        let seg = ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                        segment = u16::try_from(seg).ok();
                    } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_RXQ_OVFL {
                        let drops = ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u32>());
                        self.kernel_drops = Some(drops);
                    }
                    c = libc::CMSG_NXTHDR(&m.msg_hdr, c);
                }
            }
            self.meta[i] = RxMeta {
                len: (m.msg_len as usize).min(self.slot_len),
                segment,
                truncated: m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            };
        }
        self.filled = n;
        Ok(n)
    }

    /// Datagrams the kernel dropped on this socket (receive buffer full)
    /// since [`enable_drop_count`], as the last datagram reported it.
    pub fn kernel_drops(&self) -> Option<u32> {
        self.kernel_drops
    }

    /// Datagrams received by the last [`Self::recv`].
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Whether the last receive got nothing.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Bytes, metadata and source of datagram `i < len()`.
    pub fn get(&self, i: usize) -> (&[u8], RxMeta, Option<SocketAddr>) {
        let meta = self.meta[i];
        let bytes = &self.bufs[i * self.slot_len..i * self.slot_len + meta.len];
        (bytes, meta, sockaddr_to_std(&self.names[i], self.msgs[i].msg_hdr.msg_namelen))
    }
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: the storage is large enough for any address and the kernel set
    // `len`; SockAddr::new takes ownership of a copy.
    let addr = unsafe { SockAddr::new(*ss, len) };
    addr.as_socket()
}

/// Asks the kernel to report with every datagram how many it dropped on
/// this socket (`SO_RXQ_OVFL`): losses before leap sees a packet become a
/// counter. False if the kernel refuses.
pub fn enable_drop_count(fd: BorrowedFd<'_>) -> bool {
    setsockopt(&fd, sockopt::RxqOvfl, &1).is_ok()
}

/// Enables `UDP_GRO` on a socket; false if the kernel lacks it.
pub fn enable_gro(fd: BorrowedFd<'_>) -> bool {
    setsockopt(&fd, sockopt::UdpGroSegment, &true).is_ok()
}

/// Whether the kernel accepts `UDP_SEGMENT` on this socket (GSO).
pub fn gso_supported(fd: BorrowedFd<'_>) -> bool {
    // Setting the socket default to 0 is harmless and proves support.
    setsockopt(&fd, sockopt::UdpGsoSegment, &0).is_ok()
}

sockopt_impl!(
    /// Path MTU discovery mode of IPv4 sends (`IP_MTU_DISCOVER`; nix has none).
    IpMtuDiscover,
    SetOnly,
    libc::IPPROTO_IP,
    libc::IP_MTU_DISCOVER,
    libc::c_int
);
sockopt_impl!(
    /// Path MTU discovery mode of IPv6 sends (`IPV6_MTU_DISCOVER`).
    Ipv6MtuDiscover,
    SetOnly,
    libc::IPPROTO_IPV6,
    libc::IPV6_MTU_DISCOVER,
    libc::c_int
);

/// Makes the socket size its datagrams by the outgoing interface's MTU and
/// ignore ICMP "fragmentation needed" / "packet too big" messages
/// (`IP_PMTUDISC_OMIT`, `IPV6_PMTUDISC_OMIT`, Linux 3.15): anyone on the
/// path can send those, quoting the node's well-known ports, and each one
/// lowers the route's path MTU for ten minutes, below a single chunk if
/// they like (552 bytes), which the kernel then enforces on every GSO send
/// of a socket that listens (`EINVAL`). DNS servers set the same for the
/// same reason. A datagram above the interface MTU is still fragmented
/// locally, and DF is not set, so a smaller link on the way fragments too.
///
/// # Errors
///
/// The `setsockopt` error (a kernel before 3.15).
pub fn ignore_path_mtu_hints(fd: BorrowedFd<'_>, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt(&fd, Ipv6MtuDiscover, &libc::IPV6_PMTUDISC_OMIT)?;
        // The IPv4 side of a dual-stack socket (v4-mapped peers); an
        // IPv6-only socket refuses it, which changes nothing.
        let _ = setsockopt(&fd, IpMtuDiscover, &libc::IP_PMTUDISC_OMIT);
        Ok(())
    } else {
        Ok(setsockopt(&fd, IpMtuDiscover, &libc::IP_PMTUDISC_OMIT)?)
    }
}

/// Sets the receive buffer to `bytes` past `net.core.rmem_max`
/// (`SO_RCVBUFFORCE`).
///
/// # Errors
///
/// `EPERM` without `CAP_NET_ADMIN`.
pub fn force_recv_buffer(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    Ok(setsockopt(&fd, sockopt::RcvBufForce, &bytes)?)
}

/// Sets the send buffer to `bytes` past `net.core.wmem_max`
/// (`SO_SNDBUFFORCE`).
///
/// # Errors
///
/// `EPERM` without `CAP_NET_ADMIN`.
pub fn force_send_buffer(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    Ok(setsockopt(&fd, sockopt::SndBufForce, &bytes)?)
}

/// Waits until `fd` is readable or `timeout` passes, with the kernel's
/// high-resolution timers (`ppoll`): `SO_RCVTIMEO` counts in scheduler
/// ticks, up to 10 ms here, far too coarse for loss-recovery timers.
/// Returns whether it is readable.
///
/// # Errors
///
/// The `ppoll` error, except `EINTR` (false).
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> io::Result<bool> {
    let mut pfd = [PollFd::new(fd, PollFlags::POLLIN)];
    match ppoll(&mut pfd, Some(TimeSpec::from_duration(timeout)), None) {
        Ok(n) => Ok(n > 0),
        Err(Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Bytes of IP and UDP headers in front of a UDP payload: 28 over IPv4, 48
/// over IPv6 (no options, no extension headers).
pub const fn ip_udp_headers(v6: bool) -> usize {
    if v6 { 48 } else { 28 }
}

/// A UDP socket connected to a neighbour, never used to send: the kernel's
/// path MTU towards it (`IP_MTU`, `IPV6_MTU`) can be read from it at any
/// time, in the network namespace it was made in.
#[derive(Debug)]
pub struct RouteProbe {
    socket: socket2::Socket,
    peer: SocketAddr,
    v6: bool,
}

impl RouteProbe {
    /// Connects a socket from `local` (its address; the port is ignored) to
    /// `peer`. Nothing is sent.
    ///
    /// # Errors
    ///
    /// The failed `socket`, `bind` or `connect` (no route, say).
    pub fn connect(local: SocketAddr, peer: SocketAddr) -> io::Result<Self> {
        use socket2::{Domain, Protocol, Socket, Type};
        let socket = Socket::new(Domain::for_address(peer), Type::DGRAM, Some(Protocol::UDP))?;
        // Spoofed ICMP quoting this socket changes no path MTU either.
        let _ = ignore_path_mtu_hints(socket.as_fd(), peer.is_ipv6());
        if local.is_ipv4() == peer.is_ipv4() && !local.ip().is_unspecified() {
            socket.bind(&SocketAddr::new(local.ip(), 0).into())?;
        }
        socket.connect(&peer.into())?;
        Ok(Self { socket, peer, v6: peer.is_ipv6() })
    }

    /// The path MTU towards the peer now, in bytes of IP packet.
    ///
    /// # Errors
    ///
    /// The failed `getsockopt`.
    pub fn mtu(&self) -> io::Result<usize> {
        // A fresh route lookup: the one cached at connect misses path MTU
        // exceptions learned since (the kernel marks it obsolete and
        // `IP_MTU` reads it anyway).
        self.socket.connect(&self.peer.into())?;
        let mtu = if self.v6 {
            ipv6_mtu(self.socket.as_fd())?
        } else {
            nix::sys::socket::getsockopt(&self.socket, sockopt::IpMtu)?
        };
        usize::try_from(mtu).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
    }
}

/// `IPV6_MTU` of a connected socket (nix has no option for it).
fn ipv6_mtu(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes of the sizes given; the
    // kernel writes at most `len` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_MTU, (&raw mut v).cast(), &raw mut len)
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(v) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_is_waited_out_with_growing_sleeps_and_then_given_up() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut full = NoBufs::default();
        let started = std::time::Instant::now();
        let mut waits = 0;
        while full.wait(sock.as_fd()).unwrap() {
            waits += 1;
            assert!(waits <= 600, "still waiting after {waits} waits");
        }
        // 20 us doubling to 2 ms, then 2 ms a wait, until 1 s was waited.
        assert!((490..=510).contains(&waits), "{waits} waits");
        assert!(started.elapsed() >= NoBufs::LIMIT, "gave up after {:?}", started.elapsed());
        assert!(!full.wait(sock.as_fd()).unwrap(), "waits again after giving up");
    }

    #[test]
    fn cmsg_buffer_holds_every_control_message_leap_sends_or_takes() {
        // SAFETY: CMSG_SPACE is a pure computation.
        let (u16_space, int_space) =
            unsafe { (libc::CMSG_SPACE(size_of::<u16>() as u32), libc::CMSG_SPACE(size_of::<libc::c_int>() as u32)) };
        assert!(u16_space as usize <= CMSG_BUF_LEN, "UDP_SEGMENT: {u16_space}");
        assert!(2 * int_space as usize <= CMSG_BUF_LEN, "UDP_GRO and SO_RXQ_OVFL: {int_space} each");
        assert!(align_of::<CmsgBuf>() >= align_of::<libc::cmsghdr>());
    }
}
