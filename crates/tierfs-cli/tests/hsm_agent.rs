//! HSM copytool agents (issue 13, requirement 3): `tierfs agent` archives and restores files of
//! a mounted filesystem, the data read back on another client is byte-identical, and an agent
//! killed mid-copy leaves the file as it was (not archived / still released) while another
//! agent finishes the request once the coordinator requeued it. A reader of a file being
//! restored reads the verified restored prefix while the rest moves, and never a corrupt chunk.
//!
//! The HSM requests are queued through the engine directly (the `tierfs hsm` commands are
//! another branch's), as a client would.

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tierfs_meta::hsm::{HsmAction, HsmRequest, HsmSettings, RequestState};
use tierfs_meta::{open_engine, MetaEngine};

/// A `tierfs agent` process, killed (SIGKILL) when dropped if still running.
struct Agent(Child);

impl Agent {
    fn start(t: &TestFs, stall_ms: u64) -> Agent {
        Agent::start_with(t, stall_ms, &["--poll", "0.1"], &[])
    }

    /// An agent of archive 1 with these extra arguments and environment; its log (stderr)
    /// is appended to `<root>/agent.log`.
    fn start_with(t: &TestFs, stall_ms: u64, args: &[&str], env: &[(&str, &str)]) -> Agent {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(agent_log(t))
            .unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["--log-level", "info", "agent", "--meta", &t.meta_url()])
            .args(["--archive", "1", "--housekeep", "0.3"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        if stall_ms > 0 {
            cmd.env("TIERFS_TEST_MOVER_STALL_MS", stall_ms.to_string());
        }
        Agent(cmd.spawn().expect("spawn tierfs agent"))
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    fn kill9(&mut self) {
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        let _ = self.0.wait();
    }

    /// SIGTERM, then the exit status (bounded).
    fn term(&mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        for _ in 0..200 {
            if let Some(s) = self.0.try_wait().unwrap() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("tierfs agent still running 10 s after SIGTERM");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            self.kill9();
        }
    }
}

fn agent_log(t: &TestFs) -> std::path::PathBuf {
    t.root().join("agent.log")
}

fn write_file(p: &Path, data: &[u8]) {
    let mut f = fs::File::create(p).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// The engine, with archive 1 in `<root>/archive` and a short request timeout (2 s) and
/// retry backoff (0.2 s) so that a killed agent's request is requeued quickly.
fn engine(t: &TestFs) -> Arc<dyn MetaEngine> {
    let dir = t.root().join("archive");
    fs::create_dir_all(&dir).unwrap();
    engine_with_archive(t, &format!("file://{}", dir.display()))
}

/// [`engine`] with archive 1 at `url`.
fn engine_with_archive(t: &TestFs, url: &str) -> Arc<dyn MetaEngine> {
    let meta = open_engine(&t.meta_url()).unwrap();
    meta.hsm_archive_add(1, url).unwrap();
    meta.hsm_set_settings(&HsmSettings {
        request_timeout_ns: 2_000_000_000,
        retry_backoff_ns: 200_000_000,
        ..HsmSettings::default()
    })
    .unwrap();
    meta
}

fn wait_request(meta: &dyn MetaEngine, id: u64, want: RequestState, limit: Duration) {
    let mut last = None;
    let ok = wait_until(limit, || {
        let r = meta.hsm_get_request(id).unwrap();
        let done = r.state == want;
        last = Some(r);
        done
    });
    assert!(ok, "request {id} not {want} after {limit:?}: {last:?}");
}

/// Release, retried while the writer's close is still on its way to the engine.
/// Queues `action` on `ino` and waits (up to `secs`) until it succeeded: the request.
fn request_done(
    meta: &dyn MetaEngine,
    ino: u64,
    action: HsmAction,
    archive: Option<u32>,
    secs: u64,
) -> HsmRequest {
    let req = meta.hsm_request(ino, action, archive).unwrap().unwrap();
    wait_request(
        meta,
        req.id,
        RequestState::Succeeded,
        Duration::from_secs(secs),
    );
    req
}

fn release(meta: &dyn MetaEngine, ino: u64) {
    let mut last = None;
    let ok = wait_until(Duration::from_secs(10), || match meta.hsm_release(ino) {
        Ok(a) => a.hsm.released(),
        Err(e) => {
            last = Some(e.to_string());
            false
        }
    });
    assert!(ok, "release of {ino} refused: {last:?}");
}

#[test]
fn agent_archive_release_restore_reads_back_identical_on_another_client() {
    let t = TestFs::with(Opts {
        clients: 2,
        stripe_size: Some("256K".into()),
        ..Opts::default()
    });
    let meta = engine(&t);
    let data = pattern(3, 0, (5 << 20) + 777);
    write_file(&t.p(0, "f"), &data);
    let ino = fs::metadata(t.p(0, "f")).unwrap().ino();
    let mut agent = Agent::start(&t, 0);

    request_done(meta.as_ref(), ino, HsmAction::Archive, Some(1), 60);
    let st = meta.hsm_state(ino).unwrap();
    assert!(st.flags.archived() && !st.flags.dirty(), "{}", st.flags);
    let copy = st.copy.unwrap();
    assert_eq!(
        fs::read(t.root().join("archive").join(&copy.key)).unwrap(),
        data,
        "the archive copy is the file's bytes"
    );

    let used = t.total_target_usage();
    release(meta.as_ref(), ino);
    assert!(
        wait_until(Duration::from_secs(30), || t.total_target_usage()
            + (4 << 20)
            < used),
        "the released file's objects were not freed ({} of {used} bytes left)",
        t.total_target_usage()
    );
    assert_eq!(fs::metadata(t.p(1, "f")).unwrap().len(), data.len() as u64);

    request_done(meta.as_ref(), ino, HsmAction::Restore, None, 60);
    assert!(!meta.getattr(ino).unwrap().hsm.released());
    let back = fs::read(t.p(1, "f")).unwrap();
    assert_same_bytes(&back, &data, 0, "restored data");

    let status = agent.term();
    assert!(status.success(), "agent exit on SIGTERM: {status}");
    assert!(
        meta.hsm_agents().unwrap().is_empty(),
        "the agent unregistered"
    );
}

#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the daemon's debug-only TIERFS_TEST_MOVER_STALL_MS hook"
)]
fn agent_killed_mid_archive_and_mid_restore_leaves_the_file_as_it_was() {
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_size: Some("1M".into()),
        ..Opts::default()
    });
    let meta = engine(&t);
    let data = pattern(9, 0, 24 << 20);
    write_file(&t.p(0, "big"), &data);
    let ino = fs::metadata(t.p(0, "big")).unwrap().ino();

    // ARCHIVE: each 4 MiB read stalls 400 ms; kill -9 once some bytes were reported.
    let mut slow = Agent::start(&t, 400);
    let req = meta
        .hsm_request(ino, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let r = meta.hsm_get_request(req.id).unwrap();
            r.state == RequestState::Started && r.bytes_moved > 0
        }),
        "the slow agent never reported progress"
    );
    slow.kill9();
    let r = meta.hsm_get_request(req.id).unwrap();
    assert!(r.bytes_moved < data.len() as u64, "killed mid-copy: {r:?}");
    let st = meta.hsm_state(ino).unwrap();
    assert!(!st.flags.archived() && st.copy.is_none(), "{}", st.flags);

    // another agent finishes it once the coordinator requeued the request
    let mut agent = Agent::start(&t, 0);
    wait_request(
        meta.as_ref(),
        req.id,
        RequestState::Succeeded,
        Duration::from_secs(90),
    );
    let copy = meta.hsm_state(ino).unwrap().copy.unwrap();
    assert_eq!(
        fs::read(t.root().join("archive").join(&copy.key)).unwrap(),
        data
    );
    agent.term();

    // RESTORE killed mid-way: the file stays released; a new agent restores it whole.
    release(meta.as_ref(), ino);
    let mut slow = Agent::start(&t, 400);
    let req = meta
        .hsm_request(ino, HsmAction::Restore, None)
        .unwrap()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let r = meta.hsm_get_request(req.id).unwrap();
            r.state == RequestState::Started && r.bytes_moved > 0
        }),
        "the slow agent never reported restore progress"
    );
    slow.kill9();
    assert!(meta.getattr(ino).unwrap().hsm.released());
    let _agent = Agent::start(&t, 0);
    wait_request(
        meta.as_ref(),
        req.id,
        RequestState::Succeeded,
        Duration::from_secs(90),
    );
    assert!(!meta.getattr(ino).unwrap().hsm.released());
    let back = fs::read(t.p(0, "big")).unwrap();
    assert_same_bytes(&back, &data, 0, "restored data");
}

