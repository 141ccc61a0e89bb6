//! `leap.Transport` and its halves `leap.Sender` and `leap.Receiver`: the
//! library's `Transport`, `FrameSender` and `FrameReceiver` behind a lock,
//! each call made with the GIL released.

use std::cell::Cell;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leap::transport::{FrameKind as Kind, FrameReceiver, FrameSender, Lent, Received, Stats, Transport as Rust};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::buffer::Held;
use crate::control::Control;
use crate::errors;
use crate::frame::{Finish, Frame, FrameKind, Owner, SendBuffer, lock};
use crate::keys::KeyControl;
use crate::lending::{Busy, Lender};

thread_local! {
    /// This thread runs a `send_next_with` fill (with its transport locked).
    static IN_FILL: Cell<bool> = const { Cell::new(false) };
}

/// Refuses transport calls from inside a fill: its transport is locked
/// (and waiting on another one could deadlock).
fn not_in_fill(what: &str) -> PyResult<()> {
    if IN_FILL.get() {
        return Err(errors::Error::new_err(format!(
            "{what} inside send_next_with's fill: fill only writes the frame; call the transport after it returns"
        )));
    }
    Ok(())
}

/// What sends: a whole transport or its sending half.
pub trait Sends: Send {
    fn send_parts(&mut self, kind: Kind, head: &[u8], tail: &[u8]) -> leap::transport::Result<()>;
    fn send_with(&mut self, kind: Kind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> leap::transport::Result<()>;
    fn begin(&mut self, kind: Kind, len: usize) -> leap::transport::Result<&mut [u8]>;
    fn commit(&mut self) -> leap::transport::Result<()>;
    fn counters(&self) -> Stats;
}

/// What receives: a whole transport or its receiving half.
pub trait Receives: Send {
    fn recv_into(&mut self, buf: &mut [u8]) -> leap::transport::Result<Received>;
    fn recv_lent(&mut self) -> leap::transport::Result<Lent<'_>>;
    fn set_timeout(&mut self, t: Option<Duration>);
    fn ready(&self) -> leap::transport::Result<RawFd>;
}

impl Sends for dyn Rust {
    fn send_parts(&mut self, kind: Kind, head: &[u8], tail: &[u8]) -> leap::transport::Result<()> {
        self.send_next_parts(kind, head, tail)
    }
    fn send_with(&mut self, kind: Kind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> leap::transport::Result<()> {
        self.send_next_with(kind, len, fill)
    }
    fn begin(&mut self, kind: Kind, len: usize) -> leap::transport::Result<&mut [u8]> {
        self.send_next_begin(kind, len)
    }
    fn commit(&mut self) -> leap::transport::Result<()> {
        self.send_next_commit()
    }
    fn counters(&self) -> Stats {
        self.stats()
    }
}

impl Sends for dyn FrameSender {
    fn send_parts(&mut self, kind: Kind, head: &[u8], tail: &[u8]) -> leap::transport::Result<()> {
        self.send_next_parts(kind, head, tail)
    }
    fn send_with(&mut self, kind: Kind, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> leap::transport::Result<()> {
        self.send_next_with(kind, len, fill)
    }
    fn begin(&mut self, kind: Kind, len: usize) -> leap::transport::Result<&mut [u8]> {
        self.send_next_begin(kind, len)
    }
    fn commit(&mut self) -> leap::transport::Result<()> {
        self.send_next_commit()
    }
    fn counters(&self) -> Stats {
        self.stats()
    }
}

impl Receives for dyn Rust {
    fn recv_into(&mut self, buf: &mut [u8]) -> leap::transport::Result<Received> {
        self.recv_prev(buf)
    }
    fn recv_lent(&mut self) -> leap::transport::Result<Lent<'_>> {
        self.recv_prev_lent()
    }
    fn set_timeout(&mut self, t: Option<Duration>) {
        self.set_recv_timeout(t);
    }
    fn ready(&self) -> leap::transport::Result<RawFd> {
        self.ready_fd().map(|fd| fd.as_raw_fd())
    }
}

impl Receives for dyn FrameReceiver {
    fn recv_into(&mut self, buf: &mut [u8]) -> leap::transport::Result<Received> {
        self.recv_prev(buf)
    }
    fn recv_lent(&mut self) -> leap::transport::Result<Lent<'_>> {
        self.recv_prev_lent()
    }
    fn set_timeout(&mut self, t: Option<Duration>) {
        self.set_recv_timeout(t);
    }
    fn ready(&self) -> leap::transport::Result<RawFd> {
        self.ready_fd().map(|fd| fd.as_raw_fd())
    }
}

/// The receive deadline as the caller set it, and whether the transport is
/// set to poll once instead (for the non-blocking receives): switched only
/// when the kind of receive changes. Used under the transport's lock.
#[derive(Debug)]
pub struct Deadline {
    user: Option<Duration>,
    polling: bool,
}

impl Deadline {
    fn new(user: Option<Duration>) -> Mutex<Self> {
        Mutex::new(Self { user, polling: false })
    }

