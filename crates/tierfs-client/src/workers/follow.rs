//! `change-follower`: keeps this client's kernel caches true to what OTHER clients change, so
//! that the kernel may keep names and attributes for a long TTL (`follow_ttl`) instead of the
//! short one (`attr_ttl`/`entry_ttl`). docs/semantics.md ("Following other clients") states the
//! bound this gives and pins it.
//!
//! The daemon registers a changelog reader of its own at mount (docs/changelog.md; mask: every
//! type but OPEN and CLOSE, which change nothing the kernel caches) with a short idle time, so
//! that a client that dies leaves no reader holding records for long. This worker reads the
//! records after the last it saw, and for each one another client made (its `client` is not
//! ours: this client's own changes went through its kernel, which already knows them) tells
//! the kernel to drop what the record makes stale ([`invalidations`]): the names created,
//! removed or renamed (`notify_inval_entry`, which also drops a cached "no such name"), and
//! the attributes (and for data changes the cached pages) of the inodes touched
//! (`notify_inval_inode`). It then clears what it read, now and then, so records are purged.
//!
//! On PostgreSQL it sleeps on the changelog notification channel (each recording transaction
//! notifies at commit) and reads after each notification and at least every
//! [`LISTEN_WAIT`]; on SQLite (no notifications) it polls every [`POLL_INTERVAL`].
//!
//! **Falling behind.** [`FollowState`] knows when the last read that succeeded began. While that
//! is less than [`MAX_LAG`] ago, replies carry the long TTL; otherwise (the engine unreachable or
//! slow, the reader lost) they carry the short TTLs again at once. What the kernel took with the
//! long TTL before that keeps it: until the follower reads again (it then invalidates everything
//! the records it missed name, which the changelog kept for it), or for at most `follow_ttl`
//! (the safety net) when the reader was dropped for idleness and its records purged.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fuser::{INodeNo, Notifier};
use tierfs_meta::changelog::{ChangelogError, ChangelogRecord, Mask, RecordType};
use tierfs_meta::{Channel, Ino, Listener, MetaEngine, MetaError};

use super::{Ctx, Next, WorkError, Worker};
use crate::data::DataPath;
use crate::xattr_hint::XattrHint;

/// How often the follower reads the changelog when it cannot be notified (SQLite).
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long it waits for a notification (PostgreSQL) before reading anyway.
pub const LISTEN_WAIT: Duration = Duration::from_millis(500);
/// Replies carry the long TTL only while the last successful read began less than this ago.
pub const MAX_LAG: Duration = Duration::from_secs(1);
/// The reader's idle time: a client that dies leaves a reader the others' `maintain()` drops
/// this long after its last read (the records only it held are purged then).
pub const READER_IDLE: Duration = Duration::from_secs(600);
/// Records read per unit.
const BATCH: usize = 1024;
/// Clear what was read at most this often (a clear is a write transaction).
const CLEAR_EVERY: Duration = Duration::from_secs(1);

/// The record types the follower needs: every type but OPEN and CLOSE.
pub fn mask() -> Mask {
    let mut m = Mask::all().0;
    m &= !RecordType::Open.bit();
    m &= !RecordType::Close.bit();
    Mask(m)
}

/// Whether the follower is keeping up, for the TTL of each reply (shared with the FUSE
/// threads).
pub struct FollowState {
    long_ttl: Duration,
    epoch: Instant,
    /// When (ns after `epoch`) the last successful read began; 0: none yet.
    last_ok: AtomicU64,
    /// Not keeping up before this (ns after `epoch`): records may have been lost.
    hold_until: AtomicU64,
    /// The id of the follower's changelog reader now (0: none yet), shown in `.tierfs-info`.
    reader: AtomicU64,
}

impl FollowState {
    pub fn new(long_ttl: Duration) -> Arc<FollowState> {
        Arc::new(FollowState {
            long_ttl,
            epoch: Instant::now(),
            last_ok: AtomicU64::new(0),
            hold_until: AtomicU64::new(0),
            reader: AtomicU64::new(0),
        })
    }

