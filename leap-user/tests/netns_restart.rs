//! A 3-node ring of `leap node` processes in namespaces; a worker is killed
//! with SIGKILL mid-run and restarted. No frame is corrupted, every frame
//! arrives (lost ones are sent again by the head), and SIGTERM ends every
//! process with status 0.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leap::netns::Topology;
use support::{Reaper, wait_bounded};

fn node(topo: &Topology, i: usize, transport: &str, extra: &[&str]) -> Child {
    let n = topo.nodes().len();
    let addr = |k: usize| format!("{}:9999", topo.nodes()[k % n].addr);
    let ns = &topo.nodes()[i].netns;
    Command::new("ip")
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_leap"), "node", "--transport", transport])
        .args(["--listen", &addr(i), "--next", &addr(i + 1), "--prev", &addr(i + n - 1)])
        .args(["--frame-size", "16392"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn kill_and_restart(transport: &str) {
    let topo = Topology::ring(&format!("lk{}", std::process::id() % 10_000), 3).unwrap();
    let worker = ["--role", "worker", "--compute-us", "300"];
    let mut w1 = node(&topo, 1, transport, &worker);
    let mut w2 = node(&topo, 2, transport, &worker);
    let frames = "4000";
    let mut head = node(&topo, 0, transport, &["--role", "head", "--frames", frames, "--json"]);
    let mut reaper = Reaper(vec![w1.id(), w2.id(), head.id()]);
    std::thread::sleep(Duration::from_millis(800));
    assert!(head.try_wait().unwrap().is_none(), "the run ended before the kill: make it longer");
    w1.kill().unwrap(); // SIGKILL
    w1.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut w1 = node(&topo, 1, transport, &worker);
    reaper.0.push(w1.id());
    let status = wait_bounded(&mut head, Duration::from_secs(120));
    let out = std::io::read_to_string(head.stdout.take().unwrap()).unwrap();
    assert!(status.success(), "head failed: {out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["frames_corrupt"], 0, "{v}");
    assert_eq!(v["frames_delivered"], frames.parse::<u64>().unwrap(), "{v}");
    for w in [&mut w1, &mut w2] {
        // kill(2) on our own child's pid.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(w.id() as i32), nix::sys::signal::Signal::SIGTERM);
        // `ip netns exec` execs leap, so the pid is leap's.
        let s = wait_bounded(w, Duration::from_secs(10));
        assert!(s.success(), "worker exited with {s}");
    }
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn udp_ring_survives_a_killed_and_restarted_worker() {
    kill_and_restart("udp");
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn tcp_ring_survives_a_killed_and_restarted_worker() {
    kill_and_restart("tcp");
}
