//! Client configuration: a TOML file (`tierfs mount --config FILE`), every key optional, unknown
//! keys rejected. Command-line flags override the file.
//!
//! ```toml
//! client_name = "node17"       # default: the host name
//! attr_ttl = 1.0               # seconds the kernel caches attributes (and the daemon "no xattrs")
//! entry_ttl = 1.0              # seconds the kernel caches names
//! follow_changes = true        # follow the other clients' changes (a changelog reader of this
//!                              # client) and invalidate the kernel's names and attributes they
//!                              # make stale; replies then carry follow_ttl while the follower
//!                              # keeps up (docs/semantics.md, "Following other clients");
//!                              # false: attr_ttl/entry_ttl only, and no changelog reader
//! follow_ttl = 30.0            # seconds the kernel caches names and attributes while following
//! fuse_threads = 8             # threads serving FUSE requests
//! dirty_limit_mb = 64          # commit buffered writes of a file past this
//! buffer_limit_mb = 256        # buffered writes of all files together, at most (writers wait)
//! readahead_chunks = 4         # chunks fetched ahead of a sequential reader
//! cache_chunks = 128           # chunks kept in the read cache
//! upload_parallelism = 16      # object uploads at once
//! heartbeat_secs = 2           # session heartbeat period
//! session_timeout_secs = 30    # a client silent this long is considered gone
//! gc_interval_secs = 1         # how often deleted objects are removed from targets
//! tranquility = 1.0            # background data movers (compaction, PCC write-back) pause
//!                              # this many times as long as each unit of work took (0: never)
//! log_level = "info"
//! posix_acl = true             # POSIX ACLs (false: as ext4's noacl, setfacl gets EOPNOTSUPP)
//! xattrs = true                # extended attributes; false: none (EOPNOTSUPP, as JuiceFS
//!                              # without --enable-xattr), which also turns POSIX ACLs off.
//!                              # `ls -l` then asks once per mount, not twice per file, and
//!                              # `tierfs pcc` commands work all the same
//! readdirplus = "always"       # directory listings carry attributes (READDIRPLUS): "always",
//!                              # "auto" (when the kernel guesses the caller stats: the first
//!                              # read of a directory, and after a stat of an entry), or "off"
//! writeback_cache = false      # the kernel's writeback cache (FUSE_WRITEBACK_CACHE): writes
//!                              # gather in the page cache and reach the daemon in large
//!                              # WRITEs at close, fsync or writeback; the kernel owns size,
//!                              # mtime and ctime of files it has cached. Off by default: a
//!                              # client then never sees another client's new size or mtime
//!                              # of a file whose inode its kernel keeps (docs/semantics.md);
//!                              # for one-client filesystems. Ignored (logged) with cache_dir.
//! fuse_uring = true            # FUSE over io_uring where the kernel offers it (Linux 6.14+,
//!                              # CONFIG_FUSE_IO_URING, and the fuse module parameter
//!                              # enable_uring = Y, which is N by default): requests and replies
//!                              # through ring entries, one system call per request instead of
//!                              # a read and a write on /dev/fuse. Where it is not offered the
//!                              # mount uses /dev/fuse (one log line); false: /dev/fuse always
//!                              # (docs/architecture.md, "FUSE over io_uring")
//! metrics = "127.0.0.1:9567"   # serve Prometheus metrics here (off by default)
//! # persistent client cache (off unless cache_dir is set)
//! cache_dir = "/nvme/pcc"      # where cached files live (a local disk)
//! cache_size = "10G"           # capacity of the cache
//! cache_high_watermark = 0.9   # evict when the cache is fuller than this...
//! cache_low_watermark = 0.75   # ...down to this
//! cache_eviction = "lru"       # or "size" (largest first)
//! writeback_delay_secs = 30    # dirty RW-PCC files are written back this long after last close
//! pcc_passthrough = true       # serve cached files by kernel FUSE passthrough
//! pcc_recall_timeout_secs = 60 # how long an open waits for another client to give a file back
//! pcc_open_cache_secs = 10     # kept opens under an RW-PCC lease (Lustre's open cache): the
//!                              # engine's record of a closed file's open stays this long without
//!                              # a handle, and opens on this client meanwhile need no metadata
//!                              # round trip (docs/pcc.md, "Kept opens"); 0: off
//! pcc_attach = "root"          # who may attach, detach, pin and unpin files by hand (`tierfs
//!                              # pcc attach ...`), as Lustre's pcc_mode: "root" (only root, the
//!                              # default, as Lustre), "owner" (root and the file's owner), or
//!                              # "access" (anyone who may read the file; RW needs write access).
//!                              # A non-root attach never evicts: it must fit in the cache below
//!                              # its high watermark.
//! # HSM (docs/hsm.md)
//! hsm_mover_archives = []      # archive ids this daemon moves data for as a background worker
//!                              # (`hsm-mover`, tranquility applies within each move), as
//!                              # `tierfs agent` does;
//!                              # empty (the default): off
//! # changelog (docs/changelog.md)
//! jobid_var = "disable"        # job id of each change: "disable", "procname_uid", or the
//!                              # environment variable of the writer that holds it ("SLURM_JOB_ID")
//! ```

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    pub client_name: Option<String>,
    pub attr_ttl: f64,
    pub entry_ttl: f64,
    pub follow_changes: bool,
    pub follow_ttl: f64,
    pub fuse_threads: usize,
    pub dirty_limit_mb: usize,
    pub buffer_limit_mb: usize,
    pub readahead_chunks: u64,
    pub cache_chunks: usize,
    pub upload_parallelism: usize,
    pub heartbeat_secs: u64,
    pub session_timeout_secs: u64,
    pub gc_interval_secs: u64,
    pub tranquility: f64,
    pub log_level: String,
    pub posix_acl: bool,
    pub xattrs: bool,
    pub readdirplus: String,
    pub writeback_cache: bool,
    pub fuse_uring: bool,
    pub metrics: Option<String>,
    pub cache_dir: Option<std::path::PathBuf>,
    pub cache_size: String,
    pub cache_high_watermark: f64,
    pub cache_low_watermark: f64,
    pub cache_eviction: String,
    pub writeback_delay_secs: u64,
    pub pcc_passthrough: bool,
    pub pcc_recall_timeout_secs: u64,
    pub pcc_open_cache_secs: u64,
    pub pcc_attach: String,
    pub jobid_var: String,
    pub hsm_mover_archives: Vec<u32>,
}

