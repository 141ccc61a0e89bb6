//! Openers without the host's `CAP_NET_ADMIN`, for `kmod_vm`'s privilege
//! tests: a forked child that becomes uid and gid [`MEMBER`] (in the
//! device's group, no capability), optionally in a user and network
//! namespace of its own (what `unshare -Urn` makes), runs one operation on
//! the device and reports two bytes through a pipe. It then keeps whatever
//! it opened until the parent lets it go.
//!
//! Between `fork` and `_exit` the child only makes system calls on stack
//! data (the test process has other threads, so it must not allocate).

use std::fs::{self, File, Permissions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;

use leap_common::kmod::{DEVICE_PATH, INFO_SCOPE_FILE, INFO_SCOPE_MODULE, IOCTL_GET_INFO, Info};

/// uid and gid of the group member; the device's group while [`DeviceAccess`] lives.
pub const MEMBER: u32 = 1000;

/// The module parameter that lets a user namespace's `CAP_NET_ADMIN` open.
const ALLOW_USERNS: &str = "/sys/module/leap_kmod/parameters/allow_userns";

/// While alive: the device is `root:MEMBER 0660` (as the packaged udev rule
/// makes it for group `leap`) and `allow_userns` has the value asked for.
/// Dropping restores `root:root 0600` and the parameter's value before.
pub struct DeviceAccess {
    allow_before: String,
}

impl DeviceAccess {
    pub fn new(allow_userns: bool) -> Self {
        let allow_before = fs::read_to_string(ALLOW_USERNS).expect("read allow_userns").trim().to_string();
        fs::write(ALLOW_USERNS, if allow_userns { "1" } else { "0" }).expect("write allow_userns");
        std::os::unix::fs::chown(DEVICE_PATH, Some(0), Some(MEMBER)).expect("chown the device");
        fs::set_permissions(DEVICE_PATH, Permissions::from_mode(0o660)).expect("chmod the device");
        Self { allow_before }
    }
}

impl Drop for DeviceAccess {
    fn drop(&mut self) {
        let _ = fs::set_permissions(DEVICE_PATH, Permissions::from_mode(0o600));
        let _ = std::os::unix::fs::chown(DEVICE_PATH, Some(0), Some(0));
        let _ = fs::write(ALLOW_USERNS, if self.allow_before == "Y" { "1" } else { "0" });
    }
}

/// Where the child runs its operation.
#[derive(Clone, Copy, Debug)]
pub enum Place {
    /// A user and a network namespace of its own, root mapped to [`MEMBER`]
    /// (`unshare -Urn`): full capabilities there, none on the host.
    OwnUserns,
    /// The parent's namespaces, no capability at all.
    Here,
}

/// First byte of a report when the child failed before its operation:
/// this plus the step (1: groups, 2: uid, 3: namespaces, 4: open); the
/// second byte is errno.
const SETUP_FAILED: u8 = 0xf0;

/// A child process acting as the group member; it exits when dropped.
pub struct Member {
    pid: libc::pid_t,
    report: File,
    release: Option<File>,
}

impl Member {
    /// Forks the member: it enters `place` and runs `op(fd)`, where `fd` is
    /// a descriptor the parent opened and the child inherited (or -1).
    pub fn spawn(place: Place, inherited: RawFd, op: fn(RawFd) -> [u8; 2]) -> Self {
        let (report_r, report_w) = pipe();
        let (release_r, release_w) = pipe();
        // SAFETY: the child runs only `child_main`, which makes system calls
        // on stack data and ends in `_exit`; it never returns into the test.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            drop(report_r);
            drop(release_w);
            child_main(place, inherited, op, report_w.as_raw_fd(), release_r.as_raw_fd());
        }
        drop(report_w);
        drop(release_r);
        Self { pid, report: File::from(report_r), release: Some(File::from(release_w)) }
    }

    /// The two bytes `op` reported (the child still holds what it opened).
    pub fn report(&mut self) -> [u8; 2] {
        let mut b = [0u8; 2];
        self.report.read_exact(&mut b).expect("the member reported nothing");
        assert!(b[0] < SETUP_FAILED, "the member failed at step {} with errno {}", b[0] - SETUP_FAILED, b[1]);
        b
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut r) = self.release.take() {
            let _ = r.write_all(b"x");
        }
        let mut status = 0;
        // SAFETY: our own child; `status` is a live int.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a live array of two ints.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn errno() -> u8 {
    // SAFETY: errno of the calling thread.
    (unsafe { *libc::__errno_location() }) as u8
}

