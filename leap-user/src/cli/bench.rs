//! `leap bench`: the measurement users come for.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use super::TransportArgs;
use crate::bench::programs::{self, RingProgram};
use crate::bench::sched::{self, Sched};
use crate::bench::ssh::{HostAddr, SshHost, SshHostsFile, SshLauncher, SshRings, SshTarget};
use crate::bench::{BenchConfig, BenchReport, DEFAULT_SIZES, Rings, run, run_on};
use crate::ring::Placement;
use crate::serve::coordinator::{HostRings, HostSpec, HostsFile};
use crate::transport::open::TransportKind;

/// Rounds of `leap bench --quick`, and of the full benchmark.
const QUICK_ROUNDS: usize = 3;
const FULL_ROUNDS: usize = 7;

/// Arguments of `leap bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Short runs, fewer rounds, two sizes: about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Directory for report.json, report.md and report.svg.
    #[arg(long, default_value = "leap-bench")]
    pub out: PathBuf,
    /// Transports to measure (comma-separated; default: all this host can run).
    #[arg(long, value_delimiter = ',')]
    pub transports: Vec<TransportKind>,
    /// Frame sizes in bytes (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Nodes in the ring.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Rounds: each runs every transport once per size and mode, the order
    /// rotating; medians over the rounds are reported (default 7, or 3
    /// with --quick).
    #[arg(long)]
    pub repeat: Option<usize>,
    /// Measure on loopback even as root (default: namespaces as root).
    #[arg(long)]
    pub loopback: bool,
    /// Label of this machine in the report.
    #[arg(long, default_value = "host")]
    pub site: String,
    /// Do not measure: merge these report.json files into one report.
    #[arg(long, value_name = "JSON")]
    pub merge: Vec<PathBuf>,
    /// Add this remark to the report.
    #[arg(long)]
    pub note: Vec<String>,
    /// Also run each transport once under `perf record -a` (first frame
    /// size, one in flight) and report where the CPU went.
    #[arg(long)]
    pub profile: bool,
    /// Run the rings across these hosts instead (comma-separated, ring
    /// order; the first is the head): `ssh://[USER@]HOST[:PORT]` starts
    /// each member over ssh (batch mode, your keys and known_hosts), or
    /// ADDR:PORT is a `leap serve` agent's control address.
    #[arg(long, value_delimiter = ',', value_name = "HOST,...", conflicts_with = "hosts_file")]
    pub hosts: Vec<HostAddr>,
    /// With ssh:// hosts: an ssh option (`-o OPTION`, e.g.
    /// IdentityFile=PATH, UserKnownHostsFile=PATH). Repeatable.
    #[arg(long, value_name = "OPTION")]
    pub ssh_option: Vec<String>,
    /// With ssh:// hosts: the leap binary on the hosts (default: `leap`,
    /// on the PATH of their non-interactive shell).
    #[arg(long, value_name = "PATH")]
    pub remote_leap: Option<String>,
    /// The hosts from a TOML file: `token_file`, and `[[host]]` tables with
    /// `name`, `control`, `data` and `iface`; or, started over ssh,
    /// `ssh_options`, `remote_leap`, and `[[host]]` tables with `name`,
    /// `ssh` (ssh://[USER@]HOST[:PORT]), `data` and `iface`.
    #[arg(long, value_name = "PATH")]
    pub hosts_file: Option<PathBuf>,
    /// With --hosts: each host's data address (default: its control IP,
    /// port 9999).
    #[arg(long, value_delimiter = ',', value_name = "ADDR:PORT,...", requires = "hosts")]
    pub data: Vec<SocketAddr>,
    /// With --hosts: each host's interface the frames arrive on (XDP).
    #[arg(long, value_delimiter = ',', value_name = "IFACE,...", requires = "hosts")]
    pub ifaces: Vec<String>,
    /// File with the agents' shared token (default: the hosts file's
    /// `token_file`, else /etc/leap/serve.token).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// How the ring threads on this host are scheduled: `rr` (real-time
    /// round-robin, so that other work cannot take their CPU mid-round-trip)
    /// or `normal` (default: rr as root without --spin-us, else normal).
    #[arg(long, value_enum)]
    pub sched: Option<Sched>,
    /// MTU of the benchmark's veth pairs (namespaces only; default 1500).
    /// With --busy-poll, the datagram transports also run with busy
    /// polling in the same rounds (`udp+bp`, `xdp+bp`).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(1500..=65535))]
    pub mtu: Option<u32>,
    /// Also run the ring with this program as every member, one process
    /// per node, in the same rounds (rows KIND·NAME, one frame in flight;
    /// the protocol is in the README, "Benchmarking the bindings");
    /// COMMAND is split at spaces. Repeatable. Rust as processes (`leap
    /// bench-member`, rows KIND·rust) is measured with them.
    #[arg(long, value_name = "NAME=COMMAND")]
    pub ring_program: Vec<RingProgram>,
    /// Backend options.
    #[command(flatten)]
    pub transport_args: TransportArgs,
}

