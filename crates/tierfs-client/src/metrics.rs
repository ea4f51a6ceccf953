//! Prometheus metrics of one client: operation counts and latencies, bytes per target.
//! Served on `--metrics ADDR` (`GET /metrics`) and in the mount's virtual stats file.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn latency_histogram() -> Histogram {
    // 1 µs .. ~16 s
    Histogram::new(exponential_buckets(1e-6, 4.0, 13))
}

pub struct Metrics {
    registry: Registry,
    ops: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    misses: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    read_bytes: Family<Labels, Counter>,
    written_bytes: Family<Labels, Counter>,
    pcc: Family<Labels, Counter>,
    recall_wakeups: Family<Labels, Counter>,
    recall_given_back: Family<Labels, Counter>,
    recall_subscriptions: Counter,
    recall_listening: Gauge,
    worker_runs: Family<Labels, Counter>,
    worker_errors: Family<Labels, Counter>,
    worker_paused: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// In-memory states of files (data/mod.rs `FileState`), set where they come and go.
    pub file_states: Gauge,
    /// Bytes buffered by writers and not yet committed, over all files.
    pub buffered_bytes: Gauge,
    /// Commits of buffered writes that failed and were kept for the next attempt.
    pub commits_put_back: Counter,
    /// Setattrs kept for the commit of the file's buffered writes (data/deferred.rs).
    pub setattrs_deferred: Counter,
    /// Read-only opens answered before their record reached the engine (DataPath::queue_open).
    pub opens_queued: Counter,
    /// GETXATTR and LISTXATTR answered without the engine (the inode has no xattrs).
    pub xattr_answered_locally: Counter,
    handles: parking_lot::RwLock<std::collections::HashMap<&'static str, OpHandles>>,
}

/// Counters (operations, errors, misses) and histogram of one operation, shared with the
/// registry.
type OpHandles = (Counter, Counter, Counter, Histogram);

