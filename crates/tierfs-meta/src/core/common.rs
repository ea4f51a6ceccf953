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
