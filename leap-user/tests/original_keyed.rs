//! A keyed leap node between stand-ins for the original LEAP UDP endpoint
//! (see `original/mod.rs`): the original is its next and its previous
//! node. Nothing the original sends is taken; it is refused, counted
//! (`drops.unkeyed`, though the original echoes the `AUTH` flag and the
//! trailers it took; the last chunk of each frame, cut short, as
//! `drops.bad_tag`), logged once, and the node says why.

mod original;
mod support;

use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use leap::transport::ring_key::{KeySet, RingKey};
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap::{Transport, TransportError};
use original::{FRAME, Original, Role, data_frame};

#[test]
fn a_keyed_node_refuses_an_original_next_and_previous_node_counts_and_says_why_once() {
    support::LogLines::install();
    let o_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let o_addr = o_sock.local_addr().unwrap();
    let h_addr = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // A ring of two: the keyed head, then the original, back to the head.
    let original = Original::udp(o_sock, h_addr, Role::Worker { compute: Duration::ZERO });
    let mut c = UdpConfig::new(h_addr, o_addr);
    c.prev = Some(o_addr);
    c.max_frame_len = FRAME;
    c.ring_key = Some(KeySet::new(RingKey::from_bytes([3; 32])));
    c.recv_timeout = Some(Duration::from_millis(500));
    let mut head = UdpTransport::bind(c).unwrap();
    let mut buf = vec![0u8; FRAME];
    let mut errors = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    for pos in 0..8 {
        if Instant::now() > end {
            break;
        }
        if let Err(e) = head.send_next(&data_frame(pos)) {
            errors.push(e.to_string());
            continue;
        }
        match head.recv_prev(&mut buf) {
            Ok(got) => panic!("frame {pos}: a frame of {} bytes was taken from the original", got.len),
            Err(e @ TransportError::Timeout(_)) => errors.push(e.to_string()),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let s = head.stats();
    let sent_back = original.report.frames.load(Ordering::Relaxed);
    assert!(sent_back > 0, "the original forwarded nothing: the test saw no unkeyed datagram ({errors:?})");
    assert_eq!(s.frames_received, 0, "{s:?}");
    // The original sends on the keyed node's own chunks, trailers included
    // (its own epoch: unkeyed), except the last chunk of a frame, cut to
    // its frame size: frame data where a trailer would be, which no
    // receiver can tell from a forgery (bad_tag), one per frame.
    assert!(s.drops.unkeyed >= 10 * sent_back, "the original's chunks are counted as unkeyed: {s:?}");
    assert!(s.drops.bad_tag <= sent_back, "at most the last chunk of each frame as a forgery: {s:?}");
    let (next_leap, prev_leap) = head.neighbours_are_leap();
    assert!(!next_leap && !prev_leap, "the original proved nothing");
    let lines = support::LogLines::lines();
    let refused: Vec<&String> = lines.iter().filter(|l| l.contains("sends without the ring key")).collect();
    assert_eq!(refused.len(), 1, "logged once for {} refused datagrams: {lines:#?}", s.drops.unkeyed);
    // The ring says why: in its counters (above) and in that line.
    assert!(refused[0].contains("every node of a keyed ring needs the key"), "{refused:?}");
    assert!(!errors.is_empty());
}
