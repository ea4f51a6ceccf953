//! Attribute changes that wait for the commit of a file's buffered writes.
//!
//! `tar` sets the mtime, owner and mode of each file it extracts while the file is still open
//! with its data buffered here (`futimens`, `fchown`, `fchmod`, then `close`), and `cp -a` the
//! times and the access ACL (a mode) after its copy. Each was a metadata transaction of its
//! own after the commit of the data. A setattr that only grants (times; a mode that adds
//! permission bits; a chown whose losers had nothing to lose) is kept beside the buffered
//! writes instead and goes in their commit's transaction ([`tierfs_meta::FileData::commit_slices_then`]).
//! This client shows the changes at once (every reply with the file's attributes carries
//! them); other clients see them with the data, at the close, fsync or the buffer's limit: as
//! they would have seen the file before the change, which granted nothing they lacked
//! (docs/semantics.md, "Attribute changes of a file being written").

use tierfs_meta::{Attr, AttrBase, Kind, Nanos, SetAttr, TimeSet};

/// Setuid and setgid: a mode carrying either never waits (a write clears them, and a commit
/// after that would set them again).
const SETID: u32 = libc::S_ISUID | libc::S_ISGID;

/// The changes kept for one file, when the last of them was made (its ctime here), and when
/// the first was (they wait at most [`super::DEFERRED_MAX_AGE`] from then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Deferred {
    pub set: SetAttr,
    pub at: Nanos,
    pub since: Nanos,
}

impl Deferred {
    /// `newer` after `older`: each field the newer one sets wins.
    pub fn merge(older: Option<Deferred>, newer: Deferred) -> Deferred {
        let Some(o) = older else {
            return newer;
        };
        Deferred {
            set: merged(&o.set, &newer.set),
            at: newer.at.max(o.at),
            since: newer.since.min(o.since),
        }
    }

    /// `a` with the changes applied, as this client shows the file.
    pub fn apply(&self, a: &Attr) -> Attr {
        let mut a = a.clone();
        if let Some(p) = self.set.perm {
            a.perm = p & 0o7777;
        }
        if let Some(u) = self.set.uid {
            a.uid = u;
        }
        if let Some(g) = self.set.gid {
            a.gid = g;
        }
        if let Some(TimeSet::At(t)) = self.set.atime {
            a.atime = t;
        }
        if let Some(TimeSet::At(t)) = self.set.mtime {
            a.mtime = t;
        }
        a.ctime = a.ctime.max(self.at);
        a
    }

    /// Changes `self` that did not land (their commit or report failed) wait again in
    /// `waiting`, older than whatever waited there since.
    pub fn put_back(self, waiting: &mut Option<Deferred>) {
        *waiting = Some(match waiting.take() {
            Some(newer) => Deferred::merge(Some(self), newer),
            None => self,
        });
    }

    /// Forgets a given mtime: a write after it makes the commit's own time the mtime.
    pub fn written(&mut self) {
        self.set.mtime = None;
    }
}

/// `newer` after `older`, as one setattr: each field the newer one sets wins.
pub(crate) fn merged(older: &SetAttr, newer: &SetAttr) -> SetAttr {
    SetAttr {
        perm: newer.perm.or(older.perm),
        uid: newer.uid.or(older.uid),
        gid: newer.gid.or(older.gid),
        size: newer.size.or(older.size),
        atime: newer.atime.or(older.atime),
        mtime: newer.mtime.or(older.mtime),
        ctime: newer.ctime.or(older.ctime),
        kill_setid: newer.kill_setid || older.kill_setid,
        unless_changed: merged_base(older, newer),
    }
}

/// The expected old values of `newer` after `older`: a field's comes with the change that
/// sets it (a change made now, the caller's, expects nothing).
fn merged_base(older: &SetAttr, newer: &SetAttr) -> Option<AttrBase> {
    let o = older.unless_changed.unwrap_or_default();
    let n = newer.unless_changed.unwrap_or_default();
    let b = AttrBase {
        perm: if newer.perm.is_some() { n.perm } else { o.perm },
        uid: if newer.uid.is_some() { n.uid } else { o.uid },
        gid: if newer.gid.is_some() { n.gid } else { o.gid },
    };
    (b != AttrBase::default()).then_some(b)
}

