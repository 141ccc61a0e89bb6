//! The agent: one tokio thread serving coordinator connections, each ring
//! member on a thread of its own. Every connection is bounded (pending
//! handshakes and sessions counted apart, time to complete the handshake,
//! idle time, message size); an unauthenticated connection never displaces
//! another. A member is stopped, and its transport dropped (sockets closed,
//! XDP detached), when its run ends, when the coordinator says `Stop`, when
//! the run exceeds its time, and when the coordinator's connection goes
//! away.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use super::allow::AllowList;
use super::capabilities;
use super::protocol::{
    AgentCounters, ErrorKind, HEADER_LEN, MAGIC, MAX_REQUEST, MemberReport, MemberSpec, ProtocolError, Request,
    Response, Role, decode, encode, parse_header,
};
use super::session::{self, HANDSHAKE_HEADER, HandshakeError, Opener, Sealer};
use crate::ring::{HeadConfig, HeadSummary, WorkerConfig, run_head, run_worker};
use crate::transport::config::TcpFraming;
use crate::transport::open::{Endpoint, Options};

/// How much the agent lets coordinators take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Authenticated sessions open at once; a handshake that succeeds
    /// beyond it is answered `busy` and closed.
    pub max_connections: usize,
    /// Handshakes in progress at once; a connection beyond it is closed at
    /// once (and counted), displacing no one.
    pub max_handshakes: usize,
    /// Time to complete the handshake after connecting.
    pub auth_timeout: Duration,
    /// Time an authenticated connection may stay silent with no member.
    pub idle_timeout: Duration,
    /// Longest run of one member (from `Go`); then it is aborted.
    pub max_run: Duration,
    /// Time an `Open` waits for the previous member to finish cleaning up.
    pub busy_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 8,
            max_handshakes: 32,
            auth_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            max_run: Duration::from_secs(600),
            busy_wait: Duration::from_secs(10),
        }
    }
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Control address (the only one listened on).
    pub listen: SocketAddr,
    /// This host's token (the handshake's pre-shared key).
    pub token: String,
    /// Bounds.
    pub limits: Limits,
    /// XDP object to load instead of the embedded one (never taken from
    /// the network).
    pub xdp_object: Option<PathBuf>,
    /// What members may reach (addresses, ports, interfaces).
    pub allow: AllowList,
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The control address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime could not start.
    #[error("starting the agent's runtime: {0}")]
    Runtime(std::io::Error),
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    refused_connections: AtomicU64,
    unauthenticated: AtomicU64,
    bad_requests: AtomicU64,
    oversized_requests: AtomicU64,
    timeouts: AtomicU64,
    runs_started: AtomicU64,
    runs_aborted: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> AgentCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AgentCounters {
            connections: g(&self.connections),
            refused_connections: g(&self.refused_connections),
            unauthenticated: g(&self.unauthenticated),
            bad_requests: g(&self.bad_requests),
            oversized_requests: g(&self.oversized_requests),
            timeouts: g(&self.timeouts),
            runs_started: g(&self.runs_started),
            runs_aborted: g(&self.runs_aborted),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug)]
struct Shared {
    cfg: AgentConfig,
    counters: Counters,
    /// A member is open or running (on any connection).
    busy: Mutex<bool>,
    /// Handshakes in progress.
    handshakes: Arc<AtomicUsize>,
    /// Authenticated sessions.
    sessions: Arc<AtomicUsize>,
}

/// One of a bounded number of places, given back on drop.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(Self(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Released when the member thread ends, after its transport is dropped.
#[derive(Debug)]
struct BusyGuard(Arc<Shared>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }
}

impl Shared {
    fn try_claim(self: &Arc<Self>) -> Option<BusyGuard> {
        let mut b = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if *b {
            return None;
        }
        *b = true;
        Some(BusyGuard(self.clone()))
    }

