//! The PCC domain: RW-PCC leases (one owner client per file, with a generation), requests to
//! give a lease back, and attach rules with their quotas.

use std::sync::OnceLock;

use super::common::AttrUpdate;
use super::common::{attr_from_row, check_name, lock1, lock_rows, ATTR_COLS, ATTR_COLS_I, VISIBLE};
use super::namespace::create_in;
use super::SqlMeta;
use crate::engine::Pcc;
use crate::error::{MetaError, Result};
use crate::postgres::REVOKE_CHANNEL;
use crate::sql::{Driver, Row, Tx};
use crate::types::*;
use crate::vals;

fn lease_from_row(r: &Row) -> Result<PccLease> {
    lease_at(r, 0)
}

/// A lease from the [`LEASE_COLS`] that start at column `at` of `r`.
pub(super) fn lease_at(r: &Row, at: usize) -> Result<PccLease> {
    Ok(PccLease {
        ino: r.u64(at)?,
        client: r.text(at + 1)?,
        generation: r.u64(at + 2)?,
        dirty: r.bool(at + 3)?,
        acquired: r.i64(at + 4)?,
        snapshot: r.u64(at + 5)?,
    })
}

/// The lease in the [`LEASE_COLS`] that start at column `at` of `r`, read through a LEFT JOIN
/// ([`lease_cols_p`]): None when they are NULL (no client holds the file).
fn opt_lease_at(r: &Row, at: usize) -> Result<Option<PccLease>> {
    match r.opt_i64(at)? {
        Some(_) => Ok(Some(lease_at(r, at)?)),
        None => Ok(None),
    }
}

/// PostgreSQL's first statement of `pcc_open`: the session's row held (as
/// [`super::session::hold_session`]), then the inode's row locked (as `lock1`), and its lease
/// read, in one round trip instead of three (each is a round trip to a server across a
/// network: issue 15). The session's lock is taken first: the inode's row is locked above
/// the filter that asks for the session. The lease is read on the transaction's snapshot, as
/// a statement after the lock would.
fn pg_open_lock(tx: &mut dyn Tx, session: u64, ino: Ino) -> Result<(Attr, Option<PccLease>)> {
    static SQL: OnceLock<String> = OnceLock::new();
    let sql = SQL.get_or_init(|| {
        let lease = lease_cols_p();
        format!(
            "WITH s AS (SELECT id FROM sessions WHERE id = $2 FOR KEY SHARE), \
                  l AS (SELECT ino FROM inodes WHERE ino = $1 AND {VISIBLE} \
                        AND EXISTS (SELECT 1 FROM s) FOR UPDATE), \
                  u AS (UPDATE inodes i SET ino = i.ino FROM l WHERE i.ino = l.ino \
                        RETURNING {ATTR_COLS_I}) \
             SELECT u.*, {lease}, EXISTS (SELECT 1 FROM s) \
             FROM (SELECT 1) AS one LEFT JOIN u ON TRUE LEFT JOIN pcc_leases p ON p.ino = u.ino"
        )
    });
    let r = tx.one(sql, vals![ino, session])?;
    let n = ATTR_COLS.split(", ").count();
    if !r.bool(n + LEASE_COLS.split(", ").count())? {
        return Err(MetaError::SessionEnded(session));
    }
    if r.opt_i64(0)?.is_none() {
        return Err(MetaError::NotFound);
    }
    Ok((attr_from_row(&r)?, opt_lease_at(&r, n)?))
}

/// Columns [`lease_from_row`] reads, in order.
pub(super) const LEASE_COLS: &str = "ino, client, generation, dirty, acquired, snapshot";

/// [`LEASE_COLS`] of `pcc_leases p`, for a statement that joins it.
fn lease_cols_p() -> String {
    let cols: Vec<String> = LEASE_COLS.split(", ").map(|c| format!("p.{c}")).collect();
    cols.join(", ")
}

fn lease_of(tx: &mut dyn Tx, ino: Ino) -> Result<Option<PccLease>> {
    tx.query_opt(
        &format!("SELECT {LEASE_COLS} FROM pcc_leases WHERE ino = $1"),
        vals![ino],
    )?
    .map(|r| lease_from_row(&r))
    .transpose()
}

/// The next number of the `pcc_generation` counter (generations and recall numbers share it:
/// both only need to grow). Take it after the inode's row lock (the lock order).
fn next_seq(tx: &mut dyn Tx) -> Result<u64> {
    Ok(tx.int(
        "UPDATE counters SET value = value + 1 WHERE name = 'pcc_generation' RETURNING value",
        vals![],
    )? as u64)
}

