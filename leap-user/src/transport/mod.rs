//! The [`Transport`] trait every backend implements, its error type and its
//! counters.

#[cfg(feature = "tokio")]
pub mod asyncio;
pub mod config;
pub(crate) mod datagram;
pub(crate) mod datagram_auth;
pub(crate) mod halves;
pub mod kmod;
pub mod lend;
pub mod open;
pub mod ready;
pub mod ring_key;
mod send;
pub mod settings;
pub mod tcp;
pub mod udp;
pub mod xdp;

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use leap_common::control::{CONTROL_FRAME_MIN, ControlMessage};
use serde::Serialize;

use crate::frame::types::counters;
pub use crate::frame::types::{Drops, FrameKind, Received};
pub use lend::Lent;

/// Errors of every backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// A system call failed (every backend's system-call failures are a
    /// [`SyscallError`]; [`TransportError::syscall`] finds it whichever
    /// backend failed).
    #[error(transparent)]
    Syscall(SyscallError),
    /// No complete frame arrived before the receive deadline; with a zero
    /// deadline (poll once, see [`Transport::set_recv_timeout`]): none had
    /// arrived ([`TransportError::is_would_block`]).
    #[error("no frame within {0:?}")]
    Timeout(Duration),
    /// [`Transport::send_next_commit`] without a frame begun by
    /// [`Transport::send_next_begin`] (or one discarded since).
    #[error("no frame is begun: call send_next_begin first")]
    NotBegun,
    /// A frame could not be completed and was given up (best-effort mode).
    #[error("frame seq {seq} lost: {missing} of {total} chunks missing")]
    FrameLost {
        /// Its sequence number.
        seq: u16,
        /// Chunks that never arrived.
        missing: u16,
        /// Chunks of the frame.
        total: u16,
    },
    /// The frame does not fit the caller's buffer (it is dropped).
    #[error("frame of {len} bytes does not fit a {capacity}-byte buffer")]
    FrameTooLarge {
        /// Length of the frame on the wire.
        len: usize,
        /// Length of the caller's buffer.
        capacity: usize,
    },
    /// The frame to send is empty or longer than the format allows.
    #[error("cannot send a frame of {0} bytes (1 ..= {max} allowed)", max = leap_common::chunk::FRAME_LEN_MAX)]
    BadFrameLen(usize),
    /// The peer closed the connection.
    #[error("the {0} node closed the connection")]
    PeerClosed(&'static str),
    /// Could not reach the next node.
    #[error("cannot connect to {addr} after {attempts} attempts: {source}")]
    Connect {
        /// Where we tried to connect.
        addr: std::net::SocketAddr,
        /// How often.
        attempts: u32,
        /// The last error.
        #[source]
        source: io::Error,
    },
    /// This backend cannot do that (e.g. `send_prev` on a ring that only
    /// flows forward).
    #[error("{0} is not supported by this transport")]
    Unsupported(&'static str),
    /// Settings by name that cannot be taken or do not go together (see
    /// [`settings::Settings`]).
    #[error(transparent)]
    Setting(settings::SettingError),
    /// A control message could not be encoded.
    #[error("invalid control message: {0:?}")]
    Control(leap_common::control::ControlError),
    /// The UDP backend could not be set up.
    #[error(transparent)]
    Udp(#[from] udp::UdpError),
    /// The XDP backend failed.
    #[error(transparent)]
    Xdp(#[from] xdp::XdpError),
    /// The kernel-module backend failed.
    #[error(transparent)]
    Kmod(#[from] kmod::KmodError),
    /// A frame from the `peer` side failed its ring-key tag (forged,
    /// altered, replayed or reordered): its bytes were not delivered and
    /// the connection was dropped.
    #[error("a frame from the {peer} node failed its ring-key tag (forged or altered); its connection was dropped")]
    Forged {
        /// "previous" or "next".
        peer: &'static str,
    },
    /// A TCP peer did not prove the ring key ([`ring_key`]): nothing was
    /// sent to it or taken from it.
    #[error("{peer} did not prove the ring key: {source}")]
    RingKey {
        /// The other end of the connection.
        peer: std::net::SocketAddr,
        /// What went wrong.
        #[source]
        source: ring_key::ProofError,
    },
    /// No frame came back around the ring for too long (the head's stall
    /// timeout).
    #[error("no frame came back for {waited:?} ({last})")]
    Stalled {
        /// How long the head waited.
        waited: Duration,
        /// The last receive error.
        #[source]
        last: Box<TransportError>,
    },
}

/// A system call that failed: which, on what, and what the kernel said.
/// The one type of system-call failure of every backend.
#[derive(Debug, thiserror::Error)]
#[error("{call}{} failed: {source}", on_text(.on))]
#[non_exhaustive]
pub struct SyscallError {
    /// The call, e.g. `"sendmsg"` or `"LEAP_IOCTL_SET_PORT"`.
    pub call: &'static str,
    /// What it was called on (an address, a device, an AF_XDP socket), if
    /// that says more than the call.
    pub on: Option<String>,
    /// What the kernel said.
    #[source]
    pub source: io::Error,
}

fn on_text(on: &Option<String>) -> String {
    on.as_deref().map(|o| format!(" on {o}")).unwrap_or_default()
}

impl SyscallError {
    /// `call` failed with `source`.
    pub fn new(call: &'static str, source: io::Error) -> Self {
        Self { call, on: None, source }
    }

    /// `call` on `on` failed with `source`.
    pub fn on(call: &'static str, on: impl std::fmt::Display, source: io::Error) -> Self {
        Self { call, on: Some(on.to_string()), source }
    }

    /// The `errno`, when the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

impl TransportError {
    /// Wraps the last OS error of `call`.
    pub fn last_os(call: &'static str) -> Self {
        Self::io(call, io::Error::last_os_error())
    }

    /// Wraps an `io::Error` of `call`.
    pub fn io(call: &'static str, source: io::Error) -> Self {
        Self::Syscall(SyscallError::new(call, source))
    }

    /// The failed system call behind this error, whichever backend it came
    /// from.
    pub fn syscall(&self) -> Option<&SyscallError> {
        match self {
            Self::Syscall(e)
            | Self::Udp(udp::UdpError::Syscall(e))
            | Self::Xdp(xdp::XdpError::Syscall(e))
            | Self::Kmod(kmod::KmodError::Syscall(e)) => Some(e),
            Self::Stalled { last, .. } => last.syscall(),
            _ => None,
        }
    }

    /// Whether the error means "nothing arrived in time" (the caller may retry).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }

    /// Whether the error is a receive that polled once (zero deadline) and
    /// found no complete frame: wait for [`Transport::ready_fd`], then try
    /// again.
    pub fn is_would_block(&self) -> bool {
        matches!(self, Self::Timeout(d) if d.is_zero())
    }
}

/// Result of transport operations.
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

counters! {
/// Counters of one transport instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Frames handed to the network.
    pub frames_sent: u64,
    /// Frames delivered to the caller.
    pub frames_received: u64,
    /// Datagrams (chunks) sent, retransmissions included.
    pub chunks_sent: u64,
    /// Datagrams that carried frames' first copies (a chunk train counts
    /// once): divided by `frames_sent`, the datagrams per frame.
    pub datagrams_sent: u64,
    /// Valid chunks taken into a frame.
    pub chunks_received: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Payload bytes delivered.
    pub bytes_received: u64,
    /// Frames given up (deadline or overtaken).
    pub frames_lost: u64,
    /// Chunks sent again in answer to a NACK.
    pub retransmits: u64,
    /// Chunks received that only a retransmission or a probe brought: each
    /// one a chunk really lost on the way (a retransmitted copy of a chunk
    /// that had arrived is `drops.stale` or `drops.duplicate`, not this).
    pub chunks_recovered: u64,
    /// Tail-loss probes sent (the last chunk of the last frame, again).
    pub probes: u64,
    /// NACKs sent to the previous node.
    pub nacks_sent: u64,
    /// NACKs received from the next node.
    pub nacks_received: u64,
    /// Receive calls that hit their deadline.
    pub timeouts: u64,
    /// NACKs refused: too many for one frame.
    pub nacks_refused: u64,
    /// NACKs for frames no longer kept.
    pub nacks_unknown: u64,
    /// Sends that failed (frames, retransmissions, probes, NACKs, hellos).
    pub send_errors: u64,
    /// Hellos sent (challenges and answers to neighbours).
    pub hellos_sent: u64,
    /// Hellos taken from a neighbour.
    pub hellos_received: u64,
    /// Datagrams the kernel dropped on the node's UDP socket (receive buffer
    /// full) before leap saw them.
    pub kernel_drops: u64,
    /// Frame bytes copied in user space (receive and send, retransmit
    /// buffer included): divided by the bytes moved, the copies per hop.
    pub copied_bytes: u64,
    /// Dropped datagrams by reason.
    pub drops: Drops,
}
}

/// What a backend counts beyond [`Stats`]: the XDP program's decisions or
/// the kernel module's counters. Serialised as one flat object of counters
/// by name (what `leap stats --json` shows under `backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendCounters {
    /// The XDP backends (`xdp`, `xdp-ringbuf`).
    #[non_exhaustive]
    Xdp {
        /// The program's decisions, summed over CPUs.
        program: xdp::XdpCounters,
        /// Chunks that reached user space through the kernel's UDP socket
        /// instead of the program.
        chunks_via_kernel: u64,
    },
    /// The `leap_kmod` kernel module (counters of this open file).
    Kmod(leap_common::kmod::Counters),
}

impl BackendCounters {
    /// The XDP backends' counters.
    pub fn xdp(program: xdp::XdpCounters, chunks_via_kernel: u64) -> Self {
        Self::Xdp { program, chunks_via_kernel }
    }

    /// Every counter by name, in a fixed order.
    pub fn values(&self) -> Vec<(&'static str, u64)> {
        match self {
            Self::Xdp { program, chunks_via_kernel } => {
                let mut v = program.values().collect::<Vec<_>>();
                v.push((XDP_VIA_KERNEL, *chunks_via_kernel));
                v
            }
            Self::Kmod(c) => kmod::counter_values(c).collect(),
        }
    }

    /// One counter by name.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values().into_iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// Adds `other`'s counters to these (ring-wide sums).
    ///
    /// # Errors
    ///
    /// When the two come from different backends (nothing is added).
    pub fn add(&mut self, other: &Self) -> Result<(), MixedBackends> {
        match (self, other) {
            (Self::Xdp { program, chunks_via_kernel }, Self::Xdp { program: p, chunks_via_kernel: v }) => {
                program.add(p);
                *chunks_via_kernel += v;
            }
            (Self::Kmod(a), Self::Kmod(b)) => kmod::add_counters(a, b),
            _ => return Err(MixedBackends),
        }
        Ok(())
    }

    /// The sum of `items`; `None` when there are none. Counters of another
    /// backend than the first are left out.
    pub fn sum<'a>(items: impl IntoIterator<Item = &'a Self>) -> Option<Self> {
        let mut it = items.into_iter();
        let mut acc = *it.next()?;
        for c in it {
            let _ = acc.add(c);
        }
        Some(acc)
    }
}

impl std::fmt::Display for BackendCounters {
    /// One line per counter, as `leap xdp stats` prints the program's.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, v) in self.values() {
            writeln!(f, "{k:<22}{v:>14}")?;
        }
        Ok(())
    }
}

