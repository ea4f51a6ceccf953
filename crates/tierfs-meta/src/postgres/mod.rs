//! The cluster metadata engine: PostgreSQL (`postgres://user[:password]@host[:port]/db`).
//!
//! Same tables, schema versions and semantics as [`crate::sqlite`]; many clients on many
//! machines share one database.
//!
//! **Transactions.** Every write method is one `REPEATABLE READ` transaction. Rows are locked
//! in one global order so that concurrent operations cannot deadlock:
//!
//! 1. the `rename_lock` row of `counters`, only by renames that move a directory to another
//!    parent (the equivalent of Linux's `s_vfs_rename_mutex`: the "is the target inside the
//!    source?" walk up the tree then cannot race another such rename);
//! 2. inode rows, in ascending inode number, all in one statement ([`lock_inodes`]);
//! 3. `targets` rows in ascending id (space accounting), then other counters.
//!
//! An inode row guards everything that belongs to it: its dentries when it is a directory, its
//! slices, open files, locks, xattrs and lease. Every transaction that reads such state to
//! decide a write first *updates* the inode row (`SET ino = ino`, a real new row version: under
//! REPEATABLE READ a mere `FOR UPDATE` of a row that another transaction only locked is not a
//! conflict). Two transactions on the same inode are therefore serialised: the second waits,
//! then fails with a serialization failure and is retried with a fresh snapshot. Names looked
//! up before the locks are taken stay valid because any change to a directory's entries also
//! updates the directory's row. Serialization failures (SQLSTATE 40001) and deadlocks (40P01)
//! are retried with bounded exponential backoff and jitter; after [`MAX_RETRIES`] tries or
//! [`RETRY_BUDGET`], whichever comes first, the caller gets `Busy` (EAGAIN).
//!
//! `slices.seq` is a BIGSERIAL. Sequence values are handed out at insert time, not commit
//! time, but `commit_slices` inserts while holding its inode row, so the slices of one file get
//! their numbers in commit order: the newest commit wins.
//!
//! Reads that are one statement (lookup, getattr, read_chunk, ...) run outside a transaction,
//! as the SQLite engine's reads do: one statement always sees one consistent snapshot.
//!
//! **Connections.** A pool ([`pool`]) of at most [`POOL_MAX`] connections, each keeping its
//! prepared statements. A connection that fails is dropped, never reused; the next call
//! connects anew, so the engine recovers by itself when the database comes back. While it is
//! away calls fail with [`MetaError::Unavailable`] (EIO) after the connect timeout. A pooled
//! connection found dead when its transaction begins (the database restarted since its last
//! use) is replaced at once, without an error, since nothing was sent on it. The session's
//! heartbeat has one connection of its own beside the pool ([`Driver::write_priority`],
//! connected at first use and again after it broke): a pool exhausted by long transactions or
//! busy with I/O does not delay it, so a busy client is not taken for dead.
//!
//! **Durability.** A commit returns once PostgreSQL has flushed its WAL (with the server's
//! default `synchronous_commit = on`), so [`MetaEngine::sync`] has nothing left to do, and
//! housekeeping is autovacuum's.
//!
//! **Notifications.** `pcc_request_revoke` sends `NOTIFY tierfs_pcc_revoke` (payload:
//! `"<ino> <holder client>"`) in its transaction, delivered at commit. HSM requests queued,
//! given back or canceled send `NOTIFY tierfs_hsm` (`core::hsm::NOTIFY_CHANNEL`).
//! [`MetaEngine::listen`] opens a connection of its own outside the pool, `LISTEN`s on the
//! channels asked for, and returns a [`PgListener`] that waits for them and keeps those
//! addressed to its client, so a lease holder learns of a revoke request at once instead of
//! polling. PostgreSQL does not queue notifications for a session that is not listening: a
//! subscriber calls [`MetaEngine::pcc_revokes_for`] once after subscribing and now and then,
//! and when [`Listener::wait`] fails (connection lost) falls back to polling and listens again
//! later.

pub mod pgpass;
pub(crate) mod pool;

use std::time::{Duration, Instant};

use postgres::error::SqlState;

