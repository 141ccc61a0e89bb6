//! The `leap_kmod` kernel module (`/dev/leap_tensor`) as a [`Transport`]:
//! the module reassembles chunks straight into a mapped bank and sends the
//! mapped TX area as chunks, so a frame costs one ioctl each way.
//! `recv_prev_lent`, `send_next_with` and `relay` read the bank and write the
//! TX area in place (no copy in user space); `recv_prev` and `send_next`
//! copy between the caller's buffer and the mapping.
//!
//! ```no_run
//! use leap::transport::Transport;
//! use leap::transport::kmod::{KmodConfig, KmodTransport};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = KmodConfig::new(9999, "10.0.0.2:9999".parse()?);
//! let mut t = KmodTransport::open(cfg)?;
//! t.send_next(&[0u8; 16392])?;
//! # Ok(()) }
//! ```

use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leap_common::chunk::{ChunkKind, flags};
use leap_common::control::ControlMessage;
use leap_common::kmod::{
    ABI_VERSION, Counters, DEVICE_PATH, HALF_LEN, INFO_SCOPE_FILE, Info, WAIT_STATUS_LOST, features,
};

use super::{
    BackendCounters, Drops, FrameKind, FrameReceiver, FrameSender, Halves, Lent, Received, Result, Stats, Transport,
    TransportError,
};
use crate::sys::kmod::Device;

/// Features this backend needs from the loaded module.
const NEEDED: u64 = features::PER_OPEN | features::RELEASE_BANK | features::WAIT_FRAME | features::SEND_FRAME;

/// Settings of a [`KmodTransport`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KmodConfig {
    /// The device node.
    pub device: PathBuf,
    /// UDP port to listen on and send from (all local IPv4 addresses of the
    /// opener's network namespace).
    pub port: u16,
    /// The next node.
    pub next: SocketAddrV4,
    /// Accept chunks only from this sender (the previous node).
    pub prev: Option<SocketAddrV4>,
    /// Receive deadline (`None`: wait forever).
    pub recv_timeout: Option<Duration>,
    /// Time after which the module reports an incomplete frame as lost.
    pub frame_timeout: Duration,
    /// Send chunks with `reserved = 0`, exactly like the original.
    pub original_compat: bool,
}

impl KmodConfig {
    /// Defaults: the standard device, 1 s receive deadline, frames reported
    /// lost after 100 ms, leap chunk flags.
    pub fn new(port: u16, next: SocketAddrV4) -> Self {
        Self {
            device: PathBuf::from(DEVICE_PATH),
            port,
            next,
            prev: None,
            recv_timeout: Some(Duration::from_secs(1)),
            frame_timeout: Duration::from_millis(100),
            original_compat: false,
        }
    }
}

/// Errors of the kernel-module backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KmodError {
    /// Frames larger than one receive bank cannot cross the module.
    #[error(
        "frames of {0} bytes do not fit a {max}-byte receive bank of leap_kmod (the original ABI); use a datagram transport",
        max = leap_common::kmod::BANK_FRAME_MAX
    )]
    FrameTooLarge(usize),
    /// The device node does not exist: the module is not loaded.
    #[error("{path}: the leap_kmod module is not loaded (load it with `insmod leap_kmod.ko`)")]
    NotLoaded {
        /// The device path tried.
        path: PathBuf,
    },
    /// The module refused the open (EPERM): the opener lacks `CAP_NET_ADMIN`
    /// in the initial user namespace.
    #[error(
        "{path}: opening needs CAP_NET_ADMIN in the initial user namespace (run as root or with that capability, e.g. the packaged unit's); a user namespace's counts only where leap_kmod is loaded with allow_userns=1: {source}"
    )]
    NotPermitted {
        /// The device.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A call on the device failed (`on` names it).
    #[error(transparent)]
    Syscall(super::SyscallError),
    /// The loaded module is the original or another version.
    #[error(
        "{path}: module ABI {found} lacks what leap needs (ABI {ABI_VERSION}, features {NEEDED:#x}); found features {features:#x}"
    )]
    Incompatible {
        /// The device.
        path: PathBuf,
        /// ABI version it reported (0: the original, which cannot say).
        found: u32,
        /// Its feature bits.
        features: u64,
    },
    /// The module speaks IPv4 only.
    #[error("{0}: the kernel module speaks IPv4 only")]
    Ipv6(SocketAddr),
}

