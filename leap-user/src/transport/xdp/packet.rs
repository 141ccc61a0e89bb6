//! Finding the UDP payload and its sender in an Ethernet frame handed over by
//! AF_XDP. The XDP program checked the headers already; this checks them
//! again, because user space must not trust memory the kernel shares.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use leap_common::xdp::wire::{
    ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IP_MF_OFFSET, IPPROTO_UDP, IPV4_HLEN, IPV6_HLEN,
    UDP_HLEN, VLAN_HLEN,
};

/// A UDP datagram found in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// Who sent it.
    pub src: SocketAddr,
    /// The destination port.
    pub dst_port: u16,
    /// The UDP payload (exactly the UDP length minus 8).
    pub payload: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parses Ethernet (one VLAN tag), IPv4 without fragments or IPv6 without
/// extension headers, and UDP. `None` for anything else or any length that
/// does not add up.
pub fn parse_udp(frame: &[u8]) -> Option<UdpDatagram<'_>> {
    let mut off = ETH_HLEN;
    let mut proto = be16(frame, 12)?;
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        proto = be16(frame, off + 2)?;
        off += VLAN_HLEN;
    }
    let (src_ip, l4, ip_payload) = match proto {
        ETH_P_IP => {
            let ip = frame.get(off..off + IPV4_HLEN)?;
            let ihl = usize::from(ip[0] & 0x0F) * 4;
            if ip[0] >> 4 != 4 || ihl < IPV4_HLEN || ip[9] != IPPROTO_UDP || be16(ip, 6)? & IP_MF_OFFSET != 0 {
                return None;
            }
            let tot = usize::from(be16(ip, 2)?);
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            (IpAddr::V4(src), off + ihl, tot.checked_sub(ihl)?)
        }
        ETH_P_IPV6 => {
            let ip = frame.get(off..off + IPV6_HLEN)?;
            if ip[0] >> 4 != 6 || ip[6] != IPPROTO_UDP {
                return None;
            }
            let mut src = [0u8; 16];
            src.copy_from_slice(&ip[8..24]);
            (IpAddr::V6(Ipv6Addr::from(src)), off + IPV6_HLEN, usize::from(be16(ip, 4)?))
        }
        _ => return None,
    };
    let udp = frame.get(l4..l4 + UDP_HLEN)?;
    let udp_len = usize::from(be16(udp, 4)?);
    if udp_len < UDP_HLEN || udp_len != ip_payload {
        return None;
    }
    let payload = frame.get(l4 + UDP_HLEN..l4 + udp_len)?;
    Some(UdpDatagram { src: SocketAddr::new(src_ip, be16(udp, 0)?), dst_port: be16(udp, 2)?, payload })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An Ethernet + IPv4 + UDP frame (checksums left zero).
    pub(crate) fn ipv4_frame(src: SocketAddrV4Like, dst_port: u16, payload: &[u8], vlan: bool) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let tot = (20 + 8 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0, (tot >> 8) as u8, tot as u8, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&src.0);
        f.extend_from_slice(&[10, 0, 0, 2]);
        let ulen = (8 + payload.len()) as u16;
        f.extend_from_slice(&src.1.to_be_bytes());
        f.extend_from_slice(&dst_port.to_be_bytes());
        f.extend_from_slice(&ulen.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    /// `(address octets, port)`.
    pub(crate) struct SocketAddrV4Like(pub [u8; 4], pub u16);

    #[test]
    fn finds_the_payload_and_sender() {
        for vlan in [false, true] {
            let f = ipv4_frame(SocketAddrV4Like([10, 0, 0, 1], 4000), 9999, b"LEAPxx", vlan);
            let d = parse_udp(&f).unwrap();
            assert_eq!(d.src, "10.0.0.1:4000".parse().unwrap());
            assert_eq!(d.dst_port, 9999);
            assert_eq!(d.payload, b"LEAPxx");
        }
    }

    #[test]
    fn ethernet_padding_is_not_payload() {
        let mut f = ipv4_frame(SocketAddrV4Like([10, 0, 0, 1], 4000), 9999, b"ab", false);
        f.extend_from_slice(&[0; 16]);
        assert_eq!(parse_udp(&f).unwrap().payload, b"ab");
    }

    #[test]
    fn fragments_and_bad_lengths_are_refused() {
        let mut f = ipv4_frame(SocketAddrV4Like([10, 0, 0, 1], 4000), 9999, b"abcd", false);
        f[14 + 6] = 0x20; // more fragments
        assert_eq!(parse_udp(&f), None);
        let mut f = ipv4_frame(SocketAddrV4Like([10, 0, 0, 1], 4000), 9999, b"abcd", false);
        f[14 + 20 + 5] += 1; // UDP length one too long
        assert_eq!(parse_udp(&f), None);
        let f = ipv4_frame(SocketAddrV4Like([10, 0, 0, 1], 4000), 9999, b"abcd", false);
        assert_eq!(parse_udp(&f[..f.len() - 1]), None);
    }

    #[test]
    fn ipv6_is_parsed() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x86, 0xDD]);
        let payload = b"LEAP";
        let plen = (8 + payload.len()) as u16;
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&plen.to_be_bytes());
        f.extend_from_slice(&[17, 64]);
        let src: Ipv6Addr = "fd00::1".parse().unwrap();
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        f.extend_from_slice(&5000u16.to_be_bytes());
        f.extend_from_slice(&9999u16.to_be_bytes());
        f.extend_from_slice(&plen.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        let d = parse_udp(&f).unwrap();
        assert_eq!(d.src, "[fd00::1]:5000".parse().unwrap());
        assert_eq!(d.payload, payload);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_stays_in_bounds(frame in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            if let Some(d) = parse_udp(&frame) {
                proptest::prop_assert!(d.payload.len() <= frame.len());
            }
        }
    }
}
