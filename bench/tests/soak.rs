//! `bench soak --quick` as CI runs it: every app in turn on a real store
//! node and slaves while a seeded schedule SIGKILLs slaves, SIGSTOPs them
//! past their lease and SIGKILLs the store node; nothing is lost, nothing
//! is committed twice, and every job passes `master verify`.

use std::process::Command;

/// Runs `bench soak` with `args` and returns its BENCH figure, checked for
/// nothing lost, nothing committed twice and every job verified.
fn soak(args: &[&str]) -> serde_json::Value {
    let base = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("soak")
        .args(args)
        .env("OPENBLAS_NUM_THREADS", "1")
        // The cluster's data directory under the test's own temporary one.
        .env("HOME", base.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench soak {args:?} failed:\n{stdout}\n{stderr}");
    let line = stdout.lines().find_map(|l| l.strip_prefix("BENCH ")).unwrap_or_else(|| panic!("no BENCH line:\n{stdout}"));
    let figure: serde_json::Value = serde_json::from_str(line).unwrap();
    let count = |k: &str| figure[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {figure}"));
    assert_eq!(count("lost_commits") + count("unplanned_commits") + count("duplicated_commits"), 0, "{figure}");
    assert_eq!(count("jobs_failed_check"), 0, "{figure}");
    assert!(count("jobs") >= 1, "{figure}");
    figure
}

fn count(figure: &serde_json::Value, k: &str) -> u64 {
    figure[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {figure}"))
}

#[test]
fn a_quick_soak_survives_every_fault_losing_nothing() {
    let f = soak(&["--quick", "--seed", "11"]);
    assert_eq!((count(&f, "slave_kills"), count(&f, "store_kills"), count(&f, "zombies")), (20, 5, 3), "{f}");
}

/// The soak across network-namespace hosts: slave hosts' links are cut
/// and restored beside the other faults.
#[test]
fn a_soak_across_namespace_hosts_survives_link_cuts_losing_nothing() {
    if netns::skip_unless_root() {
        return;
    }
    let f = soak(&["--hosts", "4", "--seed", "5", "--slave-kills", "6", "--store-kills", "2", "--zombies", "2", "--link-cuts", "4"]);
    let counts = (count(&f, "slave_kills"), count(&f, "store_kills"), count(&f, "zombies"), count(&f, "link_cuts"));
    assert_eq!(counts, (6, 2, 2, 4), "{f}");
}
