//! `leap node --config FILE`: the TOML file operators write, validated with
//! messages that name the field and the fix.
//!
//! ```toml
//! [ring]
//! me = "b"                      # which member this host is
//! frame_size = 16392
//! members = [
//!   { name = "a", addr = "10.0.0.1:9999" },   # the first member is the head
//!   { name = "b", addr = "10.0.0.2:9999" },
//!   { name = "c", addr = "10.0.0.3:9999" },
//! ]
//!
//! [transport]
//! order = ["xdp", "kmod", "udp"]  # first that works here
//! interface = "eth0"              # where frames arrive
//! xdp_mode = "auto"               # auto | drv | skb
//! vlans = []                      # VLAN IDs tagged chunks may carry (XDP)
//! reliability = "reliable"        # reliable | best-effort
//! peer_filter = true              # accept only the previous member (false: the first source, locked)
//! crc = true                      # CRC32C on every frame between leap nodes
//! trains = true                   # several chunks per datagram between leap nodes, up to the path MTU
//! recv_timeout_ms = 1000          # silent-neighbour deadline
//! # window = 64                   # frames in assembly (default: from ring.inflight)
//! # keep_frames = 128             # frames kept for NACKs (default: twice the window)
//! # window_memory_mib = 256       # limit on both, per link
//! # busy_poll_us = 50             # busy-poll the receive sockets (needs CAP_NET_ADMIN; 0: off)
//! # tcp_source_port = 7101        # tcp: connect to the next node from this port
//! # tcp_prev_port = 7101          # tcp: the previous node only from this source port
//! # key_file = "/etc/leap/ring.key"   # keyed ring (not kmod): every frame or datagram tagged (`leap key new`)
//! # previous_key_file = "/etc/leap/old.key"  # still accepted while the ring changes keys
//! # encrypt = false               # with key_file: encrypt frames too (every node alike)
//!
//! [node]
//! log = "info"
//! on_neighbour_loss = "wait"      # wait | exit
//! metrics = "127.0.0.1:9464"      # Prometheus text at /metrics
//! stats_socket = "/run/leap/b.sock"
//! cpus = [2]                      # pin (e.g. near the NIC queue's IRQ)
//! ```

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Queues;
use crate::transport::config::Reliability;
use crate::transport::config::{AttachMode, UnknownName};
use crate::transport::open::TransportKind;

/// The whole file.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    /// The ring.
    pub ring: RingSection,
    /// The transport.
    #[serde(default)]
    pub transport: TransportSection,
    /// The process.
    #[serde(default)]
    pub node: NodeSection,
    /// The keys the file sets, as `section.key` (e.g.
    /// `transport.recv_timeout_ms`), filled in by [`load`]: a key not among
    /// them holds its default.
    #[serde(skip)]
    pub keys: BTreeSet<String>,
}

/// `[ring]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RingSection {
    /// Members in ring order; the first is the head.
    pub members: Vec<Member>,
    /// Name of the member this host is.
    pub me: String,
    /// Bytes per frame.
    #[serde(default = "default_frame_size")]
    pub frame_size: usize,
    /// Head: frames to drive (0: until stopped).
    #[serde(default)]
    pub frames: u64,
    /// Frames in flight (the head sends this many at once; every member's
    /// window and frames kept for NACKs follow it).
    #[serde(default = "one")]
    pub inflight: usize,
    /// Worker: simulated compute per frame, microseconds.
    #[serde(default)]
    pub compute_us: u64,
}

/// One member.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// `ADDR:PORT` it listens on and sends from.
    pub addr: String,
}

