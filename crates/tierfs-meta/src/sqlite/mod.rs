//! The embedded metadata engine: SQLite in WAL mode.
//!
//! Several client processes on one machine open the same database file. Writes run in
//! `BEGIN IMMEDIATE` transactions (SQLite allows one writer at a time; taking the write lock up
//! front avoids deadlocking lock upgrades), serialised inside a process by one writer
//! connection, and retried with bounded exponential backoff when another process holds the lock
//! past the busy timeout. Reads use a small pool of reader connections, which WAL lets run
//! beside the writer.

pub mod walbatch;

use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::core::schema;
pub use crate::core::schema::SCHEMA_VERSION;
use crate::core::SqlMeta;
use crate::error::{MetaError, Result};
use crate::sql::sqlite::SqliteTx;
use crate::sql::{Dialect, DialectKind, Driver, Tx};
use crate::types::*;

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_RETRIES: u32 = 8;

impl From<rusqlite::Error> for MetaError {
    fn from(e: rusqlite::Error) -> Self {
        match &e {
            rusqlite::Error::QueryReturnedNoRows => MetaError::NotFound,
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(
                    f.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                MetaError::Busy(0)
            }
            _ => MetaError::Db(e.to_string()),
        }
    }
}

pub struct SqliteEngine {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// This process committed since its last [`MetaEngine::sync`] (which then has nothing to
    /// do: an fsync of a clean write-ahead log still costs a disk cache flush).
    unsynced: AtomicBool,
    /// Past this many bytes of write-ahead log, [`MetaEngine::maintain`] checkpoints it whole and
    /// truncates it ([`WAL_LIMIT`]).
    wal_limit: u64,
    dialect: Dialect,
}

/// The write-ahead log's size past which `maintain` runs a `TRUNCATE` checkpoint instead of a
/// passive one. Passive checkpoints never wait, so under a steady stream of commits (an untar of
/// a million files) they never catch up with the log's end, SQLite never restarts the log, and
/// it grew to 20 GB, its shared-memory index (mapped by every client) with it. A `TRUNCATE`
/// checkpoint makes the writers of every client wait (their busy timeout) while it copies the
/// log back and empties it: about once per 64 MiB of metadata changes.
const WAL_LIMIT: u64 = 64 << 20;

