//! The store node's core: the action manager, the bags and the sessions
//! behind one mutex, wired to RocksDB. Decisions are made under the mutex
//! in microseconds; RocksDB I/O and waits happen outside it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use actions::{Aborted, ActionError, ActionId, Lock, LockMode, Lookup, Manager, SessionId};
use queue::{Bags, Dequeue, Dequeued};
use store_client::StoreError;
use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

use crate::blocks::Matrices;
use crate::db::Db;
use crate::holders::Holders;
use crate::keys::{BlockKey, ObjKey, Tentative};
use crate::metrics::Metrics;

/// Why a session whose client ended it ended (any other end is a loss).
pub(crate) const CLOSED_BY_CLIENT: &str = "client closed the session";

/// Tunables of a node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// A session without a heartbeat for this long is aborted.
    pub lease: Duration,
    /// How long a lock request waits before `LockTimeout`.
    pub lock_timeout: Duration,
    /// Orphanings after which a queue element is dead-lettered.
    pub attempt_limit: u32,
    /// Enables `CorruptBlockForTest`.
    pub test_hooks: bool,
    /// Test hook (with `test_hooks`): how long every top-level commit
    /// waits between its batch becoming durable (and visible to reads
    /// that take no lock) and its locks and queue elements changing. The
    /// window is microseconds wide on an idle machine and milliseconds on
    /// a loaded one; tests widen it to check what readers see inside it.
    pub hold_after_batch: Duration,
    /// Test hook (with `test_hooks`): the data plane peeks the block
    /// ahead of a reader (`wire::Peek`) even when the node runs on the
    /// reader's CPU, so that tests of peeks do not depend on where the
    /// kernel places the node.
    pub peek_on_the_readers_cpu: bool,
    /// The disk every write of the node goes through (`disk.rs`): the
    /// disk itself, or in tests one that fails on cue.
    pub disk: Arc<dyn crate::disk::Disk>,
    /// Block versions as objects of a pool (`--blocks rados`); `None`:
    /// in the node's own files.
    pub objects: Option<crate::objects::ObjectsConfig>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            lease: Duration::from_secs(3),
            lock_timeout: Duration::from_secs(10),
            attempt_limit: 3,
            test_hooks: false,
            hold_after_batch: Duration::ZERO,
            peek_on_the_readers_cpu: false,
            disk: Arc::new(crate::disk::RealDisk),
            objects: None,
        }
    }
}

pub(crate) struct SessionState {
    pub(crate) name: String,
    pub(crate) peer: String,
    pub(crate) opened: Instant,
    pub(crate) last_seen: Instant,
    end: Option<oneshot::Sender<()>>,
}

pub(crate) struct Core {
    pub(crate) actions: Manager<ObjKey, Tentative>,
    pub(crate) bags: Bags,
    pub(crate) sessions: HashMap<SessionId, SessionState>,
    next_session: u64,
    waiters: HashMap<ActionId, Arc<Notify>>,
    bag_signals: HashMap<String, Arc<Notify>>,
}

impl Core {
    fn wake(&mut self, ids: impl IntoIterator<Item = ActionId>) {
        for id in ids {
            if let Some(n) = self.waiters.get(&id) {
                n.notify_waiters();
            }
        }
    }

    fn signal_bags(&mut self, bags: impl IntoIterator<Item = String>) {
        for b in bags {
            if let Some(n) = self.bag_signals.get(&b) {
                n.notify_waiters();
            }
        }
    }

    fn bag_signal(&mut self, bag: &str) -> Arc<Notify> {
        self.bag_signals.entry(bag.to_owned()).or_default().clone()
    }

