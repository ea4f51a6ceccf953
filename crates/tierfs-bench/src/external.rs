//! The real IOR, mdtest and filebench, when they are installed: `--engine auto` (the default)
//! drives the binaries found on `PATH` with the options of the built-in equivalents and reads
//! their own summaries; without them, the built-in reimplementations run. `--engine real`
//! insists on the binaries, `--engine builtin` never uses them.
//!
//! IOR and mdtest run under MPI (`mpirun`, MPICH or Open MPI), one rank per task. Tasks are
//! placed per client as mpirun places them per node (rank `r` on client `r / tasks`), and every
//! rank sees its client's mount at one path, as every node of a cluster sees its own mount of the
//! filesystem at the same path: each rank runs in a mount namespace of its own (`unshare
//! --mount`) in which its client's directory is bind-mounted on that path. IOR is told the
//! clients are nodes (`IOR_FAKE_NODES`, `IOR_FAKE_TASK_PER_NODES`), so `-C` makes each task read
//! what a task on the next client wrote, and mdtest's `-N tasks` makes each task stat, read and
//! remove another client's files.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::BenchError;
use crate::runner::{Measurement, Unit};
use crate::util;

/// Which implementation of a benchmark runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// The real binary when it (and mpirun, for IOR and mdtest) is on PATH, else the built-in.
    #[default]
    Auto,
    /// The built-in reimplementation.
    Builtin,
    /// The real binary; an error if it is not installed.
    Real,
}

/// An MPI launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mpi {
    pub mpirun: PathBuf,
    pub open_mpi: bool,
    /// Its `--version` line, for the report.
    pub version: String,
}

/// A real benchmark binary and how it is launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    pub path: PathBuf,
    /// Its version line, for the report.
    pub version: String,
    /// The MPI launcher (IOR and mdtest).
    pub mpi: Option<Mpi>,
}

impl Tool {
    /// How the report names it, e.g. "ior (IOR-4.1.0+dev) under mpirun (HYDRA build details...)".
    pub fn describe(&self) -> String {
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match &self.mpi {
            Some(m) => format!("real {name} ({}) under {}", self.version, m.version),
            None => format!("real {name} ({})", self.version),
        }
    }
}

/// A program on `PATH` (an executable regular file).
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

fn first_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// `mpirun` on PATH, MPICH's or Open MPI's.
pub fn find_mpi() -> Option<Mpi> {
    let mpirun = which("mpirun")?;
    let out = Command::new(&mpirun).arg("--version").output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let open_mpi = text.contains("Open MPI") || text.contains("OpenRTE");
    let version = text
        .lines()
        .map(str::trim)
        .find(|l| l.contains("Version") || l.contains("Open MPI") || l.contains("OpenRTE"))
        .unwrap_or("mpirun")
        .to_string();
    Some(Mpi {
        mpirun,
        open_mpi,
        version: if version.starts_with("mpirun") || open_mpi {
            version
        } else {
            format!("mpirun (MPICH {version})")
        },
    })
}

/// Finds `name` (and mpirun when `mpi`) for `engine`: `Ok(None)` means the built-in runs.
pub fn resolve(engine: Engine, name: &str, mpi: bool) -> Result<Option<Tool>, BenchError> {
    if engine == Engine::Builtin {
        return Ok(None);
    }
    let found = which(name).map(|path| {
        let version = version_of(&path, name);
        (path, version)
    });
    let launcher = if mpi { find_mpi() } else { None };
    match (found, launcher) {
        (Some((path, version)), Some(m)) if mpi => Ok(Some(Tool {
            path,
            version,
            mpi: Some(m),
        })),
        (Some((path, version)), _) if !mpi => Ok(Some(Tool {
            path,
            version,
            mpi: None,
        })),
        (found, _) if engine == Engine::Real => Err(BenchError::Args(if found.is_none() {
            format!("--engine real: {name} is not on PATH")
        } else {
            format!("--engine real: {name} needs mpirun (MPICH or Open MPI) on PATH")
        })),
        _ => Ok(None),
    }
}

