//! `leap bench-member`: one ring member speaking the benchmark's ring
//! program protocol (see `crate::bench::programs`), so that `leap bench`
//! runs Rust's ring as one process per node, as it runs the bindings'
//! programs. The head and worker loops are `leap ring`'s own
//! (`run_head`, `run_worker`); only the layout differs.

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use super::node::Role;
use crate::ring::{HeadConfig, WorkerConfig, loss_policy, run_head, run_worker};
use crate::transport::open::TransportKind;
use crate::transport::settings::Settings;

/// How long the head waits for a frame back before giving up (the
/// benchmark's rings' bound).
const STALL: Duration = Duration::from_secs(20);

/// Arguments of `leap bench-member`: the protocol's.
#[derive(Debug, Clone, Args)]
pub struct MemberArgs {
    /// Backend.
    #[arg(long)]
    pub kind: TransportKind,
    /// Head or worker.
    #[arg(long, value_enum)]
    pub role: Role,
    /// This node's address.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: String,
    /// The next node's address.
    #[arg(long, value_name = "ADDR:PORT")]
    pub next: String,
    /// The previous node's address (empty: the first source).
    #[arg(long, value_name = "ADDR:PORT", default_value = "")]
    pub prev: String,
    /// Head: frames to send.
    #[arg(long)]
    pub frames: u64,
    /// Bytes per frame.
    #[arg(long)]
    pub frame_size: usize,
    /// Workers in the ring.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// This worker's place among the workers.
    #[arg(long, default_value_t = 0)]
    pub index: usize,
    /// A transport setting (the keys of `leap_config_set`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// End as at SIGINT when standard input closes: `leap bench --hosts
    /// ssh://...` starts members so, and the member ends with the ssh
    /// channel, whoever closed it.
    #[arg(long)]
    pub watch_stdin: bool,
}

/// Sets `stop` once standard input reaches its end (or fails).
fn watch_stdin(stop: Arc<AtomicBool>) -> Result<()> {
    std::thread::Builder::new()
        .name("leap-stdin".into())
        .spawn(move || {
            let mut buf = [0u8; 256];
            let mut input = std::io::stdin().lock();
            while matches!(input.read(&mut buf), Ok(n) if n > 0) {}
            stop.store(true, Ordering::SeqCst);
        })
        .context("starting the thread watching standard input")?;
    Ok(())
}

/// User plus system CPU time of this thread since `from`, in seconds.
fn cpu_since(from: (Duration, Duration)) -> f64 {
    let now = crate::sys::thread_cpu_time();
    (now.0 + now.1).saturating_sub(from.0 + from.1).as_secs_f64()
}

/// Runs `leap bench-member`.
///
/// # Errors
///
/// A bad setting, a transport that does not open or fails, or corrupt
/// frames (head).
pub fn main(args: &MemberArgs) -> Result<()> {
    let mut s = Settings::new(args.kind);
    s.set("listen", &args.listen)?;
    s.set("next", &args.next)?;
    s.set("prev", &args.prev)?;
    s.set("frame_size", &args.frame_size.to_string())?;
    for kv in &args.sets {
        let (k, v) = kv.split_once('=').with_context(|| format!("--set {kv}: give KEY=VALUE"))?;
        s.set(k, v)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    if args.watch_stdin {
        watch_stdin(stop.clone())?;
    }
    let inflight = s.options().inflight;
    let reliability = s.options().reliability;
    let mut t = s.open().with_context(|| format!("opening {} on {}", args.kind, args.listen))?;
    match args.role {
        Role::Worker => {
            println!("ready");
            std::io::stdout().flush()?;
            // Passes frames on until --frames were, or the benchmark's SIGINT.
            let mut wc = WorkerConfig::new(args.frame_size);
            wc.max_frames = Some(args.frames);
            let cpu0 = crate::sys::thread_cpu_time();
            run_worker(&mut *t, &wc, &stop).context("worker")?;
            let cpu_s = cpu_since(cpu0);
            println!(
                "{}",
                serde_json::json!({ "role": "worker", "index": args.index, "stats": t.stats(), "cpu_s": cpu_s })
            );
        }
        Role::Head => {
            let (lost_after, retry) = loss_policy(args.kind, reliability);
            let mut hc = HeadConfig::new(args.frame_size, args.frames);
            hc.inflight = inflight;
            hc.stall_timeout = STALL;
            hc.lost_after = Some(lost_after);
            hc.retry = retry;
            hc.stop = Some(stop);
            let cpu0 = crate::sys::thread_cpu_time();
            let rep = run_head(&mut *t, &hc)?;
            let cpu_s = cpu_since(cpu0);
            println!(
                "{}",
                serde_json::json!({
                    "role": "head",
                    "rtt_us": rep.rtt.percentiles(),
                    "frames_sent": rep.sent,
                    "frames_delivered": rep.delivered,
                    "frames_corrupt": rep.corrupt,
                    "frames_lost": rep.lost,
                    "elapsed_s": rep.elapsed.as_secs_f64(),
                    "stats": t.stats(),
                    "cpu_s": cpu_s,
                })
            );
            if rep.corrupt > 0 {
                bail!("{} corrupt frames", rep.corrupt);
            }
        }
    }
    Ok(())
}
