//! `master matrix …`: create (generated block by block), import/export
//! `.npy` streaming block by block, list, info, rm.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use apps::generate::{generate_block, MatrixKind};
use futures::StreamExt;
use store_client::{BlockData, Client, MatrixInfo};

use crate::choices::Kind;
use crate::npy;
use crate::out::outln;
use crate::source::meta;
use crate::store_args::StoreArgs;

#[derive(clap::Subcommand)]
pub(crate) enum Command {
    /// Create a matrix generated block by block inside the store.
    Create {
        /// Name of the new matrix (unique in the store).
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
        /// What the values are.
        #[arg(long, value_enum, default_value_t = Kind::Random)]
        kind: Kind,
        /// Seed: the same seed gives the same matrix, block for block.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        said: Said,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Import a 2-D float64 .npy file, block by block.
    Import {
        /// Name of the new matrix (unique in the store).
        name: String,
        /// The .npy file: a 2-D float64 array, C or Fortran order, finite values.
        file: PathBuf,
        /// Block size b: blocks are b×b doubles (edge blocks smaller).
        #[arg(long)]
        block: u32,
        #[command(flatten)]
        said: Said,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Export a matrix to a .npy file (Fortran order), block by block. NAME.perm
    /// (no matrix of that name) exports the row permutation of the pivoted LU
    /// job that wrote NAME: int64 `perm` with P·A = A[perm].
    Export {
        /// Name of the matrix (or NAME.perm, see above).
        name: String,
        /// The .npy file to write (replaced if it exists; written to FILE.npy.partial first).
        file: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List matrices, each with its state: complete, or incomplete and why
    /// (being made, or the output of a job that has not succeeded).
    List {
        /// One JSON array of matrix objects on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show a matrix's record and state.
    Info {
        /// The matrix's name.
        name: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete a matrix and its blocks. Refused while a running job reads
    /// or writes it.
    Rm {
        /// The matrix's name.
        name: String,
        /// Delete it even though a running job reads or writes it (the job
        /// then fails).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

pub(crate) async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Create { name, n, cols, block, kind, seed, said, store } => {
            let kind: MatrixKind = kind.into();
            let client = store.connect().await?;
            let m = create(&client, &name, n, cols.unwrap_or(n), block, kind, seed, true).await?;
            said.made(&m, "created", "");
        }
        Command::Import { name, file, block, said, store } => {
            let client = store.connect().await?;
            let m = import(&client, &name, &file, block).await?;
            said.made(&m, "imported", &format!(" from {}", file.display()));
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
        Command::List { json, store } => {
            let client = store.connect().await?;
            let incomplete = incomplete_all(&client).await?;
            if json {
                let all: Vec<_> =
                    client.list_matrices().await?.iter().map(|m| matrix_json(m, incomplete.get(&m.id).map(String::as_str))).collect();
                outln!("{}", serde_json::Value::Array(all));
                return Ok(());
            }
            outln!("{:<24} {:>10} {:>10} {:>6}  {:<36}  state", "name", "rows", "cols", "block", "id");
            for m in client.list_matrices().await? {
                let state = incomplete.get(&m.id).map_or("complete".to_owned(), |why| format!("incomplete: {why}"));
                outln!("{:<24} {:>10} {:>10} {:>6}  {}  {state}", m.name, m.n_rows, m.n_cols, m.block, m.id);
            }
        }
        Command::Info { name, json, store } => {
            let client = store.connect().await?;
            let m = client.matrix_by_name(&name).await?;
            let mm = meta(&m);
            let why = incomplete_all(&client).await?.remove(&m.id);
            if json {
                outln!("{}", matrix_json(&m, why.as_deref()));
                return Ok(());
            }
            let state = why.map_or("complete".to_owned(), |why| format!("incomplete: {why}"));
            outln!(
                "name      {}\nid        {}\nshape     {} x {}\nblock     {} ({} x {} blocks)\nbytes     {}\nstate     {state}",
                m.name,
                m.id,
                m.n_rows,
                m.n_cols,
                m.block,
                mm.block_rows(),
                mm.block_cols(),
                bytes_of(&m)
            );
        }
        Command::Rm { name, force, store } => {
            let client = store.connect().await?;
            remove(&client, &name, force).await?;
        }
    }
    Ok(())
}

/// Deletes matrix `name`, unless a running job reads or writes it and
/// not `force`.
pub(crate) async fn remove(client: &Client, name: &str, force: bool) -> anyhow::Result<()> {
    let m = client.matrix_by_name(name).await?;
    if !force {
        crate::control::check_not_in_use(client, m.id, name).await?;
    }
    client.delete_matrix(m.id).await?;
    set_small(client, &incomplete_key(m.id), None).await
}

/// Why each incomplete matrix is: being made or killed while made, or
/// written by a job that has not succeeded.
pub(crate) async fn incomplete_all(client: &Client) -> anyhow::Result<std::collections::HashMap<uuid::Uuid, String>> {
    let mut all = crate::control::unfinished_outputs(client).await?;
    all.extend(incomplete(client).await?);
    Ok(all)
}

/// How a new matrix is announced on stdout.
#[derive(clap::Args, Clone, Copy, Debug)]
pub(crate) struct Said {
    /// Print the matrix's id alone (for scripts).
    #[arg(long, conflicts_with = "json")]
    quiet: bool,
    /// Print the matrix's record as one JSON object.
    #[arg(long)]
    json: bool,
}

impl Said {
    /// "created matrix A (16384 × 16384, blocks of 2048): <uuid>".
    fn made(self, m: &MatrixInfo, verb: &str, from: &str) {
        if self.json {
            outln!("{}", matrix_json(m, None));
        } else if self.quiet {
            outln!("{}", m.id);
        } else {
            outln!("{verb} matrix {} ({} × {}, blocks of {}){from}: {}", m.name, m.n_rows, m.n_cols, m.block, m.id);
        }
    }
}

/// A matrix as JSON for `--json`: its record, size, and whether it is
/// whole (`incomplete`: why not, or null).
pub(crate) fn matrix_json(m: &MatrixInfo, incomplete: Option<&str>) -> serde_json::Value {
    let mm = meta(m);
    serde_json::json!({
        "name": m.name,
        "id": m.id.to_string(),
        "rows": m.n_rows,
        "cols": m.n_cols,
        "block": m.block,
        "block_rows": mm.block_rows(),
        "block_cols": mm.block_cols(),
        "bytes": u64::try_from(bytes_of(m)).ok(),
        "complete": incomplete.is_none(),
        "incomplete": incomplete,
    })
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
    check_size(name, rows, cols, block)?;
    let m = create_record(client, name, rows, cols, block).await?;
    let mm = Arc::new(meta(&m));
    let bar = crate::progress::bar(progress, n_blocks(&mm), "generating blocks");
    let result =
        fill_new(client, &m, fill(client, &mm, all_blocks(&mm), &bar, move |mm, i, j| Ok(generate_block(kind, seed, mm, i, j)))).await;
    bar.finish_and_clear();
    result.with_context(|| format!("creating matrix {name:?} (removed again)"))?;
    Ok(m)
}

/// Why a `.npy` file's values cannot be imported.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImportError {
    /// No job computes anything meaningful from NaN or ±Inf (a Cholesky
    /// or LU of them may even end "succeeded"): refused at the door.
    #[error("element ({row}, {col}) is {value}, in block ({i}, {j}): only finite values can be imported")]
    NonFinite { i: u32, j: u32, row: u64, col: u64, value: f64 },
}

/// The node's record of a new matrix. A matrix larger than the disk's
/// free space is `StorageFull`, whose own text says the disk is full: the
/// node's explanation (what it needs, what is free) says it better.
async fn create_record(client: &Client, name: &str, rows: u64, cols: u64, block: u32) -> anyhow::Result<MatrixInfo> {
    client.create_matrix(name, rows, cols, block).await.map_err(|e| match e {
        store_client::StoreError::StorageFull { what } => anyhow::anyhow!("{what}"),
        e => e.into(),
    })
}

/// Why a matrix cannot be made, found before anything is written (the
/// store node checks again, and against its free disk space).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SizeError {
    #[error("matrix {name:?}: rows, columns and --block must be at least 1 (got {rows}x{cols}, block {block})")]
    Empty { name: String, rows: u64, cols: u64, block: u32 },
    #[error("matrix {name:?}: {rows}x{cols} doubles would be more than 2^64 bytes")]
    Overflow { name: String, rows: u64, cols: u64 },
}

/// Checks a new matrix's sizes with checked arithmetic; its bytes.
pub(crate) fn check_size(name: &str, rows: u64, cols: u64, block: u32) -> Result<u64, SizeError> {
    if rows == 0 || cols == 0 || block == 0 {
        return Err(SizeError::Empty { name: name.to_owned(), rows, cols, block });
    }
    rows.checked_mul(cols).and_then(|n| n.checked_mul(8)).ok_or_else(|| SizeError::Overflow { name: name.to_owned(), rows, cols })
}

/// A matrix's size in bytes for display (a record made before sizes were
/// checked may not fit in 64 bits).
pub(crate) fn bytes_of(m: &MatrixInfo) -> u128 {
    u128::from(m.n_rows) * u128::from(m.n_cols) * 8
}

fn n_blocks(mm: &apps::block::MatrixMeta) -> u64 {
    u64::from(mm.block_rows()) * u64::from(mm.block_cols())
}

/// Every block of `mm`, column by column, made as they are asked for (a
/// list of them all took memory in proportion to the grid).
fn all_blocks(mm: &apps::block::MatrixMeta) -> impl Iterator<Item = (u32, u32)> + Send + 'static {
    let (p, q) = (mm.block_rows(), mm.block_cols());
    (0..q).flat_map(move |j| (0..p).map(move |i| (i, j)))
}

/// The matrices marked incomplete, with why.
pub(crate) async fn incomplete(client: &Client) -> anyhow::Result<std::collections::HashMap<uuid::Uuid, String>> {
    Ok(client
        .scan_small(INCOMPLETE_PREFIX, 0)
        .await?
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(INCOMPLETE_PREFIX)?.parse().ok()?, String::from_utf8_lossy(&v).into_owned())))
        .collect())
}

