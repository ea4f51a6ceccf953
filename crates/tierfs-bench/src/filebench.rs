//! filebench's three personalities of the seeds, reimplemented natively (see docs/bench.md for
//! the mapping to fileserver.f, webserver.f and varmail.f). A fileset is created first (not
//! timed); then every thread runs its personality's flow in a loop until `--duration` is over.
//! Each thread owns the files whose index is its own modulo the thread count (filebench lets
//! threads pick any file; owning them keeps every file's expected contents known, so every
//! whole-file read is verified against the pattern of the file's current generation).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::BenchError;
use crate::external::{self, Engine, Tool};
use crate::pattern;
use crate::runner::{run_tasks, Measurement, RunCtx, Unit, Workload};
use crate::stats::MIB;
use crate::util::{self, fmt_size, parse_duration, parse_size};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Personality {
    /// 128 KiB files; create, write whole file, append, read whole file, delete, stat (1:2 read:write).
    Fileserver,
    /// 64 KiB files; ten whole-file reads and a 16 KiB log append per loop (10:1).
    Webserver,
    /// 32 KiB files in one flat directory; mail-server create/append/fsync/read cycle (1:1).
    Varmail,
}

impl Personality {
    pub fn name(self) -> &'static str {
        match self {
            Personality::Fileserver => "fileserver",
            Personality::Webserver => "webserver",
            Personality::Varmail => "varmail",
        }
    }

    /// Mean file size (the seed's table: 128 KB, 64 KB, 32 KB).
    pub fn mean_size(self) -> u64 {
        match self {
            Personality::Fileserver => 128 << 10,
            Personality::Webserver => 64 << 10,
            Personality::Varmail => 32 << 10,
        }
    }

    /// Files per directory (filebench's meandirwidth).
    fn dir_width(self) -> u64 {
        match self {
            Personality::Fileserver | Personality::Webserver => 20,
            Personality::Varmail => u64::MAX,
        }
    }

    /// Share of the fileset that exists at start (filebench's prealloc).
    fn prealloc_percent(self) -> u64 {
        match self {
            Personality::Fileserver => 80,
            Personality::Webserver | Personality::Varmail => 100,
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct FilebenchArgs {
    /// fileserver, webserver or varmail.
    #[arg(value_enum)]
    pub personality: Personality,
    /// Files in the fileset.
    #[arg(long, default_value_t = 1000)]
    pub files: u64,
    /// How long the flows run.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Client mounts of the one filesystem.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Threads per client.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Mean file size (default: the personality's).
    #[arg(long, value_parser = parse_size)]
    pub mean_size: Option<u64>,
    /// Mean append size (filebench meanappendsize).
    #[arg(long, default_value = "16k", value_parser = parse_size)]
    pub append_size: u64,
    /// I/O size of whole-file reads and writes (filebench iosize).
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    pub iosize: u64,
    /// Which filebench runs: the real `filebench` with its installed personality when it is on
    /// PATH and --clients is 1 (auto), the real one or an error (real), or the built-in
    /// (builtin). The real one does not check the data it reads; the built-in does.
    #[arg(long, value_enum, default_value_t = Engine::Auto)]
    pub engine: Engine,
}

#[derive(Debug, Clone)]
pub struct Filebench {
    pub personality: Personality,
    pub files: u64,
    pub duration: Duration,
    pub clients: usize,
    pub threads: usize,
    pub mean_size: u64,
    pub append_size: u64,
    pub iosize: u64,
    /// The real filebench, when it runs instead of the built-in.
    pub real: Option<Tool>,
}

impl Filebench {
    pub fn new(a: &FilebenchArgs) -> Result<Filebench, BenchError> {
        let bad = |s: &str| Err(BenchError::Args(s.to_string()));
        if a.clients == 0 || a.clients > 64 {
            return bad("--clients must be 1 to 64");
        }
        if a.threads == 0 || a.threads > 256 {
            return bad("--threads must be 1 to 256");
        }
        let n = (a.clients * a.threads) as u64;
        if a.files < n || a.files > 10_000_000 {
            return bad("--files must be at least the number of threads, and at most 10000000");
        }
        if a.duration.is_zero() || a.duration > Duration::from_secs(24 * 3600) {
            return bad("--duration must be positive and at most a day");
        }
        let mean = a.mean_size.unwrap_or(a.personality.mean_size());
        if mean == 0 || mean > 1 << 30 || a.append_size == 0 || a.append_size > 64 << 20 {
            return bad("--mean-size must be 1 byte to 1g, --append-size 1 byte to 64m");
        }
        if a.iosize == 0 || a.iosize > 64 << 20 {
            return bad("--iosize must be 1 byte to 64m");
        }
        // The real filebench runs on one host, in one directory: one client.
        let real = match (a.engine, a.clients) {
            (Engine::Real, c) if c > 1 => {
                return bad("--engine real: the real filebench runs on one client (--clients 1)")
            }
            (Engine::Auto, c) if c > 1 => None,
            (e, _) => external::resolve(e, "filebench", false)?,
        };
        Ok(Filebench {
            personality: a.personality,
            files: a.files,
            duration: a.duration,
            clients: a.clients,
            threads: a.threads,
            mean_size: mean,
            append_size: a.append_size,
            iosize: a.iosize,
            real,
        })
    }

    fn nthreads(&self) -> usize {
        self.clients * self.threads
    }

    fn rel_path(&self, idx: u64) -> PathBuf {
        let w = self.personality.dir_width();
        if w == u64::MAX {
            PathBuf::from(format!("fileset/f{idx}"))
        } else {
            PathBuf::from(format!("fileset/d{}/f{idx}", idx / w))
        }
    }
}

/// xorshift64*: cheap, deterministic per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// A size around `mean`: uniform in [mean/2, 3*mean/2] (filebench draws from a gamma
    /// distribution with this mean).
    fn size_around(&mut self, mean: u64) -> u64 {
        (mean / 2 + self.below(mean + 1)).max(1)
    }
}

#[derive(Clone, Copy)]
struct FileState {
    exists: bool,
    seed: u64,
    size: u64,
    generation: u64,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    ops: u64,
    read_bytes: u64,
    write_bytes: u64,
    reads: u64,
    writes: u64,
}

struct Thread<'a> {
    fb: &'a Filebench,
    root: &'a Path,
    rng: Rng,
    /// (file index, state) of the files this thread owns.
    files: Vec<(u64, FileState)>,
    buf: Vec<u8>,
    scratch: Vec<u8>,
    c: Counts,
    id: usize,
}