    /// The follower reads with changelog reader `cl<id>` from now on.
    pub fn set_reader(&self, id: u64) {
        self.reader.store(id, Ordering::SeqCst);
    }

    /// The follower's changelog reader now (`cl<id>`), if any.
    pub fn reader(&self) -> Option<u64> {
        Some(self.reader.load(Ordering::SeqCst)).filter(|&r| r != 0)
    }

    fn now(&self) -> u64 {
        // At least 1, so that 0 keeps meaning "never".
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// A read that began at `began` (from [`FollowState::began`]) succeeded.
    fn succeeded(&self, began: u64) {
        self.last_ok.fetch_max(began, Ordering::SeqCst);
    }

    fn began(&self) -> u64 {
        self.now()
    }

    /// Records may have been lost: not keeping up for the next `follow_ttl` (until what the
    /// kernel took with the long TTL before has expired).
    fn lost_records(&self) {
        let until = self.now() + self.long_ttl.as_nanos() as u64;
        self.hold_until.fetch_max(until, Ordering::SeqCst);
    }

    /// Whether the last successful read began less than [`MAX_LAG`] ago (and no records were
    /// lost within the last `follow_ttl`).
    pub fn keeping_up(&self) -> bool {
        let ok = self.last_ok.load(Ordering::SeqCst);
        let now = self.now();
        ok != 0
            && now.saturating_sub(ok) < MAX_LAG.as_nanos() as u64
            && now >= self.hold_until.load(Ordering::SeqCst)
    }

    /// The TTL for a reply whose short TTL is `short`. A short TTL of 0 ("ask every time":
    /// every operation sees every other client's committed changes at once) stays 0: the
    /// follower's lag is a weaker bound than that.
    pub fn ttl(&self, short: Duration) -> Duration {
        if !short.is_zero() && self.keeping_up() {
            self.long_ttl.max(short)
        } else {
            short
        }
    }
}

/// What one record makes stale in a kernel that did not make the change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inval {
    /// The name `name` in directory `parent` (present or cached as absent).
    Entry(Ino, Vec<u8>),
    /// The inode's attributes; `pages`: its cached data too.
    Inode { ino: Ino, pages: bool },
}

/// The invalidations a record calls for.
pub fn invalidations(r: &ChangelogRecord) -> Vec<Inval> {
    let attrs = |ino: Ino| Inval::Inode { ino, pages: false };
    let mut v = Vec::new();
    match r.typ {
        RecordType::Creat
        | RecordType::Mkdir
        | RecordType::Hlink
        | RecordType::Slink
        | RecordType::Mknod
        | RecordType::Unlnk
        | RecordType::Rmdir => {
            // the name, the parent's mtime/ctime/nlink, the target's nlink/ctime
            v.push(Inval::Entry(r.parent, r.name.clone()));
            v.push(attrs(r.parent));
            v.push(attrs(r.target));
        }
        RecordType::Renme | RecordType::Rnmto => {
            v.push(Inval::Entry(r.parent, r.name.clone()));
            v.push(attrs(r.parent));
            if let (Some(sp), Some(sn)) = (r.source_parent, r.source_name.as_ref()) {
                v.push(Inval::Entry(sp, sn.clone()));
                if sp != r.parent {
                    v.push(attrs(sp));
                }
            }
            v.push(attrs(r.target));
        }
        RecordType::Mtime | RecordType::Trunc | RecordType::Hsm => v.push(Inval::Inode {
            ino: r.target,
            pages: true,
        }),
        RecordType::Sattr
        | RecordType::Xattr
        | RecordType::Ctime
        | RecordType::Lyout
        | RecordType::Open
        | RecordType::Close => v.push(attrs(r.target)),
    }
    v.retain(|i| match i {
        Inval::Entry(p, _) => *p != 0,
        Inval::Inode { ino, .. } => *ino != 0,
    });
    v
}

