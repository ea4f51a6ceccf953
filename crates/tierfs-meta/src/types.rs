//! The records the metadata engine stores: inodes, layouts, slices, sessions, locks.

use serde::{Deserialize, Serialize};

/// Inode number. The root directory is [`ROOT_INO`].
pub type Ino = u64;
pub const ROOT_INO: Ino = 1;
/// Longest name of one directory entry, in bytes.
pub const NAME_MAX: usize = 255;

/// Nanoseconds since the Unix epoch.
pub type Nanos = i64;

pub fn now_nanos() -> Nanos {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    d.as_nanos() as Nanos
}

/// The type of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl Kind {
    pub fn from_i64(v: i64) -> Option<Kind> {
        Some(match v {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => return None,
        })
    }
    /// The kind encoded in the S_IFMT bits of a mode.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            0 => Kind::File,
            _ => return None,
        })
    }
}

/// How a file's data is striped: chunk `i` (bytes `[i*stripe_size, (i+1)*stripe_size)`) lives on
/// `targets[i % targets.len()]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub stripe_size: u64,
    pub targets: Vec<u32>,
}

impl Layout {
    pub fn stripe_count(&self) -> u32 {
        self.targets.len() as u32
    }
    pub fn target_of_chunk(&self, chunk: u64) -> u32 {
        if self.targets.is_empty() {
            return 0;
        }
        self.targets[(chunk % self.targets.len() as u64) as usize]
    }
    pub fn encode_targets(&self) -> String {
        self.targets
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
    pub fn decode_targets(s: &str) -> Vec<u32> {
        s.split(',').filter_map(|x| x.parse().ok()).collect()
    }
}

/// A directory's default layout for new children (`tierfs setstripe DIR`). 0 means "inherit".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeDefault {
    pub stripe_count: u32,
    pub stripe_size: u64,
}

/// The attributes of one inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    /// Permission bits including setuid, setgid and sticky (the low 12 bits of st_mode).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: Nanos,
    pub mtime: Nanos,
    pub ctime: Nanos,
    pub crtime: Nanos,
    pub projid: u32,
    /// Bumped by every change of the file's data; caches compare it (close-to-open, RO-PCC).
    pub data_version: u64,
    /// Files only: where the data lives. Directories: their default for new files, if set.
    pub layout: Option<Layout>,
    pub dir_default: StripeDefault,
    /// Parent directory (directories only; files may have several).
    pub parent: Ino,
    /// Files: bytes that hold data (see [`allocated_bytes`]); st_blocks is this in 512-byte
    /// units. Holes, punched ranges and truncated tails do not count.
    pub allocated: u64,
    /// Files: HSM flags (0 for a file HSM never touched; a RELEASED file's data is in the
    /// archive only, an open or read restores it). See [`crate::hsm`].
    pub hsm: crate::hsm::HsmFlags,
    /// How many extended attributes the inode has (ACLs included; schema v9). Clients answer
    /// "no such attribute" for an inode whose count is 0 without asking the engine, for as
    /// long as they trust its other attributes (docs/semantics.md).
    pub xattr_count: u32,
}

impl Attr {
    /// Whether the inode has any extended attribute.
    pub fn has_xattrs(&self) -> bool {
        self.xattr_count > 0
    }
}

/// A time to set in `setattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Nanos),
}

/// The changes of one `setattr` call; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Nanos>,
    /// A chown by root (who is in every group), as the kernel's rules (fs/attr.c) have it:
    /// unless the file is a directory, its setuid bit goes, and its setgid bit too when
    /// group-execute is set. Read and applied in the setattr's own transaction (the client
    /// need not read the mode first); ignored when `perm` is given.
    pub kill_setid: bool,
    /// The mode, owner and group this change was judged against, for the fields it sets that
    /// must still have them when it lands: a change a client kept to commit later (with the
    /// file's buffered writes) gives way to one another client made meanwhile. `None`: every
    /// field applies.
    pub unless_changed: Option<AttrBase>,
}

/// The values a [`SetAttr`]'s mode, owner and group expect to replace ([`SetAttr::unless_changed`]):
/// each field with a value here applies only if the file still has that value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttrBase {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl SetAttr {
    /// This change as it applies to a file that has `cur` now: a mode, owner or group whose
    /// expected old value ([`SetAttr::unless_changed`]) is no longer the file's is left out.
    pub fn against(&self, cur: &Attr) -> SetAttr {
        let mut s = self.clone();
        if let Some(b) = s.unless_changed.take() {
            let stale = |want: Option<u32>, has: u32| want.is_some_and(|w| w != has);
            let mut dropped = false;
            if stale(b.perm, cur.perm) {
                s.perm = None;
                dropped = true;
            }
            if stale(b.uid, cur.uid) {
                s.uid = None;
                dropped = true;
            }
            if stale(b.gid, cur.gid) {
                s.gid = None;
                dropped = true;
            }
            // (a chown's clearing of setuid/setgid goes with it)
            if dropped {
                s.kill_setid = false;
            }
        }
        s
    }
}

