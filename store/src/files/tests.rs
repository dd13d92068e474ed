use super::*;

/// A blocks directory whose versions are of the CRC-32C format is
/// refused; one of this format, an empty one, and one with only a
/// spare or a damaged header (a single bad block is a get's `Corrupt`,
/// not the store's) are taken.
#[test]
fn a_directory_of_the_earlier_block_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = BlockFiles::open(dir.path(), Arc::new(crate::disk::RealDisk)).unwrap();
    files.check_format().unwrap();
    std::fs::write(files.dir.join("spare"), b"").unwrap();
    files.check_format().unwrap();
    let payload = [0u8; 64];
    let header = BlockHeader { rows: 2, cols: 4, checksum: block::checksum(&payload) };
    let v = files.write(&[&header.encode()[..], &payload].concat()).unwrap();
    files.check_format().unwrap();
    let path = files.path(v);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0..4].copy_from_slice(b"XXXX");
    std::fs::write(&path, &bytes).unwrap();
    files.check_format().unwrap();
    bytes[0..4].copy_from_slice(b"FTB1");
    std::fs::write(&path, &bytes).unwrap();
    let e = files.check_format().unwrap_err();
    assert!(
        matches!(&e, StoreError::Storage { what } if what.contains("earlier format (FTB1") && what.contains("import them again")),
        "{e}"
    );
}

#[test]
fn written_versions_read_back_and_a_sweep_keeps_only_the_named() {
    let dir = tempfile::tempdir().unwrap();
    let files = BlockFiles::open(dir.path(), Arc::new(crate::disk::RealDisk)).unwrap();
    let a = files.write(b"alpha").unwrap();
    let b = files.write(b"beta").unwrap();
    assert_ne!(a, b);
    files.sync_dir_if_needed().unwrap();
    assert_eq!(files.read(a).unwrap().as_deref(), Some(&b"alpha"[..]));
    std::fs::write(files.dir.join("stray"), b"x").unwrap();
    assert_eq!(files.sweep(&HashSet::from([a])).unwrap(), 2);
    assert_eq!(files.read(b).unwrap(), None);
    assert_eq!(files.read(a).unwrap().as_deref(), Some(&b"alpha"[..]));
    files.corrupt(a, 1).unwrap();
    assert_eq!(files.read(a).unwrap().as_deref(), Some(&b"a\x36pha"[..]));
    files.remove(&[a, b]);
    assert_eq!(files.read(a).unwrap(), None);
}

#[test]
fn puts_take_spares_once_and_only_creates_need_a_directory_sync() {
    let dir = tempfile::tempdir().unwrap();
    let files = BlockFiles::open(dir.path(), Arc::new(crate::disk::RealDisk)).unwrap();
    let created = files.write(b"made on the spot").unwrap();
    assert!(files.unsynced.load(Ordering::SeqCst), "a created version needs the directory synced");
    files.sync_dir_if_needed().unwrap();
    assert!(!files.unsynced.load(Ordering::SeqCst));

    files.refill().unwrap();
    let spares: HashSet<Uuid> = files.spares.lock().unwrap().iter().copied().collect();
    assert_eq!(spares.len(), SPARES);
    let mut taken = HashSet::new();
    for k in 0..SPARES {
        let v = files.write(format!("version {k}").as_bytes()).unwrap();
        assert!(spares.contains(&v) && taken.insert(v), "each spare is handed out once");
        assert_eq!(files.read(v).unwrap(), Some(format!("version {k}").into_bytes()));
    }
    assert!(!files.unsynced.load(Ordering::SeqCst), "spares need no directory sync");
    // Spares left over are garbage to the next open's sweep.
    files.refill().unwrap();
    let keep: HashSet<Uuid> = taken.iter().copied().chain([created]).collect();
    assert_eq!(files.sweep(&keep).unwrap(), SPARES);
    assert_eq!(files.read(created).unwrap().as_deref(), Some(&b"made on the spot"[..]));
}

