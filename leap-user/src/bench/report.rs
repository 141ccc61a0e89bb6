//! The benchmark report as Markdown tables and an SVG chart.

use std::fmt::Write as _;

use super::programs::{RUST, split_label};
use super::{BenchReport, BenchRow};

const FAST_PATHS: [&str; 3] = ["xdp", "xdp-ringbuf", "kmod"];

fn series(r: &BenchReport) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    for row in &r.rows {
        let k = (row.transport.clone(), row.site.clone());
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// The transports in report order (one colour each in the chart).
fn transports(r: &BenchReport) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for row in &r.rows {
        if !v.contains(&row.transport) {
            v.push(row.transport.clone());
        }
    }
    v
}

/// The sites in report order: each gets its own panels in the chart, as
/// figures from different machines (an emulated VM, the host) are not
/// comparable on one axis.
fn sites(r: &BenchReport) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for site in r.rows.iter().map(|x| &x.site).chain(r.floors.iter().map(|f| &f.site)) {
        if !v.contains(site) {
            v.push(site.clone());
        }
    }
    v
}

/// Datagrams per frame as the report shows it: `stream` for TCP, `-`
/// where none were counted.
fn datagrams(x: &BenchRow) -> String {
    match x.datagrams_per_frame {
        _ if x.transport == "tcp" => "stream".into(),
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    }
}

fn sizes(r: &BenchReport) -> Vec<usize> {
    let mut v: Vec<usize> = r.rows.iter().map(|x| x.frame_size).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn find<'a>(r: &'a BenchReport, t: &str, site: &str, size: usize, mode: &str) -> Option<&'a BenchRow> {
    r.rows.iter().find(|x| x.transport == t && x.site == site && x.frame_size == size && x.mode == mode)
}

/// Where the rings ran, in words (`netns` names the namespace links).
fn placement_text(r: &BenchReport, netns: &'static str) -> &'static str {
    match r.placement.as_str() {
        "netns" => netns,
        "hosts" => "one member per host, each run by `leap serve`",
        _ => "loopback",
    }
}

/// Each host's agent, what it can run and its interfaces.
fn hosts(s: &mut String, r: &BenchReport) {
    if r.hosts.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Hosts\n\nIn ring order; the first is the head. Round trips are timed at the head alone, \
         so no clock synchronisation between the hosts is needed.\n"
    );
    for h in &r.hosts {
        let c = &h.capabilities;
        let _ = writeln!(
            s,
            "- **{}** ({}, Linux {}, leap {}): control {}, data {}, interface {}",
            h.name,
            if c.hostname.is_empty() { "?" } else { &c.hostname },
            c.kernel,
            c.leap_version,
            h.control,
            h.data,
            h.iface.as_deref().unwrap_or("-")
        );
        for t in &c.transports {
            let _ = writeln!(
                s,
                "  - {}: {}",
                t.transport,
                t.unavailable.as_deref().map_or("can run".to_string(), |w| format!("cannot run: {w}"))
            );
        }
        for i in c.interfaces.iter().filter(|i| h.iface.as_deref().is_none_or(|n| n == i.name)) {
            let _ = writeln!(
                s,
                "  - interface {}: driver {}, MTU {}, {} rx / {} tx queues, AF_XDP zero-copy {}",
                i.name,
                i.driver.as_deref().unwrap_or("none (virtual)"),
                i.mtu.map_or("?".into(), |m| m.to_string()),
                i.rx_queues,
                i.tx_queues,
                match i.zero_copy {
                    Some(true) => "yes (driver known to offer it)",
                    Some(false) => "no",
                    None => "unknown until bound",
                }
            );
        }
    }
    s.push('\n');
}

fn copies(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The rounds behind the rows, as "3" or "1-3" when they differ (a
/// transport that failed part-way, or merged reports).
fn rounds(r: &BenchReport) -> String {
    let lo = r.rows.iter().map(|x| x.repeats).min().unwrap_or(0);
    let hi = r.rows.iter().map(|x| x.repeats).max().unwrap_or(0);
    if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }
}

fn ratio(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.2}x"))
}

