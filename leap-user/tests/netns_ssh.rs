//! `leap bench --hosts ssh://...` across three "hosts" (network namespaces,
//! each running its own `sshd` in the foreground on port 2222, with a host
//! key and an authorized client key made for the test): the report has
//! every frame intact and no member outlives its ring; a host whose key is
//! not the one known_hosts holds is refused in one line naming it, and
//! nothing starts; a missing remote leap and a missing ssh client say so.
//! Needs root and openssh-server: `cargo xtask ci` (stage privileged)
//! installs it; with `CI=true` a missing sshd fails the test.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use leap::bench::BenchReport;
use leap::netns::Topology;

/// sshd's port in every namespace.
const SSH_PORT: u16 = 2222;
/// The ring members' data port.
const DATA_PORT: u16 = 9999;
/// Where Debian's openssh-server puts sshd (it must be run by absolute path).
const SSHD: &str = "/usr/sbin/sshd";

/// sshd, or `None` (said on stderr) outside CI when it is missing.
fn sshd() -> Option<PathBuf> {
    if Path::new(SSHD).is_file() {
        return Some(SSHD.into());
    }
    let msg = "sshd (Debian package openssh-server) is missing: `apt-get install -y openssh-server openssh-client`";
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{msg}; CI=true forbids skipping");
    eprintln!("SKIPPED: {msg}");
    None
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A new ed25519 key pair at `path` (and `path.pub`); returns the public key.
fn keygen(path: &Path) -> String {
    run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "leap-test", "-f"]).arg(path));
    std::fs::read_to_string(path.with_extension("pub")).unwrap().trim().to_string()
}

/// Three namespaces, an sshd in each; everything goes on drop, also when
/// a test fails.
struct SshCluster {
    sshds: Vec<Child>,
    dir: PathBuf,
    /// Host key of the sshds (one for all three).
    host_pub: String,
    // Last: the namespaces go once the sshds are gone.
    topo: Topology,
}

