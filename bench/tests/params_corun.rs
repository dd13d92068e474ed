//! `bench params --corun-only`, run as a user runs it: copies of the
//! kernels in separate `bench corun-copy` processes, the factors written
//! into an existing parameter file and nothing else in it changed.

use std::process::Command;

use model::Params;

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.env("OPENBLAS_NUM_THREADS", "1");
    c
}

#[test]
fn corun_only_adds_the_factors_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("params.toml");
    let before = Params::thesis_fast();
    std::fs::write(&file, before.to_toml_string().unwrap()).unwrap();

    let out = bench().args(["params", "--corun-only", "--quick", "--out"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = Params::from_toml_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let corun = after.corun.clone().expect("a corun section");
    assert_eq!(Params { corun: None, ..after }, before, "only corun changes");

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    for (what, points) in [("kernels", &corun.kernels), ("ray", &corun.ray)] {
        assert_eq!(points.first(), Some(&[1.0, 1.0]), "{what}: one copy is itself");
        assert_eq!(points.last().map(|p| p[0]), Some(cores), "{what}: up to every core");
        assert!(points.windows(2).all(|w| w[0][0] < w[1][0]), "{what}: counts increase: {points:?}");
        // A copy beside others is slower or about as fast, never far
        // faster: a factor this low would mean the copies did not run.
        assert!(points.iter().all(|p| p[1].is_finite() && p[1] > 0.5), "{what}: {points:?}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(r#""name":"params_corun_kernels_all_cores""#), "{stdout}");
}

#[test]
fn corun_only_without_a_file_says_what_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.toml");
    let out = bench().args(["params", "--corun-only", "--quick", "--out"]).arg(&missing).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--corun-only") && err.contains("none.toml"), "{err}");
    assert!(!missing.exists(), "nothing written");
}
