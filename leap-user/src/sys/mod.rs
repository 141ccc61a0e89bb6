//! Wrappers around the system calls leap needs that std and socket2 do not
//! offer: nix's typed calls where it has them; raw `libc` with a `SAFETY`
//! note where it does not (`capset`, batched UDP I/O with GSO/GRO, busy-poll socket options, the
//! shared mapping of the kernel module, the XDP backend's interface ioctls
//! and AF_XDP memory). Everything above is safe code.

pub mod busy_poll;
pub mod kmod;
pub mod udp;
pub(crate) mod xdp;

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{Signal, kill};
use nix::sys::time::TimeVal;
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{Pid, geteuid};

/// CPU time (user, system) consumed by the calling thread so far.
pub fn thread_cpu_time() -> (Duration, Duration) {
    let Ok(ru) = getrusage(UsageWho::RUSAGE_THREAD) else { return Default::default() };
    let tv = |t: TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    (tv(ru.user_time()), tv(ru.system_time()))
}

/// Whether the process runs as root (effective uid 0).
pub fn is_root() -> bool {
    geteuid().is_root()
}

/// Sends SIGINT to process `pid` (a child we started); errors are ignored:
/// the child may have exited already.
pub fn interrupt(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
}

/// CLOCK_MONOTONIC in nanoseconds (the clock `perf record -k mono` stamps
/// samples with).
pub fn monotonic_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |ts| Duration::from(ts).as_nanos() as u64)
}

/// The CPUs this process may run on.
///
/// # Errors
///
/// `sched_getaffinity` failing.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect())
}

/// Checks that every CPU of `cpus` is one this process may run on.
///
/// # Errors
///
/// The first CPU that is not, with the ones that are.
pub fn check_cpus(cpus: &[usize]) -> io::Result<()> {
    let allowed = allowed_cpus()?;
    match cpus.iter().find(|c| !allowed.contains(c)) {
        None => Ok(()),
        Some(cpu) => {
            let list: Vec<String> = allowed.iter().map(ToString::to_string).collect();
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} is not available to this process (available: {})", list.join(",")),
            ))
        }
    }
}

/// Pins the calling thread to `cpus`.
///
/// # Errors
///
/// A CPU this process may not run on (see [`check_cpus`]), or
/// `sched_setaffinity` failing.
pub fn pin_thread(cpus: &[usize]) -> io::Result<()> {
    check_cpus(cpus)?;
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    // Pid 0: the calling thread.
    Ok(sched_setaffinity(Pid::from_raw(0), &set)?)
}

/// Waits until `out` can take bytes or `inp` (if any) has bytes to read;
/// returns (writable, readable). Errors and hang-ups count as ready, so
/// that the following call reports them.
///
/// # Errors
///
/// `poll` failing other than by a signal.
pub fn wait_writable_or_readable(out: BorrowedFd<'_>, inp: Option<BorrowedFd<'_>>) -> io::Result<(bool, bool)> {
    let mut fds = [PollFd::new(out, PollFlags::POLLOUT), PollFd::new(inp.unwrap_or(out), PollFlags::POLLIN)];
    let fds = &mut fds[..if inp.is_some() { 2 } else { 1 }];
    loop {
        match poll(fds, PollTimeout::NONE) {
            Ok(_) => break,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Unknown revents bits count as an event too.
    let ready = |p: &PollFd<'_>| p.any().unwrap_or(true);
    Ok((ready(&fds[0]), fds.get(1).is_some_and(ready)))
}

/// Capabilities `leap-user/packaging/leap-node@.service` grants, plus
/// `CAP_IPC_LOCK` standing in for its `LimitMEMLOCK=infinity` (a process
/// cannot raise its memlock limit without `CAP_SYS_RESOURCE`).
pub const UNIT_CAPS: &[u32] = &[
    12, // CAP_NET_ADMIN
    13, // CAP_NET_RAW
    14, // CAP_IPC_LOCK
    39, // CAP_BPF
];

/// Leaves the calling thread only the capabilities in `keep` (effective,
/// permitted and inheritable; other threads keep theirs), so that what it
/// does next runs as the packaged service would.
///
/// # Errors
///
/// `capset`, e.g. EPERM when asked to keep one it does not have.
pub fn restrict_thread_caps(keep: &[u32]) -> io::Result<()> {
    /// `struct __user_cap_header_struct`.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    /// `struct __user_cap_data_struct`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut mask = [0u32; 2];
    for &c in keep {
        mask[(c / 32) as usize % 2] |= 1 << (c % 32);
    }
    let hdr = Header { version: VERSION_3, pid: 0 };
    let data = [0, 1].map(|i| Data { effective: mask[i], permitted: mask[i], inheritable: mask[i] });
    // SAFETY: the header and the two data words are the layout capset(2)
    // takes for version 3; pid 0 is the calling thread; the kernel only
    // reads them.
    let r = unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_without_capabilities_cannot_open_a_raw_socket() {
        let denied = std::thread::spawn(|| {
            restrict_thread_caps(&[]).unwrap();
            let raw = socket2::Socket::new(socket2::Domain::PACKET, socket2::Type::RAW, None);
            raw.is_err_and(|e| e.raw_os_error() == Some(libc::EPERM))
        })
        .join()
        .unwrap();
        assert!(denied, "a raw socket was opened without CAP_NET_RAW");
    }
}
