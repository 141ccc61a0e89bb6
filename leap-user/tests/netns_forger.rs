//! A forger inside the namespaces of a keyed udp ring (root): raw sockets
//! with the previous node's address (and the next node's, for NACKs) send
//! altered and replayed copies of real chunks, and fresh chunks, trains,
//! probes, control frames, hellos and NACKs, while the ring moves frames.
//! Every frame arrives intact and once, everything forged is counted by
//! reason, and the ring's frames per second stay within a generous bound
//! of a quiet run of the same ring in the same test.

mod support;
mod xdp_common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leap::netns::Topology;
use leap::transport::ring_key::{KeySet, RingKey};
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap::{FrameKind, Transport, TransportError};
use leap_common::chunk::{CHUNK_DATAGRAM_MAX, ChunkHeader, ChunkKind, flags};
use leap_common::hello::Hello;
use socket2::{Domain, Protocol, Socket, Type};
use xdp_common::{in_netns, pattern, unique};

const FRAME: usize = 16_392;
const PORT: u16 = 47_300;
/// How long each phase (quiet, forged) moves frames.
const PHASE: Duration = Duration::from_secs(3);

/// An IPv4 + UDP datagram from `src` to `dst` carrying `payload` (UDP
/// checksum 0: none; the kernel fills the IP checksum).
fn ip_udp(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&src.ip().octets());
    p.extend_from_slice(&dst.ip().octets());
    p.extend_from_slice(&src.port().to_be_bytes());
    p.extend_from_slice(&dst.port().to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

fn chunk(reserved: u16, id: u16, total: u16, len: usize) -> Vec<u8> {
    let mut d = ChunkHeader { seq: 3, chunk_id: id, total_chunks: total, reserved }.to_bytes().to_vec();
    d.extend(std::iter::repeat_n(0xA5, len));
    d
}

/// Fresh forgeries from the previous node's address: keyed-looking (junk
/// trailers) and unkeyed chunks, a train, a probe, a control frame, hellos.
fn fresh_from_prev() -> Vec<Vec<u8>> {
    let keyed = flags::LEAP | flags::RELIABLE | flags::AUTH;
    let plain = flags::LEAP | flags::RELIABLE;
    let mut v = vec![
        chunk(keyed, 0, 1, 200),
        chunk(keyed | ChunkKind::Control as u16, 0, 1, 200),
        chunk(keyed | flags::RETRANSMIT, 0, 1, 200),
        chunk(plain, 0, 1, 200),
        chunk(plain | ChunkKind::Control as u16, 0, 1, 200),
        chunk(0, 0, 1, 200),
        Hello::default().to_bytes().to_vec(),
    ];
    let mut train = chunk(keyed, 0, 2, 600);
    train.extend(chunk(keyed, 1, 2, 100));
    v.push(train);
    let mut hello = Hello::default().to_bytes().to_vec();
    hello.extend([0x5A; 32]);
    v.push(hello);
    v
}

/// Forged NACKs from the next node's address (asking for everything).
fn nacks_from_next() -> Vec<Vec<u8>> {
    vec![
        chunk(flags::LEAP | flags::AUTH | ChunkKind::Nack as u16, 0, 1, 36),
        chunk(flags::LEAP | ChunkKind::Nack as u16, 0, 1, 4),
    ]
}

/// Copies of what arrives at `at` from `from` (a raw UDP socket sees every
/// UDP datagram the namespace takes): up to `n`, within `limit`.
fn capture(from: SocketAddrV4, at: SocketAddrV4, n: usize, limit: Duration) -> Vec<Vec<u8>> {
    let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)).expect("raw UDP socket (root)");
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut got = Vec::new();
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 65_536];
    let end = Instant::now() + limit;
    while got.len() < n && Instant::now() < end {
        let Ok(len) = s.recv(&mut buf) else { continue };
        // SAFETY: recv(2) initialised the first `len` bytes.
        let p: Vec<u8> = buf[..len].iter().map(|b| unsafe { b.assume_init() }).collect();
        let ihl = usize::from(p[0] & 0xF) * 4;
        let (src, dst) = (Ipv4Addr::new(p[12], p[13], p[14], p[15]), Ipv4Addr::new(p[16], p[17], p[18], p[19]));
        let (sport, dport) = (u16::from_be_bytes([p[ihl], p[ihl + 1]]), u16::from_be_bytes([p[ihl + 2], p[ihl + 3]]));
        if (src, sport, dst, dport) == (*from.ip(), from.port(), *at.ip(), at.port()) && len > ihl + 8 + 12 {
            // A GSO send crosses the veth whole: its datagrams are the
            // segments of the largest chunk datagram.
            got.extend(p[ihl + 8..].chunks(CHUNK_DATAGRAM_MAX).map(<[u8]>::to_vec));
        }
    }
    got
}

