//! The file data domain: object ids, slices, fallocate, compaction, RW-PCC write-back, trash.
//!
//! Also the data helpers other domains use (`pub(crate)`): inserting slices with their
//! allocated-bytes accounting ([`add_slices`], [`zero_range`]), freeing slices into the trash
//! ([`trash_slices`]), purging a file ([`purge_inode`]), and taking inode row locks
//! ([`lock_inodes`], [`lock_rows`]).
//!
//! **Row locks.** On PostgreSQL a transaction that reads a file's slices, opens, locks or lease
//! to decide a write first locks (updates) the inode row, in ascending inode order, then
//! `targets` rows in ascending id (see the module doc of `crate::postgres`). SQLite has one
//! writer at a time: there the lock statements are skipped (`Dialect::row_locks`), so the SQLite
//! path runs no statement the old engine did not.
//!
//! **Allocated bytes.** A file's `allocated` is the sum over its chunks of
//! [`allocated_bytes`] of the chunk's slices. A transaction that adds slices reads the touched
//! chunks' slices once (one statement for all of them), and computes the change from those
//! rows plus the new slices (new slices are the newest: they are inserted while the inode is
//! held), instead of reading the chunks again after the insert.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::changelog::{self, Rec};
use super::common::{attr_from_row, get_attr, ATTR_COLS, ATTR_COLS_I};
use super::SqlMeta;
use crate::changelog::RecordType;
use crate::engine::FileData;
use crate::error::{MetaError, Result};
use crate::sql::{Driver, Tx, Value};
use crate::types::*;
use crate::vals;

/// Locks inode rows in ascending order and returns their attributes; inodes that do not exist
/// are left out. PostgreSQL: a real update of each row (`SET ino = ino`: under REPEATABLE READ
/// a mere `FOR UPDATE` of a row another transaction only locked is no conflict), in one
/// statement. SQLite (one writer at a time): a plain read of the rows.
pub(crate) fn lock_inodes(tx: &mut dyn Tx, inos: &[Ino]) -> Result<BTreeMap<Ino, Attr>> {
    let mut ids: Vec<u64> = inos.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let rows = if tx.dialect().row_locks() {
        static SQL: OnceLock<String> = OnceLock::new();
        let sql = SQL.get_or_init(|| {
            format!(
                "WITH l AS (SELECT ino FROM inodes WHERE ino = ANY($1) ORDER BY ino FOR UPDATE) \
                 UPDATE inodes i SET ino = i.ino FROM l WHERE i.ino = l.ino RETURNING {ATTR_COLS_I}"
            )
        });
        tx.query(sql, vals![&ids[..]])?
    } else {
        static SQL: OnceLock<String> = OnceLock::new();
        let sql = SQL.get_or_init(|| {
            format!("SELECT {ATTR_COLS} FROM inodes WHERE ino = ANY($1) ORDER BY ino")
        });
        tx.query(sql, vals![&ids[..]])?
    };
    let mut out = BTreeMap::new();
    for r in rows {
        let a = attr_from_row(&r)?;
        out.insert(a.ino, a);
    }
    Ok(out)
}

/// Locks one inode and returns its attributes; `NotFound` when it does not exist. (SQLite:
/// reads it, as the old engine's existence check did.)
pub(crate) fn lock1(tx: &mut dyn Tx, ino: Ino) -> Result<Attr> {
    if tx.dialect().row_locks() {
        lock_inodes(tx, &[ino])?
            .remove(&ino)
            .ok_or(MetaError::NotFound)
    } else {
        get_attr(tx, ino)
    }
}

/// Takes the row locks of `inos` where the engine has row locks (PostgreSQL); nothing on
/// SQLite, whose one writer at a time needs none (and which the old SQLite engine never ran).
pub(crate) fn lock_rows(tx: &mut dyn Tx, inos: &[Ino]) -> Result<()> {
    if tx.dialect().row_locks() {
        lock_inodes(tx, inos)?;
    }
    Ok(())
}

/// Columns `slice_from_row` reads, in order.
const SLICE_COLS: &str = "seq, chunk, off, len, target, obj, inline, obj_off, obj_size";

