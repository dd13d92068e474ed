//! Matrices and their blocks.

use std::collections::HashMap;
use std::sync::Arc;

use actions::{ActionId, LockMode};
use bytes::Bytes;
use store_client::block::{self, BlockHeader, HEADER_LEN};
use store_client::dataplane::wire::ObjectVersion;
use store_client::{MatrixInfo, StoreError};
use tokio::io::{AsyncRead, AsyncReadExt};
use uuid::Uuid;

use crate::db::Db;
use crate::files::Staging;
use crate::keys::{BlockKey, ObjKey, Tentative};
use crate::metrics::Metrics;
use crate::node::Node;

/// Largest block side: a block of 4096² doubles is 128 MiB.
pub const MAX_BLOCK: u32 = store_client::dataplane::wire::MAX_BLOCK_SIDE;

/// The matrix records, cached in memory (they are few and small).
#[derive(Default)]
pub(crate) struct Matrices {
    by_id: HashMap<Uuid, MatrixInfo>,
    by_name: HashMap<String, Uuid>,
}

impl Matrices {
    pub(crate) fn load(records: Vec<Vec<u8>>) -> Matrices {
        let mut m = Matrices::default();
        for r in records {
            match crate::matrix_record::decode(&r) {
                Ok(info) => m.insert(info),
                Err(why) => tracing::error!("skipping an unreadable matrix record: {why}"),
            }
        }
        m
    }

    fn insert(&mut self, info: MatrixInfo) {
        self.by_name.insert(info.name.clone(), info.id);
        self.by_id.insert(info.id, info);
    }
}

