//! A keyed XDP ring (AF_XDP and the ring buffer) of two nodes in network
//! namespaces changes its key while frames move, node by node, without a
//! restart (`Transport::key_control`): K1 -> (K2 + previous K1) -> K2
//! only. Every frame comes back intact and once, none is lost. Needs root
//! and BPF: `cargo xtask ci`.

mod support;
mod xdp_common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use leap::Transport;
use leap::netns::{NodeNet, Topology};
use leap::transport::KeyControl;
use leap::transport::ring_key::{KeySet, RingKey};
use leap::transport::udp::UdpConfig;
use leap::transport::xdp::{AttachMode, Delivery, XdpTransport, XdpTransportConfig};
use xdp_common::{in_netns, object, pattern};

const PORT: u16 = 9998;
const FRAME: usize = 16_392;

fn open(node: &NodeNet, peer: &NodeNet, delivery: Delivery, key: KeySet) -> XdpTransport {
    let me = SocketAddr::from((node.addr, PORT));
    let other = SocketAddr::from((peer.addr, PORT));
    let mut udp = UdpConfig::new(me, other);
    udp.prev = Some(other);
    udp.max_frame_len = FRAME;
    udp.recv_timeout = Some(Duration::from_secs(5));
    udp.ring_key = Some(key);
    let mut cfg = XdpTransportConfig::new(&node.rx_iface, udp, delivery);
    cfg.mode = AttachMode::Drv;
    cfg.object = object();
    XdpTransport::open(cfg).expect("open the XDP transport")
}

fn rotate_while_moving(delivery: Delivery) {
    let (k1, k2) = (RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
    let topo = Topology::ring(&xdp_common::unique("lxk"), 2).unwrap();
    let (n0, n1) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let (controls_tx, controls) = mpsc::channel::<KeyControl>();
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let (n0, n1, k1, controls_tx, stop) = (n0.clone(), n1.clone(), k1.clone(), controls_tx.clone(), stop.clone());
        std::thread::spawn(move || {
            in_netns(n1.path(), move || {
                let mut t = open(&n1, &n0, delivery, KeySet::new(k1));
                controls_tx.send(t.key_control().expect("xdp takes new keys")).unwrap();
                t.set_recv_timeout(Some(Duration::from_millis(50)));
                support::forward_until(&mut t, FRAME, &stop, Duration::from_secs(60));
                t.stats()
            })
        })
    };
    let head_stop = Arc::new(AtomicBool::new(false));
    let head = {
        let (k1, head_stop) = (k1.clone(), head_stop.clone());
        std::thread::spawn(move || {
            in_netns(n0.path(), move || {
                let mut t = open(&n0, &n1, delivery, KeySet::new(k1));
                controls_tx.send(t.key_control().expect("xdp takes new keys")).unwrap();
                let i = support::round_trips_until(&mut t, FRAME, pattern, &head_stop, Duration::from_secs(60));
                (i, t.stats())
            })
        })
    };
    let controls: Vec<KeyControl> = (0..2).map(|_| controls.recv_timeout(Duration::from_secs(30)).unwrap()).collect();
    let step = Duration::from_millis(400);
    std::thread::sleep(step);
    let both = KeySet { previous: Some(k1), ..KeySet::new(k2.clone()) };
    for keys in [both, KeySet::new(k2)] {
        for c in &controls {
            c.set_keys(keys.clone()).unwrap();
            std::thread::sleep(step);
            assert!(!head.is_finished(), "the head stopped");
        }
    }
    head_stop.store(true, Ordering::Relaxed);
    let (frames, hs) = head.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let es = echo.join().unwrap();
    drop(controls);
    assert!(frames > 100, "{delivery:?}: frames moved all along: {frames}");
    for s in [hs, es] {
        assert_eq!((s.frames_lost, s.drops.replayed, s.drops.unkeyed), (0, 0, 0), "{delivery:?}: {s:?}");
        // Only the announcement of K2 to a neighbour that held K1 alone.
        assert!(s.drops.bad_tag <= 1, "{delivery:?}: {s:?}");
    }
    assert_eq!(es.frames_received, u64::from(frames));
}

#[test]
#[ignore = "needs root and BPF: run by cargo xtask ci"]
fn a_keyed_af_xdp_ring_changes_keys_node_by_node_while_moving_frames() {
    rotate_while_moving(Delivery::Xsk);
}

#[test]
#[ignore = "needs root and BPF: run by cargo xtask ci"]
fn a_keyed_ring_buffer_ring_changes_keys_node_by_node_while_moving_frames() {
    rotate_while_moving(Delivery::RingBuf);
}
