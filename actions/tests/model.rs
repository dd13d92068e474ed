//! Model-based test: random interleavings of begin / nested begin / read /
//! write / overwrite / commit / abort over several concurrent actions, run
//! against the real [`Manager`] and against a deliberately naive model of
//! the semantics. Every lock decision, every value read and the final
//! committed state must agree; every committed top-level action must still
//! see, at its commit, the committed values it read (serialisability in
//! commit order); nothing of an aborted action is ever visible.

use std::collections::{BTreeMap, HashMap};

use actions::{ActionError, ActionId, Lock, LockMode, Lookup, Manager, SessionId};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Begin { parent: Option<usize> },
    Read { who: usize, key: u8 },
    Write { who: usize, key: u8, value: u32, overwrite: bool },
    Commit { who: usize },
    Abort { who: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => proptest::option::of(0usize..16).prop_map(|parent| Op::Begin { parent }),
        4 => (0usize..16, 0u8..5).prop_map(|(who, key)| Op::Read { who, key }),
        4 => (0usize..16, 0u8..5, any::<u32>(), any::<bool>())
            .prop_map(|(who, key, value, overwrite)| Op::Write { who, key, value, overwrite }),
        2 => (0usize..16).prop_map(|who| Op::Commit { who }),
        1 => (0usize..16).prop_map(|who| Op::Abort { who }),
    ]
}

/// The naive model: every action's locks and overlay in plain maps.
#[derive(Default)]
struct Model {
    parent: HashMap<ActionId, Option<ActionId>>,
    locks: HashMap<ActionId, BTreeMap<u8, LockMode>>,
    overlay: HashMap<ActionId, BTreeMap<u8, u32>>,
    committed: BTreeMap<u8, u32>,
    /// Committed values read by each action; they pass to the parent on
    /// nested commit and are checked at top-level commit.
    reads: HashMap<ActionId, Vec<(u8, Option<u32>)>>,
}

impl Model {
    fn chain(&self, mut a: ActionId) -> Vec<ActionId> {
        let mut out = vec![a];
        while let Some(Some(p)) = self.parent.get(&a) {
            out.push(*p);
            a = *p;
        }
        out
    }

    fn children(&self, a: ActionId) -> Vec<ActionId> {
        self.parent.iter().filter(|(_, p)| **p == Some(a)).map(|(c, _)| *c).collect()
    }

    fn grantable(&self, a: ActionId, key: u8, mode: LockMode) -> bool {
        let chain = self.chain(a);
        self.locks.iter().all(|(h, held)| match held.get(&key) {
            None => true,
            Some(m) => chain.contains(h) || (*m == LockMode::Read && mode == LockMode::Read),
        })
    }

    fn grant(&mut self, a: ActionId, key: u8, mode: LockMode) {
        let held = self.locks.get_mut(&a).unwrap();
        let new = match (held.get(&key), mode) {
            (None, m) => m,
            (Some(LockMode::Read), LockMode::Read) => LockMode::Read,
            (Some(LockMode::Overwrite), LockMode::Overwrite) => LockMode::Overwrite,
            _ => LockMode::Write,
        };
        held.insert(key, new);
    }

    fn visible(&self, a: ActionId, key: u8) -> Option<u32> {
        for id in self.chain(a) {
            if let Some(v) = self.overlay[&id].get(&key) {
                return Some(*v);
            }
        }
        self.committed.get(&key).copied()
    }

    fn remove_tree(&mut self, a: ActionId) {
        for c in self.children(a) {
            self.remove_tree(c);
        }
        self.parent.remove(&a);
        self.locks.remove(&a);
        self.overlay.remove(&a);
        self.reads.remove(&a);
    }

    /// No two actions outside each other's ancestry hold conflicting locks.
    fn check_exclusion(&self) {
        for (a, la) in &self.locks {
            for (b, lb) in &self.locks {
                if a == b || self.chain(*a).contains(b) || self.chain(*b).contains(a) {
                    continue;
                }
                for (k, ma) in la {
                    if let Some(mb) = lb.get(k) {
                        assert!(*ma == LockMode::Read && *mb == LockMode::Read, "{a:?} and {b:?} both hold {k}");
                    }
                }
            }
        }
    }
}