/// Directories whose [`SqlMeta::handed`] hint is kept (all are dropped past it).
const HANDED_HINTS: usize = 4096;

impl<D: Driver> SqlMeta<D> {
    /// [`Pcc::pcc_create`] on PostgreSQL: the create and its lease in one statement
    /// ([`super::namespace::pg_create`]). The rule (`want`, client code) cannot be asked
    /// inside a statement, so it is asked first about the file as it will be if its parent
    /// hands down what it handed down at the last create in it ([`SqlMeta::handed`]: its
    /// group when set-group-ID, its project when inherited; nothing for a parent not seen
    /// yet), and the statement takes the lease only when the file made has that group and
    /// project; then the rule is asked about the file made. When the two answers differ (the
    /// first create in a directory that hands a group or project down, with a rule that looks
    /// at them; or a parent changed since), the lease is taken after the create, as an attach
    /// of an existing file is (a second transaction; if that fails, the file stays
    /// uncached), or given back. So the lease held is always what the rule, asked about the
    /// file made, wants.
    #[allow(clippy::too_many_arguments)]
    fn pg_create_leased(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        layout: Option<Layout>,
        open_by: Option<u64>,
        client: &str,
        want: &dyn Fn(&Attr) -> bool,
    ) -> Result<(Attr, Option<PccLease>)> {
        let now = now_nanos();
        let hint = self.handed.lock().get(&parent).copied().unwrap_or_default();
        let (gid, projid) = hint.apply(node.gid);
        let guess = Attr {
            ino: 0,
            kind: node.kind,
            perm: node.perm & 0o7777,
            uid: node.uid,
            gid,
            nlink: 1,
            size: 0,
            rdev: node.rdev,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            projid,
            data_version: 0,
            layout: layout.clone(),
            dir_default: StripeDefault::default(),
            parent,
            allocated: 0,
            hsm: crate::hsm::HsmFlags(0),
            xattr_count: 0,
        };
        let lease_for = want(&guess).then_some((client, (gid, projid)));
        let (a, lease, handed) = self.d.write_once(|tx| {
            super::namespace::pg_create(tx, parent, name, node, layout.as_ref(), open_by, lease_for)
        })?;
        if handed != hint {
            let mut h = self.handed.lock();
            if h.len() >= HANDED_HINTS {
                h.clear();
            }
            h.insert(parent, handed);
        }
        if !want(&a) {
            // A lease is taken only for a file with the guessed group and project, which the
            // rule wanted; its answer may still change with time (a rule on a file's age).
            if let Some(l) = lease {
                self.pcc_release(a.ino, client, l.generation)?;
            }
            return Ok((a, None));
        }
        if lease.is_some() {
            return Ok((a, lease));
        }
        match self.d.write(|tx| acquire_in(tx, a.ino, client, true)) {
            Ok((a, l)) => Ok((a, Some(l))),
            Err(e) => {
                tracing::warn!(
                    ino = a.ino,
                    "the cache's lease on a new file could not be taken, it stays uncached: {e}"
                );
                Ok((a, None))
            }
        }
    }

    /// [`Pcc::pcc_acquire`], the lease taken dirty when `dirty` (one transaction).
    fn acquire(&self, ino: Ino, client: &str, dirty: bool) -> Result<PccLease> {
        self.d
            .write(|tx| acquire_in(tx, ino, client, dirty).map(|(_, l)| l))
    }
}

/// [`Pcc::pcc_acquire`] in the caller's transaction, the lease taken dirty when `dirty`: the
/// lease and the inode as it is after (a new lease moves its data version).
fn acquire_in(tx: &mut dyn Tx, ino: Ino, client: &str, dirty: bool) -> Result<(Attr, PccLease)> {
    let a = lock1(tx, ino)?;
    if a.kind != Kind::File {
        return Err(MetaError::Invalid(
            "only regular files can be cached".into(),
        ));
    }
    if a.hsm.released() {
        // Its data is in the archive only: the client restores it before caching it.
        return Err(crate::hsm::HsmError::Released.into());
    }
    if let Some(l) = lease_of(tx, ino)? {
        if l.client != client {
            return Err(MetaError::WouldBlock);
        }
        if dirty && !l.dirty {
            tx.exec("UPDATE pcc_leases SET dirty = 1 WHERE ino = $1", vals![ino])?;
            return Ok((a, PccLease { dirty: true, ..l }));
        }
        return Ok((a, l));
    }
    // Opens are recorded under the inode's row lock, held here (PostgreSQL).
    if tx.exists(
        "SELECT EXISTS (SELECT 1 FROM open_files o JOIN sessions s ON s.id = o.session \
         WHERE o.ino = $1 AND s.client_name <> $2)",
        vals![ino, client],
    )? {
        return Err(MetaError::InUse);
    }
    insert_lease(tx, a, client, dirty, false)
}

