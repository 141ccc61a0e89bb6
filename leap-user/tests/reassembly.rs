//! Reassembly driven with in-memory chunks: order, loss, duplicates, wrap.

use leap::FrameKind;
use leap::frame::reassembly::{FAR_AHEAD_EVIDENCE, RESTART_EVIDENCE};
use leap::frame::{Chunker, Push, Reassembler};
use leap_common::chunk::{ChunkHeader, flags};
use leap_common::control::{ControlMessage, ControlType};
use proptest::prelude::*;

fn frame(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The datagrams of a frame as the wire would carry them.
fn datagrams(seq: u16, reserved: u16, f: &[u8]) -> Vec<Vec<u8>> {
    Chunker::new(seq, reserved, f, &[])
        .unwrap()
        .map(|c| {
            let mut d = c.header.to_bytes().to_vec();
            c.extend_payload(&mut d);
            d
        })
        .collect()
}

fn push(r: &mut Reassembler, d: &[u8], out: &mut [u8]) -> Push {
    match ChunkHeader::parse_data(d) {
        Ok((h, p)) => r.push(&h, p, out),
        Err(e) => {
            r.drops_mut().count_parse(e);
            Push::Dropped
        }
    }
}

#[test]
fn in_order_chunks_make_the_frame() {
    let f = frame(1, 16392);
    let mut r = Reassembler::new(16392);
    let mut out = vec![0; 16392];
    assert_eq!(r.begin(&mut out), None);
    let ds = datagrams(0, flags::LEAP, &f);
    for d in &ds[..11] {
        assert_eq!(push(&mut r, d, &mut out), Push::Stored);
    }
    let Push::Complete(got) = push(&mut r, &ds[11], &mut out) else { panic!("not complete") };
    assert_eq!(got.len, 16392);
    assert_eq!(got.kind, FrameKind::Data);
    assert_eq!(out, f);
}

#[test]
fn reordered_and_duplicated_chunks_make_the_frame_once() {
    let f = frame(2, 5000);
    let mut r = Reassembler::new(8000);
    let mut out = vec![0; 8000];
    r.begin(&mut out);
    let ds = datagrams(9, 0, &f);
    assert_eq!(push(&mut r, &ds[3], &mut out), Push::Stored);
    assert_eq!(push(&mut r, &ds[1], &mut out), Push::Stored);
    assert_eq!(push(&mut r, &ds[1], &mut out), Push::Dropped);
    assert_eq!(push(&mut r, &ds[0], &mut out), Push::Stored);
    let Push::Complete(got) = push(&mut r, &ds[2], &mut out) else { panic!() };
    assert_eq!(&out[..got.len], &f[..]);
    assert_eq!(r.drops().duplicate, 1);
    // A late duplicate of the delivered frame is stale.
    assert_eq!(push(&mut r, &ds[2], &mut out), Push::Dropped);
    assert_eq!(r.drops().stale, 1);
}

#[test]
fn next_frame_arriving_early_is_kept_for_the_next_call() {
    let (a, b) = (frame(3, 3000), frame(4, 3000));
    let mut r = Reassembler::new(3000);
    let mut out = vec![0; 3000];
    r.begin(&mut out);
    let (da, db) = (datagrams(100, 0, &a), datagrams(101, 0, &b));
    push(&mut r, &da[0], &mut out);
    push(&mut r, &db[1], &mut out);
    push(&mut r, &da[2], &mut out);
    push(&mut r, &db[0], &mut out);
    assert!(matches!(push(&mut r, &da[1], &mut out), Push::Complete(_)));
    assert_eq!(out, a);
    // The rest of b comes in the same batch, after a completed.
    assert_eq!(r.stash(&ChunkHeader::parse_data(&db[2]).unwrap().0, &db[2][12..]), Push::Stored);
    let mut out2 = vec![0; 3000];
    let got = r.begin(&mut out2).expect("b is complete");
    assert_eq!(got.len, 3000);
    assert_eq!(out2, b);
}

#[test]
fn seq_wraps_around() {
    let mut r = Reassembler::new(2000);
    let mut out = vec![0; 2000];
    for (i, seq) in [65534u16, 65535, 0, 1].into_iter().enumerate() {
        let f = frame(i as u8, 2000);
        r.begin(&mut out);
        let ds = datagrams(seq, 0, &f);
        push(&mut r, &ds[1], &mut out);
        assert!(matches!(push(&mut r, &ds[0], &mut out), Push::Complete(_)), "seq {seq}");
        assert_eq!(out, f);
    }
}

#[test]
fn disagreeing_total_is_dropped_and_never_corrupts() {
    let f = frame(5, 4200);
    let mut r = Reassembler::new(8400);
    let mut out = vec![0; 8400];
    r.begin(&mut out);
    let ds = datagrams(1, 0, &f);
    push(&mut r, &ds[0], &mut out);
    let mut evil = ds[1].clone();
    evil[9] = 6; // total_chunks 6 instead of 3
    evil[12..].fill(0xEE);
    assert_eq!(push(&mut r, &evil, &mut out), Push::Dropped);
    assert_eq!(r.drops().total_mismatch, 1);
    push(&mut r, &ds[1], &mut out);
    let Push::Complete(got) = push(&mut r, &ds[2], &mut out) else { panic!() };
    assert_eq!(&out[..got.len], &f[..]);
}

#[test]
fn malformed_datagrams_are_counted() {
    let mut r = Reassembler::new(3000);
    let mut out = vec![0; 3000];
    let ok = datagrams(1, 0, &frame(6, 3000));
    let mut bad_magic = ok[0].clone();
    bad_magic[0] = 0;
    let mut bad_id = ok[0].clone();
    bad_id[7] = 3;
    let mut short_middle = ok[0].clone();
    short_middle.truncate(100);
    let mut oversize = ok[0].clone();
    oversize.push(1);
    for d in [&bad_magic, &bad_id, &short_middle, &oversize, &ok[0][..5].to_vec()] {
        assert_eq!(push(&mut r, d, &mut out), Push::Dropped);
    }
    let d = r.drops();
    assert_eq!((d.bad_magic, d.bad_chunk_id, d.bad_length, d.oversize, d.short), (1, 1, 1, 1, 1));
}

#[test]
fn lost_chunk_never_completes_and_abandon_moves_on() {
    let (a, b) = (frame(7, 2800), frame(8, 2800));
    let mut r = Reassembler::new(2800);
    let mut out = vec![0; 2800];
    r.begin(&mut out);
    push(&mut r, &datagrams(10, 0, &a)[0], &mut out);
    assert!(r.has_partial());
    assert_eq!(r.missing().collect::<Vec<_>>(), vec![1]);
    let lost = r.abandon();
    assert_eq!((lost.seq, lost.missing, lost.total), (10, 1, 2));
    r.begin(&mut out);
    let db = datagrams(11, 0, &b);
    push(&mut r, &db[0], &mut out);
    assert!(matches!(push(&mut r, &db[1], &mut out), Push::Complete(_)));
    assert_eq!(out, b);
}

#[test]
fn one_far_ahead_chunk_changes_nothing_but_a_long_run_overtakes_the_frame() {
    let mut r = Reassembler::new(2800);
    let mut out = vec![0; 2800];
    r.begin(&mut out);
    push(&mut r, &datagrams(10, 0, &frame(1, 2800))[0], &mut out);
    assert!(!r.is_overtaken());
    push(&mut r, &datagrams(10 + 200, 0, &frame(1, 2800))[0], &mut out);
    assert!(!r.is_overtaken() && !r.saw_ahead());
    assert_eq!(r.drops().out_of_window, 1);
    for k in 0..FAR_AHEAD_EVIDENCE {
        push(&mut r, &datagrams(300 + k as u16, 0, &frame(1, 2800))[0], &mut out);
    }
    assert!(r.is_overtaken());
}

#[test]
fn restarted_sender_is_resynced_after_a_quiet_deadline_with_enough_evidence() {
    let mut r = Reassembler::new(1400);
    let mut out = vec![0; 1400];
    for seq in 500..503 {
        r.begin(&mut out);
        assert!(matches!(push(&mut r, &datagrams(seq, 0, &frame(1, 1400))[0], &mut out), Push::Complete(_)));
    }
    r.begin(&mut out);
    // Probes and duplicates of delivered frames, and a few forged old
    // chunks: never a resync.
    for seq in (500..503).chain(0..20) {
        assert_eq!(push(&mut r, &datagrams(seq, 0, &frame(2, 1400))[0], &mut out), Push::Dropped);
    }
    assert!(!r.resync_if_restarted());
    // The sender restarts at seq 0 and sends frame after frame.
    for seq in 0..RESTART_EVIDENCE as u16 {
        assert_eq!(push(&mut r, &datagrams(seq, 0, &frame(2, 1400))[0], &mut out), Push::Dropped);
    }
    assert!(r.resync_if_restarted());
    r.begin(&mut out);
    assert!(matches!(push(&mut r, &datagrams(64, 0, &frame(3, 1400))[0], &mut out), Push::Complete(_)));
    assert_eq!(out, frame(3, 1400));
}

#[test]
fn chunks_beyond_max_frame_len_are_dropped_even_with_a_larger_buffer() {
    // Once a panic: a 64-chunk frame for a 16 392-byte reassembler with a
    // 100 000-byte buffer, then a deadline.
    let mut r = Reassembler::with_window(16_392, 8);
    let mut out = vec![0; 100_000];
    r.begin(&mut out);
    let d = datagrams(0, flags::LEAP | flags::RELIABLE, &frame(1, 64 * 1400));
    assert_eq!(push(&mut r, &d[50], &mut out), Push::Dropped);
    assert_eq!(r.drops().too_large, 1);
    r.suspend(&out);
    // A frame that fits is taken, in one buffer and another.
    let ok = frame(2, 16_392);
    let d = datagrams(0, flags::LEAP, &ok);
    push(&mut r, &d[11], &mut out);
    r.suspend(&out);
    let mut small = vec![0; 16_392];
    assert_eq!(r.begin(&mut small), None);
    for c in &d[..10] {
        push(&mut r, c, &mut small);
    }
    assert!(matches!(push(&mut r, &d[10], &mut small), Push::Complete(_)));
    assert_eq!(small, ok);
}

/// The datagrams of a frame sent with a CRC trailer.
fn crc_datagrams(seq: u16, f: &[u8], crc: u32) -> Vec<Vec<u8>> {
    let t = crc.to_le_bytes();
    Chunker::with_trailer(seq, flags::LEAP | flags::CRC, f, &[], &t)
        .unwrap()
        .map(|c| {
            let mut d = c.header.to_bytes().to_vec();
            c.extend_payload(&mut d);
            d
        })
        .collect()
}

#[test]
fn crc_frames_are_checked_at_every_trailer_position() {
    // Frame lengths that put the trailer inside the last chunk, across the
    // last two chunks, and in a chunk of its own.
    for len in [1, 5, 1396, 1397, 1398, 1399, 1400, 2796, 2800, 16_392] {
        let f = frame(len as u8, len);
        let mut r = Reassembler::new(16_392);
        let mut out = vec![0; len];
        r.begin(&mut out);
        let mut last = Push::Dropped;
        for d in crc_datagrams(7, &f, crc32c::crc32c(&f)) {
            last = push(&mut r, &d, &mut out);
        }
        let Push::Complete(got) = last else { panic!("len {len}: {last:?}") };
        assert_eq!(got.len, len);
        assert_eq!(out, f, "len {len}");
        // A wrong CRC: dropped, counted, reported, the seq still expected.
        let mut r = Reassembler::new(16_392);
        r.begin(&mut out);
        for d in crc_datagrams(7, &f, crc32c::crc32c(&f) ^ 1) {
            assert_ne!(push(&mut r, &d, &mut out), Push::Complete(got), "len {len}");
        }
        assert_eq!(r.drops().bad_crc, 1, "len {len}");
        assert_eq!(r.take_corrupt(), Some(7));
        assert_eq!(r.expected(), Some(7));
    }
}

#[test]
fn altered_payload_under_a_crc_is_never_delivered() {
    let f = frame(9, 16_392);
    let mut ds = crc_datagrams(3, &f, crc32c::crc32c(&f));
    ds[4][100] ^= 0x40;
    let mut r = Reassembler::new(16_392);
    let mut out = vec![0; 16_392];
    r.begin(&mut out);
    for d in &ds {
        assert!(!matches!(push(&mut r, d, &mut out), Push::Complete(_)));
    }
    assert_eq!(r.take_corrupt(), Some(3));
    // Fetched again, intact: delivered.
    let mut last = Push::Dropped;
    for d in crc_datagrams(3, &f, crc32c::crc32c(&f)) {
        last = push(&mut r, &d, &mut out);
    }
    assert!(matches!(last, Push::Complete(_)));
    assert_eq!(out, f);
}

#[test]
fn suspended_frame_continues_in_another_buffer() {
    let f = frame(9, 4200);
    let mut r = Reassembler::new(4200);
    let mut first = vec![0; 4200];
    r.begin(&mut first);
    let ds = datagrams(3, 0, &f);
    push(&mut r, &ds[0], &mut first);
    push(&mut r, &ds[2], &mut first);
    r.suspend(&first);
    let mut second = vec![0; 4200];
    assert_eq!(r.begin(&mut second), None);
    assert!(matches!(push(&mut r, &ds[1], &mut second), Push::Complete(_)));
    assert_eq!(second, f);
}

#[test]
fn control_frames_are_recognised_from_flags_and_from_original_peers() {
    let mut msg = ControlMessage::new(ControlType::ResizeLayers);
    msg.end_layer = 4;
    let mut f = vec![0u8; 3000];
    msg.encode(&mut f).unwrap();
    for reserved in [flags::LEAP | 1, 0] {
        let mut r = Reassembler::new(3000);
        let mut out = vec![0; 3000];
        r.begin(&mut out);
        let mut last = Push::Dropped;
        for d in datagrams(0, reserved, &f) {
            last = push(&mut r, &d, &mut out);
        }
        let Push::Complete(got) = last else { panic!() };
        assert_eq!(got.kind, FrameKind::Control);
    }
    // A leap data frame whose first bytes look like control stays data.
    let mut r = Reassembler::new(3000);
    let mut out = vec![0; 3000];
    r.begin(&mut out);
    let mut last = Push::Dropped;
    for d in datagrams(0, flags::LEAP, &f) {
        last = push(&mut r, &d, &mut out);
    }
    let Push::Complete(got) = last else { panic!() };
    assert_eq!(got.kind, FrameKind::Data);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any interleaving, duplication and loss of the chunks of a run of
    /// frames: every delivered frame is byte-identical to the one sent, in
    /// sequence order, and frames with all their chunks are delivered.
    #[test]
    fn reassembly_never_delivers_a_corrupt_frame(
        len in 1usize..9000,
        start in any::<u16>(),
        nframes in 1usize..6,
        ops in prop::collection::vec((any::<u16>(), 0u8..10), 0..200),
        garbage in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..1500), 0..10),
    ) {
        let frames: Vec<Vec<u8>> = (0..nframes).map(|i| frame(i as u8 + 1, len)).collect();
        let mut pool: Vec<(usize, Vec<u8>)> = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            for d in datagrams(start.wrapping_add(i as u16), 0, f) {
                pool.push((i, d));
            }
        }
        // Shuffle-ish, duplicate and drop according to `ops`.
        let mut wire: Vec<(Option<usize>, Vec<u8>)> = pool.iter().map(|(i, d)| (Some(*i), d.clone())).collect();
        let mut dropped = vec![false; nframes];
        for (k, op) in &ops {
            if wire.is_empty() { break; }
            let at = *k as usize % wire.len();
            match op {
                0 => { let (i, _) = wire.remove(at); if let Some(i) = i { dropped[i] = true; } }
                1 | 2 => { let d = wire[at].clone(); wire.push(d); }
                _ => { let last = wire.len() - 1; wire.swap(at, last); }
            }
        }
        for g in &garbage {
            wire.insert(g.len() % (wire.len() + 1), (None, g.clone()));
        }
        // Recount drops: a removed chunk may have a duplicate left.
        for (i, lost) in dropped.iter_mut().enumerate() {
            let total = pool.iter().filter(|(j, _)| *j == i).count();
            let mut seen = std::collections::HashSet::new();
            for (j, d) in &wire { if *j == Some(i) { seen.insert(d[6..8].to_vec()); } }
            *lost = seen.len() < total;
        }
        let mut r = Reassembler::new(len);
        let mut out = vec![0u8; len];
        let mut delivered = Vec::new();
        r.begin(&mut out);
        for (_, d) in &wire {
            if let Push::Complete(got) = push(&mut r, d, &mut out) {
                prop_assert_eq!(got.len, len);
                let idx = frames.iter().position(|f| f[..] == out[..]);
                prop_assert!(idx.is_some(), "delivered a frame that was never sent");
                delivered.push(idx.unwrap());
                while let Some(done) = r.begin(&mut out) {
                    prop_assert_eq!(done.len, len);
                    let idx = frames.iter().position(|f| f[..] == out[..]);
                    prop_assert!(idx.is_some());
                    delivered.push(idx.unwrap());
                }
            }
        }
        prop_assert!(delivered.windows(2).all(|w| w[0] < w[1]), "out of order: {:?}", delivered);
        // Liveness: when the reassembler locks on the first frame and every
        // chunk arrived at least once (and no garbage), all frames arrive.
        if wire.first().is_some_and(|(i, _)| *i == Some(0)) && !dropped.contains(&true) && garbage.is_empty() {
            prop_assert_eq!(delivered, (0..nframes).collect::<Vec<_>>());
        }
    }
}

