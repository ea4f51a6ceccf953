//! What the client needs from the metadata database, as one trait per domain: [`Namespace`],
//! [`FileData`], [`Sessions`], [`Pcc`], [`Locks`], [`Admin`], [`Changelog`], [`Workers`] and
//! [`Hsm`].
//! [`MetaEngine`] is all of them at once (a blanket impl), which is what the client holds
//! (`Arc<dyn MetaEngine>`); a test can implement the domains with a mock or a
//! failure-injecting engine.
//!
//! Every method is one atomic transaction. The implementation is [`crate::core::SqlMeta`] over
//! a [`crate::sql::Driver`] (SQLite or PostgreSQL). The conformance suite in
//! [`crate::conformance`] runs against every engine.
//!
//! **Notifications.** An engine may push events to clients ([`MetaEngine::listen`]): today
//! requests to give back an RW-PCC lease ([`Channel::PccRevoke`]). They only wake a client up
//! sooner; the state they announce is always in the tables too, so an engine without them
//! (SQLite) is polled, and a client that listens still reads the tables after subscribing and
//! now and then (a notice sent while it was not listening is not replayed).

use std::time::Duration;

use crate::changelog::{ChangelogRecord, ChangelogStatus, IdleDeregistration, Mask};
use crate::error::{MetaError, Result};
use crate::hsm::{
    Archive, ArchiveCopy, HsmAgent, HsmAgentInfo, HsmDone, HsmImport, HsmListFilter, HsmOutcome,
    HsmRequest, HsmSettings, HsmState, HsmTask, Progress, RequestState, SweepItem,
};
use crate::types::*;

/// How long a file whose last name a rename replaced stays openable by inode. A client that
/// looked the name up just before the rename (on another machine, or with the old entry in its
/// kernel's cache) still opens what it found, a whole old version, instead of failing with
/// ESTALE; that is what a reader of the "write a temporary file, rename it over the live name"
/// pattern expects, and what Lustre's open-by-name gives. The grace is counted from the rename
/// (the inode's ctime); [`MetaEngine::maintain`] purges files past it.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// How long the objects a file no longer reads (overwritten, truncated away, compacted) wait
/// in the trash while some client still has the file open. Not until the last close: a file
/// that is never closed (a database, a log, an exerciser) would keep every object it ever
/// dropped (fsx's 4 MiB file left 191,000 trash rows, 14 GB, in 20 minutes). A client whose
/// cached slice list still names a deleted object reads the list again and retries
/// (`DataPath::read`); the grace only makes that rare.
pub const OPEN_TRASH_GRACE: Duration = Duration::from_secs(60);

/// How long a file whose last name went while nobody had it open waits before the purge frees
/// it, counted from the unlink (the inode's ctime). A client records a read-only open of a file
/// in the engine a little after answering it, in its next batch of open and close records
/// ([`Sessions::record_opens_closes`], within about 50 ms): a file unlinked elsewhere in
/// between must still be there when that record lands, which makes it an open orphan that
/// lives until its last close.
pub const UNLINK_GRACE: Duration = Duration::from_secs(5);

/// A kind of event an engine can push to the clients that listen for it; a listener names the
/// ones it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Channel {
    /// Requests to give back RW-PCC leases the listening client holds
    /// ([`MetaEngine::pcc_request_revoke`]).
    PccRevoke,
    /// New changelog records were committed (any client's; `tierfs changelog --follow`).
    Changelog,
    /// HSM requests for copytool agents: new work queued, requests canceled ([`Hsm`]).
    Hsm,
}

/// One event received by a [`Listener`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// Someone asked the listening client to give back its lease of this file.
    PccRevoke(Ino),
    /// Changelog records were committed since the last notice.
    Changelog,
    /// An HSM request of this archive can be taken now (queued, or given back by an agent).
    HsmWork(u32),
    /// This HSM request was canceled: its mover stops now instead of at its next report.
    HsmCancel(u64),
}

/// A live subscription to some [`Channel`]s, from [`MetaEngine::listen`].
pub trait Listener: Send {
    /// Waits up to `timeout` for notices and returns those that arrived (empty when none
    /// came; once one arrived, only what is already there is added). An error means the
    /// subscription is lost (the database went away): drop the listener, poll the tables,
    /// and listen again later.
    fn wait(&mut self, timeout: Duration) -> Result<Vec<Notice>>;
}

