//! Sequential reads through the read cache: chunks read ahead must not cost the capacity tier
//! more bytes than the file holds, whatever the cache's size.

use std::time::Duration;

use super::fixture::fixture_configured;
use super::DataConfig;

const MIB: usize = 1 << 20;

/// Bytes read from the targets so far, from the data path's metrics.
fn target_read_bytes(f: &super::fixture::Fixture) -> u64 {
    f.data
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("tierfs_target_read_bytes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A file read once from start to end in the kernel's 128 KiB pieces reads each chunk from the
/// targets once, with read-ahead on, for caches smaller than, equal to and larger than the
/// read-ahead window (a cache of one chunk read a 3 MiB file as 5-6 MiB: the chunk read ahead
/// pushed out the one being read, and both were read again).
#[test]
fn a_sequential_read_fetches_each_chunk_once_whatever_the_cache_size() {
    let len = 6 * MIB;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    for cache_chunks in [1, 2, 3, 8] {
        let f = fixture_configured(
            DataConfig {
                cache_chunks,
                readahead_chunks: 4,
                ..DataConfig::default()
            },
            |m| m,
        );
        f.data.write(f.ino, 0, &data).unwrap();
        f.data.flush(f.ino).unwrap();
        let before = target_read_bytes(&f);
        let piece = 128 << 10;
        for off in (0..len).step_by(piece) {
            let got = f.data.read(f.ino, off as u64, piece as u32, true).unwrap();
            assert!(
                got == data[off..off + piece],
                "cache of {cache_chunks}: bytes at {off} differ"
            );
        }
        // Read-ahead runs in the background: give a late one time to land.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            target_read_bytes(&f) - before,
            len as u64,
            "cache of {cache_chunks} chunks: bytes read from the targets for a {len}-byte file"
        );
        f.finish();
    }
}

/// A file purged while this client still knows its attributes (a read-only open whose record
/// reached the engine too late: docs/semantics.md): its reads fail, they do not return the
/// file's size in zeros (an empty slice list is a hole only while the file exists).
#[test]
fn a_read_of_a_purged_file_fails_instead_of_returning_zeros() {
    let f = fixture_configured(DataConfig::default(), |m| m);
    let data = vec![7u8; 100_000];
    f.data.write(f.ino, 0, &data).unwrap();
    f.data.flush(f.ino).unwrap();
    f.data.meta.unlink(tierfs_meta::ROOT_INO, b"f").unwrap();
    let later = tierfs_meta::now_nanos() + 1;
    assert_eq!(f.data.meta.purge_unlinked(64, later).unwrap(), 1);
    for sequential in [true, false] {
        match f.data.read(f.ino, 0, 4096, sequential) {
            Err(e) => assert_eq!(e.errno(), libc::ENOENT, "sequential={sequential}: {e}"),
            Ok(got) => panic!(
                "sequential={sequential}: read {} bytes of a purged file (zeros: {})",
                got.len(),
                got.iter().all(|b| *b == 0)
            ),
        }
    }
    f.finish();
}
