//! The changelog domain: records written in the same transaction as each change, registered
//! readers, clear and purge, idle readers (docs/changelog.md).
//!
//! **Writing a record** ([`record`]) is one statement inside the operation's own transaction:
//! `INSERT ... SELECT ... WHERE EXISTS (a registered reader whose mask has this type)`. With no
//! such reader the statement writes nothing (no row, no page touched), so an operation costs
//! the same single statement more whether or not the changelog is in use, and nothing at all is
//! stored.
//!
//! **Index order is commit order.** A reader that follows the changelog remembers the last
//! index it saw and asks for what comes after; that is only safe if a record with a lower index
//! can never commit after one with a higher index. On SQLite this holds by construction (one
//! writer at a time; the index is the highest one plus one, never reused even after a purge,
//! see [`SCHEMA`]). On
//! PostgreSQL the index comes from a sequence, which hands out numbers in *allocation* order:
//! transaction A could take 7, transaction B take 8 and commit first, and a follower reading at
//! that moment would see 8, move past 7, and never see it. So before the index is allocated the
//! statement takes a transaction-scoped advisory lock ([`ORDER_LOCK`]), held until commit:
//! recording transactions then allocate and commit one after another, in index order. The lock
//! is taken inside the same statement, only when a record is actually written (the `EXISTS`
//! gate comes first), so with no reader nothing is locked. The price is that recording
//! transactions on PostgreSQL serialise from their record to their commit; records are written
//! at the end of each operation to keep that window short. A transaction that rolls back after
//! taking an index leaves a gap: indexes increase but are not always consecutive.

use std::time::Duration;

use super::common::{open_upsert_sql, record_open};
use super::SqlMeta;
use crate::changelog::{
    for_ino, ChangelogError, ChangelogReader, ChangelogRecord, ChangelogStatus, IdleDeregistration,
    Mask, RecordType,
};
use crate::engine::Changelog;
use crate::error::{MetaError, Result};
use crate::sql::{Driver, Row, Tx, Value};
use crate::types::*;
use crate::vals;

/// The changelog's tables (schema v6).
///
/// - `changelog`: one row per record; `idx` is the record's index. SQLite: the rowid, which
///   SQLite makes the highest one plus one (one writer at a time). Never reused: a purge
///   always keeps the highest row, turned into a MARK (type 0, which no read returns) when it
///   was purged, so numbering goes on from it. (Not `AUTOINCREMENT`, whose `sqlite_sequence`
///   write per record, or an explicit `MAX(idx) + 1`, which makes SQLite copy the `SELECT`
///   of an `INSERT ... SELECT` from the same table, each made the changelog much dearer.)
///   PostgreSQL: `nextval` of the sequence `changelog_seq_n_seq`, ordered by [`ORDER_LOCK`].
///   `type` is the Lustre number of [`RecordType`]; `sparent`/`sname` are set for renames.
/// - `changelog_seq`: no rows; its `SERIAL` column gives PostgreSQL the sequence above (the
///   neutral schema has no `CREATE SEQUENCE`).
/// - `changelog_readers`: registered readers, never deleted (ids are not reused): `mask` (bit
///   `1 << type`), `cleared` (records up to it are done for this reader), `last_used` and
///   `idle_ns` (idle expiry), `state` (0 active, 1 deregistered, 2 dropped for idleness, shown
///   by `tierfs status` until deregistered by hand), `ended` (when it stopped).
pub const SCHEMA: crate::core::schema::Ddl = &[
    "CREATE TABLE changelog (
        idx INT PRIMARY KEY,
        time INT NOT NULL,
        type INT NOT NULL,
        flags INT NOT NULL DEFAULT 0,
        target INT NOT NULL,
        parent INT NOT NULL DEFAULT 0,
        name BLOB NOT NULL,
        sparent INT,
        sname BLOB,
        uid INT NOT NULL,
        gid INT NOT NULL,
        client TEXT NOT NULL,
        jobid TEXT
    )",
    "CREATE TABLE changelog_readers (
        id INT PRIMARY KEY,
        mask INT NOT NULL,
        cleared INT NOT NULL DEFAULT 0,
        registered INT NOT NULL,
        last_used INT NOT NULL,
        idle_ns INT NOT NULL,
        state INT NOT NULL DEFAULT 0,
        ended INT
    )",
    "CREATE TABLE changelog_seq (n SERIAL)",
];

/// The PostgreSQL advisory lock that orders recording transactions (an arbitrary constant
/// outside the 32-bit range that `hashtext` keys of other locks fall in).
pub const ORDER_LOCK: i64 = 0x7469_6572_6663_6c67; // "tierfclg"

/// Reader states (column `state` of `changelog_readers`).
const ACTIVE: i64 = 0;
const DEREGISTERED: i64 = 1;
const IDLE_DROPPED: i64 = 2;

/// The longest idle time a reader can be given.
pub const MAX_IDLE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How many readers dropped for idleness `tierfs status` keeps warning about.
const IDLE_WARNINGS: i64 = 16;

/// One change to record: built by the operation, written by [`record`].
#[derive(Clone, Debug)]
pub struct Rec<'a> {
    pub typ: RecordType,
    pub flags: u32,
    pub target: Ino,
    pub parent: Ino,
    pub name: &'a [u8],
    pub source: Option<(Ino, &'a [u8])>,
}

