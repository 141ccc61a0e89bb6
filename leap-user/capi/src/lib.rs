//! `libleap`: the C API of leap (`leap.h`, `libleap.so`, `libleap.a`).
//!
//! A thin layer over the `leap` crate's public API: transports are opened by
//! kind with the settings a node file has ([`leap_rs::transport::settings`]),
//! and every call maps onto the `Transport` trait (or its split halves).
//! Nothing of the transports is written again here.
//!
//! Conventions: every function returns a [`leap_status`] (`LEAP_OK` is 0)
//! and leaves the reason of a failure, with its fix, in the thread's
//! [`leap_last_error`]; handles are opaque; every pointer argument is
//! checked for NULL (a buffer may be NULL only with length 0); a panic in
//! leap is caught and returned as `LEAP_ERR_PANIC`. A handle is used by one
//! thread at a time; the two halves of [`leap_split`] may be used from two
//! threads.
//!
//! ```c
//! leap_config *c;
//! leap_transport *t;
//! leap_config_new("udp", &c);
//! leap_config_set(c, "listen", "127.0.0.1:9001");
//! leap_config_set(c, "next", "127.0.0.1:9002");
//! if (leap_open(c, &t) != LEAP_OK) fprintf(stderr, "%s\n", leap_last_error());
//! leap_config_free(c);
//! leap_send_next(t, frame, len);
//! leap_free(t);
//! ```

mod error;
mod handle;
mod types;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::time::Duration;

use leap_rs::transport::open::TransportKind;
use leap_rs::transport::ring_key::{KeyChangeError, KeySet};
use leap_rs::transport::settings::{KEYS, Settings};
use leap_rs::transport::{FrameReceiver, FrameSender, KeyControl, Transport};

use error::{Error, Result, guard};
pub use error::{leap_last_error, leap_status, leap_status_name};
use handle::{FrameView, RecvSide, SendState};
pub use types::{
    LEAP_CONTROL_ACK, LEAP_CONTROL_FRAME_MIN, LEAP_CONTROL_MARKER, LEAP_CONTROL_RESIZE_CHAIN,
    LEAP_CONTROL_RESIZE_LAYERS, LEAP_MAX_WORKERS, leap_control, leap_drops, leap_frame_kind, leap_layer_range,
    leap_stats,
};

use leap_status::{LEAP_ERR_ARGUMENT, LEAP_ERR_CLOSED, LEAP_ERR_SETTING, LEAP_ERR_STATE, LEAP_ERR_UNSUPPORTED};

/// A transport's kind and settings, built up by name before `leap_open`.
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Debug)]
pub struct leap_config {
    settings: Settings,
}

/// An open transport: sends to the next node, receives from the previous.
#[allow(non_camel_case_types, reason = "C names")]
pub struct leap_transport {
    node: Option<Node>,
    /// Why `node` is gone.
    gone: &'static CStr,
    /// The ring keys it was opened with (for `leap_key_control`).
    keys: Option<KeySet>,
}

/// The ring keys of an open keyed transport, changed from any thread
/// (`leap_key_control`).
#[allow(non_camel_case_types, reason = "C names")]
pub struct leap_keys {
    control: KeyControl,
    /// The keys in use when it was made: their `encrypt` and tagging stay.
    running: KeySet,
}

impl std::fmt::Debug for leap_keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("leap_keys").field("running", &self.running.describe()).finish_non_exhaustive()
    }
}

struct Node {
    rx: RecvSide<dyn Transport>,
    tx: SendState,
}

/// The sending half of a split transport.
#[allow(non_camel_case_types, reason = "C names")]
pub struct leap_sender {
    half: Option<(Box<dyn FrameSender>, SendState)>,
}

/// The receiving half of a split transport.
#[allow(non_camel_case_types, reason = "C names")]
pub struct leap_receiver {
    half: Option<RecvSide<dyn FrameReceiver>>,
}

impl std::fmt::Debug for leap_transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("leap_transport").field("open", &self.node.is_some()).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for leap_sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("leap_sender").field("open", &self.half.is_some()).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for leap_receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("leap_receiver").field("open", &self.half.is_some()).finish_non_exhaustive()
    }
}

const CLOSED: &CStr = c"the transport is closed: open a new one (leap_free the old handle)";
const SPLIT: &CStr = c"the transport was split: use its leap_sender and leap_receiver";