/// Sends `datagrams` from `src` to `dst` over and over through a raw
/// socket until `stop` (bounded: `limit`, one burst a millisecond).
fn forge(src: SocketAddrV4, dst: SocketAddrV4, datagrams: Vec<Vec<u8>>, stop: Arc<AtomicBool>, limit: Duration) -> u64 {
    let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(libc::IPPROTO_RAW))).expect("raw socket (root)");
    let packets: Vec<Vec<u8>> = datagrams.iter().map(|d| ip_udp(src, dst, d)).collect();
    let to = SocketAddr::V4(dst).into();
    let (mut sent, end) = (0u64, Instant::now() + limit);
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        for p in &packets {
            if s.send_to(p, &to).is_ok() {
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sent
}

/// The head sends and takes back frames, checking each, for `phase`;
/// returns the frames moved.
fn run_head(head: &mut UdpTransport, first: u32, phase: Duration) -> u32 {
    let mut buf = vec![0u8; FRAME];
    let (mut i, end) = (first, Instant::now() + phase);
    while Instant::now() < end {
        let f = pattern(i, FRAME);
        head.send_next(&f).unwrap();
        let got = head.recv_prev(&mut buf).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        assert_eq!((got.len, got.kind), (FRAME, FrameKind::Data));
        assert!(buf[..FRAME] == f[..], "frame {i} changed on its way round");
        i += 1;
    }
    i - first
}

#[test]
#[ignore = "needs root for namespaces and raw sockets: run by cargo xtask ci (stage privileged)"]
fn a_forger_with_the_neighbours_addresses_delivers_nothing_is_counted_and_does_not_collapse_the_ring() {
    let t = Topology::ring(&unique("kf"), 3).unwrap();
    let addrs: Vec<SocketAddrV4> = t.nodes().iter().map(|n| SocketAddrV4::new(n.addr, PORT)).collect();
    let addr = move |i: usize| addrs[i];
    let key = KeySet::new(RingKey::from_bytes([8; 32]));
    let bind = |i: usize| {
        let mut c = UdpConfig::new(addr(i).into(), addr((i + 1) % 3).into());
        c.prev = Some(addr((i + 2) % 3).into());
        c.ring_key = Some(key.clone());
        c.max_frame_len = FRAME;
        c.recv_timeout = Some(Duration::from_secs(5));
        in_netns(t.nodes()[i].path(), move || UdpTransport::bind(c).unwrap())
    };
    let mut head = bind(0);
    let stop = Arc::new(AtomicBool::new(false));
    let forwarders: Vec<JoinHandle<UdpTransport>> = (1..3)
        .map(|i| {
            let mut n = bind(i);
            let stop = stop.clone();
            std::thread::spawn(move || {
                n.set_recv_timeout(Some(Duration::from_millis(50)));
                support::forward_until(&mut n, FRAME, &stop, Duration::from_secs(60));
                n
            })
        })
        .collect();
    // Warm up, then a quiet phase.
    let mut frames = run_head(&mut head, 0, Duration::from_millis(500));
    let quiet = run_head(&mut head, frames, PHASE);
    frames += quiet;
    // The forger copies real chunks to node 1, then sends them again
    // (replayed), altered (one byte of the payload), and fresh forgeries,
    // from node 0's address; and NACKs from node 2's address.
    let (p0, p1, p2) = (t.nodes()[0].path(), t.nodes()[1].path(), t.nodes()[2].path());
    let captured = {
        let (a0, a1) = (addr(0), addr(1));
        let c = std::thread::spawn(move || in_netns(p1, move || capture(a0, a1, 48, Duration::from_secs(3))));
        let warm = run_head(&mut head, frames, Duration::from_millis(500));
        frames += warm;
        c.join().unwrap()
    };
    assert!(captured.len() >= 16, "captured {} datagrams only", captured.len());
    let mut from_prev: Vec<Vec<u8>> = captured.clone();
    from_prev.extend(captured.iter().map(|d| {
        let mut d = d.clone();
        let at = d.len() / 2;
        d[at] ^= 0x40;
        d
    }));
    from_prev.extend(fresh_from_prev());
    let before = head.stats();
    let forging = Arc::new(AtomicBool::new(false));
    let forgers: Vec<JoinHandle<u64>> = [(p0, addr(0), from_prev), (p2, addr(2), nacks_from_next())]
        .into_iter()
        .map(|(path, src, ds)| {
            let (stop, dst) = (forging.clone(), addr(1));
            std::thread::spawn(move || in_netns(path, move || forge(src, dst, ds, stop, PHASE * 2)))
        })
        .collect();
    let forged_frames = run_head(&mut head, frames, PHASE);
    frames += forged_frames;
    forging.store(true, Ordering::Relaxed);
    let sent: u64 = forgers.into_iter().map(|f| f.join().unwrap()).sum();
    // None twice: nothing more comes back.
    let mut buf = vec![0u8; FRAME];
    head.set_recv_timeout(Some(Duration::from_millis(300)));
    assert!(matches!(head.recv_prev(&mut buf), Err(TransportError::Timeout(_))), "a frame came twice");
    stop.store(true, Ordering::Relaxed);
    let nodes: Vec<UdpTransport> = forwarders.into_iter().map(|f| f.join().unwrap()).collect();
    let (s1, s0) = (nodes[0].stats(), head.stats());
    eprintln!(
        "quiet: {quiet} frames in {PHASE:?}; forged: {forged_frames} frames, {sent} forged datagrams; \
         node 1 drops {:?}",
        s1.drops
    );
    assert!(sent > 1000, "the forger sent {sent} datagrams");
    // Everything counted by reason, at the node the forger aimed at.
    let d = s1.drops;
    assert!(d.replayed >= 1, "replayed copies: {d:?}");
    assert!(d.bad_tag >= 1, "altered copies and junk trailers: {d:?}");
    assert!(d.unkeyed >= 1, "unkeyed chunks and hellos: {d:?}");
    assert!(d.replayed + d.bad_tag + d.unkeyed >= sent / 2, "most forgeries counted: {d:?}, {sent} sent");
    // Nothing moved the ring's state: no frame lost, the head's own
    // receive untouched, frames all intact (checked one by one above).
    assert_eq!((s0.frames_lost, s1.frames_lost), (0, 0), "{s0:?} {s1:?}");
    assert_eq!(s0.drops.bad_tag + s0.drops.unkeyed, before.drops.bad_tag + before.drops.unkeyed);
    assert_eq!(nodes[1].stats().frames_received, u64::from(frames));
    // Not collapsed: at least a quarter of the quiet rate (this 2-core
    // machine is noisy; the forger itself costs one AES-GCM per datagram).
    assert!(forged_frames * 4 >= quiet, "forged {forged_frames} frames vs {quiet} quiet in {PHASE:?}");
    drop(t);
}