/// The IPv4 form of an address, or [`KmodError::Ipv6`].
///
/// # Errors
///
/// For an IPv6 address.
pub fn ipv4(addr: SocketAddr) -> Result<SocketAddrV4, KmodError> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(KmodError::Ipv6(addr)),
    }
}

/// Names of the fields of [`Counters`] (the module's `struct leap_counters`),
/// in their order; the reserved room after them is left out.
const COUNTER_NAMES: [&str; 24] = [
    "rx_chunks",
    "rx_duplicates",
    "rx_frames_completed",
    "rx_frames_delivered",
    "rx_frames_timed_out",
    "rx_lost_overflow",
    "rx_passthrough",
    "rx_not_leap",
    "drop_short",
    "drop_bad_chunk_id",
    "drop_oversize",
    "drop_bad_length",
    "drop_total_mismatch",
    "drop_too_big",
    "drop_peer",
    "drop_bad_checksum",
    "drop_bank_busy",
    "drop_stale",
    "drop_source_mismatch",
    "tx_frames",
    "tx_chunks",
    "tx_errors",
    "drop_stranger",
    "drop_not_unicast",
];

/// The module's counters as 32 `u64`s, in field order.
fn counter_array(c: &Counters) -> &[u64; 32] {
    bytemuck::cast_ref(c)
}

/// Every counter of the module by name, in field order.
pub fn counter_values(c: &Counters) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    COUNTER_NAMES.into_iter().zip(counter_array(c).iter().copied())
}

/// Counters from their values by name (`None`: 0).
pub fn counters_from(get: impl Fn(&str) -> Option<u64>) -> Counters {
    let mut c = Counters::default();
    let values: &mut [u64; 32] = bytemuck::cast_mut(&mut c);
    for (v, name) in values.iter_mut().zip(COUNTER_NAMES) {
        *v = get(name).unwrap_or(0);
    }
    c
}

/// Adds `b` to `a`, counter by counter (ring-wide sums).
pub fn add_counters(a: &mut Counters, b: &Counters) {
    let sum: &mut [u64; 32] = bytemuck::cast_mut(a);
    for (x, y) in sum.iter_mut().zip(counter_array(b)) {
        *x += y;
    }
}

/// Opens the device at `path` and returns what the module says about
/// itself (for `leap kmod status`), counters summed over `scope`.
///
/// # Errors
///
/// [`KmodError::NotLoaded`], or the failed call.
pub fn status(path: &Path, scope: u32) -> Result<Info, KmodError> {
    let dev = open_device(path)?;
    dev.info(scope).map_err(|source| syscall("LEAP_IOCTL_GET_INFO", path, source))
}

fn syscall(call: &'static str, path: &Path, source: io::Error) -> KmodError {
    KmodError::Syscall(super::SyscallError::on(call, path.display(), source))
}

fn open_device(path: &Path) -> Result<Device, KmodError> {
    Device::open(path).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOENT) => KmodError::NotLoaded { path: path.to_path_buf() },
        Some(libc::EPERM) => KmodError::NotPermitted { path: path.to_path_buf(), source },
        _ => syscall("open+mmap", path, source),
    })
}

/// One ring node on `/dev/leap_tensor`.
#[derive(Debug)]
pub struct KmodTransport {
    dev: Arc<Device>,
    cfg: KmodConfig,
    /// Shared by the halves of a split transport.
    stats: Arc<Mutex<Stats>>,
    /// A frame begun in the TX area by `send_next_begin`: kind and length.
    pending: Option<(FrameKind, usize)>,
}

