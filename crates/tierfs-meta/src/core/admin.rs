//! The admin domain: info, usage, sync, maintain, dump/load, fsck/gc queries, notifications.
//!
//! Not ported yet: delegates to the engine's [`LegacyEngine`] methods.

use super::SqlMeta;
use crate::engine::{Admin, Channel, LegacyEngine, Listener, Namespace, ORPHAN_GRACE};
use crate::error::Result;
use crate::sql::Driver;
use crate::types::*;

impl<D: Driver + LegacyEngine> Admin for SqlMeta<D> {
    fn info(&self) -> Result<FsInfo> {
        LegacyEngine::info(&self.d)
    }
    fn targets(&self) -> Result<Vec<TargetInfo>> {
        LegacyEngine::targets(&self.d)
    }
    fn usage(&self) -> Result<Usage> {
        LegacyEngine::usage(&self.d)
    }
    fn sync(&self) -> Result<()> {
        self.d.sync()
    }
    fn maintain(&self) -> Result<()> {
        self.d.maintain()?;
        self.purge_orphans(now_nanos() - ORPHAN_GRACE.as_nanos() as Nanos)?;
        // Changelog readers idle past their idle time are deregistered by whichever client
        // notices first (one read when none is due).
        crate::engine::Changelog::changelog_expire(self)?;
        Ok(())
    }
    fn export_rows(&self, sink: &mut dyn FnMut(DumpRow) -> Result<()>) -> Result<()> {
        LegacyEngine::export_rows(&self.d, sink)
    }
    fn import_rows(&self, rows: &mut dyn Iterator<Item = Result<DumpRow>>) -> Result<u64> {
        LegacyEngine::import_rows(&self.d, rows)
    }
    fn object_refs(&self) -> Result<Vec<ObjectRef>> {
        LegacyEngine::object_refs(&self.d)
    }
    fn object_id_counter(&self) -> Result<u64> {
        LegacyEngine::object_id_counter(&self.d)
    }
    fn meta_issues(&self, timeout_ns: i64) -> Result<Vec<MetaIssue>> {
        LegacyEngine::meta_issues(&self.d, timeout_ns)
    }
    fn repair_issue(&self, issue: &MetaIssue, timeout_ns: i64) -> Result<bool> {
        LegacyEngine::repair_issue(&self.d, issue, timeout_ns)
    }
    fn listen(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        self.d.listen(client, channels)
    }
}