#[test]
fn client_daemon_moves_data_when_configured() {
    // `hsm_mover_archives = [1]`: the daemon of client "m" runs the `hsm-mover` worker, an
    // agent of archive 1 (no `tierfs agent` process here); client "c0" has none.
    let mut t = TestFs::new(1);
    let meta = engine(&t);
    assert!(
        meta.hsm_agents().unwrap().is_empty(),
        "no mover without the config key"
    );
    let m = t.mount_with(&ClientOpts {
        name: "m".into(),
        config: Some("hsm_mover_archives = [1]\n".into()),
        ..Default::default()
    });
    let data = pattern(7, 0, (3 << 20) + 5);
    write_file(&t.p(0, "w"), &data);
    let ino = fs::metadata(t.p(0, "w")).unwrap().ino();
    let req = request_done(meta.as_ref(), ino, HsmAction::Archive, Some(1), 60);
    let r = meta.hsm_get_request(req.id).unwrap();
    let agents = meta.hsm_agents().unwrap();
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(agents[0].info.pid as i32, t.daemon_pid(m));
    assert_eq!(r.agent, Some(agents[0].id));
    let copy = meta.hsm_state(ino).unwrap().copy.unwrap();
    assert_eq!(
        fs::read(t.root().join("archive").join(&copy.key)).unwrap(),
        data
    );
    // unmounting stops the worker, which unregisters
    t.umount(m);
    assert!(meta.hsm_agents().unwrap().is_empty());
}

