//! The C++ drop-in for the original engine's transport classes
//! (`leap-user/capi/cpp`), built the way an engine builds it: its sources
//! with `g++ -std=c++20` against the installed libleap (`pkg-config
//! --cflags --libs leap`). What CI runs of it: the drop-in check (a
//! translation unit written only against the original interface, under
//! `-Wall -Wextra -Werror`), the API test (also under AddressSanitizer,
//! with the static library), and the engine-shaped example in rings
//! (`leap-user/tests/cpp_engine.rs`: loopback and the mixed rings in the
//! smoke stage, namespaces and 1 % loss in the privileged stage, XDP in the
//! ebpf stage).

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::capi::Installed;
use crate::tools::{self, Tool};
use crate::util::{root, run};

/// The C++ programs of the tests.
#[derive(Debug)]
pub struct Programs {
    /// The engine-shaped example (`examples/engine.cpp`).
    pub engine: PathBuf,
    /// Error behaviour, deadlines, control without reordering (`tests/api.cpp`).
    pub api: PathBuf,
    /// The same with AddressSanitizer (static library).
    pub api_asan: PathBuf,
    /// Written only against the original interface (`tests/original_api.cpp`).
    pub original_api: PathBuf,
}

/// The drop-in's sources: what an engine swaps in for its own.
const SOURCES: &[&str] = &["TcpTransport.cpp", "UdpTransport.cpp", "KernelTransport.cpp"];

/// Compiles the example and the tests with the drop-in's sources and
/// `pkg-config --cflags --libs leap` of `inst` into `out`.
///
/// # Errors
///
/// A compiler error (warnings are errors), or pkg-config not finding the
/// library.
pub fn build_programs(inst: &Installed, out: &Path) -> Result<Programs> {
    Ok(Programs {
        engine: build_engine(inst, out)?,
        api: cxx(inst, "tests/api.cpp", &out.join("api"), &["-O2", "-g"], false)?,
        api_asan: cxx(inst, "tests/api.cpp", &out.join("api-asan"), &["-O1", "-g"], true)?,
        original_api: cxx(inst, "tests/original_api.cpp", &out.join("original-api"), &[], false)?,
    })
}

/// Compiles the engine-shaped example (`examples/engine.cpp`) with the
/// drop-in's sources against `inst`'s shared library into `out/engine`:
/// CI's, and the C++ row of `cargo xtask bench --bindings`.
///
/// # Errors
///
/// As [`build_programs`].
pub fn build_engine(inst: &Installed, out: &Path) -> Result<PathBuf> {
    cxx(inst, "examples/engine.cpp", &out.join("engine"), &["-O2"], false)
}

/// Compiles `source` (under `leap-user/capi/cpp`) and the drop-in's
/// sources into `bin` with `flags`, with `pkg-config --cflags --libs leap`
/// of `inst` (and its directory as the run path), or with AddressSanitizer
/// against the static library.
fn cxx(inst: &Installed, source: &str, bin: &Path, flags: &[&str], asan: bool) -> Result<PathBuf> {
    tools::ensure(&[Tool::Gxx, Tool::PkgConfig])?;
    if let Some(dir) = bin.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let dir = root().join("leap-user/capi/cpp");
    let mut c = tools::command(Tool::Gxx)?;
    c.args(["-std=c++20", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .args(flags)
        .arg("-I")
        .arg(&dir)
        .arg(dir.join(source))
        .args(SOURCES.iter().map(|s| dir.join(s)))
        .arg("-o")
        .arg(bin);
    if asan {
        let private = inst.pkg_config(&["--static", "--libs-only-l"])?;
        c.args(["-fsanitize=address", "-fno-omit-frame-pointer"])
            .args(inst.pkg_config(&["--cflags"])?)
            .arg(inst.libdir().join("libleap.a"))
            .args(private.iter().filter(|l| *l != "-lleap"));
    } else {
        c.args(inst.pkg_config(&["--cflags", "--libs"])?).arg(format!("-Wl,-rpath,{}", inst.libdir().display()));
    }
    run(&mut c)?;
    Ok(bin.to_path_buf())
}

/// Installs the library into a prefix of its own under `target/cpp/` and
/// builds the C++ programs there.
///
/// # Errors
///
/// As [`crate::capi::install`] and [`build_programs`].
pub fn prepare(object: Option<&Path>) -> Result<Programs> {
    let base = root().join("target/cpp");
    let prefix = base.join("prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let inst = crate::capi::install(&prefix, object)?;
    build_programs(&inst, &base.join("bin"))
}

/// The ring tests of `leap-user/tests/cpp_engine.rs` whose names start with
/// `filter`, with the example (and the XDP object) in their environment.
fn ring_tests(p: &Programs, filter: &str, object: Option<&Path>) -> Result<()> {
    let mut c = tools::cargo()?;
    c.current_dir(root())
        .args(["test", "--release", "--locked", "-p", "leap", "--test", "cpp_engine", "--", "--ignored"])
        .args(["--test-threads=1", filter])
        .env("LEAP_CPP_ENGINE", &p.engine);
    if let Some(o) = object {
        c.env(crate::ebpf::OBJECT_ENV, o);
    }
    run(&mut c)
}

/// What needs no privilege: the drop-in check and the base class's
/// defaults, the API test (and under AddressSanitizer), and the example's
/// rings on loopback: three C++ nodes over tcp and udp, and mixed rings
/// with `leap node` and the original UDP stand-in.
///
/// # Errors
///
/// The first failing program or ring.
pub fn loopback(p: &Programs) -> Result<()> {
    run(&mut tools::built(&p.original_api))?;
    run(&mut tools::built(&p.api))?;
    run(tools::built(&p.api_asan).env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1"))?;
    ring_tests(p, "loopback_", None)
}

/// The example's rings across namespaces, over tcp and udp, and udp at 1 %
/// loss (root).
///
/// # Errors
///
/// The first failing ring.
pub fn namespaces(p: &Programs) -> Result<()> {
    ring_tests(p, "netns_", None)
}

/// The example's rings over the XDP paths (`LEAP_UDP_PATH=xdp`,
/// `xdp-ringbuf`) in namespaces, with the BPF object (root).
///
/// # Errors
///
/// The first failing ring.
pub fn xdp(p: &Programs, object: &Path) -> Result<()> {
    ring_tests(p, "xdp_", Some(object))
}
