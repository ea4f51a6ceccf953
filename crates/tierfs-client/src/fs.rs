//! The FUSE filesystem: each kernel request becomes metadata-engine transactions and data-path
//! calls. Permission checks are the kernel's (`default_permissions`); errors become errnos here.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, RequestId,
    TimeOrNow, WriteFlags,
};
use parking_lot::{Condvar, Mutex};
use tierfs_meta::changelog::{Caller, CallerGuard};

use tierfs_meta::hsm::{HsmAction, HsmError, HsmRequest, RequestState};
use tierfs_meta::{
    Attr, Ino, Kind, LockRange, LockType, MetaEngine, MetaError, NewNode, PccLease, PccOpen,
    SetAttr, TimeSet,
};

use crate::acl::{self, Acl};
use crate::config::ReaddirPlus;
use crate::data::DataPath;
use crate::error::{ClientError, Result};
use crate::lease::{Lease, Recalled, Recaller};
use crate::metrics::Metrics;
use crate::pcc::{Opened as CacheOpened, Pcc, RwAtCreate, Served};
use crate::pcc_state::KeptBy;
use crate::session::Session;

/// What [`TierFs::list_dir`] hands a directory reply: "." or ".." (with the directory listed),
/// or an entry.
enum Listed<'a, T> {
    Dot {
        dir: &'a Attr,
        ino: Ino,
        offset: u64,
        name: &'static str,
    },
    Entry(T),
}

/// Entries asked of the engine per page of a directory listing.
const LIST_PAGE: usize = 512;

/// Name of the virtual stats file in the root directory (`tierfs stats MOUNT` reads it).
pub const STATS_NAME: &str = ".tierfs-stats";
const STATS_INO: u64 = u64::MAX - 1;
/// Name of the virtual file that tells the `tierfs` command which filesystem a mount is.
pub const INFO_NAME: &str = ".tierfs-info";
const INFO_INO: u64 = u64::MAX - 2;

/// Prefix of the extended attributes that carry `tierfs pcc` commands.
pub const PCC_XATTR: &[u8] = b"user.tierfs.pcc.";

fn is_virtual(ino: u64) -> bool {
    ino == STATS_INO || ino == INFO_INO
}
/// `st_blksize` of every inode (also the memfs floor's: glibc sizes its directory buffer, and
/// so the kernel its READDIRPLUS requests, and coreutils their I/O buffers, by it).
pub(crate) const BLKSIZE: u32 = 1 << 16;

/// Most bytes one copy_file_range call copies (the reply carries a 32-bit count).
const COPY_MAX: u64 = 1 << 30;
/// copy_file_range moves data through the daemon in pieces of this size.
const COPY_PIECE: u64 = 4 << 20;

struct Handle {
    append: bool,
    /// End of the last read, to spot sequential readers.
    last_read_end: AtomicU64,
    stats: Option<Vec<u8>>,
    /// Served from the persistent client cache: the cache file (used directly when the kernel
    /// could not take passthrough), whether the file is RW-cached, and whether this handle may
    /// write.
    cache: Option<CachedHandle>,
    /// Who opened it: a close (queued, recorded later by the session thread) and the flush at
    /// release are recorded in the changelog in this context.
    caller: Caller,
    /// The session it was opened under: once this client was fenced (that session reaped or
    /// evicted, its opens and locks dropped), the handle fails with EIO (close succeeds).
    session: u64,
    /// A read-only handle of a released file opened while its restore runs
    /// ([`FsInner::open_restoring`]): reads inside the restored prefix are served at once,
    /// others wait for it ([`FsInner::restore_covers`]). None for every other handle.
    restoring: Option<Restoring>,
    /// A read-only handle opened uncached on a client with a cache: its reads move to the
    /// file's RO copy once one is made while it is open ([`FsInner::late_ro_copy`]). None for
    /// every other handle.
    late_ro: Option<LateRo>,
    /// A handle of the data path opened for writing: while one is open, a setattr that only
    /// grants waits for the commit its close makes (data/deferred.rs).
    writes: bool,
}

/// The RO copy an uncached read-only handle moved to (the first open of a file under an `ro`
/// rule is served uncached and the `pcc-ro-copy` worker copies the file later: a reader that
/// keeps that handle open, such as fio's, reads the copy once it is there).
struct LateRo {
    /// No read looks for the copy before this (the worker copies only after opens paused).
    next_look: Mutex<Instant>,
    /// The copy, opened and counted as an open handle of it (closed at release).
    file: OnceLock<Arc<std::fs::File>>,
}

/// How often reads of an uncached read-only handle look for an RO copy of their file.
const LATE_RO_LOOK: Duration = Duration::from_millis(20);

/// The restore a read-only handle of a released file follows.
struct Restoring {
    /// The RESTORE request (0 once it succeeded: the handle reads as any other).
    request: AtomicU64,
    /// The restored prefix this handle last saw: bytes `0..prefix` are readable.
    prefix: AtomicU64,
    /// The file's size (a released file's size does not change while it is open).
    size: u64,
}

struct CachedHandle {
    file: Arc<std::fs::File>,
    write: bool,
    passthrough: bool,
    /// Served on the file's kept open: the engine has no record of this handle's own
    /// (`Pcc::open_kept`); its close sends nothing.
    kept: bool,
    /// The file was setuid or setgid at open: its record is never kept (a writer of such a
    /// file is served by the daemon, which needs to know the mode at each open).
    setid: bool,
}

/// What a new inode takes from its directory: its permission bits and, where the directory
/// has a default ACL, the ACL xattrs to store (encoded).
struct Inherited {
    perm: u32,
    access: Option<Vec<u8>>,
    default: Option<Vec<u8>>,
}

/// Most requests (opens, truncates) waiting at once, each on a thread of its own, for another
/// client to give an RW-PCC lease back; past it such a request fails with EAGAIN at once.
const MAX_PARKED: usize = 256;

/// How often a parked request waits again when, after one give-back, yet another client has
/// taken the lease before the request could go on; then it fails with ETIMEDOUT.
const MAX_RECALL_ROUNDS: usize = 8;

/// What a request that may need another client's RW-PCC lease given back got to: done, or
/// stopped (before changing anything) because that client holds the lease, or (an open)
/// because this client's own cache is changing the file's state (a write-back or give-back
/// holds the file's lock in [`Pcc`]): either way it waits off the request thread.
enum Step<T> {
    Done(T),
    Wait(PccLease),
    Busy,
}

/// A parked open polls the restore it waits for (SQLite has no notices) after this, doubling
/// up to [`RESTORE_POLL_MAX`].
const RESTORE_POLL_MIN: Duration = Duration::from_millis(20);
const RESTORE_POLL_MAX: Duration = Duration::from_millis(500);

/// Whether `e` says the file is released (its data in the archive only): the request restores
/// it first ([`FsInner::wait_restored`]).
fn is_released(e: &ClientError) -> bool {
    matches!(e, ClientError::Meta(MetaError::Hsm(HsmError::Released)))
}

/// The error of a restore that failed for good or was canceled: EIO (`tierfs hsm action` says
/// why).
fn restore_ended(r: &HsmRequest) -> ClientError {
    let why = match r.state {
        RequestState::Canceled => "was canceled".to_string(),
        _ => format!(
            "failed: {}",
            r.last_error.as_deref().unwrap_or("no reason given")
        ),
    };
    ClientError::Failed(format!("restore of inode {} {why}", r.ino), libc::EIO)
}

/// A new handle: its number, open flags and passthrough backing file.
type Opened = (u64, FopenFlags, Option<Arc<BackingId>>);

/// Who makes a request, kept for the part of it that runs off the request thread.
#[derive(Clone, Copy)]
struct Asker {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Asker {
    fn of(req: &Request) -> Asker {
        Asker {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        }
    }
}

/// The changes a setattr asks for.
#[derive(Clone, Copy)]
struct SetattrArgs {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    ctime: Option<SystemTime>,
}

/// A place for one request waiting off the FUSE threads (counted against [`MAX_PARKED`] until
/// dropped), interruptible once its reply is held ([`Parked::hold`]).
struct Parked {
    fs: Arc<FsInner>,
    /// The request's `unique` (what an interrupt names).
    unique: u64,
    /// Registered for interrupts.
    watched: bool,
}

impl Drop for Parked {
    fn drop(&mut self) {
        if self.watched {
            self.fs.lock_waits.lock().parked.remove(&self.unique);
        }
        self.fs.parked.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A reply that can answer an error (an interrupted parked request answers EINTR).
trait Answer: Send + 'static {
    fn fail(self, e: Errno);
}
impl Answer for ReplyOpen {
    fn fail(self, e: Errno) {
        self.error(e)
    }
}
impl Answer for ReplyAttr {
    fn fail(self, e: Errno) {
        self.error(e)
    }
}
impl Answer for ReplyData {
    fn fail(self, e: Errno) {
        self.error(e)
    }
}

/// The reply of a parked request, answered once: by its waiter, which answers while holding
/// the lock (so the request is carried out only if no interrupt answered it first), or by an
/// interrupt (EINTR) while the waiter waits for the recall.
struct HeldReply<R>(Mutex<Option<R>>);

impl<R: Answer> HeldReply<R> {
    /// The kernel interrupts the request: EINTR, unless the waiter is answering it just now.
    fn interrupt(&self) {
        if let Some(mut g) = self.0.try_lock() {
            if let Some(r) = g.take() {
                r.fail(Errno::EINTR);
            }
        }
    }

    fn take(&self) -> Option<R> {
        self.0.lock().take()
    }
}

/// What a parked request gets when an interrupt answered it first.
fn interrupted() -> ClientError {
    ClientError::Errno("interrupted while waiting for a recall", libc::EINTR)
}

impl Parked {
    /// Holds the request's reply so that an interrupt of the request can answer it (EINTR);
    /// None, having answered EINTR, when the interrupt came already.
    fn hold<R: Answer>(&mut self, reply: R) -> Option<Arc<HeldReply<R>>> {
        let held = Arc::new(HeldReply(Mutex::new(Some(reply))));
        let on_interrupt: Arc<dyn Fn() + Send + Sync> = {
            let held = Arc::clone(&held);
            Arc::new(move || held.interrupt())
        };
        let mut g = self.fs.lock_waits.lock();
        if let Some(i) = g.early.iter().position(|(u, _)| *u == self.unique) {
            g.early.remove(i);
            drop(g);
            held.interrupt();
            return None;
        }
        g.parked.insert(self.unique, on_interrupt);
        self.watched = true;
        Some(held)
    }

    /// Runs `job` on a thread of its own, in the caller scope of the request (changelog
    /// records). Should the thread not start, the job's reply is dropped, which answers EIO.
    fn spawn(self, what: &'static str, job: impl FnOnce(&FsInner) + Send + 'static) {
        let caller = tierfs_meta::changelog::current();
        let r = std::thread::Builder::new()
            .name(format!("tierfs-{what}-wait"))
            .spawn(move || {
                let _caller = caller.enter();
                job(&self.fs);
            });
        if let Err(e) = r {
            tracing::warn!(what, "cannot start a thread for a waiting request: {e}");
        }
    }
}

/// Most blocked `F_SETLKW`/`flock` requests waiting at once; past it such a request fails with
/// ENOLCK (as when a lock table is full).
const MAX_LOCK_WAITS: usize = 1024;

/// Interrupts the kernel sent for requests not (yet) known as lock waits or parked requests,
/// kept this long (and at most [`EARLY_INTERRUPTS_MAX`] of them): one may name a request another
/// FUSE thread is still dispatching. (Interrupts of other requests are ignored.)
const EARLY_INTERRUPT_TTL: Duration = Duration::from_secs(30);
const EARLY_INTERRUPTS_MAX: usize = 1024;

/// States of a [`LockWait`].
const WAITING: u8 = 0;
/// The kernel asked to interrupt the request (a signal reached the process).
const INTERRUPTED: u8 = 1;
/// Its owner closed the file (flush or release): a lock must not outlive that.
const CANCELLED: u8 = 2;
const GRANTED: u8 = 3;

/// A blocked `F_SETLKW`/`flock`, retried on a thread of its own until it gets the lock, its
/// request is interrupted, or its owner closes the file.
struct LockWait {
    ino: Ino,
    owner: u64,
    state: AtomicU8,
    sleep: Mutex<()>,
    wake: Condvar,
}

impl LockWait {
    /// Stops a waiting lock request for `why` (INTERRUPTED or CANCELLED); nothing once it got
    /// the lock or was stopped already.
    fn stop(&self, why: u8) {
        if self
            .state
            .compare_exchange(WAITING, why, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let _g = self.sleep.lock();
            self.wake.notify_all();
        }
    }

