//! Fuzz body: a `.npy` file's header, as `master matrix import` reads it
//! (`master/src/npy.rs`). Shared by `fuzz_targets/npy.rs` and the corpus
//! replay among master's unit tests.

use std::io::{Seek, Write};

pub(crate) fn run(data: &[u8]) {
    let mut f = tempfile::tempfile().expect("a temporary file");
    f.write_all(data).expect("written");
    f.rewind().expect("rewound");
    if let Ok(layout) = crate::npy::read_header(&mut f) {
        // Accepted: the file holds exactly the matrix's doubles.
        let need = layout.rows.checked_mul(layout.cols).and_then(|n| n.checked_mul(8)).expect("a size that fits");
        assert_eq!(data.len() as u64, layout.data_offset + need);
        if layout.rows > 0 && layout.cols > 0 {
            assert_eq!(layout.offset(layout.rows - 1, layout.cols - 1) + 8, data.len() as u64);
        }
    }
}
