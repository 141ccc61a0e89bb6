//! Finding the UDP payload and its sender in an Ethernet frame handed over by
//! AF_XDP, or in a record of the BPF ring buffer, and checking both as the
//! kernel's receive path would. The XDP program checked most of it already;
//! this checks again, because user space must not trust memory the kernel
//! shares, and it alone checks UDP checksums.
//!
//! # UDP checksums and `CHECKSUM_PARTIAL`
//!
//! A sender whose device offloads checksums (veth among them) leaves only
//! the folded pseudo-header sum in the UDP checksum field; the device would
//! fill in the rest. A veth peer hands such a packet over as it is, and the
//! kernel's own stack trusts it because of the `skb`'s `CHECKSUM_PARTIAL`
//! mark, which XDP does not see. So a field equal to the pseudo-header sum
//! is "partial" ([`UdpChecksum::Partial`]): accepted only when the
//! [`RxFilter`] allows it ([`RxFilter::partial_checksums`], on for veth,
//! where no wire sits between sender and receiver), refused otherwise (a
//! physical NIC never receives one from a correct sender). The hole this
//! leaves on veth: a packet whose payload is corrupted after the sender
//! wrote a partial sum is not caught, and anyone who can inject frames may
//! skip computing a checksum. Neither is new: a checksum is no
//! authentication, and on veth nothing corrupts bytes between the two ends.
//! A zero checksum on IPv4 means "none" (accepted, as by the kernel); on
//! IPv6 it is invalid.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use leap_common::xdp::wire::{
    ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IP_MF_OFFSET, IPPROTO_UDP, IPV4_HLEN, IPV6_HLEN,
    UDP_HLEN, VLAN_HLEN, VLAN_VID_MASK,
};
use leap_common::xdp::{FAMILY_V4, FAMILY_V6, RingRecord, is_v4_mapped};

use crate::transport::Drops;

/// Why a frame or a ring-buffer record was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reject {
    /// Not Ethernet + IPv4/IPv6 + UDP, an IP fragment, IPv6 extension
    /// headers, or lengths that do not add up.
    #[error("not a complete UDP datagram")]
    NotUdp,
    /// A unicast destination MAC of another host (`PACKET_OTHERHOST`).
    #[error("destination MAC of another host")]
    ForeignMac,
    /// A VLAN tag the interface is not configured for.
    #[error("VLAN not configured")]
    ForeignVlan,
    /// An IPv6 source `::ffff:a.b.c.d`.
    #[error("v4-mapped IPv6 source")]
    MappedSource,
    /// A destination address that is not this host's.
    #[error("destination address not local")]
    ForeignDst,
    /// The IPv4 header checksum is wrong.
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// The UDP checksum is wrong (or zero on IPv6, or partial where that is
    /// not allowed).
    #[error("bad UDP checksum")]
    BadUdpChecksum,
}

impl Reject {
    /// Counts the refusal in the drop counter of its reason.
    pub fn count(self, drops: &mut Drops) {
        match self {
            Self::NotUdp => drops.short += 1,
            Self::ForeignMac => drops.foreign_mac += 1,
            Self::ForeignVlan => drops.foreign_vlan += 1,
            Self::MappedSource => drops.mapped_source += 1,
            Self::ForeignDst => drops.foreign_dst += 1,
            Self::BadIpChecksum => drops.bad_ip_checksum += 1,
            Self::BadUdpChecksum => drops.bad_udp_checksum += 1,
        }
    }
}

/// What the UDP checksum field said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpChecksum {
    /// A complete checksum, and it is right.
    Valid,
    /// Zero on IPv4: the sender computed none.
    Absent,
    /// Only the pseudo-header sum (a `CHECKSUM_PARTIAL` sender on veth).
    Partial,
    /// Not summed: the datagram holds chunks of a leap frame that carries
    /// its CRC32C and is kept for NACKs ([`frame_checks_itself`]).
    Unchecked,
}

