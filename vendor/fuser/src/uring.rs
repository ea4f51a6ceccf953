//! FUSE over io_uring (tierfs patch, see TIERFS-PATCH.md).
//!
//! Linux 6.14+ (`CONFIG_FUSE_IO_URING`, module parameter `fuse.enable_uring=Y`) can hand FUSE
//! requests to the daemon through io_uring instead of read(2)/write(2) on /dev/fuse: the daemon
//! registers ring entries (a 288-byte header buffer and a payload buffer each) with
//! `IORING_OP_URING_CMD` + `FUSE_IO_URING_CMD_REGISTER`; the kernel completes such a command when
//! it has put a request in the entry's buffers, and the daemon answers by writing the reply into
//! the same buffers and submitting `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which both commits the
//! reply and waits for the next request: one system call per request instead of two, and no
//! wake-up of a reader thread per request.
//!
//! The kernel has one queue per possible CPU and puts a request on the queue of the CPU the
//! calling task runs on; it switches to the ring only once every queue has an entry. INIT,
//! FORGET, INTERRUPT and notifications still go over /dev/fuse, whose reader threads keep
//! running beside the ring threads.
//!
//! Here each queue is served by `threads_per_queue` threads, each with its own ring and
//! `ENTRIES_PER_THREAD` entries to start with. Only a ring's own thread submits to it: a reply
//! sent from another thread (a deferred reply, e.g. a lock wait's) writes the entry's buffers,
//! queues the commit and wakes the ring thread through an eventfd the ring polls.
//!
//! A request whose reply is deferred holds its entry until it is answered, and the kernel
//! queues a CPU's requests until one of that queue's entries comes back: with a fixed number
//! of entries, enough lock waits on one CPU would starve the very request (the unlock) that
//! ends them. So a ring thread registers another entry whenever fewer than two of its entries
//! are left with the kernel (up to `MAX_ENTRIES_PER_THREAD`), as /dev/fuse has no limit either.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicI32;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;
use std::time::Duration;
use std::time::Instant;

