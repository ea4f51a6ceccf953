//! A SQLite VFS that writes each transaction's write-ahead-log frames with one `pwrite`.
//!
//! SQLite appends a committed transaction to the WAL as frames, each a 24-byte header and a
//! page, and writes each with its own `pwrite`: a small file's create and the commit of its
//! inline data (1 KiB pages, `super::SqliteEngine::connect`) made 60–120 system calls per
//! file, 49 µs of the 90 µs an inline 32 KiB commit took on this machine's ext4 (one `pwrite`
//! of the same bytes: 5 µs). This VFS is the default `unix` VFS with the WAL file's writes
//! gathered: frames appended at the log's end stay in memory until the **commit frame** (a
//! header whose "database size" field is set, SQLite's mark of a transaction's last frame)
//! has its page, then go to the file in one `pwrite`, before SQLite publishes the frames in
//! the shared WAL index (which it does only after writing all of them, `walFrames` in
//! sqlite3.c). So whenever another connection or process can see a frame, its bytes are in
//! the file, and a transaction whose commit returned has nothing left in memory (a `kill -9`
//! right after loses nothing; a power loss loses what an unsynced `pwrite` would have).
//!
//! Everything else writes through, after what is gathered: a write that is not an append at
//! the end (a rewrite of a header's checksums, the log's header at offset 0 when it restarts,
//! another process's frames in between), and what is gathered is written before any read,
//! sync, truncate, size query, file control, memory map or close of the file, and past
//! [`GATHER_LIMIT`]. A write that fails drops what was gathered (SQLite rolls the
//! transaction back; frames past the published end of the log are never read).
//!
//! Only files opened as WAL (`SQLITE_OPEN_WAL`) are gathered; the database, the shared index
//! and everything else go straight to the `unix` VFS.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The VFS's name (`sqlite3_vfs_find`, `Connection::open_with_flags_and_vfs`).
pub const NAME: &str = "tierfs-walbatch";
const NAME_C: &CStr = c"tierfs-walbatch";

/// Gathered bytes written out at most this late (a transaction larger than the page cache
/// spills frames before its commit).
const GATHER_LIMIT: usize = 4 << 20;

/// The largest write the `unix` VFS takes in one call: it masks a write's length with
/// `0x1ffff` (`seekAndWriteFd`), so a longer one would be cut and reported as a full disk.
const WRITE_MAX: usize = 124 << 10;

/// `pwrite`s of gathered frames, and the frames' writes they replaced (for tests and
/// `tierfs bench`-style checks): (gathered writes, writes gathered into them).
static FLUSHES: AtomicU64 = AtomicU64::new(0);
static GATHERED: AtomicU64 = AtomicU64::new(0);

/// (gathered `pwrite`s, SQLite writes they replaced) since the process started.
pub fn counts() -> (u64, u64) {
    (
        FLUSHES.load(Ordering::Relaxed),
        GATHERED.load(Ordering::Relaxed),
    )
}

/// Registers the VFS (once per process); its name, or `None` when the default VFS is not
/// SQLite's `unix` (whose methods this one delegates to, and whose VFS-level methods ignore
/// the VFS pointer they are given), or when the environment says `TIERFS_SQLITE_VFS=unix`
/// (SQLite's own, for comparisons): connections then open on the default.
pub fn vfs() -> Option<&'static str> {
    if std::env::var_os("TIERFS_SQLITE_VFS").is_some_and(|v| v == "unix") {
        return None;
    }
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| unsafe { register() });
    ok.then_some(NAME)
}

/// # Safety
/// Called once (through the `OnceLock` above).
unsafe fn register() -> bool {
    if ffi::sqlite3_initialize() != ffi::SQLITE_OK {
        return false;
    }
    let real = ffi::sqlite3_vfs_find(std::ptr::null());
    if real.is_null() || CStr::from_ptr((*real).zName).to_bytes() != b"unix" {
        return false;
    }
    let mut v: ffi::sqlite3_vfs = *real;
    v.pNext = std::ptr::null_mut();
    v.zName = NAME_C.as_ptr();
    v.pAppData = real.cast();
    v.szOsFile = (std::mem::size_of::<Shim>() + (*real).szOsFile as usize) as c_int;
    v.xOpen = Some(x_open);
    // Lives as long as the process: SQLite keeps the pointer.
    let v = Box::leak(Box::new(v));
    ffi::sqlite3_vfs_register(v, 0) == ffi::SQLITE_OK
}

/// What SQLite allocates for a file of this VFS (`szOsFile` bytes): the shim, then the `unix`
/// VFS's own file.
#[repr(C)]
struct Shim {
    /// Must come first: SQLite sees a `sqlite3_file`.
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// WAL files only (null otherwise).
    gather: *mut Gather,
}

#[derive(Default)]
struct Gather {
    buf: Vec<u8>,
    /// The file offset of `buf[0]`.
    start: i64,
    /// Where the last write to the file ended (its next append goes there).
    end: Option<i64>,
    /// The last write was a commit frame's header: the next (its page) ends the transaction.
    commit_header: bool,
}

