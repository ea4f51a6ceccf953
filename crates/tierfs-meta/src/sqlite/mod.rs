//! The embedded metadata engine: SQLite in WAL mode.
//!
//! Several client processes on one machine open the same database file. Writes run in
//! `BEGIN IMMEDIATE` transactions (SQLite allows one writer at a time; taking the write lock up
//! front avoids deadlocking lock upgrades), serialised inside a process by one writer
//! connection, and retried with bounded exponential backoff when another process holds the lock
//! past the busy timeout. Reads use a small pool of reader connections, which WAL lets run
//! beside the writer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::core::schema;
pub use crate::core::schema::SCHEMA_VERSION;
use crate::core::SqlMeta;
use crate::engine::LegacyEngine;
use crate::error::{MetaError, Result};
use crate::sql::sqlite::SqliteTx;
use crate::sql::{Dialect, DialectKind, Driver, Tx};
use crate::types::*;

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_RETRIES: u32 = 8;
const MAX_LINKS: i64 = 65000;

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

const ATTR_COLS: &str =
    "ino, kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime, crtime, \
     projid, data_version, stripe_size, stripe_targets, def_stripe_count, def_stripe_size, parent, \
     allocated";

fn row_to_attr(r: &rusqlite::Row<'_>) -> rusqlite::Result<Attr> {
    let kind: i64 = r.get(1)?;
    let stripe_size: i64 = r.get(14)?;
    let targets: String = r.get(15)?;
    let kind = Kind::from_i64(kind).unwrap_or(Kind::File);
    let layout = if kind == Kind::File && stripe_size > 0 {
        Some(Layout {
            stripe_size: stripe_size as u64,
            targets: Layout::decode_targets(&targets),
        })
    } else {
        None
    };
    Ok(Attr {
        ino: r.get::<_, i64>(0)? as u64,
        kind,
        perm: r.get::<_, i64>(2)? as u32,
        uid: r.get::<_, i64>(3)? as u32,
        gid: r.get::<_, i64>(4)? as u32,
        nlink: r.get::<_, i64>(5)? as u32,
        size: r.get::<_, i64>(6)? as u64,
        rdev: r.get::<_, i64>(7)? as u32,
        atime: r.get(8)?,
        mtime: r.get(9)?,
        ctime: r.get(10)?,
        crtime: r.get(11)?,
        projid: r.get::<_, i64>(12)? as u32,
        data_version: r.get::<_, i64>(13)? as u64,
        layout,
        dir_default: StripeDefault {
            stripe_count: r.get::<_, i64>(16)? as u32,
            stripe_size: r.get::<_, i64>(17)? as u64,
        },
        parent: r.get::<_, i64>(18)? as u64,
        allocated: r.get::<_, i64>(19)?.max(0) as u64,
    })
}

/// Bytes of one chunk of `ino` that hold data (see [`crate::types::allocated_bytes`]).
fn chunk_allocated(c: &Connection, ino: Ino, chunk: u64) -> Result<u64> {
    let mut st = c.prepare_cached(
        "SELECT off, len, obj IS NULL AND inline IS NULL FROM slices \
         WHERE ino = ?1 AND chunk = ?2 ORDER BY seq",
    )?;
    let rows = st.query_map(params![ino as i64, chunk as i64], |r| {
        Ok((
            r.get::<_, i64>(0)? as u64,
            r.get::<_, i64>(1)? as u64,
            r.get::<_, bool>(2)?,
        ))
    })?;
    let v = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(crate::types::allocated_bytes(&v))
}

/// Sum of [`chunk_allocated`] over `chunks` (each counted once).
fn chunks_allocated(c: &Connection, ino: Ino, chunks: &[u64]) -> Result<u64> {
    let mut list = chunks.to_vec();
    list.sort_unstable();
    list.dedup();
    let mut n = 0;
    for ch in list {
        n += chunk_allocated(c, ino, ch)?;
    }
    Ok(n)
}

/// Moves a file's allocated bytes by `after - before` (the chunks a transaction touched,
/// counted before and after it changed them).
fn add_allocated(c: &Connection, ino: Ino, before: u64, after: u64) -> Result<()> {
    if before != after {
        c.prepare_cached("UPDATE inodes SET allocated = MAX(0, allocated + ?2) WHERE ino = ?1")?
            .execute(params![ino as i64, after as i64 - before as i64])?;
    }
    Ok(())
}

/// Counts a file's allocated bytes from all its slices.
fn recount_file(c: &Connection, ino: Ino) -> Result<()> {
    let chunks: Vec<u64> = {
        let mut st = c.prepare_cached("SELECT DISTINCT chunk FROM slices WHERE ino = ?1")?;
        let rows = st.query_map([ino as i64], |r| Ok(r.get::<_, i64>(0)? as u64))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    let n = chunks_allocated(c, ino, &chunks)?;
    c.prepare_cached("UPDATE inodes SET allocated = ?2 WHERE ino = ?1")?
        .execute(params![ino as i64, n as i64])?;
    Ok(())
}

/// Counts every file's allocated bytes (migration to v5, load of a dump).
fn recount_all(c: &Connection) -> Result<()> {
    let inos: Vec<Ino> = {
        let mut st = c.prepare("SELECT DISTINCT ino FROM slices")?;
        let rows = st.query_map([], |r| Ok(r.get::<_, i64>(0)? as u64))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    c.execute("UPDATE inodes SET allocated = 0", [])?;
    for ino in inos {
        recount_file(c, ino)?;
    }
    Ok(())
}

fn get_attr(c: &Connection, ino: Ino) -> Result<Attr> {
    let sql = format!("SELECT {ATTR_COLS} FROM inodes WHERE ino = ?1");
    c.prepare_cached(&sql)?
        .query_row([ino as i64], row_to_attr)
        .optional()?
        .ok_or(MetaError::NotFound)
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(MetaError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(MetaError::Invalid("bad file name".into()));
    }
    Ok(())
}

fn dir_attr(c: &Connection, ino: Ino) -> Result<Attr> {
    let a = get_attr(c, ino)?;
    if a.kind != Kind::Dir {
        return Err(MetaError::NotDir);
    }
    Ok(a)
}

/// (dentry id, ino, kind) of a name.
fn find_dentry(c: &Connection, parent: Ino, name: &[u8]) -> Result<Option<(i64, Ino, Kind)>> {
    Ok(
        c.prepare_cached("SELECT id, ino, kind FROM dentries WHERE parent = ?1 AND name = ?2")?
            .query_row(params![parent as i64, name], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)? as u64,
                    Kind::from_i64(r.get(2)?).unwrap_or(Kind::File),
                ))
            })
            .optional()?,
    )
}

