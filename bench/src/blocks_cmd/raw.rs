//! The raw side: the same bytes written to and read from a plain file on
//! the same filesystem, the baseline every store figure is a ratio to.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Written;

/// Writes blocks one after another from the file's start, `fdatasync`
/// after each: appended to the file truncated at open (new blocks) or over
/// its old bytes in place (overwrites). With a record file, also appends
/// 64 bytes to it and `fdatasync`s it, per block.
pub(super) struct Writer {
    file: File,
    record: Option<File>,
}

impl Writer {
    pub(super) fn open(path: &Path, written: Written, record: Option<&Path>) -> anyhow::Result<Writer> {
        let file = OpenOptions::new().create(true).write(true).truncate(matches!(written, Written::New)).open(path)?;
        file.sync_all()?;
        let record = match record {
            Some(r) => Some(OpenOptions::new().create(true).append(true).open(r)?),
            None => None,
        };
        Ok(Writer { file, record })
    }

    /// Writes the next `n` blocks; returns the time.
    pub(super) fn write(&mut self, block: &[f64], n: usize) -> anyhow::Result<Duration> {
        let bytes: &[u8] = bytemuck::cast_slice(block);
        let mut t = Duration::ZERO;
        for _ in 0..n {
            let t0 = Instant::now();
            self.file.write_all(bytes)?;
            self.file.sync_data()?;
            if let Some(log) = &mut self.record {
                log.write_all(&[0x5a; 64])?;
                log.sync_data()?;
            }
            t += t0.elapsed();
        }
        Ok(t)
    }
}

/// Reads blocks `blocks` of side b back, each into a fresh `Vec<f64>`;
/// returns the time.
pub(super) fn read(path: &Path, b: usize, blocks: std::ops::Range<usize>) -> anyhow::Result<Duration> {
    let f = File::open(path)?;
    let len = b * b * 8;
    let mut sum = 0.0;
    let t0 = Instant::now();
    for j in blocks {
        let mut v = vec![0f64; b * b];
        f.read_exact_at(bytemuck::cast_slice_mut(&mut v), (j * len) as u64)?;
        sum += v[v.len() / 2];
    }
    let t = t0.elapsed();
    std::hint::black_box(sum);
    Ok(t)
}
