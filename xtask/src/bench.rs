//! `cargo xtask bench`: the README's main job. Builds what it needs, runs
//! `leap bench` on the host (tcp, udp, xdp, xdp-ringbuf over veth between
//! namespaces) and inside the VM on Debian's 6.1 and 6.12 kernels (kmod next
//! to tcp, udp and xdp on the same kernel, for a fair comparison), and
//! merges them into one report, whatever guest failed. With `--bindings`
//! the host's rounds also run the same ring from C, C++ and Python
//! (`leap bench --ring-program`), built here against the installed libleap.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::tools::{self, Tool};
use crate::util::{self, is_root, run};
use crate::vm;

/// Arguments of `cargo xtask bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Short runs (about a minute on the host, a few in the VM).
    #[arg(long)]
    quick: bool,
    /// Where the merged report goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Skip the VM (no kernel-module figures).
    #[arg(long)]
    no_vm: bool,
    /// Rounds on the host, each running every transport once per size and
    /// mode (default: leap bench's).
    #[arg(long)]
    repeat: Option<usize>,
    /// Pin the host's ring nodes to these CPUs (leap bench --cpus).
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Host: also run udp and xdp with busy polling, in the same rounds
    /// (leap bench --busy-poll[=US]).
    #[arg(long, value_name = "US", num_args = 0..=1, default_missing_value = "50")]
    busy_poll: Option<u64>,
    /// Host: MTU of the veth pairs (leap bench --mtu).
    #[arg(long, value_name = "BYTES")]
    mtu: Option<u32>,
    /// Host: also drive the ring from C (`capi/examples/ring.c`), C++
    /// (`capi/cpp/examples/engine.cpp`) and Python
    /// (`python/examples/ring_latency.py`), one process per node, in the
    /// same rounds (rows KIND·c, KIND·cpp, KIND·python, next to KIND·rust).
    #[arg(long)]
    bindings: bool,
    /// Host: the frame sizes (leap bench --sizes; default: its own).
    #[arg(long, value_name = "BYTES,...")]
    sizes: Option<String>,
}

const BEGIN: &str = "LEAP_BENCH_JSON_BEGIN";
const END: &str = "LEAP_BENCH_JSON_END";

/// What `leap bench` runs on the host as root: namespaces and veth pairs.
const HOST_TOOLS: &[Tool] = &[Tool::Ip, Tool::Nft, Tool::Sysctl];

/// Runs the benchmark. A failing guest leaves the host figures and the
/// other guests' in the merged report.
///
/// # Errors
///
/// A failed build or host run; a failed guest, after the report is
/// written, as one line naming it.
pub fn run_bench(args: Args) -> Result<()> {
    let root = util::root();
    let out = if args.out.is_absolute() { args.out.clone() } else { root.join(&args.out) };
    std::fs::create_dir_all(&out)?;
    let leap = root.join("target/release/leap");
    let mut notes = Vec::new();
    let mut parts = Vec::new();
    if is_root() {
        tools::ensure(HOST_TOOLS)?;
        // The XDP object (toolchain installed if missing), then leap with it.
        crate::ebpf::build(true, true)?;
    } else {
        run(tools::cargo()?.current_dir(&root).args([
            "build",
            "--release",
            "--locked",
            "-p",
            "leap",
            "--bin",
            "leap",
        ]))?;
        notes.push(
            "not run as root: host figures are loopback TCP and UDP only; XDP, namespaces and the VM (kernel module) \
             need root"
                .to_string(),
        );
    }
    let host = out.join("host");
    let mut cmd = tools::built(&leap);
    cmd.args(["bench", "--site", "host", "--out"]).arg(&host);
    if is_root() {
        cmd.args(["--transports", "tcp,udp,xdp,xdp-ringbuf"]);
        // The profile says where the CPU goes; without perf the figures still count.
        match tools::ensure(&[Tool::Perf]) {
            Ok(()) => {
                cmd.arg("--profile");
            }
            Err(e) => eprintln!("bench: no perf ({e:#}): the report will have no profile"),
        }
    } else {
        cmd.args(["--transports", "tcp,udp"]);
    }
    if args.quick {
        cmd.arg("--quick");
    }
    if let Some(r) = args.repeat {
        cmd.args(["--repeat", &r.to_string()]);
    }
    if let Some(c) = &args.cpus {
        cmd.args(["--cpus", c]);
    }
    if let Some(us) = args.busy_poll {
        cmd.arg(format!("--busy-poll={us}"));
    }
    if let Some(m) = args.mtu {
        cmd.args(["--mtu", &m.to_string()]);
    }
    if let Some(s) = &args.sizes {
        cmd.args(["--sizes", s]);
    }
    if args.bindings {
        let object = is_root().then(|| root.join(crate::ebpf::OBJECT_PATH));
        for (name, command) in bindings(object.as_deref())? {
            cmd.arg("--ring-program").arg(format!("{name}={command}"));
        }
        if let Some(o) = &object {
            // The Python wheel embeds no XDP object: every ring loads this one.
            cmd.arg("--xdp-object").arg(o);
        }
    }
    util::run_for(&mut cmd, HOST_LIMIT)?;
    parts.push(host.join("report.json"));
    let mut failures = Vec::new();
    if is_root() && !args.no_vm {
        let guests = vm_bench(args.quick, &out);
        for (kernel, report) in &guests.reports {
            parts.push(report.clone());
            eprintln!("bench: guest figures of {kernel} in {}", report.display());
        }
        failures = guests.failures;
        if !guests.reports.is_empty() {
            notes.push(
                "figures of sites `vm-*` come from a qemu guest (Debian's kernel of that version) under software \
                 emulation (TCG): compare them only with each other, never with `host` figures"
                    .into(),
            );
        }
        for f in &failures {
            notes.push(format!("no guest figures from {f}"));
        }
    } else if !args.no_vm {
        notes.push("the kernel module was not measured: the VM needs root (apt, qemu)".into());
    }
    let mut merge = tools::built(&leap);
    merge.arg("bench").arg("--out").arg(&out);
    for p in &parts {
        merge.arg("--merge").arg(p);
    }
    for n in &notes {
        merge.args(["--note", n]);
    }
    run(&mut merge)?;
    eprintln!("bench: report in {}/report.md (and .json, .svg)", out.display());
    if !failures.is_empty() {
        bail!("bench: the guest part failed: {}; the report keeps the figures measured", failures.join("; "));
    }
    Ok(())
}

