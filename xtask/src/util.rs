//! Running commands under a time limit, in process groups of their own, and
//! finding the workspace root; shared by every task.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The workspace root found by [`init_root`].
static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Finds the workspace root from the current directory, once per run, so
/// that an xtask binary built elsewhere still works on the checkout it is
/// run in.
///
/// # Errors
///
/// When the current directory is not inside the leap repository.
pub fn init_root() -> Result<()> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let root = find_root(&cwd)?;
    let _ = ROOT.set(root);
    Ok(())
}

/// The workspace root (the directory of the `Cargo.toml` whose
/// `[workspace]` has the `xtask` member).
///
/// # Panics
///
/// When [`init_root`] has not succeeded (`main` calls it first).
pub fn root() -> PathBuf {
    ROOT.get().expect("util::init_root runs first in main").clone()
}

/// The nearest directory at or above `dir` whose `Cargo.toml` declares a
/// `[workspace]` with the `xtask` member.
///
/// # Errors
///
/// When there is none: `cargo xtask` was run outside the leap repository.
pub fn find_root(dir: &Path) -> Result<PathBuf> {
    for d in dir.ancestors() {
        let Ok(manifest) = std::fs::read_to_string(d.join("Cargo.toml")) else { continue };
        let workspace = manifest.lines().any(|l| l.trim() == "[workspace]");
        if workspace && manifest.contains("\"xtask\"") && d.join("xtask").is_dir() {
            return Ok(d.to_path_buf());
        }
    }
    bail!(
        "{} is not inside the leap repository (no Cargo.toml with a [workspace] that has the xtask member \
         at or above it); run `cargo xtask` from the checkout",
        dir.display()
    )
}

/// Whether we run in CI (`CI=true`): missing tools and privileges are errors there.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether we run as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// How long a command may run before it is killed with its process group,
/// unless its caller gives it another limit ([`run_for`], [`capture`]).
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(20 * 60);

/// Commands that take longer than this have their time printed, so that a
/// CI log shows where the time went.
const SLOW: Duration = Duration::from_secs(30);

/// How long a command killed for overrunning gets after SIGTERM before
/// SIGKILL (a nested `cargo xtask` then takes its own children down).
const GRACE: Duration = Duration::from_secs(5);

/// What `cargo xtask ci` changes in the release profile for every cargo it
/// runs (maturin's included): no link-time optimisation and no debug info.
/// With the profile's thin LTO, each of the ~30 integration-test binaries
/// the privileged stages build spent about 100 s in its link on a 2-CPU
/// machine (the whole program optimised again per binary), 2 s without.
/// The code under test is the same; only `cargo xtask bench` and users'
/// builds get the optimised profile.
const TEST_BUILD_PROFILE: [(&str, &str); 2] =
    [("CARGO_PROFILE_RELEASE_LTO", "false"), ("CARGO_PROFILE_RELEASE_DEBUG", "0")];

static TEST_BUILDS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, release builds this process starts use the CI's quicker
/// profile ([`TEST_BUILD_PROFILE`]).
pub fn use_test_build_profile() {
    TEST_BUILDS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Runs a command, echoing it, and fails unless it exits 0 within
/// [`DEFAULT_LIMIT`].
///
/// # Errors
///
/// When it cannot start, overruns (it and its process group are killed),
/// or exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    run_for(cmd, DEFAULT_LIMIT)
}

/// [`run`] with a time limit of its own.
///
/// # Errors
///
/// As [`run`].
pub fn run_for(cmd: &mut Command, limit: Duration) -> Result<()> {
    eprintln!("+ {}", show(cmd));
    let mut child = Watched::spawn(cmd)?;
    let status = child.wait(limit)?;
    if !status.success() {
        bail!("{} failed: {status}", child.what);
    }
    Ok(())
}

/// Runs a command and returns its stdout, failing unless it exits 0 within
/// [`DEFAULT_LIMIT`].
///
/// # Errors
///
/// As [`run`]; the error carries the command's stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = capture(cmd, DEFAULT_LIMIT)?;
    if !out.status.success() {
        bail!("{} failed: {}\n{}", show(cmd), out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command to its end within `limit`, collecting stdout and stderr
/// whatever its exit status.
///
/// # Errors
///
/// When it cannot start or overruns (it and its process group are killed).
pub fn capture(cmd: &mut Command, limit: Duration) -> Result<Output> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = Watched::spawn(cmd)?;
    let (tx, rx) = mpsc::channel();
    for (i, pipe) in
        [child.child.stdout.take().map(Pipe::Out), child.child.stderr.take().map(Pipe::Err)].into_iter().enumerate()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = match pipe {
                Some(Pipe::Out(mut p)) => p.read_to_end(&mut buf),
                Some(Pipe::Err(mut p)) => p.read_to_end(&mut buf),
                None => Ok(0),
            };
            let _ = tx.send((i, buf));
        });
    }
    drop(tx);
    let status = child.wait(limit)?;
    let mut bufs = [Vec::new(), Vec::new()];
    for _ in 0..2 {
        let left = (child.started + limit).saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, buf)) => bufs[i] = buf,
            Err(_) => {
                // Something the command started still holds its output open.
                child.kill_group();
                bail!("{} exited, but what it started kept running past {}: killed", child.what, minutes(limit));
            }
        }
    }
    let [stdout, stderr] = bufs;
    Ok(Output { status, stdout, stderr })
}

