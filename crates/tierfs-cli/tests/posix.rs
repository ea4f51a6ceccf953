//! POSIX behaviour of one tierfs mount (issue 2, "Required behaviour 1").

mod common;

use common::*;
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------------------------

/// Long enough for a filesystem with 1 s timestamp resolution to show a change.
fn tick() {
    thread::sleep(Duration::from_millis(1100));
}

fn mode_of(p: &Path) -> u32 {
    lstat(p).unwrap().st_mode
}

fn ftype(p: &Path) -> u32 {
    mode_of(p) & libc::S_IFMT
}

fn chmod(p: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    io_res(unsafe { libc::chmod(c.as_ptr(), mode) })
}

fn chown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(p);
    io_res(unsafe { libc::chown(c.as_ptr(), uid, gid) })
}

fn lchown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(p);
    io_res(unsafe { libc::lchown(c.as_ptr(), uid, gid) })
}

fn mkdir(p: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    io_res(unsafe { libc::mkdir(c.as_ptr(), mode) })
}

fn mknod(p: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    io_res(unsafe { libc::mknod(c.as_ptr(), mode, 0) })
}

fn open(p: &Path, flags: i32, mode: u32) -> io::Result<fs::File> {
    let c = cstr(p);
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(unsafe { fs::File::from_raw_fd(fd) })
    }
}

fn rename2(a: &Path, b: &Path, flags: u32) -> io::Result<()> {
    let (ca, cb) = (cstr(a), cstr(b));
    io_res(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            flags,
        )
    })
}

fn utimens(p: &Path, times: Option<[libc::timespec; 2]>, flags: i32) -> io::Result<()> {
    let c = cstr(p);
    let ptr = match &times {
        Some(t) => t.as_ptr(),
        None => std::ptr::null(),
    };
    io_res(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ptr, flags) })
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn umask() -> u32 {
    let s = fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
}

fn setxattr(p: &Path, name: &str, val: &[u8], flags: i32) -> io::Result<()> {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    io_res(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            val.as_ptr().cast(),
            val.len(),
            flags,
        )
    })
}

fn lsetxattr(p: &Path, name: &str, val: &[u8]) -> io::Result<()> {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    io_res(unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), val.as_ptr().cast(), val.len(), 0) })
}

fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    let len = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; len as usize];
    let got = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(got as usize);
    Ok(buf)
}

fn listxattr(p: &Path) -> io::Result<Vec<String>> {
    let c = cstr(p);
    let len = unsafe { libc::listxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; len as usize];
    let got = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(got as usize);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    io_res(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}

fn flock(f: &fs::File, op: i32) -> io::Result<()> {
    io_res(unsafe { libc::flock(f.as_raw_fd(), op) })
}

fn fcntl_lock(f: &fs::File, cmd: i32, ty: i32, start: i64, len: i64) -> io::Result<libc::flock> {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fl)
    }
}

fn is_would_block(e: &io::Error) -> bool {
    matches!(err_of(e), libc::EAGAIN | libc::EACCES)
}

/// A root-owned scratch directory in the mount that everyone may write to.
fn world_dir(t: &TestFs, name: &str) -> PathBuf {
    let d = t.p(0, name);
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o777).unwrap();
    d
}

// ---------------------------------------------------------------------------------------------
// lookup / getattr / setattr
// ---------------------------------------------------------------------------------------------

#[test]
fn lookup_and_getattr() {
    let t = TestFs::new(1);
    let root = stat(t.mnt(0)).unwrap();
    assert_eq!(
        root.st_mode & libc::S_IFMT,
        libc::S_IFDIR,
        "root is a directory"
    );
    let f = t.p(0, "f");
    fs::write(&f, b"hello").unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(st.st_size, 5);
    assert_eq!(st.st_nlink, 1);
    assert_eq!((st.st_uid, st.st_gid), (0, 0));
    assert_ne!(st.st_ino, root.st_ino);
    assert!(st.st_blksize > 0);
    assert_errno(stat(&t.p(0, "missing")), libc::ENOENT, "stat missing");
    assert_errno(stat(&t.p(0, "f/x")), libc::ENOTDIR, "stat through a file");
    // the same inode number on every lookup
    assert_eq!(stat(&f).unwrap().st_ino, st.st_ino);
}

#[test]
fn chmod_changes_mode_and_ctime() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    let before = stat(&f).unwrap();
    tick();
    chmod(&f, 0o640).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(st.st_mode & 0o7777, 0o640);
    assert!(ctime(&st) > ctime(&before), "chmod must update ctime");
    assert_eq!(mtime(&st), mtime(&before), "chmod must not touch mtime");
    chmod(&f, 0o4755).unwrap();
    assert_eq!(mode_of(&f) & 0o7777, 0o4755, "setuid kept when set by root");
    // fchmod
    let h = fs::File::open(&f).unwrap();
    h.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(fstat(h.as_raw_fd()).unwrap().st_mode & 0o7777, 0o600);
    let d = t.p(0, "d");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o1700).unwrap();
    assert_eq!(mode_of(&d) & 0o7777, 0o1700);
    assert_eq!(ftype(&d), libc::S_IFDIR);
}

#[test]
fn chown_changes_owner_and_group() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    let before = stat(&f).unwrap();
    tick();
    chown(&f, 1000, 2000).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!((st.st_uid, st.st_gid), (1000, 2000));
    assert!(ctime(&st) > ctime(&before), "chown must update ctime");
    chown(&f, u32::MAX, 3000).unwrap(); // -1: keep owner
    let st = stat(&f).unwrap();
    assert_eq!((st.st_uid, st.st_gid), (1000, 3000));
    chown(&f, 1001, u32::MAX).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!((st.st_uid, st.st_gid), (1001, 3000));
    // lchown changes the link, not its target
    let l = t.p(0, "l");
    std::os::unix::fs::symlink("f", &l).unwrap();
    lchown(&l, 1500, 1600).unwrap();
    let ls = lstat(&l).unwrap();
    assert_eq!((ls.st_uid, ls.st_gid), (1500, 1600));
    let st = stat(&f).unwrap();
    assert_eq!((st.st_uid, st.st_gid), (1001, 3000));
}

#[test]
fn chown_clears_setuid_and_setgid() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    chmod(&f, 0o6755).unwrap();
    chown(&f, 1000, 1000).unwrap();
    assert_eq!(
        mode_of(&f) & 0o7777,
        0o755,
        "chown of an executable clears S_ISUID and S_ISGID (Linux, root too)"
    );
}

#[test]
fn truncate_down_and_up() {
    let t = TestFs::new(2);
    let f = t.p(0, "f");
    let data = pattern(1, 0, 1000);
    fs::write(&f, &data).unwrap();
    let before = stat(&f).unwrap();
    tick();
    let h = fs::OpenOptions::new().write(true).open(&f).unwrap();
    h.set_len(500).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(st.st_size, 500);
    assert!(mtime(&st) > mtime(&before), "truncate updates mtime");
    assert!(ctime(&st) > ctime(&before), "truncate updates ctime");
    drop(h);
    assert_eq!(read_all(&f).unwrap(), &data[..500]);
    // truncate(2) by path, up: the new part reads as zeros, not the old bytes
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(3000)
        .unwrap();
    let got = read_all(&f).unwrap();
    assert_eq!(got.len(), 3000);
    assert_same_bytes(&got[..500], &data[..500], 0, "kept part");
    assert!(
        got[500..].iter().all(|b| *b == 0),
        "extended part must read as zeros (old data resurrected?)"
    );
    // the same seen from another client
    let got1 = read_all(&t.p(1, "f")).unwrap();
    assert_same_bytes(&got1, &got, 0, "truncated file seen from c1");
}

#[test]
fn truncate_large_file_across_blocks() {
    let t = TestFs::new(2);
    let f = t.p(0, "big");
    let size = 3 * 1024 * 1024 + 12345;
    let data = pattern(2, 0, size);
    fs::write(&f, &data).unwrap();
    let cut = 1024 * 1024 + 777;
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(cut as u64)
        .unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(size as u64 + 4096)
        .unwrap();
    for (who, p) in [("c0", t.p(0, "big")), ("c1", t.p(1, "big"))] {
        let got = read_all(&p).unwrap();
        assert_eq!(got.len(), size + 4096, "{who}: size");
        assert_same_bytes(&got[..cut], &data[..cut], 0, &format!("{who}: kept part"));
        if let Some(i) = got[cut..].iter().position(|b| *b != 0) {
            panic!(
                "{who}: byte at {} after truncate-down/up is {:#x}, want 0 (old data came back)",
                cut + i,
                got[cut + i]
            );
        }
    }
}

#[test]
fn utimens_explicit_omit_now() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    utimens(
        &f,
        Some([
            ts(1_000_000_000, 123_456_789),
            ts(1_200_000_000, 987_654_321),
        ]),
        0,
    )
    .unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(
        atime(&st),
        (1_000_000_000, 123_456_789),
        "atime set exactly"
    );
    assert_eq!(
        mtime(&st),
        (1_200_000_000, 987_654_321),
        "mtime set exactly"
    );
    let c1 = ctime(&st);
    assert!(
        (c1.0 - now_secs()).abs() <= 5,
        "ctime is now after utimens, got {c1:?}"
    );

    // UTIME_OMIT on atime keeps it
    utimens(&f, Some([ts(0, libc::UTIME_OMIT), ts(1_300_000_000, 5)]), 0).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(
        atime(&st),
        (1_000_000_000, 123_456_789),
        "UTIME_OMIT keeps atime"
    );
    assert_eq!(mtime(&st), (1_300_000_000, 5));

    // UTIME_OMIT on mtime, explicit atime
    utimens(&f, Some([ts(1_100_000_000, 0), ts(0, libc::UTIME_OMIT)]), 0).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(atime(&st), (1_100_000_000, 0));
    assert_eq!(mtime(&st), (1_300_000_000, 5), "UTIME_OMIT keeps mtime");

    // UTIME_NOW on both
    let lo = now_secs();
    utimens(
        &f,
        Some([ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_NOW)]),
        0,
    )
    .unwrap();
    let hi = now_secs();
    let st = stat(&f).unwrap();
    assert!(
        st.st_atime >= lo - 1 && st.st_atime <= hi + 1,
        "UTIME_NOW atime {} not in [{lo}, {hi}]",
        st.st_atime
    );
    assert!(
        st.st_mtime >= lo - 1 && st.st_mtime <= hi + 1,
        "UTIME_NOW mtime {} not in [{lo}, {hi}]",
        st.st_mtime
    );

    // NULL times means now
    utimens(&f, Some([ts(5, 0), ts(5, 0)]), 0).unwrap();
    utimens(&f, None, 0).unwrap();
    let st = stat(&f).unwrap();
    assert!(st.st_mtime >= lo - 1, "utimensat(NULL) sets mtime to now");
    assert!(st.st_atime >= lo - 1, "utimensat(NULL) sets atime to now");

    // on a directory too
    let d = t.p(0, "d");
    fs::create_dir(&d).unwrap();
    utimens(&d, Some([ts(7, 7), ts(8, 8)]), 0).unwrap();
    let st = stat(&d).unwrap();
    assert_eq!((atime(&st), mtime(&st)), ((7, 7), (8, 8)));
}

/// tar's order: write, set the times, close. The times given stay (the data's commit, which
/// now goes in the same transaction as the setattr, does not overwrite them), on this client
/// and on another, and the data is all there.
#[test]
fn times_set_over_buffered_writes_stay() {
    let t = TestFs::new(2);
    let f = t.p(0, "f");
    let data = pattern(7, 0, 10_240);
    let mut h = fs::File::create(&f).unwrap();
    h.write_all(&data).unwrap();
    utimens(&f, Some([ts(1_000_000_000, 11), ts(1_100_000_000, 22)]), 0).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(
        (st.st_size, atime(&st), mtime(&st)),
        (10_240, (1_000_000_000, 11), (1_100_000_000, 22)),
        "before close"
    );
    drop(h);
    let st = stat(&f).unwrap();
    assert_eq!(
        (st.st_size, atime(&st), mtime(&st)),
        (10_240, (1_000_000_000, 11), (1_100_000_000, 22)),
        "after close"
    );
    assert!(
        (ctime(&st).0 - now_secs()).abs() <= 5,
        "ctime is now, got {:?}",
        ctime(&st)
    );
    let other = t.p(1, "f");
    let st = stat(&other).unwrap();
    assert_eq!(
        (st.st_size, atime(&st), mtime(&st)),
        (10_240, (1_000_000_000, 11), (1_100_000_000, 22)),
        "on the other client"
    );
    assert_same_bytes(
        &fs::read(&other).unwrap(),
        &data,
        0,
        "the other client's read",
    );
    // a later write with no setattr moves the mtime to now again
    let mut h = fs::OpenOptions::new().append(true).open(&f).unwrap();
    h.write_all(b"more").unwrap();
    drop(h);
    let st = stat(&f).unwrap();
    assert_eq!(st.st_size, 10_244);
    assert!(
        (st.st_mtime - now_secs()).abs() <= 5,
        "mtime of the later write"
    );
}

// ---------------------------------------------------------------------------------------------
// create / mknod / open flags / read / write / fsync
// ---------------------------------------------------------------------------------------------

#[test]
fn create_mode_owner_and_parent_times() {
    let t = TestFs::new(1);
    let d = t.p(0, "d");
    fs::create_dir(&d).unwrap();
    let pd = stat(&d).unwrap();
    tick();
    let f = d.join("f");
    let h = open(&f, libc::O_CREAT | libc::O_WRONLY, 0o640).unwrap();
    let st = fstat(h.as_raw_fd()).unwrap();
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(st.st_mode & 0o7777, 0o640 & !umask());
    assert_eq!(st.st_size, 0);
    assert_eq!((st.st_uid, st.st_gid), (0, 0));
    drop(h);
    let pd2 = stat(&d).unwrap();
    assert!(mtime(&pd2) > mtime(&pd), "create updates parent mtime");
    assert!(ctime(&pd2) > ctime(&pd), "create updates parent ctime");
    // O_CREAT without O_EXCL on an existing file opens it, content kept
    fs::write(&f, b"keep").unwrap();
    let mut h = open(&f, libc::O_CREAT | libc::O_RDWR, 0o600).unwrap();
    let mut s = String::new();
    h.read_to_string(&mut s).unwrap();
    assert_eq!(s, "keep");
    assert_eq!(
        mode_of(&f) & 0o7777,
        0o640 & !umask(),
        "mode not changed by re-open"
    );
}

