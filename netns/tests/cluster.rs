//! Real namespaces: reachability and rate, silent partitions, teardown
//! (after a drop, a panic, and a killed owner), clusters side by side.
//! Every test skips, saying `skipped: needs root for network namespaces`
//! on stdout and stderr, where it cannot make namespaces.
//!
//! Programs in a host are this test binary again in a role (`role` below):
//! a TCP sink or echo server in host 0, started with `Cluster::command`.
//! Clients are threads of the test that `enter` host 1.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use netns::{Cluster, Rate, Spec};

const PORT: u16 = 7500;

/// Not a test: the entry of this binary when it runs as a role process.
#[test]
fn role() {
    let Ok(role) = std::env::var("NETNS_TEST_ROLE") else { return };
    match role.as_str() {
        // Accepts one connection, reads it to its end, answers the count.
        "sink" => {
            let listener = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
            tell("ready");
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut n = 0u64;
            loop {
                match conn.read(&mut buf).unwrap() {
                    0 => break,
                    k => n += k as u64,
                }
            }
            conn.write_all(format!("{n}\n").as_bytes()).unwrap();
        }
        // Echoes one connection's bytes until its end.
        "echo" => {
            let listener = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
            tell("ready");
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            loop {
                match conn.read(&mut buf).unwrap() {
                    0 => break,
                    k => conn.write_all(&buf[..k]).unwrap(),
                }
            }
        }
        // Makes a cluster with a process in it and exits without dropping
        // it, as a killed test run would.
        "leak" => {
            let cluster = Cluster::create(Spec::hosts(2)).unwrap();
            let sleeper = cluster.command(0, "sleep").arg("1000").spawn().unwrap();
            tell(&format!("{} {} {} {}", cluster.ns_name(0), cluster.link_name(0), cluster.bridge_name(), sleeper.id()));
            // Until the parent has seen it all in place.
            std::io::stdin().read_line(&mut String::new()).unwrap();
            std::process::exit(0);
        }
        r => panic!("unknown role {r}"),
    }
}

/// In a role: a line for the parent (straight to fd 1, past libtest's
/// capture; libtest's own lines lack the `@`).
fn tell(line: &str) {
    use std::os::fd::FromRawFd;
    // SAFETY: fd 1 is open for the whole process; ManuallyDrop keeps it so.
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(1) });
    out.write_all(format!("@{line}\n").as_bytes()).unwrap();
}

/// This binary in `role`, run by `cmd` (a host's command or a plain one).
fn start_role(mut cmd: Command, role: &str) -> (Child, BufReader<ChildStdout>) {
    let mut child = cmd
        .args(["--exact", "role", "--nocapture", "--test-threads=1"])
        .env("NETNS_TEST_ROLE", role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn role");
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

fn expect_line(out: &mut BufReader<ChildStdout>) -> String {
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "role exited before saying anything");
        if let Some(at) = line.find('@') {
            return line[at + 1..].trim().to_owned();
        }
    }
}

/// How `child` ended; fails the test (killing it) if it runs 10 s more.
fn exit_of(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("pid {} still runs", child.id());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn create(spec: Spec) -> Cluster {
    Cluster::create(spec).expect("create cluster")
}

fn net_ns_id(path: &str) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap();
    (m.dev(), m.ino())
}

/// A cluster's namespaces and links as nobody else's can be: the
/// namespaces held open (so their inodes cannot be reused while we look)
/// and the links' interface indices (allocated cyclically, not reused). A
/// name alone would not do: once freed, a test running beside may take it.
struct Identity {
    namespaces: Vec<(String, std::fs::File)>,
    links: Vec<(String, u32)>,
}

impl Identity {
    fn of(ns: &[String], links: &[String]) -> Identity {
        let namespaces = ns.iter().map(|n| (n.clone(), std::fs::File::open(format!("/run/netns/{n}")).unwrap())).collect();
        let index = |l: &String| std::fs::read_to_string(format!("/sys/class/net/{l}/ifindex")).unwrap().trim().parse().unwrap();
        Identity { namespaces, links: links.iter().map(|l| (l.clone(), index(l))).collect() }
    }

    fn of_cluster(c: &Cluster) -> Identity {
        let links: Vec<String> = (0..c.hosts()).map(|h| c.link_name(h)).chain([c.bridge_name()]).collect();
        Identity::of(&(0..c.hosts()).map(|h| c.ns_name(h)).collect::<Vec<_>>(), &links)
    }

