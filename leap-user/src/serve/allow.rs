//! Where an agent's ring members may send, accept from and attach: the
//! operator's allow-list (`[allow]` in `leap serve --config FILE`), by
//! default the interfaces and networks of the address the agent listens on,
//! never loopback unless the file says so.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::Deserialize;

use super::protocol::MemberSpec;

/// An address and prefix length (`192.168.10.0/24`, `fd00::/64`; a bare
/// address is one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// The address (host bits ignored).
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
}

impl Network {
    /// Whether `ip` is inside (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, p) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = a.trim().parse().map_err(|_| format!("{s:?} is not an address or network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p.trim().parse::<u8>().ok().filter(|p| *p <= max).ok_or(format!("{s:?}: bad prefix length"))?,
        };
        Ok(Self { addr: addr.to_canonical(), prefix })
    }
}

/// The `[allow]` table of the agent's config file, as written; a key left
/// out takes its default (see [`AllowList::for_listen`]).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AllowConfig {
    /// Networks (or addresses) members may listen on, send to and accept
    /// from, e.g. `["192.168.10.0/24"]`.
    #[serde(default)]
    pub networks: Option<Vec<String>>,
    /// Ports or ranges, e.g. `["9999", "9000-9100"]`.
    #[serde(default)]
    pub ports: Option<Vec<String>>,
    /// Interfaces members may use (XDP attaches there), e.g. `["eth1"]`.
    #[serde(default)]
    pub interfaces: Option<Vec<String>>,
    /// Member traffic on loopback (tests, one-host trials). Default false.
    #[serde(default)]
    pub loopback: bool,
}

/// The agent's config file (`leap serve --config FILE`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    /// What ring members may reach.
    #[serde(default)]
    pub allow: AllowConfig,
}

/// What ring members started by this agent may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    /// Member addresses (own, next, previous) must be inside one of these.
    pub networks: Vec<Network>,
    /// And their ports inside one of these ranges.
    pub ports: Vec<(u16, u16)>,
    /// Interfaces a member may name.
    pub interfaces: Vec<String>,
    /// Loopback addresses and `lo` allowed.
    pub loopback: bool,
}

fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("port {s:?}: use PORT or FIRST-LAST, 1..=65535");
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: u16 = a.trim().parse().map_err(|_| bad())?;
    let b: u16 = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || a > b {
        return Err(bad());
    }
    Ok((a, b))
}

/// The interfaces holding `ip` (every interface but loopback when `ip` is
/// unspecified), with the networks of their addresses.
fn local_interfaces(ip: IpAddr) -> (Vec<String>, Vec<Network>) {
    let mut ifaces: Vec<String> = Vec::new();
    let mut all: Vec<(String, IpAddr, u8)> = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            let (Some(addr), Some(mask)) = (a.address, a.netmask) else { continue };
            let (ip, prefix) = if let (Some(x), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
                (IpAddr::V4(x.ip()), u32::from(m.ip()).count_ones() as u8)
            } else if let (Some(x), Some(m)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
                (IpAddr::V6(x.ip()), u128::from(m.ip()).count_ones() as u8)
            } else {
                continue;
            };
            all.push((a.interface_name.clone(), ip, prefix));
        }
    }
    for (name, a, _) in &all {
        let pick = if ip.is_unspecified() { !a.is_loopback() } else { *a == ip.to_canonical() };
        if pick && !ifaces.contains(name) {
            ifaces.push(name.clone());
        }
    }
    let networks = all
        .iter()
        .filter(|(n, a, _)| ifaces.contains(n) && !(ip.is_unspecified() && a.is_loopback()))
        .map(|(_, a, p)| Network { addr: *a, prefix: *p })
        .collect();
    (ifaces, networks)
}

impl AllowList {
    /// The default: the interfaces holding `listen`'s address (every
    /// non-loopback one for an unspecified address) and the networks of
    /// their addresses, ports 1024..=65535, no loopback.
    pub fn for_listen(listen: SocketAddr) -> Self {
        let (interfaces, networks) = local_interfaces(listen.ip());
        Self { networks, ports: vec![(1024, 65535)], interfaces, loopback: false }
    }

    /// `cfg` over the defaults of [`AllowList::for_listen`].
    ///
    /// # Errors
    ///
    /// A network or port range that does not parse, named.
    pub fn from_config(cfg: &AllowConfig, listen: SocketAddr) -> Result<Self, String> {
        let mut me = Self::for_listen(listen);
        if let Some(n) = &cfg.networks {
            me.networks = n.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
        }
        if let Some(p) = &cfg.ports {
            me.ports = p.iter().map(|s| parse_port_range(s)).collect::<Result<_, _>>()?;
        }
        if let Some(i) = &cfg.interfaces {
            me.interfaces = i.clone();
        }
        me.loopback = cfg.loopback;
        Ok(me)
    }

    /// Allows only loopback (for tests and one-host trials): networks
    /// 127.0.0.0/8 and ::1, every port from 1024, interface `lo`.
    pub fn loopback_only() -> Self {
        Self {
            networks: vec![
                Network { addr: [127, 0, 0, 0].into(), prefix: 8 },
                Network { addr: std::net::Ipv6Addr::LOCALHOST.into(), prefix: 128 },
            ],
            ports: vec![(1024, 65535)],
            interfaces: vec!["lo".into()],
            loopback: true,
        }
    }