use crate::core::schema;
pub use crate::core::schema::SCHEMA_VERSION;
use crate::core::SqlMeta;
use crate::engine::{Channel, Listener, Notice};
use crate::error::{MetaError, Result};
use crate::sql::postgres::PgTx;
use crate::sql::{Dialect, DialectKind, Driver, Tx};
use crate::types::*;
pub(crate) use pool::PgConn;
use pool::Pool;

/// Attempts of one transaction before giving up with `Busy`.
pub const MAX_RETRIES: u32 = 40;
/// How long one write may keep retrying conflicts before the caller gets `Busy` (a row that
/// others update all the time, such as a file opened in a tight loop by another client, can
/// make one transaction lose many times in a row).
pub const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// Connections one engine keeps open at most.
pub const POOL_MAX: usize = 16;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The channel revoke requests are announced on.
pub const REVOKE_CHANNEL: &str = "tierfs_pcc_revoke";

/// Maps a driver error: serialization failures and deadlocks become `Busy` (retried by the
/// caller), a lost or refused connection `Unavailable`.
pub(crate) fn pg_err(e: postgres::Error) -> MetaError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            return MetaError::Busy(0);
        }
        if *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS
        {
            return MetaError::Unavailable(db.message().to_string());
        }
        if *code == SqlState::INVALID_CATALOG_NAME {
            return MetaError::Db(format!(
                "{} (create it first, e.g. with createdb)",
                db.message()
            ));
        }
        return MetaError::Db(db.message().to_string());
    }
    let io = std::error::Error::source(&e)
        .map(|s| s.is::<std::io::Error>())
        .unwrap_or(false);
    let text = e.to_string();
    if e.is_closed()
        || io
        || text.starts_with("error connecting")
        || text.starts_with("error communicating")
        || text.starts_with("timeout")
    {
        return MetaError::Unavailable(text);
    }
    MetaError::Db(text)
}

/// A parsed, validated PostgreSQL URL; prints without its password.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl(String);

impl PgUrl {
    pub fn parse(s: &str) -> Result<PgUrl> {
        if !(s.starts_with("postgres://") || s.starts_with("postgresql://")) {
            return Err(MetaError::BadUrl(redact(s)));
        }
        let cfg: postgres::Config = s
            .parse()
            .map_err(|e| MetaError::BadUrl(format!("{}: {e}", redact(s))))?;
        if cfg.get_hosts().is_empty() {
            return Err(MetaError::BadUrl(format!("{}: no host", redact(s))));
        }
        if cfg.get_dbname().is_none() {
            return Err(MetaError::BadUrl(format!(
                "{}: no database name (postgres://user@host/db)",
                redact(s)
            )));
        }
        Ok(PgUrl(s.to_string()))
    }

    /// The full URL, with its password: for connecting only, never for printing.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Connection settings: the URL's, with defaults for what it leaves out (a connect
    /// timeout, TCP keepalives and a user timeout so a vanished server is noticed, the password
    /// from `PGPASSWORD`, else from the password file, `PGPASSFILE` or `~/.pgpass`).
    pub fn config(&self) -> Result<postgres::Config> {
        let mut cfg: postgres::Config = self
            .0
            .parse()
            .map_err(|e| MetaError::BadUrl(format!("{self}: {e}")))?;
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(CONNECT_TIMEOUT);
        }
        if cfg.get_tcp_user_timeout().is_none() {
            cfg.tcp_user_timeout(Duration::from_secs(30));
        }
        cfg.keepalives(true);
        cfg.keepalives_idle(Duration::from_secs(10));
        // Every transaction is REPEATABLE READ: those the engine begins say so, and a
        // one-statement write (`Driver::write_one`), sent without BEGIN, gets it from here.
        let opts = cfg
            .get_options()
            .map(|o| format!("{o} "))
            .unwrap_or_default();
        cfg.options(&format!(
            "{opts}-c default_transaction_isolation=repeatable\\ read"
        ));
        if cfg.get_application_name().is_none() {
            cfg.application_name("tierfs");
        }
        if cfg.get_password().is_none() {
            if let Ok(p) = std::env::var("PGPASSWORD") {
                cfg.password(p);
            } else if let Some(file) = pgpass::default_path() {
                let host = match cfg.get_hosts().first() {
                    Some(postgres::config::Host::Tcp(h)) => h.clone(),
                    _ => "localhost".to_string(),
                };
                let port = cfg.get_ports().first().copied().unwrap_or(5432);
                let db = cfg.get_dbname().unwrap_or_default().to_string();
                let user = cfg.get_user().unwrap_or_default().to_string();
                if let Some(p) = pgpass::lookup(&file, &host, port, &db, &user) {
                    cfg.password(p);
                }
            }
        }
        Ok(cfg)
    }
}