/// An agent takes a new request as soon as one of its slots frees, not once its whole
/// batch ended: with two slots, a long archive (every 4 MiB stalls 500 ms: 8 s at least) and
/// a short one taken together, a third request queued after the short one ended completes
/// while the long one still runs.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the daemon's debug-only TIERFS_TEST_MOVER_STALL_MS hook"
)]
fn an_agent_takes_more_while_a_long_move_runs() {
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_size: Some("1M".into()),
        ..Opts::default()
    });
    let meta = engine(&t);
    write_file(&t.p(0, "long"), &pattern(1, 0, 64 << 20));
    write_file(&t.p(0, "b"), &pattern(2, 0, 1000));
    write_file(&t.p(0, "c"), &pattern(3, 0, 1000));
    let ino = |n: &str| fs::metadata(t.p(0, n)).unwrap().ino();
    let (long, b, c) = (ino("long"), ino("b"), ino("c"));
    let ra = meta
        .hsm_request(long, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    let rb = meta
        .hsm_request(b, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    let _agent = Agent::start_with(&t, 500, &["--poll", "0.1", "--parallel", "2"], &[]);
    wait_request(
        meta.as_ref(),
        rb.id,
        RequestState::Succeeded,
        Duration::from_secs(30),
    );
    request_done(meta.as_ref(), c, HsmAction::Archive, Some(1), 30);
    let a = meta.hsm_get_request(ra.id).unwrap();
    assert_eq!(
        a.state,
        RequestState::Started,
        "the long archive ended before the third request was taken: {a:?}"
    );
    wait_request(
        meta.as_ref(),
        ra.id,
        RequestState::Succeeded,
        Duration::from_secs(60),
    );
}

/// CPU time (user + system) of process `pid` so far.
fn cpu_time(pid: i32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // fields after the command name (which may hold spaces): state is field 3, utime 14
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// An agent whose slots are all busy waits for a move to end without spinning: over 3 s of
/// a stalled archive (each 4 MiB piece sleeps 1 s) it uses far less than 3 s of CPU.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the daemon's debug-only TIERFS_TEST_MOVER_STALL_MS hook"
)]
fn a_busy_agent_waits_without_spinning() {
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_size: Some("1M".into()),
        ..Opts::default()
    });
    let meta = engine(&t);
    write_file(&t.p(0, "long"), &pattern(4, 0, 32 << 20));
    let ino = fs::metadata(t.p(0, "long")).unwrap().ino();
    let agent = Agent::start_with(&t, 1000, &["--poll", "0.1", "--parallel", "1"], &[]);
    let req = meta
        .hsm_request(ino, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || meta
            .hsm_get_request(req.id)
            .unwrap()
            .state
            == RequestState::Started),
        "not taken"
    );
    let before = cpu_time(agent.pid());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_time(agent.pid()) - before;
    assert_eq!(
        meta.hsm_get_request(req.id).unwrap().state,
        RequestState::Started
    );
    assert!(
        used < Duration::from_secs(1),
        "the agent used {used:?} of CPU in 3 s while its one slot was busy"
    );
}