/// [`BackendCounters::add`] of counters of different backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("counters of different backends cannot be added")]
pub struct MixedBackends;

/// Name of [`BackendCounters::Xdp::chunks_via_kernel`] when serialised.
const XDP_VIA_KERNEL: &str = "chunks_via_kernel";

impl Serialize for BackendCounters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let values = self.values();
        let mut m = s.serialize_map(Some(values.len()))?;
        for (k, v) in values {
            m.serialize_entry(k, &v)?;
        }
        m.end()
    }
}

impl<'de> serde::Deserialize<'de> for BackendCounters {
    /// From the flat object [`Serialize`] writes: the kernel module's when it
    /// has the module's `rx_chunks`, else the XDP program's. Names it does
    /// not know (from a newer leap) are ignored.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let map: std::collections::BTreeMap<String, u64> = serde::Deserialize::deserialize(d)?;
        let get = |k: &str| map.get(k).copied();
        if map.contains_key("rx_chunks") {
            Ok(Self::Kmod(kmod::counters_from(get)))
        } else {
            Ok(Self::Xdp {
                program: xdp::XdpCounters::from_values(get),
                chunks_via_kernel: get(XDP_VIA_KERNEL).unwrap_or(0),
            })
        }
    }
}

/// Moves frames around the ring: to the next node, from the previous one.
///
/// Frames are opaque bytes (in practice an 8-byte
/// [`FrameHeader`](leap_common::frame::FrameHeader) and `dim` f32s).
/// Control frames travel in band, padded to the frame size, as in the
/// original; [`Received::kind`] says which is which.
pub trait Transport: Send {
    /// Short name: `"tcp"`, `"udp"`, `"xdp"`, ...
    fn name(&self) -> &'static str;

