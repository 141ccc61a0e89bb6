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

use core::ffi::c_void;
use core::mem::size_of;
use core::ptr::{NonNull, addr_of, addr_of_mut};

use aya_ebpf::bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, xdp_action};
use aya_ebpf::helpers::generated::{bpf_map_lookup_elem, bpf_xdp_get_buff_len, bpf_xdp_load_bytes};
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
    PeerKey, PeerRule, PortRule, RING_BYTES, RingRecord, XdpConfig, cfg, delivery, kind_bit, train_tag,
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

// Everything the program reads or builds on its stack is whole 64-bit words.
// The 6.1 verifier refuses a loader without `CAP_PERFMON` any store
// narrower than 8 bytes into a stack slot that holds a spilled register,
// scalars included ("attempt to corrupt spilled pointer on stack"), and the
// compiler reuses slots freely: a 6-byte copy of an address into a map key
// was refused that way. So headers are copied into word buffers and read
// with shifts at constant offsets (in registers), map keys are built as
// words, and array maps are looked up with the index in a word (aya's
// `get(index)` stores a `u32`).

/// Bytes of the packet as little-endian words: byte `i` is bits
/// `8 * (i % 8)..` of word `i / 8` (BPF is little-endian); bytes past
/// what was read are zero.
#[derive(Clone, Copy)]
struct Words<const N: usize>([u64; N]);

impl<const N: usize> Words<N> {
    /// Word `w`, zero past the end.
    #[inline(always)]
    const fn at(&self, w: usize) -> u64 {
        if w < N { self.0[w] } else { 0 }
    }

    /// The eight bytes from byte `i`, as a word.
    #[inline(always)]
    const fn word(&self, i: usize) -> u64 {
        let (w, s) = (i / 8, (i % 8) * 8);
        if s == 0 { self.at(w) } else { self.at(w) >> s | self.at(w + 1) << (64 - s) }
    }

    #[inline(always)]
    const fn u8(&self, i: usize) -> u8 {
        self.word(i) as u8
    }

    /// The big-endian (network order) 16-bit field at byte `i`.
    #[inline(always)]
    const fn be16(&self, i: usize) -> u16 {
        (self.u8(i) as u16) << 8 | self.u8(i + 1) as u16
    }

    /// The big-endian 32-bit field at byte `i`.
    #[inline(always)]
    const fn be32(&self, i: usize) -> u32 {
        (self.be16(i) as u32) << 16 | self.be16(i + 2) as u32
    }
}

/// `N` zero words, stored one by one: with a zero the compiler cannot see,
/// so that it does not call `memset`, whose byte loop has a variable stack
/// offset (refused without `CAP_PERFMON`).
#[inline(always)]
fn zeroed<const N: usize>() -> [u64; N] {
    let zero = 0u64;
    // SAFETY: reads a local variable.
    [unsafe { core::ptr::read_volatile(&zero) }; N]
}

/// The first `len` bytes (a constant, at most `8 * N`) at `offset` of the
/// packet, or `None` when the packet is shorter. Every header is read this
/// way, through `bpf_xdp_load_bytes` into the stack, never through a packet
/// pointer: the program then holds no packet pointer at all, so the
/// verifier's Spectre-v1 rules for loaders without `CAP_PERFMON` (no packet
/// pointer plus a register, no `data_end - data`) have nothing to refuse,
/// and the offsets may be any scalar. The helper follows the fragments of a
/// multi-buffer packet too.
#[inline(always)]
fn load<const N: usize>(ctx: &XdpContext, offset: usize, len: usize) -> Option<Words<N>> {
    if len > 8 * N {
        return None;
    }
    // Zeroed first: the helper writes `len` bytes, and a loader without
    // `CAP_PERFMON` may not read stack bytes nobody wrote.
    let mut w = zeroed::<N>();
    // SAFETY: `w` is `8 * N` writable bytes on the stack and `len` at most
    // that; the helper bounds-checks the packet offset and length and
    // writes all `len` bytes or fails.
    let r = unsafe { bpf_xdp_load_bytes(ctx.ctx, offset as u32, w.as_mut_ptr().cast(), len as u32) };
    (r == 0).then_some(Words(w))
}