/// `p` as a mutable reference, or `LEAP_ERR_NULL` naming `what`.
///
/// # Safety
///
/// `p` is NULL or valid for writes of `T` and not aliased during the call.
unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: the caller's promise.
    unsafe { p.as_mut() }.ok_or_else(|| Error::null(what))
}

/// `p` as a shared reference, or `LEAP_ERR_NULL` naming `what`.
///
/// # Safety
///
/// `p` is NULL or valid for reads of `T` during the call.
unsafe fn arg<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    // SAFETY: the caller's promise.
    unsafe { p.as_ref() }.ok_or_else(|| Error::null(what))
}

/// A C string argument as UTF-8.
///
/// # Safety
///
/// `p` is NULL or a NUL-terminated string valid during the call.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: non-NULL, and the caller's promise.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Error::new(LEAP_ERR_ARGUMENT, format_args!("{what} is not UTF-8 text")))
}

fn check_len(len: usize, what: &str) -> Result<()> {
    if len > isize::MAX as usize {
        return Err(Error::new(LEAP_ERR_ARGUMENT, format_args!("{what} of {len} bytes is beyond any buffer")));
    }
    Ok(())
}

/// `len` bytes at `p` (NULL allowed only with length 0).
///
/// # Safety
///
/// `p` is NULL or valid for reads of `len` bytes during the call.
unsafe fn bytes<'a>(p: *const c_void, len: usize, what: &str) -> Result<&'a [u8]> {
    check_len(len, what)?;
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: non-NULL, at most isize::MAX bytes, and the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// `len` writable bytes at `p` (NULL allowed only with length 0).
///
/// # Safety
///
/// `p` is NULL or valid for writes of `len` bytes, unaliased, during the call.
unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8]> {
    check_len(len, what)?;
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: non-NULL, at most isize::MAX bytes, and the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

fn timeout_from_ms(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// The open node of `t`.
///
/// # Safety
///
/// `t` is NULL or a handle from `leap_open` not yet freed.
unsafe fn node<'a>(t: *mut leap_transport) -> Result<&'a mut Node> {
    // SAFETY: the caller's promise.
    let t = unsafe { out(t, "transport") }?;
    let gone = t.gone;
    t.node.as_mut().ok_or(Error::fixed(LEAP_ERR_CLOSED, gone))
}

/// The sending half.
///
/// # Safety
///
/// `s` is NULL or a handle from `leap_split` not yet freed.
unsafe fn sender<'a>(s: *mut leap_sender) -> Result<(&'a mut dyn FrameSender, &'a mut SendState)> {
    // SAFETY: the caller's promise.
    let s = unsafe { out(s, "sender") }?;
    let (tx, state) = s.half.as_mut().ok_or(Error::fixed(LEAP_ERR_CLOSED, CLOSED))?;
    Ok((&mut **tx, state))
}

/// The receiving half.
///
/// # Safety
///
/// `r` is NULL or a handle from `leap_split` not yet freed.
unsafe fn receiver<'a>(r: *mut leap_receiver) -> Result<&'a mut RecvSide<dyn FrameReceiver>> {
    // SAFETY: the caller's promise.
    let r = unsafe { out(r, "receiver") }?;
    r.half.as_mut().ok_or(Error::fixed(LEAP_ERR_CLOSED, CLOSED))
}

/// Writes a frame's place, length and kind to the caller's pointers.
///
/// # Safety
///
/// Each pointer is NULL (checked; `kind` may be NULL) or valid for writes.
unsafe fn put_view(v: FrameView, data: *mut *const c_void, len: *mut usize, kind: *mut leap_frame_kind) -> Result<()> {
    // SAFETY: the caller's promise.
    unsafe {
        *out(data, "data")? = v.ptr.cast();
        *out(len, "len")? = v.len;
        if let Some(k) = kind.as_mut() {
            *k = v.kind.into();
        }
    }
    Ok(())
}

/// Checks the out-pointers of a receive before it takes a frame (a frame
/// taken and then not reported would be lost).
fn need<T>(p: *mut T, what: &str) -> Result<()> {
    if p.is_null() { Err(Error::null(what)) } else { Ok(()) }
}

// ---------------------------------------------------------------------------
// Settings and opening
// ---------------------------------------------------------------------------

/// Starts the settings of a transport of `kind` (`"tcp"`, `"udp"`, `"xdp"`,
/// `"xdp-ringbuf"`, `"kmod"`) with the defaults a node file has.
/// Free with `leap_config_free`.
///
/// # Safety
///
/// `kind` is a NUL-terminated string; `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_config_new(kind: *const c_char, out: *mut *mut leap_config) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (kind, out) = unsafe { (text(kind, "kind")?, self::out(out, "out")?) };
        let kind: TransportKind = kind.parse().map_err(|e| Error::new(leap_status::LEAP_ERR_SETTING, e))?;
        *out = Box::into_raw(Box::new(leap_config { settings: Settings::new(kind) }));
        Ok(())
    })
}

