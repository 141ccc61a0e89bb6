//! Rings across hosts started over SSH, as mpirun and pdsh start their
//! ranks: the OpenSSH client in batch mode, with the operator's keys,
//! known_hosts and ssh config, runs one `leap bench-member` per host for
//! each ring and reads its JSON report back from the channel. Where SSH
//! reaches the hosts, no agent and no token are needed.
//!
//! Every ssh runs with `BatchMode=yes` (no prompt: a key that is not loaded
//! fails) and `StrictHostKeyChecking=yes` (a host whose key known_hosts
//! does not hold is refused; nothing can turn that off). A member watches
//! its standard input, the channel: whoever closes it (this process ending
//! a ring, failing or killed, or the connection dying), the member stops,
//! drops its transport and exits.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::programs::{self, Member, Members};
use super::{BenchHost, FloorOutcome, Rings};
use crate::ring::{RingConfig, RingReport};
use crate::serve::capabilities::HostCapabilities;
use crate::serve::coordinator::{bench_host, kernels_across, unavailable_across};
use crate::transport::open::{Endpoint, TransportKind};

/// The URL scheme of a host started over SSH.
pub const SCHEME: &str = "ssh://";
/// The leap binary on the hosts by default: found on the remote PATH.
pub const DEFAULT_REMOTE_LEAP: &str = "leap";
/// ssh's `ConnectTimeout` unless the operator gives one.
const CONNECT_TIMEOUT_S: u64 = 10;
/// Longest wait for a host's capabilities (connecting, then loading the
/// XDP program once to let its verifier answer).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a ring may take beyond opening and the stall bound.
const RUN_MARGIN: Duration = Duration::from_secs(60 + CONNECT_TIMEOUT_S);
/// How often a probe is checked.
const POLL: Duration = Duration::from_millis(20);
/// Options leap sets itself, which `--ssh-option` may not change.
const FIXED_OPTIONS: [&str; 2] = ["batchmode", "stricthostkeychecking"];

/// `ssh://[USER@]HOST[:PORT]`: where one member is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshTarget {
    /// Login name (default: ssh's, from its config or the local user).
    pub user: Option<String>,
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port (default: ssh's, from its config, else 22).
    pub port: Option<u16>,
}

impl std::str::FromStr for SshTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{s}`: {why}; give ssh://[USER@]HOST[:PORT]");
        let rest = s.strip_prefix(SCHEME).ok_or_else(|| bad("not an ssh:// address"))?;
        let (user, hostport) = match rest.split_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        if let Some(u) = user
            && (u.is_empty()
                || u.starts_with('-')
                || !u.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        {
            return Err(bad("a user name is letters, digits, `.`, `_` and `-`"));
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("no `]` after an IPv6 address"))?;
            match after {
                "" => (h, None),
                p => (h, Some(p.strip_prefix(':').ok_or_else(|| bad("`:PORT` after `]`"))?)),
            }
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        let host_ok = |h: &str| {
            !h.is_empty()
                && !h.starts_with('-')
                && h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_:%".contains(&b))
        };
        if !host_ok(host) {
            return Err(bad("a host is a name or an address"));
        }
        let port = match port {
            None => None,
            Some(p) => Some(p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| bad("the port is 1..=65535"))?),
        };
        Ok(Self { user: user.map(Into::into), host: host.into(), port })
    }
}

impl std::fmt::Display for SshTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(SCHEME)?;
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?
        } else {
            f.write_str(&self.host)?
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// One `--hosts` entry: a host to start over SSH, or a `leap serve` agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostAddr {
    /// `ssh://[USER@]HOST[:PORT]`.
    Ssh(SshTarget),
    /// An agent's control address.
    Agent(SocketAddr),
}

impl std::str::FromStr for HostAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with(SCHEME) {
            return s.parse().map(Self::Ssh);
        }
        s.parse().map(Self::Agent).map_err(|_| {
            format!("`{s}`: give ssh://[USER@]HOST[:PORT] (started over ssh) or an agent's control ADDR:PORT")
        })
    }
}

/// One host whose members are started over SSH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshHost {
    /// Name in the report and in messages.
    pub name: String,
    /// Where ssh logs in.
    pub target: SshTarget,
    /// Its ring member's data address.
    pub data: SocketAddr,
    /// Interface its frames arrive on (XDP attaches there).
    pub iface: Option<String>,
}