#[test]
fn mknod_fifo_and_socket() {
    let t = TestFs::new(1);
    let fifo = t.p(0, "fifo");
    let c = cstr(&fifo);
    io_res(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }).unwrap();
    assert_eq!(ftype(&fifo), libc::S_IFIFO);
    // a fifo in tierfs works as a fifo
    let mut h = open(&fifo, libc::O_RDWR | libc::O_NONBLOCK, 0).unwrap();
    h.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    h.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    drop(h);

    let sock = t.p(0, "sock");
    mknod(&sock, libc::S_IFSOCK | 0o600).unwrap();
    assert_eq!(ftype(&sock), libc::S_IFSOCK);
    assert_eq!(mode_of(&sock) & 0o777, 0o600 & !umask());

    let fifo2 = t.p(0, "fifo2");
    mknod(&fifo2, libc::S_IFIFO | 0o600).unwrap();
    assert_eq!(ftype(&fifo2), libc::S_IFIFO);

    let reg = t.p(0, "reg");
    mknod(&reg, libc::S_IFREG | 0o600).unwrap();
    assert_eq!(ftype(&reg), libc::S_IFREG);
    assert_eq!(stat(&reg).unwrap().st_size, 0);

    // bind(2) a unix socket inside the mount and talk through it
    let bound = t.p(0, "bound.sock");
    let listener = std::os::unix::net::UnixListener::bind(&bound).unwrap();
    assert_eq!(ftype(&bound), libc::S_IFSOCK);
    let mut client = std::os::unix::net::UnixStream::connect(&bound).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"hi").unwrap();
    let mut b2 = [0u8; 2];
    server.read_exact(&mut b2).unwrap();
    assert_eq!(&b2, b"hi");

    // all of them listed and removable
    let mut names: Vec<String> = fs::read_dir(t.mnt(0))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["bound.sock", "fifo", "fifo2", "reg", "sock"]);
    for n in names {
        fs::remove_file(t.p(0, &n)).unwrap();
    }
}

#[test]
fn open_append_trunc_excl() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"abc").unwrap();
    // O_APPEND: every write goes to the end, even after a seek, and with two handles
    let mut a = fs::OpenOptions::new().append(true).open(&f).unwrap();
    let mut b = fs::OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b"def").unwrap();
    b.write_all(b"ghi").unwrap();
    a.seek(SeekFrom::Start(0)).unwrap();
    a.write_all(b"jkl").unwrap();
    drop((a, b));
    assert_eq!(read_all(&f).unwrap(), b"abcdefghijkl");

    // O_TRUNC
    let h = open(&f, libc::O_WRONLY | libc::O_TRUNC, 0).unwrap();
    assert_eq!(fstat(h.as_raw_fd()).unwrap().st_size, 0);
    drop(h);
    assert_eq!(stat(&f).unwrap().st_size, 0);
    assert!(read_all(&f).unwrap().is_empty());

    // O_EXCL
    assert_errno(
        open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
        libc::EEXIST,
        "O_EXCL on an existing file",
    );
    let l = t.p(0, "dangling");
    std::os::unix::fs::symlink("nowhere", &l).unwrap();
    assert_errno(
        open(&l, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
        libc::EEXIST,
        "O_EXCL on a dangling symlink",
    );
    let n = t.p(0, "new");
    let h = open(&n, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).unwrap();
    drop(h);
    assert!(n.exists());
    // opening a directory for writing
    fs::create_dir(t.p(0, "d")).unwrap();
    assert_errno(
        open(&t.p(0, "d"), libc::O_WRONLY, 0),
        libc::EISDIR,
        "open dir O_WRONLY",
    );
    assert_errno(
        open(&t.p(0, "missing"), libc::O_RDONLY, 0),
        libc::ENOENT,
        "open missing",
    );
}

#[test]
fn read_write_offsets() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    let h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&f)
        .unwrap();
    let a = pattern(3, 0, 10_000);
    h.write_all_at(&a, 0).unwrap();
    let b = pattern(4, 0, 300);
    h.write_all_at(&b, 5_000).unwrap(); // overwrite the middle
    h.write_all_at(b"tail", 20_000).unwrap(); // beyond EOF: a gap
    let mut want = a.clone();
    want[5_000..5_300].copy_from_slice(&b);
    want.resize(20_000, 0);
    want.extend_from_slice(b"tail");
    assert_eq!(fstat(h.as_raw_fd()).unwrap().st_size, 20_004);
    // read through the same handle, then a fresh one
    let got = pread_exact(&h, 0, 20_004).unwrap();
    assert_same_bytes(&got, &want, 0, "same handle");
    let mut buf = [0u8; 16];
    assert_eq!(
        h.read_at(&mut buf, 20_004).unwrap(),
        0,
        "read at EOF gives 0"
    );
    assert_eq!(
        h.read_at(&mut buf, 1 << 30).unwrap(),
        0,
        "read past EOF gives 0"
    );
    assert_eq!(
        h.read_at(&mut buf, 19_998).unwrap(),
        6,
        "short read at the end"
    );
    drop(h);
    assert_same_bytes(&read_all(&f).unwrap(), &want, 0, "fresh open");
    // many small sequential writes
    let g = t.p(0, "g");
    let mut h = fs::File::create(&g).unwrap();
    let mut want = Vec::new();
    for i in 0..2000u32 {
        let chunk = format!("line {i}\n");
        h.write_all(chunk.as_bytes()).unwrap();
        want.extend_from_slice(chunk.as_bytes());
    }
    drop(h);
    assert_same_bytes(&read_all(&g).unwrap(), &want, 0, "small writes");
}

#[test]
fn fsync_and_fdatasync() {
    let t = TestFs::new(2);
    let f = t.p(0, "f");
    let h = fs::File::create(&f).unwrap();
    let data = pattern(5, 0, 200_000);
    h.write_all_at(&data, 0).unwrap();
    h.sync_all().expect("fsync");
    h.sync_data().expect("fdatasync");
    // data that was fsync'ed is in the shared tiers: another client opening now reads it
    let got = read_all(&t.p(1, "f")).unwrap();
    assert_same_bytes(&got, &data, 0, "c1 after fsync on c0 (writer still open)");
    drop(h);
    // fsync of a directory
    let d = fs::File::open(t.mnt(0)).unwrap();
    d.sync_all().expect("fsync on a directory");
}

// ---------------------------------------------------------------------------------------------
// directories
// ---------------------------------------------------------------------------------------------

#[test]
fn mkdir_rmdir() {
    let t = TestFs::new(1);
    let p = t.p(0, "p");
    fs::create_dir(&p).unwrap();
    let n0 = stat(&p).unwrap().st_nlink;
    assert_eq!(n0, 2, "empty directory has nlink 2");
    let d = p.join("d");
    mkdir(&d, 0o750).unwrap();
    let st = stat(&d).unwrap();
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFDIR);
    assert_eq!(st.st_mode & 0o7777, 0o750 & !umask());
    assert_eq!(
        stat(&p).unwrap().st_nlink,
        n0 + 1,
        "mkdir increments parent nlink"
    );
    assert_errno(mkdir(&d, 0o755), libc::EEXIST, "mkdir existing");
    fs::write(d.join("f"), b"x").unwrap();
    assert_errno(fs::remove_dir(&d), libc::ENOTEMPTY, "rmdir non-empty");
    assert_errno(fs::remove_dir(d.join("f")), libc::ENOTDIR, "rmdir a file");
    assert_errno(fs::remove_file(&d), libc::EISDIR, "unlink a directory");
    let dot = cstr(&d.join("."));
    assert_eq!(
        check(unsafe { libc::rmdir(dot.as_ptr()) }),
        Err(libc::EINVAL),
        "rmdir ."
    );
    fs::remove_file(d.join("f")).unwrap();
    fs::remove_dir(&d).unwrap();
    assert_eq!(
        stat(&p).unwrap().st_nlink,
        n0,
        "rmdir decrements parent nlink"
    );
    assert_errno(stat(&d), libc::ENOENT, "removed directory");
    assert_errno(fs::remove_dir(&d), libc::ENOENT, "rmdir missing");
}

#[test]
fn readdir_small_types_and_dots() {
    let t = TestFs::new(1);
    let d = t.p(0, "d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("file"), b"x").unwrap();
    fs::create_dir(d.join("dir")).unwrap();
    std::os::unix::fs::symlink("file", d.join("link")).unwrap();
    mknod(&d.join("fifo"), libc::S_IFIFO | 0o644).unwrap();
    let c = cstr(&d);
    let dir = unsafe { libc::opendir(c.as_ptr()) };
    assert!(!dir.is_null());
    let mut seen = std::collections::BTreeMap::new();
    loop {
        let e = unsafe { libc::readdir(dir) };
        if e.is_null() {
            break;
        }
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let ty = unsafe { (*e).d_type };
        assert!(
            seen.insert(name.clone(), ty).is_none(),
            "{name} listed twice"
        );
    }
    unsafe { libc::closedir(dir) };
    let names: Vec<&String> = seen.keys().collect();
    assert_eq!(names, [".", "..", "dir", "fifo", "file", "link"]);
    for (n, want) in [
        ("dir", libc::DT_DIR),
        ("file", libc::DT_REG),
        ("link", libc::DT_LNK),
        ("fifo", libc::DT_FIFO),
    ] {
        let got = seen[n];
        assert!(
            got == want || got == libc::DT_UNKNOWN,
            "d_type of {n}: got {got}, want {want}"
        );
    }
}

#[test]
fn readdir_100k_entries() {
    const N: usize = 100_000;
    const THREADS: usize = 4;
    let t = TestFs::with(Opts {
        clients: 2,
        timeout: Duration::from_secs(1500),
        ..Opts::default()
    });
    let d = t.p(0, "big");
    fs::create_dir(&d).unwrap();
    thread::scope(|s| {
        for k in 0..THREADS {
            let d = d.clone();
            s.spawn(move || {
                for i in (k..N).step_by(THREADS) {
                    let p = d.join(format!("entry-{i:06}"));
                    let c = cstr(&p);
                    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFREG | 0o644, 0) };
                    assert_eq!(
                        r,
                        0,
                        "mknod {}: {}",
                        p.display(),
                        io::Error::last_os_error()
                    );
                }
            });
        }
    });
    for client in 0..2 {
        let mut names: Vec<String> = fs::read_dir(t.p(client, "big"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), N, "c{client}: number of entries");
        names.sort();
        for (i, n) in names.iter().enumerate() {
            assert_eq!(n, &format!("entry-{i:06}"), "c{client}: entry {i}");
        }
    }
    assert!(t.p(1, "big/entry-099999").exists());
    assert_eq!(stat(&t.p(1, "big/entry-054321")).unwrap().st_size, 0);
}

// ---------------------------------------------------------------------------------------------
// unlink / rename / link / symlink
// ---------------------------------------------------------------------------------------------

#[test]
fn unlink_while_open() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    let data = pattern(6, 0, 300_000);
    fs::write(&f, &data).unwrap();
    let r = fs::File::open(&f).unwrap();
    let w = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f)
        .unwrap();
    fs::remove_file(&f).unwrap();
    assert_errno(stat(&f), libc::ENOENT, "name gone after unlink");
    assert_eq!(
        fstat(r.as_raw_fd()).unwrap().st_nlink,
        0,
        "nlink 0 while open"
    );
    assert!(fs::read_dir(t.mnt(0))
        .unwrap()
        .all(|e| e.unwrap().file_name() != "f"));
    // still readable, and writable, through the open handles
    assert_same_bytes(
        &pread_exact(&r, 0, data.len()).unwrap(),
        &data,
        0,
        "after unlink",
    );
    w.write_all_at(b"XYZ", 10).unwrap();
    assert_eq!(pread_exact(&r, 10, 3).unwrap(), b"XYZ");
    // a new file with the same name is a different file
    fs::write(&f, b"new").unwrap();
    assert_eq!(read_all(&f).unwrap(), b"new");
    thread::sleep(Duration::from_secs(2));
    let mut want = data.clone();
    want[10..13].copy_from_slice(b"XYZ");
    assert_same_bytes(&pread_exact(&r, 0, data.len()).unwrap(), &want, 0, "later");
    drop(w);
    assert_same_bytes(
        &pread_exact(&r, 0, data.len()).unwrap(),
        &want,
        0,
        "after one close",
    );
    drop(r);
    assert_eq!(read_all(&f).unwrap(), b"new");
}

