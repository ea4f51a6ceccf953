//! A failure-injecting metadata engine, for tests (Mountpoint for Amazon S3's
//! failure-injecting client is the model).
//!
//! [`FaultyEngine`] wraps any [`MetaEngine`] and passes every call through, except those a
//! shared [`FaultPlan`] says must fail. A plan names an operation (the method's name, e.g.
//! `"commit_slices"`, or any operation), which of its next calls fail and how:
//!
//! - [`Fault::Error`]: the call fails before reaching the database (a failed statement);
//! - [`Fault::Disconnect`]: the connection dropped before the call (`Unavailable`);
//! - [`Fault::Timeout`]: the call hangs for a while, then fails as unreachable, without
//!   reaching the database;
//! - [`Fault::LostReply`]: the call runs and commits, then its answer is lost (the connection
//!   dropped after the commit): the caller sees `Unavailable` although the change was made.
//! - [`Fault::HoldReply`]: the call runs, then its (correct) answer is held back until the test
//!   calls [`FaultPlan::release`]: a slow reply, for races between a reader and a writer.
//!
//! The plan can be changed while the engine is in use (a test mounts a client on the wrapper,
//! then injects faults between its own file operations) and counts every call per operation.
//! Every failure maps to `EIO` at the FUSE boundary, like the real failures it stands for (a
//! held reply is not a failure: the call succeeds once released).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::changelog::{ChangelogRecord, ChangelogStatus, IdleDeregistration, Mask};
use crate::engine::*;
use crate::error::{MetaError, Result};
use crate::hsm::*;
use crate::types::*;

/// How an injected call fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fails at once with a database error; nothing is changed.
    Error,
    /// Fails at once as if the connection had dropped; nothing is changed.
    Disconnect,
    /// Waits this long, then fails as unreachable; nothing is changed.
    Timeout(Duration),
    /// Runs the call (its transaction commits), then fails as if the answer was lost.
    LostReply,
    /// Runs the call, then holds its answer until [`FaultPlan::release`] (at most
    /// [`HOLD_LIMIT`], so a test that forgets cannot hang): the call succeeds, late.
    HoldReply,
}

/// The longest a [`Fault::HoldReply`] waits for [`FaultPlan::release`].
pub const HOLD_LIMIT: Duration = Duration::from_secs(30);

impl Fault {
    fn error(self, op: &str) -> MetaError {
        match self {
            Fault::Error => MetaError::Db(format!("injected failure of {op}")),
            Fault::Disconnect => {
                MetaError::Unavailable(format!("injected: connection dropped before {op}"))
            }
            Fault::Timeout(d) => MetaError::Unavailable(format!(
                "injected: {op} timed out after {} ms",
                d.as_millis()
            )),
            Fault::LostReply => {
                MetaError::Unavailable(format!("injected: connection dropped after {op} committed"))
            }
            Fault::HoldReply => MetaError::Unavailable(format!("injected: {op} held")),
        }
    }
}

/// One injection: which calls fail and how.
#[derive(Clone, Debug)]
struct Rule {
    /// The operation (method name); `None`: every operation.
    op: Option<String>,
    /// Matching calls to let through before the first failure.
    skip: u64,
    /// Matching calls that fail after the skipped ones (`u64::MAX`: until cleared).
    times: u64,
    fault: Fault,
}

#[derive(Default)]
struct PlanState {
    rules: Vec<Rule>,
    calls: HashMap<&'static str, u64>,
    injected: HashMap<&'static str, u64>,
    /// Calls whose answers are held ([`Fault::HoldReply`]) right now.
    holding: u64,
    /// Bumped by [`FaultPlan::release`]: held answers go.
    releases: u64,
}

/// Which calls of a [`FaultyEngine`] fail; shared between the test and the engine.
#[derive(Default)]
pub struct FaultPlan {
    state: Mutex<PlanState>,
    /// Signalled when a call starts or stops holding, and at [`FaultPlan::release`].
    held: parking_lot::Condvar,
}