/// A hosts file of hosts started over ssh (`leap bench --hosts-file`):
/// `[[host]]` tables with `ssh` instead of an agent's `control`.
#[derive(Clone, Debug, serde::Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SshHostsFile {
    /// `-o` options for every ssh.
    #[serde(default)]
    pub ssh_options: Vec<String>,
    /// The leap binary on the hosts.
    #[serde(default)]
    pub remote_leap: Option<String>,
    /// The hosts, in ring order (the first is the head).
    #[serde(rename = "host")]
    pub hosts: Vec<SshHostEntry>,
}

/// One `[[host]]` of an [`SshHostsFile`].
#[derive(Clone, Debug, serde::Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SshHostEntry {
    /// Name in the report (default `hI`).
    #[serde(default)]
    pub name: Option<String>,
    /// `ssh://[USER@]HOST[:PORT]`.
    pub ssh: String,
    /// Its ring member's data address (default: the host's, port 9999).
    #[serde(default)]
    pub data: Option<SocketAddr>,
    /// Interface its frames arrive on (XDP attaches there).
    #[serde(default)]
    pub iface: Option<String>,
}

impl SshHostsFile {
    /// The hosts.
    ///
    /// # Errors
    ///
    /// An `ssh` that is not an ssh:// address, or a name that does not
    /// resolve (and no `data`).
    pub fn hosts(&self) -> Result<Vec<SshHost>, String> {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let mut host = SshHost::new(i, h.ssh.parse()?, h.data, h.iface.clone())?;
                if let Some(n) = &h.name {
                    host.name.clone_from(n);
                }
                Ok(host)
            })
            .collect()
    }
}

impl SshHost {
    /// Host `i` of the ring at `target`; its data address is `data`, else
    /// the target's address as this host resolves it, port 9999.
    ///
    /// # Errors
    ///
    /// No `data` and a host name that does not resolve.
    pub fn new(i: usize, target: SshTarget, data: Option<SocketAddr>, iface: Option<String>) -> Result<Self, String> {
        let name = format!("h{i}");
        let data = match data {
            Some(d) => d,
            None => {
                let ip = (target.host.as_str(), 0)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| {
                        format!(
                            "host {name} ({target}): cannot resolve {} for its data address; give --data",
                            target.host
                        )
                    })?
                    .ip();
                SocketAddr::new(ip, leap_common::DEFAULT_PORT)
            }
        };
        Ok(Self { name, target, data, iface })
    }

    fn who(&self) -> String {
        format!("host {} ({})", self.name, self.target)
    }
}

/// Why a host could not be used over SSH: one line each, naming the host.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// No ssh client on this machine.
    #[error(
        "ssh (the OpenSSH client) is missing: install the Debian package openssh-client (`apt-get install -y \
         openssh-client`)"
    )]
    Missing,
    /// ssh could not be started.
    #[error("starting ssh: {0}")]
    Spawn(std::io::Error),
    /// An `--ssh-option` leap does not let change.
    #[error(
        "--ssh-option {0}: leap bench always runs ssh with BatchMode=yes and StrictHostKeyChecking=yes (a host \
         whose key is not in known_hosts is refused)"
    )]
    FixedOption(String),
    /// The host's key is not the one known_hosts holds for it.
    #[error(
        "{who}: ssh refused the host key: {why}; check the host and correct known_hosts (no ring member was started)"
    )]
    HostKey {
        /// The host.
        who: String,
        /// Changed, or unknown.
        why: &'static str,
    },
    /// The host refused the login.
    #[error(
        "{who}: ssh login refused ({line}): put your public key in the host's authorized_keys, load it into \
         ssh-agent or give --ssh-option IdentityFile=PATH"
    )]
    Login {
        /// The host.
        who: String,
        /// ssh's words.
        line: String,
    },
    /// ssh could not reach the host.
    #[error("{who}: cannot connect over ssh: {line}")]
    Connect {
        /// The host.
        who: String,
        /// ssh's words.
        line: String,
    },
    /// No leap binary where the host's shell looked.
    #[error(
        "{who}: leap is not installed there (`{program}`: {line}); install it on the host, or give --remote-leap PATH"
    )]
    NoLeap {
        /// The host.
        who: String,
        /// The remote program.
        program: String,
        /// The shell's words.
        line: String,
    },
    /// The remote leap failed or answered nonsense.
    #[error("{who}: {what}: {line}")]
    Remote {
        /// The host.
        who: String,
        /// What went wrong.
        what: String,
        /// Its words.
        line: String,
    },
    /// Nothing came in time.
    #[error("{who}: no answer over ssh within {0:?}", PROBE_TIMEOUT)]
    Timeout {
        /// The host.
        who: String,
    },
}