    fn running(&self) -> bool {
        *self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves coordinators on `cfg.listen` until `stop` is set; members still
/// running are aborted and cleaned up before it returns.
///
/// # Errors
///
/// [`AgentError`]: binding, or starting the runtime.
pub fn serve(cfg: AgentConfig, stop: &AtomicBool) -> Result<(), AgentError> {
    let addr = cfg.listen;
    let std_listener = std::net::TcpListener::bind(addr).map_err(|source| AgentError::Bind { addr, source })?;
    std_listener.set_nonblocking(true).map_err(|source| AgentError::Bind { addr, source })?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(AgentError::Runtime)?;
    let shared = Arc::new(Shared {
        cfg,
        counters: Counters::default(),
        busy: Mutex::new(false),
        handshakes: Arc::new(AtomicUsize::new(0)),
        sessions: Arc::new(AtomicUsize::new(0)),
    });
    log::info!("leap serve: listening on {addr}");
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => return Err(AgentError::Bind { addr, source: e }),
        };
        let mut tasks = tokio::task::JoinSet::new();
        let mut refusals_logged = Instant::now() - Duration::from_secs(10);
        while !stop.load(Ordering::Relaxed) {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tokio::time::sleep(Duration::from_millis(200)) => continue,
            };
            while tasks.try_join_next().is_some() {}
            let Ok((stream, peer)) = accepted else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            bump(&shared.counters.connections);
            // Never displace anyone: a connection beyond the pending bound
            // is closed at once, before a byte is read or written.
            let Some(pending) = Slot::take(&shared.handshakes, shared.cfg.limits.max_handshakes) else {
                bump(&shared.counters.refused_connections);
                if refusals_logged.elapsed() >= Duration::from_secs(1) {
                    refusals_logged = Instant::now();
                    log::warn!(
                        "leap serve: refusing connections (e.g. {peer}): {} handshakes pending",
                        shared.cfg.limits.max_handshakes
                    );
                }
                drop(stream);
                continue;
            };
            let sh = shared.clone();
            tasks.spawn(async move {
                connection(stream, peer, sh, pending).await;
            });
        }
        // Aborting the tasks drops their members' handles, which stops them.
        tasks.shutdown().await;
        Ok(())
    })?;
    drop(runtime);
    // Members still cleaning up: wait for them, bounded.
    let deadline = Instant::now() + Duration::from_secs(10);
    while shared.running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The reading half of a session: plaintext out of sealed records.
struct SessionReader {
    rd: OwnedReadHalf,
    opener: Opener,
    buf: Vec<u8>,
    pos: usize,
}

impl SessionReader {
    async fn read_exact(&mut self, out: &mut [u8]) -> std::io::Result<()> {
        let mut done = 0;
        while done < out.len() {
            if self.pos == self.buf.len() {
                let mut h = [0u8; 2];
                self.rd.read_exact(&mut h).await?;
                let mut rec = vec![0u8; Opener::record_len(h)?];
                self.rd.read_exact(&mut rec).await?;
                self.buf = self.opener.open(&rec)?;
                self.pos = 0;
            }
            let n = (out.len() - done).min(self.buf.len() - self.pos);
            out[done..done + n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            done += n;
        }
        Ok(())
    }
}

/// Reads requests into `tx` until the connection or the channel closes.
async fn read_loop(mut rd: SessionReader, tx: mpsc::Sender<Result<Request, ProtocolError>>) {
    loop {
        let mut h = [0u8; HEADER_LEN];
        let msg = match rd.read_exact(&mut h).await {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(ProtocolError::Closed),
            Err(e) => Err(e.into()),
            Ok(()) => match parse_header(&h, MAX_REQUEST) {
                Err(e) => Err(e),
                Ok(len) => {
                    let mut body = vec![0u8; len];
                    match rd.read_exact(&mut body).await {
                        Ok(()) => decode(&body),
                        Err(e) => Err(e.into()),
                    }
                }
            },
        };
        let fatal = msg.is_err();
        if tx.send(msg).await.is_err() || fatal {
            return;
        }
    }
}

/// The writing half of a session.
struct SessionWriter {
    wr: OwnedWriteHalf,
    sealer: Sealer,
}

async fn send(w: &mut SessionWriter, r: &Response) -> bool {
    let bytes = w.sealer.seal(&encode(r));
    tokio::time::timeout(Duration::from_secs(5), w.wr.write_all(&bytes)).await.is_ok_and(|r| r.is_ok())
}

/// Why a handshake ended without a session.
enum Refused {
    /// Closed, timed out or failed at the socket.
    Gone,
    /// Not this protocol (counted as a bad request).
    Garbage,
    /// The token does not match (counted as unauthenticated).
    WrongToken,
}

/// The agent's side of the handshake. Nothing is sent before the
/// coordinator's first message has authenticated under the token, except
/// to a coordinator of before the handshake (its magic), which is told in
/// clear to upgrade.
async fn handshake(stream: &mut TcpStream, token: &str) -> Result<(Sealer, Opener), Refused> {
    let mut h = [0u8; HANDSHAKE_HEADER];
    stream.read_exact(&mut h).await.map_err(|_| Refused::Gone)?;
    if h[..4] == MAGIC {
        let hint = error(
            ErrorKind::Unauthenticated,
            "this agent speaks leap serve 2 (a Noise handshake keyed by the token, which is never sent): \
             upgrade the coordinator",
        );
        let _ = tokio::time::timeout(Duration::from_millis(500), stream.write_all(&encode(&hint))).await;
        return Err(Refused::Garbage);
    }
    let len = session::parse_handshake_header(&h).map_err(|_| Refused::Garbage)?;
    let mut msg = vec![0u8; len];
    stream.read_exact(&mut msg).await.map_err(|_| Refused::Gone)?;
    let (sealer, opener, answer) = match session::respond(token, &msg) {
        Ok(x) => x,
        Err(HandshakeError::WrongToken) => return Err(Refused::WrongToken),
        Err(_) => return Err(Refused::Garbage),
    };
    stream.write_all(&answer).await.map_err(|_| Refused::Gone)?;
    Ok((sealer, opener))
}

fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error { kind, message: message.into() }
}