/// The key that marks matrix `id` as incomplete (its value says why):
/// written before a new matrix's blocks are, removed once they all are. A
/// `master matrix create` killed midway (SIGKILL, the OOM killer) leaves a
/// record `matrix list` shows as incomplete, never one that passes for
/// whole.
pub(crate) fn incomplete_key(id: uuid::Uuid) -> String {
    format!("{INCOMPLETE_PREFIX}{id}")
}

pub(crate) const INCOMPLETE_PREFIX: &str = "matrixstate/incomplete/";

async fn set_small(client: &Client, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
    let session = client.open_session("master").await?;
    let a = session.begin().await?;
    match value {
        Some(v) => a.write_small(key, v).await?,
        None => a.delete_small(key).await?,
    }
    a.commit().await?;
    Ok(())
}

/// Fills the new matrix `m` with `filling`: marked incomplete meanwhile,
/// and removed again (marker and all) if filling fails or the user
/// interrupts it (Ctrl-C, SIGTERM).
async fn fill_new(client: &Client, m: &MatrixInfo, filling: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let key = incomplete_key(m.id);
    let result = async {
        set_small(client, &key, Some(b"being written by master matrix create/import")).await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = filling => r?,
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
            _ = term.recv() => bail!("terminated"),
        }
        set_small(client, &key, None).await
    }
    .await;
    if result.is_err() {
        let _ = client.delete_matrix(m.id).await;
        let _ = set_small(client, &key, None).await;
    }
    result
}

/// Writes blocks `ids` of `mm`, each in its own committed action.
pub(crate) async fn fill(
    client: &Client,
    mm: &Arc<apps::block::MatrixMeta>,
    ids: impl IntoIterator<Item = (u32, u32)>,
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
    check_size(name, layout.rows, layout.cols, block)?;
    let m = create_record(client, name, layout.rows, layout.cols, block).await?;
    let mm = Arc::new(meta(&m));
    let f = Arc::new(f);
    let bar = crate::progress::bar(true, n_blocks(&mm), "importing blocks");
    let filling = fill(client, &mm, all_blocks(&mm), &bar, move |mm, i, j| {
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
        if let Some(k) = b.data.iter().position(|x| !x.is_finite()) {
            let (r, c) = (k % rows, k / rows);
            return Err(ImportError::NonFinite { i, j, row: r0 + r as u64, col: c0 + c as u64, value: b.data[k] }.into());
        }
        Ok(b)
    });
    let result = fill_new(client, &m, filling).await;
    bar.finish_and_clear();
    result.with_context(|| format!("importing {} (matrix removed again)", file.display()))?;
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