    /// Undoes what aborted actions held in the bags and wakes whoever
    /// waited on them. Returns the queue changes and staged versions to
    /// clean up outside the lock.
    fn after_abort(&mut self, aborted: Vec<Aborted<ObjKey, Tentative>>, orphaned: bool) -> Cleanup {
        let mut cleanup = Cleanup::default();
        for a in aborted {
            for id in &a.actions {
                let q = self.bags.abort(*id, orphaned);
                // An orphaned element is written back once, to its bag
                // (its attempt count) or to the dead-letter bag.
                cleanup.n_orphaned += q.mutations.iter().filter(|m| matches!(m, queue::Mutation::Put { .. })).count() as u64;
                cleanup.n_dead_lettered += q.dead_lettered.len() as u64;
                for (bag, d) in &q.dead_lettered {
                    tracing::warn!(bag, seq = d.seq, attempts = d.attempts, "task dead-lettered after repeated orphaning");
                }
                cleanup.queue.extend(q.mutations);
                self.signal_bags(q.touched);
            }
            // Wake the aborted actions too, so a wait inside them ends now.
            self.wake(a.woken.iter().chain(&a.actions).copied());
            for id in &a.actions {
                self.waiters.remove(id);
            }
            cleanup.versions.extend(a.dropped.iter().filter_map(|(_, t)| t.staged_version()));
        }
        cleanup
    }
}

#[derive(Default)]
struct Cleanup {
    queue: Vec<queue::Mutation>,
    versions: Vec<Uuid>,
    /// Orphaned queue elements (for [`Metrics`]), and of those the ones dead-lettered.
    n_orphaned: u64,
    n_dead_lettered: u64,
}

/// A store node: objects, actions, bags and sessions.
pub(crate) struct Node {
    pub(crate) db: Arc<Db>,
    core: Mutex<Core>,
    pub(crate) matrices: RwLock<Matrices>,
    pub(crate) config: NodeConfig,
    /// What the node did since it started (`master serve --http`).
    pub(crate) metrics: Metrics,
    /// True once the node is stopping ([`Node::begin_shutdown`]).
    stopping: tokio::sync::watch::Sender<bool>,
    /// Which slave caches hold which block versions: where cached gets
    /// find peers, and what a dequeue near a slave scores.
    pub(crate) holders: Mutex<Holders>,
}

pub(crate) fn action_error(e: ActionError) -> StoreError {
    match e {
        ActionError::Aborted { action } => StoreError::ActionAborted { action: action.0 },
        ActionError::Deadlock { action, key } => StoreError::Deadlock { action: action.0, what: key },
        ActionError::NotReadable { action, .. }
        | ActionError::NotLocked { action, .. }
        | ActionError::ChildrenActive { action }
        | ActionError::Committing { action }
        | ActionError::WrongLevel { action, .. } => StoreError::ActionState { action: action.0, what: e.to_string() },
    }
}

impl Node {
    pub(crate) fn new(db: Arc<Db>, recovered: crate::db::Recovered, matrices: Matrices, config: NodeConfig) -> Node {
        let boot = recovered.boot;
        let mut bags = Bags::new(config.attempt_limit);
        for (bag, seq, payload, attempts) in recovered.queue {
            bags.load(&bag, seq, payload, attempts);
        }
        for (bag, next) in recovered.next_seqs {
            bags.load_next_seq(&bag, next);
        }
        // Ids carry the boot count in their high bits: an id from before a
        // restart never names a new action or session.
        let first = boot << 40;
        let core = Core {
            actions: Manager::with_first_id(first + 1),
            bags,
            sessions: HashMap::new(),
            next_session: first + 1,
            waiters: HashMap::new(),
            bag_signals: HashMap::new(),
        };
        Node {
            db,
            core: Mutex::new(core),
            matrices: RwLock::new(matrices),
            config,
            metrics: Metrics::default(),
            stopping: tokio::sync::watch::channel(false).0,
            holders: Default::default(),
        }
    }

    /// The node is stopping: every session stream ends (the clients see
    /// the node gone and reconnect), so that the server's graceful
    /// shutdown, which waits for every open stream, can end. A slave's
    /// session stream lives as long as the slave: while any was open,
    /// SIGTERM and Ctrl-C never stopped `master serve`.
    pub(crate) fn begin_shutdown(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once [`Node::begin_shutdown`] was called.
    pub(crate) fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stopping.subscribe();
        async move {
            let _ = rx.wait_for(|&s| s).await;
        }
    }

