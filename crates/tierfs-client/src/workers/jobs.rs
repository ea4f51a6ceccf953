//! The daemon's workers (see [`super`] for the machinery and docs/architecture.md for the list
//! and the order they stop in at unmount).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tierfs_meta::{Ino, MetaEngine};

use super::{Ctx, Next, Registry, State, Status, WorkError, Worker};
use crate::data::DataPath;
use crate::metrics::Metrics;
use crate::pcc::Pcc;
use crate::session::Session;

/// How often the `worker-reports` worker publishes the workers' status to the database.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(3);
/// How often the close recorder records the closes queued by FUSE releases.
pub const CLOSE_INTERVAL: Duration = Duration::from_millis(50);
/// How often the PCC workers look at the cache (write-back due, writers' sizes, watermarks).
pub const PCC_INTERVAL: Duration = Duration::from_millis(200);
/// Chunks the compactor looks at per round (one round per `gc_interval_secs`).
pub const COMPACT_PER_ROUND: usize = 64;

/// Since when this client's heartbeats have succeeded without a break (mounting counts as
/// one): the session reaper reaps others only after a whole session timeout of it.
pub struct Health {
    since: Mutex<Instant>,
    /// The last heartbeat that succeeded (mounting counts as one).
    last_ok: Mutex<Instant>,
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health {
            since: Mutex::new(Instant::now()),
            last_ok: Mutex::new(Instant::now()),
        })
    }

    fn broken(&self) {
        *self.since.lock() = Instant::now();
    }

    fn ok(&self) {
        *self.last_ok.lock() = Instant::now();
    }

    /// Whether a heartbeat succeeded within `d`.
    pub fn beat_within(&self, d: Duration) -> bool {
        self.last_ok.lock().elapsed() < d
    }

    fn healthy_for(&self) -> Duration {
        self.since.lock().elapsed()
    }
}

/// `heartbeat`: the session's heartbeat, alone on its thread (it takes no lock of the client's
/// that another worker holds; the engine's own write lock is held for one statement at a time;
/// on PostgreSQL it has a database connection of its own, `Driver::write_priority`). The
/// engine stamps it with the database's clock. When the session is gone (reaped or evicted),
/// the client fences itself and carries on under a new session ([`Session::ended`]).
pub struct Heartbeat {
    pub meta: Arc<dyn MetaEngine>,
    pub session: Arc<Session>,
    pub every: Duration,
    pub health: Arc<Health>,
}

impl Worker for Heartbeat {
    fn name(&self) -> &'static str {
        "heartbeat"
    }
    fn interval(&self) -> Duration {
        self.every
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        let id = self.session.id();
        match self.meta.heartbeat(id) {
            Ok(()) => {
                self.health.ok();
                Ok(Next::Idle)
            }
            Err(tierfs_meta::MetaError::NotFound) => {
                // Our session was reaped or evicted: fence, and carry on under a new one.
                self.health.broken();
                match self.session.ended(id) {
                    Ok(new) => {
                        ctx.progress(format!("fenced: session {id} had ended, now session {new}"));
                        Err(format!(
                            "session {id} had ended (reaped or evicted): fenced, registered \
                             session {new}"
                        )
                        .into())
                    }
                    Err(e) => Err(format!(
                        "session {id} had ended (reaped or evicted); registering a new \
                         session failed: {e}"
                    )
                    .into()),
                }
            }
            Err(e) => {
                self.health.broken();
                Err(format!("heartbeat failed: {e}").into())
            }
        }
    }
}

/// `session-reaper`: ends the sessions of daemons that ran on this machine and are gone (at
/// once), and of clients silent for a session timeout (only after this client has itself been
/// heartbeating for a whole session timeout: after a database outage nobody could heartbeat,
/// and the first client back must not take the others for dead before they had the chance to
/// heartbeat again).
pub struct SessionReaper {
    pub meta: Arc<dyn MetaEngine>,
    pub every: Duration,
    pub timeout: Duration,
    pub health: Arc<Health>,
}

impl Worker for SessionReaper {
    fn name(&self) -> &'static str {
        "session-reaper"
    }
    fn interval(&self) -> Duration {
        self.every
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        let mut failed = None;
        match crate::liveness::end_gone_sessions(self.meta.as_ref()) {
            Ok(0) => {}
            Ok(n) => tracing::info!("ended {n} session(s) of dead local daemons"),
            Err(e) => failed = Some(format!("ending dead local sessions failed: {e}")),
        }
        if self.health.healthy_for() >= self.timeout {
            match self.meta.reap_sessions(self.timeout.as_nanos() as i64) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!("reaped {n} dead client session(s)");
                    ctx.progress(format!("last reaped {n} session(s)"));
                }
                Err(e) => failed = Some(format!("reaping sessions failed: {e}")),
            }
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(Next::Idle),
        }
    }
}

