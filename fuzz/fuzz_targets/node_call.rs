#![no_main]

#[path = "../targets/node_call.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
