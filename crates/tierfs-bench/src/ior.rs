//! IOR, reimplemented: N tasks over `--clients` mounts write then read a file per process (-F)
//! or one shared file in IOR's segmented layout, optionally reordered so each task reads what a
//! task on another client wrote (-C), with fsync after write (-e), O_DIRECT (--direct), or the
//! "hard" strided shared-file pattern with 47008-byte transfers (--hard).
//!
//! Layout, as IOR: task `i` of `n`, segment `s`, transfer `j`:
//! file per process: file `i`, offset `s*b + j*t`; shared file: offset `s*n*b + i*b + j*t`.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::error::BenchError;
use crate::external::{self, Engine, Placement, Tool};
use crate::pattern::{self, AlignedBuf};
use crate::runner::{run_tasks, Measurement, RunCtx, Unit, Workload};
use crate::stats::{aggregate, TaskTiming};
use crate::util::{self, fmt_size, parse_size};

/// The timestamp signature (`-G`) the real IOR writes into its data and checks on reading.
const REAL_SIGNATURE: &str = "20261125";

/// IOR's transfer (and block) size in the "hard" shared-file test.
pub const HARD_XFER: u64 = 47008;

#[derive(Debug, Clone, clap::Args)]
pub struct IorArgs {
    /// Client mounts of the one filesystem.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Tasks (threads) per client: IOR's tasks per node.
    #[arg(long, default_value_t = 1)]
    pub tasks: usize,
    /// Transfer size: bytes per write or read call (IOR -t).
    #[arg(short = 't', long = "transfer-size", default_value = "1m", value_parser = parse_size)]
    pub transfer: u64,
    /// Block size: contiguous bytes per task per segment, a multiple of -t (IOR -b).
    #[arg(short = 'b', long = "block-size", default_value = "64m", value_parser = parse_size)]
    pub block: u64,
    /// Segments (IOR -s).
    #[arg(short = 's', long = "segments", default_value_t = 1)]
    pub segments: u64,
    /// File per process (IOR -F); default: one shared file.
    #[arg(short = 'F', long = "file-per-process")]
    pub fpp: bool,
    /// Reorder tasks: each task reads what a task on the next client wrote (IOR -C).
    #[arg(short = 'C', long = "reorder")]
    pub reorder: bool,
    /// fsync after the writes of each task, inside the timed phase (IOR -e).
    #[arg(short = 'e', long = "fsync")]
    pub fsync: bool,
    /// O_DIRECT with 4 KiB aligned buffers (IOR --posix.odirect); -t and -b must be multiples of 4 KiB.
    #[arg(long)]
    pub direct: bool,
    /// IOR "hard": one shared file, 47008-byte transfers and blocks, strided over tasks; the
    /// segment count is chosen so each task moves about -b x -s bytes.
    #[arg(long)]
    pub hard: bool,
    /// Which IOR runs: the real `ior` under `mpirun` when both are on PATH (auto), the real one
    /// or an error (real), or the built-in (builtin). The real one verifies what it reads (-R).
    #[arg(long, value_enum, default_value_t = Engine::Auto)]
    pub engine: Engine,
}

/// A validated IOR configuration.
#[derive(Debug, Clone)]
pub struct Ior {
    pub clients: usize,
    pub tasks: usize,
    pub transfer: u64,
    pub block: u64,
    pub segments: u64,
    pub fpp: bool,
    pub reorder: bool,
    pub fsync: bool,
    pub direct: bool,
    pub hard: bool,
    /// The real IOR, when it runs instead of the built-in.
    pub real: Option<Tool>,
}

impl Ior {
    pub fn new(a: &IorArgs) -> Result<Ior, BenchError> {
        let bad = |s: &str| Err(BenchError::Args(s.to_string()));
        if a.clients == 0 || a.clients > 64 {
            return bad("--clients must be 1 to 64");
        }
        if a.tasks == 0 || a.tasks > 256 {
            return bad("--tasks must be 1 to 256");
        }
        if a.segments == 0 {
            return bad("-s must be at least 1");
        }
        let (mut t, mut b, mut s) = (a.transfer, a.block, a.segments);
        if a.hard {
            if a.fpp {
                return bad("--hard is a shared-file test: drop -F");
            }
            let total = b.saturating_mul(s);
            t = HARD_XFER;
            b = HARD_XFER;
            s = total.div_ceil(HARD_XFER).max(1);
        }
        if t == 0 || b == 0 {
            return bad("-t and -b must be greater than 0");
        }
        if t > 1 << 30 {
            return bad("-t must be at most 1g");
        }
        if b % t != 0 {
            return bad("-b must be a multiple of -t");
        }
        if a.direct && (t % 4096 != 0 || b % 4096 != 0) {
            return bad(if a.hard {
                "--direct needs 4 KiB multiples, and --hard uses 47008-byte transfers"
            } else {
                "--direct needs -t and -b to be multiples of 4k"
            });
        }
        let n = (a.clients * a.tasks) as u64;
        if b.checked_mul(s)
            .and_then(|x| x.checked_mul(n))
            .is_none_or(|x| x > 1 << 44)
        {
            return bad("-b x -s x tasks is too large");
        }
        Ok(Ior {
            clients: a.clients,
            tasks: a.tasks,
            transfer: t,
            block: b,
            segments: s,
            fpp: a.fpp,
            reorder: a.reorder,
            fsync: a.fsync,
            direct: a.direct,
            hard: a.hard,
            real: external::resolve(a.engine, "ior", true)?,
        })
    }

