//! Settings by name: one way for code outside Rust (the C library, the
//! Python package, the C++ drop-in's environment) to open any backend with
//! the settings a node file has. Keys are the node file's `[transport]`
//! names (`recv_timeout_ms`, `window`, `crc`, ...), plus where the node sits
//! (`listen`, `next`, `prev`, `interface`) and the ring's `frame_size` and
//! `inflight`; every value is text, checked when it is set, and an error
//! names the key and the fix.
//!
//! ```no_run
//! use leap::transport::settings::Settings;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut s = Settings::new("udp".parse()?);
//! s.set("listen", "127.0.0.1:9999")?;
//! s.set("next", "127.0.0.1:10000")?;
//! s.set("recv_timeout_ms", "500")?;
//! let mut t = s.open()?;
//! t.send_next(&[0u8; 16392])?;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::config::{AttachMode, Endpoint, Options, Reliability, TcpFraming};
use super::open::TransportKind;
use super::{Result, Transport, TransportError};

/// The longest busy poll a setting may ask for, microseconds (each wait
/// would spin a CPU that long).
pub const BUSY_POLL_MAX_US: u64 = 10_000;

/// Every key [`Settings::set`] takes, with what it sets.
pub const KEYS: &[(&str, &str)] = &[
    ("listen", "ADDR:PORT this node listens on and sends from"),
    ("next", "ADDR:PORT of the next node"),
    ("prev", "ADDR:PORT of the previous node: frames only from it (default: the first source, locked)"),
    ("interface", "interface where frames arrive (xdp, xdp-ringbuf)"),
    ("frame_size", "largest frame in bytes (tcp raw framing: every frame's size)"),
    ("inflight", "frames the ring keeps in flight (1..=64; the window follows it)"),
    ("recv_timeout_ms", "receive deadline in milliseconds (0: none, wait for ever)"),
    ("setup_timeout_s", "seconds allowed to connect (tcp)"),
    ("reliability", "reliable | best-effort"),
    ("crc", "true | false: CRC32C on every frame between leap nodes"),
    ("trains", "true | false: several chunks per datagram between leap nodes"),
    ("gso", "true | false: UDP segmentation offload"),
    ("window", "frames in assembly (default: from inflight)"),
    ("keep_frames", "frames kept for NACKs (default: twice the window)"),
    ("window_memory_mib", "memory the window and the kept frames may take per link, MiB"),
    ("busy_poll_us", "busy-poll the receive sockets this long, microseconds (0: off)"),
    ("spin_us", "spin on receives this long before sleeping, microseconds"),
    ("xdp_mode", "auto | drv | skb"),
    ("xdp_object", "path of an XDP object to load instead of the embedded one"),
    ("queues", "all, or receive queues such as 0,1 (xdp)"),
    ("vlans", "VLAN IDs tagged chunks may carry, such as 10,20 (xdp; empty: untagged only)"),
    ("tcp_framing", "raw (the original's wire) | length"),
    ("tcp_source_port", "tcp: connect to the next node from this port (not the listen port; 0: any)"),
    ("tcp_prev_port", "tcp: accept the previous node only from this source port (its tcp_source_port; 0: any)"),
    ("original_compat", "true | false: send chunks exactly like the original"),
    ("key_file", "a ring key file (0600, made by `leap key new`): every frame tagged (tcp)"),
    ("previous_key_file", "the ring's previous key, still accepted while the ring changes keys"),
    ("encrypt", "true | false: encrypt frames with the ring key (every node alike)"),
];

/// A setting that cannot be taken: which key, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
#[non_exhaustive]
pub struct SettingError {
    /// The key as given.
    pub key: String,
    /// What is wrong and how to fix it.
    pub problem: String,
}

fn bad(key: &str, problem: impl Into<String>) -> SettingError {
    SettingError { key: key.into(), problem: problem.into() }
}

/// The ring key in the file at `v`.
fn key_file(key: &str, v: &str) -> Result<super::ring_key::RingKey, SettingError> {
    super::ring_key::RingKey::from_file(std::path::Path::new(v)).map_err(|e| bad(key, e.to_string()))
}

/// A port, 0 meaning none.
fn port(key: &str, v: &str) -> Result<Option<u16>, SettingError> {
    Ok(std::num::NonZeroU16::new(number(key, v, 0, u64::from(u16::MAX))? as u16).map(u16::from))
}

/// A transport's kind, where it sits and how it is opened, built up by name.
#[derive(Clone, Debug)]
pub struct Settings {
    kind: TransportKind,
    listen: Option<SocketAddr>,
    next: Option<SocketAddr>,
    prev: Option<SocketAddr>,
    interface: Option<String>,
    options: Options,
    /// `previous_key_file` and `encrypt`, kept until `key_file` comes.
    previous_key: Option<super::ring_key::RingKey>,
    encrypt: bool,
}

