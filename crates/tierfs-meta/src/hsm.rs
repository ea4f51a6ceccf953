//! HSM's public vocabulary (docs/hsm.md): a file's HSM flags (Lustre's), archive backends,
//! the coordinator's requests and their states, copytool agents, the coordinator's settings,
//! and the errors of HSM operations.
//!
//! The operations are [`crate::engine::Hsm`]'s; their one implementation is `core/hsm.rs`
//! (tables, state machine, queue), for every engine.

use std::fmt;

use serde::Serialize;

use crate::types::{Ino, Layout, Nanos};

/// A file's HSM flags, Lustre's bits (`lfs hsm_state` prints the same numbers). Stored in the
/// `hsm` column of `inodes`, so that a file with no HSM state (0) costs nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct HsmFlags(pub u32);

impl HsmFlags {
    /// The file has HSM state: an action was requested on it, it has (or had) an archive
    /// copy, or flags were set by hand.
    pub const EXISTS: u32 = 0x1;
    /// The file changed since its archive copy was made (a write, truncate, fallocate or
    /// RW-PCC write-back of an archived file sets it in the same transaction).
    pub const DIRTY: u32 = 0x2;
    /// The file's data lives only in the archive: its capacity-tier objects went to the
    /// trash; size and times are kept. An open or read restores it.
    pub const RELEASED: u32 = 0x4;
    /// An archive copy exists (`archive_id`, the data version it holds).
    pub const ARCHIVED: u32 = 0x8;
    /// Release is refused (set by the user).
    pub const NORELEASE: u32 = 0x10;
    /// Archive is refused (set by the user).
    pub const NOARCHIVE: u32 = 0x20;
    /// The archive copy is lost (set by the user or an agent): restore is refused.
    pub const LOST: u32 = 0x40;

    /// The flags `tierfs hsm set|clear` may change.
    pub const USER_SETTABLE: u32 = Self::NORELEASE | Self::NOARCHIVE | Self::DIRTY | Self::LOST;

    /// Names in Lustre's order, as `lfs hsm_state` prints them.
    const NAMES: &'static [(u32, &'static str)] = &[
        (Self::RELEASED, "released"),
        (Self::EXISTS, "exists"),
        (Self::DIRTY, "dirty"),
        (Self::NORELEASE, "no_release"),
        (Self::NOARCHIVE, "no_archive"),
        (Self::ARCHIVED, "archived"),
        (Self::LOST, "lost_from_hsm"),
    ];

    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    pub fn released(self) -> bool {
        self.has(Self::RELEASED)
    }

    pub fn archived(self) -> bool {
        self.has(Self::ARCHIVED)
    }

    pub fn dirty(self) -> bool {
        self.has(Self::DIRTY)
    }

    /// The set flags' names, space separated (`released exists archived`); empty for none.
    pub fn names(self) -> String {
        Self::NAMES
            .iter()
            .filter(|(b, _)| self.has(*b))
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `(0x0000000d) released exists archived`, as `lfs hsm_state`.
impl fmt::Display for HsmFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(0x{:08x}) {}", self.0, self.names())
    }
}

/// A file's HSM state ([`crate::engine::Hsm::hsm_state`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HsmState {
    pub ino: Ino,
    pub flags: HsmFlags,
    /// The archive holding its copy (0: none).
    pub archive_id: u32,
    /// The copy in that archive, when there is one.
    pub copy: Option<ArchiveCopy>,
}

/// What the archive holds of one file: written by an archive's completion (or an import),
/// read by a restore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ArchiveCopy {
    /// Where in the archive (relative to the archive's URL): the mover chose it.
    pub key: String,
    /// The file's data version the copy holds (compared with the file's at completion: a file
    /// changed during the copy is not marked archived).
    pub data_version: u64,
    /// Bytes in the copy (the file's size when it was copied).
    pub size: u64,
    /// The copy's checksums as `algorithm:hex`, with the per-chunk ones the movers write
    /// (`crc32:<whole>;chunks:<bytes>:<hex...>`, tierfs-client's `copysum`); restore verifies them.
    pub checksum: String,
    /// When the copy was recorded (database clock).
    pub archived_at: Nanos,
}

