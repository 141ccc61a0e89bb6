//! Ring programs: the benchmark's ring driven by other programs, one process
//! per node (the C, C++ and Python examples, and `leap bench-member` for
//! Rust as processes), measured in the same rounds as `leap ring`'s threads.
//! This module starts them where the ring's threads would run and reads
//! what their head measured.
//!
//! # The protocol
//!
//! For each node the benchmark runs `COMMAND...` followed by
//!
//! ```text
//! --kind KIND --role head|worker --listen ADDR:PORT --next ADDR:PORT --prev ADDR:PORT
//! --frames N --frame-size BYTES --workers W --index I [--set KEY=VALUE]...
//! ```
//!
//! `--index` is the node's place among the workers (0 for the first worker
//! and for the head); `--set` gives the transport's settings, the keys of
//! `leap_config_set` and `leap.open` (every option the `leap ring` threads
//! open their transports with, the node's `interface` included).
//!
//! - A **worker** opens its transport, prints the line `ready`, then
//!   passes every frame on unchanged through the lending path: it reads the
//!   frame where its transport received it and writes it where its
//!   transport sends from (one copy, as `leap ring`'s workers). It stops
//!   after `--frames` frames, or at SIGINT, which the benchmark sends if it
//!   still runs 1.5 s after the head is done.
//! - The **head** sends `--frames` frames of `--frame-size` bytes one at a
//!   time, each written where its transport sends from; it times every
//!   round trip from just before it writes the frame to just after the
//!   frame came back, checks every byte of it, and prints one JSON line:
//!   `{"rtt_us": {"p50", "p90", "p99", "max", "mean"}, "frames_sent",
//!   "frames_delivered", "frames_corrupt", "frames_lost", "elapsed_s",
//!   "stats": {...}}` (`stats`: the transport's counters, names as
//!   `leap_stats`'; optional, as are `mean`, `frames_lost` and
//!   `elapsed_s`). It exits 0 when every frame came back intact.
//! - Any member may end its output with a JSON line holding `stats`, or
//!   print a `{"leap_stats": ..., counters}` line on stderr (what the C++
//!   drop-in does with `LEAP_STATS=1`, which the benchmark sets): the
//!   counters are summed over the nodes (copies per hop).
//!
//! Workers start first; for the datagram transports the head starts once
//! every worker printed `ready` (for TCP at once: the connections order the
//! start). Each process starts in its node's network namespace, on its
//! node's CPU (`--cpus`) and with the benchmark thread's scheduling class,
//! as the ring's threads do.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::ring::{HeadSummary, Percentiles, RingConfig, RingReport, assemble};
use crate::transport::Stats;
use crate::transport::config::{Reliability, TcpFraming};
use crate::transport::open::{Endpoint, Options, TransportKind};

/// The name of the ring of Rust processes (`leap bench-member`).
pub const RUST: &str = "rust";

/// The separator between a transport and a program in a row's name
/// (`udp·c`).
pub const SEP: char = '·';

/// How long the workers may take to end by themselves once the head is
/// done (those that stop after `--frames`), before they get SIGINT.
const WORKER_OWN_END: Duration = Duration::from_millis(1500);
/// How long a worker may take after SIGINT before it is killed.
const WORKER_GRACE: Duration = Duration::from_secs(3);
/// How long the members may take beyond opening and the stall bound.
const RUN_MARGIN: Duration = Duration::from_secs(60);
/// How often the members are checked while the head runs.
const POLL: Duration = Duration::from_millis(20);
/// How much of a member's stderr is kept for error messages.
const STDERR_TAIL: usize = 2048;

/// A program that runs one ring member per process (see the module's
/// protocol), as `leap bench --ring-program NAME=COMMAND` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingProgram {
    /// Its name in the rows (`udp·NAME`).
    pub name: String,
    /// The program and its first arguments; the protocol's follow.
    pub command: Vec<String>,
}

impl RingProgram {
    /// Rust as processes: `exe bench-member` (the `leap` binary).
    pub fn rust(exe: &Path) -> Self {
        Self { name: RUST.into(), command: vec![exe.display().to_string(), "bench-member".into()] }
    }
}