/// The generation of a lease taken in its file's create (`pcc_create`): no later attach of
/// the same inode can have it (those take [`next_seq`], which starts at 1), and an inode is
/// created once (inode numbers are never reused), so it is as unique as a counted one, and
/// the creates of all clients do not queue on (and, under REPEATABLE READ, conflict over) the
/// one `pcc_generation` row: measured under 1gbe, filebench fileserver's 4 threads had 314 of
/// 1,017 RW creates rolled back and retried on it.
pub const CREATE_GENERATION: u64 = 0;

/// The end of [`acquire_in`] and of an attach at create (the inode's row locked, nobody
/// else's lease or open on it): inserts the lease, of generation [`CREATE_GENERATION`] when
/// `at_create`. An attach of an existing file also moves its data version, so that read-only
/// copies of it on other clients are dropped; a file made in this transaction has none
/// anywhere, and its create keeps the version a create gives (one statement, one round trip
/// fewer under the directory's lock, which every create in a directory holds).
fn insert_lease(
    tx: &mut dyn Tx,
    mut a: Attr,
    client: &str,
    dirty: bool,
    at_create: bool,
) -> Result<(Attr, PccLease)> {
    let ino = a.ino;
    let generation = if at_create {
        CREATE_GENERATION
    } else {
        // The inode row before the counter (the lock order).
        tx.exec(
            "UPDATE inodes SET data_version = data_version + 1 WHERE ino = $1",
            vals![ino],
        )?;
        a.data_version += 1;
        next_seq(tx)?
    };
    let r = tx.one(
        &format!(
            "INSERT INTO pcc_leases (ino, client, generation, dirty, acquired, snapshot) \
             VALUES ($1, $2, $3, $4, $5, 0) RETURNING {LEASE_COLS}"
        ),
        vals![ino, client, generation, dirty as i64, now_nanos()],
    )?;
    Ok((a, lease_from_row(&r)?))
}

/// [`Pcc::pcc_report`] on PostgreSQL: one statement, sent as its own transaction
/// ([`Driver::write_one`]). The inode's row is updated first (its lock, as `lock_rows` takes
/// it in the transaction of the other engines), only if `client` holds the lease at
/// `generation` on the statement's snapshot; then the lease's dirty flag, and the changelog's
/// MTIME record (gated as [`super::changelog::record`]'s). A lease changed or given back by
/// a transaction that committed after the snapshot also updated the inode's row, so the
/// update is a serialization failure and the statement is retried on a new snapshot. Nothing
/// updated: `NotFound` when the file has no lease (or no inode), `WouldBlock` when another
/// holder or generation has it, as the other engines answer.
fn pg_report(
    tx: &mut dyn Tx,
    ino: Ino,
    client: &str,
    generation: u64,
    dirty: bool,
    size: u64,
    mtime: Nanos,
) -> Result<Attr> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        format!(
            "WITH u AS (UPDATE inodes SET size = $15, mtime = $16, \
             ctime = GREATEST(ctime, $16), \
             hsm = CASE WHEN $17 <> 0 AND hsm & 8 <> 0 THEN hsm | 2 ELSE hsm END \
             WHERE ino = $14 AND orphan <> 3 AND EXISTS (SELECT 1 FROM pcc_leases \
             WHERE ino = $14 AND client = $18 AND generation = $19) RETURNING {ATTR_COLS}), \
             p AS (UPDATE pcc_leases SET dirty = $17 WHERE ino = $14 AND EXISTS (SELECT 1 FROM u)), \
             c AS ({} RETURNING 1) \
             SELECT u.*, (SELECT client = $18 AND generation = $19 FROM pcc_leases \
             WHERE ino = $14) FROM (SELECT 1) AS one LEFT JOIN u ON TRUE",
            super::changelog::pg_insert_after("u")
        )
    });
    let rec = super::changelog::Rec::new(crate::changelog::RecordType::Mtime, ino);
    let mut params = super::changelog::record_params(&rec).to_vec();
    params.extend_from_slice(vals![ino, size, mtime, dirty as i64, client, generation]);
    let r = tx.one(sql, &params)?;
    if r.is_null(0)? {
        // (column 22, after the 22 attribute columns: whether the lease is this holder's;
        // null: no lease)
        return Err(if r.is_null(22)? || r.bool(22)? {
            MetaError::NotFound
        } else {
            MetaError::WouldBlock
        });
    }
    attr_from_row(&r)
}

