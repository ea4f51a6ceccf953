//! The conformance suite every metadata engine must pass. Each engine's tests call
//! [`run_all`] with a factory that yields a freshly formatted engine (and a guard that keeps its
//! storage alive), so the suite is written once and run against SQLite, PostgreSQL, ...

use std::any::Any;

mod changelog;
mod hsm;

use crate::engine::{MetaEngine, OPEN_TRASH_GRACE};
use crate::error::MetaError;
use crate::types::*;

/// Format parameters the suite uses: two targets, 1 MiB stripes, 64 KiB inline threshold.
pub fn params() -> FormatParams {
    FormatParams {
        name: "conformance".into(),
        targets: vec![
            ("file:///tmp/ost0".into(), 0),
            ("file:///tmp/ost1".into(), 0),
        ],
        stripe_count: 1,
        stripe_size: 1 << 20,
        inline_threshold: 64 << 10,
        force: false,
    }
}

/// A factory of fresh engines; the first element keeps the engine's storage alive.
pub type Factory<'a> = dyn Fn() -> (Box<dyn Any>, Box<dyn MetaEngine>) + 'a;

/// One check of the suite.
type Check = fn(&dyn MetaEngine);

/// Every check, each on a fresh filesystem.
pub fn run_all(factory: &Factory<'_>) {
    let checks: &[(&str, Check)] = &[
        ("format_and_root", format_and_root),
        ("create_lookup_and_errors", create_lookup_and_errors),
        ("setattr_and_truncate", setattr_and_truncate),
        ("unlink_rmdir_nlink", unlink_rmdir_nlink),
        ("rename_cases", rename_cases),
        ("readdir_pages", readdir_pages),
        ("readdir_plus_matches_lookup", readdir_plus_matches_lookup),
        ("symlink_and_link", symlink_and_link),
        ("xattrs", xattrs),
        (
            "xattr_count_rides_with_the_attributes",
            xattr_count_rides_with_the_attributes,
        ),
        ("slices_and_commit_order", slices_and_commit_order),
        ("commit_then_setattr", commit_then_setattr),
        (
            "a_kept_change_gives_way_to_a_newer_one",
            a_kept_change_gives_way_to_a_newer_one,
        ),
        ("open_unlinked_file_survives", open_unlinked_file_survives),
        (
            "an_open_recorded_late_keeps_a_file_unlinked_meanwhile",
            an_open_recorded_late_keeps_a_file_unlinked_meanwhile,
        ),
        (
            "unlinked_files_are_freed_by_the_purge",
            unlinked_files_are_freed_by_the_purge,
        ),
        (
            "trash_of_a_file_kept_open_goes_after_a_grace",
            trash_of_a_file_kept_open_goes_after_a_grace,
        ),
        (
            "replaced_file_stays_openable_for_its_grace",
            replaced_file_stays_openable_for_its_grace,
        ),
        ("sessions_and_reaping", sessions_and_reaping),
        (
            "client_session_is_the_newest_with_its_heartbeat_age",
            client_session_is_the_newest_with_its_heartbeat_age,
        ),
        ("worker_reports", worker_reports),
        (
            "nothing_is_recorded_under_an_ended_session",
            nothing_is_recorded_under_an_ended_session,
        ),
        ("fsck_queries_and_repairs", fsck_queries_and_repairs),
        ("locks", locks),
        ("stripe_defaults_and_projects", stripe_defaults_and_projects),
        ("setgid_inheritance", setgid_inheritance),
        ("compaction_replace_chunk", compaction_replace_chunk),
        (
            "shared_objects_freed_with_last_slice",
            shared_objects_freed_with_last_slice,
        ),
        ("pcc_leases_and_rules", pcc_leases_and_rules),
        (
            "pcc_report_then_applies_the_waiting_changes",
            pcc_report_then_applies_the_waiting_changes,
        ),
        (
            "pcc_open_checks_the_lease_and_records_in_one_step",
            pcc_open_checks_the_lease_and_records_in_one_step,
        ),
        (
            "pcc_acquire_dirty_takes_the_lease_dirty",
            pcc_acquire_dirty_takes_the_lease_dirty,
        ),
        (
            "pcc_create_takes_the_lease_in_the_create",
            pcc_create_takes_the_lease_in_the_create,
        ),
        (
            "pcc_create_asks_the_rule_about_the_file_made",
            pcc_create_asks_the_rule_about_the_file_made,
        ),
        (
            "pcc_transitions_are_conditional_on_generation_and_dirty",
            pcc_transitions_are_conditional_on_generation_and_dirty,
        ),
        ("pcc_snapshot_recalls", pcc_snapshot_recalls),
        (
            "rw_lease_refused_while_open_on_another_client",
            rw_lease_refused_while_open_on_another_client,
        ),
        (
            "commit_to_a_vanished_file_trashes_its_objects",
            commit_to_a_vanished_file_trashes_its_objects,
        ),
        (
            "rewrite_data_replaces_everything",
            rewrite_data_replaces_everything,
        ),
        ("fallocate_zero_range", fallocate_zero_range),
        (
            "changelog_data_and_session_records",
            changelog::changelog_data_and_session_records,
        ),
        (
            "changelog_namespace_records",
            changelog::changelog_namespace_records,
        ),
        (
            "changelog_create_open_and_unlink_records",
            changelog::changelog_create_open_and_unlink_records,
        ),
        (
            "changelog_wanted_follows_the_readers",
            changelog::changelog_wanted_follows_the_readers,
        ),
        (
            "allocated_bytes_follow_the_slices",
            allocated_bytes_follow_the_slices,
        ),
        (
            "a_commit_of_many_slices_keeps_their_order",
            a_commit_of_many_slices_keeps_their_order,
        ),
        (
            "freed_slices_trash_their_objects_once",
            freed_slices_trash_their_objects_once,
        ),
        ("hsm_archives_and_settings", hsm::hsm_archives_and_settings),
        (
            "hsm_archive_release_restore",
            hsm::hsm_archive_release_restore,
        ),
        ("hsm_dirty_after_write", hsm::hsm_dirty_after_write),
        ("hsm_release_refusals", hsm::hsm_release_refusals),
        (
            "hsm_archive_of_a_changed_file_is_stale",
            hsm::hsm_archive_of_a_changed_file_is_stale,
        ),
        (
            "hsm_queue_priorities_and_caps",
            hsm::hsm_queue_priorities_and_caps,
        ),
        ("hsm_cancel_acts_at_once", hsm::hsm_cancel_acts_at_once),
        (
            "hsm_timeouts_requeue_and_retries",
            hsm::hsm_timeouts_requeue_and_retries,
        ),
        (
            "hsm_unlink_of_archived_files",
            hsm::hsm_unlink_of_archived_files,
        ),
        (
            "hsm_import_makes_released_files",
            hsm::hsm_import_makes_released_files,
        ),
        ("hsm_changelog_records", hsm::hsm_changelog_records),
        (
            "hsm_concurrent_takers_respect_caps",
            hsm::hsm_concurrent_takers_respect_caps,
        ),
        (
            "hsm_cancel_races_completion",
            hsm::hsm_cancel_races_completion,
        ),
        (
            "hsm_sweep_keeps_what_may_still_count",
            hsm::hsm_sweep_keeps_what_may_still_count,
        ),
        (
            "hsm_fsck_finds_and_repairs",
            hsm::hsm_fsck_finds_and_repairs,
        ),
    ];
    // TIERFS_CONFORMANCE_ONLY=part runs only the checks whose names contain it.
    let only = std::env::var("TIERFS_CONFORMANCE_ONLY").unwrap_or_default();
    for (name, check) in checks.iter().filter(|(n, _)| n.contains(only.as_str())) {
        let (_guard, engine) = factory();
        eprintln!("conformance: {name}");
        check(engine.as_ref());
    }
}

fn file() -> NewNode {
    NewNode {
        kind: Kind::File,
        perm: 0o644,
        uid: 1000,
        gid: 1000,
        rdev: 0,
        symlink: None,
    }
}

fn dir() -> NewNode {
    NewNode {
        kind: Kind::Dir,
        perm: 0o755,
        uid: 1000,
        gid: 1000,
        rdev: 0,
        symlink: None,
    }
}

fn layout() -> Layout {
    Layout {
        stripe_size: 1 << 20,
        targets: vec![0, 1],
    }
}

/// `bytes` inline at the start of chunk 0.
fn inline_slice(bytes: &[u8]) -> Slice {
    Slice {
        seq: 0,
        chunk: 0,
        off: 0,
        len: bytes.len() as u64,
        data: SliceData::Inline(bytes.to_vec()),
    }
}

fn obj_slice(chunk: u64, off: u64, len: u64, obj: u64) -> Slice {
    Slice {
        seq: 0,
        chunk,
        off,
        len,
        data: SliceData::Object {
            target: 0,
            obj,
            obj_off: 0,
            obj_size: len,
        },
    }
}

fn format_and_root(e: &dyn MetaEngine) {
    let info = e.info().unwrap();
    assert_eq!(info.name, "conformance");
    assert_eq!(info.default_stripe_size, 1 << 20);
    assert_eq!(info.inline_threshold, 64 << 10);
    assert_eq!(e.targets().unwrap().len(), 2);
    let root = e.getattr(ROOT_INO).unwrap();
    assert_eq!(root.kind, Kind::Dir);
    assert_eq!(root.nlink, 2);
}

fn create_lookup_and_errors(e: &dyn MetaEngine) {
    let a = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    assert_eq!(a.kind, Kind::File);
    assert_eq!(a.nlink, 1);
    assert_eq!(a.layout, Some(layout()));
    assert_eq!(e.lookup(ROOT_INO, b"f").unwrap().ino, a.ino);
    assert!(matches!(
        e.create(ROOT_INO, b"f", &file(), None, None),
        Err(MetaError::Exists)
    ));
    assert!(matches!(
        e.lookup(ROOT_INO, b"nope"),
        Err(MetaError::NotFound)
    ));
    assert!(matches!(e.lookup(a.ino, b"x"), Err(MetaError::NotDir)));
    assert!(matches!(
        e.create(a.ino, b"x", &file(), None, None),
        Err(MetaError::NotDir)
    ));
    let long = vec![b'a'; 256];
    assert!(matches!(
        e.create(ROOT_INO, &long, &file(), None, None),
        Err(MetaError::NameTooLong)
    ));
    let ok = vec![b'b'; 255];
    e.create(ROOT_INO, &ok, &file(), None, None).unwrap();
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    assert_eq!(d.nlink, 2);
    assert_eq!(e.getattr(ROOT_INO).unwrap().nlink, 3);
    let fifo = NewNode {
        kind: Kind::Fifo,
        ..file()
    };
    assert_eq!(
        e.create(d.ino, b"p", &fifo, None, None).unwrap().kind,
        Kind::Fifo
    );
}

