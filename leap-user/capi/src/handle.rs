//! What the handles hold: a receive side with the frame it lends (or holds
//! after a peek), and a send side with the frame begun in place. Written
//! once for a whole transport and for its split halves.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use leap_common::control::CONTROL_FRAME_MIN;
use leap_rs::transport::{FrameKind, FrameReceiver, FrameSender, Lent, Received, Stats, Transport};

use crate::error::{Error, Result, leap_status};
use crate::types::leap_control;

type TResult<T> = leap_rs::transport::Result<T>;

/// What a receive side needs of a transport or its receiving half.
pub trait Receives {
    fn recv(&mut self, buf: &mut [u8]) -> TResult<Received>;
    fn recv_lent(&mut self) -> TResult<Lent<'_>>;
    fn set_timeout(&mut self, t: Option<Duration>);
    fn ready(&self) -> TResult<BorrowedFd<'_>>;
    fn counters(&self) -> Stats;
}

/// What a send side needs of a transport or its sending half.
pub trait Sends {
    fn send_parts(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> TResult<()>;
    fn begin(&mut self, len: usize) -> TResult<&mut [u8]>;
    fn commit(&mut self) -> TResult<()>;
}

impl Receives for dyn Transport {
    fn recv(&mut self, buf: &mut [u8]) -> TResult<Received> {
        self.recv_prev(buf)
    }
    fn recv_lent(&mut self) -> TResult<Lent<'_>> {
        self.recv_prev_lent()
    }
    fn set_timeout(&mut self, t: Option<Duration>) {
        self.set_recv_timeout(t);
    }
    fn ready(&self) -> TResult<BorrowedFd<'_>> {
        self.ready_fd()
    }
    fn counters(&self) -> Stats {
        self.stats()
    }
}

impl Receives for dyn FrameReceiver {
    fn recv(&mut self, buf: &mut [u8]) -> TResult<Received> {
        self.recv_prev(buf)
    }
    fn recv_lent(&mut self) -> TResult<Lent<'_>> {
        self.recv_prev_lent()
    }
    fn set_timeout(&mut self, t: Option<Duration>) {
        self.set_recv_timeout(t);
    }
    fn ready(&self) -> TResult<BorrowedFd<'_>> {
        self.ready_fd()
    }
    fn counters(&self) -> Stats {
        self.stats()
    }
}