fn slice_from_row(mut r: crate::sql::Row) -> Result<Slice> {
    let data = match (r.opt_i64(4)?, r.opt_i64(5)?) {
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
fn insert_slices(tx: &mut dyn Tx, ino: Ino, slices: &[Slice]) -> Result<()> {
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
type ChunkRows = BTreeMap<u64, Vec<(u64, u64, bool)>>;

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
pub(crate) fn add_slices(tx: &mut dyn Tx, ino: Ino, slices: &[Slice]) -> Result<i64> {
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
pub(crate) fn apply_allocated(tx: &mut dyn Tx, ino: Ino, delta: i64) -> Result<()> {
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
pub(crate) fn zero_range(
    tx: &mut dyn Tx,
    ino: Ino,
    stripe_size: u64,
    off: u64,
    len: u64,
) -> Result<i64> {
    add_slices(tx, ino, &zero_slices(stripe_size, off, len))
}

/// The distinct objects (target, obj, size) that `slices` bring.
fn objects_of(slices: &[Slice]) -> Vec<(u32, u64, u64)> {
    let mut v: Vec<(u32, u64, u64)> = slices
        .iter()
        .filter_map(|s| match s.data {
            SliceData::Object {
                target,
                obj,
                obj_size,
                ..
            } => Some((target, obj, obj_size)),
            _ => None,
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Counts new objects against their targets: one update per target, in ascending target
/// order (the lock order after inode rows).
fn account_objects(tx: &mut dyn Tx, objs: &[(u32, u64, u64)]) -> Result<()> {
    let mut per: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (target, _obj, size) in objs {
        let e = per.entry(*target).or_default();
        e.0 += size;
        e.1 += 1;
    }
    for (target, (bytes, count)) in per {
        tx.exec(
            "UPDATE targets SET used = used + $2, objects = objects + $3 WHERE id = $1",
            vals![target, bytes, count],
        )?;
    }
    Ok(())
}

/// Objects that no slice will ever reference (a commit to a file that went away, a compaction
/// that lost its race): counted against their targets and put in the trash at once.
fn trash_new_objects(tx: &mut dyn Tx, ino: Ino, slices: &[Slice]) -> Result<()> {
    let objs = objects_of(slices);
    account_objects(tx, &objs)?;
    for (target, obj, size) in objs {
        tx.exec(
            "INSERT INTO trash (ino, target, obj, len) VALUES ($1, $2, $3, $4)",
            vals![ino, target, obj, size],
        )?;
    }
    Ok(())
}

/// Which slices of a file [`trash_slices`] deletes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SliceSel {
    /// All of them (purge, write-back).
    All,
    /// Chunks from this one on (truncate, for the namespace port).
    #[allow(dead_code)]
    FromChunk(u64),
    /// One chunk's slices up to this sequence number (compaction).
    ChunkUpTo(u64, u64),
}

/// Deletes the selected slices of `ino`; objects no remaining slice references go to the
/// trash (one statement per such object).
pub(crate) fn trash_slices(tx: &mut dyn Tx, ino: Ino, sel: SliceSel) -> Result<()> {
    let rows = match sel {
        SliceSel::All => tx.query(
            "DELETE FROM slices WHERE ino = $1 RETURNING target, obj, obj_size",
            vals![ino],
        )?,
        SliceSel::FromChunk(c) => tx.query(
            "DELETE FROM slices WHERE ino = $1 AND chunk >= $2 RETURNING target, obj, obj_size",
            vals![ino, c],
        )?,
        SliceSel::ChunkUpTo(c, upto) => tx.query(
            "DELETE FROM slices WHERE ino = $1 AND chunk = $2 AND seq <= $3 \
             RETURNING target, obj, obj_size",
            vals![ino, c, upto],
        )?,
    };
    let mut gone: Vec<(i64, i64, i64)> = Vec::new();
    for r in rows {
        if let (Some(t), Some(o)) = (r.opt_i64(0)?, r.opt_i64(1)?) {
            gone.push((t, o, r.i64(2)?));
        }
    }
    gone.sort_unstable();
    gone.dedup();
    for (target, obj, size) in gone {
        tx.exec(
            "INSERT INTO trash (ino, target, obj, len) SELECT $1, $2, $3, $4 \
             WHERE NOT EXISTS (SELECT 1 FROM slices WHERE obj = $3)",
            vals![ino, target, obj, size],
        )?;
    }
    Ok(())
}

/// Deletes a file whose last name is gone and that nobody holds: its slices (objects to the
/// trash), xattrs, locks, lease, recall requests and inode.
pub(crate) fn purge_inode(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    trash_slices(tx, ino, SliceSel::All)?;
    if tx.dialect().is_postgres() {
        // One round trip: data-modifying CTEs all run.
        tx.exec(
            "WITH x AS (DELETE FROM xattrs WHERE ino = $1), \
                  l AS (DELETE FROM locks WHERE ino = $1), \
                  p AS (DELETE FROM pcc_leases WHERE ino = $1), \
                  r AS (DELETE FROM pcc_revokes WHERE ino = $1) \
             DELETE FROM inodes WHERE ino = $1",
            vals![ino],
        )?;
    } else {
        for sql in [
            "DELETE FROM xattrs WHERE ino = $1",
            "DELETE FROM locks WHERE ino = $1",
            "DELETE FROM pcc_leases WHERE ino = $1",
            "DELETE FROM pcc_revokes WHERE ino = $1",
            "DELETE FROM inodes WHERE ino = $1",
        ] {
            tx.exec(sql, vals![ino])?;
        }
    }
    Ok(())
}

/// `SELECT`/`RETURNING` list of the inode columns, for updates that return the new attributes.
fn returning(sql_head: &'static str, cell: &'static OnceLock<String>) -> &'static str {
    cell.get_or_init(|| format!("{sql_head} RETURNING {ATTR_COLS}"))
}

impl<D: Driver> FileData for SqlMeta<D> {
    fn alloc_object_ids(&self, n: u64) -> Result<u64> {
        self.d.write(|tx| {
            let next = tx.int(
                "UPDATE counters SET value = value + $1 WHERE name = 'next_object' RETURNING value",
                vals![n],
            )?;
            Ok((next - n as i64) as u64)
        })
    }

    fn read_chunk(&self, ino: Ino, chunk: u64) -> Result<Vec<Slice>> {
        static SQL: OnceLock<String> = OnceLock::new();
        let sql = SQL.get_or_init(|| {
            format!("SELECT {SLICE_COLS} FROM slices WHERE ino = $1 AND chunk = $2 ORDER BY seq")
        });
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(sql, vals![ino, chunk], &mut |r| {
                v.push(slice_from_row(r)?);
                Ok(())
            })?;
            Ok(v)
        })
    }

    fn commit_slices(
        &self,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
    ) -> Result<Attr> {
        static SQL: OnceLock<String> = OnceLock::new();
        let update = returning(
            "UPDATE inodes SET size = GREATEST(size, $2), mtime = $3, ctime = $3, \
             data_version = data_version + 1, allocated = GREATEST(0, allocated + $4) \
             WHERE ino = $1",
            &SQL,
        );
        self.d.write_commit(|tx| {
            if let Err(e) = lock1(tx, ino) {
                if matches!(e, MetaError::NotFound) {
                    // The file went away while its data was uploading: the objects are
                    // garbage (committed, unlike the error).
                    trash_new_objects(tx, ino, slices)?;
                    return Ok(Err(MetaError::NotFound));
                }
                return Err(e);
            }
            let delta = add_slices(tx, ino, slices)?;
            let a = attr_from_row(&tx.one(update, vals![ino, new_end, mtime, delta])?)?;
            // changelog: MTIME (data written: size, mtime and data version changed)
            changelog::record(tx, &Rec::new(RecordType::Mtime, ino))?;
            account_objects(tx, &objects_of(slices))?;
            Ok(Ok(a))
        })?
    }

    fn fallocate(&self, ino: Ino, off: u64, len: u64, keep_size: bool, zero: bool) -> Result<Attr> {
        self.d.write(|tx| {
            let a = lock1(tx, ino)?;
            if a.kind != Kind::File {
                return Err(MetaError::Invalid("fallocate on a non-regular file".into()));
            }
            let now = now_nanos();
            if zero {
                let end = (off + len).min(a.size);
                let mut delta = 0;
                if let Some(l) = &a.layout {
                    if end > off {
                        delta = zero_range(tx, ino, l.stripe_size, off, end - off)?;
                    }
                }
                let size = if keep_size {
                    a.size
                } else {
                    a.size.max(off + len)
                };
                tx.exec(
                    "UPDATE inodes SET size = $3, mtime = $2, ctime = $2, \
                     data_version = data_version + 1, allocated = GREATEST(0, allocated + $4) \
                     WHERE ino = $1",
                    vals![ino, now, size, delta],
                )?;
                // changelog: MTIME (a range now reads as zeros; the size may have grown)
                changelog::record(tx, &Rec::new(RecordType::Mtime, ino))?;
            } else if !keep_size && off + len > a.size {
                tx.exec(
                    "UPDATE inodes SET size = $2, ctime = $3, data_version = data_version + 1 \
                     WHERE ino = $1",
                    vals![ino, off + len, now],
                )?;
                // changelog: CTIME (the size grew: space reserved)
                changelog::record(tx, &Rec::new(RecordType::Ctime, ino))?;
            }
            get_attr(tx, ino)
        })
    }

    fn replace_chunk(&self, ino: Ino, chunk: u64, upto: u64, merged: &[Slice]) -> Result<bool> {
        self.d.write(|tx| {
            lock_rows(tx, &[ino])?;
            let mut newest: Option<u64> = None;
            let mut rows = Vec::new();
            tx.query_each(
                "SELECT seq, off, len, obj IS NULL AND inline IS NULL FROM slices \
                 WHERE ino = $1 AND chunk = $2 ORDER BY seq",
                vals![ino, chunk],
                &mut |r| {
                    newest = Some(r.u64(0)?);
                    rows.push((r.u64(1)?, r.u64(2)?, r.bool(3)?));
                    Ok(())
                },
            )?;
            if newest != Some(upto) {
                // The chunk changed (or the file went): the merged objects are garbage.
                trash_new_objects(tx, ino, merged)?;
                return Ok(false);
            }
            let before = allocated_bytes(&rows);
            trash_slices(tx, ino, SliceSel::ChunkUpTo(chunk, upto))?;
            // Every slice of the chunk went (`upto` was the newest): the merged ones are all.
            insert_slices(tx, ino, merged)?;
            account_objects(tx, &objects_of(merged))?;
            let after: Vec<(u64, u64, bool)> = merged
                .iter()
                .map(|s| (s.off, s.len, matches!(s.data, SliceData::Zero)))
                .collect();
            apply_allocated(tx, ino, allocated_bytes(&after) as i64 - before as i64)?;
            Ok(true)
        })
    }

    fn rewrite_data(&self, ino: Ino, slices: &[Slice], size: u64, mtime: Nanos) -> Result<Attr> {
        static SQL: OnceLock<String> = OnceLock::new();
        let update = returning(
            "UPDATE inodes SET size = $2, mtime = $3, ctime = $4, \
             data_version = data_version + 1, allocated = $5 WHERE ino = $1",
            &SQL,
        );
        // The file holds exactly `slices` afterwards: its allocated bytes follow from them.
        let mut per = ChunkRows::new();
        for s in slices {
            per.entry(s.chunk)
                .or_default()
                .push((s.off, s.len, matches!(s.data, SliceData::Zero)));
        }
        let allocated: u64 = per.values().map(|v| allocated_bytes(v)).sum();
        self.d.write(|tx| {
            let old = lock1(tx, ino)?;
            trash_slices(tx, ino, SliceSel::All)?;
            insert_slices(tx, ino, slices)?;
            let a =
                attr_from_row(&tx.one(update, vals![ino, size, mtime, now_nanos(), allocated])?)?;
            // changelog: MTIME (all data replaced by the RW-PCC write-back; TRUNC as well when
            // the size shrank)
            if size < old.size {
                changelog::record(tx, &Rec::new(RecordType::Trunc, ino))?;
            }
            changelog::record(tx, &Rec::new(RecordType::Mtime, ino))?;
            account_objects(tx, &objects_of(slices))?;
            Ok(a)
        })
    }

    fn trash(&self, limit: usize) -> Result<Vec<TrashItem>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT id, target, obj, len FROM trash t \
                 WHERE NOT EXISTS (SELECT 1 FROM open_files o WHERE o.ino = t.ino) \
                 ORDER BY id LIMIT $1",
                vals![limit],
                &mut |r| {
                    v.push(TrashItem {
                        id: r.u64(0)?,
                        target: r.u32(1)?,
                        obj: r.u64(2)?,
                        len: r.u64(3)?,
                    });
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn trash_done(&self, ids: &[u64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.d.write(|tx| {
            let mut per: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
            tx.query_each(
                "DELETE FROM trash WHERE id = ANY($1) RETURNING target, len",
                vals![ids],
                &mut |r| {
                    let e = per.entry(r.i64(0)?).or_default();
                    e.0 += r.i64(1)?;
                    e.1 += 1;
                    Ok(())
                },
            )?;
            for (target, (bytes, count)) in per {
                tx.exec(
                    "UPDATE targets SET used = GREATEST(used - $2, 0), \
                     objects = GREATEST(objects - $3, 0) WHERE id = $1",
                    vals![target, bytes, count],
                )?;
            }
            Ok(())
        })
    }
}
