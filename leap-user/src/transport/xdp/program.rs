//! The XDP program in the kernel: loading it with aya, writing its maps,
//! attaching it to an interface (native mode, else generic with a warning),
//! and pinning it under `/sys/fs/bpf/leap/<iface>/` so that it outlives the
//! process (`leap xdp attach`).

use crate::transport::SyscallError;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, RingBuf, XskMap};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{ProgramError, TestRun, TestRunOptions, Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use leap_common::xdp::{
    LocalAddr, MAP_CONFIG, MAP_COUNTERS, MAP_LOCAL_ADDRS, MAP_PEERS, MAP_PORTS, MAP_RING, MAP_VLANS, MAP_XSKS,
    PROGRAM_NAME, PROGRAM_NAME_FRAGS, PROGRAM_NAME_LOG, PROGRAM_NAME_LOG_FRAGS, PeerKey, PeerRule, PortRule, XdpConfig,
};

pub use super::super::config::AttachMode;
use super::counters::{CounterReader, XdpCounters};
use super::object::ObjectSource;
use super::{XdpError, sys};

/// Where leap pins what outlives the process.
pub const PIN_ROOT: &str = "/sys/fs/bpf/leap";
/// Maps pinned next to the link, by name.
const PINNED_MAPS: [&str; 8] =
    [MAP_CONFIG, MAP_PORTS, MAP_PEERS, MAP_COUNTERS, MAP_XSKS, MAP_RING, MAP_LOCAL_ADDRS, MAP_VLANS];

/// How the program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachedMode {
    /// In the driver, before any socket buffer exists.
    Drv,
    /// In the generic path, after the socket buffer is built.
    Skb,
}

impl fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl AttachedMode {
    /// `"drv"` or `"skb"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Drv => "drv",
            Self::Skb => "skb",
        }
    }

    /// Pin name of the link of a persistent attachment (`leap xdp attach`).
    fn link_file(self) -> &'static str {
        match self {
            Self::Drv => "link-drv",
            Self::Skb => "link-skb",
        }
    }

    /// Pin name of the program of a running leap process (which holds the
    /// link itself, so that the program goes when the process does).
    fn prog_file(self) -> &'static str {
        match self {
            Self::Drv => "prog-drv",
            Self::Skb => "prog-skb",
        }
    }
}

/// Which of the object's two entry points is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgramKind {
    /// `leap_xdp_frags`: also takes multi-buffer packets (chunk trains at a
    /// jumbo MTU; a native program on veth needs it for an MTU above about
    /// 3.5 KB). Kernels ≥ 5.18.
    Frags,
    /// `leap_xdp`: linear packets only.
    Linear,
}

impl ProgramKind {
    /// The program's name in the object (and, as the kernel keeps it, in
    /// `bpftool prog`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Frags => PROGRAM_NAME_FRAGS,
            Self::Linear => PROGRAM_NAME,
        }
    }

    /// The name of the variant with the debug events of `cfg::LOG`
    /// ([`super::XdpTransportConfig::log`]), which kernels before 6.17 load only with
    /// `CAP_PERFMON`.
    pub fn log_name(self) -> &'static str {
        match self {
            Self::Frags => PROGRAM_NAME_LOG_FRAGS,
            Self::Linear => PROGRAM_NAME_LOG,
        }
    }

    /// The kind whose object name is `name` (either variant).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Frags, Self::Linear].into_iter().find(|k| k.name() == name || k.log_name() == name)
    }
}

impl fmt::Display for ProgramKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug)]
struct Attachment {
    iface: String,
    mode: AttachedMode,
    link: aya::programs::xdp::XdpLinkId,
    /// Turns receive VLAN offload back on when the attachment goes.
    rx_vlan: Option<RxVlanOffloadOff>,
}

/// Receive VLAN offload (`rx-vlan-offload`, `ETH_FLAG_RXVLAN`) turned off
/// on an interface while the program is attached there, and turned back on
/// when this is dropped. A NIC that strips 802.1Q tags hands them over
/// beside the packet, where an XDP program does not see them: a chunk from
/// a VLAN this host does not carry would look untagged and be taken, while
/// the kernel drops it. (`bpf_xdp_metadata_rx_vlan_tag` would tell, on
/// kernels >= 6.8, but only to a device-bound program calling a kfunc,
/// which aya 0.14 cannot load.)
#[derive(Debug)]
struct RxVlanOffloadOff {
    /// A socket of the interface's network namespace: the name resolves
    /// there whichever thread drops this. `None`: leave the offload off.
    sock: Option<OwnedFd>,
    iface: String,
}

