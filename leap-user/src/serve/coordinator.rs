//! The coordinator side of `leap bench --hosts`: one session per agent
//! (a Noise handshake keyed by that host's token, see [`super::session`]), one ring at a time across the hosts (the first is
//! the head), measured at the head so that no clock synchronisation between
//! the hosts is needed.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::capabilities::HostCapabilities;
use super::protocol::{
    MAX_RESPONSE, MemberReport, MemberSpec, ProtocolError, Request, Response, Role, TokenError, XdpMode, read_message,
    read_token, write_message,
};
use super::session::{self, HandshakeError, SecureReader, SecureWriter};
use crate::bench::{BenchHost, FloorOutcome, Rings};
use crate::ring::{RingConfig, RingReport, assemble};
use crate::transport::Stats;
use crate::transport::open::TransportKind;
use crate::transport::ring_key::RingKey;

/// Time to connect and authenticate.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time the agents get to clean up an aborted run, beyond the ring's setup
/// timeout (a TCP member whose neighbour went away tries to reconnect for
/// that long before it sees the stop).
pub const ABORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a head's report.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(660);

/// One host of the benchmark ring.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Name in the report.
    pub name: String,
    /// Its agent's control address.
    pub control: SocketAddr,
    /// Its ring member's data address.
    pub data: SocketAddr,
    /// Interface its frames arrive on (XDP attaches there).
    #[serde(default)]
    pub iface: Option<String>,
    /// File holding this host's own token (default: the common one).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

/// A hosts file: `token_file` (the common token) and one `[[host]]` table
/// per host, in ring order (the first is the head); a host may name its own
/// `token_file`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostsFile {
    /// File holding the shared token.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// The hosts.
    #[serde(rename = "host")]
    pub hosts: Vec<HostSpec>,
}

/// What went wrong talking to the agents.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The agent cannot be reached.
    #[error("host {host} ({addr}): cannot connect: {source}")]
    Connect {
        /// Host name.
        host: String,
        /// Control address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The agent refused or answered nonsense.
    #[error("host {host}: {message}")]
    Agent {
        /// Host name.
        host: String,
        /// What it said.
        message: String,
    },
    /// The connection broke.
    #[error("host {host}: connection lost ({source}): agent killed or host down")]
    Lost {
        /// Host name.
        host: String,
        /// Why.
        source: ProtocolError,
    },
    /// Nothing came in time.
    #[error("{0}")]
    Timeout(String),
    /// The run's ring key could not be made (`getrandom(2)`).
    #[error("making the run's ring key: {0}")]
    Random(std::io::Error),
    /// The handshake failed: nothing was sent to the agent but an
    /// ephemeral key and a tag.
    #[error("host {host} ({addr}): handshake failed: {message}")]
    Handshake {
        /// Host name.
        host: String,
        /// Control address.
        addr: SocketAddr,
        /// Why.
        message: String,
    },
    /// A token file cannot be used.
    #[error("host {host}: {source}")]
    Token {
        /// Host name.
        host: String,
        /// Why.
        source: TokenError,
    },
}

/// Each host's token: its own `token_file`, else `common` (read once, and
/// only if some host needs it).
///
/// # Errors
///
/// [`CoordinatorError::Token`] for the first file that cannot be used.
pub fn host_tokens(hosts: &[HostSpec], common: &Path) -> Result<Vec<String>, CoordinatorError> {
    let mut shared: Option<String> = None;
    hosts
        .iter()
        .map(|h| {
            let err = |source| CoordinatorError::Token { host: h.name.clone(), source };
            match &h.token_file {
                Some(f) => read_token(f).map_err(err),
                None => match &shared {
                    Some(t) => Ok(t.clone()),
                    None => {
                        let t = read_token(common).map_err(err)?;
                        shared = Some(t.clone());
                        Ok(t)
                    }
                },
            }
        })
        .collect()
}