    fn assert_gone(&self) {
        for (name, file) in &self.namespaces {
            let held = file.metadata().unwrap();
            if let Ok(now) = std::fs::metadata(format!("/run/netns/{name}")) {
                assert!((now.dev(), now.ino()) != (held.dev(), held.ino()), "namespace {name} is still there");
            }
        }
        let shown = String::from_utf8(Command::new("ip").args(["-o", "link", "show"]).output().unwrap().stdout).unwrap();
        let indices: Vec<u32> = shown.lines().filter_map(|l| l.split(':').next()?.trim().parse().ok()).collect();
        for (name, index) in &self.links {
            assert!(!indices.contains(index), "link {name} (index {index}) is still there:\n{shown}");
        }
    }
}

#[test]
fn hosts_reach_each_other_at_the_shaped_rate() {
    if netns::skip_unless_root() {
        return;
    }
    let rate: Rate = "100mbit".parse().unwrap();
    let cluster = create(Spec::hosts(2).rate(rate));
    let (mut sink, mut out) = start_role(cluster.command(0, std::env::current_exe().unwrap()), "sink");
    assert_eq!(expect_line(&mut out), "ready");
    // The child is the program itself, inside host 0's namespace.
    let pid = sink.id();
    assert_eq!(std::fs::read_link(format!("/proc/{pid}/exe")).unwrap(), std::env::current_exe().unwrap());
    assert_eq!(net_ns_id(&format!("/proc/{pid}/ns/net")), net_ns_id(&format!("/run/netns/{}", cluster.ns_name(0))));

    const BYTES: usize = 12_000_000;
    let before = (cluster.link_bytes(0).unwrap(), cluster.link_bytes(1).unwrap());
    let (took, answer) = std::thread::scope(|s| {
        s.spawn(|| {
            cluster.enter(1).unwrap();
            let mut conn = TcpStream::connect((cluster.addr(0), PORT)).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let chunk = vec![7u8; 1 << 20];
            let start = Instant::now();
            let mut left = BYTES;
            while left > 0 {
                let k = left.min(chunk.len());
                conn.write_all(&chunk[..k]).unwrap();
                left -= k;
            }
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            let mut answer = String::new();
            conn.read_to_string(&mut answer).unwrap();
            (start.elapsed(), answer)
        })
        .join()
        .unwrap()
    });
    assert_eq!(answer.trim(), BYTES.to_string());
    assert!(exit_of(&mut sink).success());

    let ideal = rate.time_for(BYTES as u64);
    let ratio = took.as_secs_f64() / ideal.as_secs_f64();
    println!("{BYTES} B at {rate}: {took:?}, {ratio:.3} of the rate's {ideal:?}");
    assert!((0.6..1.3).contains(&ratio), "{BYTES} B took {took:?}, {ratio:.2} × the {ideal:?} {rate} implies");

    // Both ends of both links are shaped; the bytes are counted per link.
    for h in 0..2 {
        let inside = Command::new("tc").args(["-n", &cluster.ns_name(h), "qdisc", "show", "dev", "eth0"]).output().unwrap();
        let outside = Command::new("tc").args(["qdisc", "show", "dev", &cluster.link_name(h)]).output().unwrap();
        for shown in [inside, outside] {
            assert!(String::from_utf8_lossy(&shown.stdout).contains("tbf"), "{shown:?}");
        }
    }
    let after = (cluster.link_bytes(0).unwrap(), cluster.link_bytes(1).unwrap());
    let (rx0, tx1) = (after.0.rx - before.0.rx, after.1.tx - before.1.tx);
    assert!(rx0 >= BYTES as u64 && tx1 >= BYTES as u64, "host 0 received {rx0} B, host 1 sent {tx1} B");
    assert!(rx0 < BYTES as u64 * 11 / 10, "host 0 received {rx0} B for {BYTES} B of payload");
}

#[test]
fn cut_link_stalls_silently_and_restore_resumes() {
    if netns::skip_unless_root() {
        return;
    }
    let cluster = create(Spec::hosts(2));
    let (mut echo, mut out) = start_role(cluster.command(0, std::env::current_exe().unwrap()), "echo");
    assert_eq!(expect_line(&mut out), "ready");
    let server = SocketAddr::from((cluster.addr(0), PORT));

    std::thread::scope(|s| {
        s.spawn(|| {
            cluster.enter(1).unwrap();
            let mut conn = TcpStream::connect(server).unwrap();
            let mut got = [0u8; 1];
            conn.write_all(b"a").unwrap();
            conn.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"a");

            cluster.cut_link(1).unwrap();
            // A send succeeds and its echo never comes, with no error on
            // the socket: a stall, not a failure.
            conn.write_all(b"b").unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let stalled = conn.read(&mut got).unwrap_err();
            assert!(matches!(stalled.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{stalled}");
            assert!(conn.take_error().unwrap().is_none());
            // Nothing local fails either: datagrams go, connects time out
            // rather than being refused or unreachable.
            let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
            assert_eq!(udp.send_to(b"x", (cluster.addr(0), 9)).unwrap(), 1);
            let refused = TcpStream::connect_timeout(&server, Duration::from_millis(300)).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::TimedOut, "{refused}");

            cluster.restore_link(1).unwrap();
            let restored = Instant::now();
            conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            conn.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"b");
            println!("the stalled echo came {:?} after the restore", restored.elapsed());
            conn.write_all(b"c").unwrap();
            conn.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"c");
        })
        .join()
        .unwrap()
    });
    // The connection was never dropped: the echo server saw its end.
    assert!(exit_of(&mut echo).success());
}

