//! memfs: the FUSE floor (issue 14). A minimal in-memory filesystem served by the same
//! vendored fuser, the same mount options, the same kernel flags (READDIRPLUS, FUSE_POSIX_ACL,
//! io_uring or /dev/fuse, max_write, no passthrough) and the same TTLs as a tierfs mount, and
//! (almost) no work per request: one global lock over a map of inodes held in memory. What a
//! workload costs on it is what FUSE itself costs on this machine; tierfs's time above it is
//! tierfs's own (docs/benchmarks.md, "The FUSE floor on this machine").
//!
//! Enough of POSIX for tar, ls, find, du, cp -a, rsync, diff, git clone, rm -rf and mdtest:
//! files, directories, symlinks, hard links, special files, rename (with RENAME_NOREPLACE and
//! RENAME_EXCHANGE), xattrs (POSIX ACLs stored as xattrs, enforced by the kernel), fallocate
//! that extends, copy_file_range. fsync, flush and statfs answer at once. Not kept: byte-range
//! locks (not negotiated, so the kernel keeps them locally, no requests), default-ACL
//! inheritance (the umask applies). Nothing survives the unmount.
//!
//! Run by `tierfs memfs MOUNTPOINT` (hidden: a benchmarking tool, not a filesystem).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::config::ReaddirPlus;

const ROOT: u64 = 1;
/// Directory offsets 1 and 2 are "." and ".."; entries get 3, 4, ... in creation order.
const FIRST_ENTRY: u64 = 3;
/// Largest file held (memory): a write, truncate or fallocate past it gets EFBIG.
const MAX_FILE: u64 = 1 << 34;

/// How a memfs mount is set up (the kernel-facing parts match a tierfs mount's).
#[derive(Debug, Clone)]
pub struct MemfsOptions {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub readdirplus: ReaddirPlus,
    pub posix_acl: bool,
    pub fuse_uring: bool,
    pub threads: usize,
}

enum Body {
    File(Vec<u8>),
    Dir {
        parent: u64,
        /// offset cookie -> (name, inode); cookies are never reused, so a listing resumed at an
        /// offset neither repeats nor skips the entries that stayed.
        entries: BTreeMap<u64, (OsString, u64)>,
        names: HashMap<OsString, u64>,
        next: u64,
    },
    Symlink(Vec<u8>),
    Special,
}

struct Node {
    kind: FileType,
    perm: u16,
    uid: u32,
    gid: u32,
    nlink: u32,
    rdev: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Kernel references (entries replied minus forgets): an unlinked inode lives until 0.
    lookups: u64,
    body: Body,
}

impl Node {
    fn size(&self) -> u64 {
        match &self.body {
            Body::File(d) => d.len() as u64,
            Body::Dir { entries, .. } => entries.len() as u64,
            Body::Symlink(t) => t.len() as u64,
            Body::Special => 0,
        }
    }

    /// Writes `data` at `offset` of a regular file (extending it), and marks it modified.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> R<u32> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE)
            .ok_or(Errno::EFBIG)? as usize;
        let Body::File(d) = &mut self.body else {
            return Err(Errno::EINVAL);
        };
        if end > d.len() {
            d.resize(end, 0);
        }
        d[offset as usize..end].copy_from_slice(data);
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
        Ok(data.len() as u32)
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let size = self.size();
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.ctime,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            blksize: crate::fs::BLKSIZE,
            flags: 0,
        }
    }
}

