//! The datagram path on a hostile network, on loopback: crafted NACKs,
//! strangers, spoofed old and far-ahead chunks from the previous node's own
//! address, payloads altered in flight. A relay socket stands between two
//! leap nodes; to the receiver it *is* the previous node, so whatever the
//! relay injects comes from the previous node's address.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leap::frame::reliable::{NACK_ALL, NACK_MAX_RANGES};
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap::{Transport, TransportError};
use leap_common::chunk::{CHUNK_HEADER_LEN, ChunkHeader, ChunkKind, flags};
use leap_common::hello::{Hello, caps};

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_le_bytes()[2]).collect()
}

/// A NACK datagram with raw ranges.
fn nack(seq: u16, ranges: &[(u16, u16)]) -> Vec<u8> {
    let hdr = ChunkHeader {
        seq,
        chunk_id: 0,
        total_chunks: ranges.len() as u16,
        reserved: flags::LEAP | ChunkKind::Nack as u16,
    };
    let mut d = hdr.to_bytes().to_vec();
    for (f, c) in ranges {
        d.extend_from_slice(&f.to_be_bytes());
        d.extend_from_slice(&c.to_be_bytes());
    }
    d
}

/// A test socket that plays a leap next node: answers the sender's hellos
/// (so it is proven), counts chunks, and can send NACKs.
struct FakeNext {
    sock: UdpSocket,
    epoch: u64,
}

impl FakeNext {
    fn new() -> Self {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
        // Room for a whole frame and its retransmissions whatever memory
        // each datagram is charged (it varies with the kernel's allocator).
        socket2::SockRef::from(&sock).set_recv_buffer_size(4 << 20).unwrap();
        Self { sock, epoch: 0x5eed }
    }

    fn addr(&self) -> SocketAddr {
        self.sock.local_addr().unwrap()
    }

    /// Reads for `dur`, answering hellos; returns the data chunks seen.
    fn pump(&self, dur: Duration, sender: &mut UdpTransport) -> u64 {
        let mut buf = [0u8; 65536];
        let mut scratch = vec![0u8; 64];
        let mut chunks = 0;
        let until = Instant::now() + dur;
        while Instant::now() < until {
            // The sender answers NACKs and hellos inside recv_prev.
            let _ = sender.recv_prev(&mut scratch);
            while let Ok((n, from)) = self.sock.recv_from(&mut buf) {
                if let Ok(h) = Hello::parse(&buf[..n]) {
                    if h.nonce != 0 {
                        let reply = Hello { echo: h.nonce, nonce: 0, epoch: self.epoch, caps: caps::RELIABLE };
                        self.sock.send_to(&reply.to_bytes(), from).unwrap();
                    }
                } else if ChunkHeader::parse(&buf[..n]).is_ok() {
                    chunks += 1;
                }
            }
        }
        chunks
    }
}

fn sender_to(next: SocketAddr) -> UdpTransport {
    let mut c = UdpConfig::new(free_addr(), next);
    c.prev = Some(next);
    c.gso = false;
    c.recv_timeout = Some(Duration::from_millis(1));
    c.max_frame_len = 1 << 20;
    // No tail-loss probes in the counts.
    c.timers.probe_delay = Duration::from_secs(600);
    UdpTransport::bind(c).unwrap()
}

