//! Failure injection through [`FaultDriver`]: each namespace and data operation, failed at
//! each of its statements in turn, returns the error (EIO for a lost connection or a database
//! error) and leaves every persistent row as it was; a busy database at any statement is
//! retried and the operation happens exactly once. Run on SQLite here and on PostgreSQL by
//! `postgres/tests.rs`.

use std::any::Any;

use super::SqlMeta;
use crate::engine::{Admin, FileData, MetaEngine};
use crate::error::MetaError;
use crate::sql::fault::{Fault, FaultDriver};
use crate::sql::Driver;
use crate::types::*;

/// A fresh filesystem over a fault-injecting driver; the first element keeps its storage.
pub type FaultFactory<'a, D> = dyn Fn() -> (Box<dyn Any>, SqlMeta<FaultDriver<D>>) + 'a;

fn node(kind: Kind) -> NewNode {
    NewNode {
        kind,
        perm: 0o755,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    }
}

fn obj_slice(chunk: u64, len: u64, obj: u64) -> Slice {
    Slice {
        seq: 0,
        chunk,
        off: 0,
        len,
        data: SliceData::Object {
            target: 0,
            obj,
            obj_off: 0,
            obj_size: len,
        },
    }
}

/// The tree every operation starts from: `/d/a` (a file with data and an xattr), `/b`, `/c`,
/// the empty directory `/e`; and session 1, which `create` opens its file for.
fn setup(e: &dyn MetaEngine) -> Ctx {
    let now = now_nanos();
    let s = e
        .register_session(&SessionInfo {
            id: 0,
            client_name: "faults".into(),
            host: "h".into(),
            pid: 1,
            mountpoint: "/mnt".into(),
            version: "0".into(),
            started: now,
            heartbeat: now,
        })
        .unwrap();
    assert_eq!(s, 1);
    let layout = Layout {
        stripe_size: 1 << 20,
        targets: vec![0],
    };
    let d = e
        .create(ROOT_INO, b"d", &node(Kind::Dir), None, None)
        .unwrap();
    let a = e
        .create(d.ino, b"a", &node(Kind::File), Some(layout.clone()), None)
        .unwrap();
    let o = e.alloc_object_ids(2).unwrap();
    e.commit_slices(
        a.ino,
        &[obj_slice(0, 4096, o), obj_slice(1, 100, o + 1)],
        (1 << 20) + 100,
        1,
    )
    .unwrap();
    e.setxattr(a.ino, b"user.x", b"1", 0).unwrap();
    for n in [&b"b"[..], b"c"] {
        e.create(ROOT_INO, n, &node(Kind::File), Some(layout.clone()), None)
            .unwrap();
    }
    e.create(ROOT_INO, b"e", &node(Kind::Dir), None, None)
        .unwrap();
    // `/p`, unlinked while nobody had it open: left for the purge, with an object and an xattr.
    let p = e
        .create(ROOT_INO, b"p", &node(Kind::File), Some(layout), None)
        .unwrap();
    let o = e.alloc_object_ids(1).unwrap();
    e.commit_slices(p.ino, &[obj_slice(0, 10, o)], 10, 1)
        .unwrap();
    e.setxattr(p.ino, b"user.x", b"1", 0).unwrap();
    e.unlink(ROOT_INO, b"p").unwrap();
    Ctx {
        d: ino(e, &[b"d"]),
        a: ino(e, &[b"d", b"a"]),
        b: ino(e, &[b"b"]),
        c: ino(e, &[b"c"]),
        e: ino(e, &[b"e"]),
    }
}

/// The inodes of [`setup`]'s tree (found before any fault is armed).
struct Ctx {
    d: Ino,
    a: Ino,
    b: Ino,
    c: Ino,
    e: Ino,
}

fn ino(e: &dyn MetaEngine, path: &[&[u8]]) -> Ino {
    let mut cur = ROOT_INO;
    for p in path {
        cur = e.lookup(cur, p).unwrap().ino;
    }
    cur
}

type Op = fn(&dyn MetaEngine, &Ctx) -> crate::error::Result<()>;

/// The operations under test, each one transaction.
fn ops() -> Vec<(&'static str, Op)> {
    vec![
        ("create", |e, _| {
            e.create(ROOT_INO, b"n", &node(Kind::File), None, Some(1))
                .map(|_| ())
        }),
        ("mkdir", |e, _| {
            e.create(ROOT_INO, b"m", &node(Kind::Dir), None, None)
                .map(|_| ())
        }),
        ("unlink", |e, _| e.unlink(ROOT_INO, b"b").map(|_| ())),
        ("unlink with data", |e, t| e.unlink(t.d, b"a").map(|_| ())),
        ("rmdir", |e, _| e.rmdir(ROOT_INO, b"e")),
        ("rename over a file", |e, _| {
            e.rename(ROOT_INO, b"b", ROOT_INO, b"c", 0).map(|_| ())
        }),
        ("rename exchange", |e, _| {
            e.rename(ROOT_INO, b"b", ROOT_INO, b"c", libc::RENAME_EXCHANGE)
                .map(|_| ())
        }),
        ("rename a directory", |e, t| {
            e.rename(ROOT_INO, b"d", t.e, b"d", 0).map(|_| ())
        }),
        ("link", |e, t| e.link(t.b, t.d, b"b2").map(|_| ())),
        ("truncate", |e, t| {
            e.setattr(
                t.a,
                &SetAttr {
                    size: Some(10),
                    ..Default::default()
                },
            )
            .map(|_| ())
        }),
        ("setxattr", |e, t| e.setxattr(t.a, b"user.y", b"2", 0)),
        ("commit_slices", |e, t| {
            e.commit_slices(t.b, &[obj_slice(0, 10, 1000)], 10, 5)
                .map(|_| ())
        }),
        ("set_projid", |e, t| e.set_projid(t.d, 7, true).map(|_| ())),
        ("purge_unlinked", |e, _| {
            match e.purge_unlinked(64, now_nanos() + 1)? {
                1 => Ok(()),
                n => Err(MetaError::Invalid(format!(
                    "freed {n} files, not setup's /p"
                ))),
            }
        }),
    ]
}