/// Report as Markdown.
pub fn markdown(r: &BenchReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# leap bench\n");
    let kernels: Vec<String> = r.kernels.iter().map(|(site, k)| format!("{site}: Linux {k}")).collect();
    let _ = writeln!(
        s,
        "{}-node ring ({}), leap {}; {}. Measured in {} rounds, each running every transport once per \
         size and mode, the order rotating from round to round. Figures are medians over the rounds; \
         the spread is (max - min) / median of the round p50s. Ratios to TCP are taken round by round \
         (the same round, the same conditions), then their median; all ratios compare rows measured \
         in the same run at the same site.\n",
        r.nodes,
        placement_text(r, "veth pairs between network namespaces"),
        r.leap_version,
        kernels.join(", "),
        rounds(r)
    );
    for f in &r.floors {
        // Reports from before the floor ran in the rounds have no runs.
        let runs = match f.round_p50_us.len() {
            0 | 1 => String::new(),
            n => format!(
                "; median of {n} runs, one in every round next to the rings (p50 {:.1} to {:.1} us)",
                f.round_p50_us.iter().copied().fold(f64::INFINITY, f64::min),
                f.round_p50_us.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            ),
        };
        let _ = writeln!(
            s,
            "**Floor ({})**: one 64-byte datagram per hop, {} hops: round trip p50 {:.1} us, p99 {:.1} us ({:.1} us per \
             hop){runs}.\n",
            f.site,
            f.hops,
            f.rtt_us.p50,
            f.rtt_us.p99,
            f.rtt_us.p50 / f.hops.max(1) as f64
        );
    }
    let sz = sizes(r);
    let header = |s: &mut String, title: &str| {
        let _ = writeln!(s, "## {title}\n");
        let _ = write!(s, "| transport | site |");
        for z in &sz {
            let _ = write!(s, " {z} B |");
        }
        let _ = write!(s, "\n|---|---|");
        for _ in &sz {
            let _ = write!(s, "---|");
        }
        s.push('\n');
    };
    let table = |s: &mut String, title: &str, mode: &str, cell: &dyn Fn(&BenchRow) -> String| {
        header(s, title);
        for (t, site) in series(r) {
            // Rows not measured in this mode (ring programs: latency only).
            if sz.iter().all(|&z| find(r, &t, &site, z, mode).is_none()) {
                continue;
            }
            let _ = write!(s, "| {t} | {site} |");
            for &z in &sz {
                let c = find(r, &t, &site, z, mode).map_or("-".into(), cell);
                let _ = write!(s, " {c} |");
            }
            s.push('\n');
        }
        s.push('\n');
    };
    table(
        &mut s,
        "Latency: one frame in flight, round trip p50 (spread) / p99 (us), p50 vs Rust processes (spread; ring \
         programs), vs TCP (spread), vs floor",
        "latency",
        &|x| {
            let rust = x.p50_vs_rust.map_or(String::new(), |v| {
                format!("{v:.2}x rust{}, ", x.p50_vs_rust_spread_pct.map_or(String::new(), |s| format!(" ({s:.0}%)")))
            });
            format!(
                "{:.1} ({:.0}%) / {:.1} ({rust}{} tcp{}, {} floor)",
                x.rtt_us.p50,
                x.p50_spread_pct,
                x.rtt_us.p99,
                ratio(x.p50_vs_tcp),
                x.p50_vs_tcp_spread_pct.map_or(String::new(), |v| format!(" ({v:.0}%)")),
                ratio(x.p50_vs_floor)
            )
        },
    );
    table(&mut s, "Throughput: 8 frames in flight, Gbit/s (vs TCP)", "throughput", &|x| {
        format!("{:.2} ({})", x.gbit_per_s, ratio(x.gbit_vs_tcp))
    });
    table(&mut s, "CPU time per frame, all nodes, user + system (us), latency / throughput", "latency", &|x| {
        if split_label(&x.transport).1.is_some() {
            // Not measured for ring programs' processes.
            return "-".into();
        }
        let thr = find(r, &x.transport, &x.site, x.frame_size, "throughput")
            .map_or("-".into(), |t| format!("{:.1}", t.cpu_us_per_frame));
        format!("{:.1} / {thr}", x.cpu_us_per_frame)
    });
    table(
        &mut s,
        "Copies per hop: frame bytes copied in user space (all nodes, send and receive) per byte moved \
         across a hop, latency / throughput",
        "latency",
        &|x| {
            let thr = find(r, &x.transport, &x.site, x.frame_size, "throughput").and_then(|t| t.copies_per_hop);
            format!("{} / {}", copies(x.copies_per_hop), copies(thr))
        },
    );
    table(
        &mut s,
        "Datagrams per frame: datagrams that carried frames' first copies per frame sent (all nodes; a chunk \
         train counts once; tcp is a stream), latency / throughput",
        "latency",
        &|x| {
            let thr = find(r, &x.transport, &x.site, x.frame_size, "throughput").map_or("-".into(), datagrams);
            format!("{} / {thr}", datagrams(x))
        },
    );
    table(
        &mut s,
        "Losses: frames lost / chunks retransmitted / frames re-sent by the head after a stall \
         (latency + throughput runs)",
        "latency",
        &|x| {
            let thr = find(r, &x.transport, &x.site, x.frame_size, "throughput");
            let lost = x.frames_lost + thr.map_or(0, |t| t.frames_lost);
            let retx = x.retransmits + thr.map_or(0, |t| t.retransmits);
            let resent = x.frames_resent + thr.map_or(0, |t| t.frames_resent);
            let corrupt = x.frames_corrupt + thr.map_or(0, |t| t.frames_corrupt);
            let c = if corrupt > 0 { format!(" / **{corrupt} corrupt**") } else { String::new() };
            format!("{lost} / {retx} / {resent}{c}")
        },
    );
    bindings(&mut s, r);
    let _ = writeln!(s, "## Targets\n");
    let mut sites: Vec<&str> = r.floors.iter().map(|f| f.site.as_str()).collect();
    for row in &r.rows {
        if !sites.contains(&row.site.as_str()) {
            sites.push(&row.site);
        }
    }
    for site in sites {
        targets(&mut s, r, site);
    }
    crc_costs(&mut s, r);
    key_costs(&mut s, r);
    profiles(&mut s, r);
    hosts(&mut s, r);
    if !r.skipped.is_empty() {
        let _ = writeln!(s, "## Not measured\n");
        for k in &r.skipped {
            let _ = writeln!(s, "- {} ({}): {}", k.transport, k.site, k.reason);
        }
        s.push('\n');
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "## Notes\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// Targets of the bindings' rings at 16 392 B: p50 at most this many
/// times that of Rust as processes.
const BINDING_TARGETS: [(&str, f64); 3] = [("c", 1.05), ("cpp", 1.05), ("python", 1.15)];

/// The ring programs' rows next to Rust's, one table per site: the same
/// ring driven from each language, with its ratios to Rust as processes
/// (the same layout) and to `leap ring`'s threads, then the targets.
fn bindings(s: &mut String, r: &BenchReport) {
    let programs: Vec<&BenchRow> =
        r.rows.iter().filter(|x| x.mode == "latency" && split_label(&x.transport).1.is_some()).collect();
    if programs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Bindings: the same ring driven from each language\n\n\
         One frame in flight. `KIND` is `leap ring` (its nodes are threads of one process); `KIND·NAME` is the \
         same ring run by a program as one process per node, in the same rounds: `rust` is `leap bench-member` \
         (`leap ring`'s head and worker loops), the others the bindings' examples. Every worker passes each frame \
         on unchanged: Rust, C and Python read it where it was received and write it where it is sent from (one \
         copy, the worker's own); the C++ drop-in has the original engine's interface (`recv_prev` into the \
         engine's buffer, `send_next` from it). Ratios are the medians of the per-round ratios (spread in \
         brackets); a binding is compared with Rust as processes (the same layout) and with `leap ring`'s \
         threads. Copies per hop are the transports' own (`copied_bytes` over `bytes_received`, all nodes): a \
         lending worker's copy is not counted, the C++ workers' send copy is.\n\n\
         | ring | site | frame | p50 us (spread) | p99 us | vs Rust processes | vs `leap ring` | vs tcp | copies per hop |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    let spread = |v: Option<f64>, sp: Option<f64>| {
        v.map_or("-".into(), |v| format!("{v:.3}x{}", sp.map_or(String::new(), |s| format!(" ({s:.0}%)"))))
    };
    for x in &r.rows {
        let (base, program) = split_label(&x.transport);
        if x.mode != "latency" || !programs.iter().any(|p| split_label(&p.transport).0 == base && p.site == x.site) {
            continue;
        }
        let vs_threads =
            if program.is_some() { spread(x.p50_vs_threads, x.p50_vs_threads_spread_pct) } else { "1".into() };
        let vs_rust = match program {
            Some(RUST) => "1".into(),
            Some(_) => spread(x.p50_vs_rust, x.p50_vs_rust_spread_pct),
            None => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} B | {:.1} ({:.0}%) | {:.1} | {vs_rust} | {vs_threads} | {} | {} |",
            x.transport,
            x.site,
            x.frame_size,
            x.rtt_us.p50,
            x.p50_spread_pct,
            x.rtt_us.p99,
            ratio(x.p50_vs_tcp),
            copies(x.copies_per_hop)
        );
    }
    let targeted: Vec<(&BenchRow, f64)> = programs
        .iter()
        .filter(|x| x.frame_size == 16_392)
        .filter_map(|x| {
            BINDING_TARGETS.iter().find(|(n, _)| Some(*n) == split_label(&x.transport).1).map(|t| (*x, t.1))
        })
        .collect();
    if !targeted.is_empty() {
        let _ = writeln!(s, "\nTargets at 16 392 B, p50 against Rust as processes (the same layout):\n");
    }
    for (x, target) in targeted {
        let target = &target;
        let verdict = match x.p50_vs_rust {
            Some(v) if v <= *target => format!("{v:.3}x: met"),
            Some(v) => format!("{v:.3}x: **not met**"),
            None => "no Rust processes row to compare with".into(),
        };
        let _ = writeln!(s, "- `{}` ({}): target <= {target}: {verdict}", x.transport, x.site);
    }
    s.push('\n');
}

/// The `--profile` section: the ring threads' CPU by kind of work, one
/// column per profiled transport, then each one's hottest symbols.
fn crc_costs(s: &mut String, r: &BenchReport) {
    if r.crc_costs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## What the CRC32C costs\n\n\
         Every frame between leap nodes carries a CRC32C, checked before delivery (`--no-crc` turns it off). \
         The same ring with and without it, runs interleaved, one frame in flight (medians):\n\n\
         | transport | site | frame | p50 with | p50 without | ratio | CPU/frame with | without |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for c in &r.crc_costs {
        let ratio = if c.p50_no_crc_us > 0.0 { c.p50_crc_us / c.p50_no_crc_us } else { f64::NAN };
        let _ = writeln!(
            s,
            "| {} | {} | {} B | {:.1} us | {:.1} us | {ratio:.3} | {:.1} us | {:.1} us |",
            c.transport, c.site, c.frame_size, c.p50_crc_us, c.p50_no_crc_us, c.cpu_crc_us, c.cpu_no_crc_us
        );
    }
    let _ = writeln!(s);
}

/// The keyed rows next to the plain ones of their rounds, and the key
/// floor measured in the same rounds: how much of a keyed ring's extra the
/// cryptography alone takes, and the ceiling it sets.
fn key_costs(s: &mut String, r: &BenchReport) {
    let keyed: Vec<&BenchRow> = r.rows.iter().filter(|x| x.mode == "latency" && x.p50_vs_plain.is_some()).collect();
    if keyed.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## What the ring key costs\n\n\
         Each keyed row (`+key`: every datagram tagged, `+enc`: encrypted) against the plain row of the same \
         rounds (medians of the per-round differences and ratios). The key floor is sealing and opening every \
         datagram of one frame once, with the link's own code and no socket (`leap bench`'s key floor, measured \
         in the floor's slot of every round, on the first node's CPU): a keyed ring pays it once per hop, so \
         hops x floor is the cryptography's CPU per frame, and bounds its share of the round trip's extra from \
         above (a sender's seals and its next node's opens overlap chunk by chunk where each has a core of its \
         own); a frame's bits over it is what one core can seal and open, the keyed ring's ceiling. With 8 frames in flight a ring is bound by its CPUs: \
         the keyed row's CPU per frame (all nodes) over the plain row's, next to the key floor times the hops, \
         says how much of that is the cryptography. Targets: p50 within 1.05x of plain at 16 392 B, \
         Gbit/s at least 0.9x at 1 MiB, 8 in flight.\n\n\
         | transport | site | frame | p50 over plain | of which the key floor (per hop x hops) | \
         Gbit/s vs plain, 8 in flight | CPU/frame over plain, 8 in flight | key floor's ceiling, one core |\n\
         |---|---|---|---|---|---|---|---|"
    );
    let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} us"));
    for x in keyed {
        let over = format!("{} ({})", us(x.p50_over_plain_us), ratio(x.p50_vs_plain));
        let floor = match (x.key_floor_round_trip_us, x.key_floor_us) {
            (Some(rt), Some(hop)) => {
                format!("{rt:.1} us ({hop:.1} x {})", r.hops(&x.site))
            }
            _ => "not measured".into(),
        };
        let thr = find(r, &x.transport, &x.site, x.frame_size, "throughput");
        let gbit = thr.map_or("-".into(), |t| format!("{} ({:.2} Gbit/s)", ratio(t.gbit_vs_plain), t.gbit_per_s));
        let plain_thr = super::plain_label(&x.transport).and_then(|p| find(r, p, &x.site, x.frame_size, "throughput"));
        let cpu = match (thr, plain_thr) {
            (Some(t), Some(p)) => format!("{:.1} us", t.cpu_us_per_frame - p.cpu_us_per_frame),
            _ => "-".into(),
        };
        let ceiling = thr
            .and_then(|t| t.key_floor_gbit_per_s)
            .or(x.key_floor_gbit_per_s)
            .map_or("-".into(), |g| format!("{g:.2} Gbit/s"));
        let _ = writeln!(
            s,
            "| {} | {} | {} B | {over} | {floor} | {gbit} | {cpu} | {ceiling} |",
            x.transport, x.site, x.frame_size
        );
    }
    let _ = writeln!(s);
}

