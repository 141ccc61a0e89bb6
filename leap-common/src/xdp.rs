//! Maps shared by the XDP program (`leap-ebpf`) and user space: their names,
//! key and value types, the counter indices and the ring-buffer record.
//!
//! The program reads [`XdpConfig`] from `LEAP_CONFIG[0]`, the listening
//! ports from `LEAP_PORTS`, the allowed senders from `LEAP_PEERS` (only when
//! [`cfg::PEER_FILTER`] is set), this host's addresses and VLANs from
//! `LEAP_LOCAL_ADDRS` and `LEAP_VLANS` (only when [`cfg::LOCAL_ONLY`] is
//! set) and counts every decision in the per-CPU array `LEAP_COUNTERS`,
//! indexed by [`Counter`].
//!
//! ```
//! use core::net::SocketAddr;
//! use leap_common::chunk::ChunkKind;
//! use leap_common::xdp::{PeerKey, PeerRule};
//!
//! let prev: SocketAddr = "10.0.0.1:9999".parse().unwrap();
//! let key = PeerKey::new(prev, 9999);
//! let rule = PeerRule::allow(&[ChunkKind::Data, ChunkKind::Control]);
//! assert!(rule.allows(0x8000)); // a leap data chunk
//! assert!(!rule.allows(0x8002)); // a NACK must come from the next node
//! assert_eq!(key.source(), prev);
//! ```

use core::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::chunk::{CHUNK_DATAGRAM_MAX, ChunkHeader, ChunkKind};

/// Name of the XDP program in the object (its function name): linear
/// packets only, loads on any kernel with XDP.
pub const PROGRAM_NAME: &str = "leap_xdp";
/// Name of the multi-buffer variant (section `xdp.frags`, kernels ≥ 5.18):
/// the same body and maps, and it also takes packets spread over several
/// buffers (chunk trains at a jumbo MTU).
pub const PROGRAM_NAME_FRAGS: &str = "leap_xdp_frags";
/// [`PROGRAM_NAME`] with the debug events of `cfg::LOG` (aya-log): the
/// verifiers of kernels before 6.17 take it only from a loader with
/// `CAP_PERFMON`.
pub const PROGRAM_NAME_LOG: &str = "leap_log";
/// [`PROGRAM_NAME_FRAGS`] with the debug events of `cfg::LOG`.
pub const PROGRAM_NAME_LOG_FRAGS: &str = "leap_log_frags";
/// `Array<XdpConfig>` with one entry.
pub const MAP_CONFIG: &str = "LEAP_CONFIG";
/// `HashMap<u16, PortRule>`: destination ports (host order) to pick up.
pub const MAP_PORTS: &str = "LEAP_PORTS";
/// `HashMap<PeerKey, PeerRule>`: allowed senders when the peer filter is on.
pub const MAP_PEERS: &str = "LEAP_PEERS";
/// `PerCpuArray<u64>` indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "LEAP_COUNTERS";
/// `XskMap`: AF_XDP socket per receive queue.
pub const MAP_XSKS: &str = "LEAP_XSKS";
/// `RingBuf` of [`RingRecord`]s.
pub const MAP_RING: &str = "LEAP_RING";
/// `HashMap<LocalAddr, u32>`: destination addresses of this host (with
/// [`cfg::LOCAL_ONLY`]).
pub const MAP_LOCAL_ADDRS: &str = "LEAP_LOCAL_ADDRS";
/// `HashMap<u16, u32>`: VLAN IDs a tagged chunk may carry (with
/// [`cfg::LOCAL_ONLY`]; untagged chunks always may).
pub const MAP_VLANS: &str = "LEAP_VLANS";