// The headers, and the offsets of their fields this program reads.

/// Ethernet and, when `PROTO` says so, one VLAN tag: 18 bytes.
type Eth = Words<3>;
const ETH_PROTO: usize = 12;
const VLAN_TCI: usize = ETH_HLEN;
const VLAN_PROTO: usize = ETH_HLEN + 2;
const ETH_VLAN_LEN: usize = ETH_HLEN + VLAN_HLEN;

/// An IPv4 header without options: 20 bytes.
type Ip4 = Words<3>;
const IP4_VERSION_IHL: usize = 0;
const IP4_TOT_LEN: usize = 2;
const IP4_FRAG_OFF: usize = 6;
const IP4_PROTO: usize = 9;
const IP4_SADDR: usize = 12;
const IPV4_DADDR_OFF: usize = 16;

/// An IPv6 header: 40 bytes.
type Ip6 = Words<5>;
const IP6_VTC_FLOW: usize = 0;
const IP6_PAYLOAD_LEN: usize = 4;
const IP6_NEXT_HDR: usize = 6;
const IP6_SADDR: usize = 8;
const IPV6_DADDR_OFF: usize = 24;

/// A UDP header: 8 bytes.
type Udp = Words<1>;
const UDP_SPORT: usize = 0;
const UDP_DPORT: usize = 2;
const UDP_LEN: usize = 4;
const UDP_CHECK: usize = 6;

/// A LEAP chunk header: 12 bytes.
type Leap = Words<2>;
const LEAP_MAGIC_OFF: usize = 0;
const LEAP_CHUNK_ID: usize = 6;
const LEAP_TOTAL: usize = 8;
const LEAP_RESERVED: usize = 10;

/// Ethernet, IPv4 without options, UDP and a LEAP header: 54 bytes, the
/// layout of nearly every chunk, read in one copy.
type Fast = Words<7>;
const FAST_IP: usize = ETH_HLEN;
const FAST_UDP: usize = FAST_IP + IPV4_HLEN;
const FAST_LEAP: usize = FAST_UDP + UDP_HDR_LEN;
const FAST_LEN: usize = FAST_LEAP + CHUNK_HEADER_LEN;
const _: () = assert!(FAST_LEN == 54 && FAST_LEN <= 8 * 7);
const _: () = assert!(ETH_VLAN_LEN <= 8 * 3 && IPV4_HLEN <= 8 * 3 && IPV6_HLEN == 8 * 5);
const _: () = assert!(UDP_HDR_LEN == 8 && CHUNK_HEADER_LEN <= 8 * 2);

/// The three words from byte `i` of a longer copy (a 20-byte header in it).
#[inline(always)]
const fn part3(f: &Fast, i: usize) -> Words<3> {
    Words([f.word(i), f.word(i + 8), f.word(i + 16)])
}

/// A 16-byte address as two words: IPv6, or IPv4 as `::ffff:a.b.c.d`.
type Addr = [u64; 2];

/// The IPv6 address at byte `i` of `ip`.
#[inline(always)]
const fn ip6_addr(ip: &Ip6, i: usize) -> Addr {
    [ip.word(i), ip.word(i + 8)]
}

/// `::ffff:a.b.c.d` from the IPv4 address at byte `i` of `ip`: bytes 10
/// and 11 are 0xff, 12..16 the address.
#[inline(always)]
const fn ip4_mapped(ip: &Ip4, i: usize) -> Addr {
    [0, 0xFFFF_0000 | (ip.word(i) & 0xFFFF_FFFF) << 32]
}

/// Whether an address is `::ffff:a.b.c.d`.
#[inline(always)]
const fn is_mapped(a: &Addr) -> bool {
    a[0] == 0 && a[1] & 0xFFFF_FFFF == 0xFFFF_0000
}

/// A 20-byte map key of an address and two `u16` ([`LocalAddr`],
/// [`PeerKey`]), in words.
#[repr(C, align(8))]
struct Key20([u64; 3]);