/// `[transport]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSection {
    /// Backends to try, in order.
    #[serde(default = "default_order")]
    pub order: Vec<String>,
    /// Interface where frames arrive (XDP attaches there).
    pub interface: Option<String>,
    /// XDP attach mode (checked as it is read).
    #[serde(default, deserialize_with = "attach_mode")]
    pub xdp_mode: AttachMode,
    /// XDP object instead of the embedded one.
    pub xdp_object: Option<PathBuf>,
    /// AF_XDP receive queues: "all" (the default) or a list (checked as it
    /// is read).
    #[serde(default = "all_queues", deserialize_with = "queues")]
    pub queues: Queues,
    /// VLAN IDs a tagged chunk may carry on the XDP path (empty: untagged
    /// chunks only).
    #[serde(default)]
    pub vlans: Vec<u16>,
    /// Loss recovery.
    #[serde(default)]
    pub reliability: Reliability,
    /// Accept frames only from the previous member (off: from the first
    /// source, which is then locked).
    #[serde(default = "yes")]
    pub peer_filter: bool,
    /// CRC32C on every frame between leap nodes.
    #[serde(default = "yes")]
    pub crc: bool,
    /// Chunk trains (several chunks per datagram, up to the path MTU)
    /// between leap nodes that take them.
    #[serde(default = "yes")]
    pub trains: bool,
    /// Receive deadline: a neighbour silent this long is reported.
    #[serde(default = "default_timeout")]
    pub recv_timeout_ms: u64,
    /// Seconds allowed to connect (TCP).
    #[serde(default = "default_setup")]
    pub setup_timeout_s: u64,
    /// Datagram transports: frames in assembly at once (default: derived
    /// from `ring.inflight`).
    pub window: Option<u16>,
    /// Datagram transports: frames kept to answer NACKs (default: derived).
    pub keep_frames: Option<usize>,
    /// Datagram transports: memory the window and the frames kept may take
    /// per link, MiB (default 256).
    pub window_memory_mib: Option<usize>,
    /// Busy-poll the receive sockets this many microseconds per wait and
    /// spin as long before sleeping (`--busy-poll`; 0 or absent: off).
    pub busy_poll_us: Option<u64>,
    /// TCP: connect to the next node from this port (`--tcp-source-port`).
    pub tcp_source_port: Option<u16>,
    /// TCP: accept the previous node only from this source port
    /// (`--tcp-prev-port`).
    pub tcp_prev_port: Option<u16>,
    /// A ring key file (`--key-file`).
    pub key_file: Option<std::path::PathBuf>,
    /// The ring's previous key during a change of keys
    /// (`--previous-key-file`).
    pub previous_key_file: Option<std::path::PathBuf>,
    /// Encrypt frames with the ring key (`--encrypt`).
    #[serde(default)]
    pub encrypt: bool,
}

impl Default for TransportSection {
    fn default() -> Self {
        Self {
            order: default_order(),
            interface: None,
            xdp_mode: AttachMode::Auto,
            xdp_object: None,
            queues: all_queues(),
            vlans: Vec::new(),
            reliability: Reliability::Reliable,
            peer_filter: true,
            crc: true,
            trains: true,
            recv_timeout_ms: default_timeout(),
            setup_timeout_s: default_setup(),
            window: None,
            keep_frames: None,
            window_memory_mib: None,
            busy_poll_us: None,
            tcp_source_port: None,
            tcp_prev_port: None,
            key_file: None,
            previous_key_file: None,
            encrypt: false,
        }
    }
}

/// The longest busy poll a node file may ask for, microseconds.
pub const BUSY_POLL_MAX_US: u64 = 10_000;

/// `[node]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Log level.
    pub log: Option<String>,
    /// `wait` or `exit`.
    pub on_neighbour_loss: Option<String>,
    /// Prometheus endpoint address.
    pub metrics: Option<String>,
    /// Unix socket for `leap stats`.
    pub stats_socket: Option<PathBuf>,
    /// CPUs to run on (e.g. the cores next to the NIC's receive IRQs).
    #[serde(default)]
    pub cpus: Vec<usize>,
}

fn default_frame_size() -> usize {
    16_392
}
fn one() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn default_order() -> Vec<String> {
    vec!["xdp".into(), "kmod".into(), "udp".into()]
}
fn all_queues() -> Queues {
    Queues(None)
}

/// `xdp_mode`: one of the modes, typed as it is read.
fn attach_mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<AttachMode, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map_err(|e: UnknownName| serde::de::Error::custom(format!("transport.xdp_mode: {e}")))
}

/// `queues`: `"all"` or a list of queue numbers, typed and checked as it is
/// read.
fn queues<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Queues, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Name(String),
        List(Vec<i64>),
    }
    let max = leap_common::xdp::MAX_QUEUES;
    let bad = || {
        serde::de::Error::custom(format!(
            "transport.queues: `all` or a list of up to {max} queue numbers below {max}, e.g. [0, 1]"
        ))
    };
    match Given::deserialize(d).map_err(|_: D::Error| bad())? {
        Given::Name(n) if n == "all" => Ok(all_queues()),
        Given::List(l) => l
            .iter()
            .map(|&n| u32::try_from(n).ok())
            .collect::<Option<Vec<u32>>>()
            .filter(|l| crate::transport::xdp::check_queues(l).is_ok())
            .map(|l| Queues(Some(l)))
            .ok_or_else(bad),
        Given::Name(_) => Err(bad()),
    }
}
fn default_timeout() -> u64 {
    1000
}
fn default_setup() -> u64 {
    30
}

