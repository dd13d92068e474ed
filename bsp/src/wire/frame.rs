//! The frame format. Every byte on a group connection after the handshake is
//! a frame: a fixed 24-byte header and `len` bytes of payload.
//!
//! ```text
//! offset size field
//!  0      4   magic  0x42 0x53 0x50 0x46 ("BSPF")
//!  4      1   kind   (see `Kind`)
//!  5      3   zero
//!  8      4   len    payload bytes, little endian, <= the configured maximum
//! 12      4   aux    kind-specific (Meta: data frames announced)
//! 16      8   step   superstep number
//! ```
//!
//! The header is checked before any payload is allocated, so a garbage length
//! from a broken peer is a `Protocol` error, never a huge allocation.

pub(crate) const MAGIC: [u8; 4] = *b"BSPF";
pub(crate) const HEADER_LEN: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// One round of the count exchange (`aux` = the round's distance 2^k);
    /// payload: the p×p count rows the sender knows.
    Meta = 1,
    /// A batch of put / send records.
    Data = 2,
    /// Replies to get requests, read before any put of the superstep landed.
    GetReply = 3,
    /// `abort`: payload is the message.
    Abort = 4,
    /// Keeps a silent link distinguishable from a dead one.
    Heartbeat = 5,
    /// Clean departure: an EOF after this is not a failure.
    Bye = 6,
    /// Get requests, sent at the start of `sync` before the count exchange.
    GetReq = 7,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Meta,
            2 => Kind::Data,
            3 => Kind::GetReply,
            4 => Kind::Abort,
            5 => Kind::Heartbeat,
            6 => Kind::Bye,
            7 => Kind::GetReq,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    pub(crate) len: u32,
    pub(crate) aux: u32,
    pub(crate) step: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    BadMagic([u8; 4]),
    BadKind(u8),
    TooLong { len: u32, max: u32 },
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::BadMagic(m) => write!(f, "bad frame magic {m:02x?}"),
            HeaderError::BadKind(k) => write!(f, "unknown frame kind {k}"),
            HeaderError::TooLong { len, max } => write!(f, "frame of {len} bytes exceeds the maximum {max}"),
        }
    }
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.kind as u8;
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..16].copy_from_slice(&self.aux.to_le_bytes());
        b[16..24].copy_from_slice(&self.step.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; HEADER_LEN], max_len: u32) -> Result<Header, HeaderError> {
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        let kind = Kind::from_u8(b[4]).ok_or(HeaderError::BadKind(b[4]))?;
        let len = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if len > max_len {
            return Err(HeaderError::TooLong { len, max: max_len });
        }
        Ok(Header {
            kind,
            len,
            aux: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
            step: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// A frame's payload as queued for sending.
pub(crate) enum Payload {
    Owned(Vec<u8>),
    /// Memory owned by the user thread, which stays inside `sync` (holding
    /// `&mut Bsp`) until the progress thread reports the frame written or
    /// dropped. This is how `hpput` sends a block without copying it.
    Borrowed {
        ptr: *const u8,
        len: usize,
    },
}

// SAFETY: `Borrowed` points into an area that the owning `Bsp` neither frees
// nor mutates until `borrowed_outstanding` returns to zero (see `Wire::wait_borrowed`).
unsafe impl Send for Payload {}

impl Payload {
    pub(crate) fn len(&self) -> usize {
        match self {
            Payload::Owned(v) => v.len(),
            Payload::Borrowed { len, .. } => *len,
        }
    }
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Owned(v) => v,
            // SAFETY: see the `Send` impl above.
            Payload::Borrowed { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

/// A frame waiting in a send queue: header, an optional small prefix (a record
/// header for a big block) and the body, written with one `writev`.
pub(crate) struct OutFrame {
    pub(crate) header: [u8; HEADER_LEN],
    pub(crate) prefix: Vec<u8>,
    pub(crate) body: Payload,
    /// Global enqueue order: the progress thread writes the lowest first, so
    /// the destination schedule chosen by `sync` is the order on the wire.
    pub(crate) seq: u64,
}

impl OutFrame {
    pub(crate) fn new(kind: Kind, step: u64, aux: u32, prefix: Vec<u8>, body: Payload) -> OutFrame {
        let len = (prefix.len() + body.len()) as u32;
        OutFrame { header: Header { kind, len, aux, step }.encode(), prefix, body, seq: 0 }
    }
    pub(crate) fn total_len(&self) -> usize {
        HEADER_LEN + self.prefix.len() + self.body.len()
    }
    pub(crate) fn is_borrowed(&self) -> bool {
        matches!(self.body, Payload::Borrowed { .. })
    }
}

/// A received frame.
#[derive(Debug)]
pub(crate) struct InFrame {
    pub(crate) header: Header,
    pub(crate) payload: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header { kind: Kind::Data, len: 77, aux: 3, step: 1 << 40 };
        assert_eq!(Header::decode(&h.encode(), 1000), Ok(h));
    }

    #[test]
    fn garbage_header_is_rejected() {
        let mut b = [0xffu8; HEADER_LEN];
        assert!(matches!(Header::decode(&b, 1000), Err(HeaderError::BadMagic(_))));
        b[0..4].copy_from_slice(&MAGIC);
        assert_eq!(Header::decode(&b, 1000), Err(HeaderError::BadKind(0xff)));
        b[4] = 2;
        assert!(matches!(Header::decode(&b, 1000), Err(HeaderError::TooLong { .. })));
    }
}
