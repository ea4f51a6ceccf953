//! The file data domain: object ids, slices, fallocate, compaction, RW-PCC write-back, trash.
//!
//! The helpers it shares with the other domains (row locks, slice inserts with their
//! allocated-bytes accounting, trash, purge) are in [`super::common`].

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use super::changelog::{self, Rec};
use super::common::{
    add_slices, apply_allocated, get_attr, insert_slices, lock1, lock_rows, slice_from_row,
    trash_slices, zero_range, AttrUpdate, ChunkRows, SLICE_COLS,
};
use super::SqlMeta;
use crate::changelog::RecordType;
use crate::engine::FileData;
use crate::error::{MetaError, Result};
use crate::hsm::{changelog_flags, HsmError, HsmEvent};
use crate::sql::{Driver, Tx};
use crate::types::*;
use crate::vals;

/// The distinct objects (target, obj, size) that `slices` bring.
pub(crate) fn objects_of(slices: &[Slice]) -> Vec<(u32, u64, u64)> {
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
pub(crate) fn account_objects(tx: &mut dyn Tx, objs: &[(u32, u64, u64)]) -> Result<()> {
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
pub(crate) fn trash_new_objects(tx: &mut dyn Tx, ino: Ino, slices: &[Slice]) -> Result<()> {
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

/// The changelog HSM record (event STATE, flag dirty) of a write to `old` that made it dirty:
/// an archived file that was clean. None otherwise (no statement).
pub(crate) fn dirtied(old: &Attr) -> Option<Rec<'static>> {
    (old.hsm.archived() && !old.hsm.dirty()).then(|| {
        Rec::new(RecordType::Hsm, old.ino).flags(changelog_flags(HsmEvent::State, 0, true))
    })
}

/// Writes a write's changelog record `typ`, with [`dirtied`]'s when the write made an
/// archived file dirty: one statement in the usual case, as before HSM.
pub(crate) fn record_write(tx: &mut dyn Tx, old: &Attr, typ: RecordType) -> Result<()> {
    match dirtied(old) {
        None => changelog::record(tx, &Rec::new(typ, old.ino)).map(|_| ()),
        Some(d) => changelog::record_all(tx, &[Rec::new(typ, old.ino), d]),
    }
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
            tx.query_each(sql, vals![ino, chunk], &mut |mut r| {
                v.push(slice_from_row(&mut r)?);
                Ok(())
            })?;
            // No slices: a hole, or a file that is gone (purged, its slices with it, in one
            // transaction): a reader of the second must not take it for zeros.
            if v.is_empty()
                && !tx.exists(
                    "SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = $1)",
                    vals![ino],
                )?
            {
                return Err(MetaError::NotFound);
            }
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
        self.commit(None, ino, slices, new_end, mtime, None)
    }

    fn commit_slices_for(
        &self,
        session: u64,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
    ) -> Result<Attr> {
        self.commit(Some(session), ino, slices, new_end, mtime, None)
    }

    fn commit_slices_then(
        &self,
        session: Option<u64>,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
        set: &SetAttr,
    ) -> Result<Attr> {
        self.commit(session, ino, slices, new_end, mtime, Some(set))
    }

    fn fallocate(&self, ino: Ino, off: u64, len: u64, keep_size: bool, zero: bool) -> Result<Attr> {
        self.d.write(|tx| {
            let a = lock1(tx, ino)?;
            if a.kind != Kind::File {
                return Err(MetaError::Invalid("fallocate on a non-regular file".into()));
            }
            if a.hsm.released() {
                return Err(HsmError::Released.into());
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
                    concat!(
                        "UPDATE inodes SET size = $3, mtime = $2, ctime = $2, \
                         data_version = data_version + 1, allocated = GREATEST(0, allocated + $4), ",
                        crate::hsm_dirty_sql!(),
                        " WHERE ino = $1"
                    ),
                    vals![ino, now, size, delta],
                )?;
                // changelog: MTIME (a range now reads as zeros; the size may have grown), and
                // HSM when that made an archived file dirty
                record_write(tx, &a, RecordType::Mtime)?;
            } else if !keep_size && off + len > a.size {
                tx.exec(
                    concat!(
                        "UPDATE inodes SET size = $2, ctime = $3, data_version = data_version + 1, ",
                        crate::hsm_dirty_sql!(),
                        " WHERE ino = $1"
                    ),
                    vals![ino, off + len, now],
                )?;
                // changelog: CTIME (the size grew: space reserved), HSM as above
                record_write(tx, &a, RecordType::Ctime)?;
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
            trash_slices(
                tx,
                ino,
                "chunk = $2 AND seq <= $3",
                &[chunk as i64, upto as i64],
            )?;
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
        static UPDATE: AttrUpdate = AttrUpdate::new(concat!(
            "UPDATE inodes SET size = $2, mtime = $3, ctime = $4, \
             data_version = data_version + 1, allocated = $5, ",
            crate::hsm_dirty_sql!(),
            " WHERE ino = $1"
        ));
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
            if old.hsm.released() {
                // The client restores a released file before writing it.
                return Err(HsmError::Released.into());
            }
            trash_slices(tx, ino, "TRUE", &[])?;
            insert_slices(tx, ino, slices)?;
            let a = UPDATE.run(tx, ino, vals![ino, size, mtime, now_nanos(), allocated])?;
            account_objects(tx, &objects_of(slices))?;
            // changelog: MTIME (all data replaced by the RW-PCC write-back; TRUNC as well when
            // the size shrank). Last, after every row lock.
            let mut recs = Vec::with_capacity(3);
            if size < old.size {
                recs.push(Rec::new(RecordType::Trunc, ino));
            }
            recs.push(Rec::new(RecordType::Mtime, ino));
            if let Some(r) = dirtied(&old) {
                recs.push(r);
            }
            changelog::record_all(tx, &recs)?;
            Ok(a)
        })
    }

    fn trash(&self, limit: usize, open_grace: Duration) -> Result<Vec<TrashItem>> {
        self.d.read(|tx| {
            // By the database's clock, which stamped the rows' `created`: a collector whose
            // clock runs fast does not cut the grace short.
            let before = super::session::db_now(tx)?.saturating_sub(open_grace.as_nanos() as i64);
            let mut v = Vec::new();
            tx.query_each(
                "SELECT id, target, obj, len FROM trash t \
                 WHERE t.created < $2 \
                    OR NOT EXISTS (SELECT 1 FROM open_files o WHERE o.ino = t.ino) \
                 ORDER BY id LIMIT $1",
                vals![limit, before],
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

impl<D: Driver> SqlMeta<D> {
    /// [`FileData::commit_slices`], under `session` when given ([`FileData::commit_slices_for`]).
    fn commit(
        &self,
        session: Option<u64>,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
        then: Option<&SetAttr>,
    ) -> Result<Attr> {
        static UPDATE: AttrUpdate = AttrUpdate::new(concat!(
            "UPDATE inodes SET size = GREATEST(size, $2), mtime = $3, ctime = $3, \
             data_version = data_version + 1, allocated = GREATEST(0, allocated + $4), ",
            crate::hsm_dirty_sql!(),
            " WHERE ino = $1"
        ));
        self.d.write_commit(|tx| {
            if let Some(s) = session {
                // Writes buffered under a session that ended are never recorded: its uploads
                // may count as garbage already.
                if let Err(e) = super::session::hold_session(tx, s) {
                    if matches!(e, MetaError::SessionEnded(_)) {
                        trash_new_objects(tx, ino, slices)?;
                        return Ok(Err(e));
                    }
                    return Err(e);
                }
            }
            let old = match lock1(tx, ino) {
                Ok(a) => a,
                Err(MetaError::NotFound) => {
                    // The file went away while its data was uploading: the objects are
                    // garbage (committed, unlike the error).
                    trash_new_objects(tx, ino, slices)?;
                    return Ok(Err(MetaError::NotFound));
                }
                Err(e) => return Err(e),
            };
            if old.hsm.released() {
                // Its data is in the archive only: the client restores before writing.
                trash_new_objects(tx, ino, slices)?;
                return Ok(Err(HsmError::Released.into()));
            }
            let delta = add_slices(tx, ino, slices)?;
            let a = UPDATE.run(tx, ino, vals![ino, new_end, mtime, delta])?;
            account_objects(tx, &objects_of(slices))?;
            // changelog: MTIME (data written: size, mtime and data version changed), and HSM
            // when that made an archived file dirty. Last, after every row lock: on PostgreSQL
            // the record holds the changelog's order lock until commit (core::changelog).
            record_write(tx, &old, RecordType::Mtime)?;
            match then {
                Some(set) => Ok(Ok(super::namespace::setattr_in(tx, ino, set)?)),
                None => Ok(Ok(a)),
            }
        })?
    }
}
