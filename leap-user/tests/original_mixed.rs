//! Mixed rings: leap nodes next to a stand-in for the original LEAP UDP
//! endpoint (see `original/mod.rs` for what it does, quirks included), on
//! loopback, with leap's defaults (no option): the original as a worker
//! after a leap head, as the tail before one, and as the head itself, with
//! and without a control round.

mod original;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use leap::ring::{HeadConfig, NeighbourPolicy, WorkerConfig, run_head, run_worker};
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap_common::control::{ControlType, LayerRange};
use original::{FRAME, Net, Node, Original, Resize, Role, fresh_ack, ring};

/// Two busy threads on this 2-CPU machine, while the guard lives.
struct Contention(Arc<AtomicBool>, Vec<JoinHandle<()>>);

impl Contention {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..2)
            .map(|_| {
                let s = stop.clone();
                std::thread::spawn(move || {
                    while !s.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self(stop, threads)
    }
}

impl Drop for Contention {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

#[derive(Clone, Copy)]
struct Case {
    /// The original sits right after the head (else it is the tail).
    original_first: bool,
    frames: u64,
    control: bool,
    head_pause: Duration,
    worker_compute: Duration,
    original_compute: Duration,
    contention: bool,
}

const QUIET: Case = Case {
    original_first: true,
    frames: 300,
    control: false,
    head_pause: Duration::ZERO,
    worker_compute: Duration::ZERO,
    original_compute: Duration::ZERO,
    contention: false,
};

fn udp(listen: SocketAddr, next: SocketAddr, prev: SocketAddr) -> UdpTransport {
    let mut c = UdpConfig::new(listen, next);
    c.prev = Some(prev);
    c.max_frame_len = FRAME;
    UdpTransport::bind(c).unwrap()
}

/// Runs a 3-node ring (leap head, leap worker, original worker) and checks
/// that every frame came back intact, the stand-in never hung and never
/// echoed a leap flag.
fn run(case: Case) {
    let bind = || UdpSocket::bind("127.0.0.1:0").unwrap();
    let (o_sock, h_addr, w_addr) = (bind(), bind().local_addr().unwrap(), bind().local_addr().unwrap());
    let o_addr = o_sock.local_addr().unwrap();
    // Ring order: head -> first -> second -> head.
    let (first, second) = if case.original_first { (o_addr, w_addr) } else { (w_addr, o_addr) };
    let mut head = udp(h_addr, first, second);
    let original = Original::udp(
        o_sock,
        if case.original_first { second } else { h_addr },
        Role::Worker { compute: case.original_compute },
    );
    let (w_next, w_prev) = if case.original_first { (h_addr, o_addr) } else { (o_addr, h_addr) };
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let compute = case.worker_compute;
    let worker = std::thread::spawn(move || {
        let mut w = udp(w_addr, w_next, w_prev);
        let mut cfg = WorkerConfig::new(FRAME);
        cfg.compute = compute;
        cfg.policy = NeighbourPolicy::Wait;
        run_worker(&mut w, &cfg, &stop2).unwrap();
        w
    });
    let _busy = case.contention.then(Contention::start);
    let mut hc = HeadConfig::new(FRAME, case.frames);
    hc.stall_timeout = Duration::from_secs(20);
    hc.lost_after = Some(Duration::from_secs(4));
    hc.retry = true;
    hc.control_workers = case.control.then_some(2);
    hc.pause = case.head_pause;
    let rep = run_head(&mut head, &hc).unwrap();
    stop.store(true, Ordering::Relaxed);
    let w = worker.join().unwrap();
    let o = &original.report;
    let (hangs, echoed) = (o.hangs.load(Ordering::Relaxed), o.echoed_flags.load(Ordering::Relaxed));
    let trains = o.trains.load(Ordering::Relaxed);
    assert_eq!(
        (rep.delivered, rep.corrupt, rep.lost, rep.resent, hangs, echoed, trains),
        (case.frames, 0, 0, 0, 0, 0, 0),
        "delivered, corrupt, lost, re-sent, original hangs, leap flags echoed by the original, trains it got"
    );
    if case.control {
        assert_eq!(rep.control_ack, Some(true), "the control round did not come back");
        // The chain gave the original its range: the first of two, or the
        // tail's.
        let want = leap::ring::control::chain(2, 32).ranges[usize::from(!case.original_first)];
        assert_eq!(*o.range.lock().unwrap(), want);
    }
    // The leap-to-leap hop proved itself; the original was never taken for
    // a leap node.
    let (h_next, h_prev) = head.neighbours_are_leap();
    let (w_next_leap, w_prev_leap) = w.neighbours_are_leap();
    if case.original_first {
        assert_eq!((h_next, h_prev, w_next_leap, w_prev_leap), (false, true, true, false));
    } else {
        assert_eq!((h_next, h_prev, w_next_leap, w_prev_leap), (true, false, false, true));
    }
    let hs = leap::Transport::stats(&head);
    assert_eq!(hs.nacks_received + hs.drops.bad_crc, 0, "{hs:?}");
    // The leap node before the original sends one chunk per datagram; the
    // one before a leap node sends trains (loopback's MTU allows six
    // chunks: 2 datagrams per frame of 12 chunks), except for frames sent
    // before the proof (the original format).
    let ws = leap::Transport::stats(&w);
    let (to_leap, to_original) = if case.original_first { (ws, hs) } else { (hs, ws) };
    assert_eq!(to_original.datagrams_sent, to_original.chunks_sent, "{to_original:?}");
    assert!(to_leap.datagrams_sent * 5 < to_leap.chunks_sent, "{to_leap:?}");
}

#[test]
fn original_worker_after_a_leap_head() {
    run(QUIET);
}

#[test]
fn original_tail_before_a_leap_head() {
    run(Case { original_first: false, ..QUIET });
}

#[test]
fn mixed_ring_under_cpu_contention() {
    run(Case { contention: true, frames: 200, ..QUIET });
    run(Case { contention: true, frames: 200, original_first: false, ..QUIET });
}

#[test]
fn mixed_ring_with_a_control_round() {
    run(Case { control: true, frames: 50, ..QUIET });
    run(Case { control: true, frames: 50, original_first: false, ..QUIET });
}

#[test]
fn mixed_ring_with_an_idle_head_and_slow_workers() {
    let idle = Case { head_pause: Duration::from_millis(50), frames: 12, ..QUIET };
    run(idle);
    run(Case { original_first: false, ..idle });
    let slow = Case { worker_compute: Duration::from_millis(30), frames: 12, ..QUIET };
    run(slow);
    run(Case { original_first: false, ..slow });
    run(Case { original_compute: Duration::from_millis(30), frames: 12, control: true, ..QUIET });
}

/// Checks what every ring of [`ring`] must show: all frames back intact,
/// no stand-in hung, echoed a leap flag or got a train.
fn assert_intact(o: &original::Outcome, frames: u64) {
    assert_eq!(
        (o.delivered, o.corrupt, o.lost, o.hangs, o.echoed, o.trains),
        (frames, 0, 0, 0, 0, 0),
        "delivered, corrupt, lost, original hangs, leap flags echoed by an original, trains it got: {o:?}"
    );
}

/// What leap's head gives `workers` workers.
fn leap_chain(workers: usize) -> Vec<LayerRange> {
    leap::ring::control::chain(workers, 32).ranges[..workers].to_vec()
}

#[test]
fn leap_head_takes_the_fresh_ack_of_an_original_tail() {
    for (nodes, workers) in [(&[Node::Leap, Node::Original][..], 1), (&[Node::Leap, Node::Leap, Node::Original], 2)] {
        let o = ring(Net::Udp, nodes, Some(Resize::Chain(workers)), 50);
        assert_eq!(o.control_ack, Some(true), "{nodes:?}: {o:?}");
        assert_intact(&o, 50);
        assert_eq!(o.ranges, leap_chain(workers), "{nodes:?}");
    }
}

#[test]
fn original_head_gets_the_ack_of_a_leap_tail() {
    let chain = Resize::Chain(2).message();
    let o = ring(Net::Udp, &[Node::Original, Node::Leap, Node::Leap], Some(Resize::Chain(2)), 50);
    assert_eq!(o.control_ack, Some(true), "{o:?}");
    assert_intact(&o, 50);
    assert_eq!(o.ranges, chain.ranges[..2]);
    // Leap's tail answers in leap's form: the chain, at its end.
    let ack = o.ack_msg.expect("the ACK decodes");
    assert_eq!((ack.kind, ack.worker_index, ack.total_workers, ack.ranges), (ControlType::Ack, 2, 2, chain.ranges));
}

#[test]
fn original_head_gets_a_resize_layers_ack_passed_on_unchanged() {
    // The first worker (leap or original) answers with its new range; the
    // leap worker after it passes the ACK on as it is.
    let range = LayerRange { start_layer: 8, end_layer: 32, is_tail: true };
    for nodes in [[Node::Original, Node::Leap, Node::Leap], [Node::Original, Node::Original, Node::Leap]] {
        let o = ring(Net::Udp, &nodes, Some(Resize::Layers), 20);
        assert_eq!(o.control_ack, Some(true), "{nodes:?}: {o:?}");
        assert_intact(&o, 20);
        assert_eq!(o.ack_msg, Some(fresh_ack(range)), "{nodes:?}");
        assert_eq!(o.ranges, [range, LayerRange::default()], "{nodes:?}");
    }
}

#[test]
fn leap_worker_between_an_original_head_and_an_original_tail() {
    let chain = Resize::Chain(2).message();
    let o = ring(Net::Udp, &[Node::Original, Node::Leap, Node::Original], Some(Resize::Chain(2)), 50);
    assert_eq!(o.control_ack, Some(true), "{o:?}");
    assert_intact(&o, 50);
    assert_eq!(o.ranges, chain.ranges[..2]);
    assert_eq!(o.ack_msg, Some(fresh_ack(chain.ranges[1])));
}
