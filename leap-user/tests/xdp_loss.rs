//! Loss recovery over XDP: a 3-node namespace ring with chunks dropped on
//! every link (nftables, as `leap ring --loss`) delivers every frame intact
//! through AF_XDP and through the ring buffer. NACKs come back on the other
//! veth, through the kernel's UDP socket; retransmissions arrive through
//! XDP. Needs root and BPF: `cargo xtask ci`.

mod xdp_common;

use leap::ring::{Placement, RingConfig, run};
use leap::transport::open::TransportKind;
use leap::transport::xdp::ObjectSource;

fn lossy(kind: TransportKind, key: &str) {
    let ObjectSource::File(object) = xdp_common::object() else { panic!("tests load the object from a file") };
    let frames = 1000;
    let mut cfg = RingConfig::new(kind, 3, 16392, frames);
    cfg.placement = Placement::Netns;
    cfg.loss_pct = 2.0;
    cfg.options.xdp_object = Some(object);
    let r = run(&cfg).unwrap();
    assert_eq!((r.frames_delivered, r.frames_corrupt), (frames, 0), "{r:?}");
    assert!(r.retransmits > 0 && r.stats.nacks_received > 0, "{r:?}");
    let xdp = r.xdp.expect("xdp counters");
    let via_xdp = xdp.get(key).unwrap();
    // Every hop of every frame: 12 chunks; some of them lost on the way.
    assert!(via_xdp >= frames * 12 * 3 * 9 / 10, "{xdp}");
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
