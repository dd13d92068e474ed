//! One cluster: a bridge, and per host a namespace joined to it by a veth
//! pair; shaping, partitions, processes and threads in hosts, teardown.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::claim::{self, Claim};
use crate::error::Error;
use crate::names::Names;
use crate::spec::{Rate, Spec, MAX_HOSTS};
use crate::sys::{self, NsFd};

/// `tbf`'s queue: how long a packet may wait for tokens before it is
/// dropped. Long enough that TCP never sees drops from the shaper alone.
const TBF_LATENCY: &str = "50ms";

/// N namespace "hosts" on one bridge. Dropping it kills every process in
/// its namespaces and removes them, their links and the bridge.
#[derive(Debug)]
pub struct Cluster {
    names: Names,
    hosts: usize,
    /// The namespace the cluster was made from, where its bridge and the
    /// bridge ends of the veths live; every command runs there, whichever
    /// namespace the calling thread has entered.
    admin: NsFd,
    /// The hosts' namespaces made so far.
    ns: Vec<NsFd>,
    delay_applied: bool,
    /// Dropped after `drop` has removed everything: the subnet is free
    /// only once nothing of it is left.
    claim: Claim,
}

impl Cluster {
    /// Makes the cluster `spec` describes on a subnet of its own, after
    /// removing what dead owners left behind. [`Error::NeedsRoot`] where
    /// this process cannot make namespaces.
    pub fn create(spec: Spec) -> Result<Cluster, Error> {
        if let Some(reason) = sys::why_unavailable() {
            return Err(Error::NeedsRoot { reason: reason.to_owned() });
        }
        if spec.hosts == 0 || spec.hosts > MAX_HOSTS {
            return Err(Error::HostCount { hosts: spec.hosts, max: MAX_HOSTS });
        }
        let admin = NsFd::current()?;
        let claim = claim::claim()?;
        claim::sweep(&admin, &claim)?;
        let mut cluster = Cluster {
            names: Names { index: claim.index },
            hosts: spec.hosts,
            admin,
            ns: Vec::new(),
            delay_applied: spec.delay.is_none(),
            claim,
        };
        // On an error `cluster` drops here and removes what was made.
        cluster.build(&spec)?;
        Ok(cluster)
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// Host `host`'s address (`10.77.<subnet>.(10 + host)`, a /24 of this
    /// cluster's own). Panics if `host >= hosts()`.
    pub fn addr(&self, host: usize) -> Ipv4Addr {
        self.names.addr(self.check(host))
    }

    /// Host `host`'s namespace, as `ip netns` names it
    /// (`ip netns exec <name> …` runs a command there).
    pub fn ns_name(&self, host: usize) -> String {
        self.names.ns(self.check(host))
    }

    /// The bridge end of host `host`'s veth (the namespace end is `eth0`).
    pub fn link_name(&self, host: usize) -> String {
        self.names.veth(self.check(host))
    }

    /// The bridge joining the hosts.
    pub fn bridge_name(&self) -> String {
        self.names.bridge()
    }

    /// False exactly when the spec asked for a delay this kernel could not
    /// apply (no `sch_netem`): the links then carry the rate alone.
    pub fn delay_applied(&self) -> bool {
        self.delay_applied
    }

    /// A command that runs `program` inside host `host`'s namespace. The
    /// child joins the namespace between fork and exec, so its pid is the
    /// program's own: SIGKILL and SIGSTOP reach the program. The host shares
    /// this machine's filesystem. Spawn it while the cluster lives.
    pub fn command(&self, host: usize, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        self.ns[self.check(host)].apply(&mut cmd);
        cmd
    }

    /// Moves the calling thread into host `host`'s namespace for good:
    /// sockets it opens afterwards are host `host`'s. Meant for a thread of
    /// its own; the cluster's methods keep working from it.
    pub fn enter(&self, host: usize) -> Result<(), Error> {
        let ns = &self.ns[self.check(host)];
        ns.enter().map_err(|e| Error::io(format!("setns into {}", self.names.ns(host)), e))
    }

    /// Partitions host `host` silently: its bridge port stops forwarding,
    /// so every packet to or from it is dropped in the "switch". Nothing
    /// changes on either host: no route goes, no RST or ICMP comes, sends
    /// succeed and established connections stall as behind a pulled cable
    /// (neighbour entries are permanent, so not even ARP fails).
    pub fn cut_link(&self, host: usize) -> Result<(), Error> {
        self.port_state(host, "0")
    }

    /// Ends [`cut_link`](Self::cut_link): the port forwards again and
    /// stalled connections resume at their next retransmission.
    pub fn restore_link(&self, host: usize) -> Result<(), Error> {
        self.port_state(host, "3")
    }

    /// Bytes through host `host`'s link since it was made, as the host sees
    /// them: `rx` received, `tx` sent (the bridge end's counters swapped).
    pub fn link_bytes(&self, host: usize) -> Result<LinkBytes, Error> {
        let veth = self.names.veth(self.check(host));
        let counter = |name: &str| -> Result<u64, Error> {
            let path = format!("/sys/class/net/{veth}/statistics/{name}");
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(format!("read {path}"), e))?;
            text.trim().parse().map_err(|_| Error::io(format!("parse {path}"), std::io::ErrorKind::InvalidData.into()))
        };
        Ok(LinkBytes { rx: counter("tx_bytes")?, tx: counter("rx_bytes")? })
    }

