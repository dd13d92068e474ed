//! Block kernels over system OpenBLAS / LAPACK.
//!
//! All blocks are column-major with leading dimension `rows`. Callers check
//! shapes before calling (blocks come from the store and are validated on
//! read against their matrix).
//!
//! # Panics
//! Every kernel asserts that its operands' shapes agree: a mismatch is a
//! bug in the caller, and the assert keeps BLAS from reading out of bounds.

use crate::block::Block;
use cblas_sys::{
    cblas_dgemm, cblas_dsyrk, cblas_dtrsm, CblasColMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, CblasRight, CblasTrans,
    CblasUnit, CblasUpper, CBLAS_TRANSPOSE,
};

extern "C" {
    // OpenBLAS's own entry points (not in cblas-sys).
    fn openblas_set_num_threads(n: std::os::raw::c_int);
    fn openblas_get_corename() -> *const std::os::raw::c_char;
}

/// The kernel set OpenBLAS chose when it was loaded ("Haswell", "SkylakeX", …).
pub fn blas_corename() -> String {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(openblas_get_corename()) }.to_string_lossy().into_owned()
}

/// Makes sure OpenBLAS runs the kernels this CPU can run. Call it first
/// thing in `main`.
///
/// A `DYNAMIC_ARCH` OpenBLAS picks its kernels from the CPU model when the
/// library loads. A model newer than the library (Debian 12's 0.3.21 on a
/// family 6 model 207 Xeon, say) gets the generic "Prescott" kernels: dgemm
/// at 8 instead of 48 GFLOP/s per core on the reference machine. When that
/// happened and the CPU has AVX-512 (or AVX2), this re-executes the program
/// with `OPENBLAS_CORETYPE` naming the matching kernels (the variable is
/// only read at load time), and child processes inherit it. It does
/// nothing when the variable is already set, so a user can always choose.
pub fn use_fast_blas_kernels() {
    if std::env::var_os("OPENBLAS_CORETYPE").is_some() {
        return;
    }
    let core = blas_corename();
    if !matches!(core.as_str(), "Prescott" | "Core2" | "Nehalem" | "Katmai" | "Northwood" | "Banias") {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::os::unix::process::CommandExt;
        let better = if std::arch::is_x86_feature_detected!("avx512f") {
            "SkylakeX"
        } else if std::arch::is_x86_feature_detected!("avx2") {
            "Haswell"
        } else {
            return;
        };
        let Ok(exe) = std::env::current_exe() else { return };
        let e = std::process::Command::new(exe).args(std::env::args_os().skip(1)).env("OPENBLAS_CORETYPE", better).exec();
        // Only returns on failure: run on, slowly, and say why.
        eprintln!("warning: OpenBLAS uses its slow generic {core} kernels and re-running with OPENBLAS_CORETYPE={better} failed: {e}");
    }
}

/// Sets the number of threads OpenBLAS uses for the calls that follow.
///
/// OpenBLAS reads `OPENBLAS_NUM_THREADS` once, when the library is loaded,
/// before `main` runs: setting the variable from inside the program has no
/// effect. A slave calls this with 1 (one slave per core); an in-core
/// reference measurement with the number of cores.
pub fn set_blas_threads(n: usize) {
    let n = n.clamp(1, i32::MAX as usize) as std::os::raw::c_int;
    // SAFETY: a plain setter of OpenBLAS's global thread count; it takes
    // no pointers and may be called at any time outside a BLAS call.
    unsafe { openblas_set_num_threads(n) }
}

fn tr(t: bool) -> CBLAS_TRANSPOSE {
    if t {
        CblasTrans
    } else {
        CblasNoTrans
    }
}

// Blocks have pub fields: a data length that disagrees with the shape
// would let BLAS run off the end of the buffer.
thread_local! {
    /// Time this thread spent in the kernels since [`take_kernel_time`].
    static KERNEL_TIME: std::cell::Cell<std::time::Duration> = const { std::cell::Cell::new(std::time::Duration::ZERO) };
}

/// Time the calling thread spent in the kernels of this module since the
/// last call, and starts counting again from zero: a slave logs it per
/// task, so a timeline can tell BLAS/LAPACK from everything else a task's
/// thread does (the model predicts kernel times from `bench params`'s
/// sweep; the rest it must account for apart).
pub fn take_kernel_time() -> std::time::Duration {
    KERNEL_TIME.with(|t| t.replace(std::time::Duration::ZERO))
}