fn profiles(s: &mut String, r: &BenchReport) {
    if r.profiles.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Where the CPU goes (perf, one extra latency run each)\n\n\
         `perf record -a -e cpu-clock` around one run per transport; the ring's threads' samples \
         (kernel work done in their context, such as the receiver's softirq run by the sender, included) \
         by kind of work, in % of their samples. Idle is the share of all samples taken in the idle task: \
         a high share means the round trip waits on wake-ups, not on work (a halted virtual CPU may go \
         unsampled, so on VMs it is a lower bound).\n"
    );
    let _ = write!(s, "| | ");
    for p in &r.profiles {
        let _ = write!(s, "{} ({}, {} B) | ", p.transport, p.site, p.frame_size);
    }
    let _ = write!(s, "\n|---|");
    for _ in &r.profiles {
        let _ = write!(s, "---|");
    }
    s.push('\n');
    let mut cats: Vec<&str> = Vec::new();
    for p in &r.profiles {
        for (c, _) in &p.categories {
            if !cats.contains(&c.as_str()) {
                cats.push(c);
            }
        }
    }
    let row = |s: &mut String, name: &str, cell: &dyn Fn(&super::profile::Profile) -> String| {
        let _ = write!(s, "| {name} |");
        for p in &r.profiles {
            let _ = write!(s, " {} |", cell(p));
        }
        s.push('\n');
    };
    row(s, "CPUs idle, % of all samples", &|p| format!("{:.1}", p.idle_pct));
    row(s, "ring threads, % of all samples", &|p| format!("{:.1}", p.leap_pct));
    for c in cats {
        row(s, c, &|p| p.categories.iter().find(|(n, _)| n == c).map_or("-".into(), |(_, v)| format!("{v:.1}")));
    }
    s.push('\n');
    for p in &r.profiles {
        let top: Vec<String> = p.top.iter().take(8).map(|(sym, v)| format!("`{sym}` {v:.1}")).collect();
        let _ = writeln!(s, "- hottest in {} ({}): {}", p.transport, p.site, top.join(", "));
    }
    s.push('\n');
}

