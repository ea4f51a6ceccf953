//! Target identity: each storage target holds a small marker object, [`MARKER`], written at
//! `format`, naming the filesystem (uuid and name) and the target's index in it. `format`
//! refuses a target that belongs to a filesystem or holds anything else; every mount refuses a
//! target whose marker names another filesystem or another index. The marker goes through the
//! same `object_store` access as the objects, so local directories and S3 prefixes behave
//! alike. Object names live under `objects/`, so object naming and garbage collection never
//! touch it.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::s3;
use crate::target::{TargetKind, TargetSpec};

/// Name of the marker object at the root of a target (a directory or an S3 prefix).
pub const MARKER: &str = ".tierfs-target";

/// What a target's marker says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetIdentity {
    /// Uuid of the filesystem the target belongs to.
    pub fs_uuid: String,
    /// Its name (for messages).
    pub fs_name: String,
    /// The target's index (id) in that filesystem.
    pub target: u32,
    /// When the marker was written, seconds since the epoch.
    pub written: u64,
}

impl TargetIdentity {
    pub fn new(fs_uuid: &str, fs_name: &str, target: u32) -> TargetIdentity {
        TargetIdentity {
            fs_uuid: fs_uuid.to_string(),
            fs_name: fs_name.to_string(),
            target,
            written: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// "filesystem 'NAME' (uuid U), target N".
    pub fn describe(&self) -> String {
        format!(
            "filesystem '{}' (uuid {}) as its target {}",
            self.fs_name, self.fs_uuid, self.target
        )
    }
}

/// What the root of a target holds besides its marker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contents {
    /// Tierfs objects (`objects/`).
    pub objects: bool,
    /// The first entry that is neither tierfs's nor a filesystem's own (`lost+found`).
    pub foreign: Option<String>,
}

impl Contents {
    pub fn is_empty(&self) -> bool {
        !self.objects && self.foreign.is_none()
    }
}

/// A store for the target's root (its directory, or its bucket seen through its prefix), with
/// the source of the credentials for error messages.
fn root_store(spec: &TargetSpec) -> Result<(Arc<dyn ObjectStore>, String)> {
    match &spec.kind {
        TargetKind::Local(dir) => Ok((
            Arc::new(
                LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| StoreError::Unwritable(spec.url.clone(), e.to_string()))?,
            ),
            String::new(),
        )),
        TargetKind::S3(s) => {
            let creds = crate::credentials::resolve()?;
            Ok((s.open_with(&creds)?, creds.source))
        }
    }
}

fn store_error(spec: &TargetSpec, source: &str, e: object_store::Error) -> StoreError {
    match &spec.kind {
        TargetKind::S3(s) => s3::explain(s, source, e),
        TargetKind::Local(_) => StoreError::Unwritable(spec.url.clone(), e.to_string()),
    }
}

/// The target's marker, `None` when it has none.
pub fn read(spec: &TargetSpec) -> Result<Option<TargetIdentity>> {
    let (store, source) = root_store(spec)?;
    let path = object_store::path::Path::from(MARKER);
    let bytes = s3::block_on(async {
        match store.get(&path).await {
            Ok(r) => r
                .bytes()
                .await
                .map(Some)
                .map_err(|e| store_error(spec, &source, e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_error(spec, &source, e)),
        }
    })?;
    let Some(bytes) = bytes else { return Ok(None) };
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| StoreError::BadIdentity(spec.url.clone(), "not UTF-8 text".into()))?;
    toml::from_str(text)
        .map(Some)
        .map_err(|e| StoreError::BadIdentity(spec.url.clone(), e.message().to_string()))
}

/// Writes the target's marker (replacing any), durably on a local target.
pub fn write(spec: &TargetSpec, id: &TargetIdentity) -> Result<()> {
    let text = toml::to_string(id).map_err(|e| StoreError::Io(e.to_string()))?;
    let text = format!(
        "# tierfs storage target: do not remove, copy or edit (see docs/architecture.md)\n{text}"
    );
    let (store, source) = root_store(spec)?;
    let path = object_store::path::Path::from(MARKER);
    s3::block_on(async {
        store
            .put(&path, PutPayload::from_bytes(Bytes::from(text)))
            .await
            .map(|_| ())
            .map_err(|e| store_error(spec, &source, e))
    })?;
    if let TargetKind::Local(dir) = &spec.kind {
        for p in [dir.join(MARKER), dir.clone()] {
            std::fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::Unwritable(spec.url.clone(), e.to_string()))?;
        }
    }
    Ok(())
}

