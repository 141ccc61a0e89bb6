//! Stand-ins for the original LEAP endpoints, in any ring position (head,
//! worker, tail), over UDP, the kernel module's wire and TCP, doing what
//! the original implementation does, quirks included (each described where
//! it is modelled below).
//!
//! The wires ([`Wire`]):
//! - UDP ([`Reserved::Echo`]): one buffer for receiving and sending, so every
//!   chunk it sends carries the `reserved` bytes of the last datagram it
//!   received; a receive locks onto the first seq it sees and blocks until
//!   every chunk of that seq has arrived (chunks of other seqs are ignored);
//!   a datagram with the magic and a plausible header (a NACK, a probe) is
//!   taken as data; datagrams without the magic are ignored; one `sendto`
//!   per chunk, its own seq from 0; no NACKs, no timeouts.
//! - The kernel module's wire ([`Reserved::Zero`]): as UDP, but every chunk
//!   leaves with `reserved = 0` (`LEAP_IOCTL_SEND`).
//! - TCP ([`TcpWire`]): it listens and connects to the next node at the same
//!   time; frames of the size it was told go back to back, control frames
//!   inline.
//!
//! The control rules, the same on every wire: control frames are recognised
//! by the 0xC0DE marker and padded with zeros to the frame size. A worker
//! applies a RESIZE_CHAIN's `ranges[worker_index]`, increments
//! `worker_index` and forwards it; the last worker answers instead with a
//! *fresh* ACK (type 3, its own new range in `split_layer`, `end_layer`,
//! `is_tail`, zero in every other field), as it answers a RESIZE_LAYERS; an
//! ACK is forwarded unchanged. The head sends a RESIZE_CHAIN with
//! `worker_index` 0 (or a RESIZE_LAYERS for one worker), takes any control
//! frame of type ACK (it checks nothing else) and waits at most 5 s for it.
//!
//! A stand-in that waits longer than [`HANG`] for the rest of a frame
//! reports a hang (the original would wait forever). The UDP wire also
//! counts datagrams longer than one chunk (chunk trains): the original would
//! read only their first chunk, so leap must never send it one.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leap::Transport;
use leap::ring::{HeadConfig, NeighbourPolicy, WorkerConfig, run_head, run_worker};
use leap::transport::tcp::{TcpConfig, TcpTransport};
use leap::transport::udp::{UdpConfig, UdpTransport};
use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, CHUNK_PAYLOAD_MAX, LEAP_MAGIC};
use leap_common::control::{CONTROL_MARKER, ControlMessage, ControlType, LayerRange};

/// Bytes per frame (Llama-3-8B: 8-byte header + 4096 f32).
pub const FRAME: usize = 16_392;
/// Longer than any leap timer: the original is stuck.
pub const HANG: Duration = Duration::from_secs(3);
/// How long the original head waits for the ACK of a resize.
pub const ACK_WAIT: Duration = Duration::from_secs(5);
/// Layers of the model an original head splits (its own are `0..HEAD_LAYERS`).
pub const LAYERS: i32 = 32;
const HEAD_LAYERS: i32 = 8;
/// Bound of a TCP stand-in's set-up (listen, connect, accept).
const SETUP: Duration = Duration::from_secs(10);
/// How often a waiting stand-in looks at its stop flag.
const POLL: Duration = Duration::from_millis(20);

/// What a stand-in saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Data frames it sent on (a worker).
    pub frames: AtomicU64,
    /// Control frames it received.
    pub control: AtomicU64,
    /// The layers it runs (a worker), as control messages set them.
    pub range: Mutex<LayerRange>,
    /// Times it waited longer than [`HANG`] for the rest of a frame.
    pub hangs: AtomicU64,
    /// `reserved` values it sent that were not 0 (echoed from leap).
    pub echoed_flags: AtomicU64,
    /// Datagrams longer than one chunk (a train) it received.
    pub trains: AtomicU64,
    /// What it measured as the head.
    pub head: Mutex<HeadOutcome>,
}

/// What an original head measured.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeadOutcome {
    /// Whether an ACK came back within [`ACK_WAIT`] (None: no resize sent).
    pub ack: Option<bool>,
    /// The ACK, decoded (the original itself reads only its type).
    pub ack_msg: Option<ControlMessage>,
    /// Frames back intact.
    pub delivered: u64,
    /// Frames back with other bytes.
    pub corrupt: u64,
    /// Frames that did not come back within [`HANG`] (the head stops there).
    pub lost: u64,
    /// The head ran to its end.
    pub finished: bool,
}

