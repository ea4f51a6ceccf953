//! `tierfs session`: the clients' sessions, and evicting one (like Lustre's `lctl evict`).

use clap::{Args, Subcommand};
use tierfs_meta::{MetaEngine, SessionInfo};

use crate::error::{CliError, Result};
use crate::pcc::{engine_for, Target};

#[derive(Debug, Subcommand)]
pub enum SessionCmd {
    /// List the sessions of the clients mounted now: id, client name, host, pid, mount point
    /// and the age of the last heartbeat by the database's clock.
    List(Target),
    /// End a client's session at once, as if it had missed its heartbeats for the session
    /// timeout (like Lustre's `lctl evict`): its open files and locks are dropped (files
    /// unlinked while it held them open are purged). A running client finds out at its next
    /// heartbeat or metadata write: it logs a FENCED error, registers a new session and carries
    /// on; handles it opened before fail with EIO (close succeeds) and writes it had buffered
    /// and not yet committed are refused. Its RW-PCC leases are kept (a dirty one holds data
    /// only its cache has). For an administrator: the client loses its opens and locks.
    Evict(EvictArgs),
}

#[derive(Debug, Args)]
pub struct EvictArgs {
    /// A session id (as `tierfs session list` or `tierfs status` shows it), or a client name
    /// (every session of that name).
    pub session: String,
    #[command(flatten)]
    pub at: Target,
}

pub fn run(c: SessionCmd) -> Result<()> {
    match c {
        SessionCmd::List(w) => list(engine_for(&w)?.as_ref()),
        SessionCmd::Evict(a) => evict(engine_for(&a.at)?.as_ref(), &a.session),
    }
}

fn describe(s: &SessionInfo) -> String {
    format!(
        "session {} of client '{}' (host {}, pid {}, at {})",
        s.id,
        s.client_name,
        s.host_name(),
        s.pid,
        s.mountpoint
    )
}

fn list(e: &dyn MetaEngine) -> Result<()> {
    let now = e.db_now()?;
    let sessions = e.sessions()?;
    if sessions.is_empty() {
        println!("no sessions");
    }
    for s in sessions {
        println!(
            "{:>6}  {:<16} host {} pid {} at {}  heartbeat {:.1}s ago",
            s.id,
            s.client_name,
            s.host_name(),
            s.pid,
            s.mountpoint,
            (now - s.heartbeat) as f64 / 1e9
        );
    }
    Ok(())
}

/// The sessions `which` names: the session with that id, else every session of the client
/// with that name.
fn chosen(all: Vec<SessionInfo>, which: &str) -> Vec<SessionInfo> {
    if let Ok(id) = which.parse::<u64>() {
        if all.iter().any(|s| s.id == id) {
            return all.into_iter().filter(|s| s.id == id).collect();
        }
    }
    all.into_iter().filter(|s| s.client_name == which).collect()
}

fn evict(e: &dyn MetaEngine, which: &str) -> Result<()> {
    let victims = chosen(e.sessions()?, which);
    if victims.is_empty() {
        return Err(CliError::Other(format!(
            "no session with id or client name '{which}' (see tierfs session list)"
        )));
    }
    for s in victims {
        e.unregister_session(s.id)?;
        tracing::warn!("evicted {}", describe(&s));
        println!("evicted {}", describe(&s));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: u64, name: &str) -> SessionInfo {
        SessionInfo {
            id,
            client_name: name.into(),
            host: "h".into(),
            pid: 1,
            mountpoint: "/m".into(),
            version: "0".into(),
            started: 0,
            heartbeat: 0,
        }
    }

    #[test]
    fn an_id_or_a_client_name_chooses() {
        let all = || vec![s(3, "a"), s(4, "b"), s(5, "4"), s(6, "b")];
        let ids = |v: Vec<SessionInfo>| v.iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(chosen(all(), "3")), vec![3]);
        assert_eq!(ids(chosen(all(), "b")), vec![4, 6]);
        // an id wins over a client named like it; a number that is no id is a name
        assert_eq!(ids(chosen(all(), "4")), vec![4]);
        assert_eq!(ids(chosen(vec![s(5, "4")], "4")), vec![5]);
        assert!(chosen(all(), "nobody").is_empty());
    }
}
