//! `tierfs agent`: an HSM copytool (docs/hsm.md, "Agent deployment"). It runs without a mount:
//! it opens the metadata engine and the storage targets itself, registers with the
//! coordinator for the archives it serves, takes their requests and moves the data
//! (`tierfs_client::mover`). SIGTERM or SIGINT stops the moves under way at their next
//! progress check (what they wrote is deleted), gives their requests back and exits 0.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tierfs_client::data::{DataConfig, DataPath};
use tierfs_client::metrics::Metrics;
use tierfs_client::mover::{run_agent, AgentConfig, AgentStats, Mover, MoverConfig};
use tierfs_meta::hsm::HsmAgentInfo;
use tierfs_meta::open_engine;
use tierfs_store::TargetSet;

use crate::error::{CliError, Result};

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Metadata database URL of the filesystem (as for `tierfs mount`), e.g.
    /// sqlite:///srv/tfs/meta.db or postgres://tierfs@db1/tierfs.
    #[arg(long)]
    pub meta: String,
    /// An archive id this agent serves (repeat for several; each must be registered with
    /// `tierfs hsm archive-add ID URL`). S3 archives take their credentials from the
    /// environment as S3 targets do (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...).
    #[arg(long = "archive", required = true, value_name = "ID")]
    pub archives: Vec<u32>,
    /// Requests moved at once (the coordinator's per-agent cap also applies).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// A name for `tierfs hsm list` (default: host:pid).
    #[arg(long)]
    pub name: Option<String>,
    /// Seconds between two looks at the queue while it is empty.
    #[arg(long, default_value_t = 0.5)]
    pub poll: f64,
    /// Seconds between two runs of the coordinator's housekeeping (requeue of requests held
    /// by silent agents, purge of old final requests).
    #[arg(long, default_value_t = 30.0)]
    pub housekeep: f64,
    /// Within each archive or restore, pause after every piece moved (4 MiB read and written,
    /// or one stripe chunk) for N times the time it took, so the agent uses at most 1/(1+N) of
    /// the time and yields the disk and network to applications (0..100; 0: full speed, for an
    /// agent on a machine of its own).
    #[arg(long, default_value_t = 0.0, value_name = "N")]
    pub tranquility: f64,
    /// Seconds between two sweeps of the served archives for a killed mover's leftovers
    /// (staging files of unfinished uploads, copies never recorded); the first sweep runs at
    /// start. 0: never.
    #[arg(long, default_value_t = 3600.0, value_name = "S")]
    pub sweep: f64,
    /// A leftover is deleted only once the request that wrote it ended this many seconds ago
    /// (by the metadata database's clock); recorded copies and those of requests still
    /// active are never deleted.
    #[arg(long, default_value_t = 3600.0, value_name = "S")]
    pub sweep_grace: f64,
}

fn secs(what: &str, v: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--{what}: expected a positive number of seconds, got {v}"
            ))
        })
}

pub fn agent(a: AgentArgs) -> Result<()> {
    if a.parallel == 0 {
        return Err(CliError::Usage("--parallel: expected at least 1".into()));
    }
    let poll = secs("poll", a.poll)?;
    let housekeep = secs("housekeep", a.housekeep)?;
    let sweep = if a.sweep == 0.0 {
        None
    } else {
        Some(secs("sweep", a.sweep)?)
    };
    let sweep_grace = if a.sweep_grace == 0.0 {
        Duration::ZERO
    } else {
        secs("sweep-grace", a.sweep_grace)?
    };
    if !(0.0..=100.0).contains(&a.tranquility) {
        return Err(CliError::Usage(format!(
            "--tranquility: expected a number from 0 to 100, got {}",
            a.tranquility
        )));
    }
    // Signals go to the thread that waits for them (blocked before any other thread exists).
    let sigs = tierfs_client::daemon::signals::block(&[libc::SIGTERM, libc::SIGINT]);
    let meta = open_engine(&a.meta)?;
    let known: Vec<u32> = meta.hsm_archives()?.into_iter().map(|x| x.id).collect();
    if let Some(bad) = a.archives.iter().find(|id| !known.contains(id)) {
        return Err(CliError::Usage(format!(
            "unknown archive id {bad} (registered: {})",
            if known.is_empty() {
                "none; see tierfs hsm archive-add".to_string()
            } else {
                known
                    .iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )));
    }
    let info = meta.info()?;
    let tlist: Vec<(u32, String, u64)> = meta
        .targets()?
        .into_iter()
        .map(|t| (t.id, t.url, t.capacity))
        .collect();
    let targets = Arc::new(TargetSet::open(&tlist)?);
    tierfs_client::daemon::check_targets(&targets, &info)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tierfs-agent-io")
        .enable_all()
        .build()
        .map_err(|e| CliError::Other(format!("cannot start the I/O runtime: {e}")))?;
    let data = Arc::new(DataPath::new(
        Arc::clone(&meta),
        targets,
        rt.handle().clone(),
        Arc::new(Metrics::new()),
        info.inline_threshold,
        DataConfig::default(),
    ));
    let mover = Mover::new(
        Arc::clone(&meta),
        data,
        MoverConfig {
            tranquility: a.tranquility,
            ..MoverConfig::default()
        },
    );
    let host = hostname();
    let pid = std::process::id();
    let cfg = AgentConfig {
        info: HsmAgentInfo {
            name: a.name.clone().unwrap_or_else(|| format!("{host}:{pid}")),
            host,
            pid,
            archives: a.archives.clone(),
            max_requests: a.parallel as u32,
        },
        parallel: a.parallel,
        poll,
        housekeep,
        sweep,
        sweep_grace,
    };
    let stop = Arc::clone(&mover.stop);
    std::thread::Builder::new()
        .name("tierfs-agent-signals".into())
        .spawn(move || {
            let sig = sigs.wait();
            tracing::info!("signal {sig}: stopping");
            stop.store(true, Ordering::Relaxed);
        })
        .map_err(|e| CliError::Other(format!("cannot start the signal thread: {e}")))?;
    let stats = AgentStats::default();
    run_agent(&mover, &cfg, &stats).map_err(|e| CliError::Other(format!("HSM agent: {e}")))?;
    eprintln!(
        "tierfs agent: stopped ({} completed, {} failed, {} given back; {} looks at the queue, \
         {} on a notice; {} leftovers swept)",
        stats.completed.load(Ordering::Relaxed),
        stats.failed.load(Ordering::Relaxed),
        stats.stopped.load(Ordering::Relaxed),
        stats.takes.load(Ordering::Relaxed),
        stats.woken.load(Ordering::Relaxed),
        stats.swept.load(Ordering::Relaxed),
    );
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
