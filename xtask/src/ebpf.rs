//! `cargo xtask build-ebpf` and `cargo xtask build`: the XDP object for
//! `bpfel-unknown-none`, then the `leap` binary with that object embedded.
//!
//! Two toolchains can build the object, tried in this order:
//!
//! 1. rustup `nightly` with the `rust-src` component: `-Z build-std=core`;
//! 2. a rustc whose sysroot already holds `core` for `bpfel-unknown-none`
//!    (`$LEAP_BPF_RUSTC`, else Debian's `rustc-web` with
//!    `libstd-rust-web-dev-bpf` at `/usr/bin/rustc`), with
//!    `RUSTC_BOOTSTRAP=1` because aya-ebpf uses a nightly feature.
//!
//! Both link with `bpf-linker`, whose LLVM must be at least as new as the
//! rustc's. With `--install` (always in CI) what is missing is installed on
//! Debian: the apt packages of route 2, and bpf-linker built against LLVM 22.
//! Otherwise the error names exactly what is missing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::tools::{self, Tool, apt_install};
use crate::util::{in_ci, output, root, run, run_for};

/// Where `build-ebpf` leaves the object, relative to the workspace root.
pub const OBJECT_PATH: &str = "target/bpf/leap-xdp.o";
/// Environment variable through which `leap-user/build.rs` embeds the object.
pub const OBJECT_ENV: &str = "LEAP_XDP_OBJECT";

const TARGET: &str = "bpfel-unknown-none";
/// Debian packages of the prebuilt-`core` route and of bpf-linker's LLVM.
/// ([`Tool::DebianRustc`] is rustc-web's.)
const APT_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "libstd-rust-web-dev-bpf", "llvm-22-dev", "libpolly-22-dev"];
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const LLVM_FEATURE: &str = "llvm-22";
const BPF_LINKER_VERSION: &str = "~0.13";
/// Building bpf-linker takes 2-4 minutes alone, much longer on a busy machine.
const BPF_LINKER_BUILD_LIMIT: Duration = Duration::from_secs(45 * 60);

/// A compiler able to build for `bpfel-unknown-none`.
#[derive(Debug)]
enum Toolchain {
    /// rustup nightly with rust-src: `-Z build-std=core`.
    NightlyBuildStd,
    /// A rustc with `core` for the BPF target in its sysroot.
    Prebuilt { rustc: PathBuf },
}

impl Toolchain {
    fn describe(&self) -> String {
        match self {
            Self::NightlyBuildStd => "rustup nightly + rust-src (-Z build-std=core)".into(),
            Self::Prebuilt { rustc } => format!("{} with a prebuilt BPF core", rustc.display()),
        }
    }

    /// LLVM major version of the compiler.
    fn llvm_major(&self) -> Result<u32> {
        let out = match self {
            Self::NightlyBuildStd => output(tools::command(Tool::Rustc)?.args(["+nightly", "-vV"]))?,
            Self::Prebuilt { rustc } => output(tools::command_at(Tool::Rustc, rustc).arg("-vV"))?,
        };
        llvm_major_of_rustc(&out).with_context(|| format!("no LLVM version in `rustc -vV` of {}", self.describe()))
    }
}

/// Builds the XDP object and copies it to [`OBJECT_PATH`]; returns its
/// absolute path.
///
/// # Errors
///
/// When no toolchain is usable (naming what is missing) or the build fails.
pub fn build_ebpf(install: bool) -> Result<PathBuf> {
    let install = install || in_ci();
    let toolchain = find_toolchain(install)?;
    eprintln!("build-ebpf: compiler: {}", toolchain.describe());
    let linker_dir = ensure_bpf_linker(&toolchain, install)?;

    let crate_dir = root().join("leap-ebpf");
    // rustup's proxy by name, not `$CARGO`: RUSTUP_TOOLCHAIN below must pick the toolchain.
    let mut cmd = tools::command(Tool::Cargo)?;
    cmd.current_dir(&crate_dir);
    // Whatever cargo and rustup told xtask must not leak into the BPF build.
    for var in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTUP_TOOLCHAIN",
    ] {
        cmd.env_remove(var);
    }
    match &toolchain {
        Toolchain::NightlyBuildStd => {
            cmd.env("RUSTUP_TOOLCHAIN", "nightly");
            cmd.args(["build", "-Z", "build-std=core"]);
        }
        Toolchain::Prebuilt { rustc } => {
            cmd.env("RUSTC", rustc).env("RUSTC_BOOTSTRAP", "1");
            cmd.arg("build");
        }
    }
    cmd.args(["--release", "--locked", "--target", TARGET]);
    // Full debug info and BTF: the verifier needs func_info to match.
    cmd.env("CARGO_ENCODED_RUSTFLAGS", ["-Cdebuginfo=2", "-Clink-arg=--btf"].join("\x1f"));
    if let Some(dir) = linker_dir {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![dir];
        dirs.extend(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(dirs)?);
    }
    run(&mut cmd)?;

    let built = crate_dir.join("target").join(TARGET).join("release").join("leap-xdp");
    let dest = root().join(OBJECT_PATH);
    std::fs::create_dir_all(dest.parent().expect("OBJECT_PATH has a parent"))?;
    // An unchanged object keeps its mtime: `leap`'s build script watches
    // it, and a new mtime rebuilds `leap` (minutes, in release).
    let object = std::fs::read(&built).with_context(|| format!("reading {}", built.display()))?;
    if std::fs::read(&dest).ok().as_deref() != Some(object.as_slice()) {
        std::fs::write(&dest, &object).with_context(|| format!("writing {}", dest.display()))?;
    }
    check_object(&dest)?;
    eprintln!("build-ebpf: {}", dest.display());
    Ok(dest)
}

