//! Bounded-time fuzzing of everything that parses bytes from the network:
//! the chunk parser, the reassembly (with a model of what may come out),
//! the control decoder and the XDP frame parser (against an independent
//! checksum oracle). A small mutation fuzzer, so that it runs on the
//! stable toolchain in CI; `LEAP_FUZZ_SECS` sets the time per target
//! (default 2 s here, CI runs longer).

use std::time::{Duration, Instant};

use leap::frame::{Chunker, Push, Reassembler};
use leap_common::chunk::{ChunkHeader, flags};
use leap_common::control::{CONTROL_FRAME_MIN, ControlMessage, ControlType};

/// xorshift64*: deterministic per seed, so a failure prints its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn budget() -> Duration {
    let secs = std::env::var("LEAP_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// Flips, overwrites, truncates, extends: what a hostile sender would try.
fn mutate(rng: &mut Rng, d: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        match rng.below(6) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = rng.next() as u8;
            }
            2 => d.truncate(rng.below(d.len() + 1)),
            3 => d.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
            // Header fields: seq, chunk_id, total, reserved.
            4 if d.len() >= 12 => {
                let f = 4 + 2 * rng.below(4);
                let v = match rng.below(4) {
                    0 => 0u16,
                    1 => u16::MAX,
                    2 => rng.below(16) as u16,
                    _ => rng.next() as u16,
                };
                d[f..f + 2].copy_from_slice(&v.to_be_bytes());
            }
            _ => {}
        }
    }
}

#[test]
fn fuzz_chunk_parser() {
    let mut rng = Rng(0x1EA9_0001);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget() {
        let mut d: Vec<u8> = if rng.below(2) == 0 {
            (0..rng.below(1600)).map(|_| rng.next() as u8).collect()
        } else {
            let mut v = ChunkHeader::data(rng.next() as u16, 0, 1 + rng.below(100) as u16).to_bytes().to_vec();
            v.extend((0..rng.below(1500)).map(|_| rng.next() as u8));
            v
        };
        mutate(&mut rng, &mut d);
        if let Ok((h, p)) = ChunkHeader::parse(&d) {
            assert!(h.chunk_id < h.total_chunks && p.len() <= 1400 && p.len() == d.len() - 12);
            let mut again = h.to_bytes().to_vec();
            again.extend_from_slice(p);
            assert_eq!(again, d, "parse/write is not a round trip");
        }
        if let Ok((h, p)) = ChunkHeader::parse_data(&d) {
            assert!(if h.chunk_id + 1 == h.total_chunks { !p.is_empty() } else { p.len() == 1400 });
        }
        n += 1;
    }
    eprintln!("chunk parser: {n} inputs");
}