    /// Sets `r` up for a blocking receive (`poll` false) or one that polls
    /// once (`poll` true).
    fn prepare<T: ?Sized + Receives>(&mut self, r: &mut T, poll: bool) {
        if self.polling != poll {
            r.set_timeout(if poll { Some(Duration::ZERO) } else { self.user });
            self.polling = poll;
        }
    }
}

/// A transport (or half) as the Python objects share it: a frame it lends
/// keeps it alive.
pub type Core<T> = Arc<Mutex<Lender<T>>>;

/// Runs `f` on the transport with the GIL released (the lock is taken
/// without the GIL too: another thread may hold it in a blocking call).
fn call<T, R, F>(py: Python<'_>, core: &Core<T>, what: &str, f: F) -> PyResult<R>
where
    T: ?Sized + Send + 'static,
    R: Send,
    F: FnOnce(&mut T) -> leap::transport::Result<R> + Send,
{
    not_in_fill(what)?;
    let r = py.detach(|| lock(core).get().map(f));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(errors::transport(e)),
        Err(b) => Err(errors::busy(b, what)),
    }
}

fn send_next<T: ?Sized + Sends + 'static>(py: Python<'_>, core: &Core<T>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
    let held = Held::new(buf, false, "send_next")?;
    let bytes = held.bytes();
    call(py, core, "send_next", |t| t.send_parts(Kind::Data, bytes, &[]))
}

fn send_multipart<T: ?Sized + Sends + 'static>(
    py: Python<'_>,
    core: &Core<T>,
    header: &Bound<'_, PyAny>,
    payload: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (h, p) = (Held::new(header, false, "the header")?, Held::new(payload, false, "the payload")?);
    let (h, p) = (h.bytes(), p.bytes());
    call(py, core, "send_multipart_next", |t| t.send_parts(Kind::Data, h, p))
}

impl<T: ?Sized + Sends + 'static> Finish for Mutex<Lender<T>> {
    fn finish(&self, py: Python<'_>, commit: bool) -> PyResult<()> {
        let r = py.detach(|| lock(self).finish(|t| if commit { t.commit() } else { Ok(()) }));
        match r {
            Ok(()) => Ok(()),
            Err(Ok(b)) => Err(errors::busy(b, "commit")),
            Err(Err(e)) => Err(errors::transport(e)),
        }
    }
}

/// The `with` form of `send_next_with`: begins the frame in the
/// transport's memory and returns it for the block to write.
fn begin<T: ?Sized + Sends + 'static>(
    py: Python<'_>,
    core: &Core<T>,
    length: usize,
    kind: FrameKind,
) -> PyResult<SendBuffer> {
    not_in_fill("send_next_with")?;
    let r = py.detach(|| lock(core).begin(|t| t.begin(kind.into(), length)));
    match r {
        // SAFETY: the memory stays the transport's and untouched by Rust
        // until `finish` (`Lender::begin`), which the buffer calls only
        // with no view alive.
        Ok(mem) => Ok(unsafe { SendBuffer::begun(mem.ptr(), mem.len(), Arc::clone(core) as Arc<dyn Finish>) }),
        Err(Ok(b)) => Err(errors::busy(b, "send_next_with")),
        Err(Err(e)) => Err(errors::transport(e)),
    }
}

