//! The control protocol between `leap bench --hosts` (the coordinator) and
//! `leap serve` (the agent): length-prefixed JSON messages of a fixed set of
//! types, carried inside the Noise session of [`super::session`] (never in
//! clear). Every message is `MAGIC` (4 bytes), its length (u32, big-endian)
//! and that many bytes of JSON; nothing is ever run as a command.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::capabilities::HostCapabilities;
use crate::ring::{HeadSummary, MAX_FRAME};
use crate::transport::Stats;
use crate::transport::config::AttachMode;
use crate::transport::open::TransportKind;

/// First bytes of every message ("leap serve", version 1).
pub const MAGIC: [u8; 4] = *b"LSV1";
/// Bytes before the JSON.
pub const HEADER_LEN: usize = 8;
/// Largest request an agent reads.
pub const MAX_REQUEST: usize = 16 * 1024;
/// Largest response a coordinator reads.
pub const MAX_RESPONSE: usize = 1 << 20;
/// Longest token (bytes) an agent accepts in its file.
pub const MAX_TOKEN: usize = 1024;
/// Shortest token an agent accepts in its file.
pub const MIN_TOKEN: usize = 16;
/// Frames one run may drive at most.
pub const MAX_FRAMES: u64 = 10_000_000;
/// Frames in flight at most.
pub const MAX_INFLIGHT: usize = 64;
/// Longest timeout a request may set (setup, stall, receive), milliseconds.
pub const MAX_TIMEOUT_MS: u64 = 120_000;

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The peer closed the connection.
    #[error("connection closed")]
    Closed,
    /// Not a leap serve message.
    #[error("not a leap serve message (bad magic)")]
    BadMagic,
    /// Longer than allowed.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Not one of the known messages.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The socket failed (or timed out).
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A ring member's place.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sends frames, measures round trips.
    Head,
    /// Forwards.
    Worker,
}

/// XDP attach modes a request may ask for.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// Native where the driver has it, else generic.
    #[default]
    Auto,
    /// Native (driver) mode.
    Drv,
    /// Generic (SKB) mode.
    Skb,
}

impl XdpMode {
    /// The mode to attach in.
    pub fn attach_mode(self) -> AttachMode {
        match self {
            Self::Auto => AttachMode::Auto,
            Self::Drv => AttachMode::Drv,
            Self::Skb => AttachMode::Skb,
        }
    }

