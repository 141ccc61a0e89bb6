//! Operators' path: a 3-node ring of `leap node --config FILE` processes, one
//! per namespace, each from its own file, over XDP. Frames go round, SIGTERM
//! stops the workers, and afterwards no XDP program is attached, no pin is
//! left and every process exited 0.

mod xdp_common;

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use leap::netns::Topology;
use leap::transport::xdp::ObjectSource;
use support::{Reaper, wait_bounded};

#[test]
#[ignore = "needs root, BPF and the XDP object: run by cargo xtask ci (stage ebpf)"]
fn config_ring_over_xdp_cleans_up_on_sigterm() {
    let ObjectSource::File(object) = xdp_common::object() else { panic!("tests load the object from a file") };
    let topo = Topology::ring(&format!("lc{}", std::process::id() % 10_000), 3).unwrap();
    let dir = std::env::temp_dir().join(format!("leap-xdp-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let members: Vec<String> = topo
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{{ name = \"n{i}\", addr = \"{}:9999\" }}", n.addr))
        .collect();
    let mut kids = Vec::new();
    let mut reaper = Reaper(Vec::new());
    // Workers first, the head last: it drives 500 frames and exits.
    for i in [1, 2, 0] {
        let node = &topo.nodes()[i];
        let text = format!(
            "[ring]\nme = \"n{i}\"\nframes = 500\nmembers = [{}]\n\n[transport]\norder = [\"xdp\"]\ninterface = \"{}\"\n\
             xdp_object = \"{}\"\nrecv_timeout_ms = 500\n\n[node]\nlog = \"info\"\nstats_socket = \"{}\"\n",
            members.join(", "),
            node.rx_iface,
            object.display(),
            dir.join(format!("n{i}.sock")).display()
        );
        let f = dir.join(format!("n{i}.toml"));
        std::fs::write(&f, text).unwrap();
        let check = Command::new("ip")
            .args(["netns", "exec", &node.netns, env!("CARGO_BIN_EXE_leap"), "node", "--check", "--config"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(check.status.success(), "--check: {}", String::from_utf8_lossy(&check.stderr));
        let child = Command::new("ip")
            .args(["netns", "exec", &node.netns, env!("CARGO_BIN_EXE_leap"), "node", "--json", "--config"])
            .arg(&f)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        reaper.0.push(child.id());
        kids.push((i, child));
        std::thread::sleep(Duration::from_millis(300));
    }
    let (_, head) = kids.iter_mut().find(|(i, _)| *i == 0).unwrap();
    let status = wait_bounded(head, Duration::from_secs(60));
    let out = std::io::read_to_string(head.stdout.take().unwrap()).unwrap();
    assert!(status.success(), "head: {out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!((v["frames_delivered"].as_u64(), v["frames_corrupt"].as_u64()), (Some(500), Some(0)), "{v}");
    assert_eq!(v["transport"], "xdp");
    for (i, k) in kids.iter_mut().filter(|(i, _)| *i != 0) {
        // A running worker answers `leap stats`.
        let stats = Command::new(env!("CARGO_BIN_EXE_leap"))
            .args(["stats", "--json", "--socket"])
            .arg(dir.join(format!("n{i}.sock")))
            .output()
            .unwrap();
        assert!(stats.status.success(), "stats n{i}: {}", String::from_utf8_lossy(&stats.stderr));
        // `leap xdp stats` sees the running node's program (in the node's
        // mount namespace: `ip netns exec` gives every process its own /sys).
        let xdp = Command::new("nsenter")
            .args([
                "-t",
                &k.id().to_string(),
                "-m",
                "-n",
                env!("CARGO_BIN_EXE_leap"),
                "xdp",
                "stats",
                "--json",
                "--iface",
            ])
            .arg(&topo.nodes()[*i].rx_iface)
            .output()
            .unwrap();
        assert!(xdp.status.success(), "xdp stats n{i}: {}", String::from_utf8_lossy(&xdp.stderr));
        let xv: serde_json::Value = serde_json::from_slice(&xdp.stdout).unwrap();
        assert!(xv["xdp"]["to_xsk"].as_u64().unwrap_or(0) > 0, "n{i}: {xv}");
        // kill(2) on our own child (ip netns exec execs leap).
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(k.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let s = wait_bounded(k, Duration::from_secs(10));
        assert!(s.success(), "worker n{i} exited with {s}");
    }
    for n in topo.nodes() {
        assert_eq!(xdp_common::xdp_attachment(&n.netns, &n.rx_iface), None, "XDP left on {}", n.rx_iface);
    }
    let pins = std::fs::read_dir("/sys/fs/bpf/leap").map(|d| d.count()).unwrap_or(0);
    assert_eq!(pins, 0, "pins left under /sys/fs/bpf/leap");
    let _ = std::fs::remove_dir_all(&dir);
}
