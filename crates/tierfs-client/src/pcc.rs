//! The persistent client cache as this client runs it: deciding at open and create whether a
//! file is served from the local cache, attaching and detaching, RW-PCC leases and their
//! recall, background write-back, eviction, and recovery after a restart.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use tierfs_meta::{
    now_nanos, Attr, Channel, Ino, Kind, Listener, MetaEngine, MetaError, PccLease, PccOpen,
    PccRuleRow, SetAttr,
};
use tierfs_pcc::rules::{FileFacts, Rule};
use tierfs_pcc::store::{CacheStore, Entry, Eviction, Mode};

use crate::data::deferred::{self, Deferred};
use crate::data::DataPath;
use crate::error::{ClientError, Result};
use crate::lease::{Lease, Recaller};
use crate::metrics::Metrics;
use crate::pcc_state::{Event, FileState, KeptBy, Phase, Slot};
use crate::recall::{Pass, RecallWork};

/// How long an RW attach waits for another client's open of the file to go away (its close
/// may still be in that client's 50 ms batch) before giving up with EBUSY.
const IN_USE_WAIT: Duration = Duration::from_secs(2);

/// Read-only copies a validation pass (every 5 s) checks for deleted files, at most.
const VALIDATE_RO_PER_PASS: usize = 256;

/// PCC settings of one client.
#[derive(Clone, Debug)]
pub struct PccConfig {
    pub cache_dir: PathBuf,
    pub capacity: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub eviction: Eviction,
    pub writeback_delay: Duration,
    pub passthrough: bool,
    /// How long a kept open without users lasts (`pcc_open_cache_secs`; zero: no kept opens).
    pub open_cache: Duration,
}

/// Kept opens on this client at most (each is a row the engine keeps for this session).
const KEPT_MAX: usize = 8192;

/// How far ahead the `pcc` worker allows kept opens at each of its rounds: if it stops (or
/// its checks hang on the engine), opens stop being served on kept opens after this.
const KEPT_LEASE: Duration = Duration::from_secs(1);

/// Files first opened under an RO rule that wait for the `pcc-ro-copy` worker, at most; a
/// first open that finds the queue full is served uncached and not queued (its next open
/// queues it again).
pub const RO_COPY_QUEUE: usize = 1024;

/// The `pcc-ro-copy` worker copies only after applications opened no file here for this long:
/// it yields to their I/O (a run of first opens, such as mdtest's read phase, is not slowed by
/// copies of the files it reads once; they are made when it pauses).
const RO_COPY_QUIET: Duration = Duration::from_millis(20);

/// The files waiting to be copied into the cache by the `pcc-ro-copy` worker (`T`: what the
/// copy needs), each once, at most `cap`.
struct RoCopies<T> {
    queue: std::collections::VecDeque<(Ino, T)>,
    queued: std::collections::HashSet<Ino>,
    cap: usize,
}

/// What [`RoCopies::push`] did.
#[derive(Debug, PartialEq, Eq)]
enum Queued {
    Yes,
    Already,
    /// The queue is full: dropped (the caller never waits).
    Full,
}

impl<T> RoCopies<T> {
    fn new(cap: usize) -> Self {
        RoCopies {
            queue: Default::default(),
            queued: Default::default(),
            cap,
        }
    }

    fn push(&mut self, ino: Ino, item: T) -> Queued {
        if self.queued.contains(&ino) {
            return Queued::Already;
        }
        if self.queue.len() >= self.cap {
            return Queued::Full;
        }
        self.queued.insert(ino);
        self.queue.push_back((ino, item));
        Queued::Yes
    }

    fn pop(&mut self) -> Option<T> {
        let (ino, item) = self.queue.pop_front()?;
        self.queued.remove(&ino);
        Some(item)
    }
}

/// A stored rule and its parsed form.
type RuleEntry = (PccRuleRow, Rule);

/// The first rule of `rules` of `mode` that caches the file `a` named `name`.
fn first_match(rules: &[RuleEntry], mode: &str, a: &Attr, name: &[u8]) -> Option<u64> {
    let facts = FileFacts {
        uid: a.uid,
        gid: a.gid,
        projid: a.projid,
        name,
        size: a.size,
        mtime_ns: a.mtime,
        now_ns: now_nanos(),
    };
    rules
        .iter()
        .find(|(row, rule)| row.mode == mode && rule.matches(&facts))
        .map(|(row, _)| row.id)
}

/// The RW rules a file being created is checked against inside its create's transaction
/// ([`Pcc::rw_at_create`]), and the rule that wanted it.
pub struct RwAtCreate {
    rules: Vec<RuleEntry>,
    name: Vec<u8>,
    chosen: std::cell::Cell<Option<u64>>,
}

impl RwAtCreate {
    /// Whether an RW rule caches the new inode `a` (the engine asks, in the transaction; the
    /// last answer counts, as the last run of a transaction is the one committed).
    pub fn wants(&self, a: &Attr) -> bool {
        self.chosen
            .set(first_match(&self.rules, "rw", a, &self.name));
        self.chosen.get().is_some()
    }

    /// The rule that wanted the new inode, after the create.
    pub fn rule(&self) -> Option<u64> {
        self.chosen.get()
    }
}

/// How long the rules read from the metadata engine are used before they are read again.
const RULES_TTL: Duration = Duration::from_secs(2);

/// The rules as last read from the metadata engine.
#[derive(Default)]
struct RulesCache {
    /// When they were read (None: not yet).
    at: Option<Instant>,
    list: Vec<RuleEntry>,
    /// A thread is reading them again (without holding the lock).
    refreshing: bool,
}

pub struct Pcc {
    pub store: CacheStore,
    pub cfg: PccConfig,
    meta: Arc<dyn MetaEngine>,
    data: Arc<DataPath>,
    metrics: Arc<Metrics>,
    /// Recalls of other clients' leases (shared with the clients' uncached opens).
    recaller: Arc<Recaller>,
    pub client: String,
    /// The rules that apply to this client, as last read (see [`Pcc::rules`]).
    rules: Mutex<RulesCache>,
    /// Each file's state machine and the lock of its transitions (see [`crate::pcc_state`]).
    slots: Mutex<Slots>,
    /// The files with writers here (their slots' `writers` > 0), kept by [`Pcc::step`]: they
    /// grow through passthrough writes the daemon does not see, so the cache's use measures
    /// them again, and this set spares it a walk over every slot (once per create).
    writing: Mutex<HashSet<Ino>>,
    last_validate: Mutex<Option<Instant>>,
    /// The highest inode whose RO copy the last validation pass looked at.
    validate_cursor: Mutex<Ino>,
    /// First opens under an RO rule waiting to be copied off the request path.
    ro_copies: Mutex<RoCopies<(Attr, u64)>>,
    /// When an application last opened a file here (ns): RO copies wait for a pause.
    last_open: std::sync::atomic::AtomicI64,
    /// Until when (ns) opens may be served on kept opens: set by the `pcc` worker, about a
    /// second ahead, while no changelog reader wants OPEN or CLOSE records and the session's
    /// heartbeats succeed ([`Pcc::allow_kept_opens`]).
    kept_until: std::sync::atomic::AtomicI64,
    /// Kept opens now (their slots' `kept`), at most [`KEPT_MAX`].
    kept: std::sync::atomic::AtomicUsize,
}

/// Slots held at most before the first sweep of those nobody uses.
const SLOTS_SWEEP: usize = 4096;

/// Every file's slot (see [`Pcc::slot`]). Slots nobody holds and no handle counts go at a
/// sweep, which comes when the map has doubled since the last one (at least
/// [`SLOTS_SWEEP`]): a sweep walks every slot, so thousands that stay (kept opens, open
/// handles) cost each new slot a constant share of a walk, not a walk each.
#[derive(Default)]
struct Slots {
    map: HashMap<Ino, Arc<Slot>>,
    /// The size past which the next new slot sweeps first (0: [`SLOTS_SWEEP`]).
    sweep_at: usize,
}

impl Slots {
    fn sweep_if_due(&mut self) {
        if self.map.len() < self.sweep_at.max(SLOTS_SWEEP) {
            return;
        }
        // Their state is the store's again. (Not those with a kept open: its record must be
        // closed some day; nor those with attribute changes waiting for a report.)
        self.map.retain(|_, s| {
            let st = s.st.lock();
            Arc::strong_count(s) > 1 || st.opens > 0 || st.kept.is_some() || st.deferred.is_some()
        });
        self.sweep_at = 2 * self.map.len();
    }
}

/// What [`Pcc::open`] did.
pub enum Opened {
    /// Served from the cache; the open is recorded (by [`Pcc::open`]; the caller of
    /// [`Pcc::open_unrecorded`] queues its record).
    Served(Served),
    /// To be served from the capacity tier with these attributes; the open is recorded (as
    /// for `Served`).
    Uncached(Attr),
    /// Another client holds the lease: nothing was recorded; recall it and open again.
    Held(PccLease),
    /// This client's cache is changing the file's state (a write-back or give-back holds its
    /// lock) and the caller would not wait: nothing was recorded; open again, waiting.
    Busy,
}

/// A cached file to serve an open from.
pub struct Served {
    pub file: Arc<File>,
    pub rw: bool,
}

