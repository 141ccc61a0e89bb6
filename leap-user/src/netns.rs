//! Network namespaces: entering one from a thread ([`enter`]), free loopback
//! ports for rings on one host ([`loopback_port`]), and rings of
//! namespaces linked by veth pairs, for `leap ring --netns`,
//! the benchmark and the privileged tests. Everything created is removed
//! again when the [`Topology`] is dropped, also on panic.
//!
//! Node `i` lives in namespace `<prefix>n<i>` and owns the address
//! `10.77.0.<i+1>/32`. Link `i` is a veth pair from node `i` (`tx`) to node
//! `i+1` (`rx`); each node routes its next node's address out of its `tx`
//! veth and its previous node's address out of its `rx` veth.

use std::fs::File;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sched::{CloneFlags, setns};

/// Moves the calling thread into the network namespace at `path` (e.g.
/// `/run/netns/NAME`). Sockets created afterwards by this thread live there.
///
/// # Errors
///
/// Opening the file or `setns` (needs CAP_SYS_ADMIN).
pub fn enter(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    Ok(setns(f, CloneFlags::CLONE_NEWNET)?)
}

/// A loopback port that is free for both TCP and UDP right now, that this
/// process has not handed out before, and that lies below the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`): a port the kernel picked
/// for a `bind` to port 0 is one it may pick again at once for somebody's
/// outgoing connection, before the node that was given it binds it. `None`
/// when 1000 tries found none.
pub fn loopback_port() -> Option<u16> {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
        .max(2048);
    let base = 1024 + (low - 1024) / 2;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let mut r = [0u8; 2];
        getrandom::fill(&mut r).ok()?;
        let port = base + u16::from_ne_bytes(r) % (low - base);
        if handed_out.contains(&port) {
            continue;
        }
        let a = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        if std::net::TcpListener::bind(a).is_ok() && std::net::UdpSocket::bind(a).is_ok() {
            handed_out.insert(port);
            return Some(port);
        }
    }
    None
}

/// Runs `f` on a fresh thread inside the network namespace at `path` and
/// returns what it returns (a panic in `f` goes on in the caller).
///
/// # Errors
///
/// Entering the namespace ([`enter`]); `f` does not run then.
pub fn run_in<T: Send + 'static>(path: &Path, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let path = path.to_path_buf();
    std::thread::spawn(move || enter(&path).map(|()| f()))
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Errors building a topology.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetnsError {
    /// A command failed.
    #[error("`{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it printed.
        stderr: String,
    },
    /// `ip` is missing.
    #[error("cannot run `ip` ({0}); install iproute2")]
    NoIp(std::io::Error),
    /// Not root.
    #[error("network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run as root or use --loopback")]
    NotRoot,
    /// Fewer than two nodes.
    #[error("a namespace ring needs at least 2 nodes")]
    TooFew,
}

/// One node's place in the topology.
#[derive(Debug, Clone)]
pub struct NodeNet {
    /// Namespace name.
    pub netns: String,
    /// The node's address.
    pub addr: Ipv4Addr,
    /// veth on which frames from the previous node arrive.
    pub rx_iface: String,
    /// veth on which frames to the next node leave.
    pub tx_iface: String,
}

impl NodeNet {
    /// Path to enter with [`enter`].
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.netns)
    }
}

/// A ring of namespaces; removed on drop.
#[derive(Debug)]
pub struct Topology {
    nodes: Vec<NodeNet>,
    created: Vec<String>,
    loss_tables: Vec<String>,
    fault_tables: Vec<String>,
}

/// nftables table that `set_loss` creates in each namespace.
const LOSS_TABLE: &str = "leap_loss";
/// nftables table that `set_send_fault` creates in each namespace.
const FAULT_TABLE: &str = "leap_fault";

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new("ip").args(args).output().map_err(NetnsError::NoIp)?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            cmd: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Runs a command inside a namespace (`ip netns exec NS ...`).
///
/// # Errors
///
/// [`NetnsError::Command`] when it fails.
pub fn exec_in(netns: &str, args: &[&str]) -> Result<(), NetnsError> {
    let mut all = vec!["netns", "exec", netns];
    all.extend_from_slice(args);
    ip(&all)
}

/// [`exec_in`], with `input` on the command's standard input.
///
/// # Errors
///
/// [`NetnsError::Command`] when it fails.
pub fn exec_in_with_stdin(netns: &str, args: &[&str], input: &[u8]) -> Result<(), NetnsError> {
    let cmd = || format!("ip netns exec {netns} {}", args.join(" "));
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NetnsError::NoIp)?;
    // The input is a few hundred bytes: it fits the pipe, so writing before
    // reading stderr cannot deadlock. Dropping stdin closes it: EOF.
    let written = child.stdin.take().map(|mut i| i.write_all(input));
    let out = child.wait_with_output().map_err(NetnsError::NoIp)?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            cmd: cmd(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    if let Some(Err(e)) = written {
        return Err(NetnsError::Command { cmd: cmd(), stderr: format!("writing its input: {e}") });
    }
    Ok(())
}

/// The address of node `i` in a topology.
pub fn node_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250) as u8 + 1)
}

impl Topology {
    /// Creates `n` namespaces linked in a ring. Names start with `prefix`
    /// (keep it short: interface names have 15 characters).
    ///
    /// # Errors
    ///
    /// [`NetnsError`]; whatever was created is removed again.
    pub fn ring(prefix: &str, n: usize) -> Result<Self, NetnsError> {
        Self::ring_with_mtu(prefix, n, None)
    }