    /// Sends one frame made of `header` followed by `payload` to the next
    /// node, without merging them into a new buffer.
    ///
    /// # Errors
    ///
    /// A failed system call, a frame of a length the wire cannot carry, or a
    /// lost connection.
    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()>;

    /// Receives the next frame from the previous node into `buf` and returns
    /// its length and kind. Waits at most the receive timeout.
    ///
    /// # Errors
    ///
    /// [`TransportError::Timeout`] when nothing complete arrived in time,
    /// [`TransportError::FrameLost`] when a frame was given up,
    /// [`TransportError::FrameTooLarge`], or a system-call error.
    fn recv_prev(&mut self, buf: &mut [u8]) -> Result<Received>;

    /// Receives the next frame from the previous node and lends it: the
    /// caller reads it where the transport put it (the kernel module's
    /// receive bank, the transport's own reassembly buffer) and gives it back
    /// by dropping it. Waits at most the receive timeout.
    ///
    /// # Errors
    ///
    /// As [`Self::recv_prev`].
    fn recv_prev_lent(&mut self) -> Result<Lent<'_>>;

    /// Sends a frame of `len` bytes that `fill` writes in place into memory
    /// the transport owns (the module's transmit area; in reliable mode the
    /// slot that keeps the frame for NACKs), so the frame is not copied
    /// again. `fill` gets exactly `len` bytes, holding whatever an earlier
    /// frame left: it must write all of them.
    ///
    /// # Errors
    ///
    /// As [`Self::send_next_parts`].
    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()>;

