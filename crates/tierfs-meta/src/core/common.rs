//! Row decoding and small helpers shared by the core's domains.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::error::{MetaError, Result};
use crate::sql::{Row, Tx, Value};
use crate::types::*;
use crate::vals;

/// Most names one file may have.
pub const MAX_LINKS: i64 = 65000;

// A file's `inodes.orphan`: what keeps a file without names, and what frees it.
//
// - 0: it has a name (or is a directory, the root, or a file being linked in).
// - 1: its last name went while some client had it open: readable and writable through those
//   opens (and by inode number, `getattr`, an open by handle); its last close frees it
//   (`purge_if_orphan`).
// - 2: a rename replaced its last name: openable by number for
//   [`crate::engine::ORPHAN_GRACE`], then freed by `purge_orphans` (`retire_inode`).
// - 3 ([`PENDING`]): its last name went while nobody had it open: gone for every request
//   (every read of attributes and every inode lock leaves it out, [`VISIBLE`]), its rows, inline
//   bytes and objects freed by `purge_unlinked` in batches, off the unlink's request
//   (`drop_inode`). `usage` does not count it.

/// `inodes.orphan` of a file left for the purge (see above).
pub const PENDING: i64 = 3;

/// The condition on an `inodes` row (unqualified) that it is there for requests: not a file
/// left for the purge.
pub const VISIBLE: &str = "orphan <> 3";

/// Columns of `inodes` that [`attr_from_row`] reads, in order.
pub const ATTR_COLS: &str =
    "ino, kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime, crtime, \
     projid, data_version, stripe_size, stripe_targets, def_stripe_count, def_stripe_size, parent, \
     allocated, hsm, xattr_count";

/// [`ATTR_COLS`] qualified by the alias `i` (`i.ino, i.kind, ...`), for joins.
pub const ATTR_COLS_I: &str =
    "i.ino, i.kind, i.perm, i.uid, i.gid, i.nlink, i.size, i.rdev, i.atime, i.mtime, i.ctime, \
     i.crtime, i.projid, i.data_version, i.stripe_size, i.stripe_targets, i.def_stripe_count, \
     i.def_stripe_size, i.parent, i.allocated, i.hsm, i.xattr_count";

/// An [`Attr`] from a row whose first columns are [`ATTR_COLS`].
pub fn attr_from_row(r: &Row) -> Result<Attr> {
    let kind = Kind::from_i64(r.i64(1)?).unwrap_or(Kind::File);
    let stripe_size = r.i64(14)?;
    let layout = if kind == Kind::File && stripe_size > 0 {
        Some(Layout {
            stripe_size: stripe_size as u64,
            targets: Layout::decode_targets(&r.text(15)?),
        })
    } else {
        None
    };
    Ok(Attr {
        ino: r.u64(0)?,
        kind,
        perm: r.u32(2)?,
        uid: r.u32(3)?,
        gid: r.u32(4)?,
        nlink: r.u32(5)?,
        size: r.u64(6)?,
        rdev: r.u32(7)?,
        atime: r.i64(8)?,
        mtime: r.i64(9)?,
        ctime: r.i64(10)?,
        crtime: r.i64(11)?,
        projid: r.u32(12)?,
        data_version: r.u64(13)?,
        layout,
        dir_default: StripeDefault {
            stripe_count: r.u32(16)?,
            stripe_size: r.u64(17)?,
        },
        parent: r.u64(18)?,
        allocated: r.i64(19)?.max(0) as u64,
        hsm: crate::hsm::HsmFlags(r.u32(20)?),
        xattr_count: r.u32(21)?,
    })
}

/// The attributes of `ino`; `NotFound` when it does not exist or is left for the purge.
pub fn get_attr(tx: &mut dyn Tx, ino: Ino) -> Result<Attr> {
    const SQL: &str = "SELECT ino, kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime, \
        crtime, projid, data_version, stripe_size, stripe_targets, def_stripe_count, \
        def_stripe_size, parent, allocated, hsm, xattr_count FROM inodes WHERE ino = $1 \
        AND orphan <> 3";
    attr_from_row(&tx.one(SQL, vals![ino])?)
}

