use super::*;

fn committed(bags: &mut Bags, a: u64, bag: &str, payloads: &[&str]) {
    for p in payloads {
        bags.enqueue(ActionId(a), bag, p.as_bytes().to_vec());
    }
    bags.prepare_commit(ActionId(a));
    bags.finish_commit(ActionId(a), true);
}

fn take(bags: &mut Bags, a: u64, bag: &str) -> Dequeued {
    match bags.dequeue(ActionId(a), bag) {
        Dequeue::Task(t) => t,
        other => panic!("expected a task, got {other:?}"),
    }
}

#[test]
fn an_aborted_element_comes_back_first_in_line() {
    let mut bags = Bags::new(3);
    committed(&mut bags, 1, "b", &["t1", "t2", "t3"]);
    let t1 = take(&mut bags, 10, "b");
    let t2 = take(&mut bags, 11, "b");
    assert_eq!((t1.payload.as_slice(), t2.payload.as_slice()), (&b"t1"[..], &b"t2"[..]));
    bags.abort(ActionId(10), true);
    assert_eq!(take(&mut bags, 12, "b").payload, b"t1");
    assert_eq!(take(&mut bags, 13, "b").payload, b"t3");
}

#[test]
fn empty_and_none_available_differ() {
    let mut bags = Bags::new(3);
    assert_eq!(bags.dequeue(ActionId(1), "none"), Dequeue::Empty);
    committed(&mut bags, 1, "b", &["t"]);
    take(&mut bags, 2, "b");
    assert_eq!(bags.dequeue(ActionId(3), "b"), Dequeue::NoneAvailable);
    let muts = bags.prepare_commit(ActionId(2));
    assert_eq!(muts, vec![Mutation::Delete { bag: "b".into(), seq: 0 }]);
    // Until the batch is durable the element is still taken.
    assert_eq!(bags.dequeue(ActionId(3), "b"), Dequeue::NoneAvailable);
    bags.finish_commit(ActionId(2), true);
    assert_eq!(bags.dequeue(ActionId(3), "b"), Dequeue::Empty);
}

/// A commit's batch is visible in the store (its job record, say) before
/// its elements are free: in between, the bag is not empty. (Slaves that
/// saw a new job's record and got `Empty` marked the job finished before
/// any of its tasks ran.)
#[test]
fn a_bag_whose_elements_are_being_committed_is_not_empty() {
    let mut bags = Bags::new(3);
    bags.enqueue(ActionId(1), "new", b"t".to_vec());
    bags.prepare_commit(ActionId(1));
    assert_eq!(bags.dequeue(ActionId(2), "new"), Dequeue::NoneAvailable);
    assert!(!bags.is_empty("new"));
    assert_eq!(bags.finish_commit(ActionId(1), true), vec!["new".to_string()], "waiters are woken");
    assert_eq!(take(&mut bags, 2, "new").payload, b"t");

    // A batch that failed leaves the bag as it was, and wakes the waiters
    // so that they see it.
    bags.enqueue(ActionId(3), "lost", b"t".to_vec());
    bags.prepare_commit(ActionId(3));
    assert_eq!(bags.dequeue(ActionId(4), "lost"), Dequeue::NoneAvailable);
    assert_eq!(bags.finish_commit(ActionId(3), false), vec!["lost".to_string()]);
    assert_eq!(bags.dequeue(ActionId(4), "lost"), Dequeue::Empty);
    assert!(bags.is_empty("lost"));
}

#[test]
fn several_dequeues_in_one_action_and_enqueues_visible_only_after_commit() {
    let mut bags = Bags::new(3);
    committed(&mut bags, 1, "b", &["a", "b"]);
    take(&mut bags, 5, "b");
    take(&mut bags, 5, "b");
    bags.enqueue(ActionId(5), "next", b"c".to_vec());
    assert_eq!(bags.dequeue(ActionId(6), "next"), Dequeue::Empty);
    let muts = bags.prepare_commit(ActionId(5));
    assert_eq!(muts.len(), 4, "two deletes, a put and the next position: {muts:?}");
    bags.finish_commit(ActionId(5), true);
    assert!(bags.is_empty("b"));
    assert_eq!(take(&mut bags, 6, "next").payload, b"c");
}