#[test]
fn retired_versions_are_overwritten_in_place_within_the_caps() {
    let dir = tempfile::tempdir().unwrap();
    let files = BlockFiles::open(dir.path(), Arc::new(crate::disk::RealDisk)).unwrap();
    let long = files.write(&[7u8; 100]).unwrap();
    let short = files.write(&[8u8; 40]).unwrap();
    files.retire(&[long, short]);
    assert_eq!(files.recycled.lock().unwrap().bytes, 140);

    // A value of a recycled file's length goes into that file.
    let again = files.write(&[1u8; 100]).unwrap();
    assert_eq!(again, long);
    assert_eq!(files.read(again).unwrap(), Some(vec![1u8; 100]));
    // Else the newest: a longer file is cut to the value's length, a
    // shorter one grows.
    let grown = files.write(&[2u8; 60]).unwrap();
    assert_eq!(grown, short);
    assert_eq!(files.read(grown).unwrap(), Some(vec![2u8; 60]));
    files.retire(&[again]);
    let cut = files.write(&[3u8; 10]).unwrap();
    assert_eq!(cut, long);
    assert_eq!(files.read(cut).unwrap(), Some(vec![3u8; 10]));
    assert_eq!(files.recycled.lock().unwrap().files.len(), 0);
    // With nothing recycled, a put makes a fresh version.
    let fresh = files.write(&[4u8; 10]).unwrap();
    assert!(![long, short].contains(&fresh));

    // Beyond the file cap, retired versions are unlinked.
    let many: Vec<Uuid> = (0..RECYCLED_FILES + 3).map(|k| files.write(&[k as u8; 8]).unwrap()).collect();
    files.retire(&many);
    assert_eq!(files.recycled.lock().unwrap().files.len(), RECYCLED_FILES);
    let gone = many.iter().filter(|&&v| files.read(v).unwrap().is_none()).count();
    assert_eq!(gone, 3);
    // A version already gone is not kept.
    files.release_recycled();
    files.retire(&[many[0]]);
    assert_eq!(files.recycled.lock().unwrap().files.len(), 0);
    // Recycled versions are garbage to the next open's sweep.
    files.retire(&[fresh]);
    assert_eq!(files.sweep(&HashSet::from([cut, grown])).unwrap(), 1);
}

/// A version just written is in the page cache, so a batch's read hint
/// is skipped for it (the check itself must work here: a check that
/// always failed would give every warm batch the hint's cost back);
/// one whose header fails its checks is left to the read that reports it.
#[test]
fn a_version_just_written_counts_as_cached() {
    let dir = tempfile::tempdir().unwrap();
    let files = BlockFiles::open(dir.path(), Arc::new(crate::disk::RealDisk)).unwrap();
    let payload = vec![7u8; 3 << 20];
    let header = BlockHeader { rows: 512, cols: 768, checksum: block::checksum(&payload) };
    let mut value = header.encode().to_vec();
    value.extend_from_slice(&payload);
    let v = files.write(&value).unwrap();
    let f = File::open(files.path(v)).unwrap();
    assert_eq!(cached_version_header(&f), Some(header));
    let short = files.write(&value[..value.len() - 8]).unwrap();
    assert_eq!(cached_version_header(&File::open(files.path(short)).unwrap()), None, "shorter than its header says");
    let garbage = files.write(&[7u8; 4096]).unwrap();
    assert_eq!(cached_version_header(&File::open(files.path(garbage)).unwrap()), None, "no block header");
    assert!(first_page_cached(&f));
    // Dropped from the page cache (it is synced: its pages are clean).
    // SAFETY: a plain syscall on a descriptor this test owns.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert!(!first_page_cached(&f), "a version just dropped from the page cache");
    assert_eq!(cached_version_header(&f), None);
}

