//! leap's XDP program: picks LEAP chunks off the wire before the kernel's
//! UDP stack and hands them to user space, through the AF_XDP socket of the
//! receive queue or a BPF ring buffer.
//!
//! Ethernet (one VLAN tag) → IPv4 (no fragments) or IPv6 (no extension
//! headers) → UDP to a port in `LEAP_PORTS` → LEAP header(s). A datagram
//! is one chunk or a *train* of up to `TRAIN_CHUNKS_MAX` chunks back to back
//! (`leap_common::chunk::train`), every one of which is checked. A chunk goes to
//! user space only when the kernel would have accepted it too (a unicast
//! destination MAC of this interface, an allowed VLAN, a local destination
//! address with `cfg::LOCAL_ONLY`; no v4-mapped IPv6 source; a correct IPv4
//! header checksum), its header is sane and, with the peer filter on, its
//! source may send its kind; everything else is passed untouched or, with
//! `cfg::DROP_REJECTED`, dropped. The UDP checksum is verified in user
//! space, which gets the checksum field and both addresses. Every decision
//! is counted in `LEAP_COUNTERS` (see `leap_common::xdp::Counter`).
//!
//! Two entry points share the maps and one body: `leap_xdp` for linear
//! packets, and `leap_xdp_frags` (section `xdp.frags`), which also takes
//! multi-buffer packets (a train at a 9000-byte MTU). Both read every
//! header with `bpf_xdp_load_bytes` (kernels ≥ 5.18; one 54-byte copy for
//! untagged IPv4 without options), which follows the fragments, and hold
//! no packet pointer: the program passes the verifier
//! with `CAP_BPF` alone, without `CAP_PERFMON` (whose absence makes the
//! verifier refuse packet-pointer arithmetic with a register, and
//! `data_end - data`, as Spectre-v1 gadgets). A LEAP datagram longer than any train (a GSO/GRO
//! super-datagram that generic XDP sees whole) is passed to the kernel's
//! UDP socket, as is a datagram the ring buffer has no room for.
//!
//! Built by `cargo xtask build-ebpf` for `bpfel-unknown-none`; the maps and
//! their types are defined in `leap_common::xdp`.
#![no_std]
#![no_main]

use core::mem::{MaybeUninit, size_of};
use core::ptr::addr_of_mut;

use aya_ebpf::bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, xdp_action};
use aya_ebpf::helpers::generated::{bpf_xdp_get_buff_len, bpf_xdp_load_bytes};
use aya_ebpf::macros::{map, xdp};
use aya_ebpf::maps::{Array, HashMap, PerCpuArray, RingBuf, XskMap};
use aya_ebpf::programs::XdpContext;
use aya_log_ebpf::debug;
use leap_common::chunk::{
    CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, CHUNK_PAYLOAD_MAX, ChunkKind, LEAP_MAGIC, TRAIN_CHUNKS_MAX,
    TRAIN_DATAGRAM_MAX, flags,
};
use leap_common::xdp::{
    COUNTERS, Counter, FAMILY_V4, FAMILY_V6, LocalAddr, MAX_LOCAL_ADDRS, MAX_PEERS, MAX_PORTS, MAX_QUEUES, MAX_VLANS,
    PeerKey, PeerRule, PortRule, RING_BYTES, RingRecord, XdpConfig, cfg, delivery, is_v4_mapped, kind_bit, train_tag,
    v4_mapped,
};

#[map]
static LEAP_CONFIG: Array<XdpConfig> = Array::with_max_entries(1, 0);
#[map]
static LEAP_PORTS: HashMap<u16, PortRule> = HashMap::with_max_entries(MAX_PORTS, 0);
#[map]
static LEAP_PEERS: HashMap<PeerKey, PeerRule> = HashMap::with_max_entries(MAX_PEERS, 0);
#[map]
static LEAP_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);
#[map]
static LEAP_XSKS: XskMap = XskMap::with_max_entries(MAX_QUEUES, 0);
#[map]
static LEAP_RING: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);
#[map]
static LEAP_LOCAL_ADDRS: HashMap<LocalAddr, u32> = HashMap::with_max_entries(MAX_LOCAL_ADDRS, 0);
#[map]
static LEAP_VLANS: HashMap<u16, u32> = HashMap::with_max_entries(MAX_VLANS, 0);