/// Runs a command within `limit`, its stderr passed through line by line
/// and also returned (stdout passes through untouched).
///
/// # Errors
///
/// When it cannot start or overruns (it and its process group are killed).
pub fn run_teeing_stderr(cmd: &mut Command, limit: Duration) -> Result<(ExitStatus, String)> {
    cmd.stderr(Stdio::piped());
    let mut child = Watched::spawn(cmd)?;
    let stderr = child.child.stderr.take().context("stderr of the child")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            all.push_str(&line);
            all.push('\n');
        }
        let _ = tx.send(all);
    });
    let status = child.wait(limit)?;
    match rx.recv_timeout((child.started + limit).saturating_duration_since(Instant::now())) {
        Ok(all) => Ok((status, all)),
        Err(_) => {
            child.kill_group();
            bail!("{} exited, but what it started kept running past {}: killed", child.what, minutes(limit));
        }
    }
}

/// One of a child's output pipes.
enum Pipe {
    Out(std::process::ChildStdout),
    Err(std::process::ChildStderr),
}

/// A child started in a process group of its own, so that it can be killed
/// with everything it started; killed so when dropped unfinished.
#[derive(Debug)]
pub struct Watched {
    /// The child (the leader of its process group).
    pub child: Child,
    /// The command line, for messages.
    pub what: String,
    started: Instant,
    reaped: bool,
    slot: Option<usize>,
}

impl Watched {
    /// Starts `cmd` (stdin from /dev/null) as the leader of a new process
    /// group, which Ctrl-C and SIGTERM of the xtask then reach too.
    ///
    /// # Errors
    ///
    /// When it cannot start.
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let what = show(cmd);
        cmd.stdin(Stdio::null()).process_group(0);
        if TEST_BUILDS.load(std::sync::atomic::Ordering::Relaxed) {
            for (var, value) in TEST_BUILD_PROFILE {
                if std::env::var_os(var).is_none() {
                    cmd.env(var, value);
                }
            }
        }
        let child = cmd.spawn().with_context(|| format!("cannot start {what}"))?;
        let slot = signals::register(child.id());
        Ok(Self { child, what, started: Instant::now(), reaped: false, slot })
    }

    /// Waits for the child to exit, at most until `limit` after it started;
    /// prints how long it took when that was long.
    ///
    /// # Errors
    ///
    /// When it overran: it and its process group are killed and the error
    /// names the command and the limit.
    pub fn wait(&mut self, limit: Duration) -> Result<ExitStatus> {
        let deadline = self.started + limit;
        let mut nap = Duration::from_millis(2);
        loop {
            if let Some(status) = self.child.try_wait().with_context(|| format!("waiting for {}", self.what))? {
                self.reaped = true;
                let took = self.started.elapsed();
                if took >= SLOW {
                    eprintln!("+ {:.0} s: {}", took.as_secs_f64(), shorten(&self.what));
                }
                return Ok(status);
            }
            let now = Instant::now();
            if now >= deadline {
                self.kill_group();
                bail!("{} did not finish within {}: killed it and its process group", self.what, minutes(limit));
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(200));
        }
    }

    /// SIGTERM to the child's process group, SIGKILL after [`GRACE`], then
    /// reaps the child.
    pub fn kill_group(&mut self) {
        let Ok(pid) = i32::try_from(self.child.id()) else { return };
        let group = Pid::from_raw(pid);
        let _ = killpg(group, Signal::SIGTERM);
        let until = Instant::now() + GRACE;
        while !self.reaped && Instant::now() < until {
            self.reaped = matches!(self.child.try_wait(), Ok(Some(_)) | Err(_));
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = killpg(group, Signal::SIGKILL);
        if !self.reaped {
            let _ = self.child.wait();
            self.reaped = true;
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_group();
        }
        if let Some(slot) = self.slot {
            signals::unregister(slot);
        }
    }
}

