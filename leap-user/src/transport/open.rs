//! Choosing and opening a backend by name, for the CLI, the ring runner and
//! embedders that take the transport from configuration.

pub use super::config::{Endpoint, Options, UnknownName, udp_config};
use super::tcp::{TcpConfig, TcpTransport};
use super::udp::UdpTransport;
use super::{Result, Transport};

/// The ways to move a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// Reliable TCP stream.
    Tcp,
    /// UDP in the LEAP chunk format.
    Udp,
    /// XDP program steering chunks into AF_XDP sockets.
    Xdp,
    /// XDP program copying chunks into a BPF ring buffer.
    XdpRingbuf,
    /// The `leap_kmod` kernel module (`/dev/leap_tensor`).
    Kmod,
}

impl TransportKind {
    /// Every kind, in the order of the docs.
    pub const ALL: [TransportKind; 5] = [Self::Tcp, Self::Udp, Self::Xdp, Self::XdpRingbuf, Self::Kmod];

    /// The name used on the command line and in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Xdp => "xdp",
            Self::XdpRingbuf => "xdp-ringbuf",
            Self::Kmod => "kmod",
        }
    }

    /// Whether frames travel as LEAP chunks (and so can be lost).
    pub fn is_datagram(self) -> bool {
        self != Self::Tcp
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TransportKind {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, UnknownName> {
        const NAMES: [&str; TransportKind::ALL.len()] = {
            let mut names = [""; TransportKind::ALL.len()];
            let mut i = 0;
            while i < names.len() {
                names[i] = TransportKind::ALL[i].as_str();
                i += 1;
            }
            names
        };
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| UnknownName {
            what: "transport",
            name: s.into(),
            choices: &NAMES,
        })
    }
}

/// Opens a backend of `kind` for `ep`.
///
/// # Errors
///
/// What the backend reports, or [`super::TransportError::Unsupported`] for a
/// backend this build does not have.
pub fn open(kind: TransportKind, ep: &Endpoint, opts: &Options) -> Result<Box<dyn Transport>> {
    if opts.ring_key.is_some() && kind == TransportKind::Kmod {
        // Never an unkeyed ring in place of a keyed one.
        return Err(super::TransportError::Setting(super::settings::SettingError {
            key: "key_file".into(),
            problem: "the kernel module cannot check ring-key tags: use transport = \"udp\", \"xdp\", \
                      \"xdp-ringbuf\" or \"tcp\" for a keyed ring, or drop key_file to run kmod unkeyed"
                .into(),
        }));
    }
    match kind {
        TransportKind::Tcp => {
            let mut c = TcpConfig::new(ep.listen, ep.next, opts.frame_len);
            c.prev = ep.prev.map(|a| a.ip());
            c.framing = opts.tcp_framing;
            c.source_port = opts.tcp_source_port;
            c.prev_port = opts.tcp_prev_port;
            c.ring_key.clone_from(&opts.ring_key);
            c.recv_timeout = opts.recv_timeout;
            c.setup_timeout = opts.setup_timeout;
            Ok(Box::new(TcpTransport::connect(c)?))
        }
        TransportKind::Udp => Ok(Box::new(UdpTransport::bind(udp_config(ep, opts))?)),
        TransportKind::Xdp => Ok(Box::new(super::xdp::open_endpoint(super::xdp::Delivery::Xsk, ep, opts)?)),
        TransportKind::XdpRingbuf => Ok(Box::new(super::xdp::open_endpoint(super::xdp::Delivery::RingBuf, ep, opts)?)),
        TransportKind::Kmod => Ok(Box::new(super::kmod::open_endpoint(ep, opts)?)),
    }
}
