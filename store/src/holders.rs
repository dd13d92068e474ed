//! The node's directory of which slave holds which block version in its
//! cache (DESIGN §6, caching): a hint for cached gets
//! (`wire::Op::GetCached`), never a source of data. A slave that was sent a
//! version's payload, or referred to a peer for it, is taken to hold it
//! from then on; a reader that finds a peer dead, or sent a version that
//! failed its checksum, says so in its next get and the peer is dropped
//! (everywhere, or for that version). A wrong entry costs the reader one
//! failed peer get and a fall back to the node, never a wrong block: the
//! reader checks what a peer sends against the header the node gave it
//! under its lock. Pure logic: `dataplane.rs` consults it, and a dequeue
//! near a slave scores tasks by how many of their inputs it holds.

use std::collections::HashMap;

use crate::keys::BlockKey;

/// Most blocks the directory remembers; past it, it forgets them all and
/// starts again (a hint: the cost is a round of gets from the node).
const MAX_ENTRIES: usize = 1 << 20;
/// Most holders remembered per version.
const MAX_HOLDERS: usize = 16;

#[derive(Default)]
pub(crate) struct Holders {
    /// Per block: the version's write stamp and who holds it.
    blocks: HashMap<BlockKey, (u64, Vec<String>)>,
    /// Rotates the choice among a version's holders, so that one peer is
    /// not asked for everything it holds.
    turn: usize,
}

impl Holders {
    /// `who` now holds `key`'s version `stamp`.
    pub(crate) fn holds(&mut self, key: BlockKey, stamp: u64, who: &str) {
        if stamp == 0 || who.is_empty() {
            return;
        }
        if self.blocks.len() >= MAX_ENTRIES && !self.blocks.contains_key(&key) {
            self.blocks.clear();
        }
        let entry = self.blocks.entry(key).or_insert_with(|| (stamp, Vec::new()));
        if entry.0 != stamp {
            *entry = (stamp, Vec::new());
        }
        if !entry.1.iter().any(|h| h == who) && entry.1.len() < MAX_HOLDERS {
            entry.1.push(who.to_owned());
        }
    }

    /// A holder of `key`'s version `stamp` other than `asker`, if any.
    pub(crate) fn peer_for(&mut self, key: BlockKey, stamp: u64, asker: &str) -> Option<String> {
        let (held, who) = self.blocks.get(&key)?;
        if *held != stamp {
            return None;
        }
        let others: Vec<&String> = who.iter().filter(|h| *h != asker).collect();
        if others.is_empty() {
            return None;
        }
        self.turn = self.turn.wrapping_add(1);
        Some(others[self.turn % others.len()].clone())
    }

    /// How many of a task's `inputs` (as [`pack_inputs`] packed them) `who`
    /// holds some version of: a hint, so a version newer than the one it
    /// holds counts too (its next read fetches the new one).
    pub(crate) fn score(&self, inputs: &[u8], who: &str) -> usize {
        inputs
            .chunks_exact(PACKED_KEY)
            .filter(|k| {
                let key = unpack(k);
                self.blocks.get(&key).is_some_and(|(_, holders)| holders.iter().any(|h| h == who))
            })
            .count()
    }

    /// `peer` did not answer: it holds nothing any more.
    pub(crate) fn forget_peer(&mut self, peer: &str) {
        for (_, who) in self.blocks.values_mut() {
            who.retain(|h| h != peer);
        }
    }

    /// `peer` failed `key`'s version: not asked for it again.
    pub(crate) fn forget_version(&mut self, key: BlockKey, peer: &str) {
        if let Some((_, who)) = self.blocks.get_mut(&key) {
            who.retain(|h| h != peer);
        }
    }
}

/// Bytes of one block key in a task's packed inputs.
const PACKED_KEY: usize = 24;

/// A task's inputs as the queue keeps them (`queue::Bags::enqueue_near`).
pub(crate) fn pack_inputs(inputs: &[BlockKey]) -> Vec<u8> {
    let mut out = Vec::with_capacity(inputs.len() * PACKED_KEY);
    for k in inputs {
        out.extend_from_slice(k.matrix.as_bytes());
        out.extend_from_slice(&k.i.to_le_bytes());
        out.extend_from_slice(&k.j.to_le_bytes());
    }
    out
}

fn unpack(b: &[u8]) -> BlockKey {
    let matrix = uuid::Uuid::from_slice(&b[..16]).expect("16 bytes");
    let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    BlockKey { matrix, i: word(16), j: word(20) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> BlockKey {
        BlockKey { matrix: uuid::Uuid::nil(), i, j: 0 }
    }

    #[test]
    fn a_holder_is_offered_only_for_its_version_and_never_to_itself() {
        let mut h = Holders::default();
        h.holds(key(1), 7, "a:1");
        assert_eq!(h.peer_for(key(1), 7, "a:1"), None, "not to itself");
        assert_eq!(h.peer_for(key(1), 7, "b:1").as_deref(), Some("a:1"));
        assert_eq!(h.peer_for(key(1), 8, "b:1"), None, "another version");
        h.holds(key(1), 8, "b:1");
        assert_eq!(h.peer_for(key(1), 7, "c:1"), None, "the old version's holders are gone");
        assert_eq!(h.peer_for(key(1), 8, "c:1").as_deref(), Some("b:1"));
        h.holds(key(1), 0, "c:1");
        assert_eq!(h.peer_for(key(1), 8, "b:1"), None, "an unstamped version is nobody's");
    }

    #[test]
    fn holders_take_turns_and_failed_peers_are_forgotten() {
        let mut h = Holders::default();
        for who in ["a", "b"] {
            h.holds(key(1), 7, who);
            h.holds(key(2), 9, who);
        }
        let picks: std::collections::HashSet<_> = (0..4).filter_map(|_| h.peer_for(key(1), 7, "c")).collect();
        assert_eq!(picks.len(), 2, "both holders are used");
        h.forget_version(key(1), "a");
        assert!((0..4).all(|_| h.peer_for(key(1), 7, "c").as_deref() == Some("b")));
        assert!((0..4).any(|_| h.peer_for(key(2), 9, "c").as_deref() == Some("a")), "a still serves another block");
        h.forget_peer("b");
        assert_eq!(h.peer_for(key(1), 7, "c"), None);
        assert_eq!(h.peer_for(key(2), 9, "c").as_deref(), Some("a"));
    }

    #[test]
    fn a_task_scores_the_inputs_its_asker_holds() {
        let mut h = Holders::default();
        let other = BlockKey { matrix: uuid::Uuid::from_u128(7), i: 1, j: 2 };
        h.holds(key(1), 7, "a");
        h.holds(key(2), 7, "a");
        h.holds(other, 3, "b");
        let task = pack_inputs(&[key(1), key(2), other, key(3)]);
        assert_eq!(unpack(&task[48..72]), other);
        assert_eq!(h.score(&task, "a"), 2);
        assert_eq!(h.score(&task, "b"), 1);
        assert_eq!(h.score(&task, "c"), 0);
        h.forget_peer("a");
        assert_eq!(h.score(&task, "a"), 0, "a forgotten peer holds nothing");
    }
}
