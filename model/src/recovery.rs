//! Cost of a slave failure (thesis §3.6, §5.4).

use serde::Serialize;

/// Expected lost work when one slave fails.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// "Average recovery": half a task, `T₁/(2N)` (§3.6; Tables 4.2, 4.3,
    /// 4.6). With §5.5.2's slave overlap a slave holds two tasks, so half of
    /// two (not with a prefetch inside the task, which holds one). Plus
    /// [`Recovery::restart`], and with write-behind the previous task's
    /// ending ([`Held::ending_behind`]).
    pub average: f64,
    /// Worst case: the longest task (two with slave overlap) lost just
    /// before its commit, when all slaves would otherwise finish together
    /// (with write-behind, just before its ending commits, and the next
    /// task's first [`Held::ending_behind`] seconds with it);
    /// plus the replacement's start as that case pays it (extension): the
    /// whole start up to one task's time (`T₁/N`), the rest `/s`. The
    /// other slaves can only take whole tasks off the replacement, so
    /// when they would otherwise finish together a start shorter than a
    /// task delays the run's end by all of it, as the lost task does.
    pub worst: f64,
    /// Extension: the run time a replacement's start costs on average,
    /// `start/s` (`Params::slave_start`): for that long the work runs on
    /// `s−1` of the `s` slaves. (Charged whole up to a task's time, as the
    /// worst case does, the average read 0.143 s where four `bench
    /// recovery` runs of 12 kills measured 0.147, 0.150, 0.12 and 0.10 s,
    /// n = 4096, b = 1024, two slaves; `/s` reads 0.115 s: the truth lies
    /// between, and this stays the simpler.) One slave: the run waits the
    /// whole start. 0 without the parameter, as in the thesis.
    pub restart: f64,
    /// `average / T_s`, about `s/(2N)` of the run (§5.4).
    pub fraction_of_run: f64,
    /// Mean interval between queue requests, `T_s/N` (§5.4).
    pub queue_interval: f64,
    /// Extension: a slave lost for good at a uniformly random moment: redo
    /// half a task and run the remaining half of the work on `s−1` slaves,
    /// `average + (T₁/2)(1/(s−1) − 1/s)`. `None` for one slave (the run
    /// stops until a slave joins).
    pub permanent_loss_average: Option<f64>,
}

/// What a slave holds besides the task it runs, and loses with it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Held {
    /// §5.5.2's slave overlap: a second task (two threads, or the next
    /// task prefetched).
    pub second_task: bool,
    /// Extension, write-behind: each task's ending (puts, done record,
    /// commit) runs for this long behind the next task's start, and the
    /// task's dequeue commits with it, so a slave that dies meanwhile
    /// loses that whole task too. Over a uniformly random moment that is
    /// a whole task with probability `ending / task`: `ending` on
    /// average. (`bench recovery`, n = 4096, b = 1024, two slaves: 6 of
    /// 84 kills in seven runs redid two tasks. The curve this comes from,
    /// `Params::task_ending`, is timed alone: 4 ms there, where the job's
    /// endings took 15 ms at the median.) 0: the thesis's slave.
    pub ending_behind: f64,
}