    /// Sleeps up to `d`, or until stopped.
    fn nap(&self, d: Duration) {
        let mut g = self.sleep.lock();
        if self.state.load(Ordering::SeqCst) == WAITING {
            self.wake.wait_for(&mut g, d);
        }
    }
}

/// The lock requests waiting, by request `unique`, and interrupts that came before their request
/// was known.
#[derive(Default)]
struct LockWaits {
    by_unique: HashMap<u64, Arc<LockWait>>,
    /// Parked requests (opens, truncates waiting for a recall), by `unique`: what answers one
    /// EINTR when it is interrupted.
    parked: HashMap<u64, Arc<dyn Fn() + Send + Sync>>,
    early: std::collections::VecDeque<(u64, Instant)>,
}

/// Answers an open.
fn answer_open(reply: ReplyOpen, r: Result<Opened>) {
    match r {
        Ok((fh, fl, Some(id))) => reply.opened_passthrough(FileHandle(fh), fl, &id),
        Ok((fh, fl, None)) => reply.opened(FileHandle(fh), fl),
        Err(e) => reply.error(ino_errno(&e)),
    }
}

/// Reply types that can register a passthrough backing file.
trait BackingReply {
    fn backing(&self, f: &std::fs::File) -> std::io::Result<BackingId>;
}
impl BackingReply for ReplyOpen {
    fn backing(&self, f: &std::fs::File) -> std::io::Result<BackingId> {
        self.open_backing(f)
    }
}
impl BackingReply for ReplyCreate {
    fn backing(&self, f: &std::fs::File) -> std::io::Result<BackingId> {
        self.open_backing(f)
    }
}

/// The filesystem's state, shared (through [`TierFs`]'s `Arc`) with work that runs off the FUSE
/// request threads, such as an open waiting for another client to give its RW-PCC lease back.
pub struct FsInner {
    pub meta: Arc<dyn MetaEngine>,
    pub data: Arc<DataPath>,
    pub metrics: Arc<Metrics>,
    /// This client's session (swapped when it is fenced: see [`crate::session`]).
    pub session: Arc<Session>,
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    /// Set when this client follows the others' changes (`follow_changes`): replies then
    /// carry the long TTL while the follower keeps up ([`crate::workers::follow`]).
    pub follow: Option<Arc<crate::workers::follow::FollowState>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    /// Set once mounted: lets an open tell the kernel to drop attributes it cached of a file
    /// that changed on another client.
    pub notifier: Arc<OnceLock<Notifier>>,
    /// Contents of the info file (JSON: meta URL, client name, session).
    pub info_json: String,
    /// Files on which this client took locks (only those need releasing at close).
    locked: Mutex<std::collections::HashSet<Ino>>,
    /// The persistent client cache, when this client has one.
    pub pcc: Option<Arc<Pcc>>,
    /// Recalls another client's RW-PCC lease before this client opens or truncates the file
    /// (with or without a cache of its own).
    recaller: Arc<Recaller>,
    /// Whether the kernel accepted FUSE passthrough at init.
    passthrough: AtomicBool,
    /// One passthrough backing file per inode, shared by its open handles.
    backing: Mutex<HashMap<Ino, (Arc<BackingId>, u32)>>,
    /// Last name each inode was looked up or created under (for fname rules at open).
    names: Mutex<HashMap<Ino, Vec<u8>>>,
    /// POSIX ACLs on (`posix_acl` in the client config; the kernel enforces them only when it
    /// accepted FUSE_POSIX_ACL at init).
    pub posix_acl: bool,
    /// Extended attributes on (`xattrs` in the client config). Off: every xattr request but a
    /// `tierfs pcc` command answers EOPNOTSUPP, as a filesystem without xattrs; `ls -l` and
    /// `cp -a` remember that per filesystem and stop asking.
    pub xattrs: bool,
    /// When listings carry attributes (`readdirplus` in the client config).
    pub readdirplus: ReaddirPlus,
    /// Ask the kernel for its writeback cache (`writeback_cache` in the client config; never
    /// with a persistent client cache: the daemon leaves it off then).
    pub writeback_cache: bool,
    /// Ask for FUSE over io_uring (`fuse_uring` in the client config; the patched fuser,
    /// vendor/fuser/src/uring.rs).
    pub fuse_uring: bool,
    /// Who makes each request, for changelog records (uid/gid, job id).
    pub callers: crate::caller::Callers,
    /// Who may attach, detach, pin and unpin by hand (`pcc_attach`).
    pub pcc_attach: crate::config::AttachPolicy,
    /// Requests waiting off the FUSE threads for an RW-PCC lease (at most [`MAX_PARKED`]).
    parked: AtomicUsize,
    /// Blocked lock requests waiting on threads of their own.
    lock_waits: Mutex<LockWaits>,
    /// Inodes known to have no xattrs, for `attr_ttl` ([`crate::xattr_hint`]).
    pub xattr_hint: Arc<crate::xattr_hint::XattrHint>,
}

/// The FUSE filesystem: a handle on the shared [`FsInner`] (its methods are reached through
/// `Deref`); off-thread work clones the `Arc`.
pub struct TierFs {
    inner: Arc<FsInner>,
}

impl std::ops::Deref for TierFs {
    type Target = FsInner;
    fn deref(&self) -> &FsInner {
        &self.inner
    }
}

/// Setting the filesystem up before it is mounted (the daemon fills in the cache, the notifier,
/// the caller source): the state is not shared yet then. Once a copy of the `Arc` is held
/// elsewhere (after mount), mutable access is a programming error and panics.
impl std::ops::DerefMut for TierFs {
    fn deref_mut(&mut self) -> &mut FsInner {
        Arc::get_mut(&mut self.inner).expect("TierFs is configured before it is shared")
    }
}

fn to_time(n: i64) -> SystemTime {
    if n >= 0 {
        UNIX_EPOCH + Duration::from_nanos(n as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(n.unsigned_abs())
    }
}

fn from_time(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn errno(e: &ClientError) -> Errno {
    Errno::from_i32(e.errno())
}

/// For requests that name an inode rather than a name: an inode that no longer exists is
/// ESTALE, so the kernel looks the path up again (another client may have replaced the file,
/// e.g. renamed a new version over it) instead of failing with ENOENT.
fn ino_errno(e: &ClientError) -> Errno {
    match e {
        ClientError::Meta(MetaError::NotFound) => Errno::ESTALE,
        other => errno(other),
    }
}

/// Mode bits after a write, truncate or chown that must drop privileges (the kernel's
/// `setattr_should_drop_suidgid`): setuid goes; setgid goes where it means "set group id on
/// execution" (group-executable), or when the caller is neither in the file's group nor root.
/// `in_group` is asked only when it matters (setgid without group-execute).
fn kill_suid_sgid(perm: u32, in_group: impl FnOnce() -> bool) -> u32 {
    let mut p = perm & !libc::S_ISUID;
    if perm & libc::S_ISGID != 0 && (perm & libc::S_IXGRP != 0 || !in_group()) {
        p &= !libc::S_ISGID;
    }
    p
}

/// Whether the caller of `req` is root or a member of group `gid` (its primary group, or a
/// supplementary group as /proc lists them; FUSE passes only the primary one).
fn in_group_or_root(req: &Request, gid: u32) -> bool {
    Asker::of(req).in_group_or_root(gid)
}

impl Asker {
    /// [`in_group_or_root`] of this asker.
    fn in_group_or_root(&self, gid: u32) -> bool {
        if self.uid == 0 || self.gid == gid {
            return true;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return false;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .map(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
            .unwrap_or(false)
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(from_time(s)),
    }
}

impl TierFs {
    pub fn new(
        meta: Arc<dyn MetaEngine>,
        data: Arc<DataPath>,
        metrics: Arc<Metrics>,
        session: Arc<Session>,
        attr_ttl: Duration,
        entry_ttl: Duration,
        recaller: Arc<Recaller>,
    ) -> TierFs {
        let inner = FsInner {
            meta,
            data,
            metrics,
            session,
            attr_ttl,
            entry_ttl,
            follow: None,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            notifier: Arc::new(OnceLock::new()),
            info_json: String::new(),
            locked: Mutex::new(Default::default()),
            pcc: None,
            recaller,
            passthrough: AtomicBool::new(false),
            backing: Mutex::new(HashMap::new()),
            names: Mutex::new(HashMap::new()),
            posix_acl: true,
            xattrs: true,
            readdirplus: ReaddirPlus::Always,
            writeback_cache: false,
            fuse_uring: false,
            callers: crate::caller::Callers::new(crate::caller::JobIdSource::Disabled),
            pcc_attach: crate::config::AttachPolicy::Root,
            parked: AtomicUsize::new(0),
            lock_waits: Mutex::new(LockWaits::default()),
            xattr_hint: Arc::new(crate::xattr_hint::XattrHint::new(attr_ttl)),
        };
        TierFs {
            inner: Arc::new(inner),
        }
    }

    /// A place for a request to wait off the FUSE threads, or None (logged) when
    /// [`MAX_PARKED`] requests wait already.
    fn park(&self, req: &Request) -> Option<Parked> {
        let before = self.parked.fetch_add(1, Ordering::Relaxed);
        let slot = Parked {
            fs: Arc::clone(&self.inner),
            unique: req.unique().0,
            watched: false,
        };
        if before >= MAX_PARKED {
            tracing::warn!(
                "{MAX_PARKED} requests already wait for RW-PCC leases on other clients: EAGAIN"
            );
            return None;
        }
        self.metrics.pcc("requests_parked", 1);
        Some(slot)
    }
}

impl FsInner {
    /// The attribute TTL of a reply now: the long one while the change follower keeps up.
    fn attr_ttl_now(&self) -> Duration {
        match &self.follow {
            Some(f) => f.ttl(self.attr_ttl),
            None => self.attr_ttl,
        }
    }

    /// The entry TTL of a reply now (see [`FsInner::attr_ttl_now`]).
    fn entry_ttl_now(&self) -> Duration {
        match &self.follow {
            Some(f) => f.ttl(self.entry_ttl),
            None => self.entry_ttl,
        }
    }

    fn fattr(&self, a: &Attr) -> FileAttr {
        // A regular file: attribute changes waiting for the commit of this client's buffered
        // writes show here at once (data/deferred.rs), and so do the writes in size and
        // st_blocks (the bytes that hold data, schema v5); a directory or a symlink counts its
        // size.
        let (shown, mut size, mut allocated) = match a.kind {
            Kind::File => self.data.local_view(a),
            _ => (None, a.size, a.size),
        };
        let a = shown.as_ref().unwrap_or(a);
        // (an RW-cached file's changes waiting for its report: Pcc::defer_setattr)
        let pcc_shown = match (&self.pcc, a.kind) {
            (Some(pcc), Kind::File) => pcc.shown(a),
            _ => None,
        };
        let a = pcc_shown.as_ref().unwrap_or(a);
        // Every reply with attributes says whether the inode has xattrs.
        self.xattr_hint.seen(a);
        let mut mtime = a.mtime;
        if let Some((s, m)) = self.pcc.as_ref().and_then(|p| p.local_attr(a.ino)) {
            // RW-cached here: the cache file is the truth.
            size = s;
            mtime = m;
            allocated = s;
        }
        FileAttr {
            ino: INodeNo(a.ino),
            size,
            blocks: allocated.div_ceil(512),
            atime: to_time(a.atime),
            mtime: to_time(mtime),
            ctime: to_time(a.ctime.max(mtime)),
            crtime: to_time(a.crtime),
            kind: file_type(a.kind),
            perm: (a.perm & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: BLKSIZE,
            flags: 0,
        }
    }

    fn stats_attr(&self, ino: u64) -> FileAttr {
        let now = SystemTime::now();
        FileAttr {
            ino: INodeNo(ino),
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: FileType::RegularFile,
            perm: 0o444,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        }
    }

    fn new_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Arc::new(h));
        fh
    }

    fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.handles.lock().get(&fh.0).cloned()
    }

    /// Enters the changelog caller scope of a request (uid/gid, job id); ends when dropped.
    fn scope(&self, req: &Request) -> CallerGuard {
        self.callers.enter(req.uid(), req.gid(), req.pid())
    }

    fn run<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f();
        self.metrics.op(op, t, r.as_ref().err().map(|e| e.errno()));
        if let Err(e) = &r {
            let n = e.errno();
            if (n == libc::EIO && !is_released(e)) || n == libc::ENOSPC {
                tracing::warn!(op, "error: {e}");
            } else {
                tracing::debug!(op, "error: {e}");
            }
        }
        r
    }
}

impl TierFs {
    /// A new inode of `kind` owned by the caller (setgid-directory inheritance is the
    /// engine's).
    fn new_node(req: &Request, kind: Kind, perm: u32) -> NewNode {
        NewNode {
            kind,
            perm,
            uid: req.uid(),
            gid: req.gid(),
            rdev: 0,
            symlink: None,
        }
    }
}

impl FsInner {
    /// The mode of a new inode under `parent` and the ACLs it inherits (the kernel's
    /// posix_acl_create): where the directory has a default ACL, the umask is not applied; the
    /// default ACL masked by the mode asked for becomes the inode's access ACL (stored only
    /// when the mode cannot say it all) and, for a directory, its default ACL too.
    fn inherit(&self, parent: Ino, kind: Kind, mode: u32, umask: u32) -> Result<Inherited> {
        let mode = mode & 0o7777;
        let plain = Inherited {
            perm: mode & !umask,
            access: None,
            default: None,
        };
        if kind == Kind::Symlink || !self.posix_acl {
            return Ok(plain);
        }
        if self.xattr_hint.none(parent) {
            // No xattrs, so no default ACL (within attr_ttl, as the parent's mode).
            return Ok(plain);
        }
        let default = match self.meta.getxattr(parent, acl::DEFAULT) {
            Ok(v) => match Acl::decode(&v) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(parent, "ignoring the directory's default ACL: {e}");
                    None
                }
            },
            Err(MetaError::NoAttr) => None,
            Err(e) => return Err(e.into()),
        };
        let Some(default) = default else {
            return Ok(plain);
        };
        let mut access = default.clone();
        let perm = access.create_masq(mode);
        Ok(Inherited {
            perm,
            access: (!access.is_mode()).then(|| access.encode()),
            default: (kind == Kind::Dir).then(|| default.encode()),
        })
    }

    /// Stores the ACLs a new inode inherited.
    fn store_inherited(&self, ino: Ino, inh: &Inherited) -> Result<()> {
        if let Some(v) = &inh.access {
            self.set_xattr(ino, acl::ACCESS, v, 0)?;
        }
        if let Some(v) = &inh.default {
            self.set_xattr(ino, acl::DEFAULT, v, 0)?;
        }
        Ok(())
    }

    /// Sets an xattr in the engine; the inode is marked changed first, so that no attribute
    /// reply read before the change makes this client answer "no xattrs" from memory.
    fn set_xattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> tierfs_meta::Result<()> {
        self.xattr_hint.changed(ino);
        self.meta.setxattr(ino, name, value, flags)
    }