/// The Ethernet, IP and UDP constants the program (and the user-space
/// parser of AF_XDP frames) work with.
pub mod wire {
    /// Bytes of an Ethernet header without VLAN tag.
    pub const ETH_HLEN: usize = 14;
    /// Bytes of one 802.1Q / 802.1ad tag.
    pub const VLAN_HLEN: usize = 4;
    /// EtherType of IPv4.
    pub const ETH_P_IP: u16 = 0x0800;
    /// EtherType of IPv6.
    pub const ETH_P_IPV6: u16 = 0x86DD;
    /// EtherType of an 802.1Q VLAN tag.
    pub const ETH_P_8021Q: u16 = 0x8100;
    /// EtherType of an 802.1ad (QinQ outer) VLAN tag.
    pub const ETH_P_8021AD: u16 = 0x88A8;
    /// IP protocol number of UDP.
    pub const IPPROTO_UDP: u8 = 17;
    /// More-fragments flag and fragment offset of the IPv4 `frag_off` field.
    pub const IP_MF_OFFSET: u16 = 0x3FFF;
    /// Bytes of an IPv4 header without options.
    pub const IPV4_HLEN: usize = 20;
    /// Bytes of an IPv6 header.
    pub const IPV6_HLEN: usize = 40;
    /// Bytes of a UDP header.
    pub const UDP_HLEN: usize = 8;
    /// The VLAN ID bits of an 802.1Q tag control field.
    pub const VLAN_VID_MASK: u16 = 0x0FFF;
    /// Bytes of an IPv4 header with the most options.
    pub const IPV4_HLEN_MAX: usize = 60;
}

/// Capacity of `LEAP_PORTS`.
pub const MAX_PORTS: u32 = 64;
/// Capacity of `LEAP_PEERS`.
pub const MAX_PEERS: u32 = 256;
/// Capacity of `LEAP_LOCAL_ADDRS`.
pub const MAX_LOCAL_ADDRS: u32 = 16;
/// Capacity of `LEAP_VLANS`.
pub const MAX_VLANS: u32 = 64;
/// Capacity of `LEAP_XSKS`: receive queues an AF_XDP socket can be bound to.
pub const MAX_QUEUES: u32 = 64;
/// Bytes of `LEAP_RING` (a power of two, a multiple of the page size).
pub const RING_BYTES: u32 = 4 << 20;

/// How the program hands a chunk to user space ([`XdpConfig::delivery`]).
pub mod delivery {
    /// Not configured: every packet is passed to the kernel (counted as passed).
    pub const PASS: u32 = 0;
    /// Redirect into `LEAP_XSKS[rx_queue]` (AF_XDP).
    pub const XSK: u32 = 1;
    /// Copy into `LEAP_RING` as a [`super::RingRecord`] and drop.
    pub const RING_BUF: u32 = 2;
}

/// Bits of [`XdpConfig::flags`].
pub mod cfg {
    /// Emit aya-log debug events for rejected chunks.
    pub const LOG: u32 = 1 << 0;
    /// Only accept chunks whose source is in `LEAP_PEERS` for their kind.
    pub const PEER_FILTER: u32 = 1 << 1;
    /// Drop rejected chunks (malformed, wrong source, bad checksum, not for
    /// this host) instead of passing them to the kernel.
    pub const DROP_REJECTED: u32 = 1 << 2;
    /// Only chunks for this host: a unicast destination MAC must be
    /// [`super::XdpConfig::mac`], the destination address one of
    /// `LEAP_LOCAL_ADDRS`, a VLAN tag one of `LEAP_VLANS`.
    pub const LOCAL_ONLY: u32 = 1 << 3;
    /// Every flag this version knows.
    pub const ALL: u32 = LOG | PEER_FILTER | DROP_REJECTED | LOCAL_ONLY;
}

/// The single entry of `LEAP_CONFIG`, written by user space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct XdpConfig {
    /// One of [`delivery`].
    pub delivery: u32,
    /// Bits of [`mod@cfg`].
    pub flags: u32,
    /// Ring-buffer mode: records are submitted without waking the reader,
    /// except every `wakeup_every`-th record per CPU and the last chunk of a
    /// frame. 0 or 1: wake for every record.
    pub wakeup_every: u32,
    /// Zero.
    pub _reserved: u32,
    /// With [`cfg::LOCAL_ONLY`]: the interface's MAC address, the only
    /// unicast destination MAC accepted (group addresses pass, as in the
    /// kernel, which drops only `PACKET_OTHERHOST`).
    pub mac: [u8; 6],
    /// Zero.
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<XdpConfig>() == 24);
const _: () = assert!(core::mem::align_of::<XdpConfig>() == 4);

