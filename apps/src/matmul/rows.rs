//! The two-level bag for the multiply (`003…` §2.4.7): one element per
//! block row of C. A slave holds a row's element in an outer action while
//! it runs the row's tasks, each `C(i, j)` in a top-level action of its
//! own (committed as it ends, so a crash loses one task, not the row);
//! the element leaves the bag when the row is done. The slave reads the
//! row of A once and keeps it in its block cache for the whole row, the
//! source's block-row caching at the slave (Table 3.3, organisation 6).
//! An element back in the bag after a crash is redone from its first task
//! not yet committed: each inner task's done record says it is.

use serde::{Deserialize, Serialize};

use super::MatmulTask;
use crate::block::MatrixMeta;
use crate::job::{self, Plan, PlanError, PlannedBag};

/// Element of the two-level bag: every block of C's row `row`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatmulRowTask {
    pub row: u32,
}

pub(crate) fn plan(job: uuid::Uuid, a: &MatrixMeta, b: &MatrixMeta, c: &MatrixMeta) -> Result<Plan, PlanError> {
    super::check(a, b, c)?;
    let tasks = (0..c.block_rows()).map(|row| job::encode_task(&MatmulRowTask { row })).collect();
    Ok(Plan { bags: vec![PlannedBag { name: job::bag_name(job, "matmul-rows"), tasks, inputs: Vec::new() }], initial_small: vec![] })
}

/// A row element's tasks, each with its number among the job's tasks
/// (`i·q + j`, what its done record is keyed by); `None` for a payload
/// that is not a row's.
pub(crate) fn inner_tasks(c: &MatrixMeta, payload: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    let MatmulRowTask { row } = serde_json::from_slice(payload).ok()?;
    let q = c.block_cols();
    Some((0..q).map(|j| (u64::from(row) * u64::from(q) + u64::from(j), job::encode_task(&MatmulTask { i: row, j }))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MatrixId;

    fn meta(name: &str, n: u64, b: u32) -> MatrixMeta {
        MatrixMeta { id: MatrixId(uuid::Uuid::new_v4()), name: name.into(), n_rows: n, n_cols: n, block: b }
    }

    #[test]
    fn rows_cover_every_block_of_c_once_under_distinct_numbers() {
        let (a, b, c) = (meta("A", 300, 64), meta("B", 300, 64), meta("C", 300, 64));
        let plan = plan(uuid::Uuid::nil(), &a, &b, &c).unwrap();
        assert_eq!(plan.bags[0].tasks.len(), 5);
        let mut seen = std::collections::BTreeMap::new();
        for row in &plan.bags[0].tasks {
            for (number, payload) in inner_tasks(&c, row).unwrap() {
                let t: MatmulTask = serde_json::from_slice(&payload).unwrap();
                assert!(seen.insert(number, (t.i, t.j)).is_none(), "task number {number} twice");
            }
        }
        let expected: Vec<(u32, u32)> = (0..5).flat_map(|i| (0..5).map(move |j| (i, j))).collect();
        assert_eq!(seen.into_values().collect::<Vec<_>>(), expected);
        assert_eq!(inner_tasks(&c, &job::encode_task(&MatmulTask { i: 0, j: 1 })), None, "a plain task is no row");
    }
}
