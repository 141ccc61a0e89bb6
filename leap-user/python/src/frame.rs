//! What Python holds of a frame: a received frame lent by the transport
//! ([`Frame`], read through the buffer protocol, given back exactly once),
//! and the memory a frame is written into in place ([`SendBuffer`]).

use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use leap::transport::FrameKind as Kind;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::buffer::Exported;
use crate::control::Control;
use crate::lending::{Lender, LentBytes};

/// Data or control.
#[pyclass(module = "leap", eq, eq_int, frozen, from_py_object)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// Activations.
    #[pyo3(name = "DATA")]
    Data,
    /// A control message (0xC0DE marker + message, zero padded).
    #[pyo3(name = "CONTROL")]
    Control,
}

impl From<Kind> for FrameKind {
    fn from(k: Kind) -> Self {
        match k {
            Kind::Data => Self::Data,
            Kind::Control => Self::Control,
        }
    }
}

impl From<FrameKind> for Kind {
    fn from(k: FrameKind) -> Self {
        match k {
            FrameKind::Data => Self::Data,
            FrameKind::Control => Self::Control,
        }
    }
}

/// Locks, whatever a panic elsewhere left (the state stays consistent:
/// every change under these locks is a single assignment).
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What lent a frame and takes it back.
pub trait Owner: Send + Sync {
    /// Gives the lent frame back (see [`Lender::give_back`]).
    fn give_back(&self);
}

impl<T: ?Sized + Send + 'static> Owner for Mutex<Lender<T>> {
    fn give_back(&self) {
        // Never waits long: while a frame is lent, every other call on this
        // transport takes the lock only to find it lent and return.
        lock(self).give_back();
    }
}

#[derive(Debug, Default)]
struct Exports {
    /// Buffers handed to Python and not yet released.
    live: usize,
    /// The frame went back to the transport.
    released: bool,
}

/// A received frame, lent by the transport: its bytes are where the
/// transport received them, and `np.frombuffer(frame, np.float32)` or
/// `memoryview(frame)` read them in place (read-only).
///
/// The transport gets the frame back, exactly once, at the first of
/// `release()`, the end of its `with` block, or its collection. Until then
/// the transport it came from refuses every other call (`FrameLent`), so a
/// worker releases a frame before it receives the next (the halves of
/// `split()` send while the receiver lends). `release()` while numpy
/// arrays or memoryviews of the frame are alive raises `BufferError` (the
/// memory is still in use) and keeps the frame; a second `release()` does
/// nothing.
#[pyclass(module = "leap", frozen)]
pub struct Frame {
    owner: Arc<dyn Owner>,
    bytes: LentBytes,
    exports: Mutex<Exports>,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame").field("bytes", &self.bytes).field("exports", &self.exports).finish_non_exhaustive()
    }
}

impl Frame {
    /// A frame lent by `owner` at `bytes`.
    pub fn new(owner: Arc<dyn Owner>, bytes: LentBytes) -> Self {
        Self { owner, bytes, exports: Mutex::new(Exports::default()) }
    }

    fn give_back(&self) -> PyResult<()> {
        let mut e = lock(&self.exports);
        if e.released {
            return Ok(());
        }
        if e.live > 0 {
            return Err(PyBufferError::new_err(format!(
                "the frame cannot be released: {} buffer view(s) of it are alive (numpy arrays, memoryviews); \
                 delete them first (it is released when collected otherwise)",
                e.live
            )));
        }
        e.released = true;
        drop(e);
        self.owner.give_back();
        Ok(())
    }

    /// The bytes while the frame is lent, for reading in Rust. `f` may
    /// call into Python (allocate, run a collection that releases buffers
    /// of this frame): the read counts as one more export instead of
    /// holding the lock, so the frame cannot be given back meanwhile.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
        {
            let mut e = lock(&self.exports);
            if e.released {
                return Err(released());
            }
            e.live += 1;
        }
        // SAFETY: the frame is lent (not released) and cannot be released
        // while `live` counts this read (`give_back` refuses), so the
        // transport keeps the bytes where `LentBytes` says.
        let bytes = unsafe { std::slice::from_raw_parts(self.bytes.ptr(), self.bytes.len()) };
        let r = f(bytes);
        lock(&self.exports).live -= 1;
        Ok(r)
    }
}

