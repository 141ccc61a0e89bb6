//! Whole rings on loopback (no privileges): every frame comes back intact.

use leap::ring::{RingConfig, run};
use leap::transport::open::TransportKind;

fn ring(kind: TransportKind, nodes: usize, size: usize, frames: u64, inflight: usize) {
    let mut cfg = RingConfig::new(kind, nodes, size, frames);
    cfg.inflight = inflight;
    let r = run(&cfg).unwrap();
    assert_eq!(r.frames_delivered, frames, "{kind}: {r:?}");
    assert_eq!(r.frames_corrupt, 0);
    assert_eq!(r.control_ack, Some(true), "RESIZE_CHAIN came back as ACK");
    assert!(r.rtt_us.p50 > 0.0);
}

#[test]
fn tcp_ring_delivers_every_frame() {
    ring(TransportKind::Tcp, 3, 16392, 300, 1);
}

#[test]
fn udp_ring_delivers_every_frame() {
    ring(TransportKind::Udp, 3, 16392, 300, 1);
}

#[test]
fn rings_with_frames_in_flight_deliver_in_order() {
    ring(TransportKind::Tcp, 4, 32776, 200, 4);
    ring(TransportKind::Udp, 4, 32776, 200, 4);
}

#[test]
fn large_frames_cross_the_udp_ring() {
    ring(TransportKind::Udp, 2, 1_048_584, 20, 2);
}

#[test]
fn invalid_ring_settings_are_refused() {
    for (nodes, size, frames) in [(0, 16392, 10), (1, 16392, 10), (3, 0, 10), (3, 16392, 0)] {
        let cfg = RingConfig::new(TransportKind::Udp, nodes, size, frames);
        assert!(run(&cfg).is_err(), "nodes {nodes} size {size} frames {frames}");
    }
}

/// More bytes in flight than the socket buffers of the whole ring hold:
/// every node ends up sending into a full buffer. Each must keep reading
/// from its previous node meanwhile, or the ring deadlocks (it did: this
/// run hung until killed before sends drained the previous node).
#[test]
fn tcp_ring_with_more_in_flight_than_buffers_hold_does_not_deadlock() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut cfg = RingConfig::new(TransportKind::Tcp, 3, 4 << 20, 48);
        cfg.inflight = 16;
        cfg.control = false;
        let _ = tx.send(run(&cfg).map_err(|e| e.to_string()));
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("the ring deadlocked (no result in 120 s)");
    let r = r.unwrap();
    assert_eq!((r.frames_delivered, r.frames_corrupt), (48, 0), "{r:?}");
}