/// Checks a new name: not empty, no `/` or NUL, at most [`NAME_MAX`] bytes.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(MetaError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(MetaError::Invalid("bad file name".into()));
    }
    Ok(())
}

/// Bytes of one chunk of `ino` that hold data (see [`crate::types::allocated_bytes`]).
pub fn chunk_allocated(tx: &mut dyn Tx, ino: Ino, chunk: u64) -> Result<u64> {
    let mut v = Vec::new();
    tx.query_each(
        "SELECT off, len, obj IS NULL AND inline IS NULL FROM slices \
         WHERE ino = $1 AND chunk = $2 ORDER BY seq",
        vals![ino, chunk],
        &mut |r| {
            v.push((r.u64(0)?, r.u64(1)?, r.bool(2)?));
            Ok(())
        },
    )?;
    Ok(crate::types::allocated_bytes(&v))
}

/// Sum of [`chunk_allocated`] over `chunks` (each counted once).
pub fn chunks_allocated(tx: &mut dyn Tx, ino: Ino, chunks: &[u64]) -> Result<u64> {
    let mut list = chunks.to_vec();
    list.sort_unstable();
    list.dedup();
    let mut n = 0;
    for ch in list {
        n += chunk_allocated(tx, ino, ch)?;
    }
    Ok(n)
}

/// Moves a file's allocated bytes by `after - before` (the chunks a transaction touched,
/// counted before and after it changed them).
pub fn add_allocated(tx: &mut dyn Tx, ino: Ino, before: u64, after: u64) -> Result<()> {
    if before != after {
        tx.exec(
            "UPDATE inodes SET allocated = GREATEST(0, allocated + $2) WHERE ino = $1",
            vals![ino, after as i64 - before as i64],
        )?;
    }
    Ok(())
}

/// Counts a file's allocated bytes from all its slices.
pub fn recount_file(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    let mut chunks = Vec::new();
    tx.query_each(
        "SELECT DISTINCT chunk FROM slices WHERE ino = $1",
        vals![ino],
        &mut |r| {
            chunks.push(r.u64(0)?);
            Ok(())
        },
    )?;
    let n = chunks_allocated(tx, ino, &chunks)?;
    tx.exec(
        "UPDATE inodes SET allocated = $2 WHERE ino = $1",
        vals![ino, n],
    )?;
    Ok(())
}

/// Counts every file's allocated bytes (migration to v5, load of a dump).
pub fn recount_all(tx: &mut dyn Tx) -> Result<()> {
    let mut inos = Vec::new();
    tx.query_each("SELECT DISTINCT ino FROM slices", vals![], &mut |r| {
        inos.push(r.u64(0)?);
        Ok(())
    })?;
    tx.exec("UPDATE inodes SET allocated = 0", vals![])?;
    for ino in inos {
        recount_file(tx, ino)?;
    }
    Ok(())
}

/// Counts every inode's extended attributes into `inodes.xattr_count` (migration to v9, load
/// of a dump).
pub fn recount_xattrs(tx: &mut dyn Tx) -> Result<()> {
    tx.exec(
        "UPDATE inodes SET xattr_count = 0 WHERE xattr_count <> 0",
        vals![],
    )?;
    tx.exec(
        "UPDATE inodes SET xattr_count = \
         (SELECT COUNT(*) FROM xattrs x WHERE x.ino = inodes.ino) \
         WHERE ino IN (SELECT ino FROM xattrs)",
        vals![],
    )?;
    Ok(())
}

/// A directory's attributes: `NotFound` when it does not exist, `NotDir` when it is something
/// else.
pub fn dir_attr(tx: &mut dyn Tx, ino: Ino) -> Result<Attr> {
    let a = get_attr(tx, ino)?;
    is_dir(&a)?;
    Ok(a)
}

/// `NotDir` unless `a` is a directory.
pub fn is_dir(a: &Attr) -> Result<()> {
    if a.kind != Kind::Dir {
        return Err(MetaError::NotDir);
    }
    Ok(())
}