#[test]
fn a_failed_commit_returns_elements_and_drops_enqueues() {
    let mut bags = Bags::new(3);
    committed(&mut bags, 1, "b", &["a"]);
    take(&mut bags, 5, "b");
    bags.enqueue(ActionId(5), "b", b"new".to_vec());
    bags.prepare_commit(ActionId(5));
    bags.finish_commit(ActionId(5), false);
    assert_eq!(bags.stats("b"), BagStats { free: 1, taken: 0 });
    assert_eq!(take(&mut bags, 6, "b").payload, b"a");
}

#[test]
fn nested_commit_passes_elements_to_the_parent_and_nested_abort_returns_them() {
    let mut bags = Bags::new(3);
    committed(&mut bags, 1, "b", &["a", "b"]);
    take(&mut bags, 20, "b");
    bags.commit_nested(ActionId(20), ActionId(2));
    take(&mut bags, 21, "b");
    bags.abort(ActionId(21), false);
    assert_eq!(bags.stats("b"), BagStats { free: 1, taken: 1 });
    let muts = bags.prepare_commit(ActionId(2));
    assert_eq!(muts, vec![Mutation::Delete { bag: "b".into(), seq: 0 }]);
    bags.finish_commit(ActionId(2), true);
    assert_eq!(take(&mut bags, 3, "b").returns, 1);
}

#[test]
fn orphaned_past_the_limit_goes_to_the_dead_letter_bag() {
    let mut bags = Bags::new(2);
    committed(&mut bags, 1, "b", &["poison", "ok"]);
    take(&mut bags, 2, "b");
    let first = bags.abort(ActionId(2), true);
    assert_eq!(first.mutations, vec![Mutation::Put { bag: "b".into(), seq: 0, payload: b"poison".to_vec(), attempts: 1 }]);
    assert_eq!(take(&mut bags, 3, "b").attempts, 1);
    let second = bags.abort(ActionId(3), true);
    assert_eq!(second.dead_lettered.len(), 1);
    assert_eq!(
        second.mutations,
        vec![
            Mutation::Delete { bag: "b".into(), seq: 0 },
            Mutation::Put { bag: "b.dead".into(), seq: 0, payload: b"poison".to_vec(), attempts: 2 },
            Mutation::NextSeq { bag: "b.dead".into(), next: 1 },
        ]
    );
    assert_eq!(take(&mut bags, 4, "b").payload, b"ok");
    assert_eq!(bags.stats("b.dead").free, 1);
}

#[test]
fn load_restores_order_and_next_position() {
    let mut bags = Bags::new(3);
    bags.load("b", 7, b"x".to_vec(), 1);
    bags.load("b", 3, b"y".to_vec(), 0);
    assert_eq!(take(&mut bags, 1, "b").payload, b"y");
    bags.enqueue(ActionId(2), "b", b"z".to_vec());
    let muts = bags.prepare_commit(ActionId(2));
    assert!(matches!(&muts[..], [Mutation::Put { seq: 8, .. }, Mutation::NextSeq { next: 9, .. }]), "{muts:?}");
}

/// Elements taken and committed leave no trace in the bag, so only the
/// persisted next position keeps a restart from handing their numbers out
/// again (a task's records are keyed by its element's number).
#[test]
fn a_restart_never_reuses_the_number_of_an_element_already_gone() {
    let mut bags = Bags::new(3);
    for p in ["t0", "t1", "t2"] {
        bags.enqueue(ActionId(1), "b", p.as_bytes().to_vec());
    }
    let mut persisted_next = 0;
    for a in 1..5 {
        if a > 1 {
            take(&mut bags, a, "b");
        }
        for m in bags.prepare_commit(ActionId(a)) {
            if let Mutation::NextSeq { next, .. } = m {
                persisted_next = persisted_next.max(next);
            }
        }
        bags.finish_commit(ActionId(a), true);
    }
    assert_eq!(persisted_next, 3);
    assert_eq!(bags.stats("b").free, 0);
    // After a restart: nothing to load but the next position.
    let mut again = Bags::new(3);
    again.load_next_seq("b", persisted_next);
    again.enqueue(ActionId(9), "b", b"t3".to_vec());
    let muts = again.prepare_commit(ActionId(9));
    assert!(matches!(&muts[..], [Mutation::Put { seq: 3, .. }, ..]), "{muts:?}");
}