/// A configuration problem: the field and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `ring.members[2].addr`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub problem: String,
}

fn err(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError { field: field.into(), problem: problem.into() }
}

/// What the file means for this host, after validation.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// This member's name.
    pub name: String,
    /// Head (index 0) or worker.
    pub is_head: bool,
    /// Member count.
    pub members: usize,
    /// Our address.
    pub listen: SocketAddr,
    /// The next member's.
    pub next: SocketAddr,
    /// The previous member's (peer filter), if filtering.
    pub prev: Option<SocketAddr>,
    /// Backends in order.
    pub order: Vec<TransportKind>,
    /// The validated file.
    pub file: NodeFile,
}

/// Reads and validates a node file.
///
/// # Errors
///
/// [`ConfigError`] naming the field: unreadable file, TOML syntax, unknown
/// field, unknown transport, malformed address, `me` not among the members,
/// a missing interface, bad sizes.
pub fn load(path: &Path) -> Result<NodePlan, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| err(path.display().to_string(), format!("cannot read: {e}")))?;
    let syntax = |e: toml::de::Error| {
        let msg = e.message().to_string();
        err(path.display().to_string(), format!("{msg} (see `leap node --help` for the format)"))
    };
    let mut file: NodeFile = toml::from_str(&text).map_err(syntax)?;
    let table: toml::Table = toml::from_str(&text).map_err(syntax)?;
    file.keys = table
        .iter()
        .filter_map(|(section, v)| Some((section, v.as_table()?)))
        .flat_map(|(section, t)| t.keys().map(move |k| format!("{section}.{k}")))
        .collect();
    validate(file)
}