    /// Whether the data plane peeks for a reader on the node's own CPU
    /// (`NodeConfig::peek_on_the_readers_cpu`).
    pub(crate) fn peeks_on_the_readers_cpu(&self) -> bool {
        self.config.test_hooks && self.config.peek_on_the_readers_cpu
    }

    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- sessions ----

    /// Registers a session; the receiver fires when the node ends it.
    pub(crate) fn open_session(&self, name: String, peer: String) -> (SessionId, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut core = self.core();
        let id = SessionId(core.next_session);
        core.next_session += 1;
        let now = Instant::now();
        core.sessions.insert(id, SessionState { name, peer, opened: now, last_seen: now, end: Some(tx) });
        tracing::info!(session = id.0, "session opened");
        (id, rx)
    }

    pub(crate) fn heartbeat(&self, session: SessionId) -> Result<(), StoreError> {
        let mut core = self.core();
        let s = core.sessions.get_mut(&session).ok_or(StoreError::SessionExpired { session: session.0 })?;
        s.last_seen = Instant::now();
        Ok(())
    }

    /// Ends a session and aborts its running actions as orphans.
    /// Idempotent: the stream task and the lease reaper may both call it.
    pub(crate) fn close_session(&self, session: SessionId, why: &str) {
        let cleanup = {
            let mut core = self.core();
            let Some(mut s) = core.sessions.remove(&session) else { return };
            if let Some(end) = s.end.take() {
                let _ = end.send(());
            }
            let aborted = core.actions.abort_session(session);
            let n: usize = aborted.iter().map(|a| a.actions.len()).sum();
            tracing::info!(session = session.0, name = s.name, n_aborted = n, "session ended: {why}");
            let cleanup = core.after_abort(aborted, true);
            if why != CLOSED_BY_CLIENT {
                Metrics::add(&self.metrics.sessions_lost, 1);
            }
            Metrics::add(&self.metrics.tasks_orphaned, cleanup.n_orphaned);
            Metrics::add(&self.metrics.tasks_dead_lettered, cleanup.n_dead_lettered);
            // Attempt counts are written under the lock: written later, one
            // could land after a commit that deleted the element and bring
            // it back at the next start. Orphanings are rare.
            self.persist_queue(&cleanup.queue);
            cleanup
        };
        self.clean_up(Cleanup { versions: cleanup.versions, ..Cleanup::default() });
    }

    /// Ends every session whose lease has lapsed.
    pub(crate) fn reap_expired(&self) {
        let now = Instant::now();
        let expired: Vec<SessionId> =
            self.core().sessions.iter().filter(|(_, s)| now.duration_since(s.last_seen) > self.config.lease).map(|(id, _)| *id).collect();
        for id in expired {
            self.close_session(id, "lease lapsed");
        }
    }

    fn persist_queue(&self, queue: &[queue::Mutation]) {
        if let Err(e) = self.db.apply_queue(queue) {
            tracing::error!("persisting attempt counts failed: {e}");
        }
    }

    fn clean_up(&self, cleanup: Cleanup) {
        self.persist_queue(&cleanup.queue);
        self.db.drop_staged(&cleanup.versions);
    }

    // ---- actions ----

    pub(crate) fn begin(&self, session: SessionId, parent: Option<ActionId>) -> Result<ActionId, StoreError> {
        let mut core = self.core();
        if parent.is_none() && !core.sessions.contains_key(&session) {
            return Err(StoreError::SessionExpired { session: session.0 });
        }
        core.actions.begin(session, parent).map_err(action_error)
    }

    pub(crate) fn abort(&self, action: ActionId) -> Result<(), StoreError> {
        let cleanup = {
            let mut core = self.core();
            let aborted = core.actions.abort(action).map_err(action_error)?;
            core.after_abort(vec![aborted], false)
        };
        Metrics::add(&self.metrics.aborts, 1);
        self.clean_up(cleanup);
        Ok(())
    }