/// Bad agent options: one clear line and a non-zero exit, before anything runs.
#[test]
fn agent_refuses_bad_options_with_one_line() {
    let t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let meta = engine(&t);
    let url = t.meta_url();
    for (bad, says) in [
        (&["--tranquility", "200"][..], "--tranquility"),
        (&["--tranquility=-1"], "--tranquility"),
        (&["--tranquility", "NaN"], "--tranquility"),
        (&["--sweep=-5"], "--sweep"),
        (&["--sweep-grace", "inf"], "--sweep-grace"),
        (&["--parallel", "0"], "--parallel"),
    ] {
        let mut args = vec!["agent", "--meta", &url, "--archive", "1"];
        args.extend_from_slice(bad);
        let out = t.tierfs(&args);
        out.assert_clean_error();
        assert!(out.stderr.contains(says), "{bad:?}: {}", out.describe());
    }
    assert!(meta.hsm_agents().unwrap().is_empty(), "no agent registered");
}

/// Every file under `dir`, as paths relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out)
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned())
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    v
}

fn staging_files(dir: &Path) -> Vec<String> {
    files_under(dir)
        .into_iter()
        .filter(|f| tierfs_store::archive::is_staging_name(f))
        .collect()
}

/// A killed agent's leftovers: kill -9 mid-archive leaves a staging file of the unfinished
/// upload; a copy finished but never completed (its request canceled meanwhile) stays as an
/// unreferenced object. The next agent's sweep deletes both once their requests ended more
/// than the grace ago, and nothing else: not the recorded copy (not even after its file was
/// unlinked, which keeps the copy with remove_archive_on_last_unlink off), not an object of
/// an unknown request, not foreign data.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the daemon's debug-only TIERFS_TEST_MOVER_STALL_MS hook"
)]
fn a_killed_agents_leftovers_are_swept_and_nothing_else() {
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_size: Some("1M".into()),
        ..Opts::default()
    });
    let meta = engine(&t);
    let arch = t.root().join("archive");
    let data = pattern(5, 0, 24 << 20);
    write_file(&t.p(0, "f"), &data);
    let f = fs::metadata(t.p(0, "f")).unwrap().ino();

    // kill -9 once the upload wrote its first part (8 MiB) to a staging file
    let mut slow = Agent::start_with(&t, 300, &["--poll", "0.1", "--sweep", "0"], &[]);
    let req = meta
        .hsm_request(f, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || !staging_files(&arch).is_empty()),
        "no staging file while the slow agent archived: {:?}",
        files_under(&arch)
    );
    slow.kill9();
    let staged = staging_files(&arch);

    // A copy finished but never completed: g's request was canceled before its mover said so.
    fs::write(t.p(0, "g"), b"gg").unwrap();
    let g = fs::metadata(t.p(0, "g")).unwrap().ino();
    let rg = meta
        .hsm_request(g, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    meta.hsm_cancel(g).unwrap();
    let gv = meta.getattr(g).unwrap().data_version;
    let orphan = tierfs_client::mover::copy_key(g, gv, rg.id);
    // Kept: a name of a request the coordinator never had, and foreign data.
    let unknown = tierfs_client::mover::copy_key(f, 1, 999_999);
    for k in [&orphan, &unknown, &"imported/tree/x.dat".to_string()] {
        let p = arch.join(k);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, b"leftover").unwrap();
    }

    // The next agent: f's request is requeued after the 2 s timeout and completed; the
    // sweep (every 0.3 s, grace 1 s) deletes the leftovers.
    let _agent = Agent::start_with(
        &t,
        0,
        &["--poll", "0.1", "--sweep", "0.3", "--sweep-grace", "1"],
        &[],
    );
    wait_request(
        meta.as_ref(),
        req.id,
        RequestState::Succeeded,
        Duration::from_secs(90),
    );
    let copy = meta.hsm_state(f).unwrap().copy.unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || staging_files(&arch).is_empty()
            && !arch.join(&orphan).exists()),
        "leftovers not swept: staging {:?} (killed agent's: {staged:?}), orphan there: {}",
        staging_files(&arch),
        arch.join(&orphan).exists()
    );
    assert_eq!(
        fs::read(arch.join(&copy.key)).unwrap(),
        data,
        "the recorded copy"
    );
    assert!(
        arch.join(&unknown).exists(),
        "an unknown request's object was deleted"
    );
    assert!(
        arch.join("imported/tree/x.dat").exists(),
        "foreign data was deleted"
    );

    // f unlinked: its copy's record goes, the copy stays (remove_archive_on_last_unlink off),
    // and sweeps leave it alone.
    fs::remove_file(t.p(0, "f")).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || meta.getattr(f).is_err()),
        "f was not purged"
    );
    std::thread::sleep(Duration::from_secs(2)); // several sweeps, past the grace
    assert!(
        arch.join(&copy.key).exists(),
        "a copy once recorded was swept after its file went"
    );
}