/// Key of `LEAP_LOCAL_ADDRS`: a destination address of this host.
///
/// IPv4 is stored as `::ffff:a.b.c.d` with [`FAMILY_V4`]; an IPv6 packet to
/// a v4-mapped address never matches it, because the family is part of the
/// key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct LocalAddr {
    /// The address: IPv6, or IPv4 as `::ffff:a.b.c.d`.
    pub addr: [u8; 16],
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u16,
    /// Zero.
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<LocalAddr>() == 20);

impl LocalAddr {
    /// The key for `ip`.
    pub const fn new(ip: IpAddr) -> Self {
        let family = if matches!(ip, IpAddr::V4(_)) { FAMILY_V4 } else { FAMILY_V6 };
        Self { addr: addr16(ip), family, _pad: 0 }
    }
}

/// Value of `LEAP_PORTS`: the key is the UDP destination port, host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct PortRule {
    /// Non-zero: chunks to this port go to user space.
    pub enabled: u32,
}
const _: () = assert!(core::mem::size_of::<PortRule>() == 4);

/// Key of `LEAP_PEERS`: who may send to which local port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct PeerKey {
    /// Source address: IPv6, or IPv4 as `::ffff:a.b.c.d`.
    pub addr: [u8; 16],
    /// Source UDP port, host order.
    pub src_port: u16,
    /// Destination (local, listening) UDP port, host order.
    pub dst_port: u16,
}
const _: () = assert!(core::mem::size_of::<PeerKey>() == 20);

impl PeerKey {
    /// The key for chunks from `src` to the local port `dst_port`.
    pub const fn new(src: SocketAddr, dst_port: u16) -> Self {
        Self { addr: addr16(src.ip()), src_port: src.port(), dst_port }
    }

    /// The source as a socket address (IPv4-mapped addresses become IPv4).
    pub const fn source(&self) -> SocketAddr {
        SocketAddr::new(ip_from16(self.addr), self.src_port)
    }
}

/// Value of `LEAP_PEERS`: which chunk kinds the source may send.
///
/// The previous node sends data and control chunks; the next node sends
/// NACKs back. In a two-node ring both are the same address and one entry
/// allows all three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct PeerRule {
    /// Bit `1 << kind` for every allowed [`ChunkKind`].
    pub kinds: u32,
}
const _: () = assert!(core::mem::size_of::<PeerRule>() == 4);

impl PeerRule {
    /// A rule allowing exactly `kinds`.
    pub const fn allow(kinds: &[ChunkKind]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < kinds.len() {
            bits |= 1 << kinds[i] as u32;
            i += 1;
        }
        Self { kinds: bits }
    }

    /// This rule and `other` together.
    pub const fn union(self, other: Self) -> Self {
        Self { kinds: self.kinds | other.kinds }
    }

    /// Whether a chunk with this header `reserved` field is allowed.
    #[inline(always)]
    pub const fn allows(&self, reserved: u16) -> bool {
        self.kinds & kind_bit(reserved) != 0
    }
}

/// `1 << kind` of a chunk whose header has this `reserved` field, with the
/// same rules as [`ChunkHeader::kind`].
#[inline(always)]
pub const fn kind_bit(reserved: u16) -> u32 {
    let hdr = ChunkHeader { seq: 0, chunk_id: 0, total_chunks: 0, reserved };
    1 << hdr.kind() as u32
}

