//! The HSM domain (docs/hsm.md): per-file HSM state, archives, the coordinator's queue and
//! its agents, written once for every engine.
//!
//! **Where the state lives.** A file's flags are the `hsm` column of `inodes` (0: no HSM
//! state), read with every attribute ([`Attr::hsm`]), so the write paths learn whether a file
//! is archived from the row they lock anyway and set DIRTY inside the statement that updates
//! the inode ([`HSM_DIRTY`]): a file with no HSM state costs no statement more. Its archive
//! copy (archive id, key, data version, size, checksum) is a row of `hsm_files`, present only
//! while a copy exists.
//!
//! **The queue.** `hsm_requests` holds every request until it is final and then for
//! [`HsmSettings::keep_done_ns`]. A request is waiting (`state` 0) or started (1, held by an
//! agent) while active; one active request per file and action (enqueue returns the one
//! there). Takers order by `priority DESC, created, id`; the caps count started requests.
//! Every time is the database's clock (`super::session::db_now`).
//!
//! **Locks (PostgreSQL).** Operations on a file lock its inode row first (`lock1`), then its
//! requests: two operations on one file serialise. Takers ([`Hsm::hsm_take`]) run at READ
//! COMMITTED under a transaction-scoped advisory lock ([`TAKE_LOCK`]), so their cap counts
//! are exact, and pick rows `FOR UPDATE SKIP LOCKED`, so a row another transaction is changing
//! is passed over instead of waited for. A request row changed under a REPEATABLE READ
//! transaction after its snapshot fails it with a serialization failure, which the driver
//! retries: a completion racing a cancel sees the cancel.

use std::collections::BTreeMap;

use super::changelog::{self, Rec};
use super::common::{get_attr, lock1, trash_slices};
use super::SqlMeta;
use crate::changelog::RecordType;
use crate::engine::Hsm;
use crate::error::{MetaError, Result};
use crate::hsm::*;
use crate::sql::{Driver, Row, Tx};
use crate::types::*;
use crate::vals;

/// The HSM tables (schema v8).
///
/// - `hsm_archives`: archive backends by id.
/// - `hsm_files`: the archive copy of a file (one at most), while it exists.
/// - `hsm_requests`: the coordinator's queue. `action` is [`HsmAction`]'s number, `state`
///   [`RequestState`]'s; `agent` the agent holding it (started) or that held it last;
///   `copy_key` the copy's key for REMOVE/RESTORE (a REMOVE queued by an unlink outlives the
///   file and its `hsm_files` row); `outcome` what a completion did (1 done, 2 stale), so
///   that a completion sent again (its answer lost) gets the same answer; `restored` (RESTORE)
///   the end of the restored prefix: the file's bytes `0..restored` are committed (kept across
///   a requeue: the committed slices stay).
/// - `hsm_agents`: registered copytool agents; `archives` the ids it serves, comma separated.
pub const SCHEMA: super::schema::Ddl = &[
    "CREATE TABLE hsm_archives (
        id INT PRIMARY KEY,
        url TEXT NOT NULL,
        created INT NOT NULL
    )",
    "CREATE TABLE hsm_files (
        ino INT PRIMARY KEY,
        archive_id INT NOT NULL,
        copy_key TEXT NOT NULL,
        data_version INT NOT NULL,
        size INT NOT NULL,
        checksum TEXT NOT NULL,
        archived_at INT NOT NULL
    )",
    "CREATE INDEX hsm_files_archive ON hsm_files(archive_id)",
    "CREATE TABLE hsm_requests (
        id SERIAL,
        ino INT NOT NULL,
        action INT NOT NULL,
        archive_id INT NOT NULL,
        priority INT NOT NULL,
        state INT NOT NULL,
        agent INT,
        created INT NOT NULL,
        started INT,
        updated INT NOT NULL,
        bytes_moved INT NOT NULL DEFAULT 0,
        bytes_total INT NOT NULL DEFAULT 0,
        attempts INT NOT NULL DEFAULT 0,
        next_try INT NOT NULL DEFAULT 0,
        last_error TEXT,
        copy_key TEXT,
        outcome INT NOT NULL DEFAULT 0,
        restored INT NOT NULL DEFAULT 0
    )",
    "CREATE INDEX hsm_requests_waiting ON hsm_requests(priority DESC, created, id) WHERE state = 0",
    "CREATE INDEX hsm_requests_ino ON hsm_requests(ino, state)",
    "CREATE INDEX hsm_requests_agent ON hsm_requests(agent) WHERE state = 1",
    "CREATE TABLE hsm_agents (
        id SERIAL,
        name TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INT NOT NULL,
        archives TEXT NOT NULL,
        max_requests INT NOT NULL,
        registered INT NOT NULL,
        heartbeat INT NOT NULL
    )",
];

/// The assignment that makes an archived file dirty, for the `UPDATE inodes` of the write
/// paths (`core::data`, `core::namespace`, `core::pcc`): DIRTY (0x2) when ARCHIVED (0x8).
#[macro_export]
#[doc(hidden)]
macro_rules! hsm_dirty_sql {
    () => {
        "hsm = CASE WHEN hsm & 8 <> 0 THEN hsm | 2 ELSE hsm END"
    };
}

/// See [`hsm_dirty_sql`].
pub const HSM_DIRTY: &str = hsm_dirty_sql!();

/// PostgreSQL: the advisory lock takers hold (an arbitrary constant outside `hashtext`'s range).
pub const TAKE_LOCK: i64 = 0x7469_6572_6668_736d; // "tierfhsm"

const REQ_COLS: &str = "id, ino, action, archive_id, priority, state, agent, created, started, \
    updated, bytes_moved, bytes_total, attempts, next_try, last_error, copy_key, restored";

fn req_from_row(r: &Row) -> Result<HsmRequest> {
    let action = r.i64(2)?;
    let state = r.i64(5)?;
    Ok(HsmRequest {
        id: r.u64(0)?,
        ino: r.u64(1)?,
        action: HsmAction::from_num(action)
            .ok_or_else(|| MetaError::Db(format!("bad HSM action {action} in the queue")))?,
        archive_id: r.u32(3)?,
        priority: r.i64(4)? as i32,
        state: RequestState::from_num(state)
            .ok_or_else(|| MetaError::Db(format!("bad HSM request state {state}")))?,
        agent: r.opt_i64(6)?.map(|a| a as u64),
        created: r.i64(7)?,
        started: r.opt_i64(8)?,
        updated: r.i64(9)?,
        bytes_moved: r.u64(10)?,
        bytes_total: r.u64(11)?,
        attempts: r.u32(12)?,
        next_try: r.i64(13)?,
        last_error: r.opt_text(14)?,
        key: r.opt_text(15)?,
        restored: r.u64(16)?,
    })
}

/// The NOTIFY channel of [`crate::engine::Channel::Hsm`] (PostgreSQL). Payloads: `w <archive>`
/// (work to take), `c <request>` (canceled).
pub const NOTIFY_CHANNEL: &str = "tierfs_hsm";

/// The notice of a payload on [`NOTIFY_CHANNEL`].
pub(crate) fn parse_notice(payload: &str) -> Option<crate::engine::Notice> {
    use crate::engine::Notice;
    let (kind, n) = payload.split_once(' ')?;
    match kind {
        "w" => n.parse().ok().map(Notice::HsmWork),
        "c" => n.parse().ok().map(Notice::HsmCancel),
        _ => None,
    }
}

/// Announces `payload` to the agents that listen (PostgreSQL, delivered at commit; SQLite has
/// no notifications: its agents poll).
fn notify(tx: &mut dyn Tx, payload: &str) -> Result<()> {
    if tx.dialect().is_postgres() {
        tx.exec("SELECT pg_notify('tierfs_hsm', $1)", vals![payload])?;
    }
    Ok(())
}

/// Cancels the active requests `where_sql` selects (`$1`, `$2` = now), announcing each.
fn cancel_where(tx: &mut dyn Tx, where_sql: &str, key: i64, now: Nanos) -> Result<u64> {
    let mut ids = Vec::new();
    tx.query_each(
        &format!(
            "UPDATE hsm_requests SET state = 4, updated = $2 \
             WHERE {where_sql} AND state IN (0, 1) RETURNING id"
        ),
        vals![key, now],
        &mut |r| {
            ids.push(r.i64(0)?);
            Ok(())
        },
    )?;
    for id in &ids {
        notify(tx, &format!("c {id}"))?;
    }
    Ok(ids.len() as u64)
}

fn now(tx: &mut dyn Tx) -> Result<Nanos> {
    super::session::db_now(tx)
}

/// Writes a changelog HSM record about `ino` (one statement, nothing when no reader wants it).
fn record(tx: &mut dyn Tx, ino: Ino, event: HsmEvent, error: u32, dirty: bool) -> Result<()> {
    changelog::record(
        tx,
        &Rec::new(RecordType::Hsm, ino).flags(changelog_flags(event, error, dirty)),
    )
    .map(|_| ())
}

/// The error code a changelog record of a failure carries (7 bits; Lustre puts the errno).
const ERR_FAILED: u32 = libc::EIO as u32;

// ---- settings (rows `hsm.<name>` of meta_info)

