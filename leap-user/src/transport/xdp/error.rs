//! [`XdpError`]: everything that can go wrong loading, attaching and using
//! the XDP program and its AF_XDP sockets.

use std::io;
use std::path::PathBuf;

use super::program::AttachMode;

/// Errors of the XDP backend and of `leap xdp`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XdpError {
    /// This build carries no XDP object and none was given.
    #[error(
        "this leap was built without the XDP object: build it with `cargo xtask build`, \
         or pass --xdp-object PATH (from `cargo xtask build-ebpf`)"
    )]
    NoObject,
    /// The object file could not be read.
    #[error("cannot read the XDP object {path}: {source}")]
    ReadObject {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// aya could not parse the object or create its maps.
    #[error("cannot load the XDP object: {0}")]
    Load(#[source] aya::EbpfError),
    /// The object lacks a program or map leap needs (wrong or stale object).
    #[error("the XDP object has no {0}; rebuild it with `cargo xtask build-ebpf`")]
    Missing(&'static str),
    /// The kernel rejected the program (the verifier log is in the source).
    #[error("the kernel rejected the XDP program: {0}")]
    Program(#[source] aya::programs::ProgramError),
    /// A map operation failed.
    #[error("map {map}: {source}")]
    Map {
        /// The map.
        map: &'static str,
        /// What aya said.
        #[source]
        source: aya::maps::MapError,
    },
    /// No such network interface.
    #[error("no network interface named {0:?}")]
    NoInterface(String),
    /// Attaching failed in the mode asked for.
    #[error("cannot attach the XDP program to {iface} in {mode} mode: {source}")]
    Attach {
        /// The interface.
        iface: String,
        /// The mode tried last.
        mode: AttachMode,
        /// What the kernel said.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// Something is attached already (by `leap xdp attach` or another tool).
    #[error("an XDP program is already attached to {iface}{hint}")]
    Busy {
        /// The interface.
        iface: String,
        /// How to free it.
        hint: &'static str,
    },
    /// Pinning or unpinning under the BPF file system failed.
    #[error("pin {path}: {source}")]
    Pin {
        /// The bpffs path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Nothing pinned by leap at that path.
    #[error("leap has nothing attached to {iface} (no {path})")]
    NotAttached {
        /// The interface.
        iface: String,
        /// Where the pins would be.
        path: PathBuf,
    },
    /// A system call failed (an AF_XDP socket's steps: `on` names the
    /// interface and queue).
    #[error(transparent)]
    Syscall(crate::transport::SyscallError),
    /// Another AF_XDP socket owns the receive queue.
    #[error(
        "receive queue {queue} of {iface} is taken by another AF_XDP socket (another leap node on the same \
         interface? each XDP node needs its own interface, e.g. `leap ring --netns`)"
    )]
    QueueBusy {
        /// The interface.
        iface: String,
        /// The queue.
        queue: u32,
    },
    /// An XDP transport was asked for without the interface frames arrive on.
    #[error("--transport {transport} needs the interface frames arrive on (--iface)")]
    NeedsInterface {
        /// `xdp` or `xdp-ringbuf`.
        transport: &'static str,
    },
    /// A VLAN ID beyond 4095.
    #[error("VLAN ID {0} out of range (0..=4095)")]
    BadVlan(u16),
    /// More VLANs than the program's map holds.
    #[error("{found} VLANs, more than the {max} the XDP program holds")]
    TooManyVlans {
        /// VLANs asked for.
        found: usize,
        /// What the map holds.
        max: u32,
    },
    /// More local addresses than the program's map holds.
    #[error("{found} local addresses, more than the {max} the XDP program holds: listen on one address")]
    TooManyLocalAddrs {
        /// Addresses found.
        found: usize,
        /// What the map holds.
        max: u32,
    },
    /// The step (`pin`) needs the program attached first.
    #[error("{0}: the XDP program is not attached")]
    NotAttachedYet(&'static str),
    /// `attach` on a program that is attached already.
    #[error("the XDP program is attached already")]
    AlreadyAttached,
    /// A receive-queue list the program cannot hold.
    #[error(
        "receive queues {0:?}: between 1 and {max} queues, each below {max}",
        max = leap_common::xdp::MAX_QUEUES
    )]
    BadQueues(Vec<u32>),
    /// AF_XDP socket sizes that cannot work.
    #[error(
        "AF_XDP settings: frame size {frame_size} (a power of two in 2048..=4096), ring size {ring_size} \
         (a power of two), {frames} UMEM frames (at least the ring size)"
    )]
    XskSizes {
        /// Bytes per UMEM frame.
        frame_size: u32,
        /// Entries per ring.
        ring_size: u32,
        /// UMEM frames.
        frames: u32,
    },
    /// The object carries no aya-log map, or its events cannot be read.
    #[error("aya-log: {0}")]
    Log(#[source] aya_log::Error),
    /// The kernel cannot hand over or describe the XDP link.
    #[error("XDP link ({what}): {source}")]
    Link {
        /// What was asked.
        what: &'static str,
        /// What aya said.
        #[source]
        source: aya::programs::links::LinkError,
    },
    /// The program pinned under the BPF file system cannot be described.
    #[error("pinned XDP program: {0}")]
    PinnedProgram(#[source] aya::programs::ProgramError),
}

/// Whether `queues` is a receive-queue list the program can hold: 1 to
/// `MAX_QUEUES` queues, each below `MAX_QUEUES`. The one check behind the
/// flag, the node file, the settings by name and the transport.
///
/// # Errors
///
/// [`XdpError::BadQueues`].
pub fn check_queues(queues: &[u32]) -> Result<(), XdpError> {
    let max = leap_common::xdp::MAX_QUEUES;
    if queues.is_empty() || queues.len() > max as usize || queues.iter().any(|&q| q >= max) {
        return Err(XdpError::BadQueues(queues.to_vec()));
    }
    Ok(())
}

/// Whether `vid` is a VLAN ID (0..=4095).
///
/// # Errors
///
/// [`XdpError::BadVlan`].
pub fn check_vlan(vid: u16) -> Result<(), XdpError> {
    if vid > leap_common::xdp::wire::VLAN_VID_MASK { Err(XdpError::BadVlan(vid)) } else { Ok(()) }
}

impl XdpError {
    /// Wraps an aya map error.
    pub(crate) fn map(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Self {
        move |source| Self::Map { map, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_ids_are_checked_in_one_place() {
        assert!(check_vlan(0).is_ok());
        assert!(check_vlan(4095).is_ok());
        assert!(matches!(check_vlan(4096), Err(XdpError::BadVlan(4096))));
        assert_eq!(check_vlan(u16::MAX).unwrap_err().to_string(), "VLAN ID 65535 out of range (0..=4095)");
    }

    #[test]
    fn queue_lists_are_checked_in_one_place() {
        let max = leap_common::xdp::MAX_QUEUES;
        assert!(check_queues(&[0]).is_ok());
        assert!(check_queues(&(0..max).collect::<Vec<_>>()).is_ok());
        for bad in [vec![], vec![max], (0..=max).collect::<Vec<_>>()] {
            assert!(matches!(check_queues(&bad), Err(XdpError::BadQueues(_))), "{bad:?}");
        }
    }
}