/// A synchronous connection to one agent (for `leap bench --hosts`, tests
/// and scripts).
#[derive(Debug)]
pub struct Client {
    writer: SecureWriter<TcpStream>,
    reader: Option<SecureReader<TcpStream>>,
    host: String,
}

impl Client {
    /// Connects and runs the handshake with `token` (which never leaves
    /// this process: it keys the handshake).
    ///
    /// # Errors
    ///
    /// [`CoordinatorError`]; [`CoordinatorError::Handshake`] when the agent
    /// refuses the token (it closes the connection without a word) or does
    /// not prove it holds it.
    pub fn connect(host: &str, addr: SocketAddr, token: &str) -> Result<Self, CoordinatorError> {
        let connect_err = |source| CoordinatorError::Connect { host: host.into(), addr, source };
        let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(connect_err)?;
        stream.set_nodelay(true).map_err(connect_err)?;
        stream.set_read_timeout(Some(CONNECT_TIMEOUT)).map_err(connect_err)?;
        stream.set_write_timeout(Some(CONNECT_TIMEOUT)).map_err(connect_err)?;
        let hs_err = |message: String| CoordinatorError::Handshake { host: host.into(), addr, message };
        let (sealer, opener) = match session::initiate(&mut stream, token) {
            Ok(keys) => keys,
            Err(HandshakeError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(hs_err(
                    "the agent closed the connection: wrong token for this host (check its token file), or an agent \
                     of another version"
                        .into(),
                ));
            }
            Err(HandshakeError::WrongToken) => {
                return Err(hs_err("the agent did not prove it holds this host's token".into()));
            }
            Err(e) => return Err(hs_err(e.to_string())),
        };
        let reader = stream.try_clone().map_err(connect_err)?;
        Ok(Self {
            writer: SecureWriter::new(stream, sealer),
            reader: Some(SecureReader::new(reader, opener)),
            host: host.into(),
        })
    }

    fn stream(&self) -> &TcpStream {
        self.writer.get_ref()
    }

    /// Sends `req` and reads one answer (within [`CONNECT_TIMEOUT`]).
    ///
    /// # Errors
    ///
    /// [`CoordinatorError`].
    pub fn call(&mut self, req: &Request) -> Result<Response, CoordinatorError> {
        self.send(req)?;
        self.recv()
    }

    /// Reads one answer (within [`CONNECT_TIMEOUT`]).
    ///
    /// # Errors
    ///
    /// [`CoordinatorError`].
    pub fn recv(&mut self) -> Result<Response, CoordinatorError> {
        let host = self.host.clone();
        let reader = self.reader.as_mut().ok_or_else(|| CoordinatorError::Agent {
            host: host.clone(),
            message: "the session's reader belongs to another thread".into(),
        })?;
        read_message(reader, MAX_RESPONSE).map_err(|source| CoordinatorError::Lost { host, source })
    }

    /// Sends `req` without waiting for an answer.
    ///
    /// # Errors
    ///
    /// [`CoordinatorError::Lost`].
    pub fn send(&mut self, req: &Request) -> Result<(), CoordinatorError> {
        write_message(&mut self.writer, req)
            .and_then(|()| self.writer.flush())
            .map_err(|e| CoordinatorError::Lost { host: self.host.clone(), source: e.into() })
    }

    fn unexpected(&self, r: Response) -> CoordinatorError {
        let message = match r {
            Response::Error { kind, message } => format!("refused ({kind:?}): {message}"),
            other => format!("unexpected answer {other:?}"),
        };
        CoordinatorError::Agent { host: self.host.clone(), message }
    }

    /// The host's capabilities.
    ///
    /// # Errors
    ///
    /// [`CoordinatorError`].
    pub fn capabilities(&mut self) -> Result<HostCapabilities, CoordinatorError> {
        match self.call(&Request::Capabilities)? {
            Response::Capabilities(c) => Ok(c),
            other => Err(self.unexpected(other)),
        }
    }

