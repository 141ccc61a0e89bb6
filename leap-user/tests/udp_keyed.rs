//! Keyed datagram rings on loopback: every chunk, train, hello and NACK
//! sealed with the ring key, every frame intact and delivered once; forgers
//! at the previous node's address (raw datagrams, a node with another key,
//! an unkeyed node) deliver nothing and are counted by reason.

use std::net::{SocketAddr, UdpSocket};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leap::transport::ring_key::{KeySet, RingKey};
use leap::transport::udp::{UdpConfig, UdpError, UdpTransport};
use leap::{FrameKind, Transport, TransportError};
use leap_common::chunk::{ChunkHeader, ChunkKind, flags};
use leap_common::hello::Hello;

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

fn keys(k: u8) -> KeySet {
    KeySet::new(RingKey::from_bytes([k; 32]))
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_le_bytes()[2]).collect()
}

fn config(listen: SocketAddr, next: SocketAddr, prev: SocketAddr, k: Option<KeySet>, frame_len: usize) -> UdpConfig {
    let mut c = UdpConfig::new(listen, next);
    c.prev = Some(prev);
    c.ring_key = k;
    c.max_frame_len = frame_len;
    c.recv_timeout = Some(Duration::from_secs(5));
    c
}

/// A keyed ring of three on loopback: node 0 sends `frames` frames of
/// `len` bytes, nodes 1 and 2 forward them, node 0 gets them back.
fn keyed_ring(len: usize, frames: u32, encrypt: bool) {
    let addrs = [free_addr(), free_addr(), free_addr()];
    let k = KeySet { encrypt, ..keys(7) };
    let node = |i: usize| {
        let c = config(addrs[i], addrs[(i + 1) % 3], addrs[(i + 2) % 3], Some(k.clone()), len);
        UdpTransport::bind(c).unwrap()
    };
    let forwarders: Vec<JoinHandle<leap::Stats>> = (1..3)
        .map(|i| {
            let mut t = node(i);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; len];
                for _ in 0..frames {
                    let got = t.recv_prev(&mut buf).unwrap();
                    t.send_next(&buf[..got.len]).unwrap();
                }
                // Answer NACKs for the last frames a while.
                let end = Instant::now() + Duration::from_millis(300);
                t.set_recv_timeout(Some(Duration::from_millis(20)));
                while Instant::now() < end {
                    let _ = t.recv_prev(&mut buf);
                }
                t.stats()
            })
        })
        .collect();
    let mut head = node(0);
    let mut buf = vec![0u8; len];
    for i in 0..frames {
        let f = pattern(i, len);
        head.send_next(&f).unwrap();
        let got = head.recv_prev(&mut buf).unwrap();
        assert_eq!((got.len, got.kind), (len, FrameKind::Data));
        assert!(buf[..len] == f[..], "frame {i} of {len} bytes changed on its way round");
    }
    // None twice: nothing more arrives.
    head.set_recv_timeout(Some(Duration::from_millis(200)));
    assert!(matches!(head.recv_prev(&mut buf), Err(TransportError::Timeout(_))));
    let s = head.stats();
    for st in forwarders.into_iter().map(|f| f.join().unwrap()).chain([s]) {
        assert_eq!((st.frames_lost, st.drops.bad_tag, st.drops.unkeyed), (0, 0, 0), "{st:?}");
    }
    assert_eq!(s.frames_received, u64::from(frames));
}

#[test]
fn a_keyed_ring_of_three_delivers_16392_byte_frames_intact_once() {
    keyed_ring(16_392, 200, false);
}

#[test]
fn a_keyed_ring_of_three_delivers_megabyte_frames_intact_once() {
    keyed_ring(1 << 20, 16, false);
}

#[test]
fn an_encrypted_ring_of_three_delivers_16392_byte_and_megabyte_frames_intact_once() {
    keyed_ring(16_392, 100, true);
    keyed_ring(1 << 20, 8, true);
}

