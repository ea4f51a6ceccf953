//! Conformance checks of HSM (docs/hsm.md): per-file states, release, restore, the
//! coordinator's queue (priorities, caps, timeouts and requeue, retries with backoff, cancel,
//! dedupe), agents, import, unlink, and the changelog's HSM records.
//!
//! Timeouts and backoff are judged by the database's clock: the checks set them to a few
//! hundred milliseconds and sleep past them.

use std::time::Duration;

use super::{file, layout, live_sessions, obj_slice};
use crate::changelog::{Mask, RecordType};
use crate::engine::MetaEngine;
use crate::error::MetaError;
use crate::hsm::*;
use crate::types::*;

const DAY: Duration = Duration::from_secs(86_400);
const MS: i64 = 1_000_000;

fn hsm_err(r: Result<impl std::fmt::Debug, MetaError>) -> HsmError {
    match r {
        Err(MetaError::Hsm(e)) => e,
        other => panic!("expected an HSM error, got {other:?}"),
    }
}

/// A file of `len` bytes in one object (id `obj`).
fn file_with_data(e: &dyn MetaEngine, name: &[u8], len: u64) -> Attr {
    let a = e
        .create(ROOT_INO, name, &file(), Some(layout()), None)
        .unwrap();
    let obj = e.alloc_object_ids(1).unwrap();
    e.commit_slices(a.ino, &[obj_slice(0, 0, len, obj)], len, 1_000_000_007)
        .unwrap()
}

fn agent(e: &dyn MetaEngine, archives: &[u32], max: u32) -> u64 {
    e.hsm_agent_register(&HsmAgentInfo {
        name: "conf-agent".into(),
        host: "h".into(),
        pid: 1,
        archives: archives.to_vec(),
        max_requests: max,
    })
    .unwrap()
}

/// Archives `ino` through the whole protocol (request, take, complete); the request's id.
fn archive(e: &dyn MetaEngine, ag: u64, ino: Ino) -> u64 {
    let r = e
        .hsm_request(ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    let tasks = e.hsm_take(ag, 1).unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].request.id, r.id);
    let t = &tasks[0];
    let done = HsmDone {
        key: format!("k/{ino}"),
        data_version: t.data_version,
        size: t.size,
        checksum: "sha256:00".into(),
        bytes_moved: t.size,
    };
    assert_eq!(e.hsm_complete(ag, r.id, &done).unwrap(), HsmOutcome::Done);
    r.id
}

fn flags(e: &dyn MetaEngine, ino: Ino) -> u32 {
    e.getattr(ino).unwrap().hsm.0
}

fn settings(e: &dyn MetaEngine, f: impl FnOnce(&mut HsmSettings)) {
    let mut s = e.hsm_settings().unwrap();
    f(&mut s);
    e.hsm_set_settings(&s).unwrap();
}

