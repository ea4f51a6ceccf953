//! Runs a workload in every mode, interleaved per repetition (rep 1: native, tierfs; rep 2:
//! tierfs, native; ...) so machine noise hits all modes alike, and records every run's figures
//! or its failure.

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::fixture::{Env, Mode};

/// Unit of a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Unit {
    #[serde(rename = "MiB/s")]
    MibPerSec,
    #[serde(rename = "ops/s")]
    OpsPerSec,
    #[serde(rename = "s")]
    Seconds,
    #[serde(rename = "us")]
    Micros,
    #[serde(rename = "count")]
    Count,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Unit::MibPerSec => "MiB/s",
            Unit::OpsPerSec => "ops/s",
            Unit::Seconds => "s",
            Unit::Micros => "us",
            Unit::Count => "count",
        }
    }

    /// Whether a bigger figure is better (rates) or worse (times).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Unit::MibPerSec | Unit::OpsPerSec)
    }
}

/// One figure of one run: e.g. test "write", metric "bw", 812.5 MiB/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub test: String,
    pub metric: String,
    pub unit: Unit,
    pub value: f64,
}

impl Measurement {
    pub fn new(test: &str, metric: &str, unit: Unit, value: f64) -> Self {
        Measurement {
            test: test.to_string(),
            metric: metric.to_string(),
            unit,
            value,
        }
    }
}

/// How one run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "status")]
pub enum Outcome {
    Ok { measurements: Vec<Measurement> },
    Failed { error: String },
    Skipped { reason: String },
}

/// One run: a workload in one mode in one repetition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub rep: u32,
    pub mode: Mode,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// All runs of one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    /// Family: ior, mdtest, fio, filebench, untar.
    pub workload: String,
    /// This configuration, e.g. "ior-hard".
    pub name: String,
    /// Human description with the parameters.
    pub label: String,
    /// The equivalent command of the original tool.
    pub equivalent: String,
    pub config: serde_json::Value,
    pub samples: Vec<Sample>,
}

/// A progress display: one bar, reset for each phase.
#[derive(Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(enabled: bool) -> Self {
        let target = if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(0), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {elapsed_precise:.dim} {prefix:.bold} {msg} [{bar:30}] {percent:>3}%",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    pub fn hidden() -> Self {
        Progress::new(false)
    }

    pub fn set_prefix(&self, p: String) {
        self.bar.set_prefix(p);
    }

    /// Starts a phase of `len` units (bytes or operations).
    pub fn phase(&self, msg: &str, len: u64) {
        self.bar.set_message(msg.to_string());
        self.bar.set_length(len.max(1));
        self.bar.set_position(0);
    }

    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Prints a line above the bar.
    pub fn println(&self, s: String) {
        if self.bar.is_hidden() {
            eprintln!("{s}");
        } else {
            self.bar.println(s);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// What a workload gets for one run.
pub struct RunCtx<'a> {
    pub mode: Mode,
    pub rep: u32,
    /// One directory per client (all the same directory for `native`).
    pub roots: Vec<PathBuf>,
    /// Scratch space outside the filesystem under test.
    pub scratch: PathBuf,
    pub progress: &'a Progress,
    /// Drop the page cache between writing and reading (root only).
    pub drop_caches: bool,
}

/// A benchmark workload.
pub trait Workload {
    /// Family: ior, mdtest, fio, filebench, untar.
    fn workload(&self) -> &'static str;
    /// Short name of this configuration (chart and table key).
    fn name(&self) -> String;
    /// Human description with the parameters.
    fn label(&self) -> String;
    /// The command of the original tool this corresponds to.
    fn equivalent(&self) -> String;
    /// Parameters for the report.
    fn config(&self) -> serde_json::Value;
    /// Clients (mounts) it needs.
    fn clients(&self) -> usize;
    /// Checks before any run; `Missing` skips the workload (e.g. fio not installed).
    fn preflight(&self, _scratch: &std::path::Path) -> Result<(), BenchError> {
        Ok(())
    }
    /// One run in one mode.
    fn run(&self, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError>;
}

/// Options of a side-by-side run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub modes: Vec<Mode>,
    pub reps: u32,
    pub drop_caches: bool,
    /// A run still going after this is failed: its clients' FUSE connections are aborted and
    /// they are unmounted (and mounted again for the next run).
    pub run_timeout: Duration,
    /// Where to save each tierfs client's `.tierfs-stats` before and after each run.
    pub mount_stats: Option<std::path::PathBuf>,
}

/// Runs `w` `reps` times in every mode, interleaved. Only an interrupt aborts; a failing run is
/// recorded as failed and the others go on.
pub fn run_workload(
    w: &dyn Workload,
    env: &mut Env,
    opts: &RunOptions,
    progress: &Progress,
) -> Result<WorkloadResult, BenchError> {
    let mut samples = Vec::new();
    std::fs::create_dir_all(env.scratch()).map_err(|e| BenchError::io("create scratch dir", e))?;
    let pre = w.preflight(&env.scratch());
    let n = opts.modes.len();
    for rep in 0..opts.reps {
        for i in 0..n {
            let mode = opts.modes[(i + rep as usize) % n];
            crate::util::check_interrupt()?;
            progress.set_prefix(format!(
                "{} [{} rep {}/{}]",
                w.name(),
                mode,
                rep + 1,
                opts.reps
            ));
            let outcome = match &pre {
                Err(BenchError::Missing(m)) => Outcome::Skipped { reason: m.clone() },
                Err(e) => Outcome::Failed {
                    error: e.to_string(),
                },
                Ok(()) => run_one(w, env, mode, rep, opts, progress)?,
            };
            progress.println(describe(w, mode, rep, &outcome));
            samples.push(Sample { rep, mode, outcome });
        }
    }
    Ok(WorkloadResult {
        workload: w.workload().to_string(),
        name: w.name(),
        label: w.label(),
        equivalent: w.equivalent(),
        config: w.config(),
        samples,
    })
}

fn run_one(
    w: &dyn Workload,
    env: &mut Env,
    mode: Mode,
    rep: u32,
    opts: &RunOptions,
    progress: &Progress,
) -> Result<Outcome, BenchError> {
    if mode.is_pcc() && !env.cfg.pcc {
        return Ok(Outcome::Skipped {
            reason: "this tierfs has no `tierfs pcc attach`".into(),
        });
    }
    let run = format!("{}-{}-r{rep}", w.name(), mode.name().replace('+', "-"));
    let roots = match env.run_roots(mode, w.clients(), &run) {
        Ok(r) => r,
        Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
        Err(e) => {
            return Ok(Outcome::Failed {
                error: e.to_string(),
            })
        }
    };
    let ctx = RunCtx {
        mode,
        rep,
        roots: roots.clone(),
        scratch: env.scratch(),
        progress,
        drop_caches: opts.drop_caches,
    };
    let mounts = if mode.is_tierfs() {
        env.mounted()
    } else {
        Vec::new()
    };
    save_mount_stats(opts, &mounts, &run, "before")?;
    let watched = mounts.clone();
    let tierfs = env.cfg.tierfs.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let timeout = opts.run_timeout;
    let watchdog = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(timeout) {
            crate::fixture::force_unmount(&tierfs, &watched);
            true
        } else {
            false
        }
    });
    let res = w.run(&ctx);
    let _ = done_tx.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    if timed_out {
        env.forget_clients();
        return Ok(Outcome::Failed {
            error: format!(
                "no result within {} s: the clients' FUSE connections were aborted and unmounted",
                timeout.as_secs()
            ),
        });
    }
    save_mount_stats(opts, &mounts, &run, "after")?;
    progress.phase("cleaning up", 1);
    let _ = std::fs::remove_dir_all(&roots[0]);
    match res {
        Ok(ms) if ms.iter().all(|m| m.value.is_finite()) => Ok(Outcome::Ok { measurements: ms }),
        Ok(_) => Ok(Outcome::Failed {
            error: "a figure is not a number".into(),
        }),
        Err(BenchError::Interrupted) => Err(BenchError::Interrupted),
        Err(BenchError::Missing(m)) => Ok(Outcome::Skipped { reason: m }),
        Err(e) => Ok(Outcome::Failed {
            error: e.to_string(),
        }),
    }
}

