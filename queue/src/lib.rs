//! The recoverable queue (bag of tasks), with no I/O inside.
//!
//! A dequeue inside an action takes the first element no other action
//! holds; the element is removed for good only when the top-level action
//! commits, and returns to its old position if the action aborts, so the
//! next slave takes the lost work first (`003…` §4.1, DESIGN §5). The store
//! node persists what [`Mutation`]s say in the same synced batch as the
//! action's other writes, and rebuilds the index with [`Bags::load`] and
//! [`Bags::load_next_seq`] at start.
//!
//! ```
//! use actions::ActionId;
//! use queue::{Bags, Dequeue};
//! let mut bags = Bags::new(3);
//! bags.enqueue(ActionId(1), "work", b"t1".to_vec());
//! let changes = bags.prepare_commit(ActionId(1));
//! bags.finish_commit(ActionId(1), true);
//! assert_eq!(changes.len(), 2, "the element and the bag's next position");
//! let Dequeue::Task(t) = bags.dequeue(ActionId(2), "work") else { panic!() };
//! assert_eq!(t.payload, b"t1");
//! assert!(matches!(bags.dequeue(ActionId(3), "work"), Dequeue::NoneAvailable));
//! bags.abort(ActionId(2), false);
//! assert!(matches!(bags.dequeue(ActionId(3), "work"), Dequeue::Task(_)));
//! ```
//!
//! An element may carry a rank ([`ranked`]): free elements are handed out
//! lowest rank first, then by position, so a dag can put its critical path
//! ahead of work released earlier, and off-path work (a tournament LU's
//! left swaps) behind it. An element without one ranks [`UNRANKED`], after
//! every ranked element; a bag of such elements is FIFO. An aborted element
//! goes back to its old position within its rank. The rank travels in the
//! payload (the store persists payloads as they are, so a restarted node
//! keeps it), and dequeues hand the payload out without it.

use std::collections::{BTreeMap, HashMap};

use actions::ActionId;

/// An element handed to an action by [`Bags::dequeue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dequeued {
    pub bag: String,
    pub seq: u64,
    pub payload: Vec<u8>,
    /// Times an action holding this element was orphaned (its slave died).
    pub attempts: u32,
    /// Times an action holding it aborted on purpose (e.g. a flag wait timed
    /// out); kept in memory only, to let such tasks back off.
    pub returns: u32,
}

/// The three answers of a dequeue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dequeue {
    Task(Dequeued),
    /// No elements at all: the bag is done.
    Empty,
    /// Elements remain but other actions hold them all, or a commit that
    /// adds them is still being written: wait.
    NoneAvailable,
}

/// A change the store must make durable, keyed by bag and sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    Put {
        bag: String,
        seq: u64,
        payload: Vec<u8>,
        attempts: u32,
    },
    Delete {
        bag: String,
        seq: u64,
    },
    /// The bag hands out sequence numbers from `next` on: the store keeps
    /// the largest it was told, so that a restart never reuses the number
    /// of an element already taken and committed (a task's records are
    /// keyed by it).
    NextSeq {
        bag: String,
        next: u64,
    },
}

/// What an abort did to the queues.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct QueueAbort {
    /// Attempt counts and dead-letter moves to persist (orphans only).
    pub mutations: Vec<Mutation>,
    /// Elements moved to a dead-letter bag: (from bag, element).
    pub dead_lettered: Vec<(String, Dequeued)>,
    /// Bags whose free elements changed: wake their blocked dequeuers.
    pub touched: Vec<String>,
}

/// Counts for one bag, for status displays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BagStats {
    pub free: usize,
    pub taken: usize,
}

/// How many free elements from a bag's head [`Bags::dequeue_nearest`]
/// looks at: enough to find a task whose inputs a slave holds among a few
/// block rows of a multiply, few enough that a dequeue stays cheap.
pub const LOCALITY_WINDOW: usize = 64;

/// The rank of an element enqueued without one.
pub const UNRANKED: u32 = u32::MAX;

/// Opens a ranked payload: no payload of the apps (JSON) or of tests
/// starts with a NUL byte.
const RANK_TAG: [u8; 4] = *b"\0rk:";