/// Runs a kernel and adds its time to the thread's [`take_kernel_time`].
/// (A clock read is tens of nanoseconds; the smallest kernel a job runs,
/// b = 64, takes tens of microseconds.)
fn timed<R>(kernel: impl FnOnce() -> R) -> R {
    let started = std::time::Instant::now();
    let r = kernel();
    KERNEL_TIME.with(|t| t.set(t.get() + started.elapsed()));
    r
}

fn whole(bs: &[&Block]) {
    for b in bs {
        assert_eq!(b.data.len(), b.rows * b.cols, "block data does not match its shape");
    }
}

fn ld(rows: usize) -> i32 {
    // LAPACK wants lda >= 1 even for empty matrices.
    rows.max(1) as i32
}

/// `C := alpha · op(A) · op(B) + beta · C` (dgemm).
pub fn gemm(alpha: f64, a: &Block, ta: bool, b: &Block, tb: bool, beta: f64, c: &mut Block) {
    let (m, k) = if ta { (a.cols, a.rows) } else { (a.rows, a.cols) };
    let (kb, n) = if tb { (b.cols, b.rows) } else { (b.rows, b.cols) };
    assert_eq!(k, kb);
    assert_eq!((c.rows, c.cols), (m, n));
    whole(&[a, b, c]);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: shapes match (asserted above) and the
    // slices hold rows*cols elements with leading dimension rows.
    timed(|| unsafe {
        cblas_dgemm(
            CblasColMajor,
            tr(ta),
            tr(tb),
            m as i32,
            n as i32,
            k as i32,
            alpha,
            a.data.as_ptr(),
            ld(a.rows),
            b.data.as_ptr(),
            ld(b.rows),
            beta,
            c.data.as_mut_ptr(),
            ld(c.rows),
        )
    })
}

/// Lower triangle of `C := alpha · A·Aᵀ + beta · C` (dsyrk); the strict upper
/// triangle of `C` is left untouched.
pub fn syrk_lower(alpha: f64, a: &Block, beta: f64, c: &mut Block) {
    assert_eq!((c.rows, c.cols), (a.rows, a.rows));
    whole(&[a, c]);
    if c.rows == 0 {
        return;
    }
    // SAFETY: as in gemm.
    timed(|| unsafe {
        cblas_dsyrk(
            CblasColMajor,
            CblasLower,
            CblasNoTrans,
            a.rows as i32,
            a.cols as i32,
            alpha,
            a.data.as_ptr(),
            ld(a.rows),
            beta,
            c.data.as_mut_ptr(),
            ld(c.rows),
        )
    })
}

/// In-place Cholesky `A = L·Lᵀ` of the lower triangle (dpotrf); the strict
/// upper triangle is set to zero so the block is exactly `L`.
/// `Err(k)` (1-based, LAPACK's `info`) when the leading minor of order `k` is
/// not positive definite.
pub fn potrf_lower(a: &mut Block) -> Result<(), usize> {
    assert_eq!(a.rows, a.cols);
    whole(&[a]);
    let n = a.rows;
    let mut info = 0;
    if n > 0 {
        // SAFETY: square block with lda = n.
        timed(|| unsafe { lapack::dpotrf(b'L', n as i32, &mut a.data, ld(n), &mut info) });
    }
    if info != 0 {
        return Err(info.unsigned_abs() as usize);
    }
    zero_strict_upper(a);
    Ok(())
}

/// Sets the strict upper triangle to zero.
pub fn zero_strict_upper(a: &mut Block) {
    for c in 1..a.cols {
        for r in 0..c.min(a.rows) {
            a.set(r, c, 0.0);
        }
    }
}

/// `B := B · L⁻ᵀ` with `L` lower triangular, non-unit (the Cholesky solve).
pub fn trsm_right_lower_trans(l: &Block, b: &mut Block) {
    trsm(false, false, true, false, l, b)
}

/// `B := L⁻¹ · B` with `L` unit lower triangular (the strict lower part of a
/// packed LU block is read; its diagonal and upper part are ignored).
pub fn trsm_left_lower_unit(l: &Block, b: &mut Block) {
    trsm(true, false, false, true, l, b)
}

/// `B := B · U⁻¹` with `U` upper triangular, non-unit (the upper part of a
/// packed LU block).
pub fn trsm_right_upper(u: &Block, b: &mut Block) {
    trsm(false, true, false, false, u, b)
}

