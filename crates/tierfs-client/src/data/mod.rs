//! The data path: reads assemble chunks from immutable slice objects (newest wins); writes are
//! buffered per file, uploaded as new objects in parallel, and committed as slices in one
//! metadata transaction at flush, fsync, close, or when the buffer fills.

pub mod cache;
pub(crate) mod deferred;
#[cfg(test)]
mod deferred_tests;
#[cfg(test)]
mod durability_tests;
#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod race_tests;
#[cfg(test)]
mod read_tests;
pub mod segments;
pub mod space;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::{Condvar, Mutex};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use tierfs_meta::changelog::Caller;
use tierfs_meta::{
    now_nanos, Attr, Ino, Layout, MetaEngine, MetaError, Nanos, SetAttr, Slice, SliceData,
};
use tierfs_store::{Allocator, StoreError, TargetSet};

use crate::error::{ClientError, Result};
use crate::metrics::Metrics;
use crate::session::Session;
use cache::ChunkCache;
use segments::{visible, Source};
use space::SpaceGuard;

/// A chunk with more slices than this is rewritten as one object (compaction).
const COMPACT_SLICES: usize = 16;

/// How long attribute changes kept for a file's commit (data/deferred.rs) wait at most: past
/// it the `commit-retry` worker (every second) commits them with whatever is buffered.
pub const DEFERRED_MAX_AGE: Duration = Duration::from_secs(1);
/// Chunks waiting for a compaction check, at most.
const COMPACT_QUEUE: usize = 65_536;
/// Files whose last seen data version is remembered after their state went, at most.
const SEEN_MAX: usize = 1 << 18;

/// Reads up to this size that are not sequential are served on the FUSE thread when the data
/// is on local targets.
const SMALL_READ: u64 = 256 << 10;

/// Tunables of the data path (from the client config).
#[derive(Clone, Debug)]
pub struct DataConfig {
    /// Commit buffered writes once this many bytes are pending.
    pub dirty_limit: usize,
    /// Chunks read ahead of a sequential reader.
    pub readahead_chunks: u64,
    /// Chunks kept in the read cache.
    pub cache_chunks: usize,
    /// Uploads running at once.
    pub upload_parallelism: usize,
    /// Bytes buffered (written, not yet committed) over all files, at most: past it a writer
    /// commits buffered files, largest first, or waits for commits under way.
    pub buffer_limit: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dirty_limit: 64 << 20,
            readahead_chunks: 4,
            cache_chunks: 128,
            upload_parallelism: 16,
            buffer_limit: 256 << 20,
        }
    }
}

/// A running upload of one object.
type Upload = JoinHandle<std::result::Result<(), StoreError>>;

/// An object being uploaded ([`DataPath::start_object`]).
pub struct StartedObject {
    obj: u64,
    upload: Upload,
}

/// A write not yet committed: bytes at `off` inside `chunk`.
struct Pending {
    chunk: u64,
    off: u64,
    data: Vec<u8>,
    /// Length of a sealed piece (its bytes went to the upload).
    sealed_len: u64,
    /// Set once the piece is sealed and its upload started.
    upload: Option<(u32, u64, Upload)>,
    /// A sealed piece's bytes (a reference, not a copy), kept until its slice is committed:
    /// a commit that fails puts the piece back, and a failed upload must be made again.
    sealed: Option<Bytes>,
}

#[derive(Default)]
struct FileInner {
    attr: Option<Attr>,
    /// (data version, size) of this client's last commit of buffered writes: an attribute read
    /// from the engine before that commit (older version) must not show the size from before
    /// it, once the buffered writes no longer count in `pending_end`.
    last_commit: Option<(u64, u64)>,
    /// The data version the kernel's page cache (and cached size) of this file reflects; an
    /// open whose attributes show another version drops them. Only [`FileInner::changed_to`]
    /// moves it past a version this client did not read itself.
    seen_version: Option<u64>,
    chunk_slices: HashMap<u64, Arc<Vec<Slice>>>,
    /// Bumped whenever `chunk_slices` or `attr` is forgotten or replaced (a commit, a
    /// fallocate, a truncate, an open, a remote change): a slice list or attribute read from the
    /// engine outside the lock is kept only if no bump happened since the read began. Without
    /// it a read racing a punch-hole (the kernel's readahead does) put the slice list from
    /// before the punch back after the punch forgot it, and later reads served the punched
    /// bytes (fsx, seeds 20298124 and 20278126).
    generation: u64,
    pending: Vec<Pending>,
    /// The session the pending writes were buffered under (0: none known): they are committed
    /// under it, and refused once it ended (see [`crate::session`]).
    pending_session: u64,
    pending_bytes: usize,
    pending_end: u64,
    /// An error of a background upload, reported at the next write, flush or fsync.
    deferred_error: Option<i32>,
    /// Attribute changes waiting for the commit of `pending`, or for the next flush (the
    /// close of a handle open for writing; see [`deferred`]): in its transaction, and shown by
    /// this client meanwhile.
    deferred: Option<deferred::Deferred>,
    /// Handles of this client open on the file through the data path.
    opens: u32,
    /// Those of them open for writing.
    writers: u32,
}

impl FileInner {
    /// This client changed the file, its change making data version `v` (a commit, a
    /// truncate, a fallocate: each adds one to the version). The kernel saw the change go
    /// through, so its cache reflects `v` if it reflected the version just before; if another
    /// client's change came in between (the commit's size then also holds that client's
    /// extension, which the kernel never learnt), the mark stays where it was, and the next
    /// open drops the kernel's pages and size. (Moving it on regardless kept, at the next
    /// open, a size from before another client's commit: reads past it ended early, and pages
    /// it had overwritten were served.)
    fn changed_to(&mut self, v: u64) {
        if self
            .seen_version
            .is_some_and(|s| s == v || s.checked_add(1) == Some(v))
        {
            self.seen_version = Some(v);
        }
    }

    /// Waiting changes `d` that did not land (their commit failed) wait again, older than
    /// whatever waited since.
    fn put_back(&mut self, d: deferred::Deferred) {
        d.put_back(&mut self.deferred);
    }

    /// Forgets the cached slice lists; answers read from the engine before this are not kept.
    fn forget_slices(&mut self) {
        self.chunk_slices.clear();
        self.generation += 1;
    }

    /// Forgets one chunk's cached slice list, as [`FileInner::forget_slices`] does all of them.
    fn forget_chunk(&mut self, chunk: u64) {
        self.chunk_slices.remove(&chunk);
        self.generation += 1;
    }
}

#[derive(Default)]
pub struct FileState {
    inner: Mutex<FileInner>,
    flush_lock: Mutex<()>,
}

pub struct DataPath {
    pub meta: Arc<dyn MetaEngine>,
    pub targets: Arc<TargetSet>,
    pub rt: tokio::runtime::Handle,
    pub metrics: Arc<Metrics>,
    pub space: SpaceGuard,
    allocator: Allocator,
    cfg: DataConfig,
    inline_threshold: u64,
    ids: Mutex<(u64, u64)>,
    cache: ChunkCache,
    uploads: Arc<Semaphore>,
    files: Mutex<HashMap<Ino, Arc<FileState>>>,
    /// Bytes written and not yet committed, over all files (uploads under way included).
    buffered: AtomicUsize,
    /// Signalled when a commit ends (writers waiting for `buffered` to fall below the limit).
    buffered_fell: (Mutex<()>, Condvar),
    /// The data version the page cache of a file reflects, for files whose state went at their
    /// last close (so a reopen of an unchanged file keeps the kernel's cache): 16 bytes a
    /// file, emptied past [`SEEN_MAX`] entries.
    seen: Mutex<HashMap<Ino, u64>>,
    /// Queued closes, each with the context of whoever opened the file (its CLOSE record's)
    /// and the session it was opened under.
    closes: Mutex<Vec<(Ino, Caller, u64)>>,
    /// Queued opens (read-only ones answered before they were recorded), as `closes`; sent
    /// with them, before them. Taken together with `closes` (this lock first).
    opens: Mutex<Vec<(Ino, Caller, u64)>>,
    /// Until when (ns) a queued open and its close may cancel out: set by the
    /// `close-recorder`, about a second ahead, while no changelog reader wants OPEN or
    /// CLOSE records ([`DataPath::allow_open_cancel`]).
    open_cancel_until: std::sync::atomic::AtomicI64,
    /// This client's session, once mounted: buffered writes are committed under it.
    session: OnceLock<Arc<Session>>,
    /// Chunks that got new slices: compaction looks at them in the background.
    compact_candidates: Mutex<std::collections::HashSet<(Ino, u64)>>,
    info_cache: Mutex<Option<(std::time::Instant, HashMap<Ino, tierfs_meta::StripeDefault>)>>,
    /// Run after a commit that applied a waiting chmod to a file that has extended attributes
    /// by then (another client gave it an ACL meanwhile): keeps the ACL in step with the mode.
    chmod_hook: OnceLock<ChmodHook>,
}

