//! Dense matrices for the jobs' checks: `.npy` files read and written
//! here, and the in-core LAPACK references (dpotrf, dgetrf) and residuals
//! the out-of-core results are compared with, computed independently of
//! the code under test.

use std::path::Path;

/// A dense column-major matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Mat {
    pub fn zeros(rows: usize, cols: usize) -> Mat {
        Mat { rows, cols, data: vec![0.0; rows * cols] }
    }
    pub fn get(&self, r: usize, c: usize) -> f64 {
        self.data[r + c * self.rows]
    }
    pub fn set(&mut self, r: usize, c: usize, v: f64) {
        self.data[r + c * self.rows] = v;
    }
    pub fn frob(&self) -> f64 {
        self.data.iter().map(|x| x * x).sum::<f64>().sqrt()
    }
    /// `‖self − other‖_F / ‖other‖_F`.
    pub fn rel_diff(&self, other: &Mat) -> f64 {
        assert_eq!((self.rows, self.cols), (other.rows, other.cols));
        let d: f64 = self.data.iter().zip(&other.data).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
        d / other.frob()
    }
}

/// Reads a 2-D `<f8` .npy file (either order), by hand.
pub fn read_npy(path: &Path) -> Mat {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}: not a .npy file", path.display());
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize, 12),
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).unwrap();
    assert!(header.contains("'descr': '<f8'"), "{header}");
    let fortran = header.contains("'fortran_order': True");
    let shape = header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).unwrap();
    let dims: Vec<usize> = shape.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    let (rows, cols) = (dims[0], dims[1]);
    let vals: Vec<f64> = bytes[start + hlen..].chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(vals.len(), rows * cols, "{}: data length", path.display());
    if fortran {
        return Mat { rows, cols, data: vals };
    }
    let mut m = Mat::zeros(rows, cols);
    for r in 0..rows {
        for c in 0..cols {
            m.set(r, c, vals[r * cols + c]);
        }
    }
    m
}

/// Reads a 1-D `<i8` .npy file (a permutation), by hand.
pub fn read_perm_npy(path: &Path) -> Vec<usize> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "{}: not a version-1 .npy file", path.display());
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<i8'"), "{header}");
    let len: usize = header.split("'shape': (").nth(1).and_then(|s| s.split(',').next()).unwrap().trim().parse().unwrap();
    let vals: Vec<usize> = bytes[10 + hlen..].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as usize).collect();
    assert_eq!(vals.len(), len);
    vals
}

/// Writes a Fortran-order `<f8` .npy file (version 1.0).
pub fn write_npy(path: &Path, m: &Mat) {
    let mut dict = format!("{{'descr': '<f8', 'fortran_order': True, 'shape': ({}, {}), }}", m.rows, m.cols);
    let total = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - total % 64) % 64));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    for x in &m.data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, out).unwrap();
}

/// Runs `f` (a LAPACK call) the way the slaves run theirs: OpenBLAS on
/// one thread, one call at a time in this process, on a thread with a
/// 64 MiB stack (`apps::kernels::on_lapack_stack`). The test threads called the threaded OpenBLAS 0.3.21 side
/// by side on 2 MiB stacks: twice in 14 runs of this file on 2026-11-25
/// the process died of a SIGSEGV in `libopenblasp` (`sub rsp, 0x840c0`
/// at the fault, a 540 KB frame), and with only the big stack one run in
/// eleven hung in the reference `dgetrf`. A dead test process left its
/// store nodes and slaves holding its output pipe, so the run looked hung
/// too (`support::dies_with_test` now ends them).
pub fn reference_lapack(f: impl FnOnce() + Send) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    static ONE_THREAD: std::sync::Once = std::sync::Once::new();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Under the lock: no other BLAS call is running.
    ONE_THREAD.call_once(|| apps::kernels::set_blas_threads(1));
    apps::kernels::on_lapack_stack(f);
}

/// In-core LAPACK dpotrf: the lower factor, upper triangle zero.
pub fn lapack_cholesky(a: &Mat) -> Mat {
    let n = a.rows;
    let mut l = a.clone();
    let mut info = 0;
    // SAFETY: n×n column-major with lda = n.
    reference_lapack(|| unsafe { lapack::dpotrf(b'L', n as i32, &mut l.data, n as i32, &mut info) });
    assert_eq!(info, 0, "LAPACK dpotrf of the input failed");
    for c in 1..n {
        for r in 0..c {
            l.set(r, c, 0.0);
        }
    }
    l
}

/// In-core LAPACK dgetrf: packed factors and the 0-based interchanges.
pub fn lapack_lu(a: &Mat) -> (Mat, Vec<u64>) {
    let n = a.rows;
    let mut lu = a.clone();
    let mut ipiv = vec![0i32; n];
    let mut info = 0;
    // SAFETY: n×n column-major with lda = n, ipiv of length n.
    reference_lapack(|| unsafe { lapack::dgetrf(n as i32, n as i32, &mut lu.data, n as i32, &mut ipiv, &mut info) });
    assert_eq!(info, 0, "LAPACK dgetrf of the input failed");
    (lu, ipiv.iter().map(|&p| (p - 1) as u64).collect())
}

/// `‖A − L·Lᵀ‖_F / ‖A‖_F`, summed here element by element.
pub fn cholesky_residual(a: &Mat, l: &Mat) -> f64 {
    let n = a.rows;
    let mut num = 0.0;
    for j in 0..n {
        for i in 0..n {
            let s: f64 = (0..=i.min(j)).map(|k| l.get(i, k) * l.get(j, k)).sum();
            num += (a.get(i, j) - s).powi(2);
        }
    }
    num.sqrt() / a.frob()
}

/// Row permutation of a sequence of interchanges: row `r` of `P·A` is row
/// `perm[r]` of A.
pub fn permutation(swaps: &[u64]) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..swaps.len()).collect();
    for (r, &g) in swaps.iter().enumerate() {
        perm.swap(r, g as usize);
    }
    perm
}

/// `‖P·A − L·U‖_F / ‖A‖_F` with L unit lower and U upper packed in `lu`.
pub fn lu_residual(a: &Mat, lu: &Mat, perm: &[usize]) -> f64 {
    let n = a.rows;
    assert_eq!(perm.len(), n);
    let mut num = 0.0;
    for c in 0..n {
        for (r, &pr) in perm.iter().enumerate() {
            let mut s = 0.0;
            for k in 0..=r.min(c) {
                let l = if k == r { 1.0 } else { lu.get(r, k) };
                s += l * lu.get(k, c);
            }
            num += (a.get(pr, c) - s).powi(2);
        }
    }
    num.sqrt() / a.frob()
}

pub fn upper_is_zero(l: &Mat) -> bool {
    (1..l.cols).all(|c| (0..c.min(l.rows)).all(|r| l.get(r, c).to_bits() == 0))
}
