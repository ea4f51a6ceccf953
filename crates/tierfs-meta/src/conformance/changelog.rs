//! Conformance checks of the changelog: the metadata operations write their records, in the
//! same transaction, with the caller's context, only while a reader wants them.
//! (The storage itself, order under concurrency, purge and idle readers: `core::changelog`.)

use std::time::Duration;

use super::{dir, file, layout, obj_slice};
use crate::changelog::{Caller, ChangelogRecord, Mask, RecordType, FLAG_LAST};
use crate::engine::MetaEngine;
use crate::types::*;

const DAY: Duration = Duration::from_secs(86_400);

fn records(e: &dyn MetaEngine) -> Vec<ChangelogRecord> {
    e.changelog_read(None, Mask::all(), 0, u64::MAX, 100_000)
        .unwrap()
}

fn types(v: &[ChangelogRecord]) -> Vec<RecordType> {
    v.iter().map(|r| r.typ).collect()
}

fn caller() -> Caller {
    Caller {
        uid: 1234,
        gid: 567,
        client: Some("conf-client".into()),
        jobid: Some("job-9".into()),
    }
}

/// Data and session operations: OPEN, MTIME (commit, zeroing fallocate), CTIME (fallocate
/// that grows), TRUNC+MTIME (a write-back that shrinks), CLOSE; nothing before a reader.
pub fn changelog_data_and_session_records(e: &dyn MetaEngine) {
    let s = e
        .register_session(&SessionInfo {
            id: 0,
            client_name: "c".into(),
            host: "h".into(),
            pid: 1,
            mountpoint: "/m".into(),
            version: "t".into(),
            started: 0,
            heartbeat: 0,
        })
        .unwrap();
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), None)
        .unwrap()
        .ino;
    // No reader: operations write nothing.
    e.open_file(s, f).unwrap();
    e.commit_slices(f, &[obj_slice(0, 0, 10, 1)], 10, 5)
        .unwrap();
    e.close_files(s, &[f]).unwrap();
    assert!(records(e).is_empty());
    assert_eq!(e.changelog_status().unwrap().current, 0);

    let r = e.changelog_register(Mask::all(), DAY).unwrap();
    {
        let _c = caller().enter();
        e.open_file(s, f).unwrap();
        e.commit_slices(f, &[obj_slice(0, 0, 20, 2)], 20, 6)
            .unwrap();
        e.fallocate(f, 0, 5, true, true).unwrap();
        e.fallocate(f, 0, 1 << 20, false, false).unwrap();
        e.rewrite_data(f, &[obj_slice(0, 0, 3, 3)], 3, 7).unwrap();
    }
    // A close in the batch scope carries its opener's context, not the thread's.
    {
        let _batch = crate::changelog::enter_batch(vec![(
            f,
            Caller {
                uid: 42,
                ..caller()
            },
        )]);
        e.close_files(s, &[f]).unwrap();
    }
    let v = records(e);
    assert_eq!(
        types(&v),
        [
            RecordType::Open,
            RecordType::Mtime,
            RecordType::Mtime,
            RecordType::Ctime,
            RecordType::Trunc,
            RecordType::Mtime,
            RecordType::Close
        ]
    );
    for x in &v[..6] {
        assert_eq!((x.target, x.uid, x.gid), (f, 1234, 567));
        assert_eq!(x.client, "conf-client");
        assert_eq!(x.jobid.as_deref(), Some("job-9"));
    }
    assert_eq!(v[6].uid, 42);
    assert!(v.windows(2).all(|w| w[0].index < w[1].index));

    // A reader of CLOSE only: other types are no longer written once it is the only one.
    e.changelog_deregister(r).unwrap();
    e.changelog_register(Mask::parse("CLOSE").unwrap(), DAY)
        .unwrap();
    e.open_file(s, f).unwrap();
    e.commit_slices(f, &[obj_slice(0, 0, 20, 4)], 20, 8)
        .unwrap();
    e.close_files(s, &[f]).unwrap();
    assert_eq!(types(&records(e)), [RecordType::Close]);
}

