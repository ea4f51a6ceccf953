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
use crate::pattern::{self, AlignedBuf};
use crate::runner::{run_tasks, Measurement, RunCtx, Unit, Workload};
use crate::stats::{aggregate, TaskTiming};
use crate::util::{self, fmt_size, parse_size};

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
        let f = OpenOptions::new()
            .write(true)
            .create(true)
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
            "IOR {}, {} client(s) x {} task(s), -t {} -b {} -s {}{}{}{}",
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
        })
    }

    fn clients(&self) -> usize {
        self.clients
    }

    fn run(&self, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        let n = self.ntasks();
        let total = self.per_task_bytes() * n as u64;
        ctx.progress.phase("write", total);
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
