//! The sessions domain: client sessions (registration, heartbeats, reaping) and the files
//! they have open.
//!
//! Helpers for other domains (`pub(crate)`): [`end_sessions`] (fsck's repairs),
//! [`session_from_row`].

use super::changelog::{self, Rec};
use super::common::{lock1, lock_inodes, lock_rows, purge_if_orphan, record_open};
use super::SqlMeta;
use crate::changelog::RecordType;
use crate::engine::Sessions;
use crate::error::{MetaError, Result};
use crate::sql::{Driver, Row, Tx};
use crate::types::*;
use crate::vals;

pub(crate) fn session_from_row(r: &Row) -> Result<SessionInfo> {
    Ok(SessionInfo {
        id: r.u64(0)?,
        client_name: r.text(1)?,
        host: r.text(2)?,
        pid: r.u32(3)?,
        mountpoint: r.text(4)?,
        version: r.text(5)?,
        started: r.i64(6)?,
        heartbeat: r.i64(7)?,
    })
}

/// Fails with [`MetaError::SessionEnded`] unless `session` exists. Every write recorded under a
/// session (an open, a lock, a data commit of its buffered writes) calls this in its
/// transaction, so nothing is recorded under a session that was reaped or evicted. On
/// PostgreSQL the session's row is held (`FOR KEY SHARE`, which a heartbeat's update does not
/// wait for) until commit, before any inode row: [`end_sessions`] takes the row `FOR UPDATE`
/// first and so waits for the transaction, then (at READ COMMITTED) sees what it recorded.
/// SQLite: one primary-key lookup (one writer at a time: nothing interleaves).
pub(crate) fn hold_session(tx: &mut dyn Tx, session: u64) -> Result<()> {
    let sql = if tx.dialect().is_postgres() {
        "SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE"
    } else {
        "SELECT 1 FROM sessions WHERE id = $1"
    };
    match tx.query_opt(sql, vals![session])? {
        Some(_) => Ok(()),
        None => Err(MetaError::SessionEnded(session)),
    }
}

/// Removes sessions with their open files (purging unlinked files they were the last to
/// hold) and locks. On PostgreSQL the sessions' rows are locked first (waiting for the
/// transactions that hold them to record an open or lock, see [`hold_session`]), then the
/// inodes they had open, in order; the caller runs at READ COMMITTED (its first statement), so
/// that the open files and locks read after the row locks include those just committed.
pub(crate) fn end_sessions(tx: &mut dyn Tx, sessions: &[u64]) -> Result<()> {
    if sessions.is_empty() {
        return Ok(());
    }
    if tx.dialect().is_postgres() {
        tx.query(
            "SELECT id FROM sessions WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            vals![sessions],
        )?;
    }
    let mut inos = Vec::new();
    tx.query_each(
        "SELECT DISTINCT ino FROM open_files WHERE session = ANY($1) ORDER BY ino",
        vals![sessions],
        &mut |r| {
            inos.push(r.u64(0)?);
            Ok(())
        },
    )?;
    lock_rows(tx, &inos)?;
    tx.exec(
        "DELETE FROM open_files WHERE session = ANY($1)",
        vals![sessions],
    )?;
    for ino in inos {
        purge_if_orphan(tx, ino)?;
    }
    tx.exec("DELETE FROM locks WHERE session = ANY($1)", vals![sessions])?;
    tx.exec("DELETE FROM sessions WHERE id = ANY($1)", vals![sessions])?;
    Ok(())
}

/// The database's clock in nanoseconds since the epoch, on PostgreSQL (`clock_timestamp()`:
/// the time the statement runs, not the transaction's start).
const PG_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint";

/// The database's clock, in nanoseconds since the epoch: what liveness is judged by, so that
/// no client's clock decides whether another client is alive. PostgreSQL:
/// `clock_timestamp()` (one query); SQLite: this host's clock, which is the database's (it is
/// embedded in this process).
pub(crate) fn db_now(tx: &mut dyn Tx) -> Result<Nanos> {
    if tx.dialect().is_postgres() {
        tx.int(PG_NOW, vals![])
    } else {
        Ok(now_nanos())
    }
}