impl RxVlanOffloadOff {
    /// Turns the offload off on `iface` (of the calling thread's network
    /// namespace) if it is on. `None` when it is off already, or when it
    /// cannot be turned off, which is said once in the log.
    fn turn_off(iface: &str) -> Option<Self> {
        let sock = sys::netns_socket().map_err(|e| log::warn!("{iface}: no socket for ethtool ({e})")).ok()?;
        let flags = match sys::if_offload_flags(sock.as_fd(), iface) {
            Ok(f) => f,
            Err(e) => {
                log::debug!("{iface}: no offload flags ({e}): assuming VLAN tags stay in the packet");
                return None;
            }
        };
        if flags & sys::ETH_FLAG_RXVLAN == 0 {
            return None;
        }
        match sys::set_if_offload_flags(sock.as_fd(), iface, flags & !sys::ETH_FLAG_RXVLAN) {
            Ok(()) => {
                log::info!(
                    "{iface}: rx-vlan-offload turned off while the XDP program is attached, so that it sees VLAN \
                     tags (and drops chunks of VLANs this host does not carry, as the kernel does)"
                );
                Some(Self { sock: Some(sock), iface: iface.to_string() })
            }
            Err(e) => {
                log::warn!(
                    "{iface}: rx-vlan-offload is on and cannot be turned off ({e}): the NIC strips VLAN tags before \
                     the XDP program sees them, so it takes chunks from VLANs this host does not carry"
                );
                None
            }
        }
    }

    /// Leaves the offload off for good (a pinned attachment outlives the
    /// process).
    fn leave_off(mut self) {
        log::info!("{}: rx-vlan-offload stays off while the pinned program is attached", self.iface);
        self.sock = None;
    }
}

impl Drop for RxVlanOffloadOff {
    fn drop(&mut self) {
        let Some(sock) = &self.sock else { return };
        let on = sys::if_offload_flags(sock.as_fd(), &self.iface)
            .and_then(|f| sys::set_if_offload_flags(sock.as_fd(), &self.iface, f | sys::ETH_FLAG_RXVLAN));
        match on {
            Ok(()) => log::debug!("{}: rx-vlan-offload on again", self.iface),
            Err(e) => log::warn!("{}: could not turn rx-vlan-offload back on ({e})", self.iface),
        }
    }
}

/// The loaded (and possibly attached) XDP program with its maps. Dropping
/// it detaches the program, unless [`Self::pin`] made it persistent.
pub struct XdpProgram {
    ebpf: Ebpf,
    kind: ProgramKind,
    /// The entry point's name: [`ProgramKind::name`] or, with the debug
    /// events, [`ProgramKind::log_name`].
    name: &'static str,
    attachment: Option<Attachment>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdpProgram")
            .field("kind", &self.kind)
            .field("attachment", &self.attachment)
            .finish_non_exhaustive()
    }
}

impl XdpProgram {
    /// Loads the object and the program into the kernel (the verifier runs
    /// here); nothing is attached yet.
    ///
    /// # Errors
    ///
    /// [`XdpError::NoObject`]/[`XdpError::ReadObject`] without an object,
    /// [`XdpError::Load`] when aya cannot create the maps,
    /// [`XdpError::Missing`] for a foreign object, [`XdpError::Program`]
    /// when the verifier rejects the program (its log is in the error).
    pub fn load(object: &ObjectSource) -> Result<Self, XdpError> {
        Self::load_sized(object, None)
    }

    /// [`Self::load`], with the ring buffer resized to `ring_bytes` (a power
    /// of two, at least a page).
    ///
    /// The multi-buffer program ([`ProgramKind::Frags`]) is loaded when the
    /// kernel takes it, else the linear one, saying so once in the log;
    /// [`Self::kind`] tells which.
    ///
    /// # Errors
    ///
    /// As [`Self::load`]; when neither loads, the linear program's error.
    pub fn load_sized(object: &ObjectSource, ring_bytes: Option<u32>) -> Result<Self, XdpError> {
        Self::load_variant(object, ring_bytes, false)
    }

