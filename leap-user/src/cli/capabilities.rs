//! `leap capabilities`: what this host can run, as one JSON line (what
//! `leap bench --hosts ssh://...` asks every host before its rings, and
//! what `leap serve`'s agent answers a coordinator).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::serve::capabilities;

/// Arguments of `leap capabilities`.
#[derive(Debug, Clone, Args)]
pub struct CapabilitiesArgs {
    /// XDP object to load instead of the embedded one.
    #[arg(long, value_name = "PATH")]
    pub xdp_object: Option<PathBuf>,
}

/// Runs `leap capabilities`.
///
/// # Errors
///
/// Standard output failing.
pub fn main(args: &CapabilitiesArgs) -> Result<()> {
    let object_ok =
        args.xdp_object.as_ref().is_some_and(|p| p.is_file()) || crate::transport::xdp::object::embedded().is_some();
    println!("{}", serde_json::to_string(&capabilities::probe_with(object_ok, args.xdp_object.as_deref()))?);
    Ok(())
}
