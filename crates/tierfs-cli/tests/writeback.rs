//! The kernel's writeback cache (`writeback_cache = true` in the client config, issue 14): small
//! writes gather in the page cache, the kernel owns the size and times of the files it caches
//! and sends them by SETATTR; close and fsync still hand everything to the filesystem, so a
//! close on one client is seen by an open on another. The rest of the suites run on such
//! mounts with `TIERFS_IT_CLIENT_CONFIG='writeback_cache = true'` (see common/mod.rs).

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Duration;

const WB: &str = "writeback_cache = true\n";
/// (so even with `TIERFS_IT_CLIENT_CONFIG='writeback_cache = true'`)
const PLAIN: &str = "writeback_cache = false\n";

/// A filesystem with client 0 on the writeback cache and client 1 without it.
fn wb_and_plain() -> TestFs {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    t.mount_with(&ClientOpts {
        name: "wb".into(),
        config: Some(WB.into()),
        ..Default::default()
    });
    t.mount_with(&ClientOpts {
        name: "plain".into(),
        config: Some(PLAIN.into()),
        ..Default::default()
    });
    t
}

fn futimens(f: &fs::File, sec: i64, nsec: i64) {
    let ts = [
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    ];
    io_res(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) }).expect("futimens");
}

#[test]
fn writeback_cache_gathers_small_writes_until_close() {
    let t = wb_and_plain();
    let p = t.p(0, "small");
    let before = fuse_ops(t.mnt(0), "write");
    let mut f = fs::File::create(&p).unwrap();
    let mut want = Vec::new();
    for i in 0..256u64 {
        let chunk = pattern(i, i * 100, 100);
        f.write_all(&chunk).unwrap();
        want.extend_from_slice(&chunk);
    }
    drop(f);
    let writes = fuse_ops(t.mnt(0), "write") - before;
    // 256 write(2)s of 100 bytes: one WRITE each without the writeback cache; with it, the
    // 25,600 bytes reach the daemon at close in a request or a few.
    assert!(
        writes <= 8,
        "{writes} WRITE requests for 256 small writes: not gathered by the page cache"
    );
    // close-to-open: the other client opens and reads it all
    let got = fs::read(t.p(1, "small")).unwrap();
    assert_same_bytes(&got, &want, 0, "read by the other client after close");
    let st = stat(&t.p(1, "small")).unwrap();
    assert_eq!(st.st_size as usize, want.len());
}

#[test]
fn writeback_cache_fsync_hands_the_data_over() {
    let t = wb_and_plain();
    let p = t.p(0, "synced");
    let f = fs::File::create(&p).unwrap();
    let want = pattern(7, 0, 10_000);
    f.write_all_at(&want, 0).unwrap();
    f.sync_all().unwrap();
    // still open on the writer: the other client sees the fsynced data and size
    let got = fs::read(t.p(1, "synced")).unwrap();
    assert_same_bytes(&got, &want, 0, "read by the other client after fsync");
    drop(f);
}

/// tar sets the mtime with utimensat before close: the data written before it reaches the
/// daemon later (writeback, close) and must not make the mtime "now".
#[test]
fn writeback_cache_keeps_an_explicit_mtime_set_before_close() {
    let t = wb_and_plain();
    let p = t.p(0, "tarred");
    let f = fs::File::create(&p).unwrap();
    f.write_all_at(&pattern(3, 0, 5000), 0).unwrap();
    futimens(&f, 1_000_000_000, 123_000_000);
    // more bytes from the same tar block, already in the page cache before the times
    drop(f);
    for (i, what) in [(0, "writer"), (1, "other client")] {
        let st = stat(&t.p(i, "tarred")).unwrap();
        assert_eq!(
            mtime(&st),
            (1_000_000_000, 123_000_000),
            "mtime seen by the {what}"
        );
        assert_eq!(st.st_size, 5000, "size seen by the {what}");
    }
    // The daemon's own record (not the writer's kernel cache): a fresh mount of the writer
    // after its cache is gone would read this.
    let st = stat(&t.p(1, "tarred")).unwrap();
    assert_eq!(mtime(&st).0, 1_000_000_000);
}

/// chown(-1, -1) drops setuid/setgid of a file (Linux's rule); with the writeback cache the
/// kernel sends it as a setattr of ctime alone, not an empty one.
#[test]
fn writeback_cache_chown_minus_one_drops_setuid() {
    let t = wb_and_plain();
    let p = t.p(0, "suid");
    fs::write(&p, b"x").unwrap();
    fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o6755)).unwrap();
    let c = cstr(&p);
    io_res(unsafe { libc::chown(c.as_ptr(), u32::MAX, u32::MAX) }).unwrap();
    assert_eq!(stat(&p).unwrap().st_mode & 0o7777, 0o755, "chown(-1, -1)");
}

