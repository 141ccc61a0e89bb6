//! The XDP backend end to end: two nodes in network namespaces linked by
//! veth pairs pass frames back and forth through AF_XDP and through the ring
//! buffer, in native and generic mode; every frame arrives intact and the
//! program's counters show that the chunks came through XDP, not through
//! the kernel's UDP socket. Needs root and BPF: `cargo xtask ci`.

mod xdp_common;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use leap::netns::{NodeNet, Topology};
use leap::transport::config::Reliability;
use leap::transport::ring_key::{KeySet, RingKey};
use leap::transport::udp::UdpConfig;
use leap::transport::xdp::{AttachMode, AttachedMode, Delivery, XdpCounters, XdpTransport, XdpTransportConfig};
use leap::{FrameKind, Transport};
use leap_common::chunk::{CHUNK_PAYLOAD_MAX, KEYED_PAYLOAD_MAX, chunks_for_stride};
use leap_common::xdp::Counter;
use xdp_common::{in_netns, object, pattern};

const PORT: u16 = 9999;
const MAX_FRAME: usize = 70_000;
/// Frame sizes sent in turn: one byte, chunk edges, Llama-3-8B, a large one.
const SIZES: [usize; 6] = [1, 1400, 1401, 16392, 32776, MAX_FRAME];

fn transport(node: &NodeNet, peer: &NodeNet, delivery: Delivery, mode: AttachMode) -> XdpTransport {
    keyed_transport(node, peer, delivery, mode, None)
}

fn keyed_transport(
    node: &NodeNet,
    peer: &NodeNet,
    delivery: Delivery,
    mode: AttachMode,
    key: Option<KeySet>,
) -> XdpTransport {
    let me = SocketAddr::from((node.addr, PORT));
    let other = SocketAddr::from((peer.addr, PORT));
    let mut udp = UdpConfig::new(me, other);
    udp.prev = Some(other);
    udp.max_frame_len = MAX_FRAME;
    udp.recv_timeout = Some(Duration::from_secs(2));
    // No probes or retransmissions: every chunk is counted exactly once;
    // no CRC trailer: frames keep the chunk counts of the original format.
    udp.reliability = Reliability::BestEffort;
    udp.crc = false;
    udp.ring_key = key;
    let mut cfg = XdpTransportConfig::new(&node.rx_iface, udp, delivery);
    cfg.mode = mode;
    cfg.object = object();
    XdpTransport::open(cfg).expect("open the XDP transport")
}

