//! The C library (`leap-user/capi`): installing `libleap.so`/`libleap.a`,
//! `leap.h` and `leap.pc` under a prefix (`cargo xtask build --install`),
//! and the C tests CI runs against what was installed: the API's error
//! paths, no frame-sized allocation per frame, the example ring of three C
//! processes (loopback, namespaces, XDP) and a run under AddressSanitizer.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::tools::{self, Tool};
use crate::util::{output, root, run};

/// The library's version (the workspace's) and its ABI major (the SONAME).
const VERSION: &str = env!("CARGO_PKG_VERSION");
const SONAME: &str = "libleap.so.0";
/// What a static link of `libleap.a` needs besides it (rustc's
/// `--print native-static-libs` for the crate).
const STATIC_LIBS: &str = "-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc";

/// Where `install` puts things under a prefix.
#[derive(Debug, Clone)]
pub struct Installed {
    pub prefix: PathBuf,
}

impl Installed {
    pub fn libdir(&self) -> PathBuf {
        self.prefix.join("lib")
    }

    fn pkgconfig(&self) -> PathBuf {
        self.libdir().join("pkgconfig")
    }

    /// `pkg-config ARGS leap` against this prefix.
    pub fn pkg_config(&self, args: &[&str]) -> Result<Vec<String>> {
        let out =
            output(tools::command(Tool::PkgConfig)?.args(args).arg("leap").env("PKG_CONFIG_PATH", self.pkgconfig()))?;
        Ok(out.split_whitespace().map(str::to_string).collect())
    }
}

fn cargo() -> Result<Command> {
    let mut c = tools::cargo()?;
    c.current_dir(root());
    Ok(c)
}

/// The `.pc` file for `prefix`.
fn pc_file(prefix: &Path) -> String {
    format!(
        "prefix={}\nexec_prefix=${{prefix}}\nlibdir=${{exec_prefix}}/lib\nincludedir=${{prefix}}/include\n\n\
         Name: leap\nDescription: leap: moves activation frames around a ring of machines (C API)\n\
         Version: {VERSION}\nLibs: -L${{libdir}} -lleap\nLibs.private: {STATIC_LIBS}\nCflags: -I${{includedir}}\n",
        prefix.display()
    )
}

/// Builds the C library (release; with the XDP object embedded when
/// `object` is given) and installs it, the header and the `.pc` file under
/// `prefix`: `lib/libleap.so.VERSION` with the `libleap.so.0` and
/// `libleap.so` links, `lib/libleap.a`, `include/leap.h`,
/// `lib/pkgconfig/leap.pc`. Runs `ldconfig` for a prefix the loader
/// searches (`/usr/local`, `/usr`).
///
/// # Errors
///
/// A failed build or copy.
pub fn install(prefix: &Path, object: Option<&Path>) -> Result<Installed> {
    let mut build = cargo()?;
    build.args(["build", "--release", "--locked", "-p", "leap-capi"]);
    if let Some(o) = object {
        build.env(crate::ebpf::OBJECT_ENV, o);
    }
    run(&mut build)?;
    let target = root().join("target/release");
    let inst = Installed { prefix: prefix.to_path_buf() };
    let (lib, include, pc) = (inst.libdir(), prefix.join("include"), inst.pkgconfig());
    for d in [&lib, &include, &pc] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let real = format!("libleap.so.{VERSION}");
    let copy = |from: &Path, to: &Path| {
        // Replace, never write into a library a running program has mapped.
        let _ = std::fs::remove_file(to);
        std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))
    };
    copy(&target.join("libleap.so"), &lib.join(&real))?;
    copy(&target.join("libleap.a"), &lib.join("libleap.a"))?;
    copy(&root().join("leap-user/capi/include/leap.h"), &include.join("leap.h"))?;
    for (link, to) in [(SONAME, real.as_str()), ("libleap.so", SONAME)] {
        let at = lib.join(link);
        let _ = std::fs::remove_file(&at);
        std::os::unix::fs::symlink(to, &at).with_context(|| format!("linking {}", at.display()))?;
    }
    std::fs::write(pc.join("leap.pc"), pc_file(prefix)).context("writing leap.pc")?;
    if ["/usr/local", "/usr"].iter().any(|p| Path::new(p) == prefix) {
        run(&mut tools::command(Tool::Ldconfig)?)?;
    }
    eprintln!("capi: installed {real}, libleap.a, include/leap.h and lib/pkgconfig/leap.pc under {}", prefix.display());
    Ok(inst)
}