/// Whether a UDP payload is a chunk (or a train) of a frame between leap
/// nodes that checks itself: a data or control chunk flagged `LEAP`,
/// `CRC` and `RELIABLE`. Summing its UDP checksum in software would buy
/// nothing: a chunk corrupted on the way fails the frame's CRC32C, which
/// is checked before delivery, and is fetched again with a NACK. Hellos,
/// NACKs, best-effort frames and every datagram of an original peer keep
/// the check. A header damaged into these flags costs at most a refetch.
///
/// Every chunk of a keyed ring (`LEAP` and `AUTH`: data, control, NACK,
/// retransmission) checks itself too, each alone: a keyed node verifies its
/// tag before anything else looks at it, and a bit flipped on the way fails
/// the tag (counted as `bad_tag`, fetched again like a lost chunk); at an
/// unkeyed node it is refused unread.
pub fn frame_checks_itself(payload: &[u8]) -> bool {
    use leap_common::chunk::{CHUNK_DATAGRAM_MAX, ChunkHeader, flags};
    // A train's first chunk speaks for it.
    let first = payload.get(..CHUNK_DATAGRAM_MAX).unwrap_or(payload);
    ChunkHeader::parse(first).is_ok_and(|(h, _)| {
        h.has(flags::AUTH) || (h.has(flags::CRC | flags::RELIABLE) && h.reserved & flags::KIND_MASK <= 1)
    })
}

/// A UDP datagram found in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// Who sent it.
    pub src: SocketAddr,
    /// The destination address and port.
    pub dst: SocketAddr,
    /// The destination MAC address.
    pub dst_mac: [u8; 6],
    /// The VLAN ID of its tag, if it had one.
    pub vlan: Option<u16>,
    /// What its checksum field said (wrong ones are refused by [`parse_udp`]).
    pub checksum: UdpChecksum,
    /// The UDP payload (exactly the UDP length minus 8).
    pub payload: &'a [u8],
}

impl UdpDatagram<'_> {
    /// The destination port.
    pub fn dst_port(&self) -> u16 {
        self.dst.port()
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Adds `bytes` as big-endian 16-bit words (an odd last byte padded with
/// zero) to a ones'-complement sum.
fn sum16(acc: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(2);
    let mut acc = words.by_ref().fold(acc, |a, w| a + u64::from(u16::from_be_bytes([w[0], w[1]])));
    if let [last] = words.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Folds a ones'-complement sum into 16 bits.
fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc as u16
}

/// Whether an IPv4 header (all `ihl` bytes, options included) sums to
/// 0xFFFF, as the kernel's `ip_fast_csum` checks.
pub fn ipv4_header_checksum_ok(header: &[u8]) -> bool {
    fold(sum16(0, header)) == 0xFFFF
}

/// The folded UDP pseudo-header sum (addresses, protocol, UDP length):
/// what a `CHECKSUM_PARTIAL` sender leaves in the checksum field.
fn pseudo_header_sum(src: IpAddr, dst: IpAddr, udp_len: usize) -> u64 {
    let acc = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => sum16(sum16(0, &s.octets()), &d.octets()),
        (s, d) => sum16(sum16(0, &v6_octets(s)), &v6_octets(d)),
    };
    acc + u64::from(IPPROTO_UDP) + udp_len as u64
}

fn v6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Classifies the UDP checksum of a datagram from `src` to `dst` whose
/// header is `udp` (8 bytes, checksum field included) and payload
/// `payload`; `None` when it is wrong.
pub fn udp_checksum(src: IpAddr, dst: IpAddr, udp: &[u8; UDP_HLEN], payload: &[u8]) -> Option<UdpChecksum> {
    let check = u16::from_be_bytes([udp[6], udp[7]]);
    if check == 0 {
        return src.is_ipv4().then_some(UdpChecksum::Absent);
    }
    let pseudo = pseudo_header_sum(src, dst, UDP_HLEN + payload.len());
    if fold(sum16(sum16(pseudo, udp), payload)) == 0xFFFF {
        return Some(UdpChecksum::Valid);
    }
    (check == fold(pseudo)).then_some(UdpChecksum::Partial)
}

/// Parses Ethernet (one VLAN tag), IPv4 without fragments or IPv6 without
/// extension headers, and UDP, and checks what the kernel checks without
/// knowing the host: the IPv4 header checksum, the UDP checksum (a partial
/// one is returned as such for [`RxFilter`] to judge; none for a chunk of a
/// frame that checks itself, [`frame_checks_itself`]), no v4-mapped IPv6
/// source.
///
/// # Errors
///
/// The [`Reject`] reason.
pub fn parse_udp(frame: &[u8]) -> Result<UdpDatagram<'_>, Reject> {
    let not_udp = Reject::NotUdp;
    let mut off = ETH_HLEN;
    let mut proto = be16(frame, 12).ok_or(not_udp)?;
    let mut dst_mac = [0u8; 6];
    dst_mac.copy_from_slice(frame.get(..6).ok_or(not_udp)?);
    let mut vlan = None;
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        vlan = Some(be16(frame, off).ok_or(not_udp)? & VLAN_VID_MASK);
        proto = be16(frame, off + 2).ok_or(not_udp)?;
        off += VLAN_HLEN;
    }
    let (src_ip, dst_ip, l4, ip_payload) = match proto {
        ETH_P_IP => {
            let ip = frame.get(off..off + IPV4_HLEN).ok_or(not_udp)?;
            let ihl = usize::from(ip[0] & 0x0F) * 4;
            if ip[0] >> 4 != 4
                || ihl < IPV4_HLEN
                || ip[9] != IPPROTO_UDP
                || be16(ip, 6).ok_or(not_udp)? & IP_MF_OFFSET != 0
            {
                return Err(not_udp);
            }
            let tot = usize::from(be16(ip, 2).ok_or(not_udp)?);
            let header = frame.get(off..off + ihl).ok_or(not_udp)?;
            if !ipv4_header_checksum_ok(header) {
                return Err(Reject::BadIpChecksum);
            }
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            (IpAddr::V4(src), IpAddr::V4(dst), off + ihl, tot.checked_sub(ihl).ok_or(not_udp)?)
        }
        ETH_P_IPV6 => {
            let ip = frame.get(off..off + IPV6_HLEN).ok_or(not_udp)?;
            if ip[0] >> 4 != 6 || ip[6] != IPPROTO_UDP {
                return Err(not_udp);
            }
            let mut src = [0u8; 16];
            src.copy_from_slice(&ip[8..24]);
            if is_v4_mapped(&src) {
                return Err(Reject::MappedSource);
            }
            let mut dst = [0u8; 16];
            dst.copy_from_slice(&ip[24..40]);
            let len = usize::from(be16(ip, 4).ok_or(not_udp)?);
            (IpAddr::V6(Ipv6Addr::from(src)), IpAddr::V6(Ipv6Addr::from(dst)), off + IPV6_HLEN, len)
        }
        _ => return Err(not_udp),
    };
    let udp: &[u8; UDP_HLEN] = frame.get(l4..l4 + UDP_HLEN).and_then(|u| u.try_into().ok()).ok_or(not_udp)?;
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if udp_len < UDP_HLEN || udp_len != ip_payload {
        return Err(not_udp);
    }
    let payload = frame.get(l4 + UDP_HLEN..l4 + udp_len).ok_or(not_udp)?;
    let checksum = if frame_checks_itself(payload) {
        UdpChecksum::Unchecked
    } else {
        udp_checksum(src_ip, dst_ip, udp, payload).ok_or(Reject::BadUdpChecksum)?
    };
    Ok(UdpDatagram {
        src: SocketAddr::new(src_ip, u16::from_be_bytes([udp[0], udp[1]])),
        dst: SocketAddr::new(dst_ip, u16::from_be_bytes([udp[2], udp[3]])),
        dst_mac,
        vlan,
        checksum,
        payload,
    })
}