/// [`Pcc::pcc_report`] on SQLite (the writer's transaction orders it against every other).
fn sqlite_report(
    tx: &mut dyn Tx,
    ino: Ino,
    client: &str,
    generation: u64,
    dirty: bool,
    size: u64,
    mtime: Nanos,
) -> Result<Attr> {
    // A dirty cache of an archived file makes it dirty (HSM), in the same statement.
    static UPDATE: AttrUpdate = AttrUpdate::new(
        "UPDATE inodes SET size = $2, mtime = $3, ctime = GREATEST(ctime, $3), \
         hsm = CASE WHEN $4 <> 0 AND hsm & 8 <> 0 THEN hsm | 2 ELSE hsm END WHERE ino = $1",
    );
    lock_rows(tx, &[ino])?;
    let l = lease_of(tx, ino)?.ok_or(MetaError::NotFound)?;
    if l.client != client || l.generation != generation {
        // Not this holder's lease any more (given back, broken, taken again).
        return Err(MetaError::WouldBlock);
    }
    tx.exec(
        "UPDATE pcc_leases SET dirty = $2 WHERE ino = $1",
        vals![ino, dirty as i64],
    )?;
    let a = UPDATE.run(tx, ino, vals![ino, size, mtime, dirty as i64])?;
    // changelog: MTIME (the lease owner's cached copy: size and mtime)
    super::changelog::record(
        tx,
        &super::changelog::Rec::new(crate::changelog::RecordType::Mtime, ino),
    )?;
    Ok(a)
}

impl<D: Driver> Pcc for SqlMeta<D> {
    fn pcc_lease(&self, ino: Ino) -> Result<Option<PccLease>> {
        self.d.read(|tx| lease_of(tx, ino))
    }

    fn getattr_leased(&self, ino: Ino) -> Result<(Attr, Option<PccLease>)> {
        static SQL: OnceLock<String> = OnceLock::new();
        let sql = SQL.get_or_init(|| {
            let lease = lease_cols_p();
            format!(
                "SELECT {ATTR_COLS_I}, {lease} \
                 FROM inodes i LEFT JOIN pcc_leases p ON p.ino = i.ino \
                 WHERE i.ino = $1 AND i.{VISIBLE}"
            )
        });
        self.d.read(|tx| {
            let r = tx.one(sql, vals![ino])?;
            Ok((
                attr_from_row(&r)?,
                opt_lease_at(&r, ATTR_COLS.split(", ").count())?,
            ))
        })
    }

    fn pcc_acquire(&self, ino: Ino, client: &str) -> Result<PccLease> {
        self.acquire(ino, client, false)
    }

    fn pcc_acquire_dirty(&self, ino: Ino, client: &str) -> Result<PccLease> {
        self.acquire(ino, client, true)
    }

    fn pcc_create(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        layout: Option<Layout>,
        open_by: Option<u64>,
        client: &str,
        want: &dyn Fn(&Attr) -> bool,
    ) -> Result<(Attr, Option<PccLease>)> {
        check_name(name)?;
        if node.kind != Kind::File {
            return Err(MetaError::Invalid(
                "only regular files can be cached".into(),
            ));
        }
        if self.d.dialect().is_postgres() {
            return self.pg_create_leased(parent, name, node, layout, open_by, client, want);
        }
        self.d.write(|tx| {
            let a = create_in(tx, parent, name, node, layout.clone(), open_by)?;
            if !want(&a) {
                return Ok((a, None));
            }
            // The new inode's row is this transaction's: no other client can see it, so it
            // has no lease, no open elsewhere, no archive and no read-only copy anywhere, and
            // it is a regular file as created (`a`): the lease (dirty) is inserted without
            // reading any of that again, and the data version stays a create's.
            let (a, l) = insert_lease(tx, a, client, true, true)?;
            Ok((a, Some(l)))
        })
    }

