//! Storage targets: a URL, checked and opened through the `object_store` crate.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::{Result, StoreError};
use crate::objects::object_path;
use crate::s3::{self, S3Spec};
use crate::size::parse_size;

/// A parsed target URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// The URL as recorded in the metadata engine (without the query).
    pub url: String,
    pub kind: TargetKind,
    /// Byte limit from `?capacity=`, 0 for none.
    pub capacity: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetKind {
    Local(PathBuf),
    S3(S3Spec),
}

impl TargetSpec {
    pub fn parse(s: &str) -> Result<TargetSpec> {
        let (base, query) = match s.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (s, None),
        };
        let mut capacity = 0;
        let (mut endpoint, mut region) = (None, None);
        if let Some(q) = query {
            for kv in q.split('&') {
                match kv.split_once('=') {
                    Some(("capacity", v)) => capacity = parse_size(v)?,
                    Some(("endpoint", v)) if base.starts_with("s3://") => {
                        S3Spec::check_endpoint(v)?;
                        endpoint = Some(v.trim_end_matches('/').to_string());
                    }
                    Some(("region", v)) if base.starts_with("s3://") && !v.is_empty() => {
                        region = Some(v.to_string())
                    }
                    _ => return Err(StoreError::BadUrl(s.to_string())),
                }
            }
        }
        let kind = if let Some(p) = base.strip_prefix("file://") {
            if !p.starts_with('/') {
                return Err(StoreError::BadUrl(s.to_string()));
            }
            TargetKind::Local(PathBuf::from(p))
        } else if let Some(rest) = base.strip_prefix("s3://") {
            let mut spec = S3Spec::parse(rest, s)?;
            spec.endpoint = endpoint;
            spec.region = region;
            TargetKind::S3(spec)
        } else {
            return Err(StoreError::BadUrl(s.to_string()));
        };
        let url = match &kind {
            TargetKind::S3(spec) => spec.url(),
            TargetKind::Local(_) => base.to_string(),
        };
        Ok(TargetSpec {
            url,
            kind,
            capacity,
        })
    }

    /// Gives an S3 target without an endpoint (or region) in its URL this one
    /// (`format --s3-endpoint`); local targets are left alone.
    pub fn with_s3_defaults(
        mut self,
        endpoint: Option<&str>,
        region: Option<&str>,
    ) -> Result<Self> {
        if let TargetKind::S3(spec) = &mut self.kind {
            if spec.endpoint.is_none() {
                if let Some(e) = endpoint {
                    S3Spec::check_endpoint(e)?;
                    spec.endpoint = Some(e.trim_end_matches('/').to_string());
                }
            }
            if spec.region.is_none() {
                spec.region = region.map(str::to_string);
            }
            self.url = spec.url();
        }
        Ok(self)
    }

    /// The URL with its capacity, as given to `format`.
    pub fn full_url(&self) -> String {
        self.url.clone()
    }

    /// Makes sure the target exists and can be written (creating a local directory if needed
    /// when `create` is set).
    pub fn check(&self, create: bool) -> Result<()> {
        match &self.kind {
            TargetKind::Local(dir) => {
                if !dir.exists() {
                    if !create {
                        return Err(StoreError::Missing(dir.display().to_string()));
                    }
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unwritable(dir.display().to_string(), e.to_string())
                    })?;
                }
                if !dir.is_dir() {
                    return Err(StoreError::Unwritable(
                        dir.display().to_string(),
                        "not a directory".into(),
                    ));
                }
                let probe = dir.join(format!(".tierfs-probe-{}", std::process::id()));
                std::fs::write(&probe, b"probe").map_err(|e| {
                    StoreError::Unwritable(dir.display().to_string(), e.to_string())
                })?;
                let _ = std::fs::remove_file(&probe);
                Ok(())
            }
            TargetKind::S3(spec) => s3::probe(spec, &crate::credentials::resolve()?),
        }
    }

    /// Whether the target holds tierfs objects already.
    pub fn has_objects(&self) -> Result<bool> {
        match &self.kind {
            TargetKind::Local(dir) => Ok(dir.join("objects").exists()),
            TargetKind::S3(spec) => {
                use futures::StreamExt;
                let creds = crate::credentials::resolve()?;
                let store = spec.open_with(&creds)?;
                s3::block_on(async {
                    let prefix = object_store::path::Path::from("objects");
                    match store.list(Some(&prefix)).next().await {
                        None => Ok(false),
                        Some(Ok(_)) => Ok(true),
                        Some(Err(e)) => Err(s3::explain(spec, &creds.source, e)),
                    }
                })
            }
        }
    }

    /// Deletes every tierfs object of the target (format --force).
    pub fn wipe(&self) -> Result<()> {
        match &self.kind {
            TargetKind::Local(dir) => {
                let o = dir.join("objects");
                if o.exists() {
                    std::fs::remove_dir_all(&o).map_err(|e| StoreError::Io(e.to_string()))?;
                }
                Ok(())
            }
            TargetKind::S3(spec) => {
                use futures::{StreamExt, TryStreamExt};
                let creds = crate::credentials::resolve()?;
                let store = spec.open_with(&creds)?;
                s3::block_on(async {
                    let prefix = object_store::path::Path::from("objects");
                    let locations = store.list(Some(&prefix)).map_ok(|m| m.location).boxed();
                    store
                        .delete_stream(locations)
                        .try_collect::<Vec<_>>()
                        .await
                        .map_err(|e| s3::explain(spec, &creds.source, e))?;
                    Ok(())
                })
            }
        }
    }
}