fn snapshot(e: &dyn MetaEngine) -> Vec<DumpRow> {
    let mut v = Vec::new();
    e.export_rows(&mut |r| {
        v.push(r);
        Ok(())
    })
    .unwrap();
    v
}

/// See the module doc. `every_busy`: a busy database at every statement of each operation
/// (a fresh filesystem each); otherwise at its first, middle and last statement.
pub fn faults_leave_nothing_half_done<D: Driver>(factory: &FaultFactory<'_, D>, every_busy: bool) {
    for (name, op) in ops() {
        // Fails each statement in turn, on one filesystem (a failure changes nothing), until
        // the operation has fewer statements than the fault's number.
        let (_keep, e) = factory();
        let t = setup(&e);
        let mut n = 1;
        loop {
            assert!(n < 200, "{name}: still failing at statement {n}");
            let before = snapshot(&e);
            let fault = if n % 2 == 0 {
                Fault::Disconnect
            } else {
                Fault::Error
            };
            e.driver().fail_in(n, fault.clone());
            match op(&e, &t) {
                Err(err) => {
                    e.driver().clear();
                    assert!(
                        matches!(err, MetaError::Unavailable(_) | MetaError::Db(_)),
                        "{name}: statement {n} ({fault:?}) failed with {err:?}"
                    );
                    assert_eq!(err.errno(), libc::EIO, "{name}");
                    assert_eq!(
                        snapshot(&e),
                        before,
                        "{name}: a failure at statement {n} left rows changed"
                    );
                    n += 1;
                }
                Ok(()) => {
                    e.driver().clear();
                    assert!(
                        n > 1,
                        "{name}: succeeded although its first statement failed"
                    );
                    assert_ne!(snapshot(&e), before, "{name}: did nothing");
                    assert!(e.meta_issues(i64::MAX).unwrap().is_empty(), "{name}");
                    break;
                }
            }
        }
        // A busy database at each statement: retried, done exactly once.
        let statements = n - 1;
        let mut points: Vec<u64> = if every_busy {
            (1..=statements).collect()
        } else {
            vec![1, statements.div_ceil(2), statements]
        };
        points.dedup();
        for k in points {
            let (_keep, e) = factory();
            let t = setup(&e);
            let (b, c) = (t.b, t.c);
            e.driver().fail_in(k, Fault::Busy);
            op(&e, &t).unwrap_or_else(|err| panic!("{name}: busy at statement {k}: {err:?}"));
            e.driver().clear();
            assert!(e.meta_issues(i64::MAX).unwrap().is_empty(), "{name}");
            match name {
                // Twice would swap the names back.
                "rename exchange" => {
                    assert_eq!((ino(&e, &[b"b"]), ino(&e, &[b"c"])), (c, b), "{name}")
                }
                // Twice would append two slices.
                "commit_slices" => assert_eq!(e.read_chunk(b, 0).unwrap().len(), 1, "{name}"),
                // The same result however often they run.
                "truncate" | "setxattr" | "set_projid" => {}
                // Done once: doing it again is refused and changes nothing.
                _ => {
                    let after = snapshot(&e);
                    assert!(op(&e, &t).is_err(), "{name}: could be done twice");
                    assert_eq!(snapshot(&e), after, "{name}");
                }
            }
        }
        eprintln!("faults: {name}: {statements} statements, each failure left no trace");
    }
}

#[test]
fn faults_leave_nothing_half_done_on_sqlite() {
    faults_leave_nothing_half_done(
        &|| {
            let dir = tempfile::tempdir().unwrap();
            let d = crate::sqlite::SqliteEngine::format(
                &dir.path().join("m.db"),
                &crate::conformance::params(),
            )
            .unwrap();
            (
                Box::new(dir) as Box<dyn Any>,
                SqlMeta::new(FaultDriver::new(d)),
            )
        },
        true,
    );
}

#[test]
fn a_delayed_statement_runs_late_and_counts_once() {
    use crate::engine::Namespace;
    let dir = tempfile::tempdir().unwrap();
    let d = crate::sqlite::SqliteEngine::format(
        &dir.path().join("m.db"),
        &crate::conformance::params(),
    )
    .unwrap();
    let e = SqlMeta::new(FaultDriver::new(d));
    let n = e.driver().statements();
    e.driver()
        .fail_in(1, Fault::Delay(std::time::Duration::from_millis(200)));
    let t = std::time::Instant::now();
    assert_eq!(e.getattr(ROOT_INO).unwrap().kind, Kind::Dir);
    assert!(t.elapsed() >= std::time::Duration::from_millis(200));
    assert_eq!(e.driver().statements(), n + 1);
    // Fired once: nothing is left planned.
    assert_eq!(e.driver().pending(), 0);
}