    /// The request's spelling of `mode`.
    pub fn of(mode: AttachMode) -> Self {
        match mode {
            AttachMode::Drv => Self::Drv,
            AttachMode::Skb => Self::Skb,
            _ => Self::Auto,
        }
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// One ring member to start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MemberSpec {
    /// Backend.
    pub transport: TransportKind,
    /// Head or worker.
    pub role: Role,
    /// Bytes per frame.
    pub frame_size: usize,
    /// Frames the head drives (workers: ignored).
    pub frames: u64,
    /// Frames in flight (head).
    pub inflight: usize,
    /// Workers in the ring (head: for the control round).
    pub workers: usize,
    /// This member's data address.
    pub listen: SocketAddr,
    /// The next member's.
    pub next: SocketAddr,
    /// The previous member's.
    pub prev: SocketAddr,
    /// Every member's data address in ring order, the head first: the
    /// only addresses this member may send to or accept from.
    pub members: Vec<SocketAddr>,
    /// Interface the frames arrive on (XDP attaches there).
    pub iface: Option<String>,
    /// CRC32C on frames.
    pub crc: bool,
    /// Chunk trains between leap nodes (sent only when off, so that an
    /// agent of before trains still takes the default).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub trains: bool,
    /// UDP GSO.
    pub gso: bool,
    /// Loss recovery.
    pub reliability: crate::transport::config::Reliability,
    /// XDP attach mode.
    pub xdp_mode: XdpMode,
    /// Receive deadline, ms.
    pub recv_timeout_ms: u64,
    /// Time to connect to the neighbours, ms.
    pub setup_timeout_ms: u64,
    /// Head: give up when nothing comes back for this long, ms.
    pub stall_timeout_ms: u64,
    /// The run's ring key, fresh per run, the same for every member: TCP
    /// members prove it to each other before any frame crosses
    /// ([`crate::transport::ring_key`]), so that a member never forwards
    /// to, or takes from, anything but another member of the run. Required
    /// for TCP members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_key: Option<crate::transport::ring_key::RingKey>,
}

impl MemberSpec {
    /// Checks every field against the agent's bounds.
    ///
    /// # Errors
    ///
    /// The first field out of bounds, named.
    pub fn validate(&self) -> Result<(), String> {
        let min = leap_common::control::CONTROL_FRAME_MIN;
        if !(min..=MAX_FRAME).contains(&self.frame_size) {
            return Err(format!("frame_size {} outside {min}..={MAX_FRAME}", self.frame_size));
        }
        if self.frames == 0 || self.frames > MAX_FRAMES {
            return Err(format!("frames {} outside 1..={MAX_FRAMES}", self.frames));
        }
        if !(1..=MAX_INFLIGHT).contains(&self.inflight) {
            return Err(format!("inflight {} outside 1..={MAX_INFLIGHT}", self.inflight));
        }
        if !(1..=63).contains(&self.workers) {
            return Err(format!("workers {} outside 1..=63", self.workers));
        }
        for (name, a) in [("listen", self.listen), ("next", self.next), ("prev", self.prev)] {
            if a.port() < 1024 {
                return Err(format!("{name} port {} is privileged (< 1024)", a.port()));
            }
            if a.ip().is_unspecified() || a.ip().is_multicast() {
                return Err(format!("{name} address {} is not a host address", a.ip()));
            }
        }
        let n = self.members.len();
        if !(2..=64).contains(&n) || n != self.workers + 1 {
            return Err(format!("members: {n} addresses for a ring of {} workers and a head", self.workers));
        }
        for (i, a) in self.members.iter().enumerate() {
            if self.members[..i].contains(a) {
                return Err(format!("members: {a} appears twice"));
            }
        }
        let Some(me) = self.members.iter().position(|a| *a == self.listen) else {
            return Err(format!("listen {} is not one of the run's members", self.listen));
        };
        if (me == 0) != (self.role == Role::Head) {
            return Err(format!(
                "role {:?} does not match place {me} in the run's members (the head is first)",
                self.role
            ));
        }
        let (next, prev) = (self.members[(me + 1) % n], self.members[(me + n - 1) % n]);
        if self.next != next {
            return Err(format!("next {} is not the member after {} in the run ({next})", self.next, self.listen));
        }
        if self.prev != prev {
            return Err(format!("prev {} is not the member before {} in the run ({prev})", self.prev, self.listen));
        }
        if let Some(i) = &self.iface
            && (i.is_empty() || i.len() > 15 || !i.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b)))
        {
            return Err(format!("iface {i:?} is not an interface name"));
        }
        if self.transport == TransportKind::Tcp && self.run_key.is_none() {
            return Err("run_key: a TCP member needs the run's ring key (a coordinator of before ring keys?)".into());
        }
        for (name, v) in [
            ("recv_timeout_ms", self.recv_timeout_ms),
            ("setup_timeout_ms", self.setup_timeout_ms),
            ("stall_timeout_ms", self.stall_timeout_ms),
        ] {
            if !(1..=MAX_TIMEOUT_MS).contains(&v) {
                return Err(format!("{name} {v} outside 1..={MAX_TIMEOUT_MS}"));
            }
        }
        Ok(())
    }
}

/// Counters of an agent since it started.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct AgentCounters {
    /// Connections accepted.
    pub connections: u64,
    /// Connections closed at once: too many handshakes pending, or too
    /// many authenticated sessions open.
    pub refused_connections: u64,
    /// Handshakes that did not authenticate with the token.
    pub unauthenticated: u64,
    /// Messages that were not leap serve messages, or malformed.
    pub bad_requests: u64,
    /// Messages over [`MAX_REQUEST`].
    pub oversized_requests: u64,
    /// Connections closed for not completing the handshake in time, or
    /// idle too long.
    pub timeouts: u64,
    /// Ring members started.
    pub runs_started: u64,
    /// Runs aborted (coordinator gone, `Stop`, time limit).
    pub runs_aborted: u64,
}

/// What the coordinator asks (inside the session: the handshake has
/// authenticated both sides already).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// What this host can run.
    Capabilities,
    /// Counters and whether a member runs.
    Status,
    /// Open a ring member's transport; answered `Opened` (or an error).
    Open(Box<MemberSpec>),
    /// Start the opened member; answered `Finished` when it ends.
    Go,
    /// Abort the member (answered by its `Finished` or, if none, `Stopped`).
    Stop,
}

/// Error classes an agent answers with.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Not the protocol of this agent (a coordinator of before the Noise
    /// handshake is told so, in clear, and nothing else).
    Unauthenticated,
    /// Not a known message.
    BadRequest,
    /// Too large.
    TooLarge,
    /// Too many connections, or another run is in progress.
    Busy,
    /// Sent nothing in time.
    Timeout,
    /// A valid request that cannot be done now (e.g. `Go` before `Open`).
    InvalidState,
    /// The member failed (opening its transport, or during the run).
    MemberFailed,
}

