//! The stored form of a block: a 32-byte header, then the payload of
//! little-endian f64 in column-major order.
//!
//! ```text
//! 0..4   magic "FTB1"
//! 4..8   rows  (u32 LE)
//! 8..12  cols  (u32 LE)
//! 12..16 crc32c of the payload (u32 LE)
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
const MAGIC: &[u8; 4] = b"FTB1";

/// Shape and checksum of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub rows: u32,
    pub cols: u32,
    pub crc32c: u32,
}

impl BlockHeader {
    pub fn payload_len(&self) -> usize {
        self.rows as usize * self.cols as usize * 8
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
        h[12..16].copy_from_slice(&self.crc32c.to_le_bytes());
        h
    }
}

/// CRC-32C (Castagnoli) of a block's payload, as the header stores it.
pub fn checksum(payload: &[u8]) -> u32 {
    // `crc-fast` picks the carry-less multiply kernels this CPU has at run
    // time: 9.0 µs per 512 KiB here against 18.6 with the SSE4.2 `crc32`
    // instruction (the `crc32c` crate), the same value. A warm local get
    // reads and checks each block, so this is a fifth of its time.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, payload) as u32
}

/// [`checksum`] over a payload that arrives in pieces.
pub struct Checksum(crc_fast::Digest);

impl Checksum {
    pub fn new() -> Self {
        Checksum(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi))
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    /// The checksum of every piece so far, in order.
    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }
}

impl Default for Checksum {
    fn default() -> Self {
        Self::new()
    }
}

/// The header at the start of a stored value, if it is one (magic only:
/// the payload is checked by [`verify`] once it is there).
pub fn decode_header(value: &[u8]) -> Option<BlockHeader> {
    if value.len() < HEADER_LEN || &value[0..4] != MAGIC {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes(value[o..o + 4].try_into().expect("4 bytes"));
    Some(BlockHeader { rows: u32_at(4), cols: u32_at(8), crc32c: u32_at(12) })
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
    let header = decode_header(value).ok_or_else(|| corrupt("bad block header"))?;
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
    checksum(payload) == header.crc32c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_byte_anywhere_is_caught() {
        let payload: Vec<u8> = (0..64u8).collect();
        let h = BlockHeader { rows: 2, cols: 4, crc32c: checksum(&payload) };
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
        let h = BlockHeader { rows: 1, cols: 2, crc32c: checksum(&payload) };
        let value = [&h.encode_stamped(0xfeed_f00d_0000_0001)[..], &payload].concat();
        assert_eq!(stamp(&value), Some(0xfeed_f00d_0000_0001));
        assert_eq!(decode(&value, &|| "b".into()).unwrap().0, h);
        assert_eq!(stamp(&[&h.encode()[..], &payload].concat()), Some(0));
        assert_eq!(stamp(&payload), None, "no header");
    }
}
