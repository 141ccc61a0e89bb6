//! `cargo xtask bench`: the README's main job. Builds what it needs, runs
//! `leap bench` on the host (tcp, udp, xdp, xdp-ringbuf over veth between
//! namespaces) and inside the VM (kmod next to udp and xdp on the same 6.1
//! kernel, for a fair comparison), and merges both into one report.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::util::{self, is_root, run};

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
}

const BEGIN: &str = "LEAP_BENCH_JSON_BEGIN";
const END: &str = "LEAP_BENCH_JSON_END";

/// Runs the benchmark.
///
/// # Errors
///
/// A failed build or run.
pub fn run_bench(args: Args) -> Result<()> {
    let root = util::root();
    let out = if args.out.is_absolute() { args.out.clone() } else { root.join(&args.out) };
    std::fs::create_dir_all(&out)?;
    let leap = root.join("target/release/leap");
    let mut notes = Vec::new();
    let mut parts = Vec::new();
    if is_root() {
        // The XDP object (toolchain installed if missing), then leap with it.
        crate::ebpf::build(true, true)?;
    } else {
        run(Command::new("cargo").current_dir(&root).args([
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
    let mut cmd = Command::new(&leap);
    cmd.args(["bench", "--site", "host", "--out"]).arg(&host);
    if is_root() {
        cmd.args(["--transports", "tcp,udp,xdp,xdp-ringbuf"]);
        // The profile says where the CPU goes; without perf the figures still count.
        match util::apt_install(&["linux-perf"]) {
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
    run(&mut cmd)?;
    parts.push(host.join("report.json"));
    if is_root() && !args.no_vm {
        let vm_json = out.join("vm.json");
        vm_bench(args.quick, &vm_json)?;
        parts.push(vm_json);
        notes.push(
            "figures marked `vm` come from a qemu guest under software emulation (TCG): compare them only with each \
             other, never with `host` figures"
                .into(),
        );
    } else if !args.no_vm {
        notes.push("the kernel module was not measured: the VM needs root (apt, qemu)".into());
    }
    let mut merge = Command::new(&leap);
    merge.arg("bench").arg("--out").arg(&out);
    for p in &parts {
        merge.arg("--merge").arg(p);
    }
    for n in &notes {
        merge.args(["--note", n]);
    }
    run(&mut merge)?;
    eprintln!("bench: report in {}/report.md (and .json, .svg)", out.display());
    Ok(())
}

/// Runs `leap bench` inside the VM and extracts its report.json from the
/// console.
fn vm_bench(quick: bool, dest: &std::path::Path) -> Result<()> {
    let sizes = if quick { "16392,262152" } else { "16392,32776,262152" };
    // One round under the normal scheduler, as before rounds and real-time
    // threads: emulated figures are compared only with each other.
    let script = format!(
        "leap bench --site vm --transports tcp,kmod,udp,xdp --sizes {sizes} --repeat 1 --sched normal --quick \
         --out /tmp/vb >/dev/null \
         && echo {BEGIN} && cat /tmp/vb/report.json && echo && echo {END}"
    );
    let object = crate::ebpf::build_ebpf(true)?;
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(util::root())
        .args(["run", "--quiet", "--release", "--package", "xtask", "--", "vm", "--", "sh", "-c", &script])
        .env(crate::ebpf::OBJECT_ENV, &object)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the VM")?;
    let mut json = String::new();
    let mut inside = false;
    for line in BufReader::new(child.stdout.take().context("VM output")?).lines() {
        let line = line?;
        let t = line.trim_end_matches('\r');
        if t.contains(BEGIN) {
            inside = true;
        } else if t.contains(END) {
            inside = false;
        } else if inside {
            json.push_str(t);
            json.push('\n');
        } else {
            println!("{t}");
        }
    }
    let status = child.wait()?;
    if !status.success() || json.trim().is_empty() {
        bail!("the VM benchmark failed ({status}); run `cargo xtask vm -- leap bench --quick` to see why");
    }
    std::fs::write(dest, json)?;
    Ok(())
}