impl KmodTransport {
    /// Opens the device, checks the module's ABI, binds the port and sets
    /// the destination (once) and the peer filter.
    ///
    /// # Errors
    ///
    /// [`KmodError`] naming what failed: module missing or incompatible,
    /// port taken (EADDRINUSE), ...
    pub fn open(cfg: KmodConfig) -> Result<Self, KmodError> {
        let path = cfg.device.clone();
        let dev = open_device(&path)?;
        let info = dev.info(INFO_SCOPE_FILE).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTTY) => KmodError::Incompatible { path: path.clone(), found: 0, features: 0 },
            _ => syscall("LEAP_IOCTL_GET_INFO", &path, e),
        })?;
        if info.abi_version != ABI_VERSION || info.features & NEEDED != NEEDED {
            return Err(KmodError::Incompatible { path, found: info.abi_version, features: info.features });
        }
        dev.set_frame_timeout(cfg.frame_timeout).map_err(|e| syscall("LEAP_IOCTL_SET_FRAME_TIMEOUT", &path, e))?;
        dev.set_peer(cfg.prev.map(|p| *p.ip()), cfg.prev.map(|p| p.port()))
            .map_err(|e| syscall("LEAP_IOCTL_SET_PEER", &path, e))?;
        dev.set_port(cfg.port).map_err(|e| syscall("LEAP_IOCTL_SET_PORT", &path, e))?;
        dev.set_dest(*cfg.next.ip(), cfg.next.port()).map_err(|e| syscall("LEAP_IOCTL_SET_DEST", &path, e))?;
        log::info!(
            "kmod: {} ABI {} (features {:#x}), port {}, next {}",
            path.display(),
            info.abi_version,
            info.features,
            cfg.port,
            cfg.next
        );
        Ok(Self { dev: Arc::new(dev), cfg, stats: Arc::default(), pending: None })
    }

    /// The module's counters for this node.
    ///
    /// # Errors
    ///
    /// The failed ioctl.
    pub fn counters(&self) -> Result<Counters, KmodError> {
        self.dev
            .info(INFO_SCOPE_FILE)
            .map(|i| i.counters)
            .map_err(|e| syscall("LEAP_IOCTL_GET_INFO", &self.cfg.device, e))
    }

    /// Sends the frame of `len` bytes in the TX area.
    fn send_tx(&mut self, kind: FrameKind, len: usize) -> Result<()> {
        let reserved = match (self.cfg.original_compat, kind) {
            (true, _) => 0,
            (false, FrameKind::Data) => flags::LEAP,
            (false, FrameKind::Control) => flags::LEAP | ChunkKind::Control as u16,
        };
        self.dev.send_frame(len as u32, reserved).map_err(|e| self.syscall("LEAP_IOCTL_SEND_FRAME", e))?;
        let mut s = self.count();
        s.frames_sent += 1;
        let chunks = len.div_ceil(leap_common::chunk::CHUNK_PAYLOAD_MAX) as u64;
        s.chunks_sent += chunks;
        s.datagrams_sent += chunks;
        s.bytes_sent += len as u64;
        Ok(())
    }

    /// Waits for the next frame (held in its bank until released) and tells
    /// its kind. The caller counts it with [`Self::count_received`] once the
    /// frame is taken (a frame refused as too large is not received).
    fn wait(&mut self) -> Result<(leap_common::kmod::Wait, FrameKind)> {
        let once = self.cfg.recv_timeout.is_some_and(|t| t.is_zero());
        // Poll once: ask the device first, so that WAIT_FRAME with no time
        // left does not spin in the module (busy_wait_limit) for nothing.
        if once
            && !super::ready::readable_now(std::os::fd::AsFd::as_fd(&*self.dev)).map_err(|e| self.syscall("poll", e))?
        {
            return Err(TransportError::Timeout(Duration::ZERO));
        }
        let deadline = self.cfg.recv_timeout.map(|t| Instant::now() + t);
        // A signal may interrupt the wait: retry until the deadline, at most
        // a bounded number of times.
        for _ in 0..1000 {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let w = match self.dev.wait_frame(left) {
                Ok(Some(w)) => w,
                Ok(None) => {
                    if !once {
                        self.count().timeouts += 1;
                    }
                    return Err(TransportError::Timeout(self.cfg.recv_timeout.unwrap_or_default()));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.syscall("LEAP_IOCTL_WAIT_FRAME", e)),
            };
            if w.status == WAIT_STATUS_LOST {
                self.count().frames_lost += 1;
                return Err(TransportError::FrameLost {
                    seq: w.seq,
                    missing: w.total_chunks.saturating_sub(w.chunks as u16),
                    total: w.total_chunks,
                });
            }
            let len = w.len as usize;
            let kind = if w.flags & flags::LEAP != 0 {
                match w.flags & flags::KIND_MASK {
                    k if k == ChunkKind::Control as u16 => FrameKind::Control,
                    _ => FrameKind::Data,
                }
            } else {
                // The original's frames carry no kind: look at the frame in
                // place.
                // SAFETY: WAIT_FRAME just handed the bank to this file and
                // nothing releases it before the slice's last use here.
                let frame = unsafe { self.dev.held_bank(w.bank as usize, len) };
                if ControlMessage::decode_frame(frame).is_ok() { FrameKind::Control } else { FrameKind::Data }
            };
            return Ok((w, kind));
        }
        Err(self.syscall("LEAP_IOCTL_WAIT_FRAME", io::Error::from(io::ErrorKind::Interrupted)))
    }

    /// Counts the frame `w` as received.
    fn count_received(&self, w: &leap_common::kmod::Wait) {
        let mut s = self.count();
        s.frames_received += 1;
        s.chunks_received += u64::from(w.chunks);
        s.bytes_received += u64::from(w.len);
    }

    fn count(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The same node, for the other half of a split.
    fn half(&self) -> Self {
        Self { dev: Arc::clone(&self.dev), cfg: self.cfg.clone(), stats: Arc::clone(&self.stats), pending: None }
    }

    /// See [`Transport::send_next_begin`]: the TX area.
    fn begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        self.pending = None;
        if len == 0 || len > HALF_LEN {
            return Err(TransportError::BadFrameLen(len));
        }
        self.pending = Some((kind, len));
        // SAFETY: as in `send_next_parts`: the only writer of the TX area;
        // the slice borrows `self`, so nothing sends while it lives, and any
        // send after it forgets the frame begun.
        Ok(unsafe { self.dev.tx_area(len) })
    }

    /// See [`Transport::send_next_commit`].
    fn commit(&mut self) -> Result<()> {
        let (kind, len) = self.pending.take().ok_or(TransportError::NotBegun)?;
        self.send_tx(kind, len)
    }

    /// The device's descriptor: readable while a frame or a lost report
    /// waits (the module's `poll`).
    fn device_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&*self.dev)
    }

    fn syscall(&self, call: &'static str, source: io::Error) -> TransportError {
        syscall(call, &self.cfg.device, source).into()
    }
}