fn insert_session(tx: &mut dyn Tx, s: &SessionInfo, now: Nanos) -> Result<u64> {
    Ok(tx.int(
        "INSERT INTO sessions (client_name, host, pid, mountpoint, version, started, heartbeat) \
         VALUES ($1, $2, $3, $4, $5, $6, $6) RETURNING id",
        vals![
            s.client_name.as_str(),
            s.host.as_str(),
            s.pid,
            s.mountpoint.as_str(),
            s.version.as_str(),
            now
        ],
    )? as u64)
}

impl<D: Driver> Sessions for SqlMeta<D> {
    fn register_session(&self, s: &SessionInfo) -> Result<u64> {
        self.d.write(|tx| {
            let now = db_now(tx)?;
            insert_session(tx, s, now)
        })
    }

    fn register_session_unique(&self, s: &SessionInfo, timeout_ns: i64) -> Result<u64> {
        self.d.write(|tx| {
            if tx.dialect().is_postgres() {
                // Two mounts of one name at once must not both see "no live session": they
                // queue on an advisory lock of the name, and the check after it runs at READ
                // COMMITTED (allowed before the first query), so it sees a session the other
                // mount committed meanwhile. (SQLite: one writer at a time already.)
                tx.batch("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
                let key = format!("tierfs client name {}", s.client_name);
                tx.exec("SELECT pg_advisory_xact_lock(hashtext($1))", vals![key])?;
            }
            let now = db_now(tx)?;
            let live = tx.query_opt(
                "SELECT id, client_name, host, pid, mountpoint, version, started, heartbeat \
                 FROM sessions WHERE client_name = $1 AND heartbeat >= $2 ORDER BY id LIMIT 1",
                vals![s.client_name.as_str(), now - timeout_ns],
            )?;
            if let Some(r) = live {
                return Err(MetaError::ClientNameInUse(format!(
                    "'{}' is already mounted ({}); unmount it first, or mount with another --client-name",
                    s.client_name,
                    session_from_row(&r)?.describe()
                )));
            }
            insert_session(tx, s, now)
        })
    }

    fn heartbeat(&self, session: u64) -> Result<()> {
        // Its own connection on PostgreSQL: never behind the I/O's transactions.
        self.d.write_priority(|tx| {
            // The database's clock (see [`db_now`]), in the one statement on PostgreSQL.
            let n = if tx.dialect().is_postgres() {
                tx.exec(
                    "UPDATE sessions SET heartbeat = \
                     (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint WHERE id = $1",
                    vals![session],
                )?
            } else {
                tx.exec(
                    "UPDATE sessions SET heartbeat = $2 WHERE id = $1",
                    vals![session, now_nanos()],
                )?
            };
            if n == 0 {
                return Err(MetaError::NotFound);
            }
            Ok(())
        })
    }

    fn unregister_session(&self, session: u64) -> Result<()> {
        self.d.write(|tx| {
            if tx.dialect().is_postgres() {
                tx.batch("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
            }
            end_sessions(tx, &[session])
        })
    }

    fn db_now(&self) -> Result<Nanos> {
        self.d.read(db_now)
    }

    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT id, client_name, host, pid, mountpoint, version, started, heartbeat \
                 FROM sessions ORDER BY id",
                vals![],
                &mut |r| {
                    v.push(session_from_row(&r)?);
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn reap_sessions(&self, timeout_ns: i64) -> Result<usize> {
        self.d.write(|tx| {
            // PostgreSQL: READ COMMITTED (see `end_sessions`); the dead rows are locked as they
            // are found, and a heartbeat that lands meanwhile takes its session out of the
            // list (the condition is checked again on the row's newest version).
            let pg = tx.dialect().is_postgres();
            if pg {
                tx.batch("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
            }
            let limit = db_now(tx)? - timeout_ns;
            let mut dead = Vec::new();
            tx.query_each(
                if pg {
                    "SELECT id FROM sessions WHERE heartbeat < $1 ORDER BY id FOR UPDATE"
                } else {
                    "SELECT id FROM sessions WHERE heartbeat < $1 ORDER BY id"
                },
                vals![limit],
                &mut |r| {
                    dead.push(r.u64(0)?);
                    Ok(())
                },
            )?;
            end_sessions(tx, &dead)?;
            Ok(dead.len())
        })
    }

    fn open_file(&self, session: u64, ino: Ino) -> Result<()> {
        self.d.write(|tx| {
            // The session's row before the inode's (the order `end_sessions` takes them in);
            // SQLite: `record_open` checks the session in its insert.
            if tx.dialect().is_postgres() {
                hold_session(tx, session)?;
            }
            lock1(tx, ino)?;
            // changelog: OPEN (with the record of the open: one statement on PostgreSQL)
            changelog::record_open_logged(tx, session, ino)?;
            Ok(())
        })
    }

    fn close_files(&self, session: u64, inos: &[Ino]) -> Result<()> {
        if inos.is_empty() {
            return Ok(());
        }
        self.record_opens_closes(session, &[], inos).map(|_| ())
    }

    fn record_opens_closes(&self, session: u64, opens: &[Ino], closes: &[Ino]) -> Result<Vec<Ino>> {
        if opens.is_empty() && closes.is_empty() {
            return Ok(Vec::new());
        }
        self.d.write(|tx| {
            // An ended session's opens went with it: nothing to record or count down.
            hold_session(tx, session)?;
            let mut gone = Vec::new();
            let mut opened = Vec::with_capacity(opens.len());
            if !opens.is_empty() {
                // The opens' and the closes' rows, locked in one ordered pass (PostgreSQL).
                let mut all: Vec<Ino> = opens.iter().chain(closes).copied().collect();
                all.sort_unstable();
                all.dedup();
                let mut live = lock_inodes(tx, &all)?;
                for ino in opens {
                    // A file unlinked since its open was answered and not purged yet
                    // (UNLINK_GRACE; no request finds it) is an open orphan again: usable
                    // through that open, left for the purge at its last close. (Only the
                    // purge touches such rows, skipping locked ones: this lock out of order
                    // waits on nobody.)
                    if !live.contains_key(ino)
                        && tx.exec(
                            "UPDATE inodes SET orphan = 1 WHERE ino = $1 AND orphan = 3",
                            vals![*ino],
                        )? == 1
                    {
                        // (a second open of it in this batch finds it here)
                        live.insert(*ino, lock1(tx, *ino)?);
                    }
                    if live.contains_key(ino) {
                        record_open(tx, session, *ino)?;
                        opened.push(*ino);
                    } else {
                        gone.push(*ino);
                    }
                }
            } else {
                lock_rows(tx, closes)?;
            }
            for ino in closes {
                let ino = *ino;
                // The last open of this session goes (one statement: the usual case), or
                // one of several is counted down.
                if tx.exec(
                    "DELETE FROM open_files WHERE session = $1 AND ino = $2 AND count <= 1",
                    vals![session, ino],
                )? == 0
                {
                    tx.exec(
                        "UPDATE open_files SET count = count - 1 WHERE session = $1 AND ino = $2",
                        vals![session, ino],
                    )?;
                }
                purge_if_orphan(tx, ino)?;
            }
            // changelog: OPEN and CLOSE, in the context of whoever opened each file (the
            // client's batch scope). After the row locks (and purges: a record does not need
            // its inode): on PostgreSQL a record holds the order lock until commit.
            let recs: Vec<Rec> = opened
                .iter()
                .map(|ino| Rec::new(RecordType::Open, *ino))
                .chain(closes.iter().map(|ino| Rec::new(RecordType::Close, *ino)))
                .collect();
            changelog::record_all(tx, &recs)?;
            Ok(gone)
        })
    }

    fn client_alive(&self, client: &str, timeout_ns: i64) -> Result<bool> {
        self.d.read(|tx| {
            let limit = db_now(tx)? - timeout_ns;
            tx.exists(
                "SELECT EXISTS (SELECT 1 FROM sessions WHERE client_name = $1 AND heartbeat >= $2)",
                vals![client, limit],
            )
        })
    }

    fn client_session(&self, client: &str) -> Result<Option<(SessionInfo, i64)>> {
        self.d.read(|tx| {
            let now = db_now(tx)?;
            let row = tx.query_opt(
                "SELECT id, client_name, host, pid, mountpoint, version, started, heartbeat \
                 FROM sessions WHERE client_name = $1 ORDER BY id DESC LIMIT 1",
                vals![client],
            )?;
            row.map(|r| {
                let s = session_from_row(&r)?;
                let age = now.saturating_sub(s.heartbeat).max(0);
                Ok((s, age))
            })
            .transpose()
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::core::SqlMeta;
    use crate::engine::{FileData, Locks, Namespace, Sessions};
    use crate::sql::fault::FaultDriver;
    use crate::types::*;

    /// What the session checks cost on SQLite, in statements per operation: an open checks
    /// its session inside its insert (no statement more); a close batch, a lock and a commit
    /// under a session look the session up once (one primary-key lookup more).
    #[test]
    fn session_checks_cost_at_most_one_lookup_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let d = crate::sqlite::SqliteEngine::format(
            &dir.path().join("m.db"),
            &crate::conformance::params(),
        )
        .unwrap();
        let e = SqlMeta::new(FaultDriver::new(d));
        let s = e
            .register_session(&SessionInfo {
                id: 0,
                client_name: "c".into(),
                host: "h".into(),
                pid: 1,
                mountpoint: "/m".into(),
                version: "0".into(),
                started: 0,
                heartbeat: 0,
            })
            .unwrap();
        let layout = Layout {
            stripe_size: 1 << 20,
            targets: vec![0],
        };
        let node = NewNode {
            kind: Kind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            symlink: None,
        };
        let f = e.create(ROOT_INO, b"f", &node, Some(layout), None).unwrap();
        let cost = |op: &dyn Fn()| {
            let n = e.driver().statements();
            op();
            e.driver().statements() - n
        };
        let slice = |obj| Slice {
            seq: 0,
            chunk: 0,
            off: 0,
            len: 10,
            data: SliceData::Object {
                target: 0,
                obj,
                obj_off: 0,
                obj_size: 10,
            },
        };
        let open = cost(&|| e.open_file(s, f.ino).unwrap());
        let close = cost(&|| e.close_files(s, &[f.ino]).unwrap());
        let lock = LockRange {
            session: s,
            owner: 1,
            flock: false,
            typ: LockType::Write,
            start: 0,
            end: 10,
            pid: 1,
        };
        let set_lock = cost(&|| e.set_lock(f.ino, &lock).unwrap());
        let plain = cost(&|| {
            e.commit_slices(f.ino, &[slice(1)], 10, 1).unwrap();
        });
        let under = cost(&|| {
            e.commit_slices_for(s, f.ino, &[slice(2)], 10, 1).unwrap();
        });
        eprintln!(
            "SQLite statements: open_file {open}, close_files {close}, set_lock {set_lock}, \
             commit_slices {plain}, commit_slices_for {under}"
        );
        assert_eq!(
            under,
            plain + 1,
            "a commit under a session: one lookup more"
        );
        // Before the checks: open 3, close 3, lock 3.
        // open: lock the inode, insert the open (its session checked inside), changelog
        assert_eq!(open, 3, "open_file");
        // close: the session lookup, the delete, the orphan check, changelog
        assert_eq!(close, 4, "close_files");
        // lock: the session lookup, the held locks, delete and insert of the owner's locks
        assert_eq!(set_lock, 4, "set_lock");
    }
}
