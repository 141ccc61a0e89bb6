//! The XDP paths with exactly the capabilities the packaged unit grants
//! (`leap-user/packaging/leap-node@.service`: CAP_BPF, CAP_NET_ADMIN,
//! CAP_NET_RAW, no CAP_PERFMON), not as root: `leap node --check` loads
//! the program under those capabilities and says whether the kernel takes
//! it, and 3-node rings over `xdp` and `xdp-ringbuf` run with them.
//! `+ipc_lock` stands in for the unit's `LimitMEMLOCK=infinity` (a process
//! without CAP_SYS_RESOURCE cannot raise its memlock limit, and these test
//! machines start with a small one).

mod xdp_common;

mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use leap::netns::Topology;
use leap::transport::xdp::ObjectSource;
use support::{Reaper, wait_bounded};

/// The unit's capabilities (plus the memlock stand-in): no CAP_PERFMON,
/// whose absence makes the verifier refuse packet-pointer arithmetic.
const UNIT_CAPS: &str = "+bpf,+net_admin,+net_raw,+ipc_lock";
/// The unit's capabilities without CAP_BPF: `--check` must say xdp is
/// unavailable, or it proves nothing.
const WITHOUT_BPF: &str = "+net_admin,+net_raw,+ipc_lock";

/// `leap ARGS` in namespace `ns`, holding exactly `caps`.
fn leap_with(ns: &str, caps: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "setpriv"])
        .arg(format!("--bounding-set=-all,{caps}"))
        .arg(format!("--inh-caps=-all,{caps}"))
        .arg(format!("--ambient-caps=-all,{caps}"))
        .args(["--", env!("CARGO_BIN_EXE_leap")])
        .args(args);
    c
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
#[ignore = "needs root, BPF and the XDP object: run by cargo xtask ci (stage ebpf)"]
fn xdp_rings_run_with_exactly_the_units_capabilities() {
    let ObjectSource::File(object) = xdp_common::object() else { panic!("tests load the object from a file") };
    let obj = object.to_string_lossy().into_owned();
    let topo = Topology::ring(&xdp_common::unique("lpv"), 3).unwrap();
    let n = topo.nodes();
    let addr = |i: usize| format!("{}:9999", n[i % 3].addr);
    let node_args = |i: usize, transport: &'static str| -> Vec<String> {
        let mut a: Vec<String> = ["node", "--transport", transport, "--xdp-object", &obj, "--iface", &n[i].rx_iface]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--listen".into(), addr(i), "--next".into(), addr(i + 1), "--prev".into(), addr(i + 2)]);
        a
    };
    // --check proves it with the kernel: the verifier takes the program
    // with the unit's capabilities, CAP_PERFMON not among them; without
    // CAP_BPF it says xdp is unavailable.
    let check = |caps: &str| {
        let mut a = node_args(1, "xdp");
        a.extend(["--role".into(), "worker".into(), "--check".into()]);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        leap_with(&n[1].netns, caps, &a).output().unwrap()
    };
    let without = check(WITHOUT_BPF);
    assert!(!without.status.success(), "--check passed without CAP_BPF: {}", text(&without));
    assert!(text(&without).contains("xdp: unavailable (xdp needs CAP_BPF"), "{}", text(&without));
    let with = check(UNIT_CAPS);
    assert!(with.status.success() && text(&with).contains("xdp: ok"), "{}", text(&with));

    for transport in ["xdp", "xdp-ringbuf"] {
        let mut reaper = Reaper(Vec::new());
        let mut workers = Vec::new();
        for i in [1, 2] {
            let mut a = node_args(i, transport);
            a.extend(["--role".into(), "worker".into()]);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let w = leap_with(&n[i].netns, UNIT_CAPS, &a).stdout(Stdio::null()).spawn().unwrap();
            reaper.0.push(w.id());
            workers.push(w);
        }
        std::thread::sleep(Duration::from_millis(800));
        let mut a = node_args(0, transport);
        a.extend(["--role", "head", "--frames", "300", "--json"].map(String::from));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let mut head = leap_with(&n[0].netns, UNIT_CAPS, &a).stdout(Stdio::piped()).spawn().unwrap();
        reaper.0.push(head.id());
        let status = wait_bounded(&mut head, Duration::from_secs(60));
        let out = std::io::read_to_string(head.stdout.take().unwrap()).unwrap();
        assert!(status.success(), "{transport} head: {out}");
        let r: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(r["transport"], transport, "the node fell back: {r}");
        assert_eq!((r["frames_delivered"].as_u64(), r["frames_corrupt"].as_u64()), (Some(300), Some(0)), "{r}");
        for w in &mut workers {
            // kill(2) on our own child (setpriv execs leap).
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(w.id() as i32), nix::sys::signal::Signal::SIGTERM);
            assert!(wait_bounded(w, Duration::from_secs(10)).success(), "{transport} worker");
        }
        for nd in n {
            assert_eq!(xdp_common::xdp_attachment(&nd.netns, &nd.rx_iface), None, "XDP left on {}", nd.rx_iface);
        }
    }
}

