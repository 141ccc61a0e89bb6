//! leap moves activation frames around a ring of machines that run one LLM
//! split layer-wise (pipeline parallel): each node receives a frame from the
//! previous node, computes its layers and sends the result to the next, and
//! the tail sends back to the head.
//!
//! Every way of moving a frame sits behind one [`Transport`] trait: TCP,
//! UDP in the LEAP chunk format, the XDP/AF_XDP fast path and the
//! `leap_kmod` kernel module.
//!
//! ```no_run
//! use leap::transport::{Transport, udp::{UdpConfig, UdpTransport}};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = UdpConfig::new("127.0.0.1:9999".parse()?, "127.0.0.1:10000".parse()?);
//! let mut t = UdpTransport::bind(cfg)?;
//! let frame = vec![0u8; 16392];
//! t.send_next(&frame)?;
//! let mut buf = vec![0u8; 16392];
//! let got = t.recv_prev(&mut buf)?;
//! assert_eq!(got.len, 16392);
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! - `cli` (default): the `leap` binary's part: the command line (`cli`),
//!   the benchmark (`bench`) and the remote agent and coordinator
//!   (`serve`), with clap, anyhow, env_logger, indicatif, toml and
//!   signal-hook, the ring runtime (`ring`) and the telemetry servers
//!   (`telemetry-server`). An embedder that only moves frames turns it off
//!   (`default-features = false`) and gets the transport alone: backends,
//!   reassembly and telemetry's counters, without tokio, hyper,
//!   prometheus-client or hdrhistogram.
//! - `ring`: `ring`, the head and worker loops and the local ring runner,
//!   with hdrhistogram for round trips.
//! - `telemetry-server`: `telemetry::serve`, a node's Prometheus endpoint
//!   and stats socket, on tokio, hyper and prometheus-client.
//! - `tokio`: async send and receive for the datagram transports
//!   (`transport::asyncio`).
//!
//! # Layers
//!
//! Each module names only the ones below it (`tests/layering.rs` checks):
//!
//! - [`sys`]: system calls and kernel ABI mirrors;
//! - [`frame`]: chunking, reassembly, loss recovery and the plain types
//!   frames arrive as ([`frame::types`]); no system calls;
//! - `link` (crate-private, in progress): the datagram link without I/O
//!   that every datagram backend decides with (`transport/datagram.rs`
//!   drives it and does the I/O), tested on a fake clock (it still names
//!   `transport::Stats`, until that moves below it);
//! - [`netns`]: rings of network namespaces;
//! - [`transport`]: inside it, [`transport::config`] (what every backend is
//!   configured with) and the sending half below `datagram` (shared by the
//!   datagram backends), that below the backends (`tcp`, `udp`, `kmod`,
//!   `xdp`), and [`transport::open`], which only dispatches by name, on top;
//! - [`telemetry`]: counters and the stats socket;
//! - `ring`: the node loop and the local ring runner (feature `ring`);
//! - `bench`, `serve` and `cli`: the binary's.

#[cfg(feature = "cli")]
pub mod bench;
#[cfg(feature = "cli")]
pub mod cli;
pub mod frame;
// The datagram link without I/O (issue 23): every datagram backend's
// receive side and recovery run on it; its own sending of first copies is
// used only by its tests yet.
#[allow(dead_code, reason = "the transports send first copies without the link yet")]
pub(crate) mod link;
pub mod netns;
#[cfg(feature = "ring")]
pub mod ring;
pub mod secret_file;
#[cfg(feature = "cli")]
pub mod serve;
pub mod sys;
pub mod telemetry;
pub mod transport;

pub use transport::{FrameKind, Received, Stats, Transport, TransportError};