impl Key20 {
    #[inline(always)]
    const fn new(addr: Addr, a: u16, b: u16) -> Self {
        Self([addr[0], addr[1], a as u64 | (b as u64) << 16])
    }

    /// The key as the map's key type.
    #[inline(always)]
    fn get<K: Key20Layout>(&self) -> &K {
        // SAFETY: `K` is 20 bytes, an address and two `u16` (checked
        // below), aligned to at most 8, and any bytes are a valid `K`; the
        // words hold them in memory order.
        unsafe { &*self.0.as_ptr().cast::<K>() }
    }
}

/// The map keys laid out as [`Key20`] builds them.
trait Key20Layout {}
impl Key20Layout for LocalAddr {}
impl Key20Layout for PeerKey {}
const _: () = assert!(size_of::<LocalAddr>() == 20 && core::mem::offset_of!(LocalAddr, family) == 16);
const _: () = assert!(size_of::<PeerKey>() == 20 && core::mem::offset_of!(PeerKey, src_port) == 16);

/// A `u16` map key in a word.
#[repr(C, align(8))]
struct Key16(u64);

impl Key16 {
    #[inline(always)]
    fn get(&self) -> &u16 {
        // SAFETY: the first two bytes of the word are its low 16 bits
        // (little-endian), aligned.
        unsafe { &*core::ptr::from_ref(&self.0).cast::<u16>() }
    }
}

/// The slot `index` of the array map at `map` (an `Array` or
/// `PerCpuArray` static: aya's maps are `repr(transparent)` over their
/// definition, whose address the loader relocates).
#[inline(always)]
fn array_slot<T>(map: *const c_void, index: u32) -> Option<*mut T> {
    let key = u64::from(index);
    // SAFETY: `map` is an array map; the key is read as its 4-byte index,
    // the low half of the word (little-endian).
    let p = unsafe { bpf_map_lookup_elem(map.cast_mut(), core::ptr::from_ref(&key).cast()) };
    NonNull::new(p.cast::<T>()).map(NonNull::as_ptr)
}

#[inline(always)]
fn count(counter: u32) {
    if let Some(p) = array_slot::<u64>(addr_of!(LEAP_COUNTERS).cast(), counter) {
        // SAFETY: the pointer is this CPU's slot of a per-CPU array entry;
        // XDP programs do not preempt each other on one CPU.
        unsafe { *p += 1 };
    }
}

/// Counts `counter` and returns `action`.
#[inline(always)]
fn decide(counter: Counter, action: xdp_action::Type) -> u32 {
    count(counter as u32);
    action
}

/// [`L3::verdict`] when the kernel would take the packet.
const NO_VERDICT: u64 = u64::MAX;

/// A UDP datagram to a leap port: where its parts are, who sent it, and
/// what the kernel would think of it. Whole words only (see above).
struct L3 {
    /// Offset of the IP header from the start of the packet.
    l3: usize,
    /// Offset of the UDP header from the start of the packet.
    l4: usize,
    /// Bytes of IP payload, from the IP header.
    ip_payload: usize,
    /// Source address, IPv4 mapped into IPv6.
    src: Addr,
    family: u64,
    sport: u64,
    dport: u64,
    udp_len: u64,
    /// The UDP checksum field.
    udp_check: u64,
    /// The counter of why the kernel's receive path would drop the packet
    /// before any socket saw it, or [`NO_VERDICT`].
    verdict: u64,
}

/// Without the `debug!` events (the programs every node loads): aya-log's
/// record code writes past its buffer on the mispredicted side of its
/// bounds checks, which the 6.1 and 6.12 verifiers explore for a loader
/// without `CAP_PERFMON` and refuse.
#[xdp]
pub fn leap_xdp(ctx: XdpContext) -> u32 {
    try_leap_xdp::<false>(&ctx)
}

#[xdp(frags)]
pub fn leap_xdp_frags(ctx: XdpContext) -> u32 {
    try_leap_xdp::<false>(&ctx)
}

