//! Space accounting: how full each target is (from the metadata engine and the device), and
//! the bytes this client has buffered for it, so a full target gives ENOSPC at write time
//! instead of losing data at upload time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tierfs_meta::MetaEngine;
use tierfs_store::allocator::TargetFill;
use tierfs_store::{StoreError, TargetSet};

use crate::error::{ClientError, Result};

const REFRESH: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, Default)]
struct Fill {
    used: u64,
    capacity: u64,
    device_avail: u64,
    device_total: u64,
}

pub struct SpaceGuard {
    meta: Arc<dyn MetaEngine>,
    targets: Arc<TargetSet>,
    fills: Mutex<(Option<Instant>, HashMap<u32, Fill>)>,
    reserved: Mutex<HashMap<u32, u64>>,
}

impl SpaceGuard {
    pub fn new(meta: Arc<dyn MetaEngine>, targets: Arc<TargetSet>) -> SpaceGuard {
        SpaceGuard {
            meta,
            targets,
            fills: Mutex::new((None, HashMap::new())),
            reserved: Mutex::new(HashMap::new()),
        }
    }

    fn current(&self) -> HashMap<u32, Fill> {
        let mut g = self.fills.lock();
        let stale = g.0.map(|t| t.elapsed() > REFRESH).unwrap_or(true);
        if stale {
            if let Ok(list) = self.meta.targets() {
                let mut m = HashMap::new();
                for t in list {
                    let dev = self
                        .targets
                        .get(t.id)
                        .map(|x| x.device_space())
                        .unwrap_or_default();
                    m.insert(
                        t.id,
                        Fill {
                            used: t.used,
                            capacity: t.capacity,
                            device_avail: dev.avail,
                            device_total: dev.total,
                        },
                    );
                }
                *g = (Some(Instant::now()), m);
            }
        }
        g.1.clone()
    }

    /// Forces a refresh at the next check (after commits and deletions).
    pub fn invalidate(&self) {
        self.fills.lock().0 = None;
    }

    /// Fill levels for the allocator: a target's capacity is its `?capacity=` or its device.
    pub fn fills(&self) -> Vec<TargetFill> {
        let mut v: Vec<TargetFill> = self
            .current()
            .into_iter()
            .map(|(id, f)| {
                let capacity = if f.capacity > 0 {
                    f.capacity
                } else {
                    f.device_total
                };
                let used = if f.capacity > 0 {
                    f.used
                } else {
                    f.device_total.saturating_sub(f.device_avail)
                };
                TargetFill { id, used, capacity }
            })
            .collect();
        v.sort_by_key(|f| f.id);
        v
    }

    /// Reserves `len` bytes on `target` for a buffered write, or fails with ENOSPC.
    pub fn reserve(&self, target: u32, len: u64) -> Result<()> {
        let f = self.current().get(&target).copied().unwrap_or_default();
        let mut r = self.reserved.lock();
        let mine = r.entry(target).or_insert(0);
        if f.capacity > 0 && f.used + *mine + len > f.capacity {
            return Err(ClientError::Store(StoreError::NoSpace(target)));
        }
        if f.device_total > 0 && f.device_avail < *mine + len {
            return Err(ClientError::Store(StoreError::NoSpace(target)));
        }
        *mine += len;
        Ok(())
    }

    /// A reservation whose bytes are now committed: they leave this client's reservations and
    /// join the target's cached fill (used up, device space down), so the next check is as
    /// strict as a refresh would make it without asking the engine and the device after every
    /// commit of every small file. Conservative: inline bytes and overwritten ones count too,
    /// until the next refresh (every `REFRESH`) reads the true figures.
    pub fn committed(&self, target: u32, len: u64) {
        self.release(target, len);
        let mut g = self.fills.lock();
        if let Some(f) = g.1.get_mut(&target) {
            f.used = f.used.saturating_add(len);
            f.device_avail = f.device_avail.saturating_sub(len);
        }
    }

    pub fn release(&self, target: u32, len: u64) {
        let mut r = self.reserved.lock();
        if let Some(v) = r.get_mut(&target) {
            *v = v.saturating_sub(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_meta::{format_engine, FormatParams};

    /// Committed bytes count against a target at once, without a refresh from the engine
    /// (whose figures this test never changes, so a refresh would forget them).
    #[test]
    fn committed_bytes_count_until_the_next_refresh() {
        let dir = tempfile::tempdir().unwrap();
        let ost = dir.path().join("ost0");
        std::fs::create_dir_all(&ost).unwrap();
        let url = format!("file://{}", ost.display());
        let meta = format_engine(
            &format!("sqlite://{}", dir.path().join("meta.db").display()),
            &FormatParams {
                name: "space".into(),
                targets: vec![(url.clone(), 1 << 20)],
                stripe_count: 1,
                stripe_size: 1 << 20,
                inline_threshold: 0,
                force: false,
            },
        )
        .unwrap();
        let id = meta.targets().unwrap()[0].id;
        let targets = Arc::new(TargetSet::open(&[(id, url, 1 << 20)]).unwrap());
        let g = SpaceGuard::new(meta, targets);
        g.reserve(id, 600 << 10).unwrap();
        g.committed(id, 600 << 10);
        assert!(
            g.reserve(id, 600 << 10).is_err(),
            "1.2 MiB on a target of 1 MiB"
        );
        g.reserve(id, 400 << 10).unwrap();
        g.release(id, 400 << 10);
        // A refresh reads the engine's figures again (here: nothing committed there).
        g.invalidate();
        g.reserve(id, 600 << 10).unwrap();
    }
}