    /// One worker step: receives the next frame and, for a data frame, sends
    /// on the frame that `compute(input, output)` writes, of the same
    /// length: the input is read where the transport received it and the
    /// output written where the transport sends it from, so the frame is not
    /// copied by the transport either way. A control frame is not forwarded:
    /// it is copied into `control` and returned for the caller to handle.
    ///
    /// For the datagram transports `compute` runs without the link locked:
    /// the driver answers the next node's NACKs meanwhile.
    ///
    /// # Errors
    ///
    /// As [`Self::recv_prev`] (a control frame larger than `control` is
    /// [`TransportError::FrameTooLarge`]), then as [`Self::send_next_with`].
    fn relay(&mut self, control: &mut [u8], compute: &mut dyn FnMut(&[u8], &mut [u8])) -> Result<Received>;

    /// Sets the receive deadline of [`Self::recv_prev`],
    /// [`Self::recv_prev_lent`] and [`Self::relay`] (`None`: wait forever).
    ///
    /// `Some(Duration::ZERO)` means *poll once*: a receive takes what has
    /// arrived and returns a complete frame if there is one, else fails at
    /// once with `Timeout(Duration::ZERO)`
    /// ([`TransportError::is_would_block`]): it never blocks or spins,
    /// gives up no partial frame for the deadline and counts no timeout
    /// (loss recovery's own decisions still happen, as in any receive).
    /// With [`Self::ready_fd`] this is what an event loop needs.
    fn set_recv_timeout(&mut self, timeout: Option<Duration>);

