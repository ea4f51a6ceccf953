//! Setattrs that wait for the commit of buffered writes (data/deferred.rs), on the data path
//! of a real SQLite engine wrapped by a fault-injecting one: what is kept, what goes in the
//! commit, and that a failed commit loses none of it.

use std::sync::Arc;

use parking_lot::Mutex;
use tierfs_meta::faulty::{Fault, FaultPlan, FaultyEngine};
use tierfs_meta::{SetAttr, TimeSet};

use super::fixture::{fixture_with, Fixture};

/// The fixture's file, made 0600 as tar creates the files it extracts.
fn faulty() -> (Arc<FaultPlan>, Fixture) {
    let plan = FaultPlan::new();
    let p = Arc::clone(&plan);
    let f = fixture_with(|m| Arc::new(FaultyEngine::new(m, p)));
    f.data.meta.setattr(f.ino, &chmod(0o600)).unwrap();
    (plan, f)
}

/// Setattrs that reached the engine after [`faulty`]'s own.
fn setattrs(plan: &FaultPlan) -> u64 {
    plan.calls("setattr") - 1
}

fn chmod(p: u32) -> SetAttr {
    SetAttr {
        perm: Some(p),
        ..Default::default()
    }
}

/// tar's three setattrs after its writes: futimens (mtime only), fchown by root, fchmod.
fn tar_setattrs() -> [SetAttr; 3] {
    [
        SetAttr {
            mtime: Some(TimeSet::At(1_700_000_000_000_000_000)),
            ..Default::default()
        },
        SetAttr {
            uid: Some(1000),
            gid: Some(1000),
            kill_setid: true,
            ..Default::default()
        },
        chmod(0o664),
    ]
}

#[test]
fn the_setattrs_of_a_file_being_written_go_in_its_commit() {
    let (plan, f) = faulty();
    f.data.write(f.ino, 0, b"hello").unwrap();
    let mut last = None;
    for set in tar_setattrs() {
        last = Some(f.data.defer_setattr(f.ino, &set).expect("may wait"));
    }
    let answered = last.unwrap();
    assert_eq!(
        (answered.perm, answered.uid, answered.gid, answered.mtime),
        (0o664, 1000, 1000, 1_700_000_000_000_000_000)
    );
    assert_eq!(setattrs(&plan), 0, "nothing reached the engine");
    assert_eq!(plan.calls("commit_slices"), 0);
    // The engine still has the file as created; this client shows it changed.
    let before = f.data.meta.getattr(f.ino).unwrap();
    assert_eq!((before.perm, before.uid), (0o600, 0));
    let shown = f.data.shown(&before).expect("changes wait");
    assert_eq!((shown.perm, shown.uid, shown.gid), (0o664, 1000, 1000));
    assert!(shown.ctime >= before.ctime);

    let committed = f.data.flush(f.ino).unwrap().expect("a commit");
    assert_eq!(
        plan.calls("commit_slices"),
        1,
        "one transaction for all of it"
    );
    assert_eq!(setattrs(&plan), 0);
    let a = f.data.meta.getattr(f.ino).unwrap();
    assert_eq!(
        (a.perm, a.uid, a.gid, a.mtime, a.size),
        (0o664, 1000, 1000, 1_700_000_000_000_000_000, 5)
    );
    assert_eq!(committed.perm, 0o664);
    assert!(f.data.shown(&a).is_none(), "nothing waits any more");
    f.finish();
}

#[test]
fn what_takes_away_or_finds_nothing_buffered_does_not_wait() {
    let (plan, f) = faulty();
    assert!(
        f.data.defer_setattr(f.ino, &chmod(0o666)).is_none(),
        "nothing is buffered"
    );
    f.data.write(f.ino, 0, b"x").unwrap();
    f.data
        .defer_setattr(f.ino, &chmod(0o644))
        .expect("adds read");
    assert!(
        f.data.defer_setattr(f.ino, &chmod(0o600)).is_none(),
        "0644 (as shown here) -> 0600 takes read away from group and others"
    );
    let regroup = SetAttr {
        gid: Some(5),
        ..Default::default()
    };
    assert!(
        f.data.defer_setattr(f.ino, &regroup).is_none(),
        "group 0 would lose its read bit"
    );
    assert!(f.data.defer_setattr(f.ino, &chmod(0o4755)).is_none());
    let truncate = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    assert!(f.data.defer_setattr(f.ino, &truncate).is_none());
    let give_away = SetAttr {
        uid: Some(7),
        ..Default::default()
    };
    f.data
        .defer_setattr(f.ino, &give_away)
        .expect("root gives the file away");
    let again = SetAttr {
        uid: Some(8),
        ..Default::default()
    };
    assert!(
        f.data.defer_setattr(f.ino, &again).is_none(),
        "owner 7 (as shown here) would lose the file"
    );
    assert_eq!(setattrs(&plan), 0);
    f.finish();
}