impl SshError {
    fn spawn(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::NotFound { Self::Missing } else { Self::Spawn(e) }
    }
}

/// The last line of `stderr` that says something.
fn last_line(stderr: &str) -> String {
    stderr.lines().map(str::trim).rev().find(|l| !l.is_empty()).unwrap_or("no message").to_string()
}

/// What an ssh that ended with `status` and printed `stderr` means, for
/// `who`, whose leap is `program`.
pub fn classify(who: &str, program: &str, status: ExitStatus, stderr: &str) -> SshError {
    let who = who.to_string();
    let line = last_line(stderr);
    match status.code() {
        // ssh's own failures.
        Some(255) => {
            if stderr.contains("REMOTE HOST IDENTIFICATION HAS CHANGED") || stderr.contains("has changed and you have")
            {
                SshError::HostKey { who, why: "it is not the key known_hosts holds for this host" }
            } else if stderr.contains("Host key verification failed") {
                SshError::HostKey { who, why: "known_hosts holds no key for this host" }
            } else if stderr.contains("Permission denied") {
                SshError::Login { who, line }
            } else {
                SshError::Connect { who, line }
            }
        }
        // The remote shell: not found, or not executable.
        Some(126 | 127) => SshError::NoLeap { who, program: program.into(), line },
        _ => SshError::Remote { who, what: format!("`{program}` failed ({status})"), line },
    }
}

/// `s` quoted for the remote shell, which ssh hands the command line to.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b)) {
        return s.into();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// How ssh is run: the operator's extra options and the hosts' leap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshLauncher {
    /// `-o` options, before leap's own (ssh keeps the first value of an
    /// option, so these win over leap's `ConnectTimeout`).
    pub options: Vec<String>,
    /// The leap binary on the hosts.
    pub remote_leap: String,
    /// XDP object on the hosts, instead of their leap's embedded one.
    pub xdp_object: Option<PathBuf>,
}

impl SshLauncher {
    /// A launcher with the operator's `-o` options.
    ///
    /// # Errors
    ///
    /// [`SshError::FixedOption`]: an option that would change batch mode or
    /// host key checking.
    pub fn new(
        options: Vec<String>,
        remote_leap: Option<String>,
        xdp_object: Option<PathBuf>,
    ) -> Result<Self, SshError> {
        for o in &options {
            let key = o.split(|c: char| c == '=' || c.is_whitespace()).next().unwrap_or("").to_ascii_lowercase();
            if FIXED_OPTIONS.contains(&key.as_str()) {
                return Err(SshError::FixedOption(o.clone()));
            }
        }
        Ok(Self { options, remote_leap: remote_leap.unwrap_or_else(|| DEFAULT_REMOTE_LEAP.into()), xdp_object })
    }

    /// `ssh ... TARGET exec LEAP ARGS...`.
    pub fn command(&self, target: &SshTarget, leap_args: &[String]) -> Command {
        let mut cmd = Command::new("ssh");
        for o in &self.options {
            cmd.arg("-o").arg(o);
        }
        cmd.args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
            .arg("-o")
            .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
            // No terminal: the channel is the member's stdin and stdout.
            .arg("-T");
        if let Some(p) = target.port {
            cmd.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &target.user {
            cmd.arg("-l").arg(u);
        }
        let mut remote = vec!["exec".to_string(), shell_quote(&self.remote_leap)];
        remote.extend(leap_args.iter().map(|a| shell_quote(a)));
        cmd.arg("--").arg(&target.host).arg(remote.join(" "));
        cmd
    }

    /// Asks `host` what it can run (`leap capabilities` over ssh).
    ///
    /// # Errors
    ///
    /// [`SshError`], naming the host.
    pub fn probe(&self, host: &SshHost) -> Result<HostCapabilities, SshError> {
        let mut args = vec!["capabilities".to_string()];
        if let Some(p) = &self.xdp_object {
            args.extend(["--xdp-object".into(), p.display().to_string()]);
        }
        let mut cmd = self.command(&host.target, &args);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().map_err(SshError::spawn)?;
        let mut members = Members(vec![Member::attach(host.who(), child)]);
        let m = &mut members.0[0];
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let status = loop {
            match m.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                Ok(None) => return Err(SshError::Timeout { who: host.who() }),
                Err(e) => return Err(SshError::Spawn(e)),
            }
        };
        m.finish_output();
        let stderr = m.stderr_tail();
        if !status.success() {
            return Err(classify(&host.who(), &self.remote_leap, status, &stderr));
        }
        let line = m.stdout.iter().rev().find(|l| l.starts_with('{')).cloned().unwrap_or_default();
        serde_json::from_str(&line).map_err(|e| SshError::Remote {
            who: host.who(),
            what: format!("`{} capabilities` printed no capabilities ({e})", self.remote_leap),
            line: last_line(&stderr),
        })
    }
}

