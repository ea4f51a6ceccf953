//! The cache directory of one client: cached files and what is known of each, kept on disk so
//! the cache survives a restart of the daemon or a reboot.
//!
//! Layout under `<cache_dir>/<filesystem uuid>/` (mode 0700, owned by the daemon's user, so
//! other local users cannot read cached data behind the file permissions):
//!
//! - `data/<ino>`: the file's bytes (the backing file of FUSE passthrough);
//! - `index`: what is known of every cached file (mode ro or rw, the data version (RO) or lease
//!   generation (RW), dirty, pinned, last access...), as a journal: one JSON line per change
//!   (`{"put":{entry}}` or `{"del":ino}`), each appended by one write(2) to a descriptor kept
//!   open, so a change costs no open, no rename and no fsync, and a kill -9 of the daemon
//!   never tears a line. It is fdatasynced when the application asks for durability (fsync of
//!   a cached file: [`CacheStore::sync_entry`]; only if lines were appended since the last
//!   sync, and concurrent fsyncs share one) and rewritten whole (compacted: a temporary
//!   file, fsynced, renamed over it) at open and when it holds many more lines than entries. A
//!   line torn by power loss is skipped at load; data whose description was lost is kept
//!   aside, never deleted. (Caches written by older versions, one `meta/<ino>.json` per
//!   entry, are read at open and moved into the index.)
//! - `quarantine/`: dirty RW data that could not be given back (the lease went elsewhere while
//!   the daemon was down): kept for an operator, reported in the log.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tierfs_meta::Ino;

#[derive(Debug, Error)]
pub enum CacheError {
    #[error("cache directory {0}: {1}")]
    Io(String, std::io::Error),
    #[error("the cache is full ({used} of {capacity} bytes used)")]
    Full { used: u64, capacity: u64 },
    #[error("file {0} is not in the cache")]
    NotCached(Ino),
}

impl CacheError {
    pub fn errno(&self) -> i32 {
        match self {
            CacheError::Io(_, e) => e.raw_os_error().unwrap_or(libc::EIO),
            CacheError::Full { .. } => libc::ENOSPC,
            CacheError::NotCached(_) => libc::ENODATA,
        }
    }
}

pub type Result<T> = std::result::Result<T, CacheError>;

/// How a file is cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Read-only copy, valid while the file's data version is `version`.
    Ro,
    /// The file's data lives here under an RW-PCC lease.
    Rw,
}

/// What the cache knows of one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub ino: Ino,
    pub mode: Mode,
    /// RO: the data version the copy holds. RW: the data version at the last write-back.
    pub version: u64,
    /// RW: the lease generation.
    pub generation: u64,
    /// RW: holds writes the capacity tier does not have.
    pub dirty: bool,
    pub pinned: bool,
    /// The copy holds the whole file (a background copy may still be running).
    pub complete: bool,
    /// Nanoseconds since the epoch of the last open.
    pub last_access: i64,
    /// Nanoseconds since the epoch of the last close of a writer (write-back timing).
    pub last_write: i64,
    /// Rule id that attached it, for per-rule quotas.
    pub rule: Option<u64>,
    /// RO: length and CRC-32 of the copy, checked before a copy is served after a restart.
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub crc: Option<u32>,
}

/// Eviction order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Eviction {
    /// Least recently used first.
    #[default]
    Lru,
    /// Largest first.
    Size,
}

