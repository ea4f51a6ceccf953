//! Stripe allocation: which targets a new file's stripes go to.
//!
//! As Lustre's allocator: round-robin while targets are balanced; once the fullest and the
//! emptiest differ by more than `imbalance_threshold` (Lustre's default 17%), targets are drawn
//! with probability proportional to their free space, so new data fills the emptier ones.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fill state of one target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetFill {
    pub id: u32,
    pub used: u64,
    pub capacity: u64,
}

impl TargetFill {
    fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.used)
    }
    fn fraction(&self) -> f64 {
        if self.capacity == 0 {
            0.0
        } else {
            self.used as f64 / self.capacity as f64
        }
    }
}

#[derive(Debug)]
pub struct Allocator {
    next: AtomicU64,
    rng: AtomicU64,
    pub imbalance_threshold: f64,
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator::new(0.17)
    }
}

impl Allocator {
    pub fn new(imbalance_threshold: f64) -> Allocator {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        Allocator {
            next: AtomicU64::new(seed % 1024),
            rng: AtomicU64::new(seed),
            imbalance_threshold,
        }
    }

    fn random(&self) -> u64 {
        // xorshift64*: plenty for spreading stripes.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Whether the targets are balanced enough for round-robin.
    pub fn balanced(&self, fills: &[TargetFill]) -> bool {
        let fr: Vec<f64> = fills.iter().map(|f| f.fraction()).collect();
        let max = fr.iter().cloned().fold(0.0, f64::max);
        let min = fr.iter().cloned().fold(1.0, f64::min);
        fills.len() < 2 || max - min <= self.imbalance_threshold
    }

    /// Chooses `count` distinct targets (fewer if there are fewer targets).
    pub fn choose(&self, fills: &[TargetFill], count: u32) -> Vec<u32> {
        let n = fills.len();
        let count = (count as usize).clamp(1, n.max(1));
        if n == 0 {
            return vec![0];
        }
        if self.balanced(fills) {
            let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
            return (0..count).map(|i| fills[(start + i) % n].id).collect();
        }
        let mut pool: Vec<TargetFill> = fills.to_vec();
        let mut out = Vec::with_capacity(count);
        while out.len() < count && !pool.is_empty() {
            let total: u64 = pool.iter().map(|f| f.free().max(1)).sum();
            let mut pick = self.random() % total;
            let mut idx = 0;
            for (i, f) in pool.iter().enumerate() {
                let w = f.free().max(1);
                if pick < w {
                    idx = i;
                    break;
                }
                pick -= w;
            }
            out.push(pool.remove(idx).id);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(id: u32, used: u64) -> TargetFill {
        TargetFill {
            id,
            used,
            capacity: 1000,
        }
    }

    #[test]
    fn round_robin_while_balanced() {
        let a = Allocator::new(0.17);
        let fills = [fill(0, 100), fill(1, 150), fill(2, 120)];
        assert!(a.balanced(&fills));
        let mut counts = [0; 3];
        for _ in 0..300 {
            counts[a.choose(&fills, 1)[0] as usize] += 1;
        }
        assert_eq!(counts, [100, 100, 100]);
        let two = a.choose(&fills, 2);
        assert_eq!(two.len(), 2);
        assert_ne!(two[0], two[1]);
        assert_eq!(a.choose(&fills, 9).len(), 3);
    }

    #[test]
    fn weighted_by_free_space_when_unbalanced() {
        let a = Allocator::new(0.17);
        let fills = [fill(0, 900), fill(1, 0)];
        assert!(!a.balanced(&fills));
        let mut counts = [0u32; 2];
        for _ in 0..2000 {
            counts[a.choose(&fills, 1)[0] as usize] += 1;
        }
        // Free space 100 vs 1000: the empty target gets about 10/11 of new files.
        assert!(counts[1] > counts[0] * 5, "{counts:?}");
        assert!(
            counts[0] > 0,
            "the fuller target is still used now and then: {counts:?}"
        );
    }
}