/// The report and stop flag a stand-in's wire and loop share.
#[derive(Clone, Debug, Default)]
pub struct Shared {
    report: Arc<Report>,
    stop: Arc<AtomicBool>,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// How an original endpoint puts frames on the wire and takes them off.
pub trait Wire: Send {
    /// Receives one whole frame of `frame.len()` bytes. Returns false when
    /// the stand-in is stopped or the peer went away, or when `until`
    /// passes before any of a frame arrived (the original checks its
    /// deadline only between frames).
    fn recv(&mut self, frame: &mut [u8], until: Option<Instant>) -> bool;
    /// Sends one frame.
    fn send(&mut self, frame: &[u8]);
}

/// The `reserved` field of the chunks a datagram stand-in sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// The original UDP transport: whatever the last datagram received had.
    Echo,
    /// The original over the kernel module: 0.
    Zero,
}

/// The original's chunked datagram wire.
pub struct UdpWire {
    sock: UdpSocket,
    next: SocketAddr,
    /// The one buffer for receiving and sending (longer than the
    /// original's, to see any train whole).
    buf: Vec<u8>,
    seq_out: u16,
    reserved: Reserved,
    s: Shared,
}

impl UdpWire {
    fn new(sock: UdpSocket, next: SocketAddr, reserved: Reserved, s: Shared) -> Self {
        sock.set_read_timeout(Some(POLL)).unwrap();
        // The original asks for 8 MiB buffers too: a busy machine must not
        // drop chunks in the stand-in's socket (it would then wait forever,
        // as the original does).
        let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(8 << 20);
        Self { sock, next, buf: vec![0; 65536], seq_out: 0, reserved, s }
    }
}

impl Wire for UdpWire {
    fn recv(&mut self, frame: &mut [u8], until: Option<Instant>) -> bool {
        let total = frame.len().div_ceil(CHUNK_PAYLOAD_MAX);
        let r = &self.s.report;
        // Lock onto the first seq, wait for all of its chunks.
        let mut locked: Option<u16> = None;
        let mut have = vec![false; total];
        let mut got = 0;
        let mut since = Instant::now();
        while got < total {
            if self.s.stopped() || (locked.is_none() && until.is_some_and(|u| Instant::now() >= u)) {
                return false;
            }
            if locked.is_some() && since.elapsed() > HANG {
                r.hangs.fetch_add(1, Ordering::Relaxed);
                since = Instant::now();
            }
            let Ok(n) = self.sock.recv(&mut self.buf) else { continue };
            let buf = &self.buf;
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
            let len = (n - CHUNK_HEADER_LEN).min(frame.len() - at);
            frame[at..at + len].copy_from_slice(&buf[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + len]);
            if !have[id] {
                have[id] = true;
                got += 1;
            }
        }
        true
    }

    fn send(&mut self, frame: &[u8]) {
        // One sendto per chunk, the header written over the receive buffer.
        let total = frame.len().div_ceil(CHUNK_PAYLOAD_MAX);
        let buf = &mut self.buf;
        for id in 0..total {
            buf[0..4].copy_from_slice(&LEAP_MAGIC.to_be_bytes());
            buf[4..6].copy_from_slice(&self.seq_out.to_be_bytes());
            buf[6..8].copy_from_slice(&(id as u16).to_be_bytes());
            buf[8..10].copy_from_slice(&(total as u16).to_be_bytes());
            match self.reserved {
                Reserved::Zero => buf[10..12].fill(0),
                Reserved::Echo if buf[10..12] != [0, 0] => {
                    self.s.report.echoed_flags.fetch_add(1, Ordering::Relaxed);
                }
                Reserved::Echo => {}
            }
            let at = id * CHUNK_PAYLOAD_MAX;
            let len = (frame.len() - at).min(CHUNK_PAYLOAD_MAX);
            buf[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + len].copy_from_slice(&frame[at..at + len]);
            let _ = self.sock.send_to(&buf[..CHUNK_HEADER_LEN + len], self.next);
        }
        self.seq_out = self.seq_out.wrapping_add(1);
    }
}

