//! `tierfs bench`: the seeds' benchmark methodology (IOR, mdtest, fio, filebench, untar) run
//! against a plain directory on the same disk (`native`) and a fresh tierfs mounted by several
//! clients, side by side, interleaved per repetition, with verified data, medians and ratios
//! to native, and JSON, CSV, markdown and PNG reports. See docs/bench.md.

pub mod error;
pub mod external;
pub mod filebench;
pub mod fio;
pub mod fixture;
pub mod ior;
pub mod mdtest;
pub mod pattern;
pub mod plot;
pub mod remote;
pub mod report;
pub mod runner;
pub mod stats;
pub mod suite;
pub mod untar;
pub mod util;

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};

pub use error::BenchError;
pub use fixture::Mode;
pub use report::Report;
pub use runner::Workload;

/// `tierfs bench`: options shared by every workload, then the workload.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Benchmarks: IOR, mdtest, fio, filebench and untar on the local disk and on tierfs, side by side",
    long_about = "Runs the seeds' benchmark workloads against a plain directory on the work dir's disk \
(mode native) and a fresh tierfs formatted in the work dir and mounted by --clients clients \
(mode tierfs), interleaved per repetition. Every byte read back is verified; a failed run is \
reported as failed, never as a rate. Prints a table of medians and ratios to native; with --out, \
also writes results.json, results.csv, report.md and PNG charts. Needs root (FUSE mounts, \
dropping the page cache). See docs/bench.md."
)]
pub struct BenchArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// Options of every `tierfs bench` command.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Repetitions per mode (figures are medians over them).
    #[arg(long, global = true, default_value_t = 3)]
    pub reps: u32,
    /// Modes to compare, comma separated: native, tierfs, tierfs+rw-pcc, tierfs+ro-pcc [default:
    /// all four when this tierfs has `tierfs pcc`, else native,tierfs]. The PCC modes mount
    /// every client with a cache dir and attach files by rule (RW at create, RO at open).
    #[arg(long, global = true, value_enum, value_delimiter = ',')]
    pub modes: Option<Vec<Mode>>,
    /// Parent of the work dir (native directory, tierfs database, targets, mount points).
    #[arg(long, global = true, default_value = "/var/tmp")]
    pub workdir: PathBuf,
    /// Write results.json, results.csv, report.md and PNG charts here.
    #[arg(long, global = true)]
    pub out: Option<PathBuf>,
    /// Do not drop the page cache between writing and reading.
    #[arg(long, global = true)]
    pub no_drop_caches: bool,
    /// Storage targets of the tierfs under test.
    #[arg(long, global = true, default_value_t = 2)]
    pub targets: usize,
    /// Default stripe count of the tierfs under test (-1: all targets).
    #[arg(long, global = true, default_value_t = 1, allow_hyphen_values = true)]
    pub stripe_count: i64,
    /// Metadata database of the tierfs under test, formatted with --force (whatever it holds is
    /// destroyed), e.g. postgres://tierfs@127.0.0.1:5432/bench1 (password from PGPASSWORD,
    /// never printed) [default: SQLite in the work dir].
    #[arg(long = "meta", global = true, value_name = "URL")]
    pub meta: Option<String>,
    /// Storage target of the tierfs under test (repeat for several), instead of --targets local
    /// directories in the work dir: file:///DIR or s3://BUCKET/PREFIX?endpoint=URL&region=NAME
    /// (credentials from TIERFS_S3_CREDENTIALS). Each run formats its own sub-directory or
    /// key sub-prefix, named after its work dir, so reruns never collide.
    #[arg(long = "target-url", global = true, value_name = "URL")]
    pub target_urls: Vec<String>,
    /// Keep the work dir afterwards (clients are unmounted all the same).
    #[arg(long, global = true)]
    pub keep: bool,
    /// Fail a run that takes longer than this (its clients are aborted and remounted).
    #[arg(long, global = true, default_value = "10m", value_parser = util::parse_duration)]
    pub run_timeout: std::time::Duration,
    /// Save each tierfs client's counters (its mount's `.tierfs-stats`: FUSE operations and
    /// their latency, PCC events, bytes per target) right before and right after each run, as
    /// DIR/RUN-cN.before.txt and DIR/RUN-cN.after.txt (RUN: workload, mode and repetition).
    /// The difference is what the run cost each client.
    #[arg(long, global = true, value_name = "DIR")]
    pub mount_stats: Option<PathBuf>,
    /// No live progress display.
    #[arg(long, global = true)]
    pub no_progress: bool,
    /// The capacity tier across a network: PostgreSQL (--meta) and the S3 store (--target-url)
    /// on the server host, the clients on client hosts (network namespaces, made by
    /// scripts/bench-remote.sh), the links shaped to PROFILE: 1gbe (1 Gbit/s, 0.1 ms one way),
    /// ib (no added delay, no rate limit), wan (100 Mbit/s, 20 ms one way). The shaping is
    /// checked before any figure. See docs/bench.md.
    #[arg(long, global = true, value_name = "PROFILE")]
    pub remote: Option<String>,
    /// With --remote: the server host's network namespace.
    #[arg(long, global = true, default_value = "tfsrv")]
    pub server_netns: String,
    /// With --remote: the client hosts' network namespaces (client k mounts in the k-th,
    /// round robin).
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "tfc1,tfc2"
    )]
    pub client_netns: Vec<String>,
    /// The tierfs binary that formats and mounts (default: this program).
    #[arg(long, global = true, env = "TIERFS_BIN", hide = true)]
    pub tierfs_bin: Option<PathBuf>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// IOR: file per process or shared file, many clients, write then read (verified); the real
    /// `ior` under `mpirun` when installed (--engine).
    Ior(ior::IorArgs),
    /// mdtest: create, stat, read and remove files, many clients; the real `mdtest` under
    /// `mpirun` when installed (--engine).
    Mdtest(mdtest::MdtestArgs),
    /// fio (the real binary, JSON output, verified by fio); skipped if fio is not installed.
    Fio(fio::FioArgs),
    /// filebench personalities fileserver, webserver and varmail: the real `filebench` when
    /// installed (--engine), else reimplemented.
    Filebench(filebench::FilebenchArgs),
    /// Extract a tarball of many small files (default: made from /usr/include).
    Untar(untar::UntarArgs),
    /// All of the above, every mode: report and charts.
    Suite(suite::SuiteArgs),
    /// Chart each figure's PCC speed-up over uncached tierfs from several runs' results.json
    /// (one group per figure, the seed's speed-up in its label), into a PNG.
    SpeedupChart {
        /// The PNG to write.
        #[arg(long)]
        png: PathBuf,
        /// The chart's title.
        #[arg(long, default_value = "PCC speed-up over uncached tierfs")]
        title: String,
        /// results.json files of `tierfs bench` runs with tierfs and a PCC mode.
        #[arg(required = true)]
        results: Vec<PathBuf>,
    },
    /// Print what a --remote network profile is (1gbe, ib, wan); an unknown name is an error.
    Profile {
        /// The profile's name.
        name: String,
    },
}