fn send_with<T: ?Sized + Sends + 'static>(
    py: Python<'_>,
    core: &Core<T>,
    length: usize,
    fill: &Py<PyAny>,
    kind: FrameKind,
) -> PyResult<()> {
    not_in_fill("send_next_with")?;
    let mut raised: Option<PyErr> = None;
    let mut leaked = 0;
    let r = py.detach(|| {
        let mut guard = lock(core);
        let t = guard.get()?;
        let sent = t.send_with(kind.into(), length, &mut |buf| {
            Python::attach(|py| {
                // SAFETY: `buf` is valid until this closure returns; views
                // of it that outlive the closure are counted by `close`
                // below, and then the transport that owns `buf` is pinned
                // (never freed).
                let out = match Bound::new(py, unsafe { SendBuffer::new(buf) }) {
                    Ok(o) => o,
                    Err(e) => return raised = Some(e),
                };
                IN_FILL.set(true);
                let r = fill.call1(py, (&out,));
                IN_FILL.set(false);
                leaked = out.get().close();
                if let Err(e) = r {
                    raised = Some(e);
                }
            });
        });
        if leaked > 0 {
            guard.pin();
        }
        Ok::<_, Busy>(sent)
    });
    let sent = r.map_err(|b| errors::busy(b, "send_next_with"))?;
    if leaked > 0 {
        return Err(PyBufferError::new_err(format!(
            "{leaked} view(s) of the send buffer outlived fill: the frame was sent, but writing through them \
             would change the transport's memory (kept until exit so that they stay valid); \
             do not keep views of `out` past fill"
        )));
    }
    if let Some(e) = raised {
        return Err(e);
    }
    sent.map_err(errors::transport)
}

fn send_control<T: ?Sized + Sends + 'static>(
    py: Python<'_>,
    core: &Core<T>,
    msg: &Bound<'_, PyAny>,
    frame_len: usize,
) -> PyResult<()> {
    let m = Control::from_object(msg)?;
    let mut head = [0u8; leap_common::control::CONTROL_FRAME_MIN];
    if frame_len < head.len() {
        return Err(errors::control(format!("a control frame needs {} bytes, not {frame_len}", head.len())));
    }
    m.encode(&mut head).map_err(|e| errors::control(format!("{e:?}")))?;
    // Control frames are rare: the zeros are made per message (as the
    // library's `send_control` does).
    let padding = vec![0u8; frame_len - head.len()];
    call(py, core, "send_control", |t| t.send_parts(Kind::Control, &head, &padding))
}

fn recv_prev<T: ?Sized + Receives + 'static>(
    py: Python<'_>,
    core: &Core<T>,
    deadline: &Mutex<Deadline>,
    poll: bool,
) -> PyResult<Option<Frame>>
where
    Mutex<Lender<T>>: Owner,
{
    not_in_fill("recv_prev")?;
    let r = py.detach(|| {
        lock(core).lend(|t| {
            lock(deadline).prepare(t, poll);
            match t.recv_lent() {
                Ok(f) => Ok(Some(f)),
                Err(e) if poll && e.is_would_block() => Ok(None),
                Err(e) => Err(e),
            }
        })
    });
    match r {
        Ok(Some(bytes)) => Ok(Some(Frame::new(Arc::clone(core) as Arc<dyn Owner>, bytes))),
        Ok(None) => Ok(None),
        Err(Ok(b)) => Err(errors::busy(b, "recv_prev")),
        Err(Err(e)) => Err(errors::transport(e)),
    }
}

fn recv_into<'py, T: ?Sized + Receives + 'static>(
    py: Python<'py>,
    core: &Core<T>,
    deadline: &Mutex<Deadline>,
    buf: &Bound<'py, PyAny>,
    poll: bool,
) -> PyResult<Option<(usize, FrameKind)>> {
    let mut held = Held::new(buf, true, "recv_prev_into")?;
    let out = held.bytes_mut();
    let got = call(py, core, "recv_prev_into", |t| {
        lock(deadline).prepare(t, poll);
        match t.recv_into(out) {
            Ok(got) => Ok(Some((got.len, got.kind.into()))),
            Err(e) if poll && e.is_would_block() => Ok(None),
            Err(e) => Err(e),
        }
    })?;
    Ok(got)
}