fn setattr_and_truncate(e: &dyn MetaEngine) {
    let a = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    let mib = 1u64 << 20;
    e.commit_slices(
        a.ino,
        &[obj_slice(0, 0, mib, 1), obj_slice(1, 0, mib, 2)],
        2 * mib,
        5,
    )
    .unwrap();
    let b = e.getattr(a.ino).unwrap();
    assert_eq!(b.size, 2 * mib);
    assert!(b.data_version > a.data_version);
    let c = e
        .setattr(
            a.ino,
            &SetAttr {
                size: Some(100),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(c.size, 100);
    assert!(
        e.read_chunk(a.ino, 1).unwrap().is_empty(),
        "chunk beyond the end is freed"
    );
    let tail = e.read_chunk(a.ino, 0).unwrap();
    let last = tail.last().unwrap();
    assert_eq!(
        (last.off, last.data.clone()),
        (100, SliceData::Zero),
        "tail is zeroed"
    );
    assert_eq!(
        e.trash(100, OPEN_TRASH_GRACE).unwrap().len(),
        1,
        "the freed object is in the trash"
    );
    let d = e
        .setattr(
            a.ino,
            &SetAttr {
                perm: Some(0o4700),
                uid: Some(5),
                gid: Some(6),
                atime: Some(TimeSet::At(1_000)),
                mtime: Some(TimeSet::At(2_000)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        (d.perm, d.uid, d.gid, d.atime, d.mtime),
        (0o4700, 5, 6, 1_000, 2_000)
    );
    assert!(d.ctime > 2_000);
    // kill_setid (a chown by root): setuid goes, setgid only with group-execute, a
    // directory keeps both, and an explicit perm wins.
    let chown_kill = |ino, perm| {
        e.setattr(
            ino,
            &SetAttr {
                perm: Some(perm),
                ..Default::default()
            },
        )
        .unwrap();
        e.setattr(
            ino,
            &SetAttr {
                uid: Some(7),
                kill_setid: true,
                ..Default::default()
            },
        )
        .unwrap()
        .perm
    };
    assert_eq!(chown_kill(a.ino, 0o6755), 0o755);
    assert_eq!(chown_kill(a.ino, 0o6745), 0o2745);
    assert_eq!(chown_kill(a.ino, 0o644), 0o644);
    let sd = e.create(ROOT_INO, b"sd", &dir(), None, None).unwrap();
    assert_eq!(chown_kill(sd.ino, 0o6755), 0o6755);
    let kept = e
        .setattr(
            a.ino,
            &SetAttr {
                perm: Some(0o4711),
                uid: Some(8),
                kill_setid: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((kept.perm, kept.uid), (0o4711, 8));
    // chown(-1, -1) by root: nothing set but the kill; the ctime moves only when it drops a bit
    let only_kill = SetAttr {
        kill_setid: true,
        ..Default::default()
    };
    assert_eq!(e.setattr(a.ino, &only_kill).unwrap().perm, 0o711);
    let before = e.getattr(a.ino).unwrap();
    let same = e.setattr(a.ino, &only_kill).unwrap();
    assert_eq!((same.perm, same.ctime), (0o711, before.ctime));
    assert_eq!(e.getattr(a.ino).unwrap().perm, 0o711);
    let dd = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    assert!(matches!(
        e.setattr(
            dd.ino,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        ),
        Err(MetaError::IsDir)
    ));
}

fn commit_then_setattr(e: &dyn MetaEngine) {
    let a = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    let bytes = b"hello".to_vec();
    let inline = inline_slice(&bytes);
    // tar's utimensat over buffered writes: the data and the given times, one transaction
    let times = SetAttr {
        atime: Some(TimeSet::At(1_000)),
        mtime: Some(TimeSet::At(2_000)),
        ..Default::default()
    };
    let b = e
        .commit_slices_then(None, a.ino, &[inline], 5, 9_000, &times)
        .unwrap();
    assert_eq!((b.size, b.atime, b.mtime), (5, 1_000, 2_000));
    assert!(b.data_version > a.data_version);
    assert!(b.ctime > 2_000, "ctime is the setattr's now");
    assert_eq!(e.getattr(a.ino).unwrap(), b);
    let sl = e.read_chunk(a.ino, 0).unwrap();
    assert_eq!(sl.len(), 1);
    assert_eq!(sl[0].data, SliceData::Inline(bytes));
    // an error of the setattr rolls the commit back too
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    let g = e
        .create(ROOT_INO, b"g", &file(), Some(layout()), None)
        .unwrap();
    let bad = SetAttr {
        size: Some(1),
        ..Default::default()
    };
    assert!(matches!(
        e.commit_slices_then(None, d.ino, &[], 5, 9_000, &bad),
        Err(MetaError::IsDir)
    ));
    let chown_trunc = SetAttr {
        uid: Some(3),
        size: Some(0),
        ..Default::default()
    };
    e.setattr(
        g.ino,
        &SetAttr {
            perm: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    let before = e.getattr(g.ino).unwrap();
    let dirty = inline_slice(b"abc");
    // refused: a size change of a special file
    let fifo = e
        .create(
            ROOT_INO,
            b"p",
            &NewNode {
                kind: Kind::Fifo,
                ..file()
            },
            None,
            None,
        )
        .unwrap();
    assert!(e
        .commit_slices_then(
            None,
            fifo.ino,
            std::slice::from_ref(&dirty),
            3,
            9_000,
            &chown_trunc
        )
        .is_err());
    assert!(e.read_chunk(fifo.ino, 0).unwrap().is_empty(), "rolled back");
    assert_eq!(e.getattr(fifo.ino).unwrap().uid, fifo.uid, "rolled back");
    // a session that ended: nothing recorded, as commit_slices_for
    assert!(matches!(
        e.commit_slices_then(Some(424_242), g.ino, &[dirty], 3, 9_000, &chown_trunc),
        Err(MetaError::SessionEnded(_))
    ));
    assert_eq!(e.getattr(g.ino).unwrap(), before);
}

/// A setattr with expected old values ([`SetAttr::unless_changed`]: a change a client kept to
/// commit with the file's data) applies each of its mode, owner and group only where the file
/// still has the expected value; its times and the data always.
fn a_kept_change_gives_way_to_a_newer_one(e: &dyn MetaEngine) {
    let a = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    let kept = SetAttr {
        perm: Some(0o644),
        uid: Some(7),
        gid: Some(8),
        mtime: Some(TimeSet::At(2_000)),
        unless_changed: Some(AttrBase {
            perm: Some(a.perm),
            uid: Some(a.uid),
            gid: Some(a.gid),
        }),
        ..Default::default()
    };
    // another client's chmod meanwhile: it stays; the owner, group and times still apply
    e.setattr(
        a.ino,
        &SetAttr {
            perm: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    let b = e
        .commit_slices_then(None, a.ino, &[inline_slice(b"abc")], 3, 9_000, &kept)
        .unwrap();
    assert_eq!(
        (b.perm, b.uid, b.gid, b.mtime, b.size),
        (0o600, 7, 8, 2_000, 3)
    );
    assert_eq!(e.getattr(a.ino).unwrap(), b);
    // nothing changed meanwhile: all of it applies; alone (no data) as well
    let g = e
        .create(ROOT_INO, b"g", &file(), Some(layout()), None)
        .unwrap();
    let kept_g = SetAttr {
        unless_changed: Some(AttrBase {
            perm: Some(g.perm),
            uid: Some(g.uid),
            gid: Some(g.gid),
        }),
        ..kept.clone()
    };
    let b = e.setattr(g.ino, &kept_g).unwrap();
    assert_eq!((b.perm, b.uid, b.gid, b.mtime), (0o644, 7, 8, 2_000));
    // an owner changed elsewhere: the kept chown's owner goes, and with it its clearing of
    // setuid (set elsewhere too, after the change was kept)
    let h = e
        .create(ROOT_INO, b"h", &file(), Some(layout()), None)
        .unwrap();
    e.setattr(
        h.ino,
        &SetAttr {
            uid: Some(9),
            perm: Some(0o4755),
            ..Default::default()
        },
    )
    .unwrap();
    let chown = SetAttr {
        uid: Some(7),
        kill_setid: true,
        unless_changed: Some(AttrBase {
            uid: Some(h.uid),
            ..Default::default()
        }),
        ..Default::default()
    };
    let b = e.setattr(h.ino, &chown).unwrap();
    assert_eq!((b.uid, b.perm), (9, 0o4755));
}

fn unlink_rmdir_nlink(e: &dyn MetaEngine) {
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    let f = e
        .create(d.ino, b"f", &file(), Some(layout()), None)
        .unwrap();
    assert!(matches!(e.rmdir(ROOT_INO, b"d"), Err(MetaError::NotEmpty)));
    assert!(matches!(e.unlink(ROOT_INO, b"d"), Err(MetaError::IsDir)));
    assert!(matches!(e.rmdir(d.ino, b"f"), Err(MetaError::NotDir)));
    // a second name first: the unlink tells which inode each name was
    e.link(f.ino, ROOT_INO, b"f2").unwrap();
    assert_eq!(e.unlink(ROOT_INO, b"f2").unwrap(), f.ino);
    assert_eq!(e.unlink(d.ino, b"f").unwrap(), f.ino);
    assert!(matches!(e.getattr(f.ino), Err(MetaError::NotFound)));
    // no such name in a directory, and a lookup in a directory that is gone, differ
    assert!(matches!(e.lookup(d.ino, b"f"), Err(MetaError::NotFound)));
    e.rmdir(ROOT_INO, b"d").unwrap();
    assert!(matches!(e.lookup(d.ino, b"f"), Err(MetaError::StaleDir)));
    let g = e.create(ROOT_INO, b"g", &file(), None, None).unwrap();
    assert!(matches!(e.lookup(g.ino, b"f"), Err(MetaError::NotDir)));
    e.unlink(ROOT_INO, b"g").unwrap();
    assert_eq!(e.getattr(ROOT_INO).unwrap().nlink, 2);
    assert!(matches!(e.unlink(ROOT_INO, b"d"), Err(MetaError::NotFound)));
}

fn rename_cases(e: &dyn MetaEngine) {
    let a = e.create(ROOT_INO, b"a", &dir(), None, None).unwrap();
    let b = e.create(ROOT_INO, b"b", &dir(), None, None).unwrap();
    let f = e.create(a.ino, b"f", &file(), None, None).unwrap();
    let g = e.create(b.ino, b"g", &file(), None, None).unwrap();
    // across directories, over an existing file: the rename tells which inode it replaced
    assert_eq!(e.rename(a.ino, b"f", b.ino, b"g", 0).unwrap(), Some(g.ino));
    assert_eq!(e.lookup(b.ino, b"g").unwrap().ino, f.ino);
    // the replaced file has no name, and is gone once its grace is over
    // (replaced_file_stays_openable_for_its_grace checks the grace itself)
    assert_eq!(e.getattr(g.ino).unwrap().nlink, 0);
    e.purge_orphans(now_nanos() + 1).unwrap();
    assert!(matches!(e.getattr(g.ino), Err(MetaError::NotFound)));
    // onto a free name, and onto itself: nothing replaced
    assert_eq!(e.rename(b.ino, b"g", b.ino, b"g2", 0).unwrap(), None);
    assert_eq!(e.rename(b.ino, b"g2", b.ino, b"g", 0).unwrap(), None);
    assert_eq!(e.rename(b.ino, b"g", b.ino, b"g", 0).unwrap(), None);
    // NOREPLACE
    e.create(b.ino, b"h", &file(), None, None).unwrap();
    assert!(matches!(
        e.rename(b.ino, b"g", b.ino, b"h", libc::RENAME_NOREPLACE),
        Err(MetaError::Exists)
    ));
    // EXCHANGE a file and a directory across parents: nlink of parents moves
    let sub = e.create(a.ino, b"sub", &dir(), None, None).unwrap();
    let a_before = e.getattr(a.ino).unwrap().nlink;
    let b_before = e.getattr(b.ino).unwrap().nlink;
    // (an exchange replaces nothing)
    assert_eq!(
        e.rename(a.ino, b"sub", b.ino, b"g", libc::RENAME_EXCHANGE)
            .unwrap(),
        None
    );
    assert_eq!(e.lookup(b.ino, b"g").unwrap().ino, sub.ino);
    assert_eq!(e.lookup(a.ino, b"sub").unwrap().ino, f.ino);
    assert_eq!(e.getattr(a.ino).unwrap().nlink, a_before - 1);
    assert_eq!(e.getattr(b.ino).unwrap().nlink, b_before + 1);
    assert_eq!(e.getattr(sub.ino).unwrap().parent, b.ino);
    // a directory over an empty directory; over a non-empty one fails
    let empty = e.create(ROOT_INO, b"empty", &dir(), None, None).unwrap();
    assert_eq!(
        e.rename(b.ino, b"g", ROOT_INO, b"empty", 0).unwrap(),
        Some(empty.ino)
    );
    assert!(matches!(e.getattr(empty.ino), Err(MetaError::NotFound)));
    assert!(matches!(
        e.rename(ROOT_INO, b"a", ROOT_INO, b"b", 0),
        Err(MetaError::NotEmpty)
    ));
    // into its own subtree
    assert!(matches!(
        e.rename(ROOT_INO, b"b", b.ino, b"x", 0),
        Err(MetaError::Invalid(_))
    ));
    // file over directory and directory over file
    assert!(matches!(
        e.rename(a.ino, b"sub", ROOT_INO, b"b", 0),
        Err(MetaError::IsDir)
    ));
    assert!(matches!(
        e.rename(ROOT_INO, b"b", a.ino, b"sub", 0),
        Err(MetaError::NotDir)
    ));
    // exchange needs both
    assert!(matches!(
        e.rename(ROOT_INO, b"b", ROOT_INO, b"zz", libc::RENAME_EXCHANGE),
        Err(MetaError::NotFound)
    ));
}

fn readdir_pages(e: &dyn MetaEngine) {
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    for i in 0..250 {
        e.create(d.ino, format!("n{i}").as_bytes(), &file(), None, None)
            .unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut off = 0;
    loop {
        let page = e.readdir(d.ino, off, 64).unwrap();
        if page.is_empty() {
            break;
        }
        off = page.last().unwrap().offset;
        for ent in page {
            assert!(seen.insert(ent.name));
        }
    }
    assert_eq!(seen.len(), 250);
    e.unlink(d.ino, b"n0").unwrap();
    assert_eq!(e.readdir(d.ino, 0, 1000).unwrap().len(), 249);
}

/// readdir_plus gives, page by page, the entries readdir gives (same names, inodes, kinds and
/// cursors) and for each the attributes lookup gives, hard links and a changed inode included.
fn readdir_plus_matches_lookup(e: &dyn MetaEngine) {
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    let f = e.create(d.ino, b"f", &file(), None, None).unwrap();
    e.create(d.ino, b"sub", &dir(), None, None).unwrap();
    e.link(f.ino, d.ino, b"f2").unwrap();
    for i in 0..150 {
        e.create(d.ino, format!("n{i}").as_bytes(), &file(), None, None)
            .unwrap();
    }
    e.unlink(d.ino, b"n7").unwrap();
    let set = SetAttr {
        perm: Some(0o600),
        size: Some(123),
        ..Default::default()
    };
    e.setattr(f.ino, &set).unwrap();
    let (mut off, mut plus_off, mut n) = (0, 0, 0);
    loop {
        let page = e.readdir(d.ino, off, 16).unwrap();
        let plus = e.readdir_plus(d.ino, plus_off, 16).unwrap();
        let entries: Vec<DirEntry> = plus.iter().map(|(ent, _)| ent.clone()).collect();
        assert_eq!(entries, page);
        if page.is_empty() {
            break;
        }
        off = page.last().unwrap().offset;
        plus_off = plus.last().unwrap().0.offset;
        for (ent, a) in plus {
            assert_eq!(a, e.lookup(d.ino, &ent.name).unwrap(), "{:?}", ent.name);
            n += 1;
        }
    }
    assert_eq!(n, 152);
    let f2 = e.readdir_plus(d.ino, 0, 1000).unwrap();
    let f2 = f2.iter().find(|(ent, _)| ent.name == b"f2").unwrap();
    assert_eq!((f2.1.nlink, f2.1.size, f2.1.perm & 0o7777), (2, 123, 0o600));
    // A missing directory or a file is refused as readdir refuses it.
    assert!(matches!(
        e.readdir_plus(f.ino, 0, 10),
        Err(MetaError::NotDir)
    ));
    assert!(matches!(
        e.readdir_plus(1 << 40, 0, 10),
        Err(MetaError::NotFound)
    ));
}

fn symlink_and_link(e: &dyn MetaEngine) {
    let s = NewNode {
        kind: Kind::Symlink,
        symlink: Some(b"/some/where".to_vec()),
        ..file()
    };
    let a = e.create(ROOT_INO, b"s", &s, None, None).unwrap();
    assert_eq!(a.size, 11);
    assert_eq!(e.readlink(a.ino).unwrap(), b"/some/where");
    let f = e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
    assert!(matches!(e.readlink(f.ino), Err(MetaError::Invalid(_))));
    let l = e.link(f.ino, ROOT_INO, b"f2").unwrap();
    assert_eq!(l.nlink, 2);
    e.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(e.getattr(f.ino).unwrap().nlink, 1);
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    assert!(matches!(
        e.link(d.ino, ROOT_INO, b"d2"),
        Err(MetaError::NotPermitted)
    ));
}

fn xattrs(e: &dyn MetaEngine) {
    let f = e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
    assert!(matches!(
        e.getxattr(f.ino, b"user.a"),
        Err(MetaError::NoAttr)
    ));
    e.setxattr(f.ino, b"user.a", b"1", 0).unwrap();
    assert!(matches!(
        e.setxattr(f.ino, b"user.a", b"2", libc::XATTR_CREATE),
        Err(MetaError::Exists)
    ));
    assert!(matches!(
        e.setxattr(f.ino, b"user.b", b"2", libc::XATTR_REPLACE),
        Err(MetaError::NoAttr)
    ));
    e.setxattr(f.ino, b"user.a", b"3", libc::XATTR_REPLACE)
        .unwrap();
    e.setxattr(f.ino, b"user.b", b"", 0).unwrap();
    assert_eq!(e.getxattr(f.ino, b"user.a").unwrap(), b"3");
    assert_eq!(
        e.listxattr(f.ino).unwrap(),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    e.removexattr(f.ino, b"user.a").unwrap();
    assert!(matches!(
        e.removexattr(f.ino, b"user.a"),
        Err(MetaError::NoAttr)
    ));
    assert!(matches!(
        e.removexattr(f.ino + 1000, b"user.b"),
        Err(MetaError::NotFound)
    ));
    assert_eq!(e.getxattr(f.ino, b"user.b").unwrap(), b"");
}

/// Schema v9: every attribute reply carries the inode's xattr count, which setxattr and
/// removexattr keep in their transaction (clients answer "no such attribute" from a count of
/// 0 without reading the engine).
fn xattr_count_rides_with_the_attributes(e: &dyn MetaEngine) {
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    let f = e.create(d.ino, b"f", &file(), None, None).unwrap();
    assert_eq!((d.xattr_count, f.xattr_count), (0, 0));
    assert!(!f.has_xattrs());
    let count = |ino| e.getattr(ino).unwrap().xattr_count;
    e.setxattr(f.ino, b"user.a", b"1", 0).unwrap();
    assert_eq!(count(f.ino), 1);
    assert!(e.getattr(f.ino).unwrap().has_xattrs());
    // A replaced value, and calls that fail, count nothing.
    e.setxattr(f.ino, b"user.a", b"2", libc::XATTR_REPLACE)
        .unwrap();
    e.setxattr(f.ino, b"user.a", b"3", 0).unwrap();
    assert!(e
        .setxattr(f.ino, b"user.a", b"4", libc::XATTR_CREATE)
        .is_err());
    assert!(e
        .setxattr(f.ino, b"user.b", b"4", libc::XATTR_REPLACE)
        .is_err());
    assert!(e.removexattr(f.ino, b"user.none").is_err());
    assert_eq!(count(f.ino), 1);
    e.setxattr(f.ino, b"system.posix_acl_access", b"acl", 0)
        .unwrap();
    assert_eq!(count(f.ino), 2);
    // Every reply with attributes carries it: lookup, listing, setattr, link, rename.
    assert_eq!(e.lookup(d.ino, b"f").unwrap().xattr_count, 2);
    let plus = e.readdir_plus(d.ino, 0, 10).unwrap();
    assert_eq!(plus.len(), 1);
    assert_eq!(plus[0].1.xattr_count, 2);
    let set = SetAttr {
        perm: Some(0o600),
        ..Default::default()
    };
    assert_eq!(e.setattr(f.ino, &set).unwrap().xattr_count, 2);
    assert_eq!(e.link(f.ino, ROOT_INO, b"h").unwrap().xattr_count, 2);
    e.rename(d.ino, b"f", ROOT_INO, b"g", 0).unwrap();
    assert_eq!(e.lookup(ROOT_INO, b"g").unwrap().xattr_count, 2);
    assert_eq!(count(d.ino), 0, "the directory has none of its own");
    e.removexattr(f.ino, b"user.a").unwrap();
    assert_eq!(count(f.ino), 1);
    e.removexattr(f.ino, b"system.posix_acl_access").unwrap();
    assert_eq!(count(f.ino), 0);
    assert!(e.listxattr(f.ino).unwrap().is_empty());
    // Directories count theirs too (a default ACL is one).
    e.setxattr(d.ino, b"system.posix_acl_default", b"acl", 0)
        .unwrap();
    assert_eq!(e.lookup(ROOT_INO, b"d").unwrap().xattr_count, 1);
    // A new inode starts at 0 whatever its parent has.
    let c = e.create(d.ino, b"c", &file(), None, None).unwrap();
    assert_eq!(c.xattr_count, 0);
    // fsck's recount agrees with every count kept above (f: 0, d: 1, c: 0).
    e.setxattr(c.ino, b"user.z", b"1", 0).unwrap();
    let off: Vec<_> = e
        .meta_issues(i64::MAX / 2)
        .unwrap()
        .into_iter()
        .filter(|i| matches!(i, MetaIssue::XattrCount { .. }))
        .collect();
    assert!(off.is_empty(), "{off:?}");
}

fn slices_and_commit_order(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    let first = e.alloc_object_ids(10).unwrap();
    let second = e.alloc_object_ids(10).unwrap();
    assert!(second >= first + 10, "object id ranges never overlap");
    // Two writers: the later commit wins, whatever its object id.
    e.commit_slices(f.ino, &[obj_slice(0, 0, 100, second)], 100, 1)
        .unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 50, 100, first)], 150, 2)
        .unwrap();
    let s = e.read_chunk(f.ino, 0).unwrap();
    assert_eq!(s.len(), 2);
    assert!(s[0].seq < s[1].seq);
    assert_eq!(
        s[1].data,
        SliceData::Object {
            target: 0,
            obj: first,
            obj_off: 0,
            obj_size: 100
        }
    );
    assert_eq!(e.getattr(f.ino).unwrap().size, 150);
    // size never shrinks by a commit
    e.commit_slices(f.ino, &[obj_slice(0, 0, 10, second + 1)], 10, 3)
        .unwrap();
    assert_eq!(e.getattr(f.ino).unwrap().size, 150);
    let inline = Slice {
        seq: 0,
        chunk: 0,
        off: 0,
        len: 3,
        data: SliceData::Inline(b"abc".to_vec()),
    };
    e.commit_slices(f.ino, &[inline], 3, 4).unwrap();
    assert_eq!(
        e.read_chunk(f.ino, 0).unwrap().last().unwrap().data,
        SliceData::Inline(b"abc".to_vec())
    );
    assert!(e.targets().unwrap()[0].used >= 210);
    let p = e.fallocate(f.ino, 0, 4096, false, false).unwrap();
    assert_eq!(p.size, 4096);
    let k = e.fallocate(f.ino, 0, 8192, true, false).unwrap();
    assert_eq!(k.size, 4096);
}

/// Sessions registered for a check that records opens or locks (recorded only under a live
/// session): `[0, first, second, ...]`, so that `s[k]` stands for the k-th.
fn live_sessions(e: &dyn MetaEngine, n: usize) -> Vec<u64> {
    let mut v = vec![0];
    for k in 1..=n {
        v.push(
            e.register_session(&SessionInfo {
                id: 0,
                client_name: format!("client{k}"),
                host: "h".into(),
                pid: k as u32,
                mountpoint: "/mnt".into(),
                version: "0".into(),
                started: 0,
                heartbeat: 0,
            })
            .unwrap(),
        );
    }
    v
}

/// Objects a file drops while some client keeps it open wait in the trash for the grace, not
/// for the last close (a file that is never closed would keep them all).
fn trash_of_a_file_kept_open_goes_after_a_grace(e: &dyn MetaEngine) {
    let s = live_sessions(e, 1);
    let f = e
        .create(ROOT_INO, b"kept", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 10, 7)], 10, 1)
        .unwrap();
    e.open_file(s[1], f.ino).unwrap();
    let to_zero = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    e.setattr(f.ino, &to_zero).unwrap();
    assert!(
        e.trash(10, OPEN_TRASH_GRACE).unwrap().is_empty(),
        "an open file's dropped object waits for the grace"
    );
    std::thread::sleep(std::time::Duration::from_millis(5));
    let t = e.trash(10, std::time::Duration::from_millis(1)).unwrap();
    assert_eq!(
        t.iter().map(|i| i.obj).collect::<Vec<_>>(),
        vec![7],
        "past the grace it goes, though the file is still open"
    );
    e.close_files(s[1], &[f.ino]).unwrap();
    assert_eq!(
        e.trash(10, OPEN_TRASH_GRACE).unwrap().len(),
        1,
        "closed: at once"
    );
    e.trash_done(&[t[0].id]).unwrap();
    assert!(e.trash(10, std::time::Duration::ZERO).unwrap().is_empty());
}

fn open_unlinked_file_survives(e: &dyn MetaEngine) {
    let s = live_sessions(e, 2);
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 10, 7)], 10, 1)
        .unwrap();
    e.open_file(s[1], f.ino).unwrap();
    e.open_file(s[2], f.ino).unwrap();
    // Session 2 opens it twice: one close leaves it open there.
    e.open_file(s[2], f.ino).unwrap();
    e.unlink(ROOT_INO, b"f").unwrap();
    assert!(e.lookup(ROOT_INO, b"f").is_err());
    assert_eq!(
        e.read_chunk(f.ino, 0).unwrap().len(),
        1,
        "data stays while open"
    );
    assert!(e.trash(10, OPEN_TRASH_GRACE).unwrap().is_empty());
    e.close_files(s[1], &[f.ino]).unwrap();
    assert!(e.getattr(f.ino).is_ok(), "client 2 still has it open");
    e.close_files(s[2], &[f.ino]).unwrap();
    assert!(e.getattr(f.ino).is_ok(), "client 2 still has it open once");
    e.close_files(s[2], &[f.ino]).unwrap();
    assert!(matches!(e.getattr(f.ino), Err(MetaError::NotFound)));
    // left for the purge, which waits UNLINK_GRACE from the unlink
    assert_eq!(
        e.purge_unlinked(64, now_nanos() - 3_600_000_000_000)
            .unwrap(),
        0
    );
    assert!(
        e.read_chunk(f.ino, 1).unwrap().is_empty(),
        "a hole of a file not purged yet"
    );
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    // purged: its data is gone, not a hole (a reader must not get zeros)
    for c in [0, 1] {
        assert!(
            matches!(e.read_chunk(f.ino, c), Err(MetaError::NotFound)),
            "chunk {c} of a purged file"
        );
    }
    let t = e.trash(10, OPEN_TRASH_GRACE).unwrap();
    assert_eq!(t.len(), 1);
    let used = e.targets().unwrap()[0].used;
    e.trash_done(&[t[0].id]).unwrap();
    assert_eq!(e.targets().unwrap()[0].used, used - 10);
    assert!(e.trash(10, OPEN_TRASH_GRACE).unwrap().is_empty());
}

/// A client's batch of open and close records (`record_opens_closes`), the opens answered
/// before they were recorded: a file unlinked in between, left for the purge, which waits
/// `UNLINK_GRACE` (by the unlink's ctime), becomes an open orphan when the open lands, lives
/// through it and goes at its last close; a file already purged is reported gone; an open and
/// its close in one batch leave nothing open.
fn an_open_recorded_late_keeps_a_file_unlinked_meanwhile(e: &dyn MetaEngine) {
    let s = live_sessions(e, 2);
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 10, 7)], 10, 1)
        .unwrap();
    // client 1 answered an open of f; client 2 unlinks it before client 1's batch lands
    e.unlink(ROOT_INO, b"f").unwrap();
    assert!(matches!(e.getattr(f.ino), Err(MetaError::NotFound)));
    let long_ago = now_nanos() - 3_600_000_000_000;
    assert_eq!(
        e.purge_unlinked(64, long_ago).unwrap(),
        0,
        "unlinked within the grace: not purged"
    );
    // (two opens of it in the batch: both recorded)
    assert_eq!(
        e.record_opens_closes(s[1], &[f.ino, f.ino], &[]).unwrap(),
        vec![]
    );
    assert_eq!(
        e.getattr(f.ino).unwrap().size,
        10,
        "usable through the open"
    );
    assert_eq!(e.read_chunk(f.ino, 0).unwrap().len(), 1);
    assert!(e.lookup(ROOT_INO, b"f").is_err(), "its name stays gone");
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 0, "open");
    assert_eq!(e.record_opens_closes(s[1], &[], &[f.ino]).unwrap(), vec![]);
    assert!(e.getattr(f.ino).is_ok(), "open once more");
    assert_eq!(e.record_opens_closes(s[1], &[], &[f.ino]).unwrap(), vec![]);
    assert!(matches!(e.getattr(f.ino), Err(MetaError::NotFound)));
    assert_eq!(
        e.purge_unlinked(64, now_nanos() + 1).unwrap(),
        1,
        "after the last close"
    );
    assert_eq!(trashed(e), vec![7]);
    // purged before the open's record landed: reported gone, nothing recorded
    let g = e
        .create(ROOT_INO, b"g", &file(), Some(layout()), None)
        .unwrap();
    e.unlink(ROOT_INO, b"g").unwrap();
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    let h = e
        .create(ROOT_INO, b"h", &file(), Some(layout()), None)
        .unwrap();
    assert_eq!(
        e.record_opens_closes(s[2], &[g.ino, h.ino], &[]).unwrap(),
        vec![g.ino]
    );
    // h is open on client 2: its unlink keeps it
    e.unlink(ROOT_INO, b"h").unwrap();
    assert!(e.getattr(h.ino).is_ok(), "open on client 2");
    // an open and its close in one batch: nothing stays open
    let k = e
        .create(ROOT_INO, b"k", &file(), Some(layout()), None)
        .unwrap();
    e.record_opens_closes(s[2], &[k.ino], &[k.ino, h.ino])
        .unwrap();
    assert!(
        matches!(e.getattr(h.ino), Err(MetaError::NotFound)),
        "h's last close"
    );
    e.unlink(ROOT_INO, b"k").unwrap();
    assert_eq!(
        e.purge_unlinked(64, now_nanos() + 1).unwrap(),
        2,
        "h, and k open nowhere"
    );
    // unlinked while open on client 2, whose close lands before client 1's open: the last
    // recorded close leaves it for the purge, and client 1's open keeps it
    let n = e
        .create(ROOT_INO, b"n", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(n.ino, &[obj_slice(0, 0, 10, 9)], 10, 1)
        .unwrap();
    e.open_file(s[2], n.ino).unwrap();
    e.unlink(ROOT_INO, b"n").unwrap();
    e.close_files(s[2], &[n.ino]).unwrap();
    assert!(matches!(e.getattr(n.ino), Err(MetaError::NotFound)));
    assert_eq!(e.purge_unlinked(64, long_ago).unwrap(), 0, "in its grace");
    assert_eq!(e.record_opens_closes(s[1], &[n.ino], &[]).unwrap(), vec![]);
    assert_eq!(e.read_chunk(n.ino, 0).unwrap().len(), 1);
    assert_eq!(e.getattr(n.ino).unwrap().size, 10);
    e.close_files(s[1], &[n.ino]).unwrap();
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    // an ended session records nothing
    e.unregister_session(s[2]).unwrap();
    let m = e
        .create(ROOT_INO, b"m", &file(), Some(layout()), None)
        .unwrap();
    assert!(matches!(
        e.record_opens_closes(s[2], &[m.ino], &[]),
        Err(MetaError::SessionEnded(_))
    ));
}

/// The objects in the trash (any age), sorted.
fn trashed(e: &dyn MetaEngine) -> Vec<u64> {
    let mut v: Vec<u64> = e
        .trash(100, std::time::Duration::ZERO)
        .unwrap()
        .iter()
        .map(|t| t.obj)
        .collect();
    v.sort_unstable();
    v
}

/// A file whose last name goes while nobody has it open is gone at once for every request and
/// for `usage`, and freed by `purge_unlinked` in batches: its objects reach the trash then.
/// A file unlinked while open is not the purge's: its last close frees it.
fn unlinked_files_are_freed_by_the_purge(e: &dyn MetaEngine) {
    let s = live_sessions(e, 1);
    let base = e.usage().unwrap();
    let mut files = Vec::new();
    for i in 0..5u64 {
        let f = e
            .create(
                ROOT_INO,
                format!("f{i}").as_bytes(),
                &file(),
                Some(layout()),
                None,
            )
            .unwrap();
        e.commit_slices(
            f.ino,
            &[inline_slice(&[i as u8; 3000]), obj_slice(1, 0, 10, 100 + i)],
            (1 << 20) + 10,
            1,
        )
        .unwrap();
        e.setxattr(f.ino, b"user.a", b"v", 0).unwrap();
        files.push(f);
    }
    let held = e
        .create(ROOT_INO, b"held", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(held.ino, &[obj_slice(0, 0, 10, 200)], 10, 1)
        .unwrap();
    e.open_file(s[1], held.ino).unwrap();
    // a second name: unlinking one of two names frees nothing
    e.link(files[0].ino, ROOT_INO, b"f0-too").unwrap();
    let full = e.usage().unwrap();
    assert_eq!(full.inodes, base.inodes + 6);
    assert_eq!(e.inodes_used().unwrap(), full.inodes, "statfs's count");
    // inline bytes, and the objects' bytes on their targets
    assert_eq!(full.bytes, base.bytes + 5 * 3000 + 6 * 10);
    e.unlink(ROOT_INO, b"f0-too").unwrap();
    assert_eq!(e.getattr(files[0].ino).unwrap().nlink, 1);
    assert_eq!(
        e.purge_unlinked(64, now_nanos() + 1).unwrap(),
        0,
        "f0 still has a name"
    );
    for i in 0..5 {
        e.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    e.unlink(ROOT_INO, b"held").unwrap();
    // gone for every request at once
    for f in &files {
        assert!(matches!(e.getattr(f.ino), Err(MetaError::NotFound)));
        assert!(matches!(e.open_file(s[1], f.ino), Err(MetaError::NotFound)));
        assert!(matches!(
            e.link(f.ino, ROOT_INO, b"back"),
            Err(MetaError::NotFound)
        ));
        assert!(matches!(
            e.setattr(
                f.ino,
                &SetAttr {
                    perm: Some(0o600),
                    ..Default::default()
                }
            ),
            Err(MetaError::NotFound)
        ));
    }
    assert!(e.lookup(ROOT_INO, b"back").is_err());
    // and for `usage`: neither their inodes nor their inline bytes
    let after = e.usage().unwrap();
    assert_eq!(after.inodes, base.inodes + 1, "only the open one counts");
    assert_eq!(e.inodes_used().unwrap(), after.inodes, "statfs's count");
    assert_eq!(
        after.bytes,
        base.bytes + 6 * 10,
        "objects count until the trash removes them"
    );
    // their objects reach the trash at the purge, not at the unlink
    assert_eq!(trashed(e), Vec::<u64>::new());
    // in batches of at most `max`; the open one is not the purge's
    assert_eq!(e.purge_unlinked(2, now_nanos() + 1).unwrap(), 2);
    assert_eq!(trashed(e).len(), 2);
    assert_eq!(e.purge_unlinked(2, now_nanos() + 1).unwrap(), 2);
    assert_eq!(e.purge_unlinked(2, now_nanos() + 1).unwrap(), 1);
    assert_eq!(e.purge_unlinked(2, now_nanos() + 1).unwrap(), 0);
    assert_eq!(trashed(e), vec![100, 101, 102, 103, 104]);
    assert_eq!(e.usage().unwrap(), after, "the purge changes no count");
    assert!(e.meta_issues(i64::MAX).unwrap().is_empty());
    // the open one stays usable, and its last close frees it
    assert_eq!(e.getattr(held.ino).unwrap().nlink, 0);
    assert_eq!(e.read_chunk(held.ino, 0).unwrap().len(), 1);
    e.close_files(s[1], &[held.ino]).unwrap();
    assert!(matches!(e.getattr(held.ino), Err(MetaError::NotFound)));
    assert_eq!(
        e.usage().unwrap().inodes,
        base.inodes,
        "gone for every count"
    );
    assert_eq!(e.inodes_used().unwrap(), base.inodes);
    // left for the purge (UNLINK_GRACE from its unlink)
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    assert_eq!(trashed(e), vec![100, 101, 102, 103, 104, 200]);
    assert_eq!(e.usage().unwrap().inodes, base.inodes);
    assert_eq!(e.inodes_used().unwrap(), base.inodes);
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 0);
}

/// Slices freed by compaction and by the unlink of a file that has inline bytes and objects
/// (one object read by two slices, one object another file still reads): each object no slice
/// reads any more goes to the trash once, the shared one only when its last reader goes.
/// (SQLite reads the freed slices' objects with a `SELECT` before a plain `DELETE`,
/// PostgreSQL with `DELETE ... RETURNING`: `core::common::trash_slices`.)
fn freed_slices_trash_their_objects_once(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    let g = e
        .create(ROOT_INO, b"g", &file(), Some(layout()), None)
        .unwrap();
    let mib = 1u64 << 20;
    let packed = |off: u64, obj_off: u64| Slice {
        seq: 0,
        chunk: 1,
        off,
        len: 10,
        data: SliceData::Object {
            target: 0,
            obj: 8,
            obj_off,
            obj_size: 20,
        },
    };
    e.commit_slices(
        f.ino,
        &[
            inline_slice(&[7u8; 1000]),
            packed(0, 0),
            packed(100, 10),
            obj_slice(2, 0, 10, 9),
            obj_slice(3, 0, 10, 5),
            obj_slice(3, 0, 10, 6),
        ],
        3 * mib + 10,
        1,
    )
    .unwrap();
    e.commit_slices(g.ino, &[obj_slice(0, 0, 10, 9)], 10, 1)
        .unwrap();
    // compaction of chunk 3: the older object 5 and the newer 6 go, one merged slice stays
    let newest = e.read_chunk(f.ino, 3).unwrap().last().unwrap().seq;
    assert!(e
        .replace_chunk(f.ino, 3, newest, &[obj_slice(3, 0, 10, 11)])
        .unwrap());
    assert_eq!(
        trashed(e),
        vec![5, 6],
        "compaction trashes what it replaced"
    );
    e.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(trashed(e), vec![5, 6], "nothing more until the purge");
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    assert_eq!(
        trashed(e),
        vec![5, 6, 8, 11],
        "object 8 (two slices) once, object 9 kept for g, no entry for the inline bytes"
    );
    e.unlink(ROOT_INO, b"g").unwrap();
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    assert_eq!(
        trashed(e),
        vec![5, 6, 8, 9, 11],
        "object 9 once its last reader went"
    );
}

fn replaced_file_stays_openable_for_its_grace(e: &dyn MetaEngine) {
    let s = live_sessions(e, 2);
    let write = |name: &[u8], obj: u64| {
        let f = e
            .create(ROOT_INO, name, &file(), Some(layout()), None)
            .unwrap();
        e.commit_slices(f.ino, &[obj_slice(0, 0, 10, obj)], 10, 1)
            .unwrap();
        f
    };
    // "live" is replaced by a rename while nobody has it open
    let old = write(b"live", 7);
    let new = write(b"tmp", 8);
    e.rename(ROOT_INO, b"tmp", ROOT_INO, b"live", 0).unwrap();
    assert_eq!(e.lookup(ROOT_INO, b"live").unwrap().ino, new.ino);
    // a client that looked "live" up just before still opens and reads the old version
    let a = e
        .getattr(old.ino)
        .expect("in its grace, the old file is there");
    assert_eq!((a.nlink, a.size), (0, 10));
    assert!(
        e.trash(10, OPEN_TRASH_GRACE).unwrap().is_empty(),
        "its data stays"
    );
    // purging now (grace not over) leaves it alone
    assert_eq!(e.purge_orphans(now_nanos() - 3_600_000_000_000).unwrap(), 0);
    e.open_file(s[1], old.ino).unwrap();
    assert_eq!(e.read_chunk(old.ino, 0).unwrap().len(), 1);
    // while open, even past its grace, it stays; its last close leaves it to the rest of its
    // grace (another reader may have looked the name up just before the rename too)
    assert_eq!(e.purge_orphans(now_nanos() + 1).unwrap(), 0);
    assert!(e.getattr(old.ino).is_ok());
    e.close_files(s[1], &[old.ino]).unwrap();
    assert!(
        e.getattr(old.ino).is_ok(),
        "closed within its grace: still there"
    );
    e.open_file(s[2], old.ino)
        .expect("a second reader within the grace");
    e.close_files(s[2], &[old.ino]).unwrap();
    assert_eq!(e.purge_orphans(now_nanos() - 3_600_000_000_000).unwrap(), 0);
    assert_eq!(e.purge_orphans(now_nanos() + 1).unwrap(), 1);
    assert!(matches!(e.getattr(old.ino), Err(MetaError::NotFound)));
    let t = e.trash(10, OPEN_TRASH_GRACE).unwrap();
    assert_eq!(t.iter().map(|x| x.obj).collect::<Vec<_>>(), [7]);
    e.trash_done(&[t[0].id]).unwrap();

    // replaced while its writer's close is still on the way (closes go in batches): it gets
    // the grace all the same, and is purged after it once closed
    let cur = e.lookup(ROOT_INO, b"live").unwrap();
    e.open_file(s[1], cur.ino).unwrap();
    let next = write(b"tmp1", 10);
    e.rename(ROOT_INO, b"tmp1", ROOT_INO, b"live", 0).unwrap();
    e.close_files(s[1], &[cur.ino]).unwrap();
    assert!(
        e.getattr(cur.ino).is_ok(),
        "the writer's close did not end the grace"
    );
    e.open_file(s[2], cur.ino)
        .expect("a reader that looked the name up before the rename");
    e.close_files(s[2], &[cur.ino]).unwrap();
    assert_eq!(e.purge_orphans(now_nanos() + 1).unwrap(), 1);
    assert!(matches!(e.getattr(cur.ino), Err(MetaError::NotFound)));
    let t = e.trash(10, OPEN_TRASH_GRACE).unwrap();
    assert_eq!(t.iter().map(|x| x.obj).collect::<Vec<_>>(), [8]);
    e.trash_done(&[t[0].id]).unwrap();
    let new = next;

    // replaced again, never opened: purged once its grace is over, objects to the trash
    let newer = write(b"tmp2", 9);
    e.rename(ROOT_INO, b"tmp2", ROOT_INO, b"live", 0).unwrap();
    assert!(e.getattr(new.ino).is_ok());
    assert!(e.pcc_lease(new.ino).unwrap().is_none());
    assert_eq!(e.purge_orphans(now_nanos() + 1).unwrap(), 1);
    assert!(matches!(e.getattr(new.ino), Err(MetaError::NotFound)));
    assert!(matches!(
        e.open_file(s[1], new.ino),
        Err(MetaError::NotFound)
    ));
    let t = e.trash(10, OPEN_TRASH_GRACE).unwrap();
    assert_eq!(t.iter().map(|x| x.obj).collect::<Vec<_>>(), [10]);
    assert_eq!(e.lookup(ROOT_INO, b"live").unwrap().ino, newer.ino);
    // unlink keeps its immediate semantics
    e.unlink(ROOT_INO, b"live").unwrap();
    assert!(matches!(e.getattr(newer.ino), Err(MetaError::NotFound)));
}

fn sessions_and_reaping(e: &dyn MetaEngine) {
    let s = SessionInfo {
        id: 0,
        client_name: "a".into(),
        host: "h".into(),
        pid: 1,
        mountpoint: "/mnt/a".into(),
        version: "0".into(),
        started: 0,
        heartbeat: 0,
    };
    let a = e.register_session(&s).unwrap();
    let b = e
        .register_session(&SessionInfo {
            client_name: "b".into(),
            ..s.clone()
        })
        .unwrap();
    assert_ne!(a, b);
    assert_eq!(e.sessions().unwrap().len(), 2);
    e.heartbeat(a).unwrap();
    // An orphan held open only by a session that dies is purged when it is reaped.
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    e.open_file(b, f.ino).unwrap();
    e.unlink(ROOT_INO, b"f").unwrap();
    // b silent for 600 ms, a heartbeating just before the reap of sessions silent for 300 ms:
    // a loaded machine may take a while between the heartbeat and the reap (it once took more
    // than the 10 ms this test allowed), not 300 ms.
    std::thread::sleep(std::time::Duration::from_millis(600));
    e.heartbeat(a).unwrap();
    assert_eq!(e.reap_sessions(300_000_000).unwrap(), 1);
    let left = e.sessions().unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].client_name, "a");
    assert!(matches!(e.getattr(f.ino), Err(MetaError::NotFound)));
    e.unregister_session(a).unwrap();
    assert!(e.sessions().unwrap().is_empty());
    assert!(matches!(e.heartbeat(a), Err(MetaError::NotFound)));

    // A client name is held by its live session; a stale or ended one frees it.
    let second = 1_000_000_000;
    let u = SessionInfo {
        client_name: "u".into(),
        host: "h#boot:pidns:1".into(),
        ..s.clone()
    };
    let x = e.register_session_unique(&u, second).unwrap();
    let held = e.register_session_unique(&u, second).unwrap_err();
    assert!(
        matches!(&held, MetaError::ClientNameInUse(m) if m.contains("'u'") && m.contains("host h,")),
        "{held}"
    );
    assert_eq!(held.errno(), libc::EBUSY);
    // another name is free
    let other = e
        .register_session_unique(
            &SessionInfo {
                client_name: "v".into(),
                ..u.clone()
            },
            second,
        )
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    // x's heartbeat is older than 10 ms: stale, the name may be taken
    let y = e.register_session_unique(&u, 10_000_000).unwrap();
    for id in [x, y, other] {
        e.unregister_session(id).unwrap();
    }
    // mounts of one name at once: exactly one wins
    let won: Vec<u64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| sc.spawn(|| e.register_session_unique(&u, second)))
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().unwrap().ok())
            .collect()
    });
    assert_eq!(won.len(), 1, "one of four concurrent registrations of 'u'");
    e.unregister_session(won[0]).unwrap();
    assert!(e.sessions().unwrap().is_empty());
}

