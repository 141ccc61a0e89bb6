//! Mixed rings: leap nodes next to a stand-in for the original LEAP UDP
//! endpoint, on loopback, with leap's defaults (no option).
//!
//! The stand-in does what `shared/docs/original-leap.md` says the original
//! does, quirks included:
//! - one buffer for receiving and sending: every chunk it sends carries the
//!   `reserved` bytes of the last datagram it received;
//! - a receive locks onto the first seq it sees and blocks until every chunk
//!   of that seq has arrived (chunks of other seqs are ignored); a datagram
//!   with the magic and a plausible header (a NACK, a probe) is taken as
//!   data; datagrams without the magic are ignored;
//! - frames of the size it was told, one `sendto` per chunk, its own seq
//!   from 0; control frames recognised by the 0xC0DE marker, applied and
//!   forwarded as the original protocol says; no NACKs, no timeouts.
//!
//! A stand-in that waits longer than [`HANG`] for a locked seq reports a
//! hang (the original would wait forever). It also counts datagrams longer
//! than one chunk (chunk trains): the original would read only their first
//! chunk, so leap must never send it one.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leap::ring::{HeadConfig, NeighbourPolicy, WorkerConfig, run_head, run_worker};
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, CHUNK_PAYLOAD_MAX, LEAP_MAGIC};
use leap_common::control::{ControlMessage, ControlType};

const FRAME: usize = 16_392;
/// Longer than any leap timer: the original is stuck.
const HANG: Duration = Duration::from_secs(3);

/// What the stand-in saw.
#[derive(Default)]
struct Report {
    frames: AtomicU64,
    hangs: AtomicU64,
    /// `reserved` values it sent that were not 0 (echoed from leap).
    echoed_flags: AtomicU64,
    /// Datagrams longer than one chunk (a train) it received.
    trains: AtomicU64,
}

/// The original UDP endpoint as a thread.
struct Original {
    report: Arc<Report>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Original {
    fn start(sock: UdpSocket, next: SocketAddr, compute: Duration) -> Self {
        let report = Arc::new(Report::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (r, st) = (report.clone(), stop.clone());
        let thread = std::thread::spawn(move || original_loop(&sock, next, compute, &r, &st));
        Self { report, stop, thread: Some(thread) }
    }
}

impl Drop for Original {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn original_loop(sock: &UdpSocket, next: SocketAddr, compute: Duration, r: &Report, stop: &AtomicBool) {
    sock.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    // The original asks for 8 MiB buffers too: a busy machine must not drop
    // chunks in the stand-in's socket (it would then wait forever, as the
    // original does).
    let _ = socket2::SockRef::from(sock).set_recv_buffer_size(8 << 20);
    let total = FRAME.div_ceil(CHUNK_PAYLOAD_MAX);
    // The one buffer for receiving and sending (longer than the original's,
    // to see any train whole).
    let mut buf = [0u8; 65536];
    let mut frame = vec![0u8; FRAME];
    let mut seq_out: u16 = 0;
    while !stop.load(Ordering::Relaxed) {
        // Receive: lock onto the first seq, wait for all of its chunks.
        let mut locked: Option<u16> = None;
        let mut have = vec![false; total];
        let mut got = 0;
        let mut since = Instant::now();
        while got < total {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if locked.is_some() && since.elapsed() > HANG {
                r.hangs.fetch_add(1, Ordering::Relaxed);
                since = Instant::now();
            }
            let Ok(n) = sock.recv(&mut buf) else { continue };
            if n > CHUNK_DATAGRAM_MAX {
                r.trains.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if n < CHUNK_HEADER_LEN || u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) != LEAP_MAGIC {
                continue;
            }
            let seq = u16::from_be_bytes([buf[4], buf[5]]);
            let id = usize::from(u16::from_be_bytes([buf[6], buf[7]]));
            if *locked.get_or_insert(seq) != seq || id >= total {
                continue;
            }
            let at = id * CHUNK_PAYLOAD_MAX;
            let len = (n - CHUNK_HEADER_LEN).min(FRAME - at);
            frame[at..at + len].copy_from_slice(&buf[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + len]);
            if !have[id] {
                have[id] = true;
                got += 1;
            }
        }
        if ControlMessage::has_marker(&frame) {
            if let Ok(mut msg) = ControlMessage::decode(&frame) {
                // RESIZE_CHAIN: apply ranges[worker_index], increment, and
                // the last worker turns it into an ACK; ACKs travel on.
                if msg.kind == ControlType::ResizeChain {
                    msg.worker_index += 1;
                    if msg.worker_index >= msg.total_workers {
                        msg.kind = ControlType::Ack;
                    }
                }
                frame.fill(0);
                msg.encode(&mut frame).unwrap();
            }
        } else if !compute.is_zero() {
            std::thread::sleep(compute);
        }
        // Send: one sendto per chunk, the header written over the receive
        // buffer, `reserved` (bytes 10..12) left as received.
        for id in 0..total {
            buf[0..4].copy_from_slice(&LEAP_MAGIC.to_be_bytes());
            buf[4..6].copy_from_slice(&seq_out.to_be_bytes());
            buf[6..8].copy_from_slice(&(id as u16).to_be_bytes());
            buf[8..10].copy_from_slice(&(total as u16).to_be_bytes());
            if buf[10..12] != [0, 0] {
                r.echoed_flags.fetch_add(1, Ordering::Relaxed);
            }
            let at = id * CHUNK_PAYLOAD_MAX;
            let len = (FRAME - at).min(CHUNK_PAYLOAD_MAX);
            buf[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + len].copy_from_slice(&frame[at..at + len]);
            let _ = sock.send_to(&buf[..CHUNK_HEADER_LEN + len], next);
        }
        seq_out = seq_out.wrapping_add(1);
        r.frames.fetch_add(1, Ordering::Relaxed);
    }
}

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
    let original = Original::start(o_sock, if case.original_first { second } else { h_addr }, case.original_compute);
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