/// Entries of a target's root that belong to no one: tierfs's own probe files and a
/// filesystem's `lost+found` (a target may be the root of a disk of its own).
fn ignorable(name: &str) -> bool {
    // (`.tierfs-target#N`: a marker being written, see object_store's LocalFileSystem)
    name.starts_with(MARKER) || name.starts_with(".tierfs-probe-") || name == "lost+found"
}

/// What the target holds besides its marker.
pub fn contents(spec: &TargetSpec) -> Result<Contents> {
    let mut c = Contents::default();
    match &spec.kind {
        TargetKind::Local(dir) => {
            let rd = match std::fs::read_dir(dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(c),
                Err(e) => return Err(StoreError::Unwritable(spec.url.clone(), e.to_string())),
            };
            let mut names: Vec<String> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names {
                if n == "objects" {
                    c.objects = true;
                } else if !ignorable(&n) && c.foreign.is_none() {
                    c.foreign = Some(n);
                }
            }
        }
        TargetKind::S3(_) => {
            let (store, source) = root_store(spec)?;
            let list = s3::block_on(async {
                store
                    .list_with_delimiter(None)
                    .await
                    .map_err(|e| store_error(spec, &source, e))
            })?;
            let mut names: Vec<String> = list
                .common_prefixes
                .iter()
                .chain(list.objects.iter().map(|o| &o.location))
                .map(|p| p.as_ref().to_string())
                .collect();
            names.sort();
            for n in names {
                if n == "objects" {
                    c.objects = true;
                } else if !ignorable(&n) && c.foreign.is_none() {
                    c.foreign = Some(n);
                }
            }
        }
    }
    Ok(c)
}

/// Where a target is, for telling two URLs of one place apart: a local directory with
/// symlinks and `..` resolved (as far as it exists), or an S3 endpoint, bucket and prefix.
/// One location lies inside another when it starts with it followed by `/`.
pub fn location(spec: &TargetSpec) -> String {
    match &spec.kind {
        TargetKind::Local(dir) => {
            let p = resolve(dir);
            let s = p.to_string_lossy();
            format!("file:{}", s.trim_end_matches('/'))
        }
        TargetKind::S3(s) => {
            let ep = s
                .endpoint
                .as_deref()
                .unwrap_or("aws")
                .trim_end_matches('/')
                .to_ascii_lowercase();
            let mut l = format!("s3:{ep}/{}", s.bucket);
            if !s.prefix.is_empty() {
                l.push('/');
                l.push_str(&s.prefix);
            }
            l
        }
    }
}

/// Whether location `inner` is `outer` or lies inside it.
pub fn within(inner: &str, outer: &str) -> bool {
    inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `p` made absolute without `.` and `..`, its longest existing ancestor canonicalized
/// (symlinks resolved).
fn resolve(p: &Path) -> PathBuf {
    let mut lexical = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::CurDir => {}
            other => lexical.push(other.as_os_str()),
        }
    }
    let mut head = lexical.clone();
    let mut tail = Vec::new();
    loop {
        if let Ok(canon) = std::fs::canonicalize(&head) {
            let mut out = canon;
            for t in tail.iter().rev() {
                out.push(t);
            }
            return out;
        }
        match (head.file_name().map(|n| n.to_os_string()), head.parent()) {
            (Some(n), Some(parent)) => {
                tail.push(n);
                head = parent.to_path_buf();
            }
            _ => return lexical,
        }
    }
}

/// How a mount found a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Its marker names this filesystem and index.
    Ok,
    /// It had no marker (formatted before markers existed) and now has one.
    Adopted { had_objects: bool },
}