    /// [`Self::load_sized`], with the debug events of `cfg::LOG` when `log`
    /// (then [`Self::enable_log`] forwards them). A kernel before 6.17
    /// loads that variant only for a loader with `CAP_PERFMON` (aya-log's
    /// record code fails the Spectre-v1 checks without it); where it is
    /// refused, the program without the events is loaded, saying so once.
    ///
    /// # Errors
    ///
    /// As [`Self::load_sized`].
    pub fn load_logged(object: &ObjectSource, ring_bytes: Option<u32>, log: bool) -> Result<Self, XdpError> {
        if !log {
            return Self::load_variant(object, ring_bytes, false);
        }
        match Self::load_variant(object, ring_bytes, true) {
            Err(XdpError::Program(e)) => {
                log::warn!(
                    "the kernel refuses the XDP program with debug events ({e}; kernels before 6.17 take it only with \
                     CAP_PERFMON); loaded the one without them: no per-packet XDP log"
                );
                Self::load_variant(object, ring_bytes, false)
            }
            r => r,
        }
    }

    /// Whether the loaded program emits the debug events of `cfg::LOG`.
    pub fn logs(&self) -> bool {
        self.name == self.kind.log_name()
    }

    fn load_variant(object: &ObjectSource, ring_bytes: Option<u32>, log: bool) -> Result<Self, XdpError> {
        match Self::load_entry(object, ring_bytes, ProgramKind::Frags, log) {
            Ok(p) => Ok(p),
            Err(XdpError::Program(e)) => {
                let p = Self::load_entry(object, ring_bytes, ProgramKind::Linear, log)?;
                log::warn!(
                    "the kernel refuses the multi-buffer XDP program ({e}); loaded the linear one: no chunk trains \
                     beyond one buffer, and native XDP on veth only up to an MTU of about 3.5 KB"
                );
                Ok(p)
            }
            Err(e) => Err(e),
        }
    }

    /// Loads exactly the entry point `kind` (see [`Self::load_sized`]).
    ///
    /// # Errors
    ///
    /// As [`Self::load`].
    pub fn load_kind(object: &ObjectSource, ring_bytes: Option<u32>, kind: ProgramKind) -> Result<Self, XdpError> {
        Self::load_entry(object, ring_bytes, kind, false)
    }

    /// Loads the entry point `kind`, with the debug events when `log`.
    fn load_entry(
        object: &ObjectSource,
        ring_bytes: Option<u32>,
        kind: ProgramKind,
        log: bool,
    ) -> Result<Self, XdpError> {
        let name = if log { kind.log_name() } else { kind.name() };
        let bytes = object.bytes()?;
        let mut loader = EbpfLoader::new();
        if let Some(size) = ring_bytes {
            loader.map_max_entries(MAP_RING, size);
        }
        let mut ebpf = loader.load(&bytes).map_err(XdpError::Load)?;
        for name in PINNED_MAPS {
            if ebpf.map(name).is_none() {
                return Err(XdpError::Missing(name));
            }
        }
        program_mut(&mut ebpf, name)?.load().map_err(XdpError::Program)?;
        Ok(Self { ebpf, kind, name, attachment: None, logger: None })
    }

    /// Which entry point is loaded (and attached, once attached).
    pub fn kind(&self) -> ProgramKind {
        self.kind
    }

