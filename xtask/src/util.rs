//! Running commands and installing Debian packages, shared by every task.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// The workspace root found by [`init_root`].
static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Finds the workspace root from the current directory, once per run, so
/// that an xtask binary built elsewhere still works on the checkout it is
/// run in.
///
/// # Errors
///
/// When the current directory is not inside the leap repository.
pub fn init_root() -> Result<()> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let root = find_root(&cwd)?;
    let _ = ROOT.set(root);
    Ok(())
}

/// The workspace root (the directory of the `Cargo.toml` whose
/// `[workspace]` has the `xtask` member).
///
/// # Panics
///
/// When [`init_root`] has not succeeded (`main` calls it first).
pub fn root() -> PathBuf {
    ROOT.get().expect("util::init_root runs first in main").clone()
}

/// The nearest directory at or above `dir` whose `Cargo.toml` declares a
/// `[workspace]` with the `xtask` member.
///
/// # Errors
///
/// When there is none: `cargo xtask` was run outside the leap repository.
pub fn find_root(dir: &Path) -> Result<PathBuf> {
    for d in dir.ancestors() {
        let Ok(manifest) = std::fs::read_to_string(d.join("Cargo.toml")) else { continue };
        let workspace = manifest.lines().any(|l| l.trim() == "[workspace]");
        if workspace && manifest.contains("\"xtask\"") && d.join("xtask").is_dir() {
            return Ok(d.to_path_buf());
        }
    }
    bail!(
        "{} is not inside the leap repository (no Cargo.toml with a [workspace] that has the xtask member \
         at or above it); run `cargo xtask` from the checkout",
        dir.display()
    )
}

/// Whether we run in CI (`CI=true`): missing tools and privileges are errors there.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether we run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Runs a command, echoing it, and fails unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {}", show(cmd));
    let status = cmd.status().with_context(|| format!("cannot start {}", show(cmd)))?;
    if !status.success() {
        bail!("{} failed: {status}", show(cmd));
    }
    Ok(())
}

/// Runs a command and returns its stdout, failing unless it exits 0.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot start {}", show(cmd)))?;
    if !out.status.success() {
        bail!("{} failed: {}\n{}", show(cmd), out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The command line as a shell would show it.
pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Whether a program is on PATH.
pub fn have(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Whether a Debian package is installed.
pub fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Installs the Debian packages among `pkgs` that are missing (root only),
/// running `apt-get update` once per xtask run.
///
/// # Errors
///
/// When not root and something is missing (naming it), or apt fails.
pub fn apt_install(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages: {}; install them with `sudo apt-get install {}`",
            missing.join(" "),
            missing.join(" ")
        );
    }
    static UPDATED: OnceLock<()> = OnceLock::new();
    if UPDATED.get().is_none() {
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        let _ = UPDATED.set(());
    }
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_from_a_subdirectory_of_the_checkout() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let want = here.parent().unwrap();
        assert_eq!(find_root(&here.join("src")).unwrap(), want);
        assert_eq!(find_root(want).unwrap(), want);
    }

    #[test]
    fn outside_the_checkout_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("xtask-root-test-{}", std::process::id()));
        let nested = dir.join("member/src");
        std::fs::create_dir_all(&nested).unwrap();
        // A workspace of someone else's: no xtask member.
        std::fs::write(dir.join("Cargo.toml"), "[workspace]\nmembers = [\"member\"]\n").unwrap();
        let err = find_root(&nested).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("not inside the leap repository"), "{err}");
    }
}