    fn ntasks(&self) -> usize {
        self.clients * self.tasks
    }

    /// Client (mount) of task `i`: tasks are placed per node, as mpirun does.
    fn client_of(&self, i: usize) -> usize {
        i / self.tasks
    }

    /// Whose data task `i` reads.
    pub fn read_owner(&self, i: usize) -> usize {
        if self.reorder {
            (i + self.tasks) % self.ntasks()
        } else {
            i
        }
    }

    fn path(&self, ctx: &RunCtx, task: usize, owner: usize) -> PathBuf {
        let root = &ctx.roots[self.client_of(task)];
        if self.fpp {
            root.join(format!("ior.{owner:08}"))
        } else {
            root.join("ior.shared")
        }
    }

    fn seed(&self, owner: usize) -> u64 {
        if self.fpp {
            pattern::seed_of(&[owner as u64])
        } else {
            pattern::seed_of(&[u64::MAX])
        }
    }

    fn offset(&self, owner: usize, seg: u64, j: u64) -> u64 {
        if self.fpp {
            seg * self.block + j * self.transfer
        } else {
            seg * self.ntasks() as u64 * self.block + owner as u64 * self.block + j * self.transfer
        }
    }

    fn file_size(&self) -> u64 {
        if self.fpp {
            self.segments * self.block
        } else {
            self.segments * self.block * self.ntasks() as u64
        }
    }

    fn per_task_bytes(&self) -> u64 {
        self.segments * self.block
    }

    fn flags(&self) -> i32 {
        if self.direct {
            libc::O_DIRECT
        } else {
            0
        }
    }

    fn write_task(&self, ctx: &RunCtx, i: usize) -> Result<TaskTiming, BenchError> {
        let start = Instant::now();
        let path = self.path(ctx, i, i);
        // As IOR: with a shared file, task 0 creates it before the phase and every task opens
        // it without O_CREAT.
        let f = OpenOptions::new()
            .write(true)
            .create(self.fpp)
            .truncate(false)
            .custom_flags(self.flags())
            .open(&path)
            .map_err(|e| BenchError::io(format!("open {}", path.display()), e))?;
        let mut buf = AlignedBuf::new(self.transfer as usize);
        let seed = self.seed(i);
        let mut ops = 0;
        for seg in 0..self.segments {
            for j in 0..self.block / self.transfer {
                util::check_interrupt()?;
                let off = self.offset(i, seg, j);
                pattern::fill(&mut buf, seed, off);
                util::pwrite_all(&f, &buf, off, &path)?;
                ctx.progress.inc(self.transfer);
                ops += 1;
            }
        }
        if self.fsync {
            f.sync_all()
                .map_err(|e| BenchError::io(format!("fsync {}", path.display()), e))?;
        }
        drop(f);
        Ok(TaskTiming {
            start,
            end: Instant::now(),
            bytes: self.per_task_bytes(),
            ops,
        })
    }

    fn read_task(&self, ctx: &RunCtx, i: usize) -> Result<TaskTiming, BenchError> {
        let start = Instant::now();
        let owner = self.read_owner(i);
        let path = self.path(ctx, i, owner);
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(self.flags())
            .open(&path)
            .map_err(|e| BenchError::io(format!("open {}", path.display()), e))?;
        let mut buf = AlignedBuf::new(self.transfer as usize);
        let mut scratch = Vec::new();
        let seed = self.seed(owner);
        let mut ops = 0;
        for seg in 0..self.segments {
            for j in 0..self.block / self.transfer {
                util::check_interrupt()?;
                let off = self.offset(owner, seg, j);
                util::pread_exact(&f, &mut buf, off, &path)?;
                pattern::verify(&buf, seed, off, &mut scratch, &path)?;
                ctx.progress.inc(self.transfer);
                ops += 1;
            }
        }
        let size = f
            .metadata()
            .map_err(|e| BenchError::io(format!("stat {}", path.display()), e))?
            .len();
        if size != self.file_size() {
            return Err(BenchError::Verify {
                path,
                offset: size,
                detail: format!("file size {size}, expected {}", self.file_size()),
            });
        }
        Ok(TaskTiming {
            start,
            end: Instant::now(),
            bytes: self.per_task_bytes(),
            ops,
        })
    }
}