impl FaultPlan {
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan::default())
    }

    /// The `n`-th next call of `op` (1 = the very next) fails once with `fault`.
    pub fn fail_nth(&self, op: &str, n: u64, fault: Fault) {
        self.add(Some(op), n.saturating_sub(1), 1, fault);
    }

    /// The next `times` calls of `op` fail with `fault`.
    pub fn fail_next(&self, op: &str, times: u64, fault: Fault) {
        self.add(Some(op), 0, times, fault);
    }

    /// Every call of `op` (`None`: of every operation) fails with `fault` until [`Self::clear`].
    pub fn fail_always(&self, op: Option<&str>, fault: Fault) {
        self.add(op, 0, u64::MAX, fault);
    }

    fn add(&self, op: Option<&str>, skip: u64, times: u64, fault: Fault) {
        self.state.lock().rules.push(Rule {
            op: op.map(str::to_string),
            skip,
            times,
            fault,
        });
    }

    /// Lets every answer held by [`Fault::HoldReply`] go.
    pub fn release(&self) {
        let mut st = self.state.lock();
        st.releases += 1;
        self.held.notify_all();
    }

    /// Waits (at most `limit`) until some call holds its answer; false if none did.
    pub fn wait_held(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut st = self.state.lock();
        while st.holding == 0 {
            if self.held.wait_until(&mut st, deadline).timed_out() {
                return st.holding > 0;
            }
        }
        true
    }

    /// Removes every pending injection (the counts stay).
    pub fn clear(&self) {
        self.state.lock().rules.clear();
    }

    /// Calls of `op` seen so far, failed ones included.
    pub fn calls(&self, op: &str) -> u64 {
        self.state.lock().calls.get(op).copied().unwrap_or(0)
    }

    /// Calls of `op` that an injection failed.
    pub fn injected(&self, op: &str) -> u64 {
        self.state.lock().injected.get(op).copied().unwrap_or(0)
    }

    /// Failures injected so far, over every operation.
    pub fn injected_total(&self) -> u64 {
        self.state.lock().injected.values().sum()
    }

    /// Counts a call of `op` and returns the fault it gets, if any. The first matching rule
    /// decides; a rule is spent once its failures are done.
    fn decide(&self, op: &'static str) -> Option<Fault> {
        let mut st = self.state.lock();
        *st.calls.entry(op).or_default() += 1;
        let mut fault = None;
        let mut spent = None;
        for (i, r) in st.rules.iter_mut().enumerate() {
            if r.op.as_deref().is_some_and(|o| o != op) {
                continue;
            }
            if r.skip > 0 {
                r.skip -= 1;
                continue;
            }
            fault = Some(r.fault);
            if r.times != u64::MAX {
                r.times -= 1;
                if r.times == 0 {
                    spent = Some(i);
                }
            }
            break;
        }
        if let Some(i) = spent {
            st.rules.remove(i);
        }
        if fault.is_some() {
            *st.injected.entry(op).or_default() += 1;
        }
        fault
    }

    /// Runs `f` (the real call) unless the plan fails this call of `op`.
    fn call<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.decide(op) {
            None => f(),
            Some(Fault::LostReply) => {
                let _ = f();
                Err(Fault::LostReply.error(op))
            }
            Some(Fault::Timeout(d)) => {
                std::thread::sleep(d);
                Err(Fault::Timeout(d).error(op))
            }
            Some(Fault::HoldReply) => {
                let r = f();
                let deadline = std::time::Instant::now() + HOLD_LIMIT;
                let mut st = self.state.lock();
                let gen = st.releases;
                st.holding += 1;
                self.held.notify_all();
                while st.releases == gen {
                    if self.held.wait_until(&mut st, deadline).timed_out() {
                        break;
                    }
                }
                st.holding -= 1;
                self.held.notify_all();
                r
            }
            Some(fault) => Err(fault.error(op)),
        }
    }
}

/// A [`MetaEngine`] that fails the calls its [`FaultPlan`] names and passes the rest to the
/// engine it wraps.
pub struct FaultyEngine {
    inner: Arc<dyn MetaEngine>,
    plan: Arc<FaultPlan>,
}

impl FaultyEngine {
    pub fn new(inner: Arc<dyn MetaEngine>, plan: Arc<FaultPlan>) -> FaultyEngine {
        FaultyEngine { inner, plan }
    }

    pub fn plan(&self) -> &Arc<FaultPlan> {
        &self.plan
    }

    /// The engine underneath, without injections (what a test checks results against).
    pub fn inner(&self) -> &Arc<dyn MetaEngine> {
        &self.inner
    }
}

/// Writes each listed method as a pass-through guarded by the plan.
macro_rules! guarded {
    ($( fn $name:ident(&self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty; )*) => {
        $(
            fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.plan.call(stringify!($name), || self.inner.$name($($arg),*))
            }
        )*
    };
}