use leap_common::xdp::wire::{
    ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IP_MF_OFFSET, IPPROTO_UDP, IPV4_HLEN, IPV4_HLEN_MAX,
    IPV6_HLEN, UDP_HLEN as UDP_HDR_LEN, VLAN_HLEN, VLAN_VID_MASK,
};

// Wire headers as byte arrays: alignment 1, so a pointer into the packet at
// any offset is a valid pointer to them.
#[derive(Clone, Copy)]
#[repr(C)]
struct EthHdr {
    dst: [u8; 6],
    src: [u8; 6],
    proto: [u8; 2],
}

#[derive(Clone, Copy)]
#[repr(C)]
struct VlanHdr {
    tci: [u8; 2],
    proto: [u8; 2],
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Ipv4Hdr {
    version_ihl: u8,
    tos: u8,
    tot_len: [u8; 2],
    id: [u8; 2],
    frag_off: [u8; 2],
    ttl: u8,
    proto: u8,
    check: [u8; 2],
    saddr: [u8; 4],
    daddr: [u8; 4],
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Ipv6Hdr {
    vtc_flow: [u8; 4],
    payload_len: [u8; 2],
    next_hdr: u8,
    hop_limit: u8,
    saddr: [u8; 16],
    daddr: [u8; 16],
}

#[derive(Clone, Copy)]
#[repr(C)]
struct UdpHdr {
    sport: [u8; 2],
    dport: [u8; 2],
    len: [u8; 2],
    check: [u8; 2],
}

#[derive(Clone, Copy)]
#[repr(C)]
struct LeapHdr {
    magic: [u8; 4],
    seq: [u8; 2],
    chunk_id: [u8; 2],
    total_chunks: [u8; 2],
    reserved: [u8; 2],
}

const _: () = assert!(size_of::<EthHdr>() == ETH_HLEN);
const _: () = assert!(size_of::<VlanHdr>() == VLAN_HLEN);
const _: () = assert!(size_of::<Ipv4Hdr>() == IPV4_HLEN);
const _: () = assert!(size_of::<Ipv6Hdr>() == IPV6_HLEN);
const _: () = assert!(size_of::<UdpHdr>() == UDP_HDR_LEN);
const _: () = assert!(size_of::<LeapHdr>() == CHUNK_HEADER_LEN);

/// Offsets of the destination address in the IPv4 and IPv6 headers.
const IPV4_DADDR_OFF: usize = core::mem::offset_of!(Ipv4Hdr, daddr);
const IPV6_DADDR_OFF: usize = core::mem::offset_of!(Ipv6Hdr, daddr);

/// A copy of the `size_of::<T>()` bytes at `offset` of the packet, or `None`
/// when the packet is shorter. Every header is read this way, through
/// `bpf_xdp_load_bytes` into the stack, never through a packet pointer:
/// the program then holds no packet pointer at all, so the verifier's
/// Spectre-v1 rules for loaders without `CAP_PERFMON` (no packet pointer
/// plus a register, no `data_end - data`) have nothing to refuse, and the
/// offsets may be any scalar. The helper follows the fragments of a
/// multi-buffer packet too.
#[inline(always)]
fn load<T: Copy>(ctx: &XdpContext, offset: usize) -> Option<T> {
    let mut v = MaybeUninit::<T>::uninit();
    // SAFETY: `v` is `size_of::<T>()` writable bytes on the stack; the
    // helper bounds-checks the packet offset and length and writes all of
    // them or fails.
    let r = unsafe { bpf_xdp_load_bytes(ctx.ctx, offset as u32, v.as_mut_ptr().cast(), size_of::<T>() as u32) };
    if r != 0 {
        return None;
    }
    // SAFETY: the helper succeeded, so every byte was written; `T` is a
    // plain array-of-bytes header for which any bytes are valid.
    Some(unsafe { v.assume_init() })
}

#[inline(always)]
const fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

#[inline(always)]
fn count(counter: Counter) {
    if let Some(p) = LEAP_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the pointer is this CPU's slot of a per-CPU array entry;
        // XDP programs do not preempt each other on one CPU.
        unsafe { *p += 1 };
    }
}

/// Counts `counter` and returns `action`.
#[inline(always)]
fn decide(counter: Counter, action: xdp_action::Type) -> u32 {
    count(counter);
    action
}

/// A UDP datagram to a leap port: where its parts are, who sent it, and
/// what the kernel would think of it.
struct L3 {
    /// Offset of the IP header from the start of the packet.
    l3: usize,
    /// Offset of the UDP header from the start of the packet.
    l4: usize,
    /// Bytes of IP payload, from the IP header.
    ip_payload: usize,
    /// Source address, IPv4 mapped into IPv6.
    src: [u8; 16],
    family: u16,
    sport: u16,
    dport: u16,
    udp_len: u16,
    /// The UDP checksum field.
    udp_check: u16,
    /// Why the kernel's receive path would drop the packet before any
    /// socket saw it, or `None`.
    verdict: Option<Counter>,
}

#[xdp]
pub fn leap_xdp(ctx: XdpContext) -> u32 {
    try_leap_xdp(&ctx)
}

#[xdp(frags)]
pub fn leap_xdp_frags(ctx: XdpContext) -> u32 {
    try_leap_xdp(&ctx)
}

/// Bytes of the packet from `l4` on: the linear part only for the plain
/// program (it never sees more), every fragment for the frags program.
/// The helper's length, not `data_end - data`, which the verifier refuses
/// to loaders without `CAP_PERFMON`.
#[inline(always)]
fn bytes_from(ctx: &XdpContext, l4: usize) -> usize {
    // SAFETY: the helper only reads the context it is given.
    let total = unsafe { bpf_xdp_get_buff_len(ctx.ctx) } as usize;
    total.wrapping_sub(l4)
}

/// The LEAP header at `off`, copied out of the packet (and its fragments).
#[inline(always)]
fn chunk_header(ctx: &XdpContext, off: usize) -> Option<LeapHdr> {
    load::<LeapHdr>(ctx, off)
}

/// The chunks of a train of `datagram` bytes (12..=`TRAIN_DATAGRAM_MAX`)
/// and the length of the last one, which must hold a header: every chunk
/// but the last is full.
#[inline(always)]
fn train_shape(datagram: usize) -> Option<(usize, usize)> {
    let chunks = datagram.div_ceil(CHUNK_DATAGRAM_MAX);
    if chunks == 0 || chunks > TRAIN_CHUNKS_MAX {
        return None;
    }
    let last = datagram - (chunks - 1) * CHUNK_DATAGRAM_MAX;
    if last < CHUNK_HEADER_LEN {
        return None;
    }
    Some((chunks, last))
}

#[inline(always)]
fn try_leap_xdp(ctx: &XdpContext) -> u32 {
    let Some(config) = LEAP_CONFIG.get(0) else {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    };
    if config.delivery == delivery::PASS {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    }
    // The common layout in one copy; anything else header by header.
    let fast = load::<FastHdr>(ctx, 0).filter(|f| be16(f.eth.proto) == ETH_P_IP && f.ip.version_ihl == 0x45);
    let parsed = match &fast {
        Some(f) => {
            let l2 = L2 { dst_mac: f.eth.dst, vlan: None };
            parse_ipv4(ctx, config, &l2, ETH_HLEN, &f.ip, Some(f.udp))
        }
        None => parse_l3(ctx, config),
    };
    let Some(l3) = parsed else {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    };
    let (sport, dport) = (l3.sport, l3.dport);
    let rejected = if config.flags & cfg::DROP_REJECTED != 0 { xdp_action::XDP_DROP } else { xdp_action::XDP_PASS };

    let leap_off = l3.l4 + UDP_HDR_LEN;
    let hdr = match &fast {
        Some(f) => Some(f.leap),
        None => chunk_header(ctx, leap_off),
    };
    let Some(hdr) = hdr else {
        return decide(Counter::NotLeap, xdp_action::XDP_PASS);
    };
    if u32::from_be_bytes(hdr.magic) != LEAP_MAGIC {
        return decide(Counter::NotLeap, xdp_action::XDP_PASS);
    }

    // What the kernel's receive path would drop before any socket sees it.
    if let Some(counter) = l3.verdict {
        if config.flags & cfg::LOG != 0 {
            log_not_for_host(ctx, sport, counter as u32);
        }
        return decide(counter, rejected);
    }

    let udp_len = usize::from(l3.udp_len);
    // Longer than any train: a GSO/GRO super-datagram that generic XDP sees
    // before segmentation, or a sender this program does not know. The
    // node's UDP socket takes it (and splits it, or counts it).
    if udp_len > UDP_HDR_LEN + TRAIN_DATAGRAM_MAX {
        return decide(Counter::PassedOversize, xdp_action::XDP_PASS);
    }

    // The UDP length must be the IP payload, fit in the packet (which may
    // carry Ethernet padding after it) and leave a train of 1..=6 chunks.
    let in_packet = bytes_from(ctx, l3.l4);
    let datagram = udp_len.wrapping_sub(UDP_HDR_LEN);
    let shape = if udp_len != l3.ip_payload || udp_len > in_packet { None } else { train_shape(datagram) };
    let Some((chunks, last)) = shape else {
        if config.flags & cfg::LOG != 0 {
            log_malformed_datagram(ctx, udp_len, sport);
        }
        return decide(Counter::Malformed, rejected);
    };

    let rule = if config.flags & cfg::PEER_FILTER != 0 {
        let key = PeerKey { addr: l3.src, src_port: sport, dst_port: dport };
        // SAFETY: plain lookup of a Pod value, copied out at once.
        Some(unsafe { LEAP_PEERS.get(&key) }.copied().unwrap_or_default())
    } else {
        None
    };
    // Every chunk of the train on its own: one bad header makes the whole
    // datagram malformed, one kind the source may not send makes it wrong.
    // Unrolled, with a constant index each: without CAP_PERFMON the verifier
    // also walks the mispredicted side of every branch, where a loop
    // counter keeps no bound, so a loop would never converge.
    macro_rules! check_chunk {
        ($i:literal) => {
            if $i < chunks {
                let h = if $i == 0 { Some(hdr) } else { chunk_header(ctx, leap_off + $i * CHUNK_DATAGRAM_MAX) };
                if let Some(counter) = chunk_verdict(ctx, config, h, rule, udp_len, sport) {
                    return decide(counter, rejected);
                }
            }
        };
    }
    check_chunk!(0);
    check_chunk!(1);
    check_chunk!(2);
    check_chunk!(3);
    check_chunk!(4);
    check_chunk!(5);
    const _: () = assert!(TRAIN_CHUNKS_MAX == 6, "one check_chunk! per chunk of a train");

    match config.delivery {
        delivery::XSK => to_xsk(ctx),
        delivery::RING_BUF => to_ring(ctx, config.wakeup_every, &l3, leap_off, chunks, last),
        _ => decide(Counter::Passed, xdp_action::XDP_PASS),
    }
}

/// Why one chunk header `h` of a train (`None`: not in the packet) makes
/// the datagram rejected, or `None` when it is sane and its kind allowed by
/// `rule`.
#[inline(always)]
fn chunk_verdict(
    ctx: &XdpContext,
    config: &XdpConfig,
    h: Option<LeapHdr>,
    rule: Option<PeerRule>,
    udp_len: usize,
    sport: u16,
) -> Option<Counter> {
    let Some(h) = h else {
        return Some(Counter::Malformed);
    };
    let (chunk_id, total_chunks, reserved) = (be16(h.chunk_id), be16(h.total_chunks), be16(h.reserved));
    if u32::from_be_bytes(h.magic) != LEAP_MAGIC || chunk_id >= total_chunks {
        if config.flags & cfg::LOG != 0 {
            log_malformed_chunk(ctx, chunk_id, total_chunks, udp_len, sport);
        }
        return Some(Counter::Malformed);
    }
    if let Some(rule) = rule
        && !rule.allows(reserved)
    {
        if config.flags & cfg::LOG != 0 {
            log_wrong_kind(ctx, reserved & 0xF, sport);
        }
        return Some(Counter::WrongSource);
    }
    None
}

// The events of `cfg::LOG`, each in a function of its own (a BPF-to-BPF
// call): aya-log spills pointers to its arguments on the stack, and the
// verifier refuses a loader without `CAP_PERFMON` to write over a spilled
// pointer, which the caller's frame would do when it reuses the slot.

#[inline(never)]
fn log_not_for_host(ctx: &XdpContext, sport: u16, counter: u32) {
    debug!(ctx, "leap: chunk from port {} not for this host (counter {})", sport, counter);
}

#[inline(never)]
fn log_malformed_datagram(ctx: &XdpContext, udp_len: usize, sport: u16) {
    debug!(ctx, "leap: malformed datagram udp_len {} from port {}", udp_len, sport);
}

#[inline(never)]
fn log_malformed_chunk(ctx: &XdpContext, chunk_id: u16, total_chunks: u16, udp_len: usize, sport: u16) {
    debug!(ctx, "leap: malformed chunk {}/{} udp_len {} from port {}", chunk_id, total_chunks, udp_len, sport);
}

#[inline(never)]
fn log_wrong_kind(ctx: &XdpContext, kind: u16, sport: u16) {
    debug!(ctx, "leap: chunk kind {} from unexpected source port {}", kind, sport);
}

/// MAC comparison at constant indices (no `memcmp` call for the BPF
/// linker, no variable stack offset for the verifier).
#[inline(always)]
fn mac_eq(a: &[u8; 6], b: &[u8; 6]) -> bool {
    (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) | (a[4] ^ b[4]) | (a[5] ^ b[5]) == 0
}

/// What [`verdict`] needs of the link layer.
struct L2 {
    dst_mac: [u8; 6],
    vlan: Option<u16>,
}

/// Why the kernel would drop a packet before any socket sees it, in the
/// order of the checks: a unicast destination MAC of another host, a VLAN
/// the interface does not carry, a v4-mapped IPv6 source, a destination
/// address that is not ours, a wrong IPv4 header checksum. `None`: it would
/// reach a socket. The destination lookup runs only for leap ports.
#[inline(always)]
fn verdict(config: &XdpConfig, l2: &L2, mapped_src: bool, dst: &LocalAddr, ip_csum_ok: bool) -> Option<Counter> {
    let local_only = config.flags & cfg::LOCAL_ONLY != 0;
    if local_only {
        // Group addresses (broadcast, multicast) have the I/G bit set; the
        // kernel takes them (PACKET_BROADCAST/MULTICAST) and then routes by
        // the destination address, checked below.
        if l2.dst_mac[0] & 1 == 0 && !mac_eq(&l2.dst_mac, &config.mac) {
            return Some(Counter::ForeignMac);
        }
        // VLAN 0 only carries a priority: the kernel takes such a frame as
        // untagged.
        if let Some(vid) = l2.vlan
            && vid != 0
        {
            // SAFETY: plain lookup of a Pod value; the reference does not
            // outlive this statement.
            if unsafe { LEAP_VLANS.get(&vid) }.is_none() {
                return Some(Counter::ForeignVlan);
            }
        }
    }
    if mapped_src {
        return Some(Counter::MappedSource);
    }
    // SAFETY: as above.
    if local_only && unsafe { LEAP_LOCAL_ADDRS.get(dst) }.is_none() {
        return Some(Counter::ForeignDst);
    }
    if !ip_csum_ok {
        return Some(Counter::BadIpChecksum);
    }
    None
}

/// The UDP header `u` when its destination port is a leap port:
/// `(sport, dport, len, check)`.
#[inline(always)]
fn udp_to_leap_port(u: &UdpHdr) -> Option<(u16, u16, u16, u16)> {
    let dport = be16(u.dport);
    // SAFETY: plain lookup of a Pod value; the reference does not outlive
    // this statement.
    if !unsafe { LEAP_PORTS.get(dport) }.is_some_and(|r| r.enabled != 0) {
        return None;
    }
    Some((be16(u.sport), dport, be16(u.len), be16(u.check)))
}

/// The ones'-complement sum of the four 16-bit words of `x` (not folded).
#[inline(always)]
const fn sum64(x: u64) -> u32 {
    ((x >> 48) as u32) + ((x >> 32) as u32 & 0xFFFF) + ((x >> 16) as u32 & 0xFFFF) + (x as u32 & 0xFFFF)
}

/// The ones'-complement sum of the 20 bytes of an IPv4 header without
/// options (not folded).
#[inline(always)]
fn ipv4_fixed_sum(ip: &Ipv4Hdr) -> u32 {
    let w = |b: [u8; 2]| u32::from(be16(b));
    let pair = |b: [u8; 4]| w([b[0], b[1]]) + w([b[2], b[3]]);
    w([ip.version_ihl, ip.tos])
        + w(ip.tot_len)
        + w(ip.id)
        + w(ip.frag_off)
        + w([ip.ttl, ip.proto])
        + w(ip.check)
        + pair(ip.saddr)
        + pair(ip.daddr)
}

/// The ones'-complement sum of the options of an IPv4 header of `ihl`
/// bytes (24..=60) at `off`, or `None` when the packet ends inside them.
/// They are copied into a zeroed buffer of the largest size, and the whole
/// buffer is summed at constant offsets: the zeros past the options add
/// nothing.
#[inline(always)]
fn ipv4_options_sum(ctx: &XdpContext, off: usize, ihl: usize) -> Option<u32> {
    const OPTIONS_MAX: usize = IPV4_HLEN_MAX - IPV4_HLEN;
    let mut opts = [0u64; OPTIONS_MAX / 8];
    // Clamped right before the call, in a form the verifier follows (as in
    // `ring_record`): 1..=40 bytes. The caller checked the range already.
    let len = (ihl - IPV4_HLEN) as u32;
    // SAFETY: reads a local variable.
    let len = unsafe { core::ptr::read_volatile(&len) };
    if len == 0 {
        return Some(0);
    }
    let mut len = ((len - 1) & 0x3F) + 1;
    if len > OPTIONS_MAX as u32 {
        len = OPTIONS_MAX as u32;
    }
    // SAFETY: `opts` is 40 writable bytes on the stack and `len` is at most
    // 40; the helper bounds-checks the packet offset.
    let r = unsafe { bpf_xdp_load_bytes(ctx.ctx, (off + IPV4_HLEN) as u32, opts.as_mut_ptr().cast(), len) };
    if r != 0 {
        return None;
    }
    let be = u64::from_be;
    Some(sum64(be(opts[0])) + sum64(be(opts[1])) + sum64(be(opts[2])) + sum64(be(opts[3])) + sum64(be(opts[4])))
}

/// Whether a ones'-complement sum (not folded) is 0xFFFF, as the kernel's
/// `ip_fast_csum` checks.
#[inline(always)]
const fn folds_to_ffff(mut sum: u32) -> bool {
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum == 0xFFFF
}

/// Ethernet, IPv4 without options, UDP and a LEAP header: 54 bytes, the
/// layout of nearly every chunk, read in one copy.
#[derive(Clone, Copy)]
#[repr(C)]
struct FastHdr {
    eth: EthHdr,
    ip: Ipv4Hdr,
    udp: UdpHdr,
    leap: LeapHdr,
}
const _: () = assert!(size_of::<FastHdr>() == ETH_HLEN + IPV4_HLEN + UDP_HDR_LEN + CHUNK_HEADER_LEN);

/// Ethernet and one VLAN tag, as read in one copy: `tag` is meaningful
/// only when `eth.proto` says there is one.
#[derive(Clone, Copy)]
#[repr(C)]
struct EthVlanHdr {
    eth: EthHdr,
    tag: VlanHdr,
}

/// Ethernet (+ one VLAN tag), IPv4/IPv6 and a UDP header to a leap port;
/// `None` for anything else.
#[inline(always)]
fn parse_l3(ctx: &XdpContext, config: &XdpConfig) -> Option<L3> {
    // Any LEAP datagram is longer than 18 bytes: a shorter packet is not
    // one, whatever it is.
    let head = load::<EthVlanHdr>(ctx, 0)?;
    let mut off = size_of::<EthHdr>();
    let mut proto = be16(head.eth.proto);
    let mut l2 = L2 { dst_mac: head.eth.dst, vlan: None };
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        l2.vlan = Some(be16(head.tag.tci) & VLAN_VID_MASK);
        proto = be16(head.tag.proto);
        off += size_of::<VlanHdr>();
    }
    match proto {
        ETH_P_IP => parse_ipv4(ctx, config, &l2, off, &load::<Ipv4Hdr>(ctx, off)?, None),
        ETH_P_IPV6 => {
            let ip = load::<Ipv6Hdr>(ctx, off)?;
            // Extension headers (fragments among them) are not walked.
            if ip.vtc_flow[0] >> 4 != 6 || ip.next_hdr != IPPROTO_UDP {
                return None;
            }
            let l4 = off + size_of::<Ipv6Hdr>();
            let (sport, dport, udp_len, udp_check) = udp_to_leap_port(&load::<UdpHdr>(ctx, l4)?)?;
            let dst = LocalAddr { addr: ip.daddr, family: FAMILY_V6, _pad: 0 };
            Some(L3 {
                l3: off,
                l4,
                ip_payload: usize::from(be16(ip.payload_len)),
                src: ip.saddr,
                family: FAMILY_V6,
                sport,
                dport,
                udp_len,
                udp_check,
                verdict: verdict(config, &l2, is_v4_mapped(&ip.saddr), &dst, true),
            })
        }
        _ => None,
    }
}

