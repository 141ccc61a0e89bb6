//! TCP, the reliable baseline: one connection from the previous node (we
//! listen on exactly the address we are given) and one to the next (we
//! connect, with bounded retries and backoff, concurrently with accepting so
//! that a ring starts without deadlock). `TCP_NODELAY`, 8 MiB buffers,
//! vectored writes. By default frames go back to back, exactly as the
//! original (the receiver knows the frame size); optionally each frame gets
//! an 8-byte length/kind prefix, for variable sizes and unambiguous control.

use std::io::{self, IoSlice, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use leap_common::control::ControlMessage;
use socket2::{Domain, Protocol, Socket, Type};

pub use super::config::TcpFraming;
use super::lend::OwnedBuf;
use super::ready::Readiness;
use super::ring_key::{self, ID_LEN, KeySet, Session, TAG_LEN};
use super::{FrameKind, FrameReceiver, FrameSender, Halves, Lent, Received, Result, Stats, Transport, TransportError};

const PREFIX_LEN: usize = 8;

/// Settings of a [`TcpTransport`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TcpConfig {
    /// Address to listen on for the previous node (exactly this address).
    pub listen: SocketAddr,
    /// The next node.
    pub next: SocketAddr,
    /// Accept only connections from this address (the previous node).
    pub prev: Option<IpAddr>,
    /// ... and from this source port: the previous node connects from it
    /// (its [`Self::source_port`]), so that no other local user of its
    /// host can connect first in its place. `None`: any port (an original
    /// node connects from an ephemeral one).
    pub prev_port: Option<u16>,
    /// Connect to the next node from this port of the listen address
    /// (`None`: an ephemeral port). It must differ from the listen port.
    pub source_port: Option<u16>,
    /// Frame size in [`TcpFraming::Raw`] mode (the receiver must know it).
    pub frame_len: usize,
    /// Wire framing; both ends must agree.
    pub framing: TcpFraming,
    /// Give up connecting/accepting after this long.
    pub setup_timeout: Duration,
    /// Receive deadline (`None`: wait forever).
    pub recv_timeout: Option<Duration>,
    /// With keys, both ends of every connection prove one before any frame
    /// crosses, and every frame then carries a tag (and is encrypted when
    /// the keys say so) ([`super::ring_key`]): the next node must prove a
    /// key before this node sends, a connection to the listen address that
    /// does not prove one is dropped unread, and a frame whose tag fails
    /// ends its connection. An unkeyed or original node cannot take part.
    pub ring_key: Option<KeySet>,
}

impl TcpConfig {
    /// Defaults: raw framing, 30 s to set up, 1 s receive deadline.
    pub fn new(listen: SocketAddr, next: SocketAddr, frame_len: usize) -> Self {
        Self {
            listen,
            next,
            prev: None,
            prev_port: None,
            source_port: None,
            frame_len,
            framing: TcpFraming::Raw,
            setup_timeout: Duration::from_secs(30),
            recv_timeout: Some(Duration::from_secs(1)),
            ring_key: None,
        }
    }
}

/// A stream with the state of a frame half read when a deadline hit, so
/// that the next read continues where it stopped instead of desynchronising.
#[derive(Debug)]
struct Inbound {
    stream: TcpStream,
    /// Bytes of the current frame (prefix included) read so far.
    partial: Vec<u8>,
    prefix: [u8; PREFIX_LEN],
    /// Bytes taken off the stream while a send to the next node was stuck
    /// (see [`TcpTransport::write`]); reads serve these first.
    stash: Stash,
    /// A keyed connection's frame keys.
    session: Option<Session>,
    /// The tag of the frame being read.
    tag: [u8; TAG_LEN],
}

#[derive(Debug, Default)]
struct Stash {
    buf: Vec<u8>,
    off: usize,
}

impl Stash {
    /// Reads into `dst`, from the stash first, then from `stream` (without
    /// waiting when `once`).
    fn read(&mut self, stream: &mut TcpStream, dst: &mut [u8], once: bool) -> io::Result<usize> {
        let left = self.buf.len() - self.off;
        if left == 0 {
            if once {
                use nix::sys::socket::{MsgFlags, recv};
                return recv(stream.as_raw_fd(), dst, MsgFlags::MSG_DONTWAIT).map_err(io::Error::from);
            }
            return stream.read(dst);
        }
        let n = left.min(dst.len());
        dst[..n].copy_from_slice(&self.buf[self.off..self.off + n]);
        self.off += n;
        if self.off == self.buf.len() {
            self.buf.clear();
            self.off = 0;
        }
        Ok(n)
    }
}

/// Most bytes a stuck send drains from the previous node into memory.
const STASH_MAX: usize = 256 << 20;

