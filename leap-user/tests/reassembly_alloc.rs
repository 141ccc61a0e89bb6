//! After warm-up, reassembling a frame allocates nothing.

mod support;

use leap::frame::{Chunker, Push, Reassembler};
use leap_common::chunk::ChunkHeader;

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

#[test]
fn reassembly_allocates_nothing_per_frame_after_warm_up() {
    const LEN: usize = 16392;
    let frame: Vec<u8> = (0..LEN).map(|i| i as u8).collect();
    let mut wire = vec![0u8; 1412 * 12];
    let mut lens = [0usize; 12];
    let mut r = Reassembler::new(LEN);
    let mut out = vec![0u8; LEN];
    let mut run = |seq: u16, out: &mut [u8], wire: &mut [u8], lens: &mut [usize; 12]| {
        for (i, c) in Chunker::new(seq, 0, &frame[..8], &frame[8..]).unwrap().enumerate() {
            let d = &mut wire[i * 1412..];
            c.header.write(d);
            let (a, b) = (c.pieces[0], c.pieces[1]);
            d[12..12 + a.len()].copy_from_slice(a);
            d[12 + a.len()..12 + a.len() + b.len()].copy_from_slice(b);
            lens[i] = c.datagram_len();
        }
        r.begin(out);
        // Deliver odd chunks first, then even: exercises reordering.
        let mut done = false;
        for i in (1..12).step_by(2).chain((0..12).step_by(2)) {
            let d = &wire[i * 1412..i * 1412 + lens[i]];
            let (h, p) = ChunkHeader::parse_data(d).unwrap();
            if let Push::Complete(got) = r.push(&h, p, out) {
                assert_eq!(got.len, LEN);
                done = true;
            }
        }
        assert!(done);
        assert_eq!(&out[..], &frame[..]);
    };
    for seq in 0..20 {
        run(seq, &mut out, &mut wire, &mut lens);
    }
    let before = support::allocations();
    for seq in 20..2000 {
        run(seq, &mut out, &mut wire, &mut lens);
    }
    assert_eq!(support::allocations(), before, "allocations while reassembling");
}