/// `Transport.relay`: the library's worker step, the frame passed on
/// unchanged (copied once, from where it arrived into where it leaves). A
/// control frame lands in `control` (the transport's largest frame, made
/// once) and comes back decoded.
fn relay(
    py: Python<'_>,
    core: &Core<dyn Rust>,
    deadline: &Mutex<Deadline>,
    control: &Mutex<Vec<u8>>,
    frame_size: usize,
) -> PyResult<Option<Control>> {
    not_in_fill("relay")?;
    let r = py.detach(|| {
        let mut guard = lock(core);
        let t = guard.get()?;
        lock(deadline).prepare(t, false);
        let mut kept = lock(control);
        if kept.len() < frame_size {
            kept.resize(frame_size, 0);
        }
        let got = t.relay(&mut kept, &mut |input, out| out.copy_from_slice(input));
        Ok::<_, Busy>(got.map(|got| (got.kind == Kind::Control).then(|| Control::decode_bytes(&kept[..got.len]))))
    });
    match r {
        Ok(Ok(None)) => Ok(None),
        Ok(Ok(Some(msg))) => msg.map(Some),
        Ok(Err(e)) => Err(errors::transport(e)),
        Err(b) => Err(errors::busy(b, "relay")),
    }
}

fn set_timeout<T: ?Sized + Receives + 'static>(
    py: Python<'_>,
    core: &Core<T>,
    deadline: &Mutex<Deadline>,
    seconds: Option<f64>,
) -> PyResult<()> {
    let t = timeout(seconds)?;
    call(py, core, "set_recv_timeout", |r| {
        let mut d = lock(deadline);
        d.user = t;
        if !d.polling {
            r.set_timeout(t);
        }
        Ok(())
    })
}

fn fileno<T: ?Sized + Receives + 'static>(py: Python<'_>, core: &Core<T>) -> PyResult<RawFd> {
    call(py, core, "fileno", |t| t.ready())
}

fn timeout(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "a receive timeout is a number of seconds above 0 (None: wait for ever), not {s}"
        ))),
    }
}

fn close<T: ?Sized + Send + 'static>(py: Python<'_>, core: &Core<T>) -> PyResult<()> {
    not_in_fill("close")?;
    py.detach(|| lock(core).close());
    Ok(())
}

fn closed<T: ?Sized + Send + 'static>(py: Python<'_>, core: &Core<T>) -> bool {
    py.detach(|| lock(core).is_closed())
}

/// The counters as a dict (`drops` a dict of its own, `backend` the XDP
/// program's or the kernel module's counters where there are any).
fn stats_dict<'py>(py: Python<'py>, s: &Stats, backend: Option<Vec<(&str, u64)>>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let serde_json::Value::Object(map) = serde_json::to_value(s).map_err(|e| errors::Error::new_err(e.to_string()))?
    else {
        return Ok(d);
    };
    for (k, v) in map {
        match v {
            serde_json::Value::Object(inner) => {
                let sub = PyDict::new(py);
                for (k2, v2) in inner {
                    sub.set_item(k2, v2.as_u64())?;
                }
                d.set_item(k, sub)?;
            }
            v => d.set_item(k, v.as_u64())?,
        }
    }
    if let Some(b) = backend {
        let sub = PyDict::new(py);
        for (k, v) in b {
            sub.set_item(k, v)?;
        }
        d.set_item("backend", sub)?;
    }
    Ok(d)
}

/// A transport to the next node and from the previous one (made by
/// `leap.open`).
///
/// Every blocking call releases the GIL. One call at a time runs on a
/// transport (others wait for it); `split()` gives a sender and a receiver
/// for two threads. A frame from `recv_prev()` is lent: until it is
/// released, every other call raises `FrameLent`.
#[pyclass(module = "leap", frozen)]
#[derive(Debug)]
pub struct Transport {
    core: Core<dyn Rust>,
    deadline: Arc<Mutex<Deadline>>,
    /// Where `relay` puts a control frame (empty until the first relay).
    control: Mutex<Vec<u8>>,
    name: &'static str,
    frame_size: usize,
    /// The control of its ring keys (a keyed tcp, udp or xdp transport).
    keys: Option<Py<KeyControl>>,
}