    fn pcc_open(
        &self,
        session: u64,
        ino: Ino,
        client: &str,
        write: bool,
        snapshot: Option<u64>,
    ) -> Result<PccOpen> {
        self.d.write(|tx| {
            // The session's row before the inode's (the order `end_sessions` takes them in);
            // SQLite: `record_open` checks the session in its insert. The inode's row lock
            // orders this open against pcc_acquire, which looks for other clients' opens under
            // it (PostgreSQL; SQLite writes one at a time).
            let (attr, lease) = if tx.dialect().is_postgres() {
                pg_open_lock(tx, session, ino)?
            } else {
                (lock1(tx, ino)?, lease_of(tx, ino)?)
            };
            let out = match lease {
                Some(mut l) if l.client == client => {
                    if write && !l.dirty {
                        // "May be dirty" before the caller hands out a writable descriptor:
                        // a restart after a kill -9 then writes the file back.
                        tx.exec("UPDATE pcc_leases SET dirty = 1 WHERE ino = $1", vals![ino])?;
                        l.dirty = true;
                    }
                    PccOpen::Opened {
                        attr: attr.clone(),
                        lease: Some(l),
                    }
                }
                Some(l) => match snapshot {
                    Some(seq) if !write && l.snapshot >= seq => PccOpen::Snapshot {
                        attr: attr.clone(),
                        lease: l,
                    },
                    _ => return Ok(PccOpen::Held(l)),
                },
                None => PccOpen::Opened {
                    attr: attr.clone(),
                    lease: None,
                },
            };
            // changelog: OPEN (with the record of the open: one statement on PostgreSQL)
            super::changelog::record_open_logged(tx, session, ino)?;
            Ok(out)
        })
    }

    fn pcc_report(
        &self,
        ino: Ino,
        client: &str,
        generation: u64,
        dirty: bool,
        size: u64,
        mtime: Nanos,
    ) -> Result<Attr> {
        if self.d.dialect().is_postgres() {
            return self
                .d
                .write_one(|tx| pg_report(tx, ino, client, generation, dirty, size, mtime));
        }
        self.d
            .write(|tx| sqlite_report(tx, ino, client, generation, dirty, size, mtime))
    }

    fn pcc_report_then(
        &self,
        ino: Ino,
        client: &str,
        generation: u64,
        dirty: bool,
        size: u64,
        mtime: Nanos,
        then: &SetAttr,
    ) -> Result<Attr> {
        let pg = self.d.dialect().is_postgres();
        self.d.write(|tx| {
            if pg {
                pg_report(tx, ino, client, generation, dirty, size, mtime)?;
            } else {
                sqlite_report(tx, ino, client, generation, dirty, size, mtime)?;
            }
            super::namespace::setattr_in(tx, ino, then)
        })
    }

    fn pcc_release(&self, ino: Ino, client: &str, generation: u64) -> Result<bool> {
        self.d.write(|tx| {
            lock_rows(tx, &[ino])?;
            let n = tx.exec(
                "DELETE FROM pcc_leases WHERE ino = $1 AND client = $2 AND generation = $3",
                vals![ino, client, generation],
            )?;
            if n > 0 {
                tx.exec("DELETE FROM pcc_revokes WHERE ino = $1", vals![ino])?;
            }
            Ok(n > 0)
        })
    }

    fn pcc_break(&self, ino: Ino, client: &str, generation: u64) -> Result<bool> {
        self.d.write(|tx| {
            lock_rows(tx, &[ino])?;
            let n = tx.exec(
                "DELETE FROM pcc_leases \
                 WHERE ino = $1 AND client = $2 AND generation = $3 AND dirty = 0",
                vals![ino, client, generation],
            )?;
            if n > 0 {
                tx.exec("DELETE FROM pcc_revokes WHERE ino = $1", vals![ino])?;
            }
            Ok(n > 0)
        })
    }