/// Whether a record calls for invalidations in the kernel of client `me`: not for its own
/// changes, which went through its kernel, except HSM events (its `hsm-mover` worker, when it
/// runs one, changes files behind its kernel's back).
pub fn concerns(r: &ChangelogRecord, me: &str) -> bool {
    r.client != me || r.typ == RecordType::Hsm
}

/// Registers the follower's changelog reader: at mount, before anything is served, so that no
/// change made after the mount can be missed. As `client`'s follower: the records this
/// client makes itself are not written for it (it skips them anyway, [`concerns`]), so a
/// client alone on a filesystem writes none.
pub fn register(meta: &dyn MetaEngine, client: &str) -> tierfs_meta::Result<u64> {
    meta.changelog_register_follower(mask(), READER_IDLE, client)
}

/// The `change-follower` worker.
pub struct Follower {
    pub meta: Arc<dyn MetaEngine>,
    pub notifier: Arc<OnceLock<Notifier>>,
    pub state: Arc<FollowState>,
    /// This client's name in changelog records.
    pub client: String,
    /// The reader registered at mount ([`register`]).
    pub reader: u64,
    /// The mount's memory of inodes without xattrs: an inode whose attributes another client
    /// changed is asked of the engine again, as the kernel is.
    pub xattr_hint: Arc<XattrHint>,
    /// The mount's data path: what data version its kernel's cache of a file reflects.
    data: Arc<DataPath>,
    /// Last record index processed.
    last: u64,
    /// Last index cleared.
    cleared: u64,
    last_clear: Instant,
    listener: Option<Box<dyn Listener>>,
    /// Whether the engine has notifications (false after `listen` said none).
    notifies: bool,
    invalidated: u64,
}

impl Follower {
    pub fn new(
        meta: Arc<dyn MetaEngine>,
        notifier: Arc<OnceLock<Notifier>>,
        state: Arc<FollowState>,
        client: String,
        reader: u64,
        xattr_hint: Arc<XattrHint>,
        data: Arc<DataPath>,
    ) -> Follower {
        Follower {
            meta,
            notifier,
            state,
            client,
            reader,
            xattr_hint,
            data,
            last: 0,
            cleared: 0,
            last_clear: Instant::now(),
            listener: None,
            notifies: true,
            invalidated: 0,
        }
    }

    fn apply(&mut self, r: &ChangelogRecord) {
        if !concerns(r, &self.client) {
            return;
        }
        let Some(n) = self.notifier.get() else {
            return;
        };
        for i in invalidations(r) {
            if let Inval::Inode { ino, .. } = &i {
                self.xattr_hint.forget(*ino);
            }
            if let Inval::Inode { ino, pages: true } = &i {
                if self.taken_in(*ino) {
                    continue;
                }
            }
            // ENOENT: the kernel holds nothing of it (not an error).
            let _ = match &i {
                Inval::Entry(p, name) => n.inval_entry(INodeNo(*p), OsStr::from_bytes(name)),
                Inval::Inode { ino, pages: true } => n.inval_inode(INodeNo(*ino), 0, 0),
                Inval::Inode { ino, pages: false } => n.inval_inode(INodeNo(*ino), -1, 0),
            };
            self.invalidated += 1;
        }
    }

    /// Whether this client's kernel already reflects the file's data as the engine has it now
    /// (an open since the change dropped the kernel's size and pages, or found them current):
    /// then the record's change is taken in, and invalidating again would do harm. The
    /// kernel drops the answer of an attribute request that was in flight when an
    /// invalidation came, and a read past the old size then ended at it: a reader that
    /// reopened after another client's commit, and read past the size it had known, got end
    /// of file when this follower's invalidation for that commit crossed its refresh.
    fn taken_in(&self, ino: Ino) -> bool {
        let Some(v) = self.data.kernel_version(ino) else {
            return false;
        };
        matches!(self.meta.getattr(ino), Ok(a) if a.data_version == v)
    }

