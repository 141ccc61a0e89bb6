//! `cargo xtask build-kmod`: builds the kernel module `kmod/leap_kmod.ko`
//! against the headers of one of Debian's LTS kernels (installed or
//! downloaded when missing) or a given tree, installing what kbuild runs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::tools::{self, Tool};
use crate::util;

/// Debian's LTS kernels the module is built and tested for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lts {
    /// Debian 12's own kernel (`linux-headers-amd64`).
    #[value(name = "6.1")]
    V6_1,
    /// Debian 12's backported 6.12 (`linux-image-6.12.*+deb12-amd64`).
    #[value(name = "6.12")]
    V6_12,
}

impl Lts {
    /// `6.1`, `6.12`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V6_1 => "6.1",
            Self::V6_12 => "6.12",
        }
    }
}

/// The build tree of Debian's headers of `lts`: 6.1's installed with apt
/// (`/lib/modules/<release>/build`), 6.12's downloaded under `target/vm/`.
///
/// # Errors
///
/// When the headers cannot be installed or downloaded.
pub fn tree(lts: Lts) -> Result<PathBuf> {
    match lts {
        Lts::V6_1 => Ok(PathBuf::from(format!("/lib/modules/{}/build", debian_release()?))),
        Lts::V6_12 => debian_612_tree(&debian_612_release()?),
    }
}

/// Debian's meta-package that pulls the current headers.
const HEADERS_META: &str = "linux-headers-amd64";

/// A module built against one kernel release.
#[derive(Debug)]
pub struct BuiltModule {
    /// `target/kmod/<release>/leap_kmod.ko`.
    pub ko: PathBuf,
    /// `uname -r` of the kernel the module is for, e.g. `6.1.0-57-amd64`.
    pub release: String,
}

/// The release (`6.1.0-57-amd64`) that Debian's headers meta-package points
/// at, installing the headers first when missing.
fn debian_release() -> Result<String> {
    tools::apt_install(&[HEADERS_META])?;
    let depends = util::output(tools::command(Tool::DpkgQuery)?.args(["-W", "-f=${Depends}", HEADERS_META]))?;
    // "linux-headers-6.1.0-57-amd64 (= 6.1.192-3)"
    let release = depends
        .split([',', '|'])
        .filter_map(|d| d.split_whitespace().next())
        .find_map(|name| name.strip_prefix("linux-headers-"))
        .with_context(|| format!("cannot find the headers package in `{depends}`"))?;
    Ok(release.to_owned())
}

/// Debian's newest `6.12.N+deb12-amd64` release whose headers the archive
/// has (`apt-cache search`, after one `apt-get update` when none is listed).
fn debian_612_release() -> Result<String> {
    let find = || -> Result<Option<String>> {
        let out = util::output(tools::command(Tool::AptCache)?.args([
            "search",
            "--names-only",
            r"^linux-headers-6\.12\.[0-9]+\+deb12-amd64$",
        ]))?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().next()?.strip_prefix("linux-headers-"))
            .filter_map(|r| Some((r.strip_prefix("6.12.")?.split_once('+')?.0.parse::<u32>().ok()?, r.to_owned())))
            .max()
            .map(|(_, r)| r))
    };
    if let Some(r) = find()? {
        return Ok(r);
    }
    tools::apt_update()?;
    find()?.context("Debian's archive lists no linux-headers-6.12.*+deb12-amd64")
}