pub struct CacheStore {
    root: PathBuf,
    pub capacity: u64,
    entries: Mutex<HashMap<Ino, Entry>>,
    /// Bytes each cached file takes on disk, as last measured: at load, when an entry is
    /// recorded, and whenever the owner calls [`CacheStore::note_size`] (a file changes size
    /// only through writes, which the daemon sees end: at close). Summing these costs no
    /// system call, where measuring every file at every attach cost one per cached file;
    /// their sum is kept beside them, so the cache's use costs no walk over the files either.
    sizes: Mutex<Sizes>,
    /// The index journal (see the module's header). Locked after `entries` (the one order),
    /// so its lines are in the order the map changed.
    journal: Mutex<Journal>,
    /// Held by [`CacheStore::sync_entry`] while it syncs, one at a time: an fsync waiting
    /// here often finds its lines (and its file's name) made durable by the one before. It
    /// holds how many of `names_made` the data directory's last fsync covered.
    syncing: Mutex<u64>,
    /// Names made in `data/` so far (a cached file created): the directory needs an fsync
    /// for a file's name to survive power loss only after one of these.
    names_made: AtomicU64,
    /// fdatasyncs of the index and fsyncs of `data/` done (`sync_counts`).
    index_syncs: AtomicU64,
    dir_syncs: AtomicU64,
    /// Empty files made ahead without a name (`O_TMPFILE` in `data/`, their descriptors),
    /// which [`CacheStore::create_data`] links into `data/` (`linkat`) instead of creating a
    /// file there. A create allocates an inode, which on some filesystems is far dearer than a
    /// link (ext4 without a journal skips one at a time the inodes of the directory's group
    /// freed in the last minutes, and a cache frees many: docs/benchmarks.md, issue 14
    /// sessions 24 and 30); made off the request path ([`CacheStore::top_up_spares`], the
    /// `pcc-spares` worker), the allocation no longer runs inside a create. An unnamed file
    /// takes no directory lock while it is made, and a link is one directory entry where the
    /// named spares of before took a rename (two entries) and an open with truncation, whose
    /// close made ext4 start writing the file back (`auto_da_alloc`). A spare is never made
    /// from a file given up (a descriptor may still read it), and a crash leaves none behind
    /// (the filesystem frees unnamed files).
    spares: Mutex<Vec<File>>,
    /// Spares are made no more: the cache's filesystem refused an unnamed file or its link
    /// (`O_TMPFILE` unsupported, or `linkat` refused); creates make their files.
    spares_off: AtomicBool,
    /// Creates that took a spare (`spare_counts`).
    spares_taken: AtomicU64,
}

/// Bytes each cached file takes on disk, as last measured, and their sum.
#[derive(Default)]
struct Sizes {
    of: HashMap<Ino, u64>,
    total: u64,
}

impl Sizes {
    fn set(&mut self, ino: Ino, bytes: u64) {
        let old = self.of.insert(ino, bytes).unwrap_or(0);
        self.total = self.total - old + bytes;
    }

    fn remove(&mut self, ino: Ino) {
        if let Some(old) = self.of.remove(&ino) {
            self.total -= old;
        }
    }
}

/// The open index journal.
struct Journal {
    file: Arc<File>,
    /// Lines it holds (compacted when far more than the entries).
    lines: usize,
    /// Lines appended since the store opened, and how many of them are durable (an
    /// fdatasync, or a compaction, which writes them all into a synced file).
    appended: u64,
    durable: u64,
}

/// One line of the index journal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Record {
    Put(Entry),
    Del(Ino),
}

/// The journal is compacted when it holds more lines than this many plus twice the entries.
const COMPACT_SLACK: usize = 4096;

fn io(p: &Path, e: std::io::Error) -> CacheError {
    CacheError::Io(p.display().to_string(), e)
}

