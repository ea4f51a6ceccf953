//! The sessions domain: client sessions and their open files.
//!
//! Not ported yet: delegates to the engine's [`LegacyEngine`] methods.

use super::SqlMeta;
use crate::engine::{LegacyEngine, Sessions};
use crate::error::Result;
use crate::sql::Driver;
use crate::types::*;

impl<D: Driver + LegacyEngine> Sessions for SqlMeta<D> {
    fn register_session(&self, s: &SessionInfo) -> Result<u64> {
        LegacyEngine::register_session(&self.d, s)
    }
    fn register_session_unique(&self, s: &SessionInfo, timeout_ns: i64) -> Result<u64> {
        LegacyEngine::register_session_unique(&self.d, s, timeout_ns)
    }
    fn heartbeat(&self, session: u64) -> Result<()> {
        LegacyEngine::heartbeat(&self.d, session)
    }
    fn unregister_session(&self, session: u64) -> Result<()> {
        LegacyEngine::unregister_session(&self.d, session)
    }
    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        LegacyEngine::sessions(&self.d)
    }
    fn reap_sessions(&self, timeout_ns: i64) -> Result<usize> {
        LegacyEngine::reap_sessions(&self.d, timeout_ns)
    }
    fn open_file(&self, session: u64, ino: Ino) -> Result<()> {
        LegacyEngine::open_file(&self.d, session, ino)
    }
    fn close_files(&self, session: u64, inos: &[Ino]) -> Result<()> {
        LegacyEngine::close_files(&self.d, session, inos)
    }
    fn client_alive(&self, client: &str, timeout_ns: i64) -> Result<bool> {
        LegacyEngine::client_alive(&self.d, client, timeout_ns)
    }
}