/// The TCP transport. A neighbour that restarts is taken back: the
/// connection from the previous node is accepted anew, the one to the next
/// node re-established with backoff (and the frame being sent sent again).
#[derive(Debug)]
pub struct TcpTransport {
    tx: TcpSendHalf,
    rx: TcpRecvHalf,
}

/// Whether an error means the connection is gone (as opposed to a deadline).
fn is_broken(e: &TransportError) -> bool {
    match e {
        TransportError::PeerClosed(_) => true,
        TransportError::Syscall(e) => matches!(
            e.source.kind(),
            io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::NotConnected
                | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
    let sock = socket2::SockRef::from(s);
    let _ = sock.set_recv_buffer_size(super::udp::SOCKET_BUFFER);
    let _ = sock.set_send_buffer_size(super::udp::SOCKET_BUFFER);
}

/// Connects to `addr`, retrying with exponential backoff (10 ms .. 500 ms)
/// until `timeout` passes.
///
/// # Errors
///
/// [`TransportError::Connect`] with the last error and the attempt count.
pub fn connect_with_backoff(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    connect_from(addr, None, timeout)
}

/// [`connect_with_backoff`] from `source` (an address and port of this
/// host) where given.
///
/// # Errors
///
/// [`TransportError::Connect`] with the last error and the attempt count.
pub fn connect_from(addr: SocketAddr, source: Option<SocketAddr>, timeout: Duration) -> Result<TcpStream> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(10);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
        let limit = left.min(Duration::from_secs(2));
        let res = match source {
            None => TcpStream::connect_timeout(&addr, limit),
            Some(from) => connect_bound(addr, from, limit),
        };
        match res {
            Ok(s) => {
                tune(&s);
                return Ok(s);
            }
            Err(source) if start.elapsed() + delay >= timeout => {
                return Err(TransportError::Connect { addr, attempts, source });
            }
            Err(_) => {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// One connection attempt from `from`. SO_REUSEADDR lets a node that
/// restarted bind the port again while its last connection is in
/// TIME_WAIT (and a connect from an explicitly bound port may reuse it).
fn connect_bound(addr: SocketAddr, from: SocketAddr, limit: Duration) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&from.into())?;
    s.connect_timeout(&addr.into(), limit)?;
    Ok(s.into())
}

/// How long each step of the ring-key proof may take: the accepting side
/// waits no longer for a connection that stalls (one at a time).
const PROOF_DEADLINE: Duration = Duration::from_secs(2);

/// [`connect_from`], then the connecting side's ring-key proof when `keys`
/// are given: the stream is returned only when the next node proved a key,
/// with the connection's frame keys.
///
/// # Errors
///
/// As [`connect_from`]; [`TransportError::RingKey`].
pub fn connect_keyed(
    addr: SocketAddr,
    source: Option<SocketAddr>,
    keys: Option<&KeySet>,
    timeout: Duration,
) -> Result<(TcpStream, Option<Session>)> {
    let (s, session, _) = connect_proving(addr, source, keys, timeout)?;
    Ok((s, session))
}

/// The id of the key a connection proved ([`ring_key::RingKey::id`]).
type KeyId = [u8; ID_LEN];

/// [`connect_keyed`], returning also the id of the key proved.
fn connect_proving(
    addr: SocketAddr,
    source: Option<SocketAddr>,
    keys: Option<&KeySet>,
    timeout: Duration,
) -> Result<(TcpStream, Option<Session>, Option<KeyId>)> {
    let mut s = connect_from(addr, source, timeout)?;
    let Some(keys) = keys else { return Ok((s, None, None)) };
    let session = ring_key::prove_connecting(&mut s, keys, PROOF_DEADLINE)
        .map_err(|source| TransportError::RingKey { peer: addr, source })?;
    let id = session.key_id;
    Ok((s, frame_keys(session, keys, "next", addr), Some(id)))
}

/// What a proven connection keeps: its frame keys, unless `keys` prove the
/// ends only. Logs when the `side` node at `addr` proved the previous key.
fn frame_keys(session: Session, keys: &KeySet, side: &str, addr: SocketAddr) -> Option<Session> {
    if session.used_previous {
        log::info!("ring key: the {side} node {addr} proved the previous key (a ring changing keys)");
    }
    keys.tags().then_some(session)
}

/// Binds exactly `addr` and listens.
///
/// # Errors
///
/// The failed call.
pub fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| TransportError::io("socket", e))?;
    s.set_reuse_address(true).map_err(|e| TransportError::io("setsockopt(SO_REUSEADDR)", e))?;
    // Set before accept so the accepted socket inherits a large window.
    let _ = s.set_recv_buffer_size(super::udp::SOCKET_BUFFER);
    s.bind(&addr.into()).map_err(|e| TransportError::io("bind", e))?;
    s.listen(4).map_err(|e| TransportError::io("listen", e))?;
    Ok(s.into())
}

