//! Rings across namespaces with chunks dropped on every link by nftables
//! (`leap ring --loss`): reliable mode delivers every frame intact, best
//! effort loses frames but never corrupts one or hangs.

use std::process::Command;

use leap::ring::{Placement, RingConfig, run};
use leap::transport::config::Reliability;
use leap::transport::open::TransportKind;

fn lossy(kind: TransportKind, loss: f64, frames: u64, reliability: Reliability) -> leap::ring::RingReport {
    lossy_inflight(kind, loss, frames, reliability, 1)
}

fn lossy_inflight(
    kind: TransportKind,
    loss: f64,
    frames: u64,
    reliability: Reliability,
    inflight: usize,
) -> leap::ring::RingReport {
    let mut cfg = RingConfig::new(kind, 3, 16392, frames);
    cfg.placement = Placement::Netns;
    cfg.inflight = inflight;
    cfg.loss_pct = loss;
    cfg.options.reliability = reliability;
    if reliability == Reliability::BestEffort {
        cfg.options.recv_timeout = Some(std::time::Duration::from_millis(50));
    }
    let r = run(&cfg).unwrap();
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap().stdout;
    assert!(!String::from_utf8_lossy(&ns).contains(&format!("lp{}n", std::process::id() % 100_000)));
    r
}

#[test]
#[ignore = "needs root for namespaces and nftables: run by cargo xtask ci (stage privileged)"]
fn udp_ring_with_1_percent_loss_delivers_every_frame() {
    let r = lossy(TransportKind::Udp, 1.0, 2000, Reliability::Reliable);
    assert_eq!((r.frames_delivered, r.frames_corrupt), (2000, 0), "{r:?}");
    assert!(r.retransmits > 0);
    // The lost chunks were brought by retransmissions (and counted so).
    assert!(r.stats.chunks_recovered > 0 && r.stats.chunks_recovered <= r.retransmits + r.stats.probes, "{r:?}");
}

#[test]
#[ignore = "needs root for namespaces and nftables: run by cargo xtask ci (stage privileged)"]
fn udp_ring_with_5_percent_loss_delivers_every_frame() {
    let r = lossy(TransportKind::Udp, 5.0, 2000, Reliability::Reliable);
    assert_eq!((r.frames_delivered, r.frames_corrupt), (2000, 0), "{r:?}");
    assert!(r.retransmits > 0 && r.stats.nacks_sent > 0);
}

#[test]
#[ignore = "needs root for namespaces and nftables: run by cargo xtask ci (stage privileged)"]
fn udp_ring_with_5_percent_loss_and_48_in_flight_recovers_on_the_hops() {
    // The window and the frames kept for NACKs follow the frames in flight:
    // no frame falls out of the window, every NACK finds its frame, and the
    // head never has to send a frame again (with a fixed window of 16 and
    // 32 frames kept, this ring stalled).
    let r = lossy_inflight(TransportKind::Udp, 5.0, 600, Reliability::Reliable, 48);
    assert_eq!((r.frames_delivered, r.frames_corrupt, r.frames_lost), (600, 0, 0), "{r:?}");
    assert_eq!(r.frames_resent, 0, "the head re-sent frames: {r:?}");
    assert_eq!(r.stats.drops.out_of_window, 0, "{r:?}");
    assert_eq!(r.stats.nacks_unknown, 0, "{r:?}");
    assert!(r.retransmits > 0, "{r:?}");
}

#[test]
#[ignore = "needs root for namespaces and nftables: run by cargo xtask ci (stage privileged)"]
fn best_effort_ring_with_loss_never_delivers_a_corrupt_frame() {
    let r = lossy(TransportKind::Udp, 5.0, 300, Reliability::BestEffort);
    assert_eq!(r.frames_corrupt, 0, "{r:?}");
    assert!(r.frames_lost > 0, "5% chunk loss without recovery must lose frames");
    assert_eq!(r.frames_delivered + r.frames_lost, 300);
    assert_eq!(r.retransmits, 0);
}

/// A keyed udp ring (tagged or encrypted) with 5 % of the chunks dropped on
/// every link: every frame intact, nothing refused.
fn keyed_lossy(size: usize, frames: u64, encrypt: bool) {
    let mut cfg = RingConfig::new(TransportKind::Udp, 3, size, frames);
    cfg.placement = Placement::Netns;
    cfg.loss_pct = 5.0;
    cfg.options.ring_key = Some(leap::transport::ring_key::KeySet {
        encrypt,
        ..leap::transport::ring_key::KeySet::new(leap::transport::ring_key::RingKey::from_bytes([5; 32]))
    });
    let r = run(&cfg).unwrap();
    assert_eq!((r.frames_delivered, r.frames_corrupt), (frames, 0), "{r:?}");
    assert!(r.retransmits > 0, "{r:?}");
    assert_eq!((r.stats.drops.bad_tag, r.stats.drops.unkeyed), (0, 0), "{r:?}");
}

#[test]
#[ignore = "needs root for namespaces and nftables: run by cargo xtask ci (stage privileged)"]
fn keyed_udp_rings_with_5_percent_loss_deliver_every_frame() {
    for encrypt in [false, true] {
        keyed_lossy(16392, 500, encrypt);
        keyed_lossy(1 << 20, 20, encrypt);
    }
}