/// On PostgreSQL the agent listens for the coordinator's notices: with a 30 s poll, a queued
/// archive and the restore a reader's open queues are taken at once (a polling agent would
/// look 30 s later). The data read back on the other client is byte-identical.
#[test]
fn agent_on_postgres_takes_requests_on_a_notice() {
    let Some(pg) = PgServer::start("agent_on_postgres_takes_requests_on_a_notice") else {
        return;
    };
    // Declared after the server: unmounted and dropped before it stops.
    let t = TestFs::with(Opts {
        clients: 2,
        stripe_size: Some("256K".into()),
        pg_admin: Some(pg.url.clone()),
        ..Opts::default()
    });
    assert!(t.meta_url().starts_with("postgres"), "{}", t.meta_url());
    let meta = engine(&t);
    let data = pattern(11, 0, (5 << 20) + 777);
    write_file(&t.p(0, "f"), &data);
    let ino = fs::metadata(t.p(0, "f")).unwrap().ino();
    let mut agent = Agent::start_with(&t, 0, &["--poll", "30"], &[]);
    assert!(
        wait_until(Duration::from_secs(20), || fs::read_to_string(agent_log(
            &t
        ))
        .unwrap_or_default()
        .contains("listening for notices")),
        "the agent does not listen: {}",
        fs::read_to_string(agent_log(&t)).unwrap_or_default()
    );
    // its first look (at start) found nothing; the next poll would be 300 s away
    std::thread::sleep(Duration::from_millis(300));
    request_done(meta.as_ref(), ino, HsmAction::Archive, Some(1), 15);
    let copy = meta.hsm_state(ino).unwrap().copy.unwrap();
    assert_eq!(
        fs::read(t.root().join("archive").join(&copy.key)).unwrap(),
        data
    );
    release(meta.as_ref(), ino);
    // The reader's open queues the restore and waits for it; the notice wakes the agent.
    let t0 = std::time::Instant::now();
    let back = fs::read(t.p(1, "f")).unwrap();
    assert!(back == data, "restored data differs");
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "the restore waited for a poll ({:?})",
        t0.elapsed()
    );
    assert!(agent.term().success());
    // Its stop line counts the looks a notice caused: the archive's and the restore's.
    let log = fs::read_to_string(agent_log(&t)).unwrap();
    let on_notice: u64 = log
        .lines()
        .find_map(|l| {
            let (before, _) = l.split_once(" on a notice")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no stop line in the agent's log: {log}"));
    assert!(on_notice >= 2, "{on_notice} looks on a notice: {log}");
}

/// An agent against a real S3 server (Garage, or TIERFS_S3_ENDPOINT): archive to an
/// s3:// archive, release, restore on another client (byte-identical, checksum verified), the
/// sweep deletes an unrecorded copy in the bucket while the recorded one stays, and `tierfs
/// hsm import` makes the objects under a key prefix released files that restore on open.
#[test]
fn agent_archives_to_and_restores_from_s3() {
    let Some(s3) = S3Server::start("agent_archives_to_and_restores_from_s3") else {
        return;
    };
    let t = TestFs::with(Opts {
        clients: 2,
        stripe_size: Some("1M".into()),
        ..Opts::default()
    });
    let prefix = format!(
        "hsm-{}",
        t.root()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_lowercase()
    );
    let url = s3.url("tierfs-a", &prefix);
    let meta = engine_with_archive(&t, &url);
    let creds =
        tierfs_store::credentials::from_file(Path::new(&s3.credentials)).expect("credentials");
    let store = tierfs_store::archive::ArchiveStore::open_with(&url, &creds).expect("archive");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let data = pattern(21, 0, (9 << 20) + 12_345);
    write_file(&t.p(0, "f"), &data);
    let ino = fs::metadata(t.p(0, "f")).unwrap().ino();
    // An unrecorded copy of a canceled request, as a mover killed after its upload leaves.
    fs::write(t.p(0, "g"), b"gg").unwrap();
    let g = fs::metadata(t.p(0, "g")).unwrap().ino();
    let rg = meta
        .hsm_request(g, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    meta.hsm_cancel(g).unwrap();
    let orphan = tierfs_client::mover::copy_key(g, meta.getattr(g).unwrap().data_version, rg.id);
    rt.block_on(async {
        let mut w = store.writer(&orphan).await.unwrap();
        w.write(b"leftover").await.unwrap();
        w.finish().await.unwrap();
    });
    assert_eq!(rt.block_on(store.size(&orphan)).unwrap(), 8);

    let _agent = Agent::start_with(
        &t,
        0,
        &["--poll", "0.1", "--sweep", "0.3", "--sweep-grace", "1"],
        &[("TIERFS_S3_CREDENTIALS", s3.credentials.as_str())],
    );
    request_done(meta.as_ref(), ino, HsmAction::Archive, Some(1), 60);
    let copy = meta.hsm_state(ino).unwrap().copy.unwrap();
    let got = rt
        .block_on(store.get_range(&copy.key, 0, data.len() as u64))
        .unwrap();
    assert!(
        got[..] == data[..],
        "the copy in the bucket is the file's bytes"
    );
    release(meta.as_ref(), ino);
    let back = fs::read(t.p(1, "f")).unwrap();
    assert!(back == data, "restored data differs");
    assert!(
        wait_until(Duration::from_secs(30), || matches!(
            rt.block_on(store.size(&orphan)),
            Err(tierfs_store::StoreError::NotFound(_))
        )),
        "the unrecorded copy in the bucket was not swept"
    );
    assert_eq!(
        rt.block_on(store.size(&copy.key)).unwrap(),
        data.len() as u64
    );

    // Import: the objects under imp/ become released files (the "directories" of their keys
    // made), restored on open from the bucket; an object under impx/ is not under imp/.
    let a_bytes = pattern(5, 0, (1 << 20) + 77);
    for (k, b) in [
        ("imp/sub/a.dat", &a_bytes[..]),
        ("imp/b.dat", &b"bee"[..]),
        ("impx/c", &b"not under imp/"[..]),
    ] {
        rt.block_on(async {
            let mut w = store.writer(k).await.unwrap();
            w.write(b).await.unwrap();
            w.finish().await.unwrap();
        });
    }
    let dest = t.p(0, "imported");
    fs::create_dir(&dest).unwrap();
    let out = t.tierfs(&[
        "hsm",
        "import",
        "--archive",
        "1",
        "imp",
        dest.to_str().unwrap(),
        "--s3-credentials",
        s3.credentials.as_str(),
    ]);
    out.assert_ok();
    assert!(
        out.stdout
            .contains(&format!("imported 2 files ({} bytes)", a_bytes.len() + 3)),
        "{}",
        out.describe()
    );
    let mut names: Vec<String> = fs::read_dir(t.p(1, "imported"))
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["b.dat", "sub"]);
    let m = fs::metadata(t.p(1, "imported/sub/a.dat")).unwrap();
    assert_eq!((m.len(), m.mode() & 0o7777), (a_bytes.len() as u64, 0o644));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - 600..=now + 60).contains(&m.mtime()),
        "mtime {} is not the object's LastModified (now {now})",
        m.mtime()
    );
    assert!(meta.getattr(m.ino()).unwrap().hsm.released());
    let back = fs::read(t.p(1, "imported/sub/a.dat")).unwrap();
    assert!(back == a_bytes, "the imported file read back differs");
    assert_eq!(fs::read(t.p(1, "imported/b.dat")).unwrap(), b"bee");
    // leave the bucket clean
    for e in rt.block_on(store.list()).unwrap() {
        rt.block_on(store.remove_listed(&e)).unwrap();
    }
}

