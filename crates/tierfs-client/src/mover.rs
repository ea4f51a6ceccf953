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
use tierfs_store::archive::ArchiveStore;

use crate::copysum::{chunk_for, SumReader, SumWriter};
use tierfs_store::StoreError;

use crate::data::DataPath;
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
}

impl Default for MoverConfig {
    fn default() -> Self {
        MoverConfig {
            read_size: 4 << 20,
            commit_bytes: 64 << 20,
            first_commit_bytes: crate::copysum::SUM_CHUNK,
            sum_chunk: 0,
            progress_interval: Duration::from_secs(1),
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
        }
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
        let r = match task.request.action {
            HsmAction::Archive => self.archive_file(agent, task),
            HsmAction::Restore => self.restore_file(agent, task),
            HsmAction::Remove => self.remove_copy(agent, task),
        };
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
        if self.stop.load(Ordering::Relaxed) {
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
        let key = format!("{ino:016x}/v{version}.r{}", req.id);
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
                let end = (off + (8 << 20)).min(copy.size);
                read(&mut sums, off, end)?;
                off = end;
                if self.progress(agent, req.id, 0, &mut last, false)?.is_err() {
                    return Ok(Step::Stop);
                }
            }
            sums = SumReader::new("", copy.size).map_err(MoverError::Bad)?;
        }
        // Read and verified but not committed yet: (chunk, target, bytes), in file order.
        let mut batch: Vec<(u64, u32, Bytes)> = Vec::new();
        let mut commit = self
            .cfg
            .first_commit_bytes
            .min(self.cfg.commit_bytes)
            .max(1);
        let mut committed = 0u64;
        let mut off = 0u64;
        while off < copy.size {
            let chunk = off / cs;
            let end = ((chunk + 1) * cs).min(copy.size);
            // Verified before anything of it is committed: a bad chunk fails the request
            // with the verified prefix committed and nothing after it.
            let bytes = read(&mut sums, off, end)?;
            batch.push((chunk, layout.target_of_chunk(chunk), bytes));
            off = end;
            if self
                .progress(agent, req.id, off, &mut last, false)?
                .is_err()
            {
                return Ok(Step::Stop);
            }
            let verified = sums.verified();
            if verified < committed + commit && off < copy.size {
                continue;
            }
            // Commit the pieces that end inside the verified prefix.
            let n = batch
                .iter()
                .take_while(|(c, _, b)| c * cs + b.len() as u64 <= verified)
                .count();
            if n == 0 {
                continue;
            }
            let ready: Vec<(u64, u32, Bytes)> = batch.drain(..n).collect();
            let pieces: Vec<(u32, Bytes)> = ready.iter().map(|(_, t, b)| (*t, b.clone())).collect();
            let ids = self.data.put_objects(pieces)?;
            let slices: Vec<Slice> = ready
                .iter()
                .zip(ids)
                .map(|((c, t, b), obj)| Slice::whole_object(*c, 0, *t, obj, b.len() as u64))
                .collect();
            if self.meta.hsm_restore_slices(agent, req.id, &slices)? == Progress::Stop {
                return Ok(Step::Stop);
            }
            committed = ready
                .last()
                .map_or(committed, |(c, _, b)| c * cs + b.len() as u64);
            commit = (commit * 2).min(self.cfg.commit_bytes);
            if self.progress(agent, req.id, off, &mut last, true)?.is_err() {
                return Ok(Step::Stop);
            }
        }
        if !batch.is_empty() || sums.verified() < copy.size {
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
    /// Sleep between two takes that found nothing (PostgreSQL's HSM notices would wake it
    /// earlier; not used yet).
    pub poll: Duration,
    /// How often the agent runs the coordinator's housekeeping.
    pub housekeep: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            info: Default::default(),
            parallel: 4,
            poll: Duration::from_millis(500),
            housekeep: Duration::from_secs(30),
        }
    }
}

/// Counters of a running agent.
#[derive(Debug, Default)]
pub struct AgentStats {
    pub completed: std::sync::atomic::AtomicU64,
    pub stopped: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
}