impl Namespace for FaultyEngine {
    guarded! {
        fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr>;
        fn getattr(&self, ino: Ino) -> Result<Attr>;
        fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr>;
        fn create(&self, parent: Ino, name: &[u8], node: &NewNode, layout: Option<Layout>, open_by: Option<u64>) -> Result<Attr>;
        fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr>;
        fn unlink(&self, parent: Ino, name: &[u8]) -> Result<Ino>;
        fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()>;
        fn rename(&self, parent: Ino, name: &[u8], new_parent: Ino, new_name: &[u8], flags: u32) -> Result<Option<Ino>>;
        fn readdir(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<DirEntry>>;
        fn readdir_plus(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<(DirEntry, Attr)>>;
        fn readlink(&self, ino: Ino) -> Result<Vec<u8>>;
        fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>>;
        fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
        fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>>;
        fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()>;
        fn resolve_stripe_default(&self, dir: Ino) -> Result<StripeDefault>;
        fn set_dir_stripe(&self, dir: Ino, def: StripeDefault) -> Result<()>;
        fn set_file_layout(&self, ino: Ino, layout: &Layout) -> Result<()>;
        fn set_projid(&self, ino: Ino, projid: u32, inherit: bool) -> Result<u64>;
        fn get_projid(&self, ino: Ino) -> Result<(u32, bool)>;
        fn path_of(&self, ino: Ino) -> Result<Option<Vec<u8>>>;
        fn purge_orphans(&self, replaced_before: Nanos) -> Result<u64>;
        fn purge_unlinked(&self, max: u64, unlinked_before: Nanos) -> Result<u64>;
    }
}

impl FileData for FaultyEngine {
    guarded! {
        fn alloc_object_ids(&self, n: u64) -> Result<u64>;
        fn read_chunk(&self, ino: Ino, chunk: u64) -> Result<Vec<Slice>>;
        fn commit_slices(&self, ino: Ino, slices: &[Slice], new_end: u64, mtime: Nanos) -> Result<Attr>;
        fn fallocate(&self, ino: Ino, off: u64, len: u64, keep_size: bool, zero: bool) -> Result<Attr>;
        fn replace_chunk(&self, ino: Ino, chunk: u64, upto: u64, merged: &[Slice]) -> Result<bool>;
        fn rewrite_data(&self, ino: Ino, slices: &[Slice], size: u64, mtime: Nanos) -> Result<Attr>;
        fn trash(&self, limit: usize, open_grace: Duration) -> Result<Vec<TrashItem>>;
        fn trash_done(&self, ids: &[u64]) -> Result<()>;
    }

    /// The same operation as `commit_slices` (a client's commit of its buffered writes, under
    /// its session): plans name it `"commit_slices"`.
    fn commit_slices_for(
        &self,
        session: u64,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
    ) -> Result<Attr> {
        self.plan.call("commit_slices", || {
            self.inner
                .commit_slices_for(session, ino, slices, new_end, mtime)
        })
    }

    fn commit_slices_then(
        &self,
        session: Option<u64>,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
        set: &SetAttr,
    ) -> Result<Attr> {
        self.plan.call("commit_slices", || {
            self.inner
                .commit_slices_then(session, ino, slices, new_end, mtime, set)
        })
    }
}

impl Sessions for FaultyEngine {
    guarded! {
        fn register_session(&self, s: &SessionInfo) -> Result<u64>;
        fn register_session_unique(&self, s: &SessionInfo, timeout_ns: i64) -> Result<u64>;
        fn heartbeat(&self, session: u64) -> Result<()>;
        fn unregister_session(&self, session: u64) -> Result<()>;
        fn sessions(&self) -> Result<Vec<SessionInfo>>;
        fn reap_sessions(&self, timeout_ns: i64) -> Result<usize>;
        fn open_file(&self, session: u64, ino: Ino) -> Result<()>;
        fn record_opens_closes(&self, session: u64, opens: &[Ino], closes: &[Ino]) -> Result<Vec<Ino>>;
        fn close_files(&self, session: u64, inos: &[Ino]) -> Result<()>;
        fn client_alive(&self, client: &str, timeout_ns: i64) -> Result<bool>;
        fn client_session(&self, client: &str) -> Result<Option<(SessionInfo, i64)>>;
        fn db_now(&self) -> Result<Nanos>;
    }
}

impl Pcc for FaultyEngine {
    guarded! {
        fn pcc_lease(&self, ino: Ino) -> Result<Option<PccLease>>;
        fn getattr_leased(&self, ino: Ino) -> Result<(Attr, Option<PccLease>)>;
        fn pcc_acquire(&self, ino: Ino, client: &str) -> Result<PccLease>;
        fn pcc_acquire_dirty(&self, ino: Ino, client: &str) -> Result<PccLease>;
        fn pcc_create(&self, parent: Ino, name: &[u8], node: &NewNode, layout: Option<Layout>, open_by: Option<u64>, client: &str, want: &dyn Fn(&Attr) -> bool) -> Result<(Attr, Option<PccLease>)>;
        fn pcc_open(&self, session: u64, ino: Ino, client: &str, write: bool, snapshot: Option<u64>) -> Result<PccOpen>;
        fn pcc_report(&self, ino: Ino, client: &str, generation: u64, dirty: bool, size: u64, mtime: Nanos) -> Result<Attr>;
        fn pcc_report_then(&self, ino: Ino, client: &str, generation: u64, dirty: bool, size: u64, mtime: Nanos, then: &SetAttr) -> Result<Attr>;
        fn pcc_release(&self, ino: Ino, client: &str, generation: u64) -> Result<bool>;
        fn pcc_break(&self, ino: Ino, client: &str, generation: u64) -> Result<bool>;
        fn pcc_request_recall(&self, ino: Ino, requester: &str, write: bool) -> Result<u64>;
        fn pcc_recalls_for(&self, client: &str) -> Result<Vec<PccRecall>>;
        fn pcc_snapshot_served(&self, ino: Ino, client: &str, generation: u64, seq: u64) -> Result<bool>;
        fn pcc_leases_of(&self, client: &str) -> Result<Vec<PccLease>>;
        fn pcc_rule_add(&self, mode: &str, client: Option<&str>, rule: &str, quota: Option<u64>) -> Result<u64>;
        fn pcc_rule_set_quota(&self, id: u64, quota: Option<u64>) -> Result<()>;
        fn pcc_rules(&self) -> Result<Vec<PccRuleRow>>;
        fn pcc_rule_del(&self, id: u64) -> Result<()>;
    }
}

impl Locks for FaultyEngine {
    guarded! {
        fn set_lock(&self, ino: Ino, lock: &LockRange) -> Result<()>;
        fn test_lock(&self, ino: Ino, lock: &LockRange) -> Result<Option<LockRange>>;
        fn release_locks(&self, ino: Ino, session: u64, owner: u64, flock: bool) -> Result<()>;
    }
}

impl Admin for FaultyEngine {
    guarded! {
        fn info(&self) -> Result<FsInfo>;
        fn targets(&self) -> Result<Vec<TargetInfo>>;
        fn usage(&self) -> Result<Usage>;
        fn inodes_used(&self) -> Result<u64>;
        fn sync(&self) -> Result<()>;
        fn maintain(&self) -> Result<()>;
        fn export_rows(&self, sink: &mut dyn FnMut(DumpRow) -> Result<()>) -> Result<()>;
        fn import_rows(&self, rows: &mut dyn Iterator<Item = Result<DumpRow>>) -> Result<u64>;
        fn object_refs(&self) -> Result<Vec<ObjectRef>>;
        fn object_id_counter(&self) -> Result<u64>;
        fn meta_issues(&self, timeout_ns: i64) -> Result<Vec<MetaIssue>>;
        fn repair_issue(&self, issue: &MetaIssue, timeout_ns: i64) -> Result<bool>;
        fn listen(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>>;
    }
}

impl Changelog for FaultyEngine {
    guarded! {
        fn changelog_register(&self, mask: Mask, idle: Duration) -> Result<u64>;
        fn changelog_register_follower(&self, mask: Mask, idle: Duration, client: &str) -> Result<u64>;
        fn changelog_deregister(&self, reader: u64) -> Result<u64>;
        fn changelog_clear(&self, reader: u64, endrec: u64) -> Result<u64>;
        fn changelog_read(&self, reader: Option<u64>, mask: Mask, start: u64, end: u64, limit: usize) -> Result<Vec<ChangelogRecord>>;
        fn changelog_status(&self) -> Result<ChangelogStatus>;
        fn changelog_expire(&self) -> Result<Vec<IdleDeregistration>>;
        fn changelog_wanted(&self, client: &str) -> Result<Mask>;
    }
}

impl Workers for FaultyEngine {
    guarded! {
        fn report_workers(&self, session: u64, reports: &[WorkerReport]) -> Result<()>;
        fn worker_reports(&self) -> Result<Vec<WorkerReport>>;
    }
}

impl Hsm for FaultyEngine {
    guarded! {
        fn hsm_archive_add(&self, id: u32, url: &str) -> Result<()>;
        fn hsm_archive_del(&self, id: u32) -> Result<()>;
        fn hsm_archives(&self) -> Result<Vec<Archive>>;
        fn hsm_settings(&self) -> Result<HsmSettings>;
        fn hsm_set_settings(&self, s: &HsmSettings) -> Result<()>;
        fn hsm_state(&self, ino: Ino) -> Result<HsmState>;
        fn hsm_set_flags(&self, ino: Ino, set: u32, clear: u32) -> Result<HsmState>;
        fn hsm_release(&self, ino: Ino) -> Result<Attr>;
        fn hsm_import(&self, archive_id: u32, items: &[HsmImport]) -> Result<Vec<Attr>>;
        fn hsm_copies(&self, after: Ino, limit: usize) -> Result<Vec<(Ino, u32, ArchiveCopy)>>;
        fn hsm_request(&self, ino: Ino, action: HsmAction, archive_id: Option<u32>) -> Result<Option<HsmRequest>>;
        fn hsm_cancel(&self, ino: Ino) -> Result<u64>;
        fn hsm_cancel_request(&self, id: u64) -> Result<HsmRequest>;
        fn hsm_get_request(&self, id: u64) -> Result<HsmRequest>;
        fn hsm_action(&self, ino: Ino) -> Result<Option<HsmRequest>>;
        fn hsm_list(&self, filter: &HsmListFilter) -> Result<Vec<HsmRequest>>;
        fn hsm_agent_register(&self, info: &HsmAgentInfo) -> Result<u64>;
        fn hsm_agent_heartbeat(&self, agent: u64) -> Result<()>;
        fn hsm_agent_unregister(&self, agent: u64) -> Result<u64>;
        fn hsm_agents(&self) -> Result<Vec<HsmAgent>>;
        fn hsm_take(&self, agent: u64, max: usize) -> Result<Vec<HsmTask>>;
        fn hsm_progress(&self, agent: u64, request: u64, bytes_moved: u64) -> Result<Progress>;
        fn hsm_restore_slices(&self, agent: u64, request: u64, slices: &[Slice]) -> Result<Progress>;
        fn hsm_complete(&self, agent: u64, request: u64, done: &HsmDone) -> Result<HsmOutcome>;
        fn hsm_fail(&self, agent: u64, request: u64, error: &str, retry: bool) -> Result<RequestState>;
        fn hsm_housekeep(&self) -> Result<(u64, u64, u64)>;
        fn hsm_sweepable(&self, archive: u32, items: &[SweepItem], grace_ns: i64) -> Result<Vec<bool>>;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteMeta;

    fn wrapped() -> (tempfile::TempDir, FaultyEngine) {
        let d = tempfile::tempdir().unwrap();
        let e = SqliteMeta::format(&d.path().join("m.db"), &crate::conformance::params()).unwrap();
        let inner: Arc<dyn MetaEngine> = Arc::new(e);
        (d, FaultyEngine::new(inner, FaultPlan::new()))
    }

    fn file(e: &dyn MetaEngine, name: &str) -> Result<Attr> {
        e.create(
            ROOT_INO,
            name.as_bytes(),
            &NewNode {
                kind: Kind::File,
                perm: 0o644,
                uid: 0,
                gid: 0,
                rdev: 0,
                symlink: None,
            },
            None,
            None,
        )
    }

    /// With no injection the wrapper is the engine: the whole conformance suite passes
    /// through it (every method is forwarded with its arguments in order).
    #[test]
    fn conformance_suite_passes_through_an_idle_plan() {
        crate::conformance::run_all(&|| {
            let (d, e) = wrapped();
            (
                Box::new(d) as Box<dyn std::any::Any>,
                Box::new(e) as Box<dyn MetaEngine>,
            )
        });
    }

    #[test]
    fn the_nth_call_fails_once_and_changes_nothing() {
        let (_d, e) = wrapped();
        e.plan().fail_nth("create", 2, Fault::Error);
        file(&e, "a").unwrap();
        let err = file(&e, "b").unwrap_err();
        assert_eq!(err.errno(), libc::EIO, "{err}");
        assert!(matches!(e.lookup(ROOT_INO, b"b"), Err(MetaError::NotFound)));
        file(&e, "c").unwrap();
        file(&e, "b").unwrap();
        assert_eq!(e.plan().calls("create"), 4);
        assert_eq!(e.plan().injected("create"), 1);
        // Other operations were never touched.
        assert_eq!(e.plan().injected_total(), 1);
    }

    /// A mover whose completion's answer is lost sends it again and learns the copy was
    /// recorded (it must not delete it).
    #[test]
    fn an_hsm_completion_whose_answer_is_lost_is_answered_again() {
        let (_d, e) = wrapped();
        e.hsm_archive_add(1, "file:///a").unwrap();
        let f = file(&e, "f").unwrap();
        let r = e
            .hsm_request(f.ino, HsmAction::Archive, None)
            .unwrap()
            .unwrap();
        let agent = e
            .hsm_agent_register(&HsmAgentInfo {
                archives: vec![1],
                ..Default::default()
            })
            .unwrap();
        let t = e.hsm_take(agent, 1).unwrap().pop().unwrap();
        let done = HsmDone {
            key: "k".into(),
            data_version: t.data_version,
            ..Default::default()
        };
        e.plan().fail_next("hsm_complete", 1, Fault::LostReply);
        let err = e.hsm_complete(agent, r.id, &done).unwrap_err();
        assert!(matches!(err, MetaError::Unavailable(_)), "{err}");
        assert_eq!(
            e.hsm_complete(agent, r.id, &done).unwrap(),
            HsmOutcome::Done
        );
        assert!(e.getattr(f.ino).unwrap().hsm.archived());
        assert_eq!(e.plan().calls("hsm_complete"), 2);
    }

    #[test]
    fn a_lost_reply_fails_the_call_but_its_change_is_committed() {
        let (_d, e) = wrapped();
        e.plan().fail_next("create", 1, Fault::LostReply);
        let err = file(&e, "x").unwrap_err();
        assert!(matches!(err, MetaError::Unavailable(_)), "{err}");
        assert_eq!(err.errno(), libc::EIO);
        e.lookup(ROOT_INO, b"x").expect("the create committed");
        // A retry by the caller then finds the name taken.
        assert!(matches!(file(&e, "x"), Err(MetaError::Exists)));
    }

    #[test]
    fn a_timeout_waits_then_fails_without_a_change() {
        let (_d, e) = wrapped();
        e.plan()
            .fail_next("create", 1, Fault::Timeout(Duration::from_millis(200)));
        let t = std::time::Instant::now();
        let err = file(&e, "t").unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(200));
        assert!(matches!(err, MetaError::Unavailable(_)), "{err}");
        assert!(matches!(e.lookup(ROOT_INO, b"t"), Err(MetaError::NotFound)));
    }

    #[test]
    fn fail_always_holds_until_cleared_and_covers_every_operation() {
        let (_d, e) = wrapped();
        e.plan().fail_always(None, Fault::Disconnect);
        assert!(matches!(
            e.getattr(ROOT_INO),
            Err(MetaError::Unavailable(_))
        ));
        assert!(matches!(e.info(), Err(MetaError::Unavailable(_))));
        assert!(matches!(file(&e, "d"), Err(MetaError::Unavailable(_))));
        e.plan().clear();
        file(&e, "d").unwrap();
        assert_eq!(e.plan().injected_total(), 3);
    }

    /// A held reply carries the answer from before a change made while it was held: the
    /// stale answer a slow engine gives a reader racing a writer.
    #[test]
    fn a_held_reply_answers_late_with_what_it_read() {
        let (_d, e) = wrapped();
        let e = Arc::new(e);
        let f = file(&*e, "h").unwrap();
        e.plan().fail_next("getattr", 1, Fault::HoldReply);
        let reader = {
            let e = Arc::clone(&e);
            std::thread::spawn(move || e.getattr(f.ino))
        };
        assert!(
            e.plan().wait_held(Duration::from_secs(10)),
            "the reply was never held"
        );
        let set = SetAttr {
            perm: Some(0o600),
            ..Default::default()
        };
        e.inner().setattr(f.ino, &set).unwrap();
        assert!(!reader.is_finished(), "a held reply waits for release");
        e.plan().release();
        let old = reader.join().unwrap().unwrap();
        assert_eq!(
            old.perm, 0o644,
            "the held answer is the one read before the change"
        );
        assert_eq!(e.getattr(f.ino).unwrap().perm, 0o600);
    }
}
