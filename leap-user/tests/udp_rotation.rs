//! A keyed udp ring of three on loopback changes its key while it moves
//! frames, node by node, without a restart (`Transport::key_control`):
//! K1 -> (K2 + previous K1) -> K2 only. Every frame arrives intact, in
//! order, once; the nodes log when the previous key was last used; a
//! sender holding only K1 is refused afterwards.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use leap::transport::ring_key::{KeyChangeError, KeySet, RingKey};
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap::{Transport, TransportError};

const LEN: usize = 16_392;

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_le_bytes()[2]).collect()
}

fn config(listen: SocketAddr, next: SocketAddr, prev: SocketAddr, k: Option<KeySet>) -> UdpConfig {
    let mut c = UdpConfig::new(listen, next);
    c.prev = Some(prev);
    c.ring_key = k;
    c.max_frame_len = LEN;
    c.recv_timeout = Some(Duration::from_millis(50));
    c
}

#[test]
fn a_keyed_udp_ring_changes_keys_node_by_node_while_moving_frames_and_loses_none() {
    support::LogLines::install();
    let (k1, k2) = (RingKey::from_bytes([1; 32]), RingKey::from_bytes([2; 32]));
    let addrs = [free_addr(), free_addr(), free_addr()];
    let nodes: Vec<UdpTransport> = (0..3)
        .map(|i| {
            let c = config(addrs[i], addrs[(i + 1) % 3], addrs[(i + 2) % 3], Some(KeySet::new(k1.clone())));
            UdpTransport::bind(c).unwrap()
        })
        .collect();
    let controls: Vec<_> = nodes.iter().map(|t| t.key_control().expect("udp takes new keys")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut nodes = nodes.into_iter();
    let mut head = nodes.next().unwrap();
    let forwarders: Vec<JoinHandle<UdpTransport>> = nodes
        .map(|mut t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                support::forward_until(&mut t, LEN, &stop, Duration::from_secs(60));
                t
            })
        })
        .collect();
    // The head sends a frame, takes it back, checks it, again, until told.
    let head_stop = Arc::new(AtomicBool::new(false));
    let head_thread = {
        let head_stop = head_stop.clone();
        std::thread::spawn(move || {
            head.set_recv_timeout(Some(Duration::from_secs(5)));
            let i = support::round_trips_until(&mut head, LEN, pattern, &head_stop, Duration::from_secs(60));
            (i, head.stats())
        })
    };
    let frames_so_far = |h: &JoinHandle<_>| !h.is_finished();
    let step = Duration::from_millis(300);
    std::thread::sleep(step);
    let both = KeySet { previous: Some(k1.clone()), ..KeySet::new(k2.clone()) };
    for c in &controls {
        c.set_keys(both.clone()).unwrap();
        std::thread::sleep(step);
        assert!(frames_so_far(&head_thread), "the head stopped");
    }
    for c in &controls {
        c.set_keys(KeySet::new(k2.clone())).unwrap();
        std::thread::sleep(step);
        assert!(frames_so_far(&head_thread), "the head stopped");
    }
    // `encrypt` does not change on a running ring.
    let enc = KeySet { encrypt: true, ..KeySet::new(k2.clone()) };
    assert_eq!(controls[0].set_keys(enc), Err(KeyChangeError::Encryption));
    head_stop.store(true, Ordering::Relaxed);
    let (frames, head_stats) = head_thread.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut rotated: Vec<UdpTransport> = forwarders.into_iter().map(|f| f.join().unwrap()).collect();
    let stats: Vec<leap::Stats> = rotated.iter().map(Transport::stats).chain([head_stats]).collect();
    assert!(frames > 50, "frames moved all along: {frames}");
    for st in &stats {
        assert_eq!((st.frames_lost, st.drops.replayed, st.drops.unkeyed), (0, 0, 0), "{st:?}");
        // Only announcements of K2 to a neighbour that held K1 alone.
        assert!(st.drops.bad_tag <= 2, "{st:?}");
    }
    assert_eq!(stats[2].frames_received, u64::from(frames));
    let lines = support::LogLines::lines();
    // Whether a node still used the old key after it took both depends on
    // what crossed in the moment before its neighbours heard the new one:
    // either way it says so when it drops the old key.
    let said = |l: &&String| {
        l.contains("the previous key was last used") || l.contains("the previous key was not used since it was set")
    };
    let last_used = lines.iter().filter(said).count();
    assert_eq!(last_used, 3, "each node said when it last used the previous key when it dropped it: {lines:#?}");

    // A sender holding only K1 is refused by node 1 (rotated, still open)
    // now: it takes node 0's place (the handles keep a ring's socket open
    // until dropped).
    drop(controls);
    let mut stale = UdpTransport::bind(config(addrs[0], addrs[1], addrs[2], Some(KeySet::new(k1)))).unwrap();
    let rx = &mut rotated[0];
    let before = rx.stats();
    for i in 0..3 {
        stale.send_next(&pattern(1000 + i, 5000)).unwrap();
    }
    let mut buf = vec![0u8; LEN];
    rx.set_recv_timeout(Some(Duration::from_millis(300)));
    assert!(matches!(rx.recv_prev(&mut buf), Err(TransportError::Timeout(_))));
    let after = rx.stats();
    assert!(after.drops.bad_tag > before.drops.bad_tag, "{:?}", after.drops);
    assert_eq!(after.frames_received, before.frames_received, "a K1 frame was taken");
}
