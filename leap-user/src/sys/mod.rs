//! Thin, unsafe-containing wrappers around the system calls leap needs that
//! std and socket2 do not offer (batched UDP I/O with GSO/GRO). Everything
//! above this module is safe code.

pub mod kmod;
pub mod netns;
pub mod udp;

/// CPU time (user, system) consumed by the calling thread so far.
pub fn thread_cpu_time() -> (std::time::Duration, std::time::Duration) {
    // SAFETY: all-zero is a valid rusage; getrusage writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid pointer cannot fault.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if r != 0 {
        return Default::default();
    }
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Whether the process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Sends SIGINT to process `pid` (a child we started); errors are ignored:
/// the child may have exited already.
pub fn interrupt(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill has no memory effects; a stale pid only makes it fail.
    unsafe { libc::kill(pid, libc::SIGINT) };
}

/// CLOCK_MONOTONIC in nanoseconds (the clock `perf record -k mono` stamps
/// samples with).
pub fn monotonic_ns() -> u64 {
    // SAFETY: all-zero is a valid timespec; clock_gettime writes into it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: CLOCK_MONOTONIC with a valid pointer cannot fault.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