/// An archive backend: `tierfs hsm archive-add ID URL`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Archive {
    /// 1..=[`MAX_ARCHIVE_ID`] (Lustre's archive ids are small numbers too).
    pub id: u32,
    /// `file:///dir` or `s3://bucket/prefix?...` (the movers understand it).
    pub url: String,
    pub created: Nanos,
}

/// The largest archive id.
pub const MAX_ARCHIVE_ID: u32 = 0xffff;

/// What a request asks a mover to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HsmAction {
    /// Copy the file's capacity-tier data to the archive.
    Archive = 1,
    /// Copy a released file's data back from the archive into the capacity tier.
    Restore = 2,
    /// Delete the archive copy.
    Remove = 3,
}

impl HsmAction {
    pub fn from_num(n: i64) -> Option<HsmAction> {
        match n {
            1 => Some(HsmAction::Archive),
            2 => Some(HsmAction::Restore),
            3 => Some(HsmAction::Remove),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HsmAction::Archive => "ARCHIVE",
            HsmAction::Restore => "RESTORE",
            HsmAction::Remove => "REMOVE",
        }
    }

    /// The priority a request of this action gets: restores first (a reader waits for
    /// them; LU-8324), then removals, then archives. Higher is taken first.
    pub fn default_priority(self) -> i32 {
        match self {
            HsmAction::Restore => 100,
            HsmAction::Remove => 50,
            HsmAction::Archive => 0,
        }
    }
}

impl fmt::Display for HsmAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a request is in its life. Waiting and started are *active*; the others are final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RequestState {
    /// Queued (again, after a retry or a requeue: see `next_try`).
    Waiting = 0,
    /// Taken by an agent, which reports progress.
    Started = 1,
    Succeeded = 2,
    /// Failed for good (attempts used up, or an error not worth retrying): `last_error` says why.
    Failed = 3,
    Canceled = 4,
}

impl RequestState {
    pub fn from_num(n: i64) -> Option<RequestState> {
        match n {
            0 => Some(RequestState::Waiting),
            1 => Some(RequestState::Started),
            2 => Some(RequestState::Succeeded),
            3 => Some(RequestState::Failed),
            4 => Some(RequestState::Canceled),
            _ => None,
        }
    }

    /// As `tierfs hsm action` prints it (Lustre's words: WAITING, STARTED, SUCCEED, FAILED,
    /// CANCELED; STARTED is shown as RUNNING by the CLI).
    pub fn name(self) -> &'static str {
        match self {
            RequestState::Waiting => "WAITING",
            RequestState::Started => "STARTED",
            RequestState::Succeeded => "SUCCEEDED",
            RequestState::Failed => "FAILED",
            RequestState::Canceled => "CANCELED",
        }
    }

    pub fn is_active(self) -> bool {
        matches!(self, RequestState::Waiting | RequestState::Started)
    }
}

impl fmt::Display for RequestState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One request of the coordinator's queue. Times are the database's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HsmRequest {
    pub id: u64,
    /// The file (for a REMOVE queued by an unlink, an inode that may no longer exist).
    pub ino: Ino,
    pub action: HsmAction,
    pub archive_id: u32,
    /// Higher first ([`HsmAction::default_priority`]).
    pub priority: i32,
    pub state: RequestState,
    /// The agent that holds it (started) or held it last.
    pub agent: Option<u64>,
    pub created: Nanos,
    /// When the current (or last) attempt was taken.
    pub started: Option<Nanos>,
    /// The last change: a take, a progress report, a completion.
    pub updated: Nanos,
    /// Bytes moved so far by the current attempt (the last progress report).
    pub bytes_moved: u64,
    /// Bytes the action moves in all (the file's size when taken; 0 for REMOVE).
    pub bytes_total: u64,
    /// Attempts taken so far (a requeue after a silent agent counts as one).
    pub attempts: u32,
    /// A waiting request is not taken before this (retry backoff).
    pub next_try: Nanos,
    /// Why the last attempt failed (kept when a later one succeeds).
    pub last_error: Option<String>,
    /// REMOVE (and RESTORE): the archive copy's key when queued; ARCHIVE: the key it recorded
    /// (once succeeded with outcome Done), else none.
    pub key: Option<String>,
    /// RESTORE: the end of the restored prefix, the file's bytes `0..restored` committed by
    /// [`crate::engine::Hsm::hsm_restore_slices`] (verified by the mover before it commits):
    /// readable while the rest still moves. 0 for other actions.
    pub restored: u64,
}

