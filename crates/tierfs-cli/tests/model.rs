//! A proptest state machine in the manner of Mountpoint for Amazon S3's reference-model tests:
//! random sequences of file and namespace operations, each issued on one of TWO clients (two
//! real FUSE mounts of one filesystem), are compared step by step with a small in-memory model
//! of the documented semantics (docs/semantics.md):
//!
//! - namespace operations are visible to the other client at once (both mounts run with
//!   attribute and entry TTL 0, so the kernel asks every time);
//! - close-to-open: a file a client closed reads, on the other client's next open, as written;
//! - a client reads its own writes at once, open handles or not, and its `stat` shows the size
//!   including them.
//!
//! The driver keeps at most one open handle per (client, file) across steps. Before a client
//! touches a file, the other client's handle on it is closed (the close-to-open hand-over the
//! contract is about; what a client sees of another's writes while both keep the file open is
//! left unspecified by the contract, so the model does not test it). Namespace operations close
//! the handles on the names they change.
//!
//! Mounts are set up once per test; every case runs in a fresh directory. Failures are
//! shrunk and the seed stored in `proptest-regressions/model.txt` (committed), replayed first.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::Duration;

/// Names a case works with: files at the top and in two directories.
const FILES: &[&str] = &["a", "b", "d/a", "d/b", "e/a"];
const DIRS: &[&str] = &["d", "e"];
/// Files stay within this size (several 1 MiB chunks with the format below).
const MAX_OFF: u64 = 3 << 20;

#[derive(Clone, Debug)]
enum Op {
    /// open(O_CREAT|O_TRUNC) then close.
    Create {
        c: usize,
        f: usize,
    },
    /// pwrite on this client's handle (opened O_RDWR|O_CREAT if there is none).
    Write {
        c: usize,
        f: usize,
        off: u64,
        len: usize,
        seed: u64,
    },
    /// 20 small writes at scattered offsets of one chunk, through the handle: at the commit a
    /// chunk of more than 16 slices, which the writer's compaction rewrites in the background
    /// (while later steps, on either client, read it).
    Scribble {
        c: usize,
        f: usize,
        chunk: u64,
        seed: u64,
    },
    /// pread on the handle, or open/pread/close.
    Read {
        c: usize,
        f: usize,
        off: u64,
        len: usize,
    },
    /// ftruncate on the handle, or truncate(2) of the path.
    Truncate {
        c: usize,
        f: usize,
        size: u64,
    },
    Fsync {
        c: usize,
        f: usize,
    },
    Close {
        c: usize,
        f: usize,
    },
    /// Close, then open again (and keep the handle).
    Reopen {
        c: usize,
        f: usize,
    },
    Stat {
        c: usize,
        f: usize,
    },
    Unlink {
        c: usize,
        f: usize,
    },
    RenameFile {
        c: usize,
        from: usize,
        to: usize,
    },
    Mkdir {
        c: usize,
        d: usize,
    },
    Rmdir {
        c: usize,
        d: usize,
    },
    RenameDir {
        c: usize,
        from: usize,
        to: usize,
    },
    Readdir {
        c: usize,
        d: Option<usize>,
    },
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..8192u64,
        (0..MAX_OFF),
        // around chunk boundaries (1 MiB stripes)
        (1..3u64, 0..8192u64).prop_map(|(k, d)| (k << 20) - 4096 + d),
    ]
}

