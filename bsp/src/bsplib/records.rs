//! The records inside a `Data` frame: many puts and sends to one destination
//! combined into one buffer (`002…` §15 "combining"), and the get requests
//! carried by the `Meta` frame.
//!
//! ```text
//! PUT  : 1u8 | area u32 | offset u64 | len u64 | bytes
//! SEND : 2u8 | tag_len u32 | len u64 | tag | payload
//! GETQ : area u32 | offset u64 | len u64          (in Meta payloads)
//! ```

use crate::error::BspError;

pub(crate) const PUT: u8 = 1;
pub(crate) const SEND: u8 = 2;
pub(crate) const PUT_HEAD: usize = 21;
pub(crate) const GETQ_LEN: usize = 20;

pub(crate) fn put_head(area: u32, offset: u64, len: u64) -> [u8; PUT_HEAD] {
    let mut b = [0u8; PUT_HEAD];
    b[0] = PUT;
    b[1..5].copy_from_slice(&area.to_le_bytes());
    b[5..13].copy_from_slice(&offset.to_le_bytes());
    b[13..21].copy_from_slice(&len.to_le_bytes());
    b
}

pub(crate) fn push_put(buf: &mut Vec<u8>, area: u32, offset: u64, data: &[u8]) {
    buf.extend_from_slice(&put_head(area, offset, data.len() as u64));
    buf.extend_from_slice(data);
}

pub(crate) fn push_send(buf: &mut Vec<u8>, tag: &[u8], payload: &[u8]) {
    buf.push(SEND);
    buf.extend_from_slice(&(tag.len() as u32).to_le_bytes());
    buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    buf.extend_from_slice(tag);
    buf.extend_from_slice(payload);
}

pub(crate) fn push_getq(buf: &mut Vec<u8>, area: u32, offset: u64, len: u64) {
    buf.extend_from_slice(&area.to_le_bytes());
    buf.extend_from_slice(&offset.to_le_bytes());
    buf.extend_from_slice(&len.to_le_bytes());
}

/// One decoded record, borrowing from the frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    Put { area: u32, offset: u64, data: &'a [u8] },
    Send { tag: &'a [u8], payload: &'a [u8] },
}

fn short(from: usize, what: &str) -> BspError {
    BspError::Protocol { from: format!("process {from}"), detail: format!("truncated {what} record") }
}

fn take<'a>(b: &mut &'a [u8], n: u64, from: usize, what: &str) -> Result<&'a [u8], BspError> {
    if (b.len() as u64) < n {
        return Err(short(from, what));
    }
    let (h, t) = b.split_at(n as usize);
    *b = t;
    Ok(h)
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4"))
}
fn u64_at(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8"))
}

/// Decodes all records of a frame payload.
pub(crate) fn parse(mut b: &[u8], from: usize) -> Result<Vec<Record<'_>>, BspError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let kind = b[0];
        b = &b[1..];
        match kind {
            PUT => {
                let h = take(&mut b, 20, from, "put")?;
                let (area, offset, len) = (u32_at(h), u64_at(&h[4..]), u64_at(&h[12..]));
                let data = take(&mut b, len, from, "put")?;
                out.push(Record::Put { area, offset, data });
            }
            SEND => {
                let h = take(&mut b, 12, from, "send")?;
                let (tl, pl) = (u32_at(h) as u64, u64_at(&h[4..]));
                let tag = take(&mut b, tl, from, "send")?;
                let payload = take(&mut b, pl, from, "send")?;
                out.push(Record::Send { tag, payload });
            }
            k => return Err(BspError::Protocol { from: format!("process {from}"), detail: format!("unknown record kind {k}") }),
        }
    }
    Ok(out)
}

pub(crate) fn parse_getqs(b: &[u8], from: usize) -> Result<Vec<(u32, u64, u64)>, BspError> {
    if !b.len().is_multiple_of(GETQ_LEN) {
        return Err(short(from, "get request"));
    }
    Ok(b.chunks(GETQ_LEN).map(|c| (u32_at(c), u64_at(&c[4..]), u64_at(&c[12..]))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the first record (the put of "hello") ends: a valid cut.
    fn records_len_first() -> usize {
        1 + 20 + 5
    }

    #[test]
    fn records_round_trip_and_truncation() {
        let mut b = Vec::new();
        push_put(&mut b, 7, 9, b"hello");
        push_send(&mut b, b"tg", b"payload");
        let r = parse(&b, 0).unwrap();
        assert_eq!(r, vec![Record::Put { area: 7, offset: 9, data: b"hello" }, Record::Send { tag: b"tg", payload: b"payload" }]);
        let first = records_len_first();
        for cut in (1..b.len()).filter(|&c| c != first) {
            assert!(parse(&b[..cut], 0).is_err(), "cut {cut}");
        }
        assert!(parse(&[9, 0, 0], 0).is_err());
    }
}