/// Takes the row locks of inodes, in ascending inode number, and returns their attributes;
/// inodes that do not exist, or are left for the purge ([`PENDING`]), are left out.
///
/// PostgreSQL (see the lock order at the top of `postgres/mod.rs`): one statement that
/// *updates* each row (`SET ino = ino`, a real new row version: under REPEATABLE READ a mere
/// `FOR UPDATE` of a row another transaction only locked is no conflict), so two transactions
/// on one inode serialise. SQLite has one writer at a time: a plain read of the same rows.
pub fn lock_inodes(tx: &mut dyn Tx, inos: &[Ino]) -> Result<BTreeMap<Ino, Attr>> {
    let mut ids: Vec<i64> = inos.iter().map(|i| *i as i64).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let mut take = |r: Row| {
        let a = attr_from_row(&r)?;
        out.insert(a.ino, a);
        Ok(())
    };
    if tx.dialect().row_locks() {
        tx.query_each(lock_sql(), &[Value::IntList(ids)], &mut take)?;
    } else if ids.len() <= SMALL_SETS {
        // A few rows (the usual 1 to 4): `IN ($1, ...)`, no list to encode and decode.
        let params: Vec<Value> = ids.into_iter().map(Value::Int).collect();
        tx.query_each(attrs_in_sql(params.len()), &params, &mut take)?;
    } else {
        tx.query_each(attrs_sql(), &[Value::IntList(ids)], &mut take)?;
    }
    Ok(out)
}

/// Up to this many inodes, [`lock_inodes`] on SQLite names them one placeholder each.
const SMALL_SETS: usize = 4;

/// `SELECT <attrs> FROM inodes WHERE ino IN ($1, ..., $n)`, for 1 <= n <= [`SMALL_SETS`].
fn attrs_in_sql(n: usize) -> &'static str {
    static S: OnceLock<Vec<String>> = OnceLock::new();
    let v = S.get_or_init(|| {
        (1..=SMALL_SETS)
            .map(|n| {
                let ph: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
                format!(
                    "SELECT {ATTR_COLS} FROM inodes WHERE ino IN ({}) AND {VISIBLE}",
                    ph.join(", ")
                )
            })
            .collect()
    });
    &v[n - 1]
}

fn attrs_sql() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| format!("SELECT {ATTR_COLS} FROM inodes WHERE ino = ANY($1) AND {VISIBLE}"))
}

fn lock_sql() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| {
        format!(
            "WITH l AS (SELECT ino FROM inodes WHERE ino = ANY($1) AND {VISIBLE} \
                 ORDER BY ino FOR UPDATE) \
             UPDATE inodes i SET ino = i.ino FROM l WHERE i.ino = l.ino RETURNING {ATTR_COLS_I}"
        )
    })
}

/// Locks one inode ([`lock_inodes`]); `NotFound` when it does not exist.
pub fn lock1(tx: &mut dyn Tx, ino: Ino) -> Result<Attr> {
    lock_inodes(tx, &[ino])?
        .remove(&ino)
        .ok_or(MetaError::NotFound)
}

/// (dentry id, ino, kind) of a name.
pub fn find_dentry(tx: &mut dyn Tx, parent: Ino, name: &[u8]) -> Result<Option<(i64, Ino, Kind)>> {
    tx.query_opt(
        "SELECT id, ino, kind FROM dentries WHERE parent = $1 AND name = $2",
        vals![parent, name],
    )?
    .map(|r| {
        Ok((
            r.i64(0)?,
            r.u64(1)?,
            Kind::from_i64(r.i64(2)?).unwrap_or(Kind::File),
        ))
    })
    .transpose()
}

/// Sets a directory's mtime and ctime to `now` and moves its link count by `nlink_delta`.
pub fn touch_dir(tx: &mut dyn Tx, dir: Ino, now: Nanos, nlink_delta: i64) -> Result<()> {
    tx.exec(
        "UPDATE inodes SET mtime = $2, ctime = $2, nlink = nlink + $3 WHERE ino = $1",
        vals![dir, now, nlink_delta],
    )?;
    Ok(())
}

