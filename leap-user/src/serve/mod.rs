//! `leap serve` and `leap bench --hosts`: an agent on every host runs one
//! ring member at a time on request of a coordinator that holds its token
//! (proved in a Noise handshake, never sent), which drives the benchmark's
//! matrix across the hosts; members reach only the run's other members,
//! inside the agent's allow-list.
//!
//! ```no_run
//! use leap::serve::agent::{AgentConfig, Limits, serve};
//! use leap::serve::allow::AllowList;
//! use std::sync::atomic::AtomicBool;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let token = leap::serve::protocol::read_token("/etc/leap/serve.token".as_ref())?;
//! let listen = "10.0.0.1:7700".parse()?;
//! let allow = AllowList::for_listen(listen);
//! let cfg = AgentConfig { listen, token, limits: Limits::default(), xdp_object: None, allow };
//! serve(cfg, &AtomicBool::new(false))?;
//! # Ok(()) }
//! ```

pub mod agent;
pub mod allow;
pub mod capabilities;
pub mod coordinator;
pub mod protocol;
pub mod session;

/// The agent's default control port.
pub const DEFAULT_CONTROL_PORT: u16 = 7700;