/// Sets one setting by the name a node file gives it (`listen`, `next`,
/// `prev`, `interface`, `frame_size`, `inflight`, `recv_timeout_ms`,
/// `reliability`, `crc`, ...; `leap_setting_key` lists them) from its text.
/// `LEAP_ERR_SETTING` for an unknown key or a value it cannot take; the
/// message says what it takes.
///
/// # Safety
///
/// `config` is a handle from `leap_config_new`; `key` and `value` are
/// NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_config_set(
    config: *mut leap_config,
    key: *const c_char,
    value: *const c_char,
) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (c, key, value) = unsafe { (out(config, "config")?, text(key, "key")?, text(value, "value")?) };
        Ok(c.settings.set(key, value)?)
    })
}

/// Checks that the settings go together (`listen` and `next` given, an
/// interface for XDP, window sizes within memory) without opening.
///
/// # Safety
///
/// `config` is a handle from `leap_config_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_config_check(config: *const leap_config) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { arg(config, "config") }?;
        c.settings.check()?;
        Ok(())
    })
}

/// Frees settings (NULL is fine).
///
/// # Safety
///
/// `config` is NULL or a handle from `leap_config_new`, not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_config_free(config: *mut leap_config) {
    // SAFETY: the caller's promise (made by leap_config_new, given up).
    unsafe { free_handle(config, drop) }
}

/// Takes back a handle this library made with `Box::into_raw` and drops
/// it, `finish` first taking apart what must go in order; NULL does
/// nothing, and a panic does not cross the boundary.
///
/// # Safety
///
/// `p` is NULL or a handle this library gave out, not used after.
unsafe fn free_handle<T>(p: *mut T, finish: impl FnOnce(Box<T>)) {
    if p.is_null() {
        return;
    }
    let _ = guard(|| {
        // SAFETY: made by Box::into_raw (the caller's promise), given up.
        finish(unsafe { Box::from_raw(p) });
        Ok(())
    });
}

fn key_table() -> &'static [(std::ffi::CString, std::ffi::CString)] {
    static TABLE: OnceLock<Vec<(std::ffi::CString, std::ffi::CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        KEYS.iter()
            .map(|(k, h)| (std::ffi::CString::new(*k).expect("no NUL"), std::ffi::CString::new(*h).expect("no NUL")))
            .collect()
    })
}

/// The name of setting number `index` (0, 1, ...), NULL past the last:
/// what `leap_config_set` takes. `help`, unless NULL, gets what it sets.
///
/// # Safety
///
/// `help` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_setting_key(index: usize, help: *mut *const c_char) -> *const c_char {
    let Some((k, h)) = key_table().get(index) else { return std::ptr::null() };
    // SAFETY: the caller's promise.
    if let Some(help) = unsafe { help.as_mut() } {
        *help = h.as_ptr();
    }
    k.as_ptr()
}

/// Opens the transport the settings describe (TCP connects to the next node
/// and accepts the previous one, within `setup_timeout_s`). The settings
/// can be freed after. Close with `leap_close` and free with `leap_free`.
///
/// # Safety
///
/// `config` is a handle from `leap_config_new`; `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_open(config: *const leap_config, out: *mut *mut leap_transport) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (c, out) = unsafe { (arg(config, "config")?, self::out(out, "out")?) };
        let t = c.settings.open()?;
        let o = c.settings.options();
        let node = Node { rx: RecvSide::new(t, o.recv_timeout, o.frame_len), tx: SendState::default() };
        let keys = o.ring_key.clone();
        *out = Box::into_raw(Box::new(leap_transport { node: Some(node), gone: CLOSED, keys }));
        Ok(())
    })
}

/// The transport's kind (`"udp"`, ...), or NULL for a closed handle.
///
/// # Safety
///
/// `t` is NULL or a handle from `leap_open` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_kind(t: *mut leap_transport) -> *const c_char {
    // SAFETY: the caller's promise.
    let Ok(n) = (unsafe { node(t) }) else { return std::ptr::null() };
    match n.rx.inner().name() {
        "tcp" => c"tcp".as_ptr(),
        "udp" => c"udp".as_ptr(),
        "xdp" => c"xdp".as_ptr(),
        "xdp-ringbuf" => c"xdp-ringbuf".as_ptr(),
        "kmod" => c"kmod".as_ptr(),
        _ => c"other".as_ptr(),
    }
}