#[test]
fn rename_across_directories() {
    let t = TestFs::new(1);
    let (a, b) = (t.p(0, "a"), t.p(0, "b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    fs::write(a.join("f"), b"data").unwrap();
    let st0 = stat(&a.join("f")).unwrap();
    let (sa, sb) = (stat(&a).unwrap(), stat(&b).unwrap());
    tick();
    fs::rename(a.join("f"), b.join("g")).unwrap();
    assert_errno(stat(&a.join("f")), libc::ENOENT, "old name");
    let st = stat(&b.join("g")).unwrap();
    assert_eq!(st.st_ino, st0.st_ino, "same inode after rename");
    assert_eq!(st.st_nlink, 1);
    assert!(ctime(&st) > ctime(&st0), "rename updates the file's ctime");
    assert_eq!(read_all(&b.join("g")).unwrap(), b"data");
    let (sa2, sb2) = (stat(&a).unwrap(), stat(&b).unwrap());
    assert!(mtime(&sa2) > mtime(&sa), "source dir mtime");
    assert!(mtime(&sb2) > mtime(&sb), "target dir mtime");
    assert_eq!(
        sa2.st_nlink, sa.st_nlink,
        "file move does not change dir nlink"
    );

    // a directory moving between parents moves its ".." link
    fs::create_dir(a.join("sub")).unwrap();
    fs::write(a.join("sub/inner"), b"in").unwrap();
    let (na, nb) = (stat(&a).unwrap().st_nlink, stat(&b).unwrap().st_nlink);
    fs::rename(a.join("sub"), b.join("sub")).unwrap();
    assert_eq!(stat(&a).unwrap().st_nlink, na - 1, "old parent nlink");
    assert_eq!(stat(&b).unwrap().st_nlink, nb + 1, "new parent nlink");
    assert_eq!(
        stat(&b.join("sub/..")).unwrap().st_ino,
        stat(&b).unwrap().st_ino,
        "'..' of a moved directory"
    );
    assert_eq!(read_all(&b.join("sub/inner")).unwrap(), b"in");
    // into its own subtree
    assert_errno(
        fs::rename(&b, b.join("sub/b")),
        libc::EINVAL,
        "rename a directory into itself",
    );
    assert_errno(
        fs::rename(t.p(0, "nothing"), t.p(0, "x")),
        libc::ENOENT,
        "rename missing",
    );
}

#[test]
fn rename_over_existing_file() {
    let t = TestFs::new(1);
    let (f1, f2, f2l) = (t.p(0, "f1"), t.p(0, "f2"), t.p(0, "f2link"));
    fs::write(&f1, b"one").unwrap();
    fs::write(&f2, b"two").unwrap();
    fs::hard_link(&f2, &f2l).unwrap();
    let i1 = stat(&f1).unwrap().st_ino;
    let before = stat(&f2l).unwrap();
    assert_eq!(before.st_nlink, 2);
    tick();
    fs::rename(&f1, &f2).unwrap();
    assert_errno(stat(&f1), libc::ENOENT, "source name");
    assert_eq!(stat(&f2).unwrap().st_ino, i1);
    assert_eq!(read_all(&f2).unwrap(), b"one");
    let after = stat(&f2l).unwrap();
    assert_eq!(after.st_nlink, 1, "replaced inode lost one link");
    assert!(
        ctime(&after) > ctime(&before),
        "replaced inode's ctime updated"
    );
    assert_eq!(read_all(&f2l).unwrap(), b"two");
    // rename onto another link of the same inode: nothing happens
    fs::hard_link(&f2, t.p(0, "alias")).unwrap();
    fs::rename(&f2, t.p(0, "alias")).unwrap();
    assert!(f2.exists() && t.p(0, "alias").exists(), "both links kept");
    assert_eq!(stat(&f2).unwrap().st_nlink, 2);
    // kinds that may not replace each other
    fs::create_dir(t.p(0, "dir")).unwrap();
    assert_errno(
        fs::rename(&f2, t.p(0, "dir")),
        libc::EISDIR,
        "file over dir",
    );
    assert_errno(
        fs::rename(t.p(0, "dir"), &f2),
        libc::ENOTDIR,
        "dir over file",
    );
}

#[test]
fn rename_over_empty_directory() {
    let t = TestFs::new(1);
    let (d1, d2, d3) = (t.p(0, "d1"), t.p(0, "d2"), t.p(0, "d3"));
    fs::create_dir(&d1).unwrap();
    fs::write(d1.join("f"), b"x").unwrap();
    fs::create_dir(&d2).unwrap();
    fs::create_dir(&d3).unwrap();
    fs::write(d3.join("g"), b"y").unwrap();
    let i1 = stat(&d1).unwrap().st_ino;
    let nroot = stat(t.mnt(0)).unwrap().st_nlink;
    fs::rename(&d1, &d2).unwrap();
    assert_eq!(stat(&d2).unwrap().st_ino, i1);
    assert_eq!(read_all(&d2.join("f")).unwrap(), b"x");
    assert_errno(stat(&d1), libc::ENOENT, "old dir name");
    assert_eq!(
        stat(t.mnt(0)).unwrap().st_nlink,
        nroot - 1,
        "one subdirectory fewer in the parent"
    );
    let e = fs::rename(&d2, &d3).unwrap_err();
    assert!(
        matches!(err_of(&e), libc::ENOTEMPTY | libc::EEXIST),
        "rename over a non-empty dir: {e}"
    );
    assert_eq!(read_all(&d3.join("g")).unwrap(), b"y");
}

#[test]
fn rename_noreplace() {
    let t = TestFs::new(1);
    let (a, b, c) = (t.p(0, "a"), t.p(0, "b"), t.p(0, "c"));
    fs::write(&a, b"A").unwrap();
    fs::write(&b, b"B").unwrap();
    assert_errno(
        rename2(&a, &b, libc::RENAME_NOREPLACE),
        libc::EEXIST,
        "NOREPLACE",
    );
    assert_eq!(read_all(&a).unwrap(), b"A");
    assert_eq!(read_all(&b).unwrap(), b"B");
    rename2(&a, &c, libc::RENAME_NOREPLACE).unwrap();
    assert_errno(stat(&a), libc::ENOENT, "moved");
    assert_eq!(read_all(&c).unwrap(), b"A");
}

#[test]
fn rename_exchange() {
    let t = TestFs::new(1);
    let (p, q) = (t.p(0, "p"), t.p(0, "q"));
    fs::create_dir(&p).unwrap();
    fs::create_dir(&q).unwrap();
    let (f, d) = (p.join("f"), q.join("d"));
    fs::write(&f, b"file").unwrap();
    fs::create_dir(&d).unwrap();
    fs::write(d.join("inner"), b"in").unwrap();
    let (fi, di) = (stat(&f).unwrap().st_ino, stat(&d).unwrap().st_ino);
    let (np, nq) = (stat(&p).unwrap().st_nlink, stat(&q).unwrap().st_nlink);
    let before = stat(&f).unwrap();
    tick();
    rename2(&f, &d, libc::RENAME_EXCHANGE).unwrap();
    // p/f is now the directory, q/d the file
    assert_eq!(stat(&f).unwrap().st_ino, di);
    assert_eq!(ftype(&f), libc::S_IFDIR);
    assert_eq!(read_all(&f.join("inner")).unwrap(), b"in");
    assert_eq!(stat(&d).unwrap().st_ino, fi);
    assert_eq!(read_all(&d).unwrap(), b"file");
    assert_eq!(
        stat(&p).unwrap().st_nlink,
        np + 1,
        "p gained a subdirectory"
    );
    assert_eq!(stat(&q).unwrap().st_nlink, nq - 1, "q lost a subdirectory");
    assert_eq!(
        stat(&f.join("..")).unwrap().st_ino,
        stat(&p).unwrap().st_ino,
        "'..' follows the exchanged directory"
    );
    assert!(
        ctime(&stat(&d).unwrap()) > ctime(&before),
        "exchange updates ctime"
    );
    assert_errno(
        rename2(&f, &t.p(0, "none"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
        "EXCHANGE with a missing target",
    );
    // two files in one directory
    let (x, y) = (p.join("x"), p.join("y"));
    fs::write(&x, b"xx").unwrap();
    fs::write(&y, b"yyy").unwrap();
    rename2(&x, &y, libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(read_all(&x).unwrap(), b"yyy");
    assert_eq!(read_all(&y).unwrap(), b"xx");
}

#[test]
fn hard_links() {
    let t = TestFs::new(1);
    let (f, l) = (t.p(0, "f"), t.p(0, "sub/l"));
    fs::create_dir(t.p(0, "sub")).unwrap();
    fs::write(&f, b"linked").unwrap();
    let before = stat(&f).unwrap();
    tick();
    fs::hard_link(&f, &l).unwrap();
    let (sf, sl) = (stat(&f).unwrap(), stat(&l).unwrap());
    assert_eq!(sf.st_ino, sl.st_ino);
    assert_eq!(sf.st_nlink, 2);
    assert_eq!(sl.st_nlink, 2);
    assert!(ctime(&sf) > ctime(&before), "link updates ctime");
    // writes through one name show through the other
    fs::OpenOptions::new()
        .write(true)
        .open(&l)
        .unwrap()
        .write_all_at(b"L", 0)
        .unwrap();
    assert_eq!(read_all(&f).unwrap(), b"Linked");
    assert_errno(
        fs::hard_link(&f, &l),
        libc::EEXIST,
        "link to an existing name",
    );
    fs::create_dir(t.p(0, "d")).unwrap();
    assert_errno(
        fs::hard_link(t.p(0, "d"), t.p(0, "dl")),
        libc::EPERM,
        "link a dir",
    );
    fs::remove_file(&f).unwrap();
    assert_eq!(stat(&l).unwrap().st_nlink, 1);
    assert_eq!(read_all(&l).unwrap(), b"Linked");
}

#[test]
fn symlink_and_readlink() {
    let t = TestFs::new(1);
    fs::create_dir(t.p(0, "d")).unwrap();
    fs::write(t.p(0, "d/target"), b"through").unwrap();
    let l = t.p(0, "l");
    std::os::unix::fs::symlink("d/target", &l).unwrap();
    let st = lstat(&l).unwrap();
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        st.st_size,
        "d/target".len() as i64,
        "symlink size is its length"
    );
    assert_eq!(fs::read_link(&l).unwrap(), Path::new("d/target"));
    assert_eq!(read_all(&l).unwrap(), b"through");
    // absolute, dangling, long targets are stored verbatim
    let long: String = "x/".repeat(2000) + "end";
    for (name, target) in [
        ("abs", "/etc/hostname".to_string()),
        ("dangling", "no/such/thing".to_string()),
        ("long", long),
    ] {
        let p = t.p(0, name);
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert_eq!(fs::read_link(&p).unwrap(), Path::new(&target), "{name}");
    }
    assert_errno(
        fs::metadata(t.p(0, "dangling")),
        libc::ENOENT,
        "follow dangling",
    );
    assert_errno(
        std::os::unix::fs::symlink("x", &l),
        libc::EEXIST,
        "symlink over an existing name",
    );
    assert_errno(
        fs::read_link(t.p(0, "d/target")),
        libc::EINVAL,
        "readlink a file",
    );
    // a symlink to a directory can be traversed
    std::os::unix::fs::symlink("d", t.p(0, "dl")).unwrap();
    assert_eq!(read_all(&t.p(0, "dl/target")).unwrap(), b"through");
}

// ---------------------------------------------------------------------------------------------
// statfs / xattrs / fallocate / sparse
// ---------------------------------------------------------------------------------------------

#[test]
fn statfs_reports_sane_values() {
    let t = TestFs::new(1);
    let s = statvfs(t.mnt(0)).unwrap();
    assert!(s.f_bsize > 0, "f_bsize");
    assert!(s.f_frsize > 0, "f_frsize");
    assert!(s.f_blocks > 0, "f_blocks");
    assert!(s.f_bfree <= s.f_blocks, "f_bfree <= f_blocks");
    assert!(s.f_bavail <= s.f_blocks, "f_bavail <= f_blocks");
    assert!(
        s.f_files == 0 || s.f_ffree <= s.f_files,
        "f_ffree <= f_files"
    );
    assert_eq!(s.f_namemax, 255, "f_namemax");
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    io_res(unsafe { libc::statfs(cstr(t.mnt(0)).as_ptr(), &mut sf) }).unwrap();
    assert_eq!(sf.f_type, 0x6573_5546, "FUSE_SUPER_MAGIC");
}

/// `df -i`: the inodes in use (f_files - f_ffree) follow creates and unlinks at once, on
/// every client (statfs asks the engine for the count each time: no cache).
#[test]
fn statfs_counts_the_inodes_in_use() {
    let t = TestFs::new(2);
    let used = |i: usize| {
        let s = statvfs(t.mnt(i)).unwrap();
        s.f_files - s.f_ffree
    };
    let base = used(0);
    assert_eq!(used(1), base, "both clients count the same");
    fs::create_dir(t.p(0, "d")).unwrap();
    for i in 0..10 {
        fs::write(t.p(0, &format!("d/f{i}")), vec![7u8; 5000]).unwrap();
    }
    std::os::unix::fs::symlink("f0", t.p(0, "d/l")).unwrap();
    fs::hard_link(t.p(0, "d/f0"), t.p(0, "d/f0-too")).unwrap();
    assert_eq!(
        used(0),
        base + 12,
        "a directory, 10 files, a symlink; a hard link is none"
    );
    assert_eq!(used(1), base + 12, "and the other client");
    // A file unlinked while open counts until its last close, and closes reach the engine in
    // batches (the close-recorder, every 50 ms): let the writes' closes land first.
    thread::sleep(Duration::from_millis(500));
    for i in 0..10 {
        fs::remove_file(t.p(1, &format!("d/f{i}"))).unwrap();
    }
    assert_eq!(used(0), base + 3, "f0 keeps its second name");
    fs::remove_file(t.p(0, "d/f0-too")).unwrap();
    fs::remove_file(t.p(0, "d/l")).unwrap();
    fs::remove_dir(t.p(0, "d")).unwrap();
    assert_eq!(used(0), base);
    assert_eq!(used(1), base);
}

#[test]
fn xattrs_set_get_list_remove() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    assert_errno(getxattr(&f, "user.none"), libc::ENODATA, "get missing");
    assert_eq!(
        listxattr(&f).unwrap(),
        Vec::<String>::new(),
        "no xattrs yet"
    );
    setxattr(&f, "user.foo", b"bar", 0).unwrap();
    let bin: Vec<u8> = (0..=255u8).chain([0, 0, 1]).collect();
    setxattr(&f, "user.bin", &bin, 0).unwrap();
    setxattr(&f, "user.empty", b"", 0).unwrap();
    assert_eq!(getxattr(&f, "user.foo").unwrap(), b"bar");
    assert_eq!(
        getxattr(&f, "user.bin").unwrap(),
        bin,
        "binary value with NULs"
    );
    assert_eq!(getxattr(&f, "user.empty").unwrap(), b"");
    let mut names = listxattr(&f).unwrap();
    names.sort();
    assert_eq!(names, ["user.bin", "user.empty", "user.foo"]);
    // size probe, ERANGE
    let (c, n) = (cstr(&f), CString::new("user.foo").unwrap());
    let len = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(len, 3, "size probe");
    let mut small = [0u8; 2];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), small.as_mut_ptr().cast(), 2) };
    assert_eq!((r, errno()), (-1, libc::ERANGE), "buffer too small");
    let mut lsmall = [0u8; 3];
    let r = unsafe { libc::listxattr(c.as_ptr(), lsmall.as_mut_ptr().cast(), 3) };
    assert_eq!((r, errno()), (-1, libc::ERANGE), "list buffer too small");
    // XATTR_CREATE / XATTR_REPLACE
    assert_errno(
        setxattr(&f, "user.foo", b"x", libc::XATTR_CREATE),
        libc::EEXIST,
        "XATTR_CREATE on an existing name",
    );
    assert_errno(
        setxattr(&f, "user.nope", b"x", libc::XATTR_REPLACE),
        libc::ENODATA,
        "XATTR_REPLACE on a missing name",
    );
    setxattr(&f, "user.foo", b"replaced value", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&f, "user.foo").unwrap(), b"replaced value");
    // a large value
    let big = pattern(7, 0, 3_000);
    setxattr(&f, "user.big", &big, 0).unwrap();
    assert_eq!(getxattr(&f, "user.big").unwrap(), big);
    // remove
    removexattr(&f, "user.foo").unwrap();
    assert_errno(getxattr(&f, "user.foo"), libc::ENODATA, "get after remove");
    assert_errno(removexattr(&f, "user.foo"), libc::ENODATA, "remove twice");
    assert!(!listxattr(&f).unwrap().contains(&"user.foo".to_string()));
    // directories carry xattrs; user.* on a symlink is refused
    let d = t.p(0, "d");
    fs::create_dir(&d).unwrap();
    setxattr(&d, "user.dir", b"yes", 0).unwrap();
    assert_eq!(getxattr(&d, "user.dir").unwrap(), b"yes");
    std::os::unix::fs::symlink("f", t.p(0, "l")).unwrap();
    assert_errno(
        lsetxattr(&t.p(0, "l"), "user.x", b"1"),
        libc::EPERM,
        "user.* on a symlink",
    );
    // xattrs survive a rename and are removed with the file
    fs::rename(&f, t.p(0, "g")).unwrap();
    assert_eq!(getxattr(&t.p(0, "g"), "user.bin").unwrap(), bin);
}

