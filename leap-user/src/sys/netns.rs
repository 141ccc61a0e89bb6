//! Entering a network namespace from the current thread.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Moves the calling thread into the network namespace at `path` (e.g.
/// `/run/netns/NAME`). Sockets created afterwards by this thread live there.
///
/// # Errors
///
/// Opening the file or `setns` (needs CAP_SYS_ADMIN).
pub fn enter(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: `f` is an open namespace file; setns only changes this
    // thread's namespace and does not touch memory.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}
