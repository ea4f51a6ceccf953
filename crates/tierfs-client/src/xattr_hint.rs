//! Which inodes have no extended attributes, as this client last learnt from the engine.
//!
//! Every attribute reply the client gives (lookup, READDIRPLUS, getattr, setattr, create,
//! mkdir, mknod, symlink, link) carries the inode's xattr count (schema v9). An inode whose
//! count was 0 is remembered for `attr_ttl` from that reply, the bound the kernel trusts the
//! same attributes (mode, owner, size) for; within it GETXATTR answers ENODATA and LISTXATTR
//! an empty list without reading the engine. `ls -l` asks for two attributes of each file
//! (security.selinux, system.posix_acl_access), `tar x` for security.capability, `cp -a` lists
//! and reads them: with no xattrs anywhere, all of that is answered here.
//!
//! This client's own setxattr and removexattr (and the ACLs a new inode inherits) mark the
//! inode as changed: it is then asked of the engine for `attr_ttl`, whatever a reply read
//! before the change (still on its way on another request thread) says. Another client's
//! change is seen at the latest `attr_ttl` after this client last read the inode's
//! attributes (docs/semantics.md).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tierfs_meta::{Attr, Ino};

/// Most inodes remembered; past it, the expired entries go, then all if that was not enough
/// (the engine answers for the forgotten ones).
const MAX_ENTRIES: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
enum State {
    /// No xattrs, as an engine reply said; trusted until then.
    NoneUntil(Instant),
    /// This client changed the inode's xattrs: ask the engine until then.
    ChangedUntil(Instant),
}

/// See the module doc.
pub struct XattrHint {
    ttl: Duration,
    map: Mutex<HashMap<Ino, State>>,
}

impl XattrHint {
    /// Trusts a count of 0 for `ttl` (the mount's `attr_ttl`; zero: never).
    pub fn new(ttl: Duration) -> XattrHint {
        XattrHint {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Remembers what an engine reply said of `a`'s xattrs.
    pub fn seen(&self, a: &Attr) {
        self.seen_at(a, Instant::now());
    }

    fn seen_at(&self, a: &Attr, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let mut m = self.map.lock();
        match m.get(&a.ino) {
            Some(State::ChangedUntil(t)) if *t > now => return,
            _ => {}
        }
        if a.has_xattrs() {
            m.remove(&a.ino);
            return;
        }
        if m.len() >= MAX_ENTRIES {
            m.retain(|_, s| match s {
                State::NoneUntil(t) | State::ChangedUntil(t) => *t > now,
            });
            if m.len() >= MAX_ENTRIES {
                m.clear();
            }
        }
        m.insert(a.ino, State::NoneUntil(now + self.ttl));
    }

    /// Whether `ino` is known to have no xattrs (an engine reply said so less than `ttl` ago,
    /// and this client changed none since).
    pub fn none(&self, ino: Ino) -> bool {
        self.none_at(ino, Instant::now())
    }

    fn none_at(&self, ino: Ino, now: Instant) -> bool {
        let mut m = self.map.lock();
        match m.get(&ino) {
            Some(State::NoneUntil(t)) if *t > now => true,
            Some(State::NoneUntil(_)) => {
                m.remove(&ino);
                false
            }
            _ => false,
        }
    }

    /// This client changed (or is about to change) `ino`'s xattrs.
    pub fn changed(&self, ino: Ino) {
        self.changed_at(ino, Instant::now());
    }

    fn changed_at(&self, ino: Ino, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        self.map
            .lock()
            .insert(ino, State::ChangedUntil(now + self.ttl));
    }

    /// The kernel forgot `ino` (or another client changed it): ask the engine next time.
    pub fn forget(&self, ino: Ino) {
        let mut m = self.map.lock();
        if let Some(State::NoneUntil(_)) = m.get(&ino) {
            m.remove(&ino);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_meta::Kind;

    fn attr(ino: Ino, xattr_count: u32) -> Attr {
        Attr {
            ino,
            kind: Kind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            crtime: 0,
            projid: 0,
            data_version: 0,
            layout: None,
            dir_default: Default::default(),
            parent: 1,
            allocated: 0,
            hsm: Default::default(),
            xattr_count,
        }
    }

    const TTL: Duration = Duration::from_secs(1);

    #[test]
    fn a_count_of_zero_is_trusted_for_the_ttl_only() {
        let h = XattrHint::new(TTL);
        let t0 = Instant::now();
        assert!(!h.none_at(7, t0), "nothing known yet");
        h.seen_at(&attr(7, 0), t0);
        assert!(h.none_at(7, t0));
        assert!(h.none_at(7, t0 + TTL - Duration::from_millis(1)));
        assert!(!h.none_at(7, t0 + TTL), "expired");
        assert_eq!(h.len(), 0, "an expired entry goes");
    }

    #[test]
    fn a_reply_with_xattrs_drops_what_was_known() {
        let h = XattrHint::new(TTL);
        let t0 = Instant::now();
        h.seen_at(&attr(7, 0), t0);
        h.seen_at(&attr(7, 2), t0);
        assert!(!h.none_at(7, t0));
        assert!(!h.none_at(8, t0), "other inodes are unknown");
    }

    #[test]
    fn an_own_change_wins_over_replies_read_before_it() {
        let h = XattrHint::new(TTL);
        let t0 = Instant::now();
        h.seen_at(&attr(7, 0), t0);
        h.changed_at(7, t0);
        assert!(!h.none_at(7, t0));
        // A reply read before the change arrives late: it is not believed.
        h.seen_at(&attr(7, 0), t0 + Duration::from_millis(10));
        assert!(!h.none_at(7, t0 + Duration::from_millis(10)));
        // forget keeps the mark (only a count of 0 is forgotten).
        h.forget(7);
        h.seen_at(&attr(7, 0), t0 + Duration::from_millis(20));
        assert!(!h.none_at(7, t0 + Duration::from_millis(20)));
        // After the ttl, replies count again.
        let later = t0 + TTL + Duration::from_millis(1);
        h.seen_at(&attr(7, 0), later);
        assert!(h.none_at(7, later));
        h.forget(7);
        assert!(!h.none_at(7, later));
    }

    #[test]
    fn a_zero_ttl_trusts_nothing() {
        let h = XattrHint::new(Duration::ZERO);
        let t0 = Instant::now();
        h.seen_at(&attr(7, 0), t0);
        assert!(!h.none_at(7, t0));
        assert_eq!(h.len(), 0);
    }
}
