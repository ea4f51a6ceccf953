//! The PostgreSQL engine against a real server: the conformance suite (a fresh database per
//! check), concurrency, notifications, schema handling and an outage.
//!
//! The server is `TIERFS_PG_URL` when set (a role that may create databases), otherwise a
//! private cluster that `scripts/postgres-test-server.sh` starts (installing PostgreSQL from
//! Debian packages if needed) and stops at the end. Without PostgreSQL the test is skipped
//! with a message, except under CI (`CI=true`), where it fails.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::engine::{Admin, Changelog, FileData, MetaEngine, Namespace, Pcc};

/// How long the whole test may take once the server runs.
const TEST_LIMIT: Duration = Duration::from_secs(420);
/// How long starting the server may take (it may install PostgreSQL first).
const START_LIMIT: Duration = Duration::from_secs(600);

fn script() -> String {
    format!(
        "{}/../../scripts/postgres-test-server.sh",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Runs the script with a time limit; (exit code, stdout, stderr).
fn run_script(args: &[&str], limit: Duration) -> (i32, String, String) {
    let mut child = Command::new("bash")
        .arg(script())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bash");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(_st) = child.try_wait().expect("wait") {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("postgres-test-server.sh {args:?} took longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The server under test; stops the private cluster when dropped.
struct Server {
    url: String,
    dir: Option<String>,
}

impl Server {
    fn get() -> Option<Server> {
        if let Ok(url) = std::env::var("TIERFS_PG_URL") {
            if !url.is_empty() {
                return Some(Server { url, dir: None });
            }
        }
        let (code, out, err) = run_script(&["start"], START_LIMIT);
        let in_ci = std::env::var("CI").map(|v| v == "true").unwrap_or(false);
        if code == 3 {
            assert!(
                !in_ci,
                "PostgreSQL is not available and could not be installed, and CI=true: {err}"
            );
            eprintln!("SKIPPED: PostgreSQL engine tests: PostgreSQL is not installed and could not be installed ({})", err.trim());
            return None;
        }
        assert_eq!(code, 0, "postgres-test-server.sh start failed: {err}");
        let get = |k: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
                .unwrap_or_else(|| panic!("no {k} in {out}"))
        };
        Some(Server {
            url: get("TIERFS_PG_URL"),
            dir: Some(get("TIERFS_PG_DIR")),
        })
    }

    /// The URL of another database on this server.
    fn url_of(&self, db: &str) -> String {
        let (base, query) = match self.url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (self.url.as_str(), None),
        };
        let base = &base[..base.rfind('/').expect("a database in the URL")];
        match query {
            Some(q) => format!("{base}/{db}?{q}"),
            None => format!("{base}/{db}"),
        }
    }

    fn admin(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).expect("connect to the test server")
    }

    /// A new empty database, dropped with its guard.
    fn fresh_db(&self) -> TempDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "tierfs_t{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        self.admin()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
        TempDb {
            url: self.url_of(&name),
            admin: self.url.clone(),
            name,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let (code, _, err) = run_script(&["stop", dir], Duration::from_secs(60));
            if code != 0 {
                eprintln!("stopping the test server: {err}");
            }
        }
    }
}

struct TempDb {
    url: String,
    admin: String,
    name: String,
}

impl Drop for TempDb {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

fn params() -> FormatParams {
    crate::conformance::params()
}

fn file() -> NewNode {
    NewNode {
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    }
}

fn dir() -> NewNode {
    NewNode {
        kind: Kind::Dir,
        perm: 0o755,
        ..file()
    }
}

#[test]
fn postgres_engine() {
    let Some(server) = Server::get() else {
        return;
    };
    let server = Arc::new(server);
    let s2 = server.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let body = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| all_checks(&s2)));
        let _ = tx.send(());
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    });
    match rx.recv_timeout(TEST_LIMIT) {
        Ok(()) => {
            if let Err(e) = body.join() {
                std::panic::resume_unwind(e);
            }
        }
        Err(_) => panic!("PostgreSQL engine tests took longer than {TEST_LIMIT:?}"),
    }
    // The server stops when the last reference goes (here, after the body ended).
    drop(server);
}