    /// The agent's counters and whether a member runs.
    ///
    /// # Errors
    ///
    /// [`CoordinatorError`].
    pub fn status(&mut self) -> Result<(super::protocol::AgentCounters, bool), CoordinatorError> {
        match self.call(&Request::Status)? {
            Response::Status { counters, running } => Ok((counters, running)),
            other => Err(self.unexpected(other)),
        }
    }
}

type Event = (usize, u64, Result<Response, ProtocolError>);

/// A live connection: written here, read by its own thread into the
/// shared event channel.
#[derive(Debug)]
struct Conn {
    client: Client,
    generation: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Wakes the reader thread; the agent aborts anything still running.
        let _ = self.client.stream().shutdown(Shutdown::Both);
    }
}

/// Rings across hosts, each member run by the host's `leap serve`.
#[derive(Debug)]
pub struct HostRings {
    hosts: Vec<HostSpec>,
    tokens: Vec<String>,
    site: String,
    caps: Vec<HostCapabilities>,
    conns: Vec<Option<Conn>>,
    generation: u64,
    tx: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
}

impl HostRings {
    /// Connects to every host's agent with `token`, or the host's own
    /// `token_file` where it names one, and asks for its capabilities.
    ///
    /// # Errors
    ///
    /// [`CoordinatorError`] for the first host that cannot be used, or
    /// fewer than two hosts.
    pub fn connect(hosts: Vec<HostSpec>, token: String, site: &str) -> Result<Self, CoordinatorError> {
        let mut tokens = Vec::with_capacity(hosts.len());
        for h in &hosts {
            tokens.push(match &h.token_file {
                Some(f) => read_token(f).map_err(|source| CoordinatorError::Token { host: h.name.clone(), source })?,
                None => token.clone(),
            });
        }
        Self::connect_with_tokens(hosts, tokens, site)
    }

    /// [`HostRings::connect`] with the common token read from `common`
    /// only if some host has no `token_file` of its own.
    ///
    /// # Errors
    ///
    /// As [`HostRings::connect`], and unusable token files.
    pub fn connect_files(hosts: Vec<HostSpec>, common: &Path, site: &str) -> Result<Self, CoordinatorError> {
        let tokens = host_tokens(&hosts, common)?;
        Self::connect_with_tokens(hosts, tokens, site)
    }

    /// [`HostRings::connect`] with one token per host, in order.
    ///
    /// # Errors
    ///
    /// As [`HostRings::connect`].
    pub fn connect_with_tokens(
        hosts: Vec<HostSpec>,
        tokens: Vec<String>,
        site: &str,
    ) -> Result<Self, CoordinatorError> {
        if hosts.len() < 2 || tokens.len() != hosts.len() {
            return Err(CoordinatorError::Agent { host: "-".into(), message: "a ring needs at least 2 hosts".into() });
        }
        let (tx, rx) = mpsc::channel();
        let mut me = Self {
            conns: (0..hosts.len()).map(|_| None).collect(),
            caps: Vec::new(),
            hosts,
            tokens,
            site: site.into(),
            generation: 0,
            tx,
            rx,
        };
        for i in 0..me.hosts.len() {
            let caps = me.open(i)?;
            me.caps.push(caps);
        }
        Ok(me)
    }

    /// The hosts' capabilities, in ring order.
    pub fn capabilities(&self) -> &[HostCapabilities] {
        &self.caps
    }

