//! Test tier 1: BSPlib semantics, p = 1…8, processes as threads (each with
//! its own sockets and progress thread).

use bsp::{collectives, run_threads, BspError, Config};

fn cfg() -> Config {
    Config::new("test-token")
}

fn all_ok<R: std::fmt::Debug>(r: Vec<bsp::Result<R>>) -> Vec<R> {
    r.into_iter().enumerate().map(|(i, x)| x.unwrap_or_else(|e| panic!("process {i}: {e}"))).collect()
}

#[test]
fn gets_read_before_puts_land_and_puts_apply_in_order() {
    for p in 1..=8 {
        let r = run_threads(p, cfg(), |bsp| {
            let (me, p) = (bsp.pid(), bsp.nprocs());
            let x = bsp.push_reg(8);
            let got = bsp.push_reg(8);
            bsp.area_as_mut::<f64>(x)[0] = (me * 10) as f64;
            bsp.sync()?;
            let right = (me + 1) % p;
            // Same superstep: read right's x, and overwrite it twice.
            bsp.get(right, x, 0, got, 0, 8)?;
            bsp.put_slice(right, &[-1.0f64], x, 0)?;
            bsp.put_slice(right, &[999.0f64], x, 0)?;
            assert_eq!(bsp.area_as::<f64>(got)[0], 0.0, "get landed before sync");
            bsp.sync()?;
            Ok((bsp.area_as::<f64>(got)[0], bsp.area_as::<f64>(x)[0]))
        })
        .unwrap();
        for (me, (got, x)) in all_ok(r).into_iter().enumerate() {
            assert_eq!(got, (((me + 1) % p) * 10) as f64, "p={p} pid={me}: get saw a put of its own superstep");
            assert_eq!(x, 999.0, "p={p} pid={me}: later put must win");
        }
    }
}

#[test]
fn registration_takes_effect_at_the_next_sync() {
    let r = run_threads(3, cfg(), |bsp| {
        let a = bsp.push_reg(16);
        let early = bsp.put(0, &[1, 2], a, 0);
        assert!(matches!(early, Err(BspError::NotRegistered { .. })), "{early:?}");
        bsp.sync()?;
        bsp.put(0, &[7u8], a, bsp.pid())?;
        bsp.sync()?;
        let seen = bsp.area(a)[..3].to_vec();
        bsp.pop_reg(a);
        bsp.sync()?;
        let late = bsp.put(0, &[1], a, 0);
        assert!(matches!(late, Err(BspError::NotRegistered { .. })), "{late:?}");
        // Out of bounds at the destination: reported there, group intact.
        let b = bsp.push_reg(4);
        bsp.sync()?;
        if bsp.pid() == 1 {
            bsp.put(0, &[0u8; 8], b, 0)?;
        }
        let oob = bsp.sync();
        let oob_here = matches!(oob, Err(BspError::OutOfBounds { .. }));
        bsp.sync()?;
        Ok((seen, oob_here))
    })
    .unwrap();
    let r = all_ok(r);
    assert_eq!(r[0].0, vec![7, 7, 7]);
    assert_eq!(r.iter().map(|x| x.1).collect::<Vec<_>>(), vec![true, false, false]);
}