impl std::str::FromStr for RingProgram {
    type Err = String;

    /// `NAME=COMMAND [ARGS...]`: the command split at white space.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, command) =
            s.split_once('=').ok_or_else(|| format!("`{s}`: give NAME=COMMAND, e.g. c=target/capi/bin/ring"))?;
        let name = name.trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(format!(
                "`{name}`: a program's name is letters, digits, - and _ (it names rows: udp{SEP}NAME)"
            ));
        }
        let command: Vec<String> = command.split_whitespace().map(str::to_string).collect();
        if command.is_empty() {
            return Err(format!("{name}: no command after `=`"));
        }
        Ok(Self { name: name.into(), command })
    }
}

/// A row's transport and program: `udp·c` is (`udp`, Some(`c`)).
pub fn split_label(label: &str) -> (&str, Option<&str>) {
    match label.split_once(SEP) {
        Some((kind, program)) => (kind, Some(program)),
        None => (label, None),
    }
}

/// The settings (`--set KEY=VALUE`) that open a transport with `o` on
/// `ep`'s interface: every option the ring's threads use, spelled as
/// [`crate::transport::settings::Settings::set`] takes it.
pub fn settings(o: &Options, ep: &Endpoint) -> Vec<(&'static str, String)> {
    let on = |b: bool| if b { "true" } else { "false" }.to_string();
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let mut s = vec![
        ("frame_size", o.frame_len.to_string()),
        ("inflight", o.inflight.to_string()),
        ("recv_timeout_ms", o.recv_timeout.map_or(0, |t| t.as_millis().max(1)).to_string()),
        ("setup_timeout_s", o.setup_timeout.as_secs().max(1).to_string()),
        (
            "reliability",
            match o.reliability {
                Reliability::Reliable => "reliable",
                Reliability::BestEffort => "best-effort",
            }
            .into(),
        ),
        ("crc", on(o.crc)),
        ("trains", on(o.trains)),
        ("gso", on(o.gso)),
        ("window_memory_mib", (o.window_memory >> 20).max(1).to_string()),
        ("busy_poll_us", o.busy_poll.map_or(0, |t| t.as_micros()).to_string()),
        ("spin_us", o.spin.as_micros().to_string()),
        ("xdp_mode", o.xdp_mode.as_str().into()),
        (
            "tcp_framing",
            match o.tcp_framing {
                TcpFraming::Raw => "raw",
                TcpFraming::Length => "length",
            }
            .into(),
        ),
        ("original_compat", on(o.original_compat)),
    ];
    if let Some(w) = o.window {
        s.push(("window", w.to_string()));
    }
    if let Some(k) = o.keep_frames {
        s.push(("keep_frames", k.to_string()));
    }
    if let Some(p) = &o.xdp_object {
        s.push(("xdp_object", p.display().to_string()));
    }
    if let Some(q) = &o.xdp_queues {
        s.push(("queues", list(&q.iter().map(|&n| u64::from(n)).collect::<Vec<_>>())));
    }
    if !o.xdp_vlans.is_empty() {
        s.push(("vlans", list(&o.xdp_vlans.iter().map(|&n| u64::from(n)).collect::<Vec<_>>())));
    }
    if let Some(i) = &ep.iface {
        s.push(("interface", i.clone()));
    }
    s
}

/// The protocol's arguments for node `i` of `rc` (0: the head) at `ep`.
pub fn args(rc: &RingConfig, i: usize, ep: &Endpoint) -> Vec<String> {
    let mut a: Vec<String> = [
        "--kind",
        rc.transport.as_str(),
        "--role",
        if i == 0 { "head" } else { "worker" },
        "--listen",
        &ep.listen.to_string(),
        "--next",
        &ep.next.to_string(),
        "--prev",
        &ep.prev.map_or_else(String::new, |p| p.to_string()),
        "--frames",
        &rc.frames.to_string(),
        "--frame-size",
        &rc.frame_size.to_string(),
        "--workers",
        &(rc.nodes - 1).to_string(),
        "--index",
        &i.saturating_sub(1).to_string(),
    ]
    .map(str::to_string)
    .into();
    for (k, v) in settings(&rc.options_for(i), ep) {
        a.push("--set".into());
        a.push(format!("{k}={v}"));
    }
    a
}

