//! Lock waits, wake-ups, deadlock detection and session aborts.

use actions::{ActionError, Lock, LockMode, Manager, SessionId};

type M = Manager<&'static str, u32>;

#[test]
fn release_wakes_the_waiter_which_then_gets_the_lock() {
    let mut m = M::new();
    let a = m.begin(SessionId(1), None).unwrap();
    let b = m.begin(SessionId(2), None).unwrap();
    assert_eq!(m.lock(a, "x", LockMode::Write).unwrap(), Lock::Granted);
    assert_eq!(m.lock(b, "x", LockMode::Read).unwrap(), Lock::Wait);
    m.prepare_commit(a).unwrap();
    assert_eq!(m.finish_commit(a), vec![b]);
    assert_eq!(m.lock(b, "x", LockMode::Read).unwrap(), Lock::Granted);
}

#[test]
fn two_top_level_actions_crossing_locks_deadlock_on_the_second_wait() {
    let mut m = M::new();
    let a = m.begin(SessionId(1), None).unwrap();
    let b = m.begin(SessionId(2), None).unwrap();
    m.lock(a, "x", LockMode::Write).unwrap();
    m.lock(b, "y", LockMode::Write).unwrap();
    assert_eq!(m.lock(a, "y", LockMode::Read).unwrap(), Lock::Wait);
    assert!(matches!(m.lock(b, "x", LockMode::Overwrite), Err(ActionError::Deadlock { action, .. }) if action == b));
}

#[test]
fn read_upgrades_by_two_readers_deadlock() {
    let mut m = M::new();
    let a = m.begin(SessionId(1), None).unwrap();
    let b = m.begin(SessionId(2), None).unwrap();
    m.lock(a, "x", LockMode::Read).unwrap();
    m.lock(b, "x", LockMode::Read).unwrap();
    assert_eq!(m.lock(a, "x", LockMode::Write).unwrap(), Lock::Wait);
    assert!(matches!(m.lock(b, "x", LockMode::Write), Err(ActionError::Deadlock { .. })));
}

#[test]
fn a_nested_wait_on_another_tree_that_waits_on_the_parent_is_a_deadlock() {
    let mut m = M::new();
    let top = m.begin(SessionId(1), None).unwrap();
    let child = m.begin(SessionId(1), Some(top)).unwrap();
    let other = m.begin(SessionId(2), None).unwrap();
    let other_child = m.begin(SessionId(2), Some(other)).unwrap();
    m.lock(top, "x", LockMode::Write).unwrap();
    m.lock(other, "y", LockMode::Write).unwrap();
    assert_eq!(m.lock(other_child, "x", LockMode::Read).unwrap(), Lock::Wait);
    assert!(matches!(m.lock(child, "y", LockMode::Read), Err(ActionError::Deadlock { .. })));
}

#[test]
fn a_child_may_take_a_lock_its_ancestor_holds_and_a_sibling_waits() {
    let mut m = M::new();
    let top = m.begin(SessionId(1), None).unwrap();
    m.lock(top, "x", LockMode::Write).unwrap();
    let c1 = m.begin(SessionId(1), Some(top)).unwrap();
    let c2 = m.begin(SessionId(1), Some(top)).unwrap();
    assert_eq!(m.lock(c1, "x", LockMode::Overwrite).unwrap(), Lock::Granted);
    assert_eq!(m.lock(c2, "x", LockMode::Read).unwrap(), Lock::Wait);
    let done = m.commit_nested(c1).unwrap();
    assert_eq!(done.woken, vec![c2]);
    assert_eq!(m.lock(c2, "x", LockMode::Read).unwrap(), Lock::Granted);
}

#[test]
fn nested_abort_releases_only_the_locks_the_child_took() {
    let mut m = M::new();
    let top = m.begin(SessionId(1), None).unwrap();
    m.lock(top, "x", LockMode::Write).unwrap();
    let child = m.begin(SessionId(1), Some(top)).unwrap();
    m.lock(child, "y", LockMode::Write).unwrap();
    m.set_tentative(child, "y", 3).unwrap();
    let aborted = m.abort(child).unwrap();
    assert_eq!(aborted.dropped, vec![("y", 3)]);
    let other = m.begin(SessionId(2), None).unwrap();
    assert_eq!(m.lock(other, "y", LockMode::Write).unwrap(), Lock::Granted);
    assert_eq!(m.lock(other, "x", LockMode::Read).unwrap(), Lock::Wait);
}