/// A write of part of a page through a write-only handle: the kernel reads the rest of the
/// page through that same handle first. The daemon serves it, and the bytes around are kept.
#[test]
fn writeback_cache_partial_page_write_through_a_write_only_handle() {
    let t = wb_and_plain();
    let old = pattern(11, 0, 10_000);
    fs::write(t.p(1, "partial"), &old).unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(t.p(0, "partial"))
        .unwrap();
    let patch = pattern(12, 4100, 10);
    f.write_all_at(&patch, 4100).unwrap();
    drop(f);
    let mut want = old.clone();
    want[4100..4110].copy_from_slice(&patch);
    let got = fs::read(t.p(1, "partial")).unwrap();
    assert_same_bytes(
        &got,
        &want,
        0,
        "after a partial-page write through O_WRONLY",
    );
}

/// The kernel writes dirty pages back through the most recently opened writable handle of the
/// file, an O_APPEND one too: such a page goes at its offset, not at the end of the file.
#[test]
fn writeback_cache_page_written_back_through_an_append_handle_lands_at_its_offset() {
    let t = wb_and_plain();
    let old = pattern(21, 0, 8192);
    fs::write(t.p(1, "mixed"), &old).unwrap();
    let plain = fs::OpenOptions::new()
        .write(true)
        .open(t.p(0, "mixed"))
        .unwrap();
    let head = pattern(22, 0, 100);
    plain.write_all_at(&head, 0).unwrap();
    let mut append = fs::OpenOptions::new()
        .append(true)
        .open(t.p(0, "mixed"))
        .unwrap();
    // the close of `plain` writes its dirty page back through `append`'s handle
    drop(plain);
    let tail = pattern(23, 8192, 50);
    append.write_all(&tail).unwrap();
    drop(append);
    let mut want = old.clone();
    want[..100].copy_from_slice(&head);
    want.extend_from_slice(&tail);
    let got = fs::read(t.p(1, "mixed")).unwrap();
    assert_same_bytes(&got, &want, 0, "page-cache write and append");
}

/// Truncates, up and down, with dirty pages around: the sizes and bytes the other client sees.
#[test]
fn writeback_cache_truncate_with_dirty_pages() {
    let t = wb_and_plain();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(t.p(0, "trunc"))
        .unwrap();
    let data = pattern(31, 0, 20_000);
    f.write_all_at(&data, 0).unwrap();
    f.set_len(6000).unwrap();
    f.write_all_at(&pattern(32, 9000, 10), 9000).unwrap();
    drop(f);
    let mut want = data[..6000].to_vec();
    want.resize(9000, 0);
    want.extend_from_slice(&pattern(32, 9000, 10));
    let got = fs::read(t.p(1, "trunc")).unwrap();
    assert_same_bytes(
        &got,
        &want,
        0,
        "after truncate down and a write past the end",
    );
}

/// Writes through a shared mapping reach the other client at msync + close.
#[test]
fn writeback_cache_mmap_writes_reach_the_other_client() {
    let t = wb_and_plain();
    let old = pattern(41, 0, 3 * 4096);
    fs::write(t.p(0, "mapped"), &old).unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.p(0, "mapped"))
        .unwrap();
    let len = old.len();
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        m,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    let patch = pattern(42, 5000, 300);
    unsafe {
        std::ptr::copy_nonoverlapping(patch.as_ptr(), (m as *mut u8).add(5000), patch.len());
        assert_eq!(libc::msync(m, len, libc::MS_SYNC), 0);
        libc::munmap(m, len);
    }
    drop(f);
    let mut want = old.clone();
    want[5000..5300].copy_from_slice(&patch);
    let got = fs::read(t.p(1, "mapped")).unwrap();
    assert_same_bytes(&got, &want, 0, "after mmap writes, msync and close");
}

/// O_DIRECT opens beside cached writes of the same file on the writeback client.
#[test]
fn writeback_cache_o_direct_sees_cached_writes() {
    let t = wb_and_plain();
    let p = t.p(0, "direct");
    let cached = fs::File::create(&p).unwrap();
    let want = pattern(51, 0, 8192);
    cached.write_all_at(&want, 0).unwrap();
    let direct = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .unwrap();
    // O_DIRECT reads need an aligned buffer
    let mut buf = vec![0u8; 8192 + 4096];
    let off = buf.as_ptr().align_offset(4096);
    let n = direct.read_at(&mut buf[off..off + 8192], 0).unwrap();
    assert_eq!(n, 8192);
    assert_same_bytes(
        &buf[off..off + 8192],
        &want,
        0,
        "O_DIRECT read of cached writes",
    );
    drop(direct);
    drop(cached);
}

