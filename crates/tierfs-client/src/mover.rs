//! HSM data movers (docs/hsm.md, "Movers"): what `tierfs agent` (and, when configured, a
//! client daemon's background worker) does with a request it took from the coordinator.
//!
//! - ARCHIVE: notes the file's data version, reads the file through the data path (as any
//!   reader), writes the copy to the archive under a key of its own (`<ino>/v<version>.r<request>`)
//!   with the CRC-32s of the whole and of each chunk ([`crate::copysum`]), and completes the request: the engine records the copy only if
//!   the file's data version is still the one noted (else `Stale`), and only a completed request
//!   marks the file archived. A mover killed before completing leaves the file as it was; the
//!   request is requeued after the coordinator's timeout. A copy that does not count (stale,
//!   canceled, failed) is deleted by the mover that wrote it.
//! - RESTORE: reads the copy chunk by chunk, verifies each checksum chunk of it
//!   ([`crate::copysum`]) as soon as it is read, writes the pieces as new objects on the
//!   targets the file's layout gives them, and commits with `hsm_restore_slices` only pieces
//!   inside the verified prefix, [`MoverConfig::first_commit_bytes`] first, doubling up to
//!   [`MoverConfig::commit_bytes`] (the restored prefix is readable while the rest moves, and
//!   never holds an unverified byte); at the end checks the whole copy's checksum and
//!   completes (RELEASED is cleared). A mismatch fails the request for good at the chunk where
//!   it is found (the file stays released; `hsm action` says why).
//! - REMOVE: deletes the copy; completes.
//!
//! Progress is reported at least every [`MoverConfig::progress_interval`]; a `Stop` answer
//! (cancel, requeue) stops the move at once and deletes what it wrote.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use thiserror::Error;

use tierfs_meta::hsm::{HsmAction, HsmDone, HsmError, HsmOutcome, HsmTask, Progress};
use tierfs_meta::{MetaEngine, MetaError, Slice};
use tierfs_store::archive::{ArchiveEntry, ArchiveStore};

use crate::copysum::{chunk_for, SumReader, SumWriter};
use tierfs_store::StoreError;

use crate::data::{DataPath, StartedObject};
use crate::error::ClientError;

/// Tunables of a mover.
#[derive(Clone, Debug)]
pub struct MoverConfig {
    /// Bytes read from the file (ARCHIVE) per data-path read.
    pub read_size: u32,
    /// RESTORE: most restored bytes committed with one `hsm_restore_slices`.
    pub commit_bytes: u64,
    /// RESTORE: the first commit's bytes (once verified), doubling up to
    /// [`MoverConfig::commit_bytes`]: the first bytes of a file come back fast.
    pub first_commit_bytes: u64,
    /// ARCHIVE: bytes per chunk checksum of a copy (0: [`crate::copysum::chunk_for`] its size).
    pub sum_chunk: u64,
    /// Longest time between two progress reports of a running move.
    pub progress_interval: Duration,
    /// Within a move, the pause after each piece (a data-path read and its write to the
    /// archive; a chunk of a restore) is `tranquility x` the time the piece took
    /// ([`crate::workers::tranquil_pause`]): a long archive or restore then uses at most
    /// `1 / (1 + tranquility)` of the time and leaves the disk and network to applications
    /// between its pieces. 0 (`tierfs agent`'s default): full speed.
    pub tranquility: f64,
}

impl Default for MoverConfig {
    fn default() -> Self {
        MoverConfig {
            read_size: 4 << 20,
            commit_bytes: 64 << 20,
            first_commit_bytes: crate::copysum::SUM_CHUNK,
            sum_chunk: 0,
            progress_interval: Duration::from_secs(1),
            tranquility: 0.0,
        }
    }
}

#[derive(Debug, Error)]
pub enum MoverError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("archive copy {key}: checksum mismatch (recorded {want}, read {got})")]
    Checksum {
        key: String,
        want: String,
        got: String,
    },
    #[error("archive copy {key}: {got} bytes, {want} recorded")]
    Size { key: String, want: u64, got: u64 },
    #[error("{0}")]
    Bad(String),
}

impl MoverError {
    /// The agent was dropped by the coordinator (silent too long): it must stop everything and
    /// register again.
    pub fn agent_gone(&self) -> bool {
        matches!(
            self,
            MoverError::Meta(MetaError::Hsm(HsmError::UnknownAgent(_)))
                | MoverError::Client(ClientError::Meta(MetaError::Hsm(HsmError::UnknownAgent(_))))
        )
    }

    /// Worth another attempt (I/O, an unreachable archive), unlike a corrupt or missing copy.
    fn retry(&self) -> bool {
        !matches!(
            self,
            MoverError::Checksum { .. }
                | MoverError::Size { .. }
                | MoverError::Bad(_)
                | MoverError::Store(StoreError::NotFound(_) | StoreError::BadUrl(_))
        )
    }
}

/// The key of an ARCHIVE mover's copy: `<ino as 16 hex digits>/v<data version>.r<request>`.
pub fn copy_key(ino: u64, version: u64, request: u64) -> String {
    format!("{ino:016x}/v{version}.r{request}")
}

/// What a key written by a mover says: (ino, request), for [`copy_key`]s and their staging
/// files (`<key>#<n>`); `None` for any other name (imported data, a probe, foreign files).
pub fn parse_copy_key(key: &str) -> Option<(u64, u64)> {
    let (dir, name) = key.split_once('/')?;
    if dir.len() != 16 || !dir.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let ino = u64::from_str_radix(dir, 16).ok()?;
    let name = match name.split_once('#') {
        Some((n, k)) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => n,
        Some(_) => return None,
        None => name,
    };
    let (v, r) = name.strip_prefix('v')?.split_once(".r")?;
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    if !digits(v) || !digits(r) {
        return None;
    }
    Some((ino, r.parse().ok()?))
}

/// What a sweep of one archive found and did ([`Mover::sweep`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Entries listed (copies, staging files, anything else).
    pub listed: u64,
    /// Entries a mover wrote (a copy or a staging file) that were judged.
    pub judged: u64,
    /// Leftovers deleted, and their bytes.
    pub deleted: u64,
    pub bytes: u64,
}

/// How a task ended, as far as the mover is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Moved {
    /// Completed; the engine's answer.
    Completed(HsmOutcome),
    /// Stopped at a progress report (canceled or requeued): what was written is deleted.
    Stopped,
    /// Reported failed with this reason (retried by the coordinator or failed for good).
    Failed(String),
}

/// Moves data for one agent.
pub struct Mover {
    meta: Arc<dyn MetaEngine>,
    data: Arc<DataPath>,
    cfg: MoverConfig,
    archives: Mutex<HashMap<String, Arc<ArchiveStore>>>,
    /// Set to stop every running move at its next progress check (SIGTERM of the agent):
    /// what it wrote is deleted, and unregistering gives its requests back.
    pub stop: Arc<AtomicBool>,
    /// The requests being moved here, each with whether a notice (PostgreSQL's
    /// `Notice::HsmCancel`) canceled it: such a move stops at its next progress check instead
    /// of at its next report to the coordinator.
    moves: Mutex<HashMap<u64, bool>>,
    /// Time spent in tranquility pauses, all moves together (tests and logs).
    pub paused: Mutex<Duration>,
}