/// Who may attach, detach, pin and unpin files by hand (`pcc_attach`). Root always may; the
/// kernel has already checked the caller's access to the file (read, or write for RW).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachPolicy {
    /// Only root (the default, as Lustre's default pcc_mode).
    Root,
    /// Root and the file's owner.
    Owner,
    /// Anyone with the access the command needs.
    Access,
}

impl AttachPolicy {
    pub fn parse(s: &str) -> Result<AttachPolicy, String> {
        match s {
            "root" => Ok(AttachPolicy::Root),
            "owner" => Ok(AttachPolicy::Owner),
            "access" => Ok(AttachPolicy::Access),
            other => Err(format!(
                "pcc_attach '{other}' (expected root, owner or access)"
            )),
        }
    }

    /// Whether `uid` may attach, detach, pin or unpin a file owned by `file_uid` by hand.
    pub fn admits(self, uid: u32, file_uid: u32) -> bool {
        uid == 0
            || match self {
                AttachPolicy::Root => false,
                AttachPolicy::Owner => uid == file_uid,
                AttachPolicy::Access => true,
            }
    }
}

/// When directory listings carry each entry's attributes (`readdirplus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaddirPlus {
    /// Every listing (FUSE_DO_READDIRPLUS).
    Always,
    /// When the kernel guesses the caller will stat the entries (FUSE_READDIRPLUS_AUTO).
    Auto,
    /// Names only (READDIR); each stat is a LOOKUP.
    Off,
}

impl ReaddirPlus {
    pub fn parse(s: &str) -> Result<ReaddirPlus, String> {
        match s {
            "always" => Ok(ReaddirPlus::Always),
            "auto" => Ok(ReaddirPlus::Auto),
            "off" => Ok(ReaddirPlus::Off),
            other => Err(format!(
                "readdirplus '{other}' (expected always, auto or off)"
            )),
        }
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            client_name: None,
            attr_ttl: 1.0,
            entry_ttl: 1.0,
            follow_changes: true,
            follow_ttl: 30.0,
            fuse_threads: 8,
            dirty_limit_mb: 64,
            buffer_limit_mb: 256,
            readahead_chunks: 4,
            cache_chunks: 128,
            upload_parallelism: 16,
            heartbeat_secs: 2,
            session_timeout_secs: 30,
            gc_interval_secs: 1,
            tranquility: 1.0,
            log_level: "info".into(),
            posix_acl: true,
            xattrs: true,
            readdirplus: "always".into(),
            writeback_cache: false,
            fuse_uring: true,
            metrics: None,
            cache_dir: None,
            cache_size: "10G".into(),
            cache_high_watermark: 0.9,
            cache_low_watermark: 0.75,
            cache_eviction: "lru".into(),
            writeback_delay_secs: 30,
            pcc_passthrough: true,
            pcc_recall_timeout_secs: 60,
            pcc_open_cache_secs: 10,
            pcc_attach: "root".into(),
            jobid_var: "disable".into(),
            hsm_mover_archives: Vec::new(),
        }
    }
}

