//! Shared by the `leap serve` tests (`netns_serve.rs`, `xdp_serve.rs`):
//! three network namespaces stand in for three hosts, each running the
//! `leap serve` binary on its own address (with the packaged unit's
//! capabilities only, or root's); everything is removed on drop, also when a
//! test fails.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leap::netns::Topology;
use leap::ring::{RingConfig, RingReport};
use leap::serve::coordinator::{Client, HostRings, HostSpec};

/// The agents' control port.
pub const CONTROL_PORT: u16 = 7700;
/// The ring members' data port.
pub const DATA_PORT: u16 = 9999;
/// The shared token.
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// Three "hosts" and their agents.
#[derive(Debug)]
pub struct Cluster {
    pub topo: Topology,
    pub agents: Vec<Option<Child>>,
    pub dir: PathBuf,
    pub token_file: PathBuf,
    xdp_object: Option<PathBuf>,
    privilege: Privilege,
}

/// What the agents may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// The packaged unit's capabilities only: CAP_BPF, CAP_NET_ADMIN,
    /// CAP_NET_RAW (+ CAP_IPC_LOCK standing in for its
    /// LimitMEMLOCK=infinity), through setpriv.
    Unit,
    /// Root's.
    Root,
}

impl Cluster {
    /// Namespaces `<tag><pid>n0..2` with an agent each. `tag`: one or two
    /// letters, different per test of a file (they run in parallel).
    pub fn new(tag: &str, xdp_object: Option<&Path>, privilege: Privilege) -> Self {
        let prefix = format!("{tag}{}", std::process::id() % 100_000);
        let topo = Topology::ring(&prefix, 3).expect("namespaces");
        let dir = std::env::temp_dir().join(format!("leap-serve-{prefix}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = Self {
            topo,
            agents: vec![None, None, None],
            dir,
            token_file,
            xdp_object: xdp_object.map(Into::into),
            privilege,
        };
        for i in 0..3 {
            c.start_agent(i);
        }
        c
    }

    /// Control address of host `i`.
    pub fn control(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.topo.nodes()[i].addr, CONTROL_PORT))
    }

    /// The hosts, for a coordinator.
    /// A coordinator living in host 0's namespace for the whole test: it
    /// runs every ring sent to it and reports each result with its duration.
    /// Dropping the sender ends it.
    pub fn coordinator(&self) -> Coordinator {
        let (hosts, path) = (self.hosts(), self.topo.nodes()[0].path());
        let (to_coord, from_test) = std::sync::mpsc::channel::<RingConfig>();
        let (to_test, results) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            leap::netns::enter(&path).expect("setns");
            let mut rings = HostRings::connect(hosts, TOKEN.into(), "ns").expect("connect");
            for rc in from_test {
                let started = Instant::now();
                let r = rings.run_ring(&rc).map_err(|e| e.to_string());
                let _ = to_test.send((r, started.elapsed()));
            }
        });
        Coordinator { rings: to_coord, results, thread }
    }

    pub fn hosts(&self) -> Vec<HostSpec> {
        (0..3)
            .map(|i| {
                let n = &self.topo.nodes()[i];
                HostSpec {
                    name: format!("h{i}"),
                    control: self.control(i),
                    data: SocketAddr::from((n.addr, DATA_PORT)),
                    iface: Some(n.rx_iface.clone()),
                    token_file: None,
                }
            })
            .collect()
    }

    /// Starts the agent of host `i` and waits until it answers.
    pub fn start_agent(&mut self, i: usize) {
        let ns = self.topo.nodes()[i].netns.clone();
        let log = std::fs::File::create(self.dir.join(format!("agent{i}.log"))).unwrap();
        // The "hosts" hold /32 addresses: the run's members are allowed by
        // address, and each member only its own interface.
        let config = self.dir.join(format!("agent{i}.toml"));
        let members: Vec<String> = self.topo.nodes().iter().map(|n| format!("\"{}\"", n.addr)).collect();
        std::fs::write(
            &config,
            format!(
                "[allow]\nnetworks = [{}]\nports = [\"{DATA_PORT}\"]\ninterfaces = [\"{}\"]\n",
                members.join(", "),
                self.topo.nodes()[i].rx_iface
            ),
        )
        .unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns]);
        if self.privilege == Privilege::Unit {
            let caps = "-all,+bpf,+net_admin,+net_raw,+ipc_lock";
            cmd.args(["setpriv", "--bounding-set", caps, "--inh-caps", caps, "--ambient-caps", caps, "--"]);
        }
        cmd.args([env!("CARGO_BIN_EXE_leap"), "--log", "info", "serve", "--listen"])
            .arg(self.control(i).to_string())
            .arg("--token-file")
            .arg(&self.token_file)
            .arg("--config")
            .arg(&config)
            .arg("--max-run-s")
            .arg("60");
        if let Some(o) = &self.xdp_object {
            cmd.arg("--xdp-object").arg(o);
        }
        let child = cmd.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
        self.agents[i] = Some(child);
        let addr = self.control(i);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.in_ns(0, move || Client::connect("probe", addr, TOKEN).is_err()) {
            assert!(Instant::now() < deadline, "agent {i} did not answer on {addr}: {}", self.agent_log(i));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the agent of host `i` (SIGKILL: no clean-up of its own).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// What agent `i` logged.
    pub fn agent_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("agent{i}.log"))).unwrap_or_default()
    }

    /// Runs `f` on a thread inside host `i`'s namespace.
    pub fn in_ns<T: Send + 'static>(&self, i: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        leap::netns::run_in(&self.topo.nodes()[i].path(), f).expect("setns")
    }

    /// An authenticated client of agent `i`, connected from host 0.
    pub fn client(&self, i: usize) -> Client {
        let addr = self.control(i);
        self.in_ns(0, move || Client::connect(&format!("h{i}"), addr, TOKEN)).expect("connect")
    }

    /// Starts `leap bench ARGS --hosts ... --token-file ...` in host 0,
    /// its standard error into `bench.err`.
    pub fn spawn_bench(&self, args: &[&str]) -> Child {
        let hosts: Vec<String> = (0..3).map(|i| self.control(i).to_string()).collect();
        let data: Vec<String> = self.hosts().iter().map(|h| h.data.to_string()).collect();
        let ifaces: Vec<String> = self.topo.nodes().iter().map(|n| n.rx_iface.clone()).collect();
        let err = std::fs::File::create(self.dir.join("bench.err")).unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.topo.nodes()[0].netns, env!("CARGO_BIN_EXE_leap"), "bench", "--hosts"])
            .arg(hosts.join(","))
            .arg("--data")
            .arg(data.join(","))
            .arg("--ifaces")
            .arg(ifaces.join(","))
            .arg("--token-file")
            .arg(&self.token_file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    }

    /// [`Cluster::spawn_bench`], waited for at most `limit`; returns
    /// (success, stderr).
    pub fn bench(&self, args: &[&str], limit: Duration) -> (bool, String) {
        let mut child = self.spawn_bench(args);
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("leap bench --hosts did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status.success(), std::fs::read_to_string(self.dir.join("bench.err")).unwrap_or_default())
    }

    /// Whether something in host `i`'s namespace has `port` bound (TCP or UDP).
    pub fn port_bound(&self, i: usize, port: u16) -> bool {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.topo.nodes()[i].netns, "ss", "-Hantu"])
            .output()
            .expect("ss");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 4 && f[1] != "TIME-WAIT" && f[4].ends_with(&format!(":{port}"))
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.agents.len() {
            self.kill_agent(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        // The topology goes next (field drop): namespaces, veths, XDP.
    }
}

/// See [`Cluster::coordinator`].
pub struct Coordinator {
    pub rings: std::sync::mpsc::Sender<RingConfig>,
    pub results: std::sync::mpsc::Receiver<(Result<RingReport, String>, Duration)>,
    pub thread: std::thread::JoinHandle<()>,
}