// ---------------------------------------------------------------------------
// Sending
// ---------------------------------------------------------------------------

/// Sends one frame of `len` bytes to the next node.
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `buf` is valid for reads of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_send_next(t: *mut leap_transport, buf: *const c_void, len: usize) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (n, frame) = unsafe { (node(t)?, bytes(buf, len, "buf")?) };
        n.tx.send(n.rx.inner(), frame, &[])
    })
}

/// Sends `header` followed by `payload` as one frame, without merging them
/// first (the original's `send_multipart_next`).
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `header` and `payload` are valid for
/// reads of their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_send_multipart_next(
    t: *mut leap_transport,
    header: *const c_void,
    header_len: usize,
    payload: *const c_void,
    payload_len: usize,
) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (n, h, p) =
            unsafe { (node(t)?, bytes(header, header_len, "header")?, bytes(payload, payload_len, "payload")?) };
        n.tx.send(n.rx.inner(), h, p)
    })
}

/// Begins a data frame of `len` bytes written in place: `*buf` points to
/// where the transport sends it from (the retransmit slot, the module's
/// transmit area), holding whatever an earlier frame left. Write all `len`
/// bytes, then `leap_send_commit`. Beginning again, or any other send,
/// discards a frame begun (nothing of it is sent). No copy is made.
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `buf` is valid for a write. `*buf` is
/// valid for `len` bytes until the commit, the next send or begin, or
/// `leap_close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_send_begin(t: *mut leap_transport, len: usize, buf: *mut *mut c_void) -> leap_status {
    guard(|| {
        need(buf, "buf")?;
        // SAFETY: the caller's promise.
        let n = unsafe { node(t) }?;
        let p = n.tx.begin(n.rx.inner(), len)?;
        // SAFETY: checked non-NULL; the caller's promise.
        unsafe { *buf = p.cast() };
        Ok(())
    })
}

/// Sends the frame begun with `leap_send_begin`. `LEAP_ERR_STATE` without
/// one.
///
/// # Safety
///
/// `t` is a handle from `leap_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_send_commit(t: *mut leap_transport) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let n = unsafe { node(t) }?;
        n.tx.commit(n.rx.inner())
    })
}

/// Sends a control message as a frame of `frame_len` bytes (at least
/// `LEAP_CONTROL_FRAME_MIN`): the 0xC0DE marker, the packed message, zeros,
/// as the original pads to its packet size.
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `msg` is valid for reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_send_control(
    t: *mut leap_transport,
    msg: *const leap_control,
    frame_len: usize,
) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (n, msg) = unsafe { (node(t)?, arg(msg, "msg")?) };
        n.tx.control(n.rx.inner(), msg, frame_len)
    })
}

// ---------------------------------------------------------------------------
// Receiving
// ---------------------------------------------------------------------------

/// Receives the next frame from the previous node into `buf` (`cap` bytes)
/// and sets `*len` and, unless NULL, `*kind`. Waits at most the receive
/// timeout (`LEAP_ERR_TIMEOUT`); with timeout 0 it does not wait
/// (`LEAP_ERR_AGAIN`). `cap` must be at least `frame_size`
/// (`LEAP_ERR_TOO_LARGE` before anything is received), except for a frame
/// held by `leap_peek_prev`: that is the one received (copied out once).
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `buf` is valid for writes of `cap`
/// bytes; `len` (and `kind` unless NULL) valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_recv_prev(
    t: *mut leap_transport,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    kind: *mut leap_frame_kind,
) -> leap_status {
    guard(|| {
        need(len, "len")?;
        // SAFETY: the caller's promise.
        let (n, buf) = unsafe { (node(t)?, bytes_mut(buf, cap, "buf")?) };
        recv_into(&mut n.rx, buf, len, kind)
    })
}

fn recv_into<T: ?Sized + handle::Receives>(
    rx: &mut RecvSide<T>,
    buf: &mut [u8],
    len: *mut usize,
    kind: *mut leap_frame_kind,
) -> Result<()> {
    let (got, k) = rx.recv(buf)?;
    // SAFETY: `len` checked non-NULL by the caller; both valid for writes by
    // the C caller's promise.
    unsafe {
        *len = got;
        if let Some(kind) = kind.as_mut() {
            *kind = k.into();
        }
    }
    Ok(())
}