/// What a member measured.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct MemberReport {
    /// The head's measurements (`None` for workers).
    pub head: Option<HeadSummary>,
    /// The member's transport counters.
    pub stats: Stats,
    /// Backend counters (XDP program, kernel module).
    pub backend: Option<crate::transport::BackendCounters>,
    /// CPU time of the data phase (user + system), seconds.
    pub cpu_s: f64,
    /// Aborted before the end (worker: the normal way to end).
    pub aborted: bool,
    /// The run failed with this error.
    pub error: Option<String>,
}

/// What the agent answers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// The host's capabilities.
    Capabilities(HostCapabilities),
    /// Counters, and whether a member is running.
    Status {
        /// Counters.
        counters: AgentCounters,
        /// A member is open or running.
        running: bool,
    },
    /// The member's transport is open.
    Opened,
    /// The member ran; transport closed (XDP detached) before this was sent.
    Finished(Box<MemberReport>),
    /// `Stop` with nothing running.
    Stopped,
    /// The request was refused or failed.
    Error {
        /// Class.
        kind: ErrorKind,
        /// For the operator.
        message: String,
    },
}

/// Encodes `msg` as one message.
///
/// # Panics
///
/// Never: the protocol's types always serialise.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let json = serde_json::to_vec(msg).expect("protocol types serialise");
    let mut out = Vec::with_capacity(HEADER_LEN + json.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// Checks a message header; returns the body length.
///
/// # Errors
///
/// [`ProtocolError::BadMagic`] or [`ProtocolError::TooLarge`].
pub fn parse_header(h: &[u8; HEADER_LEN], max: usize) -> Result<usize, ProtocolError> {
    if h[..4] != MAGIC {
        return Err(ProtocolError::BadMagic);
    }
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    if len > max {
        return Err(ProtocolError::TooLarge { len, max });
    }
    Ok(len)
}

/// Decodes a message body.
///
/// # Errors
///
/// [`ProtocolError::Malformed`].
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ProtocolError> {
    serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

/// Reads one message from a blocking stream.
///
/// # Errors
///
/// [`ProtocolError`].
pub fn read_message<T: for<'de> Deserialize<'de>>(r: &mut impl Read, max: usize) -> Result<T, ProtocolError> {
    let mut h = [0u8; HEADER_LEN];
    match r.read_exact(&mut h) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        other => other?,
    }
    let len = parse_header(&h, max)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(&body)
}

/// Writes one message to a blocking stream.
///
/// # Errors
///
/// The write failing.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&encode(msg))
}

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file's type, owner or mode, or reading it.
    #[error(transparent)]
    File(#[from] crate::secret_file::SecretFileError),
    /// Too short or too long.
    #[error(
        "the token in {path} has {len} bytes; use {MIN_TOKEN}..={MAX_TOKEN} (e.g. `head -c 32 /dev/urandom | base64`)"
    )]
    Length {
        /// The file.
        path: String,
        /// Its length.
        len: usize,
    },
}

