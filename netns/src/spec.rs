//! What a cluster should look like: host count, link rate, link delay.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ParseError;

/// Most hosts in one cluster: host `i` is `10.77.<subnet>.(10 + i)`.
pub const MAX_HOSTS: usize = 240;

/// The cluster to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Number of hosts, 1 to [`MAX_HOSTS`].
    pub hosts: usize,
    /// Each host's link rate, full duplex (`tc tbf` on both ends of its
    /// veth); `None`: unshaped.
    pub rate: Option<Rate>,
    /// One-way delay added to everything a host sends (`tc netem`), so a
    /// round trip between two hosts takes twice this. Kernels without netem
    /// cannot apply it: see [`Cluster::delay_applied`](crate::Cluster::delay_applied).
    pub delay: Option<Duration>,
}

impl Spec {
    /// `hosts` unshaped hosts.
    pub fn hosts(hosts: usize) -> Spec {
        Spec { hosts, rate: None, delay: None }
    }

    /// Shapes every link to `rate` both ways.
    pub fn rate(mut self, rate: Rate) -> Spec {
        self.rate = Some(rate);
        self
    }

    /// Delays everything each host sends by `delay` (where netem exists).
    pub fn delay(mut self, delay: Duration) -> Spec {
        self.delay = Some(delay);
        self
    }
}

/// A link rate in bits per second, parsed from `tc`'s notation
/// (`100mbit`, `1gbit`, `12.5mbps`, `2gibit`; a bare number is bit/s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rate {
    bits_per_sec: u64,
}

impl Rate {
    /// `bits_per_sec` bit/s (at least 1).
    pub fn bits_per_sec(bits_per_sec: u64) -> Rate {
        Rate { bits_per_sec: bits_per_sec.max(1) }
    }

    /// The rate in bit/s.
    pub fn as_bits_per_sec(self) -> u64 {
        self.bits_per_sec
    }

    /// How long `bytes` take at this rate, headers not counted.
    pub fn time_for(self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 * 8.0 / self.bits_per_sec as f64)
    }

    /// The token bucket `tbf` gets: 2 ms at this rate, at least 64 KiB.
    /// A 64 KiB bucket held 1gbit to 82 % of its rate with TCP on this
    /// project's VM; 2 ms (250 KB there) to 94 %, what TCP/IP headers leave.
    pub(crate) fn burst_bytes(self) -> u64 {
        (self.bits_per_sec / 8 / 500).max(64 * 1024)
    }
}

/// In the largest of `tc`'s decimal units that shows it exactly (`1gbit`,
/// `300mbit`, `12500kbit`), which `tc` and `FromStr` read back.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_sec;
        let (n, unit) = [(1_000_000_000_000, "tbit"), (1_000_000_000, "gbit"), (1_000_000, "mbit"), (1_000, "kbit")]
            .into_iter()
            .find(|&(u, _)| b.is_multiple_of(u))
            .map_or((b, "bit"), |(u, name)| (b / u, name));
        write!(f, "{n}{unit}")
    }
}

impl FromStr for Rate {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Rate, ParseError> {
        let err = |why| ParseError { what: "rate", text: s.to_owned(), why };
        let (number, unit) = split_number(s.trim()).ok_or_else(|| err("expected a number and a unit such as 100mbit"))?;
        let per_bit: f64 = match unit.to_ascii_lowercase().as_str() {
            "" | "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            "tbit" => 1e12,
            "kibit" => 1024.0,
            "mibit" => 1024.0 * 1024.0,
            "gibit" => 1024.0 * 1024.0 * 1024.0,
            "bps" => 8.0,
            "kbps" => 8e3,
            "mbps" => 8e6,
            "gbps" => 8e9,
            "tbps" => 8e12,
            _ => return Err(err("unknown unit (bit, kbit, mbit, gbit, tbit, kibit, mibit, gibit, bps, kbps, mbps, gbps, tbps)")),
        };
        let bits = number * per_bit;
        if !(bits >= 1.0 && bits < u64::MAX as f64) {
            return Err(err("out of range"));
        }
        Ok(Rate::bits_per_sec(bits.round() as u64))
    }
}

/// Parses a delay in `tc`'s notation: `0.1ms`, `100us`, `1s` (a bare
/// number is microseconds, as in `tc`).
pub fn parse_delay(s: &str) -> Result<Duration, ParseError> {
    let err = |why| ParseError { what: "delay", text: s.to_owned(), why };
    let (number, unit) = split_number(s.trim()).ok_or_else(|| err("expected a number and a unit such as 0.1ms"))?;
    let per_sec = match unit.to_ascii_lowercase().as_str() {
        "s" | "sec" | "secs" => 1.0,
        "ms" | "msec" | "msecs" => 1e-3,
        "" | "us" | "usec" | "usecs" => 1e-6,
        _ => return Err(err("unknown unit (s, ms, us)")),
    };
    let secs = number * per_sec;
    if !(0.0..=3600.0).contains(&secs) {
        return Err(err("out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `"12.5mbit"` → `(12.5, "mbit")`.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let number = s[..end].parse().ok()?;
    Some((number, &s[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_as_tc_reads_them() {
        assert_eq!("100mbit".parse(), Ok(Rate::bits_per_sec(100_000_000)));
        assert_eq!("1gbit".parse(), Ok(Rate::bits_per_sec(1_000_000_000)));
        assert_eq!("1.5Gbit".parse(), Ok(Rate::bits_per_sec(1_500_000_000)));
        assert_eq!("10mbps".parse(), Ok(Rate::bits_per_sec(80_000_000)));
        assert_eq!("2kibit".parse(), Ok(Rate::bits_per_sec(2048)));
        assert_eq!("9600".parse(), Ok(Rate::bits_per_sec(9600)));
        assert!("fast".parse::<Rate>().is_err());
        assert!("10 furlongs".parse::<Rate>().is_err());
        assert!("0mbit".parse::<Rate>().is_err());
        for shown in ["300mbit", "1gbit", "12500kbit", "9601bit", "2tbit"] {
            assert_eq!(shown.parse::<Rate>().unwrap().to_string(), shown);
        }
    }

    #[test]
    fn bursts_hold_two_milliseconds_and_at_least_64_kib() {
        assert_eq!(Rate::bits_per_sec(1_000_000_000).burst_bytes(), 250_000);
        assert_eq!(Rate::bits_per_sec(100_000_000).burst_bytes(), 65_536);
    }

    #[test]
    fn delays_parse_as_tc_reads_them() {
        assert_eq!(parse_delay("0.1ms"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_delay("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_delay("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_delay("40"), Ok(Duration::from_micros(40)));
        assert!(parse_delay("soon").is_err());
        assert!(parse_delay("3h").is_err());
    }

    #[test]
    fn time_for_counts_bits() {
        assert_eq!(Rate::bits_per_sec(8_000_000).time_for(1_000_000), Duration::from_secs(1));
    }
}
