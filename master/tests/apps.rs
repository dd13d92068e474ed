//! Cholesky, LU and ray tracing end to end with real processes (`master
//! serve`, `slave` processes, `master` CLI calls), checked against
//! computations made here, independently of the code under test: in-core
//! LAPACK (dpotrf, dgetrf) on the input exported with `master matrix
//! export`, residuals summed here element by element, and the ray tracer
//! run in this process. Then recovery under seeded SIGKILL schedules, and
//! jobs that must fail with the block named.

mod support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use job_record as record;
use rand::{Rng, SeedableRng};
use store_client::BlockData;
use support::dense::*;
use support::{create_kind, kill_child, master, master_ok, slave};
use uuid::Uuid;

/// The in-test checks are not vacuous: they pass the LAPACK factors and
/// reject slightly wrong ones (no processes involved).
#[test]
fn the_reference_checks_reject_a_wrong_factor() {
    let n = 60;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut a = Mat::zeros(n, n);
    for c in 0..n {
        for r in c..n {
            let v: f64 = rng.gen_range(-1.0..1.0) + if r == c { n as f64 } else { 0.0 };
            a.set(r, c, v);
            a.set(c, r, v);
        }
    }
    let bound = 1e-13 * n as f64;
    let l = lapack_cholesky(&a);
    assert!(cholesky_residual(&a, &l) <= bound && upper_is_zero(&l));
    let mut bad = l.clone();
    bad.set(40, 17, bad.get(40, 17) * (1.0 + 1e-6));
    assert!(cholesky_residual(&a, &bad) > bound && bad.rel_diff(&l) > 0.0);
    bad = l.clone();
    bad.set(3, 5, 1e-300);
    assert!(!upper_is_zero(&bad));

    let (lu, piv) = lapack_lu(&a);
    let perm = permutation(&piv);
    assert!(lu_residual(&a, &lu, &perm) <= bound);
    let mut swapped = piv.clone();
    swapped.swap(10, 11);
    swapped[10] = 12;
    assert!(lu_residual(&a, &lu, &permutation(&swapped)) > bound);
    let mut bad = lu.clone();
    bad.set(50, 20, bad.get(50, 20) * (1.0 + 1e-6));
    assert!(lu_residual(&a, &bad, &perm) > bound);

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("a.npy");
    write_npy(&f, &a);
    assert!(read_npy(&f) == a, "the .npy round trip is exact");
}

// ---------------------------------------------------------------------------
// The store node, slaves, jobs.

type Env = support::cluster::Cluster;

/// `master matrix export NAME` and the matrix read back.
fn export(env: &Env, name: &str) -> Mat {
    let f = env.path(&format!("{name}.npy"));
    master_ok(env.s(), &["matrix", "export", name, f.to_str().unwrap()]);
    read_npy(&f)
}

/// The interchanges of a pivoted LU job, concatenated over the panels
/// (0-based global rows, LAPACK's `ipiv` order).
fn pivots(env: &Env, job: Uuid, p: u32) -> Vec<u64> {
    let mut all = Vec::new();
    for k in 0..p {
        let raw = env.peek(&apps::lu::pivots_key(job, k)).unwrap_or_else(|| panic!("pivots of panel {k} missing"));
        all.extend(raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())));
    }
    all
}

/// Submits with `master submit ARGS`; returns the job id.
fn submit(s: &str, args: &[&str]) -> Uuid {
    let mut full = vec!["submit"];
    full.extend_from_slice(args);
    master_ok(s, &full).parse().expect("the job id alone on stdout")
}

/// `master wait JOB` with a deadline: a hang fails the test instead of
/// stalling it.
fn wait_job(s: &str, job: Uuid, limit: Duration) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_master"))
        .args(["wait", &job.to_string()])
        .env("STORE_ADDR", s)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            panic!("job {job} did not end within {limit:?} (hung)");
        }
    }
}