/// Rings across hosts, each member a `leap bench-member` started over ssh
/// for the ring.
#[derive(Debug)]
pub struct SshRings {
    hosts: Vec<SshHost>,
    launcher: SshLauncher,
    site: String,
    caps: Vec<HostCapabilities>,
}

impl SshRings {
    /// Asks every host, over ssh and all at once, what it can run.
    ///
    /// # Errors
    ///
    /// Fewer than two hosts, or the first host (in ring order) that cannot
    /// be used: [`SshError`]'s line.
    pub fn connect(hosts: Vec<SshHost>, launcher: SshLauncher, site: &str) -> Result<Self, String> {
        if hosts.len() < 2 {
            return Err("a ring needs at least 2 hosts".into());
        }
        let probes: Vec<Result<HostCapabilities, SshError>> = std::thread::scope(|s| {
            let handles: Vec<_> = hosts.iter().map(|h| s.spawn(|| launcher.probe(h))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(SshError::Spawn(std::io::Error::other("probe panicked")))))
                .collect()
        });
        let mut caps = Vec::with_capacity(hosts.len());
        for p in probes {
            caps.push(p.map_err(|e| e.to_string())?);
        }
        for (h, c) in hosts.iter().zip(&caps) {
            if c.leap_version != env!("CARGO_PKG_VERSION") {
                log::warn!("{} runs leap {}, this host {}", h.who(), c.leap_version, env!("CARGO_PKG_VERSION"));
            }
        }
        Ok(Self { hosts, launcher, site: site.into(), caps })
    }

    /// Starts member `i` of `rc` at `ep` over ssh, watching its channel.
    fn start(&self, rc: &RingConfig, i: usize, ep: &Endpoint) -> Result<Member, String> {
        let mut args = vec!["bench-member".to_string(), "--watch-stdin".into()];
        args.extend(programs::args(rc, i, ep));
        let mut cmd = self.launcher.command(&self.hosts[i].target, &args);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|e| SshError::spawn(e).to_string())?;
        Ok(Member::attach(self.hosts[i].who(), child))
    }

    /// Runs one ring: workers first, then the head; the workers' channels
    /// are closed once the head is done.
    ///
    /// # Errors
    ///
    /// A member that failed (named, with the end of its stderr), or a ring
    /// over its time; every member started is stopped when this returns.
    pub fn run_ring(&mut self, rc: &RingConfig) -> Result<RingReport, String> {
        let mut rc = rc.clone();
        rc.options.inflight = rc.inflight;
        let n = self.hosts.len();
        let eps: Vec<Endpoint> = (0..n)
            .map(|i| Endpoint {
                listen: self.hosts[i].data,
                next: self.hosts[(i + 1) % n].data,
                prev: Some(self.hosts[(i + n - 1) % n].data),
                iface: self.hosts[i].iface.clone(),
            })
            .collect();
        let until = Instant::now() + rc.options.setup_timeout + rc.stall_timeout + RUN_MARGIN;
        // Dropped on every return: kills the ssh clients left, which closes
        // their channels, which stops their members.
        let mut members = Members::default();
        for (i, ep) in eps.iter().enumerate().skip(1) {
            members.0.push(self.start(&rc, i, ep)?);
        }
        if rc.transport != TransportKind::Tcp {
            // A datagram to a socket not yet bound is lost: workers first.
            let ready_by = Instant::now() + rc.options.setup_timeout + Duration::from_secs(5 + CONNECT_TIMEOUT_S);
            for m in &mut members.0 {
                m.ready(ready_by)?;
            }
        }
        members.0.push(self.start(&rc, 0, &eps[0])?);
        let head_status = programs::wait_head(&mut members, until)?;
        let (head, workers) = programs::end_ring(&mut members, head_status, &|m: &mut Member| m.stdin = None)?;
        let cpu: f64 = std::iter::once(&head).chain(&workers).filter_map(|r| r.cpu_s).sum();
        programs::report_with_cpu(&rc, &head, &workers, Duration::from_secs_f64(cpu.max(0.0)))
    }
}

