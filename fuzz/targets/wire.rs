//! Fuzz body: the block data plane's fixed-size request and reply, its
//! hello, and the variable parts a node or client decodes (local entries,
//! peeks, a get-many body). Shared by `fuzz_targets/wire.rs` and the
//! corpus replay in the ordinary suite (`client/tests/fuzz_replay.rs`).

use store_client::dataplane::wire;

pub(crate) fn run(data: &[u8]) {
    if let Some(b) = data.get(..wire::REQUEST_LEN) {
        let b: &[u8; wire::REQUEST_LEN] = b.try_into().expect("REQUEST_LEN bytes");
        if let Ok(r) = wire::Request::decode(b) {
            // What decodes encodes back to what decodes the same.
            assert_eq!(wire::Request::decode(&r.encode()).ok(), Some(r));
        }
    }
    if let Some(b) = data.get(..wire::REPLY_LEN) {
        let b: &[u8; wire::REPLY_LEN] = b.try_into().expect("REPLY_LEN bytes");
        if let Ok(r) = wire::Reply::decode(b) {
            assert_eq!(wire::Reply::decode(&r.encode()).ok(), Some(r));
        }
    }
    if let Some(b) = data.get(..8) {
        let _ = wire::decode_hello_head(b.try_into().expect("8 bytes"));
    }
    if let Some(e) = wire::LocalEntry::decode(data) {
        assert_eq!(wire::LocalEntry::decode(&e.encode()), Some(e));
    }
    if let Some(p) = wire::Peek::decode(data) {
        assert_eq!(wire::Peek::decode(&p.encode()), Some(p));
    }
    assert_eq!(wire::decode_many(data).len(), data.len() / 8);
}
