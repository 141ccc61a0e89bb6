//! Entering a network namespace from the current thread.

use std::fs::File;
use std::io;
use std::path::Path;

use nix::sched::{CloneFlags, setns};

/// Moves the calling thread into the network namespace at `path` (e.g.
/// `/run/netns/NAME`). Sockets created afterwards by this thread live there.
///
/// # Errors
///
/// Opening the file or `setns` (needs CAP_SYS_ADMIN).
pub fn enter(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    Ok(setns(f, CloneFlags::CLONE_NEWNET)?)
}
