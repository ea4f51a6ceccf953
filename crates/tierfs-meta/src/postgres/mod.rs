//! The cluster metadata engine: PostgreSQL (`postgres://user[:password]@host[:port]/db`).
//!
//! Same tables, schema versions and semantics as [`crate::sqlite`]; many clients on many
//! machines share one database.
//!
//! **Transactions.** Every write method is one `REPEATABLE READ` transaction. Rows are locked
//! in one global order so that concurrent operations cannot deadlock:
//!
//! 1. the `rename_lock` row of `counters`, only by renames that move a directory to another
//!    parent (the equivalent of Linux's `s_vfs_rename_mutex`: the "is the target inside the
//!    source?" walk up the tree then cannot race another such rename);
//! 2. inode rows, in ascending inode number, all in one statement ([`lock_inodes`]);
//! 3. `targets` rows in ascending id (space accounting), then other counters.
//!
//! An inode row guards everything that belongs to it: its dentries when it is a directory, its
//! slices, open files, locks, xattrs and lease. Every transaction that reads such state to
//! decide a write first *updates* the inode row (`SET ino = ino`, a real new row version: under
//! REPEATABLE READ a mere `FOR UPDATE` of a row that another transaction only locked is not a
//! conflict). Two transactions on the same inode are therefore serialised: the second waits,
//! then fails with a serialization failure and is retried with a fresh snapshot. Names looked
//! up before the locks are taken stay valid because any change to a directory's entries also
//! updates the directory's row. Serialization failures (SQLSTATE 40001) and deadlocks (40P01)
//! are retried with bounded exponential backoff and jitter; after [`MAX_RETRIES`] tries or
//! [`RETRY_BUDGET`], whichever comes first, the caller gets `Busy` (EAGAIN).
//!
//! `slices.seq` is a BIGSERIAL. Sequence values are handed out at insert time, not commit
//! time, but `commit_slices` inserts while holding its inode row, so the slices of one file get
//! their numbers in commit order: the newest commit wins.
//!
//! Reads that are one statement (lookup, getattr, read_chunk, ...) run outside a transaction,
//! as the SQLite engine's reads do: one statement always sees one consistent snapshot.
//!
//! **Connections.** A pool ([`pool`]) of at most [`POOL_MAX`] connections, each keeping its
//! prepared statements. A connection that fails is dropped, never reused; the next call
//! connects anew, so the engine recovers by itself when the database comes back. While it is
//! away calls fail with [`MetaError::Unavailable`] (EIO) after the connect timeout. A pooled
//! connection found dead when its transaction begins (the database restarted since its last
//! use) is replaced at once, without an error, since nothing was sent on it.
//!
//! **Durability.** A commit returns once PostgreSQL has flushed its WAL (with the server's
//! default `synchronous_commit = on`), so [`MetaEngine::sync`] has nothing left to do, and
//! housekeeping is autovacuum's.
//!
//! **Notifications.** `pcc_request_revoke` sends `NOTIFY tierfs_pcc_revoke` (payload:
//! `"<ino> <holder client>"`) in its transaction, delivered at commit.
//! [`MetaEngine::listen`] opens a connection of its own outside the pool, `LISTEN`s on the
//! channels asked for, and returns a [`PgListener`] that waits for them and keeps those
//! addressed to its client, so a lease holder learns of a revoke request at once instead of
//! polling. PostgreSQL does not queue notifications for a session that is not listening: a
//! subscriber calls [`MetaEngine::pcc_revokes_for`] once after subscribing and now and then,
//! and when [`Listener::wait`] fails (connection lost) falls back to polling and listens again
//! later.

mod dump;
pub mod pgpass;
pub(crate) mod pool;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Row;

use crate::core::schema;
pub use crate::core::schema::SCHEMA_VERSION;
use crate::core::SqlMeta;
use crate::engine::{Channel, LegacyEngine, Listener, Notice};
use crate::error::{MetaError, Result};
use crate::sql::postgres::PgTx;
use crate::sql::{Dialect, DialectKind, Driver, Tx};
use crate::types::*;
pub(crate) use pool::PgConn;
use pool::{Pool, P};

/// Attempts of one transaction before giving up with `Busy`.
pub const MAX_RETRIES: u32 = 40;
/// How long one write may keep retrying conflicts before the caller gets `Busy` (a row that
/// others update all the time, such as a file opened in a tight loop by another client, can
/// make one transaction lose many times in a row).
pub const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// Connections one engine keeps open at most.
pub const POOL_MAX: usize = 16;
const MAX_LINKS: i64 = 65000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The channel revoke requests are announced on.
pub const REVOKE_CHANNEL: &str = "tierfs_pcc_revoke";

/// Maps a driver error: serialization failures and deadlocks become `Busy` (retried by the
/// caller), a lost or refused connection `Unavailable`.
pub(crate) fn pg_err(e: postgres::Error) -> MetaError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            return MetaError::Busy(0);
        }
        if *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS
        {
            return MetaError::Unavailable(db.message().to_string());
        }
        if *code == SqlState::INVALID_CATALOG_NAME {
            return MetaError::Db(format!(
                "{} (create it first, e.g. with createdb)",
                db.message()
            ));
        }
        return MetaError::Db(db.message().to_string());
    }
    let io = std::error::Error::source(&e)
        .map(|s| s.is::<std::io::Error>())
        .unwrap_or(false);
    let text = e.to_string();
    if e.is_closed()
        || io
        || text.starts_with("error connecting")
        || text.starts_with("error communicating")
        || text.starts_with("timeout")
    {
        return MetaError::Unavailable(text);
    }
    MetaError::Db(text)
}

/// A parsed, validated PostgreSQL URL; prints without its password.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl(String);

impl PgUrl {
    pub fn parse(s: &str) -> Result<PgUrl> {
        if !(s.starts_with("postgres://") || s.starts_with("postgresql://")) {
            return Err(MetaError::BadUrl(redact(s)));
        }
        let cfg: postgres::Config = s
            .parse()
            .map_err(|e| MetaError::BadUrl(format!("{}: {e}", redact(s))))?;
        if cfg.get_hosts().is_empty() {
            return Err(MetaError::BadUrl(format!("{}: no host", redact(s))));
        }
        if cfg.get_dbname().is_none() {
            return Err(MetaError::BadUrl(format!(
                "{}: no database name (postgres://user@host/db)",
                redact(s)
            )));
        }
        Ok(PgUrl(s.to_string()))
    }

    /// The full URL, with its password: for connecting only, never for printing.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Connection settings: the URL's, with defaults for what it leaves out (a connect
    /// timeout, TCP keepalives and a user timeout so a vanished server is noticed, the password
    /// from `PGPASSWORD`, else from the password file, `PGPASSFILE` or `~/.pgpass`).
    pub fn config(&self) -> Result<postgres::Config> {
        let mut cfg: postgres::Config = self
            .0
            .parse()
            .map_err(|e| MetaError::BadUrl(format!("{self}: {e}")))?;
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(CONNECT_TIMEOUT);
        }
        if cfg.get_tcp_user_timeout().is_none() {
            cfg.tcp_user_timeout(Duration::from_secs(30));
        }
        cfg.keepalives(true);
        cfg.keepalives_idle(Duration::from_secs(10));
        if cfg.get_application_name().is_none() {
            cfg.application_name("tierfs");
        }
        if cfg.get_password().is_none() {
            if let Ok(p) = std::env::var("PGPASSWORD") {
                cfg.password(p);
            } else if let Some(file) = pgpass::default_path() {
                let host = match cfg.get_hosts().first() {
                    Some(postgres::config::Host::Tcp(h)) => h.clone(),
                    _ => "localhost".to_string(),
                };
                let port = cfg.get_ports().first().copied().unwrap_or(5432);
                let db = cfg.get_dbname().unwrap_or_default().to_string();
                let user = cfg.get_user().unwrap_or_default().to_string();
                if let Some(p) = pgpass::lookup(&file, &host, port, &db, &user) {
                    cfg.password(p);
                }
            }
        }
        Ok(cfg)
    }
}

impl std::fmt::Display for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgUrl({self})")
    }
}

/// `s` without its password (the user name, host and database stay), for places other users
/// can read, such as a mount's info file; tools then take the password from `PGPASSWORD`.
pub fn without_password(s: &str) -> String {
    match url::Url::parse(s) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => s.to_string(),
    }
}