impl<'a> Thread<'a> {
    fn path(&self, slot: usize) -> PathBuf {
        self.root.join(self.fb.rel_path(self.files[slot].0))
    }

    fn pick(&mut self, exists: bool) -> Option<usize> {
        let n = self.files.len() as u64;
        let start = self.rng.below(n);
        (0..n)
            .map(|k| ((start + k) % n) as usize)
            .find(|&s| self.files[s].1.exists == exists)
    }

    /// Appends `len` bytes of the file's pattern at its end (open, write, [fsync], close).
    fn append(&mut self, slot: usize, len: u64, fsync: bool) -> Result<(), BenchError> {
        let path = self.path(slot);
        let st = self.files[slot].1;
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| BenchError::io(format!("open {}", path.display()), e))?;
        self.write_range(&f, &path, st.seed, st.size, len)?;
        if fsync {
            f.sync_all()
                .map_err(|e| BenchError::io(format!("fsync {}", path.display()), e))?;
            self.c.ops += 1;
        }
        self.files[slot].1.size += len;
        self.c.ops += 2; // open(+append) + close
        Ok(())
    }

    fn write_range(
        &mut self,
        f: &std::fs::File,
        path: &Path,
        seed: u64,
        off: u64,
        len: u64,
    ) -> Result<(), BenchError> {
        let mut done = 0;
        while done < len {
            util::check_interrupt()?;
            let n = (len - done).min(self.fb.iosize) as usize;
            self.buf.resize(n, 0);
            pattern::fill(&mut self.buf, seed, off + done);
            util::pwrite_all(f, &self.buf, off + done, path)?;
            done += n as u64;
            self.c.ops += 1;
        }
        self.c.write_bytes += len;
        self.c.writes += 1;
        Ok(())
    }

    /// Creates file `slot` anew with a whole-file write of a fresh size.
    fn create(&mut self, slot: usize, size: u64, fsync: bool) -> Result<(), BenchError> {
        let path = self.path(slot);
        let generation = self.files[slot].1.generation + 1;
        let seed = pattern::seed_of(&[self.files[slot].0, generation]);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| BenchError::io(format!("create {}", path.display()), e))?;
        self.write_range(&f, &path, seed, 0, size)?;
        if fsync {
            f.sync_all()
                .map_err(|e| BenchError::io(format!("fsync {}", path.display()), e))?;
            self.c.ops += 1;
        }
        self.files[slot].1 = FileState {
            exists: true,
            seed,
            size,
            generation,
        };
        self.c.ops += 2; // create + close
        Ok(())
    }

    /// Opens, reads the whole file (verified), closes.
    fn read_whole(&mut self, slot: usize) -> Result<(), BenchError> {
        let path = self.path(slot);
        let st = self.files[slot].1;
        let f = std::fs::File::open(&path)
            .map_err(|e| BenchError::io(format!("open {}", path.display()), e))?;
        let mut off = 0;
        while off < st.size {
            util::check_interrupt()?;
            let n = (st.size - off).min(self.fb.iosize) as usize;
            self.buf.resize(n, 0);
            util::pread_exact(&f, &mut self.buf, off, &path)?;
            pattern::verify(&self.buf, st.seed, off, &mut self.scratch, &path)?;
            off += n as u64;
            self.c.ops += 1;
        }
        util::expect_eof(&f, st.size, &path)?;
        self.c.read_bytes += st.size;
        self.c.reads += 1;
        self.c.ops += 2; // open + close
        Ok(())
    }

    fn delete(&mut self, slot: usize) -> Result<(), BenchError> {
        let path = self.path(slot);
        std::fs::remove_file(&path)
            .map_err(|e| BenchError::io(format!("delete {}", path.display()), e))?;
        self.files[slot].1.exists = false;
        self.c.ops += 1;
        Ok(())
    }

    fn stat(&mut self, slot: usize) -> Result<(), BenchError> {
        let path = self.path(slot);
        let m = std::fs::metadata(&path)
            .map_err(|e| BenchError::io(format!("stat {}", path.display()), e))?;
        if m.len() != self.files[slot].1.size {
            return Err(BenchError::Verify {
                path,
                offset: m.len(),
                detail: format!("size {}, expected {}", m.len(), self.files[slot].1.size),
            });
        }
        self.c.ops += 1;
        Ok(())
    }

    /// One pass of the personality's flow.
    fn flow(&mut self, log: &Path) -> Result<(), BenchError> {
        let fb = self.fb;
        match fb.personality {
            Personality::Fileserver => {
                // createfile, writewholefile, closefile
                if let Some(s) = self.pick(false) {
                    let size = self.rng.size_around(fb.mean_size);
                    self.create(s, size, false)?;
                }
                // openfile, appendfilerand, closefile
                if let Some(s) = self.pick(true) {
                    let len = self.rng.size_around(fb.append_size);
                    self.append(s, len, false)?;
                }
                // openfile, readwholefile, closefile
                if let Some(s) = self.pick(true) {
                    self.read_whole(s)?;
                }
                // deletefile
                if let Some(s) = self.pick(true) {
                    self.delete(s)?;
                }
                // statfile
                if let Some(s) = self.pick(true) {
                    self.stat(s)?;
                }
            }
            Personality::Webserver => {
                for _ in 0..10 {
                    if let Some(s) = self.pick(true) {
                        self.read_whole(s)?;
                    }
                }
                // appendfilerand to the log
                let len = self.rng.size_around(fb.append_size);
                let f = OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(log)
                    .map_err(|e| BenchError::io(format!("open {}", log.display()), e))?;
                self.buf.resize(len as usize, 0);
                pattern::fill(&mut self.buf, self.id as u64, 0);
                std::io::Write::write_all(&mut &f, &self.buf)
                    .map_err(|e| BenchError::io(format!("append {}", log.display()), e))?;
                self.c.write_bytes += len;
                self.c.writes += 1;
                self.c.ops += 3;
            }
            Personality::Varmail => {
                // deletefile
                if let Some(s) = self.pick(true) {
                    self.delete(s)?;
                }
                // createfile, appendfilerand, fsyncfile, closefile
                if let Some(s) = self.pick(false) {
                    let len = self.rng.size_around(fb.append_size);
                    self.create(s, len, true)?;
                }
                // openfile, readwholefile, appendfilerand, fsyncfile, closefile
                if let Some(s) = self.pick(true) {
                    self.read_whole(s)?;
                    let len = self.rng.size_around(fb.append_size);
                    self.append(s, len, true)?;
                }
                // openfile, readwholefile, closefile
                if let Some(s) = self.pick(true) {
                    self.read_whole(s)?;
                }
            }
        }
        Ok(())
    }
}

