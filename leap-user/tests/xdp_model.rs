//! The XDP program, run by the kernel on generated packets
//! (`BPF_PROG_TEST_RUN`), decides exactly as a reference model written from
//! the specification: which counter, which action, and in ring-buffer mode
//! which bytes and sender reach user space. Malformed packets of every kind
//! included. Needs root and BPF: `cargo xtask ci`.

mod xdp_common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use leap::transport::xdp::{RingReader, XdpCounters, XdpProgram};
use leap_common::chunk::{CHUNK_DATAGRAM_MAX, ChunkHeader, ChunkKind, LEAP_MAGIC, TRAIN_DATAGRAM_MAX};
use leap_common::xdp::{Counter, LocalAddr, PeerKey, PeerRule, XdpConfig, cfg, delivery, is_v4_mapped};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use xdp_common::object;

const PORT: u16 = 9999;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
/// The MAC of the receiving interface, for `cfg::LOCAL_ONLY`.
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
/// The VLAN the receiving interface carries.
const HOST_VLAN: u16 = 7;
/// The UDP checksum field of every generated packet (the program copies it
/// into ring-buffer records, user space checks it).
const UDP_CHECK: u16 = 0x1234;

/// Destination addresses of this host.
fn local_addrs() -> [IpAddr; 2] {
    [IpAddr::V4(Ipv4Addr::new(10, 1, 0, 100)), IpAddr::V6(Ipv6Addr::LOCALHOST)]
}

/// The previous node (may send data and control) and the next node's
/// sending address (may send NACKs).
fn prev() -> SocketAddr {
    "10.1.0.1:7000".parse().unwrap()
}
fn next() -> SocketAddr {
    "[fd00::2]:7001".parse().unwrap()
}

/// A packet to generate, field by field; the `*_delta` fields make lengths
/// inconsistent on purpose.
#[derive(Clone, Debug)]
struct Spec {
    dst_mac: [u8; 6],
    vlan: u8,
    vlan_id: u16,
    dst_v4: [u8; 4],
    dst_v6: [u8; 16],
    ip_check_ok: bool,
    ether: u16,
    v6: bool,
    src_v4: [u8; 4],
    src_v6: [u8; 16],
    ihl: u8,
    version_ok: bool,
    proto: u8,
    frag: u16,
    ip_len_delta: i16,
    sport: u16,
    dport: u16,
    udp_len_delta: i16,
    magic_ok: bool,
    chunk_id: u16,
    total: u16,
    reserved: u16,
    data_len: usize,
    padding: usize,
    truncate: usize,
}