impl SqliteEngine {
    fn connect(path: &Path) -> Result<Connection> {
        // Each transaction's log frames in one write (walbatch.rs).
        let c = match walbatch::vfs() {
            Some(vfs) => Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs)?,
            None => Connection::open(path)?,
        };
        c.busy_timeout(BUSY_TIMEOUT)?;
        // Every statement of the engine stays prepared (the default cache of 16 thrashes).
        c.set_prepared_statement_cache_capacity(256);
        // Keep query plans stable whatever values are bound: without this, statements are
        // re-prepared when bound values change.
        c.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        // Small pages: each transaction appends the pages it touched to the log, so 1 KiB pages
        // cut the bytes written per create several times. (Only takes effect on a new file.)
        c.pragma_update(None, "page_size", 1024)?;
        c.pragma_update(None, "journal_mode", "WAL")?;
        c.pragma_update(None, "synchronous", "NORMAL")?;
        c.pragma_update(None, "cache_size", -16384)?;
        // Checkpoints (which fsync the database) run in the background through
        // `MetaEngine::maintain`, never inside an application's create or write.
        c.pragma_update(None, "wal_autocheckpoint", 0)?;
        c.pragma_update(None, "foreign_keys", "OFF")?;
        Ok(c)
    }

    fn new(path: &Path) -> Result<SqliteEngine> {
        let writer = Self::connect(path)?;
        Ok(SqliteEngine {
            path: path.to_path_buf(),
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            unsynced: AtomicBool::new(true),
            wal_limit: WAL_LIMIT,
            dialect: Dialect::new(DialectKind::Sqlite),
        })
    }

    /// Opens a formatted filesystem, migrating its schema if it is older than this build.
    pub fn open(path: &Path) -> Result<SqliteEngine> {
        if !path.exists() {
            return Err(MetaError::NotFormatted(format!(
                "{} does not exist",
                path.display()
            )));
        }
        let e = Self::new(path)?;
        schema::open(&e, &path.display().to_string())?;
        Ok(e)
    }

    /// Creates a new filesystem: schema, settings, targets and the root directory.
    pub fn format(path: &Path, p: &FormatParams) -> Result<SqliteEngine> {
        if p.targets.is_empty() {
            return Err(MetaError::Invalid(
                "at least one storage target is needed".into(),
            ));
        }
        if path.exists() {
            match Self::open(path) {
                Ok(e) => {
                    let name = crate::core::admin::fs_info(&e)
                        .map(|i| i.name)
                        .unwrap_or_default();
                    if !p.force {
                        return Err(MetaError::AlreadyFormatted(name));
                    }
                }
                Err(MetaError::NotFormatted(_)) => {}
                Err(e) if !p.force => return Err(e),
                Err(_) => {}
            }
            for suffix in ["", "-wal", "-shm"] {
                let mut f = path.as_os_str().to_owned();
                f.push(suffix);
                let _ = std::fs::remove_file(PathBuf::from(f));
            }
        }
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| MetaError::Db(format!("cannot create {}: {e}", dir.display())))?;
            }
        }
        let e = Self::new(path)?;
        schema::migrate(&e)?;
        crate::core::admin::init_filesystem(&e, p)?;
        Ok(e)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in a write transaction, retrying with backoff while the database is busy.
    fn write<T>(&self, mut f: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        self.write_commit_conn(|c| f(c).map(Ok))?
    }

    /// Like `write`, but an inner `Err` is committed (work done before a reported failure is
    /// kept); an outer one rolls back.
    fn write_commit_conn<T>(
        &self,
        mut f: impl FnMut(&Connection) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        let c = self.writer.lock();
        self.unsynced.store(true, Ordering::Relaxed);
        let mut attempt = 0u32;
        loop {
            // BEGIN/COMMIT as cached statements: parsing them anew each time cost as much as
            // the work inside a small transaction.
            let r = (|| {
                c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
                let v = match f(&c) {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = c.prepare_cached("ROLLBACK").and_then(|mut s| s.execute([]));
                        return Err(e);
                    }
                };
                if let Err(e) = c.prepare_cached("COMMIT").and_then(|mut s| s.execute([])) {
                    let _ = c.prepare_cached("ROLLBACK").and_then(|mut s| s.execute([]));
                    return Err(e.into());
                }
                Ok(v)
            })();
            match r {
                Err(MetaError::Busy(_)) if attempt < MAX_RETRIES => {
                    attempt += 1;
                    let ms = 10u64 << attempt.min(7);
                    tracing::debug!(attempt, "metadata database busy, retrying in {ms} ms");
                    std::thread::sleep(Duration::from_millis(ms));
                }
                Err(MetaError::Busy(_)) => return Err(MetaError::Busy(attempt)),
                other => return other,
            }
        }
    }

    /// Makes every committed transaction durable (fsync of the write-ahead log).
    fn sync_wal(&self) -> Result<()> {
        // Commits run with synchronous=NORMAL: they survive a crash of the process but may be
        // lost with power. Syncing the write-ahead log makes every committed transaction durable,
        // exactly what synchronous=FULL would do at each commit.
        // Writers wait meanwhile, so nothing commits between the check and the fsync.
        let _w = self.writer.lock();
        if !self.unsynced.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        let r = match std::fs::File::open(PathBuf::from(&wal)) {
            Ok(f) => f
                .sync_all()
                .map_err(|e| MetaError::Db(format!("fsync of the WAL: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(MetaError::Db(format!("open of the WAL: {e}"))),
        };
        if r.is_err() {
            self.unsynced.store(true, Ordering::Relaxed);
        }
        r
    }

    /// Checkpoints the write-ahead log (truncating it past its limit).
    fn checkpoint(&self) -> Result<()> {
        // Copy the write-ahead log back into the database without blocking writers or waiting
        // for readers; the log is reset once every reader has moved past it.
        self.read(|c| {
            c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
            Ok(())
        })?;
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let wal_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        if wal_len > self.wal_limit {
            // On the writer connection, so this process's writers wait behind it rather than
            // retry; other clients' writers wait through their busy timeout.
            let c = self.writer.lock();
            let (busy, log, done): (i64, i64, i64) =
                c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            if busy != 0 {
                tracing::debug!(
                    "write-ahead log of {wal_len} bytes: truncating checkpoint blocked \
                     ({done} of {log} frames copied); trying again next time"
                );
            }
        }
        Ok(())
    }

    /// Runs `f` on a pooled reader connection (WAL lets readers run beside the writer).
    fn read<T>(&self, mut f: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.readers.lock().pop();
        let conn = match conn {
            Some(c) => c,
            None => Self::connect(&self.path)?,
        };
        let mut attempt = 0u32;
        let r = loop {
            // Single statements read a consistent snapshot on their own; skipping BEGIN/COMMIT
            // halves the cost of the hottest calls (lookup, getattr).
            let r = f(&conn);
            match r {
                Err(MetaError::Busy(_)) if attempt < MAX_RETRIES => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(5u64 << attempt.min(7)));
                }
                Err(MetaError::Busy(_)) => break Err(MetaError::Busy(attempt)),
                other => break other,
            }
        };
        let mut pool = self.readers.lock();
        if pool.len() < 16 {
            pool.push(conn);
        }
        r
    }
}

