//! A quick loop over the engine API: how many commits (and opens/closes) per second an engine
//! takes, for before/after comparisons of the metadata core. Not a benchmark of tierfs (no
//! FUSE, no objects): only the metadata transactions.
//!
//! ```text
//! cargo run --release -p tierfs-meta --example meta_ops -- URL OP COUNT
//! ```
//! URL: `sqlite:///tmp/x.db` or `postgres://...` (formatted anew, with --force); OP: `commit`
//! (one 4 KiB object slice per commit, into a new chunk of one of 64 files, so that no chunk
//! piles up slices: the cost of one commit, not of the slice lists compaction would keep
//! short), `smallfile` (create, commit one inline slice, as a small file's write path),
//! `openclose` (open_file + close_files of one file). Prints the operations per second. Run with COUNT=0 and COUNT=N to count a PostgreSQL server's
//! statements per operation from its log (`log_statement = all`).

use std::time::Instant;

use tierfs_meta::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: meta_ops URL commit|smallfile|openclose COUNT");
        std::process::exit(2);
    }
    let (url, op, n): (&str, &str, u64) = (&args[1], &args[2], args[3].parse().expect("COUNT"));
    let params = FormatParams {
        name: "meta_ops".into(),
        targets: vec![("file:///tmp/meta-ops-ost0".into(), 0)],
        stripe_count: 1,
        stripe_size: 1 << 20,
        inline_threshold: 64 << 10,
        force: true,
    };
    let e = format_engine(url, &params).expect("format");
    let node = NewNode {
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    };
    let layout = Layout {
        stripe_size: 1 << 20,
        targets: vec![0],
    };
    let f = e
        .create(ROOT_INO, b"f", &node, Some(layout.clone()), None)
        .expect("create");
    let files: Vec<Ino> = (0..64)
        .map(|i| {
            e.create(
                ROOT_INO,
                format!("c{i}").as_bytes(),
                &node,
                Some(layout.clone()),
                None,
            )
            .expect("create")
            .ino
        })
        .collect();
    let session = e
        .register_session(&SessionInfo {
            id: 0,
            client_name: "meta_ops".into(),
            host: "localhost".into(),
            pid: std::process::id(),
            mountpoint: "/mnt".into(),
            version: "x".into(),
            started: 0,
            heartbeat: 0,
        })
        .expect("session");
    let first_obj = e.alloc_object_ids(n.max(1)).expect("ids");
    eprintln!("ready");
    let t = Instant::now();
    for i in 0..n {
        match op {
            "commit" => {
                let chunk = i / 64;
                let s = Slice {
                    seq: 0,
                    chunk,
                    off: 0,
                    len: 4096,
                    data: SliceData::Object {
                        target: 0,
                        obj: first_obj + i,
                        obj_off: 0,
                        obj_size: 4096,
                    },
                };
                e.commit_slices(
                    files[(i % 64) as usize],
                    &[s],
                    chunk * (1 << 20) + 4096,
                    i as i64,
                )
                .expect("commit");
            }
            "smallfile" => {
                let name = format!("s{i}");
                let a = e
                    .create(ROOT_INO, name.as_bytes(), &node, Some(layout.clone()), None)
                    .expect("create");
                let s = Slice {
                    seq: 0,
                    chunk: 0,
                    off: 0,
                    len: 100,
                    data: SliceData::Inline(vec![7; 100]),
                };
                e.commit_slices(a.ino, &[s], 100, i as i64).expect("commit");
            }
            "openclose" => {
                e.open_file(session, f.ino).expect("open");
                e.close_files(session, &[f.ino]).expect("close");
            }
            other => panic!("unknown op {other}"),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{op}: {n} in {secs:.2} s = {:.0}/s",
        n as f64 / secs.max(1e-9)
    );
}
