//! Helpers shared by the integration tests: child processes that are
//! reaped even when a test fails, and a counting allocator.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Kills the processes it holds when dropped, so that a failing test leaves
/// no node running.
#[derive(Debug, Default)]
pub struct Reaper(pub Vec<u32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // kill(2) on a child of ours; harmless if it is gone.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Waits for `c` at most `limit`, then kills it and fails the test.
pub fn wait_bounded(c: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            panic!("process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGTERM (`ip netns exec` execs the program, so the pid is its).
pub fn terminate(c: &Child) {
    // kill(2) on our own child.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
}

/// Counts allocations; install with `#[global_allocator]`.
#[derive(Debug)]
pub struct Counting;

/// Allocations (and reallocations) so far, all threads.
pub static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations of this thread: the test harness's own threads allocate
    /// at times of their choosing (output, timers), which says nothing
    /// about the code under test.
    static THREAD_ALLOCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn count() {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    // `try_with`: the thread-local may be gone while a thread exits.
    let _ = THREAD_ALLOCS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations made so far by the calling thread (the frame paths under
/// test run on one thread).
pub fn allocations() -> usize {
    THREAD_ALLOCS.with(std::cell::Cell::get)
}

/// Lets leap node `a` and its next node `b` prove to each other that they
/// are leap nodes (hellos are answered inside `recv_prev`, as in a ring),
/// then restores `b`'s receive deadline to `b_timeout`.
pub fn prove_link(
    a: &mut leap::transport::udp::UdpTransport,
    b: &mut leap::transport::udp::UdpTransport,
    b_timeout: Duration,
) {
    use leap::Transport;
    b.set_recv_timeout(Some(Duration::from_millis(2)));
    let mut scratch = vec![0u8; 64];
    for _ in 0..500 {
        if a.neighbours_are_leap().0 && b.neighbours_are_leap().1 {
            break;
        }
        let _ = a.recv_prev(&mut scratch);
        let _ = b.recv_prev(&mut scratch);
    }
    assert!(a.neighbours_are_leap().0 && b.neighbours_are_leap().1, "the two nodes did not prove each other");
    b.set_recv_timeout(Some(b_timeout));
}

/// The Internet checksum of `b`.
fn internet_checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMP "fragmentation needed, next-hop MTU `mtu`" about a UDP datagram
/// from `src` to `dst`: what a router on the path sends, or anyone who
/// knows the ports.
pub fn icmp_frag_needed(src: std::net::SocketAddrV4, dst: std::net::SocketAddrV4, mtu: u16) -> Vec<u8> {
    let mut m = vec![3, 4, 0, 0, 0, 0];
    m.extend(mtu.to_be_bytes());
    // The quoted IPv4 header (1 440 bytes, DF, UDP) and the first 8 bytes
    // of its payload, the UDP header.
    let mut ip = vec![0x45, 0, 0x05, 0xa0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip.extend(src.ip().octets());
    ip.extend(dst.ip().octets());
    let sum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    m.extend(ip);
    m.extend(src.port().to_be_bytes());
    m.extend(dst.port().to_be_bytes());
    m.extend([0x05, 0x8c, 0, 0]);
    let sum = internet_checksum(&m);
    m[2..4].copy_from_slice(&sum.to_be_bytes());
    m
}

/// Sends ICMP `messages` to `to` through a raw socket (root) of the
/// current network namespace.
pub fn send_icmp(to: std::net::Ipv4Addr, messages: &[Vec<u8>]) {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).expect("raw ICMP socket (needs root)");
    for m in messages {
        s.send_to(m, &std::net::SocketAddr::from((to, 0)).into()).expect("sending ICMP");
    }
}

/// At 0 % loss nothing may be lost: no chunk may have arrived only by a
/// retransmission or probe (`chunks_recovered`). Retransmissions are
/// allowed only as copies of chunks that had arrived: a node that saw no
/// new chunk for the NACK delay (250 us) because the CPU was busy elsewhere,
/// as on this shared 2-vCPU host while other builds run, asks for chunks
/// still on their way.
pub fn assert_nothing_lost(receiver: &leap::Stats, what: &str) {
    assert_eq!(receiver.chunks_recovered, 0, "{what}: chunks were lost at 0 % loss: {receiver:?}");
}

/// Two UDP nodes on loopback that are each other's previous and next node.
pub fn udp_pair() -> (leap::transport::udp::UdpTransport, leap::transport::udp::UdpTransport) {
    use leap::transport::udp::{UdpConfig, UdpTransport};
    let port =
        || std::net::SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")));
    let (a, b) = (port(), port());
    let mut ca = UdpConfig::new(a, b);
    ca.prev = Some(b);
    let mut cb = UdpConfig::new(b, a);
    cb.prev = Some(a);
    (UdpTransport::bind(ca).unwrap(), UdpTransport::bind(cb).unwrap())
}

/// Every log line (info and above) of a test binary, kept to look for:
/// [`LogLines::install`] once, then [`LogLines::lines`].
pub struct LogLines(std::sync::Mutex<Vec<String>>);

impl log::Log for LogLines {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

static LOG_LINES: LogLines = LogLines(std::sync::Mutex::new(Vec::new()));

impl LogLines {
    /// Makes this the binary's logger (once per test binary).
    pub fn install() {
        log::set_logger(&LOG_LINES).expect("the first logger of this test binary");
        log::set_max_level(log::LevelFilter::Info);
    }

    /// The lines logged so far.
    pub fn lines() -> Vec<String> {
        LOG_LINES.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// A worker of a test ring: passes every frame from the previous node on
/// to the next unchanged (frames of at most `len` bytes) until `stop` is
/// set or `limit` has passed.
pub fn forward_until(t: &mut dyn leap::Transport, len: usize, stop: &std::sync::atomic::AtomicBool, limit: Duration) {
    let mut buf = vec![0u8; len];
    let end = Instant::now() + limit;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        match t.recv_prev(&mut buf) {
            Ok(got) => t.send_next(&buf[..got.len]).unwrap(),
            Err(leap::TransportError::Timeout(_)) => {}
            Err(e) => panic!("forwarder: {e}"),
        }
    }
}

/// The head of a test ring: sends frame `i` (`pattern(i, len)`), takes it
/// back and checks it is the same, again, until `stop` is set or `limit`
/// has passed; then checks that nothing more comes (no frame twice).
/// Returns how many frames went round.
pub fn round_trips_until(
    t: &mut dyn leap::Transport,
    len: usize,
    pattern: fn(u32, usize) -> Vec<u8>,
    stop: &std::sync::atomic::AtomicBool,
    limit: Duration,
) -> u32 {
    let mut buf = vec![0u8; len];
    let (mut i, end) = (0u32, Instant::now() + limit);
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        let f = pattern(i, len);
        t.send_next(&f).unwrap();
        let got = t.recv_prev(&mut buf).unwrap_or_else(|e| panic!("head: frame {i}: {e}"));
        assert_eq!((got.len, got.kind), (len, leap::FrameKind::Data));
        assert!(buf[..len] == f[..], "frame {i} changed on its way round");
        i += 1;
    }
    t.set_recv_timeout(Some(Duration::from_millis(300)));
    assert!(matches!(t.recv_prev(&mut buf), Err(leap::TransportError::Timeout(_))), "a frame came twice");
    i
}