#[test]
fn drop_removes_everything_and_kills_what_ran_inside() {
    if netns::skip_unless_root() {
        return;
    }
    let cluster = create(Spec::hosts(2).rate("1gbit".parse().unwrap()));
    let identity = Identity::of_cluster(&cluster);
    let mut sleeper = cluster.command(1, "sleep").arg("1000").spawn().unwrap();
    let started = Instant::now();
    drop(cluster);
    println!("teardown took {:?}", started.elapsed());
    assert_eq!(exit_of(&mut sleeper).signal(), Some(9), "SIGKILL");
    identity.assert_gone();
}

#[test]
fn a_panic_with_a_cluster_in_scope_still_tears_it_down() {
    if netns::skip_unless_root() {
        return;
    }
    let identity = std::sync::Mutex::new(None);
    let result = std::panic::catch_unwind(|| {
        let cluster = create(Spec::hosts(2));
        *identity.lock().unwrap() = Some(Identity::of_cluster(&cluster));
        panic!("on purpose, with a cluster alive");
    });
    assert!(result.is_err());
    identity.into_inner().unwrap().expect("made before the panic").assert_gone();
}

#[test]
fn what_a_dead_owner_left_goes_at_the_next_create() {
    if netns::skip_unless_root() {
        return;
    }
    let (mut owner, mut out) = start_role(Command::new(std::env::current_exe().unwrap()), "leak");
    let said = expect_line(&mut out);
    let [ns, veth, bridge, pid]: [&str; 4] = said.split(' ').collect::<Vec<_>>().try_into().unwrap();
    // In place while its owner lives (and holds the subnet).
    let leaked = Identity::of(&[ns.to_owned()], &[veth.to_owned(), bridge.to_owned()]);
    // The owner exits without dropping its cluster.
    writeln!(owner.stdin.take().unwrap(), "go").unwrap();
    assert!(exit_of(&mut owner).success());
    assert!(std::fs::metadata(format!("/proc/{pid}")).is_ok(), "the leaked process should outlive its owner");

    // The next create sweeps it (this test's, or one running beside).
    drop(create(Spec::hosts(1)));
    leaked.assert_gone();
    // Its process was killed: gone or a zombie awaiting its reaper.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let alive = state.rsplit(") ").next().is_some_and(|rest| !rest.starts_with('Z'));
    assert!(!alive, "pid {pid} still runs: {state}");
}

#[test]
fn two_clusters_get_their_own_subnets_and_do_not_see_each_other() {
    if netns::skip_unless_root() {
        return;
    }
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| create(Spec::hosts(2)));
        let b = s.spawn(|| create(Spec::hosts(2)));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_ne!(a.addr(0).octets()[2], b.addr(0).octets()[2]);
    assert_ne!(a.bridge_name(), b.bridge_name());
    assert_ne!(a.ns_name(0), b.ns_name(0));

    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let b = &b;
        let listener = s.spawn(move || {
            b.enter(1).unwrap();
            let l = TcpListener::bind((b.addr(1), PORT)).unwrap();
            ready_tx.send(()).unwrap();
            l.accept().unwrap();
        });
        ready_rx.recv().unwrap();
        // From cluster a the listener does not exist: no route at all.
        s.spawn(|| {
            a.enter(0).unwrap();
            let e = TcpStream::connect_timeout(&SocketAddr::from((b.addr(1), PORT)), Duration::from_secs(2)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NetworkUnreachable, "{e}");
            // Its own neighbour answers (refused: nobody listens there).
            let e = TcpStream::connect_timeout(&SocketAddr::from((a.addr(1), PORT)), Duration::from_secs(2)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
        })
        .join()
        .unwrap();
        // From cluster b it does.
        s.spawn(|| {
            b.enter(0).unwrap();
            TcpStream::connect_timeout(&SocketAddr::from((b.addr(1), PORT)), Duration::from_secs(2)).unwrap();
        })
        .join()
        .unwrap();
        listener.join().unwrap();
    });
}