/// Round trips as a member prints them (`mean` optional).
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
struct Rtt {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

/// A member's JSON line.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct MemberReport {
    rtt_us: Option<Rtt>,
    frames_sent: u64,
    frames_delivered: u64,
    frames_corrupt: u64,
    frames_lost: u64,
    elapsed_s: f64,
    stats: Option<Stats>,
    /// CPU time of the member's data phase (`leap bench-member` prints it).
    pub cpu_s: Option<f64>,
}

impl MemberReport {
    /// The last line of `lines` that is a JSON object, if any.
    pub fn last(lines: &[String]) -> Option<Self> {
        lines.iter().rev().filter(|l| l.trim_start().starts_with('{')).find_map(|l| serde_json::from_str(l).ok())
    }
}

/// The ring's report from what its head and workers printed.
///
/// # Errors
///
/// A head report without round trips.
pub fn report_of(rc: &RingConfig, head: &MemberReport, workers: &[MemberReport]) -> Result<RingReport, String> {
    // The processes' CPU time is not measured (it would include starting
    // an interpreter): the report shows none for these rows.
    report_with_cpu(rc, head, workers, Duration::ZERO)
}

/// [`report_of`], with `cpu` as the members' CPU time.
///
/// # Errors
///
/// A head report without round trips.
pub fn report_with_cpu(
    rc: &RingConfig,
    head: &MemberReport,
    workers: &[MemberReport],
    cpu: Duration,
) -> Result<RingReport, String> {
    let rtt = head.rtt_us.ok_or("the head's JSON line has no rtt_us")?;
    let mut stats = Stats::default();
    for s in std::iter::once(head).chain(workers).filter_map(|m| m.stats.as_ref()) {
        stats.add(s);
    }
    let sent = if head.frames_sent > 0 { head.frames_sent } else { rc.frames };
    let mean = if rtt.mean > 0.0 { rtt.mean } else { rtt.p50 };
    let summary = HeadSummary {
        sent,
        delivered: head.frames_delivered,
        corrupt: head.frames_corrupt,
        lost: head.frames_lost.max(sent.saturating_sub(head.frames_delivered + head.frames_corrupt)),
        rtt_us: Percentiles { p50: rtt.p50, p90: rtt.p90, p99: rtt.p99, max: rtt.max, mean },
        // Without it, one frame at a time: the round trips back to back.
        elapsed_s: if head.elapsed_s > 0.0 { head.elapsed_s } else { head.frames_delivered as f64 * mean / 1e6 },
        ..HeadSummary::default()
    };
    Ok(assemble(rc, summary, stats, &[], cpu))
}

/// One running member.
pub(super) struct Member {
    pub(super) name: String,
    pub(super) child: Child,
    /// Its standard input, when piped (closing it stops a member that
    /// watches it).
    pub(super) stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    pub(super) stdout: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Member {
    /// Reads the output of `child`, started as member `name`.
    pub(super) fn attach(name: String, mut child: Child) -> Self {
        let (tx, lines) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
        }
        let stderr = child.stderr.take().map(|e| std::thread::spawn(move || tail(e)));
        let stdin = child.stdin.take();
        Self { name, child, stdin, lines, stdout: Vec::new(), stderr }
    }

    /// The end of its stderr (once, after it exited or was killed).
    pub(super) fn stderr_tail(&mut self) -> String {
        self.stderr.take().and_then(|h| h.join().ok()).unwrap_or_default()
    }

    /// Takes the lines printed so far.
    fn drain(&mut self) {
        self.stdout.extend(self.lines.try_iter());
    }

