//! `bench validate --replay`: the model of this build against runs an
//! earlier `validate --json` measured, without running a job.
//!
//! A change to the model moves every point, and one grid's error is as
//! much the host's noise as the model's. Predicting the same measured
//! runs again with the changed model takes seconds and sets the two side
//! by side on equal terms: each point's JSON keeps the model's inputs
//! as `validate` used them (`model_input`: the app, the parameters with
//! that point's re-timed rates, the options), so the replay differs from
//! the recorded prediction only where the model did.

use std::path::{Path, PathBuf};

use anyhow::Context;
use model::{predict, App, Options, Params};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{largest, mean, within_target};
use crate::report::Figure;

/// What the model was given for one grid point.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ModelInput {
    /// The app as `bench model` names it (`App`'s `Display`).
    pub(crate) app: String,
    /// The parameters, with the rates re-timed for this point.
    pub(crate) params: Params,
    /// The implementation's options with the point's slaves and cores.
    pub(crate) options: Options,
}

impl ModelInput {
    pub(crate) fn new(app: App, params: &Params, options: &Options) -> Self {
        Self { app: app.to_string(), params: params.clone(), options: options.clone() }
    }

    fn predict(&self, n: u64, b: u64) -> anyhow::Result<f64> {
        let app: App = self.app.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        Ok(predict(app, n, b, &self.params, &self.options)?.predicted)
    }
}

/// One replayed point.
#[derive(Debug)]
struct Replayed {
    app: String,
    n: u64,
    b: u64,
    slaves: u64,
    measured: f64,
    recorded: f64,
    now: f64,
}

impl Replayed {
    fn recorded_err(&self) -> f64 {
        (self.recorded - self.measured) / self.measured
    }
    fn err(&self) -> f64 {
        (self.now - self.measured) / self.measured
    }
}

/// The file's points that carry their model input, replayed; and how many
/// did not (written before `validate` kept it, or failed jobs).
fn replay_points(rows: &[Value]) -> anyhow::Result<(Vec<Replayed>, usize)> {
    let mut out = Vec::new();
    let mut skipped = 0;
    for (k, row) in rows.iter().enumerate() {
        let Some(input) = row.get("model_input").filter(|v| !v.is_null()) else {
            skipped += 1;
            continue;
        };
        if row.get("ok").and_then(Value::as_bool) == Some(false) {
            skipped += 1;
            continue;
        }
        let input: ModelInput = serde_json::from_value(input.clone()).with_context(|| format!("point {k}: its model input"))?;
        let num = |key: &str| row.get(key).and_then(Value::as_f64).with_context(|| format!("point {k}: no number `{key}`"));
        let (n, b, slaves) = (num("n")? as u64, num("b")? as u64, num("slaves")? as u64);
        let (measured, recorded) = (num("measured")?, num("predicted")?);
        anyhow::ensure!(measured > 0.0, "point {k}: measured {measured} s");
        let now = input.predict(n, b).with_context(|| format!("point {k}: predicting {} n={n} b={b}", input.app))?;
        out.push(Replayed { app: input.app, n, b, slaves, measured, recorded, now });
    }
    Ok((out, skipped))
}

fn read_rows(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not the JSON array `bench validate --json` writes", path.display()))
}