fn run(ops: Vec<Op>) {
    let mut m: Manager<u8, u32> = Manager::new();
    let mut model = Model::default();
    let mut committed: BTreeMap<u8, u32> = BTreeMap::new();
    // Every id ever begun, live or not, so ops can name dead actions too.
    let mut ids: Vec<ActionId> = Vec::new();
    let pick = |ids: &Vec<ActionId>, i: usize| ids.get(i % ids.len().max(1)).copied();

    for op in ops {
        match op {
            Op::Begin { parent } => {
                let parent = parent.and_then(|p| pick(&ids, p));
                let got = m.begin(SessionId(1), parent);
                match parent {
                    Some(p) if !model.parent.contains_key(&p) => {
                        assert_eq!(got, Err(ActionError::Aborted { action: p }));
                    }
                    _ => {
                        let id = got.expect("begin under a live parent");
                        model.parent.insert(id, parent);
                        model.locks.insert(id, BTreeMap::new());
                        model.overlay.insert(id, BTreeMap::new());
                        ids.push(id);
                    }
                }
            }
            Op::Read { who, key } => {
                let Some(a) = pick(&ids, who) else { continue };
                if !model.parent.contains_key(&a) {
                    assert_eq!(m.lock(a, key, LockMode::Read), Err(ActionError::Aborted { action: a }));
                    continue;
                }
                let expect = model.grantable(a, key, LockMode::Read);
                let got = m.lock(a, key, LockMode::Read).unwrap();
                assert_eq!(got == Lock::Granted, expect, "read lock on {key} by {a:?}");
                if got == Lock::Wait {
                    m.cancel_wait(a);
                    continue;
                }
                model.grant(a, key, LockMode::Read);
                let tentative_in_chain = model.chain(a).iter().any(|id| model.overlay[id].contains_key(&key));
                let held_overwrite_only = model.locks[&a][&key] == LockMode::Overwrite;
                match m.lookup(a, &key) {
                    Ok(Lookup::Tentative(v)) => assert_eq!(Some(*v), model.visible(a, key)),
                    Ok(Lookup::Committed) => {
                        assert!(!tentative_in_chain);
                        assert_eq!(committed.get(&key).copied(), model.visible(a, key));
                        model.reads.entry(a).or_default().push((key, committed.get(&key).copied()));
                    }
                    Err(ActionError::NotReadable { .. }) => assert!(held_overwrite_only && !tentative_in_chain),
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::Write { who, key, value, overwrite } => {
                let Some(a) = pick(&ids, who) else { continue };
                let mode = if overwrite { LockMode::Overwrite } else { LockMode::Write };
                if !model.parent.contains_key(&a) {
                    assert_eq!(m.lock(a, key, mode), Err(ActionError::Aborted { action: a }));
                    continue;
                }
                let expect = model.grantable(a, key, mode);
                let got = m.lock(a, key, mode).unwrap();
                assert_eq!(got == Lock::Granted, expect, "{mode:?} lock on {key} by {a:?}");
                if got == Lock::Wait {
                    m.cancel_wait(a);
                    continue;
                }
                model.grant(a, key, mode);
                m.set_tentative(a, key, value).unwrap();
                model.overlay.get_mut(&a).unwrap().insert(key, value);
            }
            Op::Commit { who } => {
                let Some(a) = pick(&ids, who) else { continue };
                if !model.parent.contains_key(&a) {
                    assert!(matches!(m.prepare_commit(a), Err(ActionError::Aborted { .. })));
                    continue;
                }
                if !model.children(a).is_empty() {
                    let err = match model.parent[&a] {
                        Some(_) => m.commit_nested(a).unwrap_err(),
                        None => m.prepare_commit(a).unwrap_err(),
                    };
                    assert_eq!(err, ActionError::ChildrenActive { action: a });
                    continue;
                }
                match model.parent[&a] {
                    Some(p) => {
                        m.commit_nested(a).unwrap();
                        let held = model.locks.remove(&a).unwrap();
                        for (k, mode) in held {
                            model.grant(p, k, mode);
                        }
                        let ov = model.overlay.remove(&a).unwrap();
                        model.overlay.get_mut(&p).unwrap().extend(ov);
                        let reads = model.reads.remove(&a).unwrap_or_default();
                        model.reads.entry(p).or_default().extend(reads);
                        model.parent.remove(&a);
                    }
                    None => {
                        for (k, v) in model.reads.get(&a).into_iter().flatten() {
                            assert_eq!(committed.get(k), v.as_ref(), "{a:?} read {k} but it changed before commit");
                        }
                        let set = m.prepare_commit(a).unwrap();
                        let expect: Vec<(u8, u32)> = model.overlay[&a].iter().map(|(k, v)| (*k, *v)).collect();
                        assert_eq!(set.writes, expect);
                        committed.extend(set.writes);
                        m.finish_commit(a);
                        model.committed.extend(model.overlay[&a].clone());
                        model.remove_tree(a);
                    }
                }
            }
            Op::Abort { who } => {
                let Some(a) = pick(&ids, who) else { continue };
                if !model.parent.contains_key(&a) {
                    assert!(matches!(m.abort(a), Err(ActionError::Aborted { .. })));
                    continue;
                }
                let aborted = m.abort(a).unwrap();
                let mut expect = vec![a];
                let mut i = 0;
                while i < expect.len() {
                    expect.extend(model.children(expect[i]));
                    i += 1;
                }
                let mut got = aborted.actions.clone();
                got.sort();
                expect.sort();
                assert_eq!(got, expect);
                model.remove_tree(a);
                for id in &expect {
                    assert_eq!(m.check(*id), Err(ActionError::Aborted { action: *id }));
                }
            }
        }
        model.check_exclusion();
        assert_eq!(committed, model.committed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn matches_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops);
    }
}