impl Transport {
    /// Wraps an open transport whose frames are at most `frame_size`, with
    /// the receive deadline it was opened with and, when keyed, the control
    /// of its keys.
    pub fn new(
        t: Box<dyn Rust>,
        frame_size: usize,
        recv_timeout: Option<Duration>,
        keys: Option<Py<KeyControl>>,
    ) -> Self {
        let name = t.name();
        let deadline = Arc::new(Deadline::new(recv_timeout));
        let core = Arc::new(Mutex::new(Lender::new(t)));
        Self { core, deadline, control: Mutex::new(Vec::new()), name, frame_size, keys }
    }
}

#[pymethods]
impl Transport {
    /// The backend: "tcp", "udp", "xdp", "xdp-ringbuf" or "kmod".
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }

    /// The largest frame (the `frame_size` setting): control frames are
    /// padded to it.
    #[getter]
    fn frame_size(&self) -> usize {
        self.frame_size
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        closed(py, &self.core)
    }

    /// Sends `buf` (any C-contiguous buffer: numpy array, bytes,
    /// bytearray, memoryview), read where it is.
    fn send_next(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        send_next(py, &self.core, buf)
    }

    /// Sends `header` followed by `payload` as one frame, without joining
    /// them first.
    fn send_multipart_next(
        &self,
        py: Python<'_>,
        header: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        send_multipart(py, &self.core, header, payload)
    }

    /// Sends a frame of `length` bytes written in place, into the memory
    /// the transport sends from, a writable buffer of exactly `length`
    /// bytes holding whatever an earlier frame left (write all of it).
    ///
    /// `send_next_with(length, fill)` calls `fill(out)` and sends the frame
    /// when it returns; keep no view of `out` after that. If fill raises,
    /// the frame is sent as fill left it and the exception propagates.
    ///
    /// `with send_next_with(length) as out:` sends the frame at the end of
    /// the block (nothing if it raises); views of `out` must be gone by
    /// then (`BufferError`, see `leap.SendBuffer`).
    #[pyo3(signature = (length, fill = None, kind = FrameKind::Data))]
    fn send_next_with(
        &self,
        py: Python<'_>,
        length: usize,
        fill: Option<Py<PyAny>>,
        kind: FrameKind,
    ) -> PyResult<Option<SendBuffer>> {
        match fill {
            Some(fill) => send_with(py, &self.core, length, &fill, kind).map(|()| None),
            None => begin(py, &self.core, length, kind).map(Some),
        }
    }

    /// Sends a control message (a `leap.Control` or a dict of its fields)
    /// padded with zeros to `frame_len` (default: `frame_size`).
    #[pyo3(signature = (msg, frame_len = None))]
    fn send_control(&self, py: Python<'_>, msg: &Bound<'_, PyAny>, frame_len: Option<usize>) -> PyResult<()> {
        send_control(py, &self.core, msg, frame_len.unwrap_or(self.frame_size))
    }

    /// Receives the next frame and lends it (see `leap.Frame`). Waits at
    /// most the receive deadline (`Timeout`).
    fn recv_prev(&self, py: Python<'_>) -> PyResult<Frame> {
        recv_prev(py, &self.core, &self.deadline, false)?.ok_or_else(|| errors::Error::new_err("no frame lent"))
    }

    /// Receives the next frame into `buf` (a writable buffer); returns its
    /// length and kind.
    fn recv_prev_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<(usize, FrameKind)> {
        recv_into(py, &self.core, &self.deadline, buf, false)?.ok_or_else(|| errors::Error::new_err("no frame"))
    }

    /// As `recv_prev`, but never waits: the frame that has arrived, or
    /// None when none is complete (then wait for `fileno()` to be readable).
    fn try_recv_prev(&self, py: Python<'_>) -> PyResult<Option<Frame>> {
        recv_prev(py, &self.core, &self.deadline, true)
    }

    /// One worker step, as `leap ring`'s workers take it (the library's
    /// `relay`): receives the next frame and sends it on unchanged, read
    /// where the transport received it and copied once into the memory it
    /// is sent from; one call, with the GIL released once, per frame.
    /// Returns None for a data frame. A control frame is not passed on: it
    /// comes back as a `Control` for the caller to apply and pass on
    /// (`send_control`). Waits at most the receive deadline (`Timeout`).
    fn relay(&self, py: Python<'_>) -> PyResult<Option<Control>> {
        relay(py, &self.core, &self.deadline, &self.control, self.frame_size)
    }

    /// As `recv_prev_into`, but never waits: None when no frame is complete.
    fn try_recv_prev_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<Option<(usize, FrameKind)>> {
        recv_into(py, &self.core, &self.deadline, buf, true)
    }

    /// A descriptor for event loops (`select`, `loop.add_reader`): after a
    /// `try_recv_prev` returned None, it becomes readable when a receive
    /// may make progress (it may also be readable when the next try finds
    /// nothing: try again). Owned by the transport: valid until `close()`.
    fn fileno(&self, py: Python<'_>) -> PyResult<RawFd> {
        fileno(py, &self.core)
    }

    /// The receive deadline in seconds (None: none).
    #[getter]
    fn recv_timeout(&self) -> Option<f64> {
        lock(&self.deadline).user.map(|d| d.as_secs_f64())
    }

    /// Sets the receive deadline in seconds (None: wait for ever).
    fn set_recv_timeout(&self, py: Python<'_>, seconds: Option<f64>) -> PyResult<()> {
        set_timeout(py, &self.core, &self.deadline, seconds)
    }

    /// The counters, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, b) = call(py, &self.core, "stats", |t| Ok((t.stats(), t.backend_counters().map(|b| b.values()))))?;
        stats_dict(py, &s, b)
    }

    /// The control of the ring keys (`KeyControl.set(key_file,
    /// previous_key_file)`), usable from any thread, also while another
    /// waits in a receive and after `split()`. Raises `ConfigError` when
    /// the transport was opened without `key_file` (a ring becomes keyed
    /// only when its nodes start keyed).
    fn key_control(&self, py: Python<'_>) -> PyResult<Py<KeyControl>> {
        self.keys.as_ref().map(|k| k.clone_ref(py)).ok_or_else(|| {
            errors::bad_value("key_file", leap::transport::ring_key::KeyChangeError::Unkeyed.to_string())
        })
    }

    /// Splits the transport into a sender and a receiver for two threads
    /// (this object is closed after).
    fn split(&self, py: Python<'_>) -> PyResult<(Sender, Receiver)> {
        not_in_fill("split")?;
        let t = py.detach(|| lock(&self.core).take()).map_err(|b| errors::busy(b, "split"))?;
        let halves = py.detach(|| t.split()).map_err(errors::transport)?;
        let d = lock(&self.deadline);
        let deadline = Mutex::new(Deadline { user: d.user, polling: d.polling });
        Ok((Sender::new(halves.sender, self.frame_size), Receiver::new(halves.receiver, deadline)))
    }

    /// Closes the transport (at once, or when its lent frame is released).
    /// Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        close(py, &self.core)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        close(py, &self.core)?;
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let state = if closed(py, &self.core) { ", closed" } else { "" };
        format!("<leap.Transport {}{state}>", self.name)
    }
}

