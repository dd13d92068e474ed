//! Test tier 4: foreign clients speaking garbage, truncated hellos, a wrong
//! token, and an authenticated peer sending garbage frames. Each gets a clear
//! error; the group still forms and works.

use std::io::{Read, Write};
use std::net::TcpStream;

use bsp::{Bsp, BspError, Config, Endpoint};

fn hello(token: &[u8], pid: u32, nprocs: u32) -> Vec<u8> {
    // The documented hello layout (wire/handshake.rs).
    let mut b = b"BSPH".to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&(token.len() as u16).to_le_bytes());
    b.extend_from_slice(token);
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&nprocs.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b
}

/// Forms the group of `eps` (token "tok"), each process on a thread of
/// its own running `body`, and returns each one's result, by pid.
fn form_group<R: Send + 'static>(eps: Vec<Endpoint>, hosts: &[String], body: fn(&mut Bsp, usize) -> Result<R, BspError>) -> Vec<R> {
    let handles: Vec<_> = eps
        .into_iter()
        .enumerate()
        .map(|(pid, ep)| {
            let hosts = hosts.to_vec();
            std::thread::spawn(move || {
                let mut bsp = Bsp::connect(ep, &hosts, pid, Config::new("tok"))?;
                let r = body(&mut bsp, pid)?;
                bsp.end();
                Ok::<_, BspError>(r)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
}

#[test]
fn foreign_clients_are_refused_and_the_group_still_forms() {
    let p = 3;
    let eps: Vec<Endpoint> = (0..p).map(|_| Endpoint::bind("127.0.0.1:0").unwrap()).collect();
    let hosts: Vec<String> = eps.iter().map(|e| e.local_addr().to_string()).collect();
    // Foreign clients reach process 0's listener before its real peers.
    let target = eps[0].local_addr();
    let mut garbage = TcpStream::connect(target).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut truncated = TcpStream::connect(target).unwrap();
    truncated.write_all(&hello(b"tok", 1, 3)[..7]).unwrap();
    truncated.shutdown(std::net::Shutdown::Write).unwrap();
    let mut wrong = TcpStream::connect(target).unwrap();
    wrong.write_all(&hello(b"not-the-token", 1, 3)).unwrap();

    let results = form_group(eps, &hosts, |bsp, pid| {
        let a = bsp.push_reg(8 * 3);
        bsp.sync()?;
        for q in 0..3 {
            bsp.put_slice(q, &[pid as f64 + 1.0], a, pid)?;
        }
        bsp.sync()?;
        Ok(bsp.area_as::<f64>(a).to_vec())
    });
    for v in results {
        assert_eq!(v, vec![1.0, 2.0, 3.0]);
    }
    // The wrong token got a verdict byte saying so (1 = bad token).
    let mut v = [0u8; 1];
    wrong.read_exact(&mut v).unwrap();
    assert_eq!(v[0], 1);
    // The others were simply closed.
    let mut rest = Vec::new();
    let _ = garbage.read_to_end(&mut rest);
    assert!(rest.is_empty());
}

/// A connection that says nothing holds up no other: the group forms
/// while its hello is still awaited (up to 5 s).
#[test]
fn a_silent_connection_does_not_hold_up_forming_the_group() {
    let p = 3;
    let eps: Vec<Endpoint> = (0..p).map(|_| Endpoint::bind("127.0.0.1:0").unwrap()).collect();
    let hosts: Vec<String> = eps.iter().map(|e| e.local_addr().to_string()).collect();
    let _silent = TcpStream::connect(eps[0].local_addr()).unwrap();
    let started = std::time::Instant::now();
    form_group(eps, &hosts, |bsp, _| bsp.sync());
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(3), "forming waited on the silent connection: {took:?}");
}

#[test]
fn an_authenticated_peer_sending_garbage_frames_is_a_clear_error() {
    let ep0 = Endpoint::bind("127.0.0.1:0").unwrap();
    let hosts = vec![ep0.local_addr().to_string(), "127.0.0.1:9".to_string()];
    let addr = ep0.local_addr();
    let t = std::thread::spawn(move || {
        let mut bsp = Bsp::connect(ep0, &hosts, 0, Config::new("tok"))?;
        bsp.sync()
    });
    // Pretend to be process 1: a valid hello, then garbage instead of frames.
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) => std::thread::yield_now(),
        }
    };
    s.write_all(&hello(b"tok", 1, 2)).unwrap();
    let mut v = [0u8; 1];
    s.read_exact(&mut v).unwrap();
    assert_eq!(v[0], 0, "valid hello accepted");
    s.write_all(&[0xde; 64]).unwrap();
    let err = t.join().unwrap().unwrap_err();
    match &err {
        BspError::PeerLost { pid: 1, reason } => assert!(reason.contains("protocol error") && reason.contains("magic"), "{reason}"),
        e => panic!("{e:?}"),
    }
    assert!(err.is_retryable());
}