/// What this host accepts, as its kernel would: the receiving interface's
/// MAC, its VLANs, the local addresses, and whether partial UDP checksums
/// can be legitimate on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RxFilter {
    /// The interface's MAC: the only unicast destination MAC accepted
    /// (group addresses pass). `None`: any.
    pub mac: Option<[u8; 6]>,
    /// The destination addresses accepted. `None`: any.
    pub local: Option<Vec<IpAddr>>,
    /// VLAN IDs a tagged frame may carry; untagged frames (and
    /// priority-tagged ones, VLAN 0) always pass.
    pub vlans: Vec<u16>,
    /// Whether a UDP checksum field holding only the pseudo-header sum is
    /// accepted (see the module documentation).
    pub partial_checksums: bool,
}

impl RxFilter {
    /// [`parse_udp`], then whether the datagram is for this host.
    ///
    /// # Errors
    ///
    /// The [`Reject`] reason.
    pub fn admit_frame<'a>(&self, frame: &'a [u8]) -> Result<UdpDatagram<'a>, Reject> {
        let d = parse_udp(frame)?;
        if let Some(mac) = self.mac
            && d.dst_mac[0] & 1 == 0
            && d.dst_mac != mac
        {
            return Err(Reject::ForeignMac);
        }
        // VLAN 0 only carries a priority: the kernel takes it as untagged.
        if let Some(vid) = d.vlan
            && vid != 0
            && !self.vlans.contains(&vid)
        {
            return Err(Reject::ForeignVlan);
        }
        self.admit_destination(d.dst.ip())?;
        if d.checksum == UdpChecksum::Partial && !self.partial_checksums {
            return Err(Reject::BadUdpChecksum);
        }
        Ok(d)
    }

    /// Checks a ring-buffer record as [`Self::admit_frame`] checks a frame,
    /// except for the MAC and VLAN, which the record does not carry (the
    /// program checked them); returns the sender and the UDP payload.
    ///
    /// # Errors
    ///
    /// The [`Reject`] reason.
    pub fn admit_record<'a>(&self, rec: &'a RingRecord) -> Result<(SocketAddr, &'a [u8]), Reject> {
        let payload = rec.datagram().ok_or(Reject::NotUdp)?;
        self.admit_payload(rec, payload).map(|src| (src, payload))
    }

    /// [`Self::admit_record`] for a UDP payload gathered from several
    /// records (a chunk train, see [`RingRecord::train`]): `rec` is any of
    /// them (they share addresses, ports and the checksum field), and the
    /// checksum is checked over the whole `payload`. Returns the sender.
    ///
    /// # Errors
    ///
    /// The [`Reject`] reason.
    pub fn admit_payload(&self, rec: &RingRecord, payload: &[u8]) -> Result<SocketAddr, Reject> {
        match rec.family {
            FAMILY_V6 if is_v4_mapped(&rec.src_addr) => return Err(Reject::MappedSource),
            FAMILY_V6 => {}
            FAMILY_V4 if is_v4_mapped(&rec.src_addr) && is_v4_mapped(&rec.dst_addr) => {}
            _ => return Err(Reject::NotUdp),
        }
        let (src, dst) = (rec.source(), rec.destination());
        self.admit_destination(dst)?;
        if frame_checks_itself(payload) {
            return Ok(src);
        }
        let mut udp = [0u8; UDP_HLEN];
        udp[0..2].copy_from_slice(&rec.src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&rec.dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&((UDP_HLEN + payload.len()) as u16).to_be_bytes());
        udp[6..8].copy_from_slice(&rec.udp_check.to_be_bytes());
        match udp_checksum(src.ip(), dst, &udp, payload) {
            None => Err(Reject::BadUdpChecksum),
            Some(UdpChecksum::Partial) if !self.partial_checksums => Err(Reject::BadUdpChecksum),
            Some(_) => Ok(src),
        }
    }

    fn admit_destination(&self, dst: IpAddr) -> Result<(), Reject> {
        match &self.local {
            Some(local) if !local.contains(&dst) => Err(Reject::ForeignDst),
            _ => Ok(()),
        }
    }
}