/// Block files holding one retired version of 64 bytes, which the next
/// staging reuses.
fn with_one_recycled() -> (tempfile::TempDir, BlockFiles, Uuid) {
    let dir = tempfile::tempdir().unwrap();
    let files = BlockFiles::open(dir.path(), Arc::new(crate::disk::RealDisk)).unwrap();
    let old = files.write(&[9u8; 64]).unwrap();
    files.retire(&[old]);
    (dir, files, old)
}

/// A streamed put's version waits unsynced, cut to its length and
/// readable, until its commit syncs it or its action drops it.
#[test]
fn a_version_synced_later_is_synced_once_or_forgotten() {
    let (_dir, files, old) = with_one_recycled();
    let staging = files.stage(16).unwrap();
    staging.write_unsynced_at(&[3u8; 16], 0).unwrap();
    let v = files.sync_later(staging).unwrap();
    assert_eq!(v, old, "into the recycled file");
    // Cut at once: a read of the action's own write sees the value alone.
    assert_eq!(files.read(v).unwrap(), Some(vec![3u8; 16]));
    assert!(files.syncing.lock().unwrap().contains_key(&v));
    // The commit syncs it and takes it out; a second commit naming it
    // (none can) or a version synced at its put has nothing to do.
    let synced_at_put = files.write(&[4u8; 8]).unwrap();
    files.sync_staged(&[v, synced_at_put]).unwrap();
    assert!(files.syncing.lock().unwrap().is_empty());
    files.sync_staged(&[v]).unwrap();
    // A version its action drops is forgotten with it.
    let staging = files.stage(8).unwrap();
    staging.write_unsynced_at(&[5u8; 8], 0).unwrap();
    let dropped = files.sync_later(staging).unwrap();
    files.retire(&[dropped]);
    assert!(files.syncing.lock().unwrap().is_empty());
}

#[test]
fn a_version_written_in_pieces_reads_back_whole() {
    let (_dir, files, old) = with_one_recycled();
    // Pieces out of order into the longer recycled file: the finish
    // cuts it to the value's length.
    let staging = files.stage(40).unwrap();
    assert_eq!(staging.version(), old, "the recycled file is reused");
    staging.write_at(&[2u8; 20], 20).unwrap();
    staging.write_at(&[1u8; 20], 0).unwrap();
    staging.finish().unwrap();
    let mut want = vec![1u8; 20];
    want.extend([2u8; 20]);
    assert_eq!(files.read(old).unwrap(), Some(want));
    // An abandoned staging is kept for reuse, a failed one removed.
    let abandoned = files.stage(8).unwrap();
    let v = abandoned.version();
    files.abandon(abandoned);
    assert!(files.recycled.lock().unwrap().files.iter().any(|&(r, _)| r == v));
    let other = files.write(&[5u8; 8]).unwrap();
    files.retire(&[other]);
    let failing = files.stage(8).unwrap();
    let taken = failing.version();
    assert_eq!(taken, other, "a recycled file of the value's length first");
    let e = files.failed(failing, std::io::Error::from_raw_os_error(28));
    assert!(matches!(e, StoreError::StorageFull { .. }), "{e}");
    assert_eq!(files.read(taken).unwrap(), None);
    assert!(files.recycled.lock().unwrap().files.is_empty(), "a full disk gives the recycled space back");
    assert_eq!(files.read(v).unwrap(), None);
}

#[test]
fn the_byte_cap_bounds_the_recycled_versions() {
    let mut r = Recycled::default();
    assert!(r.keep(Uuid::new_v4(), RECYCLED_BYTES - 1));
    assert!(!r.keep(Uuid::new_v4(), 2), "over the byte cap");
    assert!(r.keep(Uuid::new_v4(), 1));
    assert_eq!(r.bytes, RECYCLED_BYTES);
    assert!(r.take(5).is_some());
    assert_eq!(r.bytes, RECYCLED_BYTES - 1);
}
