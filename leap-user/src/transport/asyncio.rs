//! Async send and receive on tokio (feature `tokio`) for the datagram
//! transports (UDP, XDP).
//!
//! A receive awaits the transport's file descriptor through [`AsyncFd`] (for
//! XDP an epoll set of its AF_XDP sockets or ring buffer and its UDP
//! socket) and the loss-recovery timers through `tokio::time`: no thread
//! blocks and nothing spins: `spin` and the spinning part of `busy_poll`
//! are ignored here (the sockets still carry `SO_BUSY_POLL`, which a
//! blocking read would use). Between receives the transport's driver thread
//! answers NACKs, as with the blocking API. Sends do not wait: a frame goes
//! to the kernel in one `sendmmsg`.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use leap::transport::{FrameKind, udp::{UdpConfig, UdpTransport}};
//!
//! let cfg = UdpConfig::new("127.0.0.1:9999".parse()?, "127.0.0.1:10000".parse()?);
//! let mut t = UdpTransport::bind(cfg)?.into_async()?;
//! t.send_next_with(FrameKind::Data, 16392, |buf| buf.fill(1)).await?;
//! let frame = t.recv_prev_lent().await?;
//! assert_eq!(frame.len(), 16392);
//! # Ok(()) }
//! ```

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::datagram::{RxPath, Shared, TryRecv};
use super::halves::{DatagramCore, DatagramReceiver, DatagramSender};
use super::{FrameKind, FrameReceiver, FrameSender, Lent, Received, Result, Stats, TransportError};

/// Steps that took datagrams in a row before the task yields to others.
const STEPS_BEFORE_YIELD: u32 = 64;

/// A datagram transport driven by tokio: an [`AsyncSender`] and an
/// [`AsyncReceiver`] together.
#[derive(Debug)]
pub struct AsyncDatagram<R: RxPath + 'static> {
    tx: AsyncSender<R>,
    rx: AsyncReceiver<R>,
}

/// Ends an async receive call however it ends (also when its future is
/// dropped half-way).
struct EndCall<'a, R: RxPath>(&'a Shared<R>);

impl<R: RxPath> Drop for EndCall<'_, R> {
    fn drop(&mut self) {
        self.0.end_call();
    }
}

impl<R: RxPath + 'static> AsyncDatagram<R> {
    /// Registers the transport's descriptor with the current tokio runtime.
    ///
    /// # Errors
    ///
    /// No runtime, or registering failed.
    pub fn new(core: DatagramCore<R>) -> io::Result<Self> {
        Self::keeping(core, None)
    }

    /// As [`Self::new`], keeping `keep` alive as long as the receiver.
    pub(crate) fn keeping(core: DatagramCore<R>, keep: Option<Box<dyn std::any::Any + Send>>) -> io::Result<Self> {
        let fd = core.shared().rx_fd()?;
        // SAFETY: the AsyncFd owns `fd`: it stays open, and is the same
        // descriptor, until the AsyncFd is dropped.
        let ready = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        let (tx, rx) = core.split();
        Ok(Self { tx: AsyncSender { tx }, rx: AsyncReceiver { ready, rx, _keep: keep } })
    }

    /// Receives the next frame into `out`.
    ///
    /// # Errors
    ///
    /// As [`super::Transport::recv_prev`].
    pub async fn recv_prev(&mut self, out: &mut [u8]) -> Result<Received> {
        self.rx.recv_prev(out).await
    }

    /// Receives the next frame into the transport's buffer and lends it.
    ///
    /// # Errors
    ///
    /// As [`super::Transport::recv_prev`].
    pub async fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        self.rx.recv_prev_lent().await
    }

    /// Sends a frame that `fill` writes in place (see
    /// [`super::Transport::send_next_with`]).
    ///
    /// # Errors
    ///
    /// As [`super::Transport::send_next_with`].
    pub async fn send_next_with<F: FnMut(&mut [u8]) + Send>(
        &mut self,
        kind: FrameKind,
        len: usize,
        fill: F,
    ) -> Result<()> {
        self.tx.send_next_with(kind, len, fill).await
    }

    /// Sends one frame.
    ///
    /// # Errors
    ///
    /// As [`super::Transport::send_next_parts`].
    pub async fn send_next(&mut self, frame: &[u8]) -> Result<()> {
        self.tx.send_next(frame).await
    }

    /// Sets the receive deadline.
    pub fn set_recv_timeout(&mut self, t: Option<Duration>) {
        self.rx.set_recv_timeout(t);
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.rx.stats()
    }

    /// Splits into a sender and a receiver for two tasks (or threads): a
    /// stage receives frame N+1 while it computes N and sends N-1, and
    /// reads a lent frame while it writes its output in place.
    pub fn split(self) -> (AsyncSender<R>, AsyncReceiver<R>) {
        (self.tx, self.rx)
    }
}

