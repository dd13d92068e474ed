//! Block versions as objects of an object store (`--blocks rados`): the
//! node's bookkeeping of them, beside RocksDB's pointers.
//!
//! A version is one object, written whole under a fresh id before any
//! pointer names it, by the node (a put relayed through it) or by a slave
//! (`Op::ObjectPut`), and never changed. What keeps the pool free of
//! objects nothing names, whatever crashes:
//! - an aborted or superseded version's object is removed when its action
//!   drops it, a replaced one's once the commit replacing it is durable;
//! - at open, every object under the prefix that no pointer names is
//!   removed (no action survives a restart);
//! - while the node runs, a collection every [`ObjectsConfig::collect_every`]
//!   removes the objects that no pointer and no running action named at two
//!   collections in a row: a slave that wrote an object and died before
//!   handing it over, or wrote it after a restart for an action the
//!   restart ended. Two rounds, so that an object written a moment before
//!   its `ObjectPut` is not taken for garbage.
//!
//! An object becomes *live* when its version is staged for an action (before
//! the node checks it exists) and stops being live once a durable commit
//! names it or its action drops it; the collection never removes a live
//! object, and it decides under the same lock that staging takes.

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use store_client::objects::{BlockObjects, ObjectsConnector};
use store_client::StoreError;
use uuid::Uuid;

/// Where a node keeps its block versions when not in its own files.
#[derive(Clone, Debug)]
pub struct ObjectsConfig {
    /// The pool, as the connector names it.
    pub pool: String,
    pub connector: ObjectsConnector,
    /// How often objects nothing names are looked for while the node runs.
    pub collect_every: Duration,
}

impl ObjectsConfig {
    pub fn new(pool: impl Into<String>, connector: ObjectsConnector) -> ObjectsConfig {
        ObjectsConfig { pool: pool.into(), connector, collect_every: Duration::from_secs(60) }
    }
}

/// What a node records of where its blocks are, so that a store is never
/// opened with its blocks somewhere else.
pub(crate) fn backend_record(objects: Option<&ObjectsConfig>) -> String {
    match objects {
        Some(o) => format!("objects in pool {}", o.pool),
        None => "files".into(),
    }
}

/// A node's versions in the object store.
pub(crate) struct VersionObjects {
    store: Arc<dyn BlockObjects>,
    prefix: String,
    live: Mutex<HashSet<Uuid>>,
    /// Unnamed at the last collection.
    suspects: Mutex<HashSet<Uuid>>,
    removals: Mutex<Option<mpsc::Sender<Vec<Uuid>>>>,
    remover: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for VersionObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VersionObjects({}, {})", self.store.pool(), self.prefix)
    }
}

impl VersionObjects {
    pub(crate) fn open(config: &ObjectsConfig, prefix: String) -> Result<Arc<VersionObjects>, StoreError> {
        let store = config.connector.open(&config.pool, &prefix)?;
        let (tx, rx) = mpsc::channel::<Vec<Uuid>>();
        let for_remover = store.clone();
        let remover = std::thread::Builder::new()
            .name("store-objects".into())
            .spawn(move || {
                for versions in rx {
                    if let Err(e) = for_remover.remove(&versions) {
                        // The next collection finds them.
                        tracing::warn!("removing {} replaced or aborted version objects: {e}", versions.len());
                    }
                }
            })
            .map_err(|e| StoreError::Storage { what: format!("starting the object remover thread: {e}") })?;
        Ok(Arc::new(VersionObjects {
            store,
            prefix,
            live: Mutex::default(),
            suspects: Mutex::default(),
            removals: Mutex::new(Some(tx)),
            remover: Mutex::new(Some(remover)),
        }))
    }

    pub(crate) fn pool(&self) -> &str {
        self.store.pool()
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Removes every object `named` does not hold (at open, when no action
    /// runs); returns how many.
    pub(crate) fn sweep(&self, named: &HashSet<Uuid>) -> Result<usize, StoreError> {
        let garbage: Vec<Uuid> = self.store.versions()?.into_iter().filter(|v| !named.contains(v)).collect();
        self.store.remove(&garbage)?;
        Ok(garbage.len())
    }

    /// One collection: removes the objects unnamed now and at the previous
    /// one. `named` reads the pointers; it runs under the lock that staging
    /// takes, after the listing. Returns how many were removed.
    pub(crate) fn collect(&self, named: impl FnOnce() -> Result<HashSet<Uuid>, StoreError>) -> Result<usize, StoreError> {
        let listed = self.store.versions()?;
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let named = named()?;
        let unnamed: HashSet<Uuid> = listed.into_iter().filter(|v| !named.contains(v) && !live.contains(v)).collect();
        let mut suspects = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
        let garbage: Vec<Uuid> = unnamed.intersection(&suspects).copied().collect();
        self.store.remove(&garbage)?;
        *suspects = unnamed.into_iter().filter(|v| !garbage.contains(v)).collect();
        Ok(garbage.len())
    }

    /// Marks a version live for an action: before it is checked or written,
    /// so that no collection takes it.
    pub(crate) fn stage(&self, version: Uuid) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(version);
    }

    /// Versions no longer live: a durable commit names them, or they were
    /// never this node's to keep (an object put it refused).
    pub(crate) fn forget(&self, versions: &[Uuid]) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        for v in versions {
            live.remove(v);
        }
    }

