//! Data path (issue 2, "Required behaviour 3"): striping, large and small files, freeing
//! objects, full targets.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

const MIB: u64 = 1024 * 1024;

fn two_clients() -> TestFs {
    TestFs::new(2)
}

/// Value after the first occurrence of `key` (case-insensitive) on the first line that has it:
/// the first token that starts with a digit, e.g. "stripe_count: 2" -> "2", "size 1M" -> "1M".
fn field_after(text: &str, key: &str) -> Option<String> {
    for line in text.lines() {
        let low = line.to_ascii_lowercase();
        if let Some(i) = low.find(key) {
            let rest = &line[i + key.len()..];
            let tok = rest
                .split(|c: char| c.is_whitespace() || c == ':' || c == '=' || c == ',')
                .find(|t| t.starts_with(|c: char| c.is_ascii_digit()));
            if let Some(tok) = tok {
                return Some(tok.to_string());
            }
        }
    }
    None
}

/// "1048576", "1M", "1MiB", "1m", "1024K" -> bytes.
fn parse_size(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u64 = digits.parse().ok()?;
    let unit = s[digits.len()..].to_ascii_lowercase();
    let mul = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        _ => return None,
    };
    Some(n * mul)
}

fn stripe_count_of(out: &str) -> Option<u64> {
    field_after(out, "stripe_count")
        .or_else(|| field_after(out, "stripe count"))
        .or_else(|| field_after(out, "count"))
        .and_then(|s| s.parse().ok())
}

fn stripe_size_of(out: &str) -> Option<u64> {
    field_after(out, "stripe_size")
        .or_else(|| field_after(out, "stripe size"))
        .or_else(|| field_after(out, "size"))
        .and_then(|s| parse_size(&s))
}

/// Does `out` name target `i`: its directory `ost<i>`, a Lustre-style `OST000<i>`, or a row of
/// an `lfs getstripe`-style `obdidx` table whose first column is `i`?
fn names_target(out: &str, i: usize) -> bool {
    let toks = tokens(out);
    if toks
        .iter()
        .any(|t| *t == format!("ost{i}") || *t == format!("ost{i:04}"))
    {
        return true;
    }
    let mut in_table = false;
    for line in out.lines() {
        if line.to_ascii_lowercase().contains("obdidx") {
            in_table = true;
            continue;
        }
        if in_table {
            match line.split_whitespace().next().map(|t| t.parse::<usize>()) {
                Some(Ok(idx)) if idx == i => return true,
                Some(Ok(_)) => {}
                _ => in_table = false,
            }
        }
    }
    false
}

fn write_pattern_file(p: &Path, seed: u64, size: u64) {
    let mut f = fs::File::create(p).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(MIB) as usize;
        fill_pattern(seed, off, &mut buf[..n]);
        f.write_all(&buf[..n])
            .unwrap_or_else(|e| panic!("write {} at {off}: {e}", p.display()));
        off += n as u64;
    }
    f.sync_all().unwrap();
}

fn check_pattern_file(p: &Path, seed: u64, size: u64, what: &str) {
    let mut f = fs::File::open(p).unwrap();
    assert_eq!(f.metadata().unwrap().len(), size, "{what}: size");
    let mut buf = vec![0u8; MIB as usize];
    let mut want = vec![0u8; MIB as usize];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(MIB) as usize;
        f.read_exact(&mut buf[..n])
            .unwrap_or_else(|e| panic!("{what}: read at {off}: {e}"));
        fill_pattern(seed, off, &mut want[..n]);
        assert_same_bytes(&buf[..n], &want[..n], off, what);
        off += n as u64;
    }
    let mut extra = [0u8; 1];
    assert_eq!(f.read(&mut extra).unwrap(), 0, "{what}: data past the size");
}