impl Settings {
    /// The defaults of `kind` (those of a node file without the key).
    pub fn new(kind: TransportKind) -> Self {
        Self {
            kind,
            listen: None,
            next: None,
            prev: None,
            interface: None,
            options: Options::default(),
            previous_key: None,
            encrypt: false,
        }
    }

    /// The transport this opens.
    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    /// The options as set so far.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Sets `key` (one of [`KEYS`]) from its text.
    ///
    /// # Errors
    ///
    /// An unknown key (the error lists the keys) or a value it cannot take
    /// (the error says what it takes).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SettingError> {
        let v = value.trim();
        let o = &mut self.options;
        match key {
            "listen" => self.listen = Some(addr(key, v)?),
            "next" => self.next = Some(addr(key, v)?),
            "prev" => self.prev = if v.is_empty() { None } else { Some(addr(key, v)?) },
            "interface" => {
                if v.is_empty() || v.len() > 15 || v.contains(['/', ' ']) {
                    return Err(bad(key, format!("`{v}` is not an interface name (see `ip link`)")));
                }
                self.interface = Some(v.into());
            }
            "frame_size" => {
                let max = leap_common::chunk::FRAME_LEN_MAX;
                o.frame_len = number(key, v, 1, max as u64)? as usize;
            }
            "inflight" => o.inflight = number(key, v, 1, 64)? as usize,
            "recv_timeout_ms" => {
                let ms = number(key, v, 0, 86_400_000)?;
                o.recv_timeout = (ms > 0).then(|| Duration::from_millis(ms));
            }
            "setup_timeout_s" => o.setup_timeout = Duration::from_secs(number(key, v, 1, 86_400)?),
            "reliability" => {
                o.reliability = match v {
                    "reliable" => Reliability::Reliable,
                    "best-effort" => Reliability::BestEffort,
                    _ => return Err(bad(key, format!("`{v}`: choose reliable or best-effort"))),
                }
            }
            "crc" => o.crc = boolean(key, v)?,
            "trains" => o.trains = boolean(key, v)?,
            "gso" => o.gso = boolean(key, v)?,
            "original_compat" => o.original_compat = boolean(key, v)?,
            "window" => o.window = Some(number(key, v, 1, u64::from(u16::MAX))? as u16),
            "keep_frames" => o.keep_frames = Some(number(key, v, 1, 1 << 20)? as usize),
            "window_memory_mib" => {
                o.window_memory = (number(key, v, 1, 1 << 20)? as usize).saturating_mul(1 << 20);
            }
            "busy_poll_us" => {
                let us = number(key, v, 0, BUSY_POLL_MAX_US)
                    .map_err(|e| bad(key, format!("{}; 50 is typical, 0 turns it off", e.problem)))?;
                o.busy_poll = (us > 0).then(|| Duration::from_micros(us));
            }
            "spin_us" => o.spin = Duration::from_micros(number(key, v, 0, 1_000_000)?),
            "xdp_mode" => o.xdp_mode = v.parse::<AttachMode>().map_err(|e| bad(key, e.to_string()))?,
            "xdp_object" => {
                let p = PathBuf::from(v);
                if !p.is_file() {
                    return Err(bad(key, format!("{v} is not a file")));
                }
                o.xdp_object = Some(p);
            }
            "queues" => {
                let max = u64::from(leap_common::xdp::MAX_QUEUES);
                o.xdp_queues = if v == "all" {
                    None
                } else {
                    let q: Vec<u32> = list(key, v, 0, max - 1)?.into_iter().map(|n| n as u32).collect();
                    if super::xdp::check_queues(&q).is_err() {
                        return Err(bad(key, format!("`all` or up to {max} queue numbers, such as 0,1")));
                    }
                    Some(q)
                };
            }
            "vlans" => {
                let v = list(key, v, 0, 4095)?;
                if v.len() > leap_common::xdp::MAX_VLANS as usize {
                    return Err(bad(key, format!("at most {} VLANs", leap_common::xdp::MAX_VLANS)));
                }
                o.xdp_vlans = v.into_iter().map(|n| n as u16).collect();
            }
            "tcp_framing" => {
                o.tcp_framing = match v {
                    "raw" => TcpFraming::Raw,
                    "length" => TcpFraming::Length,
                    _ => return Err(bad(key, format!("`{v}`: choose raw or length"))),
                }
            }
            "tcp_source_port" => o.tcp_source_port = port(key, v)?,
            "tcp_prev_port" => o.tcp_prev_port = port(key, v)?,
            "key_file" => {
                let current = key_file(key, v)?;
                o.ring_key = Some(super::ring_key::KeySet {
                    previous: self.previous_key.clone(),
                    encrypt: self.encrypt,
                    ..super::ring_key::KeySet::new(current)
                });
            }
            "previous_key_file" => {
                self.previous_key = if v.is_empty() { None } else { Some(key_file(key, v)?) };
                if let Some(k) = &mut o.ring_key {
                    k.previous.clone_from(&self.previous_key);
                }
            }
            "encrypt" => {
                self.encrypt = boolean(key, v)?;
                if let Some(k) = &mut o.ring_key {
                    k.encrypt = self.encrypt;
                }
            }
            _ => {
                let keys: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
                return Err(bad(key, format!("unknown setting; the settings are: {}", keys.join(", "))));
            }
        }
        Ok(())
    }

    /// The endpoint, once `listen` and `next` are set.
    ///
    /// # Errors
    ///
    /// The first of them that is missing, or an interface missing for XDP.
    pub fn endpoint(&self) -> Result<Endpoint, SettingError> {
        let listen = self.listen.ok_or_else(|| bad("listen", "not set: give ADDR:PORT this node listens on"))?;
        let next = self.next.ok_or_else(|| bad("next", "not set: give ADDR:PORT of the next node"))?;
        let mut ep = Endpoint::new(listen, next);
        ep.prev = self.prev;
        if let Some(i) = &self.interface {
            ep = ep.with_iface(i);
        } else if matches!(self.kind, TransportKind::Xdp | TransportKind::XdpRingbuf) {
            return Err(bad("interface", format!("{} needs the interface frames arrive on", self.kind)));
        }
        Ok(ep)
    }

    /// Checks that the settings go together (endpoint complete, window and
    /// kept frames within memory), without opening anything.
    ///
    /// # Errors
    ///
    /// The first problem, with the key to change.
    pub fn check(&self) -> Result<Endpoint, SettingError> {
        let ep = self.endpoint()?;
        if let Err(e) = self.options.windows() {
            use crate::frame::window::{Part, WindowError};
            let key = match e {
                WindowError::TooSmall { what: Part::Window, .. } | WindowError::TooLarge { what: Part::Window, .. } => {
                    "window"
                }
                WindowError::TooSmall { .. } | WindowError::TooLarge { .. } => "keep_frames",
                WindowError::OverMemory { .. } => "window_memory_mib",
            };
            return Err(bad(key, format!("with inflight = {}: {e}", self.options.inflight)));
        }
        Ok(ep)
    }

    /// Opens the transport (for TCP: connects to the next node and accepts
    /// the previous one, both within `setup_timeout_s`).
    ///
    /// # Errors
    ///
    /// [`TransportError::Setting`] for settings that do not go together,
    /// else what the backend reports.
    pub fn open(&self) -> Result<Box<dyn Transport>> {
        let ep = self.check().map_err(TransportError::Setting)?;
        super::open::open(self.kind, &ep, &self.options)
    }
}