/// Accepts the previous node's connection, refusing other sources, until
/// `timeout` passes.
///
/// # Errors
///
/// [`TransportError::Timeout`] or the failed call.
pub fn accept_from(
    l: &TcpListener,
    prev: Option<IpAddr>,
    prev_port: Option<u16>,
    keys: Option<&KeySet>,
    timeout: Duration,
) -> Result<(TcpStream, Option<Session>)> {
    accept_proving(l, prev, prev_port, keys, timeout).map(|(s, session, _)| (s, session))
}

/// [`accept_from`], returning also the id of the key proved.
fn accept_proving(
    l: &TcpListener,
    prev: Option<IpAddr>,
    prev_port: Option<u16>,
    keys: Option<&KeySet>,
    timeout: Duration,
) -> Result<(TcpStream, Option<Session>, Option<KeyId>)> {
    l.set_nonblocking(true).map_err(|e| TransportError::io("fcntl", e))?;
    let start = Instant::now();
    loop {
        match l.accept() {
            Ok((s, from)) => {
                if prev.is_some_and(|p| p != from.ip()) {
                    log::warn!("refused a connection from {from}: only the previous node {prev:?} may connect");
                    continue;
                }
                if let Some(port) = prev_port
                    && port != from.port()
                {
                    log::warn!(
                        "refused a connection from {from}: the previous node connects from port {port} \
                         (tcp_prev_port; its tcp_source_port)"
                    );
                    continue;
                }
                let mut s = s;
                s.set_nonblocking(false).map_err(|e| TransportError::io("fcntl", e))?;
                let (session, id) = match keys.map(|k| (k, ring_key::prove_accepting(&mut s, k, PROOF_DEADLINE))) {
                    None => (None, None),
                    Some((k, Ok(session))) => {
                        let id = session.key_id;
                        (frame_keys(session, k, "previous", from), Some(id))
                    }
                    Some((_, Err(e))) => {
                        log::warn!("refused a connection from {from}: {e}");
                        continue;
                    }
                };
                tune(&s);
                return Ok((s, session, id));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if start.elapsed() >= timeout {
                    return Err(TransportError::Timeout(timeout));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(TransportError::io("accept", e)),
        }
    }
}

/// The kind a frame's tag is bound to: the prefix's kind when frames are
/// length-framed; with raw framing the kind is not on the wire (it is read
/// from the frame's bytes), so it is 0.
fn nonce_kind(framed: bool, kind: FrameKind) -> u8 {
    if framed { kind as u8 } else { 0 }
}

impl Inbound {
    fn new((stream, session): (TcpStream, Option<Session>)) -> Self {
        Self {
            stream,
            partial: Vec::new(),
            prefix: [0; PREFIX_LEN],
            stash: Stash::default(),
            session,
            tag: [0; TAG_LEN],
        }
    }

    /// Whether bytes taken off the stream wait in the stash.
    fn has_stash(&self) -> bool {
        self.stash.buf.len() > self.stash.off
    }

    /// Moves the bytes the stream has ready into the stash. Returns false
    /// when nothing more should be drained (end of stream, error, or full).
    fn drain(&mut self) -> bool {
        let mut chunk = [0u8; 64 << 10];
        // poll said readable: this read returns at once.
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.stash.buf.extend_from_slice(&chunk[..n]);
                self.stash.buf.len() - self.stash.off < STASH_MAX
            }
        }
    }
}