fn trsm(left: bool, upper: bool, trans: bool, unit: bool, t: &Block, b: &mut Block) {
    assert_eq!(t.rows, t.cols);
    assert_eq!(if left { b.rows } else { b.cols }, t.rows);
    whole(&[t, b]);
    if b.rows == 0 || b.cols == 0 {
        return;
    }
    // SAFETY: shapes as asserted.
    timed(|| unsafe {
        cblas_dtrsm(
            CblasColMajor,
            if left { CblasLeft } else { CblasRight },
            if upper { CblasUpper } else { CblasLower },
            tr(trans),
            if unit { CblasUnit } else { CblasNonUnit },
            b.rows as i32,
            b.cols as i32,
            1.0,
            t.data.as_ptr(),
            ld(t.rows),
            b.data.as_mut_ptr(),
            ld(b.rows),
        )
    })
}

/// In-place LU without pivoting, packed as LAPACK does (unit lower `L` below
/// the diagonal, `U` on and above). Recursive, so the bulk of the work is
/// dtrsm + dgemm at BLAS-3 speed. `Err(k)` (0-based) when pivot `k` is zero
/// or not finite.
pub fn lu_nopiv(a: &mut Block) -> Result<(), usize> {
    assert_eq!(a.rows, a.cols);
    whole(&[a]);
    let n = a.rows;
    timed(|| lu_nopiv_rec(&mut a.data, n, 0, n))
}

// Factors the square sub-matrix at (off, off) of size m inside an n×n column-major array.
fn lu_nopiv_rec(a: &mut [f64], n: usize, off: usize, m: usize) -> Result<(), usize> {
    if m <= 32 {
        for k in 0..m {
            let g = off + k;
            let piv = a[g + g * n];
            if piv == 0.0 || !piv.is_finite() {
                return Err(g);
            }
            for r in g + 1..off + m {
                a[r + g * n] /= piv;
            }
            for c in g + 1..off + m {
                let u = a[g + c * n];
                if u != 0.0 {
                    for r in g + 1..off + m {
                        a[r + c * n] -= a[r + g * n] * u;
                    }
                }
            }
        }
        return Ok(());
    }
    let m1 = m / 2;
    let m2 = m - m1;
    let (o1, o2) = (off, off + m1);
    lu_nopiv_rec(a, n, o1, m1)?;
    let lda = n as i32;
    // SAFETY: all sub-matrices lie inside the n×n array; pointers are offsets
    // into one allocation and BLAS reads the triangular factor while writing
    // a disjoint panel.
    unsafe {
        let p = a.as_mut_ptr();
        let a11 = p.add(o1 + o1 * n);
        let a12 = p.add(o1 + o2 * n);
        let a21 = p.add(o2 + o1 * n);
        let a22 = p.add(o2 + o2 * n);
        // A12 := L11⁻¹ A12
        cblas_dtrsm(CblasColMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, m1 as i32, m2 as i32, 1.0, a11, lda, a12, lda);
        // A21 := A21 U11⁻¹
        cblas_dtrsm(CblasColMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, m2 as i32, m1 as i32, 1.0, a11, lda, a21, lda);
        // A22 -= A21 A12
        cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m2 as i32, m2 as i32, m1 as i32, -1.0, a21, lda, a12, lda, 1.0, a22, lda);
    }
    lu_nopiv_rec(a, n, o2, m2)
}

/// Stack of the threads [`on_lapack_stack`] runs LAPACK on.
const LAPACK_STACK_BYTES: usize = 64 << 20;

/// Runs `f` (a LAPACK call) on a thread of its own with a 64 MiB stack and
/// returns what it returns. OpenBLAS 0.3.21's threaded dgetrf keeps large
/// buffers on the stack (a 540 KB frame): on an AMD EPYC (detected as
/// Cooperlake) it overflowed the 2 MiB of a Rust test or tokio blocking
/// thread and crashed with SIGSEGV. The spawn costs microseconds against a
/// panel factorisation.
pub fn on_lapack_stack<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("lapack".into())
            .stack_size(LAPACK_STACK_BYTES)
            .spawn_scoped(s, f)
            .expect("spawning a LAPACK thread")
            .join()
            .expect("LAPACK thread panicked")
    })
}