impl CacheStore {
    /// Opens (creating) the cache of filesystem `fs_uuid` under `dir`, and reads back every
    /// entry a previous run left.
    pub fn open(dir: &Path, fs_uuid: &str, capacity: u64) -> Result<CacheStore> {
        let root = dir.join(fs_uuid);
        for sub in ["data", "quarantine"] {
            let p = root.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&p)
                .map_err(|e| io(&p, e))?;
        }
        // The cache directory itself is private to the daemon.
        use std::os::unix::fs::PermissionsExt;
        for p in [dir.to_path_buf(), root.clone()] {
            let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o700));
        }
        // Named spares of an older version (`spare/`, `spare/0`, `spare/1`): empty files
        // nobody names.
        let _ = fs::remove_dir_all(root.join("spare"));
        let map = Self::load(&root)?;
        let file = Self::write_index(&root, &map)?;
        // The older layout's descriptions are in the (durable) index now.
        let legacy = root.join("meta");
        if legacy.is_dir() {
            let _ = fs::remove_dir_all(&legacy);
        }
        let store = CacheStore {
            journal: Mutex::new(Journal {
                file: Arc::new(file),
                lines: map.len(),
                appended: 0,
                durable: 0,
            }),
            syncing: Mutex::new(0),
            names_made: Default::default(),
            index_syncs: Default::default(),
            dir_syncs: Default::default(),
            spares: Mutex::new(Vec::new()),
            spares_off: Default::default(),
            spares_taken: Default::default(),
            root,
            capacity,
            entries: Mutex::new(map),
            sizes: Mutex::new(Sizes::default()),
        };
        let inos: Vec<Ino> = store.entries.lock().keys().copied().collect();
        for ino in inos {
            store.note_size(ino);
        }
        Ok(store)
    }

    /// Reads the entries a previous run left: the index journal, then descriptions in the
    /// older layout (`meta/<ino>.json`) the index does not have; entries whose data is gone
    /// are dropped, data nobody describes is kept aside (or removed when empty).
    fn load(root: &Path) -> Result<HashMap<Ino, Entry>> {
        let mut map = HashMap::new();
        let index = root.join("index");
        match fs::read(&index) {
            Ok(bytes) => {
                for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
                    if line.is_empty() {
                        continue;
                    }
                    match serde_json::from_slice::<Record>(line) {
                        Ok(Record::Put(e)) => {
                            map.insert(e.ino, e);
                        }
                        Ok(Record::Del(ino)) => {
                            map.remove(&ino);
                        }
                        // A line torn by power loss: what it said is lost, as an unsynced
                        // change is (data it described is kept aside below).
                        Err(e) => tracing::warn!(
                            "cache index {}: line {} unreadable, skipped: {e}",
                            index.display(),
                            n + 1
                        ),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&index, e)),
        }
        let legacy = root.join("meta");
        if let Ok(dir) = fs::read_dir(&legacy) {
            for de in dir.flatten() {
                let p = de.path();
                if p.extension().and_then(|e| e.to_str()) != Some("json") {
                    continue;
                }
                match fs::read(&p)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Entry>(&b).ok())
                {
                    Some(e) => {
                        map.entry(e.ino).or_insert(e);
                    }
                    None => tracing::warn!("unreadable cache entry {}: dropped", p.display()),
                }
            }
        }
        map.retain(|ino, _| {
            let ok = root.join("data").join(ino.to_string()).exists();
            if !ok {
                tracing::warn!(ino, "cache entry without data: dropped");
            }
            ok
        });
        // Data files nobody describes: an interrupted attach, or a description lost with
        // power. They may hold the only copy of written data, so they are kept aside, never
        // deleted.
        let data = root.join("data");
        for de in fs::read_dir(&data).map_err(|e| io(&data, e))?.flatten() {
            let name = de.file_name();
            let ino = name.to_str().and_then(|s| s.parse::<u64>().ok());
            if ino.map(|i| !map.contains_key(&i)).unwrap_or(true) {
                let dst = root.join("quarantine").join(format!(
                    "{}-{}",
                    name.to_string_lossy(),
                    tierfs_meta::now_nanos()
                ));
                if de.metadata().map(|m| m.len() == 0).unwrap_or(false) {
                    let _ = fs::remove_file(de.path());
                } else {
                    tracing::warn!("cache data without a description kept at {}", dst.display());
                    let _ = fs::rename(de.path(), &dst);
                }
            }
        }
        Ok(map)
    }

    /// Writes the index whole (every entry of `map`, one line each) under a temporary name,
    /// fsyncs it, renames it over the index and fsyncs the directory; returns the new index
    /// open for appending.
    fn write_index(root: &Path, map: &HashMap<Ino, Entry>) -> Result<File> {
        let tmp = root.join("index.tmp");
        let index = root.join("index");
        let mut buf = Vec::with_capacity(map.len() * 256);
        for e in map.values() {
            serde_json::to_writer(&mut buf, &Record::Put(e.clone())).expect("entries serialise");
            buf.push(b'\n');
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io(&tmp, e))?;
        f.write_all(&buf).map_err(|e| io(&tmp, e))?;
        f.sync_all().map_err(|e| io(&tmp, e))?;
        drop(f);
        fs::rename(&tmp, &index).map_err(|e| io(&index, e))?;
        File::open(root)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(root, e))?;
        OpenOptions::new()
            .append(true)
            .open(&index)
            .map_err(|e| io(&index, e))
    }

    pub fn data_path(&self, ino: Ino) -> PathBuf {
        self.root.join("data").join(ino.to_string())
    }

    /// Appends the change `rec` to the index journal (one write: a crash of the daemon does
    /// not tear it; [`CacheStore::sync_entry`] makes it durable). Called with the entries'
    /// lock held and `map` already changed, so the journal's order is the map's; compacts
    /// the journal when it is long.
    fn log(&self, map: &HashMap<Ino, Entry>, rec: &Record) -> Result<()> {
        let mut line = serde_json::to_vec(rec).expect("entries serialise");
        line.push(b'\n');
        let mut j = self.journal.lock();
        let index = self.root.join("index");
        (&*j.file).write_all(&line).map_err(|e| io(&index, e))?;
        j.lines += 1;
        j.appended += 1;
        if j.lines > COMPACT_SLACK + 2 * map.len() {
            j.file = Arc::new(Self::write_index(&self.root, map)?);
            j.lines = map.len();
            // every line so far is in the new index, which write_index synced
            j.durable = j.appended;
        }
        Ok(())
    }

    /// Changes only the in-memory timestamps of an entry (last access, last write): they guide
    /// eviction and write-back timing, and reach the disk with the next real change.
    pub fn touch(&self, ino: Ino, f: impl FnOnce(&mut Entry)) {
        if let Some(e) = self.entries.lock().get_mut(&ino) {
            f(e);
        }
    }

    /// Makes an entry's description durable (the application asked for durability): the
    /// index journal (every change so far) and the data directory (the cached file's name).
    /// Each is synced only if something was added to it since its last sync (an fsync of a
    /// file appending again, or of a file whose name is older than the directory's last sync,
    /// costs no sync of the directory), and one sync serves every fsync waiting for it.
    pub fn sync_entry(&self, _ino: Ino) -> Result<()> {
        let mut dir_synced = self.syncing.lock();
        // The lines appended before this call (this entry's among them) and more.
        let pending = {
            let j = self.journal.lock();
            (j.durable < j.appended).then(|| (Arc::clone(&j.file), j.appended))
        };
        if let Some((file, upto)) = pending {
            // without the journal's lock: changes go on being appended meanwhile
            file.sync_data()
                .map_err(|e| io(&self.root.join("index"), e))?;
            self.index_syncs.fetch_add(1, SeqCst);
            let mut j = self.journal.lock();
            j.durable = j.durable.max(upto);
        }
        let names = self.names_made.load(SeqCst);
        if *dir_synced < names {
            let data = self.root.join("data");
            File::open(&data)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(&data, e))?;
            self.dir_syncs.fetch_add(1, SeqCst);
            *dir_synced = names;
        }
        Ok(())
    }

    /// (fdatasyncs of the index, fsyncs of the data directory) done since the store opened.
    pub fn sync_counts(&self) -> (u64, u64) {
        (self.index_syncs.load(SeqCst), self.dir_syncs.load(SeqCst))
    }

    pub fn get(&self, ino: Ino) -> Option<Entry> {
        self.entries.lock().get(&ino).cloned()
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().values().cloned().collect()
    }

    /// Records (and persists) an entry.
    pub fn put(&self, e: Entry) -> Result<()> {
        let ino = e.ino;
        {
            let mut map = self.entries.lock();
            let old = map.insert(ino, e.clone());
            if let Err(er) = self.log(&map, &Record::Put(e)) {
                match old {
                    Some(o) => map.insert(ino, o),
                    None => map.remove(&ino),
                };
                return Err(er);
            }
        }
        self.note_size(ino);
        Ok(())
    }

    /// Changes an entry in place and persists it, atomically with respect to other updates
    /// (the map stays locked from read to write, so concurrent updates never lose each other).
    pub fn update(&self, ino: Ino, f: impl FnOnce(&mut Entry)) -> Result<Entry> {
        let mut map = self.entries.lock();
        let old = map.get(&ino).cloned().ok_or(CacheError::NotCached(ino))?;
        let mut e = old.clone();
        f(&mut e);
        map.insert(ino, e.clone());
        if let Err(er) = self.log(&map, &Record::Put(e.clone())) {
            map.insert(ino, old);
            return Err(er);
        }
        Ok(e)
    }

    /// Makes empty spare files until `want` are ready (see `spares`); how many it made.
    /// Stops at the first failure (a full disk), which it returns. A filesystem without
    /// unnamed files turns spares off (see `spares_off`).
    pub fn top_up_spares(&self, want: usize) -> Result<usize> {
        let mut made = 0;
        let dir = self.root.join("data");
        while !self.spares_off.load(SeqCst) && self.spares.lock().len() < want {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_TMPFILE)
                .mode(0o600)
                .open(&dir)
            {
                Ok(f) => {
                    self.spares.lock().push(f);
                    made += 1;
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
                    tracing::info!("cache directory: no unnamed files ({e}): no spare files");
                    self.spares_off.store(true, SeqCst);
                }
                Err(e) => return Err(io(&dir, e)),
            }
        }
        Ok(made)
    }

    /// Gives spare `f` the name `p` (`linkat` of its descriptor; fails with EEXIST when `p`
    /// exists).
    fn link_spare(f: &File, p: &Path) -> std::io::Result<()> {
        use std::ffi::CString;
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let to = CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a descriptor this store owns, an empty NUL-terminated path and a
        // NUL-terminated target path, all alive across the call.
        let r = unsafe {
            libc::linkat(
                f.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// (spares ready, creates that took one so far)
    pub fn spare_counts(&self) -> (usize, u64) {
        (self.spares.lock().len(), self.spares_taken.load(SeqCst))
    }

    /// Creates an empty data file for `ino` (replacing any old one), private to the daemon:
    /// a spare linked into place when one is ready, else a new file.
    pub fn create_data(&self, ino: Ino) -> Result<File> {
        let p = self.data_path(ino);
        let spare = self.spares.lock().pop();
        if let Some(f) = spare {
            // Never over an existing file (a descriptor may read it): that one is truncated in
            // place below, as before spares. (A spare is made empty, nothing writes it before
            // this, and it is not truncated: ext4 would start writing back a file truncated to
            // nothing at its close.)
            match Self::link_spare(&f, &p) {
                Ok(()) => {
                    self.names_made.fetch_add(1, SeqCst);
                    self.spares_taken.fetch_add(1, SeqCst);
                    return Ok(f);
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    // (`data/` had the name) kept for the next create
                    self.spares.lock().push(f);
                }
                Err(e) => {
                    // (e.g. no CAP_DAC_READ_SEARCH for a link of a descriptor)
                    tracing::info!("cache directory: spare files cannot be linked ({e}): none");
                    self.spares_off.store(true, SeqCst);
                    self.spares.lock().clear();
                }
            }
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)
            .map_err(|e| io(&p, e))?;
        // (counted once made: a sync that reads the count after this covers the name)
        self.names_made.fetch_add(1, SeqCst);
        Ok(f)
    }

    /// Opens the cached data of `ino`.
    pub fn open_data(&self, ino: Ino, write: bool) -> Result<File> {
        let p = self.data_path(ino);
        OpenOptions::new()
            .read(true)
            .write(write)
            .open(&p)
            .map_err(|e| io(&p, e))
    }

    /// Drops a cached file.
    pub fn remove(&self, ino: Ino) {
        self.forget(ino);
        let _ = fs::remove_file(self.data_path(ino));
    }

    /// Drops an entry from the map and the index (a failed append is logged: the data file
    /// goes after this, and an entry without data is dropped at the next load).
    fn forget(&self, ino: Ino) {
        let mut map = self.entries.lock();
        if map.remove(&ino).is_some() {
            if let Err(e) = self.log(&map, &Record::Del(ino)) {
                tracing::warn!(ino, "cache index: {e}");
            }
        }
        self.sizes.lock().remove(ino);
    }

    /// Moves dirty data that cannot be given back out of the way, for an operator.
    pub fn quarantine(&self, ino: Ino) -> PathBuf {
        let dst = self
            .root
            .join("quarantine")
            .join(format!("{ino}-{}", tierfs_meta::now_nanos()));
        let _ = fs::rename(self.data_path(ino), &dst);
        self.forget(ino);
        dst
    }

    /// Bytes of cached data (allocated blocks, so sparse copies count what they use), as last
    /// measured (see `sizes`).
    pub fn used(&self) -> u64 {
        self.sizes.lock().total
    }

    /// Bytes the cache files attached by `rule` take on disk, as last measured, and how many
    /// files they are.
    pub fn used_by_rule(&self, rule: u64) -> (u64, usize) {
        let inos: Vec<Ino> = self
            .entries
            .lock()
            .values()
            .filter(|e| e.rule == Some(rule))
            .map(|e| e.ino)
            .collect();
        let sizes = self.sizes.lock();
        let bytes = inos.iter().filter_map(|i| sizes.of.get(i)).sum();
        (bytes, inos.len())
    }

    /// Measures again what a cached file takes on disk (after writes to it ended, or while
    /// they go on).
    pub fn note_size(&self, ino: Ino) {
        let bytes = self.disk_bytes(ino);
        // (entries, then sizes: the one lock order) so a concurrent removal leaves no size
        let entries = self.entries.lock();
        if entries.contains_key(&ino) {
            self.sizes.lock().set(ino, bytes);
        }
    }

    /// Bytes one cache file takes on disk (allocated blocks: a sparse file counts what it holds).
    pub fn disk_bytes(&self, ino: Ino) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(self.data_path(ino))
            .map(|m| m.blocks() * 512)
            .unwrap_or(0)
    }

    pub fn size_of(&self, ino: Ino) -> u64 {
        fs::metadata(self.data_path(ino))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// Entries that may be evicted to make room, in eviction order: never pinned ones, never
    /// those in `busy` (open now); RW entries come after RO ones (they must be written back).
    pub fn eviction_order(&self, policy: Eviction, busy: &dyn Fn(Ino) -> bool) -> Vec<Entry> {
        let mut v: Vec<Entry> = self
            .entries()
            .into_iter()
            .filter(|e| !e.pinned && !busy(e.ino))
            .collect();
        match policy {
            Eviction::Lru => v.sort_by_key(|e| (e.mode == Mode::Rw, e.last_access)),
            Eviction::Size => {
                v.sort_by_key(|e| (e.mode == Mode::Rw, std::cmp::Reverse(self.size_of(e.ino))))
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ino: Ino, mode: Mode, last_access: i64) -> Entry {
        Entry {
            ino,
            mode,
            version: 1,
            generation: 0,
            dirty: false,
            pinned: false,
            complete: true,
            last_access,
            last_write: 0,
            rule: None,
            size: 0,
            crc: None,
        }
    }

    #[test]
    fn entries_survive_a_reopen_and_leftovers_go() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = CacheStore::open(d.path(), "fs", 1 << 20).unwrap();
            let mut f = s.create_data(7).unwrap();
            f.write_all(b"hello").unwrap();
            s.put(entry(7, Mode::Rw, 5)).unwrap();
            s.update(7, |e| e.dirty = true).unwrap();
            // an attach that died before describing its data (empty: just removed), and data
            // whose description was lost (kept aside)
            s.create_data(8).unwrap();
            s.create_data(10).unwrap().write_all(b"orphan").unwrap();
            // and a description torn by power loss (its data is kept aside too)
            s.create_data(9).unwrap().write_all(b"torn").unwrap();
            let mut ix = OpenOptions::new()
                .append(true)
                .open(d.path().join("fs/index"))
                .unwrap();
            ix.write_all(b"{\"put\":{\"ino\":9,\"mo").unwrap();
        }
        let s = CacheStore::open(d.path(), "fs", 1 << 20).unwrap();
        let e = s.get(7).unwrap();
        assert!(e.dirty);
        assert_eq!(e.mode, Mode::Rw);
        assert_eq!(std::fs::read(s.data_path(7)).unwrap(), b"hello");
        assert!(!s.data_path(8).exists());
        assert!(!s.data_path(10).exists());
        assert!(s.get(9).is_none());
        let kept: Vec<_> = std::fs::read_dir(d.path().join("fs/quarantine"))
            .unwrap()
            .collect();
        assert_eq!(
            kept.len(),
            2,
            "undescribed data is quarantined, not deleted"
        );
        // the index was rewritten whole: the torn line is gone
        let ix = std::fs::read_to_string(d.path().join("fs/index")).unwrap();
        assert_eq!(ix.lines().count(), 1, "{ix}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.path().join("fs"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn fsync_syncs_only_what_changed_since_the_last_sync() {
        let d = tempfile::tempdir().unwrap();
        let s = CacheStore::open(d.path(), "fs", 1 << 30).unwrap();
        // a new cached file: its description and its name
        s.create_data(1).unwrap();
        s.put(entry(1, Mode::Rw, 1)).unwrap();
        s.sync_entry(1).unwrap();
        assert_eq!(s.sync_counts(), (1, 1));
        // nothing changed since: no sync at all
        s.sync_entry(1).unwrap();
        assert_eq!(s.sync_counts(), (1, 1));
        // its description changed, its name did not: the index only
        s.update(1, |e| e.dirty = true).unwrap();
        s.sync_entry(1).unwrap();
        assert_eq!(s.sync_counts(), (2, 1));
        // another file's name made since: the directory too
        s.create_data(2).unwrap();
        s.put(entry(2, Mode::Rw, 1)).unwrap();
        s.sync_entry(2).unwrap();
        assert_eq!(s.sync_counts(), (3, 2));
        // a removal needs neither for the files that stay
        s.remove(2);
        s.sync_entry(1).unwrap();
        assert_eq!(
            s.sync_counts(),
            (4, 2),
            "the removal's line is synced, not the directory"
        );
        // through a compaction (the index rewritten into a new, synced file): the lines
        // appended to the new file after it are synced, in that file
        for i in 0..(COMPACT_SLACK as u64 + 10) {
            s.update(1, |e| e.last_write = i as i64).unwrap();
        }
        s.sync_entry(1).unwrap();
        assert_eq!(s.sync_counts(), (5, 2));
    }

    #[test]
    fn changes_are_one_journal_and_it_is_compacted() {
        let d = tempfile::tempdir().unwrap();
        let n = COMPACT_SLACK as u64 + 100;
        {
            let s = CacheStore::open(d.path(), "fs", 1 << 30).unwrap();
            for ino in 1..=n {
                s.create_data(ino).unwrap();
                s.put(entry(ino, Mode::Rw, 1)).unwrap();
                s.update(ino, |e| e.dirty = true).unwrap();
                if ino % 2 == 0 {
                    s.remove(ino);
                }
            }
            // one local file per cached file: no description files
            let files = std::fs::read_dir(d.path().join("fs")).unwrap().count();
            assert_eq!(files, 3, "data, quarantine, index");
            let lines = std::fs::read_to_string(d.path().join("fs/index"))
                .unwrap()
                .lines()
                .count();
            assert!(
                lines <= COMPACT_SLACK + 2 * s.entries().len(),
                "compacted: {lines} lines for {} entries",
                s.entries().len()
            );
            assert!(lines > 0);
        }
        let s = CacheStore::open(d.path(), "fs", 1 << 30).unwrap();
        assert_eq!(s.entries().len() as u64, n / 2);
        for ino in 1..=n {
            match s.get(ino) {
                Some(e) => assert!(ino % 2 == 1 && e.dirty && e.mode == Mode::Rw),
                None => assert_eq!(ino % 2, 0),
            }
        }
    }

    #[test]
    fn descriptions_of_the_older_layout_are_moved_into_the_index() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("fs");
        std::fs::create_dir_all(root.join("meta")).unwrap();
        std::fs::create_dir_all(root.join("data")).unwrap();
        let mut e = entry(3, Mode::Rw, 7);
        e.dirty = true;
        e.generation = 4;
        std::fs::write(root.join("meta/3.json"), serde_json::to_vec(&e).unwrap()).unwrap();
        std::fs::write(root.join("data/3"), b"dirty bytes").unwrap();
        std::fs::write(root.join("meta/5.json"), b"{torn").unwrap();
        {
            let s = CacheStore::open(d.path(), "fs", 1 << 20).unwrap();
            assert_eq!(s.get(3), Some(e.clone()));
            assert_eq!(s.entries().len(), 1);
            assert!(!root.join("meta").exists(), "migrated: the old files go");
        }
        // and it stays there on the next open
        let s = CacheStore::open(d.path(), "fs", 1 << 20).unwrap();
        assert_eq!(s.get(3), Some(e));
        assert_eq!(std::fs::read(s.data_path(3)).unwrap(), b"dirty bytes");
    }

    #[test]
    fn eviction_skips_pinned_and_busy_and_puts_rw_last() {
        let d = tempfile::tempdir().unwrap();
        let s = CacheStore::open(d.path(), "fs", 1 << 20).unwrap();
        for (ino, mode, t) in [
            (1, Mode::Ro, 30),
            (2, Mode::Ro, 10),
            (3, Mode::Rw, 5),
            (4, Mode::Ro, 1),
        ] {
            s.create_data(ino)
                .unwrap()
                .write_all(&vec![0u8; ino as usize * 100])
                .unwrap();
            s.put(entry(ino, mode, t)).unwrap();
        }
        s.update(4, |e| e.pinned = true).unwrap();
        let busy = |ino: Ino| ino == 1;
        let lru: Vec<Ino> = s
            .eviction_order(Eviction::Lru, &busy)
            .iter()
            .map(|e| e.ino)
            .collect();
        assert_eq!(lru, vec![2, 3]);
        let none = |_: Ino| false;
        let size: Vec<Ino> = s
            .eviction_order(Eviction::Size, &none)
            .iter()
            .map(|e| e.ino)
            .collect();
        assert_eq!(size, vec![2, 1, 3]);
    }

    #[test]
    fn use_is_counted_per_rule() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let s = CacheStore::open(d.path(), "fs", 1 << 30).unwrap();
        for (ino, rule, len) in [(1, Some(7), 8192), (2, Some(7), 4096), (3, None, 4096)] {
            s.create_data(ino)
                .unwrap()
                .write_all(&vec![1u8; len])
                .unwrap();
            let mut e = entry(ino, Mode::Ro, 0);
            e.rule = rule;
            s.put(e).unwrap();
        }
        let (bytes, files) = s.used_by_rule(7);
        assert_eq!(files, 2);
        // allocated blocks: at least the bytes written, and part of the whole cache's use
        assert!(
            bytes >= 12288 && bytes < s.used(),
            "{bytes} of {}",
            s.used()
        );
        assert_eq!(s.used_by_rule(8), (0, 0));
        s.remove(1);
        assert_eq!(s.used_by_rule(7).1, 1);
        // growth through writes the store does not see counts once it is measured again
        let before = s.used();
        s.open_data(2, true)
            .unwrap()
            .write_all_at(&vec![2u8; 1 << 20], 4096)
            .unwrap();
        assert_eq!(s.used(), before, "not measured yet");
        s.note_size(2);
        assert!(s.used() >= before + (1 << 20), "{} after growth", s.used());
        // a removed file's size is forgotten, and noting it again does not bring it back
        s.remove(2);
        s.note_size(2);
        assert_eq!(s.used_by_rule(7), (0, 0));
        assert_eq!(s.used(), s.disk_bytes(3));
    }

    #[test]
    fn the_use_kept_is_the_sum_of_the_files() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let sum = |s: &CacheStore| -> u64 { s.entries().iter().map(|e| s.disk_bytes(e.ino)).sum() };
        let s = CacheStore::open(d.path(), "fs", 1 << 30).unwrap();
        for ino in 1..=20u64 {
            s.create_data(ino)
                .unwrap()
                .write_all(&vec![7u8; ino as usize * 3000])
                .unwrap();
            s.put(entry(ino, Mode::Rw, 0)).unwrap();
        }
        assert_eq!(s.used(), sum(&s));
        // growth, a second put of the same file, removals, a quarantine, a file measured
        // again after it shrank
        s.open_data(3, true)
            .unwrap()
            .write_all_at(&[1u8; 100_000], 0)
            .unwrap();
        s.note_size(3);
        s.put(entry(3, Mode::Rw, 1)).unwrap();
        s.remove(5);
        s.remove(5);
        let _ = s.quarantine(6);
        s.open_data(20, true).unwrap().set_len(0).unwrap();
        s.note_size(20);
        assert_eq!(s.used(), sum(&s));
        drop(s);
        // and after a reopen
        let s = CacheStore::open(d.path(), "fs", 1 << 30).unwrap();
        assert_eq!(s.entries().len(), 18);
        assert_eq!(s.used(), sum(&s));
    }

    #[test]
    fn creates_take_spares_made_ahead_and_never_replace_a_file() {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let s = CacheStore::open(dir.path(), "fs", 1 << 30).unwrap();
        let data_dir = dir.path().join("fs").join("data");
        let names = || fs::read_dir(&data_dir).unwrap().count();
        assert_eq!(s.top_up_spares(3).unwrap(), 3);
        assert_eq!(s.top_up_spares(3).unwrap(), 0, "already 3");
        assert_eq!(s.spare_counts(), (3, 0));
        assert_eq!(names(), 0, "spares have no names");
        // a create takes one: the data file is empty, private, and is the spare itself
        let mut f = s.create_data(7).unwrap();
        assert_eq!(s.spare_counts(), (2, 1));
        assert_eq!(names(), 1);
        let m = fs::metadata(s.data_path(7)).unwrap();
        assert_eq!((m.len(), m.mode() & 0o777, m.nlink()), (0, 0o600, 1));
        assert_eq!(
            f.metadata().unwrap().ino(),
            m.ino(),
            "the descriptor is the file's"
        );
        f.write_all(b"abc").unwrap();
        assert_eq!(fs::read(s.data_path(7)).unwrap(), b"abc");
        // a create over an existing data file truncates that file in place (a descriptor on
        // it sees it), as without spares; the spare stays ready
        let ino_before = fs::metadata(s.data_path(7)).unwrap().ino();
        let _g = s.create_data(7).unwrap();
        assert_eq!(fs::metadata(s.data_path(7)).unwrap().ino(), ino_before);
        assert_eq!(s.spare_counts(), (2, 1));
        let mut back = Vec::new();
        f.rewind().unwrap();
        f.read_to_end(&mut back).unwrap();
        assert!(back.is_empty(), "the old descriptor sees the truncation");
        // spares do not outlive their store; an older version's named ones are removed
        drop(s);
        let old = dir.path().join("fs").join("spare").join("0");
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join("99"), b"").unwrap();
        let s = CacheStore::open(dir.path(), "fs", 1 << 30).unwrap();
        assert!(!dir.path().join("fs").join("spare").exists());
        assert_eq!(s.spare_counts(), (0, 0));
        // (data/7 was never described in the index: empty, it went at load)
        assert_eq!(names(), 0, "no spare got a name");
        // no spare ready: a create makes the file
        s.create_data(8).unwrap();
        assert_eq!(s.spare_counts(), (0, 0));
        assert!(s.data_path(8).exists());
    }

    #[test]
    fn quarantine_keeps_the_bytes() {
        let d = tempfile::tempdir().unwrap();
        let s = CacheStore::open(d.path(), "fs", 1 << 20).unwrap();
        s.create_data(5).unwrap().write_all(b"precious").unwrap();
        s.put(entry(5, Mode::Rw, 0)).unwrap();
        let q = s.quarantine(5);
        assert_eq!(std::fs::read(q).unwrap(), b"precious");
        assert!(s.get(5).is_none());
    }
}