#[test]
fn fuzz_reassembly_never_delivers_bytes_that_were_not_sent() {
    let mut rng = Rng(0x1EA9_0002);
    let start = Instant::now();
    let mut delivered = 0u64;
    let mut runs = 0u64;
    while start.elapsed() < budget() {
        let len = 1 + rng.below(9000);
        let frames: Vec<Vec<u8>> =
            (0..1 + rng.below(5)).map(|k| (0..len).map(|i| (i as u8) ^ (k as u8 * 37 + 1)).collect()).collect();
        let seq0 = rng.next() as u16;
        let mut wire = Vec::new();
        for (k, f) in frames.iter().enumerate() {
            for c in Chunker::new(seq0.wrapping_add(k as u16), flags::LEAP, f, &[]).unwrap() {
                let mut d = c.header.to_bytes().to_vec();
                c.extend_payload(&mut d);
                wire.push(d);
            }
        }
        // Hostile copies: mutated versions of real chunks, mixed in.
        for _ in 0..rng.below(wire.len() + 1) {
            let mut d = wire[rng.below(wire.len())].clone();
            mutate(&mut rng, &mut d);
            let at = rng.below(wire.len() + 1);
            wire.insert(at, d);
        }
        for _ in 0..rng.below(wire.len()) {
            let (a, b) = (rng.below(wire.len()), rng.below(wire.len()));
            wire.swap(a, b);
        }
        let mut r = Reassembler::with_window(len.max(1 + rng.below(20_000)), 1 << rng.below(5));
        let mut out = vec![0u8; len + rng.below(3000)];
        r.begin(&mut out);
        for d in &wire {
            let Ok((h, p)) = ChunkHeader::parse_data(d) else { continue };
            let res = if rng.below(20) == 0 { r.stash(&h, p) } else { r.push(&h, p, &mut out) };
            let mut check = |got: leap::Received, out: &[u8]| {
                // A delivered frame either is one that was sent, or was
                // assembled from mutated chunks that claimed a sent frame's
                // seq: then every byte still comes from some sent chunk or a
                // mutation of one, which cannot be told apart here. What must
                // never happen is a length beyond the buffer or a panic.
                assert!(got.len <= out.len());
                if frames.iter().any(|f| f[..] == out[..got.len]) {
                    delivered += 1;
                }
            };
            if let Push::Complete(got) = res {
                check(got, &out);
                while let Some(got) = r.begin(&mut out) {
                    check(got, &out);
                }
            }
            if rng.below(50) == 0 {
                match rng.below(3) {
                    0 => {
                        r.abandon();
                    }
                    1 => {
                        r.suspend(&out);
                        r.begin(&mut out);
                    }
                    _ => {
                        r.resync_if_restarted();
                    }
                }
            }
        }
        runs += 1;
    }
    eprintln!("reassembly: {runs} runs, {delivered} intact frames");
    assert!(delivered > 0, "the fuzzer never completed a frame: it tests nothing");
}

#[test]
fn fuzz_control_decoder() {
    let mut rng = Rng(0x1EA9_0003);
    let start = Instant::now();
    let mut valid = 0u64;
    while start.elapsed() < budget() {
        let mut f = vec![0u8; CONTROL_FRAME_MIN + rng.below(300)];
        let kind = [ControlType::ResizeLayers, ControlType::ResizeChain, ControlType::Ack][rng.below(3)];
        let mut m = ControlMessage::new(kind);
        m.total_workers = rng.below(17) as i32;
        m.worker_index = rng.below(m.total_workers as usize + 1) as i32;
        m.encode(&mut f).unwrap();
        mutate(&mut rng, &mut f);
        if let Ok(msg) = ControlMessage::decode(&f) {
            valid += 1;
            assert!(msg.validate().is_ok());
            let mut again = vec![0u8; CONTROL_FRAME_MIN];
            msg.encode(&mut again).unwrap();
            assert_eq!(ControlMessage::decode(&again).unwrap(), msg);
        }
        let _ = ControlMessage::decode_frame(&f);
    }
    assert!(valid > 0);
}

#[test]
fn fuzz_nack_answering_is_bounded_by_the_frame() {
    use leap::frame::reliable::{RETX_BURST, RetransmitBuffer, decode_nack};
    let mut rng = Rng(0x1EA9_0004);
    let start = Instant::now();
    let mut nacks = 0u64;
    let mut buf = RetransmitBuffer::new(4);
    let mut ids = [0u16; RETX_BURST];
    let t0 = Instant::now();
    while start.elapsed() < budget() {
        let len = 1 + rng.below(200_000);
        let total = leap_common::chunk::chunks_for(len).unwrap();
        let seq = rng.next() as u16;
        buf.store(seq, flags::LEAP, &vec![0u8; len], &[], &[]);
        // Ranges at the boundaries and anywhere, as many as fit a datagram.
        let n = 1 + rng.below(leap::frame::reliable::NACK_MAX_RANGES);
        let mut payload = Vec::with_capacity(n * 4);
        for _ in 0..n {
            let pick = |rng: &mut Rng| match rng.below(5) {
                0 => 0u16,
                1 => u16::MAX,
                2 => total,
                3 => total.wrapping_sub(1),
                _ => rng.next() as u16,
            };
            let (first, count) = (pick(&mut rng), pick(&mut rng));
            payload.extend_from_slice(&first.to_be_bytes());
            payload.extend_from_slice(&count.to_be_bytes());
        }
        let mut bytes = payload.clone();
        if rng.below(10) == 0 {
            mutate(&mut rng, &mut bytes);
        }
        let hdr = ChunkHeader { seq, chunk_id: 0, total_chunks: (bytes.len() / 4) as u16, reserved: 0 };
        let Some(ranges) = decode_nack(&hdr, &bytes) else { continue };
        // A second NACK for the same frame right away adds nothing new.
        let now = t0 + Duration::from_secs(nacks);
        buf.request(seq, ranges, now);
        let mut seen = vec![false; usize::from(total)];
        let mut sent = 0usize;
        while let Some((s, k)) = buf.next_burst(&mut ids, now) {
            assert_eq!(s, seq);
            for &id in &ids[..k] {
                assert!(id < total, "chunk {id} of a {total}-chunk frame");
                assert!(!seen[usize::from(id)], "chunk {id} queued twice by one NACK");
                seen[usize::from(id)] = true;
                sent += 1;
            }
        }
        assert!(sent <= usize::from(total));
        nacks += 1;
    }
    eprintln!("nack answering: {nacks} NACKs");
    assert!(nacks > 0);
}