/// Checks that target `id` of filesystem `fs_uuid` (named `fs_name`) is the one at `spec`.
/// A target without a marker (formatted by a tierfs without them) that holds nothing foreign is
/// given one now; a target of another filesystem, or another target of this one, is refused.
pub fn check(spec: &TargetSpec, fs_uuid: &str, fs_name: &str, id: u32) -> Result<Checked> {
    match read(spec)? {
        Some(m) if m.fs_uuid == fs_uuid && m.target == id => Ok(Checked::Ok),
        Some(m) if m.fs_uuid == fs_uuid => Err(StoreError::WrongTarget(
            spec.url.clone(),
            format!(
                "it is target {} of this filesystem, not target {id} (targets swapped?)",
                m.target
            ),
        )),
        Some(m) => Err(StoreError::WrongTarget(
            spec.url.clone(),
            format!(
                "it belongs to {}, not to '{fs_name}' (uuid {fs_uuid})",
                m.describe()
            ),
        )),
        None => {
            let c = contents(spec)?;
            if let Some(f) = c.foreign {
                return Err(StoreError::WrongTarget(
                    spec.url.clone(),
                    format!("it has no tierfs identity marker ({MARKER}) and holds '{f}'"),
                ));
            }
            write(spec, &TargetIdentity::new(fs_uuid, fs_name, id))?;
            Ok(Checked::Adopted {
                had_objects: c.objects,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(p: &Path) -> TargetSpec {
        TargetSpec::parse(&format!("file://{}", p.display())).unwrap()
    }

    #[test]
    fn marker_round_trip_and_contents() {
        let d = tempfile::tempdir().unwrap();
        let s = local(d.path());
        assert_eq!(read(&s).unwrap(), None);
        assert!(contents(&s).unwrap().is_empty());
        let id = TargetIdentity::new("u-1", "fs", 3);
        write(&s, &id).unwrap();
        assert_eq!(read(&s).unwrap(), Some(id));
        assert!(
            contents(&s).unwrap().is_empty(),
            "the marker is not content"
        );
        std::fs::create_dir(d.path().join("lost+found")).unwrap();
        assert!(contents(&s).unwrap().is_empty());
        std::fs::create_dir_all(d.path().join("objects/0")).unwrap();
        assert_eq!(
            contents(&s).unwrap(),
            Contents {
                objects: true,
                foreign: None
            }
        );
        std::fs::write(d.path().join("notes.txt"), b"x").unwrap();
        assert_eq!(contents(&s).unwrap().foreign.as_deref(), Some("notes.txt"));
        std::fs::write(d.path().join(MARKER), b"garbage = [").unwrap();
        assert!(matches!(read(&s), Err(StoreError::BadIdentity(..))));
    }

    #[test]
    fn check_adopts_refuses_and_accepts() {
        let d = tempfile::tempdir().unwrap();
        let s = local(d.path());
        assert_eq!(
            check(&s, "u-1", "a", 0).unwrap(),
            Checked::Adopted { had_objects: false }
        );
        assert_eq!(check(&s, "u-1", "a", 0).unwrap(), Checked::Ok);
        let e = check(&s, "u-1", "a", 1).unwrap_err().to_string();
        assert!(e.contains("target 0 of this filesystem"), "{e}");
        let e = check(&s, "u-2", "b", 0).unwrap_err().to_string();
        assert!(e.contains("'a' (uuid u-1)"), "{e}");
        let d2 = tempfile::tempdir().unwrap();
        std::fs::write(d2.path().join("x"), b"x").unwrap();
        assert!(check(&local(d2.path()), "u-1", "a", 0).is_err());
        assert_eq!(read(&local(d2.path())).unwrap(), None);
    }

    #[test]
    fn locations_see_through_spellings() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::create_dir(&a).unwrap();
        std::os::unix::fs::symlink(&a, d.path().join("link")).unwrap();
        let l = |p: PathBuf| location(&local(&p));
        let base = l(a.clone());
        assert_eq!(l(d.path().join("link")), base);
        assert_eq!(l(d.path().join("b/../a")), base);
        assert_eq!(l(d.path().join("a/.")), base);
        assert_eq!(
            location(&TargetSpec::parse(&format!("file://{}/", a.display())).unwrap()),
            base
        );
        // not created yet: resolved through the existing ancestor
        assert_eq!(l(d.path().join("link/x")), format!("{base}/x"));
        assert!(within(&l(d.path().join("link/x")), &base));
        assert!(!within(&l(d.path().join("ab")), &base));
        let s3 = |u: &str| location(&TargetSpec::parse(u).unwrap());
        assert_eq!(
            s3("s3://bkt/p/q/?endpoint=http://H:1/"),
            s3("s3://bkt/p/q?endpoint=http://h:1&region=x")
        );
        assert_ne!(s3("s3://bkt/p"), s3("s3://bkt/p?endpoint=http://h:1"));
        assert!(within(&s3("s3://bkt/p/q"), &s3("s3://bkt/p")));
        assert!(within(&s3("s3://bkt/p"), &s3("s3://bkt")));
    }
}
