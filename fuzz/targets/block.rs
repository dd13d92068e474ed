//! Fuzz body: a stored block's header and checksum check, as a client
//! checks what a node hands it and the node checks what a put carries.
//! Shared by `fuzz_targets/block.rs` and `client/tests/fuzz_replay.rs`.

use store_client::block;

pub(crate) fn run(data: &[u8]) {
    let _ = block::stamp(data);
    let _ = (block::is_earlier_format(data), block::bad_header(data));
    if let Some(h) = block::decode_header(data) {
        // Any shape a header names has a length, or none that fits.
        let _ = h.payload_len();
    }
    if let Ok((header, payload)) = block::decode(data, &|| "fuzzed block".into()) {
        // Accepted: the payload is exactly the shape's doubles.
        assert_eq!(payload.len() as u64, u64::from(header.rows) * u64::from(header.cols) * 8);
        assert!(block::checksum_matches(&header, payload));
    }
}
