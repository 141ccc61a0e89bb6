//! Rings that pause: a worker computing 1.7 s per frame, a head idle 2 s
//! between frames and then restarted. Every frame arrives exactly once (the
//! previous node's tail-loss probes of a frame already delivered never make
//! it be delivered again). Loopback, library API, leap's defaults.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use leap::Transport;
use leap::ring::{HeadConfig, HeadReport, NeighbourPolicy, WorkerConfig, run_head, run_worker};
use leap::transport::udp::{UdpConfig, UdpTransport};

const FRAME: usize = 16_392;

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], leap::netns::loopback_port().expect("a free loopback port")))
}

fn node(listen: SocketAddr, next: SocketAddr, prev: SocketAddr) -> UdpTransport {
    let mut c = UdpConfig::new(listen, next);
    c.prev = Some(prev);
    c.max_frame_len = FRAME;
    UdpTransport::bind(c).unwrap()
}

struct Worker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<leap::Stats>>,
}

impl Worker {
    fn start(listen: SocketAddr, next: SocketAddr, prev: SocketAddr, compute: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut t = node(listen, next, prev);
            let mut cfg = WorkerConfig::new(FRAME);
            cfg.compute = compute;
            cfg.policy = NeighbourPolicy::Wait;
            run_worker(&mut t, &cfg, &s).unwrap();
            t.stats()
        });
        Self { stop, thread: Some(thread) }
    }

    fn finish(mut self) -> leap::Stats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn head(t: &mut UdpTransport, frames: u64, pause: Duration) -> HeadReport {
    let mut hc = HeadConfig::new(FRAME, frames);
    hc.stall_timeout = Duration::from_secs(30);
    hc.lost_after = Some(Duration::from_secs(8));
    hc.retry = true;
    hc.pause = pause;
    run_head(t, &hc).unwrap()
}

fn exactly_once(rep: &HeadReport, frames: u64) {
    assert_eq!(
        (rep.delivered, rep.corrupt, rep.lost, rep.resent, rep.duplicates),
        (frames, 0, 0, 0, 0),
        "delivered, corrupt, lost, re-sent, duplicates"
    );
}

#[test]
fn a_worker_computing_longer_than_the_deadline_forwards_each_frame_once() {
    let (h, w1, w2) = (free_addr(), free_addr(), free_addr());
    let a = Worker::start(w1, w2, h, Duration::from_millis(1700));
    let b = Worker::start(w2, h, w1, Duration::ZERO);
    let mut t = node(h, w1, w2);
    let rep = head(&mut t, 3, Duration::ZERO);
    exactly_once(&rep, 3);
    let (sa, sb) = (a.finish(), b.finish());
    assert_eq!((sa.frames_received, sa.frames_sent, sb.frames_received, sb.frames_sent), (3, 3, 3, 3));
}

#[test]
fn a_head_idle_between_frames_and_then_restarted_gets_every_frame_once() {
    let (h, w1, w2) = (free_addr(), free_addr(), free_addr());
    let a = Worker::start(w1, w2, h, Duration::ZERO);
    let b = Worker::start(w2, h, w1, Duration::ZERO);
    {
        let mut t = node(h, w1, w2);
        exactly_once(&head(&mut t, 3, Duration::from_secs(2)), 3);
    }
    // The head exits; another one starts on the same address 2 s later.
    std::thread::sleep(Duration::from_secs(2));
    let mut t = node(h, w1, w2);
    exactly_once(&head(&mut t, 3, Duration::ZERO), 3);
    let (sa, sb) = (a.finish(), b.finish());
    assert_eq!((sa.frames_received, sa.frames_sent, sb.frames_received, sb.frames_sent), (6, 6, 6, 6));
}