fn targets(s: &mut String, r: &BenchReport, site: &str) {
    let best = |size: usize, mode: &str, key: &dyn Fn(&BenchRow) -> f64, lower: bool| {
        r.rows
            .iter()
            .filter(|x| {
                x.site == site && x.frame_size == size && x.mode == mode && FAST_PATHS.contains(&x.transport.as_str())
            })
            .min_by(|a, b| if lower { key(a).total_cmp(&key(b)) } else { key(b).total_cmp(&key(a)) })
    };
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    let _ = writeln!(s, "At site `{site}`:\n");
    match best(16_392, "latency", &|x| x.rtt_us.p50, true) {
        Some(b) => {
            let vs_tcp = b.p50_vs_tcp.map_or("no TCP measured here".into(), |v| {
                format!("{v:.2}x TCP (target <= 0.7: {})", verdict(v <= 0.7))
            });
            let vs_floor = b
                .p50_vs_floor
                .map_or("no floor".into(), |v| format!("{v:.2}x the floor (target <= 2: {})", verdict(v <= 2.0)));
            let _ = writeln!(
                s,
                "- 16 392 B, one in flight: best fast path `{}` p50 {:.1} us = {vs_tcp}, {vs_floor}.",
                b.transport, b.rtt_us.p50,
            );
        }
        None => {
            let _ = writeln!(s, "- 16 392 B latency: no fast path measured here.");
        }
    }
    if let Some(u) = find(r, "udp", site, 16_392, "latency")
        && let Some(v) = u.p50_vs_tcp
    {
        let spread = u.p50_vs_tcp_spread_pct.map_or(String::new(), |s| format!(", spread {s:.0}% over the rounds"));
        let _ = writeln!(
            s,
            "- 16 392 B, one in flight: `udp` p50 {:.1} us = {v:.2}x TCP{spread} (target <= 0.85: {}).",
            u.rtt_us.p50,
            verdict(v <= 0.85)
        );
    }
    match best(262_152, "throughput", &|x| x.gbit_per_s, false) {
        Some(b) => {
            let v = b
                .gbit_vs_tcp
                .map_or("no TCP measured here".into(), |v| format!("{v:.2}x TCP (target >= 1: {})", verdict(v >= 1.0)));
            let _ = writeln!(
                s,
                "- 262 152 B, 8 in flight: best fast path `{}` {:.2} Gbit/s = {v}.",
                b.transport, b.gbit_per_s,
            );
        }
        None => {
            let _ = writeln!(s, "- 262 152 B throughput: no fast path measured here.");
        }
    }
    for t in FAST_PATHS {
        let mut worse = Vec::new();
        let mut compared = 0;
        for x in r.rows.iter().filter(|x| x.site == site && x.transport == t) {
            if let Some(tcp) = find(r, "tcp", site, x.frame_size, &x.mode) {
                compared += 1;
                if x.cpu_us_per_frame > tcp.cpu_us_per_frame {
                    worse.push(format!(
                        "{} B {}: {:.1} vs {:.1} us",
                        x.frame_size, x.mode, x.cpu_us_per_frame, tcp.cpu_us_per_frame
                    ));
                }
            }
        }
        if compared > 0 {
            let _ = writeln!(
                s,
                "- CPU per frame of `{t}` no higher than TCP's: {}{}",
                verdict(worse.is_empty()),
                if worse.is_empty() { String::new() } else { format!(" ({})", worse.join("; ")) }
            );
        }
    }
    s.push('\n');
}

