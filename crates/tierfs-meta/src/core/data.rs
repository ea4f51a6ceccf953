//! The file data domain: object ids, slices, fallocate, compaction, trash.
//!
//! Not ported yet: delegates to the engine's [`LegacyEngine`] methods.

use super::SqlMeta;
use crate::engine::{FileData, LegacyEngine};
use crate::error::Result;
use crate::sql::Driver;
use crate::types::*;

impl<D: Driver + LegacyEngine> FileData for SqlMeta<D> {
    fn alloc_object_ids(&self, n: u64) -> Result<u64> {
        LegacyEngine::alloc_object_ids(&self.d, n)
    }
    fn read_chunk(&self, ino: Ino, chunk: u64) -> Result<Vec<Slice>> {
        LegacyEngine::read_chunk(&self.d, ino, chunk)
    }
    fn commit_slices(
        &self,
        ino: Ino,
        slices: &[Slice],
        new_end: u64,
        mtime: Nanos,
    ) -> Result<Attr> {
        LegacyEngine::commit_slices(&self.d, ino, slices, new_end, mtime)
    }
    fn fallocate(&self, ino: Ino, off: u64, len: u64, keep_size: bool, zero: bool) -> Result<Attr> {
        LegacyEngine::fallocate(&self.d, ino, off, len, keep_size, zero)
    }
    fn replace_chunk(&self, ino: Ino, chunk: u64, upto: u64, merged: &[Slice]) -> Result<bool> {
        LegacyEngine::replace_chunk(&self.d, ino, chunk, upto, merged)
    }
    fn rewrite_data(&self, ino: Ino, slices: &[Slice], size: u64, mtime: Nanos) -> Result<Attr> {
        LegacyEngine::rewrite_data(&self.d, ino, slices, size, mtime)
    }
    fn trash(&self, limit: usize) -> Result<Vec<TrashItem>> {
        LegacyEngine::trash(&self.d, limit)
    }
    fn trash_done(&self, ids: &[u64]) -> Result<()> {
        LegacyEngine::trash_done(&self.d, ids)
    }
}
