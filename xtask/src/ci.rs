//! `cargo xtask ci`: every check CI makes, in order, failing on the first
//! problem. As root with `CI=true` nothing is skipped: a missing privilege or
//! tool is a failure.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::tools::{self, Tool};
use crate::util::{self, in_ci, is_root, run, run_for};

/// The stages, in the order they run.
pub const STAGES: &[&str] = &["deps", "fmt", "clippy", "test", "fuzz", "smoke", "privileged", "ebpf", "vm"];

/// Arguments of `cargo xtask ci`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run only these stages (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    stage: Vec<String>,
}

/// What `leap` and the privileged tests run on the host (namespaces, veth,
/// loss injection, the unit's capabilities).
const HOST_TOOLS: &[Tool] = &[Tool::Ip, Tool::Ss, Tool::Nft, Tool::Sysctl, Tool::Setpriv, Tool::Nsenter];

/// What the privileged test of `leap bench --hosts ssh://...` runs: a
/// client, keys, and an sshd in each of its namespaces.
const SSH_TOOLS: &[Tool] = &[Tool::Ssh, Tool::SshKeygen, Tool::Sshd];

/// For commands that compile the workspace from nothing on a fresh machine
/// (clippy, the tests); every other command gets [`util::DEFAULT_LIMIT`].
const BUILD_LIMIT: Duration = Duration::from_secs(40 * 60);

fn cargo() -> Result<Command> {
    let mut c = tools::cargo()?;
    c.current_dir(util::root());
    Ok(c)
}

/// Privileged test targets: `leap-user/tests/{netns,xdp}_*.rs`.
fn privileged_tests(root: &Path) -> Result<Vec<String>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(root.join("leap-user/tests")).context("reading leap-user/tests")? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".rs")
            && (stem.starts_with("netns_") || stem.starts_with("xdp_"))
        {
            v.push(stem.to_string());
        }
    }
    v.sort();
    Ok(v)
}

/// `cargo test` of one privileged test file, its ignored tests one at a time.
fn ignored_test(test: &str) -> Result<Command> {
    let mut c = cargo()?;
    c.args(["test", "--release", "--locked", "-p", "leap", "--test", test, "--", "--ignored", "--test-threads=1"]);
    Ok(c)
}

/// Needs root for namespaces, XDP and apt: outside CI, say so and skip;
/// in CI, fail.
fn require_root(stage: &str) -> Result<bool> {
    if is_root() {
        return Ok(true);
    }
    if in_ci() {
        bail!("stage {stage} needs root (network namespaces, XDP, apt) and CI=true forbids skipping it");
    }
    eprintln!("ci: SKIPPED stage {stage}: needs root (run as root, as CI does)");
    Ok(false)
}

/// Runs `leap ring` as the foundation issue's acceptance does and checks its JSON.
fn ring_smoke(leap: &Path, transport: &str, placement: &str, frames: u64) -> Result<()> {
    ring_smoke_with(leap, transport, placement, frames, &[]).map(drop)
}

