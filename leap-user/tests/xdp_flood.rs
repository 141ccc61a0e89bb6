//! The hostile-input flood on the host: 100 000 random and malformed LEAP
//! packets (bad lengths, ids, totals, sources, oversize ones fragmented on
//! the 1500-byte veth) at a node whose XDP program is attached, then a
//! normal ring run through that same node: every frame intact, the
//! program's counters show what it dropped, the node survives.

mod xdp_common;

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use leap::netns::Topology;
use leap::transport::xdp::ObjectSource;
use support::{Reaper, wait_bounded};

fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_leap")]).args(args);
    c
}

#[test]
#[ignore = "needs root, BPF and the XDP object: run by cargo xtask ci (stage ebpf)"]
fn flood_of_malformed_packets_is_dropped_and_the_ring_stays_intact() {
    let ObjectSource::File(object) = xdp_common::object() else { panic!("tests load the object from a file") };
    let topo = Topology::ring(&format!("lq{}", std::process::id() % 10_000), 3).unwrap();
    let n = topo.nodes();
    let addr = |i: usize| format!("{}:9999", n[i % 3].addr);
    let sock = std::env::temp_dir().join(format!("leap-flood-{}.sock", std::process::id()));
    let obj = object.to_string_lossy().into_owned();
    let node = |i: usize, extra: &[&str]| {
        let mut args = vec!["node", "--transport", "xdp", "--xdp-object", &obj, "--iface", &n[i].rx_iface];
        let (l, nx, p) = (addr(i), addr(i + 1), addr(i + 2));
        args.extend(["--listen", &l, "--next", &nx, "--prev", &p]);
        args.extend(extra);
        in_ns(&n[i].netns, &args).stdout(Stdio::piped()).spawn().unwrap()
    };
    let sock_s = sock.to_string_lossy().into_owned();
    let mut reaper = Reaper(Vec::new());
    let mut w1 = node(1, &["--role", "worker", "--stats-socket", &sock_s]);
    reaper.0.push(w1.id());
    std::thread::sleep(Duration::from_millis(800));
    // From strangers' ports (wrong source), then from the previous node's
    // own address and port (past the filter, into the parser).
    let target = addr(1);
    for bind in [format!("{}:0", n[0].addr), addr(0)] {
        let out =
            in_ns(&n[0].netns, &["flood", "--target", &target, "--count", "50000", "--bind", &bind]).output().unwrap();
        assert!(out.status.success(), "flood: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(w1.try_wait().unwrap().is_none(), "the node died under the flood");
    let stats =
        Command::new(env!("CARGO_BIN_EXE_leap")).args(["stats", "--json", "--socket", &sock_s]).output().unwrap();
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let xdp = &v["backend"];
    let get = |k: &str| xdp[k].as_u64().unwrap_or(0);
    assert!(get("malformed") > 10_000, "program counters after the flood: {xdp}");
    // Of the strangers' packets, those that look like LEAP chunks.
    assert!(get("wrong_source") > 10_000, "program counters after the flood: {xdp}");
    // A normal run through the flooded node.
    let mut w2 = node(2, &["--role", "worker"]);
    reaper.0.push(w2.id());
    std::thread::sleep(Duration::from_millis(800));
    let mut head = node(0, &["--role", "head", "--frames", "500", "--json"]);
    reaper.0.push(head.id());
    let status = wait_bounded(&mut head, Duration::from_secs(60));
    let out = std::io::read_to_string(head.stdout.take().unwrap()).unwrap();
    assert!(status.success(), "head: {out}");
    let r: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!((r["frames_delivered"].as_u64(), r["frames_corrupt"].as_u64()), (Some(500), Some(0)), "{r}");
    for w in [&mut w1, &mut w2] {
        // kill(2) on our own child (ip netns exec execs leap).
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(w.id() as i32), nix::sys::signal::Signal::SIGTERM);
        assert!(wait_bounded(w, Duration::from_secs(10)).success());
    }
    for nd in n {
        assert_eq!(xdp_common::xdp_attachment(&nd.netns, &nd.rx_iface), None);
    }
}
