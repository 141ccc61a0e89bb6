//! `leap serve` agents in this process on loopback (no root): a ring across
//! three of them delivers every frame; the token never crosses the wire and
//! a wrong one learns nothing and starts nothing; each host may have its
//! own token; members cannot be aimed outside the run or the allow-list; a
//! flood of unauthenticated connections displaces no one; an agent that
//! does not answer is named.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leap::ring::{Placement, RingConfig};
use leap::serve::agent::{AgentConfig, Limits, serve};
use leap::serve::allow::AllowList;
use leap::serve::coordinator::{Client, CoordinatorError, HostRings, HostSpec, HostsFile};
use leap::serve::protocol::{self, ErrorKind, MemberSpec, Request, Response, Role, XdpMode};
use leap::serve::session::{self, SecureReader, SecureWriter};
use leap::transport::open::TransportKind;
use leap::transport::ring_key::RingKey;

const TOKEN: &str = "loopback-token-0123456789";

fn free_port() -> u16 {
    leap::netns::loopback_port().expect("a free loopback port")
}

/// Agents on loopback, stopped on drop.
struct Agents {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    hosts: Vec<HostSpec>,
}

impl Agents {
    fn start(n: usize) -> Self {
        Self::start_with(n, AllowList::loopback_only(), |_| TOKEN.into())
    }