/// The IPv4 header `ip` at `off` (after the link layer `l2`) and the UDP
/// header after it (`udp`, when the caller has read it already) to a leap
/// port; `None` for anything else.
#[inline(always)]
fn parse_ipv4(
    ctx: &XdpContext,
    config: &XdpConfig,
    l2: &L2,
    off: usize,
    ip: &Ipv4Hdr,
    udp: Option<UdpHdr>,
) -> Option<L3> {
    let ihl = usize::from(ip.version_ihl & 0x0F) * 4;
    if ip.version_ihl >> 4 != 4 || ihl < size_of::<Ipv4Hdr>() || ip.proto != IPPROTO_UDP {
        return None;
    }
    // A fragment: the UDP header and payload are not all here.
    if be16(ip.frag_off) & IP_MF_OFFSET != 0 {
        return None;
    }
    let tot_len = usize::from(be16(ip.tot_len));
    if tot_len < ihl {
        return None;
    }
    let mut sum = ipv4_fixed_sum(ip);
    if ihl > IPV4_HLEN {
        // The packet ends inside the options: no UDP header either.
        sum += ipv4_options_sum(ctx, off, ihl)?;
    }
    let udp = match udp {
        Some(u) => u,
        None => load::<UdpHdr>(ctx, off + ihl)?,
    };
    let (sport, dport, udp_len, udp_check) = udp_to_leap_port(&udp)?;
    let dst = LocalAddr { addr: v4_mapped(ip.daddr), family: FAMILY_V4, _pad: 0 };
    Some(L3 {
        l3: off,
        l4: off + ihl,
        ip_payload: tot_len - ihl,
        src: v4_mapped(ip.saddr),
        family: FAMILY_V4,
        sport,
        dport,
        udp_len,
        udp_check,
        verdict: verdict(config, l2, false, &dst, folds_to_ffff(sum)),
    })
}