/// `payload` as an element of rank `rank` (lower ranks are dequeued first).
pub fn ranked(rank: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(RANK_TAG.len() + 4 + payload.len());
    v.extend_from_slice(&RANK_TAG);
    v.extend_from_slice(&rank.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// An element's rank and its payload without the rank.
pub fn split_rank(stored: &[u8]) -> (u32, &[u8]) {
    match stored.strip_prefix(&RANK_TAG[..]) {
        Some(&[a, b, c, d, ref rest @ ..]) => (u32::from_be_bytes([a, b, c, d]), rest),
        _ => (UNRANKED, stored),
    }
}

/// The dead-letter bag of a bag.
pub fn dead_letter_bag(bag: &str) -> String {
    format!("{bag}.dead")
}

#[derive(Clone, Debug)]
struct Entry {
    /// As enqueued and persisted: with its rank, if it has one.
    payload: Vec<u8>,
    attempts: u32,
    returns: u32,
    /// What [`Bags::dequeue_nearest`] scores: the inputs the task reads,
    /// packed by the caller. In memory only: after a restart the bag hands
    /// its elements out in order, which is always allowed.
    locality: Box<[u8]>,
}

impl Entry {
    fn new(payload: Vec<u8>, attempts: u32) -> Self {
        Entry { payload, attempts, returns: 0, locality: Box::default() }
    }

    /// Where it waits among the free elements: by rank, then position.
    fn key(&self, seq: u64) -> (u32, u64) {
        (split_rank(&self.payload).0, seq)
    }

    /// The payload handed out: without its rank.
    fn handed_out(&self) -> Vec<u8> {
        split_rank(&self.payload).1.to_vec()
    }
}

#[derive(Debug, Default)]
struct Bag {
    /// Free elements by rank and position: the first is the next to hand
    /// out, so a dequeue costs O(log n) whatever the queue length.
    free: BTreeMap<(u32, u64), Entry>,
    taken: HashMap<u64, (ActionId, Entry)>,
    /// Elements of commits whose batch is being written: the store may
    /// already show what those commits wrote (a job record, say) while the
    /// elements are not free yet, and a bag with such elements is not empty.
    incoming: usize,
    next_seq: u64,
}

impl Bag {
    fn put_free(&mut self, seq: u64, entry: Entry) {
        self.free.insert(entry.key(seq), entry);
    }

    fn is_empty(&self) -> bool {
        self.free.is_empty() && self.taken.is_empty() && self.incoming == 0
    }
}

#[derive(Debug, Default)]
struct Commit {
    deletes: Vec<(String, u64)>,
    puts: Vec<(String, u64, Entry)>,
}

/// An enqueue waiting for its action's commit.
#[derive(Debug)]
struct Pending {
    bag: String,
    entry: Entry,
}

/// All bags of a store node, and which action holds what.
#[derive(Debug)]
pub struct Bags {
    bags: HashMap<String, Bag>,
    held: HashMap<ActionId, Vec<(String, u64)>>,
    pending: HashMap<ActionId, Vec<Pending>>,
    committing: HashMap<ActionId, Commit>,
    attempt_limit: u32,
}

impl Bags {
    /// `attempt_limit`: orphanings after which an element is dead-lettered.
    pub fn new(attempt_limit: u32) -> Self {
        Bags {
            bags: HashMap::new(),
            held: HashMap::new(),
            pending: HashMap::new(),
            committing: HashMap::new(),
            attempt_limit: attempt_limit.max(1),
        }
    }

    /// Restores a bag's persisted [`Mutation::NextSeq`] at start.
    pub fn load_next_seq(&mut self, bag: &str, next: u64) {
        let b = self.bags.entry(bag.to_owned()).or_default();
        b.next_seq = b.next_seq.max(next);
    }

    /// Restores one persisted element at start.
    pub fn load(&mut self, bag: &str, seq: u64, payload: Vec<u8>, attempts: u32) {
        let b = self.bags.entry(bag.to_owned()).or_default();
        b.next_seq = b.next_seq.max(seq + 1);
        b.put_free(seq, Entry::new(payload, attempts));
    }

    pub fn dequeue(&mut self, action: ActionId, bag: &str) -> Dequeue {
        let Some(b) = self.bags.get_mut(bag) else { return Dequeue::Empty };
        let Some(((_, seq), entry)) = b.free.pop_first() else {
            return if b.is_empty() { Dequeue::Empty } else { Dequeue::NoneAvailable };
        };
        self.hand_out(action, bag, seq, entry)
    }

    /// Dequeues the element whose inputs the caller holds most of, by
    /// `score` of each element's locality (see [`Bags::enqueue_near`]),
    /// among the first [`LOCALITY_WINDOW`] free elements; the earliest wins
    /// a tie. The bag's order still rules where it matters: an element
    /// enqueued without locality is never passed over (the scan stops at
    /// it), nor is a first element that came back from an aborted action
    /// (lost work is redone first), so bags whose order carries meaning
    /// (a Cholesky column order, a barrier's last task) dequeue as
    /// [`Bags::dequeue`] does.
    pub fn dequeue_nearest(&mut self, action: ActionId, bag: &str, score: &mut dyn FnMut(&[u8]) -> usize) -> Dequeue {
        let Some(b) = self.bags.get_mut(bag) else { return Dequeue::Empty };
        let mut best: Option<((u32, u64), usize)> = None;
        for (n, (&key, e)) in b.free.iter().enumerate() {
            let returned = n == 0 && (e.attempts > 0 || e.returns > 0);
            if e.locality.is_empty() || returned || n == LOCALITY_WINDOW {
                break;
            }
            let s = score(&e.locality);
            if best.is_none_or(|(_, top)| s > top) {
                best = Some((key, s));
            }
        }
        let picked = match best {
            Some((key, _)) => b.free.remove_entry(&key),
            None => b.free.pop_first(),
        };
        let Some(((_, seq), entry)) = picked else {
            return if b.is_empty() { Dequeue::Empty } else { Dequeue::NoneAvailable };
        };
        self.hand_out(action, bag, seq, entry)
    }

    fn hand_out(&mut self, action: ActionId, bag: &str, seq: u64, entry: Entry) -> Dequeue {
        let b = self.bags.get_mut(bag).expect("the element's bag exists");
        let out = Dequeued { bag: bag.to_owned(), seq, payload: entry.handed_out(), attempts: entry.attempts, returns: entry.returns };
        b.taken.insert(seq, (action, entry));
        self.held.entry(action).or_default().push((bag.to_owned(), seq));
        Dequeue::Task(out)
    }

    /// Enqueues at the tail (of its rank, [`ranked`]); visible when the
    /// top-level action commits.
    pub fn enqueue(&mut self, action: ActionId, bag: &str, payload: Vec<u8>) {
        self.enqueue_near(action, bag, payload, Vec::new());
    }

    /// Enqueues with a locality: what the task reads, in a form the
    /// caller's [`Bags::dequeue_nearest`] scores (empty: none).
    pub fn enqueue_near(&mut self, action: ActionId, bag: &str, payload: Vec<u8>, locality: Vec<u8>) {
        let entry = Entry { locality: locality.into_boxed_slice(), ..Entry::new(payload, 0) };
        self.pending.entry(action).or_default().push(Pending { bag: bag.to_owned(), entry });
    }

    /// A nested action committed: its parent now holds its elements and
    /// pending enqueues.
    pub fn commit_nested(&mut self, child: ActionId, parent: ActionId) {
        if let Some(held) = self.held.remove(&child) {
            for (bag, seq) in &held {
                if let Some((owner, _)) = self.bags.get_mut(bag).and_then(|b| b.taken.get_mut(seq)) {
                    *owner = parent;
                }
            }
            self.held.entry(parent).or_default().extend(held);
        }
        if let Some(p) = self.pending.remove(&child) {
            self.pending.entry(parent).or_default().extend(p);
        }
    }

    /// Returns the action's elements to their old positions and drops its
    /// enqueues. `orphaned`: the action died with its session, which counts
    /// as an attempt; past the limit the element goes to the dead-letter bag.
    pub fn abort(&mut self, action: ActionId, orphaned: bool) -> QueueAbort {
        self.pending.remove(&action);
        let mut out = QueueAbort::default();
        for (bag, seq) in self.held.remove(&action).unwrap_or_default() {
            let b = self.bags.get_mut(&bag).expect("held element's bag exists");
            let (_, mut entry) = b.taken.remove(&seq).expect("held element is taken");
            if !orphaned {
                entry.returns += 1;
            } else {
                entry.attempts += 1;
                if entry.attempts >= self.attempt_limit {
                    let dead = dead_letter_bag(&bag);
                    let d = self.bags.entry(dead.clone()).or_default();
                    let dseq = d.next_seq;
                    d.next_seq += 1;
                    out.mutations.push(Mutation::Delete { bag: bag.clone(), seq });
                    out.mutations.push(Mutation::Put {
                        bag: dead.clone(),
                        seq: dseq,
                        payload: entry.payload.clone(),
                        attempts: entry.attempts,
                    });
                    out.mutations.push(Mutation::NextSeq { bag: dead.clone(), next: d.next_seq });
                    out.dead_lettered.push((
                        bag.clone(),
                        Dequeued {
                            bag: dead.clone(),
                            seq: dseq,
                            payload: entry.handed_out(),
                            attempts: entry.attempts,
                            returns: entry.returns,
                        },
                    ));
                    d.put_free(dseq, entry);
                    out.touched.push(bag);
                    out.touched.push(dead);
                    continue;
                }
                out.mutations.push(Mutation::Put { bag: bag.clone(), seq, payload: entry.payload.clone(), attempts: entry.attempts });
            }
            self.bags.get_mut(&bag).expect("exists").put_free(seq, entry);
            out.touched.push(bag);
        }
        out.touched.sort();
        out.touched.dedup();
        out
    }

    /// First half of a top-level commit: the removals and the new tail
    /// elements (their positions are reserved now) to write in the batch.
    pub fn prepare_commit(&mut self, action: ActionId) -> Vec<Mutation> {
        let mut c = Commit { deletes: self.held.remove(&action).unwrap_or_default(), puts: Vec::new() };
        for Pending { bag, entry } in self.pending.remove(&action).unwrap_or_default() {
            let b = self.bags.entry(bag.clone()).or_default();
            let seq = b.next_seq;
            b.next_seq += 1;
            b.incoming += 1;
            c.puts.push((bag, seq, entry));
        }
        let mut out: Vec<Mutation> = c.deletes.iter().map(|(bag, seq)| Mutation::Delete { bag: bag.clone(), seq: *seq }).collect();
        out.extend(c.puts.iter().map(|(bag, seq, entry)| Mutation::Put {
            bag: bag.clone(),
            seq: *seq,
            payload: entry.payload.clone(),
            attempts: 0,
        }));
        let mut grown: Vec<&String> = c.puts.iter().map(|(bag, _, _)| bag).collect();
        grown.sort();
        grown.dedup();
        out.extend(grown.into_iter().map(|bag| Mutation::NextSeq { bag: bag.clone(), next: self.bags[bag].next_seq }));
        self.committing.insert(action, c);
        out
    }

    /// Second half: applies the commit in memory once it is durable, or
    /// undoes it as an abort if the batch failed. Returns the bags touched.
    pub fn finish_commit(&mut self, action: ActionId, durable: bool) -> Vec<String> {
        let Some(c) = self.committing.remove(&action) else { return Vec::new() };
        let mut touched = Vec::new();
        for (bag, seq) in c.deletes {
            let b = self.bags.get_mut(&bag).expect("exists");
            let (_, entry) = b.taken.remove(&seq).expect("taken by the committing action");
            if !durable {
                b.put_free(seq, entry);
            }
            touched.push(bag);
        }
        for (bag, seq, entry) in c.puts {
            let b = self.bags.get_mut(&bag).expect("reserved");
            b.incoming -= 1;
            if durable {
                b.put_free(seq, entry);
            }
            touched.push(bag);
        }
        touched.sort();
        touched.dedup();
        touched
    }

    pub fn stats(&self, bag: &str) -> BagStats {
        self.bags.get(bag).map_or_else(BagStats::default, |b| BagStats { free: b.free.len(), taken: b.taken.len() })
    }

    /// Whether the bag has no elements at all.
    pub fn is_empty(&self, bag: &str) -> bool {
        self.bags.get(bag).is_none_or(Bag::is_empty)
    }

    /// Every element an action holds: (action, bag, seq), in no order.
    pub fn held(&self) -> impl Iterator<Item = (ActionId, &str, u64)> + '_ {
        self.held.iter().flat_map(|(a, els)| els.iter().map(move |(bag, seq)| (*a, bag.as_str(), *seq)))
    }

    /// Names of the bags that hold or held elements.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.bags.keys().cloned().collect();
        v.sort();
        v
    }

    /// Payloads of a bag's elements by position (free and taken).
    pub fn peek_all(&self, bag: &str) -> Vec<Dequeued> {
        let Some(b) = self.bags.get(bag) else { return Vec::new() };
        let record =
            |seq: u64, e: &Entry| Dequeued { bag: bag.to_owned(), seq, payload: e.handed_out(), attempts: e.attempts, returns: e.returns };
        let mut v: Vec<_> = b.free.iter().map(|((_, s), e)| record(*s, e)).collect();
        v.extend(b.taken.iter().map(|(s, (_, e))| record(*s, e)));
        v.sort_by_key(|d| d.seq);
        v
    }
}

#[cfg(test)]
mod tests;