/// `s` with any password replaced by `***`.
pub fn redact(s: &str) -> String {
    if let Ok(mut u) = url::Url::parse(s) {
        if u.password().is_some() {
            let _ = u.set_password(Some("***"));
        }
        for (k, _) in u.query_pairs() {
            if k == "password" {
                // Rare; drop the whole query rather than rebuild it.
                u.set_query(Some("password=***"));
                break;
            }
        }
        return u.to_string();
    }
    match (s.find("://"), s.rfind('@')) {
        (Some(a), Some(b)) if b > a => format!("{}://***@{}", &s[..a], &s[b + 1..]),
        _ => s.to_string(),
    }
}

pub struct PgEngine {
    url: PgUrl,
    pool: Pool,
    dialect: Dialect,
}

const ATTR_COLS: &str =
    "ino, kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime, crtime, \
     projid, data_version, stripe_size, stripe_targets, def_stripe_count, def_stripe_size, parent, \
     allocated";

fn attr_from_row(r: &Row) -> Attr {
    let kind = Kind::from_i64(r.get(1)).unwrap_or(Kind::File);
    let stripe_size: i64 = r.get(14);
    let targets: String = r.get(15);
    let layout = if kind == Kind::File && stripe_size > 0 {
        Some(Layout {
            stripe_size: stripe_size as u64,
            targets: Layout::decode_targets(&targets),
        })
    } else {
        None
    };
    Attr {
        ino: r.get::<_, i64>(0) as u64,
        kind,
        perm: r.get::<_, i64>(2) as u32,
        uid: r.get::<_, i64>(3) as u32,
        gid: r.get::<_, i64>(4) as u32,
        nlink: r.get::<_, i64>(5) as u32,
        size: r.get::<_, i64>(6) as u64,
        rdev: r.get::<_, i64>(7) as u32,
        atime: r.get(8),
        mtime: r.get(9),
        ctime: r.get(10),
        crtime: r.get(11),
        projid: r.get::<_, i64>(12) as u32,
        data_version: r.get::<_, i64>(13) as u64,
        layout,
        dir_default: StripeDefault {
            stripe_count: r.get::<_, i64>(16) as u32,
            stripe_size: r.get::<_, i64>(17) as u64,
        },
        parent: r.get::<_, i64>(18) as u64,
        allocated: r.get::<_, i64>(19).max(0) as u64,
    }
}

/// Bytes of one chunk of `ino` that hold data (see [`crate::types::allocated_bytes`]).
fn chunk_allocated(c: &mut PgConn, ino: Ino, chunk: u64) -> Result<u64> {
    let rows = c.query(
        "SELECT off, len, obj IS NULL AND inline IS NULL FROM slices \
         WHERE ino = $1 AND chunk = $2 ORDER BY seq",
        &[&(ino as i64), &(chunk as i64)],
    )?;
    let v: Vec<(u64, u64, bool)> = rows
        .iter()
        .map(|r| {
            (
                r.get::<_, i64>(0) as u64,
                r.get::<_, i64>(1) as u64,
                r.get(2),
            )
        })
        .collect();
    Ok(crate::types::allocated_bytes(&v))
}