/// Whether an operation that failed with `errno` gave a normal answer rather than an error:
/// "no such name" (ENOENT: every `stat` of a missing file, every path search), "no such
/// attribute" (ENODATA: each `ls -l` asks for ACLs and security labels), "already exists"
/// (EEXIST: O_EXCL lock files), "directory not empty" (ENOTEMPTY) and a conflicting lock for a
/// non-blocking `setlk` (EAGAIN). These are counted as misses, not errors.
pub fn is_miss(op: &str, errno: i32) -> bool {
    match errno {
        libc::ENOENT | libc::ENODATA | libc::EEXIST | libc::ENOTEMPTY => true,
        libc::EAGAIN => op == "setlk",
        _ => false,
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tierfs");
        let ops = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let latency = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let read_bytes = Family::<Labels, Counter>::default();
        let written_bytes = Family::<Labels, Counter>::default();
        registry.register("fuse_ops", "FUSE operations handled", ops.clone());
        registry.register(
            "fuse_errors",
            "FUSE operations that returned an error",
            errors.clone(),
        );
        let misses = Family::<Labels, Counter>::default();
        registry.register(
            "fuse_misses",
            "FUSE operations that gave a normal negative answer (ENOENT, ENODATA, EEXIST, \
             ENOTEMPTY, EAGAIN of a non-blocking lock); not counted as errors",
            misses.clone(),
        );
        registry.register("fuse_op_seconds", "FUSE operation latency", latency.clone());
        registry.register(
            "target_read_bytes",
            "Bytes read from each storage target",
            read_bytes.clone(),
        );
        registry.register(
            "target_written_bytes",
            "Bytes written to each storage target",
            written_bytes.clone(),
        );
        let pcc = Family::<Labels, Counter>::default();
        registry.register(
            "pcc_events",
            "Persistent client cache: hits, misses, attaches, write-backs, evictions, recalls, bytes",
            pcc.clone(),
        );
        let recall_wakeups = Family::<Labels, Counter>::default();
        registry.register(
            "pcc_recall_wakeups",
            "Times the PCC recall thread looked for requests to give leases back, by what woke \
             it: notification (from the metadata engine), poll (every 10 ms: no notifications, \
             or a request waiting for writers to close), safety (the once-a-second check while \
             listening)",
            recall_wakeups.clone(),
        );
        let recall_given_back = Family::<Labels, Counter>::default();
        registry.register(
            "pcc_recall_given_back",
            "RW-PCC leases given back on request, by what woke the recall thread that found the \
             request",
            recall_given_back.clone(),
        );
        let recall_subscriptions = Counter::default();
        registry.register(
            "pcc_recall_subscriptions",
            "Times the PCC recall thread started listening for notifications (again)",
            recall_subscriptions.clone(),
        );
        let recall_listening = Gauge::default();
        registry.register(
            "pcc_recall_listening",
            "1 while the PCC recall thread listens for notifications, 0 while it polls",
            recall_listening.clone(),
        );
        let worker_runs = Family::<Labels, Counter>::default();
        registry.register(
            "worker_runs",
            "Units of work each background worker did (docs/architecture.md, \"Background \
             workers\")",
            worker_runs.clone(),
        );
        let worker_errors = Family::<Labels, Counter>::default();
        registry.register(
            "worker_errors",
            "Errors of each background worker",
            worker_errors.clone(),
        );
        let worker_paused = Family::<Labels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "worker_paused_seconds",
            "Time each data-moving worker paused for tranquility (yielding to applications)",
            worker_paused.clone(),
        );
        let file_states = Gauge::default();
        registry.register(
            "file_states",
            "Files the data path keeps an in-memory state for (open, or with writes not yet \
             committed)",
            file_states.clone(),
        );
        let buffered_bytes = Gauge::default();
        registry.register(
            "buffered_bytes",
            "Bytes written by applications and not yet committed, over all files (bounded by \
             buffer_limit_mb)",
            buffered_bytes.clone(),
        );
        let commits_put_back = Counter::default();
        registry.register(
            "commits_put_back",
            "Commits of buffered writes that failed (the metadata engine or a target did not \
             answer) and whose data was kept for the next attempt",
            commits_put_back.clone(),
        );
        let setattrs_deferred = Counter::default();
        registry.register(
            "setattrs_deferred",
            "Setattrs (times, a mode that adds permissions, a chown that takes nothing away) of \
             a file with writes buffered here, committed in the transaction of those writes, \
             or of a file RW-cached here with a writer, sent with its next report",
            setattrs_deferred.clone(),
        );
        let opens_queued = Counter::default();
        registry.register(
            "opens_queued",
            "Read-only opens answered at once and recorded in the metadata engine with the next \
             batch of closes (or never, when their close came first)",
            opens_queued.clone(),
        );
        let xattr_answered_locally = Counter::default();
        registry.register(
            "xattr_answered_locally",
            "GETXATTR and LISTXATTR answered without reading the metadata engine: the inode \
             had no xattrs in an attribute reply less than attr_ttl ago",
            xattr_answered_locally.clone(),
        );
        Metrics {
            registry,
            file_states,
            buffered_bytes,
            commits_put_back,
            setattrs_deferred,
            opens_queued,
            xattr_answered_locally,
            ops,
            errors,
            misses,
            latency,
            read_bytes,
            written_bytes,
            pcc,
            recall_wakeups,
            recall_given_back,
            recall_subscriptions,
            recall_listening,
            worker_runs,
            worker_errors,
            worker_paused,
            handles: Default::default(),
        }
    }

    /// Records one finished operation: `err` is its errno if it failed (see [`is_miss`] for
    /// the ones counted as misses instead of errors).
    pub fn op(&self, name: &'static str, start: Instant, err: Option<i32>) {
        let elapsed = start.elapsed().as_secs_f64();
        // The per-operation handles are looked up once; the hot path only bumps them.
        let cached = self.handles.read().get(name).cloned();
        let (ops, errors, misses, latency) = match cached {
            Some(h) => h,
            None => {
                let l = vec![("op".to_string(), name.to_string())];
                let h = (
                    self.ops.get_or_create(&l).clone(),
                    self.errors.get_or_create(&l).clone(),
                    self.misses.get_or_create(&l).clone(),
                    self.latency.get_or_create(&l).clone(),
                );
                self.handles.write().insert(name, h.clone());
                h
            }
        };
        ops.inc();
        match err {
            None => {}
            Some(n) if is_miss(name, n) => {
                misses.inc();
            }
            Some(_) => {
                errors.inc();
            }
        }
        latency.observe(elapsed);
    }

    pub fn target_read(&self, target: u32, n: u64) {
        self.read_bytes
            .get_or_create(&vec![("target".to_string(), target.to_string())])
            .inc_by(n);
    }

    pub fn target_written(&self, target: u32, n: u64) {
        self.written_bytes
            .get_or_create(&vec![("target".to_string(), target.to_string())])
            .inc_by(n);
    }

    /// Counts a persistent-client-cache event (or bytes, for the `bytes_*` events).
    pub fn pcc(&self, event: &'static str, n: u64) {
        self.pcc
            .get_or_create(&vec![("event".to_string(), event.to_string())])
            .inc_by(n);
    }

    /// One wake-up of the PCC recall thread (`source`: notification, poll, safety) and the
    /// leases it gave back.
    pub fn recall_wakeup(&self, source: &'static str, given_back: u64) {
        let l = vec![("source".to_string(), source.to_string())];
        self.recall_wakeups.get_or_create(&l).inc();
        if given_back > 0 {
            self.recall_given_back.get_or_create(&l).inc_by(given_back);
        }
    }

    /// A background worker did a unit of work.
    pub fn worker_run(&self, worker: &str) {
        self.worker_runs
            .get_or_create(&vec![("worker".to_string(), worker.to_string())])
            .inc();
    }

    /// A background worker recorded an error.
    pub fn worker_error(&self, worker: &str) {
        self.worker_errors
            .get_or_create(&vec![("worker".to_string(), worker.to_string())])
            .inc();
    }

    /// A data-moving worker paused `d` for tranquility.
    pub fn worker_paused(&self, worker: &str, d: std::time::Duration) {
        self.worker_paused
            .get_or_create(&vec![("worker".to_string(), worker.to_string())])
            .inc_by(d.as_secs_f64());
    }

    /// The PCC recall thread started (`true`) or stopped listening for notifications.
    pub fn recall_listening(&self, on: bool) {
        if on {
            self.recall_subscriptions.inc();
        }
        self.recall_listening.set(on as i64);
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = encode(&mut s, &self.registry);
        s
    }

    /// Serves `GET /metrics` on `addr` from a background thread.
    pub fn serve(self: &Arc<Self>, addr: &str) -> std::io::Result<()> {
        let listener = TcpListener::bind(addr)?;
        let me = Arc::clone(self);
        std::thread::Builder::new().name("metrics".into()).spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf);
                let body = me.render();
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                    body.len(),
                    body
                );
            }
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_bytes() {
        let m = Metrics::new();
        m.op("read", Instant::now(), None);
        m.op("read", Instant::now(), Some(libc::EIO));
        m.target_written(1, 4096);
        let s = m.render();
        assert!(s.contains("tierfs_fuse_ops_total{op=\"read\"} 2"), "{s}");
        assert!(s.contains("tierfs_fuse_errors_total{op=\"read\"} 1"), "{s}");
        assert!(
            s.contains("tierfs_target_written_bytes_total{target=\"1\"} 4096"),
            "{s}"
        );
    }

    #[test]
    fn normal_answers_are_misses_not_errors() {
        let m = Metrics::new();
        m.op("lookup", Instant::now(), Some(libc::ENOENT));
        m.op("lookup", Instant::now(), Some(libc::ENOENT));
        m.op("getxattr", Instant::now(), Some(libc::ENODATA));
        m.op("mkdir", Instant::now(), Some(libc::EEXIST));
        m.op("rmdir", Instant::now(), Some(libc::ENOTEMPTY));
        m.op("setlk", Instant::now(), Some(libc::EAGAIN));
        m.op("write", Instant::now(), Some(libc::EAGAIN));
        m.op("write", Instant::now(), Some(libc::ENOSPC));
        m.op("open", Instant::now(), Some(libc::EACCES));
        let s = m.render();
        for want in [
            "tierfs_fuse_misses_total{op=\"lookup\"} 2",
            "tierfs_fuse_errors_total{op=\"lookup\"} 0",
            "tierfs_fuse_misses_total{op=\"getxattr\"} 1",
            "tierfs_fuse_errors_total{op=\"getxattr\"} 0",
            "tierfs_fuse_misses_total{op=\"mkdir\"} 1",
            "tierfs_fuse_misses_total{op=\"rmdir\"} 1",
            "tierfs_fuse_misses_total{op=\"setlk\"} 1",
            "tierfs_fuse_errors_total{op=\"write\"} 2",
            "tierfs_fuse_misses_total{op=\"write\"} 0",
            "tierfs_fuse_errors_total{op=\"open\"} 1",
        ] {
            assert!(s.contains(want), "{want} missing in {s}");
        }
    }

    #[test]
    fn renders_recall_wakeups_by_source() {
        let m = Metrics::new();
        m.recall_wakeup("poll", 0);
        m.recall_wakeup("notification", 2);
        m.recall_wakeup("notification", 0);
        m.recall_listening(true);
        m.recall_listening(false);
        m.recall_listening(true);
        let s = m.render();
        for want in [
            "tierfs_pcc_recall_wakeups_total{source=\"poll\"} 1",
            "tierfs_pcc_recall_wakeups_total{source=\"notification\"} 2",
            "tierfs_pcc_recall_given_back_total{source=\"notification\"} 2",
            "tierfs_pcc_recall_subscriptions_total 2",
            "tierfs_pcc_recall_listening 1",
        ] {
            assert!(s.contains(want), "{want} missing in {s}");
        }
        assert!(!s.contains("given_back_total{source=\"poll\"}"), "{s}");
    }
}