impl Transport for KmodTransport {
    fn name(&self) -> &'static str {
        "kmod"
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        self.pending = None;
        let len = header.len() + payload.len();
        if len == 0 || len > HALF_LEN {
            return Err(TransportError::BadFrameLen(len));
        }
        // SAFETY: this node is the only writer of its TX area: an unsplit
        // transport is borrowed mutably, and of a split one only the sending
        // half sends.
        unsafe { self.dev.write_tx_shared(&[header, payload]) };
        self.count().copied_bytes += len as u64;
        self.send_tx(kind, len)
    }

    fn recv_prev(&mut self, out: &mut [u8]) -> Result<Received> {
        let (w, kind) = self.wait()?;
        let len = w.len as usize;
        let bank = w.bank as u32;
        if len > out.len() {
            self.dev.release_bank(bank).map_err(|e| self.syscall("LEAP_IOCTL_RELEASE_BANK", e))?;
            return Err(TransportError::FrameTooLarge { len, capacity: out.len() });
        }
        self.dev.read_bank(w.bank as usize, 0, &mut out[..len]);
        self.count_received(&w);
        self.count().copied_bytes += len as u64;
        self.dev.release_bank(bank).map_err(|e| self.syscall("LEAP_IOCTL_RELEASE_BANK", e))?;
        Ok(Received { len, kind })
    }

    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        let (w, kind) = self.wait()?;
        self.count_received(&w);
        // SAFETY: WAIT_FRAME handed the bank to this file; the `Lent` gives
        // it back (RELEASE_BANK) when dropped, after its last use of the
        // slice, and `self` stays borrowed until then.
        let bytes = unsafe { self.dev.held_bank(w.bank as usize, w.len as usize) };
        Ok(Lent::with_release(bytes, kind, &*self.dev, w.bank as u32))
    }

    fn relay(&mut self, control: &mut [u8], compute: &mut dyn FnMut(&[u8], &mut [u8])) -> Result<Received> {
        let (w, kind) = self.wait()?;
        self.count_received(&w);
        let (len, bank) = (w.len as usize, w.bank as u32);
        // SAFETY: WAIT_FRAME handed the bank to this file; it is released
        // below, after the slice's last use.
        let input = unsafe { self.dev.held_bank(w.bank as usize, len) };
        let res = if kind == FrameKind::Control {
            super::keep_control(input, control)
        } else if len == 0 || len > HALF_LEN {
            Err(TransportError::BadFrameLen(len))
        } else {
            self.pending = None;
            // SAFETY: this node is the only writer of its TX area (see
            // `send_next_parts`); the slice is gone before the SEND ioctl.
            compute(input, unsafe { self.dev.tx_area(len) });
            // The frame leaves before the bank is given back: the next node
            // does not wait for the RELEASE_BANK ioctl.
            self.send_tx(FrameKind::Data, len)
        };
        let released = self.dev.release_bank(bank).map_err(|e| self.syscall("LEAP_IOCTL_RELEASE_BANK", e));
        res?;
        released?;
        Ok(Received { len, kind })
    }

    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.pending = None;
        if len == 0 || len > HALF_LEN {
            return Err(TransportError::BadFrameLen(len));
        }
        // SAFETY: as in `send_next_parts`: the only writer of the TX area,
        // and the slice is gone before the SEND ioctl.
        fill(unsafe { self.dev.tx_area(len) });
        self.send_tx(kind, len)
    }

    fn set_frame_len(&mut self, len: usize) -> Result<()> {
        // A frame fills at most one receive bank, whatever it was opened with.
        let max = leap_common::kmod::BANK_FRAME_MAX;
        if len == 0 || len > max {
            return Err(super::frame_len_refused("kmod", len, max));
        }
        Ok(())
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.cfg.recv_timeout = timeout;
    }

    fn ready_fd(&self) -> Result<std::os::fd::BorrowedFd<'_>> {
        Ok(self.device_fd())
    }

    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        self.begin(kind, len)
    }

    fn send_next_commit(&mut self) -> Result<()> {
        self.commit()
    }

    fn stats(&self) -> Stats {
        self.all_stats()
    }

    fn backend_counters(&self) -> Option<BackendCounters> {
        Some(BackendCounters::Kmod(self.counters().ok()?))
    }

    fn split(self: Box<Self>) -> Result<Halves> {
        let sender = KmodSendHalf(self.half());
        Ok(Halves { sender: Box::new(sender), receiver: Box::new(KmodRecvHalf(*self)) })
    }
}

