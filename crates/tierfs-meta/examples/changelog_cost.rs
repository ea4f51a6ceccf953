//! What the changelog costs: small-file creates per second (create + one inline slice +
//! close, the metadata transactions of `echo x > f` through a mount) with no changelog reader
//! and with one reader registered (default mask: CREAT, MTIME and CLOSE are recorded), in one
//! run on one filesystem, rounds alternating so that drift (the database growing, the disk
//! cache warming) falls on both sides alike. Only the metadata engine: no FUSE, no objects.
//!
//! ```text
//! cargo run --release -p tierfs-meta --example changelog_cost -- URL [FILES_PER_ROUND] [ROUNDS]
//! ```
//! URL: `sqlite:///tmp/x.db` or `postgres://...` (formatted anew, with --force). Defaults:
//! 2000 files per round, 6 rounds of each kind. Prints each round and the medians.

use std::time::{Duration, Instant};

use tierfs_meta::changelog::Mask;
use tierfs_meta::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 2 {
        eprintln!("usage: changelog_cost URL [FILES_PER_ROUND] [ROUNDS]");
        std::process::exit(2);
    }
    let url = &args[1];
    let per: u64 = args
        .get(2)
        .map(|s| s.parse().expect("FILES"))
        .unwrap_or(2000);
    let rounds: u64 = args.get(3).map(|s| s.parse().expect("ROUNDS")).unwrap_or(6);
    let params = FormatParams {
        name: "changelog_cost".into(),
        targets: vec![("file:///tmp/changelog-cost-ost0".into(), 0)],
        stripe_count: 1,
        stripe_size: 1 << 20,
        inline_threshold: 64 << 10,
        force: true,
    };
    let e = format_engine(url, &params).expect("format");
    let session = e
        .register_session(&SessionInfo {
            id: 0,
            client_name: "bench".into(),
            host: "h".into(),
            pid: std::process::id(),
            mountpoint: "/bench".into(),
            version: "bench".into(),
            started: 0,
            heartbeat: 0,
        })
        .expect("session");
    let node = NewNode {
        kind: Kind::File,
        perm: 0o644,
        uid: 1000,
        gid: 1000,
        rdev: 0,
        symlink: None,
    };
    let layout = Layout {
        stripe_size: 1 << 20,
        targets: vec![0],
    };
    let mut n = 0u64;
    let mut round = |dir: Ino| -> f64 {
        let t = Instant::now();
        for _ in 0..per {
            n += 1;
            let name = format!("f{n}");
            let a = e
                .create(
                    dir,
                    name.as_bytes(),
                    &node,
                    Some(layout.clone()),
                    Some(session),
                )
                .expect("create");
            let slice = Slice {
                seq: 0,
                chunk: 0,
                off: 0,
                len: 6,
                data: SliceData::Inline(b"hello\n".to_vec()),
            };
            e.commit_slices(a.ino, &[slice], 6, now_nanos())
                .expect("commit");
            e.close_files(session, &[a.ino]).expect("close");
        }
        per as f64 / t.elapsed().as_secs_f64()
    };
    let mut none = Vec::new();
    let mut one = Vec::new();
    for r in 0..rounds {
        let d = e
            .create(
                ROOT_INO,
                format!("d{r}").as_bytes(),
                &NewNode {
                    kind: Kind::Dir,
                    perm: 0o755,
                    ..node.clone()
                },
                None,
                None,
            )
            .expect("mkdir");
        // Alternate which kind goes first.
        let order: [bool; 2] = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_reader in order {
            if with_reader {
                let id = e
                    .changelog_register(Mask::default_mask(), Duration::from_secs(3600))
                    .expect("register");
                let rate = round(d.ino);
                let st = e.changelog_status().expect("status");
                let held = match (st.first, st.last) {
                    (Some(f), Some(l)) => l - f + 1,
                    _ => 0,
                };
                e.changelog_deregister(id).expect("deregister");
                println!("round {r}: one reader  {rate:>9.0} creates/s ({held} records)");
                one.push(rate);
            } else {
                let rate = round(d.ino);
                println!("round {r}: no reader   {rate:>9.0} creates/s");
                none.push(rate);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut none), median(&mut one));
    println!(
        "median: no reader {a:.0} creates/s, one reader {b:.0} creates/s: {:+.1}%",
        (b / a - 1.0) * 100.0
    );
}