/// Builds the object, then the `leap` binary with it embedded.
///
/// # Errors
///
/// As [`build_ebpf`], or when cargo fails.
pub fn build(install: bool, release: bool) -> Result<()> {
    let object = build_ebpf(install)?;
    let mut cmd = tools::cargo()?;
    cmd.current_dir(root()).args(["build", "--locked", "-p", "leap", "--bin", "leap"]);
    if release {
        cmd.arg("--release");
    }
    cmd.env(OBJECT_ENV, &object);
    run(&mut cmd)?;
    let bin = root().join("target").join(if release { "release" } else { "debug" }).join("leap");
    eprintln!("build: {} (XDP object embedded from {})", bin.display(), object.display());
    Ok(())
}

/// An ELF object for eBPF with the program section and the maps.
fn check_object(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path)?;
    // e_ident: ELF, 64-bit, little endian; e_machine EM_BPF (247).
    let ok = bytes.len() > 20
        && bytes[..4] == *b"\x7fELF"
        && bytes[4] == 2
        && bytes[5] == 1
        && u16::from_le_bytes([bytes[18], bytes[19]]) == 247;
    if !ok {
        bail!("{} is not a little-endian eBPF ELF object", path.display());
    }
    for needle in [b"leap_xdp".as_slice(), b"LEAP_COUNTERS", b"LEAP_XSKS", b"LEAP_RING"] {
        if !bytes.windows(needle.len()).any(|w| w == needle) {
            bail!("{} lacks {}", path.display(), String::from_utf8_lossy(needle));
        }
    }
    Ok(())
}

fn find_toolchain(install: bool) -> Result<Toolchain> {
    if nightly_has_rust_src() {
        return Ok(Toolchain::NightlyBuildStd);
    }
    if let Some(rustc) = prebuilt_rustc() {
        return Ok(Toolchain::Prebuilt { rustc });
    }
    if install {
        apt_install(APT_PACKAGES)?;
        if let Some(rustc) = prebuilt_rustc() {
            return Ok(Toolchain::Prebuilt { rustc });
        }
        bail!(
            "installed {} but {} still has no core for {TARGET}",
            APT_PACKAGES.join(" "),
            Tool::DebianRustc.program()
        );
    }
    let mut missing = Vec::new();
    if tools::find(Tool::Rustup).is_some() {
        missing.push("`rustup toolchain install nightly --component rust-src`".to_string());
    } else {
        missing.push("rustup with a nightly toolchain and rust-src".to_string());
    }
    missing.push(format!("or, on Debian 12, `apt-get install {}`", APT_PACKAGES.join(" ")));
    bail!(
        "no compiler for {TARGET}: need {}; `cargo xtask build-ebpf --install` does the latter as root",
        missing.join(" ")
    )
}

/// Whether rustup's nightly toolchain has the rust-src component.
fn nightly_has_rust_src() -> bool {
    tools::find(Tool::Rustup).is_some()
        && tools::command(Tool::Rustup)
            .and_then(|mut c| output(c.args(["+nightly", "component", "list", "--installed"])))
            .is_ok_and(|out| out.lines().any(|l| l.starts_with("rust-src")))
}

/// A rustc with `core` for the BPF target in its sysroot: `$LEAP_BPF_RUSTC`
/// or Debian's.
fn prebuilt_rustc() -> Option<PathBuf> {
    let candidates = std::env::var_os("LEAP_BPF_RUSTC")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from(Tool::DebianRustc.program())]);
    candidates.into_iter().find(|rustc| {
        rustc.is_file()
            && output(tools::command_at(Tool::Rustc, rustc).args(["--print", "sysroot"])).is_ok_and(|sysroot| {
                let lib = Path::new(sysroot.trim()).join("lib/rustlib").join(TARGET).join("lib");
                std::fs::read_dir(lib).is_ok_and(|mut d| {
                    d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcore-")))
                })
            })
    })
}