impl TcpTransport {
    /// Listens on `cfg.listen` and connects to `cfg.next` at the same time;
    /// returns when both connections stand.
    ///
    /// # Errors
    ///
    /// The bind/listen failure, [`TransportError::Connect`] when the next
    /// node never answered, or [`TransportError::Timeout`] when the previous
    /// node never connected.
    pub fn connect(cfg: TcpConfig) -> Result<Self> {
        if cfg.framing == TcpFraming::Raw && cfg.frame_len == 0 {
            return Err(TransportError::BadFrameLen(0));
        }
        let listener = listen(cfg.listen)?;
        if cfg.source_port == Some(cfg.listen.port()) {
            return Err(TransportError::Setting(super::settings::SettingError {
                key: "tcp_source_port".into(),
                problem: format!(
                    "{} is the listen port: choose another (two nodes connecting from their listen ports to \
                     each other would open one connection, not two)",
                    cfg.listen.port()
                ),
            }));
        }
        let (next, timeout) = (cfg.next, cfg.setup_timeout);
        let source = cfg.source_port.map(|p| SocketAddr::new(cfg.listen.ip(), p));
        let key = cfg.ring_key.clone();
        let connector = std::thread::spawn(move || connect_proving(next, source, key.as_ref(), timeout));
        let accepted = accept_proving(&listener, cfg.prev, cfg.prev_port, cfg.ring_key.as_ref(), cfg.setup_timeout);
        let (to_next, to_next_keys, next_proved) =
            connector.join().map_err(|_| TransportError::Unsupported("connect thread panicked"))??;
        let (from_prev, from_prev_keys, prev_proved) = accepted?;
        let stats = Arc::new(Mutex::new(Stats::default()));
        let timeout = cfg.recv_timeout;
        let keys = Arc::new(SharedKeys {
            keys: Mutex::new(cfg.ring_key.clone()),
            proved: Mutex::new(Proved { next: next_proved, prev: prev_proved }),
        });
        let mut t = Self {
            tx: TcpSendHalf {
                cfg: cfg.clone(),
                keys: Arc::clone(&keys),
                to_next: Some(Inbound::new((to_next, to_next_keys))),
                stats: Arc::clone(&stats),
                tx: OwnedBuf::default(),
                pending: None,
            },
            rx: TcpRecvHalf {
                cfg,
                keys,
                listener,
                from_prev: Some(Inbound::new((from_prev, from_prev_keys))),
                stats,
                lend: OwnedBuf::default(),
                ready: OnceLock::new(),
                applied: None,
            },
        };
        t.set_recv_timeout(timeout);
        Ok(t)
    }

