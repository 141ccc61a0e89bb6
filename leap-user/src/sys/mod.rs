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