/// Takes one link from `ino` (and sets its ctime); returns the links left (`None`: no such
/// inode). On SQLite an `UPDATE ... RETURNING` opens a statement journal (a page copy per
/// changed page, and its memory allocated and freed each time), so there the count is read
/// back with a plain `SELECT` instead: avoid `UPDATE`/`DELETE ... RETURNING` on SQLite's hot
/// paths.
pub fn drop_link(tx: &mut dyn Tx, ino: Ino, now: Nanos) -> Result<Option<i64>> {
    if tx.dialect().is_postgres() {
        return tx
            .query_opt(
                "UPDATE inodes SET nlink = nlink - 1, ctime = $2 WHERE ino = $1 RETURNING nlink",
                vals![ino, now],
            )?
            .map(|r| r.i64(0))
            .transpose();
    }
    tx.exec(
        "UPDATE inodes SET nlink = nlink - 1, ctime = $2 WHERE ino = $1",
        vals![ino, now],
    )?;
    tx.query_opt("SELECT nlink FROM inodes WHERE ino = $1", vals![ino])?
        .map(|r| r.i64(0))
        .transpose()
}

/// The statement that counts one more open of a file by a session, only under a session that
/// still exists (the check is a primary-key lookup inside the insert), with `session` and `ino`
/// as its placeholders for them ([`record_open`], and the PostgreSQL statement that also writes
/// the changelog's OPEN record, `changelog::record_open_logged`).
pub fn open_upsert_sql(session: &str, ino: &str) -> String {
    format!(
        "INSERT INTO open_files (session, ino, count) SELECT {session}, {ino}, 1 \
         WHERE EXISTS (SELECT 1 FROM sessions WHERE id = {session}) \
         ON CONFLICT (ino, session) DO UPDATE SET count = open_files.count + 1"
    )
}

/// Counts one more open of `ino` by `session`.
pub fn record_open(tx: &mut dyn Tx, session: u64, ino: Ino) -> Result<()> {
    // On PostgreSQL the caller holds the session's row first (`session::hold_session`), so a
    // concurrent reap cannot interleave.
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| open_upsert_sql("$1", "$2"));
    let n = tx.exec(sql, vals![session, ino])?;
    if n == 0 {
        return Err(MetaError::SessionEnded(session));
    }
    Ok(())
}

/// Columns [`slice_from_row`] reads, in order.
pub const SLICE_COLS: &str = "seq, chunk, off, len, target, obj, inline, obj_off, obj_size";

/// A [`Slice`] from a row whose first columns are [`SLICE_COLS`].
pub fn slice_from_row(r: &mut Row) -> Result<Slice> {
    let target = r.opt_i64(4)?;
    let obj = r.opt_i64(5)?;
    let data = match (target, obj) {
        (Some(t), Some(o)) => SliceData::Object {
            target: t as u32,
            obj: o as u64,
            obj_off: r.u64(7)?,
            obj_size: r.u64(8)?,
        },
        _ => match r.take_blob(6)? {
            Some(b) => SliceData::Inline(b),
            None => SliceData::Zero,
        },
    };
    Ok(Slice {
        seq: r.u64(0)?,
        chunk: r.u64(1)?,
        off: r.u64(2)?,
        len: r.u64(3)?,
        data,
    })
}

/// Inserts one slice (its `seq` is the next one: commit order).
pub fn insert_slice(tx: &mut dyn Tx, ino: Ino, s: &Slice) -> Result<()> {
    insert_slices(tx, ino, std::slice::from_ref(s))
}

