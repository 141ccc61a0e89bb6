//! Event loops over the XDP backends: a zero receive deadline polls once
//! (never blocks), and the readiness descriptor (an epoll set of the AF_XDP
//! sockets or the ring buffer, the UDP socket and the eventfd) becomes
//! readable for every frame, also one the driver thread already completed
//! while the receiver was away. Two nodes in namespaces; needs root and
//! BPF: `cargo xtask ci` (stage ebpf).

mod xdp_common;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use leap::netns::{NodeNet, Topology};
use leap::transport::udp::UdpConfig;
use leap::transport::xdp::{Delivery, XdpTransport, XdpTransportConfig};
use leap::{Transport, TransportError};
use xdp_common::{in_netns, object, pattern};

const PORT: u16 = 9999;
const LEN: usize = 16392;
const FRAMES: u32 = 300;

fn transport(node: &NodeNet, peer: &NodeNet, delivery: Delivery) -> XdpTransport {
    let me = SocketAddr::from((node.addr, PORT));
    let other = SocketAddr::from((peer.addr, PORT));
    let mut udp = UdpConfig::new(me, other);
    udp.prev = Some(other);
    udp.max_frame_len = LEN;
    let mut cfg = XdpTransportConfig::new(&node.rx_iface, udp, delivery);
    cfg.object = object();
    XdpTransport::open(cfg).expect("open the XDP transport")
}

/// Lets the two nodes prove each other leap nodes before the event loop:
/// short blocking receives answer and send hellos. (A first frame that
/// races its sender's proof can be read as the original's and dropped as
/// too long; that race is the handshake's, not the event loop's.)
fn settle(t: &mut XdpTransport) {
    let mut buf = vec![0u8; LEN];
    t.set_recv_timeout(Some(Duration::from_millis(20)));
    for _ in 0..15 {
        let _ = t.recv_prev(&mut buf);
    }
    t.set_recv_timeout(Some(Duration::ZERO));
}

fn readable_within(fd: BorrowedFd<'_>, limit: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let ms = u16::try_from(limit.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0)
}

/// Polls once until a frame comes, waiting on the readiness descriptor in
/// between (bounded).
fn recv_evented(t: &mut XdpTransport, buf: &mut [u8], what: &str, limit: Duration) -> usize {
    let fd = t.ready_fd().unwrap().as_raw_fd();
    let start = Instant::now();
    loop {
        let polled = Instant::now();
        match t.recv_prev(buf) {
            Ok(got) => return got.len,
            Err(e) if e.is_would_block() => {}
            Err(e) => panic!("{what}: {e}"),
        }
        assert!(polled.elapsed() < Duration::from_millis(50), "{what}: a poll took {:?}", polled.elapsed());
        assert!(start.elapsed() < limit, "{what}: no frame within {limit:?}");
        // SAFETY: `fd` is the transport's readiness descriptor, open while
        // the transport lives.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        if !readable_within(fd, limit) {
            let again = t.recv_prev(buf).map(|g| g.len);
            panic!("{what}: never readable; a receive now: {again:?}; {:?}; {}", t.stats(), t.xdp_counters().unwrap());
        }
    }
}

fn event_loop(delivery: Delivery) {
    let topo = Topology::ring(&xdp_common::unique("lxe"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let ready = Arc::new(Barrier::new(2));
    let echo = {
        let (n0, n1, ready) = (n0.clone(), n1.clone(), ready.clone());
        std::thread::spawn(move || {
            in_netns(n1.path(), move || {
                let mut t = transport(&n1, &n0, delivery);
                ready.wait();
                settle(&mut t);
                ready.wait();
                let mut buf = vec![0u8; LEN];
                for i in 0..FRAMES {
                    if i % 10 == 5 {
                        // Away long enough for the driver to take the frame
                        // off the sockets: the eventfd must say so.
                        std::thread::sleep(Duration::from_millis(20));
                        let fd = t.ready_fd().unwrap().as_raw_fd();
                        // SAFETY: the transport's descriptor, open while `t` lives.
                        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
                        assert!(readable_within(fd, Duration::from_secs(2)), "echo: frame {i} did not wake the loop");
                    }
                    let len = recv_evented(&mut t, &mut buf, &format!("echo frame {i}"), Duration::from_secs(3));
                    t.send_next(&buf[..len]).unwrap();
                }
                assert!(matches!(t.recv_prev(&mut buf), Err(e) if e.is_would_block()));
                t.stats()
            })
        })
    };
    let head = in_netns(n0.path(), move || {
        let mut t = transport(&n0, &n1, delivery);
        ready.wait();
        settle(&mut t);
        ready.wait();
        let mut buf = vec![0u8; LEN];
        for i in 0..FRAMES {
            let f = pattern(i, LEN);
            t.send_next(&f).unwrap();
            let len = recv_evented(&mut t, &mut buf, &format!("head frame {i}"), Duration::from_secs(6));
            assert!(len == LEN && buf[..] == f[..], "frame {i} came back changed");
        }
        let e: TransportError = t.recv_prev(&mut buf).unwrap_err();
        assert!(e.is_would_block(), "{e}");
        t.stats()
    });
    let echo = echo.join().expect("echo thread");
    for (who, s) in [("head", head), ("echo", echo)] {
        assert_eq!(s.frames_received, u64::from(FRAMES), "{who}");
        assert_eq!(s.timeouts, 15, "{who}: a poll is not a timeout (15: the settling receives)");
    }
    drop(topo);
}

#[test]
#[ignore = "needs root and BPF: run by cargo xtask ci (stage ebpf)"]
fn af_xdp_event_loop_gets_every_frame_and_wakes_for_driver_completed_ones() {
    event_loop(Delivery::Xsk);
}

#[test]
#[ignore = "needs root and BPF: run by cargo xtask ci (stage ebpf)"]
fn ring_buffer_event_loop_gets_every_frame_and_wakes_for_driver_completed_ones() {
    event_loop(Delivery::RingBuf);
}