impl Rings for SshRings {
    fn kernels(&self) -> Vec<(String, String)> {
        kernels_across(&self.site, self.hosts.iter().map(|h| h.name.as_str()).zip(&self.caps))
    }

    fn unavailable(&self, kind: TransportKind) -> Option<String> {
        unavailable_across(
            self.hosts.iter().zip(&self.caps).map(|(h, c)| (h.name.as_str(), h.iface.as_deref(), c)),
            kind,
        )
    }

    fn floor(&mut self, _nodes: usize, _rounds: usize) -> Result<FloorOutcome, String> {
        Ok(FloorOutcome::NotMeasurable(
            "the floor (a bare 64-byte UDP datagram per hop) is measured between namespaces of one host; the \
             members started over ssh run only leap ring members, so across hosts compare with TCP instead"
                .into(),
        ))
    }

    fn run(&mut self, rc: &RingConfig) -> Result<RingReport, String> {
        self.run_ring(rc)
    }

    fn hosts(&self) -> Vec<BenchHost> {
        self.hosts
            .iter()
            .zip(&self.caps)
            .map(|(h, c)| bench_host(&h.name, &h.target, &h.data, h.iface.as_deref(), c))
            .collect()
    }

    fn notes(&self) -> Vec<String> {
        let mut v = vec![format!(
            "{}: one ring member per host ({}), the first the head, each a `{} bench-member` started over ssh for \
             its ring (batch mode, strict host key checking); round trips are timed at the head alone (sent and \
             returned on its clock), so no clock synchronisation between the hosts is needed",
            self.site,
            self.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(" -> "),
            self.launcher.remote_leap
        )];
        for (h, c) in self.hosts.iter().zip(&self.caps) {
            if c.leap_version != env!("CARGO_PKG_VERSION") {
                v.push(format!(
                    "{}: host {} runs leap {}, the coordinator {}",
                    self.site,
                    h.name,
                    c.leap_version,
                    env!("CARGO_PKG_VERSION")
                ));
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    fn exit(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn ssh_targets_are_user_host_and_port() {
        let t: SshTarget = "ssh://root@10.0.0.2:2222".parse().unwrap();
        assert_eq!((t.user.as_deref(), t.host.as_str(), t.port), (Some("root"), "10.0.0.2", Some(2222)));
        assert_eq!(t.to_string(), "ssh://root@10.0.0.2:2222");
        let t: SshTarget = "ssh://node-3.cluster".parse().unwrap();
        assert_eq!((t.user, t.host.as_str(), t.port), (None, "node-3.cluster", None));
        let t: SshTarget = "ssh://ops@[fd00::2]:22".parse().unwrap();
        assert_eq!((t.host.as_str(), t.port), ("fd00::2", Some(22)));
        assert_eq!(t.to_string(), "ssh://ops@[fd00::2]:22");
        for bad in ["ssh://", "ssh://-oProxyCommand=x", "ssh://a b@h", "ssh://h:0", "ssh://h:x", "ssh://[::1", "h:22"] {
            assert!(bad.parse::<SshTarget>().is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_are_ssh_targets_or_agent_addresses() {
        assert!(matches!("ssh://h1".parse::<HostAddr>(), Ok(HostAddr::Ssh(_))));
        assert!(matches!("10.0.0.1:7700".parse::<HostAddr>(), Ok(HostAddr::Agent(_))));
        assert!("h1:7700".parse::<HostAddr>().unwrap_err().contains("ssh://"));
    }

    #[test]
    fn the_remote_command_is_quoted_and_host_key_checking_cannot_be_turned_off() {
        let l = SshLauncher::new(vec!["IdentityFile=/k/id".into()], Some("/opt/my leap".into()), None).unwrap();
        let t: SshTarget = "ssh://root@10.0.0.2:2222".parse().unwrap();
        let cmd = l.command(&t, &["bench-member".into(), "--set".into(), "xdp_object=/a'b".into()]);
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(cmd.get_program(), "ssh");
        let at = |s: &str| args.iter().position(|a| a == s).unwrap_or_else(|| panic!("{s} in {args:?}"));
        assert!(at("IdentityFile=/k/id") < at("BatchMode=yes"), "the operator's options first: {args:?}");
        assert!(at("StrictHostKeyChecking=yes") < at("--"));
        assert_eq!(&args[at("-p")..at("-p") + 2], ["-p", "2222"]);
        assert_eq!(&args[at("-l")..at("-l") + 2], ["-l", "root"]);
        assert_eq!(&args[at("--") + 1..], ["10.0.0.2", r"exec '/opt/my leap' bench-member --set 'xdp_object=/a'\''b'"]);
        for fixed in ["StrictHostKeyChecking=no", "stricthostkeychecking no", "BatchMode=no"] {
            let e = SshLauncher::new(vec![fixed.into()], None, None).unwrap_err().to_string();
            assert!(e.contains("StrictHostKeyChecking=yes"), "{e}");
        }
    }

    #[test]
    fn ssh_failures_become_one_line_naming_the_host_and_the_fix() {
        let who = "host h1 (ssh://root@10.0.0.2:2222)";
        let changed = "@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n@@@@@\nHost key for \
                       [10.0.0.2]:2222 has changed and you have requested strict checking.\nHost key verification \
                       failed.\n";
        let e = classify(who, "leap", exit(255), changed).to_string();
        assert!(e.starts_with(who) && e.contains("refused the host key") && e.contains("not the key"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let unknown = "No ED25519 host key is known for [10.0.0.2]:2222 and you have requested strict checking.\n\
                       Host key verification failed.\n";
        let e = classify(who, "leap", exit(255), unknown).to_string();
        assert!(e.contains("refused the host key") && e.contains("holds no key"), "{e}");
        let e = classify(who, "leap", exit(255), "root@10.0.0.2: Permission denied (publickey).\n").to_string();
        assert!(e.contains("login refused") && e.contains("authorized_keys"), "{e}");
        let e = classify(who, "leap", exit(255), "ssh: connect to host 10.0.0.2 port 2222: Connection refused\n");
        assert!(e.to_string().contains("cannot connect over ssh: ssh: connect to host"), "{e}");
        let e = classify(who, "/opt/leap", exit(127), "bash: line 1: exec: /opt/leap: not found\n").to_string();
        assert!(e.contains("leap is not installed there (`/opt/leap`") && e.contains("--remote-leap"), "{e}");
        let e = classify(who, "leap", exit(2), "leap: unrecognized subcommand 'capabilities'\n").to_string();
        assert!(e.contains("`leap` failed") && e.contains("unrecognized"), "{e}");
        assert!(SshError::spawn(std::io::ErrorKind::NotFound.into()).to_string().contains("openssh-client"));
    }

    #[test]
    fn a_hosts_file_of_ssh_hosts_names_each_one() {
        let f: SshHostsFile = toml::from_str(
            "ssh_options = [\"IdentityFile=/k\"]\nremote_leap = \"/opt/leap\"\n\
             [[host]]\nname = \"a\"\nssh = \"ssh://root@10.0.0.1\"\niface = \"eth1\"\n\
             [[host]]\nssh = \"ssh://10.0.0.2:2222\"\ndata = \"192.168.1.2:9999\"\n",
        )
        .unwrap();
        let hosts = f.hosts().unwrap();
        assert_eq!((hosts[0].name.as_str(), hosts[0].data), ("a", "10.0.0.1:9999".parse().unwrap()));
        assert_eq!((hosts[1].name.as_str(), hosts[1].data), ("h1", "192.168.1.2:9999".parse().unwrap()));
        assert_eq!(hosts[1].target.port, Some(2222));
        assert_eq!((f.ssh_options.len(), f.remote_leap.as_deref()), (1, Some("/opt/leap")));
        let agent_file = "[[host]]\nname = \"a\"\ncontrol = \"10.0.0.1:7700\"\ndata = \"10.0.0.1:9999\"\n";
        assert!(toml::from_str::<SshHostsFile>(agent_file).is_err(), "an agent's file is not an ssh hosts file");
    }

    #[test]
    fn quoting_leaves_plain_words_alone() {
        assert_eq!(shell_quote("--frame-size"), "--frame-size");
        assert_eq!(shell_quote("10.0.0.1:9999"), "10.0.0.1:9999");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a;b"), "'a;b'");
        assert_eq!(shell_quote("$(id)"), "'$(id)'");
    }
}