/// The namespace: names, attributes, extended attributes, layouts and projects.
pub trait Namespace: Send + Sync {
    /// The attributes of `parent`/`name`: `NotFound` when the directory has no such name,
    /// `StaleDir` when the directory itself is gone, `NotDir` when `parent` is not one (one
    /// read: FUSE answers a negative entry or ESTALE from it alone).
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr>;
    fn getattr(&self, ino: Ino) -> Result<Attr>;
    /// Changes attributes; a size change truncates (freeing objects beyond the new end).
    fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr>;
    /// Creates a file, directory, symlink or special file. Files get `layout` (chosen by the
    /// caller's allocator from the parent's defaults, see [`Namespace::resolve_stripe_default`]).
    fn create(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        layout: Option<Layout>,
        open_by: Option<u64>,
    ) -> Result<Attr>;
    fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr>;
    /// Removes a name; returns the inode it named. A file whose last name goes while a client
    /// still has it open stays readable until the last close ([`MetaEngine::close_file`]).
    fn unlink(&self, parent: Ino, name: &[u8]) -> Result<Ino>;
    fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()>;
    /// `flags`: libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE. Returns the inode that lost its
    /// name `new_parent`/`new_name` to the rename, if one did (never with an exchange).
    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<Option<Ino>>;
    /// Entries after cursor `offset` (0: from the start), at most `limit`, without "." and "..".
    fn readdir(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<DirEntry>>;
    /// [`Namespace::readdir`] with each entry's attributes, read together (one statement), as
    /// [`Namespace::lookup`] would give them (FUSE READDIRPLUS).
    fn readdir_plus(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<(DirEntry, Attr)>>;
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>>;
    fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>>;
    /// `flags`: libc::XATTR_CREATE, libc::XATTR_REPLACE, or 0.
    fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>>;
    fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()>;
    /// The stripe count and size a new file in `dir` gets: the nearest ancestor's default, or the
    /// filesystem default.
    fn resolve_stripe_default(&self, dir: Ino) -> Result<StripeDefault>;
    /// Sets a directory's default for new children.
    fn set_dir_stripe(&self, dir: Ino, def: StripeDefault) -> Result<()>;
    /// Sets an empty file's layout (fails with `NotEmpty` once it holds data).
    fn set_file_layout(&self, ino: Ino, layout: &Layout) -> Result<()>;
    /// Sets the project id; with `inherit`, also for a directory's existing subtree and (recorded
    /// in the directory) for its future children.
    fn set_projid(&self, ino: Ino, projid: u32, inherit: bool) -> Result<u64>;
    /// (projid, inherit flag) of an inode.
    fn get_projid(&self, ino: Ino) -> Result<(u32, bool)>;
    /// One path of an inode from the root (`None` when it has no name left).
    fn path_of(&self, ino: Ino) -> Result<Option<Vec<u8>>>;
    /// Purges files a rename replaced before `replaced_before` (their grace is over) that no
    /// client has open; returns how many. One still open is left for a pass after its last
    /// close.
    fn purge_orphans(&self, replaced_before: Nanos) -> Result<u64>;
    /// Frees up to `max` files whose last name went while nobody had them open (left for the
    /// purge by `unlink`: no request finds them any more), in one write transaction: their
    /// slices and inline bytes, their objects to the trash, xattrs, locks and HSM state, and
    /// the inode — those unlinked before `unlinked_before` (their ctime; the daemon passes now
    /// minus [`UNLINK_GRACE`]). Returns how many; fewer than `max` means none is left now. Any
    /// client may run it (the daemon's `purge` worker does); two at once each free different
    /// files.
    fn purge_unlinked(&self, max: u64, unlinked_before: Nanos) -> Result<u64>;
}

/// File data: object ids, slices, space reservation, compaction, and the trash of objects no
/// longer referenced.
pub trait FileData: Send + Sync {
    /// Allocates `n` consecutive object ids and returns the first.
    fn alloc_object_ids(&self, n: u64) -> Result<u64>;
    /// The slices of one chunk in commit order (none: a hole); `NotFound` when the file is
    /// gone (purged), which a hole never is.
    fn read_chunk(&self, ino: Ino, chunk: u64) -> Result<Vec<Slice>>;
    /// Records written slices (in write order) and extends the size to at least `new_end`;
    /// bumps the data version and mtime/ctime. Returns the new attributes.
    fn commit_slices(&self, ino: Ino, slices: &[Slice], new_end: u64, mtime: Nanos)
        -> Result<Attr>;
    /// [`FileData::commit_slices`] of writes buffered by a client under `session`, in one
    /// transaction with the check that the session still exists: once it was reaped or
    /// evicted, [`MetaError::SessionEnded`] and the new objects go to the trash (its uploads
    /// may already count as garbage, see `tierfs gc`, so they are never referenced).
    fn commit_slices_for(
        &self,
        session: u64,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
    ) -> Result<Attr>;
    /// [`FileData::commit_slices_for`] (with `session`, else [`FileData::commit_slices`]) and
    /// then [`Namespace::setattr`] of `set`, in one transaction: a utimensat over buffered
    /// writes (tar sets the times before close) is one commit, and the times it gives are the
    /// ones that stay. Returns the attributes after both; an error of either changes nothing.
    fn commit_slices_then(
        &self,
        session: Option<u64>,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
        set: &SetAttr,
    ) -> Result<Attr>;
    /// Reserves space: extends the size to `off+len` unless `keep_size`. With `zero`, the range
    /// reads as zeros afterwards (FALLOC_FL_PUNCH_HOLE with `keep_size`, FALLOC_FL_ZERO_RANGE
    /// with or without): zero slices cover the part inside the old size, and the size grows
    /// to `off+len` unless `keep_size`.
    fn fallocate(&self, ino: Ino, off: u64, len: u64, keep_size: bool, zero: bool) -> Result<Attr>;
    /// Replaces all slices of a chunk by `merged` if the chunk's newest slice is still `upto`
    /// (compaction). Returns false when the chunk changed in between; `merged`'s objects then
    /// go to the trash.
    fn replace_chunk(&self, ino: Ino, chunk: u64, upto: u64, merged: &[Slice]) -> Result<bool>;
    /// Replaces all of a file's data by `slices` and sets its size (RW-PCC write-back).
    fn rewrite_data(&self, ino: Ino, slices: &[Slice], size: u64, mtime: Nanos) -> Result<Attr>;
    /// Objects no longer referenced and not in use by an open file.
    /// (Files nobody has open: at once; files open somewhere: once they have been in the
    /// trash for `open_grace`, see [`OPEN_TRASH_GRACE`].)
    fn trash(&self, limit: usize, open_grace: Duration) -> Result<Vec<TrashItem>>;
    /// Forgets trash entries whose objects were deleted, and releases their space.
    fn trash_done(&self, ids: &[u64]) -> Result<()>;
}

/// Client sessions and the files they hold open.
pub trait Sessions: Send + Sync {
    fn register_session(&self, s: &SessionInfo) -> Result<u64>;
    /// Registers a session unless another session of the same client name heartbeated within
    /// `timeout_ns` ([`MetaError::ClientNameInUse`]); the check and the insert are one
    /// transaction, so two mounts of one name at once cannot both succeed.
    fn register_session_unique(&self, s: &SessionInfo, timeout_ns: i64) -> Result<u64>;
    /// Stamps `session`'s heartbeat with the database's clock; `NotFound` once it has ended
    /// (reaped or evicted). Every liveness judgement (this, [`Sessions::reap_sessions`],
    /// [`Sessions::client_alive`], [`Sessions::register_session_unique`],
    /// [`Sessions::client_session`]) reads the DATABASE's clock, never the caller's.
    fn heartbeat(&self, session: u64) -> Result<()>;
    fn unregister_session(&self, session: u64) -> Result<()>;
    fn sessions(&self) -> Result<Vec<SessionInfo>>;
    /// Removes sessions whose heartbeat is older than `timeout_ns`, with their open files and
    /// locks; returns how many went.
    fn reap_sessions(&self, timeout_ns: i64) -> Result<usize>;
    /// Records an open of `ino` by `session`; [`MetaError::SessionEnded`] once the session has
    /// ended (as for every write recorded under a session: creates with `open_by`, closes,
    /// locks, [`FileData::commit_slices_for`]).
    fn open_file(&self, session: u64, ino: Ino) -> Result<()>;
    /// Records, in one transaction, opens of `opens` (each as [`Sessions::open_file`]) and then
    /// drops one open of each of `closes` (as [`Sessions::close_files`]), by `session`: a
    /// client's batch of opens it answered before recording them (read-only opens of files
    /// without a lease or HSM state) and of closes. An open of a file unlinked since, not yet
    /// purged ([`UNLINK_GRACE`]), makes it an open orphan again (usable through its opens,
    /// left for the purge at the last close); opens of files that are gone are left out and
    /// returned.
    fn record_opens_closes(&self, session: u64, opens: &[Ino], closes: &[Ino]) -> Result<Vec<Ino>>;
    /// Drops one open of each of `inos` by `session` (one transaction); a file with no names
    /// left is left for the purge ([`Namespace::purge_unlinked`]) at its last close on every
    /// client (one with HSM state is deleted then).
    fn close_files(&self, session: u64, inos: &[Ino]) -> Result<()>;
    /// Whether a client with this name has a session whose heartbeat is newer than `timeout_ns`.
    fn client_alive(&self, client: &str, timeout_ns: i64) -> Result<bool>;
    /// The newest session of the client named `client` (highest id), if it has one, and the
    /// age of its last heartbeat in nanoseconds by the DATABASE's clock (PostgreSQL:
    /// `clock_timestamp()`; SQLite: this host's clock, the database is embedded), so the
    /// caller's own clock plays no part. Never negative.
    fn client_session(&self, client: &str) -> Result<Option<(SessionInfo, i64)>>;
    /// The database's clock, in nanoseconds since the epoch (what heartbeats are stamped
    /// with): for comparing with a session's `heartbeat` or `started` without trusting the
    /// caller's clock.
    fn db_now(&self) -> Result<Nanos>;
}

/// The persistent client cache: RW-PCC leases and attach rules.
pub trait Pcc: Send + Sync {
    fn pcc_lease(&self, ino: Ino) -> Result<Option<PccLease>>;
    /// The attributes of `ino` (as [`Namespace::getattr`]) and its RW-PCC lease if a client
    /// holds it, in one read: a read-only open decides from both whether the engine must
    /// record it at once (not when no client holds the file, nor when the caller holds it
    /// and serves the open from its cache).
    fn getattr_leased(&self, ino: Ino) -> Result<(Attr, Option<PccLease>)>;
    /// Takes the RW-PCC lease of a file for `client` (a new generation; the file's data version
    /// moves so read-only copies elsewhere are dropped). `WouldBlock` while another client
    /// holds it; `InUse` while a session of another client has the file open (its handles
    /// would go on writing to the capacity tier, and the owner's write-back would then lose
    /// those writes); taking it again as the holder returns the held lease. A released HSM file
    /// is refused (`HsmError::Released`): it is restored first.
    fn pcc_acquire(&self, ino: Ino, client: &str) -> Result<PccLease>;
    /// [`pcc_acquire`](Pcc::pcc_acquire) with the lease marked dirty ("may be dirty") in the
    /// same transaction: for an owner about to hand out a writable descriptor of its cached
    /// file at once (an attach at create), instead of a second transaction.
    fn pcc_acquire_dirty(&self, ino: Ino, client: &str) -> Result<PccLease>;
    /// Creates a regular file as [`Namespace::create`] does (opened by `open_by`) and, when
    /// `want` says so of the new inode (an RW rule of `client` matches it), takes its RW-PCC
    /// lease for `client` already dirty ("may be dirty"), as
    /// [`pcc_acquire_dirty`](Pcc::pcc_acquire_dirty) would: ALL in ONE transaction, so the
    /// lease is in the engine before the caller can hand out a writable descriptor, for one
    /// commit instead of two. The inode is returned as it is after the lease (its data version
    /// moved), with the lease when one was taken. `want` may run more than once (a transaction
    /// tried again); only its last answer counts. Not a regular file: `Invalid`.
    #[allow(clippy::too_many_arguments)]
    fn pcc_create(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        layout: Option<Layout>,
        open_by: Option<u64>,
        client: &str,
        want: &dyn Fn(&Attr) -> bool,
    ) -> Result<(Attr, Option<PccLease>)>;
    /// Opens a file as far as leases go, in ONE transaction: locks the inode, reads its lease
    /// and either records the open of `session` (with the changelog's OPEN record, as
    /// [`Sessions::open_file`]) or records nothing and returns the other client's lease
    /// ([`PccOpen::Held`]). When the lease is `client`'s and the open writes, the lease is
    /// marked dirty ("may be dirty") in the same transaction, before the caller hands out a
    /// writable descriptor. A read-only open with `snapshot: Some(seq)` is recorded while
    /// another client holds the lease if that client served a read request numbered `seq` or
    /// later with a snapshot ([`PccOpen::Snapshot`]). An [`pcc_acquire`](Pcc::pcc_acquire)
    /// after this open sees it.
    fn pcc_open(
        &self,
        session: u64,
        ino: Ino,
        client: &str,
        write: bool,
        snapshot: Option<u64>,
    ) -> Result<PccOpen>;
    /// The owner reports its cached file: dirty or clean, and its size and mtime, which every
    /// client then sees. `WouldBlock` when the lease is not `client`'s at `generation` (given
    /// back, broken or taken again since), `NotFound` when there is none.
    fn pcc_report(
        &self,
        ino: Ino,
        client: &str,
        generation: u64,
        dirty: bool,
        size: u64,
        mtime: Nanos,
    ) -> Result<Attr>;
    /// [`Pcc::pcc_report`] with the owner's attribute changes that waited for it (a writer's
    /// `fchmod`, `fchown` or times before its close: the client's deferred setattr) applied
    /// in the same transaction, after the report ([`crate::SetAttr::unless_changed`] keeps
    /// another client's newer change). Nothing of either is applied when the lease is not
    /// `client`'s at `generation`.
    #[allow(clippy::too_many_arguments)]
    fn pcc_report_then(
        &self,
        ino: Ino,
        client: &str,
        generation: u64,
        dirty: bool,
        size: u64,
        mtime: Nanos,
        then: &SetAttr,
    ) -> Result<Attr>;
    /// The owner gives the lease of `generation` back (and any request to give it back goes).
    /// False when the lease is not that one (nothing changes).
    fn pcc_release(&self, ino: Ino, client: &str, generation: u64) -> Result<bool>;
    /// Breaks the lease of an owner judged dead: deleted only if it is still `client`'s at
    /// `generation` (what the breaker saw) and clean. False when it changed or is dirty.
    fn pcc_break(&self, ino: Ino, client: &str, generation: u64) -> Result<bool>;
    /// Asks the owner of a lease to give it back (`write`) or, for a read, to write back a
    /// snapshot if it has writers ([`Pcc::pcc_snapshot_served`]); one request per file, a
    /// request for writing stays one. Returns the request's number; a snapshot served at or
    /// after it shows in [`PccLease::snapshot`].
    fn pcc_request_recall(&self, ino: Ino, requester: &str, write: bool) -> Result<u64>;
    /// Asks the owner of a lease to give it back.
    fn pcc_request_revoke(&self, ino: Ino, requester: &str) -> Result<()> {
        self.pcc_request_recall(ino, requester, true).map(|_| ())
    }
    /// Files whose lease `client` holds and someone asked back (for writing or reading).
    fn pcc_revokes_for(&self, client: &str) -> Result<Vec<Ino>> {
        Ok(self
            .pcc_recalls_for(client)?
            .into_iter()
            .map(|r| r.ino)
            .collect())
    }
    /// The requests to `client`'s leases, by file.
    fn pcc_recalls_for(&self, client: &str) -> Result<Vec<PccRecall>>;
    /// The owner wrote back a snapshot of its data that started after read request `seq`:
    /// the lease (if still `client`'s at `generation`) records it, and read requests up to
    /// `seq` are served. Whether the lease was that one.
    fn pcc_snapshot_served(
        &self,
        ino: Ino,
        client: &str,
        generation: u64,
        seq: u64,
    ) -> Result<bool>;
    /// Every lease `client` holds (recovery after a restart).
    fn pcc_leases_of(&self, client: &str) -> Result<Vec<PccLease>>;
    fn pcc_rule_add(
        &self,
        mode: &str,
        client: Option<&str>,
        rule: &str,
        quota: Option<u64>,
    ) -> Result<u64>;
    /// Sets or clears (None) a rule's quota; NotFound when there is no such rule.
    fn pcc_rule_set_quota(&self, id: u64, quota: Option<u64>) -> Result<()>;
    fn pcc_rules(&self) -> Result<Vec<PccRuleRow>>;
    fn pcc_rule_del(&self, id: u64) -> Result<()>;
}

/// Advisory locks (POSIX and flock), shared by every client.
pub trait Locks: Send + Sync {
    /// Takes, changes or releases a lock; `WouldBlock` when another owner holds a conflicting one.
    fn set_lock(&self, ino: Ino, lock: &LockRange) -> Result<()>;
    /// The first lock conflicting with `lock`, if any.
    fn test_lock(&self, ino: Ino, lock: &LockRange) -> Result<Option<LockRange>>;
    /// Releases every lock of one owner on one inode (at close).
    fn release_locks(&self, ino: Ino, session: u64, owner: u64, flock: bool) -> Result<()>;
}

/// Filesystem-wide information, durability, housekeeping, dump and load, consistency checks
/// (`tierfs fsck`, `tierfs gc`) and notifications.
pub trait Admin: Send + Sync {
    /// Filesystem-wide settings.
    fn info(&self) -> Result<FsInfo>;
    fn targets(&self) -> Result<Vec<TargetInfo>>;
    fn usage(&self) -> Result<Usage>;
    /// [`Usage::inodes`] alone (what `statfs` reports), without the scan of inline data that
    /// the bytes need.
    fn inodes_used(&self) -> Result<u64>;
    /// Makes every committed transaction durable against power loss (fsync semantics).
    fn sync(&self) -> Result<()>;
    /// Background housekeeping of the engine (SQLite: checkpoint the write-ahead log; every
    /// engine: purge files replaced more than [`ORPHAN_GRACE`] ago; deregister changelog
    /// readers idle past their idle time, [`Changelog::changelog_expire`]). Each client calls
    /// it every second or so, off the application's path.
    fn maintain(&self) -> Result<()>;
    /// Every row of the filesystem's persistent tables ([`DUMP_TABLES`]; not the sessions, open
    /// files, locks or recall requests of mounted clients), for `tierfs dump`.
    fn export_rows(&self, _sink: &mut dyn FnMut(DumpRow) -> Result<()>) -> Result<()> {
        Err(MetaError::Invalid("this engine cannot dump yet".into()))
    }
    /// Loads rows from a dump into a freshly formatted, empty filesystem (one transaction).
    fn import_rows(&self, _rows: &mut dyn Iterator<Item = Result<DumpRow>>) -> Result<u64> {
        Err(MetaError::Invalid("this engine cannot load yet".into()))
    }
    /// Every reference to a storage object: each slice that reads one, and each trash row.
    fn object_refs(&self) -> Result<Vec<ObjectRef>>;
    /// The first object id not yet handed out (ids at or above it belong to no client yet).
    fn object_id_counter(&self) -> Result<u64>;
    /// Problems in the metadata alone: dangling directory entries, files without names that
    /// nobody holds, open files, locks and RW-PCC leases of sessions that are gone or whose
    /// heartbeat is older than `timeout_ns`; and the HSM rows' (released files with data,
    /// ARCHIVED without a copy, copies and requests of files that are gone, impossible
    /// requests, started requests of dead agents: see docs/hsm.md, "fsck").
    fn meta_issues(&self, timeout_ns: i64) -> Result<Vec<MetaIssue>>;
    /// Repairs one issue found by [`Admin::meta_issues`] in one transaction, if it still
    /// holds (checked again inside it, so a client that came back meanwhile keeps its rows).
    /// Returns whether something changed. A stale open or lock ends its whole dead session (as
    /// [`Sessions::reap_sessions`] would), or drops the row of a session that no longer
    /// exists; a dirty RW-PCC lease is never dropped (false). HSM issues: docs/hsm.md, "fsck"
    /// (a released file whose copy is not recorded is never touched).
    fn repair_issue(&self, issue: &MetaIssue, timeout_ns: i64) -> Result<bool>;
    /// Subscribes to events on `channels` addressed to `client` (see the module doc).
    /// `Ok(None)`: this engine has no notifications, poll instead. An error: it has them but
    /// cannot subscribe now (database unreachable); try again later.
    fn listen(&self, _client: &str, _channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        Ok(None)
    }
}

/// The changelog (Lustre's model, docs/changelog.md): records written in the same transaction
/// as each change (`core::changelog::record`), read by registered readers. Records are written
/// only while some registered reader's mask includes their type, and purged once every reader
/// has cleared them.
pub trait Changelog: Send + Sync {
    /// Registers a reader that receives the record types of `mask`, starting after the last
    /// record written so far; a reader that neither clears nor reads (with its id) for `idle`
    /// is deregistered ([`Changelog::changelog_expire`]). Returns its id (`cl<id>`).
    fn changelog_register(&self, mask: Mask, idle: Duration) -> Result<u64>;
    /// Registers the reader of `client`'s change follower: as [`Changelog::changelog_register`],
    /// but the records `client` itself makes (HSM records apart) are not written for this
    /// reader, since that client's kernel saw those changes. A record nobody else wants is not
    /// written at all, so a client alone on a filesystem pays nothing for following.
    fn changelog_register_follower(&self, mask: Mask, idle: Duration, client: &str) -> Result<u64>;
    /// Deregisters a reader and purges records no remaining reader needs; returns how many
    /// went. An unknown reader is [`crate::changelog::ChangelogError::UnknownReader`]; a reader dropped for
    /// idleness is forgotten (its warning in `tierfs status` ends).
    fn changelog_deregister(&self, reader: u64) -> Result<u64>;
    /// Marks records up to `endrec` (0: the last one now) as processed by `reader` and purges
    /// those every reader has cleared; returns how many were purged. Clearing past the last
    /// record is [`crate::changelog::ChangelogError::ClearPastEnd`].
    fn changelog_clear(&self, reader: u64, endrec: u64) -> Result<u64>;
    /// Records with `start <= index <= end`, in index order, at most `limit`. With a reader,
    /// only its mask's types after its cleared point, and the read counts as its use (it is
    /// not idle); without, every type in `mask`.
    fn changelog_read(
        &self,
        reader: Option<u64>,
        mask: Mask,
        start: u64,
        end: u64,
        limit: usize,
    ) -> Result<Vec<ChangelogRecord>>;
    /// Registered readers, the range of records held, and readers dropped for idleness.
    fn changelog_status(&self) -> Result<ChangelogStatus>;
    /// Deregisters readers idle past their idle time (purging what only they held); returns
    /// them. Clients call it now and then; the reader operations and `changelog_status` too.
    fn changelog_expire(&self) -> Result<Vec<IdleDeregistration>>;
    /// The record types some registered reader wants of the changes `client` makes: the
    /// union of the active readers' masks, less those of `client`'s own change follower
    /// (HSM records apart), as the record gates decide (one read). A client asks before it
    /// serves opens without the engine (kept opens under an RW-PCC lease, docs/pcc.md),
    /// which write no OPEN or CLOSE record.
    fn changelog_wanted(&self, client: &str) -> Result<Mask>;
}

/// Reports of the clients' background workers: each client publishes its workers' status
/// every few seconds (its `worker-reports` worker); `tierfs status` lists them.
pub trait Workers: Send + Sync {
    /// Replaces the reports of `session`'s workers with `reports` (one transaction), in that
    /// order; drops the reports of sessions that have ended. `Invalid` if `session` has ended
    /// (a client reaped while it was silent).
    fn report_workers(&self, session: u64, reports: &[WorkerReport]) -> Result<()>;
    /// The reports of the workers of every live session, by session, each session's in the
    /// order reported (`session` set).
    fn worker_reports(&self) -> Result<Vec<WorkerReport>>;
}

/// Hierarchical storage management (docs/hsm.md): the archive tier. Lustre's model: each file
/// has HSM flags ([`crate::hsm::HsmFlags`], in [`Attr::hsm`]) and at most one archive copy; a
/// coordinator queue of requests (ARCHIVE, RESTORE, REMOVE) that copytool agents take, report
/// progress on and complete; release drops an archived, clean file's capacity-tier objects.
///
/// Every method is one transaction. Every time (request ages, timeouts, backoff, agent
/// heartbeats) is the DATABASE's clock ([`Sessions::db_now`]), never the caller's. Refusals
/// are [`MetaError::Hsm`] with a [`crate::hsm::HsmError`] (one line each, its own errno).
/// Each state change writes a changelog HSM record ([`crate::changelog::RecordType::Hsm`],
/// the event in its flags as Lustre's, [`crate::hsm::changelog_flags`]) in its transaction.
///
/// **Writes of archived files.** The write paths ([`FileData::commit_slices`], its session
/// form, [`FileData::fallocate`], [`FileData::rewrite_data`], a truncating
/// [`Namespace::setattr`], [`Pcc::pcc_report`] of a dirty cache) set DIRTY on an archived file
/// in the same statement that updates the inode, so a file with no HSM state costs nothing
/// more; a RELEASED file refuses them ([`crate::hsm::HsmError::Released`]: the client restores
/// it first).
pub trait Hsm: Send + Sync {
    // ---- archives and settings

    /// Registers archive backend `id` (1..=65535) at `url`. `ArchiveExists` when the id is taken.
    fn hsm_archive_add(&self, id: u32, url: &str) -> Result<()>;
    /// Forgets archive `id`: `UnknownArchive`, or `ArchiveInUse` while some file has a copy
    /// in it or a request is active on it.
    fn hsm_archive_del(&self, id: u32) -> Result<()>;
    /// The registered archives, by id.
    fn hsm_archives(&self) -> Result<Vec<Archive>>;
    /// The coordinator's settings (defaults where none was set).
    fn hsm_settings(&self) -> Result<HsmSettings>;
    /// Replaces the coordinator's settings (`BadSetting` for a zero cap, timeout or attempt count,
    /// `UnknownArchive` for a default archive that is not registered).
    fn hsm_set_settings(&self, s: &HsmSettings) -> Result<()>;

    // ---- per-file state

    /// A file's flags, archive id and copy (flags 0 and no copy for a file never touched by
    /// HSM). `NotFound` when it does not exist.
    fn hsm_state(&self, ino: Ino) -> Result<HsmState>;
    /// `tierfs hsm set|clear`: sets then clears flags among
    /// [`crate::hsm::HsmFlags::USER_SETTABLE`] (`NotSettable` otherwise); any flag set also
    /// sets EXISTS. A changelog HSM record (event STATE) when the flags changed.
    fn hsm_set_flags(&self, ino: Ino, set: u32, clear: u32) -> Result<HsmState>;
    /// Releases an archived, clean file: its slices go (objects to the trash, as a truncate's),
    /// allocated becomes 0, RELEASED is set; size, times and data version are kept. Refused:
    /// not a file (`NotAFile`), not archived (`ReleaseNotArchived`), dirty or changed since
    /// the copy (`ReleaseDirty`), norelease (`ReleaseNoRelease`), open on some client or
    /// under an RW-PCC lease (`ReleaseOpen`), an active request on it (`Busy`). Releasing a
    /// released file returns its attributes and changes nothing.
    fn hsm_release(&self, ino: Ino) -> Result<Attr>;
    /// Creates each item as a released, archived file of archive `archive_id` whose copy is at
    /// its key (size, mtime, mode from the item), without data: `tierfs hsm import`. One
    /// transaction for the batch; a name that exists fails the batch (`Exists`).
    fn hsm_import(&self, archive_id: u32, items: &[HsmImport]) -> Result<Vec<Attr>>;

    // ---- the queue

    /// Queues `action` on `ino` in archive `archive_id` (None: the file's archive, else the
    /// default archive, see [`HsmSettings::default_archive`]). Deduplicated: while a request
    /// of the same action on the file is active, that one is returned (several openers of a
    /// released file share one restore). `None` when there is nothing to do (RESTORE of a file
    /// that is not released). Refusals: `UnknownArchive`, `OtherArchive`, `NotAFile`,
    /// `NoArchiveFlag` (ARCHIVE), `Released` (ARCHIVE of a released file), `Lost` and
    /// `NoCopy` (RESTORE), `NoCopy` and `Busy` (REMOVE while another action is active).
    fn hsm_request(
        &self,
        ino: Ino,
        action: crate::hsm::HsmAction,
        archive_id: Option<u32>,
    ) -> Result<Option<HsmRequest>>;
    /// Cancels every active request of `ino` at once, waiting or started (the mover of a
    /// started one learns it at its next [`Hsm::hsm_progress`] and stops); returns how many.
    /// `NothingToCancel` when there was none.
    fn hsm_cancel(&self, ino: Ino) -> Result<u64>;
    /// Cancels one request; `UnknownRequest`, `NothingToCancel` when it is already final.
    fn hsm_cancel_request(&self, id: u64) -> Result<HsmRequest>;
    /// One request (`UnknownRequest` once purged): what a waiting opener polls.
    fn hsm_get_request(&self, id: u64) -> Result<HsmRequest>;
    /// `tierfs hsm action`: the file's active request, else its latest final one (its error
    /// says why a restore failed), else None.
    fn hsm_action(&self, ino: Ino) -> Result<Option<HsmRequest>>;
    /// `tierfs hsm list`: requests by state (started, then waiting in take order, then final
    /// ones newest first).
    fn hsm_list(&self, filter: &HsmListFilter) -> Result<Vec<HsmRequest>>;

    // ---- agents

    /// Registers a copytool agent (heartbeat now); returns its id. `UnknownArchive` when it
    /// names an archive that is not registered.
    fn hsm_agent_register(&self, info: &HsmAgentInfo) -> Result<u64>;
    /// Stamps the agent's heartbeat; `UnknownAgent` once it was unregistered or dropped.
    fn hsm_agent_heartbeat(&self, agent: u64) -> Result<()>;
    /// Unregisters an agent; the requests it held go back to waiting at once (the attempt is
    /// not counted). Returns how many.
    fn hsm_agent_unregister(&self, agent: u64) -> Result<u64>;
    /// Registered agents, by id.
    fn hsm_agents(&self) -> Result<Vec<HsmAgent>>;
    /// Gives `agent` up to `max` waiting requests of the archives it serves, marked started
    /// (an attempt counted, `started`/`updated` now): highest priority first (restores before
    /// archives), then oldest; none whose `next_try` is to come; within the per-agent cap
    /// (min of the agent's own and [`HsmSettings::max_per_agent`], counting what it holds)
    /// and the per-archive cap ([`HsmSettings::max_per_archive`], all agents). Several agents
    /// take concurrently without taking one request twice or passing a cap (PostgreSQL: takers
    /// serialise on an advisory lock, rows picked `FOR UPDATE SKIP LOCKED`; SQLite: one
    /// writer). Also stamps the agent's heartbeat. `UnknownAgent` for an unknown agent.
    fn hsm_take(&self, agent: u64, max: usize) -> Result<Vec<HsmTask>>;
    /// A mover's progress on a started request (the heartbeat of that request, judged by
    /// [`Hsm::hsm_housekeep`]; an agent holding requests is never dropped, and one that holds
    /// none heartbeats with [`Hsm::hsm_agent_heartbeat`] or [`Hsm::hsm_take`]): [`Progress::Stop`] when it should stop at once (canceled, requeued after a
    /// timeout and no longer this agent's, or the file went). `UnknownAgent` once the agent
    /// was dropped for silence ([`Hsm::hsm_housekeep`]): it stops everything and registers
    /// again (the same for every call naming an agent).
    fn hsm_progress(&self, agent: u64, request: u64, bytes_moved: u64) -> Result<Progress>;
    /// A restore mover commits restored data: `slices` (of objects it wrote under the file's
    /// layout) are added to the released file without changing its size, times, data version
    /// or flags, and count in `allocated`; readers may read the restored prefix meanwhile.
    /// [`Progress::Stop`] (nothing committed, the objects go to the trash) when the request is
    /// no longer this agent's started RESTORE. Idempotent: slices whose objects the file
    /// already reads (a call sent again after its answer was lost) are not added twice.
    fn hsm_restore_slices(&self, agent: u64, request: u64, slices: &[Slice]) -> Result<Progress>;
    /// A mover finished a request; the state change and the request's success are one
    /// transaction. ARCHIVE: when the file's data version is still `done.data_version` (and no
    /// RW-PCC lease holds dirty data) the copy is recorded (ARCHIVED and EXISTS set, DIRTY
    /// cleared, the archive id, key, size, checksum), else [`HsmOutcome::Stale`] (the copy is
    /// not recorded; a file archived before stays DIRTY). RESTORE: RELEASED is cleared (the
    /// data was committed by [`Hsm::hsm_restore_slices`]). REMOVE: ARCHIVED and the copy go
    /// (a file whose inode is gone: nothing more). [`HsmOutcome::Canceled`] when the request
    /// is no longer this agent's started request (nothing changes). Idempotent: this agent's
    /// completion of a request it already completed (the answer lost) returns the same outcome
    /// and changes nothing.
    fn hsm_complete(&self, agent: u64, request: u64, done: &HsmDone) -> Result<HsmOutcome>;
    /// A mover failed a request: with `retry` and attempts left, it waits again with backoff
    /// ([`HsmSettings::retry_backoff_ns`]); otherwise (or after [`HsmSettings::max_attempts`])
    /// it fails for good with `error` (a RESTORE's waiting openers get EIO, and
    /// `tierfs hsm action` shows `error`). Returns the request's new state (`Canceled` when it
    /// was not this agent's any more: nothing changed).
    fn hsm_fail(&self, agent: u64, request: u64, error: &str, retry: bool) -> Result<RequestState>;
    /// The coordinator's housekeeping, run by agents (and clients) now and then: started
    /// requests with no report for [`HsmSettings::request_timeout_ns`] go back to waiting
    /// (counted as a failed attempt, with backoff; failed once attempts are used up); agents
    /// silent as long are dropped; final requests older than [`HsmSettings::keep_done_ns`]
    /// are purged. Returns (requeued, agents dropped, purged).
    fn hsm_housekeep(&self) -> Result<(u64, u64, u64)>;
    /// An agent's sweep of archive `archive` (docs/hsm.md, "Leftovers"): for each object
    /// found there, whether it may be deleted. Yes only when no file's copy is at its key and
    /// the ARCHIVE request that wrote it (of that file, in that archive) ended more than
    /// `grace_ns` ago by the database's clock without recording this key (failed, canceled,
    /// stale, or it recorded another key): no mover can still make it a file's copy; or it
    /// recorded this key but a later archive of the same file replaced the copy more than
    /// `grace_ns` ago (superseded). An object whose request is active, recorded it for a file
    /// that has no other copy now (an unlinked file's copy stays unless
    /// [`HsmSettings::remove_archive_on_last_unlink`]), is unknown (purged after
    /// [`HsmSettings::keep_done_ns`], or not a mover's) or names another file is kept.
    fn hsm_sweepable(&self, archive: u32, items: &[SweepItem], grace_ns: i64) -> Result<Vec<bool>>;

    /// Up to `limit` recorded archive copies of files with inode numbers above `after`, in
    /// inode order, as (inode, archive id, copy): `tierfs fsck --archives` pages through them.
    fn hsm_copies(&self, after: Ino, limit: usize) -> Result<Vec<(Ino, u32, ArchiveCopy)>>;
}

/// Every domain of the metadata engine at once: what the client holds.
pub trait MetaEngine:
    Namespace + FileData + Sessions + Pcc + Locks + Admin + Changelog + Workers + Hsm
{
}

impl<T> MetaEngine for T where
    T: Namespace + FileData + Sessions + Pcc + Locks + Admin + Changelog + Workers + Hsm + ?Sized
{
}
