//! The `.npy` header (format 1.0–3.0) for f64 matrices, read and written by
//! hand so import and export can stream block by block with positioned
//! I/O: the crates we know of read or write whole arrays.

use std::fs::File;
use std::io::{Read, Write};

#[derive(Debug, thiserror::Error)]
pub(crate) enum NpyError {
    #[error("not a .npy file (bad magic)")]
    Magic,
    #[error("unsupported .npy header: {0}")]
    Header(String),
    #[error("the file holds {got} bytes of data, a {rows}x{cols} f64 matrix needs {need}")]
    Size { rows: u64, cols: u64, need: u64, got: u64 },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Where the f64 data of a 2-D array starts and how it is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NpyLayout {
    pub(crate) rows: u64,
    pub(crate) cols: u64,
    pub(crate) fortran: bool,
    pub(crate) data_offset: u64,
}

impl NpyLayout {
    /// Byte offset of element (r, c).
    pub(crate) fn offset(&self, r: u64, c: u64) -> u64 {
        let idx = if self.fortran { c * self.rows + r } else { r * self.cols + c };
        self.data_offset + idx * 8
    }
}

pub(crate) fn read_header(f: &mut File) -> Result<NpyLayout, NpyError> {
    let mut magic = [0u8; 8];
    f.read_exact(&mut magic).map_err(|_| NpyError::Magic)?;
    if &magic[..6] != b"\x93NUMPY" {
        return Err(NpyError::Magic);
    }
    let (len, prefix) = match magic[6] {
        1 => {
            let mut l = [0u8; 2];
            f.read_exact(&mut l)?;
            (u16::from_le_bytes(l) as usize, 10)
        }
        2 | 3 => {
            let mut l = [0u8; 4];
            f.read_exact(&mut l)?;
            (u32::from_le_bytes(l) as usize, 12)
        }
        v => return Err(NpyError::Header(format!("version {v}"))),
    };
    if len > 1 << 20 {
        return Err(NpyError::Header(format!("header of {len} bytes")));
    }
    let mut h = vec![0u8; len];
    f.read_exact(&mut h)?;
    let h = String::from_utf8(h).map_err(|_| NpyError::Header("not text".into()))?;
    let field = |name: &str| -> Option<String> {
        let at = h.find(&format!("'{name}'"))? + name.len() + 2;
        let rest = h[at..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest.to_owned())
    };
    let descr = field("descr").ok_or_else(|| NpyError::Header(h.clone()))?;
    if !(descr.starts_with("'<f8'") || descr.starts_with("'float64'")) {
        return Err(NpyError::Header(format!("dtype {} (need little-endian float64, '<f8')", descr.split(',').next().unwrap_or(""))));
    }
    let fortran = field("fortran_order").ok_or_else(|| NpyError::Header(h.clone()))?.starts_with("True");
    let shape = field("shape").ok_or_else(|| NpyError::Header(h.clone()))?;
    let inner = shape.strip_prefix('(').and_then(|s| s.split(')').next()).ok_or_else(|| NpyError::Header(shape.clone()))?;
    let dims: Vec<u64> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse())
        .collect::<Result<_, _>>()
        .map_err(|_| NpyError::Header(format!("shape ({inner})")))?;
    let [rows, cols] = dims[..] else { return Err(NpyError::Header(format!("shape ({inner}) is not 2-D"))) };
    let data_offset = (prefix + len) as u64;
    // A shape whose bytes overflow 64 bits (fuzzing found the overflow:
    // a panic in a debug build, a wrapped size in a release build).
    let need =
        rows.checked_mul(cols).and_then(|n| n.checked_mul(8)).ok_or_else(|| NpyError::Header(format!("shape ({inner}) is too large")))?;
    let got = f.metadata()?.len().saturating_sub(data_offset);
    if got != need {
        return Err(NpyError::Size { rows, cols, need, got });
    }
    Ok(NpyLayout { rows, cols, fortran, data_offset })
}

/// Writes a version-1.0 header for a Fortran-order (column-major, like our
/// blocks) f64 matrix; returns the layout of the data that follows.
pub(crate) fn write_header(f: &mut File, rows: u64, cols: u64) -> Result<NpyLayout, NpyError> {
    let mut dict = format!("{{'descr': '<f8', 'fortran_order': True, 'shape': ({rows}, {cols}), }}");
    let total = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - total % 64) % 64));
    dict.push('\n');
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(dict.len() as u16).to_le_bytes())?;
    f.write_all(dict.as_bytes())?;
    Ok(NpyLayout { rows, cols, fortran: true, data_offset: (10 + dict.len()) as u64 })
}

/// Appends a version-1.0 header for a 1-D little-endian int64 array of
/// length `len` (a permutation).
pub(crate) fn write_i64_vector_header(out: &mut Vec<u8>, len: u64) {
    let mut dict = format!("{{'descr': '<i8', 'fortran_order': False, 'shape': ({len},), }}");
    let total = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - total % 64) % 64));
    dict.push('\n');
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fuzzing regression (`fuzz/corpus/npy/huge-shape`): a shape whose
    /// bytes overflow 64 bits is refused as a bad header, not a panic.
    #[test]
    fn a_shape_whose_size_overflows_is_refused() {
        let mut f = tempfile::tempfile().unwrap();
        let dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n";
        f.write_all(b"\x93NUMPY\x01\x00").unwrap();
        f.write_all(&(dict.len() as u16).to_le_bytes()).unwrap();
        f.write_all(dict.as_bytes()).unwrap();
        use std::io::Seek;
        f.rewind().unwrap();
        let e = read_header(&mut f).unwrap_err();
        assert!(matches!(&e, NpyError::Header(h) if h.contains("too large")), "{e}");
    }

    #[test]
    fn a_written_header_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.npy");
        let mut f = File::create(&path).unwrap();
        let l = write_header(&mut f, 3, 5).unwrap();
        assert_eq!(l.data_offset % 64, 0);
        f.write_all(&[0u8; 3 * 5 * 8]).unwrap();
        drop(f);
        assert_eq!(read_header(&mut File::open(&path).unwrap()).unwrap(), l);
    }

    #[test]
    fn truncated_or_foreign_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.npy");
        let mut f = File::create(&path).unwrap();
        write_header(&mut f, 3, 5).unwrap();
        f.write_all(&[0u8; 10]).unwrap();
        drop(f);
        assert!(matches!(read_header(&mut File::open(&path).unwrap()), Err(NpyError::Size { .. })));
        std::fs::write(&path, b"garbage garbage garbage").unwrap();
        assert!(matches!(read_header(&mut File::open(&path).unwrap()), Err(NpyError::Magic)));
    }
}

/// The fuzz target's body (`fuzz/targets/npy.rs`), for the corpus replay.
#[cfg(test)]
#[path = "../../fuzz/targets/npy.rs"]
mod fuzz_target;

/// The `.npy` fuzz corpus (`fuzz/corpus/npy/`) replayed through the fuzz
/// target's body in the ordinary suite.
#[cfg(test)]
mod fuzz_replay {
    #[test]
    fn the_npy_corpus_replays_without_a_finding() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/npy");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            eprintln!("{}", path.display());
            super::fuzz_target::run(&std::fs::read(&path).unwrap());
            n += 1;
        }
        assert!(n > 0, "{}: an empty corpus", dir.display());
    }
}