/// Reads a token: the file's first line, which must be
/// [`MIN_TOKEN`]..=[`MAX_TOKEN`] bytes. The file is opened once, without
/// following a symbolic link in its last component (`O_NOFOLLOW`), and
/// checked on the open descriptor: a regular file, owned by root or by
/// this process's effective user, of mode 0600 or stricter (no bit for
/// group or others).
///
/// # Errors
///
/// [`TokenError`], naming the fix.
pub fn read_token(path: &std::path::Path) -> Result<String, TokenError> {
    let text = crate::secret_file::read(path, "token", MAX_TOKEN + 2)?;
    let p = || path.display().to_string();
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if !(MIN_TOKEN..=MAX_TOKEN).contains(&token.len()) {
        return Err(TokenError::Length { path: p(), len: token.len() });
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret_file::SecretFileError;

    fn spec() -> MemberSpec {
        MemberSpec {
            transport: TransportKind::Udp,
            role: Role::Worker,
            frame_size: 16_392,
            frames: 100,
            inflight: 1,
            workers: 2,
            listen: "10.0.0.2:9999".parse().unwrap(),
            next: "10.0.0.3:9999".parse().unwrap(),
            prev: "10.0.0.1:9999".parse().unwrap(),
            members: ["10.0.0.1:9999", "10.0.0.2:9999", "10.0.0.3:9999"].map(|a| a.parse().unwrap()).to_vec(),
            iface: Some("eth0".into()),
            crc: true,
            trains: true,
            gso: true,
            reliability: Default::default(),
            xdp_mode: XdpMode::Auto,
            recv_timeout_ms: 1000,
            setup_timeout_ms: 10_000,
            stall_timeout_ms: 20_000,
            run_key: None,
        }
    }

    #[test]
    fn every_request_round_trips() {
        for r in [Request::Capabilities, Request::Status, Request::Open(Box::new(spec())), Request::Go, Request::Stop] {
            let bytes = encode(&r);
            let got: Request = read_message(&mut &bytes[..], MAX_REQUEST).unwrap();
            assert_eq!(got, r);
        }
    }

    #[test]
    fn trains_travel_only_when_off() {
        let on = serde_json::to_string(&spec()).unwrap();
        assert!(!on.contains("trains"), "{on}");
        assert!(serde_json::from_str::<MemberSpec>(&on).unwrap().trains);
        let off = serde_json::to_string(&MemberSpec { trains: false, ..spec() }).unwrap();
        assert!(!serde_json::from_str::<MemberSpec>(&off).unwrap().trains);
    }

    #[test]
    fn garbage_is_not_a_message() {
        let mut g: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        assert!(matches!(read_message::<Request>(&mut g, MAX_REQUEST), Err(ProtocolError::BadMagic)));
    }

    #[test]
    fn oversized_message_is_refused_before_its_body_is_read() {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&(MAX_REQUEST as u32 + 1).to_be_bytes());
        assert!(matches!(
            read_message::<Request>(&mut &h[..], MAX_REQUEST),
            Err(ProtocolError::TooLarge { len, .. }) if len == MAX_REQUEST + 1
        ));
    }

    #[test]
    fn unknown_requests_and_fields_are_malformed() {
        for body in [
            r#"{"type":"exec","cmd":"rm -rf /"}"#,
            r#"{"type":"auth","token":"x"}"#,
            r#"{"type":"open"}"#,
            r#"not json"#,
        ] {
            let mut m = MAGIC.to_vec();
            m.extend_from_slice(&(body.len() as u32).to_be_bytes());
            m.extend_from_slice(body.as_bytes());
            assert!(
                matches!(read_message::<Request>(&mut &m[..], MAX_REQUEST), Err(ProtocolError::Malformed(_))),
                "{body}"
            );
        }
        let mut v = serde_json::to_value(Request::Open(Box::new(spec()))).unwrap();
        v["xdp_object"] = "/tmp/evil.o".into();
        assert!(serde_json::from_value::<Request>(v).is_err(), "no paths from the network");
    }

    #[test]
    fn member_specs_out_of_bounds_are_refused() {
        assert_eq!(spec().validate(), Ok(()));
        type Breaker = fn(&mut MemberSpec);
        let cases: [(&str, Breaker); 11] = [
            ("frame_size", |s| s.frame_size = MAX_FRAME + 1),
            ("next", |s| s.next = "127.0.0.1:6379".parse().unwrap()),
            ("prev", |s| s.prev = "10.0.0.9:9999".parse().unwrap()),
            ("members", |s| s.members.push("10.0.0.2:9999".parse().unwrap())),
            ("role", |s| s.role = Role::Head),
            ("frames", |s| s.frames = MAX_FRAMES + 1),
            ("inflight", |s| s.inflight = 0),
            ("listen port", |s| s.listen.set_port(22)),
            ("next address", |s| s.next = "0.0.0.0:9999".parse().unwrap()),
            ("iface", |s| s.iface = Some("eth0; reboot".into())),
            ("stall_timeout_ms", |s| s.stall_timeout_ms = MAX_TIMEOUT_MS + 1),
        ];
        for (field, break_it) in cases {
            let mut s = spec();
            break_it(&mut s);
            let e = s.validate().unwrap_err();
            assert!(e.starts_with(field), "{field}: {e}");
        }
    }

    #[test]
    fn token_file_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("leap-token-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let p = dir.join("token");
        std::fs::write(&p, "short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(read_token(&p), Err(TokenError::Length { len: 5, .. })));
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        assert_eq!(read_token(&p).unwrap(), "0123456789abcdef0123");
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let e = read_token(&link).unwrap_err();
        assert!(matches!(e, TokenError::File(SecretFileError::Symlink { .. })), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = read_token(&dir).unwrap_err();
        assert!(matches!(e, TokenError::File(SecretFileError::NotRegular { .. })), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_token(&p).unwrap_err();
        assert!(
            matches!(e, TokenError::File(SecretFileError::Exposed { .. })) && e.to_string().contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert!(matches!(read_token(&p), Err(TokenError::File(SecretFileError::Exposed { .. }))), "group-writable");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn token_file_of_another_user_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to give the file away (the privileged stage runs it)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("leap-token-owner-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let p = dir.join("token");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        let e = read_token(&p).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(e, TokenError::File(SecretFileError::Owner { owner: 65534, .. })), "{e}");
        assert!(e.to_string().contains("chown root"), "{e}");
    }
}
