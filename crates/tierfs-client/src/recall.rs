//! The PCC recall thread: gives RW-PCC leases back when other clients ask for them (an open
//! elsewhere waits on it, see docs/pcc.md).
//!
//! How the thread learns of a request depends on the metadata engine:
//!
//! - **With notifications** (PostgreSQL: [`MetaEngine::listen`] gives a listener) the thread
//!   sleeps in [`Listener::wait`] and looks for requests when a notice arrives, and once every
//!   [`Timing::safety`] in case one was missed (a notice sent while the listener was
//!   disconnected is not replayed), and once right after each (re)subscription.
//! - **Without** (SQLite, whose engine has none) it polls every [`Timing::poll`] (10 ms), as it
//!   also does while the listener is lost (the database went away: it subscribes again with a
//!   backoff from [`Timing::backoff_min`] doubling to [`Timing::backoff_max`], and logs once per
//!   outage) and while a request waits for this client's writers of the file to close (their
//!   writes bypass the daemon, so no event says when they are done).
//!
//! Each pass is counted in the metrics by what caused it (`tierfs_pcc_recall_wakeups_total`,
//! `source` = notification, poll or safety), with the leases it gave back.
//!
//! [`MetaEngine::listen`]: tierfs_meta::MetaEngine::listen

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tierfs_meta::{Listener, MetaError};

use crate::metrics::Metrics;

/// The recall thread's clock.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Polling interval: no notifications, listener lost, or a request waiting for writers.
    pub poll: Duration,
    /// Longest single wait for a notice (how soon the thread sees that it must stop).
    pub slice: Duration,
    /// While listening, look for requests at least this often anyway.
    pub safety: Duration,
    /// First delay before subscribing again after the listener was lost.
    pub backoff_min: Duration,
    /// Longest delay between two attempts to subscribe.
    pub backoff_max: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            poll: Duration::from_millis(10),
            slice: Duration::from_millis(250),
            safety: Duration::from_secs(1),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// What one pass over the requests did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Leases given back.
    pub given_back: u64,
    /// Requests left for later because this client still has writers of the file: polled for
    /// at the [`Timing::poll`] rate until they are served.
    pub waiting: u64,
}

/// What the thread drives: [`crate::pcc::Pcc`], or a stand-in in tests.
pub trait RecallWork {
    /// Subscribes to recall requests addressed to this client. `Ok(None)`: the engine has no
    /// notifications (poll).
    fn listen(&self) -> tierfs_meta::Result<Option<Box<dyn Listener>>>;
    /// Gives back the leases asked for (those without writers on this client). An error: the
    /// requests could not be read.
    fn pass(&self) -> tierfs_meta::Result<Pass>;
}

/// What woke the thread for a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Notification,
    Poll,
    Safety,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::Notification => "notification",
            Source::Poll => "poll",
            Source::Safety => "safety",
        }
    }
}

/// Runs the recall thread until `stop` is set.
pub fn run(work: &dyn RecallWork, metrics: &Metrics, stop: &AtomicBool, t: &Timing) {
    run_observed(work, metrics, stop, t, &mut |_, _| {})
}

/// What [`run_observed`] tells its observer after each pass: whether it listens for
/// notifications (else it polls), and the pass's outcome.
pub type PassObserver<'a> = dyn FnMut(bool, &tierfs_meta::Result<Pass>) + 'a;

