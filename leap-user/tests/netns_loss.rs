//! Rings across namespaces with chunks dropped on every link by nftables
//! (`leap ring --loss`): reliable mode delivers every frame intact, best
//! effort loses frames but never corrupts one or hangs.

use std::process::Command;

use leap::ring::{Placement, RingConfig, run};
use leap::transport::datagram::Reliability;
use leap::transport::open::TransportKind;

fn lossy(kind: TransportKind, loss: f64, frames: u64, reliability: Reliability) -> leap::ring::RingReport {
    let mut cfg = RingConfig::new(kind, 3, 16392, frames);
    cfg.placement = Placement::Netns;
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
fn best_effort_ring_with_loss_never_delivers_a_corrupt_frame() {
    let r = lossy(TransportKind::Udp, 5.0, 300, Reliability::BestEffort);
    assert_eq!(r.frames_corrupt, 0, "{r:?}");
    assert!(r.frames_lost > 0, "5% chunk loss without recovery must lose frames");
    assert_eq!(r.frames_delivered + r.frames_lost, 300);
    assert_eq!(r.retransmits, 0);
}
