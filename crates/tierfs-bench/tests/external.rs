//! The launch of the real IOR and mdtest under MPI: every rank sees its own client's directory
//! at one path, in a mount namespace of its own, and nothing stays mounted afterwards. Runs the
//! real `mpirun` (MPICH, installed by scripts/install-deps.sh) with `sh` as the benchmark.

mod common;

use std::path::Path;

use common::is_root;
use tierfs_bench::external::{find_mpi, mpirun, run_logged, Placement, Tool};

#[test]
fn each_mpi_rank_sees_its_clients_directory_at_one_path() {
    if !is_root() {
        eprintln!("skipped: needs root (bind mounts in a mount namespace)");
        return;
    }
    let mpi = find_mpi().expect("mpirun is not installed: scripts/install-deps.sh installs mpich");
    let w = common::workdir();
    let roots: Vec<_> = (0..2)
        .map(|k| w.path().join(format!("client{k}")))
        .collect();
    for (k, r) in roots.iter().enumerate() {
        std::fs::create_dir_all(r).unwrap();
        std::fs::write(r.join("who"), format!("client {k}\n")).unwrap();
    }
    let at = w.path().join("at");
    std::fs::create_dir_all(&at).unwrap();
    let place = Placement {
        roots: roots.clone(),
        tasks_per_client: 2,
        at: at.clone(),
    };
    // Each rank prints its rank and what it finds at the common path.
    let sh = Tool {
        path: "/bin/sh".into(),
        version: "sh".into(),
        mpi: Some(mpi),
    };
    let script = format!(
        "echo \"rank $PMI_RANK: $(cat '{}')\"",
        at.join("who").display()
    );
    let mut cmd = mpirun(&sh, 4, &place, &["-c".into(), script], &[]).unwrap();
    let out = run_logged(&mut cmd, "mpirun sh", &w.path().join("log"), &[]).unwrap();
    let mut lines: Vec<&str> = out.lines().filter(|l| l.starts_with("rank")).collect();
    lines.sort();
    // Ranks are placed per client, as mpirun places them per node: 0 and 1 on client 0.
    assert_eq!(
        lines,
        [
            "rank 0: client 0",
            "rank 1: client 0",
            "rank 2: client 1",
            "rank 3: client 1"
        ],
        "{out}"
    );
    // The binds lived in the ranks' namespaces only.
    assert!(std::fs::read_dir(&at).unwrap().next().is_none());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&*at.to_string_lossy()),
        "a bind on {} stayed",
        at.display()
    );
    // A rank placed on no client is refused, and the failure names it.
    let short = Placement {
        roots: vec![roots[0].clone(), roots[1].clone()],
        tasks_per_client: 1,
        at: at.clone(),
    };
    let mut cmd = mpirun(&sh, 3, &short, &["-c".into(), "true".into()], &[]).unwrap();
    let e = run_logged(&mut cmd, "mpirun sh", &w.path().join("log2"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank on no client"), "{e}");
    assert!(Path::new(&w.path().join("log2")).exists());
}
