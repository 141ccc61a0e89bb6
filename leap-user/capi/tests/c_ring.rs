//! The C example (`examples/ring.c`, built against the installed library
//! by `cargo xtask ci`) as a ring of three processes: a head and two
//! workers, every returned frame checked, a control round halfway. On
//! loopback (also under AddressSanitizer), across network namespaces, and
//! over XDP. The programs come in `LEAP_C_RING` / `LEAP_C_RING_ASAN`, the
//! XDP object in `LEAP_XDP_OBJECT`: these tests are run by the xtask.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use leap_rs::netns::Topology;

const FRAMES: &str = "2000";
const LIMIT: Duration = Duration::from_secs(120);

fn program(var: &str) -> PathBuf {
    let p = std::env::var_os(var)
        .unwrap_or_else(|| panic!("{var} is not set: run these tests through `cargo xtask ci` (stage smoke)"));
    PathBuf::from(p)
}

/// Kills the ring's processes however the test ends.
struct Ring(Vec<Child>);

impl Drop for Ring {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Ring {
    fn spawn(&mut self, mut cmd: Command) {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        self.0.push(cmd.spawn().expect("starting a ring process"));
    }

    /// Waits for every process (bounded) and returns their outputs, head
    /// last as it was started last.
    fn finish(mut self) -> Vec<Output> {
        let start = Instant::now();
        let mut outs = Vec::new();
        for mut c in std::mem::take(&mut self.0) {
            loop {
                if c.try_wait().expect("waiting").is_some() {
                    break;
                }
                if start.elapsed() > LIMIT {
                    let _ = c.kill();
                    let out = c.wait_with_output().expect("output");
                    panic!("a ring process ran over {LIMIT:?}: {}", String::from_utf8_lossy(&out.stderr));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            outs.push(c.wait_with_output().expect("output"));
        }
        outs
    }
}

/// The three nodes' arguments: (listen, next, prev, extra settings).
type Node = (String, String, String, Vec<String>);

fn run_ring(prog: &PathBuf, kind: &str, nodes: &[Node], wrap: impl Fn(Command) -> Command) {
    let mut ring = Ring(Vec::new());
    let cmd = |i: usize, role: &str| {
        let (listen, next, prev, sets) = &nodes[i];
        let mut c = Command::new(prog);
        c.args(["--kind", kind, "--role", role, "--listen", listen, "--next", next, "--prev", prev]).args([
            "--frames",
            FRAMES,
            "--dim",
            "4096",
            "--workers",
            "2",
            "--index",
            &i.saturating_sub(1).to_string(),
        ]);
        for s in sets {
            c.args(["--set", s]);
        }
        // More arguments for measurements (`--copy`: workers as `leap
        // ring`'s, passing frames on unchanged).
        if let Ok(extra) = std::env::var("LEAP_C_RING_ARGS") {
            c.args(extra.split_whitespace());
        }
        c
    };
    for i in [1, 2] {
        ring.spawn(wrap(cmd(i, "worker")));
    }
    // Workers listen before the head's first frame (UDP has no connection
    // to wait for).
    std::thread::sleep(Duration::from_millis(500));
    ring.spawn(wrap(cmd(0, "head")));
    let outs = ring.finish();
    for (i, o) in outs.iter().enumerate() {
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        eprintln!("{kind} process {i}: {}{out}{err}", o.status);
        assert!(o.status.success(), "{kind} ring process {i} failed: {err}");
    }
    let head = String::from_utf8_lossy(&outs[2].stdout);
    assert!(head.contains(&format!("\"intact\":{FRAMES}")), "{head}");
    assert!(head.contains("\"control_back\":true"), "{head}");
    for w in &outs[..2] {
        assert!(String::from_utf8_lossy(&w.stdout).contains(&format!("\"relayed\":{FRAMES}")));
    }
}

fn free_port() -> u16 {
    leap_rs::netns::loopback_port().expect("a free loopback port")
}

fn loopback_nodes() -> Vec<Node> {
    let addrs: Vec<SocketAddr> = (0..3).map(|_| SocketAddr::from(([127, 0, 0, 1], free_port()))).collect();
    (0..3)
        .map(|i| (addrs[i].to_string(), addrs[(i + 1) % 3].to_string(), addrs[(i + 2) % 3].to_string(), vec![]))
        .collect()
}

fn loopback(kind: &str, var: &str) {
    run_ring(&program(var), kind, &loopback_nodes(), |c| c);
}

#[test]
#[ignore = "needs the C programs built by cargo xtask ci (stage smoke)"]
fn loopback_tcp_ring_of_three_c_processes_returns_every_frame_intact() {
    loopback("tcp", "LEAP_C_RING");
}

#[test]
#[ignore = "needs the C programs built by cargo xtask ci (stage smoke)"]
fn loopback_udp_ring_of_three_c_processes_returns_every_frame_intact() {
    loopback("udp", "LEAP_C_RING");
}

#[test]
#[ignore = "needs the C programs built by cargo xtask ci (stage smoke)"]
fn loopback_udp_ring_under_address_sanitizer() {
    loopback("udp", "LEAP_C_RING_ASAN");
}

/// A ring in three namespaces (removed again, also on failure); `sets`
/// gives node `i`'s extra settings.
fn namespaces(kind: &str, sets: impl Fn(&leap_rs::netns::NodeNet) -> Vec<String>) {
    let prog = program("LEAP_C_RING");
    let topo = Topology::ring("lcapi", 3).expect("namespaces (root)");
    let n = topo.nodes();
    let at = |i: usize| format!("{}:9999", n[i % 3].addr);
    let nodes: Vec<Node> = (0..3).map(|i| (at(i), at(i + 1), at(i + 2), sets(&n[i]))).collect();
    let names: Vec<String> = n.iter().map(|x| x.netns.clone()).collect();
    // Each process in its node's namespace; `ip netns exec` execs it.
    let next_ns = std::cell::Cell::new(0usize);
    let order = [1usize, 2, 0];
    run_ring(&prog, kind, &nodes, |c| {
        let ns = &names[order[next_ns.get()]];
        next_ns.set(next_ns.get() + 1);
        let mut w = Command::new("ip");
        w.args(["netns", "exec", ns]).arg(c.get_program()).args(c.get_args());
        w
    });
    drop(topo);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn netns_tcp_ring_of_three_c_processes_returns_every_frame_intact() {
    namespaces("tcp", |_| vec![]);
}

#[test]
#[ignore = "needs root for namespaces: run by cargo xtask ci (stage privileged)"]
fn netns_udp_ring_of_three_c_processes_returns_every_frame_intact() {
    namespaces("udp", |_| vec![]);
}

fn xdp(kind: &str) {
    let object = program("LEAP_XDP_OBJECT");
    namespaces(kind, |node| vec![format!("interface={}", node.rx_iface), format!("xdp_object={}", object.display())]);
}

#[test]
#[ignore = "needs root and the XDP object: run by cargo xtask ci (stage ebpf)"]
fn xdp_ring_of_three_c_processes_returns_every_frame_intact() {
    xdp("xdp");
}

#[test]
#[ignore = "needs root and the XDP object: run by cargo xtask ci (stage ebpf)"]
fn xdp_ringbuf_ring_of_three_c_processes_returns_every_frame_intact() {
    xdp("xdp-ringbuf");
}
