//! Reads in flight, by what they read: a guard for each, and a way to
//! wait for one to end. A block cache keeps the versions arriving, which
//! its peer server waits for rather than turn a peer away.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

pub(crate) struct InFlight<K> {
    map: Mutex<HashMap<K, Arc<Notify>>>,
}

impl<K> Default for InFlight<K> {
    fn default() -> Self {
        InFlight { map: Mutex::default() }
    }
}

/// A read in flight; dropped when it ended, which wakes its waiters.
pub(crate) struct Flight<'a, K: Eq + Hash> {
    set: &'a InFlight<K>,
    key: K,
    notify: Arc<Notify>,
}

impl<K: Eq + Hash> Drop for Flight<'_, K> {
    fn drop(&mut self) {
        let mut map = self.set.map();
        if map.get(&self.key).is_some_and(|n| Arc::ptr_eq(n, &self.notify)) {
            map.remove(&self.key);
        }
        drop(map);
        self.notify.notify_waiters();
    }
}

impl<K> InFlight<K> {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, Arc<Notify>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<K: Eq + Hash + Clone> InFlight<K> {
    /// Marks `key` in flight until the guard is dropped. One already in
    /// flight stays the one waited for: the new guard ends nothing.
    pub(crate) fn begin(&self, key: K) -> Flight<'_, K> {
        let notify = match self.map().entry(key.clone()) {
            Entry::Vacant(v) => v.insert(Arc::default()).clone(),
            Entry::Occupied(_) => Arc::default(),
        };
        Flight { set: self, key, notify }
    }

    /// Waits until `key` is not in flight; false if it still was at
    /// `deadline`.
    pub(crate) async fn wait_while(&self, key: &K, deadline: Instant) -> bool {
        loop {
            let Some(notify) = self.map().get(key).cloned() else { return true };
            let ended = notify.notified();
            tokio::pin!(ended);
            // Registered before the second look, so an end between the two
            // is not missed.
            ended.as_mut().enable();
            if !self.map().get(key).is_some_and(|n| Arc::ptr_eq(n, &notify)) {
                continue;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_flight_is_waited_for_until_it_ends_and_a_joined_one_ends_nothing() {
        let set = Arc::new(InFlight::<u32>::default());
        let soon = || Instant::now() + Duration::from_secs(5);
        assert!(set.wait_while(&1, soon()).await, "nothing in flight: at once");
        let first = set.begin(1);
        let joined = set.begin(1);
        drop(joined);
        assert!(!set.wait_while(&1, Instant::now() + Duration::from_millis(30)).await, "the first is still in flight");
        let waiter = tokio::spawn({
            let set = set.clone();
            async move { set.wait_while(&1, Instant::now() + Duration::from_secs(5)).await.then(Instant::now) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let ended = Instant::now();
        drop(first);
        assert!(waiter.await.unwrap().is_some_and(|at| at >= ended), "woken when the first ended, not before");
        assert!(set.is_empty());
    }
}