type R<T> = std::result::Result<T, MoverError>;

/// A move that was told to stop.
struct StopNow;

enum Step<T> {
    Go(T),
    Stop,
}

impl Mover {
    pub fn new(meta: Arc<dyn MetaEngine>, data: Arc<DataPath>, cfg: MoverConfig) -> Mover {
        Mover {
            meta,
            data,
            cfg,
            archives: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            moves: Mutex::new(HashMap::new()),
            paused: Mutex::new(Duration::ZERO),
        }
    }

    /// A notice said `request` was canceled: its move, if running here, stops at its next
    /// progress check (what it wrote is deleted, as at a `Stop` answer).
    pub fn cancel(&self, request: u64) {
        if let Some(c) = self.moves.lock().get_mut(&request) {
            *c = true;
        }
    }

    fn told_to_stop(&self, request: u64) -> bool {
        self.stop.load(Ordering::Relaxed) || self.moves.lock().get(&request) == Some(&true)
    }

    /// The tranquilizer within a move: after a piece of `request` that took `took`, sleeps
    /// `tranquility x took` (cut short when the move is told to stop).
    fn tranquil(&self, request: u64, took: Duration) {
        let pause = crate::workers::tranquil_pause(took, self.cfg.tranquility);
        if pause.is_zero() {
            return;
        }
        let until = Instant::now() + pause;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.told_to_stop(request) {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        *self.paused.lock() += pause;
    }

    /// The archive at `url`, opened once (an unreachable one is tried again next time).
    pub fn archive(&self, url: &str) -> R<Arc<ArchiveStore>> {
        if let Some(a) = self.archives.lock().get(url) {
            return Ok(Arc::clone(a));
        }
        let a = Arc::new(ArchiveStore::open(url)?);
        self.archives.lock().insert(url.to_string(), Arc::clone(&a));
        Ok(a)
    }

    /// Does `task` for `agent` and reports its end to the coordinator (complete, or fail with
    /// the reason). Errors only when the coordinator cannot be told (the agent was dropped:
    /// see [`MoverError::agent_gone`], or the metadata engine is unreachable).
    pub fn run(&self, agent: u64, task: &HsmTask) -> R<Moved> {
        let id = task.request.id;
        self.moves.lock().insert(id, false);
        let r = match task.request.action {
            HsmAction::Archive => self.archive_file(agent, task),
            HsmAction::Restore => self.restore_file(agent, task),
            HsmAction::Remove => self.remove_copy(agent, task),
        };
        self.moves.lock().remove(&id);
        match r {
            Ok(Step::Go(outcome)) => Ok(Moved::Completed(outcome)),
            Ok(Step::Stop) => Ok(Moved::Stopped),
            Err(e) if e.agent_gone() => Err(e),
            Err(e) => {
                let reason = e.to_string();
                tracing::warn!(
                    request = id,
                    ino = task.request.ino,
                    "HSM {}: {reason}",
                    task.request.action
                );
                self.meta.hsm_fail(agent, id, &reason, e.retry())?;
                Ok(Moved::Failed(reason))
            }
        }
    }

    /// Progress report, rate-limited; Err(StopNow) when told to stop.
    fn progress(
        &self,
        agent: u64,
        id: u64,
        moved: u64,
        last: &mut Instant,
        force: bool,
    ) -> R<std::result::Result<(), StopNow>> {
        if let Some(d) = test_stall() {
            std::thread::sleep(d);
        }
        if self.told_to_stop(id) {
            return Ok(Err(StopNow));
        }
        if !force && last.elapsed() < self.cfg.progress_interval {
            return Ok(Ok(()));
        }
        *last = Instant::now();
        Ok(match self.meta.hsm_progress(agent, id, moved)? {
            Progress::Continue => Ok(()),
            Progress::Stop => Err(StopNow),
        })
    }

    fn archive_file(&self, agent: u64, task: &HsmTask) -> R<Step<HsmOutcome>> {
        let req = &task.request;
        let ino = req.ino;
        let archive = self.archive(&task.archive_url)?;
        // The version the copy holds: noted before the first byte is read, so a write during
        // the copy makes the completion Stale.
        let attr = self.meta.getattr(ino)?;
        if attr.hsm.released() {
            return Err(MoverError::Bad("the file is released".into()));
        }
        let version = attr.data_version;
        let key = copy_key(ino, version, req.id);
        self.data.invalidate(ino, Some(&attr));
        let rt = self.data.rt.clone();
        let mut w = rt.block_on(archive.writer(&key))?;
        let mut sums = SumWriter::new(match self.cfg.sum_chunk {
            0 => chunk_for(attr.size),
            n => n,
        });
        let mut off = 0u64;
        let mut last = Instant::now();
        let result: R<std::result::Result<(), StopNow>> = (|| {
            while off < attr.size {
                let t0 = Instant::now();
                let n = (attr.size - off).min(self.cfg.read_size as u64) as u32;
                let buf = self.data.read(ino, off, n, true)?;
                if buf.is_empty() {
                    break; // truncated meanwhile: the completion is Stale
                }
                sums.update(&buf);
                rt.block_on(w.write(&buf))?;
                off += buf.len() as u64;
                if let Err(s) = self.progress(agent, req.id, off, &mut last, false)? {
                    return Ok(Err(s));
                }
                self.tranquil(req.id, t0.elapsed());
            }
            Ok(Ok(()))
        })();
        self.data.forget(ino);
        match result {
            Ok(Ok(())) => {}
            Ok(Err(StopNow)) => {
                rt.block_on(w.abort());
                return Ok(Step::Stop);
            }
            Err(e) => {
                rt.block_on(w.abort());
                return Err(e);
            }
        }
        rt.block_on(w.finish())?;
        let done = HsmDone {
            key: key.clone(),
            data_version: version,
            size: off,
            checksum: sums.finish(),
            bytes_moved: off,
        };
        let outcome = match self.meta.hsm_complete(agent, req.id, &done) {
            Ok(o) => o,
            Err(e) => {
                // Not recorded (or not known to be): a copy nobody refers to is deleted; if the
                // completion did land, the agent's retry of it gets the same outcome (but the
                // copy would be gone), so only a definite refusal deletes it.
                if matches!(e, MetaError::Hsm(_)) {
                    let _ = rt.block_on(archive.delete(&key));
                }
                return Err(e.into());
            }
        };
        if outcome != HsmOutcome::Done {
            rt.block_on(archive.delete(&key))?;
        }
        Ok(Step::Go(outcome))
    }

    fn restore_file(&self, agent: u64, task: &HsmTask) -> R<Step<HsmOutcome>> {
        let req = &task.request;
        let ino = req.ino;
        let copy = task
            .copy
            .clone()
            .ok_or_else(|| MoverError::Bad("restore without an archive copy".into()))?;
        let archive = self.archive(&task.archive_url)?;
        let rt = self.data.rt.clone();
        let have = rt.block_on(archive.size(&copy.key))?;
        if have != copy.size {
            return Err(MoverError::Size {
                key: copy.key,
                want: copy.size,
                got: have,
            });
        }
        let attr = self.meta.getattr(ino)?;
        let layout = attr
            .layout
            .clone()
            .ok_or_else(|| MoverError::Bad("the file has no layout".into()))?;
        let cs = layout.stripe_size.max(1);
        let mut sums = SumReader::new(&copy.checksum, copy.size).map_err(MoverError::Bad)?;
        let mut last = Instant::now();
        // Bytes `off..end` of the copy, verified as far as the checksums allow: Err when a
        // chunk (or the whole copy) does not match, or the copy is short.
        let read = |sums: &mut SumReader, off: u64, end: u64| -> R<Bytes> {
            let bytes = rt.block_on(archive.get_range(&copy.key, off, end))?;
            if bytes.len() as u64 != end - off {
                return Err(MoverError::Size {
                    key: copy.key.clone(),
                    want: copy.size,
                    got: off + bytes.len() as u64,
                });
            }
            sums.update(&bytes).map_err(|m| MoverError::Checksum {
                key: copy.key.clone(),
                want: format!("{} at byte {}", m.want, m.at),
                got: m.got,
            })?;
            Ok(bytes)
        };
        if sums.whole_only() {
            // A copy recorded with the whole checksum only: read and verified once first, so
            // that nothing unverified is committed and nothing is held in memory meanwhile
            // (the copy is immutable under its key).
            let mut off = 0u64;
            while off < copy.size {
                let t0 = Instant::now();
                let end = (off + (8 << 20)).min(copy.size);
                read(&mut sums, off, end)?;
                off = end;
                if self.progress(agent, req.id, 0, &mut last, false)?.is_err() {
                    return Ok(Step::Stop);
                }
                self.tranquil(req.id, t0.elapsed());
            }
            sums = SumReader::new("", copy.size).map_err(MoverError::Bad)?;
        }
        // Read, not yet verified: (chunk, target, bytes), in file order.
        let mut batch: Vec<(u64, u32, Bytes)> = Vec::new();
        // Verified, uploading as a new object while the next chunks are read: (chunk, target,
        // bytes in it, upload), in file order, committed together once enough gathered.
        let mut started: Vec<(u64, u32, u64, StartedObject)> = Vec::new();
        let mut commit = self
            .cfg
            .first_commit_bytes
            .min(self.cfg.commit_bytes)
            .max(1);
        let mut committed = 0u64;
        let mut off = 0u64;
        while off < copy.size {
            let t0 = Instant::now();
            let chunk = off / cs;
            let end = ((chunk + 1) * cs).min(copy.size);
            // Verified before anything of it is uploaded or committed: a bad chunk fails the
            // request with the verified prefix committed and nothing after it.
            let bytes = read(&mut sums, off, end)?;
            batch.push((chunk, layout.target_of_chunk(chunk), bytes));
            off = end;
            let verified = sums.verified();
            let n = batch
                .iter()
                .take_while(|(c, _, b)| c * cs + b.len() as u64 <= verified)
                .count();
            for (c, t, b) in batch.drain(..n) {
                let len = b.len() as u64;
                started.push((c, t, len, self.data.start_object(t, b)?));
            }
            if self
                .progress(agent, req.id, off, &mut last, false)?
                .is_err()
            {
                return Ok(Step::Stop);
            }
            let due = verified >= committed + commit || off >= copy.size;
            if !due || started.is_empty() {
                self.tranquil(req.id, t0.elapsed());
                continue;
            }
            let ready = std::mem::take(&mut started);
            let placed: Vec<(u64, u32, u64)> =
                ready.iter().map(|(c, t, l, _)| (*c, *t, *l)).collect();
            let ids = self
                .data
                .wait_objects(ready.into_iter().map(|(.., s)| s).collect())?;
            let slices: Vec<Slice> = placed
                .iter()
                .zip(ids)
                .map(|((c, t, l), obj)| Slice::whole_object(*c, 0, *t, obj, *l))
                .collect();
            if self.meta.hsm_restore_slices(agent, req.id, &slices)? == Progress::Stop {
                return Ok(Step::Stop);
            }
            committed = placed.last().map_or(committed, |(c, _, l)| c * cs + l);
            commit = (commit * 2).min(self.cfg.commit_bytes);
            if self.progress(agent, req.id, off, &mut last, true)?.is_err() {
                return Ok(Step::Stop);
            }
            self.tranquil(req.id, t0.elapsed());
        }
        if !batch.is_empty() || !started.is_empty() || sums.verified() < copy.size {
            return Err(MoverError::Bad(format!(
                "archive copy {}: {} of {} bytes verified at its end",
                copy.key,
                sums.verified(),
                copy.size
            )));
        }
        self.data.forget(ino);
        let done = HsmDone {
            data_version: copy.data_version,
            bytes_moved: copy.size,
            ..HsmDone::default()
        };
        Ok(Step::Go(self.meta.hsm_complete(agent, req.id, &done)?))
    }

    /// Sweeps archive `archive_id` (at `url`) of a killed or stopped mover's leftovers:
    /// staging files of unfinished uploads and finished copies that were never recorded. Only
    /// names a mover writes are looked at ([`parse_copy_key`]); the engine judges each
    /// ([`tierfs_meta::Hsm::hsm_sweepable`]): deleted only when no file's copy is at the key
    /// and the ARCHIVE request that wrote it ended more than `grace` ago (database's clock)
    /// without recording it. Recorded copies, copies of active or unknown requests and
    /// foreign objects are kept.
    pub fn sweep(&self, archive_id: u32, url: &str, grace: Duration) -> R<Swept> {
        let archive = self.archive(url)?;
        let rt = self.data.rt.clone();
        let entries = rt.block_on(archive.list())?;
        let mut out = Swept {
            listed: entries.len() as u64,
            ..Swept::default()
        };
        let cands: Vec<(ArchiveEntry, tierfs_meta::hsm::SweepItem)> = entries
            .into_iter()
            .filter_map(|e| {
                let (ino, request) = parse_copy_key(&e.key)?;
                let item = tierfs_meta::hsm::SweepItem {
                    key: e.key.clone(),
                    ino,
                    request,
                };
                Some((e, item))
            })
            .collect();
        out.judged = cands.len() as u64;
        let grace_ns = i64::try_from(grace.as_nanos()).unwrap_or(i64::MAX);
        for batch in cands.chunks(500) {
            if self.stop.load(Ordering::Relaxed) {
                break; // the agent is stopping: the next sweep goes on
            }
            let items: Vec<_> = batch.iter().map(|(_, i)| i.clone()).collect();
            let verdicts = self.meta.hsm_sweepable(archive_id, &items, grace_ns)?;
            for ((e, _), del) in batch.iter().zip(verdicts) {
                if !del {
                    continue;
                }
                rt.block_on(archive.remove_listed(e))?;
                tracing::info!(
                    archive = archive_id,
                    key = e.key,
                    bytes = e.size,
                    "HSM sweep: deleted a leftover"
                );
                out.deleted += 1;
                out.bytes += e.size;
            }
        }
        Ok(out)
    }

    fn remove_copy(&self, agent: u64, task: &HsmTask) -> R<Step<HsmOutcome>> {
        let key = task
            .copy
            .as_ref()
            .map(|c| c.key.clone())
            .or_else(|| task.request.key.clone())
            .ok_or_else(|| MoverError::Bad("remove without an archive copy".into()))?;
        let archive = self.archive(&task.archive_url)?;
        self.data.rt.block_on(archive.delete(&key))?;
        Ok(Step::Go(self.meta.hsm_complete(
            agent,
            task.request.id,
            &HsmDone::default(),
        )?))
    }
}

/// What an agent serves and how it polls ([`run_agent`]).
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub info: tierfs_meta::hsm::HsmAgentInfo,
    /// Requests run at once (also the agent's `max_requests`).
    pub parallel: usize,
    /// Time between two looks at the queue while the agent has room for more requests and
    /// nothing new was announced. An agent that listens for PostgreSQL's HSM notices looks at
    /// once on a notice and only every [`LISTEN_SAFETY`] `x poll` otherwise.
    pub poll: Duration,
    /// How often the agent runs the coordinator's housekeeping.
    pub housekeep: Duration,
    /// How often the agent sweeps its archives of leftovers ([`Mover::sweep`]), starting at
    /// once; `None`: never.
    pub sweep: Option<Duration>,
    /// A leftover is deleted only once its request ended this long ago.
    pub sweep_grace: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            info: Default::default(),
            parallel: 4,
            poll: Duration::from_millis(500),
            housekeep: Duration::from_secs(30),
            sweep: Some(Duration::from_secs(3600)),
            sweep_grace: Duration::from_secs(3600),
        }
    }
}