impl ClientConfig {
    /// Parses a config file's text; the error names the offending key or value.
    pub fn from_toml(text: &str) -> Result<ClientConfig, String> {
        let c: ClientConfig = toml::from_str(text).map_err(|e| e.message().to_string())?;
        c.validate()?;
        Ok(c)
    }

    pub fn readdir_plus(&self) -> Result<ReaddirPlus, String> {
        ReaddirPlus::parse(&self.readdirplus)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.attr_ttl >= 0.0 && self.attr_ttl <= 3600.0) {
            return Err(format!(
                "attr_ttl {} is out of range 0..3600",
                self.attr_ttl
            ));
        }
        if !(self.entry_ttl >= 0.0 && self.entry_ttl <= 3600.0) {
            return Err(format!(
                "entry_ttl {} is out of range 0..3600",
                self.entry_ttl
            ));
        }
        if !(self.follow_ttl >= 0.0 && self.follow_ttl <= 3600.0) {
            return Err(format!(
                "follow_ttl {} is out of range 0..3600",
                self.follow_ttl
            ));
        }
        if self.fuse_threads == 0 || self.fuse_threads > 256 {
            return Err(format!(
                "fuse_threads {} is out of range 1..256",
                self.fuse_threads
            ));
        }
        if self.dirty_limit_mb == 0 {
            return Err("dirty_limit_mb must be at least 1".into());
        }
        if self.buffer_limit_mb == 0 {
            return Err("buffer_limit_mb must be at least 1".into());
        }
        if self.heartbeat_secs == 0 || self.session_timeout_secs <= self.heartbeat_secs {
            return Err("session_timeout_secs must exceed heartbeat_secs (> 0)".into());
        }
        if !(self.tranquility >= 0.0 && self.tranquility <= 100.0) {
            return Err(format!(
                "tranquility {} is out of range 0..100",
                self.tranquility
            ));
        }
        self.cache_bytes()?;
        if !(0.0 < self.cache_low_watermark
            && self.cache_low_watermark < self.cache_high_watermark
            && self.cache_high_watermark <= 1.0)
        {
            return Err("cache watermarks must satisfy 0 < low < high <= 1".into());
        }
        self.eviction()?;
        self.attach_policy()?;
        self.readdir_plus()?;
        self.jobid_source()?;
        Ok(())
    }

    /// Who may attach files by hand (`pcc_attach`).
    pub fn attach_policy(&self) -> Result<AttachPolicy, String> {
        AttachPolicy::parse(&self.pcc_attach)
    }

    /// Where changelog records' job ids come from (`jobid_var`).
    pub fn jobid_source(&self) -> Result<crate::caller::JobIdSource, String> {
        crate::caller::JobIdSource::parse(&self.jobid_var)
    }

    /// The cache capacity in bytes.
    pub fn cache_bytes(&self) -> Result<u64, String> {
        let n = tierfs_store::size::parse_size(&self.cache_size).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("cache_size must be more than 0".into());
        }
        Ok(n)
    }

    pub fn eviction(&self) -> Result<tierfs_pcc::store::Eviction, String> {
        match self.cache_eviction.as_str() {
            "lru" => Ok(tierfs_pcc::store::Eviction::Lru),
            "size" => Ok(tierfs_pcc::store::Eviction::Size),
            other => Err(format!("cache_eviction '{other}' (expected lru or size)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = ClientConfig::from_toml("attr_ttl = 0.5\nclient_name = \"a\"").unwrap();
        assert_eq!(c.attr_ttl, 0.5);
        assert_eq!(c.client_name.as_deref(), Some("a"));
        assert_eq!(c.fuse_threads, 8);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let e = ClientConfig::from_toml("no_such_key = 1").unwrap_err();
        assert!(e.contains("no_such_key"), "{e}");
        assert!(ClientConfig::from_toml("attr_ttl = -1.0").is_err());
        assert!(ClientConfig::from_toml("follow_ttl = -1.0").is_err());
        let c = ClientConfig::from_toml("follow_changes = false\nfollow_ttl = 120.0").unwrap();
        assert!(!c.follow_changes);
        assert_eq!(c.follow_ttl, 120.0);
        assert!(ClientConfig::default().follow_changes);
        assert!(ClientConfig::from_toml("").unwrap().follow_changes);
        assert!(ClientConfig::from_toml("fuse_threads = 0").is_err());
        assert!(ClientConfig::from_toml("attr_ttl = \"x\"").is_err());
    }

    #[test]
    fn tranquility_defaults_to_one_and_is_checked() {
        assert_eq!(ClientConfig::default().tranquility, 1.0);
        assert_eq!(
            ClientConfig::from_toml("tranquility = 0.0")
                .unwrap()
                .tranquility,
            0.0
        );
        assert_eq!(
            ClientConfig::from_toml("tranquility = 2.5")
                .unwrap()
                .tranquility,
            2.5
        );
        let e = ClientConfig::from_toml("tranquility = -1.0").unwrap_err();
        assert!(e.contains("tranquility"), "{e}");
        assert!(ClientConfig::from_toml("tranquility = nan").is_err());
    }

    #[test]
    fn buffer_limit_has_a_default_and_is_at_least_one_mib() {
        assert_eq!(ClientConfig::default().buffer_limit_mb, 256);
        let c = ClientConfig::from_toml("buffer_limit_mb = 32").unwrap();
        assert_eq!(c.buffer_limit_mb, 32);
        let e = ClientConfig::from_toml("buffer_limit_mb = 0").unwrap_err();
        assert!(e.contains("buffer_limit_mb"), "{e}");
    }

    #[test]
    fn readdirplus_defaults_to_always_and_is_checked() {
        assert_eq!(
            ClientConfig::default().readdir_plus(),
            Ok(ReaddirPlus::Always)
        );
        for (v, want) in [
            ("always", ReaddirPlus::Always),
            ("auto", ReaddirPlus::Auto),
            ("off", ReaddirPlus::Off),
        ] {
            let c = ClientConfig::from_toml(&format!("readdirplus = \"{v}\"")).unwrap();
            assert_eq!(c.readdir_plus(), Ok(want));
        }
        let e = ClientConfig::from_toml("readdirplus = \"sometimes\"").unwrap_err();
        assert!(e.contains("readdirplus"), "{e}");
    }

    #[test]
    fn fuse_uring_defaults_to_on() {
        assert!(ClientConfig::default().fuse_uring);
        assert!(
            !ClientConfig::from_toml("fuse_uring = false")
                .unwrap()
                .fuse_uring
        );
        assert!(
            ClientConfig::from_toml("fuse_uring = true")
                .unwrap()
                .fuse_uring
        );
        assert!(ClientConfig::from_toml("fuse_uring = 1").is_err());
    }

    #[test]
    fn writeback_cache_defaults_to_off() {
        assert!(!ClientConfig::default().writeback_cache);
        assert!(
            ClientConfig::from_toml("writeback_cache = true")
                .unwrap()
                .writeback_cache
        );
        assert!(ClientConfig::from_toml("writeback_cache = \"yes\"").is_err());
    }

    #[test]
    fn kept_opens_last_ten_seconds_by_default_and_zero_turns_them_off() {
        assert_eq!(ClientConfig::default().pcc_open_cache_secs, 10);
        let c = ClientConfig::from_toml("pcc_open_cache_secs = 0").unwrap();
        assert_eq!(c.pcc_open_cache_secs, 0);
        assert!(ClientConfig::from_toml("pcc_open_cache_secs = -1").is_err());
    }

    #[test]
    fn pcc_attach_defaults_to_root_only_and_is_checked() {
        let c = ClientConfig::default();
        assert_eq!(c.attach_policy(), Ok(AttachPolicy::Root));
        assert!(AttachPolicy::Root.admits(0, 1000));
        assert!(!AttachPolicy::Root.admits(1000, 1000));
        let c = ClientConfig::from_toml("pcc_attach = \"owner\"").unwrap();
        assert_eq!(c.attach_policy(), Ok(AttachPolicy::Owner));
        assert!(AttachPolicy::Owner.admits(1000, 1000));
        assert!(!AttachPolicy::Owner.admits(1000, 1001));
        assert!(AttachPolicy::Access.admits(1000, 1001));
        let e = ClientConfig::from_toml("pcc_attach = \"everyone\"").unwrap_err();
        assert!(e.contains("pcc_attach"), "{e}");
    }

    #[test]
    fn jobid_var_defaults_to_disabled_and_is_checked() {
        use crate::caller::JobIdSource;
        assert_eq!(
            ClientConfig::default().jobid_source(),
            Ok(JobIdSource::Disabled)
        );
        let c = ClientConfig::from_toml("jobid_var = \"SLURM_JOB_ID\"").unwrap();
        assert_eq!(
            c.jobid_source(),
            Ok(JobIdSource::Env("SLURM_JOB_ID".into()))
        );
        let e = ClientConfig::from_toml("jobid_var = \"A-B\"").unwrap_err();
        assert!(e.contains("jobid_var"), "{e}");
    }
}
