//! `leap serve` agents in this process on loopback (no root): a ring across
//! three of them delivers every frame, a wrong token is refused and counted,
//! an agent that does not answer is named.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leap::ring::{Placement, RingConfig};
use leap::serve::agent::{AgentConfig, Limits, serve};
use leap::serve::coordinator::{Client, CoordinatorError, HostRings, HostSpec, HostsFile};
use leap::transport::open::TransportKind;

const TOKEN: &str = "loopback-token-0123456789";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Agents on loopback, stopped on drop.
struct Agents {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    hosts: Vec<HostSpec>,
}

impl Agents {
    fn start(n: usize) -> Self {
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
            });
            let cfg = AgentConfig { listen: control, token: TOKEN.into(), limits: Limits::default(), xdp_object: None };
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || serve(cfg, &stop).unwrap()));
        }
        for h in &hosts {
            let mut tries = 0;
            while Client::connect(&h.name, h.control, TOKEN).is_err() {
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
    let mut rc = RingConfig::new(kind, 3, 16_392, frames);
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

#[test]
fn wrong_token_is_refused_and_counted() {
    let a = Agents::start(1);
    let h = &a.hosts[0];
    match Client::connect("h0", h.control, "loopback-token-0123456780") {
        Err(CoordinatorError::Agent { message, .. }) => assert!(message.contains("Unauthenticated"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let (counters, running) = Client::connect("h0", h.control, TOKEN).unwrap().status().unwrap();
    assert_eq!((counters.unauthenticated, counters.runs_started, running), (1, 0, false));
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
}