/// A client answers "no such attribute" from memory for a file whose attributes said it has
/// no xattrs, for attr_ttl (schema v9, docs/semantics.md): another client's setxattr (and
/// default ACL) is seen within that bound, this client's own at once, and a file with xattrs
/// lists and reads them everywhere at once.
#[test]
fn xattrs_of_another_client_seen_within_attr_ttl() {
    const TTL: f64 = 0.5;
    let slack = Duration::from_millis(700);
    let t = TestFs::with(Opts {
        clients: 2,
        attr_ttl: Some(TTL),
        ..Opts::default()
    });
    let local = |i: usize| stat_value(t.mnt(i), "tierfs_xattr_answered_locally_total");
    fs::write(t.p(0, "f"), b"x").unwrap();
    fs::create_dir(t.p(0, "d")).unwrap();
    // c1 looks f up: no xattrs, answered without the engine.
    stat(&t.p(1, "f")).unwrap();
    let before = local(1);
    assert_errno(getxattr(&t.p(1, "f"), "user.k"), libc::ENODATA, "none yet");
    assert!(listxattr(&t.p(1, "f")).unwrap().is_empty());
    assert!(
        local(1) >= before + 2,
        "c1 answered from the file's attributes ({} -> {})",
        before,
        local(1)
    );
    // c0 sets one: c1 sees it within attr_ttl.
    setxattr(&t.p(0, "f"), "user.k", b"v", 0).unwrap();
    std::thread::sleep(Duration::from_secs_f64(TTL) + slack);
    assert_eq!(
        getxattr(&t.p(1, "f"), "user.k").ok().as_deref(),
        Some(&b"v"[..]),
        "c0's setxattr seen on c1 after attr_ttl"
    );
    assert_eq!(listxattr(&t.p(1, "f")).unwrap(), ["user.k"]);
    // c1's own setxattr is seen by c1 at once, though it had just learnt the file had none.
    fs::write(t.p(1, "g"), b"y").unwrap();
    stat(&t.p(1, "g")).unwrap();
    assert_errno(getxattr(&t.p(1, "g"), "user.a"), libc::ENODATA, "none yet");
    setxattr(&t.p(1, "g"), "user.a", b"1", 0).unwrap();
    assert_eq!(
        getxattr(&t.p(1, "g"), "user.a").unwrap(),
        b"1",
        "own change"
    );
    assert_eq!(listxattr(&t.p(1, "g")).unwrap(), ["user.a"]);
    removexattr(&t.p(1, "g"), "user.a").unwrap();
    assert_errno(getxattr(&t.p(1, "g"), "user.a"), libc::ENODATA, "removed");
    // A file made with an xattr on c0 reads and lists it on c1 at once (its attributes, from
    // the lookup or the listing, count it).
    fs::write(t.p(0, "d/h"), b"z").unwrap();
    setxattr(&t.p(0, "d/h"), "user.x", b"2", 0).unwrap();
    let listed: Vec<String> = fs::read_dir(t.p(1, "d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, ["h"]);
    assert_eq!(getxattr(&t.p(1, "d/h"), "user.x").unwrap(), b"2");
    assert_eq!(listxattr(&t.p(1, "d/h")).unwrap(), ["user.x"]);
    // A default ACL set on c0 is inherited by what c1 creates after attr_ttl, though c1 had
    // learnt the directory had no xattrs.
    stat(&t.p(1, "d")).unwrap();
    setxattr(
        &t.p(0, "d"),
        ACL_DEFAULT,
        &acl_xattr(&[
            (A_USER_OBJ, 7, NO_ID),
            (A_USER, 7, U2),
            (A_GROUP_OBJ, 5, NO_ID),
            (A_MASK, 7, NO_ID),
            (A_OTHER, 0, NO_ID),
        ]),
        0,
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs_f64(TTL) + slack);
    fs::write(t.p(1, "d/new"), b"n").unwrap();
    assert!(
        getxattr(&t.p(1, "d/new"), ACL_ACCESS).is_ok(),
        "c1's create after attr_ttl inherits c0's default ACL"
    );
    assert!(getxattr(&t.p(0, "d/new"), ACL_ACCESS).is_ok());
}

#[test]
fn fallocate_modes() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    let h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&f)
        .unwrap();
    let fd = h.as_raw_fd();
    io_res(unsafe { libc::fallocate(fd, 0, 0, 1 << 20) }).expect("fallocate mode 0");
    assert_eq!(
        fstat(fd).unwrap().st_size,
        1 << 20,
        "fallocate extends the size"
    );
    assert!(pread_exact(&h, 0, 1 << 20).unwrap().iter().all(|b| *b == 0));
    io_res(unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20) })
        .expect("fallocate KEEP_SIZE");
    assert_eq!(
        fstat(fd).unwrap().st_size,
        1 << 20,
        "KEEP_SIZE keeps the size"
    );
    // fallocate inside existing data keeps it
    let data = pattern(8, 0, 4096);
    h.write_all_at(&data, 1000).unwrap();
    io_res(unsafe { libc::fallocate(fd, 0, 0, 8192) }).unwrap();
    assert_same_bytes(
        &pread_exact(&h, 1000, 4096).unwrap(),
        &data,
        1000,
        "kept data",
    );
    assert_eq!(fstat(fd).unwrap().st_size, 1 << 20);
    // punching a hole is optional; if it is accepted, the hole reads as zeros
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            2000,
            1000,
        )
    };
    if r == 0 {
        let got = pread_exact(&h, 1000, 4096).unwrap();
        assert_same_bytes(&got[..1000], &data[..1000], 1000, "before hole");
        assert!(
            got[1000..2000].iter().all(|b| *b == 0),
            "punched hole reads zeros"
        );
        assert_same_bytes(&got[2000..], &data[2000..], 3000, "after hole");
    } else {
        assert_eq!(
            errno(),
            libc::EOPNOTSUPP,
            "punch hole: only EOPNOTSUPP is acceptable"
        );
    }
    drop(h);
    assert_eq!(stat(&f).unwrap().st_size, 1 << 20);
}

#[test]
fn sparse_file_holes_read_zeros() {
    let t = TestFs::new(2);
    let f = t.p(0, "sparse");
    let h = fs::File::create(&f).unwrap();
    let at = 10 * 1024 * 1024 + 3;
    h.write_all_at(b"end", at).unwrap();
    h.write_all_at(b"mid", 3 * 1024 * 1024).unwrap();
    drop(h);
    for c in 0..2 {
        let got = read_all(&t.p(c, "sparse")).unwrap();
        assert_eq!(got.len() as u64, at + 3, "c{c}: size");
        let mut want = vec![0u8; got.len()];
        want[3 * 1024 * 1024..3 * 1024 * 1024 + 3].copy_from_slice(b"mid");
        want[at as usize..].copy_from_slice(b"end");
        assert_same_bytes(&got, &want, 0, &format!("c{c}: sparse file"));
    }
}

#[test]
fn offsets_beyond_4gib() {
    let t = TestFs::new(2);
    let f = t.p(0, "huge");
    let h = fs::File::create(&f).unwrap();
    let four = 1u64 << 32;
    let a = pattern(9, four - 5000, 10_000); // straddles 4 GiB
    h.write_all_at(&a, four - 5000).unwrap();
    let far = 5 * (1u64 << 30) + 123;
    let b = pattern(10, far, 70_000);
    h.write_all_at(&b, far).unwrap();
    let size = far + b.len() as u64;
    assert_eq!(fstat(h.as_raw_fd()).unwrap().st_size as u64, size);
    drop(h);
    for c in 0..2 {
        let p = t.p(c, "huge");
        assert_eq!(stat(&p).unwrap().st_size as u64, size, "c{c}: size");
        let r = fs::File::open(&p).unwrap();
        assert_same_bytes(
            &pread_exact(&r, four - 5000, a.len()).unwrap(),
            &a,
            four - 5000,
            &format!("c{c}: around 4 GiB"),
        );
        assert_same_bytes(
            &pread_exact(&r, far, b.len()).unwrap(),
            &b,
            far,
            &format!("c{c}: at 5 GiB"),
        );
        for off in [0u64, 1 << 31, four + 5000, four + (1 << 29), far - 4096] {
            let z = pread_exact(&r, off, 4096).unwrap();
            assert!(z.iter().all(|b| *b == 0), "c{c}: hole at {off} reads zeros");
        }
        let mut buf = [0u8; 10];
        assert_eq!(r.read_at(&mut buf, size).unwrap(), 0, "EOF beyond 5 GiB");
    }
    // truncate beyond 4 GiB and back
    let w = fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.set_len(four + 1).unwrap();
    assert_eq!(stat(&f).unwrap().st_size as u64, four + 1);
}

// ---------------------------------------------------------------------------------------------
// locks
// ---------------------------------------------------------------------------------------------

#[test]
fn flock_same_client() {
    let t = TestFs::new(1);
    let f = t.p(0, "lock");
    fs::write(&f, b"").unwrap();
    let a = fs::File::open(&f).unwrap();
    let b = fs::File::open(&f).unwrap();
    flock(&a, libc::LOCK_EX).unwrap();
    let e = flock(&b, libc::LOCK_EX | libc::LOCK_NB).unwrap_err();
    assert_eq!(err_of(&e), libc::EWOULDBLOCK, "second exclusive flock: {e}");
    let e = flock(&b, libc::LOCK_SH | libc::LOCK_NB).unwrap_err();
    assert_eq!(err_of(&e), libc::EWOULDBLOCK, "shared under exclusive: {e}");
    flock(&a, libc::LOCK_UN).unwrap();
    flock(&b, libc::LOCK_SH | libc::LOCK_NB).unwrap();
    flock(&a, libc::LOCK_SH | libc::LOCK_NB).expect("two shared flocks");
    drop(b);
    drop(a);
    let c = fs::File::open(&f).unwrap();
    flock(&c, libc::LOCK_EX | libc::LOCK_NB).expect("locks released on close");
}

#[test]
fn flock_across_clients() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "lock"), b"").unwrap();
    let a = fs::File::open(t.p(0, "lock")).unwrap();
    let b = fs::File::open(t.p(1, "lock")).unwrap();
    flock(&a, libc::LOCK_EX).unwrap();
    let e = flock(&b, libc::LOCK_EX | libc::LOCK_NB)
        .expect_err("flock LOCK_EX on c1 must fail while c0 holds LOCK_EX");
    assert_eq!(err_of(&e), libc::EWOULDBLOCK, "{e}");
    flock(&a, libc::LOCK_UN).unwrap();
    flock(&b, libc::LOCK_EX | libc::LOCK_NB).expect("c1 locks after c0 unlocked");
    let e = flock(&a, libc::LOCK_SH | libc::LOCK_NB)
        .expect_err("c0 shared lock must fail while c1 holds LOCK_EX");
    assert_eq!(err_of(&e), libc::EWOULDBLOCK, "{e}");
    drop(b); // close releases
    assert!(
        wait_until(Duration::from_secs(5), || flock(
            &a,
            libc::LOCK_EX | libc::LOCK_NB
        )
        .is_ok()),
        "c0 could not lock after c1 closed its handle"
    );
}

/// Runs `f` in a forked child process (same credentials): POSIX record locks belong to a
/// process, so conflicts need a second one.
fn in_child<F: FnOnce()>(f: F) {
    as_user(&Cred::new(0, 0).groups(&[0]), f)
}

#[test]
fn fcntl_locks_same_client() {
    let t = TestFs::new(1);
    let f = t.p(0, "lock");
    fs::write(&f, vec![0u8; 1000]).unwrap();
    let a = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f)
        .unwrap();
    fcntl_lock(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100).unwrap();
    let p = f.clone();
    in_child(move || {
        let b = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let e = fcntl_lock(&b, libc::F_SETLK, libc::F_WRLCK, 50, 10).unwrap_err();
        assert!(is_would_block(&e), "overlapping write lock: {e}");
        let e = fcntl_lock(&b, libc::F_SETLK, libc::F_RDLCK, 0, 1).unwrap_err();
        assert!(is_would_block(&e), "read lock under write lock: {e}");
        fcntl_lock(&b, libc::F_SETLK, libc::F_WRLCK, 100, 100).expect("disjoint range");
        let g = fcntl_lock(&b, libc::F_GETLK, libc::F_WRLCK, 0, 10).unwrap();
        assert_eq!(g.l_type as i32, libc::F_WRLCK, "F_GETLK sees the conflict");
        assert_eq!((g.l_start, g.l_len), (0, 100), "F_GETLK range");
    });
    fcntl_lock(&a, libc::F_SETLK, libc::F_UNLCK, 0, 100).unwrap();
    let p = f.clone();
    in_child(move || {
        let b = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        fcntl_lock(&b, libc::F_SETLK, libc::F_WRLCK, 0, 100).expect("after unlock");
    });
}

#[test]
fn fcntl_locks_across_clients() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "lock"), vec![0u8; 1000]).unwrap();
    let a = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.p(0, "lock"))
        .unwrap();
    fcntl_lock(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100).unwrap();
    let p1 = t.p(1, "lock");
    let p = p1.clone();
    in_child(move || {
        let b = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let e = fcntl_lock(&b, libc::F_SETLK, libc::F_WRLCK, 0, 10)
            .expect_err("c1 F_SETLK must fail while c0 holds a write lock");
        assert!(is_would_block(&e), "{e}");
        let g = fcntl_lock(&b, libc::F_GETLK, libc::F_WRLCK, 0, 10).unwrap();
        assert_eq!(g.l_type as i32, libc::F_WRLCK, "c1 F_GETLK sees c0's lock");
        fcntl_lock(&b, libc::F_SETLK, libc::F_WRLCK, 100, 100).expect("disjoint range on c1");
    });
    // a lock is released when its holder closes the file
    drop(a);
    let p = p1.clone();
    in_child(move || {
        let b = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        fcntl_lock(&b, libc::F_SETLK, libc::F_WRLCK, 0, 100).expect("c1 after c0 closed");
    });
}

/// Child side: opens `path` read-write, or exits.
fn child_open(path: &CString) -> i32 {
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR) };
    if fd < 0 {
        unsafe { libc::_exit(4) };
    }
    fd
}

/// Child side: F_SETLKW of a write lock on bytes 0..100; 0 or the errno.
fn child_setlkw(fd: i32) -> i32 {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 100;
    if unsafe { libc::fcntl(fd, libc::F_SETLKW, &mut fl) } == 0 {
        0
    } else {
        unsafe { *libc::__errno_location() }
    }
}

extern "C" fn on_alarm(_: libc::c_int) {}