/// Deletes the selected slices of `ino` (`where_sql` uses `$2`.. for `args`); objects no
/// remaining slice references go to the trash.
///
/// On SQLite the rows' objects are read first and the rows then go by a plain `DELETE`:
/// SQLite runs `DELETE ... RETURNING` like a trigger, which loads every column of each
/// deleted row (a slice's inline bytes, read back from their overflow pages: 32 page reads for
/// a 32 KiB file with 1 KiB pages) and keeps a statement journal. The `SELECT` reads only the
/// columns before `inline`, which live on the row's own page.
pub fn trash_slices(tx: &mut dyn Tx, ino: Ino, where_sql: &str, args: &[i64]) -> Result<()> {
    let mut params: Vec<Value> = Vec::with_capacity(args.len() + 1);
    params.push(ino.into());
    params.extend(args.iter().map(|a| Value::Int(*a)));
    let mut gone: Vec<(i64, i64, i64)> = Vec::new();
    // The slices' condition beside `ino = $1`.
    let filter = match where_sql {
        "TRUE" => String::new(),
        w => format!(" AND ({w})"),
    };
    let mut collect = |r: Row| -> Result<()> {
        if let (Some(t), Some(o)) = (r.opt_i64(0)?, r.opt_i64(1)?) {
            gone.push((t, o, r.i64(2)?));
        }
        Ok(())
    };
    if tx.dialect().is_postgres() {
        let delete =
            format!("DELETE FROM slices WHERE ino = $1{filter} RETURNING target, obj, obj_size");
        tx.query_each(&delete, &params, &mut collect)?;
    } else {
        let select = format!(
            "SELECT target, obj, obj_size FROM slices WHERE ino = $1{filter} AND obj IS NOT NULL"
        );
        tx.query_each(&select, &params, &mut collect)?;
        tx.exec(
            &format!("DELETE FROM slices WHERE ino = $1{filter}"),
            &params,
        )?;
    }
    gone.sort_unstable();
    gone.dedup();
    if gone.is_empty() {
        return Ok(());
    }
    // The database's clock: the grace (`FileData::trash`) is judged by it, whichever client's
    // collector looks.
    let now = super::session::db_now(tx)?;
    for (target, obj, size) in gone {
        tx.exec(
            "INSERT INTO trash (ino, target, obj, len, created) SELECT $1, $2, $3, $4, $5 \
             WHERE NOT EXISTS (SELECT 1 FROM slices WHERE obj = $3)",
            vals![ino, target, obj, size, now],
        )?;
    }
    Ok(())
}

/// Deletes an inode and everything that belongs to it; its objects go to the trash.
pub fn purge_inode(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    if tx.dialect().is_postgres() {
        tx.exec(pg_purge_sql(), vals![ino])?;
        return Ok(());
    }
    trash_slices(tx, ino, "TRUE", &[])?;
    for sql in [
        "DELETE FROM xattrs WHERE ino = $1",
        "DELETE FROM locks WHERE ino = $1",
        "DELETE FROM pcc_leases WHERE ino = $1",
        "DELETE FROM pcc_revokes WHERE ino = $1",
    ] {
        tx.exec(sql, vals![ino])?;
    }
    // A file with HSM state has more to forget. (Read, then deleted: `DELETE ... RETURNING`
    // runs like a trigger on SQLite, with a statement journal, see `trash_slices`: 5% of an
    // unlink's instructions, callgrind.)
    let hsm = tx.query_opt("SELECT hsm FROM inodes WHERE ino = $1", vals![ino])?;
    tx.exec("DELETE FROM inodes WHERE ino = $1", vals![ino])?;
    if let Some(r) = hsm {
        if r.i64(0)? != 0 {
            super::hsm::forget_file(tx, ino)?;
        }
    }
    Ok(())
}

/// PostgreSQL: [`purge_inode`] in one round trip (data-modifying CTEs all run, on one
/// snapshot): the slices go, their objects no other file's slice reads go to the trash (the
/// snapshot still shows this file's slices, hence `x.ino <> $1`: every one of them goes), and
/// the inode with its xattrs, locks, lease and recall request.
fn pg_purge_sql() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| {
        let hsm = super::hsm::pg_forget_ctes();
        format!(
            "WITH s AS (DELETE FROM slices WHERE ino = $1 \
                 RETURNING target, obj, obj_size), \
             t AS (INSERT INTO trash (ino, target, obj, len) \
                 SELECT DISTINCT $1::BIGINT, s.target, s.obj, s.obj_size FROM s \
                 WHERE s.target IS NOT NULL AND s.obj IS NOT NULL \
                 AND NOT EXISTS (SELECT 1 FROM slices x WHERE x.obj = s.obj AND x.ino <> $1)), \
             x AS (DELETE FROM xattrs WHERE ino = $1), \
             l AS (DELETE FROM locks WHERE ino = $1), \
             p AS (DELETE FROM pcc_leases WHERE ino = $1), \
             r AS (DELETE FROM pcc_revokes WHERE ino = $1), \
             {hsm} \
             DELETE FROM inodes WHERE ino = $1"
        )
    })
}