#[test]
fn setstripe_directory_default_inherited_by_new_file() {
    let t = TestFs::with(Opts {
        clients: 2,
        stripe_count: Some(1),
        ..Opts::default()
    });
    let d = t.p(0, "striped");
    fs::create_dir(&d).unwrap();
    let ds = d.to_string_lossy().to_string();
    t.tierfs(&["setstripe", "-c", "2", "-S", "1M", &ds])
        .assert_ok();
    let out = t.tierfs(&["getstripe", &ds]);
    out.assert_ok();
    assert_eq!(
        stripe_count_of(&out.stdout),
        Some(2),
        "dir default count:\n{}",
        out.stdout
    );
    assert_eq!(
        stripe_size_of(&out.stdout),
        Some(MIB),
        "dir default size:\n{}",
        out.stdout
    );

    let (u0, u1) = (t.target_usage(0), t.target_usage(1));
    let f = d.join("file");
    write_pattern_file(&f, 21, 8 * MIB);
    let grew = wait_until(Duration::from_secs(10), || {
        t.target_usage(0) >= u0 + 4 * MIB && t.target_usage(1) >= u1 + 4 * MIB
    });
    assert!(
        grew,
        "8 MiB striped 2 x 1 MiB should put 4 MiB on each target; grew by {} and {}",
        t.target_usage(0) - u0,
        t.target_usage(1) - u1
    );
    let out = t.tierfs(&["getstripe", &f.to_string_lossy()]);
    out.assert_ok();
    assert_eq!(
        stripe_count_of(&out.stdout),
        Some(2),
        "inherited count:\n{}",
        out.stdout
    );
    assert_eq!(
        stripe_size_of(&out.stdout),
        Some(MIB),
        "inherited size:\n{}",
        out.stdout
    );
    assert!(
        names_target(&out.stdout, 0) && names_target(&out.stdout, 1),
        "getstripe of a 2-stripe file must name both targets:\n{}",
        out.stdout
    );
    check_pattern_file(&t.p(1, "striped/file"), 21, 8 * MIB, "striped file from c1");

    // a file outside the directory gets the filesystem default (1 stripe)
    let (u0, u1) = (t.target_usage(0), t.target_usage(1));
    let g = t.p(0, "plain");
    write_pattern_file(&g, 22, 4 * MIB);
    let out = t.tierfs(&["getstripe", &g.to_string_lossy()]);
    out.assert_ok();
    assert_eq!(
        stripe_count_of(&out.stdout),
        Some(1),
        "fs default count:\n{}",
        out.stdout
    );
    thread::sleep(Duration::from_millis(500));
    let (d0, d1) = (t.target_usage(0) - u0, t.target_usage(1) - u1);
    assert!(
        (d0 >= 4 * MIB && d1 < MIB) || (d1 >= 4 * MIB && d0 < MIB),
        "a 1-stripe 4 MiB file should land on one target; grew by {d0} and {d1}"
    );
    check_pattern_file(&t.p(1, "plain"), 22, 4 * MIB, "plain file from c1");
}

#[test]
fn setstripe_on_new_file() {
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_count: Some(1),
        ..Opts::default()
    });
    let f = t.p(0, "wide");
    let fs_ = f.to_string_lossy().to_string();
    t.tierfs(&["setstripe", "-c", "2", "-S", "2M", &fs_])
        .assert_ok();
    assert!(
        f.exists(),
        "setstripe on a new path creates the file (lfs semantics)"
    );
    let out = t.tierfs(&["getstripe", &fs_]);
    out.assert_ok();
    assert_eq!(stripe_count_of(&out.stdout), Some(2), "{}", out.stdout);
    assert_eq!(stripe_size_of(&out.stdout), Some(2 * MIB), "{}", out.stdout);
    let (u0, u1) = (t.target_usage(0), t.target_usage(1));
    let h = fs::OpenOptions::new().write(true).open(&f).unwrap();
    let data = pattern(23, 0, 8 * MIB as usize);
    h.write_all_at(&data, 0).unwrap();
    drop(h);
    assert!(
        wait_until(Duration::from_secs(10), || t.target_usage(0)
            >= u0 + 4 * MIB
            && t.target_usage(1) >= u1 + 4 * MIB),
        "2 x 2 MiB striping: grew by {} and {}",
        t.target_usage(0) - u0,
        t.target_usage(1) - u1
    );
    assert_same_bytes(&read_all(&f).unwrap(), &data, 0, "wide file");
}

#[test]
fn filesystem_default_stripe_from_format() {
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_count: Some(2),
        stripe_size: Some("1M".into()),
        ..Opts::default()
    });
    let f = t.p(0, "f");
    write_pattern_file(&f, 24, 4 * MIB);
    let out = t.tierfs(&["getstripe", &f.to_string_lossy()]);
    out.assert_ok();
    assert_eq!(stripe_count_of(&out.stdout), Some(2), "{}", out.stdout);
    assert_eq!(stripe_size_of(&out.stdout), Some(MIB), "{}", out.stdout);
    check_pattern_file(&f, 24, 4 * MIB, "fs-default striped file");
}

#[test]
fn large_sequential_file_64mib() {
    let t = TestFs::with(Opts {
        clients: 2,
        timeout: Duration::from_secs(300),
        ..Opts::default()
    });
    let size = 64 * MIB;
    let f = t.p(0, "big");
    write_pattern_file(&f, 25, size);
    check_pattern_file(&f, 25, size, "c0 read back");
    check_pattern_file(&t.p(1, "big"), 25, size, "c1 read back");
    // random-offset reads of unaligned ranges
    let h = fs::File::open(t.p(1, "big")).unwrap();
    let mut x = 12345u64;
    for _ in 0..50 {
        x = splitmix64(x);
        let off = x % (size - 200_000);
        let len = (x >> 40) as usize % 200_000 + 1;
        let got = pread_exact(&h, off, len).unwrap();
        assert_same_bytes(&got, &pattern(25, off, len), off, "random read");
    }
}