/// The sending half of a split transport.
#[pyclass(module = "leap", frozen)]
#[derive(Debug)]
pub struct Sender {
    core: Core<dyn FrameSender>,
    frame_size: usize,
}

impl Sender {
    fn new(s: Box<dyn FrameSender>, frame_size: usize) -> Self {
        Self { core: Arc::new(Mutex::new(Lender::new(s))), frame_size }
    }
}

#[pymethods]
impl Sender {
    /// See `Transport.frame_size`.
    #[getter]
    fn frame_size(&self) -> usize {
        self.frame_size
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        closed(py, &self.core)
    }

    /// See `Transport.send_next`.
    fn send_next(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        send_next(py, &self.core, buf)
    }

    /// See `Transport.send_multipart_next`.
    fn send_multipart_next(
        &self,
        py: Python<'_>,
        header: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        send_multipart(py, &self.core, header, payload)
    }

    /// See `Transport.send_next_with`.
    #[pyo3(signature = (length, fill = None, kind = FrameKind::Data))]
    fn send_next_with(
        &self,
        py: Python<'_>,
        length: usize,
        fill: Option<Py<PyAny>>,
        kind: FrameKind,
    ) -> PyResult<Option<SendBuffer>> {
        match fill {
            Some(fill) => send_with(py, &self.core, length, &fill, kind).map(|()| None),
            None => begin(py, &self.core, length, kind).map(Some),
        }
    }