/// See [`DataPath::set_chmod_hook`].
pub type ChmodHook = Box<dyn Fn(Ino, u32) + Send + Sync>;

fn chunk_range(layout: &Layout, off: u64, end: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    // (chunk, start within chunk, end within chunk)
    let cs = layout.stripe_size;
    let mut pos = off;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let chunk = pos / cs;
        let s = pos % cs;
        let e = (cs).min(s + (end - pos));
        pos += e - s;
        Some((chunk, s, e))
    })
}

impl DataPath {
    pub fn new(
        meta: Arc<dyn MetaEngine>,
        targets: Arc<TargetSet>,
        rt: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
        inline_threshold: u64,
        cfg: DataConfig,
    ) -> DataPath {
        DataPath {
            space: SpaceGuard::new(Arc::clone(&meta), Arc::clone(&targets)),
            allocator: Allocator::default(),
            cache: ChunkCache::new(cfg.cache_chunks),
            uploads: Arc::new(Semaphore::new(cfg.upload_parallelism.max(1))),
            inline_threshold,
            ids: Mutex::new((0, 0)),
            files: Mutex::new(HashMap::new()),
            buffered: AtomicUsize::new(0),
            buffered_fell: (Mutex::new(()), Condvar::new()),
            seen: Mutex::new(HashMap::new()),
            closes: Mutex::new(Vec::new()),
            opens: Mutex::new(Vec::new()),
            open_cancel_until: std::sync::atomic::AtomicI64::new(0),
            session: OnceLock::new(),
            compact_candidates: Mutex::new(Default::default()),
            info_cache: Mutex::new(None),
            chmod_hook: OnceLock::new(),
            cfg,
            meta,
            targets,
            rt,
            metrics,
        }
    }

    /// Commits buffered writes under `session` from now on (set once, at mount).
    pub fn set_session(&self, session: Arc<Session>) {
        let _ = self.session.set(session);
    }

    /// What to run after a commit applied a waiting chmod to a file that has extended attributes
    /// (its mode; set once, by the filesystem, whose chmod keeps an access ACL in step).
    pub fn set_chmod_hook(&self, hook: ChmodHook) {
        let _ = self.chmod_hook.set(hook);
    }

    /// The current session id (0 before [`DataPath::set_session`]).
    fn session_id(&self) -> u64 {
        self.session.get().map_or(0, |s| s.id())
    }

    fn state(&self, ino: Ino) -> Arc<FileState> {
        let mut files = self.files.lock();
        let st = files.entry(ino).or_insert_with(|| {
            self.metrics.file_states.inc();
            Arc::default()
        });
        Arc::clone(st)
    }

    fn existing(&self, ino: Ino) -> Option<Arc<FileState>> {
        self.files.lock().get(&ino).cloned()
    }

    /// Drops the state of a file the kernel forgot, unless it still holds unflushed data or
    /// an error to report.
    pub fn forget(&self, ino: Ino) {
        self.drop_state(ino, false);
    }

    /// A handle opened by [`DataPath::open`] was released (after its flush): the file's state
    /// goes with its last handle unless it still holds unflushed data or an error to report.
    /// (The kernel forgets inodes only under memory pressure: an untar of a million files
    /// would otherwise keep a million states.)
    /// A handle of `ino` (open for writing: `writes`) was released.
    pub fn release(&self, ino: Ino, writes: bool) {
        if let Some(st) = self.existing(ino) {
            let last_with_changes = {
                let mut inner = st.inner.lock();
                if writes {
                    inner.writers = inner.writers.saturating_sub(1);
                }
                inner.opens <= 1 && inner.deferred.is_some()
            };
            if last_with_changes {
                // Changes made after the writer's close (its flush) and before its release
                // (the kernel sends it later) waited for it: they go now. If that fails, they
                // stay with the file's state for the background retry.
                if let Err(e) = self.flush(ino) {
                    tracing::warn!(ino, "attribute changes kept for a retry: {e}");
                }
            }
        }
        self.drop_state(ino, true);
    }

    /// Objects committed but not yet fsynced move to a small list that the session thread
    /// syncs (and that an fsync of the file, opened again, takes over).
    fn drop_state(&self, ino: Ino, release: bool) {
        let mut files = self.files.lock();
        let Some(st) = files.get(&ino).cloned() else {
            return;
        };
        if release {
            let mut inner = st.inner.lock();
            inner.opens = inner.opens.saturating_sub(1);
            if inner.opens > 0 {
                return;
            }
        }
        // a commit under way (another writer keeping within buffer_limit) still updates it:
        // the state then stays until the kernel forgets the file
        let Some(_order) = st.flush_lock.try_lock() else {
            return;
        };
        let inner = st.inner.lock();
        if (release && inner.opens > 0)
            || !inner.pending.is_empty()
            || inner.deferred.is_some()
            || inner.deferred_error.is_some()
        {
            return;
        }
        let seen = inner.seen_version;
        drop(inner);
        files.remove(&ino);
        self.metrics.file_states.dec();
        drop(files);
        if let Some(v) = seen {
            let mut g = self.seen.lock();
            if g.len() >= SEEN_MAX {
                g.clear();
            }
            g.insert(ino, v);
        }
    }

    /// Counts `n` more buffered bytes.
    fn buffer(&self, n: usize) {
        let now = self.buffered.fetch_add(n, Ordering::Relaxed) + n;
        self.metrics.buffered_bytes.set(now as i64);
    }

    /// `n` buffered bytes were committed (or dropped with a failed commit).
    fn unbuffer(&self, n: usize) {
        if n == 0 {
            return;
        }
        let now = self.buffered.fetch_sub(n, Ordering::Relaxed) - n;
        self.metrics.buffered_bytes.set(now as i64);
        let _g = self.buffered_fell.0.lock();
        self.buffered_fell.1.notify_all();
    }

    /// Keeps the bytes buffered over all files within the limit: commits the file with the
    /// most buffered bytes (the caller's or another's) until under it, and waits for commits
    /// under way when nothing is left to commit. A failed commit of another file is kept for
    /// that file's writer (its next write, flush or fsync), as a background upload's would be.
    fn keep_within_limit(&self, ino: Ino) -> Result<()> {
        while self.buffered.load(Ordering::Relaxed) > self.cfg.buffer_limit {
            let largest = {
                let files = self.files.lock();
                files
                    .iter()
                    .map(|(i, st)| (*i, st.inner.lock().pending_bytes))
                    .filter(|(_, n)| *n > 0)
                    .max_by_key(|(_, n)| *n)
                    .map(|(i, _)| i)
            };
            match largest {
                Some(i) if i == ino => {
                    self.flush(ino)?;
                }
                Some(i) => {
                    if let Err(e) = self.flush(i) {
                        // Its data stays buffered for its next commit; this writer cannot get
                        // under the limit now (the engine or a target does not answer).
                        tracing::warn!(ino = i, "commit to stay within buffer_limit_mb: {e}");
                        if let Some(st) = self.existing(i) {
                            st.inner.lock().deferred_error.get_or_insert(e.errno());
                        }
                        return Err(e);
                    }
                }
                None => {
                    // Only commits under way hold the bytes: wait for one to end.
                    let mut g = self.buffered_fell.0.lock();
                    if self.buffered.load(Ordering::Relaxed) > self.cfg.buffer_limit {
                        self.buffered_fell
                            .1
                            .wait_for(&mut g, Duration::from_millis(20));
                    }
                }
            }
        }
        Ok(())
    }