#[test]
fn rewrite_middle_of_large_file() {
    let t = two_clients();
    let f = t.p(0, "f");
    write_pattern_file(&f, 26, 8 * MIB);
    let mut want = pattern(26, 0, 8 * MIB as usize);
    let h = fs::OpenOptions::new().write(true).open(&f).unwrap();
    for (i, off) in [0u64, MIB - 10, 3 * MIB + 4097, 8 * MIB - 47008]
        .iter()
        .enumerate()
    {
        let patch = pattern(100 + i as u64, *off, 47008);
        h.write_all_at(&patch, *off).unwrap();
        want[*off as usize..*off as usize + 47008].copy_from_slice(&patch);
    }
    drop(h);
    assert_same_bytes(&read_all(&f).unwrap(), &want, 0, "c0");
    assert_same_bytes(&read_all(&t.p(1, "f")).unwrap(), &want, 0, "c1");
}

/// Every file under a target with its bytes.
fn snapshot_objects(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut m = BTreeMap::new();
    fn walk(d: &Path, m: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(md) = fs::symlink_metadata(&p) else {
                continue;
            };
            if md.is_dir() {
                walk(&p, m);
            } else if md.is_file() {
                if let Ok(b) = fs::read(&p) {
                    m.insert(p, b);
                }
            }
        }
    }
    walk(dir, &mut m);
    m
}

#[test]
fn objects_are_immutable() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    write_pattern_file(&f, 27, 4 * MIB);
    thread::sleep(Duration::from_millis(500));
    let before: Vec<_> = (0..2).map(|i| snapshot_objects(&t.target_dir(i))).collect();
    assert!(
        before.iter().map(|m| m.len()).sum::<usize>() > 0,
        "no objects in the targets after writing 4 MiB"
    );
    let h = fs::OpenOptions::new().write(true).open(&f).unwrap();
    h.write_all_at(&pattern(28, 0, 100_000), 1_000_000).unwrap();
    h.write_all_at(b"tail", 4 * MIB - 2).unwrap();
    h.set_len(3 * MIB).unwrap();
    h.write_all_at(b"again", 3 * MIB).unwrap();
    drop(h);
    thread::sleep(Duration::from_millis(500));
    for (i, b) in before.iter().enumerate() {
        for (p, old) in b {
            if let Ok(now) = fs::read(p) {
                assert!(
                    now == *old,
                    "object {} on target {i} was rewritten in place",
                    p.display()
                );
            }
        }
    }
}

#[test]
fn small_files_read_back() {
    let t = two_clients();
    let sizes = [
        0usize, 1, 100, 511, 4095, 4096, 4097, 32768, 65535, 65536, 65537, 100_000,
    ];
    for (i, n) in sizes.iter().enumerate() {
        fs::write(t.p(0, &format!("s{n}")), pattern(i as u64, 0, *n)).unwrap();
    }
    for c in 0..2 {
        for (i, n) in sizes.iter().enumerate() {
            let got = read_all(&t.p(c, &format!("s{n}"))).unwrap();
            assert_same_bytes(
                &got,
                &pattern(i as u64, 0, *n),
                0,
                &format!("c{c}: {n}-byte file"),
            );
            assert_eq!(
                stat(&t.p(c, &format!("s{n}"))).unwrap().st_size as usize,
                *n
            );
        }
    }
    // many small files
    for k in 0..300u64 {
        fs::write(
            t.p(0, &format!("m{k}")),
            pattern(1000 + k, 0, 1000 + k as usize),
        )
        .unwrap();
    }
    for k in 0..300u64 {
        let got = read_all(&t.p(1, &format!("m{k}"))).unwrap();
        assert_same_bytes(
            &got,
            &pattern(1000 + k, 0, 1000 + k as usize),
            0,
            "many small",
        );
    }
}

/// `tierfs format` without `--inline-threshold` keeps files up to 256 KiB in the metadata
/// database (no object on a target, so no object fsync at their close) and puts a byte more in
/// objects; both read back whole from another client.
#[test]
fn default_format_keeps_files_up_to_256k_inline() {
    let t = TestFs::with(Opts {
        clients: 2,
        inline_threshold: None,
        ..Opts::default()
    });
    let out = t.tierfs(&["status", "--meta", &t.meta_url()]);
    out.assert_ok();
    assert!(
        out.stdout.contains("inline up to 256.0K,"),
        "{}",
        out.describe()
    );
    // (each target also holds its label, `.tierfs-target`)
    let objects = || {
        (0..2)
            .map(|i| dir_usage(&t.target_dir(i).join("objects")))
            .sum::<u64>()
    };
    let small = pattern(40, 0, 256 << 10);
    fs::write(t.p(0, "small"), &small).unwrap();
    assert_eq!(objects(), 0, "a 256 KiB file made objects");
    assert_same_bytes(&read_all(&t.p(1, "small")).unwrap(), &small, 0, "inline");
    let big = pattern(41, 0, (256 << 10) + 1);
    fs::write(t.p(0, "big"), &big).unwrap();
    assert!(objects() > 256 << 10, "a file past 256 KiB made no objects");
    assert_same_bytes(&read_all(&t.p(1, "big")).unwrap(), &big, 0, "in objects");
}