impl<'a> Rec<'a> {
    /// A record of `typ` about `target`, with no name.
    pub fn new(typ: RecordType, target: Ino) -> Rec<'a> {
        Rec {
            typ,
            flags: 0,
            target,
            parent: 0,
            name: b"",
            source: None,
        }
    }

    /// Where the change happened: `parent`/`name` (namespace records; XATTR: parent 0 and the
    /// attribute's name).
    pub fn at(mut self, parent: Ino, name: &'a [u8]) -> Rec<'a> {
        self.parent = parent;
        self.name = name;
        self
    }

    /// Where a renamed inode was.
    pub fn from(mut self, parent: Ino, name: &'a [u8]) -> Rec<'a> {
        self.source = Some((parent, name));
        self
    }

    pub fn flags(mut self, flags: u32) -> Rec<'a> {
        self.flags = flags;
        self
    }
}

const INSERT_SQLITE: &str = "INSERT INTO changelog \
    (time, type, flags, target, parent, name, sparent, sname, uid, gid, client, jobid) \
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 \
    WHERE EXISTS (SELECT 1 FROM changelog_readers WHERE state = 0 AND (mask & $13) <> 0 \
    AND (follower_of IS NULL OR follower_of <> $11 OR $2 = 16))";

// The gate's WHERE is evaluated before its select list, so the lock is taken (and the NOTIFY
// on [`NOTIFY_CHANNEL`] sent) only when a reader wants the record; the index (`nextval`, in the outer select list) is drawn for the
// gate's row, after the lock. `extra` adds a condition to the gate (evaluated before the lock).
fn insert_pg(extra: &str) -> String {
    insert_pg_at(0, &[], extra)
}

/// [`insert_pg`] with its 13 parameters numbered from `base + 1` (so that a statement can hold
/// several records, or put its own parameters first), and the fields of `over` (by their
/// parameter's number, 1 to 13: the flags are 3, the target 4) taken from SQL expressions
/// instead, their parameters the value when the expression is NULL (PostgreSQL must see every
/// parameter used to know its type).
fn insert_pg_at(base: usize, over: &[(usize, &str)], extra: &str) -> String {
    let p = |i: usize, ty: &str| match over.iter().find(|(n, _)| *n == i) {
        Some((_, e)) => format!("COALESCE(({e})::{ty}, ${}::{ty})", base + i),
        None => format!("${}::{ty}", base + i),
    };
    format!(
        "INSERT INTO changelog \
    (idx, time, type, flags, target, parent, name, sparent, sname, uid, gid, client, jobid) \
    SELECT nextval('changelog_seq_n_seq'), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {} \
    FROM (SELECT pg_advisory_xact_lock(7882522153839479911) AS locked, \
    pg_notify('tierfs_changelog', '') AS notified \
    WHERE EXISTS (SELECT 1 FROM changelog_readers WHERE state = 0 AND (mask & {}) <> 0 \
    AND (follower_of IS NULL OR follower_of <> {} OR {} = 16)){extra}) \
    AS gate",
        p(1, "BIGINT"),
        p(2, "INTEGER"),
        p(3, "INTEGER"),
        p(4, "BIGINT"),
        p(5, "BIGINT"),
        p(6, "BYTEA"),
        p(7, "BIGINT"),
        p(8, "BYTEA"),
        p(9, "BIGINT"),
        p(10, "BIGINT"),
        p(11, "TEXT"),
        p(12, "TEXT"),
        p(13, "BIGINT"),
        p(11, "TEXT"),
        p(2, "INTEGER"),
    )
}

fn insert_pg_sql() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| insert_pg(""))
}

/// The parameters of [`record`]'s statements ($1 to $13), for `rec` made by `c`.
fn rec_params(rec: &Rec<'_>, c: &crate::changelog::Caller, client: &str) -> [Value; 13] {
    [
        Value::from(now_nanos()),
        Value::from(rec.typ as i64),
        Value::from(rec.flags as i64),
        Value::from(rec.target),
        Value::from(rec.parent),
        Value::from(rec.name),
        Value::from(rec.source.map(|s| s.0)),
        Value::from(rec.source.map(|s| s.1)),
        Value::from(c.uid as i64),
        Value::from(c.gid as i64),
        Value::from(client),
        Value::from(c.jobid.as_deref()),
        Value::from(rec.typ.bit()),
    ]
}

/// Writes `rec` in the caller's transaction if a registered reader's mask includes its type
/// and the reader is not the change follower of the client making the record (HSM records
/// excepted: `16` in the gates is [`RecordType::Hsm`]) (one statement; nothing is written
/// otherwise). The record names the caller of this thread
/// (`crate::changelog::for_ino`). Returns whether a record was written.
pub fn record(tx: &mut dyn Tx, rec: &Rec<'_>) -> Result<bool> {
    let c = for_ino(rec.target);
    let client = c.client_name();
    let sql = if tx.dialect().is_postgres() {
        insert_pg_sql()
    } else {
        INSERT_SQLITE
    };
    let n = tx.exec(sql, &rec_params(rec, &c, &client))?;
    // On PostgreSQL the statement also sent the NOTIFY that wakes followers (delivered at
    // commit; identical notices of one transaction merge into one).
    Ok(n > 0)
}

/// PostgreSQL: the gated insert of a record (parameters `$1` to `$13`, [`record_params`]) as
/// a data-modifying CTE of a bigger statement, written only when that statement's CTE `after`
/// yields a row (and, as [`record`]'s, only when a reader wants it: the changelog's order
/// lock is then taken after whatever `after` locked).
pub(crate) fn pg_insert_after(after: &str) -> String {
    pg_insert_at(0, &[], after, "")
}

/// [`pg_insert_after`] for a statement that holds more than one record or computes fields:
/// this record's parameters are `$base+1` to `$base+13`, the fields of `over` SQL expressions
/// ([`insert_pg_at`]), and the gate also waits for the condition `also` (e.g. that an earlier
/// record's CTE ran: records are numbered in the order their CTEs run).
pub(crate) fn pg_insert_at(base: usize, over: &[(usize, &str)], after: &str, also: &str) -> String {
    insert_pg_at(
        base,
        over,
        &format!(" AND EXISTS (SELECT 1 FROM {after}){also}"),
    )
}