/// [`run`], telling `observe` about each pass (the `pcc-recall` worker counts them and keeps
/// the last error, see [`crate::workers`]).
pub fn run_observed(
    work: &dyn RecallWork,
    metrics: &Metrics,
    stop: &AtomicBool,
    t: &Timing,
    observe: &mut PassObserver<'_>,
) {
    let mut listener: Option<Box<dyn Listener>> = None;
    // False once the engine said it has no notifications: then only poll.
    let mut notifications = true;
    let mut listening_since = Instant::now();
    let mut retry_at = Instant::now();
    let mut backoff = t.backoff_min;
    // Since when the listener is lost; the outage is logged once, at its start and its end.
    let mut outage: Option<Instant> = None;
    // Whether reading the requests fails (logged once per run of failures).
    let mut failing = false;
    let mut waiting = 0u64;
    let mut last_pass = Instant::now();
    // A first pass at once: requests made before this client listened.
    let mut due = Some(Source::Safety);
    loop {
        if let Some(src) = due.take() {
            last_pass = Instant::now();
            let outcome = work.pass();
            observe(listener.is_some(), &outcome);
            match outcome {
                Ok(p) => {
                    metrics.recall_wakeup(src.label(), p.given_back);
                    waiting = p.waiting;
                    if failing {
                        failing = false;
                        tracing::info!("reading PCC recall requests works again");
                    }
                }
                Err(e) => {
                    metrics.recall_wakeup(src.label(), 0);
                    if !failing {
                        failing = true;
                        tracing::warn!("reading PCC recall requests failed: {e} (retrying)");
                    }
                }
            }
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if notifications && listener.is_none() && Instant::now() >= retry_at {
            match work.listen() {
                Ok(Some(l)) => {
                    listener = Some(l);
                    listening_since = Instant::now();
                    metrics.recall_listening(true);
                    if let Some(since) = outage.take() {
                        tracing::info!(
                            "listening for PCC recall requests again after {:.1?}",
                            since.elapsed()
                        );
                    }
                    // Requests made while nobody listened were not announced.
                    due = Some(Source::Safety);
                    continue;
                }
                Ok(None) => {
                    notifications = false;
                    tracing::debug!(
                        "the metadata engine has no notifications: polling for PCC recall \
                         requests every {:?}",
                        t.poll
                    );
                }
                Err(e) => {
                    if outage.is_none() {
                        outage = Some(Instant::now());
                        tracing::warn!(
                            "cannot listen for PCC recall requests: {e}; polling every {:?} \
                             and trying again meanwhile",
                            t.poll
                        );
                    }
                    retry_at = Instant::now() + backoff;
                    backoff = (backoff * 2).min(t.backoff_max);
                }
            }
        }
        let Some(l) = listener.as_mut() else {
            std::thread::sleep(t.poll);
            due = Some(Source::Poll);
            continue;
        };
        let wait = if waiting > 0 {
            t.poll
        } else {
            t.slice.min(t.safety.saturating_sub(last_pass.elapsed()))
        };
        match l.wait(wait) {
            Ok(notices) if !notices.is_empty() => due = Some(Source::Notification),
            Ok(_) if waiting > 0 => due = Some(Source::Poll),
            Ok(_) if last_pass.elapsed() >= t.safety => due = Some(Source::Safety),
            Ok(_) => {}
            Err(e) => {
                listener = None;
                metrics.recall_listening(false);
                // A listener that lived a while starts the backoff over; one that keeps
                // failing at once does not.
                if listening_since.elapsed() >= t.backoff_max {
                    backoff = t.backoff_min;
                }
                retry_at = Instant::now() + backoff;
                backoff = (backoff * 2).min(t.backoff_max);
                if outage.is_none() {
                    outage = Some(Instant::now());
                    let why = match e {
                        MetaError::Unavailable(m) => m,
                        other => other.to_string(),
                    };
                    tracing::warn!(
                        "lost the listener for PCC recall requests ({why}); polling every {:?} \
                         until it is back",
                        t.poll
                    );
                }
                due = Some(Source::Poll);
            }
        }
    }
    metrics.recall_listening(false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::collections::VecDeque;
    use std::sync::Arc;
    use tierfs_meta::Notice;

    /// What the stand-in engine does next.
    #[derive(Default)]
    struct Script {
        /// Answers of `listen`, in order; `Ok(true)` gives a listener, `Ok(false)` none; when
        /// empty, a listener.
        listens: VecDeque<Result<bool, ()>>,
        /// Notices the live listener returns at its next wait.
        notices: u32,
        /// The live listener's next wait fails.
        break_listener: bool,
        /// Passes that find a request still waiting for writers.
        waiting_passes: u32,
        /// Requests the next pass serves.
        requests: u64,
    }

    #[derive(Default)]
    struct Log {
        listens: Vec<Instant>,
        passes: Vec<Instant>,
        waits: u32,
    }

    #[derive(Clone, Default)]
    struct Fake {
        script: Arc<Mutex<Script>>,
        log: Arc<Mutex<Log>>,
    }

    struct FakeListener(Fake);

    impl Listener for FakeListener {
        fn wait(&mut self, timeout: Duration) -> tierfs_meta::Result<Vec<Notice>> {
            self.0.log.lock().waits += 1;
            let deadline = Instant::now() + timeout;
            loop {
                {
                    let mut s = self.0.script.lock();
                    if s.break_listener {
                        s.break_listener = false;
                        return Err(MetaError::Unavailable("connection closed".into()));
                    }
                    if s.notices > 0 {
                        s.notices -= 1;
                        return Ok(vec![Notice::PccRevoke(7)]);
                    }
                }
                if Instant::now() >= deadline {
                    return Ok(vec![]);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    impl RecallWork for Fake {
        fn listen(&self) -> tierfs_meta::Result<Option<Box<dyn Listener>>> {
            self.log.lock().listens.push(Instant::now());
            match self.script.lock().listens.pop_front() {
                Some(Err(())) => Err(MetaError::Unavailable("connection refused".into())),
                Some(Ok(false)) => Ok(None),
                Some(Ok(true)) | None => Ok(Some(Box::new(FakeListener(self.clone())))),
            }
        }

        fn pass(&self) -> tierfs_meta::Result<Pass> {
            self.log.lock().passes.push(Instant::now());
            let mut s = self.script.lock();
            let given_back = std::mem::take(&mut s.requests);
            let waiting = if s.waiting_passes > 0 {
                s.waiting_passes -= 1;
                1
            } else {
                0
            };
            Ok(Pass {
                given_back,
                waiting,
            })
        }
    }

    fn timing() -> Timing {
        Timing {
            poll: Duration::from_millis(10),
            slice: Duration::from_millis(50),
            safety: Duration::from_millis(300),
            backoff_min: Duration::from_millis(40),
            backoff_max: Duration::from_millis(160),
        }
    }

    /// Runs the thread over `fake` while `body` runs; returns the metrics.
    fn with_thread(fake: &Fake, t: Timing, body: impl FnOnce(&Metrics)) -> Arc<Metrics> {
        let metrics = Arc::new(Metrics::new());
        let stop = Arc::new(AtomicBool::new(false));
        let h = {
            let (fake, metrics, stop) = (fake.clone(), Arc::clone(&metrics), Arc::clone(&stop));
            std::thread::spawn(move || run(&fake, &metrics, &stop, &t))
        };
        body(&metrics);
        stop.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        h.join().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "stopping took {:?}",
            t0.elapsed()
        );
        metrics
    }

    fn sample(m: &Metrics, name: &str) -> u64 {
        let text = m.render();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map(|v| v.trim().parse::<f64>().unwrap() as u64)
            .unwrap_or(0)
    }

    fn wakeups(m: &Metrics, source: &str) -> u64 {
        sample(
            m,
            &format!("tierfs_pcc_recall_wakeups_total{{source=\"{source}\"}}"),
        )
    }

    fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        f()
    }

    #[test]
    fn without_notifications_it_polls_every_10_ms() {
        let fake = Fake::default();
        fake.script.lock().listens.push_back(Ok(false));
        let m = with_thread(&fake, timing(), |_| {
            std::thread::sleep(Duration::from_millis(400))
        });
        let log = fake.log.lock();
        assert_eq!(
            log.listens.len(),
            1,
            "asked once whether there are notifications"
        );
        assert!(
            log.passes.len() >= 10,
            "{} passes in 400 ms",
            log.passes.len()
        );
        assert_eq!(wakeups(&m, "notification"), 0);
        assert_eq!(wakeups(&m, "poll") + 1, log.passes.len() as u64);
        assert_eq!(sample(&m, "tierfs_pcc_recall_listening"), 0);
    }

    #[test]
    fn listening_it_wakes_on_notices_and_once_per_safety_interval() {
        let fake = Fake::default();
        let m = with_thread(&fake, timing(), |m| {
            // Idle: the first pass, then one per safety interval.
            std::thread::sleep(Duration::from_millis(700));
            let idle = fake.log.lock().passes.len();
            assert!(
                (2..=5).contains(&idle),
                "{idle} passes in 700 ms while idle (safety interval 300 ms)"
            );
            assert_eq!(wakeups(m, "poll"), 0);
            assert_eq!(sample(m, "tierfs_pcc_recall_listening"), 1);
            // A notice: a pass at once, counted as such, with what it gave back.
            {
                let mut s = fake.script.lock();
                s.requests = 1;
                s.notices = 1;
            }
            assert!(wait_for(Duration::from_secs(2), || wakeups(
                m,
                "notification"
            ) == 1));
            assert_eq!(
                sample(
                    m,
                    "tierfs_pcc_recall_given_back_total{source=\"notification\"}"
                ),
                1
            );
        });
        assert_eq!(fake.log.lock().listens.len(), 1);
        assert!(wakeups(&m, "safety") >= 2);
    }

    #[test]
    fn a_request_waiting_for_writers_is_polled_every_10_ms() {
        let fake = Fake::default();
        let m = with_thread(&fake, timing(), |m| {
            std::thread::sleep(Duration::from_millis(50));
            {
                let mut s = fake.script.lock();
                s.waiting_passes = 20;
                s.notices = 1;
            }
            assert!(
                wait_for(Duration::from_secs(2), || wakeups(m, "poll") >= 20),
                "polls while a request waits: {}",
                wakeups(m, "poll")
            );
            // Served: back to idle listening, no more polls.
            std::thread::sleep(Duration::from_millis(50));
            let polls = wakeups(m, "poll");
            std::thread::sleep(Duration::from_millis(400));
            assert!(wakeups(m, "poll") <= polls + 1, "still polling when idle");
        });
        assert_eq!(wakeups(&m, "notification"), 1);
    }

    #[test]
    fn a_lost_listener_falls_back_to_polling_and_resubscribes_with_backoff() {
        let fake = Fake::default();
        {
            let mut s = fake.script.lock();
            // The first subscription works; the next three attempts fail.
            s.listens = VecDeque::from([Ok(true), Err(()), Err(()), Err(())]);
        }
        let m = with_thread(&fake, timing(), |m| {
            std::thread::sleep(Duration::from_millis(50));
            let t0 = Instant::now();
            fake.script.lock().break_listener = true;
            assert!(
                wait_for(Duration::from_secs(3), || sample(
                    m,
                    "tierfs_pcc_recall_subscriptions_total"
                ) == 2),
                "not listening again after 3 s"
            );
            let outage = t0.elapsed();
            // 40 + 80 + 160 + 160 ms of backoff (doubling, capped), polling meanwhile.
            assert!(outage >= Duration::from_millis(400), "{outage:?}");
            let polls = wakeups(m, "poll");
            assert!(
                polls >= 10,
                "only {polls} polls during an outage of {outage:?}"
            );
            assert_eq!(sample(m, "tierfs_pcc_recall_listening"), 1);
            // Listening again: a notice wakes the thread.
            fake.script.lock().notices = 1;
            assert!(wait_for(Duration::from_secs(2), || wakeups(
                m,
                "notification"
            ) == 1));
        });
        let log = fake.log.lock();
        assert_eq!(
            log.listens.len(),
            5,
            "one success, three failures, one success"
        );
        let gaps: Vec<Duration> = log.listens.windows(2).map(|w| w[1] - w[0]).collect();
        // listens[1] came 40 ms after the loss; then the delays double up to the cap.
        for (i, want) in [80u64, 160, 160].iter().enumerate() {
            assert!(
                gaps[i + 1] >= Duration::from_millis(*want),
                "attempt {} came after {:?}, backoff {want} ms",
                i + 2,
                gaps[i + 1]
            );
        }
        drop(log);
        assert_eq!(sample(&m, "tierfs_pcc_recall_listening"), 0, "stopped");
    }
}
