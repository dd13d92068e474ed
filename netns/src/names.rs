//! Every name and address of one cluster follows from its subnet index, so
//! a sweep can tell whose leftovers it finds from the names alone.
//!
//! Subnet `s` (1..=254): bridge `ftbag<s>br`, host `i`'s namespace
//! `ftbag<s>h<i>`, its veth's bridge end `ftbag<s>v<i>` (the namespace end
//! is `eth0`), its address `10.77.<s>.(10+i)/24`. The longest interface
//! name, `ftbag254v239`, is 12 characters, within Linux's 15.

use std::net::Ipv4Addr;

/// Subnet indices a cluster may hold.
pub(crate) const SUBNETS: std::ops::RangeInclusive<u8> = 1..=254;

const PREFIX: &str = "ftbag";

/// The names of the cluster on subnet `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Names {
    pub(crate) index: u8,
}

impl Names {
    pub(crate) fn bridge(self) -> String {
        format!("{PREFIX}{}br", self.index)
    }

    pub(crate) fn ns(self, host: usize) -> String {
        format!("{PREFIX}{}h{host}", self.index)
    }

    /// The bridge end of host `host`'s veth pair.
    pub(crate) fn veth(self, host: usize) -> String {
        format!("{PREFIX}{}v{host}", self.index)
    }

    pub(crate) fn addr(self, host: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.index, host_octet(host))
    }

    /// The namespace end's MAC, fixed so every host's neighbour table can
    /// be filled at creation: no ARP, so a cut never turns into a
    /// "no route to host" when resolution would have failed.
    pub(crate) fn mac(self, host: usize) -> String {
        format!("02:77:00:00:{:02x}:{:02x}", self.index, host_octet(host))
    }
}

fn host_octet(host: usize) -> u8 {
    u8::try_from(10 + host).expect("host index within MAX_HOSTS")
}

/// The subnet index a cluster name belongs to: `ftbag12h3` → 12,
/// `ftbag12v0` → 12, `ftbag12br` → 12; `None` for other names.
pub(crate) fn index_of(name: &str) -> Option<u8> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let (index, tail) = rest.split_at(digits);
    let ok = tail == "br" || tail.strip_prefix(['h', 'v']).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !ok || index.starts_with('0') {
        return None;
    }
    index.parse().ok().filter(|i| SUBNETS.contains(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_interface_limit_and_parse_back() {
        let n = Names { index: 254 };
        let last = crate::MAX_HOSTS - 1;
        for name in [n.bridge(), n.ns(last), n.veth(last)] {
            assert!(name.len() <= 15, "{name}");
            assert_eq!(index_of(&name), Some(254), "{name}");
        }
        assert_eq!(n.addr(last), Ipv4Addr::new(10, 77, 254, 249));
        assert_eq!(Names { index: 7 }.mac(1), "02:77:00:00:07:0b");
    }

    #[test]
    fn other_names_are_not_ours() {
        for name in ["eth0", "ftbag", "ftbagbr", "ftbag1", "ftbag1x2", "ftbag1h", "ftbag01h1", "ftbag0br", "ftbag300br", "ftbag1h2x"] {
            assert_eq!(index_of(name), None, "{name}");
        }
    }
}