#[test]
fn fuzz_sender_and_receiver_recover_every_frame_exactly_once() {
    use leap::frame::reliable::{NackAnswer, RETX_BURST, RetransmitBuffer, decode_nack, encode_nack, ranges};
    use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN};
    let mut rng = Rng(0x1EA9_0005);
    let start = Instant::now();
    let (mut runs, mut complete, mut frames_total, mut corrupted_total) = (0u64, 0u64, 0u64, 0u64);
    while start.elapsed() < budget() {
        let len = 1 + rng.below(20_000);
        let n = 1 + rng.below(12);
        let seq0 = if rng.below(3) == 0 { u16::MAX - rng.below(6) as u16 } else { rng.next() as u16 };
        let frames: Vec<Vec<u8>> = (0..n).map(|_| (0..len).map(|_| rng.next() as u8).collect()).collect();
        let window: u16 = 1 << rng.below(4);
        let reserved = flags::LEAP | flags::RELIABLE | flags::CRC;
        let mut sender = RetransmitBuffer::new(32);
        let mut rx = Reassembler::with_window(len + rng.below(100), window);
        let mut out = vec![0u8; len + rng.below(3000)];
        let (loss, dup, flip) = (rng.below(20), rng.below(10), rng.below(6));
        let channel = |rng: &mut Rng, wire: &mut Vec<Vec<u8>>, d: Vec<u8>, corrupted: &mut u64| {
            if rng.below(100) < loss {
                return;
            }
            let mut d = d;
            if rng.below(100) < flip && d.len() > CHUNK_HEADER_LEN {
                let i = CHUNK_HEADER_LEN + rng.below(d.len() - CHUNK_HEADER_LEN);
                d[i] ^= 1 << rng.below(8);
                *corrupted += 1;
            }
            if rng.below(100) < dup {
                wire.push(d.clone());
            }
            let at = wire.len().saturating_sub(rng.below(4));
            wire.insert(at, d);
        };
        let mut wire = Vec::new();
        let mut corrupted = 0;
        let encode = |seq: u16, f: &[u8], id: Option<u16>| -> Vec<Vec<u8>> {
            let crc = crc32c::crc32c(f).to_le_bytes();
            let r = if id.is_some() { reserved | flags::RETRANSMIT } else { reserved };
            let c = Chunker::with_trailer(seq, r, f, &[], &crc).unwrap();
            let one = id.and_then(|i| c.chunk(i));
            let all: Vec<_> = match id {
                Some(_) => one.into_iter().collect(),
                None => c.collect(),
            };
            all.into_iter()
                .map(|c| {
                    let mut d = c.header.to_bytes().to_vec();
                    c.extend_payload(&mut d);
                    d
                })
                .collect()
        };
        // The sender sends the frames `window` at a time at most.
        let mut next_to_send = 0usize;
        let mut delivered = 0usize;
        let mut last_delivered: Option<usize> = None;
        let mut refused = false;
        let mut ids = [0u16; RETX_BURST];
        let mut nack_buf = [0u8; CHUNK_DATAGRAM_MAX];
        let t0 = Instant::now();
        'rounds: for round in 0..400u64 {
            while next_to_send < n && next_to_send < delivered + usize::from(window) {
                let seq = seq0.wrapping_add(next_to_send as u16);
                let f = &frames[next_to_send];
                let crc = crc32c::crc32c(f).to_le_bytes();
                sender.store(seq, reserved, f, &[], &crc);
                for d in encode(seq, f, None) {
                    channel(&mut rng, &mut wire, d, &mut corrupted);
                }
                next_to_send += 1;
            }
            if rx.begin(&mut out).is_some() {
                unreachable!("complete frames are delivered by push");
            }
            for d in std::mem::take(&mut wire) {
                let Ok((h, p)) = ChunkHeader::parse_data(&d) else { continue };
                // The receiver locks onto the first seq it sees (frames
                // before it are lost to it): check each delivery by seq.
                let mut seq = rx.expected().unwrap_or(h.seq);
                let mut res = rx.push(&h, p, &mut out);
                while let Push::Complete(got) = res {
                    let i = usize::from(seq.wrapping_sub(seq0));
                    assert!(i < n && last_delivered.is_none_or(|l| i > l), "frame {i} delivered out of order or twice");
                    assert_eq!(out[..got.len], frames[i][..], "frame {i} delivered wrong");
                    last_delivered = Some(i);
                    delivered = i + 1;
                    if delivered == n {
                        break 'rounds;
                    }
                    seq = seq.wrapping_add(1);
                    res = match rx.begin(&mut out) {
                        Some(got) => Push::Complete(got),
                        None => Push::Stored,
                    };
                }
            }
            // The receiver NACKs what the expected frame misses (all of it
            // after a CRC failure or when nothing came); the sender answers.
            let exp = rx.expected().unwrap_or(seq0.wrapping_add(delivered as u16));
            let all = rx.take_corrupt().is_some() || rx.progress().1 == 0;
            let k = if all {
                encode_nack(exp, [leap::frame::reliable::NACK_ALL], &mut nack_buf)
            } else {
                encode_nack(exp, ranges(rx.missing()), &mut nack_buf)
            };
            rx.suspend(&out);
            if k > 0 && rng.below(100) >= loss {
                let (h, p) = ChunkHeader::parse(&nack_buf[..k]).unwrap();
                let now = t0 + Duration::from_millis(round);
                if sender.request(h.seq, decode_nack(&h, p).unwrap(), now) == NackAnswer::Refused {
                    // The sender's limit per frame: a real receiver gives
                    // the frame up after a while and the head re-sends it.
                    refused = true;
                    break;
                }
                while let Some((seq, m)) = sender.next_burst(&mut ids, now) {
                    let i = usize::from(seq.wrapping_sub(seq0));
                    for &id in &ids[..m] {
                        for d in encode(seq, &frames[i], Some(id)) {
                            channel(&mut rng, &mut wire, d, &mut corrupted);
                        }
                    }
                }
            }
        }
        if delivered == n {
            complete += 1;
        } else {
            assert!(refused, "frames lost for good (loss {loss}%, flips {flip}%, window {window}, len {len})");
        }
        runs += 1;
        frames_total += n as u64;
        corrupted_total += corrupted;
    }
    eprintln!(
        "two parties: {runs} runs ({complete} recovered every frame), {frames_total} frames, \
         {corrupted_total} chunks corrupted in flight"
    );
    assert!(runs > 0 && corrupted_total > 0 && complete * 10 >= runs * 9, "too few runs recovered everything");
}