/// Keyed rings in namespaces, TCP and UDP tagged and encrypted,
/// 16 392 B and 1 MiB frames, with 0 % and 5 % loss on every link: every
/// frame intact.
fn keyed_rings(leap: &Path, root: &Path) -> Result<()> {
    let dir = root.join("target/ci-keys");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let key = dir.join("ring.key");
    run(tools::built(leap).arg("key").arg("new").arg(&key))?;
    let key = key.to_str().context("a UTF-8 path")?;
    for (size, frames) in [("16392", 300), ("1048576", 40)] {
        for loss in ["0", "5"] {
            for (transport, enc) in [("tcp", false), ("tcp", true), ("udp", false), ("udp", true)] {
                let mut extra = vec!["--frame-size", size, "--key-file", key, "--loss", loss];
                if enc {
                    extra.push("--encrypt");
                }
                ring_smoke_with(leap, transport, "--netns", frames, &extra)?;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// [`ring_smoke`] with more arguments; returns the JSON report line and
/// what `leap ring` logged.
fn ring_smoke_with(
    leap: &Path,
    transport: &str,
    placement: &str,
    frames: u64,
    extra: &[&str],
) -> Result<(String, String)> {
    let mut cmd = tools::built(leap);
    cmd.args(["ring", "--transport", transport, "--nodes", "3", "--frames", &frames.to_string(), placement, "--json"]);
    if !extra.contains(&"--frame-size") {
        cmd.args(["--frame-size", "16392"]);
    }
    cmd.args(extra);
    eprintln!("+ {}", util::show(&cmd));
    let res = util::capture(&mut cmd, util::DEFAULT_LIMIT)?;
    let (out, log) = (String::from_utf8_lossy(&res.stdout), String::from_utf8_lossy(&res.stderr).into_owned());
    if !res.status.success() {
        bail!("{} failed: {}\n{log}", util::show(&cmd), res.status);
    }
    let last = out.lines().last().unwrap_or_default();
    let field = |k: &str| -> Option<u64> {
        let at = last.find(&format!("\"{k}\":"))? + k.len() + 3;
        last[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let (delivered, corrupt) = (field("frames_delivered"), field("frames_corrupt"));
    eprintln!("ci: ring {transport} {placement} {}: delivered {delivered:?}, corrupt {corrupt:?}", extra.join(" "));
    if delivered != Some(frames) || corrupt != Some(0) {
        bail!("leap ring --transport {transport} {placement}: expected {frames} intact frames, got: {last}");
    }
    Ok((last.to_string(), log))
}

/// A number field of a one-line JSON object.
fn json_number(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    line[at..].split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?.parse().ok()
}

/// 3-node namespace rings of `xdp` and `xdp-ringbuf` on veths at MTU 9000
/// (the frags program, multi-buffer packets, chunk trains), without and
/// with busy polling, each node with exactly the packaged unit's
/// capabilities: every frame intact, the multi-buffer program attached,
/// 16 392-byte frames in two datagrams per hop, busy polling accepted.
fn jumbo_rings(leap: &Path, obj: &Path) -> Result<()> {
    let obj = obj.to_string_lossy();
    for t in ["xdp", "xdp-ringbuf"] {
        for busy in [false, true] {
            let mut extra = vec!["--mtu", "9000", "--unit-caps", "--xdp-object", &obj];
            if busy {
                extra.push("--busy-poll");
            }
            let what = format!("leap ring --transport {t} {}", extra.join(" "));
            let (json, log) = ring_smoke_with(leap, t, "--netns", 300, &extra)?;
            if let Some(l) = log.lines().find(|l| l.contains("busy polling is off")) {
                bail!("{what}: the kernel refused busy polling: {l}");
            }
            if let Some(l) = log.lines().find(|l| l.contains(JUMBO_PLAIN_PROGRAM)) {
                bail!("{what}: the program without multi-buffer support was attached: {l}");
            }
            match json_number(&json, "datagrams_per_frame") {
                Some(d) if d <= 2.0 + 1e-9 => eprintln!("ci: {what}: {d:.2} datagrams per frame"),
                other => bail!("{what}: expected 2 datagrams per frame (trains of 6 chunks), got {other:?}: {json}"),
            }
        }
    }
    Ok(())
}

/// 3-node namespace rings of `udp` and `xdp` with busy polling, each node
/// with exactly the packaged unit's capabilities (CAP_NET_ADMIN among
/// them, so the kernel must take the busy-poll options): every frame
/// intact, and no node fell back to spinning alone.
fn busy_poll_rings(leap: &Path, obj: &Path) -> Result<()> {
    let obj = obj.to_string_lossy();
    for t in ["udp", "xdp"] {
        let (_, log) = ring_smoke_with(leap, t, "--netns", 300, &["--busy-poll", "--unit-caps", "--xdp-object", &obj])?;
        if let Some(l) = log.lines().find(|l| l.contains("busy polling is off")) {
            bail!("leap ring --transport {t} --busy-poll --unit-caps: the kernel refused busy polling: {l}");
        }
    }
    Ok(())
}

/// What `leap` logs when it attaches the XDP program without multi-buffer
/// support (which cannot attach at MTU 9000 on veth).
const JUMBO_PLAIN_PROGRAM: &str = "refuses the multi-buffer XDP program";

/// Every crate `leap --no-default-features` may depend on, directly or
/// through others: what an embedder who only moves frames compiles. Anything
/// else in that tree fails CI; the way out is to make the dependency
/// optional (behind `cli`, `ring`, `telemetry-server` or `tokio`), or to add
/// it here, in the commit that needs it, with the reason.
const CORE_ALLOWED: &[&str] = &[
    // The workspace.
    "leap",
    "leap-common",
    // System calls, sockets, the device's mmap.
    "libc",
    "nix",
    "socket2",
    "memmap2",
    "bitflags",
    "cfg-if",
    "memoffset",
    // XDP: loading the program and its maps (aya), the AF_XDP rings
    // (xdpilone), and what they pull in.
    "aya",
    "aya-obj",
    "aya-log",
    "aya-log-common",
    "xdpilone",
    "object",
    "crc32fast",
    "indexmap",
    "hashbrown",
    "foldhash",
    "equivalent",
    "num_enum",
    "num_enum_derive",
    "rustversion",
    "assert_matches",
    "once_cell",
    "scopeguard",
    "spin",
    "bytes",
    "memchr",
    // Keyed BLAKE2s for the ring-key proof of TCP connections (RustCrypto).
    "blake2",
    // AES-256-GCM tags and HKDF for the frames of keyed rings.
    "ring",
    "untrusted",
    "digest",
    "crypto-common",
    "block-buffer",
    "generic-array",
    "typenum",
    "subtle",
    // Chunk checksums, hello nonces, logging, typed errors.
    "crc32c",
    "getrandom",
    "log",
    "thiserror",
    "thiserror-impl",
    // Plain data: wire structs, counters and settings as JSON.
    "bytemuck",
    "bytemuck_derive",
    "serde",
    "serde_core",
    "serde_derive",
    "serde_json",
    "itoa",
    "zmij",
    // What the derive macros above are built with.
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
];

/// The targets leap runs on: `cargo tree` resolves the dependencies of
/// each, `[target.'cfg(..)'.dependencies]` included.
const CORE_TARGETS: &[&str] = &["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"];

/// The library without default features builds, and its whole normal
/// dependency tree is on [`CORE_ALLOWED`]: an embedder gets the transport
/// alone.
fn core_library() -> Result<()> {
    run(cargo()?.args(["build", "-p", "leap", "--no-default-features", "--locked"]))?;
    let mut tree = cargo()?;
    tree.args(["tree", "-p", "leap", "--no-default-features", "-e", "normal", "--prefix", "none", "--locked"]);
    for t in CORE_TARGETS {
        tree.args(["--target", t]);
    }
    let tree = util::output(&mut tree)?;
    let outside = not_allowed(&tree);
    if !outside.is_empty() {
        bail!(
            "`leap --no-default-features` depends on {}, not on the allowed list (CORE_ALLOWED in xtask/src/ci.rs): \
             make the dependency optional, behind the feature that needs it (`cli`, `ring`, `telemetry-server`, \
             `tokio`), or add the crate to the list with the reason (`cargo tree -p leap --no-default-features \
             -e normal -i CRATE` shows who pulls it in)",
            outside.join(", ")
        );
    }
    eprintln!("ci: the core library depends on {} crates, all on the allowed list", crate_names(&tree).len());
    Ok(())
}

/// The crate names of `cargo tree --prefix none` output: the first word of
/// each line (`aya v0.14.0`, `serde_derive v1.0.219 (proc-macro)`,
/// `hashbrown v0.15.2 (*)`), each once.
fn crate_names(tree: &str) -> std::collections::BTreeSet<&str> {
    tree.lines().filter_map(|l| l.split_whitespace().next()).collect()
}

/// The crates of `tree` that are not on [`CORE_ALLOWED`], sorted.
fn not_allowed(tree: &str) -> Vec<&str> {
    crate_names(tree).into_iter().filter(|c| !CORE_ALLOWED.contains(c)).collect()
}

/// Runs the stages.
///
/// # Errors
///
/// The first failing stage.
pub fn run_ci(args: Args) -> Result<()> {
    let root = util::root();
    util::use_test_build_profile();
    let want = |s: &str| args.stage.is_empty() || args.stage.iter().any(|a| a == s);
    for s in &args.stage {
        if !STAGES.contains(&s.as_str()) {
            bail!("unknown stage `{s}`; stages: {}", STAGES.join(", "));
        }
    }
    let mut passed = 0;
    let started = Instant::now();
    let mut stage = |name: &str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        if !want(name) {
            return Ok(());
        }
        let t = Instant::now();
        eprintln!("ci: === stage {name} ===");
        f().with_context(|| format!("stage {name} failed"))?;
        eprintln!("ci: stage {name} ok in {:.0} s", t.elapsed().as_secs_f64());
        passed += 1;
        Ok(())
    };
    stage("deps", &mut || {
        if require_root("deps")? {
            tools::ensure(HOST_TOOLS)?;
            tools::ensure(&[Tool::Cc, Tool::Gxx, Tool::PkgConfig])?;
            tools::apt_install(&["libc6-dev"])?;
        }
        Ok(())
    })?;
    stage("fmt", &mut || run(cargo()?.args(["fmt", "--all", "--check"])))?;
    stage("clippy", &mut || {
        // With the async layer (feature `tokio`), so that it and its example
        // are checked too.
        let all = ["clippy", "--workspace", "--all-targets", "--locked", "--features", "leap/tokio"];
        run_for(cargo()?.args(all).args(["--", "-D", "warnings"]), BUILD_LIMIT)?;
        // The library's public items against leap-user/public-api.txt.
        crate::public_api::verify()
    })?;
    stage("test", &mut || {
        // leap-common's ABI test compiles a C program.
        tools::ensure(&[Tool::Cc])?;
        tools::apt_install(&["libc6-dev"])?;
        run_for(cargo()?.args(["test", "--workspace", "--locked", "--features", "leap/tokio"]), BUILD_LIMIT)?;
        core_library()
    })?;
    stage("fuzz", &mut || {
        // Bounded: 20 s per target (chunk parser, reassembly, control decoder).
        run_for(
            cargo()?
                .args(["test", "--release", "--locked", "-p", "leap", "--test", "fuzz", "--", "--nocapture"])
                .env("LEAP_FUZZ_SECS", "20"),
            BUILD_LIMIT,
        )
    })?;
    stage("smoke", &mut || {
        run(cargo()?.args(["build", "--release", "--locked", "-p", "leap", "--bin", "leap"]))?;
        let leap = root.join("target/release/leap");
        for t in ["tcp", "udp"] {
            ring_smoke(&leap, t, "--loopback", 2000)?;
            // The embedding example: a toy 3-stage pipeline through the
            // lending API and split halves.
            run(cargo()?.args(["run", "--release", "--locked", "-p", "leap", "--example", "pipeline", "--", t]))?;
        }
        // The same pipeline on tokio.
        run(cargo()?
            .args(["run", "--release", "--locked", "-p", "leap", "--features", "tokio", "--example"])
            .arg("async_pipeline"))?;
        // The C library, installed, under its C tests.
        crate::capi::loopback(&crate::capi::prepare(None)?)?;
        // The C++ drop-in for the original engine, over the installed library.
        crate::cpp::loopback(&crate::cpp::prepare(None)?)?;
        // The Python package, its wheel built and installed from scratch,
        // and its loopback tests (the numpy pipeline among them).
        let python = crate::python::setup()?;
        python.stubtest()?;
        python.pytest(crate::python::LOOPBACK, &[])?;
        if require_root("smoke (namespaces)")? {
            tools::ensure(HOST_TOOLS)?;
            for t in ["tcp", "udp"] {
                ring_smoke(&leap, t, "--netns", 2000)?;
            }
            keyed_rings(&leap, &root)?;
        }
        Ok(())
    })?;
    stage("privileged", &mut || {
        if !require_root("privileged")? {
            return Ok(());
        }
        tools::ensure(HOST_TOOLS)?;
        tools::ensure(SSH_TOOLS)?;
        for t in privileged_tests(&root)? {
            if t.starts_with("xdp_") {
                // Needs the BPF object: run in the ebpf stage.
                continue;
            }
            run(&mut ignored_test(&t)?)?;
        }
        crate::python::setup()?.pytest("netns", &[])?;
        // Busy polling under the unit's capabilities (a few hundred frames).
        let obj = crate::ebpf::build_ebpf(true)?;
        run(cargo()?.args(["build", "--release", "--locked", "-p", "leap", "--bin", "leap"]))?;
        busy_poll_rings(&root.join("target/release/leap"), &obj)?;
        crate::capi::namespaces(&crate::capi::prepare(None)?)?;
        crate::cpp::namespaces(&crate::cpp::prepare(None)?)
    })?;
    stage("ebpf", &mut || {
        if !require_root("ebpf")? {
            return Ok(());
        }
        tools::ensure(HOST_TOOLS)?;
        let obj = crate::ebpf::build_ebpf(true)?;
        for t in privileged_tests(&root)?.into_iter().filter(|t| t.starts_with("xdp_")) {
            run(ignored_test(&t)?.env(crate::ebpf::OBJECT_ENV, &obj))?;
        }
        crate::python::setup()?.pytest("xdp", &[(crate::ebpf::OBJECT_ENV, &obj)])?;
        // With the object embedded, as the tests above built it (cargo
        // builds a package's binaries for its integration tests) and as the
        // C, C++ and VM builds after it do: the build script reruns when
        // `LEAP_XDP_OBJECT` changes, and each change rebuilds the library
        // (about 30 s each).
        run(cargo()?
            .args(["build", "--release", "--locked", "-p", "leap", "--bin", "leap"])
            .env(crate::ebpf::OBJECT_ENV, &obj))?;
        jumbo_rings(&root.join("target/release/leap"), &obj)?;
        crate::capi::xdp(&crate::capi::prepare(Some(&obj))?, &obj)?;
        crate::cpp::xdp(&crate::cpp::prepare(Some(&obj))?, &obj)
    })?;
    stage("vm", &mut || {
        if !require_root("vm")? {
            return Ok(());
        }
        // As `cargo xtask vm` with no arguments.
        crate::vm::run(crate::vm::Args::parse_words(&[]))
    })?;
    eprintln!("ci: all stages passed in {:.0} s", started.elapsed().as_secs_f64());
    println!("ci: {passed} passed, 0 failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers_are_read_by_key() {
        let line = r#"{"frames_delivered":300,"datagrams_per_frame":2.00,"gbit_per_s":1.5}"#;
        assert_eq!(json_number(line, "datagrams_per_frame"), Some(2.0));
        assert_eq!(json_number(line, "frames_delivered"), Some(300.0));
        assert_eq!(json_number(line, "missing"), None);
    }

    #[test]
    fn core_tree_of_allowed_crates_passes() {
        let tree = "leap v0.1.0 (/src/leap-user)\naya v0.14.0\nhashbrown v0.15.2 (*)\n\n\
                    serde_derive v1.0.219 (proc-macro)\nleap-common v0.1.0 (/src/leap-common)\n";
        assert!(not_allowed(tree).is_empty(), "{:?}", not_allowed(tree));
        assert_eq!(crate_names(tree).len(), 5);
    }

    #[test]
    fn crate_not_on_the_allowed_list_fails_the_core_tree() {
        let tree = "leap v0.1.0 (/src/leap-user)\ntokio v1.45.0\naya v0.14.0\nclap_lex v0.7.4\ntokio v1.45.0 (*)\n";
        assert_eq!(not_allowed(tree), ["clap_lex", "tokio"]);
        // Names are compared whole: a prefix of an allowed name is not allowed.
        assert_eq!(not_allowed("serde_yaml v0.9.0\nsyn v2.0.0\n"), ["serde_yaml"]);
    }
}
