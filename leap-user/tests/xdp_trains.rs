//! Chunk trains (several chunks in one UDP datagram) through the XDP
//! program: the multi-buffer entry point (`leap_xdp_frags`) is the one
//! loaded, every chunk header of a train is checked (one bad one makes the
//! whole datagram malformed), the ring buffer gets one record per chunk,
//! datagrams longer than any train and trains the ring buffer has no room
//! for go to the kernel's UDP socket; and end to end at a 9000-byte MTU,
//! trains crafted by hand arrive whole through AF_XDP (multi-buffer) and
//! the ring buffer, and a 3-node ring runs with the frags program attached
//! natively. Needs root and BPF: `cargo xtask ci`.

mod xdp_common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use leap::netns::{NodeNet, Topology};
use leap::transport::config::Reliability;
use leap::transport::udp::UdpConfig;
use leap::transport::xdp::packet::{ChecksumFill, FrameSpec};
use leap::transport::xdp::{
    AttachMode, AttachedMode, Delivery, ProgramKind, XdpCounters, XdpProgram, XdpTransport, XdpTransportConfig,
};
use leap::{FrameKind, Transport};
use leap_common::chunk::{
    CHUNK_DATAGRAM_MAX, CHUNK_PAYLOAD_MAX, ChunkHeader, ChunkKind, TRAIN_CHUNKS_MAX, TRAIN_DATAGRAM_MAX, chunks_for,
};
use leap_common::xdp::{Counter, PeerRule, RingRecord, XdpConfig, cfg, delivery};
use xdp_common::{in_netns, object, pattern};

const PORT: u16 = 9999;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

fn src() -> SocketAddr {
    "10.1.0.1:7000".parse().unwrap()
}

/// The chunks of frame `seq` (`frame` split as a leap sender splits it),
/// each with its header, original-style (`reserved` 0: data).
fn chunks_of(seq: u16, frame: &[u8]) -> Vec<Vec<u8>> {
    let total = chunks_for(frame.len()).unwrap();
    frame
        .chunks(CHUNK_PAYLOAD_MAX)
        .enumerate()
        .map(|(i, p)| {
            let hdr = ChunkHeader { seq, chunk_id: i as u16, total_chunks: total, reserved: 0 };
            let mut c = hdr.to_bytes().to_vec();
            c.extend_from_slice(p);
            c
        })
        .collect()
}

/// Ethernet + IPv4 + UDP from [`src`] to port 9999 carrying `payload`.
fn packet(payload: &[u8]) -> Vec<u8> {
    FrameSpec {
        src_mac: [0x02, 0, 0, 0, 0, 2],
        dst_mac: [0x02, 0, 0, 0, 0, 1],
        vlan: None,
        src: src(),
        dst: "10.1.0.2:9999".parse().unwrap(),
        checksum: ChecksumFill::Zero,
        payload,
    }
    .build()
}

/// A program of `kind` picking chunks up on port 9999 with `delivery`;
/// `ring_bytes` resizes its ring buffer.
fn program(kind: ProgramKind, delivery: u32, flags: u32, ring_bytes: Option<u32>) -> XdpProgram {
    let mut p = XdpProgram::load_kind(&object(), ring_bytes, kind).expect("the verifier takes the program");
    p.add_port(PORT).unwrap();
    p.configure(&XdpConfig { delivery, flags, ..XdpConfig::default() }).unwrap();
    p
}

/// Runs `packet` through `prog`; returns the action and what the counters
/// moved by.
fn run(prog: &XdpProgram, packet: &[u8]) -> (u32, XdpCounters) {
    let before = prog.counters().unwrap();
    let action = prog.test_run(packet).unwrap();
    (action, prog.counters().unwrap().since(&before))
}