unsafe fn real(f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    (*f.cast::<Shim>()).real
}

unsafe fn methods(f: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    &*(*real(f)).pMethods
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
    let shim = file.cast::<Shim>();
    let inner = file
        .cast::<u8>()
        .add(std::mem::size_of::<Shim>())
        .cast::<ffi::sqlite3_file>();
    (*shim).base.pMethods = std::ptr::null();
    (*shim).real = inner;
    (*shim).gather = std::ptr::null_mut();
    let Some(open) = (*real_vfs).xOpen else {
        return ffi::SQLITE_CANTOPEN;
    };
    let rc = open(real_vfs, name, inner, flags, out_flags);
    if rc != ffi::SQLITE_OK || (*inner).pMethods.is_null() {
        // (SQLite calls xClose only when pMethods is set)
        return rc;
    }
    if flags & ffi::SQLITE_OPEN_WAL != 0 {
        (*shim).gather = Box::into_raw(Box::default());
    }
    (*shim).base.pMethods = &METHODS;
    rc
}

/// Writes what is gathered, if anything; on failure drops it.
unsafe fn flush(f: *mut ffi::sqlite3_file) -> c_int {
    let g = (*f.cast::<Shim>()).gather;
    if g.is_null() || (*g).buf.is_empty() {
        return ffi::SQLITE_OK;
    }
    let g = &mut *g;
    let Some(write) = methods(f).xWrite else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let mut rc = ffi::SQLITE_OK;
    let mut off = g.start;
    for piece in g.buf.chunks(WRITE_MAX) {
        rc = write(real(f), piece.as_ptr().cast(), piece.len() as c_int, off);
        if rc != ffi::SQLITE_OK {
            break;
        }
        off += piece.len() as i64;
    }
    g.buf.clear();
    FLUSHES.fetch_add(1, Ordering::Relaxed);
    rc
}

unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    data: *const c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    let g = (*f.cast::<Shim>()).gather;
    let bytes = std::slice::from_raw_parts(data.cast::<u8>(), amt.max(0) as usize);
    let header = |b: &[u8]| b.len() == 24 && b[4..8] != [0, 0, 0, 0];
    if !g.is_null() {
        let gr = &mut *g;
        let appends =
            gr.end == Some(off) && (gr.buf.is_empty() || gr.start + gr.buf.len() as i64 == off);
        if appends && amt > 0 {
            if gr.buf.is_empty() {
                gr.start = off;
            }
            gr.buf.extend_from_slice(bytes);
            gr.end = Some(off + amt as i64);
            GATHERED.fetch_add(1, Ordering::Relaxed);
            let ends_commit = gr.commit_header && bytes.len() != 24;
            gr.commit_header = header(bytes);
            if ends_commit || gr.buf.len() >= GATHER_LIMIT {
                return flush(f);
            }
            return ffi::SQLITE_OK;
        }
        let rc = flush(f);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        gr.end = Some(off + amt as i64);
        gr.commit_header = header(bytes);
    }
    match methods(f).xWrite {
        Some(w) => w(real(f), data, amt, off),
        None => ffi::SQLITE_IOERR_WRITE,
    }
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    let flushed = flush(f);
    let g = (*f.cast::<Shim>()).gather;
    if !g.is_null() {
        drop(Box::from_raw(g));
        (*f.cast::<Shim>()).gather = std::ptr::null_mut();
    }
    let rc = match methods(f).xClose {
        Some(c) => c(real(f)),
        None => ffi::SQLITE_OK,
    };
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        rc
    }
}

/// Every method but write and close: what is gathered goes first (for those that see the
/// file's contents or state), then the `unix` VFS's own method.
macro_rules! after_flush {
    ($name:ident, $field:ident, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            let rc = flush(f);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            match methods(f).$field {
                Some(m) => m(real(f) $(, $arg)*),
                None => ffi::SQLITE_MISUSE,
            }
        }
    };
}

macro_rules! through {
    ($name:ident, $field:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            match methods(f).$field {
                Some(m) => m(real(f) $(, $arg)*),
                None => $missing,
            }
        }
    };
}