/// In-place LU with partial pivoting of a tall `m × n` panel (dgetrf).
/// Returns LAPACK's `ipiv` made 0-based (row `r` was interchanged with row
/// `ipiv[r]`, in order) and `Err(k)` (0-based column) when `U(k,k)` is exactly
/// zero; the factorisation is still completed, as LAPACK does.
pub fn getrf(a: &mut Block) -> (Vec<usize>, Result<(), usize>) {
    whole(&[a]);
    let k = a.rows.min(a.cols);
    let mut ipiv = vec![0i32; k.max(1)];
    let mut info = 0;
    if k > 0 {
        let (rows, cols) = (a.rows as i32, a.cols as i32);
        let (data, piv) = (&mut a.data, &mut ipiv);
        // SAFETY: lda = rows; ipiv has min(m,n) entries.
        timed(|| on_lapack_stack(|| unsafe { lapack::dgetrf(rows, cols, data, ld(rows as usize), piv, &mut info) }));
    }
    let piv = ipiv[..k].iter().map(|&p| (p - 1).max(0) as usize).collect();
    let res = if info > 0 { Err(info as usize - 1) } else { Ok(()) };
    (piv, res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_block(rows: usize, cols: usize, seed: u64) -> Block {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let data = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect();
        Block { rows, cols, data }
    }

    fn naive_mul(a: &Block, b: &Block) -> Block {
        let mut c = Block::zeros(a.rows, b.cols);
        for j in 0..b.cols {
            for k in 0..a.cols {
                for i in 0..a.rows {
                    c.data[i + j * a.rows] += a.get(i, k) * b.get(k, j);
                }
            }
        }
        c
    }

    /// The kernel clock counts a kernel's time on the calling thread and
    /// starts again from zero when read.
    #[test]
    fn kernel_time_counts_kernels_on_this_thread() {
        let _ = take_kernel_time();
        let (a, b) = (rand_block(200, 200, 1), rand_block(200, 200, 2));
        let mut c = Block::zeros(200, 200);
        let started = std::time::Instant::now();
        gemm(1.0, &a, false, &b, false, 0.0, &mut c);
        let wall = started.elapsed();
        let counted = take_kernel_time();
        assert!(counted > std::time::Duration::ZERO && counted <= wall, "{counted:?} of {wall:?}");
        assert_eq!(take_kernel_time(), std::time::Duration::ZERO);
        std::thread::spawn(move || gemm(1.0, &a, false, &b, false, 0.0, &mut c)).join().unwrap();
        assert_eq!(take_kernel_time(), std::time::Duration::ZERO, "another thread's kernels are its own");
    }

    #[test]
    fn gemm_matches_naive() {
        let a = rand_block(7, 5, 1);
        let b = rand_block(5, 3, 2);
        let mut c = Block::zeros(7, 3);
        gemm(1.0, &a, false, &b, false, 0.0, &mut c);
        let r = naive_mul(&a, &b);
        for (x, y) in c.data.iter().zip(&r.data) {
            assert!((x - y).abs() < 1e-14);
        }
    }

    #[test]
    fn lu_nopiv_reconstructs() {
        for n in [1usize, 5, 33, 70, 100] {
            let mut a = rand_block(n, n, n as u64);
            for i in 0..n {
                a.data[i + i * n] += n as f64;
            }
            let orig = a.clone();
            lu_nopiv(&mut a).unwrap();
            let mut l = a.clone();
            let mut u = a.clone();
            for c in 0..n {
                for r in 0..n {
                    if r < c {
                        l.set(r, c, 0.0);
                    } else if r == c {
                        l.set(r, c, 1.0);
                    } else {
                        u.set(r, c, 0.0);
                    }
                }
            }
            let p = naive_mul(&l, &u);
            let err: f64 = p.data.iter().zip(&orig.data).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
            assert!(err / orig.sum_sq().sqrt() < 1e-14 * n as f64, "n={n} err={err}");
        }
    }

    #[test]
    fn lu_nopiv_zero_pivot() {
        let mut a = Block { rows: 2, cols: 2, data: vec![0.0, 1.0, 1.0, 0.0] };
        assert_eq!(lu_nopiv(&mut a), Err(0));
    }

    #[test]
    fn potrf_rejects_indefinite() {
        let mut a = Block { rows: 2, cols: 2, data: vec![1.0, 2.0, 2.0, 1.0] };
        assert_eq!(potrf_lower(&mut a), Err(2));
    }
}
