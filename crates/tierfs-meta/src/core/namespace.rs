//! The namespace domain: names, attributes, xattrs, layouts, projects, orphans.
//!
//! Being ported: what is not ported yet delegates to the engine's [`LegacyEngine`] methods.

use super::common::get_attr;
use super::SqlMeta;
use crate::engine::{LegacyEngine, Namespace};
use crate::error::{MetaError, Result};
use crate::sql::Driver;
use crate::types::*;
use crate::vals;

impl<D: Driver + LegacyEngine> Namespace for SqlMeta<D> {
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        LegacyEngine::lookup(&self.d, parent, name)
    }
    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.d.read(|tx| get_attr(tx, ino))
    }
    fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        LegacyEngine::setattr(&self.d, ino, set)
    }
    fn create(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        layout: Option<Layout>,
        open_by: Option<u64>,
    ) -> Result<Attr> {
        LegacyEngine::create(&self.d, parent, name, node, layout, open_by)
    }
    fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        LegacyEngine::link(&self.d, ino, new_parent, new_name)
    }
    fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        LegacyEngine::unlink(&self.d, parent, name)
    }
    fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        LegacyEngine::rmdir(&self.d, parent, name)
    }
    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        LegacyEngine::rename(&self.d, parent, name, new_parent, new_name, flags)
    }
    fn readdir(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<DirEntry>> {
        LegacyEngine::readdir(&self.d, ino, offset, limit)
    }
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.d.read(|tx| {
            let r = tx.one(
                "SELECT kind, symlink FROM inodes WHERE ino = $1",
                vals![ino],
            )?;
            if r.i64(0)? != Kind::Symlink as i64 {
                return Err(MetaError::Invalid("not a symlink".into()));
            }
            Ok(r.opt_blob(1)?.unwrap_or_default())
        })
    }
    fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        LegacyEngine::getxattr(&self.d, ino, name)
    }
    fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        LegacyEngine::setxattr(&self.d, ino, name, value, flags)
    }
    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        LegacyEngine::listxattr(&self.d, ino)
    }
    fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        LegacyEngine::removexattr(&self.d, ino, name)
    }
    fn resolve_stripe_default(&self, dir: Ino) -> Result<StripeDefault> {
        LegacyEngine::resolve_stripe_default(&self.d, dir)
    }
    fn set_dir_stripe(&self, dir: Ino, def: StripeDefault) -> Result<()> {
        LegacyEngine::set_dir_stripe(&self.d, dir, def)
    }
    fn set_file_layout(&self, ino: Ino, layout: &Layout) -> Result<()> {
        LegacyEngine::set_file_layout(&self.d, ino, layout)
    }
    fn set_projid(&self, ino: Ino, projid: u32, inherit: bool) -> Result<u64> {
        LegacyEngine::set_projid(&self.d, ino, projid, inherit)
    }
    fn get_projid(&self, ino: Ino) -> Result<(u32, bool)> {
        LegacyEngine::get_projid(&self.d, ino)
    }
    fn path_of(&self, ino: Ino) -> Result<Option<Vec<u8>>> {
        LegacyEngine::path_of(&self.d, ino)
    }
    fn purge_orphans(&self, replaced_before: Nanos) -> Result<u64> {
        LegacyEngine::purge_orphans(&self.d, replaced_before)
    }
}
