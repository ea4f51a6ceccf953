//! RW-PCC leases as every client meets them, with or without a cache of its own: before a
//! client opens a file or changes its size, a file another client holds read-write in its cache
//! is recalled — the owner is asked to write it back and give the lease up
//! ([`MetaEngine::pcc_request_revoke`]), and the client waits until it did. The owner's side of
//! a recall is [`crate::recall`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use tierfs_meta::{Attr, Ino, Kind, MetaEngine, MetaError, PccLease, SessionInfo};

use crate::error::{ClientError, Result};
use crate::liveness::{self, Liveness};
use crate::metrics::Metrics;

/// An owner whose heartbeat is this many heartbeat periods old, by the database's clock, is
/// down as far as its leases go (never later than the session timeout).
pub const DOWN_AFTER_HEARTBEATS: u32 = 3;

/// How often a waiting recall looks at the owner's session again.
const OWNER_CHECK_EVERY: Duration = Duration::from_millis(200);

/// What is known of a lease owner's daemon, by the database's view of its session and, for a
/// daemon of this machine, by its pid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerState {
    /// Its heartbeat is recent.
    Alive,
    /// Its heartbeat is late by this many nanoseconds (not yet late enough to be down).
    Silent(i64),
    /// Down: its daemon ran here and is gone, or it has been silent for too long (why).
    Down(String),
    /// No session of that client name: the owner is not mounted.
    NoSession,
}

impl OwnerState {
    /// Whether the owner cannot give a file back.
    pub fn is_down(&self) -> bool {
        matches!(self, OwnerState::Down(_) | OwnerState::NoSession)
    }

    /// As `tierfs pcc state` prints it.
    pub fn describe(&self) -> String {
        match self {
            OwnerState::Alive => "alive".into(),
            OwnerState::Silent(ns) => format!("silent for {:.1} s", *ns as f64 / 1e9),
            OwnerState::Down(why) => format!("down ({why})"),
            OwnerState::NoSession => "no session".into(),
        }
    }
}

/// The newest session of `client` and the age of its heartbeat in nanoseconds, by the
/// database's clock.
fn client_session(meta: &dyn MetaEngine, client: &str) -> Result<Option<(SessionInfo, i64)>> {
    Ok(meta.client_session(client)?)
}

/// Files remembered as found without a lease (bounded; cleared when full).
const UNLEASED_MAX: usize = 100_000;

/// Why an open or truncate must fail rather than use stale or missing data.
fn owner_down() -> ClientError {
    ClientError::Errno(
        "the RW-PCC owner of this file is down and holds data not yet written back",
        libc::EHOSTDOWN,
    )
}

/// What [`Recaller::check`] (or, without waiting, [`Recaller::look`]) found.
#[derive(Debug)]
pub enum Lease {
    /// No client holds the file: the attributes the check was given are still good.
    Free,
    /// A lease was there and is gone now (given back, or a dead owner's clean lease broken):
    /// the file's data and attributes may have changed, read them again.
    Recalled,
    /// This client holds the lease (only for a client with a cache, which serves the file).
    Ours(PccLease),
    /// Another client holds the lease: only [`Recaller::look`] and [`Recaller::look_ino`]
    /// answer this, without waiting; [`Recaller::recall`] (blocking, off the FUSE request
    /// threads) then waits until the owner gives the file back.
    Held(PccLease),
}

/// How a recall ended ([`Recaller::recall_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recalled {
    /// The lease is gone (given back or broken): open again.
    Gone,
    /// The owner wrote back a snapshot for read request number `.0` and keeps the lease.
    Snapshot(u64),
}

/// Recalls RW-PCC leases other clients hold, for this client's opens and truncates.
pub struct Recaller {
    meta: Arc<dyn MetaEngine>,
    metrics: Arc<Metrics>,
    client: String,
    /// Whether this client has a cache (leases in its name are then its cache's).
    cached: bool,
    /// How long to wait for an owner to give a file back (`pcc_recall_timeout_secs`).
    recall_timeout: Duration,
    /// An owner silent this long is down: [`DOWN_AFTER_HEARTBEATS`] heartbeat periods, at most
    /// the session timeout.
    down_after: Duration,
    /// Files found without a lease, with their data version at the time. Taking a lease moves
    /// the file's data version in the same transaction ([`MetaEngine::pcc_acquire`]), so while
    /// the version an open reads is still this one, nobody took a lease since: the open needs
    /// no lease query.
    unleased: Mutex<HashMap<Ino, u64>>,
    /// When each file's EHOSTDOWN was last logged (once a minute per file: a program that
    /// retries must not flood the log).
    down_logged: Mutex<HashMap<Ino, Instant>>,
}