/// Validates a parsed node file.
///
/// # Errors
///
/// As [`load`].
pub fn validate(file: NodeFile) -> Result<NodePlan, ConfigError> {
    let r = &file.ring;
    if r.members.len() < 2 {
        return Err(err("ring.members", "a ring needs at least 2 members (the first is the head)"));
    }
    let mut addrs = Vec::new();
    for (i, m) in r.members.iter().enumerate() {
        if m.name.is_empty() {
            return Err(err(format!("ring.members[{i}].name"), "empty name"));
        }
        if r.members[..i].iter().any(|o| o.name == m.name) {
            return Err(err(
                format!("ring.members[{i}].name"),
                format!("`{}` appears twice; names must be unique", m.name),
            ));
        }
        let a: SocketAddr = m.addr.parse().map_err(|_| {
            err(
                format!("ring.members[{i}].addr"),
                format!("`{}` is not ADDR:PORT (e.g. 10.0.0.2:9999 or [fd00::2]:9999)", m.addr),
            )
        })?;
        if a.port() == 0 {
            return Err(err(format!("ring.members[{i}].addr"), "port 0: give the port the member listens on"));
        }
        addrs.push(a);
    }
    let Some(me) = r.members.iter().position(|m| m.name == r.me) else {
        let names: Vec<&str> = r.members.iter().map(|m| m.name.as_str()).collect();
        return Err(err(
            "ring.me",
            format!("`{}` is not a member; this host must be one of: {}", r.me, names.join(", ")),
        ));
    };
    let min = leap_common::control::CONTROL_FRAME_MIN;
    if r.frame_size < min || r.frame_size > crate::ring::MAX_FRAME {
        return Err(err("ring.frame_size", format!("{} is outside {min}..={}", r.frame_size, crate::ring::MAX_FRAME)));
    }
    if !(1..=64).contains(&r.inflight) {
        return Err(err("ring.inflight", format!("{} is outside 1..=64", r.inflight)));
    }
    let t = &file.transport;
    if t.order.is_empty() {
        return Err(err("transport.order", "empty: list at least one of tcp, udp, xdp, xdp-ringbuf, kmod"));
    }
    let mut order = Vec::new();
    for (i, name) in t.order.iter().enumerate() {
        let k: TransportKind =
            name.parse().map_err(|e: UnknownName| err(format!("transport.order[{i}]"), e.to_string()))?;
        order.push(k);
    }
    let needs_iface = order.iter().any(|k| matches!(k, TransportKind::Xdp | TransportKind::XdpRingbuf));
    match &t.interface {
        Some(i) if !Path::new("/sys/class/net").join(i).exists() => {
            return Err(err("transport.interface", format!("no interface `{i}` on this host (see `ip link`)")));
        }
        None if needs_iface => {
            return Err(err("transport.interface", "the XDP transports need the interface where frames arrive"));
        }
        _ => {}
    }
    if let Some(us) = t.busy_poll_us
        && us > BUSY_POLL_MAX_US
    {
        return Err(err(
            "transport.busy_poll_us",
            format!(
                "{us} is beyond {BUSY_POLL_MAX_US} us: each wait would spin a CPU that long; 50 is typical, 0 turns it off"
            ),
        ));
    }
    if let Some(v) = t.vlans.iter().find(|&&v| v > 4095) {
        return Err(err("transport.vlans", format!("VLAN ID {v} out of range: 0 to 4095")));
    }
    if t.vlans.len() > leap_common::xdp::MAX_VLANS as usize {
        return Err(err("transport.vlans", format!("at most {} VLANs", leap_common::xdp::MAX_VLANS)));
    }
    if let Some(p) = &t.xdp_object
        && !p.is_file()
    {
        return Err(err("transport.xdp_object", format!("{} is not a file", p.display())));
    }
    let windows = crate::frame::window::Windows::new(
        r.inflight,
        r.frame_size,
        t.window.unwrap_or(0),
        t.keep_frames.unwrap_or(0),
        t.window_memory_mib.map_or(crate::frame::window::DEFAULT_WINDOW_MEMORY, |m| m.saturating_mul(1 << 20)),
    );
    if let Err(e) = windows {
        use crate::frame::window::{Part, WindowError};
        let field = match e {
            WindowError::TooSmall { what: Part::Window, .. } | WindowError::TooLarge { what: Part::Window, .. } => {
                "transport.window"
            }
            WindowError::TooSmall { .. } | WindowError::TooLarge { .. } => "transport.keep_frames",
            WindowError::OverMemory { .. } => "transport.window_memory_mib",
        };
        return Err(err(field, format!("with ring.inflight = {}: {e}", r.inflight)));
    }
    let n = &file.node;
    if let Some(p) = &n.on_neighbour_loss
        && p != "wait"
        && p != "exit"
    {
        return Err(err("node.on_neighbour_loss", format!("`{p}`: choose wait or exit")));
    }
    if let Some(m) = &n.metrics
        && m.parse::<SocketAddr>().is_err()
    {
        return Err(err("node.metrics", format!("`{m}` is not ADDR:PORT, e.g. 127.0.0.1:9464")));
    }
    if let Some(l) = &n.log
        && l.parse::<log::LevelFilter>().is_err()
    {
        return Err(err("node.log", format!("`{l}`: choose error, warn, info, debug or trace")));
    }
    if let Err(e) = crate::sys::check_cpus(&n.cpus) {
        return Err(err("node.cpus", format!("{e}: list CPUs of this machine")));
    }
    let len = r.members.len();
    Ok(NodePlan {
        name: r.me.clone(),
        is_head: me == 0,
        members: len,
        listen: addrs[me],
        next: addrs[(me + 1) % len],
        prev: t.peer_filter.then_some(addrs[(me + len - 1) % len]),
        order,
        file,
    })
}

/// Effective capabilities of this process (bit n = capability n).
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_string())))
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0)
}

/// What `kind` needs that this process lacks, named as capabilities.
pub fn missing_privileges(kind: TransportKind) -> Option<String> {
    missing_capabilities(kind)
}

/// Why the XDP program cannot be loaded here, if it cannot: loads it into
/// the kernel (the verifier runs, nothing is attached) with this process's
/// own capabilities, so the answer is the kernel's, not a guess from a list.
pub fn xdp_load_problem(object: Option<&Path>) -> Option<String> {
    let source = crate::transport::xdp::ObjectSource::from_option(object.map(Path::to_path_buf));
    match crate::transport::xdp::program::XdpProgram::load(&source) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "the kernel refuses the XDP program with this process's capabilities ({e}); the packaged unit \
             grants CAP_BPF, CAP_NET_ADMIN and CAP_NET_RAW"
        )),
    }
}

