//! The state of one file in this client's persistent cache, as one explicit state machine
//! ([`FileState`], moved by [`Event`]s), kept in a per-inode [`Slot`] whose lock
//! ([`Slot::op`]) every transition holds: open, close, attach, write-back, snapshot,
//! give-back, detach, eviction and validation of the file run one at a time.
//!
//! The phases ([`Phase`]):
//!
//! ```text
//!  Uncached ──CopyStart──▶ CopyingRo ──CopyDone──▶ Ro ──Attached──▶ Rw{clean}
//!     │  ▲                    │ CopyFailed          ▲                 │ Open{write} / Written
//!     │  └────────────────────┘                     │ GivenBack{keep} ▼
//!     └──────────────Attached─────────────────▶ Rw{clean|dirty} ◀──▶ WritingBack
//!                                                   │ GiveBackStart (no writer)
//!                                                   ▼
//!                                               GivingBack ──GivenBack──▶ Ro / Uncached
//! ```
//!
//! Open handles served from the cache are counted in every phase (a reader's handle may
//! outlive a give-back); writers only in `Rw` (a give-back waits for them).
//!
//! **The kept open** ([`Kept`], Lustre's open cache): while the file is `Rw` here, the last
//! close of a handle whose open the engine recorded may leave that record in place instead of
//! sending its close; later opens on this client are then served from the cache without the
//! engine ([`Event::OpenKept`]), and counted as the kept record's users. The record is closed
//! (sent to the engine) once it has no user and the lease is going or gone, or it was idle
//! too long ([`FileState::unkeep`]). The phase is
//! derived from the cache's store when a slot is made ([`FileState::from_store`]), so the
//! store stays the persistent truth and a slot can be forgotten once nothing refers to it.

use std::fmt;
use std::time::Instant;

use parking_lot::{Mutex, ReentrantMutex, ReentrantMutexGuard};

use tierfs_pcc::store::{Entry, Mode};

/// Where a file stands in this client's cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// Not in the cache.
    #[default]
    Uncached,
    /// A read-only copy is being made (reads meanwhile go to the capacity tier).
    CopyingRo,
    /// A read-only copy of one data version.
    Ro,
    /// This client holds the RW-PCC lease and serves the file; `dirty`: the cache may hold
    /// data the capacity tier lacks (the engine's lease says so too, from the open for
    /// writing on).
    Rw { dirty: bool },
    /// An RW file being written back (whole, or a snapshot while writers remain); the lease
    /// stays.
    WritingBack,
    /// An RW file being given back: no writer is left and none may come.
    GivingBack,
}

/// What happens to a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A read-only copy starts (a stale one is replaced).
    CopyStart,
    CopyDone,
    CopyFailed,
    /// The lease was taken and the data is in the cache.
    Attached,
    /// A handle served from the cache (a writer only of an RW file).
    Open {
        write: bool,
    },
    /// A handle served from the cache closes.
    Close {
        write: bool,
    },
    /// The file changed (a report of a write, a truncate, fallocate).
    Written,
    WriteBackStart,
    /// `clean`: no writer wrote meanwhile (a snapshot with writers left stays dirty).
    WriteBackDone {
        clean: bool,
    },
    WriteBackFailed,
    GiveBackStart,
    /// `keep`: a read-only copy stays.
    GivenBack {
        keep: bool,
    },
    GiveBackFailed,
    /// The file left the cache (evicted, stale, deleted, quarantined, lease lost).
    Dropped,
    /// The close of a handle whose open the engine recorded, kept as the file's kept open
    /// (its record stays in the engine; only in `Rw`, and only if none is kept yet). Applied
    /// with [`FileState::keep`], which says for whom.
    Keep,
    /// A handle served on the kept open, without the engine (a writer only of a dirty `Rw`
    /// file: the engine's lease says dirty already).
    OpenKept {
        write: bool,
    },
    /// Such a handle closes (nothing to send: the kept open's record stays).
    CloseKept {
        write: bool,
    },
}