/// One entry found under a target's `objects/` prefix by [`Target::list_objects`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedObject {
    pub obj: u64,
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub modified: i64,
    /// Local targets: an interrupted upload's staging file (`<id>#<n>`, left by a writer killed
    /// during its put) with this file name, not the object itself.
    pub staged: Option<String>,
}

fn nanos_of(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Space of the device under a target, from statvfs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceSpace {
    pub total: u64,
    pub avail: u64,
}

/// One opened storage target.
#[derive(Debug)]
pub struct Target {
    pub id: u32,
    pub spec: TargetSpec,
    store: Arc<dyn ObjectStore>,
    fds: std::sync::Mutex<std::collections::HashMap<u64, Arc<std::fs::File>>>,
    /// Local targets: object directories (`objects/<n>`) whose own entry was made durable.
    synced_dirs: Arc<std::sync::Mutex<std::collections::HashSet<u64>>>,
    /// Fault injection for tests: every sync fails with EIO while set.
    fail_syncs: std::sync::atomic::AtomicBool,
}

/// Above this many objects, fsync of a local target is one syncfs(2).
const SYNCFS_OBJECTS: usize = 32;

/// Open object descriptors kept per local target.
const FD_CACHE: usize = 4096;

impl Target {
    pub fn open(id: u32, spec: TargetSpec) -> Result<Target> {
        let store: Arc<dyn ObjectStore> = match &spec.kind {
            TargetKind::Local(dir) => {
                spec.check(false)?;
                Arc::new(
                    LocalFileSystem::new_with_prefix(dir)
                        .map_err(|e| StoreError::Io(e.to_string()))?
                        .with_automatic_cleanup(true),
                )
            }
            // The check of `TargetSpec::check`, through the client the target keeps.
            TargetKind::S3(s3spec) => {
                let creds = crate::credentials::resolve()?;
                let store = s3spec.open_with(&creds)?;
                s3::probe_store(s3spec, &store, &creds)?;
                store
            }
        };
        Ok(Target {
            id,
            spec,
            store,
            fds: Default::default(),
            synced_dirs: Default::default(),
            fail_syncs: Default::default(),
        })
    }

    pub async fn put(&self, obj: u64, data: Bytes) -> Result<()> {
        let r = match &self.spec.kind {
            TargetKind::S3(_) => s3::put(self.store.as_ref(), &object_path(obj), data).await,
            TargetKind::Local(_) => self
                .store
                .put(&object_path(obj), PutPayload::from_bytes(data))
                .await
                .map(|_| ())
                .map_err(StoreError::from),
        };
        r.map_err(|e| match e {
            StoreError::NoSpace(_) => StoreError::NoSpace(self.id),
            other => other,
        })?;
        Ok(())
    }

    /// Reads a range of an object on a local target on the calling thread, through a cache of
    /// open descriptors (objects are immutable, so a cached descriptor never reads stale
    /// bytes). `None` for targets that are not local.
    pub fn read_local(&self, obj: u64, start: u64, end: u64) -> Option<Result<Bytes>> {
        use std::os::unix::fs::FileExt;
        let TargetKind::Local(dir) = &self.spec.kind else {
            return None;
        };
        let file = {
            let mut fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
            match fds.get(&obj) {
                Some(f) => Arc::clone(f),
                None => {
                    let p = dir.join(object_path(obj).as_ref());
                    let f = match std::fs::File::open(&p) {
                        Ok(f) => Arc::new(f),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            return Some(Err(StoreError::NotFound(p.display().to_string())))
                        }
                        Err(e) => return Some(Err(StoreError::Io(e.to_string()))),
                    };
                    if fds.len() >= FD_CACHE {
                        fds.clear();
                    }
                    fds.insert(obj, Arc::clone(&f));
                    f
                }
            }
        };
        let mut buf = vec![0u8; (end - start) as usize];
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], start + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(StoreError::Io(e.to_string()))),
            }
        }
        buf.truncate(done);
        Some(Ok(Bytes::from(buf)))
    }

    /// Forgets a cached descriptor (the object was deleted).
    fn forget_fd(&self, obj: u64) {
        self.fds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&obj);
    }

    pub async fn get_range(&self, obj: u64, start: u64, end: u64) -> Result<Bytes> {
        match &self.spec.kind {
            TargetKind::S3(_) => {
                s3::get_range(self.store.as_ref(), &object_path(obj), start, end).await
            }
            TargetKind::Local(_) => Ok(self.store.get_range(&object_path(obj), start..end).await?),
        }
    }

    /// Makes written objects durable (fsync of each object file and its directory on a local
    /// target; object stores acknowledge a put only once it is durable, so nothing to do there).
    ///
    /// An object that is not there is an error: the caller is about to commit metadata that
    /// refers to it.
    pub async fn sync(&self, objs: Vec<u64>) -> Result<()> {
        if self.fail_syncs.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError::Io(format!(
                "target {}: sync failed (injected fault)",
                self.id
            )));
        }
        match &self.spec.kind {
            TargetKind::Local(dir) => {
                let dir = dir.clone();
                let synced_dirs = Arc::clone(&self.synced_dirs);
                tokio::task::spawn_blocking(move || {
                    if objs.len() > SYNCFS_OBJECTS {
                        // Many objects: one syncfs(2) of the target's filesystem costs less than
                        // an fsync per object (and makes them all durable).
                        let d =
                            std::fs::File::open(&dir).map_err(|e| StoreError::Io(e.to_string()))?;
                        use std::os::fd::AsRawFd;
                        // SAFETY: syncfs on a valid open descriptor.
                        if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
                            return Err(StoreError::Io(
                                std::io::Error::last_os_error().to_string(),
                            ));
                        }
                        return Ok(());
                    }
                    let io = |p: &std::path::Path, e: std::io::Error| {
                        StoreError::Io(format!("sync of {}: {e}", p.display()))
                    };
                    let fsync = |p: &std::path::Path| {
                        std::fs::File::open(p)
                            .and_then(|f| f.sync_all())
                            .map_err(|e| io(p, e))
                    };
                    let mut dirs = std::collections::BTreeSet::new();
                    for obj in objs {
                        let p = dir.join(object_path(obj).as_ref());
                        fsync(&p)?;
                        dirs.insert(obj >> 16);
                    }
                    for hi in dirs {
                        let d = dir.join("objects").join(hi.to_string());
                        fsync(&d)?;
                        // The first object of a directory: make the directory's own entry
                        // (and that of objects/) durable too.
                        let new = !synced_dirs
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .contains(&hi);
                        if new {
                            fsync(&dir.join("objects"))?;
                            fsync(&dir)?;
                            synced_dirs
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .insert(hi);
                        }
                    }
                    Ok(())
                })
                .await
                .map_err(|e| StoreError::Io(e.to_string()))?
            }
            // A PUT is acknowledged once the object is durable.
            TargetKind::S3(_) => Ok(()),
        }
    }

    /// Fault injection for tests: while `on`, every [`Target::sync`] fails with an I/O error.
    #[doc(hidden)]
    pub fn inject_sync_failure(&self, on: bool) {
        self.fail_syncs
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub async fn delete(&self, obj: u64) -> Result<()> {
        self.forget_fd(obj);
        match self.store.delete(&object_path(obj)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Lists every object of the target (in no particular order), calling `each` for each.
    /// Names that are not tierfs objects (see [`crate::objects::parse_object_path`]: marker
    /// files, anything foreign) are left alone and only counted: returns that count.
    pub fn list_objects(&self, each: &mut (dyn FnMut(ListedObject) + Send)) -> Result<u64> {
        match &self.spec.kind {
            TargetKind::Local(dir) => {
                let io = |e: std::io::Error| StoreError::Io(e.to_string());
                let root = dir.join("objects");
                let mut ignored = 0;
                let top = match std::fs::read_dir(&root) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                    Err(e) => return Err(io(e)),
                };
                for d in top {
                    let d = d.map_err(io)?;
                    let dname = d.file_name().to_string_lossy().into_owned();
                    let Some(hi) = crate::objects::parse_id(&dname) else {
                        ignored += 1;
                        continue;
                    };
                    if !d.file_type().map_err(io)?.is_dir() {
                        ignored += 1;
                        continue;
                    }
                    let entries = match std::fs::read_dir(d.path()) {
                        Ok(e) => e,
                        // Removed meanwhile (object_store drops empty directories).
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io(e)),
                    };
                    for f in entries {
                        let f = f.map_err(io)?;
                        let name = f.file_name().to_string_lossy().into_owned();
                        let (id_part, staged) = match name.split_once('#') {
                            Some((id, n))
                                if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) =>
                            {
                                (id, Some(name.clone()))
                            }
                            Some(_) => {
                                ignored += 1;
                                continue;
                            }
                            None => (name.as_str(), None),
                        };
                        let Some(obj) = crate::objects::parse_id(id_part).filter(|o| o >> 16 == hi)
                        else {
                            ignored += 1;
                            continue;
                        };
                        let md = match f.metadata() {
                            Ok(m) => m,
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(io(e)),
                        };
                        if !md.is_file() {
                            ignored += 1;
                            continue;
                        }
                        each(ListedObject {
                            obj,
                            size: md.len(),
                            modified: md.modified().map(nanos_of).unwrap_or(0),
                            staged,
                        });
                    }
                }
                Ok(ignored)
            }
            TargetKind::S3(spec) => {
                use futures::StreamExt;
                let store = Arc::clone(&self.store);
                s3::block_on(async move {
                    let prefix = object_store::path::Path::from("objects");
                    let mut list = store.list(Some(&prefix));
                    let mut ignored = 0;
                    while let Some(m) = list.next().await {
                        let m = m.map_err(|e| s3::explain(spec, "", e))?;
                        match crate::objects::parse_object_path(m.location.as_ref()) {
                            Some(obj) => each(ListedObject {
                                obj,
                                size: m.size,
                                modified: m.last_modified.timestamp_nanos_opt().unwrap_or(0),
                                staged: None,
                            }),
                            None => ignored += 1,
                        }
                    }
                    Ok(ignored)
                })
            }
        }
    }

    /// Whether object `obj` exists on the target now.
    pub fn exists(&self, obj: u64) -> Result<bool> {
        let store = Arc::clone(&self.store);
        s3::block_on(async move {
            match store.head(&object_path(obj)).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Removes one entry [`Target::list_objects`] found (an object, or a staging file).
    pub fn remove_listed(&self, l: &ListedObject) -> Result<()> {
        match (&self.spec.kind, &l.staged) {
            (TargetKind::Local(dir), Some(name)) => {
                let p = dir
                    .join("objects")
                    .join((l.obj >> 16).to_string())
                    .join(name);
                match std::fs::remove_file(&p) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(StoreError::Io(format!("{}: {e}", p.display()))),
                }
            }
            _ => s3::block_on(self.delete(l.obj)),
        }
    }

    /// Size and free space of the device holding the target.
    pub fn device_space(&self) -> DeviceSpace {
        match &self.spec.kind {
            TargetKind::Local(dir) => statvfs(dir).unwrap_or_default(),
            // An object store has no device to ask: its `?capacity=` is its size.
            TargetKind::S3(_) => DeviceSpace::default(),
        }
    }
}

fn statvfs(dir: &std::path::Path) -> Option<DeviceSpace> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and st a properly sized out-parameter.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if r != 0 {
        return None;
    }
    Some(DeviceSpace {
        total: st.f_blocks as u64 * st.f_frsize as u64,
        avail: st.f_bavail as u64 * st.f_frsize as u64,
    })
}