    /// See `Transport.send_control`.
    #[pyo3(signature = (msg, frame_len = None))]
    fn send_control(&self, py: Python<'_>, msg: &Bound<'_, PyAny>, frame_len: Option<usize>) -> PyResult<()> {
        send_control(py, &self.core, msg, frame_len.unwrap_or(self.frame_size))
    }

    /// The transport's counters (both halves).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = call(py, &self.core, "stats", |t| Ok(t.counters()))?;
        stats_dict(py, &s, None)
    }

    /// Closes this half.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        close(py, &self.core)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("<leap.Sender{}>", if closed(py, &self.core) { ", closed" } else { "" })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        close(py, &self.core)?;
        Ok(false)
    }
}

/// The receiving half of a split transport.
#[pyclass(module = "leap", frozen)]
#[derive(Debug)]
pub struct Receiver {
    core: Core<dyn FrameReceiver>,
    deadline: Arc<Mutex<Deadline>>,
}

impl Receiver {
    /// The receiving half, its deadline as the whole transport's was.
    fn new(r: Box<dyn FrameReceiver>, deadline: Mutex<Deadline>) -> Self {
        Self { core: Arc::new(Mutex::new(Lender::new(r))), deadline: Arc::new(deadline) }
    }
}

#[pymethods]
impl Receiver {
    /// Whether `close()` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        closed(py, &self.core)
    }

    /// See `Transport.recv_prev`.
    fn recv_prev(&self, py: Python<'_>) -> PyResult<Frame> {
        recv_prev(py, &self.core, &self.deadline, false)?.ok_or_else(|| errors::Error::new_err("no frame lent"))
    }

    /// Receives the next frame into `buf` (a writable buffer); returns its
    /// length and kind.
    fn recv_prev_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<(usize, FrameKind)> {
        recv_into(py, &self.core, &self.deadline, buf, false)?.ok_or_else(|| errors::Error::new_err("no frame"))
    }

    /// As `recv_prev`, but never waits: the frame that has arrived, or
    /// None when none is complete (then wait for `fileno()` to be readable).
    fn try_recv_prev(&self, py: Python<'_>) -> PyResult<Option<Frame>> {
        recv_prev(py, &self.core, &self.deadline, true)
    }

    /// As `recv_prev_into`, but never waits: None when no frame is complete.
    fn try_recv_prev_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<Option<(usize, FrameKind)>> {
        recv_into(py, &self.core, &self.deadline, buf, true)
    }

    /// A descriptor for event loops (`select`, `loop.add_reader`): after a
    /// `try_recv_prev` returned None, it becomes readable when a receive
    /// may make progress (it may also be readable when the next try finds
    /// nothing: try again). Owned by the transport: valid until `close()`.
    fn fileno(&self, py: Python<'_>) -> PyResult<RawFd> {
        fileno(py, &self.core)
    }

    /// The receive deadline in seconds (None: none).
    #[getter]
    fn recv_timeout(&self) -> Option<f64> {
        lock(&self.deadline).user.map(|d| d.as_secs_f64())
    }

    /// Sets the receive deadline in seconds (None: wait for ever).
    fn set_recv_timeout(&self, py: Python<'_>, seconds: Option<f64>) -> PyResult<()> {
        set_timeout(py, &self.core, &self.deadline, seconds)
    }

    /// The transport's counters (both halves).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = call(py, &self.core, "stats", |r| Ok(r.stats()))?;
        stats_dict(py, &s, None)
    }

    /// Closes this half (at once, or when its lent frame is released).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        close(py, &self.core)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("<leap.Receiver{}>", if closed(py, &self.core) { ", closed" } else { "" })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        close(py, &self.core)?;
        Ok(false)
    }
}