/// `client_session`: the newest session of a name and its heartbeat's age by the database's
/// clock, which grows until the next heartbeat and starts again from it.
fn client_session_is_the_newest_with_its_heartbeat_age(e: &dyn MetaEngine) {
    let s = SessionInfo {
        id: 0,
        client_name: "c".into(),
        host: "h".into(),
        pid: 1,
        mountpoint: "/mnt/c".into(),
        version: "0".into(),
        started: 0,
        heartbeat: 0,
    };
    assert!(e.client_session("c").unwrap().is_none());
    let old = e.register_session(&s).unwrap();
    let new = e
        .register_session(&SessionInfo {
            pid: 2,
            ..s.clone()
        })
        .unwrap();
    let other = e
        .register_session(&SessionInfo {
            client_name: "d".into(),
            ..s.clone()
        })
        .unwrap();
    let minute = 60_000_000_000;
    let (got, age) = e.client_session("c").unwrap().unwrap();
    assert_eq!((got.id, got.pid, got.client_name.as_str()), (new, 2, "c"));
    assert!((0..minute).contains(&age), "fresh session, age {age}");
    std::thread::sleep(std::time::Duration::from_millis(60));
    let (_, aged) = e.client_session("c").unwrap().unwrap();
    assert!(
        aged >= 50_000_000 && aged < minute,
        "60 ms later, age {aged}"
    );
    e.heartbeat(new).unwrap();
    let (_, fresh) = e.client_session("c").unwrap().unwrap();
    assert!(
        fresh < aged,
        "a heartbeat restarts the age: {fresh} after {aged}"
    );
    // the age agrees with the liveness checks, all by the database's clock
    assert!(e.client_alive("c", minute).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(!e.client_alive("c", 10_000_000).unwrap());
    // the newest goes: the older one of the name is reported
    e.unregister_session(new).unwrap();
    assert_eq!(e.client_session("c").unwrap().unwrap().0.id, old);
    e.unregister_session(old).unwrap();
    assert!(e.client_session("c").unwrap().is_none());
    assert_eq!(e.client_session("d").unwrap().unwrap().0.id, other);
    e.unregister_session(other).unwrap();
}

/// Once a session has ended (reaped or evicted), nothing more is recorded under it: opens,
/// creates opened at once, closes, locks and data commits of its buffered writes fail with
/// `SessionEnded` (EIO) and leave no trace; the commit's new objects go to the trash. Ending a
/// session while another thread records opens under it leaves no open of it behind.
fn nothing_is_recorded_under_an_ended_session(e: &dyn MetaEngine) {
    let s = live_sessions(e, 2);
    let (gone, live) = (s[1], s[2]);
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), Some(gone))
        .unwrap();
    let lock = |session| LockRange {
        session,
        owner: 1,
        flock: false,
        typ: LockType::Write,
        start: 0,
        end: 10,
        pid: 1,
    };
    e.set_lock(f.ino, &lock(gone)).unwrap();
    e.unregister_session(gone).unwrap();
    let ended = |r: Result<(), MetaError>, what: &str| {
        let err = r.expect_err(what);
        assert!(
            matches!(err, MetaError::SessionEnded(id) if id == gone),
            "{what}: {err}"
        );
        assert_eq!(err.errno(), libc::EIO);
    };
    ended(e.open_file(gone, f.ino), "open");
    ended(e.close_files(gone, &[f.ino]), "close");
    ended(e.set_lock(f.ino, &lock(gone)), "lock");
    ended(
        e.create(ROOT_INO, b"g", &file(), Some(layout()), Some(gone))
            .map(|_| ()),
        "create opened",
    );
    assert!(matches!(e.lookup(ROOT_INO, b"g"), Err(MetaError::NotFound)));
    let before = e.getattr(f.ino).unwrap();
    ended(
        e.commit_slices_for(gone, f.ino, &[obj_slice(0, 0, 10, 41)], 10, 1)
            .map(|_| ()),
        "commit",
    );
    let after = e.getattr(f.ino).unwrap();
    assert_eq!(
        (after.size, after.data_version),
        (before.size, before.data_version)
    );
    assert!(e.read_chunk(f.ino, 0).unwrap().is_empty());
    let trash: Vec<u64> = e
        .trash(10, std::time::Duration::ZERO)
        .unwrap()
        .iter()
        .map(|t| t.obj)
        .collect();
    assert_eq!(trash, vec![41], "the refused commit's object is garbage");
    // a live session records all of it
    e.open_file(live, f.ino).unwrap();
    e.set_lock(f.ino, &lock(live)).unwrap();
    let a = e
        .commit_slices_for(live, f.ino, &[obj_slice(0, 0, 10, 42)], 10, 1)
        .unwrap();
    assert_eq!(a.size, 10);
    e.close_files(live, &[f.ino]).unwrap();
    // nothing of the ended session is left behind
    let hour = 3_600_000_000_000;
    assert!(e.meta_issues(hour).unwrap().is_empty());

    // Opens racing the end of their session: each lands before it (and goes with it) or
    // fails; none is left behind under the ended session.
    for round in 0..5 {
        let racer = live_sessions(e, 1)[1];
        let files: Vec<Ino> = (0..20)
            .map(|i| {
                e.create(
                    ROOT_INO,
                    format!("r{round}-{i}").as_bytes(),
                    &file(),
                    None,
                    None,
                )
                .unwrap()
                .ino
            })
            .collect();
        std::thread::scope(|sc| {
            let opener = sc.spawn(|| {
                for ino in &files {
                    if let Err(err) = e.open_file(racer, *ino) {
                        assert!(matches!(err, MetaError::SessionEnded(_)), "{err}");
                        break;
                    }
                }
            });
            std::thread::sleep(std::time::Duration::from_millis(round * 2));
            e.unregister_session(racer).unwrap();
            opener.join().unwrap();
        });
        let issues = e.meta_issues(hour).unwrap();
        assert!(issues.is_empty(), "round {round}: {issues:?}");
    }
}

