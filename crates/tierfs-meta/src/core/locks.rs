//! The advisory locks domain (POSIX and flock), shared by every client: the rows of `locks`;
//! the range arithmetic is [`crate::locks`].

use super::common::lock_rows;
use super::SqlMeta;
use crate::engine::Locks;
use crate::error::{MetaError, Result};
use crate::sql::{Driver, Row, Tx};
use crate::types::*;
use crate::vals;

fn typ_to_i64(t: LockType) -> i64 {
    match t {
        LockType::Read => 0,
        LockType::Write => 1,
        LockType::Unlock => 2,
    }
}

/// `end` as stored: `u64::MAX` (to the end of the file) is `i64::MAX`.
fn end_to_i64(end: u64) -> i64 {
    end.min(i64::MAX as u64) as i64
}

fn lock_from_row(r: &Row) -> Result<LockRange> {
    let end = r.i64(5)?;
    Ok(LockRange {
        session: r.u64(0)?,
        owner: r.u64(1)?,
        flock: r.bool(2)?,
        typ: if r.i64(3)? == 1 {
            LockType::Write
        } else {
            LockType::Read
        },
        start: r.u64(4)?,
        end: if end == i64::MAX {
            u64::MAX
        } else {
            end as u64
        },
        pid: r.u32(6)?,
    })
}

/// Every lock held on `ino`.
fn locks_of(tx: &mut dyn Tx, ino: Ino) -> Result<Vec<LockRange>> {
    let mut v = Vec::new();
    tx.query_each(
        "SELECT session, owner, flock, typ, start, \"end\", pid FROM locks WHERE ino = $1",
        vals![ino],
        &mut |r| {
            v.push(lock_from_row(&r)?);
            Ok(())
        },
    )?;
    Ok(v)
}

impl<D: Driver> Locks for SqlMeta<D> {
    fn set_lock(&self, ino: Ino, lock: &LockRange) -> Result<()> {
        self.d.write(|tx| {
            // Never a lock under a session that ended (its locks went with it); its row first.
            super::session::hold_session(tx, lock.session)?;
            // PostgreSQL: the inode row guards its locks (see `data`'s module doc).
            lock_rows(tx, &[ino])?;
            let held = locks_of(tx, ino)?;
            if lock.typ != LockType::Unlock && held.iter().any(|h| crate::locks::conflicts(h, lock))
            {
                return Err(MetaError::WouldBlock);
            }
            let own: Vec<LockRange> = held
                .into_iter()
                .filter(|h| {
                    h.session == lock.session && h.owner == lock.owner && h.flock == lock.flock
                })
                .collect();
            let next = crate::locks::apply(&own, lock);
            tx.exec(
                "DELETE FROM locks WHERE ino = $1 AND session = $2 AND owner = $3 AND flock = $4",
                vals![ino, lock.session, lock.owner, lock.flock as i64],
            )?;
            for l in next {
                tx.exec(
                    "INSERT INTO locks (ino, session, owner, flock, typ, start, \"end\", pid) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    vals![
                        ino,
                        l.session,
                        l.owner,
                        l.flock as i64,
                        typ_to_i64(l.typ),
                        l.start,
                        end_to_i64(l.end),
                        l.pid
                    ],
                )?;
            }
            Ok(())
        })
    }

    fn test_lock(&self, ino: Ino, lock: &LockRange) -> Result<Option<LockRange>> {
        self.d.read(|tx| {
            Ok(locks_of(tx, ino)?
                .into_iter()
                .find(|h| crate::locks::conflicts(h, lock)))
        })
    }

    fn release_locks(&self, ino: Ino, session: u64, owner: u64, flock: bool) -> Result<()> {
        self.d.write(|tx| {
            tx.exec(
                "DELETE FROM locks WHERE ino = $1 AND session = $2 AND owner = $3 AND flock = $4",
                vals![ino, session, owner, flock as i64],
            )?;
            Ok(())
        })
    }
}