    /// Waits for the line `ready` until `until`.
    pub(super) fn ready(&mut self, until: Instant) -> Result<(), String> {
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.min(POLL)) {
                Ok(l) if l.trim() == "ready" => return Ok(()),
                Ok(l) => self.stdout.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.failure("exited before it was ready")),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(st)) = self.child.try_wait() {
                        return Err(self.failure(&format!("exited ({st}) before it was ready")));
                    }
                    if left.is_zero() {
                        return Err(self.failure("did not print `ready` in time"));
                    }
                }
            }
        }
    }

    /// Its stdout to the end (bounded: a grandchild may hold the pipe).
    pub(super) fn finish_output(&mut self) {
        let until = Instant::now() + Duration::from_secs(2);
        while let Ok(l) = self.lines.recv_timeout(until.saturating_duration_since(Instant::now())) {
            self.stdout.push(l);
        }
    }

    /// The counters of a `{"leap_stats": ...}` line on its stderr (the C++
    /// drop-in's, with `LEAP_STATS=1`), once it has exited.
    fn stderr_stats(&mut self) -> Option<Stats> {
        let err = self.stderr_tail();
        err.lines().rev().filter(|l| l.starts_with("{\"leap_stats\"")).find_map(|l| serde_json::from_str(l).ok())
    }

    /// What went wrong, with the end of its stderr.
    pub(super) fn failure(&mut self, what: &str) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let err = self.stderr_tail();
        let err = err.trim();
        if err.is_empty() { format!("{} {what}", self.name) } else { format!("{} {what}: {err}", self.name) }
    }
}

/// The ring's members; whatever still runs is killed when it is dropped.
#[derive(Default)]
pub(super) struct Members(pub(super) Vec<Member>);

impl Drop for Members {
    fn drop(&mut self) {
        for m in &mut self.0 {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
    }
}

/// Starts `cmd` from a thread that is in namespace `ns` and on node `i`'s
/// CPU of `cpus`, as the ring's node thread `i` would be: the process
/// inherits both, and the scheduling class of the calling thread.
fn spawn_at(cmd: &mut Command, ns: Option<&Path>, cpus: &[usize], i: usize) -> Result<Child, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            crate::ring::pin(cpus, i).map_err(|e| e.to_string())?;
            if let Some(ns) = ns {
                crate::netns::enter(ns).map_err(|e| format!("entering {}: {e}", ns.display()))?;
            }
            cmd.spawn().map_err(|e| format!("starting {}: {e}", cmd.get_program().to_string_lossy()))
        })
        .join()
        .unwrap_or_else(|_| Err("the thread starting a ring program panicked".into()))
    })
}

/// Keeps the last [`STDERR_TAIL`] bytes of `r`.
fn tail(r: impl Read) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut r = BufReader::new(r);
    let mut buf = [0u8; 4096];
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * STDERR_TAIL {
            kept.drain(..kept.len() - STDERR_TAIL);
        }
    }
    let from = kept.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&kept[from..]).into_owned()
}