fn released() -> PyErr {
    PyValueError::new_err("the frame was released: its memory is the transport's again")
}

#[pymethods]
impl Frame {
    /// Data or control.
    #[getter]
    fn kind(&self) -> FrameKind {
        self.bytes.kind().into()
    }

    /// The frame's length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.bytes.len()
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the frame went back to the transport.
    #[getter]
    fn released(&self) -> bool {
        lock(&self.exports).released
    }

    /// Gives the frame back to the transport. Does nothing the second time.
    ///
    /// Raises `BufferError` while views of the frame are alive.
    fn release(&self) -> PyResult<()> {
        self.give_back()
    }

    /// The control message a control frame carries.
    ///
    /// Raises `ControlError` for a data frame or an invalid message.
    fn control(&self) -> PyResult<Control> {
        if self.bytes.kind() != Kind::Control {
            return Err(crate::errors::control("a data frame carries no control message".into()));
        }
        self.with_bytes(Control::decode_bytes)?
    }

    /// The frame's bytes, copied.
    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        self.with_bytes(|b| pyo3::types::PyBytes::new(py, b))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.give_back()?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.exports).released { ", released" } else { "" };
        let kind = if self.bytes.kind() == Kind::Control { "CONTROL" } else { "DATA" };
        format!("<leap.Frame {kind}, {} bytes{state}>", self.bytes.len())
    }

    /// # Safety
    ///
    /// Called by Python with its Py_buffer.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        let mut e = lock(&this.exports);
        if e.released {
            return Err(released());
        }
        if flags & ffi::PyBUF_WRITABLE != 0 {
            return Err(PyBufferError::new_err(
                "a received frame is read-only (np.frombuffer gives a read-only array; copy it to change it)",
            ));
        }
        // SAFETY: the bytes stay lent while `live > 0`: `give_back`
        // refuses until every buffer filled here is released.
        let mem = unsafe { Exported::new(this.bytes.ptr(), this.bytes.len(), false) };
        // SAFETY: `view` is Python's, passed to this `__getbuffer__`.
        unsafe { mem.fill(slf.as_any(), view, flags) }?;
        e.live += 1;
        Ok(())
    }

    /// # Safety
    ///
    /// Called by Python with a Py_buffer `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut e = lock(&self.exports);
        e.live = e.live.saturating_sub(1);
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        // Collected: no buffer of it is alive (each holds a reference).
        let e = self.exports.get_mut().unwrap_or_else(PoisonError::into_inner);
        if !e.released {
            e.released = true;
            self.owner.give_back();
        }
    }
}

/// Ends a frame begun in a transport's memory (the `with` form of
/// `send_next_with`).
pub trait Finish: Send + Sync {
    /// Sends the frame (`commit`), or leaves it for the library to discard.
    ///
    /// # Errors
    ///
    /// What the send reported, or `Closed`.
    fn finish(&self, py: Python<'_>, commit: bool) -> PyResult<()>;
}

/// The memory the next frame is written into, in place, in the transport:
/// writable through the buffer protocol (`np.frombuffer(out, np.float32)`,
/// `memoryview(out)`).
///
/// From `send_next_with(length, fill)` it is `fill`'s argument, valid until
/// fill returns. From `with t.send_next_with(length) as out:` it is valid
/// until the block ends, where the frame is sent (`commit()`); an
/// exception in the block sends nothing. `commit()` while views of `out`
/// are alive raises `BufferError` and sends nothing yet (delete them and
/// commit again); until then the transport refuses other calls
/// (`FrameLent`). Collected uncommitted, the frame is not sent.
#[pyclass(module = "leap", frozen)]
pub struct SendBuffer {
    mem: Exported,
    state: Mutex<Exports>,
    /// The transport, for the `with` form.
    begun: Option<Arc<dyn Finish>>,
}

impl std::fmt::Debug for SendBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBuffer").field("mem", &self.mem).field("state", &self.state).finish_non_exhaustive()
    }
}