    /// The reader is gone (dropped for idleness while this client could not read): register
    /// a new one. Records made meanwhile may be lost: until `follow_ttl` has passed, what the
    /// kernel holds may be stale (the documented safety net); the state says "not keeping up"
    /// until then so that new replies carry the short TTLs.
    fn reregister(&mut self, why: &MetaError) -> Result<(), WorkError> {
        tracing::warn!(
            reader = self.reader,
            "change follower: its changelog reader is gone ({why}); registering a new one"
        );
        let old = self.reader;
        self.reader = register(self.meta.as_ref(), &self.client)
            .map_err(|e| format!("cannot register a changelog reader: {e}"))?;
        // A reader dropped for idleness stays listed (with a warning in `tierfs status`)
        // until deregistered: this one was ours, so dismiss it (gone already: nothing to do).
        let _ = self.meta.changelog_deregister(old);
        self.state.set_reader(self.reader);
        self.last = 0;
        self.cleared = 0;
        self.state.lost_records();
        Ok(())
    }

    fn wait_for_news(&mut self) {
        if !self.notifies {
            return;
        }
        if self.listener.is_none() {
            match self.meta.listen(&self.client, &[Channel::Changelog]) {
                Ok(Some(l)) => self.listener = Some(l),
                Ok(None) => self.notifies = false,
                Err(_) => {} // unreachable now: poll, listen again next round
            }
        }
        if let Some(l) = self.listener.as_mut() {
            if l.wait(LISTEN_WAIT).is_err() {
                self.listener = None;
            }
        }
    }
}