/// Worker reports: replaced per session in order, listed only for live sessions, refused for
/// an ended session, gone with their session.
fn worker_reports(e: &dyn MetaEngine) {
    let s = SessionInfo {
        id: 0,
        client_name: "a".into(),
        host: "h".into(),
        pid: 1,
        mountpoint: "/mnt/a".into(),
        version: "0".into(),
        started: 0,
        heartbeat: 0,
    };
    let a = e.register_session(&s).unwrap();
    let b = e
        .register_session(&SessionInfo {
            client_name: "b".into(),
            ..s.clone()
        })
        .unwrap();
    assert!(e.worker_reports().unwrap().is_empty());
    let report = |name: &str, runs: u64, err: Option<&str>| WorkerReport {
        session: 0,
        name: name.into(),
        state: "idle".into(),
        progress: format!("{name} progress"),
        runs,
        errors: err.is_some() as u64,
        last_run: 1_000 + runs as i64,
        last_error: err.map(str::to_string),
        last_error_at: if err.is_some() { 77 } else { 0 },
        reported: 5_000,
    };
    // Order as reported (not by name).
    e.report_workers(
        a,
        &[report("heartbeat", 3, None), report("gc", 1, Some("boom"))],
    )
    .unwrap();
    e.report_workers(b, &[report("heartbeat", 9, None)])
        .unwrap();
    let got = e.worker_reports().unwrap();
    let mut want_a0 = report("heartbeat", 3, None);
    want_a0.session = a;
    let mut want_a1 = report("gc", 1, Some("boom"));
    want_a1.session = a;
    let mut want_b = report("heartbeat", 9, None);
    want_b.session = b;
    let mut want = vec![want_a0, want_a1, want_b];
    want.sort_by_key(|r| r.session);
    assert_eq!(got, want);
    // A new report replaces the session's rows entirely.
    e.report_workers(a, &[report("compactor", 4, None)])
        .unwrap();
    let got: Vec<(u64, String)> = e
        .worker_reports()
        .unwrap()
        .into_iter()
        .map(|r| (r.session, r.name))
        .collect();
    assert!(got.contains(&(a, "compactor".into())), "{got:?}");
    assert!(!got.contains(&(a, "heartbeat".into())), "{got:?}");
    assert!(got.contains(&(b, "heartbeat".into())), "{got:?}");
    // An ended session's reports are not listed, and it cannot report any more.
    e.unregister_session(b).unwrap();
    assert!(e.worker_reports().unwrap().iter().all(|r| r.session == a));
    assert!(matches!(
        e.report_workers(b, &[report("heartbeat", 10, None)]),
        Err(MetaError::Invalid(_))
    ));
    // An empty report clears the session's rows.
    e.report_workers(a, &[]).unwrap();
    assert!(e.worker_reports().unwrap().is_empty());
}