/// A request taken by an agent ([`crate::engine::Hsm::hsm_take`]): the request and what the
/// mover needs to do it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HsmTask {
    pub request: HsmRequest,
    /// The archive's URL.
    pub archive_url: String,
    /// ARCHIVE: the file's data version when taken (the mover reads the data after the take
    /// and reports the version it copied in [`HsmDone::data_version`]). RESTORE/REMOVE: the
    /// copy's.
    pub data_version: u64,
    /// The file's size when taken (ARCHIVE), or the copy's (RESTORE).
    pub size: u64,
    /// RESTORE and REMOVE: the copy to read or delete.
    pub copy: Option<ArchiveCopy>,
}

/// An object found in an archive by an agent's sweep ([`crate::engine::Hsm::hsm_sweepable`]),
/// with what its name says: the file and the ARCHIVE request that wrote it (a mover's copies
/// are `<ino as 16 hex digits>/v<version>.r<request>`, its staging files that plus `#<n>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepItem {
    pub key: String,
    pub ino: Ino,
    pub request: u64,
}

/// What a mover reports when it finished a request ([`crate::engine::Hsm::hsm_complete`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HsmDone {
    /// ARCHIVE: where the copy is (relative to the archive's URL). Ignored otherwise.
    pub key: String,
    /// ARCHIVE: the file's data version the copy holds: the one the mover saw before reading
    /// the first byte (with no write in between, see docs/hsm.md). RESTORE: the copy's.
    pub data_version: u64,
    /// ARCHIVE: bytes in the copy.
    pub size: u64,
    /// ARCHIVE: the copy's checksums, `algorithm:hex[;chunks:...]` ([`ArchiveCopy::checksum`]).
    pub checksum: String,
    /// Bytes moved in all.
    pub bytes_moved: u64,
}

/// What a completion did to the file ([`crate::engine::Hsm::hsm_complete`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum HsmOutcome {
    /// The file's state changed as the action says (ARCHIVED, restored, copy removed).
    Done,
    /// ARCHIVE of a file that changed during the copy: the copy is not recorded (the file is
    /// dirty / not archived); the request succeeded, the mover should delete its copy.
    Stale,
    /// The request had been canceled (or requeued after a timeout, or the file went): the
    /// completion changed nothing; the mover should delete what it wrote.
    Canceled,
}

/// A progress report's answer ([`crate::engine::Hsm::hsm_progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Progress {
    /// Go on.
    Continue,
    /// Stop at once: the request was canceled, or is no longer this agent's (requeued after
    /// a timeout), or its file went.
    Stop,
}

/// A copytool agent as it registers ([`crate::engine::Hsm::hsm_agent_register`]). An agent
/// is not a client session: `tierfs agent` runs without a mount.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HsmAgentInfo {
    /// A name for humans (`host:pid` or the client's name).
    pub name: String,
    pub host: String,
    pub pid: u32,
    /// The archives it serves.
    pub archives: Vec<u32>,
    /// The most requests it runs at once (its own limit; the coordinator's per-agent cap
    /// also applies, the smaller wins). 0: the coordinator's cap.
    pub max_requests: u32,
}

/// A registered agent ([`crate::engine::Hsm::hsm_agents`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HsmAgent {
    pub id: u64,
    pub info: HsmAgentInfo,
    pub registered: Nanos,
    /// The last heartbeat (or progress report), database clock.
    pub heartbeat: Nanos,
    /// Requests it holds now (started).
    pub running: u32,
}