/// Replays every file's points, prints them beside their recorded
/// predictions, and the figures over all of them.
pub(crate) fn run(files: &[PathBuf]) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for path in files {
        let (points, skipped) = replay_points(&read_rows(path)?)?;
        println!("{}: {} points replayed, {skipped} without a model input (older file or failed job)", path.display(), points.len());
        println!(
            "{:<14} {:>6} {:>5} {:>2} {:>9} {:>10} {:>8} {:>10} {:>8}",
            "app", "n", "b", "s", "measured", "recorded", "error", "replayed", "error"
        );
        for p in &points {
            println!(
                "{:<14} {:>6} {:>5} {:>2} {:>8.2}s {:>9.2}s {:>+7.1}% {:>9.2}s {:>+7.1}%",
                p.app,
                p.n,
                p.b,
                p.slaves,
                p.measured,
                p.recorded,
                100.0 * p.recorded_err(),
                p.now,
                100.0 * p.err()
            );
        }
        all.extend(points);
    }
    anyhow::ensure!(!all.is_empty(), "no point to replay: the files hold no `model_input` (written before `validate` kept it)");
    let stats = |err: fn(&Replayed) -> f64| {
        let abs: Vec<f64> = all.iter().map(|p| err(p).abs()).collect();
        (within_target(&abs), mean(&abs), largest(&abs))
    };
    let (rw, rmean, rmax) = stats(Replayed::recorded_err);
    let (nw, nmean, nmax) = stats(Replayed::err);
    println!(
        "{} points: recorded {rw} within 10 %, mean |error| {:.2} %, largest {:.1} %; replayed {nw} within 10 %, mean {:.2} %, largest {:.1} %",
        all.len(),
        100.0 * rmean,
        100.0 * rmax,
        100.0 * nmean,
        100.0 * nmax
    );
    let extra = || vec![("points", json!(all.len())), ("files", json!(files.len()))];
    let fig = |name: &str, value: f64, unit: &str, target: Option<f64>| Figure { name, value, unit, target, extra: extra() }.print();
    fig("validate_replay_points_within_10pct", nw as f64, "points", Some(all.len() as f64));
    fig("validate_replay_mean_abs_error", 100.0 * nmean, "%", Some(10.0));
    fig("validate_replay_max_abs_error", 100.0 * nmax, "%", Some(10.0));
    fig("validate_recorded_points_within_10pct", rw as f64, "points", Some(all.len() as f64));
    fig("validate_recorded_mean_abs_error", 100.0 * rmean, "%", Some(10.0));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(app: App, n: u64, b: u64, s: u64, params: &Params, measured: f64) -> Value {
        let options = Options::implementation(s, 2);
        let predicted = predict(app, n, b, params, &options).unwrap().predicted;
        json!({"app": "x", "n": n, "b": b, "slaves": s, "measured": measured, "predicted": predicted, "ok": true,
               "model_input": ModelInput::new(app, params, &options)})
    }

    /// A point's model input survives its JSON: the same model replays the
    /// recorded prediction exactly, and a changed parameter file in it
    /// moves the replay, not the record.
    #[test]
    fn a_replay_reproduces_the_recorded_prediction_and_follows_the_model() {
        let params = Params::thesis_fast();
        let rows = vec![
            row(App::Cholesky(model::Variant::Dag), 1200, 300, 2, &params, 10.0),
            row(App::Lu { pivot: false }, 1200, 300, 1, &params, 10.0),
            row(App::Raytrace, 512, 8, 2, &params, 10.0),
        ];
        let text = serde_json::to_string(&rows).unwrap();
        let (points, skipped) = replay_points(&serde_json::from_str::<Vec<Value>>(&text).unwrap()).unwrap();
        assert_eq!((points.len(), skipped), (3, 0));
        for p in &points {
            assert_eq!(p.now, p.recorded, "{p:?}");
        }
        let mut slower = rows[0].clone();
        slower["model_input"]["params"]["multiply"]["bandwidth"] = json!(params.multiply.bandwidth / 2.0);
        let (again, _) = replay_points(&[slower]).unwrap();
        assert!(again[0].now > again[0].recorded * 1.05, "{:?}", again[0]);
    }

    /// The grid kept in the repository stays readable by this build (a
    /// renamed parameter or option would break every replay of it), and
    /// its every point predicts a plausible time: within a factor of two
    /// of its measured one.
    #[test]
    fn the_kept_grid_replays() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("grids/2026-11-27T0100-vm-epyc-2vcpu.json");
        let (points, skipped) = replay_points(&read_rows(&path).unwrap()).unwrap();
        assert_eq!((points.len(), skipped), (24, 0));
        for p in &points {
            assert!(p.now > 0.5 * p.measured && p.now < 2.0 * p.measured, "{p:?}");
        }
    }

    /// Points written before the model input was kept, and failed jobs,
    /// are counted apart; a damaged input is an error naming its point.
    #[test]
    fn old_points_are_skipped_and_damaged_ones_named() {
        let params = Params::thesis_fast();
        let old = json!({"app": "lu", "n": 1200, "b": 300, "slaves": 1, "measured": 1.0, "predicted": 1.0, "ok": true});
        let mut failed = row(App::Matmul, 1200, 300, 1, &params, 1.0);
        failed["ok"] = json!(false);
        let (points, skipped) = replay_points(&[old, failed, row(App::Matmul, 1200, 300, 1, &params, 1.0)]).unwrap();
        assert_eq!((points.len(), skipped), (1, 2));
        let mut damaged = row(App::Matmul, 1200, 300, 1, &params, 1.0);
        damaged["model_input"]["app"] = json!("no-such-app");
        let e = replay_points(&[json!({}), damaged]).map(|_| ()).unwrap_err();
        assert!(format!("{e:#}").contains("point 1"), "{e:#}");
    }
}