fn spec() -> impl Strategy<Value = Spec> {
    let addr4 = prop_oneof![Just([10, 1, 0, 1]), Just([10, 1, 0, 9]), any::<[u8; 4]>()];
    let addr6 = prop_oneof![
        3 => Just(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).octets()),
        1 => Just(Ipv4Addr::new(10, 1, 0, 1).to_ipv6_mapped().octets()),
        1 => any::<[u8; 16]>()
    ];
    let mac = prop_oneof![6 => Just(HOST_MAC), 1 => Just([0x02, 0, 0, 0, 0, 9]), 1 => Just([0xff; 6])];
    let dst4 = prop_oneof![6 => Just([10, 1, 0, 100]), 1 => Just([10, 1, 0, 101])];
    let dst6 = prop_oneof![
        6 => Just(Ipv6Addr::LOCALHOST.octets()),
        1 => Just(Ipv4Addr::new(10, 1, 0, 100).to_ipv6_mapped().octets()),
        1 => any::<[u8; 16]>()
    ];
    let port = prop_oneof![Just(7000u16), Just(7001), any::<u16>()];
    let dport = prop_oneof![4 => Just(PORT), 1 => any::<u16>()];
    let delta = prop_oneof![6 => Just(0i16), 1 => -30i16..30];
    let small = prop_oneof![0u16..4, any::<u16>()];
    let reserved = prop_oneof![Just(0u16), Just(0x8000), Just(0x8001), Just(0x8002), any::<u16>()];
    let data_len = prop_oneof![0usize..20, 1390usize..1410, 0usize..1500, 1400usize..8600, 8440usize..8600];
    (
        (
            prop_oneof![4 => Just(0u8), 1 => Just(1), 1 => Just(2)],
            prop_oneof![Just(0x0800u16), Just(0x86DD), any::<u16>()],
            any::<bool>(),
            addr4,
            addr6,
        ),
        (
            prop_oneof![6 => Just(5u8), 1 => 0u8..16],
            prop_oneof![9 => Just(true), 1 => Just(false)],
            prop_oneof![8 => Just(17u8), 1 => Just(6), 1 => Just(44)],
        ),
        (prop_oneof![6 => Just(0x4000u16), 1 => any::<u16>()], delta.clone(), port, dport, delta),
        (prop_oneof![9 => Just(true), 1 => Just(false)], small.clone(), small, reserved, data_len),
        (prop_oneof![4 => Just(0usize), 1 => 0usize..30], prop_oneof![8 => Just(0usize), 1 => 0usize..64]),
        (
            mac,
            prop_oneof![3 => Just(HOST_VLAN), 1 => Just(8u16), 1 => Just(0u16)],
            dst4,
            dst6,
            prop_oneof![9 => Just(true), 1 => Just(false)],
        ),
    )
        .prop_map(
            |(
                (vlan, ether, v6, src_v4, src_v6),
                (ihl, version_ok, proto),
                (frag, ip_len_delta, sport, dport, udp_len_delta),
                (magic_ok, chunk_id, total, reserved, data_len),
                (padding, truncate),
                (dst_mac, vlan_id, dst_v4, dst_v6, ip_check_ok),
            )| Spec {
                dst_mac,
                vlan,
                vlan_id,
                dst_v4,
                dst_v6,
                ip_check_ok,
                ether,
                v6,
                src_v4,
                src_v6,
                ihl,
                version_ok,
                proto,
                frag,
                ip_len_delta,
                sport,
                dport,
                udp_len_delta,
                magic_ok,
                chunk_id,
                total,
                reserved,
                data_len,
                padding,
                truncate,
            },
        )
}

fn add(len: usize, delta: i16) -> u16 {
    (len as i64 + i64::from(delta)).clamp(0, 65535) as u16
}