/// The parameters (`$1` to `$13`) of `rec`'s record, made by the caller of this thread.
pub(crate) fn record_params(rec: &Rec<'_>) -> [Value; 13] {
    let c = for_ino(rec.target);
    let client = c.client_name();
    rec_params(rec, &c, &client)
}

/// Records an open of `ino` under `session` ([`record_open`]: `SessionEnded` when the session
/// is gone) and its OPEN record ([`record`]). PostgreSQL: one statement, the open's upsert
/// first and then, only when a reader wants OPEN records, the changelog's order lock and row
/// (the gate reads the upsert's result, so the lock comes after the open's row lock, as with
/// two statements); SQLite: the two statements.
pub fn record_open_logged(tx: &mut dyn Tx, session: u64, ino: Ino) -> Result<()> {
    if !tx.dialect().is_postgres() {
        record_open(tx, session, ino)?;
        record(tx, &Rec::new(RecordType::Open, ino))?;
        return Ok(());
    }
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = S.get_or_init(|| {
        format!(
            "WITH o AS ({} RETURNING 1), c AS ({} RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM o), EXISTS (SELECT 1 FROM c)",
            open_upsert_sql("$14::BIGINT", "$15::BIGINT"),
            pg_insert_after("o")
        )
    });
    let mut params = record_params(&Rec::new(RecordType::Open, ino)).to_vec();
    params.extend([Value::from(session), Value::from(ino)]);
    let r = tx.one(sql, &params)?;
    if !r.bool(0)? {
        return Err(MetaError::SessionEnded(session));
    }
    Ok(())
}