impl Ior {
    /// The real IOR's arguments for one phase ("write" or "read"), its summary going to
    /// `summary`: the write keeps the files (-k) and fsyncs with -e; the read verifies (-R) and
    /// reorders with -C.
    pub fn real_args(
        &self,
        dir: &std::path::Path,
        phase: &str,
        summary: &std::path::Path,
    ) -> Vec<String> {
        let file = dir.join(if self.fpp { "ior" } else { "ior.shared" });
        let mut a: Vec<String> = [
            "-a",
            "POSIX",
            "-i",
            "1",
            "-t",
            &self.transfer.to_string(),
            "-b",
            &self.block.to_string(),
            "-s",
            &self.segments.to_string(),
            "-o",
            &file.to_string_lossy(),
            "-O",
            "summaryFormat=JSON",
            "-O",
            &format!("summaryFile={}", summary.display()),
            // The data's signature, the same in the write and the verifying read.
            "-G",
            REAL_SIGNATURE,
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        if self.fpp {
            a.push("-F".into());
        }
        if self.direct {
            a.push("--posix.odirect".into());
        }
        if phase == "write" {
            a.extend(["-w".into(), "-k".into()]);
            if self.fsync {
                a.push("-e".into());
            }
        } else {
            a.extend(["-r".into(), "-R".into()]);
            if self.reorder {
                a.push("-C".into());
            }
        }
        a
    }

    /// Write, then (page cache dropped) read and verify, each one run of the real IOR.
    fn run_real(&self, tool: &Tool, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        let place = Placement::new(&ctx.roots, self.clients, self.tasks, &ctx.scratch, "ior-at")?;
        // Each client is a node to IOR, so that -C reads the next client's data.
        let env = [
            ("IOR_FAKE_NODES", self.clients.to_string()),
            ("IOR_FAKE_TASK_PER_NODES", self.tasks.to_string()),
        ];
        let mut out = Vec::new();
        for phase in ["write", "read"] {
            if phase == "read" && ctx.drop_caches {
                util::drop_caches();
            }
            ctx.progress.phase(&format!("{phase} (real IOR)"), 1);
            let summary = ctx.scratch.join(format!("ior-{phase}.json"));
            let _ = std::fs::remove_file(&summary);
            let args = self.real_args(place.dir(), phase, &summary);
            let mut cmd = external::mpirun(tool, self.ntasks(), &place, &args, &env)?;
            external::run_logged(
                &mut cmd,
                &format!("ior ({phase})"),
                &ctx.scratch.join(format!("ior-{phase}.log")),
                &["incorrect data", "error:"],
            )?;
            let json = std::fs::read_to_string(&summary)
                .map_err(|e| BenchError::io(format!("read {}", summary.display()), e))?;
            let (bw, ops) = external::ior_summary(&json, phase)?;
            out.push(Measurement::new(phase, "bw", Unit::MibPerSec, bw));
            out.push(Measurement::new(phase, "ops", Unit::OpsPerSec, ops));
            ctx.progress.inc(1);
        }
        Ok(out)
    }
}

impl Workload for Ior {
    fn workload(&self) -> &'static str {
        "ior"
    }

    fn name(&self) -> String {
        let kind = if self.hard {
            "hard"
        } else if self.fpp {
            "fpp"
        } else {
            "ssf"
        };
        let mut s = format!("ior-{kind}");
        if self.direct {
            s.push_str("-direct");
        }
        s
    }

    fn label(&self) -> String {
        format!(
            "IOR {}, {} client(s) x {} task(s), -t {} -b {} -s {}{}{}{}{}",
            if self.hard {
                "shared file hard (strided)"
            } else if self.fpp {
                "file per process"
            } else {
                "shared file (segmented)"
            },
            self.clients,
            self.tasks,
            fmt_size(self.transfer),
            fmt_size(self.block),
            self.segments,
            if self.reorder { " -C" } else { "" },
            if self.fsync { " -e" } else { "" },
            if self.direct { " O_DIRECT" } else { "" },
            match &self.real {
                Some(t) => format!("; {}", t.describe()),
                None => String::new(),
            },
        )
    }

    fn equivalent(&self) -> String {
        format!(
            "mpirun -np {} ior -w -r -k -t {} -b {} -s {}{}{}{}{}",
            self.ntasks(),
            self.transfer,
            self.block,
            self.segments,
            if self.fpp { " -F" } else { "" },
            if self.reorder { " -C" } else { "" },
            if self.fsync { " -e" } else { "" },
            if self.direct { " --posix.odirect" } else { "" },
        )
    }

