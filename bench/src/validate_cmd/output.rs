//! What `bench validate` prints and plots: the table of points, each
//! prediction's parts, and the chart.

use std::path::PathBuf;

use super::*;

pub(super) fn print_table(points: &[Point]) {
    println!();
    println!(
        "{:<9} {:>5} {:>5} {:>2} {:>6} {:>9} {:>7} {:>6} {:>9} {:>19} {:>8} {:>9} {:>8} {:>6} {:>6} {:>6} {:>5} {:>7} {:>6} {:>8}",
        "app",
        "n",
        "b",
        "s",
        "tasks",
        "measured",
        "spread",
        "drift",
        "predicted",
        "band [lwr, upr]",
        "error",
        "thesis",
        "error",
        "store",
        "slaves",
        "other",
        "load",
        "kernels",
        "wait",
        "bound"
    );
    for p in points {
        println!(
            "{:<9} {:>5} {:>5} {:>2} {:>6} {:>8.2}s {:>6.1}% {:>5.1}% {:>8.2}s {:>19} {:>+7.1}% {:>8.2}s {:>+7.1}% {:>5.0}% {:>5.0}% {:>5.0}% {:>5.2} {:>7} {:>6} {:>8}{}",
            p.app,
            p.n,
            p.b,
            p.slaves,
            p.extended.volumes.n_tasks,
            p.measured,
            100.0 * p.spread(),
            100.0 * p.drift(),
            p.extended.predicted,
            format!("[{:.2}, {:.2}]", p.extended.t_s.lwr, p.extended.t_s.upr),
            100.0 * p.err(),
            p.thesis.predicted,
            100.0 * p.thesis_err(),
            100.0 * p.store_cpu,
            100.0 * p.slaves_cpu,
            100.0 * p.other_cpu,
            p.load,
            if p.times.kernels > 0.0 { format!("{:+.1}%", 100.0 * p.kernel_excess()) } else { "-".into() },
            if p.times.kernels > 0.0 { format!("{:.2}s", p.times.core_wait) } else { "-".into() },
            p.bound(),
            if p.ok { "" } else { "  FAILED" }
        );
    }
    println!("(measured: the fastest run; spread: how much slower the slowest run was; drift: how far apart the predictions from each timing of the rates alone lie (timed before each pass's runs and after the last), as a share of the slowest: how much the host's speed moved meanwhile; store, slaves: CPU used during the job as % of one core; other: CPU of everything else meanwhile (kernel threads such as kdamond, other processes, time the host took); load: 1-min load average before the job; kernels: how much longer the job's kernels took than the same kernels timed alone; wait: seconds its task threads were runnable but waited for a core; bound: `store` where the store's serialised time, across hosts its link's busier direction, is at least 85 % of the prediction, else `compute` (the kernels and the schedule))");
}

/// How far `predictions` lie apart, as a share of the largest (0 for
/// fewer than two): [`Point::drift`].
pub(super) fn drift(predictions: &[f64]) -> f64 {
    let hi = largest(predictions);
    let lo = predictions.iter().copied().fold(f64::INFINITY, f64::min);
    if predictions.len() < 2 || hi <= 0.0 {
        return 0.0;
    }
    (hi - lo) / hi
}

/// Where each point's time went, per slave: the fastest run's task
/// records against the prediction's parts (`model::parts`). They do not
/// match one to one: a read the model hides may still be waited for, and
/// a put a barrier waits for is a transfer to the model and "rest" here.
pub(super) fn print_parts(points: &[Point]) {
    println!();
    println!(
        "{:<9} {:>5} {:>2} | {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>8} {:>9} {:>8} | {:>15}",
        "app", "b", "s", "kernels", "blocks", "starts", "endings", "handoffs", "rest", "compute", "transfers", "tasks", "ending job/model"
    );
    for p in points.iter().filter(|p| p.times.kernels > 0.0) {
        let s = p.slaves.max(1) as f64;
        let (kernels, blocks, starts) = (p.times.kernels / s, p.times.block_wait / s, (p.times.start + p.times.small_wait) / s);
        let (endings, handoffs) = (p.times.settle / s, p.times.handoff / s);
        println!(
            "{:<9} {:>5} {:>2} | {:>7.2}s {:>7.2}s {:>7.2}s {:>7.2}s {:>7.2}s {:>7.2}s | {:>7.2}s {:>8.2}s {:>7.2}s | {:>15}",
            p.app,
            p.b,
            p.slaves,
            kernels,
            blocks,
            starts,
            endings,
            handoffs,
            p.measured - kernels - blocks - starts - endings - handoffs,
            p.parts.compute,
            p.parts.transfers,
            p.parts.task_costs,
            format!("{:.2}/{} ms", p.times.mean_ending() * 1e3, p.model_ending.map_or("-".to_owned(), |e| format!("{:.2}", e * 1e3)))
        );
    }
    println!("(per slave, seconds. Measured, from the fastest run's task records: time in kernels, waiting for block reads, from begin to dequeued plus small reads (a start behind the previous ending, a dag's counters, waits at barriers), once computed waiting for the previous task's ending (a slave keeps one in flight), handing each task to its compute thread and back, and the rest of the run. Model: the prediction with transfers free and no per-task costs (kernels, their slow-down, idle time in the schedule), what transfers add, what per-task costs and the job's latency add. Ending job/model: a task's ending (puts, record, commit, written behind) in the run, the mean over its records, and as the model prices it, ms)");
}