/// Writes the records of one operation that makes several (a create that opens, a rename
/// that replaces, a batch of closes) for one statement when no reader wants them: one read of
/// the registered readers' masks, then [`record`] for the types some reader wants. A single
/// record goes straight to [`record`] (one statement either way).
pub fn record_all(tx: &mut dyn Tx, recs: &[Rec<'_>]) -> Result<()> {
    match recs {
        [] => Ok(()),
        [one] => record(tx, one).map(|_| ()),
        _ => {
            // (mask, the client it follows) of each active reader
            let mut readers: Vec<(i64, Option<String>)> = Vec::new();
            tx.query_each(
                "SELECT mask, follower_of FROM changelog_readers WHERE state = 0",
                vals![],
                &mut |r| {
                    readers.push((r.i64(0)?, r.opt_text(1)?));
                    Ok(())
                },
            )?;
            for r in recs {
                let me = for_ino(r.target).client_name();
                let wanted = readers.iter().any(|(mask, follows)| {
                    mask & r.typ.bit() != 0
                        && (r.typ == RecordType::Hsm || follows.as_deref() != Some(&*me))
                });
                if wanted {
                    record(tx, r)?;
                }
            }
            Ok(())
        }
    }
}

/// The NOTIFY channel followers listen on.
pub const NOTIFY_CHANNEL: &str = "tierfs_changelog";

/// The highest index handed out so far (0: none).
fn current_index(tx: &mut dyn Tx) -> Result<u64> {
    let sql = if tx.dialect().is_postgres() {
        // Not transactional: a number taken by a transaction that later rolled back counts.
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM changelog_seq_n_seq"
    } else {
        // The highest row is never purged (see `purge`).
        "SELECT COALESCE(MAX(idx), 0) FROM changelog"
    };
    Ok(tx.int(sql, vals![])?.max(0) as u64)
}

/// Deletes records that every active reader has cleared (all of them when none is left),
/// except the highest row, which becomes a MARK (type 0, never returned by a read) when it is
/// due: SQLite numbers new rows after it. Returns how many records went.
fn purge(tx: &mut dyn Tx) -> Result<u64> {
    let top = tx
        .one("SELECT MAX(idx) FROM changelog", vals![])?
        .opt_i64(0)?;
    let Some(top) = top else { return Ok(0) };
    let upto = tx
        .one(
            "SELECT MIN(cleared) FROM changelog_readers WHERE state = 0",
            vals![],
        )?
        .opt_i64(0)?
        .unwrap_or(i64::MAX);
    let mut n = tx.exec(
        "DELETE FROM changelog WHERE idx <= $1 AND idx < $2",
        vals![upto, top],
    )?;
    if top <= upto {
        n += tx.exec(
            "UPDATE changelog SET type = 0, flags = 0, target = 0, parent = 0, name = $2, \
             sparent = NULL, sname = NULL, uid = 0, gid = 0, client = '', jobid = NULL \
             WHERE idx = $1 AND type <> 0",
            vals![top, &b""[..]],
        )?;
    }
    Ok(n)
}

const READER_COLS: &str = "id, mask, cleared, registered, last_used, idle_ns, follower_of";

fn reader_from_row(r: &Row) -> Result<ChangelogReader> {
    Ok(ChangelogReader {
        id: r.u64(0)?,
        mask: r.i64(1)?,
        cleared: r.u64(2)?,
        registered: r.i64(3)?,
        last_used: r.i64(4)?,
        idle_ns: r.i64(5)?,
        follower_of: r.opt_text(6)?,
    })
}

/// An active reader, or why there is none.
fn active_reader(tx: &mut dyn Tx, id: u64) -> Result<ChangelogReader> {
    let r = tx.query_opt(
        "SELECT id, mask, cleared, registered, last_used, idle_ns, follower_of, state \
         FROM changelog_readers WHERE id = $1",
        vals![id],
    )?;
    match r {
        Some(r) if r.i64(7)? == ACTIVE => reader_from_row(&r),
        Some(r) if r.i64(7)? == IDLE_DROPPED => {
            Err(ChangelogError::ReaderExpired { reader: id }.into())
        }
        _ => Err(ChangelogError::UnknownReader(id).into()),
    }
}

/// Drops readers idle past their idle time: they stop holding records (purged if no one else
/// needs them) and are listed as warnings until deregistered by hand.
fn expire(tx: &mut dyn Tx, now: Nanos) -> Result<Vec<IdleDeregistration>> {
    if !tx.exists(
        "SELECT EXISTS (SELECT 1 FROM changelog_readers \
         WHERE state = 0 AND last_used + idle_ns < $1)",
        vals![now],
    )? {
        return Ok(Vec::new());
    }
    let rows = tx.query(
        "UPDATE changelog_readers SET state = 2, ended = $1 \
         WHERE state = 0 AND last_used + idle_ns < $1 RETURNING id, cleared, last_used",
        vals![now],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(IdleDeregistration {
            reader: r.u64(0)?,
            cleared: r.u64(1)?,
            last_used: r.i64(2)?,
            at: now,
        });
    }
    if !out.is_empty() {
        purge(tx)?;
    }
    Ok(out)
}

fn record_from_row(r: &Row) -> Result<ChangelogRecord> {
    let num = r.i64(2)?;
    let typ = RecordType::from_num(num)
        .ok_or_else(|| MetaError::Db(format!("changelog record of unknown type {num}")))?;
    Ok(ChangelogRecord {
        index: r.u64(0)?,
        time: r.i64(1)?,
        typ,
        flags: r.u32(3)?,
        target: r.u64(4)?,
        parent: r.u64(5)?,
        name: r.blob(6)?,
        source_parent: r.opt_i64(7)?.map(|v| v as u64),
        source_name: r.opt_blob(8)?,
        uid: r.u32(9)?,
        gid: r.u32(10)?,
        client: r.text(11)?,
        jobid: r.opt_text(12)?,
    })
}

/// Runs `f` after dropping idle readers (logged), so a reader past its idle time is gone
/// before anyone reads, clears or registers; returns those dropped and `f`'s result.
fn expire_and<T>(
    tx: &mut dyn Tx,
    f: impl FnOnce(&mut dyn Tx, Nanos) -> Result<T>,
) -> Result<(Vec<IdleDeregistration>, T)> {
    let now = now_nanos();
    let dropped = expire(tx, now)?;
    for d in &dropped {
        tracing::warn!(
            reader = d.reader,
            "changelog reader cl{} deregistered: idle since its last use",
            d.reader
        );
    }
    Ok((dropped, f(tx, now)?))
}

impl<D: Driver> SqlMeta<D> {
    fn register_reader(&self, mask: Mask, idle: Duration, follows: Option<&str>) -> Result<u64> {
        if mask.0 & Mask::all().0 == 0 {
            return Err(MetaError::Invalid("empty changelog mask".into()));
        }
        // At most a century: `last_used + idle_ns` must not overflow.
        let idle_ns = idle.as_nanos().min(MAX_IDLE.as_nanos()) as i64;
        self.d.write(|tx| {
            if tx.dialect().is_postgres() {
                // Reader ids are MAX+1: take them one at a time, seeing the newest rows.
                tx.batch("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
                tx.int(
                    "SELECT 1 FROM (SELECT pg_advisory_xact_lock($1)) AS l",
                    vals![ORDER_LOCK],
                )?;
            }
            expire_and(tx, |tx, now| {
                let start = current_index(tx)?;
                let id = tx.int(
                    "INSERT INTO changelog_readers \
                     (id, mask, cleared, registered, last_used, idle_ns, state, follower_of) \
                     SELECT COALESCE(MAX(id), 0) + 1, CAST($1 AS BIGINT), CAST($2 AS BIGINT), \
                     CAST($3 AS BIGINT), CAST($3 AS BIGINT), CAST($4 AS BIGINT), 0, \
                     CAST($5 AS TEXT) FROM changelog_readers RETURNING id",
                    vals![mask.0, start, now, idle_ns, follows],
                )?;
                Ok(id as u64)
            })
            .map(|(_, v)| v)
        })
    }
}

impl<D: Driver> Changelog for SqlMeta<D> {
    fn changelog_register(&self, mask: Mask, idle: Duration) -> Result<u64> {
        self.register_reader(mask, idle, None)
    }

    fn changelog_register_follower(&self, mask: Mask, idle: Duration, client: &str) -> Result<u64> {
        self.register_reader(mask, idle, Some(client))
    }

    fn changelog_deregister(&self, reader: u64) -> Result<u64> {
        self.d.write(|tx| {
            expire_and(tx, |tx, now| {
                let n = tx.exec(
                    "UPDATE changelog_readers SET state = $2, ended = $3 \
                     WHERE id = $1 AND state IN (0, 2)",
                    vals![reader, DEREGISTERED, now],
                )?;
                if n == 0 {
                    return Err(ChangelogError::UnknownReader(reader).into());
                }
                purge(tx)
            })
            .map(|(_, v)| v)
        })
    }

    fn changelog_clear(&self, reader: u64, endrec: u64) -> Result<u64> {
        self.d.write(|tx| {
            expire_and(tx, |tx, now| {
                let r = active_reader(tx, reader)?;
                let last = current_index(tx)?;
                if endrec > last {
                    return Err(ChangelogError::ClearPastEnd { endrec, last }.into());
                }
                let upto = if endrec == 0 { last } else { endrec };
                tx.exec(
                    "UPDATE changelog_readers SET cleared = $2, last_used = $3 WHERE id = $1",
                    vals![reader, upto.max(r.cleared), now],
                )?;
                purge(tx)
            })
            .map(|(_, v)| v)
        })
    }

    fn changelog_read(
        &self,
        reader: Option<u64>,
        mask: Mask,
        start: u64,
        end: u64,
        limit: usize,
    ) -> Result<Vec<ChangelogRecord>> {
        let query = |tx: &mut dyn Tx, mask: i64, start: u64| -> Result<Vec<ChangelogRecord>> {
            let mut out = Vec::new();
            tx.query_each(
                "SELECT idx, time, type, flags, target, parent, name, sparent, sname, uid, gid, \
                 client, jobid FROM changelog \
                 WHERE idx >= $1 AND idx <= $2 AND type <> 0 \
                 AND ((CAST($3 AS BIGINT) >> CAST(type AS INTEGER)) & 1) = 1 \
                 ORDER BY idx LIMIT $4",
                vals![
                    start.min(i64::MAX as u64),
                    end.min(i64::MAX as u64),
                    mask,
                    limit.min(i64::MAX as usize)
                ],
                &mut |r| {
                    out.push(record_from_row(&r)?);
                    Ok(())
                },
            )?;
            Ok(out)
        };
        match reader {
            None => self.d.read(|tx| query(tx, mask.0, start)),
            Some(id) => {
                // A follower reads several times a second: its use is written down only when
                // the last note is older than a minute (or half its idle time), so reading
                // is a read, not a write transaction, almost every time.
                let now = now_nanos();
                let r = self.d.read(|tx| active_reader(tx, id))?;
                let every = (r.idle_ns / 2).min(60_000_000_000);
                let r = if now - r.last_used >= every {
                    self.d
                        .write(|tx| {
                            expire_and(tx, |tx, now| {
                                let r = active_reader(tx, id)?;
                                tx.exec(
                                    "UPDATE changelog_readers SET last_used = $2 WHERE id = $1",
                                    vals![id, now],
                                )?;
                                Ok(r)
                            })
                        })?
                        .1
                } else {
                    r
                };
                self.d
                    .read(|tx| query(tx, r.mask & mask.0, start.max(r.cleared + 1)))
            }
        }
    }

    fn changelog_status(&self) -> Result<ChangelogStatus> {
        self.d.write(|tx| {
            expire_and(tx, |tx, _now| {
                let mut st = ChangelogStatus::default();
                let sql = format!(
                    "SELECT {READER_COLS} FROM changelog_readers WHERE state = 0 ORDER BY id"
                );
                for r in tx.query(&sql, vals![])? {
                    st.readers.push(reader_from_row(&r)?);
                }
                let r = tx.one(
                    "SELECT MIN(idx), MAX(idx) FROM changelog WHERE type <> 0",
                    vals![],
                )?;
                st.first = r.opt_i64(0)?.map(|v| v as u64);
                st.last = r.opt_i64(1)?.map(|v| v as u64);
                st.current = current_index(tx)?;
                for r in tx.query(
                    "SELECT id, cleared, last_used, ended FROM changelog_readers \
                     WHERE state = 2 ORDER BY ended DESC, id DESC LIMIT $1",
                    vals![IDLE_WARNINGS],
                )? {
                    st.idle_deregistered.push(IdleDeregistration {
                        reader: r.u64(0)?,
                        cleared: r.u64(1)?,
                        last_used: r.i64(2)?,
                        at: r.opt_i64(3)?.unwrap_or(0),
                    });
                }
                Ok(st)
            })
            .map(|(_, v)| v)
        })
    }

    fn changelog_wanted(&self, client: &str) -> Result<Mask> {
        self.d.read(|tx| {
            let mut mask = 0i64;
            tx.query_each(
                "SELECT mask, follower_of FROM changelog_readers WHERE state = 0",
                vals![],
                &mut |r| {
                    let m = r.i64(0)?;
                    // a follower of `client` gets none of its records but HSM ones (the gates)
                    mask |= if r.opt_text(1)?.as_deref() == Some(client) {
                        m & RecordType::Hsm.bit()
                    } else {
                        m
                    };
                    Ok(())
                },
            )?;
            Ok(Mask(mask))
        })
    }

    fn changelog_expire(&self) -> Result<Vec<IdleDeregistration>> {
        // A cheap read first: most calls find nothing to do and then write nothing.
        let due = self.d.read(|tx| {
            tx.exists(
                "SELECT EXISTS (SELECT 1 FROM changelog_readers \
                 WHERE state = 0 AND last_used + idle_ns < $1)",
                vals![now_nanos()],
            )
        })?;
        if !due {
            return Ok(Vec::new());
        }
        self.d
            .write(|tx| expire_and(tx, |_, _| Ok(())))
            .map(|(d, ())| d)
    }
}

/// Checks of the changelog's storage on any driver, each on a fresh filesystem (run on SQLite
/// below and on PostgreSQL by `postgres::tests`). They write records with [`record`] directly;
/// `conformance` checks that the metadata operations write them.
#[cfg(test)]
pub(crate) mod checks {
    use std::any::Any;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::changelog::Caller;

    pub type Fresh<'a, D> = dyn Fn() -> (Box<dyn Any>, SqlMeta<D>) + 'a;
    type Check<D> = fn(&SqlMeta<D>);

    fn rec<D: Driver>(e: &SqlMeta<D>, typ: RecordType, ino: Ino) -> bool {
        e.d.write(|tx| record(tx, &Rec::new(typ, ino).at(1, b"n")))
            .unwrap()
    }

    fn count<D: Driver>(e: &SqlMeta<D>) -> i64 {
        e.d.read(|tx| tx.int("SELECT COUNT(*) FROM changelog WHERE type <> 0", vals![]))
            .unwrap()
    }

    fn all<D: Driver>(e: &SqlMeta<D>) -> Vec<ChangelogRecord> {
        e.changelog_read(None, Mask::all(), 0, u64::MAX, 10_000)
            .unwrap()
    }

    const DAY: Duration = Duration::from_secs(86_400);

    pub fn run_all<D: Driver>(fresh: &Fresh<'_, D>) {
        let checks: &[(&str, Check<D>)] = &[
            (
                "nothing_written_without_a_reader",
                nothing_written_without_a_reader,
            ),
            ("order_masks_and_fields", order_masks_and_fields),
            (
                "a_follower_gets_no_records_of_its_own_client",
                a_follower_gets_no_records_of_its_own_client,
            ),
            (
                "purge_after_every_reader_cleared",
                purge_after_every_reader_cleared,
            ),
            ("bad_reader_input", bad_reader_input),
            ("idle_reader_deregistered", idle_reader_deregistered),
            ("index_order_is_commit_order", index_order_is_commit_order),
        ];
        for (name, check) in checks {
            let (_guard, e) = fresh();
            eprintln!("changelog check: {name}");
            check(&e);
        }
    }

    /// Advisory locks this transaction holds after recording (PostgreSQL; 0 on SQLite).
    fn locks_after_record<D: Driver>(e: &SqlMeta<D>, typ: RecordType) -> i64 {
        e.d.write(|tx| {
            record(tx, &Rec::new(typ, 1))?;
            if !tx.dialect().is_postgres() {
                return Ok(0);
            }
            tx.int(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND pid = pg_backend_pid()",
                vals![],
            )
        })
        .unwrap()
    }

    fn nothing_written_without_a_reader<D: Driver>(e: &SqlMeta<D>) {
        assert!(!rec(e, RecordType::Creat, 5));
        assert_eq!(count(e), 0);
        // ... and nothing locked.
        assert_eq!(locks_after_record(e, RecordType::Creat), 0);
        // A reader of other types only: still nothing.
        let r = e
            .changelog_register(Mask::parse("MKDIR").unwrap(), DAY)
            .unwrap();
        assert!(!rec(e, RecordType::Creat, 5));
        assert_eq!(count(e), 0);
        assert_eq!(locks_after_record(e, RecordType::Creat), 0);
        assert!(rec(e, RecordType::Mkdir, 6));
        assert_eq!(count(e), 1);
        if e.d.dialect().is_postgres() {
            // The order lock is taken when a record is written.
            assert_eq!(locks_after_record(e, RecordType::Mkdir), 1);
            assert_eq!(count(e), 2);
        }
        // Several records of one operation: only the wanted types are written.
        let before = count(e);
        e.d.write(|tx| {
            record_all(
                tx,
                &[
                    Rec::new(RecordType::Creat, 8),
                    Rec::new(RecordType::Mkdir, 9),
                    Rec::new(RecordType::Open, 8),
                ],
            )
        })
        .unwrap();
        assert_eq!(count(e), before + 1);
        assert_eq!(all(e).last().unwrap().target, 9);
        // Gone again: nothing more, and what was held is purged.
        let held = count(e) as u64;
        assert_eq!(e.changelog_deregister(r).unwrap(), held);
        assert!(!rec(e, RecordType::Mkdir, 7));
        assert_eq!(count(e), 0);
        assert_eq!(e.changelog_status().unwrap().readers.len(), 0);
    }

    /// A follower's reader: its own client's records are not written for it (HSM ones are),
    /// another client's are; an ordinary reader still gets everything; the listing names the
    /// client followed.
    fn a_follower_gets_no_records_of_its_own_client<D: Driver>(e: &SqlMeta<D>) {
        let as_client = |name: &str| {
            Caller {
                uid: 0,
                gid: 0,
                client: Some(name.into()),
                jobid: None,
            }
            .enter()
        };
        let fa = e
            .changelog_register_follower(Mask::all(), DAY, "a")
            .unwrap();
        {
            let _c = as_client("a");
            assert!(!rec(e, RecordType::Creat, 20), "a's own create");
            assert!(rec(e, RecordType::Hsm, 21), "a mover's change to a's file");
            // Several records of one operation: the same rule for each.
            e.d.write(|tx| {
                record_all(
                    tx,
                    &[
                        Rec::new(RecordType::Creat, 22),
                        Rec::new(RecordType::Hsm, 23),
                    ],
                )
            })
            .unwrap();
        }
        assert_eq!(
            all(e).iter().map(|r| r.target).collect::<Vec<_>>(),
            [21, 23]
        );
        {
            let _c = as_client("b");
            assert!(rec(e, RecordType::Creat, 24), "b's create is news to a");
        }
        // b follows too: a's records are written again (for b), b's own still for a.
        let fb = e
            .changelog_register_follower(Mask::all(), DAY, "b")
            .unwrap();
        {
            let _c = as_client("a");
            assert!(rec(e, RecordType::Creat, 25));
        }
        e.changelog_deregister(fb).unwrap();
        // An ordinary reader wants every record, a's own too.
        let plain = e.changelog_register(Mask::all(), DAY).unwrap();
        {
            let _c = as_client("a");
            assert!(rec(e, RecordType::Creat, 26));
        }
        let st = e.changelog_status().unwrap();
        let follows: Vec<_> = st
            .readers
            .iter()
            .map(|r| (r.id, r.follower_of.clone()))
            .collect();
        assert_eq!(follows, [(fa, Some("a".to_string())), (plain, None)]);
    }

    fn order_masks_and_fields<D: Driver>(e: &SqlMeta<D>) {
        let a = e
            .changelog_register(Mask::parse("CREAT,UNLNK").unwrap(), DAY)
            .unwrap();
        let b = e.changelog_register(Mask::all(), DAY).unwrap();
        assert_ne!(a, b);
        {
            let _c = Caller {
                uid: 1000,
                gid: 100,
                client: Some("node7".into()),
                jobid: Some("job-1".into()),
            }
            .enter();
            assert!(rec(e, RecordType::Creat, 10));
        }
        assert!(rec(e, RecordType::Mkdir, 11));
        e.d.write(|tx| {
            record(
                tx,
                &Rec::new(RecordType::Renme, 10)
                    .at(11, b"to")
                    .from(1, b"from\xff"),
            )
        })
        .unwrap();
        assert!(rec(e, RecordType::Unlnk, 10));
        let v = all(e);
        let types: Vec<RecordType> = v.iter().map(|r| r.typ).collect();
        assert_eq!(
            types,
            [
                RecordType::Creat,
                RecordType::Mkdir,
                RecordType::Renme,
                RecordType::Unlnk
            ]
        );
        assert!(v.windows(2).all(|w| w[0].index < w[1].index), "{v:?}");
        let c = &v[0];
        assert_eq!((c.uid, c.gid, c.target, c.parent), (1000, 100, 10, 1));
        assert_eq!(c.client, "node7");
        assert_eq!(c.jobid.as_deref(), Some("job-1"));
        assert_eq!(c.name, b"n");
        assert!(c.time > 0);
        let m = &v[1];
        assert_eq!(m.jobid, None);
        let r = &v[2];
        assert_eq!((r.parent, r.name.as_slice()), (11, &b"to"[..]));
        assert_eq!(r.source_parent, Some(1));
        assert_eq!(r.source_name.as_deref(), Some(&b"from\xff"[..]));
        // Each reader sees its own mask; --types narrows further; START/END bound.
        let ra = e
            .changelog_read(Some(a), Mask::all(), 0, u64::MAX, 100)
            .unwrap();
        assert_eq!(
            ra.iter().map(|r| r.typ).collect::<Vec<_>>(),
            [RecordType::Creat, RecordType::Unlnk]
        );
        let rb = e
            .changelog_read(
                Some(b),
                Mask::parse("MKDIR,RENME").unwrap(),
                0,
                u64::MAX,
                100,
            )
            .unwrap();
        assert_eq!(rb.len(), 2);
        let mid = e
            .changelog_read(None, Mask::all(), v[1].index, v[2].index, 100)
            .unwrap();
        assert_eq!(mid, v[1..3].to_vec());
        let one = e.changelog_read(None, Mask::all(), 0, u64::MAX, 1).unwrap();
        assert_eq!(one, v[..1].to_vec());
        // A reader registered now starts after what exists.
        let c = e.changelog_register(Mask::all(), DAY).unwrap();
        assert!(e
            .changelog_read(Some(c), Mask::all(), 0, u64::MAX, 100)
            .unwrap()
            .is_empty());
        let st = e.changelog_status().unwrap();
        assert_eq!(st.readers.len(), 3);
        assert_eq!(st.first, Some(v[0].index));
        assert_eq!(st.last, Some(v[3].index));
        assert_eq!(st.current, v[3].index);
    }

    fn purge_after_every_reader_cleared<D: Driver>(e: &SqlMeta<D>) {
        let a = e.changelog_register(Mask::all(), DAY).unwrap();
        let b = e.changelog_register(Mask::all(), DAY).unwrap();
        for i in 0..5 {
            rec(e, RecordType::Creat, 100 + i);
        }
        let v = all(e);
        assert_eq!(v.len(), 5);
        // a clears 3: b still needs them all.
        assert_eq!(e.changelog_clear(a, v[2].index).unwrap(), 0);
        assert_eq!(count(e), 5);
        assert_eq!(
            e.changelog_read(Some(a), Mask::all(), 0, u64::MAX, 100)
                .unwrap()
                .len(),
            2
        );
        // b clears 4: the first 3 are cleared by both.
        assert_eq!(e.changelog_clear(b, v[3].index).unwrap(), 3);
        assert_eq!(count(e), 2);
        // Clearing backwards changes nothing.
        assert_eq!(e.changelog_clear(b, v[0].index).unwrap(), 0);
        assert_eq!(
            e.changelog_read(Some(b), Mask::all(), 0, u64::MAX, 100)
                .unwrap()
                .len(),
            1
        );
        // 0 clears everything written so far.
        assert_eq!(e.changelog_clear(a, 0).unwrap(), 1);
        assert_eq!(e.changelog_clear(b, 0).unwrap(), 1);
        assert_eq!(count(e), 0);
        // Indexes are never reused after a purge.
        rec(e, RecordType::Creat, 200);
        let w = all(e);
        assert_eq!(w.len(), 1);
        assert!(w[0].index > v[4].index);
        assert_eq!(e.changelog_status().unwrap().current, w[0].index);
    }

    fn bad_reader_input<D: Driver>(e: &SqlMeta<D>) {
        let unknown = |r: Result<u64>| {
            matches!(
                r,
                Err(MetaError::Changelog(ChangelogError::UnknownReader(9)))
            )
        };
        assert!(unknown(e.changelog_clear(9, 0)));
        assert!(unknown(e.changelog_deregister(9)));
        assert!(matches!(
            e.changelog_read(Some(9), Mask::all(), 0, u64::MAX, 10),
            Err(MetaError::Changelog(ChangelogError::UnknownReader(9)))
        ));
        let a = e.changelog_register(Mask::all(), DAY).unwrap();
        rec(e, RecordType::Creat, 1);
        let last = all(e)[0].index;
        match e.changelog_clear(a, last + 1) {
            Err(MetaError::Changelog(ChangelogError::ClearPastEnd { endrec, last: l })) => {
                assert_eq!((endrec, l), (last + 1, last))
            }
            other => panic!("clear past the end: {other:?}"),
        }
        // Nothing was lost by the refused clear.
        assert_eq!(count(e), 1);
        e.changelog_deregister(a).unwrap();
        // A deregistered reader is unknown from then on; its id is not reused.
        assert!(matches!(
            e.changelog_clear(a, 0),
            Err(MetaError::Changelog(ChangelogError::UnknownReader(_)))
        ));
        let b = e.changelog_register(Mask::all(), DAY).unwrap();
        assert!(b > a);
        // The last reader's deregistration purged everything; numbering goes on.
        assert_eq!(count(e), 0);
        rec(e, RecordType::Creat, 2);
        assert_eq!(all(e)[0].index, last + 1);
    }

    fn idle_reader_deregistered<D: Driver>(e: &SqlMeta<D>) {
        // Seconds of slack around each step: the suite runs beside other tests.
        let idle = e
            .changelog_register(Mask::all(), Duration::from_secs(3))
            .unwrap();
        let busy = e.changelog_register(Mask::all(), DAY).unwrap();
        rec(e, RecordType::Creat, 1);
        rec(e, RecordType::Creat, 2);
        assert!(e.changelog_expire().unwrap().is_empty());
        // Reading with its id counts as use.
        std::thread::sleep(Duration::from_secs(2));
        e.changelog_read(Some(idle), Mask::all(), 0, u64::MAX, 10)
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        assert!(e.changelog_expire().unwrap().is_empty());
        e.changelog_clear(busy, 0).unwrap();
        // The busy reader cleared everything; the idle one holds the records.
        assert_eq!(count(e), 2);
        std::thread::sleep(Duration::from_millis(3500));
        let gone = e.changelog_expire().unwrap();
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].reader, idle);
        // What only it held is purged, and status warns about it.
        assert_eq!(count(e), 0);
        let st = e.changelog_status().unwrap();
        assert_eq!(st.readers.len(), 1);
        assert_eq!(st.idle_deregistered.len(), 1);
        assert_eq!(st.idle_deregistered[0].reader, idle);
        assert!(matches!(
            e.changelog_read(Some(idle), Mask::all(), 0, u64::MAX, 10),
            Err(MetaError::Changelog(ChangelogError::ReaderExpired { .. }))
        ));
        // Deregistering it by hand dismisses the warning.
        e.changelog_deregister(idle).unwrap();
        assert!(e.changelog_status().unwrap().idle_deregistered.is_empty());
        assert!(e.changelog_expire().unwrap().is_empty());
    }

    /// A follower that reads "everything after the last index I saw" never misses a record:
    /// no record commits with a lower index than one already visible. Writers hold their
    /// transaction open for a while after recording, in different orders.
    fn index_order_is_commit_order<D: Driver>(e: &SqlMeta<D>) {
        e.changelog_register(Mask::all(), DAY).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writers = 4;
        let per = 15;
        std::thread::scope(|s| {
            for w in 0..writers {
                s.spawn(move || {
                    for i in 0..per {
                        e.d.write(|tx| {
                            record(tx, &Rec::new(RecordType::Creat, (w * 1000 + i) as u64))?;
                            // Hold the transaction open after taking an index.
                            std::thread::sleep(Duration::from_millis(((w * 7 + i) % 5) as u64));
                            Ok(())
                        })
                        .unwrap();
                    }
                });
            }
            let stop2 = Arc::clone(&stop);
            let follower = s.spawn(move || {
                let mut seen: Vec<u64> = Vec::new();
                let mut next = 0;
                loop {
                    let done = stop2.load(Ordering::SeqCst);
                    let v = e
                        .changelog_read(None, Mask::all(), next, u64::MAX, 1000)
                        .unwrap();
                    for r in &v {
                        seen.push(r.index);
                        next = r.index + 1;
                    }
                    if done {
                        return seen;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            // Wait for the writers (every thread but the follower) by polling the count.
            let t = std::time::Instant::now();
            while count(e) < (writers * per) as i64 {
                assert!(t.elapsed() < Duration::from_secs(60), "writers too slow");
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, Ordering::SeqCst);
            let seen = follower.join().unwrap();
            let total = all(e);
            assert_eq!(total.len(), writers * per);
            assert_eq!(
                seen.len(),
                total.len(),
                "the follower missed records that committed behind a higher index"
            );
        });
    }

    /// A v5 filesystem (before the changelog) upgraded on open gets working changelog tables.
    #[test]
    fn an_upgraded_v5_filesystem_records() {
        use crate::engine::Namespace;
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("m.db");
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/src/core/testdata/v5.sqlite"),
            &db,
        )
        .unwrap();
        assert_eq!(
            crate::url::schema_version(&format!("sqlite://{}", db.display())).unwrap(),
            Some(5)
        );
        let e = crate::sqlite::SqliteMeta::open(&db).unwrap();
        assert!(all(&e).is_empty());
        let r = e.changelog_register(Mask::all(), DAY).unwrap();
        let f = e
            .create(
                ROOT_INO,
                b"after-upgrade",
                &NewNode {
                    kind: Kind::File,
                    perm: 0o644,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    symlink: None,
                },
                None,
                None,
            )
            .unwrap();
        let v = e
            .changelog_read(Some(r), Mask::all(), 0, u64::MAX, 10)
            .unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].typ, v[0].target), (RecordType::Creat, f.ino));
    }

    #[test]
    fn on_sqlite() {
        run_all(&|| {
            let d = tempfile::tempdir().unwrap();
            let e = crate::sqlite::SqliteMeta::format(
                &d.path().join("m.db"),
                &crate::conformance::params(),
            )
            .unwrap();
            (Box::new(d) as Box<dyn Any>, e)
        });
    }
}