    /// A descriptor for event loops (`poll`, `epoll`, an asyncio reader),
    /// owned by the transport: after a receive that polled once (see
    /// [`Self::set_recv_timeout`]) found nothing, it becomes readable when a
    /// receive may make progress: a frame may be taken (also one that the
    /// transport completed or took off the wire in the background) or a
    /// lost one reported. It may also be readable when a receive then finds
    /// nothing (a hello, a chunk of an incomplete frame): poll again.
    /// Created on the first call; the same descriptor after that.
    ///
    /// # Errors
    ///
    /// `epoll_create1`, `eventfd` or `dup` failed.
    fn ready_fd(&self) -> Result<BorrowedFd<'_>>;

    /// The first half of [`Self::send_next_with`] for callers that cannot
    /// pass a closure (the C library): the `len` bytes to write a frame of
    /// `kind` into, in place, holding whatever an earlier frame left.
    /// [`Self::send_next_commit`] sends it. Beginning again, or sending any
    /// other way, first discards a frame begun and not committed (nothing of
    /// it is sent).
    ///
    /// # Errors
    ///
    /// As [`Self::send_next_with`] (a bad length; the first frame may wait
    /// for the next node to prove itself).
    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]>;

    /// Sends the frame begun with [`Self::send_next_begin`].
    ///
    /// # Errors
    ///
    /// [`TransportError::NotBegun`], else as [`Self::send_next_with`].
    fn send_next_commit(&mut self) -> Result<()>;

    /// The counters so far.
    fn stats(&self) -> Stats;

    /// Backend-specific counters (the XDP program's, the kernel module's).
    fn backend_counters(&self) -> Option<BackendCounters> {
        None
    }

    /// A handle that releases the lock on the previous node's source from
    /// another thread (the operator's `leap stats --release-source`), where
    /// the backend locks onto the first source (the datagram paths with no
    /// previous node configured); `None` elsewhere.
    fn source_control(&self) -> Option<SourceControl> {
        None
    }

    /// A handle that gives the open transport new ring keys from another
    /// thread, also once it is split or in a receive call (the operator's
    /// `SIGHUP` or `leap stats --reload-keys`): the datagram transports
    /// seal and open with them from the next datagram on; tcp proves them
    /// on its next connection. `None` where no key can be taken (kmod).
    fn key_control(&self) -> Option<KeyControl> {
        None
    }

    /// Sends one contiguous frame to the next node.
    ///
    /// # Errors
    ///
    /// As [`Self::send_next_parts`].
    fn send_next(&mut self, frame: &[u8]) -> Result<()> {
        self.send_next_parts(FrameKind::Data, frame, &[])
    }

    /// Sends header + payload as one frame (the original's
    /// `send_multipart_next`).
    ///
    /// # Errors
    ///
    /// As [`Self::send_next_parts`].
    fn send_multipart_next(&mut self, header: &[u8], payload: &[u8]) -> Result<()> {
        self.send_next_parts(FrameKind::Data, header, payload)
    }

    /// Sends a control message padded with zeros to `frame_len` bytes.
    ///
    /// # Errors
    ///
    /// [`TransportError::Control`] for an invalid message or a frame too
    /// small to hold it, else as [`Self::send_next_parts`].
    fn send_control(&mut self, msg: &ControlMessage, frame_len: usize) -> Result<()> {
        let mut head = [0u8; CONTROL_FRAME_MIN];
        msg.encode(&mut head).map_err(TransportError::Control)?;
        if frame_len < CONTROL_FRAME_MIN {
            return Err(TransportError::Control(leap_common::control::ControlError::Short));
        }
        // Control frames are rare; a zeroed buffer per message is fine.
        let padding = vec![0u8; frame_len - CONTROL_FRAME_MIN];
        self.send_next_parts(FrameKind::Control, &head, &padding)
    }

    /// Splits the transport into a sender and a receiver that live on
    /// different threads: a worker receives frame N+1 while it computes N
    /// and sends N-1. Loss recovery keeps running in the background.
    ///
    /// # Errors
    ///
    /// [`TransportError::Unsupported`] where the backend cannot (the
    /// transport is dropped).
    fn split(self: Box<Self>) -> Result<Halves> {
        Err(TransportError::Unsupported("split"))
    }

    /// Sets the length of the frames to come, once it is known after
    /// opening (the original engine connects first and learns its frame
    /// size after): TCP with raw framing reads frames of exactly `len`
    /// bytes from the next receive on (length framing carries each frame's
    /// length and takes frames up to `len`); the datagram transports and
    /// the module take frames of up to `len` bytes, which must be within
    /// what they were opened for (`frame_size`; the module's bank): their
    /// buffers grow to the frames they hold, so nothing is allocated here.
    ///
    /// # Errors
    ///
    /// [`TransportError::Setting`] (key `frame_size`) for 0 or a length
    /// beyond what the transport was opened for;
    /// [`TransportError::Unsupported`] by default.
    fn set_frame_len(&mut self, len: usize) -> Result<()> {
        let _ = len;
        Err(TransportError::Unsupported("set_frame_len"))
    }

    /// Sends a frame back to the previous node, where the backend can.
    ///
    /// # Errors
    ///
    /// [`TransportError::Unsupported`] by default.
    fn send_prev(&mut self, _frame: &[u8]) -> Result<()> {
        Err(TransportError::Unsupported("send_prev"))
    }

    /// Receives a frame from the next node, where the backend can.
    ///
    /// # Errors
    ///
    /// [`TransportError::Unsupported`] by default.
    fn recv_next(&mut self, _buf: &mut [u8]) -> Result<Received> {
        Err(TransportError::Unsupported("recv_next"))
    }
}