    fn check(&self, host: usize) -> usize {
        assert!(host < self.hosts, "host {host} of a cluster of {}", self.hosts);
        host
    }

    fn port_state(&self, host: usize, state: &str) -> Result<(), Error> {
        let veth = self.names.veth(self.check(host));
        sys::run(&self.admin, "bridge", &["link", "set", "dev", &veth, "state", state], None).map(drop)
    }

    fn ip(&self, args: &[&str]) -> Result<(), Error> {
        sys::run(&self.admin, "ip", args, None).map(drop)
    }

    fn build(&mut self, spec: &Spec) -> Result<(), Error> {
        let br = self.names.bridge();
        self.ip(&["link", "add", &br, "type", "bridge"])?;
        sys::disable_ipv6(&self.admin, &br)?;
        self.ip(&["link", "set", &br, "up"])?;
        for host in 0..self.hosts {
            self.add_host(host)?;
        }
        self.shape(spec)
    }

    fn add_host(&mut self, host: usize) -> Result<(), Error> {
        let (ns, veth, br) = (self.names.ns(host), self.names.veth(host), self.names.bridge());
        match self.ip(&["netns", "add", &ns]) {
            Err(Error::Command { stderr, .. }) if stderr.contains("Operation not permitted") => {
                return Err(Error::NeedsRoot { reason: format!("ip netns add: {stderr}") })
            }
            r => r?,
        }
        let fd = NsFd::open(&Path::new("/run/netns").join(&ns))?;
        // Before eth0 exists, so it is made without IPv6.
        sys::disable_ipv6(&fd, "default")?;
        self.ns.push(fd);
        self.ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "address", &self.names.mac(host), "netns", &ns])?;
        sys::disable_ipv6(&self.admin, &veth)?;
        self.ip(&["link", "set", &veth, "master", &br, "up"])?;
        let mut batch = format!("addr add {}/24 dev eth0\nlink set eth0 up\nlink set lo up\n", self.names.addr(host));
        for peer in (0..self.hosts).filter(|&p| p != host) {
            batch += &format!("neigh replace {} lladdr {} dev eth0 nud permanent\n", self.names.addr(peer), self.names.mac(peer));
        }
        sys::run(&self.admin, "ip", &["-n", &ns, "-batch", "-"], Some(&batch)).map(drop)
    }

    /// Rate both ways: `tbf` on the namespace end (what the host sends) and
    /// on the bridge end (what it receives). Delay on what it sends, with
    /// `netem` above that `tbf`, where the kernel has netem.
    fn shape(&mut self, spec: &Spec) -> Result<(), Error> {
        for host in 0..self.hosts {
            let ns = self.names.ns(host);
            let mut rate_parent = "root".to_owned();
            if let Some(delay) = spec.delay.filter(|_| host == 0 || self.delay_applied) {
                if self.add_netem(&ns, delay)? {
                    rate_parent = "parent 1:1 handle 10:".into();
                }
            }
            if let Some(rate) = spec.rate {
                let tbf = tbf_args(rate);
                self.tc(Some(&ns), &format!("qdisc add dev eth0 {rate_parent} {tbf}"))?;
                self.tc(None, &format!("qdisc add dev {} root {tbf}", self.names.veth(host)))?;
            }
        }
        Ok(())
    }

    /// Adds `netem` as eth0's root qdisc in `ns`; false (said once on
    /// stderr) where the kernel has no netem.
    fn add_netem(&mut self, ns: &str, delay: Duration) -> Result<bool, Error> {
        match self.tc(Some(ns), &format!("qdisc add dev eth0 root handle 1: netem delay {}us", delay.as_micros())) {
            Ok(()) => {
                self.delay_applied = true;
                Ok(true)
            }
            Err(Error::Command { stderr, .. }) if stderr.contains("qdisc kind is unknown") || stderr.contains("qdisc not found") => {
                eprintln!("netem unavailable: delay NOT applied (this kernel has no sch_netem; links carry the rate only)");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn tc(&self, ns: Option<&str>, args: &str) -> Result<(), Error> {
        let mut all: Vec<&str> = ns.map(|ns| vec!["-n", ns]).unwrap_or_default();
        all.extend(args.split_whitespace());
        sys::run(&self.admin, "tc", &all, None).map(drop)
    }
}

fn tbf_args(rate: Rate) -> String {
    format!("tbf rate {rate} burst {} latency {TBF_LATENCY}", rate.burst_bytes())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let found = claim::Found {
            namespaces: (0..self.hosts).map(|h| self.names.ns(h)).collect(),
            links: (0..self.hosts).map(|h| self.names.veth(h)).chain([self.names.bridge()]).collect(),
        };
        // Only what exists: a cluster whose creation failed made less.
        let found = claim::Found {
            namespaces: found.namespaces.into_iter().filter(|n| Path::new("/run/netns").join(n).exists()).collect(),
            links: found.links,
        };
        if let Err(e) = claim::remove(&self.admin, &found) {
            eprintln!("netns: tearing down subnet {} left something behind: {e}", self.claim.index);
        }
    }
}

/// Bytes through one host's link, as the host sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkBytes {
    /// Bytes the host received.
    pub rx: u64,
    /// Bytes the host sent.
    pub tx: u64,
}
