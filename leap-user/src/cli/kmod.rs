//! `leap kmod status`: whether `leap_kmod` is loaded, its ABI version,
//! features and counters (the module's, or this open file's where the
//! module keeps its own for the host's administrator).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use leap_common::kmod::{DEVICE_PATH, INFO_SCOPE_FILE, INFO_SCOPE_MODULE};

use crate::transport::BackendCounters;
use crate::transport::kmod::{KmodError, status};

/// Arguments of `leap kmod`.
#[derive(Debug, Clone, Args)]
pub struct KmodArgs {
    /// What to do.
    #[command(subcommand)]
    pub cmd: KmodCmd,
}

/// `leap kmod` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum KmodCmd {
    /// Whether the module is loaded, its version, features and counters.
    Status {
        /// The device.
        #[arg(long, default_value = DEVICE_PATH)]
        device: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `leap kmod`.
///
/// # Errors
///
/// The device exists but cannot be queried.
pub fn main(args: &KmodArgs) -> Result<()> {
    let KmodCmd::Status { device, json } = &args.cmd;
    // Module-wide counters need CAP_NET_ADMIN in the initial user namespace
    // (EPERM otherwise, e.g. in a container with allow_userns=1).
    let (scope, got) = match status(device, INFO_SCOPE_MODULE) {
        Err(KmodError::Syscall(e)) if e.errno() == Some(libc::EPERM) => {
            log::warn!("module-wide counters need CAP_NET_ADMIN in the initial user namespace: this file's only");
            ("file", status(device, INFO_SCOPE_FILE))
        }
        other => ("module", other),
    };
    let v = match got {
        Ok(i) => serde_json::json!({
            "loaded": true,
            "device": device,
            "scope": scope,
            "abi_version": i.abi_version,
            "features": format!("{:#x}", i.features),
            "open_files": i.open_files,
            "rx_banks": i.rx_banks,
            "bank_size": i.bank_size,
            "busy_wait_limit": i.busy_wait_limit,
            "counters": BackendCounters::Kmod(i.counters),
        }),
        Err(KmodError::NotLoaded { .. }) => serde_json::json!({ "loaded": false, "device": device }),
        Err(e) => return Err(e.into()),
    };
    if *json {
        println!("{v}");
    } else if v["loaded"] == true {
        println!(
            "leap_kmod loaded: ABI {}, features {}, {} open files, {} banks of {} bytes",
            v["abi_version"], v["features"], v["open_files"], v["rx_banks"], v["bank_size"]
        );
        if let Some(c) = v["counters"].as_object() {
            for (k, n) in c {
                println!("  {k:<22} {n}");
            }
        }
    } else {
        println!("leap_kmod is not loaded ({} missing): modprobe leap_kmod, or see kmod/README.md", device.display());
    }
    Ok(())
}