/// What `tierfs fsck` and `tierfs gc` ask of an engine: object references, the id counter,
/// metadata issues of dead sessions, their repair, and paths.
fn fsck_queries_and_repairs(e: &dyn MetaEngine) {
    assert!(e.meta_issues(10_000_000_000).unwrap().is_empty());
    let first = e.alloc_object_ids(1024).unwrap();
    assert_eq!(e.object_id_counter().unwrap(), first + 1024);
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    let f = e
        .create(d.ino, b"f", &file(), Some(layout()), None)
        .unwrap();
    assert_eq!(e.path_of(f.ino).unwrap().unwrap(), b"/d/f".to_vec());
    assert_eq!(e.path_of(ROOT_INO).unwrap().unwrap(), b"/".to_vec());
    let mut sl = obj_slice(0, 0, 100, first);
    if let SliceData::Object { obj_off, .. } = &mut sl.data {
        *obj_off = 10;
    }
    e.commit_slices(f.ino, &[sl], 100, now_nanos()).unwrap();
    let g = e
        .create(ROOT_INO, b"g", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(g.ino, &[obj_slice(0, 0, 50, first + 1)], 50, now_nanos())
        .unwrap();
    e.unlink(ROOT_INO, b"g").unwrap();
    // Left for the purge: its object is still a slice's, not yet the trash's.
    let mut refs = e.object_refs().unwrap();
    refs.sort_by_key(|r| r.obj);
    assert_eq!(refs.len(), 2, "{refs:?}");
    assert_eq!(
        (refs[1].obj, refs[1].ino, refs[1].trash),
        (first + 1, g.ino, None)
    );
    assert!(
        e.meta_issues(10_000_000_000).unwrap().is_empty(),
        "not an issue"
    );
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    let mut refs = e.object_refs().unwrap();
    refs.sort_by_key(|r| r.obj);
    assert_eq!(refs.len(), 2, "{refs:?}");
    assert_eq!((refs[0].obj, refs[0].ino, refs[0].end), (first, f.ino, 110));
    assert_eq!(refs[0].trash, None);
    assert_eq!((refs[1].obj, refs[1].end), (first + 1, 50));
    assert!(refs[1].trash.is_some());
    assert_eq!(e.path_of(g.ino).unwrap(), None);

    // A session that dies with a file open (unlinked meanwhile) and a lock; a client with no
    // session left holds a clean and a dirty RW-PCC lease.
    let s = e
        .register_session(&SessionInfo {
            id: 0,
            client_name: "dead".into(),
            host: "h".into(),
            pid: 1,
            mountpoint: "/mnt".into(),
            version: "0".into(),
            started: 0,
            heartbeat: 0,
        })
        .unwrap();
    let h = e
        .create(ROOT_INO, b"h", &file(), Some(layout()), None)
        .unwrap();
    e.open_file(s, h.ino).unwrap();
    e.unlink(ROOT_INO, b"h").unwrap();
    e.set_lock(
        f.ino,
        &LockRange {
            session: s,
            owner: 7,
            flock: false,
            typ: LockType::Write,
            start: 0,
            end: 10,
            pid: 1,
        },
    )
    .unwrap();
    let clean = e
        .create(ROOT_INO, b"clean", &file(), Some(layout()), None)
        .unwrap();
    let dirty = e
        .create(ROOT_INO, b"dirty", &file(), Some(layout()), None)
        .unwrap();
    e.pcc_acquire(clean.ino, "gone").unwrap();
    let dl = e.pcc_acquire(dirty.ino, "gone").unwrap();
    e.pcc_report(dirty.ino, "gone", dl.generation, true, 0, now_nanos())
        .unwrap();
    // Alive for a long timeout: only the leases of the client without a session show.
    let long = 3_600_000_000_000;
    let issues = e.meta_issues(long).unwrap();
    assert_eq!(issues.len(), 2, "{issues:?}");
    assert!(!e
        .repair_issue(
            &MetaIssue::StaleOpen {
                ino: h.ino,
                session: s
            },
            long
        )
        .unwrap());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let short = 10_000_000;
    let issues = e.meta_issues(short).unwrap();
    assert!(
        issues.contains(&MetaIssue::StaleOpen {
            ino: h.ino,
            session: s
        }),
        "{issues:?}"
    );
    assert!(issues.contains(&MetaIssue::StaleLock {
        ino: f.ino,
        session: s
    }));
    assert!(issues.contains(&MetaIssue::StaleLease {
        ino: clean.ino,
        client: "gone".into(),
        dirty: false
    }));
    assert!(issues.contains(&MetaIssue::StaleLease {
        ino: dirty.ino,
        client: "gone".into(),
        dirty: true
    }));
    for i in &issues {
        let _ = e.repair_issue(i, short).unwrap();
    }
    // The dead session went with its open file (the unlinked file was purged) and lock; the
    // clean lease went, the dirty one stays (the only copy of its data is in that cache).
    assert!(e.sessions().unwrap().is_empty());
    assert!(matches!(e.getattr(h.ino), Err(MetaError::NotFound)));
    assert!(e.pcc_lease(clean.ino).unwrap().is_none());
    assert!(e.pcc_lease(dirty.ino).unwrap().unwrap().dirty);
    let left = e.meta_issues(short).unwrap();
    assert_eq!(
        left,
        vec![MetaIssue::StaleLease {
            ino: dirty.ino,
            client: "gone".into(),
            dirty: true
        }]
    );
}

fn locks(e: &dyn MetaEngine) {
    let s = live_sessions(e, 4);
    let f = e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
    let w = |session, owner, start, end| LockRange {
        session,
        owner,
        flock: false,
        typ: LockType::Write,
        start,
        end,
        pid: 1,
    };
    e.set_lock(f.ino, &w(s[1], 1, 0, 99)).unwrap();
    assert!(matches!(
        e.set_lock(f.ino, &w(s[2], 1, 50, 60)),
        Err(MetaError::WouldBlock)
    ));
    e.set_lock(f.ino, &w(s[2], 1, 100, 200)).unwrap();
    let conflict = e.test_lock(f.ino, &w(s[3], 1, 90, 110)).unwrap().unwrap();
    assert_eq!(conflict.session, s[1]);
    let unlock = LockRange {
        typ: LockType::Unlock,
        ..w(s[1], 1, 0, 99)
    };
    e.set_lock(f.ino, &unlock).unwrap();
    e.set_lock(f.ino, &w(s[3], 1, 0, 99)).unwrap();
    e.release_locks(f.ino, s[3], 1, false).unwrap();
    assert!(e.test_lock(f.ino, &w(s[4], 1, 0, 99)).unwrap().is_none());
    let fl = |session, typ| LockRange {
        session,
        owner: 9,
        flock: true,
        typ,
        start: 0,
        end: u64::MAX,
        pid: 1,
    };
    e.set_lock(f.ino, &fl(s[1], LockType::Read)).unwrap();
    e.set_lock(f.ino, &fl(s[2], LockType::Read)).unwrap();
    assert!(matches!(
        e.set_lock(f.ino, &fl(s[3], LockType::Write)),
        Err(MetaError::WouldBlock)
    ));
}

fn stripe_defaults_and_projects(e: &dyn MetaEngine) {
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    let sub = e.create(d.ino, b"sub", &dir(), None, None).unwrap();
    assert_eq!(
        e.resolve_stripe_default(sub.ino).unwrap(),
        StripeDefault {
            stripe_count: 1,
            stripe_size: 1 << 20
        }
    );
    e.set_dir_stripe(
        d.ino,
        StripeDefault {
            stripe_count: 2,
            stripe_size: 4 << 20,
        },
    )
    .unwrap();
    assert_eq!(
        e.resolve_stripe_default(sub.ino).unwrap(),
        StripeDefault {
            stripe_count: 2,
            stripe_size: 4 << 20
        }
    );
    let f = e
        .create(sub.ino, b"f", &file(), Some(layout()), None)
        .unwrap();
    e.set_file_layout(
        f.ino,
        &Layout {
            stripe_size: 2 << 20,
            targets: vec![1],
        },
    )
    .unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 1, 3)], 1, 1)
        .unwrap();
    assert!(matches!(
        e.set_file_layout(f.ino, &layout()),
        Err(MetaError::NotEmpty)
    ));
    assert_eq!(e.set_projid(d.ino, 500, true).unwrap(), 3);
    assert_eq!(e.getattr(f.ino).unwrap().projid, 500);
    let g = e.create(sub.ino, b"g", &file(), None, None).unwrap();
    assert_eq!(g.projid, 500, "new children inherit with -s");
    assert_eq!(e.get_projid(d.ino).unwrap(), (500, true));
}

