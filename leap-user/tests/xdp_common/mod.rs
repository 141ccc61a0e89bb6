//! Shared by the privileged XDP tests (`tests/xdp_*.rs`): the object to
//! load, running code inside a test namespace, reading what the kernel
//! reports about an interface.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::PathBuf;
use std::process::Command;

use leap::transport::xdp::ObjectSource;

/// The object built by `cargo xtask build-ebpf`: `$LEAP_XDP_OBJECT`, else
/// `target/bpf/leap-xdp.o` of the workspace.
pub fn object() -> ObjectSource {
    if let Some(p) = std::env::var_os("LEAP_XDP_OBJECT").filter(|p| !p.is_empty()) {
        return ObjectSource::File(PathBuf::from(p));
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bpf/leap-xdp.o");
    assert!(p.is_file(), "no XDP object at {}: run `cargo xtask build-ebpf` first", p.display());
    ObjectSource::File(p)
}

/// Runs `f` on a fresh thread inside the network namespace at `path`
/// ([`leap::netns::NodeNet::path`]).
pub fn in_netns<T: Send + 'static>(path: PathBuf, f: impl FnOnce() -> T + Send + 'static) -> T {
    leap::netns::run_in(&path, f).expect("setns")
}

/// `ip -d link show dev IFACE` inside `netns`.
pub fn link_details(netns: &str, iface: &str) -> String {
    let out =
        Command::new("ip").args(["netns", "exec", netns, "ip", "-d", "link", "show", "dev", iface]).output().unwrap();
    assert!(out.status.success(), "ip link show {iface}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The XDP attachment the kernel reports for an interface: `"xdp"` (native),
/// `"xdpgeneric"`, or `None`.
pub fn xdp_attachment(netns: &str, iface: &str) -> Option<&'static str> {
    let d = link_details(netns, iface);
    if d.contains("xdpgeneric") {
        Some("xdpgeneric")
    } else if d.lines().any(|l| l.trim_start().starts_with("prog/xdp") || l.contains(" xdp ")) {
        Some("xdp")
    } else {
        None
    }
}

/// A namespace/interface name prefix that includes the process id, so that
/// test runs of several developers on one machine do not clash (veth and
/// pin names are global to the host's bpffs). At most 8 characters for a
/// 3-character `prefix`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", std::process::id() % 100_000)
}

/// A frame whose bytes depend on `seed` and position.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(seed).to_le_bytes()[1]).collect()
}