/// The original's TCP wire: one connection from the previous node, one to
/// the next, frames back to back.
pub struct TcpWire {
    from_prev: TcpStream,
    to_next: TcpStream,
    s: Shared,
}

impl TcpWire {
    /// Listens on `listen` and connects to `next` at the same time, as the
    /// original's `initialize()` does on two threads (it listens on every
    /// interface; the stand-in only on `listen`, to stay on loopback).
    ///
    /// # Panics
    ///
    /// When the ring is not up within [`SETUP`].
    fn connect(listen: SocketAddr, next: SocketAddr, s: Shared) -> Self {
        let listener = TcpListener::bind(listen).unwrap_or_else(|e| panic!("original: bind {listen}: {e}"));
        let connector = std::thread::spawn(move || {
            let start = Instant::now();
            loop {
                match TcpStream::connect_timeout(&next, Duration::from_secs(1)) {
                    Ok(c) => return c,
                    Err(e) if start.elapsed() > SETUP => panic!("original: connect to {next}: {e}"),
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        });
        listener.set_nonblocking(true).unwrap();
        let start = Instant::now();
        let from_prev = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && start.elapsed() < SETUP => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("original: accept on {listen}: {e}"),
            }
        };
        let to_next = connector.join().expect("connector");
        from_prev.set_nonblocking(false).unwrap();
        from_prev.set_read_timeout(Some(POLL)).unwrap();
        // A stuck next node must not keep the stand-in from stopping.
        to_next.set_write_timeout(Some(HANG)).unwrap();
        for c in [&from_prev, &to_next] {
            c.set_nodelay(true).unwrap();
        }
        Self { from_prev, to_next, s }
    }
}

impl Wire for TcpWire {
    fn recv(&mut self, frame: &mut [u8], until: Option<Instant>) -> bool {
        let mut have = 0;
        let mut since = Instant::now();
        while have < frame.len() {
            if self.s.stopped() || (have == 0 && until.is_some_and(|u| Instant::now() >= u)) {
                return false;
            }
            if have > 0 && since.elapsed() > HANG {
                self.s.report.hangs.fetch_add(1, Ordering::Relaxed);
                since = Instant::now();
            }
            match self.from_prev.read(&mut frame[have..]) {
                Ok(0) => return false,
                Ok(n) => have += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return false,
            }
        }
        true
    }

    fn send(&mut self, frame: &[u8]) {
        let _ = self.to_next.write_all(frame);
    }
}

/// What a stand-in does in the ring.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    /// Receive, compute (sleep), send on; control as the protocol says.
    Worker {
        /// Simulated compute per data frame.
        compute: Duration,
    },
    /// Resize first (unless `resize` is None), then send `frames` frames
    /// one at a time, each waiting for the previous one to come back.
    Head {
        /// What to send before the data.
        resize: Option<Resize>,
        /// Data frames to drive.
        frames: u64,
    },
}

/// What an original head sends to resize the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resize {
    /// RESIZE_LAYERS (`/resize 8`: the one worker takes `8..32` as the tail).
    Layers,
    /// RESIZE_CHAIN for this many workers (`/resize 8 ... 32`).
    Chain(usize),
}

impl Resize {
    /// The message, as the original head builds it.
    pub fn message(self) -> ControlMessage {
        match self {
            Self::Layers => {
                let mut m = ControlMessage::new(ControlType::ResizeLayers);
                (m.split_layer, m.end_layer, m.is_tail) = (HEAD_LAYERS, LAYERS, true);
                m
            }
            Self::Chain(workers) => {
                let mut m = ControlMessage::new(ControlType::ResizeChain);
                m.total_workers = workers as i32;
                let per = (LAYERS - HEAD_LAYERS) / workers as i32;
                for i in 0..workers {
                    let start_layer = HEAD_LAYERS + per * i as i32;
                    let end_layer = if i + 1 == workers { LAYERS } else { start_layer + per };
                    m.ranges[i] = LayerRange { start_layer, end_layer, is_tail: end_layer == LAYERS };
                }
                m
            }
        }
    }
}

/// The ACK an original worker makes: its own new range, every other field
/// zero.
pub fn fresh_ack(range: LayerRange) -> ControlMessage {
    let mut ack = ControlMessage::new(ControlType::Ack);
    (ack.split_layer, ack.end_layer, ack.is_tail) = (range.start_layer, range.end_layer, range.is_tail);
    ack
}