/// A train of six full chunks (an 8 400-byte frame) and its chunks.
fn full_train() -> (Vec<u8>, Vec<Vec<u8>>) {
    let chunks = chunks_of(3, &pattern(3, TRAIN_CHUNKS_MAX * CHUNK_PAYLOAD_MAX));
    assert_eq!(chunks.len(), TRAIN_CHUNKS_MAX);
    (chunks.concat(), chunks)
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn the_multi_buffer_program_is_loaded_where_the_kernel_takes_it() {
    let p = XdpProgram::load(&object()).unwrap();
    assert_eq!(p.kind(), ProgramKind::Frags, "this kernel (≥ 5.18) takes multi-buffer XDP");
    for kind in [ProgramKind::Frags, ProgramKind::Linear] {
        let p = XdpProgram::load_kind(&object(), None, kind).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(p.kind(), kind);
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn a_six_chunk_train_becomes_six_ring_records_in_a_multi_buffer_packet() {
    let (train, chunks) = full_train();
    assert_eq!(train.len(), TRAIN_DATAGRAM_MAX);
    let mut prog = program(ProgramKind::Frags, delivery::RING_BUF, 0, None);
    let mut ring = prog.take_ring_buf().unwrap();
    // 8 514 bytes: the test run spreads it over a linear part and fragments.
    let (action, c) = run(&prog, &packet(&train));
    assert_eq!((action, c.get(Counter::ToRingBuf), c.total()), (XDP_DROP, 1, 1), "{c}");
    for (i, want) in chunks.iter().enumerate() {
        let item = ring.next().unwrap_or_else(|| panic!("record {i} missing"));
        let rec: RingRecord = bytemuck::pod_read_unaligned(&item[..size_of::<RingRecord>()]);
        assert_eq!(rec.datagram(), Some(&want[..]), "record {i}");
        assert_eq!(rec.source(), src());
        assert_eq!(rec.dst_port, PORT);
    }
    assert!(ring.next().is_none(), "one record per chunk, no more");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn both_programs_take_a_train_in_one_buffer() {
    // Two chunks, the second short: fits the linear program's buffer.
    let chunks = chunks_of(9, &pattern(9, CHUNK_PAYLOAD_MAX + 100));
    let train = chunks.concat();
    for kind in [ProgramKind::Frags, ProgramKind::Linear] {
        let mut prog = program(kind, delivery::RING_BUF, 0, None);
        let mut ring = prog.take_ring_buf().unwrap();
        let (action, c) = run(&prog, &packet(&train));
        assert_eq!((action, c.get(Counter::ToRingBuf)), (XDP_DROP, 1), "{kind}: {c}");
        for want in &chunks {
            let item = ring.next().expect("a record per chunk");
            let rec: RingRecord = bytemuck::pod_read_unaligned(&item[..size_of::<RingRecord>()]);
            assert_eq!(rec.datagram(), Some(&want[..]), "{kind}");
        }
        assert!(ring.next().is_none());
        // AF_XDP delivery: no socket bound, so the whole train is passed.
        let prog = program(kind, delivery::XSK, 0, None);
        let (action, c) = run(&prog, &packet(&train));
        assert_eq!((action, c.get(Counter::NoSocket)), (XDP_PASS, 1), "{kind}: {c}");
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn a_train_with_one_bad_chunk_is_malformed_and_delivers_nothing() {
    let (_, chunks) = full_train();
    let bad_magic = |c: &mut Vec<u8>| c[0] ^= 0xFF;
    let id_beyond_total = |c: &mut Vec<u8>| c[6..8].copy_from_slice(&99u16.to_be_bytes());
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for k in [1, 3, TRAIN_CHUNKS_MAX - 1] {
        for (what, spoil) in
            [("bad magic", &bad_magic as &dyn Fn(&mut Vec<u8>)), ("chunk_id >= total", &id_beyond_total)]
        {
            let mut c = chunks.clone();
            spoil(&mut c[k]);
            cases.push((format!("{what} in chunk {k}"), c.concat()));
        }
    }
    // A last piece too short for a header.
    let mut short = chunks[..2].concat();
    short.extend_from_slice(&[0x4C, 0x45, 0x41, 0x50, 0, 0]);
    cases.push(("a 6-byte last piece".into(), short));
    for (what, train) in &cases {
        let mut prog = program(ProgramKind::Frags, delivery::RING_BUF, cfg::DROP_REJECTED, None);
        let mut ring = prog.take_ring_buf().unwrap();
        let (action, c) = run(&prog, &packet(train));
        assert_eq!((action, c.get(Counter::Malformed), c.total()), (XDP_DROP, 1, 1), "{what}: {c}");
        assert!(ring.next().is_none(), "{what}: nothing of the train reaches user space");
    }
    // Without DROP_REJECTED, the kernel gets it (and its socket drops it).
    let prog = program(ProgramKind::Frags, delivery::XSK, 0, None);
    let (action, c) = run(&prog, &packet(&cases[0].1));
    assert_eq!((action, c.get(Counter::Malformed)), (XDP_PASS, 1), "{c}");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn the_peer_filter_checks_every_chunk_of_a_train() {
    let (_, mut chunks) = full_train();
    let mut prog = program(ProgramKind::Frags, delivery::XSK, cfg::PEER_FILTER | cfg::DROP_REJECTED, None);
    prog.allow_peer(src(), PORT, PeerRule::allow(&[ChunkKind::Data, ChunkKind::Control])).unwrap();
    let (_, c) = run(&prog, &packet(&chunks.concat()));
    assert_eq!(c.get(Counter::NoSocket), 1, "the data train passes the filter: {c}");
    // Chunk 4 claims to be a NACK, which this source may not send.
    chunks[4][10..12].copy_from_slice(&(0x8000u16 | ChunkKind::Nack as u16).to_be_bytes());
    let (action, c) = run(&prog, &packet(&chunks.concat()));
    assert_eq!((action, c.get(Counter::WrongSource), c.total()), (XDP_DROP, 1, 1), "{c}");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn a_leap_datagram_longer_than_any_train_is_passed_and_counted() {
    let mut big = full_train().0;
    big.extend_from_slice(&[0; 100]);
    for (kind, delivery) in [(ProgramKind::Frags, delivery::XSK), (ProgramKind::Frags, delivery::RING_BUF)] {
        let prog = program(kind, delivery, cfg::DROP_REJECTED, None);
        let (action, c) = run(&prog, &packet(&big));
        assert_eq!((action, c.get(Counter::PassedOversize), c.total()), (XDP_PASS, 1, 1), "{kind}: {c}");
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn a_train_the_ring_buffer_has_no_room_for_is_passed() {
    let (train, _) = full_train();
    // One page holds two records: the third chunk finds no room.
    let mut prog = program(ProgramKind::Frags, delivery::RING_BUF, 0, Some(4096));
    let ring = prog.take_ring_buf().unwrap();
    let (action, c) = run(&prog, &packet(&train));
    assert_eq!((action, c.get(Counter::RingBufFull), c.total()), (XDP_PASS, 1, 1), "{c}");
    drop(ring);
}

// ---- end to end, at a 9000-byte MTU ----

const MTU: u32 = 9000;

fn transport(node: &NodeNet, prev: &NodeNet, next: &NodeNet, delivery: Delivery) -> XdpTransport {
    transport_with(node, prev, next, delivery, None)
}

fn transport_with(
    node: &NodeNet,
    prev: &NodeNet,
    next: &NodeNet,
    delivery: Delivery,
    ring_bytes: Option<u32>,
) -> XdpTransport {
    let me = SocketAddr::from((node.addr, PORT));
    let mut udp = UdpConfig::new(me, SocketAddr::from((next.addr, PORT)));
    udp.prev = Some(SocketAddr::from((prev.addr, PORT)));
    udp.max_frame_len = 70_000;
    udp.recv_timeout = Some(Duration::from_secs(3));
    udp.reliability = Reliability::BestEffort;
    udp.crc = false;
    let mut cfg = XdpTransportConfig::new(&node.rx_iface, udp, delivery);
    cfg.mode = AttachMode::Drv;
    cfg.object = object();
    if ring_bytes.is_some() {
        cfg.ring_bytes = ring_bytes;
    }
    let t = XdpTransport::open(cfg).expect("open the XDP transport");
    assert_eq!(t.program_kind(), ProgramKind::Frags);
    assert_eq!(t.attached_mode(), AttachedMode::Drv, "native XDP on veth at MTU 9000 needs the frags program");
    t
}

/// Node 0 sends hand-made trains (six chunks per datagram) of `frames`
/// frames from a plain UDP socket; node 1 receives them with `delivery`
/// (and a ring buffer of `ring_bytes`). Returns the receiver's counters and
/// the chunks that came through its UDP socket.
fn crafted_trains(delivery: Delivery, ring_bytes: Option<u32>) -> (XdpCounters, u64) {
    let topo = Topology::ring_with_mtu(&xdp_common::unique("lxt"), 2, Some(MTU)).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let frames = 40u16;
    let len = 16_392; // 12 chunks: two trains of six
    let ready = Arc::new(Barrier::new(2));
    let receiver = {
        let (n0, n1, ready) = (n0.clone(), n1.clone(), ready.clone());
        std::thread::spawn(move || {
            in_netns(n1.path(), move || {
                let mut t = transport_with(&n1, &n0, &n0, delivery, ring_bytes);
                let want_train = match delivery {
                    Delivery::RingBuf => TRAIN_DATAGRAM_MAX,
                    Delivery::Xsk => TRAIN_DATAGRAM_MAX, // bound with XDP_USE_SG on 6.6+
                };
                assert_eq!(t.rx_train_bytes(), want_train);
                ready.wait();
                let mut buf = vec![0u8; 70_000];
                for i in 0..frames {
                    let got = t
                        .recv_prev(&mut buf)
                        .unwrap_or_else(|e| panic!("frame {i}: {e}; {:?}\n{}", t.stats(), t.xdp_counters().unwrap()));
                    assert_eq!(got.kind, FrameKind::Data);
                    assert!(buf[..got.len] == pattern(u32::from(i), len)[..], "frame {i} corrupt");
                }
                let s = t.stats();
                assert_eq!(s.drops.total(), 0, "{:?}", s.drops);
                (t.xdp_counters().unwrap(), t.chunks_via_kernel())
            })
        })
    };
    in_netns(n0.path(), move || {
        let sock = UdpSocket::bind(SocketAddr::from((n0.addr, PORT))).unwrap();
        ready.wait();
        for i in 0..frames {
            let chunks = chunks_of(i, &pattern(u32::from(i), len));
            for train in chunks.chunks(TRAIN_CHUNKS_MAX) {
                let d = train.concat();
                assert!(d.len() <= TRAIN_DATAGRAM_MAX && d.len() > CHUNK_DATAGRAM_MAX);
                sock.send_to(&d, SocketAddr::from((n1.addr, PORT))).unwrap();
            }
            // Paced a little: 40 frames, well within the rings.
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    receiver.join().expect("receiver")
}

fn crafted_trains_through_xdp(delivery: Delivery) {
    let frames = 40u64;
    let (c, via_kernel) = crafted_trains(delivery, None);
    let via = if delivery == Delivery::Xsk { Counter::ToXsk } else { Counter::ToRingBuf };
    assert_eq!(c.get(via), frames * 2, "every train through XDP: {c}");
    for bad in
        [Counter::Malformed, Counter::WrongSource, Counter::NoSocket, Counter::RingBufFull, Counter::PassedOversize]
    {
        assert_eq!(c.get(bad), 0, "{}: {c}", bad.name());
    }
    assert_eq!(via_kernel, 0);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn hand_made_trains_arrive_whole_through_multi_buffer_af_xdp() {
    crafted_trains_through_xdp(Delivery::Xsk);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn hand_made_trains_arrive_whole_through_the_ring_buffer() {
    crafted_trains_through_xdp(Delivery::RingBuf);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn trains_a_full_ring_buffer_cannot_hold_arrive_whole_through_the_udp_socket() {
    // Two pages hold five records: the sixth chunk of a train finds no
    // room, after five were submitted. The program passes the datagram;
    // user space never takes the five (their train is incomplete), so
    // nothing arrives twice (crafted_trains checks every frame and that
    // nothing was dropped). The program submits a train's records one by
    // one, so a receiver draining the ring meanwhile can make room for a
    // whole train now and then (about one run in ten saw one): such a
    // train arrives through the ring buffer, every other one through the
    // UDP socket, each counted once.
    let (c, via_kernel) = crafted_trains(Delivery::RingBuf, Some(8192));
    let (full, whole) = (c.get(Counter::RingBufFull), c.get(Counter::ToRingBuf));
    assert_eq!(full + whole, 80, "every train counted once: {c}");
    assert!(full > 0, "the ring buffer never filled: {c}");
    assert_eq!(via_kernel, full * 6, "the chunks of every train the ring could not hold, through the UDP socket: {c}");
}

/// A 3-node ring at MTU 9000, the frags program attached natively on every
/// node: the head sends `frames` frames around, each worker relays them.
fn three_node_ring(delivery: Delivery) {
    let topo = Topology::ring_with_mtu(&xdp_common::unique("lx3"), 3, Some(MTU)).unwrap();
    let n: Vec<NodeNet> = topo.nodes().to_vec();
    let frames = 200usize;
    let sizes = [1usize, 1401, 16_392, 32_776, 65_000];
    let ready = Arc::new(Barrier::new(3));
    let mut workers = Vec::new();
    for i in [1usize, 2] {
        let (me, prev, next, ready) = (n[i].clone(), n[i - 1].clone(), n[(i + 1) % 3].clone(), ready.clone());
        workers.push(std::thread::spawn(move || {
            in_netns(me.path(), move || {
                let mut t = transport(&me, &prev, &next, delivery);
                ready.wait();
                let mut buf = vec![0u8; 70_000];
                for f in 0..frames {
                    let got = t.recv_prev(&mut buf).unwrap_or_else(|e| panic!("node {i}: frame {f}: {e}"));
                    t.send_next(&buf[..got.len]).unwrap();
                }
                t.xdp_counters().unwrap()
            })
        }));
    }
    let (me, prev, next) = (n[0].clone(), n[2].clone(), n[1].clone());
    let head = in_netns(me.path(), move || {
        let mut t = transport(&me, &prev, &next, delivery);
        ready.wait();
        let mut buf = vec![0u8; 70_000];
        for f in 0..frames {
            let len = sizes[f % sizes.len()];
            let frame = pattern(f as u32, len);
            t.send_next(&frame).unwrap();
            let got = t.recv_prev(&mut buf).unwrap_or_else(|e| panic!("head: frame {f}: {e}"));
            assert!(got.len == len && buf[..len] == frame[..], "head: frame {f} of {len} bytes came back corrupt");
        }
        assert_eq!(t.stats().frames_received, frames as u64);
        t.xdp_counters().unwrap()
    });
    for w in workers {
        let c = w.join().expect("worker");
        assert!(c.delivered() > 0, "{c}");
        assert_eq!(c.get(Counter::Malformed), 0, "{c}");
    }
    assert!(head.delivered() > 0, "{head}");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn af_xdp_ring_of_three_runs_at_mtu_9000_with_the_frags_program() {
    three_node_ring(Delivery::Xsk);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_ring_of_three_runs_at_mtu_9000_with_the_frags_program() {
    three_node_ring(Delivery::RingBuf);
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn an_oversize_leap_datagram_reaches_the_udp_socket_and_is_counted_there() {
    let topo = Topology::ring_with_mtu(&xdp_common::unique("lxo"), 2, Some(MTU)).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let ready = Arc::new(Barrier::new(2));
    let receiver = {
        let (n0, n1, ready) = (n0.clone(), n1.clone(), ready.clone());
        std::thread::spawn(move || {
            in_netns(n1.path(), move || {
                let mut t = transport(&n1, &n0, &n0, Delivery::Xsk);
                ready.wait();
                // The frame after the oversize datagram arrives; by then the
                // UDP socket has been read.
                let mut buf = vec![0u8; 70_000];
                let got = t.recv_prev(&mut buf).expect("the frame after the oversize datagram");
                assert!(buf[..got.len] == pattern(1, 16_392)[..]);
                (t.xdp_counters().unwrap(), t.stats())
            })
        })
    };
    in_netns(n0.path(), move || {
        let sock = UdpSocket::bind(SocketAddr::from((n0.addr, PORT))).unwrap();
        let to = SocketAddr::from((n1.addr, PORT));
        ready.wait();
        // Seven chunks' worth: a train one chunk longer than allowed.
        let mut big = chunks_of(0, &pattern(0, 7 * CHUNK_PAYLOAD_MAX)).concat();
        assert!(big.len() > TRAIN_DATAGRAM_MAX);
        big.truncate(TRAIN_DATAGRAM_MAX + 100);
        sock.send_to(&big, to).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        for train in chunks_of(1, &pattern(1, 16_392)).chunks(TRAIN_CHUNKS_MAX) {
            sock.send_to(&train.concat(), to).unwrap();
        }
    });
    let (c, stats) = receiver.join().expect("receiver");
    assert_eq!(c.get(Counter::PassedOversize), 1, "{c}");
    assert_eq!(c.get(Counter::ToXsk), 2, "{c}");
    assert_eq!(stats.drops.oversize, 1, "the node's UDP socket got it and counted it: {:?}", stats.drops);
}
