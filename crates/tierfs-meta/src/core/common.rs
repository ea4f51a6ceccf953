//! Row decoding and small helpers shared by the core's domains.

use crate::error::{MetaError, Result};
use crate::sql::{Row, Tx};
use crate::types::*;
use crate::vals;

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