/// How a bench session runs, independent of the command line.
#[derive(Debug, Clone)]
pub struct Session {
    pub env: fixture::EnvConfig,
    pub run: runner::RunOptions,
    pub progress: bool,
    pub command_line: String,
    pub notes: Vec<String>,
}

/// Runs `workloads` in every mode and builds the report. Only an interrupt or a broken setup
/// is an error; failed runs are in the report.
pub fn execute(workloads: &[Box<dyn Workload>], s: &Session) -> Result<Report, BenchError> {
    let started = Instant::now();
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let mut env = fixture::Env::create(s.env.clone())?;
    let machine = report::Machine::detect(&env.dir);
    let fs = env.fs_under_test();
    let progress = runner::Progress::new(s.progress);
    let mut results = Vec::new();
    for w in workloads {
        match runner::run_workload(w.as_ref(), &mut env, &s.run, &progress) {
            Ok(r) => results.push(r),
            Err(e) => {
                progress.finish();
                return Err(e);
            }
        }
    }
    progress.finish();
    env.teardown()?;
    let mut modes = s.run.modes.clone();
    modes.sort();
    let rows = report::build_rows(&results, &modes);
    Ok(Report {
        tool: "tierfs bench".into(),
        tierfs_version: tierfs_version(&s.env.tierfs),
        command_line: s.command_line.clone(),
        date,
        duration_s: started.elapsed().as_secs_f64(),
        machine,
        fs,
        modes,
        reps: s.run.reps,
        drop_caches: s.run.drop_caches,
        notes: s.notes.clone(),
        workloads: results,
        rows,
    })
}