impl std::fmt::Display for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgUrl({self})")
    }
}

/// `s` without its password (the user name, host and database stay), for places other users
/// can read, such as a mount's info file; tools then take the password from `PGPASSWORD`.
pub fn without_password(s: &str) -> String {
    match url::Url::parse(s) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => s.to_string(),
    }
}

/// Whether the URL `s` carries a password (after the user name, or as a `password=` query
/// parameter): such a URL must never be on a command line, where every user can read it.
pub fn has_password(s: &str) -> bool {
    match url::Url::parse(s) {
        Ok(u) => u.password().is_some() || u.query_pairs().any(|(k, _)| k == "password"),
        Err(_) => false,
    }
}

/// `s` with any password replaced by `***`.
pub fn redact(s: &str) -> String {
    if let Ok(mut u) = url::Url::parse(s) {
        if u.password().is_some() {
            let _ = u.set_password(Some("***"));
        }
        for (k, _) in u.query_pairs() {
            if k == "password" {
                // Rare; drop the whole query rather than rebuild it.
                u.set_query(Some("password=***"));
                break;
            }
        }
        return u.to_string();
    }
    match (s.find("://"), s.rfind('@')) {
        (Some(a), Some(b)) if b > a => format!("{}://***@{}", &s[..a], &s[b + 1..]),
        _ => s.to_string(),
    }
}

pub struct PgEngine {
    url: PgUrl,
    pool: Pool,
    /// One connection for [`Driver::write_priority`] (the heartbeat) alone: never behind the
    /// pool's other users. Connected when first used, again after it broke.
    priority: Pool,
    dialect: Dialect,
    /// Transactions begun (`BEGIN` sent) so far: what a one-statement write saves.
    begun: std::sync::atomic::AtomicU64,
}

/// Backoff before retry `attempt` (1-based): 2 ms doubling to 256 ms, with jitter.
fn backoff(attempt: u32) -> Duration {
    let base = 2u64 << attempt.min(7);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let jitter = nanos % (base * 1000).max(1);
    Duration::from_micros(base * 500 + jitter / 2)
}

/// Why a transaction attempt failed, and whether it is worth another go.
enum TxFail {
    /// The reused connection was dead before anything ran: connect again, no error.
    Stale(MetaError),
    Error(MetaError),
}

