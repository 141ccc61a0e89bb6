//! Chunk trains across network namespaces linked by veth pairs (root): a
//! jumbo-frame ring carries a 16 392-byte frame in two datagrams per hop, a
//! node with trains off is spoken to one chunk per datagram, and at the
//! usual MTU trains change nothing.

mod support;

use std::process::Command;

use leap::ring::{Placement, RingConfig, RingReport, run};
use leap::transport::open::TransportKind;

const FRAME: usize = 16_392;
const FRAMES: u64 = 1000;

/// The network namespaces this process's rings name (`lp<pid>...`): other
/// processes on the machine may add and remove their own meanwhile.
fn namespaces() -> String {
    let ours = format!("lp{}n", std::process::id() % 100_000);
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap().stdout;
    String::from_utf8_lossy(&out).lines().filter(|l| l.starts_with(&ours)).map(|l| format!("{l}\n")).collect()
}

/// A 3-node UDP ring across namespaces at `mtu`, every frame checked;
/// `tune` changes the configuration first.
fn ring(mtu: u32, tune: impl FnOnce(&mut RingConfig)) -> RingReport {
    let before = namespaces();
    let mut cfg = RingConfig::new(TransportKind::Udp, 3, FRAME, FRAMES);
    cfg.placement = Placement::Netns;
    cfg.mtu = Some(mtu);
    tune(&mut cfg);
    let r = run(&cfg).unwrap();
    assert_eq!(namespaces(), before, "namespaces left behind");
    assert_eq!((r.frames_delivered, r.frames_corrupt, r.frames_lost), (FRAMES, 0, 0), "{r:?}");
    assert_eq!(r.control_ack, Some(true));
    // No loss injected: no chunk is lost.
    support::assert_nothing_lost(&r.stats, &format!("MTU {mtu}"));
    eprintln!(
        "MTU {mtu}: {:.2} datagrams per frame, p50 {:.1} us, {:.3} Gbit/s",
        r.datagrams_per_frame, r.rtt_us.p50, r.gbit_per_s
    );
    r
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn a_jumbo_frame_ring_sends_two_datagrams_per_frame() {
    // 12 chunks (the frame and its CRC) in trains of six, on every hop.
    let r = ring(9000, |_| {});
    assert_eq!(r.stats.datagrams_sent, 2 * r.stats.frames_sent, "{:?}", r.stats);
    assert_eq!(r.stats.chunks_sent, 12 * r.stats.frames_sent, "{:?}", r.stats);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn a_node_with_trains_off_gets_single_chunks_and_loses_nothing() {
    // Node 1 neither announces nor sends trains: the head and node 1 send
    // 12 datagrams per frame, node 2 (to the head) sends 2.
    let r = ring(9000, |c| c.node_options.push((1, |o| o.trains = false)));
    assert_eq!(r.stats.chunks_sent, 12 * r.stats.frames_sent, "{:?}", r.stats);
    let per_node = r.stats.frames_sent / 3;
    assert_eq!(r.stats.datagrams_sent, (12 + 12 + 2) * per_node, "{:?}", r.stats);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn at_the_usual_mtu_trains_change_nothing() {
    // 1 500 bytes hold one chunk: trains of one.
    let r = ring(1500, |_| {});
    assert_eq!(r.stats.datagrams_sent, 12 * r.stats.frames_sent, "{:?}", r.stats);
}
