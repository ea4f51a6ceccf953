//! mdtest, reimplemented: every task creates `-n` files (empty, or `-w` bytes each), then all
//! tasks stat them, read them back (verified), and remove them; each phase starts on a barrier
//! and its rate is all tasks' items over the phase's span, as mdtest's summary reports it.
//! Files live in one shared directory, or one directory per task (`--unique-dir`, mdtest -u);
//! `--other-client` (mdtest -N tasks-per-client; not `--remote`, which names `tierfs bench`'s
//! network profile) makes each task stat, read and remove the files a
//! task on another client created, so the creator's client cache cannot help.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::error::BenchError;
use crate::external::{self, Engine, Placement, Tool};
use crate::pattern;
use crate::runner::{run_tasks, Measurement, RunCtx, Unit, Workload};
use crate::stats::{aggregate, TaskTiming};
use crate::util::{self, fmt_size, parse_size};

#[derive(Debug, Clone, clap::Args)]
pub struct MdtestArgs {
    /// Client mounts of the one filesystem.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Tasks (threads) per client.
    #[arg(long, default_value_t = 1)]
    pub tasks: usize,
    /// Files per task (mdtest -n).
    #[arg(short = 'n', long = "items", default_value_t = 1000)]
    pub items: u64,
    /// Bytes written into each file at create and read back (mdtest -w / -e); 0: empty files.
    #[arg(short = 'w', long = "write-bytes", default_value = "0", value_parser = parse_size)]
    pub write_bytes: u64,
    /// One directory per task (mdtest -u); default: all tasks share one directory.
    #[arg(short = 'u', long = "unique-dir")]
    pub unique_dir: bool,
    /// Stat, read and remove files created by a task on another client (mdtest -N). Named
    /// `--other-client` because `tierfs bench --remote PROFILE` names the network profile.
    #[arg(short = 'N', long = "other-client")]
    pub other_client: bool,
    /// Which mdtest runs: the real `mdtest` under `mpirun` when both are on PATH (auto), the
    /// real one or an error (real), or the built-in (builtin). The real one verifies what it
    /// reads (-X).
    #[arg(long, value_enum, default_value_t = Engine::Auto)]
    pub engine: Engine,
}

#[derive(Debug, Clone)]
pub struct Mdtest {
    pub clients: usize,
    pub tasks: usize,
    pub items: u64,
    pub write_bytes: u64,
    pub unique_dir: bool,
    pub remote: bool,
    /// The real mdtest, when it runs instead of the built-in.
    pub real: Option<Tool>,
}

pub const PHASES: [&str; 4] = ["create", "stat", "read", "remove"];

impl Mdtest {
    pub fn new(a: &MdtestArgs) -> Result<Mdtest, BenchError> {
        if a.clients == 0 || a.clients > 64 {
            return Err(BenchError::Args("--clients must be 1 to 64".into()));
        }
        if a.tasks == 0 || a.tasks > 256 {
            return Err(BenchError::Args("--tasks must be 1 to 256".into()));
        }
        if a.items == 0 || a.items > 10_000_000 {
            return Err(BenchError::Args("-n must be 1 to 10000000".into()));
        }
        if a.write_bytes > 1 << 30 {
            return Err(BenchError::Args("-w must be at most 1g".into()));
        }
        Ok(Mdtest {
            clients: a.clients,
            tasks: a.tasks,
            items: a.items,
            write_bytes: a.write_bytes,
            unique_dir: a.unique_dir,
            remote: a.other_client,
            real: external::resolve(a.engine, "mdtest", true)?,
        })
    }

    fn ntasks(&self) -> usize {
        self.clients * self.tasks
    }

    fn owner(&self, i: usize) -> usize {
        if self.remote {
            (i + self.tasks) % self.ntasks()
        } else {
            i
        }
    }

    fn dir(&self, ctx: &RunCtx, task: usize, owner: usize) -> PathBuf {
        let root = &ctx.roots[task / self.tasks];
        if self.unique_dir {
            root.join(format!("mdtest.d{owner}"))
        } else {
            root.join("mdtest.shared")
        }
    }

    fn phase_task(&self, ctx: &RunCtx, phase: &str, i: usize) -> Result<TaskTiming, BenchError> {
        let start = Instant::now();
        let owner = if phase == "create" { i } else { self.owner(i) };
        let dir = self.dir(ctx, i, owner);
        let w = self.write_bytes as usize;
        let mut buf = vec![0u8; w];
        let mut scratch = Vec::new();
        for k in 0..self.items {
            util::check_interrupt()?;
            let path = dir.join(format!("f.{owner}.{k}"));
            let seed = pattern::seed_of(&[owner as u64, k]);
            match phase {
                "create" => {
                    let mut f = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&path)
                        .map_err(|e| BenchError::io(format!("create {}", path.display()), e))?;
                    if w > 0 {
                        pattern::fill(&mut buf, seed, 0);
                        f.write_all(&buf)
                            .map_err(|e| BenchError::io(format!("write {}", path.display()), e))?;
                    }
                }
                "stat" => {
                    let m = std::fs::metadata(&path)
                        .map_err(|e| BenchError::io(format!("stat {}", path.display()), e))?;
                    if m.len() != self.write_bytes {
                        return Err(BenchError::Verify {
                            path,
                            offset: m.len(),
                            detail: format!("size {}, expected {}", m.len(), self.write_bytes),
                        });
                    }
                }
                "read" => {
                    let f = std::fs::File::open(&path)
                        .map_err(|e| BenchError::io(format!("open {}", path.display()), e))?;
                    if w > 0 {
                        util::pread_exact(&f, &mut buf, 0, &path)?;
                        pattern::verify(&buf, seed, 0, &mut scratch, &path)?;
                    }
                    util::expect_eof(&f, self.write_bytes, &path)?;
                }
                _ => std::fs::remove_file(&path)
                    .map_err(|e| BenchError::io(format!("remove {}", path.display()), e))?,
            }
            ctx.progress.inc(1);
        }
        Ok(TaskTiming {
            start,
            end: Instant::now(),
            bytes: if phase == "create" || phase == "read" {
                self.items * self.write_bytes
            } else {
                0
            },
            ops: self.items,
        })
    }
}

