//! The benchmark threads' scheduling: round-robin real-time, so that other
//! work on the machine (builds, other users' processes) does not take the
//! CPU from a ring in the middle of a round trip.
//!
//! Nice values do not do this: with `sched_autogroup` (the default on most
//! distributions) a thread's nice weighs only against its own session, and
//! every other session's processes still get their fair share of the CPU
//! the ring is pinned to. Real-time threads are not grouped that way.

use std::io;

/// How the benchmark's threads are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sched {
    /// `SCHED_RR` at the lowest real-time priority (needs CAP_SYS_NICE).
    Rr,
    /// The normal time-sharing scheduler, shared with everything else.
    Normal,
}

impl Sched {
    /// Name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rr => "rr",
            Self::Normal => "normal",
        }
    }
}

/// Schedules the calling thread, and the threads it starts from now on
/// (they inherit the policy), as `sched` says.
///
/// # Errors
///
/// `sched_setscheduler`'s: `EPERM` without CAP_SYS_NICE.
pub fn apply(sched: Sched) -> io::Result<()> {
    let (policy, priority) = match sched {
        Sched::Rr => (libc::SCHED_RR, 1),
        Sched::Normal => (libc::SCHED_OTHER, 0),
    };
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: `param` is a valid, initialised sched_param that outlives the
    // call; pid 0 names the calling thread.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