/// Whether a chunk recovers a loss (a retransmission or a NACK from a leap
/// sender): the ring-buffer reader must wake for it at once.
#[inline(always)]
fn is_urgent(reserved: u16) -> bool {
    reserved & flags::LEAP != 0
        && (reserved & flags::RETRANSMIT != 0 || kind_bit(reserved) != 1 << ChunkKind::Data as u32)
}

/// Redirects into the AF_XDP socket of the receive queue, or passes the
/// packet to the kernel when none is bound there.
#[inline(always)]
fn to_xsk(ctx: &XdpContext) -> u32 {
    match LEAP_XSKS.redirect(ctx.rx_queue_index(), u64::from(xdp_action::XDP_PASS)) {
        Ok(action) => decide(Counter::ToXsk, action),
        Err(_) => decide(Counter::NoSocket, xdp_action::XDP_PASS),
    }
}

/// Copies every chunk of the train into a ring-buffer record of its own and
/// drops the packet. When the ring buffer has no room (even half-way
/// through a train: reassembly ignores the duplicates of chunks already
/// submitted), the packet is passed to the kernel's UDP socket instead.
#[inline(always)]
fn to_ring(ctx: &XdpContext, wakeup_every: u32, l3: &L3, leap_off: usize, chunks: usize, last: usize) -> u32 {
    let every = u64::from(wakeup_every);
    let nth = LEAP_COUNTERS.get(Counter::ToRingBuf as u32).copied().unwrap_or_default();
    let periodic = every <= 1 || (nth + 1) % every == 0;
    // Unrolled as the header checks are (see `try_leap_xdp`).
    macro_rules! record {
        ($i:literal) => {
            if $i < chunks {
                let len = if $i + 1 == chunks { last } else { CHUNK_DATAGRAM_MAX };
                // Which piece of how many: user space checks the UDP checksum
                // of a train once it has every piece.
                let train = if chunks > 1 { train_tag($i, chunks as u8) } else { 0 };
                match ring_record(ctx, l3, leap_off + $i * CHUNK_DATAGRAM_MAX, len, train, periodic) {
                    RingOutcome::Submitted => {}
                    RingOutcome::Full => return decide(Counter::RingBufFull, xdp_action::XDP_PASS),
                    RingOutcome::Failed => return decide(Counter::Malformed, xdp_action::XDP_DROP),
                }
            }
        };
    }
    record!(0);
    record!(1);
    record!(2);
    record!(3);
    record!(4);
    record!(5);
    const _: () = assert!(TRAIN_CHUNKS_MAX == 6, "one record! per chunk of a train");
    decide(Counter::ToRingBuf, xdp_action::XDP_DROP)
}