    /// Writes one frame to `out`'s stream (tagged, and encrypted, when the
    /// connection is keyed: the frame is copied together first). While the
    /// next node takes no bytes, what the previous node sends is drained
    /// into `prev`'s stash: with several frames in flight, every node of a
    /// ring can be stuck sending with full socket buffers all around, and
    /// nobody reading would be a deadlock (seen in a 1 GiB VM: 8 x 256 KiB
    /// frames in flight).
    fn write(
        out: &mut Inbound,
        mut prev: Option<&mut Inbound>,
        framing: TcpFraming,
        kind: FrameKind,
        head: &[u8],
        tail: &[u8],
    ) -> Result<()> {
        let len = head.len() + tail.len();
        let len32 = u32::try_from(len).map_err(|_| TransportError::BadFrameLen(len))?;
        if len == 0 {
            return Err(TransportError::BadFrameLen(0));
        }
        let mut prefix = [0u8; PREFIX_LEN];
        prefix[..4].copy_from_slice(&len32.to_le_bytes());
        prefix[4] = kind as u8;
        let framed = framing == TcpFraming::Length;
        let pre: &[u8] = if framed { &prefix } else { &[] };
        let Inbound { stream, session, .. } = out;
        let tag: [u8; TAG_LEN];
        let (head, tail, tag): (&[u8], &[u8], &[u8]) = match session {
            None => (head, tail, &[]),
            Some(session) => {
                let (t, cipher) = session
                    .sealer
                    .seal(nonce_kind(framed, kind), &[head, tail])
                    .map_err(|e| TransportError::io("seal", e))?;
                tag = t;
                match cipher {
                    Some(c) => (c, &[], &tag),
                    None => (head, tail, &tag),
                }
            }
        };
        let mut bufs = [IoSlice::new(pre), IoSlice::new(head), IoSlice::new(tail), IoSlice::new(tag)];
        let mut bufs = &mut bufs[..];
        IoSlice::advance_slices(&mut bufs, 0);
        let sock = socket2::SockRef::from(&*stream);
        while !bufs.is_empty() {
            match sock.send_vectored_with_flags(bufs, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
                Ok(0) => return Err(TransportError::PeerClosed("next")),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let drain = prev.as_ref().map(|p| p.stream.as_fd());
                    let (_, readable) = crate::sys::wait_writable_or_readable(stream.as_fd(), drain)
                        .map_err(|e| TransportError::io("poll", e))?;
                    if readable
                        && let Some(p) = prev.as_deref_mut()
                        && !p.drain()
                    {
                        prev = None;
                    }
                }
                Err(e) => return Err(TransportError::io("sendmsg", e)),
            }
        }
        Ok(())
    }

    /// Reads one frame into `out` (and its tag, checked, on a keyed
    /// connection). On a deadline mid-frame, keeps what was read so the
    /// stream stays in step.
    fn read(inb: &mut Inbound, cfg: &TcpConfig, out: &mut [u8], side: &'static str) -> Result<Received> {
        let framed = cfg.framing == TcpFraming::Length;
        let pre_len = if framed { PREFIX_LEN } else { 0 };
        let tag_len = if inb.session.is_some() { TAG_LEN } else { 0 };
        // The frame's length without prefix and tag, once known.
        let body_len = |prefix: &[u8; PREFIX_LEN]| -> Result<usize> {
            if !framed {
                return Ok(cfg.frame_len);
            }
            let len = u32::from_le_bytes(prefix[..4].try_into().expect("4 bytes")) as usize;
            if len == 0 || prefix[4] > 1 {
                return Err(TransportError::io(
                    "read",
                    io::Error::new(io::ErrorKind::InvalidData, "bad frame prefix: peer uses another framing?"),
                ));
            }
            Ok(len)
        };
        // Resume a frame interrupted by a deadline: prefix, body, tag.
        let mut have = inb.partial.len();
        if have > 0 {
            let partial = std::mem::take(&mut inb.partial);
            let (pre, rest) = partial.split_at(have.min(pre_len));
            inb.prefix[..pre.len()].copy_from_slice(pre);
            if !rest.is_empty() {
                let body = body_len(&inb.prefix)?;
                let (b, t) = rest.split_at(rest.len().min(body));
                let capacity = out.len();
                out.get_mut(..b.len()).ok_or(TransportError::FrameTooLarge { len: body, capacity })?.copy_from_slice(b);
                inb.tag[..t.len()].copy_from_slice(t);
            }
        }
        let deadline = cfg.recv_timeout;
        let once = deadline.is_some_and(|t| t.is_zero());
        let mut body = if framed { None } else { Some(cfg.frame_len) };
        loop {
            if body.is_none() && have >= PREFIX_LEN {
                body = Some(body_len(&inb.prefix)?);
            }
            if let Some(b) = body
                && b > out.len()
            {
                return Err(TransportError::FrameTooLarge { len: b, capacity: out.len() });
            }
            let want = body.map_or(PREFIX_LEN, |b| pre_len + b + tag_len);
            if have >= want {
                break;
            }
            let dst = match body {
                _ if have < pre_len => &mut inb.prefix[have..pre_len],
                Some(b) if have < pre_len + b => &mut out[have - pre_len..b],
                Some(b) => &mut inb.tag[have - pre_len - b..tag_len],
                None => unreachable!("the prefix is read before the body"),
            };
            match inb.stash.read(&mut inb.stream, dst, once) {
                Ok(0) => return Err(TransportError::PeerClosed(side)),
                Ok(n) => have += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if have > 0 {
                        inb.partial.extend_from_slice(&inb.prefix[..have.min(pre_len)]);
                        if have > pre_len {
                            let b = body.expect("known past the prefix");
                            inb.partial.extend_from_slice(&out[..(have - pre_len).min(b)]);
                            if have > pre_len + b {
                                inb.partial.extend_from_slice(&inb.tag[..have - pre_len - b]);
                            }
                        }
                    }
                    return Err(TransportError::Timeout(deadline.unwrap_or_default()));
                }
                Err(e) => return Err(TransportError::io("read", e)),
            }
        }
        let len = body.expect("known");
        let prefix_kind = if inb.prefix[4] == 1 { FrameKind::Control } else { FrameKind::Data };
        if let Some(session) = &mut inb.session {
            let kind = if framed { prefix_kind } else { FrameKind::Data };
            session
                .opener
                .open(nonce_kind(framed, kind), &mut out[..len], &inb.tag)
                .map_err(|_| TransportError::Forged { peer: side })?;
        }
        let kind = if framed {
            prefix_kind
        } else if ControlMessage::decode_frame(&out[..len]).is_ok() {
            FrameKind::Control
        } else {
            FrameKind::Data
        };
        Ok(Received { len, kind })
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        let res = self.tx.send(kind, header, payload, self.rx.from_prev.as_mut());
        self.rx.after_send();
        res
    }

    fn recv_prev(&mut self, buf: &mut [u8]) -> Result<Received> {
        self.rx.recv_prev(buf)
    }

    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        self.rx.recv_prev_lent()
    }

    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let res = self.tx.send_with(kind, len, fill, self.rx.from_prev.as_mut());
        self.rx.after_send();
        res
    }

    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        self.tx.begin(kind, len)
    }

    fn send_next_commit(&mut self) -> Result<()> {
        let res = self.tx.commit(self.rx.from_prev.as_mut());
        self.rx.after_send();
        res
    }

    fn ready_fd(&self) -> Result<BorrowedFd<'_>> {
        self.rx.ready_fd()
    }

    fn relay(&mut self, control: &mut [u8], compute: &mut dyn FnMut(&[u8], &mut [u8])) -> Result<Received> {
        let got = self.rx.recv_into_lend()?;
        let TcpRecvHalf { lend, from_prev, .. } = &mut self.rx;
        let input = &lend.all()[..got.len];
        if got.kind == FrameKind::Control {
            super::keep_control(input, control)?;
        } else {
            let res = self.tx.send_with(FrameKind::Data, got.len, &mut |out| compute(input, out), from_prev.as_mut());
            self.rx.after_send();
            res?;
        }
        Ok(got)
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.tx.set_recv_timeout(timeout);
        FrameReceiver::set_recv_timeout(&mut self.rx, timeout);
    }

    fn set_frame_len(&mut self, len: usize) -> Result<()> {
        if len == 0 || u32::try_from(len).is_err() {
            return Err(super::frame_len_refused("tcp", len, u32::MAX as usize));
        }
        // Both directions: `recv_next` reads with the sending half's settings.
        self.tx.cfg.frame_len = len;
        self.rx.cfg.frame_len = len;
        Ok(())
    }

    fn stats(&self) -> Stats {
        *counters(&self.rx.stats)
    }

    fn split(self: Box<Self>) -> Result<Halves> {
        Ok(Halves { sender: Box::new(self.tx), receiver: Box::new(self.rx) })
    }

    fn key_control(&self) -> Option<super::KeyControl> {
        Some(key_control(&self.tx.keys))
    }

    fn send_prev(&mut self, frame: &[u8]) -> Result<()> {
        let inb = self.rx.from_prev.as_mut().ok_or(TransportError::PeerClosed("previous"))?;
        TcpTransport::write(inb, None, self.rx.cfg.framing, FrameKind::Data, frame, &[])
    }

    fn recv_next(&mut self, buf: &mut [u8]) -> Result<Received> {
        let inb = self.tx.to_next.as_mut().ok_or(TransportError::PeerClosed("next"))?;
        TcpTransport::read(inb, &self.tx.cfg, buf, "next")
    }
}