pub fn hsm_archives_and_settings(e: &dyn MetaEngine) {
    assert!(e.hsm_archives().unwrap().is_empty());
    e.hsm_archive_add(1, "file:///archive/a1").unwrap();
    e.hsm_archive_add(2, "s3://cold/p?endpoint=http://x")
        .unwrap();
    assert_eq!(
        hsm_err(e.hsm_archive_add(1, "file:///other")),
        HsmError::ArchiveExists(1, "file:///archive/a1".into())
    );
    assert_eq!(
        hsm_err(e.hsm_archive_add(0, "file:///x")),
        HsmError::BadArchiveId(0)
    );
    assert!(matches!(
        e.hsm_archive_add(3, "ftp://x"),
        Err(MetaError::Invalid(_))
    ));
    let ids: Vec<u32> = e.hsm_archives().unwrap().iter().map(|a| a.id).collect();
    assert_eq!(ids, [1, 2]);
    assert_eq!(e.hsm_settings().unwrap(), HsmSettings::default());
    let s = HsmSettings {
        max_per_agent: 7,
        max_per_archive: 9,
        request_timeout_ns: 5 * MS,
        max_attempts: 2,
        retry_backoff_ns: 0,
        keep_done_ns: 60_000 * MS,
        default_archive: 2,
        remove_archive_on_last_unlink: true,
    };
    e.hsm_set_settings(&s).unwrap();
    assert_eq!(e.hsm_settings().unwrap(), s);
    let mut bad = s.clone();
    bad.max_per_agent = 0;
    assert!(matches!(
        hsm_err(e.hsm_set_settings(&bad)),
        HsmError::BadSetting(_)
    ));
    let mut bad = s.clone();
    bad.default_archive = 9;
    assert_eq!(
        hsm_err(e.hsm_set_settings(&bad)),
        HsmError::UnknownArchive(9)
    );
    // An archive with a copy in it cannot go; an unused one can (and stops being the default).
    let f = file_with_data(e, b"f", 10);
    let ag = agent(e, &[1], 0);
    let r = e
        .hsm_request(f.ino, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    assert_eq!(r.archive_id, 1);
    assert!(matches!(
        hsm_err(e.hsm_archive_del(1)),
        HsmError::ArchiveInUse(1, 1)
    ));
    e.hsm_cancel(f.ino).unwrap();
    archive_keep(e, ag, f.ino, 1);
    assert!(matches!(
        hsm_err(e.hsm_archive_del(1)),
        HsmError::ArchiveInUse(1, 1)
    ));
    e.hsm_archive_del(2).unwrap();
    assert_eq!(e.hsm_settings().unwrap().default_archive, 0);
    assert_eq!(hsm_err(e.hsm_archive_del(2)), HsmError::UnknownArchive(2));
    assert_eq!(
        hsm_err(e.hsm_agent_register(&HsmAgentInfo {
            archives: vec![5],
            ..Default::default()
        })),
        HsmError::UnknownArchive(5)
    );
}

/// [`archive`] in archive `id`.
fn archive_keep(e: &dyn MetaEngine, ag: u64, ino: Ino, id: u32) {
    let r = e
        .hsm_request(ino, HsmAction::Archive, Some(id))
        .unwrap()
        .unwrap();
    let t = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    assert_eq!(t.request.id, r.id);
    let done = HsmDone {
        key: "k".into(),
        data_version: t.data_version,
        size: t.size,
        checksum: "c".into(),
        bytes_moved: t.size,
    };
    assert_eq!(e.hsm_complete(ag, r.id, &done).unwrap(), HsmOutcome::Done);
}

/// Archive, release (accounting), restore (dedupe, prefix commit), the flags at each step.
pub fn hsm_archive_release_restore(e: &dyn MetaEngine) {
    let f = file_with_data(e, b"f", 5000);
    assert_eq!(f.hsm, HsmFlags(0));
    assert_eq!(e.hsm_state(f.ino).unwrap().copy, None);
    assert_eq!(
        hsm_err(e.hsm_request(f.ino, HsmAction::Archive, None)),
        HsmError::NoArchive
    );
    e.hsm_archive_add(1, "file:///a1").unwrap();
    e.hsm_archive_add(2, "file:///a2").unwrap();
    assert_eq!(
        hsm_err(e.hsm_request(f.ino, HsmAction::Archive, None)),
        HsmError::WhichArchive(2)
    );
    assert_eq!(
        hsm_err(e.hsm_request(f.ino, HsmAction::Archive, Some(7))),
        HsmError::UnknownArchive(7)
    );
    let r = e
        .hsm_request(f.ino, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.state, r.action, r.archive_id, r.bytes_total),
        (RequestState::Waiting, HsmAction::Archive, 1, 5000)
    );
    // Dedupe: the active request is returned.
    let again = e
        .hsm_request(f.ino, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    assert_eq!(again.id, r.id);
    // A restore of a file that is not released has nothing to do.
    assert_eq!(
        e.hsm_request(f.ino, HsmAction::Restore, None).unwrap(),
        None
    );
    let ag = agent(e, &[1], 0);
    let t = e.hsm_take(ag, 4).unwrap();
    assert_eq!(t.len(), 1);
    let t = &t[0];
    assert_eq!(t.request.state, RequestState::Started);
    assert_eq!(t.request.agent, Some(ag));
    assert_eq!(t.request.attempts, 1);
    assert_eq!(t.archive_url, "file:///a1");
    assert_eq!((t.data_version, t.size), (f.data_version, 5000));
    assert_eq!(e.hsm_progress(ag, r.id, 1000).unwrap(), Progress::Continue);
    assert_eq!(e.hsm_action(f.ino).unwrap().unwrap().bytes_moved, 1000);
    let done = HsmDone {
        key: "objs/f".into(),
        data_version: t.data_version,
        size: 5000,
        checksum: "sha256:ab".into(),
        bytes_moved: 5000,
    };
    assert_eq!(e.hsm_complete(ag, r.id, &done).unwrap(), HsmOutcome::Done);
    // Sent again (its answer lost): the same answer, so the mover keeps its copy.
    assert_eq!(e.hsm_complete(ag, r.id, &done).unwrap(), HsmOutcome::Done);
    let st = e.hsm_state(f.ino).unwrap();
    assert_eq!(st.flags, HsmFlags(HsmFlags::EXISTS | HsmFlags::ARCHIVED));
    assert_eq!(st.archive_id, 1);
    let c = st.copy.unwrap();
    assert_eq!(
        (c.key.as_str(), c.data_version, c.size, c.checksum.as_str()),
        ("objs/f", f.data_version, 5000, "sha256:ab")
    );
    let done_req = e.hsm_get_request(r.id).unwrap();
    assert_eq!(done_req.state, RequestState::Succeeded);
    assert_eq!(done_req.bytes_moved, 5000);
    // Archiving into another archive than the file's is refused.
    assert_eq!(
        hsm_err(e.hsm_request(f.ino, HsmAction::Archive, Some(2))),
        HsmError::OtherArchive { have: 1, asked: 2 }
    );

    // Release: slices gone to the trash, allocated 0, size and times kept.
    let before = e.getattr(f.ino).unwrap();
    assert_eq!(before.allocated, 5000);
    let trash_before = e.trash(1000, Duration::ZERO).unwrap().len();
    let a = e.hsm_release(f.ino).unwrap();
    assert!(a.hsm.released() && a.hsm.archived());
    assert_eq!((a.size, a.allocated), (5000, 0));
    assert_eq!(
        (a.mtime, a.ctime, a.data_version),
        (before.mtime, before.ctime, before.data_version)
    );
    assert!(e.read_chunk(f.ino, 0).unwrap().is_empty());
    assert_eq!(
        e.trash(1000, Duration::ZERO).unwrap().len(),
        trash_before + 1
    );
    // Releasing again changes nothing.
    assert_eq!(e.hsm_release(f.ino).unwrap(), a);
    // Writes of a released file are refused (the client restores first); nothing changes.
    let obj = e.alloc_object_ids(1).unwrap();
    assert_eq!(
        hsm_err(e.commit_slices(f.ino, &[obj_slice(0, 0, 10, obj)], 10, 5)),
        HsmError::Released
    );
    assert_eq!(
        hsm_err(e.setattr(
            f.ino,
            &SetAttr {
                size: Some(1),
                ..Default::default()
            }
        )),
        HsmError::Released
    );
    assert_eq!(
        hsm_err(e.fallocate(f.ino, 0, 100, false, false)),
        HsmError::Released
    );
    assert_eq!(
        hsm_err(e.rewrite_data(f.ino, &[], 0, 5)),
        HsmError::Released
    );
    assert_eq!(hsm_err(e.pcc_acquire(f.ino, "c1")), HsmError::Released);
    assert_eq!(e.getattr(f.ino).unwrap(), a);
    assert_eq!(
        hsm_err(e.hsm_request(f.ino, HsmAction::Archive, None)),
        HsmError::Released
    );
    assert_eq!(
        hsm_err(e.hsm_request(f.ino, HsmAction::Remove, None)),
        HsmError::Released
    );

    // Restore: several openers share one request; it goes before waiting archives.
    let other = file_with_data(e, b"g", 10);
    let ra = e
        .hsm_request(other.ino, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    let r1 = e
        .hsm_request(f.ino, HsmAction::Restore, None)
        .unwrap()
        .unwrap();
    let r2 = e
        .hsm_request(f.ino, HsmAction::Restore, None)
        .unwrap()
        .unwrap();
    assert_eq!(r1.id, r2.id);
    assert!(r1.priority > ra.priority);
    let t = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    assert_eq!(t.request.id, r1.id, "the restore first");
    assert_eq!(t.copy.as_ref().unwrap().key, "objs/f");
    assert_eq!(t.size, 5000);
    // The mover commits the first part: readable at once, the file is still released.
    let o1 = e.alloc_object_ids(2).unwrap();
    assert_eq!(
        e.hsm_restore_slices(ag, r1.id, &[obj_slice(0, 0, 3000, o1)])
            .unwrap(),
        Progress::Continue
    );
    let mid = e.getattr(f.ino).unwrap();
    assert!(mid.hsm.released());
    assert_eq!(
        (mid.size, mid.allocated, mid.data_version),
        (5000, 3000, a.data_version)
    );
    assert_eq!(e.read_chunk(f.ino, 0).unwrap().len(), 1);
    // The request shows the restored prefix (what an early reader may read).
    assert_eq!(e.hsm_get_request(r1.id).unwrap().restored, 3000);
    assert_eq!(e.hsm_action(f.ino).unwrap().unwrap().restored, 3000);
    e.hsm_restore_slices(ag, r1.id, &[obj_slice(0, 3000, 2000, o1 + 1)])
        .unwrap();
    assert_eq!(e.hsm_get_request(r1.id).unwrap().restored, 5000);
    // Sent again (its answer lost): not added twice, not counted twice.
    let used = e.targets().unwrap()[0].used;
    e.hsm_restore_slices(ag, r1.id, &[obj_slice(0, 3000, 2000, o1 + 1)])
        .unwrap();
    assert_eq!(e.targets().unwrap()[0].used, used);
    assert_eq!(e.read_chunk(f.ino, 0).unwrap().len(), 2);
    let done = HsmDone {
        data_version: t.data_version,
        bytes_moved: 5000,
        ..Default::default()
    };
    assert_eq!(e.hsm_complete(ag, r1.id, &done).unwrap(), HsmOutcome::Done);
    let b = e.getattr(f.ino).unwrap();
    assert_eq!(b.hsm, HsmFlags(HsmFlags::EXISTS | HsmFlags::ARCHIVED));
    assert_eq!((b.size, b.allocated, b.mtime), (5000, 5000, before.mtime));
    assert_eq!(e.read_chunk(f.ino, 0).unwrap().len(), 2);
    // Restored and clean: it can be released again, and written (then it is dirty).
    let w = e.alloc_object_ids(1).unwrap();
    let c = e
        .commit_slices(f.ino, &[obj_slice(0, 0, 10, w)], 10, 9)
        .unwrap();
    assert!(c.hsm.dirty() && c.hsm.archived());

    // REMOVE drops the copy and ARCHIVED.
    let rm = e
        .hsm_request(f.ino, HsmAction::Remove, None)
        .unwrap()
        .unwrap();
    assert_eq!(rm.key.as_deref(), Some("objs/f"));
    let ag2 = agent(e, &[1], 0);
    let tasks = e.hsm_take(ag2, 4).unwrap();
    let t = tasks.iter().find(|t| t.request.id == rm.id).unwrap();
    assert_eq!(t.copy.as_ref().unwrap().key, "objs/f");
    assert_eq!(
        e.hsm_complete(ag2, rm.id, &HsmDone::default()).unwrap(),
        HsmOutcome::Done
    );
    let st = e.hsm_state(f.ino).unwrap();
    assert!(!st.flags.archived());
    assert_eq!((st.archive_id, st.copy), (0, None));
}

/// Every write path sets DIRTY on an archived file (in its own transaction), and release is
/// then refused; a file without HSM state is untouched.
pub fn hsm_dirty_after_write(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    let ag = agent(e, &[1], 8);
    let plain = file_with_data(e, b"plain", 100);
    type Op<'a> = (&'a str, Box<dyn Fn(Ino) + 'a>);
    let ops: Vec<Op> = vec![
        (
            "commit",
            Box::new(|ino| {
                let o = e.alloc_object_ids(1).unwrap();
                e.commit_slices(ino, &[obj_slice(0, 0, 10, o)], 10, 11)
                    .unwrap();
            }),
        ),
        (
            "commit under a session",
            Box::new(|ino| {
                let s = live_sessions(e, 1)[1];
                let o = e.alloc_object_ids(1).unwrap();
                e.commit_slices_for(s, ino, &[obj_slice(0, 0, 10, o)], 10, 11)
                    .unwrap();
            }),
        ),
        (
            "truncate",
            Box::new(|ino| {
                e.setattr(
                    ino,
                    &SetAttr {
                        size: Some(50),
                        ..Default::default()
                    },
                )
                .unwrap();
            }),
        ),
        (
            "fallocate",
            Box::new(|ino| {
                e.fallocate(ino, 0, 1 << 20, false, false).unwrap();
            }),
        ),
        (
            "zeroing fallocate",
            Box::new(|ino| {
                e.fallocate(ino, 0, 10, true, true).unwrap();
            }),
        ),
        (
            "write-back",
            Box::new(|ino| {
                let o = e.alloc_object_ids(1).unwrap();
                e.rewrite_data(ino, &[obj_slice(0, 0, 7, o)], 7, 12)
                    .unwrap();
            }),
        ),
        (
            "pcc report",
            Box::new(|ino| {
                let l = e.pcc_acquire(ino, "c1").unwrap();
                e.pcc_report(ino, "c1", l.generation, true, 99, 13).unwrap();
                e.pcc_release(ino, "c1", l.generation).unwrap();
            }),
        ),
    ];
    for (i, (what, op)) in ops.iter().enumerate() {
        let f = file_with_data(e, format!("f{i}").as_bytes(), 100);
        archive(e, ag, f.ino);
        assert_eq!(
            flags(e, f.ino),
            HsmFlags::EXISTS | HsmFlags::ARCHIVED,
            "{what}"
        );
        op(f.ino);
        let a = e.getattr(f.ino).unwrap();
        assert!(a.hsm.dirty() && a.hsm.archived(), "{what} makes it dirty");
        assert_eq!(
            hsm_err(e.hsm_release(f.ino)),
            HsmError::ReleaseDirty,
            "{what}"
        );
        assert_eq!(HsmError::ReleaseDirty.errno(), libc::EBUSY);
        // Archiving again makes it clean and releasable.
        archive(e, ag, f.ino);
        assert_eq!(
            flags(e, f.ino),
            HsmFlags::EXISTS | HsmFlags::ARCHIVED,
            "{what}"
        );
        // The write of a file without HSM state leaves its flags alone.
        op(plain.ino);
        assert_eq!(flags(e, plain.ino), 0, "{what}");
    }
}

pub fn hsm_release_refusals(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    let ag = agent(e, &[1], 8);
    let f = file_with_data(e, b"f", 100);
    let r = hsm_err(e.hsm_release(f.ino));
    assert_eq!(r, HsmError::ReleaseNotArchived);
    assert_eq!(r.errno(), libc::EINVAL);
    let d = e.create(ROOT_INO, b"d", &super::dir(), None, None).unwrap();
    assert_eq!(hsm_err(e.hsm_release(d.ino)), HsmError::NotAFile);
    archive(e, ag, f.ino);
    e.hsm_set_flags(f.ino, HsmFlags::NORELEASE, 0).unwrap();
    let r = hsm_err(e.hsm_release(f.ino));
    assert_eq!(r, HsmError::ReleaseNoRelease);
    assert_eq!(r.errno(), libc::EPERM);
    e.hsm_set_flags(f.ino, 0, HsmFlags::NORELEASE).unwrap();
    // Open on a client: refused until the last close.
    let s = live_sessions(e, 1)[1];
    e.open_file(s, f.ino).unwrap();
    assert!(matches!(
        hsm_err(e.hsm_release(f.ino)),
        HsmError::ReleaseOpen(_)
    ));
    e.close_files(s, &[f.ino]).unwrap();
    // Under an RW-PCC lease: refused.
    let l = e.pcc_acquire(f.ino, "c1").unwrap();
    assert!(matches!(
        hsm_err(e.hsm_release(f.ino)),
        HsmError::ReleaseOpen(_)
    ));
    e.pcc_release(f.ino, "c1", l.generation).unwrap();
    // While a request is active: refused.
    let rm = e
        .hsm_request(f.ino, HsmAction::Remove, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        hsm_err(e.hsm_release(f.ino)),
        HsmError::Busy(HsmAction::Remove)
    );
    e.hsm_cancel_request(rm.id).unwrap();
    // Lost: refused (the copy cannot be read back).
    e.hsm_set_flags(f.ino, HsmFlags::LOST, 0).unwrap();
    assert_eq!(hsm_err(e.hsm_release(f.ino)), HsmError::Lost);
    e.hsm_set_flags(f.ino, 0, HsmFlags::LOST).unwrap();
    // Every refusal changed nothing: the data is all there.
    let a = e.getattr(f.ino).unwrap();
    assert_eq!(
        (a.allocated, e.read_chunk(f.ino, 0).unwrap().len()),
        (100, 1)
    );
    assert!(e.hsm_release(f.ino).unwrap().hsm.released());
    // Flags: only the user-settable ones, and any set brings EXISTS.
    assert_eq!(
        hsm_err(e.hsm_set_flags(f.ino, HsmFlags::RELEASED, 0)),
        HsmError::NotSettable(HsmFlags::RELEASED)
    );
    let g = file_with_data(e, b"g", 1);
    let st = e.hsm_set_flags(g.ino, HsmFlags::NOARCHIVE, 0).unwrap();
    assert_eq!(st.flags, HsmFlags(HsmFlags::NOARCHIVE | HsmFlags::EXISTS));
    let r = hsm_err(e.hsm_request(g.ino, HsmAction::Archive, None));
    assert_eq!(r, HsmError::NoArchiveFlag);
    assert_eq!(r.errno(), libc::EPERM);
    // A released file marked lost cannot be restored.
    e.hsm_set_flags(f.ino, HsmFlags::LOST, 0).unwrap();
    assert_eq!(
        hsm_err(e.hsm_request(f.ino, HsmAction::Restore, None)),
        HsmError::Lost
    );
}

/// A file written while its archive copy was being made is not marked archived.
pub fn hsm_archive_of_a_changed_file_is_stale(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    let ag = agent(e, &[1], 8);
    let f = file_with_data(e, b"f", 100);
    let r = e
        .hsm_request(f.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    let t = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    let o = e.alloc_object_ids(1).unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 10, o)], 10, 3)
        .unwrap();
    let done = HsmDone {
        key: "k".into(),
        data_version: t.data_version,
        size: 100,
        checksum: "c".into(),
        bytes_moved: 100,
    };
    assert_eq!(e.hsm_complete(ag, r.id, &done).unwrap(), HsmOutcome::Stale);
    assert_eq!(e.hsm_complete(ag, r.id, &done).unwrap(), HsmOutcome::Stale);
    let st = e.hsm_state(f.ino).unwrap();
    assert_eq!((st.flags, st.copy), (HsmFlags(HsmFlags::EXISTS), None));
    // An archived file changed during a new copy keeps its old copy and stays dirty.
    archive(e, ag, f.ino);
    let o = e.alloc_object_ids(1).unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 10, o)], 10, 4)
        .unwrap();
    let r = e
        .hsm_request(f.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    let t = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    e.fallocate(f.ino, 0, 1000, false, false).unwrap();
    let done = HsmDone {
        data_version: t.data_version,
        ..done
    };
    assert_eq!(e.hsm_complete(ag, r.id, &done).unwrap(), HsmOutcome::Stale);
    let st = e.hsm_state(f.ino).unwrap();
    assert!(st.flags.dirty() && st.flags.archived());
    assert_eq!(st.copy.unwrap().key, format!("k/{}", f.ino));
}