#[test]
fn small_file_grows_past_inline_threshold_and_shrinks() {
    let t = two_clients();
    let f = t.p(0, "f");
    let mut want = pattern(30, 0, 1000);
    fs::write(&f, &want).unwrap();
    // patch in place
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all_at(b"PATCH", 10)
        .unwrap();
    want[10..15].copy_from_slice(b"PATCH");
    assert_same_bytes(
        &read_all(&t.p(1, "f")).unwrap(),
        &want,
        0,
        "patched small file",
    );
    // append in steps across 64 KiB
    let mut h = fs::OpenOptions::new().append(true).open(&f).unwrap();
    while want.len() < 200_000 {
        let piece = pattern(31, want.len() as u64, 7000);
        h.write_all(&piece).unwrap();
        want.extend_from_slice(&piece);
    }
    drop(h);
    assert_same_bytes(
        &read_all(&t.p(1, "f")).unwrap(),
        &want,
        0,
        "grown past threshold",
    );
    assert_same_bytes(&read_all(&f).unwrap(), &want, 0, "grown, c0");
    // shrink below the threshold again, then grow with a hole
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(500)
        .unwrap();
    want.truncate(500);
    assert_same_bytes(&read_all(&t.p(1, "f")).unwrap(), &want, 0, "shrunk");
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all_at(b"end", 70_000)
        .unwrap();
    want.resize(70_000, 0);
    want.extend_from_slice(b"end");
    assert_same_bytes(
        &read_all(&t.p(1, "f")).unwrap(),
        &want,
        0,
        "regrown with a hole",
    );
}

#[test]
fn allocator_spreads_single_stripe_files_over_both_targets() {
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_count: Some(1),
        ..Opts::default()
    });
    for k in 0..20u64 {
        write_pattern_file(&t.p(0, &format!("f{k}")), 40 + k, MIB);
    }
    thread::sleep(Duration::from_millis(500));
    let (a, b) = (t.target_usage(0), t.target_usage(1));
    let total = a + b;
    assert!(
        total >= 20 * MIB,
        "targets hold {total} bytes for 20 MiB of files"
    );
    let share = a as f64 / total as f64;
    assert!(
        (0.35..=0.65).contains(&share),
        "targets unevenly filled: {a} vs {b} bytes"
    );
}

/// Poll until the targets hold at most `limit` bytes; returns (ok, elapsed, last usage).
fn wait_usage_at_most(t: &TestFs, limit: u64, within: Duration) -> (bool, Duration, u64) {
    let t0 = Instant::now();
    let mut last = 0;
    let ok = wait_until(within, || {
        last = t.total_target_usage();
        last <= limit
    });
    (ok, t0.elapsed(), last)
}

const GC_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn truncate_and_unlink_free_objects() {
    let t = TestFs::new(1);
    let base = t.total_target_usage();
    let f = t.p(0, "f");
    write_pattern_file(&f, 50, 16 * MIB);
    assert!(
        wait_until(Duration::from_secs(10), || t.total_target_usage()
            >= base + 16 * MIB),
        "16 MiB file: targets grew by only {}",
        t.total_target_usage() - base
    );
    // truncate to 0 frees everything
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(0)
        .unwrap();
    let (ok, took, last) = wait_usage_at_most(&t, base + MIB, GC_LIMIT);
    assert!(
        ok,
        "truncate to 0: targets still hold {} extra bytes after {took:?}",
        last - base
    );

    // truncate to 4 MiB frees the objects past it
    write_pattern_file(&f, 51, 16 * MIB);
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    let (ok, took, last) = wait_usage_at_most(&t, base + 8 * MIB, GC_LIMIT);
    assert!(
        ok,
        "truncate 16 MiB -> 4 MiB: targets still hold {} extra bytes after {took:?}",
        last - base
    );
    check_pattern_file(&f, 51, 4 * MIB, "after truncate to 4 MiB");

    // unlink frees everything
    fs::remove_file(&f).unwrap();
    let (ok, took, last) = wait_usage_at_most(&t, base + MIB, GC_LIMIT);
    assert!(
        ok,
        "unlink: targets still hold {} extra bytes after {took:?}",
        last - base
    );
}