/// Archives `p` (inode `ino`) with an agent of its own, then releases it: what the early
/// readers below start from.
fn archive_and_release(t: &TestFs, meta: &dyn MetaEngine, ino: u64) -> String {
    let mut agent = Agent::start(t, 0);
    let req = meta
        .hsm_request(ino, HsmAction::Archive, Some(1))
        .unwrap()
        .unwrap();
    wait_request(
        meta,
        req.id,
        RequestState::Succeeded,
        Duration::from_secs(60),
    );
    assert!(agent.term().success());
    release(meta, ino);
    meta.hsm_state(ino).unwrap().copy.unwrap().key
}

/// Beyond Lustre (docs/hsm.md, "Transparent restore"): a read-only open of a released file on
/// another client returns while its restore is still queued or running, the first bytes are
/// read while the rest still moves (the agent is slowed down by its test hook), a read of the
/// end waits until the restored prefix covers it, and everything reads back byte-identical.
/// (About 13 s: the slowed restore of 12 MiB.)
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the daemon's debug-only TIERFS_TEST_MOVER_STALL_MS hook"
)]
fn a_reader_reads_the_restored_prefix_while_the_rest_moves() {
    use std::os::unix::fs::FileExt;
    let t = TestFs::with(Opts {
        clients: 2,
        stripe_size: Some("256K".into()),
        ..Opts::default()
    });
    let meta = engine(&t);
    let data = pattern(7, 0, 12 << 20);
    write_file(&t.p(0, "f"), &data);
    let ino = fs::metadata(t.p(0, "f")).unwrap().ino();
    archive_and_release(&t, meta.as_ref(), ino);

    // 200 ms per 256 KiB read: the whole restore takes ~10 s, its first commit (4 MiB) ~3 s
    let _agent = Agent::start(&t, 200);
    let f = fs::File::open(t.p(1, "f")).expect("read-only open of a released file");
    let r = meta
        .hsm_action(ino)
        .unwrap()
        .expect("the open queued a restore");
    assert_eq!(r.action, HsmAction::Restore);
    assert!(
        r.state.is_active(),
        "the open waited for the restore: {r:?}"
    );
    let mut first = vec![0u8; 64 << 10];
    f.read_exact_at(&mut first, 0)
        .expect("read of the first bytes");
    let r = meta.hsm_get_request(r.id).unwrap();
    assert!(first == data[..64 << 10], "the first bytes differ");
    assert!(
        r.state == RequestState::Started && r.restored < data.len() as u64,
        "the first bytes came only once the restore was over: {r:?}"
    );
    assert!(r.restored >= 64 << 10, "{r:?}");
    let out = t.tierfs(&["hsm", "action", &t.p(1, "f").to_string_lossy()]);
    assert!(
        out.stdout.contains("RESTORE RUNNING") && out.stdout.contains(" restored)"),
        "{}",
        out.describe()
    );
    // the end of the file: waits for the prefix to reach it (holes otherwise)
    let mut last = vec![0u8; 4096];
    f.read_exact_at(&mut last, data.len() as u64 - 4096)
        .expect("read of the last bytes");
    assert!(last == data[data.len() - 4096..], "the last bytes differ");
    wait_request(
        meta.as_ref(),
        r.id,
        RequestState::Succeeded,
        Duration::from_secs(60),
    );
    // the handle opened early reads the whole file, and so does the other client
    let mut all = vec![0u8; data.len()];
    f.read_exact_at(&mut all, 0).unwrap();
    assert!(all == data, "the early handle reads other bytes");
    assert!(fs::read(t.p(0, "f")).unwrap() == data);
    assert!(!meta.getattr(ino).unwrap().hsm.released());
}