/// The sending half of a split [`TcpTransport`]: the connection to the next
/// node (re-established with backoff when it breaks).
#[derive(Debug)]
pub struct TcpSendHalf {
    cfg: TcpConfig,
    /// The ring keys new connections prove (shared with the receiving half
    /// and [`Transport::key_control`]).
    keys: Arc<SharedKeys>,
    to_next: Option<Inbound>,
    stats: Arc<Mutex<Stats>>,
    tx: OwnedBuf,
    /// A frame begun in `tx` by `send_next_begin`: kind and length.
    pending: Option<(FrameKind, usize)>,
}

/// The receiving half of a split [`TcpTransport`]: the listener and the
/// connection from the previous node (accepted again when it breaks).
#[derive(Debug)]
pub struct TcpRecvHalf {
    cfg: TcpConfig,
    keys: Arc<SharedKeys>,
    listener: TcpListener,
    from_prev: Option<Inbound>,
    stats: Arc<Mutex<Stats>>,
    lend: OwnedBuf,
    /// The readiness descriptor, once asked for: the stream from the
    /// previous node (the listener while there is none) and an eventfd set
    /// while the stash holds bytes.
    ready: OnceLock<Readiness>,
    /// The read timeout the stream from the previous node carries (`None`:
    /// not known).
    applied: Option<Option<Duration>>,
}

/// The ring keys of a transport's next connections, set anew while it
/// runs ([`super::KeyControl`]), and the keys its connections proved: a
/// connection keeps the key it proved.
#[derive(Debug)]
struct SharedKeys {
    keys: Mutex<Option<KeySet>>,
    proved: Mutex<Proved>,
}