/// The changelog's storage checks (`core::changelog::checks`) on PostgreSQL: record order is
/// commit order under concurrent writers, masks, purge, idle readers.
#[test]
fn changelog_on_postgres() {
    let Some(server) = Server::get() else {
        return;
    };
    crate::core::changelog::checks::run_all(&|| {
        let db = server.fresh_db();
        let e = PgMeta::format(&db.url, &params()).expect("format");
        (Box::new(db) as Box<dyn std::any::Any>, e)
    });
    // Agents are woken when HSM work is queued, and when a request is canceled.
    {
        use crate::engine::Hsm;
        use crate::hsm::HsmAction;
        let db = server.fresh_db();
        let e = PgMeta::format(&db.url, &params()).expect("format");
        e.hsm_archive_add(3, "file:///a3").unwrap();
        let f = e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
        let mut sub = e.listen("agent", &[Channel::Hsm]).unwrap().unwrap();
        let r = e
            .hsm_request(f.ino, HsmAction::Archive, None)
            .unwrap()
            .unwrap();
        assert_eq!(
            sub.wait(Duration::from_secs(10)).unwrap(),
            vec![Notice::HsmWork(3)]
        );
        e.hsm_cancel(f.ino).unwrap();
        assert_eq!(
            sub.wait(Duration::from_secs(10)).unwrap(),
            vec![Notice::HsmCancel(r.id)]
        );
        assert!(sub.wait(Duration::from_millis(300)).unwrap().is_empty());
    }
    // Followers are woken by a notification when records commit (and only then).
    let db = server.fresh_db();
    let e = PgMeta::format(&db.url, &params()).expect("format");
    e.changelog_register(crate::changelog::Mask::all(), Duration::from_secs(3600))
        .unwrap();
    let mut sub = e
        .listen("follower", &[Channel::Changelog])
        .unwrap()
        .unwrap();
    e.create(ROOT_INO, b"quiet", &dir(), None, None).unwrap();
    assert_eq!(
        sub.wait(Duration::from_secs(10)).unwrap(),
        vec![Notice::Changelog]
    );
    assert!(sub.wait(Duration::from_millis(300)).unwrap().is_empty());
    e.create(ROOT_INO, b"loud", &file(), None, None).unwrap();
    assert_eq!(
        sub.wait(Duration::from_secs(10)).unwrap(),
        vec![Notice::Changelog]
    );
}

fn all_checks(server: &Server) {
    let t = Instant::now();
    crate::conformance::run_all(&|| {
        let db = server.fresh_db();
        let e = PgMeta::format(&db.url, &params()).expect("format");
        (
            Box::new(db) as Box<dyn std::any::Any>,
            Box::new(e) as Box<dyn MetaEngine>,
        )
    });
    eprintln!("conformance suite on PostgreSQL: {:?}", t.elapsed());
    sql_layer_converts_exact_types(server);
    let t = Instant::now();
    crate::core::fault_tests::faults_leave_nothing_half_done(
        &|| {
            let db = server.fresh_db();
            let d = PgEngine::format(&db.url, &params()).expect("format");
            (
                Box::new(db) as Box<dyn std::any::Any>,
                crate::core::SqlMeta::new(crate::sql::fault::FaultDriver::new(d)),
            )
        },
        false,
    );
    eprintln!("fault injection on PostgreSQL: {:?}", t.elapsed());
    pcc_open_round_trips(server);
    pcc_report_round_trips(server);
    create_and_unlink_round_trips(server);
    connections_default_to_repeatable_read(server);
    schema_and_format(server);
    a_v5_filesystem_upgrades_and_keeps_every_file(server);
    a_v7_filesystem_upgrades_and_keeps_every_file(server);
    dump_from_sqlite_loads_into_postgres_and_back(server);
    concurrent_creates_renames_and_commits(server);
    revoke_notifications(server);
    lost_connections_recover(server);
    heartbeat_has_a_connection_of_its_own(server);
}