    /// Commits a nested action into its parent, or a top-level action
    /// durably: its writes and queue changes in one synced batch.
    pub(crate) async fn commit(self: &Arc<Self>, action: ActionId) -> Result<(), StoreError> {
        let prepared = {
            let mut core = self.core();
            core.actions.check(action).map_err(action_error)?;
            if core.actions.parent_of(action).is_some() {
                let nc = core.actions.commit_nested(action).map_err(action_error)?;
                core.bags.commit_nested(action, nc.parent);
                core.wake(nc.woken);
                core.waiters.remove(&action);
                drop(core);
                let versions: Vec<Uuid> = nc.superseded.iter().filter_map(Tentative::staged_version).collect();
                self.clean_up(Cleanup { versions, ..Cleanup::default() });
                return Ok(());
            }
            let set = core.actions.prepare_commit(action).map_err(action_error)?;
            let q = core.bags.prepare_commit(action);
            (set.writes, q)
        };
        let started = Instant::now();
        let (writes, q) = prepared;
        let staged: Vec<Uuid> = writes.iter().filter_map(|(_, t)| t.staged_version()).collect();
        // Versions whose puts were answered unsynced are synced here, each
        // commit on its own worker, so that concurrent commits' syncs
        // overlap (on the committer thread they would queue one after the
        // other), and beside the batch naming them, which carries what
        // undoes it should a crash lose a version (`undo.rs`).
        let result = if self.db.files().has_unsynced(&staged) {
            self.db.commit_beside(writes, q, self.sync_staged(&staged)).await
        } else {
            self.db.commit(writes, q).await
        };
        if self.config.test_hooks && !self.config.hold_after_batch.is_zero() {
            tokio::time::sleep(self.config.hold_after_batch).await;
        }
        {
            let mut core = self.core();
            let woken = core.actions.finish_commit(action);
            let touched = core.bags.finish_commit(action, result.is_ok());
            core.wake(woken);
            core.signal_bags(touched);
            core.waiters.remove(&action);
        }
        match &result {
            Ok(()) => {
                Metrics::add(&self.metrics.commits, 1);
                self.metrics.commit_took(started.elapsed());
            }
            Err(e) => {
                Metrics::add(&self.metrics.commits_failed, 1);
                tracing::error!(action = action.0, "commit failed, action aborted: {e}");
                self.clean_up(Cleanup { versions: staged, ..Cleanup::default() });
            }
        }
        result
    }

    /// Commits `action`; if it was top-level and `begin_next`, then begins
    /// its session's next top-level action and returns it, so that the
    /// client's next begin costs no round trip (`None` when the session
    /// ended meanwhile: its actions are aborted anyway).
    pub(crate) async fn commit_then_begin(self: &Arc<Self>, action: ActionId, begin_next: bool) -> Result<Option<ActionId>, StoreError> {
        let session = if begin_next {
            let core = self.core();
            core.actions.parent_of(action).is_none().then(|| core.actions.session_of(action)).flatten()
        } else {
            None
        };
        self.commit(action).await?;
        Ok(session.and_then(|s| self.begin(s, None).ok()))
    }

    /// Syncs the files of `versions` that their puts left unsynced
    /// (`BlockFiles::sync_later`); the others were synced already. Called
    /// only when some are (`commit` lends no thread otherwise).
    async fn sync_staged(&self, versions: &[Uuid]) -> Result<(), StoreError> {
        let files = self.db.files().clone();
        if crate::blocks::multi_threaded() {
            // A sync of a small block: this worker lends its other tasks
            // to another thread rather than hand the sync to the pool.
            return tokio::task::block_in_place(|| files.sync_staged(versions));
        }
        let versions = versions.to_vec();
        tokio::task::spawn_blocking(move || files.sync_staged(&versions))
            .await
            .map_err(|e| StoreError::Storage { what: format!("syncing block versions: {e}") })?
    }

