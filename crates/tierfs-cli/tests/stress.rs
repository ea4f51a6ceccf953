//! Random namespace stress, checked against a reference directory on the local filesystem.
//!
//! Several processes (forked; `TIERFS_STRESS_PROCS`, default 4) each run a seeded random
//! sequence of create, mkdir, rename (files and directories, over existing names too), link,
//! unlink, rmdir, truncate, write and fsync, every operation once on the tierfs mount and once on
//! the reference directory, and compare the outcomes (the value, or the errno). To make the
//! comparison meaningful under concurrency, the run goes in rounds:
//!
//! - a private phase: all processes at once, each in its own subtree (`p<i>`), so what one does
//!   cannot change another's outcomes, while the mount sees truly concurrent operations;
//! - a shared phase: the processes take turns (0, 1, ...), each doing one operation in the
//!   shared subtree (`shared`) or between it and its own subtree.
//!
//! At the end the two trees are compared: names, types, permission bits, sizes, link counts and
//! content checksums. The seed is printed (`TIERFS_STRESS_SEED` replays a run; `_ROUNDS` sets
//! the length); the closing line is `stress: N passed, M failed` (operations whose outcome
//! matched, then mismatched operations plus differing tree entries).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const MAX_DEPTH: usize = 3;
const MAX_FILE: u64 = 256 * 1024;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create(String, u64, u64),
    Write(String, u64, u64, u64),
    Truncate(String, u64),
    Mkdir(String),
    Rename(String, String),
    Link(String, String),
    Unlink(String),
    Rmdir(String),
    Fsync(String),
}

fn c(base: &Path, rel: &str) -> CString {
    CString::new(base.join(rel).as_os_str().as_bytes()).unwrap()
}

fn res(r: libc::c_int) -> Result<u64, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

/// Runs `op` under `base`; the outcome is a value or an errno.
fn apply(base: &Path, op: &Op) -> Result<u64, i32> {
    unsafe {
        match op {
            Op::Create(p, len, seed) => {
                let fd = libc::open(
                    c(base, p).as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return Err(errno());
                }
                let data = pattern(*seed, 0, *len as usize);
                let n = libc::write(fd, data.as_ptr().cast(), data.len());
                let e = errno();
                let closed = libc::close(fd);
                if n < 0 {
                    return Err(e);
                }
                res(closed).map(|_| n as u64)
            }
            Op::Write(p, off, len, seed) => {
                let fd = libc::open(c(base, p).as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(errno());
                }
                let data = pattern(*seed, *off, *len as usize);
                let n = libc::pwrite(fd, data.as_ptr().cast(), data.len(), *off as i64);
                let e = errno();
                let closed = libc::close(fd);
                if n < 0 {
                    return Err(e);
                }
                res(closed).map(|_| n as u64)
            }
            Op::Truncate(p, size) => res(libc::truncate(c(base, p).as_ptr(), *size as i64)),
            Op::Mkdir(p) => res(libc::mkdir(c(base, p).as_ptr(), 0o755)),
            Op::Rename(a, b) => res(libc::rename(c(base, a).as_ptr(), c(base, b).as_ptr())),
            Op::Link(a, b) => res(libc::link(c(base, a).as_ptr(), c(base, b).as_ptr())),
            Op::Unlink(p) => res(libc::unlink(c(base, p).as_ptr())),
            Op::Rmdir(p) => res(libc::rmdir(c(base, p).as_ptr())),
            Op::Fsync(p) => {
                let fd = libc::open(c(base, p).as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(errno());
                }
                let r = libc::fsync(fd);
                let e = errno();
                libc::close(fd);
                if r < 0 {
                    Err(e)
                } else {
                    Ok(0)
                }
            }
        }
    }
}

/// Directories under `base/scope` (relative to `base`, sorted), at most MAX_DEPTH deep.
fn dirs(base: &Path, scope: &str) -> Vec<String> {
    let mut out = vec![scope.to_string()];
    let mut i = 0;
    while i < out.len() {
        let d = out[i].clone();
        i += 1;
        if d.matches('/').count() >= MAX_DEPTH {
            continue;
        }
        let mut names: Vec<String> = match fs::read_dir(base.join(&d)) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => vec![],
        };
        names.sort();
        out.extend(names.into_iter().map(|n| format!("{d}/{n}")));
    }
    out
}