impl Pcc {
    pub fn new(
        cfg: PccConfig,
        fs_uuid: &str,
        meta: Arc<dyn MetaEngine>,
        data: Arc<DataPath>,
        metrics: Arc<Metrics>,
        recaller: Arc<Recaller>,
        client: String,
    ) -> Result<Pcc> {
        let store = CacheStore::open(&cfg.cache_dir, fs_uuid, cfg.capacity)
            .map_err(|e| ClientError::Failed(e.to_string(), e.errno()))?;
        Ok(Pcc {
            store,
            cfg,
            meta,
            data,
            metrics,
            recaller,
            client,
            rules: Mutex::new(RulesCache::default()),
            slots: Mutex::new(Slots::default()),
            writing: Mutex::new(HashSet::new()),
            last_validate: Mutex::new(None),
            validate_cursor: Mutex::new(0),
            ro_copies: Mutex::new(RoCopies::new(RO_COPY_QUEUE)),
            last_open: std::sync::atomic::AtomicI64::new(0),
            kept_until: std::sync::atomic::AtomicI64::new(0),
            kept: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The slot of a file: its state machine and the lock every transition of it holds.
    fn slot(&self, ino: Ino) -> Arc<Slot> {
        let mut g = self.slots.lock();
        if let Some(s) = g.map.get(&ino) {
            return Arc::clone(s);
        }
        g.sweep_if_due();
        let s = Arc::new(Slot::default());
        *s.st.lock() = FileState::from_store(self.store.get(ino).as_ref());
        g.map.insert(ino, Arc::clone(&s));
        s
    }

    /// The state of a file, if it has a slot (no slot: no handle, nothing under way).
    fn peek(&self, ino: Ino) -> Option<FileState> {
        self.slots.lock().map.get(&ino).map(|s| s.st.lock().clone())
    }

    /// With the slot's lock held: a settled phase follows the store (the persistent truth),
    /// keeping the counts.
    fn sync(&self, slot: &Slot, ino: Ino) {
        let mut st = slot.st.lock();
        if matches!(st.phase, Phase::Uncached | Phase::Ro | Phase::Rw { .. }) {
            let want = FileState::from_store(self.store.get(ino).as_ref()).phase;
            let same = matches!(
                (st.phase, want),
                (Phase::Uncached, Phase::Uncached)
                    | (Phase::Ro, Phase::Ro)
                    | (Phase::Rw { .. }, Phase::Rw { .. })
            );
            if !same {
                st.phase = want;
                st.verified = false;
                st.reported = None;
                self.close_kept_if_unleased(ino, &mut st);
            }
        }
    }

    /// Sends the close of the file's kept open (queued, as any close) if the lease it rode on
    /// is no longer this client's here and no handle uses it.
    fn close_kept_if_unleased(&self, ino: Ino, st: &mut FileState) {
        if let Some(by) = st.unkeep_if_unleased() {
            self.kept_closed(ino, by);
        }
    }

    /// A kept open was taken away: its record's close goes to the engine with the next batch.
    fn kept_closed(&self, ino: Ino, by: KeptBy) {
        self.forget_kept();
        self.data.queue_close(ino, by.caller, by.session);
    }

    fn forget_kept(&self) {
        self.kept.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// This client removed a name of file `ino` (an unlink, or a rename that replaced it; the
    /// engine tells which inode the name was): the file keeps no open from now on, and its
    /// kept open, if any, closes now (or at its last handle's close), so that the engine frees
    /// the file as it would have without kept opens. (A handle still open, whose RELEASE has
    /// not come yet, is then closed as usual: `echo x > f; rm f` frees `f` at once.)
    pub fn name_gone(&self, ino: Ino) {
        let Some(slot) = self.slots.lock().map.get(&ino).cloned() else {
            return;
        };
        let mut st = slot.st.lock();
        st.name_gone = true;
        if let Some(k) = st.kept.as_mut() {
            k.gone = true;
        }
        self.close_kept_if_unleased(ino, &mut st);
    }

    /// Moves a file's state machine (its slot's lock held); an illegal move is refused.
    fn step(&self, slot: &Slot, ino: Ino, ev: Event) -> Result<()> {
        let mut st = slot.st.lock();
        st.apply(ev).map_err(|e| {
            tracing::debug!(ino, "{e}");
            ClientError::Errno("the cached file is busy changing state", libc::EBUSY)
        })?;
        self.close_kept_if_unleased(ino, &mut st);
        // (the only events that change the writers; the slot's lock, then the set's)
        if matches!(
            ev,
            Event::Open { write: true }
                | Event::Close { write: true }
                | Event::OpenKept { write: true }
                | Event::CloseKept { write: true }
        ) {
            let mut w = self.writing.lock();
            if st.writers > 0 {
                w.insert(ino);
            } else {
                w.remove(&ino);
            }
        }
        Ok(())
    }

    fn cache_err(e: tierfs_pcc::store::CacheError) -> ClientError {
        ClientError::Failed(e.to_string(), e.errno())
    }

    // ------------------------------------------------------------------ rules

    /// The rules that apply to this client, read again from the metadata engine when older
    /// than [`RULES_TTL`]. The query runs without the lock: one caller reads them again while
    /// the others (opens) go on with the rules read last; until the first read succeeds, every
    /// caller reads them. A failed read keeps the old rules (and is tried again next time).
    fn rules(&self) -> Vec<RuleEntry> {
        {
            let mut g = self.rules.lock();
            let stale = g.at.map(|t| t.elapsed() > RULES_TTL).unwrap_or(true);
            if !stale || (g.refreshing && g.at.is_some()) {
                return g.list.clone();
            }
            g.refreshing = true;
        }
        let read = self.meta.pcc_rules().map(|rows| {
            rows.into_iter()
                .filter(|r| {
                    r.client
                        .as_deref()
                        .map(|c| c == self.client)
                        .unwrap_or(true)
                })
                .filter_map(|r| match Rule::parse(&r.rule) {
                    Ok(rule) => Some((r, rule)),
                    Err(e) => {
                        tracing::warn!(id = r.id, "stored PCC rule does not parse: {e}");
                        None
                    }
                })
                .collect::<Vec<_>>()
        });
        let mut g = self.rules.lock();
        g.refreshing = false;
        match read {
            Ok(list) => {
                g.list = list;
                g.at = Some(Instant::now());
            }
            Err(e) => tracing::debug!("reading the PCC rules failed, keeping the old ones: {e}"),
        }
        g.list.clone()
    }

    /// The first rule of `mode` (in id order) that matches a file.
    fn matching_rule(&self, mode: &str, a: &Attr, name: &[u8]) -> Option<u64> {
        first_match(&self.rules(), mode, a, name)
    }

    /// At the create of a file named `name` opened with `flags`: the RW rules the new file is
    /// checked against inside the create's own transaction ([`MetaEngine::pcc_create`]), or
    /// None when no lease can come of it (no RW rule here, or the open does not write: such a
    /// create attaches after it, in [`Pcc::on_create`]).
    pub fn rw_at_create(&self, name: &[u8], flags: i32) -> Option<RwAtCreate> {
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            return None;
        }
        let rules: Vec<RuleEntry> = self
            .rules()
            .into_iter()
            .filter(|(row, _)| row.mode == "rw")
            .collect();
        if rules.is_empty() {
            return None;
        }
        Some(RwAtCreate {
            rules,
            name: name.to_vec(),
            chosen: std::cell::Cell::new(None),
        })
    }

    // ------------------------------------------------------------------ bookkeeping

    pub fn busy(&self, ino: Ino) -> bool {
        self.peek(ino).map(|s| s.opens > 0).unwrap_or(false)
    }

    /// Measures again the files open for writing here (they grow through writes the daemon
    /// does not see), so that the cache's use counts them as they are now.
    fn measure_writing(&self) {
        let writing: Vec<Ino> = self.writing.lock().iter().copied().collect();
        for ino in writing {
            self.store.note_size(ino);
        }
    }

    /// Bytes the cache uses now.
    fn used(&self) -> u64 {
        self.measure_writing();
        self.store.used()
    }

    /// Whether a file of `size` bytes fits in the cache below its high watermark without
    /// evicting anything (a non-root user's attach by hand: `pcc_attach`).
    pub fn fits_without_eviction(&self, size: u64) -> bool {
        let high = (self.cfg.capacity as f64 * self.cfg.high_watermark) as u64;
        self.used().saturating_add(size) <= high
    }

    /// Bytes and files the files attached by `rule` use now.
    fn used_by_rule(&self, rule: u64) -> (u64, usize) {
        self.measure_writing();
        self.store.used_by_rule(rule)
    }

    fn writers(&self, ino: Ino) -> u32 {
        self.peek(ino).map(|s| s.writers).unwrap_or(0)
    }

    /// Whether `ino` is cached RW by this client: its size and mtime are the cache file's.
    pub fn local_attr(&self, ino: Ino) -> Option<(u64, i64)> {
        let e = self.store.get(ino)?;
        if e.mode != Mode::Rw {
            return None;
        }
        let m = match self.rw_file(ino, &e) {
            Some(f) => f.metadata().ok()?,
            None => std::fs::metadata(self.store.data_path(ino)).ok()?,
        };
        use std::os::unix::fs::MetadataExt;
        Some((m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))
    }

    /// `f`, the file's RW cache file opened under lease `generation`, served to a handle, and
    /// remembered as its descriptor (see [`Slot::file`]).
    fn served_rw(slot: &Slot, f: File, generation: u64) -> Served {
        let file = Arc::new(f);
        *slot.file.lock() = Some((Arc::downgrade(&file), generation));
        Served { file, rw: true }
    }

    /// A descriptor of `ino`'s RW cache file `e` that a handle holds now, served under `e`'s
    /// lease generation (see [`Slot::file`]).
    fn rw_file(&self, ino: Ino, e: &Entry) -> Option<Arc<File>> {
        let slot = self.slots.lock().map.get(&ino).cloned()?;
        let g = slot.file.lock();
        let (f, generation) = g.as_ref()?;
        if *generation != e.generation {
            return None;
        }
        f.upgrade()
    }

    // ------------------------------------------------------------------ attach / detach

    /// Makes room for `need` more bytes, evicting by policy; false when it cannot.
    fn make_room(&self, need: u64) -> bool {
        let cap = self.cfg.capacity;
        if need > cap {
            return false;
        }
        let limit = (cap as f64 * self.cfg.high_watermark) as u64;
        let used = self.used();
        if used + need <= limit {
            return true;
        }
        let target = (cap as f64 * self.cfg.low_watermark) as u64;
        let candidates = self
            .store
            .eviction_order(self.cfg.eviction, &|i| self.busy(i));
        self.evict_down(candidates, used, need, target) <= limit
    }

    /// A rule's quota, as last read from the metadata engine (None: no quota, or no such rule).
    fn quota_of(&self, rule: u64) -> Option<u64> {
        self.rules()
            .into_iter()
            .find(|(r, _)| r.id == rule)
            .and_then(|(r, _)| r.quota)
    }

    /// Makes room for `need` more bytes under the quota of the rule attaching a file (a rule
    /// without a quota, or an attach by hand, always has room): evicts that rule's files by
    /// policy down to the low watermark of the quota; false when they cannot fit.
    fn make_room_in_quota(&self, rule: Option<u64>, need: u64) -> bool {
        let Some((rule, quota)) = rule.and_then(|r| Some((r, self.quota_of(r)?))) else {
            return true;
        };
        if need > quota {
            return false;
        }
        let used = self.used_by_rule(rule).0;
        if used + need <= quota {
            return true;
        }
        let target = (quota as f64 * self.cfg.low_watermark) as u64;
        let candidates = self
            .store
            .eviction_order(self.cfg.eviction, &|i| self.busy(i))
            .into_iter()
            .filter(|e| e.rule == Some(rule))
            .collect();
        self.evict_down(candidates, used, need, target) <= quota
    }

    /// Evicts `candidates` in order until `used + need` is at most `target`; returns what is
    /// used then (files that could not be evicted still count).
    fn evict_down(&self, candidates: Vec<Entry>, mut used: u64, need: u64, target: u64) -> u64 {
        for e in candidates {
            if used + need <= target {
                break;
            }
            let bytes = self.store.disk_bytes(e.ino);
            match self.evict(&e) {
                Ok(()) if self.store.get(e.ino).is_none() => used = used.saturating_sub(bytes),
                Ok(()) => {}
                Err(err) => tracing::warn!(ino = e.ino, "eviction failed: {err}"),
            }
        }
        used + need
    }

    /// Room for a file of `size` bytes attached by `rule`: under the rule's quota, then in the
    /// cache; ENOSPC when either is full of files that cannot be evicted.
    fn room_for(&self, rule: Option<u64>, size: u64) -> Result<()> {
        if !self.make_room_in_quota(rule, size) {
            self.metrics.pcc("quota_refusals", 1);
            return Err(ClientError::Errno(
                "the rule's cache quota is full",
                libc::ENOSPC,
            ));
        }
        if !self.make_room(size) {
            return Err(ClientError::Errno("the cache is full", libc::ENOSPC));
        }
        Ok(())
    }

    fn evict(&self, e: &Entry) -> Result<()> {
        // Never wait for a file another thread is changing (two attaches evicting each other's
        // file would deadlock): skip it this time.
        let slot = self.slot(e.ino);
        let Some(_held) = slot.op.try_lock() else {
            return Ok(());
        };
        if e.mode == Mode::Rw {
            self.give_back(e.ino, false)?;
        } else {
            self.store.remove(e.ino);
        }
        self.metrics.pcc("evictions", 1);
        Ok(())
    }

    /// Copies a file's current data from the capacity tier into the cache file; returns the
    /// CRC-32 of what it copied.
    fn copy_in(&self, ino: Ino, size: u64) -> Result<u32> {
        use std::os::unix::fs::FileExt;
        let f = self.store.create_data(ino).map_err(Self::cache_err)?;
        let mut crc = crc32fast::Hasher::new();
        let mut off = 0u64;
        while off < size {
            let n = (size - off).min(1 << 20) as u32;
            let buf = self.data.read(ino, off, n, true)?;
            if buf.is_empty() {
                break;
            }
            f.write_all_at(&buf, off)
                .map_err(|e| ClientError::Failed(format!("cache write: {e}"), libc::EIO))?;
            crc.update(&buf);
            off += buf.len() as u64;
        }
        if off < size {
            // (the new file is as long as what was written: only a short read leaves a hole)
            f.set_len(size)
                .map_err(|e| ClientError::Failed(format!("cache write: {e}"), libc::EIO))?;
            crc.update(&vec![0u8; (size - off) as usize]);
        }
        self.metrics.pcc("bytes_copied_in", size);
        Ok(crc.finalize())
    }

    /// Length and CRC-32 of a cached file as it is on disk now.
    fn checksum(&self, ino: Ino) -> Result<(u64, u32)> {
        let f = self.store.open_data(ino, false).map_err(Self::cache_err)?;
        let mut crc = crc32fast::Hasher::new();
        let mut off = 0u64;
        loop {
            let b = read_piece(&f, off, 1 << 20)
                .map_err(|e| ClientError::Failed(format!("cache read: {e}"), libc::EIO))?;
            if b.is_empty() {
                break;
            }
            crc.update(&b);
            off += b.len() as u64;
        }
        Ok((off, crc.finalize()))
    }

    /// Whether a read-only copy is intact: its length and CRC-32 are what was copied. Checked
    /// once per copy after the daemon starts (a copy may have been damaged while it was down).
    fn verified(&self, e: &Entry) -> bool {
        if self.peek(e.ino).map(|s| s.verified).unwrap_or(false) {
            return true;
        }
        let ok = match (e.crc, self.checksum(e.ino)) {
            (Some(want), Ok((len, crc))) => len == e.size && crc == want,
            _ => false,
        };
        if ok {
            self.slot(e.ino).st.lock().verified = true;
        } else {
            tracing::warn!(
                ino = e.ino,
                "a read-only cached copy failed verification: dropped"
            );
            self.metrics.pcc("verification_failures", 1);
        }
        ok
    }

    fn new_entry(
        &self,
        ino: Ino,
        mode: Mode,
        version: u64,
        generation: u64,
        rule: Option<u64>,
    ) -> Entry {
        let now = now_nanos();
        Entry {
            ino,
            mode,
            version,
            generation,
            dirty: false,
            pinned: false,
            complete: true,
            last_access: now,
            last_write: 0,
            rule,
            size: 0,
            crc: None,
        }
    }

    /// RO-PCC attach: a read-only copy tied to the file's current data version.
    pub fn attach_ro(&self, attr: &Attr, rule: Option<u64>) -> Result<()> {
        let slot = self.slot(attr.ino);
        let _held = slot.hold();
        self.sync(&slot, attr.ino);
        if attr.kind != Kind::File {
            return Err(ClientError::Errno(
                "only regular files can be cached",
                libc::EINVAL,
            ));
        }
        if let Some(e) = self.store.get(attr.ino) {
            if e.mode == Mode::Rw || e.version == attr.data_version {
                return Ok(());
            }
        }
        if let Lease::Ours(_) = self.recaller.check_ino(attr.ino)? {
            return Ok(());
        }
        let attr = self.meta.getattr(attr.ino)?;
        self.room_for(rule, attr.size)?;
        self.step(&slot, attr.ino, Event::CopyStart)?;
        let copied = self.copy_ro(&attr, rule);
        if copied.is_err() {
            self.store.remove(attr.ino);
        }
        let ev = match copied {
            Ok(()) => Event::CopyDone,
            Err(_) => Event::CopyFailed,
        };
        self.step(&slot, attr.ino, ev)?;
        copied?;
        self.metrics.pcc("attaches_ro", 1);
        Ok(())
    }

    /// The copy of an RO attach: the data, checked against the data version afterwards.
    fn copy_ro(&self, attr: &Attr, rule: Option<u64>) -> Result<()> {
        let crc = self.copy_in(attr.ino, attr.size)?;
        let now = self.meta.getattr(attr.ino)?;
        if now.data_version != attr.data_version {
            // Changed while copying: the copy may be torn.
            return Err(ClientError::Errno(
                "the file changed while it was copied",
                libc::EAGAIN,
            ));
        }
        let mut e = self.new_entry(attr.ino, Mode::Ro, attr.data_version, 0, rule);
        e.size = attr.size;
        e.crc = Some(crc);
        self.store.put(e).map_err(Self::cache_err)
    }

    /// RW-PCC attach: take the lease and move the file's data into the cache.
    pub fn attach_rw(&self, attr: &Attr, rule: Option<u64>) -> Result<Entry> {
        self.attach_rw_as(attr, rule, false)
    }

    /// [`Pcc::attach_rw`]; `created`: `attr` is a file this client has just created (and
    /// holds open), about to be handed out for writing: no lease can be held elsewhere yet
    /// (none is looked for: another client's answers WouldBlock), `attr` is its state, and
    /// the lease is taken dirty ("may be dirty", before the writable descriptor exists) in
    /// the lease's own transaction ([`MetaEngine::pcc_acquire_dirty`]).
    fn attach_rw_as(&self, attr: &Attr, rule: Option<u64>, created: bool) -> Result<Entry> {
        let slot = self.slot(attr.ino);
        let _held = slot.hold();
        self.sync(&slot, attr.ino);
        if attr.kind != Kind::File {
            return Err(ClientError::Errno(
                "only regular files can be cached",
                libc::EINVAL,
            ));
        }
        if let Some(e) = self.store.get(attr.ino) {
            if e.mode == Mode::Rw {
                return Ok(e);
            }
        }
        let before = if created {
            attr.clone()
        } else {
            self.recaller.check_ino(attr.ino)?;
            self.meta.getattr(attr.ino)?
        };
        self.room_for(rule, before.size)?;
        // Flush what this client buffered for the file, then take the lease.
        self.data.flush(attr.ino)?;
        // Another client that just closed the file may not have told the engine yet (closes go
        // in batches every 50 ms): while it is open elsewhere, try again for a moment.
        let deadline = Instant::now() + IN_USE_WAIT;
        let acquire = |ino, client: &str| {
            if created {
                self.meta.pcc_acquire_dirty(ino, client)
            } else {
                self.meta.pcc_acquire(ino, client)
            }
        };
        let acquired = loop {
            match acquire(attr.ino, &self.client) {
                Err(MetaError::InUse) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other,
            }
        };
        let lease = match acquired {
            Ok(l) => l,
            Err(MetaError::WouldBlock) => {
                return Err(ClientError::Errno(
                    "another client holds the RW-PCC lease",
                    libc::EBUSY,
                ))
            }
            Err(e) => return Err(e.into()),
        };
        let reuse = self
            .store
            .get(attr.ino)
            .map(|e| {
                e.mode == Mode::Ro
                    && e.version == before.data_version
                    && e.complete
                    && self.verified(&e)
            })
            .unwrap_or(false);
        let attr = self.meta.getattr(attr.ino)?;
        if !reuse {
            if let Err(e) = self.copy_in(attr.ino, attr.size) {
                self.undo_attach(&slot, &lease);
                return Err(e);
            }
        }
        self.attached_rw(&slot, &attr, &lease, rule, created)
    }

    /// Gives back the lease of an attach that failed after taking it, and drops its cache file.
    fn undo_attach(&self, slot: &Slot, lease: &PccLease) {
        let _ = self
            .meta
            .pcc_release(lease.ino, &self.client, lease.generation);
        self.store.remove(lease.ino);
        let _ = self.step(slot, lease.ino, Event::Dropped);
    }

    /// The end of an RW attach (slot lock held, `lease` taken, the data in the cache file):
    /// the index entry, `dirty` when the lease was taken dirty (a writer at create).
    fn attached_rw(
        &self,
        slot: &Slot,
        attr: &Attr,
        lease: &PccLease,
        rule: Option<u64>,
        dirty: bool,
    ) -> Result<Entry> {
        let mut e = self.new_entry(
            attr.ino,
            Mode::Rw,
            attr.data_version,
            lease.generation,
            rule,
        );
        if dirty {
            e.dirty = true;
            e.last_write = now_nanos();
        }
        self.store.put(e.clone()).map_err(Self::cache_err)?;
        self.step(slot, attr.ino, Event::Attached)?;
        if e.dirty {
            self.step(slot, attr.ino, Event::Written)?;
        }
        self.data.invalidate(attr.ino, Some(attr));
        self.metrics.pcc("attaches_rw", 1);
        Ok(e)
    }

    /// Writes an RW-cached file back to the capacity tier (the lease stays). With writers
    /// left it is a snapshot: the file stays dirty.
    pub fn write_back(&self, ino: Ino) -> Result<()> {
        let slot = self.slot(ino);
        let _held = slot.hold();
        self.sync(&slot, ino);
        let Some(e) = self.store.get(ino) else {
            return Ok(());
        };
        if e.mode != Mode::Rw {
            return Ok(());
        }
        self.step(&slot, ino, Event::WriteBackStart)?;
        let r = self.write_back_data(&slot, &e);
        let ev = match &r {
            Ok(clean) => Event::WriteBackDone { clean: *clean },
            Err(_) => Event::WriteBackFailed,
        };
        self.step(&slot, ino, ev)?;
        r.map(|_| ())
    }

    /// The data of a write-back (slot lock held): the cache file to the capacity tier, then
    /// the report, clean only when no writer is left. Whether it was clean.
    fn write_back_data(&self, slot: &Slot, e: &Entry) -> Result<bool> {
        let ino = e.ino;
        let clean = slot.st.lock().writers == 0;
        let f = self.store.open_data(ino, false).map_err(Self::cache_err)?;
        let (size, mtime) = self.local_attr(ino).unwrap_or((0, now_nanos()));
        test_writeback_stall();
        let attr = self.data.write_back(ino, &f, size, mtime)?;
        self.send_report(slot, ino, e.generation, !clean, size, mtime)?;
        self.store
            .update(ino, |en| {
                en.dirty = !clean;
                en.version = attr.data_version;
            })
            .map_err(Self::cache_err)?;
        self.metrics.pcc("writebacks", 1);
        self.metrics.pcc("bytes_written_back", size);
        Ok(clean)
    }

    /// Serves a read request numbered `seq` while this client has writers of the file: a
    /// snapshot of its current data goes to the capacity tier, the lease and the writers
    /// stay ([`MetaEngine::pcc_snapshot_served`]). The snapshot starts after the request was
    /// read, so it holds every write acknowledged before the reader asked.
    pub fn snapshot(&self, ino: Ino, seq: u64) -> Result<()> {
        let slot = self.slot(ino);
        let _held = slot.hold();
        self.sync(&slot, ino);
        let Some(e) = self.store.get(ino).filter(|e| e.mode == Mode::Rw) else {
            return Ok(());
        };
        self.write_back(ino)?;
        self.meta
            .pcc_snapshot_served(ino, &self.client, e.generation, seq)?;
        self.metrics.pcc("snapshots", 1);
        Ok(())
    }

    /// Gives an RW lease back: write back if dirty, release, keep a read-only copy if asked.
    /// Refused (EBUSY) while this client has writers of the file.
    pub fn give_back(&self, ino: Ino, keep: bool) -> Result<()> {
        let slot = self.slot(ino);
        let _held = slot.hold();
        self.sync(&slot, ino);
        let Some(e) = self.store.get(ino) else {
            // A lease in this client's name without data here: released only if clean.
            if let Some(l) = self.meta.pcc_lease(ino)? {
                if l.client == self.client && !l.dirty {
                    self.meta.pcc_release(ino, &self.client, l.generation)?;
                }
            }
            return Ok(());
        };
        if e.mode == Mode::Rw {
            self.step(&slot, ino, Event::GiveBackStart)?;
            let r = self.give_back_rw(&slot, &e, keep);
            let ev = match &r {
                Ok(()) => Event::GivenBack { keep },
                Err(_) => Event::GiveBackFailed,
            };
            self.step(&slot, ino, ev)?;
            return r;
        }
        if !keep {
            self.store.remove(ino);
            self.step(&slot, ino, Event::Dropped)?;
        }
        Ok(())
    }

    fn give_back_rw(&self, slot: &Slot, e: &Entry, keep: bool) -> Result<()> {
        let ino = e.ino;
        let lease = self.meta.pcc_lease(ino)?;
        let Some(ours) = lease
            .as_ref()
            .filter(|l| l.client == self.client && l.generation == e.generation)
        else {
            // Not ours any more (broken while this client looked dead): nothing to write
            // back to, and dirty data is kept aside.
            self.drop_lost_rw(e, "the RW-PCC lease of a dirty cached file was lost");
            return Ok(());
        };
        if e.dirty || ours.dirty {
            self.write_back_data(slot, e)?;
        }
        // The kept open (if no handle uses it) closes before the lease goes: whoever takes the
        // lease next (an `attach -w` elsewhere is refused while the file is open here) must
        // not find this client's record of a handle that is closed.
        let kept = slot.st.lock().unkeep(|_, _| true);
        if let Some(by) = kept {
            self.forget_kept();
            if let Err(err) = self.meta.close_files(by.session, &[ino]) {
                tracing::debug!(ino, "close of a kept open at give-back: {err}; queued");
                self.data.queue_close(ino, by.caller, by.session);
            }
        }
        // Attribute changes still waiting for a report (one failed) go before the lease.
        let waiting = slot.st.lock().deferred.take();
        if let Some(d) = waiting {
            if let Err(err) = self.meta.setattr(ino, &d.set) {
                d.put_back(&mut slot.st.lock().deferred);
                return Err(err.into());
            }
        }
        if !self.meta.pcc_release(ino, &self.client, e.generation)? {
            return Err(ClientError::Errno(
                "the RW-PCC lease changed during its give-back",
                libc::EAGAIN,
            ));
        }
        if keep {
            let a = self.meta.getattr(ino)?;
            let (len, crc) = self.checksum(ino)?;
            self.store
                .update(ino, |en| {
                    en.mode = Mode::Ro;
                    en.version = a.data_version;
                    en.dirty = false;
                    en.size = len;
                    en.crc = Some(crc);
                })
                .map_err(Self::cache_err)?;
            self.data.invalidate(ino, Some(&a));
        } else {
            self.store.remove(ino);
        }
        Ok(())
    }

    /// Detaches a file from this client's cache.
    pub fn detach(&self, ino: Ino, keep: bool) -> Result<()> {
        // Not here: a lease of ours without data (cache lost) is released if clean (give_back).
        self.give_back(ino, keep)
    }

    // ------------------------------------------------------------------ open / create / close

    /// An open of `attr`'s file by `session`, as far as this cache goes, under the file's
    /// slot lock: the lease check and the record of the open are one engine transaction
    /// ([`MetaEngine::pcc_open`]), which also marks this client's lease dirty before a
    /// writable descriptor of the cache file exists. `snapshot`: the number of a read request
    /// another client's lease served with a snapshot ([`crate::lease::Recaller::recall`]).
    /// Without `block`, a file whose lock another transition holds answers
    /// [`Opened::Busy`] at once (a FUSE request thread does not wait behind a write-back).
    pub fn open(
        self: &Arc<Self>,
        session: u64,
        attr: &Attr,
        name: Option<&[u8]>,
        flags: i32,
        snapshot: Option<u64>,
        block: bool,
    ) -> Result<Opened> {
        self.last_open
            .store(now_nanos(), std::sync::atomic::Ordering::Relaxed);
        let ino = attr.ino;
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let slot = self.slot(ino);
        let _held = if block {
            slot.op.lock()
        } else {
            match slot.op.try_lock() {
                Some(g) => g,
                None => return Ok(Opened::Busy),
            }
        };
        self.sync(&slot, ino);
        let (attr, own) = match self
            .meta
            .pcc_open(session, ino, &self.client, write, snapshot)?
        {
            PccOpen::Held(l) => return Ok(Opened::Held(l)),
            PccOpen::Snapshot { attr, .. } => {
                // Another client's snapshot, read from the capacity tier.
                self.metrics.pcc("misses", 1);
                return Ok(Opened::Uncached(attr));
            }
            PccOpen::Opened { attr, lease } => (attr, lease),
        };
        match self.serve(&slot, &attr, own.as_ref(), name, write) {
            Ok(o) => Ok(o),
            Err(e) => {
                // The open was recorded: take it back.
                let _ = self.meta.close_files(session, &[ino]);
                Err(e)
            }
        }
    }

    /// A read-only open of `attr`'s file that the engine does not record now (the caller
    /// queues its record: `DataPath::queue_open`): no client holds the file's RW-PCC lease and
    /// it has no HSM state, so the engine's open would only have counted it. Served from this
    /// client's RO copy when it is complete and holds `attr`'s data version, else uncached (an
    /// RO copy queued if a rule asks for one), as [`Pcc::open`] serves it. None when this
    /// client's cache is changing the file's state now: the caller opens as usual.
    pub fn open_unrecorded(
        self: &Arc<Self>,
        attr: &Attr,
        name: Option<&[u8]>,
    ) -> Option<Result<Opened>> {
        self.last_open
            .store(now_nanos(), std::sync::atomic::Ordering::Relaxed);
        let slot = self.slot(attr.ino);
        let _held = slot.op.try_lock()?;
        self.sync(&slot, attr.ino);
        Some(self.serve(&slot, attr, None, name, false))
    }

    /// A read-only open of `attr`'s file that this client holds in its RW cache under `lease`
    /// (as the engine read it with the attributes), served from the cache file without the
    /// engine's write (the caller queues its record: `DataPath::queue_open`), as
    /// [`Pcc::open`] would serve it after `pcc_open` found the lease ours. None unless the
    /// cache holds the file in RW mode under that lease's generation now (a give-back or a
    /// new attach since the read), or when a transition holds the file: the caller opens as
    /// usual (the engine reads the lease again in its transaction).
    pub fn open_unrecorded_own(
        self: &Arc<Self>,
        attr: &Attr,
        lease: &PccLease,
        name: Option<&[u8]>,
    ) -> Option<Result<Opened>> {
        if lease.client != self.client {
            return None;
        }
        self.last_open
            .store(now_nanos(), std::sync::atomic::Ordering::Relaxed);
        let slot = self.slot(attr.ino);
        let _held = slot.op.try_lock()?;
        self.sync(&slot, attr.ino);
        self.store
            .get(attr.ino)
            .filter(|e| e.mode == Mode::Rw && e.generation == lease.generation)?;
        Some(self.serve(&slot, attr, Some(lease), name, false))
    }

    /// An open of `ino` served on its kept open (see [`crate::pcc_state`]), without the
    /// metadata engine: this client holds the file's RW-PCC lease and kept the engine's
    /// record of an earlier open of it under `session`, which still counts the file open here.
    /// None when that does not hold now (or a transition holds the file): the caller opens
    /// as usual. A writer is served only if the lease is dirty already (the engine says so
    /// before any writable descriptor exists, as for every open for writing).
    pub fn open_kept(&self, session: u64, ino: Ino, write: bool) -> Option<Served> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.kept_opens_allowed() {
            return None;
        }
        // No slot, no kept open.
        let slot = self.slots.lock().map.get(&ino).cloned()?;
        // A writer is served only between transitions. A reader only changes counts (as its
        // close does), so it is served whatever transition holds the file, the phase
        // permitting: one that starts meanwhile finds it counted, and one that changed the
        // phase first refuses its `OpenKept` below.
        let _held = if write {
            Some(slot.op.try_lock()?)
        } else {
            None
        };
        if !slot.st.lock().kept_serves(session, write) {
            return None;
        }
        let e = self.store.get(ino).filter(|e| e.mode == Mode::Rw)?;
        let f = match self.store.open_data(ino, true) {
            Ok(f) => f,
            Err(err) => {
                tracing::debug!(ino, "kept open: cache file: {err}");
                return None;
            }
        };
        self.step(&slot, ino, Event::OpenKept { write }).ok()?;
        self.last_open.store(now_nanos(), Relaxed);
        self.store.touch(ino, |en| en.last_access = now_nanos());
        self.metrics.pcc("hits", 1);
        self.metrics.pcc("opens_kept", 1);
        Some(Self::served_rw(&slot, f, e.generation))
    }

    /// At the close of a handle served from this client's RW cache whose open the engine
    /// recorded under `by.session` (the current one): keeps that record as the file's kept
    /// open instead of closing it (true: the caller sends no close). Refused (false) when kept
    /// opens are off or not allowed now, [`KEPT_MAX`] are kept, the file is not `Rw` here or
    /// has a kept open already, or a transition holds it.
    pub fn keep_open(&self, ino: Ino, by: KeptBy) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.kept_opens_allowed() || self.kept.load(Relaxed) >= KEPT_MAX {
            return false;
        }
        let slot = self.slot(ino);
        let Some(_held) = slot.op.try_lock() else {
            return false;
        };
        if slot.st.lock().keep(by).is_err() {
            return false;
        }
        self.kept.fetch_add(1, Relaxed);
        true
    }

    fn kept_opens_allowed(&self) -> bool {
        !self.cfg.open_cache.is_zero()
            && now_nanos() < self.kept_until.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Called by the `pcc` worker: kept opens may be made and served for about a second more
    /// if `allowed` (no changelog reader wants OPEN or CLOSE records, the session's last
    /// heartbeat is recent), else not at all from now on, and every kept open without users
    /// is closed. Kept opens idle for `pcc_open_cache_secs` are closed too.
    pub fn allow_kept_opens(&self, allowed: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let until = if allowed {
            now_nanos() + KEPT_LEASE.as_nanos() as i64
        } else {
            0
        };
        self.kept_until.store(until, Relaxed);
        if self.kept.load(Relaxed) == 0 {
            return;
        }
        let idle = self.cfg.open_cache;
        self.unkeep_where(|k| !allowed || k.idle_since.elapsed() >= idle);
    }

    /// Closes every kept open without users (unmount, after FUSE stopped: then all of them).
    pub fn unkeep_all(&self) {
        self.kept_until
            .store(0, std::sync::atomic::Ordering::Relaxed);
        self.unkeep_where(|_| true);
    }

    fn unkeep_where(&self, due: impl Fn(&crate::pcc_state::Kept) -> bool) {
        let slots: Vec<(Ino, Arc<Slot>)> = self
            .slots
            .lock()
            .map
            .iter()
            .map(|(i, s)| (*i, Arc::clone(s)))
            .collect();
        for (ino, slot) in slots {
            let taken = slot.st.lock().unkeep(|k, _| due(k));
            if let Some(by) = taken {
                self.kept_closed(ino, by);
            }
        }
    }

    /// The serving part of [`Pcc::open`] (slot lock held, open recorded).
    fn serve(
        self: &Arc<Self>,
        slot: &Slot,
        attr: &Attr,
        own: Option<&PccLease>,
        name: Option<&[u8]>,
        write: bool,
    ) -> Result<Opened> {
        let ino = attr.ino;
        if let Some(l) = own {
            return match self.store.get(ino) {
                Some(e) if e.mode == Mode::Rw && e.generation == l.generation => {
                    let f = self.store.open_data(ino, true).map_err(Self::cache_err)?;
                    self.step(slot, ino, Event::Open { write })?;
                    self.store.touch(ino, |en| en.last_access = now_nanos());
                    self.metrics.pcc("hits", 1);
                    Ok(Opened::Served(Self::served_rw(slot, f, l.generation)))
                }
                // The lease survived but the cached data did not: given up if clean, EIO if
                // dirty.
                _ => {
                    self.recaller.ours_without_data(l)?;
                    Ok(Opened::Uncached(self.meta.getattr(ino)?))
                }
            };
        }
        if let Some(e) = self.store.get(ino) {
            if e.mode == Mode::Ro {
                if !write && e.complete && e.version == attr.data_version {
                    if let Some(f) = self.open_ro_copy(slot, &e)? {
                        self.metrics.pcc("hits", 1);
                        return Ok(Opened::Served(Served {
                            file: Arc::new(f),
                            rw: false,
                        }));
                    }
                } else if e.version != attr.data_version || write {
                    // Stale, or about to be: drop the copy.
                    self.store.remove(ino);
                    self.step(slot, ino, Event::Dropped)?;
                }
            }
        }
        self.metrics.pcc("misses", 1);
        let uncached = Opened::Uncached(attr.clone());
        if write {
            return Ok(uncached);
        }
        let Some(name) = name else {
            return Ok(uncached);
        };
        let Some(rule) = self.matching_rule("ro", attr, name) else {
            return Ok(uncached);
        };
        // The copy is made off the request path (the `pcc-ro-copy` worker): this open reads
        // uncached, the opens after the copy are served from it.
        self.queue_ro_copy(attr, rule);
        Ok(uncached)
    }

    /// Opens `e`, a complete RO copy of the data version a reader sees, for that reader
    /// (slot lock held; counted as an open handle, closed with [`Pcc::on_close`]); None when
    /// the copy failed verification (then it is dropped).
    fn open_ro_copy(&self, slot: &Slot, e: &Entry) -> Result<Option<File>> {
        if !self.verified(e) {
            self.store.remove(e.ino);
            self.step(slot, e.ino, Event::Dropped)?;
            return Ok(None);
        }
        let f = self
            .store
            .open_data(e.ino, false)
            .map_err(Self::cache_err)?;
        self.step(slot, e.ino, Event::Open { write: false })?;
        self.store.touch(e.ino, |en| en.last_access = now_nanos());
        Ok(Some(f))
    }

    /// For a read-only handle opened uncached before its file's RO copy existed (the first
    /// open under an `ro` rule; the `pcc-ro-copy` worker copies after it): the copy, once it
    /// is complete and holds `version`, the data version the handle's reads see now. It is
    /// opened and counted as an open handle (closed with [`Pcc::on_close`]), and the handle
    /// reads from it while [`Pcc::ro_copy_holds`] says so. None when there is no such copy, or
    /// a transition holds the file (the read goes uncached; a later one looks again).
    pub fn ro_copy_for_open_handle(&self, ino: Ino, version: u64) -> Option<Arc<File>> {
        let slot = self.slot(ino);
        let _held = slot.op.try_lock()?;
        let e = self
            .store
            .get(ino)
            .filter(|e| e.mode == Mode::Ro && e.complete && e.version == version)?;
        match self.open_ro_copy(&slot, &e) {
            Ok(Some(f)) => {
                self.metrics.pcc("ro_copies_served_to_open_handles", 1);
                Some(Arc::new(f))
            }
            Ok(None) => None,
            Err(err) => {
                tracing::debug!(ino, "RO copy for an open handle: {err}");
                None
            }
        }
    }

    /// Whether `ino`'s RO copy is complete and holds data version `version`.
    pub fn ro_copy_holds(&self, ino: Ino, version: u64) -> bool {
        self.store
            .get(ino)
            .is_some_and(|e| e.mode == Mode::Ro && e.complete && e.version == version)
    }

    /// Queues an RO copy of `attr`'s file for the `pcc-ro-copy` worker, unless it is queued
    /// already, being copied, or the queue is full (then dropped: never waits).
    fn queue_ro_copy(&self, attr: &Attr, rule: u64) {
        if self.peek(attr.ino).map(|s| s.phase) == Some(Phase::CopyingRo) {
            return;
        }
        let pushed = self.ro_copies.lock().push(attr.ino, (attr.clone(), rule));
        match pushed {
            Queued::Yes => self.metrics.pcc("ro_copies_queued", 1),
            Queued::Full => self.metrics.pcc("ro_copies_dropped", 1),
            Queued::Already => {}
        }
    }

    /// One unit of the `pcc-ro-copy` worker: copies the next queued file into the cache (its
    /// attributes and lease read again first, its data version checked after the copy, as
    /// every RO attach does), unless a file was opened here in the last [`RO_COPY_QUIET`].
    /// Whether it copied (or tried to copy) a file.
    pub fn copy_next_ro(&self) -> bool {
        let last = self.last_open.load(std::sync::atomic::Ordering::Relaxed);
        if now_nanos().saturating_sub(last) < RO_COPY_QUIET.as_nanos() as i64 {
            // Applications are opening files: try again later.
            return false;
        }
        let next = self.ro_copies.lock().pop();
        let Some((attr, rule)) = next else {
            return false;
        };
        if let Err(e) = self.attach_ro(&attr, Some(rule)) {
            tracing::debug!(ino = attr.ino, "background RO copy failed: {e}");
        }
        // (counted after the attempt, copied or not: `attaches_ro` counts the copies)
        self.metrics.pcc("ro_copies_tried", 1);
        true
    }

    /// At create: a new file under an RW rule lives in the cache from the start.
    pub fn on_create(&self, attr: &Attr, name: &[u8], flags: i32) -> Result<Option<Served>> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let Some(rule) = self.matching_rule("rw", attr, name) else {
            return Ok(None);
        };
        let slot = self.slot(attr.ino);
        let _held = slot.hold();
        // A writer's lease is taken dirty: "may be dirty" is in the engine before the writable
        // descriptor exists.
        match self.attach_rw_as(attr, Some(rule), write) {
            Ok(e) => {
                let f = self
                    .store
                    .open_data(attr.ino, true)
                    .map_err(Self::cache_err)?;
                // Counted as a writer exactly when the handle is one (see on_close).
                self.step(&slot, attr.ino, Event::Open { write })?;
                self.metrics.pcc("hits", 1);
                Ok(Some(Self::served_rw(&slot, f, e.generation)))
            }
            Err(e) => {
                tracing::debug!(
                    ino = attr.ino,
                    "RW attach by rule failed, writing uncached: {e}"
                );
                Ok(None)
            }
        }
    }

    /// At create, after [`MetaEngine::pcc_create`] took the new file's lease (dirty) in the
    /// create's transaction for `rule`: the file lives in the cache from the start, and the
    /// writable descriptor is handed out only now, after the lease. When the cache cannot take
    /// it (quota, disk), the lease is given back and the file is written uncached.
    pub fn on_create_leased(
        &self,
        attr: &Attr,
        rule: u64,
        lease: PccLease,
    ) -> Result<Option<Served>> {
        let slot = self.slot(attr.ino);
        let _held = slot.hold();
        self.sync(&slot, attr.ino);
        // The new cache file (opened read-write) is the served descriptor itself.
        let attached = self.room_for(Some(rule), 0).and_then(|()| {
            let f = self.store.create_data(attr.ino).map_err(Self::cache_err)?;
            self.attached_rw(&slot, attr, &lease, Some(rule), true)?;
            Ok(f)
        });
        let f = match attached {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(
                    ino = attr.ino,
                    "RW attach at create failed, writing uncached: {e}"
                );
                self.undo_attach(&slot, &lease);
                return Ok(None);
            }
        };
        // Counted as a writer (see on_close): only writers' creates take the lease here.
        self.step(&slot, attr.ino, Event::Open { write: true })?;
        self.metrics.pcc("hits", 1);
        Ok(Some(Self::served_rw(&slot, f, lease.generation)))
    }