/// A mount with a persistent client cache keeps today's mode (passthrough and the writeback
/// cache are exclusive) and says so in its log.
#[test]
fn writeback_cache_is_not_used_beside_pcc() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let cache = t.root().join("cache");
    fs::create_dir_all(&cache).unwrap();
    t.mount_with(&ClientOpts {
        name: "pcc".into(),
        cache_dir: Some(cache),
        cache_size: Some("64M".into()),
        config: Some(WB.into()),
        ..Default::default()
    });
    let log = t.log_path("pcc");
    assert!(
        wait_until(Duration::from_secs(10), || fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("writeback_cache = true is ignored")),
        "the log says the writeback cache is off beside PCC"
    );
    let before = fuse_ops(t.mnt(0), "write");
    let mut f = fs::File::create(t.p(0, "f")).unwrap();
    for i in 0..64u64 {
        f.write_all(&pattern(i, 0, 10)).unwrap();
    }
    drop(f);
    let writes = fuse_ops(t.mnt(0), "write") - before;
    assert!(
        writes == 0 || writes >= 64,
        "{writes} WRITEs for 64 writes: gathered, so the writeback cache was on"
    );
}

/// The documented bound (docs/semantics.md, "writeback cache"): the kernel of a writeback
/// client keeps its own size and mtime of a regular file whose inode it holds, so another
/// client's growth of the file is not seen there, past any attribute TTL, until that inode
/// leaves its cache. This pins the bound: when a kernel learns to take the server's size of a
/// clean file, this test fails and the documentation (and the default) can change.
#[test]
fn writeback_cache_client_keeps_its_size_of_a_cached_file() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    t.mount_with(&ClientOpts {
        name: "wb".into(),
        attr_ttl: Some(0.1),
        config: Some(WB.into()),
        ..Default::default()
    });
    t.mount_with(&ClientOpts {
        name: "plain".into(),
        attr_ttl: Some(0.1),
        config: Some(PLAIN.into()),
        ..Default::default()
    });
    fs::write(t.p(1, "shared"), pattern(61, 0, 1000)).unwrap();
    // the writeback client holds the inode (an open file)
    let held = fs::File::open(t.p(0, "shared")).unwrap();
    assert_eq!(held.metadata().unwrap().len(), 1000);
    let mut g = fs::OpenOptions::new()
        .append(true)
        .open(t.p(1, "shared"))
        .unwrap();
    g.write_all(&pattern(61, 1000, 3000)).unwrap();
    drop(g);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stat(&t.p(1, "shared")).unwrap().st_size, 4000);
    // past the TTL, and after a fresh open, the writeback client still says 1000
    let again = fs::File::open(t.p(0, "shared")).unwrap();
    assert_eq!(
        stat(&t.p(0, "shared")).unwrap().st_size,
        1000,
        "the writeback client's kernel took the other client's size: update docs/semantics.md"
    );
    drop(again);
    drop(held);
}

/// The kernel's SETATTR of its mtime and ctime after the pages of a small file is folded into
/// the commit of those pages: one MTIME record (one transaction), not a commit and then a
/// utimes (two MTIME records), and the commit carries the kernel's time.
#[test]
fn writeback_cache_times_after_the_pages_are_committed_with_them() {
    let t = wb_and_plain();
    let url = t.meta_url();
    t.tierfs(&["changelog", "register", "--meta", &url])
        .assert_ok();
    let p = t.p(0, "stamped");
    fs::write(&p, pattern(71, 0, 3000)).unwrap();
    let ino = stat(&p).unwrap().st_ino;
    let out = t.tierfs(&["changelog", "--meta", &url, "--json"]);
    out.assert_ok();
    let mtimes = out
        .stdout
        .lines()
        .filter(|l| l.contains("\"MTIME\"") && l.contains(&format!("\"target\":{ino}")))
        .count();
    assert_eq!(
        mtimes, 1,
        "MTIME records of one small file:\n{}",
        out.stdout
    );
    // what the other client reads is the writer's kernel time
    assert_eq!(
        mtime(&stat(&t.p(1, "stamped")).unwrap()),
        mtime(&stat(&p).unwrap())
    );
}
