//! Loss recovery over XDP: a 3-node namespace ring with chunks dropped on
//! every link (nftables, as `leap ring --loss`) delivers every frame intact
//! through AF_XDP and through the ring buffer. NACKs come back on the other
//! veth, through the kernel's UDP socket; retransmissions arrive through
//! XDP. Needs root and BPF: `cargo xtask ci`.

mod xdp_common;

use leap::ring::{Placement, RingConfig, run};
use leap::transport::open::TransportKind;
use leap::transport::ring_key::{KeySet, RingKey};
use leap::transport::xdp::ObjectSource;
use leap_common::chunk::{CHUNK_PAYLOAD_MAX, KEYED_PAYLOAD_MAX, chunks_for_stride};

fn lossy(kind: TransportKind, key: &str) {
    lossy_ring(kind, key, 16392, 1000, 2.0, None);
}

fn lossy_ring(kind: TransportKind, key: &str, size: usize, frames: u64, loss: f64, ring_key: Option<KeySet>) {
    let ObjectSource::File(object) = xdp_common::object() else { panic!("tests load the object from a file") };
    let keyed = ring_key.is_some();
    let mut cfg = RingConfig::new(kind, 3, size, frames);
    cfg.placement = Placement::Netns;
    cfg.loss_pct = loss;
    cfg.options.xdp_object = Some(object);
    cfg.options.ring_key = ring_key;
    let r = run(&cfg).unwrap();
    assert_eq!((r.frames_delivered, r.frames_corrupt), (frames, 0), "{r:?}");
    assert!(r.retransmits > 0 && r.stats.nacks_received > 0, "{r:?}");
    let xdp = r.xdp.expect("xdp counters");
    let via_xdp = xdp.get(key).unwrap();
    // Every hop of every frame: its chunks; some of them lost on the way.
    let per_chunk = if keyed { KEYED_PAYLOAD_MAX } else { CHUNK_PAYLOAD_MAX };
    let chunks = u64::from(chunks_for_stride(size, per_chunk).unwrap());
    assert!(via_xdp >= frames * chunks * 3 * 9 / 10, "{xdp}");
    if keyed {
        assert_eq!((r.stats.drops.bad_tag, r.stats.drops.unkeyed), (0, 0), "{r:?}");
    }
    assert!(xdp.get("chunks_via_kernel").unwrap() >= r.stats.nacks_received, "{xdp}");
    assert_eq!(xdp.get("malformed"), Some(0), "{xdp}");
    assert_eq!(xdp.get("wrong_source"), Some(0), "{xdp}");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn af_xdp_ring_with_2_percent_loss_delivers_every_frame() {
    lossy(TransportKind::Xdp, "to_xsk");
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn ring_buffer_ring_with_2_percent_loss_delivers_every_frame() {
    lossy(TransportKind::XdpRingbuf, "to_ringbuf");
}

fn key(encrypt: bool) -> Option<KeySet> {
    Some(KeySet { encrypt, ..KeySet::new(RingKey::from_bytes([8; 32])) })
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn keyed_af_xdp_ring_with_5_percent_loss_delivers_every_frame() {
    lossy_ring(TransportKind::Xdp, "to_xsk", 16392, 300, 5.0, key(false));
    lossy_ring(TransportKind::Xdp, "to_xsk", 1 << 20, 20, 5.0, key(false));
}

#[test]
#[ignore = "needs root + BPF: run by cargo xtask ci"]
fn encrypted_ring_buffer_ring_with_5_percent_loss_delivers_every_frame() {
    lossy_ring(TransportKind::XdpRingbuf, "to_ringbuf", 16392, 300, 5.0, key(true));
    lossy_ring(TransportKind::XdpRingbuf, "to_ringbuf", 1 << 20, 20, 5.0, key(true));
}
