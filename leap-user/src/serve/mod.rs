//! `leap serve` and `leap bench --hosts`: an agent on every host runs one
//! ring member at a time on request of an authenticated coordinator, which
//! drives the benchmark's matrix across the hosts.
//!
//! ```no_run
//! use leap::serve::agent::{AgentConfig, Limits, serve};
//! use std::sync::atomic::AtomicBool;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let token = leap::serve::protocol::read_token("/etc/leap/serve.token".as_ref())?;
//! let cfg = AgentConfig { listen: "10.0.0.1:7700".parse()?, token, limits: Limits::default(), xdp_object: None };
//! serve(cfg, &AtomicBool::new(false))?;
//! # Ok(()) }
//! ```

pub mod agent;
pub mod capabilities;
pub mod coordinator;
pub mod protocol;

/// The agent's default control port.
pub const DEFAULT_CONTROL_PORT: u16 = 7700;