fn wait_ok(s: &str, job: Uuid) {
    let out = wait_job(s, job, Duration::from_secs(120));
    assert!(out.status.success(), "job {job} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `master verify JOB` must pass.
fn verify_ok(s: &str, job: Uuid, needle: &str) {
    let out = master(s, &["verify", &job.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(needle), "verify {job}: {text}{}", String::from_utf8_lossy(&out.stderr));
}

/// `master status JOB` says the job succeeded with all `total` tasks done.
fn status_complete(s: &str, job: Uuid, total: usize) {
    let status = master_ok(s, &["status", &job.to_string()]);
    assert!(
        status.contains("succeeded") && status.contains(&format!(" {total}/{total} tasks")),
        "expected {total}/{total} tasks: {status}"
    );
}

/// Slave processes, killed on drop.
struct Slaves {
    store: String,
    extra: Vec<String>,
    running: Vec<Child>,
    started: usize,
}

impl Slaves {
    fn start(store: &str, n: usize, extra: &[&str]) -> Slaves {
        let mut s = Slaves { store: store.to_owned(), extra: extra.iter().map(|x| x.to_string()).collect(), running: vec![], started: 0 };
        for _ in 0..n {
            s.spawn();
        }
        s
    }

    fn spawn(&mut self) {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.running.push(slave(&self.store, &format!("slave-{}", self.started), &extra));
        self.started += 1;
    }

    fn kill(&mut self, k: usize) {
        kill_child(self.running.remove(k));
    }
}

impl Drop for Slaves {
    fn drop(&mut self) {
        for c in self.running.drain(..) {
            kill_child(c);
        }
    }
}

/// A slave logging at info level to `log`.
fn logged_slave(store: &str, name: &str, log: &Path) -> Child {
    support::dies_with_test(&mut Command::new(support::slave_exe()))
        .args(["--store", store, "--name", name])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn slave")
}

fn seed() -> u64 {
    std::env::var("FT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7)
}

/// Runs a submitted job with 3 slaves, the first `kills` of them with
/// seeded kill points (`support::run_slaves_with_kill_points`). Returns the
/// kills that landed while the job ran.
fn run_with_kills(env: &Env, job: Uuid, total: usize, kills: usize, seed: u64) -> usize {
    let start = Instant::now();
    let made = support::run_slaves_with_kill_points(env.s(), 3, kills, seed, || {
        assert!(start.elapsed() < Duration::from_secs(120), "job {job} stalled at {} tasks", env.done(job).len());
        env.peek(&record::finished_key(job)).is_some() || env.peek(&record::failed_key(job)).is_some()
    });
    wait_ok(env.s(), job);
    let redone = env.done(job).iter().filter(|(_, d)| d.attempts > 0).count();
    eprintln!("job {job} ({total} tasks): {} kills, at {made:?}; {redone} task(s) redone after a kill", made.len());
    if kills > 0 {
        assert!(redone > 0, "job {job}: no kill interrupted a task");
    }
    made.len()
}

fn chol_tasks(variant: &str, p: usize) -> usize {
    if variant == "multi-step-2" {
        1 + p * (p - 1) / 2
    } else {
        p * (p + 1) / 2
    }
}

fn lu_tasks(pivot: bool, schedule: &str, p: usize) -> usize {
    if pivot && schedule == "dag" {
        // panel + update + left swap
        p + p * (p - 1) / 2 + p - 1
    } else if pivot {
        // copy + multiply (k ≥ 1) + panel + swap + solve
        p * p + p * (p - 1) / 2 + p + p * (p - 1) + p * (p - 1) / 2
    } else {
        // multiply + factor + solve (L and U)
        p * (p + 1) / 2 + p + p * (p - 1)
    }
}

/// Tournament pivoting: per panel of `m > 1` blocks a tree of `m − 1`
/// tasks and `m − 1` updates, the last panel one task, and each panel's
/// interchanges applied to every column left of it.
fn tournament_tasks(p: usize) -> usize {
    (2..=p).map(|m| 2 * (m - 1)).sum::<usize>() + 1 + p * (p - 1) / 2
}

fn blocks(n: u64, b: u32) -> usize {
    n.div_ceil(u64::from(b)) as usize
}

const VARIANTS: [&str; 4] = ["single-bag", "multi-step-1", "multi-step-2", "dag"];

// ---------------------------------------------------------------------------
// 1. Correctness against in-core references.

#[test]
fn cholesky_every_variant_and_size_matches_in_core_lapack() {
    let env = Env::start(&[]);
    let s = env.s();
    let _slaves = Slaves::start(s, 2, &[]);
    // (n, b): a multiple, n not a multiple of b (twice), a single block.
    for (idx, (n, b)) in [(96u64, 32u32), (100, 32), (150, 64), (40, 64)].into_iter().enumerate() {
        let a_name = format!("S{idx}");
        create_kind(s, &a_name, n, n, b, "spd", 30 + idx as u64);
        let a = export(&env, &a_name);
        let want = lapack_cholesky(&a);
        let bound = 1e-13 * n as f64;
        for variant in VARIANTS {
            let out = format!("L{idx}-{variant}");
            let job = submit(s, &["cholesky", &a_name, "--out", &out, "--variant", variant]);
            wait_ok(s, job);
            let l = export(&env, &out);
            assert!(upper_is_zero(&l), "{out}: upper triangle not zero");
            let res = cholesky_residual(&a, &l);
            let diff = l.rel_diff(&want);
            eprintln!("cholesky {variant} n={n} b={b}: residual {res:.2e}, vs LAPACK {diff:.2e}");
            assert!(res <= bound, "{variant} n={n} b={b}: ‖A − LLᵀ‖/‖A‖ = {res:e} > {bound:e}");
            assert!(diff <= bound, "{variant} n={n} b={b}: ‖L − L_lapack‖/‖L_lapack‖ = {diff:e} > {bound:e}");
            env.assert_each_task_once(job, chol_tasks(variant, blocks(n, b)));
            status_complete(s, job, chol_tasks(variant, blocks(n, b)));
            verify_ok(s, job, "‖A − L·Lᵀ‖_F/‖A‖_F");
        }
    }
}

#[test]
fn lu_with_and_without_pivoting_matches_in_core_lapack() {
    let env = Env::start(&[]);
    let s = env.s();
    let _slaves = Slaves::start(s, 2, &[]);
    for (idx, (n, b)) in [(96u64, 32u32), (100, 32), (150, 64), (40, 64)].into_iter().enumerate() {
        let bound = 1e-13 * n as f64;
        let p = blocks(n, b);
        for (pivot, schedule) in [(false, "bags"), (false, "dag"), (true, "bags"), (true, "dag")] {
            // Without pivoting: diagonally dominant; with: a plain random matrix.
            let (a_name, kind) =
                if pivot { (format!("R{idx}-{schedule}"), "random") } else { (format!("D{idx}-{schedule}"), "diag-dominant") };
            create_kind(s, &a_name, n, n, b, kind, 50 + idx as u64);
            let a = export(&env, &a_name);
            let (want, want_piv) = lapack_lu(&a);
            let out = format!("LU{idx}-{pivot}-{schedule}");
            let mut args = vec!["lu", a_name.as_str(), "--out", out.as_str(), "--schedule", schedule];
            if pivot {
                args.push("--pivot");
            }
            let job = submit(s, &args);
            wait_ok(s, job);
            let lu = export(&env, &out);
            let swaps = if pivot { pivots(&env, job, p as u32) } else { (0..n).collect() };
            if pivot {
                assert_eq!(swaps, want_piv, "n={n} b={b}: interchanges differ from LAPACK's");
                let f = env.path(&format!("{out}.perm.npy"));
                master_ok(s, &["matrix", "export", &format!("{out}.perm"), f.to_str().unwrap()]);
                assert_eq!(read_perm_npy(&f), permutation(&want_piv), "n={n} b={b}: exported permutation");
                assert!(swaps.iter().enumerate().any(|(r, &g)| g != r as u64), "a random matrix needs interchanges");
            } else {
                // Diagonally dominant: LAPACK interchanges nothing either, so the factors compare.
                assert!(want_piv.iter().enumerate().all(|(r, &g)| g == r as u64));
            }
            let res = lu_residual(&a, &lu, &permutation(&swaps));
            let diff = lu.rel_diff(&want);
            eprintln!("lu pivot={pivot} {schedule} n={n} b={b}: residual {res:.2e}, vs LAPACK {diff:.2e}");
            assert!(res <= bound, "pivot={pivot} n={n} b={b}: ‖PA − LU‖/‖A‖ = {res:e} > {bound:e}");
            assert!(diff <= bound, "pivot={pivot} n={n} b={b}: ‖LU − LU_lapack‖/‖LU_lapack‖ = {diff:e} > {bound:e}");
            env.assert_each_task_once(job, lu_tasks(pivot, schedule, p));
            status_complete(s, job, lu_tasks(pivot, schedule, p));
            verify_ok(s, job, "‖PA − L·U‖_F/‖A‖_F");
        }
    }
}

#[test]
fn lu_tournament_pivoting_factors_and_exports_as_partial_pivoting_does() {
    let env = Env::start(&[]);
    let s = env.s();
    let _slaves = Slaves::start(s, 2, &[]);
    for (idx, (n, b)) in [(100u64, 32u32), (150, 64), (40, 64), (224, 32)].into_iter().enumerate() {
        let p = blocks(n, b);
        let a_name = format!("T{idx}");
        create_kind(s, &a_name, n, n, b, "random", 60 + idx as u64);
        let a = export(&env, &a_name);
        let (lapack, lapack_piv) = lapack_lu(&a);
        let out = format!("LUT{idx}");
        let job = submit(s, &["lu", &a_name, "--out", &out, "--pivot", "tournament"]);
        wait_ok(s, job);
        let lu = export(&env, &out);
        let swaps = pivots(&env, job, p as u32);
        let f = env.path(&format!("{out}.perm.npy"));
        master_ok(s, &["matrix", "export", &format!("{out}.perm"), f.to_str().unwrap()]);
        assert_eq!(read_perm_npy(&f), permutation(&swaps), "n={n} b={b}: exported permutation");
        let res = lu_residual(&a, &lu, &permutation(&swaps));
        let max_abs = |m: &Mat, upper: bool| {
            (0..m.cols)
                .flat_map(|c| (0..m.rows).map(move |r| (r, c)))
                .filter(|&(r, c)| !upper || r <= c)
                .fold(0.0f64, |x, (r, c)| x.max(m.get(r, c).abs()))
        };
        let growth = max_abs(&lu, true) / max_abs(&a, false);
        let lapack_growth = max_abs(&lapack, true) / max_abs(&a, false);
        eprintln!(
            "lu tournament n={n} b={b}: residual {res:.2e}, growth {growth:.2} (partial {lapack_growth:.2}), {} of {n} pivots as LAPACK's",
            swaps.iter().zip(&lapack_piv).filter(|(x, y)| x == y).count()
        );
        assert!(res <= 1e-13 * n as f64, "n={n} b={b}: ‖PA − LU‖/‖A‖ = {res:e}");
        assert!(growth <= 10.0 * lapack_growth.max(1.0), "n={n} b={b}: growth {growth} against partial {lapack_growth}");
        env.assert_each_task_once(job, tournament_tasks(p));
        status_complete(s, job, tournament_tasks(p));
        verify_ok(s, job, "‖PA − L·U‖_F/‖A‖_F");
    }
    // The bags schedule has no tournament; refused before anything is created.
    let out = master(s, &["submit", "lu", "T0", "--out", "never", "--pivot", "tournament", "--schedule", "bags"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("dag schedule only"));
    assert!(!master_ok(s, &["matrix", "list"]).contains("never"));
}

/// Peak resident set (VmHWM) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap();
    kb * 1024
}

#[test]
fn lu_tournament_slaves_stay_within_four_blocks() {
    // Blocks of 32 MiB, 4 block rows, so the tree has inner nodes: their
    // 2b x b stacks (64 MiB) are a second buffer size beside the blocks.
    // The slave's allocator kept a freed stack beside its freed blocks and
    // slaves peaked at 240 MiB. At b = 1024 the 64 MiB allowance hides it
    // (94 MiB of 96). Partial pivoting's panel holds a block column (400 MiB
    // here), so it is not run.
    let (n, b) = (8192u64, 2048u32);
    let block = u64::from(b) * u64::from(b) * 8;
    let bound = 4 * block + (64 << 20);
    let env = Env::start(&[]);
    let s = env.s();
    create_kind(s, "R", n, n, b, "random", 9);
    let slaves = Slaves::start(s, 2, &[]);
    let job = submit(s, &["lu", "R", "--out", "LU", "--pivot", "tournament"]);
    wait_ok(s, job);
    verify_ok(s, job, "‖PA − L·U‖_F/‖A‖_F");
    let peaks: Vec<u64> = slaves.running.iter().map(|c| peak_rss(c.id())).collect();
    eprintln!(
        "lu --pivot tournament n={n} b={b}: slave peak RSS {:?} MiB (bound {} MiB)",
        peaks.iter().map(|x| x >> 20).collect::<Vec<_>>(),
        bound >> 20
    );
    assert!(peaks.iter().all(|&x| x <= bound), "a slave peaked at {peaks:?} bytes, over 4 blocks + 64 MiB = {bound}");
}

fn reference_png(level: u32, width: u32, height: u32, samples: u32) -> Vec<u8> {
    let params = apps::raytrace::RenderParams { level, width, height, grain: height, samples };
    let rgb = apps::raytrace::render(&params).unwrap();
    assert_eq!(rgb.len(), (width * height * 3) as usize);
    apps::raytrace::encode_png(width, height, &rgb).unwrap()
}

fn submit_raytrace(s: &str, out: &str, level: u32, width: u32, height: u32, grain: u32, samples: u32) -> Uuid {
    let (l, w, h, g, sa) = (level.to_string(), width.to_string(), height.to_string(), grain.to_string(), samples.to_string());
    submit(
        s,
        &["raytrace", "--scene", "balls", "--level", &l, "--width", &w, "--height", &h, "--grain", &g, "--samples", &sa, "--out", out],
    )
}

fn export_png(env: &Env, name: &str) -> Vec<u8> {
    let f = env.path(&format!("{name}.png"));
    master_ok(env.s(), &["image", "export", name, f.to_str().unwrap()]);
    std::fs::read(f).unwrap()
}

#[test]
fn raytraced_images_equal_a_single_process_render() {
    let env = Env::start(&[]);
    let s = env.s();
    let _slaves = Slaves::start(s, 2, &[]);
    // (level, width, height, grain, samples): height not a multiple of the
    // grain, one scanline per task, one task for the whole image, supersampled.
    for (idx, (level, w, h, g, sa)) in [(2, 64, 48, 5, 1), (1, 33, 20, 1, 1), (3, 40, 30, 30, 1), (2, 24, 17, 4, 2)].into_iter().enumerate()
    {
        let name = format!("img{idx}");
        let job = submit_raytrace(s, &name, level, w, h, g, sa);
        // Each submit counts itself in its own action: what idle slaves watch.
        assert_eq!(record::submitted_count(env.peek(record::SUBMITTED_KEY).as_deref()), idx as u64 + 1, "jobs counted as submitted");
        wait_ok(s, job);
        let got = export_png(&env, &name);
        let want = reference_png(level, w, h, sa);
        assert!(got == want, "{name}: exported PNG differs from the single-process render");
        env.assert_each_task_once(job, h.div_ceil(g) as usize);
        status_complete(s, job, h.div_ceil(g) as usize);
        verify_ok(s, job, "byte-identical to a single-process render: true");
    }
}

// ---------------------------------------------------------------------------
// 2. Recovery: seeded SIGKILL schedules, bit-identical results, every task
// committed once.

const KILLS: usize = 10;

#[test]
fn cholesky_every_variant_survives_ten_kills_bit_identical_each_task_once() {
    let seed = seed();
    eprintln!("seed {seed} (set FT_SEED to replay)");
    // Rapid kills may hit the task first in line again and again: raise the
    // poison limit so this test is about recovery, not dead-lettering.
    let env = Env::start(&["--attempt-limit", "1000"]);
    let s = env.s();
    let (n, b) = (520u64, 64u32);
    let p = blocks(n, b);
    create_kind(s, "S", n, n, b, "spd", 3);
    for (v, variant) in VARIANTS.into_iter().enumerate() {
        let mut outs = Vec::new();
        for kills in [0, KILLS] {
            let out = format!("L-{variant}-{kills}");
            let job = submit(s, &["cholesky", "S", "--out", &out, "--variant", variant, "--flag-timeout-ms", "500"]);
            let total = chol_tasks(variant, p);
            let made = run_with_kills(&env, job, total, kills, seed + v as u64);
            assert!(made >= kills, "{variant}: only {made} kills landed while the job ran");
            env.assert_each_task_once(job, total);
            status_complete(s, job, total);
            verify_ok(s, job, "‖A − L·Lᵀ‖_F/‖A‖_F");
            outs.push(env.export_bytes(&out));
        }
        assert!(outs[0] == outs[1], "{variant}: the factor after {KILLS} kills differs from the run without kills");
    }
}

#[test]
fn lu_with_and_without_pivoting_survives_ten_kills_bit_identical_each_task_once() {
    let seed = seed();
    eprintln!("seed {seed} (set FT_SEED to replay)");
    let env = Env::start(&["--attempt-limit", "1000"]);
    let s = env.s();
    let (n, b) = (420u64, 64u32);
    let p = blocks(n, b);
    create_kind(s, "D", n, n, b, "diag-dominant", 4);
    create_kind(s, "R", n, n, b, "random", 5);
    let mut nopiv_bags = None;
    let mut pivot_bags_swaps = None;
    // Tournament pivoting: slaves die at their first or second task, which
    // at the start of the job and after each panel are the tree's, so kills
    // land mid-tree.
    let cases = [(false, "bags", ""), (false, "dag", ""), (true, "bags", "partial"), (true, "dag", "partial"), (true, "dag", "tournament")];
    for (case, (pivot, schedule, rule)) in cases.into_iter().enumerate() {
        let a = if pivot { "R" } else { "D" };
        let mut outs = Vec::new();
        let mut pivs = Vec::new();
        for kills in [0, KILLS] {
            let out = format!("LU-{pivot}-{schedule}-{rule}-{kills}");
            let mut args = vec!["lu", a, "--out", out.as_str(), "--schedule", schedule];
            if pivot {
                args.extend(["--pivot", rule]);
            }
            let job = submit(s, &args);
            let total = if rule == "tournament" { tournament_tasks(p) } else { lu_tasks(pivot, schedule, p) };
            let made = run_with_kills(&env, job, total, kills, seed + case as u64 / 2);
            assert!(made >= kills, "pivot={pivot} {rule}: only {made} kills landed while the job ran");
            env.assert_each_task_once(job, total);
            status_complete(s, job, total);
            verify_ok(s, job, "‖PA − L·U‖_F/‖A‖_F");
            outs.push(env.export_bytes(&out));
            if pivot {
                pivs.push(pivots(&env, job, p as u32));
            }
        }
        assert!(outs[0] == outs[1], "pivot={pivot} {schedule} {rule}: the factors after {KILLS} kills differ from the run without kills");
        // The dag runs the bags' tasks in another order: the same bits.
        match (pivot, schedule, &nopiv_bags) {
            (false, "bags", _) => nopiv_bags = Some(outs[0].clone()),
            (false, "dag", Some(bags)) => assert!(outs[0] == *bags, "the dag schedule's factors differ from the bags'"),
            _ => {}
        }
        if pivot {
            assert_eq!(pivs[0], pivs[1], "{rule}: the interchanges differ after kills");
        }
        if rule == "partial" {
            // Right-looking chooses the same pivots as the source's order.
            match (schedule, &pivot_bags_swaps) {
                ("bags", _) => pivot_bags_swaps = Some(pivs[0].clone()),
                (_, Some(bags)) => assert_eq!(pivs[0], *bags, "the dag's interchanges differ from the bags'"),
                _ => {}
            }
        }
    }
}

#[test]
fn raytrace_survives_ten_kills_byte_identical_each_task_once() {
    let seed = seed();
    eprintln!("seed {seed} (set FT_SEED to replay)");
    let env = Env::start(&["--attempt-limit", "1000"]);
    let s = env.s();
    // 4×4 samples per pixel: since the renderer stopped allocating per
    // ray, one-sample tasks ended before ten kills could land.
    let (level, w, h, g, samples) = (3, 96, 90, 2, 4);
    let mut pngs = Vec::new();
    for kills in [0, KILLS] {
        let name = format!("balls-{kills}");
        let job = submit_raytrace(s, &name, level, w, h, g, samples);
        let total = h.div_ceil(g) as usize;
        let made = run_with_kills(&env, job, total, kills, seed);
        assert!(made >= kills, "only {made} kills landed while the job ran");
        env.assert_each_task_once(job, total);
        status_complete(s, job, total);
        pngs.push(export_png(&env, &name));
    }
    assert!(pngs[0] == pngs[1], "the image after {KILLS} kills differs from the run without kills");
    assert!(pngs[1] == reference_png(level, w, h, samples), "the image differs from the single-process render");
}

/// Single-bag: the slave computing `L(0,0)`, which every task of column 0
/// waits on, is killed while the others wait on its ready flag. No
/// replacement is started: the waiters must time out, abort (their tasks go
/// back to the bag), and one of them must redo `L(0,0)`.
#[test]
fn single_bag_waiters_time_out_when_the_slave_they_wait_on_is_killed() {
    let env = Env::start(&[]);
    let s = env.s();
    let (n, b) = (128u64, 32u32);
    create_kind(s, "S", n, n, b, "spd", 9);
    let job = submit(s, &["cholesky", "S", "--out", "L", "--variant", "single-bag", "--flag-timeout-ms", "300"]);
    let bag = env.record(job).bags[0].clone();
    let l = env.rt.block_on(env.client.matrix_by_name("L")).unwrap();
    // Hold the write lock on L(0,0): the slave that computes it stays inside
    // its task (blocked writing it) until we let go.
    let session = env.rt.block_on(env.client.open_session("test holder")).unwrap();
    let holder = env.rt.block_on(session.begin()).unwrap();
    let zero = BlockData { rows: 32, cols: 32, data: vec![0.0; 32 * 32] };
    env.rt.block_on(holder.put_block(l.id, 0, 0, zero)).unwrap();

    let taken = |k: u64| {
        support::wait_for(Duration::from_secs(30), || (env.rt.block_on(env.client.bag_stats(&bag)).unwrap().taken >= k).then_some(()))
            .unwrap_or_else(|| panic!("never {k} tasks taken"))
    };
    let mut first = Slaves::start(s, 1, &[]);
    taken(1); // It holds (0,0), the first in line.
    let mut waiters: Vec<Child> = (0..2).map(|k| logged_slave(s, &format!("waiter-{k}"), &env.path(&format!("waiter-{k}.log")))).collect();
    taken(3); // They hold (1,0) and (2,0) and wait on the flag of (0,0).
    let elements = env.rt.block_on(env.client.list_bag(&bag)).unwrap();
    let seq_of = |i: u32, j: u32| {
        let want = serde_json::json!({"t": "block", "i": i, "j": j});
        elements.iter().find(|t| serde_json::from_slice::<serde_json::Value>(&t.payload).unwrap() == want).unwrap().seq
    };
    let s00 = seq_of(0, 0);
    first.kill(0);

    // The killed slave's task is back (orphaned once) and both waiters have
    // given theirs back after their flag timeout (the slaves log it; the
    // store's bag listing does not report returns).
    let flag = apps::cholesky::flag_key(job, 0, 0);
    support::wait_for(Duration::from_secs(30), || {
        let now = env.rt.block_on(env.client.list_bag(&bag)).unwrap();
        let orphaned = now.iter().any(|t| t.seq == s00 && t.attempts >= 1);
        let timed_out = (0..2).all(|k| {
            let log = std::fs::read_to_string(env.path(&format!("waiter-{k}.log"))).unwrap_or_default();
            log.lines().any(|l| l.contains("goes back to the bag") && l.contains(&flag) && l.contains("did not appear"))
        });
        (orphaned && timed_out).then_some(())
    })
    .unwrap_or_else(|| panic!("the waiters never timed out and gave their tasks back: {:?}", env.rt.block_on(env.client.list_bag(&bag))));
    env.rt.block_on(holder.abort()).unwrap();

    let out = wait_job(s, job, Duration::from_secs(60));
    assert!(out.status.success(), "job failed: {}", String::from_utf8_lossy(&out.stderr));
    let done = env.assert_each_task_once(job, chol_tasks("single-bag", blocks(n, b)));
    let rec = |seq: u64| &done.iter().find(|(k, _)| k.ends_with(&format!("{seq:012}"))).expect("record of the task").1;
    assert!(rec(s00).attempts >= 1, "L(0,0) was redone after its slave died");
    assert!(waiters.iter_mut().all(|c| c.try_wait().unwrap().is_none()), "the waiters are alive");
    waiters.into_iter().for_each(kill_child);
    let a = export(&env, "S");
    let res = cholesky_residual(&a, &export(&env, "L"));
    assert!(res <= 1e-13 * n as f64, "residual {res:e}");
}

// ---------------------------------------------------------------------------
// 3. Jobs that cannot succeed fail, with the block named, and do not hang.

#[test]
fn non_spd_cholesky_and_singular_lu_fail_naming_the_block() {
    let env = Env::start(&[]);
    let s = env.s();
    let _slaves = Slaves::start(s, 2, &[]);
    let (n, b) = (100usize, 32u32);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    // Symmetric and diagonally dominant, except a negative diagonal entry at
    // row 70 = block 2, its row 6: the leading minor of order 71 is the
    // first that is not positive definite.
    let mut spd = Mat::zeros(n, n);
    for c in 0..n {
        for r in c..n {
            let v: f64 = rng.gen_range(-1.0..1.0) + if r == c { n as f64 } else { 0.0 };
            spd.set(r, c, v);
            spd.set(c, r, v);
        }
    }
    spd.set(70, 70, -(n as f64));
    // Diagonally dominant with row 70 all zero: the elimination leaves row 6
    // of block (2,2) exactly zero, a zero pivot.
    let mut sing = Mat::zeros(n, n);
    for c in 0..n {
        for r in 0..n {
            let v: f64 = rng.gen_range(-1.0..1.0) + if r == c { n as f64 } else { 0.0 };
            sing.set(r, c, if r == 70 { 0.0 } else { v });
        }
    }
    let bs = b.to_string();
    for (name, m) in [("N", &spd), ("Z", &sing)] {
        let f = env.path(&format!("{name}-in.npy"));
        write_npy(&f, m);
        master_ok(s, &["matrix", "import", name, f.to_str().unwrap(), "--block", &bs]);
    }
    let mut jobs: Vec<(Uuid, &str)> = VARIANTS
        .into_iter()
        .map(|v| {
            (submit(s, &["cholesky", "N", "--out", &format!("L-{v}"), "--variant", v, "--flag-timeout-ms", "300"]), "not positive definite")
        })
        .collect();
    jobs.push((submit(s, &["lu", "Z", "--out", "LU"]), "singular"));
    for (job, what) in jobs {
        let t = Instant::now();
        let out = wait_job(s, job, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("job {job} ended in {:?}: {err}", t.elapsed());
        assert!(!out.status.success(), "job {job} should have failed");
        assert!(err.contains(what) && err.contains("block (2,2)") && err.contains("row 6"), "unclear reason: {err}");
        let status = master_ok(s, &["status", &job.to_string()]);
        assert!(status.contains("failed"), "{status}");
        let v = master(s, &["verify", &job.to_string()]);
        assert!(!v.status.success(), "verify of a failed job must not pass");
        // A slave that finds the job failed aborts the action it dequeued
        // in (its start sends the dequeue beside the flag read): the
        // element goes back, as a return, not an attempt.
        env.assert_bags_settled(job, Duration::from_secs(10));
    }
    // The store still works after failed jobs: a good job runs to the end.
    create_kind(s, "ok", 64, 64, 32, "spd", 1);
    let job = submit(s, &["cholesky", "ok", "--out", "Lok"]);
    wait_ok(s, job);
}
