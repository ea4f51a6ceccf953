//! Background workers: each periodic or queued job of the daemon (heartbeat, session reaping,
//! close recording, PCC write-back/validation/eviction, PCC recalls, garbage collection,
//! compaction, metadata maintenance, publishing these reports) is a named [`Worker`] on a
//! thread of its own, with its own state, counters and last error, so that no job waits behind
//! another: a long write-back or compaction cannot delay a heartbeat.
//!
//! The model is Garage's background workers (a `Worker` that does one unit of work per call
//! and says whether more is waiting) and its tranquilizer; the code is tierfs's own, on plain
//! threads (the daemon's jobs block on the database and on the I/O runtime).
//!
//! - A worker's [`Worker::work`] does one unit and returns [`Next::More`] (run again at once),
//!   [`Next::Idle`] (nothing more now: run again one [`Worker::interval`] after this round
//!   began) or [`Next::Done`] (the thread ends). An `Err` is counted, kept as the last error
//!   with its time, logged, and the worker runs again after its interval. A panic kills the
//!   worker (state `dead`, the panic as its last error), not the daemon.
//! - **Tranquility**: a worker that moves data ([`Worker::moves_data`]: compaction, PCC
//!   write-back, later HSM movers) sleeps `tranquility x` the time each unit took before it
//!   goes on (state `sleeping`; after the last unit of a round, at least that long before the
//!   next round), so that it uses at most `1 / (1 + tranquility)` of the time and leaves the disk
//!   and network to applications (config key `tranquility`, default 1).
//! - [`Workers`] owns the threads: [`Workers::stop`] stops a group of workers (each finishes
//!   the unit it is in, then runs its [`Worker::finish`]) and joins them, so the daemon stops
//!   them in the order unmounting needs (docs/architecture.md). [`Workers::snapshot`] gives
//!   every worker's [`Status`]; the `worker-reports` worker publishes it to the metadata
//!   database for `tierfs status`.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use thiserror::Error;

pub mod follow;
pub mod jobs;

/// What went wrong in a unit of work (kept as the worker's last error).
#[derive(Debug, Error)]
pub enum WorkError {
    #[error("{0}")]
    Failed(String),
}

impl From<crate::error::ClientError> for WorkError {
    fn from(e: crate::error::ClientError) -> Self {
        WorkError::Failed(e.to_string())
    }
}

impl From<tierfs_meta::MetaError> for WorkError {
    fn from(e: tierfs_meta::MetaError) -> Self {
        WorkError::Failed(e.to_string())
    }
}

impl From<String> for WorkError {
    fn from(e: String) -> Self {
        WorkError::Failed(e)
    }
}

/// What a worker does after a unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A unit was done and more may be waiting: run again (after the tranquility pause, for a
    /// worker that moves data).
    More,
    /// Nothing more to do now: run again one interval after this round began.
    Idle,
    /// Finished: the thread ends (after [`Worker::finish`]).
    Done,
}

/// A background job of the daemon.
pub trait Worker: Send + 'static {
    /// Its name, as `tierfs status` shows it.
    fn name(&self) -> &'static str;
    /// How often it runs when idle (and how soon it runs again after an error).
    fn interval(&self) -> Duration;
    /// Whether it moves data (its units are followed by tranquility pauses).
    fn moves_data(&self) -> bool {
        false
    }
    /// One unit of work.
    fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError>;
    /// Runs once on the worker's thread when it is stopped, after its last unit: final work
    /// (e.g. recording closes still queued).
    fn finish(&mut self, _ctx: &Ctx) {}
}

/// A worker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Waiting for its next round.
    Idle,
    /// In a unit of work.
    Busy,
    /// In a tranquility pause after a unit of work (yielding to applications).
    Sleeping,
    /// Its thread ended (stopped, finished, or panicked).
    Dead,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Busy => "busy",
            State::Sleeping => "sleeping",
            State::Dead => "dead",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A worker's status at one moment (what `tierfs status` shows). Times are nanoseconds since