    /// Reports an RW-cached file's size and mtime to the metadata engine (others see them).
    ///
    /// A dirty report of exactly what the last one told the engine for this lease (same
    /// generation, size and mtime, the lease dirty since) changes nothing there and is not
    /// sent again: a writer's close(2) reports at its FLUSH and again at its RELEASE, and an
    /// untarred file's utimensat before both (one engine transaction and one index line each
    /// otherwise). Any other transition of the file (a write-back, give-back, attach or drop)
    /// forgets what was reported ([`FileState::reported`]).
    pub fn report(&self, ino: Ino, dirty: bool) -> Result<()> {
        let slot = self.slot(ino);
        let _held = slot.hold();
        self.report_held(&slot, ino, dirty)
    }

    /// A writer's report (at its FLUSH and its close): as [`Pcc::report`] (dirty), under the
    /// slot's `report` lock only (see [`Slot::report`]). The caller's handle must count as a
    /// writer of the file until this returns.
    pub fn report_writer(&self, ino: Ino) -> Result<()> {
        let slot = self.slot(ino);
        let _reporting = slot.report.lock();
        self.report_held(&slot, ino, true)
    }

    /// [`Pcc::report`] with the slot's `report` lock held.
    fn report_held(&self, slot: &Slot, ino: Ino, dirty: bool) -> Result<()> {
        let Some(e) = self.store.get(ino).filter(|e| e.mode == Mode::Rw) else {
            return Ok(());
        };
        let Some((size, mtime)) = self.local_attr(ino) else {
            return Ok(());
        };
        let told = (e.generation, size, mtime);
        let same = {
            let st = slot.st.lock();
            st.reported == Some(told) && st.deferred.is_none()
        };
        if dirty && e.dirty && same {
            self.store.touch(ino, |e| e.last_write = now_nanos());
            slot.st.lock().last_report = Some(Instant::now());
            return Ok(());
        }
        self.send_report(slot, ino, e.generation, dirty, size, mtime)?;
        if dirty {
            let _ = self.store.update(ino, |e| {
                e.dirty = true;
                e.last_write = now_nanos();
            });
            self.sync(slot, ino);
            let _ = self.step(slot, ino, Event::Written);
        }
        let mut st = slot.st.lock();
        st.last_report = Some(Instant::now());
        st.reported = dirty.then_some(told);
        Ok(())
    }