fn unlink_while_open_keeps_objects(unlink_via: usize) {
    let t = TestFs::with(Opts {
        clients: 2,
        timeout: Duration::from_secs(240),
        ..Opts::default()
    });
    let base = t.total_target_usage();
    // first learn how quickly this filesystem frees a deleted file
    write_pattern_file(&t.p(1, "probe"), 60, 8 * MIB);
    fs::remove_file(t.p(1, "probe")).unwrap();
    let (ok, gc_time, last) = wait_usage_at_most(&t, base + MIB, GC_LIMIT);
    assert!(
        ok,
        "deleted file not freed: {} extra bytes after {gc_time:?}",
        last - base
    );

    // written by c1, so c0 has nothing of it in its page cache
    write_pattern_file(&t.p(1, "f"), 61, 8 * MIB);
    let h = fs::File::open(t.p(0, "f")).unwrap();
    fs::remove_file(t.p(unlink_via, "f")).unwrap();
    // give the collector more than the time it needed above
    thread::sleep((gc_time * 3).max(Duration::from_secs(3)));
    let got = pread_exact(&h, 0, 8 * MIB as usize).unwrap_or_else(|e| {
        panic!("read through the open handle after unlink on c{unlink_via}: {e}")
    });
    assert_same_bytes(
        &got,
        &pattern(61, 0, 8 * MIB as usize),
        0,
        &format!("open handle on c0 after unlink on c{unlink_via} and a GC period"),
    );
    drop(h);
    let (ok, took, last) = wait_usage_at_most(&t, base + MIB, GC_LIMIT);
    assert!(
        ok,
        "after the last close: {} extra bytes still held after {took:?}",
        last - base
    );
}

#[test]
fn unlink_while_open_same_client_keeps_objects() {
    unlink_while_open_keeps_objects(0);
}

#[test]
fn unlink_while_open_other_client_keeps_objects() {
    unlink_while_open_keeps_objects(1);
}

/// Close a file and report close(2)'s error, which `File`'s drop would swallow.
fn close_checked(f: fs::File) -> std::io::Result<()> {
    let fd = f.into_raw_fd();
    io_res(unsafe { libc::close(fd) })
}

#[test]
fn full_target_gives_enospc_and_keeps_old_data() {
    let t = TestFs::with(Opts {
        clients: 2,
        target_capacity: Some("8M".into()),
        stripe_count: Some(1),
        ..Opts::default()
    });
    let keep = t.p(0, "keep");
    write_pattern_file(&keep, 70, 2 * MIB);
    check_pattern_file(&keep, 70, 2 * MIB, "before filling");

    let fill = t.p(0, "fill");
    let f = fs::File::create(&fill).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let mut err = None;
    let mut written = 0u64;
    while written < 64 * MIB {
        fill_pattern(71, written, &mut buf);
        if let Err(e) = f.write_all_at(&buf, written) {
            err = Some(("write", e));
            break;
        }
        written += MIB;
    }
    if err.is_none() {
        if let Err(e) = f.sync_all() {
            err = Some(("fsync", e));
        }
    }
    let closed = close_checked(f);
    if err.is_none() {
        if let Err(e) = closed {
            err = Some(("close", e));
        }
    }
    let (call, e) = err.unwrap_or_else(|| {
        panic!("wrote, fsynced and closed 64 MiB on two targets of 8 MiB each without an error")
    });
    assert_eq!(
        err_of(&e),
        libc::ENOSPC,
        "{call} on a full target after {written} bytes: want ENOSPC, got {e}"
    );
    // nothing written before is damaged, on either client
    check_pattern_file(&keep, 70, 2 * MIB, "c0 after ENOSPC");
    check_pattern_file(&t.p(1, "keep"), 70, 2 * MIB, "c1 after ENOSPC");
    // the metadata side still works
    fs::create_dir(t.p(0, "still-works")).expect("mkdir with full targets");
    fs::remove_file(&fill).expect("unlink the file that hit ENOSPC");
}

#[test]
fn df_lists_targets() {
    let t = TestFs::new(1);
    write_pattern_file(&t.p(0, "f"), 80, 2 * MIB);
    let out = t.tierfs(&["df", &t.mnt(0).to_string_lossy()]);
    out.assert_ok();
    assert!(
        names_target(&out.stdout, 0) && names_target(&out.stdout, 1),
        "df must list both targets:\n{}",
        out.stdout
    );
    let out = t.tierfs(&["df", "-h", &t.mnt(0).to_string_lossy()]);
    out.assert_ok();
    assert!(out.stdout.lines().count() >= 3, "df -h:\n{}", out.stdout);
}