/// The build tree of Debian's 6.12 headers for `release`: the installed one
/// when present, else the three packages (`linux-headers-<release>`, its
/// `-common` and `linux-kbuild-6.12.N+deb12`) fetched with `apt-get
/// download` and unpacked under `target/vm/` (nothing installed on the host),
/// with the arch tree's absolute `include` pointed at the unpacked copy.
fn debian_612_tree(release: &str) -> Result<PathBuf> {
    let installed = PathBuf::from(format!("/usr/src/linux-headers-{release}"));
    if installed.join("Makefile").is_file() && installed.join("scripts").exists() {
        return Ok(installed);
    }
    let base = release.strip_suffix("-amd64").with_context(|| format!("unexpected release {release}"))?;
    let root = util::root().join("target/vm").join(format!("headers-{release}"));
    let tree = root.join(format!("usr/src/linux-headers-{release}"));
    if tree.join("Makefile").is_file() {
        return Ok(tree);
    }
    let debs = util::root().join("target/vm/debs");
    std::fs::create_dir_all(&debs)?;
    let pkgs =
        [format!("linux-headers-{release}"), format!("linux-headers-{base}-common"), format!("linux-kbuild-{base}")];
    util::run(tools::command(Tool::AptGet)?.args(["download", "-q"]).args(&pkgs).current_dir(&debs))?;
    let tmp = root.with_file_name(format!("headers-{release}.partial"));
    let _ = std::fs::remove_dir_all(&tmp);
    for pkg in &pkgs {
        let deb = std::fs::read_dir(&debs)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{pkg}_"))))
            .max()
            .with_context(|| format!("apt-get download left no {pkg}_*.deb"))?;
        util::run(tools::command(Tool::DpkgDeb)?.arg("-x").arg(&deb).arg(&tmp))?;
    }
    // "include /usr/src/linux-headers-<base>-common/Makefile"
    let makefile = tmp.join(format!("usr/src/linux-headers-{release}/Makefile"));
    let text = std::fs::read_to_string(&makefile).with_context(|| format!("reading {}", makefile.display()))?;
    let text = text.replace("include /usr/src/", &format!("include {}/usr/src/", root.display()));
    std::fs::write(&makefile, text)?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&tmp, &root)?;
    Ok(tree)
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

/// Whether modules built against the tree whose `include/config/auto.conf`
/// is `auto_conf` get BTF, which kbuild makes with `pahole`.
fn btf_modules(auto_conf: &str) -> bool {
    auto_conf.lines().any(|l| l.trim() == "CONFIG_DEBUG_INFO_BTF_MODULES=y")
}

/// The programs kbuild runs for a module against `kernel_dir`: `pahole`
/// too when the tree builds modules with BTF (or its configuration cannot
/// be read).
fn kbuild_tools(kernel_dir: &Path) -> Vec<Tool> {
    let conf = std::fs::read_to_string(kernel_dir.join("include/config/auto.conf"));
    let mut need = vec![Tool::Make, Tool::Gcc];
    if conf.as_deref().map_or(true, btf_modules) {
        need.push(Tool::Pahole);
    }
    need
}

/// Builds the module against `kernel_dir` (installing what kbuild runs
/// first) and copies it to `target/kmod/<release>/leap_kmod.ko`.
///
/// # Errors
///
/// When a tool cannot be installed, or `make` fails.
pub fn build(kernel_dir: &Path) -> Result<BuiltModule> {
    if !kernel_dir.join("Makefile").is_file() {
        bail!("{} has no kernel Makefile: pass --kernel-dir or install the headers", kernel_dir.display());
    }
    let release = release_of(kernel_dir)?;
    tools::ensure(&kbuild_tools(kernel_dir))?;
    let src = util::root().join("kmod");
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    let make = || -> Result<_> {
        let mut cmd = tools::command(Tool::Make)?;
        cmd.arg("-C").arg(kernel_dir).arg(format!("M={}", src.display()));
        Ok(cmd)
    };
    // Objects of another release may be in the source directory.
    util::run(make()?.arg("clean"))?;
    util::run(
        make()?
            .arg(format!("-j{jobs}"))
            // The module builds without warnings on every kernel it supports.
            .arg("KCFLAGS=-Werror")
            .arg("modules"),
    )?;
    let built = src.join("leap_kmod.ko");
    let out_dir = util::root().join("target/kmod").join(&release);
    std::fs::create_dir_all(&out_dir)?;
    let ko = out_dir.join("leap_kmod.ko");
    std::fs::copy(&built, &ko).with_context(|| format!("copying {}", built.display()))?;
    eprintln!("built {} for {release}", ko.display());
    Ok(BuiltModule { ko, release })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btf_of_modules_is_read_from_the_tree_configuration() {
        let conf = "CONFIG_DEBUG_INFO_BTF=y\nCONFIG_DEBUG_INFO_BTF_MODULES=y\nCONFIG_MODULES=y\n";
        assert!(btf_modules(conf));
        assert!(!btf_modules("CONFIG_DEBUG_INFO_BTF=y\n# CONFIG_DEBUG_INFO_BTF_MODULES is not set\n"));
        assert!(!btf_modules("CONFIG_DEBUG_INFO_BTF_MODULES_X=y\n"));
    }

    #[test]
    fn an_unreadable_configuration_asks_for_pahole() {
        let need = kbuild_tools(Path::new("/nonexistent/tree"));
        assert!(need.contains(&Tool::Pahole), "{need:?}");
    }
}
