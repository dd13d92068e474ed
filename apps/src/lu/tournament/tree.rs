//! The shape of a panel's reduction tree over its `m` blocks: level 0 has
//! a leaf per block, level `l` has `ceil(m / 2^l)` nodes, node `i` meeting
//! nodes `2i` and `2i + 1` of the level below. A leaf is no task: partial
//! pivoting of a block of at most `b` rows proposes every row, so its
//! parent reads the block itself (only when `m = 1` is the leaf the root,
//! and a task). A node with one child would only copy it, so it is no task
//! either: its parent reads its child's candidates. The root is at level
//! `ceil(log2 m)`.

/// A node of the tree: `(level, index within the level)`.
pub(crate) type Node = (u32, u32);

fn width(m: u32, level: u32) -> u32 {
    if level >= 32 {
        return 1;
    }
    m.div_ceil(1 << level)
}

/// The root's level.
pub(crate) fn height(m: u32) -> u32 {
    (0..).find(|&l| width(m, l) <= 1).unwrap_or(0)
}

/// Whether `(level, idx)` is a node that runs as a task.
pub(crate) fn is_task(m: u32, (level, idx): Node) -> bool {
    let h = height(m);
    idx < width(m, level) && (level == h || (level > 0 && 2 * idx + 1 < width(m, level - 1)))
}

/// The node that holds the candidates of `(level, idx)`: itself, the
/// child it would only copy, or a leaf (a block read whole).
pub(crate) fn holder(m: u32, (mut level, mut idx): Node) -> Node {
    while level > 0 && !is_task(m, (level, idx)) {
        level -= 1;
        idx *= 2;
    }
    (level, idx)
}

/// The two nodes whose candidates node `(level ≥ 1, idx)` meets: tasks, or
/// leaves (level 0: the block `idx`, all its rows).
pub(crate) fn children(m: u32, (level, idx): Node) -> [Node; 2] {
    [holder(m, (level - 1, 2 * idx)), holder(m, (level - 1, 2 * idx + 1))]
}

/// The task that meets the candidates of task `node` (not the root).
pub(crate) fn parent(m: u32, (mut level, mut idx): Node) -> Node {
    loop {
        level += 1;
        idx /= 2;
        if is_task(m, (level, idx)) {
            return (level, idx);
        }
    }
}

/// Every task of the tree, bottom up.
pub(crate) fn tasks(m: u32) -> Vec<Node> {
    (0..=height(m)).flat_map(|l| (0..width(m, l)).map(move |i| (l, i))).filter(|&n| is_task(m, n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_leaf_reaches_the_root_once() {
        for m in 1..40u32 {
            let h = height(m);
            assert!(is_task(m, (h, 0)), "m={m}");
            assert_eq!(width(m, h), 1);
            let all = tasks(m);
            // A binary tree with m leaves and only two-child inner nodes
            // has m − 1 of them; the leaves are tasks only alone.
            assert_eq!(all.len(), (m as usize - 1).max(1), "m={m}");
            let mut leaves: Vec<u32> =
                all.iter().filter(|n| n.0 > 0).flat_map(|&n| children(m, n)).filter(|c| c.0 == 0).map(|c| c.1).collect();
            leaves.sort_unstable();
            if m > 1 {
                assert_eq!(leaves, (0..m).collect::<Vec<_>>(), "m={m}: every block read once");
            }
            for &n in &all {
                if n != (h, 0) {
                    let up = parent(m, n);
                    assert!(children(m, up).contains(&n), "m={m} {n:?} → {up:?}");
                }
                if n.0 > 0 {
                    let [a, b] = children(m, n);
                    assert!(a != b && (is_task(m, a) || a.0 == 0) && (is_task(m, b) || b.0 == 0), "m={m} {n:?}");
                }
            }
        }
        assert_eq!(tasks(1), vec![(0, 0)]);
        assert_eq!(children(3, (2, 0)), [(1, 0), (0, 2)]);
    }
}