/// How [`FrameSpec::build`] fills the UDP checksum field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChecksumFill {
    /// The complete checksum.
    #[default]
    Full,
    /// Only the pseudo-header sum, as a `CHECKSUM_PARTIAL` sender leaves it.
    Partial,
    /// Zero ("none" on IPv4, invalid on IPv6).
    Zero,
}

/// An Ethernet + IP + UDP frame to build: the inverse of [`parse_udp`],
/// with correct lengths and IPv4 header checksum, to craft packets for
/// tests and for injection into namespaces a test created. The frame is
/// IPv6 when either address is (an IPv4 one then becomes `::ffff:a.b.c.d`).
#[derive(Clone, Debug)]
pub struct FrameSpec<'a> {
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// An 802.1Q tag with this VLAN ID.
    pub vlan: Option<u16>,
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// The UDP checksum field.
    pub checksum: ChecksumFill,
    /// The UDP payload.
    pub payload: &'a [u8],
}

impl FrameSpec<'_> {
    /// The frame's bytes.
    ///
    /// # Panics
    ///
    /// When the payload does not fit in one IP packet (more than 65 487
    /// bytes).
    pub fn build(&self) -> Vec<u8> {
        let udp_len = UDP_HLEN + self.payload.len();
        let udp_len16 = u16::try_from(udp_len).ok().filter(|&l| usize::from(l) + IPV6_HLEN <= 65_535);
        let udp_len16 = udp_len16.expect("payload too large for one IP packet");
        let (src, dst) = match (self.src.ip(), self.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (IpAddr::V4(s), IpAddr::V4(d)),
            (s, d) => (IpAddr::V6(Ipv6Addr::from(v6_octets(s))), IpAddr::V6(Ipv6Addr::from(v6_octets(d)))),
        };
        let mut f = Vec::with_capacity(ETH_HLEN + VLAN_HLEN + IPV6_HLEN + udp_len);
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        if let Some(vid) = self.vlan {
            f.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
            f.extend_from_slice(&(vid & VLAN_VID_MASK).to_be_bytes());
        }
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&ETH_P_IP.to_be_bytes());
                let ip_at = f.len();
                let tot = (IPV4_HLEN + udp_len) as u16;
                f.extend_from_slice(&[0x45, 0]);
                f.extend_from_slice(&tot.to_be_bytes());
                f.extend_from_slice(&[0, 0, 0x40, 0, 64, IPPROTO_UDP, 0, 0]);
                f.extend_from_slice(&s.octets());
                f.extend_from_slice(&d.octets());
                let check = !fold(sum16(0, &f[ip_at..]));
                f[ip_at + 10..ip_at + 12].copy_from_slice(&check.to_be_bytes());
            }
            (s, d) => {
                f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
                f.extend_from_slice(&[0x60, 0, 0, 0]);
                f.extend_from_slice(&udp_len16.to_be_bytes());
                f.extend_from_slice(&[IPPROTO_UDP, 64]);
                f.extend_from_slice(&v6_octets(s));
                f.extend_from_slice(&v6_octets(d));
            }
        }
        let mut udp = [0u8; UDP_HLEN];
        udp[0..2].copy_from_slice(&self.src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&self.dst.port().to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len16.to_be_bytes());
        let pseudo = pseudo_header_sum(src, dst, udp_len);
        let check = match self.checksum {
            ChecksumFill::Zero => 0,
            ChecksumFill::Partial => fold(pseudo),
            ChecksumFill::Full => match !fold(sum16(sum16(pseudo, &udp), self.payload)) {
                // A computed zero goes on the wire as all ones (RFC 768).
                0 => 0xFFFF,
                c => c,
            },
        };
        udp[6..8].copy_from_slice(&check.to_be_bytes());
        f.extend_from_slice(&udp);
        f.extend_from_slice(self.payload);
        f
    }
}

