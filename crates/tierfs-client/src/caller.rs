//! Who makes each change, for the changelog: the FUSE request's uid/gid and, when the client
//! is told which environment variable holds it (`jobid_var`, Lustre's parameter of the same
//! name), the writer's job id.
//!
//! The FUSE dispatcher ([`crate::fs`]) enters a [`tierfs_meta::changelog::Caller`] scope at the
//! start of each request that can change something; the engine's transaction, on the same
//! thread, reads it (see `tierfs_meta::changelog`). The job id comes from
//! `/proc/<pid>/environ` of the requesting process, cached per pid for [`JOBID_TTL`] in at
//! most [`JOBID_CACHE_MAX`] entries, so a process that makes many changes costs one read of its
//! environment every few seconds, and the cache stays small however many processes come and go.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tierfs_meta::changelog::{Caller, CallerGuard};

/// How long a pid's job id is reused before its environment is read again (a pid reused by
/// another process within this time could be given the previous process's job id).
pub const JOBID_TTL: Duration = Duration::from_secs(10);
/// At most this many pids are remembered.
pub const JOBID_CACHE_MAX: usize = 4096;
/// Longest job id kept (longer values are cut, as Lustre's 32-byte limit would).
pub const JOBID_MAX_LEN: usize = 128;

/// Where job ids come from (`jobid_var` in the client config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobIdSource {
    /// No job ids (`"disable"`, the default).
    Disabled,
    /// `"procname_uid"`: the process name and the uid, `cp.1000` (Lustre's).
    ProcnameUid,
    /// The value of this environment variable of the writing process, e.g. `SLURM_JOB_ID`.
    Env(String),
}

impl JobIdSource {
    /// Parses the `jobid_var` setting: `disable`, `procname_uid`, or a variable name
    /// (letters, digits and `_`, not starting with a digit).
    pub fn parse(s: &str) -> Result<JobIdSource, String> {
        match s {
            "" | "disable" => Ok(JobIdSource::Disabled),
            "procname_uid" => Ok(JobIdSource::ProcnameUid),
            v if v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !v.as_bytes()[0].is_ascii_digit() =>
            {
                Ok(JobIdSource::Env(v.to_string()))
            }
            v => Err(format!(
                "jobid_var {v:?}: expected disable, procname_uid or an environment variable name"
            )),
        }
    }
}

type Cached = (Option<Arc<str>>, Instant);

/// Builds the caller of each request; shared by the FUSE threads.
pub struct Callers {
    source: JobIdSource,
    /// pid -> (its job id, when read).
    cache: Mutex<HashMap<u32, Cached>>,
}

