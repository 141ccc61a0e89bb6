//! The UDP backend on real loopback sockets (no privileges needed).

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use leap::transport::udp::{UdpConfig, UdpTransport};
use leap::{FrameKind, Transport, TransportError};
use leap_common::chunk::ChunkHeader;
use leap_common::control::{ControlMessage, ControlType};

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

fn pair(max: usize) -> (UdpTransport, UdpTransport) {
    pair_with(max, |_| {}, |_| {})
}

/// A pair with each side's settings changed by `fa`, `fb`.
fn pair_with(max: usize, fa: impl Fn(&mut UdpConfig), fb: impl Fn(&mut UdpConfig)) -> (UdpTransport, UdpTransport) {
    let (a, b) = (free_addr(), free_addr());
    let mut ca = UdpConfig::new(a, b);
    ca.max_frame_len = max;
    let mut cb = UdpConfig::new(b, a);
    cb.max_frame_len = max;
    cb.prev = Some(a);
    ca.prev = Some(b);
    fa(&mut ca);
    fb(&mut cb);
    let (mut a, mut b) = (UdpTransport::bind(ca).unwrap(), UdpTransport::bind(cb).unwrap());
    settle(&mut a, &mut b);
    (a, b)
}

/// Lets two leap nodes prove to each other that they are (hellos are
/// answered inside `recv_prev`).
fn settle(a: &mut UdpTransport, b: &mut UdpTransport) {
    let mut out = vec![0u8; 64];
    for t in [&mut *a, &mut *b] {
        t.set_recv_timeout(Some(Duration::from_millis(5)));
    }
    for _ in 0..200 {
        if a.neighbours_are_leap() == (true, true) && b.neighbours_are_leap() == (true, true) {
            break;
        }
        let _ = a.recv_prev(&mut out);
        let _ = b.recv_prev(&mut out);
    }
    assert_eq!((a.neighbours_are_leap(), b.neighbours_are_leap()), ((true, true), (true, true)));
    for t in [a, b] {
        t.set_recv_timeout(Some(Duration::from_secs(1)));
    }
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(seed).to_le_bytes()[1]).collect()
}

#[test]
fn frames_of_every_size_arrive_intact() {
    let (mut a, mut b) = pair(1 << 20);
    for (i, len) in [1usize, 1399, 1400, 1401, 16392, 32776, 262152, 1048584 - 8].into_iter().enumerate() {
        let f = pattern(i as u32, len);
        a.send_multipart_next(&f[..len.min(8)], &f[len.min(8)..]).unwrap();
        let mut out = vec![0u8; 1 << 20];
        let got = b.recv_prev(&mut out).unwrap();
        assert_eq!(got.len, len);
        assert_eq!(got.kind, FrameKind::Data);
        assert!(out[..len] == f[..], "frame of {len} bytes differs");
    }
    let s = b.stats();
    assert_eq!(s.frames_received, 8);
    // A's driver may send a tail-loss probe of its last frame while the test
    // prepares the next one: B drops it as stale, nothing else.
    assert_eq!(s.drops.total() - s.drops.stale, 0, "{s:?}");
    assert!(s.drops.stale <= a.stats().probes, "{s:?}");
}

#[test]
fn several_frames_in_flight_arrive_in_order() {
    let (mut a, mut b) = pair(65536);
    let frames: Vec<_> = (0..6).map(|i| pattern(i, 40000)).collect();
    for f in &frames {
        a.send_next(f).unwrap();
    }
    let mut out = vec![0u8; 65536];
    for f in &frames {
        let got = b.recv_prev(&mut out).unwrap();
        assert_eq!(&out[..got.len], &f[..]);
    }
}

