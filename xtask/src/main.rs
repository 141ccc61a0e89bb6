//! `cargo xtask`: builds what plain cargo cannot (the BPF object, the kernel
//! module, the VM image) and runs the checks and the benchmark.

mod bench;
mod capi;
mod ci;
mod cpp;
mod ebpf;
mod kmod;
mod public_api;
mod python;
mod tools;
mod util;
mod vm;

use std::process::ExitCode;

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
    /// Everything CI checks: fmt, clippy, unit tests, privileged ring tests, XDP, the VM.
    Ci(ci::Args),
    /// Build the XDP object (target/bpf/leap-xdp.o); `--install` installs a missing toolchain.
    BuildEbpf {
        /// Install missing apt packages and bpf-linker (root; always in CI).
        #[arg(long)]
        install: bool,
    },
    /// Build the XDP object, then the `leap` binary with it embedded.
    Build {
        /// Install missing apt packages and bpf-linker (root; always in CI),
        /// then the C library (libleap.so, libleap.a), leap.h and leap.pc
        /// under --prefix.
        #[arg(long)]
        install: bool,
        /// Build `leap` in release mode.
        #[arg(long)]
        release: bool,
        /// Where --install puts the C library, its header and leap.pc.
        #[arg(long, default_value = "/usr/local")]
        prefix: std::path::PathBuf,
    },
    /// Build the kernel module (target/kmod/<release>/leap_kmod.ko) against Debian's headers or `--kernel-dir`.
    BuildKmod {
        /// Kernel build tree (default: Debian's headers of `--kernel`, installed or downloaded if missing).
        #[arg(long, conflicts_with = "kernel")]
        kernel_dir: Option<std::path::PathBuf>,
        /// Which of Debian's LTS kernels to build for.
        #[arg(long, value_enum, default_value = "6.1")]
        kernel: kmod::Lts,
    },
    /// The main job: build everything, benchmark every transport (host and VM), write one report.
    Bench(bench::Args),
    /// Set up the Python package: a venv under target/python, the abi3 wheel built and installed (`--test` runs its tests).
    Python(python::Args),
    /// Compare the library's public items with leap-user/public-api.txt (`--bless` writes it).
    PublicApi(public_api::Args),
    /// Boot Debian's 6.1 and 6.12 kernels in qemu with the module and run the kmod suite (or `-- CMD...`).
    Vm(vm::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    util::signals::forward();
    match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The causes on one line; no backtrace (RUST_BACKTRACE is often set in CI).
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Cmd) -> Result<()> {
    util::init_root()?;
    match cmd {
        Cmd::Ci(args) => ci::run_ci(args),
        Cmd::Bench(args) => bench::run_bench(args),
        Cmd::BuildEbpf { install } => ebpf::build_ebpf(install).map(drop),
        Cmd::Build { install, release, prefix } => {
            ebpf::build(install, release)?;
            if install {
                capi::install(&prefix, Some(&util::root().join(ebpf::OBJECT_PATH)))?;
            }
            Ok(())
        }
        Cmd::BuildKmod { kernel_dir, kernel } => {
            let tree = match kernel_dir {
                Some(dir) => dir,
                None => kmod::tree(kernel)?,
            };
            kmod::build(&tree).map(drop)
        }
        Cmd::Vm(args) => vm::run(args),
        Cmd::Python(args) => python::run_python(args),
        Cmd::PublicApi(args) => public_api::run(args),
    }
}