impl Sends for dyn Transport {
    fn send_parts(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> TResult<()> {
        self.send_next_parts(kind, head, tail)
    }
    fn begin(&mut self, len: usize) -> TResult<&mut [u8]> {
        self.send_next_begin(FrameKind::Data, len)
    }
    fn commit(&mut self) -> TResult<()> {
        self.send_next_commit()
    }
}

impl Sends for dyn FrameSender {
    fn send_parts(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> TResult<()> {
        self.send_next_parts(kind, head, tail)
    }
    fn begin(&mut self, len: usize) -> TResult<&mut [u8]> {
        self.send_next_begin(FrameKind::Data, len)
    }
    fn commit(&mut self) -> TResult<()> {
        self.send_next_commit()
    }
}

fn state(message: &'static std::ffi::CStr) -> Error {
    Error::fixed(leap_status::LEAP_ERR_STATE, message)
}

/// A frame the receive side holds: lent to the caller, or peeked.
struct Held {
    /// Borrows the transport the side owns (see [`RecvSide`]).
    frame: Lent<'static>,
    /// Handed out by a lent receive (else only peeked).
    lent: bool,
}

/// A received frame handed to C: where it is, its length and kind.
#[derive(Clone, Copy, Debug)]
pub struct FrameView {
    pub ptr: *const u8,
    pub len: usize,
    pub kind: FrameKind,
}

impl Held {
    fn view(&self) -> FrameView {
        FrameView { ptr: self.frame.as_ptr(), len: self.frame.len(), kind: self.frame.kind() }
    }
}

/// The receiving side of a handle: the transport (or its receiving half)
/// and the frame it holds.
///
/// `held` borrows `*rx` with its lifetime erased: `rx` is boxed (the
/// transport does not move while the handle lives), `held` is declared
/// first so that it is dropped first, and no receive runs while a frame is
/// held (every receive checks `held`). A send on the same transport while
/// a frame is held writes other memory (the transmit buffer or area, never
/// the buffer or bank a frame is lent from).
pub struct RecvSide<T: ?Sized + Receives> {
    held: Option<Held>,
    rx: Box<T>,
    /// The receive deadline asked for (a peek polls once, then restores it).
    timeout: Option<Duration>,
    /// Bytes this binding copied (a peeked frame received by copy).
    copied: u64,
    /// The largest frame (`frame_size`): what a receive buffer must hold.
    frame_len: usize,
}

/// Erases the lifetime of a lent frame.
///
/// # Safety
///
/// The frame must be dropped before the transport it borrows is used for
/// another receive, moved or dropped (see [`RecvSide`]).
unsafe fn erase(frame: Lent<'_>) -> Lent<'static> {
    // SAFETY: only the lifetime changes; the caller keeps the borrow's rules.
    unsafe { std::mem::transmute::<Lent<'_>, Lent<'static>>(frame) }
}

impl<T: ?Sized + Receives> RecvSide<T> {
    pub fn new(rx: Box<T>, timeout: Option<Duration>, frame_len: usize) -> Self {
        Self { held: None, rx, timeout, copied: 0, frame_len }
    }

    /// The largest frame.
    pub fn frame_len(&self) -> usize {
        self.frame_len
    }

    /// Sets the largest frame (what a receive buffer must hold), once the
    /// transport took it ([`leap_rs::transport::Transport::set_frame_len`]).
    pub fn set_frame_len(&mut self, len: usize) {
        self.frame_len = len;
    }

    /// The transport, to send on (whole transports) or split.
    pub fn inner(&mut self) -> &mut T {
        &mut self.rx
    }

    /// Whether a frame is held (lent or peeked).
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// Gives up the frame held and the transport.
    pub fn into_parts(self) -> (Box<T>, Option<Duration>, u64) {
        let Self { held, rx, timeout, copied, .. } = self;
        drop(held);
        (rx, timeout, copied)
    }

    /// Receives a frame into `buf` (a frame held after a peek is copied
    /// out and given back).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<(usize, FrameKind)> {
        if buf.len() < self.frame_len && self.held.as_ref().is_none_or(|h| h.frame.len() > buf.len()) {
            // The datagram transports would drop a frame that does not fit
            // and wait on: refuse before anything is received.
            return Err(Error::new(
                leap_status::LEAP_ERR_TOO_LARGE,
                format_args!(
                    "a receive buffer of {} bytes is shorter than frame_size ({} bytes): nothing was received; pass a buffer of at least frame_size bytes",
                    buf.len(),
                    self.frame_len
                ),
            ));
        }
        match &self.held {
            Some(h) if h.lent => Err(state(c"a lent frame is not released: call leap_release before receiving again")),
            Some(h) => {
                let (len, kind) = (h.frame.len(), h.frame.kind());
                let capacity = buf.len();
                let copied = buf.get_mut(..len).map(|dst| dst.copy_from_slice(&h.frame));
                // Received, or dropped as too large, as any frame would be.
                self.held = None;
                copied.ok_or(leap_rs::TransportError::FrameTooLarge { len, capacity })?;
                self.copied += len as u64;
                Ok((len, kind))
            }
            None => {
                let got = self.rx.recv(buf)?;
                Ok((got.len, got.kind))
            }
        }
    }

    /// Receives a frame and lends it (a frame held after a peek is lent).
    pub fn recv_lent(&mut self) -> Result<FrameView> {
        match &mut self.held {
            Some(h) if h.lent => Err(state(c"a lent frame is not released: call leap_release before receiving again")),
            Some(h) => {
                h.lent = true;
                Ok(h.view())
            }
            None => {
                let frame = self.rx.recv_lent()?;
                // SAFETY: held until released, see `RecvSide`.
                let frame = unsafe { erase(frame) };
                Ok(self.held.insert(Held { frame, lent: true }).view())
            }
        }
    }

    /// Takes a frame if one is complete, without waiting, and holds it for
    /// the next receive (the same frame again until then).
    pub fn peek(&mut self) -> Result<FrameView> {
        match &self.held {
            Some(h) if h.lent => Err(state(c"a lent frame is not released: call leap_release before peeking")),
            Some(h) => Ok(h.view()),
            None => {
                let polls = self.timeout.is_some_and(|t| t.is_zero());
                if !polls {
                    self.rx.set_timeout(Some(Duration::ZERO));
                }
                // SAFETY: held until received or released, see `RecvSide`.
                let res = self.rx.recv_lent().map(|f| unsafe { erase(f) });
                if !polls {
                    self.rx.set_timeout(self.timeout);
                }
                Ok(self.held.insert(Held { frame: res?, lent: false }).view())
            }
        }
    }

    /// Gives the frame held back (lent or peeked: it is consumed).
    pub fn release(&mut self) -> Result<()> {
        match self.held.take() {
            Some(_) => Ok(()),
            None => Err(state(
                c"no frame is lent or peeked: leap_release follows leap_recv_prev_lent or leap_peek_prev, once",
            )),
        }
    }

    pub fn set_timeout(&mut self, t: Option<Duration>) {
        self.timeout = t;
        self.rx.set_timeout(t);
    }

    pub fn ready_fd(&self) -> Result<i32> {
        Ok(self.rx.ready()?.as_raw_fd())
    }

    pub fn stats(&self) -> (Stats, u64) {
        (self.rx.counters(), self.copied)
    }
}

/// The sending side's state: whether a frame is begun, and the buffer
/// control frames are padded in.
#[derive(Debug, Default)]
pub struct SendState {
    begun: bool,
    control: Vec<u8>,
}

impl SendState {
    pub fn begun(&self) -> bool {
        self.begun
    }

