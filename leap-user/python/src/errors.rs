//! The exceptions: one class per way a call can fail, all under
//! `leap.Error`, each carrying the library's message (and the fields a
//! caller may act on as attributes).

use leap::transport::kmod::KmodError;
use leap::transport::settings::SettingError;
use leap::transport::udp::UdpError;
use leap::transport::{TransportError, open::UnknownName};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::lending::Busy;

create_exception!(leap, Error, PyException, "Base class of every error leap raises.");
create_exception!(leap, Timeout, Error, "No complete frame arrived before the receive deadline.");
create_exception!(
    leap,
    FrameLost,
    Error,
    "A frame could not be completed and was given up (best-effort mode); `seq`, `missing`, `total`."
);
create_exception!(
    leap,
    FrameTooLarge,
    Error,
    "The frame does not fit the buffer given (it is dropped); `length`, `capacity`."
);
create_exception!(leap, BadFrameLength, Error, "A frame to send is empty or longer than the wire allows; `length`.");
create_exception!(leap, PeerClosed, Error, "The neighbour closed the connection.");
create_exception!(leap, ConnectError, Error, "The next node could not be reached; `errno`.");
create_exception!(leap, SystemCallError, Error, "A system call failed; `call`, `errno`.");
create_exception!(
    leap,
    ConfigError,
    Error,
    "A setting that cannot be taken, or settings that do not go together; `key`, `problem`."
);
create_exception!(leap, ControlError, Error, "An invalid control message, or a frame that is not one.");
create_exception!(leap, Closed, Error, "The transport was closed (or split into halves).");
create_exception!(
    leap,
    FrameLent,
    Error,
    "A received frame is still lent: release() it (or leave its `with` block) first."
);

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("FrameLost", py.get_type::<FrameLost>())?;
    m.add("FrameTooLarge", py.get_type::<FrameTooLarge>())?;
    m.add("BadFrameLength", py.get_type::<BadFrameLength>())?;
    m.add("PeerClosed", py.get_type::<PeerClosed>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("SystemCallError", py.get_type::<SystemCallError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ControlError", py.get_type::<ControlError>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("FrameLent", py.get_type::<FrameLent>())?;
    Ok(())
}

/// An exception of class `E` with `message` and attributes.
fn raise<E: pyo3::PyTypeInfo>(message: String, attrs: &[(&str, Attr)]) -> PyErr {
    Python::attach(|py| {
        let err = PyErr::from_type(py.get_type::<E>(), message);
        let value = err.value(py);
        for (k, v) in attrs {
            let set = match v {
                Attr::Int(n) => value.setattr(*k, *n),
                Attr::Str(s) => value.setattr(*k, s.as_str()),
                Attr::None => value.setattr(*k, py.None()),
            };
            if let Err(e) = set {
                return e;
            }
        }
        err
    })
}

enum Attr {
    Int(i64),
    Str(String),
    None,
}

fn errno(e: &std::io::Error) -> Attr {
    e.raw_os_error().map_or(Attr::None, |n| Attr::Int(n.into()))
}

/// The exception for a transport's error.
pub fn transport(e: TransportError) -> PyErr {
    let msg = e.to_string();
    match e {
        TransportError::Timeout(_) => raise::<Timeout>(msg, &[]),
        TransportError::FrameLost { seq, missing, total } => raise::<FrameLost>(
            msg,
            &[
                ("seq", Attr::Int(seq.into())),
                ("missing", Attr::Int(missing.into())),
                ("total", Attr::Int(total.into())),
            ],
        ),
        TransportError::FrameTooLarge { len, capacity } => {
            raise::<FrameTooLarge>(msg, &[("length", Attr::Int(len as i64)), ("capacity", Attr::Int(capacity as i64))])
        }
        TransportError::Kmod(KmodError::FrameTooLarge(len)) => raise::<FrameTooLarge>(
            msg,
            &[("length", Attr::Int(len as i64)), ("capacity", Attr::Int(leap_common::kmod::BANK_FRAME_MAX as i64))],
        ),
        TransportError::BadFrameLen(len) => raise::<BadFrameLength>(msg, &[("length", Attr::Int(len as i64))]),
        TransportError::PeerClosed(_) => raise::<PeerClosed>(msg, &[]),
        TransportError::Connect { ref source, .. } => raise::<ConnectError>(msg.clone(), &[("errno", errno(source))]),
        TransportError::Kmod(KmodError::NotPermitted { ref source, .. }) => {
            raise::<SystemCallError>(msg.clone(), &[("call", Attr::Str("open".into())), ("errno", errno(source))])
        }
        ref e if let Some(sc) = e.syscall() => {
            raise::<SystemCallError>(msg.clone(), &[("call", Attr::Str(sc.call.into())), ("errno", errno(&sc.source))])
        }
        TransportError::Udp(UdpError::MaxFrameLen(_)) => config_error("max_frame_len", msg.clone(), msg),
        TransportError::Udp(UdpError::Window(_)) => config_error("window", msg.clone(), msg),
        TransportError::Setting(s) => setting(s),
        TransportError::Control(_) => raise::<ControlError>(msg, &[]),
        _ => raise::<Error>(msg, &[]),
    }
}

fn config_error(key: &str, problem: String, msg: String) -> PyErr {
    raise::<ConfigError>(msg, &[("key", Attr::Str(key.into())), ("problem", Attr::Str(problem))])
}

/// `ConfigError` for a setting.
pub fn setting(e: SettingError) -> PyErr {
    let msg = e.to_string();
    config_error(&e.key, e.problem, msg)
}

/// `ConfigError` for an unknown transport kind.
pub fn unknown_kind(e: &UnknownName) -> PyErr {
    config_error("kind", e.to_string(), e.to_string())
}

/// `ConfigError` for a value of a type the setting cannot take.
pub fn bad_value(key: &str, problem: String) -> PyErr {
    let msg = format!("{key}: {problem}");
    config_error(key, problem, msg)
}

/// The exception for a transport that cannot be used now.
pub fn busy(b: Busy, what: &str) -> PyErr {
    match b {
        Busy::Lent => raise::<FrameLent>(
            format!(
                "{what}: a received frame is still lent; release() it or leave its `with` block first \
                 (or split() the transport to send while a frame is lent)"
            ),
            &[],
        ),
        Busy::Begun => raise::<FrameLent>(
            format!(
                "{what}: a frame begun with `with send_next_with(n) as out` is not sent yet; \
                 leave its with block (or out.commit()) first"
            ),
            &[],
        ),
        Busy::Closed => raise::<Closed>(format!("{what}: the transport is closed (or was split into halves)"), &[]),
    }
}

/// `ControlError` with `message`.
pub fn control(message: String) -> PyErr {
    raise::<ControlError>(message, &[])
}
