//! The advisory locks domain (POSIX and flock).
//!
//! Not ported yet: delegates to the engine's [`LegacyEngine`] methods.

use super::SqlMeta;
use crate::engine::{LegacyEngine, Locks};
use crate::error::Result;
use crate::sql::Driver;
use crate::types::*;

impl<D: Driver + LegacyEngine> Locks for SqlMeta<D> {
    fn set_lock(&self, ino: Ino, lock: &LockRange) -> Result<()> {
        LegacyEngine::set_lock(&self.d, ino, lock)
    }
    fn test_lock(&self, ino: Ino, lock: &LockRange) -> Result<Option<LockRange>> {
        LegacyEngine::test_lock(&self.d, ino, lock)
    }
    fn release_locks(&self, ino: Ino, session: u64, owner: u64, flock: bool) -> Result<()> {
        LegacyEngine::release_locks(&self.d, ino, session, owner, flock)
    }
}
