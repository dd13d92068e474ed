#![no_main]

#[allow(dead_code)]
#[path = "../../master/src/npy.rs"]
mod npy;
#[path = "../targets/npy.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