#[cfg(test)]
mod tests {
    use leap_common::xdp::v4_mapped;

    use super::*;

    const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

    fn spec(payload: &[u8]) -> FrameSpec<'_> {
        FrameSpec {
            src_mac: [0x02, 0, 0, 0, 0, 0x02],
            dst_mac: HOST_MAC,
            vlan: None,
            src: "10.0.0.1:4000".parse().unwrap(),
            dst: "10.0.0.2:9999".parse().unwrap(),
            checksum: ChecksumFill::Full,
            payload,
        }
    }

    fn v6_spec(payload: &[u8]) -> FrameSpec<'_> {
        FrameSpec { src: "[fd00::1]:5000".parse().unwrap(), dst: "[fd00::2]:9999".parse().unwrap(), ..spec(payload) }
    }

    /// This host: its MAC, 10.0.0.2 and fd00::2, VLAN 5, no partial sums.
    fn host() -> RxFilter {
        RxFilter {
            mac: Some(HOST_MAC),
            local: Some(vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()]),
            vlans: vec![5],
            partial_checksums: false,
        }
    }

    /// Offset of the UDP payload in an untagged IPv4 frame.
    const V4_PAYLOAD: usize = 14 + 20 + 8;

    #[test]
    fn finds_the_payload_and_sender() {
        for vlan in [None, Some(5)] {
            let f = FrameSpec { vlan, ..spec(b"LEAPxx") }.build();
            let d = parse_udp(&f).unwrap();
            assert_eq!(d.src, "10.0.0.1:4000".parse().unwrap());
            assert_eq!(d.dst, "10.0.0.2:9999".parse().unwrap());
            assert_eq!((d.dst_mac, d.vlan, d.checksum), (HOST_MAC, vlan, UdpChecksum::Valid));
            assert_eq!(d.payload, b"LEAPxx");
            assert_eq!(host().admit_frame(&f), Ok(d));
        }
    }

    #[test]
    fn ethernet_padding_is_not_payload() {
        let mut f = spec(b"ab").build();
        f.extend_from_slice(&[0; 16]);
        assert_eq!(parse_udp(&f).unwrap().payload, b"ab");
    }

    #[test]
    fn fragments_and_bad_lengths_are_refused() {
        let mut f = spec(b"abcd").build();
        f[14 + 6] |= 0x20; // more fragments (checksum now wrong too: either refuses)
        assert!(parse_udp(&f).is_err());
        let mut f = spec(b"abcd").build();
        f[14 + 20 + 5] += 1; // UDP length one too long
        assert_eq!(parse_udp(&f), Err(Reject::NotUdp));
        let f = spec(b"abcd").build();
        assert_eq!(parse_udp(&f[..f.len() - 1]), Err(Reject::NotUdp));
    }

    #[test]
    fn ipv6_is_parsed() {
        let f = v6_spec(b"LEAP").build();
        let d = parse_udp(&f).unwrap();
        assert_eq!(d.src, "[fd00::1]:5000".parse().unwrap());
        assert_eq!((d.payload, d.checksum), (&b"LEAP"[..], UdpChecksum::Valid));
        assert!(host().admit_frame(&f).is_ok());
    }

    #[test]
    fn bad_ipv4_header_checksum_is_refused() {
        let mut f = spec(b"LEAP").build();
        f[14 + 8] -= 1; // TTL changed, checksum not
        assert_eq!(parse_udp(&f), Err(Reject::BadIpChecksum));
        let mut f = spec(b"LEAP").build();
        f[14 + 10] ^= 0x01; // the checksum itself
        assert_eq!(parse_udp(&f), Err(Reject::BadIpChecksum));
    }

    #[test]
    fn ipv4_options_are_summed_too() {
        let mut f = spec(b"LEAP").build();
        // Four NOP options: IHL 6, total length + 4, checksum recomputed.
        f.splice(14 + 20..14 + 20, [1u8; 4]);
        f[14] = 0x46;
        let tot = u16::from_be_bytes([f[16], f[17]]) + 4;
        f[16..18].copy_from_slice(&tot.to_be_bytes());
        f[24..26].copy_from_slice(&[0, 0]);
        let check = !fold(sum16(0, &f[14..14 + 24]));
        f[24..26].copy_from_slice(&check.to_be_bytes());
        assert_eq!(parse_udp(&f).map(|d| d.payload), Ok(&b"LEAP"[..]));
        f[14 + 21] = 0; // an option byte changed
        assert_eq!(parse_udp(&f), Err(Reject::BadIpChecksum));
    }

    #[test]
    fn changed_payload_with_the_old_udp_checksum_is_refused() {
        for s in [spec(b"LEAP-chunk-payload"), v6_spec(b"LEAP-chunk-payload")] {
            let mut f = s.build();
            let last = f.len() - 1;
            f[last] ^= 0x40;
            assert_eq!(parse_udp(&f), Err(Reject::BadUdpChecksum), "{:?}", s.dst);
            assert_eq!(host().admit_frame(&f), Err(Reject::BadUdpChecksum));
        }
        // The same with the LEAP header intact but one payload byte off.
        let mut f = spec(&[7u8; 40]).build();
        f[V4_PAYLOAD + 20] = 8;
        assert_eq!(parse_udp(&f), Err(Reject::BadUdpChecksum));
    }

    #[test]
    fn a_reliable_crc_frame_chunk_skips_the_udp_checksum_and_nothing_else_does() {
        use leap_common::chunk::{ChunkHeader, flags};
        let chunk = |reserved: u16| {
            let mut c = ChunkHeader { seq: 1, chunk_id: 0, total_chunks: 1, reserved }.to_bytes().to_vec();
            c.extend_from_slice(&[5u8; 64]);
            c
        };
        let leap = flags::LEAP | flags::CRC | flags::RELIABLE;
        for (reserved, skipped) in [
            (leap, true),
            (leap | 1, true),                                    // control
            (leap | flags::RETRANSMIT, true),                    // a resent chunk
            (leap | 2, false),                                   // a NACK
            (flags::LEAP | flags::RELIABLE, false),              // no CRC
            (flags::LEAP | flags::CRC, false),                   // best effort: no refetch
            (0, false),                                          // an original peer
            (flags::CRC | flags::RELIABLE, false),               // not from leap
            (flags::LEAP | flags::AUTH | flags::RELIABLE, true), // keyed
            (flags::LEAP | flags::AUTH | 2, true),               // a keyed NACK
            (flags::LEAP | flags::AUTH, true),                   // keyed, best effort
            (flags::AUTH, false),                                // not from leap
        ] {
            let payload = chunk(reserved);
            assert_eq!(frame_checks_itself(&payload), skipped, "{reserved:#x}");
            for s in [spec(&payload), v6_spec(&payload)] {
                let mut f = s.build();
                let last = f.len() - 1;
                f[last] ^= 0x40;
                let want = if skipped { Ok(UdpChecksum::Unchecked) } else { Err(Reject::BadUdpChecksum) };
                assert_eq!(parse_udp(&f).map(|d| d.checksum), want, "{reserved:#x}");
                assert_eq!(host().admit_frame(&f).map(|d| d.checksum), want, "{reserved:#x}");
                // The ring buffer's record of it, checksum field off by one.
                let mut rec = record(&s);
                rec.udp_check ^= 1;
                assert_eq!(host().admit_record(&rec).is_ok(), skipped, "{reserved:#x}");
            }
        }
        assert!(!frame_checks_itself(b"LEAP"), "too short for a header");
    }

    #[test]
    fn zero_checksum_means_none_on_ipv4_only() {
        let f = FrameSpec { checksum: ChecksumFill::Zero, ..spec(b"LEAP") }.build();
        assert_eq!(parse_udp(&f).map(|d| d.checksum), Ok(UdpChecksum::Absent));
        assert!(host().admit_frame(&f).is_ok());
        let f = FrameSpec { checksum: ChecksumFill::Zero, ..v6_spec(b"LEAP") }.build();
        assert_eq!(parse_udp(&f), Err(Reject::BadUdpChecksum));
    }

    #[test]
    fn partial_checksums_pass_only_where_allowed() {
        let veth = RxFilter { partial_checksums: true, ..host() };
        for s in [spec(b"LEAP"), v6_spec(b"LEAP")] {
            let f = FrameSpec { checksum: ChecksumFill::Partial, ..s }.build();
            assert_eq!(parse_udp(&f).map(|d| d.checksum), Ok(UdpChecksum::Partial));
            assert_eq!(host().admit_frame(&f), Err(Reject::BadUdpChecksum));
            assert!(veth.admit_frame(&f).is_ok());
        }
        // A partial sum over other addresses or another length is wrong.
        let mut f = FrameSpec { checksum: ChecksumFill::Partial, ..spec(b"LEAP") }.build();
        f[V4_PAYLOAD - 2] ^= 0x10;
        assert_eq!(veth.admit_frame(&f), Err(Reject::BadUdpChecksum));
    }

    #[test]
    fn only_this_hosts_mac_unless_group_addressed() {
        let f = FrameSpec { dst_mac: [0x02, 0, 0, 0, 0, 0x99], ..spec(b"LEAP") }.build();
        assert_eq!(host().admit_frame(&f), Err(Reject::ForeignMac));
        assert!(RxFilter { mac: None, ..host() }.admit_frame(&f).is_ok());
        for group in [[0xff; 6], [0x01, 0x00, 0x5e, 0, 0, 1]] {
            let f = FrameSpec { dst_mac: group, ..spec(b"LEAP") }.build();
            assert!(host().admit_frame(&f).is_ok(), "{group:02x?}");
        }
    }

    #[test]
    fn only_configured_vlans() {
        let f = FrameSpec { vlan: Some(7), ..spec(b"LEAP") }.build();
        assert_eq!(host().admit_frame(&f), Err(Reject::ForeignVlan));
        let untagged_only = RxFilter { vlans: Vec::new(), ..host() };
        let f = FrameSpec { vlan: Some(5), ..spec(b"LEAP") }.build();
        assert_eq!(untagged_only.admit_frame(&f), Err(Reject::ForeignVlan));
        assert!(untagged_only.admit_frame(&spec(b"LEAP").build()).is_ok());
        let priority_tagged = FrameSpec { vlan: Some(0), ..spec(b"LEAP") }.build();
        assert!(untagged_only.admit_frame(&priority_tagged).is_ok());
    }

    #[test]
    fn only_local_destinations() {
        let f = FrameSpec { dst: "10.0.0.3:9999".parse().unwrap(), ..spec(b"LEAP") }.build();
        assert_eq!(host().admit_frame(&f), Err(Reject::ForeignDst));
        // An IPv6 packet to ::ffff:10.0.0.2 is not for 10.0.0.2.
        let f = FrameSpec { dst: "[::ffff:10.0.0.2]:9999".parse().unwrap(), ..v6_spec(b"LEAP") }.build();
        assert_eq!(host().admit_frame(&f), Err(Reject::ForeignDst));
    }

    #[test]
    fn v4_mapped_ipv6_source_is_refused() {
        let f = FrameSpec { src: "[::ffff:10.0.0.1]:4000".parse().unwrap(), ..v6_spec(b"LEAP") }.build();
        assert_eq!(parse_udp(&f), Err(Reject::MappedSource));
    }

    fn record(s: &FrameSpec<'_>) -> RingRecord {
        let f = s.build();
        let d = parse_udp(&f).unwrap();
        let l4 = f.len() - d.payload.len() - UDP_HLEN;
        let mut r = RingRecord {
            len: d.payload.len() as u16,
            src_port: d.src.port(),
            dst_port: d.dst.port(),
            family: if d.src.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 },
            src_addr: v6_octets(d.src.ip()),
            dst_addr: v6_octets(d.dst.ip()),
            udp_check: u16::from_be_bytes([f[l4 + 6], f[l4 + 7]]),
            ..RingRecord::default()
        };
        r.data[..d.payload.len()].copy_from_slice(d.payload);
        r
    }

    #[test]
    fn ring_records_are_checked_like_frames() {
        let r = record(&spec(b"LEAP-data"));
        assert_eq!(host().admit_record(&r), Ok(("10.0.0.1:4000".parse().unwrap(), &b"LEAP-data"[..])));
        let r6 = record(&v6_spec(b"LEAP-data"));
        assert!(host().admit_record(&r6).is_ok());

        let mut bad = r;
        bad.data[5] ^= 1;
        assert_eq!(host().admit_record(&bad), Err(Reject::BadUdpChecksum));
        let partial = record(&FrameSpec { checksum: ChecksumFill::Partial, ..spec(b"LEAP-data") });
        assert_eq!(host().admit_record(&partial), Err(Reject::BadUdpChecksum));
        assert!(RxFilter { partial_checksums: true, ..host() }.admit_record(&partial).is_ok());
        let foreign = record(&FrameSpec { dst: "10.0.0.3:9999".parse().unwrap(), ..spec(b"LEAP-data") });
        assert_eq!(host().admit_record(&foreign), Err(Reject::ForeignDst));

        // An IPv6 record from ::ffff:10.0.0.1 is never the IPv4 peer.
        let mut mapped = r6;
        mapped.src_addr = v4_mapped([10, 0, 0, 1]);
        assert_eq!(host().admit_record(&mapped), Err(Reject::MappedSource));
        // Nonsense from a foreign producer.
        let mut odd = r;
        odd.family = 9;
        assert_eq!(host().admit_record(&odd), Err(Reject::NotUdp));
        odd = r;
        odd.len = 2000;
        assert_eq!(host().admit_record(&odd), Err(Reject::NotUdp));
    }

    #[test]
    fn every_reject_has_its_own_drop_counter() {
        let all = [
            Reject::NotUdp,
            Reject::ForeignMac,
            Reject::ForeignVlan,
            Reject::MappedSource,
            Reject::ForeignDst,
            Reject::BadIpChecksum,
            Reject::BadUdpChecksum,
        ];
        let mut d = Drops::default();
        for (i, r) in all.iter().enumerate() {
            r.count(&mut d);
            assert_eq!(d.total(), i as u64 + 1);
        }
        assert_eq!(
            (d.foreign_mac, d.foreign_vlan, d.mapped_source, d.foreign_dst, d.bad_ip_checksum, d.bad_udp_checksum),
            (1, 1, 1, 1, 1, 1)
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_stays_in_bounds(frame in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            if let Ok(d) = parse_udp(&frame) {
                proptest::prop_assert!(d.payload.len() <= frame.len());
            }
            let _ = host().admit_frame(&frame);
        }

        #[test]
        fn built_frames_round_trip_and_any_flipped_bit_is_caught(
            payload in proptest::collection::vec(proptest::num::u8::ANY, 0..1500),
            v6 in proptest::bool::ANY,
            flip in 0usize..12_000,
        ) {
            let s = if v6 { v6_spec(&payload) } else { spec(&payload) };
            let f = s.build();
            let d = parse_udp(&f).unwrap();
            proptest::prop_assert_eq!(d.payload, &payload[..]);
            // One flipped bit anywhere the checksums and length checks
            // cover (the IPv4 header; from the IPv6 source address on; the
            // UDP header and payload) is never accepted. The IPv6 version,
            // class, flow label and hop limit are covered by no checksum.
            let from = if v6 { 14 + 8 } else { 14 };
            let bit = flip % ((f.len() - from) * 8);
            let mut g = f.clone();
            g[from + bit / 8] ^= 1 << (bit % 8);
            let check_at = f.len() - payload.len() - 2;
            // A one-bit checksum flipped to zero means "no checksum" on IPv4.
            proptest::prop_assume!(v6 || g[check_at..check_at + 2] != [0, 0]);
            proptest::prop_assert!(host().admit_frame(&g).is_err(), "bit {} of {:02x?}", bit, g);
        }
    }
}