fn setgid_inheritance(e: &dyn MetaEngine) {
    let d = e
        .create(
            ROOT_INO,
            b"d",
            &NewNode {
                perm: 0o2775,
                gid: 77,
                ..dir()
            },
            None,
            None,
        )
        .unwrap();
    let f = e
        .create(
            d.ino,
            b"f",
            &NewNode {
                gid: 1000,
                ..file()
            },
            None,
            None,
        )
        .unwrap();
    assert_eq!(f.gid, 77);
    let s = e
        .create(d.ino, b"s", &NewNode { gid: 1000, ..dir() }, None, None)
        .unwrap();
    assert_eq!(s.gid, 77);
    assert_ne!(
        s.perm & libc::S_ISGID,
        0,
        "subdirectories keep the setgid bit"
    );
}

fn compaction_replace_chunk(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    for i in 0..5 {
        e.commit_slices(f.ino, &[obj_slice(0, i * 10, 10, 100 + i)], (i + 1) * 10, 1)
            .unwrap();
    }
    let s = e.read_chunk(f.ino, 0).unwrap();
    let upto = s.last().unwrap().seq;
    assert!(!e
        .replace_chunk(f.ino, 0, upto - 1, &[obj_slice(0, 0, 50, 201)])
        .unwrap());
    let t = e.trash(100, OPEN_TRASH_GRACE).unwrap();
    assert_eq!(t.len(), 1, "a refused merge leaves its object in the trash");
    assert_eq!(t[0].obj, 201);
    assert!(e
        .replace_chunk(f.ino, 0, upto, &[obj_slice(0, 0, 50, 200)])
        .unwrap());
    let s = e.read_chunk(f.ino, 0).unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(e.trash(100, OPEN_TRASH_GRACE).unwrap().len(), 6);
}