/// Every target of a filesystem, indexed by target id.
#[derive(Debug, Default)]
pub struct TargetSet {
    targets: Vec<Arc<Target>>,
}

impl TargetSet {
    /// Opens targets from their recorded URLs and capacities, in id order.
    pub fn open(list: &[(u32, String, u64)]) -> Result<TargetSet> {
        let mut targets = Vec::new();
        for (id, url, cap) in list {
            let mut spec = TargetSpec::parse(url)?;
            spec.capacity = *cap;
            targets.push(Arc::new(Target::open(*id, spec)?));
        }
        Ok(TargetSet { targets })
    }

    pub fn get(&self, id: u32) -> Result<&Arc<Target>> {
        self.targets
            .iter()
            .find(|t| t.id == id)
            .ok_or(StoreError::UnknownTarget(id))
    }

    pub fn all(&self) -> &[Arc<Target>] {
        &self.targets
    }

    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_urls() {
        let s = TargetSpec::parse("file:///srv/ost0?capacity=10M").unwrap();
        assert_eq!(s.kind, TargetKind::Local(PathBuf::from("/srv/ost0")));
        assert_eq!(s.capacity, 10 << 20);
        assert_eq!(s.url, "file:///srv/ost0");
        assert!(TargetSpec::parse("ftp://x").is_err());
        assert!(TargetSpec::parse("file://relative").is_err());
        assert!(TargetSpec::parse("file:///x?bogus=1").is_err());
    }