/// Whether a hosts file's `[[host]]` tables name ssh:// hosts.
fn is_ssh_hosts_file(text: &str) -> bool {
    let v: toml::Value = toml::from_str(text).unwrap_or(toml::Value::Boolean(false));
    v.get("host").and_then(toml::Value::as_array).is_some_and(|h| h.iter().any(|t| t.get("ssh").is_some()))
}

/// How the members of rings across hosts start.
enum Launch {
    /// Each host's `leap serve`, with the token in this file.
    Agents(Vec<HostSpec>, PathBuf),
    /// Over ssh.
    Ssh(Vec<SshHost>, SshLauncher),
}

/// The hosts of `--hosts` or `--hosts-file`, and how their members start,
/// if given.
fn hosts(args: &BenchArgs) -> Result<Option<Launch>> {
    let default_token = || PathBuf::from("/etc/leap/serve.token");
    if let Some(p) = &args.hosts_file {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        if is_ssh_hosts_file(&text) {
            if args.token_file.is_some() {
                bail!("--token-file is the agents' token: hosts started over ssh need none");
            }
            let f: SshHostsFile = toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
            let hosts = f.hosts().map_err(anyhow::Error::msg).with_context(|| format!("in {}", p.display()))?;
            // The command line's options first: ssh keeps an option's first value.
            let options = args.ssh_option.iter().chain(&f.ssh_options).cloned().collect();
            let remote = args.remote_leap.clone().or(f.remote_leap);
            let launcher = SshLauncher::new(options, remote, args.transport_args.xdp_object.clone())?;
            return Ok(Some(Launch::Ssh(hosts, launcher)));
        }
        if !args.ssh_option.is_empty() || args.remote_leap.is_some() {
            bail!("--ssh-option and --remote-leap apply to ssh://... hosts, not to `leap serve` agents");
        }
        let f: HostsFile = toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
        let token = args.token_file.clone().or(f.token_file).unwrap_or_else(default_token);
        return Ok(Some(Launch::Agents(f.hosts, token)));
    }
    if args.hosts.is_empty() {
        if !args.ssh_option.is_empty() || args.remote_leap.is_some() {
            bail!("--ssh-option and --remote-leap apply to ssh://... hosts (--hosts or --hosts-file)");
        }
        return Ok(None);
    }
    let n = args.hosts.len();
    if !args.data.is_empty() && args.data.len() != n {
        bail!("--data: {} addresses for {n} hosts", args.data.len());
    }
    if !args.ifaces.is_empty() && args.ifaces.len() != n {
        bail!("--ifaces: {} interfaces for {n} hosts", args.ifaces.len());
    }
    let targets: Vec<SshTarget> =
        args.hosts.iter().filter_map(|h| if let HostAddr::Ssh(t) = h { Some(t.clone()) } else { None }).collect();
    if !targets.is_empty() {
        if targets.len() != n {
            bail!("--hosts: either every host is ssh://... or every host is a `leap serve` agent's ADDR:PORT");
        }
        if args.token_file.is_some() {
            bail!("--token-file is the agents' token: hosts started over ssh need none");
        }
        let hosts = targets
            .into_iter()
            .enumerate()
            .map(|(i, t)| SshHost::new(i, t, args.data.get(i).copied(), args.ifaces.get(i).cloned()))
            .collect::<Result<Vec<_>, String>>()
            .map_err(anyhow::Error::msg)?;
        let launcher = SshLauncher::new(
            args.ssh_option.clone(),
            args.remote_leap.clone(),
            args.transport_args.xdp_object.clone(),
        )?;
        return Ok(Some(Launch::Ssh(hosts, launcher)));
    }
    if !args.ssh_option.is_empty() || args.remote_leap.is_some() {
        bail!("--ssh-option and --remote-leap apply to ssh://... hosts, not to `leap serve` agents");
    }
    let specs = args
        .hosts
        .iter()
        .filter_map(|h| if let HostAddr::Agent(a) = h { Some(*a) } else { None })
        .enumerate()
        .map(|(i, control)| HostSpec {
            name: format!("h{i}"),
            control,
            data: args.data.get(i).copied().unwrap_or(SocketAddr::new(control.ip(), leap_common::DEFAULT_PORT)),
            iface: args.ifaces.get(i).cloned(),
            token_file: None,
        })
        .collect();
    Ok(Some(Launch::Agents(specs, args.token_file.clone().unwrap_or_else(default_token))))
}

impl clap::builder::ValueParserFactory for TransportKind {
    type Parser = clap::builder::ValueParser;
    fn value_parser() -> Self::Parser {
        clap::builder::ValueParser::new(|s: &str| s.parse::<TransportKind>())
    }
}