    fn list<T: std::fmt::Display>(v: &[T]) -> String {
        if v.is_empty() { "none".into() } else { v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ") }
    }

    /// Whether a member may use `addr` (as `name`: listen, next, prev).
    ///
    /// # Errors
    ///
    /// Why not, with the key that would allow it.
    pub fn check_addr(&self, name: &str, addr: SocketAddr, control: SocketAddr) -> Result<(), String> {
        let ip = addr.ip().to_canonical();
        if addr == control || (control.ip().is_unspecified() && addr.port() == control.port()) {
            return Err(format!("{name} {addr} is the agent's own control address"));
        }
        if ip.is_loopback() {
            if !self.loopback {
                return Err(format!(
                    "{name} {addr} is a loopback address: member traffic on loopback needs `loopback = true` \
                     under [allow] in the agent's config (leap serve --config)"
                ));
            }
        } else if !self.networks.iter().any(|n| n.contains(ip)) {
            return Err(format!(
                "{name} {addr} is outside the agent's allowed networks ({}): add it to `networks` under [allow] in \
                 the agent's config (leap serve --config)",
                Self::list(&self.networks)
            ));
        }
        let p = addr.port();
        if !self.ports.iter().any(|(a, b)| (*a..=*b).contains(&p)) {
            let ranges: Vec<String> = self.ports.iter().map(|(a, b)| format!("{a}-{b}")).collect();
            return Err(format!(
                "{name} port {p} is outside the agent's allowed ports ({}): see `ports` under [allow] in the agent's \
                 config",
                ranges.join(", ")
            ));
        }
        Ok(())
    }

    /// Whether the member `spec` stays inside the list: its own, its next
    /// and its previous address, and its interface.
    ///
    /// # Errors
    ///
    /// The first thing outside, named, with the key that would allow it.
    pub fn check(&self, spec: &MemberSpec, control: SocketAddr) -> Result<(), String> {
        for (name, a) in [("listen", spec.listen), ("next", spec.next), ("prev", spec.prev)] {
            self.check_addr(name, a, control)?;
        }
        if let Some(i) = &spec.iface {
            let lo_ok = self.loopback && i == "lo";
            if !lo_ok && !self.interfaces.iter().any(|x| x == i) {
                return Err(format!(
                    "iface {i} is not an interface this agent may use ({}): see `interfaces` under [allow] in the \
                     agent's config",
                    Self::list(&self.interfaces)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_and_contain() {
        let n: Network = "192.168.10.0/24".parse().unwrap();
        assert!(n.contains("192.168.10.77".parse().unwrap()));
        assert!(n.contains("::ffff:192.168.10.77".parse().unwrap()));
        assert!(!n.contains("192.168.11.1".parse().unwrap()));
        let h: Network = "10.0.0.5".parse().unwrap();
        assert_eq!(h.prefix, 32);
        assert!(h.contains("10.0.0.5".parse().unwrap()) && !h.contains("10.0.0.6".parse().unwrap()));
        let all: Network = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6: Network = "fd00::/64".parse().unwrap();
        assert!(v6.contains("fd00::1".parse().unwrap()) && !v6.contains("fd01::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Network>().is_err());
        assert!("eth0".parse::<Network>().is_err());
    }

    #[test]
    fn config_keys_override_the_defaults() {
        let cfg: ServeFile = toml::from_str(
            "[allow]\nnetworks = [\"192.168.10.0/24\"]\nports = [\"9999\", \"9000-9100\"]\ninterfaces = [\"eth1\"]\n",
        )
        .unwrap();
        let a = AllowList::from_config(&cfg.allow, "10.0.0.1:7700".parse().unwrap()).unwrap();
        assert_eq!(a.ports, vec![(9999, 9999), (9000, 9100)]);
        assert_eq!(a.interfaces, vec!["eth1".to_string()]);
        assert!(!a.loopback);
        let c = "10.0.0.1:7700".parse().unwrap();
        assert!(a.check_addr("next", "192.168.10.2:9999".parse().unwrap(), c).is_ok());
        let e = a.check_addr("next", "192.168.10.2:6379".parse().unwrap(), c).unwrap_err();
        assert!(e.starts_with("next port 6379 is outside"), "{e}");
        let e = a.check_addr("next", "10.0.0.2:9999".parse().unwrap(), c).unwrap_err();
        assert!(e.contains("outside the agent's allowed networks"), "{e}");
        let e = a.check_addr("next", "127.0.0.1:9999".parse().unwrap(), c).unwrap_err();
        assert!(e.contains("loopback = true"), "{e}");
        assert!(toml::from_str::<ServeFile>("[allow]\nhosts = []\n").is_err(), "unknown keys are refused");
        let bad = AllowConfig { ports: Some(vec!["0-10".into()]), ..Default::default() };
        assert!(AllowList::from_config(&bad, c).is_err());
    }

    #[test]
    fn the_default_never_allows_loopback() {
        let a = AllowList::for_listen("127.0.0.1:7700".parse().unwrap());
        assert!(!a.loopback);
        let e = a.check_addr("next", "127.0.0.1:6379".parse().unwrap(), "127.0.0.1:7700".parse().unwrap());
        assert!(e.unwrap_err().contains("loopback"));
        let e = AllowList::loopback_only().check_addr(
            "next",
            "127.0.0.1:7700".parse().unwrap(),
            "127.0.0.1:7700".parse().unwrap(),
        );
        assert!(e.unwrap_err().contains("own control address"));
    }
}