    /// Attaches to `iface`. [`AttachMode::Auto`] tries native mode first and
    /// falls back to generic mode with one warning.
    ///
    /// # Errors
    ///
    /// [`XdpError::NoInterface`], [`XdpError::Busy`] when another XDP
    /// program is attached, [`XdpError::Attach`] otherwise.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<AttachedMode, XdpError> {
        if self.attachment.is_some() {
            return Err(XdpError::AlreadyAttached);
        }
        if sys::if_index(iface).is_none() {
            return Err(XdpError::NoInterface(iface.to_string()));
        }
        let prog = program_mut(&mut self.ebpf, self.name)?;
        // Before the program sees a packet; back on if attaching fails.
        let mut rx_vlan = RxVlanOffloadOff::turn_off(iface);
        let tries: &[(AttachedMode, XdpMode)] = match mode {
            AttachMode::Auto => &[(AttachedMode::Drv, XdpMode::Driver), (AttachedMode::Skb, XdpMode::Skb)],
            AttachMode::Drv => &[(AttachedMode::Drv, XdpMode::Driver)],
            AttachMode::Skb => &[(AttachedMode::Skb, XdpMode::Skb)],
        };
        let mut last = None;
        for &(attached, xdp_mode) in tries {
            match prog.attach(iface, xdp_mode) {
                Ok(link) => {
                    if last.is_some() {
                        log::warn!(
                            "{iface}: native XDP is not available; attached in generic (skb) mode, which is slower"
                        );
                    }
                    log::debug!("{iface}: XDP program attached in {attached} mode");
                    let rx_vlan = rx_vlan.take();
                    self.attachment = Some(Attachment { iface: iface.to_string(), mode: attached, link, rx_vlan });
                    return Ok(attached);
                }
                Err(e) if is_busy(&e) => {
                    return Err(XdpError::Busy {
                        iface: iface.to_string(),
                        hint: "; if leap attached it, run `leap xdp detach --iface` first",
                    });
                }
                Err(e) => {
                    log::debug!("{iface}: attaching in {attached} mode failed: {e}");
                    last = Some(e);
                }
            }
        }
        let mode = if mode == AttachMode::Auto { AttachMode::Skb } else { mode };
        Err(XdpError::Attach { iface: iface.to_string(), mode, source: last.expect("at least one attempt") })
    }

    /// Where and how the program is attached.
    pub fn attached(&self) -> Option<(&str, AttachedMode)> {
        self.attachment.as_ref().map(|a| (a.iface.as_str(), a.mode))
    }

    /// Detaches the program (also done on drop).
    ///
    /// # Errors
    ///
    /// [`XdpError::Program`] when the kernel refuses.
    pub fn detach(&mut self) -> Result<(), XdpError> {
        if let Some(a) = self.attachment.take() {
            program_mut(&mut self.ebpf, self.name)?.detach(a.link).map_err(XdpError::Program)?;
        }
        Ok(())
    }

    /// Writes the program's configuration.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`].
    pub fn configure(&mut self, config: &XdpConfig) -> Result<(), XdpError> {
        let map = self.ebpf.map_mut(MAP_CONFIG).ok_or(XdpError::Missing(MAP_CONFIG))?;
        let mut arr: Array<&mut MapData, XdpConfig> = Array::try_from(map).map_err(XdpError::map(MAP_CONFIG))?;
        arr.set(0, config, 0).map_err(XdpError::map(MAP_CONFIG))
    }

    /// Turns aya-log events of the program into `log` records (the program
    /// emits them only with `cfg::LOG` set). Call [`Self::flush_log`] to
    /// drain them.
    ///
    /// # Errors
    ///
    /// [`XdpError::Log`] when the object has no log map.
    pub fn enable_log(&mut self) -> Result<(), XdpError> {
        let logger = aya_log::EbpfLogger::init(&mut self.ebpf).map_err(XdpError::Log)?;
        self.logger = Some(logger);
        Ok(())
    }

    /// Forwards pending aya-log events to the `log` crate.
    pub fn flush_log(&mut self) {
        if let Some(l) = &mut self.logger {
            l.flush();
        }
    }

    /// Picks up LEAP chunks sent to `port`.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`] (e.g. the port map is full).
    pub fn add_port(&mut self, port: u16) -> Result<(), XdpError> {
        let map = self.ebpf.map_mut(MAP_PORTS).ok_or(XdpError::Missing(MAP_PORTS))?;
        let mut ports: HashMap<&mut MapData, u16, PortRule> =
            HashMap::try_from(map).map_err(XdpError::map(MAP_PORTS))?;
        ports.insert(port, PortRule { enabled: 1 }, 0).map_err(XdpError::map(MAP_PORTS))
    }

    /// Fills the maps behind `cfg::LOCAL_ONLY` from `filter`: its local
    /// addresses and VLANs. The caller sets the flag and
    /// [`XdpConfig::mac`].
    ///
    /// # Errors
    ///
    /// As [`Self::add_local_addr`] and [`Self::allow_vlan`].
    pub fn accept_only(&mut self, filter: &super::RxFilter) -> Result<(), XdpError> {
        for ip in filter.local.iter().flatten() {
            self.add_local_addr(*ip)?;
        }
        for &vid in &filter.vlans {
            self.allow_vlan(vid)?;
        }
        Ok(())
    }

    /// Accepts chunks to `ip` (with `cfg::LOCAL_ONLY`; IPv4 and IPv6 are
    /// told apart, so `::ffff:a.b.c.d` does not stand for `a.b.c.d`).
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`] (e.g. the map is full).
    pub fn add_local_addr(&mut self, ip: IpAddr) -> Result<(), XdpError> {
        let map = self.ebpf.map_mut(MAP_LOCAL_ADDRS).ok_or(XdpError::Missing(MAP_LOCAL_ADDRS))?;
        let mut addrs: HashMap<&mut MapData, LocalAddr, u32> =
            HashMap::try_from(map).map_err(XdpError::map(MAP_LOCAL_ADDRS))?;
        addrs.insert(LocalAddr::new(ip), 1, 0).map_err(XdpError::map(MAP_LOCAL_ADDRS))
    }

    /// Accepts chunks tagged with VLAN `vid` (with `cfg::LOCAL_ONLY`;
    /// untagged chunks are always accepted).
    ///
    /// # Errors
    ///
    /// [`XdpError::BadVlan`] for an ID beyond 4095, [`XdpError::Map`].
    pub fn allow_vlan(&mut self, vid: u16) -> Result<(), XdpError> {
        super::error::check_vlan(vid)?;
        let map = self.ebpf.map_mut(MAP_VLANS).ok_or(XdpError::Missing(MAP_VLANS))?;
        let mut vlans: HashMap<&mut MapData, u16, u32> = HashMap::try_from(map).map_err(XdpError::map(MAP_VLANS))?;
        vlans.insert(vid, 1, 0).map_err(XdpError::map(MAP_VLANS))
    }

    /// Allows `src` to send chunks of the kinds in `rule` to the local port
    /// `dst_port`, in addition to what it may send already.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`] (e.g. the peer map is full).
    pub fn allow_peer(&mut self, src: SocketAddr, dst_port: u16, rule: PeerRule) -> Result<(), XdpError> {
        let map = self.ebpf.map_mut(MAP_PEERS).ok_or(XdpError::Missing(MAP_PEERS))?;
        let mut peers: HashMap<&mut MapData, PeerKey, PeerRule> =
            HashMap::try_from(map).map_err(XdpError::map(MAP_PEERS))?;
        let key = PeerKey::new(src, dst_port);
        let merged = peers.get(&key, 0).map_or(rule, |old| old.union(rule));
        peers.insert(key, merged, 0).map_err(XdpError::map(MAP_PEERS))
    }

    /// Makes `queue` redirect into the AF_XDP socket `fd`.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`] (e.g. `queue` beyond the map).
    pub fn register_xsk(&mut self, queue: u32, fd: impl AsRawFd) -> Result<(), XdpError> {
        let map = self.ebpf.map_mut(MAP_XSKS).ok_or(XdpError::Missing(MAP_XSKS))?;
        let mut xsks: XskMap<&mut MapData> = XskMap::try_from(map).map_err(XdpError::map(MAP_XSKS))?;
        xsks.set(queue, fd, 0).map_err(XdpError::map(MAP_XSKS))
    }

    /// Removes the AF_XDP socket of `queue`: its chunks are passed to the
    /// kernel again (counted as `no_socket`).
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`] (e.g. nothing registered there).
    pub fn unregister_xsk(&mut self, queue: u32) -> Result<(), XdpError> {
        let map = self.ebpf.map_mut(MAP_XSKS).ok_or(XdpError::Missing(MAP_XSKS))?;
        let mut xsks: XskMap<&mut MapData> = XskMap::try_from(map).map_err(XdpError::map(MAP_XSKS))?;
        xsks.unset(queue).map_err(XdpError::map(MAP_XSKS))
    }

    /// Takes the ring buffer out of the program, for a reader.
    ///
    /// # Errors
    ///
    /// [`XdpError::Missing`] when taken already, [`XdpError::Map`].
    pub fn take_ring_buf(&mut self) -> Result<RingBuf<MapData>, XdpError> {
        let map = self.ebpf.take_map(MAP_RING).ok_or(XdpError::Missing(MAP_RING))?;
        RingBuf::try_from(map).map_err(XdpError::map(MAP_RING))
    }

    /// Runs the loaded program once on `packet` (an Ethernet frame) in the
    /// kernel without attaching it, as if it arrived on receive queue 0 of
    /// loopback; returns the XDP action. Maps and counters are the real
    /// ones, so this shows exactly what the program would do.
    ///
    /// # Errors
    ///
    /// [`XdpError::Program`] (aya's `bpf(BPF_PROG_TEST_RUN)`; `EINVAL` for a
    /// packet shorter than Ethernet).
    pub fn test_run(&self, packet: &[u8]) -> Result<u32, XdpError> {
        let name = self.name;
        let prog = self.ebpf.program(name).ok_or(XdpError::Missing(name))?;
        let xdp: &Xdp = prog.try_into().map_err(XdpError::Program)?;
        // Room for what the program may write back (it never grows a packet
        // by more than the headroom XDP gives it).
        let mut out = vec![0u8; packet.len() + 512];
        let opts = TestRunOptions { data_in: Some(packet), data_out: Some(&mut out), ..TestRunOptions::default() };
        Ok(xdp.test_run(opts).map_err(XdpError::Program)?.return_value)
    }

    /// The decision counters so far, summed over CPUs.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`].
    pub fn counters(&self) -> Result<XdpCounters, XdpError> {
        let map = self.ebpf.map(MAP_COUNTERS).ok_or(XdpError::Missing(MAP_COUNTERS))?;
        let arr: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map).map_err(XdpError::map(MAP_COUNTERS))?;
        XdpCounters::read(&arr)
    }

    /// A second handle on the counters, for a reader on another thread
    /// (the transport's receive path checks `no_socket` with it).
    ///
    /// # Errors
    ///
    /// [`XdpError::Missing`], [`XdpError::Syscall`] (`dup`), [`XdpError::Map`].
    pub fn counter_reader(&self) -> Result<CounterReader, XdpError> {
        let Some(Map::PerCpuArray(data)) = self.ebpf.map(MAP_COUNTERS) else {
            return Err(XdpError::Missing(MAP_COUNTERS));
        };
        let fd = std::os::fd::AsFd::as_fd(data.fd())
            .try_clone_to_owned()
            .map_err(|source| XdpError::Syscall(SyscallError::new("dup", source)))?;
        let data = MapData::from_fd(fd).map_err(XdpError::map(MAP_COUNTERS))?;
        Ok(CounterReader(PerCpuArray::try_from(Map::PerCpuArray(data)).map_err(XdpError::map(MAP_COUNTERS))?))
    }

    /// Makes the attachment outlive the process: pins the link and the maps
    /// under `/sys/fs/bpf/leap/<iface>/` (mounting bpffs if needed). Undo
    /// with [`PinnedProgram::unpin`].
    ///
    /// # Errors
    ///
    /// [`XdpError::NotAttachedYet`] when not attached, [`XdpError::Busy`] when
    /// something is pinned there already, [`XdpError::Pin`].
    pub fn pin(mut self) -> Result<PathBuf, XdpError> {
        let Some(a) = self.attachment.take() else {
            return Err(XdpError::NotAttachedYet("pin"));
        };
        let dir = pin_dir(&a.iface);
        let pin_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| XdpError::Pin { path, source }
        };
        sys::ensure_bpffs(Path::new("/sys/fs/bpf")).map_err(pin_err(Path::new("/sys/fs/bpf")))?;
        if dir.exists() {
            return Err(XdpError::Busy {
                iface: a.iface,
                hint: " by leap already (run `leap xdp detach --iface` first)",
            });
        }
        std::fs::create_dir_all(&dir).map_err(pin_err(&dir))?;
        let result = (|| {
            for name in PINNED_MAPS {
                let path = dir.join(name);
                let map = self.ebpf.map(name).ok_or(XdpError::Missing(name))?;
                map.pin(&path).map_err(|e| XdpError::Pin { path: path.clone(), source: std::io::Error::other(e) })?;
            }
            let link = program_mut(&mut self.ebpf, self.name)?.take_link(a.link).map_err(XdpError::Program)?;
            let fd_link = FdLink::try_from(link).map_err(|source| XdpError::Link { what: "pin", source })?;
            let path = dir.join(a.mode.link_file());
            fd_link.pin(&path).map_err(|e| XdpError::Pin { path, source: std::io::Error::other(e) })?;
            Ok(())
        })();
        if result.is_err() {
            let _ = remove_pins(&dir);
        } else if let Some(off) = a.rx_vlan {
            off.leave_off();
        }
        result.map(|()| dir)
    }
}