    /// The report of `ino`'s cache file to the engine (the slot's `report` lock held), with
    /// the attribute changes that waited for it in its transaction. When the lease went
    /// meanwhile those changes are the application's all the same: they go on their own.
    /// Changes that did not land wait again.
    fn send_report(
        &self,
        slot: &Slot,
        ino: Ino,
        generation: u64,
        dirty: bool,
        size: u64,
        mtime: tierfs_meta::Nanos,
    ) -> Result<()> {
        let waiting = slot.st.lock().deferred.take();
        let Some(d) = waiting else {
            self.meta
                .pcc_report(ino, &self.client, generation, dirty, size, mtime)?;
            return Ok(());
        };
        match self
            .meta
            .pcc_report_then(ino, &self.client, generation, dirty, size, mtime, &d.set)
        {
            Ok(_) => Ok(()),
            Err(err @ (MetaError::NotFound | MetaError::WouldBlock)) => {
                if let Err(e2) = self.meta.setattr(ino, &d.set) {
                    tracing::warn!(ino, "attribute changes kept for a report: {e2}");
                    d.put_back(&mut slot.st.lock().deferred);
                }
                Err(err.into())
            }
            Err(err) => {
                d.put_back(&mut slot.st.lock().deferred);
                Err(err.into())
            }
        }
    }