/// Indices of `LEAP_COUNTERS`. Every packet the program sees increments
/// exactly one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Counter {
    /// Not for leap (not UDP, another port, an IP fragment, IPv6 extension
    /// headers, more than one VLAN tag), or delivery not configured: passed.
    Passed = 0,
    /// To a leap port but without the LEAP magic: passed to the kernel.
    NotLeap = 1,
    /// Redirected to the AF_XDP socket of its receive queue.
    ToXsk = 2,
    /// Copied into the ring buffer (one record per chunk of a train) and
    /// dropped.
    ToRingBuf = 3,
    /// The ring buffer had no room (for the first chunk of a train or a
    /// later one): passed to the kernel's UDP socket instead.
    RingBufFull = 4,
    /// LEAP magic but an insane header (of any chunk of a train) or
    /// inconsistent lengths.
    Malformed = 5,
    /// The peer filter is on and the source may not send this kind.
    WrongSource = 6,
    /// AF_XDP delivery but no socket bound at the receive queue: passed.
    NoSocket = 7,
    /// [`cfg::LOCAL_ONLY`]: a unicast destination MAC not this interface's
    /// (the kernel's `PACKET_OTHERHOST`).
    ForeignMac = 8,
    /// [`cfg::LOCAL_ONLY`]: a VLAN tag not in `LEAP_VLANS` (VLAN 0, a
    /// priority tag, passes as untagged).
    ForeignVlan = 9,
    /// An IPv6 source address `::ffff:a.b.c.d` (the kernel drops these; it
    /// must not pass for an IPv4 peer).
    MappedSource = 10,
    /// [`cfg::LOCAL_ONLY`]: a destination address not in `LEAP_LOCAL_ADDRS`.
    ForeignDst = 11,
    /// The IPv4 header checksum is wrong.
    BadIpChecksum = 12,
    /// LEAP magic but a UDP payload longer than any train
    /// ([`crate::chunk::TRAIN_DATAGRAM_MAX`]), e.g. a GSO/GRO
    /// super-datagram seen whole by generic XDP: passed to the kernel's
    /// UDP socket.
    PassedOversize = 13,
}

/// Number of [`Counter`]s (entries of `LEAP_COUNTERS`).
pub const COUNTERS: u32 = 14;

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Self; COUNTERS as usize] = [
        Self::Passed,
        Self::NotLeap,
        Self::ToXsk,
        Self::ToRingBuf,
        Self::RingBufFull,
        Self::Malformed,
        Self::WrongSource,
        Self::NoSocket,
        Self::ForeignMac,
        Self::ForeignVlan,
        Self::MappedSource,
        Self::ForeignDst,
        Self::BadIpChecksum,
        Self::PassedOversize,
    ];

    /// The name used in `leap xdp stats` and the `--json` output.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::NotLeap => "not_leap",
            Self::ToXsk => "to_xsk",
            Self::ToRingBuf => "to_ringbuf",
            Self::RingBufFull => "ringbuf_full",
            Self::Malformed => "malformed",
            Self::WrongSource => "wrong_source",
            Self::NoSocket => "no_socket",
            Self::ForeignMac => "foreign_mac",
            Self::ForeignVlan => "foreign_vlan",
            Self::MappedSource => "mapped_source",
            Self::ForeignDst => "foreign_dst",
            Self::BadIpChecksum => "bad_ip_checksum",
            Self::PassedOversize => "passed_oversize",
        }
    }
}

/// [`RingRecord::train`] of piece `index` of a train of `pieces` chunks.
#[inline(always)]
pub const fn train_tag(index: u8, pieces: u8) -> u16 {
    u16::from_be_bytes([pieces, index])
}

/// Address family of a [`RingRecord`].
pub const FAMILY_V4: u16 = 4;
/// Address family of a [`RingRecord`].
pub const FAMILY_V6: u16 = 6;