/// Per site, two bar charts side by side: latency p50 (log scale) and
/// throughput, per frame size, one colour per transport. Every site has
/// its own panels and axes: an emulated VM's figures would otherwise
/// squash the host's bars (or hide their own) on a shared scale.
pub fn svg(r: &BenchReport) -> String {
    const COLORS: [&str; 8] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];
    let ser = transports(r);
    let sz = sizes(r);
    let all_sites = sites(r);
    let (w, pad, block_h) = (1100.0f64, 60.0f64, 440.0f64);
    // The legend, in as many lines as the transports (and ring programs'
    // rows) need: (x, line) of each entry.
    let entry_w = |t: &str| 24.0 + 7.0 * t.chars().count() as f64;
    let mut legend = Vec::new();
    let (mut lx, mut line) = (pad, 0usize);
    for t in &ser {
        if lx + entry_w(t) > w - pad && lx > pad {
            (lx, line) = (pad, line + 1);
        }
        legend.push((lx, line));
        lx += entry_w(t);
    }
    let h = 40.0 + block_h * all_sites.len().max(1) as f64 + 60.0 + 20.0 * line as f64;
    let panel_w = (w - 3.0 * pad) / 2.0;
    let plot_h = block_h - pad - 60.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="16" text-anchor="middle">leap bench: {}-node ring, {}</text>"#,
        w / 2.0,
        r.nodes,
        placement_text(r, "veth between namespaces")
    );
    type Metric<'a> = &'a dyn Fn(&BenchRow) -> f64;
    for (bi, site) in all_sites.iter().enumerate() {
        let top = 40.0 + bi as f64 * block_h;
        let _ = writeln!(
            s,
            r#"<g class="site" data-site="{site}"><text x="{pad}" y="{}" font-size="14" font-weight="bold">{site}</text>"#,
            top + 16.0
        );
        let panels: [(&str, &str, bool, Metric<'_>); 2] = [
            ("Round-trip p50, one in flight (us, log scale; dashed: floor)", "latency", true, &|x| x.rtt_us.p50),
            ("Throughput, 8 in flight (Gbit/s)", "throughput", false, &|x| x.gbit_per_s),
        ];
        let floors: Vec<_> = r.floors.iter().filter(|f| &f.site == site).collect();
        for (pi, (title, mode, log, val)) in panels.into_iter().enumerate() {
            let x0 = pad + pi as f64 * (panel_w + pad);
            let y0 = top + pad;
            let vals: Vec<f64> =
                r.rows.iter().filter(|x| x.mode == mode && &x.site == site).map(val).filter(|v| *v > 0.0).collect();
            let mut vmax = vals.iter().copied().fold(0.0, f64::max).max(1e-9);
            let mut vmin = vals.iter().copied().fold(f64::INFINITY, f64::min).min(vmax);
            if log {
                for f in &floors {
                    vmin = vmin.min(f.rtt_us.p50);
                    vmax = vmax.max(f.rtt_us.p50);
                }
                vmin = 10f64.powf(vmin.max(1e-3).log10().floor());
                vmax = 10f64.powf(vmax.log10().ceil());
            } else {
                vmax *= 1.1;
            }
            let scale = |v: f64| -> f64 {
                let frac =
                    if log { (v.max(vmin).log10() - vmin.log10()) / (vmax.log10() - vmin.log10()) } else { v / vmax };
                plot_h * frac.clamp(0.0, 1.0)
            };
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{title}</text>"#,
                x0 + panel_w / 2.0,
                y0 - 8.0
            );
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" y1="{}" x2="{}" y2="{}" stroke="#333"/>"##,
                y0 + plot_h,
                x0 + panel_w,
                y0 + plot_h
            );
            let _ = writeln!(s, r##"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{}" stroke="#333"/>"##, y0 + plot_h);
            let ticks: Vec<f64> = if log {
                let (a, b) = (vmin.log10() as i32, vmax.log10() as i32);
                (a..=b).map(|e| 10f64.powi(e)).collect()
            } else {
                (0..=4).map(|i| vmax * f64::from(i) / 4.0).collect()
            };
            for t in ticks {
                let y = y0 + plot_h - scale(t);
                let _ = writeln!(s, r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/>"##, x0, x0 + panel_w);
                let _ =
                    writeln!(s, r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, x0 - 4.0, y + 4.0, fmt_num(t));
            }
            if log {
                for f in &floors {
                    let y = y0 + plot_h - scale(f.rtt_us.p50);
                    let _ = writeln!(
                        s,
                        r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#555" stroke-dasharray="6,4"><title>floor ({}) {:.1} us</title></line>"##,
                        x0 + panel_w,
                        f.site,
                        f.rtt_us.p50
                    );
                }
            }
            let group_w = panel_w / sz.len().max(1) as f64;
            let bar_w = (group_w * 0.8 / ser.len().max(1) as f64).max(1.0);
            for (gi, &z) in sz.iter().enumerate() {
                let gx = x0 + gi as f64 * group_w + group_w * 0.1;
                let _ = writeln!(
                    s,
                    r#"<text x="{}" y="{}" text-anchor="middle">{} B</text>"#,
                    gx + group_w * 0.4,
                    y0 + plot_h + 16.0,
                    z
                );
                for (si, t) in ser.iter().enumerate() {
                    if let Some(row) = find(r, t, site, z, mode) {
                        let v = val(row);
                        let bh = scale(v);
                        let _ = writeln!(
                            s,
                            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{t} ({site}) {z} B: {}</title></rect>"#,
                            gx + si as f64 * bar_w,
                            y0 + plot_h - bh,
                            bar_w * 0.92,
                            bh,
                            COLORS[si % COLORS.len()],
                            fmt_num(v)
                        );
                    }
                }
            }
        }
        s.push_str("</g>\n");
    }
    for (si, (t, &(lx, line))) in ser.iter().zip(&legend).enumerate() {
        let ly = 40.0 + block_h * all_sites.len().max(1) as f64 + 30.0 + 20.0 * line as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{}"/>"#,
            ly - 10.0,
            COLORS[si % COLORS.len()]
        );
        let _ = writeln!(s, r#"<text x="{}" y="{ly}">{t}</text>"#, lx + 16.0);
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Floor;
    use crate::ring::Percentiles;

    fn row(transport: &str, site: &str, mode: &str, p50: f64, datagrams: Option<f64>) -> BenchRow {
        BenchRow {
            transport: transport.into(),
            site: site.into(),
            frame_size: 16_392,
            mode: mode.into(),
            inflight: if mode == "latency" { 1 } else { 8 },
            repeats: 1,
            frames: 100,
            rtt_us: Percentiles { p50, p90: p50, p99: p50, max: p50, mean: p50 },
            round_p50_us: vec![p50],
            p50_spread_pct: 0.0,
            round_trips_per_s: 1e6 / p50,
            gbit_per_s: 1.0,
            round_gbit_per_s: vec![1.0],
            cpu_us_per_frame: 1.0,
            frames_lost: 0,
            frames_corrupt: 0,
            retransmits: 0,
            frames_resent: 0,
            copies_per_hop: None,
            datagrams_per_frame: datagrams,
            ..BenchRow::default()
        }
    }

    fn report() -> BenchReport {
        let mut r = BenchReport { nodes: 3, placement: "netns".into(), ..BenchReport::default() };
        for (site, tcp, udp) in [("host", 50.0, 40.0), ("vm", 5000.0, 4000.0)] {
            for mode in ["latency", "throughput"] {
                r.rows.push(row("tcp", site, mode, tcp, None));
                r.rows.push(row("udp", site, mode, udp, Some(if mode == "latency" { 12.0 } else { 4.5 })));
                r.rows.push(row("udp+bp", site, mode, udp, Some(12.0)));
            }
            r.floors.push(Floor {
                site: site.into(),
                rtt_us: Percentiles { p50: tcp / 5.0, ..Default::default() },
                hops: 3,
                round_p50_us: Vec::new(),
            });
        }
        r.compute_ratios();
        r
    }

    #[test]
    fn datagrams_per_frame_shows_tcp_as_a_stream() {
        let md = markdown(&report());
        let table = md.split("## Datagrams per frame").nth(1).expect("a datagrams table");
        let line = |t: &str, site: &str| {
            table.lines().find(|l| l.starts_with(&format!("| {t} | {site} |"))).unwrap_or_else(|| panic!("{table}"))
        };
        assert!(line("tcp", "host").contains("stream / stream"), "{table}");
        assert!(line("udp", "host").contains("12.00 / 4.50"), "{table}");
        assert!(line("udp+bp", "vm").contains("12.00 / 12.00"), "{table}");
    }

    #[test]
    fn host_and_vm_are_drawn_in_panels_of_their_own() {
        let svg = svg(&report());
        let groups: Vec<&str> = svg.split(r#"<g class="site" data-site=""#).skip(1).collect();
        assert_eq!(groups.len(), 2, "{svg}");
        assert!(groups[0].starts_with("host\"") && groups[1].starts_with("vm\""));
        // The host's TCP bar (50 us) on its own log axis (10..100 us) fills
        // most of the plot; on an axis shared with the VM (10..10 000 us)
        // it would be under a quarter of it.
        let height = |g: &str, what: &str| -> f64 {
            let rect = g.split("<rect ").find(|r| r.contains(what)).unwrap_or_else(|| panic!("{what}: {g}"));
            let h = rect.split("height=\"").nth(1).unwrap();
            h[..h.find('"').unwrap()].parse().unwrap()
        };
        let plot_h = 440.0 - 60.0 - 60.0;
        let host_tcp = height(groups[0], "tcp (host) 16392 B: 50.0");
        assert!(host_tcp > 0.6 * plot_h, "host bar squashed: {host_tcp} of {plot_h}");
        let vm_tcp = height(groups[1], "tcp (vm) 16392 B: 5000");
        assert!(vm_tcp > 0.6 * plot_h, "vm bar squashed: {vm_tcp} of {plot_h}");
        assert!(!groups[0].contains("(vm)") && !groups[1].contains("(host)"), "sites mixed in one panel");
    }

    #[test]
    fn the_legend_of_many_rows_wraps_inside_the_chart() {
        let mut r = report();
        for t in ["xdp-ringbuf", "xdp-ringbuf·rust", "xdp-ringbuf·c", "xdp-ringbuf·cpp", "xdp-ringbuf·python"] {
            for kind in ["udp", "xdp"] {
                r.rows.push(row(&format!("{kind}{t}"), "host", "latency", 40.0, None));
            }
        }
        let svg = svg(&r);
        let height: f64 = svg.split("height=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        assert!(height > 40.0 + 2.0 * 440.0 + 60.0, "a second legend line makes room: {height}");
        for text in svg.split("<text x=\"").skip(1) {
            let x: f64 = text.split('"').next().unwrap().parse().unwrap();
            let label = text.split('>').nth(1).unwrap().split('<').next().unwrap();
            assert!(x + 7.0 * label.chars().count() as f64 <= 1100.0, "{label} at {x} leaves the chart");
        }
    }
}