/// Registers a system TrueType font for plotters' text (it has none built
/// in with the `ab_glyph` backend).
fn register_font() -> anyhow::Result<()> {
    for path in [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ] {
        if let Ok(bytes) = std::fs::read(path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
                .map_err(|_| anyhow::anyhow!("{path} is not a usable font"))?;
            return Ok(());
        }
    }
    anyhow::bail!("no TrueType font found for the plot's text (install fonts-dejavu-core)")
}

/// One panel per application: x the block size (log), y seconds; for each
/// slave count the predicted band `[lwr{T_s}, upr{T_s}]` as a bar, the
/// prediction as a line, the measured time as a marker.
pub(super) fn plot(points: &[Point], path: &PathBuf) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_font()?;
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let root =
        root.titled("bench validate: measured (markers) on the predicted band (bars: lwr..upr T_s, line: prediction)", ("sans-serif", 22))?;
    let apps: Vec<&str> = ["matmul", "cholesky", "lu", "raytrace"].into_iter().filter(|a| points.iter().any(|p| p.app == *a)).collect();
    let panels = root.split_evenly((2, 2));
    let colours = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
    ];
    let counts = slave_counts(&points.iter().map(|p| p.slaves).collect::<Vec<_>>());
    for (panel, app) in panels.iter().zip(&apps) {
        let pts: Vec<&Point> = points.iter().filter(|p| p.app == *app).collect();
        let bmin = pts.iter().map(|p| p.b).min().unwrap_or(1) as f64;
        let bmax = pts.iter().map(|p| p.b).max().unwrap_or(2) as f64;
        let ymax = pts.iter().map(|p| p.measured.max(p.extended.t_s.upr).max(p.extended.predicted)).fold(0.0, f64::max) * 1.1;
        let n = pts.first().map_or(0, |p| p.n);
        let caption = if *app == "raytrace" { format!("raytrace, {n}x{n} image, b = rows per task") } else { format!("{app}, n = {n}") };
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((bmin / 1.5).log2()..(bmax * 1.5).log2(), 0.0..ymax.max(1e-3))?;
        // x is log2(b): a log axis whose labels show b itself.
        chart
            .configure_mesh()
            .x_labels(12)
            .x_label_formatter(&|x| format!("{:.0}", x.exp2()))
            .x_desc("block size b (log scale)")
            .y_desc("seconds")
            .draw()?;
        for (k, &s) in counts.iter().enumerate() {
            let colour = colours[k % colours.len()];
            let mut series: Vec<&&Point> = pts.iter().filter(|p| p.slaves == s).collect();
            series.sort_by_key(|p| p.b);
            // Slaves side by side around each b so the bands do not overlap.
            let offset = if counts.len() > 1 { 0.3 * (k as f64 / (counts.len() - 1) as f64 - 0.5) } else { 0.0 };
            chart.draw_series(series.iter().map(|p| {
                let x = (p.b as f64).log2() + offset;
                Rectangle::new([(x - 0.04, p.extended.t_s.lwr), (x + 0.04, p.extended.t_s.upr)], colour.mix(0.25).filled())
            }))?;
            chart
                .draw_series(LineSeries::new(
                    series.iter().map(|p| ((p.b as f64).log2() + offset, p.extended.predicted)),
                    colour.stroke_width(2),
                ))?
                .label(format!("s = {s}: predicted"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
            chart
                .draw_series(series.iter().map(|p| Circle::new(((p.b as f64).log2() + offset, p.measured), 6, colour.filled())))?
                .label(format!("s = {s}: measured"))
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, colour.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