/// the Unix epoch, 0 for never.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub name: String,
    pub state: State,
    /// What it is doing or last did, in a few words ("" if nothing to say).
    pub progress: String,
    /// Units of work done (calls of [`Worker::work`], or passes the worker counts itself).
    pub runs: u64,
    pub errors: u64,
    /// When its last unit of work began.
    pub last_run: i64,
    /// The last error and when it happened.
    pub last_error: Option<(i64, String)>,
    /// How long its last unit took and the tranquility pause asked for after it.
    pub last_unit: Duration,
    pub last_pause: Duration,
}

/// The report of a worker's status that the metadata database keeps (`tierfs status`).
pub fn report_of(s: &Status) -> tierfs_meta::WorkerReport {
    tierfs_meta::WorkerReport {
        session: 0,
        name: s.name.clone(),
        state: s.state.as_str().to_string(),
        progress: s.progress.clone(),
        runs: s.runs,
        errors: s.errors,
        last_run: s.last_run,
        last_error: s.last_error.as_ref().map(|e| e.1.clone()),
        last_error_at: s.last_error.as_ref().map(|e| e.0).unwrap_or(0),
        reported: now_nanos(),
    }
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The shared part of one worker: its status and its stop signal.
struct Slot {
    status: Mutex<Status>,
    stop: AtomicBool,
    /// Wakes the worker's sleeps when it is stopped.
    wake: Condvar,
    wake_lock: Mutex<()>,
}

impl Slot {
    fn set_state(&self, s: State) {
        self.status.lock().state = s;
    }
}

/// What a worker's unit of work sees of its own slot.
pub struct Ctx {
    slot: Arc<Slot>,
    name: &'static str,
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Ctx {
    /// Whether the worker was asked to stop (a long unit should return soon).
    pub fn stopping(&self) -> bool {
        self.slot.stop.load(Ordering::Relaxed)
    }

    /// Sleeps `d`, or less if the worker is stopped meanwhile; false if it was.
    pub fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut g = self.slot.wake_lock.lock();
        while !self.stopping() {
            if self.slot.wake.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        !self.stopping()
    }

    /// Sets the progress text `tierfs status` shows.
    pub fn progress(&self, text: impl Into<String>) {
        self.slot.status.lock().progress = text.into();
    }

    /// Sets the state (for a worker that runs its own loop inside one unit, as the recall
    /// worker does: idle while it waits, busy while it works).
    pub fn state(&self, s: State) {
        self.slot.set_state(s);
    }

    /// Counts a unit of work done by a worker that runs its own loop.
    pub fn count_run(&self) {
        {
            let mut st = self.slot.status.lock();
            st.runs += 1;
            st.last_run = now_nanos();
        }
        if let Some(m) = &self.metrics {
            m.worker_run(self.name);
        }
    }

    /// Records (and logs) an error that does not end the unit (e.g. one file of several
    /// failed).
    pub fn error(&self, e: impl std::fmt::Display) {
        let msg = e.to_string();
        tracing::warn!(worker = self.name, "{msg}");
        self.note_error(msg);
    }

    /// Records an error without logging it (the worker logs in its own way, e.g. once per
    /// outage).
    pub fn note_error(&self, msg: String) {
        {
            let mut st = self.slot.status.lock();
            st.errors += 1;
            st.last_error = Some((now_nanos(), msg));
        }
        if let Some(m) = &self.metrics {
            m.worker_error(self.name);
        }
    }

    /// The worker's stop flag, for code that runs its own loop and takes one.
    pub fn stop_flag(&self) -> &AtomicBool {
        &self.slot.stop
    }
}

/// The pause after a unit of work of a data mover: `tranquility x` the time it took.
pub fn tranquil_pause(took: Duration, tranquility: f64) -> Duration {
    if tranquility > 0.0 && tranquility.is_finite() {
        took.mul_f64(tranquility)
    } else {
        Duration::ZERO
    }
}

/// The registry of the daemon's workers (shared with the worker that publishes their status).
#[derive(Default)]
pub struct Registry {
    slots: Mutex<Vec<Arc<Slot>>>,
}

impl Registry {
    /// Every worker's status, in the order they were started.
    pub fn snapshot(&self) -> Vec<Status> {
        self.slots
            .lock()
            .iter()
            .map(|s| s.status.lock().clone())
            .collect()
    }
}

/// One started worker: its name, its slot, its thread until joined.
struct Running {
    name: &'static str,
    slot: Arc<Slot>,
    thread: Option<JoinHandle<()>>,
}

/// The daemon's workers: starts them, stops them in groups, gives their status.
pub struct Workers {
    registry: Arc<Registry>,
    threads: Vec<Running>,
    tranquility: f64,
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Workers {
    /// No workers yet; data movers will pause `tranquility x` each unit's time.
    pub fn new(tranquility: f64) -> Workers {
        Workers {
            registry: Arc::new(Registry::default()),
            threads: Vec::new(),
            tranquility,
            metrics: None,
        }
    }

    /// Also counts runs, errors and tranquility pauses in `metrics` (`tierfs_worker_*`).
    pub fn with_metrics(tranquility: f64, metrics: Arc<crate::metrics::Metrics>) -> Workers {
        let mut w = Workers::new(tranquility);
        w.metrics = Some(metrics);
        w
    }

    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// Every worker's status, in the order they were started.
    pub fn snapshot(&self) -> Vec<Status> {
        self.registry.snapshot()
    }

    /// Starts `w` on a thread named `tierfs-<name>`.
    pub fn spawn(&mut self, w: impl Worker) -> std::io::Result<()> {
        let name = w.name();
        let slot = Arc::new(Slot {
            status: Mutex::new(Status {
                name: name.to_string(),
                state: State::Idle,
                progress: String::new(),
                runs: 0,
                errors: 0,
                last_run: 0,
                last_error: None,
                last_unit: Duration::ZERO,
                last_pause: Duration::ZERO,
            }),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
            wake_lock: Mutex::new(()),
        });
        let ctx = Ctx {
            slot: Arc::clone(&slot),
            name,
            metrics: self.metrics.clone(),
        };
        let tranquility = self.tranquility;
        // Registered before its thread starts: a worker that reads the registry at once (the
        // reports worker's first publish) finds itself in it.
        self.registry.slots.lock().push(Arc::clone(&slot));
        let h = match std::thread::Builder::new()
            // (thread names are cut at 15 bytes by the kernel)
            .name(format!("tierfs-{name}"))
            .spawn(move || run(w, ctx, tranquility))
        {
            Ok(h) => h,
            Err(e) => {
                self.registry
                    .slots
                    .lock()
                    .retain(|s| !Arc::ptr_eq(s, &slot));
                return Err(e);
            }
        };
        self.threads.push(Running {
            name,
            slot,
            thread: Some(h),
        });
        Ok(())
    }

    /// Stops the workers named (each finishes its current unit and runs its
    /// [`Worker::finish`]), all at once, and waits for them. Unknown names are ignored.
    pub fn stop(&mut self, names: &[&str]) {
        let chosen = || self.threads.iter().filter(|r| names.contains(&r.name));
        for r in chosen() {
            r.slot.stop.store(true, Ordering::Relaxed);
            let _g = r.slot.wake_lock.lock();
            r.slot.wake.notify_all();
        }
        for r in self.threads.iter_mut().filter(|r| names.contains(&r.name)) {
            if let Some(h) = r.thread.take() {
                if h.join().is_err() {
                    // run() catches panics of the worker's code; this is the runner's own.
                    tracing::error!(worker = r.name, "worker thread panicked");
                }
            }
        }
    }

    /// Stops every worker still running, all at once.
    pub fn stop_all(&mut self) {
        let names: Vec<&'static str> = self.threads.iter().map(|t| t.name).collect();
        self.stop(&names);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

/// A worker's thread.
fn run(mut w: impl Worker, ctx: Ctx, tranquility: f64) {
    let slot = Arc::clone(&ctx.slot);
    let name = ctx.name;
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut round = Instant::now();
        let mut idle_before = true;
        while !ctx.stopping() {
            if idle_before {
                round = Instant::now();
            }
            let t0 = Instant::now();
            slot.set_state(State::Busy);
            ctx.count_run();
            let r = w.work(&ctx);
            let took = t0.elapsed();
            let mut pause = Duration::ZERO;
            let mut last_pause = Duration::ZERO;
            let next = match r {
                Ok(Next::Done) => break,
                Ok(Next::More) => {
                    idle_before = false;
                    if w.moves_data() {
                        pause = tranquil_pause(took, tranquility);
                        last_pause = pause;
                    }
                    None
                }
                Ok(Next::Idle) => {
                    idle_before = true;
                    // The pause is part of the wait for the next round (state idle).
                    let mut at = round + w.interval();
                    if w.moves_data() {
                        let p = tranquil_pause(took, tranquility);
                        at = at.max(Instant::now() + p);
                        last_pause = p;
                    }
                    Some(at)
                }
                Err(e) => {
                    ctx.error(e);
                    idle_before = true;
                    Some(Instant::now() + w.interval())
                }
            };
            {
                let mut st = slot.status.lock();
                st.last_unit = took;
                st.last_pause = last_pause;
                st.state = if pause.is_zero() {
                    State::Idle
                } else {
                    State::Sleeping
                };
            }
            if let Some(m) = ctx.metrics.as_ref().filter(|_| !last_pause.is_zero()) {
                m.worker_paused(name, last_pause);
            }
            if !pause.is_zero() && !ctx.sleep(pause) {
                break;
            }
            if let Some(at) = next {
                slot.set_state(State::Idle);
                let now = Instant::now();
                if at > now && !ctx.sleep(at - now) {
                    break;
                }
            }
        }
        slot.set_state(State::Busy);
        w.finish(&ctx);
    }));
    if let Err(p) = outcome {
        let msg = format!("panicked: {}", panic_text(p.as_ref()));
        tracing::error!(worker = name, "{msg}");
        ctx.note_error(msg);
    }
    slot.set_state(State::Dead);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    type Unit = Box<dyn FnMut(&Ctx) -> Result<Next, WorkError> + Send>;

    /// A worker whose units do what the test says.
    struct Probe {
        name: &'static str,
        interval: Duration,
        moves_data: bool,
        unit: Unit,
        finished: Arc<AtomicBool>,
    }

    impl Worker for Probe {
        fn name(&self) -> &'static str {
            self.name
        }
        fn interval(&self) -> Duration {
            self.interval
        }
        fn moves_data(&self) -> bool {
            self.moves_data
        }
        fn work(&mut self, ctx: &Ctx) -> Result<Next, WorkError> {
            (self.unit)(ctx)
        }
        fn finish(&mut self, _ctx: &Ctx) {
            self.finished.store(true, Ordering::SeqCst);
        }
    }

    fn probe(
        name: &'static str,
        interval_ms: u64,
        unit: impl FnMut(&Ctx) -> Result<Next, WorkError> + Send + 'static,
    ) -> (Probe, Arc<AtomicBool>) {
        let finished = Arc::new(AtomicBool::new(false));
        (
            Probe {
                name,
                interval: Duration::from_millis(interval_ms),
                moves_data: false,
                unit: Box::new(unit),
                finished: Arc::clone(&finished),
            },
            finished,
        )
    }

    fn status(w: &Workers, name: &str) -> Status {
        w.snapshot()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no worker {name}"))
    }

    fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        f()
    }

    #[test]
    fn a_blocked_worker_does_not_delay_the_heartbeat() {
        let mut w = Workers::new(0.0);
        // A worker whose one unit blocks for 3 s (a long write-back).
        let (blocker, _) = probe("blocker", 10, |ctx| {
            ctx.progress("writing back");
            std::thread::sleep(Duration::from_secs(3));
            Ok(Next::Idle)
        });
        let ticks = Arc::new(Mutex::new(Vec::<Instant>::new()));
        let (hb, _) = {
            let ticks = Arc::clone(&ticks);
            probe("heartbeat", 50, move |_| {
                ticks.lock().push(Instant::now());
                Ok(Next::Idle)
            })
        };
        w.spawn(blocker).unwrap();
        w.spawn(hb).unwrap();
        assert!(wait_for(Duration::from_secs(2), || status(&w, "blocker")
            .state
            == State::Busy));
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(1500));
        // Still blocked, and the heartbeat kept its 50 ms period meanwhile.
        let b = status(&w, "blocker");
        assert_eq!(b.state, State::Busy);
        assert_eq!(b.progress, "writing back");
        let during: Vec<Instant> = ticks.lock().iter().copied().filter(|t| *t >= t0).collect();
        assert!(
            during.len() >= 10,
            "{} heartbeats in 1.5 s while another worker was blocked",
            during.len()
        );
        let longest = during.windows(2).map(|p| p[1] - p[0]).max().unwrap();
        assert!(
            longest < Duration::from_millis(1000),
            "a heartbeat gap of {longest:?}"
        );
        w.stop_all();
    }

    #[test]
    fn stop_ends_the_unit_then_finish_runs_and_the_state_is_dead() {
        let mut w = Workers::new(0.0);
        let units = Arc::new(AtomicU64::new(0));
        let (p, finished) = {
            let units = Arc::clone(&units);
            probe("idle-long", 60_000, move |_| {
                units.fetch_add(1, Ordering::SeqCst);
                Ok(Next::Idle)
            })
        };
        w.spawn(p).unwrap();
        assert!(wait_for(Duration::from_secs(2), || units
            .load(Ordering::SeqCst)
            == 1));
        // Waiting out a 60 s interval: the stop wakes it.
        let t0 = Instant::now();
        w.stop(&["idle-long"]);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(finished.load(Ordering::SeqCst), "finish did not run");
        let s = status(&w, "idle-long");
        assert_eq!(s.state, State::Dead);
        assert_eq!(s.runs, 1);
        assert_eq!(units.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn stop_waits_for_the_unit_in_progress_and_only_stops_the_named() {
        let mut w = Workers::new(0.0);
        let (slow, slow_done) = probe("slow", 10, |_| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(Next::Idle)
        });
        let (other, other_done) = probe("other", 10, |_| Ok(Next::Idle));
        w.spawn(slow).unwrap();
        w.spawn(other).unwrap();
        assert!(wait_for(Duration::from_secs(2), || status(&w, "slow")
            .state
            == State::Busy));
        w.stop(&["slow"]);
        // Joined: its unit ended and finish ran before stop returned.
        assert!(slow_done.load(Ordering::SeqCst));
        assert_eq!(status(&w, "slow").state, State::Dead);
        assert!(!other_done.load(Ordering::SeqCst));
        assert_ne!(status(&w, "other").state, State::Dead);
        w.stop(&["other"]);
        assert!(other_done.load(Ordering::SeqCst));
    }

    #[test]
    fn errors_are_counted_with_the_last_one_and_its_time() {
        let mut w = Workers::new(0.0);
        let n = Arc::new(AtomicU64::new(0));
        let (p, _) = {
            let n = Arc::clone(&n);
            probe("flaky", 10, move |ctx| {
                let i = n.fetch_add(1, Ordering::SeqCst);
                match i {
                    0 => Err(WorkError::Failed("database is locked".into())),
                    1 => {
                        ctx.error("one file of two failed");
                        Ok(Next::Idle)
                    }
                    2 => Err(WorkError::Failed("connection refused".into())),
                    _ => Ok(Next::Idle),
                }
            })
        };
        let before = now_nanos();
        w.spawn(p).unwrap();
        assert!(wait_for(Duration::from_secs(2), || status(&w, "flaky")
            .runs
            >= 5));
        let s = status(&w, "flaky");
        assert_eq!(s.errors, 3);
        let (at, msg) = s.last_error.expect("a last error");
        assert_eq!(msg, "connection refused");
        assert!(at >= before && at <= now_nanos());
        assert!(s.last_run >= at);
        w.stop_all();
        // A later success keeps the last error.
        assert_eq!(
            status(&w, "flaky").last_error.map(|e| e.1).as_deref(),
            Some("connection refused")
        );
    }

    #[test]
    fn a_panicking_worker_is_dead_with_the_panic_as_last_error() {
        let mut w = Workers::new(0.0);
        let (p, _) = probe("broken", 10, |_| panic!("slice index out of range"));
        let (ok, _) = probe("fine", 10, |_| Ok(Next::Idle));
        w.spawn(p).unwrap();
        w.spawn(ok).unwrap();
        assert!(wait_for(Duration::from_secs(2), || status(&w, "broken")
            .state
            == State::Dead));
        let s = status(&w, "broken");
        assert_eq!(s.errors, 1);
        assert!(
            s.last_error.unwrap().1.contains("slice index out of range"),
            "the panic is the last error"
        );
        assert_ne!(status(&w, "fine").state, State::Dead);
        w.stop_all();
    }

    #[test]
    fn idle_workers_run_once_per_interval_and_more_runs_again_at_once() {
        let mut w = Workers::new(0.0);
        let (idle, _) = probe("idle", 100, |_| Ok(Next::Idle));
        let left = Arc::new(AtomicU64::new(50));
        let (busy, _) = {
            let left = Arc::clone(&left);
            probe("queue", 60_000, move |_| {
                if left.load(Ordering::SeqCst) == 0 {
                    return Ok(Next::Idle);
                }
                left.fetch_sub(1, Ordering::SeqCst);
                Ok(Next::More)
            })
        };
        w.spawn(idle).unwrap();
        w.spawn(busy).unwrap();
        std::thread::sleep(Duration::from_millis(550));
        let runs = status(&w, "idle").runs;
        assert!((4..=7).contains(&runs), "{runs} runs in 550 ms at 100 ms");
        // 50 queued units, no tranquility: done long before the 60 s interval.
        assert_eq!(left.load(Ordering::SeqCst), 0);
        assert_eq!(status(&w, "queue").runs, 51);
        w.stop_all();
    }

    #[test]
    fn tranquility_pauses_a_mover_in_proportion_to_each_unit() {
        for tranquility in [0.0, 0.5, 2.0] {
            let mut w = Workers::new(tranquility);
            let pauses = Arc::new(Mutex::new(Vec::<(Duration, Duration)>::new()));
            let (mut p, _) = probe("mover", 60_000, move |_| {
                std::thread::sleep(Duration::from_millis(40));
                Ok(Next::More)
            });
            p.moves_data = true;
            w.spawn(p).unwrap();
            // Watch the pause asked for after each unit.
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(600) {
                let s = status(&w, "mover");
                if !s.last_unit.is_zero() {
                    let mut v = pauses.lock();
                    if v.last() != Some(&(s.last_unit, s.last_pause)) {
                        v.push((s.last_unit, s.last_pause));
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            w.stop_all();
            let v = pauses.lock();
            assert!(!v.is_empty());
            for (unit, pause) in v.iter() {
                assert!(*unit >= Duration::from_millis(40));
                assert_eq!(*pause, unit.mul_f64(tranquility), "t = {tranquility}");
            }
        }
        // The last unit of a round (Idle) is followed by its pause too, as part of the wait
        // for the next round: 30 ms of work, tranquility 3, interval 1 ms.
        let mut w = Workers::new(3.0);
        let (mut p, _) = probe("round-mover", 1, |_| {
            std::thread::sleep(Duration::from_millis(30));
            Ok(Next::Idle)
        });
        p.moves_data = true;
        w.spawn(p).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let s = status(&w, "round-mover");
        w.stop_all();
        assert!(s.last_unit >= Duration::from_millis(30));
        assert_eq!(s.last_pause, s.last_unit.mul_f64(3.0));
        // Each round takes at least 30 + 90 ms: at most 5 rounds began in 600 ms (the
        // interval alone would allow 19).
        assert!(s.runs <= 5, "{} rounds in 600 ms", s.runs);
        // A worker that does not move data never pauses, whatever the setting.
        let mut w = Workers::new(5.0);
        let (p, _) = probe("meta-only", 60_000, |_| {
            std::thread::sleep(Duration::from_millis(5));
            Ok(Next::More)
        });
        w.spawn(p).unwrap();
        assert!(wait_for(Duration::from_secs(2), || status(&w, "meta-only")
            .runs
            > 5));
        assert_eq!(status(&w, "meta-only").last_pause, Duration::ZERO);
        w.stop_all();
    }

    #[test]
    fn runs_errors_and_pauses_are_counted_in_the_metrics() {
        let m = Arc::new(crate::metrics::Metrics::new());
        let mut w = Workers::with_metrics(1.0, Arc::clone(&m));
        let n = Arc::new(AtomicU64::new(0));
        let (mut p, _) = {
            let n = Arc::clone(&n);
            probe("mover", 60_000, move |_| {
                let i = n.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
                match i {
                    0 | 1 => Ok(Next::More),
                    // then it waits its 60 s interval
                    _ => Err(WorkError::Failed("target unreachable".into())),
                }
            })
        };
        p.moves_data = true;
        w.spawn(p).unwrap();
        assert!(wait_for(Duration::from_secs(2), || n
            .load(Ordering::SeqCst)
            >= 3));
        std::thread::sleep(Duration::from_millis(100));
        w.stop_all();
        let text = m.render();
        let value = |key: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {key} in\n{text}"))
                .trim()
                .parse()
                .unwrap()
        };
        assert_eq!(value("tierfs_worker_runs_total{worker=\"mover\"}"), 3.0);
        assert_eq!(value("tierfs_worker_errors_total{worker=\"mover\"}"), 1.0);
        // The two units that did work were each followed by a pause of at least 10 ms.
        let paused = value("tierfs_worker_paused_seconds_total{worker=\"mover\"}");
        assert!(paused >= 0.020, "paused {paused} s");
    }

    #[test]
    fn the_pause_is_tranquility_times_the_unit() {
        assert_eq!(
            tranquil_pause(Duration::from_millis(200), 1.0),
            Duration::from_millis(200)
        );
        assert_eq!(
            tranquil_pause(Duration::from_millis(200), 2.5),
            Duration::from_millis(500)
        );
        assert_eq!(tranquil_pause(Duration::from_secs(3), 0.0), Duration::ZERO);
        assert_eq!(
            tranquil_pause(Duration::from_secs(3), f64::NAN),
            Duration::ZERO
        );
    }

    #[test]
    fn a_sleeping_mover_shows_sleeping_and_stops_without_waiting_out_its_pause() {
        let mut w = Workers::new(1000.0);
        let (mut p, _) = probe("mover", 60_000, |_| {
            std::thread::sleep(Duration::from_millis(20));
            Ok(Next::More)
        });
        p.moves_data = true;
        w.spawn(p).unwrap();
        // 20 ms of work, then a 20 s pause.
        assert!(wait_for(Duration::from_secs(2), || status(&w, "mover")
            .state
            == State::Sleeping));
        let s = status(&w, "mover");
        assert!(s.last_pause >= Duration::from_secs(20));
        let t0 = Instant::now();
        w.stop_all();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(status(&w, "mover").runs, 1);
    }
}