impl XdpProgram {
    /// Pins the program and its maps (not the link) under
    /// `/sys/fs/bpf/leap/<iface>/` while the returned guard lives, so that
    /// `leap xdp status|stats` can see a running node. The program still
    /// goes away with the process; stale pins of a process that died are
    /// replaced.
    ///
    /// # Errors
    ///
    /// [`XdpError::NotAttachedYet`] when not attached, [`XdpError::Busy`] when a
    /// persistent attachment is pinned there, [`XdpError::Pin`].
    pub fn pin_running(&mut self) -> Result<MapPins, XdpError> {
        let Some(a) = &self.attachment else {
            return Err(XdpError::NotAttachedYet("pin"));
        };
        let (iface, mode) = (a.iface.clone(), a.mode);
        let dir = pin_dir(&iface);
        let pin_err = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| XdpError::Pin { path, source: e }
        };
        sys::ensure_bpffs(Path::new("/sys/fs/bpf")).map_err(pin_err(Path::new("/sys/fs/bpf")))?;
        if dir.exists() {
            if [AttachedMode::Drv, AttachedMode::Skb].iter().any(|m| dir.join(m.link_file()).exists()) {
                return Err(XdpError::Busy {
                    iface,
                    hint: " by `leap xdp attach` (run `leap xdp detach --iface` first)",
                });
            }
            // We hold the interface's only XDP attachment, so whatever is
            // pinned here belongs to a process that is gone.
            remove_pins(&dir).map_err(pin_err(&dir))?;
        }
        std::fs::create_dir_all(&dir).map_err(pin_err(&dir))?;
        let guard = MapPins { dir: dir.clone() };
        for name in PINNED_MAPS {
            // The ring buffer is absent once a reader took it.
            if let Some(map) = self.ebpf.map(name) {
                let path = dir.join(name);
                map.pin(&path).map_err(|e| XdpError::Pin { path, source: std::io::Error::other(e) })?;
            }
        }
        let path = dir.join(mode.prog_file());
        program_mut(&mut self.ebpf, self.name)?
            .pin(&path)
            .map_err(|e| XdpError::Pin { path, source: std::io::Error::other(e) })?;
        Ok(guard)
    }
}