/// Before the first frame: gives the next node time to prove that it is a
/// leap node (the driver exchanges the hellos), without blocking the
/// runtime.
async fn await_proof<R: RxPath>(shared: &Shared<R>) {
    {
        let mut link = shared.link();
        if !link.awaits_proof() {
            return;
        }
        link.proof_wait_begins();
    }
    let until = Instant::now() + super::datagram::DatagramLink::FIRST_PROOF_WAIT;
    while shared.link().awaits_proof() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    shared.link().proof_wait_done();
}

/// The sending half of a split [`AsyncDatagram`].
#[derive(Debug)]
pub struct AsyncSender<R: RxPath + 'static> {
    tx: DatagramSender<R>,
}

impl<R: RxPath + 'static> AsyncSender<R> {
    /// As [`AsyncDatagram::send_next_with`].
    ///
    /// # Errors
    ///
    /// As [`super::Transport::send_next_with`].
    pub async fn send_next_with<F: FnMut(&mut [u8]) + Send>(
        &mut self,
        kind: FrameKind,
        len: usize,
        mut fill: F,
    ) -> Result<()> {
        await_proof(self.tx.shared()).await;
        self.tx.send_next_with(kind, len, &mut fill)
    }

    /// As [`AsyncDatagram::send_next`].
    ///
    /// # Errors
    ///
    /// As [`super::Transport::send_next_parts`].
    pub async fn send_next(&mut self, frame: &[u8]) -> Result<()> {
        await_proof(self.tx.shared()).await;
        self.tx.send_next_parts(FrameKind::Data, frame, &[])
    }

    /// The transport's counters (both halves).
    pub fn stats(&self) -> Stats {
        FrameSender::stats(&self.tx)
    }
}

/// The receiving half of a split [`AsyncDatagram`].
pub struct AsyncReceiver<R: RxPath + 'static> {
    ready: AsyncFd<OwnedFd>,
    rx: DatagramReceiver<R>,
    _keep: Option<Box<dyn std::any::Any + Send>>,
}

impl<R: RxPath + 'static> std::fmt::Debug for AsyncReceiver<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncReceiver").field("ready", &self.ready).finish_non_exhaustive()
    }
}

impl<R: RxPath + 'static> AsyncReceiver<R> {
    /// As [`AsyncDatagram::recv_prev`].
    ///
    /// # Errors
    ///
    /// As [`super::Transport::recv_prev`].
    pub async fn recv_prev(&mut self, out: &mut [u8]) -> Result<Received> {
        let (shared, _, _, call) = self.rx.parts();
        recv(shared, &self.ready, out, call).await
    }

    /// As [`AsyncDatagram::recv_prev_lent`].
    ///
    /// # Errors
    ///
    /// As [`super::Transport::recv_prev`].
    pub async fn recv_prev_lent(&mut self) -> Result<Lent<'_>> {
        let (shared, buf, max, call) = self.rx.parts();
        let got = recv(shared, &self.ready, buf.get(max), call).await?;
        Ok(Lent::new(&buf.all()[..got.len], got.kind))
    }

    /// Sets the receive deadline.
    pub fn set_recv_timeout(&mut self, t: Option<Duration>) {
        self.rx.set_recv_timeout(t);
    }

    /// The transport's counters (both halves).
    pub fn stats(&self) -> Stats {
        FrameReceiver::stats(&self.rx)
    }
}

async fn recv<R: RxPath>(
    shared: &Shared<R>,
    ready: &AsyncFd<OwnedFd>,
    out: &mut [u8],
    call: &'static str,
) -> Result<Received> {
    let rc = match shared.begin_call(out) {
        Ok(got) => return got,
        Err(rc) => rc,
    };
    let _end = EndCall(shared);
    let mut busy = 0u32;
    loop {
        match shared.try_recv(&rc, out, call)? {
            TryRecv::Frame(got) => return Ok(got),
            TryRecv::More => {
                busy += 1;
                if busy.is_multiple_of(STEPS_BEFORE_YIELD) {
                    tokio::task::yield_now().await;
                }
            }
            TryRecv::Empty(wait) => {
                busy = 0;
                shared.prepare_wait();
                match tokio::time::timeout(wait.unwrap_or(Duration::ZERO), ready.readable()).await {
                    // The next step reads what made it readable; readiness
                    // newer than this guard is kept by tokio.
                    Ok(Ok(mut guard)) => guard.clear_ready(),
                    Ok(Err(e)) => return Err(TransportError::io("epoll_wait", e)),
                    Err(_) => {}
                }
            }
        }
    }
}