    fn pcc_request_recall(&self, ino: Ino, requester: &str, write: bool) -> Result<u64> {
        self.d.write(|tx| {
            lock_rows(tx, &[ino])?;
            let seq = next_seq(tx)?;
            // One request per file: a later one moves the number on (a snapshot must start
            // after it), and a request for writing stays one.
            tx.exec(
                "INSERT INTO pcc_revokes (ino, requester, requested, for_write, seq) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (ino) DO UPDATE SET seq = excluded.seq, \
                 for_write = CASE WHEN excluded.for_write = 1 THEN 1 \
                 ELSE pcc_revokes.for_write END",
                vals![ino, requester, now_nanos(), write as i64, seq],
            )?;
            if tx.dialect().is_postgres() {
                // Tell the holder now (delivered at commit; payload "<ino> <holder>", which
                // the engine's listener reads); holders that do not listen poll. Engines
                // without notifications skip the lookup.
                if let Some(r) =
                    tx.query_opt("SELECT client FROM pcc_leases WHERE ino = $1", vals![ino])?
                {
                    let payload = format!("{ino} {}", r.text(0)?);
                    tx.notify(REVOKE_CHANNEL, &payload)?;
                }
            }
            Ok(seq)
        })
    }

    fn pcc_recalls_for(&self, client: &str) -> Result<Vec<PccRecall>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT r.ino, r.for_write, r.seq FROM pcc_revokes r \
                 JOIN pcc_leases l ON l.ino = r.ino WHERE l.client = $1 ORDER BY r.ino",
                vals![client],
                &mut |r| {
                    v.push(PccRecall {
                        ino: r.u64(0)?,
                        write: r.bool(1)?,
                        seq: r.u64(2)?,
                    });
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn pcc_snapshot_served(
        &self,
        ino: Ino,
        client: &str,
        generation: u64,
        seq: u64,
    ) -> Result<bool> {
        self.d.write(|tx| {
            lock_rows(tx, &[ino])?;
            let n = tx.exec(
                "UPDATE pcc_leases SET snapshot = CASE WHEN snapshot > $4 THEN snapshot \
                 ELSE $4 END WHERE ino = $1 AND client = $2 AND generation = $3",
                vals![ino, client, generation, seq],
            )?;
            if n > 0 {
                // Served: a read request up to `seq` (a newer one waits for the next snapshot).
                tx.exec(
                    "DELETE FROM pcc_revokes WHERE ino = $1 AND for_write = 0 AND seq <= $2",
                    vals![ino, seq],
                )?;
            }
            Ok(n > 0)
        })
    }

    fn pcc_revokes_for(&self, client: &str) -> Result<Vec<Ino>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT r.ino FROM pcc_revokes r JOIN pcc_leases l ON l.ino = r.ino \
                 WHERE l.client = $1 ORDER BY r.ino",
                vals![client],
                &mut |r| {
                    v.push(r.u64(0)?);
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn pcc_leases_of(&self, client: &str) -> Result<Vec<PccLease>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                &format!("SELECT {LEASE_COLS} FROM pcc_leases WHERE client = $1 ORDER BY ino"),
                vals![client],
                &mut |r| {
                    v.push(lease_from_row(&r)?);
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn pcc_rule_add(
        &self,
        mode: &str,
        client: Option<&str>,
        rule: &str,
        quota: Option<u64>,
    ) -> Result<u64> {
        if mode != "rw" && mode != "ro" {
            return Err(MetaError::Invalid(format!(
                "PCC mode '{mode}' (expected rw or ro)"
            )));
        }
        self.d.write(|tx| {
            Ok(tx.int(
                "INSERT INTO pcc_rules (mode, client, rule, created, quota) \
                 VALUES ($1, $2, $3, $4, $5) RETURNING id",
                vals![mode, client, rule, now_nanos(), quota],
            )? as u64)
        })
    }

    fn pcc_rule_set_quota(&self, id: u64, quota: Option<u64>) -> Result<()> {
        self.d.write(|tx| {
            let n = tx.exec(
                "UPDATE pcc_rules SET quota = $2 WHERE id = $1",
                vals![id, quota],
            )?;
            if n == 0 {
                return Err(MetaError::NotFound);
            }
            Ok(())
        })
    }

    fn pcc_rules(&self) -> Result<Vec<PccRuleRow>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT id, mode, client, rule, quota FROM pcc_rules ORDER BY id",
                vals![],
                &mut |r| {
                    v.push(PccRuleRow {
                        id: r.u64(0)?,
                        mode: r.text(1)?,
                        client: r.opt_text(2)?,
                        rule: r.text(3)?,
                        quota: r.opt_i64(4)?.map(|q| q as u64),
                    });
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn pcc_rule_del(&self, id: u64) -> Result<()> {
        self.d.write(|tx| {
            if tx.exec("DELETE FROM pcc_rules WHERE id = $1", vals![id])? == 0 {
                return Err(MetaError::NotFound);
            }
            Ok(())
        })
    }
}