/// Regular files under the directories `ds` of `base` (relative, sorted).
fn files(base: &Path, ds: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for d in ds {
        let Ok(rd) = fs::read_dir(base.join(d)) else {
            continue;
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
            .map(|e| format!("{d}/{}", e.file_name().to_string_lossy()))
            .collect();
        names.sort();
        out.extend(names);
    }
    out
}

/// A random operation in `scopes` (paths chosen from the reference tree, so both sides get
/// the same one). Most operations on an existing file or directory pick one that exists (so
/// most succeed); the rest pick any name, which may exist or not, and of any type.
fn gen(rng: &mut Rng, reference: &Path, scopes: &[&str]) -> Op {
    let scope = *rng.pick(scopes);
    let ds = dirs(reference, scope);
    let fs_ = files(reference, &ds);
    let any = |rng: &mut Rng| {
        let d = rng.pick(&ds).clone();
        format!("{d}/{}", rng.pick(&NAMES))
    };
    let file = |rng: &mut Rng| {
        if fs_.is_empty() || rng.below(10) < 2 {
            any(rng)
        } else {
            rng.pick(&fs_).clone()
        }
    };
    let dir = |rng: &mut Rng| {
        // the scope's root itself is never removed or moved
        if ds.len() < 2 || rng.below(10) < 3 {
            any(rng)
        } else {
            ds[1 + rng.below(ds.len() as u64 - 1) as usize].clone()
        }
    };
    // renames and links may cross between the scopes of this step
    let other = |rng: &mut Rng| {
        let s2 = *rng.pick(scopes);
        let ds2 = dirs(reference, s2);
        format!("{}/{}", rng.pick(&ds2), rng.pick(&NAMES))
    };
    match rng.below(100) {
        0..=14 => Op::Create(any(rng), rng.below(MAX_FILE), rng.next()),
        15..=29 => {
            let off = rng.below(MAX_FILE);
            Op::Write(file(rng), off, 1 + rng.below(64 * 1024), rng.next())
        }
        30..=39 => Op::Truncate(file(rng), rng.below(MAX_FILE)),
        40..=49 => Op::Mkdir(any(rng)),
        50..=58 => {
            let a = file(rng);
            Op::Rename(a, other(rng))
        }
        59..=64 => {
            let a = dir(rng);
            Op::Rename(a, other(rng))
        }
        65..=72 => {
            let a = file(rng);
            Op::Link(a, other(rng))
        }
        73..=84 => Op::Unlink(file(rng)),
        85..=92 => Op::Rmdir(dir(rng)),
        _ => Op::Fsync(file(rng)),
    }
}

/// One entry of a tree: type, permission bits, size, link count, content checksum.
#[derive(Debug, PartialEq, Eq)]
struct Node {
    kind: &'static str,
    perm: u32,
    size: u64,
    nlink: u64,
    sum: u64,
}

fn checksum(p: &Path) -> u64 {
    let mut f = fs::File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return h;
        }
        for b in &buf[..n] {
            h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let m = fs::symlink_metadata(root.join(&r)).unwrap();
            let t = m.file_type();
            let kind = if t.is_dir() {
                stack.push(r.clone());
                "dir"
            } else if t.is_file() {
                "file"
            } else if t.is_symlink() {
                "symlink"
            } else if t.is_fifo() {
                "fifo"
            } else {
                "other"
            };
            let node = Node {
                kind,
                perm: m.mode() & 0o7777,
                size: if kind == "dir" { 0 } else { m.len() },
                nlink: m.nlink(),
                sum: if kind == "file" {
                    checksum(&root.join(&r))
                } else {
                    0
                },
            };
            out.insert(r.to_string_lossy().into_owned(), node);
        }
    }
    out
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

/// Child `i`: reads commands from `cmd` ('P' private batch, 'S' one shared op, 'Q' quit),
/// answers each on `done`, and logs every op and mismatch to `log`.
fn child(i: usize, seed: u64, mnt: &Path, reference: &Path, cmd: i32, done: i32, log: &Path) {
    let mut rng = Rng(seed ^ (i as u64).wrapping_mul(0xA076_1D64_78BD_642F));
    let mut out = fs::File::create(log).unwrap();
    let private = format!("p{i}");
    let (mut ok, mut bad, mut n, mut succeeded) = (0u64, 0u64, 0u64, 0u64);
    let private_batch = 8;
    loop {
        let mut b = [0u8; 1];
        if unsafe { libc::read(cmd, b.as_mut_ptr().cast(), 1) } != 1 {
            break;
        }
        let ops = match b[0] {
            b'P' => private_batch,
            b'S' => 1,
            _ => break,
        };
        for _ in 0..ops {
            let op = if b[0] == b'P' {
                gen(&mut rng, reference, &[&private])
            } else {
                gen(&mut rng, reference, &["shared", &private])
            };
            let got = apply(mnt, &op);
            let want = apply(reference, &op);
            n += 1;
            succeeded += want.is_ok() as u64;
            if got == want {
                ok += 1;
            } else {
                bad += 1;
                writeln!(
                    out,
                    "MISMATCH p{i} op {n}: {op:?}: tierfs {got:?}, reference {want:?}"
                )
                .unwrap();
            }
        }
        unsafe { libc::write(done, b"d".as_ptr().cast(), 1) };
    }
    writeln!(out, "RESULT {ok} {bad} {succeeded}").unwrap();
}

#[test]
fn namespace_stress_matches_reference() {
    let t = TestFs::with(Opts {
        timeout: Duration::from_secs(600),
        ..Opts::default()
    });
    stress(t);
}