impl Filebench {
    /// The installed personality with this configuration's fileset, threads, sizes and run time.
    pub fn real_script(
        &self,
        personality: &str,
        dir: &std::path::Path,
    ) -> Result<String, BenchError> {
        external::filebench_script(
            personality,
            &[
                ("dir", dir.to_string_lossy().into_owned()),
                ("nfiles", self.files.to_string()),
                (
                    "filesize",
                    format!(
                        "cvar(type=cvar-gamma,parameters=mean:{};gamma:1.5)",
                        self.mean_size
                    ),
                ),
                ("nthreads", self.threads.to_string()),
                ("iosize", self.iosize.to_string()),
                ("meanappendsize", self.append_size.to_string()),
            ],
            self.duration.as_secs().max(1),
        )
    }

    fn run_real(&self, tool: &Tool, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        let f = external::filebench_personality(tool, self.personality.name())?;
        let text = std::fs::read_to_string(&f)
            .map_err(|e| BenchError::io(format!("read {}", f.display()), e))?;
        let dir = ctx.roots[0].join("filebench");
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::io(format!("create {}", dir.display()), e))?;
        let script = ctx.scratch.join(format!("{}.f", self.personality.name()));
        std::fs::write(&script, self.real_script(&text, &dir)?)
            .map_err(|e| BenchError::io(format!("write {}", script.display()), e))?;
        ctx.progress
            .phase(&format!("{} (real filebench)", self.personality.name()), 1);
        let mut cmd = std::process::Command::new(&tool.path);
        cmd.arg("-f").arg(&script);
        // filebench's processes share memory mapped at one address: without address-space
        // randomisation, as filebench asks (it hangs at "Starting ... instances" otherwise).
        // SAFETY: personality(2) is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
                Ok(())
            });
        }
        let out = external::run_logged(
            &mut cmd,
            "filebench",
            &ctx.scratch.join(format!("{}.log", self.personality.name())),
            &["error"],
        )?;
        ctx.progress.inc(1);
        let s = external::filebench_summary(&out)?;
        let t = self.personality.name();
        Ok(vec![
            Measurement::new(t, "ops", Unit::OpsPerSec, s.ops_per_sec),
            Measurement::new(t, "bw", Unit::MibPerSec, s.mib_per_sec),
            Measurement::new(t, "reads", Unit::OpsPerSec, s.reads_per_sec),
            Measurement::new(t, "writes", Unit::OpsPerSec, s.writes_per_sec),
        ])
    }
}