/// Whether bytes 0..100 of `f`'s file are free of other owners' locks (F_GETLK from this
/// process), checked twice a second apart.
fn lock_free_for(f: &fs::File) -> Result<(), String> {
    for _ in 0..2 {
        let g = fcntl_lock(f, libc::F_GETLK, libc::F_WRLCK, 0, 100).map_err(|e| e.to_string())?;
        if g.l_type as i32 != libc::F_UNLCK {
            return Err(format!(
                "held: type {} range {}+{} pid {}",
                g.l_type, g.l_start, g.l_len, g.l_pid
            ));
        }
        thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

/// Interruptible lock waits (issue 12): a process blocked in F_SETLKW on one client, behind a
/// lock another client holds, gets EINTR when a signal interrupts the wait (SIGALRM, handler
/// without SA_RESTART); then, while it keeps the file open (so no close releases anything),
/// the holder unlocks and nobody holds the lock: the abandoned wait took nothing.
#[test]
fn fcntl_setlkw_interrupted_by_a_signal_gets_eintr_and_takes_no_lock() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "lock"), vec![0u8; 1000]).unwrap();
    let a = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.p(0, "lock"))
        .unwrap();
    fcntl_lock(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100).unwrap();
    let path = cstr(&t.p(1, "lock"));
    let child = RawChild::spawn(|wfd| unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as usize;
        sa.sa_flags = 0; // no SA_RESTART
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let fd = child_open(&path);
        libc::alarm(1);
        tell(wfd, child_setlkw(fd));
        // keep the file open: a close would release whatever this process holds
        loop {
            libc::pause();
        }
    });
    let got = child.report(Duration::from_secs(10));
    // whatever happened, the holder unlocks now (a wait that is still blocked ends)
    fcntl_lock(&a, libc::F_SETLK, libc::F_UNLCK, 0, 100).unwrap();
    let got = got.expect("F_SETLKW was not interrupted by SIGALRM within 10 s");
    assert_eq!(
        got,
        libc::EINTR,
        "F_SETLKW interrupted by a signal: {}",
        errname(got)
    );
    // a wait that went on after the EINTR would take the lock now, within its 100 ms retry
    lock_free_for(&a).expect("after the interrupted waiter and the holder's unlock, the lock");
    fcntl_lock(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100)
        .expect("the holder's client takes the lock again");
    drop(child);
}

/// The same for `flock`: a blocked LOCK_EX interrupted by a signal gets EINTR, and once the
/// holder unlocks, the lock is free although the interrupted process keeps its file open.
#[test]
fn flock_wait_interrupted_by_a_signal_gets_eintr_and_takes_no_lock() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "lock"), b"").unwrap();
    let a = fs::File::open(t.p(0, "lock")).unwrap();
    flock(&a, libc::LOCK_EX).unwrap();
    let path = cstr(&t.p(1, "lock"));
    let child = RawChild::spawn(|wfd| unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as usize;
        sa.sa_flags = 0; // no SA_RESTART
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let fd = child_open(&path);
        libc::alarm(1);
        let r = libc::flock(fd, libc::LOCK_EX);
        tell(wfd, if r == 0 { 0 } else { *libc::__errno_location() });
        loop {
            libc::pause();
        }
    });
    let got = child.report(Duration::from_secs(10));
    flock(&a, libc::LOCK_UN).unwrap();
    let got = got.expect("flock(LOCK_EX) was not interrupted by SIGALRM within 10 s");
    assert_eq!(
        got,
        libc::EINTR,
        "flock interrupted by a signal: {}",
        errname(got)
    );
    // a wait that went on after the EINTR would take the lock now, within its 100 ms retry
    thread::sleep(Duration::from_secs(1));
    let b = fs::File::open(t.p(0, "lock")).unwrap();
    flock(&b, libc::LOCK_EX | libc::LOCK_NB)
        .expect("the lock is free after the interrupted waiter and the holder's unlock");
    drop(child);
}

/// A process blocked in F_SETLKW that is killed (SIGKILL) dies at once, and leaves no lock
/// behind once the holder unlocks.
#[test]
fn fcntl_setlkw_waiter_killed_leaves_no_lock() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "lock"), vec![0u8; 1000]).unwrap();
    let a = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.p(0, "lock"))
        .unwrap();
    fcntl_lock(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100).unwrap();
    let path = cstr(&t.p(1, "lock"));
    let mut child = RawChild::spawn(|wfd| unsafe {
        let fd = child_open(&path);
        tell(wfd, -1);
        tell(wfd, child_setlkw(fd));
        loop {
            libc::pause();
        }
    });
    assert_eq!(
        child.report(Duration::from_secs(10)),
        Some(-1),
        "child ready"
    );
    // let the F_SETLKW reach the daemon and wait there
    thread::sleep(Duration::from_secs(1));
    assert_eq!(
        child.report(Duration::ZERO),
        None,
        "F_SETLKW returned while the lock is held"
    );
    child.kill(libc::SIGKILL);
    let died = child.reaped_within(Duration::from_secs(10));
    fcntl_lock(&a, libc::F_SETLK, libc::F_UNLCK, 0, 100).unwrap();
    assert!(
        died,
        "the killed waiter stayed in its F_SETLKW for 10 s (until the lock was free)"
    );
    lock_free_for(&a).expect("after the killed waiter and the holder's unlock, the lock");
    fcntl_lock(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100)
        .expect("the holder's client takes the lock again");
}

// ---------------------------------------------------------------------------------------------
// permissions as non-root users
// ---------------------------------------------------------------------------------------------

const U1: u32 = 1000;
const U2: u32 = 1001;
const U3: u32 = 1002;
const G1: u32 = 2000;
const G2: u32 = 3000;

#[test]
fn permissions_mode_bits() {
    let t = TestFs::new(1);
    let d = t.p(0, "pub");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o755).unwrap();
    fs::write(d.join("secret"), b"s").unwrap();
    chmod(&d.join("secret"), 0o600).unwrap();
    fs::write(d.join("readable"), b"r").unwrap();
    chmod(&d.join("readable"), 0o644).unwrap();
    fs::create_dir(d.join("nox")).unwrap();
    fs::write(d.join("nox/inner"), b"i").unwrap();
    chmod(&d.join("nox"), 0o744).unwrap();
    fs::write(d.join("script"), b"#!/bin/sh\nexit 0\n").unwrap();
    chmod(&d.join("script"), 0o744).unwrap();
    let d2 = d.clone();
    as_user(&Cred::new(U1, U1), move || {
        let d = d2;
        assert_errno(
            fs::File::open(d.join("secret")),
            libc::EACCES,
            "read 0600 file",
        );
        assert_eq!(read_all(&d.join("readable")).unwrap(), b"r");
        assert_errno(
            fs::OpenOptions::new().write(true).open(d.join("readable")),
            libc::EACCES,
            "write 0644 file",
        );
        assert_errno(
            fs::File::create(d.join("new")),
            libc::EACCES,
            "create in 0755 dir",
        );
        assert_errno(
            fs::create_dir(d.join("newdir")),
            libc::EACCES,
            "mkdir in 0755 dir",
        );
        assert_errno(
            fs::remove_file(d.join("readable")),
            libc::EACCES,
            "unlink in 0755 dir",
        );
        assert_errno(
            fs::rename(d.join("readable"), d.join("moved")),
            libc::EACCES,
            "rename in 0755 dir",
        );
        assert_errno(stat(&d.join("nox/inner")), libc::EACCES, "lookup without x");
        assert_errno(
            fs::OpenOptions::new()
                .write(true)
                .open(d.join("readable"))
                .and_then(|f| f.set_len(0)),
            libc::EACCES,
            "truncate without w",
        );
        let c = cstr(&d.join("readable"));
        assert_eq!(
            check(unsafe { libc::truncate(c.as_ptr(), 0) }),
            Err(libc::EACCES),
            "truncate(2) without w"
        );
        assert_errno(
            setxattr(&d.join("readable"), "user.x", b"1", 0),
            libc::EACCES,
            "setxattr without w",
        );
        assert_errno(
            utimens(&d.join("readable"), Some([ts(1, 0), ts(1, 0)]), 0),
            libc::EPERM,
            "explicit utimens by non-owner",
        );
        assert_errno(
            utimens(&d.join("readable"), None, 0),
            libc::EACCES,
            "utimens(NOW) without w",
        );
        let c = cstr(&d.join("script"));
        assert_eq!(
            check(unsafe { libc::access(c.as_ptr(), libc::X_OK) }),
            Err(libc::EACCES),
            "access X_OK on 0744"
        );
        assert_errno(
            chmod(&d.join("readable"), 0o777),
            libc::EPERM,
            "chmod by non-owner",
        );
        assert_errno(
            chown(&d.join("readable"), U1, U1),
            libc::EPERM,
            "chown by non-owner",
        );
    });
}

#[test]
fn permissions_owner() {
    let t = TestFs::new(1);
    let w = world_dir(&t, "w");
    let f = w.join("mine");
    fs::write(&f, b"own").unwrap();
    chown(&f, U1, U1).unwrap();
    chmod(&f, 0o600).unwrap();
    let f2 = f.clone();
    as_user(&Cred::new(U1, U1).groups(&[U1, G1]), move || {
        let f = f2;
        assert_eq!(read_all(&f).unwrap(), b"own");
        fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .unwrap()
            .write_all(b"er")
            .unwrap();
        chmod(&f, 0o640).expect("owner may chmod");
        utimens(&f, Some([ts(100, 0), ts(200, 0)]), 0).expect("owner may set times");
        assert_errno(chown(&f, U2, u32::MAX), libc::EPERM, "give away ownership");
        assert_errno(
            chown(&f, u32::MAX, G2),
            libc::EPERM,
            "chgrp to a group not ours",
        );
        chown(&f, u32::MAX, G1).expect("chgrp to a supplementary group of ours");
        chown(&f, U1, U1).expect("chown to ourselves");
    });
    let st = stat(&f).unwrap();
    assert_eq!(st.st_mode & 0o7777, 0o640);
    assert_eq!(st.st_mtime, 200);
    assert_eq!(read_all(&f).unwrap(), b"owner");
    let f2 = f.clone();
    as_user(&Cred::new(U2, U2), move || {
        assert_errno(fs::File::open(&f2), libc::EACCES, "other user reads 0640");
        assert_errno(chmod(&f2, 0o666), libc::EPERM, "other user chmods");
    });
    // objects created by a user belong to that user and their primary group
    let w2 = w.clone();
    as_user(&Cred::new(U2, G2).groups(&[G2]), move || {
        fs::write(w2.join("f"), b"x").unwrap();
        fs::create_dir(w2.join("d")).unwrap();
        std::os::unix::fs::symlink("f", w2.join("l")).unwrap();
        mknod(&w2.join("p"), libc::S_IFIFO | 0o600).unwrap();
        fs::hard_link(w2.join("f"), w2.join("h")).unwrap();
    });
    for n in ["f", "d", "l", "p", "h"] {
        let st = lstat(&w.join(n)).unwrap();
        assert_eq!(
            (st.st_uid, st.st_gid),
            (U2, G2),
            "owner of {n} created by uid {U2}"
        );
    }
}

#[test]
fn permissions_group_and_supplementary() {
    let t = TestFs::new(1);
    let f = t.p(0, "g");
    fs::write(&f, b"grp").unwrap();
    chown(&f, 0, G1).unwrap();
    chmod(&f, 0o640).unwrap();
    let o = t.p(0, "o");
    fs::write(&o, b"oth").unwrap();
    chown(&o, 0, G1).unwrap();
    chmod(&o, 0o604).unwrap();
    let (f1, o1) = (f.clone(), o.clone());
    as_user(&Cred::new(U1, G1), move || {
        assert_eq!(read_all(&f1).unwrap(), b"grp", "primary group may read");
        assert_errno(
            fs::OpenOptions::new().write(true).open(&f1),
            libc::EACCES,
            "group may not write",
        );
        assert_errno(
            fs::File::open(&o1),
            libc::EACCES,
            "group class applies, not other",
        );
    });
    let (f1, o1) = (f.clone(), o.clone());
    as_user(&Cred::new(U1, G2).groups(&[G2, G1]), move || {
        assert_eq!(
            read_all(&f1).unwrap(),
            b"grp",
            "supplementary group may read"
        );
        assert_errno(
            fs::File::open(&o1),
            libc::EACCES,
            "supplementary group class",
        );
    });
    let (f1, o1) = (f.clone(), o.clone());
    as_user(&Cred::new(U1, G2).groups(&[G2]), move || {
        assert_errno(fs::File::open(&f1), libc::EACCES, "not in the group");
        assert_eq!(read_all(&o1).unwrap(), b"oth", "other class may read 0604");
    });
    // group-writable directory
    let d = t.p(0, "gd");
    fs::create_dir(&d).unwrap();
    chown(&d, 0, G1).unwrap();
    chmod(&d, 0o770).unwrap();
    let d1 = d.clone();
    as_user(&Cred::new(U1, G2).groups(&[G1]), move || {
        fs::write(d1.join("x"), b"1").expect("create in group-writable dir via supplementary");
    });
    let d1 = d.clone();
    as_user(&Cred::new(U2, G2).groups(&[G2]), move || {
        assert_errno(fs::read_dir(&d1), libc::EACCES, "list 0770 dir as other");
    });
}

#[test]
fn sticky_directory_deletion_rules() {
    let t = TestFs::new(1);
    let s = t.p(0, "sticky");
    fs::create_dir(&s).unwrap();
    chown(&s, U3, U3).unwrap();
    chmod(&s, 0o1777).unwrap();
    assert_eq!(mode_of(&s) & 0o7777, 0o1777);
    let s1 = s.clone();
    as_user(&Cred::new(U1, U1), move || {
        fs::write(s1.join("a"), b"a").unwrap();
        fs::write(s1.join("a2"), b"a2").unwrap();
    });
    let s1 = s.clone();
    as_user(&Cred::new(U2, U2), move || {
        fs::write(s1.join("b"), b"b").unwrap();
        fs::write(s1.join("b2"), b"b2").unwrap();
        assert_errno(
            fs::remove_file(s1.join("a")),
            libc::EPERM,
            "unlink other's file",
        );
        assert_errno(
            fs::rename(s1.join("a"), s1.join("c")),
            libc::EPERM,
            "rename other's file",
        );
        assert_errno(
            fs::rename(s1.join("b"), s1.join("a")),
            libc::EPERM,
            "rename over other's file",
        );
        fs::remove_file(s1.join("b")).expect("unlink own file");
    });
    let s1 = s.clone();
    as_user(&Cred::new(U1, U1), move || {
        fs::remove_file(s1.join("a")).expect("owner unlinks own file");
    });
    let s1 = s.clone();
    as_user(&Cred::new(U3, U3), move || {
        fs::remove_file(s1.join("b2")).expect("directory owner unlinks anyone's file");
    });
    assert!(s.join("a2").exists() && !s.join("b2").exists());
    // without the sticky bit anyone with write permission may delete
    chmod(&s, 0o777).unwrap();
    let s1 = s.clone();
    as_user(&Cred::new(U2, U2), move || {
        fs::remove_file(s1.join("a2")).expect("non-sticky dir: unlink other's file");
    });
}