/// A new inode to create.
#[derive(Clone, Debug)]
pub struct NewNode {
    pub kind: Kind,
    /// Permission bits (already masked by the umask).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Symlinks: the target.
    pub symlink: Option<Vec<u8>>,
}

/// One entry of a directory listing. `offset` is the cursor to pass to continue after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: Kind,
    pub offset: u64,
}

/// Where the bytes of one slice are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceData {
    /// Bytes `[obj_off, obj_off + len)` of the immutable object `obj` (of `obj_size` bytes) in
    /// storage target `target`. Several slices may share one object (small writes committed
    /// together); the object is freed when the last of them goes.
    Object {
        target: u32,
        obj: u64,
        obj_off: u64,
        obj_size: u64,
    },
    /// Small-file data kept in the metadata engine itself (Lustre Data-on-MDT).
    Inline(Vec<u8>),
    /// Zeros (a hole punched by truncate or fallocate).
    Zero,
}

/// One write of `len` bytes at `off` inside chunk `chunk` of a file. Within a chunk, later slices
/// (higher `seq`) cover earlier ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Commit order; assigned by the engine.
    pub seq: u64,
    pub chunk: u64,
    pub off: u64,
    pub len: u64,
    pub data: SliceData,
}

impl Slice {
    /// A slice whose bytes are the whole of object `obj` (`len` bytes) on `target`.
    pub fn whole_object(chunk: u64, off: u64, target: u32, obj: u64, len: u64) -> Slice {
        Slice {
            seq: 0,
            chunk,
            off,
            len,
            data: SliceData::Object {
                target,
                obj,
                obj_off: 0,
                obj_size: len,
            },
        }
    }
}

/// An object no longer referenced by any slice, waiting to be deleted from its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrashItem {
    pub id: u64,
    pub target: u32,
    pub obj: u64,
    pub len: u64,
}

/// Filesystem-wide settings chosen at format time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsInfo {
    pub name: String,
    pub uuid: String,
    pub default_stripe_count: u32,
    pub default_stripe_size: u64,
    pub inline_threshold: u64,
    pub created: Nanos,
    pub schema_version: i64,
}

/// One storage target, as recorded at format time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    pub id: u32,
    pub url: String,
    /// Byte limit set with `?capacity=` (0: the backing store's own limit).
    pub capacity: u64,
    /// Bytes referenced by live and not-yet-deleted objects.
    pub used: u64,
    pub objects: u64,
}

/// Parameters of `format`.
#[derive(Clone, Debug)]
pub struct FormatParams {
    pub name: String,
    pub targets: Vec<(String, u64)>,
    pub stripe_count: u32,
    pub stripe_size: u64,
    pub inline_threshold: u64,
    pub force: bool,
}

/// A mounted client, registered with a heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: u64,
    pub client_name: String,
    pub host: String,
    pub pid: u32,
    pub mountpoint: String,
    pub version: String,
    pub started: Nanos,
    pub heartbeat: Nanos,
}

/// One background worker of a client, as the client last reported it (`tierfs status`).
/// Times are the client's, in nanoseconds since the epoch; 0 for never.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The session of the client that runs the worker (set by the engine when read).
    pub session: u64,
    pub name: String,
    /// idle, busy, sleeping or dead.
    pub state: String,
    /// What it is doing or last did ("" if nothing to say).
    pub progress: String,
    pub runs: u64,
    pub errors: u64,
    pub last_run: Nanos,
    pub last_error: Option<String>,
    pub last_error_at: Nanos,
    /// When the client made the report.
    pub reported: Nanos,
}

/// Separates the host name from the process identity in a session's `host` column.
pub const HOST_ID_SEP: char = '#';

impl SessionInfo {
    /// The host name (the `host` column also carries the process's identity after
    /// [`HOST_ID_SEP`]: `name#<boot id>:<pid namespace>:<start time>`, see
    /// `tierfs_client::liveness`).
    pub fn host_name(&self) -> &str {
        self.host
            .split_once(HOST_ID_SEP)
            .map(|(h, _)| h)
            .unwrap_or(&self.host)
    }

    /// The process identity recorded after the host name, if any.
    pub fn process_id(&self) -> Option<&str> {
        self.host.split_once(HOST_ID_SEP).map(|(_, p)| p)
    }

    /// "session N on host H, pid P, at M", for messages.
    pub fn describe(&self) -> String {
        format!(
            "session {} on host {}, pid {}, at {}",
            self.id,
            self.host_name(),
            self.pid,
            self.mountpoint
        )
    }
}