#[test]
fn one_nack_of_any_shape_is_answered_with_at_most_the_frames_chunks() {
    let next = FakeNext::new();
    let mut s = sender_to(next.addr());
    // 50 chunks.
    let frame = pattern(1, 70_000);
    // The fake next node does not announce CRC checking: no trailer.
    let chunks = leap_common::chunk::chunks_for(frame.len()).unwrap();
    s.send_next(&frame).unwrap();
    next.pump(Duration::from_millis(50), &mut s);
    assert!(s.neighbours_are_leap().0, "the fake next node was not proven");
    // Proven from now on: frames carry flags and are kept.
    s.send_next(&frame).unwrap();
    let seen = next.pump(Duration::from_millis(50), &mut s);
    assert_eq!(seen, u64::from(chunks), "{:?}", s.stats());
    let seq = 1;
    let shapes: Vec<(&str, Vec<(u16, u16)>)> = vec![
        ("350 'all' ranges", vec![NACK_ALL; NACK_MAX_RANGES]),
        ("maximal ranges", vec![(0, u16::MAX); NACK_MAX_RANGES]),
        ("overlapping", (0..NACK_MAX_RANGES as u16).map(|i| (i, 200)).collect()),
        ("out of range", vec![(chunks, 100), (u16::MAX, u16::MAX), (60_000, 5000)]),
        ("every chunk once", (0..chunks).step_by(3).map(|i| (i, 3)).take(NACK_MAX_RANGES).collect()),
    ];
    for (name, ranges) in shapes {
        let before = s.stats().retransmits;
        next.sock.send_to(&nack(seq, &ranges), s.local_addr().unwrap()).unwrap();
        let got = next.pump(Duration::from_millis(200), &mut s);
        let resent = s.stats().retransmits - before;
        assert!(got <= u64::from(chunks), "{name}: {got} datagrams back for a {chunks}-chunk frame");
        assert_eq!(got, resent, "{name}");
        // Let the hold-off of the last answer pass.
        std::thread::sleep(Duration::from_millis(2));
    }
    // Malformed, unknown-seq and a stranger's NACKs: nothing.
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut bad = nack(seq, &[NACK_ALL]);
    bad.truncate(bad.len() - 1);
    next.sock.send_to(&bad, s.local_addr().unwrap()).unwrap();
    next.sock.send_to(&nack(999, &[NACK_ALL]), s.local_addr().unwrap()).unwrap();
    stranger.send_to(&nack(seq, &[NACK_ALL]), s.local_addr().unwrap()).unwrap();
    assert_eq!(next.pump(Duration::from_millis(100), &mut s), 0);
    let st = s.stats();
    assert!(st.drops.wrong_source >= 1 && st.nacks_unknown >= 1 && st.drops.bad_length >= 1, "{st:?}");
}

#[test]
fn nacks_are_rate_limited_per_frame() {
    let next = FakeNext::new();
    let mut s = sender_to(next.addr());
    s.send_next(&pattern(2, 16_392)).unwrap();
    next.pump(Duration::from_millis(50), &mut s);
    s.send_next(&pattern(2, 16_392)).unwrap();
    next.pump(Duration::from_millis(20), &mut s);
    for _ in 0..500 {
        next.sock.send_to(&nack(1, &[(0, 1)]), s.local_addr().unwrap()).unwrap();
    }
    let got = next.pump(Duration::from_millis(200), &mut s);
    let st = s.stats();
    assert!(got <= 64, "{got} chunks re-sent for 500 NACKs");
    assert!(st.nacks_refused > 0 || st.nacks_received < 500, "{st:?}");
}

/// A proven next node (or anyone sending from its address) NACKs every
/// chunk of a kept frame every `interval` for `dur`: the datagrams that
/// come back.
fn nack_storm(frame_len: usize, interval: Duration, dur: Duration) -> (u64, u16, leap::Stats) {
    let next = FakeNext::new();
    let mut s = sender_to(next.addr());
    let frame = pattern(4, frame_len);
    s.send_next(&frame).unwrap();
    next.pump(Duration::from_millis(50), &mut s);
    assert!(s.neighbours_are_leap().0, "the fake next node was not proven");
    // Kept from now on (seq 1).
    s.send_next(&frame).unwrap();
    next.pump(Duration::from_millis(50), &mut s);
    let chunks = leap_common::chunk::chunks_for(frame_len).unwrap();
    // Every shape a NACK can take, in turn: all, each chunk alone, one
    // range named again and again, overlapping and reversed ranges, ranges
    // past the frame's end.
    let each: Vec<(u16, u16)> = (0..chunks).map(|i| (i, 1)).take(NACK_MAX_RANGES).collect();
    let again = vec![(0, chunks); NACK_MAX_RANGES];
    let overlapping: Vec<(u16, u16)> = (0..chunks.min(300)).rev().map(|i| (i / 2, chunks - i / 2)).collect();
    let past = vec![(chunks, u16::MAX - chunks), (u16::MAX - 1, 1), (0, 1)];
    let shapes = [vec![NACK_ALL], each, again, overlapping, past];
    let mut back = 0;
    let until = Instant::now() + dur;
    for shape in shapes.iter().cycle() {
        if Instant::now() >= until {
            break;
        }
        next.sock.send_to(&nack(1, shape), s.local_addr().unwrap()).unwrap();
        back += next.pump(interval, &mut s);
    }
    back += next.pump(Duration::from_millis(100), &mut s);
    (back, chunks, s.stats())
}