impl SshCluster {
    fn new(tag: &str, sshd: &Path) -> Self {
        let prefix = format!("{tag}{}", std::process::id() % 100_000);
        let topo = Topology::ring(&prefix, 3).expect("namespaces");
        let dir = std::env::temp_dir().join(format!("leap-ssh-{prefix}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Self { sshds: Vec::new(), dir, host_pub: String::new(), topo };
        c.host_pub = keygen(&c.dir.join("host_key"));
        let client_pub = keygen(&c.dir.join("id"));
        std::fs::write(c.dir.join("authorized_keys"), format!("{client_pub}\n")).unwrap();
        let known: String = (0..3).map(|i| format!("{} {}\n", c.known_name(i), c.host_pub)).collect();
        std::fs::write(c.dir.join("known_hosts"), known).unwrap();
        // sshd's privilege separation directory (the service makes it).
        std::fs::create_dir_all("/run/sshd").unwrap();
        let config = c.dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {SSH_PORT}\nHostKey {dir}/host_key\nAuthorizedKeysFile {dir}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nLogLevel VERBOSE\n",
                dir = c.dir.display()
            ),
        )
        .unwrap();
        for i in 0..3 {
            let log = std::fs::File::create(c.dir.join(format!("sshd{i}.log"))).unwrap();
            let child = Command::new("ip")
                .args(["netns", "exec", &c.topo.nodes()[i].netns])
                .arg(sshd)
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            c.sshds.push(child);
        }
        for i in 0..3 {
            let addr = c.ssh_addr(i);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !c.in_ns(0, move || TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()) {
                assert!(Instant::now() < deadline, "sshd {i} did not listen on {addr}: {}", c.sshd_log(i));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        c
    }

    fn ssh_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.topo.nodes()[i].addr, SSH_PORT))
    }

    /// Host `i` as known_hosts names it.
    fn known_name(&self, i: usize) -> String {
        format!("[{}]:{SSH_PORT}", self.topo.nodes()[i].addr)
    }

    fn sshd_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("sshd{i}.log"))).unwrap_or_default()
    }

    fn in_ns<T: Send + 'static>(&self, i: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        leap::netns::run_in(&self.topo.nodes()[i].path(), f).expect("setns")
    }

    /// `leap bench --hosts ssh://root@...` from host 0 with `extra`,
    /// waited for at most `limit`: (success, stderr).
    fn bench(&self, remote_leap: &str, extra: &[&str], limit: Duration) -> (bool, String) {
        self.wait(self.spawn_bench(remote_leap, extra), limit)
    }

    /// `leap bench --hosts-file FILE EXTRA...` from host 0, waited for at
    /// most `limit`: (success, stderr).
    fn bench_file(&self, file: &Path, extra: &[&str], limit: Duration) -> (bool, String) {
        let err = std::fs::File::create(self.dir.join("bench.err")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.topo.nodes()[0].netns, env!("CARGO_BIN_EXE_leap"), "bench", "--hosts-file"])
            .arg(file)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        self.wait(child, limit)
    }

    fn wait(&self, mut child: Child, limit: Duration) -> (bool, String) {
        let status = support::wait_bounded(&mut child, limit);
        (status.success(), std::fs::read_to_string(self.dir.join("bench.err")).unwrap_or_default())
    }

    /// Starts `leap bench --hosts ssh://root@...` in host 0 (`ip netns
    /// exec` execs it: the child is leap), its stderr into `bench.err`.
    fn spawn_bench(&self, remote_leap: &str, extra: &[&str]) -> Child {
        let hosts: Vec<String> =
            (0..3).map(|i| format!("ssh://root@{}:{SSH_PORT}", self.topo.nodes()[i].addr)).collect();
        let err = std::fs::File::create(self.dir.join("bench.err")).unwrap();
        let opt = |k: &str, v: &Path| format!("{k}={}", v.display());
        Command::new("ip")
            .args(["netns", "exec", &self.topo.nodes()[0].netns, env!("CARGO_BIN_EXE_leap"), "bench", "--hosts"])
            .arg(hosts.join(","))
            .args(["--ssh-option", &opt("IdentityFile", &self.dir.join("id"))])
            .args(["--ssh-option", "IdentitiesOnly=yes"])
            .args(["--ssh-option", &opt("UserKnownHostsFile", &self.dir.join("known_hosts"))])
            .args(["--ssh-option", "GlobalKnownHostsFile=/dev/null"])
            .args(["--remote-leap", remote_leap])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    }

    /// Whether something in host `i`'s namespace has `port` bound.
    fn port_bound(&self, i: usize, port: u16) -> bool {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.topo.nodes()[i].netns, "ss", "-Hantu"])
            .output()
            .expect("ss");
        String::from_utf8_lossy(&out.stdout).lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 4 && f[1] != "TIME-WAIT" && f[4].ends_with(&format!(":{port}"))
        })
    }

    /// (pid, command line) of every process in this cluster's namespaces:
    /// its sshds, their sessions and the members those started.
    fn processes(&self) -> Vec<(i32, String)> {
        let inodes: Vec<String> = self
            .topo
            .nodes()
            .iter()
            .filter_map(|n| std::fs::metadata(n.path()).ok())
            .map(|m| format!("net:[{}]", m.ino()))
            .collect();
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
            let Ok(ns) = std::fs::read_link(e.path().join("ns/net")) else { continue };
            if inodes.iter().any(|i| ns.as_os_str() == i.as_str()) {
                let raw = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                found.push((pid, String::from_utf8_lossy(&raw).replace('\0', " ")));
            }
        }
        found
    }

    /// Command lines of the `leap bench-member` processes in this
    /// cluster's namespaces (the remote side of ssh channels).
    fn members_running(&self) -> Vec<String> {
        self.processes().into_iter().map(|(_, l)| l).filter(|l| l.contains("bench-member")).collect()
    }

    /// Waits (bounded) until no member runs and no data port is bound.
    fn assert_nothing_left(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let members = self.members_running();
            let bound: Vec<usize> = (0..3).filter(|&i| self.port_bound(i, DATA_PORT)).collect();
            if members.is_empty() && bound.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "left behind: members {members:?}, data port bound on hosts {bound:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SshCluster {
    fn drop(&mut self) {
        for c in &mut self.sshds {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test may leave sessions and members behind: everything
        // in the cluster's namespaces was started by it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = self.processes();
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for (pid, _) in left {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        // The topology goes next (field drop): namespaces and veths.
    }
}

#[test]
#[ignore = "needs root for namespaces and sshd: run by cargo xtask ci (stage privileged)"]
fn bench_over_ssh_runs_rings_across_three_hosts_with_every_frame_intact() {
    let Some(sshd) = sshd() else { return };
    let c = SshCluster::new("hs", &sshd);
    let out = c.dir.join("report");
    let (ok, err) = c.bench(
        env!("CARGO_BIN_EXE_leap"),
        &["--quick", "--sizes", "16392", "--transports", "tcp,udp", "--setup-timeout-s", "10", "--out"]
            .into_iter()
            .chain([out.to_str().unwrap()])
            .collect::<Vec<_>>(),
        Duration::from_secs(180),
    );
    let logs = || (0..3).map(|i| c.sshd_log(i)).collect::<Vec<_>>().join("\n");
    eprintln!("leap bench said:\n{err}");
    assert!(ok, "leap bench --hosts ssh://... failed: {err}\n{}", logs());
    let json = std::fs::read_to_string(out.join("report.json")).unwrap();
    let rep: BenchReport = serde_json::from_str(&json).expect("the local report's fields");
    assert_eq!((rep.placement.as_str(), rep.nodes), ("hosts", 3));
    for kind in ["tcp", "udp"] {
        for mode in ["latency", "throughput"] {
            let r = rep
                .rows
                .iter()
                .find(|r| r.transport == kind && r.mode == mode)
                .unwrap_or_else(|| panic!("no {kind} {mode} row: {json}\n{err}"));
            assert!(r.frames > 0 && r.gbit_per_s > 0.0 && r.round_trips_per_s > 0.0, "{kind} {mode}: frames came back");
            assert_eq!((r.frames_lost, r.frames_corrupt), (0, 0), "{kind} {mode}: every frame intact");
            assert!(r.rtt_us.p50 > 0.0 && r.rtt_us.p99 >= r.rtt_us.p50, "{kind} {mode}: {:?}", r.rtt_us);
            assert!(r.cpu_us_per_frame > 0.0, "{kind} {mode}: the members' CPU time is reported");
        }
    }
    assert_eq!(rep.hosts.len(), 3);
    for (i, h) in rep.hosts.iter().enumerate() {
        assert_eq!(h.control, format!("ssh://root@{}:{SSH_PORT}", c.topo.nodes()[i].addr));
        assert_eq!(
            h.data,
            format!("{}:{DATA_PORT}", c.topo.nodes()[i].addr),
            "the data address defaults to the host's"
        );
        assert!(h.capabilities.unavailable(leap::transport::open::TransportKind::Udp).is_none());
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("started over ssh") && md.contains("no clock synchronisation"), "{md}");
    for i in 0..3 {
        assert!(c.sshd_log(i).contains("Accepted publickey for root"), "host {i} was logged into: {}", c.sshd_log(i));
    }
    c.assert_nothing_left();
}

#[test]
#[ignore = "needs root for namespaces and sshd: run by cargo xtask ci (stage privileged)"]
fn a_host_whose_key_is_not_known_is_refused_in_one_line_and_nothing_starts() {
    let Some(sshd) = sshd() else { return };
    let c = SshCluster::new("hk", &sshd);
    // known_hosts holds another key for host 1.
    let other = keygen(&c.dir.join("other_key"));
    let known: String =
        (0..3).map(|i| format!("{} {}\n", c.known_name(i), if i == 1 { &other } else { &c.host_pub })).collect();
    std::fs::write(c.dir.join("known_hosts"), known).unwrap();
    let out = c.dir.join("report");
    let (ok, err) = c.bench(
        env!("CARGO_BIN_EXE_leap"),
        &["--quick", "--sizes", "16392", "--transports", "udp", "--out", out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    eprintln!("leap bench said:\n{err}");
    assert!(!ok, "a bench with a host whose key changed must fail: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("leap:")).collect();
    assert_eq!(lines.len(), 1, "one line of error: {err}");
    let target = format!("ssh://root@{}:{SSH_PORT}", c.topo.nodes()[1].addr);
    assert!(
        lines[0].contains(&format!("host h1 ({target})")) && lines[0].contains("refused the host key"),
        "names the host and says its key was refused: {err}"
    );
    assert!(lines[0].contains("not the key known_hosts holds"), "{err}");
    assert!(!out.join("report.json").exists(), "no report from a refused run");
    assert!(!c.sshd_log(1).contains("Accepted publickey"), "no login on the refused host: {}", c.sshd_log(1));
    c.assert_nothing_left();
    // The right key again, but no leap where the hosts look for it.
    std::fs::write(
        c.dir.join("known_hosts"),
        (0..3).map(|i| format!("{} {}\n", c.known_name(i), c.host_pub)).collect::<String>(),
    )
    .unwrap();
    let (ok, err) = c.bench("/nonexistent/leap", &["--transports", "udp"], Duration::from_secs(60));
    eprintln!("leap bench said:\n{err}");
    assert!(!ok);
    assert!(
        err.contains("host h0 (") && err.contains("leap is not installed there (`/nonexistent/leap`"),
        "says the remote leap is missing: {err}"
    );
    c.assert_nothing_left();
    // The same from a hosts file: its ssh options and remote leap are used.
    let file = c.dir.join("hosts.toml");
    let mut toml = format!(
        "ssh_options = [\"IdentityFile={d}/id\", \"IdentitiesOnly=yes\", \"UserKnownHostsFile={d}/known_hosts\"]\n\
         remote_leap = \"/nonexistent/leap2\"\n",
        d = c.dir.display()
    );
    for (i, n) in c.topo.nodes().iter().enumerate() {
        toml += &format!("[[host]]\nname = \"n{i}\"\nssh = \"ssh://root@{}:{SSH_PORT}\"\n", n.addr);
    }
    std::fs::write(&file, toml).unwrap();
    let (ok, err) = c.bench_file(&file, &["--transports", "udp"], Duration::from_secs(60));
    eprintln!("leap bench said:\n{err}");
    assert!(!ok);
    assert!(err.contains("host n0 (") && err.contains("(`/nonexistent/leap2`"), "{err}");
    c.assert_nothing_left();
}

#[test]
fn a_missing_ssh_client_names_its_package() {
    let empty = std::env::temp_dir().join(format!("leap-no-ssh-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_leap"))
        .args(["bench", "--hosts", "ssh://root@127.0.0.1:1,ssh://root@127.0.0.1:2", "--transports", "udp"])
        .env("PATH", &empty)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&empty);
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("leap bench said:\n{err}");
    assert!(!out.status.success());
    assert!(err.contains("openssh-client") && err.contains("apt-get install"), "{err}");
}

#[test]
#[ignore = "needs root for namespaces and sshd: run by cargo xtask ci (stage privileged)"]
fn killed_bench_ends_every_member_through_its_channel() {
    let Some(sshd) = sshd() else { return };
    let c = SshCluster::new("hx", &sshd);
    // Large frames, many rounds: minutes if left alone.
    let mut bench = c.spawn_bench(
        env!("CARGO_BIN_EXE_leap"),
        &["--sizes", "1048584", "--transports", "udp", "--repeat", "50", "--setup-timeout-s", "5"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.members_running().len() < 3 {
        let err = std::fs::read_to_string(c.dir.join("bench.err")).unwrap_or_default();
        assert!(bench.try_wait().unwrap().is_none(), "the bench ended before its ring ran: {err}");
        assert!(Instant::now() < deadline, "the ring did not start: {:?}\n{err}", c.members_running());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SIGKILL: no clean-up of its own. Its ssh clients see their stdin
    // close, their channels close, and the members see theirs.
    bench.kill().unwrap();
    bench.wait().unwrap();
    c.assert_nothing_left();
}
