//! `master matrix …`: create (generated block by block), import/export
//! `.npy` streaming block by block, list, info, rm.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use apps::generate::{generate_block, MatrixKind};
use futures::StreamExt;
use store_client::{BlockData, Client, MatrixInfo};

use crate::npy;
use crate::source::meta;
use crate::store_args::StoreArgs;

#[derive(clap::Subcommand)]
pub(crate) enum Command {
    /// Create a matrix generated block by block inside the store.
    Create {
        name: String,
        /// Rows (and columns unless --cols is given).
        #[arg(long)]
        n: u64,
        /// Columns (default: n).
        #[arg(long)]
        cols: Option<u64>,
        /// Block size b: blocks are b×b doubles (edge blocks smaller).
        #[arg(long)]
        block: u32,
        /// random | spd (symmetric positive definite) | diag-dominant.
        #[arg(long, default_value = "random")]
        kind: String,
        /// Seed: the same seed gives the same matrix, block for block.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Import a 2-D float64 .npy file, block by block.
    Import {
        name: String,
        file: PathBuf,
        #[arg(long)]
        block: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Export a matrix to a .npy file (Fortran order), block by block. NAME.perm
    /// (no matrix of that name) exports the row permutation of the pivoted LU
    /// job that wrote NAME: int64 `perm` with P·A = A[perm].
    Export {
        name: String,
        file: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List matrices.
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show a matrix's record.
    Info {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete a matrix and its blocks.
    Rm {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

pub(crate) async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Create { name, n, cols, block, kind, seed, store } => {
            let kind: MatrixKind = kind.parse().map_err(|e| anyhow::anyhow!("--kind: {e}"))?;
            let client = store.connect().await?;
            let m = create(&client, &name, n, cols.unwrap_or(n), block, kind, seed, true).await?;
            println!("{}", m.id);
        }
        Command::Import { name, file, block, store } => {
            let client = store.connect().await?;
            let m = import(&client, &name, &file, block).await?;
            println!("{}", m.id);
        }
        Command::Export { name, file, store } => {
            let client = store.connect().await?;
            match name.strip_suffix(".perm") {
                Some(lu) if client.matrix_by_name(&name).await.is_err() => export_perm(&client, lu, &file).await?,
                _ => {
                    let m = client.matrix_by_name(&name).await?;
                    export(&client, &m, &file).await?;
                }
            }
        }
        Command::List { store } => {
            let client = store.connect().await?;
            println!("{:<24} {:>10} {:>10} {:>6}  id", "name", "rows", "cols", "block");
            for m in client.list_matrices().await? {
                println!("{:<24} {:>10} {:>10} {:>6}  {}", m.name, m.n_rows, m.n_cols, m.block, m.id);
            }
        }
        Command::Info { name, store } => {
            let client = store.connect().await?;
            let m = client.matrix_by_name(&name).await?;
            let mm = meta(&m);
            println!(
                "name      {}\nid        {}\nshape     {} x {}\nblock     {} ({} x {} blocks)\nbytes     {}",
                m.name,
                m.id,
                m.n_rows,
                m.n_cols,
                m.block,
                mm.block_rows(),
                mm.block_cols(),
                m.n_rows * m.n_cols * 8
            );
        }
        Command::Rm { name, store } => {
            let client = store.connect().await?;
            let m = client.matrix_by_name(&name).await?;
            client.delete_matrix(m.id).await?;
        }
    }
    Ok(())
}

/// Blocks in flight at once while creating or importing: enough to keep
/// the node and the generator busy, few enough to bound memory.
const IN_FLIGHT: usize = 3;

/// Creates and generates a matrix; deletes it again if anything fails, so
/// nothing is ever half-created.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn create(
    client: &Client,
    name: &str,
    rows: u64,
    cols: u64,
    block: u32,
    kind: MatrixKind,
    seed: u64,
    progress: bool,
) -> anyhow::Result<MatrixInfo> {
    if kind == MatrixKind::Spd && rows != cols {
        bail!("an spd matrix must be square, not {rows}x{cols}");
    }
    let m = client.create_matrix(name, rows, cols, block).await?;
    let mm = Arc::new(meta(&m));
    let bar = crate::progress::bar(progress, (mm.block_rows() * mm.block_cols()) as u64, "generating blocks");
    let ids = mm.blocks().map(|b| (b.i, b.j)).collect();
    let result = fill(client, &mm, ids, &bar, move |mm, i, j| Ok(generate_block(kind, seed, mm, i, j))).await;
    bar.finish_and_clear();
    if let Err(e) = result {
        let _ = client.delete_matrix(m.id).await;
        return Err(e.context(format!("creating matrix {name:?} (removed again)")));
    }
    Ok(m)
}

/// Writes blocks `ids` of `mm`, each in its own committed action.
pub(crate) async fn fill(
    client: &Client,
    mm: &Arc<apps::block::MatrixMeta>,
    ids: Vec<(u32, u32)>,
    bar: &indicatif::ProgressBar,
    make: impl Fn(&apps::block::MatrixMeta, u32, u32) -> anyhow::Result<apps::block::Block> + Send + Sync + Clone + 'static,
) -> anyhow::Result<()> {
    let session = client.open_session("master").await?;
    let mut puts = futures::stream::iter(ids)
        .map(|(i, j)| {
            let (session, mm, make) = (session.clone(), mm.clone(), make.clone());
            async move {
                let matrix = mm.id.0;
                let b = tokio::task::spawn_blocking(move || make(&mm, i, j)).await??;
                let a = session.begin().await?;
                a.put_block(matrix, i, j, BlockData { rows: b.rows, cols: b.cols, data: b.data }).await?;
                a.commit().await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(IN_FLIGHT);
    while let Some(r) = puts.next().await {
        r?;
        bar.inc(1);
    }
    Ok(())
}

pub(crate) async fn import(client: &Client, name: &str, file: &PathBuf, block: u32) -> anyhow::Result<MatrixInfo> {
    let mut f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let layout = npy::read_header(&mut f).with_context(|| format!("reading {}", file.display()))?;
    let m = client.create_matrix(name, layout.rows, layout.cols, block).await?;
    let mm = Arc::new(meta(&m));
    let f = Arc::new(f);
    let bar = crate::progress::bar(true, (mm.block_rows() * mm.block_cols()) as u64, "importing blocks");
    let ids = mm.blocks().map(|b| (b.i, b.j)).collect();
    let result = fill(client, &mm, ids, &bar, move |mm, i, j| {
        let (rows, cols) = mm.block_shape(i, j);
        let (r0, c0) = (mm.row_offset(i), mm.col_offset(j));
        let mut b = apps::block::Block::zeros(rows, cols);
        let f64s = |buf: &[u8]| buf.chunks_exact(8).map(|x| f64::from_le_bytes(x.try_into().expect("8 bytes"))).collect::<Vec<_>>();
        if layout.fortran {
            // A block column is one contiguous read.
            let mut buf = vec![0u8; rows * 8];
            for c in 0..cols {
                f.read_exact_at(&mut buf, layout.offset(r0, c0 + c as u64))?;
                b.data[c * rows..(c + 1) * rows].copy_from_slice(&f64s(&buf));
            }
        } else {
            let mut buf = vec![0u8; cols * 8];
            for r in 0..rows {
                f.read_exact_at(&mut buf, layout.offset(r0 + r as u64, c0))?;
                for (c, x) in f64s(&buf).into_iter().enumerate() {
                    b.set(r, c, x);
                }
            }
        }
        Ok(b)
    })
    .await;
    bar.finish_and_clear();
    if let Err(e) = result {
        let _ = client.delete_matrix(m.id).await;
        return Err(e.context(format!("importing {} (matrix removed again)", file.display())));
    }
    Ok(m)
}

/// `master matrix export LU.perm FILE`: the row permutation of the latest
/// pivoted LU job that wrote `LU`, as a 1-D int64 array `perm` with
/// `P·A = A[perm]` (row `r` of `P·A` is row `perm[r]` of A).
async fn export_perm(client: &Client, lu_name: &str, file: &PathBuf) -> anyhow::Result<()> {
    let job = crate::jobs::all_jobs(client)
        .await?
        .into_iter()
        .rev()
        .find(|j| matches!(&j.spec, apps::job::JobSpec::Lu { lu, pivot: true, .. } if lu.name == lu_name))
        .with_context(|| format!("no matrix {lu_name:?}.perm and no pivoted LU job wrote {lu_name:?}"))?;
    let apps::job::JobSpec::Lu { job: id, lu, .. } = job.spec else { unreachable!("matched above") };
    let perm = crate::source::with_source(client, move |src| apps::lu::permutation(src, id, &lu)).await??;
    let mut bytes = Vec::with_capacity(perm.len() * 8 + 128);
    npy::write_i64_vector_header(&mut bytes, perm.len() as u64);
    for r in perm {
        bytes.extend_from_slice(&(r as i64).to_le_bytes());
    }
    std::fs::write(file, bytes).with_context(|| format!("writing {}", file.display()))?;
    Ok(())
}

pub(crate) async fn export(client: &Client, m: &MatrixInfo, file: &PathBuf) -> anyhow::Result<()> {
    let tmp = file.with_extension("npy.partial");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let layout = npy::write_header(&mut f, m.n_rows, m.n_cols)?;
    f.set_len(layout.data_offset + m.n_rows * m.n_cols * 8)?;
    let mm = meta(m);
    let bar = crate::progress::bar(true, (mm.block_rows() * mm.block_cols()) as u64, "exporting blocks");
    // Blocks in batches of at most 8 MiB: on the node's machine a batch
    // takes one round trip (`read_blocks_committed`).
    let per_batch = ((8usize << 20) / (m.block as usize * m.block as usize * 8)).clamp(1, 64);
    let ids: Vec<(u32, u32)> = mm.blocks().map(|id| (id.i, id.j)).collect();
    for batch in ids.chunks(per_batch) {
        for (&(i, j), b) in batch.iter().zip(client.read_blocks_committed(m.id, batch).await?) {
            let (r0, c0) = (mm.row_offset(i), mm.col_offset(j));
            for c in 0..b.cols {
                // A block column is contiguous in a Fortran-order file.
                let col: Vec<u8> = b.data[c * b.rows..(c + 1) * b.rows].iter().flat_map(|x| x.to_le_bytes()).collect();
                f.write_all_at(&col, layout.offset(r0, c0 + c as u64))?;
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    f.sync_all()?;
    std::fs::rename(&tmp, file)?;
    Ok(())
}
