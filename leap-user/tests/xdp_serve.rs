//! `leap serve` with the XDP paths: three namespaces as hosts, agents
//! loading the BPF object; `leap bench --hosts` measures xdp and
//! xdp-ringbuf with every frame intact, and no program stays attached after
//! a run, nor on the surviving hosts when an agent is killed in the middle
//! of one. Needs root and the BPF object: `cargo xtask ci` (stage ebpf).
//!
//! The agents run with only the unit's capabilities (CAP_BPF, CAP_NET_ADMIN,
//! CAP_NET_RAW, + CAP_IPC_LOCK for its LimitMEMLOCK), as under
//! leap-serve.service: no CAP_PERFMON.

mod serve_common;
mod xdp_common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use leap::bench::BenchReport;
use leap::ring::{Placement, RingConfig};
use leap::transport::open::TransportKind;
use leap::transport::xdp::ObjectSource;
use serve_common::{Cluster, Coordinator, Privilege};
use xdp_common::xdp_attachment;

fn object_path() -> PathBuf {
    match xdp_common::object() {
        ObjectSource::File(p) => p,
        other => panic!("expected an object file, got {other:?}"),
    }
}

fn assert_detached(c: &Cluster, hosts: &[usize]) {
    for &i in hosts {
        let n = &c.topo.nodes()[i];
        assert_eq!(xdp_attachment(&n.netns, &n.rx_iface), None, "host {i}: XDP still attached to {}", n.rx_iface);
    }
}

#[test]
#[ignore = "needs root and the BPF object: run by cargo xtask ci (stage ebpf)"]
fn bench_across_agents_measures_both_xdp_paths_and_detaches() {
    let c = Cluster::new("xb", Some(&object_path()), Privilege::Unit);
    let out = c.dir.join("report");
    let (ok, err) = c.bench(
        &["--quick", "--sizes", "16392", "--transports", "xdp,xdp-ringbuf", "--out", out.to_str().unwrap()],
        Duration::from_secs(90),
    );
    assert!(ok, "leap bench --hosts failed: {err}\n{}", c.agent_log(0));
    let rep: BenchReport = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert!(rep.skipped.is_empty(), "{:?}", rep.skipped);
    for kind in ["xdp", "xdp-ringbuf"] {
        for mode in ["latency", "throughput"] {
            let r = rep.rows.iter().find(|r| r.transport == kind && r.mode == mode).expect("row");
            assert_eq!((r.frames_lost, r.frames_corrupt), (0, 0), "{kind} {mode}: every frame intact");
            assert!(r.rtt_us.p50 > 0.0 && r.gbit_per_s > 0.0, "{kind} {mode}");
        }
    }
    assert_detached(&c, &[0, 1, 2]);
}

#[test]
#[ignore = "needs root and the BPF object: run by cargo xtask ci (stage ebpf)"]
fn killed_agent_during_an_xdp_run_leaves_no_program_attached_on_the_others() {
    let mut c = Cluster::new("xk", Some(&object_path()), Privilege::Unit);
    let Coordinator { rings: to_coord, results, thread: coord } = c.coordinator();
    let ring = |frames| {
        let mut rc = RingConfig::new(TransportKind::Xdp, 3, 16_392, frames);
        rc.placement = Placement::Hosts;
        rc.control = false;
        rc.options.setup_timeout = Duration::from_secs(10);
        rc
    };
    to_coord.send(ring(1_000_000)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let n0 = c.topo.nodes()[0].clone();
    while xdp_attachment(&n0.netns, &n0.rx_iface).is_none() || !c.client(2).status().unwrap().1 {
        assert!(Instant::now() < deadline, "the XDP run did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(700));
    c.kill_agent(2);
    let e = results.recv_timeout(Duration::from_secs(30)).expect("reported in time").0.expect_err("fails");
    assert!(e.contains("h2") && e.contains("connection lost"), "{e}");
    for i in 0..2 {
        assert!(!c.client(i).status().unwrap().1, "host {i} still runs a member");
    }
    assert_detached(&c, &[0, 1]);
    c.start_agent(2);
    to_coord.send(ring(300)).unwrap();
    let r = results.recv_timeout(Duration::from_secs(30)).expect("in time").0.expect("the next run works");
    assert_eq!((r.frames_delivered, r.frames_corrupt), (300, 0));
    assert_detached(&c, &[0, 1, 2]);
    drop(to_coord);
    coord.join().unwrap();
}
