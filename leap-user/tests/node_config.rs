//! `leap node --config`: validation messages, and `leap stats` against a
//! running node (loopback, no privileges).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn leap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leap"))
}

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("leap-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ring_file(me: &str, ports: [u16; 2], extra: &str) -> String {
    format!(
        "[ring]\nme = \"{me}\"\nframe_size = 16392\nmembers = [{{ name = \"a\", addr = \"127.0.0.1:{}\" }}, {{ name = \"b\", addr = \"127.0.0.1:{}\" }}]\n{extra}",
        ports[0], ports[1]
    )
}

#[test]
fn check_names_the_bad_field() {
    let dir = tmpdir("check");
    let good = ring_file("a", [9100, 9101], "[transport]\norder = [\"udp\"]\n");
    let cases = [
        (good.replace("[\"udp\"]", "[\"udp\", \"smoke-signals\"]"), "transport.order[1]"),
        (good.replace("127.0.0.1:9101", "127.0.0.1:99999"), "ring.members[1].addr"),
        (good.replace("\nme = \"a\"", "\nme = \"q\""), "ring.me"),
        (good.replace("order = [\"udp\"]", "order = [\"udp\"]\ninterface = \"leapnope0\""), "transport.interface"),
        (good.replace("[transport]", "[transport]\ncolour = 1"), "colour"),
        (format!("{good}[node]\ncpus = [100000]\n"), "node.cpus"),
        (good.replace("order = [\"udp\"]", "order = [\"udp\"]\nbusy_poll_us = 99999"), "transport.busy_poll_us"),
        (good.replace("order = [\"udp\"]", "order = [\"udp\"]\nqueues = [64]"), "transport.queues"),
        (good.replace("order = [\"udp\"]", "order = [\"udp\"]\nqueues = \"most\""), "transport.queues"),
        (good.replace("order = [\"udp\"]", "order = [\"udp\"]\nqueues = [-1]"), "transport.queues"),
        (good.replace("order = [\"udp\"]", "order = [\"udp\"]\nxdp_mode = \"fast\""), "transport.xdp_mode"),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let f = dir.join(format!("bad{i}.toml"));
        std::fs::write(&f, text).unwrap();
        let out = leap().args(["node", "--check", "--config"]).arg(&f).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} passed the check");
        assert!(err.contains(field), "case {i}: expected `{field}` in: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "case {i}: {err}");
    }
    let no_trains = good.replace("order = [\"udp\"]", "order = [\"udp\"]\ntrains = false");
    let busy = good.replace("order = [\"udp\"]", "order = [\"udp\"]\nbusy_poll_us = 50");
    let typed = good.replace("order = [\"udp\"]", "order = [\"udp\"]\nqueues = [0, 1]\nxdp_mode = \"skb\"");
    let all = good.replace("order = [\"udp\"]", "order = [\"udp\"]\nqueues = \"all\"");
    for (name, text) in [("good", &good), ("no-trains", &no_trains), ("busy", &busy), ("typed", &typed), ("all", &all)]
    {
        let f = dir.join(format!("{name}.toml"));
        std::fs::write(&f, text).unwrap();
        let out = leap().args(["node", "--check", "--config"]).arg(&f).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn term(c: &mut Child) -> std::process::ExitStatus {
    // kill(2) on our own child.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let start = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stats_reads_a_running_node() {
    let dir = tmpdir("stats");
    let ports = {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        [a.local_addr().unwrap().port(), b.local_addr().unwrap().port()]
    };
    let mut kids = Vec::new();
    for me in ["b", "a"] {
        let sock = dir.join(format!("{me}.sock"));
        let extra = format!("[transport]\norder = [\"udp\"]\n[node]\nstats_socket = \"{}\"\n", sock.display());
        let f = dir.join(format!("{me}.toml"));
        // The head (a) runs until stopped: frames = 0.
        std::fs::write(&f, ring_file(me, ports, &extra).replace("frame_size", "frames = 0\nframe_size")).unwrap();
        kids.push(leap().args(["node", "--config"]).arg(&f).stdout(Stdio::null()).spawn().unwrap());
        wait_for(&sock);
    }
    std::thread::sleep(Duration::from_millis(300));
    let out = leap().args(["stats", "--json", "--socket"]).arg(dir.join("b.sock")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["role"], "worker");
    assert!(v["stats"]["frames_received"].as_u64().unwrap() > 0, "{v}");
    assert!(v["latency_us"]["counts"].as_array().unwrap().iter().any(|c| c.as_u64() > Some(0)));
    for mut k in kids.into_iter().rev() {
        let s = term(&mut k);
        assert!(s.success(), "node exited with {s}");
    }
    assert!(!dir.join("b.sock").exists(), "stats socket left behind");
    let _ = std::fs::remove_dir_all(dir);
}