impl KmodTransport {
    /// Counters of both halves, with the module's drops.
    fn all_stats(&self) -> Stats {
        let mut s = *self.count();
        if let Ok(c) = self.counters() {
            s.drops = drops(&c);
        }
        s
    }
}

/// The sending half of a split [`KmodTransport`]: the TX area and the SEND
/// ioctl. The module serialises sends against its configuration, never
/// against a waiting receiver.
#[derive(Debug)]
pub struct KmodSendHalf(KmodTransport);

/// The receiving half of a split [`KmodTransport`]: waits for frames and
/// lends their banks.
#[derive(Debug)]
pub struct KmodRecvHalf(KmodTransport);

impl FrameSender for KmodSendHalf {
    fn name(&self) -> &'static str {
        "kmod"
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        self.0.send_next_parts(kind, header, payload)
    }

    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.0.send_next_with(kind, len, fill)
    }

    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        self.0.begin(kind, len)
    }

    fn send_next_commit(&mut self) -> Result<()> {
        self.0.commit()
    }

    fn stats(&self) -> Stats {
        self.0.all_stats()
    }
}

impl FrameReceiver for KmodRecvHalf {
    fn name(&self) -> &'static str {
        "kmod"
    }

    fn recv_prev(&mut self, buf: &mut [u8]) -> Result<Received> {
        self.0.recv_prev(buf)
    }

    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        self.0.recv_prev_lent()
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.0.cfg.recv_timeout = timeout;
    }

    fn ready_fd(&self) -> Result<std::os::fd::BorrowedFd<'_>> {
        Ok(self.0.device_fd())
    }

    fn stats(&self) -> Stats {
        self.0.all_stats()
    }
}