#[test]
fn setgid_directory_inheritance() {
    let t = TestFs::new(1);
    let g = t.p(0, "sgid");
    fs::create_dir(&g).unwrap();
    chown(&g, 0, G1).unwrap();
    chmod(&g, 0o2777).unwrap();
    assert_eq!(mode_of(&g) & 0o7777, 0o2777);
    let g1 = g.clone();
    as_user(&Cred::new(U1, U1).groups(&[U1]), move || {
        fs::write(g1.join("f"), b"x").unwrap();
        fs::create_dir(g1.join("sub")).unwrap();
        mknod(&g1.join("fifo"), libc::S_IFIFO | 0o644).unwrap();
    });
    let st = stat(&g.join("f")).unwrap();
    assert_eq!(
        (st.st_uid, st.st_gid),
        (U1, G1),
        "file inherits the directory's group"
    );
    let st = stat(&g.join("fifo")).unwrap();
    assert_eq!(st.st_gid, G1, "fifo inherits the directory's group");
    let st = stat(&g.join("sub")).unwrap();
    assert_eq!(
        (st.st_uid, st.st_gid),
        (U1, G1),
        "subdirectory inherits the group"
    );
    assert_ne!(
        st.st_mode & libc::S_ISGID,
        0,
        "subdirectory inherits S_ISGID"
    );
    // and grandchildren
    fs::write(g.join("sub/deeper"), b"y").unwrap();
    assert_eq!(stat(&g.join("sub/deeper")).unwrap().st_gid, G1);
    // a non-member owner setting S_ISGID on a file: the bit is silently dropped
    let w = world_dir(&t, "w");
    let f = w.join("own");
    fs::write(&f, b"x").unwrap();
    chown(&f, U1, G2).unwrap();
    let f1 = f.clone();
    as_user(&Cred::new(U1, U1).groups(&[U1]), move || {
        chmod(&f1, 0o2755).expect("chmod g+s by owner");
    });
    assert_eq!(
        mode_of(&f) & 0o7777,
        0o755,
        "S_ISGID dropped for an owner outside the file's group"
    );
}

#[test]
fn write_by_non_root_clears_setuid() {
    let t = TestFs::new(1);
    let w = world_dir(&t, "w");
    // one file written at an offset, one through an O_APPEND handle
    for name in ["pwrite", "append"] {
        let f = w.join(name);
        fs::write(&f, b"#!/bin/sh\n").unwrap();
        chown(&f, U1, U1).unwrap();
        chmod(&f, 0o4777).unwrap();
    }
    let w1 = w.clone();
    as_user(&Cred::new(U2, U2), move || {
        fs::OpenOptions::new()
            .write(true)
            .open(w1.join("pwrite"))
            .unwrap()
            .write_all_at(b"echo\n", 10)
            .unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(w1.join("append"))
            .unwrap()
            .write_all(b"echo\n")
            .unwrap();
    });
    let modes: Vec<(&str, u32)> = ["pwrite", "append"]
        .iter()
        .map(|n| (*n, mode_of(&w.join(n)) & 0o7777))
        .collect();
    assert!(
        modes.iter().all(|(_, m)| *m == 0o777),
        "a write by another user must clear S_ISUID (want 0777): {modes:?}"
    );
}

/// The kernel's rules for chown (fs/attr.c: notify_change with ATTR_KILL_SUID|ATTR_KILL_SGID for
/// every non-directory): setuid goes; setgid goes when group-executable or when the caller is
/// neither in the file's (old) group nor root. Directories keep both. Checked against ext4.
#[test]
fn chown_drops_setuid_setgid_by_the_kernel_rules() {
    let t = TestFs::new(1);
    let w = world_dir(&t, "w");
    let kinds: [(&str, u32); 5] = [
        ("file", libc::S_IFREG),
        ("fifo", libc::S_IFIFO),
        ("sock", libc::S_IFSOCK),
        ("chr", libc::S_IFCHR),
        ("dir", libc::S_IFDIR),
    ];
    for (name, kind) in kinds {
        let p = w.join(name);
        if kind == libc::S_IFDIR {
            mkdir(&p, 0o755).unwrap();
        } else {
            mknod(&p, kind | 0o644).unwrap();
        }
        chown(&p, U1, G1).unwrap();
        chmod(&p, 0o6555).unwrap();
        assert_eq!(mode_of(&p) & 0o7777, 0o6555, "{name}: chmod 06555");
    }
    let w1 = w.clone();
    as_user(&Cred::new(U1, U1).groups(&[G1, G2]), move || {
        for (name, _) in kinds {
            chown(&w1.join(name), U1, G2).expect("chgrp by the owner");
        }
    });
    for (name, kind) in kinds {
        let want = if kind == libc::S_IFDIR { 0o6555 } else { 0o555 };
        let st = lstat(&w.join(name)).unwrap();
        assert_eq!(
            (st.st_mode & 0o7777, st.st_uid, st.st_gid),
            (want, U1, G2),
            "{name}: chown by its non-root owner (Linux gives {want:o})"
        );
    }
    // setgid without group-execute: kept for root, and for an owner in the file's group;
    // dropped for an owner outside it.
    let f = w.join("sgid");
    fs::write(&f, b"x").unwrap();
    chmod(&f, 0o6745).unwrap();
    chown(&f, U1, G2).unwrap();
    assert_eq!(
        mode_of(&f) & 0o7777,
        0o2745,
        "root: setuid dropped, setgid kept"
    );
    let f1 = f.clone();
    as_user(&Cred::new(U1, U1).groups(&[G1]), move || {
        chown(&f1, U1, G1).expect("chgrp by the owner");
    });
    assert_eq!(
        mode_of(&f) & 0o7777,
        0o745,
        "owner outside the file's group: setgid dropped"
    );
    // chown(-1, -1) changes no owner but drops the bits all the same (the kernel sends an
    // empty setattr); not for a directory; utimes does not drop them
    let x = w.join("x");
    fs::write(&x, b"x").unwrap();
    chmod(&x, 0o6755).unwrap();
    utimens(&x, None, 0).unwrap();
    assert_eq!(mode_of(&x) & 0o7777, 0o6755, "utimes keeps setuid");
    chown(&x, u32::MAX, u32::MAX).unwrap();
    assert_eq!(
        mode_of(&x) & 0o7777,
        0o755,
        "chown(-1, -1) of a file (ext4: 0755)"
    );
    let d = w.join("sdir");
    mkdir(&d, 0o755).unwrap();
    chmod(&d, 0o6755).unwrap();
    chown(&d, u32::MAX, u32::MAX).unwrap();
    assert_eq!(mode_of(&d) & 0o7777, 0o6755, "chown(-1, -1) of a directory");
}

/// The mode by statx(STATX_MODE), as `stat -c %a` asks: the kernel answers from its cache
/// unless it knows the mode changed.
fn statx_mode(p: &Path) -> u32 {
    let c = cstr(p);
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    io_res(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MODE,
            &mut st,
        )
    })
    .unwrap();
    st.stx_mode as u32 & 0o7777
}

/// A write that drops setuid is seen by the writer's very next stat, not after the attribute
/// TTL (the kernel caches the mode; a write only makes it refetch size and times).
#[test]
fn writer_sees_setuid_dropped_at_once() {
    let t = TestFs::new(1);
    let w = world_dir(&t, "w");
    for name in ["pwrite", "append"] {
        let f = w.join(name);
        fs::File::create(&f).unwrap();
        chown(&f, U1, U1).unwrap();
        chmod(&f, 0o6777).unwrap();
    }
    let w1 = w.clone();
    as_user(&Cred::new(U1, U1), move || {
        for name in ["pwrite", "append"] {
            let p = w1.join(name);
            let mut f = fs::OpenOptions::new()
                .write(true)
                .append(name == "append")
                .open(&p)
                .unwrap();
            // the kernel has the mode cached now
            assert_eq!(fstat(f.as_raw_fd()).unwrap().st_mode & 0o7777, 0o6777);
            if name == "append" {
                f.write_all(b"echo\n").unwrap();
            } else {
                f.write_all_at(b"echo\n", 10).unwrap();
            }
            assert_eq!(
                statx_mode(&p),
                0o777,
                "{name}: the writer's statx(STATX_MODE) right after its write"
            );
        }
    });
}

/// A mount whose every new file is RW-cached (an `rw` rule matching all names).
fn all_rw_pcc(limit_secs: u64) -> TestFs {
    let mut t = TestFs::with(Opts {
        clients: 0,
        timeout: Duration::from_secs(limit_secs),
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
    let o = ClientOpts {
        name: "c0".into(),
        cache_dir: Some(t.root().join("cache0")),
        cache_size: Some("1G".into()),
        ..Default::default()
    };
    t.mount_with(&o);
    t
}

fn assert_rw_cached(t: &TestFs, p: &Path) {
    let out = t.tierfs(&["pcc", "state", &p.to_string_lossy()]);
    out.assert_ok();
    assert!(
        out.stdout.contains("type: readwrite"),
        "{} should be RW-cached: {}",
        p.display(),
        out.stdout
    );
}

/// RW-PCC: an unprivileged write drops setuid/setgid as on any file (the writer of such a file
/// is not given passthrough, whose writes never reach the daemon).
#[test]
fn rw_pcc_write_by_non_root_drops_setuid() {
    let t = all_rw_pcc(120);
    let w = world_dir(&t, "w");
    let f = w.join("exe");
    fs::write(&f, b"#!/bin/sh\n").unwrap();
    assert_rw_cached(&t, &f);
    chown(&f, U1, U1).unwrap();
    chmod(&f, 0o6777).unwrap();
    let f1 = f.clone();
    as_user(&Cred::new(U2, U2), move || {
        let mut h = fs::OpenOptions::new().append(true).open(&f1).unwrap();
        h.write_all(b"echo\n").unwrap();
        assert_eq!(fstat(h.as_raw_fd()).unwrap().st_mode & 0o7777, 0o777);
    });
    assert_eq!(mode_of(&f) & 0o7777, 0o777, "setuid and setgid dropped");
    assert_eq!(fs::read(&f).unwrap(), b"#!/bin/sh\necho\n");
}

/// RW-PCC: fallocate changes the cached file (the size is the cache file's), as pjdfstest's
/// posix_fallocate tests check.
#[test]
fn rw_pcc_fallocate_extends_the_cached_file() {
    let t = all_rw_pcc(120);
    let p = t.p(0, "f");
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_rw_cached(&t, &p);
    f.write_all_at(&[7u8; 1234], 0).unwrap();
    assert_eq!(
        unsafe { libc::posix_fallocate(f.as_raw_fd(), 20_000, 3456) },
        0,
        "posix_fallocate"
    );
    assert_eq!(lstat(&p).unwrap().st_size, 23_456);
    // KEEP_SIZE allocates without changing the size
    io_res(unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 100_000) })
        .unwrap();
    assert_eq!(fstat(f.as_raw_fd()).unwrap().st_size, 23_456);
    let data = fs::read(&p).unwrap();
    assert_eq!(data.len(), 23_456);
    assert!(data[..1234].iter().all(|&b| b == 7) && data[1234..].iter().all(|&b| b == 0));
}