/// What an original worker running `range` sends on for a control message
/// (and the range it runs afterwards).
pub fn worker_control(msg: &ControlMessage, range: &mut LayerRange) -> ControlMessage {
    match msg.kind {
        ControlType::ResizeLayers => {
            *range = LayerRange { start_layer: msg.split_layer, end_layer: msg.end_layer, is_tail: msg.is_tail };
            fresh_ack(*range)
        }
        ControlType::ResizeChain => {
            *range =
                usize::try_from(msg.worker_index).ok().and_then(|i| msg.ranges.get(i)).copied().unwrap_or_default();
            let mut out = *msg;
            out.worker_index += 1;
            if out.worker_index >= out.total_workers { fresh_ack(*range) } else { out }
        }
        ControlType::Ack => *msg,
    }
}

/// Marker + message, zero padded to the frame size (`send_control`).
pub fn control_frame(msg: &ControlMessage) -> Vec<u8> {
    let mut f = vec![0u8; FRAME];
    msg.encode(&mut f).expect("a valid control message");
    f
}

/// The frame an original head sends at step `pos`: `{ pos, flags 1 }` and
/// activations that differ per step.
pub fn data_frame(pos: u64) -> Vec<u8> {
    let mut f = Vec::with_capacity(FRAME);
    f.extend_from_slice(&(pos as i32).to_ne_bytes());
    f.extend_from_slice(&1i32.to_ne_bytes());
    f.extend((8..FRAME).map(|i| (i as u64).wrapping_mul(31).wrapping_add(pos * 7 + 1) as u8));
    f
}

fn worker(wire: &mut dyn Wire, compute: Duration, s: &Shared) {
    let mut frame = vec![0u8; FRAME];
    let mut range = LayerRange::default();
    while !s.stopped() {
        if !wire.recv(&mut frame, None) {
            return;
        }
        if ControlMessage::has_marker(&frame) {
            // Inline control: applied, then forwarded or answered; never
            // computed on.
            s.report.control.fetch_add(1, Ordering::Relaxed);
            if let Ok(msg) = ControlMessage::decode(&frame) {
                wire.send(&control_frame(&worker_control(&msg, &mut range)));
                *s.report.range.lock().unwrap_or_else(PoisonError::into_inner) = range;
            }
            continue;
        }
        if !compute.is_zero() {
            std::thread::sleep(compute);
        }
        wire.send(&frame);
        s.report.frames.fetch_add(1, Ordering::Relaxed);
    }
}

fn head(wire: &mut dyn Wire, resize: Option<Resize>, frames: u64, s: &Shared) {
    let mut out = HeadOutcome::default();
    let mut buf = vec![0u8; FRAME];
    if let Some(resize) = resize {
        wire.send(&control_frame(&resize.message()));
        let until = Instant::now() + ACK_WAIT;
        let mut ack = false;
        while wire.recv(&mut buf, Some(until)) {
            if buf[..2] == CONTROL_MARKER.to_ne_bytes() {
                s.report.control.fetch_add(1, Ordering::Relaxed);
                if buf[2] == ControlType::Ack as u8 {
                    ack = true;
                    out.ack_msg = ControlMessage::decode(&buf).ok();
                    break;
                }
            }
        }
        out.ack = Some(ack);
    }
    for pos in 0..frames {
        let frame = data_frame(pos);
        wire.send(&frame);
        if !wire.recv(&mut buf, Some(Instant::now() + HANG)) {
            out.lost += 1;
            break;
        }
        if buf == frame {
            out.delivered += 1;
        } else {
            out.corrupt += 1;
        }
    }
    out.finished = !s.stopped();
    *s.report.head.lock().unwrap_or_else(PoisonError::into_inner) = out;
}