/// Who a kept open's record was made for: the session it was recorded under and the opener
/// its changelog CLOSE record names when it is finally closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptBy {
    pub session: u64,
    pub caller: tierfs_meta::changelog::Caller,
}

/// An open of the file that the engine still records for this client after its handle
/// closed (see the module's docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub by: KeptBy,
    /// Handles open on it now.
    pub users: u32,
    /// Since when it has had no user.
    pub idle_since: Instant,
    /// This client removed or replaced the file's name: the record goes once no handle uses it.
    pub gone: bool,
}

/// A transition the state machine does not allow (a bug, or a caller that should wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Illegal {
    pub from: Phase,
    pub event: Event,
}

impl fmt::Display for Illegal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cache state {:?} does not allow {:?}",
            self.from, self.event
        )
    }
}

/// The state of one file on this client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileState {
    pub phase: Phase,
    /// Handles served from the cache.
    pub opens: u32,
    /// Of those, writers (they write through passthrough, past the daemon).
    pub writers: u32,
    /// When the file's size was last reported to the engine.
    pub last_report: Option<Instant>,
    /// What the last dirty report told the engine (lease generation, size, mtime), until the
    /// next transition other than an open, a close or a write: the same report again changes
    /// nothing and is not sent (`Pcc::report`).
    pub reported: Option<(u64, u64, i64)>,
    /// The read-only copy was verified (or made) since this daemon started.
    pub verified: bool,
    /// The kept open, if any.
    pub kept: Option<Kept>,
    /// This client removed a name of the file: its opens are no longer kept (the engine frees
    /// an unlinked file at its last close, which a kept open would put off).
    pub name_gone: bool,
    /// Attribute changes of an RW-cached file that wait for its next report to the engine
    /// (a writer's `fchmod`, `fchown`, times before its close; `Pcc::defer_setattr`): they go
    /// in the report's transaction. Taken and sent with `Slot::report` held.
    pub(crate) deferred: Option<crate::data::deferred::Deferred>,
}

impl FileState {
    /// The state of a file as the cache's store has it (no handle open yet).
    pub fn from_store(e: Option<&Entry>) -> FileState {
        let phase = match e {
            None => Phase::Uncached,
            Some(e) if e.mode == Mode::Ro => Phase::Ro,
            Some(e) => Phase::Rw { dirty: e.dirty },
        };
        FileState {
            phase,
            ..FileState::default()
        }
    }