/// A file whose last name just went: an open orphan (`orphan = 1`) while some client has it
/// open (the last close frees it), else left for the purge ([`PENDING`]): from this
/// transaction on no request finds it, its lease and recall request go now (as `purge_inode`
/// took them: an RW-PCC owner must not write back a file nobody can reach), and the rest —
/// slices, inline bytes, objects to the trash, xattrs, locks, the row — is freed by
/// `purge_unlinked`, off the request path. Freeing a 32 KiB inline file was 111,000 of an
/// unlink's 200,000 instructions on SQLite (callgrind; docs/benchmarks.md). A file with HSM
/// state is freed at once, as before: its unlink cancels its requests and may queue the
/// removal of its archive copy (docs/hsm.md), which coordinator and movers see at once.
pub fn drop_inode(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    let r = if tx.dialect().is_postgres() {
        // The open check, the mark and the lease's end in one round trip.
        tx.query_opt(
            "WITH o AS (UPDATE inodes SET orphan = CASE \
                     WHEN EXISTS (SELECT 1 FROM open_files WHERE ino = $1) THEN 1 \
                     WHEN hsm <> 0 THEN orphan ELSE 3 END \
                 WHERE ino = $1 RETURNING orphan, hsm), \
             p AS (DELETE FROM pcc_leases WHERE ino = $1 \
                 AND EXISTS (SELECT 1 FROM o WHERE orphan = 3)), \
             r AS (DELETE FROM pcc_revokes WHERE ino = $1 \
                 AND EXISTS (SELECT 1 FROM o WHERE orphan = 3)) \
             SELECT orphan = 1, hsm FROM o",
            vals![ino],
        )?
    } else {
        // SQLite: `UPDATE ... RETURNING` opens a statement journal even when it changes
        // nothing; one plain read, then the one change.
        let r = tx.query_opt(
            "SELECT EXISTS (SELECT 1 FROM open_files WHERE ino = $1), hsm \
             FROM inodes WHERE ino = $1",
            vals![ino],
        )?;
        if let Some(r) = &r {
            if r.bool(0)? {
                tx.exec("UPDATE inodes SET orphan = 1 WHERE ino = $1", vals![ino])?;
            } else if r.i64(1)? == 0 {
                tx.exec(
                    "UPDATE inodes SET orphan = $2 WHERE ino = $1",
                    vals![ino, PENDING],
                )?;
                tx.exec("DELETE FROM pcc_leases WHERE ino = $1", vals![ino])?;
                tx.exec("DELETE FROM pcc_revokes WHERE ino = $1", vals![ino])?;
            }
        }
        r
    };
    match r {
        Some(r) if !r.bool(0)? && r.i64(1)? != 0 => purge_inode(tx, ino),
        _ => Ok(()),
    }
}

/// Retires a file whose last name a rename replaced: kept openable for
/// [`crate::engine::ORPHAN_GRACE`] (`orphan = 2`), whether or not a client has it open now, and
/// purged by `purge_orphans` once the grace is over and nobody has it open. (Marking it an
/// open orphan when open, purged at the last close, took the grace away from exactly the files
/// of the "write a temporary file, rename it over the live name" loop: the writer's close of
/// the previous version is still in its batch when the next rename replaces it.)
pub fn retire_inode(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    tx.exec("UPDATE inodes SET orphan = 2 WHERE ino = $1", vals![ino])?;
    // Leases and recall requests go now, as on unlink.
    tx.exec("DELETE FROM pcc_leases WHERE ino = $1", vals![ino])?;
    tx.exec("DELETE FROM pcc_revokes WHERE ino = $1", vals![ino])?;
    Ok(())
}

/// Leaves `ino` for the purge (or frees it, with HSM state) if it is an unlinked file (`orphan = 1`) that nobody has open any more.
pub fn purge_if_orphan(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    let orphan = tx.query_opt(
        "SELECT orphan, EXISTS (SELECT 1 FROM open_files WHERE ino = $1), hsm \
         FROM inodes WHERE ino = $1",
        vals![ino],
    )?;
    if let Some(r) = orphan {
        if r.i64(0)? == 1 && !r.bool(1)? {
            if r.i64(2)? == 0 {
                // Left for the purge, which waits UNLINK_GRACE from the unlink (its ctime): a
                // read-only open another client answered before the unlink may still be on
                // its way, and makes it an open orphan again when it lands.
                tx.exec("UPDATE inodes SET orphan = 3 WHERE ino = $1", vals![ino])?;
            } else {
                // (HSM state: freed at once, as at an unlink; such opens are always recorded)
                purge_inode(tx, ino)?;
            }
        }
    }
    Ok(())
}

