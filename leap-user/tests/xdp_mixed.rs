//! A mixed jumbo-frame XDP ring, as a cluster grows one: node 0 runs its
//! program in native (driver) mode, node 1 in generic (SKB) mode, node 2
//! has chunk trains off. At 0 % loss every frame must arrive intact and no
//! chunk may be lost (a retransmission only as a premature NACK, see
//! `support::assert_nothing_lost`): nothing a native node sends may be lost on a generic one
//! (GSO super-datagrams are passed to its UDP socket, not dropped), and no
//! node may send a train to a node that did not announce it. Every node
//! keeps only the packaged unit's capabilities. Needs root and BPF:
//! `cargo xtask ci` (stage ebpf).

mod support;
mod xdp_common;

use std::path::PathBuf;
use std::process::Command;

use leap::ring::{Placement, RingConfig, RingReport, run};
use leap::transport::open::TransportKind;
use leap::transport::xdp::{AttachMode, ObjectSource};

const FRAME: usize = 16_392;
const FRAMES: u64 = 600;

/// The network namespaces this process's rings name (`lp<pid>...`): other
/// processes on the machine may add and remove their own meanwhile.
fn namespaces() -> String {
    let ours = format!("lp{}n", std::process::id() % 100_000);
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap().stdout;
    String::from_utf8_lossy(&out).lines().filter(|l| l.starts_with(&ours)).map(|l| format!("{l}\n")).collect()
}

fn object_path() -> PathBuf {
    match xdp_common::object() {
        ObjectSource::File(p) => p,
        other => panic!("the tests load the object from a file, not {other:?}"),
    }
}

fn mixed_ring(transport: TransportKind) -> RingReport {
    let before = namespaces();
    let mut cfg = RingConfig::new(transport, 3, FRAME, FRAMES);
    cfg.placement = Placement::Netns;
    cfg.mtu = Some(9000);
    cfg.unit_caps = true;
    cfg.options.xdp_object = Some(object_path());
    cfg.node_options.push((0, |o| o.xdp_mode = AttachMode::Drv));
    cfg.node_options.push((1, |o| o.xdp_mode = AttachMode::Skb));
    cfg.node_options.push((2, |o| o.trains = false));
    let r = run(&cfg).unwrap_or_else(|e| panic!("{transport:?}: mixed ring: {e}"));
    assert_eq!(namespaces(), before, "namespaces left behind");
    eprintln!(
        "{transport:?} mixed ring at MTU 9000: {:.2} datagrams per frame, p50 {:.1} us, {:.3} Gbit/s, {} retransmits",
        r.datagrams_per_frame, r.rtt_us.p50, r.gbit_per_s, r.retransmits
    );
    assert_eq!((r.frames_delivered, r.frames_corrupt, r.frames_lost), (FRAMES, 0, 0), "{transport:?}: {r:?}");
    assert_eq!(r.control_ack, Some(true), "{transport:?}");
    support::assert_nothing_lost(&r.stats, &format!("{transport:?}"));
    assert_eq!(r.stats.chunks_sent, 12 * r.stats.frames_sent, "{transport:?}: {:?}", r.stats);
    // Node 2 (trains off) neither sends nor is sent trains: at least its
    // hop and the one into it are single chunks.
    let per_node = r.stats.frames_sent / 3;
    assert!(r.stats.datagrams_sent >= 2 * 12 * per_node, "{transport:?}: trains to or from node 2: {:?}", r.stats);
    r
}

#[test]
#[ignore = "needs root and BPF: run by cargo xtask ci (stage ebpf)"]
fn a_mixed_jumbo_ring_of_native_generic_and_trains_off_nodes_loses_nothing() {
    // The head (native) sends trains to node 1 when node 1 announces them.
    let r = mixed_ring(TransportKind::Xdp);
    let per_node = r.stats.frames_sent / 3;
    assert!(r.stats.datagrams_sent < 3 * 12 * per_node, "the native head never sent a train: {:?}", r.stats);
    mixed_ring(TransportKind::XdpRingbuf);
}