/// Receives the next frame and lends it: `*data` points to it where the
/// transport put it (its reassembly buffer, the module's receive bank), no
/// copy, until `leap_release`. Waits as `leap_recv_prev` does. While a
/// frame is lent, receiving again is `LEAP_ERR_STATE`; sending is fine.
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `data` and `len` (and `kind` unless
/// NULL) are valid for writes. `*data` is valid for `*len` bytes until
/// `leap_release` or `leap_close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_recv_prev_lent(
    t: *mut leap_transport,
    data: *mut *const c_void,
    len: *mut usize,
    kind: *mut leap_frame_kind,
) -> leap_status {
    guard(|| {
        need(data, "data")?;
        need(len, "len")?;
        // SAFETY: the caller's promise.
        let n = unsafe { node(t) }?;
        let v = n.rx.recv_lent()?;
        // SAFETY: the caller's promise.
        unsafe { put_view(v, data, len, kind) }
    })
}

/// Looks at the next frame without waiting and without taking it: if one
/// is complete it is held, `*data`/`*len`/`*kind` show it (as a lent frame,
/// no copy), and the next `leap_recv_prev` or `leap_recv_prev_lent` returns
/// that same frame (so a control check never consumes or reorders data
/// frames); `leap_release` drops it instead. Else `LEAP_ERR_AGAIN`.
/// Peeking again shows the same frame.
///
/// # Safety
///
/// As `leap_recv_prev_lent`; `*data` is valid until the frame is received
/// or released, or `leap_close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_peek_prev(
    t: *mut leap_transport,
    data: *mut *const c_void,
    len: *mut usize,
    kind: *mut leap_frame_kind,
) -> leap_status {
    guard(|| {
        need(data, "data")?;
        need(len, "len")?;
        // SAFETY: the caller's promise.
        let n = unsafe { node(t) }?;
        let v = n.rx.peek()?;
        // SAFETY: the caller's promise.
        unsafe { put_view(v, data, len, kind) }
    })
}

/// Gives back the frame lent by `leap_recv_prev_lent` (or held by
/// `leap_peek_prev`: it is dropped). Its pointer is invalid after.
/// `LEAP_ERR_STATE` when no frame is lent (a second release).
///
/// # Safety
///
/// `t` is a handle from `leap_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_release(t: *mut leap_transport) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        unsafe { node(t) }?.rx.release()
    })
}

/// Decodes a control frame (as received, `LEAP_FRAME_CONTROL`): the
/// marker, a valid message, zero padding. `LEAP_ERR_CONTROL` otherwise.
///
/// # Safety
///
/// `frame` is valid for reads of `len` bytes; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_decode_control(frame: *const c_void, len: usize, out: *mut leap_control) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (frame, out) = unsafe { (bytes(frame, len, "frame")?, self::out(out, "out")?) };
        let m = leap_common::control::ControlMessage::decode_frame(frame).map_err(|e| {
            Error::new(
                leap_status::LEAP_ERR_CONTROL,
                format_args!("not a control frame ({e:?}): a control frame starts with 0xC0DE, holds a valid message and zeros after it"),
            )
        })?;
        *out = leap_control::from_message(&m);
        Ok(())
    })
}

/// Sets the receive deadline in milliseconds: negative waits for ever, 0
/// does not wait at all (a receive takes what has arrived, else returns
/// `LEAP_ERR_AGAIN`: for event loops, with `leap_ready_fd`).
///
/// # Safety
///
/// `t` is a handle from `leap_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_set_recv_timeout(t: *mut leap_transport, timeout_ms: i64) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        unsafe { node(t) }?.rx.set_timeout(timeout_from_ms(timeout_ms));
        Ok(())
    })
}

/// Sets the length of the frames to come, after opening (the original
/// engine learns its frame size only after connecting): TCP with raw
/// framing reads frames of exactly `len` bytes from the next receive on;
/// the datagram transports and the module take frames of up to `len` bytes,
/// which must be within what they were opened for (`frame_size`; the
/// module's 131 072-byte bank). A receive buffer of `len` bytes is enough
/// from then on. `LEAP_ERR_SETTING` for 0 or a length beyond that.
///
/// # Safety
///
/// `t` is a handle from `leap_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_set_frame_len(t: *mut leap_transport, len: usize) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let n = unsafe { node(t) }?;
        n.rx.inner().set_frame_len(len)?;
        n.rx.set_frame_len(len);
        Ok(())
    })
}

