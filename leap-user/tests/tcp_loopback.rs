//! The TCP backend on real loopback sockets.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use leap::transport::tcp::{TcpConfig, TcpFraming, TcpTransport};
use leap::{FrameKind, Transport, TransportError};
use leap_common::control::{ControlMessage, ControlType};

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

/// Two nodes, each other's next and previous: both connect concurrently.
fn pair(frame_len: usize, framing: TcpFraming) -> (TcpTransport, TcpTransport) {
    let (a, b) = (free_addr(), free_addr());
    let mut ca = TcpConfig::new(a, b, frame_len);
    let mut cb = TcpConfig::new(b, a, frame_len);
    ca.framing = framing;
    cb.framing = framing;
    let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
    let ta = TcpTransport::connect(ca).unwrap();
    (ta, tb.join().unwrap())
}

#[test]
fn raw_frames_arrive_back_to_back_intact() {
    let (mut a, mut b) = pair(16392, TcpFraming::Raw);
    let mut out = vec![0u8; 16392];
    for i in 0..50u8 {
        let f: Vec<u8> = (0..16392).map(|k| (k as u8) ^ i).collect();
        a.send_multipart_next(&f[..8], &f[8..]).unwrap();
        let got = b.recv_prev(&mut out).unwrap();
        assert_eq!(got.len, 16392);
        assert_eq!(out, f);
    }
}

#[test]
fn length_framing_carries_sizes_and_control() {
    let (mut a, mut b) = pair(0, TcpFraming::Length);
    let mut out = vec![0u8; 100_000];
    a.send_next(&[7u8; 99_999]).unwrap();
    let got = b.recv_prev(&mut out).unwrap();
    assert_eq!((got.len, got.kind), (99_999, FrameKind::Data));
    let msg = ControlMessage::new(ControlType::Ack);
    a.send_control(&msg, 500).unwrap();
    let got = b.recv_prev(&mut out).unwrap();
    assert_eq!((got.len, got.kind), (500, FrameKind::Control));
    // Backwards on the same connections.
    b.send_prev(&[1, 2, 3]).unwrap();
    let got = a.recv_next(&mut out).unwrap();
    assert_eq!(&out[..got.len], &[1, 2, 3]);
}

#[test]
fn raw_control_is_detected_strictly() {
    let (mut a, mut b) = pair(1000, TcpFraming::Raw);
    let mut out = vec![0u8; 1000];
    a.send_control(&ControlMessage::new(ControlType::Ack), 1000).unwrap();
    assert_eq!(b.recv_prev(&mut out).unwrap().kind, FrameKind::Control);
    let mut f = out.clone();
    f[999] = 1;
    a.send_next(&f).unwrap();
    assert_eq!(b.recv_prev(&mut out).unwrap().kind, FrameKind::Data);
}

#[test]
fn deadline_mid_frame_keeps_the_stream_in_step() {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let mut cb = TcpConfig::new(b_addr, a_addr, 4000);
    cb.recv_timeout = Some(Duration::from_millis(100));
    let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
    // A hand-made previous node that sends half a frame, then the rest.
    let l = TcpListener::bind(a_addr).unwrap();
    let mut to_b = leap::transport::tcp::connect_with_backoff(b_addr, Duration::from_secs(5)).unwrap();
    let (_from_b, _) = l.accept().unwrap();
    let mut b = tb.join().unwrap();
    use std::io::Write;
    let f: Vec<u8> = (0..4000).map(|i| (i % 251) as u8).collect();
    to_b.write_all(&f[..1500]).unwrap();
    let mut out = vec![0u8; 4000];
    assert!(matches!(b.recv_prev(&mut out), Err(TransportError::Timeout(_))));
    to_b.write_all(&f[1500..]).unwrap();
    let mut other = vec![0u8; 4000];
    let got = b.recv_prev(&mut other).unwrap();
    assert_eq!(got.len, 4000);
    assert_eq!(other, f);
}

#[test]
fn listener_binds_only_the_given_address() {
    let a = free_addr();
    let l = leap::transport::tcp::listen(a).unwrap();
    assert_eq!(l.local_addr().unwrap(), a);
}

#[test]
fn raw_frame_length_set_after_connecting_is_what_the_next_receive_reads() {
    // The original engine connects first and learns its frame size after.
    let (mut a, mut b) = pair(16392, TcpFraming::Raw);
    for (len, seed) in [(32_776usize, 1u8), (164, 2), (32_776, 3)] {
        a.set_frame_len(len).unwrap();
        b.set_frame_len(len).unwrap();
        let f: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(seed)).collect();
        a.send_multipart_next(&f[..8], &f[8..]).unwrap();
        let mut out = vec![0u8; len];
        assert_eq!(b.recv_prev(&mut out).unwrap().len, len);
        assert_eq!(out, f, "frame of {len} bytes");
    }
    let refused = b.set_frame_len(0).unwrap_err();
    assert!(matches!(&refused, TransportError::Setting(e) if e.key == "frame_size"), "{refused}");
}

#[test]
fn a_local_user_who_connects_first_from_another_port_is_refused() {
    let (a, b) = (free_addr(), free_addr());
    let (sa, sb) = (free_addr().port(), free_addr().port());
    let mut ca = TcpConfig::new(a, b, 4000);
    let mut cb = TcpConfig::new(b, a, 4000);
    (ca.source_port, ca.prev, ca.prev_port) = (Some(sa), Some(b.ip()), Some(sb));
    (cb.source_port, cb.prev, cb.prev_port) = (Some(sb), Some(a.ip()), Some(sa));
    let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
    // Another local user's process connects to B first, from the right
    // address and an ephemeral port, and writes a frame of its own.
    let start = std::time::Instant::now();
    let mut impostor = loop {
        match std::net::TcpStream::connect(b) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("B never listened: {e}"),
        }
    };
    use std::io::Write;
    let _ = impostor.write_all(&[0xEE; 4000]);
    std::thread::sleep(Duration::from_millis(100));
    let mut ta = TcpTransport::connect(ca).unwrap();
    let mut tb = tb.join().unwrap();
    let mut out = vec![0u8; 4000];
    for i in 0..5u8 {
        ta.send_next(&[i; 4000]).unwrap();
        let got = tb.recv_prev(&mut out).unwrap();
        assert_eq!((got.len, out[0], out[3999]), (4000, i, i), "B took the impostor's bytes");
        tb.send_next(&[i ^ 1; 4000]).unwrap();
        ta.recv_prev(&mut out).unwrap();
        assert_eq!(out[0], i ^ 1);
    }
}

#[test]
fn the_source_port_may_not_be_the_listen_port() {
    let (a, b) = (free_addr(), free_addr());
    let mut c = TcpConfig::new(a, b, 4000);
    c.source_port = Some(a.port());
    match TcpTransport::connect(c) {
        Err(TransportError::Setting(e)) => assert_eq!(e.key, "tcp_source_port", "{e}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