// ---- Written with the file data port (core2) ----

/// Takes the row locks of `inos` where the engine has row locks (PostgreSQL); nothing on
/// SQLite, whose one writer at a time needs none (and which the old SQLite engine never ran).
pub fn lock_rows(tx: &mut dyn Tx, inos: &[Ino]) -> Result<()> {
    if tx.dialect().row_locks() {
        lock_inodes(tx, inos)?;
    }
    Ok(())
}

/// The row values of one slice of `ino`, in the order of [`insert_sql`]'s columns.
fn slice_values(ino: Ino, s: &Slice, out: &mut Vec<Value>) {
    let (target, obj, obj_off, obj_size, inline) = match &s.data {
        SliceData::Object {
            target,
            obj,
            obj_off,
            obj_size,
        } => (
            Value::from(*target),
            Value::from(*obj),
            *obj_off,
            *obj_size,
            Value::Null,
        ),
        SliceData::Inline(b) => (Value::Null, Value::Null, 0, 0, Value::from(b.as_slice())),
        SliceData::Zero => (Value::Null, Value::Null, 0, 0, Value::Null),
    };
    out.extend([
        Value::from(ino),
        Value::from(s.chunk),
        Value::from(s.off),
        Value::from(s.len),
        target,
        obj,
        inline,
        Value::from(obj_off),
        Value::from(obj_size),
    ]);
}

/// Rows one insert statement takes at most (a commit of more slices takes several).
const INSERT_ROWS: usize = 16;

/// `INSERT INTO slices ... VALUES (...), (...)` with `rows` rows (1..=[`INSERT_ROWS`]); each
/// size is built once. Rows are inserted in the order given, so their `seq` follows it.
fn insert_sql(rows: usize) -> &'static str {
    static SQL: OnceLock<Vec<String>> = OnceLock::new();
    let all = SQL.get_or_init(|| {
        (1..=INSERT_ROWS)
            .map(|n| {
                let mut s = String::from(
                    "INSERT INTO slices (ino, chunk, off, len, target, obj, inline, obj_off, \
                     obj_size) VALUES ",
                );
                for r in 0..n {
                    if r > 0 {
                        s.push_str(", ");
                    }
                    s.push('(');
                    for c in 0..9 {
                        if c > 0 {
                            s.push(',');
                        }
                        s.push_str(&format!("${}", r * 9 + c + 1));
                    }
                    s.push(')');
                }
                s
            })
            .collect()
    });
    &all[rows - 1]
}

/// Inserts `slices` in order (their `seq` follows that order): one statement per
/// [`INSERT_ROWS`] slices.
pub fn insert_slices(tx: &mut dyn Tx, ino: Ino, slices: &[Slice]) -> Result<()> {
    let mut vals = Vec::with_capacity(9 * slices.len().min(INSERT_ROWS));
    for part in slices.chunks(INSERT_ROWS) {
        vals.clear();
        for s in part {
            slice_values(ino, s, &mut vals);
        }
        tx.exec(insert_sql(part.len()), &vals)?;
    }
    Ok(())
}

/// Each chunk's slices as `(off, len, zero)` in commit order (what [`allocated_bytes`] reads).
pub type ChunkRows = BTreeMap<u64, Vec<(u64, u64, bool)>>;

/// `(off, len, zero)` of each slice of the chunks `chunks` of `ino`, per chunk, in commit
/// order: one statement.
fn chunk_rows(tx: &mut dyn Tx, ino: Ino, chunks: &[u64]) -> Result<ChunkRows> {
    let mut out = ChunkRows::new();
    for c in chunks {
        out.entry(*c).or_default();
    }
    let list: Vec<u64> = out.keys().copied().collect();
    let mut push = |r: crate::sql::Row| -> Result<()> {
        out.entry(r.u64(0)?)
            .or_default()
            .push((r.u64(1)?, r.u64(2)?, r.bool(3)?));
        Ok(())
    };
    if list.len() == 1 {
        tx.query_each(
            "SELECT chunk, off, len, obj IS NULL AND inline IS NULL FROM slices \
             WHERE ino = $1 AND chunk = $2 ORDER BY seq",
            vals![ino, list[0]],
            &mut push,
        )?;
    } else {
        tx.query_each(
            "SELECT chunk, off, len, obj IS NULL AND inline IS NULL FROM slices \
             WHERE ino = $1 AND chunk = ANY($2) ORDER BY chunk, seq",
            vals![ino, &list[..]],
            &mut push,
        )?;
    }
    Ok(out)
}