/// A descriptor to poll for reading (owned by the transport: do not close
/// it): after a receive returned `LEAP_ERR_AGAIN` it becomes readable when
/// a receive may make progress (also for a frame the library already took
/// off the wire). It may wake with nothing to take: receive until
/// `LEAP_ERR_AGAIN`, then wait again. Receive with timeout 0 (or
/// `leap_peek_prev`) in an event loop.
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `fd` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_ready_fd(t: *mut leap_transport, fd: *mut c_int) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (n, fd) = unsafe { (node(t)?, out(fd, "fd")?) };
        *fd = n.rx.ready_fd()?;
        Ok(())
    })
}

/// The transport's counters.
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `stats` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_get_stats(t: *mut leap_transport, stats: *mut leap_stats) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (n, out) = unsafe { (node(t)?, out(stats, "stats")?) };
        let (s, copied) = n.rx.stats();
        *out = leap_stats::from_stats(&s, copied);
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Ring keys
// ---------------------------------------------------------------------------

/// A handle to change the ring keys of `t` while it runs (a key rotation,
/// see the README's "Keyed rings"), usable from any thread, also while
/// another thread waits in a receive, and after `leap_split` (take it
/// before). Free with `leap_keys_free`. `LEAP_ERR_UNSUPPORTED` when `t`
/// was opened without `key_file` (a ring becomes keyed only when its nodes
/// start keyed) or is a kmod transport.
///
/// # Safety
///
/// `t` is a handle from `leap_open` not yet freed; `out` is valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_key_control(t: *mut leap_transport, out: *mut *mut leap_keys) -> leap_status {
    guard(|| {
        need(out, "out")?;
        // SAFETY: the caller's promise.
        let t = unsafe { self::out(t, "transport") }?;
        let n = t.node.as_mut().ok_or(Error::fixed(LEAP_ERR_CLOSED, t.gone))?;
        let unkeyed = || Error::new(LEAP_ERR_UNSUPPORTED, KeyChangeError::Unkeyed);
        let running = t.keys.clone().ok_or_else(unkeyed)?;
        let control =
            n.rx.inner().key_control().ok_or_else(|| Error::new(LEAP_ERR_UNSUPPORTED, KeyChangeError::NotSupported))?;
        // SAFETY: checked non-NULL; the caller's promise.
        unsafe { *out = Box::into_raw(Box::new(leap_keys { control, running })) };
        Ok(())
    })
}

/// Gives the transport the key of `key_file` and, unless NULL, also takes
/// the key of `previous_key_file` (one step of a rotation: the new key
/// with the old as previous on every node, node by node; then the new key
/// alone). The files are checked as when opening (`LEAP_ERR_SETTING`
/// naming the file and the fix); on any error the keys in use stay.
/// `encrypt` stays as the transport was opened.
///
/// # Safety
///
/// `keys` is a handle from `leap_key_control` not yet freed; `key_file`
/// is a NUL-terminated string, `previous_key_file` NULL or one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_keys_set(
    keys: *const leap_keys,
    key_file: *const c_char,
    previous_key_file: *const c_char,
) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (k, current) = unsafe { (arg(keys, "keys")?, text(key_file, "key_file")?) };
        let previous = if previous_key_file.is_null() {
            None
        } else {
            // SAFETY: the caller's promise (NULL: no previous key).
            Some(unsafe { text(previous_key_file, "previous_key_file") }?)
        };
        let set = k
            .running
            .reread(std::path::Path::new(current), previous.map(std::path::Path::new))
            .map_err(|(which, e)| Error::new(LEAP_ERR_SETTING, format_args!("{which}: {e}")))?;
        k.control.set_keys(set).map_err(|e| Error::new(LEAP_ERR_SETTING, e))
    })
}

/// Frees a key handle (NULL is fine); the transport keeps the keys it has.
///
/// # Safety
///
/// `keys` is NULL or a handle from `leap_key_control`, not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_keys_free(keys: *mut leap_keys) {
    // SAFETY: the caller's promise (made by leap_key_control, given up).
    unsafe { free_handle(keys, drop) }
}

// ---------------------------------------------------------------------------
// Splitting, closing
// ---------------------------------------------------------------------------