/// Pins of a running node's program and maps; removed on drop.
#[derive(Debug)]
pub struct MapPins {
    dir: PathBuf,
}

impl Drop for MapPins {
    fn drop(&mut self) {
        if let Err(e) = remove_pins(&self.dir) {
            log::warn!("cannot remove the pins in {}: {e}", self.dir.display());
        }
        let _ = std::fs::remove_dir(PIN_ROOT);
    }
}

fn program_mut<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp, XdpError> {
    let prog = ebpf.program_mut(name).ok_or(XdpError::Missing(name))?;
    prog.try_into().map_err(|_| XdpError::Missing(name))
}

/// Whether attaching failed because another XDP program is attached.
fn is_busy(e: &ProgramError) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = src {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(libc::EBUSY | libc::EEXIST))
        {
            return true;
        }
        src = err.source();
    }
    false
}

/// `/sys/fs/bpf/leap/<iface>`.
pub fn pin_dir(iface: &str) -> PathBuf {
    Path::new(PIN_ROOT).join(iface)
}

/// Removes everything leap pinned in `dir`, then `dir` itself.
fn remove_pins(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        std::fs::remove_file(entry?.path())?;
    }
    std::fs::remove_dir(dir)
}

/// A program that `leap xdp attach` left pinned on an interface.
#[derive(Debug)]
pub struct PinnedProgram {
    iface: String,
    dir: PathBuf,
    mode: AttachedMode,
    /// The link of a persistent attachment (held while this value lives;
    /// the pin keeps it afterwards); `None` for a running leap process.
    link: Option<FdLink>,
}