#[test]
fn nacks_however_often_fetch_a_frame_at_most_its_retransmission_budget() {
    use leap::frame::reliable::{RETX_BUDGET, RETX_SLACK};
    // Before the budget, 80 NACKs of a 1 MiB frame sent every 3 ms brought
    // back 24 725 chunks (33 copies of the frame).
    for len in [16_392, 1 << 20] {
        for interval in [Duration::from_micros(100), Duration::from_millis(1), Duration::from_millis(10)] {
            let (back, chunks, st) = nack_storm(len, interval, Duration::from_secs(1));
            let bound = u64::from(RETX_BUDGET) * u64::from(chunks) + u64::from(RETX_SLACK);
            eprintln!("{len} B every {interval:?}: {back} chunks back (bound {bound}), {st:?}");
            assert!(back <= bound, "{len} B every {interval:?}: {back} chunks back, bound {bound}");
            assert!(back >= u64::from(chunks), "{len} B: the first NACK was not answered ({back})");
            assert!(st.nacks_refused > 0, "{len} B every {interval:?}: {st:?}");
        }
    }
}

#[test]
fn a_node_configured_the_default_way_takes_one_source_only() {
    // No prev configured: the first source is locked in.
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let mut cb = UdpConfig::new(b_addr, a_addr);
    cb.recv_timeout = Some(Duration::from_millis(300));
    let mut b = UdpTransport::bind(cb).unwrap();
    let mut a = UdpTransport::bind(UdpConfig::new(a_addr, b_addr)).unwrap();
    let mut out = vec![0u8; 1 << 20];
    a.send_next(&pattern(3, 5000)).unwrap();
    let got = b.recv_prev(&mut out).unwrap();
    assert_eq!(&out[..got.len], &pattern(3, 5000)[..]);
    // A stranger's frame and NACK: dropped, counted.
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut evil = ChunkHeader::data(1, 0, 1).to_bytes().to_vec();
    evil.extend_from_slice(&[0xEE; 100]);
    stranger.send_to(&evil, b_addr).unwrap();
    stranger.send_to(&nack(0, &[NACK_ALL]), b_addr).unwrap();
    stranger.send_to(&nack(0, &[NACK_ALL]), a_addr).unwrap();
    match b.recv_prev(&mut out) {
        Err(TransportError::Timeout(_)) => {}
        other => panic!("the stranger's frame was taken: {other:?}"),
    }
    let _ = a.recv_prev(&mut out[..64]);
    assert_eq!(b.stats().drops.wrong_source, 2);
    assert_eq!(a.stats().drops.wrong_source, 1);
    assert_eq!(a.stats().retransmits, 0);
    a.send_next(&pattern(4, 5000)).unwrap();
    let got = b.recv_prev(&mut out).unwrap();
    assert_eq!(&out[..got.len], &pattern(4, 5000)[..]);
}

/// What the relay does to the chunks from A to B.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Flip a payload bit of every `n`-th data chunk (first copies only).
    Corrupt(u32),
    /// Every `n` chunks, send an extra chunk of an old frame or of a frame
    /// far ahead, well-formed, with or without the reliable flag.
    Spoof(u32),
    /// Lose the first copy of chunk `id` of every frame.
    LoseFirst(u16),
}

struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    injected: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    fn start(fault: Fault, a: SocketAddr, b: SocketAddr, budget: u64) -> Self {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        let addr = s.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let injected = Arc::new(AtomicU64::new(0));
        let (st, inj) = (stop.clone(), injected.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            let mut n_chunks = 0u32;
            let mut seen = std::collections::HashSet::new();
            while !st.load(Ordering::Relaxed) {
                let Ok((n, from)) = s.recv_from(&mut buf) else { continue };
                if from == b {
                    s.send_to(&buf[..n], a).unwrap();
                    continue;
                }
                // A train from A is faulted chunk by chunk; what survives
                // goes on as one train (a train may skip chunks: all its
                // pieces but the last are still full).
                let Ok(train) = leap_common::chunk::train(&buf[..n]) else {
                    s.send_to(&buf[..n], b).unwrap();
                    continue;
                };
                let mut pass = Vec::with_capacity(n);
                let mut spoofed = Vec::new();
                for piece in train {
                    let mut d = piece.to_vec();
                    let Ok((hdr, _)) = ChunkHeader::parse(&d) else {
                        pass.extend_from_slice(&d);
                        continue;
                    };
                    n_chunks += 1;
                    match fault {
                        Fault::LoseFirst(id) => {
                            if !(hdr.chunk_id == id && seen.insert((hdr.seq, id))) {
                                pass.extend_from_slice(&d);
                            }
                        }
                        Fault::Corrupt(k) => {
                            if n_chunks.is_multiple_of(k)
                                && d.len() > CHUNK_HEADER_LEN + 10
                                && seen.insert((hdr.seq, hdr.chunk_id))
                                && inj.load(Ordering::Relaxed) < budget
                            {
                                d[CHUNK_HEADER_LEN + 7] ^= 0x10;
                                inj.fetch_add(1, Ordering::Relaxed);
                            }
                            pass.extend_from_slice(&d);
                        }
                        Fault::Spoof(k) => {
                            pass.extend_from_slice(&d);
                            let i = inj.load(Ordering::Relaxed);
                            if n_chunks.is_multiple_of(k) && i < budget {
                                let mut fake = hdr;
                                // Alternately far behind and far ahead, with
                                // and without leap's reliable flag.
                                fake.seq =
                                    if i % 2 == 0 { fake.seq.wrapping_sub(3000) } else { fake.seq.wrapping_add(500) };
                                fake.reserved = if i % 4 < 2 { flags::LEAP } else { flags::LEAP | flags::RELIABLE };
                                fake.chunk_id = 0;
                                fake.total_chunks = 1;
                                let mut f = fake.to_bytes().to_vec();
                                f.extend_from_slice(&[0xAB; 700]);
                                spoofed.push(f);
                                inj.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                // A train whose short last chunk was lost still splits
                // right; an empty one is not sent.
                if !pass.is_empty() {
                    s.send_to(&pass, b).unwrap();
                }
                for f in spoofed {
                    s.send_to(&f, b).unwrap();
                }
            }
        });
        Self { addr, stop, injected, thread: Some(thread) }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sends `frames` frames to B through the relay, one at a time, serving
/// NACKs in recv_prev between them. Returns (B's counters, A's counters,
/// frames intact, elapsed).
fn through_relay(fault: Fault, budget: u64, frames: u32, len: usize) -> (leap::Stats, leap::Stats, u32, Duration, u64) {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let relay = Relay::start(fault, a_addr, b_addr, budget);
    let mut ca = UdpConfig::new(a_addr, relay.addr);
    ca.recv_timeout = Some(Duration::from_millis(1));
    ca.gso = false;
    let mut cb = UdpConfig::new(b_addr, relay.addr);
    cb.prev = Some(relay.addr);
    cb.recv_timeout = Some(Duration::from_millis(2));
    let mut a = UdpTransport::bind(ca).unwrap();
    let mut b = UdpTransport::bind(cb).unwrap();
    support::prove_link(&mut a, &mut b, Duration::from_millis(2));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        let mut scratch = vec![0u8; 64];
        for i in 0..frames {
            a.send_next(&pattern(i, len)).unwrap();
            while done_rx.try_recv().is_err() {
                match a.recv_prev(&mut scratch) {
                    Err(TransportError::Timeout(_)) => {}
                    other => panic!("A received something: {other:?}"),
                }
            }
        }
        a.stats()
    });
    let start = Instant::now();
    let mut out = vec![0u8; len];
    let mut intact = 0;
    for i in 0..frames {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match b.recv_prev(&mut out) {
                Ok(got) => {
                    assert_eq!(&out[..got.len], &pattern(i, len)[..], "frame {i} delivered corrupt");
                    intact += 1;
                    break;
                }
                Err(TransportError::Timeout(_)) => assert!(Instant::now() < until, "frame {i} never arrived"),
                Err(e) => panic!("frame {i}: {e}"),
            }
        }
        done_tx.send(()).unwrap();
    }
    let elapsed = start.elapsed();
    let a_stats = sender.join().unwrap();
    let injected = relay.injected.load(Ordering::Relaxed);
    (b.stats(), a_stats, intact, elapsed, injected)
}

#[test]
fn payloads_altered_in_flight_are_never_delivered_and_are_fetched_again() {
    let (b, a, intact, _, injected) = through_relay(Fault::Corrupt(7), 40, 100, 16_392);
    assert_eq!(intact, 100);
    assert!(injected >= 20, "only {injected} chunks altered");
    assert!(b.drops.bad_crc >= 1, "{b:?}");
    assert!(a.retransmits > 0);
    eprintln!("{injected} chunks altered: {} frames failed their CRC and were fetched again", b.drops.bad_crc);
}

#[test]
fn spoofed_stale_and_far_ahead_chunks_from_the_previous_node_cost_nothing() {
    // The same ring with and without 20 injected chunks: the injected ones
    // are dropped and counted, and nothing waits for a deadline because of
    // them (on main each one stalled the frame for a probe or a re-send).
    let (clean, _, n0, t0, _) = through_relay(Fault::Spoof(u32::MAX), 0, 400, 16_392);
    let (b, _, n1, t1, injected) = through_relay(Fault::Spoof(97), 20, 400, 16_392);
    eprintln!("clean {clean:?}\nspoofed {b:?}");
    assert_eq!((n0, n1, injected), (400, 400, 20));
    // The far-ahead half is counted as such; the old half among the stale
    // duplicates that loss recovery makes anyway.
    assert_eq!(b.drops.out_of_window, 10, "{:?}", b.drops);
    assert!(b.drops.stale >= 10, "{:?}", b.drops);
    assert_eq!((clean.frames_lost, b.frames_lost), (0, 0));
    eprintln!("400 frames: {t0:?} clean, {t1:?} with 20 spoofed chunks");
    // Generous for a shared machine; a stall costs seconds.
    assert!(t1 < t0 * 2 + Duration::from_millis(200), "{t0:?} clean, {t1:?} spoofed");
}

#[test]
fn datagrams_the_kernel_drops_before_leap_sees_them_are_counted() {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let mut cb = UdpConfig::new(b_addr, a_addr);
    cb.prev = Some(a_addr);
    cb.recv_timeout = Some(Duration::from_millis(50));
    let mut b = UdpTransport::bind(cb).unwrap();
    // A flood larger than any socket buffer, while B does not read.
    let flood = UdpSocket::bind("127.0.0.1:0").unwrap();
    let junk = [0u8; 1400];
    for _ in 0..20_000 {
        let _ = flood.send_to(&junk, b_addr);
    }
    let mut out = vec![0u8; 4096];
    // The kernel stamps its drop count on datagrams queued after the drops.
    for i in 0..400 {
        if i % 4 == 0 {
            let _ = flood.send_to(&junk, b_addr);
        }
        let _ = b.recv_prev(&mut out);
        // The driver may have read part of the flood as it came: what it
        // left queued is read here.
        let s = b.stats();
        if s.kernel_drops > 0 && s.drops.bad_magic + s.kernel_drops >= 20_000 {
            break;
        }
    }
    let s = b.stats();
    assert!(s.kernel_drops > 0, "{s:?}");
    assert!(s.drops.bad_magic + s.kernel_drops >= 20_000, "{s:?}");
}

#[test]
fn chunks_spoofed_before_the_previous_node_proved_itself_do_not_stall_it() {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let mut cb = UdpConfig::new(b_addr, a_addr);
    cb.prev = Some(a_addr);
    cb.recv_timeout = Some(Duration::from_millis(50));
    let mut b = UdpTransport::bind(cb).unwrap();
    // Before node A starts, someone sends from its address: half a frame
    // of a seq A will not use for a long time. B locks onto it.
    {
        let spoof = UdpSocket::bind(a_addr).unwrap();
        let mut d = ChunkHeader::data(40_000, 0, 2).to_bytes().to_vec();
        d.extend_from_slice(&[0x5A; 1400]);
        spoof.send_to(&d, b_addr).unwrap();
    }
    let mut out = vec![0u8; 1 << 20];
    for _ in 0..2 {
        // The half frame is given up (best effort: A is not proven yet).
        assert!(matches!(b.recv_prev(&mut out), Err(TransportError::Timeout(_) | TransportError::FrameLost { .. })));
    }
    assert_eq!(b.stats().chunks_received, 1);
    let mut a = UdpTransport::bind(UdpConfig::new(a_addr, b_addr)).unwrap();
    support::prove_link(&mut a, &mut b, Duration::from_secs(1));
    for i in 0..3 {
        a.send_next(&pattern(i, 5000)).unwrap();
        let got = b.recv_prev(&mut out).unwrap();
        assert_eq!(&out[..got.len], &pattern(i, 5000)[..]);
    }
}

#[test]
fn nacks_are_answered_while_the_sender_computes() {
    // A sends a frame and then computes for 50 ms without touching its
    // transport; the first copy of chunk 3 of every frame is lost. B's NACK
    // must be answered by A's driver, not when A next calls the transport.
    const COMPUTE: Duration = Duration::from_millis(50);
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let relay = Relay::start(Fault::LoseFirst(3), a_addr, b_addr, u64::MAX);
    let mut ca = UdpConfig::new(a_addr, relay.addr);
    ca.gso = false;
    let mut cb = UdpConfig::new(b_addr, relay.addr);
    cb.prev = Some(relay.addr);
    let mut a = UdpTransport::bind(ca).unwrap();
    let mut b = UdpTransport::bind(cb).unwrap();
    support::prove_link(&mut a, &mut b, Duration::from_secs(2));
    let frames = 8u32;
    let (sent_tx, sent_rx) = std::sync::mpsc::channel::<Instant>();
    let sender = std::thread::spawn(move || {
        for i in 0..frames {
            a.send_next(&pattern(i, 16_392)).unwrap();
            sent_tx.send(Instant::now()).unwrap();
            std::thread::sleep(COMPUTE);
        }
        a.stats()
    });
    let mut out = vec![0u8; 16_392];
    let mut waits = Vec::new();
    for i in 0..frames {
        let got = b.recv_prev(&mut out).unwrap();
        let sent = sent_rx.recv_timeout(Duration::from_secs(1)).unwrap();
        waits.push(Instant::now().duration_since(sent));
        assert!(out[..got.len] == pattern(i, 16_392)[..], "frame {i} differs");
    }
    let sa = sender.join().unwrap();
    let sb = b.stats();
    eprintln!("recovery waits {waits:?}\nA {sa:?}\nB {sb:?}");
    assert!(sa.retransmits >= u64::from(frames), "{sa:?}");
    assert_eq!(sb.frames_received, u64::from(frames));
    // Each frame lost a chunk and was completed by a retransmission; the
    // median wait is far below the 50 ms A spends computing (a shared
    // machine may stall one of them).
    waits.sort();
    assert!(waits[waits.len() / 2] < COMPUTE / 2, "{waits:?}");
}

/// Chunk `id` of frame `frame` (seq `seq`), as the original sends it.
fn chunk_of(seq: u16, frame: &[u8], id: u16) -> Vec<u8> {
    let total = leap_common::chunk::chunks_for(frame.len()).unwrap();
    let at = usize::from(id) * 1400;
    let mut d = ChunkHeader::data(seq, id, total).to_bytes().to_vec();
    d.extend_from_slice(&frame[at..(at + 1400).min(frame.len())]);
    d
}

#[test]
fn malformed_trains_are_dropped_and_counted_and_good_frames_still_arrive() {
    for gro in [true, false] {
        let prev = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut cb = UdpConfig::new(free_addr(), free_addr());
        cb.prev = Some(prev.local_addr().unwrap());
        cb.gro = gro;
        cb.max_frame_len = 16_392;
        cb.recv_timeout = Some(Duration::from_secs(2));
        let mut b = UdpTransport::bind(cb).unwrap();
        let to = b.local_addr().unwrap();
        let mut out = vec![0u8; 16_392];
        let mut expect = |b: &mut UdpTransport, f: &[u8]| {
            let got = b.recv_prev(&mut out).unwrap_or_else(|e| panic!("gro {gro}: {e}: {:?}", b.stats()));
            assert!(out[..got.len] == f[..], "gro {gro}: a frame differs");
        };
        let cat = |parts: &[Vec<u8>]| parts.concat();
        // Frame 0: one good train of its three chunks.
        let f0 = pattern(0, 2900);
        prev.send_to(&cat(&[chunk_of(0, &f0, 0), chunk_of(0, &f0, 1), chunk_of(0, &f0, 2)]), to).unwrap();
        expect(&mut b, &f0);
        // Frame 1: a "train" with one bad chunk (no magic) in the middle is
        // one oversize chunk, as the original, the module and the XDP
        // program see it: nothing of it is taken; the real chunks complete
        // the frame.
        let f1 = pattern(1, 2900);
        let mut bad = chunk_of(1, &f1, 1);
        bad[0] ^= 0xFF;
        prev.send_to(&cat(&[chunk_of(1, &f1, 0), bad, chunk_of(1, &f1, 2)]), to).unwrap();
        prev.send_to(&chunk_of(1, &f1, 1), to).unwrap();
        prev.send_to(&chunk_of(1, &f1, 2), to).unwrap();
        prev.send_to(&chunk_of(1, &f1, 0), to).unwrap();
        expect(&mut b, &f1);
        // A train longer than any: dropped whole, counted as oversize.
        let f2 = pattern(2, 8400);
        let mut long: Vec<u8> = (0..6).flat_map(|id| chunk_of(2, &f2, id)).collect();
        long.push(0);
        assert_eq!(long.len(), leap_common::chunk::TRAIN_DATAGRAM_MAX + 1);
        prev.send_to(&long, to).unwrap();
        prev.send_to(&(0..6).flat_map(|id| chunk_of(2, &f2, id)).collect::<Vec<u8>>(), to).unwrap();
        expect(&mut b, &f2);
        // Frame 3: a train whose middle chunk is short. Cut at 1412 bytes,
        // its second piece runs into the third chunk: that piece fails the
        // length rule (a chunk that is not the last must be full).
        let f3 = pattern(3, 2900);
        let mut short = chunk_of(3, &f3, 1);
        short.truncate(512);
        prev.send_to(&cat(&[chunk_of(3, &f3, 0), short, chunk_of(3, &f3, 2)]), to).unwrap();
        for id in [1, 2, 0] {
            prev.send_to(&chunk_of(3, &f3, id), to).unwrap();
        }
        expect(&mut b, &f3);
        let d = b.stats().drops;
        assert!(d.oversize >= 2 && d.bad_length >= 1, "gro {gro}: {d:?}");
        assert_eq!(b.stats().frames_received, 4);
    }
}

/// A datagram of a one-chunk frame `seq` (100 bytes), as a spoofer sends it.
fn lone_chunk(seq: u16) -> Vec<u8> {
    let mut d = ChunkHeader::data(seq, 0, 1).to_bytes().to_vec();
    d.extend_from_slice(&[0xEE; 100]);
    d
}

/// `a` sends frames of `pattern(seed, 5000)` to `b` until `b` delivers one,
/// at most `limit`; whether it did. Anything else `b` delivers fails.
fn frames_get_through(a: &mut UdpTransport, b: &mut UdpTransport, seed: u32, limit: Duration) -> bool {
    let want = pattern(seed, 5000);
    let mut out = vec![0u8; 1 << 20];
    let until = Instant::now() + limit;
    while Instant::now() < until {
        a.send_next(&want).unwrap();
        match b.recv_prev(&mut out) {
            Ok(got) => {
                assert_eq!(&out[..got.len], &want[..], "b delivered a frame that is not a's");
                return true;
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => panic!("b: {e}"),
        }
    }
    false
}

/// B takes frames from the first source (no previous node configured);
/// its next node is a socket that only listens.
fn unconfigured_receiver() -> (UdpTransport, UdpSocket) {
    let next = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut cb = UdpConfig::new(free_addr(), next.local_addr().unwrap());
    cb.recv_timeout = Some(Duration::from_millis(300));
    (UdpTransport::bind(cb).unwrap(), next)
}

#[test]
fn a_lock_a_spoofed_first_chunk_took_moves_to_the_leap_node_that_proves_itself() {
    let (mut b, _next) = unconfigured_receiver();
    let b_addr = b.local_addr().unwrap();
    // A spoofer's one chunk comes first and takes the lock.
    let spoofer = UdpSocket::bind("127.0.0.1:0").unwrap();
    spoofer.send_to(&lone_chunk(0), b_addr).unwrap();
    let mut out = vec![0u8; 4096];
    assert_eq!(b.recv_prev(&mut out).unwrap().len, 100);
    // The real previous node: its frames are refused until the spoofer has
    // been quiet (3 s) and has left a hello unanswered (1 s).
    let mut a = UdpTransport::bind(UdpConfig::new(free_addr(), b_addr)).unwrap();
    let start = Instant::now();
    assert!(frames_get_through(&mut a, &mut b, 5, Duration::from_secs(15)), "the lock never moved: {:?}", b.stats());
    eprintln!("moved after {:?}; {:?}", start.elapsed(), b.stats().drops);
    assert!(start.elapsed() >= leap::frame::relock::SILENCE - Duration::from_millis(500));
    assert!(b.stats().drops.wrong_source > 0, "a's first frames were taken");
    // The spoofer is now the stranger.
    let before = b.stats().drops.wrong_source;
    spoofer.send_to(&lone_chunk(9), b_addr).unwrap();
    assert!(frames_get_through(&mut a, &mut b, 6, Duration::from_secs(5)));
    assert!(b.stats().drops.wrong_source > before, "the spoofer's chunk was not refused");
}

#[test]
fn a_live_leap_node_keeps_its_lock_while_idle_whoever_proves_itself() {
    let (mut b, _next) = unconfigured_receiver();
    let b_addr = b.local_addr().unwrap();
    let mut a1 = UdpTransport::bind(UdpConfig::new(free_addr(), b_addr)).unwrap();
    assert!(frames_get_through(&mut a1, &mut b, 1, Duration::from_secs(5)));
    // Another leap node sends to B for longer than the lock's silence and
    // probe wait, while the locked one is idle (its driver answers hellos).
    let mut a2 = UdpTransport::bind(UdpConfig::new(free_addr(), b_addr)).unwrap();
    let limit = leap::frame::relock::SILENCE + leap::frame::relock::PROBE_WAIT * 3;
    assert!(!frames_get_through(&mut a2, &mut b, 2, limit), "a2 took the lock of a live node");
    assert!(b.stats().drops.wrong_source > 0);
    assert!(frames_get_through(&mut a1, &mut b, 3, Duration::from_secs(5)), "a1 lost its lock");
}

#[test]
fn the_operator_releases_a_lock_a_busy_spoofer_holds() {
    let (mut b, _next) = unconfigured_receiver();
    let b_addr = b.local_addr().unwrap();
    let control = b.source_control().expect("a datagram link has a source lock");
    assert_eq!(control.release(), None, "nothing is locked yet");
    // A spoofer that keeps sending: never silent, never proven.
    let spoofer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let spoofer_addr = spoofer.local_addr().unwrap();
    spoofer.send_to(&lone_chunk(0), b_addr).unwrap();
    let mut out = vec![0u8; 4096];
    assert_eq!(b.recv_prev(&mut out).unwrap().len, 100);
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let flood = std::thread::spawn(move || {
        for seq in 1..2000u16 {
            if st.load(Ordering::Relaxed) {
                break;
            }
            let _ = spoofer.send_to(&lone_chunk(seq), b_addr);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let mut a = UdpTransport::bind(UdpConfig::new(free_addr(), b_addr)).unwrap();
    // B reads the spoofer's frames meanwhile: the real node's never come.
    let until = Instant::now() + leap::frame::relock::SILENCE + Duration::from_secs(2);
    let want = pattern(7, 5000);
    let mut big = vec![0u8; 1 << 20];
    while Instant::now() < until {
        a.send_next(&want).unwrap();
        if let Ok(got) = b.recv_prev(&mut big) {
            assert_eq!(got.len, 100, "a frame of a's came through the spoofer's lock");
        }
    }
    assert_eq!(control.release(), Some(spoofer_addr));
    // The first source that proves to be a leap node takes it, though the
    // spoofer keeps sending.
    let mut got_a = false;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until && !got_a {
        a.send_next(&want).unwrap();
        if let Ok(got) = b.recv_prev(&mut big) {
            assert_eq!(&big[..got.len], &want[..], "the spoofer took the released lock");
            got_a = true;
        }
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    assert!(got_a, "a never took the released lock: {:?}", b.stats());
}