/// Restores before archives, then by age; per-agent and per-archive caps; an agent only gets
/// the archives it serves.
pub fn hsm_queue_priorities_and_caps(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    e.hsm_archive_add(2, "file:///a2").unwrap();
    let a1 = agent(e, &[1], 0);
    // Released files in archive 1 to restore.
    let mut released = Vec::new();
    for i in 0..2 {
        let f = file_with_data(e, format!("r{i}").as_bytes(), 10);
        archive_keep(e, a1, f.ino, 1);
        e.hsm_release(f.ino).unwrap();
        released.push(f.ino);
    }
    let mut archives = Vec::new();
    for i in 0..6 {
        let f = file_with_data(e, format!("a{i}").as_bytes(), 10);
        let r = e
            .hsm_request(f.ino, HsmAction::Archive, Some(1))
            .unwrap()
            .unwrap();
        archives.push(r.id);
    }
    let in2 = file_with_data(e, b"in2", 10);
    let r2 = e
        .hsm_request(in2.ino, HsmAction::Archive, Some(2))
        .unwrap()
        .unwrap();
    // Restores queued after the archives still come first.
    let mut restores = Vec::new();
    for ino in &released {
        restores.push(
            e.hsm_request(*ino, HsmAction::Restore, None)
                .unwrap()
                .unwrap()
                .id,
        );
    }
    // Per-agent cap: the agent's own (2) below the coordinator's (4).
    let small = agent(e, &[1], 2);
    let got: Vec<u64> = e
        .hsm_take(small, 10)
        .unwrap()
        .iter()
        .map(|t| t.request.id)
        .collect();
    assert_eq!(got, restores, "restores first, oldest first, 2 at most");
    assert!(e.hsm_take(small, 10).unwrap().is_empty(), "its cap is full");
    // Coordinator's per-agent cap (4) for an agent without its own; then per-archive cap.
    settings(e, |s| {
        s.max_per_agent = 4;
        s.max_per_archive = 5;
    });
    let big = agent(e, &[1], 0);
    let got: Vec<u64> = e
        .hsm_take(big, 10)
        .unwrap()
        .iter()
        .map(|t| t.request.id)
        .collect();
    // 2 running on archive 1 already: 3 more make the archive's 5.
    assert_eq!(got, archives[..3], "by age, up to the archive's cap");
    let other = agent(e, &[1, 2], 0);
    let got: Vec<u64> = e
        .hsm_take(other, 10)
        .unwrap()
        .iter()
        .map(|t| t.request.id)
        .collect();
    assert_eq!(got, [r2.id], "archive 1 is full; archive 2 is not");
    // A finished request frees its archive's slot.
    let t = e.hsm_get_request(archives[0]).unwrap();
    e.hsm_fail(big, t.id, "disk full", false).unwrap();
    let got: Vec<u64> = e
        .hsm_take(other, 10)
        .unwrap()
        .iter()
        .map(|t| t.request.id)
        .collect();
    assert_eq!(got, [archives[3]]);
    let agents = e.hsm_agents().unwrap();
    let running: Vec<(u64, u32)> = agents.iter().map(|a| (a.id, a.running)).collect();
    assert_eq!(running, [(a1, 0), (small, 2), (big, 2), (other, 2)]);
    let list = e.hsm_list(&HsmListFilter::default()).unwrap();
    assert_eq!(list.len(), 2 + 6 - 1 + 1, "active requests");
    assert!(list
        .iter()
        .take(6)
        .all(|r| r.state == RequestState::Started));
    let all = e
        .hsm_list(&HsmListFilter {
            include_done: true,
            ..Default::default()
        })
        .unwrap();
    assert!(all.iter().any(|r| r.state == RequestState::Failed));
}