/// Usage counters for statfs/df.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub inodes: u64,
    pub bytes: u64,
}

/// Lock type of an advisory lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockType {
    Read,
    Write,
    Unlock,
}

/// One advisory lock (POSIX byte range or flock, told apart by `flock`). `end` is inclusive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRange {
    pub session: u64,
    pub owner: u64,
    pub flock: bool,
    pub typ: LockType,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// An RW-PCC lease: the file's data lives only in `client`'s cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PccLease {
    pub ino: Ino,
    pub client: String,
    /// Bumped at every attach (Lustre's layout generation).
    pub generation: u64,
    /// The cache may hold data the capacity tier does not have yet: set by the owner's open
    /// for writing in the same transaction as the open ([`crate::Pcc::pcc_open`]), before any
    /// writable descriptor exists; cleared by a write-back with no writer left.
    pub dirty: bool,
    pub acquired: Nanos,
    /// The newest read request ([`PccRecall::seq`]) the owner served with a snapshot: a
    /// write-back of its current data while it keeps the lease and its writers.
    pub snapshot: u64,
}

/// What [`crate::Pcc::pcc_open`] did, in one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PccOpen {
    /// The open is recorded. `lease`: the caller's own lease (dirty when it opened for
    /// writing), or `None` when no client holds the file.
    Opened { attr: Attr, lease: Option<PccLease> },
    /// A read-only open recorded while another client holds the lease: that client wrote
    /// back a snapshot at or after the caller's read request, which the open reads from the
    /// capacity tier.
    Snapshot { attr: Attr, lease: PccLease },
    /// Another client holds the lease: nothing was recorded.
    Held(PccLease),
}

/// A request to a lease owner ([`crate::Pcc::pcc_request_recall`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PccRecall {
    pub ino: Ino,
    /// For an open for writing (or a truncate): give the lease back once no writer is left.
    /// Otherwise (a read): a snapshot write-back will do while writers remain.
    pub write: bool,
    /// The request's number (from the `pcc_generation` counter); a snapshot serves every
    /// request up to the one it read before it started.
    pub seq: u64,
}

/// A stored PCC attach rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PccRuleRow {
    pub id: u64,
    /// "rw" or "ro".
    pub mode: String,
    /// Only for this client (None: every client).
    pub client: Option<String>,
    pub rule: String,
    /// The most bytes the files this rule attached may take in each client's cache (None: no
    /// limit beyond the cache's size).
    pub quota: Option<u64>,
}

/// One column value of a portable dump (`tierfs dump` / `tierfs load`).
#[derive(Clone, Debug, PartialEq)]
pub enum DumpValue {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// One row of a portable dump: its table and its columns.
pub type DumpRow = (String, Vec<(String, DumpValue)>);

/// The tables a dump holds, in the order a load inserts them.
pub const DUMP_TABLES: &[&str] = &[
    "meta_info",
    "counters",
    "targets",
    "inodes",
    "dentries",
    "slices",
    "xattrs",
    "trash",
    "pcc_leases",
    "pcc_rules",
    "hsm_archives",
    "hsm_files",
];

/// One reference to a storage object in the metadata (for `tierfs fsck` and `tierfs gc`): a
/// slice reading bytes of it, or a trash row waiting for its deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    pub target: u32,
    pub obj: u64,
    /// The file the reference belongs to.
    pub ino: Ino,
    /// Slices: the end of the bytes the slice reads in the object (`obj_off + len`); trash
    /// rows: the object's recorded length.
    pub end: u64,
    /// A trash row (the object waits for deletion), with the row's id; `None` for a slice.
    pub trash: Option<u64>,
}