/// Writes `text` to the file at `path` (a NUL-terminated literal).
fn write_file(path: &std::ffi::CStr, text: &[u8]) -> bool {
    // SAFETY: a NUL-terminated path; the descriptor is ours and closed here.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let ok = libc::write(fd, text.as_ptr().cast(), text.len()) == text.len() as isize;
        libc::close(fd);
        ok
    }
}

/// Becomes the member in `place`; on failure returns the step (1-3) and errno.
fn become_member(place: Place) -> Result<(), (u8, u8)> {
    let id = MEMBER;
    // SAFETY: plain system calls on stack data in a single-threaded child.
    unsafe {
        if libc::setgroups(1, &id) != 0 {
            return Err((1, errno()));
        }
        if libc::setresgid(id, id, id) != 0 {
            return Err((1, errno()));
        }
        // From uid 0 to a non-zero uid: every capability is dropped.
        if libc::setresuid(id, id, id) != 0 {
            return Err((2, errno()));
        }
        // Changing uid made the process undumpable, which leaves its
        // /proc/self files root's: the maps below could not be written.
        if libc::prctl(libc::PR_SET_DUMPABLE, 1) != 0 {
            return Err((2, errno()));
        }
    }
    if let Place::OwnUserns = place {
        // SAFETY: as above.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } != 0 {
            return Err((3, errno()));
        }
        if !write_file(c"/proc/self/setgroups", b"deny") {
            return Err((3, errno()));
        }
        if !write_file(c"/proc/self/uid_map", b"0 1000 1") || !write_file(c"/proc/self/gid_map", b"0 1000 1") {
            return Err((3, errno()));
        }
    }
    Ok(())
}

fn child_main(place: Place, inherited: RawFd, op: fn(RawFd) -> [u8; 2], report: RawFd, release: RawFd) -> ! {
    let out = match become_member(place) {
        Ok(()) => op(inherited),
        Err((step, e)) => [SETUP_FAILED + step, e],
    };
    let mut b = [0u8; 1];
    // SAFETY: our pipe ends; `out` and `b` are live stack buffers; `_exit`
    // ends the child without running the test process's destructors.
    unsafe {
        libc::write(report, out.as_ptr().cast(), out.len());
        libc::read(release, b.as_mut_ptr().cast(), 1);
        libc::_exit(0)
    }
}

/// Opens the device without closing it; the descriptor or errno.
fn open_device() -> Result<RawFd, u8> {
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c"/dev/leap_tensor".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 { Err(errno()) } else { Ok(fd) }
}

/// `[files opened, errno of the refusal]`: opens until the module refuses
/// (at most 64), keeping every file open.
pub fn open_until_refused(_: RawFd) -> [u8; 2] {
    let mut n = 0u8;
    loop {
        match open_device() {
            Ok(_) if n < 64 => n += 1,
            Ok(_) => return [n, 0],
            Err(e) => return [n, e],
        }
    }
}

/// GET_INFO with `scope` on `fd`: 0 or errno.
fn get_info(fd: RawFd, scope: u32) -> u8 {
    let mut info = Info { scope, ..Info::default() };
    // SAFETY: `info` is a live `Info`, the type GET_INFO encodes; a wrong
    // descriptor only makes the call fail.
    let r = unsafe { libc::ioctl(fd, IOCTL_GET_INFO.into(), &mut info) };
    if r == 0 { 0 } else { errno() }
}

/// `[errno of file scope, errno of module scope]` (0: answered), on a file
/// the child opens itself.
pub fn info_scopes_own_file(_: RawFd) -> [u8; 2] {
    match open_device() {
        Ok(fd) => [get_info(fd, INFO_SCOPE_FILE), get_info(fd, INFO_SCOPE_MODULE)],
        Err(e) => [SETUP_FAILED + 4, e],
    }
}

/// As [`info_scopes_own_file`], on the descriptor the parent opened.
pub fn info_scopes_inherited(fd: RawFd) -> [u8; 2] {
    [get_info(fd, INFO_SCOPE_FILE), get_info(fd, INFO_SCOPE_MODULE)]
}
