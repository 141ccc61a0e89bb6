//! A datagram transport as the caller holds it: the [`Shared`] link and
//! receive path, a [`Driver`] thread that runs loss recovery while the
//! caller computes, and the buffer received frames are lent from. It splits
//! into a sending and a receiving half for two threads.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use super::datagram::{DatagramLink, Driver, RxPath, SendSlot, Shared};
use super::lend::OwnedBuf;
use super::{FrameKind, FrameReceiver, FrameSender, Lent, Received, Result, Stats, TransportError};

/// A datagram transport's state as its owner (or its two halves) use it.
#[derive(Debug)]
pub struct DatagramCore<R: RxPath + 'static> {
    shared: Arc<Shared<R>>,
    driver: Arc<Driver>,
    lend: OwnedBuf,
    name: &'static str,
    call: &'static str,
    max_frame_len: usize,
    /// A frame begun by [`Self::send_begin`].
    pending: Option<SendSlot>,
}

impl<R: RxPath + 'static> DatagramCore<R> {
    /// Shares `link` and `rx` and starts their driver. `name` names the
    /// transport, `call` the receive path's system call in errors.
    ///
    /// # Errors
    ///
    /// The driver thread could not be started.
    pub fn new(link: DatagramLink, rx: R, name: &'static str, call: &'static str) -> io::Result<Self> {
        let max_frame_len = link.config().max_frame_len;
        let shared = Shared::new(link, rx);
        let driver = Arc::new(Driver::spawn(&shared, name)?);
        Ok(Self { shared, driver, lend: OwnedBuf::default(), name, call, max_frame_len, pending: None })
    }

    /// The shared state (the link and the receive path, each locked on use).
    pub fn shared(&self) -> &Shared<R> {
        &self.shared
    }

    /// See [`crate::Transport::source_control`].
    pub fn source_control(&self) -> super::SourceControl
    where
        R: Send,
    {
        let shared = Arc::clone(&self.shared);
        super::SourceControl::new(move || shared.link().release_source())
    }

    /// See [`crate::Transport::key_control`].
    pub fn key_control(&self) -> super::KeyControl
    where
        R: Send,
    {
        let shared = Arc::clone(&self.shared);
        super::KeyControl::new(move |keys| shared.link().set_keys(keys))
    }

    /// See [`super::Transport::send_next_parts`].
    ///
    /// # Errors
    ///
    /// As [`DatagramLink::send`].
    pub fn send_parts(&mut self, kind: FrameKind, head: &[u8], tail: &[u8]) -> Result<()> {
        discard(&self.shared, &mut self.pending);
        self.shared.link().send(kind, head, tail)
    }

    /// See [`super::Transport::send_next_with`].
    ///
    /// # Errors
    ///
    /// As [`DatagramLink::send_with`].
    pub fn send_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        discard(&self.shared, &mut self.pending);
        send_unlocked(&self.shared, kind, len, fill)
    }

    /// See [`super::Transport::send_next_begin`].
    ///
    /// # Errors
    ///
    /// As [`DatagramLink::begin_send`].
    pub fn send_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        send_begin(&self.shared, &mut self.pending, kind, len)
    }

    /// See [`super::Transport::send_next_commit`].
    ///
    /// # Errors
    ///
    /// [`TransportError::NotBegun`], else as [`DatagramLink::finish_send`].
    pub fn send_commit(&mut self) -> Result<()> {
        send_commit(&self.shared, &mut self.pending)
    }

    /// See [`super::Transport::ready_fd`].
    ///
    /// # Errors
    ///
    /// As [`Shared::ready_fd`].
    pub fn ready_fd(&self) -> Result<BorrowedFd<'_>> {
        self.shared.ready_fd().map_err(|e| TransportError::io("epoll_create1", e))
    }

    /// Receives into the caller's buffer.
    ///
    /// # Errors
    ///
    /// As [`Shared::recv`].
    pub fn recv(&self, out: &mut [u8]) -> Result<Received> {
        self.shared.recv(out, self.call)
    }

    /// Receives into the transport's buffer and lends the frame.
    ///
    /// # Errors
    ///
    /// As [`Shared::recv`].
    pub fn recv_lent(&mut self) -> Result<Lent<'_>> {
        lend(&self.shared, &mut self.lend, self.max_frame_len, self.call)
    }

    /// See [`super::Transport::relay`].
    ///
    /// # Errors
    ///
    /// As [`Shared::recv`], then as [`DatagramLink::send_with`].
    pub fn relay(&mut self, control: &mut [u8], compute: &mut dyn FnMut(&[u8], &mut [u8])) -> Result<Received> {
        let got = self.shared.recv(self.lend.get(self.max_frame_len), self.call)?;
        let input = &self.lend.all()[..got.len];
        if got.kind == FrameKind::Control {
            super::keep_control(input, control)?;
        } else {
            discard(&self.shared, &mut self.pending);
            send_unlocked(&self.shared, FrameKind::Data, got.len, &mut |out| compute(input, out))?;
        }
        Ok(got)
    }

    /// Sets the receive deadline.
    pub fn set_recv_timeout(&self, t: Option<Duration>) {
        self.shared.link().set_recv_timeout(t);
    }

    /// See [`super::Transport::set_frame_len`]: frames up to the largest
    /// the link was opened for are taken anyway (reassembly slots and the
    /// lending buffer grow to the frames they hold), so this only checks.
    ///
    /// # Errors
    ///
    /// 0, or a length beyond the link's largest frame.
    pub fn set_frame_len(&self, len: usize) -> Result<()> {
        if len == 0 || len > self.max_frame_len {
            return Err(super::frame_len_refused(self.name, len, self.max_frame_len));
        }
        Ok(())
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.shared.link().stats()
    }

    /// Splits into a sender and a receiver for two threads; the driver runs
    /// until both are dropped.
    pub fn split(self) -> (DatagramSender<R>, DatagramReceiver<R>) {
        let sender = DatagramSender {
            shared: Arc::clone(&self.shared),
            _driver: Arc::clone(&self.driver),
            name: self.name,
            pending: self.pending,
        };
        let receiver = DatagramReceiver {
            shared: self.shared,
            _driver: self.driver,
            lend: self.lend,
            name: self.name,
            call: self.call,
            max_frame_len: self.max_frame_len,
            keep: None,
        };
        (sender, receiver)
    }
}

