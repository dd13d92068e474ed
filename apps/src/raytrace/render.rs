//! Whitted-style shading: ambient + per-light diffuse and Phong specular
//! with shadow rays, plus mirror reflection up to [`MAX_DEPTH`] bounces.
//! One ray per pixel centre, no randomness, no threads.

use super::scene::{Material, Scene};
use super::vec3::V3;

/// Reflection bounces.
pub(crate) const MAX_DEPTH: u32 = 4;
const EPS: f64 = 1e-7;

struct Hit {
    t: f64,
    point: V3,
    normal: V3,
    material: Material,
}

// Smallest t > EPS where the ray meets the sphere, if below tmax.
fn sphere_t(o: V3, d: V3, c: V3, r: f64, tmax: f64) -> Option<f64> {
    let oc = o - c;
    let b = oc.dot(d);
    let cc = oc.dot(oc) - r * r;
    let disc = b * b - cc;
    if disc < 0.0 {
        return None;
    }
    let s = disc.sqrt();
    let t0 = -b - s;
    if t0 > EPS && t0 < tmax {
        return Some(t0);
    }
    let t1 = -b + s;
    (t1 > EPS && t1 < tmax).then_some(t1)
}

// Whether the ray can reach the bounding sphere before tmax.
fn bound_hit(o: V3, d: V3, c: V3, r: f64, tmax: f64) -> bool {
    let oc = o - c;
    let cc = oc.dot(oc) - r * r;
    if cc <= 0.0 {
        return true; // origin inside the bound
    }
    let b = oc.dot(d);
    if b > 0.0 {
        return false; // pointing away
    }
    let disc = b * b - cc;
    disc >= 0.0 && -b - disc.sqrt() < tmax
}

/// The nodes a traversal has still to visit, on the stack frame: a heap
/// vector per ray cost a malloc and its growth for every ray, and two
/// render threads in one process ran 3-4 times slower than one.
struct NodeStack {
    nodes: [u32; NodeStack::CAPACITY],
    len: usize,
}

impl NodeStack {
    /// Depth-first over a tree of fan-out 9 and depth `MAX_LEVEL` keeps at
    /// most 8 siblings pending per level on the path, plus 9 children: 49.
    const CAPACITY: usize = 9 * (super::MAX_LEVEL as usize + 1) + 1;

    fn root() -> NodeStack {
        NodeStack { nodes: [0; NodeStack::CAPACITY], len: 1 }
    }

    fn pop(&mut self) -> Option<u32> {
        self.len = self.len.checked_sub(1)?;
        Some(self.nodes[self.len])
    }

    fn push_all(&mut self, children: std::ops::Range<u32>) {
        for c in children {
            self.nodes[self.len] = c;
            self.len += 1;
        }
    }
}

impl Scene {
    // Closest hit among spheres (hierarchy) and floor. `d` is unit length.
    fn trace(&self, o: V3, d: V3) -> Option<Hit> {
        let mut best_t = f64::INFINITY;
        let mut best: Option<(usize, f64)> = None;
        let mut stack = NodeStack::root();
        while let Some(n) = stack.pop() {
            let node = &self.nodes[n as usize];
            if !bound_hit(o, d, node.center, node.bound, best_t) {
                continue;
            }
            if let Some(t) = sphere_t(o, d, node.center, node.radius, best_t) {
                best_t = t;
                best = Some((n as usize, t));
            }
            stack.push_all(node.children.clone());
        }
        let mut hit = best.map(|(n, t)| {
            let node = &self.nodes[n];
            let p = o + d * t;
            Hit { t, point: p, normal: (p - node.center) * (1.0 / node.radius), material: node.material }
        });
        if d.1 < 0.0 {
            let t = (self.floor_y - o.1) / d.1;
            if t > EPS && t < hit.as_ref().map_or(f64::INFINITY, |h| h.t) {
                let p = o + d * t;
                // Checkerboard from integer parts: exact and deterministic.
                let check = ((p.0 * 2.0).floor() as i64 + (p.2 * 2.0).floor() as i64).rem_euclid(2) == 0;
                let color = if check { V3(0.85, 0.85, 0.82) } else { V3(0.25, 0.27, 0.30) };
                hit = Some(Hit {
                    t,
                    point: p,
                    normal: V3(0.0, 1.0, 0.0),
                    material: Material { color, kd: 0.8, ks: 0.1, shininess: 8, reflect: 0.15 },
                });
            }
        }
        hit
    }

