//! `leap serve` on three "hosts" (network namespaces, each agent the real
//! binary on its own address) and `leap bench --hosts` from one of them:
//! the report has the local report's fields and every frame intact; a
//! killed agent is reported and the others clean up; wrong tokens, garbage,
//! coordinators of before the handshake and idle connections are refused,
//! counted, and start nothing; members aimed at loopback, outside the run or
//! at an interface not allowed are refused. The agents run with the packaged unit's capabilities only.
//! Needs root: `cargo xtask ci` (stage privileged).

mod serve_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leap::bench::BenchReport;
use leap::ring::{Placement, RingConfig};
use leap::serve::coordinator::Client;
use leap::serve::protocol::{self, ErrorKind, MAX_REQUEST, Request, Response};
use leap::serve::session;
use leap::transport::open::TransportKind;
use serve_common::{Cluster, Coordinator, DATA_PORT, Privilege};

fn ring(kind: TransportKind, frames: u64) -> RingConfig {
    let mut rc = RingConfig::new(kind, 3, 16_392, frames);
    rc.placement = Placement::Hosts;
    rc.control = false;
    rc.options.setup_timeout = Duration::from_secs(10);
    rc
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn bench_across_three_agents_reports_like_the_local_bench() {
    let c = Cluster::new("sb", None, Privilege::Unit);
    let out = c.dir.join("report");
    let (ok, err) = c.bench(
        &["--quick", "--sizes", "16392", "--transports", "tcp,udp", "--out", out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(ok, "leap bench --hosts failed: {err}\n{}", c.agent_log(0));
    let json = std::fs::read_to_string(out.join("report.json")).unwrap();
    let rep: BenchReport = serde_json::from_str(&json).expect("the local report's fields");
    assert_eq!(rep.placement, "hosts");
    assert_eq!(rep.nodes, 3);
    for kind in ["tcp", "udp"] {
        for mode in ["latency", "throughput"] {
            let r = rep.rows.iter().find(|r| r.transport == kind && r.mode == mode).unwrap_or_else(|| {
                panic!("no {kind} {mode} row: {json}");
            });
            assert_eq!((r.frames_lost, r.frames_corrupt), (0, 0), "{kind} {mode}: every frame intact");
            assert!(r.rtt_us.p50 > 0.0 && r.rtt_us.p99 >= r.rtt_us.p50, "{kind} {mode}: {:?}", r.rtt_us);
            assert!(r.gbit_per_s > 0.0 && r.round_trips_per_s > 0.0 && r.cpu_us_per_frame > 0.0);
        }
    }
    // The same fields, key for key, as a row of the local bench.
    let row = serde_json::to_value(&rep.rows[0]).unwrap();
    let raw: serde_json::Value = serde_json::from_str(&json).unwrap();
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&raw["rows"][0]), keys(&row));
    assert_eq!(rep.hosts.len(), 3);
    assert!(rep.hosts.iter().all(|h| h.capabilities.unavailable(TransportKind::Tcp).is_none()));
    assert_eq!(rep.kernels.len(), 3);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("no clock synchronisation"), "{md}");
    assert!(md.contains("no floor"), "the report says the floor was not measured: {md}");
    assert!(md.contains("## Hosts"));
    assert!(std::fs::metadata(out.join("report.svg")).unwrap().len() > 0);
    for i in 0..3 {
        assert!(!c.port_bound(i, DATA_PORT), "host {i} left a socket on the data port");
    }
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn killed_agent_is_reported_the_others_clean_up_and_the_next_run_works() {
    let mut c = Cluster::new("sk", None, Privilege::Unit);
    let Coordinator { rings: to_coord, results, thread: coord } = c.coordinator();
    // Long enough to be killed in the middle (minutes if left alone).
    to_coord.send(ring(TransportKind::Udp, 1_000_000)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.client(2).status().unwrap().1 {
        assert!(Instant::now() < deadline, "the run did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    c.kill_agent(2);
    let (r, took) = results.recv_timeout(Duration::from_secs(30)).expect("the coordinator reports in time");
    let e = r.expect_err("a run with a killed agent fails");
    assert!(e.contains("h2") && e.contains("connection lost"), "names the host and what happened: {e}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    for i in 0..2 {
        let (counters, running) = c.client(i).status().unwrap();
        assert!(!running, "host {i} still runs a member");
        assert_eq!(counters.runs_started, 1, "host {i}: {counters:?}");
        assert!(!c.port_bound(i, DATA_PORT), "host {i} left a socket on the data port");
    }
    c.start_agent(2);
    for kind in [TransportKind::Udp, TransportKind::Tcp] {
        to_coord.send(ring(kind, 300)).unwrap();
        let (r, _) = results.recv_timeout(Duration::from_secs(30)).expect("the next run ends in time");
        let r = r.unwrap_or_else(|e| panic!("{kind} after the restart: {e}"));
        assert_eq!((r.frames_delivered, r.frames_corrupt, r.frames_lost), (300, 0, 0), "{kind}");
    }
    drop(to_coord);
    coord.join().unwrap();
}

/// One raw exchange: sends `bytes`, reads the answer (if any) until the
/// agent closes.
fn raw(c: &Cluster, bytes: Vec<u8>) -> Option<Response> {
    let addr = c.control(0);
    c.in_ns(0, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(&bytes);
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        (buf.len() >= protocol::HEADER_LEN).then(|| protocol::read_message(&mut &buf[..], 1 << 20).unwrap())
    })
}

fn kind(r: Option<Response>) -> ErrorKind {
    match r {
        Some(Response::Error { kind, .. }) => kind,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn bad_requests_and_idle_connections_are_refused_counted_and_start_nothing() {
    let c = Cluster::new("sr", None, Privilege::Unit);
    let before = c.client(0).status().unwrap().0;
    // A wrong token: closed without a byte back.
    let (_, wrong) = session::Initiator::start("test-token-0123456789abcdeX").unwrap();
    assert_eq!(raw(&c, wrong), None);
    // Messages in clear (a coordinator of before the handshake): told to
    // upgrade, and nothing else.
    let mut open_first = protocol::encode(&Request::Status);
    open_first.extend(protocol::encode(&Request::Go));
    assert_eq!(kind(raw(&c, open_first)), ErrorKind::Unauthenticated);
    assert_eq!(raw(&c, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()), None);
    let mut not_json = protocol::MAGIC.to_vec();
    not_json.extend(5u32.to_be_bytes());
    not_json.extend(b"hello");
    assert_eq!(kind(raw(&c, not_json)), ErrorKind::Unauthenticated);
    let mut huge = protocol::MAGIC.to_vec();
    huge.extend((MAX_REQUEST as u32 * 64).to_be_bytes());
    huge.extend(vec![b'{'; 64 * 1024]);
    assert_eq!(kind(raw(&c, huge)), ErrorKind::Unauthenticated);
    // Authenticated, but out of bounds or out of order: refused, nothing runs.
    let mut cl = c.client(0);
    let mut spec_json = serde_json::json!({"type": "open", "transport": "udp", "role": "head", "frame_size": 16392,
        "frames": 100, "inflight": 1, "workers": 2, "listen": "10.77.0.1:22", "next": "10.77.0.2:9999",
        "prev": "10.77.0.3:9999", "members": ["10.77.0.1:22", "10.77.0.2:9999", "10.77.0.3:9999"], "iface": null, "crc": true, "gso": true, "reliability": "reliable",
        "xdp_mode": "auto", "recv_timeout_ms": 1000, "setup_timeout_ms": 1000, "stall_timeout_ms": 1000});
    let bad: Request = serde_json::from_value(spec_json.clone()).unwrap();
    assert!(matches!(cl.call(&bad).unwrap(), Response::Error { kind: ErrorKind::BadRequest, .. }));
    spec_json["command"] = "sh -c reboot".into();
    assert!(serde_json::from_value::<Request>(spec_json).is_err(), "no field beyond the fixed set");
    assert!(matches!(cl.call(&Request::Go).unwrap(), Response::Error { kind: ErrorKind::InvalidState, .. }));
    // Aimed outside the run, at loopback, or at an interface the agent's
    // config does not allow (its tx veth, standing in for a management NIC).
    let n = &c.topo.nodes()[0];
    // TCP members need the run's ring key (any 32 bytes here).
    const RUN_KEY: [u8; 32] = [7; 32];
    let members: Vec<String> = c.hosts().iter().map(|h| h.data.to_string()).collect();
    let mut good = serde_json::json!({"type": "open", "transport": "tcp", "role": "head", "frame_size": 16392,
        "frames": 100, "inflight": 1, "workers": 2, "listen": members[0], "next": members[1],
        "prev": members[2], "members": members, "iface": n.rx_iface, "crc": true, "gso": true,
        "reliability": "reliable", "xdp_mode": "auto", "recv_timeout_ms": 1000, "setup_timeout_ms": 1000,
        "stall_timeout_ms": 1000, "run_key": RUN_KEY});
    let refused = |cl: &mut Client, v: &serde_json::Value| match cl.call(&serde_json::from_value(v.clone()).unwrap()) {
        Ok(Response::Error { kind: ErrorKind::BadRequest, message }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut v = good.clone();
    v["next"] = "10.77.0.9:9999".into();
    assert!(refused(&mut cl, &v).starts_with("next 10.77.0.9:9999 is not the member after"));
    let mut v = good.clone();
    v["members"][1] = "127.0.0.1:9999".into();
    v["next"] = "127.0.0.1:9999".into();
    assert!(refused(&mut cl, &v).contains("loopback = true"));
    let mut v = good.clone();
    v["members"][1] = "10.77.0.9:9999".into();
    v["next"] = "10.77.0.9:9999".into();
    assert!(refused(&mut cl, &v).contains("outside the agent's allowed networks"));
    good["iface"] = n.tx_iface.clone().into();
    let e = refused(&mut cl, &good);
    assert!(e.starts_with(&format!("iface {} is not an interface this agent may use", n.tx_iface)), "{e}");
    // An authenticated session keeps working through 200 idle connections,
    // which are refused beyond the pending bound and displace no one.
    let addr = c.control(0);
    let idle: Vec<TcpStream> = c.in_ns(0, move || {
        (0..200).filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()).collect()
    });
    assert_eq!(idle.len(), 200);
    std::thread::sleep(Duration::from_millis(300));
    let (after, running) = cl.status().expect("an authenticated coordinator keeps its session during the flood");
    drop(cl);
    drop(idle);
    // Once they are gone, a new coordinator gets in.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.in_ns(0, move || Client::connect("h0", addr, serve_common::TOKEN).is_err()) {
        assert!(Instant::now() < deadline, "no coordinator got in after the idle connections closed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!running);
    assert_eq!(after.unauthenticated - before.unauthenticated, 1, "{after:?}");
    assert_eq!(after.bad_requests - before.bad_requests, 9, "{after:?}");
    assert!(after.refused_connections - before.refused_connections >= 160, "{after:?}");
    assert_eq!(after.runs_started, 0, "nothing started: {after:?}");
    for i in 0..3 {
        assert!(!c.port_bound(i, DATA_PORT));
    }
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn coordinator_killed_mid_run_aborts_the_run_on_every_agent() {
    let c = Cluster::new("sc", None, Privilege::Unit);
    // Large frames, many repeats: minutes if left alone. A TCP member whose
    // neighbour went away tries to reconnect for its setup timeout before it
    // sees the stop: keep that short.
    let mut bench =
        c.spawn_bench(&["--sizes", "1048584", "--transports", "tcp", "--repeat", "50", "--setup-timeout-s", "3"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(0..3).all(|i| c.client(i).status().unwrap().1) {
        assert!(Instant::now() < deadline, "the run did not start: {}", c.agent_log(0));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    bench.kill().unwrap();
    bench.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    for i in 0..3 {
        loop {
            let (counters, running) = c.client(i).status().unwrap();
            if !running && counters.runs_aborted == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "host {i} did not abort: {counters:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!c.port_bound(i, DATA_PORT), "host {i} left a socket on the data port");
    }
}