/// The version line of a benchmark binary, or its path: IOR and mdtest have no version option
/// (they print their version in each run's output, kept in the run's log).
fn version_of(path: &Path, name: &str) -> String {
    if name != "filebench" {
        return path.display().to_string();
    }
    let out = Command::new(path).arg("-h").output();
    let text = match &out {
        Ok(o) => format!(
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(_) => String::new(),
    };
    text.lines()
        .map(str::trim)
        .find(|l| {
            let l = l.to_lowercase();
            l.contains("version") || l.contains(&format!("{name}-")) || l.starts_with(name)
        })
        .map(|l| l.to_string())
        .unwrap_or_else(|| first_line(text.as_bytes()))
}

/// Quotes `s` for sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Where the ranks of one run work: `roots[k]` is client k's directory; with more than one
/// distinct root each rank sees its client's root at `at`.
#[derive(Debug, Clone)]
pub struct Placement {
    pub roots: Vec<PathBuf>,
    pub tasks_per_client: usize,
    pub at: PathBuf,
}

impl Placement {
    /// The first `clients` of `roots`, `tasks_per_client` ranks each, bound on `scratch/name`
    /// (created here) when the clients' directories differ.
    pub fn new(
        roots: &[PathBuf],
        clients: usize,
        tasks_per_client: usize,
        scratch: &Path,
        name: &str,
    ) -> Result<Placement, BenchError> {
        let at = scratch.join(name);
        std::fs::create_dir_all(&at)
            .map_err(|e| BenchError::io(format!("create {}", at.display()), e))?;
        let roots: Vec<PathBuf> = roots.iter().take(clients).cloned().collect();
        if roots.len() != clients {
            return Err(BenchError::Setup(format!(
                "{clients} clients wanted, {} mounted",
                roots.len()
            )));
        }
        Ok(Placement {
            roots,
            tasks_per_client,
            at,
        })
    }

    /// The path every rank uses for the run's directory.
    pub fn dir(&self) -> &Path {
        if self.needs_namespaces() {
            &self.at
        } else {
            &self.roots[0]
        }
    }

    fn needs_namespaces(&self) -> bool {
        self.roots.iter().any(|r| r != &self.roots[0])
    }

    /// The shell script a rank runs under `unshare --mount`: binds its client's root on `at`,
    /// then execs the benchmark (`"$@"`).
    pub fn rank_script(&self) -> String {
        let mut s = format!(
            "k=$(( ${{PMI_RANK:-${{OMPI_COMM_WORLD_RANK:-${{PMIX_RANK:-0}}}}}} / {} ))\ncase $k in\n",
            self.tasks_per_client
        );
        for (k, r) in self.roots.iter().enumerate() {
            s.push_str(&format!("  {k}) r={} ;;\n", sh_quote(&r.to_string_lossy())));
        }
        s.push_str("  *) echo \"rank on no client: $k\" >&2; exit 1 ;;\nesac\n");
        s.push_str(&format!(
            "mount --bind \"$r\" {} || exit 1\nexec \"$@\"\n",
            sh_quote(&self.at.to_string_lossy())
        ));
        s
    }
}

/// The mpirun command that runs `tool` with `args` on `np` ranks placed by `p`, with `env`.
pub fn mpirun(
    tool: &Tool,
    np: usize,
    p: &Placement,
    args: &[String],
    env: &[(&str, String)],
) -> Result<Command, BenchError> {
    let Some(mpi) = tool.mpi.as_ref() else {
        return Err(BenchError::Setup(format!(
            "{} runs under MPI, and no mpirun was found",
            tool.path.display()
        )));
    };
    let mut c = Command::new(&mpi.mpirun);
    if mpi.open_mpi {
        c.arg("--allow-run-as-root").arg("--oversubscribe");
        for (k, _) in env {
            c.arg("-x").arg(k);
        }
    }
    c.arg("-np").arg(np.to_string());
    if p.needs_namespaces() {
        c.arg("unshare")
            .arg("--mount")
            .arg("--propagation")
            .arg("private")
            .arg("--")
            .arg("sh")
            .arg("-c")
            .arg(p.rank_script())
            .arg("sh");
    }
    c.arg(&tool.path).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    Ok(c)
}

/// Runs `cmd` (killed on interrupt), keeps its output in `log`, and fails with its last lines
/// when it exits non-zero or prints one of `bad` (case-insensitive).
pub fn run_logged(
    cmd: &mut Command,
    what: &str,
    log: &Path,
    bad: &[&str],
) -> Result<String, BenchError> {
    let out = util::run_command(cmd, what)?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::write(log, &text);
    let lower = text.to_lowercase();
    let flagged = bad
        .iter()
        .find_map(|b| {
            lower
                .lines()
                .position(|l| l.contains(&b.to_lowercase()))
                .and_then(|i| text.lines().nth(i))
        })
        .map(str::trim);
    if !out.status.success() || flagged.is_some() {
        let tail = match flagged {
            Some(l) => l.to_string(),
            None => text
                .lines()
                .rev()
                .filter(|l| !l.trim().is_empty())
                .take(2)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" / "),
        };
        return Err(BenchError::Command {
            command: what.to_string(),
            detail: format!(
                "{}: {} (output in {})",
                out.status,
                tail.trim(),
                log.display()
            ),
        });
    }
    Ok(text)
}