#[test]
fn chunks_from_a_stranger_are_dropped_and_counted() {
    let (mut a, mut b) = pair(4096);
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut evil = ChunkHeader::data(0, 0, 1).to_bytes().to_vec();
    evil.extend_from_slice(&[0xEE; 100]);
    stranger.send_to(&evil, b.local_addr().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let f = pattern(7, 3000);
    a.send_next(&f).unwrap();
    let mut out = vec![0u8; 4096];
    let got = b.recv_prev(&mut out).unwrap();
    assert_eq!(&out[..got.len], &f[..]);
    assert_eq!(b.stats().drops.wrong_source, 1);
}

#[test]
fn lost_chunk_gives_a_typed_error_not_a_hang() {
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut cfg = UdpConfig::new(free_addr(), sender.local_addr().unwrap());
    cfg.prev = Some(sender.local_addr().unwrap());
    cfg.max_frame_len = 8192;
    cfg.recv_timeout = Some(Duration::from_millis(200));
    let mut b = UdpTransport::bind(cfg).unwrap();
    // Only chunk 0 of a 3-chunk frame arrives.
    let mut d = ChunkHeader::data(0, 0, 3).to_bytes().to_vec();
    d.extend_from_slice(&[1; 1400]);
    sender.send_to(&d, b.local_addr().unwrap()).unwrap();
    let mut out = vec![0u8; 8192];
    match b.recv_prev(&mut out) {
        Err(TransportError::FrameLost { seq: 0, missing: 2, total: 3 }) => {}
        other => panic!("expected FrameLost, got {other:?}"),
    }
    match b.recv_prev(&mut out) {
        Err(TransportError::Timeout(_)) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(b.stats().frames_lost, 1);
}

#[test]
fn control_frames_are_marked_and_decoded() {
    let (mut a, mut b) = pair(16392);
    let mut msg = ControlMessage::new(ControlType::ResizeChain);
    msg.total_workers = 1;
    msg.ranges[0].end_layer = 32;
    a.send_control(&msg, 16392).unwrap();
    let mut out = vec![0u8; 16392];
    let got = b.recv_prev(&mut out).unwrap();
    assert_eq!(got.kind, FrameKind::Control);
    assert_eq!(ControlMessage::decode(&out[..got.len]).unwrap(), msg);
    // A data frame whose pos has 0xC0DE in its low bytes stays data.
    let mut f = out.clone();
    f[..4].copy_from_slice(&0x0001_C0DEi32.to_ne_bytes());
    a.send_next(&f).unwrap();
    let got = b.recv_prev(&mut out).unwrap();
    assert_eq!(got.kind, FrameKind::Data);
}

/// Sends `n` frames of 16 392 bytes from `a` to `b`, checks each, and
/// returns the datagrams per frame `a` sent.
fn datagrams_per_frame(a: &mut UdpTransport, b: &mut UdpTransport, n: u32) -> f64 {
    let before = a.stats();
    let mut out = vec![0u8; 16392];
    for i in 0..n {
        let f = pattern(i, 16392);
        a.send_next(&f).unwrap();
        let got = b.recv_prev(&mut out).unwrap();
        assert!(out[..got.len] == f[..], "frame {i} differs");
    }
    let s = a.stats();
    assert_eq!(s.frames_sent - before.frames_sent, u64::from(n));
    (s.datagrams_sent - before.datagrams_sent) as f64 / f64::from(n)
}

#[test]
fn frames_travel_as_chunk_trains_between_leap_nodes() {
    // Loopback's MTU (65 536) allows the largest trains, six chunks: a
    // 16 392-byte frame (12 chunks with its CRC) is two datagrams, with
    // GSO and GRO (a super-datagram of trains split twice) and without.
    for offload in [true, false] {
        let set = |c: &mut UdpConfig| (c.gso, c.gro) = (offload, offload);
        let (mut a, mut b) = pair_with(16392, set, set);
        assert_eq!(datagrams_per_frame(&mut a, &mut b, 20), 2.0, "GSO/GRO {offload}");
        let s = b.stats();
        assert_eq!(s.drops.total() - s.drops.stale, 0, "{s:?}");
        assert_eq!(s.chunks_received, 20 * 12, "{s:?}");
    }
}

#[test]
fn trains_off_on_either_side_means_one_chunk_per_datagram() {
    let off = |c: &mut UdpConfig| c.trains = false;
    // The sender does not want them; the receiver does not announce them.
    for (fa, fb) in [(off as fn(&mut UdpConfig), (|_| {}) as fn(&mut UdpConfig)), (|_| {}, off)] {
        let (mut a, mut b) = pair_with(16392, fa, fb);
        assert_eq!(datagrams_per_frame(&mut a, &mut b, 10), 12.0);
    }
    // A receiver that takes trains of two chunks only gets trains of two.
    let (mut a, mut b) = pair_with(16392, |_| {}, |c| c.rx_train_bytes = 2 * 1412 + 100);
    assert_eq!(datagrams_per_frame(&mut a, &mut b, 10), 6.0);
}

#[test]
fn busy_polling_receivers_deliver_frames_with_or_without_cap_net_admin() {
    let (a, b) = (free_addr(), free_addr());
    let mut ca = UdpConfig::new(a, b);
    let mut cb = UdpConfig::new(b, a);
    (ca.prev, cb.prev) = (Some(b), Some(a));
    // Without CAP_NET_ADMIN the kernel refuses SO_BUSY_POLL: one warning,
    // and the receiver still spins 50 us before it sleeps.
    (ca.busy_poll, cb.busy_poll) = (Some(Duration::from_micros(50)), Some(Duration::from_micros(50)));
    let (mut a, mut b) = (UdpTransport::bind(ca).unwrap(), UdpTransport::bind(cb).unwrap());
    settle(&mut a, &mut b);
    let mut out = vec![0u8; 16392];
    for i in 0..50u32 {
        let f = pattern(i, 16392);
        a.send_next(&f).unwrap();
        let got = b.recv_prev(&mut out).unwrap();
        assert!(got.len == f.len() && out == f, "frame {i}");
    }
    assert_eq!(b.stats().frames_received, 50);
}

#[test]
fn frame_length_set_after_binding_is_checked_against_the_largest_frame() {
    let (mut a, mut b) = pair(131_072);
    for len in [1, 16_392, 131_072] {
        b.set_frame_len(len).unwrap();
    }
    for len in [0, 131_073] {
        let e = b.set_frame_len(len).unwrap_err();
        assert!(matches!(&e, TransportError::Setting(s) if s.key == "frame_size"), "{len}: {e}");
    }
    assert!(b.set_frame_len(131_073).unwrap_err().to_string().contains("frame_size = 131073"));
    // Nothing changed for the frames: any length up to the largest arrives.
    b.set_frame_len(164).unwrap();
    b.set_recv_timeout(Some(Duration::from_secs(2)));
    let mut out = vec![0u8; 131_072];
    for len in [32_776, 164] {
        let f = pattern(len as u32, len);
        a.send_next(&f).unwrap();
        let got = b.recv_prev(&mut out).unwrap();
        assert_eq!(&out[..got.len], &f[..]);
    }
}
