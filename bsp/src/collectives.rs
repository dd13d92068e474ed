//! Collectives built from BSMP supersteps (`002…` §9, §13). Each one starts
//! with the caller's message queue empty and leaves it empty; each costs the
//! supersteps noted.

use crate::bsplib::Bsp;
use crate::error::Result;

fn f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8"))).collect()
}
fn bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Two-phase broadcast (scatter, then all-gather): 2 supersteps, cost about
/// `2·(n/p)·p·g + 2l`, the best for large `n`. Every process returns the data.
pub fn broadcast_two_phase(bsp: &mut Bsp, root: usize, data: &[u8]) -> Result<Vec<u8>> {
    let p = bsp.nprocs();
    let total = data.len();
    let chunk = total.div_ceil(p.max(1)).max(1);
    let old = bsp.set_tagsize(8);
    bsp.sync()?;
    if bsp.pid() == root {
        for q in 0..p {
            let lo = (q * chunk).min(total);
            let hi = ((q + 1) * chunk).min(total);
            bsp.send(q, &(total as u64).to_le_bytes(), &data[lo..hi])?;
        }
    }
    bsp.sync()?;
    let m = bsp.take_message().expect("scatter piece");
    let total = u64::from_le_bytes(m.tag[..8].try_into().expect("8")) as usize;
    let chunk = total.div_ceil(p.max(1)).max(1);
    for q in 0..p {
        bsp.send(q, &(bsp.pid() as u64).to_le_bytes(), &m.payload)?;
    }
    bsp.sync()?;
    let mut out = vec![0u8; total];
    while let Some(m) = bsp.take_message() {
        let q = u64::from_le_bytes(m.tag[..8].try_into().expect("8")) as usize;
        let lo = (q * chunk).min(total);
        out[lo..lo + m.payload.len()].copy_from_slice(&m.payload);
    }
    bsp.set_tagsize(old);
    bsp.sync()?;
    Ok(out)
}

/// Binomial-tree broadcast: `⌈log₂ p⌉` supersteps of one message each, the
/// best for small `n`.
pub fn broadcast_tree(bsp: &mut Bsp, root: usize, data: &[u8]) -> Result<Vec<u8>> {
    let p = bsp.nprocs();
    let me = (bsp.pid() + p - root) % p; // rank relative to root
    let old = bsp.set_tagsize(0);
    bsp.sync()?;
    let mut have: Option<Vec<u8>> = (me == 0).then(|| data.to_vec());
    let mut span = 1;
    while span < p {
        if let Some(d) = &have {
            if me < span && me + span < p {
                bsp.send((me + span + root) % p, &[], d)?;
            }
        }
        bsp.sync()?;
        if let Some(m) = bsp.move_msg() {
            have = Some(m);
        }
        span *= 2;
    }
    bsp.set_tagsize(old);
    bsp.sync()?;
    Ok(have.unwrap_or_default())
}

/// Element-wise reduction of `v` over all processes, result on every process:
/// one total exchange superstep (`002…` all-sums v2, `p·g + l`).
pub fn allreduce(bsp: &mut Bsp, v: &[f64], op: impl Fn(f64, f64) -> f64) -> Result<Vec<f64>> {
    let old = bsp.set_tagsize(8);
    bsp.sync()?;
    let b = bytes(v);
    for q in 0..bsp.nprocs() {
        bsp.send(q, &(bsp.pid() as u64).to_le_bytes(), &b)?;
    }
    bsp.sync()?;
    // Combine in pid order so every process gets bit-identical results.
    let mut parts: Vec<(u64, Vec<f64>)> = Vec::new();
    while let Some(m) = bsp.take_message() {
        parts.push((u64::from_le_bytes(m.tag[..8].try_into().expect("8")), f64s(&m.payload)));
    }
    parts.sort_by_key(|x| x.0);
    let mut acc = parts[0].1.clone();
    for (_, x) in &parts[1..] {
        for (a, b) in acc.iter_mut().zip(x) {
            *a = op(*a, *b);
        }
    }
    bsp.set_tagsize(old);
    bsp.sync()?;
    Ok(acc)
}

/// Reduction to `root` only (others get an empty vector).
pub fn reduce(bsp: &mut Bsp, root: usize, v: &[f64], op: impl Fn(f64, f64) -> f64) -> Result<Vec<f64>> {
    let old = bsp.set_tagsize(8);
    bsp.sync()?;
    bsp.send(root, &(bsp.pid() as u64).to_le_bytes(), &bytes(v))?;
    bsp.sync()?;
    let mut parts: Vec<(u64, Vec<f64>)> = Vec::new();
    while let Some(m) = bsp.take_message() {
        parts.push((u64::from_le_bytes(m.tag[..8].try_into().expect("8")), f64s(&m.payload)));
    }
    parts.sort_by_key(|x| x.0);
    let mut acc = Vec::new();
    if let Some((_, first)) = parts.first() {
        acc = first.clone();
        for (_, x) in &parts[1..] {
            for (a, b) in acc.iter_mut().zip(x) {
                *a = op(*a, *b);
            }
        }
    }
    bsp.set_tagsize(old);
    bsp.sync()?;
    Ok(acc)
}

/// Total exchange: `blocks[q]` goes to process `q`; returns what each
/// process sent here, by source pid. One superstep (`p·n·g + l`).
pub fn total_exchange(bsp: &mut Bsp, blocks: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
    let old = bsp.set_tagsize(8);
    bsp.sync()?;
    for (q, b) in blocks.iter().enumerate() {
        bsp.send(q, &(bsp.pid() as u64).to_le_bytes(), b)?;
    }
    bsp.sync()?;
    let mut out = vec![Vec::new(); bsp.nprocs()];
    while let Some(m) = bsp.take_message() {
        out[u64::from_le_bytes(m.tag[..8].try_into().expect("8")) as usize] = m.payload;
    }
    bsp.set_tagsize(old);
    bsp.sync()?;
    Ok(out)
}