impl Mdtest {
    /// The real mdtest's arguments: files only, one iteration, in `dir`.
    pub fn real_args(&self, dir: &std::path::Path) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "-F".into(),
            "-i".into(),
            "1".into(),
            "-n".into(),
            self.items.to_string(),
            "-d".into(),
            dir.join("mdtest").to_string_lossy().into_owned(),
        ];
        if self.write_bytes > 0 {
            let w = self.write_bytes.to_string();
            a.extend(["-w".into(), w.clone(), "-e".into(), w, "-X".into()]);
        }
        if self.unique_dir {
            a.push("-u".into());
        }
        if self.remote {
            // Ranks are placed per client, so a stride of the tasks per client is the next client.
            a.extend(["-N".into(), self.tasks.to_string()]);
        }
        a
    }

    fn run_real(&self, tool: &Tool, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        let place = Placement::new(
            &ctx.roots,
            self.clients,
            self.tasks,
            &ctx.scratch,
            "mdtest-at",
        )?;
        ctx.progress
            .phase("create, stat, read, remove (real mdtest)", 1);
        let args = self.real_args(place.dir());
        let mut cmd = external::mpirun(tool, self.ntasks(), &place, &args, &[])?;
        let text = external::run_logged(
            &mut cmd,
            "mdtest",
            &ctx.scratch.join("mdtest.log"),
            &["error:", "incorrect data"],
        )?;
        ctx.progress.inc(1);
        external::mdtest_summary(&text)
    }
}

impl Workload for Mdtest {
    fn workload(&self) -> &'static str {
        "mdtest"
    }

    fn name(&self) -> String {
        format!(
            "mdtest-{}-{}",
            if self.write_bytes == 0 {
                "empty".to_string()
            } else {
                fmt_size(self.write_bytes).replace(' ', "").to_lowercase()
            },
            if self.unique_dir { "unique" } else { "shared" }
        )
    }

    fn label(&self) -> String {
        format!(
            "mdtest {} files, {} client(s) x {} task(s), -n {} per task, {} dir{}{}",
            if self.write_bytes == 0 {
                "empty".to_string()
            } else {
                fmt_size(self.write_bytes)
            },
            self.clients,
            self.tasks,
            self.items,
            if self.unique_dir { "unique" } else { "shared" },
            if self.remote { ", -N (remote)" } else { "" },
            match &self.real {
                Some(t) => format!("; {}", t.describe()),
                None => String::new(),
            },
        )
    }

    fn equivalent(&self) -> String {
        let mut s = format!("mpirun -np {} mdtest -F -n {}", self.ntasks(), self.items);
        if self.write_bytes > 0 {
            s.push_str(&format!(" -w {0} -e {0}", self.write_bytes));
        }
        if self.unique_dir {
            s.push_str(" -u");
        }
        if self.remote {
            s.push_str(&format!(" -N {}", self.tasks));
        }
        s
    }

    fn config(&self) -> serde_json::Value {
        json!({
            "clients": self.clients, "tasks_per_client": self.tasks, "items": self.items,
            "write_bytes": self.write_bytes, "unique_dir": self.unique_dir, "remote": self.remote,
            "engine": self.real.as_ref().map_or("built-in".to_string(), Tool::describe),
        })
    }

    fn clients(&self) -> usize {
        self.clients
    }

    fn run(&self, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        if let Some(tool) = &self.real {
            return self.run_real(tool, ctx);
        }
        let n = self.ntasks();
        for i in 0..n {
            let d = self.dir(ctx, 0, i);
            std::fs::create_dir_all(&d)
                .map_err(|e| BenchError::io(format!("create {}", d.display()), e))?;
        }
        let mut out = Vec::new();
        for phase in PHASES {
            ctx.progress.phase(phase, self.items * n as u64);
            let t = run_tasks(n, |i| self.phase_task(ctx, phase, i))?;
            let a = aggregate(&t).ok_or_else(|| BenchError::Setup("no tasks ran".into()))?;
            out.push(Measurement::new(
                phase,
                "ops",
                Unit::OpsPerSec,
                a.ops_per_sec,
            ));
        }
        Ok(out)
    }
}