/// Gives back the memory of a frame begun and not committed.
fn discard<R: RxPath>(shared: &Shared<R>, pending: &mut Option<SendSlot>) {
    if let Some(slot) = pending.take() {
        shared.link().discard_send(slot);
    }
}

/// Begins a frame written in place without holding the link (see
/// [`super::Transport::send_next_begin`]).
fn send_begin<'a, R: RxPath>(
    shared: &Shared<R>,
    pending: &'a mut Option<SendSlot>,
    kind: FrameKind,
    len: usize,
) -> Result<&'a mut [u8]> {
    discard(shared, pending);
    let slot = shared.link().begin_send(kind, len)?;
    Ok(pending.insert(slot).buf())
}

/// Sends the frame begun.
fn send_commit<R: RxPath>(shared: &Shared<R>, pending: &mut Option<SendSlot>) -> Result<()> {
    let slot = pending.take().ok_or(TransportError::NotBegun)?;
    shared.link().finish_send(slot)
}

/// Sends a frame that `fill` writes in place without holding the link: the
/// driver answers NACKs while the caller computes its output.
fn send_unlocked<R: RxPath>(
    shared: &Shared<R>,
    kind: FrameKind,
    len: usize,
    fill: &mut dyn FnMut(&mut [u8]),
) -> Result<()> {
    let mut slot = shared.link().begin_send(kind, len)?;
    fill(slot.buf());
    shared.link().finish_send(slot)
}

fn lend<'a, R: RxPath>(
    shared: &Shared<R>,
    buf: &'a mut OwnedBuf,
    max_frame_len: usize,
    call: &'static str,
) -> Result<Lent<'a>> {
    let got = shared.recv(buf.get(max_frame_len), call)?;
    Ok(Lent::new(&buf.all()[..got.len], got.kind))
}

/// The sending half of a datagram transport.
#[derive(Debug)]
pub struct DatagramSender<R: RxPath + 'static> {
    shared: Arc<Shared<R>>,
    _driver: Arc<Driver>,
    name: &'static str,
    pending: Option<SendSlot>,
}

/// The receiving half of a datagram transport.
pub struct DatagramReceiver<R: RxPath + 'static> {
    shared: Arc<Shared<R>>,
    _driver: Arc<Driver>,
    lend: OwnedBuf,
    name: &'static str,
    call: &'static str,
    max_frame_len: usize,
    /// What must live as long as the receive path (the XDP program).
    keep: Option<Box<dyn std::any::Any + Send>>,
}

impl<R: RxPath + 'static> std::fmt::Debug for DatagramReceiver<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatagramReceiver").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<R: RxPath + 'static> DatagramSender<R> {
    /// The shared state.
    #[cfg(feature = "tokio")]
    pub(crate) fn shared(&self) -> &Shared<R> {
        &self.shared
    }
}

impl<R: RxPath + 'static> DatagramReceiver<R> {
    /// The shared state, the buffer frames are lent from, the largest frame
    /// and the receive path's call name.
    #[cfg(feature = "tokio")]
    pub(crate) fn parts(&mut self) -> (&Shared<R>, &mut OwnedBuf, usize, &'static str) {
        (&self.shared, &mut self.lend, self.max_frame_len, self.call)
    }

    /// Keeps `what` alive until this half is dropped (after the shared
    /// state's reference).
    pub fn keep_alive(&mut self, what: Box<dyn std::any::Any + Send>) {
        self.keep = Some(what);
    }
}

impl<R: RxPath + 'static> FrameSender for DatagramSender<R> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn send_next_parts(&mut self, kind: FrameKind, header: &[u8], payload: &[u8]) -> Result<()> {
        discard(&self.shared, &mut self.pending);
        self.shared.link().send(kind, header, payload)
    }

    fn send_next_with(&mut self, kind: FrameKind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        discard(&self.shared, &mut self.pending);
        send_unlocked(&self.shared, kind, len, fill)
    }

    fn send_next_begin(&mut self, kind: FrameKind, len: usize) -> Result<&mut [u8]> {
        send_begin(&self.shared, &mut self.pending, kind, len)
    }

    fn send_next_commit(&mut self) -> Result<()> {
        send_commit(&self.shared, &mut self.pending)
    }

    fn stats(&self) -> Stats {
        self.shared.link().stats()
    }
}

impl<R: RxPath + 'static> FrameReceiver for DatagramReceiver<R> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn recv_prev(&mut self, buf: &mut [u8]) -> Result<Received> {
        self.shared.recv(buf, self.call)
    }

    fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        lend(&self.shared, &mut self.lend, self.max_frame_len, self.call)
    }

    fn set_recv_timeout(&mut self, timeout: Option<Duration>) {
        self.shared.link().set_recv_timeout(timeout);
    }

    fn ready_fd(&self) -> Result<BorrowedFd<'_>> {
        self.shared.ready_fd().map_err(|e| TransportError::io("epoll_create1", e))
    }

    fn stats(&self) -> Stats {
        self.shared.link().stats()
    }
}