impl Members {
    fn start(
        &mut self,
        prog: &RingProgram,
        rc: &RingConfig,
        i: usize,
        ep: &Endpoint,
        ns: Option<&Path>,
    ) -> Result<(), String> {
        let name = if i == 0 { format!("{} head", prog.name) } else { format!("{} worker {}", prog.name, i - 1) };
        let mut cmd = Command::new(&prog.command[0]);
        cmd.args(&prog.command[1..])
            .args(args(rc, i, ep))
            // The C++ drop-in prints its counters on stderr with it.
            .env("LEAP_STATS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = spawn_at(&mut cmd, ns, &rc.options.cpus, i).map_err(|e| format!("{name}: {e}"))?;
        self.0.push(Member::attach(name, child));
        Ok(())
    }
}

/// Runs the ring of `rc` with `prog` as every member, one process each,
/// placed as [`crate::ring::run`] places its threads, and reports what the
/// head measured.
///
/// # Errors
///
/// Bad settings, namespaces that could not be made, a member that failed
/// (its stderr's end in the message), or a ring over its time.
pub fn run(prog: &RingProgram, rc: &RingConfig) -> Result<RingReport, String> {
    rc.validate().map_err(|e| e.to_string())?;
    crate::sys::check_cpus(&rc.options.cpus).map_err(|e| format!("--cpus: {e}"))?;
    let mut rc = rc.clone();
    rc.options.inflight = rc.inflight;
    let (eps, topo) = crate::ring::layout(&rc).map_err(|e| e.to_string())?;
    let ns = |i: usize| topo.as_ref().map(|t| t.nodes()[i].path());
    let until = Instant::now() + rc.options.setup_timeout + rc.stall_timeout + RUN_MARGIN;
    let mut members = Members::default();
    for (i, ep) in eps.iter().enumerate().skip(1) {
        members.start(prog, &rc, i, ep, ns(i).as_deref())?;
    }
    if rc.transport != TransportKind::Tcp {
        // A datagram to a socket not yet bound is lost: workers first.
        let ready_by = Instant::now() + rc.options.setup_timeout + Duration::from_secs(5);
        for m in &mut members.0 {
            m.ready(ready_by)?;
        }
    }
    members.start(prog, &rc, 0, &eps[0], ns(0).as_deref())?;
    let head_status = wait_head(&mut members, until)?;
    let (head_report, worker_reports) =
        end_ring(&mut members, head_status, &|m: &mut Member| crate::sys::interrupt(m.child.id()))?;
    drop(members);
    drop(topo);
    report_of(&rc, &head_report, &worker_reports)
}

/// Once the head (the last member) exited with `head_status`: lets the
/// workers end by themselves (after `--frames`), else `stop`s each, kills
/// what is left after a grace period, and returns what the head and the
/// workers printed.
///
/// # Errors
///
/// A head that failed or printed no JSON line.
pub(super) fn end_ring(
    members: &mut Members,
    head_status: ExitStatus,
    stop: &dyn Fn(&mut Member),
) -> Result<(MemberReport, Vec<MemberReport>), String> {
    // The workers may print their counters meanwhile.
    let workers = members.0.len() - 1;
    let running = |m: &mut Member| m.child.try_wait().ok().flatten().is_none();
    let own_end = Instant::now() + WORKER_OWN_END;
    while members.0[..workers].iter_mut().any(running) && Instant::now() < own_end {
        std::thread::sleep(POLL);
    }
    for m in &mut members.0[..workers] {
        if running(m) {
            stop(m);
        }
    }
    let grace = Instant::now() + WORKER_GRACE;
    for m in &mut members.0[..workers] {
        while running(m) && Instant::now() < grace {
            std::thread::sleep(POLL);
        }
        let _ = m.child.kill();
        let _ = m.child.wait();
        m.finish_output();
    }
    let head = &mut members.0[workers];
    head.finish_output();
    if !head_status.success() {
        return Err(head.failure(&format!("failed ({head_status})")));
    }
    let Some(head_report) = MemberReport::last(&head.stdout) else {
        return Err(head.failure("printed no JSON line"));
    };
    let mut head_report = head_report;
    if head_report.stats.is_none() {
        head_report.stats = members.0[workers].stderr_stats();
    }
    let worker_reports: Vec<MemberReport> = members.0[..workers]
        .iter_mut()
        .filter_map(|m| {
            let mut r = MemberReport::last(&m.stdout).unwrap_or_default();
            r.stats = r.stats.or_else(|| m.stderr_stats());
            r.stats.is_some().then_some(r)
        })
        .collect();
    Ok((head_report, worker_reports))
}

/// Waits for the head (the last member) to exit, by `until`; a worker that
/// fails meanwhile ends the run at once.
pub(super) fn wait_head(members: &mut Members, until: Instant) -> Result<ExitStatus, String> {
    let n = members.0.len();
    loop {
        for m in &mut members.0 {
            m.drain();
        }
        if let Some(st) = members.0[n - 1].child.try_wait().map_err(|e| format!("waiting for the head: {e}"))? {
            return Ok(st);
        }
        for m in &mut members.0[..n - 1] {
            if let Ok(Some(st)) = m.child.try_wait()
                && !st.success()
            {
                return Err(m.failure(&format!("failed ({st}) while the head ran")));
            }
        }
        if Instant::now() >= until {
            let head = &mut members.0[n - 1];
            return Err(head.failure("ran over its time; killed"));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::settings::Settings;

    #[test]
    fn a_program_is_a_name_and_a_command() {
        let p: RingProgram = "python=/v/bin/python /x/ring_latency.py".parse().unwrap();
        assert_eq!(p.name, "python");
        assert_eq!(p.command, ["/v/bin/python", "/x/ring_latency.py"]);
        assert!("c".parse::<RingProgram>().unwrap_err().contains("NAME=COMMAND"));
        assert!("c=".parse::<RingProgram>().unwrap_err().contains("no command"));
        assert!("a·b=x".parse::<RingProgram>().is_err());
        assert_eq!(split_label("udp·c"), ("udp", Some("c")));
        assert_eq!(split_label("udp+bp"), ("udp+bp", None));
    }

    #[test]
    fn settings_given_to_ring_programs_open_the_options_of_the_rust_ring() {
        let ep = Endpoint::new("10.77.0.2:9999".parse().unwrap(), "10.77.0.3:9999".parse().unwrap()).with_iface("lpb1");
        let mut o = Options {
            frame_len: 262_152,
            recv_timeout: Some(Duration::from_millis(200)),
            crc: false,
            window: Some(8),
            keep_frames: Some(32),
            xdp_queues: Some(vec![0, 1]),
            xdp_vlans: vec![10, 20],
            spin: Duration::from_micros(5),
            ..Options::default()
        };
        let mut s = Settings::new(TransportKind::Udp);
        s.set("listen", &ep.listen.to_string()).unwrap();
        s.set("next", &ep.next.to_string()).unwrap();
        for (k, v) in settings(&o, &ep) {
            s.set(k, &v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        // What a setting cannot carry: the CPUs (the benchmark pins the
        // process) and pinning the XDP program in bpffs.
        o.cpus = Vec::new();
        assert_eq!(format!("{:?}", s.options()), format!("{o:?}"));
        assert_eq!(s.endpoint().unwrap().iface.as_deref(), Some("lpb1"));
    }

    #[test]
    fn arguments_follow_the_protocol() {
        let mut rc = RingConfig::new(TransportKind::Udp, 3, 16_392, 500);
        rc.options.recv_timeout = Some(Duration::from_millis(200));
        let ep = Endpoint {
            listen: "127.0.0.1:9002".parse().unwrap(),
            next: "127.0.0.1:9003".parse().unwrap(),
            prev: Some("127.0.0.1:9001".parse().unwrap()),
            iface: Some("lo".into()),
        };
        let a = args(&rc, 2, &ep).join(" ");
        assert!(
            a.starts_with(
                "--kind udp --role worker --listen 127.0.0.1:9002 --next 127.0.0.1:9003 --prev 127.0.0.1:9001 \
                 --frames 500 --frame-size 16392 --workers 2 --index 1 --set frame_size=16392"
            ),
            "{a}"
        );
        assert!(a.contains("--set recv_timeout_ms=200") && a.ends_with("--set interface=lo"), "{a}");
        assert!(args(&rc, 0, &ep).join(" ").contains("--role head") && args(&rc, 0, &ep).contains(&"0".into()));
    }

    #[test]
    fn the_head_line_makes_the_ring_report_and_every_members_counters_add_up() {
        let rc = RingConfig::new(TransportKind::Udp, 3, 16_392, 100);
        let lines: Vec<String> = [
            "ready",
            r#"{"rtt_us":{"p50":40.5,"p90":45.0,"p99":60.0,"max":90.0},"frames_sent":100,"frames_delivered":100,"#,
            r#"{"rtt_us":{"p50":41.0,"p90":45.0,"p99":60.0,"max":90.0},"frames_sent":100,"frames_delivered":99,"frames_corrupt":0,"stats":{"copied_bytes":1000,"bytes_received":2000}}"#,
        ]
        .map(String::from)
        .into();
        let head = MemberReport::last(&lines).expect("the last whole JSON line");
        let worker = MemberReport::last(&[r#"{"stats":{"copied_bytes":500,"bytes_received":2000}}"#.into()]).unwrap();
        let rep = report_of(&rc, &head, &[worker]).unwrap();
        assert_eq!(rep.rtt_us.p50, 41.0);
        assert_eq!((rep.frames_delivered, rep.frames_lost), (99, 1));
        assert_eq!((rep.stats.copied_bytes, rep.stats.bytes_received), (1500, 4000));
        assert_eq!(crate::bench::copies_per_hop(&[rep]), Some(0.375));
        assert!(report_of(&rc, &MemberReport::default(), &[]).unwrap_err().contains("rtt_us"));
    }
}