/// Copies each client's `.tierfs-stats` to `opts.mount_stats/RUN-cN.WHEN.txt`, if asked to.
fn save_mount_stats(
    opts: &RunOptions,
    mounts: &[std::path::PathBuf],
    run: &str,
    when: &str,
) -> Result<(), BenchError> {
    let Some(dir) = &opts.mount_stats else {
        return Ok(());
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::io(format!("create {}", dir.display()), e))?;
    for (i, m) in mounts.iter().enumerate() {
        let from = m.join(".tierfs-stats");
        let to = dir.join(format!("{run}-c{}.{when}.txt", i + 1));
        std::fs::copy(&from, &to).map_err(|e| {
            BenchError::io(format!("copy {} to {}", from.display(), to.display()), e)
        })?;
    }
    Ok(())
}

fn describe(w: &dyn Workload, mode: Mode, rep: u32, o: &Outcome) -> String {
    let head = format!("{} {} rep {}:", w.name(), mode, rep + 1);
    match o {
        Outcome::Ok { measurements } => {
            let parts: Vec<String> = measurements
                .iter()
                .filter(|m| m.metric != "lat")
                .map(|m| format!("{} {} {:.1} {}", m.test, m.metric, m.value, m.unit.label()))
                .collect();
            format!("{head} {}", parts.join(", "))
        }
        Outcome::Failed { error } => format!("{head} FAILED: {error}"),
        Outcome::Skipped { reason } => format!("{head} skipped: {reason}"),
    }
}

/// Runs `f(i)` on `n` threads started together (a barrier), collecting each result; the first
/// error wins.
pub fn run_tasks<T, F>(n: usize, f: F) -> Result<Vec<T>, BenchError>
where
    T: Send,
    F: Fn(usize) -> Result<T, BenchError> + Sync,
{
    let barrier = std::sync::Barrier::new(n);
    let results: Vec<Result<T, BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let f = &f;
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    f(i)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::Setup("a benchmark task panicked".into())))
            })
            .collect()
    });
    let mut out = Vec::with_capacity(n);
    let mut first_err = None;
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(e) => {
                // An interrupt is not the cause when another task failed for real.
                if first_err.is_none() || matches!(first_err, Some(BenchError::Interrupted)) {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