/// The `errors` and `misses` columns of `op`'s row in `tierfs stats` output.
fn stats_row(out: &str, op: &str) -> Option<(f64, Option<f64>)> {
    let header: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("operation"))?
        .split_whitespace()
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(op))?
        .split_whitespace()
        .collect();
    let errors = row.get(col("errors")?)?.parse().ok()?;
    let misses = col("misses").and_then(|c| row.get(c)?.parse().ok());
    Some((errors, misses))
}

#[test]
fn stats_counts_normal_misses_apart_from_errors() {
    // Issue 10, item 8: every ENOENT lookup and ENODATA getxattr was counted as an error.
    let t = TestFs::new(1);
    fs::write(t.p(0, "present"), b"x").unwrap();
    for i in 0..20 {
        assert!(fs::metadata(t.p(0, &format!("absent-{i}"))).is_err());
    }
    let c = cstr(&t.p(0, "present"));
    let name = std::ffi::CString::new("user.nothing-here").unwrap();
    let mut buf = [0u8; 64];
    for _ in 0..5 {
        // SAFETY: valid C strings and a buffer of the given length.
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        assert_eq!((n, errno()), (-1, libc::ENODATA));
    }
    let out = t.tierfs(&["stats", &t.mnt(0).to_string_lossy()]);
    out.assert_ok();
    let (errors, misses) = stats_row(&out.stdout, "lookup").expect("a lookup row");
    assert_eq!(
        errors, 0.0,
        "ENOENT lookups counted as errors:\n{}",
        out.stdout
    );
    assert!(misses.unwrap_or(0.0) >= 20.0, "{}", out.stdout);
    let (errors, misses) = stats_row(&out.stdout, "getxattr").expect("a getxattr row");
    assert_eq!(
        errors, 0.0,
        "ENODATA getxattr counted as errors:\n{}",
        out.stdout
    );
    assert!(misses.unwrap_or(0.0) >= 5.0, "{}", out.stdout);
}

/// The number columns (size, used, available) of the `df` line starting with `label`.
fn df_numbers(out: &str, label: &str) -> (u64, u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label} line in df:\n{out}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(3)
        .map(|x| x.parse().unwrap_or_else(|_| panic!("{x} in {line}")))
        .collect();
    (n[0], n[1], n[2])
}

#[test]
fn df_summary_counts_targets_on_one_device_once() {
    // Issue 10, item 7: two targets in one directory tree (one disk) gave a summary of twice
    // the disk's size.
    let t = TestFs::new(1);
    if !t.cluster.local_targets() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let d0 = fs::metadata(t.target_dir(0)).unwrap().dev();
    let d1 = fs::metadata(t.target_dir(1)).unwrap().dev();
    assert_eq!(
        d0, d1,
        "both targets of the test filesystem sit on one disk"
    );
    write_pattern_file(&t.p(0, "f"), 82, 2 * MIB);
    let out = t.tierfs(&["df", &t.mnt(0).to_string_lossy()]);
    out.assert_ok();
    let (size0, _, _) = df_numbers(&out.stdout, "tierfs-OST0000_UUID");
    let (size1, _, _) = df_numbers(&out.stdout, "tierfs-OST0001_UUID");
    let (total, used, avail) = df_numbers(&out.stdout, "filesystem_summary:");
    assert_eq!(size0, size1, "{}", out.stdout);
    assert_eq!(
        total, size0,
        "the summary counts the one disk under both targets once:\n{}",
        out.stdout
    );
    assert!(avail <= size0 && used >= 2 * MIB / 1024, "{}", out.stdout);
}

#[test]
fn stats_command_reports_io() {
    let t = TestFs::new(1);
    write_pattern_file(&t.p(0, "f"), 81, 2 * MIB);
    let _ = read_all(&t.p(0, "f")).unwrap();
    let out = t.tierfs(&["stats", &t.mnt(0).to_string_lossy()]);
    out.assert_ok();
    assert!(
        !out.stdout.trim().is_empty(),
        "tierfs stats printed nothing"
    );
    let low = out.stdout.to_ascii_lowercase();
    assert!(
        low.contains("write") && low.contains("read"),
        "stats should report reads and writes:\n{}",
        out.stdout
    );
}

