//! This client's session in the metadata database, and its fencing.
//!
//! The session id is shared and swappable ([`Session::id`]): a client whose session ended
//! under it (reaped after missing its heartbeats for `session_timeout_secs`, or evicted with
//! `tierfs session evict`) learns it from the heartbeat (`NotFound`) or from any call recorded
//! under the session ([`MetaError::SessionEnded`]). It then **fences** itself
//! ([`Session::ended`]): a loud error line, and a new session is registered under which it
//! carries on. What the old session held is gone (the reaper dropped its opens and locks), so
//! handles opened under it fail with EIO (close still succeeds), as Lustre's after an
//! eviction; writes buffered under it and not yet committed are refused by the engine (their
//! uploads may already count as garbage) and reported as EIO at the next write, fsync or
//! close. Nothing is ever recorded under the ended session (the engine checks each such write
//! in its transaction).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tierfs_meta::{MetaEngine, MetaError, SessionInfo};

use crate::error::{ClientError, Result};

/// The client's current session: its id (swapped at each fencing) and how to register anew.
pub struct Session {
    meta: Option<Arc<dyn MetaEngine>>,
    id: AtomicU64,
    /// Registered again as it is when fenced (the engine sets the times).
    template: SessionInfo,
    timeout_ns: i64,
    /// One fencing at a time (several threads may learn of the end at once).
    renew: Mutex<()>,
    fences: AtomicU64,
}

impl Session {
    /// Registers `info` (one live session per client name: see
    /// `Sessions::register_session_unique`).
    pub fn register(
        meta: Arc<dyn MetaEngine>,
        info: SessionInfo,
        timeout_ns: i64,
    ) -> tierfs_meta::Result<Arc<Session>> {
        let id = meta.register_session_unique(&info, timeout_ns)?;
        Ok(Arc::new(Session {
            meta: Some(meta),
            id: AtomicU64::new(id),
            template: info,
            timeout_ns,
            renew: Mutex::new(()),
            fences: AtomicU64::new(0),
        }))
    }

    /// A fixed session id that is never renewed (tests of parts that need one).
    pub fn fixed(id: u64) -> Arc<Session> {
        Arc::new(Session {
            meta: None,
            id: AtomicU64::new(id),
            template: SessionInfo {
                id,
                client_name: String::new(),
                host: String::new(),
                pid: 0,
                mountpoint: String::new(),
                version: String::new(),
                started: 0,
                heartbeat: 0,
            },
            timeout_ns: 0,
            renew: Mutex::new(()),
            fences: AtomicU64::new(0),
        })
    }

    /// The current session id.
    pub fn id(&self) -> u64 {
        self.id.load(Ordering::Acquire)
    }

    /// How many times this client was fenced since it mounted.
    pub fn fences(&self) -> u64 {
        self.fences.load(Ordering::Relaxed)
    }

    /// Session `old` has ended: fences this client (loudly) and registers a new session,
    /// once per ended session (the first caller does it; later ones find the new id). Returns
    /// the current session id.
    pub fn ended(&self, old: u64) -> tierfs_meta::Result<u64> {
        let _one = self.renew.lock();
        let cur = self.id();
        if cur != old {
            return Ok(cur);
        }
        let Some(meta) = &self.meta else {
            return Err(MetaError::SessionEnded(old));
        };
        tracing::error!(
            "FENCED: session {old} of client '{}' has ended (reaped after missing its \
             heartbeats, or evicted by an administrator); its open files and locks are gone, \
             handles opened under it now fail with EIO, and writes buffered under it and not \
             yet committed are refused. Registering a new session.",
            self.template.client_name
        );
        let new = meta.register_session_unique(&self.template, self.timeout_ns)?;
        self.id.store(new, Ordering::Release);
        self.fences.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "client '{}' carries on under session {new} (was {old})",
            self.template.client_name
        );
        Ok(new)
    }

    /// Whether `r` says that session `used` ended; if so, fences (see [`Session::ended`]).
    /// Returns `r` unchanged either way.
    pub fn watch<T>(&self, used: u64, r: tierfs_meta::Result<T>) -> tierfs_meta::Result<T> {
        if let Err(MetaError::SessionEnded(s)) = &r {
            if *s == used {
                if let Err(e) = self.ended(used) {
                    tracing::error!("registering a new session after a fence failed: {e}");
                }
            }
        }
        r
    }

    /// Fails with EIO when a handle opened under session `opened_under` outlived it (this
    /// client was fenced since): its opens and locks were dropped by the reaper.
    pub fn check_handle(&self, opened_under: u64) -> Result<()> {
        if opened_under != self.id() {
            return Err(ClientError::Meta(MetaError::SessionEnded(opened_under)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_session_is_never_renewed_and_old_handles_fail() {
        let s = Session::fixed(7);
        assert_eq!(s.id(), 7);
        assert!(s.check_handle(7).is_ok());
        let e = s.check_handle(6).unwrap_err();
        assert_eq!(e.errno(), libc::EIO);
        assert!(matches!(s.ended(7), Err(MetaError::SessionEnded(7))));
        assert_eq!((s.id(), s.fences()), (7, 0));
    }
}