/// Verified prefix: a chunk of the archive copy is corrupt. The restore commits only chunks
/// whose checksum matched, so the bytes before it are read correctly while the restore runs,
/// the corrupt chunk and everything after it are never committed (a read there gets EIO once
/// the restore failed), and `tierfs hsm action` says why. (About 8 s: a slowed restore.)
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the daemon's debug-only TIERFS_TEST_MOVER_STALL_MS hook"
)]
fn a_corrupt_chunk_of_the_copy_never_becomes_readable() {
    use std::os::unix::fs::FileExt;
    let t = TestFs::with(Opts {
        clients: 1,
        stripe_size: Some("256K".into()),
        ..Opts::default()
    });
    let meta = engine(&t);
    let data = pattern(9, 0, 12 << 20);
    write_file(&t.p(0, "f"), &data);
    let ino = fs::metadata(t.p(0, "f")).unwrap().ino();
    let key = archive_and_release(&t, meta.as_ref(), ino);
    let bad_at = (10 << 20) + 5;
    let copy = t.root().join("archive").join(&key);
    let mut bytes = fs::read(&copy).unwrap();
    bytes[bad_at] ^= 0x40;
    fs::write(&copy, &bytes).unwrap();
    drop(bytes);

    let _agent = Agent::start(&t, 150);
    let f = fs::File::open(t.p(0, "f")).expect("read-only open of a released file");
    let mut first = vec![0u8; 64 << 10];
    f.read_exact_at(&mut first, 0)
        .expect("read of the verified first bytes");
    assert!(first == data[..64 << 10], "the first bytes differ");
    let mut there = vec![0u8; 4096];
    let err = f
        .read_exact_at(&mut there, bad_at as u64 - 5)
        .expect_err("the corrupt chunk was read");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let r = meta.hsm_action(ino).unwrap().unwrap();
    assert_eq!(r.state, RequestState::Failed, "{r:?}");
    assert!(
        r.last_error
            .as_deref()
            .unwrap_or("")
            .contains("checksum mismatch"),
        "{r:?}"
    );
    // Nothing of the corrupt checksum chunk (4 MiB: 8..12 MiB) or after it was committed;
    // the file stays released.
    let sum_chunk = 4 << 20;
    let from = (bad_at as u64 / sum_chunk) * sum_chunk;
    assert!(r.restored <= from, "{r:?}");
    let chunk = 256 << 10;
    for c in (from / chunk)..(data.len() as u64 / chunk) {
        assert!(meta.read_chunk(ino, c).unwrap().is_empty(), "chunk {c}");
    }
    assert!(meta.getattr(ino).unwrap().hsm.released());
    let out = t.tierfs(&["hsm", "action", &t.p(0, "f").to_string_lossy()]);
    assert!(
        out.stdout.contains("RESTORE FAILED") && out.stdout.contains("checksum mismatch"),
        "{}",
        out.describe()
    );
}