impl Recaller {
    pub fn new(
        meta: Arc<dyn MetaEngine>,
        metrics: Arc<Metrics>,
        client: String,
        cached: bool,
        recall_timeout: Duration,
        heartbeat: Duration,
        session_timeout: Duration,
    ) -> Recaller {
        Recaller {
            meta,
            metrics,
            client,
            cached,
            recall_timeout,
            down_after: (heartbeat * DOWN_AFTER_HEARTBEATS).min(session_timeout),
            unleased: Mutex::new(HashMap::new()),
            down_logged: Mutex::new(HashMap::new()),
        }
    }

    /// This client's name (leases in it are its own).
    pub fn client(&self) -> &str {
        &self.client
    }

    /// Before an open of `attr`'s file (read just now): recalls another client's lease, waiting
    /// until it is given back. Costs no metadata query when this client already found the file
    /// without a lease at its current data version, one otherwise.
    pub fn check(&self, attr: &Attr) -> Result<Lease> {
        let found = self.look(attr)?;
        self.wait_if_held(found)
    }

    /// [`Recaller::check`] for a request that has not read the file's attributes (a
    /// truncate): one lease query.
    pub fn check_ino(&self, ino: Ino) -> Result<Lease> {
        let found = self.look_ino(ino)?;
        self.wait_if_held(found)
    }

    /// [`Recaller::check`] without waiting: another client's lease comes back as
    /// [`Lease::Held`] (recall it with [`Recaller::recall`] off the request thread). A lease in
    /// this client's name without its data here is settled as `check` does (no waiting).
    pub fn look(&self, attr: &Attr) -> Result<Lease> {
        if attr.kind != Kind::File {
            return Ok(Lease::Free);
        }
        if self.unleased.lock().get(&attr.ino) == Some(&attr.data_version) {
            return Ok(Lease::Free);
        }
        let lease = self.meta.pcc_lease(attr.ino)?;
        self.settle(attr.ino, lease, Some(attr.data_version))
    }

    /// [`Recaller::look`] by inode number (one lease query).
    pub fn look_ino(&self, ino: Ino) -> Result<Lease> {
        let lease = self.meta.pcc_lease(ino)?;
        self.settle(ino, lease, None)
    }

    /// Waits for another client's lease to be given back; anything else is settled already.
    fn wait_if_held(&self, found: Lease) -> Result<Lease> {
        match found {
            Lease::Held(l) => {
                self.recall(&l)?;
                Ok(Lease::Recalled)
            }
            settled => Ok(settled),
        }
    }

    fn settle(&self, ino: Ino, lease: Option<PccLease>, version: Option<u64>) -> Result<Lease> {
        match lease {
            None => {
                if let Some(v) = version {
                    let mut g = self.unleased.lock();
                    if g.len() >= UNLEASED_MAX {
                        g.clear();
                    }
                    g.insert(ino, v);
                }
                Ok(Lease::Free)
            }
            Some(l) if l.client == self.client => {
                if self.cached {
                    return Ok(Lease::Ours(l));
                }
                self.ours_without_data(&l)?;
                Ok(Lease::Recalled)
            }
            Some(l) => Ok(Lease::Held(l)),
        }
    }

    /// A lease in this client's name whose data this client does not have (its cache file is
    /// gone, or this mount has no cache while a mount of the same name with one took the
    /// lease): a clean lease is released; dirty data cannot be read.
    pub fn ours_without_data(&self, l: &PccLease) -> Result<()> {
        if !l.dirty {
            // Only that clean lease (a new one, or a dirty one, stays).
            self.meta.pcc_break(l.ino, &self.client, l.generation)?;
            return Ok(());
        }
        if self.cached {
            Err(ClientError::Errno(
                "this client's cached data of the file is lost",
                libc::EIO,
            ))
        } else {
            Err(ClientError::Errno(
                "the file's data is in the cache of a mount of this client name with --cache-dir",
                libc::EHOSTDOWN,
            ))
        }
    }