impl super::lend::Release for Device {
    fn release(&self, bank: u32) {
        if let Err(e) = self.release_bank(bank) {
            // The bank stays held: the module counts it busy until this file
            // is closed. Nothing else can be done from a drop.
            log::warn!("LEAP_IOCTL_RELEASE_BANK {bank} failed: {e}");
        }
    }
}

/// The module's drop counters in the shape every backend reports.
pub fn drops(c: &Counters) -> Drops {
    Drops {
        short: c.drop_short,
        bad_magic: c.rx_not_leap,
        bad_chunk_id: c.drop_bad_chunk_id,
        oversize: c.drop_oversize,
        bad_length: c.drop_bad_length,
        total_mismatch: c.drop_total_mismatch,
        wrong_source: c.drop_peer + c.drop_source_mismatch + c.drop_stranger + c.drop_not_unicast,
        duplicate: c.rx_duplicates,
        stale: c.drop_stale,
        out_of_window: c.drop_bank_busy,
        too_large: c.drop_too_big,
        // The module sits behind the kernel's IP and UDP checks.
        ..Drops::default()
    }
}

/// Opens a kmod node for a ring endpoint (what `open(TransportKind::Kmod, ..)`
/// does): listens on `ep.listen`'s port, sends to `ep.next`, filters on
/// `ep.prev`.
///
/// # Errors
///
/// [`KmodError`] (IPv6 addresses included).
pub fn open_endpoint(ep: &super::config::Endpoint, opts: &super::config::Options) -> Result<KmodTransport, KmodError> {
    if opts.frame_len > leap_common::kmod::BANK_FRAME_MAX {
        return Err(KmodError::FrameTooLarge(opts.frame_len));
    }
    let mut cfg = KmodConfig::new(ep.listen.port(), ipv4(ep.next)?);
    cfg.prev = ep.prev.map(ipv4).transpose()?;
    cfg.recv_timeout = opts.recv_timeout;
    cfg.original_compat = opts.original_compat;
    KmodTransport::open(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_match_the_fields() {
        let mut c = Counters::default();
        for (i, v) in bytemuck::cast_mut::<_, [u64; 32]>(&mut c).iter_mut().enumerate() {
            *v = i as u64 + 1;
        }
        let got: Vec<(&str, u64)> = counter_values(&c).collect();
        let want = [
            ("rx_chunks", c.rx_chunks),
            ("rx_duplicates", c.rx_duplicates),
            ("rx_frames_completed", c.rx_frames_completed),
            ("rx_frames_delivered", c.rx_frames_delivered),
            ("rx_frames_timed_out", c.rx_frames_timed_out),
            ("rx_lost_overflow", c.rx_lost_overflow),
            ("rx_passthrough", c.rx_passthrough),
            ("rx_not_leap", c.rx_not_leap),
            ("drop_short", c.drop_short),
            ("drop_bad_chunk_id", c.drop_bad_chunk_id),
            ("drop_oversize", c.drop_oversize),
            ("drop_bad_length", c.drop_bad_length),
            ("drop_total_mismatch", c.drop_total_mismatch),
            ("drop_too_big", c.drop_too_big),
            ("drop_peer", c.drop_peer),
            ("drop_bad_checksum", c.drop_bad_checksum),
            ("drop_bank_busy", c.drop_bank_busy),
            ("drop_stale", c.drop_stale),
            ("drop_source_mismatch", c.drop_source_mismatch),
            ("tx_frames", c.tx_frames),
            ("tx_chunks", c.tx_chunks),
            ("tx_errors", c.tx_errors),
            ("drop_stranger", c.drop_stranger),
            ("drop_not_unicast", c.drop_not_unicast),
        ];
        assert_eq!(got, want);
        let back = counters_from(|k| got.iter().find(|(n, _)| *n == k).map(|&(_, v)| v));
        assert_eq!(back, Counters { _reserved: [0; 8], ..c });
        let mut sum = back;
        add_counters(&mut sum, &back);
        assert_eq!(sum.tx_errors, 2 * c.tx_errors);
    }
}
