//! Rings across network namespaces linked by veth pairs (root).

use std::process::Command;

use leap::ring::{Placement, RingConfig, run};
use leap::transport::open::TransportKind;

/// The network namespaces this process's rings name (`lp<pid>...`): other
/// processes on the machine may add and remove their own meanwhile.
fn namespaces() -> String {
    let ours = format!("lp{}n", std::process::id() % 100_000);
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap().stdout;
    String::from_utf8_lossy(&out).lines().filter(|l| l.starts_with(&ours)).map(|l| format!("{l}\n")).collect()
}

fn ring(kind: TransportKind, size: usize, frames: u64, inflight: usize) {
    let before = namespaces();
    let mut cfg = RingConfig::new(kind, 3, size, frames);
    cfg.placement = Placement::Netns;
    cfg.inflight = inflight;
    let r = run(&cfg).unwrap();
    assert_eq!(r.frames_delivered, frames, "{r:?}");
    assert_eq!(r.frames_corrupt, 0);
    assert_eq!(r.control_ack, Some(true));
    assert_eq!(namespaces(), before, "namespaces left behind");
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn tcp_ring_across_namespaces_delivers_every_frame() {
    ring(TransportKind::Tcp, 16392, 2000, 1);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn udp_ring_across_namespaces_delivers_every_frame() {
    ring(TransportKind::Udp, 16392, 2000, 1);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn udp_ring_with_large_frames_in_flight() {
    ring(TransportKind::Udp, 262152, 200, 4);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn failed_setup_removes_the_namespaces() {
    let before = namespaces();
    // The namespaces are built, then every node fails to open its transport:
    // kmod without the module (the host cannot load modules).
    assert!(!std::path::Path::new("/dev/leap_tensor").exists(), "this test needs a host without leap_kmod");
    let mut cfg = RingConfig::new(TransportKind::Kmod, 3, 16392, 10);
    cfg.placement = Placement::Netns;
    assert!(run(&cfg).is_err());
    assert_eq!(namespaces(), before, "namespaces left behind after a failure");
}