/// fsx found it (issue 10: "short read: 0x11383 bytes instead of 0x13fa6", SIGBUS with mmap):
/// the kernel sends reads in parallel (readahead, several readers), and a read that arrived
/// while another thread was committing this client's buffered writes was cut at the size from
/// before the commit. The kernel takes a short answer inside the file for its end (a short
/// read, and it shrinks its idea of the size: a page of an mmap then raises SIGBUS). Here two
/// O_DIRECT readers (every read reaches the daemon) read the new tail at once while a commit of
/// thousands of small buffered writes is under way: every read must get all its bytes.
#[test]
fn read_during_a_commit_is_not_cut_at_the_old_size() {
    use std::os::unix::fs::OpenOptionsExt;
    let t = TestFs::new(1);
    let p = t.p(0, "f");
    let w = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    w.write_all_at(&[1u8; 4096], 0).unwrap();
    w.sync_all().unwrap();
    let readers: Vec<fs::File> = (0..2)
        .map(|_| {
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&p)
                .unwrap()
        })
        .collect();
    let mut size = 4096u64;
    for round in 0..4u8 {
        // Small writes with gaps between them: one slice each, so the commit takes a while.
        let piece = [round + 2; 512];
        for k in 0..8000u64 {
            w.write_all_at(&piece, size + k * 1024).unwrap();
        }
        size += 7999 * 1024 + 512;
        let at = size - 512;
        let short: Vec<String> = thread::scope(|s| {
            let hs: Vec<_> = readers
                .iter()
                .map(|r| {
                    s.spawn(move || {
                        let mut buf = [0u8; 512];
                        let n = r.read_at(&mut buf, at).unwrap();
                        if n != 512 || buf != piece {
                            Some(format!(
                                "round {round}: read at {at} of a file of {size} bytes got {n} \
                                 bytes (first {:?})",
                                buf.first()
                            ))
                        } else {
                            None
                        }
                    })
                })
                .collect();
            hs.into_iter().filter_map(|h| h.join().unwrap()).collect()
        });
        assert!(short.is_empty(), "reads during a commit: {short:?}");
    }
}

/// `copy_file_range(2)` on `from` -> `to`, looping over short copies; the total copied.
fn copy_range(
    from: &fs::File,
    off_in: u64,
    to: &fs::File,
    off_out: u64,
    len: u64,
) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let (mut i, mut o) = (off_in as libc::loff_t, off_out as libc::loff_t);
    let mut done = 0u64;
    while done < len {
        // SAFETY: plain system call on open descriptors and local offsets.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut i,
                to.as_raw_fd(),
                &mut o,
                (len - done) as usize,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    Ok(done)
}

/// The value of counter `name{op="op"}` in a mount's stats file.
fn op_count(t: &TestFs, i: usize, name: &str, op: &str) -> u64 {
    let text = fs::read_to_string(t.p(i, ".tierfs-stats")).unwrap();
    let key = format!("{name}{{op=\"{op}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

/// Issue 10: copy_file_range is done by the daemon (before, fuser answered ENOSYS with a WARN,
/// and the kernel fell back to copying through its page cache), with the offsets, the end of
/// the source, buffered writes on either side, two files and one, and the errors the kernel
/// expects; the copy is visible to another client after close.
#[test]
fn copy_file_range_copies_in_the_daemon() {
    let t = TestFs::new(2);
    let (src_p, dst_p) = (t.p(0, "src"), t.p(0, "dst"));
    let size = 3 * MIB + 12345;
    write_pattern_file(&src_p, 31, size);
    let mut want = vec![0u8; size as usize];
    fill_pattern(31, 0, &mut want);
    let src = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&src_p)
        .unwrap();
    // A buffered (unflushed) write in the source is part of the copy.
    src.write_all_at(b"fresh", 2 * MIB).unwrap();
    want[2 * MIB as usize..2 * MIB as usize + 5].copy_from_slice(b"fresh");
    let dst = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&dst_p)
        .unwrap();
    dst.write_all_at(&[7u8; 10_000], 0).unwrap();
    let before = op_count(&t, 0, "tierfs_fuse_ops_total", "copy_file_range");
    // From an unaligned offset to another, across chunk boundaries, asking past the end of
    // the source: copies up to its end.
    let n = copy_range(&src, 100, &dst, 5000, size).unwrap();
    assert_eq!(n, size - 100, "copied up to the end of the source");
    assert!(
        op_count(&t, 0, "tierfs_fuse_ops_total", "copy_file_range") > before,
        "copy_file_range did not reach the daemon"
    );
    assert_eq!(
        op_count(&t, 0, "tierfs_fuse_errors_total", "copy_file_range"),
        0
    );
    // At or past the end of the source: nothing.
    assert_eq!(copy_range(&src, size, &dst, 0, 10).unwrap(), 0);
    // One file, ranges apart: fine; overlapping: EINVAL (as the kernel says).
    assert_eq!(copy_range(&src, 0, &src, size, 4096).unwrap(), 4096);
    want.extend_from_within(0..4096);
    let e = copy_range(&src, 0, &src, 1000, 4096).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EINVAL),
        "overlapping copy: {e}"
    );
    // A destination opened for appending: EBADF.
    let app = fs::OpenOptions::new().append(true).open(&dst_p).unwrap();
    let e = copy_range(&src, 0, &app, 0, 10).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EBADF),
        "append destination: {e}"
    );
    drop((src, dst, app));

    let mut dwant = vec![7u8; 5000];
    dwant.extend_from_slice(&want[100..size as usize]);
    for i in 0..2 {
        let got = fs::read(t.p(i, "dst")).unwrap();
        assert_eq!(got.len(), dwant.len(), "client {i}: size of the copy");
        assert_same_bytes(&got, &dwant, 0, &format!("client {i}: copy"));
        let got = fs::read(t.p(i, "src")).unwrap();
        assert_same_bytes(
            &got,
            &want,
            0,
            &format!("client {i}: source after a self-copy"),
        );
    }
}