    pub fn send(&mut self, tx: &mut (impl Sends + ?Sized), head: &[u8], tail: &[u8]) -> Result<()> {
        // The library discards a frame begun and not committed.
        self.begun = false;
        Ok(tx.send_parts(FrameKind::Data, head, tail)?)
    }

    pub fn begin(&mut self, tx: &mut (impl Sends + ?Sized), len: usize) -> Result<*mut u8> {
        self.begun = false;
        let buf = tx.begin(len)?;
        self.begun = true;
        Ok(buf.as_mut_ptr())
    }

    pub fn commit(&mut self, tx: &mut (impl Sends + ?Sized)) -> Result<()> {
        if !std::mem::take(&mut self.begun) {
            return Err(state(
                c"no frame is begun: call leap_send_begin, write the frame, then leap_send_commit (once)",
            ));
        }
        Ok(tx.commit()?)
    }

    /// Sends `msg` as a control frame of `frame_len` bytes: the marker, the
    /// message, zeros (the original's padding).
    pub fn control(&mut self, tx: &mut (impl Sends + ?Sized), msg: &leap_control, frame_len: usize) -> Result<()> {
        let m = msg.to_message()?;
        if frame_len < CONTROL_FRAME_MIN {
            return Err(Error::new(
                leap_status::LEAP_ERR_CONTROL,
                format_args!(
                    "a control frame of {frame_len} bytes: it takes at least LEAP_CONTROL_FRAME_MIN ({CONTROL_FRAME_MIN}); pass the frame length"
                ),
            ));
        }
        if self.control.len() < frame_len {
            self.control.resize(frame_len, 0);
        }
        let frame = &mut self.control[..frame_len];
        m.encode(frame).map_err(leap_rs::TransportError::Control)?;
        frame[CONTROL_FRAME_MIN..].fill(0);
        self.begun = false;
        Ok(tx.send_parts(FrameKind::Control, frame, &[])?)
    }
}