/// A keyed node at `b` takes frames from `a` only; what comes from `a`'s
/// address while forgers hold it is refused.
#[test]
fn forgers_at_the_previous_nodes_address_deliver_nothing_and_are_counted() {
    let (a, b) = (free_addr(), free_addr());
    let mut rx = UdpTransport::bind(config(b, a, a, Some(keys(1)), 1 << 16)).unwrap();
    rx.set_recv_timeout(Some(Duration::from_millis(300)));
    let mut buf = vec![0u8; 1 << 16];
    // Raw datagrams from the previous node's address.
    {
        let s = UdpSocket::bind(a).unwrap();
        let keyed = flags::LEAP | flags::RELIABLE | flags::AUTH;
        let h = |reserved, id, total| ChunkHeader { seq: 0, chunk_id: id, total_chunks: total, reserved }.to_bytes();
        let chunk = |reserved: u16, id: u16, total: u16, n: usize| {
            let mut d = h(reserved, id, total).to_vec();
            d.extend(std::iter::repeat_n(0xA5, n));
            d
        };
        let mut sent = Vec::new();
        // Unkeyed: a data chunk, a control frame, a NACK, a hello, a train,
        // a retransmission (a probe), the original's chunk.
        let unkeyed = flags::LEAP | flags::RELIABLE;
        sent.push(chunk(unkeyed, 0, 1, 100));
        sent.push(chunk(unkeyed | ChunkKind::Control as u16, 0, 1, 100));
        sent.push(chunk(flags::LEAP | ChunkKind::Nack as u16, 0, 1, 4));
        sent.push(Hello::default().to_bytes().to_vec());
        let mut train = chunk(unkeyed, 0, 2, 1400);
        train.extend(chunk(unkeyed, 1, 2, 10));
        sent.push(train);
        sent.push(chunk(unkeyed | flags::RETRANSMIT, 0, 1, 100));
        sent.push(chunk(0, 0, 1, 100));
        let unkeyed_chunks = 8;
        // Keyed flags with made-up trailers: a chunk, a train, a NACK, a hello.
        sent.push(chunk(keyed, 0, 1, 132));
        let mut train = chunk(keyed, 0, 2, 1400);
        train.extend(chunk(keyed, 1, 2, 40));
        sent.push(train);
        sent.push(chunk(flags::LEAP | flags::AUTH | ChunkKind::Nack as u16, 0, 1, 36));
        let mut hello = Hello::default().to_bytes().to_vec();
        hello.extend([0x5A; 32]);
        sent.push(hello);
        let forged_chunks = 5;
        for d in &sent {
            s.send_to(d, b).unwrap();
        }
        assert!(matches!(rx.recv_prev(&mut buf), Err(TransportError::Timeout(_))));
        let d = rx.stats().drops;
        assert_eq!((d.unkeyed, d.bad_tag), (unkeyed_chunks, forged_chunks), "{d:?}");
    }
    // A leap node with another key, then one without a key, at that address.
    for (k, what) in [(Some(keys(2)), "another key"), (None, "no key")] {
        let before = rx.stats().drops;
        let mut forger = UdpTransport::bind(config(a, b, b, k, 1 << 16)).unwrap();
        for i in 0..3 {
            forger.send_next(&pattern(i, 5000)).unwrap();
        }
        assert!(matches!(rx.recv_prev(&mut buf), Err(TransportError::Timeout(_))), "{what}");
        let d = rx.stats().drops;
        assert!(d.bad_tag + d.unkeyed > before.bad_tag + before.unkeyed, "{what}: {d:?}");
        assert!(!forger.neighbours_are_leap().0, "{what}: proved itself to a keyed node");
    }
    assert_eq!(rx.stats().frames_received, 0);
    // The real previous node gets through.
    let mut tx = UdpTransport::bind(config(a, b, b, Some(keys(1)), 1 << 16)).unwrap();
    rx.set_recv_timeout(Some(Duration::from_secs(5)));
    for i in 0..5 {
        let f = pattern(100 + i, 30_000);
        tx.send_next(&f).unwrap();
        let got = rx.recv_prev(&mut buf).unwrap();
        assert!(buf[..got.len] == f[..]);
    }
}

#[test]
fn a_keyed_node_refuses_a_wildcard_address_and_the_originals_format() {
    let any = SocketAddr::from(([0, 0, 0, 0], 0));
    let err = UdpTransport::bind(config(any, free_addr(), free_addr(), Some(keys(1)), 4096)).unwrap_err();
    assert!(matches!(err, UdpError::Keyed(_)), "{err}");
    let mut c = config(free_addr(), free_addr(), free_addr(), Some(keys(1)), 4096);
    c.original_compat = true;
    let err = UdpTransport::bind(c).unwrap_err();
    assert!(err.to_string().contains("original"), "{err}");
}