#[test]
fn a_listing_shows_attempts_and_returns_of_every_element() {
    let mut bags = Bags::new(3);
    committed(&mut bags, 1, "b", &["t1", "t2", "t3"]);
    take(&mut bags, 10, "b");
    bags.abort(ActionId(10), false); // t1 given back on purpose
    take(&mut bags, 11, "b");
    bags.abort(ActionId(11), true); // t1 orphaned
    take(&mut bags, 12, "b"); // t1 held while listed
    let listed: Vec<(u64, u32, u32)> = bags.peek_all("b").iter().map(|d| (d.seq, d.attempts, d.returns)).collect();
    assert_eq!(listed, vec![(0, 1, 1), (1, 0, 0), (2, 0, 0)]);
    assert!(bags.peek_all("missing").is_empty());
}

fn committed_near(bags: &mut Bags, a: u64, bag: &str, elements: &[(&str, &[u8])]) {
    for (payload, locality) in elements {
        bags.enqueue_near(ActionId(a), bag, payload.as_bytes().to_vec(), locality.to_vec());
    }
    bags.prepare_commit(ActionId(a));
    bags.finish_commit(ActionId(a), true);
}

fn take_nearest(bags: &mut Bags, a: u64, bag: &str, held: &[u8]) -> Dequeued {
    // A locality here is a list of input names of one byte; the score is
    // how many of them the caller holds.
    let mut score = |inputs: &[u8]| inputs.iter().filter(|i| held.contains(i)).count();
    match bags.dequeue_nearest(ActionId(a), bag, &mut score) {
        Dequeue::Task(t) => t,
        other => panic!("expected a task, got {other:?}"),
    }
}

#[test]
fn the_nearest_element_goes_first_and_the_earliest_wins_ties() {
    let mut bags = Bags::new(3);
    committed_near(&mut bags, 1, "b", &[("t0", b"ab"), ("t1", b"cd"), ("t2", b"ce"), ("t3", b"cd")]);
    assert_eq!(take_nearest(&mut bags, 10, "b", b"cd").payload, b"t1", "both inputs held");
    assert_eq!(take_nearest(&mut bags, 11, "b", b"cd").payload, b"t3");
    assert_eq!(take_nearest(&mut bags, 12, "b", b"c").payload, b"t2", "one held beats none");
    assert_eq!(take_nearest(&mut bags, 13, "b", b"z").payload, b"t0", "nothing held: in order");
    assert_eq!(bags.dequeue_nearest(ActionId(14), "b", &mut |_: &[u8]| 0), Dequeue::NoneAvailable);
    bags.abort(ActionId(11), false);
    assert_eq!(take_nearest(&mut bags, 15, "b", b"z").payload, b"t3", "an aborted element comes back");
}

#[test]
fn order_is_kept_where_the_bag_gives_no_locality() {
    let mut bags = Bags::new(3);
    committed_near(&mut bags, 1, "b", &[("t0", b"a"), ("barrier", b""), ("t2", b"z")]);
    assert_eq!(take_nearest(&mut bags, 10, "b", b"z").payload, b"t0", "the scan stops at an element without locality");
    assert_eq!(take_nearest(&mut bags, 11, "b", b"z").payload, b"barrier");
    assert_eq!(take_nearest(&mut bags, 12, "b", b"z").payload, b"t2");

    // Lost work first: an orphaned element back at the head is taken
    // whatever the caller holds.
    committed_near(&mut bags, 2, "c", &[("t0", b"a"), ("t1", b"z")]);
    take_nearest(&mut bags, 20, "c", b"a");
    bags.abort(ActionId(20), true);
    assert_eq!(take_nearest(&mut bags, 21, "c", b"z").payload, b"t0");
}