/// Time to first byte of a released file vs time to read all of it, in the same run
/// (docs/benchmarks.md): an agent restores while a reader on the mount opens the file
/// read-only and reads it from the start, 1 MiB at a time, checking every byte. Caches are
/// dropped first (as root). Run it with a release build:
/// `cargo test --release -p tierfs-cli --test hsm_agent time_to_first_byte_of_a_released_file -- --ignored --nocapture`
/// (size with TIERFS_BENCH_HSM_MB, default 1024). Prints figures; asserts only correctness.
#[test]
#[ignore]
fn time_to_first_byte_of_a_released_file() {
    use std::io::Read;
    use std::time::Instant;
    let mb: usize = std::env::var("TIERFS_BENCH_HSM_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let t = TestFs::with(Opts {
        clients: 1,
        timeout: Duration::from_secs(900),
        ..Opts::default()
    });
    let meta = engine(&t);
    let size = mb << 20;
    let piece = 8 << 20;
    {
        let mut f = fs::File::create(t.p(0, "f")).unwrap();
        for off in (0..size).step_by(piece) {
            f.write_all(&pattern(4, off as u64, piece.min(size - off)))
                .unwrap();
        }
        f.sync_all().unwrap();
    }
    let ino = fs::metadata(t.p(0, "f")).unwrap().ino();
    archive_and_release(&t, meta.as_ref(), ino);
    let _agent = Agent::start(&t, 0);
    std::thread::sleep(Duration::from_millis(500)); // registered, polling
    unsafe { libc::sync() };
    let dropped = fs::write("/proc/sys/vm/drop_caches", "3").is_ok();

    let t0 = Instant::now();
    let mut f = fs::File::open(t.p(0, "f")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0usize;
    let mut first = None;
    while off < size {
        let n = f.read(&mut buf).unwrap();
        assert!(n > 0, "EOF at {off} of {size}");
        first.get_or_insert_with(|| t0.elapsed());
        assert!(
            buf[..n] == pattern(4, off as u64, n)[..],
            "bytes at {off} differ"
        );
        off += n;
    }
    let all = t0.elapsed();
    let first = first.unwrap();
    let r = meta.hsm_action(ino).unwrap().unwrap();
    wait_request(
        meta.as_ref(),
        r.id,
        RequestState::Succeeded,
        Duration::from_secs(600),
    );
    // queued (by the open) to succeeded, by the database's clock: what an opener that waits
    // for the whole restore waits
    let r = meta.hsm_get_request(r.id).unwrap();
    let restore = (r.updated - r.created) as f64 / 1e9;
    println!(
        "HSM time to first byte, released {mb} MiB file (caches dropped: {dropped}): \
         first byte {:.3} s, whole file {:.2} s ({:.0} MiB/s; first byte at {:.1}% of it), \
         restore queued to succeeded {restore:.2} s",
        first.as_secs_f64(),
        all.as_secs_f64(),
        mb as f64 / all.as_secs_f64(),
        100.0 * first.as_secs_f64() / all.as_secs_f64(),
    );
}