impl Workload for Filebench {
    fn workload(&self) -> &'static str {
        "filebench"
    }

    fn name(&self) -> String {
        format!("filebench-{}", self.personality.name())
    }

    fn label(&self) -> String {
        format!(
            "filebench {}: {} files of {} mean, {} client(s) x {} thread(s), {}{}",
            self.personality.name(),
            self.files,
            fmt_size(self.mean_size),
            self.clients,
            self.threads,
            humantime::format_duration(self.duration),
            match &self.real {
                Some(t) => format!("; {}, data not verified", t.describe()),
                None => String::new(),
            },
        )
    }

    fn equivalent(&self) -> String {
        format!(
            "filebench -f {}.f (set $nfiles={} $meanfilesize={} $nthreads={} $iosize={} $meanappendsize={}; run {})",
            self.personality.name(),
            self.files,
            self.mean_size,
            self.nthreads(),
            self.iosize,
            self.append_size,
            self.duration.as_secs()
        )
    }

    fn config(&self) -> serde_json::Value {
        json!({
            "personality": self.personality.name(), "files": self.files,
            "duration_s": self.duration.as_secs_f64(), "clients": self.clients,
            "threads_per_client": self.threads, "mean_size": self.mean_size,
            "append_size": self.append_size, "iosize": self.iosize,
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
        let n = self.nthreads();
        // The fileset, created through client 0 (not timed).
        ctx.progress.phase("creating fileset", self.files);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut states = Vec::with_capacity(self.files as usize);
        let mut buf = Vec::new();
        for idx in 0..self.files {
            util::check_interrupt()?;
            let path = ctx.roots[0].join(self.rel_path(idx));
            if let Some(p) = path.parent() {
                if idx == 0
                    || self.personality.dir_width() != u64::MAX
                        && idx % self.personality.dir_width() == 0
                {
                    std::fs::create_dir_all(p)
                        .map_err(|e| BenchError::io(format!("create {}", p.display()), e))?;
                }
            }
            let exists = idx * 100 / self.files < self.personality.prealloc_percent();
            let size = rng.size_around(self.mean_size);
            let seed = pattern::seed_of(&[idx, 0]);
            if exists {
                buf.resize(size as usize, 0);
                pattern::fill(&mut buf, seed, 0);
                std::fs::write(&path, &buf)
                    .map_err(|e| BenchError::io(format!("create {}", path.display()), e))?;
            }
            states.push(FileState {
                exists,
                seed,
                size: if exists { size } else { 0 },
                generation: 0,
            });
            ctx.progress.inc(1);
        }
        if ctx.drop_caches {
            util::drop_caches();
        }
        ctx.progress.phase(
            &format!("{} flows", self.personality.name()),
            self.duration.as_millis() as u64,
        );
        let deadline_len = self.duration;
        let states = &states;
        let results = run_tasks(n, |t| {
            let client = t / self.threads;
            let root = &ctx.roots[client];
            let files: Vec<(u64, FileState)> = (t as u64..self.files)
                .step_by(n)
                .map(|i| (i, states[i as usize]))
                .collect();
            let mut th = Thread {
                fb: self,
                root,
                rng: Rng(pattern::seed_of(&[t as u64, 77]) | 1),
                files,
                buf: Vec::new(),
                scratch: Vec::new(),
                c: Counts::default(),
                id: t,
            };
            let log = root.join(format!("log.c{client}"));
            let start = Instant::now();
            let mut last = 0u64;
            while start.elapsed() < deadline_len {
                th.flow(&log)?;
                if t == 0 {
                    let now = start.elapsed().as_millis() as u64;
                    ctx.progress.inc(now.saturating_sub(last));
                    last = now;
                }
            }
            Ok((th.c, start.elapsed()))
        })?;
        let secs = results
            .iter()
            .map(|r| r.1.as_secs_f64())
            .fold(0.0, f64::max)
            .max(1e-9);
        let mut total = Counts::default();
        for (c, _) in &results {
            total.ops += c.ops;
            total.read_bytes += c.read_bytes;
            total.write_bytes += c.write_bytes;
            total.reads += c.reads;
            total.writes += c.writes;
        }
        if total.ops == 0 {
            return Err(BenchError::Setup("no operation completed".into()));
        }
        let t = self.personality.name();
        Ok(vec![
            Measurement::new(t, "ops", Unit::OpsPerSec, total.ops as f64 / secs),
            Measurement::new(
                t,
                "bw",
                Unit::MibPerSec,
                (total.read_bytes + total.write_bytes) as f64 / MIB / secs,
            ),
            Measurement::new(t, "reads", Unit::OpsPerSec, total.reads as f64 / secs),
            Measurement::new(t, "writes", Unit::OpsPerSec, total.writes as f64 / secs),
        ])
    }
}
