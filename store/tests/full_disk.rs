//! A store node whose disk fills up, on a small tmpfs of its own: puts are
//! refused with `StorageFull`, nothing committed is lost, and once space is
//! freed the node takes puts again without a restart.
//!
//! Mounting needs root (as this project's machines and CI run); elsewhere
//! the test prints a `skipped: ...` line, which `scripts/test.sh` reports
//! and fails in CI.

use std::path::Path;
use std::process::Command;

use store_client::{BlockData, Client, StoreError};

/// A tmpfs mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let size = format!("size={mib}m");
        let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs"]).arg(dir.path()).status();
        match mounted {
            Ok(s) if s.success() => Some(Tmpfs { dir }),
            other => {
                let why = match other {
                    Ok(status) => format!("mount exited with {status}"),
                    Err(e) => format!("cannot run mount: {e}"),
                };
                // Through the handles, not `eprintln!`: libtest captures the
                // macros' output of passing tests, and a skip must show.
                use std::io::Write;
                let line = format!("skipped: needs root to mount a tmpfs for the full-disk test ({why})");
                let _ = writeln!(std::io::stdout().lock(), "{line}");
                let _ = writeln!(std::io::stderr().lock(), "{line}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn block(seed: u32) -> BlockData {
    BlockData { rows: 256, cols: 256, data: (0..256 * 256).map(|k| f64::from(seed) * 1e6 + k as f64).collect() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_puts_typed_and_loses_nothing() {
    let Some(fs) = Tmpfs::mount(48) else { return };
    let mut config = store::Config::new(fs.path().join("store"), "127.0.0.1:0".parse().unwrap());
    config.cache_mib = 8;
    let running = store::start(config).await.unwrap();
    let client = Client::connect(&running.addr().to_string(), None).await.unwrap();
    // 512 KiB blocks: a scratch matrix of 8 MiB, then blocks until the
    // 48 MiB are gone. (A matrix is refused at its creation when its
    // blocks cannot fit on the disk: `kept`'s 32 MiB fit, but not beside
    // the puts' 16 MiB reserve.)
    let scratch = client.create_matrix("scratch", 256, 256 * 16, 256).await.unwrap();
    let too_large = client.create_matrix("too-large", 256, 256 * 256, 256).await.unwrap_err();
    assert!(matches!(too_large, StoreError::StorageFull { .. }), "{too_large}");
    let kept = client.create_matrix("kept", 256, 256 * 64, 256).await.unwrap();
    let s = client.open_session("filler").await.unwrap();
    for j in 0..16 {
        let a = s.begin().await.unwrap();
        a.put_block(scratch.id, 0, j, block(j)).await.unwrap();
        a.commit().await.unwrap();
    }
    let mut committed = 0u32;
    let full = loop {
        assert!(committed < 64, "48 MiB never filled");
        let a = s.begin().await.unwrap();
        let put = match a.put_block(kept.id, 0, committed, block(committed)).await {
            Ok(()) => a.commit().await,
            Err(e) => {
                a.abort().await.unwrap();
                Err(e)
            }
        };
        match put {
            Ok(()) => committed += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(full, StoreError::StorageFull { .. }), "{full}");
    assert!(committed >= 16, "only {committed} blocks fitted");
    eprintln!("{committed} blocks of 512 KiB fitted beside the scratch matrix's 16: {full}");
    // Nothing committed is lost, and the node still reads.
    for j in 0..committed {
        assert_eq!(client.read_block_committed(kept.id, 0, j).await.unwrap(), block(j), "block {j}");
    }
    // A commit whose synced batch finds no room either (the rest of the
    // disk taken by another file) is refused, typed, and the node recovers
    // once there is room.
    let filler = fs.path().join("filler");
    let _ = Command::new("fallocate").args(["-l", "64M"]).arg(&filler).status();
    let _ = std::fs::OpenOptions::new().append(true).open(&filler).and_then(|mut f| {
        use std::io::Write;
        let chunk = vec![1u8; 1 << 16];
        while f.write_all(&chunk).is_ok() {}
        f.sync_all()
    });
    let a = s.begin().await.unwrap();
    a.write_small("note", &[7u8; 4096]).await.unwrap();
    let e = a.commit().await.unwrap_err();
    assert!(matches!(e, StoreError::StorageFull { .. }), "{e}");
    let e = client.create_matrix("more", 256, 256, 256).await.unwrap_err();
    assert!(matches!(e, StoreError::StorageFull { .. }), "{e}");
    std::fs::remove_file(&filler).unwrap();
    let a = s.begin().await.unwrap();
    a.write_small("note", &[7u8; 4096]).await.unwrap();
    a.commit().await.unwrap();
    assert_eq!(client.peek_small("note").await.unwrap(), Some(vec![7u8; 4096]));
    // Freeing space lets puts through again, on the same node and session.
    client.delete_matrix(scratch.id).await.unwrap();
    for j in committed..committed + 4 {
        let a = s.begin().await.unwrap();
        a.put_block(kept.id, 0, j, block(j)).await.unwrap();
        a.commit().await.unwrap();
    }
    for j in 0..committed + 4 {
        assert_eq!(client.read_block_committed(kept.id, 0, j).await.unwrap(), block(j), "block {j}");
    }
    drop(s);
    drop(client);
    running.shutdown().await.unwrap();
}
