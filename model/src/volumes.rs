//! Data volumes: tasks, block reads and writes, bytes.

use serde::Serialize;

/// How much a run reads and writes at the store (thesis Tables 4.2, 4.3, 4.6:
/// "input", "get", "put").
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Volumes {
    /// Number of tasks.
    pub n_tasks: u64,
    /// Bytes of the input objects.
    pub input_bytes: f64,
    /// Block reads by slaves (all levels).
    pub n_gets: u64,
    /// Bytes read by slaves ("get").
    pub get_bytes: f64,
    /// Block writes by slaves.
    pub n_puts: u64,
    /// Bytes written by slaves ("put").
    pub put_bytes: f64,
}

/// Widths of the `p = ⌈n/b⌉` block rows: `b` except a narrower last one.
pub fn block_widths(n: u64, b: u64) -> Vec<f64> {
    let p = n.div_ceil(b);
    (0..p).map(|i| (n - i * b).min(b) as f64).collect()
}