/// Issue 10: fallocate FALLOC_FL_ZERO_RANGE (was EOPNOTSUPP), with and without KEEP_SIZE,
/// inside the file, across its end and past it; the writer and another client (after close)
/// read the zeros and the size.
#[test]
fn fallocate_zero_range_with_and_without_keep_size() {
    use std::os::fd::AsRawFd;
    let t = TestFs::new(2);
    let p = t.p(0, "f");
    let size = 2 * MIB + 777;
    write_pattern_file(&p, 47, size);
    let mut want = vec![0u8; size as usize];
    fill_pattern(47, 0, &mut want);
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let zr = |mode: i32, off: u64, len: u64| {
        // SAFETY: plain system call on an open descriptor.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
        if r != 0 {
            panic!(
                "fallocate mode {mode:#x} {off}+{len}: {}",
                io::Error::last_os_error()
            );
        }
    };
    // A buffered write inside the range is zeroed too.
    f.write_all_at(b"pending", 1000).unwrap();
    zr(libc::FALLOC_FL_ZERO_RANGE, 999, MIB + 3);
    want[999..999 + MIB as usize + 3].fill(0);
    // Across the end with KEEP_SIZE: the size stays.
    zr(
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        size - 100,
        5000,
    );
    want[size as usize - 100..].fill(0);
    assert_eq!(f.metadata().unwrap().len(), size);
    // Across the end without: the file grows, with zeros.
    zr(libc::FALLOC_FL_ZERO_RANGE, size - 50, 1000);
    want.resize(size as usize - 50 + 1000, 0);
    assert_eq!(f.metadata().unwrap().len(), want.len() as u64);
    let mut got = vec![0u8; want.len()];
    f.read_exact_at(&mut got, 0).unwrap();
    assert_same_bytes(&got, &want, 0, "writer");
    drop(f);
    for i in 0..2 {
        let got = fs::read(t.p(i, "f")).unwrap();
        assert_eq!(got.len(), want.len(), "client {i}: size");
        assert_same_bytes(&got, &want, 0, &format!("client {i}"));
    }
}

/// st_blocks of `p` in bytes, waiting out the kernel's attribute cache (1 s) until `ok` holds
/// or 5 s passed; returns the last value.
fn blocks_bytes_until(p: &Path, ok: impl Fn(u64) -> bool) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let b = fs::metadata(p).unwrap().blocks() * 512;
        if ok(b) || Instant::now() > until {
            return b;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 10: st_blocks equalled the size, so a 5 GiB sparse file holding 1 MiB showed
/// `du` = 5.1G. It now counts the bytes that hold data (schema v5): on the writer while the
/// data is still buffered, on another client after close, less after a punched hole.
#[test]
fn st_blocks_count_stored_data_not_the_size() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let t = TestFs::new(2);
    let p = t.p(0, "sparse");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.set_len(5 << 30).unwrap();
    f.write_all_at(&vec![5u8; MIB as usize], 2 << 30).unwrap();
    let near_1mib = |b: u64| (MIB..=MIB + 64 * 1024).contains(&b);
    let b = f.metadata().unwrap().blocks() * 512;
    assert!(near_1mib(b), "writer, data buffered: {b} bytes allocated");
    drop(f);
    for i in 0..2 {
        let m = fs::metadata(t.p(i, "sparse")).unwrap();
        assert_eq!(m.len(), 5 << 30, "client {i}: size");
        let b = blocks_bytes_until(&t.p(i, "sparse"), near_1mib);
        assert!(
            near_1mib(b),
            "client {i}: {b} bytes allocated for 1 MiB of data"
        );
    }
    let out = std::process::Command::new("du")
        .arg("-k")
        .arg(t.p(1, "sparse"))
        .output()
        .unwrap();
    let kib: u64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!((1024..=1088).contains(&kib), "du -k says {kib}");
    // A hole punched in the data: it no longer counts.
    let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
    // SAFETY: plain system call on an open descriptor.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            (2 << 30) + (256 << 10),
            512 << 10,
        )
    };
    assert_eq!(r, 0, "punch: {}", io::Error::last_os_error());
    drop(f);
    let half = |b: u64| (512 << 10..=(512 << 10) + 64 * 1024).contains(&b);
    let b = blocks_bytes_until(&t.p(1, "sparse"), half);
    assert!(half(b), "after the punch: {b} bytes allocated");
}