/// [`CLOSE_INTERVAL`]; in debug builds `TIERFS_TEST_CLOSE_INTERVAL_MS` sets it, so that the
/// integration tests can hold a read-only open's record back (DataPath::queue_open).
fn close_interval() -> Duration {
    #[cfg(debug_assertions)]
    {
        static SET: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
        if let Some(d) = *SET.get_or_init(|| {
            std::env::var("TIERFS_TEST_CLOSE_INTERVAL_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
        }) {
            return d;
        }
    }
    CLOSE_INTERVAL
}

/// `close-recorder`: records the opens (read-only ones answered before they were recorded)
/// and closes that FUSE requests queued (one transaction per batch); at unmount it records
/// what is left.
pub struct CloseRecorder {
    pub data: Arc<DataPath>,
    meta: Arc<dyn MetaEngine>,
    /// This client's name, as changelog readers' masks are asked for.
    client: String,
    /// When to ask the changelog readers' masks again.
    next_look: std::time::Instant,
}

impl CloseRecorder {
    pub fn new(data: Arc<DataPath>, meta: Arc<dyn MetaEngine>, client: String) -> Self {
        CloseRecorder {
            data,
            meta,
            client,
            next_look: std::time::Instant::now(),
        }
    }
}

impl Worker for CloseRecorder {
    fn name(&self) -> &'static str {
        "close-recorder"
    }
    fn interval(&self) -> Duration {
        close_interval()
    }
    fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
        let now = std::time::Instant::now();
        if now >= self.next_look {
            // A queued open and its close, or a queued close and the next open, cancel out
            // (neither is recorded) only while no changelog reader wants OPEN or CLOSE
            // records.
            let opens = tierfs_meta::changelog::RecordType::Open.bit()
                | tierfs_meta::changelog::RecordType::Close.bit();
            let allowed = matches!(
                self.meta.changelog_wanted(&self.client),
                Ok(m) if m.0 & opens == 0
            );
            self.data.allow_open_cancel(allowed);
            self.next_look = now + Duration::from_millis(500);
        }
        self.data
            .drain_closes()
            .map_err(|e| format!("recording closes failed: {e}"))?;
        Ok(Next::Idle)
    }
    fn finish(&mut self, ctx: &Ctx) {
        if let Err(e) = self.data.drain_closes() {
            ctx.error(format!("recording closes at unmount failed: {e}"));
        }
    }
}

/// `pcc`: reports the sizes of cached files being written, keeps the cache under its high
/// watermark and its rules' quotas, and validates entries (every 5 s).
pub struct PccUpkeep {
    pub pcc: Arc<Pcc>,
}

impl Worker for PccUpkeep {
    fn name(&self) -> &'static str {
        "pcc"
    }
    fn interval(&self) -> Duration {
        PCC_INTERVAL
    }
    fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
        self.pcc.report_writers();
        self.pcc.keep_within_limits();
        self.pcc.validate_if_due();
        Ok(Next::Idle)
    }
}

/// `pcc-kept-opens`: allows kept opens for about a second more while no changelog reader
/// wants this client's OPEN or CLOSE records and a heartbeat succeeded within `fresh`, and
/// closes kept opens idle past `pcc_open_cache_secs` (all of them when not allowed)
/// (docs/pcc.md, "Kept opens"). A worker of its own: behind the `pcc` worker's size reports
/// (one engine round trip per file being written, slow under load or across a network) the
/// allowance lapsed, and opens that kept opens serve went to the engine.
pub struct PccKeptOpens {
    pub pcc: Arc<Pcc>,
    pub meta: Arc<dyn MetaEngine>,
    pub health: Arc<Health>,
    pub fresh: Duration,
}

impl Worker for PccKeptOpens {
    fn name(&self) -> &'static str {
        "pcc-kept-opens"
    }
    fn interval(&self) -> Duration {
        PCC_INTERVAL
    }
    fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
        let opens = tierfs_meta::changelog::RecordType::Open.bit()
            | tierfs_meta::changelog::RecordType::Close.bit();
        let wanted = self.meta.changelog_wanted(&self.pcc.client);
        let allowed =
            self.health.beat_within(self.fresh) && matches!(&wanted, Ok(m) if m.0 & opens == 0);
        self.pcc.allow_kept_opens(allowed);
        match wanted {
            Ok(_) => Ok(Next::Idle),
            Err(e) => Err(format!("reading the changelog readers' masks failed: {e}").into()),
        }
    }
}