/// An original endpoint as a thread.
pub struct Original {
    /// What it saw.
    pub report: Arc<Report>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Original {
    /// Runs `role` on the wire that `wire` sets up (in the new thread).
    pub fn start(wire: impl FnOnce(Shared) -> Box<dyn Wire> + Send + 'static, role: Role) -> Self {
        let s = Shared::default();
        let (report, stop) = (s.report.clone(), s.stop.clone());
        let thread = std::thread::spawn(move || {
            let mut w = wire(s.clone());
            match role {
                Role::Worker { compute } => worker(&mut *w, compute, &s),
                Role::Head { resize, frames } => head(&mut *w, resize, frames, &s),
            }
        });
        Self { report, stop, thread: Some(thread) }
    }

    /// The original UDP transport on `sock`, sending to `next`.
    pub fn udp(sock: UdpSocket, next: SocketAddr, role: Role) -> Self {
        Self::start(move |s| Box::new(UdpWire::new(sock, next, Reserved::Echo, s)), role)
    }

    /// The original over the kernel module, on `sock`, sending to `next`.
    pub fn kernel(sock: UdpSocket, next: SocketAddr, role: Role) -> Self {
        Self::start(move |s| Box::new(UdpWire::new(sock, next, Reserved::Zero, s)), role)
    }

    /// The original TCP transport listening on `listen`, connecting to `next`.
    pub fn tcp(listen: SocketAddr, next: SocketAddr, role: Role) -> Self {
        Self::start(move |s| Box::new(TcpWire::connect(listen, next, s)), role)
    }

    /// Waits for a head to finish, at most `limit`, and returns what it
    /// measured.
    ///
    /// # Panics
    ///
    /// When it has not finished within `limit`, or panicked.
    pub fn wait_head(&mut self, limit: Duration) -> HeadOutcome {
        let t = self.thread.take().expect("running");
        let start = Instant::now();
        while !t.is_finished() {
            assert!(start.elapsed() < limit, "the original head did not finish within {limit:?}: {:?}", self.report);
            std::thread::sleep(POLL);
        }
        t.join().expect("the original head panicked");
        *self.report.head.lock().unwrap_or_else(PoisonError::into_inner)
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

/// The wire of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    /// Chunked datagrams (leap's UDP transport, the original UDP stand-in).
    Udp,
    /// Raw TCP framing, the original's wire.
    Tcp,
}

/// A member of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// A leap node (`run_head` / `run_worker`).
    Leap,
    /// A stand-in for the original.
    Original,
}

/// What a ring's head saw, and the stand-ins' troubles.
#[derive(Debug)]
pub struct Outcome {
    /// Whether the head got its ACK (None: no resize).
    pub control_ack: Option<bool>,
    /// The ACK an original head got.
    pub ack_msg: Option<ControlMessage>,
    /// Frames back intact.
    pub delivered: u64,
    /// Frames back with other bytes.
    pub corrupt: u64,
    /// Frames that never came back.
    pub lost: u64,
    /// The layers each worker (`nodes[1..]`) runs after the resize.
    pub ranges: Vec<LayerRange>,
    /// Waits longer than [`HANG`] for the rest of a frame, over every
    /// stand-in.
    pub hangs: u64,
    /// `reserved` values other than 0 that stand-ins sent (echoed from leap).
    pub echoed: u64,
    /// Chunk trains that stand-ins received.
    pub trains: u64,
}

fn leap_transport(net: Net, listen: SocketAddr, next: SocketAddr, prev: SocketAddr) -> Box<dyn Transport> {
    match net {
        Net::Udp => {
            let mut c = UdpConfig::new(listen, next);
            c.prev = Some(prev);
            c.max_frame_len = FRAME;
            Box::new(UdpTransport::bind(c).unwrap())
        }
        Net::Tcp => {
            let mut c = TcpConfig::new(listen, next, FRAME);
            c.setup_timeout = SETUP;
            Box::new(TcpTransport::connect(c).unwrap())
        }
    }
}

/// Runs a ring of `nodes` over `net` on 127.0.0.1, `nodes[0]` the head:
/// the head resizes the ring (a leap head only with a RESIZE_CHAIN for
/// every worker), then drives `frames` frames one at a time.
///
/// # Panics
///
/// A leap head asked for RESIZE_LAYERS, a leap node's error, or a head that
/// does not finish in time.
pub fn ring(net: Net, nodes: &[Node], resize: Option<Resize>, frames: u64) -> Outcome {
    let n = nodes.len();
    // Every address is taken at once, so that none comes twice; then the
    // leap nodes' are freed for them (a UDP stand-in keeps its socket).
    let (mut socks, listeners): (Vec<Option<UdpSocket>>, Vec<Option<TcpListener>>) = (0..n)
        .map(|_| match net {
            Net::Udp => (Some(UdpSocket::bind("127.0.0.1:0").unwrap()), None),
            Net::Tcp => (None, Some(TcpListener::bind("127.0.0.1:0").unwrap())),
        })
        .unzip();
    let addrs: Vec<SocketAddr> = (0..n)
        .map(|i| match (&socks[i], &listeners[i]) {
            (Some(s), _) => s.local_addr().unwrap(),
            (_, Some(l)) => l.local_addr().unwrap(),
            (None, None) => unreachable!("one of them per node"),
        })
        .collect();
    drop(listeners);
    for (sock, &m) in socks.iter_mut().zip(nodes) {
        if m == Node::Leap {
            *sock = None;
        }
    }
    let next = |i: usize| addrs[(i + 1) % n];
    let prev = |i: usize| addrs[(i + n - 1) % n];
    let stop = Arc::new(AtomicBool::new(false));
    let mut leap_workers = Vec::new();
    let mut originals = Vec::new();
    for i in 1..n {
        match nodes[i] {
            Node::Leap => {
                let (listen, next, prev, stop) = (addrs[i], next(i), prev(i), stop.clone());
                // A UDP node is bound before any head sends (an original head
                // sends its first frame at once, and only once); a TCP node
                // stands only once its neighbours do.
                let bound = (net == Net::Udp).then(|| leap_transport(net, listen, next, prev));
                leap_workers.push(std::thread::spawn(move || {
                    let mut t = bound.unwrap_or_else(|| leap_transport(net, listen, next, prev));
                    let mut cfg = WorkerConfig::new(FRAME);
                    cfg.policy = NeighbourPolicy::Wait;
                    run_worker(&mut *t, &cfg, &stop).unwrap()
                }));
            }
            Node::Original => {
                let role = Role::Worker { compute: Duration::ZERO };
                originals.push(match net {
                    Net::Udp => Original::udp(socks[i].take().unwrap(), next(i), role),
                    Net::Tcp => Original::tcp(addrs[i], next(i), role),
                });
            }
        }
    }
    let (control_ack, ack_msg, delivered, corrupt, lost) = match nodes[0] {
        Node::Leap => {
            assert_ne!(resize, Some(Resize::Layers), "a leap head sends RESIZE_CHAIN only");
            let mut t = leap_transport(net, addrs[0], next(0), prev(0));
            let mut hc = HeadConfig::new(FRAME, frames);
            hc.stall_timeout = Duration::from_secs(20);
            hc.lost_after = Some(Duration::from_secs(4));
            hc.retry = true;
            hc.control_workers = resize.map(|r| match r {
                Resize::Chain(w) => w,
                Resize::Layers => unreachable!(),
            });
            let rep = run_head(&mut *t, &hc).unwrap();
            (rep.control_ack, None, rep.delivered, rep.corrupt, rep.lost)
        }
        Node::Original => {
            let role = Role::Head { resize, frames };
            let mut h = match net {
                Net::Udp => Original::udp(socks[0].take().unwrap(), next(0), role),
                Net::Tcp => Original::tcp(addrs[0], next(0), role),
            };
            let o = h.wait_head(Duration::from_secs(60));
            assert!(o.finished, "{o:?}");
            originals.insert(0, h);
            (o.ack, o.ack_msg, o.delivered, o.corrupt, o.lost)
        }
    };
    stop.store(true, Ordering::Relaxed);
    let mut leap_layers = leap_workers.into_iter().map(|w| w.join().expect("a leap worker panicked").range);
    let mut stand_ins = originals.iter().skip(usize::from(nodes[0] == Node::Original));
    let ranges = nodes[1..]
        .iter()
        .map(|&m| match m {
            Node::Leap => leap_layers.next().expect("one per leap worker"),
            Node::Original => {
                *stand_ins.next().expect("one per stand-in").report.range.lock().unwrap_or_else(PoisonError::into_inner)
            }
        })
        .collect();
    let sum = |f: fn(&Report) -> &AtomicU64| originals.iter().map(|o| f(&o.report).load(Ordering::Relaxed)).sum();
    Outcome {
        control_ack,
        ack_msg,
        delivered,
        corrupt,
        lost,
        ranges,
        hangs: sum(|r| &r.hangs),
        echoed: sum(|r| &r.echoed_flags),
        trains: sum(|r| &r.trains),
    }
}
