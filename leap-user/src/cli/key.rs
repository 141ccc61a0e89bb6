//! `leap key`: ring keys for `--key-file` / `key_file`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::transport::ring_key::RingKey;

/// `leap key` arguments.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: KeyCommand,
}

/// `leap key` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Write a fresh ring key (from the operating system's random source)
    /// to a new file of mode 0600; never over an existing file. Copy it to
    /// every node of the ring by a channel you trust.
    New {
        /// The file to create.
        file: PathBuf,
    },
    /// Check a key file as a node would (owner, mode, contents) and print
    /// the key's id (which names it without showing it).
    Check {
        /// The key file.
        file: PathBuf,
    },
}

/// Runs `leap key`.
///
/// # Errors
///
/// The file exists, cannot be written, or is not a usable key file.
pub fn main(args: &KeyArgs) -> Result<()> {
    match &args.command {
        KeyCommand::New { file } => {
            let key = RingKey::random().context("the random source failed")?;
            crate::secret_file::create(file, &key.to_file_text()).with_context(|| {
                format!("writing {} (an existing key file is never overwritten: remove it first)", file.display())
            })?;
            println!("{}: new ring key, id {}", file.display(), hex(&key.id()));
        }
        KeyCommand::Check { file } => {
            let key = RingKey::from_file(file)?;
            println!("{}: ring key, id {}", file.display(), hex(&key.id()));
        }
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}