#[test]
fn a_failed_commit_keeps_the_waiting_changes_for_the_next() {
    let (plan, f) = faulty();
    f.data.write(f.ino, 0, b"data").unwrap();
    for set in tar_setattrs() {
        f.data.defer_setattr(f.ino, &set).expect("may wait");
    }
    plan.fail_next("commit_slices", 1, Fault::Error);
    assert!(f.data.flush(f.ino).is_err());
    let a = f.data.meta.getattr(f.ino).unwrap();
    assert_eq!((a.perm, a.uid, a.size), (0o600, 0, 0), "nothing committed");
    let shown = f.data.shown(&a).expect("the changes still wait");
    assert_eq!((shown.perm, shown.uid), (0o664, 1000));
    // A change made after the failure is newer than the ones put back.
    f.data
        .defer_setattr(f.ino, &chmod(0o666))
        .expect("may wait");
    f.data.flush(f.ino).unwrap().expect("a commit");
    let a = f.data.meta.getattr(f.ino).unwrap();
    assert_eq!(
        (a.perm, a.uid, a.gid, a.mtime, a.size),
        (0o666, 1000, 1000, 1_700_000_000_000_000_000, 4)
    );
    f.finish();
}

#[test]
fn a_write_after_given_times_makes_the_commit_time_the_mtime() {
    let (_plan, f) = faulty();
    f.data.write(f.ino, 0, b"one").unwrap();
    let old = 1_000_000_000;
    let times = SetAttr {
        mtime: Some(TimeSet::At(old)),
        atime: Some(TimeSet::At(old)),
        ..Default::default()
    };
    f.data.defer_setattr(f.ino, &times).unwrap();
    f.data.write(f.ino, 3, b"two").unwrap();
    f.data.flush(f.ino).unwrap();
    let a = f.data.meta.getattr(f.ino).unwrap();
    assert!(a.mtime > old, "the write came after the futimens");
    assert_eq!(a.atime, old, "atime stays as given");
    assert_eq!(a.size, 6);
    f.finish();
}

#[test]
fn an_acl_that_came_meanwhile_follows_the_waiting_chmod() {
    let (_plan, f) = faulty();
    let seen: Arc<Mutex<Vec<(u64, u32)>>> = Arc::default();
    let s = Arc::clone(&seen);
    f.data
        .set_chmod_hook(Box::new(move |ino, mode| s.lock().push((ino, mode))));
    f.data.write(f.ino, 0, b"x").unwrap();
    f.data.defer_setattr(f.ino, &chmod(0o664)).unwrap();
    // Another client gives the file an ACL before the commit.
    f.data
        .meta
        .setxattr(f.ino, b"system.posix_acl_access", b"acl", 0)
        .unwrap();
    f.data.flush(f.ino).unwrap();
    assert_eq!(*seen.lock(), vec![(f.ino, 0o664)]);
    // Without an ACL, a waiting chmod needs nothing more.
    f.data.write(f.ino, 1, b"y").unwrap();
    f.data
        .meta
        .removexattr(f.ino, b"system.posix_acl_access")
        .unwrap();
    let a = f.data.meta.getattr(f.ino).unwrap();
    f.data.open(&a, false);
    f.data.defer_setattr(f.ino, &chmod(0o666)).unwrap();
    f.data.flush(f.ino).unwrap();
    assert_eq!(seen.lock().len(), 1);
    f.finish();
}

/// A chmod this client made at once (nothing was buffered then) is what a later change is
/// judged on: 0666 -> 0644 takes write away, so it does not wait (before, the file's
/// attributes here still said 0600 and the chmod passed as one that adds read).
#[test]
fn a_change_made_at_once_here_is_what_later_ones_are_judged_on() {
    let (_plan, f) = faulty();
    f.data.write(f.ino, 0, b"x").unwrap();
    f.data.flush(f.ino).unwrap();
    let a = f.data.meta.setattr(f.ino, &chmod(0o666)).unwrap();
    f.data.attrs_set(&a);
    f.data.write(f.ino, 1, b"y").unwrap();
    assert!(
        f.data.defer_setattr(f.ino, &chmod(0o644)).is_none(),
        "0666 -> 0644 takes write away"
    );
    let shown = f.data.defer_setattr(f.ino, &chmod(0o667)).expect("adds x");
    assert_eq!(shown.perm, 0o667);
    f.data.flush(f.ino).unwrap();
    assert_eq!(f.data.meta.getattr(f.ino).unwrap().perm, 0o667);
    f.finish();
}