/// Folded ones'-complement sum of big-endian words, written apart from the
/// parser's own so that it is an independent oracle.
fn oracle_sum(parts: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = parts.concat();
    let mut sum: u64 = bytes.chunks(2).map(|w| u64::from(w[0]) << 8 | u64::from(*w.get(1).unwrap_or(&0))).sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

#[test]
fn fuzz_frame_parser_accepts_only_what_the_kernel_would() {
    use std::net::{IpAddr, SocketAddr};

    use leap::transport::xdp::RxFilter;
    use leap::transport::xdp::packet::{ChecksumFill, FrameSpec, UdpChecksum};

    let mut rng = Rng(0x1EA9_0004);
    let start = Instant::now();
    let (mut accepted, mut n) = (0u64, 0u64);
    let mac = [0x02, 0, 0, 0, 0, 1];
    let local: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
    while start.elapsed() < budget() {
        let v6 = rng.below(2) == 0;
        let (src, dst): (SocketAddr, SocketAddr) = if v6 {
            ("[fd00::1]:7000".parse().unwrap(), "[fd00::2]:9999".parse().unwrap())
        } else {
            ("10.0.0.1:7000".parse().unwrap(), "10.0.0.2:9999".parse().unwrap())
        };
        let payload: Vec<u8> = (0..rng.below(1500)).map(|_| rng.next() as u8).collect();
        let checksum = [ChecksumFill::Full, ChecksumFill::Partial, ChecksumFill::Zero][rng.below(3)];
        let vlan = [None, Some(5), Some(6)][rng.below(3)];
        let spec =
            FrameSpec { src_mac: [0x02, 0, 0, 0, 0, 2], dst_mac: mac, vlan, src, dst, checksum, payload: &payload };
        let mut f = spec.build();
        let partial_checksums = rng.below(2) == 0;
        let filter = RxFilter { mac: Some(mac), local: Some(local.clone()), vlans: vec![5], partial_checksums };
        let pristine = rng.below(8) == 0;
        if !pristine {
            mutate(&mut rng, &mut f);
        }
        n += 1;
        let Ok(d) = filter.admit_frame(&f) else {
            let expected_ok = vlan != Some(6) && (checksum != ChecksumFill::Partial || partial_checksums);
            assert!(!pristine || !expected_ok || (v6 && checksum == ChecksumFill::Zero), "a well-formed frame refused");
            continue;
        };
        accepted += 1;
        // Everything accepted is for this host and checksummed right.
        // VLAN 0 is a priority tag: untagged, as the kernel takes it.
        assert!(d.vlan.is_none_or(|v| v == 5 || v == 0), "VLAN {:?} accepted", d.vlan);
        assert!(local.contains(&d.dst.ip()));
        let l3 = if d.vlan.is_some() { 18 } else { 14 };
        // The UDP header sits right before the payload.
        let payload_at = d.payload.as_ptr() as usize - f.as_ptr() as usize;
        let udp = &f[payload_at - 8..payload_at];
        let (s, t) = match (d.src.ip(), d.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(t)) => {
                let ihl = usize::from(f[l3] & 15) * 4;
                assert_eq!(oracle_sum(&[&f[l3..l3 + ihl]]), 0xFFFF, "bad IPv4 header accepted");
                (s.octets().to_vec(), t.octets().to_vec())
            }
            (IpAddr::V6(s), IpAddr::V6(t)) => {
                assert!(s.to_ipv4_mapped().is_none(), "v4-mapped source accepted");
                (s.octets().to_vec(), t.octets().to_vec())
            }
            _ => unreachable!("mixed families"),
        };
        let len = ((d.payload.len() + 8) as u16).to_be_bytes();
        let pseudo = [&s[..], &t[..], &[0, 17], &len[..]];
        let check = u16::from_be_bytes([udp[6], udp[7]]);
        let full = oracle_sum(&[&pseudo.concat()[..], udp, d.payload]) == 0xFFFF;
        match d.checksum {
            UdpChecksum::Valid => assert!(full),
            UdpChecksum::Absent => assert!(check == 0 && d.src.is_ipv4()),
            UdpChecksum::Partial => assert!(partial_checksums && check == oracle_sum(&pseudo)),
            // Skipped only for a reliable CRC-carrying leap chunk.
            UdpChecksum::Unchecked => {
                let reserved = d.payload.get(10..12).map(|r| u16::from_be_bytes([r[0], r[1]]));
                let want = leap_common::chunk::flags::LEAP | leap_common::chunk::flags::CRC;
                assert!(d.payload.starts_with(b"LEAP") && reserved.is_some_and(|r| r & want == want));
            }
        }
    }
    eprintln!("frame parser: {n} inputs, {accepted} accepted");
    assert!(accepted > 0, "the fuzzer never built an acceptable frame: it tests nothing");
}
