//! The CLI's closed sets of values as clap `ValueEnum`s, so that `--help`
//! and a bad value's error list the possible values, each with what it
//! means. `apps` knows nothing of clap: each maps to its `apps` type.

use apps::generate::MatrixKind;
use apps::job::{CholeskyVariant, LuSchedule, PivotRule};

/// `master submit cholesky --variant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Variant {
    /// One bag that starts with the ready tasks; each commit enqueues the
    /// tasks whose last input it wrote (no barriers).
    Dag,
    /// One bag in column order; tasks wait on per-block ready flags.
    SingleBag,
    /// 2p−1 bags: each block column's diagonal factor, then its solves.
    #[value(name = "multi-step-1")]
    MultiStep1,
    /// p bags: the next column's diagonal factor merged into this column's
    /// bag.
    #[value(name = "multi-step-2")]
    MultiStep2,
}

impl From<Variant> for CholeskyVariant {
    fn from(v: Variant) -> CholeskyVariant {
        match v {
            Variant::Dag => CholeskyVariant::Dag,
            Variant::SingleBag => CholeskyVariant::SingleBag,
            Variant::MultiStep1 => CholeskyVariant::MultiStep1,
            Variant::MultiStep2 => CholeskyVariant::MultiStep2,
        }
    }
}

/// `master submit lu --schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Schedule {
    /// One bag; each commit enqueues the tasks whose last input it wrote,
    /// so no slave waits at a barrier (the faster one).
    Dag,
    /// A bag per block column and step (multiply, factor, solve; with
    /// --pivot: multiply, panel, swap, solve), with a barrier after each.
    Bags,
}

impl From<Schedule> for LuSchedule {
    fn from(s: Schedule) -> LuSchedule {
        match s {
            Schedule::Dag => LuSchedule::Dag,
            Schedule::Bags => LuSchedule::Bags,
        }
    }
}

/// `master submit lu --pivot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Pivot {
    /// LAPACK's partial pivoting, its exact pivots: a panel task holds the
    /// whole block column, so a slave's memory grows with n.
    Partial,
    /// Tournament pivoting (CALU): every task holds at most four blocks,
    /// whatever n; the pivots differ from LAPACK's, the growth factor
    /// stays close; its tree costs extra flops (dag schedule only).
    Tournament,
}

impl From<Pivot> for PivotRule {
    fn from(p: Pivot) -> PivotRule {
        match p {
            Pivot::Partial => PivotRule::Partial,
            Pivot::Tournament => PivotRule::Tournament,
        }
    }
}

/// `master matrix create --kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// Entries uniform in [-1, 1).
    Random,
    /// Symmetric positive definite (for Cholesky): symmetric random
    /// entries plus n on the diagonal. Square only.
    Spd,
    /// Random entries plus n on the diagonal: LU without pivoting is stable.
    DiagDominant,
}

impl From<Kind> for MatrixKind {
    fn from(k: Kind) -> MatrixKind {
        match k {
            Kind::Random => MatrixKind::Random,
            Kind::Spd => MatrixKind::Spd,
            Kind::DiagDominant => MatrixKind::DiagDominant,
        }
    }
}
