//! The stored form of a block: a 32-byte header, then the payload of
//! little-endian f64 in column-major order.
//!
//! ```text
//! 0..4   magic "FTB2" ("FTB1": the same with a CRC-32C, before
//!        2026-11-27; refused as another format)
//! 4..8   rows  (u32 LE)
//! 8..12  cols  (u32 LE)
//! 12..16 checksum of the payload (u32 LE): the low half of its XXH3-64
//! 16..24 write stamp (u64 LE): the store node's mark of the write that
//!        made this file (0: none); never sent to clients
//! 24..32 reserved, zero
//! ```
//! The stamp tells, after a power cut, a version file that holds what a
//! commit wrote from one that still holds an older block: the node reuses
//! the files of replaced versions, whose old contents pass their own
//! checksums.
//! The node checks the checksum when a block arrives and before it sends
//! one; the client checks it again after the transfer.

use crate::StoreError;

pub const HEADER_LEN: usize = 32;
const MAGIC: &[u8; 4] = b"FTB2";

/// Shape and checksum of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub rows: u32,
    pub cols: u32,
    pub checksum: u32,
}

impl BlockHeader {
    /// The payload's bytes: rows × cols doubles. A shape no slice can
    /// hold (a damaged or hostile header: up to 2^67 bytes) gives
    /// `isize::MAX`, which no payload matches and to which a header's
    /// length still adds without overflow. (Multiplied out, such a shape
    /// overflowed: a panic in a debug build, and in a release build a
    /// wrapped length that a short payload could match; found by the
    /// block fuzz target.)
    pub fn payload_len(&self) -> usize {
        let bytes = u128::from(self.rows) * u128::from(self.cols) * 8;
        usize::try_from(bytes).unwrap_or(usize::MAX).min(isize::MAX as usize)
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        self.encode_stamped(0)
    }

    /// The header as a store node writes it into a version file, with the
    /// stamp of that write.
    pub fn encode_stamped(&self, stamp: u64) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[16..24].copy_from_slice(&stamp.to_le_bytes());
        h[0..4].copy_from_slice(MAGIC);
        h[4..8].copy_from_slice(&self.rows.to_le_bytes());
        h[8..12].copy_from_slice(&self.cols.to_le_bytes());
        h[12..16].copy_from_slice(&self.checksum.to_le_bytes());
        h
    }
}

/// The checksum of a block's payload, as the header stores it: the low 32
/// bits of its XXH3-64 (`checksum::xxh3_64`, where the choice of hash is
/// explained). A warm local get reads and checks each block, so this is a
/// large part of its time.
pub fn checksum(payload: &[u8]) -> u32 {
    block_checksum::xxh3_64(payload) as u32
}

/// [`checksum`] over a payload that arrives in pieces.
#[derive(Default)]
pub struct Checksum(block_checksum::Xxh3);

impl Checksum {
    pub fn new() -> Self {
        Checksum(block_checksum::Xxh3::new())
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    /// The checksum of every piece so far, in order.
    pub fn value(&self) -> u32 {
        self.0.digest() as u32
    }
}

/// Whether a stored value starts as a block of the format before this
/// one (`"FTB1"`: CRC-32C checksums, before 2026-11-27).
pub fn is_earlier_format(value: &[u8]) -> bool {
    value.len() >= 4 && &value[0..4] == b"FTB1"
}

/// Why bytes that [`decode_header`] refused are not a block header: a
/// block of the format before this one (`"FTB1"`, CRC-32C checksums) says
/// so, since its checksums would all fail here.
pub fn bad_header(value: &[u8]) -> &'static str {
    if is_earlier_format(value) {
        "bad block header: a block of an earlier format (FTB1, CRC-32C checksums); this build reads FTB2 blocks only"
    } else {
        "bad block header"
    }
}

