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

    pub fn release(&self, target: u32, len: u64) {
        let mut r = self.reserved.lock();
        if let Some(v) = r.get_mut(&target) {
            *v = v.saturating_sub(len);
        }
    }
}
