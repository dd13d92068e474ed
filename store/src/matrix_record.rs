//! A matrix's record on disk (the `matrices` column family's values), in a
//! layout of the store's own, so that the wire's protobuf messages can
//! change without touching data directories.
//!
//! ```text
//! version 1:  0x01 | id (16 bytes) | n_rows u64 LE | n_cols u64 LE | block u32 LE | name (UTF-8, the rest)
//! ```
//!
//! Records written before the layout existed are the wire's protobuf
//! `MatrixInfo`, whose first byte is field 1's tag (0x0A), never 0x01: they
//! are still read; new records take the current layout.

use store_client::MatrixInfo;
use uuid::Uuid;

const VERSION_1: u8 = 0x01;
const FIXED: usize = 1 + 16 + 8 + 8 + 4;

/// The record of `info` in the current layout.
pub(crate) fn encode(info: &MatrixInfo) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED + info.name.len());
    out.push(VERSION_1);
    out.extend_from_slice(info.id.as_bytes());
    out.extend_from_slice(&info.n_rows.to_le_bytes());
    out.extend_from_slice(&info.n_cols.to_le_bytes());
    out.extend_from_slice(&info.block.to_le_bytes());
    out.extend_from_slice(info.name.as_bytes());
    out
}

/// A record in any layout the store has written, or why it is unreadable.
pub(crate) fn decode(record: &[u8]) -> Result<MatrixInfo, String> {
    match record.first() {
        Some(&VERSION_1) => decode_v1(record),
        Some(0x0A) => decode_protobuf(record),
        Some(other) => Err(format!("unknown matrix record layout {other:#04x}")),
        None => Err("empty matrix record".into()),
    }
}

fn decode_v1(record: &[u8]) -> Result<MatrixInfo, String> {
    if record.len() < FIXED {
        return Err(format!("matrix record of {} bytes, shorter than its {FIXED} fixed bytes", record.len()));
    }
    let u64_at = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    let id = Uuid::from_slice(&record[1..17]).expect("16 bytes");
    let block = u32::from_le_bytes(record[33..37].try_into().expect("4 bytes"));
    let name = std::str::from_utf8(&record[FIXED..]).map_err(|_| "matrix record: name is not UTF-8".to_owned())?;
    Ok(MatrixInfo { id, name: name.to_owned(), n_rows: u64_at(17), n_cols: u64_at(25), block })
}

fn decode_protobuf(record: &[u8]) -> Result<MatrixInfo, String> {
    use prost::Message;
    let p = store_client::proto::MatrixInfo::decode(record).map_err(|e| format!("matrix record (protobuf layout): {e}"))?;
    MatrixInfo::try_from(p).map_err(|e| format!("matrix record (protobuf layout): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str) -> MatrixInfo {
        MatrixInfo { id: Uuid::new_v4(), name: name.into(), n_rows: 16385, n_cols: 3, block: 2048 }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        for name in ["A", "", "ünïcode/with spaces"] {
            let m = info(name);
            assert_eq!(decode(&encode(&m)).unwrap(), m);
        }
    }

    #[test]
    fn records_of_the_protobuf_layout_still_read() {
        use prost::Message;
        let m = info("legacy");
        let p = store_client::proto::MatrixInfo {
            id: m.id.as_bytes().to_vec().into(),
            name: m.name.clone(),
            n_rows: m.n_rows,
            n_cols: m.n_cols,
            block: m.block,
        };
        assert_eq!(decode(&p.encode_to_vec()).unwrap(), m);
    }

    #[test]
    fn damaged_records_are_refused_with_a_reason() {
        let good = encode(&info("x"));
        assert!(decode(&[]).unwrap_err().contains("empty"));
        assert!(decode(&[0x7f]).unwrap_err().contains("unknown"));
        assert!(decode(&good[..FIXED - 1]).unwrap_err().contains("shorter"));
        let mut bad_name = good.clone();
        bad_name.push(0xff);
        assert!(decode(&bad_name).unwrap_err().contains("UTF-8"));
    }
}