struct Inner {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

type R<T> = std::result::Result<T, Errno>;

impl Inner {
    fn node(&self, ino: u64) -> R<&Node> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> R<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> R<Option<u64>> {
        match &self.node(parent)?.body {
            Body::Dir { names, entries, .. } => {
                Ok(names.get(name).and_then(|c| entries.get(c)).map(|e| e.1))
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn insert_entry(&mut self, parent: u64, name: &OsStr, ino: u64) -> R<()> {
        let now = SystemTime::now();
        let p = self.node_mut(parent)?;
        let Body::Dir {
            entries,
            names,
            next,
            ..
        } = &mut p.body
        else {
            return Err(Errno::ENOTDIR);
        };
        let cookie = *next;
        *next += 1;
        entries.insert(cookie, (name.to_os_string(), ino));
        names.insert(name.to_os_string(), cookie);
        p.mtime = now;
        p.ctime = now;
        Ok(())
    }

    fn remove_entry(&mut self, parent: u64, name: &OsStr) -> R<u64> {
        let now = SystemTime::now();
        let p = self.node_mut(parent)?;
        let Body::Dir { entries, names, .. } = &mut p.body else {
            return Err(Errno::ENOTDIR);
        };
        let cookie = names.remove(name).ok_or(Errno::ENOENT)?;
        let (_, ino) = entries.remove(&cookie).ok_or(Errno::ENOENT)?;
        p.mtime = now;
        p.ctime = now;
        Ok(ino)
    }

    /// Drops an inode nobody names and the kernel no longer references.
    fn maybe_free(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get(&ino) {
            if n.nlink == 0 && n.lookups == 0 && ino != ROOT {
                self.nodes.remove(&ino);
            }
        }
    }

    /// One less name for `ino` (a directory loses both of its own links and one of its parent's).
    fn unlinked(&mut self, ino: u64, parent: u64) {
        let now = SystemTime::now();
        let mut dir = false;
        if let Some(n) = self.nodes.get_mut(&ino) {
            dir = n.kind == FileType::Directory;
            n.nlink = if dir { 0 } else { n.nlink.saturating_sub(1) };
            n.ctime = now;
        }
        if dir {
            if let Some(p) = self.nodes.get_mut(&parent) {
                p.nlink = p.nlink.saturating_sub(1);
            }
        }
        self.maybe_free(ino);
    }

    #[allow(clippy::too_many_arguments)]
    fn make(
        &mut self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        mode: u32,
        umask: u32,
        rdev: u32,
        body: Body,
    ) -> R<(u64, FileAttr)> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        if self.child(parent, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let p = self.node(parent)?;
        let setgid = p.perm & libc::S_ISGID as u16 != 0;
        let gid = if setgid { p.gid } else { req.gid() };
        let mut perm = (mode & !umask & 0o7777) as u16;
        if kind == FileType::Symlink {
            perm = 0o777;
        }
        if kind == FileType::Directory && setgid {
            perm |= libc::S_ISGID as u16;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let now = SystemTime::now();
        let nlink = if kind == FileType::Directory { 2 } else { 1 };
        let node = Node {
            kind,
            perm,
            uid: req.uid(),
            gid,
            nlink,
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs: BTreeMap::new(),
            lookups: 1,
            body,
        };
        let attr = node.attr(ino);
        self.nodes.insert(ino, node);
        self.insert_entry(parent, name, ino)?;
        if kind == FileType::Directory {
            self.node_mut(parent)?.nlink += 1;
        }
        Ok((ino, attr))
    }
}

/// The floor filesystem (see the module's documentation).
pub struct MemFs {
    opts: MemfsOptions,
    inner: Mutex<Inner>,
}

fn dir_body(parent: u64) -> Body {
    Body::Dir {
        parent,
        entries: BTreeMap::new(),
        names: HashMap::new(),
        next: FIRST_ENTRY,
    }
}

fn to_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl MemFs {
    /// An empty filesystem: a root directory owned by `uid`:`gid`, mode 0755.
    pub fn new(opts: MemfsOptions, uid: u32, gid: u32) -> MemFs {
        let now = SystemTime::now();
        let root = Node {
            kind: FileType::Directory,
            perm: 0o755,
            uid,
            gid,
            nlink: 2,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs: BTreeMap::new(),
            lookups: 1,
            body: dir_body(ROOT),
        };
        MemFs {
            opts,
            inner: Mutex::new(Inner {
                nodes: HashMap::from([(ROOT, root)]),
                next_ino: ROOT + 1,
            }),
        }
    }

    fn entry(&self, reply: ReplyEntry, r: R<(u64, FileAttr)>) {
        match r {
            Ok((_, a)) => reply.entry(&self.opts.entry_ttl, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(reply: ReplyEmpty, r: R<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn xattr_reply(reply: ReplyXattr, size: u32, v: R<Vec<u8>>) {
        match v {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(e),
        }
    }

    fn rename_locked(
        g: &mut Inner,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> R<()> {
        let src = g.child(parent, name)?.ok_or(Errno::ENOENT)?;
        let dst = g.child(newparent, newname)?;
        let src_dir = g.node(src)?.kind == FileType::Directory;
        if src_dir && newparent != parent {
            // No directory may move into itself or below itself.
            let mut at = newparent;
            while at != ROOT {
                if at == src {
                    return Err(Errno::EINVAL);
                }
                match &g.node(at)?.body {
                    Body::Dir { parent, .. } => at = *parent,
                    _ => return Err(Errno::ENOTDIR),
                }
            }
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let dst = dst.ok_or(Errno::ENOENT)?;
            g.remove_entry(parent, name)?;
            g.remove_entry(newparent, newname)?;
            g.insert_entry(parent, name, dst)?;
            g.insert_entry(newparent, newname, src)?;
            let dst_dir = g.node(dst)?.kind == FileType::Directory;
            for (ino, dir, now_in) in [(src, src_dir, newparent), (dst, dst_dir, parent)] {
                if let Body::Dir { parent, .. } = &mut g.node_mut(ino)?.body {
                    *parent = now_in;
                }
                if dir && parent != newparent {
                    g.node_mut(now_in)?.nlink += 1;
                    let other = if now_in == parent { newparent } else { parent };
                    let o = g.node_mut(other)?;
                    o.nlink = o.nlink.saturating_sub(1);
                }
            }
            return Ok(());
        }
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        if let Some(dst) = dst {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if dst == src {
                return Ok(());
            }
            let d = g.node(dst)?;
            let dst_dir = d.kind == FileType::Directory;
            match (src_dir, dst_dir) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                _ => {}
            }
            if let Body::Dir { entries, .. } = &d.body {
                if !entries.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            g.remove_entry(newparent, newname)?;
            g.unlinked(dst, newparent);
        }
        g.remove_entry(parent, name)?;
        g.insert_entry(newparent, newname, src)?;
        let n = g.node_mut(src)?;
        n.ctime = SystemTime::now();
        if let Body::Dir { parent: p, .. } = &mut n.body {
            *p = newparent;
        }
        if src_dir && parent != newparent {
            g.node_mut(newparent)?.nlink += 1;
            let o = g.node_mut(parent)?;
            o.nlink = o.nlink.saturating_sub(1);
        }
        Ok(())
    }
}

impl Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        crate::fs::negotiate_common(
            config,
            self.opts.readdirplus,
            self.opts.posix_acl,
            self.opts.fuse_uring,
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut g = self.inner.lock();
        match g.child(parent.0, name) {
            Ok(Some(ino)) => {
                let n = g.nodes.get_mut(&ino).expect("a named inode exists");
                n.lookups += 1;
                let a = n.attr(ino);
                drop(g);
                reply.entry(&self.opts.entry_ttl, &a, Generation(0));
            }
            Ok(None) => {
                drop(g);
                // A negative entry, as tierfs replies (inode 0, remembered for the entry TTL).
                let mut none = Node {
                    kind: FileType::RegularFile,
                    perm: 0,
                    uid: 0,
                    gid: 0,
                    nlink: 0,
                    rdev: 0,
                    atime: SystemTime::UNIX_EPOCH,
                    mtime: SystemTime::UNIX_EPOCH,
                    ctime: SystemTime::UNIX_EPOCH,
                    xattrs: BTreeMap::new(),
                    lookups: 0,
                    body: Body::Special,
                }
                .attr(0);
                none.ino = INodeNo(0);
                reply.entry(&self.opts.entry_ttl, &none, Generation(0));
            }
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut g = self.inner.lock();
        if let Some(n) = g.nodes.get_mut(&ino.0) {
            n.lookups = n.lookups.saturating_sub(nlookup);
        }
        g.maybe_free(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let a = self.inner.lock().node(ino.0).map(|n| n.attr(ino.0));
        match a {
            Ok(a) => reply.attr(&self.opts.attr_ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut g = self.inner.lock();
        let r = g.node_mut(ino.0).and_then(|n| {
            if let Some(size) = size {
                match &mut n.body {
                    Body::File(_) if size > MAX_FILE => return Err(Errno::EFBIG),
                    Body::File(d) => d.resize(size as usize, 0),
                    Body::Dir { .. } => return Err(Errno::EISDIR),
                    _ => return Err(Errno::EINVAL),
                }
                n.mtime = SystemTime::now();
            }
            if let Some(m) = mode {
                n.perm = (m & 0o7777) as u16;
            }
            if let Some(u) = uid {
                n.uid = u;
            }
            if let Some(gg) = gid {
                n.gid = gg;
            }
            if let Some(t) = atime {
                n.atime = to_time(t);
            }
            if let Some(t) = mtime {
                n.mtime = to_time(t);
            }
            n.ctime = ctime.unwrap_or_else(SystemTime::now);
            Ok(n.attr(ino.0))
        });
        drop(g);
        match r {
            Ok(a) => reply.attr(&self.opts.attr_ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let g = self.inner.lock();
        match g.node(ino.0).map(|n| &n.body) {
            Ok(Body::Symlink(t)) => reply.data(t),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (kind, body) = match mode & libc::S_IFMT {
            libc::S_IFREG => (FileType::RegularFile, Body::File(Vec::new())),
            libc::S_IFIFO => (FileType::NamedPipe, Body::Special),
            libc::S_IFCHR => (FileType::CharDevice, Body::Special),
            libc::S_IFBLK => (FileType::BlockDevice, Body::Special),
            libc::S_IFSOCK => (FileType::Socket, Body::Special),
            _ => return reply.error(Errno::EINVAL),
        };
        let r = self
            .inner
            .lock()
            .make(req, parent.0, name, kind, mode, umask, rdev, body);
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.inner.lock().make(
            req,
            parent.0,
            name,
            FileType::Directory,
            mode,
            umask,
            0,
            dir_body(parent.0),
        );
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.inner.lock();
        let r = (|| {
            let ino = g.child(parent.0, name)?.ok_or(Errno::ENOENT)?;
            if g.node(ino)?.kind == FileType::Directory {
                return Err(Errno::EISDIR);
            }
            g.remove_entry(parent.0, name)?;
            g.unlinked(ino, parent.0);
            Ok(())
        })();
        drop(g);
        Self::empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.inner.lock();
        let r = (|| {
            let ino = g.child(parent.0, name)?.ok_or(Errno::ENOENT)?;
            match &g.node(ino)?.body {
                Body::Dir { entries, .. } if !entries.is_empty() => return Err(Errno::ENOTEMPTY),
                Body::Dir { .. } => {}
                _ => return Err(Errno::ENOTDIR),
            }
            g.remove_entry(parent.0, name)?;
            g.unlinked(ino, parent.0);
            Ok(())
        })();
        drop(g);
        Self::empty(reply, r);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let body = Body::Symlink(target.as_os_str().as_bytes().to_vec());
        let r = self.inner.lock().make(
            req,
            parent.0,
            link_name,
            FileType::Symlink,
            0o777,
            0,
            0,
            body,
        );
        self.entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut g = self.inner.lock();
        let r = Self::rename_locked(&mut g, parent.0, name, newparent.0, newname, flags);
        drop(g);
        Self::empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut g = self.inner.lock();
        let r = (|| {
            if g.node(ino.0)?.kind == FileType::Directory {
                return Err(Errno::EPERM);
            }
            if g.child(newparent.0, newname)?.is_some() {
                return Err(Errno::EEXIST);
            }
            g.insert_entry(newparent.0, newname, ino.0)?;
            let n = g.node_mut(ino.0)?;
            n.nlink += 1;
            n.lookups += 1;
            n.ctime = SystemTime::now();
            Ok((ino.0, n.attr(ino.0)))
        })();
        drop(g);
        self.entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // One client: the kernel's cached pages are always right.
        match self.inner.lock().node(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let g = self.inner.lock();
        match g.node(ino.0).map(|n| &n.body) {
            Ok(Body::File(d)) => {
                let start = (offset as usize).min(d.len());
                let end = start.saturating_add(size as usize).min(d.len());
                reply.data(&d[start..end]);
            }
            Ok(Body::Dir { .. }) => reply.error(Errno::EISDIR),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut g = self.inner.lock();
        let r = g.node_mut(ino.0).and_then(|n| n.write_at(offset, data));
        drop(g);
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.inner.lock().node(ino.0).map(|n| n.kind) {
            Ok(FileType::Directory) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let g = self.inner.lock();
        let (parent, entries) = match g.node(ino.0).map(|n| &n.body) {
            Ok(Body::Dir {
                parent, entries, ..
            }) => (*parent, entries),
            Ok(_) => return reply.error(Errno::ENOTDIR),
            Err(e) => return reply.error(e),
        };
        for (off, name, child) in [(1, OsStr::new("."), ino.0), (2, OsStr::new(".."), parent)] {
            if offset < off && reply.add(INodeNo(child), off, FileType::Directory, name) {
                return reply.ok();
            }
        }
        for (&off, (name, child)) in entries.range(offset.max(FIRST_ENTRY - 1) + 1..) {
            let kind = g.nodes.get(child).map_or(FileType::RegularFile, |n| n.kind);
            if reply.add(INodeNo(*child), off, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut g = self.inner.lock();
        let (parent, list): (u64, Vec<(u64, OsString, u64)>) = match g.node(ino.0).map(|n| &n.body)
        {
            Ok(Body::Dir {
                parent, entries, ..
            }) => (
                *parent,
                // More than fits in one reply at most (the kernel's buffer, up to 128 KiB, holds
                // about a thousand entries; it asks again for the rest).
                entries
                    .range(offset.max(FIRST_ENTRY - 1) + 1..)
                    .take(4096)
                    .map(|(o, (n, c))| (*o, n.clone(), *c))
                    .collect(),
            ),
            Ok(_) => return reply.error(Errno::ENOTDIR),
            Err(e) => return reply.error(e),
        };
        let ttl = self.opts.entry_ttl;
        for (off, name, child) in [(1, ".", ino.0), (2, "..", parent)] {
            if offset < off {
                let a = g.node(child).map(|n| n.attr(child));
                if let Ok(a) = a {
                    if reply.add(INodeNo(child), off, name, &ttl, &a, Generation(0)) {
                        return reply.ok();
                    }
                }
            }
        }
        for (off, name, child) in list {
            let Some(n) = g.nodes.get_mut(&child) else {
                continue;
            };
            let a = n.attr(child);
            if reply.add(INodeNo(child), off, &name, &ttl, &a, Generation(0)) {
                break;
            }
            // The kernel holds a reference for each entry it took (not for "." and "..").
            n.lookups += 1;
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.inner.lock().nodes.len() as u64;
        // 1 TiB of 4 KiB blocks, all free: the tools that check for space find enough.
        let blocks = 1u64 << 28;
        reply.statfs(blocks, blocks, blocks, files, 1 << 30, 4096, 255, 4096);
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let mut g = self.inner.lock();
        let r = g.node_mut(ino.0).and_then(|n| {
            let key = name.as_bytes();
            let exists = n.xattrs.contains_key(key);
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(Errno::NO_XATTR);
            }
            n.xattrs.insert(key.to_vec(), value.to_vec());
            n.ctime = SystemTime::now();
            Ok(())
        });
        drop(g);
        Self::empty(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let v = self.inner.lock().node(ino.0).and_then(|n| {
            n.xattrs
                .get(name.as_bytes())
                .cloned()
                .ok_or(Errno::NO_XATTR)
        });
        Self::xattr_reply(reply, size, v);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let v = self.inner.lock().node(ino.0).map(|n| {
            let mut out = Vec::new();
            for k in n.xattrs.keys() {
                out.extend_from_slice(k);
                out.push(0);
            }
            out
        });
        Self::xattr_reply(reply, size, v);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.inner.lock();
        let r = g.node_mut(ino.0).and_then(|n| {
            n.xattrs
                .remove(name.as_bytes())
                .map(|_| n.ctime = SystemTime::now())
                .ok_or(Errno::NO_XATTR)
        });
        drop(g);
        Self::empty(reply, r);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions).
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.inner.lock().make(
            req,
            parent.0,
            name,
            FileType::RegularFile,
            mode,
            umask,
            0,
            Body::File(Vec::new()),
        );
        match r {
            Ok((_, a)) => reply.created(
                &self.opts.entry_ttl,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut g = self.inner.lock();
        let r = g.node_mut(ino.0).and_then(|n| {
            let Body::File(d) = &mut n.body else {
                return Err(Errno::EINVAL);
            };
            let end = offset
                .checked_add(length)
                .filter(|e| *e <= MAX_FILE)
                .ok_or(Errno::EFBIG)? as usize;
            if end > d.len() {
                d.resize(end, 0);
                n.ctime = SystemTime::now();
            }
            Ok(())
        });
        drop(g);
        Self::empty(reply, r);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let mut g = self.inner.lock();
        let r = (|| {
            let bytes = match &g.node(ino_in.0)?.body {
                Body::File(d) => {
                    let s = (offset_in as usize).min(d.len());
                    let e = s
                        .saturating_add(len.min(u32::MAX as u64) as usize)
                        .min(d.len());
                    d[s..e].to_vec()
                }
                _ => return Err(Errno::EINVAL),
            };
            g.node_mut(ino_out.0)?.write_at(offset_out, &bytes)
        })();
        drop(g);
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }
}

/// Mounts a memfs at `mountpoint` and serves it until it is unmounted (`fusermount3 -u`,
/// `umount`) or the process gets SIGINT/SIGTERM. `ready` runs once the mount is in place.
pub fn serve(
    mountpoint: &Path,
    opts: MemfsOptions,
    ready: impl FnOnce(),
) -> std::result::Result<(), String> {
    let sigs = crate::daemon::block_signals();
    // SAFETY: plain libc calls without arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let fcfg = crate::daemon::fuse_config("memfs".into(), "memfs".into(), opts.threads);
    let fs = MemFs::new(opts, uid, gid);
    let mut session = fuser::Session::new(fs, mountpoint, &fcfg)
        .map_err(|e| format!("cannot mount {}: {e}", mountpoint.display()))?;
    let mut unmounter = session.unmount_callable();
    let mp = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("memfs-signals".into())
        .spawn(move || {
            let _ = sigs.wait();
            if unmounter.unmount().is_err() {
                let _ = crate::daemon::detach(&mp);
            }
        })
        .map_err(|e| e.to_string())?;
    ready();
    session
        .run()
        .map_err(|e| format!("FUSE session ended with an error: {e}"))
}