    // Whether anything lies between `o` and distance `dist` along `d`.
    fn occluded(&self, o: V3, d: V3, dist: f64) -> bool {
        let mut stack = NodeStack::root();
        while let Some(n) = stack.pop() {
            let node = &self.nodes[n as usize];
            if !bound_hit(o, d, node.center, node.bound, dist) {
                continue;
            }
            if sphere_t(o, d, node.center, node.radius, dist).is_some() {
                return true;
            }
            stack.push_all(node.children.clone());
        }
        false
    }

    fn background(&self, d: V3) -> V3 {
        let t = 0.5 * (d.1 + 1.0);
        V3(0.55, 0.65, 0.85) * t + V3(0.95, 0.95, 0.98) * (1.0 - t)
    }

    pub(crate) fn shade(&self, o: V3, d: V3, depth: u32) -> V3 {
        let Some(h) = self.trace(o, d) else {
            return self.background(d);
        };
        let m = h.material;
        let n = if h.normal.dot(d) > 0.0 { -h.normal } else { h.normal };
        let p = h.point + n * 1e-6;
        let mut c = m.color * self.ambient;
        let refl_dir = d - n * (2.0 * d.dot(n));
        for l in &self.lights {
            let to = l.pos - p;
            let dist = to.len();
            let ld = to * (1.0 / dist);
            let ndl = n.dot(ld);
            if ndl <= 0.0 || self.occluded(p, ld, dist) {
                continue;
            }
            c = c + m.color * (m.kd * ndl * l.intensity);
            let s = refl_dir.dot(ld);
            if s > 0.0 {
                c = c + V3(1.0, 1.0, 1.0) * (m.ks * ipow(s, m.shininess) * l.intensity);
            }
        }
        if depth < MAX_DEPTH && m.reflect > 0.0 {
            let r = self.shade(p, refl_dir, depth + 1);
            c = c * (1.0 - m.reflect) + r.mul_elem(m.color) * m.reflect;
        }
        c
    }

    /// Renders scanlines `first..=last` of a `width × height` image as RGB8.
    /// Each pixel averages `samples²` rays on a regular sub-pixel grid,
    /// summed in a fixed order.
    pub(crate) fn render_rows(&self, width: u32, height: u32, samples: u32, first: u32, last: u32) -> Vec<u8> {
        let fwd = (self.look_at - self.eye).norm();
        let right = fwd.cross(V3(0.0, 1.0, 0.0)).norm();
        let up = right.cross(fwd);
        let half = (self.fov_deg.to_radians() * 0.5).tan();
        let aspect = f64::from(width) / f64::from(height);
        let mut out = Vec::with_capacity((last - first + 1) as usize * width as usize * 3);
        let s = samples.max(1);
        let inv = 1.0 / f64::from(s * s);
        for y in first..=last {
            for x in 0..width {
                let mut c = V3(0.0, 0.0, 0.0);
                for j in 0..s {
                    let fy = f64::from(y) + (f64::from(j) + 0.5) / f64::from(s);
                    let sy = (1.0 - 2.0 * fy / f64::from(height)) * half;
                    for i in 0..s {
                        let fx = f64::from(x) + (f64::from(i) + 0.5) / f64::from(s);
                        let sx = (2.0 * fx / f64::from(width) - 1.0) * half * aspect;
                        let d = (fwd + right * sx + up * sy).norm();
                        c = c + self.shade(self.eye, d, 0);
                    }
                }
                let c = c * inv;
                for v in [c.0, c.1, c.2] {
                    out.push((v.clamp(0.0, 1.0) * 255.0 + 0.5) as u8);
                }
            }
        }
        out
    }
}

// x^k by squaring: plain multiplications, identical bits everywhere.
fn ipow(x: f64, mut k: u32) -> f64 {
    let (mut base, mut acc) = (x, 1.0);
    while k > 0 {
        if k & 1 == 1 {
            acc *= base;
        }
        base *= base;
        k >>= 1;
    }
    acc
}
