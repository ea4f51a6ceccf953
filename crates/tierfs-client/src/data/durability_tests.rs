//! Durability order: an object is made durable before any metadata that refers to it commits.
//! A target whose sync fails must leave the metadata as it was (the application gets EIO) and
//! lose nothing acknowledged before.

use std::sync::Arc;

use tierfs_meta::{format_engine, FormatParams, Kind, NewNode, ROOT_INO};
use tierfs_store::TargetSet;

use super::{DataConfig, DataPath};
use crate::metrics::Metrics;

struct Fixture {
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    data: DataPath,
    targets: Arc<TargetSet>,
    ino: u64,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let t = |i: usize| format!("file://{}", dir.path().join(format!("ost{i}")).display());
    for i in 0..2 {
        std::fs::create_dir_all(dir.path().join(format!("ost{i}"))).unwrap();
    }
    let meta = format_engine(
        &format!("sqlite://{}", dir.path().join("meta.db").display()),
        &FormatParams {
            name: "durability".into(),
            targets: vec![(t(0), 0), (t(1), 0)],
            stripe_count: 1,
            stripe_size: 1 << 20,
            inline_threshold: 0,
            force: false,
        },
    )
    .unwrap();
    let list: Vec<(u32, String, u64)> = meta
        .targets()
        .unwrap()
        .into_iter()
        .map(|t| (t.id, t.url, t.capacity))
        .collect();
    let targets = Arc::new(TargetSet::open(&list).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let data = DataPath::new(
        Arc::clone(&meta),
        Arc::clone(&targets),
        rt.handle().clone(),
        Arc::new(Metrics::new()),
        0,
        DataConfig::default(),
    );
    let layout = data.choose_layout(ROOT_INO).unwrap();
    let node = NewNode {
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    };
    let ino = meta
        .create(ROOT_INO, b"f", &node, Some(layout), None)
        .unwrap()
        .ino;
    Fixture {
        _dir: dir,
        rt,
        data,
        targets,
        ino,
    }
}

/// Writes `data` at 0 (a partial chunk, a full chunk, or more) and flushes, with syncs of
/// every target failing: the flush fails with EIO, no slice is committed, the file's data
/// version and size stay. The failed writes are kept (docs/semantics.md): once the targets
/// sync again, the next commit (here the read's) lands them whole over what was there.
fn failing_sync_commits_nothing(len: usize) {
    let f = fixture();
    let before = vec![b'a'; 3000];
    f.data.write(f.ino, 0, &before).unwrap();
    f.data.fsync(f.ino).unwrap();
    let attr = f.data.meta.getattr(f.ino).unwrap();
    let slices = f.data.meta.read_chunk(f.ino, 0).unwrap();

    for t in f.targets.all() {
        t.inject_sync_failure(true);
    }
    f.data.write(f.ino, 0, &vec![b'b'; len]).unwrap();
    let err = f
        .data
        .flush(f.ino)
        .expect_err("a commit whose objects could not be synced");
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert_eq!(f.data.meta.read_chunk(f.ino, 0).unwrap(), slices);
    let now = f.data.meta.getattr(f.ino).unwrap();
    assert_eq!((now.size, now.data_version), (attr.size, attr.data_version));

    for t in f.targets.all() {
        t.inject_sync_failure(false);
    }
    f.data.invalidate(f.ino, None);
    let got = f.data.read(f.ino, 0, 1 << 20, false).unwrap();
    let mut want = before.clone();
    want.resize(len.max(before.len()), 0);
    want[..len].fill(b'b');
    want.truncate(1 << 20);
    assert_eq!(
        got, want,
        "the kept writes, committed once the targets sync again"
    );
    let now = f.data.meta.getattr(f.ino).unwrap();
    assert_eq!(now.size, len.max(before.len()) as u64);
    drop(f.data);
    f.rt.shutdown_background();
}

#[test]
fn a_small_write_is_not_committed_when_its_object_cannot_be_synced() {
    failing_sync_commits_nothing(5000);
}

#[test]
fn full_chunks_are_not_committed_when_their_objects_cannot_be_synced() {
    failing_sync_commits_nothing(3 << 20);
}

#[test]
fn compaction_keeps_the_old_slices_when_its_object_cannot_be_synced() {
    let f = fixture();
    let mut want = vec![0u8; 40 * 100];
    for i in 0..40u8 {
        let piece = vec![i + 1; 100];
        f.data.write(f.ino, i as u64 * 100, &piece).unwrap();
        f.data.flush(f.ino).unwrap();
        want[i as usize * 100..(i as usize + 1) * 100].copy_from_slice(&piece);
    }
    let slices = f.data.meta.read_chunk(f.ino, 0).unwrap();
    assert_eq!(slices.len(), 40);
    for t in f.targets.all() {
        t.inject_sync_failure(true);
    }
    assert!(f.data.compact(64).is_err());
    assert_eq!(f.data.meta.read_chunk(f.ino, 0).unwrap(), slices);
    for t in f.targets.all() {
        t.inject_sync_failure(false);
    }
    f.data.invalidate(f.ino, None);
    assert_eq!(f.data.read(f.ino, 0, 1 << 20, false).unwrap(), want);
    drop(f.data);
    f.rt.shutdown_background();
}