use io_uring::IoUring;
use io_uring::opcode;
use io_uring::squeue::Entry128;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::read_buf::FuseReadBuf;
use crate::reply::ReplyEmpty;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `enum fuse_uring_cmd` (include/uapi/linux/fuse.h).
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out[128]` (fuse_in_header, then fuse_out_header),
/// `op_in[128]` (the opcode's own header), `struct fuse_uring_ent_in_out` (32 bytes:
/// flags u64, commit_id u64, payload_sz u32, padding u32, reserved u64).
const HDR_IN_OUT: usize = 0;
const HDR_OP_IN: usize = 128;
const HDR_OP_IN_SIZE: usize = 128;
const HDR_ENT_IN_OUT: usize = 256;
const HEADER_SIZE: usize = 288;
const IN_HEADER_SIZE: usize = 40;
const OUT_HEADER_SIZE: usize = 16;

/// Entries each ring thread registers. One request per entry is in user space at a time; a
/// thread dispatches one at a time, the others serve deferred replies (lock waits).
pub(crate) const ENTRIES_PER_THREAD: usize = 4;

/// The most entries a ring thread registers as deferred replies pile up (each has a payload
/// buffer of the request size, allocated zeroed: untouched pages cost no memory).
pub(crate) const MAX_ENTRIES_PER_THREAD: usize = 1024;

/// `user_data` of the eventfd poll (entries use their index).
const WAKE: u64 = u64::MAX;

static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// Requests this process received over io_uring (all sessions), for statistics and tests.
pub fn uring_requests() -> u64 {
    REQUESTS.load(Ordering::Relaxed)
}

/// Number of queues the kernel makes: one per possible CPU (`num_possible_cpus()`).
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    cpus_in_list(&s).ok_or_else(|| io::Error::other(format!("cpu list {:?}", s.trim())))
}

/// The highest CPU number of a kernel CPU list ("0-3,8,10-11") plus one.
fn cpus_in_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
        if a > b {
            return None;
        }
        n = n.max(b + 1);
    }
    (n > 0).then_some(n)
}

/// One ring entry's buffers. Between the kernel's completion (a request is in them) and the
/// commit, only the holder of the entry's `commit_id` (the request's reply) touches them.
struct Entry {
    headers: Box<UnsafeCell<[u8; HEADER_SIZE]>>,
    payload: Box<[UnsafeCell<u8>]>,
    /// The request whose reply is owed (its `unique`), 0 when none.
    owed: AtomicU64,
    /// The two buffers, as the REGISTER command names them (stable: the entry is boxed).
    iov: [libc::iovec; 2],
}

impl Entry {
    fn new(payload_size: usize) -> Box<Entry> {
        let headers = Box::new(UnsafeCell::new([0u8; HEADER_SIZE]));
        let payload = zeroed_cells(payload_size);
        let iov = [
            libc::iovec {
                iov_base: headers.get().cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                iov_base: UnsafeCell::raw_get(payload.as_ptr()).cast(),
                iov_len: payload.len(),
            },
        ];
        Box::new(Entry {
            headers,
            payload,
            owed: AtomicU64::new(0),
            iov,
        })
    }
}

/// What a ring thread shares with the replies it hands out.
pub(crate) struct RingShared {
    qid: u16,
    /// The registered entries (slots filled in order, never emptied).
    entries: Box<[OnceLock<Box<Entry>>]>,
    /// Entries holding a request whose reply is not sent yet.
    held: AtomicUsize,
    /// Replies written into their entries and not yet committed: (entry, commit id).
    commits: Mutex<Vec<(usize, u64)>>,
    wake: OwnedFd,
    /// The ring's thread, set when it starts serving.
    owner: OnceLock<ThreadId>,
}

// SAFETY: the buffers behind UnsafeCell are written by one party at a time: the kernel until
// the completion, then the request's reply (claimed through `owed`), then the kernel again once
// the ring thread has submitted the commit (which it does after the reply queued it under the
// `commits` lock).
unsafe impl Sync for RingShared {}
unsafe impl Send for RingShared {}

impl std::fmt::Debug for RingShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingShared")
            .field("qid", &self.qid)
            .finish()
    }
}

/// Where the reply to a request received over the ring goes.
#[derive(Debug, Clone)]
pub(crate) struct UringReplySender {
    ring: Arc<RingShared>,
    entry: usize,
    commit_id: u64,
    /// /dev/fuse, for the passthrough ioctls.
    pub(crate) ch: ChannelSender,
}

impl UringReplySender {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let Some(ent) = self.ring.entries.get(self.entry).and_then(OnceLock::get) else {
            return Err(io::Error::other("no such ring entry"));
        };
        if ent
            .owed
            .compare_exchange(self.commit_id, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // A second reply to one request: the entry may already carry another request.
            return Err(io::Error::other("request already answered"));
        }
        self.ring.held.fetch_sub(1, Ordering::AcqRel);
        let total: usize = data.iter().map(|d| d.len()).sum();
        let payload_len = total.saturating_sub(OUT_HEADER_SIZE);
        // SAFETY: this reply owns the entry's buffers until it queues the commit (above).
        unsafe {
            let hdr = &mut *ent.headers.get();
            if total < OUT_HEADER_SIZE || payload_len > ent.payload.len() {
                // Cannot happen with fuser's replies; answer EIO rather than overflow.
                hdr[HDR_IN_OUT..HDR_IN_OUT + OUT_HEADER_SIZE]
                    .copy_from_slice(&eio_header(self.commit_id));
                hdr[HDR_ENT_IN_OUT + 16..HDR_ENT_IN_OUT + 20].copy_from_slice(&0u32.to_ne_bytes());
            } else {
                let payload = UnsafeCell::raw_get(ent.payload.as_ptr());
                // the out header first, then the payload, slice by slice
                let mut at = 0usize;
                for d in data {
                    let mut d: &[u8] = d;
                    if at < OUT_HEADER_SIZE {
                        let n = d.len().min(OUT_HEADER_SIZE - at);
                        hdr[HDR_IN_OUT + at..HDR_IN_OUT + at + n].copy_from_slice(&d[..n]);
                        at += n;
                        d = &d[n..];
                    }
                    if !d.is_empty() {
                        std::ptr::copy_nonoverlapping(
                            d.as_ptr(),
                            payload.add(at - OUT_HEADER_SIZE),
                            d.len(),
                        );
                        at += d.len();
                    }
                }
                hdr[HDR_ENT_IN_OUT + 16..HDR_ENT_IN_OUT + 20]
                    .copy_from_slice(&(payload_len as u32).to_ne_bytes());
            }
        }
        self.ring.commits.lock().push((self.entry, self.commit_id));
        if self.ring.owner.get() != Some(&std::thread::current().id()) {
            signal(self.ring.wake.as_raw_fd());
        }
        Ok(())
    }
}

/// A fuse_out_header answering request `unique` with EIO.
fn eio_header(unique: u64) -> [u8; OUT_HEADER_SIZE] {
    let mut oh = [0u8; OUT_HEADER_SIZE];
    oh[0..4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
    oh[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    oh[8..16].copy_from_slice(&unique.to_ne_bytes());
    oh
}

/// Keeps the calling thread on CPU `cpu`, as libfuse does with its ring threads: the kernel
/// queues a request on the queue of the CPU its caller runs on, so the thread that serves it
/// is woken on that CPU (no cross-CPU wake-up, and the caller, which waits, gives it the CPU).
/// Left unpinned when `cpu` is not one this process may run on (a cpuset, an offline CPU).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; the calls read and write only the set given.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) != 0
            || cpu >= libc::CPU_SETSIZE as usize
            || !libc::CPU_ISSET(cpu, &allowed)
        {
            debug!("fuse io_uring: CPU {cpu} not allowed here; its ring thread is not pinned");
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "fuse io_uring: pinning a ring thread to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Adds 1 to eventfd `fd` (wakes the ring that polls it).
fn signal(fd: i32) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a live u64 to an eventfd.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), std::mem::size_of::<u64>()) };
}

/// The fuse_uring_cmd_req in the SQE's command area: flags u64, commit_id u64, qid u16.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

fn register_sqe(fd: i32, qid: u16, iov: *const libc::iovec, idx: usize) -> Entry128 {
    let mut sqe = opcode::UringCmd80::new(types::Fd(fd), FUSE_IO_URING_CMD_REGISTER)
        .cmd(cmd_req(0, qid))
        .addr(Some(iov as u64))
        .build()
        .user_data(idx as u64);
    // The kernel reads the number of iovecs from sqe->len (offset 24 of struct io_uring_sqe),
    // which the io-uring crate's UringCmd80 does not set.
    const _: () = assert!(std::mem::size_of::<Entry128>() == 128);
    // SAFETY: Entry128 is repr(C), 128 bytes, the io_uring_sqe first.
    unsafe {
        let raw = (&mut sqe as *mut Entry128).cast::<u8>();
        std::ptr::copy_nonoverlapping(2u32.to_ne_bytes().as_ptr(), raw.add(24), 4);
    }
    sqe
}

fn commit_sqe(fd: i32, qid: u16, idx: usize, commit_id: u64) -> Entry128 {
    opcode::UringCmd80::new(types::Fd(fd), FUSE_IO_URING_CMD_COMMIT_AND_FETCH)
        .cmd(cmd_req(commit_id, qid))
        .build()
        .user_data(idx as u64)
}

fn wake_sqe(efd: i32) -> Entry128 {
    Entry128::from(
        opcode::PollAdd::new(types::Fd(efd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(WAKE),
    )
}

/// Tells a ring thread to stop (after the session's /dev/fuse threads ended).
#[derive(Debug, Clone)]
pub(crate) struct RingStop {
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
}

impl RingStop {
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        signal(self.wake.as_raw_fd());
    }
}

/// A zeroed buffer the kernel may write while we hold it: allocated zeroed (untouched pages
/// cost no memory until a request uses them).
fn zeroed_cells(len: usize) -> Box<[UnsafeCell<u8>]> {
    let raw = Box::into_raw(vec![0u8; len].into_boxed_slice());
    // SAFETY: UnsafeCell<u8> has the layout of u8 (repr(transparent)); same allocation.
    unsafe { Box::from_raw(raw as *mut [UnsafeCell<u8>]) }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new, valid descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A ring and what only the thread serving it at the moment touches: its own thread, or the
/// rescuer while that thread is busy with one request (see [`Rescuer`]).
struct RingState {
    ring: IoUring<Entry128>,
    /// Entries registered so far (the first slots of `shared.entries`).
    registered: usize,
    /// Entries the kernel still has or may still complete (registered minus those it ended).
    live: usize,
    warned_full: bool,
    /// Completions harvested from the ring and not yet taken: a server takes one at a time, so
    /// what a busy thread harvested with its request is not stuck behind it.
    pending: VecDeque<(u64, i32, u32)>,
}

/// One ring, shared by its thread and the rescuer.
pub(crate) struct RingCore {
    state: Mutex<RingState>,
    shared: Arc<RingShared>,
    stop: Arc<AtomicBool>,
    stop_wake: Arc<OwnedFd>,
    payload_size: usize,
    fuse_fd: AtomicI32,
    /// When (nanoseconds of [`clock_ns`]) the ring's thread began serving its current request;
    /// 0 while it is not serving one.
    busy_since: AtomicU64,
}

// SAFETY: the iovecs inside the entries point into their own heap buffers, which move with
// `shared`; the ring is only used under `state`'s lock.
unsafe impl Send for RingCore {}
unsafe impl Sync for RingCore {}

/// A ring thread, ready to run.
pub(crate) struct RingThread {
    core: Arc<RingCore>,
}

/// Nanoseconds of a monotonic clock, never 0.
fn clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

impl RingThread {
    /// Builds the ring and buffers of one thread of queue `qid`.
    pub(crate) fn new(qid: u16, payload_size: usize) -> io::Result<(RingThread, RingStop)> {
        let ring: IoUring<Entry128> =
            IoUring::builder().build((ENTRIES_PER_THREAD as u32 + 2).next_power_of_two().max(8))?;
        let wake = eventfd()?;
        let entries: Box<[OnceLock<Box<Entry>>]> = (0..MAX_ENTRIES_PER_THREAD)
            .map(|_| OnceLock::new())
            .collect();
        let stop_wake = Arc::new(eventfd()?);
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(RingShared {
            qid,
            entries,
            held: AtomicUsize::new(0),
            commits: Mutex::new(Vec::new()),
            wake,
            owner: OnceLock::new(),
        });
        let rs = RingStop {
            stop: Arc::clone(&stop),
            wake: Arc::clone(&stop_wake),
        };
        let core = Arc::new(RingCore {
            state: Mutex::new(RingState {
                ring,
                registered: 0,
                live: 0,
                warned_full: false,
                pending: VecDeque::new(),
            }),
            shared,
            stop,
            stop_wake,
            payload_size,
            fuse_fd: AtomicI32::new(-1),
            busy_since: AtomicU64::new(0),
        });
        Ok((RingThread { core }, rs))
    }

    /// The ring, for the session's [`Rescuer`].
    pub(crate) fn core(&self) -> Arc<RingCore> {
        Arc::clone(&self.core)
    }

    /// Registers the entries and serves requests until the connection ends or `stop`.
    pub(crate) fn run<FS: Filesystem>(
        self,
        fuse_fd: i32,
        se: &SessionEventLoop<FS>,
    ) -> io::Result<()> {
        let core = self.core;
        let qid = core.shared.qid;
        let _ = core.shared.owner.set(std::thread::current().id());
        pin_to_cpu(qid as usize);
        core.fuse_fd.store(fuse_fd, Ordering::Release);
        {
            let mut st = core.state.lock();
            for _ in 0..ENTRIES_PER_THREAD {
                core.add_entry(&mut st)?;
            }
            let w = wake_sqe(core.shared.wake.as_raw_fd());
            push(&mut st.ring, &w)?;
            let mut s = wake_sqe(core.stop_wake.as_raw_fd());
            s = s.user_data(WAKE - 1);
            push(&mut st.ring, &s)?;
            st.live = st.registered;
        }
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();
        loop {
            // The lock is held while waiting in the kernel (the rescuer leaves a waiting
            // thread alone) and dropped while serving (the rescuer may then take over).
            let idx = {
                let mut st = core.state.lock();
                loop {
                    if st.live == 0 || core.stop.load(Ordering::Acquire) {
                        return Ok(());
                    }
                    core.queue_commits(&mut st)?;
                    if let Some((ud, res, flags)) = st.pending.pop_front() {
                        if let Some(idx) = core.take(&mut st, ud, res, flags)? {
                            break idx;
                        }
                        continue;
                    }
                    submit(&mut st.ring, 1)?;
                    harvest(&mut st);
                }
            };
            core.busy_since.store(clock_ns(), Ordering::Release);
            let destroy = core.serve(idx, buf, se);
            core.busy_since.store(0, Ordering::Release);
            if destroy {
                // DESTROY: answered; the kernel tears the ring down next.
                debug!("fuse io_uring queue {qid}: destroy");
            }
        }
    }
}

/// Queues `sqe`, submitting what is queued when the submission queue is full.
fn push(ring: &mut IoUring<Entry128>, sqe: &Entry128) -> io::Result<()> {
    loop {
        // SAFETY: the buffers an SQE names (iovecs, entries) live as long as the ring.
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

/// Moves the ring's completions to `pending`.
fn harvest(st: &mut RingState) {
    let RingState { ring, pending, .. } = st;
    pending.extend(
        ring.completion()
            .map(|c| (c.user_data(), c.result(), c.flags())),
    );
}

impl RingCore {
    /// Makes and registers one more entry (false when the ring has its most already).
    fn add_entry(&self, st: &mut RingState) -> io::Result<bool> {
        let idx = st.registered;
        let Some(slot) = self.shared.entries.get(idx) else {
            return Ok(false);
        };
        let ent = slot.get_or_init(|| Entry::new(self.payload_size));
        let fuse_fd = self.fuse_fd.load(Ordering::Acquire);
        let sqe = register_sqe(fuse_fd, self.shared.qid, ent.iov.as_ptr(), idx);
        push(&mut st.ring, &sqe)?;
        st.registered += 1;
        Ok(true)
    }

    /// Queues the commits of the replies written since the last call.
    fn queue_commits(&self, st: &mut RingState) -> io::Result<()> {
        let commits: Vec<(usize, u64)> = std::mem::take(&mut *self.shared.commits.lock());
        let fuse_fd = self.fuse_fd.load(Ordering::Acquire);
        for (idx, commit_id) in commits {
            let sqe = commit_sqe(fuse_fd, self.shared.qid, idx, commit_id);
            push(&mut st.ring, &sqe)?;
        }
        Ok(())
    }

    /// Handles one completion: the eventfd polls and ended entries here; a request's entry
    /// index is returned for a server to serve (it then counts as held).
    fn take(&self, st: &mut RingState, ud: u64, res: i32, flags: u32) -> io::Result<Option<usize>> {
        let qid = self.shared.qid;
        if ud >= WAKE - 1 {
            let fd = if ud == WAKE {
                self.shared.wake.as_raw_fd()
            } else {
                self.stop_wake.as_raw_fd()
            };
            let mut v = 0u64;
            // SAFETY: reading 8 bytes from a nonblocking eventfd.
            let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
            if !io_uring::cqueue::more(flags) {
                let mut again = wake_sqe(fd);
                again = again.user_data(ud);
                push(&mut st.ring, &again)?;
            }
            return Ok(None);
        }
        let idx = ud as usize;
        if res < 0 {
            // -ENOTCONN/-ECANCELED: the connection ended (unmount) or the queue stopped;
            // on register, -EOPNOTSUPP/-EINVAL: the kernel refused the ring (it then
            // goes on over /dev/fuse).
            if res != -libc::ENOTCONN && res != -libc::ECANCELED {
                warn!(
                    "fuse io_uring queue {qid} entry {idx}: {}",
                    io::Error::from_raw_os_error(-res)
                );
            }
            st.live = st.live.saturating_sub(1);
            return Ok(None);
        }
        let held = self.shared.held.fetch_add(1, Ordering::AcqRel) + 1;
        // Deferred replies hold their entries: keep two with the kernel, so a request that
        // would end the waits (an unlock) always finds one.
        if st.registered.saturating_sub(held) < 2 {
            if self.add_entry(st)? {
                st.live += 1;
            } else if !st.warned_full {
                st.warned_full = true;
                warn!(
                    "fuse io_uring queue {qid}: {held} requests wait for their replies \
                     on one thread's {} entries: more requests of this CPU wait in \
                     the kernel",
                    st.registered
                );
            }
        }
        Ok(Some(idx))
    }

    /// Copies the request out of entry `idx` (taken: counted in `held`) and dispatches it.
    /// True for DESTROY.
    fn serve<FS: Filesystem>(&self, idx: usize, buf: &mut [u8], se: &SessionEventLoop<FS>) -> bool {
        let Some(ent) = self.shared.entries.get(idx).and_then(OnceLock::get) else {
            error!("fuse io_uring: completion of unknown entry {idx}");
            self.shared.held.fetch_sub(1, Ordering::AcqRel);
            return false;
        };
        // SAFETY: the kernel has completed the entry: its buffers hold a request nobody else
        // touches until its reply claims them.
        let (len, unique) = unsafe {
            let hdr = &*ent.headers.get();
            let len = u32::from_ne_bytes(hdr[0..4].try_into().unwrap()) as usize;
            let unique = u64::from_ne_bytes(hdr[8..16].try_into().unwrap());
            let payload_sz = u32::from_ne_bytes(
                hdr[HDR_ENT_IN_OUT + 16..HDR_ENT_IN_OUT + 20]
                    .try_into()
                    .unwrap(),
            ) as usize;
            let op_sz = len
                .saturating_sub(IN_HEADER_SIZE)
                .saturating_sub(payload_sz)
                .min(HDR_OP_IN_SIZE);
            let payload_sz = payload_sz.min(ent.payload.len());
            let len = IN_HEADER_SIZE + op_sz + payload_sz;
            if len > buf.len() {
                error!("fuse io_uring: request of {len} bytes");
                self.shared.held.fetch_sub(1, Ordering::AcqRel);
                return false;
            }
            buf[..IN_HEADER_SIZE].copy_from_slice(&hdr[..IN_HEADER_SIZE]);
            buf[IN_HEADER_SIZE..IN_HEADER_SIZE + op_sz]
                .copy_from_slice(&hdr[HDR_OP_IN..HDR_OP_IN + op_sz]);
            std::ptr::copy_nonoverlapping(
                UnsafeCell::raw_get(ent.payload.as_ptr()),
                buf[IN_HEADER_SIZE + op_sz..].as_mut_ptr(),
                payload_sz,
            );
            (len, unique)
        };
        REQUESTS.fetch_add(1, Ordering::Relaxed);
        ent.owed.store(unique, Ordering::Release);
        let sender = ReplySender::Uring(UringReplySender {
            ring: Arc::clone(&self.shared),
            entry: idx,
            commit_id: unique,
            ch: se.ch.sender(),
        });
        match RequestWithSender::with_sender(se.ch.sender(), sender, &buf[..len]) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                    return true;
                }
                req.dispatch(se);
            }
            None => {
                // Unparsable: answer EIO so the entry comes back.
                let sender = UringReplySender {
                    ring: Arc::clone(&self.shared),
                    entry: idx,
                    commit_id: unique,
                    ch: se.ch.sender(),
                };
                let _ = sender.send(&[IoSlice::new(&eio_header(unique))]);
            }
        }
        false
    }
}

/// How long a ring's thread may serve one request before the rescuer serves the requests
/// that came to its ring meanwhile, and how often the rescuer looks.
const RESCUE_AFTER: Duration = Duration::from_millis(5);

/// Threads the rescuer may run requests on at once (more wait for one of them).
const RESCUE_THREADS: usize = 64;

/// Serves the requests of a ring whose thread is busy with one request for longer than
/// [`RESCUE_AFTER`] (an engine call that hangs, a slow query).
///
/// The kernel puts a request on a free entry of its CPU's queue, whichever thread's ring it
/// belongs to; a thread serving one request does not see the ring's other completions until it
/// is done, where `/dev/fuse` would have handed them to another reader thread. Every
/// `RESCUE_AFTER` the rescuer looks at each ring: one whose thread has been serving for that
/// long and is not waiting in the kernel (its lock is free) gets its queued replies committed
/// and its completions taken, and each request goes to one of up to [`RESCUE_THREADS`] threads.
/// Its thread, once back, goes on as before. A ring's submissions all happen under its lock, so
/// the rescuer and the ring's thread never touch it at once.
pub(crate) struct Rescuer {
    cores: Vec<Arc<RingCore>>,
    stop: Arc<AtomicBool>,
}

/// Ends a [`Rescuer`].
#[derive(Debug, Clone)]
pub(crate) struct RescuerStop(Arc<AtomicBool>);

impl RescuerStop {
    pub(crate) fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}

type RescueJob = (Arc<RingCore>, usize);

impl Rescuer {
    pub(crate) fn new(cores: Vec<Arc<RingCore>>) -> (Rescuer, RescuerStop) {
        let stop = Arc::new(AtomicBool::new(false));
        (
            Rescuer {
                cores,
                stop: Arc::clone(&stop),
            },
            RescuerStop(stop),
        )
    }

    /// Looks at the rings until stopped; then ends its threads (each after its request).
    pub(crate) fn run<FS: Filesystem>(self, se: &SessionEventLoop<FS>) {
        let (tx, rx) = std::sync::mpsc::channel::<RescueJob>();
        let rx = Arc::new(Mutex::new(rx));
        // Requests sent to the threads and not yet served (queued or running).
        let inflight = Arc::new(AtomicUsize::new(0));
        let mut threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(RESCUE_AFTER);
            let now = clock_ns();
            for core in &self.cores {
                let since = core.busy_since.load(Ordering::Acquire);
                if since == 0 || now.saturating_sub(since) < RESCUE_AFTER.as_nanos() as u64 {
                    continue;
                }
                let Some(mut st) = core.state.try_lock() else {
                    continue;
                };
                let taken = match rescue(core, &mut st) {
                    Ok(v) => v,
                    Err(e) => {
                        warn!("fuse io_uring queue {}: rescue: {e}", core.shared.qid);
                        continue;
                    }
                };
                drop(st);
                for idx in taken {
                    // a thread for each request that would otherwise wait behind another
                    if inflight.load(Ordering::Acquire) >= threads.len()
                        && threads.len() < RESCUE_THREADS
                    {
                        match spawn_rescue_thread(se, threads.len(), &rx, &inflight) {
                            Ok(h) => threads.push(h),
                            Err(e) => warn!("fuse io_uring: rescue thread: {e}"),
                        }
                    }
                    if threads.is_empty() {
                        // No thread to run it on: serve it here rather than never.
                        let mut buf = FuseReadBuf::new();
                        core.serve(idx, buf.as_mut(), se);
                    } else {
                        inflight.fetch_add(1, Ordering::AcqRel);
                        let _ = tx.send((Arc::clone(core), idx));
                    }
                }
            }
        }
        drop(tx);
        for h in threads {
            let _ = h.join();
        }
    }
}

/// Commits what a busy ring's replies queued, and takes its completions: the requests to serve.
fn rescue(core: &RingCore, st: &mut RingState) -> io::Result<Vec<usize>> {
    if st.live == 0 {
        return Ok(Vec::new());
    }
    core.queue_commits(st)?;
    submit(&mut st.ring, 0)?;
    harvest(st);
    let mut taken = Vec::new();
    while let Some((ud, res, flags)) = st.pending.pop_front() {
        if let Some(idx) = core.take(st, ud, res, flags)? {
            taken.push(idx);
        }
    }
    // what `take` queued (a poll re-armed, an entry added)
    submit(&mut st.ring, 0)?;
    Ok(taken)
}

/// Submits what is queued and waits for `wait` completions (0: does not wait); a full
/// completion queue (EBUSY) or a signal (EINTR) leaves it for the next submission.
fn submit(ring: &mut IoUring<Entry128>, wait: usize) -> io::Result<()> {
    match ring.submit_and_wait(wait) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => Ok(()),
        Err(e) => Err(e),
    }
}

fn spawn_rescue_thread<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    n: usize,
    rx: &Arc<Mutex<std::sync::mpsc::Receiver<RescueJob>>>,
    inflight: &Arc<AtomicUsize>,
) -> io::Result<std::thread::JoinHandle<()>> {
    let name = format!("fuser-rescue-{n}");
    let el = SessionEventLoop {
        thread_name: name.clone(),
        ch: se.ch.clone(),
        filesystem: Arc::clone(&se.filesystem),
        allowed: se.allowed,
        session_owner: se.session_owner,
    };
    let rx = Arc::clone(rx);
    let inflight = Arc::clone(inflight);
    std::thread::Builder::new().name(name).spawn(move || {
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();
        loop {
            let job = rx.lock().recv();
            let Ok((core, idx)) = job else {
                return;
            };
            core.serve(idx, buf, &el);
            inflight.fetch_sub(1, Ordering::AcqRel);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(cpus_in_list("0-1\n"), Some(2));
        assert_eq!(cpus_in_list("0"), Some(1));
        assert_eq!(cpus_in_list("0-3,8,10-11"), Some(12));
        assert_eq!(cpus_in_list(""), None);
        assert_eq!(cpus_in_list("3-1"), None);
        assert_eq!(cpus_in_list("x"), None);
    }

    #[test]
    fn cmd_req_layout() {
        // struct fuse_uring_cmd_req: flags u64, commit_id u64, qid u16
        let c = cmd_req(0x1122_3344_5566_7788, 3);
        assert_eq!(&c[0..8], &[0u8; 8]);
        assert_eq!(
            u64::from_ne_bytes(c[8..16].try_into().unwrap()),
            0x1122_3344_5566_7788
        );
        assert_eq!(u16::from_ne_bytes(c[16..18].try_into().unwrap()), 3);
    }

    #[test]
    fn register_sets_two_iovecs() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = register_sqe(7, 1, iov.as_ptr(), 5);
        // SAFETY: Entry128 is 128 bytes, repr(C).
        let raw: &[u8; 128] = unsafe { &*(&sqe as *const Entry128).cast() };
        assert_eq!(raw[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            iov.as_ptr() as u64,
            "addr"
        );
        assert_eq!(
            u32::from_ne_bytes(raw[24..28].try_into().unwrap()),
            2,
            "len"
        );
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            FUSE_IO_URING_CMD_REGISTER,
            "cmd_op"
        );
        assert_eq!(
            u16::from_ne_bytes(raw[48 + 16..48 + 18].try_into().unwrap()),
            1,
            "qid"
        );
    }
}
