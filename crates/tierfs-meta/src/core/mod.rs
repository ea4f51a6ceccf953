//! The metadata core: every metadata operation written once, over the SQL layer
//! ([`crate::sql`]), for every engine. [`SqlMeta<D>`] implements the domain traits of
//! [`crate::engine`] on top of a [`Driver`] (SQLite or PostgreSQL), which keeps only what is
//! the engine's own: connections, transactions and their retry classification, durability,
//! housekeeping and notifications.
//!
//! Transition: the domains not ported yet delegate to the engine's [`LegacyEngine`] methods;
//! each domain's module replaces its delegating impl with core code.

use crate::engine::{
    Admin, Changelog, Channel, FileData, LegacyEngine, Listener, Locks, Namespace, Pcc, Sessions,
    Workers,
};
use crate::error::Result;
use crate::sql::Driver;
use crate::types::*;

/// The metadata engine: the shared core over driver `D`.
pub struct SqlMeta<D: Driver> {
    d: D,
}

impl<D: Driver> SqlMeta<D> {
    pub fn new(driver: D) -> SqlMeta<D> {
        SqlMeta { d: driver }
    }

    /// The engine's driver (its own settings and tools: a path, a URL, the pool).
    pub fn driver(&self) -> &D {
        &self.d
    }

    /// The engine's driver, mutably (tests tune it).
    pub fn driver_mut(&mut self) -> &mut D {
        &mut self.d
    }
}

impl<D: Driver> Changelog for SqlMeta<D> {}

impl<D: Driver> Workers for SqlMeta<D> {}

impl<D: Driver + LegacyEngine> Namespace for SqlMeta<D> {
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        LegacyEngine::lookup(&self.d, parent, name)
    }
    fn getattr(&self, ino: Ino) -> Result<Attr> {
        LegacyEngine::getattr(&self.d, ino)
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
        LegacyEngine::readlink(&self.d, ino)
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

impl<D: Driver + LegacyEngine> Pcc for SqlMeta<D> {
    fn pcc_lease(&self, ino: Ino) -> Result<Option<PccLease>> {
        LegacyEngine::pcc_lease(&self.d, ino)
    }
    fn pcc_acquire(&self, ino: Ino, client: &str) -> Result<PccLease> {
        LegacyEngine::pcc_acquire(&self.d, ino, client)
    }
    fn pcc_report(
        &self,
        ino: Ino,
        client: &str,
        dirty: bool,
        size: u64,
        mtime: Nanos,
    ) -> Result<Attr> {
        LegacyEngine::pcc_report(&self.d, ino, client, dirty, size, mtime)
    }
    fn pcc_release(&self, ino: Ino, client: &str) -> Result<()> {
        LegacyEngine::pcc_release(&self.d, ino, client)
    }
    fn pcc_request_revoke(&self, ino: Ino, requester: &str) -> Result<()> {
        LegacyEngine::pcc_request_revoke(&self.d, ino, requester)
    }
    fn pcc_revokes_for(&self, client: &str) -> Result<Vec<Ino>> {
        LegacyEngine::pcc_revokes_for(&self.d, client)
    }
    fn pcc_leases_of(&self, client: &str) -> Result<Vec<PccLease>> {
        LegacyEngine::pcc_leases_of(&self.d, client)
    }
    fn pcc_rule_add(
        &self,
        mode: &str,
        client: Option<&str>,
        rule: &str,
        quota: Option<u64>,
    ) -> Result<u64> {
        LegacyEngine::pcc_rule_add(&self.d, mode, client, rule, quota)
    }
    fn pcc_rule_set_quota(&self, id: u64, quota: Option<u64>) -> Result<()> {
        LegacyEngine::pcc_rule_set_quota(&self.d, id, quota)
    }
    fn pcc_rules(&self) -> Result<Vec<PccRuleRow>> {
        LegacyEngine::pcc_rules(&self.d)
    }
    fn pcc_rule_del(&self, id: u64) -> Result<()> {
        LegacyEngine::pcc_rule_del(&self.d, id)
    }
}

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
        LegacyEngine::sync(&self.d)
    }
    fn maintain(&self) -> Result<()> {
        LegacyEngine::maintain(&self.d)
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
        LegacyEngine::listen(&self.d, client, channels)
    }
}