impl Callers {
    pub fn new(source: JobIdSource) -> Callers {
        Callers {
            source,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The caller of a request from `pid` as `uid`/`gid`.
    pub fn caller(&self, uid: u32, gid: u32, pid: u32) -> Caller {
        Caller {
            uid,
            gid,
            client: None,
            jobid: self.jobid(pid, uid),
        }
    }

    /// Enters the scope of a request (ends when the guard drops).
    pub fn enter(&self, uid: u32, gid: u32, pid: u32) -> CallerGuard {
        self.caller(uid, gid, pid).enter()
    }

    /// The job id of process `pid` (None when disabled, the variable is unset, or the process
    /// is gone or was the kernel's, pid 0).
    pub fn jobid(&self, pid: u32, uid: u32) -> Option<Arc<str>> {
        if self.source == JobIdSource::Disabled || pid == 0 {
            return None;
        }
        let now = Instant::now();
        if let Some((v, at)) = self.cache.lock().get(&pid) {
            if now.duration_since(*at) < JOBID_TTL {
                return v.clone();
            }
        }
        let v: Option<Arc<str>> = match &self.source {
            JobIdSource::Disabled => None,
            JobIdSource::ProcnameUid => std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| format!("{}.{uid}", c.trim_end()))
                .map(|s| Arc::from(cut(&s))),
            JobIdSource::Env(var) => std::fs::read(format!("/proc/{pid}/environ"))
                .ok()
                .and_then(|env| env_value(&env, var))
                .map(|s| Arc::from(cut(&s))),
        };
        let mut g = self.cache.lock();
        if g.len() >= JOBID_CACHE_MAX {
            g.retain(|_, (_, at)| now.duration_since(*at) < JOBID_TTL);
            if g.len() >= JOBID_CACHE_MAX {
                g.clear();
            }
        }
        g.insert(pid, (v.clone(), now));
        v
    }

    /// Pids remembered now (tests).
    pub fn cached(&self) -> usize {
        self.cache.lock().len()
    }
}

fn cut(s: &str) -> &str {
    if s.len() <= JOBID_MAX_LEN {
        return s;
    }
    let mut end = JOBID_MAX_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The value of `var` in a NUL-separated environment block (None when unset or empty).
fn env_value(env: &[u8], var: &str) -> Option<String> {
    env.split(|b| *b == 0).find_map(|kv| {
        let rest = kv.strip_prefix(var.as_bytes())?.strip_prefix(b"=")?;
        (!rest.is_empty()).then(|| String::from_utf8_lossy(rest).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_setting() {
        assert_eq!(JobIdSource::parse("disable"), Ok(JobIdSource::Disabled));
        assert_eq!(
            JobIdSource::parse("procname_uid"),
            Ok(JobIdSource::ProcnameUid)
        );
        assert_eq!(
            JobIdSource::parse("SLURM_JOB_ID"),
            Ok(JobIdSource::Env("SLURM_JOB_ID".into()))
        );
        assert!(JobIdSource::parse("1X").is_err());
        assert!(JobIdSource::parse("A=B").is_err());
    }

    #[test]
    fn finds_a_variable_in_an_environment_block() {
        let env = b"PATH=/bin\0SLURM_JOB_ID=4242\0SLURM_JOB_ID_X=no\0EMPTY=\0";
        assert_eq!(env_value(env, "SLURM_JOB_ID").as_deref(), Some("4242"));
        assert_eq!(env_value(env, "SLURM_JOB"), None);
        assert_eq!(env_value(env, "EMPTY"), None);
        assert_eq!(env_value(env, "NOPE"), None);
    }

    #[test]
    fn reads_this_process_environment_and_caches_it() {
        // The variable is set in a child whose environment we read (setting our own would
        // not show in /proc/self/environ, which is the environment at exec).
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .env("TIERFS_TEST_JOB", "job-77")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Until the child has exec'd, /proc shows the environment it inherited from us.
        let t = Instant::now();
        while !std::fs::read(format!("/proc/{pid}/environ"))
            .map(|e| env_value(&e, "TIERFS_TEST_JOB").is_some())
            .unwrap_or(false)
        {
            assert!(t.elapsed() < Duration::from_secs(5), "child never exec'd");
            std::thread::sleep(Duration::from_millis(5));
        }
        let c = Callers::new(JobIdSource::Env("TIERFS_TEST_JOB".into()));
        assert_eq!(c.jobid(pid, 0).as_deref(), Some("job-77"));
        assert_eq!(c.cached(), 1);
        let d = Callers::new(JobIdSource::Env("TIERFS_NOT_SET_ANYWHERE".into()));
        assert_eq!(d.jobid(pid, 0), None);
        let p = Callers::new(JobIdSource::ProcnameUid);
        assert_eq!(p.jobid(pid, 1000).as_deref(), Some("sleep.1000"));
        let off = Callers::new(JobIdSource::Disabled);
        assert_eq!(off.jobid(pid, 0), None);
        assert_eq!(off.cached(), 0);
        let _ = child.kill();
        let _ = child.wait();
        // cached: still answered after the process is gone
        assert_eq!(c.jobid(pid, 0).as_deref(), Some("job-77"));
    }

    #[test]
    fn the_cache_stays_bounded() {
        let c = Callers::new(JobIdSource::Env("X".into()));
        for pid in 1..(JOBID_CACHE_MAX as u32 + 500) {
            // pids far above pid_max: no such process, nothing read, but remembered
            c.jobid(pid + 10_000_000, 0);
        }
        assert!(c.cached() <= JOBID_CACHE_MAX);
    }

    #[test]
    fn long_values_are_cut_on_a_char_boundary() {
        let s = "é".repeat(100);
        let t = cut(&s);
        assert!(t.len() <= JOBID_MAX_LEN && t.is_char_boundary(t.len()));
    }
}
