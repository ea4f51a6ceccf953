//! Finding the filesystem behind a path: the mount's virtual `.tierfs-info` file names the
//! metadata URL, the client and its daemon.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tierfs_client::fs::INFO_NAME;
use tierfs_meta::{open_engine, MetaEngine};

use crate::error::{CliError, Result};

#[derive(Clone, Debug, Deserialize)]
pub struct MountInfo {
    pub meta: String,
    pub name: String,
    pub client: String,
    pub session: u64,
    pub mountpoint: String,
    pub pid: u32,
}

/// The root of the tierfs mount holding `path`, and what it says about itself.
pub fn mount_of(path: &Path) -> Result<(PathBuf, MountInfo)> {
    let shown = path.display().to_string();
    let abs = std::fs::canonicalize(path).map_err(|e| CliError::Io(shown.clone(), e))?;
    let mut dir = if abs.is_dir() {
        abs.clone()
    } else {
        abs.parent().unwrap_or(&abs).to_path_buf()
    };
    loop {
        let info = dir.join(INFO_NAME);
        if let Ok(text) = std::fs::read_to_string(&info) {
            // Only the mount root answers: make sure the device is the same as the path's.
            let root_dev = std::fs::metadata(&dir).map(|m| m.dev()).ok();
            let path_dev = std::fs::metadata(&abs).map(|m| m.dev()).ok();
            if root_dev == path_dev {
                let mi: MountInfo = serde_json::from_str(&text)
                    .map_err(|e| CliError::Other(format!("{}: {e}", info.display())))?;
                return Ok((dir, mi));
            }
        }
        match dir.parent() {
            Some(p) => dir = p.to_path_buf(),
            None => return Err(CliError::NotTierfs(shown)),
        }
    }
}

/// The metadata engine and inode number of a path in a tierfs mount.
pub fn engine_and_ino(path: &Path) -> Result<(Arc<dyn MetaEngine>, u64, MountInfo)> {
    let (_root, mi) = mount_of(path)?;
    let ino = std::fs::symlink_metadata(path)
        .map_err(|e| CliError::Io(path.display().to_string(), e))?
        .ino();
    Ok((open_engine(&mi.meta)?, ino, mi))
}

/// Every tierfs mount of this machine, from /proc/self/mountinfo.
pub fn all_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if let Some(sep) = f.iter().position(|x| *x == "-") {
            if f.get(sep + 1)
                .map(|t| t.contains("tierfs"))
                .unwrap_or(false)
            {
                out.push(PathBuf::from(f[4].replace("\\040", " ")));
            }
        }
    }
    out
}