/// What became of one chunk offered to the ring buffer.
enum RingOutcome {
    Submitted,
    /// No room.
    Full,
    /// The packet could not be copied (cannot happen after the checks).
    Failed,
}

/// Copies the chunk of `datagram` bytes at `off` into a ring-buffer record.
#[inline(always)]
fn ring_record(ctx: &XdpContext, l3: &L3, off: usize, datagram: usize, train: u16, periodic: bool) -> RingOutcome {
    let Some(mut entry) = LEAP_RING.reserve::<RingRecord>(0) else {
        return RingOutcome::Full;
    };
    let rec = entry.as_mut_ptr();
    // Clamped right before the call, in a form the verifier can follow
    // (a mask, then a bound on the same register): 1..=1412 bytes. The
    // caller checked the range already, so neither changes the value; the
    // volatile read keeps the compiler from dropping them for that reason.
    let len = datagram as u32;
    // SAFETY: reads a local variable.
    let len = unsafe { core::ptr::read_volatile(&len) };
    if len == 0 {
        entry.discard(0);
        return RingOutcome::Failed;
    }
    // `(len - 1) & mask + 1` has a minimum of 1 the verifier can see: the
    // 6.1 verifier does not learn it from the `len == 0` test above and
    // rejects a possibly empty copy. Then bound it from above.
    let mut len = ((len - 1) & 0x7FF) + 1;
    if len > CHUNK_DATAGRAM_MAX as u32 {
        len = CHUNK_DATAGRAM_MAX as u32;
    }
    // SAFETY: `rec` points to a reserved, writable ring-buffer record of
    // `size_of::<RingRecord>()` bytes; `data` has room for 1412 bytes and
    // `len` is at most 1412; the helper bounds-checks the packet offset.
    let copied = unsafe { bpf_xdp_load_bytes(ctx.ctx, off as u32, addr_of_mut!((*rec).data).cast(), len) };
    if copied != 0 {
        entry.discard(0);
        return RingOutcome::Failed;
    }
    // The destination address, straight from the packet into the record.
    // SAFETY: `dst_addr` is 16 writable bytes of the reserved record; the
    // lengths are constants within it; the helper bounds-checks the packet.
    let copied = unsafe {
        let dst = addr_of_mut!((*rec).dst_addr).cast::<u8>();
        if l3.family == FAMILY_V4 {
            dst.cast::<[u8; 12]>().write([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
            bpf_xdp_load_bytes(ctx.ctx, (l3.l3 + IPV4_DADDR_OFF) as u32, dst.add(12).cast(), 4)
        } else {
            bpf_xdp_load_bytes(ctx.ctx, (l3.l3 + IPV6_DADDR_OFF) as u32, dst.cast(), 16)
        }
    };
    if copied != 0 {
        entry.discard(0);
        return RingOutcome::Failed;
    }
    // The chunk's own header, as copied: the reader sleeps until a record
    // wakes it, and the end of a frame and anything recovering a loss
    // (retransmissions, NACKs) must.
    // SAFETY: the first 12 bytes of `data` were written by the copy above
    // (`len` is at least 12: the caller checked every chunk's length).
    let (chunk_id, total_chunks, reserved) = unsafe {
        let d = addr_of_mut!((*rec).data).cast::<[u8; CHUNK_HEADER_LEN]>().read();
        (be16([d[6], d[7]]), be16([d[8], d[9]]), be16([d[10], d[11]]))
    };
    let urgent = chunk_id.wrapping_add(1) == total_chunks || is_urgent(reserved);
    // SAFETY: as above; plain stores of integer fields into the record.
    unsafe {
        addr_of_mut!((*rec).len).write(len as u16);
        addr_of_mut!((*rec).src_port).write(l3.sport);
        addr_of_mut!((*rec).dst_port).write(l3.dport);
        addr_of_mut!((*rec).family).write(l3.family);
        addr_of_mut!((*rec).src_addr).write(l3.src);
        addr_of_mut!((*rec).rx_queue).write(ctx.rx_queue_index());
        addr_of_mut!((*rec).udp_check).write(l3.udp_check);
        addr_of_mut!((*rec).train).write(train);
    }
    let wake = urgent || periodic;
    entry.submit(u64::from(if wake { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP }));
    RingOutcome::Submitted
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

// `CHUNK_PAYLOAD_MAX` bounds a chunk through `CHUNK_DATAGRAM_MAX`; a train
// is whole chunks.
const _: () = assert!(CHUNK_DATAGRAM_MAX == CHUNK_HEADER_LEN + CHUNK_PAYLOAD_MAX);
const _: () = assert!(TRAIN_DATAGRAM_MAX == TRAIN_CHUNKS_MAX * CHUNK_DATAGRAM_MAX);