/// A pool taken whole by long transactions does not delay the heartbeat: it has a connection
/// of its own, and answers while every pooled connection is still busy.
fn heartbeat_has_a_connection_of_its_own(server: &Server) {
    use crate::engine::Sessions;
    use crate::sql::Driver;
    use crate::vals;
    let db = server.fresh_db();
    let e = PgMeta::format(&db.url, &params()).unwrap();
    let s = e
        .register_session(&SessionInfo {
            id: 0,
            client_name: "busy".into(),
            host: "h".into(),
            pid: 1,
            mountpoint: "/mnt".into(),
            version: "0".into(),
            started: 0,
            heartbeat: 0,
        })
        .unwrap();
    let finished = AtomicU32::new(0);
    std::thread::scope(|sc| {
        for _ in 0..POOL_MAX {
            sc.spawn(|| {
                Driver::write(e.driver(), |tx| tx.exec("SELECT pg_sleep(4)", vals![])).unwrap();
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        // every pooled connection is in a transaction by now
        std::thread::sleep(Duration::from_millis(1500));
        e.heartbeat(s).unwrap();
        assert_eq!(
            finished.load(Ordering::SeqCst),
            0,
            "the heartbeat waited for the pool's long transactions"
        );
        // and a second one, on the same connection
        e.heartbeat(s).unwrap();
        assert_eq!(finished.load(Ordering::SeqCst), 0);
    });
    e.unregister_session(s).unwrap();
}

/// The SQL layer's PostgreSQL transaction sends each value as the type its parameter has and
/// reads every column type the core uses.
fn sql_layer_converts_exact_types(server: &Server) {
    use crate::sql::{Driver, Value};
    use crate::vals;
    let db = server.fresh_db();
    let e = PgMeta::format(&db.url, &params()).unwrap();
    let d = e.driver();
    Driver::write(d, |tx| {
        tx.batch(
            "CREATE TABLE t (id BIGSERIAL PRIMARY KEY, a SMALLINT, b INTEGER, c BIGINT, \
             f BOOLEAN, bin BYTEA, txt TEXT)",
        )
    })
    .unwrap();
    let id = Driver::write(d, |tx| {
        tx.insert_id(
            "INSERT INTO t (a, b, c, f, bin, txt) VALUES ($1, $2, $3, $4, $5, $6)",
            vals![7i64, 70_000i64, u64::MAX, 1i64, &b"\xff\x00"[..], "x"],
            "id",
        )
    })
    .unwrap();
    assert_eq!(id, 1);
    // A boolean sent to an integer column and an integer to a boolean one.
    Driver::write(d, |tx| {
        tx.exec(
            "INSERT INTO t (a, b, c, f, bin, txt) VALUES ($1, $2, $3, $4, NULL, $5)",
            vals![true, -1i64, i64::MIN, false, Option::<&str>::None],
        )
    })
    .unwrap();
    let rows = Driver::read(d, |tx| {
        tx.query(
            "SELECT a, b, c, f, bin, txt, EXISTS (SELECT 1 FROM t WHERE f) FROM t \
                 WHERE b = ANY($1) ORDER BY id",
            vals![vec![70_000i64, -1]],
        )
    })
    .unwrap();
    assert_eq!(rows.len(), 2);
    let r = &rows[0];
    assert_eq!(
        (r.i64(0).unwrap(), r.i64(1).unwrap(), r.u64(2).unwrap()),
        (7, 70_000, u64::MAX)
    );
    assert!(r.bool(3).unwrap());
    assert_eq!(r.blob(4).unwrap(), b"\xff\x00");
    assert_eq!(r.text(5).unwrap(), "x");
    assert!(r.bool(6).unwrap());
    assert_eq!(rows[1].i64(0).unwrap(), 1);
    assert_eq!(rows[1].value(4).unwrap(), &Value::Null);
    assert_eq!(rows[1].opt_text(5).unwrap(), None);
    // A value that does not fit the parameter's type is an error, not a wrapped number.
    let r = Driver::write(d, |tx| tx.exec("UPDATE t SET b = $1", vals![i64::MAX]));
    assert!(matches!(r, Err(MetaError::Db(_))), "{r:?}");
    // query_opt takes the first of several rows; one() of none is NotFound.
    let first = Driver::read(d, |tx| {
        tx.query_opt("SELECT id FROM t ORDER BY id", vals![])
    })
    .unwrap()
    .unwrap();
    assert_eq!(first.i64(0).unwrap(), 1);
    assert!(matches!(
        Driver::read(d, |tx| tx
            .one("SELECT id FROM t WHERE id = $1", vals![99i64])),
        Err(MetaError::NotFound)
    ));
    // NUMERIC is refused with a hint rather than misread.
    let r = Driver::read(d, |tx| tx.one("SELECT SUM(c) FROM t", vals![]));
    assert!(
        matches!(&r, Err(MetaError::Db(m)) if m.contains("BIGINT")),
        "{r:?}"
    );
}

/// A v5 filesystem written by the engine before the shared core (a pg_dump of it) opens,
/// upgrades and keeps every file; see `crate::core::upgrade_tests`.
fn a_v5_filesystem_upgrades_and_keeps_every_file(server: &Server) {
    let db = server.fresh_db();
    crate::core::upgrade_tests::load_v5_pg(&db.url);
    let e = PgMeta::open(&db.url).unwrap();
    crate::core::upgrade_tests::verify(&e);
    drop(e);
    let mut admin = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let v: i64 = admin
        .query_one("SELECT version FROM schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, SCHEMA_VERSION);
    // Opening again (already upgraded) works.
    let e = PgMeta::open(&db.url).unwrap();
    assert!(e.lookup(ROOT_INO, b"dir").is_ok());
}

/// A v7 filesystem (the schema before HSM) opens, upgrades to v8 and keeps every file; HSM
/// works on its files.
fn a_v7_filesystem_upgrades_and_keeps_every_file(server: &Server) {
    let db = server.fresh_db();
    crate::core::upgrade_tests::load_v7_pg(&db.url);
    let e = PgMeta::open(&db.url).unwrap();
    assert_eq!(e.info().unwrap().schema_version, SCHEMA_VERSION);
    crate::core::upgrade_tests::verify(&e);
    crate::core::upgrade_tests::verify_hsm(&e);
}

/// Drops the tables, indexes and columns of schema versions past 5 (part of turning a
/// database back into v4 or v1; a v1 database has no PCC tables, whose later columns then go
/// with them).
fn drop_tables_after_v5(admin: &mut postgres::Client) {
    for i in crate::core::schema::indexes_added_after(5) {
        admin
            .batch_execute(&format!("DROP INDEX IF EXISTS {i}"))
            .unwrap();
    }
    for t in crate::core::schema::tables_added_after(5) {
        admin.batch_execute(&format!("DROP TABLE {t}")).unwrap();
    }
    for (t, c) in crate::core::schema::columns_added_after(5) {
        admin
            .batch_execute(&format!("ALTER TABLE IF EXISTS {t} DROP COLUMN {c}"))
            .unwrap();
    }
}

fn schema_and_format(server: &Server) {
    let db = server.fresh_db();
    assert!(matches!(
        PgMeta::open(&db.url),
        Err(MetaError::NotFormatted(_))
    ));
    let e = PgMeta::format(&db.url, &params()).unwrap();
    assert_eq!(e.info().unwrap().schema_version, SCHEMA_VERSION);
    assert!(matches!(
        PgMeta::format(&db.url, &params()),
        Err(MetaError::AlreadyFormatted(n)) if n == "conformance"
    ));
    e.create(ROOT_INO, b"x", &file(), None, None).unwrap();
    let mut p = params();
    p.force = true;
    drop(e);
    let e = PgMeta::format(&db.url, &p).unwrap();
    assert!(matches!(e.lookup(ROOT_INO, b"x"), Err(MetaError::NotFound)));
    assert_eq!(
        e.create(ROOT_INO, b"y", &file(), None, None).unwrap().ino,
        2,
        "inode numbers start after the root"
    );
    // Two engines on one database see each other.
    let other = PgMeta::open(&db.url).unwrap();
    assert_eq!(other.lookup(ROOT_INO, b"y").unwrap().ino, 2);
    // A version from the future is refused; an old one is migrated.
    let mut admin = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    admin
        .batch_execute("UPDATE schema_version SET version = 99")
        .unwrap();
    assert!(matches!(
        PgMeta::open(&db.url),
        Err(MetaError::SchemaTooNew { found: 99, .. })
    ));
    // Version 4 -> 5: the allocated bytes of existing files are counted.
    let z = e
        .create(
            ROOT_INO,
            b"z",
            &file(),
            Some(Layout {
                stripe_size: 1 << 20,
                targets: vec![0],
            }),
            None,
        )
        .unwrap();
    let obj = |off, len, obj| Slice {
        seq: 0,
        chunk: 0,
        off,
        len,
        data: SliceData::Object {
            target: 0,
            obj,
            obj_off: 0,
            obj_size: len,
        },
    };
    e.commit_slices(z.ino, &[obj(0, 100, 1), obj(50, 100, 2)], 150, 1)
        .unwrap();
    admin
        .batch_execute(
            "ALTER TABLE inodes DROP COLUMN allocated; UPDATE schema_version SET version = 4",
        )
        .unwrap();
    drop_tables_after_v5(&mut admin);
    let e = PgMeta::open(&db.url).unwrap();
    assert_eq!(
        e.getattr(z.ino).unwrap().allocated,
        150,
        "counted at migration"
    );
    admin
        .batch_execute(
            "DROP INDEX inodes_grace; DROP TABLE pcc_leases, pcc_revokes, pcc_rules; \
             ALTER TABLE inodes DROP COLUMN allocated; \
             DELETE FROM counters WHERE name = 'pcc_generation'; \
             UPDATE schema_version SET version = 1",
        )
        .unwrap();
    drop_tables_after_v5(&mut admin);
    let e = PgMeta::open(&db.url).unwrap();
    let v: i64 = admin
        .query_one("SELECT version FROM schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, SCHEMA_VERSION);
    assert!(e.pcc_rules().unwrap().is_empty());
    // Unknown databases and unreachable servers are clear errors.
    assert!(matches!(
        PgMeta::open(&server.url_of("no_such_db")),
        Err(MetaError::Db(m)) if m.contains("does not exist")
    ));
    let dead = PgMeta::open("postgres://tierfs@127.0.0.1:1/x");
    match dead {
        Err(e @ MetaError::Unavailable(_)) => assert_eq!(e.errno(), libc::EIO),
        other => panic!("expected Unavailable, got {:?}", other.err()),
    }
}

fn concurrent_creates_renames_and_commits(server: &Server) {
    let db = server.fresh_db();
    let e = Arc::new(PgMeta::format(&db.url, &params()).unwrap());
    let a = e.create(ROOT_INO, b"a", &dir(), None, None).unwrap().ino;
    let b = e.create(ROOT_INO, b"b", &dir(), None, None).unwrap().ino;
    let f = e
        .create(
            ROOT_INO,
            b"f",
            &file(),
            Some(Layout {
                stripe_size: 1 << 20,
                targets: vec![0],
            }),
            None,
        )
        .unwrap()
        .ino;
    let threads = 4;
    let per = 40;
    let t = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|th| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    let name = format!("t{th}-{i}");
                    // Creates in one shared directory, then renames back and forth between
                    // two directories (both orders of lock-taking at once).
                    e.create(a, name.as_bytes(), &file(), None, None).unwrap();
                    let (from, to) = if (th + i) % 2 == 0 { (a, b) } else { (a, a) };
                    let new = format!("{name}-r");
                    e.rename(from, name.as_bytes(), to, new.as_bytes(), 0)
                        .unwrap();
                    // Writers to one file: every commit lands, in commit order.
                    let s = Slice {
                        seq: 0,
                        chunk: 0,
                        off: (th * per + i) as u64,
                        len: 1,
                        data: SliceData::Inline(vec![th as u8]),
                    };
                    e.commit_slices(f, &[s], (th * per + i + 1) as u64, 1)
                        .unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("worker");
    }
    eprintln!(
        "concurrent: {} creates+renames+commits in {:?}",
        threads * per,
        t.elapsed()
    );
    let mut names = 0;
    for d in [a, b] {
        names += e.readdir(d, 0, 10_000).unwrap().len();
    }
    assert_eq!(names, threads * per);
    let na = e.getattr(a).unwrap().nlink;
    assert_eq!(na, 2, "files do not count in nlink");
    let slices = e.read_chunk(f, 0).unwrap();
    assert_eq!(slices.len(), threads * per);
    assert!(slices.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(e.getattr(f).unwrap().size, (threads * per) as u64);
    // Opposite-direction directory renames at once: never a cycle, never a deadlock error.
    let x = e.create(ROOT_INO, b"x", &dir(), None, None).unwrap().ino;
    let y = e.create(ROOT_INO, b"y", &dir(), None, None).unwrap().ino;
    for _ in 0..10 {
        let (e1, e2) = (e.clone(), e.clone());
        let h1 = std::thread::spawn(move || e1.rename(ROOT_INO, b"x", y, b"x", 0));
        let h2 = std::thread::spawn(move || e2.rename(ROOT_INO, b"y", x, b"y", 0));
        let (r1, r2) = (h1.join().unwrap(), h2.join().unwrap());
        assert!(
            r1.is_ok() != r2.is_ok(),
            "exactly one of two crossing moves succeeds: {r1:?} {r2:?}"
        );
        // Put them back.
        if r1.is_ok() {
            e.rename(y, b"x", ROOT_INO, b"x", 0).unwrap();
        } else {
            e.rename(x, b"y", ROOT_INO, b"y", 0).unwrap();
        }
    }
}

fn revoke_notifications(server: &Server) {
    let db = server.fresh_db();
    let e = PgMeta::format(&db.url, &params()).unwrap();
    let f = e.create(ROOT_INO, b"f", &file(), None, None).unwrap().ino;
    let g = e.create(ROOT_INO, b"g", &file(), None, None).unwrap().ino;
    e.pcc_acquire(f, "a").unwrap();
    e.pcc_acquire(g, "c").unwrap();
    let mut sub = e
        .listen("a", &[Channel::PccRevoke])
        .unwrap()
        .expect("PostgreSQL has notifications");
    assert!(sub.wait(Duration::from_millis(50)).unwrap().is_empty());
    let t = Instant::now();
    e.pcc_request_revoke(g, "b").unwrap(); // someone else's lease
    e.pcc_request_revoke(f, "b").unwrap();
    assert_eq!(
        sub.wait(Duration::from_secs(10)).unwrap(),
        vec![Notice::PccRevoke(f)]
    );
    eprintln!("revoke notification arrived after {:?}", t.elapsed());
    // The polling fallback agrees.
    assert_eq!(e.pcc_revokes_for("a").unwrap(), vec![f]);
    assert!(sub.wait(Duration::from_millis(50)).unwrap().is_empty());
    // Asking twice before the holder looks: one notice per file.
    e.pcc_request_revoke(f, "d").unwrap();
    e.pcc_request_revoke(f, "b").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        sub.wait(Duration::from_secs(10)).unwrap(),
        vec![Notice::PccRevoke(f)]
    );
    // A listener for no channel hears nothing.
    let mut deaf = e.listen("a", &[]).unwrap().unwrap();
    e.pcc_request_revoke(f, "b").unwrap();
    assert!(deaf.wait(Duration::from_millis(200)).unwrap().is_empty());
    // Through the trait object, as a client holds the engine.
    let dynamic: &dyn MetaEngine = &e;
    assert!(dynamic
        .listen("a", &[Channel::PccRevoke])
        .unwrap()
        .is_some());
}

fn lost_connections_recover(server: &Server) {
    let db = server.fresh_db();
    let e = PgMeta::format(&db.url, &params()).unwrap();
    e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
    let session = {
        use crate::engine::Sessions;
        let s = e
            .register_session(&SessionInfo {
                id: 0,
                client_name: "c".into(),
                host: "h".into(),
                pid: 1,
                mountpoint: "/m".into(),
                version: "0".into(),
                started: 0,
                heartbeat: 0,
            })
            .unwrap();
        // the heartbeat's own connection is open
        e.heartbeat(s).unwrap();
        s
    };
    // Connections killed under the engine: the next calls reconnect without an error.
    let mut admin = server.admin();
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db.name],
        )
        .unwrap()
        .len();
    assert!(killed >= 1);
    std::thread::sleep(Duration::from_millis(100));
    e.lookup(ROOT_INO, b"f").unwrap();
    e.create(ROOT_INO, b"g", &file(), None, None).unwrap();
    // the heartbeat's connection too
    crate::engine::Sessions::heartbeat(&e, session).unwrap();
    drop(admin);
    // The whole server goes away: calls fail with EIO, then work again once it is back.
    let Some(dir) = &server.dir else {
        eprintln!("outage check skipped: the server is not ours (TIERFS_PG_URL)");
        return;
    };
    let f = e.lookup(ROOT_INO, b"f").unwrap().ino;
    e.pcc_acquire(f, "a").unwrap();
    let mut sub = e.listen("a", &[Channel::PccRevoke]).unwrap().unwrap();
    let (code, _, err) = run_script(&["down", dir], Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    let t = Instant::now();
    // The listener says its connection is gone (rather than "nothing happened", over and over).
    match sub.wait(Duration::from_secs(30)) {
        Err(MetaError::Unavailable(_)) => {}
        other => {
            panic!("expected Unavailable from a listener whose server went down, got {other:?}")
        }
    }
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(matches!(
        e.listen("a", &[Channel::PccRevoke]),
        Err(MetaError::Unavailable(_))
    ));
    let t = Instant::now();
    let r = e.create(ROOT_INO, b"h", &file(), None, None);
    match r {
        Err(ref x @ MetaError::Unavailable(_)) => assert_eq!(x.errno(), libc::EIO),
        other => panic!("expected Unavailable while the server is down, got {other:?}"),
    }
    assert!(matches!(
        e.getattr(ROOT_INO),
        Err(MetaError::Unavailable(_))
    ));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let (code, _, err) = run_script(&["up", dir], Duration::from_secs(120));
    assert_eq!(code, 0, "{err}");
    e.create(ROOT_INO, b"h", &file(), None, None).unwrap();
    assert_eq!(e.readdir(ROOT_INO, 0, 100).unwrap().len(), 3);
    // Listening again works, and hears requests.
    let mut sub = e.listen("a", &[Channel::PccRevoke]).unwrap().unwrap();
    e.pcc_request_revoke(f, "b").unwrap();
    assert_eq!(
        sub.wait(Duration::from_secs(10)).unwrap(),
        vec![Notice::PccRevoke(f)]
    );
}

/// The migration path: a filesystem made on SQLite, dumped, loaded into PostgreSQL, used there,
/// dumped again and loaded back into SQLite.
fn dump_from_sqlite_loads_into_postgres_and_back(server: &Server) {
    use crate::sqlite::SqliteMeta;
    let tmp = tempfile::tempdir().expect("tempdir");
    let lite = SqliteMeta::format(&tmp.path().join("m.db"), &params()).expect("format sqlite");
    let layout = Layout {
        stripe_size: 1 << 20,
        targets: vec![1],
    };
    let d = lite
        .create(ROOT_INO, b"d", &dir(), None, None)
        .expect("mkdir");
    let f = lite
        .create(d.ino, b"f", &file(), Some(layout), None)
        .expect("create");
    let inline = Slice {
        seq: 0,
        chunk: 0,
        off: 0,
        len: 3,
        data: SliceData::Inline(b"abc".to_vec()),
    };
    let obj = Slice {
        seq: 0,
        chunk: 1,
        off: 0,
        len: 10,
        data: SliceData::Object {
            target: 1,
            obj: 9,
            obj_off: 0,
            obj_size: 10,
        },
    };
    lite.commit_slices(f.ino, &[inline, obj], (1 << 20) + 10, 5)
        .expect("commit");
    lite.setxattr(f.ino, b"user.k", b"v", 0).expect("xattr");
    lite.pcc_rule_add("rw", Some("c1"), "uid={7}", Some(3 << 30))
        .expect("rule");
    let mut rows = Vec::new();
    lite.export_rows(&mut |r| {
        rows.push(r);
        Ok(())
    })
    .expect("export sqlite");

    let db = server.fresh_db();
    let pg = PgMeta::format(&db.url, &params()).expect("format pg");
    let n = pg
        .import_rows(&mut rows.clone().into_iter().map(Ok))
        .expect("import into pg");
    assert_eq!(n as usize, rows.len());
    let g = pg.lookup(d.ino, b"f").expect("lookup after load");
    assert_eq!((g.ino, g.size), (f.ino, (1 << 20) + 10));
    assert_eq!(g.allocated, 13, "allocated bytes carried by dump/load");
    assert_eq!(
        pg.read_chunk(f.ino, 0).unwrap()[0].data,
        SliceData::Inline(b"abc".to_vec())
    );
    assert_eq!(pg.read_chunk(f.ino, 1).unwrap()[0].len, 10);
    assert_eq!(pg.getxattr(f.ino, b"user.k").unwrap(), b"v");
    assert_eq!(g.xattr_count, 1, "xattr count carried by dump/load");
    assert_eq!(pg.pcc_rules().unwrap()[0].client.as_deref(), Some("c1"));
    assert_eq!(pg.pcc_rules().unwrap()[0].quota, Some(3 << 30));
    assert_eq!(pg.info().unwrap().uuid, lite.info().unwrap().uuid);
    // Sequences moved past the loaded ids: new inodes and rules do not collide.
    let h = pg
        .create(d.ino, b"h", &file(), None, None)
        .expect("create after load");
    assert!(h.ino > f.ino);
    assert!(pg.pcc_rule_add("ro", None, "gid={1}", None).unwrap() > 1);
    assert!(matches!(
        pg.import_rows(&mut rows.into_iter().map(Ok)),
        Err(MetaError::Invalid(_))
    ));

    // and back
    let mut back = Vec::new();
    pg.export_rows(&mut |r| {
        back.push(r);
        Ok(())
    })
    .expect("export pg");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let lite2 = SqliteMeta::format(&dir2.path().join("m.db"), &params()).expect("format sqlite");
    lite2
        .import_rows(&mut back.into_iter().map(Ok))
        .expect("import into sqlite");
    assert_eq!(lite2.lookup(d.ino, b"h").unwrap().ino, h.ino);
    assert_eq!(lite2.getattr(f.ino).unwrap().allocated, 13);
    assert_eq!(
        lite2.read_chunk(f.ino, 0).unwrap()[0].data,
        SliceData::Inline(b"abc".to_vec())
    );
}

/// `pcc_open` on PostgreSQL, the open of every file on a cluster: the session's hold, the
/// inode's lock and the lease's read are one statement (issue 15: each statement is a round
/// trip across the network), then the open's record and the changelog's; the owner's first
/// open for writing adds the lease's dirty mark. (BEGIN and COMMIT are not counted.)
fn pcc_open_round_trips(server: &Server) {
    use crate::engine::Sessions;
    let db = server.fresh_db();
    let d = PgEngine::format(&db.url, &params()).expect("format");
    let e = crate::core::SqlMeta::new(crate::sql::fault::FaultDriver::new(d));
    let s = crate::conformance::pcc_session(&e, "a");
    let f = e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
    let cost = |write: bool| {
        let n = e.driver().statements();
        assert!(matches!(
            e.pcc_open(s, f.ino, "a", write, None).unwrap(),
            PccOpen::Opened { .. }
        ));
        e.driver().statements() - n
    };
    // the session's hold, the inode's lock and the lease (one statement), then the record of
    // the open with its changelog record (one statement)
    assert_eq!(cost(false), 2, "no lease");
    e.close_files(s, &[f.ino]).unwrap();
    e.pcc_acquire(f.ino, "a").unwrap();
    assert_eq!(
        cost(true),
        3,
        "the owner's first open for writing marks the lease dirty"
    );
    assert_eq!(cost(true), 2, "then it is dirty");
    // the same with a reader of OPEN records: the record is written by that same statement
    let r = e
        .changelog_register(
            crate::changelog::Mask::parse("OPEN").unwrap(),
            std::time::Duration::from_secs(86_400),
        )
        .unwrap();
    let before = e.changelog_status().unwrap().current;
    assert_eq!(cost(false), 2, "with a reader");
    assert_eq!(e.changelog_status().unwrap().current, before + 1);
    e.changelog_deregister(r).unwrap();
    // an ended session: refused
    e.unregister_session(s).unwrap();
    assert!(matches!(
        e.pcc_open(s, f.ino, "a", false, None),
        Err(MetaError::SessionEnded(_))
    ));
}

/// `pcc_report` on PostgreSQL, sent at every close of an RW-PCC writer: one statement and no
/// transaction around it (issue 15: webserver's log appends under 1gbe waited for its 7 round
/// trips), with the changelog's MTIME record in that statement when a reader wants it, and the
/// other engines' answers when the lease is not the caller's.
fn pcc_report_round_trips(server: &Server) {
    let db = server.fresh_db();
    let d = PgEngine::format(&db.url, &params()).expect("format");
    let e = crate::core::SqlMeta::new(crate::sql::fault::FaultDriver::new(d));
    let f = e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
    let l = e.pcc_acquire(f.ino, "a").unwrap();
    let report = |client: &str, generation: u64, size: u64| {
        e.pcc_report(f.ino, client, generation, true, size, 1_000_000_000)
    };
    let cost = |size: u64| {
        let (n, t) = (
            e.driver().statements(),
            e.driver().inner().transactions_begun(),
        );
        let a = report("a", l.generation, size).unwrap();
        assert_eq!(a.size, size, "the report's attributes");
        (
            e.driver().statements() - n,
            e.driver().inner().transactions_begun() - t,
        )
    };
    assert_eq!(cost(10), (1, 0), "one statement, no transaction");
    assert_eq!(e.getattr(f.ino).unwrap().size, 10);
    assert!(e.pcc_lease(f.ino).unwrap().unwrap().dirty);
    let r = e
        .changelog_register(
            crate::changelog::Mask::parse("MTIME").unwrap(),
            std::time::Duration::from_secs(86_400),
        )
        .unwrap();
    let before = e.changelog_status().unwrap().current;
    assert_eq!(cost(20), (1, 0), "with a reader of MTIME records");
    assert_eq!(e.changelog_status().unwrap().current, before + 1);
    e.changelog_deregister(r).unwrap();
    // not the caller's lease: nothing changes
    assert!(matches!(
        report("a", l.generation + 1, 30),
        Err(MetaError::WouldBlock)
    ));
    assert!(matches!(
        report("b", l.generation, 30),
        Err(MetaError::WouldBlock)
    ));
    assert_eq!(e.getattr(f.ino).unwrap().size, 20);
    assert!(e.pcc_release(f.ino, "a", l.generation).unwrap());
    assert!(matches!(
        report("a", l.generation, 30),
        Err(MetaError::NotFound)
    ));
    assert_eq!(e.getattr(f.ino).unwrap().size, 20);
}

/// `create` (opened at once or not, with an RW-PCC lease or without) and `unlink` on
/// PostgreSQL: one statement each and no transaction around it (issue 15: both run under
/// their directory's kernel lock, and varmail's creates and unlinks queued behind their 8
/// round trips each), with their changelog records in that statement when a reader wants
/// them. A create under a directory that hands down its project, with a rule on the project,
/// takes a second transaction the first time only (the rule is asked about what the
/// directory handed down at its last create).
fn create_and_unlink_round_trips(server: &Server) {
    let db = server.fresh_db();
    let d = PgEngine::format(&db.url, &params()).expect("format");
    let e = crate::core::SqlMeta::new(crate::sql::fault::FaultDriver::new(d));
    let s = crate::conformance::pcc_session(&e, "a");
    let cost = |f: &mut dyn FnMut()| {
        let (n, t) = (
            e.driver().statements(),
            e.driver().inner().transactions_begun(),
        );
        f();
        (
            e.driver().statements() - n,
            e.driver().inner().transactions_begun() - t,
        )
    };
    let one = (1, 0);
    assert_eq!(
        cost(&mut || {
            e.create(ROOT_INO, b"f", &file(), None, None).unwrap();
        }),
        one,
        "create"
    );
    assert_eq!(
        cost(&mut || {
            e.create(ROOT_INO, b"g", &file(), None, Some(s)).unwrap();
        }),
        one,
        "create opened"
    );
    assert_eq!(
        cost(&mut || {
            e.unlink(ROOT_INO, b"f").unwrap();
        }),
        one,
        "unlink"
    );
    let proj = e.create(ROOT_INO, b"p", &dir(), None, None).unwrap().ino;
    e.set_projid(proj, 7, true).unwrap();
    let rule = |a: &Attr| a.projid == 7;
    let leased = |name: &[u8]| {
        let (a, l) = e
            .pcc_create(proj, name, &file(), None, Some(s), "a", &rule)
            .unwrap();
        assert_eq!(a.projid, 7);
        assert!(l.is_some(), "the rule wants the file");
    };
    let (n, t) = cost(&mut || leased(b"x"));
    assert!(
        n > 1 && t == 1,
        "the first create under the project: its statement, then the lease's transaction \
         ({n} statements, {t} transactions)"
    );
    assert_eq!(cost(&mut || leased(b"y")), one, "then in the create");
    let r = e
        .changelog_register(
            crate::changelog::Mask::all(),
            std::time::Duration::from_secs(86_400),
        )
        .unwrap();
    let before = e.changelog_status().unwrap().current;
    assert_eq!(cost(&mut || leased(b"z")), one, "with a reader");
    assert_eq!(
        cost(&mut || {
            e.unlink(proj, b"z").unwrap();
        }),
        one,
        "unlink with a reader"
    );
    // CREAT, OPEN, UNLNK
    assert_eq!(e.changelog_status().unwrap().current, before + 3);
    e.changelog_deregister(r).unwrap();
    // a name that is not there, a name taken: one statement, nothing changed
    assert_eq!(
        cost(&mut || {
            assert!(matches!(e.unlink(ROOT_INO, b"f"), Err(MetaError::NotFound)));
        }),
        one
    );
    assert_eq!(
        cost(&mut || {
            assert!(matches!(
                e.create(ROOT_INO, b"g", &file(), None, None),
                Err(MetaError::Exists)
            ));
        }),
        one
    );
}

/// The pool's connections run every transaction REPEATABLE READ, including a one-statement
/// write, which is sent without BEGIN and so takes the connection's default.
fn connections_default_to_repeatable_read(server: &Server) {
    let db = server.fresh_db();
    let d = PgEngine::format(&db.url, &params()).expect("format");
    let level = crate::sql::Driver::write_one(&d, |tx| {
        tx.one("SELECT current_setting('transaction_isolation')", &[])?
            .text(0)
    })
    .unwrap();
    assert_eq!(level, "repeatable read");
    // and a one-statement write refuses a second statement
    let r = crate::sql::Driver::write_one(&d, |tx| {
        tx.exec("SELECT 1", &[])?;
        tx.exec("SELECT 2", &[])
    });
    assert!(matches!(r, Err(MetaError::Db(_))), "{r:?}");
}