/// Recovery figures from the single-slave time, the number of tasks, the
/// longest task, the number of slaves and the predicted time with them,
/// and what a slave holds; `slave_start` is a replacement's start-up (0:
/// the thesis's figures).
pub fn recovery(t1: f64, n_tasks: u64, longest_task: f64, slaves: u64, t_s: f64, held: Held, slave_start: f64) -> Recovery {
    let n = n_tasks.max(1) as f64;
    let ending = held.ending_behind.max(0.0);
    let tasks_held = if held.second_task { 2.0 } else { 1.0 };
    let s = slaves.max(1) as f64;
    let restart = slave_start / s;
    let task = t1 / n;
    let restart_worst = slave_start.min(task) + (slave_start - task).max(0.0) / s;
    let average = tasks_held * t1 / (2.0 * n) + ending + restart;
    Recovery {
        average,
        worst: tasks_held * longest_task + ending + restart_worst,
        restart,
        fraction_of_run: if t_s > 0.0 { average / t_s } else { 0.0 },
        queue_interval: t_s / n,
        permanent_loss_average: (slaves > 1).then(|| average + t1 / 2.0 * (1.0 / (s - 1.0) - 1.0 / s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 4.3 (fast): "average recovery" is T₁/(2N) of the *measured*
    /// single-slave time: MM b=300 2984 s / 100 tasks -> 15 s; MM b=750
    /// 2390 / 16 -> 75; Cholesky b=300 2539 / 136 -> 9; b=600 2071 / 36 -> 29.
    #[test]
    fn average_recovery_matches_table_4_3() {
        for (t1, n, printed) in [(2984.0, 100, 15.0), (2390.0, 16, 75.0), (2539.0, 136, 9.0), (2071.0, 36, 29.0)] {
            let r = recovery(t1, n, t1 / n as f64, 1, t1, Held::default(), 0.0);
            assert!((r.average - printed).abs() <= 0.5, "{t1}/{n}: {} vs {printed}", r.average);
        }
    }

    /// Table 4.6 (ATM, 5 slaves): average recovery (T_s·s)/(2N): MM 9000²
    /// b=600, 13179 s, 225 tasks -> 146 s; Cholesky 15000² b=750, 10922 s,
    /// 210 tasks -> 130 s.
    #[test]
    fn average_recovery_matches_table_4_6() {
        for (ts, n, printed) in [(13179.0, 225, 146.0), (10922.0, 210, 130.0)] {
            let r = recovery(ts * 5.0, n, 0.0, 5, ts, Held::default(), 0.0);
            assert!((r.average - printed).abs() <= 0.5, "{} vs {printed}", r.average);
            // §5.4: the fraction of the run is about s/(2N).
            assert!((r.fraction_of_run - 5.0 / (2.0 * n as f64)).abs() < 1e-12);
        }
    }

    /// With write-behind a death during the previous task's ending loses
    /// that task too: the ending's length more on average and at worst.
    #[test]
    fn an_ending_in_flight_is_lost_with_its_slave() {
        let thesis = recovery(1000.0, 100, 10.0, 4, 250.0, Held::default(), 0.0);
        let behind = recovery(1000.0, 100, 10.0, 4, 250.0, Held { ending_behind: 0.5, ..Held::default() }, 0.0);
        assert!((behind.average - thesis.average - 0.5).abs() < 1e-12);
        assert!((behind.worst - thesis.worst - 0.5).abs() < 1e-12);
        let overlap = recovery(1000.0, 100, 10.0, 4, 250.0, Held { second_task: true, ..Held::default() }, 0.0);
        assert!((overlap.average - 2.0 * thesis.average).abs() < 1e-12);
    }

    #[test]
    fn permanent_loss_costs_more_than_a_restart() {
        let r = recovery(1000.0, 100, 10.0, 4, 250.0, Held::default(), 0.0);
        assert!(r.permanent_loss_average.unwrap() > r.average);
        assert!(recovery(1000.0, 100, 10.0, 1, 1000.0, Held::default(), 0.0).permanent_loss_average.is_none());
    }

    /// A replacement that takes `start` seconds to begin costs the run
    /// `start/s` on top of the lost work on average; in the worst case
    /// its whole start up to one task's time, the rest shared.
    #[test]
    fn a_replacements_start_is_shared_on_average_and_whole_up_to_a_task_at_worst() {
        // 100 tasks of 10 s on 4 slaves.
        let thesis = recovery(1000.0, 100, 10.0, 4, 250.0, Held::default(), 0.0);
        let quick = recovery(1000.0, 100, 10.0, 4, 250.0, Held::default(), 0.2);
        assert_eq!(thesis.restart, 0.0);
        assert!((quick.restart - 0.05).abs() < 1e-12);
        assert!((quick.average - thesis.average - 0.05).abs() < 1e-12);
        assert!((quick.worst - thesis.worst - 0.2).abs() < 1e-12);
        let slow = recovery(1000.0, 100, 10.0, 4, 250.0, Held::default(), 30.0);
        assert!((slow.worst - thesis.worst - (10.0 + 20.0 / 4.0)).abs() < 1e-12);
        // One slave: the run waits for the replacement whatever its start.
        let alone = recovery(1000.0, 100, 10.0, 1, 1000.0, Held::default(), 30.0);
        assert!((alone.restart - 30.0).abs() < 1e-12);
        assert!((alone.worst - 10.0 - 30.0).abs() < 1e-12);
    }
}