impl PgEngine {
    fn new(url: &str) -> Result<PgEngine> {
        let url = PgUrl::parse(url)?;
        let cfg = url.config()?;
        Ok(PgEngine {
            priority: Pool::new(cfg.clone(), 1, Duration::from_secs(30)),
            pool: Pool::new(cfg, POOL_MAX, Duration::from_secs(30)),
            url,
            dialect: Dialect::new(DialectKind::Postgres),
            begun: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Write transactions begun so far (each a `BEGIN` and a `COMMIT` or `ROLLBACK` round
    /// trip beside its statements; one-statement writes begin none).
    pub fn transactions_begun(&self) -> u64 {
        self.begun.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The URL, without its password.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// Opens a formatted filesystem, migrating its schema if it is older than this build.
    pub fn open(url: &str) -> Result<PgEngine> {
        let e = Self::new(url)?;
        schema::open(&e, &e.url.to_string())?;
        Ok(e)
    }

    /// The schema version, or None when the database holds no tierfs tables.
    fn schema_version(&self) -> Result<Option<i64>> {
        Driver::read(self, |tx| {
            if !tx.exists("SELECT to_regclass('schema_version') IS NOT NULL", &[])? {
                return Ok(None);
            }
            tx.query_opt("SELECT version FROM schema_version", &[])?
                .map(|r| r.i64(0))
                .transpose()
        })
    }

    /// Runs `f` in one READ COMMITTED transaction under the migration advisory lock, taken
    /// before anything is read (so it sees what another migrator committed meanwhile).
    fn exclusive_tx<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        let (mut c, _) = self.pool.get()?;
        c.batch(&format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({})",
            schema::PG_MIGRATION_LOCK
        ))?;
        match f(&mut PgTx::new(&mut c, &self.dialect)) {
            Ok(v) => {
                c.batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = c.batch("ROLLBACK");
                c.discard();
                Err(e)
            }
        }
    }

    /// Creates a new filesystem in the (existing) database: schema, settings, targets and the
    /// root directory. A database that already holds one is refused unless `force`, which
    /// drops its tables first.
    pub fn format(url: &str, p: &FormatParams) -> Result<PgEngine> {
        if p.targets.is_empty() {
            return Err(MetaError::Invalid(
                "at least one storage target is needed".into(),
            ));
        }
        let e = Self::new(url)?;
        if let Some(v) = e.schema_version()? {
            if v > 0 && !p.force {
                let name = crate::core::admin::fs_info(&e)
                    .map(|i| i.name)
                    .unwrap_or_default();
                return Err(MetaError::AlreadyFormatted(name));
            }
            let (mut c, _) = e.pool.get()?;
            let mut tables = schema::tables();
            tables.push("schema_version");
            let drop = format!("DROP TABLE IF EXISTS {} CASCADE", tables.join(", "));
            c.batch(&format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({}); {drop}; \
                 COMMIT",
                schema::PG_MIGRATION_LOCK
            ))?;
        }
        e.pool.clear();
        schema::migrate(&e)?;
        crate::core::admin::init_filesystem(&e, p)?;
        Ok(e)
    }

    /// Like `write`, but an inner `Err` is committed (work done before a reported failure,
    /// such as trashing the objects of a file that went away, is kept).
    fn write_commit<T>(
        &self,
        f: impl FnMut(&mut PgConn) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        self.write_commit_on(&self.pool, f)
    }

    /// [`PgEngine::write_commit`] on a connection of `pool`.
    fn write_commit_on<T>(
        &self,
        pool: &Pool,
        mut f: impl FnMut(&mut PgConn) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        let mut attempt = 0u32;
        let mut stale = 0u32;
        let started = Instant::now();
        loop {
            let (mut c, reused) = pool.get()?;
            let r = (|| {
                self.begun
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Err(e) = c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ") {
                    return Err(if reused && matches!(e, MetaError::Unavailable(_)) {
                        TxFail::Stale(e)
                    } else {
                        TxFail::Error(e)
                    });
                }
                match f(&mut c) {
                    Ok(v) => match c.batch("COMMIT") {
                        Ok(()) => Ok(v),
                        Err(e) => Err(TxFail::Error(e)),
                    },
                    Err(e) => {
                        if c.batch("ROLLBACK").is_err() {
                            c.discard();
                        }
                        Err(TxFail::Error(e))
                    }
                }
            })();
            match r {
                Ok(v) => return Ok(v),
                Err(TxFail::Stale(e)) => {
                    c.discard();
                    stale += 1;
                    if stale > POOL_MAX as u32 {
                        return Err(e);
                    }
                    tracing::debug!("metadata connection was closed, connecting again");
                }
                Err(TxFail::Error(MetaError::Busy(_)))
                    if attempt < MAX_RETRIES && started.elapsed() < RETRY_BUDGET =>
                {
                    attempt += 1;
                    drop(c);
                    let d = backoff(attempt);
                    tracing::debug!(attempt, "metadata transaction conflict, retrying in {d:?}");
                    std::thread::sleep(d);
                }
                Err(TxFail::Error(MetaError::Busy(_))) => {
                    tracing::warn!(
                        attempt,
                        "metadata transaction still conflicting after {:?}",
                        started.elapsed()
                    );
                    return Err(MetaError::Busy(attempt));
                }
                Err(TxFail::Error(e)) => {
                    if matches!(e, MetaError::Unavailable(_)) {
                        c.discard();
                    }
                    return Err(e);
                }
            }
        }
    }

    /// [`Driver::write_one`]: `f`'s one statement outside a transaction, retried as
    /// [`PgEngine::write_commit_on`] retries a transaction (a serialization failure or
    /// deadlock: backoff; a reused connection found dead: a new one, the statement again).
    /// With `resend` false ([`Driver::write_once`]) a statement is never sent twice: only a
    /// connection already known to be closed is replaced, before sending.
    fn write_one_on<T>(
        &self,
        pool: &Pool,
        resend: bool,
        mut f: impl FnMut(&mut PgConn) -> Result<T>,
    ) -> Result<T> {
        let mut attempt = 0u32;
        let mut stale = 0u32;
        let started = Instant::now();
        loop {
            let (mut c, reused) = pool.get()?;
            if reused && c.client.is_closed() && stale < POOL_MAX as u32 {
                c.discard();
                stale += 1;
                continue;
            }
            match f(&mut c) {
                Ok(v) => return Ok(v),
                Err(MetaError::Unavailable(e)) if resend && reused && stale < POOL_MAX as u32 => {
                    // (the statement is idempotent: sent again on a new connection)
                    c.discard();
                    stale += 1;
                    tracing::debug!("metadata connection was closed, connecting again: {e}");
                }
                Err(MetaError::Busy(_))
                    if attempt < MAX_RETRIES && started.elapsed() < RETRY_BUDGET =>
                {
                    attempt += 1;
                    drop(c);
                    let d = backoff(attempt);
                    tracing::debug!(attempt, "metadata statement conflict, retrying in {d:?}");
                    std::thread::sleep(d);
                }
                Err(MetaError::Busy(_)) => {
                    tracing::warn!(
                        attempt,
                        "metadata statement still conflicting after {:?}",
                        started.elapsed()
                    );
                    return Err(MetaError::Busy(attempt));
                }
                Err(e) => {
                    if matches!(e, MetaError::Unavailable(_)) {
                        c.discard();
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Runs read-only `f` outside a transaction (each statement sees one snapshot).
    fn read<T>(&self, mut f: impl FnMut(&mut PgConn) -> Result<T>) -> Result<T> {
        let mut stale = 0u32;
        let mut attempt = 0u32;
        let started = Instant::now();
        loop {
            let (mut c, reused) = self.pool.get()?;
            match f(&mut c) {
                Err(MetaError::Unavailable(e)) => {
                    c.discard();
                    stale += 1;
                    if !reused || stale > POOL_MAX as u32 {
                        return Err(MetaError::Unavailable(e));
                    }
                }
                // A read's statements rarely conflict (a deadlock with a lock it waits for);
                // retried as a write's are, so that every operation keeps the promise that a
                // busy database is retried (core::fault_tests).
                Err(MetaError::Busy(_))
                    if attempt < MAX_RETRIES && started.elapsed() < RETRY_BUDGET =>
                {
                    attempt += 1;
                    drop(c);
                    std::thread::sleep(backoff(attempt));
                }
                other => return other,
            }
        }
    }

    /// A LISTEN connection of its own, outside the pool (see the module doc).
    fn listen_conn(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        let mut conn = self.pool.connect()?;
        let mut sql = String::new();
        for ch in channels {
            sql.push_str(&format!("LISTEN {};", pg_channel(*ch)));
        }
        conn.batch_execute(&sql).map_err(pg_err)?;
        Ok(Some(Box::new(PgListener {
            conn,
            client: client.to_string(),
        })))
    }

    /// Closes the idle pooled connections (the next calls connect anew).
    pub fn reset_connections(&self) {
        self.pool.clear();
        self.priority.clear();
    }
}

/// The PostgreSQL channel a [`Channel`] is announced on.
fn pg_channel(ch: Channel) -> &'static str {
    match ch {
        Channel::PccRevoke => REVOKE_CHANNEL,
        Channel::Changelog => crate::core::changelog::NOTIFY_CHANNEL,
        Channel::Hsm => crate::core::hsm::NOTIFY_CHANNEL,
    }
}

/// A LISTEN connection; see [`MetaEngine::listen`] and the module doc.
pub struct PgListener {
    conn: postgres::Client,
    client: String,
}

impl PgListener {
    /// The notice a notification carries, if it is addressed to this listener's client.
    fn notice(&self, n: &postgres::Notification) -> Option<Notice> {
        if n.channel() == crate::core::changelog::NOTIFY_CHANNEL {
            return Some(Notice::Changelog);
        }
        if n.channel() == crate::core::hsm::NOTIFY_CHANNEL {
            return crate::core::hsm::parse_notice(n.payload());
        }
        if n.channel() == REVOKE_CHANNEL {
            let (ino, holder) = n.payload().split_once(' ')?;
            if holder == self.client {
                return ino.parse::<u64>().ok().map(Notice::PccRevoke);
            }
        }
        None
    }
}

impl Listener for PgListener {
    fn wait(&mut self, timeout: Duration) -> Result<Vec<Notice>> {
        use postgres::fallible_iterator::FallibleIterator;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Once something arrived, only take what is already there.
            let wait = if out.is_empty() { left } else { Duration::ZERO };
            let next = self.conn.notifications().timeout_iter(wait).next();
            match next {
                Ok(Some(n)) => {
                    if let Some(x) = self.notice(&n) {
                        if !out.contains(&x) {
                            out.push(x);
                        }
                    }
                }
                Ok(None) => {
                    // The iterator also ends, without an error, when the server closed the
                    // connection: that must not look like "nothing happened".
                    if self.conn.is_closed() {
                        return Err(MetaError::Unavailable(
                            "the PostgreSQL connection listening for notifications was closed"
                                .into(),
                        ));
                    }
                    if !out.is_empty() || Instant::now() >= deadline {
                        return Ok(out);
                    }
                }
                Err(e) => return Err(pg_err(e)),
            }
        }
    }
}

/// The PostgreSQL engine: the shared core over the PostgreSQL driver.
pub type PgMeta = SqlMeta<PgEngine>;

impl SqlMeta<PgEngine> {
    /// Opens a formatted filesystem, migrating its schema if it is older than this build.
    pub fn open(url: &str) -> Result<PgMeta> {
        Ok(SqlMeta::new(PgEngine::open(url)?))
    }

    /// Creates a new filesystem in the (existing) database; see [`PgEngine::format`].
    pub fn format(url: &str, p: &FormatParams) -> Result<PgMeta> {
        Ok(SqlMeta::new(PgEngine::format(url, p)?))
    }
}

impl Driver for PgEngine {
    fn dialect(&self) -> &Dialect {
        &self.dialect
    }

    fn write_commit<T>(
        &self,
        mut f: impl FnMut(&mut dyn Tx) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        PgEngine::write_commit(self, |c| f(&mut PgTx::new(c, &self.dialect)))
    }

    fn read<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        PgEngine::read(self, |c| f(&mut PgTx::new(c, &self.dialect)))
    }

    fn write_one<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write_one_on(&self.pool, true, |c| f(&mut PgTx::single(c, &self.dialect)))
    }

    fn write_once<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write_one_on(&self.pool, false, |c| {
            f(&mut PgTx::single(c, &self.dialect))
        })
    }

    fn write_priority<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write_commit_on(&self.priority, |c| {
            f(&mut PgTx::new(c, &self.dialect)).map(Ok)
        })?
    }

    fn exclusive<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.exclusive_tx(f)
    }

    fn sync(&self) -> Result<()> {
        // Commits are durable once they return (synchronous_commit = on).
        Ok(())
    }

    fn maintain(&self) -> Result<()> {
        // Housekeeping is autovacuum's.
        Ok(())
    }

    fn listen(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        self.listen_conn(client, channels)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod url_tests {
    #[test]
    fn urls_with_passwords_are_recognized() {
        assert!(super::has_password("postgres://u:secret@h:5/db"));
        assert!(super::has_password("postgresql://u@h/db?password=secret"));
        assert!(!super::has_password("postgres://u@h:5/db"));
        assert!(!super::has_password("postgres://u@h/db?sslmode=disable"));
        assert!(!super::has_password("sqlite:///x.db"));
        assert!(!super::has_password("/some/path"));
    }

    #[test]
    fn passwords_never_leave_in_shared_places() {
        assert_eq!(
            super::without_password("postgres://u:secret@h:5/db"),
            "postgres://u@h:5/db"
        );
        assert_eq!(super::without_password("sqlite:///x.db"), "sqlite:///x.db");
        assert!(!super::redact("postgres://u:secret@h/db").contains("secret"));
    }
}