/// The error of [`Transport::set_frame_len`] for a length a transport
/// cannot take: 0, or beyond `max` bytes (what it was opened for).
pub(crate) fn frame_len_refused(name: &str, len: usize, max: usize) -> TransportError {
    let problem = if len == 0 {
        "frames of 0 bytes: give the frame length (8 + dim * 4 for the original engine)".to_string()
    } else {
        format!(
            "frames of {len} bytes are beyond the {max} bytes this {name} transport was opened for: open it with frame_size = {len} or more"
        )
    };
    TransportError::Setting(settings::SettingError { key: "frame_size".into(), problem })
}

/// Copies a control frame that [`Transport::relay`] does not forward into
/// the caller's buffer.
pub(crate) fn keep_control(input: &[u8], control: &mut [u8]) -> Result<()> {
    let capacity = control.len();
    control
        .get_mut(..input.len())
        .ok_or(TransportError::FrameTooLarge { len: input.len(), capacity })?
        .copy_from_slice(input);
    Ok(())
}

/// The sending half of a split transport (see [`Transport::split`]).
pub trait FrameSender: Send {
    /// Short name of the transport.
    fn name(&self) -> &'static str;

    /// As [`Transport::send_next_parts`].
    ///
    /// # Errors
    ///
    /// As [`Transport::send_next_parts`].
    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()>;

    /// As [`Transport::send_next_with`].
    ///
    /// # Errors
    ///
    /// As [`Transport::send_next_with`].
    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()>;

    /// As [`Transport::send_next_begin`].
    ///
    /// # Errors
    ///
    /// As [`Transport::send_next_begin`].
    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]>;

    /// As [`Transport::send_next_commit`].
    ///
    /// # Errors
    ///
    /// As [`Transport::send_next_commit`].
    fn send_next_commit(&mut self) -> Result<()>;

    /// The transport's counters (both halves).
    fn stats(&self) -> Stats;

    /// As [`Transport::send_next`].
    ///
    /// # Errors
    ///
    /// As [`Transport::send_next_parts`].
    fn send_next(&mut self, frame: &[u8]) -> Result<()> {
        self.send_next_parts(FrameKind::Data, frame, &[])
    }
}

/// The receiving half of a split transport (see [`Transport::split`]).
pub trait FrameReceiver: Send {
    /// Short name of the transport.
    fn name(&self) -> &'static str;

