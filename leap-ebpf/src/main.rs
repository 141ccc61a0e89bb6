//! leap's XDP program: picks LEAP chunks off the wire before the kernel's
//! UDP stack and hands them to user space, through the AF_XDP socket of the
//! receive queue or a BPF ring buffer.
//!
//! Ethernet (one VLAN tag) → IPv4 (no fragments) or IPv6 (no extension
//! headers) → UDP to a port in `LEAP_PORTS` → LEAP header. A chunk goes to
//! user space when its header is sane and, with the peer filter on, its
//! source may send its kind; everything else is passed untouched. Every
//! decision is counted in `LEAP_COUNTERS` (see `leap_common::xdp::Counter`).
//!
//! Built by `cargo xtask build-ebpf` for `bpfel-unknown-none`; the maps and
//! their types are defined in `leap_common::xdp`.
#![no_std]
#![no_main]

use core::mem::size_of;
use core::ptr::addr_of_mut;

use aya_ebpf::bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, xdp_action};
use aya_ebpf::helpers::generated::bpf_xdp_load_bytes;
use aya_ebpf::macros::{map, xdp};
use aya_ebpf::maps::{Array, HashMap, PerCpuArray, RingBuf, XskMap};
use aya_ebpf::programs::XdpContext;
use aya_log_ebpf::debug;
use leap_common::chunk::{CHUNK_DATAGRAM_MAX, CHUNK_HEADER_LEN, CHUNK_PAYLOAD_MAX, ChunkKind, LEAP_MAGIC, flags};
use leap_common::xdp::{
    COUNTERS, Counter, FAMILY_V4, FAMILY_V6, MAX_PEERS, MAX_PORTS, MAX_QUEUES, PeerKey, PeerRule, PortRule, RING_BYTES,
    RingRecord, XdpConfig, cfg, delivery, kind_bit, v4_mapped,
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

use leap_common::xdp::wire::{
    ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IP_MF_OFFSET, IPPROTO_UDP, IPV4_HLEN, IPV6_HLEN,
    UDP_HLEN as UDP_HDR_LEN, VLAN_HLEN,
};

// Wire headers as byte arrays: alignment 1, so a pointer into the packet at
// any offset is a valid pointer to them.
#[repr(C)]
struct EthHdr {
    dst: [u8; 6],
    src: [u8; 6],
    proto: [u8; 2],
}

#[repr(C)]
struct VlanHdr {
    tci: [u8; 2],
    proto: [u8; 2],
}

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

#[repr(C)]
struct Ipv6Hdr {
    vtc_flow: [u8; 4],
    payload_len: [u8; 2],
    next_hdr: u8,
    hop_limit: u8,
    saddr: [u8; 16],
    daddr: [u8; 16],
}

#[repr(C)]
struct UdpHdr {
    sport: [u8; 2],
    dport: [u8; 2],
    len: [u8; 2],
    check: [u8; 2],
}

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

/// A pointer to a `T` at `offset` in the packet, checked against `data_end`.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
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

/// Where the UDP header is and who sent the packet.
struct L3 {
    /// Offset of the UDP header from the start of the packet.
    l4: usize,
    /// Bytes of IP payload, from the IP header.
    ip_payload: usize,
    /// Source address, IPv4 mapped into IPv6.
    src: [u8; 16],
    family: u16,
}

#[xdp]
pub fn leap_xdp(ctx: XdpContext) -> u32 {
    try_leap_xdp(&ctx)
}

#[inline(always)]
fn try_leap_xdp(ctx: &XdpContext) -> u32 {
    let Some(l3) = parse_l3(ctx) else {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    };
    let Some(udp) = ptr_at::<UdpHdr>(ctx, l3.l4) else {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    };
    // SAFETY: `ptr_at` checked the whole header against `data_end`.
    let (sport, dport, udp_len) = unsafe { (be16((*udp).sport), be16((*udp).dport), be16((*udp).len)) };
    // SAFETY: plain lookup of a Pod value; the reference does not outlive
    // this statement.
    let port_on = unsafe { LEAP_PORTS.get(dport) }.is_some_and(|r| r.enabled != 0);
    if !port_on {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    }
    let config = LEAP_CONFIG.get(0).copied().unwrap_or_default();
    if config.delivery == delivery::PASS {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    }
    let rejected = if config.flags & cfg::DROP_REJECTED != 0 { xdp_action::XDP_DROP } else { xdp_action::XDP_PASS };

    let leap_off = l3.l4 + UDP_HDR_LEN;
    let Some(leap) = ptr_at::<LeapHdr>(ctx, leap_off) else {
        return decide(Counter::NotLeap, xdp_action::XDP_PASS);
    };
    // SAFETY: `ptr_at` checked the whole header against `data_end`.
    let hdr = unsafe { &*leap };
    if u32::from_be_bytes(hdr.magic) != LEAP_MAGIC {
        return decide(Counter::NotLeap, xdp_action::XDP_PASS);
    }
    let chunk_id = be16(hdr.chunk_id);
    let total_chunks = be16(hdr.total_chunks);
    let reserved = be16(hdr.reserved);

    // The UDP length must be the IP payload, fit in the packet (which may
    // carry Ethernet padding after it) and leave 0..=1400 bytes of data.
    let udp_len = usize::from(udp_len);
    let in_packet = ctx.data_end() - ctx.data() - l3.l4;
    let datagram = udp_len.wrapping_sub(UDP_HDR_LEN);
    if udp_len != l3.ip_payload
        || udp_len > in_packet
        || datagram < CHUNK_HEADER_LEN
        || datagram > CHUNK_DATAGRAM_MAX
        || chunk_id >= total_chunks
    {
        if config.flags & cfg::LOG != 0 {
            debug!(ctx, "leap: malformed chunk {}/{} udp_len {} from port {}", chunk_id, total_chunks, udp_len, sport);
        }
        return decide(Counter::Malformed, rejected);
    }

    if config.flags & cfg::PEER_FILTER != 0 {
        let key = PeerKey { addr: l3.src, src_port: sport, dst_port: dport };
        // SAFETY: plain lookup of a Pod value, copied out at once.
        let rule = unsafe { LEAP_PEERS.get(&key) }.copied().unwrap_or_default();
        if !rule.allows(reserved) {
            if config.flags & cfg::LOG != 0 {
                debug!(ctx, "leap: chunk kind {} from unexpected source port {}", reserved & 0xF, sport);
            }
            return decide(Counter::WrongSource, rejected);
        }
    }

    match config.delivery {
        delivery::XSK => to_xsk(ctx),
        delivery::RING_BUF => {
            // The reader sleeps until a record wakes it: the end of a frame,
            // and anything recovering a loss (retransmissions, NACKs), must.
            let urgent = chunk_id + 1 == total_chunks || is_urgent(reserved);
            to_ring(ctx, &config, &l3, sport, dport, leap_off, datagram, urgent)
        }
        _ => decide(Counter::Passed, xdp_action::XDP_PASS),
    }
}

/// Ethernet (+ one VLAN tag) and IPv4/IPv6 up to a UDP header.
#[inline(always)]
fn parse_l3(ctx: &XdpContext) -> Option<L3> {
    let eth = ptr_at::<EthHdr>(ctx, 0)?;
    let mut off = size_of::<EthHdr>();
    // SAFETY: `ptr_at` checked the header against `data_end`.
    let mut proto = be16(unsafe { (*eth).proto });
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        let vlan = ptr_at::<VlanHdr>(ctx, off)?;
        // SAFETY: as above.
        proto = be16(unsafe { (*vlan).proto });
        off += size_of::<VlanHdr>();
    }
    match proto {
        ETH_P_IP => {
            let ip = ptr_at::<Ipv4Hdr>(ctx, off)?;
            // SAFETY: `ptr_at` checked the header against `data_end`.
            let ip = unsafe { &*ip };
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
            Some(L3 { l4: off + ihl, ip_payload: tot_len - ihl, src: v4_mapped(ip.saddr), family: FAMILY_V4 })
        }
        ETH_P_IPV6 => {
            let ip = ptr_at::<Ipv6Hdr>(ctx, off)?;
            // SAFETY: `ptr_at` checked the header against `data_end`.
            let ip = unsafe { &*ip };
            // Extension headers (fragments among them) are not walked.
            if ip.vtc_flow[0] >> 4 != 6 || ip.next_hdr != IPPROTO_UDP {
                return None;
            }
            Some(L3 {
                l4: off + size_of::<Ipv6Hdr>(),
                ip_payload: usize::from(be16(ip.payload_len)),
                src: ip.saddr,
                family: FAMILY_V6,
            })
        }
        _ => None,
    }
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

/// Copies the UDP payload into a ring-buffer record and drops the packet.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn to_ring(
    ctx: &XdpContext,
    config: &XdpConfig,
    l3: &L3,
    sport: u16,
    dport: u16,
    leap_off: usize,
    datagram: usize,
    urgent: bool,
) -> u32 {
    let Some(mut entry) = LEAP_RING.reserve::<RingRecord>(0) else {
        return decide(Counter::RingBufFull, xdp_action::XDP_DROP);
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
        return decide(Counter::Malformed, xdp_action::XDP_DROP);
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
    let copied = unsafe { bpf_xdp_load_bytes(ctx.ctx, leap_off as u32, addr_of_mut!((*rec).data).cast(), len) };
    if copied != 0 {
        entry.discard(0);
        return decide(Counter::Malformed, xdp_action::XDP_DROP);
    }
    // SAFETY: as above; plain stores of integer fields into the record.
    unsafe {
        addr_of_mut!((*rec).len).write(len as u16);
        addr_of_mut!((*rec).src_port).write(sport);
        addr_of_mut!((*rec).dst_port).write(dport);
        addr_of_mut!((*rec).family).write(l3.family);
        addr_of_mut!((*rec).src_addr).write(l3.src);
        addr_of_mut!((*rec).rx_queue).write(ctx.rx_queue_index());
        addr_of_mut!((*rec)._reserved).write(0);
    }
    let every = u64::from(config.wakeup_every);
    let nth = LEAP_COUNTERS.get(Counter::ToRingBuf as u32).copied().unwrap_or_default();
    let wake = urgent || every <= 1 || (nth + 1) % every == 0;
    entry.submit(u64::from(if wake { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP }));
    decide(Counter::ToRingBuf, xdp_action::XDP_DROP)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

// `CHUNK_PAYLOAD_MAX` bounds `datagram` through `CHUNK_DATAGRAM_MAX`.
const _: () = assert!(CHUNK_DATAGRAM_MAX == CHUNK_HEADER_LEN + CHUNK_PAYLOAD_MAX);