/// The bytes a matrix's blocks take on the disk once every block is
/// written (payloads and headers), computed without overflow; refused
/// when they cannot be counted in 64 bits or its grid of blocks cannot be
/// indexed in 32 bits.
pub(crate) fn matrix_bytes(name: &str, n_rows: u64, n_cols: u64, block: u32) -> Result<u64, StoreError> {
    let too_large =
        |why: &str| StoreError::InvalidArgument { what: format!("matrix {name:?}: {n_rows}x{n_cols} with block {block} {why}") };
    let (p, q) = (n_rows.div_ceil(u64::from(block)), n_cols.div_ceil(u64::from(block)));
    if p > u64::from(u32::MAX) || q > u64::from(u32::MAX) {
        return Err(too_large("has more than 2³² blocks along a side"));
    }
    n_rows
        .checked_mul(n_cols)
        .and_then(|n| n.checked_mul(8))
        .and_then(|payload| payload.checked_add(p * q * HEADER_LEN as u64))
        .ok_or_else(|| too_large("holds more than 2⁶⁴ bytes"))
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A block's payload (f64 values) in bytes, as counted in [`Metrics`].
fn payload_bytes(rows: u32, cols: u32) -> u64 {
    u64::from(rows) * u64::from(cols) * 8
}

/// The shape block `(i, j)` must have, or why it cannot exist.
pub(crate) fn block_shape(m: &MatrixInfo, i: u32, j: u32) -> Result<(u32, u32), StoreError> {
    let b = m.block as u64;
    let (bi, bj) = (i as u64 * b, j as u64 * b);
    if bi >= m.n_rows || bj >= m.n_cols {
        return Err(StoreError::InvalidArgument {
            what: format!("block ({i}, {j}) is outside matrix {:?} ({}x{}, block {})", m.name, m.n_rows, m.n_cols, m.block),
        });
    }
    Ok(((m.n_rows - bi).min(b) as u32, (m.n_cols - bj).min(b) as u32))
}

impl Node {
    pub(crate) fn create_matrix(&self, name: &str, n_rows: u64, n_cols: u64, block: u32) -> Result<MatrixInfo, StoreError> {
        if name.is_empty() || name.len() > 200 || name.chars().any(|c| c.is_control()) {
            return Err(StoreError::InvalidArgument { what: format!("matrix name {name:?}") });
        }
        if n_rows == 0 || n_cols == 0 || block == 0 || block > MAX_BLOCK {
            return Err(StoreError::InvalidArgument {
                what: format!("matrix {name:?}: {n_rows}x{n_cols} with block {block} (need sizes ≥ 1, 1 ≤ block ≤ {MAX_BLOCK})"),
            });
        }
        // Whether it can ever be stored, before anything is written: a size
        // past 2⁶⁴ bytes used to wrap (`matrix info` showed a wrapped
        // byte count) and a matrix larger than the disk filled it.
        let bytes = matrix_bytes(name, n_rows, n_cols, block)?;
        self.db.room_for(bytes, &format!("matrix {name:?} ({n_rows}x{n_cols}, block {block}: {})", gib(bytes)))?;
        let mut matrices = self.matrices.write().unwrap_or_else(|p| p.into_inner());
        if matrices.by_name.contains_key(name) {
            return Err(StoreError::AlreadyExists { what: format!("matrix {name:?}") });
        }
        let info = MatrixInfo { id: Uuid::new_v4(), name: name.to_owned(), n_rows, n_cols, block };
        self.db.put_matrix(info.id, name, &crate::matrix_record::encode(&info))?;
        matrices.insert(info.clone());
        Ok(info)
    }

    pub(crate) fn matrix(&self, id: Option<Uuid>, name: &str) -> Result<MatrixInfo, StoreError> {
        let matrices = self.matrices.read().unwrap_or_else(|p| p.into_inner());
        let id = match id {
            Some(id) => id,
            None => *matrices.by_name.get(name).ok_or_else(|| StoreError::NotFound { what: format!("matrix {name:?}") })?,
        };
        matrices.by_id.get(&id).cloned().ok_or_else(|| StoreError::NotFound { what: format!("matrix {id}") })
    }

    /// Bytes of every matrix's blocks once written (see [`matrix_bytes`]).
    pub(crate) fn matrices_bytes(&self) -> u64 {
        let matrices = self.matrices.read().unwrap_or_else(|p| p.into_inner());
        matrices.by_id.values().filter_map(|m| matrix_bytes(&m.name, m.n_rows, m.n_cols, m.block).ok()).sum()
    }

    pub(crate) fn list_matrices(&self) -> Vec<MatrixInfo> {
        let matrices = self.matrices.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<MatrixInfo> = matrices.by_id.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub(crate) fn delete_matrix(&self, id: Uuid) -> Result<(), StoreError> {
        let mut matrices = self.matrices.write().unwrap_or_else(|p| p.into_inner());
        let info = matrices.by_id.get(&id).cloned().ok_or_else(|| StoreError::NotFound { what: format!("matrix {id}") })?;
        self.db.delete_matrix(id, &info.name)?;
        matrices.by_id.remove(&id);
        matrices.by_name.remove(&info.name);
        Ok(())
    }

    /// Reads a block: under a read (or, `mode`, write) lock inside `action` (its own tentative
    /// version if it wrote one), or the committed version without a lock.
    /// Returns the stored value (header and payload), checksum verified.
    pub(crate) async fn get_block(
        &self,
        action: Option<ActionId>,
        key: BlockKey,
        mode: LockMode,
    ) -> Result<(BlockHeader, Bytes), StoreError> {
        let recheck = Recheck::after_reading(action);
        let value = self.with_version(action, key, mode, Work::Blocking, recheck, |db, v| db.read_version(v)).await?;
        let header = block::decode(&value, &|| format!("{key:?}"))?.0;
        Ok((header, Bytes::from(value)))
    }

    /// Like [`Node::get_block`], but opens the version's file instead of
    /// reading it, for a client on this machine that reads it itself (the
    /// data plane passes the descriptor over its Unix socket); its header
    /// is checked by [`Node::block_header`], the payload's checksum by the
    /// reader. The file holds this version while the action holds its
    /// lock (a replaced version's file is overwritten only after that).
    /// Also answers the version opened: without a lock, the caller checks
    /// with [`Node::is_current`] that it was not replaced before the
    /// header was read.
    pub(crate) async fn open_block(
        &self,
        action: Option<ActionId>,
        key: BlockKey,
        mode: LockMode,
    ) -> Result<(Uuid, Arc<std::fs::File>), StoreError> {
        // A pointer lookup and an open (mostly of a kept file):
        // microseconds, less than the blocking pool's two thread hand-offs.
        let open = move |db: &Db, v| Ok(db.open_version(v, &|| format!("{key:?}"))?.map(|file| (v, file)));
        self.with_version(action, key, mode, Work::Inline, Recheck::No, open).await
    }

    /// The version `action` sees of a block whose versions are objects,
    /// under the lock a get in `mode` takes, and the block's shape: the
    /// client reads the object itself (`store_client::objects`).
    pub(crate) async fn object_version(
        &self,
        action: Option<ActionId>,
        key: BlockKey,
        mode: LockMode,
    ) -> Result<ObjectVersion, StoreError> {
        if self.db.objects().is_none() {
            return Err(files_not_objects());
        }
        let m = self.matrix(Some(key.matrix), "")?;
        let (rows, cols) = block_shape(&m, key.i, key.j)?;
        let version = self.with_version(action, key, mode, Work::Inline, Recheck::No, |_, v| Ok(Some(v))).await?;
        Ok(ObjectVersion { version, rows, cols })
    }

    /// Makes the version a client wrote as an object (`version`, holding
    /// `header`'s block) the action's tentative state of the block, under
    /// the overwrite lock, once the object is found there whole. The
    /// payload's checksum is the readers' to check, end to end.
    pub(crate) async fn object_put(
        self: &Arc<Self>,
        action: Option<ActionId>,
        key: BlockKey,
        header: BlockHeader,
        version: Uuid,
    ) -> Result<(), StoreError> {
        let Some(objects) = self.db.objects().cloned() else { return Err(files_not_objects()) };
        let Some(action) = action else { return Err(StoreError::InvalidArgument { what: "a block put needs an action".into() }) };
        self.prepare_put(action, key, &header).await?;
        // Live before it is looked at, so that no collection takes it.
        objects.stage(version);
        let want = (HEADER_LEN + header.payload_len()) as u64;
        let for_size = objects.clone();
        let size = tokio::task::spawn_blocking(move || for_size.size(version))
            .await
            .map_err(|e| StoreError::Storage { what: e.to_string() })
            .and_then(|size| size);
        match size {
            Ok(Some(n)) if n == want => self.stage_put(action, key, version),
            found => {
                // Not this node's to remove: the client that wrote it does.
                objects.forget(&[version]);
                let found = match found {
                    Ok(Some(n)) => format!("{n} bytes"),
                    Ok(None) => "no object".into(),
                    Err(e) => return Err(e),
                };
                Err(StoreError::InvalidArgument {
                    what: format!("{key:?}: version {version} must be an object of {want} bytes, found {found}"),
                })
            }
        }
    }

    /// Whether `version` is still `key`'s committed one.
    pub(crate) fn is_current(&self, key: BlockKey, version: Uuid) -> Result<bool, StoreError> {
        self.db.is_current(&key, version)
    }

    /// An opened block's header if its file is in the page cache
    /// (`files::cached_version_header`).
    pub(crate) fn cached_block_header(&self, file: &std::fs::File) -> Option<BlockHeader> {
        crate::files::cached_version_header(file)
    }

    /// Whether an opened block's file is in the page cache
    /// (`files::first_page_cached`).
    pub(crate) fn block_cached(&self, file: &std::fs::File) -> bool {
        crate::files::first_page_cached(file)
    }

    /// The write stamp in an opened block's header
    /// (`files::version_stamp`).
    pub(crate) fn block_stamp(&self, file: &std::fs::File) -> Option<u64> {
        crate::files::version_stamp(file)
    }

    /// Starts reading an opened block's file into the page cache.
    pub(crate) fn prefetch_block(&self, file: &std::fs::File) {
        crate::files::will_need(file)
    }

    /// The header of a block [`Node::open_block`] opened, checked against
    /// the file's length.
    pub(crate) fn block_header(&self, file: &std::fs::File, key: BlockKey) -> Result<BlockHeader, StoreError> {
        crate::files::version_header(file, &|| format!("{key:?}"))
    }

    /// Takes `action`'s lock on the block, finds the version it sees (its
    /// own staged one, or the committed one) and applies `f` to it, on the
    /// blocking pool or here as `work` says. `f` answers `None` when the
    /// version's file is gone.
    async fn with_version<T: Send + 'static>(
        &self,
        action: Option<ActionId>,
        key: BlockKey,
        mode: LockMode,
        work: Work,
        recheck: Recheck,
        f: impl Fn(&Db, Uuid) -> Result<Option<T>, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let m = self.matrix(Some(key.matrix), "")?;
        let (rows, cols) = block_shape(&m, key.i, key.j)?;
        let mut version = None;
        if let Some(a) = action {
            let k = ObjKey::Block(key);
            self.acquire(a, &k, mode).await?;
            version = self.lookup(a, &k)?.and_then(|t| t.staged_version());
        }
        let found = match work {
            Work::Inline => find_version(&self.db, key, version, recheck, f),
            Work::Blocking => {
                let db = self.db.clone();
                tokio::task::spawn_blocking(move || find_version(&db, key, version, recheck, f))
                    .await
                    .map_err(|e| StoreError::Storage { what: e.to_string() })?
            }
        };
        if found.is_ok() {
            Metrics::add(&self.metrics.block_bytes_read, payload_bytes(rows, cols));
        }
        found
    }

    /// Writes a block inside `action` under an overwrite lock. `value` is
    /// the stored form (header space then payload), checked here.
    pub(crate) async fn put_block(self: &Arc<Self>, action: ActionId, key: BlockKey, value: Vec<u8>) -> Result<(), StoreError> {
        let header = block::decode(&value, &|| format!("{key:?} as sent"))?.0;
        self.prepare_put(action, key, &header).await?;
        let db = self.db.clone();
        let version = tokio::task::spawn_blocking(move || db.stage_version(&value))
            .await
            .map_err(|e| StoreError::Storage { what: e.to_string() })??;
        self.stage_put(action, key, version)
    }

    /// Writes a block inside `action` under an overwrite lock, its payload
    /// read from `from` (`header.payload_len()` bytes, checked against the
    /// header's checksum) and written to its version's file piece by piece
    /// as it arrives: the next piece crosses the socket while this one is
    /// written and goes to the disk, and the node holds two pieces of a
    /// block, not the block. (A 32 MiB put over the Unix socket took 31–36
    /// ms when received whole, then written and synced; the write and
    /// its sync alone take 15.)
    ///
    /// Every payload byte is read from `from`, even when the put is
    /// refused, so the connection stays in step; `Err` means `from`
    /// failed and the connection is lost.
    pub(crate) async fn put_block_from(
        self: &Arc<Self>,
        action: Option<ActionId>,
        key: BlockKey,
        header: BlockHeader,
        from: &mut (impl AsyncRead + Unpin),
    ) -> std::io::Result<Result<(), StoreError>> {
        let payload = header.payload_len() as u64;
        if self.db.objects().is_some() {
            // Written whole, as one object, once it is all here.
            let mut value = vec![0u8; HEADER_LEN + payload as usize];
            value[..HEADER_LEN].copy_from_slice(&header.encode());
            from.read_exact(&mut value[HEADER_LEN..]).await?;
            let Some(action) = action else { return Ok(Err(StoreError::InvalidArgument { what: "a block put needs an action".into() })) };
            return Ok(self.put_block(action, key, value).await);
        }
        let (action, staging) = match self.prepare_staging(action, key, &header).await {
            Ok(prepared) => prepared,
            Err(e) => {
                tokio::io::copy(&mut from.take(payload), &mut tokio::io::sink()).await?;
                return Ok(Err(e));
            }
        };
        let sync_last = sync_last(payload);
        let (staging, written) = write_pieces(staging, header, payload, sync_last, from).await;
        // `None`: a writer thread panicked with the file (the next open
        // sweeps it), and the connection is out of step.
        let Some(staging) = staging else {
            return Err(written.err().unwrap_or_else(|| std::io::Error::other("a block writer thread panicked")));
        };
        self.end_put(action, key, staging, written, sync_last)
    }

    /// Checks a put, takes its lock and the file its version goes into.
    pub(crate) async fn prepare_staging(
        &self,
        action: Option<ActionId>,
        key: BlockKey,
        header: &BlockHeader,
    ) -> Result<(ActionId, Staging), StoreError> {
        let Some(action) = action else { return Err(StoreError::InvalidArgument { what: "a block put needs an action".into() }) };
        if self.db.objects().is_some() {
            return Err(StoreError::InvalidArgument {
                what: format!("{key:?}: a put through a local pipe, to a node whose blocks are objects"),
            });
        }
        self.prepare_put(action, key, header).await?;
        let staging = self.db.files().stage(HEADER_LEN as u64 + header.payload_len() as u64)?;
        Ok((action, staging))
    }

    /// Ends a put whose payload went into `staging` as `written` says
    /// (`Err`: the connection failed midway): on success the version
    /// becomes the action's tentative state of the block, else its file
    /// goes back.
    pub(crate) fn end_put(
        &self,
        action: ActionId,
        key: BlockKey,
        staging: Staging,
        written: std::io::Result<Result<(), Piece>>,
        synced: bool,
    ) -> std::io::Result<Result<(), StoreError>> {
        let files = self.db.files();
        match written {
            Err(e) => {
                files.abandon(staging);
                Err(e)
            }
            Ok(Err(Piece::Io(e))) => Ok(Err(files.failed(staging, e))),
            Ok(Err(Piece::Checksum)) => {
                files.abandon(staging);
                Ok(Err(StoreError::Corrupt { what: format!("{key:?} as sent: checksum mismatch") }))
            }
            Ok(Ok(())) if synced => Ok(self.stage_put(action, key, staging.version())),
            // Synced by the commit.
            Ok(Ok(())) => Ok(files.sync_later(staging).and_then(|version| self.stage_put(action, key, version))),
        }
    }

    /// Checks a put's block against its matrix and takes the overwrite lock.
    async fn prepare_put(&self, action: ActionId, key: BlockKey, header: &BlockHeader) -> Result<(), StoreError> {
        let m = self.matrix(Some(key.matrix), "")?;
        let (rows, cols) = block_shape(&m, key.i, key.j)?;
        if (header.rows, header.cols) != (rows, cols) {
            return Err(StoreError::InvalidArgument {
                what: format!("{key:?} must be {rows}x{cols}, got {}x{}", header.rows, header.cols),
            });
        }
        self.acquire(action, &ObjKey::Block(key), LockMode::Overwrite).await
    }

    /// Makes a written version (synced, or left for its commit to sync)
    /// the action's tentative state of the block.
    fn stage_put(&self, action: ActionId, key: BlockKey, version: Uuid) -> Result<(), StoreError> {
        match self.set_tentative(action, ObjKey::Block(key), Tentative::Block(version)) {
            Ok(replaced) => {
                if let Ok((rows, cols)) = self.matrix(Some(key.matrix), "").and_then(|m| block_shape(&m, key.i, key.j)) {
                    Metrics::add(&self.metrics.block_bytes_written, payload_bytes(rows, cols));
                }
                if let Some(old) = replaced {
                    self.db.drop_staged(&[old]);
                }
                Ok(())
            }
            Err(e) => {
                // Aborted while we staged: the version is garbage now.
                self.db.drop_staged(&[version]);
                Err(e)
            }
        }
    }

    pub(crate) fn corrupt_block_for_test(&self, key: BlockKey) -> Result<(), StoreError> {
        if !self.config.test_hooks {
            return Err(StoreError::InvalidArgument { what: "test hooks are disabled on this node".into() });
        }
        self.db.corrupt_block(&key)
    }
}

fn files_not_objects() -> StoreError {
    StoreError::InvalidArgument { what: "this node keeps its blocks in its own files, not as objects of a pool".into() }
}

/// Bytes of a streamed put received and written at a time.
pub(crate) const PIECE: usize = 2 << 20;

/// Whether a put of `payload` bytes syncs its file itself. A value of one
/// piece is synced by its commit, behind the put's answer
/// (`BlockFiles::sync_later`); a longer one by its put, its writeback
/// overlapping its transfer, so that a commit's sync stays short.
pub(crate) fn sync_last(payload: u64) -> bool {
    payload > PIECE as u64
}

/// Why a streamed put's pieces did not all reach the file.
pub(crate) enum Piece {
    Io(std::io::Error),
    Checksum,
}

/// A piece on its way to the file: the staging and the buffer come back.
type Writing = tokio::task::JoinHandle<(Staging, Vec<u8>, std::io::Result<()>)>;

/// Reads `payload` bytes from `from` and writes them, after the header,
/// into `staging`'s file, one piece on a blocking thread while the next is
/// read, and writes the last piece if the payload matches its checksum,
/// syncing the file with it if `sync_last`. Returns the staging (`None` if
/// a writer thread panicked with it) and: `Err` if `from` failed, else
/// whether the file holds the value (durably if `sync_last`). Reads the
/// whole payload even after a failed write.
async fn write_pieces(
    staging: Staging,
    header: BlockHeader,
    payload: u64,
    sync_last: bool,
    from: &mut (impl AsyncRead + Unpin),
) -> (Option<Staging>, std::io::Result<Result<(), Piece>>) {
    let stamp = staging.stamp();
    let mut staging = Some(staging);
    let mut writing: Option<Writing> = None;
    let mut spare: Option<Vec<u8>> = None;
    let mut failed: Option<std::io::Error> = None;
    let (mut sum, mut received, mut offset) = (block::Checksum::new(), 0u64, 0u64);
    while received < payload {
        let mut buf = spare.take().unwrap_or_else(|| Vec::with_capacity(HEADER_LEN + PIECE.min(payload as usize)));
        buf.clear();
        if offset == 0 {
            buf.extend_from_slice(&header.encode_stamped(stamp));
        }
        let start = buf.len();
        let want = (payload - received).min(PIECE as u64);
        let read = read_exactly(from, &mut buf, want).await;
        settle(&mut writing, &mut staging, &mut spare, &mut failed).await;
        if let Err(e) = read {
            return (staging, Err(e));
        }
        sum.update(&buf[start..]);
        received += want;
        let last = received == payload;
        if failed.is_some() || (last && sum.value() != header.checksum) {
            // Keep reading to stay in step; write no more.
            spare = Some(buf);
            continue;
        }
        let Some(s) = staging.take() else { break };
        let at = offset;
        offset += buf.len() as u64;
        let write = move || {
            let r = match (last, sync_last) {
                (true, true) => s.write_last_at(&buf, at),
                (true, false) => s.write_unsynced_at(&buf, at),
                (false, _) => s.write_at(&buf, at),
            };
            (s, buf, r)
        };
        if last && multi_threaded() {
            // The last piece (the only one of a small block) has nothing
            // left to overlap with: this thread writes and syncs it (its
            // runtime lends its other tasks to another worker), saving two
            // thread wake-ups (b = 256 overwrites: 486–571 MiB/s, against
            // 415–429 with the hand-off).
            let (s, buf, r) = tokio::task::block_in_place(write);
            staging = Some(s);
            spare = Some(buf);
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        } else {
            writing = Some(tokio::task::spawn_blocking(write));
        }
    }
    settle(&mut writing, &mut staging, &mut spare, &mut failed).await;
    if staging.is_none() {
        return (None, Err(std::io::Error::other("a block writer thread panicked")));
    }
    let outcome = match failed {
        Some(e) => Err(Piece::Io(e)),
        None if sum.value() != header.checksum => Err(Piece::Checksum),
        None => Ok(()),
    };
    (staging, Ok(outcome))
}

/// Whether this task's runtime can lend its worker to blocking work.
pub(crate) fn multi_threaded() -> bool {
    tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
}

/// Waits for the piece being written, if any; takes back its file and
/// buffer and keeps its error.
async fn settle(
    writing: &mut Option<Writing>,
    staging: &mut Option<Staging>,
    spare: &mut Option<Vec<u8>>,
    failed: &mut Option<std::io::Error>,
) {
    if let Some(w) = writing.take() {
        if let Ok((s, buf, r)) = w.await {
            *staging = Some(s);
            *spare = Some(buf);
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        }
    }
}

/// Appends exactly `n` bytes from `from` to `buf` (which has the room),
/// without zeroing them first.
async fn read_exactly(from: &mut (impl AsyncRead + Unpin), buf: &mut Vec<u8>, n: u64) -> std::io::Result<()> {
    let mut limited = from.take(n);
    while limited.limit() > 0 {
        if limited.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Where [`Node::with_version`] runs its file work.
enum Work {
    /// On the calling task: work of microseconds.
    Inline,
    /// On the blocking pool: a whole block's read.
    Blocking,
}

/// Whether [`find_version`] checks, after `f` read a committed version,
/// that the pointer still names it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Recheck {
    /// Under a lock (the version cannot change), or the caller checks
    /// later (after it read what counts, [`Node::is_current`]).
    No,
    /// A read without a lock: a commit may replace the block while `f`
    /// reads, and a put of another block of the same shape may then
    /// overwrite the replaced version's file in place (recycling), so `f`
    /// read a whole block, with a good checksum, that is not this one.
    AfterReading,
}

impl Recheck {
    pub(crate) fn after_reading(action: Option<ActionId>) -> Recheck {
        if action.is_none() {
            Recheck::AfterReading
        } else {
            Recheck::No
        }
    }
}

/// Tries of a read without a lock whose block keeps being replaced.
pub(crate) const UNLOCKED_READS: usize = 4;

/// Applies `f` to the version `key` has for the reader: `staged` (its
/// action's own write) if there is one, else the committed pointer's.
fn find_version<T>(
    db: &Db,
    key: BlockKey,
    staged: Option<Uuid>,
    recheck: Recheck,
    f: impl Fn(&Db, Uuid) -> Result<Option<T>, StoreError>,
) -> Result<T, StoreError> {
    if let Some(v) = staged {
        return f(db, v)?.ok_or_else(|| StoreError::Corrupt { what: format!("{key:?}: staged version {v} missing") });
    }
    // A read without the action's lock (or before the action wrote the
    // block) follows the pointer. Without a lock, a commit may replace the
    // version and remove or reuse its file in between: follow the new
    // pointer then.
    let mut last = None;
    for _ in 0..UNLOCKED_READS {
        let v = db.block_version(&key)?.ok_or_else(|| StoreError::NotFound { what: format!("{key:?} (never written)") })?;
        if let Some(found) = f(db, v)? {
            if recheck == Recheck::No || db.is_current(&key, v)? {
                return Ok(found);
            }
            continue;
        }
        if last == Some(v) {
            break;
        }
        last = Some(v);
    }
    Err(StoreError::Corrupt { what: format!("{key:?}: its current version's file is missing, or kept being replaced while read") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Tentative;
    use crate::undo::tests::{fill_of, stored_block};
    use std::sync::atomic::{AtomicBool, Ordering};

    fn stored(fill: f64) -> Vec<u8> {
        stored_block(fill, 0)
    }

    /// `(race, recheck)`: what a read of the block without a lock returns
    /// when, after it found the pointer and before its read, a commit
    /// replaces the block (2.0) and a put of another block of the same
    /// shape (-1.0) overwrites the replaced version's file in place, as
    /// recycling does.
    fn unlocked_read_overtaken(recheck: Recheck) -> f64 {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (db, _) = Db::open(dir.path(), 8, Arc::new(crate::disk::RealDisk)).unwrap();
        let key = BlockKey { matrix: Uuid::from_u128(1), i: 0, j: 0 };
        let commit = |db: &Db, fill: f64| {
            let version = db.files().write(&stored(fill)).unwrap();
            rt.block_on(db.commit(vec![(ObjKey::Block(key), Tentative::Block(version))], Vec::new())).unwrap();
            version
        };
        let first = commit(&db, 1.0);
        let raced = AtomicBool::new(false);
        let read = |db: &Db, v: Uuid| {
            if v == first && !raced.swap(true, Ordering::SeqCst) {
                commit(db, 2.0);
                db.files().put_back(first, &stored(-1.0));
            }
            db.read_version(v)
        };
        fill_of(&find_version(&db, key, None, recheck, read).unwrap())
    }

    #[test]
    fn a_read_without_a_lock_that_a_replacement_overtook_reads_the_new_version() {
        assert_eq!(unlocked_read_overtaken(Recheck::AfterReading), 2.0);
        // Without the check it returned the other block, checksum and all.
        assert_eq!(unlocked_read_overtaken(Recheck::No), -1.0);
    }
}
