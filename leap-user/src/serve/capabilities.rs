//! What a host can run: transports its privileges, kernel, module and
//! interfaces allow, and each interface's driver, MTU and queues, read from
//! sysfs (no ethtool, no netlink).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::transport::open::TransportKind;

/// Interfaces listed at most (a host with hundreds of VLANs stays small).
pub const MAX_INTERFACES: usize = 32;

/// Drivers known to offer AF_XDP zero-copy (in mainline since 5.x).
const ZERO_COPY_DRIVERS: [&str; 9] = ["i40e", "ice", "ixgbe", "igc", "mlx5_core", "stmmac", "igb", "idpf", "bnxt_en"];

/// One transport on one host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TransportSupport {
    /// Backend.
    pub transport: TransportKind,
    /// Why it cannot run here (`None`: it can).
    pub unavailable: Option<String>,
}

/// One network interface, as sysfs describes it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Interface {
    /// Name.
    pub name: String,
    /// Kernel driver of the device (`None`: virtual, e.g. veth or lo).
    pub driver: Option<String>,
    /// MTU in bytes.
    pub mtu: Option<u32>,
    /// Receive queues.
    pub rx_queues: usize,
    /// Transmit queues.
    pub tx_queues: usize,
    /// AF_XDP zero-copy: `Some(true)` for drivers known to offer it,
    /// `Some(false)` for virtual devices, `None` when only binding tells.
    pub zero_copy: Option<bool>,
}

/// What `leap serve` reports about its host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct HostCapabilities {
    /// Host name (`/proc/sys/kernel/hostname`).
    pub hostname: String,
    /// `uname -r`.
    pub kernel: String,
    /// `leap` version of the agent.
    pub leap_version: String,
    /// Every transport, with why it cannot run where it cannot.
    pub transports: Vec<TransportSupport>,
    /// Network interfaces (at most [`MAX_INTERFACES`]).
    pub interfaces: Vec<Interface>,
}

impl HostCapabilities {
    /// Why `kind` cannot run on this host, if it cannot.
    pub fn unavailable(&self, kind: TransportKind) -> Option<String> {
        match self.transports.iter().find(|t| t.transport == kind) {
            Some(t) => t.unavailable.clone(),
            None => Some(format!("the agent (leap {}) does not know {kind}", self.leap_version)),
        }
    }

    /// The interface called `name`, if the host has it.
    pub fn interface(&self, name: &str) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.name == name)
    }
}

/// Probes this host: what the process's capabilities, the kernel module and
/// the XDP object (`xdp_object_ok`) allow.
pub fn probe(xdp_object_ok: bool) -> HostCapabilities {
    probe_with(xdp_object_ok, None)
}

/// [`probe`], loading the XDP program from `xdp_object` (else the embedded
/// one) to let the kernel's verifier say whether it runs here.
pub fn probe_with(xdp_object_ok: bool, xdp_object: Option<&Path>) -> HostCapabilities {
    // One load answers for both XDP transports.
    let loaded = std::cell::OnceCell::new();
    let xdp_load = |_k: TransportKind| loaded.get_or_init(|| crate::cli::config::xdp_load_problem(xdp_object)).clone();
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let transports = TransportKind::ALL
        .iter()
        .map(|&k| {
            let mut why = crate::cli::config::missing_privileges(k);
            if why.is_none() && matches!(k, TransportKind::Xdp | TransportKind::XdpRingbuf) && !xdp_object_ok {
                why = Some(
                    "no XDP object: build leap with `cargo xtask build`, or start `leap serve --xdp-object PATH`"
                        .into(),
                );
            }
            if why.is_none() && matches!(k, TransportKind::Xdp | TransportKind::XdpRingbuf) {
                why = xdp_load(k);
            }
            TransportSupport { transport: k, unavailable: why }
        })
        .collect();
    HostCapabilities {
        hostname: read("/proc/sys/kernel/hostname"),
        kernel: read("/proc/sys/kernel/osrelease"),
        leap_version: env!("CARGO_PKG_VERSION").into(),
        transports,
        interfaces: interfaces(Path::new("/sys/class/net")),
    }
}

/// The interfaces under `root` (`/sys/class/net`), sorted by name.
pub fn interfaces(root: &Path) -> Vec<Interface> {
    let Ok(dir) = std::fs::read_dir(root) else { return Vec::new() };
    let mut names: Vec<String> = dir.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    names.truncate(MAX_INTERFACES);
    names.into_iter().map(|n| interface(&root.join(&n), n)).collect()
}

fn interface(dir: &Path, name: String) -> Interface {
    let driver = std::fs::read_link(dir.join("device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
    let mtu = std::fs::read_to_string(dir.join("mtu")).ok().and_then(|s| s.trim().parse().ok());
    let queues = |prefix: &str| {
        std::fs::read_dir(dir.join("queues"))
            .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).count())
            .unwrap_or(0)
    };
    let zero_copy = match &driver {
        None => Some(false),
        Some(d) if ZERO_COPY_DRIVERS.contains(&d.as_str()) => Some(true),
        Some(_) => None,
    };
    Interface { name, driver, mtu, rx_queues: queues("rx-"), tx_queues: queues("tx-"), zero_copy }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_are_read_from_a_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("leap-sysfs-{}", std::process::id()));
        let eth = root.join("eth0");
        std::fs::create_dir_all(eth.join("queues/rx-0")).unwrap();
        std::fs::create_dir_all(eth.join("queues/rx-1")).unwrap();
        std::fs::create_dir_all(eth.join("queues/tx-0")).unwrap();
        std::fs::create_dir_all(root.join("drivers/ice")).unwrap();
        std::fs::create_dir_all(eth.join("device")).unwrap();
        std::os::unix::fs::symlink(root.join("drivers/ice"), eth.join("device/driver")).unwrap();
        std::fs::write(eth.join("mtu"), "9000\n").unwrap();
        std::fs::create_dir_all(root.join("veth0")).unwrap();
        let got = interfaces(&root);
        let _ = std::fs::remove_dir_all(&root);
        let eth = got.iter().find(|i| i.name == "eth0").unwrap();
        assert_eq!(eth.driver.as_deref(), Some("ice"));
        assert_eq!((eth.mtu, eth.rx_queues, eth.tx_queues, eth.zero_copy), (Some(9000), 2, 1, Some(true)));
        let veth = got.iter().find(|i| i.name == "veth0").unwrap();
        assert_eq!((veth.driver.clone(), veth.zero_copy), (None, Some(false)));
    }

    #[test]
    fn tcp_and_udp_run_anywhere() {
        let c = probe(false);
        assert_eq!(c.unavailable(TransportKind::Tcp), None);
        assert_eq!(c.unavailable(TransportKind::Udp), None);
    }
}