/// Spare cache files the `pcc-spares` worker keeps ready.
pub const PCC_SPARES: usize = 512;

/// How often the `pcc-spares` worker tops the spares up.
const PCC_SPARES_INTERVAL: Duration = Duration::from_millis(100);

/// `pcc-spares`: keeps [`PCC_SPARES`] empty unnamed files ready in the cache directory, which
/// the creates of cached files link into place instead of allocating a file on the request
/// path (`tierfs_pcc::store::CacheStore::top_up_spares`; docs/pcc.md).
pub struct PccSpares {
    pub pcc: Arc<Pcc>,
}

impl Worker for PccSpares {
    fn name(&self) -> &'static str {
        "pcc-spares"
    }
    fn interval(&self) -> Duration {
        PCC_SPARES_INTERVAL
    }
    fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
        match self.pcc.store.top_up_spares(PCC_SPARES) {
            Ok(_) => Ok(Next::Idle),
            Err(e) => Err(format!("making spare cache files failed: {e}").into()),
        }
    }
}

/// How soon the `pcc-ro-copy` worker looks again at an empty queue.
const RO_COPY_INTERVAL: Duration = Duration::from_millis(50);

/// `pcc-ro-copy`: copies into the cache, one file per unit, the files first opened under an
/// RO rule (those opens read uncached: no copy on the request path), so that later opens are
/// served from the cache (kernel passthrough). A data mover: tranquility pauses apply after
/// each copy, yielding to applications. Its queue is bounded ([`crate::pcc::RO_COPY_QUEUE`]).
pub struct PccRoCopy {
    pub pcc: Arc<Pcc>,
}

impl Worker for PccRoCopy {
    fn name(&self) -> &'static str {
        "pcc-ro-copy"
    }
    fn interval(&self) -> Duration {
        RO_COPY_INTERVAL
    }
    fn moves_data(&self) -> bool {
        true
    }
    fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
        Ok(if self.pcc.copy_next_ro() {
            Next::More
        } else {
            Next::Idle
        })
    }
}

/// `pcc-writeback`: writes dirty RW-PCC files back to the capacity tier once their last write
/// is `writeback_delay_secs` old, one file per unit (a data mover: tranquility pauses apply).
pub struct PccWriteback {
    pub pcc: Arc<Pcc>,
    pub queue: std::collections::VecDeque<Ino>,
}

impl PccWriteback {
    pub fn new(pcc: Arc<Pcc>) -> Self {
        PccWriteback {
            pcc,
            queue: Default::default(),
        }
    }
}

impl Worker for PccWriteback {
    fn name(&self) -> &'static str {
        "pcc-writeback"
    }
    fn interval(&self) -> Duration {
        PCC_INTERVAL
    }
    fn moves_data(&self) -> bool {
        true
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        if self.queue.is_empty() {
            self.queue = self.pcc.due_write_backs().into();
        }
        let Some(ino) = self.queue.pop_front() else {
            ctx.progress("");
            return Ok(Next::Idle);
        };
        ctx.progress(format!(
            "writing back inode {ino} ({} more due)",
            self.queue.len()
        ));
        if let Err(e) = self.pcc.write_back_if_due(ino) {
            // The file is due again at the next round; the others go on now.
            ctx.error(format!("background write-back of inode {ino} failed: {e}"));
        }
        // The last of the queue: wait a round before looking again (a file that keeps
        // failing is not retried in a tight loop).
        Ok(if self.queue.is_empty() {
            Next::Idle
        } else {
            Next::More
        })
    }
}

/// `pcc-recall`: gives RW-PCC leases back when other clients ask (see [`crate::recall`]: woken
/// by notifications where the engine has them, polling otherwise). Its one unit is the recall
/// loop, which runs until the worker is stopped; each pass counts as a run.
pub struct PccRecall {
    pub pcc: Arc<Pcc>,
    pub metrics: Arc<Metrics>,
}

