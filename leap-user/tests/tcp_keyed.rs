//! Keyed TCP rings on loopback: both ends prove the ring key, every frame
//! carries its tag (or is encrypted), and nothing a forger in the stream
//! writes is delivered.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leap::transport::ring_key::{KeySet, RingKey};
use leap::transport::tcp::{TcpConfig, TcpFraming, TcpTransport};
use leap::{FrameKind, Transport, TransportError};
use leap_common::control::{ControlMessage, ControlType};

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

fn keys(k: u8, encrypt: bool) -> KeySet {
    KeySet { encrypt, ..KeySet::new(RingKey::from_bytes([k; 32])) }
}

fn config(listen: SocketAddr, next: SocketAddr, frame_len: usize, framing: TcpFraming, k: Option<KeySet>) -> TcpConfig {
    let mut c = TcpConfig::new(listen, next, frame_len);
    c.framing = framing;
    c.ring_key = k;
    c.setup_timeout = Duration::from_secs(10);
    c.recv_timeout = Some(Duration::from_secs(5));
    c
}

/// Two nodes, each other's next and previous.
fn pair(frame_len: usize, framing: TcpFraming, ka: Option<KeySet>, kb: Option<KeySet>) -> (TcpTransport, TcpTransport) {
    let (a, b) = (free_addr(), free_addr());
    let cb = config(b, a, frame_len, framing, kb);
    let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
    let ta = TcpTransport::connect(config(a, b, frame_len, framing, ka)).unwrap();
    (ta, tb.join().unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn keyed_frames_arrive_intact_tagged_or_encrypted_both_framings_both_directions() {
    for framing in [TcpFraming::Raw, TcpFraming::Length] {
        for encrypt in [false, true] {
            let len = 16_392;
            let (mut a, mut b) = pair(len, framing, Some(keys(1, encrypt)), Some(keys(1, encrypt)));
            let mut out = vec![0u8; 1 << 20];
            for i in 0..20u8 {
                let f = pattern(len, i);
                a.send_multipart_next(&f[..8], &f[8..]).unwrap();
                let got = b.recv_prev(&mut out).unwrap();
                assert_eq!((got.len, got.kind), (len, FrameKind::Data));
                assert_eq!(&out[..len], &f[..], "{framing:?} encrypt={encrypt} frame {i}");
            }
            // Written in place (the lending pair), and a control frame.
            a.send_next_with(FrameKind::Data, len, &mut |buf| buf.copy_from_slice(&pattern(len, 99))).unwrap();
            let lent = b.recv_prev_lent().unwrap();
            assert_eq!(lent.bytes(), &pattern(len, 99)[..]);
            drop(lent);
            a.send_control(&ControlMessage::new(ControlType::Ack), len).unwrap();
            assert_eq!(b.recv_prev(&mut out).unwrap().kind, FrameKind::Control);
            // Backwards on the same connections (their other direction's key).
            if framing == TcpFraming::Length {
                b.send_prev(&[1, 2, 3]).unwrap();
                let got = a.recv_next(&mut out).unwrap();
                assert_eq!(&out[..got.len], &[1, 2, 3]);
            }
            let s = b.stats();
            assert_eq!((s.frames_received, s.drops.bad_tag), (22, 0));
        }
    }
}

#[test]
fn a_megabyte_frame_crosses_a_keyed_encrypted_connection() {
    let len = 1 << 20;
    let (mut a, mut b) = pair(0, TcpFraming::Length, Some(keys(2, true)), Some(keys(2, true)));
    let f = pattern(len, 7);
    let sender = std::thread::spawn(move || {
        for _ in 0..4 {
            a.send_next(&f).unwrap();
        }
        a
    });
    let mut out = vec![0u8; len];
    for _ in 0..4 {
        assert_eq!(b.recv_prev(&mut out).unwrap().len, len);
        assert_eq!(out, pattern(len, 7));
    }
    sender.join().unwrap();
}

/// A relay between the previous node and this one that flips one byte of
/// what passes after `after` bytes: a forger in the stream.
fn flipping_relay(to: SocketAddr, after: usize) -> (SocketAddr, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let flipped = Arc::new(AtomicBool::new(false));
    let f = flipped.clone();
    std::thread::spawn(move || {
        let Ok((mut from, _)) = l.accept() else { return };
        let Ok(mut out) = TcpStream::connect(to) else { return };
        let mut back = out.try_clone().unwrap();
        let mut from_w = from.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = back.read(&mut buf) {
                if from_w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        let mut seen = 0usize;
        let mut buf = vec![0u8; 65536];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if seen <= after && after < seen + n && !f.swap(true, Ordering::SeqCst) {
                buf[after - seen] ^= 0x40;
            }
            seen += n;
            if out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    (addr, flipped)
}

#[test]
fn a_byte_altered_in_the_stream_is_never_delivered_and_is_counted() {
    for encrypt in [false, true] {
        let len = 4096;
        let (a_addr, b_addr) = (free_addr(), free_addr());
        // Past the handshake (57 + 32 bytes) and the first two frames.
        let (relay, flipped) = flipping_relay(b_addr, 89 + 2 * (8 + len + 16) + 100);
        let cb = config(b_addr, a_addr, 0, TcpFraming::Length, Some(keys(3, encrypt)));
        let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
        let ta = std::thread::spawn(move || {
            TcpTransport::connect(config(a_addr, relay, 0, TcpFraming::Length, Some(keys(3, encrypt)))).unwrap()
        });
        let mut b = tb.join().unwrap();
        let mut a = ta.join().unwrap();
        b.set_recv_timeout(Some(Duration::from_millis(500)));
        for i in 0..3u8 {
            a.send_next(&pattern(len, i)).unwrap();
        }
        let mut out = vec![0u8; len];
        for i in 0..2u8 {
            b.recv_prev(&mut out).unwrap();
            assert_eq!(out, pattern(len, i));
        }
        let e = b.recv_prev(&mut out).unwrap_err();
        assert!(flipped.load(Ordering::SeqCst));
        assert!(matches!(e, TransportError::Forged { peer: "previous" }), "{e}");
        assert_eq!(b.stats().drops.bad_tag, 1);
        assert_eq!(b.stats().frames_received, 2, "the altered frame was not delivered");
    }
}

#[test]
fn another_key_an_unkeyed_node_or_another_encryption_is_refused() {
    // The connecting side learns why; the accepting side never takes a frame.
    for (ka, kb, want) in [
        (Some(keys(4, false)), Some(keys(5, false)), "another ring key"),
        (Some(keys(4, false)), Some(keys(4, true)), "encryption"),
        (Some(keys(4, false)), None, "not a keyed leap member"),
    ] {
        let (a, b) = (free_addr(), free_addr());
        let mut cb = config(b, a, 64, TcpFraming::Length, kb);
        cb.setup_timeout = Duration::from_secs(3);
        let tb = std::thread::spawn(move || TcpTransport::connect(cb));
        let mut ca = config(a, b, 64, TcpFraming::Length, ka);
        ca.setup_timeout = Duration::from_secs(3);
        let ra = TcpTransport::connect(ca);
        let rb = tb.join().unwrap();
        let e = ra.expect_err("the keyed node refuses");
        let text = e.to_string() + &format!(" {e:?}");
        // A keyed node refuses too; an unkeyed one cannot know (its peer
        // just never sends it a frame).
        assert!(rb.is_err() || want == "not a keyed leap member", "{want}: the other node gets no ring either");
        assert!(
            text.contains(want) || text.contains("ring-key handshake") || matches!(e, TransportError::Timeout(_)),
            "{want}: {text}"
        );
    }
}

#[test]
fn a_rotation_keeps_a_connection_between_a_moved_and_an_unmoved_node() {
    let (old, new) = (RingKey::from_bytes([6; 32]), RingKey::from_bytes([7; 32]));
    let moved = KeySet { previous: Some(old.clone()), ..KeySet::new(new) };
    let (mut a, mut b) = pair(100, TcpFraming::Raw, Some(moved), Some(KeySet::new(old)));
    let mut out = vec![0u8; 100];
    a.send_next(&[5u8; 100]).unwrap();
    b.recv_prev(&mut out).unwrap();
    b.send_next(&[6u8; 100]).unwrap();
    a.recv_prev(&mut out).unwrap();
    assert_eq!(out, [6u8; 100]);
}

#[test]
fn a_key_on_the_kernel_module_transport_is_refused_not_dropped() {
    use leap::transport::settings::Settings;
    let mut s = Settings::new(leap::transport::open::TransportKind::Kmod);
    let dir = std::env::temp_dir().join(format!("leap-keyed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("k");
    let _ = std::fs::remove_file(&p);
    leap::secret_file::create(&p, &RingKey::random().unwrap().to_file_text()).unwrap();
    s.set("key_file", p.to_str().unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let ep = leap::transport::config::Endpoint::new(free_addr(), free_addr());
    let e = leap::transport::open::open(s.kind(), &ep, s.options()).err().expect("refused");
    assert!(e.to_string().contains("key_file") && e.to_string().contains("tcp"), "{e}");
}

/// New keys set on a running node: the established connection keeps the
/// key it proved and goes on (the node warns that it no longer holds
/// that key); the next connection must prove the new one.
#[test]
fn keys_set_while_running_are_proved_by_the_next_connection() {
    use leap::transport::ring_key::{KeyChangeError, ProofError, prove_connecting};
    let len = 4096;
    let (addr, b_addr) = (free_addr(), free_addr());
    let cb = config(b_addr, addr, len, TcpFraming::Length, Some(keys(1, false)));
    let tb = std::thread::spawn(move || TcpTransport::connect(cb).unwrap());
    let mut a = TcpTransport::connect(config(addr, b_addr, len, TcpFraming::Length, Some(keys(1, false)))).unwrap();
    let mut b = tb.join().unwrap();
    support::LogLines::install();
    let retired = || -> Vec<String> {
        let lines = support::LogLines::lines();
        lines.into_iter().filter(|l| l.contains("which this node no longer holds")).collect()
    };
    let control = a.key_control().expect("tcp takes new keys");
    let both = KeySet { previous: Some(RingKey::from_bytes([1; 32])), ..keys(2, false) };
    control.set_keys(both).unwrap();
    assert_eq!(retired(), Vec::<String>::new(), "K1 is still held");
    control.set_keys(keys(2, false)).unwrap();
    // Both connections proved K1, which a no longer holds: a warns of each.
    let warned = retired();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(
        warned.iter().any(|l| l.contains("to the next node"))
            && warned.iter().any(|l| l.contains("from the previous node"))
    );
    assert_eq!(control.set_keys(keys(2, true)), Err(KeyChangeError::Encryption));
    let mut out = vec![0u8; len];
    for i in 0..5u8 {
        b.send_next(&pattern(len, i)).unwrap();
        let got = a.recv_prev(&mut out).unwrap();
        assert_eq!(&out[..got.len], &pattern(len, i)[..], "the proven connection goes on");
    }
    // The previous node goes; whoever connects next must prove K2.
    drop(b);
    a.set_recv_timeout(Some(Duration::from_millis(1500)));
    assert!(a.recv_prev(&mut out).is_err(), "the connection is gone");
    let clients = std::thread::spawn(move || {
        let prove = |k: KeySet| {
            let mut s = TcpStream::connect(addr).unwrap();
            prove_connecting(&mut s, &k, Duration::from_secs(5)).map(|_| s)
        };
        let old = prove(keys(1, false)).map(|_| ());
        let new = prove(keys(2, false));
        (old, new)
    });
    // Accepting (and refusing) happens inside receive calls.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !clients.is_finished() && std::time::Instant::now() < end {
        let _ = a.recv_prev(&mut out);
    }
    let (old, new) = clients.join().unwrap();
    assert!(matches!(old, Err(ProofError::WrongKey)), "{old:?}");
    assert!(new.is_ok(), "{:?}", new.err());
}