/// `set`, judged on a file the engine last told this client has `base`, as it is kept for a
/// later commit: each "now" made the time `now` (the client answers with it at once); its
/// mode, owner and group apply then only if the file still has `base`'s (another client's
/// change meanwhile is newer and stays); and no clearing of setuid/setgid (a waiting change
/// was judged on a file without them: if another client set them meanwhile, that is newer).
pub(crate) fn kept(set: &SetAttr, base: &Attr, now: Nanos) -> SetAttr {
    let b = AttrBase {
        perm: set.perm.map(|_| base.perm),
        uid: set.uid.map(|_| base.uid),
        gid: set.gid.map(|_| base.gid),
    };
    SetAttr {
        kill_setid: false,
        unless_changed: (b != AttrBase::default()).then_some(b),
        ..pinned(set, now)
    }
}

/// `set` with each "now" made the time `now` (the client answers with it at once; the commit
/// comes later).
pub(super) fn pinned(set: &SetAttr, now: Nanos) -> SetAttr {
    let pin = |t: Option<TimeSet>| {
        t.map(|t| match t {
            TimeSet::Now => TimeSet::At(now),
            at => at,
        })
    };
    SetAttr {
        atime: pin(set.atime),
        mtime: pin(set.mtime),
        ..set.clone()
    }
}