/// The same on a mount whose every file lives in RW-PCC (an `rw` rule matching all names):
/// data in the cache files, served by passthrough.
#[test]
fn namespace_stress_on_rw_pcc_matches_reference() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        timeout: Duration::from_secs(600),
        ..Opts::default()
    });
    let meta = t.meta_url();
    t.tierfs(&[
        "pcc",
        "rule",
        "add",
        "--mode",
        "rw",
        "fname={*}",
        "--meta",
        &meta,
    ])
    .assert_ok();
    t.mount_with(&ClientOpts {
        name: "c0".into(),
        cache_dir: Some(t.root().join("cache0")),
        cache_size: Some("4G".into()),
        ..Default::default()
    });
    // the rule applies: a new file is RW-cached
    let probe = t.p(0, "probe");
    fs::write(&probe, b"x").unwrap();
    let out = t.tierfs(&["pcc", "state", &probe.to_string_lossy()]);
    out.assert_ok();
    assert!(out.stdout.contains("type: readwrite"), "{}", out.stdout);
    fs::remove_file(&probe).unwrap();
    stress(t);
}

fn stress(t: TestFs) {
    let procs = env_u64("TIERFS_STRESS_PROCS").unwrap_or(4) as usize;
    let rounds = env_u64("TIERFS_STRESS_ROUNDS").unwrap_or(150);
    let seed = env_u64("TIERFS_STRESS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    println!("stress: seed {seed} ({procs} processes, {rounds} rounds; TIERFS_STRESS_SEED={seed} replays)");
    let mnt = t.mnt(0).to_path_buf();
    let reference = t.root().join("reference");
    fs::create_dir(&reference).unwrap();
    for base in [&mnt, &reference] {
        fs::create_dir(base.join("shared")).unwrap();
        for i in 0..procs {
            fs::create_dir(base.join(format!("p{i}"))).unwrap();
        }
    }
    // one command pipe per child, one shared answer pipe
    let mut done = [0i32; 2];
    assert_eq!(
        unsafe { libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) },
        0
    );
    let mut kids = Vec::new();
    for i in 0..procs {
        let mut p = [0i32; 2];
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let log = t.root().join(format!("stress-{i}.log"));
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            unsafe { libc::close(p[1]) };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                child(i, seed, &mnt, &reference, p[0], done[1], &log)
            }));
            unsafe { libc::_exit(if r.is_ok() { 0 } else { 1 }) };
        }
        unsafe { libc::close(p[0]) };
        kids.push((pid, p[1], log));
    }
    unsafe { libc::close(done[1]) };
    let deadline = Instant::now() + Duration::from_secs(480);
    let send = |fd: i32, b: u8| {
        assert_eq!(
            unsafe { libc::write(fd, [b].as_ptr().cast(), 1) },
            1,
            "child gone"
        );
    };
    let wait = |k: usize| {
        for _ in 0..k {
            let mut b = [0u8; 1];
            assert_eq!(
                unsafe { libc::read(done[0], b.as_mut_ptr().cast(), 1) },
                1,
                "a stress process died (see its log)"
            );
        }
    };
    let mut rounds_done = 0;
    for _ in 0..rounds {
        if Instant::now() > deadline {
            break;
        }
        for k in &kids {
            send(k.1, b'P');
        }
        wait(kids.len());
        for k in &kids {
            send(k.1, b'S');
            wait(1);
        }
        rounds_done += 1;
    }
    let mut passed = 0u64;
    let mut failed = 0u64;
    let mut succeeded = 0u64;
    let mut report = Vec::new();
    for (pid, fd, log) in &kids {
        send(*fd, b'Q');
        let mut st = 0;
        unsafe { libc::waitpid(*pid, &mut st, 0) };
        let text = fs::read_to_string(log).unwrap_or_default();
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "stress process {pid} failed: {text}"
        );
        for l in text.lines() {
            if let Some(r) = l.strip_prefix("RESULT ") {
                let v: Vec<u64> = r.split(' ').map(|x| x.parse().unwrap()).collect();
                passed += v[0];
                failed += v[1];
                succeeded += v[2];
            } else {
                report.push(l.to_string());
            }
        }
    }
    // the final trees
    let (a, b) = (tree(&mnt), tree(&reference));
    for (name, want) in &b {
        match a.get(name) {
            Some(got) if got == want => {}
            got => {
                failed += 1;
                report.push(format!("TREE {name}: tierfs {got:?}, reference {want:?}"));
            }
        }
    }
    for name in a.keys().filter(|n| !b.contains_key(*n)) {
        failed += 1;
        report.push(format!("TREE {name}: only on tierfs {:?}", a[name]));
    }
    for l in report.iter().take(50) {
        println!("{l}");
    }
    println!(
        "stress: {} operations ({succeeded} succeeded on the reference, the rest failed there \
         with an errno tierfs had to match), {} entries compared after {rounds_done} rounds \
         (seed {seed})",
        passed + failed,
        b.len()
    );
    println!("stress: {passed} passed, {failed} failed");
    assert!(rounds_done > 0 && passed > 0, "nothing ran");
    assert_eq!(failed, 0, "seed {seed}: see the mismatches above");
}