const SETTING_KEYS: &[&str] = &[
    "hsm.max_per_agent",
    "hsm.max_per_archive",
    "hsm.request_timeout_ns",
    "hsm.max_attempts",
    "hsm.retry_backoff_ns",
    "hsm.keep_done_ns",
    "hsm.default_archive",
    "hsm.remove_archive_on_last_unlink",
];

fn settings(tx: &mut dyn Tx) -> Result<HsmSettings> {
    let mut s = HsmSettings::default();
    let mut rows = Vec::new();
    tx.query_each(
        "SELECT key, value FROM meta_info WHERE key LIKE 'hsm.%'",
        vals![],
        &mut |r| {
            rows.push((r.text(0)?, r.text(1)?));
            Ok(())
        },
    )?;
    for (k, v) in rows {
        let bad = || MetaError::Db(format!("bad HSM setting {k} = {v:?}"));
        let n = || v.parse::<i64>().map_err(|_| bad());
        match k.as_str() {
            "hsm.max_per_agent" => s.max_per_agent = n()? as u32,
            "hsm.max_per_archive" => s.max_per_archive = n()? as u32,
            "hsm.request_timeout_ns" => s.request_timeout_ns = n()?,
            "hsm.max_attempts" => s.max_attempts = n()? as u32,
            "hsm.retry_backoff_ns" => s.retry_backoff_ns = n()?,
            "hsm.keep_done_ns" => s.keep_done_ns = n()?,
            "hsm.default_archive" => s.default_archive = n()? as u32,
            "hsm.remove_archive_on_last_unlink" => s.remove_archive_on_last_unlink = n()? != 0,
            _ => {}
        }
    }
    Ok(s)
}