    /// As [`Transport::recv_prev`].
    ///
    /// # Errors
    ///
    /// As [`Transport::recv_prev`].
    fn recv_prev(&mut self, buf: &mut [u8]) -> Result<Received>;

    /// As [`Transport::recv_prev_lent`].
    ///
    /// # Errors
    ///
    /// As [`Transport::recv_prev`].
    fn recv_prev_lent(&mut self) -> Result<Lent<'_>>;

    /// As [`Transport::set_recv_timeout`] (a zero deadline polls once).
    fn set_recv_timeout(&mut self, timeout: Option<Duration>);

    /// As [`Transport::ready_fd`].
    ///
    /// # Errors
    ///
    /// As [`Transport::ready_fd`].
    fn ready_fd(&self) -> Result<BorrowedFd<'_>>;

    /// The transport's counters (both halves).
    fn stats(&self) -> Stats;
}

/// A transport split in two (see [`Transport::split`]).
pub struct Halves {
    /// Sends to the next node.
    pub sender: Box<dyn FrameSender>,
    /// Receives from the previous node.
    pub receiver: Box<dyn FrameReceiver>,
}

impl std::fmt::Debug for Halves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Halves").field("transport", &self.sender.name()).finish_non_exhaustive()
    }
}

/// Releases a datagram link's lock on the first source it took frames from
/// (see [`Transport::source_control`]); usable from any thread.
#[derive(Clone)]
pub struct SourceControl(std::sync::Arc<dyn Fn() -> Option<std::net::SocketAddr> + Send + Sync>);

impl SourceControl {
    pub(crate) fn new(release: impl Fn() -> Option<std::net::SocketAddr> + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(release))
    }

    /// Releases the lock: frames are then taken from the next source that
    /// sends a valid chunk. Returns the source that held it (`None`: no
    /// lock was held, or the previous node is configured).
    pub fn release(&self) -> Option<std::net::SocketAddr> {
        (self.0)()
    }
}

/// Gives an open transport new ring keys (see [`Transport::key_control`]);
/// usable from any thread.
#[derive(Clone)]
pub struct KeyControl(
    std::sync::Arc<dyn Fn(ring_key::KeySet) -> std::result::Result<(), ring_key::KeyChangeError> + Send + Sync>,
);

impl KeyControl {
    pub(crate) fn new(
        set: impl Fn(ring_key::KeySet) -> std::result::Result<(), ring_key::KeyChangeError> + Send + Sync + 'static,
    ) -> Self {
        Self(std::sync::Arc::new(set))
    }

    /// Seals and opens with `keys` from now on (a previous key in them is
    /// still taken, and used towards a neighbour not yet heard under the
    /// new one, so a ring changes keys node by node without losing a
    /// frame; see `KeySet`).
    ///
    /// # Errors
    ///
    /// [`ring_key::KeyChangeError`]: the transport runs unkeyed, or
    /// `encrypt` differs; the keys in use stay.
    pub fn set_keys(&self, keys: ring_key::KeySet) -> std::result::Result<(), ring_key::KeyChangeError> {
        (self.0)(keys)
    }
}

impl std::fmt::Debug for KeyControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyControl")
    }
}

