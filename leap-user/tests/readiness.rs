//! Event loops over leap on loopback: a zero receive deadline polls once
//! (never blocks), and the readiness descriptor becomes readable when a
//! receive may make progress, also when the library already took the bytes
//! off the socket (the datagram driver completed a frame; a stuck TCP send
//! stashed the previous node's frames) or a new connection waits.

mod support;

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use leap::transport::tcp::{TcpConfig, TcpTransport};
use leap::transport::{FrameReceiver, Halves};
use leap::{FrameKind, Transport, TransportError};

const POLL: Option<Duration> = Some(Duration::ZERO);

fn free_tcp() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

/// Two TCP nodes, each other's next and previous, and where the first
/// listens.
fn tcp_pair(frame_len: usize) -> (TcpTransport, TcpTransport, SocketAddr) {
    let (a, b) = (free_tcp(), free_tcp());
    let cb = TcpConfig::new(b, a, frame_len);
    let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
    let ta = TcpTransport::connect(TcpConfig::new(a, b, frame_len)).unwrap();
    (ta, tb.join().unwrap(), a)
}

/// Whether `fd` becomes readable within `limit`.
fn readable_within(fd: BorrowedFd<'_>, limit: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) if n > 0 => return true,
            Ok(_) if left.is_zero() => return false,
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => panic!("poll: {e}"),
        }
    }
}

fn readable_now(fd: BorrowedFd<'_>) -> bool {
    readable_within(fd, Duration::ZERO)
}

/// Polls once, asserting that it returned at once.
fn poll_once(t: &mut dyn Transport, buf: &mut [u8]) -> Result<leap::transport::Received, TransportError> {
    let start = Instant::now();
    let res = t.recv_prev(buf);
    let took = start.elapsed();
    assert!(took < Duration::from_millis(50), "a receive that polls once took {took:?}");
    res
}

