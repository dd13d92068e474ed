//! Applications of the bag of tasks: task decompositions, BLAS/LAPACK block
//! kernels, matrix generation and result checks.
//!
//! Architecture invariant: this crate knows nothing of gRPC, RocksDB or
//! tokio. A slave runs tasks against the [`ctx::TaskCtx`] trait, which it
//! implements over the store; [`mem`] implements it in memory for tests.
//!
//! Map:
//! - [`block`]: ids, matrix shapes, the column-major [`block::Block`] and its byte payload;
//! - [`ctx`]: the [`ctx::TaskCtx`] seam and [`ctx::CtxError`];
//! - [`job`]: [`job::JobSpec`], [`job::output_shapes`], [`job::plan`], [`job::run_task`],
//!   [`job::TaskError`] with [`job::TaskError::class`], [`job::flops`];
//! - [`matmul`], [`cholesky`], [`lu`], [`raytrace`]: one module per application
//!   (task descriptors, planning, the task body);
//! - [`kernels`]: dgemm, dsyrk, dtrsm, dpotrf, dgetrf and an LU without pivoting;
//! - [`generate`]: deterministic block-by-block matrix generation;
//! - [`verify`]: checks read block by block through [`verify::BlockSource`];
//! - [`mem`]: in-memory store, context and executors ([`mem::run_plan`],
//!   [`mem::run_plan_chaos`]) counting block reads and writes per task.
//!
//! Invariants: every task is a pure function of the committed blocks it
//! reads, so a task aborted and redone anywhere writes the same bits; tasks
//! never hold more than a few blocks (except the LU partial pivoting panel,
//! swap and update tasks, which hold a block column; tournament pivoting's
//! hold at most four blocks); bad input gives a typed error, never a
//! panic or a BLAS call on mismatched shapes.
//!
//! ```
//! use apps::block::MatrixMeta;
//! use apps::generate::MatrixKind;
//! use apps::job::{plan, JobSpec};
//! use apps::mem::{run_plan, MemStore};
//! use apps::verify::matmul_vs_dgemm;
//!
//! let a = MatrixMeta::new("A", 70, 50, 32);
//! let b = MatrixMeta::new("B", 50, 40, 32);
//! let c = MatrixMeta::new("C", 70, 40, 32);
//! let mut store = MemStore::new();
//! store.generate(&a, MatrixKind::Random, 1);
//! store.generate(&b, MatrixKind::Random, 2);
//! let spec = JobSpec::Matmul { job: uuid::Uuid::new_v4(), a: a.clone(), b: b.clone(), c: c.clone() };
//! let plan = plan(&spec).unwrap();
//! run_plan(&mut store, &spec, &plan).unwrap();
//! assert!(matmul_vs_dgemm(&mut store, &a, &b, &c).unwrap().passed());
//! ```

// Links system OpenBLAS (BLAS + LAPACK) into every binary that uses apps.
extern crate blas_src;

pub mod block;
pub mod cholesky;
pub mod ctx;
pub mod generate;
pub mod job;
pub mod kernels;
pub mod lu;
pub mod matmul;
pub mod mem;
pub mod raytrace;
pub mod verify;

#[cfg(test)]
mod chaos_tests;