    /// Applies `event`, or leaves the state as it is and says why not.
    pub fn apply(&mut self, event: Event) -> Result<(), Illegal> {
        use Event as E;
        use Phase as P;
        let illegal = Illegal {
            from: self.phase,
            event,
        };
        let next = match (self.phase, event) {
            (P::Uncached | P::Ro, E::CopyStart) => P::CopyingRo,
            (P::CopyingRo, E::CopyDone) => {
                self.verified = true;
                P::Ro
            }
            (P::CopyingRo, E::CopyFailed) => P::Uncached,
            (P::Uncached | P::Ro, E::Attached) => P::Rw { dirty: false },
            (P::Rw { dirty }, E::Attached) => P::Rw { dirty },
            (P::Ro, E::Open { write: false }) => P::Ro,
            (P::Rw { dirty }, E::Open { write }) => P::Rw {
                dirty: dirty || write,
            },
            (_, E::Close { write }) => {
                if self.opens == 0 || (write && self.writers == 0) {
                    return Err(illegal);
                }
                self.opens -= 1;
                if write {
                    self.writers -= 1;
                }
                return Ok(());
            }
            (P::Rw { .. }, E::Written) => P::Rw { dirty: true },
            (P::Rw { .. }, E::WriteBackStart) => P::WritingBack,
            (P::WritingBack, E::WriteBackDone { clean }) => P::Rw {
                dirty: !clean || self.writers > 0,
            },
            (P::WritingBack, E::WriteBackFailed) => P::Rw { dirty: true },
            (P::Rw { .. }, E::GiveBackStart) if self.writers == 0 => P::GivingBack,
            (P::GivingBack, E::GivenBack { keep }) => {
                if keep {
                    self.verified = true;
                    P::Ro
                } else {
                    P::Uncached
                }
            }
            (P::GivingBack, E::GiveBackFailed) => P::Rw { dirty: true },
            (P::Uncached | P::Ro | P::Rw { .. } | P::CopyingRo, E::Dropped) => {
                self.verified = false;
                P::Uncached
            }
            (P::Rw { dirty }, E::OpenKept { write }) if !write || dirty => {
                return self.open_kept(write).ok_or(illegal);
            }
            (P::WritingBack, E::OpenKept { write: false }) => {
                return self.open_kept(false).ok_or(illegal);
            }
            (_, E::CloseKept { write }) => {
                let ok = self.opens > 0
                    && (!write || self.writers > 0)
                    && self.kept.as_ref().is_some_and(|k| k.users > 0);
                if !ok {
                    return Err(illegal);
                }
                self.opens -= 1;
                if write {
                    self.writers -= 1;
                }
                if let Some(k) = self.kept.as_mut() {
                    k.users -= 1;
                    if k.users == 0 {
                        k.idle_since = Instant::now();
                    }
                }
                return Ok(());
            }
            _ => return Err(illegal),
        };
        if !matches!(event, E::Open { .. } | E::Written) {
            // (a close returned above) the lease or the cache file may change hands now
            self.reported = None;
        }
        if let E::Open { write } = event {
            self.opens += 1;
            if write {
                self.writers += 1;
            }
        }
        self.phase = next;
        Ok(())
    }

    /// [`Event::Keep`]: the engine's record of an open closing here stays, made for `by`
    /// (refused unless the file is `Rw` here with no kept open yet).
    pub fn keep(&mut self, by: KeptBy) -> Result<(), Illegal> {
        if !matches!(self.phase, Phase::Rw { .. }) || self.kept.is_some() || self.name_gone {
            return Err(Illegal {
                from: self.phase,
                event: Event::Keep,
            });
        }
        self.kept = Some(Kept {
            by,
            users: 0,
            idle_since: Instant::now(),
            gone: false,
        });
        Ok(())
    }

    /// A handle served on the kept open: counted as its user (None: no kept open).
    fn open_kept(&mut self, write: bool) -> Option<()> {
        let k = self.kept.as_mut()?;
        k.users += 1;
        self.opens += 1;
        if write {
            self.writers += 1;
        }
        Some(())
    }

    /// Whether an open may be served on the kept open now: one made under `session`, the
    /// file `Rw` here (and dirty already for a writer), or being written back for a reader
    /// (the cache file is the file's data either way, and no transition waits for readers).
    pub fn kept_serves(&self, session: u64, write: bool) -> bool {
        let rw = match self.phase {
            Phase::Rw { dirty } => !write || dirty,
            Phase::WritingBack => !write,
            _ => false,
        };
        rw && self.kept.as_ref().is_some_and(|k| k.by.session == session)
    }

    /// Takes the kept open away when it has no user and `due(kept, phase)` says it should
    /// go: the caller sends its close to the engine. A kept open with users stays (their
    /// handles count on its record).
    pub fn unkeep(&mut self, due: impl FnOnce(&Kept, Phase) -> bool) -> Option<KeptBy> {
        match &self.kept {
            Some(k) if k.users == 0 && due(k, self.phase) => self.kept.take().map(|k| k.by),
            _ => None,
        }
    }

    /// The kept open goes with the lease: once the file is no longer `Rw` here (a give-back,
    /// a drop, a write-back does not count), or its name went here, a kept open without users
    /// is closed.
    pub fn unkeep_if_unleased(&mut self) -> Option<KeptBy> {
        self.unkeep(|k, phase| {
            k.gone
                || !matches!(
                    phase,
                    Phase::Rw { .. } | Phase::WritingBack | Phase::GivingBack
                )
        })
    }
}