impl SendBuffer {
    /// Memory the transport lends for one frame, to `fill`.
    ///
    /// # Safety
    ///
    /// `buf` stays valid until [`Self::close`], and after it for ever if
    /// `close` found views alive (the caller then pins the transport with
    /// [`Lender::pin`]).
    pub unsafe fn new(buf: &mut [u8]) -> Self {
        // SAFETY: the caller keeps `buf` valid (this function's contract).
        let mem = unsafe { Exported::new(buf.as_mut_ptr(), buf.len(), true) };
        Self { mem, state: Mutex::new(Exports::default()), begun: None }
    }

    /// Memory a transport began a frame in, at `ptr` for `len` bytes.
    ///
    /// # Safety
    ///
    /// The memory stays valid and untouched by Rust until `owner.finish`,
    /// which this object calls only once no view of it is alive.
    pub unsafe fn begun(ptr: *mut u8, len: usize, owner: Arc<dyn Finish>) -> Self {
        // SAFETY: valid until `finish` (this function's contract).
        let mem = unsafe { Exported::new(ptr, len, true) };
        Self { mem, state: Mutex::new(Exports::default()), begun: Some(owner) }
    }

    /// `fill` returned: no new buffers of this memory. Returns how many
    /// views are still alive.
    pub fn close(&self) -> usize {
        let mut s = lock(&self.state);
        s.released = true;
        s.live
    }

    fn end(&self, py: Python<'_>, commit: bool) -> PyResult<()> {
        let Some(owner) = &self.begun else {
            return Err(PyValueError::new_err("this send buffer is fill's: the frame is sent when fill returns"));
        };
        let mut s = lock(&self.state);
        if s.released {
            return if commit {
                Err(PyValueError::new_err("the frame was already sent (or abandoned)"))
            } else {
                Ok(())
            };
        }
        if s.live > 0 {
            return Err(PyBufferError::new_err(format!(
                "{} view(s) of the send buffer are alive (numpy arrays, memoryviews): delete them, then commit()",
                s.live
            )));
        }
        s.released = true;
        drop(s);
        owner.finish(py, commit)
    }
}

#[pymethods]
impl SendBuffer {
    fn __len__(&self) -> usize {
        self.mem.len()
    }

    fn __repr__(&self) -> String {
        format!("<leap.SendBuffer {} bytes>", self.mem.len())
    }

    /// Sends the frame (the `with` form; at the end of the block).
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        self.end(py, true)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let failed = exc_type.is_some_and(|t| !t.is_none());
        self.end(py, !failed)?;
        Ok(false)
    }

    /// # Safety
    ///
    /// Called by Python with its Py_buffer.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        let mut s = lock(&this.state);
        if s.released {
            return Err(PyBufferError::new_err(
                "the send buffer is gone: its frame was sent (write it inside fill or the with block)",
            ));
        }
        // SAFETY: `view` is Python's, passed to this `__getbuffer__`; the
        // memory is valid until `close` or `finish` (see `new`, `begun`).
        unsafe { this.mem.fill(slf.as_any(), view, flags) }?;
        s.live += 1;
        Ok(())
    }

    /// # Safety
    ///
    /// Called by Python with a Py_buffer `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut s = lock(&self.state);
        s.live = s.live.saturating_sub(1);
    }
}

impl Drop for SendBuffer {
    fn drop(&mut self) {
        // Collected while begun (no view is alive: each holds a reference):
        // nothing is sent; the transport is usable again.
        if self.begun.is_some() && !lock(&self.state).released {
            Python::attach(|py| {
                let _ = self.end(py, false);
            });
        }
    }
}