/// The SQLite engine: the shared core over the SQLite driver.
pub type SqliteMeta = SqlMeta<SqliteEngine>;

impl SqlMeta<SqliteEngine> {
    /// Opens a formatted filesystem, migrating its schema if it is older than this build.
    pub fn open(path: &Path) -> Result<SqliteMeta> {
        Ok(SqlMeta::new(SqliteEngine::open(path)?))
    }

    /// Creates a new filesystem: schema, settings, targets and the root directory.
    pub fn format(path: &Path, p: &FormatParams) -> Result<SqliteMeta> {
        Ok(SqlMeta::new(SqliteEngine::format(path, p)?))
    }
}

impl Driver for SqliteEngine {
    fn dialect(&self) -> &Dialect {
        &self.dialect
    }

    fn write_commit<T>(
        &self,
        mut f: impl FnMut(&mut dyn Tx) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        self.write_commit_conn(|c| f(&mut SqliteTx::new(c, &self.dialect)))
    }

    fn read<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        SqliteEngine::read(self, |c| f(&mut SqliteTx::new(c, &self.dialect)))
    }

    fn exclusive<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        // One writer at a time, across processes: BEGIN IMMEDIATE is already exclusive.
        self.write(|c| f(&mut SqliteTx::new(c, &self.dialect)))
    }

    fn sync(&self) -> Result<()> {
        self.sync_wal()
    }

    fn maintain(&self) -> Result<()> {
        self.checkpoint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Admin, FileData, MetaEngine, Namespace, Pcc};

    fn fresh() -> (tempfile::TempDir, SqliteMeta) {
        let d = tempfile::tempdir().unwrap();
        let e = SqliteMeta::format(&d.path().join("m.db"), &crate::conformance::params()).unwrap();
        (d, e)
    }

    #[test]
    fn conformance_suite_passes_on_sqlite() {
        crate::conformance::run_all(&|| {
            let (d, e) = fresh();
            (
                Box::new(d) as Box<dyn std::any::Any>,
                Box::new(e) as Box<dyn MetaEngine>,
            )
        });
    }

    #[test]
    fn maintain_truncates_a_write_ahead_log_past_its_limit() {
        let (d, mut e) = fresh();
        e.driver_mut().wal_limit = 256 << 10;
        let wal = d.path().join("m.db-wal");
        let root = e.getattr(crate::ROOT_INO).unwrap();
        let mut i = 0u32;
        while std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) <= e.driver().wal_limit {
            let node = NewNode {
                kind: Kind::File,
                perm: 0o644,
                uid: 0,
                gid: 0,
                rdev: 0,
                symlink: None,
            };
            e.create(root.ino, format!("f{i}").as_bytes(), &node, None, None)
                .unwrap();
            i += 1;
        }
        e.maintain().unwrap();
        let len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        assert!(
            len < e.driver().wal_limit,
            "log of {len} bytes after maintain (limit {})",
            e.driver().wal_limit
        );
        // nothing is lost by the truncation
        assert_eq!(e.readdir(root.ino, 0, 100_000).unwrap().len() as u32, i);
    }

    #[test]
    fn format_refuses_a_formatted_file_without_force() {
        let (d, _e) = fresh();
        let r = SqliteMeta::format(&d.path().join("m.db"), &crate::conformance::params());
        assert!(matches!(r, Err(MetaError::AlreadyFormatted(_))));
        let mut p = crate::conformance::params();
        p.force = true;
        assert!(SqliteMeta::format(&d.path().join("m.db"), &p).is_ok());
    }

    #[test]
    fn a_version_3_filesystem_gains_rule_quotas_when_opened() {
        let (d, e) = fresh();
        let r = e.pcc_rule_add("rw", None, "uid={7}", None).unwrap();
        drop(e);
        // Turn it back into what a version-3 build wrote.
        let path = d.path().join("m.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "ALTER TABLE pcc_rules DROP COLUMN quota; \
                 ALTER TABLE inodes DROP COLUMN allocated; PRAGMA user_version = 3;",
            )
            .unwrap();
            for i in schema::indexes_added_after(5) {
                c.execute_batch(&format!("DROP INDEX {i}")).unwrap();
            }
            for t in schema::tables_added_after(5) {
                c.execute_batch(&format!("DROP TABLE {t}")).unwrap();
            }
            for (t, col) in schema::columns_added_after(5) {
                c.execute_batch(&format!("ALTER TABLE {t} DROP COLUMN {col}"))
                    .unwrap();
            }
        }
        let e = SqliteMeta::open(&path).unwrap();
        let rules = e.pcc_rules().unwrap();
        assert_eq!((rules[0].id, rules[0].quota), (r, None));
        e.pcc_rule_set_quota(r, Some(1 << 30)).unwrap();
        assert_eq!(e.pcc_rules().unwrap()[0].quota, Some(1 << 30));
        let v: i64 = e
            .driver()
            .writer
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn a_version_4_filesystem_gains_allocated_bytes_when_opened() {
        let (d, e) = fresh();
        let f = e
            .create(
                ROOT_INO,
                b"f",
                &NewNode {
                    kind: Kind::File,
                    perm: 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    symlink: None,
                },
                Some(Layout {
                    stripe_size: 1 << 20,
                    targets: vec![0],
                }),
                None,
            )
            .unwrap();
        let obj = |chunk, off, len, obj| Slice {
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
        };
        e.commit_slices(f.ino, &[obj(0, 0, 100, 1), obj(0, 50, 100, 2)], 150, 1)
            .unwrap();
        e.commit_slices(f.ino, &[obj(3, 0, 10, 3)], (3 << 20) + 10, 2)
            .unwrap();
        assert_eq!(e.getattr(f.ino).unwrap().allocated, 160);
        drop(e);
        // Turn it back into what a version-4 build wrote.
        let path = d.path().join("m.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch("ALTER TABLE inodes DROP COLUMN allocated; PRAGMA user_version = 4;")
                .unwrap();
            for i in schema::indexes_added_after(5) {
                c.execute_batch(&format!("DROP INDEX {i}")).unwrap();
            }
            for t in schema::tables_added_after(5) {
                c.execute_batch(&format!("DROP TABLE {t}")).unwrap();
            }
            for (t, col) in schema::columns_added_after(5) {
                c.execute_batch(&format!("ALTER TABLE {t} DROP COLUMN {col}"))
                    .unwrap();
            }
        }
        let e = SqliteMeta::open(&path).unwrap();
        assert_eq!(
            e.getattr(f.ino).unwrap().allocated,
            160,
            "counted at migration"
        );
        let v: i64 = e
            .driver()
            .writer
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn open_refuses_unformatted_and_missing() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            SqliteMeta::open(&d.path().join("none.db")),
            Err(MetaError::NotFormatted(_))
        ));
        let p = d.path().join("empty.db");
        Connection::open(&p).unwrap();
        assert!(matches!(
            SqliteMeta::open(&p),
            Err(MetaError::NotFormatted(_))
        ));
    }

    #[test]
    fn dump_and_load_round_trip() {
        let (_d, a) = fresh();
        let node = NewNode {
            kind: Kind::File,
            perm: 0o640,
            uid: 7,
            gid: 8,
            rdev: 0,
            symlink: None,
        };
        let f = a
            .create(
                ROOT_INO,
                b"f",
                &node,
                Some(Layout {
                    stripe_size: 1 << 20,
                    targets: vec![1],
                }),
                None,
            )
            .unwrap();
        let inline = Slice {
            seq: 0,
            chunk: 0,
            off: 0,
            len: 3,
            data: SliceData::Inline(b"abc".to_vec()),
        };
        a.commit_slices(f.ino, &[inline], 3, 5).unwrap();
        a.setxattr(f.ino, b"user.k", b"v", 0).unwrap();
        a.pcc_rule_add("ro", None, "uid={7}", None).unwrap();
        let mut rows = Vec::new();
        a.export_rows(&mut |r| {
            rows.push(r);
            Ok(())
        })
        .unwrap();
        let (_d2, b) = fresh();
        let n = b
            .import_rows(&mut rows.clone().into_iter().map(Ok))
            .unwrap();
        assert_eq!(n as usize, rows.len());
        let g = b.lookup(ROOT_INO, b"f").unwrap();
        assert_eq!((g.ino, g.uid, g.perm, g.size), (f.ino, 7, 0o640, 3));
        assert_eq!(
            b.read_chunk(f.ino, 0).unwrap()[0].data,
            SliceData::Inline(b"abc".to_vec())
        );
        assert_eq!(b.getxattr(f.ino, b"user.k").unwrap(), b"v");
        assert_eq!(g.xattr_count, 1);
        assert_eq!(b.pcc_rules().unwrap().len(), 1);
        assert_eq!(b.info().unwrap().uuid, a.info().unwrap().uuid);
        // a second load into a filesystem that holds files is refused
        assert!(matches!(
            b.import_rows(&mut rows.clone().into_iter().map(Ok)),
            Err(MetaError::Invalid(_))
        ));
        // A dump from before v9 has no xattr counts: the load counts them.
        let old: Vec<DumpRow> = rows
            .into_iter()
            .map(|(t, cols)| {
                let cols = cols.into_iter().filter(|(c, _)| c != "xattr_count");
                (t, cols.collect())
            })
            .collect();
        let (_d3, c) = fresh();
        c.import_rows(&mut old.into_iter().map(Ok)).unwrap();
        assert_eq!(c.getattr(f.ino).unwrap().xattr_count, 1);
        assert_eq!(c.getattr(ROOT_INO).unwrap().xattr_count, 0);
    }

    /// A dump keeps the HSM state of files (flags, archive copies) and the archives; the queue
    /// and agents, like sessions, are not part of it.
    #[test]
    fn dump_and_load_keep_hsm_state() {
        use crate::engine::Hsm;
        use crate::hsm::{HsmFlags, HsmImport};
        let (_d, a) = fresh();
        a.hsm_archive_add(2, "file:///arch").unwrap();
        let item = HsmImport {
            parent: ROOT_INO,
            name: b"r".to_vec(),
            perm: 0o600,
            uid: 1,
            gid: 2,
            size: 4096,
            mtime: 77,
            key: "tree/r".into(),
            checksum: "sha256:ff".into(),
            layout: Layout {
                stripe_size: 1 << 20,
                targets: vec![1],
            },
        };
        let r = a.hsm_import(2, &[item]).unwrap().pop().unwrap();
        let mut rows = Vec::new();
        a.export_rows(&mut |r| {
            rows.push(r);
            Ok(())
        })
        .unwrap();
        let (_d2, b) = fresh();
        b.import_rows(&mut rows.into_iter().map(Ok)).unwrap();
        let g = b.getattr(r.ino).unwrap();
        assert_eq!(
            (g.size, g.allocated, g.hsm),
            (
                4096,
                0,
                HsmFlags(HsmFlags::EXISTS | HsmFlags::ARCHIVED | HsmFlags::RELEASED)
            )
        );
        assert_eq!(b.hsm_state(r.ino).unwrap(), a.hsm_state(r.ino).unwrap());
        assert_eq!(b.hsm_archives().unwrap(), a.hsm_archives().unwrap());
    }

    #[test]
    fn two_engines_on_one_file_see_each_other() {
        let (d, a) = fresh();
        let b = SqliteMeta::open(&d.path().join("m.db")).unwrap();
        let node = NewNode {
            kind: Kind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            rdev: 0,
            symlink: None,
        };
        a.create(ROOT_INO, b"x", &node, None, None).unwrap();
        assert_eq!(b.lookup(ROOT_INO, b"x").unwrap().kind, Kind::Dir);
    }
}
