//! The PCC domain: RW-PCC leases and attach rules.
//!
//! Not ported yet: delegates to the engine's [`LegacyEngine`] methods.

use super::SqlMeta;
use crate::engine::{LegacyEngine, Pcc};
use crate::error::Result;
use crate::sql::Driver;
use crate::types::*;

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