/// The ids of the keys the connections to the next and from the previous
/// node proved (`None`: unkeyed, or none yet).
#[derive(Debug, Default)]
struct Proved {
    next: Option<KeyId>,
    prev: Option<KeyId>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn keys_now(keys: &SharedKeys) -> Option<KeySet> {
    lock(&keys.keys).clone()
}

/// New keys for the next connections of a tcp transport keyed with `keys`;
/// warns of an established connection that goes on with a key they no
/// longer hold.
fn key_control(keys: &Arc<SharedKeys>) -> super::KeyControl {
    let keys = Arc::clone(keys);
    super::KeyControl::new(move |new: KeySet| {
        let mut held = lock(&keys.keys);
        let Some(old) = held.as_ref() else { return Err(ring_key::KeyChangeError::Unkeyed) };
        if (new.encrypt, new.tags()) != (old.encrypt, old.tags()) {
            return Err(ring_key::KeyChangeError::Encryption);
        }
        log::info!(
            "ring key: now {} (was {}) for new connections; an established connection keeps the key it proved \
             until it reconnects",
            new.describe(),
            old.describe()
        );
        let proved = lock(&keys.proved);
        for (id, side) in [(proved.next, "to the next node"), (proved.prev, "from the previous node")] {
            if let Some(id) = id.filter(|id| !new.holds(id)) {
                log::warn!(
                    "ring key: the connection {side} goes on with key {}, which this node no longer holds: an \
                     established connection keeps the key it proved until it reconnects (restart this node or \
                     that neighbour to retire the key)",
                    ring_key::log_name(&id)
                );
            }
        }
        *held = Some(new);
        Ok(())
    })
}

fn counters(stats: &Mutex<Stats>) -> std::sync::MutexGuard<'_, Stats> {
    stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl TcpSendHalf {
    /// Sends on the connection to the next node; if it broke (the next node
    /// restarted), reconnects with backoff and sends the frame again. While
    /// the next node takes no bytes, what `prev` has ready is drained (see
    /// [`TcpTransport::write`]); a split sender has nothing to drain, its
    /// receiver reads on its own thread.
    fn send(&mut self, kind: FrameKind, header: &[u8], payload: &[u8], mut prev: Option<&mut Inbound>) -> Result<()> {
        // Any send forgets a frame begun and not committed.
        self.pending = None;
        if let Some(inb) = &mut self.to_next {
            match TcpTransport::write(inb, prev.as_deref_mut(), self.cfg.framing, kind, header, payload) {
                Ok(()) => return self.sent(header.len() + payload.len()),
                Err(e) if is_broken(&e) => {
                    log::warn!("connection to the next node {} lost ({e}); reconnecting", self.cfg.next)
                }
                Err(e) => return Err(e),
            }
        }
        self.to_next = None;
        let source = self.cfg.source_port.map(|p| SocketAddr::new(self.cfg.listen.ip(), p));
        let keys = keys_now(&self.keys);
        let (s, session, proved) = connect_proving(self.cfg.next, source, keys.as_ref(), self.cfg.setup_timeout)?;
        let _ = s.set_read_timeout(self.cfg.recv_timeout.map(|t| t.max(Duration::from_millis(1))));
        lock(&self.keys.proved).next = proved;
        let inb = self.to_next.insert(Inbound::new((s, session)));
        TcpTransport::write(inb, prev, self.cfg.framing, kind, header, payload)?;
        self.sent(header.len() + payload.len())
    }

    /// A frame that `fill` writes into the half's buffer.
    fn send_with(
        &mut self,
        kind: FrameKind,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
        prev: Option<&mut Inbound>,
    ) -> Result<()> {
        if len == 0 || u32::try_from(len).is_err() {
            return Err(TransportError::BadFrameLen(len));
        }
        let mut tx = std::mem::take(&mut self.tx);
        fill(tx.get(len));
        let res = self.send(kind, &tx.all()[..len], &[], prev);
        self.tx = tx;
        res
    }

    /// See [`Transport::send_next_begin`]: the half's buffer.
    fn begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        self.pending = None;
        if len == 0 || u32::try_from(len).is_err() {
            return Err(TransportError::BadFrameLen(len));
        }
        self.pending = Some((kind, len));
        Ok(self.tx.get(len))
    }

    /// See [`Transport::send_next_commit`].
    fn commit(&mut self, prev: Option<&mut Inbound>) -> Result<()> {
        let (kind, len) = self.pending.take().ok_or(TransportError::NotBegun)?;
        let mut tx = std::mem::take(&mut self.tx);
        let res = self.send(kind, &tx.all()[..len], &[], prev);
        self.tx = tx;
        res
    }

    /// The read deadline of the connection to the next node (`recv_next`).
    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.cfg.recv_timeout = timeout;
        if let (Some(inb), Some(t)) = (&self.to_next, socket_timeout(timeout)) {
            let _ = inb.stream.set_read_timeout(t);
        }
    }

    fn sent(&self, len: usize) -> Result<()> {
        let mut s = counters(&self.stats);
        s.frames_sent += 1;
        s.bytes_sent += len as u64;
        Ok(())
    }
}

/// The `SO_RCVTIMEO` a receive deadline needs: `None` for a zero deadline
/// (poll once: reads do not wait, whatever the socket says).
fn socket_timeout(deadline: Option<Duration>) -> Option<Option<Duration>> {
    match deadline {
        Some(t) if t.is_zero() => None,
        d => Some(d.map(|t| t.max(Duration::from_millis(1)))),
    }
}

impl FrameSender for TcpSendHalf {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        self.send(kind, header, payload, None)
    }

    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.send_with(kind, len, fill, None)
    }

    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        self.begin(kind, len)
    }

    fn send_next_commit(&mut self) -> Result<()> {
        self.commit(None)
    }

    fn stats(&self) -> Stats {
        *counters(&self.stats)
    }
}