fn tierfs_version(bin: &std::path::Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("tierfs {} (bench crate)", env!("CARGO_PKG_VERSION")))
}

/// Entry point of `tierfs bench`: runs, prints the table, writes the reports. Returns an error
/// when any run failed (after the reports are written), so the exit status tells.
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    util::install_signal_handlers();
    let c = &args.common;
    if let BenchCommand::Profile { name } = &args.command {
        println!("{}", remote::Profile::parse(name)?.describe());
        return Ok(());
    }
    if let BenchCommand::SpeedupChart {
        png,
        title,
        results,
    } = &args.command
    {
        let mut reports = Vec::new();
        for p in results {
            let text = std::fs::read_to_string(p)
                .map_err(|e| BenchError::io(format!("read {}", p.display()), e))?;
            let r: Report = serde_json::from_str(&text)
                .map_err(|e| BenchError::Report(format!("{}: {e}", p.display())))?;
            reports.push(r);
        }
        plot::speedup_chart(&reports, png, title)?;
        println!("wrote {}", png.display());
        return Ok(());
    }
    // --remote: the profile, tc, the hosts and the servers are checked before anything else.
    let remote_cfg = match &c.remote {
        Some(p) => Some(remote::RemoteConfig {
            profile: remote::Profile::parse(p)?,
            server_ns: c.server_netns.clone(),
            client_ns: c.client_netns.clone(),
        }),
        None => None,
    };
    if c.reps == 0 || c.reps > 100 {
        return Err(BenchError::Args("--reps must be 1 to 100".into()));
    }
    if c.targets == 0 || c.targets > 64 {
        return Err(BenchError::Args("--targets must be 1 to 64".into()));
    }
    if let Some(m) = &c.meta {
        fixture::check_meta_url(m)?;
    }
    if c.target_urls.len() > 64 {
        return Err(BenchError::Args("at most 64 --target-url".into()));
    }
    for t in &c.target_urls {
        fixture::check_target_url(t)?;
    }
    let mut meta = c.meta.clone();
    let mut target_urls = c.target_urls.clone();
    let mut client_netns = Vec::new();
    let mut remote_notes = Vec::new();
    // Kept until the runs are done: it holds the shaping and the relays.
    let _remote = match &remote_cfg {
        Some(rc) => {
            let Some(m) = &meta else {
                return Err(BenchError::Args(
                    "--remote needs --meta postgres://USER@HOST:PORT/DB on the server host".into(),
                ));
            };
            if target_urls.is_empty() {
                return Err(BenchError::Args(
                    "--remote needs --target-url s3://BUCKET/PREFIX?endpoint=http://HOST:PORT on the server host".into(),
                ));
            }
            let mut urls = vec![m.clone()];
            urls.extend(target_urls.iter().cloned());
            let servers = remote::preflight(rc, &urls)?;
            let r = remote::Remote::start(rc, &servers)?;
            for n in &r.notes {
                eprintln!("tierfs bench: {n}");
            }
            meta = Some(r.url(m));
            target_urls = target_urls.iter().map(|u| r.url(u)).collect();
            client_netns = rc.client_ns.clone();
            remote_notes = r.notes.clone();
            Some(r)
        }
        None => None,
    };
    let tierfs = match &c.tierfs_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| BenchError::io("find the tierfs binary (current_exe)", e))?,
    };
    let pcc = fixture::pcc_available(&tierfs);
    // Every mode this tierfs has, side by side (the PCC ones once `tierfs pcc` exists).
    let default_modes = if pcc {
        vec![
            Mode::Native,
            Mode::Tierfs,
            Mode::TierfsRwPcc,
            Mode::TierfsRoPcc,
        ]
    } else {
        vec![Mode::Native, Mode::Tierfs]
    };
    let mut modes = Vec::new();
    for m in &c.modes.clone().unwrap_or(default_modes) {
        if !modes.contains(m) {
            modes.push(*m);
        }
    }
    let mut notes = remote_notes;
    let (workloads, out): (Vec<Box<dyn Workload>>, Option<PathBuf>) = match &args.command {
        BenchCommand::Ior(a) => (vec![Box::new(ior::Ior::new(a)?)], c.out.clone()),
        BenchCommand::Mdtest(a) => (vec![Box::new(mdtest::Mdtest::new(a)?)], c.out.clone()),
        BenchCommand::Fio(a) => (vec![Box::new(fio::Fio::new(a)?)], c.out.clone()),
        BenchCommand::Filebench(a) => {
            (vec![Box::new(filebench::Filebench::new(a)?)], c.out.clone())
        }
        BenchCommand::Untar(a) => (vec![Box::new(untar::Untar::new(a)?)], c.out.clone()),
        BenchCommand::Profile { .. } | BenchCommand::SpeedupChart { .. } => return Ok(()), // done above
        BenchCommand::Suite(a) => {
            notes.extend(suite::notes(a));
            (
                suite::workloads(a)?,
                Some(
                    c.out
                        .clone()
                        .unwrap_or_else(|| PathBuf::from("bench-results")),
                ),
            )
        }
    };
    let want_pcc = modes.iter().any(|m| m.is_pcc());
    if want_pcc && !pcc {
        notes.push(
            "PCC modes requested, but this tierfs has no `tierfs pcc attach`: reported as skipped"
                .into(),
        );
    }
    if want_pcc && pcc {
        notes.push(format!(
            "PCC modes: every client mounts with its own cache dir; files under a run directory with project {} (tierfs+rw-pcc) or {} (tierfs+ro-pcc) are attached by the rules `projid={{{0}}}` (rw) and `projid={{{1}}}` (ro)",
            fixture::RW_PCC_PROJECT,
            fixture::RO_PCC_PROJECT
        ));
    }
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let session = Session {
        env: fixture::EnvConfig {
            tierfs,
            workdir: c.workdir.clone(),
            targets: c.targets,
            stripe_count: c.stripe_count,
            keep: c.keep,
            pcc: want_pcc && pcc,
            meta,
            target_urls,
            client_netns,
        },
        run: runner::RunOptions {
            modes,
            reps: c.reps,
            drop_caches: !c.no_drop_caches,
            run_timeout: c.run_timeout,
            mount_stats: c.mount_stats.clone(),
        },
        progress: interactive && !c.no_progress,
        command_line: command_line(),
        notes,
    };
    let report = execute(&workloads, &session)?;
    println!("{}", report.table());
    if let Some(dir) = out {
        let files = report.write_all(&dir)?;
        for f in files {
            println!("wrote {}", f.display());
        }
    }
    let failed = report
        .rows
        .iter()
        .filter(|r| r.status == "failed")
        .map(|r| (r.name.clone(), r.mode))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if failed > 0 {
        return Err(BenchError::Failed(format!(
            "{failed} benchmark(s) failed in some mode (see the table)"
        )));
    }
    Ok(())
}

/// The command line as typed (arguments quoted when needed, URL passwords hidden).
pub fn command_line() -> String {
    std::env::args()
        .map(|a| fixture::redact_url(&a))
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