/// Cancel acts at once on waiting and started requests; the mover is told to stop, and its
/// late completion changes nothing.
pub fn hsm_cancel_acts_at_once(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    let ag = agent(e, &[1], 0);
    let f = file_with_data(e, b"f", 10);
    let g = file_with_data(e, b"g", 10);
    let r = hsm_err(e.hsm_cancel(f.ino));
    assert_eq!(r, HsmError::NothingToCancel);
    assert_ne!(r.errno(), 0);
    let rf = e
        .hsm_request(f.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    let rg = e
        .hsm_request(g.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    let t = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    assert_eq!(t.request.id, rf.id);
    // The started one: canceled now, not after the copy.
    assert_eq!(e.hsm_cancel(f.ino).unwrap(), 1);
    assert_eq!(
        e.hsm_get_request(rf.id).unwrap().state,
        RequestState::Canceled
    );
    assert_eq!(e.hsm_progress(ag, rf.id, 5).unwrap(), Progress::Stop);
    let done = HsmDone {
        key: "k".into(),
        data_version: t.data_version,
        size: 10,
        checksum: "c".into(),
        bytes_moved: 10,
    };
    assert_eq!(
        e.hsm_complete(ag, rf.id, &done).unwrap(),
        HsmOutcome::Canceled
    );
    assert_eq!(flags(e, f.ino), HsmFlags::EXISTS, "not archived");
    assert_eq!(
        e.hsm_fail(ag, rf.id, "x", true).unwrap(),
        RequestState::Canceled
    );
    // The waiting one: never taken.
    let c = e.hsm_cancel_request(rg.id).unwrap();
    assert_eq!(c.state, RequestState::Canceled);
    assert!(e.hsm_take(ag, 4).unwrap().is_empty());
    assert_eq!(
        hsm_err(e.hsm_cancel_request(rg.id)),
        HsmError::NothingToCancel
    );
    assert_eq!(
        hsm_err(e.hsm_cancel_request(999_999)),
        HsmError::UnknownRequest(999_999)
    );
    // `hsm action` shows the last request when none is active.
    assert_eq!(
        e.hsm_action(g.ino).unwrap().unwrap().state,
        RequestState::Canceled
    );
    // A new request after a cancel is a new one.
    let again = e
        .hsm_request(g.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    assert_ne!(again.id, rg.id);
    // Marked noarchive while it waits: never taken, failed with the reason.
    e.hsm_set_flags(g.ino, HsmFlags::NOARCHIVE, 0).unwrap();
    assert!(e.hsm_take(ag, 4).unwrap().is_empty());
    let q = e.hsm_get_request(again.id).unwrap();
    assert_eq!(q.state, RequestState::Failed);
    assert!(q.last_error.unwrap().contains("noarchive"));
}

/// A request whose agent stopped reporting is requeued after the timeout (by the database's
/// clock), with backoff, and fails for good after its attempts; a failing mover's retries
/// wait their backoff.
pub fn hsm_timeouts_requeue_and_retries(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    settings(e, |s| {
        s.request_timeout_ns = 600 * MS;
        s.retry_backoff_ns = 600 * MS;
        s.max_attempts = 2;
    });
    let dead = agent(e, &[1], 0);
    let f = file_with_data(e, b"f", 10);
    let r = e
        .hsm_request(f.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    assert_eq!(e.hsm_take(dead, 1).unwrap().len(), 1);
    // Within the timeout nothing moves.
    assert_eq!(e.hsm_housekeep().unwrap().0, 0);
    std::thread::sleep(Duration::from_millis(700));
    // Requeued; the agent, silent as long and holding nothing now, is dropped.
    assert_eq!(e.hsm_housekeep().unwrap(), (1, 1, 0));
    let q = e.hsm_get_request(r.id).unwrap();
    assert_eq!(
        (q.state, q.agent, q.attempts),
        (RequestState::Waiting, None, 1)
    );
    assert!(q.last_error.unwrap().contains("requeued"));
    assert!(q.next_try > q.updated, "waits its backoff");
    // The silent agent's late report is refused: it must register again.
    assert_eq!(
        hsm_err(e.hsm_progress(dead, r.id, 1)),
        HsmError::UnknownAgent(dead)
    );
    let live = agent(e, &[1], 0);
    assert!(e.hsm_take(live, 1).unwrap().is_empty(), "backoff first");
    std::thread::sleep(Duration::from_millis(650));
    let t = e.hsm_take(live, 1).unwrap().pop().unwrap();
    assert_eq!((t.request.id, t.request.attempts), (r.id, 2));
    // The last attempt fails: for good, with its reason, even when the mover asks for a retry.
    assert_eq!(
        e.hsm_fail(live, r.id, "archive unreachable", true).unwrap(),
        RequestState::Failed
    );
    let q = e.hsm_action(f.ino).unwrap().unwrap();
    assert_eq!(q.state, RequestState::Failed);
    assert_eq!(q.last_error.as_deref(), Some("archive unreachable"));
    // A failure with attempts left waits again.
    let g = file_with_data(e, b"g", 10);
    let rg = e
        .hsm_request(g.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    e.hsm_take(live, 1).unwrap().pop().unwrap();
    assert_eq!(
        e.hsm_fail(live, rg.id, "try again", true).unwrap(),
        RequestState::Waiting
    );
    assert!(e.hsm_take(live, 1).unwrap().is_empty(), "backoff");
    // An agent that heartbeats is not dropped, even holding nothing.
    std::thread::sleep(Duration::from_millis(350));
    e.hsm_agent_heartbeat(live).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(e.hsm_housekeep().unwrap().1, 0);
    assert_eq!(
        hsm_err(e.hsm_agent_heartbeat(dead)),
        HsmError::UnknownAgent(dead)
    );
    e.hsm_agent_heartbeat(live).unwrap();
    // An agent that unregisters gives its requests back at once, the attempt not counted.
    let t = e.hsm_take(live, 1).unwrap().pop().unwrap();
    assert_eq!((t.request.id, t.request.attempts), (rg.id, 2));
    assert_eq!(e.hsm_agent_unregister(live).unwrap(), 1);
    let q = e.hsm_get_request(rg.id).unwrap();
    assert_eq!((q.state, q.attempts), (RequestState::Waiting, 1));
    // Final requests are purged after keep_done.
    settings(e, |s| s.keep_done_ns = 0);
    std::thread::sleep(Duration::from_millis(5));
    let (_, _, purged) = e.hsm_housekeep().unwrap();
    assert!(purged >= 1);
    assert_eq!(
        hsm_err(e.hsm_get_request(r.id)),
        HsmError::UnknownRequest(r.id)
    );
}

/// Unlinking an archived file forgets its copy, and queues its removal when configured; its
/// other requests are canceled.
pub fn hsm_unlink_of_archived_files(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    let ag = agent(e, &[1], 8);
    let f = file_with_data(e, b"f", 10);
    archive(e, ag, f.ino);
    e.unlink(ROOT_INO, b"f").unwrap();
    assert!(e.hsm_list(&HsmListFilter::default()).unwrap().is_empty());
    settings(e, |s| s.remove_archive_on_last_unlink = true);
    let g = file_with_data(e, b"g", 10);
    archive(e, ag, g.ino);
    e.unlink(ROOT_INO, b"g").unwrap();
    let list = e.hsm_list(&HsmListFilter::default()).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0].ino, list[0].action, list[0].key.clone()),
        (g.ino, HsmAction::Remove, Some(format!("k/{}", g.ino)))
    );
    let t = e.hsm_take(ag, 4).unwrap().pop().unwrap();
    assert_eq!(t.copy.unwrap().key, format!("k/{}", g.ino));
    assert_eq!(
        e.hsm_complete(ag, t.request.id, &HsmDone::default())
            .unwrap(),
        HsmOutcome::Done
    );
    // A waiting archive of a file that goes is canceled; a file open when unlinked keeps its
    // state until its last close.
    let h = file_with_data(e, b"h", 10);
    let r = e
        .hsm_request(h.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    e.unlink(ROOT_INO, b"h").unwrap();
    assert_eq!(
        e.hsm_get_request(r.id).unwrap().state,
        RequestState::Canceled
    );
    let k = file_with_data(e, b"k", 10);
    archive(e, ag, k.ino);
    let s = live_sessions(e, 1)[1];
    e.open_file(s, k.ino).unwrap();
    e.unlink(ROOT_INO, b"k").unwrap();
    assert!(e.hsm_list(&HsmListFilter::default()).unwrap().is_empty());
    e.close_files(s, &[k.ino]).unwrap();
    let list = e.hsm_list(&HsmListFilter::default()).unwrap();
    assert_eq!(
        list.iter().map(|r| (r.ino, r.action)).collect::<Vec<_>>(),
        [(k.ino, HsmAction::Remove)]
    );
}

/// Import makes released, archived files with the archive's size, mtime and mode; they
/// restore like any other.
pub fn hsm_import_makes_released_files(e: &dyn MetaEngine) {
    e.hsm_archive_add(3, "file:///a3").unwrap();
    let item = |name: &str, size| HsmImport {
        parent: ROOT_INO,
        name: name.as_bytes().to_vec(),
        perm: 0o640,
        uid: 7,
        gid: 8,
        size,
        mtime: 1_600_000_000_000_000_000,
        key: format!("tree/{name}"),
        checksum: String::new(),
        layout: layout(),
    };
    assert_eq!(
        hsm_err(e.hsm_import(4, &[item("x", 1)])),
        HsmError::UnknownArchive(4)
    );
    let got = e.hsm_import(3, &[item("a", 12345), item("b", 0)]).unwrap();
    assert_eq!(got.len(), 2);
    let a = e.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(
        (a.size, a.mtime, a.perm, a.uid, a.gid, a.allocated),
        (12345, 1_600_000_000_000_000_000, 0o640, 7, 8, 0)
    );
    assert_eq!(
        a.hsm,
        HsmFlags(HsmFlags::EXISTS | HsmFlags::ARCHIVED | HsmFlags::RELEASED)
    );
    let st = e.hsm_state(a.ino).unwrap();
    assert_eq!(st.archive_id, 3);
    assert_eq!(st.copy.unwrap().key, "tree/a");
    // A name that exists fails the whole batch.
    assert!(matches!(
        e.hsm_import(3, &[item("c", 1), item("a", 1)]),
        Err(MetaError::Exists)
    ));
    assert!(matches!(e.lookup(ROOT_INO, b"c"), Err(MetaError::NotFound)));
    let r = e
        .hsm_request(a.ino, HsmAction::Restore, None)
        .unwrap()
        .unwrap();
    assert_eq!((r.archive_id, r.key.as_deref()), (3, Some("tree/a")));
}

/// Each state change writes an HSM record with Lustre's event in its flags.
pub fn hsm_changelog_records(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    let ag = agent(e, &[1], 8);
    let f = file_with_data(e, b"f", 10);
    e.changelog_register(Mask::all(), DAY).unwrap();
    let events = |e: &dyn MetaEngine| -> Vec<(HsmEvent, u32, bool)> {
        e.changelog_read(None, Mask::all(), 0, u64::MAX, 1000)
            .unwrap()
            .into_iter()
            .filter(|r| r.typ == RecordType::Hsm)
            .map(|r| {
                assert_eq!(r.target, f.ino);
                (
                    HsmEvent::of_flags(r.flags).unwrap(),
                    r.flags & 0x7f,
                    r.flags & CLF_HSM_DIRTY != 0,
                )
            })
            .collect()
    };
    archive(e, ag, f.ino);
    let o = e.alloc_object_ids(1).unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 5, o)], 5, 3)
        .unwrap();
    // Only the write that made it dirty records.
    let o = e.alloc_object_ids(1).unwrap();
    e.commit_slices(f.ino, &[obj_slice(0, 0, 5, o)], 5, 4)
        .unwrap();
    archive(e, ag, f.ino);
    e.hsm_release(f.ino).unwrap();
    let r = e
        .hsm_request(f.ino, HsmAction::Restore, None)
        .unwrap()
        .unwrap();
    e.hsm_cancel(f.ino).unwrap();
    let r2 = e
        .hsm_request(f.ino, HsmAction::Restore, None)
        .unwrap()
        .unwrap();
    assert_ne!(r.id, r2.id);
    e.hsm_take(ag, 1).unwrap();
    e.hsm_fail(ag, r2.id, "gone", false).unwrap();
    e.hsm_set_flags(f.ino, HsmFlags::NORELEASE, 0).unwrap();
    assert_eq!(
        events(e),
        [
            (HsmEvent::Archive, 0, false),
            (HsmEvent::State, 0, true),
            (HsmEvent::Archive, 0, false),
            (HsmEvent::Release, 0, false),
            (HsmEvent::Cancel, 0, false),
            (HsmEvent::Restore, libc::EIO as u32, false),
            (HsmEvent::State, 0, false),
        ]
    );
}

