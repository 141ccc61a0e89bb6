//! The buffer protocol, both ways: reading the bytes of any object that
//! exports a contiguous buffer (numpy arrays, bytes, bytearray, memoryview)
//! without copying them, and exporting memory leap owns (a lent frame, the
//! frame being written in place) to Python as a buffer.

use std::ffi::c_int;
use std::ptr::NonNull;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// The bytes of a Python object's buffer, held (exported) until dropped.
/// Made with the GIL held and dropped with it held; the bytes themselves
/// may be read or written without it (see [`Self::bytes`]).
pub struct Held {
    // Boxed: the exporter may keep the Py_buffer's address (numpy keeps
    // none, but the protocol allows it), so it must not move.
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the Py_buffer is only read (its pointer and length) off the GIL;
// releasing it (`Drop`) happens where the `Held` is dropped, which the
// callers do with the GIL held (it is dropped in the `#[pymethods]` after
// `Python::detach` returned).
unsafe impl Send for Held {}

impl Held {
    /// Takes `obj`'s buffer as one C-contiguous run of bytes, writable if
    /// `writable`. `what` names the argument in errors.
    ///
    /// # Errors
    ///
    /// `TypeError` when `obj` has no buffer, `BufferError` when it is not
    /// contiguous or not writable (the exporter's message, with the fix).
    pub fn new(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        let mut view = Box::new(ffi::Py_buffer::new());
        // PyBUF_SIMPLE: no shape, no strides: the exporter refuses unless
        // its memory is one contiguous run.
        let flags = if writable { ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE };
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`),
        // `view` is a valid, writable Py_buffer that stays at its address.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            let py = obj.py();
            let e = PyErr::fetch(py);
            let need = if writable { "a writable, C-contiguous buffer" } else { "a C-contiguous buffer" };
            let msg = format!(
                "{what} needs {need}, got {}: {} (numpy: np.ascontiguousarray(a); bytes, bytearray and \
                 memoryview work as they are)",
                type_name(obj),
                e.value(py)
            );
            // No buffer at all is a TypeError; a buffer of the wrong shape
            // or a read-only one a BufferError (numpy says ValueError).
            let new = if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) {
                pyo3::exceptions::PyTypeError::new_err(msg)
            } else {
                PyBufferError::new_err(msg)
            };
            new.set_cause(py, Some(e));
            return Err(new);
        }
        Ok(Self { view })
    }

    /// The bytes.
    ///
    /// Valid as long as `self`: the exporter keeps its memory while the
    /// buffer is held (a `bytearray` refuses to resize, numpy keeps the
    /// array). Another Python thread may still write into a mutable
    /// exporter meanwhile, as it may while `socket.send` reads the same
    /// buffer: the caller sends what it finds.
    pub fn bytes(&self) -> &[u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: the exporter filled `buf` and `len` for one contiguous
        // run of bytes (PyBUF_SIMPLE), which stays valid until
        // PyBuffer_Release in `Drop`; the borrow is tied to `&self`.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), len) }
    }

    /// The bytes, to write into (only for a buffer taken `writable`).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() || self.view.readonly != 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the exporter granted a writable
        // buffer (PyBUF_WRITABLE, `readonly == 0`); the borrow is tied to
        // `&mut self`, the only way to these bytes from Rust.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), len) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Every `Held` is dropped with the GIL held (see `Send` above); the
        // check keeps that true if a future caller forgets.
        Python::attach(|_| {
            // SAFETY: `view` was filled by a successful PyObject_GetBuffer
            // and is released once, here.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) };
        });
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "an object".into(), |n| n.to_string())
}

/// Memory leap owns, shown to Python as a one-dimensional buffer of bytes.
#[derive(Clone, Copy, Debug)]
pub struct Exported {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: an address and a length; whoever makes an `Exported` keeps the
// memory valid while any buffer filled from it lives (export counting in
// the owning object), see [`Exported::new`].
unsafe impl Send for Exported {}
// SAFETY: as above.
unsafe impl Sync for Exported {}

impl Exported {
    /// Memory at `ptr` of `len` bytes.
    ///
    /// # Safety
    ///
    /// The memory must stay valid (and, if `writable`, writable and not
    /// read by Rust as `&[u8]` meanwhile) for as long as any buffer that
    /// [`Self::fill`] filled has not been released: the object passed to
    /// `fill` counts its exports and gives the memory back only at zero.
    pub unsafe fn new(ptr: *const u8, len: usize, writable: bool) -> Self {
        Self { ptr: NonNull::new(ptr.cast_mut()).unwrap_or(NonNull::dangling()), len, writable }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Fills `view` for `owner` (PyBuffer_FillInfo: one dimension of
    /// unsigned bytes, read-only unless `writable`).
    ///
    /// # Errors
    ///
    /// `BufferError` for a writable request on read-only memory.
    ///
    /// # Safety
    ///
    /// `view` is the Py_buffer Python passed to `owner`'s `__getbuffer__`.
    pub unsafe fn fill(&self, owner: &Bound<'_, PyAny>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let readonly = c_int::from(!self.writable);
        let len = isize::try_from(self.len).map_err(|_| PyBufferError::new_err("frame too large"))?;
        // SAFETY: `view` is the caller's Py_buffer (this function's
        // contract), `owner` a live object, and `ptr`/`len` valid memory
        // (`Exported::new`'s contract). FillInfo sets `view.obj` to a new
        // reference to `owner`, so the owner outlives the buffer.
        let rc =
            unsafe { ffi::PyBuffer_FillInfo(view, owner.as_ptr(), self.ptr.as_ptr().cast(), len, readonly, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(owner.py()));
        }
        Ok(())
    }
}
