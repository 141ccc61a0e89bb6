//! Status codes, the thread-local message of the last error, and the guard
//! every entry point runs in: a panic becomes `LEAP_ERR_PANIC`, never an
//! unwind into C.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind};

use leap_rs::TransportError;

/// What a call of the library returns: `LEAP_OK` (0), or why it failed.
/// `leap_last_error()` then says more, and how to fix it.
#[repr(C)]
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum leap_status {
    /// Success.
    LEAP_OK = 0,
    /// A pointer argument that must not be NULL was NULL.
    LEAP_ERR_NULL = 1,
    /// An argument is out of range (a length, text that is not UTF-8).
    LEAP_ERR_ARGUMENT = 2,
    /// A setting's key or value, or settings that do not go together.
    LEAP_ERR_SETTING = 3,
    /// A receive that does not wait (timeout 0, `leap_peek_prev`) found no
    /// complete frame: wait until `leap_ready_fd` is readable, then call
    /// again.
    LEAP_ERR_AGAIN = 4,
    /// No complete frame arrived before the receive deadline.
    LEAP_ERR_TIMEOUT = 5,
    /// A frame was given up (best effort, or recovery gave up); the next
    /// receive returns the frame after it.
    LEAP_ERR_FRAME_LOST = 6,
    /// The receive buffer is shorter than `frame_size` (nothing was
    /// received), or a frame did not fit it (it was dropped).
    LEAP_ERR_TOO_LARGE = 7,
    /// The frame to send is empty or longer than the wire allows.
    LEAP_ERR_BAD_LENGTH = 8,
    /// The neighbour closed the connection (TCP; it is accepted again).
    LEAP_ERR_PEER_CLOSED = 9,
    /// The next node could not be reached while opening.
    LEAP_ERR_CONNECT = 10,
    /// This transport cannot do that.
    LEAP_ERR_UNSUPPORTED = 11,
    /// An invalid control message, or a frame that is not one.
    LEAP_ERR_CONTROL = 12,
    /// A call out of order: a lent frame not released, a release without
    /// a lent frame, a commit without a begin, a split with a frame held.
    LEAP_ERR_STATE = 13,
    /// The handle was closed (or split into halves).
    LEAP_ERR_CLOSED = 14,
    /// A system call failed (the message names it and the error).
    LEAP_ERR_SYSTEM = 15,
    /// The backend could not be set up or failed (module not loaded, XDP
    /// refused, port taken, ...): the message says which.
    LEAP_ERR_BACKEND = 16,
    /// An internal error (a bug in leap): the call did nothing reliable.
    LEAP_ERR_PANIC = 17,
}

use leap_status::*;

/// An error of the binding: a status and its message.
#[derive(Debug)]
pub struct Error {
    status: leap_status,
    message: Cow<'static, CStr>,
}

impl Error {
    /// An error with a message made at run time.
    pub fn new(status: leap_status, message: impl Display) -> Self {
        let text = message.to_string().replace('\0', " ");
        Self { status, message: Cow::Owned(CString::new(text).expect("NULs replaced")) }
    }

    /// An error with a fixed message (no allocation: for the hot paths).
    pub const fn fixed(status: leap_status, message: &'static CStr) -> Self {
        Self { status, message: Cow::Borrowed(message) }
    }

    /// A NULL pointer argument.
    pub fn null(what: &str) -> Self {
        Self::new(LEAP_ERR_NULL, format_args!("{what} is NULL: pass a valid pointer"))
    }

    /// The status.
    pub fn status(&self) -> leap_status {
        self.status
    }
}

/// The message of `LEAP_ERR_AGAIN`.
const AGAIN: &CStr =
    c"no complete frame yet (the receive does not wait): wait until leap_ready_fd() is readable, then call again";

impl From<TransportError> for Error {
    fn from(e: TransportError) -> Self {
        use TransportError as E;
        if e.is_would_block() {
            return Self::fixed(LEAP_ERR_AGAIN, AGAIN);
        }
        let (status, fix) = match &e {
            E::Timeout(_) => (
                LEAP_ERR_TIMEOUT,
                "; the previous node sent nothing complete in time: check it runs, or raise the timeout (leap_set_recv_timeout, recv_timeout_ms)",
            ),
            E::FrameLost { .. } => (
                LEAP_ERR_FRAME_LOST,
                "; the next receive returns the frame after it (reliability = reliable recovers losses between leap nodes)",
            ),
            E::FrameTooLarge { .. } => {
                (LEAP_ERR_TOO_LARGE, "; the frame was dropped: receive into a buffer of at least frame_size bytes")
            }
            E::BadFrameLen(_) => (LEAP_ERR_BAD_LENGTH, "; send between 1 byte and frame_size bytes"),
            E::PeerClosed(_) => (LEAP_ERR_PEER_CLOSED, "; it is accepted again when it comes back: keep receiving"),
            E::Connect { .. } => (LEAP_ERR_CONNECT, "; start the next node, or raise setup_timeout_s"),
            E::Unsupported(_) => (LEAP_ERR_UNSUPPORTED, ""),
            E::Setting(_) => (LEAP_ERR_SETTING, ""),
            E::Control(_) => (
                LEAP_ERR_CONTROL,
                "; check the message's fields (worker_index <= total_workers <= 16, start <= end) and a frame length of at least LEAP_CONTROL_FRAME_MIN",
            ),
            E::NotBegun => (LEAP_ERR_STATE, ""),
            E::Syscall(_) => (LEAP_ERR_SYSTEM, ""),
            E::Stalled { .. } => (LEAP_ERR_TIMEOUT, ""),
            _ => (LEAP_ERR_BACKEND, ""),
        };
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            let part = s.to_string();
            if !text.contains(&part) {
                text = format!("{text}: {part}");
            }
            source = s.source();
        }
        Self::new(status, format_args!("{text}{fix}"))
    }
}