/// The capabilities a backend needs that this process lacks.
fn missing_capabilities(kind: TransportKind) -> Option<String> {
    const NET_ADMIN: u32 = 12;
    const NET_RAW: u32 = 13;
    const SYS_ADMIN: u32 = 21;
    const BPF: u32 = 39;
    let caps = effective_caps();
    let has = |c: u32| caps & (1 << c) != 0;
    match kind {
        TransportKind::Xdp | TransportKind::XdpRingbuf => {
            let mut miss = Vec::new();
            if !has(BPF) && !has(SYS_ADMIN) {
                miss.push("CAP_BPF");
            }
            if !has(NET_ADMIN) {
                miss.push("CAP_NET_ADMIN");
            }
            if kind == TransportKind::Xdp && !has(NET_RAW) {
                miss.push("CAP_NET_RAW");
            }
            (!miss.is_empty()).then(|| {
                format!(
                    "{kind} needs {} (run as root, or grant them: see leap-user/packaging/leap-node@.service)",
                    miss.join(", ")
                )
            })
        }
        TransportKind::Kmod => {
            let dev = leap_common::kmod::DEVICE_PATH;
            if !Path::new(dev).exists() {
                Some(format!("{dev} is missing: load the module (modprobe leap_kmod, or DKMS: see kmod/dkms.conf)"))
            } else {
                // The module itself refuses an opener without CAP_NET_ADMIN
                // (EPERM); the file mode gives EACCES.
                match std::fs::OpenOptions::new().read(true).write(true).open(dev) {
                    Ok(_) => None,
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => Some(format!(
                        "cannot open {dev}: leap_kmod needs CAP_NET_ADMIN in this network namespace (run as root, or grant it: see leap-user/packaging/leap-node@.service)"
                    )),
                    Err(e) => Some(format!(
                        "cannot open {dev} ({e}): run as root or give the service user access to the device (leap-user/packaging/99-leap.rules)"
                    )),
                }
            }
        }
        TransportKind::Tcp | TransportKind::Udp => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NodePlan, ConfigError> {
        validate(toml::from_str(s).map_err(|e| err("toml", e.to_string()))?)
    }

    const GOOD: &str = r#"
[ring]
me = "b"
members = [{ name = "a", addr = "127.0.0.1:9000" }, { name = "b", addr = "127.0.0.1:9001" }, { name = "c", addr = "127.0.0.1:9002" }]
[transport]
order = ["udp"]
"#;

    #[test]
    fn trains_are_on_unless_the_file_turns_them_off() {
        assert!(parse(GOOD).unwrap().file.transport.trains);
        let off = GOOD.replace("order = [\"udp\"]", "order = [\"udp\"]\ntrains = false");
        assert!(!parse(&off).unwrap().file.transport.trains);
    }

    #[test]
    fn a_good_file_resolves_neighbours() {
        let p = parse(GOOD).unwrap();
        assert!(!p.is_head);
        assert_eq!(p.next.port(), 9002);
        assert_eq!(p.prev.unwrap().port(), 9000);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (GOOD.replace("[\"udp\"]", "[\"udp\", \"pigeon\"]"), "transport.order[1]"),
            (GOOD.replace("127.0.0.1:9002", "127.0.0.300:9002"), "ring.members[2].addr"),
            (GOOD.replace("\nme = \"b\"", "\nme = \"z\""), "ring.me"),
            (GOOD.replace("order = [\"udp\"]", "order = [\"udp\"]\ninterface = \"nope0\""), "transport.interface"),
            (GOOD.replace("order = [\"udp\"]", "order = [\"xdp\"]"), "transport.interface"),
            (GOOD.replace("\nme = \"b\"", "\nme = \"b\"\ninflight = 48") + "window = 16\n", "transport.window"),
            (
                GOOD.replace("\nme = \"b\"", "\nme = \"b\"\ninflight = 48") + "keep_frames = 8\n",
                "transport.keep_frames",
            ),
            (
                GOOD.replace("\nme = \"b\"", "\nme = \"b\"\nframe_size = 67108864\ninflight = 8"),
                "transport.window_memory_mib",
            ),
        ];
        for (text, field) in cases {
            let e = parse(&text).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }
}