#[test]
#[ignore = "needs root, BPF and the XDP object: run by cargo xtask ci (stage ebpf)"]
fn the_multi_buffer_program_attaches_natively_at_mtu_9000_with_the_units_capabilities() {
    // veth refuses a native XDP program without multi-buffer support once
    // the peer's MTU exceeds about 3.5 KB: a ring in native mode at MTU 9000
    // runs only if the kernel took `leap_xdp_frags` under these
    // capabilities.
    let ObjectSource::File(object) = xdp_common::object() else { panic!("tests load the object from a file") };
    let obj = object.to_string_lossy().into_owned();
    let topo = Topology::ring_with_mtu(&xdp_common::unique("lpf"), 2, Some(9000)).unwrap();
    let n = topo.nodes();
    let addr = |i: usize| format!("{}:9999", n[i % 2].addr);
    let args = |i: usize, role: &str| -> Vec<String> {
        let mut a: Vec<String> =
            ["node", "--transport", "xdp", "--xdp-mode", "drv", "--xdp-object", &obj, "--iface", &n[i].rx_iface]
                .iter()
                .map(|s| s.to_string())
                .collect();
        a.extend(["--listen".into(), addr(i), "--next".into(), addr(i + 1), "--prev".into(), addr(i + 1)]);
        a.extend(["--role".into(), role.into()]);
        a
    };
    let mut reaper = Reaper(Vec::new());
    let a = args(1, "worker");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut worker = leap_with(&n[1].netns, UNIT_CAPS, &a).stdout(Stdio::null()).spawn().unwrap();
    reaper.0.push(worker.id());
    std::thread::sleep(Duration::from_millis(800));
    let mut a = args(0, "head");
    a.extend(["--frames", "100", "--json"].map(String::from));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut head = leap_with(&n[0].netns, UNIT_CAPS, &a).stdout(Stdio::piped()).spawn().unwrap();
    reaper.0.push(head.id());
    let status = wait_bounded(&mut head, Duration::from_secs(60));
    let out = std::io::read_to_string(head.stdout.take().unwrap()).unwrap();
    assert!(status.success(), "head: {out}");
    let r: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(r["transport"], "xdp", "the node fell back: {r}");
    assert_eq!((r["frames_delivered"].as_u64(), r["frames_corrupt"].as_u64()), (Some(100), Some(0)), "{r}");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(worker.id() as i32), nix::sys::signal::Signal::SIGTERM);
    assert!(wait_bounded(&mut worker, Duration::from_secs(10)).success(), "worker");
    for nd in n {
        assert_eq!(xdp_common::xdp_attachment(&nd.netns, &nd.rx_iface), None, "XDP left on {}", nd.rx_iface);
    }
}