fn length() -> impl Strategy<Value = usize> {
    prop_oneof![1..4096usize, 1..(300 << 10) as usize]
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..2usize;
    // top-level files more often: names in directories exist only while their directory does
    let f = prop_oneof![3 => 0..2usize, 1 => 2..FILES.len()];
    let d = 0..DIRS.len();
    prop_oneof![
        4 => (c.clone(), f.clone()).prop_map(|(c, f)| Op::Create { c, f }),
        8 => (c.clone(), f.clone(), offset(), length(), any::<u64>())
            .prop_map(|(c, f, off, len, seed)| Op::Write { c, f, off, len, seed }),
        2 => (c.clone(), f.clone(), 0..3u64, any::<u64>())
            .prop_map(|(c, f, chunk, seed)| Op::Scribble { c, f, chunk, seed }),
        8 => (c.clone(), f.clone(), offset(), length())
            .prop_map(|(c, f, off, len)| Op::Read { c, f, off, len }),
        3 => (c.clone(), f.clone(), prop_oneof![0..8192u64, 0..MAX_OFF])
            .prop_map(|(c, f, size)| Op::Truncate { c, f, size }),
        2 => (c.clone(), f.clone()).prop_map(|(c, f)| Op::Fsync { c, f }),
        3 => (c.clone(), f.clone()).prop_map(|(c, f)| Op::Close { c, f }),
        2 => (c.clone(), f.clone()).prop_map(|(c, f)| Op::Reopen { c, f }),
        3 => (c.clone(), f.clone()).prop_map(|(c, f)| Op::Stat { c, f }),
        2 => (c.clone(), f.clone()).prop_map(|(c, f)| Op::Unlink { c, f }),
        2 => (c.clone(), f.clone(), f.clone())
            .prop_map(|(c, from, to)| Op::RenameFile { c, from, to }),
        4 => (c.clone(), d.clone()).prop_map(|(c, d)| Op::Mkdir { c, d }),
        1 => (c.clone(), d.clone()).prop_map(|(c, d)| Op::Rmdir { c, d }),
        1 => (c.clone(), d.clone(), d.clone())
            .prop_map(|(c, from, to)| Op::RenameDir { c, from, to }),
        2 => (c, prop::option::of(d)).prop_map(|(c, d)| Op::Readdir { c, d }),
    ]
}

/// The reference: what each name holds.
#[derive(Clone, Debug, Default)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
}

fn parent(p: &str) -> Option<&str> {
    p.rsplit_once('/').map(|(d, _)| d)
}

impl Model {
    fn parent_ok(&self, p: &str) -> Result<(), i32> {
        match parent(p) {
            None => Ok(()),
            Some(d) if self.dirs.contains(d) => Ok(()),
            Some(d) if self.files.contains_key(d) => Err(libc::ENOTDIR),
            Some(_) => Err(libc::ENOENT),
        }
    }

    /// The file must exist (ENOENT/ENOTDIR from its parent otherwise).
    fn file(&self, p: &str) -> Result<&Vec<u8>, i32> {
        self.parent_ok(p)?;
        self.files.get(p).ok_or(libc::ENOENT)
    }

    fn children(&self, d: &str) -> BTreeSet<String> {
        let pre = if d.is_empty() {
            String::new()
        } else {
            format!("{d}/")
        };
        self.files
            .keys()
            .chain(self.dirs.iter())
            .filter_map(|k| k.strip_prefix(&pre))
            .filter(|rest| !rest.contains('/') && !rest.is_empty())
            .map(str::to_string)
            .collect()
    }
}

fn write_into(v: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if v.len() < end {
        v.resize(end, 0);
    }
    v[off as usize..end].copy_from_slice(data);
}

/// Per-test state: the mounts, the handles, the case counter.
struct Driver {
    t: TestFs,
    case: usize,
    handles: HashMap<(usize, String), fs::File>,
    /// Steps run, and those the model expected to fail (printed at the end: a model that
    /// only ever sees ENOENT would test little).
    steps: usize,
    failing_steps: usize,
}

fn errno_of(r: &io::Error) -> i32 {
    r.raw_os_error().unwrap_or(-1)
}

impl Driver {
    fn path(&self, c: usize, rel: &str) -> PathBuf {
        self.t.p(c, &format!("case{}/{rel}", self.case))
    }

    /// Closes the handles of client `c` (or of both clients: `None`) on `rel` and what lies
    /// under it.
    fn close(&mut self, c: Option<usize>, rel: &str) {
        let pre = format!("{rel}/");
        self.handles.retain(|(hc, p), _| {
            !(c.is_none_or(|c| c == *hc) && (p == rel || p.starts_with(&pre)))
        });
    }

    fn handle(&mut self, c: usize, rel: &str, create: bool) -> io::Result<&fs::File> {
        // close-to-open hand-over: the other client closes first
        self.close(Some(1 - c), rel);
        let key = (c, rel.to_string());
        if !self.handles.contains_key(&key) {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .mode(0o644)
                .open(self.path(c, rel))?;
            self.handles.insert(key.clone(), f);
        }
        Ok(&self.handles[&key])
    }