/// Namespace operations: every type with its parent, name, source and flags.
pub fn changelog_namespace_records(e: &dyn MetaEngine) {
    e.changelog_register(Mask::all(), DAY).unwrap();
    let _c = caller().enter();
    let d = e.create(ROOT_INO, b"d", &dir(), None, None).unwrap().ino;
    let f = e
        .create(d, b"f", &file(), Some(layout()), None)
        .unwrap()
        .ino;
    e.link(f, ROOT_INO, b"hard").unwrap();
    let sl = NewNode {
        kind: Kind::Symlink,
        symlink: Some(b"f".to_vec()),
        ..file()
    };
    let l = e.create(d, b"sym", &sl, None, None).unwrap().ino;
    let fifo = NewNode {
        kind: Kind::Fifo,
        ..file()
    };
    let n = e.create(d, b"fifo", &fifo, None, None).unwrap().ino;
    e.setattr(
        f,
        &SetAttr {
            perm: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    e.setattr(
        f,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    e.setattr(
        f,
        &SetAttr {
            mtime: Some(TimeSet::At(99)),
            ..Default::default()
        },
    )
    .unwrap();
    e.setxattr(f, b"user.a", b"1", 0).unwrap();
    e.removexattr(f, b"user.a").unwrap();
    e.set_dir_stripe(
        d,
        StripeDefault {
            stripe_count: 2,
            stripe_size: 1 << 20,
        },
    )
    .unwrap();
    e.rename(d, b"f", ROOT_INO, b"g", 0).unwrap();
    // A rename over an existing name: RENME, and RNMTO for the file it replaced.
    e.rename(d, b"fifo", d, b"sym", 0).unwrap();
    e.unlink(ROOT_INO, b"hard").unwrap();
    e.unlink(ROOT_INO, b"g").unwrap();
    e.unlink(d, b"sym").unwrap();
    e.rmdir(ROOT_INO, b"d").unwrap();
    let v = records(e);
    use RecordType::*;
    assert_eq!(
        types(&v),
        [
            Mkdir, Creat, Hlink, Slink, Mknod, Sattr, Trunc, Mtime, Xattr, Xattr, Lyout, Renme,
            Renme, Rnmto, Unlnk, Unlnk, Unlnk, Rmdir
        ],
        "{v:#?}"
    );
    let at = |i: usize| (v[i].target, v[i].parent, v[i].name.clone());
    assert_eq!(at(0), (d, ROOT_INO, b"d".to_vec()));
    assert_eq!(at(1), (f, d, b"f".to_vec()));
    assert_eq!(at(2), (f, ROOT_INO, b"hard".to_vec()));
    assert_eq!(at(3), (l, d, b"sym".to_vec()));
    assert_eq!(at(4), (n, d, b"fifo".to_vec()));
    assert_eq!(v[5].target, f);
    assert_eq!(v[8].name, b"user.a");
    assert_eq!(v[10].target, d);
    // rename d/f -> /g
    assert_eq!(at(11), (f, ROOT_INO, b"g".to_vec()));
    assert_eq!(v[11].source_parent, Some(d));
    assert_eq!(v[11].source_name.as_deref(), Some(&b"f"[..]));
    // rename d/fifo -> d/sym over the symlink
    assert_eq!(at(12), (n, d, b"sym".to_vec()));
    assert_eq!(at(13), (l, d, b"sym".to_vec()));
    assert_eq!(v[13].flags & FLAG_LAST, FLAG_LAST);
    // unlink of a name that is not the last: no LAST flag; of the last: LAST
    assert_eq!(at(14), (f, ROOT_INO, b"hard".to_vec()));
    assert_eq!(v[14].flags & FLAG_LAST, 0);
    assert_eq!(at(15), (f, ROOT_INO, b"g".to_vec()));
    assert_eq!(v[15].flags & FLAG_LAST, FLAG_LAST);
    assert_eq!(at(17), (d, ROOT_INO, b"d".to_vec()));
    for x in &v {
        assert_eq!((x.uid, x.gid), (1234, 567));
        assert_eq!(x.client, "conf-client");
        assert_eq!(x.jobid.as_deref(), Some("job-9"));
    }
    assert!(v.windows(2).all(|w| w[0].index < w[1].index));
}

/// A create that opens its file records CREAT then OPEN, both about the new inode, with or
/// without a lease taken in it; a failed create records nothing; unlinks record UNLNK, LAST
/// only at the last name.
pub fn changelog_create_open_and_unlink_records(e: &dyn MetaEngine) {
    let s = super::pcc_session(e, "a");
    e.changelog_register(Mask::all(), DAY).unwrap();
    let _c = caller().enter();
    let f = e
        .create(ROOT_INO, b"f", &file(), Some(layout()), Some(s))
        .unwrap()
        .ino;
    let (g, lease) = e
        .pcc_create(
            ROOT_INO,
            b"g",
            &file(),
            Some(layout()),
            Some(s),
            "a",
            &|_| true,
        )
        .unwrap();
    assert!(lease.is_some());
    assert!(e
        .create(ROOT_INO, b"f", &file(), Some(layout()), Some(s))
        .is_err());
    e.link(g.ino, ROOT_INO, b"g2").unwrap();
    e.unlink(ROOT_INO, b"g").unwrap();
    e.unlink(ROOT_INO, b"g2").unwrap();
    let v = records(e);
    use RecordType::*;
    assert_eq!(
        types(&v),
        [Creat, Open, Creat, Open, Hlink, Unlnk, Unlnk],
        "{v:#?}"
    );
    let at = |i: usize| (v[i].target, v[i].parent, v[i].name.clone());
    assert_eq!(at(0), (f, ROOT_INO, b"f".to_vec()));
    assert_eq!(v[1].target, f);
    assert_eq!(at(2), (g.ino, ROOT_INO, b"g".to_vec()));
    assert_eq!(v[3].target, g.ino);
    assert_eq!(at(5), (g.ino, ROOT_INO, b"g".to_vec()));
    assert_eq!(v[5].flags & FLAG_LAST, 0);
    assert_eq!(at(6), (g.ino, ROOT_INO, b"g2".to_vec()));
    assert_eq!(v[6].flags & FLAG_LAST, FLAG_LAST);
    for x in &v {
        assert_eq!((x.uid, x.gid), (1234, 567));
        assert_eq!(x.client, "conf-client");
    }
    assert!(v.windows(2).all(|w| w[0].index < w[1].index));
}

/// `changelog_wanted`: the union of the active readers' masks, less what a follower of the
/// asking client does not get (its own records, HSM ones apart); nothing once they go.
pub fn changelog_wanted_follows_the_readers(e: &dyn MetaEngine) {
    let idle = Duration::from_secs(3600);
    assert_eq!(
        e.changelog_wanted("a").unwrap().0,
        0,
        "no reader, nothing wanted"
    );
    let open_close = RecordType::Open.bit() | RecordType::Close.bit();
    let f = e
        .changelog_register_follower(Mask::all(), idle, "a")
        .unwrap();
    assert_eq!(
        e.changelog_wanted("a").unwrap().0,
        RecordType::Hsm.bit(),
        "a's own follower wants none of a's records but HSM ones"
    );
    assert_eq!(
        e.changelog_wanted("b").unwrap().0,
        Mask::all().0,
        "a's follower wants all of b's"
    );
    let r = e.changelog_register(Mask(open_close), idle).unwrap();
    let w = e.changelog_wanted("a").unwrap().0;
    assert_eq!(w & open_close, open_close, "{w:#x}");
    assert_eq!(w & RecordType::Creat.bit(), 0, "{w:#x}");
    e.changelog_deregister(r).unwrap();
    e.changelog_deregister(f).unwrap();
    assert_eq!(e.changelog_wanted("b").unwrap().0, 0, "readers gone");
}