/// The bindings' ring programs for `leap bench --ring-program`, built from
/// scratch: libleap (with the XDP `object` embedded) installed under
/// `target/bench/prefix`, the C example and the C++ engine-shaped example
/// compiled against it, the Python package's venv set up; each speaks the
/// ring-program protocol (`--copy`: frames passed on unchanged).
///
/// # Errors
///
/// A failed build, install or set-up.
fn bindings(object: Option<&Path>) -> Result<Vec<(&'static str, String)>> {
    let root = util::root();
    let base = root.join("target/bench");
    let prefix = base.join("prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let inst = crate::capi::install(&prefix, object)?;
    let c = crate::capi::build_ring(&inst, &base.join("bin"))?;
    let cpp = crate::cpp::build_engine(&inst, &base.join("bin"))?;
    let venv = crate::python::setup()?;
    let script = root.join("leap-user/python/examples/ring_latency.py");
    let programs = vec![
        ("c", format!("{} --copy", c.display())),
        ("cpp", format!("{} --copy", cpp.display())),
        ("python", format!("{} {}", venv.python().display(), script.display())),
    ];
    // leap bench splits a command at white space.
    if let Some((name, cmd)) = programs.iter().find(|(_, cmd)| cmd.split_whitespace().count() != 2) {
        bail!("bench --bindings: the {name} program's path has white space in it ({cmd}): move the checkout");
    }
    Ok(programs)
}

/// The host's `leap bench`: every transport, size and mode, rounds, profiles.
const HOST_LIMIT: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// What the guests measured.
#[derive(Debug, Default)]
struct GuestReports {
    /// `(kernel, report.json)` of every guest that produced one.
    reports: Vec<(String, PathBuf)>,
    /// `kernel: why`, on one line each, for every guest that did not.
    failures: Vec<String>,
}

/// Runs `leap bench` inside each of Debian's LTS kernels in the VM and
/// keeps each guest's report.json as `out/vm-<kernel>.json`; a guest that
/// fails costs only its own figures.
fn vm_bench(quick: bool, out: &Path) -> GuestReports {
    let sizes = if quick { "16392,262152" } else { "16392,32776,262152" };
    // One round under the normal scheduler, as before rounds and real-time
    // threads: emulated figures are compared only with each other. The
    // site names the kernel (vm-6.1, vm-6.12); the report on one line.
    let script = format!(
        "leap bench --site vm-$(uname -r | cut -d. -f1,2) --transports tcp,kmod,udp,xdp --sizes {sizes} --repeat 1 \
         --sched normal --quick --out /tmp/vb >/dev/null \
         && echo {BEGIN} && tr -d '\\n' </tmp/vb/report.json && echo && echo {END}"
    );
    let mut got = GuestReports::default();
    let guests = match vm::run_guests(&vm::Args::parse_words(&["--", "sh", "-c", &script])) {
        Ok(g) => g,
        Err(e) => {
            got.failures.push(format!("the VM: {}", first_line(&format!("{e:#}"))));
            return got;
        }
    };
    for g in guests {
        let report = g.outcome.and_then(|console| match between_markers(&console.lines) {
            Some(json) => Ok(json),
            None => console.verdict().and_then(|_| bail!("the guest printed no report")),
        });
        let written = report.and_then(|json| {
            let dest = out.join(format!("vm-{}.json", g.kernel));
            std::fs::write(&dest, json)?;
            Ok(dest)
        });
        match written {
            Ok(dest) => got.reports.push((g.kernel, dest)),
            Err(e) => got.failures.push(format!("{}: {}", g.kernel, first_line(&format!("{e:#}")))),
        }
    }
    got
}

/// The lines between [`BEGIN`] and [`END`] (the guest's report.json).
fn between_markers(lines: &[String]) -> Option<String> {
    let begin = lines.iter().position(|l| l.trim() == BEGIN)?;
    let len = lines[begin + 1..].iter().position(|l| l.trim() == END)?;
    let json = lines[begin + 1..begin + 1 + len].join("\n");
    (!json.trim().is_empty()).then_some(json)
}

/// The first line of a message (an error may carry a command's stderr).
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_report_is_taken_from_between_the_markers() {
        let lines: Vec<String> =
            ["LEAP_VM: booted 6.1.0-57-amd64, 2 cpus", BEGIN, "{\"rows\":[]}", "", END, "LEAP_VM_EXIT=0"]
                .map(String::from)
                .into();
        assert_eq!(between_markers(&lines).as_deref(), Some("{\"rows\":[]}\n"));
        // The guest died while printing: no report rather than half of one.
        assert_eq!(between_markers(&lines[..3]), None);
        assert_eq!(between_markers(&[BEGIN.to_string(), END.to_string()]), None);
    }

    #[test]
    fn a_failure_is_reported_on_one_line() {
        assert_eq!(first_line("make failed: exit status: 2\nstderr..."), "make failed: exit status: 2");
    }
}