    /// Runs one step on the mounts and on the model; an error names what differed.
    fn step(&mut self, m: &mut Model, op: &Op) -> Result<(), String> {
        let mut failing = 0;
        let r = self.step_inner(m, op, &mut failing);
        self.failing_steps += failing;
        r
    }

    fn step_inner(&mut self, m: &mut Model, op: &Op, failed: &mut usize) -> Result<(), String> {
        let failing = std::cell::Cell::new(0);
        let cmp_err = |what: &str, got: io::Result<()>, want: Result<(), i32>| match (got, want) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(e), Err(w)) if errno_of(&e) == w => {
                failing.set(1);
                Ok(())
            }
            (g, w) => Err(format!(
                "{what}: got {:?}, model says {:?}",
                g.map_err(|e| errname(errno_of(&e))),
                w.map_err(errname)
            )),
        };
        let r = match op {
            Op::Create { c, f } => {
                let rel = FILES[*f];
                self.close(None, rel);
                let got = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o644)
                    .open(self.path(*c, rel))
                    .map(drop);
                let want = m.parent_ok(rel).and_then(|_| {
                    if m.dirs.contains(rel) {
                        Err(libc::EISDIR)
                    } else {
                        Ok(())
                    }
                });
                if want.is_ok() {
                    m.files.insert(rel.to_string(), Vec::new());
                }
                cmp_err("create", got, want)
            }
            Op::Write {
                c,
                f,
                off,
                len,
                seed,
            } => {
                let rel = FILES[*f];
                let data = pattern(*seed, *off, *len);
                let got = self
                    .handle(*c, rel, true)
                    .and_then(|h| h.write_all_at(&data, *off));
                let want = m.parent_ok(rel);
                if want.is_ok() {
                    write_into(m.files.entry(rel.to_string()).or_default(), *off, &data);
                }
                cmp_err("write", got, want)
            }
            Op::Scribble { c, f, chunk, seed } => {
                let rel = FILES[*f];
                let want = m.parent_ok(rel);
                let mut got = self.handle(*c, rel, true).map(drop);
                for i in 0..20u64 {
                    let r = splitmix64(seed ^ i);
                    let off = (chunk << 20) + (r % ((1 << 20) - 2000));
                    let len = 1 + (r >> 40) as usize % 2000;
                    let data = pattern(seed ^ i, off, len);
                    if got.is_ok() {
                        got = self.handles[&(*c, rel.to_string())].write_all_at(&data, off);
                    }
                    if want.is_ok() {
                        write_into(m.files.entry(rel.to_string()).or_default(), off, &data);
                    }
                }
                cmp_err("scribble", got, want)
            }
            Op::Read { c, f, off, len } => {
                let rel = FILES[*f];
                let key = (*c, rel.to_string());
                self.close(Some(1 - c), rel);
                let mut buf = vec![0u8; *len];
                let read = |h: &fs::File, buf: &mut [u8]| -> io::Result<usize> {
                    let mut done = 0;
                    while done < buf.len() {
                        match h.read_at(&mut buf[done..], off + done as u64)? {
                            0 => break,
                            n => done += n,
                        }
                    }
                    Ok(done)
                };
                let got = match self.handles.get(&key) {
                    Some(h) => read(h, &mut buf),
                    None => fs::File::open(self.path(*c, rel)).and_then(|h| read(&h, &mut buf)),
                };
                let want = m.file(rel).map(|v| {
                    let s = (*off as usize).min(v.len());
                    let e = (*off as usize + len).min(v.len());
                    v[s..e].to_vec()
                });
                match (got, want) {
                    (Ok(n), Ok(w)) => {
                        if buf[..n] != w[..] {
                            let first = buf[..n.min(w.len())]
                                .iter()
                                .zip(&w)
                                .position(|(a, b)| a != b);
                            return Err(format!(
                                "read {len} at {off}: got {n} bytes, model {} (first difference \
                                 at +{first:?})",
                                w.len()
                            ));
                        }
                        Ok(())
                    }
                    (g, w) => cmp_err("read", g.map(drop), w.map(drop)),
                }
            }
            Op::Truncate { c, f, size } => {
                let rel = FILES[*f];
                self.close(Some(1 - c), rel);
                let key = (*c, rel.to_string());
                let got = match self.handles.get(&key) {
                    Some(h) => h.set_len(*size),
                    None => fs::OpenOptions::new()
                        .write(true)
                        .open(self.path(*c, rel))
                        .and_then(|h| h.set_len(*size)),
                };
                let want = m.file(rel).map(drop);
                if want.is_ok() {
                    m.files.get_mut(rel).unwrap().resize(*size as usize, 0);
                }
                cmp_err("truncate", got, want)
            }
            Op::Fsync { c, f } => {
                let key = (*c, FILES[*f].to_string());
                if let Some(h) = self.handles.get(&key) {
                    h.sync_all().map_err(|e| format!("fsync: {e}"))?;
                }
                Ok(())
            }
            Op::Close { c, f } => {
                self.close(Some(*c), FILES[*f]);
                Ok(())
            }
            Op::Reopen { c, f } => {
                let rel = FILES[*f];
                self.close(Some(*c), rel);
                let got = self.handle(*c, rel, false).map(drop);
                cmp_err("reopen", got, m.file(rel).map(drop))
            }
            Op::Stat { c, f } => {
                let rel = FILES[*f];
                // the other client's buffered writes are not part of the contract
                self.close(Some(1 - c), rel);
                let got = fs::metadata(self.path(*c, rel));
                let want = m.file(rel).map(|v| v.len() as u64);
                match (got, want) {
                    (Ok(md), Ok(w)) if md.is_file() && md.len() == w => Ok(()),
                    (Ok(md), Ok(w)) => Err(format!(
                        "stat: size {} (file: {}), model {w}",
                        md.len(),
                        md.is_file()
                    )),
                    (g, w) => cmp_err("stat", g.map(drop), w.map(drop)),
                }
            }
            Op::Unlink { c, f } => {
                let rel = FILES[*f];
                self.close(None, rel);
                let got = fs::remove_file(self.path(*c, rel));
                let want = m.file(rel).map(drop).map_err(|e| {
                    if e == libc::ENOENT && m.dirs.contains(rel) {
                        libc::EISDIR
                    } else {
                        e
                    }
                });
                if want.is_ok() {
                    m.files.remove(rel);
                }
                cmp_err("unlink", got, want)
            }
            Op::RenameFile { c, from, to } => {
                let (src, dst) = (FILES[*from], FILES[*to]);
                self.close(None, src);
                self.close(None, dst);
                let got = fs::rename(self.path(*c, src), self.path(*c, dst));
                let want = m
                    .file(src)
                    .map(drop)
                    .and_then(|_| m.parent_ok(dst))
                    .and_then(|_| {
                        if m.dirs.contains(dst) {
                            Err(libc::EISDIR)
                        } else {
                            Ok(())
                        }
                    });
                if want.is_ok() && src != dst {
                    let v = m.files.remove(src).unwrap();
                    m.files.insert(dst.to_string(), v);
                }
                cmp_err("rename", got, want)
            }
            Op::Mkdir { c, d } => {
                let rel = DIRS[*d];
                let got = fs::create_dir(self.path(*c, rel));
                let want = if m.dirs.contains(rel) || m.files.contains_key(rel) {
                    Err(libc::EEXIST)
                } else {
                    Ok(())
                };
                if want.is_ok() {
                    m.dirs.insert(rel.to_string());
                }
                cmp_err("mkdir", got, want)
            }
            Op::Rmdir { c, d } => {
                let rel = DIRS[*d];
                let got = fs::remove_dir(self.path(*c, rel));
                let want = if !m.dirs.contains(rel) {
                    Err(libc::ENOENT)
                } else if !m.children(rel).is_empty() {
                    Err(libc::ENOTEMPTY)
                } else {
                    Ok(())
                };
                if want.is_ok() {
                    m.dirs.remove(rel);
                }
                cmp_err("rmdir", got, want)
            }
            Op::RenameDir { c, from, to } => {
                let (src, dst) = (DIRS[*from], DIRS[*to]);
                self.close(None, src);
                self.close(None, dst);
                let got = fs::rename(self.path(*c, src), self.path(*c, dst));
                let want = if !m.dirs.contains(src) {
                    Err(libc::ENOENT)
                } else if src == dst {
                    Ok(())
                } else if m.dirs.contains(dst) && !m.children(dst).is_empty() {
                    Err(libc::ENOTEMPTY)
                } else {
                    Ok(())
                };
                if want.is_ok() && src != dst {
                    m.dirs.remove(dst);
                    m.dirs.remove(src);
                    m.dirs.insert(dst.to_string());
                    let moved: Vec<String> = m
                        .files
                        .keys()
                        .filter(|k| parent(k) == Some(src))
                        .cloned()
                        .collect();
                    for k in moved {
                        let v = m.files.remove(&k).unwrap();
                        let name = k.rsplit_once('/').unwrap().1;
                        m.files.insert(format!("{dst}/{name}"), v);
                    }
                }
                cmp_err("rename dir", got, want)
            }
            Op::Readdir { c, d } => {
                let rel = d.map(|d| DIRS[d]).unwrap_or("");
                let p = if rel.is_empty() {
                    self.t.p(*c, &format!("case{}", self.case))
                } else {
                    self.path(*c, rel)
                };
                let got = fs::read_dir(p).and_then(|rd| {
                    rd.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                        .collect::<io::Result<BTreeSet<String>>>()
                });
                let want = if rel.is_empty() || m.dirs.contains(rel) {
                    Ok(m.children(rel))
                } else {
                    Err(libc::ENOENT)
                };
                match (got, want) {
                    (Ok(g), Ok(w)) if g == w => Ok(()),
                    (Ok(g), Ok(w)) => Err(format!("readdir {rel:?}: {g:?}, model {w:?}")),
                    (g, w) => cmp_err("readdir", g.map(drop), w.map(drop)),
                }
            }
        };
        *failed = failing.get();
        r
    }

    /// Runs a case in a fresh directory; every file is checked from both clients at the end.
    fn run(&mut self, ops: &[Op]) -> Result<(), String> {
        self.handles.clear();
        self.case += 1;
        fs::create_dir(self.t.p(0, &format!("case{}", self.case)))
            .map_err(|e| format!("case directory: {e}"))?;
        let mut m = Model::default();
        for (i, op) in ops.iter().enumerate() {
            self.steps += 1;
            self.step(&mut m, op)
                .map_err(|e| format!("step {i} {op:?}: {e}"))?;
        }
        self.handles.clear();
        for c in 0..2 {
            for (rel, want) in &m.files {
                let got = fs::read(self.path(c, rel))
                    .map_err(|e| format!("final read of {rel} on client {c}: {e}"))?;
                if &got != want {
                    return Err(format!(
                        "final read of {rel} on client {c}: {} bytes, model {}",
                        got.len(),
                        want.len()
                    ));
                }
            }
        }
        Ok(())
    }
}

#[test]
fn two_clients_follow_the_model() {
    let cases: u32 = std::env::var("TIERFS_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut t = TestFs::with(Opts {
        clients: 0,
        // several chunks per file, so writes and reads cross chunk boundaries
        stripe_size: Some("1M".into()),
        timeout: Duration::from_secs(900),
        ..Opts::default()
    });
    for name in ["c0", "c1"] {
        t.mount_with(&ClientOpts {
            name: name.into(),
            config: Some("attr_ttl = 0.0\nentry_ttl = 0.0\n".into()),
            ..Default::default()
        });
    }
    let driver = RefCell::new(Driver {
        t,
        case: 0,
        handles: HashMap::new(),
        steps: 0,
        failing_steps: 0,
    });
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: 400,
        // milliseconds
        max_shrink_time: 240_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/model.txt",
        ))),
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..60), |ops| {
        driver.borrow_mut().run(&ops).map_err(TestCaseError::fail)
    });
    let d = driver.borrow();
    eprintln!(
        "{} cases, {} steps, {} of them failing as the model expected",
        d.case, d.steps, d.failing_steps
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