/// One file's slot: the lock every transition of the file holds, and its state.
#[derive(Default)]
pub struct Slot {
    /// Held across each transition, including its metadata transactions and copies;
    /// re-entrant (a give-back writes back, an eviction gives back).
    pub op: ReentrantMutex<()>,
    /// Held while the engine is told the file's size and mtime: by every transition (with
    /// `op`, see [`Slot::hold`]), and alone by a writer's report (its close, its FLUSH), which
    /// needs no transition lock: while its handle counts as a writer, no give-back, drop or
    /// whole write-back can start. So an open served on the kept open (which takes `op` only,
    /// and changes counts) does not wait behind another handle's report to the engine.
    /// Taken after `op`, never before it.
    pub report: ReentrantMutex<()>,
    /// The state, under its own lock: transitions change it with `op` held, a writer's
    /// report (its `Written`) with `report` held, and a reader's kept open and close with
    /// neither (they change only counts); read without them (counters, `tierfs pcc state`).
    pub st: Mutex<FileState>,
    /// The descriptor a handle was served of the file's RW cache file, with the lease
    /// generation it was served under: while a handle holds it, the file's size and times are
    /// read (`fstat`) and set through it instead of by path (an open, a close, a path walk).
    /// Not a state: it lives only as long as the handles that hold it.
    pub file: Mutex<Option<(std::sync::Weak<std::fs::File>, u64)>>,
}

/// A transition's hold of a file ([`Slot::hold`]).
pub struct Held<'a> {
    _op: ReentrantMutexGuard<'a, ()>,
    _report: ReentrantMutexGuard<'a, ()>,
}