/// Inserts `slices` (in order, newest last) into `ino`'s chunks and returns by how much the
/// file's allocated bytes change. The caller holds the inode (see the module doc) and applies
/// the change (folded into its own update of the inode, or [`apply_allocated`]).
pub fn add_slices(tx: &mut dyn Tx, ino: Ino, slices: &[Slice]) -> Result<i64> {
    if slices.is_empty() {
        return Ok(0);
    }
    let chunks: Vec<u64> = slices.iter().map(|s| s.chunk).collect();
    let mut rows = chunk_rows(tx, ino, &chunks)?;
    let before: u64 = rows.values().map(|v| allocated_bytes(v)).sum();
    insert_slices(tx, ino, slices)?;
    for s in slices {
        rows.entry(s.chunk)
            .or_default()
            .push((s.off, s.len, matches!(s.data, SliceData::Zero)));
    }
    let after: u64 = rows.values().map(|v| allocated_bytes(v)).sum();
    Ok(after as i64 - before as i64)
}

/// Moves a file's allocated bytes by `delta` (nothing when it is 0).
pub fn apply_allocated(tx: &mut dyn Tx, ino: Ino, delta: i64) -> Result<()> {
    if delta != 0 {
        tx.exec(
            "UPDATE inodes SET allocated = GREATEST(0, allocated + $2) WHERE ino = $1",
            vals![ino, delta],
        )?;
    }
    Ok(())
}

/// The zero slices that make `[off, off+len)` of a file read as zeros, chunk by chunk.
fn zero_slices(stripe_size: u64, off: u64, len: u64) -> Vec<Slice> {
    let mut v = Vec::new();
    let mut pos = off;
    let end = off + len;
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
    v
}

/// Zeroes `[off, off+len)` of a file by adding zero slices (truncate, fallocate); returns the
/// change of its allocated bytes, which the caller applies.
pub fn zero_range(tx: &mut dyn Tx, ino: Ino, stripe_size: u64, off: u64, len: u64) -> Result<i64> {
    add_slices(tx, ino, &zero_slices(stripe_size, off, len))
}

/// An `UPDATE` of one inode row (`... WHERE ino = $1`) that gives back the inode's new
/// attributes: on PostgreSQL in the same round trip (`RETURNING`); on SQLite as the update
/// followed by a read, because SQLite runs `RETURNING` like a trigger, with a statement journal
/// for every execution, which costs more than the second statement (measured: a third fewer
/// commits per second with it). `NotFound` when the inode does not exist.
pub struct AttrUpdate {
    sql: &'static str,
    returning: OnceLock<String>,
}

impl AttrUpdate {
    pub const fn new(sql: &'static str) -> AttrUpdate {
        AttrUpdate {
            sql,
            returning: OnceLock::new(),
        }
    }

    /// Runs the update with `params` (`$1` is `ino`).
    pub fn run(&self, tx: &mut dyn Tx, ino: Ino, params: &[Value]) -> Result<Attr> {
        if tx.dialect().is_postgres() {
            let sql = self
                .returning
                .get_or_init(|| format!("{} RETURNING {ATTR_COLS}", self.sql));
            attr_from_row(&tx.one(sql, params)?)
        } else {
            if tx.exec(self.sql, params)? == 0 {
                return Err(MetaError::NotFound);
            }
            get_attr(tx, ino)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_columns_agree() {
        let plain: Vec<&str> = ATTR_COLS.split(", ").map(str::trim).collect();
        let joined: Vec<String> = ATTR_COLS_I
            .split(", ")
            .map(|c| c.trim().trim_start_matches("i.").to_string())
            .collect();
        assert_eq!(plain.len(), 22);
        assert_eq!(plain, joined);
    }
}