impl PinnedProgram {
    /// Opens what is pinned for `iface`.
    ///
    /// # Errors
    ///
    /// [`XdpError::NotAttached`] when nothing is, [`XdpError::Pin`] when the
    /// pins cannot be opened.
    pub fn open(iface: &str) -> Result<Self, XdpError> {
        let dir = pin_dir(iface);
        let not_attached = || XdpError::NotAttached { iface: iface.to_string(), path: dir.clone() };
        if !sys::is_bpffs(Path::new("/sys/fs/bpf")) || !dir.is_dir() {
            return Err(not_attached());
        }
        let modes = [AttachedMode::Drv, AttachedMode::Skb];
        if let Some(mode) = modes.into_iter().find(|m| dir.join(m.link_file()).exists()) {
            let path = dir.join(mode.link_file());
            let link: FdLink = PinnedLink::from_pin(&path)
                .map_err(|e| XdpError::Pin { path: path.clone(), source: std::io::Error::other(e) })?
                .into();
            return Ok(Self { iface: iface.to_string(), dir, mode, link: Some(link) });
        }
        let mode = modes.into_iter().find(|m| dir.join(m.prog_file()).exists()).ok_or_else(not_attached)?;
        Ok(Self { iface: iface.to_string(), dir, mode, link: None })
    }