impl Slot {
    /// Holds the file for a transition: `op`, then `report` (a writer's report under way ends
    /// first, so no transition sees the engine's size change under it).
    pub fn hold(&self) -> Held<'_> {
        let op = self.op.lock();
        Held {
            _op: op,
            _report: self.report.lock(),
        }
    }

    /// [`Slot::hold`] if neither lock is taken by another thread now.
    pub fn try_hold(&self) -> Option<Held<'_>> {
        let op = self.op.try_lock()?;
        Some(Held {
            _op: op,
            _report: self.report.try_lock()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Event as E;
    use Phase as P;

    fn at(phase: Phase) -> FileState {
        FileState {
            phase,
            ..FileState::default()
        }
    }

    #[test]
    fn ro_copy_lifecycle() {
        let mut s = at(P::Uncached);
        s.apply(E::CopyStart).unwrap();
        assert_eq!(s.phase, P::CopyingRo);
        // no handle is served from a copy being made
        assert!(s.apply(E::Open { write: false }).is_err());
        s.apply(E::CopyDone).unwrap();
        assert_eq!(s.phase, P::Ro);
        assert!(s.verified);
        s.apply(E::Open { write: false }).unwrap();
        // a read-only copy never serves a writer
        assert_eq!(
            s.apply(E::Open { write: true }),
            Err(Illegal {
                from: P::Ro,
                event: E::Open { write: true }
            })
        );
        assert_eq!((s.opens, s.writers), (1, 0));
        s.apply(E::Close { write: false }).unwrap();
        s.apply(E::Dropped).unwrap();
        assert_eq!(s, at(P::Uncached));
        let mut f = at(P::Uncached);
        f.apply(E::CopyStart).unwrap();
        f.apply(E::CopyFailed).unwrap();
        assert_eq!(f.phase, P::Uncached);
    }

    #[test]
    fn a_writer_makes_the_file_dirty_and_blocks_a_give_back() {
        let mut s = at(P::Ro);
        s.apply(E::Attached).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: false });
        s.apply(E::Open { write: false }).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: false });
        s.apply(E::Open { write: true }).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: true });
        // a give-back waits for the writer
        assert!(s.apply(E::GiveBackStart).is_err());
        assert_eq!(s.phase, P::Rw { dirty: true });
        // a snapshot while the writer stays: still dirty afterwards
        s.apply(E::WriteBackStart).unwrap();
        assert!(
            s.apply(E::Open { write: true }).is_err(),
            "no open mid-write-back"
        );
        s.apply(E::WriteBackDone { clean: true }).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: true });
        s.apply(E::Close { write: true }).unwrap();
        s.apply(E::WriteBackStart).unwrap();
        s.apply(E::WriteBackDone { clean: true }).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: false });
        // the reader's handle does not hold a give-back up, and outlives it
        s.apply(E::GiveBackStart).unwrap();
        assert!(s.apply(E::Written).is_err());
        s.apply(E::GivenBack { keep: true }).unwrap();
        assert_eq!((s.phase, s.opens), (P::Ro, 1));
        s.apply(E::Close { write: false }).unwrap();
        assert_eq!((s.opens, s.writers), (0, 0));
    }

    #[test]
    fn failures_leave_the_file_dirty_and_counts_never_underflow() {
        let mut s = at(P::Rw { dirty: false });
        s.apply(E::WriteBackStart).unwrap();
        s.apply(E::WriteBackFailed).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: true });
        s.apply(E::GiveBackStart).unwrap();
        s.apply(E::GiveBackFailed).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: true });
        assert!(s.apply(E::Close { write: false }).is_err());
        s.apply(E::Open { write: false }).unwrap();
        assert!(s.apply(E::Close { write: true }).is_err());
        assert_eq!((s.opens, s.writers), (1, 0));
        // a file being given back is not dropped under it
        let mut g = at(P::GivingBack);
        assert!(g.apply(E::Dropped).is_err());
        assert!(g.apply(E::Attached).is_err());
    }

    #[test]
    fn what_was_reported_is_forgotten_at_any_change_of_hands() {
        let told = Some((3, 4096, 7));
        let mut s = at(P::Rw { dirty: true });
        s.reported = told;
        // opens, closes and writes keep it: the lease and the cache file stay
        s.apply(E::Open { write: true }).unwrap();
        s.apply(E::Written).unwrap();
        s.apply(E::Close { write: true }).unwrap();
        assert_eq!(s.reported, told);
        // a write-back (the lease may be clean after it), a give-back, an attach, a drop: gone
        for ev in [E::WriteBackStart, E::GiveBackStart, E::Attached, E::Dropped] {
            let mut s = at(P::Rw { dirty: true });
            s.reported = told;
            s.apply(ev).unwrap();
            assert_eq!(s.reported, None, "after {ev:?}");
        }
        // an illegal event changes nothing
        let mut s = at(P::Rw { dirty: true });
        s.reported = told;
        assert!(s.apply(E::CopyDone).is_err());
        assert_eq!(s.reported, told);
    }

    fn by(session: u64) -> KeptBy {
        KeptBy {
            session,
            caller: Default::default(),
        }
    }

    #[test]
    fn a_kept_open_serves_only_its_session_and_a_writer_only_when_dirty() {
        // only an Rw file keeps a record, and only one
        for phase in [P::Uncached, P::Ro, P::WritingBack, P::GivingBack] {
            assert!(at(phase).keep(by(1)).is_err(), "{phase:?}");
        }
        let mut s = at(P::Rw { dirty: false });
        assert!(!s.kept_serves(1, false), "nothing kept yet");
        assert!(s.apply(E::OpenKept { write: false }).is_err());
        s.keep(by(1)).unwrap();
        assert!(s.keep(by(1)).is_err(), "one kept open per file");
        assert!(s.kept_serves(1, false));
        assert!(!s.kept_serves(2, false), "another session's record is gone");
        assert!(
            !s.kept_serves(1, true),
            "a clean lease: a writer goes to the engine"
        );
        assert!(s.apply(E::OpenKept { write: true }).is_err());
        s.apply(E::OpenKept { write: false }).unwrap();
        assert_eq!((s.opens, s.kept.as_ref().unwrap().users), (1, 1));
        // a dirty lease serves writers, counted as writers (a give-back waits for them)
        s.apply(E::Written).unwrap();
        assert!(s.kept_serves(1, true));
        s.apply(E::OpenKept { write: true }).unwrap();
        assert_eq!((s.opens, s.writers), (2, 1));
        assert!(s.apply(E::GiveBackStart).is_err());
        // a kept open with users never goes, whatever the phase
        assert_eq!(s.unkeep(|_, _| true), None);
        s.apply(E::CloseKept { write: true }).unwrap();
        s.apply(E::CloseKept { write: false }).unwrap();
        assert!(
            s.apply(E::CloseKept { write: false }).is_err(),
            "no underflow"
        );
        assert_eq!((s.opens, s.writers), (0, 0));
        // the lease stays: the record stays until its idle time is over
        assert_eq!(s.unkeep_if_unleased(), None);
        assert_eq!(s.unkeep(|_, _| true), Some(by(1)));
        assert_eq!(s.kept, None);
    }

    #[test]
    fn a_kept_open_goes_with_the_lease_or_the_name() {
        // given back while a handle uses it: it stays until that handle's close
        let mut s = at(P::Rw { dirty: false });
        s.keep(by(7)).unwrap();
        s.apply(E::OpenKept { write: false }).unwrap();
        s.apply(E::GiveBackStart).unwrap();
        assert_eq!(
            s.unkeep_if_unleased(),
            None,
            "a give-back under way keeps it"
        );
        s.apply(E::GivenBack { keep: true }).unwrap();
        assert_eq!(s.unkeep_if_unleased(), None, "a handle still uses it");
        assert!(
            !s.kept_serves(7, false),
            "no new handle once the lease went"
        );
        s.apply(E::CloseKept { write: false }).unwrap();
        assert_eq!(s.unkeep_if_unleased(), Some(by(7)));
        // dropped (evicted, lease lost): it goes at once
        let mut d = at(P::Rw { dirty: false });
        d.keep(by(7)).unwrap();
        d.apply(E::Dropped).unwrap();
        assert_eq!(d.unkeep_if_unleased(), Some(by(7)));
        // the name went here: it goes although the lease stays
        let mut g = at(P::Rw { dirty: true });
        g.keep(by(7)).unwrap();
        assert_eq!(g.unkeep_if_unleased(), None);
        g.kept.as_mut().unwrap().gone = true;
        assert_eq!(g.unkeep_if_unleased(), Some(by(7)));
        // and a file whose name went here keeps no open any more
        g.name_gone = true;
        assert!(g.keep(by(7)).is_err());
    }

    #[test]
    fn a_write_back_under_way_serves_readers_on_the_kept_open_not_writers() {
        let mut s = at(P::Rw { dirty: true });
        s.keep(by(3)).unwrap();
        s.apply(E::WriteBackStart).unwrap();
        assert!(s.kept_serves(3, false));
        assert!(!s.kept_serves(3, true), "a writer waits for the write-back");
        assert!(s.apply(E::OpenKept { write: true }).is_err());
        s.apply(E::OpenKept { write: false }).unwrap();
        assert_eq!((s.opens, s.writers), (1, 0));
        // a reader does not keep the written-back file dirty
        s.apply(E::WriteBackDone { clean: true }).unwrap();
        assert_eq!(s.phase, P::Rw { dirty: false });
        s.apply(E::CloseKept { write: false }).unwrap();
        // nor is a reader served once a give-back started
        s.apply(E::GiveBackStart).unwrap();
        assert!(!s.kept_serves(3, false));
        assert!(s.apply(E::OpenKept { write: false }).is_err());
    }

    #[test]
    fn from_store_follows_the_entry() {
        assert_eq!(FileState::from_store(None).phase, P::Uncached);
    }
}