    /// A setattr of `ino`, RW-cached here with a writer, that may wait for the file's next
    /// report to the engine (the writer's close at the latest, or the `pcc` worker's report of
    /// a file open for writing, every second): kept for that report's transaction, as the
    /// data path keeps a setattr for the commit of buffered writes (data/deferred.rs: the same
    /// rules of what may wait). `base`: the file's attributes as the engine has them now. The
    /// attributes to answer with; None when the change must go now.
    pub fn defer_setattr(&self, ino: Ino, set: &SetAttr, base: &Attr) -> Option<Attr> {
        let slot = self.slots.lock().map.get(&ino).cloned()?;
        let mut st = slot.st.lock();
        if !matches!(st.phase, Phase::Rw { .. }) || st.writers == 0 {
            return None;
        }
        let shown = st.deferred.as_ref().map(|d| d.apply(base));
        if !deferred::may_wait(shown.as_ref().unwrap_or(base), set) {
            return None;
        }
        let now = now_nanos();
        // A given mtime is the cache file's already (Pcc::set_local), which every report
        // carries: a write after it moves it on, and the report's mtime is the later one.
        let set = SetAttr {
            mtime: None,
            ..set.clone()
        };
        let d = Deferred {
            set: deferred::kept(&set, base, now),
            at: now,
            since: now,
        };
        let d = Deferred::merge(st.deferred.take(), d);
        let shown = d.apply(base);
        st.deferred = Some(d);
        self.metrics.setattrs_deferred.inc();
        Some(shown)
    }

