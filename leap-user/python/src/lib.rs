//! `leap._leap`: the Rust half of the Python package `leap` (PyO3, abi3).
//! It wraps the library's public API (`leap::transport`) and implements no
//! part of the protocol: opening a transport by name with the node file's
//! settings ([`leap::transport::settings::Settings`]), sending from any
//! buffer without a copy, lending received frames to numpy through the
//! buffer protocol, control messages, counters and split halves, every
//! blocking call with the GIL released.
//!
//! ```python
//! import leap, numpy as np
//! with leap.open("udp", listen="127.0.0.1:9000", next="127.0.0.1:9001") as t:
//!     t.send_next(np.zeros(4098, np.float32))
//!     with t.recv_prev() as frame:
//!         x = np.frombuffer(frame, np.float32)  # no copy
//! ```
//!
//! Built by maturin (`cargo xtask python`); the Python side (`leap/`) and
//! its tests are next to this crate.

mod buffer;
mod control;
mod errors;
mod frame;
mod keys;
mod lending;
mod transport;

use leap::transport::open::TransportKind;
use leap::transport::settings::{KEYS, Settings};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString, PyTuple};

/// The text form [`Settings::set`] takes of a Python value: `True` →
/// `true`, `[0, 1]` → `0,1`, `("10.0.0.2", 9000)` → `10.0.0.2:9000`, a
/// path → its text; `None` → not set.
fn setting_text(key: &str, v: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if v.is_none() {
        return Ok(None);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Some(if b.is_true() { "true" } else { "false" }.into()));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Some(s.to_str()?.into()));
    }
    if let Ok(n) = v.extract::<i64>() {
        return Ok(Some(n.to_string()));
    }
    if let Ok(t) = v.cast::<PyTuple>()
        && t.len() == 2
        && let (Ok(host), Ok(port)) = (t.get_item(0)?.extract::<String>(), t.get_item(1)?.extract::<u16>())
    {
        return Ok(Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }));
    }
    if v.cast::<PyList>().is_ok() || v.cast::<PyTuple>().is_ok() {
        let items: Vec<i64> = v
            .extract()
            .map_err(|_| errors::bad_value(key, format!("`{v}`: a list of whole numbers, such as [0, 1]")))?;
        return Ok(Some(items.iter().map(i64::to_string).collect::<Vec<_>>().join(",")));
    }
    if let Ok(p) = v.extract::<std::path::PathBuf>() {
        return Ok(Some(p.to_string_lossy().into_owned()));
    }
    if v.extract::<f64>().is_ok() {
        return Ok(Some(v.str()?.to_str()?.into()));
    }
    Err(errors::bad_value(key, format!("cannot take a {}", v.get_type().name()?)))
}

/// Opens a transport of `kind` ("tcp", "udp", "xdp", "xdp-ringbuf",
/// "kmod") that listens on `listen`, sends to `next` and takes frames only
/// from `prev` (default: the first source). `options` are the node file's
/// `[transport]` keys (`leap.KEYS`): `recv_timeout_ms=500`, `crc=False`,
/// `queues=[0, 1]`, ... For TCP this connects to the next node and accepts
/// the previous one (within `setup_timeout_s`), with the GIL released.
///
/// Raises `ConfigError` (with `key`) for a setting it cannot take, else
/// what the backend reports.
#[pyfunction]
#[pyo3(signature = (kind, *, listen = None, next = None, prev = None, **options))]
fn open(
    py: Python<'_>,
    kind: &str,
    listen: Option<&Bound<'_, PyAny>>,
    next: Option<&Bound<'_, PyAny>>,
    prev: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<transport::Transport> {
    let kind: TransportKind = kind.parse().map_err(|e| errors::unknown_kind(&e))?;
    let mut s = Settings::new(kind);
    let mut set = |key: &str, v: Option<&Bound<'_, PyAny>>| -> PyResult<()> {
        if let Some(v) = v
            && let Some(text) = setting_text(key, v)?
        {
            s.set(key, &text).map_err(errors::setting)?;
        }
        Ok(())
    };
    set("listen", listen)?;
    set("next", next)?;
    set("prev", prev)?;
    if let Some(o) = options {
        for (k, v) in o.iter() {
            let k: String = k.extract()?;
            set(&k, Some(&v))?;
        }
    }
    let (frame_size, recv_timeout) = (s.options().frame_len, s.options().recv_timeout);
    let t = py.detach(|| s.open()).map_err(errors::transport)?;
    let keys = s.options().ring_key.clone().zip(t.key_control());
    let keys = keys.map(|(running, c)| Py::new(py, keys::KeyControl::new(c, running))).transpose()?;
    Ok(transport::Transport::new(t, frame_size, recv_timeout, keys))
}

/// Bytes of a frame of `dim` float32 activations after the 8-byte header.
#[pyfunction]
fn frame_len(dim: usize) -> usize {
    leap_common::frame::frame_len(dim)
}

#[pymodule]
fn _leap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(frame_len, m)?)?;
    m.add_class::<transport::Transport>()?;
    m.add_class::<transport::Sender>()?;
    m.add_class::<transport::Receiver>()?;
    m.add_class::<frame::Frame>()?;
    m.add_class::<frame::FrameKind>()?;
    m.add_class::<frame::SendBuffer>()?;
    m.add_class::<control::Control>()?;
    m.add_class::<control::ControlType>()?;
    m.add_class::<keys::KeyControl>()?;
    let keys = PyDict::new(py);
    for (k, what) in KEYS {
        keys.set_item(k, what)?;
    }
    m.add("KEYS", keys)?;
    m.add("TRANSPORTS", TransportKind::ALL.map(TransportKind::as_str).to_vec())?;
    m.add("HEADER_LEN", leap_common::frame::FrameHeader::LEN)?;
    m.add("CONTROL_FRAME_MIN", leap_common::control::CONTROL_FRAME_MIN)?;
    m.add("FRAME_LEN_MAX", leap_common::chunk::FRAME_LEN_MAX)?;
    Ok(())
}