    /// `n` agents with `allow`, agent `i` holding `token(i)`.
    fn start_with(n: usize, allow: AllowList, token: impl Fn(usize) -> String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut hosts = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n {
            let control: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            hosts.push(HostSpec {
                name: format!("h{i}"),
                control,
                data: ([127, 0, 0, 1], free_port()).into(),
                iface: None,
                token_file: None,
            });
            let cfg = AgentConfig {
                listen: control,
                token: token(i),
                limits: Limits::default(),
                xdp_object: None,
                allow: allow.clone(),
            };
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || serve(cfg, &stop).unwrap()));
        }
        for (i, h) in hosts.iter().enumerate() {
            let mut tries = 0;
            while Client::connect(&h.name, h.control, &token(i)).is_err() {
                tries += 1;
                assert!(tries < 100, "agent {} did not answer", h.name);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Self { stop, threads, hosts }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn ring(kind: TransportKind, frames: u64) -> RingConfig {
    ring_of(3, kind, frames)
}

fn ring_of(nodes: usize, kind: TransportKind, frames: u64) -> RingConfig {
    let mut rc = RingConfig::new(kind, nodes, 16_392, frames);
    rc.placement = Placement::Hosts;
    rc.control = false;
    rc.options.setup_timeout = Duration::from_secs(5);
    rc
}

#[test]
fn ring_across_loopback_agents_delivers_every_frame() {
    let a = Agents::start(3);
    let mut rings = HostRings::connect(a.hosts.clone(), TOKEN.into(), "lo").unwrap();
    for kind in [TransportKind::Tcp, TransportKind::Udp, TransportKind::Tcp] {
        let r = rings.run_ring(&ring(kind, 200)).unwrap();
        assert_eq!((r.frames_delivered, r.frames_corrupt, r.frames_lost), (200, 0, 0), "{kind}");
        assert!(r.rtt_us.p50 > 0.0 && r.cpu_us_per_frame > 0.0);
        assert_eq!(r.placement, Placement::Hosts);
    }
    let (counters, running) = Client::connect("h1", a.hosts[1].control, TOKEN).unwrap().status().unwrap();
    assert!(!running);
    assert_eq!(counters.runs_started, 3);
}

/// Reads what a peer sends until it closes, or `limit` passes.
fn read_all(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

#[test]
fn wrong_token_learns_nothing_and_starts_nothing() {
    let a = Agents::start(1);
    let h = &a.hosts[0];
    // A raw coordinator with the wrong token, which sends an `Open` right
    // after its handshake as if it had been accepted.
    let mut s = TcpStream::connect(h.control).unwrap();
    let (_, first) = session::Initiator::start("loopback-token-0123456780").unwrap();
    s.write_all(&first).unwrap();
    let spec = worker_spec([h.data, free_addr(), free_addr()], 1);
    let _ = s.write_all(&protocol::encode(&Request::Open(Box::new(spec))));
    let (got, closed) = read_all(&mut s, Duration::from_secs(3));
    assert!(closed, "the agent closes the connection");
    assert!(got.is_empty(), "not a byte back to a wrong token: {got:?}");
    match Client::connect("h0", h.control, "loopback-token-0123456780") {
        Err(CoordinatorError::Handshake { message, .. }) => assert!(message.contains("wrong token"), "{message}"),
        other => panic!("expected a refused handshake, got {other:?}"),
    }
    let (counters, running) = Client::connect("h0", h.control, TOKEN).unwrap().status().unwrap();
    assert_eq!((counters.unauthenticated, counters.runs_started, running), (2, 0, false), "{counters:?}");
    assert!(std::net::UdpSocket::bind(h.data).is_ok() && TcpListener::bind(h.data).is_ok(), "no member listens");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn base64(b: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = c.iter().enumerate().fold(0u32, |n, (i, x)| n | (u32::from(*x) << (16 - 8 * i)));
        for i in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn coordinator_first_bytes_reveal_nothing_of_the_token() {
    // Whoever answers on the agent's port (a local user who bound it while
    // the agent was down, a machine in the middle) records what comes.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let recorder = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        let (mut got, _) = read_all(&mut s, Duration::from_millis(1500));
        // Answer like an agent of before would, and read what follows too.
        let _ = s.write_all(&protocol::encode(&Response::Status { counters: Default::default(), running: false }));
        got.extend(read_all(&mut s, Duration::from_millis(500)).0);
        got
    });
    let r = Client::connect("fake", addr, TOKEN);
    let got = recorder.join().unwrap();
    assert!(r.is_err(), "a fake agent is not accepted: {r:?}");
    assert!(!got.is_empty(), "the coordinator sent its first message");
    let t = TOKEN.as_bytes();
    let psk = session::psk(TOKEN);
    let upper = TOKEN.to_uppercase();
    for (what, needle) in [
        ("the token", t.to_vec()),
        ("the token, upper case", upper.as_bytes().to_vec()),
        ("the token in hex", hex(t).into_bytes()),
        ("the token in base64", base64(t).into_bytes()),
        ("the pre-shared key", psk.to_vec()),
        ("the pre-shared key in hex", hex(&psk).into_bytes()),
    ] {
        assert!(!contains(&got, &needle), "{what} is in the coordinator's bytes: {got:?}");
    }
    for w in t.windows(6) {
        assert!(!contains(&got, w), "a piece of the token ({:?}) is in the coordinator's bytes", w);
    }
    assert!(!String::from_utf8_lossy(&got).contains("token"), "no token field either: {got:?}");
}

#[test]
fn each_host_may_have_its_own_token() {
    let other = "loopback-token-of-host-one";
    let a = Agents::start_with(2, AllowList::loopback_only(), |i| if i == 1 { other.into() } else { TOKEN.into() });
    let dir = TempDir::new("own-token");
    let f = dir.file("h1.token", other);
    let mut hosts = a.hosts.clone();
    // With the common token alone, host 1 refuses.
    match HostRings::connect(hosts.clone(), TOKEN.into(), "lo") {
        Err(CoordinatorError::Handshake { host, .. }) => assert_eq!(host, "h1"),
        other => panic!("expected h1 to refuse the common token, got {other:?}"),
    }
    hosts[1].token_file = Some(f);
    let mut rings = HostRings::connect(hosts, TOKEN.into(), "lo").unwrap();
    let r = rings.run_ring(&ring_of(2, TransportKind::Tcp, 100)).unwrap();
    assert_eq!((r.frames_delivered, r.frames_lost), (100, 0));
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("leap-serve-lo-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    /// A token file of mode 0600.
    fn file(&self, name: &str, token: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.0.join(name);
        std::fs::write(&p, format!("{token}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_addr() -> SocketAddr {
    ([127, 0, 0, 1], free_port()).into()
}

/// A TCP worker at `members[at]` of a run of `members` (the head first).
fn worker_spec<const N: usize>(members: [SocketAddr; N], at: usize) -> MemberSpec {
    MemberSpec {
        transport: TransportKind::Tcp,
        role: if at == 0 { Role::Head } else { Role::Worker },
        frame_size: 16_392,
        frames: 10,
        inflight: 1,
        workers: N - 1,
        listen: members[at],
        next: members[(at + 1) % N],
        prev: members[(at + N - 1) % N],
        members: members.to_vec(),
        iface: None,
        crc: true,
        trains: true,
        gso: true,
        reliability: Default::default(),
        xdp_mode: XdpMode::Auto,
        recv_timeout_ms: 1000,
        setup_timeout_ms: 3000,
        stall_timeout_ms: 3000,
        run_key: Some(RingKey::from_bytes([9; 32])),
    }
}

fn refusal(c: &mut Client, spec: MemberSpec) -> String {
    match c.call(&Request::Open(Box::new(spec))).unwrap() {
        Response::Error { kind: ErrorKind::BadRequest, message } => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn member_aimed_at_loopback_outside_the_run_or_a_disallowed_interface_is_refused() {
    // The default allow-list of an agent listening on loopback: no loopback.
    let control: SocketAddr = free_addr();
    let a = Agents::start_with(1, AllowList::for_listen(control), |_| TOKEN.into());
    let mut c = Client::connect("h0", a.hosts[0].control, TOKEN).unwrap();
    let me = a.hosts[0].data;
    let redis: SocketAddr = "127.0.0.1:6379".parse().unwrap();
    let e = refusal(&mut c, worker_spec([free_addr(), me, redis], 1));
    assert!(e.contains("loopback address") && e.contains("loopback = true"), "{e}");
    assert_eq!(c.status().unwrap().0.runs_started, 0);
    drop((c, a));

    // Loopback allowed, ports 20000..=20100 and interface `lo` only.
    let mut allow = AllowList::loopback_only();
    allow.ports = vec![(20_000, 20_100)];
    let a = Agents::start_with(1, allow, |_| TOKEN.into());
    let mut c = Client::connect("h0", a.hosts[0].control, TOKEN).unwrap();
    let at = |p: u16| -> SocketAddr { ([127, 0, 0, 1], p).into() };
    let run = [at(20_001), at(20_002), at(20_003)];
    // Next outside the run: the spec's members say who is in it.
    let mut spec = worker_spec(run, 1);
    spec.next = redis;
    let e = refusal(&mut c, spec);
    assert!(e.starts_with("next 127.0.0.1:6379 is not the member after"), "{e}");
    // A "member" on a port outside the allow-list.
    let e = refusal(&mut c, worker_spec([at(20_001), at(20_002), redis], 1));
    assert!(e.contains("port 6379 is outside the agent's allowed ports"), "{e}");
    // A host outside the allowed networks.
    let e = refusal(&mut c, worker_spec([at(20_001), at(20_002), "10.1.2.3:20003".parse().unwrap()], 1));
    assert!(e.contains("10.1.2.3:20003 is outside the agent's allowed networks"), "{e}");
    // An interface not allowed (the management NIC, say).
    let mut spec = worker_spec(run, 1);
    spec.iface = Some("eth0".into());
    let e = refusal(&mut c, spec);
    assert!(e.starts_with("iface eth0 is not an interface this agent may use"), "{e}");
    // The agent's own control port.
    let e = refusal(&mut c, worker_spec([at(20_001), at(20_002), a.hosts[0].control], 1));
    assert!(e.contains("outside the agent's allowed ports") || e.contains("own control address"), "{e}");
    let (counters, running) = c.status().unwrap();
    assert_eq!((counters.runs_started, counters.bad_requests, running), (0, 5, false), "{counters:?}");
}

#[test]
fn tcp_member_forwards_nothing_but_to_members_that_prove_the_run_key() {
    let a = Agents::start(1);
    let mut c = Client::connect("h0", a.hosts[0].control, TOKEN).unwrap();
    // A "service" that is not a leap member: the worker must never connect.
    let service = TcpListener::bind("127.0.0.1:0").unwrap();
    service.set_nonblocking(true).unwrap();
    let mut spec = worker_spec([free_addr(), a.hosts[0].data, free_addr()], 1);
    spec.next = service.local_addr().unwrap();
    let e = refusal(&mut c, spec);
    assert!(e.starts_with("next"), "{e}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(service.accept().is_err(), "a refused member connected to the service");
    // Without the run's key a TCP member is refused outright.
    let mut spec = worker_spec([free_addr(), a.hosts[0].data, free_addr()], 1);
    spec.run_key = None;
    assert!(refusal(&mut c, spec).starts_with("run_key"));

    // A token holder names a plain service as the next member of a run,
    // and plays the previous member with raw bytes: the service gets the
    // 57-byte keyed hello and nothing else, a stranger and the raw bytes
    // are refused, and the member fails naming the ring key.
    let next = TcpListener::bind("127.0.0.1:0").unwrap();
    let prev_addr = free_addr();
    let spec = worker_spec([prev_addr, a.hosts[0].data, next.local_addr().unwrap()], 1);
    let worker = spec.listen;
    c.send(&Request::Open(Box::new(spec))).unwrap();
    let (mut to_next, _) = next.accept().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    // First a stranger (another loopback address than the previous
    // member's), with a well-formed frame: refused, nothing forwarded.
    let mut stranger = loop {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from(([127, 0, 0, 5], 0)).into()).unwrap();
        if sock.connect(&worker.into()).is_ok() {
            break TcpStream::from(sock);
        }
        assert!(Instant::now() < deadline, "the worker did not listen");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut frame = (16_392u32).to_le_bytes().to_vec();
    frame.push(0);
    frame.extend(vec![b'x'; 16_392]);
    let _ = stranger.write_all(&frame);
    let (_, closed) = read_all(&mut stranger, Duration::from_secs(3));
    assert!(closed, "the worker closes a connection from outside the run");
    // The previous member's address, but raw bytes instead of the proof.
    let mut raw = TcpStream::connect(worker).unwrap();
    let payload: Vec<u8> = b"SET key value\r\n".iter().copied().cycle().take(16_392 * 2).collect();
    let _ = raw.write_all(&payload);
    // Then a previous member that proves the key and sends a good frame:
    // the worker takes it, but never opens towards a next that proves
    // nothing, so the frame goes nowhere (without keys it went on to the
    // service).
    let mut from_prev = TcpStream::connect(worker).unwrap();
    let key = RingKey::from_bytes([9; 32]);
    let keys = leap::transport::ring_key::KeySet::proof_only(key);
    leap::transport::ring_key::prove_connecting(&mut from_prev, &keys, Duration::from_secs(3)).unwrap();
    from_prev.write_all(&frame).unwrap();
    let (got, _) = read_all(&mut to_next, Duration::from_secs(4));
    assert_eq!(got.len(), 57, "the service got {} bytes, not just the keyed hello", got.len());
    assert_eq!(&got[..8], b"LEAPKEY2");
    match c.recv().unwrap() {
        Response::Error { kind: ErrorKind::MemberFailed, message } => {
            assert!(message.contains("ring key"), "{message}");
        }
        other => panic!("expected the member to fail, got {other:?}"),
    }
    drop((raw, from_prev, to_next));
}

#[test]
fn five_hundred_unauthenticated_connections_displace_no_one_and_do_not_stop_a_run() {
    let a = Agents::start(3);
    let mut rings = HostRings::connect(a.hosts.clone(), TOKEN.into(), "lo").unwrap();
    let run = std::thread::spawn(move || rings.run_ring(&ring(TransportKind::Tcp, 150_000)));
    let head = a.hosts[0].control;
    // A coordinator that has connected but not yet sent its handshake.
    let mut slow = TcpStream::connect(head).unwrap();
    let started = Instant::now();
    let mut flood = Vec::new();
    let (_, wrong_first) = session::Initiator::start("not-the-token-0123456789").unwrap();
    for i in 0..500 {
        let Ok(mut s) = TcpStream::connect_timeout(&head, Duration::from_secs(1)) else { continue };
        match i % 3 {
            0 => {}
            1 => {
                let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
            }
            _ => {
                let _ = s.write_all(&wrong_first);
            }
        }
        flood.push(s);
    }
    assert!(started.elapsed() < Duration::from_secs(20), "the flood took {:?}", started.elapsed());
    eprintln!("the flood took {:?}", started.elapsed());
    // The slow coordinator completes its handshake: it was not displaced.
    let (sealer, opener) = session::initiate(&mut slow, TOKEN).expect("the pending handshake completes");
    let mut w = SecureWriter::new(slow.try_clone().unwrap(), sealer);
    let mut r = SecureReader::new(slow, opener);
    protocol::write_message(&mut w, &Request::Status).unwrap();
    let resp: Response = protocol::read_message(&mut r, protocol::MAX_RESPONSE).unwrap();
    let Response::Status { counters, running } = resp else { panic!("{resp:?}") };
    assert!(running, "the run goes on during the flood");
    assert!(counters.refused_connections >= 400, "{counters:?}");
    let report = run.join().unwrap().expect("the run survives the flood");
    assert_eq!((report.frames_delivered, report.frames_lost, report.frames_corrupt), (150_000, 0, 0));
    drop(flood);
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn unreachable_agent_is_named() {
    let a = Agents::start(2);
    let mut hosts = a.hosts.clone();
    // A third "host" whose agent is not there.
    hosts.push(HostSpec {
        name: "gone".into(),
        control: ([127, 0, 0, 1], free_port()).into(),
        data: ([127, 0, 0, 1], free_port()).into(),
        iface: None,
        token_file: None,
    });
    match HostRings::connect(hosts, TOKEN.into(), "lo") {
        Err(CoordinatorError::Connect { host, .. }) => assert_eq!(host, "gone"),
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[test]
fn hosts_example_file_parses() {
    let text = include_str!("../packaging/hosts.example.toml");
    let f: HostsFile = toml::from_str(text).unwrap();
    assert_eq!(f.hosts.len(), 3);
    assert_eq!(f.hosts[0].iface.as_deref(), Some("eth1"));
    assert_eq!(
        (f.hosts[0].token_file.as_ref(), f.hosts[2].token_file.as_deref()),
        (None, Some("/etc/leap/serve-c.token".as_ref()))
    );
    let serve: leap::serve::allow::ServeFile = toml::from_str(include_str!("../packaging/serve.example.toml")).unwrap();
    let allow = AllowList::from_config(&serve.allow, "10.0.0.1:7700".parse().unwrap()).unwrap();
    assert_eq!((allow.interfaces, allow.ports, allow.loopback), (vec!["eth1".to_string()], vec![(9999, 9999)], false));
}