fn addr(key: &str, v: &str) -> Result<SocketAddr, SettingError> {
    let a: SocketAddr =
        v.parse().map_err(|_| bad(key, format!("`{v}` is not ADDR:PORT (e.g. 10.0.0.2:9999 or [fd00::2]:9999)")))?;
    if a.port() == 0 {
        return Err(bad(key, "port 0: give the port the node listens on"));
    }
    Ok(a)
}

fn number(key: &str, v: &str, min: u64, max: u64) -> Result<u64, SettingError> {
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(bad(key, format!("`{v}` is not a whole number in {min}..={max}"))),
    }
}

fn boolean(key: &str, v: &str) -> Result<bool, SettingError> {
    match v {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(bad(key, format!("`{v}`: choose true or false"))),
    }
}

/// `0,1`, `[0, 1]` or empty.
fn list(key: &str, v: &str, min: u64, max: u64) -> Result<Vec<u64>, SettingError> {
    let inner = v.strip_prefix('[').and_then(|s| s.strip_suffix(']')).unwrap_or(v);
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            number(key, s, min, max).map_err(|_| bad(key, format!("`{s}` in `{v}` is not a number in {min}..={max}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp() -> Settings {
        Settings::new(TransportKind::Udp)
    }

    #[test]
    fn every_key_is_taken_with_a_good_value() {
        let good = [
            ("listen", "127.0.0.1:9000"),
            ("next", "127.0.0.1:9001"),
            ("prev", "127.0.0.1:9002"),
            ("interface", "lo"),
            ("frame_size", "16392"),
            ("inflight", "8"),
            ("recv_timeout_ms", "250"),
            ("setup_timeout_s", "5"),
            ("reliability", "best-effort"),
            ("crc", "false"),
            ("trains", "no"),
            ("gso", "0"),
            ("window", "32"),
            ("keep_frames", "64"),
            ("window_memory_mib", "64"),
            ("busy_poll_us", "50"),
            ("spin_us", "10"),
            ("xdp_mode", "skb"),
            ("xdp_object", "/proc/self/status"),
            ("queues", "[0, 1]"),
            ("vlans", "10,20"),
            ("tcp_framing", "length"),
            ("original_compat", "true"),
            ("tcp_source_port", "7101"),
            ("tcp_prev_port", "7102"),
            // Before the key: kept until it comes.
            ("encrypt", "true"),
            ("previous_key_file", "OLD"),
            ("key_file", "NEW"),
        ];
        assert_eq!(good.len(), KEYS.len(), "a key without a test");
        let dir = std::env::temp_dir().join(format!("leap-settings-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (old, new) =
            (super::super::ring_key::RingKey::random().unwrap(), super::super::ring_key::RingKey::random().unwrap());
        let (old_path, new_path) = (dir.join("old.key"), dir.join("new.key"));
        crate::secret_file::create(&old_path, &old.to_file_text()).unwrap();
        crate::secret_file::create(&new_path, &new.to_file_text()).unwrap();
        let mut s = udp();
        for (k, v) in good {
            let v = match v {
                "OLD" => old_path.to_str().unwrap(),
                "NEW" => new_path.to_str().unwrap(),
                v => v,
            };
            s.set(k, v).unwrap_or_else(|e| panic!("{k} = {v}: {e}"));
        }
        let _ = std::fs::remove_dir_all(&dir);
        let o = s.options();
        assert_eq!(
            o.ring_key,
            Some(super::super::ring_key::KeySet {
                previous: Some(old),
                encrypt: true,
                ..super::super::ring_key::KeySet::new(new)
            })
        );
        assert_eq!((o.frame_len, o.inflight, o.window, o.keep_frames), (16392, 8, Some(32), Some(64)));
        assert_eq!(o.recv_timeout, Some(Duration::from_millis(250)));
        assert_eq!((o.crc, o.trains, o.gso, o.original_compat), (false, false, false, true));
        assert_eq!(o.xdp_queues, Some(vec![0, 1]));
        assert_eq!(o.xdp_vlans, vec![10, 20]);
        assert_eq!(o.busy_poll, Some(Duration::from_micros(50)));
        assert_eq!(o.tcp_framing, TcpFraming::Length);
        assert_eq!((o.tcp_source_port, o.tcp_prev_port), (Some(7101), Some(7102)));
        let ep = s.check().unwrap();
        assert_eq!((ep.listen.port(), ep.next.port(), ep.prev.map(|p| p.port())), (9000, 9001, Some(9002)));
    }

    #[test]
    fn bad_values_name_the_key_and_what_it_takes() {
        let cases = [
            ("listen", "localhost", "ADDR:PORT"),
            ("next", "127.0.0.1:0", "port 0"),
            ("frame_size", "0", "1..="),
            ("inflight", "65", "1..=64"),
            ("reliability", "sometimes", "reliable or best-effort"),
            ("crc", "maybe", "true or false"),
            ("busy_poll_us", "20000", "0 turns it off"),
            ("xdp_mode", "turbo", "auto, drv, skb"),
            ("xdp_object", "/nonexistent/leap.o", "not a file"),
            ("queues", "0,64", "0..=63"),
            ("vlans", "4096", "0..=4095"),
            ("tcp_framing", "json", "raw or length"),
            ("pigeon", "1", "the settings are: listen, next"),
        ];
        for (k, v, want) in cases {
            let e = udp().set(k, v).unwrap_err();
            assert_eq!(e.key, k);
            assert!(e.to_string().contains(want), "{k} = {v}: {e}");
        }
    }

    #[test]
    fn settings_that_do_not_go_together_are_refused_before_opening() {
        let mut s = udp();
        assert_eq!(s.check().unwrap_err().key, "listen");
        s.set("listen", "127.0.0.1:9000").unwrap();
        assert_eq!(s.check().unwrap_err().key, "next");
        s.set("next", "127.0.0.1:9001").unwrap();
        s.set("inflight", "48").unwrap();
        s.set("window", "16").unwrap();
        assert_eq!(s.check().unwrap_err().key, "window");
        let mut x = Settings::new(TransportKind::Xdp);
        x.set("listen", "127.0.0.1:9000").unwrap();
        x.set("next", "127.0.0.1:9001").unwrap();
        assert_eq!(x.check().unwrap_err().key, "interface");
        assert!(matches!(x.open(), Err(TransportError::Setting(e)) if e.key == "interface"));
    }

    #[test]
    fn zero_means_no_deadline_and_no_busy_poll() {
        let mut s = udp();
        s.set("recv_timeout_ms", "0").unwrap();
        s.set("busy_poll_us", "0").unwrap();
        assert_eq!((s.options().recv_timeout, s.options().busy_poll), (None, None));
    }
}
