//! Wait-for cycle detection, run each time a lock request must wait.
//!
//! An action cannot finish while any action in its subtree waits (a parent
//! commits only after its children end), so the edges out of an action are
//! the blockers of every waiting action below it. The request would
//! deadlock if, following edges from its blockers, we reach the requester
//! or one of its ancestors.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

use crate::manager::Manager;
use crate::ActionId;

pub(crate) fn would_cycle<K, V>(m: &Manager<K, V>, requester: ActionId, blockers: &[ActionId]) -> bool
where
    K: Clone + Eq + Hash + Ord + Debug,
{
    let mut stack: Vec<ActionId> = blockers.to_vec();
    let mut seen = HashSet::new();
    while let Some(node) = stack.pop() {
        if !seen.insert(node) {
            continue;
        }
        if m.is_ancestor_or_self(node, requester) {
            return true;
        }
        let mut subtree = vec![node];
        while let Some(d) = subtree.pop() {
            let Some(a) = m.actions.get(&d) else { continue };
            subtree.extend(a.children.iter().copied());
            for (key, mode) in &a.waiting_on {
                stack.extend(m.conflicting_holders(d, key, *mode));
            }
        }
    }
    false
}
