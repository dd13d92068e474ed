use super::*;
use crate::job::JobSpec;
use crate::mem::{run_plan, MemStore};

#[test]
fn tasks_equal_one_pass_byte_for_byte() {
    for grain in [1u32, 7, 64] {
        let params = RenderParams { level: 2, width: 48, height: 37, grain, samples: 1 + grain % 2 };
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
    let params = RenderParams { level: 3, width: 64, height: 64, grain: 8, samples: 1 };
    let img = render(&params).unwrap();
    let distinct: std::collections::HashSet<&[u8]> = img.chunks(3).collect();
    assert!(distinct.len() > 200, "{} colours", distinct.len());
    // Repeatable.
    assert_eq!(img, render(&params).unwrap());
    // Old descriptors without `samples` still decode (one ray per pixel).
    let old: RenderParams = serde_json::from_str(r#"{"level":1,"width":2,"height":2,"grain":1}"#).unwrap();
    assert_eq!(old.samples, 1);
    assert_eq!(n_spheres(3), 820);
    assert_eq!(scene::balls(3).nodes.len() as u64, n_spheres(3));
}

#[test]
fn bad_parameters_are_refused() {
    for p in [
        RenderParams { level: 1, width: 0, height: 10, grain: 1, samples: 1 },
        RenderParams { level: 1, width: 10, height: 10, grain: 0, samples: 1 },
        RenderParams { level: 9, width: 10, height: 10, grain: 1, samples: 1 },
        RenderParams { level: 1, width: 10, height: 10, grain: 1, samples: 0 },
    ] {
        assert!(matches!(p.check(), Err(PlanError::BadImage { .. })), "{p:?}");
    }
    let params = RenderParams { level: 1, width: 8, height: 8, grain: 4, samples: 1 };
    let spec = JobSpec::Raytrace { job: uuid::Uuid::new_v4(), name: "x".into(), params };
    let store = MemStore::new();
    let mut ctx = crate::mem::MemCtx::new(&store, spec.job());
    let t = job::encode_task(&GrainTask { first: 4, last: 8 });
    assert!(matches!(crate::job::run_task(&spec, &t, 0, &mut ctx), Err(TaskError::BadTask { .. })));
}

#[test]
fn rows_rendered_alone_are_those_rows_of_the_image() {
    let p = RenderParams { level: 2, width: 40, height: 30, grain: 30, samples: 2 };
    let whole = render(&p).unwrap();
    let row = 3 * p.width as usize;
    assert_eq!(render_rows(&p, 7, 12).unwrap(), whole[7 * row..13 * row]);
    assert!(render_rows(&p, 12, 7).is_err());
    assert!(render_rows(&p, 0, 30).is_err());
}
