//! Fuzz body: a BSP frame header and a peer's hello, as a BSP process
//! reads them from a socket (`bsp::fuzzing`). Shared by
//! `fuzz_targets/bsp.rs` and `bsp/tests/fuzz_replay.rs`.

pub(crate) fn run(data: &[u8]) {
    bsp::fuzzing::frame_header(data);
    bsp::fuzzing::hello(data);
}