    /// Takes a lock for `action`, waiting up to the lock timeout.
    pub(crate) async fn acquire(&self, action: ActionId, key: &ObjKey, mode: LockMode) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + self.config.lock_timeout;
        let mut waited = false;
        loop {
            let mut woken = {
                let mut core = self.core();
                match core.actions.lock(action, key.clone(), mode).map_err(action_error)? {
                    Lock::Granted => return Ok(()),
                    Lock::Wait => {
                        if !waited {
                            Metrics::add(&self.metrics.lock_waits, 1);
                            waited = true;
                        }
                        // Registered before the lock is released, so a wake
                        // in between is not lost; every wait of the action
                        // (it may wait on several keys at once) is woken and
                        // asks again.
                        let mut n: Pin<Box<tokio::sync::futures::OwnedNotified>> =
                            Box::pin(core.waiters.entry(action).or_default().clone().notified_owned());
                        n.as_mut().enable();
                        n
                    }
                }
            };
            if tokio::time::timeout_at(deadline, woken.as_mut()).await.is_err() {
                let mut core = self.core();
                // Who held it, for the message: the lock timeout is where a
                // stuck holder shows, and the waiter alone does not say which.
                let holders: Vec<String> = core
                    .actions
                    .conflicting_holders(action, key, mode)
                    .into_iter()
                    .map(|h| match core.actions.session_of(h) {
                        Some(s) => format!("{} (session {})", h.0, s.0),
                        None => h.0.to_string(),
                    })
                    .collect();
                core.actions.cancel_wait_on(action, key);
                core.actions.check(action).map_err(action_error)?;
                tracing::warn!(action = action.0, ?key, ?holders, "lock wait timed out");
                Metrics::add(&self.metrics.lock_timeouts, 1);
                return Err(StoreError::LockTimeout { action: action.0, what: format!("{key:?}, held by action {}", holders.join(", ")) });
            }
        }
    }

    /// Where `action` finds `key` after locking it.
    pub(crate) fn lookup(&self, action: ActionId, key: &ObjKey) -> Result<Option<Tentative>, StoreError> {
        let core = self.core();
        match core.actions.lookup(action, key).map_err(action_error)? {
            Lookup::Tentative(t) => Ok(Some(t.clone())),
            Lookup::Committed => Ok(None),
        }
    }

    /// Records a tentative state; returns a staged version it replaced.
    pub(crate) fn set_tentative(&self, action: ActionId, key: ObjKey, t: Tentative) -> Result<Option<Uuid>, StoreError> {
        let mut core = self.core();
        let old = core.actions.set_tentative(action, key, t).map_err(action_error)?;
        Ok(old.and_then(|o| o.staged_version()))
    }

    // ---- small objects ----

    pub(crate) async fn read_small(&self, action: Option<ActionId>, key: &str, mode: LockMode) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(action) = action else { return self.db.get_small(key) };
        let k = ObjKey::Small(key.to_owned());
        self.acquire(action, &k, mode).await?;
        match self.lookup(action, &k)? {
            Some(Tentative::Small(v)) => Ok(Some(v)),
            Some(_) => Ok(None),
            None => self.db.get_small(key),
        }
    }

    pub(crate) async fn write_small(&self, action: ActionId, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError> {
        let k = ObjKey::Small(key.to_owned());
        self.acquire(action, &k, LockMode::Write).await?;
        let t = value.map_or(Tentative::Deleted, Tentative::Small);
        self.set_tentative(action, k, t)?;
        Ok(())
    }

    /// A backup of the store into `dir` on this node's machine, taken
    /// beside the commits (`backup.rs`).
    pub(crate) async fn backup(&self, dir: std::path::PathBuf) -> Result<crate::BackupReport, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.backup(&dir))
            .await
            .map_err(|e| StoreError::Storage { what: format!("the backup's thread failed: {e}") })?
    }

    // ---- queues ----

    /// Dequeues inside `action`; waits up to `wait` while the bag has
    /// elements but none is free. `near`: the address a slave serves its
    /// block cache on, whose elements' inputs it holds most of go first
    /// (`Bags::dequeue_nearest`); empty, the bag's order.
    pub(crate) async fn dequeue(&self, action: ActionId, bag: &str, wait: Duration, near: &str) -> Result<Dequeue, StoreError> {
        let deadline = tokio::time::Instant::now() + wait;
        let take = |core: &mut Core| {
            if near.is_empty() {
                return core.bags.dequeue(action, bag);
            }
            let holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
            core.bags.dequeue_nearest(action, bag, &mut |inputs| holders.score(inputs, near))
        };
        loop {
            let mut signal = {
                let mut core = self.core();
                core.actions.check(action).map_err(action_error)?;
                match take(&mut core) {
                    Dequeue::NoneAvailable if tokio::time::Instant::now() < deadline => {
                        let mut n: Pin<Box<tokio::sync::futures::OwnedNotified>> = Box::pin(core.bag_signal(bag).notified_owned());
                        // Registered before the lock is released: no lost wake-up.
                        n.as_mut().enable();
                        Metrics::add(&self.metrics.dequeue_waits, 1);
                        n
                    }
                    other => return Ok(other),
                }
            };
            if tokio::time::timeout_at(deadline, signal.as_mut()).await.is_err() {
                // One last look, so a wake at the deadline is not lost.
                let mut core = self.core();
                core.actions.check(action).map_err(action_error)?;
                return Ok(take(&mut core));
            }
        }
    }

    /// Enqueues `payload`; `inputs`, the blocks the task reads, let a
    /// dequeue hand it to a slave that holds them (none: it keeps its place).
    pub(crate) fn enqueue(&self, action: ActionId, bag: &str, payload: Vec<u8>, inputs: &[BlockKey]) -> Result<(), StoreError> {
        let mut core = self.core();
        core.actions.check(action).map_err(action_error)?;
        core.bags.enqueue_near(action, bag, payload, crate::holders::pack_inputs(inputs));
        Ok(())
    }

    pub(crate) fn bag_stats(&self, bag: &str) -> (queue::BagStats, queue::BagStats) {
        let core = self.core();
        (core.bags.stats(bag), core.bags.stats(&queue::dead_letter_bag(bag)))
    }

    pub(crate) fn list_bag(&self, bag: &str) -> Vec<Dequeued> {
        self.core().bags.peek_all(bag)
    }
}