/// Counts a message that could not be read and says why.
fn refuse_message(c: &Counters, e: &ProtocolError) -> Option<Response> {
    match e {
        ProtocolError::Closed => None,
        ProtocolError::Io(_) => None,
        ProtocolError::BadMagic | ProtocolError::Malformed(_) => {
            bump(&c.bad_requests);
            Some(error(ErrorKind::BadRequest, e.to_string()))
        }
        ProtocolError::TooLarge { .. } => {
            bump(&c.oversized_requests);
            Some(error(ErrorKind::TooLarge, e.to_string()))
        }
    }
}

enum MemberEvent {
    Opened,
    Finished(Box<MemberReport>),
}

/// A member started by this connection. Dropping it stops the member.
struct Member {
    stop: Arc<AtomicBool>,
    go: Option<std::sync::mpsc::Sender<()>>,
    events: mpsc::UnboundedReceiver<MemberEvent>,
    deadline: Option<tokio::time::Instant>,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn connection(mut stream: TcpStream, peer: SocketAddr, sh: Arc<Shared>, pending: Slot) {
    let limits = sh.cfg.limits;
    let _ = stream.set_nodelay(true);
    let c = &sh.counters;
    let (sealer, opener) = match tokio::time::timeout(limits.auth_timeout, handshake(&mut stream, &sh.cfg.token)).await
    {
        Err(_) => {
            bump(&c.timeouts);
            log::info!("leap serve: {peer}: no handshake within {:?}; closing", limits.auth_timeout);
            return;
        }
        Ok(Err(Refused::Gone)) => return,
        Ok(Err(Refused::Garbage)) => {
            bump(&c.bad_requests);
            log::info!("leap serve: {peer}: not a leap serve 2 handshake; closing");
            return;
        }
        Ok(Err(Refused::WrongToken)) => {
            bump(&c.unauthenticated);
            log::warn!("leap serve: {peer}: handshake with a wrong token; closing");
            return;
        }
        Ok(Ok(keys)) => keys,
    };
    drop(pending);
    let (rd, wr) = stream.into_split();
    let mut wr = SessionWriter { wr, sealer };
    let Some(_session) = Slot::take(&sh.sessions, limits.max_connections) else {
        bump(&c.refused_connections);
        log::warn!("leap serve: {peer}: {} sessions open already; refusing", limits.max_connections);
        let _ = send(&mut wr, &error(ErrorKind::Busy, "too many coordinator sessions open")).await;
        return;
    };
    let (tx, mut rx) = mpsc::channel(1);
    let reader = tokio::spawn(read_loop(SessionReader { rd, opener, buf: Vec::new(), pos: 0 }, tx));
    let _reader = AbortOnDrop(reader);
    log::info!("leap serve: coordinator {peer} authenticated");
    let mut member: Option<Member> = None;
    loop {
        let idle = tokio::time::sleep(if member.is_some() { Duration::MAX / 4 } else { limits.idle_timeout });
        let deadline = member.as_ref().and_then(|m| m.deadline);
        let run_over = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let event = async {
            match member.as_mut() {
                Some(m) => m.events.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            msg = rx.recv() => {
                let req = match msg {
                    None | Some(Err(ProtocolError::Closed)) => break,
                    Some(Err(e)) => {
                        if let Some(r) = refuse_message(c, &e) {
                            let _ = send(&mut wr, &r).await;
                        }
                        break;
                    }
                    Some(Ok(r)) => r,
                };
                let resp = request(&sh, req, &mut member).await;
                if let Some(resp) = resp
                    && !send(&mut wr, &resp).await
                {
                    break;
                }
            }
            ev = event => match ev {
                Some(MemberEvent::Opened) => {
                    if !send(&mut wr, &Response::Opened).await {
                        break;
                    }
                }
                Some(MemberEvent::Finished(rep)) => {
                    member = None;
                    let resp = match &rep.error {
                        Some(e) => error(ErrorKind::MemberFailed, e.clone()),
                        None => Response::Finished(rep),
                    };
                    if !send(&mut wr, &resp).await {
                        break;
                    }
                }
                None => member = None,
            },
            () = run_over => {
                log::warn!("leap serve: {peer}: run longer than {:?}; aborting it", limits.max_run);
                bump(&c.runs_aborted);
                if let Some(m) = &mut member {
                    m.stop.store(true, Ordering::SeqCst);
                    m.deadline = None;
                }
            }
            () = idle => {
                bump(&c.timeouts);
                let _ = send(&mut wr, &error(ErrorKind::Timeout, "idle too long")).await;
                break;
            }
        }
    }
    if member.is_some() {
        log::warn!("leap serve: coordinator {peer} went away during a run; aborting it");
        bump(&c.runs_aborted);
    }
    // Dropping the member sets its stop flag: it drops its transport.
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn request(sh: &Arc<Shared>, req: Request, member: &mut Option<Member>) -> Option<Response> {
    let c = &sh.counters;
    Some(match req {
        Request::Capabilities => {
            let object_ok = sh.cfg.xdp_object.as_ref().is_some_and(|p| p.is_file())
                || crate::transport::xdp::object::embedded().is_some();
            Response::Capabilities(capabilities::probe_with(object_ok, sh.cfg.xdp_object.as_deref()))
        }
        Request::Status => Response::Status { counters: c.snapshot(), running: sh.running() },
        Request::Open(spec) => {
            if member.is_some() {
                return Some(error(ErrorKind::InvalidState, "a member is already open on this connection"));
            }
            if let Err(e) = spec.validate().and_then(|()| sh.cfg.allow.check(&spec, sh.cfg.listen)) {
                bump(&c.bad_requests);
                log::warn!("leap serve: refused a member: {e}");
                return Some(error(ErrorKind::BadRequest, e));
            }
            let deadline = Instant::now() + sh.cfg.limits.busy_wait;
            let guard = loop {
                if let Some(g) = sh.try_claim() {
                    break g;
                }
                if Instant::now() >= deadline {
                    return Some(error(ErrorKind::Busy, "another run is in progress on this host"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            match start(sh, *spec, guard) {
                Ok(m) => {
                    bump(&c.runs_started);
                    *member = Some(m);
                    return None;
                }
                Err(e) => error(ErrorKind::MemberFailed, format!("starting the member thread: {e}")),
            }
        }
        Request::Go => match member.as_mut().and_then(|m| m.go.take().map(|g| (g, m))) {
            Some((go, m)) => {
                m.deadline = Some(tokio::time::Instant::now() + sh.cfg.limits.max_run);
                let _ = go.send(());
                return None;
            }
            None => error(ErrorKind::InvalidState, "Go needs an opened member (Open first, once)"),
        },
        Request::Stop => match member {
            Some(m) => {
                m.stop.store(true, Ordering::SeqCst);
                return None;
            }
            None => Response::Stopped,
        },
    })
}

fn start(sh: &Arc<Shared>, spec: MemberSpec, guard: BusyGuard) -> std::io::Result<Member> {
    let stop = Arc::new(AtomicBool::new(false));
    let (go_tx, go_rx) = std::sync::mpsc::channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let opts = Options {
        frame_len: spec.frame_size,
        recv_timeout: Some(Duration::from_millis(spec.recv_timeout_ms)),
        setup_timeout: Duration::from_millis(spec.setup_timeout_ms),
        xdp_object: sh.cfg.xdp_object.clone(),
        xdp_mode: spec.xdp_mode.attach_mode(),
        reliability: spec.reliability,
        gso: spec.gso,
        crc: spec.crc,
        trains: spec.trains,
        inflight: spec.inflight,
        // Never raw: a worker would forward whatever bytes arrive. Both
        // ends of every hop are agents, so both use length framing.
        tcp_framing: TcpFraming::Length,
        // And keyed: a member only talks to members of the run (the key
        // proves each connection's ends; frames untagged, so that the tcp
        // rows compare with the other paths'). Datagram members prove
        // each other with hellos.
        ring_key: match spec.transport {
            crate::transport::open::TransportKind::Tcp => {
                spec.run_key.clone().map(crate::transport::ring_key::KeySet::proof_only)
            }
            _ => None,
        },
        ..Options::default()
    };
    let st = stop.clone();
    std::thread::Builder::new().name(format!("leap-serve-{:?}", spec.role).to_lowercase()).spawn(move || {
        let rep = member_thread(&spec, &opts, &st, &go_rx, &ev_tx);
        // The transport is gone: let the next run claim the host first.
        drop(guard);
        let _ = ev_tx.send(MemberEvent::Finished(Box::new(rep)));
    })?;
    Ok(Member { stop, go: Some(go_tx), events: ev_rx, deadline: None })
}

/// Opens, waits for `Go`, runs; the transport is dropped before it returns.
fn member_thread(
    spec: &MemberSpec,
    opts: &Options,
    stop: &Arc<AtomicBool>,
    go: &std::sync::mpsc::Receiver<()>,
    events: &mpsc::UnboundedSender<MemberEvent>,
) -> MemberReport {
    let fail = |e: String| MemberReport { error: Some(e), ..Default::default() };
    let ep = Endpoint { listen: spec.listen, next: spec.next, prev: Some(spec.prev), iface: spec.iface.clone() };
    let mut t = match crate::transport::open::open(spec.transport, &ep, opts) {
        Ok(t) => t,
        Err(e) => return fail(format!("opening {} on {}: {e}", spec.transport, spec.listen)),
    };
    log::info!("leap serve: {:?} {} open on {}", spec.role, spec.transport, spec.listen);
    let _ = events.send(MemberEvent::Opened);
    let waited = Instant::now();
    loop {
        match go.recv_timeout(Duration::from_millis(100)) {
            Ok(()) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                if !stop.load(Ordering::Relaxed) && waited.elapsed() < opts.setup_timeout => {}
            Err(_) => return MemberReport { aborted: true, ..Default::default() },
        }
    }
    let cpu0 = crate::sys::thread_cpu_time();
    let (head, error) = match spec.role {
        Role::Head => {
            let hc = HeadConfig {
                frame_size: spec.frame_size,
                frames: spec.frames,
                inflight: spec.inflight,
                stall_timeout: Duration::from_millis(spec.stall_timeout_ms),
                lost_after: Some(crate::ring::loss_policy(spec.transport, spec.reliability).0),
                retry: crate::ring::loss_policy(spec.transport, spec.reliability).1,
                control_workers: None,
                progress: None,
                telemetry: None,
                stop: Some(stop.clone()),
                pause: Duration::ZERO,
                copying: false,
            };
            match run_head(&mut *t, &hc) {
                Ok(h) => (Some(HeadSummary::of(h)), None),
                Err(e) => (None, Some(e.to_string())),
            }
        }
        Role::Worker => {
            let wc = WorkerConfig { frame_size: spec.frame_size, ..WorkerConfig::default() };
            (None, run_worker(&mut *t, &wc, stop).err().map(|e| e.to_string()))
        }
    };
    let cpu1 = crate::sys::thread_cpu_time();
    let cpu = (cpu1.0 + cpu1.1).saturating_sub(cpu0.0 + cpu0.1);
    let rep = MemberReport {
        aborted: stop.load(Ordering::Relaxed),
        head,
        stats: t.stats(),
        backend: t.backend_counters(),
        cpu_s: cpu.as_secs_f64(),
        error,
    };
    // Sockets closed, XDP links dropped (detached), before anyone hears.
    drop(t);
    log::info!("leap serve: {:?} {} on {} closed", spec.role, spec.transport, spec.listen);
    rep
}
