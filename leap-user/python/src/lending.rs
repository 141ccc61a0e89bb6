//! A transport and the frame it lends, kept together so that Python can hold
//! a lent frame across calls: Rust's `Lent<'_>` borrows the transport, a
//! Python object cannot carry that borrow, so its lifetime is erased here,
//! in this one module, and the rules that make that sound are kept here
//! too: while a frame is lent nothing touches the transport, and the
//! transport is freed only after the frame is given back.

use std::ptr::NonNull;

use leap::transport::{FrameKind, Lent, Result, TransportError};

/// Why the transport cannot be used right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// A frame it lent has not been given back.
    Lent,
    /// It was closed (or split into halves).
    Closed,
}

/// Where a lent frame's bytes are: valid until the frame is given back with
/// [`Lender::give_back`], which the caller does only once nothing reads them
/// any more.
#[derive(Clone, Copy, Debug)]
pub struct LentBytes {
    ptr: NonNull<u8>,
    len: usize,
    kind: FrameKind,
}

// SAFETY: a `LentBytes` is an address and a length, read-only; the memory
// behind it belongs to the `Lender`, which is `Send`, and is only read
// (never written) through it, so sharing the address between threads is
// as safe as sharing `&[u8]`.
unsafe impl Send for LentBytes {}
// SAFETY: as above: only reads happen through it.
unsafe impl Sync for LentBytes {}

impl LentBytes {
    /// The first byte.
    pub fn ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The frame's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Data or control.
    pub fn kind(&self) -> FrameKind {
        self.kind
    }
}

/// A transport (or the receiving half of one) that may have lent a frame.
///
/// `T` is `dyn Transport` or `dyn FrameReceiver`, owned through a pointer
/// from [`Box::into_raw`] rather than a `Box`, so that no move of the owner
/// asserts unique access while the frame still borrows from it.
pub struct Lender<T: ?Sized + 'static> {
    /// The transport; `None` once closed or taken. Freed only in
    /// [`Self::drop_owner`].
    owner: Option<NonNull<T>>,
    /// The frame it lent, borrowing from `*owner` (not really `'static`:
    /// until it is dropped in [`Self::give_back`] or [`Drop`], before
    /// `owner` is freed).
    lent: Option<Lent<'static>>,
    /// Closing was asked while a frame was lent: close once it is back.
    closing: bool,
    /// Memory of the transport may still be written through a view that
    /// outlived `send_next_with`'s fill: never free it.
    pinned: bool,
}

// SAFETY: the Lender owns `*owner` (like a `Box<T>`, and `T: Send`), and
// `Lent` holds shared references into it and a `&dyn Release` (`Release:
// Sync`), both `Send`; moving all of it to another thread together is as a
// `Box<T>` with a borrow of it moved together.
unsafe impl<T: ?Sized + Send + 'static> Send for Lender<T> {}

impl<T: ?Sized + 'static> std::fmt::Debug for Lender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lender")
            .field("open", &self.owner.is_some())
            .field("lent", &self.lent)
            .field("closing", &self.closing)
            .field("pinned", &self.pinned)
            .finish()
    }
}

