//! `bench ooc matmul --mem-cap … --quick`, run as a user runs it: the job
//! on a store node and slaves in a memory cgroup without a limit and in
//! one with it, its matrices larger than the cap. The capped run stays
//! under the cap, reads its blocks from storage, verifies, and leaves no
//! cgroup behind. Without root or a memory controller the bench says
//! `skipped:` and fails; so does this test's line.

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The cap: the quick job's matrices (three of n = 4096, 384 MiB) are
/// well past it, while the processes themselves need about 80 MiB.
const CAP_MIB: u64 = 160;

#[test]
fn a_capped_quick_matmul_stays_under_its_cap_and_reads_from_disk() {
    let base = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["ooc", "matmul", "--quick", "--no-dask", "--mem-cap", &format!("{CAP_MIB}M")])
        .arg("--dir")
        .arg(base.path())
        .env("OPENBLAS_NUM_THREADS", "1")
        .env("HOME", base.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(skip) = stdout.lines().find(|l| l.starts_with("skipped: ")) {
        assert!(!out.status.success(), "a skipped run must fail:\n{stdout}\n{stderr}");
        // Through the handles, not `println!`: libtest captures the
        // macros' output of passing tests, and a skip must show.
        let _ = writeln!(std::io::stdout().lock(), "{skip}");
        let _ = writeln!(std::io::stderr().lock(), "{skip}");
        return;
    }
    assert!(out.status.success(), "bench ooc --mem-cap failed:\n{stdout}\n{stderr}");
    let figure = |name: &str| -> serde_json::Value {
        let line = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("BENCH "))
            .find(|l| l.contains(&format!(r#""name":"{name}""#)))
            .unwrap_or_else(|| panic!("no BENCH line {name}:\n{stdout}\n{stderr}"));
        serde_json::from_str(line).unwrap()
    };
    let capped = figure("memcap_matmul_ours_capped_gflops");
    let uncapped = figure("memcap_matmul_ours_uncapped_gflops");
    let cap = CAP_MIB << 20;
    let u = |f: &serde_json::Value, k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {f}"));
    assert_eq!(u(&capped, "cap_bytes"), cap, "{capped}");
    assert!(uncapped["cap_bytes"].is_null(), "{uncapped}");
    let peak = u(&capped, "cgroup_peak_bytes");
    assert!(peak > 0 && peak <= cap, "the capped run's cgroup peak {peak} passes the cap {cap}: {capped}");
    // Uncapped, the matrices fit in the page cache beside the processes.
    assert!(u(&uncapped, "cgroup_peak_bytes") > cap, "{uncapped}");
    // Capped, most of the inputs (256 MiB) come from storage; reading
    // them once is a ratio of 2/3 to all three matrices.
    let read = figure("memcap_matmul_capped_disk_read_vs_matrices");
    assert!(read["value"].as_f64().unwrap() > 0.3, "{read}");
    for f in [&capped, &uncapped] {
        assert_eq!(f["verified"], serde_json::Value::Bool(true), "{f}");
        assert_eq!(u(f, "oom_kills"), 0, "{f}");
        assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
    }
    let ratio = figure("memcap_matmul_capped_vs_uncapped");
    assert_eq!(ratio["target"].as_f64(), Some(0.92), "{ratio}");
    // The bench's groups are named after its pid, not this test's; look
    // for any of ours that is left.
    let stale: Vec<String> = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .flat_map(|root| std::fs::read_dir(root).into_iter().flatten().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ftbag-bench-") && !Path::new(&format!("/proc/{}", owner(n))).exists())
        .collect();
    assert!(stale.is_empty(), "cgroups left behind: {stale:?}");
}

/// The pid in `ftbag-bench-PID-label`.
fn owner(name: &str) -> String {
    name.trim_start_matches("ftbag-bench-").split('-').next().unwrap_or("").to_owned()
}