    /// Runs `send`, an engine change of `ino`'s attributes that does not wait, with the
    /// changes waiting for the file's report (older: `send` merges them before its own), under
    /// the slot's `report` lock: no report carrying older changes lands after it. Changes
    /// that did not land wait again.
    pub fn with_deferred<T>(
        &self,
        ino: Ino,
        send: impl FnOnce(Option<&SetAttr>) -> Result<T>,
    ) -> Result<T> {
        let Some(slot) = self.slots.lock().map.get(&ino).cloned() else {
            return send(None);
        };
        let _reporting = slot.report.lock();
        let waiting = slot.st.lock().deferred.take();
        let r = send(waiting.as_ref().map(|d| &d.set));
        if r.is_err() {
            if let Some(d) = waiting {
                d.put_back(&mut slot.st.lock().deferred);
            }
        }
        r
    }

    /// `a` (the engine's) as this client shows it: with the attribute changes waiting for the
    /// file's report; None when none wait.
    pub fn shown(&self, a: &Attr) -> Option<Attr> {
        // (on every reply with a file's attributes: no Arc clone; the slots' lock before a
        // state's, as a sweep takes them)
        let slots = self.slots.lock();
        let st = slots.map.get(&a.ino)?.st.lock();
        st.deferred.as_ref().map(|d| d.apply(a))
    }

    /// Truncate or set times of an RW-cached file: the cache file changes. A new size is
    /// reported to the metadata engine (with the cache file's mtime); times alone are not: the
    /// caller's setattr sets them in the engine (one transaction, not a report and then a
    /// setattr), and the file's next report finds the cache file's mtime equal to it.
    pub fn set_local(
        &self,
        ino: Ino,
        size: Option<u64>,
        atime: Option<tierfs_meta::TimeSet>,
        mtime: Option<tierfs_meta::TimeSet>,
    ) -> Result<()> {
        let held = self
            .store
            .get(ino)
            .filter(|e| e.mode == Mode::Rw)
            .and_then(|e| self.rw_file(ino, &e));
        let f = match held {
            Some(f) => f,
            None => Arc::new(self.store.open_data(ino, true).map_err(Self::cache_err)?),
        };
        let io = |e: std::io::Error| ClientError::Failed(format!("cache file: {e}"), libc::EIO);
        if let Some(n) = size {
            f.set_len(n).map_err(io)?;
            self.store.note_size(ino);
        }
        let to_time = |t: tierfs_meta::TimeSet| match t {
            tierfs_meta::TimeSet::Now => std::time::SystemTime::now(),
            tierfs_meta::TimeSet::At(n) if n >= 0 => {
                std::time::UNIX_EPOCH + Duration::from_nanos(n as u64)
            }
            tierfs_meta::TimeSet::At(n) => {
                std::time::UNIX_EPOCH - Duration::from_nanos(n.unsigned_abs())
            }
        };
        let mut times = std::fs::FileTimes::new();
        if let Some(t) = atime {
            times = times.set_accessed(to_time(t));
        }
        if let Some(t) = mtime {
            times = times.set_modified(to_time(t));
        } else if size.is_some() {
            times = times.set_modified(std::time::SystemTime::now());
        }
        f.set_times(times).map_err(io)?;
        if size.is_some() {
            self.report(ino, true)?;
        }
        Ok(())
    }