    /// Connects to host `i` and starts its reader thread.
    fn open(&mut self, i: usize) -> Result<HostCapabilities, CoordinatorError> {
        let h = &self.hosts[i];
        let mut client = Client::connect(&h.name, h.control, &self.tokens[i])?;
        let caps = client.capabilities()?;
        let lost = |source: std::io::Error| CoordinatorError::Lost { host: h.name.clone(), source: source.into() };
        client.stream().set_read_timeout(None).map_err(lost)?;
        let Some(mut reader) = client.reader.take() else {
            return Err(CoordinatorError::Agent { host: h.name.clone(), message: "no session reader".into() });
        };
        self.generation += 1;
        let (tx, generation) = (self.tx.clone(), self.generation);
        std::thread::Builder::new()
            .name(format!("leap-coord-{i}"))
            .spawn(move || {
                loop {
                    let msg = read_message::<Response>(&mut reader, MAX_RESPONSE);
                    let end = msg.is_err();
                    if tx.send((i, generation, msg)).is_err() || end {
                        return;
                    }
                }
            })
            .map_err(lost)?;
        self.conns[i] = Some(Conn { client, generation });
        Ok(caps)
    }

    fn name(&self, i: usize) -> String {
        self.hosts[i].name.clone()
    }

    /// Sends `req` to host `i`; a failure marks it lost.
    fn send(&mut self, i: usize, req: &Request) -> Result<(), CoordinatorError> {
        let res = match &mut self.conns[i] {
            Some(c) => c.client.send(req),
            None => Err(CoordinatorError::Agent { host: self.name(i), message: "not connected".into() }),
        };
        if res.is_err() {
            self.conns[i] = None;
        }
        res
    }

