//! Scene: the "balls" sphereflake (rayshade's test scene, as the source
//! used) on a checkered floor, with a bounding-sphere hierarchy so a ray
//! visits O(log) spheres instead of all `(9^(L+1) − 1)/8`.

use super::vec3::V3;

/// Surface properties.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Material {
    pub(crate) color: V3,
    pub(crate) kd: f64,
    pub(crate) ks: f64,
    /// Integer Phong exponent (integer so the power is plain multiplication).
    pub(crate) shininess: u32,
    pub(crate) reflect: f64,
}

/// A sphere of the flake with the bound of its whole subtree.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) center: V3,
    pub(crate) radius: f64,
    /// Radius of a sphere around `center` that holds the node and all its descendants.
    pub(crate) bound: f64,
    pub(crate) children: std::ops::Range<u32>,
    pub(crate) material: Material,
}

/// A point light.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Light {
    pub(crate) pos: V3,
    pub(crate) intensity: f64,
}

/// Everything the renderer needs.
#[derive(Clone, Debug)]
pub(crate) struct Scene {
    pub(crate) nodes: Vec<Node>,
    pub(crate) floor_y: f64,
    pub(crate) lights: Vec<Light>,
    pub(crate) ambient: f64,
    pub(crate) eye: V3,
    pub(crate) look_at: V3,
    pub(crate) fov_deg: f64,
}

const PALETTE: [V3; 5] = [V3(0.85, 0.75, 0.45), V3(0.75, 0.30, 0.25), V3(0.30, 0.55, 0.80), V3(0.40, 0.75, 0.40), V3(0.80, 0.80, 0.80)];

fn material(depth: u32) -> Material {
    Material { color: PALETTE[depth as usize % PALETTE.len()], kd: 0.65, ks: 0.45, shininess: 32, reflect: 0.3 }
}

/// Orthonormal frame around `w`.
fn frame(w: V3) -> (V3, V3) {
    let a = if w.1.abs() > 0.9 { V3(1.0, 0.0, 0.0) } else { V3(0.0, 1.0, 0.0) };
    let u = w.cross(a).norm();
    let v = w.cross(u);
    (u, v)
}

/// Directions of the nine children around axis `w`: six on the equator,
/// three at 60° elevation in between (Haines' sphereflake layout).
fn child_dirs(w: V3) -> [V3; 9] {
    let (u, v) = frame(w);
    let mut out = [V3(0.0, 0.0, 0.0); 9];
    for (k, o) in out.iter_mut().enumerate().take(6) {
        let th = (k as f64) * std::f64::consts::PI / 3.0;
        *o = u * th.cos() + v * th.sin();
    }
    let (ce, se) = (0.5, 3f64.sqrt() / 2.0);
    for k in 0..3 {
        let th = std::f64::consts::PI / 6.0 + (k as f64) * 2.0 * std::f64::consts::PI / 3.0;
        out[6 + k] = (u * th.cos() + v * th.sin()) * ce + w * se;
    }
    out
}

/// The balls scene at recursion `level` (0: one sphere).
pub(crate) fn balls(level: u32) -> Scene {
    let mut nodes = Vec::new();
    // Breadth-first so each node's children are contiguous.
    nodes.push(Node { center: V3(0.0, 0.0, 0.0), radius: 1.0, bound: 0.0, children: 0..0, material: material(0) });
    let mut axes = vec![V3(0.0, 1.0, 0.0)];
    let mut frontier = 0..1usize;
    for depth in 1..=level {
        let start = nodes.len();
        for n in frontier.clone() {
            let (c, r, w) = (nodes[n].center, nodes[n].radius, axes[n]);
            let first = nodes.len() as u32;
            for d in child_dirs(w) {
                let cr = r / 3.0;
                nodes.push(Node { center: c + d * (r + cr), radius: cr, bound: 0.0, children: 0..0, material: material(depth) });
                axes.push(d);
            }
            nodes[n].children = first..nodes.len() as u32;
        }
        frontier = start..nodes.len();
    }
    // Bounds bottom-up: children come after their parent.
    for n in (0..nodes.len()).rev() {
        let mut b = nodes[n].radius;
        for c in nodes[n].children.clone() {
            let ch = &nodes[c as usize];
            b = b.max((ch.center - nodes[n].center).len() + ch.bound);
        }
        // Slack so rounding can never cull a true hit.
        nodes[n].bound = b * (1.0 + 1e-9);
    }
    Scene {
        nodes,
        floor_y: -1.0,
        lights: vec![Light { pos: V3(4.0, 6.0, 5.0), intensity: 0.75 }, Light { pos: V3(-5.0, 4.0, 2.0), intensity: 0.35 }],
        ambient: 0.12,
        eye: V3(3.4, 2.3, 4.7),
        look_at: V3(0.0, 0.2, 0.0),
        fov_deg: 40.0,
    }
}

/// Number of spheres at `level`: `(9^(L+1) − 1) / 8`.
pub fn n_spheres(level: u32) -> u64 {
    (9u64.pow(level + 1) - 1) / 8
}
