//! Small helpers: sizes, durations, Ctrl-C, child processes, file I/O loops.

use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::BenchError;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM set a flag that every workload loop checks, so the harness stops at the
/// next operation and still unmounts and removes everything it made.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

pub fn check_interrupt() -> Result<(), BenchError> {
    if interrupted() {
        Err(BenchError::Interrupted)
    } else {
        Ok(())
    }
}

/// Parses a size: a number with an optional k/m/g/t suffix (powers of 1024), e.g. 1m, 47008.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let lower = lower.strip_suffix("ib").unwrap_or(&lower);
    let lower = lower.strip_suffix('b').unwrap_or(lower);
    let (num, mult) = match lower.char_indices().last() {
        Some((i, 'k')) => (&lower[..i], 1u64 << 10),
        Some((i, 'm')) => (&lower[..i], 1 << 20),
        Some((i, 'g')) => (&lower[..i], 1 << 30),
        Some((i, 't')) => (&lower[..i], 1 << 40),
        _ => (lower, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size '{s}' (e.g. 4k, 1m, 256m, 47008)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

/// Parses a duration such as 30s, 2m, 500ms.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("invalid duration '{s}': {e}"))
}

/// Human size for labels: 1 MiB, 47008 B, 32 KiB.
pub fn fmt_size(n: u64) -> String {
    for (unit, m) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= m && n.is_multiple_of(m) {
            return format!("{} {unit}", n / m);
        }
    }
    format!("{n} B")
}

/// Runs a command to completion, killing it if the harness is interrupted.
pub fn run_command(cmd: &mut Command, what: &str) -> Result<Output, BenchError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().map_err(|e| {
        if e.kind() == ErrorKind::NotFound {
            BenchError::Missing(format!("{what}: not installed"))
        } else {
            BenchError::Command {
                command: what.to_string(),
                detail: e.to_string(),
            }
        }
    })?;
    wait_interruptible(child, what)
}

fn wait_interruptible(mut child: Child, what: &str) -> Result<Output, BenchError> {
    // Read the pipes on threads so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let ho = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = std::io::Read::read_to_end(o, &mut v);
        }
        v
    });
    let he = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = std::io::Read::read_to_end(e, &mut v);
        }
        v
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {
                if interrupted() {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(BenchError::Interrupted);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(BenchError::Command {
                    command: what.to_string(),
                    detail: e.to_string(),
                })
            }
        }
    };
    Ok(Output {
        status,
        stdout: ho.join().unwrap_or_default(),
        stderr: he.join().unwrap_or_default(),
    })
}

/// Like `run_command`, but a non-zero exit is an error carrying the last line of stderr.
pub fn run_checked(cmd: &mut Command, what: &str) -> Result<Output, BenchError> {
    let out = run_command(cmd, what)?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        return Err(BenchError::Command {
            command: what.to_string(),
            detail: format!("{} {last}", out.status),
        });
    }
    Ok(out)
}

/// Writes all of `buf` at `off`.
pub fn pwrite_all(f: &std::fs::File, buf: &[u8], off: u64, path: &Path) -> Result<(), BenchError> {
    f.write_all_at(buf, off)
        .map_err(|e| BenchError::io(format!("write {} at {off}", path.display()), e))
}

/// Reads exactly `buf.len()` bytes at `off`; fewer is a short read.
pub fn pread_exact(
    f: &std::fs::File,
    buf: &mut [u8],
    off: u64,
    path: &Path,
) -> Result<(), BenchError> {
    let mut done = 0usize;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                return Err(BenchError::ShortRead {
                    path: path.to_path_buf(),
                    offset: off,
                    wanted: buf.len(),
                    got: done,
                })
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(BenchError::io(
                    format!("read {} at {}", path.display(), off + done as u64),
                    e,
                ))
            }
        }
    }
    Ok(())
}

/// Checks that the file ends at `size` (a read there returns nothing).
pub fn expect_eof(f: &std::fs::File, size: u64, path: &Path) -> Result<(), BenchError> {
    let mut b = [0u8; 1];
    match f.read_at(&mut b, size) {
        Ok(0) => Ok(()),
        Ok(_) => Err(BenchError::Verify {
            path: path.to_path_buf(),
            offset: size,
            detail: "file is longer than written".into(),
        }),
        Err(e) => Err(BenchError::io(format!("read {}", path.display()), e)),
    }
}

/// sync(2), then drop the page cache when we may (root); returns whether it was dropped.
pub fn drop_caches() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("47008"), Ok(47008));
        assert_eq!(parse_size("32KiB"), Ok(32 << 10));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999t").is_err());
        assert_eq!(fmt_size(47008), "47008 B");
        assert_eq!(fmt_size(1 << 20), "1 MiB");
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert!(parse_duration("soon").is_err());
    }
}