/// `20 min`, or `90 s` when not whole minutes.
fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 && s.is_multiple_of(60) { format!("{} min", s / 60) } else { format!("{s} s") }
}

/// A command line cut to a length that fits a log line.
fn shorten(s: &str) -> String {
    const MAX: usize = 160;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{} ...", &s[..at]),
        None => s.to_owned(),
    }
}

/// Ctrl-C and SIGTERM reach the xtask alone (its children run in process
/// groups of their own): the xtask passes SIGTERM on to each live group,
/// then dies of the signal itself.
pub mod signals {
    use std::sync::atomic::{AtomicI32, Ordering};

    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, killpg, raise, sigaction};
    use nix::unistd::Pid;

    /// Process groups of the children alive now (0: free slot).
    static LIVE: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];

    /// Passes SIGINT and SIGTERM on to the live children's groups.
    pub fn forward() {
        let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESETHAND, SigSet::empty());
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            // SAFETY: `on_signal` only loads atomics and calls kill(2) and
            // raise(3), which are async-signal-safe.
            let _ = unsafe { sigaction(sig, &action) };
        }
    }

    extern "C" fn on_signal(sig: i32) {
        for slot in &LIVE {
            let pid = slot.load(Ordering::SeqCst);
            if pid > 0 {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        // SA_RESETHAND restored the default action: die of the signal.
        if let Ok(sig) = Signal::try_from(sig) {
            let _ = raise(sig);
        }
    }

    /// Records a child's process group; `None` when every slot is taken
    /// (the child then only misses the forwarding).
    pub(super) fn register(pid: u32) -> Option<usize> {
        let pid = i32::try_from(pid).ok()?;
        LIVE.iter().position(|s| s.compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst).is_ok())
    }

    pub(super) fn unregister(slot: usize) {
        LIVE[slot].store(0, Ordering::SeqCst);
    }
}

/// The command line as a shell would show it.
pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_from_a_subdirectory_of_the_checkout() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let want = here.parent().unwrap();
        assert_eq!(find_root(&here.join("src")).unwrap(), want);
        assert_eq!(find_root(want).unwrap(), want);
    }

    #[test]
    fn a_command_over_its_limit_is_killed_with_its_process_group() {
        // The test binary plays the hung command: this test, run again in
        // a child, starts a grandchild in its group and both hang.
        const ROLE: &str = "XTASK_WATCHDOG_TEST";
        let me = "util::tests::a_command_over_its_limit_is_killed_with_its_process_group";
        let exe = std::env::current_exe().unwrap();
        let hang = || std::thread::sleep(Duration::from_secs(120));
        match std::env::var(ROLE).as_deref() {
            Ok("child") => {
                let mut grandchild =
                    crate::tools::built(&exe).args(["--exact", me]).env(ROLE, "grandchild").spawn().unwrap();
                std::fs::write(std::env::var("XTASK_WATCHDOG_PIDFILE").unwrap(), grandchild.id().to_string()).unwrap();
                // Hangs as long as the grandchild does.
                let _ = grandchild.wait();
                return;
            }
            Ok(_) => return hang(),
            Err(_) => {}
        }
        let pidfile = std::env::temp_dir().join(format!("xtask-watchdog-{}", std::process::id()));
        let _ = std::fs::remove_file(&pidfile);
        let started = Instant::now();
        let mut cmd = crate::tools::built(&exe);
        cmd.args(["--exact", me]).env(ROLE, "child").env("XTASK_WATCHDOG_PIDFILE", &pidfile);
        let err = run_for(&mut cmd, Duration::from_secs(3)).unwrap_err().to_string();
        assert!(err.contains("did not finish within 3 s") && err.contains("killed"), "{err}");
        assert!(err.contains(me), "the error names the command: {err}");
        assert!(started.elapsed() < Duration::from_secs(3) + GRACE, "took {:?}", started.elapsed());
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        std::fs::remove_file(&pidfile).unwrap();
        // The grandchild went with the group (a zombie until init reaps it).
        let stat = format!("/proc/{}/stat", pid.trim());
        let until = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(Instant::now() < until, "the grandchild {pid} outlived its killed group");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn outside_the_checkout_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("xtask-root-test-{}", std::process::id()));
        let nested = dir.join("member/src");
        std::fs::create_dir_all(&nested).unwrap();
        // A workspace of someone else's: no xtask member.
        std::fs::write(dir.join("Cargo.toml"), "[workspace]\nmembers = [\"member\"]\n").unwrap();
        let err = find_root(&nested).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("not inside the leap repository"), "{err}");
    }
}