/// Sum of [`chunk_allocated`] over `chunks` (each counted once).
fn chunks_allocated(c: &mut PgConn, ino: Ino, chunks: &[u64]) -> Result<u64> {
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
fn add_allocated(c: &mut PgConn, ino: Ino, before: u64, after: u64) -> Result<()> {
    if before != after {
        c.exec(
            "UPDATE inodes SET allocated = GREATEST(0, allocated + $2) WHERE ino = $1",
            &[&(ino as i64), &(after as i64 - before as i64)],
        )?;
    }
    Ok(())
}

/// Counts a file's allocated bytes from all its slices.
fn recount_file(c: &mut PgConn, ino: Ino) -> Result<()> {
    let chunks: Vec<u64> = c
        .query(
            "SELECT DISTINCT chunk FROM slices WHERE ino = $1",
            &[&(ino as i64)],
        )?
        .iter()
        .map(|r| r.get::<_, i64>(0) as u64)
        .collect();
    let n = chunks_allocated(c, ino, &chunks)?;
    c.exec(
        "UPDATE inodes SET allocated = $2 WHERE ino = $1",
        &[&(ino as i64), &(n as i64)],
    )?;
    Ok(())
}

/// Counts every file's allocated bytes (migration to v5, load of a dump).
pub(super) fn recount_all(c: &mut PgConn) -> Result<()> {
    let inos: Vec<Ino> = c
        .query("SELECT DISTINCT ino FROM slices", &[])?
        .iter()
        .map(|r| r.get::<_, i64>(0) as u64)
        .collect();
    c.exec("UPDATE inodes SET allocated = 0", &[])?;
    for ino in inos {
        recount_file(c, ino)?;
    }
    Ok(())
}

fn get_attr(c: &mut PgConn, ino: Ino) -> Result<Attr> {
    let sql = format!("SELECT {ATTR_COLS} FROM inodes WHERE ino = $1");
    Ok(attr_from_row(&c.one(&sql, &[&(ino as i64)])?))
}

/// Locks inode rows in ascending order (updating them, see the module doc) and returns their
/// attributes; inodes that do not exist are left out.
fn lock_inodes(c: &mut PgConn, inos: &[Ino]) -> Result<BTreeMap<Ino, Attr>> {
    let mut ids: Vec<i64> = inos.iter().map(|i| *i as i64).collect();
    ids.sort_unstable();
    ids.dedup();
    let cols = ATTR_COLS
        .split(", ")
        .map(|x| format!("i.{x}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "WITH l AS (SELECT ino FROM inodes WHERE ino = ANY($1) ORDER BY ino FOR UPDATE) \
         UPDATE inodes i SET ino = i.ino FROM l WHERE i.ino = l.ino RETURNING {cols}"
    );
    let rows = c.query(&sql, &[&ids])?;
    Ok(rows.iter().map(attr_from_row).map(|a| (a.ino, a)).collect())
}

/// Locks one inode; `NotFound` when it does not exist.
fn lock1(c: &mut PgConn, ino: Ino) -> Result<Attr> {
    lock_inodes(c, &[ino])?
        .remove(&ino)
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

fn is_dir(a: &Attr) -> Result<()> {
    if a.kind != Kind::Dir {
        return Err(MetaError::NotDir);
    }
    Ok(())
}

fn dir_attr(c: &mut PgConn, ino: Ino) -> Result<Attr> {
    let a = get_attr(c, ino)?;
    is_dir(&a)?;
    Ok(a)
}

/// (dentry id, ino, kind) of a name.
fn find_dentry(c: &mut PgConn, parent: Ino, name: &[u8]) -> Result<Option<(i64, Ino, Kind)>> {
    Ok(c.opt(
        "SELECT id, ino, kind FROM dentries WHERE parent = $1 AND name = $2",
        &[&(parent as i64), &name],
    )?
    .map(|r| {
        (
            r.get::<_, i64>(0),
            r.get::<_, i64>(1) as u64,
            Kind::from_i64(r.get(2)).unwrap_or(Kind::File),
        )
    }))
}

fn touch_dir(c: &mut PgConn, dir: Ino, now: Nanos, nlink_delta: i64) -> Result<()> {
    c.exec(
        "UPDATE inodes SET mtime = $2, ctime = $2, nlink = nlink + $3 WHERE ino = $1",
        &[&(dir as i64), &now, &nlink_delta],
    )?;
    Ok(())
}

/// Inserts slices in order (their `seq` follows that order), in one statement.
fn insert_slices(c: &mut PgConn, ino: Ino, slices: &[Slice]) -> Result<()> {
    if slices.is_empty() {
        return Ok(());
    }
    let n = slices.len();
    let (mut chunk, mut off, mut len) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut target, mut obj, mut obj_off, mut obj_size, mut inline) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for s in slices {
        chunk.push(s.chunk as i64);
        off.push(s.off as i64);
        len.push(s.len as i64);
        match &s.data {
            SliceData::Object {
                target: t,
                obj: o,
                obj_off: oo,
                obj_size: os,
            } => {
                target.push(Some(*t as i64));
                obj.push(Some(*o as i64));
                obj_off.push(*oo as i64);
                obj_size.push(*os as i64);
                inline.push(None);
            }
            SliceData::Inline(b) => {
                target.push(None);
                obj.push(None);
                obj_off.push(0);
                obj_size.push(0);
                inline.push(Some(b.as_slice()));
            }
            SliceData::Zero => {
                target.push(None);
                obj.push(None);
                obj_off.push(0);
                obj_size.push(0);
                inline.push(None);
            }
        }
    }
    c.exec(
        "INSERT INTO slices (ino, chunk, off, len, target, obj, inline, obj_off, obj_size) \
         SELECT $1, u.chunk, u.off, u.len, u.target, u.obj, u.inline, u.obj_off, u.obj_size \
         FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[], $6::BIGINT[], \
                     $7::BYTEA[], $8::BIGINT[], $9::BIGINT[]) WITH ORDINALITY \
              AS u(chunk, off, len, target, obj, inline, obj_off, obj_size, n) \
         ORDER BY u.n",
        &[
            &(ino as i64),
            &chunk,
            &off,
            &len,
            &target,
            &obj,
            &inline,
            &obj_off,
            &obj_size,
        ],
    )?;
    Ok(())
}

/// Deletes the selected slices (`where_sql` uses $2.. for `args`); objects no remaining
/// slice references go to the trash.
fn trash_slices(c: &mut PgConn, ino: Ino, where_sql: &str, args: &[i64]) -> Result<()> {
    let ino_i = ino as i64;
    let mut params: Vec<P<'_>> = vec![&ino_i];
    for a in args {
        params.push(a);
    }
    let rows = c.query(
        &format!(
            "DELETE FROM slices WHERE ino = $1 AND {where_sql} RETURNING target, obj, obj_size"
        ),
        &params,
    )?;
    let mut gone: Vec<(i64, i64, i64)> = rows
        .iter()
        .filter_map(|r| {
            match (
                r.get::<_, Option<i64>>(0),
                r.get::<_, Option<i64>>(1),
                r.get::<_, i64>(2),
            ) {
                (Some(t), Some(o), s) => Some((t, o, s)),
                _ => None,
            }
        })
        .collect();
    gone.sort_unstable();
    gone.dedup();
    for (target, obj, size) in gone {
        c.exec(
            "INSERT INTO trash (ino, target, obj, len) SELECT $1, $2, $3, $4 \
             WHERE NOT EXISTS (SELECT 1 FROM slices WHERE obj = $3)",
            &[&ino_i, &target, &obj, &size],
        )?;
    }
    Ok(())
}

/// Deletes an inode whose last name is gone, or marks it orphan while a client has it open.
fn drop_inode(c: &mut PgConn, ino: Ino) -> Result<()> {
    // Marks it orphan if some client has it open; no row back means nobody has.
    let open = c
        .opt(
            "UPDATE inodes SET orphan = 1 WHERE ino = $1 \
             AND EXISTS (SELECT 1 FROM open_files WHERE ino = $1) RETURNING ino",
            &[&(ino as i64)],
        )?
        .is_some();
    if open {
        return Ok(());
    }
    purge_inode(c, ino)
}

/// Retires a file whose last name a rename replaced: kept openable for
/// [`crate::engine::ORPHAN_GRACE`] (`orphan = 2`) whether or not a client has it open now (see
/// the SQLite twin), purged by `purge_orphans` once the grace is over and nobody has it open.
fn retire_inode(c: &mut PgConn, ino: Ino) -> Result<()> {
    let ino_i = ino as i64;
    c.exec("UPDATE inodes SET orphan = 2 WHERE ino = $1", &[&ino_i])?;
    // Leases and recall requests go now, as on unlink.
    c.exec("DELETE FROM pcc_leases WHERE ino = $1", &[&ino_i])?;
    c.exec("DELETE FROM pcc_revokes WHERE ino = $1", &[&ino_i])?;
    Ok(())
}

fn purge_inode(c: &mut PgConn, ino: Ino) -> Result<()> {
    trash_slices(c, ino, "TRUE", &[])?;
    // One round trip: data-modifying CTEs all run.
    c.exec(
        "WITH x AS (DELETE FROM xattrs WHERE ino = $1), \
              l AS (DELETE FROM locks WHERE ino = $1), \
              p AS (DELETE FROM pcc_leases WHERE ino = $1), \
              r AS (DELETE FROM pcc_revokes WHERE ino = $1) \
         DELETE FROM inodes WHERE ino = $1",
        &[&(ino as i64)],
    )?;
    Ok(())
}

/// Zeroes `[off, off+len)` of a file by adding zero slices, chunk by chunk.
fn zero_range(c: &mut PgConn, ino: Ino, stripe_size: u64, off: u64, len: u64) -> Result<()> {
    let mut pos = off;
    let end = off + len;
    let mut v = Vec::new();
    while pos < end {
        let chunk = pos / stripe_size;
        let coff = pos % stripe_size;
        let n = (stripe_size - coff).min(end - pos);
        v.push(Slice {
            seq: 0,
            chunk,
            off: coff,
            len: n,
            data: SliceData::Zero,
        });
        pos += n;
    }
    let chunks: Vec<u64> = v.iter().map(|s| s.chunk).collect();
    let before = chunks_allocated(c, ino, &chunks)?;
    insert_slices(c, ino, &v)?;
    let after = chunks_allocated(c, ino, &chunks)?;
    add_allocated(c, ino, before, after)
}

/// Changes a file's size: shrinking frees whole chunks beyond the end and zeroes the tail of the
/// last one, so that growing again later reads zeros.
fn truncate(c: &mut PgConn, a: &Attr, new_size: u64) -> Result<()> {
    if new_size < a.size {
        if let Some(l) = &a.layout {
            let cs = l.stripe_size;
            let first_gone = new_size.div_ceil(cs);
            let gone: Vec<u64> = c
                .query(
                    "SELECT DISTINCT chunk FROM slices WHERE ino = $1 AND chunk >= $2",
                    &[&(a.ino as i64), &(first_gone as i64)],
                )?
                .iter()
                .map(|r| r.get::<_, i64>(0) as u64)
                .collect();
            let freed = chunks_allocated(c, a.ino, &gone)?;
            trash_slices(c, a.ino, "chunk >= $2", &[first_gone as i64])?;
            add_allocated(c, a.ino, freed, 0)?;
            if !new_size.is_multiple_of(cs) {
                let chunk = new_size / cs;
                let off = new_size % cs;
                let beyond = c.exists(
                    "SELECT EXISTS (SELECT 1 FROM slices WHERE ino = $1 AND chunk = $2 \
                     AND off + len > $3)",
                    &[&(a.ino as i64), &(chunk as i64), &(off as i64)],
                )?;
                if beyond {
                    zero_range(c, a.ino, cs, new_size, cs - off)?;
                }
            }
        }
    }
    Ok(())
}

fn is_ancestor(c: &mut PgConn, maybe_ancestor: Ino, mut ino: Ino) -> Result<bool> {
    let mut hops = 0;
    while ino != ROOT_INO && hops < 100_000 {
        if ino == maybe_ancestor {
            return Ok(true);
        }
        ino = c.i64("SELECT parent FROM inodes WHERE ino = $1", &[&(ino as i64)])? as u64;
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

fn purge_if_orphan(c: &mut PgConn, ino: Ino) -> Result<()> {
    let orphan = c
        .opt(
            "SELECT orphan, EXISTS (SELECT 1 FROM open_files WHERE ino = $1) \
             FROM inodes WHERE ino = $1",
            &[&(ino as i64)],
        )?
        .map(|r| (r.get::<_, i64>(0), r.get::<_, bool>(1)));
    if let Some((1, false)) = orphan {
        purge_inode(c, ino)?;
    }
    Ok(())
}

/// The condition (on `inodes i`) of a file without names that nobody holds (see the SQLite
/// twin).
const UNHELD: &str =
    "i.kind != 2 AND i.ino != 1 AND i.orphan != 2 AND (i.orphan = 1 OR i.nlink = 0) \
     AND NOT EXISTS (SELECT 1 FROM open_files o WHERE o.ino = i.ino) \
     AND NOT EXISTS (SELECT 1 FROM dentries d WHERE d.ino = i.ino)";

/// Removes sessions with their open files (purging orphans they were the last to hold) and
/// locks.
fn end_sessions(c: &mut PgConn, sessions: &[i64]) -> Result<()> {
    if sessions.is_empty() {
        return Ok(());
    }
    let sessions = sessions.to_vec();
    let inos: Vec<Ino> = c
        .query(
            "SELECT DISTINCT ino FROM open_files WHERE session = ANY($1)",
            &[&sessions],
        )?
        .iter()
        .map(|r| r.get::<_, i64>(0) as u64)
        .collect();
    lock_inodes(c, &inos)?;
    c.exec(
        "DELETE FROM open_files WHERE session = ANY($1)",
        &[&sessions],
    )?;
    let mut sorted = inos;
    sorted.sort_unstable();
    for ino in sorted {
        purge_if_orphan(c, ino)?;
    }
    c.exec("DELETE FROM locks WHERE session = ANY($1)", &[&sessions])?;
    c.exec("DELETE FROM sessions WHERE id = ANY($1)", &[&sessions])?;
    Ok(())
}

/// Backoff before retry `attempt` (1-based): 2 ms doubling to 256 ms, with jitter.
fn backoff(attempt: u32) -> Duration {
    let base = 2u64 << attempt.min(7);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let jitter = nanos % (base * 1000).max(1);
    Duration::from_micros(base * 500 + jitter / 2)
}

/// Why a transaction attempt failed, and whether it is worth another go.
enum TxFail {
    /// The reused connection was dead before anything ran: connect again, no error.
    Stale(MetaError),
    Error(MetaError),
}

impl PgEngine {
    fn new(url: &str) -> Result<PgEngine> {
        let url = PgUrl::parse(url)?;
        let cfg = url.config()?;
        Ok(PgEngine {
            pool: Pool::new(cfg, POOL_MAX, Duration::from_secs(30)),
            url,
            dialect: Dialect::new(DialectKind::Postgres),
        })
    }

    /// The URL, without its password.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// Opens a formatted filesystem, migrating its schema if it is older than this build.
    pub fn open(url: &str) -> Result<PgEngine> {
        let e = Self::new(url)?;
        let version = e.schema_version()?;
        match version {
            None | Some(0) => {
                return Err(MetaError::NotFormatted(format!(
                    "{} holds no tierfs schema",
                    e.url
                )))
            }
            Some(v) if v > SCHEMA_VERSION => {
                return Err(MetaError::SchemaTooNew {
                    found: v,
                    supported: SCHEMA_VERSION,
                })
            }
            Some(v) if v < SCHEMA_VERSION => schema::migrate(&e)?,
            Some(_) => {}
        }
        Ok(e)
    }

    /// The schema version, or None when the database holds no tierfs tables.
    fn schema_version(&self) -> Result<Option<i64>> {
        Driver::read(self, |tx| {
            if !tx.exists("SELECT to_regclass('schema_version') IS NOT NULL", &[])? {
                return Ok(None);
            }
            tx.query_opt("SELECT version FROM schema_version", &[])?
                .map(|r| r.i64(0))
                .transpose()
        })
    }

    /// Runs `f` in one READ COMMITTED transaction under the migration advisory lock, taken
    /// before anything is read (so it sees what another migrator committed meanwhile).
    fn exclusive_tx<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        let (mut c, _) = self.pool.get()?;
        c.batch(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({})",
            schema::PG_MIGRATION_LOCK
        ))?;
        match f(&mut PgTx::new(&mut c, &self.dialect)) {
            Ok(v) => {
                c.batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = c.batch("ROLLBACK");
                c.discard();
                Err(e)
            }
        }
    }

    /// Creates a new filesystem in the (existing) database: schema, settings, targets and the
    /// root directory. A database that already holds one is refused unless `force`, which
    /// drops its tables first.
    pub fn format(url: &str, p: &FormatParams) -> Result<PgEngine> {
        if p.targets.is_empty() {
            return Err(MetaError::Invalid(
                "at least one storage target is needed".into(),
            ));
        }
        let e = Self::new(url)?;
        if let Some(v) = e.schema_version()? {
            if v > 0 && !p.force {
                let name = e.info().map(|i| i.name).unwrap_or_default();
                return Err(MetaError::AlreadyFormatted(name));
            }
            let (mut c, _) = e.pool.get()?;
            let mut tables = schema::tables();
            tables.push("schema_version");
            let drop = format!("DROP TABLE IF EXISTS {} CASCADE", tables.join(", "));
            c.batch(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({}); {drop}; COMMIT",
                schema::PG_MIGRATION_LOCK
            ))?;
        }
        e.pool.clear();
        schema::migrate(&e)?;
        let now = now_nanos();
        let uuid = uuid::Uuid::new_v4().to_string();
        e.write(|c| {
            let kv = [
                ("name", p.name.clone()),
                ("uuid", uuid.clone()),
                ("stripe_count", p.stripe_count.to_string()),
                ("stripe_size", p.stripe_size.to_string()),
                ("inline_threshold", p.inline_threshold.to_string()),
                ("created", now.to_string()),
            ];
            for (k, v) in kv {
                c.exec(
                    "INSERT INTO meta_info (key, value) VALUES ($1, $2)",
                    &[&k, &v],
                )?;
            }
            c.exec(
                "INSERT INTO counters (name, value) VALUES ('next_object', 1)",
                &[],
            )?;
            for (i, (url, cap)) in p.targets.iter().enumerate() {
                c.exec(
                    "INSERT INTO targets (id, url, capacity) VALUES ($1, $2, $3)",
                    &[&(i as i64), url, &(*cap as i64)],
                )?;
            }
            c.exec(
                "INSERT INTO inodes (ino, kind, perm, uid, gid, nlink, atime, mtime, ctime, crtime, parent) \
                 VALUES (1, $1, $2, 0, 0, 2, $3, $3, $3, $3, 1)",
                &[&(Kind::Dir as i64), &0o755i64, &now],
            )?;
            // The root took ino 1 by hand: new inodes start at 2.
            c.exec(
                "SELECT setval(pg_get_serial_sequence('inodes', 'ino'), 1)",
                &[],
            )?;
            Ok(())
        })?;
        Ok(e)
    }

    /// Runs `f` in one REPEATABLE READ transaction, retrying serialization failures and
    /// deadlocks with backoff. The closure may run several times.
    fn write<T>(&self, mut f: impl FnMut(&mut PgConn) -> Result<T>) -> Result<T> {
        self.write_commit(|c| f(c).map(Ok))?
    }

    /// Like `write`, but an inner `Err` is committed (work done before a reported failure,
    /// such as trashing the objects of a file that went away, is kept).
    fn write_commit<T>(
        &self,
        mut f: impl FnMut(&mut PgConn) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        let mut attempt = 0u32;
        let mut stale = 0u32;
        let started = Instant::now();
        loop {
            let (mut c, reused) = self.pool.get()?;
            let r = (|| {
                if let Err(e) = c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ") {
                    return Err(if reused && matches!(e, MetaError::Unavailable(_)) {
                        TxFail::Stale(e)
                    } else {
                        TxFail::Error(e)
                    });
                }
                match f(&mut c) {
                    Ok(v) => match c.batch("COMMIT") {
                        Ok(()) => Ok(v),
                        Err(e) => Err(TxFail::Error(e)),
                    },
                    Err(e) => {
                        if c.batch("ROLLBACK").is_err() {
                            c.discard();
                        }
                        Err(TxFail::Error(e))
                    }
                }
            })();
            match r {
                Ok(v) => return Ok(v),
                Err(TxFail::Stale(e)) => {
                    c.discard();
                    stale += 1;
                    if stale > POOL_MAX as u32 {
                        return Err(e);
                    }
                    tracing::debug!("metadata connection was closed, connecting again");
                }
                Err(TxFail::Error(MetaError::Busy(_)))
                    if attempt < MAX_RETRIES && started.elapsed() < RETRY_BUDGET =>
                {
                    attempt += 1;
                    drop(c);
                    let d = backoff(attempt);
                    tracing::debug!(attempt, "metadata transaction conflict, retrying in {d:?}");
                    std::thread::sleep(d);
                }
                Err(TxFail::Error(MetaError::Busy(_))) => {
                    tracing::warn!(
                        attempt,
                        "metadata transaction still conflicting after {:?}",
                        started.elapsed()
                    );
                    return Err(MetaError::Busy(attempt));
                }
                Err(TxFail::Error(e)) => {
                    if matches!(e, MetaError::Unavailable(_)) {
                        c.discard();
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Runs read-only `f` outside a transaction (each statement sees one snapshot).
    fn read<T>(&self, mut f: impl FnMut(&mut PgConn) -> Result<T>) -> Result<T> {
        let mut stale = 0u32;
        loop {
            let (mut c, reused) = self.pool.get()?;
            match f(&mut c) {
                Err(MetaError::Unavailable(e)) => {
                    c.discard();
                    stale += 1;
                    if !reused || stale > POOL_MAX as u32 {
                        return Err(MetaError::Unavailable(e));
                    }
                }
                other => return other,
            }
        }
    }

    /// A LISTEN connection of its own, outside the pool (see the module doc).
    fn listen_conn(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        let mut conn = self.pool.connect()?;
        let mut sql = String::new();
        for ch in channels {
            sql.push_str(&format!("LISTEN {};", pg_channel(*ch)));
        }
        conn.batch_execute(&sql).map_err(pg_err)?;
        Ok(Some(Box::new(PgListener {
            conn,
            client: client.to_string(),
        })))
    }

    /// Closes the idle pooled connections (the next calls connect anew).
    pub fn reset_connections(&self) {
        self.pool.clear();
    }
}

/// The PostgreSQL channel a [`Channel`] is announced on.
fn pg_channel(ch: Channel) -> &'static str {
    match ch {
        Channel::PccRevoke => REVOKE_CHANNEL,
        Channel::Changelog => crate::core::changelog::NOTIFY_CHANNEL,
    }
}

/// A LISTEN connection; see [`MetaEngine::listen`] and the module doc.
pub struct PgListener {
    conn: postgres::Client,
    client: String,
}

impl PgListener {
    /// The notice a notification carries, if it is addressed to this listener's client.
    fn notice(&self, n: &postgres::Notification) -> Option<Notice> {
        if n.channel() == crate::core::changelog::NOTIFY_CHANNEL {
            return Some(Notice::Changelog);
        }
        if n.channel() == REVOKE_CHANNEL {
            let (ino, holder) = n.payload().split_once(' ')?;
            if holder == self.client {
                return ino.parse::<u64>().ok().map(Notice::PccRevoke);
            }
        }
        None
    }
}

impl Listener for PgListener {
    fn wait(&mut self, timeout: Duration) -> Result<Vec<Notice>> {
        use postgres::fallible_iterator::FallibleIterator;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Once something arrived, only take what is already there.
            let wait = if out.is_empty() { left } else { Duration::ZERO };
            let next = self.conn.notifications().timeout_iter(wait).next();
            match next {
                Ok(Some(n)) => {
                    if let Some(x) = self.notice(&n) {
                        if !out.contains(&x) {
                            out.push(x);
                        }
                    }
                }
                Ok(None) => {
                    // The iterator also ends, without an error, when the server closed the
                    // connection: that must not look like "nothing happened".
                    if self.conn.is_closed() {
                        return Err(MetaError::Unavailable(
                            "the PostgreSQL connection listening for notifications was closed"
                                .into(),
                        ));
                    }
                    if !out.is_empty() || Instant::now() >= deadline {
                        return Ok(out);
                    }
                }
                Err(e) => return Err(pg_err(e)),
            }
        }
    }
}

/// The PostgreSQL engine: the shared core over the PostgreSQL driver.
pub type PgMeta = SqlMeta<PgEngine>;

impl SqlMeta<PgEngine> {
    /// Opens a formatted filesystem, migrating its schema if it is older than this build.
    pub fn open(url: &str) -> Result<PgMeta> {
        Ok(SqlMeta::new(PgEngine::open(url)?))
    }

    /// Creates a new filesystem in the (existing) database; see [`PgEngine::format`].
    pub fn format(url: &str, p: &FormatParams) -> Result<PgMeta> {
        Ok(SqlMeta::new(PgEngine::format(url, p)?))
    }
}

impl Driver for PgEngine {
    fn dialect(&self) -> &Dialect {
        &self.dialect
    }

    fn write_commit<T>(
        &self,
        mut f: impl FnMut(&mut dyn Tx) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        PgEngine::write_commit(self, |c| f(&mut PgTx::new(c, &self.dialect)))
    }

    fn read<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        PgEngine::read(self, |c| f(&mut PgTx::new(c, &self.dialect)))
    }

    fn exclusive<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.exclusive_tx(f)
    }

    fn sync(&self) -> Result<()> {
        // Commits are durable once they return (synchronous_commit = on).
        Ok(())
    }

    fn maintain(&self) -> Result<()> {
        // Housekeeping is autovacuum's.
        Ok(())
    }

    fn listen(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        self.listen_conn(client, channels)
    }
}

impl LegacyEngine for PgEngine {
    fn export_rows(&self, sink: &mut dyn FnMut(DumpRow) -> Result<()>) -> Result<()> {
        let rows = self.write(dump::export)?;
        for r in rows {
            sink(r)?;
        }
        Ok(())
    }

    fn import_rows(&self, rows: &mut dyn Iterator<Item = Result<DumpRow>>) -> Result<u64> {
        let rows: Vec<DumpRow> = rows.collect::<Result<_>>()?;
        self.write(|c| dump::import(c, &rows))
    }

    fn info(&self) -> Result<FsInfo> {
        self.read(|c| {
            let rows = c.query("SELECT key, value FROM meta_info", &[])?;
            let mut info = FsInfo {
                name: String::new(),
                uuid: String::new(),
                default_stripe_count: 1,
                default_stripe_size: 1 << 20,
                inline_threshold: 0,
                created: 0,
                schema_version: SCHEMA_VERSION,
            };
            for r in rows {
                let (k, v): (String, String) = (r.get(0), r.get(1));
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
            Ok(c.query(
                "SELECT id, url, capacity, used, objects FROM targets ORDER BY id",
                &[],
            )?
            .iter()
            .map(|r| TargetInfo {
                id: r.get::<_, i64>(0) as u32,
                url: r.get(1),
                capacity: r.get::<_, i64>(2) as u64,
                used: r.get::<_, i64>(3).max(0) as u64,
                objects: r.get::<_, i64>(4).max(0) as u64,
            })
            .collect())
        })
    }

    fn usage(&self) -> Result<Usage> {
        self.read(|c| {
            let r = c.one(
                "SELECT (SELECT COUNT(*) FROM inodes), \
                        (SELECT COALESCE(SUM(used), 0)::BIGINT FROM targets), \
                        (SELECT COALESCE(SUM(len), 0)::BIGINT FROM slices WHERE inline IS NOT NULL)",
                &[],
            )?;
            let (inodes, bytes, inline): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
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
        let sql = format!(
            "SELECT {} FROM dentries d JOIN inodes i ON i.ino = d.ino \
             WHERE d.parent = $1 AND d.name = $2",
            ATTR_COLS
                .split(", ")
                .map(|x| format!("i.{x}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.read(|c| match c.opt(&sql, &[&(parent as i64), &name])? {
            Some(r) => Ok(attr_from_row(&r)),
            None => {
                dir_attr(c, parent)?;
                Err(MetaError::NotFound)
            }
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.read(|c| get_attr(c, ino))
    }

    fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.write(|c| {
            let mut a = lock1(c, ino)?;
            let now = now_nanos();
            let mut changed = false;
            if let Some(size) = set.size {
                if a.kind == Kind::Dir {
                    return Err(MetaError::IsDir);
                }
                if a.kind != Kind::File {
                    return Err(MetaError::Invalid("truncate of a special file".into()));
                }
                truncate(c, &a, size)?;
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
            c.exec(
                "UPDATE inodes SET perm=$2, uid=$3, gid=$4, size=$5, atime=$6, mtime=$7, ctime=$8, \
                 data_version=$9 WHERE ino=$1",
                &[
                    &(ino as i64),
                    &(a.perm as i64),
                    &(a.uid as i64),
                    &(a.gid as i64),
                    &(a.size as i64),
                    &a.atime,
                    &a.mtime,
                    &a.ctime,
                    &(a.data_version as i64),
                ],
            )?;
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
        let lock = format!(
            "WITH l AS (SELECT ino FROM inodes WHERE ino = $1 FOR UPDATE) \
             UPDATE inodes i SET ino = i.ino FROM l WHERE i.ino = l.ino \
             RETURNING {}, EXISTS (SELECT 1 FROM dentries WHERE parent = $1 AND name = $2)",
            ATTR_COLS
                .split(", ")
                .map(|x| format!("i.{x}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // The inode, its name, the parent's times and link count, and the opener's open count,
        // in one statement (the parent row is already locked by this transaction).
        let insert = format!(
            "WITH n AS (INSERT INTO inodes (kind, perm, uid, gid, nlink, size, rdev, atime, mtime, \
                 ctime, crtime, projid, projinherit, stripe_size, stripe_targets, parent, symlink) \
               SELECT $1,$2,$3,$4,$5,$6,$7,$8,$8,$8,$8, \
                      CASE WHEN p.projinherit <> 0 THEN p.projid ELSE 0 END, \
                      CASE WHEN p.projinherit <> 0 AND $1::BIGINT = {dir} THEN 1 ELSE 0 END, \
                      $9,$10,$11,$12 \
               FROM inodes p WHERE p.ino = $11 RETURNING {ATTR_COLS}), \
             d AS (INSERT INTO dentries (parent, name, ino, kind) \
                   SELECT $11, $13, n.ino, $1 FROM n), \
             t AS (UPDATE inodes SET mtime = $8, ctime = $8, nlink = nlink + $14 WHERE ino = $11), \
             o AS (INSERT INTO open_files (session, ino, count) \
                   SELECT $15::BIGINT, n.ino, 1 FROM n WHERE $15::BIGINT IS NOT NULL) \
             SELECT * FROM n",
            dir = Kind::Dir as i64
        );
        self.write(|c| {
            let row = c.one(&lock, &[&(parent as i64), &name])?;
            let p = attr_from_row(&row);
            is_dir(&p)?;
            if p.nlink == 0 {
                return Err(MetaError::NotFound);
            }
            if row.get::<_, bool>(ATTR_COLS.split(", ").count()) {
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
            let nlink: i64 = if node.kind == Kind::Dir { 2 } else { 1 };
            let size = node.symlink.as_ref().map(|s| s.len()).unwrap_or(0) as i64;
            let (ss, st) = match (&layout, node.kind) {
                (Some(l), Kind::File) => (l.stripe_size as i64, l.encode_targets()),
                _ => (0, String::new()),
            };
            let parent_links: i64 = if node.kind == Kind::Dir { 1 } else { 0 };
            let opener: Option<i64> = open_by.map(|s| s as i64);
            let row = c.one(
                &insert,
                &[
                    &(node.kind as i64),
                    &(perm as i64),
                    &(node.uid as i64),
                    &(gid as i64),
                    &nlink,
                    &size,
                    &(node.rdev as i64),
                    &now,
                    &ss,
                    &st,
                    &(parent as i64),
                    &node.symlink.as_deref(),
                    &name,
                    &parent_links,
                    &opener,
                ],
            )?;
            Ok(attr_from_row(&row))
        })
    }

    fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        check_name(new_name)?;
        self.write(|c| {
            let mut locked = lock_inodes(c, &[ino, new_parent])?;
            let a = locked.remove(&ino).ok_or(MetaError::NotFound)?;
            if a.kind == Kind::Dir {
                return Err(MetaError::NotPermitted);
            }
            if a.nlink as i64 >= MAX_LINKS {
                return Err(MetaError::TooManyLinks);
            }
            let p = locked.remove(&new_parent).ok_or(MetaError::NotFound)?;
            is_dir(&p)?;
            if p.nlink == 0 {
                return Err(MetaError::NotFound);
            }
            if find_dentry(c, new_parent, new_name)?.is_some() {
                return Err(MetaError::Exists);
            }
            let now = now_nanos();
            c.exec(
                "INSERT INTO dentries (parent, name, ino, kind) VALUES ($1,$2,$3,$4)",
                &[
                    &(new_parent as i64),
                    &new_name,
                    &(ino as i64),
                    &(a.kind as i64),
                ],
            )?;
            c.exec(
                "UPDATE inodes SET nlink = nlink + 1, ctime = $2, orphan = 0 WHERE ino = $1",
                &[&(ino as i64), &now],
            )?;
            touch_dir(c, new_parent, now, 0)?;
            get_attr(c, ino)
        })
    }

    fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.write(|c| {
            let Some((id, ino, kind)) = find_dentry(c, parent, name)? else {
                dir_attr(c, parent)?;
                return Err(MetaError::NotFound);
            };
            let locked = lock_inodes(c, &[parent, ino])?;
            is_dir(locked.get(&parent).ok_or(MetaError::NotFound)?)?;
            if kind == Kind::Dir {
                return Err(MetaError::IsDir);
            }
            let now = now_nanos();
            let nlink = c
                .opt(
                    "WITH d AS (DELETE FROM dentries WHERE id = $3), \
                          t AS (UPDATE inodes SET mtime = $2, ctime = $2 WHERE ino = $4) \
                     UPDATE inodes SET nlink = nlink - 1, ctime = $2 WHERE ino = $1 RETURNING nlink",
                    &[&(ino as i64), &now, &id, &(parent as i64)],
                )?
                .map(|r| r.get::<_, i64>(0));
            if matches!(nlink, Some(n) if n <= 0) {
                drop_inode(c, ino)?;
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
        self.write(|c| {
            let Some((id, ino, kind)) = find_dentry(c, parent, name)? else {
                dir_attr(c, parent)?;
                return Err(MetaError::NotFound);
            };
            let locked = lock_inodes(c, &[parent, ino])?;
            is_dir(locked.get(&parent).ok_or(MetaError::NotFound)?)?;
            if kind != Kind::Dir {
                return Err(MetaError::NotDir);
            }
            if c.exists(
                "SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = $1)",
                &[&(ino as i64)],
            )? {
                return Err(MetaError::NotEmpty);
            }
            let now = now_nanos();
            c.exec("DELETE FROM dentries WHERE id = $1", &[&id])?;
            c.exec("DELETE FROM xattrs WHERE ino = $1", &[&(ino as i64)])?;
            c.exec("DELETE FROM inodes WHERE ino = $1", &[&(ino as i64)])?;
            touch_dir(c, parent, now, -1)?;
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
        self.write(|c| {
            // Look first (this fixes the snapshot), then lock: a change to either directory
            // since the snapshot makes the locks fail and the transaction retry.
            dir_attr(c, parent)?;
            dir_attr(c, new_parent)?;
            let (sid, sino, skind) = find_dentry(c, parent, name)?.ok_or(MetaError::NotFound)?;
            let dst = find_dentry(c, new_parent, new_name)?;
            if parent == new_parent && name == new_name {
                return if noreplace {
                    Err(MetaError::Exists)
                } else {
                    Ok(())
                };
            }
            let moves_dir = parent != new_parent
                && (skind == Kind::Dir
                    || (exchange && matches!(dst, Some((_, _, Kind::Dir)))));
            if moves_dir {
                c.exec(
                    "INSERT INTO counters (name, value) VALUES ('rename_lock', 1) \
                     ON CONFLICT (name) DO UPDATE SET value = counters.value + 1",
                    &[],
                )?;
            }
            let mut set = vec![parent, new_parent, sino];
            if let Some((_, dino, _)) = dst {
                set.push(dino);
            }
            let locked = lock_inodes(c, &set)?;
            if !locked.contains_key(&parent) || !locked.contains_key(&new_parent) {
                return Err(MetaError::NotFound);
            }
            let now = now_nanos();
            if skind == Kind::Dir && is_ancestor(c, sino, new_parent)? {
                return Err(MetaError::Invalid(
                    "cannot move a directory into itself".into(),
                ));
            }
            if exchange {
                let (did, dino, dkind) = dst.ok_or(MetaError::NotFound)?;
                if dkind == Kind::Dir && is_ancestor(c, dino, parent)? {
                    return Err(MetaError::Invalid(
                        "cannot move a directory into itself".into(),
                    ));
                }
                c.exec(
                    "UPDATE dentries SET ino = $2, kind = $3 WHERE id = $1",
                    &[&sid, &(dino as i64), &(dkind as i64)],
                )?;
                c.exec(
                    "UPDATE dentries SET ino = $2, kind = $3 WHERE id = $1",
                    &[&did, &(sino as i64), &(skind as i64)],
                )?;
                let mut dp = 0i64;
                let mut dn = 0i64;
                if skind == Kind::Dir {
                    c.exec(
                        "UPDATE inodes SET parent = $2 WHERE ino = $1",
                        &[&(sino as i64), &(new_parent as i64)],
                    )?;
                    dp -= 1;
                    dn += 1;
                }
                if dkind == Kind::Dir {
                    c.exec(
                        "UPDATE inodes SET parent = $2 WHERE ino = $1",
                        &[&(dino as i64), &(parent as i64)],
                    )?;
                    dp += 1;
                    dn -= 1;
                }
                for ino in [sino, dino] {
                    c.exec(
                        "UPDATE inodes SET ctime = $2 WHERE ino = $1",
                        &[&(ino as i64), &now],
                    )?;
                }
                if parent == new_parent {
                    touch_dir(c, parent, now, 0)?;
                } else {
                    touch_dir(c, parent, now, dp)?;
                    touch_dir(c, new_parent, now, dn)?;
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
                    if c.exists(
                        "SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = $1)",
                        &[&(dino as i64)],
                    )? {
                        return Err(MetaError::NotEmpty);
                    }
                    c.exec("DELETE FROM dentries WHERE id = $1", &[&did])?;
                    c.exec("DELETE FROM xattrs WHERE ino = $1", &[&(dino as i64)])?;
                    c.exec("DELETE FROM inodes WHERE ino = $1", &[&(dino as i64)])?;
                    new_parent_nlink -= 1;
                } else {
                    if skind == Kind::Dir {
                        return Err(MetaError::NotDir);
                    }
                    c.exec("DELETE FROM dentries WHERE id = $1", &[&did])?;
                    let nlink = c.i64(
                        "UPDATE inodes SET nlink = nlink - 1, ctime = $2 WHERE ino = $1 RETURNING nlink",
                        &[&(dino as i64), &now],
                    )?;
                    if nlink <= 0 {
                        retire_inode(c, dino)?;
                    }
                }
            }
            c.exec(
                "UPDATE dentries SET parent = $2, name = $3 WHERE id = $1",
                &[&sid, &(new_parent as i64), &new_name],
            )?;
            c.exec(
                "UPDATE inodes SET ctime = $2 WHERE ino = $1",
                &[&(sino as i64), &now],
            )?;
            if skind == Kind::Dir && parent != new_parent {
                c.exec(
                    "UPDATE inodes SET parent = $2 WHERE ino = $1",
                    &[&(sino as i64), &(new_parent as i64)],
                )?;
                touch_dir(c, parent, now, -1)?;
                new_parent_nlink += 1;
            } else if parent != new_parent {
                touch_dir(c, parent, now, 0)?;
            }
            touch_dir(c, new_parent, now, new_parent_nlink)?;
            Ok(())
        })
    }

    fn readdir(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<DirEntry>> {
        self.read(|c| {
            dir_attr(c, ino)?;
            Ok(c.query(
                "SELECT id, name, ino, kind FROM dentries WHERE parent = $1 AND id > $2 \
                 ORDER BY id LIMIT $3",
                &[&(ino as i64), &(offset as i64), &(limit as i64)],
            )?
            .iter()
            .map(|r| DirEntry {
                offset: r.get::<_, i64>(0) as u64,
                name: r.get(1),
                ino: r.get::<_, i64>(2) as u64,
                kind: Kind::from_i64(r.get(3)).unwrap_or(Kind::File),
            })
            .collect())
        })
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.read(|c| {
            let r = c.one(
                "SELECT kind, symlink FROM inodes WHERE ino = $1",
                &[&(ino as i64)],
            )?;
            let (kind, target): (i64, Option<Vec<u8>>) = (r.get(0), r.get(1));
            if kind != Kind::Symlink as i64 {
                return Err(MetaError::Invalid("not a symlink".into()));
            }
            Ok(target.unwrap_or_default())
        })
    }

    fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        self.read(|c| {
            match c.opt(
                "SELECT value FROM xattrs WHERE ino = $1 AND name = $2",
                &[&(ino as i64), &name],
            )? {
                Some(r) => Ok(r.get(0)),
                None => Err(if get_attr(c, ino).is_err() {
                    MetaError::NotFound
                } else {
                    MetaError::NoAttr
                }),
            }
        })
    }

    fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(MetaError::Invalid("bad xattr name".into()));
        }
        self.write(|c| {
            lock1(c, ino)?;
            let exists = c.exists(
                "SELECT EXISTS (SELECT 1 FROM xattrs WHERE ino = $1 AND name = $2)",
                &[&(ino as i64), &name],
            )?;
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(MetaError::Exists);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(MetaError::NoAttr);
            }
            c.exec(
                "INSERT INTO xattrs (ino, name, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (ino, name) DO UPDATE SET value = EXCLUDED.value",
                &[&(ino as i64), &name, &value],
            )?;
            c.exec(
                "UPDATE inodes SET ctime = $2 WHERE ino = $1",
                &[&(ino as i64), &now_nanos()],
            )?;
            Ok(())
        })
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.read(|c| {
            get_attr(c, ino)?;
            Ok(c.query(
                "SELECT name FROM xattrs WHERE ino = $1 ORDER BY name",
                &[&(ino as i64)],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
    }

    fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        self.write(|c| {
            lock1(c, ino)?;
            let n = c.exec(
                "DELETE FROM xattrs WHERE ino = $1 AND name = $2",
                &[&(ino as i64), &name],
            )?;
            if n == 0 {
                return Err(MetaError::NoAttr);
            }
            c.exec(
                "UPDATE inodes SET ctime = $2 WHERE ino = $1",
                &[&(ino as i64), &now_nanos()],
            )?;
            Ok(())
        })
    }

    fn resolve_stripe_default(&self, dir: Ino) -> Result<StripeDefault> {
        let info = self.info()?;
        self.read(|c| {
            let mut out = StripeDefault::default();
            let mut ino = dir;
            for _ in 0..100_000 {
                let r = c.one(
                    "SELECT def_stripe_count, def_stripe_size, parent FROM inodes WHERE ino = $1",
                    &[&(ino as i64)],
                )?;
                let (cnt, size, parent): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
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
        self.write(|c| {
            is_dir(&lock1(c, dir)?)?;
            c.exec(
                "UPDATE inodes SET def_stripe_count = $2, def_stripe_size = $3, ctime = $4 WHERE ino = $1",
                &[
                    &(dir as i64),
                    &(def.stripe_count as i64),
                    &(def.stripe_size as i64),
                    &now_nanos(),
                ],
            )?;
            Ok(())
        })
    }

    fn set_file_layout(&self, ino: Ino, layout: &Layout) -> Result<()> {
        self.write(|c| {
            let a = lock1(c, ino)?;
            if a.kind != Kind::File {
                return Err(MetaError::Invalid("not a regular file".into()));
            }
            let has_data = c.exists(
                "SELECT EXISTS (SELECT 1 FROM slices WHERE ino = $1)",
                &[&(ino as i64)],
            )?;
            if has_data || a.size > 0 {
                return Err(MetaError::NotEmpty);
            }
            c.exec(
                "UPDATE inodes SET stripe_size = $2, stripe_targets = $3, ctime = $4 WHERE ino = $1",
                &[
                    &(ino as i64),
                    &(layout.stripe_size as i64),
                    &layout.encode_targets(),
                    &now_nanos(),
                ],
            )?;
            Ok(())
        })
    }

    fn set_projid(&self, ino: Ino, projid: u32, inherit: bool) -> Result<u64> {
        self.write(|c| {
            let a = lock1(c, ino)?;
            let now = now_nanos();
            let inh: i64 = if inherit && a.kind == Kind::Dir { 1 } else { 0 };
            c.exec(
                "UPDATE inodes SET projid = $2, projinherit = $3, ctime = $4 WHERE ino = $1",
                &[&(ino as i64), &(projid as i64), &inh, &now],
            )?;
            let mut count = 1u64;
            if inherit && a.kind == Kind::Dir {
                let mut queue = vec![ino];
                while let Some(dir) = queue.pop() {
                    let children: Vec<(i64, i64)> = c
                        .query(
                            "SELECT ino, kind FROM dentries WHERE parent = $1",
                            &[&(dir as i64)],
                        )?
                        .iter()
                        .map(|r| (r.get(0), r.get(1)))
                        .collect();
                    for (child, kind) in children {
                        let is_d = kind == Kind::Dir as i64;
                        c.exec(
                            "UPDATE inodes SET projid = $2, projinherit = $3, ctime = $4 WHERE ino = $1",
                            &[&child, &(projid as i64), &(if is_d { 1i64 } else { 0 }), &now],
                        )?;
                        count += 1;
                        if is_d {
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
            let r = c.one(
                "SELECT projid, projinherit FROM inodes WHERE ino = $1",
                &[&(ino as i64)],
            )?;
            Ok((r.get::<_, i64>(0) as u32, r.get::<_, i64>(1) != 0))
        })
    }

    fn object_refs(&self) -> Result<Vec<ObjectRef>> {
        self.read(|c| {
            Ok(c.query(
                "SELECT target, obj, ino, obj_off + len, NULL::BIGINT FROM slices \
                 WHERE obj IS NOT NULL \
                 UNION ALL SELECT target, obj, ino, len, id FROM trash",
                &[],
            )?
            .iter()
            .map(|r| ObjectRef {
                target: r.get::<_, i64>(0) as u32,
                obj: r.get::<_, i64>(1) as u64,
                ino: r.get::<_, i64>(2) as u64,
                end: r.get::<_, i64>(3) as u64,
                trash: r.get::<_, Option<i64>>(4).map(|i| i as u64),
            })
            .collect())
        })
    }

    fn object_id_counter(&self) -> Result<u64> {
        self.read(|c| {
            let r = c.one("SELECT value FROM counters WHERE name = 'next_object'", &[])?;
            Ok(r.get::<_, i64>(0) as u64)
        })
    }

    fn meta_issues(&self, timeout_ns: i64) -> Result<Vec<MetaIssue>> {
        let limit = now_nanos() - timeout_ns;
        self.read(|c| {
            let mut out = Vec::new();
            for r in c.query(
                "SELECT d.parent, d.name, d.ino FROM dentries d \
                 WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = d.ino) ORDER BY d.id",
                &[],
            )? {
                out.push(MetaIssue::DanglingEntry {
                    parent: r.get::<_, i64>(0) as u64,
                    name: r.get(1),
                    ino: r.get::<_, i64>(2) as u64,
                });
            }
            let sql = format!("SELECT i.ino FROM inodes i WHERE {UNHELD} ORDER BY i.ino");
            for r in c.query(&sql, &[])? {
                out.push(MetaIssue::UnheldOrphan {
                    ino: r.get::<_, i64>(0) as u64,
                });
            }
            for r in c.query(
                "SELECT o.ino, o.session FROM open_files o WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.id = o.session AND s.heartbeat >= $1) \
                 ORDER BY o.session, o.ino",
                &[&limit],
            )? {
                out.push(MetaIssue::StaleOpen {
                    ino: r.get::<_, i64>(0) as u64,
                    session: r.get::<_, i64>(1) as u64,
                });
            }
            for r in c.query(
                "SELECT DISTINCT l.ino, l.session FROM locks l WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.id = l.session AND s.heartbeat >= $1) \
                 ORDER BY l.session, l.ino",
                &[&limit],
            )? {
                out.push(MetaIssue::StaleLock {
                    ino: r.get::<_, i64>(0) as u64,
                    session: r.get::<_, i64>(1) as u64,
                });
            }
            for r in c.query(
                "SELECT l.ino, l.client, l.dirty FROM pcc_leases l WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.client_name = l.client AND s.heartbeat >= $1) \
                 ORDER BY l.ino",
                &[&limit],
            )? {
                out.push(MetaIssue::StaleLease {
                    ino: r.get::<_, i64>(0) as u64,
                    client: r.get(1),
                    dirty: r.get::<_, i64>(2) != 0,
                });
            }
            Ok(out)
        })
    }

    fn repair_issue(&self, issue: &MetaIssue, timeout_ns: i64) -> Result<bool> {
        let limit = now_nanos() - timeout_ns;
        self.write(|c| {
            // The session of a stale row: Some(true) alive, Some(false) dead, None gone.
            fn session_state(c: &mut PgConn, session: u64, limit: i64) -> Result<Option<bool>> {
                Ok(c.opt(
                    "SELECT heartbeat >= $2 FROM sessions WHERE id = $1 FOR UPDATE",
                    &[&(session as i64), &limit],
                )?
                .map(|r| r.get::<_, bool>(0)))
            }
            match issue {
                MetaIssue::DanglingEntry { parent, name, ino } => {
                    lock_inodes(c, &[*parent])?;
                    let kind = c
                        .opt(
                            "DELETE FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3 \
                             AND NOT EXISTS (SELECT 1 FROM inodes WHERE ino = $3) RETURNING kind",
                            &[&(*parent as i64), name, &(*ino as i64)],
                        )?
                        .map(|r| r.get::<_, i64>(0));
                    match kind {
                        Some(k) => {
                            if k == Kind::Dir as i64 {
                                touch_dir(c, *parent, now_nanos(), -1)?;
                            }
                            Ok(true)
                        }
                        None => Ok(false),
                    }
                }
                MetaIssue::UnheldOrphan { ino } => {
                    lock_inodes(c, &[*ino])?;
                    let sql = format!(
                        "SELECT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = $1 AND {UNHELD})"
                    );
                    let still = c.exists(&sql, &[&(*ino as i64)])?;
                    if still {
                        purge_inode(c, *ino)?;
                    }
                    Ok(still)
                }
                MetaIssue::StaleOpen { ino, session } => match session_state(c, *session, limit)? {
                    Some(true) => Ok(false),
                    Some(false) => {
                        end_sessions(c, &[*session as i64])?;
                        Ok(true)
                    }
                    None => {
                        lock_inodes(c, &[*ino])?;
                        let n = c.exec(
                            "DELETE FROM open_files WHERE session = $1 AND ino = $2",
                            &[&(*session as i64), &(*ino as i64)],
                        )?;
                        purge_if_orphan(c, *ino)?;
                        Ok(n > 0)
                    }
                },
                MetaIssue::StaleLock { ino, session } => match session_state(c, *session, limit)? {
                    Some(true) => Ok(false),
                    Some(false) => {
                        end_sessions(c, &[*session as i64])?;
                        Ok(true)
                    }
                    None => {
                        let n = c.exec(
                            "DELETE FROM locks WHERE session = $1 AND ino = $2",
                            &[&(*session as i64), &(*ino as i64)],
                        )?;
                        Ok(n > 0)
                    }
                },
                MetaIssue::StaleLease { ino, client, .. } => {
                    lock_inodes(c, &[*ino])?;
                    let n = c.exec(
                        "DELETE FROM pcc_leases WHERE ino = $1 AND client = $2 AND dirty = 0 \
                         AND NOT EXISTS (SELECT 1 FROM sessions s \
                             WHERE s.client_name = $2 AND s.heartbeat >= $3)",
                        &[&(*ino as i64), client, &limit],
                    )?;
                    if n > 0 {
                        c.exec("DELETE FROM pcc_revokes WHERE ino = $1", &[&(*ino as i64)])?;
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
                let Some(r) = c.opt(
                    "SELECT parent, name FROM dentries WHERE ino = $1 ORDER BY id LIMIT 1",
                    &[&(cur as i64)],
                )?
                else {
                    return Ok(None);
                };
                parts.push(r.get(1));
                cur = r.get::<_, i64>(0) as u64;
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
            Ok(c.query(
                "SELECT ino FROM inodes WHERE orphan = 2 AND ctime < $1 ORDER BY ino LIMIT 1000",
                &[&replaced_before],
            )?
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .collect())
        })?;
        if due.is_empty() {
            return Ok(0);
        }
        self.write(|c| {
            let inos: Vec<Ino> = due.iter().map(|i| *i as Ino).collect();
            lock_inodes(c, &inos)?;
            let mut n = 0;
            for ino in inos {
                // Still a replaced file, and not open (the purge after its last close waits for
                // a later pass).
                if c.exists(
                    "SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = $1 AND orphan = 2) \
                     AND NOT EXISTS (SELECT 1 FROM open_files WHERE ino = $1)",
                    &[&(ino as i64)],
                )? {
                    purge_inode(c, ino)?;
                    n += 1;
                }
            }
            Ok(n)
        })
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod url_tests {
    #[test]
    fn passwords_never_leave_in_shared_places() {
        assert_eq!(
            super::without_password("postgres://u:secret@h:5/db"),
            "postgres://u@h:5/db"
        );
        assert_eq!(super::without_password("sqlite:///x.db"), "sqlite:///x.db");
        assert!(!super::redact("postgres://u:secret@h/db").contains("secret"));
    }
}