/// With the `debug!` events of `cfg::LOG` (`XdpTransportConfig::log`): needs
/// `CAP_PERFMON` on kernels before 6.17.
#[xdp]
pub fn leap_log(ctx: XdpContext) -> u32 {
    try_leap_xdp::<true>(&ctx)
}

#[xdp(frags)]
pub fn leap_log_frags(ctx: XdpContext) -> u32 {
    try_leap_xdp::<true>(&ctx)
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
fn chunk_header(ctx: &XdpContext, off: usize) -> Option<Leap> {
    load::<2>(ctx, off, CHUNK_HEADER_LEN)
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

/// [`PeerRule`] of a source in a word: its kinds, or every kind when the
/// peer filter is off.
const ANY_KIND: u64 = u64::MAX;

#[inline(always)]
fn try_leap_xdp<const LOG: bool>(ctx: &XdpContext) -> u32 {
    let Some(config) = array_slot::<XdpConfig>(addr_of!(LEAP_CONFIG).cast(), 0) else {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    };
    // SAFETY: a lookup of the one entry of the array map: a valid,
    // aligned `XdpConfig` that lives as long as the program.
    let config = unsafe { &*config };
    if config.delivery == delivery::PASS {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    }
    let log = LOG && config.flags & cfg::LOG != 0;
    // The common layout in one copy; anything else header by header.
    let fast = load::<7>(ctx, 0, FAST_LEN)
        .filter(|f| f.be16(ETH_PROTO) == ETH_P_IP && f.u8(FAST_IP + IP4_VERSION_IHL) == 0x45);
    let parsed = match &fast {
        Some(f) => {
            let l2 = L2 { dst_mac: f.word(0) & MAC_MASK, vlan: NO_VLAN };
            parse_ipv4(ctx, config, &l2, ETH_HLEN, &part3(f, FAST_IP), Some(Words([f.word(FAST_UDP)])))
        }
        None => parse_l3(ctx, config),
    };
    let Some(l3) = parsed else {
        return decide(Counter::Passed, xdp_action::XDP_PASS);
    };
    let (sport, dport) = (l3.sport as u16, l3.dport as u16);
    let rejected = if config.flags & cfg::DROP_REJECTED != 0 { xdp_action::XDP_DROP } else { xdp_action::XDP_PASS };

    let leap_off = l3.l4 + UDP_HDR_LEN;
    let hdr = match &fast {
        Some(f) => Some(Words([f.word(FAST_LEAP), f.word(FAST_LEAP + 8) & 0xFFFF_FFFF])),
        None => chunk_header(ctx, leap_off),
    };
    let Some(hdr) = hdr else {
        return decide(Counter::NotLeap, xdp_action::XDP_PASS);
    };
    if hdr.be32(LEAP_MAGIC_OFF) != LEAP_MAGIC {
        return decide(Counter::NotLeap, xdp_action::XDP_PASS);
    }

    // What the kernel's receive path would drop before any socket sees it.
    if l3.verdict != NO_VERDICT {
        let counter = l3.verdict as u32;
        if log {
            log_not_for_host(ctx, sport, counter);
        }
        count(counter);
        return rejected;
    }

    let udp_len = l3.udp_len as usize;
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
        if log {
            log_malformed_datagram(ctx, udp_len, sport);
        }
        return decide(Counter::Malformed, rejected);
    };

    let rule = if config.flags & cfg::PEER_FILTER != 0 {
        let key = Key20::new(l3.src, sport, dport);
        // SAFETY: plain lookup of a Pod value, read at once.
        unsafe { LEAP_PEERS.get(key.get::<PeerKey>()) }.map_or(0, |r| u64::from(r.kinds))
    } else {
        ANY_KIND
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
                if let Some(counter) = chunk_verdict::<LOG>(ctx, log, h, rule, udp_len, sport) {
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
/// `rule` (a [`PeerRule`]'s kinds, or [`ANY_KIND`]).
#[inline(always)]
fn chunk_verdict<const LOG: bool>(
    ctx: &XdpContext,
    log: bool,
    h: Option<Leap>,
    rule: u64,
    udp_len: usize,
    sport: u16,
) -> Option<Counter> {
    let Some(h) = h else {
        return Some(Counter::Malformed);
    };
    let (chunk_id, total_chunks, reserved) = (h.be16(LEAP_CHUNK_ID), h.be16(LEAP_TOTAL), h.be16(LEAP_RESERVED));
    if h.be32(LEAP_MAGIC_OFF) != LEAP_MAGIC || chunk_id >= total_chunks {
        if LOG && log {
            log_malformed_chunk(ctx, chunk_id, total_chunks, udp_len, sport);
        }
        return Some(Counter::Malformed);
    }
    if rule != ANY_KIND && rule & u64::from(kind_bit(reserved)) == 0 {
        if LOG && log {
            log_wrong_kind(ctx, reserved & 0xF, sport);
        }
        return Some(Counter::WrongSource);
    }
    None
}

// The events of `cfg::LOG`, each in a function of its own (a BPF-to-BPF
// call): aya-log spills pointers to its arguments on the stack, and the
// verifier refuses a loader without `CAP_PERFMON` to write over a spilled
// pointer, which the caller's frame would do when it reuses the slot. Only
// the `leap_log*` programs call them.

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

/// The six bytes of a MAC address at the start of a word.
const MAC_MASK: u64 = 0xFFFF_FFFF_FFFF;

/// A MAC address as one word, its first byte lowest (so bit 0 is the I/G
/// bit), read at constant indices: no `memcmp` call for the BPF linker, no
/// variable stack offset for the verifier.
#[inline(always)]
fn mac_word(m: &[u8; 6]) -> u64 {
    u64::from(m[0])
        | u64::from(m[1]) << 8
        | u64::from(m[2]) << 16
        | u64::from(m[3]) << 24
        | u64::from(m[4]) << 32
        | u64::from(m[5]) << 40
}

/// [`L2::vlan`] of an untagged frame.
const NO_VLAN: u64 = u64::MAX;

/// What [`verdict`] needs of the link layer, in words.
struct L2 {
    /// The destination MAC as [`mac_word`] reads it.
    dst_mac: u64,
    /// The VLAN ID of the tag in the packet, or [`NO_VLAN`].
    vlan: u64,
}

/// Why the kernel would drop a packet before any socket sees it, in the
/// order of the checks: a unicast destination MAC of another host, a VLAN
/// the interface does not carry, a v4-mapped IPv6 source, a destination
/// address that is not ours, a wrong IPv4 header checksum; as the
/// counter's index, or [`NO_VERDICT`]: it would reach a socket. The
/// destination lookup runs only for leap ports.
#[inline(always)]
fn verdict(config: &XdpConfig, l2: &L2, mapped_src: bool, dst: &Key20, ip_csum_ok: bool) -> u64 {
    let local_only = config.flags & cfg::LOCAL_ONLY != 0;
    if local_only {
        // Group addresses (broadcast, multicast) have the I/G bit set; the
        // kernel takes them (PACKET_BROADCAST/MULTICAST) and then routes by
        // the destination address, checked below.
        if l2.dst_mac & 1 == 0 && l2.dst_mac != mac_word(&config.mac) {
            return Counter::ForeignMac as u64;
        }
        // VLAN 0 only carries a priority: the kernel takes such a frame as
        // untagged.
        if l2.vlan != NO_VLAN && l2.vlan != 0 {
            let vid = Key16(l2.vlan);
            // SAFETY: plain lookup of a Pod value; the reference does not
            // outlive this statement.
            if unsafe { LEAP_VLANS.get(vid.get()) }.is_none() {
                return Counter::ForeignVlan as u64;
            }
        }
    }
    if mapped_src {
        return Counter::MappedSource as u64;
    }
    // SAFETY: as above.
    if local_only && unsafe { LEAP_LOCAL_ADDRS.get(dst.get::<LocalAddr>()) }.is_none() {
        return Counter::ForeignDst as u64;
    }
    if !ip_csum_ok {
        return Counter::BadIpChecksum as u64;
    }
    NO_VERDICT
}

/// Whether the UDP header `u` goes to a leap port.
#[inline(always)]
fn to_leap_port(u: &Udp) -> bool {
    let dport = Key16(u64::from(u.be16(UDP_DPORT)));
    // SAFETY: plain lookup of a Pod value; the reference does not outlive
    // this statement.
    unsafe { LEAP_PORTS.get(dport.get()) }.is_some_and(|r| r.enabled != 0)
}

/// The ones'-complement sum of the four 16-bit words of `x` (not folded).
#[inline(always)]
const fn sum64(x: u64) -> u32 {
    ((x >> 48) as u32) + ((x >> 32) as u32 & 0xFFFF) + ((x >> 16) as u32 & 0xFFFF) + (x as u32 & 0xFFFF)
}

/// The ones'-complement sum of the 20 bytes of an IPv4 header without
/// options (not folded).
#[inline(always)]
fn ipv4_fixed_sum(ip: &Ip4) -> u32 {
    let w = |i: usize| ip.be16(i) as u32;
    w(0) + w(2) + w(4) + w(6) + w(8) + w(10) + w(12) + w(14) + w(16) + w(18)
}

/// The ones'-complement sum of the options of an IPv4 header of `ihl`
/// bytes (24..=60) at `off`, or `None` when the packet ends inside them.
/// They are copied into a zeroed buffer of the largest size, and the whole
/// buffer is summed at constant offsets: the zeros past the options add
/// nothing.
#[inline(always)]
fn ipv4_options_sum(ctx: &XdpContext, off: usize, ihl: usize) -> Option<u32> {
    const OPTIONS_MAX: usize = IPV4_HLEN_MAX - IPV4_HLEN;
    let mut opts = zeroed::<{ OPTIONS_MAX / 8 }>();
    // Clamped right before the call, in a form the verifier follows (as in
    // `ring_record`): 1..=40 bytes. The caller checked the range already.
    let len = u64::from((ihl - IPV4_HLEN) as u32);
    // SAFETY: reads a local variable.
    let len = unsafe { core::ptr::read_volatile(&len) };
    if len == 0 {
        return Some(0);
    }
    let mut len = ((len - 1) & 0x3F) + 1;
    if len > OPTIONS_MAX as u64 {
        len = OPTIONS_MAX as u64;
    }
    // SAFETY: `opts` is 40 writable bytes on the stack and `len` is at most
    // 40; the helper bounds-checks the packet offset.
    let r = unsafe { bpf_xdp_load_bytes(ctx.ctx, (off + IPV4_HLEN) as u32, opts.as_mut_ptr().cast(), len as u32) };
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

/// Ethernet (+ one VLAN tag), IPv4/IPv6 and a UDP header to a leap port;
/// `None` for anything else.
#[inline(always)]
fn parse_l3(ctx: &XdpContext, config: &XdpConfig) -> Option<L3> {
    // Any LEAP datagram is longer than 18 bytes: a shorter packet is not
    // one, whatever it is.
    let head: Eth = load::<3>(ctx, 0, ETH_VLAN_LEN)?;
    let mut off = ETH_HLEN;
    let mut proto = head.be16(ETH_PROTO);
    let mut l2 = L2 { dst_mac: head.word(0) & MAC_MASK, vlan: NO_VLAN };
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        l2.vlan = u64::from(head.be16(VLAN_TCI) & VLAN_VID_MASK);
        proto = head.be16(VLAN_PROTO);
        off += VLAN_HLEN;
    }
    match proto {
        ETH_P_IP => parse_ipv4(ctx, config, &l2, off, &load::<3>(ctx, off, IPV4_HLEN)?, None),
        ETH_P_IPV6 => {
            let ip: Ip6 = load::<5>(ctx, off, IPV6_HLEN)?;
            // Extension headers (fragments among them) are not walked.
            if ip.u8(IP6_VTC_FLOW) >> 4 != 6 || ip.u8(IP6_NEXT_HDR) != IPPROTO_UDP {
                return None;
            }
            let l4 = off + IPV6_HLEN;
            let udp: Udp = load::<1>(ctx, l4, UDP_HDR_LEN)?;
            if !to_leap_port(&udp) {
                return None;
            }
            let src = ip6_addr(&ip, IP6_SADDR);
            let dst = Key20::new(ip6_addr(&ip, IPV6_DADDR_OFF), FAMILY_V6, 0);
            Some(L3 {
                l3: off,
                l4,
                ip_payload: usize::from(ip.be16(IP6_PAYLOAD_LEN)),
                src,
                family: u64::from(FAMILY_V6),
                sport: u64::from(udp.be16(UDP_SPORT)),
                dport: u64::from(udp.be16(UDP_DPORT)),
                udp_len: u64::from(udp.be16(UDP_LEN)),
                udp_check: u64::from(udp.be16(UDP_CHECK)),
                verdict: verdict(config, &l2, is_mapped(&src), &dst, true),
            })
        }
        _ => None,
    }
}

/// The IPv4 header `ip` at `off` (after the link layer `l2`) and the UDP
/// header after it (`udp`, when the caller has read it already) to a leap
/// port; `None` for anything else.
#[inline(always)]
fn parse_ipv4(ctx: &XdpContext, config: &XdpConfig, l2: &L2, off: usize, ip: &Ip4, udp: Option<Udp>) -> Option<L3> {
    let version_ihl = ip.u8(IP4_VERSION_IHL);
    let ihl = usize::from(version_ihl & 0x0F) * 4;
    if version_ihl >> 4 != 4 || ihl < IPV4_HLEN || ip.u8(IP4_PROTO) != IPPROTO_UDP {
        return None;
    }
    // A fragment: the UDP header and payload are not all here.
    if ip.be16(IP4_FRAG_OFF) & IP_MF_OFFSET != 0 {
        return None;
    }
    let tot_len = usize::from(ip.be16(IP4_TOT_LEN));
    if tot_len < ihl {
        return None;
    }
    let mut sum = ipv4_fixed_sum(ip);
    if ihl > IPV4_HLEN {
        // The packet ends inside the options: no UDP header either.
        sum += ipv4_options_sum(ctx, off, ihl)?;
    }
    let udp: Udp = match udp {
        Some(u) => u,
        None => load::<1>(ctx, off + ihl, UDP_HDR_LEN)?,
    };
    if !to_leap_port(&udp) {
        return None;
    }
    let dst = Key20::new(ip4_mapped(ip, IPV4_DADDR_OFF), FAMILY_V4, 0);
    Some(L3 {
        l3: off,
        l4: off + ihl,
        ip_payload: tot_len - ihl,
        src: ip4_mapped(ip, IP4_SADDR),
        family: u64::from(FAMILY_V4),
        sport: u64::from(udp.be16(UDP_SPORT)),
        dport: u64::from(udp.be16(UDP_DPORT)),
        udp_len: u64::from(udp.be16(UDP_LEN)),
        udp_check: u64::from(udp.be16(UDP_CHECK)),
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
    // SAFETY: this CPU's slot of a per-CPU array entry, read at once.
    let nth = array_slot::<u64>(addr_of!(LEAP_COUNTERS).cast(), Counter::ToRingBuf as u32).map_or(0, |p| unsafe { *p });
    let periodic = every <= 1 || (nth + 1) % every == 0;
    // Unrolled as the header checks are (see `try_leap_xdp`).
    macro_rules! record {
        ($i:literal) => {
            if $i < chunks {
                let len = if $i + 1 == chunks { Datagram::Last(last) } else { Datagram::Full };
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

/// The length of one chunk of a train.
#[derive(Clone, Copy)]
enum Datagram {
    /// A full chunk, `CHUNK_DATAGRAM_MAX` bytes.
    Full,
    /// The last chunk, of this many bytes (12..=`CHUNK_DATAGRAM_MAX`).
    Last(usize),
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
fn ring_record(ctx: &XdpContext, l3: &L3, off: usize, datagram: Datagram, train: u16, periodic: bool) -> RingOutcome {
    let Some(mut entry) = LEAP_RING.reserve::<RingRecord>(0) else {
        return RingOutcome::Full;
    };
    let rec = entry.as_mut_ptr();
    let len = match datagram {
        // A constant: no bound to check. Through the clamp below, the
        // verifier would know the outcome of its test and, for a loader
        // without `CAP_PERFMON`, walk the mispredicted side with the length
        // unknown.
        Datagram::Full => CHUNK_DATAGRAM_MAX as u64,
        Datagram::Last(len) => {
            // Clamped right before the call, in a form the verifier can
            // follow (a mask, then a bound on the same register): 1..=1412
            // bytes. The caller checked the range already, so neither
            // changes the value; the volatile read keeps the compiler from
            // dropping them for that reason.
            let len = len as u64;
            // SAFETY: reads a local variable.
            let len = unsafe { core::ptr::read_volatile(&len) };
            if len == 0 {
                entry.discard(0);
                return RingOutcome::Failed;
            }
            // `(len - 1) & mask + 1` has a minimum of 1 the verifier can
            // see: the 6.1 verifier does not learn it from the `len == 0`
            // test above and rejects a possibly empty copy. Then bound it
            // from above.
            let mut len = ((len - 1) & 0x7FF) + 1;
            if len > CHUNK_DATAGRAM_MAX as u64 {
                len = CHUNK_DATAGRAM_MAX as u64;
            }
            len
        }
    };
    // SAFETY: `rec` points to a reserved, writable ring-buffer record of
    // `size_of::<RingRecord>()` bytes; `data` has room for 1412 bytes and
    // `len` is at most 1412; the helper bounds-checks the packet offset.
    let copied = unsafe { bpf_xdp_load_bytes(ctx.ctx, off as u32, addr_of_mut!((*rec).data).cast(), len as u32) };
    if copied != 0 {
        entry.discard(0);
        return RingOutcome::Failed;
    }
    // The destination address, straight from the packet into the record.
    // SAFETY: `dst_addr` is 16 writable bytes of the reserved record, at
    // offset 24 of a record the ring buffer places at a multiple of 8 (so
    // the word stores are aligned); the lengths are constants within it;
    // the helper bounds-checks the packet.
    let copied = unsafe {
        let dst = addr_of_mut!((*rec).dst_addr).cast::<u8>();
        if l3.family == u64::from(FAMILY_V4) {
            // `::ffff:` in two stores (a byte array would be a `memset`
            // call with a variable offset): bytes 0..8 zero, 8..12 0 0 ff ff.
            dst.cast::<u64>().write(0);
            dst.add(8).cast::<u32>().write(0xFFFF_0000);
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
    // Read in place, field by field: no copy on the stack.
    let (chunk_id, total_chunks, reserved) = unsafe {
        let d = addr_of!((*rec).data).cast::<u8>();
        let be16 = |i: usize| u16::from(d.add(i).read()) << 8 | u16::from(d.add(i + 1).read());
        (be16(LEAP_CHUNK_ID), be16(LEAP_TOTAL), be16(LEAP_RESERVED))
    };
    let urgent = chunk_id.wrapping_add(1) == total_chunks || is_urgent(reserved);
    // SAFETY: as above; plain stores of integer fields into the record.
    unsafe {
        addr_of_mut!((*rec).len).write(len as u16);
        addr_of_mut!((*rec).src_port).write(l3.sport as u16);
        addr_of_mut!((*rec).dst_port).write(l3.dport as u16);
        addr_of_mut!((*rec).family).write(l3.family as u16);
        let src = addr_of_mut!((*rec).src_addr).cast::<u64>();
        src.write_unaligned(l3.src[0]);
        src.add(1).write_unaligned(l3.src[1]);
        addr_of_mut!((*rec).rx_queue).write(ctx.rx_queue_index());
        addr_of_mut!((*rec).udp_check).write(l3.udp_check as u16);
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
// `ring_record` stores `::ffff:` into `dst_addr` as aligned words.
const _: () = assert!(core::mem::offset_of!(RingRecord, dst_addr) == 24);
