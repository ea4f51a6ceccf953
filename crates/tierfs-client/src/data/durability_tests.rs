//! Durability order: an object is made durable before any metadata that refers to it commits.
//! A target whose sync fails must leave the metadata as it was (the application gets EIO) and
//! lose nothing acknowledged before.

use super::fixture::fixture;

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
    f.finish();
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
    f.finish();
}
