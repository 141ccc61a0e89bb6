//! A readiness descriptor for event loops ([`super::Transport::ready_fd`]):
//! an epoll set of a transport's receive descriptors plus an eventfd that the
//! transport sets while it holds, in user space, something a receive can
//! deliver (a frame its driver thread completed, bytes a stuck send took off
//! the stream) and clears when a receive begins. The socket alone would not
//! do: what the library already took off it leaves it unreadable.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Mutex, PoisonError};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// The epoll set and the eventfd of one transport's receive side.
#[derive(Debug)]
pub struct Readiness {
    epoll: Epoll,
    event: EventFd,
    /// Whether the eventfd holds a count (so that setting and clearing each
    /// cost a system call only when the state changes).
    set: Mutex<bool>,
    /// Descriptors the set must keep open (duplicates, nested epoll sets).
    _owned: Vec<std::os::fd::OwnedFd>,
}

impl Readiness {
    /// A set watching `fds` (borrowed: they must stay open as long as they
    /// are in the set, or be removed first) and `owned` (kept open by the
    /// set) for input, and the eventfd.
    ///
    /// # Errors
    ///
    /// `epoll_create1`, `eventfd` or `epoll_ctl` failed.
    pub fn new<'a>(
        fds: impl IntoIterator<Item = BorrowedFd<'a>>,
        owned: Vec<std::os::fd::OwnedFd>,
    ) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let event = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        epoll.add(event.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))?;
        let r = Self { epoll, event, set: Mutex::new(false), _owned: owned };
        for fd in fds {
            r.add(fd)?;
        }
        for fd in &r._owned {
            r.add(fd.as_fd())?;
        }
        Ok(r)
    }

    /// The descriptor to wait on: readable when a receive may make progress.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    /// Watches `fd` for input too.
    ///
    /// # Errors
    ///
    /// `epoll_ctl` failed.
    pub fn add(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, 1))?;
        Ok(())
    }

    /// Stops watching `fd` (before it is closed or replaced).
    pub fn remove(&self, fd: BorrowedFd<'_>) {
        // ENOENT (never added) is fine: the set is what we want either way.
        let _ = self.epoll.delete(fd);
    }

    /// Makes the descriptor readable: something is there to deliver.
    pub fn signal(&self) {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        if !*set {
            // Cannot fail short of a counter at u64::MAX - 1: one write per
            // clear keeps it at most 1.
            let _ = self.event.write(1);
            *set = true;
        }
    }

    /// Takes the eventfd's readiness back (a receive begins: it will find
    /// what was signalled, or say that nothing is there).
    pub fn clear(&self) {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        if *set {
            let _ = self.event.read();
            *set = false;
        }
    }

    /// Sets or clears, as `deliverable` says.
    pub fn update(&self, deliverable: bool) {
        if deliverable { self.signal() } else { self.clear() }
    }
}

/// Whether `fd` is readable right now (a `poll` with no timeout).
///
/// # Errors
///
/// The `poll` error.
pub fn readable_now(fd: BorrowedFd<'_>) -> io::Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eventfd_makes_the_set_readable_until_cleared() {
        let r = Readiness::new([], Vec::new()).unwrap();
        assert!(!readable_now(r.fd()).unwrap());
        r.signal();
        r.signal();
        assert!(readable_now(r.fd()).unwrap());
        r.clear();
        assert!(!readable_now(r.fd()).unwrap(), "one clear undoes any number of signals");
        r.clear();
        r.update(true);
        assert!(readable_now(r.fd()).unwrap());
        r.update(false);
        assert!(!readable_now(r.fd()).unwrap());
    }

    #[test]
    fn a_watched_socket_makes_the_set_readable() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = Readiness::new([a.as_fd()], Vec::new()).unwrap();
        assert!(!readable_now(r.fd()).unwrap());
        b.send_to(b"x", a.local_addr().unwrap()).unwrap();
        let start = std::time::Instant::now();
        while !readable_now(r.fd()).unwrap() {
            assert!(start.elapsed() < std::time::Duration::from_secs(2), "datagram never showed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        r.remove(a.as_fd());
        assert!(!readable_now(r.fd()).unwrap(), "removed");
    }
}
