//! Row decoding and small helpers shared by the core's domains.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::error::{MetaError, Result};
use crate::sql::{Row, Tx, Value};
use crate::types::*;
use crate::vals;

/// Most names one file may have.
pub const MAX_LINKS: i64 = 65000;

/// Columns of `inodes` that [`attr_from_row`] reads, in order.
pub const ATTR_COLS: &str =
    "ino, kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime, crtime, \
     projid, data_version, stripe_size, stripe_targets, def_stripe_count, def_stripe_size, parent, \
     allocated";

/// [`ATTR_COLS`] qualified by the alias `i` (`i.ino, i.kind, ...`), for joins.
pub const ATTR_COLS_I: &str =
    "i.ino, i.kind, i.perm, i.uid, i.gid, i.nlink, i.size, i.rdev, i.atime, i.mtime, i.ctime, \
     i.crtime, i.projid, i.data_version, i.stripe_size, i.stripe_targets, i.def_stripe_count, \
     i.def_stripe_size, i.parent, i.allocated";

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
    })
}

/// The attributes of `ino`; `NotFound` when it does not exist.
pub fn get_attr(tx: &mut dyn Tx, ino: Ino) -> Result<Attr> {
    const SQL: &str = "SELECT ino, kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime, \
        crtime, projid, data_version, stripe_size, stripe_targets, def_stripe_count, \
        def_stripe_size, parent, allocated FROM inodes WHERE ino = $1";
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
/// inodes that do not exist are left out.
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
                    "SELECT {ATTR_COLS} FROM inodes WHERE ino IN ({})",
                    ph.join(", ")
                )
            })
            .collect()
    });
    &v[n - 1]
}

fn attrs_sql() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| format!("SELECT {ATTR_COLS} FROM inodes WHERE ino = ANY($1)"))
}

fn lock_sql() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| {
        format!(
            "WITH l AS (SELECT ino FROM inodes WHERE ino = ANY($1) ORDER BY ino FOR UPDATE) \
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

/// Counts one more open of `ino` by `session`.
pub fn record_open(tx: &mut dyn Tx, session: u64, ino: Ino) -> Result<()> {
    tx.exec(
        "INSERT INTO open_files (session, ino, count) VALUES ($1, $2, 1) \
         ON CONFLICT (ino, session) DO UPDATE SET count = open_files.count + 1",
        vals![session, ino],
    )?;
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
    let (target, obj, obj_off, obj_size, inline): (Option<i64>, Option<i64>, i64, i64, Value) =
        match &s.data {
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
                Value::Null,
            ),
            SliceData::Inline(b) => (None, None, 0, 0, Value::Blob(b.clone())),
            SliceData::Zero => (None, None, 0, 0, Value::Null),
        };
    tx.exec(
        "INSERT INTO slices (ino, chunk, off, len, target, obj, inline, obj_off, obj_size) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            ino.into(),
            s.chunk.into(),
            s.off.into(),
            s.len.into(),
            target.into(),
            obj.into(),
            inline,
            obj_off.into(),
            obj_size.into(),
        ],
    )?;
    Ok(())
}

/// Deletes the selected slices of `ino` (`where_sql` uses `$2`.. for `args`); objects no
/// remaining slice references go to the trash.
pub fn trash_slices(tx: &mut dyn Tx, ino: Ino, where_sql: &str, args: &[i64]) -> Result<()> {
    let mut params: Vec<Value> = Vec::with_capacity(args.len() + 1);
    params.push(ino.into());
    params.extend(args.iter().map(|a| Value::Int(*a)));
    let mut gone: Vec<(i64, i64, i64)> = Vec::new();
    let sql = match where_sql {
        // The usual ones without building the text each time.
        "TRUE" => std::borrow::Cow::Borrowed(
            "DELETE FROM slices WHERE ino = $1 RETURNING target, obj, obj_size",
        ),
        "chunk >= $2" => std::borrow::Cow::Borrowed(
            "DELETE FROM slices WHERE ino = $1 AND chunk >= $2 RETURNING target, obj, obj_size",
        ),
        _ => std::borrow::Cow::Owned(format!(
            "DELETE FROM slices WHERE ino = $1 AND {where_sql} RETURNING target, obj, obj_size"
        )),
    };
    tx.query_each(&sql, &params, &mut |r| {
        if let (Some(t), Some(o)) = (r.opt_i64(0)?, r.opt_i64(1)?) {
            gone.push((t, o, r.i64(2)?));
        }
        Ok(())
    })?;
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

/// Deletes an inode and everything that belongs to it; its objects go to the trash.
pub fn purge_inode(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    trash_slices(tx, ino, "TRUE", &[])?;
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

/// Deletes an inode whose last name is gone, or marks it orphan (`orphan = 1`) while a client
/// has it open (the last close purges it).
pub fn drop_inode(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    let open = if tx.dialect().is_postgres() {
        // One round trip; no row back means nobody has it open.
        tx.query_opt(
            "UPDATE inodes SET orphan = 1 WHERE ino = $1 \
             AND EXISTS (SELECT 1 FROM open_files WHERE ino = $1) RETURNING ino",
            vals![ino],
        )?
        .is_some()
    } else {
        // SQLite: `UPDATE ... RETURNING` opens a statement journal even when it changes
        // nothing; the usual case (not open) is one plain read.
        let open = tx.exists(
            "SELECT EXISTS (SELECT 1 FROM open_files WHERE ino = $1)",
            vals![ino],
        )?;
        if open {
            tx.exec("UPDATE inodes SET orphan = 1 WHERE ino = $1", vals![ino])?;
        }
        open
    };
    if open {
        return Ok(());
    }
    purge_inode(tx, ino)
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

/// Purges `ino` if it is an unlinked file (`orphan = 1`) that nobody has open any more.
pub fn purge_if_orphan(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    let orphan = tx.query_opt(
        "SELECT orphan, EXISTS (SELECT 1 FROM open_files WHERE ino = $1) \
         FROM inodes WHERE ino = $1",
        vals![ino],
    )?;
    if let Some(r) = orphan {
        if r.i64(0)? == 1 && !r.bool(1)? {
            purge_inode(tx, ino)?;
        }
    }
    Ok(())
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
        assert_eq!(plain.len(), 20);
        assert_eq!(plain, joined);
    }
}
