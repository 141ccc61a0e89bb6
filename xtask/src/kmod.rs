//! `cargo xtask build-kmod`: builds the kernel module `kmod/leap_kmod.ko`
//! against Debian's kernel headers (installed when missing) or a given tree.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// Debian's meta-package that pulls the current headers.
const HEADERS_META: &str = "linux-headers-amd64";

/// A module built against one kernel release.
#[derive(Debug)]
pub struct BuiltModule {
    /// `target/kmod/leap_kmod.ko`.
    pub ko: PathBuf,
    /// `uname -r` of the kernel the module is for, e.g. `6.1.0-57-amd64`.
    pub release: String,
}

/// The release (`6.1.0-57-amd64`) that Debian's headers meta-package points
/// at, installing the headers first when missing.
pub fn debian_release() -> Result<String> {
    util::apt_install(&[HEADERS_META, "make", "gcc"])?;
    let depends = util::output(Command::new("dpkg-query").args(["-W", "-f=${Depends}", HEADERS_META]))?;
    // "linux-headers-6.1.0-57-amd64 (= 6.1.192-3)"
    let release = depends
        .split([',', '|'])
        .filter_map(|d| d.split_whitespace().next())
        .find_map(|name| name.strip_prefix("linux-headers-"))
        .with_context(|| format!("cannot find the headers package in `{depends}`"))?;
    Ok(release.to_owned())
}

/// The release a kernel build directory is for: `UTS_RELEASE`, which is what
/// the module's vermagic carries (Debian's `include/config/kernel.release`
/// holds the upstream version instead).
fn release_of(kernel_dir: &Path) -> Result<String> {
    let file = kernel_dir.join("include/generated/utsrelease.h");
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!("{} is not a configured kernel build tree (no {})", kernel_dir.display(), file.display())
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix("#define UTS_RELEASE"))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .with_context(|| format!("no UTS_RELEASE in {}", file.display()))
}

/// Builds the module against `kernel_dir`, or Debian's headers when `None`,
/// and copies it to `target/kmod/leap_kmod.ko`.
///
/// # Errors
///
/// When the headers cannot be installed, or `make` fails.
pub fn build(kernel_dir: Option<&Path>) -> Result<BuiltModule> {
    let kernel_dir = match kernel_dir {
        Some(dir) => dir.to_path_buf(),
        None => PathBuf::from(format!("/lib/modules/{}/build", debian_release()?)),
    };
    if !kernel_dir.join("Makefile").is_file() {
        bail!("{} has no kernel Makefile: pass --kernel-dir or install the headers", kernel_dir.display());
    }
    let release = release_of(&kernel_dir)?;
    let src = util::root().join("kmod");
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    util::run(
        Command::new("make")
            .arg("-C")
            .arg(&kernel_dir)
            .arg(format!("M={}", src.display()))
            .arg(format!("-j{jobs}"))
            .arg("modules"),
    )?;
    let built = src.join("leap_kmod.ko");
    let out_dir = util::root().join("target/kmod");
    std::fs::create_dir_all(&out_dir)?;
    let ko = out_dir.join("leap_kmod.ko");
    std::fs::copy(&built, &ko).with_context(|| format!("copying {}", built.display()))?;
    eprintln!("built {} for {release}", ko.display());
    Ok(BuiltModule { ko, release })
}