    fn config(&self) -> serde_json::Value {
        json!({
            "clients": self.clients, "tasks_per_client": self.tasks, "transfer": self.transfer,
            "block": self.block, "segments": self.segments, "file_per_process": self.fpp,
            "reorder": self.reorder, "fsync": self.fsync, "direct": self.direct, "hard": self.hard,
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
        let total = self.per_task_bytes() * n as u64;
        ctx.progress.phase("write", total);
        if !self.fpp {
            let p = self.path(ctx, 0, 0);
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .map_err(|e| BenchError::io(format!("create {}", p.display()), e))?;
        }
        let w = run_tasks(n, |i| self.write_task(ctx, i))?;
        if ctx.drop_caches {
            util::drop_caches();
        }
        ctx.progress.phase("read + verify", total);
        let r = run_tasks(n, |i| self.read_task(ctx, i))?;
        let mut out = Vec::new();
        for (phase, timings) in [("write", &w), ("read", &r)] {
            let a = aggregate(timings).ok_or_else(|| BenchError::Setup("no tasks ran".into()))?;
            out.push(Measurement::new(
                phase,
                "bw",
                Unit::MibPerSec,
                a.mib_per_sec,
            ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::Progress;
    use std::os::unix::fs::FileExt;

    fn args(fpp: bool, hard: bool) -> IorArgs {
        IorArgs {
            clients: 2,
            tasks: 2,
            transfer: 64 << 10,
            block: 256 << 10,
            segments: 2,
            fpp,
            reorder: true,
            fsync: false,
            direct: false,
            hard,
            engine: Engine::Builtin,
        }
    }

    #[test]
    fn layout_and_reorder_follow_ior() {
        let ior = Ior::new(&args(false, false)).unwrap();
        // 4 tasks, tasks 0,1 on client 0 and 2,3 on client 1; -C shifts by tasks per node
        assert_eq!(
            (0..4).map(|i| ior.read_owner(i)).collect::<Vec<_>>(),
            [2, 3, 0, 1]
        );
        assert_eq!(
            (0..4).map(|i| ior.client_of(i)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        // shared file: segment 1 of task 2, transfer 3
        assert_eq!(
            ior.offset(2, 1, 3),
            4 * (256 << 10) + 2 * (256 << 10) + 3 * (64 << 10)
        );
        let hard = Ior::new(&args(false, true)).unwrap();
        assert_eq!((hard.transfer, hard.block), (HARD_XFER, HARD_XFER));
        assert_eq!(hard.segments, (512u64 << 10).div_ceil(HARD_XFER));
        assert_eq!(hard.offset(1, 2, 0), 2 * 4 * HARD_XFER + HARD_XFER);
        assert!(Ior::new(&IorArgs {
            fpp: true,
            ..args(false, true)
        })
        .is_err());
        assert!(Ior::new(&IorArgs {
            direct: true,
            ..args(false, true)
        })
        .is_err());
        assert!(Ior::new(&IorArgs {
            block: 100 << 10,
            ..args(true, false)
        })
        .is_err());
        assert!(Ior::new(&IorArgs {
            clients: 0,
            ..args(true, false)
        })
        .is_err());
    }

    #[test]
    fn a_corrupted_byte_fails_the_read_phase() {
        for fpp in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let ior = Ior::new(&args(fpp, false)).unwrap();
            let progress = Progress::hidden();
            let ctx = RunCtx {
                mode: crate::Mode::Native,
                rep: 0,
                roots: vec![dir.path().to_path_buf(); 2],
                scratch: dir.path().to_path_buf(),
                progress: &progress,
                drop_caches: false,
            };
            if !fpp {
                std::fs::write(ior.path(&ctx, 0, 0), b"").unwrap();
            }
            run_tasks(4, |i| ior.write_task(&ctx, i)).unwrap();
            run_tasks(4, |i| ior.read_task(&ctx, i)).unwrap();
            let victim = ior.path(&ctx, 0, if fpp { 1 } else { 0 });
            let f = OpenOptions::new().write(true).open(&victim).unwrap();
            f.write_all_at(&[0xAA], 300_000).unwrap();
            match run_tasks(4, |i| ior.read_task(&ctx, i)) {
                Err(BenchError::Verify { offset, .. }) => assert_eq!(offset, 300_000),
                other => panic!("corruption not caught: {other:?}"),
            }
            // a truncated file is a short read
            f.set_len(1000).unwrap();
            assert!(run_tasks(4, |i| ior.read_task(&ctx, i)).is_err());
        }
    }
}