    /// fallocate(2) of a file RW-cached here: applied to the cache file (which holds the data
    /// and the size), then reported like any change of size.
    pub fn fallocate_local(&self, ino: Ino, mode: i32, offset: u64, length: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        let f = self.store.open_data(ino, true).map_err(Self::cache_err)?;
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(length)) else {
            return Err(ClientError::Errno("fallocate range too large", libc::EFBIG));
        };
        // SAFETY: a plain system call on a descriptor we own.
        if unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(ClientError::Failed(
                format!("cache file: fallocate: {e}"),
                e.raw_os_error().unwrap_or(libc::EIO),
            ));
        }
        self.store.note_size(ino);
        self.report(ino, true)?;
        Ok(())
    }

    /// At the close of a handle served from the cache.
    pub fn on_close(&self, ino: Ino, wrote: bool) -> Result<()> {
        self.close_handle(ino, wrote, false)
    }

    /// [`Pcc::on_close`] of a handle served on the file's kept open ([`Pcc::open_kept`]):
    /// nothing goes to the engine for it, unless it was the kept open's last user and the
    /// lease went meanwhile (then the kept open's close is queued).
    pub fn close_kept(&self, ino: Ino, wrote: bool) -> Result<()> {
        self.close_handle(ino, wrote, true)
    }

    fn close_handle(&self, ino: Ino, wrote: bool, kept: bool) -> Result<()> {
        let slot = self.slot(ino);
        let close = if kept {
            Event::CloseKept { write: wrote }
        } else {
            Event::Close { write: wrote }
        };
        if !wrote {
            // A reader's close changes only the count (no transition waits for readers), so
            // it does not wait behind a write-back holding the file's lock.
            let mut st = slot.st.lock();
            if let Err(e) = st.apply(close) {
                tracing::warn!(ino, "close of a cached handle not counted: {e}");
            }
            self.close_kept_if_unleased(ino, &mut st);
            return Ok(());
        }
        // A writer's close stops counting it (transition lock held) and notes the cache
        // file's size.
        let count_close = || {
            if let Err(e) = self.step(&slot, ino, close) {
                tracing::warn!(ino, "close of a cached handle not counted: {e}");
            }
            self.store.note_size(ino);
        };
        {
            // The close(2) of this handle reported its writes at its FLUSH; its RELEASE
            // reports (mmap writes after that FLUSH) only as the file's last writer: another
            // writer's close comes after it and reports what the file holds then. (Checked and
            // counted under the transition lock, which every writer's close takes: of two
            // closing writers, exactly one is the last.)
            let _held = slot.op.lock();
            if slot.st.lock().writers > 1 {
                count_close();
                return Ok(());
            }
        }
        // Report before this handle stops counting as a writer: a recall waits for writers.
        // (Not under the transition lock: see Pcc::report_writer.)
        let reported = self.report_writer(ino);
        // (held through the answer below: the entry is marked dirty before any validation)
        let _held = slot.op.lock();
        count_close();
        match reported {
            // The lease went while this writer had the file open (it cannot be given back or
            // broken meanwhile, so an admin's `detach --force-stale` or a lost cache took it):
            // the writes have nowhere to go. They are kept (the entry is marked dirty, so
            // validation quarantines it rather than dropping it) and the close says so,
            // instead of acknowledging writes that are not in the filesystem.
            Err(ClientError::Meta(MetaError::NotFound | MetaError::WouldBlock)) => {
                let _ = self.store.update(ino, |e| e.dirty = true);
                tracing::error!(
                    ino,
                    "the RW-PCC lease went while the file was open for writing here: its \
                     writes are kept aside for quarantine, not in the filesystem"
                );
                Err(ClientError::Errno(
                    "the file's RW-PCC lease was taken away while it was open for writing",
                    libc::EIO,
                ))
            }
            other => other,
        }
    }

    /// fsync of a cached file: the cache file and its description are durable.
    pub fn on_fsync(&self, ino: Ino, file: &File) -> Result<()> {
        let slot = self.slot(ino);
        let _held = slot.hold();
        file.sync_all()
            .map_err(|e| ClientError::Failed(format!("cache fsync: {e}"), libc::EIO))?;
        if self
            .store
            .get(ino)
            .map(|e| e.mode == Mode::Rw)
            .unwrap_or(false)
        {
            self.report(ino, true)?;
            self.store.sync_entry(ino).map_err(Self::cache_err)?;
            self.meta.sync()?;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ background

    /// Gives leases back that other clients asked for (the recall thread calls it, see
    /// [`crate::recall`]). Files this client still has writers of are left for a later pass
    /// (counted in [`Pass::waiting`]); a give-back that fails is logged and tried again at a
    /// later pass. An error: the requests could not be read.
    pub fn handle_recalls(&self) -> tierfs_meta::Result<Pass> {
        let mut pass = Pass::default();
        for r in self.meta.pcc_recalls_for(&self.client)? {
            let ino = r.ino;
            let slot = self.slot(ino);
            let _held = slot.hold();
            if self.writers(ino) > 0 {
                if r.write {
                    // Writers bypass the daemon (passthrough): wait for their close; two
                    // writers on two tiers would lose updates.
                    pass.waiting += 1;
                    continue;
                }
                // A reader: a snapshot of the data as it is now, the writers go on.
                match self.snapshot(ino, r.seq) {
                    Ok(()) => pass.given_back += 1,
                    Err(e) => tracing::warn!(ino, "a snapshot write-back failed: {e}"),
                }
                continue;
            }
            match self.give_back(ino, true) {
                Ok(()) => pass.given_back += 1,
                Err(e) => tracing::warn!(ino, "giving an RW-PCC file back failed: {e}"),
            }
        }
        Ok(pass)
    }

    /// Periodic work, done by the `pcc` worker (see [`crate::workers::jobs`]): reports the size
    /// of files this client has writers of (at most once a second each): writes by passthrough
    /// bypass the daemon, other clients see the size this way.
    pub fn report_writers(&self) {
        let writing: Vec<Ino> = self.writing.lock().iter().copied().collect();
        for ino in writing {
            if self.store.get(ino).is_none_or(|e| e.mode != Mode::Rw) {
                continue;
            }
            let due = |s: &FileState| {
                s.last_report
                    .is_none_or(|t| t.elapsed() > Duration::from_secs(1))
            };
            if self.peek(ino).is_none_or(|s| due(&s)) {
                // Not behind a write-back, a give-back or another report of the file: next
                // time. (Due again once held: a close may have reported meanwhile.)
                let slot = self.slot(ino);
                let held = slot.try_hold();
                if held.is_some() && due(&slot.st.lock()) {
                    let _ = self.report(ino, true);
                }
            }
        }
    }

    /// Dirty RW files without writers on this client whose last write is older than the
    /// write-back delay: due for a background write-back.
    pub fn due_write_backs(&self) -> Vec<Ino> {
        let now = now_nanos();
        self.store
            .entries()
            .into_iter()
            .filter(|e| self.write_back_due(e, now))
            .map(|e| e.ino)
            .collect()
    }

    fn write_back_due(&self, e: &Entry, now: i64) -> bool {
        // (the slot's writers last: a look-up under the slots' lock, every 200 ms per file)
        e.mode == Mode::Rw
            && e.dirty
            && now - e.last_write > self.cfg.writeback_delay.as_nanos() as i64
            && self.writers(e.ino) == 0
    }

    /// Writes `ino` back if it is still due (a file listed by [`Pcc::due_write_backs`] may
    /// have been given back, written back or opened for writing since). Whether it was.
    pub fn write_back_if_due(&self, ino: Ino) -> Result<bool> {
        match self.store.get(ino) {
            Some(e) if self.write_back_due(&e, now_nanos()) => {
                self.write_back(ino)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Evicts down to the low watermark when the cache is fuller than the high one, and files
    /// of a rule past its quota.
    pub fn keep_within_limits(&self) {
        let high = (self.cfg.capacity as f64 * self.cfg.high_watermark) as u64;
        if self.used() > high {
            self.make_room(0);
        }
        // Files of a rule grow past its quota through writes the daemon does not see. (Only
        // while files attached by rules are cached: an idle cache reads no rules.)
        let by_rule = self.store.entries().iter().any(|e| e.rule.is_some());
        for (row, _) in if by_rule { self.rules() } else { Vec::new() } {
            if let Some(quota) = row.quota {
                if self.used_by_rule(row.id).0 > quota {
                    self.make_room_in_quota(Some(row.id), 0);
                }
            }
        }
    }

    /// Validates the cache (see `validate`) if the last pass is 5 s old.
    pub fn validate_if_due(&self) {
        let due = {
            let mut g = self.last_validate.lock();
            let due = g
                .map(|t| t.elapsed() > Duration::from_secs(5))
                .unwrap_or(true);
            if due {
                *g = Some(Instant::now());
            }
            due
        };
        if due {
            self.validate();
        }
    }

    /// Drops entries of deleted files, and RW entries whose lease is no longer this client's
    /// (broken while this client looked dead): clean ones go, dirty ones are quarantined.
    fn validate(&self) {
        // RW entries: one query for every lease this client holds; only entries missing from
        // it (lease broken or file deleted) are looked at one by one. RO copies: a slice of
        // them per pass (a copy of a deleted file only takes space until it is found or
        // evicted), so a pass costs a bounded number of queries however large the cache.
        let ours: Option<std::collections::HashSet<Ino>> =
            match self.meta.pcc_leases_of(&self.client) {
                Ok(v) => Some(v.into_iter().map(|l| l.ino).collect()),
                Err(e) => {
                    tracing::debug!("cache validation: reading this client's leases: {e}");
                    None
                }
            };
        let mut entries = self.store.entries();
        entries.sort_unstable_by_key(|e| e.ino);
        let after = *self.validate_cursor.lock();
        let ro: Vec<Ino> = entries
            .iter()
            .filter(|e| e.mode == Mode::Ro)
            .map(|e| e.ino)
            .collect();
        let start = ro.partition_point(|i| *i <= after);
        let slice: Vec<Ino> = ro[start..]
            .iter()
            .chain(&ro[..start])
            .take(VALIDATE_RO_PER_PASS)
            .copied()
            .collect();
        *self.validate_cursor.lock() = slice.last().copied().unwrap_or(0);
        let slice: std::collections::HashSet<Ino> = slice.into_iter().collect();
        for e in entries {
            let due = match e.mode {
                Mode::Rw => ours.as_ref().map(|o| !o.contains(&e.ino)).unwrap_or(false),
                Mode::Ro => slice.contains(&e.ino),
            };
            if due && !self.busy(e.ino) {
                self.validate_entry(e.ino);
            }
        }
    }

    /// Drops an entry whose file was deleted, or an RW entry whose lease is no longer this
    /// client's (clean: dropped; dirty: quarantined).
    fn validate_entry(&self, ino: Ino) {
        // Not while an attach, write-back or give-back of the file runs: look again with the
        // file's transition lock held.
        let slot = self.slot(ino);
        let _held = slot.hold();
        self.sync(&slot, ino);
        if slot.st.lock().opens > 0 {
            return;
        }
        let Some(e) = self.store.get(ino) else {
            return;
        };
        match self.meta.getattr(e.ino) {
            Err(MetaError::NotFound) => {
                self.store.remove(e.ino);
                let _ = self.step(&slot, ino, Event::Dropped);
                return;
            }
            Err(_) => return,
            Ok(_) => {}
        }
        if e.mode == Mode::Rw {
            let ours = matches!(self.meta.pcc_lease(e.ino), Ok(Some(l)) if l.client == self.client);
            if !ours {
                self.drop_lost_rw(&e, "the RW-PCC lease of a dirty cached file was broken");
            }
        }
    }

    /// Drops an RW entry whose lease is no longer this client's: a clean one goes, a dirty one
    /// (the only copy of its writes) is quarantined and reported with `why`.
    fn drop_lost_rw(&self, e: &Entry, why: &str) {
        let slot = self.slot(e.ino);
        let _held = slot.hold();
        let dirty = e.dirty || matches!(slot.st.lock().phase, Phase::Rw { dirty: true });
        if dirty {
            let q = self.store.quarantine(e.ino);
            tracing::error!(ino = e.ino, "{why}: quarantined at {}", q.display());
            self.metrics.pcc("quarantined", 1);
        } else {
            self.store.remove(e.ino);
        }
        // (In a give-back, the give-back's end settles the state; the store is the truth.)
        let _ = slot.st.lock().apply(Event::Dropped);
    }

    /// After a restart: keep what is still valid, write back dirty RW data this client still
    /// owns, quarantine dirty data whose lease went elsewhere, drop stale copies.
    pub fn recover(&self) {
        for e in self.store.entries() {
            let attr = match self.meta.getattr(e.ino) {
                Ok(a) => a,
                Err(MetaError::NotFound) => {
                    self.store.remove(e.ino);
                    continue;
                }
                Err(err) => {
                    tracing::warn!(ino = e.ino, "cache recovery: {err}");
                    continue;
                }
            };
            match e.mode {
                Mode::Ro => {
                    // Stale, incomplete, or cut short while the daemon was down (a full
                    // checksum is verified at the copy's first open).
                    if attr.data_version != e.version
                        || !e.complete
                        || self.store.size_of(e.ino) != e.size
                        || e.crc.is_none()
                    {
                        self.store.remove(e.ino);
                    }
                }
                Mode::Rw => {
                    let lease = self.meta.pcc_lease(e.ino).ok().flatten();
                    match lease {
                        Some(l) if l.client == self.client => {
                            if e.dirty || l.dirty {
                                let _ = self.store.update(e.ino, |en| en.dirty = true);
                                if let Err(err) = self.write_back(e.ino) {
                                    tracing::error!(
                                        ino = e.ino,
                                        "write-back after restart failed: {err}"
                                    );
                                } else {
                                    tracing::info!(
                                        ino = e.ino,
                                        "wrote back dirty cached data after a restart"
                                    );
                                }
                            }
                        }
                        _ => {
                            self.drop_lost_rw(&e, "dirty cached data whose lease is no longer ours")
                        }
                    }
                }
            }
        }
    }

    /// Every RW file written back (unmount).
    pub fn write_back_all(&self) {
        for e in self.store.entries() {
            if e.mode == Mode::Rw && e.dirty {
                if let Err(MetaError::NotFound) = self.meta.getattr(e.ino) {
                    // deleted since the last tick: nothing to write back, the entry goes
                    self.validate_entry(e.ino);
                    continue;
                }
                if let Err(err) = self.write_back(e.ino) {
                    tracing::error!(ino = e.ino, "write-back at unmount failed: {err}");
                }
            }
        }
    }

    /// `tierfs pcc state`: what this client knows of a file, as JSON.
    pub fn state(&self, ino: Ino) -> Result<String> {
        let lease = self.meta.pcc_lease(ino)?;
        let e = self.store.get(ino);
        let st = self.peek(ino).unwrap_or_default();
        let (all, writers) = (st.opens, st.writers);
        let typ = match (&e, &lease) {
            (Some(en), _) if en.mode == Mode::Rw => "readwrite",
            (Some(_), _) => "readonly",
            (None, _) => "none",
        };
        let v = serde_json::json!({
            "type": typ,
            "cache_file": e.as_ref().map(|_| self.store.data_path(ino).display().to_string()),
            "open_count": all,
            "writers": writers,
            "dirty": e.as_ref().map(|x| x.dirty).unwrap_or(false),
            "pinned": e.as_ref().map(|x| x.pinned).unwrap_or(false),
            "complete": e.as_ref().map(|x| x.complete).unwrap_or(false),
            "version": e.as_ref().map(|x| x.version),
            "lease_owner": lease.as_ref().map(|l| l.client.clone()),
            "lease_generation": lease.as_ref().map(|l| l.generation),
            "lease_dirty": lease.as_ref().map(|l| l.dirty),
            "lease_snapshot": lease.as_ref().map(|l| l.snapshot),
            "phase": format!("{:?}", st.phase),
            "kept_open": st.kept.is_some(),
            "client": self.client,
        });
        Ok(v.to_string())
    }

    pub fn pin(&self, ino: Ino, pinned: bool) -> Result<()> {
        self.store
            .update(ino, |e| e.pinned = pinned)
            .map(|_| ())
            .map_err(Self::cache_err)
    }

    /// Cache use for the stats file.
    /// Per rule with a quota or with files in this cache: (rule, bytes used, files, quota).
    pub fn rule_usage(&self) -> Vec<(u64, u64, usize, Option<u64>)> {
        let mut ids: Vec<u64> = self.store.entries().iter().filter_map(|e| e.rule).collect();
        let rules = self.rules();
        ids.extend(
            rules
                .iter()
                .filter(|(r, _)| r.quota.is_some())
                .map(|(r, _)| r.id),
        );
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                let (used, files) = self.used_by_rule(id);
                let quota = rules
                    .iter()
                    .find(|(r, _)| r.id == id)
                    .and_then(|(r, _)| r.quota);
                (id, used, files, quota)
            })
            .collect()
    }

    pub fn usage(&self) -> (u64, u64, usize) {
        (self.used(), self.cfg.capacity, self.store.entries().len())
    }

    /// (fdatasyncs of the cache index, fsyncs of the cache's data directory) so far: what
    /// fsyncs of cached files cost beyond the files themselves.
    pub fn store_syncs(&self) -> (u64, u64) {
        self.store.sync_counts()
    }
}

impl RecallWork for Pcc {
    fn listen(&self) -> tierfs_meta::Result<Option<Box<dyn Listener>>> {
        self.meta.listen(&self.client, &[Channel::PccRevoke])
    }

    fn pass(&self) -> tierfs_meta::Result<Pass> {
        self.handle_recalls()
    }
}

/// Test hook, in debug builds only: `TIERFS_TEST_WRITEBACK_STALL_MS=N` in the daemon's
/// environment makes every write-back take N ms longer, as a slow capacity tier would
/// (crates/tierfs-cli/tests/workers.rs: heartbeats go on meanwhile).
fn test_writeback_stall() {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("TIERFS_TEST_WRITEBACK_STALL_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Bytes of a file for write-back, read in stripe-sized pieces.
pub fn read_piece(f: &File, off: u64, len: usize) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.read_at(&mut buf[done..], off + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::{Queued, RoCopies, Slot, Slots, SLOTS_SWEEP};
    use std::sync::Arc;

    #[test]
    fn ro_copy_queue_is_bounded_and_holds_each_file_once() {
        let mut q = RoCopies::new(2);
        assert_eq!(q.push(1, "a"), Queued::Yes);
        assert_eq!(q.push(1, "a again"), Queued::Already);
        assert_eq!(q.push(2, "b"), Queued::Yes);
        // full: dropped, not queued (and not waited for)
        assert_eq!(q.push(3, "c"), Queued::Full);
        assert_eq!(q.pop(), Some("a"));
        // room again, and 1 may be queued again once taken out
        assert_eq!(q.push(1, "a later"), Queued::Yes);
        assert_eq!(q.push(3, "c"), Queued::Full);
        assert_eq!(q.pop(), Some("b"));
        assert_eq!(q.pop(), Some("a later"));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn slots_in_use_stay_and_sweeps_come_once_the_map_doubled() {
        let mut s = Slots::default();
        // held slots (a caller's Arc), one with an open handle, the rest unused
        let held: Vec<Arc<Slot>> = (0..3000u64)
            .map(|i| {
                let slot = Arc::new(Slot::default());
                s.map.insert(i, Arc::clone(&slot));
                slot
            })
            .collect();
        let open = Arc::new(Slot::default());
        open.st.lock().opens = 1;
        s.map.insert(1_000_000, open);
        for i in 0..(SLOTS_SWEEP as u64) {
            s.map.insert(10_000 + i, Arc::new(Slot::default()));
        }
        s.sweep_if_due();
        assert_eq!(s.map.len(), 3001, "only the slots in use stay");
        assert!(s.map.contains_key(&1_000_000) && s.map.contains_key(&2999));
        // with 3,001 slots in use, the next sweep waits until 6,002: no walk per new slot
        for i in 0..3000u64 {
            s.map.insert(20_000 + i, Arc::new(Slot::default()));
            s.sweep_if_due();
        }
        assert_eq!(s.map.len(), 6001);
        s.map.insert(30_000, Arc::new(Slot::default()));
        s.sweep_if_due();
        assert_eq!(s.map.len(), 3001);
        drop(held);
    }
}