/// One chunk copied into `LEAP_RING`: the UDP payload (LEAP header and
/// data), who sent it to which address, and the UDP checksum field, so that
/// user space can verify the checksum (the program does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct RingRecord {
    /// Bytes of `data` in use: the UDP payload length, 12..=1412.
    pub len: u16,
    /// Source UDP port, host order.
    pub src_port: u16,
    /// Destination UDP port, host order.
    pub dst_port: u16,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u16,
    /// Source address: IPv6, or IPv4 as `::ffff:a.b.c.d`.
    pub src_addr: [u8; 16],
    /// Destination address: IPv6, or IPv4 as `::ffff:a.b.c.d`.
    pub dst_addr: [u8; 16],
    /// Receive queue the packet arrived on.
    pub rx_queue: u32,
    /// The UDP checksum field as it was on the wire (network byte order
    /// read as big-endian, i.e. the 16-bit value).
    pub udp_check: u16,
    /// 0 for a datagram of one chunk; for a chunk of a train,
    /// [`train_tag`]`(index, pieces)`. The UDP checksum covers the whole
    /// train, so user space checks it once it holds every piece: the
    /// program submits a train's records back to back, and one receive
    /// queue is served by one CPU at a time, so the pieces of a train
    /// follow each other among the records of their `rx_queue`.
    pub train: u16,
    /// The UDP payload; bytes past `len` are unspecified.
    pub data: [u8; CHUNK_DATAGRAM_MAX],
}
const _: () = assert!(core::mem::size_of::<RingRecord>() == 1460);
const _: () = assert!(core::mem::align_of::<RingRecord>() == 4);
const _: () = assert!(core::mem::offset_of!(RingRecord, data) == 48);

impl RingRecord {
    /// The sender of the chunk. An IPv4 source is `::ffff:a.b.c.d` with
    /// [`FAMILY_V4`]; with any other family the address stays IPv6, so that
    /// an IPv6 packet from `::ffff:a.b.c.d` never passes for the IPv4 peer
    /// `a.b.c.d`.
    pub const fn source(&self) -> SocketAddr {
        SocketAddr::new(ip_of_family(self.src_addr, self.family), self.src_port)
    }

    /// The destination address, by the same rule as [`Self::source`].
    pub const fn destination(&self) -> IpAddr {
        ip_of_family(self.dst_addr, self.family)
    }

    /// The chunk bytes, `None` when `len` is out of range.
    pub fn datagram(&self) -> Option<&[u8]> {
        self.data.get(..usize::from(self.len))
    }

    /// `(index, pieces)` when the record holds one chunk of a train of
    /// `pieces` (2..) chunks, `None` for a datagram of one chunk.
    pub const fn train_piece(&self) -> Option<(u8, u8)> {
        let [pieces, index] = self.train.to_be_bytes();
        if self.train == 0 { None } else { Some((index, pieces)) }
    }
}

impl Default for RingRecord {
    fn default() -> Self {
        Self {
            len: 0,
            src_port: 0,
            dst_port: 0,
            family: 0,
            src_addr: [0; 16],
            dst_addr: [0; 16],
            rx_queue: 0,
            udp_check: 0,
            train: 0,
            data: [0; CHUNK_DATAGRAM_MAX],
        }
    }
}

/// IPv4 addresses as `::ffff:a.b.c.d`, IPv6 as they are.
pub const fn addr16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Inverse of [`addr16`].
pub const fn ip_from16(addr: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from_octets(addr);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// An address of a packet of `family`: IPv4 only for [`FAMILY_V4`] and a
/// v4-mapped address, IPv6 otherwise.
pub const fn ip_of_family(addr: [u8; 16], family: u16) -> IpAddr {
    let v6 = Ipv6Addr::from_octets(addr);
    match (family, v6.to_ipv4_mapped()) {
        (FAMILY_V4, Some(v4)) => IpAddr::V4(v4),
        _ => IpAddr::V6(v6),
    }
}

/// Whether a 16-byte address is `::ffff:a.b.c.d`.
#[inline(always)]
pub const fn is_v4_mapped(addr: &[u8; 16]) -> bool {
    // Constant indices, no loop: the XDP program reads the address from its
    // stack, where a loaded program without CAP_PERFMON may not index with
    // a variable.
    let a = addr;
    (a[0] | a[1] | a[2] | a[3] | a[4] | a[5] | a[6] | a[7] | a[8] | a[9]) == 0 && a[10] == 0xff && a[11] == 0xff
}

/// `::ffff:a.b.c.d` from the four bytes of an IPv4 address.
#[inline(always)]
pub const fn v4_mapped(octets: [u8; 4]) -> [u8; 16] {
    let [a, b, c, d] = octets;
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d]
}

const _: () = assert!(matches!(ip_from16(v4_mapped([10, 0, 0, 1])), IpAddr::V4(_)));

