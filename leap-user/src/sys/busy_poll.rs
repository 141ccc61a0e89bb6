//! Busy-polling socket options (`SO_BUSY_POLL`, `SO_PREFER_BUSY_POLL`,
//! `SO_BUSY_POLL_BUDGET`, see `socket(7)` and the kernel's
//! `Documentation/networking/napi.rst`), for UDP and AF_XDP sockets alike.
//! Neither nix nor libc names them for Linux on every architecture, so the
//! numbers come from `include/uapi/asm-generic/socket.h` (also MIPS's;
//! SPARC has its own) and the calls go
//! through one small `setsockopt` wrapper.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SO_BUSY_POLL`: microseconds a blocking read (and `poll`) busy-polls the
/// device queue before sleeping.
#[cfg(not(target_arch = "sparc64"))]
const SO_BUSY_POLL: libc::c_int = 46;
/// `SO_PREFER_BUSY_POLL`: keep the device's interrupts off while user space
/// busy-polls (with `napi_defer_hard_irqs` and `gro_flush_timeout`).
#[cfg(not(target_arch = "sparc64"))]
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
/// `SO_BUSY_POLL_BUDGET`: packets one busy-poll round may take.
#[cfg(not(target_arch = "sparc64"))]
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;
#[cfg(target_arch = "sparc64")]
const SO_BUSY_POLL: libc::c_int = 0x30;
#[cfg(target_arch = "sparc64")]
const SO_PREFER_BUSY_POLL: libc::c_int = 0x48;
#[cfg(target_arch = "sparc64")]
const SO_BUSY_POLL_BUDGET: libc::c_int = 0x49;

/// Packets per busy-poll round when none is asked for (what the kernel's
/// `xdpsock` sample and NAPI's default weight use).
pub const DEFAULT_BUDGET: u16 = 64;

/// A busy-poll option the kernel refused.
#[derive(Debug, thiserror::Error)]
#[error("setsockopt({option}): {source}")]
pub struct BusyPollError {
    /// The option.
    pub option: &'static str,
    /// What the kernel said (`EPERM`: the caller lacks `CAP_NET_ADMIN`).
    #[source]
    pub source: io::Error,
}

impl BusyPollError {
    /// Whether the kernel refused for lack of `CAP_NET_ADMIN`.
    pub fn is_permission(&self) -> bool {
        self.source.raw_os_error() == Some(libc::EPERM)
    }
}

/// Turns busy polling on for `fd`: `SO_PREFER_BUSY_POLL` 1, `SO_BUSY_POLL`
/// `usecs`, `SO_BUSY_POLL_BUDGET` `budget`.
///
/// # Errors
///
/// The first option refused; raising any of them needs `CAP_NET_ADMIN`
/// (`EPERM` without it, see [`BusyPollError::is_permission`]).
pub fn enable(fd: BorrowedFd<'_>, usecs: u32, budget: u16) -> Result<(), BusyPollError> {
    let usecs = libc::c_int::try_from(usecs).unwrap_or(libc::c_int::MAX);
    set_int(fd, SO_BUSY_POLL, usecs).map_err(|source| BusyPollError { option: "SO_BUSY_POLL", source })?;
    set_int(fd, SO_PREFER_BUSY_POLL, 1).map_err(|source| BusyPollError { option: "SO_PREFER_BUSY_POLL", source })?;
    set_int(fd, SO_BUSY_POLL_BUDGET, budget.into())
        .map_err(|source| BusyPollError { option: "SO_BUSY_POLL_BUDGET", source })
}

/// `SO_BUSY_POLL` as the kernel holds it for `fd` (microseconds).
///
/// # Errors
///
/// The `getsockopt` error.
pub fn busy_poll_usecs(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut val: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a live descriptor for the call; `val` and `len` are
    // valid for writes of an int and its length, which is all the kernel
    // writes for this option.
    let r = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, SO_BUSY_POLL, (&raw mut val).cast(), &raw mut len)
    };
    if r == 0 { Ok(val.max(0) as u32) } else { Err(io::Error::last_os_error()) }
}

fn set_int(fd: BorrowedFd<'_>, option: libc::c_int, val: libc::c_int) -> io::Result<()> {
    // SAFETY: `fd` is a live descriptor for the call; the kernel reads one
    // int of the given length from `val`, which outlives the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&raw const val).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn busy_poll_is_set_or_refused_for_lack_of_cap_net_admin() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        match enable(s.as_fd(), 50, DEFAULT_BUDGET) {
            Ok(()) => assert_eq!(busy_poll_usecs(s.as_fd()).unwrap(), 50),
            Err(e) => assert!(e.is_permission(), "{e}"),
        }
    }
}
