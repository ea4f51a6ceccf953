//! A schema-v5 filesystem made by the engines as they were before the shared core (commit
//! 2759b77 of issue 11, whose engines still ran their own v5 migrations) opens with this
//! build, upgrades, and keeps every file.
//!
//! The fixtures in `testdata/` were written by [`populate`] with that code, through the
//! public engine API (`make_v5_fixtures` below, which refuses to run once the build's schema
//! is past 5): `v5.sqlite` is the SQLite database file (checkpointed), `v5.pg.sql` a `pg_dump
//! --inserts` of the PostgreSQL database. [`verify`] checks everything `populate` made.

use crate::engine::{Admin, MetaEngine, Namespace};
use crate::error::MetaError;
use crate::types::*;

fn node(kind: Kind, perm: u32) -> NewNode {
    NewNode {
        kind,
        perm,
        uid: 1000,
        gid: 100,
        rdev: 0,
        symlink: None,
    }
}

fn obj(chunk: u64, off: u64, len: u64, obj: u64) -> Slice {
    Slice {
        seq: 0,
        chunk,
        off,
        len,
        data: SliceData::Object {
            target: 1,
            obj,
            obj_off: 0,
            obj_size: len,
        },
    }
}

const STRIPE: u64 = 1 << 20;

/// Makes a small tree with every kind of thing a filesystem holds.
pub fn populate(e: &dyn MetaEngine) {
    let layout = Layout {
        stripe_size: STRIPE,
        targets: vec![1],
    };
    let d = e
        .create(ROOT_INO, b"dir", &node(Kind::Dir, 0o755), None, None)
        .unwrap();
    e.set_dir_stripe(
        d.ino,
        StripeDefault {
            stripe_count: 2,
            stripe_size: 4 << 20,
        },
    )
    .unwrap();
    e.set_projid(d.ino, 42, true).unwrap();
    let a = e
        .create(
            d.ino,
            b"a",
            &node(Kind::File, 0o640),
            Some(layout.clone()),
            None,
        )
        .unwrap();
    let first = e.alloc_object_ids(3).unwrap();
    e.commit_slices(
        a.ino,
        &[obj(0, 0, 1000, first), obj(0, 500, 1000, first + 1)],
        1500,
        1_000_000_001,
    )
    .unwrap();
    e.commit_slices(
        a.ino,
        &[obj(2, 0, 10, first + 2)],
        2 * STRIPE + 10,
        1_000_000_002,
    )
    .unwrap();
    e.setxattr(a.ino, b"user.color", b"blue", 0).unwrap();
    e.setxattr(a.ino, b"user.empty", b"", 0).unwrap();
    e.link(a.ino, ROOT_INO, b"hard").unwrap();
    let i = e
        .create(
            ROOT_INO,
            b"inline",
            &node(Kind::File, 0o600),
            Some(layout.clone()),
            None,
        )
        .unwrap();
    e.commit_slices(
        i.ino,
        &[Slice {
            seq: 0,
            chunk: 0,
            off: 0,
            len: 5,
            data: SliceData::Inline(b"hello".to_vec()),
        }],
        5,
        1_000_000_003,
    )
    .unwrap();
    let mut s = node(Kind::Symlink, 0o777);
    s.symlink = Some(b"dir/a".to_vec());
    e.create(ROOT_INO, b"sym", &s, None, None).unwrap();
    e.create(d.ino, b"fifo", &node(Kind::Fifo, 0o644), None, None)
        .unwrap();
    let t = e
        .create(
            d.ino,
            b"trunc",
            &node(Kind::File, 0o644),
            Some(layout),
            None,
        )
        .unwrap();
    let o = e.alloc_object_ids(1).unwrap();
    e.commit_slices(t.ino, &[obj(0, 0, 4096, o)], 4096, 1_000_000_004)
        .unwrap();
    e.setattr(
        t.ino,
        &SetAttr {
            size: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    let sub = e
        .create(d.ino, b"sub", &node(Kind::Dir, 0o700), None, None)
        .unwrap();
    for n in 0..20u32 {
        e.create(
            sub.ino,
            format!("f{n:02}").as_bytes(),
            &node(Kind::File, 0o644),
            None,
            None,
        )
        .unwrap();
    }
    e.pcc_rule_add("rw", Some("client-a"), "projid={42}", Some(1 << 30))
        .unwrap();
}

/// Checks that everything [`populate`] made is there, then that the filesystem takes new
/// changes.
pub fn verify(e: &dyn MetaEngine) {
    let d = e.lookup(ROOT_INO, b"dir").unwrap();
    assert_eq!(d.kind, Kind::Dir);
    assert_eq!(d.nlink, 3, "dir holds one subdirectory");
    assert_eq!(
        e.resolve_stripe_default(d.ino).unwrap(),
        StripeDefault {
            stripe_count: 2,
            stripe_size: 4 << 20
        }
    );
    assert_eq!(e.get_projid(d.ino).unwrap(), (42, true));
    let a = e.lookup(d.ino, b"a").unwrap();
    assert_eq!(
        (a.size, a.nlink, a.perm, a.uid, a.gid),
        (2 * STRIPE + 10, 2, 0o640, 1000, 100)
    );
    assert_eq!(a.projid, 42, "inherited");
    assert_eq!(a.allocated, 1510);
    assert_eq!(a.layout.as_ref().unwrap().targets, vec![1]);
    // Schema v9 counted the xattrs that were there.
    assert_eq!(a.xattr_count, 2);
    assert_eq!(d.xattr_count, 0);
    let c0 = e.read_chunk(a.ino, 0).unwrap();
    assert_eq!(c0.len(), 2);
    assert_eq!(
        (c0[0].off, c0[0].len, c0[1].off, c0[1].len),
        (0, 1000, 500, 1000)
    );
    assert!(c0[0].seq < c0[1].seq, "commit order kept");
    assert!(e.read_chunk(a.ino, 1).unwrap().is_empty());
    assert_eq!(e.read_chunk(a.ino, 2).unwrap().len(), 1);
    assert_eq!(e.getxattr(a.ino, b"user.color").unwrap(), b"blue");
    assert_eq!(e.getxattr(a.ino, b"user.empty").unwrap(), b"");
    let mut names = e.listxattr(a.ino).unwrap();
    names.sort();
    assert_eq!(names, vec![b"user.color".to_vec(), b"user.empty".to_vec()]);
    assert_eq!(e.lookup(ROOT_INO, b"hard").unwrap().ino, a.ino);
    let i = e.lookup(ROOT_INO, b"inline").unwrap();
    let c = e.read_chunk(i.ino, 0).unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].data, SliceData::Inline(b"hello".to_vec()));
    let s = e.lookup(ROOT_INO, b"sym").unwrap();
    assert_eq!(e.readlink(s.ino).unwrap(), b"dir/a");
    assert_eq!(e.lookup(d.ino, b"fifo").unwrap().kind, Kind::Fifo);
    let t = e.lookup(d.ino, b"trunc").unwrap();
    assert_eq!((t.size, t.allocated), (100, 100));
    let sub = e.lookup(d.ino, b"sub").unwrap();
    let mut all = Vec::new();
    let mut off = 0;
    loop {
        let page = e.readdir(sub.ino, off, 7).unwrap();
        if page.is_empty() {
            break;
        }
        off = page.last().unwrap().offset;
        all.extend(page.into_iter().map(|x| x.name));
    }
    let want: Vec<Vec<u8>> = (0..20).map(|n| format!("f{n:02}").into_bytes()).collect();
    assert_eq!(all, want);
    let rules = e.pcc_rules().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (rules[0].client.as_deref(), rules[0].quota),
        (Some("client-a"), Some(1 << 30))
    );
    assert_eq!(
        e.path_of(t.ino).unwrap().as_deref(),
        Some(&b"/dir/trunc"[..])
    );
    assert!(
        e.meta_issues(i64::MAX).unwrap().is_empty(),
        "fsck finds nothing"
    );
    // Inodes: root, dir, a, inline, sym, fifo, trunc, sub, 20 files.
    assert_eq!(e.usage().unwrap().inodes, 28);
    // New changes work, and new inode numbers do not collide with old ones.
    let n = e
        .create(ROOT_INO, b"new", &node(Kind::File, 0o644), None, None)
        .unwrap();
    assert!(n.ino > sub.ino);
    e.rename(ROOT_INO, b"new", d.ino, b"a", 0).unwrap();
    assert_eq!(e.lookup(d.ino, b"a").unwrap().ino, n.ino);
    assert_eq!(e.getattr(a.ino).unwrap().nlink, 1, "the hard link remains");
    e.unlink(ROOT_INO, b"hard").unwrap();
    assert!(matches!(e.getattr(a.ino), Err(MetaError::NotFound)));
}