/// Makes sure a bpf-linker with a new enough LLVM exists; returns the
/// directory to put first on PATH when it is not on PATH already.
fn ensure_bpf_linker(toolchain: &Toolchain, install: bool) -> Result<Option<PathBuf>> {
    let need = toolchain.llvm_major()?;
    let installed = cargo_bin_dir().join(Tool::BpfLinker.program());
    let found = tools::find(Tool::BpfLinker).or_else(|| installed.is_file().then(|| installed.clone()));
    if let Some(linker) = &found {
        match linker_llvm_major(linker) {
            Some(have) if have >= need => return Ok(linker.parent().map(Path::to_path_buf)),
            Some(have) if !install => bail!(
                "{} uses LLVM {have}, older than the compiler's LLVM {need}; rebuild it: \
                 `LLVM_PREFIX={LLVM_PREFIX} cargo install bpf-linker --locked --no-default-features --features {LLVM_FEATURE} --force`",
                linker.display()
            ),
            Some(_) => {}
            // Statically linked: its LLVM cannot be read; a too-old one shows
            // as a link error.
            None => return Ok(linker.parent().map(Path::to_path_buf)),
        }
    } else if !install {
        bail!(
            "bpf-linker is not installed; install it with `apt-get install llvm-22-dev libpolly-22-dev` and \
             `LLVM_PREFIX={LLVM_PREFIX} cargo install bpf-linker --locked --no-default-features --features {LLVM_FEATURE}` \
             (or run `cargo xtask build-ebpf --install` as root)"
        );
    }
    if need > 22 {
        bail!("the compiler uses LLVM {need}, newer than the LLVM 22 bpf-linker can be built against here");
    }
    apt_install(&["llvm-22-dev", "libpolly-22-dev"])?;
    let mut cmd = tools::command(Tool::Cargo)?;
    for var in ["RUSTC", "RUSTC_WRAPPER", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_TARGET_DIR"] {
        cmd.env_remove(var);
    }
    cmd.args([
        "install",
        Tool::BpfLinker.cargo_crate().unwrap_or_default(),
        "--version",
        BPF_LINKER_VERSION,
        "--locked",
        "--force",
        "--no-default-features",
        "--features",
        LLVM_FEATURE,
    ])
    .env("LLVM_PREFIX", LLVM_PREFIX);
    run_for(&mut cmd, BPF_LINKER_BUILD_LIMIT)?;
    if !installed.is_file() {
        bail!("cargo install did not produce {}", installed.display());
    }
    Ok(installed.parent().map(Path::to_path_buf))
}

/// `$CARGO_HOME/bin`.
fn cargo_bin_dir() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

/// LLVM major version of a dynamically linked bpf-linker (from `ldd`).
fn linker_llvm_major(linker: &Path) -> Option<u32> {
    llvm_major_of_ldd(&output(tools::command(Tool::Ldd).ok()?.arg(linker)).ok()?)
}

/// The LLVM major version in `rustc -vV` output.
fn llvm_major_of_rustc(vv: &str) -> Option<u32> {
    vv.lines().find_map(|l| l.strip_prefix("LLVM version: "))?.split('.').next()?.trim().parse().ok()
}

/// The LLVM major version of the libLLVM an `ldd` listing names.
fn llvm_major_of_ldd(ldd: &str) -> Option<u32> {
    ldd.split_whitespace().find_map(|word| {
        let rest = word.strip_prefix("libLLVM.so.").or_else(|| word.strip_prefix("libLLVM-"))?;
        rest.split(['.', '-']).next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_versions_are_read_from_rustc_and_ldd() {
        let vv = "rustc 1.96.0 (ac68faa20 2026-05-25)\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.8\n";
        assert_eq!(llvm_major_of_rustc(vv), Some(22));
        assert_eq!(llvm_major_of_rustc("rustc 1.0\n"), None);
        let ldd =
            "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibLLVM.so.22.1 => /usr/lib/llvm-22/lib/libLLVM.so.22.1 (0x00007f5a)\n";
        assert_eq!(llvm_major_of_ldd(ldd), Some(22));
        assert_eq!(llvm_major_of_ldd("\tlibLLVM-19.so => /usr/lib/x86_64-linux-gnu/libLLVM-19.so (0x1)\n"), Some(19));
        assert_eq!(llvm_major_of_ldd("\tstatically linked\n"), None);
    }
}