/// A listening agent's look at the queue without a notice comes every `LISTEN_SAFETY x poll`
/// (5 s by default): requests whose retry backoff ended and requests requeued by the
/// housekeeping are not announced.
pub const LISTEN_SAFETY: u32 = 10;

/// Counters of a running agent.
#[derive(Debug, Default)]
pub struct AgentStats {
    pub completed: std::sync::atomic::AtomicU64,
    pub stopped: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
    /// Looks at the queue (`hsm_take` calls).
    pub takes: std::sync::atomic::AtomicU64,
    /// Looks made because a notice announced work (the others: polls, freed slots).
    pub woken: std::sync::atomic::AtomicU64,
    /// Whether the agent listens for notices now.
    pub listening: AtomicBool,
    /// Sweeps done, and leftovers they deleted.
    pub sweeps: std::sync::atomic::AtomicU64,
    pub swept: std::sync::atomic::AtomicU64,
}

/// What the agent's loop waits for.
enum Event {
    /// A move ended.
    Moved(Box<HsmTask>, R<Moved>),
    /// A notice from the engine.
    Notice(tierfs_meta::Notice),
}

/// A copytool agent's loop (`tierfs agent`, or a client daemon's mover worker): registers,
/// takes requests of its archives and runs up to `parallel` of them at once, taking more as
/// soon as one ends (a long move does not hold back the others' slots), heartbeats (every take
/// does) while idle, runs the housekeeping now and then, registers again when the coordinator
/// dropped it, and unregisters (its requests go back to waiting) once `mover.stop` is set.
/// On PostgreSQL it listens for the HSM notices: work announced for one of its archives is
/// taken at once, and a canceled request's move stops at once ([`Mover::cancel`]); without
/// notices (SQLite) it looks at the queue every `cfg.poll`. Errors only when the metadata
/// engine fails.
pub fn run_agent(mover: &Mover, cfg: &AgentConfig, stats: &AgentStats) -> R<()> {
    let meta = Arc::clone(&mover.meta);
    let mut info = cfg.info.clone();
    let parallel = cfg.parallel.max(1);
    info.max_requests = parallel as u32;
    let mut agent = meta.hsm_agent_register(&info)?;
    tracing::info!(agent, archives = ?info.archives, "HSM agent registered");
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let quit = AtomicBool::new(false);
    let r = std::thread::scope(|s| -> R<()> {
        {
            let tx = tx.clone();
            let (meta, quit) = (Arc::clone(&meta), &quit);
            let name = info.name.clone();
            s.spawn(move || listen_loop(meta.as_ref(), &name, &tx, quit, mover, stats));
        }
        if let Some(every) = cfg.sweep {
            let (archives, quit) = (info.archives.clone(), &quit);
            s.spawn(move || sweep_loop(mover, &archives, every, cfg.sweep_grace, quit, stats));
        }
        let mut running = 0usize;
        let mut look_at = Instant::now();
        let mut woken = false;
        let mut last_housekeep: Option<Instant> = None;
        let mut failure: Option<MoverError> = None;
        while !mover.stop.load(Ordering::Relaxed) && failure.is_none() {
            if last_housekeep.is_none_or(|t| t.elapsed() >= cfg.housekeep) {
                last_housekeep = Some(Instant::now());
                // The agent's own heartbeat (its takes are rare while it listens): an idle
                // agent is not dropped by the housekeeping below.
                match meta.hsm_agent_heartbeat(agent) {
                    Ok(()) => {}
                    Err(MetaError::Hsm(HsmError::UnknownAgent(_))) => {
                        agent = meta.hsm_agent_register(&info)?;
                        tracing::warn!(
                            agent,
                            "HSM agent was dropped by the coordinator: registered again"
                        );
                    }
                    Err(e) => tracing::warn!("HSM agent heartbeat: {e}"),
                }
                match meta.hsm_housekeep() {
                    Ok((requeued, dropped, purged)) if requeued + dropped + purged > 0 => {
                        tracing::info!(requeued, dropped, purged, "HSM housekeeping")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("HSM housekeeping: {e}"),
                }
            }
            if running < parallel && Instant::now() >= look_at {
                stats.takes.fetch_add(1, Ordering::Relaxed);
                if std::mem::take(&mut woken) {
                    stats.woken.fetch_add(1, Ordering::Relaxed);
                }
                let tasks = match meta.hsm_take(agent, parallel - running) {
                    Ok(t) => t,
                    Err(MetaError::Hsm(HsmError::UnknownAgent(_))) => {
                        agent = meta.hsm_agent_register(&info)?;
                        tracing::warn!(
                            agent,
                            "HSM agent was dropped by the coordinator: registered again"
                        );
                        continue;
                    }
                    Err(e) => {
                        failure = Some(e.into());
                        break;
                    }
                };
                let wait = if stats.listening.load(Ordering::Relaxed) {
                    cfg.poll * LISTEN_SAFETY
                } else {
                    cfg.poll
                };
                look_at = Instant::now() + wait;
                for t in tasks {
                    running += 1;
                    let tx = tx.clone();
                    s.spawn(move || {
                        let r = mover.run(agent, &t);
                        let _ = tx.send(Event::Moved(Box::new(t), r));
                    });
                }
            }
            // Wait for a move's end, a notice, the next look (only with a free slot) or a
            // stop (checked every 50 ms).
            let tick = Duration::from_millis(50);
            let wait = if running < parallel {
                look_at.saturating_duration_since(Instant::now()).min(tick)
            } else {
                tick
            };
            let ev = match rx.recv_timeout(wait) {
                Ok(ev) => ev,
                Err(_) => continue,
            };
            let mut evs = vec![ev];
            evs.extend(rx.try_iter());
            for ev in evs {
                match ev {
                    Event::Notice(tierfs_meta::Notice::HsmWork(a)) => {
                        if info.archives.contains(&a) {
                            look_at = Instant::now();
                            woken = true;
                        }
                    }
                    Event::Notice(tierfs_meta::Notice::HsmCancel(id)) => mover.cancel(id),
                    Event::Notice(_) => {}
                    Event::Moved(t, r) => {
                        running -= 1;
                        // A slot is free: look again at once.
                        look_at = Instant::now();
                        if let Err(e) = report(&t, r, stats) {
                            failure.get_or_insert(e);
                        }
                    }
                }
            }
        }
        // Stopping: the moves under way stop at their next progress check.
        mover.stop.store(true, Ordering::Relaxed);
        quit.store(true, Ordering::Relaxed);
        while running > 0 {
            match rx.recv() {
                Ok(Event::Moved(t, r)) => {
                    running -= 1;
                    if let Err(e) = report(&t, r, stats) {
                        failure.get_or_insert(e);
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        failure.map_or(Ok(()), Err)
    });
    match meta.hsm_agent_unregister(agent) {
        Ok(n) => tracing::info!(agent, requeued = n, "HSM agent unregistered"),
        Err(e) => tracing::warn!(agent, "HSM agent unregister: {e}"),
    }
    r
}

/// Counts and logs how a move ended; Err when the engine failed (other than the agent being
/// dropped, which the next take handles by registering again).
fn report(t: &HsmTask, r: R<Moved>, stats: &AgentStats) -> R<()> {
    let (id, ino, action) = (t.request.id, t.request.ino, t.request.action);
    match r {
        Ok(Moved::Completed(o)) => {
            stats.completed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(request = id, ino, "HSM {action}: {o:?}");
        }
        Ok(Moved::Stopped) => {
            stats.stopped.fetch_add(1, Ordering::Relaxed);
            tracing::info!(request = id, ino, "HSM {action}: stopped");
        }
        Ok(Moved::Failed(why)) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(request = id, ino, "HSM {action} failed: {why}");
        }
        Err(e) if e.agent_gone() => {
            tracing::warn!(request = id, "HSM {action}: the agent was dropped ({e})");
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// The agent's sweeping thread: sweeps each archive it serves at once, then every `every`,
/// until `quit`.
fn sweep_loop(
    mover: &Mover,
    archives: &[u32],
    every: Duration,
    grace: Duration,
    quit: &AtomicBool,
    stats: &AgentStats,
) {
    while !quit.load(Ordering::Relaxed) {
        match mover.meta.hsm_archives() {
            Ok(list) => {
                for a in list.iter().filter(|a| archives.contains(&a.id)) {
                    if quit.load(Ordering::Relaxed) {
                        return;
                    }
                    match mover.sweep(a.id, &a.url, grace) {
                        Ok(w) => {
                            stats.sweeps.fetch_add(1, Ordering::Relaxed);
                            stats.swept.fetch_add(w.deleted, Ordering::Relaxed);
                            if w.deleted > 0 {
                                tracing::info!(
                                    archive = a.id,
                                    listed = w.listed,
                                    deleted = w.deleted,
                                    bytes = w.bytes,
                                    "HSM sweep"
                                );
                            }
                        }
                        Err(e) => tracing::warn!(archive = a.id, "HSM sweep: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("HSM sweep: {e}"),
        }
        let until = Instant::now() + every;
        while Instant::now() < until && !quit.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The agent's listening thread: forwards the engine's HSM notices to the loop until `quit`.
/// `Ok(None)` from the engine (SQLite: no notifications) ends it; a lost subscription is
/// listened again after a pause (the loop polls meanwhile).
fn listen_loop(
    meta: &dyn MetaEngine,
    name: &str,
    tx: &std::sync::mpsc::Sender<Event>,
    quit: &AtomicBool,
    mover: &Mover,
    stats: &AgentStats,
) {
    let idle = |d: Duration| {
        let until = Instant::now() + d;
        while Instant::now() < until && !quit.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    while !quit.load(Ordering::Relaxed) {
        let mut l = match meta.listen(name, &[tierfs_meta::Channel::Hsm]) {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("HSM agent: cannot listen for notices ({e}); polling");
                idle(Duration::from_secs(5));
                continue;
            }
        };
        stats.listening.store(true, Ordering::Relaxed);
        tracing::info!("HSM agent: listening for notices");
        while !quit.load(Ordering::Relaxed) {
            match l.wait(Duration::from_millis(200)) {
                Ok(ns) => {
                    for n in ns {
                        if let tierfs_meta::Notice::HsmCancel(id) = n {
                            // At once, even while the loop is busy.
                            mover.cancel(id);
                        }
                        if tx.send(Event::Notice(n)).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    stats.listening.store(false, Ordering::Relaxed);
                    tracing::warn!("HSM agent: notices lost ({e}); polling until listening again");
                    break;
                }
            }
        }
        idle(Duration::from_secs(1));
    }
    stats.listening.store(false, Ordering::Relaxed);
}

/// `hsm-mover`: the movers as a background worker of a client daemon (config key
/// `hsm_mover_archives`, default empty: off). One request per unit of work; the daemon's
/// tranquility pauses the move between its pieces ([`MoverConfig::tranquility`]), leaving the
/// disk and network to applications; a take that finds nothing is an idle round (and the
/// agent's heartbeat). The agent registers at the first unit and unregisters when the worker
/// stops; a stop during a move stops the move at its next progress check.
pub struct MoverWorker {
    mover: Mover,
    cfg: AgentConfig,
    agent: Option<u64>,
    last_housekeep: Option<Instant>,
}

impl MoverWorker {
    /// `data`: the daemon's data path, whose engine, targets, runtime and metrics the mover
    /// shares; it reads and writes through a data path of its own (its per-file state, which
    /// the mover drops after each file, must not be that of files applications have open).
    ///
    /// `tranquility`: the daemon's (config key `tranquility`), applied within each move
    /// ([`MoverConfig::tranquility`]) rather than between requests, so that a single long
    /// archive or restore yields to applications as it goes.
    pub fn new(data: Arc<DataPath>, cfg: AgentConfig, tranquility: f64) -> MoverWorker {
        let own = Arc::new(DataPath::new(
            Arc::clone(&data.meta),
            Arc::clone(&data.targets),
            data.rt.clone(),
            Arc::clone(&data.metrics),
            0,
            crate::data::DataConfig {
                cache_chunks: 16,
                ..Default::default()
            },
        ));
        MoverWorker {
            mover: Mover::new(
                Arc::clone(&data.meta),
                own,
                MoverConfig {
                    tranquility,
                    ..MoverConfig::default()
                },
            ),
            cfg,
            agent: None,
            last_housekeep: None,
        }
    }
}

impl crate::workers::Worker for MoverWorker {
    fn name(&self) -> &'static str {
        "hsm-mover"
    }
    fn interval(&self) -> Duration {
        self.cfg.poll.max(Duration::from_secs(1))
    }
    fn moves_data(&self) -> bool {
        // The mover pauses within each move, in proportion to each piece
        // ([`MoverConfig::tranquility`]); a pause after the whole request on top would count
        // those pauses again.
        false
    }
    fn work(
        &mut self,
        ctx: &crate::workers::Ctx,
    ) -> std::result::Result<crate::workers::Next, crate::workers::WorkError> {
        use crate::workers::Next;
        let meta = Arc::clone(&self.mover.meta);
        if self
            .last_housekeep
            .is_none_or(|t| t.elapsed() >= self.cfg.housekeep)
        {
            self.last_housekeep = Some(Instant::now());
            if let Err(e) = meta.hsm_housekeep() {
                ctx.error(format!("HSM housekeeping: {e}"));
            }
        }
        let agent = match self.agent {
            Some(a) => a,
            None => {
                let a = meta.hsm_agent_register(&self.cfg.info)?;
                self.agent = Some(a);
                a
            }
        };
        let mut tasks = match meta.hsm_take(agent, 1) {
            Ok(t) => t,
            Err(MetaError::Hsm(HsmError::UnknownAgent(_))) => {
                self.agent = None;
                return Ok(Next::More);
            }
            Err(e) => return Err(e.into()),
        };
        let Some(task) = tasks.pop() else {
            ctx.progress("");
            return Ok(Next::Idle);
        };
        ctx.progress(format!(
            "{} of inode {} ({} bytes)",
            task.request.action, task.request.ino, task.size
        ));
        let mover = &self.mover;
        let r = std::thread::scope(|s| {
            let h = s.spawn(|| mover.run(agent, &task));
            while !h.is_finished() {
                if ctx.stopping() {
                    mover.stop.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            h.join()
                .unwrap_or_else(|_| Err(MoverError::Bad("mover thread panicked".into())))
        });
        match r {
            Ok(Moved::Failed(why)) => ctx.note_error(format!(
                "HSM {} of inode {}: {why}",
                task.request.action, task.request.ino
            )),
            Ok(_) => {}
            Err(e) if e.agent_gone() => self.agent = None,
            Err(e) => return Err(e.to_string().into()),
        }
        Ok(Next::More)
    }
    fn finish(&mut self, _ctx: &crate::workers::Ctx) {
        if let Some(a) = self.agent.take() {
            if let Err(e) = self.mover.meta.hsm_agent_unregister(a) {
                tracing::warn!("HSM mover: unregister: {e}");
            }
        }
    }
}

/// Test hook (debug builds): `TIERFS_TEST_MOVER_STALL_MS` makes every progress check of a move
/// sleep that long, so that the integration tests can kill an agent mid-copy.
fn test_stall() -> Option<Duration> {
    #[cfg(debug_assertions)]
    {
        static STALL: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
        *STALL.get_or_init(|| {
            std::env::var("TIERFS_TEST_MOVER_STALL_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
        })
    }
    #[cfg(not(debug_assertions))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_meta::hsm::{HsmAgentInfo, RequestState};
    use tierfs_meta::{Kind, NewNode, ROOT_INO};
    use tierfs_store::archive::checksum_string;

    struct Fx {
        dir: tempfile::TempDir,
        _rt: tokio::runtime::Runtime,
        meta: Arc<dyn MetaEngine>,
        data: Arc<DataPath>,
        mover: Mover,
        agent: u64,
    }

    fn fx(stripe_size: u64) -> Fx {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("archive")).unwrap();
        let (meta, _, rt, data) = crate::data::fixture::data_path(
            dir.path(),
            "mover",
            2,
            stripe_size,
            crate::data::DataConfig::default(),
            |m| m,
        );
        let data = Arc::new(data);
        meta.hsm_archive_add(
            1,
            &format!("file://{}", dir.path().join("archive").display()),
        )
        .unwrap();
        let agent = meta
            .hsm_agent_register(&HsmAgentInfo {
                name: "test".into(),
                archives: vec![1],
                ..Default::default()
            })
            .unwrap();
        let cfg = MoverConfig {
            read_size: 64 << 10,
            commit_bytes: 3 * stripe_size,
            first_commit_bytes: stripe_size,
            sum_chunk: stripe_size,
            progress_interval: Duration::ZERO,
            tranquility: 0.0,
        };
        let mover = Mover::new(Arc::clone(&meta), Arc::clone(&data), cfg);
        Fx {
            dir,
            _rt: rt,
            meta,
            data,
            mover,
            agent,
        }
    }

    fn file(f: &Fx, name: &[u8], bytes: &[u8]) -> u64 {
        let layout = f.data.choose_layout(ROOT_INO).unwrap();
        let node = NewNode {
            kind: Kind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            symlink: None,
        };
        let ino = f
            .meta
            .create(ROOT_INO, name, &node, Some(layout), None)
            .unwrap()
            .ino;
        f.data.write(ino, 0, bytes).unwrap();
        f.data.fsync(ino).unwrap();
        f.data.forget(ino);
        ino
    }

    fn read_all(f: &Fx, ino: u64) -> Vec<u8> {
        f.data.invalidate(ino, None);
        let size = f.meta.getattr(ino).unwrap().size;
        let mut out = Vec::new();
        while (out.len() as u64) < size {
            let b = f.data.read(ino, out.len() as u64, 1 << 20, true).unwrap();
            assert!(!b.is_empty());
            out.extend_from_slice(&b);
        }
        f.data.forget(ino);
        out
    }

    fn take_one(f: &Fx, action: HsmAction) -> HsmTask {
        let mut t = f.meta.hsm_take(f.agent, 1).unwrap();
        assert_eq!(t.len(), 1, "one task to take");
        let t = t.remove(0);
        assert_eq!(t.request.action, action);
        t
    }

    fn archive_files(f: &Fx) -> Vec<std::path::PathBuf> {
        fn walk(d: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out)
                } else if !p
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".tierfs-probe")
                {
                    out.push(p)
                }
            }
        }
        let mut v = Vec::new();
        walk(&f.dir.path().join("archive"), &mut v);
        v
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 31 + i / 977) % 256) as u8).collect()
    }

    #[test]
    fn archive_release_restore_is_byte_identical() {
        let f = fx(256 << 10);
        let data = pattern((256 << 10) * 7 + 1234);
        let ino = file(&f, b"a", &data);
        f.meta
            .hsm_request(ino, HsmAction::Archive, Some(1))
            .unwrap();
        let t = take_one(&f, HsmAction::Archive);
        assert_eq!(
            f.mover.run(f.agent, &t).unwrap(),
            Moved::Completed(HsmOutcome::Done)
        );
        let st = f.meta.hsm_state(ino).unwrap();
        assert!(st.flags.archived() && !st.flags.dirty(), "{}", st.flags);
        let copy = st.copy.unwrap();
        assert_eq!(copy.size, data.len() as u64);
        assert!(
            copy.checksum
                .starts_with(&checksum_string(crc32fast::hash(&data))),
            "{}",
            copy.checksum
        );
        // the copy is the file's bytes, alone in the archive
        let files = archive_files(&f);
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(std::fs::read(&files[0]).unwrap(), data);

        let a = f.meta.hsm_release(ino).unwrap();
        assert!(a.hsm.released());
        assert_eq!(a.size, data.len() as u64);

        f.meta
            .hsm_request(ino, HsmAction::Restore, None)
            .unwrap()
            .unwrap();
        let t = take_one(&f, HsmAction::Restore);
        assert_eq!(
            f.mover.run(f.agent, &t).unwrap(),
            Moved::Completed(HsmOutcome::Done)
        );
        let a = f.meta.getattr(ino).unwrap();
        assert!(!a.hsm.released() && a.hsm.archived(), "{}", a.hsm);
        assert_eq!(read_all(&f, ino), data);
        assert_eq!(
            f.meta.hsm_get_request(t.request.id).unwrap().state,
            RequestState::Succeeded
        );

        // REMOVE deletes the copy
        f.meta
            .hsm_request(ino, HsmAction::Remove, None)
            .unwrap()
            .unwrap();
        let t = take_one(&f, HsmAction::Remove);
        assert_eq!(
            f.mover.run(f.agent, &t).unwrap(),
            Moved::Completed(HsmOutcome::Done)
        );
        assert!(archive_files(&f).is_empty());
        assert!(!f.meta.hsm_state(ino).unwrap().flags.archived());
    }

    /// Archives `data` as file `name` with the mover, releases it, and flips bit 0 of every
    /// byte at `corrupt` in the copy: the released file's inode.
    fn released_with_corrupt_copy(f: &Fx, name: &[u8], data: &[u8], corrupt: &[usize]) -> u64 {
        let ino = file(f, name, data);
        f.meta
            .hsm_request(ino, HsmAction::Archive, Some(1))
            .unwrap();
        let t = take_one(f, HsmAction::Archive);
        f.mover.run(f.agent, &t).unwrap();
        f.meta.hsm_release(ino).unwrap();
        assert!(f.meta.read_chunk(ino, 0).unwrap().is_empty());
        let key = f.meta.hsm_state(ino).unwrap().copy.unwrap().key;
        let copy = f.dir.path().join("archive").join(key);
        let mut bad = std::fs::read(&copy).unwrap();
        for &at in corrupt {
            bad[at] ^= 0x01;
        }
        std::fs::write(&copy, &bad).unwrap();
        ino
    }

    #[test]
    fn restore_commits_the_prefix_as_it_goes() {
        // The copy's last byte is corrupt: its chunk's checksum fails the restore, but by
        // then the chunks read (and verified) before were committed one batch at a time
        // (readable while the rest moved). The file stays released; `hsm action` says why.
        let f = fx(64 << 10);
        let data = pattern((64 << 10) * 10);
        let ino = released_with_corrupt_copy(&f, b"p", &data, &[data.len() - 1]);
        f.meta.hsm_request(ino, HsmAction::Restore, None).unwrap();
        let t = take_one(&f, HsmAction::Restore);
        assert!(matches!(
            f.mover.run(f.agent, &t).unwrap(),
            Moved::Failed(_)
        ));
        assert!(f.meta.getattr(ino).unwrap().hsm.released());
        for c in 0..9 {
            assert_eq!(f.meta.read_chunk(ino, c).unwrap().len(), 1, "chunk {c}");
        }
        assert!(f.meta.read_chunk(ino, 9).unwrap().is_empty());
        assert_eq!(
            f.meta.hsm_get_request(t.request.id).unwrap().restored,
            9 * (64 << 10)
        );
        f.data.invalidate(ino, None);
        let first = f.data.read(ino, 0, 64 << 10, false).unwrap();
        assert_eq!(first, data[..64 << 10]);
    }

    #[test]
    fn tranquility_pauses_within_one_move_in_proportion_to_each_piece() {
        // One archive and one restore of 16 pieces each: with tranquility 2 the mover sleeps
        // between the pieces of the same request (not only after it), twice what each took;
        // with 0 it never sleeps.
        for tranquility in [0.0, 2.0] {
            let mut f = fx(64 << 10);
            f.mover = Mover::new(
                Arc::clone(&f.meta),
                Arc::clone(&f.data),
                MoverConfig {
                    read_size: 64 << 10,
                    commit_bytes: 3 * (64 << 10),
                    first_commit_bytes: 64 << 10,
                    sum_chunk: 64 << 10,
                    progress_interval: Duration::ZERO,
                    tranquility,
                },
            );
            let data = pattern(1 << 20);
            let ino = file(&f, b"t", &data);
            f.meta
                .hsm_request(ino, HsmAction::Archive, Some(1))
                .unwrap();
            let t = take_one(&f, HsmAction::Archive);
            let t0 = Instant::now();
            assert_eq!(
                f.mover.run(f.agent, &t).unwrap(),
                Moved::Completed(HsmOutcome::Done)
            );
            f.meta.hsm_release(ino).unwrap();
            f.meta.hsm_request(ino, HsmAction::Restore, None).unwrap();
            let t = take_one(&f, HsmAction::Restore);
            assert_eq!(
                f.mover.run(f.agent, &t).unwrap(),
                Moved::Completed(HsmOutcome::Done)
            );
            let took = t0.elapsed();
            let paused = *f.mover.paused.lock();
            if tranquility == 0.0 {
                assert_eq!(paused, Duration::ZERO);
            } else {
                assert!(paused > Duration::ZERO, "no pause within the moves");
                // each pause is 2x a piece's time, and the pieces took at most the rest
                assert!(
                    paused <= (took - paused) * 2 + Duration::from_millis(5),
                    "paused {paused:?} of {took:?}"
                );
            }
            assert_eq!(read_all(&f, ino), data);
        }
    }

    #[test]
    fn copy_keys_parse_back_and_nothing_else_does() {
        let k = copy_key(0xabc, 7, 42);
        assert_eq!(k, "0000000000000abc/v7.r42");
        assert_eq!(parse_copy_key(&k), Some((0xabc, 42)));
        assert_eq!(parse_copy_key(&format!("{k}#123")), Some((0xabc, 42)));
        for bad in [
            "0000000000000abc/v7.r42#",
            "0000000000000abc/v7.r42#x",
            "0000000000000abc/v7.r",
            "0000000000000abc/v.r4",
            "0000000000000abc/x7.r4",
            "000000000000abc/v7.r42",
            "0000000000000abz/v7.r42",
            "0000000000000abc/v7.r42/x",
            "imported/tree/file.dat",
            ".tierfs-probe-1",
        ] {
            assert_eq!(parse_copy_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_cancel_notice_stops_the_move_before_its_next_report() {
        // Reports once an hour: only the notice (Mover::cancel) can stop the copy before its
        // end; without it the mover would copy it all and learn at completion (Canceled).
        let mut f = fx(64 << 10);
        f.mover = Mover::new(
            Arc::clone(&f.meta),
            Arc::clone(&f.data),
            MoverConfig {
                read_size: 64 << 10,
                commit_bytes: 1 << 20,
                first_commit_bytes: 64 << 10,
                sum_chunk: 64 << 10,
                progress_interval: Duration::from_secs(3600),
                tranquility: 4.0,
            },
        );
        let ino = file(&f, b"n", &pattern(8 << 20));
        let req = f
            .meta
            .hsm_request(ino, HsmAction::Archive, Some(1))
            .unwrap()
            .unwrap();
        let t = take_one(&f, HsmAction::Archive);
        let moved = std::thread::scope(|s| {
            let h = s.spawn(|| f.mover.run(f.agent, &t));
            while !f.mover.moves.lock().contains_key(&req.id) {
                std::thread::sleep(Duration::from_millis(1));
            }
            f.meta.hsm_cancel(ino).unwrap();
            f.mover.cancel(req.id);
            h.join().unwrap().unwrap()
        });
        assert_eq!(moved, Moved::Stopped);
        assert!(archive_files(&f).is_empty(), "{:?}", archive_files(&f));
        assert!(f.mover.moves.lock().is_empty());
        // a notice about a request not moved here is forgotten at once
        f.mover.cancel(12345);
        assert!(f.mover.moves.lock().is_empty());
    }

    #[test]
    fn a_corrupt_chunk_is_never_committed_nor_anything_after_it() {
        // Chunk 4 of 10 is corrupt: it and every chunk after it are never committed (per-chunk
        // checksums checked before each commit); what was committed before is verified data.
        let f = fx(64 << 10);
        let data = pattern((64 << 10) * 10);
        let ino = released_with_corrupt_copy(&f, b"k", &data, &[4 * (64 << 10) + 5]);
        f.meta.hsm_request(ino, HsmAction::Restore, None).unwrap();
        let t = take_one(&f, HsmAction::Restore);
        match f.mover.run(f.agent, &t).unwrap() {
            Moved::Failed(why) => assert!(why.contains("at byte 262144"), "{why}"),
            o => panic!("{o:?}"),
        }
        let r = f.meta.hsm_get_request(t.request.id).unwrap();
        assert_eq!(r.state, RequestState::Failed);
        // commits of 1, 2, 3 chunks: chunks 0..3 went, chunk 3 (verified) waited for more
        assert_eq!(r.restored, 3 * (64 << 10));
        for c in 0..10 {
            assert_eq!(
                f.meta.read_chunk(ino, c).unwrap().len(),
                usize::from(c < 3),
                "chunk {c}"
            );
        }
        f.data.invalidate(ino, None);
        let first = f.data.read(ino, 0, 3 * (64 << 10), false).unwrap();
        assert_eq!(first, data[..3 * (64 << 10)]);
    }

    #[test]
    fn a_copy_with_the_whole_checksum_only_is_verified_before_anything_is_committed() {
        let f = fx(64 << 10);
        let data = pattern((64 << 10) * 6 + 99);
        let whole = checksum_string(crc32fast::hash(&data));
        // corrupt: nothing committed
        let ino = released_with_corrupt_copy(&f, b"w", &data, &[data.len() - 1]);
        f.meta.hsm_request(ino, HsmAction::Restore, None).unwrap();
        let mut t = take_one(&f, HsmAction::Restore);
        t.copy.as_mut().unwrap().checksum = whole.clone();
        match f.mover.run(f.agent, &t).unwrap() {
            Moved::Failed(why) => assert!(why.contains("checksum mismatch"), "{why}"),
            o => panic!("{o:?}"),
        }
        for c in 0..7 {
            assert!(f.meta.read_chunk(ino, c).unwrap().is_empty(), "chunk {c}");
        }
        // intact: restored, byte-identical
        let ino = released_with_corrupt_copy(&f, b"v", &data, &[]);
        f.meta.hsm_request(ino, HsmAction::Restore, None).unwrap();
        let mut t = take_one(&f, HsmAction::Restore);
        t.copy.as_mut().unwrap().checksum = whole;
        assert_eq!(
            f.mover.run(f.agent, &t).unwrap(),
            Moved::Completed(HsmOutcome::Done)
        );
        assert_eq!(read_all(&f, ino), data);
    }

    #[test]
    fn cancel_stops_the_archive_and_leaves_no_copy() {
        let f = fx(64 << 10);
        let data = pattern(1 << 20);
        let ino = file(&f, b"c", &data);
        f.meta
            .hsm_request(ino, HsmAction::Archive, Some(1))
            .unwrap();
        let t = take_one(&f, HsmAction::Archive);
        f.meta.hsm_cancel(ino).unwrap();
        assert_eq!(f.mover.run(f.agent, &t).unwrap(), Moved::Stopped);
        assert!(archive_files(&f).is_empty(), "{:?}", archive_files(&f));
        assert!(!f.meta.hsm_state(ino).unwrap().flags.archived());
    }

    #[test]
    fn the_copy_holds_the_version_the_mover_read() {
        // A write after the take and before the mover starts: the mover notes the version it
        // reads (not the take's), so the copy it records holds the written bytes. (A write
        // during the copy, which makes the completion Stale, is the engine's conformance test.)
        let f = fx(64 << 10);
        let data = pattern(300 << 10);
        let ino = file(&f, b"s", &data);
        f.meta
            .hsm_request(ino, HsmAction::Archive, Some(1))
            .unwrap();
        let t = take_one(&f, HsmAction::Archive);
        f.data.write(ino, 0, b"changed").unwrap();
        f.data.fsync(ino).unwrap();
        f.data.forget(ino);
        let v = f.meta.getattr(ino).unwrap().data_version;
        assert_ne!(v, t.data_version);
        assert_eq!(
            f.mover.run(f.agent, &t).unwrap(),
            Moved::Completed(HsmOutcome::Done)
        );
        let st = f.meta.hsm_state(ino).unwrap();
        assert!(!st.flags.dirty());
        assert_eq!(st.copy.unwrap().data_version, v);
        let files = archive_files(&f);
        assert_eq!(std::fs::read(&files[0]).unwrap()[..7], *b"changed");
    }

    #[test]
    fn corrupt_copy_fails_the_restore_and_the_file_stays_released() {
        let f = fx(64 << 10);
        let data = pattern(200 << 10);
        let ino = file(&f, b"x", &data);
        f.meta
            .hsm_request(ino, HsmAction::Archive, Some(1))
            .unwrap();
        let t = take_one(&f, HsmAction::Archive);
        f.mover.run(f.agent, &t).unwrap();
        f.meta.hsm_release(ino).unwrap();
        let files = archive_files(&f);
        let mut bad = std::fs::read(&files[0]).unwrap();
        bad[1000] ^= 0xff;
        std::fs::write(&files[0], &bad).unwrap();
        let req = f
            .meta
            .hsm_request(ino, HsmAction::Restore, None)
            .unwrap()
            .unwrap();
        let t = take_one(&f, HsmAction::Restore);
        match f.mover.run(f.agent, &t).unwrap() {
            Moved::Failed(why) => assert!(why.contains("checksum mismatch"), "{why}"),
            o => panic!("{o:?}"),
        }
        let r = f.meta.hsm_get_request(req.id).unwrap();
        assert_eq!(
            r.state,
            RequestState::Failed,
            "a corrupt copy is not retried"
        );
        assert!(r.last_error.unwrap().contains("checksum mismatch"));
        assert!(f.meta.getattr(ino).unwrap().hsm.released());
    }

    #[test]
    fn unreachable_archive_fails_with_retry() {
        let f = fx(64 << 10);
        let ino = file(&f, b"u", &pattern(1000));
        std::fs::remove_dir_all(f.dir.path().join("archive")).unwrap();
        let req = f
            .meta
            .hsm_request(ino, HsmAction::Archive, Some(1))
            .unwrap()
            .unwrap();
        let t = take_one(&f, HsmAction::Archive);
        match f.mover.run(f.agent, &t).unwrap() {
            Moved::Failed(why) => assert!(why.contains("unreachable"), "{why}"),
            o => panic!("{o:?}"),
        }
        let r = f.meta.hsm_get_request(req.id).unwrap();
        assert_eq!(r.state, RequestState::Waiting, "retried later");
        assert!(!f.meta.hsm_state(ino).unwrap().flags.archived());
    }
}
