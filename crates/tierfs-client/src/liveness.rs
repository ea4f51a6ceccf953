//! Whether a session's daemon still runs, when it ran on this very machine: a client killed
//! with `kill -9` is known dead at once, without waiting for its heartbeat to age past the
//! session timeout.
//!
//! A session records its process's identity after its host name in the sessions table's `host`
//! column (`name#<boot id>:<pid namespace>:<start time>`, no schema change): the kernel's boot
//! id, the inode of the daemon's pid namespace and the daemon's start time in clock ticks since
//! boot (`/proc/<pid>/stat` field 22). Another process that shares the boot id and the pid
//! namespace sees the same pids, so `/proc/<pid>` tells it whether the daemon runs; the start
//! time tells a reused pid apart. A session from another machine, another boot or another pid
//! namespace (a container) is left to the heartbeat timeout.

use tierfs_meta::{MetaEngine, SessionInfo, HOST_ID_SEP};

/// What can be known here about a session's daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// It runs on this machine.
    Running,
    /// It ran on this machine and is gone (why).
    Gone(String),
    /// It runs elsewhere, or recorded no identity: only its heartbeat tells.
    Unknown,
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The inode of `pid`'s pid namespace ("self" for this process).
fn pid_namespace(pid: &str) -> Option<String> {
    let l = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    let s = l.to_string_lossy();
    Some(
        s.trim_start_matches("pid:[")
            .trim_end_matches(']')
            .to_string(),
    )
}

/// State letter and start time (clock ticks since boot) of `pid`, from `/proc/<pid>/stat`.
fn stat_of(pid: &str) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after the
    // last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    let start = f.get(19)?.parse().ok()?;
    Some((state, start))
}

/// Whether this process's /proc shows the pids of its own pid namespace. Not so in a pid
/// namespace that did not mount a /proc of its own (`unshare --pid` without `--mount-proc`):
/// there `/proc/<pid>` is another process than pid `<pid>` of this namespace, so /proc can
/// tell nothing about a pid (a daemon would take its own session, pid 1 there, for a dead one).
fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id())
}

/// This process's identity: `<boot id>:<pid namespace>:<start time>` (empty if /proc cannot
/// tell).
pub fn this_process() -> String {
    if !proc_is_ours() {
        return String::new();
    }
    match (boot_id(), pid_namespace("self"), stat_of("self")) {
        (Some(b), Some(n), Some((_, t))) => format!("{b}:{n}:{t}"),
        _ => String::new(),
    }
}

/// The `host` column of a new session of this process: the host name, then its identity.
pub fn host_field(host_name: &str) -> String {
    let id = this_process();
    if id.is_empty() {
        host_name.to_string()
    } else {
        format!("{host_name}{HOST_ID_SEP}{id}")
    }
}

/// Whether session `s`'s daemon runs, as far as this machine can tell.
pub fn state(s: &SessionInfo) -> Liveness {
    let Some(id) = s.process_id() else {
        return Liveness::Unknown;
    };
    let mut parts = id.split(':');
    let (Some(boot), Some(ns), Some(start)) = (parts.next(), parts.next(), parts.next()) else {
        return Liveness::Unknown;
    };
    let Ok(start) = start.parse::<u64>() else {
        return Liveness::Unknown;
    };
    if boot_id().as_deref() != Some(boot)
        || pid_namespace("self").as_deref() != Some(ns)
        || !proc_is_ours()
    {
        return Liveness::Unknown;
    }
    match stat_of(&s.pid.to_string()) {
        None => Liveness::Gone(format!("its daemon, pid {}, no longer runs", s.pid)),
        Some(('Z', _)) | Some(('X', _)) => {
            Liveness::Gone(format!("its daemon, pid {}, has exited", s.pid))
        }
        Some((_, t)) if t != start => Liveness::Gone(format!(
            "its daemon, pid {}, no longer runs (the pid is another process's now)",
            s.pid
        )),
        Some(_) => Liveness::Running,
    }
}

/// Ends the sessions whose daemon ran on this machine and is gone (their open files, locks and
/// client name go with them, as when a session times out); returns how many.
pub fn end_gone_sessions(meta: &dyn MetaEngine) -> tierfs_meta::Result<usize> {
    let mut n = 0;
    for s in meta.sessions()? {
        if let Liveness::Gone(why) = state(&s) {
            match meta.unregister_session(s.id) {
                Ok(()) => {
                    tracing::info!(
                        "ended session {} of client '{}': {why}",
                        s.id,
                        s.client_name
                    );
                    n += 1;
                }
                // Another client ended it first.
                Err(tierfs_meta::MetaError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(host: String, pid: u32) -> SessionInfo {
        SessionInfo {
            id: 1,
            client_name: "c".into(),
            host,
            pid,
            mountpoint: "/m".into(),
            version: "0".into(),
            started: 0,
            heartbeat: 0,
        }
    }

    #[test]
    fn this_process_runs_and_a_dead_child_is_gone() {
        let me = session(host_field("h"), std::process::id());
        assert_eq!(me.host_name(), "h");
        assert_eq!(state(&me), Liveness::Running);
        // a child that has exited and been waited for
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let id = {
            // its identity, as its registration would have recorded it
            let (_, t) = stat_of(&pid.to_string()).unwrap_or(('R', 0));
            format!(
                "h{HOST_ID_SEP}{}:{}:{t}",
                boot_id().unwrap(),
                pid_namespace("self").unwrap()
            )
        };
        child.wait().unwrap();
        assert!(matches!(state(&session(id, pid)), Liveness::Gone(_)));
        // this process's pid with another start time: a reused pid
        let reused = format!(
            "h{HOST_ID_SEP}{}:{}:1",
            boot_id().unwrap(),
            pid_namespace("self").unwrap()
        );
        assert!(matches!(
            state(&session(reused, std::process::id())),
            Liveness::Gone(m) if m.contains("another process")
        ));
        // another boot, another namespace, or nothing recorded: only the heartbeat tells
        let other_boot = format!("h{HOST_ID_SEP}x:{}:1", pid_namespace("self").unwrap());
        assert_eq!(state(&session(other_boot, 999_999)), Liveness::Unknown);
        let other_ns = format!("h{HOST_ID_SEP}{}:1:1", boot_id().unwrap());
        assert_eq!(state(&session(other_ns, 999_999)), Liveness::Unknown);
        assert_eq!(state(&session("h".into(), 999_999)), Liveness::Unknown);
    }
}
