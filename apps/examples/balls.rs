//! Renders the balls scene in one pass and writes a PNG:
//! `cargo run -p apps --release --example balls -- LEVEL WIDTH HEIGHT out.png [SAMPLES]`.

use apps::raytrace::{encode_png, render, RenderParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u32| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let params = RenderParams { level: num(0, 3), width: num(1, 512), height: num(2, 512), grain: 1, samples: num(4, 1) };
    let out = args.get(3).cloned().unwrap_or_else(|| "balls.png".into());
    let t = std::time::Instant::now();
    let rgb = render(&params)?;
    std::fs::write(&out, encode_png(params.width, params.height, &rgb)?)?;
    eprintln!("{out}: {:?} in {:.2?}", params, t.elapsed());
    Ok(())
}
