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
    /// A frame begun with `send_next_with` (the `with` form) is not
    /// committed yet.
    Begun,
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

/// Where a begun frame is written: valid until [`Lender::finish`], which
/// the caller does only once nothing writes it any more.
#[derive(Clone, Copy, Debug)]
pub struct BegunBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an address and a length; the memory is the `Lender`'s (`Send`),
// written only by Python through buffers of the one `SendBuffer` that owns
// this address, never by Rust until `finish`.
unsafe impl Send for BegunBytes {}

impl BegunBytes {
    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The frame's length.
    pub fn len(&self) -> usize {
        self.len
    }
}

/// A transport (or the receiving half of one) that may have lent a frame.
///
/// `T` is `dyn Transport` or `dyn FrameReceiver`, owned through a pointer
/// from [`Box::leak`] rather than a `Box`, so that no move of the owner
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
    /// A frame to send was begun in the transport's memory and is written
    /// by Python: nothing touches the transport until [`Self::finish`].
    begun: bool,
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
            .field("begun", &self.begun)
            .finish()
    }
}

impl<T: ?Sized + 'static> Lender<T> {
    /// Owns `owner`.
    pub fn new(owner: Box<T>) -> Self {
        Self { owner: Some(NonNull::from(Box::leak(owner))), lent: None, closing: false, pinned: false, begun: false }
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
        if self.begun {
            return Err(Busy::Begun);
        }
        // SAFETY: `owner` came from `Box::leak` and is not freed while
        // it is `Some`; no frame borrows from it and no begun frame is
        // written (both checked above), and the returned borrow is tied to
        // `&mut self`, so it is the only reference to `*owner` while it
        // lives.
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
        if self.begun {
            return Err(Ok(Busy::Begun));
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

    /// Begins a frame to send: `begin` returns the memory to write it in,
    /// in the transport, which Python writes until [`Self::finish`];
    /// meanwhile every other use of the transport is refused.
    ///
    /// # Errors
    ///
    /// `Err(Ok(busy))` when the transport cannot be used, `Err(Err(e))`
    /// what `begin` reported.
    pub fn begin<F>(&mut self, begin: F) -> std::result::Result<BegunBytes, std::result::Result<Busy, TransportError>>
    where
        F: FnOnce(&mut T) -> Result<&mut [u8]>,
    {
        let t = self.get().map_err(Ok)?;
        let buf = begin(t).map_err(Err)?;
        let mem = BegunBytes { ptr: NonNull::from(&mut *buf).cast::<u8>(), len: buf.len() };
        // The borrow of the transport ends here; the memory stays the
        // transport's, written by Python through the address until
        // `finish` (no reference to `*owner` is made meanwhile: `begun`).
        self.begun = true;
        Ok(mem)
    }

    /// Ends a frame begun with [`Self::begin`]: `end` commits it (or does
    /// nothing, to leave it for the library to discard at the next send).
    /// The caller makes sure nothing writes the memory any more. Closes
    /// the transport if that was asked meanwhile.
    ///
    /// # Errors
    ///
    /// What `end` reported; [`Busy::Closed`] if closed meanwhile (the
    /// frame is not sent).
    pub fn finish<F>(&mut self, end: F) -> std::result::Result<(), std::result::Result<Busy, TransportError>>
    where
        F: FnOnce(&mut T) -> Result<()>,
    {
        if !std::mem::take(&mut self.begun) {
            return Ok(());
        }
        if self.closing {
            self.drop_owner();
            return Err(Ok(Busy::Closed));
        }
        end(self.get().map_err(Ok)?).map_err(Err)
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
        if self.lent.is_some() || self.begun {
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
        // SAFETY: `owner` came from `Box::leak` and is
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
        // SAFETY: `owner` came from `Box::leak` and is
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