/// IOR's JSON summary (`-O summaryFormat=JSON`): the mean bandwidth (MiB/s) and transfers per
/// second of `operation` ("write" or "read").
pub fn ior_summary(json: &str, operation: &str) -> Result<(f64, f64), BenchError> {
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| BenchError::Report(format!("IOR summary is not JSON: {e}")))?;
    let rows = v
        .get("summary")
        .and_then(|s| s.as_array())
        .ok_or_else(|| BenchError::Report("IOR summary has no \"summary\" list".into()))?;
    let row = rows
        .iter()
        .find(|r| r.get("operation").and_then(|o| o.as_str()) == Some(operation))
        .ok_or_else(|| BenchError::Report(format!("IOR summary has no {operation} row")))?;
    let num = |k: &str| {
        row.get(k)
            .and_then(|x| x.as_f64())
            .ok_or_else(|| BenchError::Report(format!("IOR summary's {operation} row has no {k}")))
    };
    Ok((num("bwMeanMIB")?, num("OPsMean")?))
}

/// mdtest's "SUMMARY rate" table: the mean rate of each of create, stat, read and remove.
pub fn mdtest_summary(text: &str) -> Result<Vec<Measurement>, BenchError> {
    let rows = [
        ("create", "File creation"),
        ("stat", "File stat"),
        ("read", "File read"),
        ("remove", "File removal"),
    ];
    let table = text
        .split("SUMMARY rate")
        .nth(1)
        .ok_or_else(|| BenchError::Report("mdtest printed no SUMMARY rate table".into()))?;
    let mut out = Vec::new();
    for (phase, label) in rows {
        let line = table
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(label))
            .ok_or_else(|| BenchError::Report(format!("mdtest's summary has no {label} row")))?;
        let nums: Vec<f64> = line[label.len()..]
            .trim_start_matches([' ', ':'])
            .split_whitespace()
            .map(|x| x.parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| BenchError::Report(format!("mdtest's {label} row: {line}")))?;
        // Max, Min, Mean, Std Dev.
        let mean = *nums
            .get(2)
            .ok_or_else(|| BenchError::Report(format!("mdtest's {label} row: {line}")))?;
        out.push(Measurement::new(phase, "ops", Unit::OpsPerSec, mean));
    }
    Ok(out)
}

/// filebench's "IO Summary:" line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FilebenchSummary {
    pub ops_per_sec: f64,
    pub reads_per_sec: f64,
    pub writes_per_sec: f64,
    /// filebench's "mb/s" (2^20 bytes).
    pub mib_per_sec: f64,
}

/// filebench's "IO Summary:" line: operations, reads and writes per second, and MiB/s.
pub fn filebench_summary(text: &str) -> Result<FilebenchSummary, BenchError> {
    let line = text
        .lines()
        .find_map(|l| l.split_once("IO Summary:").map(|(_, r)| r.trim()))
        .ok_or_else(|| BenchError::Report("filebench printed no IO Summary".into()))?;
    // "N ops X ops/s R/W rd/wr ...": the figure before "ops/s", and "R/W" before "rd/wr".
    let words: Vec<&str> = line.split_whitespace().collect();
    let before = |w: &str| {
        words
            .iter()
            .position(|x| *x == w)
            .and_then(|i| i.checked_sub(1))
            .map(|i| words[i])
            .ok_or_else(|| BenchError::Report(format!("filebench's IO Summary: {line}")))
    };
    let ops: f64 = before("ops/s")?
        .parse()
        .map_err(|_| BenchError::Report(format!("filebench's IO Summary: {line}")))?;
    let (r, w) = before("rd/wr")?
        .split_once('/')
        .and_then(|(r, w)| Some((r.parse::<f64>().ok()?, w.parse::<f64>().ok()?)))
        .ok_or_else(|| BenchError::Report(format!("filebench's IO Summary: {line}")))?;
    let mib = words
        .iter()
        .find_map(|x| x.strip_suffix("mb/s"))
        .and_then(|x| x.parse::<f64>().ok())
        .ok_or_else(|| BenchError::Report(format!("filebench's IO Summary: {line}")))?;
    Ok(FilebenchSummary {
        ops_per_sec: ops,
        reads_per_sec: r,
        writes_per_sec: w,
        mib_per_sec: mib,
    })
}

