//! Types that cross a boundary in leap: the LEAP chunk on the wire, the
//! application frame header, the in-band control message, the BPF maps of the
//! XDP program and the ioctl ABI of `/dev/leap_tensor`.
//!
//! Everything here is plain data, `#![no_std]`, so that the XDP program
//! (`leap-ebpf`), user space (`leap-user`) and the tests that check the C
//! header of the kernel module all agree on one definition.
//!
//! ```
//! use leap_common::chunk::{ChunkHeader, CHUNK_PAYLOAD_MAX};
//!
//! let hdr = ChunkHeader::data(7, 0, 12);
//! let mut wire = [0u8; 12];
//! hdr.write(&mut wire);
//! let (parsed, payload) = ChunkHeader::parse(&wire).unwrap();
//! assert_eq!(parsed, hdr);
//! assert!(payload.is_empty());
//! assert_eq!(CHUNK_PAYLOAD_MAX, 1400);
//! ```
#![no_std]

pub mod chunk;
pub mod control;
pub mod frame;
pub mod hello;
pub mod kmod;
pub mod xdp;

/// Default UDP/TCP port of a leap node, as in the original.
pub const DEFAULT_PORT: u16 = 9999;