/// Whether `set` of a file this client shows as `a` may wait for the commit of its buffered
/// writes: nobody on another client may lose by seeing the file as it was a little longer.
/// Times always may; a mode only when it adds permission bits and has no setuid or setgid; a
/// chown (or the kernel's kill-privileges setattr) only when the file has no setuid or
/// setgid to clear, the old owner is root or stays, and the old group had no permission bits
/// or stays. Never a truncate, a kernel-given ctime (the writeback cache's), a file with
/// extended attributes (an ACL follows every chmod), or anything but a regular file.
pub(crate) fn may_wait(a: &Attr, set: &SetAttr) -> bool {
    if a.kind != Kind::File || a.has_xattrs() || set.size.is_some() || set.ctime.is_some() {
        return false;
    }
    if a.perm & SETID != 0 {
        return false;
    }
    if let Some(p) = set.perm {
        if p & SETID != 0 || a.perm & !p & 0o7777 != 0 {
            return false;
        }
    }
    if let Some(u) = set.uid {
        if u != a.uid && a.uid != 0 {
            return false;
        }
    }
    if let Some(g) = set.gid {
        if g != a.gid && a.perm & 0o070 != 0 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(perm: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: 7,
            kind: Kind::File,
            perm,
            uid,
            gid,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: 1,
            mtime: 2,
            ctime: 3,
            crtime: 3,
            projid: 0,
            data_version: 1,
            layout: None,
            dir_default: Default::default(),
            parent: 1,
            allocated: 0,
            hsm: Default::default(),
            xattr_count: 0,
        }
    }

    fn chmod(p: u32) -> SetAttr {
        SetAttr {
            perm: Some(p),
            ..Default::default()
        }
    }

    fn chown(u: Option<u32>, g: Option<u32>) -> SetAttr {
        SetAttr {
            uid: u,
            gid: g,
            kill_setid: true,
            ..Default::default()
        }
    }

    #[test]
    fn what_tar_and_cp_do_may_wait() {
        let a = file(0o600, 0, 0);
        let times = SetAttr {
            mtime: Some(TimeSet::At(5)),
            atime: Some(TimeSet::Now),
            ..Default::default()
        };
        assert!(may_wait(&a, &times));
        assert!(may_wait(&a, &chown(Some(0), Some(0))));
        assert!(may_wait(&a, &chown(Some(1000), Some(1000))));
        assert!(may_wait(&a, &chmod(0o644)));
        assert!(may_wait(&a, &chmod(0o600)));
        assert!(may_wait(&a, &chmod(0o1600)), "sticky is not setid");
    }

    #[test]
    fn what_takes_away_does_not_wait() {
        let a = file(0o644, 1000, 100);
        assert!(
            !may_wait(&a, &chmod(0o600)),
            "removes read from group and others"
        );
        assert!(!may_wait(&a, &chmod(0o4755)), "sets setuid");
        assert!(!may_wait(&a, &chmod(0o2744)), "sets setgid");
        assert!(
            !may_wait(&a, &chown(Some(2000), None)),
            "owner 1000 loses the file"
        );
        assert!(
            !may_wait(&a, &chown(None, Some(200))),
            "group 100 loses its read bit"
        );
        assert!(may_wait(&a, &chown(Some(1000), Some(100))), "nothing moves");
        let private = file(0o600, 1000, 100);
        assert!(
            may_wait(&private, &chown(None, Some(200))),
            "group 100 had nothing"
        );
        let setuid = file(0o4755, 0, 0);
        assert!(
            !may_wait(&setuid, &chown(Some(0), Some(0))),
            "a chown clears setuid"
        );
        assert!(!may_wait(&setuid, &SetAttr::default()));
        let truncate = SetAttr {
            size: Some(0),
            ..Default::default()
        };
        assert!(!may_wait(&file(0o600, 0, 0), &truncate));
        let kernel_ctime = SetAttr {
            mtime: Some(TimeSet::At(5)),
            ctime: Some(5),
            ..Default::default()
        };
        assert!(!may_wait(&file(0o600, 0, 0), &kernel_ctime));
        let mut acl = file(0o600, 0, 0);
        acl.xattr_count = 1;
        assert!(!may_wait(&acl, &chmod(0o644)));
        let mut dir = file(0o700, 0, 0);
        dir.kind = Kind::Dir;
        assert!(!may_wait(&dir, &chmod(0o755)));
    }

    #[test]
    fn later_changes_win_and_apply_shows_them() {
        let first = Deferred {
            set: SetAttr {
                mtime: Some(TimeSet::At(50)),
                ..Default::default()
            },
            at: 100,
            since: 100,
        };
        let second = Deferred {
            set: chown(Some(1000), Some(1000)),
            at: 110,
            since: 110,
        };
        let third = Deferred {
            set: chmod(0o644),
            at: 120,
            since: 120,
        };
        let d = Deferred::merge(Some(Deferred::merge(Some(first), second)), third);
        assert_eq!(d.set.mtime, Some(TimeSet::At(50)));
        assert_eq!(
            (d.set.uid, d.set.gid, d.set.perm),
            (Some(1000), Some(1000), Some(0o644))
        );
        assert!(d.set.kill_setid);
        assert_eq!(d.at, 120);
        assert_eq!(d.since, 100, "they wait from the first");
        let shown = d.apply(&file(0o600, 0, 0));
        assert_eq!((shown.perm, shown.uid, shown.gid), (0o644, 1000, 1000));
        assert_eq!((shown.mtime, shown.ctime, shown.atime), (50, 120, 1));
        let again = Deferred {
            set: chmod(0o664),
            at: 130,
            since: 130,
        };
        assert_eq!(Deferred::merge(Some(d), again).set.perm, Some(0o664));
    }

    #[test]
    fn a_kept_change_expects_what_it_was_judged_on_and_a_change_made_now_expects_nothing() {
        let base = file(0o600, 0, 0);
        let k = kept(&chown(Some(1000), None), &base, 5);
        assert!(!k.kill_setid, "judged on a file without setuid/setgid");
        assert_eq!(
            k.unless_changed,
            Some(AttrBase {
                uid: Some(0),
                ..Default::default()
            })
        );
        let m = kept(&chmod(0o644), &base, 6);
        let both = merged(&k, &m);
        assert_eq!(
            both.unless_changed,
            Some(AttrBase {
                perm: Some(0o600),
                uid: Some(0),
                gid: None
            })
        );
        // the caller's chmod made now (it did not wait) replaces the kept one, unconditionally
        let now = merged(&both, &chmod(0o640));
        assert_eq!(now.perm, Some(0o640));
        assert_eq!(
            now.unless_changed,
            Some(AttrBase {
                uid: Some(0),
                ..Default::default()
            })
        );
        assert_eq!(kept(&SetAttr::default(), &base, 7).unless_changed, None);
        // as the engine applies it: the owner changed elsewhere stays, the mode goes on
        let mut elsewhere = base.clone();
        elsewhere.uid = 9;
        let applied = both.against(&elsewhere);
        assert_eq!((applied.perm, applied.uid), (Some(0o644), None));
    }

    #[test]
    fn a_write_after_a_given_mtime_drops_it_and_now_is_pinned() {
        let mut d = Deferred {
            set: pinned(
                &SetAttr {
                    mtime: Some(TimeSet::Now),
                    atime: Some(TimeSet::At(9)),
                    ..Default::default()
                },
                77,
            ),
            at: 77,
            since: 77,
        };
        assert_eq!(d.set.mtime, Some(TimeSet::At(77)));
        assert_eq!(d.set.atime, Some(TimeSet::At(9)));
        d.written();
        assert_eq!(d.set.mtime, None);
        assert_eq!(d.set.atime, Some(TimeSet::At(9)));
    }
}
