use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

use crate::{deadlock, ActionError, ActionId, SessionId};

/// How an action holds an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Shared; the committed state may be read.
    Read,
    /// Exclusive; the old state may be read before it is replaced.
    Write,
    /// Exclusive; the old state is never read, so a block writer never pays
    /// to fetch the block it replaces.
    Overwrite,
}

impl LockMode {
    fn is_exclusive(self) -> bool {
        !matches!(self, LockMode::Read)
    }

    /// The mode held after holding `self` and being granted `other`. Having
    /// read and then overwritten is a write: the old state was seen.
    fn join(self, other: LockMode) -> LockMode {
        use LockMode::*;
        match (self, other) {
            (Read, Read) => Read,
            (Overwrite, Overwrite) => Overwrite,
            (Read, Overwrite) | (Overwrite, Read) | (Write, _) | (_, Write) => Write,
        }
    }

    fn conflicts(self, other: LockMode) -> bool {
        self.is_exclusive() || other.is_exclusive()
    }
}

/// The answer to a lock request that did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    Granted,
    /// Another action holds a conflicting lock: wait for a wake-up naming
    /// this action, then ask again (or give up with [`Manager::cancel_wait`]).
    Wait,
}

/// Where an action finds the state of an object it has locked.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a, V> {
    /// Written by the action or an ancestor: read your own writes.
    Tentative(&'a V),
    /// Not written in this action tree: read the committed state.
    Committed,
}

/// The write set of a top-level action, in key order, for one durable batch.
#[derive(Debug)]
pub struct CommitSet<K, V> {
    pub writes: Vec<(K, V)>,
}

/// What an abort undid: the actions ended (the action and its nested
/// actions), their dropped tentative states (the store may hold staged data
/// for them) and the actions to wake because locks were freed.
#[derive(Debug)]
pub struct Aborted<K, V> {
    pub actions: Vec<ActionId>,
    pub dropped: Vec<(K, V)>,
    pub woken: Vec<ActionId>,
}

/// What a nested commit did: the parent now owns the locks and states;
/// `superseded` are parent states replaced by the child's, `woken` are
/// waiters that may now be compatible.
#[derive(Debug)]
pub struct NestedCommit<V> {
    pub parent: ActionId,
    pub superseded: Vec<V>,
    pub woken: Vec<ActionId>,
}

#[derive(Debug)]
pub(crate) struct ActionState<K, V> {
    pub(crate) session: SessionId,
    pub(crate) parent: Option<ActionId>,
    pub(crate) children: HashSet<ActionId>,
    held: HashMap<K, LockMode>,
    tentative: BTreeMap<K, V>,
    /// Keys this action waits for. Usually one; several when its client
    /// sends requests concurrently (a slave's prefetches and writes beside
    /// the task's own requests), each wait on its own key.
    pub(crate) waiting_on: Vec<(K, LockMode)>,
    committing: bool,
}

#[derive(Debug, Default)]
pub(crate) struct LockEntry {
    pub(crate) holders: Vec<(ActionId, LockMode)>,
    waiters: Vec<ActionId>,
}

/// The lock manager and action tree of one store node.
#[derive(Debug)]
pub struct Manager<K, V> {
    pub(crate) actions: HashMap<ActionId, ActionState<K, V>>,
    pub(crate) locks: HashMap<K, LockEntry>,
    by_session: HashMap<SessionId, HashSet<ActionId>>,
    next_id: u64,
}

impl<K, V> Default for Manager<K, V>
where
    K: Clone + Eq + Hash + Ord + Debug,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> Manager<K, V>