impl TcpRecvHalf {
    /// Replaces the connection from the previous node (`None`: lost): the
    /// readiness set follows (the listener stands in while there is none),
    /// and the new stream gets the read timeout.
    fn set_from_prev(&mut self, inb: Option<Inbound>) {
        if let Some(r) = self.ready.get() {
            r.remove(self.from_prev.as_ref().map_or(self.listener.as_fd(), |i| i.stream.as_fd()));
            let fd = inb.as_ref().map_or(self.listener.as_fd(), |i| i.stream.as_fd());
            if let Err(e) = r.add(fd) {
                log::warn!("tcp {}: the readiness descriptor misses the new connection ({e})", self.cfg.listen);
            }
        }
        self.from_prev = inb;
        self.applied = None;
        self.apply_timeout();
    }

    /// Gives the stream from the previous node the read timeout of the
    /// receive deadline, unless it has it already.
    fn apply_timeout(&mut self) {
        let (Some(inb), Some(t)) = (&self.from_prev, socket_timeout(self.cfg.recv_timeout)) else { return };
        if self.applied != Some(t) {
            let _ = inb.stream.set_read_timeout(t);
            self.applied = Some(t);
        }
    }

    /// After a send that may have drained the previous node's bytes into
    /// the stash (see [`TcpTransport::write`]): they make the readiness
    /// descriptor readable.
    fn after_send(&self) {
        if let Some(r) = self.ready.get()
            && self.from_prev.as_ref().is_some_and(Inbound::has_stash)
        {
            r.signal();
        }
    }

    /// Receives the next frame from the stream (accepting the previous node
    /// again first if its connection was lost) and counts it.
    fn recv_stream(&mut self, buf: &mut [u8]) -> Result<Received> {
        if self.from_prev.is_none() {
            let wait = self.cfg.recv_timeout.unwrap_or(self.cfg.setup_timeout);
            let keys = keys_now(&self.keys);
            let (s, session, proved) =
                accept_proving(&self.listener, self.cfg.prev, self.cfg.prev_port, keys.as_ref(), wait)?;
            log::info!("previous node connected again from {:?}", s.peer_addr().ok());
            lock(&self.keys.proved).prev = proved;
            self.set_from_prev(Some(Inbound::new((s, session))));
        }
        let inb = self.from_prev.as_mut().expect("connected");
        let res = TcpTransport::read(inb, &self.cfg, buf, "previous");
        let mut s = counters(&self.stats);
        match &res {
            Ok(got) => {
                s.frames_received += 1;
                s.bytes_received += got.len as u64;
            }
            Err(e) if e.is_would_block() => {}
            Err(e) if e.is_timeout() => s.timeouts += 1,
            Err(e @ TransportError::Forged { .. }) => {
                s.drops.bad_tag += 1;
                log::warn!("{e}; accepting the previous node again");
                drop(s);
                self.set_from_prev(None);
            }
            Err(e) if is_broken(e) => {
                log::info!("connection from the previous node lost ({e}); accepting it again when it comes back");
                drop(s);
                self.set_from_prev(None);
            }
            Err(_) => {}
        }
        res
    }

    /// Receives the next frame into the half's own buffer.
    fn recv_into_lend(&mut self) -> Result<Received> {
        let mut lend = std::mem::take(&mut self.lend);
        let res = FrameReceiver::recv_prev(self, lend.get(self.cfg.frame_len.max(1)));
        self.lend = lend;
        res
    }
}

impl FrameReceiver for TcpRecvHalf {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn recv_prev(&mut self, buf: &mut [u8]) -> Result<Received> {
        if let Some(r) = self.ready.get() {
            r.clear();
        }
        let res = self.recv_stream(buf);
        if let Some(r) = self.ready.get() {
            r.update(self.from_prev.as_ref().is_some_and(Inbound::has_stash));
        }
        res
    }

    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        // The kernel copies straight into the half's buffer, as it would
        // into the caller's: TCP has no copy to save on receive.
        let got = self.recv_into_lend()?;
        Ok(Lent::new(&self.lend.all()[..got.len], got.kind))
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.cfg.recv_timeout = timeout;
        self.apply_timeout();
    }

    fn ready_fd(&self) -> Result<BorrowedFd<'_>> {
        if let Some(r) = self.ready.get() {
            return Ok(r.fd());
        }
        let fd = self.from_prev.as_ref().map_or(self.listener.as_fd(), |i| i.stream.as_fd());
        let r = Readiness::new([fd], Vec::new()).map_err(|e| TransportError::io("epoll_create1", e))?;
        r.update(self.from_prev.as_ref().is_some_and(Inbound::has_stash));
        let _ = self.ready.set(r);
        Ok(self.ready.get().expect("set above").fd())
    }

    fn stats(&self) -> Stats {
        *counters(&self.stats)
    }
}