after_flush!(x_read, xRead, (buf: *mut c_void, amt: c_int, off: ffi::sqlite3_int64));
after_flush!(x_sync, xSync, (flags: c_int));
after_flush!(x_file_size, xFileSize, (size: *mut ffi::sqlite3_int64));
after_flush!(x_file_control, xFileControl, (op: c_int, arg: *mut c_void));
after_flush!(x_fetch, xFetch, (off: ffi::sqlite3_int64, amt: c_int, pp: *mut *mut c_void));
through!(x_lock, xLock, (level: c_int), ffi::SQLITE_OK);
through!(x_unlock, xUnlock, (level: c_int), ffi::SQLITE_OK);
through!(x_check_reserved, xCheckReservedLock, (out: *mut c_int), ffi::SQLITE_OK);
through!(x_sector_size, xSectorSize, (), 4096);
through!(x_device, xDeviceCharacteristics, (), 0);
through!(x_shm_map, xShmMap, (pg: c_int, pgsz: c_int, extend: c_int, pp: *mut *mut c_void), ffi::SQLITE_IOERR_SHMMAP);
through!(x_shm_lock, xShmLock, (off: c_int, n: c_int, flags: c_int), ffi::SQLITE_IOERR_SHMLOCK);
through!(x_shm_unmap, xShmUnmap, (delete: c_int), ffi::SQLITE_OK);
through!(x_unfetch, xUnfetch, (off: ffi::sqlite3_int64, p: *mut c_void), ffi::SQLITE_OK);

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let rc = flush(f);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let g = (*f.cast::<Shim>()).gather;
    if !g.is_null() {
        (*g).end = None;
        (*g).commit_header = false;
    }
    match methods(f).xTruncate {
        Some(t) => t(real(f), size),
        None => ffi::SQLITE_IOERR_TRUNCATE,
    }
}

unsafe extern "C" fn x_shm_barrier(f: *mut ffi::sqlite3_file) {
    if let Some(b) = methods(f).xShmBarrier {
        b(real(f))
    }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};
    use std::path::Path;

    /// A connection through this VFS, in WAL mode with 1 KiB pages (as the engine's).
    fn gathered(path: &Path) -> Connection {
        let c = Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::default(),
            vfs().expect("the unix VFS is the default here"),
        )
        .unwrap();
        c.pragma_update(None, "page_size", 1024).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.pragma_update(None, "synchronous", "NORMAL").unwrap();
        c.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        c
    }

    /// A connection through SQLite's own VFS: it reads only what is in the files.
    fn plain(path: &Path) -> Connection {
        Connection::open(path).unwrap()
    }

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*), sum(length(b)) FROM t", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap()
    }

    fn ok(c: &Connection) {
        let r: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(r, "ok");
    }

    #[test]
    fn a_committed_transaction_is_in_the_file_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.db");
        let w = gathered(&p);
        w.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, b BLOB)")
            .unwrap();
        // Another connection reads the log before the writer ever closes.
        let r = plain(&p);
        assert_eq!(count(&r), 0);
        let (f0, g0) = counts();
        w.execute("INSERT INTO t (b) VALUES (zeroblob(32768))", [])
            .unwrap();
        let (f1, g1) = counts();
        assert_eq!(count(&r), 1, "the commit is in the file when it returns");
        // (other tests' connections may write meanwhile: at least this one's)
        assert!(f1 > f0, "a gathered write");
        assert!(
            g1 - g0 >= 2 * 32,
            "32 KiB of 1 KiB pages is 32 frames of a header and a page each, gathered: {}",
            g1 - g0
        );
        // The writer goes away without closing (a process killed right after its commit):
        // nothing was left in its memory.
        std::mem::forget(w);
        let again = plain(&p);
        assert_eq!(count(&again), 1);
        ok(&again);
    }

    #[test]
    fn a_transaction_larger_than_the_cache_reads_its_spilled_frames_and_can_roll_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.db");
        let w = gathered(&p);
        w.pragma_update(None, "cache_size", 16).unwrap();
        w.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, b BLOB)")
            .unwrap();
        let fill = |c: &Connection, n: usize| {
            for i in 0..n {
                c.execute(
                    "INSERT INTO t (b) VALUES (?1)",
                    [vec![(i % 251) as u8; 700 + i % 900]],
                )
                .unwrap();
            }
        };
        w.execute_batch("BEGIN").unwrap();
        fill(&w, 3000);
        // Pages spilled to the log are read back inside the transaction.
        let sum: i64 = w
            .query_row("SELECT sum(length(b)) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sum, (0..3000).map(|i| 700 + i % 900).sum::<usize>() as i64);
        w.execute_batch("COMMIT").unwrap();
        w.execute_batch("BEGIN").unwrap();
        fill(&w, 2000);
        w.execute_batch("ROLLBACK").unwrap();
        fill(&w, 10);
        assert_eq!(count(&w), 3010);
        let r = plain(&p);
        assert_eq!(count(&r), 3010);
        ok(&r);
        drop(w);
        ok(&plain(&p));
    }

    #[test]
    fn two_writers_and_checkpoints_that_restart_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.db");
        let a = gathered(&p);
        a.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, b BLOB)")
            .unwrap();
        let b = gathered(&p);
        b.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        let mut n = 0;
        for round in 0..30 {
            // Each appends after the other's frames (not at the end it last wrote).
            for c in [&a, &b] {
                c.execute("INSERT INTO t (b) VALUES (zeroblob(3000))", [])
                    .unwrap();
                n += 1;
            }
            match round % 3 {
                // The log starts again from its beginning after a full checkpoint.
                0 => {
                    a.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        .unwrap();
                }
                1 => {
                    b.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                        .unwrap();
                }
                _ => {}
            }
            assert_eq!(count(&plain(&p)), n);
        }
        ok(&a);
        drop((a, b));
        let r = plain(&p);
        assert_eq!(count(&r), n);
        ok(&r);
    }
}