/// `aya::Pod` (the bound of map keys and values) for types that are
/// `bytemuck::Pod`, whose derive checked what both traits ask: `repr(C)`,
/// no padding, every field plain data.
#[cfg(feature = "user")]
macro_rules! aya_pod {
    ($($t:ty),*) => {$(
        const _: fn() = || {
            fn is_bytemuck_pod<T: bytemuck::Pod>() {}
            is_bytemuck_pod::<$t>();
        };
        // SAFETY: `$t` is `bytemuck::Pod` (asserted just above): every bit
        // pattern is a valid value and no byte is uninitialised, which is
        // the contract of `aya::Pod`.
        unsafe impl aya::Pod for $t {}
    )*};
}
#[cfg(feature = "user")]
aya_pod!(XdpConfig, PortRule, PeerKey, PeerRule, LocalAddr);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nack_needs_its_own_rule() {
        let prev = PeerRule::allow(&[ChunkKind::Data, ChunkKind::Control]);
        let next = PeerRule::allow(&[ChunkKind::Nack]);
        assert!(prev.allows(0)); // an original peer: always data
        assert!(prev.allows(0x8001));
        assert!(!prev.allows(0x8002));
        assert!(next.allows(0x8002));
        assert!(!next.allows(0x8000));
        assert!(prev.union(next).allows(0x8002));
    }

    #[test]
    fn kind_bit_agrees_with_chunk_header() {
        for reserved in [0u16, 1, 2, 0x8000, 0x8001, 0x8002, 0x800F, 0xC002, 0x2001] {
            let hdr = ChunkHeader { seq: 1, chunk_id: 0, total_chunks: 1, reserved };
            assert_eq!(kind_bit(reserved), 1 << hdr.kind() as u32, "{reserved:#x}");
        }
    }

    #[test]
    fn peer_keys_map_ipv4_into_ipv6() {
        let v4: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        let k = PeerKey::new(v4, 9999);
        assert_eq!(k.addr, v4_mapped([192, 0, 2, 7]));
        assert_eq!(k.source(), v4);
        let v6: SocketAddr = "[fd00::2]:4000".parse().unwrap();
        assert_eq!(PeerKey::new(v6, 9999).source(), v6);
    }

    #[test]
    fn counters_are_indexed_in_order() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }

    #[test]
    fn ring_record_keeps_mapped_ipv6_sources_ipv6() {
        let mapped = v4_mapped([10, 0, 0, 1]);
        let v4 = RingRecord { family: FAMILY_V4, src_addr: mapped, src_port: 7, ..RingRecord::default() };
        assert_eq!(v4.source(), "10.0.0.1:7".parse().unwrap());
        let v6 = RingRecord { family: FAMILY_V6, src_addr: mapped, src_port: 7, ..RingRecord::default() };
        assert_eq!(v6.source(), "[::ffff:10.0.0.1]:7".parse().unwrap());
        assert!(is_v4_mapped(&mapped));
        assert!(!is_v4_mapped(&Ipv6Addr::LOCALHOST.octets()));
    }

    #[test]
    fn local_addrs_keep_the_family() {
        let v4 = LocalAddr::new("10.0.0.1".parse().unwrap());
        let v6 = LocalAddr::new("::ffff:10.0.0.1".parse().unwrap());
        assert_eq!(v4.addr, v6.addr);
        assert_ne!(v4, v6);
    }

    #[test]
    fn ring_record_rejects_bad_lengths() {
        let mut r = RingRecord { len: 20, ..RingRecord::default() };
        assert_eq!(r.datagram().map(<[u8]>::len), Some(20));
        r.len = CHUNK_DATAGRAM_MAX as u16 + 1;
        assert_eq!(r.datagram(), None);
    }

    #[test]
    fn train_tags_round_trip() {
        let mut r = RingRecord::default();
        assert_eq!(r.train_piece(), None, "a lone chunk");
        r.train = train_tag(5, 6);
        assert_eq!(r.train_piece(), Some((5, 6)));
        r.train = train_tag(0, 2);
        assert_eq!(r.train_piece(), Some((0, 2)));
    }
}
