//! Test tier 2: everyone floods everyone with a tiny send budget (`000…`
//! §5.3): it must terminate with every byte delivered exactly once and in
//! order, under each schedule.

use bsp::{run_threads, Config, Schedule};
use rand::{Rng, SeedableRng};

#[test]
fn all_to_all_flood_with_tiny_budget() {
    for schedule in [Schedule::LatinSquare, Schedule::Naive, Schedule::Eager] {
        let t0 = std::time::Instant::now();
        let mut cfg = Config::new("flood");
        cfg.budget = 4096;
        cfg.big_threshold = 2048;
        cfg.schedule = schedule;
        let p = 6;
        let seed = 0x5eed_u64;
        let r = run_threads(p, cfg, move |bsp| {
            let (me, p) = (bsp.pid(), bsp.nprocs());
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed + me as u64);
            bsp.set_tagsize(8);
            // Per destination: a region for big puts from each source.
            let big = bsp.push_reg(p * 64 * 1024);
            bsp.sync()?;
            for step in 0..4u64 {
                let mut expect_big = vec![0u8; 0];
                for q in 0..p {
                    // Many small messages with sequence numbers…
                    for k in 0..200u64 {
                        let mut tag = (me as u64).to_le_bytes().to_vec();
                        tag.truncate(8);
                        let payload = [step.to_le_bytes(), k.to_le_bytes()].concat();
                        bsp.send(q, &tag, &payload)?;
                    }
                    // …and a big put, far larger than the budget.
                    let len = rng.gen_range(10_000..64 * 1024);
                    let block: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + step + me as u64 * 7) as u8).collect();
                    bsp.put(q, &block, big, me * 64 * 1024)?;
                    expect_big.clear();
                }
                bsp.sync()?;
                let mut next = vec![0u64; p];
                while let Some(m) = bsp.take_message() {
                    let src = u64::from_le_bytes(m.tag[..8].try_into().unwrap()) as usize;
                    let st = u64::from_le_bytes(m.payload[..8].try_into().unwrap());
                    let k = u64::from_le_bytes(m.payload[8..16].try_into().unwrap());
                    assert_eq!((st, k), (step, next[src]), "from {src}: out of order or duplicated");
                    next[src] += 1;
                }
                assert_eq!(next, vec![200; p], "step {step}: messages missing");
                let area = bsp.area(big);
                for src in 0..p {
                    let region = &area[src * 64 * 1024..src * 64 * 1024 + 10_000];
                    assert!(
                        region.iter().enumerate().all(|(i, b)| *b == (i as u64 * 31 + step + src as u64 * 7) as u8),
                        "step {step}: big block from {src} corrupt"
                    );
                }
            }
            Ok(())
        })
        .unwrap();
        for (i, x) in r.into_iter().enumerate() {
            x.unwrap_or_else(|e| panic!("{schedule:?} process {i}: {e} (seed {seed})"));
        }
        eprintln!("{schedule:?}: {:?}", t0.elapsed());
    }
}