#[test]
fn locality_looks_only_a_window_ahead() {
    let mut bags = Bags::new(3);
    let mut elements: Vec<(String, Vec<u8>)> = (0..LOCALITY_WINDOW).map(|k| (format!("t{k}"), b"a".to_vec())).collect();
    elements.push(("far".into(), b"z".to_vec()));
    let refs: Vec<(&str, &[u8])> = elements.iter().map(|(p, l)| (p.as_str(), l.as_slice())).collect();
    committed_near(&mut bags, 1, "b", &refs);
    assert_eq!(take_nearest(&mut bags, 10, "b", b"z").payload, b"t0", "past the window: in order");
    assert_eq!(take_nearest(&mut bags, 11, "b", b"z").payload, b"far", "now inside it");
}

#[test]
fn lower_ranks_go_first_and_an_abort_keeps_the_rank() {
    let mut bags = Bags::new(3);
    bags.enqueue(ActionId(1), "b", b"plain".to_vec());
    bags.enqueue(ActionId(1), "b", ranked(5, b"r5"));
    bags.enqueue(ActionId(1), "b", ranked(2, b"r2"));
    bags.enqueue(ActionId(1), "b", ranked(5, b"r5 later"));
    let muts = bags.prepare_commit(ActionId(1));
    bags.finish_commit(ActionId(1), true);
    // Persisted with the rank, handed out without it.
    assert!(muts.contains(&Mutation::Put { bag: "b".into(), seq: 2, payload: ranked(2, b"r2"), attempts: 0 }));
    assert_eq!(take(&mut bags, 10, "b").payload, b"r2");
    let t = take(&mut bags, 11, "b");
    assert_eq!(t.payload, b"r5");
    bags.abort(ActionId(11), true);
    assert_eq!(take(&mut bags, 12, "b").payload, b"r5", "back first within its rank");
    assert_eq!(take(&mut bags, 13, "b").payload, b"r5 later");
    assert_eq!(take(&mut bags, 14, "b").payload, b"plain", "unranked after every ranked element");
    assert_eq!(
        bags.peek_all("b").iter().map(|d| d.payload.clone()).collect::<Vec<_>>(),
        vec![b"plain".to_vec(), b"r5".to_vec(), b"r2".to_vec(), b"r5 later".to_vec()]
    );
}

#[test]
fn a_loaded_element_keeps_its_rank() {
    let mut bags = Bags::new(3);
    bags.load("b", 0, b"plain".to_vec(), 0);
    bags.load("b", 1, ranked(0, b"first"), 1);
    let t = take(&mut bags, 1, "b");
    assert_eq!((t.seq, t.payload.as_slice(), t.attempts), (1, &b"first"[..], 1));
    assert_eq!(split_rank(&ranked(7, b"x")), (7, &b"x"[..]));
    assert_eq!(split_rank(b"{\"k\":1}"), (UNRANKED, &b"{\"k\":1}"[..]));
}

#[test]
fn a_nearest_dequeue_scans_by_rank() {
    let mut bags = Bags::new(3);
    bags.enqueue_near(ActionId(1), "b", ranked(9, b"late, held"), vec![1]);
    bags.enqueue_near(ActionId(1), "b", ranked(1, b"early, not held"), vec![2]);
    bags.prepare_commit(ActionId(1));
    bags.finish_commit(ActionId(1), true);
    // The window is taken in rank order; the caller's cache picks within it.
    assert_eq!(take_nearest(&mut bags, 2, "b", &[1]).payload, b"late, held");
    assert_eq!(take_nearest(&mut bags, 3, "b", &[1]).payload, b"early, not held");
}