    /// The next event of a current connection, until `deadline`.
    fn next_event(&mut self, deadline: Instant) -> Option<(usize, Result<Response, ProtocolError>)> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (i, generation, msg) = self.rx.recv_timeout(left).ok()?;
            if self.conns[i].as_ref().is_some_and(|c| c.generation == generation) {
                if msg.is_err() {
                    self.conns[i] = None;
                }
                return Some((i, msg));
            }
        }
    }

    /// Stops the members of `active` hosts and waits until each reported
    /// its end (its transport closed), or its connection is gone.
    fn abort(&mut self, active: &mut [bool], setup_timeout: Duration) {
        for (i, a) in active.iter_mut().enumerate() {
            if *a && self.send(i, &Request::Stop).is_err() {
                *a = false;
            }
        }
        let deadline = Instant::now() + setup_timeout + ABORT_TIMEOUT;
        while active.iter().any(|a| *a) {
            let Some((i, msg)) = self.next_event(deadline) else {
                log::warn!("hosts {:?} did not confirm the abort in time", self.names(active));
                break;
            };
            if !matches!(msg, Ok(Response::Opened)) {
                active[i] = false;
            }
        }
        // A host not heard from is disconnected: its agent aborts the run.
        for (i, a) in active.iter().enumerate() {
            if *a {
                self.conns[i] = None;
            }
        }
    }

    fn names(&self, which: &[bool]) -> Vec<String> {
        which.iter().enumerate().filter(|(_, a)| **a).map(|(i, _)| self.name(i)).collect()
    }

    fn spec(&self, rc: &RingConfig, i: usize, run_key: &RingKey) -> MemberSpec {
        let n = self.hosts.len();
        let ms = |d: Duration| (d.as_millis() as u64).max(1);
        MemberSpec {
            transport: rc.transport,
            role: if i == 0 { Role::Head } else { Role::Worker },
            frame_size: rc.frame_size,
            frames: rc.frames,
            inflight: rc.inflight,
            workers: n - 1,
            listen: self.hosts[i].data,
            next: self.hosts[(i + 1) % n].data,
            prev: self.hosts[(i + n - 1) % n].data,
            members: self.hosts.iter().map(|h| h.data).collect(),
            iface: self.hosts[i].iface.clone(),
            crc: rc.options.crc,
            trains: rc.options.trains,
            gso: rc.options.gso,
            reliability: rc.options.reliability,
            xdp_mode: XdpMode::of(rc.options.xdp_mode),
            recv_timeout_ms: rc.options.recv_timeout.map_or(1000, ms),
            setup_timeout_ms: ms(rc.options.setup_timeout),
            stall_timeout_ms: ms(rc.stall_timeout),
            run_key: Some(run_key.clone()),
        }
    }

    /// Runs one ring across the hosts.
    ///
    /// # Errors
    ///
    /// [`CoordinatorError`] naming the host that failed; every other member
    /// is stopped and has cleaned up when this returns.
    pub fn run_ring(&mut self, rc: &RingConfig) -> Result<RingReport, CoordinatorError> {
        let n = self.hosts.len();
        for i in 0..n {
            if self.conns[i].is_none() {
                log::info!("reconnecting to host {}", self.name(i));
                self.caps[i] = self.open(i)?;
            }
        }
        while self.rx.try_recv().is_ok() {}
        let mut active = vec![false; n];
        // A fresh key per run, handed to each member inside its session.
        let run_key = RingKey::random().map_err(CoordinatorError::Random)?;
        // Workers first, so that they listen when the head connects.
        for i in (1..n).chain([0]) {
            let spec = self.spec(rc, i, &run_key);
            if let Err(e) = self.send(i, &Request::Open(Box::new(spec))) {
                self.abort(&mut active, rc.options.setup_timeout);
                return Err(e);
            }
            active[i] = true;
        }
        let mut opened = vec![false; n];
        let deadline = Instant::now() + rc.options.setup_timeout + Duration::from_secs(5);
        while opened.iter().any(|o| !o) {
            let failure = match self.next_event(deadline) {
                None => CoordinatorError::Timeout(format!(
                    "hosts {:?} did not open their {} transport in time",
                    self.names(&opened.iter().map(|o| !o).collect::<Vec<_>>()),
                    rc.transport
                )),
                Some((i, Ok(Response::Opened))) => {
                    opened[i] = true;
                    continue;
                }
                Some((_, Ok(Response::Stopped))) => continue,
                Some((i, msg)) => {
                    active[i] = false;
                    self.failure(i, msg)
                }
            };
            self.abort(&mut active, rc.options.setup_timeout);
            return Err(failure);
        }
        for i in (1..n).chain([0]) {
            if let Err(e) = self.send(i, &Request::Go) {
                active[i] = false;
                self.abort(&mut active, rc.options.setup_timeout);
                return Err(e);
            }
        }
        let deadline = Instant::now() + RUN_TIMEOUT;
        let head = loop {
            let failure = match self.next_event(deadline) {
                None => CoordinatorError::Timeout(format!("no report from the head {} in time", self.name(0))),
                Some((0, Ok(Response::Finished(r)))) => break *r,
                Some((_, Ok(Response::Stopped | Response::Opened))) => continue,
                Some((i, msg)) => {
                    active[i] = false;
                    self.failure(i, msg)
                }
            };
            self.abort(&mut active, rc.options.setup_timeout);
            return Err(failure);
        };
        active[0] = false;
        let mut reports: Vec<MemberReport> = vec![head];
        for (i, a) in active.iter_mut().enumerate().skip(1) {
            if self.send(i, &Request::Stop).is_err() {
                *a = false;
            }
        }
        let deadline = Instant::now() + rc.options.setup_timeout + ABORT_TIMEOUT;
        let mut failure = None;
        while active.iter().any(|a| *a) {
            match self.next_event(deadline) {
                None => {
                    failure = Some(CoordinatorError::Timeout(format!(
                        "hosts {:?} did not stop in time",
                        self.names(&active)
                    )));
                    self.abort(&mut active, rc.options.setup_timeout);
                }
                Some((i, Ok(Response::Finished(r)))) => {
                    active[i] = false;
                    reports.push(*r);
                }
                Some((_, Ok(Response::Stopped | Response::Opened))) => {}
                Some((i, msg)) => {
                    active[i] = false;
                    failure = failure.or(Some(self.failure(i, msg)));
                }
            }
        }
        if let Some(f) = failure {
            return Err(f);
        }
        let head = reports[0].head.clone().ok_or_else(|| CoordinatorError::Agent {
            host: self.name(0),
            message: "the head sent no measurements".into(),
        })?;
        let mut stats = Stats::default();
        let mut cpu = Duration::ZERO;
        let mut counters = Vec::new();
        for r in &reports {
            stats.add(&r.stats);
            cpu += Duration::from_secs_f64(r.cpu_s.max(0.0));
            counters.extend(r.backend);
        }
        Ok(assemble(rc, head, stats, &counters, cpu))
    }

    fn failure(&self, i: usize, msg: Result<Response, ProtocolError>) -> CoordinatorError {
        match msg {
            Err(source) => CoordinatorError::Lost { host: self.name(i), source },
            Ok(Response::Error { kind, message }) => {
                CoordinatorError::Agent { host: self.name(i), message: format!("{kind:?}: {message}") }
            }
            Ok(other) => {
                CoordinatorError::Agent { host: self.name(i), message: format!("unexpected answer {other:?}") }
            }
        }
    }
}