/// A copytool agent's loop (`tierfs agent`, or a client daemon's mover worker): registers,
/// takes requests of its archives and runs up to `parallel` of them at once, heartbeats
/// (every take does) while idle, runs the housekeeping now and then, registers again when the
/// coordinator dropped it, and unregisters (its requests go back to waiting) once
/// `mover.stop` is set. Errors only when the metadata engine fails.
pub fn run_agent(mover: &Mover, cfg: &AgentConfig, stats: &AgentStats) -> R<()> {
    let meta = Arc::clone(&mover.meta);
    let mut info = cfg.info.clone();
    info.max_requests = cfg.parallel.max(1) as u32;
    let mut agent = meta.hsm_agent_register(&info)?;
    tracing::info!(agent, archives = ?info.archives, "HSM agent registered");
    let mut last_housekeep: Option<Instant> = None;
    while !mover.stop.load(Ordering::Relaxed) {
        if last_housekeep.is_none_or(|t| t.elapsed() >= cfg.housekeep) {
            last_housekeep = Some(Instant::now());
            match meta.hsm_housekeep() {
                Ok((requeued, dropped, purged)) if requeued + dropped + purged > 0 => {
                    tracing::info!(requeued, dropped, purged, "HSM housekeeping")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("HSM housekeeping: {e}"),
            }
        }
        let tasks = match meta.hsm_take(agent, cfg.parallel.max(1)) {
            Ok(t) => t,
            Err(MetaError::Hsm(HsmError::UnknownAgent(_))) => {
                agent = meta.hsm_agent_register(&info)?;
                tracing::warn!(
                    agent,
                    "HSM agent was dropped by the coordinator: registered again"
                );
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if tasks.is_empty() {
            let until = Instant::now() + cfg.poll;
            while Instant::now() < until && !mover.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50).min(cfg.poll));
            }
            continue;
        }
        let results: Vec<R<Moved>> = std::thread::scope(|s| {
            let handles: Vec<_> = tasks
                .iter()
                .map(|t| s.spawn(move || mover.run(agent, t)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(MoverError::Bad("mover thread panicked".into())))
                })
                .collect()
        });
        for (t, r) in tasks.iter().zip(results) {
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
        }
    }
    match meta.hsm_agent_unregister(agent) {
        Ok(n) => tracing::info!(agent, requeued = n, "HSM agent unregistered"),
        Err(e) => tracing::warn!(agent, "HSM agent unregister: {e}"),
    }
    Ok(())
}

/// `hsm-mover`: the movers as a background worker of a client daemon (config key
/// `hsm_mover_archives`, default empty: off). One request per unit of work, so the
/// tranquilizer's pauses ([`crate::workers::Worker::moves_data`]) leave the disk and network
/// to applications between requests; a take that finds nothing is an idle round (and the
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
    pub fn new(data: Arc<DataPath>, cfg: AgentConfig) -> MoverWorker {
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
            mover: Mover::new(Arc::clone(&data.meta), own, MoverConfig::default()),
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
        true
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
    use crate::data::DataConfig;
    use crate::metrics::Metrics;
    use tierfs_meta::hsm::{HsmAgentInfo, RequestState};
    use tierfs_meta::{format_engine, FormatParams, Kind, NewNode, ROOT_INO};
    use tierfs_store::archive::checksum_string;
    use tierfs_store::TargetSet;

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
        for d in ["ost0", "ost1", "archive"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let t = |i: usize| format!("file://{}", dir.path().join(format!("ost{i}")).display());
        let meta = format_engine(
            &format!("sqlite://{}", dir.path().join("meta.db").display()),
            &FormatParams {
                name: "mover".into(),
                targets: vec![(t(0), 0), (t(1), 0)],
                stripe_count: 2,
                stripe_size,
                inline_threshold: 0,
                force: false,
            },
        )
        .unwrap();
        let list: Vec<(u32, String, u64)> = meta
            .targets()
            .unwrap()
            .into_iter()
            .map(|t| (t.id, t.url, t.capacity))
            .collect();
        let targets = Arc::new(TargetSet::open(&list).unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let data = Arc::new(DataPath::new(
            Arc::clone(&meta),
            targets,
            rt.handle().clone(),
            Arc::new(Metrics::new()),
            0,
            DataConfig::default(),
        ));
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
