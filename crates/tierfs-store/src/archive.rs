//! HSM archive backends (docs/hsm.md): `file:///dir` or `s3://bucket/prefix?endpoint=URL&region=NAME`,
//! opened through `object_store` as the storage targets are. An archive holds one object per
//! archive copy, under a key the mover chooses; the metadata engine records the key, size and
//! checksum of the copy that counts (`hsm_complete`), so a copy written by a mover that died
//! before completing is never taken for the file's.
//!
//! Copies are written with a multipart upload: the object appears at its key only when the
//! upload finishes (S3: at CompleteMultipartUpload; a local directory: the staging file is
//! renamed into place), never half-written.

use std::sync::Arc;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt};

use crate::error::{Result, StoreError};
use crate::s3;
use crate::target::{TargetKind, TargetSpec};

/// One opened archive backend.
#[derive(Debug, Clone)]
pub struct ArchiveStore {
    /// The URL as registered (`tierfs hsm archive-add`).
    pub url: String,
    store: Arc<dyn ObjectStore>,
    /// A local archive's directory (its staging files are listed and removed directly).
    local: Option<std::path::PathBuf>,
}

/// An entry of an archive's listing ([`ArchiveStore::list`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveEntry {
    /// The key (a staging file: its name, `<key>#<n>`).
    pub key: String,
    pub size: u64,
    /// A staging file of an unfinished upload (local directories only).
    pub staged: bool,
}

/// An object of an archive ([`ArchiveStore::list_objects`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchivedObject {
    pub key: String,
    pub size: u64,
    /// Its modification time (S3: LastModified), in nanoseconds since the epoch.
    pub mtime_ns: i64,
}

/// Bytes of a part of a copy's upload (S3 wants at least 5 MiB but for the last).
pub const ARCHIVE_PART: usize = s3::PART_SIZE;

/// The checksum algorithm of archive copies, as recorded (`crc32:xxxxxxxx`).
pub fn checksum_string(crc: u32) -> String {
    format!("crc32:{crc:08x}")
}

impl ArchiveStore {
    /// Opens the archive at `url` and proves it can be written (one small probe object):
    /// [`StoreError::ArchiveUnreachable`] with the reason otherwise. A local directory must
    /// exist (it is never created: a missing mount of the archive file system must not fill
    /// the root file system).
    pub fn open(url: &str) -> Result<ArchiveStore> {
        Self::open_inner(url, None)
    }

    /// [`ArchiveStore::open`] with these S3 credentials instead of those of the environment.
    pub fn open_with(url: &str, creds: &crate::credentials::Credentials) -> Result<ArchiveStore> {
        Self::open_inner(url, Some(creds))
    }

    fn open_inner(
        url: &str,
        creds: Option<&crate::credentials::Credentials>,
    ) -> Result<ArchiveStore> {
        let spec = TargetSpec::parse(url)?;
        if spec.capacity != 0 {
            return Err(StoreError::BadUrl(format!(
                "{url}: an archive takes no ?capacity="
            )));
        }
        let unreachable =
            |e: StoreError| StoreError::ArchiveUnreachable(url.to_string(), e.to_string());
        let store: Arc<dyn ObjectStore> = match &spec.kind {
            TargetKind::Local(dir) => {
                spec.check(false).map_err(unreachable)?;
                Arc::new(
                    LocalFileSystem::new_with_prefix(dir)
                        .map_err(|e| unreachable(StoreError::Io(e.to_string())))?
                        .with_automatic_cleanup(true),
                )
            }
            TargetKind::S3(s3spec) => {
                let creds = match creds {
                    Some(c) => c.clone(),
                    None => crate::credentials::resolve().map_err(unreachable)?,
                };
                let store = s3spec.open_with(&creds).map_err(unreachable)?;
                s3::probe_store(s3spec, &store, &creds).map_err(unreachable)?;
                store
            }
        };
        let local = match &spec.kind {
            TargetKind::Local(dir) => Some(dir.clone()),
            TargetKind::S3(_) => None,
        };
        Ok(ArchiveStore {
            url: url.to_string(),
            store,
            local,
        })
    }