/// RW-PCC: files deleted just before the unmount (before the cache's periodic check saw them
/// go) are dropped from the cache at the unmount, not "written back" with an error each (seen
/// in the pjdfstest RW-PCC run: one ERROR line per deleted file).
#[test]
fn rw_pcc_unmount_drops_files_deleted_since() {
    let mut t = all_rw_pcc(120);
    for i in 0..5 {
        let p = t.p(0, &format!("f{i}"));
        fs::write(&p, b"soon gone").unwrap();
        assert_rw_cached(&t, &p);
    }
    for i in 0..5 {
        fs::remove_file(t.p(0, &format!("f{i}"))).unwrap();
    }
    t.umount(0);
    let log = fs::read_to_string(t.log_path("c0")).unwrap();
    assert!(
        !log.contains("write-back at unmount failed"),
        "unmount log:\n{log}"
    );
    let mut left = Vec::new();
    let mut stack = vec![t.root().join("cache0")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.path().parent().and_then(|p| p.file_name()) == Some("data".as_ref()) {
                left.push(e.path());
            }
        }
    }
    assert!(
        left.is_empty(),
        "cache files of deleted files left: {left:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// POSIX ACLs
// ---------------------------------------------------------------------------------------------

const ACL_ACCESS: &str = "system.posix_acl_access";
const ACL_DEFAULT: &str = "system.posix_acl_default";

/// An ACL xattr value (version 2; entries of tag, permissions, id).
fn acl_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// An extended access ACL: owner rw, user U1 rwx, group owner r, mask rw, other nothing.
fn ext_acl_rw_u1_rwx() -> Vec<u8> {
    acl_xattr(&[
        (A_USER_OBJ, 6, NO_ID),
        (A_USER, 7, U1),
        (A_GROUP_OBJ, 4, NO_ID),
        (A_MASK, 6, NO_ID),
        (A_OTHER, 0, NO_ID),
    ])
}

const A_USER_OBJ: u16 = 0x01;
const A_USER: u16 = 0x02;
const A_GROUP_OBJ: u16 = 0x04;
const A_MASK: u16 = 0x10;
const A_OTHER: u16 = 0x20;
const NO_ID: u32 = u32::MAX;

/// Runs a command (setfacl, getfacl, cp) with a 60 s bound; its stdout, or a panic with stderr.
#[track_caller]
fn run(args: &[&str]) -> String {
    let out = std::process::Command::new("timeout")
        .arg("60")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e} (setfacl/getfacl: Debian package acl)"));
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `cp -a` and `cp -p` copy a file's ACL as an ACL equal to its mode: the copies keep their
/// modes (0644 files, 0755 directories, 0600 stays 0600), with no ACL stored, and other users
/// read them as on ext4 (the reported bug: 0600/0700 and `-rw-------+`).
#[test]
fn acl_cp_a_and_cp_p_keep_modes() {
    let t = TestFs::new(1);
    let src = t.root().join("src");
    fs::create_dir(&src).unwrap();
    chmod(&src, 0o755).unwrap();
    fs::write(src.join("f"), b"hello").unwrap();
    chmod(&src.join("f"), 0o644).unwrap();
    fs::create_dir(src.join("d")).unwrap();
    chmod(&src.join("d"), 0o755).unwrap();
    fs::write(src.join("d/private"), b"secret").unwrap();
    chmod(&src.join("d/private"), 0o600).unwrap();
    fs::write(src.join("x"), b"#!/bin/sh\n").unwrap();
    chmod(&src.join("x"), 0o755).unwrap();
    let dst = t.p(0, "copy");
    run(&["cp", "-a", &s(&src), &s(&dst)]);
    run(&["cp", "-p", &s(&src.join("f")), &s(&t.p(0, "f-p"))]);
    for (rel, want) in [
        ("copy", 0o755),
        ("copy/f", 0o644),
        ("copy/d", 0o755),
        ("copy/d/private", 0o600),
        ("copy/x", 0o755),
        ("f-p", 0o644),
    ] {
        let p = t.p(0, rel);
        assert_eq!(mode_of(&p) & 0o7777, want, "{rel}: mode after cp");
        assert_errno(getxattr(&p, ACL_ACCESS), libc::ENODATA, "no ACL stored");
        assert!(
            !run(&["ls", "-ld", &s(&p)])
                .split_whitespace()
                .next()
                .unwrap()
                .ends_with('+'),
            "{rel}: ls shows no ACL"
        );
    }
    let d = dst.clone();
    as_user(&Cred::new(U1, U1), move || {
        assert_eq!(fs::read(d.join("f")).unwrap(), b"hello");
        assert_eq!(fs::read_dir(d.join("d")).unwrap().count(), 1);
        assert_errno(fs::read(d.join("d/private")), libc::EACCES, "0600 file");
    });
}

/// Access ACLs are enforced for other users (the kernel reads them: FUSE_POSIX_ACL), and the
/// mode's group bits show the mask.
#[test]
fn acl_access_enforced_for_other_users() {
    let t = TestFs::new(1);
    let w = world_dir(&t, "w");
    let open_f = w.join("open");
    fs::write(&open_f, b"o").unwrap();
    chmod(&open_f, 0o644).unwrap();
    run(&["setfacl", "-m", &format!("u:{U1}:---"), &s(&open_f)]);
    let closed = w.join("closed");
    fs::write(&closed, b"c").unwrap();
    chmod(&closed, 0o600).unwrap();
    run(&["setfacl", "-m", &format!("u:{U1}:rw"), &s(&closed)]);
    assert_eq!(mode_of(&closed) & 0o777, 0o660, "group bits = mask rw-");
    assert_eq!(
        mode_of(&open_f) & 0o777,
        0o644,
        "group bits = mask r-- (setfacl: the union)"
    );
    let (o, c) = (open_f.clone(), closed.clone());
    as_user(&Cred::new(U1, U1), move || {
        assert_errno(
            fs::read(&o),
            libc::EACCES,
            "named user denied on a 0644 file",
        );
        assert_eq!(
            fs::read(&c).unwrap(),
            b"c",
            "named user allowed on a 0600 file"
        );
        fs::write(&c, b"by u1").expect("named user may write");
    });
    let (o, c) = (open_f.clone(), closed.clone());
    as_user(&Cred::new(U2, U2), move || {
        assert_eq!(
            fs::read(&o).unwrap(),
            b"o",
            "others still read the 0644 file"
        );
        assert_errno(fs::read(&c), libc::EACCES, "others denied on the 0600 file");
    });
    // a directory ACL: U1 may list and enter, U2 not
    let d = w.join("dir");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o700).unwrap();
    fs::write(d.join("inside"), b"i").unwrap();
    run(&["setfacl", "-m", &format!("u:{U1}:rx"), &s(&d)]);
    let d1 = d.clone();
    as_user(&Cred::new(U1, U1), move || {
        assert_eq!(fs::read_dir(&d1).unwrap().count(), 1);
    });
    let d2 = d.clone();
    as_user(&Cred::new(U2, U2), move || {
        assert_errno(fs::read_dir(&d2).map(|_| ()), libc::EACCES, "not named");
    });
    // removing the ACL (setfacl -b) leaves the mode's bits, and U1 is denied again
    run(&["setfacl", "-b", &s(&closed)]);
    assert_errno(getxattr(&closed, ACL_ACCESS), libc::ENODATA, "ACL removed");
    assert_eq!(mode_of(&closed) & 0o777, 0o600);
    let c = closed.clone();
    as_user(&Cred::new(U1, U1), move || {
        assert_errno(fs::read(&c), libc::EACCES, "after setfacl -b");
    });
}

/// Mode and ACL stay in step both ways: chmod rewrites the owner, mask and other entries;
/// setting an access ACL sets the mode; an ACL equal to the mode is kept as the mode only.
#[test]
fn acl_and_mode_in_step() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    chmod(&f, 0o600).unwrap();
    // raw xattr: u::rwx g::r-x o::r-- is the mode 0754, stored as the mode alone
    let plain = acl_xattr(&[
        (A_USER_OBJ, 7, NO_ID),
        (A_GROUP_OBJ, 5, NO_ID),
        (A_OTHER, 4, NO_ID),
    ]);
    setxattr(&f, ACL_ACCESS, &plain, 0).unwrap();
    assert_eq!(mode_of(&f) & 0o7777, 0o754, "the ACL set the mode");
    assert_errno(
        getxattr(&f, ACL_ACCESS),
        libc::ENODATA,
        "stored as the mode",
    );
    assert!(!listxattr(&f).unwrap().iter().any(|n| n == ACL_ACCESS));
    // an extended ACL is stored and sets the group bits from its mask
    let ext = ext_acl_rw_u1_rwx();
    setxattr(&f, ACL_ACCESS, &ext, 0).unwrap();
    assert_eq!(mode_of(&f) & 0o7777, 0o660);
    assert_eq!(getxattr(&f, ACL_ACCESS).unwrap(), ext);
    // chmod rewrites owner, mask, other; the named entry and the group owner stay
    chmod(&f, 0o741).unwrap();
    let want = acl_xattr(&[
        (A_USER_OBJ, 7, NO_ID),
        (A_USER, 7, U1),
        (A_GROUP_OBJ, 4, NO_ID),
        (A_MASK, 4, NO_ID),
        (A_OTHER, 1, NO_ID),
    ]);
    assert_eq!(
        getxattr(&f, ACL_ACCESS).unwrap(),
        want,
        "chmod updated the ACL"
    );
    let text = run(&["getfacl", "-c", "-n", &s(&f)]);
    assert!(
        text.contains(&format!("user:{U1}:rwx\t#effective:r--")) && text.contains("mask::r--"),
        "getfacl after chmod 741:\n{text}"
    );
    // setfacl -m m::rwx sets the group bits
    run(&["setfacl", "-m", "m::rwx", &s(&f)]);
    assert_eq!(mode_of(&f) & 0o7777, 0o771);
    // malformed ACLs: EINVAL, nothing changed
    for bad in [
        vec![2u8, 0, 0, 0, 1, 0],
        acl_xattr(&[
            (A_GROUP_OBJ, 4, NO_ID),
            (A_USER_OBJ, 6, NO_ID),
            (A_OTHER, 0, NO_ID),
        ]),
        acl_xattr(&[
            (A_USER_OBJ, 6, NO_ID),
            (A_USER, 7, U1),
            (A_GROUP_OBJ, 4, NO_ID),
            (A_OTHER, 0, NO_ID),
        ]),
        acl_xattr(&[
            (A_USER_OBJ, 9, NO_ID),
            (A_GROUP_OBJ, 4, NO_ID),
            (A_OTHER, 0, NO_ID),
        ]),
    ] {
        assert_errno(
            setxattr(&f, ACL_ACCESS, &bad, 0),
            libc::EINVAL,
            "malformed ACL",
        );
    }
    assert_eq!(mode_of(&f) & 0o7777, 0o771, "unchanged by malformed ACLs");
    // a default ACL is for directories only
    assert_errno(
        setxattr(&f, ACL_DEFAULT, &plain, 0),
        libc::EACCES,
        "default ACL on a file",
    );
}

/// A fresh filesystem mounted by one client per (name, client config).
fn fs_with_clients(clients: &[(&str, Option<&str>)]) -> TestFs {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    for (name, config) in clients {
        t.mount_with(&ClientOpts {
            name: name.to_string(),
            config: config.map(str::to_string),
            ..Default::default()
        });
    }
    t
}

/// `posix_acl = false` in the client config: no ACLs, as ext4's noacl (EOPNOTSUPP), while
/// `cp -a` still gives the modes of the source.
#[test]
fn acl_off_by_config() {
    let t = fs_with_clients(&[("c0", Some("posix_acl = false\n"))]);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    chmod(&f, 0o640).unwrap();
    let ext = ext_acl_rw_u1_rwx();
    assert_errno(
        setxattr(&f, ACL_ACCESS, &ext, 0),
        libc::EOPNOTSUPP,
        "ACLs off",
    );
    assert_eq!(mode_of(&f) & 0o7777, 0o640);
    assert_cp_a_keeps_modes(&t.root().join("src"), &t.p(0, "copy"), 0o755, 0o644);
}

/// `cp -a` of a directory (mode `dir_mode`) holding a file (`file_mode`) made at `src` gives
/// `dst` the same modes and contents.
fn assert_cp_a_keeps_modes(src: &Path, dst: &Path, dir_mode: u32, file_mode: u32) {
    fs::create_dir(src).unwrap();
    chmod(src, dir_mode).unwrap();
    fs::write(src.join("g"), b"y").unwrap();
    chmod(&src.join("g"), file_mode).unwrap();
    run(&["cp", "-a", &s(src), &s(dst)]);
    assert_eq!(mode_of(dst) & 0o7777, dir_mode);
    assert_eq!(mode_of(&dst.join("g")) & 0o7777, file_mode);
    assert_eq!(fs::read(dst.join("g")).unwrap(), b"y");
}

/// `xattrs = false` in the client config: no extended attributes on that mount (EOPNOTSUPP for
/// every xattr call, ACLs too), as JuiceFS without --enable-xattr; `ls -l` and `cp -a` work and
/// keep the modes; what another client (xattrs on) stores stays there, untouched.
#[test]
fn xattrs_off_by_config() {
    let t = fs_with_clients(&[("off", Some("xattrs = false\n")), ("on", None)]);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    chmod(&f, 0o640).unwrap();
    // Stored through the client with xattrs.
    setxattr(&t.p(1, "f"), "user.k", b"v", 0).unwrap();
    assert_errno(setxattr(&f, "user.k2", b"w", 0), libc::EOPNOTSUPP, "set");
    assert_errno(getxattr(&f, "user.k"), libc::EOPNOTSUPP, "get");
    assert_errno(listxattr(&f), libc::EOPNOTSUPP, "list");
    assert_errno(removexattr(&f, "user.k"), libc::EOPNOTSUPP, "remove");
    let ext = ext_acl_rw_u1_rwx();
    assert_errno(setxattr(&f, ACL_ACCESS, &ext, 0), libc::EOPNOTSUPP, "ACL");
    assert_eq!(mode_of(&f) & 0o7777, 0o640);
    // The other client still has its attribute, and no other.
    assert_eq!(getxattr(&t.p(1, "f"), "user.k").unwrap(), b"v");
    assert_eq!(listxattr(&t.p(1, "f")).unwrap(), vec!["user.k".to_string()]);
    let listing = run(&["ls", "-l", &s(&t.p(0, ""))]);
    assert!(
        listing.contains(" f\n") || listing.ends_with(" f"),
        "{listing}"
    );
    assert_cp_a_keeps_modes(&t.p(0, "src"), &t.p(0, "copy"), 0o750, 0o604);
}

/// An access ACL equal to the mode: on a file with an extended ACL it replaces it (the ACL
/// goes, the mode follows); on a file without one and with that mode already (`cp -a` of a
/// plain file) it changes nothing, not even the ctime, as on ext4; with another mode it sets
/// the mode.
#[test]
fn acl_equal_to_the_mode_replaces_or_changes_nothing() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"x").unwrap();
    setxattr(&f, "user.k", b"v", 0).unwrap();
    let ext = acl_xattr(&[
        (A_USER_OBJ, 6, NO_ID),
        (A_USER, 4, U1),
        (A_GROUP_OBJ, 4, NO_ID),
        (A_MASK, 4, NO_ID),
        (A_OTHER, 0, NO_ID),
    ]);
    setxattr(&f, ACL_ACCESS, &ext, 0).unwrap();
    assert_eq!(mode_of(&f) & 0o7777, 0o640);
    let plain = acl_xattr(&[
        (A_USER_OBJ, 6, NO_ID),
        (A_GROUP_OBJ, 4, NO_ID),
        (A_OTHER, 0, NO_ID),
    ]);
    setxattr(&f, ACL_ACCESS, &plain, 0).unwrap();
    assert_errno(
        getxattr(&f, ACL_ACCESS),
        libc::ENODATA,
        "replaced by the mode",
    );
    assert_eq!(listxattr(&f).unwrap(), ["user.k"]);
    assert_eq!(mode_of(&f) & 0o7777, 0o640);
    // Again, now that the mode says it all: nothing changes.
    let before = ctime(&stat(&f).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    setxattr(&f, ACL_ACCESS, &plain, 0).unwrap();
    assert_eq!(ctime(&stat(&f).unwrap()), before, "no change, no ctime");
    assert_eq!(listxattr(&f).unwrap(), ["user.k"]);
    // A file without any xattr, another mode: the mode is set.
    let g = t.p(0, "g");
    fs::write(&g, b"y").unwrap();
    chmod(&g, 0o600).unwrap();
    setxattr(&g, ACL_ACCESS, &plain, 0).unwrap();
    assert_eq!(mode_of(&g) & 0o7777, 0o640);
    assert!(listxattr(&g).unwrap().is_empty());
}

