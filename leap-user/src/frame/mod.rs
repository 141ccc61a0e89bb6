//! Frames as chunks: splitting a frame into LEAP chunks on send and putting
//! them back together on receive. Pure logic, no system calls, shared by
//! every datagram backend (UDP, XDP, AF_XDP, ring buffer).

pub mod chunker;
pub mod peer;
pub mod reassembly;
pub mod reliable;
pub mod relock;
pub mod types;
pub mod window;

pub use chunker::Chunker;
pub use reassembly::{LostFrame, Push, Reassembler};