    /// Every object of the archive, and in a local directory also the staging files of
    /// unfinished uploads (`<key>#<n>`, which `object_store`'s listing hides): what an
    /// agent's sweep looks at. (An S3 archive's incomplete multipart uploads are not listed:
    /// `object_store` has no call for them; a bucket lifecycle rule expires them.)
    pub async fn list(&self) -> Result<Vec<ArchiveEntry>> {
        if let Some(dir) = &self.local {
            let mut out = Vec::new();
            walk_local(dir, "", &mut out)?;
            return Ok(out);
        }
        use futures::StreamExt;
        let mut list = self.store.list(None);
        let mut out = Vec::new();
        while let Some(m) = list.next().await {
            let m = m?;
            out.push(ArchiveEntry {
                key: m.location.to_string(),
                size: m.size,
                staged: false,
            });
        }
        Ok(out)
    }

    /// The objects of the archive whose keys start with the directory `prefix` (`""`: all),
    /// with their size and modification time, in key order: what `tierfs hsm import` makes
    /// released files of. The archive's own probe objects are left out.
    pub async fn list_objects(&self, prefix: &str) -> Result<Vec<ArchivedObject>> {
        use futures::StreamExt;
        let prefix = prefix.trim_matches('/');
        let p = if prefix.is_empty() {
            None
        } else {
            Some(Self::path(prefix)?)
        };
        let mut list = self.store.list(p.as_ref());
        let mut out = Vec::new();
        while let Some(m) = list.next().await {
            let m = m?;
            let key = m.location.to_string();
            if key.starts_with(".tierfs-probe") {
                continue;
            }
            out.push(ArchivedObject {
                key,
                size: m.size,
                mtime_ns: m
                    .last_modified
                    .timestamp_nanos_opt()
                    .unwrap_or(m.last_modified.timestamp() * 1_000_000_000),
            });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Removes an entry [`ArchiveStore::list`] found (a staging file too); one already gone
    /// is not an error.
    pub async fn remove_listed(&self, e: &ArchiveEntry) -> Result<()> {
        match (&self.local, e.staged) {
            (Some(dir), true) => match std::fs::remove_file(dir.join(&e.key)) {
                Ok(()) => Ok(()),
                Err(x) if x.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(x) => Err(StoreError::Io(format!(
                    "{}: {x}",
                    dir.join(&e.key).display()
                ))),
            },
            _ => self.delete(&e.key).await,
        }
    }

    fn path(key: &str) -> Result<Path> {
        Path::parse(key).map_err(|e| StoreError::BadUrl(format!("archive key '{key}': {e}")))
    }

    /// Starts writing a copy at `key`; nothing is visible at `key` before
    /// [`ArchiveWriter::finish`].
    pub async fn writer(&self, key: &str) -> Result<ArchiveWriter> {
        let path = Self::path(key)?;
        let upload = self.store.put_multipart(&path).await?;
        Ok(ArchiveWriter {
            upload,
            buf: Vec::with_capacity(ARCHIVE_PART),
            parts: 0,
            inflight: tokio::task::JoinSet::new(),
        })
    }

    /// Reads `[start, end)` of the copy at `key`.
    pub async fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes> {
        if start >= end {
            return Ok(Bytes::new());
        }
        s3::get_range(self.store.as_ref(), &Self::path(key)?, start, end).await
    }

    /// The size of the copy at `key` (`NotFound` when there is none).
    pub async fn size(&self, key: &str) -> Result<u64> {
        Ok(self.store.head(&Self::path(key)?).await?.size)
    }

    /// Deletes the copy at `key`; a copy already gone is not an error.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&Self::path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Whether a file name is a staging file of `object_store`'s local uploads (`<name>#<digits>`).
pub fn is_staging_name(name: &str) -> bool {
    matches!(name.rsplit_once('#'), Some((_, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn walk_local(dir: &std::path::Path, rel: &str, out: &mut Vec<ArchiveEntry>) -> Result<()> {
    let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", dir.display()));
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // Removed meanwhile (object_store drops empty directories).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    for f in entries {
        let f = f.map_err(io)?;
        let Ok(name) = f.file_name().into_string() else {
            continue; // not a key object_store could have written
        };
        let key = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let md = match f.metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        };
        if md.is_dir() {
            walk_local(&f.path(), &key, out)?;
        } else if md.is_file() {
            out.push(ArchiveEntry {
                staged: is_staging_name(&name),
                key,
                size: md.len(),
            });
        }
    }
    Ok(())
}

/// A copy being written ([`ArchiveStore::writer`]). Dropping it without
/// [`ArchiveWriter::finish`] leaves nothing at the key (call [`ArchiveWriter::abort`] to
/// free the parts uploaded so far at once).
pub struct ArchiveWriter {
    upload: Box<dyn MultipartUpload>,
    buf: Vec<u8>,
    parts: usize,
    /// Parts being uploaded: at most [`PARTS_IN_FLIGHT`], so the caller reads the next part
    /// while the archive writes the previous ones (a local directory: its writes go on the
    /// runtime's blocking threads; S3: concurrent UploadPart requests).
    inflight: tokio::task::JoinSet<std::result::Result<(), object_store::Error>>,
}

/// Parts of one copy uploaded at once ([`ArchiveWriter`]): 2 keep the writes going while the
/// mover reads; more hold more memory (8 MiB each) for no gain on a local disk.
pub const PARTS_IN_FLIGHT: usize = 2;

impl ArchiveWriter {
    /// Appends `data`; a part is uploaded each time [`ARCHIVE_PART`] bytes gathered.
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let n = (ARCHIVE_PART - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == ARCHIVE_PART {
                self.flush_part().await?;
            }
        }
        Ok(())
    }

    /// Starts the upload of the gathered part, after waiting for room among the parts in
    /// flight (the first error of an earlier part is returned here).
    async fn flush_part(&mut self) -> Result<()> {
        while self.inflight.len() >= PARTS_IN_FLIGHT {
            self.join_one().await?;
        }
        let part = std::mem::replace(&mut self.buf, Vec::with_capacity(ARCHIVE_PART));
        self.inflight
            .spawn(self.upload.put_part(Bytes::from(part).into()));
        self.parts += 1;
        Ok(())
    }

    /// Waits for one part in flight to end, with its error if it failed.
    async fn join_one(&mut self) -> Result<()> {
        match self.inflight.join_next().await {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e.into()),
            Some(Err(e)) => Err(StoreError::Io(format!("archive part upload: {e}"))),
        }
    }

    /// Uploads the rest, waits for every part, and makes the copy visible at its key.
    pub async fn finish(mut self) -> Result<()> {
        if !self.buf.is_empty() || self.parts == 0 {
            self.flush_part().await?;
        }
        while !self.inflight.is_empty() {
            self.join_one().await?;
        }
        self.upload.complete().await?;
        Ok(())
    }

    /// Gives the upload up: parts in flight are stopped, the uploaded ones freed.
    pub async fn abort(mut self) {
        self.inflight.abort_all();
        while self.inflight.join_next().await.is_some() {}
        let _ = self.upload.abort().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn local_archive_round_trip_and_atomic_visibility() {
        let dir = tempfile::tempdir().unwrap();
        let a = ArchiveStore::open(&format!("file://{}", dir.path().display())).unwrap();
        let data: Vec<u8> = (0..(ARCHIVE_PART * 2 + 12345))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        rt().block_on(async {
            let mut w = a.writer("x/copy1").await.unwrap();
            w.write(&data[..100]).await.unwrap();
            w.write(&data[100..]).await.unwrap();
            // nothing visible before finish
            assert!(matches!(
                a.size("x/copy1").await,
                Err(StoreError::NotFound(_))
            ));
            w.finish().await.unwrap();
            assert_eq!(a.size("x/copy1").await.unwrap(), data.len() as u64);
            let got = a.get_range("x/copy1", 0, data.len() as u64).await.unwrap();
            assert_eq!(&got[..], &data[..]);
            let mid = a.get_range("x/copy1", 5, 50_000).await.unwrap();
            assert_eq!(&mid[..], &data[5..50_000]);
            // an aborted copy leaves nothing
            let mut w = a.writer("x/copy2").await.unwrap();
            w.write(&data).await.unwrap();
            w.abort().await;
            assert!(matches!(
                a.size("x/copy2").await,
                Err(StoreError::NotFound(_))
            ));
            // empty copy
            a.writer("x/empty").await.unwrap().finish().await.unwrap();
            assert_eq!(a.size("x/empty").await.unwrap(), 0);
            a.delete("x/copy1").await.unwrap();
            a.delete("x/copy1").await.unwrap();
            assert!(matches!(
                a.size("x/copy1").await,
                Err(StoreError::NotFound(_))
            ));
        });
    }

    /// Parts uploaded while the next ones are gathered (PARTS_IN_FLIGHT) land in their
    /// order, on a runtime whose threads run them at once.
    #[test]
    fn parts_in_flight_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = ArchiveStore::open(&format!("file://{}", dir.path().display())).unwrap();
        let data: Vec<u8> = (0..(ARCHIVE_PART * 5 + 777))
            .map(|i| (i * 13 % 253) as u8)
            .collect();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut w = a.writer("y/copy").await.unwrap();
            // writes of odd sizes, so parts are cut inside writes
            for piece in data.chunks(3 << 20 | 4321) {
                w.write(piece).await.unwrap();
            }
            w.finish().await.unwrap();
            let got = a.get_range("y/copy", 0, data.len() as u64).await.unwrap();
            assert!(
                got[..] == data[..],
                "the copy differs from what was written"
            );
        });
    }

    #[test]
    fn listing_shows_copies_and_staging_files_and_removes_both() {
        let dir = tempfile::tempdir().unwrap();
        let a = ArchiveStore::open(&format!("file://{}", dir.path().display())).unwrap();
        rt().block_on(async {
            let mut w = a.writer("00/v1.r2").await.unwrap();
            w.write(b"done").await.unwrap();
            w.finish().await.unwrap();
            // an upload under way (a killed mover's) leaves a staging file
            let mut w = a.writer("00/v1.r3").await.unwrap();
            w.write(&vec![7u8; ARCHIVE_PART + 1]).await.unwrap();
            let mut l = a.list().await.unwrap();
            l.retain(|e| !e.key.starts_with(".tierfs-probe"));
            l.sort_by(|x, y| x.key.cmp(&y.key));
            assert_eq!(l.len(), 2, "{l:?}");
            assert_eq!(
                (l[0].key.as_str(), l[0].size, l[0].staged),
                ("00/v1.r2", 4, false)
            );
            assert!(l[1].key.starts_with("00/v1.r3#") && l[1].staged, "{l:?}");
            for e in &l {
                a.remove_listed(e).await.unwrap();
                a.remove_listed(e).await.unwrap();
            }
            let mut l = a.list().await.unwrap();
            l.retain(|e| !e.key.starts_with(".tierfs-probe"));
            assert!(l.is_empty(), "{l:?}");
            drop(w);
        });
        assert!(is_staging_name("a#12") && !is_staging_name("a#") && !is_staging_name("a#x1"));
    }

    #[test]
    fn unreachable_archive_is_one_clear_error() {
        let e = ArchiveStore::open("file:///nonexistent/tierfs-archive-xyz").unwrap_err();
        assert!(matches!(e, StoreError::ArchiveUnreachable(..)), "{e}");
        assert!(
            e.to_string()
                .contains("file:///nonexistent/tierfs-archive-xyz"),
            "{e}"
        );
        assert!(matches!(
            ArchiveStore::open("ftp://x").unwrap_err(),
            StoreError::BadUrl(_)
        ));
        assert!(matches!(
            ArchiveStore::open("file:///tmp?capacity=1G").unwrap_err(),
            StoreError::BadUrl(_)
        ));
    }

    #[test]
    fn checksum_format() {
        assert_eq!(checksum_string(0xdead), "crc32:0000dead");
    }
}