impl From<leap_rs::transport::settings::SettingError> for Error {
    fn from(e: leap_rs::transport::settings::SettingError) -> Self {
        Self::new(LEAP_ERR_SETTING, e)
    }
}

/// The result of the binding's internals.
pub type Result<T, E = Error> = std::result::Result<T, E>;

thread_local! {
    /// The message of the last error on this thread.
    static LAST: RefCell<Cow<'static, CStr>> = const { RefCell::new(Cow::Borrowed(c"")) };
}

fn record(e: Error) -> leap_status {
    let status = e.status;
    // `try_with`: the thread may be exiting (its locals gone).
    let _ = LAST.try_with(|m| *m.borrow_mut() = e.message);
    status
}

/// Runs an entry point: its error, or a panic, becomes a status and the
/// thread's message.
pub fn guard(f: impl FnOnce() -> Result<()>) -> leap_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => LEAP_OK,
        Ok(Err(e)) => record(e),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            record(Error::new(LEAP_ERR_PANIC, format_args!("internal error in leap (please report it): {what}")))
        }
    }
}

/// The message of the last failed call on the calling thread (an empty
/// string before any): what went wrong and how to fix it. It stays valid
/// until the next failing call on this thread. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn leap_last_error() -> *const c_char {
    LAST.try_with(|m| m.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// A short, fixed name of `status` (`"LEAP_ERR_AGAIN"`, ...). Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn leap_status_name(status: leap_status) -> *const c_char {
    let name: &'static CStr = match status {
        LEAP_OK => c"LEAP_OK",
        LEAP_ERR_NULL => c"LEAP_ERR_NULL",
        LEAP_ERR_ARGUMENT => c"LEAP_ERR_ARGUMENT",
        LEAP_ERR_SETTING => c"LEAP_ERR_SETTING",
        LEAP_ERR_AGAIN => c"LEAP_ERR_AGAIN",
        LEAP_ERR_TIMEOUT => c"LEAP_ERR_TIMEOUT",
        LEAP_ERR_FRAME_LOST => c"LEAP_ERR_FRAME_LOST",
        LEAP_ERR_TOO_LARGE => c"LEAP_ERR_TOO_LARGE",
        LEAP_ERR_BAD_LENGTH => c"LEAP_ERR_BAD_LENGTH",
        LEAP_ERR_PEER_CLOSED => c"LEAP_ERR_PEER_CLOSED",
        LEAP_ERR_CONNECT => c"LEAP_ERR_CONNECT",
        LEAP_ERR_UNSUPPORTED => c"LEAP_ERR_UNSUPPORTED",
        LEAP_ERR_CONTROL => c"LEAP_ERR_CONTROL",
        LEAP_ERR_STATE => c"LEAP_ERR_STATE",
        LEAP_ERR_CLOSED => c"LEAP_ERR_CLOSED",
        LEAP_ERR_SYSTEM => c"LEAP_ERR_SYSTEM",
        LEAP_ERR_BACKEND => c"LEAP_ERR_BACKEND",
        LEAP_ERR_PANIC => c"LEAP_ERR_PANIC",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: leap_last_error returns a NUL-terminated string that lives
        // until the next failing call on this thread.
        unsafe { CStr::from_ptr(leap_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        assert_eq!(guard(|| panic!("boom")), LEAP_ERR_PANIC);
        assert!(last().contains("boom"), "{}", last());
        assert_eq!(guard(|| Ok(())), LEAP_OK);
        assert!(last().contains("boom"), "a success keeps the last error");
    }

    #[test]
    fn transport_errors_map_to_statuses_with_the_fix() {
        let e = Error::from(TransportError::Timeout(std::time::Duration::ZERO));
        assert_eq!(e.status(), LEAP_ERR_AGAIN);
        assert!(matches!(e.message, Cow::Borrowed(_)), "AGAIN allocates nothing");
        let e = Error::from(TransportError::FrameTooLarge { len: 10, capacity: 5 });
        assert_eq!(e.status(), LEAP_ERR_TOO_LARGE);
        assert_eq!(guard(|| Err(e)), LEAP_ERR_TOO_LARGE);
        assert!(last().contains("at least frame_size"), "{}", last());
        assert_eq!(guard(|| Err(Error::null("buf"))), LEAP_ERR_NULL);
        assert_eq!(last(), "buf is NULL: pass a valid pointer");
    }
}