    /// [`Self::ring`] with every veth at `mtu` bytes (`None`: the default,
    /// 1500); 9000 makes a jumbo-frame ring.
    ///
    /// # Errors
    ///
    /// As [`Self::ring`]; an MTU the veth refuses fails the creation.
    pub fn ring_with_mtu(prefix: &str, n: usize, mtu: Option<u32>) -> Result<Self, NetnsError> {
        if n < 2 {
            return Err(NetnsError::TooFew);
        }
        if !crate::sys::is_root() {
            return Err(NetnsError::NotRoot);
        }
        let mut t = Self { nodes: Vec::new(), created: Vec::new(), loss_tables: Vec::new(), fault_tables: Vec::new() };
        for i in 0..n {
            let ns = format!("{prefix}n{i}");
            // A stale namespace of a crashed run with the same name goes first.
            let _ = ip(&["netns", "del", &ns]);
            ip(&["netns", "add", &ns])?;
            t.created.push(ns.clone());
            exec_in(&ns, &["ip", "link", "set", "lo", "up"])?;
            for key in ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"] {
                exec_in(&ns, &["sysctl", "-qw", key])?;
            }
            t.nodes.push(NodeNet {
                netns: ns,
                addr: node_addr(i),
                rx_iface: format!("{prefix}r{i}"),
                tx_iface: format!("{prefix}t{i}"),
            });
        }
        for i in 0..n {
            let j = (i + 1) % n;
            let (a, b) = (&t.nodes[i], &t.nodes[j]);
            ip(&[
                "link",
                "add",
                &a.tx_iface,
                "netns",
                &a.netns,
                "type",
                "veth",
                "peer",
                "name",
                &b.rx_iface,
                "netns",
                &b.netns,
            ])?;
        }
        for i in 0..n {
            let node = &t.nodes[i];
            let (prev, next) = (&t.nodes[(i + n - 1) % n], &t.nodes[(i + 1) % n]);
            let ns = node.netns.as_str();
            exec_in(ns, &["ip", "addr", "add", &format!("{}/32", node.addr), "dev", &node.rx_iface])?;
            for dev in [&node.rx_iface, &node.tx_iface] {
                if let Some(mtu) = mtu {
                    exec_in(ns, &["ip", "link", "set", dev, "mtu", &mtu.to_string()])?;
                }
                exec_in(ns, &["ip", "link", "set", dev, "up"])?;
                exec_in(ns, &["sysctl", "-qw", &format!("net.ipv4.conf.{dev}.rp_filter=0")])?;
            }
            exec_in(ns, &["ip", "route", "add", &format!("{}/32", next.addr), "dev", &node.tx_iface])?;
            if prev.addr != next.addr {
                exec_in(ns, &["ip", "route", "add", &format!("{}/32", prev.addr), "dev", &node.rx_iface])?;
            }
        }
        Ok(t)
    }

    /// Drops `pct` percent (0 < pct <= 100, two decimals) of the UDP
    /// datagrams every node sends to `port`, with an nftables rule using
    /// `numgen random` on the egress hook of its outgoing veth, in a table of
    /// our own (netem is not available here). Dropping at the device, after
    /// the socket layer, loses datagrams silently as a wire does (an
    /// `output`-hook drop would fail the send with EPERM instead), and also
    /// before any XDP program of the receiver. Removed with the topology.
    ///
    /// # Errors
    ///
    /// [`NetnsError::Command`] when `nft` fails (is nftables installed?).
    pub fn set_loss(&mut self, pct: f64, port: u16) -> Result<(), NetnsError> {
        let per_10k = (pct * 100.0).round().clamp(0.0, 10_000.0) as u32;
        for n in &self.nodes {
            let rules = format!(
                "table netdev {LOSS_TABLE} {{\n chain egress {{\n  type filter hook egress device \"{dev}\" \
                 priority 0; policy accept;\n  udp dport {port} numgen random mod 10000 < {per_10k} counter drop\n \
                 }}\n}}\n",
                dev = n.tx_iface
            );
            // On stdin: no file another user could plant or read.
            exec_in_with_stdin(&n.netns, &["nft", "-f", "-"], rules.as_bytes())?;
            self.loss_tables.push(n.netns.clone());
        }
        Ok(())
    }

    /// Makes `pct` percent of the UDP datagrams every node sends to `port`
    /// fail at the `output` hook (an nftables drop there returns EPERM to
    /// the sender, as a host firewall would): a frame's send then fails
    /// part-way. In a table of our own, removed with the topology.
    ///
    /// # Errors
    ///
    /// [`NetnsError::Command`] when `nft` fails.
    pub fn set_send_fault(&mut self, pct: f64, port: u16) -> Result<(), NetnsError> {
        let per_10k = (pct * 100.0).round().clamp(0.0, 10_000.0) as u32;
        for n in &self.nodes {
            let rules = format!(
                "table inet {FAULT_TABLE} {{\n chain output {{\n  type filter hook output priority 0; policy accept;\n  \
                 udp dport {port} numgen random mod 10000 < {per_10k} counter drop\n }}\n}}\n"
            );
            exec_in_with_stdin(&n.netns, &["nft", "-f", "-"], rules.as_bytes())?;
            self.fault_tables.push(n.netns.clone());
        }
        Ok(())
    }

    /// The nodes, in ring order.
    pub fn nodes(&self) -> &[NodeNet] {
        &self.nodes
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.loss_tables.drain(..) {
            let _ = exec_in(&ns, &["nft", "delete", "table", "netdev", LOSS_TABLE]);
        }
        for ns in self.fault_tables.drain(..) {
            let _ = exec_in(&ns, &["nft", "delete", "table", "inet", FAULT_TABLE]);
        }
        // Deleting a namespace deletes its veths (and their XDP programs).
        for ns in self.created.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                log::warn!("could not remove namespace {ns}: {e}");
            }
        }
    }
}