impl Worker for PccRecall {
    fn name(&self) -> &'static str {
        "pcc-recall"
    }
    fn interval(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        ctx.state(State::Idle);
        let mut failing = false;
        let mut mode = None;
        crate::recall::run_observed(
            &*self.pcc,
            &self.metrics,
            ctx.stop_flag(),
            &crate::recall::Timing::default(),
            &mut |listening, outcome| {
                ctx.count_run();
                if mode != Some(listening) {
                    mode = Some(listening);
                    ctx.progress(if listening {
                        "listening for recall requests"
                    } else {
                        "polling for recall requests"
                    });
                }
                match outcome {
                    Ok(_) => failing = false,
                    Err(e) => {
                        // recall::run logs once per run of failures; counted here likewise.
                        if !failing {
                            failing = true;
                            ctx.note_error(format!("reading PCC recall requests failed: {e}"));
                        }
                    }
                }
            },
        );
        Ok(Next::Done)
    }
}

/// `commit-retry`: commits the buffered writes of files closed while their commit failed (the
/// engine or a target did not answer), about once a second until it works.
pub struct CommitRetry {
    pub data: Arc<DataPath>,
}

impl Worker for CommitRetry {
    fn name(&self) -> &'static str {
        "commit-retry"
    }
    fn interval(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        let n = self.data.retry_unflushed();
        if n > 0 {
            ctx.progress(format!(
                "committed the kept writes or attribute changes of {n} file(s)"
            ));
        }
        Ok(Next::Idle)
    }
}

/// `gc`: deletes objects nobody references any more (up to 512 per round).
pub struct Gc {
    pub data: Arc<DataPath>,
    pub every: Duration,
}

impl Worker for Gc {
    fn name(&self) -> &'static str {
        "gc"
    }
    fn interval(&self) -> Duration {
        self.every
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        let n = self
            .data
            .collect_garbage()
            .map_err(|e| format!("garbage collection failed: {e}"))?;
        if n > 0 {
            ctx.progress(format!("deleted {n} object(s) last round"));
        }
        Ok(Next::Idle)
    }
}

/// Files [`Purge`] frees per unit: one write transaction of the engine each (about 3 ms of
/// SQLite's one writer for files of 32 KiB inline), so that creates and unlinks of
/// applications wait little behind it.
pub const PURGE_BATCH: u64 = 64;

/// `purge`: frees files whose last name went while nobody had them open (the engine's
/// `purge_unlinked`: their rows, inline bytes and objects, which go to the trash for `gc`),
/// [`PURGE_BATCH`] per unit, so that an unlink's request only drops the name. Any client's
/// worker frees any client's files. It frees and moves nothing of applications' but competes
/// with them for the engine's writer, so tranquility pauses apply between units.
pub struct Purge {
    pub meta: Arc<dyn MetaEngine>,
    pub every: Duration,
    /// Files freed this round (the units since it last found none left).
    pub freed: u64,
}

impl Purge {
    pub fn new(meta: Arc<dyn MetaEngine>, every: Duration) -> Self {
        Purge {
            meta,
            every,
            freed: 0,
        }
    }
}

impl Worker for Purge {
    fn name(&self) -> &'static str {
        "purge"
    }
    fn interval(&self) -> Duration {
        self.every
    }
    fn moves_data(&self) -> bool {
        true
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        // (files unlinked in the last UNLINK_GRACE wait: a read-only open answered before the
        // unlink may still be on its way to the engine, in a batch of open records)
        let before =
            tierfs_meta::now_nanos().saturating_sub(tierfs_meta::UNLINK_GRACE.as_nanos() as i64);
        let n = match self.meta.purge_unlinked(PURGE_BATCH, before) {
            Ok(n) => n,
            Err(e) => {
                self.freed = 0;
                return Err(format!("purging unlinked files failed: {e}").into());
            }
        };
        self.freed += n;
        if n == PURGE_BATCH {
            ctx.progress(format!("freed {} file(s), more waiting", self.freed));
            return Ok(Next::More);
        }
        if self.freed > 0 {
            ctx.progress(format!("freed {} file(s) last round", self.freed));
            tracing::debug!("purged {} unlinked file(s)", self.freed);
        }
        self.freed = 0;
        Ok(Next::Idle)
    }
}

/// `compactor`: rewrites chunks that gathered many slices as one object each, one chunk per
/// unit, up to [`COMPACT_PER_ROUND`] per round (a data mover: tranquility pauses apply).
pub struct Compactor {
    pub data: Arc<DataPath>,
    pub every: Duration,
    pub looked_at: usize,
    pub compacted: usize,
}

impl Compactor {
    pub fn new(data: Arc<DataPath>, every: Duration) -> Self {
        Compactor {
            data,
            every,
            looked_at: 0,
            compacted: 0,
        }
    }
}