/// A problem `tierfs fsck` finds in the metadata alone ([`crate::MetaEngine::meta_issues`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaIssue {
    /// A directory entry names an inode that does not exist.
    DanglingEntry {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
    },
    /// A file without names (unlinked while open, or nlink 0) that no session has open: it
    /// should have been purged at its last close.
    UnheldOrphan { ino: Ino },
    /// An open-file row of a session that no longer exists or whose heartbeat stopped.
    StaleOpen { ino: Ino, session: u64 },
    /// A lock of a session that no longer exists or whose heartbeat stopped.
    StaleLock { ino: Ino, session: u64 },
    /// An RW-PCC lease held by a client with no live session. A dirty one holds the only copy
    /// of data the capacity tier lacks (in that client's cache): never dropped by a repair.
    StaleLease {
        ino: Ino,
        client: String,
        dirty: bool,
    },
    /// An inode's recorded number of extended attributes (`inodes.xattr_count`, schema v9)
    /// differs from its rows in the xattrs table. Clients trust a recorded 0 to answer
    /// getxattr/listxattr without a read and to skip the default-ACL lookup at create, so a
    /// wrong 0 hides attributes (and a directory's default ACL) until repaired.
    XattrCount {
        ino: Ino,
        recorded: u32,
        actual: u32,
    },
    /// HSM: a released file that still has slices or counts allocated bytes, with no restore
    /// running (a failed or canceled restore leaves its committed prefix). `archived`: its
    /// archive copy is recorded, so the slices can go (the copy holds the data).
    ReleasedWithData {
        ino: Ino,
        slices: u64,
        allocated: u64,
        archived: bool,
    },
    /// HSM: a file flagged ARCHIVED without a recorded copy. A released one lost its data.
    ArchivedWithoutCopy { ino: Ino, released: bool },
    /// HSM: a recorded archive copy of a file that no longer exists.
    CopyOfMissingFile {
        ino: Ino,
        archive_id: u32,
        key: String,
    },
    /// HSM: an active ARCHIVE or RESTORE request of a file that no longer exists.
    RequestOfMissingFile { request: u64, ino: Ino },
    /// HSM: a request in a state the coordinator never makes (`why` says which).
    ImpossibleRequest {
        request: u64,
        ino: Ino,
        why: HsmRequestProblem,
    },
    /// HSM: a started request whose agent is not registered, or that no agent reported on
    /// for the coordinator's `request_timeout` (the housekeeping of a running agent would
    /// requeue it; none ran).
    DeadAgentRequest {
        request: u64,
        ino: Ino,
        agent: u64,
        registered: bool,
    },
}

/// Why an HSM request is impossible ([`MetaIssue::ImpossibleRequest`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HsmRequestProblem {
    /// Its action or state number is none the coordinator knows.
    UnknownActionOrState,
    /// Started, but held by no agent.
    StartedByNoAgent,
    /// An active RESTORE of a file that is not released.
    RestoreOfUnreleased,
}

impl std::fmt::Display for HsmRequestProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HsmRequestProblem::UnknownActionOrState => "unknown action or state",
            HsmRequestProblem::StartedByNoAgent => "started by no agent",
            HsmRequestProblem::RestoreOfUnreleased => "restore of a file that is not released",
        })
    }
}

/// Bytes of one chunk that hold data, from its slices as `(off, len, zero)` in commit order
/// (oldest first): each byte belongs to the newest slice covering it, and counts when that
/// slice is not a zero slice (punched holes and truncated tails do not count; holes nobody
/// wrote neither). The engines keep the sum over a file's chunks in the inode (`allocated`,
/// schema v5), recounting only the chunks a transaction touches.
pub fn allocated_bytes(slices: &[(u64, u64, bool)]) -> u64 {
    // Newest first; `claimed` holds the disjoint, sorted ranges newer slices already own.
    let mut claimed: Vec<(u64, u64)> = Vec::new();
    let mut total = 0u64;
    for &(off, len, zero) in slices.iter().rev() {
        let (mut s, e) = (off, off.saturating_add(len));
        let mut fresh = 0u64;
        for &(cs, ce) in &claimed {
            if ce <= s || cs >= e {
                continue;
            }
            if cs > s {
                fresh += cs - s;
            }
            s = s.max(ce);
            if s >= e {
                break;
            }
        }
        if s < e {
            fresh += e - s;
        }
        if !zero {
            total += fresh;
        }
        // Merge [off, e) into the claimed ranges.
        claimed.push((off, e));
        claimed.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(claimed.len());
        for (a, b) in claimed.drain(..) {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        claimed = merged;
    }
    total
}

#[cfg(test)]
mod allocated_tests {
    use super::allocated_bytes;

    #[test]
    fn newest_slice_wins_and_zero_slices_do_not_count() {
        assert_eq!(allocated_bytes(&[]), 0);
        assert_eq!(allocated_bytes(&[(0, 100, false)]), 100);
        // an overwrite does not count twice
        assert_eq!(allocated_bytes(&[(0, 100, false), (50, 100, false)]), 150);
        // a punched hole in the middle
        assert_eq!(allocated_bytes(&[(0, 100, false), (20, 10, true)]), 90);
        // data written over a hole counts again
        assert_eq!(
            allocated_bytes(&[(0, 100, false), (20, 10, true), (25, 2, false)]),
            92
        );
        // an older slice split by a newer one in its middle
        assert_eq!(allocated_bytes(&[(10, 10, true), (0, 100, false)]), 100);
        assert_eq!(allocated_bytes(&[(0, 100, false), (40, 20, false)]), 100);
        // disjoint pieces
        assert_eq!(allocated_bytes(&[(0, 10, false), (1000, 10, false)]), 20);
        assert_eq!(allocated_bytes(&[(0, 10, true)]), 0);
    }
}