/// An event loop's receive: wait for the readiness descriptor, poll once,
/// again until a frame comes (bounded).
fn recv_evented(t: &mut dyn Transport, buf: &mut [u8]) -> leap::transport::Received {
    let start = Instant::now();
    loop {
        match poll_once(t, buf) {
            Ok(got) => return got,
            Err(e) if e.is_would_block() => {}
            Err(e) => panic!("receive failed: {e}"),
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no frame within 5 s of readiness");
        assert!(readable_within(t.ready_fd().unwrap(), Duration::from_secs(5)), "never readable");
    }
}

#[test]
fn udp_poll_once_never_blocks_and_counts_no_timeout() {
    let (_a, mut b) = support::udp_pair();
    b.set_recv_timeout(POLL);
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..200 {
        let e = poll_once(&mut b, &mut buf).unwrap_err();
        assert!(e.is_would_block() && e.is_timeout(), "{e}");
    }
    let r = b.recv_prev_lent().unwrap_err();
    assert!(r.is_would_block());
    assert_eq!(b.stats().timeouts, 0, "a poll is not a timeout");
    assert!(!readable_now(b.ready_fd().unwrap()), "nothing is there");
    // A real deadline still waits.
    b.set_recv_timeout(Some(Duration::from_millis(30)));
    let start = Instant::now();
    assert!(!b.recv_prev(&mut buf).unwrap_err().is_would_block());
    assert!(start.elapsed() >= Duration::from_millis(25));
    assert_eq!(b.stats().timeouts, 1);
}

#[test]
fn udp_frame_completed_by_the_driver_makes_the_descriptor_readable() {
    let (mut a, mut b) = support::udp_pair();
    support::prove_link(&mut a, &mut b, Duration::from_secs(1));
    b.set_recv_timeout(POLL);
    let mut buf = vec![0u8; 1 << 20];
    // The descriptor is `b`'s (borrowed from it): kept as a number while
    // `b` is used mutably.
    let raw = std::os::fd::AsRawFd::as_raw_fd(&b.ready_fd().unwrap());
    assert!(poll_once(&mut b, &mut buf).unwrap_err().is_would_block());
    let received = b.stats().chunks_received;
    for round in 0..20u8 {
        a.send_next(&vec![round; 16392]).unwrap();
        // The caller stays away: the driver takes the chunks off the socket
        // (after its 1 ms grace) and completes the frame in user space.
        let start = Instant::now();
        while b.stats().chunks_received < received + 12 * u64::from(round + 1) {
            assert!(start.elapsed() < Duration::from_secs(5), "the driver never took the frame");
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: `raw` is `b`'s readiness descriptor, open while `b` lives.
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        assert!(readable_within(fd, Duration::from_secs(2)), "round {round}: completed in user space, not readable");
        assert_eq!(b.stats().frames_received, u64::from(round), "nothing delivered yet");
        let got = poll_once(&mut b, &mut buf).unwrap();
        assert_eq!(got.len, 16392);
        assert!(buf[..16392].iter().all(|&x| x == round));
        assert!(poll_once(&mut b, &mut buf).unwrap_err().is_would_block());
        assert!(!readable_now(fd), "round {round}: readable with nothing to take");
    }
}

#[test]
fn udp_event_loop_on_split_halves_gets_every_frame_in_order() {
    let (mut a, mut b) = support::udp_pair();
    support::prove_link(&mut a, &mut b, Duration::from_secs(1));
    let timeouts = b.stats().timeouts;
    let Halves { sender: _s, mut receiver } = Box::new(b).split().unwrap();
    receiver.set_recv_timeout(POLL);
    let sender = std::thread::spawn(move || {
        for i in 0..300u32 {
            a.send_next(&[i.to_le_bytes().as_slice(), &[7u8; 30_000]].concat()).unwrap();
            if i % 7 == 0 {
                std::thread::sleep(Duration::from_millis(3));
            }
        }
        a
    });
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..300u32 {
        let start = Instant::now();
        let got = loop {
            match receiver.recv_prev(&mut buf) {
                Ok(got) => break got,
                Err(e) if e.is_would_block() => {
                    assert!(start.elapsed() < Duration::from_secs(5), "frame {i} never came");
                    assert!(readable_within(receiver.ready_fd().unwrap(), Duration::from_secs(5)), "frame {i}");
                }
                Err(e) => panic!("frame {i}: {e}"),
            }
        };
        assert_eq!((got.len, u32::from_le_bytes(buf[..4].try_into().unwrap())), (30_004, i));
    }
    sender.join().unwrap();
    assert_eq!(FrameReceiver::stats(&*receiver).timeouts, timeouts, "a poll is not a timeout");
}

#[test]
fn tcp_poll_once_never_blocks_and_keeps_a_partial_frame() {
    let (mut a, mut b, _) = tcp_pair(16392);
    b.set_recv_timeout(POLL);
    let mut buf = vec![0u8; 16392];
    for _ in 0..100 {
        assert!(poll_once(&mut b, &mut buf).unwrap_err().is_would_block());
    }
    assert!(!readable_now(b.ready_fd().unwrap()));
    let frame: Vec<u8> = (0..16392).map(|i| i as u8).collect();
    a.send_next(&frame).unwrap();
    let got = recv_evented(&mut b, &mut buf);
    assert_eq!((got.len, &buf[..]), (16392, &frame[..]));
    assert_eq!(b.stats().timeouts, 0);
    // Back to a real deadline: the socket's read timeout is put back.
    b.set_recv_timeout(Some(Duration::from_millis(30)));
    let start = Instant::now();
    assert!(!b.recv_prev(&mut buf).unwrap_err().is_would_block());
    assert!(start.elapsed() >= Duration::from_millis(25));
}

#[test]
fn tcp_frames_stashed_by_a_stuck_send_make_the_descriptor_readable() {
    const LEN: usize = 16392;
    const BACK: usize = 4;
    const OUT: usize = 600;
    let (mut a, mut b, _) = tcp_pair(LEN);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&a.ready_fd().unwrap());
    // B sends a few frames to A, then waits before it reads anything.
    let bt = std::thread::spawn(move || {
        for i in 0..BACK {
            b.send_next(&vec![i as u8; LEN]).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
        b.set_recv_timeout(Some(Duration::from_secs(5)));
        let mut buf = vec![0u8; LEN];
        for _ in 0..OUT {
            b.recv_prev(&mut buf).unwrap();
        }
        b
    });
    // A's sends outgrow the socket buffers and stall until B reads; meanwhile
    // A drains B's frames into its stash (no deadlock), leaving the stream
    // from B empty.
    std::thread::sleep(Duration::from_millis(50));
    let out = vec![9u8; LEN];
    for _ in 0..OUT {
        a.send_next(&out).unwrap();
    }
    let _b = bt.join().unwrap();
    // SAFETY: `fd` is `a`'s readiness descriptor, open while `a` lives.
    let ready = unsafe { BorrowedFd::borrow_raw(fd) };
    assert!(readable_now(ready), "frames wait in the stash: the descriptor must be readable");
    a.set_recv_timeout(POLL);
    let mut buf = vec![0u8; LEN];
    for i in 0..BACK {
        let got = poll_once(&mut a, &mut buf).unwrap_or_else(|e| panic!("stashed frame {i}: {e}"));
        assert_eq!(got.len, LEN);
        assert!(buf.iter().all(|&x| x == i as u8));
    }
    assert!(poll_once(&mut a, &mut buf).unwrap_err().is_would_block());
    assert!(!readable_now(ready), "the stash is empty");
}

#[test]
fn tcp_reconnect_of_the_previous_node_makes_the_descriptor_readable() {
    let (mut a, b, listen) = tcp_pair(1000);
    a.set_recv_timeout(POLL);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&a.ready_fd().unwrap());
    // SAFETY: `fd` is `a`'s readiness descriptor, open while `a` lives.
    let ready = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut buf = vec![0u8; 1000];
    drop(b);
    // The lost connection shows as readable (end of stream), then reports.
    assert!(readable_within(ready, Duration::from_secs(2)));
    let e = poll_once(&mut a, &mut buf).unwrap_err();
    assert!(matches!(e, TransportError::PeerClosed(_)), "{e}");
    assert!(poll_once(&mut a, &mut buf).unwrap_err().is_would_block());
    assert!(!readable_now(ready), "nothing connects yet");
    // The previous node comes back: the listener wakes the loop.
    let mut again = std::net::TcpStream::connect(listen).unwrap();
    assert!(readable_within(ready, Duration::from_secs(2)), "a waiting connection must wake the loop");
    assert!(poll_once(&mut a, &mut buf).unwrap_err().is_would_block(), "accepted, no frame yet");
    std::io::Write::write_all(&mut again, &[5u8; 1000]).unwrap();
    let got = recv_evented(&mut a, &mut buf);
    assert_eq!(got.len, 1000);
    assert!(buf.iter().all(|&x| x == 5));
}

#[test]
fn udp_send_in_place_begins_commits_and_discards() {
    let (mut a, mut b) = support::udp_pair();
    support::prove_link(&mut a, &mut b, Duration::from_secs(1));
    let mut buf = vec![0u8; 1 << 20];
    assert!(matches!(a.send_next_commit(), Err(TransportError::NotBegun)));
    a.send_next_begin(FrameKind::Data, 5000).unwrap().fill(1);
    // Begun again: the first is discarded, nothing of it sent.
    a.send_next_begin(FrameKind::Data, 3000).unwrap().fill(2);
    a.send_next_commit().unwrap();
    assert!(matches!(a.send_next_commit(), Err(TransportError::NotBegun)));
    let got = b.recv_prev(&mut buf).unwrap();
    assert_eq!(got.len, 3000);
    assert!(buf[..3000].iter().all(|&x| x == 2));
    // Any other send discards a frame begun.
    a.send_next_begin(FrameKind::Data, 100).unwrap().fill(3);
    a.send_next(&[4u8; 200]).unwrap();
    assert!(matches!(a.send_next_commit(), Err(TransportError::NotBegun)));
    assert_eq!(b.recv_prev(&mut buf).unwrap().len, 200);
    assert!(matches!(a.send_next_begin(FrameKind::Data, 0), Err(TransportError::BadFrameLen(0))));
    assert_eq!(a.stats().frames_sent, 2);
}

#[test]
fn tcp_send_in_place_begins_commits_and_discards() {
    let (mut a, mut b, _) = tcp_pair(64);
    let mut buf = vec![0u8; 64];
    assert!(matches!(a.send_next_commit(), Err(TransportError::NotBegun)));
    a.send_next_begin(FrameKind::Data, 64).unwrap().fill(1);
    a.send_next_begin(FrameKind::Data, 64).unwrap().fill(2);
    a.send_next_commit().unwrap();
    b.recv_prev(&mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 2));
    a.send_next_begin(FrameKind::Data, 64).unwrap().fill(3);
    a.send_next(&[4u8; 64]).unwrap();
    assert!(matches!(a.send_next_commit(), Err(TransportError::NotBegun)));
    b.recv_prev(&mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 4));
    assert_eq!(a.stats().frames_sent, 2);
}
