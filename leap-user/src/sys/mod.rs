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

/// The CPUs this process may run on.
///
/// # Errors
///
/// `sched_getaffinity` failing.
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: all-zero is a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the size matches the set.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads inside the set for c < max.
    Ok((0..max).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Checks that every CPU of `cpus` is one this process may run on.
///
/// # Errors
///
/// The first CPU that is not, with the ones that are.
pub fn check_cpus(cpus: &[usize]) -> std::io::Result<()> {
    let allowed = allowed_cpus()?;
    match cpus.iter().find(|c| !allowed.contains(c)) {
        None => Ok(()),
        Some(cpu) => {
            let list: Vec<String> = allowed.iter().map(ToString::to_string).collect();
            Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
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
pub fn pin_thread(cpus: &[usize]) -> std::io::Result<()> {
    check_cpus(cpus)?;
    // SAFETY: all-zero is a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: check_cpus proved cpu < 8 * size_of::<cpu_set_t>().
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; the set is initialised.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until `out` can take bytes or `inp` (if any) has bytes to read;
/// returns (writable, readable). Errors and hang-ups count as ready, so
/// that the following call reports them.
///
/// # Errors
///
/// `poll` failing other than by a signal.
pub fn wait_writable_or_readable(
    out: std::os::fd::RawFd,
    inp: Option<std::os::fd::RawFd>,
) -> std::io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd { fd: out, events: libc::POLLOUT, revents: 0 },
        libc::pollfd { fd: inp.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: fds is a valid array of two pollfd (a negative fd is ignored).
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r >= 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok((fds[0].revents != 0, fds[1].revents != 0))
}

/// Capabilities `leap-user/packaging/leap-node@.service` grants, plus
/// `CAP_IPC_LOCK` standing in for its `LimitMEMLOCK=infinity` (a process
/// cannot raise its memlock limit without `CAP_SYS_RESOURCE`).
pub const UNIT_CAPS: &[u32] = &[
    12, // CAP_NET_ADMIN
    13, // CAP_NET_RAW
    14, // CAP_IPC_LOCK
    38, // CAP_PERFMON
    39, // CAP_BPF
];

/// Leaves the calling thread only the capabilities in `keep` (effective,
/// permitted and inheritable; other threads keep theirs), so that what it
/// does next runs as the packaged service would.
///
/// # Errors
///
/// `capget`/`capset`, e.g. EPERM when asked to keep one it does not have.
pub fn restrict_thread_caps(keep: &[u32]) -> std::io::Result<()> {
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
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_without_capabilities_cannot_open_a_raw_socket() {
        let denied = std::thread::spawn(|| {
            restrict_thread_caps(&[]).unwrap();
            // SAFETY: plain socket(2); the descriptor, if any, is closed.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
            if fd >= 0 {
                // SAFETY: our own descriptor.
                unsafe { libc::close(fd) };
                return false;
            }
            std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        })
        .join()
        .unwrap();
        assert!(denied, "a raw socket was opened without CAP_NET_RAW");
    }
}