    #[tokio::test]
    async fn put_get_delete_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let spec = TargetSpec::parse(&format!("file://{}", d.path().display())).unwrap();
        let t = Target::open(0, spec).unwrap();
        t.put(42, Bytes::from_static(b"hello world")).await.unwrap();
        assert_eq!(&t.get_range(42, 6, 11).await.unwrap()[..], b"world");
        t.delete(42).await.unwrap();
        t.delete(42).await.unwrap();
        assert!(matches!(
            t.get_range(42, 0, 1).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(t.device_space().total > 0);
    }

    #[tokio::test]
    async fn lists_objects_and_staging_files_but_not_foreign_names() {
        let d = tempfile::tempdir().unwrap();
        let spec = TargetSpec::parse(&format!("file://{}", d.path().display())).unwrap();
        let t = Target::open(0, spec).unwrap();
        t.put(7, Bytes::from_static(b"seven")).await.unwrap();
        t.put(70000, Bytes::from_static(b"x")).await.unwrap();
        std::fs::write(d.path().join("objects/0/9#3"), b"half").unwrap();
        std::fs::write(d.path().join("objects/0/notes"), b"?").unwrap();
        std::fs::write(d.path().join("objects/1/5"), b"wrong dir").unwrap();
        std::fs::write(d.path().join(".tierfs-target"), b"marker").unwrap();
        let mut seen = Vec::new();
        let ignored = t.list_objects(&mut |l| seen.push(l)).unwrap();
        seen.sort_by_key(|l| l.obj);
        assert_eq!(ignored, 2);
        let ids: Vec<(u64, u64, bool)> = seen
            .iter()
            .map(|l| (l.obj, l.size, l.staged.is_some()))
            .collect();
        assert_eq!(ids, vec![(7, 5, false), (9, 4, true), (70000, 1, false)]);
        assert!(seen[0].modified > 0);
        t.remove_listed(&seen[1]).unwrap();
        t.remove_listed(&seen[0]).unwrap();
        assert!(!d.path().join("objects/0/9#3").exists());
        assert!(!d.path().join("objects/0/7").exists());
        assert!(d.path().join(".tierfs-target").exists());
        assert!(d.path().join("objects/0/notes").exists());
    }

    #[test]
    fn check_reports_missing_and_unwritable() {
        let spec = TargetSpec::parse("file:///nonexistent/tierfs/x").unwrap();
        assert!(matches!(spec.check(false), Err(StoreError::Missing(_))));
    }
}