/// The coordinator's settings, kept in the metadata database so that every agent and client
/// applies the same (`tierfs hsm config`). Defaults in [`HsmSettings::default`], documented
/// in docs/hsm.md.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HsmSettings {
    /// The most requests one agent holds at once (default 4).
    pub max_per_agent: u32,
    /// The most requests started on one archive at once, all agents together (default 16).
    pub max_per_archive: u32,
    /// A started request whose agent reported nothing (no progress, no heartbeat for it) for
    /// this long is requeued, by the database's clock (default 300 s; Lustre's
    /// `active_request_timeout` is 3600 s).
    pub request_timeout_ns: i64,
    /// Attempts per request before it fails for good (default 3).
    pub max_attempts: u32,
    /// The wait before attempt n+1 is `retry_backoff_ns * 2^(n-1)` (default 10 s).
    pub retry_backoff_ns: i64,
    /// Final requests (succeeded, failed, canceled) are kept this long for `tierfs hsm list`
    /// and `tierfs hsm action` (default 1 day).
    pub keep_done_ns: i64,
    /// The archive an archive request without `--archive` goes to (0: the only registered
    /// archive, an error when there are several).
    pub default_archive: u32,
    /// Unlinking the last name of an archived file queues a REMOVE of its copy (Lustre's
    /// `remove_archive_on_last_unlink`; default off, as Lustre's).
    pub remove_archive_on_last_unlink: bool,
}

const SEC: i64 = 1_000_000_000;

impl Default for HsmSettings {
    fn default() -> Self {
        HsmSettings {
            max_per_agent: 4,
            max_per_archive: 16,
            request_timeout_ns: 300 * SEC,
            max_attempts: 3,
            retry_backoff_ns: 10 * SEC,
            keep_done_ns: 86_400 * SEC,
            default_archive: 0,
            remove_archive_on_last_unlink: false,
        }
    }
}

/// Which requests `tierfs hsm list` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HsmListFilter {
    /// Also final requests (kept for [`HsmSettings::keep_done_ns`]).
    pub include_done: bool,
    pub ino: Option<Ino>,
    pub archive_id: Option<u32>,
    /// At most this many (0: no limit).
    pub limit: usize,
}

/// One file to import as a released file ([`crate::engine::Hsm::hsm_import`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HsmImport {
    pub parent: Ino,
    pub name: Vec<u8>,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: Nanos,
    /// The data's key under the archive's URL.
    pub key: String,
    /// `algorithm:hex`, or empty when the archive gave none (restore then cannot verify).
    pub checksum: String,
    /// The layout the restored data gets (chosen by the caller's allocator, as for a create).
    pub layout: Layout,
}

/// Changelog HSM records' `flags`, Lustre's layout (`CLF_HSM_*`): bits 0..=6 an error code
/// (0: success), bits 7..=9 the [`HsmEvent`], bit 10 [`CLF_HSM_DIRTY`].
pub fn changelog_flags(event: HsmEvent, error: u32, dirty: bool) -> u32 {
    (error & 0x7f) | ((event as u32) << 7) | if dirty { CLF_HSM_DIRTY } else { 0 }
}

/// Changelog HSM flag: the file is dirty after the event (Lustre's CLF_HSM_DIRTY, bit 10).
pub const CLF_HSM_DIRTY: u32 = 1 << 10;

/// The event of a changelog HSM record (Lustre's `enum hsm_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum HsmEvent {
    /// An archive ended (success, or error in the flags).
    Archive = 0,
    /// A restore ended.
    Restore = 1,
    /// A request was canceled.
    Cancel = 2,
    /// The file was released.
    Release = 3,
    /// An archive copy was removed.
    Remove = 4,
    /// Flags changed by hand (`tierfs hsm set|clear`) or a write made an archived file dirty.
    State = 5,
}

impl HsmEvent {
    /// The event of a record's flags.
    pub fn of_flags(flags: u32) -> Option<HsmEvent> {
        match (flags >> 7) & 0x7 {
            0 => Some(HsmEvent::Archive),
            1 => Some(HsmEvent::Restore),
            2 => Some(HsmEvent::Cancel),
            3 => Some(HsmEvent::Release),
            4 => Some(HsmEvent::Remove),
            5 => Some(HsmEvent::State),
            _ => None,
        }
    }
}