/// The C programs of the tests, built against an installed library.
#[derive(Debug)]
pub struct Programs {
    /// The example ring stage (shared library).
    pub ring: PathBuf,
    /// The same with AddressSanitizer (static library).
    pub ring_asan: PathBuf,
    /// Every error path of the API (shared library).
    pub api: PathBuf,
    /// The same with AddressSanitizer (static library).
    pub api_asan: PathBuf,
    /// Allocations and copies per frame (shared library).
    pub alloc: PathBuf,
}

/// Compiles the C example and tests with `pkg-config --cflags --libs leap`
/// of `inst` into `out`.
///
/// # Errors
///
/// A compiler error, or pkg-config not finding the library.
pub fn build_programs(inst: &Installed, out: &Path) -> Result<Programs> {
    Ok(Programs {
        ring: build_ring(inst, out)?,
        ring_asan: cc(inst, "examples/ring.c", &out.join("ring-asan"), true)?,
        api: cc(inst, "tests/c/api.c", &out.join("api"), false)?,
        api_asan: cc(inst, "tests/c/api.c", &out.join("api-asan"), true)?,
        alloc: cc(inst, "tests/c/alloc.c", &out.join("alloc"), false)?,
    })
}

/// Compiles the C example ring stage (`examples/ring.c`) against `inst`'s
/// shared library into `out/ring`: CI's, and the C row of `cargo xtask
/// bench --bindings`.
///
/// # Errors
///
/// As [`build_programs`].
pub fn build_ring(inst: &Installed, out: &Path) -> Result<PathBuf> {
    cc(inst, "examples/ring.c", &out.join("ring"), false)
}

/// Compiles `source` (under `leap-user/capi`) into `bin`, with `pkg-config
/// --cflags --libs leap` of `inst` (and its directory as the run path), or
/// with AddressSanitizer against the static library.
fn cc(inst: &Installed, source: &str, bin: &Path, asan: bool) -> Result<PathBuf> {
    tools::ensure(&[Tool::Gcc, Tool::PkgConfig])?;
    tools::apt_install(&["libc6-dev"])?;
    if let Some(dir) = bin.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut c = tools::command(Tool::Gcc)?;
    c.args(["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg(root().join("leap-user/capi").join(source))
        .arg("-o")
        .arg(bin);
    if asan {
        // The static library: the whole program in one image.
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

/// Installs into a fresh prefix under `target/capi/` and builds the C
/// programs there.
///
/// # Errors
///
/// As [`install`] and [`build_programs`].
pub fn prepare(object: Option<&Path>) -> Result<Programs> {
    let base = root().join("target/capi");
    let prefix = base.join("prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let inst = install(&prefix, object)?;
    // The installed files are what the programs see, not the build tree.
    let libs = std::fs::read_dir(inst.libdir())?.filter_map(|e| e.ok()).count();
    if libs < 5 {
        bail!("{} holds {libs} entries after install", inst.libdir().display());
    }
    build_programs(&inst, &base.join("bin"))
}

/// The ring tests of `leap-user/capi/tests/c_ring.rs` whose names start
/// with `filter`, with the C programs (and the XDP object) in their
/// environment.
fn ring_tests(p: &Programs, filter: &str, object: Option<&Path>) -> Result<()> {
    let mut c = cargo()?;
    c.args(["test", "--release", "--locked", "-p", "leap-capi", "--test", "c_ring", "--", "--ignored"])
        .args(["--test-threads=1", filter])
        .env("LEAP_C_RING", &p.ring)
        .env("LEAP_C_RING_ASAN", &p.ring_asan);
    if let Some(o) = object {
        c.env(crate::ebpf::OBJECT_ENV, o);
    }
    run(&mut c)
}

/// The C tests that need no privilege: the API's error paths (UDP and TCP,
/// and under AddressSanitizer), allocations and copies per frame, and the
/// example ring of three processes over TCP and UDP on loopback (one of
/// them under AddressSanitizer).
///
/// # Errors
///
/// The first failing program.
pub fn loopback(p: &Programs) -> Result<()> {
    for kind in ["udp", "tcp"] {
        run(tools::built(&p.api).arg(kind))?;
        run(tools::built(&p.alloc).arg(kind))?;
    }
    run(tools::built(&p.api_asan).arg("udp").env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1"))?;
    ring_tests(p, "loopback_", None)
}

/// The example ring in network namespaces, over TCP and UDP (root).
///
/// # Errors
///
/// The first failing ring.
pub fn namespaces(p: &Programs) -> Result<()> {
    ring_tests(p, "netns_", None)
}

/// The example ring over XDP in namespaces, with the BPF object (root).
///
/// # Errors
///
/// The first failing ring.
pub fn xdp(p: &Programs, object: &Path) -> Result<()> {
    ring_tests(p, "xdp_", Some(object))
}