impl Node {
    /// [`Metrics`]' counters and the gauges of now: sessions, the disk,
    /// the caches.
    pub(crate) fn metrics_snapshot(&self) -> store_client::proto::NodeMetrics {
        let mut m = self.metrics.snapshot();
        m.sessions = self.core().sessions.len() as u32;
        let files = self.db.files();
        if let Ok((free, total)) = files.disk_space() {
            (m.disk_free_bytes, m.disk_total_bytes) = (free, total);
        }
        m.open_block_files = files.n_open() as u64;
        (m.block_cache_bytes, m.block_cache_capacity_bytes) = self.db.cache_use();
        m.rocksdb_sst_bytes = self.db.sst_bytes();
        m.matrix_bytes = self.matrices_bytes();
        m
    }

    pub(crate) fn sessions_info(&self) -> Vec<store_client::proto::SessionInfo> {
        let core = self.core();
        let now = Instant::now();
        // What each session's actions hold of the bags: its current task.
        let mut held: HashMap<SessionId, Vec<String>> = HashMap::new();
        for (action, bag, seq) in core.bags.held() {
            if let Some(s) = core.actions.session_of(action) {
                held.entry(s).or_default().push(format!("{bag}#{seq}"));
            }
        }
        let mut v: Vec<_> = core
            .sessions
            .iter()
            .map(|(id, s)| store_client::proto::SessionInfo {
                session: id.0,
                client_name: s.name.clone(),
                peer: s.peer.clone(),
                age_ms: now.duration_since(s.opened).as_millis() as u64,
                since_heartbeat_ms: now.duration_since(s.last_seen).as_millis() as u64,
                n_actions: core.actions.n_actions_of(*id) as u32,
                tasks: held.remove(id).unwrap_or_default(),
            })
            .collect();
        v.sort_by_key(|s| s.session);
        v
    }
}