fn touch_dir(c: &Connection, dir: Ino, now: Nanos, nlink_delta: i64) -> Result<()> {
    c.prepare_cached(
        "UPDATE inodes SET mtime = ?2, ctime = ?2, nlink = nlink + ?3 WHERE ino = ?1",
    )?
    .execute(params![dir as i64, now, nlink_delta])?;
    Ok(())
}

fn insert_slice(c: &Connection, ino: Ino, s: &Slice) -> Result<()> {
    let (target, obj, obj_off, obj_size, inline) = match &s.data {
        SliceData::Object {
            target,
            obj,
            obj_off,
            obj_size,
        } => (
            Some(*target as i64),
            Some(*obj as i64),
            *obj_off as i64,
            *obj_size as i64,
            None,
        ),
        SliceData::Inline(b) => (None, None, 0, 0, Some(b.as_slice())),
        SliceData::Zero => (None, None, 0, 0, None),
    };
    c.prepare_cached(
        "INSERT INTO slices (ino, chunk, off, len, target, obj, inline, obj_off, obj_size) \
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    )?
    .execute(params![
        ino as i64,
        s.chunk as i64,
        s.off as i64,
        s.len as i64,
        target,
        obj,
        inline,
        obj_off,
        obj_size
    ])?;
    Ok(())
}

/// Deletes the selected slices; objects no remaining slice references go to the trash.
fn trash_slices(c: &Connection, ino: Ino, where_sql: &str, args: &[i64]) -> Result<()> {
    let mut all: Vec<i64> = vec![ino as i64];
    all.extend_from_slice(args);
    let gone: Vec<(i64, i64, i64)> = {
        let mut st = c.prepare_cached(&format!(
            "DELETE FROM slices WHERE ino = ?1 AND {where_sql} RETURNING target, obj, obj_size"
        ))?;
        let rows = st.query_map(rusqlite::params_from_iter(all.iter()), |r| {
            Ok((
                r.get::<_, Option<i64>>(0)?,
                r.get::<_, Option<i64>>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut v = Vec::new();
        for row in rows {
            if let (Some(t), Some(o), size) = row? {
                v.push((t, o, size));
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    };
    for (target, obj, size) in gone {
        let used: bool = c
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM slices WHERE obj = ?1)")?
            .query_row([obj], |r| r.get(0))?;
        if !used {
            c.prepare_cached("INSERT INTO trash (ino, target, obj, len) VALUES (?1, ?2, ?3, ?4)")?
                .execute(params![ino as i64, target, obj, size])?;
        }
    }
    Ok(())
}

/// Whether some client has `ino` open.
fn is_open(c: &Connection, ino: Ino) -> Result<bool> {
    Ok(
        c.prepare_cached("SELECT EXISTS (SELECT 1 FROM open_files WHERE ino = ?1)")?
            .query_row([ino as i64], |r| r.get(0))?,
    )
}

fn set_orphan(c: &Connection, ino: Ino, orphan: i64) -> Result<()> {
    c.prepare_cached("UPDATE inodes SET orphan = ?2 WHERE ino = ?1")?
        .execute(params![ino as i64, orphan])?;
    Ok(())
}

/// Deletes an inode whose last name is gone, or marks it orphan while a client has it open.
fn drop_inode(c: &Connection, ino: Ino) -> Result<()> {
    if is_open(c, ino)? {
        return set_orphan(c, ino, 1);
    }
    purge_inode(c, ino)
}

/// Retires a file whose last name a rename replaced: kept openable for [`ORPHAN_GRACE`]
/// (`orphan = 2`), whether or not a client has it open now, and purged by
/// [`MetaEngine::purge_orphans`] once the grace is over and nobody has it open. (Marking it an
/// open orphan when open, purged at the last close, took the grace away from exactly the files
/// of the "write a temporary file, rename it over the live name" loop: the writer's close of
/// the previous version is still in its batch when the next rename replaces it.)
fn retire_inode(c: &Connection, ino: Ino) -> Result<()> {
    set_orphan(c, ino, 2)?;
    // Leases and recall requests go now, as on unlink.
    c.prepare_cached("DELETE FROM pcc_leases WHERE ino = ?1")?
        .execute([ino as i64])?;
    c.prepare_cached("DELETE FROM pcc_revokes WHERE ino = ?1")?
        .execute([ino as i64])?;
    Ok(())
}

fn purge_inode(c: &Connection, ino: Ino) -> Result<()> {
    trash_slices(c, ino, "1 = 1", &[])?;
    c.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
        .execute([ino as i64])?;
    c.prepare_cached("DELETE FROM locks WHERE ino = ?1")?
        .execute([ino as i64])?;
    c.prepare_cached("DELETE FROM pcc_leases WHERE ino = ?1")?
        .execute([ino as i64])?;
    c.prepare_cached("DELETE FROM pcc_revokes WHERE ino = ?1")?
        .execute([ino as i64])?;
    c.prepare_cached("DELETE FROM inodes WHERE ino = ?1")?
        .execute([ino as i64])?;
    Ok(())
}

/// Zeroes `[off, off+len)` of a file by adding zero slices, chunk by chunk.
fn zero_range(c: &Connection, ino: Ino, stripe_size: u64, off: u64, len: u64) -> Result<()> {
    let mut pos = off;
    let end = off + len;
    while pos < end {
        let chunk = pos / stripe_size;
        let coff = pos % stripe_size;
        let n = (stripe_size - coff).min(end - pos);
        let before = chunk_allocated(c, ino, chunk)?;
        insert_slice(
            c,
            ino,
            &Slice {
                seq: 0,
                chunk,
                off: coff,
                len: n,
                data: SliceData::Zero,
            },
        )?;
        add_allocated(c, ino, before, chunk_allocated(c, ino, chunk)?)?;
        pos += n;
    }
    Ok(())
}

/// Changes a file's size: shrinking frees whole chunks beyond the end and zeroes the tail of the
/// last one, so that growing again later reads zeros.
fn truncate(c: &Connection, a: &Attr, new_size: u64) -> Result<()> {
    if new_size < a.size {
        if let Some(l) = &a.layout {
            let cs = l.stripe_size;
            let first_gone = new_size.div_ceil(cs);
            let gone: Vec<u64> = {
                let mut st = c.prepare_cached(
                    "SELECT DISTINCT chunk FROM slices WHERE ino = ?1 AND chunk >= ?2",
                )?;
                let rows = st.query_map(params![a.ino as i64, first_gone as i64], |r| {
                    Ok(r.get::<_, i64>(0)? as u64)
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()?
            };
            let freed = chunks_allocated(c, a.ino, &gone)?;
            trash_slices(c, a.ino, "chunk >= ?2", &[first_gone as i64])?;
            add_allocated(c, a.ino, freed, 0)?;
            if !new_size.is_multiple_of(cs) {
                let chunk = new_size / cs;
                let off = new_size % cs;
                let beyond: bool = c
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM slices WHERE ino = ?1 AND chunk = ?2 \
                         AND off + len > ?3)",
                    )?
                    .query_row(params![a.ino as i64, chunk as i64, off as i64], |r| {
                        r.get(0)
                    })?;
                if beyond {
                    zero_range(c, a.ino, cs, new_size, cs - off)?;
                }
            }
        }
    }
    Ok(())
}

fn is_ancestor(c: &Connection, maybe_ancestor: Ino, mut ino: Ino) -> Result<bool> {
    let mut hops = 0;
    while ino != ROOT_INO && hops < 100_000 {
        if ino == maybe_ancestor {
            return Ok(true);
        }
        ino = c
            .prepare_cached("SELECT parent FROM inodes WHERE ino = ?1")?
            .query_row([ino as i64], |r| r.get::<_, i64>(0))? as u64;
        hops += 1;
    }
    Ok(ino == maybe_ancestor)
}

fn resolve_time(t: TimeSet, now: Nanos) -> Nanos {
    match t {
        TimeSet::Now => now,
        TimeSet::At(n) => n,
    }
}

impl SqliteEngine {
    fn connect(path: &Path) -> Result<Connection> {
        let c = Connection::open(path)?;
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
        let version: i64 = e
            .writer
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version == 0 {
            return Err(MetaError::NotFormatted(format!(
                "{} holds no tierfs schema",
                path.display()
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(MetaError::SchemaTooNew {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        schema::migrate(&e)?;
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
                    let name = e.info().map(|i| i.name).unwrap_or_default();
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
        let now = now_nanos();
        let uuid = uuid::Uuid::new_v4().to_string();
        e.write(|tx| {
            let kv = [
                ("name", p.name.clone()),
                ("uuid", uuid.clone()),
                ("stripe_count", p.stripe_count.to_string()),
                ("stripe_size", p.stripe_size.to_string()),
                ("inline_threshold", p.inline_threshold.to_string()),
                ("created", now.to_string()),
            ];
            for (k, v) in kv {
                tx.execute("INSERT INTO meta_info (key, value) VALUES (?1, ?2)", params![k, v])?;
            }
            tx.execute("INSERT INTO counters (name, value) VALUES ('next_object', 1)", [])?;
            for (i, (url, cap)) in p.targets.iter().enumerate() {
                tx.execute(
                    "INSERT INTO targets (id, url, capacity) VALUES (?1, ?2, ?3)",
                    params![i as i64, url, *cap as i64],
                )?;
            }
            tx.execute(
                "INSERT INTO inodes (ino, kind, perm, uid, gid, nlink, atime, mtime, ctime, crtime, parent) \
                 VALUES (1, ?1, ?2, 0, 0, 2, ?3, ?3, ?3, ?3, 1)",
                params![Kind::Dir as i64, 0o755, now],
            )?;
            Ok(())
        })?;
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

impl LegacyEngine for SqliteEngine {
    fn info(&self) -> Result<FsInfo> {
        self.read(|c| {
            let mut st = c.prepare_cached("SELECT key, value FROM meta_info")?;
            let rows =
                st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
            let mut info = FsInfo {
                name: String::new(),
                uuid: String::new(),
                default_stripe_count: 1,
                default_stripe_size: 1 << 20,
                inline_threshold: 0,
                created: 0,
                schema_version: SCHEMA_VERSION,
            };
            for row in rows {
                let (k, v) = row?;
                match k.as_str() {
                    "name" => info.name = v,
                    "uuid" => info.uuid = v,
                    "stripe_count" => info.default_stripe_count = v.parse().unwrap_or(1),
                    "stripe_size" => info.default_stripe_size = v.parse().unwrap_or(1 << 20),
                    "inline_threshold" => info.inline_threshold = v.parse().unwrap_or(0),
                    "created" => info.created = v.parse().unwrap_or(0),
                    _ => {}
                }
            }
            Ok(info)
        })
    }

    fn targets(&self) -> Result<Vec<TargetInfo>> {
        self.read(|c| {
            let mut st = c.prepare_cached(
                "SELECT id, url, capacity, used, objects FROM targets ORDER BY id",
            )?;
            let rows = st.query_map([], |r| {
                Ok(TargetInfo {
                    id: r.get::<_, i64>(0)? as u32,
                    url: r.get(1)?,
                    capacity: r.get::<_, i64>(2)? as u64,
                    used: r.get::<_, i64>(3)?.max(0) as u64,
                    objects: r.get::<_, i64>(4)?.max(0) as u64,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn usage(&self) -> Result<Usage> {
        self.read(|c| {
            let inodes: i64 = c.query_row("SELECT COUNT(*) FROM inodes", [], |r| r.get(0))?;
            let bytes: i64 =
                c.query_row("SELECT COALESCE(SUM(used), 0) FROM targets", [], |r| {
                    r.get(0)
                })?;
            let inline: i64 = c.query_row(
                "SELECT COALESCE(SUM(len), 0) FROM slices WHERE inline IS NOT NULL",
                [],
                |r| r.get(0),
            )?;
            Ok(Usage {
                inodes: inodes as u64,
                bytes: (bytes + inline).max(0) as u64,
            })
        })
    }

    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(MetaError::NameTooLong);
        }
        self.read(|c| {
            let sql = format!(
                "SELECT {} FROM dentries d JOIN inodes i ON i.ino = d.ino \
                 WHERE d.parent = ?1 AND d.name = ?2",
                ATTR_COLS
                    .split(", ")
                    .map(|x| format!("i.{x}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            match c
                .prepare_cached(&sql)?
                .query_row(params![parent as i64, name], row_to_attr)
                .optional()?
            {
                Some(a) => Ok(a),
                None => {
                    dir_attr(c, parent)?;
                    Err(MetaError::NotFound)
                }
            }
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.read(|c| get_attr(c, ino))
    }

    fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.write(|tx| {
            let mut a = get_attr(tx, ino)?;
            let now = now_nanos();
            let mut changed = false;
            if let Some(size) = set.size {
                if a.kind == Kind::Dir {
                    return Err(MetaError::IsDir);
                }
                if a.kind != Kind::File {
                    return Err(MetaError::Invalid("truncate of a special file".into()));
                }
                truncate(tx, &a, size)?;
                a.size = size;
                a.data_version += 1;
                a.mtime = now;
                changed = true;
            }
            if let Some(p) = set.perm {
                a.perm = p & 0o7777;
                changed = true;
            }
            if let Some(u) = set.uid {
                a.uid = u;
                changed = true;
            }
            if let Some(g) = set.gid {
                a.gid = g;
                changed = true;
            }
            if let Some(t) = set.atime {
                a.atime = resolve_time(t, now);
                changed = true;
            }
            if let Some(t) = set.mtime {
                a.mtime = resolve_time(t, now);
                changed = true;
            }
            if changed {
                a.ctime = set.ctime.unwrap_or(now);
            } else if let Some(ct) = set.ctime {
                a.ctime = ct;
            }
            tx.prepare_cached(
                "UPDATE inodes SET perm=?2, uid=?3, gid=?4, size=?5, atime=?6, mtime=?7, ctime=?8, \
                 data_version=?9 WHERE ino=?1",
            )?
            .execute(params![
                ino as i64,
                a.perm as i64,
                a.uid as i64,
                a.gid as i64,
                a.size as i64,
                a.atime,
                a.mtime,
                a.ctime,
                a.data_version as i64
            ])?;
            Ok(a)
        })
    }

    fn create(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        layout: Option<Layout>,
        open_by: Option<u64>,
    ) -> Result<Attr> {
        check_name(name)?;
        self.write(|tx| {
            let p = dir_attr(tx, parent)?;
            if p.nlink == 0 {
                return Err(MetaError::NotFound);
            }
            if find_dentry(tx, parent, name)?.is_some() {
                return Err(MetaError::Exists);
            }
            let now = now_nanos();
            let mut perm = node.perm & 0o7777;
            let mut gid = node.gid;
            if p.perm & libc::S_ISGID != 0 {
                gid = p.gid;
                if node.kind == Kind::Dir {
                    perm |= libc::S_ISGID;
                }
            }
            let (projid, projinherit): (i64, i64) = tx
                .prepare_cached("SELECT projid, projinherit FROM inodes WHERE ino = ?1")?
                .query_row([parent as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let (child_proj, child_inherit) = if projinherit != 0 {
                (projid, if node.kind == Kind::Dir { 1 } else { 0 })
            } else {
                (0, 0)
            };
            let nlink = if node.kind == Kind::Dir { 2 } else { 1 };
            let size = node.symlink.as_ref().map(|s| s.len()).unwrap_or(0) as i64;
            let (ss, st) = match (&layout, node.kind) {
                (Some(l), Kind::File) => (l.stripe_size as i64, l.encode_targets()),
                _ => (0, String::new()),
            };
            tx.prepare_cached(
                "INSERT INTO inodes (kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime, \
                 crtime, projid, projinherit, stripe_size, stripe_targets, parent, symlink) \
                 VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?8,?8,?8,?9,?10,?11,?12,?13,?14)",
            )?
            .execute(params![
                node.kind as i64,
                perm as i64,
                node.uid as i64,
                gid as i64,
                nlink,
                size,
                node.rdev as i64,
                now,
                child_proj,
                child_inherit,
                ss,
                st,
                parent as i64,
                node.symlink.as_deref()
            ])?;
            let ino = tx.last_insert_rowid() as u64;
            tx.prepare_cached(
                "INSERT INTO dentries (parent, name, ino, kind) VALUES (?1,?2,?3,?4)",
            )?
            .execute(params![parent as i64, name, ino as i64, node.kind as i64])?;
            touch_dir(tx, parent, now, if node.kind == Kind::Dir { 1 } else { 0 })?;
            if let Some(session) = open_by {
                record_open(tx, session, ino)?;
            }
            get_attr(tx, ino)
        })
    }

    fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        check_name(new_name)?;
        self.write(|tx| {
            let a = get_attr(tx, ino)?;
            if a.kind == Kind::Dir {
                return Err(MetaError::NotPermitted);
            }
            if a.nlink as i64 >= MAX_LINKS {
                return Err(MetaError::TooManyLinks);
            }
            let p = dir_attr(tx, new_parent)?;
            if p.nlink == 0 {
                return Err(MetaError::NotFound);
            }
            if find_dentry(tx, new_parent, new_name)?.is_some() {
                return Err(MetaError::Exists);
            }
            let now = now_nanos();
            tx.prepare_cached(
                "INSERT INTO dentries (parent, name, ino, kind) VALUES (?1,?2,?3,?4)",
            )?
            .execute(params![
                new_parent as i64,
                new_name,
                ino as i64,
                a.kind as i64
            ])?;
            tx.prepare_cached(
                "UPDATE inodes SET nlink = nlink + 1, ctime = ?2, orphan = 0 WHERE ino = ?1",
            )?
            .execute(params![ino as i64, now])?;
            touch_dir(tx, new_parent, now, 0)?;
            get_attr(tx, ino)
        })
    }

    fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.write(|tx| {
            dir_attr(tx, parent)?;
            let (id, ino, kind) = find_dentry(tx, parent, name)?.ok_or(MetaError::NotFound)?;
            if kind == Kind::Dir {
                return Err(MetaError::IsDir);
            }
            let now = now_nanos();
            tx.prepare_cached("DELETE FROM dentries WHERE id = ?1")?
                .execute([id])?;
            tx.prepare_cached("UPDATE inodes SET nlink = nlink - 1, ctime = ?2 WHERE ino = ?1")?
                .execute(params![ino as i64, now])?;
            touch_dir(tx, parent, now, 0)?;
            let nlink: i64 = tx
                .prepare_cached("SELECT nlink FROM inodes WHERE ino = ?1")?
                .query_row([ino as i64], |r| r.get(0))?;
            if nlink <= 0 {
                drop_inode(tx, ino)?;
            }
            Ok(())
        })
    }

    fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(MetaError::Invalid("rmdir of '.'".into()));
        }
        if name == b".." {
            return Err(MetaError::NotEmpty);
        }
        self.write(|tx| {
            dir_attr(tx, parent)?;
            let (id, ino, kind) = find_dentry(tx, parent, name)?.ok_or(MetaError::NotFound)?;
            if kind != Kind::Dir {
                return Err(MetaError::NotDir);
            }
            let nonempty: bool = tx
                .prepare_cached("SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = ?1)")?
                .query_row([ino as i64], |r| r.get(0))?;
            if nonempty {
                return Err(MetaError::NotEmpty);
            }
            let now = now_nanos();
            tx.prepare_cached("DELETE FROM dentries WHERE id = ?1")?
                .execute([id])?;
            tx.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
                .execute([ino as i64])?;
            tx.prepare_cached("DELETE FROM inodes WHERE ino = ?1")?
                .execute([ino as i64])?;
            touch_dir(tx, parent, now, -1)?;
            Ok(())
        })
    }

    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        check_name(new_name)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        if exchange && noreplace {
            return Err(MetaError::Invalid(
                "RENAME_EXCHANGE with RENAME_NOREPLACE".into(),
            ));
        }
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 {
            return Err(MetaError::Invalid("unsupported rename flags".into()));
        }
        self.write(|tx| {
            dir_attr(tx, parent)?;
            dir_attr(tx, new_parent)?;
            let (sid, sino, skind) = find_dentry(tx, parent, name)?.ok_or(MetaError::NotFound)?;
            let dst = find_dentry(tx, new_parent, new_name)?;
            let now = now_nanos();
            if parent == new_parent && name == new_name {
                return if noreplace {
                    Err(MetaError::Exists)
                } else {
                    Ok(())
                };
            }
            if skind == Kind::Dir && is_ancestor(tx, sino, new_parent)? {
                return Err(MetaError::Invalid(
                    "cannot move a directory into itself".into(),
                ));
            }
            if exchange {
                let (did, dino, dkind) = dst.ok_or(MetaError::NotFound)?;
                if dkind == Kind::Dir && is_ancestor(tx, dino, parent)? {
                    return Err(MetaError::Invalid(
                        "cannot move a directory into itself".into(),
                    ));
                }
                tx.prepare_cached("UPDATE dentries SET ino = ?2, kind = ?3 WHERE id = ?1")?
                    .execute(params![sid, dino as i64, dkind as i64])?;
                tx.prepare_cached("UPDATE dentries SET ino = ?2, kind = ?3 WHERE id = ?1")?
                    .execute(params![did, sino as i64, skind as i64])?;
                let mut dp = 0i64;
                let mut dn = 0i64;
                if skind == Kind::Dir {
                    tx.execute(
                        "UPDATE inodes SET parent = ?2 WHERE ino = ?1",
                        params![sino as i64, new_parent as i64],
                    )?;
                    dp -= 1;
                    dn += 1;
                }
                if dkind == Kind::Dir {
                    tx.execute(
                        "UPDATE inodes SET parent = ?2 WHERE ino = ?1",
                        params![dino as i64, parent as i64],
                    )?;
                    dp += 1;
                    dn -= 1;
                }
                for ino in [sino, dino] {
                    tx.execute(
                        "UPDATE inodes SET ctime = ?2 WHERE ino = ?1",
                        params![ino as i64, now],
                    )?;
                }
                if parent == new_parent {
                    touch_dir(tx, parent, now, 0)?;
                } else {
                    touch_dir(tx, parent, now, dp)?;
                    touch_dir(tx, new_parent, now, dn)?;
                }
                return Ok(());
            }
            let mut new_parent_nlink = 0i64;
            if let Some((did, dino, dkind)) = dst {
                if noreplace {
                    return Err(MetaError::Exists);
                }
                if dino == sino {
                    // Two names of one file: POSIX says do nothing.
                    return Ok(());
                }
                if dkind == Kind::Dir {
                    if skind != Kind::Dir {
                        return Err(MetaError::IsDir);
                    }
                    let nonempty: bool = tx
                        .prepare_cached("SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = ?1)")?
                        .query_row([dino as i64], |r| r.get(0))?;
                    if nonempty {
                        return Err(MetaError::NotEmpty);
                    }
                    tx.execute("DELETE FROM dentries WHERE id = ?1", [did])?;
                    tx.execute("DELETE FROM xattrs WHERE ino = ?1", [dino as i64])?;
                    tx.execute("DELETE FROM inodes WHERE ino = ?1", [dino as i64])?;
                    new_parent_nlink -= 1;
                } else {
                    if skind == Kind::Dir {
                        return Err(MetaError::NotDir);
                    }
                    tx.execute("DELETE FROM dentries WHERE id = ?1", [did])?;
                    tx.execute(
                        "UPDATE inodes SET nlink = nlink - 1, ctime = ?2 WHERE ino = ?1",
                        params![dino as i64, now],
                    )?;
                    let nlink: i64 = tx.query_row(
                        "SELECT nlink FROM inodes WHERE ino = ?1",
                        [dino as i64],
                        |r| r.get(0),
                    )?;
                    if nlink <= 0 {
                        retire_inode(tx, dino)?;
                    }
                }
            }
            tx.prepare_cached("UPDATE dentries SET parent = ?2, name = ?3 WHERE id = ?1")?
                .execute(params![sid, new_parent as i64, new_name])?;
            tx.execute(
                "UPDATE inodes SET ctime = ?2 WHERE ino = ?1",
                params![sino as i64, now],
            )?;
            if skind == Kind::Dir && parent != new_parent {
                tx.execute(
                    "UPDATE inodes SET parent = ?2 WHERE ino = ?1",
                    params![sino as i64, new_parent as i64],
                )?;
                touch_dir(tx, parent, now, -1)?;
                new_parent_nlink += 1;
            } else if parent != new_parent {
                touch_dir(tx, parent, now, 0)?;
            }
            touch_dir(tx, new_parent, now, new_parent_nlink)?;
            Ok(())
        })
    }

    fn readdir(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<DirEntry>> {
        self.read(|c| {
            dir_attr(c, ino)?;
            let mut st = c.prepare_cached(
                "SELECT id, name, ino, kind FROM dentries WHERE parent = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
            )?;
            let rows = st.query_map(params![ino as i64, offset as i64, limit as i64], |r| {
                Ok(DirEntry {
                    offset: r.get::<_, i64>(0)? as u64,
                    name: r.get(1)?,
                    ino: r.get::<_, i64>(2)? as u64,
                    kind: Kind::from_i64(r.get(3)?).unwrap_or(Kind::File),
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.read(|c| {
            let (kind, target): (i64, Option<Vec<u8>>) = c
                .prepare_cached("SELECT kind, symlink FROM inodes WHERE ino = ?1")?
                .query_row([ino as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
            if kind != Kind::Symlink as i64 {
                return Err(MetaError::Invalid("not a symlink".into()));
            }
            Ok(target.unwrap_or_default())
        })
    }

    fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        self.read(|c| {
            c.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
                .query_row(params![ino as i64, name], |r| r.get(0))
                .optional()?
                .ok_or_else(|| {
                    if get_attr(c, ino).is_err() {
                        MetaError::NotFound
                    } else {
                        MetaError::NoAttr
                    }
                })
        })
    }

    fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(MetaError::Invalid("bad xattr name".into()));
        }
        self.write(|tx| {
            get_attr(tx, ino)?;
            let exists: bool = tx
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM xattrs WHERE ino = ?1 AND name = ?2)",
                )?
                .query_row(params![ino as i64, name], |r| r.get(0))?;
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(MetaError::Exists);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(MetaError::NoAttr);
            }
            tx.prepare_cached(
                "INSERT OR REPLACE INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![ino as i64, name, value])?;
            tx.prepare_cached("UPDATE inodes SET ctime = ?2 WHERE ino = ?1")?
                .execute(params![ino as i64, now_nanos()])?;
            Ok(())
        })
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.read(|c| {
            get_attr(c, ino)?;
            let mut st =
                c.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
            let rows = st.query_map([ino as i64], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<Vec<u8>>>>()?)
        })
    }

    fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        self.write(|tx| {
            get_attr(tx, ino)?;
            let n = tx
                .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
                .execute(params![ino as i64, name])?;
            if n == 0 {
                return Err(MetaError::NoAttr);
            }
            tx.prepare_cached("UPDATE inodes SET ctime = ?2 WHERE ino = ?1")?
                .execute(params![ino as i64, now_nanos()])?;
            Ok(())
        })
    }

    fn resolve_stripe_default(&self, dir: Ino) -> Result<StripeDefault> {
        let info = self.info()?;
        self.read(|c| {
            let mut out = StripeDefault::default();
            let mut ino = dir;
            for _ in 0..100_000 {
                let (cnt, size, parent): (i64, i64, i64) = c
                    .prepare_cached(
                        "SELECT def_stripe_count, def_stripe_size, parent FROM inodes WHERE ino = ?1",
                    )?
                    .query_row([ino as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                if out.stripe_count == 0 && cnt > 0 {
                    out.stripe_count = cnt as u32;
                }
                if out.stripe_size == 0 && size > 0 {
                    out.stripe_size = size as u64;
                }
                if (out.stripe_count > 0 && out.stripe_size > 0) || ino == ROOT_INO {
                    break;
                }
                ino = parent as u64;
            }
            if out.stripe_count == 0 {
                out.stripe_count = info.default_stripe_count;
            }
            if out.stripe_size == 0 {
                out.stripe_size = info.default_stripe_size;
            }
            Ok(out)
        })
    }

    fn set_dir_stripe(&self, dir: Ino, def: StripeDefault) -> Result<()> {
        self.write(|tx| {
            dir_attr(tx, dir)?;
            tx.execute(
                "UPDATE inodes SET def_stripe_count = ?2, def_stripe_size = ?3, ctime = ?4 WHERE ino = ?1",
                params![dir as i64, def.stripe_count as i64, def.stripe_size as i64, now_nanos()],
            )?;
            Ok(())
        })
    }

    fn set_file_layout(&self, ino: Ino, layout: &Layout) -> Result<()> {
        self.write(|tx| {
            let a = get_attr(tx, ino)?;
            if a.kind != Kind::File {
                return Err(MetaError::Invalid("not a regular file".into()));
            }
            let has_data: bool = tx
                .prepare_cached("SELECT EXISTS (SELECT 1 FROM slices WHERE ino = ?1)")?
                .query_row([ino as i64], |r| r.get(0))?;
            if has_data || a.size > 0 {
                return Err(MetaError::NotEmpty);
            }
            tx.execute(
                "UPDATE inodes SET stripe_size = ?2, stripe_targets = ?3, ctime = ?4 WHERE ino = ?1",
                params![ino as i64, layout.stripe_size as i64, layout.encode_targets(), now_nanos()],
            )?;
            Ok(())
        })
    }

    fn set_projid(&self, ino: Ino, projid: u32, inherit: bool) -> Result<u64> {
        self.write(|tx| {
            let a = get_attr(tx, ino)?;
            let now = now_nanos();
            let inh = if inherit && a.kind == Kind::Dir { 1 } else { 0 };
            tx.execute(
                "UPDATE inodes SET projid = ?2, projinherit = ?3, ctime = ?4 WHERE ino = ?1",
                params![ino as i64, projid as i64, inh, now],
            )?;
            let mut count = 1u64;
            if inherit && a.kind == Kind::Dir {
                // Walk the subtree breadth first.
                let mut queue = vec![ino];
                while let Some(dir) = queue.pop() {
                    let children: Vec<(i64, i64)> = {
                        let mut st =
                            tx.prepare_cached("SELECT ino, kind FROM dentries WHERE parent = ?1")?;
                        let rows = st.query_map([dir as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
                        rows.collect::<rusqlite::Result<Vec<_>>>()?
                    };
                    for (child, kind) in children {
                        let is_dir = kind == Kind::Dir as i64;
                        tx.execute(
                            "UPDATE inodes SET projid = ?2, projinherit = ?3, ctime = ?4 WHERE ino = ?1",
                            params![child, projid as i64, if is_dir { 1 } else { 0 }, now],
                        )?;
                        count += 1;
                        if is_dir {
                            queue.push(child as u64);
                        }
                    }
                }
            }
            Ok(count)
        })
    }

    fn get_projid(&self, ino: Ino) -> Result<(u32, bool)> {
        self.read(|c| {
            c.prepare_cached("SELECT projid, projinherit FROM inodes WHERE ino = ?1")?
                .query_row([ino as i64], |r| {
                    Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? != 0))
                })
                .optional()?
                .ok_or(MetaError::NotFound)
        })
    }

    fn export_rows(&self, sink: &mut dyn FnMut(DumpRow) -> Result<()>) -> Result<()> {
        use rusqlite::types::ValueRef;
        let c = self.writer.lock();
        c.prepare_cached("BEGIN")?.execute([])?;
        let r = (|| {
            for table in DUMP_TABLES {
                let mut st = c.prepare(&format!("SELECT * FROM {table}"))?;
                let cols: Vec<String> = st.column_names().map(|s| s.to_string()).collect();
                let mut rows = st.query([])?;
                while let Some(row) = rows.next()? {
                    let mut vals = Vec::with_capacity(cols.len());
                    for (i, col) in cols.iter().enumerate() {
                        let v = match row.get_ref(i)? {
                            ValueRef::Null => DumpValue::Null,
                            ValueRef::Integer(n) => DumpValue::Int(n),
                            ValueRef::Real(f) => DumpValue::Real(f),
                            ValueRef::Text(t) => DumpValue::Text(String::from_utf8_lossy(t).into()),
                            ValueRef::Blob(b) => DumpValue::Blob(b.to_vec()),
                        };
                        vals.push((col.clone(), v));
                    }
                    sink((table.to_string(), vals))?;
                }
            }
            Ok(())
        })();
        let _ = c.prepare_cached("COMMIT").and_then(|mut s| s.execute([]));
        r
    }

    fn import_rows(&self, rows: &mut dyn Iterator<Item = Result<DumpRow>>) -> Result<u64> {
        use rusqlite::types::Value;
        let c = self.writer.lock();
        self.unsynced.store(true, Ordering::Relaxed);
        c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let r = (|| {
            let files: i64 = c.query_row("SELECT COUNT(*) FROM inodes", [], |r| r.get(0))?;
            if files > 1 {
                return Err(MetaError::Invalid(
                    "the target filesystem is not empty (load needs a freshly formatted one)"
                        .into(),
                ));
            }
            // The dump replaces the format's own settings, root and targets.
            for table in DUMP_TABLES {
                c.execute(&format!("DELETE FROM {table}"), [])?;
            }
            let mut n = 0u64;
            for row in rows {
                let (table, cols) = row?;
                if !DUMP_TABLES.contains(&table.as_str()) {
                    return Err(MetaError::Invalid(format!(
                        "unknown table '{table}' in the dump"
                    )));
                }
                for (col, _) in &cols {
                    if !col
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
                    {
                        return Err(MetaError::Invalid(format!("bad column name '{col}'")));
                    }
                }
                let names: Vec<&str> = cols.iter().map(|(c, _)| c.as_str()).collect();
                let marks: Vec<String> = (1..=cols.len()).map(|i| format!("?{i}")).collect();
                let sql = format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    names.join(", "),
                    marks.join(", ")
                );
                let vals: Vec<Value> = cols
                    .into_iter()
                    .map(|(_, v)| match v {
                        DumpValue::Null => Value::Null,
                        DumpValue::Int(n) => Value::Integer(n),
                        DumpValue::Real(f) => Value::Real(f),
                        DumpValue::Text(t) => Value::Text(t),
                        DumpValue::Blob(b) => Value::Blob(b),
                    })
                    .collect();
                c.prepare_cached(&sql)?
                    .execute(rusqlite::params_from_iter(vals))?;
                n += 1;
            }
            // A dump from before v5 has no allocated bytes; one from v5 has them right: count.
            recount_all(&c)?;
            Ok(n)
        })();
        match r {
            Ok(n) => {
                c.prepare_cached("COMMIT")?.execute([])?;
                Ok(n)
            }
            Err(e) => {
                let _ = c.prepare_cached("ROLLBACK").and_then(|mut s| s.execute([]));
                Err(e)
            }
        }
    }

    fn object_refs(&self) -> Result<Vec<ObjectRef>> {
        self.read(|c| {
            let mut st = c.prepare_cached(
                "SELECT target, obj, ino, obj_off + len, NULL FROM slices WHERE obj IS NOT NULL \
                 UNION ALL SELECT target, obj, ino, len, id FROM trash",
            )?;
            let rows = st.query_map([], |r| {
                Ok(ObjectRef {
                    target: r.get::<_, i64>(0)? as u32,
                    obj: r.get::<_, i64>(1)? as u64,
                    ino: r.get::<_, i64>(2)? as u64,
                    end: r.get::<_, i64>(3)? as u64,
                    trash: r.get::<_, Option<i64>>(4)?.map(|i| i as u64),
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn object_id_counter(&self) -> Result<u64> {
        self.read(|c| {
            let v: i64 = c
                .prepare_cached("SELECT value FROM counters WHERE name = 'next_object'")?
                .query_row([], |r| r.get(0))?;
            Ok(v as u64)
        })
    }

    fn meta_issues(&self, timeout_ns: i64) -> Result<Vec<MetaIssue>> {
        let limit = now_nanos() - timeout_ns;
        self.read(|c| {
            let mut out = Vec::new();
            let mut st = c.prepare_cached(
                "SELECT d.parent, d.name, d.ino FROM dentries d \
                 WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = d.ino) ORDER BY d.id",
            )?;
            for r in st.query_map([], |r| {
                Ok(MetaIssue::DanglingEntry {
                    parent: r.get::<_, i64>(0)? as u64,
                    name: r.get(1)?,
                    ino: r.get::<_, i64>(2)? as u64,
                })
            })? {
                out.push(r?);
            }
            let mut st = c.prepare_cached(&format!(
                "SELECT i.ino FROM inodes i WHERE {UNHELD} ORDER BY i.ino"
            ))?;
            for r in st.query_map([], |r| {
                Ok(MetaIssue::UnheldOrphan {
                    ino: r.get::<_, i64>(0)? as u64,
                })
            })? {
                out.push(r?);
            }
            let mut st = c.prepare_cached(
                "SELECT o.ino, o.session FROM open_files o WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.id = o.session AND s.heartbeat >= ?1) \
                 ORDER BY o.session, o.ino",
            )?;
            for r in st.query_map([limit], |r| {
                Ok(MetaIssue::StaleOpen {
                    ino: r.get::<_, i64>(0)? as u64,
                    session: r.get::<_, i64>(1)? as u64,
                })
            })? {
                out.push(r?);
            }
            let mut st = c.prepare_cached(
                "SELECT DISTINCT l.ino, l.session FROM locks l WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.id = l.session AND s.heartbeat >= ?1) \
                 ORDER BY l.session, l.ino",
            )?;
            for r in st.query_map([limit], |r| {
                Ok(MetaIssue::StaleLock {
                    ino: r.get::<_, i64>(0)? as u64,
                    session: r.get::<_, i64>(1)? as u64,
                })
            })? {
                out.push(r?);
            }
            let mut st = c.prepare_cached(
                "SELECT l.ino, l.client, l.dirty FROM pcc_leases l WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.client_name = l.client AND s.heartbeat >= ?1) \
                 ORDER BY l.ino",
            )?;
            for r in st.query_map([limit], |r| {
                Ok(MetaIssue::StaleLease {
                    ino: r.get::<_, i64>(0)? as u64,
                    client: r.get(1)?,
                    dirty: r.get::<_, i64>(2)? != 0,
                })
            })? {
                out.push(r?);
            }
            Ok(out)
        })
    }

    fn repair_issue(&self, issue: &MetaIssue, timeout_ns: i64) -> Result<bool> {
        let limit = now_nanos() - timeout_ns;
        self.write(|tx| {
            // The session of a stale row: Some(true) alive, Some(false) dead, None gone.
            let session_state = |session: u64| -> Result<Option<bool>> {
                Ok(tx
                    .prepare_cached("SELECT heartbeat >= ?2 FROM sessions WHERE id = ?1")?
                    .query_row(params![session as i64, limit], |r| r.get::<_, bool>(0))
                    .optional()?)
            };
            match issue {
                MetaIssue::DanglingEntry { parent, name, ino } => {
                    let kind: Option<i64> = tx
                        .prepare_cached(
                            "DELETE FROM dentries WHERE parent = ?1 AND name = ?2 AND ino = ?3 \
                             AND NOT EXISTS (SELECT 1 FROM inodes WHERE ino = ?3) RETURNING kind",
                        )?
                        .query_row(params![*parent as i64, name, *ino as i64], |r| r.get(0))
                        .optional()?;
                    match kind {
                        Some(k) => {
                            if k == Kind::Dir as i64 {
                                touch_dir(tx, *parent, now_nanos(), -1)?;
                            }
                            Ok(true)
                        }
                        None => Ok(false),
                    }
                }
                MetaIssue::UnheldOrphan { ino } => {
                    let still: bool = tx
                        .prepare_cached(&format!(
                            "SELECT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = ?1 AND {UNHELD})"
                        ))?
                        .query_row([*ino as i64], |r| r.get(0))?;
                    if still {
                        purge_inode(tx, *ino)?;
                    }
                    Ok(still)
                }
                MetaIssue::StaleOpen { ino, session } => match session_state(*session)? {
                    Some(true) => Ok(false),
                    Some(false) => {
                        end_session(tx, *session)?;
                        Ok(true)
                    }
                    None => {
                        let n = tx
                            .prepare_cached(
                                "DELETE FROM open_files WHERE session = ?1 AND ino = ?2",
                            )?
                            .execute(params![*session as i64, *ino as i64])?;
                        purge_if_orphan(tx, *ino)?;
                        Ok(n > 0)
                    }
                },
                MetaIssue::StaleLock { ino, session } => match session_state(*session)? {
                    Some(true) => Ok(false),
                    Some(false) => {
                        end_session(tx, *session)?;
                        Ok(true)
                    }
                    None => {
                        let n = tx
                            .prepare_cached("DELETE FROM locks WHERE session = ?1 AND ino = ?2")?
                            .execute(params![*session as i64, *ino as i64])?;
                        Ok(n > 0)
                    }
                },
                MetaIssue::StaleLease { ino, client, .. } => {
                    let n = tx
                        .prepare_cached(
                            "DELETE FROM pcc_leases WHERE ino = ?1 AND client = ?2 AND dirty = 0 \
                             AND NOT EXISTS (SELECT 1 FROM sessions s \
                                 WHERE s.client_name = ?2 AND s.heartbeat >= ?3)",
                        )?
                        .execute(params![*ino as i64, client, limit])?;
                    if n > 0 {
                        tx.prepare_cached("DELETE FROM pcc_revokes WHERE ino = ?1")?
                            .execute([*ino as i64])?;
                    }
                    Ok(n > 0)
                }
            }
        })
    }

    fn path_of(&self, ino: Ino) -> Result<Option<Vec<u8>>> {
        self.read(|c| {
            let mut parts: Vec<Vec<u8>> = Vec::new();
            let mut cur = ino;
            while cur != ROOT_INO {
                let row: Option<(i64, Vec<u8>)> = c
                    .prepare_cached(
                        "SELECT parent, name FROM dentries WHERE ino = ?1 ORDER BY id LIMIT 1",
                    )?
                    .query_row([cur as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                let Some((parent, name)) = row else {
                    return Ok(None);
                };
                parts.push(name);
                cur = parent as u64;
                if parts.len() > 4096 {
                    return Err(MetaError::Invalid(format!("inode {ino}: its path loops")));
                }
            }
            let mut path = Vec::new();
            for p in parts.iter().rev() {
                path.push(b'/');
                path.extend_from_slice(p);
            }
            if path.is_empty() {
                path.push(b'/');
            }
            Ok(Some(path))
        })
    }

    fn purge_orphans(&self, replaced_before: Nanos) -> Result<u64> {
        let due: Vec<i64> = self.read(|c| {
            let mut st = c.prepare_cached(
                "SELECT ino FROM inodes WHERE orphan = 2 AND ctime < ?1 LIMIT 1000",
            )?;
            let rows = st.query_map([replaced_before], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<i64>>>()?)
        })?;
        if due.is_empty() {
            return Ok(0);
        }
        self.write(|tx| {
            let mut n = 0;
            for ino in &due {
                // Still a replaced file, and not open (the purge after its last close waits for
                // a later pass).
                let still: bool = tx
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = ?1 AND orphan = 2) \
                         AND NOT EXISTS (SELECT 1 FROM open_files WHERE ino = ?1)",
                    )?
                    .query_row([ino], |r| r.get(0))?;
                if still {
                    purge_inode(tx, *ino as Ino)?;
                    n += 1;
                }
            }
            Ok(n)
        })
    }
}

fn record_open(c: &Connection, session: u64, ino: Ino) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO open_files (session, ino, count) VALUES (?1, ?2, 1) \
         ON CONFLICT (ino, session) DO UPDATE SET count = count + 1",
    )?
    .execute(params![session as i64, ino as i64])?;
    Ok(())
}

fn purge_if_orphan(c: &Connection, ino: Ino) -> Result<()> {
    let orphan: Option<i64> = c
        .prepare_cached("SELECT orphan FROM inodes WHERE ino = ?1")?
        .query_row([ino as i64], |r| r.get(0))
        .optional()?;
    if orphan == Some(1) && !is_open(c, ino)? {
        purge_inode(c, ino)?;
    }
    Ok(())
}

/// The condition (on `inodes i`) of a file without names that nobody holds: unlinked while
/// open (`orphan = 1`) or with no link, no directory entry, and no open anywhere. Files a
/// rename replaced (`orphan = 2`) wait for their grace and [`MetaEngine::purge_orphans`].
const UNHELD: &str =
    "i.kind != 2 AND i.ino != 1 AND i.orphan != 2 AND (i.orphan = 1 OR i.nlink = 0) \
     AND NOT EXISTS (SELECT 1 FROM open_files o WHERE o.ino = i.ino) \
     AND NOT EXISTS (SELECT 1 FROM dentries d WHERE d.ino = i.ino)";

fn end_session(c: &Connection, session: u64) -> Result<()> {
    let inos: Vec<i64> = {
        let mut st = c.prepare_cached("SELECT ino FROM open_files WHERE session = ?1")?;
        let rows = st.query_map([session as i64], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    c.execute(
        "DELETE FROM open_files WHERE session = ?1",
        [session as i64],
    )?;
    for ino in inos {
        purge_if_orphan(c, ino as u64)?;
    }
    c.execute("DELETE FROM locks WHERE session = ?1", [session as i64])?;
    c.execute("DELETE FROM sessions WHERE id = ?1", [session as i64])?;
    Ok(())
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
            for t in schema::tables_added_after(5) {
                c.execute_batch(&format!("DROP TABLE {t}")).unwrap();
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
            for t in schema::tables_added_after(5) {
                c.execute_batch(&format!("DROP TABLE {t}")).unwrap();
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
        assert_eq!(b.pcc_rules().unwrap().len(), 1);
        assert_eq!(b.info().unwrap().uuid, a.info().unwrap().uuid);
        // a second load into a filesystem that holds files is refused
        assert!(matches!(
            b.import_rows(&mut rows.into_iter().map(Ok)),
            Err(MetaError::Invalid(_))
        ));
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