    /// Versions nothing will name (aborted, superseded, replaced): removed
    /// off the caller's path.
    pub(crate) fn drop_later(&self, versions: &[Uuid]) {
        if versions.is_empty() {
            return;
        }
        self.forget(versions);
        if let Some(tx) = &*self.removals.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = tx.send(versions.to_vec());
        }
    }

    /// Writes a version the node received whole; returns its id, live.
    pub(crate) fn put(&self, value: &[u8]) -> Result<Uuid, StoreError> {
        let version = Uuid::new_v4();
        self.stage(version);
        let (header, payload) = value.split_at(store_client::block::HEADER_LEN.min(value.len()));
        if let Err(e) = self.store.put(version, header, payload) {
            self.drop_later(&[version]);
            return Err(e);
        }
        Ok(version)
    }

    /// A version's stored form; `None` if its object is gone.
    pub(crate) fn read(&self, version: Uuid) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(len) = self.store.size(version)? else { return Ok(None) };
        let mut value = vec![0u8; len as usize];
        match self.store.read_into(version, 0, &mut value) {
            Ok(()) => Ok(Some(value)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The size of a version's object; `None` if there is none.
    pub(crate) fn size(&self, version: Uuid) -> Result<Option<u64>, StoreError> {
        self.store.size(version)
    }

    /// Waits for the removals asked for so far.
    pub(crate) fn close(&self) {
        self.removals.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.remover.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Runs collections every `every` until `stop` drops.
pub(crate) fn start_collector(
    objects: Arc<VersionObjects>,
    every: Duration,
    named: impl Fn() -> Result<HashSet<Uuid>, StoreError> + Send + 'static,
    stop: mpsc::Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("store-collect".into()).spawn(move || {
        while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
            match objects.collect(&named) {
                Ok(0) => {}
                Ok(n) => tracing::info!("collected {n} version objects that nothing names"),
                Err(e) => tracing::warn!("collecting version objects: {e}"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Objects in memory: the bookkeeping above, not the object store, is
    /// under test here (`master/tests/rados.rs` runs a real cluster).
    #[derive(Debug, Default)]
    struct InMemory(Mutex<HashMap<Uuid, Vec<u8>>>);

    impl BlockObjects for InMemory {
        fn pool(&self) -> &str {
            "memory"
        }
        fn put(&self, version: Uuid, header: &[u8], payload: &[u8]) -> Result<(), StoreError> {
            self.0.lock().unwrap().insert(version, [header, payload].concat());
            Ok(())
        }
        fn read_into(&self, version: Uuid, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
            let objects = self.0.lock().unwrap();
            let v = objects.get(&version).ok_or_else(|| StoreError::NotFound { what: version.to_string() })?;
            buf.copy_from_slice(&v[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn size(&self, version: Uuid) -> Result<Option<u64>, StoreError> {
            Ok(self.0.lock().unwrap().get(&version).map(|v| v.len() as u64))
        }
        fn remove(&self, versions: &[Uuid]) -> Result<(), StoreError> {
            let mut objects = self.0.lock().unwrap();
            versions.iter().for_each(|v| drop(objects.remove(v)));
            Ok(())
        }
        fn versions(&self) -> Result<Vec<Uuid>, StoreError> {
            Ok(self.0.lock().unwrap().keys().copied().collect())
        }
    }

    fn objects() -> (Arc<InMemory>, Arc<VersionObjects>) {
        let memory = Arc::new(InMemory::default());
        let m = memory.clone();
        let connector = ObjectsConnector(Arc::new(move |_: &str, _: &str| Ok(m.clone() as Arc<dyn BlockObjects>)));
        (memory, VersionObjects::open(&ObjectsConfig::new("memory", connector), "p/".into()).unwrap())
    }

    #[test]
    fn a_collection_removes_only_what_nothing_named_twice_in_a_row() {
        let (memory, objects) = objects();
        let named = objects.put(b"named").unwrap();
        objects.forget(&[named]);
        let live = objects.put(b"live").unwrap();
        let orphan = Uuid::new_v4();
        memory.put(orphan, b"", b"orphan").unwrap();
        let pointers = || Ok(HashSet::from([named]));
        // The first time an orphan is only suspected: it may be a version
        // written a moment before it is handed over.
        assert_eq!(objects.collect(pointers).unwrap(), 0);
        let late = Uuid::new_v4();
        memory.put(late, b"", b"written after the first round").unwrap();
        assert_eq!(objects.collect(pointers).unwrap(), 1);
        assert_eq!(memory.size(orphan).unwrap(), None);
        for v in [named, live, late] {
            assert!(memory.size(v).unwrap().is_some(), "{v} removed");
        }
        // Handed over after being suspected: live, so kept.
        objects.stage(late);
        assert_eq!(objects.collect(pointers).unwrap(), 0);
        // Dropped: removed off the caller's path, once the remover ran.
        objects.drop_later(&[live, late]);
        objects.close();
        assert_eq!(memory.versions().unwrap(), vec![named]);
    }

    #[test]
    fn a_sweep_at_open_keeps_only_what_pointers_name() {
        let (memory, objects) = objects();
        let kept = objects.put(b"kept").unwrap();
        let gone = objects.put(b"gone").unwrap();
        assert_eq!(objects.sweep(&HashSet::from([kept])).unwrap(), 1);
        assert_eq!(memory.size(gone).unwrap(), None);
        assert_eq!(objects.read(kept).unwrap().as_deref(), Some(&b"kept"[..]));
    }
}