    /// Every interface with a pinned leap program.
    pub fn list() -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(PIN_ROOT)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        out.sort();
        out
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The pin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The attach mode.
    pub fn mode(&self) -> AttachedMode {
        self.mode
    }

    /// Whether `leap xdp attach` made this attachment (as opposed to a
    /// running leap node, whose program goes away with it).
    pub fn is_persistent(&self) -> bool {
        self.link.is_some()
    }

    /// Whether the program is attached through some link (false for the
    /// stale pins of a node that died).
    ///
    /// # Errors
    ///
    /// As [`Self::ids`].
    pub fn is_live(&self) -> Result<bool, XdpError> {
        let (link, prog) = self.ids()?;
        if link.is_some() {
            return Ok(true);
        }
        Ok(aya::programs::loaded_links()
            .filter_map(Result::ok)
            .any(|l| l.program_id() == prog && matches!(l.link_type(), Ok(aya::programs::links::LinkType::Xdp))))
    }

    /// Kernel ids of the link (persistent attachments only) and of the
    /// program.
    ///
    /// # Errors
    ///
    /// [`XdpError::Link`] or [`XdpError::PinnedProgram`] when the kernel
    /// cannot describe them.
    pub fn ids(&self) -> Result<(Option<u32>, u32), XdpError> {
        if let Some(link) = &self.link {
            let info = link.info().map_err(|source| XdpError::Link { what: "info", source })?;
            return Ok((Some(info.id()), info.program_id()));
        }
        let info = aya::programs::ProgramInfo::from_pin(self.dir.join(self.mode.prog_file()))
            .map_err(XdpError::PinnedProgram)?;
        Ok((None, info.id()))
    }

    /// Which entry point is attached, from the kernel's name of the
    /// program (`None` when the kernel does not describe it, or for a
    /// program of another object).
    ///
    /// # Errors
    ///
    /// As [`Self::ids`].
    pub fn kind(&self) -> Result<Option<ProgramKind>, XdpError> {
        let (_, id) = self.ids()?;
        Ok(aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .find(|p| p.id() == id)
            .and_then(|p| p.name_as_str().and_then(ProgramKind::from_name)))
    }

    fn map(&self, name: &'static str) -> Result<Map, XdpError> {
        let path = self.dir.join(name);
        let data = MapData::from_pin(&path).map_err(XdpError::map(name))?;
        Map::from_map_data(data).map_err(XdpError::map(name))
    }

    /// The program's configuration.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`].
    pub fn config(&self) -> Result<XdpConfig, XdpError> {
        let arr: Array<MapData, XdpConfig> = self.map(MAP_CONFIG)?.try_into().map_err(XdpError::map(MAP_CONFIG))?;
        arr.get(&0, 0).map_err(XdpError::map(MAP_CONFIG))
    }

    /// The ports the program picks chunks up on, sorted.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`].
    pub fn ports(&self) -> Result<Vec<u16>, XdpError> {
        let map: HashMap<MapData, u16, PortRule> = self.map(MAP_PORTS)?.try_into().map_err(XdpError::map(MAP_PORTS))?;
        let mut ports: Vec<u16> = map.keys().filter_map(Result::ok).collect();
        ports.sort_unstable();
        Ok(ports)
    }

    /// The decision counters so far, summed over CPUs.
    ///
    /// # Errors
    ///
    /// [`XdpError::Map`].
    pub fn counters(&self) -> Result<XdpCounters, XdpError> {
        let arr: PerCpuArray<MapData, u64> = self.map(MAP_COUNTERS)?.try_into().map_err(XdpError::map(MAP_COUNTERS))?;
        XdpCounters::read(&arr)
    }

    /// Removes the pins: the program is detached once nothing else holds
    /// the link. A running leap node's pins are left alone: stop the node.
    ///
    /// # Errors
    ///
    /// [`XdpError::Busy`] for a running node's attachment, [`XdpError::Pin`].
    pub fn unpin(self) -> Result<(), XdpError> {
        if self.link.is_none() && self.is_live()? {
            return Err(XdpError::Busy {
                iface: self.iface,
                hint: " by a running leap node; it detaches when that node stops",
            });
        }
        let Self { dir, link, .. } = self;
        let result = remove_pins(&dir).map_err(|source| XdpError::Pin { path: dir.clone(), source });
        // The root goes too once nothing else is pinned there.
        let _ = std::fs::remove_dir(PIN_ROOT);
        // The last reference to the link: closing it detaches the program.
        drop(link);
        result
    }
}