#[test]
fn bsmp_tags_and_queues() {
    for p in [1, 2, 5, 8] {
        let r = run_threads(p, cfg(), |bsp| {
            let (me, p) = (bsp.pid(), bsp.nprocs());
            assert_eq!(bsp.set_tagsize(4), 0);
            assert!(matches!(bsp.send(0, &[1, 2, 3, 4], b"x"), Err(BspError::BadTag { got: 4, want: 0 })));
            bsp.sync()?;
            for q in 0..p {
                bsp.send(q, &(me as u32).to_le_bytes(), &vec![q as u8; me + 1])?;
            }
            assert_eq!(bsp.qsize(), (0, 0), "messages visible before sync");
            bsp.sync()?;
            let (n, bytes) = bsp.qsize();
            let mut seen = Vec::new();
            while let Some((len, tag)) = bsp.get_tag() {
                let src = u32::from_le_bytes(tag.try_into().unwrap()) as usize;
                let payload = bsp.move_msg().unwrap();
                assert_eq!(payload.len(), len);
                assert_eq!(payload, vec![me as u8; src + 1]);
                seen.push(src);
            }
            bsp.sync()?;
            Ok((n, bytes, seen, bsp.qsize()))
        })
        .unwrap();
        for (n, bytes, mut seen, after) in all_ok(r) {
            assert_eq!(n, p);
            assert_eq!(bytes, p * (p + 1) / 2);
            seen.sort();
            assert_eq!(seen, (0..p).collect::<Vec<_>>());
            assert_eq!(after, (0, 0), "queue must be cleared by the next sync");
        }
    }
}

#[test]
fn hpput_reads_the_source_at_sync_and_moves_big_blocks() {
    for p in [2, 4] {
        let r = run_threads(p, cfg(), |bsp| {
            let (me, p) = (bsp.pid(), bsp.nprocs());
            let n = 1 << 20; // 1 MiB: the big-block path
            let src = bsp.push_reg(n);
            let dst = bsp.push_reg(n);
            bsp.sync()?;
            bsp.hpput((me + 1) % p, src, 0, dst, 0, n)?;
            // Written after the hpput call, before sync: this is what arrives.
            bsp.area_mut(src).iter_mut().enumerate().for_each(|(i, b)| *b = (i as u8) ^ me as u8);
            bsp.sync()?;
            let from = (me + p - 1) % p;
            Ok(bsp.area(dst).iter().enumerate().all(|(i, b)| *b == (i as u8) ^ from as u8))
        })
        .unwrap();
        assert!(all_ok(r).into_iter().all(|x| x), "p={p}");
    }
}

#[test]
fn abort_stops_every_process() {
    let r = run_threads(4, cfg(), |bsp| {
        bsp.sync()?;
        if bsp.pid() == 2 {
            return Err(bsp.abort("bad input"));
        }
        // Others keep syncing until the abort reaches them.
        loop {
            bsp.sync()?;
        }
        #[allow(unreachable_code)]
        Ok(())
    })
    .unwrap();
    for (pid, x) in r.into_iter().enumerate() {
        match x {
            Err(BspError::Aborted { pid: 2, message }) => assert_eq!(message, "bad input"),
            other => panic!("process {pid}: {other:?}"),
        }
    }
}

#[test]
fn collectives_agree() {
    for p in [1, 3, 8] {
        let r = run_threads(p, cfg(), |bsp| {
            let (me, p) = (bsp.pid(), bsp.nprocs());
            let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
            let root = p - 1;
            let two = collectives::broadcast_two_phase(bsp, root, if me == root { &data } else { &[] })?;
            let tree = collectives::broadcast_tree(bsp, root, if me == root { &data } else { &[] })?;
            let sum = collectives::allreduce(bsp, &[me as f64, 1.0], |a, b| a + b)?;
            let red = collectives::reduce(bsp, 0, &[me as f64], f64::max)?;
            let blocks: Vec<Vec<u8>> = (0..p).map(|q| vec![(me * 16 + q) as u8; q + 1]).collect();
            let te = collectives::total_exchange(bsp, &blocks)?;
            assert_eq!(two, data);
            assert_eq!(tree, data);
            assert_eq!(sum, vec![(p * (p - 1) / 2) as f64, p as f64]);
            if me == 0 {
                assert_eq!(red, vec![(p - 1) as f64]);
            }
            for (src, b) in te.iter().enumerate() {
                assert_eq!(b, &vec![(src * 16 + me) as u8; me + 1]);
            }
            Ok(())
        })
        .unwrap();
        all_ok(r);
    }
}