/// New inodes inherit the directory's default ACL: no umask, the default masked by the mode
/// asked for; subdirectories inherit it as their default too. Compared with what ext4 does.
#[test]
fn acl_default_inherited_at_create() {
    let t = TestFs::new(1);
    let w = world_dir(&t, "w");
    let d = w.join("shared");
    fs::create_dir(&d).unwrap();
    chown(&d, U1, U1).unwrap();
    run(&[
        "setfacl",
        "-d",
        "-m",
        &format!("u:{U2}:rwx,g::rx,o::-"),
        &s(&d),
    ]);
    let d1 = d.clone();
    as_user(&Cred::new(U1, U1), move || {
        unsafe { libc::umask(0o077) };
        fs::write(d1.join("file"), b"from u1").unwrap();
        fs::create_dir(d1.join("sub")).unwrap();
        mknod(&d1.join("fifo"), libc::S_IFIFO | 0o640).unwrap();
        std::os::unix::fs::symlink("file", d1.join("link")).unwrap();
        fs::write(d1.join("sub/deeper"), b"deeper").unwrap();
    });
    // umask 077 ignored: file 0666 -> rw-rw---- (mask rw-), dir 0777 -> rwxrwx---
    assert_eq!(mode_of(&d.join("file")) & 0o7777, 0o660);
    assert_eq!(mode_of(&d.join("sub")) & 0o7777, 0o770);
    assert_eq!(mode_of(&d.join("fifo")) & 0o7777, 0o640);
    assert_eq!(mode_of(&d.join("sub/deeper")) & 0o7777, 0o660);
    let f = run(&["getfacl", "-c", "-n", &s(&d.join("file"))]);
    assert_eq!(
        f.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
        vec![
            "user::rw-".to_string(),
            format!("user:{U2}:rwx\t#effective:rw-"),
            "group::r-x\t#effective:r--".to_string(),
            "mask::rw-".to_string(),
            "other::---".to_string(),
        ],
        "the file's inherited ACL"
    );
    assert!(
        getxattr(&d.join("sub"), ACL_DEFAULT).is_ok(),
        "sub inherits the default"
    );
    assert_eq!(
        getxattr(&d.join("sub"), ACL_DEFAULT).unwrap(),
        getxattr(&d, ACL_DEFAULT).unwrap()
    );
    assert_errno(
        getxattr(&d.join("file"), ACL_DEFAULT),
        libc::ENODATA,
        "files get no default",
    );
    assert!(
        lstat(&d.join("link")).unwrap().st_mode & 0o777 == 0o777,
        "symlinks take no ACL"
    );
    // U2 (named in the default) may write what U1 created; others may not read
    let d2 = d.clone();
    as_user(&Cred::new(U2, U2), move || {
        fs::write(d2.join("file"), b"from u2").expect("named user writes");
        fs::write(d2.join("sub/deeper"), b"u2").expect("inherited two levels down");
    });
    let d3 = d.clone();
    as_user(&Cred::new(U3, U3), move || {
        assert_errno(fs::read(d3.join("file")), libc::EACCES, "other::---");
    });
    // without a default ACL the umask applies as usual
    let plain = w.join("plain");
    fs::create_dir(&plain).unwrap();
    let p1 = plain.clone();
    as_user(&Cred::new(0, 0), move || {
        unsafe { libc::umask(0o027) };
        fs::write(p1.join("f"), b"x").unwrap();
    });
    assert_eq!(mode_of(&plain.join("f")) & 0o777, 0o640);
}

// ---------------------------------------------------------------------------------------------
// name and path limits
// ---------------------------------------------------------------------------------------------

#[test]
fn name_255_ok_256_enametoolong() {
    let t = TestFs::new(1);
    let n255 = "a".repeat(255);
    let n255b = "b".repeat(255);
    let n256 = "c".repeat(256);
    let p255 = t.p(0, &n255);
    fs::write(&p255, b"long name").unwrap();
    assert_eq!(read_all(&p255).unwrap(), b"long name");
    assert!(fs::read_dir(t.mnt(0))
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy() == n255));
    fs::rename(&p255, t.p(0, &n255b)).unwrap();
    fs::create_dir(t.p(0, &n255)).unwrap();
    std::os::unix::fs::symlink("x", t.p(0, &"s".repeat(255))).unwrap();
    setxattr(&t.p(0, &n255b), "user.k", b"v", 0).unwrap();

    let p256 = t.p(0, &n256);
    assert_errno(stat(&p256), libc::ENAMETOOLONG, "stat 256-byte name");
    assert_errno(fs::File::create(&p256), libc::ENAMETOOLONG, "create");
    assert_errno(fs::create_dir(&p256), libc::ENAMETOOLONG, "mkdir");
    assert_errno(
        mknod(&p256, libc::S_IFIFO | 0o600),
        libc::ENAMETOOLONG,
        "mknod",
    );
    assert_errno(
        std::os::unix::fs::symlink("x", &p256),
        libc::ENAMETOOLONG,
        "symlink",
    );
    assert_errno(
        fs::hard_link(t.p(0, &n255b), &p256),
        libc::ENAMETOOLONG,
        "link",
    );
    assert_errno(
        fs::rename(t.p(0, &n255b), &p256),
        libc::ENAMETOOLONG,
        "rename",
    );
    assert!(t.p(0, &n255b).exists(), "failed rename keeps the source");
}

#[test]
fn deep_path_near_path_max() {
    let t = TestFs::new(1);
    const MAX: usize = libc::PATH_MAX as usize - 1; // strlen of the longest path
    let mut p = t.mnt(0).to_path_buf();
    let mut depth = 0;
    while MAX - p.as_os_str().len() - 1 > 255 {
        let room = MAX - p.as_os_str().len() - 1 - 1 - 10; // leave >= 10 for the file name
        let l = room.min(250);
        p.push("d".repeat(l));
        fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir at depth {depth}: {e}"));
        depth += 1;
    }
    let name_len = MAX - p.as_os_str().len() - 1;
    assert!((1..=255).contains(&name_len));
    let f = p.join("f".repeat(name_len));
    assert_eq!(
        f.as_os_str().len(),
        MAX,
        "test builds a path of PATH_MAX-1 bytes"
    );
    fs::write(&f, b"deep").unwrap_or_else(|e| panic!("create {}-byte path: {e}", MAX));
    assert_eq!(read_all(&f).unwrap(), b"deep");
    assert_eq!(stat(&f).unwrap().st_size, 4);
    let g = p.join("g".repeat(name_len));
    fs::rename(&f, &g).unwrap();
    assert_eq!(read_all(&g).unwrap(), b"deep");
    assert_eq!(fs::read_dir(&p).unwrap().count(), 1);
    // one byte more is too long for the kernel
    let too = p.join("h".repeat(name_len + 1));
    assert_errno(
        fs::write(&too, b"x"),
        libc::ENAMETOOLONG,
        "path of PATH_MAX bytes",
    );
    // the whole tree is removable
    fs::remove_dir_all(t.mnt(0).join("d".repeat(250))).unwrap();
    assert_eq!(fs::read_dir(t.mnt(0)).unwrap().count(), 0);
}

#[test]
fn metadata_via_std_matches_stat() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, b"12345").unwrap();
    let m = fs::metadata(&f).unwrap();
    let st = stat(&f).unwrap();
    assert_eq!(m.ino(), st.st_ino);
    assert_eq!(m.len(), 5);
    assert_eq!(m.mode(), st.st_mode);
}

#[test]
fn unlink_while_iterating_directory() {
    // what `rm -rf` does: unlink entries while the directory stream is open
    const N: usize = 2000;
    let t = TestFs::new(1);
    let d = t.p(0, "d");
    fs::create_dir(&d).unwrap();
    for i in 0..N {
        mknod(&d.join(format!("f{i:05}")), libc::S_IFREG | 0o644).unwrap();
    }
    let mut removed = std::collections::BTreeSet::new();
    for e in fs::read_dir(&d).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(removed.insert(name.clone()), "{name} listed twice");
        fs::remove_file(e.path()).unwrap_or_else(|err| panic!("unlink {name}: {err}"));
    }
    assert_eq!(removed.len(), N, "entries seen while unlinking");
    fs::remove_dir(&d).expect("directory empty after one pass");
}

#[test]
fn st_blocks_accounts_for_data() {
    let t = TestFs::new(1);
    let f = t.p(0, "dense");
    fs::write(&f, pattern(14, 0, 1 << 20)).unwrap();
    let st = stat(&f).unwrap();
    assert!(
        st.st_blocks * 512 >= 1 << 20,
        "st_blocks {} too small for a dense 1 MiB file (du would under-report)",
        st.st_blocks
    );
}

#[test]
fn mmap_shared_write_seen_by_other_client() {
    let t = TestFs::new(2);
    let f = t.p(0, "m");
    let len = 3 * 4096 + 100;
    fs::write(&f, vec![0u8; len]).unwrap();
    let h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f)
        .unwrap();
    let data = pattern(15, 0, len);
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            h.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
        std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<u8>(), len);
        assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0, "msync");
        assert_eq!(libc::munmap(p, len), 0);
    }
    drop(h);
    assert_same_bytes(&read_all(&f).unwrap(), &data, 0, "c0 after mmap write");
    assert_same_bytes(
        &read_all(&t.p(1, "m")).unwrap(),
        &data,
        0,
        "c1 after mmap write",
    );
    // and mmap reading
    let h = fs::File::open(t.p(1, "m")).unwrap();
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            h.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let got = std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec();
        libc::munmap(p, len);
        assert_same_bytes(&got, &data, 0, "mmap read on c1");
    }
}

#[test]
fn o_direct_write_and_read() {
    let t = TestFs::new(2);
    let f = t.p(0, "direct");
    let len = 1 << 20;
    // O_DIRECT wants aligned buffers
    let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
    let buf = unsafe { std::alloc::alloc(layout) };
    let data = pattern(16, 0, len);
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, len) };
    let c = cstr(&f);
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_CREAT | libc::O_RDWR | libc::O_DIRECT | libc::O_CLOEXEC,
            0o644,
        )
    };
    assert!(fd >= 0, "open O_DIRECT: {}", io::Error::last_os_error());
    let n = unsafe { libc::pwrite(fd, buf.cast(), len, 0) };
    assert_eq!(
        n,
        len as isize,
        "O_DIRECT write: {}",
        io::Error::last_os_error()
    );
    unsafe { std::ptr::write_bytes(buf, 0, len) };
    let n = unsafe { libc::pread(fd, buf.cast(), len, 0) };
    assert_eq!(
        n,
        len as isize,
        "O_DIRECT read: {}",
        io::Error::last_os_error()
    );
    let got = unsafe { std::slice::from_raw_parts(buf, len) }.to_vec();
    unsafe {
        libc::close(fd);
        std::alloc::dealloc(buf, layout);
    }
    assert_same_bytes(&got, &data, 0, "O_DIRECT read back");
    assert_same_bytes(
        &read_all(&f).unwrap(),
        &data,
        0,
        "buffered read after O_DIRECT",
    );
    assert_same_bytes(&read_all(&t.p(1, "direct")).unwrap(), &data, 0, "c1");
}

/// Linux AIO (what fio's libaio engine uses), by raw system calls: the kernel's `struct iocb`
/// and `struct io_event` on a little-endian 64-bit machine.
#[repr(C)]
#[derive(Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: i32,
    opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

/// Writes `bufs` (each aligned for O_DIRECT) at their offsets as asynchronous writes all in
/// flight at once, with `rw_flags` (e.g. RWF_DSYNC), and waits for every completion.
fn aio_write_all(fd: i32, bufs: &[(u64, &[u8])], rw_flags: i32) {
    let mut ctx: u64 = 0;
    let r = unsafe { libc::syscall(libc::SYS_io_setup, bufs.len() as i64, &mut ctx) };
    assert_eq!(r, 0, "io_setup: {}", io::Error::last_os_error());
    let mut cbs: Vec<Iocb> = bufs
        .iter()
        .enumerate()
        .map(|(i, (off, b))| Iocb {
            data: i as u64,
            rw_flags,
            opcode: 1, // IOCB_CMD_PWRITE
            fildes: fd as u32,
            buf: b.as_ptr() as u64,
            nbytes: b.len() as u64,
            offset: *off as i64,
            ..Default::default()
        })
        .collect();
    let mut ptrs: Vec<*mut Iocb> = cbs.iter_mut().map(|c| c as *mut Iocb).collect();
    let n = unsafe {
        libc::syscall(
            libc::SYS_io_submit,
            ctx,
            ptrs.len() as i64,
            ptrs.as_mut_ptr(),
        )
    };
    assert_eq!(
        n,
        bufs.len() as i64,
        "io_submit: {}",
        io::Error::last_os_error()
    );
    let mut events = vec![IoEvent::default(); bufs.len()];
    let mut done = 0usize;
    while done < bufs.len() {
        let timeout = libc::timespec {
            tv_sec: 30,
            tv_nsec: 0,
        };
        let got = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                ctx,
                1i64,
                (bufs.len() - done) as i64,
                events[done..].as_mut_ptr(),
                &timeout,
            )
        };
        assert!(
            got > 0,
            "io_getevents: {got} {}",
            io::Error::last_os_error()
        );
        done += got as usize;
    }
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
    for e in &events {
        let want = bufs[e.data as usize].1.len() as i64;
        assert_eq!(
            e.res, want,
            "asynchronous write {} completed with {}",
            e.data, e.res
        );
    }
}

/// O_DSYNC (of the open) and RWF_DSYNC (of one write) on asynchronous direct I/O: the kernel
/// sends no fsync after such writes (only its synchronous path does), so the daemon must make
/// each one durable before it completes. Observable from another client: with the writer's
/// file still open (no fsync, no close), the data is already committed and readable there.
#[test]
fn dsync_async_direct_writes_are_committed_when_they_complete() {
    // c1 has never looked the files up: it reads what the engine holds
    let t = TestFs::new(2);
    let piece = 64 << 10;
    let layout = std::alloc::Layout::from_size_align(4 * piece, 4096).unwrap();
    let buf = unsafe { std::alloc::alloc(layout) };
    assert!(!buf.is_null());
    for (name, open_flag, rw_flag, seed) in [
        ("o_dsync", libc::O_DSYNC, 0, 41u64),
        ("rwf_dsync", 0, libc::RWF_DSYNC, 42u64),
    ] {
        let data = pattern(seed, 0, 4 * piece);
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, data.len()) };
        let all = unsafe { std::slice::from_raw_parts(buf, data.len()) };
        let c = cstr(&t.p(0, name));
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_RDWR | libc::O_DIRECT | libc::O_CLOEXEC | open_flag,
                0o644,
            )
        };
        assert!(fd >= 0, "open {name}: {}", io::Error::last_os_error());
        // The kernel runs writes that extend a file synchronously (and then sends an fsync
        // itself): size it first, so that the writes below are really asynchronous.
        let r = unsafe { libc::ftruncate(fd, data.len() as i64) };
        assert_eq!(r, 0, "ftruncate {name}: {}", io::Error::last_os_error());
        // four writes in flight at once, as fio --iodepth=4
        let pieces: Vec<(u64, &[u8])> = (0..4)
            .map(|i| ((i * piece) as u64, &all[i * piece..(i + 1) * piece]))
            .collect();
        aio_write_all(fd, &pieces, rw_flag);
        let seen = read_all(&t.p(1, name)).unwrap();
        unsafe { libc::close(fd) };
        assert_eq!(
            seen.len(),
            data.len(),
            "{name}: c1 sees {} of the {} bytes whose writes completed",
            seen.len(),
            data.len()
        );
        assert_same_bytes(&seen, &data, 0, name);
    }
    unsafe { std::alloc::dealloc(buf, layout) };
}
