//! Where the CPU goes: one extra latency run per transport under
//! `perf record -a` (system-wide, so softirq work charged to the senders and
//! the idle time of the CPUs are both seen), summarised by symbol and by kind
//! of work. The profiled run's timings are not used: perf slows it.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::ring::RingConfig;

/// Sampling rate of `perf record` (Hz per CPU): enough samples in a
/// one-second run, little enough overhead.
const FREQUENCY: &str = "2999";
/// Symbols kept per profile.
const TOP: usize = 15;

/// The summary of one profiled run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    /// Backend.
    pub transport: String,
    /// Where it ran.
    pub site: String,
    /// Bytes per frame.
    pub frame_size: usize,
    /// Samples taken on all CPUs.
    pub samples: u64,
    /// Share of all samples with the CPUs idle (%).
    pub idle_pct: f64,
    /// Share of all samples in the ring's threads, kernel work they caused
    /// included (%).
    pub leap_pct: f64,
    /// The ring threads' samples by kind of work (% of theirs).
    pub categories: Vec<(String, f64)>,
    /// The ring threads' hottest symbols (% of theirs), `[k]` kernel, `[.]` user.
    pub top: Vec<(String, f64)>,
}

/// Finds a working `perf`, or says why there is none.
///
/// # Errors
///
/// A message naming what is missing and how to get it.
pub fn perf() -> Result<PathBuf, String> {
    let out = Command::new("perf").arg("--version").output();
    match out {
        Ok(o) if o.status.success() => Ok(PathBuf::from("perf")),
        Ok(o) => Err(format!("`perf --version` failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("no perf ({e}): install it (Debian: apt-get install linux-perf)")),
    }
}

/// Stops a system-wide `perf record` when dropped, also on error paths.
struct Recorder {
    child: Option<Child>,
}

impl Recorder {
    fn start(perf: &Path, data: &Path) -> Result<Self, String> {
        let child = Command::new(perf)
            .args(["record", "-q", "-k", "mono", "-e", "cpu-clock", "-F", FREQUENCY, "-a", "-o"])
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start perf record: {e}"))?;
        Ok(Self { child: Some(child) })
    }

    /// Ends the recording (SIGINT, as perf expects) and waits for the file.
    fn stop(mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        crate::sys::interrupt(child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match child.try_wait() {
                // perf re-raises the SIGINT it handled once its file is written.
                Ok(Some(st)) if st.success() || st.signal() == Some(libc::SIGINT) => return Ok(()),
                Ok(Some(st)) => {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    return Err(format!("perf record exited with {st}: {}", err.trim()));
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("perf record did not stop within 30 s".into());
                }
                Err(e) => return Err(format!("waiting for perf: {e}")),
            }
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `rc` once under `perf record` and summarises it as the row `label`
/// (`udp`, `udp+key`); the raw report text is kept as
/// `dir/profile-<label>-<site>.txt`.
///
/// # Errors
///
/// perf failing to record or report, or the ring run failing.
pub fn record(perf: &Path, rc: &RingConfig, label: &str, site: &str, dir: &Path) -> Result<Profile, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let name = format!("profile-{label}-{site}");
    let data = dir.join(format!("{name}.data"));
    let rec = Recorder::start(perf, &data)?;
    // perf needs a moment to open its events before the run starts.
    std::thread::sleep(Duration::from_millis(300));
    let (anchor, anchor_ns) = (Instant::now(), crate::sys::monotonic_ns());
    let run = crate::ring::run(rc);
    let stopped = rec.stop();
    let result = run.map_err(|e| format!("profiled run: {e}")).and_then(|r| stopped.map(|()| r)).and_then(|r| {
        // Only the data phase: not the set-up (BPF load, BTF parsing) or teardown.
        let (from, to) = r.data_phase.ok_or("the run has no data phase")?;
        let at = |t: Instant| {
            let ns = anchor_ns + t.saturating_duration_since(anchor).as_nanos() as u64;
            format!("{}.{:06}", ns / 1_000_000_000, ns % 1_000_000_000 / 1000)
        };
        let window = format!("{},{}", at(from), at(to));
        let comms = report(perf, &data, &["--sort", "comm", "--time", &window])?;
        let threads: Vec<&str> =
            parse(&comms).into_iter().map(|(c, _)| c).filter(|c| is_ring_thread(c)).collect::<Vec<_>>();
        if threads.is_empty() {
            return Err("perf saw no sample of the ring's threads".into());
        }
        let list = threads.join(",");
        let syms =
            report(perf, &data, &["--sort", "sym", "--comms", &list, "--percentage", "relative", "--time", &window])?;
        let text = format!("# {name}: samples by command\n{comms}\n# samples of {list} by symbol\n{syms}");
        std::fs::write(dir.join(format!("{name}.txt")), text).map_err(|e| e.to_string())?;
        Ok(summarise(&comms, &syms, label.to_string(), site, rc.frame_size))
    });
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_file(dir.join(format!("{name}.data.old")));
    result
}

fn report(perf: &Path, data: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(perf)
        .args(["report", "--stdio", "--no-children", "--percent-limit", "0.3", "-i"])
        .arg(data)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("perf report: {e}"))?;
    if !out.status.success() {
        return Err(format!("perf report failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_ring_thread(comm: &str) -> bool {
    comm == "leap-head" || comm.starts_with("leap-node-")
}

/// `(name, percent)` of every row of a `perf report --stdio` table; for
/// symbol tables the name keeps its `[k]` / `[.]` mark.
fn parse(text: &str) -> Vec<(&str, f64)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let l = l.trim();
            let (pct, rest) = l.split_once('%')?;
            let pct: f64 = pct.trim().parse().ok()?;
            let name = rest.trim();
            (!name.is_empty()).then_some((name, pct))
        })
        .collect()
}

/// Kinds of work, matched on symbol names in order (first match wins).
const CATEGORIES: &[(&str, &[&str])] = &[
    // A keyed ring's seals and checks (`ring`'s AES-GCM, GHASH and HKDF).
    ("ring key: AES-GCM", &["ring_core_", "[.] ring::", "[.] <ring::", "aes_gcm", "gcm_", "aes_hw", "ghash"]),
    ("leap user space", &["[.] leap::", "[.] <leap::"]),
    ("copying data", &["memcpy", "memmove", "copy_bits", "_copy_", "copy_user", "csum_partial_copy", "copyout"]),
    ("GSO segmentation / skb copy for XDP", &["skb_segment", "gso_segment", "skb_pp_cow", "__skb_gso"]),
    (
        "XDP program and AF_XDP / ring buffer",
        &["bpf_prog_", "xsk", "xp_", "bpf_ringbuf", "xdp", "htab_", "lookup_nulls"],
    ),
    ("lock contention", &["queued_spin_lock_slowpath", "native_queued_spin", "osq_lock", "mutex_spin"]),
    // The head compares every returned frame with what it sent.
    ("bench: verifying returned frames", &["memcmp", "bcmp"]),
    (
        "memory: skb / page alloc and free",
        &["alloc", "kfree", "free", "kmem_cache", "slab", "page_frag", "skb_release", "consume_skb", "page_pool"],
    ),
    (
        "wake-ups, IPIs, scheduling, polling",
        &[
            "wake",
            "schedule",
            "switch",
            "_raw_spin",
            "irq_work",
            // The x2APIC ICR write that sends an IPI (irq_work, remote wake-ups).
            "write_msr",
            "send_IPI",
            "send_call_function",
            "poll",
            "hrtimer",
            "futex",
            "select",
            "idle",
            "halt",
            "pick_",
            "enqueue",
            "dequeue",
        ],
    ),
    (
        "network stack (IP, UDP, TCP, veth, netfilter)",
        &[
            "ip_",
            "udp",
            "tcp",
            "veth",
            "netif",
            "napi",
            "dev_",
            "nf_",
            "sock",
            "skb",
            "__sys_send",
            "__sys_recv",
            "inet",
            "bbr",
            "neigh",
            "fib_",
            "dst_",
            "net_rx",
            "softirq",
            "_bh",
        ],
    ),
    (
        "system calls, clocks",
        &[
            "syscall",
            "read_tsc",
            "clock_gettime",
            "ktime",
            "__libc_",
            "asynccancel",
            "fdget",
            "exit_to_user",
            "rseq",
            "thunk",
            "get_user",
            "put_user",
            "rcu_read",
        ],
    ),
];

fn category(sym: &str) -> &'static str {
    CATEGORIES.iter().find(|(_, keys)| keys.iter().any(|k| sym.contains(k))).map_or("other", |(name, _)| name)
}

fn summarise(comms: &str, syms: &str, transport: String, site: &str, frame_size: usize) -> Profile {
    let comm_rows = parse(comms);
    // `+ 0.0`: an empty f64 sum is -0.0, which would print as "-0.0".
    let idle_pct = comm_rows.iter().filter(|(c, _)| *c == "swapper").map(|(_, p)| p).sum::<f64>() + 0.0;
    let leap_pct = comm_rows.iter().filter(|(c, _)| is_ring_thread(c)).map(|(_, p)| p).sum::<f64>() + 0.0;
    let samples = comms
        .lines()
        .find_map(|l| l.strip_prefix("# Samples: ").and_then(|r| r.split_whitespace().next()))
        .and_then(parse_count)
        .unwrap_or(0);
    let sym_rows = parse(syms);
    let mut cats: Vec<(String, f64)> = Vec::new();
    for (sym, pct) in &sym_rows {
        let c = category(sym);
        match cats.iter_mut().find(|(n, _)| n == c) {
            Some((_, p)) => *p += pct,
            None => cats.push((c.to_string(), *pct)),
        }
    }
    let listed: f64 = sym_rows.iter().map(|(_, p)| p).sum();
    if listed < 100.0 {
        cats.push(("below 0.3 % each".into(), 100.0 - listed));
    }
    cats.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top = sym_rows.iter().take(TOP).map(|(s, p)| ((*s).to_string(), *p)).collect();
    Profile { transport, site: site.into(), frame_size, samples, idle_pct, leap_pct, categories: cats, top }
}

/// perf prints counts like `12K` or `3M`.
fn parse_count(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()? {
        'K' => (&s[..s.len() - 1], 1_000.0),
        'M' => (&s[..s.len() - 1], 1_000_000.0),
        _ => (s, 1.0),
    };
    num.parse::<f64>().ok().map(|n| (n * mult) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMS: &str = "# Total Lost Samples: 0\n#\n# Samples: 29K of event 'cpu-clock'\n#\n\
        # Overhead  Command\n    58.29%  swapper\n    10.02%  leap-head\n     9.46%  leap-node-1\n\
        \x20    0.92%  python3\n";
    const SYMS: &str = "# Overhead  Symbol\n    20.00%  [k] _raw_spin_unlock_irqrestore\n\
        \x20   15.50%  [k] skb_segment\n    12.00%  [k] __pi_memcpy\n     9.00%  [.] leap::transport::xdp::xsk::XskSocket::recv\n\
        \x20    8.00%  [k] bpf_prog_012dc47db9f0059c_leap_xdp\n     5.00%  [k] page_frag_free\n     4.00%  [k] something_else\n";

    #[test]
    fn summary_adds_up_threads_idle_and_categories() {
        let p = summarise(COMMS, SYMS, "xdp".into(), "host", 16_392);
        assert_eq!(p.samples, 29_000);
        assert!((p.idle_pct - 58.29).abs() < 1e-9);
        assert!((p.leap_pct - 19.48).abs() < 1e-9);
        let get = |n: &str| p.categories.iter().find(|(c, _)| c == n).map(|(_, v)| *v);
        assert_eq!(get("copying data"), Some(12.0));
        assert_eq!(get("GSO segmentation / skb copy for XDP"), Some(15.5));
        assert_eq!(get("wake-ups, IPIs, scheduling, polling"), Some(20.0));
        assert_eq!(get("leap user space"), Some(9.0));
        assert_eq!(get("XDP program and AF_XDP / ring buffer"), Some(8.0));
        assert_eq!(get("memory: skb / page alloc and free"), Some(5.0));
        assert_eq!(get("other"), Some(4.0));
        assert!((get("below 0.3 % each").unwrap() - 26.5).abs() < 1e-9);
        let total: f64 = p.categories.iter().map(|(_, v)| v).sum();
        assert!((total - 100.0).abs() < 1e-9);
        assert_eq!(p.top[0], ("[k] _raw_spin_unlock_irqrestore".to_string(), 20.0));
        assert!(p.categories.windows(2).all(|w| w[0].1 >= w[1].1), "sorted, largest first");
    }

    #[test]
    fn a_keyed_rings_aes_gcm_is_a_kind_of_work_of_its_own() {
        assert_eq!(category("[.] ring_core_0_17_14__aes_gcm_enc_update_vaes_avx2"), "ring key: AES-GCM");
        assert_eq!(category("[.] ring::aead::aes_gcm::seal"), "ring key: AES-GCM");
        assert_eq!(category("[.] leap::ring::node::worker"), "leap user space", "leap's ring module is not `ring`");
    }

    #[test]
    fn counts_with_suffixes() {
        assert_eq!(parse_count("12K"), Some(12_000));
        assert_eq!(parse_count("3M"), Some(3_000_000));
        assert_eq!(parse_count("417"), Some(417));
        assert_eq!(parse_count("x"), None);
    }
}