where
    K: Clone + Eq + Hash + Ord + Debug,
{
    pub fn new() -> Self {
        Self::with_first_id(1)
    }

    /// Ids start at `first`. A store node seeds this from a persisted boot
    /// counter so ids of actions lost in a restart are never handed out
    /// again: a zombie naming one still gets `Aborted`.
    pub fn with_first_id(first: u64) -> Self {
        Manager { actions: HashMap::new(), locks: HashMap::new(), by_session: HashMap::new(), next_id: first }
    }

    /// Begins a top-level action (`parent: None`) or a nested one. A nested
    /// top-level action (`003…` §2.4.7) is simply `begin(session, None)`
    /// called while another action of the session runs: it commits on its own.
    pub fn begin(&mut self, session: SessionId, parent: Option<ActionId>) -> Result<ActionId, ActionError> {
        let session = match parent {
            Some(p) => self.running(p)?.session,
            None => session,
        };
        let id = ActionId(self.next_id);
        self.next_id += 1;
        match parent {
            Some(p) => {
                self.actions.get_mut(&p).expect("checked above").children.insert(id);
            }
            None => {
                self.by_session.entry(session).or_default().insert(id);
            }
        }
        self.actions.insert(
            id,
            ActionState {
                session,
                parent,
                children: HashSet::new(),
                held: HashMap::new(),
                tentative: BTreeMap::new(),
                waiting_on: Vec::new(),
                committing: false,
            },
        );
        Ok(id)
    }

    /// Checks that `action` can still act; the error is the fence.
    pub fn check(&self, action: ActionId) -> Result<(), ActionError> {
        self.running(action).map(|_| ())
    }

    pub fn session_of(&self, action: ActionId) -> Option<SessionId> {
        self.actions.get(&action).map(|a| a.session)
    }

    pub fn parent_of(&self, action: ActionId) -> Option<ActionId> {
        self.actions.get(&action).and_then(|a| a.parent)
    }

    pub fn n_actions(&self) -> usize {
        self.actions.len()
    }

    /// Number of running actions (all levels) of a session.
    pub fn n_actions_of(&self, session: SessionId) -> usize {
        self.actions.values().filter(|a| a.session == session).count()
    }

    fn running(&self, action: ActionId) -> Result<&ActionState<K, V>, ActionError> {
        match self.actions.get(&action) {
            None => Err(ActionError::Aborted { action }),
            Some(a) if a.committing => Err(ActionError::Committing { action }),
            Some(a) => Ok(a),
        }
    }

    pub(crate) fn is_ancestor_or_self(&self, ancestor: ActionId, mut action: ActionId) -> bool {
        loop {
            if action == ancestor {
                return true;
            }
            match self.actions.get(&action).and_then(|a| a.parent) {
                Some(p) => action = p,
                None => return false,
            }
        }
    }

    /// Holders of `key` that keep `action` from taking it in `mode`.
    pub fn conflicting_holders(&self, action: ActionId, key: &K, mode: LockMode) -> Vec<ActionId> {
        let Some(entry) = self.locks.get(key) else { return Vec::new() };
        entry.holders.iter().filter(|&&(h, held)| held.conflicts(mode) && !self.is_ancestor_or_self(h, action)).map(|&(h, _)| h).collect()
    }

    /// Asks for `key` in `mode`. A conflict either closes a wait-for cycle
    /// (fails now with `Deadlock`) or leaves the action waiting.
    pub fn lock(&mut self, action: ActionId, key: K, mode: LockMode) -> Result<Lock, ActionError> {
        self.running(action)?;
        // Only this request's own earlier wait ends here: a grant must not
        // withdraw the action's concurrent wait on another key, or that
        // waiter would miss its wake-up and sit out the lock timeout.
        self.cancel_wait_on(action, &key);
        let blockers = self.conflicting_holders(action, &key, mode);
        if blockers.is_empty() {
            let entry = self.locks.entry(key.clone()).or_default();
            match entry.holders.iter_mut().find(|(h, _)| *h == action) {
                Some((_, held)) => *held = held.join(mode),
                None => entry.holders.push((action, mode)),
            }
            let a = self.actions.get_mut(&action).expect("running");
            let held = a.held.entry(key).or_insert(mode);
            *held = held.join(mode);
            return Ok(Lock::Granted);
        }
        if deadlock::would_cycle(self, action, &blockers) {
            return Err(ActionError::Deadlock { action, key: format!("{key:?}") });
        }
        let entry = self.locks.entry(key.clone()).or_default();
        entry.waiters.push(action);
        self.actions.get_mut(&action).expect("running").waiting_on.push((key, mode));
        Ok(Lock::Wait)
    }

    /// Stops every wait of `action` (it aborts or commits).
    pub fn cancel_wait(&mut self, action: ActionId) {
        let Some(a) = self.actions.get_mut(&action) else { return };
        let keys: Vec<K> = a.waiting_on.drain(..).map(|(k, _)| k).collect();
        for key in keys {
            self.drop_waiter(action, &key);
        }
    }

    /// Stops `action`'s wait on `key` (a timeout, or the request was
    /// withdrawn); its other waits go on.
    pub fn cancel_wait_on(&mut self, action: ActionId, key: &K) {
        let Some(a) = self.actions.get_mut(&action) else { return };
        let before = a.waiting_on.len();
        a.waiting_on.retain(|(k, _)| k != key);
        if a.waiting_on.len() != before {
            self.drop_waiter(action, key);
        }
    }

    fn drop_waiter(&mut self, action: ActionId, key: &K) {
        if let Some(entry) = self.locks.get_mut(key) {
            entry.waiters.retain(|&w| w != action);
            if entry.holders.is_empty() && entry.waiters.is_empty() {
                self.locks.remove(key);
            }
        }
    }

    /// Where `action` reads `key` from. It must hold a lock on `key` through
    /// itself or an ancestor; an overwrite lock with nothing written yet
    /// cannot be read.
    pub fn lookup(&self, action: ActionId, key: &K) -> Result<Lookup<'_, V>, ActionError> {
        self.running(action)?;
        let mut cursor = Some(action);
        let mut strongest: Option<LockMode> = None;
        while let Some(id) = cursor {
            let a = &self.actions[&id];
            if let Some(v) = a.tentative.get(key) {
                return Ok(Lookup::Tentative(v));
            }
            if let Some(&m) = a.held.get(key) {
                strongest = Some(strongest.map_or(m, |s| s.join(m)));
            }
            cursor = a.parent;
        }
        match strongest {
            Some(LockMode::Overwrite) => Err(ActionError::NotReadable { action, key: format!("{key:?}") }),
            Some(_) => Ok(Lookup::Committed),
            None => Err(ActionError::NotLocked { action, key: format!("{key:?}") }),
        }
    }

    /// Records a new tentative state of `key`; the action must hold an
    /// exclusive lock on it. Returns the state it replaces in this action.
    pub fn set_tentative(&mut self, action: ActionId, key: K, value: V) -> Result<Option<V>, ActionError> {
        self.running(action)?;
        let a = &self.actions[&action];
        if !a.held.get(&key).is_some_and(|m| m.is_exclusive()) {
            return Err(ActionError::NotLocked { action, key: format!("{key:?}") });
        }
        Ok(self.actions.get_mut(&action).expect("running").tentative.insert(key, value))
    }

    /// Commits a nested action into its parent.
    pub fn commit_nested(&mut self, action: ActionId) -> Result<NestedCommit<V>, ActionError> {
        let a = self.running(action)?;
        let Some(parent) = a.parent else {
            return Err(ActionError::WrongLevel { action, expected: "nested", actual: "top-level" });
        };
        if !a.children.is_empty() {
            return Err(ActionError::ChildrenActive { action });
        }
        self.cancel_wait(action);
        let a = self.actions.remove(&action).expect("running");
        let mut woken = Vec::new();
        for (key, mode) in a.held {
            let entry = self.locks.get_mut(&key).expect("held lock has an entry");
            entry.holders.retain(|&(h, _)| h != action);
            match entry.holders.iter_mut().find(|(h, _)| *h == parent) {
                Some((_, held)) => *held = held.join(mode),
                None => entry.holders.push((parent, mode)),
            }
            woken.extend(entry.waiters.iter().copied());
            let p = self.actions.get_mut(&parent).expect("parent runs while child runs");
            let held = p.held.entry(key).or_insert(mode);
            *held = held.join(mode);
        }
        let p = self.actions.get_mut(&parent).expect("parent runs while child runs");
        p.children.remove(&action);
        let superseded = a.tentative.into_iter().filter_map(|(k, v)| p.tentative.insert(k, v)).collect();
        Ok(NestedCommit { parent, superseded, woken })
    }

    /// Aborts an action and, first, all its nested actions.
    pub fn abort(&mut self, action: ActionId) -> Result<Aborted<K, V>, ActionError> {
        self.running(action)?;
        let mut out = Aborted { actions: Vec::new(), dropped: Vec::new(), woken: Vec::new() };
        self.abort_tree(action, &mut out);
        out.woken.retain(|w| self.actions.contains_key(w));
        out.woken.sort();
        out.woken.dedup();
        Ok(out)
    }

    fn abort_tree(&mut self, action: ActionId, out: &mut Aborted<K, V>) {
        let children: Vec<_> = self.actions[&action].children.iter().copied().collect();
        for c in children {
            self.abort_tree(c, out);
        }
        self.cancel_wait(action);
        let a = self.actions.remove(&action).expect("aborting a running action");
        out.woken.extend(self.release(action, a.held.keys()));
        out.dropped.extend(a.tentative);
        out.actions.push(action);
        match a.parent {
            Some(p) => {
                if let Some(p) = self.actions.get_mut(&p) {
                    p.children.remove(&action);
                }
            }
            None => self.forget_top_level(a.session, action),
        }
    }

    fn forget_top_level(&mut self, session: SessionId, action: ActionId) {
        if let Some(set) = self.by_session.get_mut(&session) {
            set.remove(&action);
            if set.is_empty() {
                self.by_session.remove(&session);
            }
        }
    }

    /// Drops `action`'s hold on `keys`; returns the waiters to wake.
    fn release<'a>(&mut self, action: ActionId, keys: impl Iterator<Item = &'a K>) -> Vec<ActionId>
    where
        K: 'a,
    {
        let mut woken = Vec::new();
        for key in keys {
            if let Some(entry) = self.locks.get_mut(key) {
                entry.holders.retain(|&(h, _)| h != action);
                woken.extend(entry.waiters.iter().copied());
                if entry.holders.is_empty() && entry.waiters.is_empty() {
                    self.locks.remove(key);
                }
            }
        }
        woken
    }

    /// First half of a top-level commit: the action stops accepting work
    /// (a session abort now leaves it alone) and hands over its write set.
    /// The caller makes it durable, then calls [`Manager::finish_commit`].
    pub fn prepare_commit(&mut self, action: ActionId) -> Result<CommitSet<K, V>, ActionError> {
        let a = self.running(action)?;
        if a.parent.is_some() {
            return Err(ActionError::WrongLevel { action, expected: "top-level", actual: "nested" });
        }
        if !a.children.is_empty() {
            return Err(ActionError::ChildrenActive { action });
        }
        self.cancel_wait(action);
        let a = self.actions.get_mut(&action).expect("running");
        a.committing = true;
        Ok(CommitSet { writes: std::mem::take(&mut a.tentative).into_iter().collect() })
    }

    /// Second half of a top-level commit, after the batch is durable (or
    /// failed to be: the action is then gone all the same, as aborted).
    /// Releases the locks; returns the waiters to wake.
    pub fn finish_commit(&mut self, action: ActionId) -> Vec<ActionId> {
        let Some(a) = self.actions.remove(&action) else { return Vec::new() };
        debug_assert!(a.committing, "finish_commit without prepare_commit");
        let mut woken = self.release(action, a.held.keys());
        self.forget_top_level(a.session, action);
        woken.sort();
        woken.dedup();
        woken
    }

    /// Aborts every running top-level action of a session (its connection
    /// broke or its lease lapsed). Committing actions finish on their own.
    pub fn abort_session(&mut self, session: SessionId) -> Vec<Aborted<K, V>> {
        let tops: Vec<ActionId> =
            self.by_session.get(&session).into_iter().flatten().copied().filter(|a| !self.actions[a].committing).collect();
        tops.into_iter().filter_map(|a| self.abort(a).ok()).collect()
    }
}