fn setting_values(s: &HsmSettings) -> [(&'static str, i64); 8] {
    [
        (SETTING_KEYS[0], s.max_per_agent as i64),
        (SETTING_KEYS[1], s.max_per_archive as i64),
        (SETTING_KEYS[2], s.request_timeout_ns),
        (SETTING_KEYS[3], s.max_attempts as i64),
        (SETTING_KEYS[4], s.retry_backoff_ns),
        (SETTING_KEYS[5], s.keep_done_ns),
        (SETTING_KEYS[6], s.default_archive as i64),
        (SETTING_KEYS[7], s.remove_archive_on_last_unlink as i64),
    ]
}

/// The wait before the attempt after `attempts` failed ones: `backoff * 2^(attempts-1)`,
/// at most an hour.
fn backoff(s: &HsmSettings, attempts: u32) -> i64 {
    let shift = attempts.saturating_sub(1).min(20);
    s.retry_backoff_ns
        .saturating_mul(1i64 << shift)
        .min(3600 * 1_000_000_000)
}

// ---- small helpers

fn archive_url(tx: &mut dyn Tx, id: u32) -> Result<Option<String>> {
    tx.query_opt("SELECT url FROM hsm_archives WHERE id = $1", vals![id])?
        .map(|r| r.text(0))
        .transpose()
}

fn copy_of(tx: &mut dyn Tx, ino: Ino) -> Result<Option<(u32, ArchiveCopy)>> {
    tx.query_opt(
        "SELECT archive_id, copy_key, data_version, size, checksum, archived_at \
         FROM hsm_files WHERE ino = $1",
        vals![ino],
    )?
    .map(|r| Ok((r.u32(0)?, copy_from_row(&r, 1)?)))
    .transpose()
}

/// An `hsm_files` row's copy, its columns `copy_key, data_version, size, checksum,
/// archived_at` from column `i` on.
fn copy_from_row(r: &Row, i: usize) -> Result<ArchiveCopy> {
    Ok(ArchiveCopy {
        key: r.text(i)?,
        data_version: r.u64(i + 1)?,
        size: r.u64(i + 2)?,
        checksum: r.text(i + 3)?,
        archived_at: r.i64(i + 4)?,
    })
}

fn active_requests(tx: &mut dyn Tx, ino: Ino) -> Result<Vec<HsmRequest>> {
    let sql = format!(
        "SELECT {REQ_COLS} FROM hsm_requests WHERE ino = $1 AND state IN (0, 1) ORDER BY id"
    );
    let mut v = Vec::new();
    tx.query_each(&sql, vals![ino], &mut |r| {
        v.push(req_from_row(&r)?);
        Ok(())
    })?;
    Ok(v)
}

fn get_request(tx: &mut dyn Tx, id: u64) -> Result<HsmRequest> {
    let sql = format!("SELECT {REQ_COLS} FROM hsm_requests WHERE id = $1");
    match tx.query_opt(&sql, vals![id])? {
        Some(r) => req_from_row(&r),
        None => Err(HsmError::UnknownRequest(id).into()),
    }
}

fn set_flags(tx: &mut dyn Tx, ino: Ino, flags: u32) -> Result<()> {
    tx.exec(
        "UPDATE inodes SET hsm = $2 WHERE ino = $1",
        vals![ino, flags as i64],
    )?;
    Ok(())
}

fn state_of(tx: &mut dyn Tx, a: &Attr) -> Result<HsmState> {
    let copy = copy_of(tx, a.ino)?;
    Ok(HsmState {
        ino: a.ino,
        flags: a.hsm,
        archive_id: copy.as_ref().map(|c| c.0).unwrap_or(0),
        copy: copy.map(|c| c.1),
    })
}

/// The archive a request without one goes to: the file's, else the default, else the only
/// registered one.
fn pick_archive(tx: &mut dyn Tx, file_archive: Option<u32>, asked: Option<u32>) -> Result<u32> {
    if let Some(id) = asked {
        if archive_url(tx, id)?.is_none() {
            return Err(HsmError::UnknownArchive(id).into());
        }
        return Ok(id);
    }
    if let Some(id) = file_archive {
        return Ok(id);
    }
    let s = settings(tx)?;
    if s.default_archive != 0 {
        return Ok(s.default_archive);
    }
    let mut ids = Vec::new();
    tx.query_each(
        "SELECT id FROM hsm_archives ORDER BY id",
        vals![],
        &mut |r| {
            ids.push(r.u32(0)?);
            Ok(())
        },
    )?;
    match ids[..] {
        [] => Err(HsmError::NoArchive.into()),
        [one] => Ok(one),
        _ => Err(HsmError::WhichArchive(ids.len()).into()),
    }
}

/// Fails with `UnknownAgent` unless `agent` is registered: a plain read, so that the
/// reports of one agent's movers (each its own transaction) do not contend for its row.
fn check_agent(tx: &mut dyn Tx, agent: u64) -> Result<()> {
    if tx.exists(
        "SELECT EXISTS (SELECT 1 FROM hsm_agents WHERE id = $1)",
        vals![agent],
    )? {
        Ok(())
    } else {
        Err(HsmError::UnknownAgent(agent).into())
    }
}

/// Fails with `UnknownArchive` unless archive `id` is registered; on PostgreSQL its row is
/// held (`FOR KEY SHARE`) until commit, so that a concurrent [`Hsm::hsm_archive_del`] waits for
/// this transaction and then sees what it queued or registered.
fn hold_archive(tx: &mut dyn Tx, id: u32) -> Result<()> {
    let sql = if tx.dialect().row_locks() {
        "SELECT 1 FROM hsm_archives WHERE id = $1 FOR KEY SHARE"
    } else {
        "SELECT 1 FROM hsm_archives WHERE id = $1"
    };
    match tx.query_opt(sql, vals![id])? {
        Some(_) => Ok(()),
        None => Err(HsmError::UnknownArchive(id).into()),
    }
}

/// Takes the agent's row (its archives and own cap), stamping its heartbeat; `UnknownAgent`.
fn touch_agent(tx: &mut dyn Tx, agent: u64, now: Nanos) -> Result<(Vec<u32>, u32)> {
    let r = tx
        .query_opt(
            "UPDATE hsm_agents SET heartbeat = $2 WHERE id = $1 RETURNING archives, max_requests",
            vals![agent, now],
        )?
        .ok_or(HsmError::UnknownAgent(agent))?;
    Ok((parse_archives(&r.text(0)?), r.u32(1)?))
}

fn parse_archives(s: &str) -> Vec<u32> {
    s.split(',').filter_map(|x| x.trim().parse().ok()).collect()
}

/// A started request of `agent`, locked for the rest of the transaction; None when it is not
/// (any more) this agent's started request.
fn held_request(tx: &mut dyn Tx, agent: u64, request: u64) -> Result<Option<HsmRequest>> {
    let sql = if tx.dialect().row_locks() {
        format!(
            "SELECT {REQ_COLS} FROM hsm_requests WHERE id = $1 AND state = 1 AND agent = $2 \
             FOR UPDATE"
        )
    } else {
        format!("SELECT {REQ_COLS} FROM hsm_requests WHERE id = $1 AND state = 1 AND agent = $2")
    };
    tx.query_opt(&sql, vals![request, agent])?
        .map(|r| req_from_row(&r))
        .transpose()
}

/// Ends a request with `state` (final), now.
fn finish(
    tx: &mut dyn Tx,
    id: u64,
    state: RequestState,
    error: Option<&str>,
    now: Nanos,
) -> Result<()> {
    tx.exec(
        "UPDATE hsm_requests SET state = $2, updated = $3, \
         last_error = COALESCE($4, last_error) WHERE id = $1",
        vals![id, state as i64, now, error],
    )?;
    Ok(())
}

/// Ends a request as succeeded with `outcome` ([`outcome_num`]).
fn succeed(
    tx: &mut dyn Tx,
    id: u64,
    outcome: HsmOutcome,
    error: Option<&str>,
    now: Nanos,
) -> Result<()> {
    finish(tx, id, RequestState::Succeeded, error, now)?;
    tx.exec(
        "UPDATE hsm_requests SET outcome = $2 WHERE id = $1",
        vals![id, outcome_num(outcome)],
    )?;
    Ok(())
}

fn outcome_num(o: HsmOutcome) -> i64 {
    match o {
        HsmOutcome::Done => 1,
        HsmOutcome::Stale => 2,
        HsmOutcome::Canceled => 0,
    }
}

/// After a failed or timed-out attempt of `r`: waiting again with backoff, or failed for good.
fn retry_or_fail(
    tx: &mut dyn Tx,
    s: &HsmSettings,
    r: &HsmRequest,
    error: &str,
    retry: bool,
    now: Nanos,
) -> Result<RequestState> {
    if retry && r.attempts < s.max_attempts {
        tx.exec(
            "UPDATE hsm_requests SET state = 0, agent = NULL, updated = $2, next_try = $3, \
             bytes_moved = 0, last_error = $4 WHERE id = $1",
            vals![r.id, now, now.saturating_add(backoff(s, r.attempts)), error],
        )?;
        Ok(RequestState::Waiting)
    } else {
        finish(tx, r.id, RequestState::Failed, Some(error), now)?;
        let event = match r.action {
            HsmAction::Archive => HsmEvent::Archive,
            HsmAction::Restore => HsmEvent::Restore,
            HsmAction::Remove => HsmEvent::Remove,
        };
        record(tx, r.ino, event, ERR_FAILED, false)?;
        Ok(RequestState::Failed)
    }
}

/// Commits objects no slice will reference (a restore stopped): counted and trashed.
fn trash_unused(tx: &mut dyn Tx, ino: Ino, slices: &[Slice]) -> Result<()> {
    super::data::trash_new_objects(tx, ino, slices)
}

impl<D: Driver> Hsm for SqlMeta<D> {
    fn hsm_archive_add(&self, id: u32, url: &str) -> Result<()> {
        if id == 0 || id > MAX_ARCHIVE_ID {
            return Err(HsmError::BadArchiveId(id).into());
        }
        if !(url.starts_with("file:///") || url.starts_with("s3://")) {
            return Err(MetaError::Invalid(format!(
                "archive URL '{url}': expected file:///dir or s3://bucket/prefix"
            )));
        }
        self.d.write(|tx| {
            let now = now(tx)?;
            // Two adds of one id at once: one inserts, the other finds it (no key error).
            let n = tx.exec(
                "INSERT INTO hsm_archives (id, url, created) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO NOTHING",
                vals![id, url, now],
            )?;
            if n == 0 {
                let have = archive_url(tx, id)?.unwrap_or_default();
                return Err(HsmError::ArchiveExists(id, have).into());
            }
            Ok(())
        })
    }

    fn hsm_archive_del(&self, id: u32) -> Result<()> {
        self.d.write(|tx| {
            let found = if tx.dialect().is_postgres() {
                // The archive's row first, waiting for the transactions that hold it
                // (`hold_archive`: queuing, registering, importing); at READ COMMITTED the
                // counts below then see what they committed.
                tx.batch("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
                tx.query_opt(
                    "SELECT 1 FROM hsm_archives WHERE id = $1 FOR UPDATE",
                    vals![id],
                )?
                .is_some()
            } else {
                archive_url(tx, id)?.is_some()
            };
            if !found {
                return Err(HsmError::UnknownArchive(id).into());
            }
            let copies = tx.int(
                "SELECT COUNT(*) FROM hsm_files WHERE archive_id = $1",
                vals![id],
            )?;
            let active = tx.int(
                "SELECT COUNT(*) FROM hsm_requests WHERE archive_id = $1 AND state IN (0, 1)",
                vals![id],
            )?;
            if copies + active > 0 {
                return Err(HsmError::ArchiveInUse(id, (copies + active) as u64).into());
            }
            tx.exec("DELETE FROM hsm_archives WHERE id = $1", vals![id])?;
            tx.exec(
                "DELETE FROM meta_info WHERE key = 'hsm.default_archive' AND value = $1",
                vals![id.to_string()],
            )?;
            Ok(())
        })
    }

    fn hsm_archives(&self) -> Result<Vec<Archive>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT id, url, created FROM hsm_archives ORDER BY id",
                vals![],
                &mut |r| {
                    v.push(Archive {
                        id: r.u32(0)?,
                        url: r.text(1)?,
                        created: r.i64(2)?,
                    });
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn hsm_settings(&self) -> Result<HsmSettings> {
        self.d.read(settings)
    }

    fn hsm_set_settings(&self, s: &HsmSettings) -> Result<()> {
        if s.max_per_agent == 0 || s.max_per_archive == 0 {
            return Err(HsmError::BadSetting("the caps must be at least 1".into()).into());
        }
        if s.max_attempts == 0 {
            return Err(HsmError::BadSetting("max_attempts must be at least 1".into()).into());
        }
        if s.request_timeout_ns <= 0 || s.retry_backoff_ns < 0 || s.keep_done_ns < 0 {
            return Err(HsmError::BadSetting(
                "request_timeout must be positive, retry_backoff and keep_done not negative".into(),
            )
            .into());
        }
        self.d.write(|tx| {
            if s.default_archive != 0 && archive_url(tx, s.default_archive)?.is_none() {
                return Err(HsmError::UnknownArchive(s.default_archive).into());
            }
            for (k, v) in setting_values(s) {
                tx.exec(
                    "INSERT INTO meta_info (key, value) VALUES ($1, $2) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    vals![k, v.to_string()],
                )?;
            }
            Ok(())
        })
    }

    fn hsm_state(&self, ino: Ino) -> Result<HsmState> {
        self.d.read(|tx| {
            let a = get_attr(tx, ino)?;
            state_of(tx, &a)
        })
    }

    fn hsm_set_flags(&self, ino: Ino, set: u32, clear: u32) -> Result<HsmState> {
        let bad = (set | clear) & !HsmFlags::USER_SETTABLE;
        if bad != 0 {
            return Err(HsmError::NotSettable(bad).into());
        }
        self.d.write(|tx| {
            let mut a = lock1(tx, ino)?;
            if a.kind != Kind::File {
                return Err(HsmError::NotAFile.into());
            }
            let old = a.hsm.0;
            let mut new = (old | set) & !clear;
            if set != 0 {
                new |= HsmFlags::EXISTS;
            }
            if new != old {
                set_flags(tx, ino, new)?;
                a.hsm = HsmFlags(new);
                record(tx, ino, HsmEvent::State, 0, a.hsm.dirty())?;
            }
            state_of(tx, &a)
        })
    }

    fn hsm_release(&self, ino: Ino) -> Result<Attr> {
        self.d.write(|tx| {
            let a = lock1(tx, ino)?;
            if a.kind != Kind::File {
                return Err(HsmError::NotAFile.into());
            }
            let f = a.hsm;
            if f.released() {
                return Ok(a);
            }
            if !f.archived() {
                return Err(HsmError::ReleaseNotArchived.into());
            }
            if f.dirty() {
                return Err(HsmError::ReleaseDirty.into());
            }
            if f.has(HsmFlags::NORELEASE) {
                return Err(HsmError::ReleaseNoRelease.into());
            }
            if f.has(HsmFlags::LOST) {
                return Err(HsmError::Lost.into());
            }
            if copy_of(tx, ino)?.is_none() {
                return Err(HsmError::ReleaseNotArchived.into());
            }
            if tx.exists(
                "SELECT EXISTS (SELECT 1 FROM open_files WHERE ino = $1)",
                vals![ino],
            )? {
                return Err(HsmError::ReleaseOpen("on a client").into());
            }
            if tx.exists(
                "SELECT EXISTS (SELECT 1 FROM pcc_leases WHERE ino = $1)",
                vals![ino],
            )? {
                return Err(HsmError::ReleaseOpen("held in a client's RW-PCC cache").into());
            }
            if let Some(r) = active_requests(tx, ino)?.first() {
                return Err(HsmError::Busy(r.action).into());
            }
            trash_slices(tx, ino, "TRUE", &[])?;
            tx.exec(
                "UPDATE inodes SET allocated = 0, hsm = $2 WHERE ino = $1",
                vals![ino, (f.0 | HsmFlags::RELEASED) as i64],
            )?;
            record(tx, ino, HsmEvent::Release, 0, false)?;
            get_attr(tx, ino)
        })
    }

    fn hsm_import(&self, archive_id: u32, items: &[HsmImport]) -> Result<Vec<Attr>> {
        for it in items {
            super::common::check_name(&it.name)?;
        }
        self.d.write(|tx| {
            hold_archive(tx, archive_id)?;
            let now = now(tx)?;
            let flags = (HsmFlags::EXISTS | HsmFlags::ARCHIVED | HsmFlags::RELEASED) as i64;
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                let node = NewNode {
                    kind: Kind::File,
                    perm: it.perm,
                    uid: it.uid,
                    gid: it.gid,
                    rdev: 0,
                    symlink: None,
                };
                let a = super::namespace::create_in(
                    tx,
                    it.parent,
                    &it.name,
                    &node,
                    Some(it.layout.clone()),
                    None,
                )?;
                tx.exec(
                    "UPDATE inodes SET size = $2, mtime = $3, data_version = 1, hsm = $4 \
                     WHERE ino = $1",
                    vals![a.ino, it.size, it.mtime, flags],
                )?;
                tx.exec(
                    "INSERT INTO hsm_files (ino, archive_id, copy_key, data_version, size, \
                     checksum, archived_at) VALUES ($1, $2, $3, 1, $4, $5, $6)",
                    vals![
                        a.ino,
                        archive_id,
                        it.key.as_str(),
                        it.size,
                        it.checksum.as_str(),
                        now
                    ],
                )?;
                out.push(get_attr(tx, a.ino)?);
            }
            Ok(out)
        })
    }

    fn hsm_request(
        &self,
        ino: Ino,
        action: HsmAction,
        archive_id: Option<u32>,
    ) -> Result<Option<HsmRequest>> {
        self.d.write(|tx| {
            let a = lock1(tx, ino)?;
            if a.kind != Kind::File {
                return Err(HsmError::NotAFile.into());
            }
            let active = active_requests(tx, ino)?;
            if let Some(r) = active.iter().find(|r| r.action == action) {
                return Ok(Some(r.clone()));
            }
            let copy = copy_of(tx, ino)?;
            let f = a.hsm;
            let (archive, key, total) = match action {
                HsmAction::Archive => {
                    if f.has(HsmFlags::NOARCHIVE) {
                        return Err(HsmError::NoArchiveFlag.into());
                    }
                    if f.released() {
                        return Err(HsmError::Released.into());
                    }
                    if let Some(r) = active.first() {
                        return Err(HsmError::Busy(r.action).into());
                    }
                    let have = copy.as_ref().map(|c| c.0);
                    let id = pick_archive(tx, have, archive_id)?;
                    if let Some(h) = have {
                        if h != id {
                            return Err(HsmError::OtherArchive { have: h, asked: id }.into());
                        }
                    }
                    (id, None, a.size)
                }
                HsmAction::Restore => {
                    if !f.released() {
                        return Ok(None);
                    }
                    if f.has(HsmFlags::LOST) {
                        return Err(HsmError::Lost.into());
                    }
                    let (id, c) = copy.ok_or(HsmError::NoCopy)?;
                    if let Some(asked) = archive_id {
                        if asked != id {
                            return Err(HsmError::OtherArchive { have: id, asked }.into());
                        }
                    }
                    (id, Some(c.key), c.size)
                }
                HsmAction::Remove => {
                    let (id, c) = copy.ok_or(HsmError::NoCopy)?;
                    if f.released() {
                        // The copy is the only one.
                        return Err(HsmError::Released.into());
                    }
                    if let Some(r) = active.first() {
                        return Err(HsmError::Busy(r.action).into());
                    }
                    if let Some(asked) = archive_id {
                        if asked != id {
                            return Err(HsmError::OtherArchive { have: id, asked }.into());
                        }
                    }
                    (id, Some(c.key), 0)
                }
            };
            hold_archive(tx, archive)?;
            let now = now(tx)?;
            let sql = format!(
                "INSERT INTO hsm_requests (ino, action, archive_id, priority, state, created, \
                 updated, bytes_total, next_try, copy_key) \
                 VALUES ($1, $2, $3, $4, 0, $5, $5, $6, $5, $7) RETURNING {REQ_COLS}"
            );
            let r = tx.one(
                &sql,
                vals![
                    ino,
                    action as i64,
                    archive,
                    action.default_priority() as i64,
                    now,
                    total,
                    key.as_deref()
                ],
            )?;
            if !f.has(HsmFlags::EXISTS) {
                // The file has HSM state from now on (its purge then forgets its requests).
                set_flags(tx, ino, f.0 | HsmFlags::EXISTS)?;
            }
            notify(tx, &format!("w {archive}"))?;
            Ok(Some(req_from_row(&r)?))
        })
    }

    fn hsm_cancel(&self, ino: Ino) -> Result<u64> {
        self.d.write(|tx| {
            match lock1(tx, ino) {
                Ok(_) | Err(MetaError::NotFound) => {}
                Err(e) => return Err(e),
            }
            let now = now(tx)?;
            let n = cancel_where(tx, "ino = $1", ino as i64, now)?;
            if n == 0 {
                return Err(HsmError::NothingToCancel.into());
            }
            record(tx, ino, HsmEvent::Cancel, 0, false)?;
            Ok(n)
        })
    }

    fn hsm_cancel_request(&self, id: u64) -> Result<HsmRequest> {
        self.d.write(|tx| {
            let r = get_request(tx, id)?;
            match lock1(tx, r.ino) {
                Ok(_) | Err(MetaError::NotFound) => {}
                Err(e) => return Err(e),
            }
            let now = now(tx)?;
            let n = cancel_where(tx, "id = $1", id as i64, now)?;
            if n == 0 {
                return Err(HsmError::NothingToCancel.into());
            }
            record(tx, r.ino, HsmEvent::Cancel, 0, false)?;
            get_request(tx, id)
        })
    }

    fn hsm_get_request(&self, id: u64) -> Result<HsmRequest> {
        self.d.read(|tx| get_request(tx, id))
    }

    fn hsm_action(&self, ino: Ino) -> Result<Option<HsmRequest>> {
        self.d.read(|tx| {
            let sql = format!(
                "SELECT {REQ_COLS} FROM hsm_requests WHERE ino = $1 \
                 ORDER BY CASE WHEN state IN (0, 1) THEN 0 ELSE 1 END, updated DESC, id DESC \
                 LIMIT 1"
            );
            tx.query_opt(&sql, vals![ino])?
                .map(|r| req_from_row(&r))
                .transpose()
        })
    }

    fn hsm_list(&self, filter: &HsmListFilter) -> Result<Vec<HsmRequest>> {
        self.d.read(|tx| {
            let mut sql = format!("SELECT {REQ_COLS} FROM hsm_requests WHERE TRUE");
            if !filter.include_done {
                sql.push_str(" AND state IN (0, 1)");
            }
            if filter.ino.is_some() {
                sql.push_str(" AND ino = $1");
            } else {
                sql.push_str(" AND $1 = 0");
            }
            if filter.archive_id.is_some() {
                sql.push_str(" AND archive_id = $2");
            } else {
                sql.push_str(" AND $2 = 0");
            }
            sql.push_str(
                " ORDER BY CASE state WHEN 1 THEN 0 WHEN 0 THEN 1 ELSE 2 END, \
                 CASE WHEN state IN (0, 1) THEN -priority ELSE 0 END, \
                 CASE WHEN state IN (0, 1) THEN created ELSE -updated END, id",
            );
            if filter.limit > 0 {
                sql.push_str(&format!(" LIMIT {}", filter.limit));
            }
            let mut v = Vec::new();
            tx.query_each(
                &sql,
                vals![filter.ino.unwrap_or(0), filter.archive_id.unwrap_or(0)],
                &mut |r| {
                    v.push(req_from_row(&r)?);
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn hsm_agent_register(&self, info: &HsmAgentInfo) -> Result<u64> {
        if info.archives.is_empty() {
            return Err(MetaError::Invalid(
                "an agent serves at least one archive (--archive N)".into(),
            ));
        }
        self.d.write(|tx| {
            for id in &info.archives {
                hold_archive(tx, *id)?;
            }
            let now = now(tx)?;
            let archives: Vec<String> = info.archives.iter().map(|a| a.to_string()).collect();
            Ok(tx.int(
                "INSERT INTO hsm_agents (name, host, pid, archives, max_requests, registered, \
                 heartbeat) VALUES ($1, $2, $3, $4, $5, $6, $6) RETURNING id",
                vals![
                    info.name.as_str(),
                    info.host.as_str(),
                    info.pid,
                    archives.join(","),
                    info.max_requests,
                    now
                ],
            )? as u64)
        })
    }

    fn hsm_agent_heartbeat(&self, agent: u64) -> Result<()> {
        self.d.write_priority(|tx| {
            let now = now(tx)?;
            touch_agent(tx, agent, now).map(|_| ())
        })
    }

    fn hsm_agent_unregister(&self, agent: u64) -> Result<u64> {
        self.d.write(|tx| {
            let now = now(tx)?;
            // Its requests wait again, the attempt not counted (it gave them back).
            let mut archives = Vec::new();
            tx.query_each(
                "UPDATE hsm_requests SET state = 0, agent = NULL, updated = $2, next_try = $2, \
                 bytes_moved = 0, attempts = GREATEST(attempts - 1, 0) \
                 WHERE agent = $1 AND state = 1 RETURNING archive_id",
                vals![agent, now],
                &mut |r| {
                    archives.push(r.u32(0)?);
                    Ok(())
                },
            )?;
            if tx.exec("DELETE FROM hsm_agents WHERE id = $1", vals![agent])? == 0 {
                return Err(HsmError::UnknownAgent(agent).into());
            }
            let n = archives.len() as u64;
            // Other agents may take them now: one notice per archive.
            archives.sort_unstable();
            archives.dedup();
            for a in archives {
                notify(tx, &format!("w {a}"))?;
            }
            Ok(n)
        })
    }

    fn hsm_agents(&self) -> Result<Vec<HsmAgent>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT a.id, a.name, a.host, a.pid, a.archives, a.max_requests, a.registered, \
                 a.heartbeat, (SELECT COUNT(*) FROM hsm_requests r \
                 WHERE r.agent = a.id AND r.state = 1) \
                 FROM hsm_agents a ORDER BY a.id",
                vals![],
                &mut |r| {
                    v.push(HsmAgent {
                        id: r.u64(0)?,
                        info: HsmAgentInfo {
                            name: r.text(1)?,
                            host: r.text(2)?,
                            pid: r.u32(3)?,
                            archives: parse_archives(&r.text(4)?),
                            max_requests: r.u32(5)?,
                        },
                        registered: r.i64(6)?,
                        heartbeat: r.i64(7)?,
                        running: r.u32(8)?,
                    });
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn hsm_take(&self, agent: u64, max: usize) -> Result<Vec<HsmTask>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.d.write(|tx| {
            if tx.dialect().is_postgres() {
                // Exact caps: takers one after another, each seeing what the previous took.
                tx.batch("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
                tx.exec("SELECT pg_advisory_xact_lock($1)", vals![TAKE_LOCK])?;
            }
            let now = now(tx)?;
            let s = settings(tx)?;
            let (archives, own_cap) = touch_agent(tx, agent, now)?;
            let cap = if own_cap == 0 {
                s.max_per_agent
            } else {
                own_cap.min(s.max_per_agent)
            };
            let held = tx.int(
                "SELECT COUNT(*) FROM hsm_requests WHERE agent = $1 AND state = 1",
                vals![agent],
            )? as u32;
            let mut room = (cap.saturating_sub(held) as usize).min(max);
            let mut running: BTreeMap<u32, u32> = BTreeMap::new();
            tx.query_each(
                "SELECT archive_id, COUNT(*) FROM hsm_requests WHERE state = 1 \
                 GROUP BY archive_id",
                vals![],
                &mut |r| {
                    running.insert(r.u32(0)?, r.u32(1)?);
                    Ok(())
                },
            )?;
            let pick = if tx.dialect().row_locks() {
                format!(
                    "SELECT {REQ_COLS} FROM hsm_requests WHERE state = 0 AND next_try <= $1 \
                     AND archive_id = ANY($2) ORDER BY priority DESC, created, id LIMIT 1 \
                     FOR UPDATE SKIP LOCKED"
                )
            } else {
                format!(
                    "SELECT {REQ_COLS} FROM hsm_requests WHERE state = 0 AND next_try <= $1 \
                     AND archive_id = ANY($2) ORDER BY priority DESC, created, id LIMIT 1"
                )
            };
            let mut tasks = Vec::new();
            while room > 0 {
                let open: Vec<i64> = archives
                    .iter()
                    .filter(|a| running.get(a).copied().unwrap_or(0) < s.max_per_archive)
                    .map(|a| *a as i64)
                    .collect();
                if open.is_empty() {
                    break;
                }
                let Some(row) = tx.query_opt(&pick, vals![now, open])? else {
                    break;
                };
                let r = req_from_row(&row)?;
                let attr = match get_attr(tx, r.ino) {
                    Ok(a) => Some(a),
                    Err(MetaError::NotFound) => None,
                    Err(e) => return Err(e),
                };
                if attr.is_none() && r.action != HsmAction::Remove {
                    // The file went while its request waited.
                    finish(
                        tx,
                        r.id,
                        RequestState::Canceled,
                        Some("the file was deleted"),
                        now,
                    )?;
                    continue;
                }
                // Flags set by hand while it waited: the request is refused now, as it would
                // have been when queued.
                let refused = match (r.action, attr.as_ref().map(|a| a.hsm)) {
                    (HsmAction::Archive, Some(f)) if f.has(HsmFlags::NOARCHIVE) => {
                        Some("the file was marked noarchive")
                    }
                    (HsmAction::Restore, Some(f)) if f.has(HsmFlags::LOST) => {
                        Some("the archive copy was marked lost")
                    }
                    _ => None,
                };
                if let Some(why) = refused {
                    finish(tx, r.id, RequestState::Failed, Some(why), now)?;
                    let event = if r.action == HsmAction::Archive {
                        HsmEvent::Archive
                    } else {
                        HsmEvent::Restore
                    };
                    record(tx, r.ino, event, ERR_FAILED, false)?;
                    continue;
                }
                let copy = match copy_of(tx, r.ino)? {
                    Some((_, c)) => Some(c),
                    None => r.key.clone().map(|key| ArchiveCopy {
                        key,
                        ..Default::default()
                    }),
                };
                let (data_version, size) = match (r.action, &attr, &copy) {
                    (HsmAction::Archive, Some(a), _) => (a.data_version, a.size),
                    (_, _, Some(c)) => (c.data_version, c.size),
                    _ => (0, 0),
                };
                let total = if r.action == HsmAction::Remove {
                    0
                } else {
                    size
                };
                let sql = format!(
                    "UPDATE hsm_requests SET state = 1, agent = $2, started = $3, updated = $3, \
                     attempts = attempts + 1, bytes_moved = 0, bytes_total = $4 \
                     WHERE id = $1 RETURNING {REQ_COLS}"
                );
                let r = req_from_row(&tx.one(&sql, vals![r.id, agent, now, total])?)?;
                *running.entry(r.archive_id).or_default() += 1;
                let archive_url = archive_url(tx, r.archive_id)?.unwrap_or_default();
                tasks.push(HsmTask {
                    request: r,
                    archive_url,
                    data_version,
                    size,
                    copy,
                });
                room -= 1;
            }
            Ok(tasks)
        })
    }

    fn hsm_progress(&self, agent: u64, request: u64, bytes_moved: u64) -> Result<Progress> {
        self.d.write(|tx| {
            let now = now(tx)?;
            check_agent(tx, agent)?;
            let n = tx.exec(
                "UPDATE hsm_requests SET bytes_moved = $3, updated = $4 \
                 WHERE id = $1 AND agent = $2 AND state = 1",
                vals![request, agent, bytes_moved, now],
            )?;
            Ok(if n == 0 {
                Progress::Stop
            } else {
                Progress::Continue
            })
        })
    }

    fn hsm_restore_slices(&self, agent: u64, request: u64, slices: &[Slice]) -> Result<Progress> {
        self.d.write(|tx| {
            let now = now(tx)?;
            check_agent(tx, agent)?;
            let Some(r) = get_request(tx, request).ok() else {
                return Err(HsmError::UnknownRequest(request).into());
            };
            let ino = r.ino;
            let a = match lock1(tx, ino) {
                Ok(a) => Some(a),
                Err(MetaError::NotFound) => None,
                Err(e) => return Err(e),
            };
            let held = held_request(tx, agent, request)?;
            let ok = matches!((&a, &held), (Some(a), Some(h))
                if h.action == HsmAction::Restore && a.hsm.released());
            if !ok {
                trash_unused(tx, ino, slices)?;
                return Ok(Progress::Stop);
            }
            let objs = super::data::objects_of(slices);
            let ids: Vec<i64> = objs.iter().map(|o| o.1 as i64).collect();
            if !ids.is_empty()
                && tx.exists(
                    "SELECT EXISTS (SELECT 1 FROM slices WHERE ino = $1 AND obj = ANY($2))",
                    vals![ino, ids],
                )?
            {
                // Sent again (the answer to the first was lost): committed already.
                return Ok(Progress::Continue);
            }
            let delta = super::common::add_slices(tx, ino, slices)?;
            super::common::apply_allocated(tx, ino, delta)?;
            super::data::account_objects(tx, &objs)?;
            // The restored prefix grows when these slices start inside it (a mover commits in
            // file order; slices past a gap leave it where it is).
            let cs = a
                .as_ref()
                .and_then(|a| a.layout.as_ref())
                .map_or(0, |l| l.stripe_size);
            let (lo, hi) = slices.iter().fold((u64::MAX, 0u64), |(lo, hi), s| {
                let start = s.chunk * cs + s.off;
                (lo.min(start), hi.max(start + s.len))
            });
            tx.exec(
                "UPDATE hsm_requests SET updated = $2, \
                 restored = CASE WHEN $3 <= restored AND $4 > restored THEN $4 ELSE restored END \
                 WHERE id = $1",
                vals![request, now, lo.min(i64::MAX as u64), hi],
            )?;
            Ok(Progress::Continue)
        })
    }

    fn hsm_complete(&self, agent: u64, request: u64, done: &HsmDone) -> Result<HsmOutcome> {
        self.d.write(|tx| {
            let r = get_request(tx, request)?;
            let a = match lock1(tx, r.ino) {
                Ok(a) => Some(a),
                Err(MetaError::NotFound) => None,
                Err(e) => return Err(e),
            };
            let now = now(tx)?;
            check_agent(tx, agent)?;
            if r.state == RequestState::Succeeded && r.agent == Some(agent) {
                // This agent's completion, sent again (the answer to the first was lost):
                // the same answer, nothing changes.
                let o = tx.int(
                    "SELECT outcome FROM hsm_requests WHERE id = $1",
                    vals![request],
                )?;
                return Ok(if o == 2 {
                    HsmOutcome::Stale
                } else {
                    HsmOutcome::Done
                });
            }
            let Some(r) = held_request(tx, agent, request)? else {
                return Ok(HsmOutcome::Canceled);
            };
            tx.exec(
                "UPDATE hsm_requests SET bytes_moved = $2 WHERE id = $1",
                vals![request, done.bytes_moved],
            )?;
            let ino = r.ino;
            let Some(a) = a else {
                // The file went: a REMOVE still did its work; others changed nothing.
                if r.action == HsmAction::Remove {
                    succeed(tx, r.id, HsmOutcome::Done, None, now)?;
                    return Ok(HsmOutcome::Done);
                }
                finish(
                    tx,
                    r.id,
                    RequestState::Canceled,
                    Some("the file was deleted"),
                    now,
                )?;
                return Ok(HsmOutcome::Canceled);
            };
            let f = a.hsm.0;
            match r.action {
                HsmAction::Archive => {
                    let lease_dirty = tx.exists(
                        "SELECT EXISTS (SELECT 1 FROM pcc_leases WHERE ino = $1 AND dirty <> 0)",
                        vals![ino],
                    )?;
                    if a.data_version != done.data_version || lease_dirty || a.hsm.released() {
                        succeed(
                            tx,
                            r.id,
                            HsmOutcome::Stale,
                            Some("the file changed during the copy: not recorded"),
                            now,
                        )?;
                        record(tx, ino, HsmEvent::Archive, 0, a.hsm.dirty())?;
                        return Ok(HsmOutcome::Stale);
                    }
                    tx.exec("DELETE FROM hsm_files WHERE ino = $1", vals![ino])?;
                    tx.exec(
                        "INSERT INTO hsm_files (ino, archive_id, copy_key, data_version, size, \
                         checksum, archived_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                        vals![
                            ino,
                            r.archive_id,
                            done.key.as_str(),
                            done.data_version,
                            done.size,
                            done.checksum.as_str(),
                            now
                        ],
                    )?;
                    let new = (f | HsmFlags::EXISTS | HsmFlags::ARCHIVED) & !HsmFlags::DIRTY;
                    set_flags(tx, ino, new)?;
                    succeed(tx, r.id, HsmOutcome::Done, None, now)?;
                    // The key it recorded: the archive sweep keeps it even after the copy's
                    // row went (an unlink keeps the copy unless remove_archive_on_last_unlink).
                    tx.exec(
                        "UPDATE hsm_requests SET copy_key = $2 WHERE id = $1",
                        vals![r.id, done.key.as_str()],
                    )?;
                    record(tx, ino, HsmEvent::Archive, 0, false)?;
                }
                HsmAction::Restore => {
                    set_flags(tx, ino, f & !HsmFlags::RELEASED)?;
                    succeed(tx, r.id, HsmOutcome::Done, None, now)?;
                    record(tx, ino, HsmEvent::Restore, 0, a.hsm.dirty())?;
                }
                HsmAction::Remove => {
                    tx.exec("DELETE FROM hsm_files WHERE ino = $1", vals![ino])?;
                    set_flags(tx, ino, f & !HsmFlags::ARCHIVED)?;
                    succeed(tx, r.id, HsmOutcome::Done, None, now)?;
                    record(tx, ino, HsmEvent::Remove, 0, a.hsm.dirty())?;
                }
            }
            Ok(HsmOutcome::Done)
        })
    }

    fn hsm_fail(&self, agent: u64, request: u64, error: &str, retry: bool) -> Result<RequestState> {
        self.d.write(|tx| {
            let r = get_request(tx, request)?;
            match lock1(tx, r.ino) {
                Ok(_) | Err(MetaError::NotFound) => {}
                Err(e) => return Err(e),
            }
            let now = now(tx)?;
            check_agent(tx, agent)?;
            let Some(r) = held_request(tx, agent, request)? else {
                return Ok(RequestState::Canceled);
            };
            let s = settings(tx)?;
            retry_or_fail(tx, &s, &r, error, retry, now)
        })
    }

    fn hsm_housekeep(&self) -> Result<(u64, u64, u64)> {
        self.d.write(|tx| {
            let now = now(tx)?;
            let s = settings(tx)?;
            let stale_before = now.saturating_sub(s.request_timeout_ns);
            let sql = format!(
                "SELECT {REQ_COLS} FROM hsm_requests WHERE state = 1 AND updated < $1 ORDER BY id"
            );
            let mut stale = Vec::new();
            tx.query_each(&sql, vals![stale_before], &mut |r| {
                stale.push(req_from_row(&r)?);
                Ok(())
            })?;
            for r in &stale {
                let msg = format!(
                    "agent {} reported nothing for {} s: requeued",
                    r.agent.unwrap_or(0),
                    s.request_timeout_ns / 1_000_000_000
                );
                retry_or_fail(tx, &s, r, &msg, true, now)?;
            }
            let dropped = tx.exec(
                "DELETE FROM hsm_agents WHERE heartbeat < $1 \
                 AND NOT EXISTS (SELECT 1 FROM hsm_requests r \
                 WHERE r.agent = hsm_agents.id AND r.state = 1)",
                vals![stale_before],
            )?;
            let purged = tx.exec(
                "DELETE FROM hsm_requests WHERE state NOT IN (0, 1) AND updated < $1",
                vals![now.saturating_sub(s.keep_done_ns)],
            )?;
            Ok((stale.len() as u64, dropped, purged))
        })
    }

    fn hsm_sweepable(&self, archive: u32, items: &[SweepItem], grace_ns: i64) -> Result<Vec<bool>> {
        self.d.read(|tx| {
            let ended_before = now(tx)?.saturating_sub(grace_ns.max(0));
            let mut out = Vec::with_capacity(items.len());
            let sql = format!("SELECT {REQ_COLS}, outcome FROM hsm_requests WHERE id = $1");
            // the column after REQ_COLS
            let outcome_col = REQ_COLS.split(',').count();
            for it in items {
                let Some(row) = tx.query_opt(&sql, vals![it.request])? else {
                    out.push(false);
                    continue;
                };
                let r = req_from_row(&row)?;
                let recorded_here = r.state == RequestState::Succeeded
                    && row.i64(outcome_col)? == outcome_num(HsmOutcome::Done)
                    && r.key.as_deref() == Some(it.key.as_str());
                let ours = r.ino == it.ino
                    && r.action == HsmAction::Archive
                    && r.archive_id == archive
                    && !r.state.is_active()
                    && r.updated < ended_before;
                // A copy this request recorded is kept, unless a later archive of the same
                // file (still there) replaced it more than the grace ago: no row names it
                // and no restore can read it (a released file cannot be archived again).
                let superseded = ours
                    && recorded_here
                    && tx.exists(
                        "SELECT EXISTS (SELECT 1 FROM hsm_files WHERE ino = $1 \
                         AND archived_at < $2 AND NOT (archive_id = $3 AND copy_key = $4))",
                        vals![it.ino, ended_before, archive, it.key.as_str()],
                    )?;
                let may = ours
                    && (!recorded_here || superseded)
                    && !tx.exists(
                        "SELECT EXISTS (SELECT 1 FROM hsm_files WHERE archive_id = $1 \
                         AND copy_key = $2)",
                        vals![archive, it.key.as_str()],
                    )?;
                out.push(may);
            }
            Ok(out)
        })
    }

    fn hsm_copies(&self, after: Ino, limit: usize) -> Result<Vec<(Ino, u32, ArchiveCopy)>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT ino, archive_id, copy_key, data_version, size, checksum, archived_at \
                 FROM hsm_files WHERE ino > $1 ORDER BY ino LIMIT $2",
                vals![after, limit as i64],
                &mut |r| {
                    v.push((r.u64(0)?, r.u32(1)?, copy_from_row(&r, 2)?));
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }
}

/// The database's clock in one SQL expression (PostgreSQL), for statements that stamp rows.
const PG_NOW_EXPR: &str = "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint";

/// What purging a file with HSM state (flags not 0) forgets, in the purge's transaction
/// (SQLite; PostgreSQL's purge does the same in its one statement, [`pg_forget_ctes`]): its
/// copy's row goes, with a REMOVE of the copy queued first when
/// [`HsmSettings::remove_archive_on_last_unlink`] is on (and none is active); its other
/// active requests are canceled (a mover holding one is told to stop at its next report).
pub(crate) fn forget_file(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    let now = now(tx)?;
    if let Some((archive, c)) = copy_of(tx, ino)? {
        if settings(tx)?.remove_archive_on_last_unlink {
            tx.exec(
                "INSERT INTO hsm_requests (ino, action, archive_id, priority, state, created, \
                 updated, bytes_total, next_try, copy_key) \
                 SELECT $1, 3, $2, $3, 0, $4, $4, 0, $4, $5 WHERE NOT EXISTS \
                 (SELECT 1 FROM hsm_requests WHERE ino = $1 AND action = 3 AND state IN (0, 1))",
                vals![
                    ino,
                    archive,
                    HsmAction::Remove.default_priority() as i64,
                    now,
                    c.key.as_str()
                ],
            )?;
        }
        tx.exec("DELETE FROM hsm_files WHERE ino = $1", vals![ino])?;
    }
    tx.exec(
        "UPDATE hsm_requests SET state = 4, updated = $2, last_error = 'the file was deleted' \
         WHERE ino = $1 AND state IN (0, 1) AND action <> 3",
        vals![ino, now],
    )?;
    Ok(())
}

/// A request row as fsck reads it: numbers unparsed (a bad one is what it looks for), with
/// its file's flags (`None`: the file is gone) and whether its agent is registered.
struct FsckRequest {
    id: u64,
    ino: Ino,
    action: i64,
    state: i64,
    agent: Option<i64>,
    updated: Nanos,
    file_flags: Option<u32>,
    agent_registered: bool,
}

const FSCK_REQ_SQL: &str = "SELECT r.id, r.ino, r.action, r.state, r.agent, r.updated, \
    (SELECT i.hsm FROM inodes i WHERE i.ino = r.ino), \
    EXISTS (SELECT 1 FROM hsm_agents a WHERE a.id = r.agent) \
    FROM hsm_requests r";

fn fsck_request(r: &Row) -> Result<FsckRequest> {
    Ok(FsckRequest {
        id: r.u64(0)?,
        ino: r.u64(1)?,
        action: r.i64(2)?,
        state: r.i64(3)?,
        agent: r.opt_i64(4)?,
        updated: r.i64(5)?,
        file_flags: r.opt_i64(6)?.map(|f| f as u32),
        agent_registered: r.bool(7)?,
    })
}

/// What is wrong with a request, if anything (`stale_before`: started requests not updated
/// since are held by a dead agent).
fn request_issue(r: &FsckRequest, stale_before: Nanos) -> Option<MetaIssue> {
    let (action, state) = (
        HsmAction::from_num(r.action),
        RequestState::from_num(r.state),
    );
    let bad = |why| {
        Some(MetaIssue::ImpossibleRequest {
            request: r.id,
            ino: r.ino,
            why,
        })
    };
    let (Some(action), Some(state)) = (action, state) else {
        return bad(HsmRequestProblem::UnknownActionOrState);
    };
    if !state.is_active() {
        return None;
    }
    if state == RequestState::Started && r.agent.is_none() {
        return bad(HsmRequestProblem::StartedByNoAgent);
    }
    match r.file_flags {
        // A REMOVE carries its copy's key: it outlives the file (an unlink queues it).
        None if action != HsmAction::Remove => {
            return Some(MetaIssue::RequestOfMissingFile {
                request: r.id,
                ino: r.ino,
            })
        }
        Some(f) if action == HsmAction::Restore && !HsmFlags(f).released() => {
            return bad(HsmRequestProblem::RestoreOfUnreleased)
        }
        _ => {}
    }
    if state == RequestState::Started && (!r.agent_registered || r.updated < stale_before) {
        return Some(MetaIssue::DeadAgentRequest {
            request: r.id,
            ino: r.ino,
            agent: r.agent.unwrap_or(0) as u64,
            registered: r.agent_registered,
        });
    }
    None
}

/// `tierfs fsck`'s look at the HSM rows ([`crate::engine::Admin::meta_issues`]), appended to
/// `out`. Started requests count as held by a dead agent after the coordinator's
/// `request_timeout` without a report, by the database's clock (as the housekeeping judges).
pub(crate) fn fsck_issues(tx: &mut dyn Tx, out: &mut Vec<MetaIssue>) -> Result<()> {
    let stale_before = now(tx)?.saturating_sub(settings(tx)?.request_timeout_ns);
    released_with_data(tx, "", vals![], out)?;
    tx.query_each(
        "SELECT i.ino, i.hsm FROM inodes i WHERE i.hsm & 8 <> 0 \
         AND NOT EXISTS (SELECT 1 FROM hsm_files h WHERE h.ino = i.ino) ORDER BY i.ino",
        vals![],
        &mut |r| {
            out.push(MetaIssue::ArchivedWithoutCopy {
                ino: r.u64(0)?,
                released: HsmFlags(r.i64(1)? as u32).released(),
            });
            Ok(())
        },
    )?;
    tx.query_each(
        "SELECT h.ino, h.archive_id, h.copy_key FROM hsm_files h \
         WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = h.ino) ORDER BY h.ino",
        vals![],
        &mut |r| {
            out.push(MetaIssue::CopyOfMissingFile {
                ino: r.u64(0)?,
                archive_id: r.u32(1)?,
                key: r.text(2)?,
            });
            Ok(())
        },
    )?;
    tx.query_each(
        &format!(
            "{FSCK_REQ_SQL} WHERE r.state IN (0, 1) OR r.state NOT IN (0, 1, 2, 3, 4) \
             OR r.action NOT IN (1, 2, 3) ORDER BY r.id"
        ),
        vals![],
        &mut |r| {
            out.extend(request_issue(&fsck_request(&r)?, stale_before));
            Ok(())
        },
    )?;
    Ok(())
}

/// Repairs one HSM issue of [`fsck_issues`] if it still holds (looked at again in this
/// transaction); whether something changed. What each repair does:
/// - a released file's leftover slices go to the trash (`allocated` 0) when its copy is
///   recorded (the copy holds the file's data); without a copy nothing is touched;
/// - ARCHIVED without a copy is cleared on a file that is not released (its data is in the
///   capacity tier: it can be archived again); a released one is left (its data is lost);
/// - a copy of a file that is gone is forgotten as the file's unlink would have (a REMOVE of
///   it queued first when `remove_archive_on_last_unlink` is on);
/// - a request of a file that is gone, or a RESTORE of a file that is not released, is
///   canceled; one started by no agent goes back to waiting; one of unknown action or state
///   is marked failed;
/// - a dead agent's request is requeued as the housekeeping does (the attempt counts).
pub(crate) fn fsck_repair(tx: &mut dyn Tx, issue: &MetaIssue) -> Result<bool> {
    let now = now(tx)?;
    match issue {
        MetaIssue::ReleasedWithData { ino, .. } => {
            let a = match lock1(tx, *ino) {
                Ok(a) => a,
                Err(MetaError::NotFound) => return Ok(false),
                Err(e) => return Err(e),
            };
            let mut still = Vec::new();
            released_with_data(tx, " AND i.ino = $1", vals![*ino], &mut still)?;
            let ok = a.hsm.released()
                && still
                    .iter()
                    .any(|i| matches!(i, MetaIssue::ReleasedWithData { archived: true, .. }));
            if ok {
                trash_slices(tx, *ino, "TRUE", &[])?;
                tx.exec(
                    "UPDATE inodes SET allocated = 0 WHERE ino = $1",
                    vals![*ino],
                )?;
            }
            Ok(ok)
        }
        MetaIssue::ArchivedWithoutCopy { ino, .. } => {
            let a = match lock1(tx, *ino) {
                Ok(a) => a,
                Err(MetaError::NotFound) => return Ok(false),
                Err(e) => return Err(e),
            };
            if !a.hsm.archived() || a.hsm.released() || copy_of(tx, *ino)?.is_some() {
                return Ok(false);
            }
            set_flags(tx, *ino, a.hsm.0 & !HsmFlags::ARCHIVED)?;
            record(tx, *ino, HsmEvent::State, 0, a.hsm.dirty())?;
            Ok(true)
        }
        MetaIssue::CopyOfMissingFile { ino, .. } => {
            let gone = !tx.exists(
                "SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = $1)",
                vals![*ino],
            )?;
            if gone && copy_of(tx, *ino)?.is_some() {
                forget_file(tx, *ino)?;
                return Ok(true);
            }
            Ok(false)
        }
        MetaIssue::RequestOfMissingFile { request, ino }
        | MetaIssue::ImpossibleRequest { request, ino, .. }
        | MetaIssue::DeadAgentRequest { request, ino, .. } => {
            // The file's row first, as every operation on a file (PostgreSQL's lock order).
            if let Err(e) = lock1(tx, *ino) {
                if !matches!(e, MetaError::NotFound) {
                    return Err(e);
                }
            }
            let s = settings(tx)?;
            let row = tx.query_opt(&format!("{FSCK_REQ_SQL} WHERE r.id = $1"), vals![*request])?;
            let Some(row) = row else { return Ok(false) };
            let found = request_issue(
                &fsck_request(&row)?,
                now.saturating_sub(s.request_timeout_ns),
            );
            if found.as_ref() != Some(issue) {
                return Ok(false);
            }
            let set = |tx: &mut dyn Tx, state: RequestState, why: &str| {
                tx.exec(
                    "UPDATE hsm_requests SET state = $2, updated = $3, last_error = $4 \
                     WHERE id = $1",
                    vals![*request, state as i64, now, why],
                )
            };
            match issue {
                MetaIssue::RequestOfMissingFile { .. } => {
                    set(tx, RequestState::Canceled, "the file was deleted (fsck)")?;
                    notify(tx, &format!("c {request}"))?;
                }
                MetaIssue::ImpossibleRequest { why, .. } => match why {
                    HsmRequestProblem::UnknownActionOrState => {
                        set(tx, RequestState::Failed, "unknown action or state (fsck)")?;
                    }
                    HsmRequestProblem::StartedByNoAgent => {
                        set(
                            tx,
                            RequestState::Waiting,
                            "started by no agent: requeued (fsck)",
                        )?;
                    }
                    HsmRequestProblem::RestoreOfUnreleased => {
                        set(
                            tx,
                            RequestState::Canceled,
                            "the file is not released (fsck)",
                        )?;
                        notify(tx, &format!("c {request}"))?;
                    }
                },
                MetaIssue::DeadAgentRequest {
                    agent, registered, ..
                } => {
                    let r = get_request(tx, *request)?;
                    let msg = if *registered {
                        format!(
                            "agent {agent} reported nothing for {} s: requeued (fsck)",
                            s.request_timeout_ns / 1_000_000_000
                        )
                    } else {
                        format!("agent {agent} is not registered: requeued (fsck)")
                    };
                    retry_or_fail(tx, &s, &r, &msg, true, now)?;
                }
                _ => unreachable!("matched above"),
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Released files with slices or allocated bytes and no restore running (`extra`: more of
/// the WHERE clause, with its `$1`).
fn released_with_data(
    tx: &mut dyn Tx,
    extra: &str,
    args: &[crate::sql::Value],
    out: &mut Vec<MetaIssue>,
) -> Result<()> {
    tx.query_each(
        &format!(
            "SELECT i.ino, i.allocated, (SELECT COUNT(*) FROM slices s WHERE s.ino = i.ino), \
             EXISTS (SELECT 1 FROM hsm_files h WHERE h.ino = i.ino) \
             FROM inodes i WHERE i.hsm & 4 <> 0{extra} \
             AND (i.allocated <> 0 OR EXISTS (SELECT 1 FROM slices s WHERE s.ino = i.ino)) \
             AND NOT EXISTS (SELECT 1 FROM hsm_requests r \
                 WHERE r.ino = i.ino AND r.action = 2 AND r.state IN (0, 1)) ORDER BY i.ino"
        ),
        args,
        &mut |r| {
            out.push(MetaIssue::ReleasedWithData {
                ino: r.u64(0)?,
                allocated: r.u64(1)?,
                slices: r.u64(2)?,
                archived: r.bool(3)?,
            });
            Ok(())
        },
    )
}

/// PostgreSQL: [`forget_file`] as common table expressions of the purge statement
/// (`core::common`). They run for every purge (each an index probe that finds nothing for a
/// file without HSM state), in the same round trip.
pub(crate) fn pg_forget_ctes() -> String {
    format!(
        "h AS (DELETE FROM hsm_files WHERE ino = $1 RETURNING archive_id, copy_key), \
         q AS (INSERT INTO hsm_requests (ino, action, archive_id, priority, state, created, \
             updated, bytes_total, next_try, copy_key) \
             SELECT $1, 3, h.archive_id, {prio}, 0, {PG_NOW_EXPR}, {PG_NOW_EXPR}, 0, \
             {PG_NOW_EXPR}, h.copy_key FROM h \
             WHERE EXISTS (SELECT 1 FROM meta_info \
                 WHERE key = 'hsm.remove_archive_on_last_unlink' AND value <> '0') \
             AND NOT EXISTS (SELECT 1 FROM hsm_requests \
                 WHERE ino = $1 AND action = 3 AND state IN (0, 1))), \
         c AS (UPDATE hsm_requests SET state = 4, updated = {PG_NOW_EXPR}, \
             last_error = 'the file was deleted' \
             WHERE ino = $1 AND state IN (0, 1) AND action <> 3)",
        prio = HsmAction::Remove.default_priority()
    )
}

#[cfg(test)]
mod tests {
    use crate::core::SqlMeta;
    use crate::engine::{FileData, Hsm, Namespace, Sessions};
    use crate::hsm::*;
    use crate::sql::fault::FaultDriver;
    use crate::types::*;

    #[test]
    fn backoff_doubles_up_to_an_hour() {
        let s = HsmSettings {
            retry_backoff_ns: 10,
            ..Default::default()
        };
        let v: Vec<i64> = (1..=4).map(|n| super::backoff(&s, n)).collect();
        assert_eq!(v, [10, 20, 40, 80]);
        let s = HsmSettings::default();
        assert_eq!(super::backoff(&s, 30), 3600 * 1_000_000_000);
    }

    #[test]
    fn notices_parse() {
        use crate::engine::Notice;
        assert_eq!(super::parse_notice("w 3"), Some(Notice::HsmWork(3)));
        assert_eq!(super::parse_notice("c 42"), Some(Notice::HsmCancel(42)));
        assert_eq!(super::parse_notice("x 1"), None);
        assert_eq!(super::parse_notice("w"), None);
        assert_eq!(super::parse_notice("w -1"), None);
    }

    /// 10,000 files import as released files in one batch (`tierfs hsm import` of a tree);
    /// the time is printed (no assertion on speed).
    #[test]
    fn ten_thousand_files_import_in_one_batch_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let e = crate::sqlite::SqliteMeta::format(
            &dir.path().join("m.db"),
            &crate::conformance::params(),
        )
        .unwrap();
        e.hsm_archive_add(1, "file:///a").unwrap();
        let items: Vec<HsmImport> = (0..10_000)
            .map(|i| HsmImport {
                parent: ROOT_INO,
                name: format!("f{i:05}").into_bytes(),
                perm: 0o644,
                uid: 0,
                gid: 0,
                size: i,
                mtime: 1,
                key: format!("tree/f{i:05}"),
                checksum: String::new(),
                layout: Layout {
                    stripe_size: 1 << 20,
                    targets: vec![0],
                },
            })
            .collect();
        let t = std::time::Instant::now();
        let got = e.hsm_import(1, &items).unwrap();
        eprintln!("imported 10,000 released files in {:?}", t.elapsed());
        assert_eq!(got.len(), 10_000);
        let last = e.lookup(ROOT_INO, b"f09999").unwrap();
        assert!(last.hsm.released());
        assert_eq!(last.size, 9999);
        assert_eq!(
            e.hsm_state(last.ino).unwrap().copy.unwrap().key,
            "tree/f09999"
        );
    }

    /// SQLite statements of each step of a small file's life, HSM state or not. The figures
    /// of a file without HSM state are those measured at de045df, before HSM (the same probe
    /// run there), plus one statement in each step that frees slices (truncate, write-back,
    /// unlink) since `trash_slices` reads the freed objects with a `SELECT` before a plain
    /// `DELETE` on SQLite instead of one `DELETE ... RETURNING` (which loads every freed
    /// slice's inline bytes), and one more in unlink, whose inode row is read and deleted the
    /// same way: HSM costs such a file nothing. An archived file's writes cost the same
    /// (DIRTY is set inside the inode's update; its changelog record is gated like every
    /// record); only its unlink does more (its copy and requests are forgotten).
    #[test]
    fn hsm_costs_a_file_without_hsm_state_no_statement_on_sqlite() {
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
        e.hsm_archive_add(1, "file:///a").unwrap();
        let agent = e
            .hsm_agent_register(&HsmAgentInfo {
                archives: vec![1],
                ..Default::default()
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
        let cost = |op: &mut dyn FnMut()| {
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
        // [create+open, commit under the session, close, getattr, truncate, fallocate,
        // write-back, unlink, the purge that frees it]
        let life = |name: &[u8], archived: bool| -> [u64; 9] {
            let mut g = 0;
            let create = cost(&mut || {
                g = e
                    .create(ROOT_INO, name, &node, Some(layout.clone()), Some(s))
                    .unwrap()
                    .ino
            });
            let mut steps = [create, 0, 0, 0, 0, 0, 0, 0, 0];
            if archived {
                // (Archived empty, so that both files hold the same slices.)
                let r = e.hsm_request(g, HsmAction::Archive, None).unwrap().unwrap();
                let t = e.hsm_take(agent, 1).unwrap().pop().unwrap();
                let done = HsmDone {
                    data_version: t.data_version,
                    ..Default::default()
                };
                e.hsm_complete(agent, r.id, &done).unwrap();
                assert!(e.getattr(g).unwrap().hsm.archived());
            }
            steps[1] = cost(&mut || {
                e.commit_slices_for(s, g, &[slice(1)], 10, 1).unwrap();
            });
            assert_eq!(e.getattr(g).unwrap().hsm.dirty(), archived);
            steps[2] = cost(&mut || e.close_files(s, &[g]).unwrap());
            steps[3] = cost(&mut || {
                e.getattr(g).unwrap();
            });
            steps[4] = cost(&mut || {
                e.setattr(
                    g,
                    &SetAttr {
                        size: Some(5),
                        ..Default::default()
                    },
                )
                .unwrap();
            });
            steps[5] = cost(&mut || {
                e.fallocate(g, 0, 100, false, false).unwrap();
            });
            steps[6] = cost(&mut || {
                e.rewrite_data(g, &[slice(2)], 10, 2).unwrap();
            });
            steps[7] = cost(&mut || {
                e.unlink(ROOT_INO, name).unwrap();
            });
            steps[8] = cost(&mut || {
                assert_eq!(
                    e.purge_unlinked(64, now_nanos() + 1).unwrap(),
                    u64::from(!archived)
                );
            });
            steps
        };
        let plain = life(b"plain", false);
        let archived = life(b"archived", true);
        eprintln!("SQLite statements, no HSM state: {plain:?}; archived: {archived:?}");
        assert_eq!(
            plain,
            [7, 8, 4, 1, 9 + 1, 4, 8 + 1, 11, 11],
            "as before HSM (de045df), with the SELECTs before the DELETEs, and the unlink's \
             freeing of the file (15 + 2 statements in all) moved to the purge"
        );
        assert_eq!(
            archived[..7],
            plain[..7],
            "an archived file's writes cost the same"
        );
        // An archived file is freed by its unlink, which forgets its HSM state at once.
        assert!(archived[7] > plain[7]);
        assert_eq!(archived[8], 1, "the purge finds nothing");
    }
}
