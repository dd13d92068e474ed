//! The fuzz corpus (`fuzz/corpus/`) replayed through the fuzz targets'
//! own bodies (`fuzz/targets/`), so that every seed and every finding
//! kept there stays a test of the ordinary suite, without libFuzzer or
//! the nightly toolchain.

#[path = "../../fuzz/targets/block.rs"]
mod block_target;
#[path = "../../fuzz/targets/wire.rs"]
mod wire_target;

/// Every file of a target's corpus, by name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            (path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: an empty corpus", dir.display());
    files
}

#[test]
fn the_wire_corpus_replays_without_a_finding() {
    for (name, data) in corpus("wire") {
        eprintln!("wire/{name}");
        wire_target::run(&data);
    }
}

#[test]
fn the_block_corpus_replays_without_a_finding() {
    for (name, data) in corpus("block") {
        eprintln!("block/{name}");
        block_target::run(&data);
    }
}

/// The seed of a block with no payload carries the checksum of no bytes:
/// the fuzzer starts from a block that passes its check.
#[test]
fn the_block_seed_of_no_payload_passes_its_check() {
    let seed = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/block/valid-empty")).unwrap();
    let decoded = store_client::block::decode(&seed, &|| "seed".into());
    assert!(decoded.is_ok(), "{decoded:?}; the checksum of no bytes is {:#x}", store_client::block::checksum(&[]));
}