/// Agents taking at the same time never take one request twice, nor pass the archive's cap.
pub fn hsm_concurrent_takers_respect_caps(e: &dyn MetaEngine) {
    use std::collections::HashSet;
    use std::sync::{Barrier, Mutex};
    e.hsm_archive_add(1, "file:///a1").unwrap();
    settings(e, |s| {
        s.max_per_archive = 7;
        s.max_per_agent = 4;
    });
    let mut ids = HashSet::new();
    for i in 0..30 {
        let f = file_with_data(e, format!("f{i}").as_bytes(), 10);
        ids.insert(
            e.hsm_request(f.ino, HsmAction::Archive, None)
                .unwrap()
                .unwrap()
                .id,
        );
    }
    const AGENTS: usize = 6;
    let agents: Vec<u64> = (0..AGENTS).map(|_| agent(e, &[1], 0)).collect();
    let barrier = Barrier::new(AGENTS);
    let first: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let done: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for ag in &agents {
            let (barrier, first, done) = (&barrier, &first, &done);
            s.spawn(move || {
                barrier.wait();
                let mut round = 0;
                loop {
                    let tasks = e.hsm_take(*ag, 10).unwrap();
                    if round == 0 {
                        first
                            .lock()
                            .unwrap()
                            .extend(tasks.iter().map(|t| t.request.id));
                        // Everyone took before anyone completes.
                        barrier.wait();
                    }
                    round += 1;
                    if tasks.is_empty() {
                        if e.hsm_list(&HsmListFilter::default()).unwrap().is_empty() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    for t in tasks {
                        let d = HsmDone {
                            key: "k".into(),
                            data_version: t.data_version,
                            size: t.size,
                            checksum: "c".into(),
                            bytes_moved: t.size,
                        };
                        assert_eq!(
                            e.hsm_complete(*ag, t.request.id, &d).unwrap(),
                            HsmOutcome::Done
                        );
                        done.lock().unwrap().push(t.request.id);
                    }
                }
            });
        }
    });
    let first = first.into_inner().unwrap();
    assert_eq!(first.len(), 7, "the archive's cap, all agents together");
    assert_eq!(first.iter().collect::<HashSet<_>>().len(), 7);
    let done = done.into_inner().unwrap();
    assert_eq!(done.len(), 30, "each request completed once");
    assert_eq!(done.into_iter().collect::<HashSet<_>>(), ids);
}