impl<T: ?Sized + 'static> Lender<T> {
    /// Owns `owner`.
    pub fn new(owner: Box<T>) -> Self {
        Self { owner: Some(NonNull::from(Box::leak(owner))), lent: None, closing: false, pinned: false }
    }

    /// Whether a frame is lent.
    pub fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    /// The transport, for a call that does not lend.
    ///
    /// # Errors
    ///
    /// [`Busy::Lent`] while a frame is lent, [`Busy::Closed`] once closed.
    pub fn get(&mut self) -> std::result::Result<&mut T, Busy> {
        let owner = self.owner.filter(|_| !self.closing).ok_or(Busy::Closed)?;
        if self.lent.is_some() {
            return Err(Busy::Lent);
        }
        // SAFETY: `owner` came from `Box::into_raw` and is not freed while
        // it is `Some`; no frame borrows from it (checked above), and the
        // returned borrow is tied to `&mut self`, so it is the only
        // reference to `*owner` while it lives.
        Ok(unsafe { &mut *owner.as_ptr() })
    }

    /// Lends a frame: `recv` receives it from the transport (blocking or
    /// not) and the Lender keeps it until [`Self::give_back`]. `Ok(None)`
    /// when `recv` had nothing (a non-blocking receive).
    ///
    /// # Errors
    ///
    /// `Err(Ok(busy))` when the transport cannot be used, `Err(Err(e))`
    /// what `recv` reported.
    pub fn lend<F>(
        &mut self,
        recv: F,
    ) -> std::result::Result<Option<LentBytes>, std::result::Result<Busy, TransportError>>
    where
        F: for<'a> FnOnce(&'a mut T) -> Result<Option<Lent<'a>>>,
    {
        let owner = self.owner.filter(|_| !self.closing).ok_or(Ok(Busy::Closed))?;
        if self.lent.is_some() {
            return Err(Ok(Busy::Lent));
        }
        // SAFETY: as in `get`: `*owner` is alive and nothing else refers to
        // it. The borrow is made `'static` so that the frame can be kept in
        // `self.lent`; it really lasts until that frame is dropped, and
        // until then no other reference to `*owner` is made (`get`, `lend`
        // and `take` refuse while `lent` is `Some`) and `*owner` is not
        // freed (`drop_owner` and `Drop` drop `lent` first).
        let transport: &'static mut T = unsafe { &mut *owner.as_ptr() };
        let Some(frame) = recv(transport).map_err(Err)? else { return Ok(None) };
        let bytes = LentBytes { ptr: NonNull::from(frame.bytes()).cast(), len: frame.len(), kind: frame.kind() };
        self.lent = Some(frame);
        Ok(Some(bytes))
    }

    /// Gives the lent frame back to the transport (the kernel module's
    /// receive bank is released here); closes the transport if that was
    /// asked meanwhile. The caller makes sure nothing reads the frame's
    /// bytes any more. Nothing happens when no frame is lent.
    pub fn give_back(&mut self) {
        if self.lent.take().is_some() && self.closing {
            self.drop_owner();
        }
    }

    /// Closes the transport: at once, or when the lent frame is given back.
    /// Returns whether it was open.
    pub fn close(&mut self) -> bool {
        if self.owner.is_none() || self.closing {
            return false;
        }
        if self.lent.is_some() {
            self.closing = true;
        } else {
            self.drop_owner();
        }
        true
    }

    /// Whether [`Self::close`] was called (the transport may still wait for
    /// its lent frame).
    pub fn is_closed(&self) -> bool {
        self.owner.is_none() || self.closing
    }

    /// Takes the transport out (to split it); the Lender is closed after.
    ///
    /// # Errors
    ///
    /// As [`Self::get`].
    pub fn take(&mut self) -> std::result::Result<Box<T>, Busy> {
        self.get()?;
        let owner = self.owner.take().ok_or(Busy::Closed)?;
        // SAFETY: `owner` came from `Box::into_raw` (`Box::leak`) and is
        // taken out of `self`, so it is turned back into a Box once; no
        // frame borrows from it (`get` checked).
        Ok(unsafe { Box::from_raw(owner.as_ptr()) })
    }

    /// Never frees the transport (it is leaked when closed): Python may
    /// still hold a view of its memory.
    pub fn pin(&mut self) {
        self.pinned = true;
    }

    fn drop_owner(&mut self) {
        debug_assert!(self.lent.is_none(), "a transport freed under its lent frame");
        let Some(owner) = self.owner.take() else { return };
        if self.pinned {
            // Leaked, sockets and threads with it: the misuse it answers
            // was reported (BufferError) when it happened.
            return;
        }
        // SAFETY: `owner` came from `Box::into_raw` (`Box::leak`) and is
        // taken out of `self`, so it is freed once; no frame borrows from
        // it (every caller dropped `lent` first).
        drop(unsafe { Box::from_raw(owner.as_ptr()) });
    }
}

impl<T: ?Sized + 'static> Drop for Lender<T> {
    fn drop(&mut self) {
        // The frame first: it borrows from the transport.
        self.lent = None;
        self.drop_owner();
    }
}
