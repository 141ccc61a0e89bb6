//! Every external program the xtask runs, or has run on its behalf (by
//! make, cargo, `leap` or the tests it starts), with where it comes from;
//! the one place that starts them and installs what is missing.
//!
//! ```ignore
//! tools::ensure(&[Tool::Make, Tool::Pahole])?; // as root: apt-get install dwarves
//! util::run(tools::command(Tool::Qemu)?.args(["-accel", "tcg"]))?;
//! ```
//!
//! A missing program of a Debian package is installed as root (`apt-get
//! update` once per run, each package at most once); without root the error
//! names the package and the command that installs it. Programs the project
//! builds itself (`target/release/leap`, test binaries) start through
//! [`built`]. The test at the end of this file fails when xtask source
//! starts a program any other way.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::util;

/// Where a program comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A Debian package, installed with apt-get when missing (root only).
    Apt(&'static str),
    /// The Rust toolchain that runs the xtask (rustup's).
    Toolchain,
    /// A crate built with `cargo install` (bpf-linker: `cargo xtask
    /// build-ebpf --install` builds it against Debian's LLVM).
    CargoInstall(&'static str),
}

/// Defines [`Tool`] from one table: variant, program, [`Source`].
macro_rules! table {
    ($($(#[$doc:meta])* $tool:ident => $program:literal, $source:expr;)*) => {
        /// An external program of the xtask (see [`table!`]'s rows below).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
        pub enum Tool {
            $($(#[$doc])* $tool,)*
        }

        impl Tool {
            /// Every row of the table.
            #[cfg(test)]
            pub const ALL: &[Tool] = &[$(Tool::$tool),*];

            /// The program: a name looked up on PATH (and in the sbin
            /// directories), or an absolute path.
            pub const fn program(self) -> &'static str {
                match self {
                    $(Tool::$tool => $program,)*
                }
            }

            /// Where the program comes from.
            pub const fn source(self) -> Source {
                match self {
                    $(Tool::$tool => $source,)*
                }
            }
        }
    };
}

table! {
    // The Rust toolchain.
    /// Builds, tests and installs the crates.
    Cargo => "cargo", Source::Toolchain;
    /// `rustc +nightly -vV`: the LLVM of the nightly BPF compiler.
    Rustc => "rustc", Source::Toolchain;
    /// Whether a nightly toolchain with rust-src is there.
    Rustup => "rustup", Source::Toolchain;
    /// Debian's rustc, with a prebuilt `core` for `bpfel-unknown-none`.
    DebianRustc => "/usr/bin/rustc", Source::Apt("rustc-web");
    /// Links the XDP object (cargo runs it).
    BpfLinker => "bpf-linker", Source::CargoInstall("bpf-linker");

    // The kernel module and the C test programs.
    /// Kbuild.
    Make => "make", Source::Apt("make");
    /// Kbuild's compiler (Debian's trees call it `x86_64-linux-gnu-gcc-12`,
    /// of gcc's dependency gcc-12); the static C program for the guest.
    Gcc => "gcc", Source::Apt("gcc");
    /// The C compiler of leap-common's ABI test (`cargo test`).
    Cc => "cc", Source::Apt("gcc");
    /// BTF of modules built against a kernel with
    /// `CONFIG_DEBUG_INFO_BTF_MODULES` (Debian's 6.12); kbuild runs it.
    Pahole => "pahole", Source::Apt("dwarves");

    // The C library, its C++ drop-in and the Python package.
    /// Flags of the installed C library (`leap.pc`) for the C programs.
    PkgConfig => "pkg-config", Source::Apt("pkg-config");
    /// The C++ drop-in for the original engine, its tests and example.
    Gxx => "g++", Source::Apt("g++");
    /// Refreshes the loader's cache after `build --install` to a system prefix.
    Ldconfig => "ldconfig", Source::Apt("libc-bin");
    /// Creates the Python package's venv (`python3 -m venv`; or `$LEAP_PYTHON`).
    Python3 => "python3", Source::Apt("python3");

    // Debian's archive: headers and kernel images for the VM.
    /// Installs packages; downloads the 6.12 headers and kernel images.
    AptGet => "apt-get", Source::Apt("apt");
    /// Finds Debian's newest 6.12 kernel.
    AptCache => "apt-cache", Source::Apt("apt");
    /// Whether a package is installed; what the headers meta-package points at.
    DpkgQuery => "dpkg-query", Source::Apt("dpkg");
    /// Unpacks downloaded packages under target/vm.
    DpkgDeb => "dpkg-deb", Source::Apt("dpkg");

    // The VM.
    /// The guest, under TCG.
    Qemu => "qemu-system-x86_64", Source::Apt("qemu-system-x86");
    /// The guest's shell and tools (copied into the initramfs; static).
    Busybox => "busybox", Source::Apt("busybox-static");
    /// Shared libraries of the programs copied into the guest.
    Ldd => "ldd", Source::Apt("libc-bin");
    /// Smaller binaries for the initramfs.
    Strip => "strip", Source::Apt("binutils");
    /// Decompresses the kernel image's `.ko.xz` modules.
    Xz => "xz", Source::Apt("xz-utils");
    /// Decompresses the kernel image's `.ko.zst` modules.
    Zstd => "zstd", Source::Apt("zstd");

    // Namespaces, XDP and profiles: run by `leap` and the privileged tests,
    // on the host and in the guest.
    /// Namespaces, veth pairs, addresses, routes, XDP attachment.
    Ip => "ip", Source::Apt("iproute2");
    /// Loss and fault injection in the rings.
    Nft => "nft", Source::Apt("nftables");
    /// Per-namespace settings (rp_filter, busy polling).
    Sysctl => "sysctl", Source::Apt("procps");
    /// Runs a node with only the packaged unit's capabilities.
    Setpriv => "setpriv", Source::Apt("util-linux");
    /// Enters a node's namespace in the tests.
    Nsenter => "nsenter", Source::Apt("util-linux");
    /// `leap bench --profile`: where the CPU goes.
    Perf => "perf", Source::Apt("linux-perf");
    /// Which sockets a test's namespace still has open.
    Ss => "ss", Source::Apt("iproute2");

    // `leap bench --hosts ssh://...` and its privileged test.
    /// Starts the ring members on the hosts.
    Ssh => "ssh", Source::Apt("openssh-client");
    /// The test's host and client keys.
    SshKeygen => "ssh-keygen", Source::Apt("openssh-client");
    /// One server per test namespace (run by absolute path, /usr/sbin/sshd).
    Sshd => "sshd", Source::Apt("openssh-server");
}

impl Tool {
    /// The crate `cargo install` builds the program from.
    pub fn cargo_crate(self) -> Option<&'static str> {
        match self.source() {
            Source::CargoInstall(krate) => Some(krate),
            Source::Apt(_) | Source::Toolchain => None,
        }
    }

    /// `program (package)`, for messages.
    pub fn describe(self) -> String {
        match self.source() {
            Source::Apt(pkg) => format!("{} (Debian package {pkg})", self.program()),
            Source::Toolchain => format!("{} (Rust toolchain)", self.program()),
            Source::CargoInstall(krate) => format!("{} (cargo install {krate})", self.program()),
        }
    }
}

/// Directories searched after PATH: a non-root PATH on Debian lacks them,
/// and `nft`, `sysctl` live there.
const SBIN: &[&str] = &["/usr/local/sbin", "/usr/sbin", "/sbin"];

/// Where `tool`'s program is, if anywhere.
pub fn find(tool: Tool) -> Option<PathBuf> {
    let program = tool.program();
    if program.starts_with('/') {
        return executable(Path::new(program)).then(|| PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN.iter().map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A command for `tool`, installing its package first when it is missing.
///
/// # Errors
///
/// As [`ensure`].
pub fn command(tool: Tool) -> Result<Command> {
    ensure(&[tool])?;
    let found = find(tool).with_context(|| format!("{} is missing", tool.describe()))?;
    // By name when PATH finds it (shorter logs, and rustup's proxies pick
    // their toolchain from the name); by path from an sbin directory.
    let on_path =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool.program()) == found));
    Ok(Command::new(if on_path { PathBuf::from(tool.program()) } else { found }))
}

/// `cargo`: the one that runs the xtask (`$CARGO`) when set, so that
/// nested builds use the same toolchain; else [`Tool::Cargo`] from PATH.
///
/// # Errors
///
/// As [`ensure`].
pub fn cargo() -> Result<Command> {
    match std::env::var_os("CARGO") {
        Some(cargo) => Ok(Command::new(cargo)),
        None => command(Tool::Cargo),
    }
}

/// A command for another copy of `tool` at `path` (e.g. `$LEAP_BPF_RUSTC`
/// as [`Tool::Rustc`]).
pub fn command_at(tool: Tool, path: &Path) -> Command {
    debug_assert!(path.file_name().is_some(), "{tool:?} at {}", path.display());
    Command::new(path)
}

/// A program the project builds itself: `target/release/leap`, a test
/// binary. Nothing to install: the xtask built it.
pub fn built(path: &Path) -> Command {
    Command::new(path)
}

/// Packages installed (or tried) in this run.
static TRIED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

/// Makes sure every tool is there: as root, apt-get installs the packages
/// of the missing ones (each at most once per run).
///
/// # Errors
///
/// When a program is missing and cannot be installed here: the error names
/// its package and the command that installs it.
pub fn ensure(tools: &[Tool]) -> Result<()> {
    let missing: Vec<Tool> = tools.iter().copied().filter(|t| find(*t).is_none()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let (apt, other): (Vec<Tool>, Vec<Tool>) = missing.iter().partition(|t| matches!(t.source(), Source::Apt(_)));
    if let Some(tool) = other.first() {
        bail!("{}", missing_message(&[*tool], false));
    }
    let packages = packages_of(&apt);
    let fresh: Vec<&'static str> = {
        let tried = TRIED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        packages.iter().copied().filter(|p| !tried.contains(p)).collect()
    };
    if !util::is_root() {
        bail!("{}", missing_message(&apt, false));
    }
    if fresh.is_empty() {
        // Installed earlier in this run, and the program is still not there.
        bail!("{}", missing_message(&apt, true));
    }
    eprintln!(
        "tools: installing {} for {}",
        fresh.join(" "),
        apt.iter().map(|t| t.program()).collect::<Vec<_>>().join(", ")
    );
    install(&fresh)?;
    let still: Vec<Tool> = apt.into_iter().filter(|t| find(*t).is_none()).collect();
    if !still.is_empty() {
        bail!("{}", missing_message(&still, true));
    }
    Ok(())
}

/// The packages of `tools`, each once, in table order.
fn packages_of(tools: &[Tool]) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for t in tools {
        if let Source::Apt(p) = t.source()
            && !v.contains(&p)
        {
            v.push(p);
        }
    }
    v
}

/// The command that installs `packages`.
pub fn install_command(packages: &[&str]) -> String {
    format!("apt-get install -y {}", packages.join(" "))
}

/// Why `tools` are missing and what installs them; `tried` when root
/// already installed their packages in this run.
pub fn missing_message(tools: &[Tool], tried: bool) -> String {
    let names = tools.iter().map(|t| t.describe()).collect::<Vec<_>>().join(", ");
    let one = tools.len() == 1;
    let is = if one { "is" } else { "are" };
    if tools.iter().any(|t| t.cargo_crate().is_some()) {
        return format!("{names} {is} missing: `cargo xtask build-ebpf --install` builds it (as root)");
    }
    if tools.iter().any(|t| t.source() == Source::Toolchain) {
        return format!(
            "{names} {is} missing: install Rust with rustup (https://rustup.rs) and run `cargo xtask` again"
        );
    }
    let cmd = install_command(&packages_of(tools));
    if tried {
        format!("{names} {is} still missing after `{cmd}`")
    } else {
        format!(
            "{names} {is} missing and only root can install {}: run `{cmd}` as root (or with sudo)",
            if one { "it" } else { "them" }
        )
    }
}

/// Installs Debian packages that provide no program of the table
/// (headers, libraries: `linux-headers-amd64`, `libc6-dev`, `llvm-22-dev`)
/// when missing, as root.
///
/// # Errors
///
/// When something is missing and we are not root (naming the command that
/// installs it), or apt-get fails.
pub fn apt_install(packages: &[&'static str]) -> Result<()> {
    let missing: Vec<&'static str> = packages.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !util::is_root() {
        bail!(
            "missing Debian packages {} and only root can install them: run `{}` as root (or with sudo)",
            missing.join(" "),
            install_command(&missing)
        );
    }
    install(&missing)
}

/// Whether a Debian package is installed.
fn dpkg_installed(pkg: &str) -> bool {
    command(Tool::DpkgQuery).is_ok_and(|mut c| {
        util::output(c.args(["-W", "-f=${Status}", pkg])).is_ok_and(|s| s.contains("install ok installed"))
    })
}

/// `apt-get update`, once per run (root only).
///
/// # Errors
///
/// When not root, or apt-get fails.
pub fn apt_update() -> Result<()> {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !*done {
        if !util::is_root() {
            bail!("the package lists need `apt-get update`, which only root can run");
        }
        apt_get(&["update", "-qq"])?;
        *done = true;
    }
    Ok(())
}

/// `apt-get install` of `packages` (after one `apt-get update` per run).
fn install(packages: &[&'static str]) -> Result<()> {
    TRIED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(packages.iter().copied());
    apt_update()?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(packages);
    let _no_starts = NoServiceStarts::new();
    apt_get(&args)
}

/// Debian's `policy-rc.d` refusing every service start while packages are
/// installed: the tests run their own daemons (sshd in namespaces), and
/// installing openssh-server must not leave an sshd listening on port 22 of
/// the machine. Left alone where the machine already has one; removed
/// again on drop when this made it.
struct NoServiceStarts(Option<&'static std::path::Path>);

impl NoServiceStarts {
    const PATH: &'static str = "/usr/sbin/policy-rc.d";

    fn new() -> Self {
        use std::os::unix::fs::OpenOptionsExt;
        let path = std::path::Path::new(Self::PATH);
        // create_new: never replace what is there.
        let Ok(mut f) = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(path) else {
            return Self(None);
        };
        let script = b"#!/bin/sh\n# cargo xtask: no service starts while it installs packages\nexit 101\n";
        if let Err(e) = std::io::Write::write_all(&mut f, script) {
            eprintln!("xtask: {}: {e}; services may start while packages install", Self::PATH);
        }
        Self(Some(path))
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// How long apt-get waits for another apt or dpkg (another CI job).
const APT_LOCK_WAIT: Duration = Duration::from_secs(300);

/// apt-get, waiting up to [`APT_LOCK_WAIT`] for the locks of a concurrent
/// apt: `DPkg::Lock::Timeout` covers dpkg's locks, and a failure on another
/// lock (the package lists' in `update`) is retried until then.
fn apt_get(args: &[&str]) -> Result<()> {
    // Not `command`: it would try to install apt with apt.
    let program = find(Tool::AptGet).context("apt-get is missing: installing packages needs Debian's apt")?;
    let until = Instant::now() + APT_LOCK_WAIT;
    loop {
        let mut cmd = Command::new(&program);
        cmd.args(["-o", &format!("DPkg::Lock::Timeout={}", APT_LOCK_WAIT.as_secs())])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive");
        eprintln!("+ {}", util::show(&cmd));
        let (status, err) = util::run_teeing_stderr(&mut cmd, util::DEFAULT_LIMIT)?;
        if status.success() {
            return Ok(());
        }
        if !err.contains("Could not get lock") || Instant::now() >= until {
            bail!("{} failed: {status}", util::show(&cmd));
        }
        eprintln!("tools: another apt holds a lock; trying again in 5 s");
        std::thread::sleep(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_is_in_the_table_once() {
        let mut seen = BTreeSet::new();
        for t in Tool::ALL {
            assert!(seen.insert(t.program()), "{} is in the table twice", t.program());
            if let Source::Apt(pkg) = t.source() {
                assert!(!pkg.is_empty() && !pkg.contains(' '), "{t:?}: {pkg:?}");
            }
        }
    }

    #[test]
    fn a_missing_program_names_its_package_and_the_install_command() {
        let msg = missing_message(&[Tool::Pahole], false);
        assert!(msg.contains("pahole (Debian package dwarves)"), "{msg}");
        assert!(msg.contains("`apt-get install -y dwarves`"), "{msg}");
        assert!(msg.contains("root"), "{msg}");
        let msg = missing_message(&[Tool::Qemu, Tool::Setpriv, Tool::Nsenter], false);
        assert!(msg.contains("`apt-get install -y qemu-system-x86 util-linux`"), "{msg}");
        let msg = missing_message(&[Tool::BpfLinker], false);
        assert!(msg.contains("cargo xtask build-ebpf --install"), "{msg}");
    }

    /// Rust source cut into what the scan needs: code, and the text of
    /// string literals, each with its line; comments dropped.
    #[derive(Debug, PartialEq)]
    enum Token {
        Code(String),
        Str(String),
    }

    fn tokens(src: &str) -> Vec<(usize, Token)> {
        let b = src.as_bytes();
        let mut out = Vec::new();
        let (mut i, mut line, mut code, mut code_line) = (0, 1, String::new(), 1);
        while i < b.len() {
            let rest = &src[i..];
            let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
            if rest.starts_with("//") {
                i += rest.find('\n').unwrap_or(rest.len());
            } else if rest.starts_with("/*") {
                let mut depth = 0;
                while i < b.len() {
                    if src[i..].starts_with("/*") {
                        depth += 1;
                        i += 2;
                    } else if src[i..].starts_with("*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(b[i] == b'\n');
                        i += 1;
                    }
                }
            } else if let Some((open, close)) = string_start(rest).filter(|_| !ident_before) {
                flush(&mut code, code_line, &mut out);
                let body = &rest[open..];
                let (text, len) = if close == "\"" {
                    let (mut text, mut escaped, mut len) = (String::new(), false, body.len());
                    for (k, c) in body.char_indices() {
                        match (escaped, c) {
                            (false, '\\') => escaped = true,
                            (false, '"') => {
                                len = k;
                                break;
                            }
                            _ => {
                                text.push(c);
                                escaped = false;
                            }
                        }
                    }
                    (text, len)
                } else {
                    let len = body.find(close.as_str()).unwrap_or(body.len());
                    (body[..len].to_owned(), len)
                };
                out.push((line, Token::Str(text)));
                let end = (i + open + len + close.len()).min(src.len());
                line += src[i..end].matches('\n').count();
                i = end;
                code_line = line;
            } else if let Some(len) = char_literal(rest) {
                code.push_str("' '");
                i += len;
            } else {
                let c = rest.chars().next().unwrap_or(' ');
                if code.trim().is_empty() {
                    code_line = line;
                }
                line += usize::from(c == '\n');
                code.push(c);
                i += c.len_utf8();
            }
        }
        flush(&mut code, code_line, &mut out);
        out
    }

    fn flush(code: &mut String, line: usize, out: &mut Vec<(usize, Token)>) {
        if !code.trim().is_empty() {
            // From its first character on, which `line` is the line of.
            out.push((line, Token::Code(code.trim_start().to_owned())));
        }
        code.clear();
    }

    /// A string literal opening `rest`: the length of its opening
    /// (`"`, `r#"`, `br"`) and its closing (`"`, `"#`).
    fn string_start(rest: &str) -> Option<(usize, String)> {
        if rest.starts_with('"') {
            return Some((1, "\"".into()));
        }
        let raw = rest.strip_prefix("br").or_else(|| rest.strip_prefix('r'))?;
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        raw[hashes..]
            .starts_with('"')
            .then(|| (rest.len() - raw.len() + hashes + 1, format!("\"{}", "#".repeat(hashes))))
    }

    /// The length of a char literal opening `rest` (`'"'`, `'\''`), or
    /// `None` (a lifetime, or not a quote).
    fn char_literal(rest: &str) -> Option<usize> {
        let body = rest.strip_prefix('\'')?;
        if let Some(esc) = body.strip_prefix('\\') {
            // '\'' '\n' '\u{7f}': the quote after the escaped character.
            let first = esc.chars().next()?.len_utf8();
            return esc[first..].find('\'').map(|e| 1 + 1 + first + e + 1);
        }
        let c = body.chars().next()?;
        body[c.len_utf8()..].starts_with('\'').then(|| 1 + c.len_utf8() + 1)
    }

    /// Where `src` (the file `file` of xtask/src) starts a program other
    /// than through this module's table.
    fn scan(file: &str, src: &str) -> Vec<String> {
        let in_tools = file == "tools.rs";
        let toks = tokens(src);
        let mut found = Vec::new();
        for (k, (line, tok)) in toks.iter().enumerate() {
            match tok {
                Token::Code(code) if !in_tools && code.contains("Command::new") => {
                    for (at, _) in code.match_indices("Command::new") {
                        let line = line + code[..at].matches('\n').count();
                        found.push(format!(
                            "{file}:{line}: Command::new outside tools.rs: start programs with tools::command(Tool::...)"
                        ));
                    }
                }
                Token::Code(code) if in_tools && code.trim_end().ends_with("Command::new(") => {
                    if let Some((_, Token::Str(name))) = toks.get(k + 1) {
                        found.push(format!("{file}:{line}: Command::new(\"{name}\"): add `{name}` to the table"));
                    }
                }
                Token::Str(text) if !in_tools => {
                    if let Some(t) = Tool::ALL.iter().find(|t| t.program() == text) {
                        found.push(format!("{file}:{line}: \"{text}\" spelled out: use Tool::{t:?}"));
                    }
                }
                _ => {}
            }
        }
        found
    }

    #[test]
    fn the_scanner_reads_code_strings_and_comments_apart() {
        let src =
            "let a = \"x\\\"y\"; // Command::new(\"z\")\nlet c = '\"'; let r = r#\"q\"r\"#; fn f<'a>(s: &'a str) {}";
        let got = tokens(src);
        let strs: Vec<&str> = got
            .iter()
            .filter_map(|(_, t)| match t {
                Token::Str(s) => Some(s.as_str()),
                Token::Code(_) => None,
            })
            .collect();
        assert_eq!(strs, ["x\"y", "q\"r"]);
        assert!(got.iter().all(|(_, t)| !matches!(t, Token::Code(c) if c.contains("Command"))), "{got:?}");
        assert_eq!(got.last().map(|(l, _)| *l), Some(2));
    }

    #[test]
    fn the_scanner_finds_a_program_started_outside_the_table() {
        // What someone adding a program without its package would write.
        let added = "fn f() -> Result<()> {\n    util::run(Command::new(\"foo\").arg(\"-v\"))\n}\n";
        assert_eq!(
            scan("vm.rs", added),
            ["vm.rs:2: Command::new outside tools.rs: start programs with tools::command(Tool::...)"]
        );
        let qualified = "let out = std::process::Command::new(tool).output();";
        assert_eq!(scan("kmod.rs", qualified).len(), 1);
        // In this module, a name must come from the table, not a literal.
        assert_eq!(
            scan("tools.rs", "fn g() { Command::new(\"foo\").status(); }"),
            ["tools.rs:1: Command::new(\"foo\"): add `foo` to the table"]
        );
        // A table program spelled out elsewhere, e.g. for `find`.
        assert_eq!(
            scan("ebpf.rs", "if which(\"bpf-linker\").is_none() {}"),
            ["ebpf.rs:1: \"bpf-linker\" spelled out: use Tool::BpfLinker"]
        );
        // Through the table, or mentioned in comments and strings: fine.
        let fine = "// Command::new(\"foo\")\nlet s = \"Command::new(x)\";\nutil::run(tools::command(Tool::Qemu)?.arg(\"-m\"))?;\nlet b = tools::built(&leap);";
        assert_eq!(scan("vm.rs", fine), Vec::<String>::new());
        assert_eq!(scan("tools.rs", "Command::new(&program)"), Vec::<String>::new());
    }

    #[test]
    fn xtask_starts_programs_only_through_the_table() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src];
        let mut found = Vec::new();
        let mut scanned = 0;
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            } else if p.extension().is_some_and(|e| e == "rs") {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                found.extend(scan(&name, &std::fs::read_to_string(&p).unwrap()));
                scanned += 1;
            }
        }
        assert!(scanned >= 8, "scanned only {scanned} files");
        assert!(found.is_empty(), "programs started outside the table:\n{}", found.join("\n"));
    }
}
