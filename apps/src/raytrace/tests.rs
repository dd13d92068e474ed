use super::*;
use crate::job::JobSpec;
use crate::mem::{run_plan, MemStore};

#[test]
fn tasks_equal_one_pass_byte_for_byte() {
    for grain in [1u32, 7, 64] {
        let params = RenderParams { level: 2, width: 48, height: 37, grain };
        let spec = JobSpec::Raytrace { job: uuid::Uuid::new_v4(), name: "img".into(), params: params.clone() };
        let pl = crate::job::plan(&spec).unwrap();
        assert_eq!(pl.bags[0].tasks.len(), params.height.div_ceil(grain) as usize);
        let mut store = MemStore::new();
        // Run the bag backwards: order must not matter.
        let mut rev = pl.clone();
        rev.bags[0].tasks.reverse();
        run_plan(&mut store, &spec, &rev).unwrap();
        let img = assemble(&mut store, spec.job(), &params).unwrap();
        assert_eq!(img, render(&params).unwrap(), "grain={grain}");
        let png = encode_png(params.width, params.height, &img).unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }
}

#[test]
fn the_image_is_not_trivial() {
    let params = RenderParams { level: 3, width: 64, height: 64, grain: 8 };
    let img = render(&params).unwrap();
    let distinct: std::collections::HashSet<&[u8]> = img.chunks(3).collect();
    assert!(distinct.len() > 200, "{} colours", distinct.len());
    // Repeatable.
    assert_eq!(img, render(&params).unwrap());
    assert_eq!(n_spheres(3), 820);
    assert_eq!(scene::balls(3).nodes.len() as u64, n_spheres(3));
}

#[test]
fn bad_parameters_are_refused() {
    for p in [
        RenderParams { level: 1, width: 0, height: 10, grain: 1 },
        RenderParams { level: 1, width: 10, height: 10, grain: 0 },
        RenderParams { level: 9, width: 10, height: 10, grain: 1 },
    ] {
        assert!(matches!(p.check(), Err(PlanError::BadImage { .. })), "{p:?}");
    }
    let params = RenderParams { level: 1, width: 8, height: 8, grain: 4 };
    let spec = JobSpec::Raytrace { job: uuid::Uuid::new_v4(), name: "x".into(), params };
    let store = MemStore::new();
    let mut ctx = crate::mem::MemCtx::new(&store, spec.job());
    let t = job::encode_task(&GrainTask { first: 4, last: 8 });
    assert!(matches!(crate::job::run_task(&spec, &t, 0, &mut ctx), Err(TaskError::BadTask { .. })));
}