/// Values at the edges of a u16 field and of the frame.
fn edge_u16(around: u16) -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(0u16),
        Just(1),
        Just(around.saturating_sub(1)),
        Just(around),
        Just(around.saturating_add(1)),
        Just(u16::MAX - 1),
        Just(u16::MAX),
        any::<u16>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Structured chunks at the boundaries: a chunk at the buffer's end,
    /// totals at the bitmap's capacity and beyond, buffers larger and
    /// smaller than `max_frame_len`, seqs wrapping near 65535, every flag
    /// (CRC included), payloads of every edge length. Never a panic, never
    /// a frame longer than the smaller of the buffer and `max_frame_len`.
    #[test]
    fn chunks_at_the_boundaries_are_bounded(
        max_len in prop_oneof![Just(1usize), Just(1400), Just(1401), Just(16_392), 1usize..200_000],
        buf_len in prop_oneof![Just(0usize), Just(1400), Just(16_392), Just(100_000), 0usize..300_000],
        window in 1u16..17,
        chunks in prop::collection::vec(
            (edge_u16(65_535), edge_u16(64), edge_u16(64), prop_oneof![
                Just(0u16), Just(flags::LEAP), Just(flags::LEAP | flags::RELIABLE | flags::CRC),
                Just(flags::LEAP | flags::CRC | 1), any::<u16>()],
             prop_oneof![Just(1usize), Just(3), Just(4), Just(5), Just(1399), Just(1400), 1usize..1400]),
            1..120),
        ops in prop::collection::vec(0u8..8, 120),
    ) {
        let mut r = Reassembler::with_window(max_len, window);
        let mut out = vec![0u8; buf_len];
        let limit = buf_len.min(max_len);
        r.begin(&mut out);
        for (i, &(seq, id, total, reserved, plen)) in chunks.iter().enumerate() {
            let h = ChunkHeader { seq, chunk_id: id, total_chunks: total, reserved };
            let mut d = h.to_bytes().to_vec();
            d.extend(std::iter::repeat_n(seq as u8, plen));
            let res = push(&mut r, &d, &mut out);
            if let Push::Complete(got) = res {
                prop_assert!(got.len <= limit, "{} bytes delivered, limit {limit}", got.len);
            }
            match ops[i] {
                0 => r.suspend(&out),
                1 => {
                    if let Some(got) = r.begin(&mut out) {
                        prop_assert!(got.len <= limit);
                    }
                }
                2 => { r.abandon(); }
                3 => { r.resync_if_restarted(); }
                4 => { r.take_corrupt(); }
                _ => {}
            }
        }
    }

    /// Control messages with every field at an extreme: encoded only when
    /// valid, decoded back exactly, never a panic; a decoded frame always
    /// validates.
    #[test]
    fn control_messages_at_the_extremes(
        kind in 0u8..4,
        fields in prop::collection::vec(
            prop_oneof![Just(i32::MIN), Just(-1i32), Just(0), Just(1), Just(15), Just(16), Just(17), Just(i32::MAX)], 4),
        ranges in prop::collection::vec(
            (prop_oneof![Just(i32::MIN), Just(0i32), Just(1), Just(i32::MAX)],
             prop_oneof![Just(i32::MIN), Just(0i32), Just(1), Just(i32::MAX)], any::<bool>()), 16),
        tail in any::<bool>(),
        frame_len in prop_oneof![Just(0usize), Just(163), Just(164), Just(165), Just(16_392)],
    ) {
        use leap_common::control::LayerRange;
        let kind = match kind {
            0 => ControlType::ResizeLayers,
            1 => ControlType::ResizeChain,
            _ => ControlType::Ack,
        };
        let mut m = ControlMessage::new(kind);
        (m.split_layer, m.end_layer, m.worker_index, m.total_workers) = (fields[0], fields[1], fields[2], fields[3]);
        m.is_tail = tail;
        for (r, &(s, e, t)) in m.ranges.iter_mut().zip(&ranges) {
            *r = LayerRange { start_layer: s, end_layer: e, is_tail: t };
        }
        let mut f = vec![0u8; frame_len];
        match m.encode(&mut f) {
            Ok(()) => {
                let back = ControlMessage::decode(&f).unwrap();
                prop_assert_eq!(back, m);
                prop_assert!(ControlMessage::decode_frame(&f).is_ok());
            }
            Err(_) => {
                if let Ok(d) = ControlMessage::decode(&f) {
                    prop_assert!(d.validate().is_ok());
                }
            }
        }
    }
}