impl std::fmt::Debug for SourceControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourceControl")
    }
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        (**self).send_next_parts(kind, header, payload)
    }
    fn recv_prev(&mut self, buf: &mut [u8]) -> Result<Received> {
        (**self).recv_prev(buf)
    }
    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        (**self).recv_prev_lent()
    }
    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        (**self).send_next_with(kind, len, fill)
    }
    fn relay(&mut self, control: &mut [u8], compute: &mut dyn FnMut(&[u8], &mut [u8])) -> Result<Received> {
        (**self).relay(control, compute)
    }
    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        (**self).set_recv_timeout(timeout)
    }
    fn ready_fd(&self) -> Result<BorrowedFd<'_>> {
        (**self).ready_fd()
    }
    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        (**self).send_next_begin(kind, len)
    }
    fn send_next_commit(&mut self) -> Result<()> {
        (**self).send_next_commit()
    }
    fn stats(&self) -> Stats {
        (**self).stats()
    }
    fn backend_counters(&self) -> Option<BackendCounters> {
        (**self).backend_counters()
    }
    fn source_control(&self) -> Option<SourceControl> {
        (**self).source_control()
    }
    fn key_control(&self) -> Option<KeyControl> {
        (**self).key_control()
    }
    fn send_control(&mut self, msg: &ControlMessage, frame_len: usize) -> Result<()> {
        (**self).send_control(msg, frame_len)
    }
    fn split(self: Box<Self>) -> Result<Halves> {
        (*self).split()
    }
    fn set_frame_len(&mut self, len: usize) -> Result<()> {
        (**self).set_frame_len(len)
    }
    fn send_prev(&mut self, frame: &[u8]) -> Result<()> {
        (**self).send_prev(frame)
    }
    fn recv_next(&mut self, buf: &mut [u8]) -> Result<Received> {
        (**self).recv_next(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Stats` as JSON with every counter, nested ones included, set by
    /// `value(index of the counter)`.
    fn every_counter(value: impl Fn(u64) -> u64) -> serde_json::Value {
        fn fill(v: &mut serde_json::Value, next: &mut u64, value: &dyn Fn(u64) -> u64) {
            match v {
                serde_json::Value::Object(m) => m.values_mut().for_each(|f| fill(f, next, value)),
                n => {
                    assert!(n.is_u64(), "a counter that is not a number: {n}");
                    *n = value(*next).into();
                    *next += 1;
                }
            }
        }
        let mut v = serde_json::to_value(Stats::default()).unwrap();
        fill(&mut v, &mut 0, &value);
        v
    }

    #[test]
    fn stats_add_sums_every_counter() {
        let a: Stats = serde_json::from_value(every_counter(|i| i + 1)).unwrap();
        let b: Stats = serde_json::from_value(every_counter(|i| 1000 * (i + 1))).unwrap();
        let mut sum = a;
        sum.add(&b);
        assert_eq!(serde_json::to_value(sum).unwrap(), every_counter(|i| 1001 * (i + 1)));
    }

    #[test]
    fn drops_total_counts_every_reason() {
        let reasons = serde_json::to_value(Drops::default()).unwrap().as_object().unwrap().clone();
        let ones: serde_json::Map<_, _> = reasons.keys().map(|k| (k.clone(), 1.into())).collect();
        let ones: Drops = serde_json::from_value(ones.into()).unwrap();
        assert_eq!(ones.total(), reasons.len() as u64, "Drops::total leaves a reason out");
    }

    #[test]
    fn backend_counters_serialise_flat_and_come_back_as_the_same_backend() {
        let program = xdp::XdpCounters::from_values(|k| (k == "to_xsk").then_some(12));
        let x = BackendCounters::xdp(program, 3);
        let j = serde_json::to_value(x).unwrap();
        assert_eq!((j["to_xsk"].as_u64(), j["chunks_via_kernel"].as_u64()), (Some(12), Some(3)));
        assert_eq!(serde_json::from_value::<BackendCounters>(j).unwrap(), x);

        let c = leap_common::kmod::Counters { rx_chunks: 5, drop_not_unicast: 1, ..Default::default() };
        let k = BackendCounters::Kmod(c);
        let j = serde_json::to_value(k).unwrap();
        assert_eq!(j["rx_chunks"], 5);
        assert_eq!(serde_json::from_value::<BackendCounters>(j).unwrap(), k);
    }

    #[test]
    fn backend_counters_add_up_per_backend_only() {
        let x = BackendCounters::xdp(xdp::XdpCounters::from_values(|_| Some(1)), 2);
        let k = BackendCounters::Kmod(leap_common::kmod::Counters { rx_chunks: 1, ..Default::default() });
        let sum = BackendCounters::sum(&[x, x, k]).unwrap();
        assert_eq!((sum.get("to_xsk"), sum.get("chunks_via_kernel")), (Some(2), Some(4)));
        let mut k2 = k;
        assert_eq!(k2.add(&x), Err(MixedBackends));
        assert_eq!(k2.add(&k).map(|()| k2.get("rx_chunks")), Ok(Some(2)));
    }
}