/// The Ethernet frame a spec describes.
fn build(s: &Spec) -> Vec<u8> {
    let mut p = s.dst_mac.to_vec();
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    let l3 = if s.ether == 0x0800 || s.ether == 0x86DD { if s.v6 { 0x86DDu16 } else { 0x0800 } } else { s.ether };
    let tci = (0x2000 | s.vlan_id).to_be_bytes(); // priority 1: not part of the ID
    match s.vlan {
        1 => p.extend_from_slice(&[0x81, 0x00, tci[0], tci[1]]),
        2 => p.extend_from_slice(&[0x88, 0xA8, tci[0], tci[1], 0x81, 0x00, 0x00, 0x08]),
        _ => {}
    }
    p.extend_from_slice(&l3.to_be_bytes());
    let mut udp_payload = Vec::new();
    let magic = if s.magic_ok { LEAP_MAGIC } else { LEAP_MAGIC ^ 0x100 };
    udp_payload.extend_from_slice(&magic.to_be_bytes());
    udp_payload.extend_from_slice(&7u16.to_be_bytes());
    udp_payload.extend_from_slice(&s.chunk_id.to_be_bytes());
    udp_payload.extend_from_slice(&s.total.to_be_bytes());
    udp_payload.extend_from_slice(&s.reserved.to_be_bytes());
    udp_payload.extend((0..s.data_len).map(|i| (i * 7) as u8));
    // Past one chunk: a train, every piece starting with the first's header
    // (a bad magic stays in the first only).
    let first: [u8; 12] = udp_payload[..12].try_into().unwrap();
    let mut at = CHUNK_DATAGRAM_MAX;
    while at + 12 <= udp_payload.len() {
        udp_payload[at..at + 12].copy_from_slice(&first);
        udp_payload[at..at + 4].copy_from_slice(&LEAP_MAGIC.to_be_bytes());
        at += CHUNK_DATAGRAM_MAX;
    }
    let udp_len = udp_payload.len() + 8;
    let mut udp = Vec::new();
    udp.extend_from_slice(&s.sport.to_be_bytes());
    udp.extend_from_slice(&s.dport.to_be_bytes());
    udp.extend_from_slice(&add(udp_len, s.udp_len_delta).to_be_bytes());
    udp.extend_from_slice(&UDP_CHECK.to_be_bytes());
    udp.extend_from_slice(&udp_payload);
    if l3 == 0x0800 {
        let ihl = usize::from(s.ihl);
        let hdr_len = ihl.max(5) * 4;
        let tot = add(hdr_len + udp.len(), s.ip_len_delta);
        let version = if s.version_ok { 4 } else { 6 };
        p.push((version << 4) | s.ihl);
        p.push(0);
        p.extend_from_slice(&tot.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&s.frag.to_be_bytes());
        p.extend_from_slice(&[64, s.proto, 0, 0]);
        p.extend_from_slice(&s.src_v4);
        p.extend_from_slice(&s.dst_v4);
        p.extend(std::iter::repeat_n(1u8, hdr_len - 20)); // options (NOPs)
        let ip_at = p.len() - hdr_len;
        let check = !ones_complement_sum(&p[ip_at..]) ^ u16::from(!s.ip_check_ok);
        p[ip_at + 10..ip_at + 12].copy_from_slice(&check.to_be_bytes());
    } else if l3 == 0x86DD {
        let version = if s.version_ok { 6 } else { 4 };
        p.extend_from_slice(&[version << 4, 0, 0, 0]);
        p.extend_from_slice(&add(udp.len(), s.ip_len_delta).to_be_bytes());
        p.extend_from_slice(&[
            if s.proto == 6 {
                6
            } else if s.proto == 44 {
                44
            } else {
                17
            },
            64,
        ]);
        p.extend_from_slice(&s.src_v6);
        p.extend_from_slice(&s.dst_v6);
    }
    p.extend_from_slice(&udp);
    p.extend(std::iter::repeat_n(0u8, s.padding));
    let keep = p.len().saturating_sub(s.truncate).max(14);
    p.truncate(keep);
    p
}

/// The folded ones'-complement sum of big-endian 16-bit words.
fn ones_complement_sum(b: &[u8]) -> u16 {
    let mut sum: u32 = b.chunks(2).map(|w| u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0))).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// What the specification says the program does: the counter, the action,
/// and for delivered chunks the sender, destination port and UDP payload.
/// A chunk in the ring buffer: sender, destination address and port, UDP
/// payload.
type Record = (SocketAddr, IpAddr, u16, Vec<u8>);