/// Node 0 sends `frames` frames; node 1 sends each back; node 0 checks
/// them. Returns both nodes' counters and the attach mode.
fn ping_pong(
    delivery: Delivery,
    mode: AttachMode,
    frames: usize,
    key: Option<KeySet>,
) -> (XdpCounters, XdpCounters, AttachedMode, u64) {
    let keyed = key.is_some();
    let topo = Topology::ring(&xdp_common::unique("lxr"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let ready = Arc::new(Barrier::new(2));

    let echo = {
        let (n0, n1, ready, key) = (n0.clone(), n1.clone(), ready.clone(), key.clone());
        std::thread::spawn(move || {
            in_netns(n1.path(), move || {
                let mut t = keyed_transport(&n1, &n0, delivery, mode, key);
                ready.wait();
                let mut buf = vec![0u8; MAX_FRAME];
                for i in 0..frames {
                    let got = t.recv_prev(&mut buf).unwrap_or_else(|e| panic!("echo: frame {i}: {e}"));
                    assert_eq!(got.kind, FrameKind::Data);
                    t.send_next(&buf[..got.len]).unwrap();
                }
                let s = t.stats();
                assert_eq!(s.frames_received, frames as u64);
                t.xdp_counters().unwrap()
            })
        })
    };

    let (head, attached) = in_netns(n0.path(), move || {
        let mut t = keyed_transport(&n0, &n1, delivery, mode, key);
        let attached = t.attached_mode();
        ready.wait();
        let mut buf = vec![0u8; MAX_FRAME];
        for i in 0..frames {
            let len = SIZES[i % SIZES.len()];
            let f = pattern(i as u32, len);
            t.send_multipart_next(&f[..len.min(8)], &f[len.min(8)..]).unwrap();
            let got = t.recv_prev(&mut buf).unwrap_or_else(|e| panic!("head: frame {i}: {e}"));
            assert_eq!(got.len, len, "frame {i}");
            assert!(buf[..len] == f[..], "frame {i} of {len} bytes came back corrupt");
        }
        let s = t.stats();
        assert_eq!(s.frames_received, frames as u64);
        assert_eq!(s.drops.total(), 0, "{:?}", s.drops);
        (t.xdp_counters().unwrap(), attached)
    });
    let echo = echo.join().expect("echo thread");
    // A keyed chunk carries fewer bytes of the frame (its tag is inside).
    let per_chunk = if keyed { KEYED_PAYLOAD_MAX } else { CHUNK_PAYLOAD_MAX };
    let chunks: u64 =
        (0..frames).map(|i| u64::from(chunks_for_stride(SIZES[i % SIZES.len()], per_chunk).unwrap())).sum();
    (head, echo, attached, chunks)
}

fn check(delivery: Delivery, mode: AttachMode, want_mode: AttachedMode) {
    check_keyed(delivery, mode, want_mode, None);
}

fn check_keyed(delivery: Delivery, mode: AttachMode, want_mode: AttachedMode, key: Option<KeySet>) {
    let frames = 300;
    let (head, echo, attached, chunks) = ping_pong(delivery, mode, frames, key);
    assert_eq!(attached, want_mode);
    let via = match delivery {
        Delivery::Xsk => Counter::ToXsk,
        Delivery::RingBuf => Counter::ToRingBuf,
    };
    for (who, c) in [("head", head), ("echo", echo)] {
        // Every chunk of every frame reached user space through XDP.
        assert_eq!(c.get(via), chunks, "{who}: {c}");
        assert_eq!(c.delivered(), chunks, "{who}: {c}");
        for bad in [Counter::Malformed, Counter::WrongSource, Counter::NoSocket, Counter::RingBufFull] {
            assert_eq!(c.get(bad), 0, "{who}: {}: {c}", bad.name());
        }
        // Not chunks: only the hellos by which the two nodes prove each
        // other (a few; they go on to the node's UDP socket).
        assert!(c.get(Counter::NotLeap) <= 8, "{who}: {c}");
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn af_xdp_delivers_every_frame_intact_in_native_mode() {
    check(Delivery::Xsk, AttachMode::Drv, AttachedMode::Drv);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn af_xdp_delivers_every_frame_intact_in_generic_mode() {
    check(Delivery::Xsk, AttachMode::Skb, AttachedMode::Skb);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_delivers_every_frame_intact_in_native_mode() {
    check(Delivery::RingBuf, AttachMode::Drv, AttachedMode::Drv);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_delivers_every_frame_intact_in_generic_mode() {
    check(Delivery::RingBuf, AttachMode::Skb, AttachedMode::Skb);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn af_xdp_delivers_every_keyed_frame_intact_in_native_mode() {
    let key = KeySet::new(RingKey::from_bytes([3; 32]));
    check_keyed(Delivery::Xsk, AttachMode::Drv, AttachedMode::Drv, Some(key));
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_delivers_every_keyed_frame_intact_in_native_mode() {
    let key = KeySet::new(RingKey::from_bytes([3; 32]));
    check_keyed(Delivery::RingBuf, AttachMode::Drv, AttachedMode::Drv, Some(key));
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_delivers_every_encrypted_frame_intact_in_native_mode() {
    let key = KeySet { encrypt: true, ..KeySet::new(RingKey::from_bytes([3; 32])) };
    check_keyed(Delivery::RingBuf, AttachMode::Drv, AttachedMode::Drv, Some(key));
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn chunks_the_program_passes_still_arrive_through_the_udp_socket() {
    let topo = Topology::ring(&xdp_common::unique("lxk"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let ready = Arc::new(Barrier::new(2));
    let frames = 50;
    let receiver = {
        let (n0, n1, ready) = (n0.clone(), n1.clone(), ready.clone());
        std::thread::spawn(move || {
            in_netns(n1.path(), move || {
                let mut t = transport(&n1, &n0, Delivery::Xsk, AttachMode::Drv);
                // No AF_XDP socket at queue 0 any more: the program passes
                // every chunk to the kernel.
                t.program_mut().unregister_xsk(0).unwrap();
                ready.wait();
                let mut buf = vec![0u8; MAX_FRAME];
                for i in 0..frames {
                    let got = t.recv_prev(&mut buf).unwrap();
                    assert!(buf[..got.len] == pattern(i as u32, 16392)[..], "frame {i}");
                }
                (t.xdp_counters().unwrap(), t.chunks_via_kernel())
            })
        })
    };
    in_netns(n0.path(), move || {
        let mut t = transport(&n0, &n1, Delivery::Xsk, AttachMode::Drv);
        ready.wait();
        for i in 0..frames {
            t.send_next(&pattern(i as u32, 16392)).unwrap();
        }
    });
    let (c, via_kernel) = receiver.join().unwrap();
    let chunks = frames as u64 * 12;
    assert_eq!(c.get(Counter::NoSocket), chunks, "{c}");
    assert_eq!(c.get(Counter::ToXsk), 0, "{c}");
    assert_eq!(via_kernel, chunks);
}
