//! The read cache: whole chunks, materialised once and shared by every reader (and by the
//! read-ahead tasks that fill them), keyed by (inode, data version, chunk) so a changed file
//! never serves old bytes. Least-recently-used chunks are dropped past the capacity.
//! A read that fails (a target briefly unreachable, an object gone) leaves the cache as soon
//! as it fails: readers waiting on it get the error, the next read tries again.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{FutureExt, Shared};
use parking_lot::Mutex;

use tierfs_store::StoreError;

use crate::error::{ClientError, Result};

pub type Key = (u64, u64, u64);
type Fut = Pin<Box<dyn Future<Output = std::result::Result<Bytes, Arc<ClientError>>> + Send>>;

/// A chunk being read or already read.
#[derive(Clone)]
pub struct Cell(Shared<Fut>);

impl Cell {
    pub async fn get(&self) -> Result<Bytes> {
        self.0.clone().await.map_err(|e| match &*e {
            // kept apart: the data path re-reads the slice list when an object is missing
            ClientError::Store(StoreError::NotFound(o)) => {
                ClientError::Store(StoreError::NotFound(o.clone()))
            }
            _ => ClientError::Failed(e.to_string(), e.errno()),
        })
    }
}

/// key -> (cell, last use, id of the insertion).
type Entries = HashMap<Key, (Cell, u64, u64)>;

pub struct ChunkCache {
    cap: usize,
    /// (use counter, entries).
    inner: Arc<Mutex<(u64, Entries)>>,
}

impl ChunkCache {
    pub fn new(cap: usize) -> ChunkCache {
        ChunkCache {
            cap: cap.max(1),
            inner: Arc::new(Mutex::new((0, HashMap::new()))),
        }
    }

    /// How many chunks the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn get(&self, key: &Key) -> Option<Cell> {
        let mut g = self.inner.lock();
        g.0 += 1;
        let tick = g.0;
        let e = g.1.get_mut(key)?;
        e.1 = tick;
        Some(e.0.clone())
    }

    /// Returns the cell for `key`, creating it from `make` if absent.
    pub fn insert<F>(&self, key: Key, make: impl FnOnce() -> F) -> Cell
    where
        F: Future<Output = Result<Bytes>> + Send + 'static,
    {
        let mut g = self.inner.lock();
        g.0 += 1;
        let tick = g.0;
        if let Some(e) = g.1.get_mut(&key) {
            e.1 = tick;
            return e.0.clone();
        }
        let fut = make();
        // A failed read removes its own entry (and only its own: the key may have a newer one
        // by then), so an error is never served from the cache.
        let weak = Arc::downgrade(&self.inner);
        let id = tick;
        let boxed: Fut = Box::pin(async move {
            let r = fut.await.map_err(Arc::new);
            if r.is_err() {
                if let Some(inner) = weak.upgrade() {
                    let mut g = inner.lock();
                    if g.1.get(&key).map(|e| e.2) == Some(id) {
                        g.1.remove(&key);
                    }
                }
            }
            r
        });
        let cell = Cell(boxed.shared());
        g.1.insert(key, (cell.clone(), tick, id));
        while g.1.len() > self.cap {
            let oldest = g.1.iter().min_by_key(|(_, (_, t, _))| *t).map(|(k, _)| *k);
            match oldest {
                Some(k) => {
                    g.1.remove(&k);
                }
                None => break,
            }
        }
        cell
    }

    pub fn remove(&self, key: &Key) {
        self.inner.lock().1.remove(key);
    }

    /// Drops every chunk of `ino` (all data versions).
    pub fn remove_file(&self, ino: u64) {
        self.inner.lock().1.retain(|k, _| k.0 != ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shares_one_read_and_evicts_oldest() {
        let c = ChunkCache::new(2);
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..3 {
            let calls = Arc::clone(&calls);
            let cell = c.insert((1, 1, 0), move || async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(Bytes::from_static(b"abc"))
            });
            assert_eq!(&cell.get().await.unwrap()[..], b"abc");
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        c.insert((1, 1, 1), || async { Ok(Bytes::new()) });
        c.get(&(1, 1, 0));
        c.insert((1, 1, 2), || async { Ok(Bytes::new()) });
        assert!(c.get(&(1, 1, 0)).is_some(), "recently used stays");
        assert!(c.get(&(1, 1, 1)).is_none(), "least recently used goes");
    }

    #[tokio::test]
    async fn a_failed_read_is_not_kept() {
        let c = ChunkCache::new(8);
        let cell = c.insert((1, 1, 0), || async {
            Err(ClientError::Store(StoreError::Io(
                "target unreachable".into(),
            )))
        });
        assert!(cell.get().await.is_err());
        assert!(
            c.get(&(1, 1, 0)).is_none(),
            "the failed read left the cache"
        );
        // the next read tries again and succeeds
        let cell = c.insert((1, 1, 0), || async { Ok(Bytes::from_static(b"ok")) });
        assert_eq!(&cell.get().await.unwrap()[..], b"ok");
        // a missing object stays recognisable, for the data path's re-read of the slices
        let cell = c.insert((1, 1, 1), || async {
            Err(ClientError::Store(StoreError::NotFound("obj".into())))
        });
        assert!(matches!(
            cell.get().await,
            Err(ClientError::Store(StoreError::NotFound(_)))
        ));
    }
}