fn model(p: &[u8], c: &XdpConfig, peers: &[(PeerKey, PeerRule)]) -> (Counter, u32, Option<Vec<Record>>) {
    let pass = (Counter::Passed, XDP_PASS, None);
    let Some(mut proto) = be16(p, 12) else { return pass };
    let mut off = 14;
    let mut vlan = None;
    if proto == 0x8100 || proto == 0x88A8 {
        let Some(inner) = be16(p, 16) else { return pass };
        vlan = Some(be16(p, 14).unwrap() & 0x0FFF);
        proto = inner;
        off += 4;
    }
    let l3 = off;
    let (src, dst, l4, ip_payload) = match proto {
        0x0800 => {
            let Some(h) = p.get(off..off + 20) else { return pass };
            let ihl = usize::from(h[0] & 15) * 4;
            if h[0] >> 4 != 4 || ihl < 20 || h[9] != 17 || be16(h, 6).unwrap() & 0x3FFF != 0 {
                return pass;
            }
            let tot = usize::from(be16(h, 2).unwrap());
            if tot < ihl {
                return pass;
            }
            let (src, dst) = (Ipv4Addr::new(h[12], h[13], h[14], h[15]), Ipv4Addr::new(h[16], h[17], h[18], h[19]));
            (IpAddr::V4(src), IpAddr::V4(dst), off + ihl, tot - ihl)
        }
        0x86DD => {
            let Some(h) = p.get(off..off + 40) else { return pass };
            if h[0] >> 4 != 6 || h[6] != 17 {
                return pass;
            }
            let a: [u8; 16] = h[8..24].try_into().unwrap();
            let d: [u8; 16] = h[24..40].try_into().unwrap();
            (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(d)), off + 40, usize::from(be16(h, 4).unwrap()))
        }
        _ => return pass,
    };
    let Some(udp) = p.get(l4..l4 + 8) else { return pass };
    let (sport, dport, udp_len) = (be16(udp, 0).unwrap(), be16(udp, 2).unwrap(), usize::from(be16(udp, 4).unwrap()));
    if dport != PORT || c.delivery == delivery::PASS {
        return pass;
    }
    let Some(leap) = p.get(l4 + 8..l4 + 20) else { return (Counter::NotLeap, XDP_PASS, None) };
    if u32::from_be_bytes(leap[..4].try_into().unwrap()) != LEAP_MAGIC {
        return (Counter::NotLeap, XDP_PASS, None);
    }
    let rejected = if c.flags & cfg::DROP_REJECTED != 0 { XDP_DROP } else { XDP_PASS };
    let (chunk_id, total, reserved) = (be16(leap, 6).unwrap(), be16(leap, 8).unwrap(), be16(leap, 10).unwrap());
    // What the kernel would drop before any socket, in the program's order.
    let local_only = c.flags & cfg::LOCAL_ONLY != 0;
    if local_only && p[0] & 1 == 0 && p[..6] != c.mac {
        return (Counter::ForeignMac, rejected, None);
    }
    if local_only && vlan.is_some_and(|v| v != 0 && v != HOST_VLAN) {
        return (Counter::ForeignVlan, rejected, None);
    }
    if let IpAddr::V6(v6) = src
        && is_v4_mapped(&v6.octets())
    {
        return (Counter::MappedSource, rejected, None);
    }
    if local_only && !local_addrs().iter().any(|a| LocalAddr::new(*a) == LocalAddr::new(dst)) {
        return (Counter::ForeignDst, rejected, None);
    }
    if src.is_ipv4() && ones_complement_sum(&p[l3..l4]) != 0xFFFF {
        return (Counter::BadIpChecksum, rejected, None);
    }
    // Longer than any train: passed to the kernel's socket.
    if udp_len > 8 + TRAIN_DATAGRAM_MAX {
        return (Counter::PassedOversize, XDP_PASS, None);
    }
    let in_packet = p.len() - l4;
    if udp_len != ip_payload || udp_len > in_packet || udp_len < 20 {
        return (Counter::Malformed, rejected, None);
    }
    // A train: every piece but the last full, the last with a header.
    let datagram = &p[l4 + 8..l4 + udp_len];
    let pieces: Vec<&[u8]> = datagram.chunks(CHUNK_DATAGRAM_MAX).collect();
    if pieces.last().unwrap().len() < 12 {
        return (Counter::Malformed, rejected, None);
    }
    let src = SocketAddr::new(src, sport);
    for (i, piece) in pieces.iter().enumerate() {
        let (chunk_id, total, reserved) = if i == 0 {
            (chunk_id, total, reserved)
        } else {
            (be16(piece, 6).unwrap(), be16(piece, 8).unwrap(), be16(piece, 10).unwrap())
        };
        if u32::from_be_bytes(piece[..4].try_into().unwrap()) != LEAP_MAGIC || chunk_id >= total {
            return (Counter::Malformed, rejected, None);
        }
        if c.flags & cfg::PEER_FILTER != 0 {
            let header = ChunkHeader { seq: 0, chunk_id, total_chunks: total, reserved };
            let bit = 1u32 << header.kind() as u32;
            let key = PeerKey::new(src, dport);
            if !peers.iter().any(|(k, r)| *k == key && r.kinds & bit != 0) {
                return (Counter::WrongSource, rejected, None);
            }
        }
    }
    match c.delivery {
        // No AF_XDP socket is bound in a test run.
        delivery::XSK => (Counter::NoSocket, XDP_PASS, None),
        // One record per chunk.
        _ => (Counter::ToRingBuf, XDP_DROP, Some(pieces.iter().map(|d| (src, dst, dport, d.to_vec())).collect())),
    }
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn kernel_program_decides_like_the_reference_model() {
    let mut prog = XdpProgram::load(&object()).unwrap();
    prog.add_port(PORT).unwrap();
    let peers = [
        (PeerKey::new(prev(), PORT), PeerRule::allow(&[ChunkKind::Data, ChunkKind::Control])),
        (PeerKey::new(next(), PORT), PeerRule::allow(&[ChunkKind::Nack])),
    ];
    for (k, r) in &peers {
        prog.allow_peer(k.source(), k.dst_port, *r).unwrap();
    }
    for a in local_addrs() {
        prog.add_local_addr(a).unwrap();
    }
    prog.allow_vlan(HOST_VLAN).unwrap();
    let host = |flags| XdpConfig { delivery: delivery::RING_BUF, flags, mac: HOST_MAC, ..XdpConfig::default() };
    let ring = std::cell::RefCell::new(RingReader::new(prog.take_ring_buf().unwrap()));
    let configs = [
        XdpConfig { delivery: delivery::PASS, ..XdpConfig::default() },
        XdpConfig { delivery: delivery::XSK, ..XdpConfig::default() },
        XdpConfig { delivery: delivery::XSK, flags: cfg::DROP_REJECTED | cfg::PEER_FILTER, ..XdpConfig::default() },
        XdpConfig { delivery: delivery::RING_BUF, wakeup_every: 4, ..XdpConfig::default() },
        XdpConfig { delivery: delivery::RING_BUF, flags: cfg::PEER_FILTER, wakeup_every: 1, ..XdpConfig::default() },
        XdpConfig { delivery: delivery::RING_BUF, flags: cfg::DROP_REJECTED, ..XdpConfig::default() },
        host(cfg::LOCAL_ONLY),
        host(cfg::LOCAL_ONLY | cfg::DROP_REJECTED | cfg::PEER_FILTER),
        XdpConfig { delivery: delivery::XSK, flags: cfg::LOCAL_ONLY, mac: HOST_MAC, ..XdpConfig::default() },
    ];
    let seen = std::cell::RefCell::new(std::collections::HashMap::new());
    for c in configs {
        prog.configure(&c).unwrap();
        let mut runner = TestRunner::new(Config { cases: 1500, failure_persistence: None, ..Config::default() });
        let result = runner.run(&spec(), |s| {
            let packet = build(&s);
            let before: XdpCounters = prog.counters().unwrap();
            let action = prog.test_run(&packet).unwrap();
            let delta = prog.counters().unwrap().since(&before);
            let (counter, want_action, want_record) = model(&packet, &c, &peers);
            prop_assert_eq!(action, want_action, "config {:?}, packet {:02x?}", c, packet);
            prop_assert_eq!(delta.total(), 1, "exactly one decision: {}", delta);
            prop_assert_eq!(delta.get(counter), 1, "config {:?}: expected {}: {}", c, counter.name(), delta);
            let mut records = Vec::new();
            ring.borrow_mut().recv(8, |r| {
                records.push((r.source(), r.destination(), r.dst_port, r.udp_check, r.datagram().map(<[u8]>::to_vec)))
            });
            match want_record {
                Some(want) => {
                    prop_assert_eq!(records.len(), want.len());
                    for (got, (src, dst, dport, bytes)) in records.iter().zip(want) {
                        prop_assert_eq!(got.0, src);
                        prop_assert_eq!(got.1, dst);
                        prop_assert_eq!(got.2, dport);
                        prop_assert_eq!(got.3, UDP_CHECK);
                        prop_assert_eq!(got.4.as_deref(), Some(&bytes[..]));
                    }
                }
                None => prop_assert!(records.is_empty(), "unexpected ring-buffer record"),
            }
            *seen.borrow_mut().entry(counter.name()).or_insert(0u32) += 1;
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
    }
    // The generator reached every decision the test runs can reach.
    let seen = seen.into_inner();
    for c in [
        "passed",
        "not_leap",
        "malformed",
        "wrong_source",
        "no_socket",
        "to_ringbuf",
        "foreign_mac",
        "foreign_vlan",
        "mapped_source",
        "foreign_dst",
        "bad_ip_checksum",
        "passed_oversize",
    ] {
        assert!(seen.get(c).copied().unwrap_or(0) >= 10, "decision {c} too rare: {seen:?}");
    }
}