/// Bad input to, or a refusal of, an HSM operation; each prints as one line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HsmError {
    #[error("unknown archive id {0} (see tierfs hsm archives)")]
    UnknownArchive(u32),
    #[error("archive id {0} is out of range (1..=65535)")]
    BadArchiveId(u32),
    #[error("archive id {0} already exists ({1})")]
    ArchiveExists(u32, String),
    #[error("archive {0} still holds copies of {1} files (remove them first)")]
    ArchiveInUse(u32, u64),
    #[error("no archive given and {0} are registered: say which with --archive")]
    WhichArchive(usize),
    #[error("no archive is registered (tierfs hsm archive-add ID URL)")]
    NoArchive,
    #[error("the file is archived in archive {have}, not {asked} (remove that copy first)")]
    OtherArchive { have: u32, asked: u32 },
    #[error("not a regular file")]
    NotAFile,
    #[error("release refused: the file is dirty (changed since its archive copy)")]
    ReleaseDirty,
    #[error("release refused: the file is not archived")]
    ReleaseNotArchived,
    #[error("release refused: the file is marked norelease")]
    ReleaseNoRelease,
    #[error("release refused: the file is open ({0})")]
    ReleaseOpen(&'static str),
    #[error("archive refused: the file is marked noarchive")]
    NoArchiveFlag,
    #[error("the file is released: its data is in the archive only (restore it first)")]
    Released,
    #[error("restore refused: the archive copy is marked lost")]
    Lost,
    #[error("the file has no archive copy")]
    NoCopy,
    #[error("the file has an active {0} request (cancel it first)")]
    Busy(HsmAction),
    #[error("nothing to cancel: no waiting or running request")]
    NothingToCancel,
    #[error("flag 0x{0:x} cannot be set or cleared by hand")]
    NotSettable(u32),
    #[error("no HSM request {0}")]
    UnknownRequest(u64),
    #[error("no HSM agent {0} (unregistered, or dropped after missing its heartbeats)")]
    UnknownAgent(u64),
    #[error("restore failed: {0}")]
    RestoreFailed(String),
    #[error(
        "this filesystem's metadata is schema v{found}, which has no HSM (v{needed} and later); \
         mount it with this tierfs once to upgrade it"
    )]
    OldSchema { found: i64, needed: i64 },
    #[error("bad HSM setting: {0}")]
    BadSetting(String),
}

impl HsmError {
    /// The errno an application (or the CLI's exit) sees; the brief's choices: release of a
    /// dirty file EBUSY, of a norelease file EPERM, of an unarchived one EINVAL; an unknown
    /// archive EINVAL; a failed restore EIO.
    pub fn errno(&self) -> i32 {
        match self {
            HsmError::ReleaseDirty
            | HsmError::ReleaseOpen(_)
            | HsmError::Busy(_)
            | HsmError::ArchiveInUse(..)
            | HsmError::ArchiveExists(..) => libc::EBUSY,
            HsmError::ReleaseNoRelease | HsmError::NoArchiveFlag => libc::EPERM,
            HsmError::RestoreFailed(_) | HsmError::Lost | HsmError::Released => libc::EIO,
            HsmError::NothingToCancel
            | HsmError::UnknownRequest(_)
            | HsmError::UnknownAgent(_)
            | HsmError::NoCopy => libc::ENOENT,
            _ => libc::EINVAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_print_like_lfs_hsm_state() {
        let f = HsmFlags(HsmFlags::RELEASED | HsmFlags::EXISTS | HsmFlags::ARCHIVED);
        assert_eq!(f.to_string(), "(0x0000000d) released exists archived");
        assert_eq!(HsmFlags(0).to_string(), "(0x00000000) ");
        assert!(f.released() && f.archived() && !f.dirty());
    }

    #[test]
    fn changelog_flags_are_lustres_layout() {
        let f = changelog_flags(HsmEvent::Release, 0, false);
        assert_eq!(f, 3 << 7);
        assert_eq!(HsmEvent::of_flags(f), Some(HsmEvent::Release));
        let f = changelog_flags(HsmEvent::Archive, 5, true);
        assert_eq!(f & 0x7f, 5);
        assert_eq!(HsmEvent::of_flags(f), Some(HsmEvent::Archive));
        assert_ne!(f & CLF_HSM_DIRTY, 0);
    }

    #[test]
    fn errnos_are_the_briefs() {
        assert_eq!(HsmError::ReleaseDirty.errno(), libc::EBUSY);
        assert_eq!(HsmError::ReleaseNoRelease.errno(), libc::EPERM);
        assert_eq!(HsmError::ReleaseNotArchived.errno(), libc::EINVAL);
        assert_eq!(HsmError::UnknownArchive(3).errno(), libc::EINVAL);
        assert_eq!(HsmError::RestoreFailed("x".into()).errno(), libc::EIO);
    }
}
