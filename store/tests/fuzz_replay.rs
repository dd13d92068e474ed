//! The node-call fuzz corpus (`fuzz/corpus/node_call/`) replayed through
//! the fuzz target's body (`fuzz/targets/node_call.rs`): protobuf
//! requests into an in-process node's handlers over its data plane.

#[path = "../../fuzz/targets/node_call.rs"]
mod node_call_target;

#[test]
fn the_node_call_corpus_replays_without_a_finding() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/node_call");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        eprintln!("{}", path.display());
        node_call_target::run(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n > 0, "{}: an empty corpus", dir.display());
}