/// Cancels racing completions: each request ends either canceled (the file not archived) or
/// succeeded (archived), never both, never neither.
pub fn hsm_cancel_races_completion(e: &dyn MetaEngine) {
    use std::sync::Barrier;
    e.hsm_archive_add(1, "file:///a1").unwrap();
    settings(e, |s| s.max_per_agent = 64);
    let ag = agent(e, &[1], 0);
    let mut files = Vec::new();
    for i in 0..16 {
        let f = file_with_data(e, format!("f{i}").as_bytes(), 10);
        e.hsm_request(f.ino, HsmAction::Archive, None).unwrap();
        files.push(f.ino);
    }
    let tasks = e.hsm_take(ag, 64).unwrap();
    assert_eq!(tasks.len(), 16);
    let barrier = Barrier::new(2);
    let (outcomes, cancels) = std::thread::scope(|s| {
        let b = &barrier;
        let tasks = &tasks;
        let mover = s.spawn(move || {
            b.wait();
            tasks
                .iter()
                .map(|t| {
                    let d = HsmDone {
                        key: "k".into(),
                        data_version: t.data_version,
                        size: t.size,
                        checksum: "c".into(),
                        bytes_moved: t.size,
                    };
                    e.hsm_complete(ag, t.request.id, &d).unwrap()
                })
                .collect::<Vec<_>>()
        });
        let files = &files;
        let canceler = s.spawn(move || {
            b.wait();
            files
                .iter()
                .rev()
                .map(|ino| match e.hsm_cancel(*ino) {
                    Ok(n) => n,
                    Err(MetaError::Hsm(HsmError::NothingToCancel)) => 0,
                    Err(other) => panic!("{other}"),
                })
                .collect::<Vec<_>>()
        });
        (mover.join().unwrap(), canceler.join().unwrap())
    });
    let mut canceled = 0;
    for (t, outcome) in tasks.iter().zip(&outcomes) {
        let r = e.hsm_get_request(t.request.id).unwrap();
        let archived = e.getattr(t.request.ino).unwrap().hsm.archived();
        match outcome {
            HsmOutcome::Done => {
                assert_eq!(r.state, RequestState::Succeeded);
                assert!(archived);
            }
            HsmOutcome::Canceled => {
                assert_eq!(r.state, RequestState::Canceled);
                assert!(!archived);
                canceled += 1;
            }
            HsmOutcome::Stale => panic!("nothing wrote"),
        }
    }
    assert_eq!(canceled, cancels.iter().sum::<u64>());
}