/// A host as the report lists it.
pub fn bench_host(
    name: &str,
    control: &dyn std::fmt::Display,
    data: &SocketAddr,
    iface: Option<&str>,
    caps: &HostCapabilities,
) -> BenchHost {
    BenchHost {
        name: name.into(),
        control: control.to_string(),
        data: data.to_string(),
        iface: iface.map(Into::into),
        capabilities: caps.clone(),
    }
}

/// Each host's kernel as the report names it (`SITE/NAME`).
pub fn kernels_across<'a>(
    site: &str,
    hosts: impl Iterator<Item = (&'a str, &'a HostCapabilities)>,
) -> Vec<(String, String)> {
    hosts.map(|(name, c)| (format!("{site}/{name}"), c.kernel.clone())).collect()
}

/// Why `kind` cannot run across `hosts` (name, interface, capabilities),
/// naming every host that lacks something.
pub fn unavailable_across<'a>(
    hosts: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a HostCapabilities)>,
    kind: TransportKind,
) -> Option<String> {
    let mut why = Vec::new();
    for (name, iface, c) in hosts {
        if let Some(w) = c.unavailable(kind) {
            why.push(format!("host {name}: {w}"));
        } else if matches!(kind, TransportKind::Xdp | TransportKind::XdpRingbuf) {
            match iface {
                None => why.push(format!("host {name}: no interface given (iface in the hosts file, or --ifaces)")),
                Some(i) if c.interface(i).is_none() => why.push(format!("host {name} has no interface {i}")),
                Some(_) => {}
            }
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

impl Rings for HostRings {
    fn kernels(&self) -> Vec<(String, String)> {
        kernels_across(&self.site, self.hosts.iter().map(|h| h.name.as_str()).zip(&self.caps))
    }

    fn unavailable(&self, kind: TransportKind) -> Option<String> {
        let hosts = self.hosts.iter().zip(&self.caps).map(|(h, c)| (h.name.as_str(), h.iface.as_deref(), c));
        unavailable_across(hosts, kind)
    }

    fn floor(&mut self, _nodes: usize, _rounds: usize) -> Result<FloorOutcome, String> {
        Ok(FloorOutcome::NotMeasurable(
            "the floor (a bare 64-byte UDP datagram per hop) is measured between namespaces of one host; \
             `leap serve` agents run only leap ring members, so across hosts compare with TCP instead"
                .into(),
        ))
    }

    fn run(&mut self, rc: &RingConfig) -> Result<RingReport, String> {
        self.run_ring(rc).map_err(|e| e.to_string())
    }

    fn hosts(&self) -> Vec<BenchHost> {
        self.hosts
            .iter()
            .zip(&self.caps)
            .map(|(h, c)| bench_host(&h.name, &h.control, &h.data, h.iface.as_deref(), c))
            .collect()
    }

    fn notes(&self) -> Vec<String> {
        vec![format!(
            "{}: one ring member per host ({}), the first the head; round trips are timed at the head alone \
             (sent and returned on its clock), so no clock synchronisation between the hosts is needed",
            self.site,
            self.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(" -> ")
        )]
    }
}