/// The header at the start of a stored value, if it is one (magic only:
/// the payload is checked by [`verify`] once it is there).
pub fn decode_header(value: &[u8]) -> Option<BlockHeader> {
    if value.len() < HEADER_LEN || &value[0..4] != MAGIC {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes(value[o..o + 4].try_into().expect("4 bytes"));
    Some(BlockHeader { rows: u32_at(4), cols: u32_at(8), checksum: u32_at(12) })
}

/// The write stamp of a stored value's header, if it has a header.
pub fn stamp(value: &[u8]) -> Option<u64> {
    decode_header(value)?;
    Some(u64::from_le_bytes(value[16..24].try_into().expect("8 bytes")))
}

/// Splits a stored value into its header and payload, checking magic,
/// length and checksum. `what` names the block in the error.
pub fn decode<'a>(value: &'a [u8], what: &dyn Fn() -> String) -> Result<(BlockHeader, &'a [u8]), StoreError> {
    let corrupt = |why: &str| StoreError::Corrupt { what: format!("{}: {why}", what()) };
    let header = decode_header(value).ok_or_else(|| corrupt(bad_header(value)))?;
    let payload = &value[HEADER_LEN..];
    if payload.len() != header.payload_len() {
        return Err(corrupt("payload length does not match the header"));
    }
    if !checksum_matches(&header, payload) {
        return Err(corrupt("checksum mismatch"));
    }
    Ok((header, payload))
}

/// Whether a payload matches its header's checksum.
pub fn checksum_matches(header: &BlockHeader, payload: &[u8]) -> bool {
    checksum(payload) == header.checksum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fuzzing regression (`fuzz/corpus/block/huge-shape`): a header of
    /// 2^32 − 1 rows and columns is refused as corrupt, not an overflow,
    /// and no wrapped length matches a short payload.
    #[test]
    fn a_header_whose_shape_overflows_is_corrupt_not_a_panic() {
        let huge = BlockHeader { rows: u32::MAX, cols: u32::MAX, checksum: 0 };
        assert_eq!(huge.payload_len(), isize::MAX as usize);
        // 2^31 × 2^30 × 8 = 2^64 bytes: 0 once wrapped in 64 bits.
        let wraps = BlockHeader { rows: 1 << 31, cols: 1 << 30, checksum: checksum(&[]) };
        let value = wraps.encode();
        let e = decode(&value, &|| "block (0, 0)".into()).unwrap_err();
        assert!(matches!(&e, StoreError::Corrupt { what } if what.contains("payload length")), "{e}");
        assert_eq!(HEADER_LEN + huge.payload_len(), HEADER_LEN + isize::MAX as usize);
    }

    /// A header of the CRC-32C format before this one is refused, and
    /// says which format it is; other garbage is a bad header.
    #[test]
    fn a_block_of_the_earlier_format_is_refused_by_name() {
        let payload = [0u8; 16];
        let mut old = BlockHeader { rows: 1, cols: 2, checksum: checksum(&payload) }.encode().to_vec();
        old[0..4].copy_from_slice(b"FTB1");
        old.extend_from_slice(&payload);
        assert_eq!(decode_header(&old), None);
        let e = decode(&old, &|| "block (0, 0)".into()).unwrap_err();
        assert!(matches!(&e, StoreError::Corrupt { what } if what.contains("earlier format (FTB1")), "{e}");
        let mut garbage = old.clone();
        garbage[0..4].copy_from_slice(b"XXXX");
        let e = decode(&garbage, &|| "block (0, 0)".into()).unwrap_err();
        assert!(matches!(&e, StoreError::Corrupt { what } if what.ends_with("bad block header")), "{e}");
    }

    #[test]
    fn a_flipped_byte_anywhere_is_caught() {
        let payload: Vec<u8> = (0..64u8).collect();
        let h = BlockHeader { rows: 2, cols: 4, checksum: checksum(&payload) };
        let mut value = h.encode().to_vec();
        value.extend_from_slice(&payload);
        assert_eq!(decode(&value, &|| "b".into()).unwrap().0, h);
        for i in 0..16 {
            let mut bad = value.clone();
            bad[if i < 8 { i } else { HEADER_LEN + i * 3 }] ^= 0x40;
            assert!(matches!(decode(&bad, &|| "b".into()), Err(StoreError::Corrupt { .. })), "byte {i}");
        }
    }

    #[test]
    fn a_stamp_is_read_back_and_changes_nothing_else() {
        let payload = [7u8; 16];
        let h = BlockHeader { rows: 1, cols: 2, checksum: checksum(&payload) };
        let value = [&h.encode_stamped(0xfeed_f00d_0000_0001)[..], &payload].concat();
        assert_eq!(stamp(&value), Some(0xfeed_f00d_0000_0001));
        assert_eq!(decode(&value, &|| "b".into()).unwrap().0, h);
        assert_eq!(stamp(&[&h.encode()[..], &payload].concat()), Some(0));
        assert_eq!(stamp(&payload), None, "no header");
    }
}
