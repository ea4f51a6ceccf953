//! Raw metadata-engine rates, without FUSE: `cargo run --release --example engine_rates -- DIR N`
//! (SQLite in DIR/m.db), or `-- postgres://user@host/db N` (PostgreSQL; the database must exist
//! and is formatted anew). Tells how much of a create/stat/unlink through a mount is the engine
//! itself. Times are this process's CPU time (user + system), not wall time: on a busy machine
//! they still tell what each operation costs.

use tierfs_meta::postgres::PgMeta;
use tierfs_meta::sqlite::SqliteMeta;
use tierfs_meta::{
    FormatParams, Kind, Layout, MetaEngine, NewNode, SetAttr, Slice, SliceData, ROOT_INO,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let place = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("/tmp/engine-rates");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let p = FormatParams {
        name: "rates".into(),
        targets: vec![("file:///tmp/x".into(), 0)],
        stripe_count: 1,
        stripe_size: 1 << 20,
        inline_threshold: 65536,
        force: true,
    };
    let e: Box<dyn MetaEngine> =
        if place.starts_with("postgres://") || place.starts_with("postgresql://") {
            Box::new(PgMeta::format(place, &p).expect("format"))
        } else {
            let dir = std::path::PathBuf::from(place);
            std::fs::create_dir_all(&dir).expect("create dir");
            Box::new(SqliteMeta::format(&dir.join("m.db"), &p).expect("format"))
        };
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
    let t = cpu();
    for i in 0..n {
        e.create(
            ROOT_INO,
            format!("f{i}").as_bytes(),
            &node,
            Some(layout.clone()),
            None,
        )
        .expect("create");
    }
    let c = cpu() - t;
    let t = cpu();
    let mut inos = Vec::with_capacity(n);
    for i in 0..n {
        let a = e
            .lookup(ROOT_INO, format!("f{i}").as_bytes())
            .expect("lookup");
        inos.push(a.ino);
    }
    let l = cpu() - t;
    // The commit at close of a small file: its bytes inline in the database.
    let data = vec![0x5au8; 32 << 10];
    let t = cpu();
    for &ino in &inos {
        let s = Slice {
            seq: 0,
            chunk: 0,
            off: 0,
            len: data.len() as u64,
            data: SliceData::Inline(data.clone()),
        };
        e.commit_slices(ino, &[s], data.len() as u64, 1)
            .expect("commit");
    }
    let w = cpu() - t;
    let t = cpu();
    for &ino in &inos {
        e.getattr(ino).expect("getattr");
    }
    let g = cpu() - t;
    // tar's fchown to the owner it already has
    let chown = SetAttr {
        uid: Some(0),
        gid: Some(0),
        ..SetAttr::default()
    };
    let t = cpu();
    for &ino in &inos {
        e.setattr(ino, &chown).expect("setattr");
    }
    let sa = cpu() - t;
    // Each phase starts from a checkpointed log, as the daemon's `maintenance` worker keeps
    // it (every second): without, the later phases look pages up in a longer log.
    e.maintain().expect("checkpoint");
    let t = cpu();
    for i in 0..n {
        e.unlink(ROOT_INO, format!("f{i}").as_bytes())
            .expect("unlink");
    }
    let u = cpu() - t;
    // What the unlinks left for the purge (the daemon's `purge` worker: batches of 64).
    e.maintain().expect("checkpoint");
    let t = cpu();
    let mut purged = 0;
    loop {
        let k = e
            .purge_unlinked(64, tierfs_meta::now_nanos() + 1)
            .expect("purge");
        purged += k;
        if k < 64 {
            break;
        }
    }
    let p = cpu() - t;
    let us = |x: f64| x * 1e6 / n as f64;
    println!(
        "engine: commit of 32 KiB inline {:.1} us, getattr {:.1} us, setattr (chown) {:.1} us",
        us(w),
        us(g),
        us(sa)
    );
    println!(
        "engine: create {:.0}/s ({:.1} us), lookup {:.0}/s ({:.1} us), unlink {:.0}/s ({:.1} us)",
        n as f64 / c,
        c * 1e6 / n as f64,
        n as f64 / l,
        l * 1e6 / n as f64,
        n as f64 / u,
        u * 1e6 / n as f64
    );
    println!(
        "engine: purge of the unlinked files {:.1} us per file ({purged} freed), unlink + purge {:.1} us",
        us(p),
        us(u + p)
    );
}

/// CPU time (user + system) this process has used so far, in seconds.
fn cpu() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
