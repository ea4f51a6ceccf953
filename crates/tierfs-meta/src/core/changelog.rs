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
//! writer at a time; the index is `AUTOINCREMENT`, never reused even after a purge). On
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

use super::SqlMeta;
use crate::changelog::{
    for_ino, ChangelogError, ChangelogReader, ChangelogRecord, ChangelogStatus, IdleDeregistration,
    Mask, RecordType,
};
use crate::engine::Changelog;
use crate::error::{MetaError, Result};
use crate::sql::{Driver, Row, Tx};
use crate::types::*;
use crate::vals;

/// The changelog's tables (schema v6).
///
/// - `changelog`: one row per record; `idx` is the record's index (SQLite `AUTOINCREMENT`,
///   never reused; PostgreSQL sequence `changelog_idx_seq`, ordered by [`ORDER_LOCK`]).
///   `type` is the Lustre number of [`RecordType`]; `sparent`/`sname` are set for renames.
/// - `changelog_readers`: registered readers, never deleted (ids are not reused): `mask` (bit
///   `1 << type`), `cleared` (records up to it are done for this reader), `last_used` and
///   `idle_ns` (idle expiry), `state` (0 active, 1 deregistered, 2 dropped for idleness, shown
///   by `tierfs status` until deregistered by hand), `ended` (when it stopped).
pub const SCHEMA: crate::core::schema::Ddl = &[
    "CREATE TABLE changelog (
        idx SERIAL,
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
    WHERE EXISTS (SELECT 1 FROM changelog_readers WHERE state = 0 AND (mask & $13) <> 0)";

// The gate's WHERE is evaluated before its select list, so the lock is taken only when a
// reader wants the record; the index (the column's sequence default) is drawn when the row is
// inserted, after the lock.
const INSERT_PG: &str = "INSERT INTO changelog \
    (time, type, flags, target, parent, name, sparent, sname, uid, gid, client, jobid) \
    SELECT $1::BIGINT, $2::INTEGER, $3::INTEGER, $4::BIGINT, $5::BIGINT, $6::BYTEA, \
    $7::BIGINT, $8::BYTEA, $9::BIGINT, $10::BIGINT, $11::TEXT, $12::TEXT \
    FROM (SELECT pg_advisory_xact_lock(7882522153839479911) AS locked \
    WHERE EXISTS (SELECT 1 FROM changelog_readers WHERE state = 0 AND (mask & $13::BIGINT) <> 0)) \
    AS gate";

/// Writes `rec` in the caller's transaction if a registered reader's mask includes its type
/// (one statement; nothing is written otherwise). The record names the caller of this thread
/// (`crate::changelog::for_ino`). Returns whether a record was written.
pub fn record(tx: &mut dyn Tx, rec: &Rec<'_>) -> Result<bool> {
    let c = for_ino(rec.target);
    let client = c.client_name();
    let sql = if tx.dialect().is_postgres() {
        INSERT_PG
    } else {
        INSERT_SQLITE
    };
    let n = tx.exec(
        sql,
        vals![
            now_nanos(),
            rec.typ as i64,
            rec.flags as i64,
            rec.target,
            rec.parent,
            rec.name,
            rec.source.map(|s| s.0),
            rec.source.map(|s| s.1),
            c.uid as i64,
            c.gid as i64,
            &*client,
            c.jobid.as_deref(),
            rec.typ.bit(),
        ],
    )?;
    if n > 0 {
        // Wakes followers on PostgreSQL (one notice per transaction: identical ones merge).
        tx.notify(NOTIFY_CHANNEL, "")?;
    }
    Ok(n > 0)
}

/// The NOTIFY channel followers listen on.
pub const NOTIFY_CHANNEL: &str = "tierfs_changelog";

/// The highest index handed out so far (0: none).
fn current_index(tx: &mut dyn Tx) -> Result<u64> {
    let sql = if tx.dialect().is_postgres() {
        // Not transactional: a number taken by a transaction that later rolled back counts.
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM changelog_idx_seq"
    } else {
        "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'changelog'), 0)"
    };
    Ok(tx.int(sql, vals![])?.max(0) as u64)
}

/// Deletes records that every active reader has cleared (all of them when none is left).
fn purge(tx: &mut dyn Tx) -> Result<u64> {
    tx.exec(
        "DELETE FROM changelog WHERE idx <= COALESCE( \
         (SELECT MIN(cleared) FROM changelog_readers WHERE state = 0), $1)",
        vals![i64::MAX],
    )
}

const READER_COLS: &str = "id, mask, cleared, registered, last_used, idle_ns";

fn reader_from_row(r: &Row) -> Result<ChangelogReader> {
    Ok(ChangelogReader {
        id: r.u64(0)?,
        mask: r.i64(1)?,
        cleared: r.u64(2)?,
        registered: r.i64(3)?,
        last_used: r.i64(4)?,
        idle_ns: r.i64(5)?,
    })
}

/// An active reader, or why there is none.
fn active_reader(tx: &mut dyn Tx, id: u64) -> Result<ChangelogReader> {
    let r = tx.query_opt(
        "SELECT id, mask, cleared, registered, last_used, idle_ns, state \
         FROM changelog_readers WHERE id = $1",
        vals![id],
    )?;
    match r {
        Some(r) if r.i64(6)? == ACTIVE => reader_from_row(&r),
        Some(r) if r.i64(6)? == IDLE_DROPPED => {
            Err(ChangelogError::ReaderExpired { reader: id }.into())
        }
        _ => Err(ChangelogError::UnknownReader(id).into()),
    }
}

/// Drops readers idle past their idle time: they stop holding records (purged if no one else
/// needs them) and are listed as warnings until deregistered by hand.
fn expire(tx: &mut dyn Tx, now: Nanos) -> Result<Vec<IdleDeregistration>> {
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

impl<D: Driver> Changelog for SqlMeta<D> {
    fn changelog_register(&self, mask: Mask, idle: Duration) -> Result<u64> {
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
                     (id, mask, cleared, registered, last_used, idle_ns, state) \
                     SELECT COALESCE(MAX(id), 0) + 1, CAST($1 AS BIGINT), CAST($2 AS BIGINT), \
                     CAST($3 AS BIGINT), CAST($3 AS BIGINT), CAST($4 AS BIGINT), 0 \
                     FROM changelog_readers RETURNING id",
                    vals![mask.0, start, now, idle_ns],
                )?;
                Ok(id as u64)
            })
            .map(|(_, v)| v)
        })
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
                 WHERE idx >= $1 AND idx <= $2 AND ((CAST($3 AS BIGINT) >> type) & 1) = 1 \
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
            Some(id) => self.d.write(|tx| {
                expire_and(tx, |tx, now| {
                    let r = active_reader(tx, id)?;
                    tx.exec(
                        "UPDATE changelog_readers SET last_used = $2 WHERE id = $1",
                        vals![id, now],
                    )?;
                    query(tx, r.mask & mask.0, start.max(r.cleared + 1))
                })
                .map(|(_, v)| v)
            }),
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
                let r = tx.one("SELECT MIN(idx), MAX(idx) FROM changelog", vals![])?;
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