    /// Removes an ACL xattr; absent is fine (as on ext4, removing no ACL succeeds).
    fn remove_acl(&self, ino: Ino, name: &[u8]) -> Result<()> {
        match self.meta.removexattr(ino, name) {
            Ok(()) | Err(MetaError::NoAttr) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Refuses an xattr request on a mount without xattrs (`xattrs = false`).
    fn xattrs_on(&self) -> Result<()> {
        if self.xattrs {
            Ok(())
        } else {
            Err(ClientError::Errno(
                "extended attributes are off on this mount (xattrs = false)",
                libc::EOPNOTSUPP,
            ))
        }
    }

    /// setxattr of `system.posix_acl_access` or `_default` (the kernel's set_posix_acl, then
    /// ext4's rules): validated; an access ACL sets the mode's permission bits (and drops
    /// setgid for a caller outside the file's group) and is stored only when the mode cannot
    /// say it all; an ACL of no entries removes it.
    fn set_acl(&self, req: &Request, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        if !self.posix_acl {
            return Err(ClientError::Errno(
                "POSIX ACLs are off on this mount (posix_acl = false)",
                libc::EOPNOTSUPP,
            ));
        }
        let parsed =
            Acl::decode(value).map_err(|e| ClientError::Failed(e.to_string(), e.errno()))?;
        // Read from the engine now: an ACL to remove from an inode it counts no xattrs for is
        // absent already (nothing to do, at the time of this read). As this client shows it:
        // with a chmod that waits for its buffered writes' commit.
        let engine = self.meta.getattr(ino)?;
        let a = self.data.shown(&engine).unwrap_or_else(|| engine.clone());
        let a = match &self.pcc {
            Some(pcc) => pcc.shown(&a).unwrap_or(a),
            None => a,
        };
        if name == acl::DEFAULT {
            if a.kind != Kind::Dir {
                return Err(ClientError::Errno(
                    "a default ACL is for directories only",
                    libc::EACCES,
                ));
            }
            return match parsed {
                Some(d) => Ok(self.set_xattr(ino, acl::DEFAULT, &d.encode(), 0)?),
                None if a.has_xattrs() => self.remove_acl(ino, acl::DEFAULT),
                None => Ok(()),
            };
        }
        let Some(access) = parsed else {
            if a.has_xattrs() {
                self.remove_acl(ino, acl::ACCESS)?;
            }
            return Ok(());
        };
        let mut perm = (a.perm & 0o7000) | access.mode_bits();
        if perm & libc::S_ISGID != 0 && !in_group_or_root(req, a.gid) {
            perm &= !libc::S_ISGID;
        }
        if access.is_mode() && perm == a.perm && !a.has_xattrs() {
            // An ACL equal to the mode of a file without one (`cp -a` of a plain file):
            // nothing changes, as on ext4 (not even the ctime).
            return Ok(());
        }
        if access.is_mode() && !a.has_xattrs() && !self.writeback_cache {
            // A mode that adds permissions to a file with writes buffered here (`cp -a`'s ACL
            // after its copy): with their commit (data/deferred.rs); of a file RW-cached here
            // with a writer: with the writer's report (Pcc::defer_setattr, judged on the
            // attributes the engine has).
            let set = SetAttr {
                perm: Some(perm),
                ..Default::default()
            };
            let waits = self.data.defer_setattr(ino, &set).is_some()
                || self
                    .pcc
                    .as_ref()
                    .is_some_and(|p| p.defer_setattr(ino, &set, &engine).is_some());
            if waits {
                if let Some(n) = self.notifier.get() {
                    let _ = n.inval_inode(INodeNo(ino), -1, 0);
                }
                return Ok(());
            }
        }
        // Changes waiting for a commit of buffered writes (or for an RW-cached file's report)
        // go first: this one is newer.
        self.data.settle(ino)?;
        if let Some(pcc) = &self.pcc {
            pcc.with_deferred(ino, |waiting| match waiting {
                Some(w) => self.meta.setattr(ino, w).map(drop).map_err(Into::into),
                None => Ok(()),
            })?;
        }
        // The mode is set only when it changes (as on ext4; the ACL's own change moves the
        // ctime); its reply counts the xattrs in the same transaction.
        let now = if perm != a.perm {
            let set = SetAttr {
                perm: Some(perm),
                ..Default::default()
            };
            let now = self.meta.setattr(ino, &set)?;
            self.data.attrs_set(&now);
            now
        } else {
            a
        };
        if !access.is_mode() {
            self.set_xattr(ino, acl::ACCESS, &access.encode(), 0)?;
        } else if now.has_xattrs() {
            self.remove_acl(ino, acl::ACCESS)?;
        }
        // The kernel refetches after an ACL change only when it negotiated FUSE_POSIX_ACL.
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
        Ok(())
    }

    /// chmod of a file with an access ACL (posix_acl_chmod): its owner, mask (or group owner)
    /// and other entries follow the new mode.
    fn chmod_acl(&self, ino: Ino, mode: u32) -> Result<()> {
        let v = match self.meta.getxattr(ino, acl::ACCESS) {
            Ok(v) => v,
            Err(MetaError::NoAttr) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        match Acl::decode(&v) {
            Ok(Some(mut a)) => {
                a.chmod(mode);
                self.set_xattr(ino, acl::ACCESS, &a.encode(), 0)?;
            }
            Ok(None) => self.remove_acl(ino, acl::ACCESS)?,
            Err(e) => tracing::warn!(ino, "chmod leaves a malformed access ACL alone: {e}"),
        }
        Ok(())
    }

    fn make_node(&self, parent: Ino, name: &OsStr, node: NewNode, open: bool) -> Result<Attr> {
        let layout = if node.kind == Kind::File {
            Some(self.data.choose_layout(parent)?)
        } else {
            None
        };
        let sid = self.session.id();
        let open_by = if open { Some(sid) } else { None };
        Ok(self.session.watch(
            sid,
            self.meta
                .create(parent, name.as_bytes(), &node, layout, open_by),
        )?)
    }

    /// [`FsInner::make_node`] of a regular file opened at once, under `rw`'s RW rules: the
    /// create and, when a rule wants the new inode, its RW-PCC lease (dirty) in one engine
    /// transaction ([`MetaEngine::pcc_create`]); the rule and the lease when one was taken.
    fn make_file_leased(
        &self,
        parent: Ino,
        name: &OsStr,
        node: NewNode,
        pcc: &Pcc,
        rw: &RwAtCreate,
    ) -> Result<(Attr, Option<(u64, PccLease)>)> {
        let layout = Some(self.data.choose_layout(parent)?);
        let sid = self.session.id();
        let (a, lease) = self.session.watch(
            sid,
            self.meta.pcc_create(
                parent,
                name.as_bytes(),
                &node,
                layout,
                Some(sid),
                &pcc.client,
                &|a| rw.wants(a),
            ),
        )?;
        Ok((a, lease.and_then(|l| rw.rule().map(|r| (r, l)))))
    }

    /// A new handle on `attr`'s file; `recorded` when the open is already in the metadata
    /// engine (create + open in one transaction).
    fn open_file(&self, attr: &Attr, flags: i32, recorded: bool) -> Result<(u64, FopenFlags)> {
        self.open_following(attr, flags, recorded, None)
    }

    /// [`FsInner::open_file`], of a handle that follows the restore `restoring`, if any.
    fn open_following(
        &self,
        attr: &Attr,
        flags: i32,
        recorded: bool,
        restoring: Option<Restoring>,
    ) -> Result<(u64, FopenFlags)> {
        let sid = self.session.id();
        if !recorded && !self.data.cancel_queued_close(attr.ino, sid) {
            self.session
                .watch(sid, self.meta.open_file(sid, attr.ino))?;
        }
        Ok(self.new_open_handle(attr, flags, !recorded, sid, restoring))
    }

    /// A new handle on `attr`'s file whose open is counted in the metadata engine already,
    /// under session `sid`; `seen`: the file existed before this open (not created by it).
    fn open_handle(&self, attr: &Attr, flags: i32, seen: bool, sid: u64) -> (u64, FopenFlags) {
        self.new_open_handle(attr, flags, seen, sid, None)
    }

    /// [`FsInner::open_handle`], of a handle that follows the restore `restoring`, if any.
    fn new_open_handle(
        &self,
        attr: &Attr,
        flags: i32,
        seen: bool,
        sid: u64,
        restoring: Option<Restoring>,
    ) -> (u64, FopenFlags) {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let keep = self.data.open(attr, writes);
        if !keep && seen {
            // The data changed since this client last saw it: make the kernel drop its cached
            // size too, so reads are not cut at a stale end of file. (Not for a file this open
            // just created: the kernel knows nothing stale of it.)
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(INodeNo(attr.ino), -1, 0);
            }
        }
        let append = flags & libc::O_APPEND != 0;
        let mut fl = FopenFlags::empty();
        if append {
            // Appends go where the filesystem says the end is, not the kernel's cached size.
            fl |= FopenFlags::FOPEN_DIRECT_IO;
        } else if restoring.is_some() {
            // Following a restore: each read(2) comes here as a request of its own, which waits
            // for its bytes interruptibly (the kernel's page-cache reads wait for a FUSE answer
            // only killably), and the kernel keeps no pages of the file from this handle.
            fl |= FopenFlags::FOPEN_DIRECT_IO;
        } else if keep {
            fl |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        let late_ro = (self.pcc.is_some()
            && flags & libc::O_ACCMODE == libc::O_RDONLY
            && restoring.is_none())
        .then(|| LateRo {
            next_look: Mutex::new(Instant::now() + LATE_RO_LOOK),
            file: OnceLock::new(),
        });
        let fh = self.new_handle(Handle {
            append,
            last_read_end: AtomicU64::new(u64::MAX),
            stats: None,
            cache: None,
            caller: tierfs_meta::changelog::current(),
            session: sid,
            restoring,
            late_ro,
            writes,
        });
        (fh, fl)
    }

    /// A setattr, up to where another client's RW-PCC lease makes it wait ([`Step::Wait`],
    /// nothing changed yet) or done.
    fn setattr_now(&self, asker: &Asker, ino: Ino, args: &SetattrArgs) -> Result<Step<Attr>> {
        let SetattrArgs {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
        } = *args;
        let mut size = size;
        let chmod = mode;
        let mut mode = mode;
        // The kernel leaves clearing setuid/setgid to us (FUSE_HANDLE_KILLPRIV_V2), by its
        // rules (fs/attr.c): a chown of anything but a directory clears them (setuid for
        // root too), and so does a truncate of a regular file by anyone but root. A chown
        // to -1, -1 (which changes nothing else) reaches us as a setattr that sets nothing:
        // it is the only call that sends one. With the writeback cache the kernel owns ctime
        // and sends it with every setattr: that chown then comes as a setattr of ctime alone.
        let nothing = mode.is_none() && size.is_none() && atime.is_none() && mtime.is_none();
        let chown = uid.is_some() || gid.is_some() || nothing;
        // A chown by root (tar's fchown of every file it extracts): the engine applies the
        // rules in the setattr's own transaction, without a read of the mode first.
        let kill_setid = mode.is_none() && chown && asker.uid == 0;
        if mode.is_none() && !kill_setid && (chown || (size.is_some() && asker.uid != 0)) {
            let a = self.meta.getattr(ino)?;
            let applies = if chown {
                a.kind != Kind::Dir
            } else {
                a.kind == Kind::File
            };
            if applies {
                let killed = kill_suid_sgid(a.perm, || asker.in_group_or_root(a.gid));
                if killed != a.perm {
                    mode = Some(killed);
                }
            }
        }
        let local = self
            .pcc
            .as_ref()
            .map(|p| p.local_attr(ino).is_some())
            .unwrap_or(false);
        let (mut atime, mut mtime) = (atime, mtime);
        if let (true, Some(pcc)) = (local, &self.pcc) {
            // RW-cached here: size and times belong to the cache file. Times go to the engine
            // too (below), the same ones: "now" is read once, here.
            let now = std::time::SystemTime::now();
            let pin = |t: TimeOrNow| match t {
                TimeOrNow::Now => TimeOrNow::SpecificTime(now),
                t => t,
            };
            (atime, mtime) = (atime.map(pin), mtime.map(pin));
            if size.is_some() || atime.is_some() || mtime.is_some() {
                pcc.set_local(ino, size, atime.map(time_set), mtime.map(time_set))?;
            }
            size = None;
        } else if size.is_some() {
            // Another client's RW-PCC file is given back before its size changes here (the
            // caller waits for that off the request thread).
            match self.recaller.look_ino(ino)? {
                Lease::Held(l) => return Ok(Step::Wait(l)),
                // Leased to this client, but not RW-cached here: its data is not here.
                Lease::Ours(l) => self.recaller.ours_without_data(&l)?,
                Lease::Free | Lease::Recalled => {}
            }
        }
        if let (Some(TimeOrNow::SpecificTime(m)), Some(c), None, None, None, None, None) =
            (mtime, ctime, mode, uid, gid, size, atime)
        {
            // The writeback cache's SETATTR after its writes: the kernel's mtime and ctime of
            // them (equal, file_update_time). The commit of the buffered writes sets both:
            // one transaction, not a commit and then a setattr.
            let m = from_time(m);
            if m == from_time(c) {
                if let Some(a) = self.data.flush_stamped(ino, Some(m))? {
                    return Ok(Step::Done(a));
                }
            }
        }
        let set = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(from_time),
            kill_setid,
            unless_changed: None,
        };
        if let (true, Some(pcc), None, None) = (local, &self.pcc, size, ctime) {
            // RW-cached here with a writer (tar's fchown and fchmod before its close): the
            // change may wait for the writer's report (Pcc::defer_setattr), judged on the
            // attributes the engine has now.
            let base = self.meta.getattr(ino)?;
            if let Some(a) = pcc.defer_setattr(ino, &set, &base) {
                return Ok(Step::Done(a));
            }
        }
        if size.is_none() && !local && !self.writeback_cache {
            // Times, a mode that adds permissions, a chown that takes nothing away, of a file
            // with writes buffered here (tar's futimens, fchown and fchmod before its close):
            // they go in the transaction that commits those writes (data/deferred.rs).
            if let Some(a) = self.data.defer_setattr(ino, &set) {
                return Ok(Step::Done(a));
            }
        }
        // Buffered writes land first, so the truncate or the times given (tar sets mtime
        // before close) apply after them and are not overwritten by their commit; times
        // alone go in the commit's own transaction, and so does any change when changes
        // wait for the commit (this one is newer: theirs must not overwrite it afterwards).
        let committed = if size.is_some() {
            self.data.flush(ino)?;
            None
        } else if mtime.is_some() || atime.is_some() || self.data.has_deferred(ino) {
            self.data.flush_then(ino, Some(&set))?
        } else {
            None
        };
        let alone = committed.is_none();
        let a = match (committed, &self.pcc) {
            (Some(a), _) => a,
            // with the changes waiting for the file's report, older, in the same transaction
            (None, Some(pcc)) if local => pcc.with_deferred(ino, |waiting| {
                let set = match waiting {
                    Some(w) => crate::data::deferred::merged(w, &set),
                    None => set.clone(),
                };
                Ok(self.meta.setattr(ino, &set)?)
            })?,
            (None, _) => self.meta.setattr(ino, &set)?,
        };
        // The count comes from the same transaction: without xattrs there is no ACL to follow.
        if let (Some(m), true) = (chmod, a.has_xattrs()) {
            self.chmod_acl(ino, m)?;
        }
        if size.is_some() {
            self.data.changed(ino, &a);
        } else if alone {
            // (a commit's attributes are known here already)
            self.data.attrs_set(&a);
        }
        Ok(Step::Done(a))
    }

    /// After another client's lease `l` was seen: waits (blocking; never on a FUSE request
    /// thread) until it is given back, then runs `step` again, as often as yet another client
    /// took the lease in between (at most [`MAX_RECALL_ROUNDS`] times).
    fn after_recall<T>(
        &self,
        mut l: PccLease,
        step: impl Fn(&FsInner) -> Result<Step<T>>,
    ) -> Result<T> {
        for _ in 0..MAX_RECALL_ROUNDS {
            self.recaller.recall(&l)?;
            match step(self)? {
                Step::Done(v) => return Ok(v),
                Step::Wait(next) => l = next,
                Step::Busy => {}
            }
        }
        Err(ClientError::Errno(
            "the file's RW-PCC lease kept moving between other clients",
            libc::ETIMEDOUT,
        ))
    }

    /// An open up to where another client's RW-PCC lease makes it wait ([`Step::Wait`], nothing
    /// recorded) or done: a new handle. The lease check and the record of the open are one
    /// engine transaction ([`MetaEngine::pcc_open`], through [`Pcc::open`] with a cache, which
    /// also marks this client's own lease dirty before a writable descriptor exists), so a
    /// client that takes the lease afterwards sees the open. `snapshot`: the number of a read
    /// request the owner served with a snapshot ([`Recalled::Snapshot`]).
    ///
    /// `block`: wait for this client's own transition of the file (off the request thread);
    /// without, such a wait answers [`Step::Busy`].
    fn open_step(
        &self,
        reply: &dyn BackingReply,
        ino: Ino,
        flags: i32,
        snapshot: Option<u64>,
        block: bool,
    ) -> Result<Step<Opened>> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let sid = self.session.id();
        if let (Some(pcc), None) = (&self.pcc, snapshot) {
            // This client's RW file with a kept open: served without the engine.
            if let Some(served) = pcc.open_kept(sid, ino, write) {
                return self
                    .open_cached_at(reply, ino, None, flags, served, true)
                    .map(Step::Done);
            }
        }
        // A read-only open reads the file's RW-PCC lease with its attributes: with none, or
        // this client's own, it may be recorded later (below). Other opens leave the lease to
        // `pcc_open`.
        let read_only = !write && snapshot.is_none();
        let (a, lease) = if read_only {
            self.meta.getattr_leased(ino)?
        } else {
            (self.meta.getattr(ino)?, None)
        };
        if a.kind == Kind::Dir {
            return Err(ClientError::Meta(MetaError::IsDir));
        }
        if a.kind != Kind::File {
            let (fh, fl) = self.open_file(&a, flags, false)?;
            return Ok(Step::Done((fh, fl, None)));
        }
        if a.hsm.released() {
            // its data is in the archive only: the caller restores it first (off the request
            // thread) and opens again
            return Err(MetaError::from(HsmError::Released).into());
        }
        // A close of the file still queued here: the engine never stopped counting it open,
        // so no other client took its lease since (pcc_acquire refuses a file open
        // elsewhere): the close and this open cancel out if no lease was there before.
        if self.pcc.is_none() && snapshot.is_none() && self.data.cancel_queued_close(ino, sid) {
            if let Ok(Lease::Free) = self.recaller.look(&a) {
                let (fh, fl) = self.open_handle(&a, flags, true, sid);
                return Ok(Step::Done((fh, fl, None)));
            }
            self.data
                .queue_close(ino, tierfs_meta::changelog::current(), sid);
        }
        if read_only && a.hsm.0 == 0 {
            // A read-only open of a file without HSM state that no client holds in an RW
            // cache, or this client does: answered now (from this client's RO copy or RW
            // cache, if it has one), recorded with the next batch of closes, or never if it is
            // closed before that (DataPath::queue_open; docs/semantics.md, "Read-only opens
            // are recorded a little after they are answered").
            // Some(the cache file it is served from, or None: uncached) when it goes
            // unrecorded
            let unrecorded = match (&self.pcc, &lease) {
                (None, Some(_)) => None,
                (None, None) => Some(None),
                (Some(pcc), Some(l)) => {
                    let name = self.names.lock().get(&ino).cloned();
                    match pcc.open_unrecorded_own(&a, l, name.as_deref()) {
                        Some(Ok(CacheOpened::Served(served))) => Some(Some(served)),
                        Some(Err(e)) => return Err(e),
                        // (another client's lease, or the cache changed since the read: the
                        // engine decides, below)
                        Some(Ok(_)) | None => None,
                    }
                }
                (Some(pcc), None) => {
                    let name = self.names.lock().get(&ino).cloned();
                    match pcc.open_unrecorded(&a, name.as_deref()) {
                        Some(Ok(CacheOpened::Served(served))) => Some(Some(served)),
                        // (served uncached with `a`, the attributes just read)
                        Some(Ok(CacheOpened::Uncached(_))) => Some(None),
                        Some(Err(e)) => return Err(e),
                        // the cache is changing the file's state: opened as usual, below
                        Some(Ok(CacheOpened::Held(_) | CacheOpened::Busy)) | None => None,
                    }
                }
            };
            if let Some(served) = unrecorded {
                self.data
                    .queue_open(ino, tierfs_meta::changelog::current(), sid);
                return match served {
                    Some(served) => self
                        .open_cached(reply, &a, flags, served, true)
                        .map(Step::Done),
                    None => {
                        let (fh, fl) = self.open_handle(&a, flags, true, sid);
                        Ok(Step::Done((fh, fl, None)))
                    }
                };
            }
        }
        let opened = match &self.pcc {
            Some(pcc) => {
                let name = self.names.lock().get(&ino).cloned();
                let r = pcc.open(sid, &a, name.as_deref(), flags, snapshot, block);
                if let Err(ClientError::Meta(MetaError::SessionEnded(s))) = &r {
                    // fenced: a new session for the next request (this one fails, EIO)
                    let _ = self
                        .session
                        .watch::<()>(sid, Err(MetaError::SessionEnded(*s)));
                }
                r?
            }
            None => {
                let client = self.recaller.client();
                match self
                    .session
                    .watch(sid, self.meta.pcc_open(sid, ino, client, write, snapshot))?
                {
                    PccOpen::Held(l) => CacheOpened::Held(l),
                    PccOpen::Snapshot { attr, .. } => CacheOpened::Uncached(attr),
                    PccOpen::Opened { attr, lease: None } => CacheOpened::Uncached(attr),
                    PccOpen::Opened { lease: Some(l), .. } => {
                        // Leased to this client name, but this mount has no cache: its data
                        // is not here (a clean lease is given up, dirty data cannot be read).
                        if let Err(e) = self.recaller.ours_without_data(&l) {
                            let _ = self.meta.close_files(sid, &[ino]);
                            return Err(e);
                        }
                        CacheOpened::Uncached(self.meta.getattr(ino)?)
                    }
                }
            }
        };
        match opened {
            CacheOpened::Served(served) => self
                .open_cached(reply, &a, flags, served, true)
                .map(Step::Done),
            CacheOpened::Uncached(attr) => {
                let (fh, fl) = self.open_handle(&attr, flags, true, sid);
                Ok(Step::Done((fh, fl, None)))
            }
            CacheOpened::Held(l) => Ok(Step::Wait(l)),
            CacheOpened::Busy => Ok(Step::Busy),
        }
    }

    /// Queues a restore of released file `ino` at top priority (the coordinator dedupes: every
    /// opener of the file, on any client, shares one restore) and waits for it, blocking (never
    /// on a FUSE request thread), polling the request: Ok once the file is no longer released;
    /// EIO when the restore failed or was canceled or is refused (lost copy, no copy; the reason
    /// stays in `tierfs hsm action`); an interrupted error as soon as `answered()` says an
    /// interrupt answered the request (EINTR). The restore goes on for the others then.
    fn wait_restored(&self, ino: Ino, answered: &dyn Fn() -> bool) -> Result<()> {
        let mut pause = RESTORE_POLL_MIN;
        let mut request: Option<u64> = None;
        loop {
            if answered() {
                return Err(interrupted());
            }
            let r = match request {
                None => match self.queue_restore(ino)? {
                    None => return Ok(()), // not released (any more)
                    Some(r) => r,
                },
                Some(id) => match self.meta.hsm_get_request(id) {
                    Ok(r) => r,
                    // purged already: ask again (None when it is restored)
                    Err(MetaError::Hsm(HsmError::UnknownRequest(_))) => {
                        request = None;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            request = Some(r.id);
            match r.state {
                RequestState::Waiting | RequestState::Started => {}
                // released again since, or done: ask again (None when not released)
                RequestState::Succeeded => {
                    request = None;
                    continue;
                }
                RequestState::Failed | RequestState::Canceled => return Err(restore_ended(&r)),
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(RESTORE_POLL_MAX);
        }
    }

    /// Queues a restore of `ino` at top priority, or joins the one queued (the coordinator
    /// dedupes): the request, or None when the file is not released (any more). EIO when the
    /// restore is refused (copy lost, no copy; `tierfs hsm action` says why).
    fn queue_restore(&self, ino: Ino) -> Result<Option<HsmRequest>> {
        match self.meta.hsm_request(ino, HsmAction::Restore, None) {
            Ok(r) => Ok(r),
            Err(MetaError::Hsm(e)) => Err(ClientError::Failed(
                format!("restore of inode {ino} refused: {e}"),
                libc::EIO,
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// A read-only open of released file `ino` (docs/hsm.md, "Transparent restore"): queues
    /// its restore at top priority (or joins the one queued) and opens a handle at once that
    /// follows it: reads inside the restored prefix are served as the prefix grows, reads past
    /// it wait ([`FsInner::restore_covers`]). None when the file is not released (any more):
    /// the caller opens it as any file. EIO when the restore is refused (copy lost, no copy).
    fn open_restoring(&self, ino: Ino, flags: i32) -> Result<Option<(u64, FopenFlags)>> {
        let Some(r) = self.queue_restore(ino)? else {
            return Ok(None);
        };
        let a = self.meta.getattr(ino)?;
        if !a.hsm.released() {
            return Ok(None);
        }
        let following = Restoring {
            request: AtomicU64::new(r.id),
            prefix: AtomicU64::new(0),
            size: a.size,
        };
        Ok(Some(self.open_following(
            &a,
            flags,
            false,
            Some(following),
        )?))
    }

    /// Whether a read of `size` bytes at `off` on handle `h` may be served now: always for a
    /// handle that follows no restore; else when the bytes are inside the restored prefix or
    /// past the end of the file, or the restore succeeded (the handle then reads as any
    /// other). The data path forgets the file's slice lists and cached chunks whenever the
    /// prefix grows (they were read while the bytes past the prefix were holes). EIO when the
    /// restore failed or was canceled (`tierfs hsm action` says why).
    fn restore_covers(&self, h: &Handle, ino: Ino, off: u64, size: u32) -> Result<bool> {
        let Some(rs) = &h.restoring else {
            return Ok(true);
        };
        let id = rs.request.load(Ordering::Acquire);
        if id == 0 || off >= rs.size {
            return Ok(true);
        }
        let end = rs.size.min(off + size as u64);
        if end <= rs.prefix.load(Ordering::Acquire) {
            return Ok(true);
        }
        let r = match self.meta.hsm_get_request(id) {
            Ok(r) => r,
            // purged already: the file's restore is over, or another one follows
            Err(MetaError::Hsm(HsmError::UnknownRequest(_))) => match self.queue_restore(ino)? {
                None => {
                    self.restore_over(rs, ino);
                    return Ok(true);
                }
                Some(r) => {
                    rs.request.store(r.id, Ordering::Release);
                    r
                }
            },
            Err(e) => return Err(e.into()),
        };
        match r.state {
            RequestState::Succeeded => {
                self.restore_over(rs, ino);
                Ok(true)
            }
            RequestState::Waiting | RequestState::Started => {
                if r.restored > rs.prefix.fetch_max(r.restored, Ordering::AcqRel) {
                    self.data.refresh_slices(ino);
                }
                Ok(end <= r.restored)
            }
            RequestState::Failed | RequestState::Canceled => Err(restore_ended(&r)),
        }
    }

    /// A read through the data path on handle `h` (sequential readers get read-ahead, except
    /// while the handle follows a restore: chunks past the restored prefix are holes yet and
    /// must not be fetched ahead or cached).
    fn read_following(&self, h: &Handle, ino: Ino, off: u64, size: u32) -> Result<Vec<u8>> {
        let prev = h.last_read_end.swap(off + size as u64, Ordering::Relaxed);
        let following = h
            .restoring
            .as_ref()
            .is_some_and(|r| r.request.load(Ordering::Acquire) != 0);
        let sequential = (prev == off || off == 0) && !following;
        self.with_queued_opens(ino, || self.data.read(ino, off, size, sequential))
    }

    /// `f` on file `ino`, which this client may have opened read-only without recording the
    /// open yet (DataPath::queue_open): when `f` finds the file gone (another client unlinked
    /// it after the open was answered, before its record landed), the queued opens are
    /// recorded now, which keeps the file for them (an open orphan, as if recorded at once),
    /// and `f` runs once more.
    fn with_queued_opens<T>(&self, ino: Ino, f: impl Fn() -> Result<T>) -> Result<T> {
        match f() {
            Err(ClientError::Meta(MetaError::NotFound)) if self.data.has_queued_open(ino) => {
                self.data.drain_closes()?;
                f()
            }
            r => r,
        }
    }

    /// The RO copy an uncached read-only handle reads from now, if any: one made since the
    /// handle was opened, holding the data version the handle's reads see (this client has
    /// no write of the file buffered, and the attributes it knows name that version: the one
    /// seen at open, as docs/semantics.md allows for a handle open while another client
    /// writes, or this client's own later commit). Looked for at most every [`LATE_RO_LOOK`];
    /// once taken, checked at each read (a write open on this client drops the copy, and its
    /// writes or commits change the version: the reads go to the data path again).
    fn late_ro_copy(&self, l: &LateRo, ino: Ino) -> Option<Arc<std::fs::File>> {
        let pcc = self.pcc.as_ref()?;
        if let Some(f) = l.file.get() {
            let version = self.data.settled_version(ino)?;
            return pcc.ro_copy_holds(ino, version).then(|| Arc::clone(f));
        }
        {
            let mut next = l.next_look.lock();
            let now = Instant::now();
            if now < *next {
                return None;
            }
            *next = now + LATE_RO_LOOK;
        }
        let version = self.data.settled_version(ino)?;
        let f = pcc.ro_copy_for_open_handle(ino, version)?;
        match l.file.set(Arc::clone(&f)) {
            Ok(()) => Some(f),
            // (another read of the handle took it first: this open of the copy is not needed)
            Err(_) => {
                let _ = pcc.on_close(ino, false);
                l.file.get().cloned()
            }
        }
    }

    /// The restore a handle followed succeeded: it reads as any other handle from now on.
    fn restore_over(&self, rs: &Restoring, ino: Ino) {
        rs.prefix.store(rs.size, Ordering::Release);
        if rs.request.swap(0, Ordering::AcqRel) != 0 {
            self.data.refresh_slices(ino);
        }
    }

    /// After another client's lease `l` stopped an open: waits (blocking; never on a FUSE
    /// request thread) until it is given back or, for a read-only open, until the owner wrote
    /// back a snapshot ([`Recaller::recall_for`]), then runs `step` (the open, given the
    /// snapshot's request number) again, as often as yet another client took the lease in
    /// between (at most [`MAX_RECALL_ROUNDS`] times).
    fn open_after_recall<T>(
        &self,
        mut l: Option<PccLease>,
        flags: i32,
        step: impl Fn(&FsInner, Option<u64>) -> Result<Step<T>>,
    ) -> Result<T> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        for _ in 0..MAX_RECALL_ROUNDS {
            // None: only this client's own transition of the file was waited for.
            let snapshot = match l.take() {
                None => None,
                Some(l) => match self.recaller.recall_for(&l, write)? {
                    Recalled::Gone => None,
                    Recalled::Snapshot(seq) => Some(seq),
                },
            };
            match step(self, snapshot)? {
                Step::Done(v) => return Ok(v),
                Step::Wait(next) => l = Some(next),
                Step::Busy => {}
            }
        }
        Err(ClientError::Errno(
            "the file's RW-PCC lease kept moving between other clients",
            libc::ETIMEDOUT,
        ))
    }

    /// Up to `len` bytes of a file at `off` for copy_file_range (fewer at its end).
    fn read_for_copy(&self, h: &Handle, ino: Ino, off: u64, len: u64) -> Result<Vec<u8>> {
        if h.restoring.is_some() {
            // A copy from a file being restored waits for its bytes on this thread (rare: the
            // kernel's copy_file_range has no way to be parked), then reads them uncached.
            let mut pause = RESTORE_POLL_MIN;
            while !self.restore_covers(h, ino, off, len as u32)? {
                std::thread::sleep(pause);
                pause = (pause * 2).min(RESTORE_POLL_MAX);
            }
            let following = h
                .restoring
                .as_ref()
                .is_some_and(|r| r.request.load(Ordering::Acquire) != 0);
            return self.data.read(ino, off, len as u32, !following);
        }
        if let Some(c) = &h.cache {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; len as usize];
            let mut n = 0;
            while n < buf.len() {
                match c.file.read_at(&mut buf[n..], off + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) => return Err(ClientError::Failed(e.to_string(), libc::EIO)),
                }
            }
            buf.truncate(n);
            return Ok(buf);
        }
        self.data.read(ino, off, len as u32, true)
    }

    /// Writes a piece of a copy_file_range, as a write(2) of the handle would.
    fn write_for_copy(&self, h: &Handle, ino: Ino, off: u64, data: &[u8]) -> Result<()> {
        if let Some(c) = &h.cache {
            use std::os::unix::fs::FileExt;
            return c.file.write_all_at(data, off).map_err(|e| {
                ClientError::Failed(e.to_string(), e.raw_os_error().unwrap_or(libc::EIO))
            });
        }
        self.data.write(ino, off, data)
    }

    /// `tierfs pcc ...` commands, which reach the daemon as extended attributes of the file
    /// (`user.tierfs.pcc.<command>`), so the kernel applies the file's permissions: getting one
    /// needs read access (state, attach.ro, detach, pin, unpin, detach.force-stale), setting one
    /// needs write access (attach with value rw or ro, detach with value keep). On top of that,
    /// attach, detach, pin and unpin by hand are admitted by `pcc_attach` (root only by
    /// default), and a non-root attach never evicts; `detach.force-stale` is root's only.
    /// `uid` is the caller's. Returns the file's state as JSON.
    fn pcc_command(&self, ino: Ino, cmd: &[u8], value: &[u8], uid: u32) -> Result<Vec<u8>> {
        if cmd == b"detach.force-stale" {
            // Also from a client without a cache: any client can drop a down owner's lease.
            self.force_stale_detach(ino, uid)?;
            if self.pcc.is_none() {
                return Ok(b"{}".to_vec());
            }
        }
        let Some(pcc) = &self.pcc else {
            return Err(ClientError::Errno(
                "this client has no persistent cache (mount with --cache-dir)",
                libc::EOPNOTSUPP,
            ));
        };
        if cmd == b"state" || cmd == b"detach.force-stale" {
            return self.pcc_state(pcc, ino);
        }
        let known = matches!(
            (cmd, value),
            (b"attach.ro", _)
                | (b"attach", b"ro")
                | (b"attach", b"rw")
                | (b"attach.rw", _)
                | (b"detach", _)
                | (b"detach.keep", _)
                | (b"pin", _)
                | (b"unpin", _)
        );
        if !known {
            return Err(ClientError::Meta(MetaError::NoAttr));
        }
        let a = self.meta.getattr(ino)?;
        if !self.pcc_attach.admits(uid, a.uid) {
            tracing::info!(
                ino,
                uid,
                "refused `tierfs pcc {}` by a user pcc_attach does not admit ({:?})",
                String::from_utf8_lossy(cmd),
                self.pcc_attach
            );
            return Err(ClientError::Errno(
                "pcc_attach does not let this user attach, detach or pin files by hand",
                libc::EPERM,
            ));
        }
        let attach = cmd.starts_with(b"attach");
        if attach && a.hsm.released() {
            // Its data is in the archive only: an open restores it into the capacity tier
            // (once, for every client), and the cache is filled from there (docs/hsm.md).
            return Err(MetaError::from(HsmError::Released).into());
        }
        if attach && uid != 0 && !pcc.fits_without_eviction(a.size) {
            // A user's attach by hand takes only free room: it never evicts other files.
            return Err(ClientError::Errno(
                "the cache has no free room for a file attached by a non-root user",
                libc::ENOSPC,
            ));
        }
        match (cmd, value) {
            (b"attach.ro", _) | (b"attach", b"ro") => {
                self.data.flush(ino)?;
                pcc.attach_ro(&a, None)?;
            }
            (b"attach", b"rw") | (b"attach.rw", _) => {
                pcc.attach_rw(&a, None)?;
            }
            (b"detach", b"keep") | (b"detach.keep", _) => pcc.detach(ino, true)?,
            (b"detach", _) => pcc.detach(ino, false)?,
            (b"pin", _) => pcc.pin(ino, true)?,
            (b"unpin", _) => pcc.pin(ino, false)?,
            _ => return Err(ClientError::Meta(MetaError::NoAttr)),
        }
        self.pcc_state(pcc, ino)
    }

    /// `tierfs pcc state`: this client's cache state of the file, the lease, and the state of
    /// the lease's owner by the database's view of its session ([`Recaller::owner_state`]).
    fn pcc_state(&self, pcc: &Pcc, ino: Ino) -> Result<Vec<u8>> {
        let mut v: serde_json::Value = serde_json::from_str(&pcc.state(ino)?)
            .map_err(|e| ClientError::Failed(e.to_string(), libc::EIO))?;
        let owner = v
            .get("lease_owner")
            .and_then(|o| o.as_str())
            .map(str::to_string);
        if let Some(owner) = owner {
            let st = if owner == self.recaller.client() {
                "alive".to_string()
            } else {
                self.recaller.owner_state(&owner)?.describe()
            };
            v["owner_state"] = serde_json::Value::String(st);
        }
        Ok(v.to_string().into_bytes())
    }

    /// `tierfs pcc detach --force-stale`: drops the RW-PCC lease of a DOWN owner even when it
    /// holds unsynced writes, which are lost (the owner quarantines its copy when it comes
    /// back). Root only; refused while the owner is alive (or silent, not yet down), and for a
    /// lease of this very client (an ordinary detach writes it back).
    fn force_stale_detach(&self, ino: Ino, uid: u32) -> Result<()> {
        if uid != 0 {
            return Err(ClientError::Errno(
                "only root may drop a down owner's lease",
                libc::EPERM,
            ));
        }
        let Some(l) = self.meta.pcc_lease(ino)? else {
            return Ok(());
        };
        if l.client == self.recaller.client() {
            return Err(ClientError::Errno(
                "this client holds the lease: detach it without --force-stale",
                libc::EBUSY,
            ));
        }
        let st = self.recaller.owner_state(&l.client)?;
        if !st.is_down() {
            tracing::warn!(
                ino,
                owner = %l.client,
                "refused to force-detach the RW-PCC lease of a client that is {}",
                st.describe()
            );
            return Err(ClientError::Errno(
                "the lease's owner is alive: it can give the file back",
                libc::EBUSY,
            ));
        }
        // Only the generation judged here: a lease taken again since is left alone.
        if !self.meta.pcc_release(ino, &l.client, l.generation)? {
            return Err(ClientError::Errno(
                "the file's RW-PCC lease changed meanwhile: look at its state again",
                libc::EAGAIN,
            ));
        }
        if l.dirty {
            tracing::error!(
                ino,
                owner = %l.client,
                generation = l.generation,
                "FORCED DETACH by root: the RW-PCC lease of client '{}' ({}) was dropped with \
                 data not yet written back; those writes are LOST, the file now reads as the \
                 capacity tier has it; the owner will quarantine its copy when it comes back",
                l.client,
                st.describe()
            );
        } else {
            tracing::warn!(
                ino,
                owner = %l.client,
                generation = l.generation,
                "forced detach by root of the clean RW-PCC lease of client '{}' ({})",
                l.client,
                st.describe()
            );
        }
        self.data.invalidate(ino, None);
        Ok(())
    }

    /// Lists directory `ino` from the kernel's cursor `offset` into a reply (READDIR and
    /// READDIRPLUS): `add` takes "." and ".." ([`Listed::Dot`]) and each entry of the pages
    /// `page(cursor)` reads (`cursor_of` an entry: where the next page starts), and returns
    /// true when the reply is full (that one not added). Offsets: 1 is ".", 2 is "..", then
    /// each entry's cursor + 2 (stable across changes).
    fn list_dir<T>(
        &self,
        ino: Ino,
        offset: u64,
        page: impl Fn(u64) -> tierfs_meta::Result<Vec<T>>,
        cursor_of: impl Fn(&T) -> u64,
        mut add: impl FnMut(Listed<'_, T>) -> bool,
    ) -> Result<()> {
        let mut off = offset;
        if off < 2 {
            // The directory's own attributes only for "." and ".."; past them the page's read
            // checks that the directory is still one (ENOENT when it is gone).
            let a = self.meta.getattr(ino)?;
            let dot = |add: &mut dyn FnMut(Listed<'_, T>) -> bool, ino, offset, name| {
                add(Listed::Dot {
                    dir: &a,
                    ino,
                    offset,
                    name,
                })
            };
            if off == 0 && dot(&mut add, ino, 1, ".") {
                return Ok(());
            }
            if dot(&mut add, a.parent.max(1), 2, "..") {
                return Ok(());
            }
            off = 2;
        }
        let mut cursor = off - 2;
        loop {
            let page = page(cursor)?;
            let last = page.len() < LIST_PAGE;
            for e in page {
                cursor = cursor_of(&e);
                if add(Listed::Entry(e)) {
                    return Ok(());
                }
            }
            // A short page is the directory's end: no read of an empty page after it.
            if last {
                return Ok(());
            }
        }
    }

    fn remember_name(&self, a: &Attr, name: &OsStr) {
        if self.pcc.is_some() && a.kind == Kind::File {
            let mut g = self.names.lock();
            if g.len() > 100_000 {
                g.clear();
            }
            g.insert(a.ino, name.as_bytes().to_vec());
        }
    }

    /// Opens a handle served from the cache: through kernel passthrough when it was negotiated
    /// and the kernel takes the backing file, else by the daemon from the cache file.
    ///
    /// A writer of a setuid or setgid file is served by the daemon (direct I/O): a write
    /// through passthrough never reaches it, so it could not drop those bits as Linux does.
    fn open_cached(
        &self,
        reply: &dyn BackingReply,
        attr: &Attr,
        flags: i32,
        served: Served,
        recorded: bool,
    ) -> Result<(u64, FopenFlags, Option<Arc<BackingId>>)> {
        self.open_cached_at(reply, attr.ino, Some(attr.perm), flags, served, recorded)
    }

    /// [`FsInner::open_cached`] of inode `ino` whose mode is `perm`; `perm` None: served on
    /// the file's kept open (no attributes read; a setuid or setgid file never has one).
    fn open_cached_at(
        &self,
        reply: &dyn BackingReply,
        ino: Ino,
        perm: Option<u32>,
        flags: i32,
        served: Served,
        recorded: bool,
    ) -> Result<(u64, FopenFlags, Option<Arc<BackingId>>)> {
        let kept = perm.is_none();
        let perm = perm.unwrap_or(0);
        let sid = self.session.id();
        if !recorded {
            self.session.watch(sid, self.meta.open_file(sid, ino))?;
        }
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let setid = perm & (libc::S_ISUID | libc::S_ISGID) != 0;
        let privileged = write && setid;
        let mut backing = None;
        let mut fl = FopenFlags::empty();
        if privileged {
            // direct I/O: no page cache, so it may sit beside passthrough handles of the file
            fl |= FopenFlags::FOPEN_DIRECT_IO;
        } else if self.passthrough.load(Ordering::Relaxed) {
            let mut g = self.backing.lock();
            if let Some((id, n)) = g.get_mut(&ino) {
                *n += 1;
                backing = Some(Arc::clone(id));
            } else {
                match reply.backing(&served.file) {
                    Ok(id) => {
                        let id = Arc::new(id);
                        g.insert(ino, (Arc::clone(&id), 1));
                        backing = Some(id);
                    }
                    Err(e) => tracing::debug!(ino, "passthrough refused: {e}"),
                }
            }
        }
        let fh = self.new_handle(Handle {
            append: false,
            last_read_end: AtomicU64::new(u64::MAX),
            stats: None,
            cache: Some(CachedHandle {
                file: served.file,
                write: write && served.rw,
                passthrough: backing.is_some(),
                kept,
                setid,
            }),
            caller: tierfs_meta::changelog::current(),
            session: sid,
            restoring: None,
            late_ro: None,
            writes: false,
        });
        Ok((fh, fl, backing))
    }

    /// Records a lock request that waits (request `unique`), or None when too many wait. One
    /// the kernel already asked to interrupt starts out interrupted.
    fn lock_wait(&self, unique: u64, ino: Ino, owner: u64) -> Option<Arc<LockWait>> {
        let mut g = self.lock_waits.lock();
        if g.by_unique.len() >= MAX_LOCK_WAITS {
            tracing::warn!("{MAX_LOCK_WAITS} lock requests already wait: ENOLCK");
            return None;
        }
        let w = Arc::new(LockWait {
            ino,
            owner,
            state: AtomicU8::new(WAITING),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        if let Some(i) = g.early.iter().position(|(u, _)| *u == unique) {
            g.early.remove(i);
            w.state.store(INTERRUPTED, Ordering::SeqCst);
        }
        g.by_unique.insert(unique, Arc::clone(&w));
        Some(w)
    }

    /// The kernel asks to interrupt request `unique`: a waiting lock request stops (and answers
    /// EINTR); an unknown one is remembered for a while, in case its lock request is still on
    /// its way to [`FsInner::lock_wait`].
    fn interrupt_request(&self, unique: u64) {
        let mut g = self.lock_waits.lock();
        if let Some(w) = g.by_unique.get(&unique) {
            w.stop(INTERRUPTED);
            return;
        }
        if let Some(f) = g.parked.get(&unique).cloned() {
            drop(g);
            f();
            return;
        }
        let now = Instant::now();
        while g
            .early
            .front()
            .is_some_and(|(_, t)| now.duration_since(*t) > EARLY_INTERRUPT_TTL)
            || g.early.len() >= EARLY_INTERRUPTS_MAX
        {
            g.early.pop_front();
        }
        g.early.push_back((unique, now));
    }

    /// `owner` closes `ino` (flush or release): its lock requests still waiting there stop, so
    /// none takes a lock after the close released the owner's locks.
    fn cancel_lock_waits(&self, ino: Ino, owner: u64) {
        for w in self.lock_waits.lock().by_unique.values() {
            if w.ino == ino && w.owner == owner {
                w.stop(CANCELLED);
            }
        }
    }

    /// Retries a blocked lock request until it gets the lock (Ok), its request is interrupted
    /// or its owner closes the file (EINTR), or the engine fails. A lock taken just as the
    /// owner closed the file is given back; one taken just as the request was interrupted is
    /// kept and answered Ok (the request has not been answered: the caller holds the lock and
    /// knows it, and drops it at its close).
    fn wait_for_lock(&self, w: &LockWait, want: &LockRange) -> std::result::Result<(), Errno> {
        let mut delay = Duration::from_millis(2);
        loop {
            if w.state.load(Ordering::SeqCst) != WAITING {
                return Err(Errno::EINTR);
            }
            match self.meta.set_lock(w.ino, want) {
                Ok(()) => {
                    return match w.state.compare_exchange(
                        WAITING,
                        GRANTED,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    ) {
                        Ok(_) | Err(INTERRUPTED) => Ok(()),
                        Err(_) => {
                            let undo = LockRange {
                                typ: LockType::Unlock,
                                ..want.clone()
                            };
                            if let Err(e) = self.meta.set_lock(w.ino, &undo) {
                                tracing::warn!(
                                    ino = w.ino,
                                    "giving back a lock taken after its owner closed the file: {e}"
                                );
                            }
                            Err(Errno::EINTR)
                        }
                    };
                }
                Err(MetaError::WouldBlock) => {
                    w.nap(delay);
                    delay = (delay * 2).min(Duration::from_millis(100));
                }
                Err(e) => return Err(Errno::from_i32(e.errno())),
            }
        }
    }

    fn lock_range(&self, owner: LockOwner, start: u64, end: u64, typ: i32, pid: u32) -> LockRange {
        LockRange {
            session: self.session.id(),
            owner: owner.0,
            // flock(2) and fcntl(2) locks share one space, as on NFS: FUSE gives no way to tell
            // them apart here.
            flock: false,
            typ: match typ {
                libc::F_RDLCK => LockType::Read,
                libc::F_WRLCK => LockType::Write,
                _ => LockType::Unlock,
            },
            start,
            end,
            pid,
        }
    }
}

/// The kernel flags and limits every mount of this client's FUSE code asks for: tierfs's
/// ([`TierFs`]'s `init`) and the memfs floor's ([`crate::memfs`]), so both are measured alike.
pub(crate) fn negotiate_common(
    config: &mut KernelConfig,
    readdirplus: ReaddirPlus,
    posix_acl: bool,
    fuse_uring: bool,
) {
    for flag in [
        InitFlags::FUSE_ASYNC_DIO,
        InitFlags::FUSE_PARALLEL_DIROPS,
        InitFlags::FUSE_CACHE_SYMLINKS,
        // We clear setuid/setgid ourselves (writes, truncates, chown): without this the
        // kernel asks for security.capability before every write, a round trip each.
        InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        // The mode of a create comes without the umask (and the umask beside it): the
        // umask does not apply under a directory with a default ACL.
        InitFlags::FUSE_DONT_MASK,
        // mmap(MAP_SHARED) of a direct-I/O handle (an O_APPEND one, a read-only one of a
        // file being restored) through the page cache, instead of ENODEV (Linux 6.6+).
        InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
    ] {
        if config.add_capabilities(flag).is_err() {
            tracing::info!("kernel lacks FUSE capability {flag:?}");
        }
    }
    // Listings with attributes (READDIRPLUS): `ls -l`, `du`, `find -type`, `rm -r` get
    // names and attributes in one round trip instead of a LOOKUP per entry.
    let plus = match readdirplus {
        ReaddirPlus::Always => InitFlags::FUSE_DO_READDIRPLUS,
        ReaddirPlus::Auto => InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
        ReaddirPlus::Off => InitFlags::empty(),
    };
    if config.add_capabilities(plus).is_err() {
        tracing::info!("kernel lacks FUSE capability {plus:?}");
    }
    // POSIX ACLs: the kernel reads them (system.posix_acl_*) and enforces access; we keep
    // them and the mode in step and inherit default ACLs at create. The cost: a non-owner's
    // permission check fetches the inode's ACL (a getxattr) when its attributes were
    // refreshed.
    if posix_acl && config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_err() {
        tracing::warn!("the kernel refused FUSE_POSIX_ACL: ACLs are stored but not enforced");
    }
    // FUSE over io_uring: the patched fuser serves requests through ring entries beside
    // /dev/fuse (which keeps INIT, FORGET, INTERRUPT and notifications).
    if fuse_uring {
        if config
            .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
            .is_err()
        {
            // `fuse_uring` is on by default, so this is the usual case on a kernel
            // whose module parameter is N: information, not a warning.
            tracing::info!(
                "fuse_uring: the kernel does not offer FUSE over io_uring (it needs \
                 CONFIG_FUSE_IO_URING and /sys/module/fuse/parameters/enable_uring = Y): \
                 requests go through /dev/fuse"
            );
        } else {
            tracing::info!("FUSE over io_uring on (fuse_uring = true)");
        }
    }
    let _ = config.set_max_write(1 << 20);
    let _ = config.set_max_readahead(1 << 20);
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
}

impl Filesystem for TierFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for flag in [InitFlags::FUSE_POSIX_LOCKS, InitFlags::FUSE_FLOCK_LOCKS] {
            if config.add_capabilities(flag).is_err() {
                tracing::info!("kernel lacks FUSE capability {flag:?}");
            }
        }
        negotiate_common(config, self.readdirplus, self.posix_acl, self.fuse_uring);
        // A chmod that waited for a commit of buffered writes (data/deferred.rs), applied to a
        // file another client gave an ACL meanwhile: the ACL follows the mode, as at any chmod.
        let fs = Arc::downgrade(&self.inner);
        self.data.set_chmod_hook(Box::new(move |ino, mode| {
            if let Some(fs) = fs.upgrade() {
                if let Err(e) = fs.chmod_acl(ino, mode) {
                    tracing::warn!(
                        ino,
                        "access ACL not brought in step with mode {mode:o}: {e}"
                    );
                }
            }
        }));
        // The kernel's writeback cache: writes gather in the page cache and come here in large
        // WRITEs (at close, fsync, writeback), through any writable handle of the file; the
        // kernel keeps size, mtime and ctime of the files it caches and sends them by SETATTR.
        // Never beside PCC (the daemon does not set it then): passthrough files bypass the
        // page cache the kernel would trust.
        if self.writeback_cache && self.pcc.is_none() {
            if config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_err()
            {
                tracing::warn!("the kernel refused FUSE_WRITEBACK_CACHE: writes are not cached");
            } else {
                tracing::info!("kernel writeback cache on (writeback_cache = true)");
            }
        }
        if self
            .pcc
            .as_ref()
            .map(|p| p.cfg.passthrough)
            .unwrap_or(false)
        {
            // Cached files are served by the kernel straight from the cache file.
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            self.passthrough.store(ok, Ordering::Relaxed);
            if !ok {
                tracing::warn!(
                    "the kernel refused FUSE passthrough: cached files are served by the daemon"
                );
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.data.flush_all();
    }

    /// A signal reached the process of request `unique` (the patched fuser, vendor/fuser):
    /// a lock wait it names stops and answers EINTR.
    fn interrupt(&self, _req: &Request, unique: RequestId) {
        self.interrupt_request(unique.0);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == tierfs_meta::ROOT_INO && (name == STATS_NAME || name == INFO_NAME) {
            let ino = if name == STATS_NAME {
                STATS_INO
            } else {
                INFO_INO
            };
            reply.entry(&Duration::ZERO, &self.stats_attr(ino), Generation(0));
            return;
        }
        match self.run("lookup", || {
            Ok(self.meta.lookup(parent.0, name.as_bytes())?)
        }) {
            Ok(a) => {
                self.remember_name(&a, name);
                reply.entry(&self.entry_ttl_now(), &self.fattr(&a), Generation(0))
            }
            Err(ClientError::Meta(MetaError::StaleDir)) => {
                // The directory itself is gone (removed, maybe re-created, on another client):
                // ESTALE makes the kernel walk the path again.
                reply.error(Errno::ESTALE)
            }
            Err(ClientError::Meta(MetaError::NotFound)) if !self.entry_ttl.is_zero() => {
                // A negative entry (inode 0): the kernel remembers the name is absent for the
                // entry TTL, as it remembers names that exist.
                let mut none = self.stats_attr(0);
                none.ino = INodeNo(0);
                reply.entry(&self.entry_ttl_now(), &none, Generation(0))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.data.forget(ino.0);
        self.xattr_hint.forget(ino.0);
        self.recaller.forget(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if is_virtual(ino.0) {
            reply.attr(&Duration::ZERO, &self.stats_attr(ino.0));
            return;
        }
        let r = self.run("getattr", || {
            self.with_queued_opens(ino.0, || Ok(self.meta.getattr(ino.0)?))
        });
        match r {
            Ok(a) => reply.attr(&self.attr_ttl_now(), &self.fattr(&a)),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let asker = Asker::of(req);
        let args = SetattrArgs {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
        };
        match self.run("setattr", || self.setattr_now(&asker, ino.0, &args)) {
            Ok(Step::Done(a)) => reply.attr(&self.attr_ttl_now(), &self.fattr(&a)),
            // (setattr_now never answers Busy)
            Ok(Step::Busy) => reply.error(Errno::EAGAIN),
            // Another client holds the file's RW-PCC lease: it is given back before the size
            // changes here, waiting on a thread of its own while this one serves others.
            // An interrupt (a signal to the caller) answers EINTR meanwhile.
            Ok(Step::Wait(l)) => {
                let Some(mut p) = self.park(req) else {
                    return reply.error(Errno::EAGAIN);
                };
                let Some(held) = p.hold(reply) else { return };
                p.spawn("setattr", move |fs| {
                    let r = fs.run("setattr_recalled", || {
                        fs.after_recall(l, |fs| {
                            let g = held.0.lock();
                            if g.is_none() {
                                return Err(interrupted());
                            }
                            Ok(match fs.setattr_now(&asker, ino.0, &args)? {
                                Step::Done(a) => Step::Done((a, g)),
                                Step::Wait(l) => Step::Wait(l),
                                Step::Busy => Step::Busy,
                            })
                        })
                    });
                    match r {
                        Ok((a, mut g)) => {
                            if let Some(reply) = g.take() {
                                reply.attr(&fs.attr_ttl_now(), &fs.fattr(&a));
                            }
                        }
                        Err(e) => {
                            if let Some(reply) = held.take() {
                                reply.error(ino_errno(&e));
                            }
                        }
                    }
                })
            }
            // A truncate of a released file: restored first (a restore at top priority,
            // shared with every other waiter), waiting on a thread of its own; EINTR on an
            // interrupt, EIO when the restore fails.
            Err(e) if is_released(&e) => {
                let Some(mut p) = self.park(req) else {
                    return reply.error(Errno::EAGAIN);
                };
                let Some(held) = p.hold(reply) else { return };
                p.spawn("setattr", move |fs| {
                    let r = fs.run("setattr_restored", || {
                        let answered = || held.0.try_lock().is_some_and(|g| g.is_none());
                        fs.wait_restored(ino.0, &answered)?;
                        let once = |fs: &FsInner| {
                            let g = held.0.lock();
                            if g.is_none() {
                                return Err(interrupted());
                            }
                            Ok(match fs.setattr_now(&asker, ino.0, &args)? {
                                Step::Done(a) => Step::Done((a, g)),
                                Step::Wait(l) => Step::Wait(l),
                                Step::Busy => Step::Busy,
                            })
                        };
                        match once(fs)? {
                            Step::Done(v) => Ok(v),
                            Step::Wait(l) => fs.after_recall(l, once),
                            Step::Busy => Err(ClientError::Errno(
                                "the file is busy in this client's cache",
                                libc::EAGAIN,
                            )),
                        }
                    });
                    match r {
                        Ok((a, mut g)) => {
                            if let Some(reply) = g.take() {
                                reply.attr(&fs.attr_ttl_now(), &fs.fattr(&a));
                            }
                        }
                        Err(e) => {
                            if let Some(reply) = held.take() {
                                reply.error(ino_errno(&e));
                            }
                        }
                    }
                })
            }
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.run("readlink", || Ok(self.meta.readlink(ino.0)?)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let r = self.run("mknod", || {
            let kind = Kind::from_mode(mode)
                .ok_or(ClientError::Errno("unknown file type", libc::EINVAL))?;
            let inh = self.inherit(parent.0, kind, mode, umask)?;
            let node = NewNode {
                rdev,
                ..Self::new_node(req, kind, inh.perm)
            };
            let a = self.make_node(parent.0, name, node, false)?;
            self.store_inherited(a.ino, &inh)?;
            Ok(a)
        });
        match r {
            Ok(a) => reply.entry(&self.entry_ttl_now(), &self.fattr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let r = self.run("mkdir", || {
            let inh = self.inherit(parent.0, Kind::Dir, mode, umask)?;
            let node = Self::new_node(req, Kind::Dir, inh.perm);
            let a = self.make_node(parent.0, name, node, false)?;
            self.store_inherited(a.ino, &inh)?;
            Ok(a)
        });
        match r {
            Ok(a) => reply.entry(&self.entry_ttl_now(), &self.fattr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        match self.run("unlink", || {
            let ino = self.meta.unlink(parent.0, name.as_bytes())?;
            if let Some(p) = &self.pcc {
                p.name_gone(ino);
            }
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        match self.run("rmdir", || {
            Ok(self.meta.rmdir(parent.0, name.as_bytes())?)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let r = self.run("symlink", || {
            let t = target.as_os_str().as_bytes();
            if t.len() >= libc::PATH_MAX as usize {
                return Err(ClientError::Errno(
                    "symlink target too long",
                    libc::ENAMETOOLONG,
                ));
            }
            let node = NewNode {
                symlink: Some(t.to_vec()),
                ..Self::new_node(req, Kind::Symlink, 0o777)
            };
            self.make_node(parent.0, link_name, node, false)
        });
        match r {
            Ok(a) => reply.entry(&self.entry_ttl_now(), &self.fattr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let r = self.run("rename", || {
            let replaced = self.meta.rename(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                flags.bits(),
            )?;
            // a file the rename replaced lost its name here
            if let (Some(p), Some(ino)) = (&self.pcc, replaced) {
                p.name_gone(ino);
            }
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        match self.run("link", || {
            Ok(self.meta.link(ino.0, newparent.0, newname.as_bytes())?)
        }) {
            Ok(a) => reply.entry(&self.entry_ttl_now(), &self.fattr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        if is_virtual(ino.0) {
            let mut text = self.metrics.render();
            // requests this daemon received through FUSE over io_uring (fuse_uring)
            text.push_str(&format!(
                "tierfs_fuse_uring_requests_total {}\n",
                fuser::uring_requests()
            ));
            if let Some(p) = &self.pcc {
                let (used, cap, files) = p.usage();
                text.push_str(&format!(
                    "tierfs_pcc_cache_used_bytes {used}\ntierfs_pcc_cache_capacity_bytes {cap}\ntierfs_pcc_cache_files {files}\n"
                ));
                let (index, dir) = p.store_syncs();
                text.push_str(&format!(
                    "tierfs_pcc_index_syncs_total {index}\ntierfs_pcc_data_dir_syncs_total {dir}\n"
                ));
                let (ready, taken) = p.store.spare_counts();
                text.push_str(&format!(
                    "tierfs_pcc_spares_ready {ready}\ntierfs_pcc_spares_taken_total {taken}\n"
                ));
                for (rule, used, files, quota) in p.rule_usage() {
                    text.push_str(&format!(
                        "tierfs_pcc_rule_used_bytes{{rule=\"{rule}\"}} {used}\ntierfs_pcc_rule_files{{rule=\"{rule}\"}} {files}\n"
                    ));
                    if let Some(q) = quota {
                        text.push_str(&format!(
                            "tierfs_pcc_rule_quota_bytes{{rule=\"{rule}\"}} {q}\n"
                        ));
                    }
                }
            }
            let text = text.into_bytes();
            let text = if ino.0 == INFO_INO {
                // with the current session (a fenced client registered a new one)
                match serde_json::from_str::<serde_json::Value>(&self.info_json) {
                    Ok(mut v) if v.get("session").is_some() => {
                        v["session"] = self.session.id().into();
                        // and the change follower's changelog reader now (null: not following)
                        v["follow_reader"] = self
                            .follow
                            .as_ref()
                            .and_then(|f| f.reader())
                            .map(|r| format!("cl{r}"))
                            .into();
                        v.to_string().into_bytes()
                    }
                    _ => self.info_json.clone().into_bytes(),
                }
            } else {
                text
            };
            let fh = self.new_handle(Handle {
                append: false,
                last_read_end: AtomicU64::new(0),
                stats: Some(text),
                cache: None,
                caller: Caller::default(),
                session: self.session.id(),
                restoring: None,
                late_ro: None,
                writes: false,
            });
            reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            return;
        }
        let waiting = match self.run("open", || {
            self.open_step(&reply, ino.0, flags.0, None, false)
        }) {
            Ok(Step::Done(o)) => return answer_open(reply, Ok(o)),
            Ok(Step::Wait(l)) => (Some(l), false),
            Ok(Step::Busy) => (None, false),
            // released: a read-only open (without a client cache) follows the restore and
            // reads its prefix as it grows; others wait for all of it, below
            Err(e) if is_released(&e) => {
                if flags.0 & libc::O_ACCMODE == libc::O_RDONLY && self.pcc.is_none() {
                    match self.run("open_restoring", || self.open_restoring(ino.0, flags.0)) {
                        Ok(Some((fh, fl))) => {
                            return reply.opened(FileHandle(fh), fl);
                        }
                        // restored meanwhile: opened as any file, below (nothing to wait for)
                        Ok(None) => {}
                        Err(e) => return reply.error(ino_errno(&e)),
                    }
                }
                (None, true)
            }
            Err(e) => return reply.error(ino_errno(&e)),
        };
        let (waiting, restore) = waiting;
        // Another client holds the file's RW-PCC lease (or this client's cache is writing the
        // file back or giving it back), or the file is released (its data in the archive
        // only: a restore is queued at top priority, shared with every other opener): the
        // open waits on a thread of its own, and this one goes on serving others. An interrupt
        // (a signal to the opener) answers EINTR meanwhile.
        {
            {
                let Some(mut p) = self.park(req) else {
                    return reply.error(Errno::EAGAIN);
                };
                let Some(held) = p.hold(reply) else { return };
                p.spawn("open", move |fs| {
                    let r = fs.run("open_recalled", || {
                        let (mut waiting, mut restore) = (waiting, restore);
                        for _ in 0..MAX_RECALL_ROUNDS {
                            if restore {
                                // answered by an interrupt (EINTR) already?
                                let answered = || held.0.try_lock().is_some_and(|g| g.is_none());
                                fs.wait_restored(ino.0, &answered)?;
                            }
                            let r =
                                fs.open_after_recall(waiting.take(), flags.0, |fs, snapshot| {
                                    let g = held.0.lock();
                                    let Some(reply) = g.as_ref() else {
                                        return Err(interrupted());
                                    };
                                    Ok(
                                        match fs.open_step(reply, ino.0, flags.0, snapshot, true)? {
                                            Step::Done(o) => Step::Done((o, g)),
                                            Step::Wait(l) => Step::Wait(l),
                                            Step::Busy => Step::Busy,
                                        },
                                    )
                                });
                            match r {
                                // released again meanwhile: restore again
                                Err(e) if is_released(&e) => restore = true,
                                other => return other,
                            }
                        }
                        Err(ClientError::Errno(
                            "the file was released again each time it was restored",
                            libc::ETIMEDOUT,
                        ))
                    });
                    match r {
                        Ok((o, mut g)) => {
                            if let Some(reply) = g.take() {
                                answer_open(reply, Ok(o));
                            }
                        }
                        Err(e) => {
                            if let Some(reply) = held.take() {
                                reply.error(ino_errno(&e));
                            }
                        }
                    }
                })
            }
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let r = self.run("create", || {
            let kind = Kind::from_mode(mode).unwrap_or(Kind::File);
            let inh = self.inherit(parent.0, kind, mode, umask)?;
            let node = Self::new_node(req, kind, inh.perm);
            // A writer's create under an RW rule: the create and the lease in one transaction.
            let rw = match (&self.pcc, kind) {
                (Some(pcc), Kind::File) => {
                    pcc.rw_at_create(name.as_bytes(), flags).map(|r| (pcc, r))
                }
                _ => None,
            };
            let (a, leased) = match &rw {
                Some((pcc, rw)) => self.make_file_leased(parent.0, name, node, pcc, rw)?,
                None => (self.make_node(parent.0, name, node, true)?, None),
            };
            self.store_inherited(a.ino, &inh)?;
            if let Some(pcc) = &self.pcc {
                self.remember_name(&a, name);
                let served = match (leased, rw.is_some()) {
                    (Some((rule, lease)), _) => pcc.on_create_leased(&a, rule, lease)?,
                    // the RW rules were checked in the create: none wanted the file
                    (None, true) => None,
                    (None, false) => pcc.on_create(&a, name.as_bytes(), flags)?,
                };
                if let Some(served) = served {
                    let (fh, fl, backing) = self.open_cached(&reply, &a, flags, served, true)?;
                    return Ok((a, fh, fl, backing));
                }
            }
            let (fh, fl) = self.open_file(&a, flags, true)?;
            Ok((a, fh, fl, None))
        });
        match r {
            Ok((a, fh, fl, Some(id))) => reply.created_passthrough(
                &self.entry_ttl_now(),
                &self.fattr(&a),
                Generation(0),
                FileHandle(fh),
                fl,
                &id,
            ),
            Ok((a, fh, fl, None)) => reply.created(
                &self.entry_ttl_now(),
                &self.fattr(&a),
                Generation(0),
                FileHandle(fh),
                fl,
            ),
            Err(ClientError::Meta(MetaError::Exists)) if flags & libc::O_EXCL == 0 => {
                // Another client created the name since this kernel last looked (its absence
                // may be cached): ESTALE makes the kernel look the name up again and open the
                // existing file, with the usual permission checks, as open(O_CREAT) should.
                reply.error(Errno::ESTALE)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(h) = self.handle(fh) else {
            reply.error(Errno::EBADF);
            return;
        };
        if let Some(text) = &h.stats {
            let s = (offset as usize).min(text.len());
            let e = (s + size as usize).min(text.len());
            reply.data(&text[s..e]);
            return;
        }
        if let Err(e) = self.session.check_handle(h.session) {
            reply.error(errno(&e));
            return;
        }
        let local = match (&h.cache, &h.late_ro) {
            (Some(c), _) => Some(Arc::clone(&c.file)),
            (None, Some(l)) => self.late_ro_copy(l, ino.0),
            (None, None) => None,
        };
        if let Some(file) = local {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; size as usize];
            let r = self.run("read", || {
                let mut done = 0;
                while done < buf.len() {
                    match file.read_at(&mut buf[done..], offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) => return Err(ClientError::Failed(e.to_string(), libc::EIO)),
                    }
                }
                Ok(done)
            });
            match r {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(&e)),
            }
            return;
        }
        if h.restoring.is_some() {
            // A file being restored: bytes inside the restored prefix now; others wait off
            // the FUSE thread for the prefix to cover them (interruptible: EINTR).
            match self.run("read", || self.restore_covers(&h, ino.0, offset, size)) {
                Ok(true) => {}
                Ok(false) => {
                    let Some(mut p) = self.park(req) else {
                        return reply.error(Errno::EAGAIN);
                    };
                    let Some(held) = p.hold(reply) else { return };
                    p.spawn("read", move |fs| {
                        let answered = || held.0.try_lock().is_some_and(|g| g.is_none());
                        let mut pause = RESTORE_POLL_MIN;
                        let r = fs.run("read_restoring", || loop {
                            if answered() {
                                return Err(interrupted());
                            }
                            if fs.restore_covers(&h, ino.0, offset, size)? {
                                return fs.read_following(&h, ino.0, offset, size);
                            }
                            std::thread::sleep(pause);
                            pause = (pause * 2).min(RESTORE_POLL_MAX);
                        });
                        if let Some(reply) = held.take() {
                            match r {
                                Ok(d) => reply.data(&d),
                                Err(e) => reply.error(errno(&e)),
                            }
                        }
                    });
                    return;
                }
                Err(e) => return reply.error(errno(&e)),
            }
        }
        let r = self.run("read", || self.read_following(&h, ino.0, offset, size));
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let Some(h) = self.handle(fh) else {
            reply.error(Errno::EBADF);
            return;
        };
        // O_SYNC / O_DSYNC (of the open, or RWF_DSYNC of this write: the kernel passes both in
        // the write's flags): the data is on stable storage before the reply. The kernel sends
        // an fsync after such a write only on its synchronous path; asynchronous direct I/O
        // (libaio, io_uring) gets none, so the daemon does it here.
        let dsync = flags.0 & libc::O_DSYNC != 0;
        let r = self.run("write", || {
            // a handle of a session that ended (this client was fenced): EIO
            self.session.check_handle(h.session)?;
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                // An unprivileged write (the kernel says so: FUSE_HANDLE_KILLPRIV_V2) drops
                // setuid, and setgid on group-executables.
                let a = self.meta.getattr(ino.0)?;
                let perm = kill_suid_sgid(a.perm, || in_group_or_root(req, a.gid));
                if perm != a.perm {
                    let set = SetAttr {
                        perm: Some(perm),
                        ..Default::default()
                    };
                    let a = self.meta.setattr(ino.0, &set)?;
                    self.data.attrs_set(&a);
                    // The kernel keeps the old mode cached for the attribute TTL (a write only
                    // makes it refetch size and times): make the writer's next stat ask us.
                    if let Some(n) = self.notifier.get() {
                        if let Err(e) = n.inval_inode(INodeNo(ino.0), -1, 0) {
                            tracing::debug!(ino = ino.0, "attribute invalidation: {e}");
                        }
                    }
                }
            }
            if let Some(c) = &h.cache {
                use std::os::unix::fs::FileExt;
                if !c.write {
                    return Err(ClientError::Errno("read-only cached copy", libc::EBADF));
                }
                let io = |e: std::io::Error| {
                    ClientError::Failed(e.to_string(), e.raw_os_error().unwrap_or(libc::EIO))
                };
                c.file.write_all_at(data, offset).map_err(io)?;
                if dsync {
                    // as the kernel does for the same write through passthrough
                    c.file.sync_data().map_err(io)?;
                }
                return Ok(());
            }
            // A write from the page cache (the writeback cache) comes through any writable
            // handle of the file, an O_APPEND one too: it goes where the kernel says.
            let off = if h.append && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
                // Append at the end the filesystem knows, including our buffered writes.
                self.data.flush(ino.0)?;
                let a = self.meta.getattr(ino.0)?;
                self.data.invalidate(ino.0, Some(&a));
                a.size
            } else {
                offset
            };
            self.data.write(ino.0, off, data)?;
            if dsync {
                self.data.fsync(ino.0)?;
            }
            Ok(())
        });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        if is_virtual(ino.0) {
            reply.ok();
            return;
        }
        let r = self.run("flush", || {
            if let (Some(pcc), Some(h)) = (&self.pcc, self.handle(fh)) {
                if h.cache.as_ref().map(|c| c.write).unwrap_or(false) {
                    // close(2) of a writer: other clients see the new size and mtime now.
                    match pcc.report_writer(ino.0) {
                        Ok(_)
                        | Err(ClientError::Meta(MetaError::NotFound | MetaError::WouldBlock)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            let mut res = self.data.flush(ino.0);
            if let (Err(ClientError::Meta(MetaError::SessionEnded(_))), Some(h)) =
                (&res, self.handle(fh))
            {
                if h.session != self.session.id() {
                    // close(2) of a handle of an ended session succeeds (as after a Lustre
                    // eviction): what it had buffered was refused and logged (FENCED).
                    res = Ok(None);
                }
            }
            // close(2) drops the POSIX locks this owner holds on the file, and ends its waits
            // for more.
            self.cancel_lock_waits(ino.0, lock_owner.0);
            if self.handle(fh).is_some() && self.locked.lock().contains(&ino.0) {
                self.meta
                    .release_locks(ino.0, self.session.id(), lock_owner.0, false)?;
            }
            res.map(|_| ())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let h = self.handles.lock().remove(&fh.0);
        if is_virtual(ino.0) || h.as_ref().map(|h| h.stats.is_some()).unwrap_or(false) {
            reply.ok();
            return;
        }
        // In the opener's context: release often comes without a process (pid 0).
        let caller = h
            .as_ref()
            .map(|h| h.caller.clone())
            .unwrap_or_else(tierfs_meta::changelog::current);
        let _caller = caller.clone().enter();
        let r = self.run("release", || {
            // Every step runs whatever the others gave, and the close is recorded in any case:
            // a lost close would leave the file open here for every client (its trash never
            // freed, its rename grace never over) until this client's session ends.
            let mut closed = Ok(());
            if let (Some(pcc), Some(c)) = (&self.pcc, h.as_ref().and_then(|h| h.cache.as_ref())) {
                if c.passthrough {
                    let mut g = self.backing.lock();
                    if let Some((_, n)) = g.get_mut(&ino.0) {
                        *n -= 1;
                        if *n == 0 {
                            g.remove(&ino.0);
                        }
                    }
                }
                closed = if c.kept {
                    pcc.close_kept(ino.0, c.write)
                } else {
                    pcc.on_close(ino.0, c.write)
                };
            }
            if let (Some(pcc), Some(_)) = (
                &self.pcc,
                h.as_ref()
                    .and_then(|h| h.late_ro.as_ref())
                    .and_then(|l| l.file.get()),
            ) {
                closed = closed.and(pcc.on_close(ino.0, false));
            }
            let flushed = self.data.flush(ino.0).map(|_| ());
            let mut unlocked = Ok(());
            if let Some(o) = lock_owner {
                self.cancel_lock_waits(ino.0, o.0);
                if self.locked.lock().contains(&ino.0) {
                    unlocked = self
                        .meta
                        .release_locks(ino.0, self.session.id(), o.0, false)
                        .map_err(ClientError::from);
                }
            }
            // Closes reach the metadata engine in batches (see DataPath::queue_close).
            // (under the session it was opened under: one that ended has no opens left)
            let opened_under = h.as_ref().map_or(self.session.id(), |h| h.session);
            let cached = h.as_ref().and_then(|h| h.cache.as_ref());
            // A handle served on the kept open has no record of its own; the record of one
            // served from this client's RW cache may stay as the file's kept open (docs/pcc.md).
            let recorded = !cached.is_some_and(|c| c.kept);
            let kept = match (&self.pcc, cached) {
                (Some(pcc), Some(c))
                    if recorded && !c.setid && opened_under == self.session.id() =>
                {
                    pcc.keep_open(
                        ino.0,
                        KeptBy {
                            session: opened_under,
                            caller: caller.clone(),
                        },
                    )
                }
                _ => false,
            };
            // (an open still queued and this close cancel out: neither reaches the engine)
            if recorded && !kept && !self.data.cancel_queued_open(ino.0, opened_under) {
                self.data.queue_close(ino.0, caller, opened_under);
            }
            if let Some(h) = h.as_ref().filter(|h| h.cache.is_none()) {
                // a handle of the data path (DataPath::open): the file's state may go
                self.data.release(ino.0, h.writes);
            }
            closed.and(flushed).and(unlocked)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let h = self.handle(fh);
        match self.run("fsync", || {
            if let Some(h) = &h {
                self.session.check_handle(h.session)?;
            }
            if let (Some(pcc), Some(c)) = (&self.pcc, h.as_ref().and_then(|h| h.cache.as_ref())) {
                return pcc.on_fsync(ino.0, &c.file);
            }
            self.data.fsync(ino.0)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.run("opendir", || {
            let a = self.meta.getattr(ino.0)?;
            if a.kind != Kind::Dir {
                return Err(ClientError::Meta(MetaError::NotDir));
            }
            Ok(a)
        }) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.run("readdir", || {
            self.list_dir(
                ino.0,
                offset,
                |cursor| self.meta.readdir(ino.0, cursor, LIST_PAGE),
                |e| e.offset,
                |item| match item {
                    Listed::Dot {
                        ino, offset, name, ..
                    } => reply.add(INodeNo(ino), offset, FileType::Directory, name),
                    Listed::Entry(e) => reply.add(
                        INodeNo(e.ino),
                        e.offset + 2,
                        file_type(e.kind),
                        OsStr::from_bytes(&e.name),
                    ),
                },
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    /// Names and attributes in one round trip (`ls -l`, `find`, `du`): each entry is a lookup
    /// the kernel will FORGET, with the TTLs a lookup gives ("." and ".." are not).
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.run("readdirplus", || {
            self.list_dir(
                ino.0,
                offset,
                |cursor| self.meta.readdir_plus(ino.0, cursor, LIST_PAGE),
                |(e, _)| e.offset,
                |item| match item {
                    Listed::Dot {
                        dir,
                        ino,
                        offset,
                        name,
                    } => {
                        // The kernel links neither (no lookup to FORGET): it takes their
                        // name, inode, type and offset, as READDIR gives them.
                        let mut attr = self.fattr(dir);
                        attr.ino = INodeNo(ino);
                        reply.add(
                            INodeNo(ino),
                            offset,
                            name,
                            &Duration::ZERO,
                            &attr,
                            Generation(0),
                        )
                    }
                    Listed::Entry((e, a)) => {
                        let name = OsStr::from_bytes(&e.name);
                        let full = reply.add(
                            INodeNo(a.ino),
                            e.offset + 2,
                            name,
                            &self.entry_ttl_now(),
                            &self.fattr(&a),
                            Generation(0),
                        );
                        if !full {
                            self.remember_name(&a, name);
                        }
                        full
                    }
                },
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are committed transactions already.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let r = self.run("statfs", || {
            // The inode count alone: `usage` also sums the inline bytes, a scan of every
            // small file's data (30-70 ms on 9,000 files, once per `find` and `du`).
            let inodes = self.meta.inodes_used()?;
            let fills = self.data.space.fills();
            let total: u64 = fills.iter().map(|f| f.capacity).sum();
            let used: u64 = fills.iter().map(|f| f.used).sum();
            Ok((inodes, total, used))
        });
        match r {
            Ok((inodes, total, used)) => {
                let bsize = 4096u64;
                let blocks = total / bsize;
                let free = total.saturating_sub(used) / bsize;
                let files = inodes + 1_000_000_000;
                reply.statfs(
                    blocks,
                    free,
                    free,
                    files,
                    files - inodes,
                    bsize as u32,
                    255,
                    bsize as u32,
                );
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        match self.run("setxattr", || {
            if let Some(cmd) = name.as_bytes().strip_prefix(PCC_XATTR) {
                // The kernel let this through only to a writer of the file.
                return self.pcc_command(ino.0, cmd, value, req.uid()).map(|_| ());
            }
            self.xattrs_on()?;
            let n = name.as_bytes();
            if n == acl::ACCESS || n == acl::DEFAULT {
                return self.set_acl(req, ino.0, n, value);
            }
            Ok(self.set_xattr(ino.0, n, value, flags)?)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if is_virtual(ino.0) {
            // The virtual files have no attributes; the kernel asks for their ACL before a
            // non-owner's read (FUSE_POSIX_ACL), which must find none, not a missing inode.
            reply.error(Errno::NO_XATTR);
            return;
        }
        match self.run("getxattr", || {
            if let Some(cmd) = name.as_bytes().strip_prefix(PCC_XATTR) {
                // The kernel let this through only to a reader of the file.
                return self.pcc_command(ino.0, cmd, b"", req.uid());
            }
            self.xattrs_on()?;
            if self.xattr_hint.none(ino.0) {
                self.metrics.xattr_answered_locally.inc();
                return Err(MetaError::NoAttr.into());
            }
            Ok(self.meta.getxattr(ino.0, name.as_bytes())?)
        }) {
            Ok(v) => {
                if size == 0 {
                    reply.size(v.len() as u32);
                } else if v.len() > size as usize {
                    reply.error(Errno::ERANGE);
                } else {
                    reply.data(&v);
                }
            }
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = if is_virtual(ino.0) {
            Ok(Vec::new())
        } else {
            self.run("listxattr", || {
                self.xattrs_on()?;
                if self.xattr_hint.none(ino.0) {
                    self.metrics.xattr_answered_locally.inc();
                    return Ok(Vec::new());
                }
                Ok(self.meta.listxattr(ino.0)?)
            })
        };
        match names {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32);
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE);
                } else {
                    reply.data(&buf);
                }
            }
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        match self.run("removexattr", || {
            self.xattrs_on()?;
            let n = name.as_bytes();
            if n == acl::ACCESS || n == acl::DEFAULT {
                // removing no ACL succeeds, as on ext4
                return self.remove_acl(ino.0, n);
            }
            Ok(self.meta.removexattr(ino.0, n)?)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks modes before asking.
        reply.ok();
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        if let Some(h) = self.handle(fh) {
            if let Err(e) = self.session.check_handle(h.session) {
                reply.error(errno(&e));
                return;
            }
        }
        let want = self.lock_range(lock_owner, start, end, typ, pid);
        match self.run("getlk", || Ok(self.meta.test_lock(ino.0, &want)?)) {
            Ok(Some(l)) => {
                let t = if l.typ == LockType::Write {
                    libc::F_WRLCK
                } else {
                    libc::F_RDLCK
                };
                reply.locked(l.start, l.end, t, l.pid)
            }
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(h) = self.handle(fh) {
            // a handle of a session that ended (this client was fenced): EIO
            if let Err(e) = self.session.check_handle(h.session) {
                reply.error(errno(&e));
                return;
            }
        }
        let want = self.lock_range(lock_owner, start, end, typ, pid);
        if want.typ != LockType::Unlock {
            self.locked.lock().insert(ino.0);
        }
        let first = self.run("setlk", || {
            Ok(self
                .session
                .watch(want.session, self.meta.set_lock(ino.0, &want))?)
        });
        match first {
            Ok(()) => reply.ok(),
            Err(ClientError::Meta(MetaError::WouldBlock)) if sleep => {
                // F_SETLKW, flock: wait on a thread of its own so FUSE workers stay free; a
                // signal to the caller (FUSE_INTERRUPT) or the owner's close ends the wait.
                let unique = req.unique().0;
                let Some(w) = self.lock_wait(unique, ino.0, lock_owner.0) else {
                    return reply.error(Errno::ENOLCK);
                };
                let fs = Arc::clone(&self.inner);
                let spawned = std::thread::Builder::new()
                    .name("tierfs-lock-wait".into())
                    .spawn(move || {
                        let r = fs.wait_for_lock(&w, &want);
                        fs.lock_waits.lock().by_unique.remove(&unique);
                        match r {
                            Ok(()) => reply.ok(),
                            Err(e) => reply.error(e),
                        }
                    });
                if let Err(e) = spawned {
                    // the reply went with the closure: dropped unanswered, it answers EIO
                    tracing::warn!("cannot start a thread for a lock wait: {e}");
                    self.lock_waits.lock().by_unique.remove(&unique);
                }
            }
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    /// copy_file_range(2): the daemon reads the source range through the data path (or the
    /// cache file of an RW-cached handle) and writes it to the destination as a write would,
    /// piece by piece; the bytes never pass through the application. Objects are not shared
    /// between files (no reflink): the copy is new objects. One call copies at most
    /// [`COPY_MAX`] bytes; callers loop over short copies, as for write(2).
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let r = self.run("copy_file_range", || {
            if !flags.is_empty() {
                return Err(ClientError::Errno("copy_file_range flags", libc::EINVAL));
            }
            let (Some(hin), Some(hout)) = (self.handle(fh_in), self.handle(fh_out)) else {
                return Err(ClientError::Errno("unknown file handle", libc::EBADF));
            };
            if is_virtual(ino_in.0)
                || is_virtual(ino_out.0)
                || hin.stats.is_some()
                || hout.stats.is_some()
            {
                return Err(ClientError::Errno("copy of a virtual file", libc::EINVAL));
            }
            if hout.append || hout.cache.as_ref().is_some_and(|c| !c.write) {
                return Err(ClientError::Errno(
                    "destination not writable here",
                    libc::EBADF,
                ));
            }
            let len = len.min(COPY_MAX);
            let (Some(end_in), Some(end_out)) =
                (offset_in.checked_add(len), offset_out.checked_add(len))
            else {
                return Err(ClientError::Errno("copy range overflows", libc::EOVERFLOW));
            };
            if end_in > i64::MAX as u64 {
                return Err(ClientError::Errno("copy range overflows", libc::EOVERFLOW));
            }
            if end_out > i64::MAX as u64 {
                return Err(ClientError::Errno(
                    "copy past the largest size",
                    libc::EFBIG,
                ));
            }
            if ino_in == ino_out && offset_in < end_out && offset_out < end_in {
                // As the kernel answers for overlapping ranges of one file.
                return Err(ClientError::Errno(
                    "overlapping copy in one file",
                    libc::EINVAL,
                ));
            }
            let mut done = 0u64;
            while done < len {
                let want = (len - done).min(COPY_PIECE);
                let piece = self.read_for_copy(&hin, ino_in.0, offset_in + done, want)?;
                if piece.is_empty() {
                    break;
                }
                self.write_for_copy(&hout, ino_out.0, offset_out + done, &piece)?;
                done += piece.len() as u64;
                if (piece.len() as u64) < want {
                    break; // end of the source
                }
            }
            Ok(done)
        });
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // changelog records of this request name its caller (crate::caller)
        let _caller = self.scope(req);
        let r = self.run("fallocate", || {
            if let Some(pcc) = &self.pcc {
                if pcc.local_attr(ino.0).is_some() {
                    // RW-cached here: the cache file holds the data and the size.
                    return pcc.fallocate_local(ino.0, mode, offset, length);
                }
            }
            let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
            let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
            let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
            let known =
                libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
            if mode & !known != 0 || (punch && !keep) || (punch && zero) {
                return Err(ClientError::Errno(
                    "unsupported fallocate mode",
                    libc::EOPNOTSUPP,
                ));
            }
            if offset
                .checked_add(length)
                .is_none_or(|e| e > i64::MAX as u64)
            {
                return Err(ClientError::Errno(
                    "fallocate past the largest size",
                    libc::EFBIG,
                ));
            }
            if !punch && !zero {
                let a = self.meta.getattr(ino.0)?;
                if let Some(l) = &a.layout {
                    let first = offset / l.stripe_size;
                    let last = (offset + length).div_ceil(l.stripe_size);
                    for c in first..last.min(first + l.targets.len() as u64) {
                        self.data.space.reserve(l.target_of_chunk(c), 0)?;
                    }
                }
            }
            self.data.flush(ino.0)?;
            // The engine zeroes for punch (size kept) and zero-range (size grows unless
            // KEEP_SIZE): both add zero slices, which hold no objects.
            let a = self
                .meta
                .fallocate(ino.0, offset, length, keep, punch || zero)?;
            self.data.changed(ino.0, &a);
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(ino_errno(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kill_suid_sgid;

    #[test]
    fn kill_suid_sgid_by_the_kernel_rules() {
        let never = || -> bool { panic!("group membership asked when it does not matter") };
        // setuid always goes; setgid with group-execute goes
        assert_eq!(kill_suid_sgid(0o6755, never), 0o755);
        assert_eq!(kill_suid_sgid(0o4644, never), 0o644);
        // setgid without group-execute: kept for a member (or root), dropped otherwise
        assert_eq!(kill_suid_sgid(0o2745, || true), 0o2745);
        assert_eq!(kill_suid_sgid(0o6745, || false), 0o745);
        assert_eq!(kill_suid_sgid(0o755, never), 0o755);
    }
}
