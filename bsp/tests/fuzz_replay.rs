//! The BSP fuzz corpus (`fuzz/corpus/bsp/`) replayed through the fuzz
//! target's body (`fuzz/targets/bsp.rs`) in the ordinary suite.

#[path = "../../fuzz/targets/bsp.rs"]
mod bsp_target;

#[test]
fn the_bsp_corpus_replays_without_a_finding() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/bsp");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        eprintln!("{}", path.display());
        bsp_target::run(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n > 0, "{}: an empty corpus", dir.display());
}
