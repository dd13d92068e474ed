//! `bench soak --quick` as CI runs it: every app in turn on a real store
//! node and slaves while a seeded schedule SIGKILLs slaves, SIGSTOPs them
//! past their lease and SIGKILLs the store node; nothing is lost, nothing
//! is committed twice, and every job passes `master verify`.

use std::process::Command;

#[test]
fn a_quick_soak_survives_every_fault_losing_nothing() {
    let base = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["soak", "--quick", "--seed", "11"])
        .env("OPENBLAS_NUM_THREADS", "1")
        // The cluster's data directory under the test's own temporary one.
        .env("HOME", base.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench soak failed:\n{stdout}\n{stderr}");
    let line = stdout.lines().find_map(|l| l.strip_prefix("BENCH ")).unwrap_or_else(|| panic!("no BENCH line:\n{stdout}"));
    let figure: serde_json::Value = serde_json::from_str(line).unwrap();
    let count = |k: &str| figure[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {figure}"));
    assert_eq!((count("slave_kills"), count("store_kills"), count("zombies")), (20, 5, 3), "{figure}");
    assert_eq!(count("lost_commits") + count("unplanned_commits") + count("duplicated_commits"), 0, "{figure}");
    assert_eq!(count("jobs_failed_check"), 0, "{figure}");
    assert!(count("jobs") >= 1, "{figure}");
}