    /// The state of `client`'s daemon, by the database's view of its newest session: alive,
    /// silent (heartbeat late), down (its daemon ran on this machine and is gone, or its
    /// heartbeat is older than [`DOWN_AFTER_HEARTBEATS`] periods), or no session at all. A
    /// session whose local daemon is gone is ended here and now (its opens and locks go, as
    /// when it times out).
    pub fn owner_state(&self, client: &str) -> Result<OwnerState> {
        let Some((s, age)) = client_session(self.meta.as_ref(), client)? else {
            return Ok(OwnerState::NoSession);
        };
        if let Liveness::Gone(why) = liveness::state(&s) {
            match self.meta.unregister_session(s.id) {
                Ok(()) | Err(MetaError::NotFound) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::warn!("ended session {} of client '{client}' at once: {why}", s.id);
            return Ok(OwnerState::Down(why));
        }
        let down = self.down_after.as_nanos() as i64;
        if age >= down {
            return Ok(OwnerState::Down(format!(
                "no heartbeat for {:.1} s",
                age as f64 / 1e9
            )));
        }
        // A heartbeat a period and a half late is worth saying.
        if age > down / DOWN_AFTER_HEARTBEATS as i64 * 3 / 2 {
            return Ok(OwnerState::Silent(age));
        }
        Ok(OwnerState::Alive)
    }

    /// Waits until another client gives an RW lease back (asking it to, once); blocking, for up
    /// to the recall timeout, so never on a FUSE request thread. A down owner's
    /// clean lease is broken; a down owner's dirty data cannot be read (EHOSTDOWN, as soon as
    /// the owner is known down: see [`Recaller::owner_state`]); an owner that does not give
    /// the file back within the recall timeout gives ETIMEDOUT.
    pub fn recall(&self, lease: &PccLease) -> Result<()> {
        self.recall_for(lease, true).map(|_| ())
    }

    /// [`Recaller::recall`] for an open: `write` false (a read-only open) asks only for a
    /// snapshot when the owner has writers ([`MetaEngine::pcc_request_recall`]) and returns
    /// the request's number once the owner served it ([`Recalled::Snapshot`]: open with it,
    /// [`MetaEngine::pcc_open`]); an owner without writers gives the file back.
    pub fn recall_for(&self, lease: &PccLease, write: bool) -> Result<Recalled> {
        let start = Instant::now();
        let mut asked: Option<u64> = None;
        let mut checked: Option<(String, Instant)> = None;
        self.metrics.pcc("recalls", 1);
        loop {
            let Some(l) = self.meta.pcc_lease(lease.ino)? else {
                return Ok(Recalled::Gone);
            };
            if l.client == self.client {
                return Ok(Recalled::Gone);
            }
            let due = match &checked {
                Some((who, at)) => *who != l.client || at.elapsed() >= OWNER_CHECK_EVERY,
                None => true,
            };
            if due {
                let st = self.owner_state(&l.client)?;
                checked = Some((l.client.clone(), Instant::now()));
                if st.is_down() {
                    if l.dirty {
                        if self.log_down(l.ino) {
                            tracing::warn!(
                                ino = l.ino,
                                owner = %l.client,
                                "the RW-PCC owner of this file is {} and holds data not yet \
                                 written back: EHOSTDOWN until it comes back (or an admin runs \
                                 `tierfs pcc detach --force-stale`)",
                                st.describe()
                            );
                        }
                        return Err(owner_down());
                    }
                    tracing::info!(
                        ino = l.ino,
                        owner = %l.client,
                        "breaking the clean RW-PCC lease of a client that is {}",
                        st.describe()
                    );
                    // Only the clean lease of the generation seen: one taken again or made
                    // dirty since stays, and is looked at again (at once).
                    if self.meta.pcc_break(l.ino, &l.client, l.generation)? {
                        return Ok(Recalled::Gone);
                    }
                    checked = None;
                    continue;
                }
            }
            match asked {
                Some(seq) if !write && l.snapshot >= seq => return Ok(Recalled::Snapshot(seq)),
                Some(_) => {}
                None => asked = Some(self.meta.pcc_request_recall(l.ino, &self.client, write)?),
            }
            if start.elapsed() > self.recall_timeout {
                return Err(ClientError::Errno(
                    "the RW-PCC owner did not give the file back in time",
                    libc::ETIMEDOUT,
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether a down owner's EHOSTDOWN for `ino` is to be logged now (once a minute per file).
    fn log_down(&self, ino: Ino) -> bool {
        let mut g = self.down_logged.lock();
        if g.len() >= 10_000 {
            g.retain(|_, t| t.elapsed() < Duration::from_secs(60));
        }
        match g.get(&ino) {
            Some(t) if t.elapsed() < Duration::from_secs(60) => false,
            _ => {
                g.insert(ino, Instant::now());
                true
            }
        }
    }

    /// The kernel forgot the inode: so may we.
    pub fn forget(&self, ino: Ino) {
        self.unleased.lock().remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_meta::sqlite::SqliteMeta;
    use tierfs_meta::{FormatParams, HOST_ID_SEP};

    fn engine(dir: &std::path::Path) -> Arc<dyn MetaEngine> {
        let p = FormatParams {
            name: "t".into(),
            targets: vec![("file:///tmp/tierfs-lease-test-ost".into(), 0)],
            stripe_count: 1,
            stripe_size: 1 << 20,
            inline_threshold: 0,
            force: false,
        };
        Arc::new(SqliteMeta::format(&dir.join("meta.db"), &p).unwrap())
    }

    fn session(name: &str, host: String, pid: u32) -> SessionInfo {
        SessionInfo {
            id: 0,
            client_name: name.into(),
            host,
            pid,
            mountpoint: "/m".into(),
            version: "0".into(),
            started: 0,
            heartbeat: 0,
        }
    }

    fn recaller(meta: &Arc<dyn MetaEngine>, heartbeat: Duration) -> Recaller {
        Recaller::new(
            Arc::clone(meta),
            Arc::new(Metrics::new()),
            "me".into(),
            false,
            Duration::from_secs(60),
            heartbeat,
            Duration::from_secs(30),
        )
    }

    #[test]
    fn owner_state_by_session_pid_and_heartbeat_age() {
        let dir = tempfile::tempdir().unwrap();
        let meta = engine(dir.path());
        let r = recaller(&meta, Duration::from_secs(1));
        // no session at all
        assert_eq!(r.owner_state("nobody").unwrap(), OwnerState::NoSession);
        assert!(OwnerState::NoSession.is_down());
        // this very process: alive while it heartbeats, silent, then down by its age alone
        // (silent past 1.5 periods of 1 s, down at 3)
        let me = crate::liveness::host_field("h");
        let id = meta
            .register_session(&session("alive", me, std::process::id()))
            .unwrap();
        assert_eq!(r.owner_state("alive").unwrap(), OwnerState::Alive);
        std::thread::sleep(Duration::from_millis(2000));
        let st = r.owner_state("alive").unwrap();
        assert!(matches!(st, OwnerState::Silent(_)), "{st:?}");
        assert!(!st.is_down());
        assert!(
            st.describe().starts_with("silent for "),
            "{}",
            st.describe()
        );
        std::thread::sleep(Duration::from_millis(1200));
        let st = r.owner_state("alive").unwrap();
        assert!(st.is_down(), "{st:?}");
        assert!(
            st.describe().starts_with("down (no heartbeat for"),
            "{}",
            st.describe()
        );
        meta.heartbeat(id).unwrap();
        assert_eq!(r.owner_state("alive").unwrap(), OwnerState::Alive);
        // a daemon of this machine that is gone: down at once, and its session ends
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let mine = crate::liveness::this_process();
        let (boot_ns, _) = mine.rsplit_once(':').unwrap();
        child.wait().unwrap();
        let host = format!("h{HOST_ID_SEP}{boot_ns}:1");
        meta.register_session(&session("gone", host, pid)).unwrap();
        let st = r.owner_state("gone").unwrap();
        assert!(
            matches!(&st, OwnerState::Down(why) if why.contains("pid")),
            "{st:?}"
        );
        assert!(
            !meta
                .sessions()
                .unwrap()
                .iter()
                .any(|s| s.client_name == "gone"),
            "the gone daemon's session was not ended"
        );
        assert_eq!(r.owner_state("gone").unwrap(), OwnerState::NoSession);
    }

    #[test]
    fn a_down_owners_ehostdown_is_logged_once_a_minute_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let meta = engine(dir.path());
        let r = recaller(&meta, Duration::from_secs(2));
        assert!(r.log_down(7));
        assert!(!r.log_down(7));
        assert!(r.log_down(8));
    }
}