/// Splits the transport into a sender and a receiver, to use from two
/// threads (receive frame N+1 while computing N and sending N-1). `t` is
/// closed by it (`LEAP_ERR_CLOSED`), still to be freed. `LEAP_ERR_STATE`
/// while a frame is lent or begun.
///
/// # Safety
///
/// `t` is a handle from `leap_open`; `sender` and `receiver` are valid for
/// writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_split(
    t: *mut leap_transport,
    sender: *mut *mut leap_sender,
    receiver: *mut *mut leap_receiver,
) -> leap_status {
    guard(|| {
        need(sender, "sender")?;
        need(receiver, "receiver")?;
        // SAFETY: the caller's promise.
        let t = unsafe { out(t, "transport") }?;
        let n = t.node.as_ref().ok_or(Error::fixed(LEAP_ERR_CLOSED, t.gone))?;
        if n.rx.holds() || n.tx.begun() {
            return Err(Error::fixed(
                LEAP_ERR_STATE,
                c"a frame is lent, peeked or begun: release or commit it before splitting",
            ));
        }
        let Node { rx, tx } = t.node.take().expect("checked");
        t.gone = SPLIT;
        let frame_len = rx.frame_len();
        let (whole, timeout, _) = rx.into_parts();
        let halves = whole.split()?;
        let s = Box::new(leap_sender { half: Some((halves.sender, tx)) });
        let r = Box::new(leap_receiver { half: Some(RecvSide::new(halves.receiver, timeout, frame_len)) });
        // SAFETY: checked non-NULL; the caller's promise.
        unsafe {
            *sender = Box::into_raw(s);
            *receiver = Box::into_raw(r);
        }
        Ok(())
    })
}

/// Closes the transport: a lent frame is given back, sockets, the XDP
/// program and the device are released. The handle stays valid (every call
/// returns `LEAP_ERR_CLOSED`) until `leap_free`.
///
/// # Safety
///
/// `t` is a handle from `leap_open` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_close(t: *mut leap_transport) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let t = unsafe { out(t, "transport") }?;
        let n = t.node.take().ok_or(Error::fixed(LEAP_ERR_CLOSED, t.gone))?;
        drop(n.rx.into_parts());
        Ok(())
    })
}

/// Frees the handle, closing it first if needed (NULL is fine).
///
/// # Safety
///
/// `t` is NULL or a handle from `leap_open`, not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_free(t: *mut leap_transport) {
    // SAFETY: the caller's promise (made by leap_open, given up). `Node`
    // drops the lent frame before the transport.
    unsafe {
        free_handle(t, |t| {
            if let Some(n) = t.node {
                drop(n.rx.into_parts());
            }
        });
    }
}

// ---------------------------------------------------------------------------
// The halves
// ---------------------------------------------------------------------------

/// As `leap_send_next`, on the sending half.
///
/// # Safety
///
/// As `leap_send_next`, with a sender from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_sender_send_next(s: *mut leap_sender, buf: *const c_void, len: usize) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let ((tx, st), frame) = unsafe { (sender(s)?, bytes(buf, len, "buf")?) };
        st.send(tx, frame, &[])
    })
}

/// As `leap_send_multipart_next`, on the sending half.
///
/// # Safety
///
/// As `leap_send_multipart_next`, with a sender from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_sender_send_multipart_next(
    s: *mut leap_sender,
    header: *const c_void,
    header_len: usize,
    payload: *const c_void,
    payload_len: usize,
) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let ((tx, st), h, p) =
            unsafe { (sender(s)?, bytes(header, header_len, "header")?, bytes(payload, payload_len, "payload")?) };
        st.send(tx, h, p)
    })
}

/// As `leap_send_begin`, on the sending half.
///
/// # Safety
///
/// As `leap_send_begin`, with a sender from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_sender_send_begin(s: *mut leap_sender, len: usize, buf: *mut *mut c_void) -> leap_status {
    guard(|| {
        need(buf, "buf")?;
        // SAFETY: the caller's promise.
        let (tx, st) = unsafe { sender(s) }?;
        let p = st.begin(tx, len)?;
        // SAFETY: checked non-NULL; the caller's promise.
        unsafe { *buf = p.cast() };
        Ok(())
    })
}

/// As `leap_send_commit`, on the sending half.
///
/// # Safety
///
/// As `leap_send_commit`, with a sender from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_sender_send_commit(s: *mut leap_sender) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (tx, st) = unsafe { sender(s) }?;
        st.commit(tx)
    })
}

/// As `leap_send_control`, on the sending half.
///
/// # Safety
///
/// As `leap_send_control`, with a sender from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_sender_send_control(
    s: *mut leap_sender,
    msg: *const leap_control,
    frame_len: usize,
) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let ((tx, st), msg) = unsafe { (sender(s)?, arg(msg, "msg")?) };
        st.control(tx, msg, frame_len)
    })
}