    fn next_object_id(&self) -> Result<u64> {
        let mut ids = self.ids.lock();
        if ids.0 >= ids.1 {
            let first = self.meta.alloc_object_ids(1024)?;
            *ids = (first, first + 1024);
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    /// Records a close; [`DataPath::drain_closes`] sends them to the metadata engine in one
    /// transaction (a create-write-close then costs two transactions instead of three).
    /// `caller`: who opened the file, whom its CLOSE changelog record names.
    /// `session`: the one the handle was opened under.
    pub fn queue_close(&self, ino: Ino, caller: Caller, session: u64) {
        self.closes.lock().push((ino, caller, session));
    }

    /// An open of `ino` while a close of it still waits in the queue: the two cancel out and
    /// neither reaches the metadata engine, which never stopped counting the file open here.
    /// (A file opened and closed in a loop then costs no metadata writes, and does not keep
    /// updating its inode row, which would make other clients' transactions on it conflict.)
    /// Returns whether a queued close was taken back.
    /// Only a close of the same `session` cancels out (one of an ended session has nothing
    /// left to count down, and the new open must be recorded).
    pub fn cancel_queued_close(&self, ino: Ino, session: u64) -> bool {
        // (not while a changelog reader wants OPEN or CLOSE records: each is recorded then)
        self.may_cancel() && take_queued(&self.closes, ino, session)
    }

    /// Whether a queued open and close may cancel out now ([`DataPath::allow_open_cancel`]).
    fn may_cancel(&self) -> bool {
        now_nanos() < self.open_cancel_until.load(Ordering::Relaxed)
    }

    /// A read-only open of `ino` answered before it is recorded: it reaches the metadata
    /// engine with the next batch of closes ([`DataPath::drain_closes`], within the
    /// `close-recorder`'s interval), or never if its close comes first
    /// ([`DataPath::cancel_queued_open`]). Until then the file counts as open nowhere; the
    /// purge's [`tierfs_meta::UNLINK_GRACE`] keeps a file unlinked meanwhile for the record.
    pub fn queue_open(&self, ino: Ino, caller: Caller, session: u64) {
        self.opens.lock().push((ino, caller, session));
        self.metrics.opens_queued.inc();
    }

    /// A close of `ino` while an open of it (by `session`) still waits in the queue: the two
    /// cancel out and neither reaches the metadata engine (`cp -a`'s and rsync's source
    /// files: no metadata write for their open and close). Returns whether one was taken
    /// back.
    pub fn cancel_queued_open(&self, ino: Ino, session: u64) -> bool {
        // (not while a changelog reader wants OPEN or CLOSE records, or nobody looked lately)
        self.may_cancel() && take_queued(&self.opens, ino, session)
    }

    /// Whether a queued open and its close may cancel out from now on, for about a second
    /// (`allowed`: no changelog reader wants OPEN or CLOSE records), or no longer.
    pub fn allow_open_cancel(&self, allowed: bool) {
        let until = if allowed {
            now_nanos().saturating_add(1_000_000_000)
        } else {
            0
        };
        self.open_cancel_until.store(until, Ordering::Relaxed);
    }

    /// Whether an open of `ino` waits in the queue.
    pub fn has_queued_open(&self, ino: Ino) -> bool {
        self.opens.lock().iter().any(|x| x.0 == ino)
    }

    /// Sends queued opens and closes to the metadata engine, one transaction per session they
    /// were opened under (the current one, but also one that ended: those opens went with
    /// it, and the closes are dropped), the opens first.
    pub fn drain_closes(&self) -> Result<usize> {
        let (opens, batch) = {
            let mut o = self.opens.lock();
            let mut c = self.closes.lock();
            (std::mem::take(&mut *o), std::mem::take(&mut *c))
        };
        if batch.is_empty() && opens.is_empty() {
            return Ok(0);
        }
        let mut sessions: Vec<u64> = batch.iter().chain(&opens).map(|x| x.2).collect();
        sessions.sort_unstable();
        sessions.dedup();
        let mut done = 0;
        let mut failed = None;
        for session in sessions {
            let of = |q: &[(Ino, Caller, u64)]| -> Vec<(Ino, Caller)> {
                q.iter()
                    .filter(|x| x.2 == session)
                    .map(|(i, c, _)| (*i, c.clone()))
                    .collect()
            };
            let (my_opens, mine) = (of(&opens), of(&batch));
            let open_inos: Vec<Ino> = my_opens.iter().map(|(i, _)| *i).collect();
            let inos: Vec<Ino> = mine.iter().map(|(i, _)| *i).collect();
            // Each OPEN and CLOSE record names its opener (tierfs_meta::changelog::for_ino).
            let r = {
                let callers = my_opens.iter().chain(&mine).cloned().collect();
                let _scope = tierfs_meta::changelog::enter_batch(callers);
                self.meta.record_opens_closes(session, &open_inos, &inos)
            };
            let r = match self.session.get() {
                Some(s) => s.watch(session, r),
                None => r,
            };
            match r {
                Ok(gone) => {
                    done += mine.len() + my_opens.len();
                    for ino in gone {
                        // Unlinked elsewhere and purged before the record landed (the engine
                        // was out of reach for longer than UNLINK_GRACE): what is known of it
                        // goes, so reads through the open fail (ENOENT) rather than find no
                        // slices.
                        tracing::warn!(ino, "a read-only open recorded too late: the file is gone");
                        self.learn(ino, None, false);
                    }
                }
                Err(MetaError::SessionEnded(_)) => {
                    tracing::debug!(session, "opens and closes under an ended session dropped");
                }
                Err(e) => {
                    // Keep them for the next round (opens before any close queued since).
                    let mut o = self.opens.lock();
                    let mut c = self.closes.lock();
                    o.extend(my_opens.into_iter().map(|(i, c)| (i, c, session)));
                    c.extend(mine.into_iter().map(|(i, c)| (i, c, session)));
                    failed = Some(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(done),
        }
    }

    /// A directory's stripe default for new files, cached for a second (setstripe on a
    /// directory reaches other clients within that, like other attributes).
    fn stripe_default(&self, dir: Ino) -> Result<tierfs_meta::StripeDefault> {
        let ttl = std::time::Duration::from_secs(1);
        {
            let mut g = self.info_cache.lock();
            match g.as_ref() {
                Some((t, _)) if t.elapsed() > ttl => *g = None,
                _ => {}
            }
            if let Some((_, m)) = g.as_ref() {
                if let Some(d) = m.get(&dir) {
                    return Ok(*d);
                }
            }
        }
        let def = self.meta.resolve_stripe_default(dir)?;
        let mut g = self.info_cache.lock();
        let entry = g.get_or_insert_with(|| (std::time::Instant::now(), HashMap::new()));
        entry.1.insert(dir, def);
        Ok(def)
    }

    /// Chooses the layout of a new file in `dir`.
    pub fn choose_layout(&self, dir: Ino) -> Result<Layout> {
        let def = self.stripe_default(dir)?;
        let fills = self.space.fills();
        let targets = self.allocator.choose(&fills, def.stripe_count);
        Ok(Layout {
            stripe_size: def.stripe_size,
            targets,
        })
    }

    /// Records the attributes seen at open of a handle (for writing: `writes`); returns whether
    /// the kernel may keep its page cache (the data did not change since this client last saw
    /// it).
    pub fn open(&self, attr: &Attr, writes: bool) -> bool {
        let st = self.state(attr.ino);
        let mut inner = st.inner.lock();
        inner.opens += 1;
        inner.writers += u32::from(writes);
        let seen = match inner.seen_version {
            Some(v) => Some(v),
            None => self.seen.lock().remove(&attr.ino),
        };
        let keep = seen == Some(attr.data_version);
        // Slice lists are read again after every open, even when the data did not change:
        // another client's compaction rewrites slices without a new data version, and once the
        // file was closed everywhere its garbage collection may have deleted the objects the
        // old lists point to (an open keeps them: trash waits for the file's open rows).
        inner.forget_slices();
        // An attribute read before a change this client already learnt of (its commit, or a
        // fallocate or truncate through another handle, while this open was under way) must
        // not replace the newer one: reads would then go by the old data version, whose
        // chunks may still be in the read cache.
        let attr = match &inner.attr {
            Some(known) if known.data_version > attr.data_version => known.clone(),
            _ => attr.clone(),
        };
        if inner.pending.is_empty() {
            inner.attr = Some(attr.clone());
        } else if let Some(a) = inner.attr.as_mut() {
            // Keep our larger size while our own writes are buffered.
            let size = a.size.max(attr.size);
            *a = attr.clone();
            a.size = size;
        }
        inner.seen_version = Some(attr.data_version);
        keep
    }

    /// A regular file `a` (read from the engine, or known) as a stat on this client shows it,
    /// from one look at its state here: `a` with the attribute changes waiting here (`None`:
    /// none wait); the size, which buffered writes extend, and so does this client's last
    /// commit when `a` was read before it; and the bytes allocated (st_blocks): the engine's
    /// count plus the writes still buffered here, at most that size.
    pub fn local_view(&self, a: &Attr) -> (Option<Attr>, u64, u64) {
        let Some(st) = self.existing(a.ino) else {
            return (None, a.size, a.allocated.min(a.size));
        };
        let inner = st.inner.lock();
        let shown = inner.deferred.as_ref().map(|d| d.apply(a));
        let mut size = a.size.max(inner.pending_end);
        if let Some((version, committed)) = inner.last_commit {
            if a.data_version < version {
                size = size.max(committed);
            }
        }
        let allocated = a
            .allocated
            .saturating_add(inner.pending_bytes as u64)
            .min(size);
        (shown, size, allocated)
    }

    /// A setattr of `ino` that may wait for the commit of the writes buffered here, or of a
    /// handle open for writing here (its close flushes: rsync's `fchmod` right after its
    /// create) ([`deferred::may_wait`], judged on the attributes this client shows): kept for
    /// that commit's transaction; the attributes to answer with (`None`: nothing buffered nor
    /// open for writing, the attributes unknown here, or a change that must go now).
    pub fn defer_setattr(&self, ino: Ino, set: &SetAttr) -> Option<Attr> {
        let st = self.existing(ino)?;
        let mut inner = st.inner.lock();
        if (inner.pending.is_empty() && inner.writers == 0) || inner.deferred_error.is_some() {
            return None;
        }
        let base = inner.attr.clone()?;
        let shown = inner.deferred.as_ref().map(|d| d.apply(&base));
        if !deferred::may_wait(shown.as_ref().unwrap_or(&base), set) {
            return None;
        }
        let now = now_nanos();
        let d = deferred::Deferred {
            set: deferred::kept(set, &base, now),
            at: now,
            since: now,
        };
        let d = deferred::Deferred::merge(inner.deferred.take(), d);
        let a = d.apply(&base);
        inner.deferred = Some(d);
        self.metrics.setattrs_deferred.inc();
        Some(a)
    }

    /// Whether attribute changes of `ino` wait for the commit of its buffered writes.
    pub fn has_deferred(&self, ino: Ino) -> bool {
        self.existing(ino)
            .is_some_and(|st| st.inner.lock().deferred.is_some())
    }

    /// Commits the buffered writes of `ino` when attribute changes wait for them: before a
    /// change that does not wait goes to the engine on its own (it is newer, and must not be
    /// overwritten by theirs afterwards).
    pub fn settle(&self, ino: Ino) -> Result<()> {
        if self.has_deferred(ino) {
            self.flush(ino)?;
        }
        Ok(())
    }

    /// `a` (read from the engine, or known) as this client shows it: with the attribute
    /// changes waiting for the commit of its buffered writes; `None` when none wait.
    pub fn shown(&self, a: &Attr) -> Option<Attr> {
        let st = self.existing(a.ino)?;
        let inner = st.inner.lock();
        inner.deferred.as_ref().map(|d| d.apply(a))
    }

    fn attr_of(&self, st: &FileState, ino: Ino) -> Result<Attr> {
        let generation = {
            let inner = st.inner.lock();
            if let Some(a) = inner.attr.clone() {
                return Ok(a);
            }
            inner.generation
        };
        let a = self.meta.getattr(ino)?;
        let mut inner = st.inner.lock();
        // Kept only if nothing newer was learnt meanwhile (see `FileInner::generation`).
        if inner.generation == generation && inner.attr.is_none() {
            inner.attr = Some(a.clone());
        }
        Ok(a)
    }

    /// The data version this client's kernel's cache (pages and size) of `ino` reflects, when
    /// the file has a state here (open, or recently).
    pub fn kernel_version(&self, ino: Ino) -> Option<u64> {
        self.existing(ino)?.inner.lock().seen_version
    }

    /// The data version reads of `ino` see now, when this client has no write of it buffered
    /// or being committed and knows its attributes (None otherwise: a read then goes through
    /// the data path, which commits first or reads the attributes again).
    pub fn settled_version(&self, ino: Ino) -> Option<u64> {
        let st = self.existing(ino)?;
        if st.flush_lock.is_locked() {
            return None;
        }
        let inner = st.inner.lock();
        if !inner.pending.is_empty() {
            return None;
        }
        inner.attr.as_ref().map(|a| a.data_version)
    }

    // ------------------------------------------------------------------ writes

    /// Buffers a write; full chunk pieces start uploading at once.
    pub fn write(&self, ino: Ino, off: u64, data: &[u8]) -> Result<()> {
        let st = self.state(ino);
        let attr = self.attr_of(&st, ino)?;
        let layout = attr
            .layout
            .clone()
            .ok_or(ClientError::Errno("file has no layout", libc::EINVAL))?;
        let end = off
            .checked_add(data.len() as u64)
            .ok_or(ClientError::Errno("offset overflow", libc::EFBIG))?;
        if end > i64::MAX as u64 {
            return Err(ClientError::Errno("file too large", libc::EFBIG));
        }
        // Space: refuse before buffering so the application gets ENOSPC at write time. The
        // reservation is released when the write is committed.
        let small = end <= self.inline_threshold;
        let mut reserved: Vec<(u32, u64)> = Vec::new();
        for (chunk, s, e) in chunk_range(&layout, off, end) {
            let t = layout.target_of_chunk(chunk);
            if let Err(err) = self.space.reserve(t, e - s) {
                for (t, n) in reserved {
                    self.space.release(t, n);
                }
                return Err(err);
            }
            reserved.push((t, e - s));
        }
        let over_limit;
        {
            let mut inner = st.inner.lock();
            if let Some(e) = inner.deferred_error.take() {
                for (t, n) in reserved {
                    self.space.release(t, n);
                }
                return Err(ClientError::Errno("earlier background upload failed", e));
            }
            if inner.pending.is_empty() {
                inner.pending_session = self.session_id();
            }
            let mut pos = 0usize;
            for (chunk, s, e) in chunk_range(&layout, off, end) {
                let n = (e - s) as usize;
                let piece = &data[pos..pos + n];
                pos += n;
                let appended = match inner.pending.last_mut() {
                    Some(p)
                        if p.chunk == chunk
                            && p.upload.is_none()
                            && p.off + p.data.len() as u64 == s =>
                    {
                        p.data.extend_from_slice(piece);
                        true
                    }
                    _ => false,
                };
                if !appended {
                    inner.pending.push(Pending {
                        chunk,
                        off: s,
                        data: piece.to_vec(),
                        sealed_len: 0,
                        upload: None,
                        sealed: None,
                    });
                }
                let full = {
                    let p = inner.pending.last().expect("just pushed");
                    p.off + p.data.len() as u64 == layout.stripe_size && !small
                };
                if full {
                    let target = layout.target_of_chunk(chunk);
                    let obj = self.next_object_id()?;
                    let p = inner.pending.last_mut().expect("just pushed");
                    let bytes = Bytes::from(std::mem::take(&mut p.data));
                    p.sealed_len = bytes.len() as u64;
                    p.sealed = Some(bytes.clone());
                    p.upload = Some((target, obj, self.spawn_upload(target, obj, bytes)));
                }
            }
            if let Some(d) = inner.deferred.as_mut() {
                d.written();
            }
            inner.pending_bytes += data.len();
            self.buffer(data.len());
            inner.pending_end = inner.pending_end.max(end);
            over_limit = inner.pending_bytes >= self.cfg.dirty_limit;
        }
        if over_limit {
            self.flush(ino)?;
        }
        self.keep_within_limit(ino)
    }

    /// Uploads one object and makes it durable (fsync of the file and its directory on a local
    /// target; a PUT to an object store is durable once acknowledged). Durability order: the
    /// metadata that refers to an object is committed only after its upload (and so its sync)
    /// succeeded, on every path (flush, fsync, close, compaction, RW-PCC write-back), so no
    /// committed slice can point to an object that a power loss takes away.
    fn spawn_upload(&self, target: u32, obj: u64, bytes: Bytes) -> Upload {
        let t = self.targets.get(target).cloned();
        let sem = Arc::clone(&self.uploads);
        let metrics = Arc::clone(&self.metrics);
        self.rt.spawn(async move {
            let t = t?;
            let _permit = sem
                .acquire_owned()
                .await
                .map_err(|e| StoreError::Io(e.to_string()))?;
            if let Some(d) = test_upload_stall() {
                tokio::time::sleep(d).await;
            }
            let n = bytes.len() as u64;
            t.put(obj, bytes).await?;
            t.sync(vec![obj]).await?;
            metrics.target_written(target, n);
            Ok(())
        })
    }

    /// Uploads each piece as a new object on its target, made durable before this returns
    /// (an HSM restore commits them afterwards with `hsm_restore_slices`); returns the new
    /// objects' ids, in order. Objects of a failed call that were uploaded are never referenced
    /// and go with the garbage collection of unreferenced objects.
    pub fn put_objects(&self, pieces: Vec<(u32, Bytes)>) -> Result<Vec<u64>> {
        let mut started = Vec::with_capacity(pieces.len());
        for (target, bytes) in pieces {
            started.push(self.start_object(target, bytes)?);
        }
        self.wait_objects(started)
    }

    /// Starts the upload of `bytes` as a new object on `target` (in the background, as
    /// [`DataPath::put_objects`] uploads): the caller goes on (an HSM restore reads the next
    /// chunk of the copy meanwhile) and waits for it with [`DataPath::wait_objects`].
    pub fn start_object(&self, target: u32, bytes: Bytes) -> Result<StartedObject> {
        let obj = self.next_object_id()?;
        Ok(StartedObject {
            obj,
            upload: self.spawn_upload(target, obj, bytes),
        })
    }

    /// Waits until every started object is durable: their ids, in order; the first error
    /// otherwise (objects uploaded all the same are never referenced: garbage collection).
    pub fn wait_objects(&self, started: Vec<StartedObject>) -> Result<Vec<u64>> {
        let ids = started.iter().map(|s| s.obj).collect();
        let waits = started.into_iter().map(|s| s.upload);
        for r in self.rt.block_on(futures::future::join_all(waits)) {
            r.map_err(|e| StoreError::Io(e.to_string()))??;
        }
        Ok(ids)
    }

    /// Commits every buffered write of `ino`; returns the new attributes if anything was written.
    pub fn flush(&self, ino: Ino) -> Result<Option<Attr>> {
        self.flush_with(ino, None, None)
    }

    /// [`DataPath::flush`], the commit setting mtime and ctime to `mtime` (when given) instead
    /// of now: the kernel's own times of the writes (the writeback cache sends them by SETATTR
    /// after the data), recorded by the commit itself rather than by a transaction after it.
    pub fn flush_stamped(&self, ino: Ino, mtime: Option<Nanos>) -> Result<Option<Attr>> {
        self.flush_with(ino, mtime, None)
    }

    /// [`DataPath::flush`], and when something was buffered, the setattr `then` in the same
    /// engine transaction (`FileData::commit_slices_then`); the attributes after both. `None`
    /// when nothing was buffered: `then` is not applied (the caller's setattr does it).
    pub fn flush_then(&self, ino: Ino, then: Option<&SetAttr>) -> Result<Option<Attr>> {
        self.flush_with(ino, None, then)
    }

    /// The commit of [`DataPath::flush`], stamped `mtime` (or now), with `then` in its
    /// transaction.
    fn flush_with(
        &self,
        ino: Ino,
        mtime: Option<Nanos>,
        then: Option<&SetAttr>,
    ) -> Result<Option<Attr>> {
        let Some(st) = self.existing(ino) else {
            return Ok(None);
        };
        let _order = st.flush_lock.lock();
        let (mut pending, end, taken, session, waiting) = {
            let mut inner = st.inner.lock();
            if let Some(e) = inner.deferred_error.take() {
                // (what is buffered now stays for the next commit)
                return Err(ClientError::Errno("earlier background upload failed", e));
            }
            let p = std::mem::take(&mut inner.pending);
            let taken = std::mem::take(&mut inner.pending_bytes);
            let waiting = inner.deferred.take();
            (p, inner.pending_end, taken, inner.pending_session, waiting)
        };
        // The attribute changes that waited for this commit go in its transaction, before the
        // caller's own (`then`, newer).
        let merged = match (&waiting, then) {
            (None, t) => t.cloned(),
            (Some(d), None) => Some(d.set.clone()),
            (Some(d), Some(t)) => Some(deferred::merged(&d.set, t)),
        };
        let then = merged.as_ref();
        // The bytes stop counting against buffer_limit once this commit is over, unless it
        // failed and they were put back for the next one.
        struct Unbuffer<'a>(&'a DataPath, usize);
        impl Drop for Unbuffer<'_> {
            fn drop(&mut self) {
                self.0.unbuffer(self.1);
            }
        }
        let mut unbuffer = Unbuffer(self, taken);
        if pending.is_empty() {
            return match (waiting, then) {
                (Some(d), Some(set)) => self.commit_waiting(&st, ino, d, set),
                _ => Ok(None),
            };
        }
        let attr = self.attr_of(&st, ino)?;
        let layout = attr
            .layout
            .clone()
            .ok_or(ClientError::Errno("no layout", libc::EINVAL))?;
        let inline = end.max(attr.size) <= self.inline_threshold;
        let mut slices = Vec::with_capacity(pending.len());
        let mut waits = Vec::new();
        let mut reserved: Vec<(u32, u64)> = Vec::new();
        let mut packs: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut packed: Vec<(usize, u32)> = Vec::new();
        // (index in `pending`, index in `waits`, target, object) of each sealed piece
        let mut sealed: Vec<(usize, usize, u32, u64)> = Vec::new();
        // (index in `pending`, index in `slices`) of each inline piece: its bytes move into
        // the slice, and come back from it if the commit fails
        let mut inlined: Vec<(usize, usize)> = Vec::new();
        for (i, p) in pending.iter_mut().enumerate() {
            match p.upload.take() {
                Some((target, obj, handle)) => {
                    let len = p.sealed_len;
                    reserved.push((target, len));
                    slices.push(Slice::whole_object(p.chunk, p.off, target, obj, len));
                    sealed.push((i, waits.len(), target, obj));
                    waits.push(handle);
                }
                None if inline && p.chunk == 0 => {
                    let len = p.data.len() as u64;
                    reserved.push((layout.target_of_chunk(0), len));
                    inlined.push((i, slices.len()));
                    slices.push(Slice {
                        seq: 0,
                        chunk: p.chunk,
                        off: p.off,
                        len,
                        data: SliceData::Inline(std::mem::take(&mut p.data)),
                    });
                }
                None => {
                    // Partial pieces of one target travel together in one object (a burst of
                    // small random writes becomes one upload, not thousands).
                    let target = layout.target_of_chunk(p.chunk);
                    let pack = packs.entry(target).or_default();
                    let obj_off = pack.len() as u64;
                    let len = p.data.len() as u64;
                    pack.extend_from_slice(&p.data);
                    reserved.push((target, len));
                    packed.push((slices.len(), target));
                    slices.push(Slice {
                        seq: 0,
                        chunk: p.chunk,
                        off: p.off,
                        len,
                        data: SliceData::Object {
                            target,
                            obj: 0,
                            obj_off,
                            obj_size: 0,
                        },
                    });
                }
            }
        }
        for (target, pack) in packs {
            let obj = self.next_object_id()?;
            let size = pack.len() as u64;
            for &(i, t) in &packed {
                if t == target {
                    if let SliceData::Object {
                        obj: o, obj_size, ..
                    } = &mut slices[i].data
                    {
                        *o = obj;
                        *obj_size = size;
                    }
                }
            }
            waits.push(self.spawn_upload(target, obj, Bytes::from(pack)));
        }
        let results = self.rt.block_on(futures::future::join_all(waits));
        let stamp = mtime.unwrap_or_else(now_nanos);
        let mut failure: Option<ClientError> = None;
        let mut uploaded = vec![false; results.len()];
        for (k, r) in results.into_iter().enumerate() {
            match r {
                Ok(Ok(())) => uploaded[k] = true,
                Ok(Err(e)) => failure = Some(e.into()),
                Err(e) => failure = Some(StoreError::Io(e.to_string()).into()),
            }
        }
        let result = match failure {
            Some(e) => Err(e),
            // Under the session the writes were buffered under: refused once it ended (this
            // client was fenced; its uploads may count as garbage already).
            None if session != 0 => {
                let r = match then {
                    Some(set) => {
                        self.meta
                            .commit_slices_then(Some(session), ino, &slices, end, stamp, set)
                    }
                    None => self
                        .meta
                        .commit_slices_for(session, ino, &slices, end, stamp),
                };
                match self.session.get() {
                    Some(s) => s.watch(session, r),
                    None => r,
                }
                .map_err(ClientError::from)
            }
            None => match then {
                Some(set) => self
                    .meta
                    .commit_slices_then(None, ino, &slices, end, stamp, set),
                None => self.meta.commit_slices(ino, &slices, end, stamp),
            }
            .map_err(ClientError::from),
        };
        if let Err(ClientError::Meta(MetaError::SessionEnded(_))) = &result {
            tracing::error!(
                ino,
                bytes = taken,
                "FENCED: writes buffered under ended session {session} are dropped (reported \
                 as EIO to the writer's next write, fsync or close)"
            );
        }
        let put_back = matches!(&result, Err(e) if !matches!(
            e,
            ClientError::Meta(MetaError::NotFound | MetaError::SessionEnded(_))
        ));
        if put_back {
            // Nothing of this commit may be lost: the pieces go back in front of what was
            // written meanwhile, for the next flush, fsync or close (or the background retry
            // of files nobody has open), and stay counted and reserved. A sealed piece whose
            // upload succeeded keeps its object; one whose upload failed is uploaded again.
            // If the commit did land and only its answer was lost, the next commit writes the
            // same bytes at the same places again.
            for &(i, j) in &inlined {
                if let SliceData::Inline(d) =
                    std::mem::replace(&mut slices[j].data, SliceData::Zero)
                {
                    pending[i].data = d;
                }
            }
            for &(i, k, target, obj) in &sealed {
                let p = &mut pending[i];
                if uploaded[k] {
                    p.upload = Some((target, obj, self.rt.spawn(async { Ok(()) })));
                } else {
                    p.data = p.sealed.take().map(|b| b.to_vec()).unwrap_or_default();
                    p.sealed_len = 0;
                }
            }
            unbuffer.1 = 0;
            let mut inner = st.inner.lock();
            let later = std::mem::take(&mut inner.pending);
            inner.pending = pending;
            inner.pending_session = session;
            inner.pending.extend(later);
            inner.pending_bytes += taken;
            inner.pending_end = inner.pending_end.max(end);
            if let Some(d) = waiting.clone() {
                inner.put_back(d);
            }
            self.metrics.commits_put_back.inc();
        } else if result.is_ok() {
            for (t, n) in reserved {
                self.space.committed(t, n);
            }
        } else {
            // Not committed (the file is gone, or this client was fenced): the engine's
            // figures are read again at the next check.
            for (t, n) in reserved {
                self.space.release(t, n);
            }
            self.space.invalidate();
        }
        let mut inner = st.inner.lock();
        if inner.pending.is_empty() {
            inner.pending_end = 0;
        }
        match result {
            Ok(a) => {
                {
                    let mut cand = self.compact_candidates.lock();
                    for sl in &slices {
                        if cand.len() < COMPACT_QUEUE {
                            cand.insert((ino, sl.chunk));
                        }
                    }
                }
                inner.forget_slices();
                inner.changed_to(a.data_version);
                inner.last_commit = Some((a.data_version, a.size));
                let size = a.size;
                let mut a2 = a.clone();
                a2.size = size.max(inner.pending_end);
                inner.attr = Some(a2);
                drop(inner);
                self.acl_follows(ino, waiting.as_ref(), &a);
                Ok(Some(a))
            }
            Err(ClientError::Meta(MetaError::NotFound)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// After the changes `waiting` landed, giving `a`: an ACL another client gave the file
    /// meanwhile follows their mode (unless the mode gave way to another client's, whose chmod
    /// made the ACL follow already).
    fn acl_follows(&self, ino: Ino, waiting: Option<&deferred::Deferred>, a: &Attr) {
        let applied = waiting
            .and_then(|d| d.set.perm)
            .filter(|p| p & 0o7777 == a.perm);
        if let (Some(p), true, Some(hook)) = (applied, a.has_xattrs(), self.chmod_hook.get()) {
            hook(ino, p);
        }
    }

    /// The changes `d` that waited for a handle's close with nothing written since (merged with
    /// the caller's newer ones: `set`), alone in one transaction; put back if it fails.
    fn commit_waiting(
        &self,
        st: &FileState,
        ino: Ino,
        d: deferred::Deferred,
        set: &SetAttr,
    ) -> Result<Option<Attr>> {
        match self.meta.setattr(ino, set) {
            Ok(a) => {
                self.attrs_set(&a);
                self.acl_follows(ino, Some(&d), &a);
                Ok(Some(a))
            }
            Err(MetaError::NotFound) => Ok(None),
            Err(e) => {
                st.inner.lock().put_back(d);
                Err(e.into())
            }
        }
    }

    /// fsync: commits buffered writes, then makes the metadata durable. The objects of every
    /// commit were made durable before it (see [`DataPath::spawn_upload`]), so the sync of the
    /// metadata, which also makes other files' earlier commits durable, never makes a slice
    /// durable whose object is not.
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        self.flush(ino)?;
        self.meta.sync()?;
        Ok(())
    }

    /// Replaces a file's data in the capacity tier by the bytes of `file` (RW-PCC write-back):
    /// uploads stripe-sized objects in parallel, then swaps all slices in one transaction.
    pub fn write_back(
        &self,
        ino: Ino,
        file: &std::fs::File,
        size: u64,
        mtime: i64,
    ) -> Result<Attr> {
        let attr = self.meta.getattr(ino)?;
        let layout = attr
            .layout
            .clone()
            .ok_or(ClientError::Errno("file has no layout", libc::EINVAL))?;
        let cs = layout.stripe_size;
        let mut slices = Vec::new();
        let mut chunk = 0u64;
        while chunk * cs < size {
            // A window of uploads at a time bounds the memory used.
            let mut waits = Vec::new();
            for _ in 0..self.cfg.upload_parallelism.max(1) {
                let off = chunk * cs;
                if off >= size {
                    break;
                }
                let len = cs.min(size - off) as usize;
                let bytes = crate::pcc::read_piece(file, off, len)
                    .map_err(|e| ClientError::Failed(format!("cache read: {e}"), libc::EIO))?;
                let n = bytes.len() as u64;
                if n > 0 {
                    let target = layout.target_of_chunk(chunk);
                    let obj = self.next_object_id()?;
                    slices.push(Slice::whole_object(chunk, 0, target, obj, n));
                    waits.push(self.spawn_upload(target, obj, bytes));
                }
                chunk += 1;
            }
            for r in self.rt.block_on(futures::future::join_all(waits)) {
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e.into()),
                    Err(e) => return Err(StoreError::Io(e.to_string()).into()),
                }
            }
        }
        let a = self.meta.rewrite_data(ino, &slices, size, mtime)?;
        self.space.invalidate();
        self.changed(ino, &a);
        Ok(a)
    }

    /// Forgets cached attributes and slices (after setstripe, a remote change, or attributes
    /// read again), keeping `attr` if given. The kernel's cache is not taken to reflect it: an
    /// open that finds another version than the kernel last saw drops the kernel's pages.
    pub fn invalidate(&self, ino: Ino, attr: Option<&Attr>) {
        self.learn(ino, attr, false);
    }

    /// [`DataPath::invalidate`] after this client's own change of the file's data (a
    /// truncate, a fallocate, a rewrite), `attr` being what the change made: the kernel's
    /// cache reflects it if nothing else changed the file since the kernel last saw it
    /// ([`FileInner::changed_to`]).
    pub fn changed(&self, ino: Ino, attr: &Attr) {
        self.learn(ino, Some(attr), true);
    }

    /// A setattr of this client without a size went to the engine now, giving `a`: the mode,
    /// owner, group, times and xattr count known here follow (a change that waits later is
    /// judged on them, and expects them in the engine: [`deferred::kept`]). The data, its
    /// size and version are as they were.
    pub fn attrs_set(&self, a: &Attr) {
        if let Some(st) = self.existing(a.ino) {
            if let Some(known) = st.inner.lock().attr.as_mut() {
                known.perm = a.perm;
                known.uid = a.uid;
                known.gid = a.gid;
                known.atime = a.atime;
                known.mtime = a.mtime;
                known.ctime = a.ctime;
                known.xattr_count = a.xattr_count;
            }
        }
    }

    fn learn(&self, ino: Ino, attr: Option<&Attr>, ours: bool) {
        if let Some(st) = self.existing(ino) {
            let mut inner = st.inner.lock();
            inner.forget_slices();
            if let (Some(a), true) = (attr, ours) {
                inner.changed_to(a.data_version);
            }
            inner.attr = attr.cloned();
            inner.last_commit = None;
        }
    }

    /// Forgets the file's slice lists and cached chunks, keeping its attributes: a file being
    /// restored got more slices (docs/hsm.md, "Transparent restore").
    pub fn refresh_slices(&self, ino: Ino) {
        if let Some(st) = self.existing(ino) {
            st.inner.lock().forget_slices();
        }
        self.cache.remove_file(ino);
    }

    // ------------------------------------------------------------------ reads

    fn slices(&self, st: &FileState, ino: Ino, chunk: u64) -> Result<Arc<Vec<Slice>>> {
        let generation = {
            let inner = st.inner.lock();
            if let Some(s) = inner.chunk_slices.get(&chunk) {
                return Ok(Arc::clone(s));
            }
            inner.generation
        };
        let s = Arc::new(self.meta.read_chunk(ino, chunk)?);
        let mut inner = st.inner.lock();
        // A list read before a commit, fallocate or truncate that forgot the lists would bring
        // back the slices from before it (see `FileInner::generation`): this read uses it, no
        // later one does.
        if inner.generation == generation {
            inner.chunk_slices.insert(chunk, Arc::clone(&s));
        }
        Ok(s)
    }

    /// Reads up to `size` bytes at `off`. Sequential readers get whole chunks through the read
    /// cache, with the next chunks fetched ahead in parallel.
    pub fn read(&self, ino: Ino, off: u64, size: u32, sequential: bool) -> Result<Vec<u8>> {
        match self.read_once(ino, off, size, sequential) {
            Err(ClientError::Store(StoreError::NotFound(obj))) => {
                // A slice list read before another client compacted the chunk: read the
                // lists again, once.
                tracing::debug!(ino, "object {obj} gone: reading the slice lists again");
                if let Some(st) = self.existing(ino) {
                    st.inner.lock().forget_slices();
                }
                self.cache.remove_file(ino);
                self.read_once(ino, off, size, sequential)
            }
            r => r,
        }
    }

    fn read_once(&self, ino: Ino, off: u64, size: u32, sequential: bool) -> Result<Vec<u8>> {
        let st = self.state(ino);
        // Buffered writes are committed first, and so is a commit another thread has under
        // way (its writes are no longer pending, but the size this read is cut at is only
        // known once it lands): the kernel sends reads in parallel (readahead), and a read
        // answered with the size from before the commit came back short, which the kernel
        // takes for the end of the file (it shrinks its size: short reads, SIGBUS in mmap).
        // `flush` takes pending writes under `flush_lock`, so checking in this order misses
        // no commit.
        if !st.inner.lock().pending.is_empty() || st.flush_lock.is_locked() {
            self.flush(ino)?;
        }
        let attr = self.attr_of(&st, ino)?;
        let fsize = attr.size;
        if off >= fsize {
            return Ok(Vec::new());
        }
        let end = fsize.min(off + size as u64);
        let Some(layout) = attr.layout.clone() else {
            return Ok(vec![0; (end - off) as usize]);
        };
        let cs = layout.stripe_size;
        let mut out = Vec::with_capacity((end - off) as usize);
        if sequential {
            let mut futs = Vec::new();
            for (chunk, s, e) in chunk_range(&layout, off, end) {
                futs.push((self.chunk_future(&st, ino, &attr, &layout, chunk)?, s, e));
            }
            let last_chunk = (end - 1) / cs;
            let chunks_total = fsize.div_ceil(cs);
            // Chunks read ahead go into the same cache as the ones this read waits for: past
            // its capacity they would push those out (or each other) and be read twice.
            let room = self.cache.capacity().saturating_sub(futs.len()) as u64;
            for ahead in 1..=self.cfg.readahead_chunks.min(room) {
                let c = last_chunk + ahead;
                if c >= chunks_total {
                    break;
                }
                let cell = self.chunk_future(&st, ino, &attr, &layout, c)?;
                self.rt.spawn(async move {
                    let _ = cell.get().await;
                });
            }
            for (cell, s, e) in futs {
                let data = self.rt.block_on(cell.get())?;
                let e = (e as usize).min(data.len());
                if (s as usize) < e {
                    out.extend_from_slice(&data[s as usize..e]);
                }
            }
        } else {
            let local = size as u64 <= SMALL_READ
                && self.read_small_local(&st, ino, &layout, off, end, &mut out)?;
            if !local {
                out.clear();
                let mut futs = Vec::new();
                for (chunk, s, e) in chunk_range(&layout, off, end) {
                    let slices = self.slices(&st, ino, chunk)?;
                    futs.push(materialize(
                        Arc::clone(&self.targets),
                        Arc::clone(&self.metrics),
                        slices,
                        s,
                        e,
                    ));
                }
                for r in self.rt.block_on(futures::future::join_all(futs)) {
                    out.extend_from_slice(&r?);
                }
            }
        }
        out.resize((end - off) as usize, 0);
        Ok(out)
    }

    /// A small random read served on the calling thread from local targets; false (and `out`
    /// unusable) when some piece is not on a local target.
    fn read_small_local(
        &self,
        st: &FileState,
        ino: Ino,
        layout: &Layout,
        off: u64,
        end: u64,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        for (chunk, s, e) in chunk_range(layout, off, end) {
            let slices = self.slices(st, ino, chunk)?;
            match materialize_local(&self.targets, &self.metrics, &slices, s, e) {
                Some(r) => out.extend_from_slice(&r?),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    fn chunk_future(
        &self,
        st: &FileState,
        ino: Ino,
        attr: &Attr,
        layout: &Layout,
        chunk: u64,
    ) -> Result<cache::Cell> {
        let cs = layout.stripe_size;
        let extent = cs.min(attr.size.saturating_sub(chunk * cs));
        let key = (ino, attr.data_version, chunk);
        if let Some(c) = self.cache.get(&key) {
            return Ok(c);
        }
        let slices = self.slices(st, ino, chunk)?;
        let targets = Arc::clone(&self.targets);
        let metrics = Arc::clone(&self.metrics);
        Ok(self.cache.insert(key, move || {
            Box::pin(async move { materialize(targets, metrics, slices, 0, extent).await })
        }))
    }

    // ------------------------------------------------------------------ garbage

    /// Compaction: rewrites chunks that gathered many slices (overwrites, small random writes)
    /// as one object each, so reads stay short and overwritten bytes are freed. The new slice
    /// replaces the old ones only if no commit happened in between; the data does not change,
    /// so neither does the file's data version. Returns how many chunks were compacted.
    pub fn compact(&self, budget: usize) -> Result<usize> {
        let batch: Vec<(Ino, u64)> = {
            let mut c = self.compact_candidates.lock();
            let take: Vec<(Ino, u64)> = c.iter().take(budget).copied().collect();
            for k in &take {
                c.remove(k);
            }
            take
        };
        let mut done = 0;
        for (ino, chunk) in batch {
            let slices = match self.meta.read_chunk(ino, chunk) {
                Ok(s) => s,
                Err(MetaError::NotFound) => continue,
                Err(e) => return Err(e.into()),
            };
            if slices.len() <= COMPACT_SLICES {
                continue;
            }
            let attr = match self.meta.getattr(ino) {
                Ok(a) => a,
                Err(MetaError::NotFound) => continue,
                Err(e) => return Err(e.into()),
            };
            let Some(layout) = attr.layout.clone() else {
                continue;
            };
            let cs = layout.stripe_size;
            let extent = cs.min(attr.size.saturating_sub(chunk * cs));
            let upto = slices.last().map(|s| s.seq).unwrap_or(0);
            let slices = Arc::new(slices);
            let bytes = self.rt.block_on(materialize(
                Arc::clone(&self.targets),
                Arc::clone(&self.metrics),
                Arc::clone(&slices),
                0,
                extent,
            ))?;
            let merged = if bytes.is_empty() {
                Vec::new()
            } else {
                let target = layout.target_of_chunk(chunk);
                let obj = self.next_object_id()?;
                let n = bytes.len() as u64;
                self.rt
                    .block_on(self.spawn_upload(target, obj, bytes))
                    .map_err(|e| StoreError::Io(e.to_string()))??;
                vec![Slice::whole_object(chunk, 0, target, obj, n)]
            };
            if self.meta.replace_chunk(ino, chunk, upto, &merged)? {
                done += 1;
                if let Some(st) = self.existing(ino) {
                    st.inner.lock().forget_chunk(chunk);
                }
            } else {
                // Someone committed meanwhile (the engine trashed our object): look again later.
                self.compact_candidates.lock().insert((ino, chunk));
            }
        }
        Ok(done)
    }

    /// Chunks waiting to be looked at by [`DataPath::compact`].
    pub fn compact_pending(&self) -> usize {
        self.compact_candidates.lock().len()
    }

    /// Deletes objects nobody references any more; returns how many went.
    pub fn collect_garbage(&self) -> Result<usize> {
        let items = self.meta.trash(512, tierfs_meta::OPEN_TRASH_GRACE)?;
        if items.is_empty() {
            return Ok(0);
        }
        let mut futs = Vec::new();
        for it in &items {
            let t = self.targets.get(it.target).cloned();
            let obj = it.obj;
            futs.push(async move {
                match t {
                    Ok(t) => t.delete(obj).await,
                    Err(e) => Err(e),
                }
            });
        }
        let results = self.rt.block_on(futures::future::join_all(futs));
        let done: Vec<u64> = items
            .iter()
            .zip(results)
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| i.id)
            .collect();
        self.meta.trash_done(&done)?;
        self.space.invalidate();
        Ok(done.len())
    }

    /// Commits the buffered writes of files nobody has open any more, kept after a failed
    /// commit at their last close (the engine or a target did not answer), and lets their
    /// states go. Called now and then by a background worker; returns how many committed.
    pub fn retry_unflushed(&self) -> usize {
        self.commit_kept(DEFERRED_MAX_AGE)
    }

    /// [`DataPath::retry_unflushed`], and the commit (with whatever is buffered) of attribute
    /// changes that waited longer than `max_age` for a file still open here (a writer that
    /// keeps its file open and writes nothing more must not hold a `chmod o+r` back from the
    /// other clients for longer than that).
    fn commit_kept(&self, max_age: Duration) -> usize {
        let old = now_nanos().saturating_sub(max_age.as_nanos() as i64);
        let waiting: Vec<(Ino, bool)> = self
            .files
            .lock()
            .iter()
            .filter_map(|(i, st)| {
                let inner = st.inner.lock();
                let closed =
                    inner.opens == 0 && (!inner.pending.is_empty() || inner.deferred.is_some());
                let aged = inner.deferred.as_ref().is_some_and(|d| d.since <= old);
                (closed || aged).then_some((*i, closed))
            })
            .collect();
        let mut done = 0;
        for (ino, closed) in waiting {
            match self.flush(ino) {
                Ok(_) => {
                    done += 1;
                    if closed {
                        self.drop_state(ino, false);
                    }
                }
                Err(e) => tracing::warn!(ino, "committing kept writes or attribute changes: {e}"),
            }
        }
        done
    }

    /// Flushes every file with buffered writes (unmount).
    pub fn flush_all(&self) {
        let inos: Vec<Ino> = self.files.lock().keys().copied().collect();
        for ino in inos {
            if let Err(e) = self.flush(ino) {
                tracing::error!(ino, "flush at unmount failed: {e}");
            }
        }
    }
}

/// Takes one queued open or close of `ino` under `session` out of `q`; whether there was one.
fn take_queued(q: &Mutex<Vec<(Ino, Caller, u64)>>, ino: Ino, session: u64) -> bool {
    let mut q = q.lock();
    match q.iter().position(|x| x.0 == ino && x.2 == session) {
        Some(i) => {
            q.swap_remove(i);
            true
        }
        None => false,
    }
}

/// Puts fetched object pieces, inline bytes and zeros together into `[start, end)` of a chunk.
fn assemble(
    segs: &[segments::Segment],
    slices: &[Slice],
    start: u64,
    end: u64,
    fetched: Vec<(usize, Bytes)>,
) -> Bytes {
    let mut buf = BytesMut::zeroed((end - start) as usize);
    for (i, b) in fetched {
        let seg = &segs[i];
        let at = (seg.off - start) as usize;
        let n = b.len().min(seg.len as usize);
        buf[at..at + n].copy_from_slice(&b[..n]);
    }
    for seg in segs {
        if let Source::Inline {
            slice_idx,
            data_off,
        } = seg.src
        {
            if let SliceData::Inline(d) = &slices[slice_idx].data {
                let at = (seg.off - start) as usize;
                let from = data_off as usize;
                let n = (seg.len as usize).min(d.len().saturating_sub(from));
                buf[at..at + n].copy_from_slice(&d[from..from + n]);
            }
        }
    }
    buf.freeze()
}

/// Reads `[start, end)` of a chunk on the calling thread, for small reads from local targets:
/// `pread` on cached descriptors, no hop to the I/O runtime. `None` when a piece lives on a
/// target that is not local.
fn materialize_local(
    targets: &TargetSet,
    metrics: &Metrics,
    slices: &[Slice],
    start: u64,
    end: u64,
) -> Option<Result<Bytes>> {
    if end <= start {
        return Some(Ok(Bytes::new()));
    }
    let segs = visible(slices, start, end);
    let mut fetched = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        if let Source::Object {
            target,
            obj,
            obj_off,
        } = seg.src
        {
            let t = match targets.get(target) {
                Ok(t) => t,
                Err(e) => return Some(Err(e.into())),
            };
            match t.read_local(obj, obj_off, obj_off + seg.len)? {
                Ok(b) => {
                    metrics.target_read(target, b.len() as u64);
                    fetched.push((i, b));
                }
                Err(e) => return Some(Err(e.into())),
            }
        }
    }
    if let [(0, _)] = fetched.as_slice() {
        if segs.len() == 1 {
            return fetched.pop().map(|(_, b)| Ok(b));
        }
    }
    Some(Ok(assemble(&segs, slices, start, end, fetched)))
}

/// Reads `[start, end)` of a chunk from its slices.
async fn materialize(
    targets: Arc<TargetSet>,
    metrics: Arc<Metrics>,
    slices: Arc<Vec<Slice>>,
    start: u64,
    end: u64,
) -> Result<Bytes> {
    if end <= start {
        return Ok(Bytes::new());
    }
    let segs = visible(&slices, start, end);
    if let [seg] = segs.as_slice() {
        if let Source::Object {
            target,
            obj,
            obj_off,
        } = seg.src
        {
            let t = targets.get(target)?;
            let b = t.get_range(obj, obj_off, obj_off + seg.len).await?;
            metrics.target_read(target, b.len() as u64);
            return Ok(b);
        }
    }
    let mut fetches = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        if let Source::Object {
            target,
            obj,
            obj_off,
        } = seg.src
        {
            let t = Arc::clone(targets.get(target)?);
            let len = seg.len;
            let metrics = Arc::clone(&metrics);
            fetches.push(async move {
                let b = t.get_range(obj, obj_off, obj_off + len).await?;
                metrics.target_read(target, b.len() as u64);
                Ok::<_, StoreError>((i, b))
            });
        }
    }
    let mut fetched = Vec::new();
    for r in futures::future::join_all(fetches).await {
        fetched.push(r?);
    }
    Ok(assemble(&segs, &slices, start, end, fetched))
}

/// Test hook, in debug builds only: `TIERFS_TEST_UPLOAD_STALL_MS=N` in the daemon's environment
/// makes every object upload take N ms longer, as a slow storage target would
/// (crates/tierfs-cli/tests/sessions.rs: a long write-back never gets its owner reaped).
fn test_upload_stall() -> Option<Duration> {
    #[cfg(debug_assertions)]
    {
        static STALL: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
        *STALL.get_or_init(|| {
            std::env::var("TIERFS_TEST_UPLOAD_STALL_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
        })
    }
    #[cfg(not(debug_assertions))]
    None
}