/// The personality file of an installed filebench: `<prefix>/share/filebench/workloads/NAME.f`
/// beside `<prefix>/bin/filebench`.
pub fn filebench_personality(tool: &Tool, name: &str) -> Result<PathBuf, BenchError> {
    let prefix = tool
        .path
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/usr"));
    let candidates = [
        prefix.join(format!("share/filebench/workloads/{name}.f")),
        PathBuf::from(format!("/usr/share/filebench/workloads/{name}.f")),
        PathBuf::from(format!("/usr/local/share/filebench/workloads/{name}.f")),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            BenchError::Setup(format!(
                "filebench is installed but its {name}.f is not (looked in {})",
                candidates[0].display()
            ))
        })
}

/// An installed personality with this run's settings: each `set $VAR=` line named in `sets` gets
/// the new value, and the `run` line runs `secs` seconds. Every variable must be set by the
/// personality, so a personality of another shape is refused rather than run unlike asked.
pub fn filebench_script(
    personality: &str,
    sets: &[(&str, String)],
    secs: u64,
) -> Result<String, BenchError> {
    let mut seen = vec![false; sets.len()];
    let mut run = false;
    let mut out = String::new();
    for line in personality.lines() {
        let t = line.trim_start();
        let mut replaced = None;
        for (i, (var, val)) in sets.iter().enumerate() {
            if let Some(rest) = t.strip_prefix(&format!("set ${var}")) {
                if rest.trim_start().starts_with('=') {
                    seen[i] = true;
                    replaced = Some(format!("set ${var}={val}"));
                }
            }
        }
        if replaced.is_none() && (t == "run" || t.starts_with("run ")) {
            run = true;
            replaced = Some(format!("run {secs}"));
        }
        out.push_str(replaced.as_deref().unwrap_or(line));
        out.push('\n');
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(BenchError::Setup(format!(
            "the installed filebench personality sets no ${} (not the standard one?)",
            sets[i].0
        )));
    }
    if !run {
        return Err(BenchError::Setup(
            "the installed filebench personality has no run line".into(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // An IOR 4.1 JSON summary (`-O summaryFormat=JSON`), cut to the fields read.
    const IOR_JSON: &str = r#"{"Version": "4.1.0+dev", "summary": [
      {"operation": "write", "API": "POSIX", "numTasks": 2, "bwMeanMIB": 888.7355, "OPsMean": 888.7355},
      {"operation": "read", "API": "POSIX", "numTasks": 2, "bwMeanMIB": 2005.4946, "OPsMean": 2005.25}
    ]}"#;

    #[test]
    fn ior_summary_reads_the_mean_of_each_operation() {
        assert_eq!(
            ior_summary(IOR_JSON, "write").unwrap(),
            (888.7355, 888.7355)
        );
        assert_eq!(ior_summary(IOR_JSON, "read").unwrap(), (2005.4946, 2005.25));
        assert!(ior_summary(IOR_JSON, "stat").is_err());
        assert!(ior_summary("not json", "write").is_err());
        assert!(ior_summary(r#"{"summary": [{"operation": "write"}]}"#, "write").is_err());
    }

    // The tail of mdtest 4.1's output for `-F -n 200 -w 32768 -e 32768 -X -N 1`, 2 tasks.
    const MDTEST_OUT: &str = "2 tasks, 400 files

SUMMARY rate (in ops/sec): (of 1 iterations)
   Operation                     Max            Min           Mean        Std Dev
   ---------                     ---            ---           ----        -------
   File creation               20029.149      20029.149      20029.149          0.000
   File stat                   33300.020      33300.020      33300.020          0.000
   File read                   49751.545      49751.545      49751.545          0.000
   File removal                49975.324      49975.324      49975.324          0.000
   Tree creation                  83.023         83.023         83.023          0.000
   Tree removal                   84.530         84.530         84.530          0.000
-- finished at 11/25/2026 01:24:59 --
";

    #[test]
    fn mdtest_summary_reads_the_mean_rate_of_each_file_phase() {
        let m = mdtest_summary(MDTEST_OUT).unwrap();
        let got: Vec<(&str, f64)> = m.iter().map(|m| (m.test.as_str(), m.value)).collect();
        assert_eq!(
            got,
            vec![
                ("create", 20029.149),
                ("stat", 33300.020),
                ("read", 49751.545),
                ("remove", 49975.324)
            ]
        );
        assert!(mdtest_summary("no table").is_err());
        let cut = MDTEST_OUT.replace("   File read                   49751.545      49751.545      49751.545          0.000\n", "");
        assert!(mdtest_summary(&cut).is_err());
    }

    #[test]
    fn filebench_summary_reads_ops_and_the_read_write_rates() {
        let line =
            "  61.038: IO Summary: 130402 ops 2173.148 ops/s 1087/1087 rd/wr  17.0mb/s 1.6ms/op\n";
        assert_eq!(
            filebench_summary(line).unwrap(),
            FilebenchSummary {
                ops_per_sec: 2173.148,
                reads_per_sec: 1087.0,
                writes_per_sec: 1087.0,
                mib_per_sec: 17.0
            }
        );
        assert!(filebench_summary("61.0: Run took 60 seconds...").is_err());
        assert!(filebench_summary("IO Summary: lots of ops").is_err());
    }

    #[test]
    fn filebench_script_sets_the_variables_and_the_run_time() {
        let f = "set $dir=/tmp\nset $nfiles=1000\nset $nthreads=16\ndefine fileset name=x,path=$dir\nrun 60\n";
        let s = filebench_script(
            f,
            &[
                ("dir", "/mnt/a b".into()),
                ("nfiles", "200".into()),
                ("nthreads", "4".into()),
            ],
            10,
        )
        .unwrap();
        assert_eq!(
            s,
            "set $dir=/mnt/a b\nset $nfiles=200\nset $nthreads=4\ndefine fileset name=x,path=$dir\nrun 10\n"
        );
        // A variable the personality does not set is refused, as is a missing run line.
        assert!(filebench_script(f, &[("iosize", "1m".into())], 10).is_err());
        assert!(filebench_script("set $dir=/tmp\n", &[("dir", "/x".into())], 10).is_err());
        // `set $dirwidth` is not `set $dir`.
        assert!(
            filebench_script("set $dirwidth=20\nrun 60\n", &[("dir", "/x".into())], 10).is_err()
        );
    }

    #[test]
    fn each_rank_binds_its_clients_root() {
        let p = Placement {
            roots: vec!["/m/c0/run".into(), "/m/c1/it's".into()],
            tasks_per_client: 2,
            at: "/scratch/at".into(),
        };
        assert_eq!(p.dir(), Path::new("/scratch/at"));
        let s = p.rank_script();
        assert!(s.contains("/ 2 ))"), "{s}");
        assert!(s.contains("0) r='/m/c0/run' ;;"), "{s}");
        assert!(s.contains("1) r='/m/c1/it'\\''s' ;;"), "{s}");
        assert!(
            s.contains("mount --bind \"$r\" '/scratch/at' || exit 1"),
            "{s}"
        );
        // Run it as sh would, for ranks 0..4 (echo instead of mount and exec).
        for (rank, want) in [
            (0, "/m/c0/run"),
            (1, "/m/c0/run"),
            (2, "/m/c1/it's"),
            (3, "/m/c1/it's"),
        ] {
            let dry = s
                .replace("mount --bind \"$r\"", "echo \"$r\"")
                .replace("exec \"$@\"", "exit 0");
            let out = Command::new("sh")
                .arg("-c")
                .arg(&dry)
                .env("PMI_RANK", rank.to_string())
                .output()
                .unwrap();
            assert!(out.status.success(), "rank {rank}: {out:?}");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).lines().next(),
                Some(format!("{want} /scratch/at").as_str()),
                "rank {rank}"
            );
        }
        // A rank past the last client is refused, never bound to nothing.
        let out = Command::new("sh")
            .arg("-c")
            .arg(s.replace("exec \"$@\"", "exit 0"))
            .env("PMI_RANK", "4")
            .output()
            .unwrap();
        assert!(!out.status.success());
        // One client (or native): no namespaces, the root itself.
        let one = Placement {
            roots: vec!["/n".into(), "/n".into()],
            tasks_per_client: 1,
            at: "/scratch/at".into(),
        };
        assert_eq!(one.dir(), Path::new("/n"));
    }

    #[test]
    fn builtin_never_looks_for_binaries_and_real_insists_on_them() {
        assert_eq!(resolve(Engine::Builtin, "ior", true).unwrap(), None);
        let missing = "tierfs-no-such-benchmark";
        assert_eq!(resolve(Engine::Auto, missing, false).unwrap(), None);
        let e = resolve(Engine::Real, missing, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not on PATH"), "{e}");
    }
}