/// The transport's counters (both halves), from the sending half.
///
/// # Safety
///
/// `s` is a sender from `leap_split`; `stats` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_sender_get_stats(s: *mut leap_sender, stats: *mut leap_stats) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let ((tx, _), out) = unsafe { (sender(s)?, out(stats, "stats")?) };
        *out = leap_stats::from_stats(&tx.stats(), 0);
        Ok(())
    })
}

/// Frees the sending half (NULL is fine).
///
/// # Safety
///
/// `s` is NULL or a sender from `leap_split`, not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_sender_free(s: *mut leap_sender) {
    // SAFETY: the caller's promise (made by leap_split, given up).
    unsafe { free_handle(s, drop) }
}

/// As `leap_recv_prev`, on the receiving half.
///
/// # Safety
///
/// As `leap_recv_prev`, with a receiver from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_recv_prev(
    r: *mut leap_receiver,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    kind: *mut leap_frame_kind,
) -> leap_status {
    guard(|| {
        need(len, "len")?;
        // SAFETY: the caller's promise.
        let (rx, buf) = unsafe { (receiver(r)?, bytes_mut(buf, cap, "buf")?) };
        recv_into(rx, buf, len, kind)
    })
}

/// As `leap_recv_prev_lent`, on the receiving half.
///
/// # Safety
///
/// As `leap_recv_prev_lent`, with a receiver from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_recv_prev_lent(
    r: *mut leap_receiver,
    data: *mut *const c_void,
    len: *mut usize,
    kind: *mut leap_frame_kind,
) -> leap_status {
    guard(|| {
        need(data, "data")?;
        need(len, "len")?;
        // SAFETY: the caller's promise.
        let v = unsafe { receiver(r) }?.recv_lent()?;
        // SAFETY: the caller's promise.
        unsafe { put_view(v, data, len, kind) }
    })
}

/// As `leap_peek_prev`, on the receiving half.
///
/// # Safety
///
/// As `leap_peek_prev`, with a receiver from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_peek_prev(
    r: *mut leap_receiver,
    data: *mut *const c_void,
    len: *mut usize,
    kind: *mut leap_frame_kind,
) -> leap_status {
    guard(|| {
        need(data, "data")?;
        need(len, "len")?;
        // SAFETY: the caller's promise.
        let v = unsafe { receiver(r) }?.peek()?;
        // SAFETY: the caller's promise.
        unsafe { put_view(v, data, len, kind) }
    })
}

/// As `leap_release`, on the receiving half.
///
/// # Safety
///
/// `r` is a receiver from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_release(r: *mut leap_receiver) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        unsafe { receiver(r) }?.release()
    })
}

/// As `leap_set_recv_timeout`, on the receiving half.
///
/// # Safety
///
/// `r` is a receiver from `leap_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_set_recv_timeout(r: *mut leap_receiver, timeout_ms: i64) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        unsafe { receiver(r) }?.set_timeout(timeout_from_ms(timeout_ms));
        Ok(())
    })
}

/// As `leap_ready_fd`, on the receiving half.
///
/// # Safety
///
/// `r` is a receiver from `leap_split`; `fd` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_ready_fd(r: *mut leap_receiver, fd: *mut c_int) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (rx, fd) = unsafe { (receiver(r)?, out(fd, "fd")?) };
        *fd = rx.ready_fd()?;
        Ok(())
    })
}

/// The transport's counters (both halves), from the receiving half.
///
/// # Safety
///
/// `r` is a receiver from `leap_split`; `stats` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_get_stats(r: *mut leap_receiver, stats: *mut leap_stats) -> leap_status {
    guard(|| {
        // SAFETY: the caller's promise.
        let (rx, out) = unsafe { (receiver(r)?, out(stats, "stats")?) };
        let (s, copied) = rx.stats();
        *out = leap_stats::from_stats(&s, copied);
        Ok(())
    })
}

/// Frees the receiving half, giving back a lent frame (NULL is fine).
///
/// # Safety
///
/// `r` is NULL or a receiver from `leap_split`, not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn leap_receiver_free(r: *mut leap_receiver) {
    // SAFETY: the caller's promise (made by leap_split, given up).
    unsafe {
        free_handle(r, |r| {
            if let Some(side) = r.half {
                drop(side.into_parts());
            }
        });
    }
}