impl Worker for Compactor {
    fn name(&self) -> &'static str {
        "compactor"
    }
    fn interval(&self) -> Duration {
        self.every
    }
    fn moves_data(&self) -> bool {
        true
    }
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
        let pending = self.data.compact_pending();
        if pending == 0 || self.looked_at >= COMPACT_PER_ROUND {
            if self.compacted > 0 {
                tracing::debug!("compacted {} chunk(s)", self.compacted);
            }
            self.looked_at = 0;
            self.compacted = 0;
            ctx.progress(if pending == 0 {
                String::new()
            } else {
                format!("{pending} chunk(s) waiting")
            });
            return Ok(Next::Idle);
        }
        ctx.progress(format!("{pending} chunk(s) waiting"));
        self.looked_at += 1;
        match self.data.compact(1) {
            Ok(n) => {
                self.compacted += n;
                Ok(Next::More)
            }
            Err(e) => {
                self.looked_at = 0;
                self.compacted = 0;
                Err(format!("compaction failed: {e}").into())
            }
        }
    }
}

/// `maintenance`: the metadata engine's upkeep (e.g. SQLite's write-ahead log checkpoints).
pub struct Maintenance {
    pub meta: Arc<dyn MetaEngine>,
    pub every: Duration,
}

impl Worker for Maintenance {
    fn name(&self) -> &'static str {
        "maintenance"
    }
    fn interval(&self) -> Duration {
        self.every
    }
    fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
        self.meta
            .maintain()
            .map_err(|e| format!("metadata maintenance failed: {e}"))?;
        Ok(Next::Idle)
    }
}

/// Where the `worker-reports` worker publishes the workers' status.
pub type Publish = Box<dyn Fn(&[Status]) -> Result<(), String> + Send>;

/// `worker-reports`: publishes every worker's status (its own included) every
/// [`REPORT_INTERVAL`], for `tierfs status`. Its own thread: a slow or failing database write
/// here never touches the heartbeat.
pub struct Reports {
    pub registry: Arc<Registry>,
    pub publish: Publish,
}

impl Worker for Reports {
    fn name(&self) -> &'static str {
        "worker-reports"
    }
    fn interval(&self) -> Duration {
        REPORT_INTERVAL
    }
    fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
        let snapshot = self.registry.snapshot();
        (self.publish)(&snapshot).map_err(|e| format!("publishing worker reports failed: {e}"))?;
        Ok(Next::Idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::Workers;

    /// Counts its runs: a stand-in for the heartbeat.
    struct Ticker(Arc<Mutex<Vec<Instant>>>);

    impl Worker for Ticker {
        fn name(&self) -> &'static str {
            "heartbeat"
        }
        fn interval(&self) -> Duration {
            Duration::from_millis(50)
        }
        fn work(&mut self, _ctx: &Ctx) -> Result<Next, WorkError> {
            self.0.lock().push(Instant::now());
            Ok(Next::Idle)
        }
    }

    #[test]
    fn a_failing_or_hanging_publisher_is_recorded_and_leaves_the_heartbeat_alone() {
        let mut w = Workers::new(1.0);
        let ticks = Arc::new(Mutex::new(Vec::new()));
        w.spawn(Ticker(Arc::clone(&ticks))).unwrap();
        let seen = Arc::new(Mutex::new(Vec::<Vec<String>>::new()));
        let publish: Publish = {
            let seen = Arc::clone(&seen);
            Box::new(move |snap| {
                seen.lock()
                    .push(snap.iter().map(|s| s.name.clone()).collect());
                // The database hangs for 1.5 s, then refuses.
                std::thread::sleep(Duration::from_millis(1500));
                Err("metadata database unreachable: connection refused".into())
            })
        };
        w.spawn(Reports {
            registry: w.registry(),
            publish,
        })
        .unwrap();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(1800));
        let snap = w.snapshot();
        w.stop_all();
        // The heartbeat kept its period while the publisher hung.
        let during: Vec<Instant> = ticks.lock().iter().copied().filter(|t| *t >= t0).collect();
        assert!(during.len() >= 15, "{} heartbeats in 1.8 s", during.len());
        // The publisher saw every worker, itself included, and its failure is kept.
        assert_eq!(seen.lock()[0], vec!["heartbeat", "worker-reports"]);
        let r = snap.iter().find(|s| s.name == "worker-reports").unwrap();
        assert_eq!(r.errors, 1);
        assert_eq!(
            r.last_error.as_ref().unwrap().1,
            "publishing worker reports failed: metadata database unreachable: connection refused"
        );
        let hb = snap.iter().find(|s| s.name == "heartbeat").unwrap();
        assert_eq!(hb.errors, 0);
    }
}