#[test]
fn session_abort_ends_every_action_of_the_session_and_fences_them() {
    let mut m = M::new();
    let a = m.begin(SessionId(7), None).unwrap();
    let nested = m.begin(SessionId(7), Some(a)).unwrap();
    let b = m.begin(SessionId(7), None).unwrap();
    let keep = m.begin(SessionId(8), None).unwrap();
    m.lock(nested, "x", LockMode::Write).unwrap();
    let aborted = m.abort_session(SessionId(7));
    let mut ids: Vec<_> = aborted.iter().flat_map(|x| x.actions.clone()).collect();
    ids.sort();
    assert_eq!(ids, vec![a, nested, b]);
    for id in [a, nested, b] {
        assert_eq!(m.lock(id, "z", LockMode::Read), Err(ActionError::Aborted { action: id }));
    }
    assert_eq!(m.lock(keep, "x", LockMode::Write).unwrap(), Lock::Granted);
}

#[test]
fn a_committing_action_survives_its_session_abort() {
    let mut m = M::new();
    let a = m.begin(SessionId(1), None).unwrap();
    m.lock(a, "x", LockMode::Write).unwrap();
    m.set_tentative(a, "x", 1).unwrap();
    let set = m.prepare_commit(a).unwrap();
    assert!(m.abort_session(SessionId(1)).is_empty());
    assert_eq!(set.writes, vec![("x", 1)]);
    m.finish_commit(a);
}

/// A client may send an action's requests concurrently (a slave's prefetch
/// beside the task's own reads). A lock granted to one of them must not
/// withdraw the action's wait on another key: it used to, and the waiter
/// then missed its wake-up and sat out the whole lock timeout (found as
/// 10 s stalls of dag Cholesky on dependency counters).
#[test]
fn a_grant_on_one_key_keeps_the_wait_on_another() {
    let mut m = M::new();
    let a = m.begin(SessionId(1), None).unwrap();
    let b = m.begin(SessionId(2), None).unwrap();
    m.lock(a, "counter", LockMode::Write).unwrap();
    assert_eq!(m.lock(b, "counter", LockMode::Write).unwrap(), Lock::Wait);
    // b's other request, concurrent with the wait.
    assert_eq!(m.lock(b, "block", LockMode::Read).unwrap(), Lock::Granted);
    m.prepare_commit(a).unwrap();
    assert_eq!(m.finish_commit(a), vec![b], "the waiter must still be woken");
    assert_eq!(m.lock(b, "counter", LockMode::Write).unwrap(), Lock::Granted);
}

#[test]
fn an_action_may_wait_on_two_keys_and_each_wait_ends_alone() {
    let mut m = M::new();
    let a = m.begin(SessionId(1), None).unwrap();
    let b = m.begin(SessionId(2), None).unwrap();
    m.lock(a, "x", LockMode::Write).unwrap();
    m.lock(a, "y", LockMode::Write).unwrap();
    assert_eq!(m.lock(b, "x", LockMode::Read).unwrap(), Lock::Wait);
    assert_eq!(m.lock(b, "y", LockMode::Read).unwrap(), Lock::Wait);
    // A timeout on x withdraws only that wait.
    m.cancel_wait_on(b, &"x");
    m.prepare_commit(a).unwrap();
    assert_eq!(m.finish_commit(a), vec![b], "still waiting on y");
    assert_eq!(m.lock(b, "y", LockMode::Read).unwrap(), Lock::Granted);
    // Both waits count for deadlock detection: c holds z and waits on w held by b.
    let c = m.begin(SessionId(3), None).unwrap();
    m.lock(b, "w", LockMode::Write).unwrap();
    m.lock(c, "z", LockMode::Write).unwrap();
    m.lock(c, "v", LockMode::Write).unwrap();
    assert_eq!(m.lock(b, "v", LockMode::Read).unwrap(), Lock::Wait);
    assert_eq!(m.lock(b, "z", LockMode::Read).unwrap(), Lock::Wait);
    assert!(matches!(m.lock(c, "w", LockMode::Read), Err(ActionError::Deadlock { .. })));
}