/// The archive sweep deletes only what no mover can still make a file's copy: objects of
/// ARCHIVE requests that ended (failed, canceled, stale, or recorded another key) longer than
/// the grace ago by the database's clock; never a recorded copy (even after its file went),
/// nor one of an active, unknown or mismatched request.
pub fn hsm_sweep_keeps_what_may_still_count(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    e.hsm_archive_add(2, "file:///a2").unwrap();
    settings(e, |s| s.default_archive = 1);
    let ag = agent(e, &[1], 8);
    let item = |key: &str, ino: Ino, request: u64| SweepItem {
        key: key.into(),
        ino,
        request,
    };
    let done = |key: &str, t: &HsmTask| HsmDone {
        key: key.into(),
        data_version: t.data_version,
        size: 10,
        checksum: "c".into(),
        bytes_moved: 10,
    };
    // f: archived (its copy recorded), then unlinked (remove_archive_on_last_unlink off: the
    // copy stays in the archive, unrecorded). An older attempt's copy under another key is a
    // leftover.
    let f = file_with_data(e, b"f", 10);
    let rf = archive(e, ag, f.ino);
    let f_copy = format!("k/{}", f.ino);
    // g: started (a mover may still complete it), then waiting again.
    let g = file_with_data(e, b"g", 10);
    let rg = e
        .hsm_request(g.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap()
        .id;
    let tg = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    // h: failed for good; i: canceled; j: stale (changed during the copy).
    let mut ended = Vec::new();
    for name in [&b"h"[..], b"i", b"j"] {
        let a = file_with_data(e, name, 10);
        let r = e
            .hsm_request(a.ino, HsmAction::Archive, None)
            .unwrap()
            .unwrap()
            .id;
        let t = e.hsm_take(ag, 1).unwrap().pop().unwrap();
        match name {
            b"h" => assert_eq!(
                e.hsm_fail(ag, r, "disk on fire", false).unwrap(),
                RequestState::Failed
            ),
            b"i" => assert_eq!(e.hsm_cancel(a.ino).unwrap(), 1),
            _ => {
                let o = e.alloc_object_ids(1).unwrap();
                e.commit_slices(a.ino, &[obj_slice(0, 0, 10, o)], 10, 5)
                    .unwrap();
                assert_eq!(
                    e.hsm_complete(ag, r, &done("kj", &t)).unwrap(),
                    HsmOutcome::Stale
                );
            }
        }
        ended.push((a.ino, r));
    }
    let (h, i, j) = (ended[0], ended[1], ended[2]);
    e.unlink(ROOT_INO, b"f").unwrap();
    std::thread::sleep(Duration::from_millis(20));

    let items = vec![
        item(&f_copy, f.ino, rf),                  // 0 recorded once: kept
        item(&format!("{f_copy}.old"), f.ino, rf), // 1 another key of a Done request
        item(&format!("{f_copy}#3"), f.ino, rf),   // 2 a staging file of it
        item("kg", g.ino, rg),                     // 3 started
        item("kh", h.0, h.1),                      // 4 failed
        item("ki#1", i.0, i.1),                    // 5 canceled (staging)
        item("kj", j.0, j.1),                      // 6 stale
        item("kh", f.ino, h.1),                    // 7 names another file
        item("k?", h.0, 999_999),                  // 8 unknown request
    ];
    let want = [false, true, true, false, true, true, true, false, false];
    assert_eq!(e.hsm_sweepable(1, &items, 0).unwrap(), want);
    // Within the grace nothing goes; in another archive nothing matches.
    assert_eq!(
        e.hsm_sweepable(1, &items, DAY.as_nanos() as i64).unwrap(),
        [false; 9]
    );
    assert_eq!(e.hsm_sweepable(2, &items, 0).unwrap(), [false; 9]);
    // A key some file's copy records is kept, whatever its name says: h's object is
    // recorded once another file (k) is archived under it.
    let k = file_with_data(e, b"k", 10);
    let rk = e
        .hsm_request(k.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap()
        .id;
    let tk = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    assert_eq!(
        e.hsm_complete(ag, rk, &done("kh", &tk)).unwrap(),
        HsmOutcome::Done
    );
    assert_eq!(e.hsm_sweepable(1, &items[4..5], 0).unwrap(), [false]);
    // k archived again (its data changed): the first copy is superseded, once the new one
    // is older than the grace; the new one is kept.
    let o = e.alloc_object_ids(1).unwrap();
    e.commit_slices(k.ino, &[obj_slice(0, 0, 10, o)], 10, 6)
        .unwrap();
    let rk2 = e
        .hsm_request(k.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap()
        .id;
    let tk2 = e.hsm_take(ag, 1).unwrap().pop().unwrap();
    assert_eq!(
        e.hsm_complete(ag, rk2, &done("kk2", &tk2)).unwrap(),
        HsmOutcome::Done
    );
    std::thread::sleep(Duration::from_millis(20));
    let ks = [item("kh", k.ino, rk), item("kk2", k.ino, rk2)];
    assert_eq!(e.hsm_sweepable(1, &ks, 0).unwrap(), [true, false]);
    assert_eq!(
        e.hsm_sweepable(1, &ks, DAY.as_nanos() as i64).unwrap(),
        [false, false]
    );
    // g requeued (waiting): still kept; failed for good later: a leftover.
    assert_eq!(e.hsm_agent_unregister(ag).unwrap(), 1);
    assert_eq!(e.hsm_get_request(rg).unwrap().state, RequestState::Waiting);
    assert_eq!(e.hsm_sweepable(1, &items[3..4], 0).unwrap(), [false]);
    let _ = tg;
    assert_eq!(e.hsm_cancel(g.ino).unwrap(), 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(e.hsm_sweepable(1, &items[3..4], 0).unwrap(), [true]);
}

/// The HSM issues among `tierfs fsck`'s.
fn hsm_issues(e: &dyn MetaEngine) -> Vec<MetaIssue> {
    e.meta_issues(i64::MAX / 2)
        .unwrap()
        .into_iter()
        .filter(|i| {
            matches!(
                i,
                MetaIssue::ReleasedWithData { .. }
                    | MetaIssue::ArchivedWithoutCopy { .. }
                    | MetaIssue::CopyOfMissingFile { .. }
                    | MetaIssue::RequestOfMissingFile { .. }
                    | MetaIssue::ImpossibleRequest { .. }
                    | MetaIssue::DeadAgentRequest { .. }
            )
        })
        .collect()
}

/// fsck's HSM checks: healthy states (archived, released, a restore under way with its
/// prefix committed, a REMOVE outliving its unlinked file) are no issue; a failed restore's
/// leftover prefix in a released file and a started request nobody reported on for the
/// request timeout are, and their repairs trash the prefix / requeue the request.
pub fn hsm_fsck_finds_and_repairs(e: &dyn MetaEngine) {
    e.hsm_archive_add(1, "file:///a1").unwrap();
    settings(e, |s| {
        s.remove_archive_on_last_unlink = true;
        s.request_timeout_ns = 600 * MS;
        s.max_attempts = 3;
    });
    let ag = agent(e, &[1], 0);
    let kept = file_with_data(e, b"kept", 100);
    archive(e, ag, kept.ino);
    let gone = file_with_data(e, b"gone", 100);
    archive(e, ag, gone.ino);
    let rel = file_with_data(e, b"rel", 5000);
    archive(e, ag, rel.ino);
    e.hsm_release(rel.ino).unwrap();
    e.unlink(ROOT_INO, b"gone").unwrap();
    assert_eq!(hsm_issues(e), vec![], "healthy states");

    // A restore under way: its committed prefix is no issue...
    let r = e
        .hsm_request(rel.ino, HsmAction::Restore, None)
        .unwrap()
        .unwrap();
    let tasks = e.hsm_take(ag, 8).unwrap();
    assert!(tasks.iter().any(|t| t.request.id == r.id));
    let obj = e.alloc_object_ids(1).unwrap();
    assert_eq!(
        e.hsm_restore_slices(ag, r.id, &[obj_slice(0, 0, 2000, obj)])
            .unwrap(),
        Progress::Continue
    );
    assert_eq!(hsm_issues(e), vec![], "a restore under way");
    // ...until it fails for good: the prefix stays in the released file.
    assert_eq!(
        e.hsm_fail(ag, r.id, "bad copy", false).unwrap(),
        RequestState::Failed
    );
    // The REMOVE the unlink queued was taken above: finish it.
    for t in &tasks {
        if t.request.id != r.id {
            assert_eq!(t.request.action, HsmAction::Remove);
            let done = HsmDone::default();
            e.hsm_complete(ag, t.request.id, &done).unwrap();
        }
    }
    let issues = hsm_issues(e);
    assert_eq!(
        issues,
        vec![MetaIssue::ReleasedWithData {
            ino: rel.ino,
            slices: 1,
            allocated: 2000,
            archived: true
        }]
    );
    let trash_before = e.trash(1000, Duration::ZERO).unwrap().len();
    assert!(e.repair_issue(&issues[0], i64::MAX / 2).unwrap());
    assert!(!e.repair_issue(&issues[0], i64::MAX / 2).unwrap(), "once");
    let a = e.getattr(rel.ino).unwrap();
    assert!(a.hsm.released() && a.hsm.archived());
    assert_eq!((a.size, a.allocated), (5000, 0));
    assert!(e.read_chunk(rel.ino, 0).unwrap().is_empty());
    assert_eq!(
        e.trash(1000, Duration::ZERO).unwrap().len(),
        trash_before + 1
    );
    assert_eq!(hsm_issues(e), vec![]);

    // A started request no agent reported on for the request timeout.
    let f = file_with_data(e, b"f", 10);
    let q = e
        .hsm_request(f.ino, HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    assert_eq!(e.hsm_take(ag, 1).unwrap().len(), 1);
    assert_eq!(hsm_issues(e), vec![], "within the timeout");
    std::thread::sleep(Duration::from_millis(700));
    let issues = hsm_issues(e);
    assert_eq!(
        issues,
        vec![MetaIssue::DeadAgentRequest {
            request: q.id,
            ino: f.ino,
            agent: ag,
            registered: true
        }]
    );
    assert!(e.repair_issue(&issues[0], i64::MAX / 2).unwrap());
    let q = e.hsm_get_request(q.id).unwrap();
    assert_eq!((q.state, q.agent), (RequestState::Waiting, None));
    assert!(q.last_error.unwrap().contains("requeued (fsck)"));
    assert_eq!(hsm_issues(e), vec![]);
}