/// Runs `leap bench`.
///
/// # Errors
///
/// Bad arguments, a failed floor measurement, or unwritable output.
pub fn main(args: &BenchArgs) -> Result<()> {
    if args.transport_args.key_file.is_some() && (!args.hosts.is_empty() || args.hosts_file.is_some()) {
        // Never a plain figure under a keyed name.
        bail!(
            "--key-file with --hosts: keyed rows are measured on this host's rings only (the agents key \
             their tcp members with a per-run key of their own); drop one of the two"
        );
    }
    if !args.merge.is_empty() {
        let mut merged: Option<BenchReport> = None;
        for p in &args.merge {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let r: BenchReport = serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
            match &mut merged {
                Some(m) => m.merge(r),
                None => merged = Some(r),
            }
        }
        let mut m = merged.expect("at least one file");
        m.notes.extend(args.note.iter().cloned());
        for f in m.write(&args.out)? {
            println!("{}", f.display());
        }
        return Ok(());
    }
    if !(2..=16).contains(&args.nodes) {
        bail!("--nodes {}: the benchmark ring has 2..=16 nodes", args.nodes);
    }
    let sizes = if !args.sizes.is_empty() {
        args.sizes.clone()
    } else if args.quick {
        vec![16_392, 262_152]
    } else {
        DEFAULT_SIZES.to_vec()
    };
    let min = leap_common::control::CONTROL_FRAME_MIN;
    if let Some(bad) = sizes.iter().find(|&&s| s < min || s > crate::ring::MAX_FRAME) {
        bail!("--sizes: {bad} is outside {min}..={} bytes", crate::ring::MAX_FRAME);
    }
    let transports = if args.transports.is_empty() { TransportKind::ALL.to_vec() } else { args.transports.clone() };
    let hosts = hosts(args)?;
    if hosts.is_some()
        && (args.profile
            || !args.transport_args.cpus.is_empty()
            || args.loopback
            || args.sched.is_some()
            || args.transport_args.busy_poll.is_some()
            || !args.ring_program.is_empty())
    {
        bail!(
            "--profile, --cpus, --loopback, --sched, --busy-poll and --ring-program apply to rings on this host, not \
             to --hosts (the members across hosts do not take them)"
        );
    }
    let ring_programs = ring_programs(&args.ring_program)?;
    let root = crate::sys::is_root();
    let placement = if hosts.is_some() {
        Placement::Hosts
    } else if root && !args.loopback {
        Placement::Netns
    } else {
        Placement::Loopback
    };
    if args.mtu.is_some() && placement != Placement::Netns {
        bail!("--mtu sets the MTU of the veth pairs between namespaces: run as root, without --loopback and --hosts");
    }
    let mut notes = args.note.clone();
    if let Some(m) = args.mtu {
        notes.push(format!("{}: veth pairs at MTU {m} (--mtu)", args.site));
    }
    if let Some(us) = args.transport_args.busy_poll {
        notes.push(format!(
            "{}: `+bp` rows ran with busy polling (--busy-poll={us}: SO_BUSY_POLL {us} us, SO_PREFER_BUSY_POLL, \
             a {us} us spin before sleeping) in the same rounds as the rows without it",
            args.site
        ));
    }
    let mut rings: Option<Box<dyn Rings>> = match hosts {
        Some(Launch::Agents(specs, token_file)) => {
            let names: Vec<String> = specs.iter().map(|h| format!("{} ({})", h.name, h.control)).collect();
            eprintln!("leap bench: connecting to {}", names.join(", "));
            Some(Box::new(HostRings::connect_files(specs, &token_file, &args.site)?))
        }
        Some(Launch::Ssh(hosts, launcher)) => {
            let names: Vec<String> = hosts.iter().map(|h| format!("{} ({})", h.name, h.target)).collect();
            eprintln!("leap bench: asking {} over ssh", names.join(", "));
            Some(Box::new(SshRings::connect(hosts, launcher, &args.site).map_err(anyhow::Error::msg)?))
        }
        None => None,
    };
    if !root && rings.is_none() {
        notes.push("not root: measured on loopback, without namespaces, XDP or the kernel module".into());
        eprintln!(
            "leap bench: not root, so measuring on loopback (TCP and UDP only); run as root for the full comparison"
        );
    }
    let mut cfg = BenchConfig {
        transports,
        sizes,
        nodes: rings.as_ref().map_or(args.nodes, |r| r.hosts().len()),
        repeat: args.repeat.unwrap_or(if args.quick { QUICK_ROUNDS } else { FULL_ROUNDS }).max(1),
        quick: args.quick,
        placement,
        options: crate::transport::open::Options {
            ring_key: args.transport_args.keys()?,
            ..args.transport_args.options(16_392)
        },
        site: args.site.clone(),
        profile: None,
        mtu: args.mtu,
        programs: ring_programs,
    };
    let cpus = &args.transport_args.cpus;
    notes.extend(rings.is_none().then(|| {
        if cpus.is_empty() {
            format!("{}: node threads not pinned (the scheduler places them; see --cpus)", args.site)
        } else {
            let list: Vec<String> = cpus.iter().map(ToString::to_string).collect();
            format!(
                "{}: node i pinned to CPU {{{}}}[i mod {}] (--cpus), the floor too",
                args.site,
                list.join(","),
                cpus.len()
            )
        }
    }));
    if rings.is_none() {
        notes.push(schedule(args, root)?);
    }
    if !cfg.programs.is_empty() {
        let list: Vec<String> =
            cfg.programs.iter().map(|p| format!("`{}`: `{}`", p.name, p.command.join(" "))).collect();
        notes.push(format!(
            "{}: rows KIND{sep}NAME are the same ring (one frame in flight) run by a program as one process per node, \
             in the same rounds, each process in its node's namespace, on its node's CPU and scheduled as the ring \
             threads; {sep}rust is `leap bench-member` (`leap ring`'s loops as processes). Programs: {}",
            args.site,
            list.join("; "),
            sep = programs::SEP
        ));
    }
    if args.profile {
        match crate::bench::profile::perf() {
            Ok(perf) => cfg.profile = Some((perf, args.out.clone())),
            Err(e) => {
                eprintln!("leap bench: --profile: {e}; measuring without a profile");
                notes.push(format!("no profile: {e}"));
            }
        }
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let progress = |done: usize, total: usize, label: &str| match &bar {
        Some(b) => {
            b.set_length(total as u64);
            b.set_position(done as u64);
            b.set_message(label.to_string());
        }
        None => log::info!("bench {done}/{total}: {label}"),
    };
    let report = match &mut rings {
        Some(r) => run_on(&cfg, r.as_mut(), &progress),
        None => run(&cfg, &progress),
    };
    drop(rings);
    let mut report = report.map_err(anyhow::Error::msg)?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    report.notes.extend(notes);
    for s in &report.skipped {
        eprintln!("leap bench: skipped {} ({}): {}", s.transport, s.site, s.reason);
    }
    let corrupt: u64 = report.rows.iter().map(|r| r.frames_corrupt).sum();
    for f in report.write(&args.out)? {
        println!("{}", f.display());
    }
    if corrupt > 0 {
        bail!("{corrupt} corrupt frames during the benchmark");
    }
    Ok(())
}

/// The ring programs to measure: Rust as processes first (this binary's
/// `bench-member`, unless a program named `rust` is given), then `given`.
///
/// # Errors
///
/// Two programs of one name, or no path to this binary.
fn ring_programs(given: &[RingProgram]) -> Result<Vec<RingProgram>> {
    if given.is_empty() {
        return Ok(Vec::new());
    }
    let mut v = Vec::new();
    if !given.iter().any(|p| p.name == programs::RUST) {
        let exe = std::env::current_exe().context("finding the leap binary for the rust ring program")?;
        v.push(RingProgram::rust(&exe));
    }
    for p in given {
        if v.iter().any(|q: &RingProgram| q.name == p.name) {
            bail!("--ring-program {}: two programs of that name", p.name);
        }
        v.push(p.clone());
    }
    Ok(v)
}

/// Schedules this thread, and so the ring threads it starts, as `--sched`
/// says (by default real-time when it may and no node spins); returns the
/// report's note.
///
/// # Errors
///
/// `--sched rr` that cannot be had.
fn schedule(args: &BenchArgs, root: bool) -> Result<String> {
    let spins = args.transport_args.spin_us > 0 || args.transport_args.busy_poll.is_some();
    let want = args.sched.unwrap_or(if root && !spins { Sched::Rr } else { Sched::Normal });
    if want == Sched::Rr && spins {
        bail!(
            "--sched rr with --spin-us or --busy-poll: a spinning real-time node would keep the others off a shared \
             CPU; leave out --sched rr"
        );
    }
    let got = match sched::apply(want) {
        Ok(()) => want,
        Err(e) if args.sched.is_none() => {
            eprintln!(
                "leap bench: cannot schedule the ring threads real-time ({e}); measuring with the normal scheduler"
            );
            Sched::Normal
        }
        Err(e) => bail!("--sched {}: {e}", want.as_str()),
    };
    Ok(match got {
        Sched::Rr => format!(
            "{}: ring threads real-time (SCHED_RR, --sched rr): other work on the machine does not take their CPU",
            args.site
        ),
        Sched::Normal => format!(
            "{}: ring threads under the normal scheduler (--sched normal): other work on the machine shares their \
             CPU, so figures move with its load",
            args.site
        ),
    })
}