#[test]
fn a_v5_sqlite_filesystem_upgrades_and_keeps_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    std::fs::write(&path, include_bytes!("testdata/v5.sqlite")).unwrap();
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        let v: i64 = c
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 5, "the fixture is a v5 filesystem");
    }
    let e = crate::sqlite::SqliteMeta::open(&path).unwrap();
    verify(&e);
    drop(e);
    let c = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = c
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(v, crate::core::schema::SCHEMA_VERSION);
    // Opening again (already upgraded) works and changes nothing.
    let e = crate::sqlite::SqliteMeta::open(&path).unwrap();
    assert!(e.lookup(ROOT_INO, b"dir").is_ok());
}

/// After [`verify`] of an upgraded filesystem: its files have no HSM state, and HSM works on
/// them (a file from before the upgrade archives and releases, keeping its size).
pub fn verify_hsm(e: &dyn MetaEngine) {
    let d = e.lookup(ROOT_INO, b"dir").unwrap();
    let t = e.lookup(d.ino, b"trunc").unwrap();
    assert_eq!(t.hsm, crate::hsm::HsmFlags(0));
    assert_eq!(e.lookup(ROOT_INO, b"inline").unwrap().hsm.0, 0);
    assert!(e.hsm_archives().unwrap().is_empty());
    assert!(e.hsm_list(&Default::default()).unwrap().is_empty());
    e.hsm_archive_add(1, "file:///archive").unwrap();
    let r = e
        .hsm_request(t.ino, crate::hsm::HsmAction::Archive, None)
        .unwrap()
        .unwrap();
    let agent = e
        .hsm_agent_register(&crate::hsm::HsmAgentInfo {
            name: "upgrade".into(),
            archives: vec![1],
            ..Default::default()
        })
        .unwrap();
    let task = e.hsm_take(agent, 1).unwrap().pop().unwrap();
    assert_eq!(task.request.id, r.id);
    let done = crate::hsm::HsmDone {
        key: "trunc".into(),
        data_version: task.data_version,
        size: task.size,
        checksum: "c".into(),
        bytes_moved: task.size,
    };
    assert_eq!(
        e.hsm_complete(agent, r.id, &done).unwrap(),
        crate::hsm::HsmOutcome::Done
    );
    let a = e.hsm_release(t.ino).unwrap();
    assert!(a.hsm.released());
    assert_eq!((a.size, a.allocated), (100, 0));
}