fn shared_objects_freed_with_last_slice(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    // Two small writes in two chunks, committed together in one 8-byte object.
    let piece = |chunk, obj_off| Slice {
        seq: 0,
        chunk,
        off: 0,
        len: 4,
        data: SliceData::Object {
            target: 1,
            obj: 42,
            obj_off,
            obj_size: 8,
        },
    };
    let used0 = e.targets().unwrap()[1].used;
    e.commit_slices(f.ino, &[piece(0, 0), piece(1, 4)], (1 << 20) + 4, 1)
        .unwrap();
    assert_eq!(
        e.targets().unwrap()[1].used,
        used0 + 8,
        "the object counts once"
    );
    assert_eq!(e.targets().unwrap()[1].objects, 1);
    // Truncating away chunk 1 keeps the object: chunk 0 still uses it.
    e.setattr(
        f.ino,
        &SetAttr {
            size: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(e.trash(10, OPEN_TRASH_GRACE).unwrap().is_empty());
    e.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(e.purge_unlinked(64, now_nanos() + 1).unwrap(), 1);
    let t = e.trash(10, OPEN_TRASH_GRACE).unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!((t[0].obj, t[0].len), (42, 8));
}

fn rw_lease_refused_while_open_on_another_client(e: &dyn MetaEngine) {
    let session = |name: &str| {
        e.register_session(&SessionInfo {
            id: 0,
            client_name: name.into(),
            host: "h".into(),
            pid: 1,
            mountpoint: "/mnt".into(),
            version: "0".into(),
            started: 0,
            heartbeat: 0,
        })
        .unwrap()
    };
    let (a, b) = (session("a"), session("b"));
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    // b has it open: a may not take it into its RW cache
    e.open_file(b, f.ino).unwrap();
    assert!(matches!(e.pcc_acquire(f.ino, "a"), Err(MetaError::InUse)));
    assert!(e.pcc_lease(f.ino).unwrap().is_none());
    assert_eq!(
        e.getattr_leased(f.ino).unwrap(),
        (e.getattr(f.ino).unwrap(), None)
    );
    // the holder's own opens do not count
    e.open_file(a, f.ino).unwrap();
    e.close_files(b, &[f.ino]).unwrap();
    let l = e.pcc_acquire(f.ino, "a").unwrap();
    assert_eq!(l.client, "a");
    // (read with the attributes: the lease itself, as pcc_lease reads it)
    assert_eq!(
        e.getattr_leased(f.ino).unwrap(),
        (e.getattr(f.ino).unwrap(), Some(l.clone()))
    );
    assert_eq!(e.pcc_lease(f.ino).unwrap(), Some(l));
    e.close_files(a, &[f.ino]).unwrap();
    // a file created open by b (open_by) counts too
    let g = e
        .create(ROOT_INO, b"g", &file(), Some(layout()), Some(b))
        .unwrap();
    assert!(matches!(e.pcc_acquire(g.ino, "a"), Err(MetaError::InUse)));
    assert_eq!(e.pcc_acquire(g.ino, "b").unwrap().client, "b");
}

/// A session of client `name` (tests here and on each engine).
pub(crate) fn pcc_session(e: &dyn MetaEngine, name: &str) -> u64 {
    e.register_session(&SessionInfo {
        id: 0,
        client_name: name.into(),
        host: "h".into(),
        pid: 1,
        mountpoint: "/mnt".into(),
        version: "0".into(),
        started: 0,
        heartbeat: 0,
    })
    .unwrap()
}

fn pcc_open_checks_the_lease_and_records_in_one_step(e: &dyn MetaEngine) {
    let (a, b) = (pcc_session(e, "a"), pcc_session(e, "b"));
    let f = e
        .create(ROOT_INO, b"po", &file(), Some(layout()), None)
        .unwrap();
    // no lease: recorded, so a's attach now sees b's open
    match e.pcc_open(b, f.ino, "b", true, None).unwrap() {
        PccOpen::Opened { attr, lease: None } => assert_eq!(attr.ino, f.ino),
        other => panic!("{other:?}"),
    }
    assert!(matches!(e.pcc_acquire(f.ino, "a"), Err(MetaError::InUse)));
    e.close_files(b, &[f.ino]).unwrap();
    let l = e.pcc_acquire(f.ino, "a").unwrap();
    assert!(!l.dirty);
    // the owner's read-only open: recorded, the lease stays clean
    match e.pcc_open(a, f.ino, "a", false, None).unwrap() {
        PccOpen::Opened { lease: Some(x), .. } => assert!(!x.dirty),
        other => panic!("{other:?}"),
    }
    assert!(!e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    // the owner's open for writing: the lease is dirty when the call returns
    match e.pcc_open(a, f.ino, "a", true, None).unwrap() {
        PccOpen::Opened { lease: Some(x), .. } => {
            assert!(x.dirty);
            assert_eq!(x.generation, l.generation);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    // another client: nothing recorded, the lease comes back
    match e.pcc_open(b, f.ino, "b", false, None).unwrap() {
        PccOpen::Held(x) => assert_eq!(x.client, "a"),
        other => panic!("{other:?}"),
    }
    e.close_files(a, &[f.ino, f.ino]).unwrap();
    // b's refused open left no row: after the give-back, a may attach again
    assert!(e.pcc_release(f.ino, "a", l.generation).unwrap());
    assert!(e.pcc_acquire(f.ino, "a").unwrap().generation > l.generation);
    // a file that is not there, or that an unlink left for the purge: NotFound
    let gone = e
        .create(ROOT_INO, b"po-gone", &file(), Some(layout()), None)
        .unwrap();
    e.unlink(ROOT_INO, b"po-gone").unwrap();
    for ino in [gone.ino, 999_999] {
        assert!(matches!(
            e.pcc_open(a, ino, "a", false, None),
            Err(MetaError::NotFound)
        ));
    }
    // nothing is recorded under an ended session
    e.unregister_session(b).unwrap();
    assert!(matches!(
        e.pcc_open(b, f.ino, "a", false, None),
        Err(MetaError::SessionEnded(_))
    ));
}

fn pcc_acquire_dirty_takes_the_lease_dirty(e: &dyn MetaEngine) {
    let (a, b) = (pcc_session(e, "a"), pcc_session(e, "b"));
    // created open by a (an attach at create): a takes it dirty in one step
    let f = e
        .create(ROOT_INO, b"pd", &file(), Some(layout()), Some(a))
        .unwrap();
    let v0 = e.getattr(f.ino).unwrap().data_version;
    let l = e.pcc_acquire_dirty(f.ino, "a").unwrap();
    assert_eq!(l.client, "a");
    assert!(l.dirty);
    assert_eq!(e.pcc_lease(f.ino).unwrap(), Some(l.clone()));
    // as pcc_acquire: the data version moved (RO copies elsewhere go)
    assert!(e.getattr(f.ino).unwrap().data_version > v0);
    // dirty: a breaker cannot break it, another client cannot take it
    assert!(!e.pcc_break(f.ino, "a", l.generation).unwrap());
    assert!(matches!(
        e.pcc_acquire_dirty(f.ino, "b"),
        Err(MetaError::WouldBlock)
    ));
    // written back clean, taken again dirty by its holder: the same lease, dirty again
    e.pcc_report(f.ino, "a", l.generation, false, 0, 1).unwrap();
    assert!(!e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    let again = e.pcc_acquire_dirty(f.ino, "a").unwrap();
    assert_eq!(again.generation, l.generation);
    assert!(again.dirty && e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    // a file open in another client's session is refused, as by pcc_acquire, and stays unleased
    let g = e
        .create(ROOT_INO, b"pd2", &file(), Some(layout()), Some(b))
        .unwrap();
    assert!(matches!(
        e.pcc_acquire_dirty(g.ino, "a"),
        Err(MetaError::InUse)
    ));
    assert!(e.pcc_lease(g.ino).unwrap().is_none());
}

fn pcc_create_takes_the_lease_in_the_create(e: &dyn MetaEngine) {
    let (a, b) = (pcc_session(e, "a"), pcc_session(e, "b"));
    // the rule sees the new inode as created (its owner, its name's inode number)
    let seen = std::cell::Cell::new(None);
    let (f, l) = e
        .pcc_create(
            ROOT_INO,
            b"pc",
            &file(),
            Some(layout()),
            Some(a),
            "a",
            &|x| {
                seen.set(Some((x.ino, x.uid, x.kind)));
                true
            },
        )
        .unwrap();
    let l = l.expect("a lease when the rule wants one");
    assert_eq!(seen.get(), Some((f.ino, file().uid, Kind::File)));
    assert_eq!((l.ino, l.client.as_str(), l.dirty), (f.ino, "a", true));
    assert_eq!(e.pcc_lease(f.ino).unwrap(), Some(l.clone()));
    // the inode returned is the engine's after the lease
    let now = e.getattr(f.ino).unwrap();
    assert_eq!(now.data_version, f.data_version);
    assert_eq!(e.lookup(ROOT_INO, b"pc").unwrap().ino, f.ino);
    // opened by a (one close to count), dirty: another client cannot take it, no breaker breaks it
    assert!(matches!(
        e.pcc_acquire(f.ino, "b"),
        Err(MetaError::WouldBlock)
    ));
    assert!(!e.pcc_break(f.ino, "a", l.generation).unwrap());
    e.close_files(a, &[f.ino]).unwrap();
    // a lease taken at create has the create's generation (no counter: creates do not queue
    // on one row); any later attach of the file has a greater one, and a report or give-back
    // of the create's lease is refused once that attach holds it
    assert_eq!(l.generation, 0);
    e.pcc_report(f.ino, "a", l.generation, false, 0, 1).unwrap();
    assert!(e.pcc_release(f.ino, "a", l.generation).unwrap());
    let again = e.pcc_acquire(f.ino, "b").unwrap();
    assert!(again.generation > l.generation);
    assert!(matches!(
        e.pcc_report(f.ino, "a", l.generation, true, 5, 1),
        Err(MetaError::WouldBlock)
    ));
    assert!(!e.pcc_release(f.ino, "b", l.generation).unwrap());
    assert!(e.pcc_release(f.ino, "b", again.generation).unwrap());
    // the rule does not want it: a plain create, no lease, the data version as a create's
    let (g, none) = e
        .pcc_create(
            ROOT_INO,
            b"pc2",
            &file(),
            Some(layout()),
            Some(b),
            "b",
            &|_| false,
        )
        .unwrap();
    assert!(none.is_none());
    assert!(e.pcc_lease(g.ino).unwrap().is_none());
    assert_eq!(e.getattr(g.ino).unwrap().data_version, g.data_version);
    // a new inode's data version is the same for every create, with a lease or without:
    // nobody can hold a read-only copy of a file made in the same transaction
    assert_eq!(f.data_version, g.data_version);
    // a taken name: Exists, and nothing is leased
    assert!(matches!(
        e.pcc_create(
            ROOT_INO,
            b"pc",
            &file(),
            Some(layout()),
            Some(a),
            "a",
            &|_| true
        ),
        Err(MetaError::Exists)
    ));
    // not a regular file: refused, nothing created
    let dir = NewNode {
        kind: Kind::Dir,
        ..file()
    };
    assert!(matches!(
        e.pcc_create(ROOT_INO, b"pc3", &dir, None, None, "a", &|_| true),
        Err(MetaError::Invalid(_))
    ));
    assert!(matches!(
        e.lookup(ROOT_INO, b"pc3"),
        Err(MetaError::NotFound)
    ));
}

/// The rule is asked about the file as made: in a set-group-ID directory the file has the
/// directory's group, in a project-inheriting one its project, and a rule on either sees that.
fn pcc_create_asks_the_rule_about_the_file_made(e: &dyn MetaEngine) {
    let a = pcc_session(e, "a");
    let d = e
        .create(
            ROOT_INO,
            b"sg",
            &NewNode {
                perm: 0o2775,
                gid: 77,
                ..dir()
            },
            None,
            None,
        )
        .unwrap();
    let mine = NewNode {
        gid: 1000,
        ..file()
    };
    let group_77 = |x: &Attr| x.gid == 77;
    let group_1000 = |x: &Attr| x.gid == 1000;
    // a rule on the directory's group: the file made has it, so it is leased (dirty, a's)
    let (f, l) = e
        .pcc_create(d.ino, b"f", &mine, Some(layout()), Some(a), "a", &group_77)
        .unwrap();
    assert_eq!(f.gid, 77);
    let l = l.expect("the file made has the group the rule wants");
    assert_eq!((l.ino, l.client.as_str(), l.dirty), (f.ino, "a", true));
    assert_eq!(e.pcc_lease(f.ino).unwrap(), Some(l));
    // a rule on the group asked for, which the file made does not have: no lease anywhere
    let (g, none) = e
        .pcc_create(
            d.ino,
            b"g",
            &mine,
            Some(layout()),
            Some(a),
            "a",
            &group_1000,
        )
        .unwrap();
    assert_eq!(g.gid, 77);
    assert!(none.is_none());
    assert_eq!(e.pcc_lease(g.ino).unwrap(), None);
    // again a file the rule on the directory's group wants
    let (f2, l) = e
        .pcc_create(d.ino, b"f2", &mine, Some(layout()), Some(a), "a", &group_77)
        .unwrap();
    assert_eq!(f2.gid, 77);
    assert!(l.is_some());
    assert!(e.pcc_lease(f2.ino).unwrap().is_some());
    // the directory no longer set-group-ID: the file has the group asked for, not wanted
    e.setattr(
        d.ino,
        &SetAttr {
            perm: Some(0o775),
            ..Default::default()
        },
    )
    .unwrap();
    let (f3, none) = e
        .pcc_create(d.ino, b"f3", &mine, Some(layout()), Some(a), "a", &group_77)
        .unwrap();
    assert_eq!(f3.gid, 1000);
    assert!(none.is_none());
    assert_eq!(e.pcc_lease(f3.ino).unwrap(), None);
    // outside the directory the group asked for is the file's
    let (h, l) = e
        .pcc_create(
            ROOT_INO,
            b"h",
            &mine,
            Some(layout()),
            Some(a),
            "a",
            &group_1000,
        )
        .unwrap();
    assert_eq!(h.gid, 1000);
    assert!(l.is_some());
    assert!(e.pcc_lease(h.ino).unwrap().is_some());
    // a project handed down: a rule on the project sees it
    let p = e.create(ROOT_INO, b"proj", &dir(), None, None).unwrap();
    e.set_projid(p.ino, 42, true).unwrap();
    let (k, l) = e
        .pcc_create(p.ino, b"k", &file(), Some(layout()), Some(a), "a", &|x| {
            x.projid == 42
        })
        .unwrap();
    assert_eq!(k.projid, 42);
    assert!(l.is_some());
    assert!(e.pcc_lease(k.ino).unwrap().is_some());
    let (m, none) = e
        .pcc_create(p.ino, b"m", &file(), Some(layout()), Some(a), "a", &|x| {
            x.projid == 0
        })
        .unwrap();
    assert_eq!(m.projid, 42);
    assert!(none.is_none());
    assert_eq!(e.pcc_lease(m.ino).unwrap(), None);
}

fn pcc_transitions_are_conditional_on_generation_and_dirty(e: &dyn MetaEngine) {
    let a = pcc_session(e, "a");
    let f = e
        .create(ROOT_INO, b"pt", &file(), Some(layout()), None)
        .unwrap();
    let l = e.pcc_acquire(f.ino, "a").unwrap();
    // a breaker that saw an older generation breaks nothing
    assert!(!e.pcc_break(f.ino, "a", l.generation - 1).unwrap());
    assert!(e.pcc_lease(f.ino).unwrap().is_some());
    // a dirty lease is never broken (the open for writing made it dirty)
    e.pcc_open(a, f.ino, "a", true, None).unwrap();
    assert!(!e.pcc_break(f.ino, "a", l.generation).unwrap());
    assert!(e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    // written back (clean): now a breaker with the current generation may break it
    e.pcc_report(f.ino, "a", l.generation, false, 0, 1).unwrap();
    e.pcc_request_revoke(f.ino, "b").unwrap();
    assert!(e.pcc_break(f.ino, "a", l.generation).unwrap());
    assert!(e.pcc_lease(f.ino).unwrap().is_none());
    assert!(e.pcc_recalls_for("a").unwrap().is_empty());
    // the old owner's report and release fail; a new lease of another client stays
    e.close_files(a, &[f.ino]).unwrap();
    let l2 = e.pcc_acquire(f.ino, "c").unwrap();
    assert!(matches!(
        e.pcc_report(f.ino, "a", l.generation, true, 9, 9),
        Err(MetaError::WouldBlock)
    ));
    assert!(!e.pcc_release(f.ino, "a", l.generation).unwrap());
    assert!(!e.pcc_release(f.ino, "c", l.generation).unwrap());
    assert_eq!(e.pcc_lease(f.ino).unwrap().unwrap(), l2);
}

fn pcc_snapshot_recalls(e: &dyn MetaEngine) {
    let (a, b) = (pcc_session(e, "a"), pcc_session(e, "b"));
    let f = e
        .create(ROOT_INO, b"ps", &file(), Some(layout()), None)
        .unwrap();
    let l = e.pcc_acquire(f.ino, "a").unwrap();
    assert_eq!(l.snapshot, 0);
    e.pcc_open(a, f.ino, "a", true, None).unwrap();
    // a read request
    let s1 = e.pcc_request_recall(f.ino, "b", false).unwrap();
    assert_eq!(
        e.pcc_recalls_for("a").unwrap(),
        vec![PccRecall {
            ino: f.ino,
            write: false,
            seq: s1
        }]
    );
    assert!(matches!(
        e.pcc_open(b, f.ino, "b", false, Some(s1)).unwrap(),
        PccOpen::Held(_)
    ));
    // a later read request moves the number on
    let s2 = e.pcc_request_recall(f.ino, "c", false).unwrap();
    assert!(s2 > s1);
    // a snapshot that started before s2 serves s1 only
    assert!(e.pcc_snapshot_served(f.ino, "a", l.generation, s1).unwrap());
    assert_eq!(e.pcc_lease(f.ino).unwrap().unwrap().snapshot, s1);
    assert_eq!(e.pcc_recalls_for("a").unwrap()[0].seq, s2);
    // b's read-only open is recorded against the snapshot; for writing it is not
    assert!(matches!(
        e.pcc_open(b, f.ino, "b", true, Some(s1)).unwrap(),
        PccOpen::Held(_)
    ));
    match e.pcc_open(b, f.ino, "b", false, Some(s1)).unwrap() {
        PccOpen::Snapshot { lease, .. } => assert_eq!(lease.client, "a"),
        other => panic!("{other:?}"),
    }
    // the lease stays a's, and dirty
    let now = e.pcc_lease(f.ino).unwrap().unwrap();
    assert_eq!((now.generation, now.dirty), (l.generation, true));
    // a request for writing stays one when a read request follows
    let s3 = e.pcc_request_recall(f.ino, "c", true).unwrap();
    let s4 = e.pcc_request_recall(f.ino, "b", false).unwrap();
    assert!(s4 > s3);
    let r = e.pcc_recalls_for("a").unwrap();
    assert_eq!((r[0].write, r[0].seq), (true, s4));
    // a snapshot does not serve a request for writing
    assert!(e.pcc_snapshot_served(f.ino, "a", l.generation, s4).unwrap());
    assert_eq!(e.pcc_recalls_for("a").unwrap().len(), 1);
    // a snapshot of another generation changes nothing
    assert!(!e
        .pcc_snapshot_served(f.ino, "a", l.generation + 1000, s4 + 1)
        .unwrap());
    assert_eq!(e.pcc_lease(f.ino).unwrap().unwrap().snapshot, s4);
    e.close_files(a, &[f.ino]).unwrap();
    e.close_files(b, &[f.ino]).unwrap();
}

/// The owner's report with the attribute changes that waited for it: both in one transaction,
/// neither when the lease is not the reporter's, and a kept change gives way to a newer one.
fn pcc_report_then_applies_the_waiting_changes(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    let l = e.pcc_acquire(f.ino, "a").unwrap();
    let set = SetAttr {
        perm: Some(0o640),
        uid: Some(4321),
        gid: Some(8765),
        atime: Some(TimeSet::At(55)),
        unless_changed: Some(AttrBase {
            perm: Some(f.perm),
            uid: Some(f.uid),
            gid: Some(f.gid),
        }),
        ..Default::default()
    };
    // another holder's report: nothing of it applies
    assert!(matches!(
        e.pcc_report_then(f.ino, "b", l.generation, true, 9, 99, &set),
        Err(MetaError::WouldBlock)
    ));
    let now = e.getattr(f.ino).unwrap();
    assert_eq!((now.size, now.perm, now.uid), (0, f.perm, f.uid));
    assert!(!e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    let a = e
        .pcc_report_then(f.ino, "a", l.generation, true, 12345, 77, &set)
        .unwrap();
    let want = (12345, 77, 55, 0o640, 4321, 8765);
    assert_eq!((a.size, a.mtime, a.atime, a.perm, a.uid, a.gid), want);
    let now = e.getattr(f.ino).unwrap();
    assert_eq!(
        (now.size, now.mtime, now.atime, now.perm, now.uid, now.gid),
        want
    );
    assert!(e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    // a change kept since before another's newer chmod: the mode stays the newer one's
    e.setattr(
        f.ino,
        &SetAttr {
            perm: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    let stale = SetAttr {
        perm: Some(0o644),
        unless_changed: Some(AttrBase {
            perm: Some(0o640),
            ..Default::default()
        }),
        ..Default::default()
    };
    let a = e
        .pcc_report_then(f.ino, "a", l.generation, false, 1, 78, &stale)
        .unwrap();
    assert_eq!((a.perm, a.size, a.mtime), (0o600, 1, 78));
    assert!(!e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    assert!(e.pcc_release(f.ino, "a", l.generation).unwrap());
    // no lease: NotFound, nothing applied
    assert!(matches!(
        e.pcc_report_then(f.ino, "a", l.generation, true, 5, 5, &set),
        Err(MetaError::NotFound)
    ));
    assert_eq!(e.getattr(f.ino).unwrap().perm, 0o600);
}

fn pcc_leases_and_rules(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    let v0 = e.getattr(f.ino).unwrap().data_version;
    assert!(e.pcc_lease(f.ino).unwrap().is_none());
    let l = e.pcc_acquire(f.ino, "a").unwrap();
    assert_eq!((l.client.as_str(), l.dirty), ("a", false));
    assert!(
        e.getattr(f.ino).unwrap().data_version > v0,
        "attach drops RO copies elsewhere"
    );
    assert_eq!(e.pcc_acquire(f.ino, "a").unwrap().generation, l.generation);
    assert!(matches!(
        e.pcc_acquire(f.ino, "b"),
        Err(MetaError::WouldBlock)
    ));
    let a = e
        .pcc_report(f.ino, "a", l.generation, true, 12345, 77)
        .unwrap();
    assert_eq!((a.size, a.mtime), (12345, 77));
    assert!(matches!(
        e.pcc_report(f.ino, "b", l.generation, true, 1, 1),
        Err(MetaError::WouldBlock)
    ));
    assert!(e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    e.pcc_request_revoke(f.ino, "b").unwrap();
    assert_eq!(e.pcc_revokes_for("a").unwrap(), vec![f.ino]);
    assert!(e.pcc_revokes_for("b").unwrap().is_empty());
    assert_eq!(e.pcc_leases_of("a").unwrap().len(), 1);
    assert!(!e.pcc_release(f.ino, "a", l.generation + 1000).unwrap());
    assert!(
        e.pcc_lease(f.ino).unwrap().is_some(),
        "another generation's release"
    );
    assert!(e.pcc_release(f.ino, "a", l.generation).unwrap());
    assert!(e.pcc_lease(f.ino).unwrap().is_none());
    assert!(e.pcc_revokes_for("a").unwrap().is_empty());
    let l2 = e.pcc_acquire(f.ino, "b").unwrap();
    assert!(l2.generation > l.generation);
    // the old holder's report of the old generation does not touch b's lease
    assert!(matches!(
        e.pcc_report(f.ino, "a", l.generation, false, 1, 1),
        Err(MetaError::WouldBlock)
    ));
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap();
    assert!(matches!(
        e.pcc_acquire(d.ino, "a"),
        Err(MetaError::Invalid(_))
    ));
    // rules
    let r1 = e.pcc_rule_add("rw", None, "projid={500}", None).unwrap();
    let big = 5u64 << 40; // past 32 bits: stored whole
    let r2 = e
        .pcc_rule_add("ro", Some("c1"), "fname={*.h5}", Some(big))
        .unwrap();
    assert!(matches!(
        e.pcc_rule_add("xx", None, "uid={1}", None),
        Err(MetaError::Invalid(_))
    ));
    let rules = e.pcc_rules().unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[1].client.as_deref(), Some("c1"));
    assert_eq!((rules[0].quota, rules[1].quota), (None, Some(big)));
    // quotas are editable, and cleared with None
    e.pcc_rule_set_quota(r1, Some(1 << 20)).unwrap();
    e.pcc_rule_set_quota(r2, None).unwrap();
    let rules = e.pcc_rules().unwrap();
    assert_eq!((rules[0].quota, rules[1].quota), (Some(1 << 20), None));
    assert!(matches!(
        e.pcc_rule_set_quota(r2 + 100, Some(1)),
        Err(MetaError::NotFound)
    ));
    e.pcc_rule_del(r1).unwrap();
    assert!(matches!(e.pcc_rule_del(r1), Err(MetaError::NotFound)));
    assert_eq!(e.pcc_rules().unwrap()[0].id, r2);
    // client liveness
    let s = SessionInfo {
        id: 0,
        client_name: "a".into(),
        host: "h".into(),
        pid: 1,
        mountpoint: "/m".into(),
        version: "0".into(),
        started: 0,
        heartbeat: 0,
    };
    assert!(!e.client_alive("a", 1_000_000_000).unwrap());
    e.register_session(&s).unwrap();
    assert!(e.client_alive("a", 1_000_000_000).unwrap());
    // unlink drops the lease
    e.unlink(ROOT_INO, b"f").unwrap();
    assert!(e.pcc_lease(f.ino).unwrap().is_none());
}

fn commit_to_a_vanished_file_trashes_its_objects(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    e.unlink(ROOT_INO, b"f").unwrap();
    assert!(matches!(
        e.commit_slices(f.ino, &[obj_slice(0, 0, 10, 77)], 10, 1),
        Err(MetaError::NotFound)
    ));
    let t = e.trash(10, OPEN_TRASH_GRACE).unwrap();
    assert_eq!(t.len(), 1, "the uploaded object is not leaked");
    assert_eq!(t[0].obj, 77);
}

fn rewrite_data_replaces_everything(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(
        f.ino,
        &[obj_slice(0, 0, 100, 1), obj_slice(1, 0, 100, 2)],
        (1 << 20) + 100,
        1,
    )
    .unwrap();
    let v = e.getattr(f.ino).unwrap().data_version;
    let a = e
        .rewrite_data(f.ino, &[obj_slice(0, 0, 50, 3)], 50, 9)
        .unwrap();
    assert_eq!((a.size, a.mtime), (50, 9));
    assert!(a.data_version > v);
    assert!(e.read_chunk(f.ino, 1).unwrap().is_empty());
    assert_eq!(e.read_chunk(f.ino, 0).unwrap().len(), 1);
    assert_eq!(e.trash(10, OPEN_TRASH_GRACE).unwrap().len(), 2);
}

/// FALLOC_FL_ZERO_RANGE (`zero` without `keep_size`) zeroes inside the size and grows it;
/// with `keep_size` (and for punch-hole) the size stays. Zeroing adds zero slices only.
fn fallocate_zero_range(e: &dyn MetaEngine) {
    let f = e
        .create(ROOT_INO, b"z", &file(), Some(layout()), None)
        .unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 100, 9)], 100, 1)
        .unwrap();
    let v = e.getattr(f.ino).unwrap().data_version;
    let k = e.fallocate(f.ino, 50, 100, true, true).unwrap();
    assert_eq!(k.size, 100, "zero range with keep_size keeps the size");
    assert!(k.data_version > v, "zeroing moves the data version");
    let last = e.read_chunk(f.ino, 0).unwrap().last().cloned().unwrap();
    assert_eq!(
        (last.off, last.len, &last.data),
        (50, 50, &SliceData::Zero),
        "zeroed inside the old size only"
    );
    let g = e.fallocate(f.ino, 80, 100, false, true).unwrap();
    assert_eq!(g.size, 180, "zero range without keep_size grows the file");
    let last = e.read_chunk(f.ino, 0).unwrap().last().cloned().unwrap();
    assert_eq!((last.off, last.len, &last.data), (80, 20, &SliceData::Zero));
    let s = e.fallocate(f.ino, 0, 10, false, true).unwrap();
    assert_eq!(s.size, 180, "zeroing inside never shrinks");
}

/// Each file's allocated bytes (st_blocks, schema v5): bytes covered by non-zero slices,
/// newest first, kept by commits, punches, zero ranges, truncates, compaction and write-back;
/// a sparse size alone allocates nothing; inline data counts.
fn allocated_bytes_follow_the_slices(e: &dyn MetaEngine) {
    let cs = layout().stripe_size;
    let f = e
        .create(ROOT_INO, b"a", &file(), Some(layout()), None)
        .unwrap();
    let al = || e.getattr(f.ino).unwrap().allocated;
    assert_eq!(al(), 0);
    e.commit_slices(f.ino, &[obj_slice(0, 0, 100, 11)], 100, 1)
        .unwrap();
    assert_eq!(al(), 100);
    // An overwrite counts once.
    let a = e
        .commit_slices(f.ino, &[obj_slice(0, 50, 100, 12)], 150, 2)
        .unwrap();
    assert_eq!(a.allocated, 150, "the commit's attributes carry it");
    e.commit_slices(f.ino, &[obj_slice(1, 0, 10, 13)], cs + 10, 3)
        .unwrap();
    assert_eq!(al(), 160);
    // A punched hole does not count; a sparse size does not either.
    e.fallocate(f.ino, 20, 10, true, true).unwrap();
    assert_eq!(al(), 150);
    e.fallocate(f.ino, 0, 5 << 30, false, false).unwrap();
    assert_eq!(e.getattr(f.ino).unwrap().size, 5 << 30);
    assert_eq!(al(), 150, "allocating size is not data");
    // Truncates: the zeroed tail of a chunk and the chunks past the end go.
    e.setattr(
        f.ino,
        &SetAttr {
            size: Some(cs + 5),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(al(), 145);
    e.setattr(
        f.ino,
        &SetAttr {
            size: Some(60),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(al(), 50);
    // Compaction rewrites the chunk as one object over [0, 60): holes in it become data.
    let upto = e.read_chunk(f.ino, 0).unwrap().last().unwrap().seq;
    assert!(e
        .replace_chunk(f.ino, 0, upto, &[obj_slice(0, 0, 60, 14)])
        .unwrap());
    assert_eq!(al(), 60);
    // Write-back replaces everything.
    let w = e
        .rewrite_data(f.ino, &[obj_slice(0, 0, 1000, 15)], 1000, 4)
        .unwrap();
    assert_eq!(w.allocated, 1000);
    // Inline data counts.
    let g = e
        .create(ROOT_INO, b"i", &file(), Some(layout()), None)
        .unwrap();
    let inline = Slice {
        seq: 0,
        chunk: 0,
        off: 0,
        len: 3,
        data: SliceData::Inline(b"abc".to_vec()),
    };
    assert_eq!(
        e.commit_slices(g.ino, &[inline], 3, 1).unwrap().allocated,
        3
    );
}

/// One commit of more slices than one insert statement takes (the core inserts 16 a
/// statement), over several chunks with overlaps and zero slices: every slice lands, in the
/// order given (the newest wins), with the accounting of a commit of each slice on its own.
fn a_commit_of_many_slices_keeps_their_order(e: &dyn MetaEngine) {
    let cs = layout().stripe_size;
    let f = e
        .create(ROOT_INO, b"many", &file(), Some(layout()), None)
        .unwrap();
    let first = e.alloc_object_ids(64).unwrap();
    let mut slices = Vec::new();
    for i in 0..40u64 {
        let chunk = i % 3;
        let off = (i * 37) % 500;
        if i % 7 == 6 {
            slices.push(Slice {
                seq: 0,
                chunk,
                off,
                len: 20,
                data: SliceData::Zero,
            });
        } else {
            slices.push(obj_slice(chunk, off, 100, first + i));
        }
    }
    let end = 2 * cs + 600;
    let a = e.commit_slices(f.ino, &slices, end, 7).unwrap();
    assert_eq!(a.size, end);
    let mut expect = 0;
    for chunk in 0..3 {
        let got = e.read_chunk(f.ino, chunk).unwrap();
        let want: Vec<&Slice> = slices.iter().filter(|s| s.chunk == chunk).collect();
        assert_eq!(got.len(), want.len(), "chunk {chunk}");
        assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                (g.off, g.len, &g.data),
                (w.off, w.len, &w.data),
                "chunk {chunk}"
            );
        }
        let rows: Vec<(u64, u64, bool)> = want
            .iter()
            .map(|s| (s.off, s.len, s.data == SliceData::Zero))
            .collect();
        expect += allocated_bytes(&rows);
    }
    assert_eq!(a.allocated, expect);
    assert_eq!(e.getattr(f.ino).unwrap().allocated, expect);
    let objects: u64 = slices
        .iter()
        .filter(|s| matches!(s.data, SliceData::Object { .. }))
        .count() as u64;
    let t = e.targets().unwrap();
    assert_eq!(t[0].objects, objects);
    assert_eq!(t[0].used, objects * 100);
}