/// rsync's `fchmod` right after its create: nothing is buffered yet, but a handle is open for
/// writing here, so the change waits for that handle's close (its flush): with the data when
/// something was written, alone otherwise; a change made between the close and the release
/// goes at the release. A read-only handle keeps nothing waiting.
#[test]
fn a_handle_open_for_writing_keeps_changes_for_its_close() {
    let (plan, f) = faulty();
    let a = f.data.meta.getattr(f.ino).unwrap();
    f.data.open(&a, false);
    assert!(
        f.data.defer_setattr(f.ino, &chmod(0o644)).is_none(),
        "read-only: no commit to wait for"
    );
    f.data.open(&a, true);
    f.data.defer_setattr(f.ino, &chmod(0o600)).expect("waits");
    f.data.write(f.ino, 0, b"data").unwrap();
    f.data.flush(f.ino).unwrap().expect("a commit");
    assert_eq!(setattrs(&plan), 0, "in the commit");
    assert_eq!(plan.calls("commit_slices"), 1);
    // nothing written: the close commits the change alone
    f.data.defer_setattr(f.ino, &chmod(0o640)).expect("waits");
    let a = f.data.flush(f.ino).unwrap().expect("the change committed");
    assert_eq!(a.perm, 0o640);
    assert_eq!(setattrs(&plan), 1);
    assert_eq!(f.data.meta.getattr(f.ino).unwrap().perm, 0o640);
    // after the close, before the release: at the release
    f.data.defer_setattr(f.ino, &chmod(0o644)).expect("waits");
    f.data.release(f.ino, false);
    assert_eq!(
        f.data.meta.getattr(f.ino).unwrap().perm,
        0o640,
        "one open left"
    );
    plan.fail_next("setattr", 1, Fault::Error);
    f.data.release(f.ino, true);
    assert_eq!(
        f.data.meta.getattr(f.ino).unwrap().perm,
        0o640,
        "the engine failed"
    );
    assert!(f.data.has_deferred(f.ino), "kept for the retry");
    assert_eq!(f.data.retry_unflushed(), 1);
    assert_eq!(f.data.meta.getattr(f.ino).unwrap().perm, 0o644);
    assert!(!f.data.has_deferred(f.ino));
    f.finish();
}

/// A writer that keeps its file open and writes nothing more does not hold a waiting change
/// back for longer than `DEFERRED_MAX_AGE`: the `commit-retry` worker commits it (here with a
/// maximum age of zero), and the file's state stays for its open handle.
#[test]
fn changes_that_waited_too_long_are_committed_while_the_file_stays_open() {
    let (plan, f) = faulty();
    let a = f.data.meta.getattr(f.ino).unwrap();
    f.data.open(&a, true);
    f.data.defer_setattr(f.ino, &chmod(0o644)).expect("waits");
    assert_eq!(
        f.data.commit_kept(std::time::Duration::from_secs(3600)),
        0,
        "young"
    );
    assert_eq!(f.data.meta.getattr(f.ino).unwrap().perm, 0o600);
    assert_eq!(f.data.commit_kept(std::time::Duration::ZERO), 1);
    assert_eq!(f.data.meta.getattr(f.ino).unwrap().perm, 0o644);
    assert_eq!(setattrs(&plan), 1);
    assert!(!f.data.has_deferred(f.ino));
    // still open for writing here: the next grant waits again
    f.data.defer_setattr(f.ino, &chmod(0o664)).expect("waits");
    f.data.release(f.ino, true);
    assert_eq!(f.data.meta.getattr(f.ino).unwrap().perm, 0o664);
    f.finish();
}

/// A stat here shows, from one look at the file's state, the waiting changes, the size the
/// buffered writes make and the bytes they hold.
#[test]
fn a_stat_here_shows_waiting_changes_size_and_blocks_at_once() {
    let (_plan, f) = faulty();
    f.data.write(f.ino, 0, &[7u8; 3000]).unwrap();
    f.data.defer_setattr(f.ino, &chmod(0o644)).expect("waits");
    let engine = f.data.meta.getattr(f.ino).unwrap();
    assert_eq!((engine.size, engine.perm), (0, 0o600));
    let (shown, size, allocated) = f.data.local_view(&engine);
    assert_eq!(shown.map(|a| a.perm), Some(0o644));
    assert_eq!((size, allocated), (3000, 3000));
    f.data.flush(f.ino).unwrap();
    let engine = f.data.meta.getattr(f.ino).unwrap();
    let (shown, size, allocated) = f.data.local_view(&engine);
    assert!(shown.is_none());
    assert_eq!(
        (size, allocated, engine.perm),
        (3000, engine.allocated.min(3000), 0o644)
    );
    f.finish();
}