impl Worker for Follower {
    fn name(&self) -> &'static str {
        "change-follower"
    }
    /// Between polls (SQLite), and after an error. With a listener the unit itself waits for
    /// a notification (at most [`LISTEN_WAIT`]) and asks to run again at once.
    fn interval(&self) -> Duration {
        POLL_INTERVAL
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        self.wait_for_news();
        let began = self.state.began();
        let read = self.meta.changelog_read(
            Some(self.reader),
            mask(),
            self.last.saturating_add(1),
            u64::MAX,
            BATCH,
        );
        let recs = match read {
            Ok(r) => r,
            Err(
                e @ MetaError::Changelog(
                    ChangelogError::UnknownReader(_) | ChangelogError::ReaderExpired { .. },
                ),
            ) => {
                self.reregister(&e)?;
                return Ok(Next::More);
            }
            Err(e) => return Err(format!("cannot read the changelog: {e}").into()),
        };
        for r in &recs {
            self.apply(r);
            self.last = self.last.max(r.index);
        }
        self.state.succeeded(began);
        if self.last > self.cleared && self.last_clear.elapsed() >= CLEAR_EVERY {
            self.meta
                .changelog_clear(self.reader, self.last)
                .map_err(|e| format!("cannot clear the changelog: {e}"))?;
            self.cleared = self.last;
            self.last_clear = Instant::now();
        }
        ctx.progress(format!(
            "at record {}, {} invalidations sent",
            self.last, self.invalidated
        ));
        Ok(if recs.len() == BATCH || self.listener.is_some() {
            Next::More
        } else {
            Next::Idle
        })
    }
    fn finish(&mut self, _ctx: &Ctx) {
        if let Err(e) = self.meta.changelog_deregister(self.reader) {
            tracing::warn!(
                reader = self.reader,
                "cannot deregister the changelog reader: {e}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(typ: RecordType, target: u64, parent: u64, name: &str) -> ChangelogRecord {
        ChangelogRecord {
            index: 1,
            time: 0,
            typ,
            flags: 0,
            target,
            parent,
            name: name.as_bytes().to_vec(),
            source_parent: None,
            source_name: None,
            uid: 0,
            gid: 0,
            client: "b".into(),
            jobid: None,
        }
    }

    #[test]
    fn namespace_records_invalidate_the_name_and_both_inodes() {
        for t in [
            RecordType::Creat,
            RecordType::Mkdir,
            RecordType::Unlnk,
            RecordType::Rmdir,
            RecordType::Hlink,
            RecordType::Slink,
        ] {
            assert_eq!(
                invalidations(&rec(t, 7, 1, "f")),
                vec![
                    Inval::Entry(1, b"f".to_vec()),
                    Inval::Inode {
                        ino: 1,
                        pages: false
                    },
                    Inval::Inode {
                        ino: 7,
                        pages: false
                    },
                ],
                "{t:?}"
            );
        }
    }

    #[test]
    fn a_rename_invalidates_both_names_and_both_directories() {
        let mut r = rec(RecordType::Renme, 7, 2, "new");
        r.source_parent = Some(3);
        r.source_name = Some(b"old".to_vec());
        let v = invalidations(&r);
        assert!(v.contains(&Inval::Entry(2, b"new".to_vec())));
        assert!(v.contains(&Inval::Entry(3, b"old".to_vec())));
        for ino in [2, 3, 7] {
            assert!(v.contains(&Inval::Inode { ino, pages: false }));
        }
    }

    #[test]
    fn data_changes_drop_pages_and_attribute_changes_only_attributes() {
        assert_eq!(
            invalidations(&rec(RecordType::Mtime, 9, 0, "")),
            vec![Inval::Inode {
                ino: 9,
                pages: true
            }]
        );
        assert_eq!(
            invalidations(&rec(RecordType::Sattr, 9, 0, "")),
            vec![Inval::Inode {
                ino: 9,
                pages: false
            }]
        );
        assert_eq!(
            invalidations(&rec(RecordType::Xattr, 9, 0, "user.a")),
            vec![Inval::Inode {
                ino: 9,
                pages: false
            }]
        );
    }

    #[test]
    fn own_changes_are_skipped_but_own_hsm_events_are_not() {
        let r = rec(RecordType::Sattr, 9, 0, "");
        assert!(concerns(&r, "a"), "b's chmod, seen by a");
        assert!(!concerns(&r, "b"), "b's own chmod");
        let h = rec(RecordType::Hsm, 9, 0, "");
        assert!(concerns(&h, "b"), "b's own mover released the file");
    }

    #[test]
    fn the_mask_leaves_out_open_and_close_only() {
        let m = mask();
        for t in RecordType::ALL {
            let want = !matches!(t, RecordType::Open | RecordType::Close);
            assert_eq!(m.contains(*t), want, "{t:?}");
        }
    }

    #[test]
    fn the_long_ttl_only_while_keeping_up() {
        let s = FollowState::new(Duration::from_secs(60));
        let short = Duration::from_secs(1);
        // Never read yet: short.
        assert_eq!(s.ttl(short), short);
        s.succeeded(s.began());
        assert_eq!(s.ttl(short), Duration::from_secs(60));
        // attr_ttl/entry_ttl = 0 asks every time, follower or not.
        assert_eq!(s.ttl(Duration::ZERO), Duration::ZERO);
        // A read that began MAX_LAG ago and nothing since: short again.
        let s = FollowState::new(Duration::from_secs(60));
        let old = s.began();
        std::thread::sleep(MAX_LAG + Duration::from_millis(50));
        s.succeeded(old);
        assert_eq!(s.ttl(short), short);
        // Records lost: short for the next follow_ttl even while reads succeed.
        let s = FollowState::new(Duration::from_millis(300));
        let short = Duration::from_millis(100);
        s.lost_records();
        s.succeeded(s.began());
        assert_eq!(s.ttl(short), short);
        std::thread::sleep(Duration::from_millis(350));
        s.succeeded(s.began());
        assert_eq!(s.ttl(short), Duration::from_millis(300));
    }
}