#[test]
fn a_v7_sqlite_filesystem_upgrades_and_keeps_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    std::fs::write(&path, include_bytes!("testdata/v7.sqlite")).unwrap();
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        let v: i64 = c
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 7, "the fixture is a v7 filesystem");
    }
    let e = crate::sqlite::SqliteMeta::open(&path).unwrap();
    assert_eq!(
        e.info().unwrap().schema_version,
        crate::core::schema::SCHEMA_VERSION
    );
    verify(&e);
    verify_hsm(&e);
}

/// Loads the PostgreSQL v7 fixture (see [`load_v5_pg`]).
pub fn load_v7_pg(url: &str) {
    load_pg(url, include_str!("testdata/v7.pg.sql"), 7);
}

/// Loads the PostgreSQL fixture into the empty database at `url` (pg_dump's psql
/// meta-commands, `\restrict`, are left out; everything else is plain SQL).
pub fn load_v5_pg(url: &str) {
    load_pg(url, include_str!("testdata/v5.pg.sql"), 5);
}

/// Loads a pg_dump fixture of schema `version` into the empty database at `url`.
fn load_pg(url: &str, dump: &str, version: i64) {
    let sql: String = dump
        .lines()
        .filter(|l| !l.starts_with('\\'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.batch_execute(&sql).unwrap();
    let v: i64 = c
        .query_one("SELECT version FROM public.schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, version, "the fixture is a v{version} filesystem");
}

/// Writes the fixtures with the build's engines: run only at schema v5 (see the module doc).
/// `cargo test -p tierfs-meta make_v5_fixtures -- --ignored` with TIERFS_PG_URL set.
#[test]
#[ignore]
fn make_v5_fixtures() {
    write_fixtures(5);
}

/// The v7 fixtures (`v7.sqlite`, `v7.pg.sql`), written by the build at schema v7 (commit
/// de045df, before HSM's v8) as [`make_v5_fixtures`] wrote v5's.
#[test]
#[ignore]
fn make_v7_fixtures() {
    write_fixtures(7);
}

/// Writes `v{version}.sqlite` and `v{version}.pg.sql` with [`populate`]; refuses to run
/// unless the build's schema is `version`.
fn write_fixtures(version: i64) {
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core/testdata");
    std::fs::create_dir_all(&out).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let e = crate::sqlite::SqliteMeta::format(&path, &crate::conformance::params()).unwrap();
    assert_eq!(
        e.info().unwrap().schema_version,
        version,
        "fixtures are made at v{version} only"
    );
    populate(&e);
    drop(e);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        c.execute_batch("VACUUM").unwrap();
    }
    std::fs::copy(&path, out.join(format!("v{version}.sqlite"))).unwrap();
    let url = std::env::var("TIERFS_PG_URL").expect("TIERFS_PG_URL");
    let db = format!("tierfs_v{version}_fixture_{}", std::process::id());
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .unwrap();
    let mut u = url::Url::parse(&url).unwrap();
    u.set_path(&db);
    let e = crate::postgres::PgMeta::format(u.as_str(), &crate::conformance::params()).unwrap();
    populate(&e);
    drop(e);
    let dump = std::process::Command::new("pg_dump")
        .args([
            "--inserts",
            "--no-owner",
            "--no-privileges",
            "-d",
            u.as_str(),
        ])
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    std::fs::write(out.join(format!("v{version}.pg.sql")), dump.stdout).unwrap();
    admin.batch_execute(&format!("DROP DATABASE {db}")).unwrap();
}
