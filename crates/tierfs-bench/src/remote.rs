//! `tierfs bench --remote PROFILE`: the capacity tier (PostgreSQL and the S3 store) on a server
//! host across a shaped link, the clients on other hosts, as in the seed papers. The hosts are
//! network namespaces that `scripts/bench-remote.sh` makes (server `tfsrv`, clients `tfc1`,
//! `tfc2`, one bridge; see scripts/netns-hosts.sh); this module checks them, shapes the links
//! to the profile, checks the shaping with a raw round trip and a raw transfer before any
//! figure is taken, mounts each client inside its host, and undoes the shaping at the end.
//!
//! How a profile is applied on this machine's kernel (6.18 without `sch_netem`, so `tc netem`
//! is not available): the rate with `tc tbf` on both ends of every client's link (the client's
//! `eth0` egress and the server's bridge port `br-<client>` egress, so both directions), the
//! one-way delay by a delay relay this process runs on the server host: every TCP connection
//! to the metadata server and the S3 store goes through it, and each chunk of bytes is held
//! for the delay in each direction before it is passed on.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// A named network between the clients and the server host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// 1 Gbit/s, 0.1 ms one way (seed 004's 1 Gb Ethernet).
    Gbe1,
    /// No added delay and no rate limit (the veth pair's own round trip, a few µs, stands for
    /// seed 000's InfiniBand).
    Ib,
    /// 100 Mbit/s, 20 ms one way.
    Wan,
}

impl Profile {
    pub const NAMES: &'static str = "1gbe, ib, wan";

    /// Parses a profile name; an unknown one is one line naming the known ones.
    pub fn parse(s: &str) -> Result<Profile, BenchError> {
        match s {
            "1gbe" => Ok(Profile::Gbe1),
            "ib" => Ok(Profile::Ib),
            "wan" => Ok(Profile::Wan),
            _ => Err(BenchError::Args(format!(
                "--remote {s}: unknown network profile (known: {})",
                Profile::NAMES
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::Gbe1 => "1gbe",
            Profile::Ib => "ib",
            Profile::Wan => "wan",
        }
    }

    /// Added one-way delay.
    pub fn delay(self) -> Duration {
        match self {
            Profile::Gbe1 => Duration::from_micros(100),
            Profile::Ib => Duration::ZERO,
            Profile::Wan => Duration::from_millis(20),
        }
    }

    /// Rate limit of each direction, bits per second.
    pub fn rate_bits(self) -> Option<u64> {
        match self {
            Profile::Gbe1 => Some(1_000_000_000),
            Profile::Ib => None,
            Profile::Wan => Some(100_000_000),
        }
    }

    pub fn describe(self) -> String {
        let rate = match self.rate_bits() {
            Some(r) if r >= 1_000_000_000 => format!("{} Gbit/s", r / 1_000_000_000),
            Some(r) => format!("{} Mbit/s", r / 1_000_000),
            None => "no rate limit".into(),
        };
        format!(
            "{}: {} ms one way added, {rate}",
            self.name(),
            self.delay().as_secs_f64() * 1e3
        )
    }

    /// Whether a measured round trip (ms) and raw transfer rate (bits/s) match the profile.
    /// The round trip must be at least the two added delays and at most 0.4 ms (plus 10%)
    /// over them: the veth pair, the relay's two hand-offs per direction and a busy 2-core
    /// machine's wake-ups. The rate must be 50% to 110% of the limit (TCP over tbf on a
    /// shared machine), or at least 1 Gbit/s without a limit.
    pub fn check(self, rtt_ms: f64, rate_bits: f64) -> Result<(), String> {
        let want = 2.0 * self.delay().as_secs_f64() * 1e3;
        let max = want * 1.1 + 0.4;
        if rtt_ms < want * 0.95 || rtt_ms > max {
            return Err(format!(
                "round trip {rtt_ms:.3} ms, the profile wants {want:.3} ms (accepted {:.3} to {max:.3})",
                want * 0.95
            ));
        }
        match self.rate_bits() {
            Some(r) => {
                let r = r as f64;
                if rate_bits < 0.5 * r || rate_bits > 1.1 * r {
                    return Err(format!(
                        "raw transfer {:.0} Mbit/s, the profile wants {:.0} Mbit/s (accepted 50% to 110%)",
                        rate_bits / 1e6,
                        r / 1e6
                    ));
                }
            }
            None => {
                if rate_bits < 1e9 {
                    return Err(format!(
                        "raw transfer {:.0} Mbit/s, an unlimited link must carry at least 1000",
                        rate_bits / 1e6
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The hosts of `--remote`.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    pub profile: Profile,
    /// Network namespace of the server host.
    pub server_ns: String,
    /// Network namespaces of the client hosts (client k mounts in `client_ns[k % len]`).
    pub client_ns: Vec<String>,
}

/// Client side of a client host's link (in the client's namespace).
pub const CLIENT_DEV: &str = "eth0";

/// Server side of client `c`'s link (a port of the bridge, in the server's namespace).
pub fn server_dev(client_ns: &str) -> String {
    format!("br-{client_ns}")
}

/// Path of a named network namespace.
pub fn netns_path(ns: &str) -> PathBuf {
    Path::new("/run/netns").join(ns)
}

/// Runs `f` on a thread inside network namespace `ns`. Sockets made there stay there, so a
/// listener or connection can be returned and used from any thread.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BenchError> {
    let path = netns_path(ns);
    let ns_name = ns.to_string();
    std::thread::spawn(move || -> Result<T, BenchError> {
        enter_netns(&path, &ns_name)?;
        Ok(f())
    })
    .join()
    .map_err(|_| BenchError::Setup(format!("a thread in network namespace {ns} panicked")))?
}

/// Moves the calling thread into network namespace `ns` (at `path`).
fn enter_netns(path: &Path, ns: &str) -> Result<(), BenchError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            BenchError::Setup(format!(
                "--remote: network namespace {ns} does not exist (scripts/bench-remote.sh makes the hosts)"
            ))
        } else {
            BenchError::Setup(format!(
                "--remote: cannot open network namespace {ns}: {e} (run as root)"
            ))
        }
    })?;
    // SAFETY: setns on a file descriptor we own; it changes only this thread's namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(BenchError::Setup(format!(
            "--remote: no rights to enter network namespace {ns}: {e} (run as root)"
        )));
    }
    Ok(())
}

/// Whether `prog` is an executable in `path` (a PATH-style list).
pub fn find_in_path(prog: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.split(':').filter(|d| !d.is_empty()).find_map(|d| {
        let p = Path::new(d).join(prog);
        let md = std::fs::metadata(&p).ok()?;
        (md.is_file() && md.permissions().mode() & 0o111 != 0).then_some(p)
    })
}

/// The `host:port` a metadata URL (postgres) or a target URL (s3 with endpoint=) reaches.
pub fn server_of(url: &str) -> Option<(String, u16)> {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..auth_end];
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        return split_hostport(hostport, 5432);
    }
    if url.starts_with("s3://") {
        let (_, query) = url.split_once('?')?;
        let ep = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("endpoint="))?;
        let (default, rest) = if let Some(r) = ep.strip_prefix("http://") {
            (80, r)
        } else if let Some(r) = ep.strip_prefix("https://") {
            (443, r)
        } else {
            (80, ep)
        };
        let hostport = rest.split('/').next().unwrap_or(rest);
        return split_hostport(hostport, default);
    }
    None
}

fn split_hostport(s: &str, default: u16) -> Option<(String, u16)> {
    if s.is_empty() {
        return None;
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() => Some((h.to_string(), p.parse().ok()?)),
        Some(_) => None,
        None => Some((s.to_string(), default)),
    }
}

/// `url` with every `host:port` of `map` replaced by its relay's `host:port`.
pub fn rewrite_url(url: &str, map: &[((String, u16), u16)]) -> String {
    let mut out = url.to_string();
    for ((host, port), relay) in map {
        out = out.replace(&format!("@{host}:{port}/"), &format!("@{host}:{relay}/"));
        out = out.replace(&format!("//{host}:{port}"), &format!("//{host}:{relay}"));
    }
    out
}

/// Checks, before anything else runs: `tc` is installed, the namespaces exist and may be
/// entered, and the servers of `urls` answer from the first client host. Each failure is one
/// line.
pub fn preflight(cfg: &RemoteConfig, urls: &[String]) -> Result<Vec<(String, u16)>, BenchError> {
    let path = std::env::var("PATH").unwrap_or_default();
    if find_in_path("tc", &path).is_none() {
        return Err(BenchError::Setup(
            "--remote: `tc` (iproute2) is not installed: it shapes the links".into(),
        ));
    }
    if cfg.client_ns.is_empty() {
        return Err(BenchError::Args(
            "--remote needs at least one --client-netns".into(),
        ));
    }
    for ns in std::iter::once(&cfg.server_ns).chain(&cfg.client_ns) {
        in_netns(ns, || ())?;
    }
    let mut servers: Vec<(String, u16)> = Vec::new();
    for u in urls {
        let s = server_of(u).ok_or_else(|| {
            BenchError::Args(format!(
                "--remote: {} is not on the server host (--meta postgres://USER@HOST:PORT/DB and --target-url s3://BUCKET/PREFIX?endpoint=http://HOST:PORT)",
                crate::fixture::redact_url(u)
            ))
        })?;
        if !servers.contains(&s) {
            servers.push(s);
        }
    }
    for (host, port) in &servers {
        let (h, p) = (host.clone(), *port);
        let r = in_netns(&cfg.client_ns[0], move || -> std::io::Result<()> {
            let addr = (h.as_str(), p)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map(|_| ())
        })?;
        if let Err(e) = r {
            return Err(BenchError::Setup(format!(
                "--remote: the server {host}:{port} is not up (from host {}): {e}",
                cfg.client_ns[0]
            )));
        }
    }
    Ok(servers)
}

/// The shaping in place, the relays running; undone on drop.
pub struct Remote {
    cfg: RemoteConfig,
    shaped: Vec<(String, String)>,
    /// `(server, relay port)` for every server the clients reach.
    pub relays: Vec<((String, u16), u16)>,
    /// What the report records: profile, how it was applied, the check's figures.
    pub notes: Vec<String>,
}

impl Remote {
    /// Shapes the links, starts a relay per server (when the profile adds delay), and checks
    /// the shaping through a relay of the same kind. A check out of tolerance is an error.
    pub fn start(cfg: &RemoteConfig, servers: &[(String, u16)]) -> Result<Remote, BenchError> {
        let mut r = Remote {
            cfg: cfg.clone(),
            shaped: Vec::new(),
            relays: Vec::new(),
            notes: Vec::new(),
        };
        let p = cfg.profile;
        if let Some(rate) = p.rate_bits() {
            for c in &cfg.client_ns {
                r.shape(c, CLIENT_DEV, rate)?;
                r.shape(&cfg.server_ns, &server_dev(c), rate)?;
            }
        }
        let delay = p.delay();
        for (host, port) in servers {
            let port_relay = if delay.is_zero() {
                *port
            } else {
                start_relay(&cfg.server_ns, host, *port, delay)?
            };
            r.relays.push(((host.clone(), *port), port_relay));
        }
        let host = servers
            .first()
            .map(|s| s.0.clone())
            .ok_or_else(|| BenchError::Args("--remote: no server to reach".into()))?;
        let (rtt, rate) = check_link(cfg, &host, delay, p == Profile::Wan)?;
        r.notes.push(format!(
            "network profile {} (between the clients' hosts {} and the server host {}, which runs PostgreSQL and the S3 store)",
            p.describe(),
            cfg.client_ns.join(", "),
            cfg.server_ns
        ));
        r.notes.push(format!(
            "shaping: {}; {}",
            match p.rate_bits() {
                Some(_) => format!(
                    "tc tbf on {CLIENT_DEV} in each client host and on its bridge port in the server host (both directions)"
                ),
                None => "no rate limit".into(),
            },
            if delay.is_zero() {
                "no added delay (no relay)".to_string()
            } else {
                "delay by tierfs bench's TCP delay relay on the server host (this kernel has no sch_netem)".to_string()
            }
        ));
        let verdict = p.check(rtt, rate);
        r.notes.push(format!(
            "shaping check from {} (before any figure): TCP round trip of 1 byte, median {rtt:.3} ms; raw TCP transfer {:.0} Mbit/s: {}",
            cfg.client_ns[0],
            rate / 1e6,
            match &verdict {
                Ok(()) => "within tolerance".to_string(),
                Err(e) => e.clone(),
            }
        ));
        if let Err(e) = verdict {
            return Err(BenchError::Setup(format!(
                "--remote {}: the link does not match the profile: {e}",
                p.name()
            )));
        }
        Ok(r)
    }

    fn shape(&mut self, ns: &str, dev: &str, rate: u64) -> Result<(), BenchError> {
        // A burst of 10 ms at the rate, at least 64 KiB (a GSO segment); 20 ms of queue.
        let burst = (rate / 8 / 100).max(64 << 10);
        let mut cmd = Command::new("tc");
        cmd.args(["-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf"])
            .arg("rate")
            .arg(format!("{rate}bit"))
            .arg("burst")
            .arg(burst.to_string())
            .args(["latency", "20ms"]);
        crate::util::run_checked(&mut cmd, &format!("tc qdisc replace dev {dev} (in {ns})"))
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        self.shaped.push((ns.to_string(), dev.to_string()));
        Ok(())
    }

    /// `url` as the clients must use it (through the relays).
    pub fn url(&self, url: &str) -> String {
        rewrite_url(url, &self.relays)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        for (ns, dev) in self.shaped.drain(..) {
            let ok = Command::new("tc")
                .args(["-n", &ns, "qdisc", "del", "dev", &dev, "root"])
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                eprintln!("tierfs bench: could not remove the shaping of {dev} in {ns}");
            }
        }
        let _ = &self.cfg;
    }
}

/// Starts a delay relay in namespace `ns`: a listener on `host` (a free port) whose every
/// connection is joined to `host:port`, each direction delayed by `delay`. Runs until the
/// process exits. Returns the relay's port.
pub fn start_relay(ns: &str, host: &str, port: u16, delay: Duration) -> Result<u16, BenchError> {
    let h = host.to_string();
    let (tx, rx) = mpsc::channel();
    let path = netns_path(ns);
    let ns_name = ns.to_string();
    std::thread::Builder::new()
        .name("bench-relay".into())
        .spawn(move || {
            if let Err(e) = enter_netns(&path, &ns_name) {
                let _ = tx.send(Err(e));
                return;
            }
            let up = match (h.as_str(), port).to_socket_addrs().map(|mut a| a.next()) {
                Ok(Some(a)) => a,
                _ => {
                    let _ = tx.send(Err(BenchError::Setup(format!("relay: resolve {h}"))));
                    return;
                }
            };
            let l = match TcpListener::bind(SocketAddr::new(up.ip(), 0)) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(BenchError::io(format!("relay: bind {h}"), e)));
                    return;
                }
            };
            let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
            let _ = tx.send(Ok(port));
            for conn in l.incoming() {
                let Ok(a) = conn else { continue };
                // This thread is in the server's namespace, so the upstream connection is too.
                let Ok(b) = TcpStream::connect(up) else {
                    continue;
                };
                let _ = a.set_nodelay(true);
                let _ = b.set_nodelay(true);
                if let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) {
                    pump(a, b2, delay);
                    pump(b, a2, delay);
                }
            }
        })
        .map_err(|e| BenchError::io("spawn the relay thread", e))?;
    rx.recv()
        .map_err(|_| BenchError::Setup("relay: its thread ended".into()))?
}

/// Copies `src` to `dst`, every chunk delayed by `delay` after it was read; reading goes on
/// meanwhile, so a stream keeps its rate.
fn pump(mut src: TcpStream, mut dst: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        // Sleep to the due time, not up to 50 µs past it (the default timer slack): the
        // 1gbe profile's whole delay is 100 µs.
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        for (due, buf) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if dst.write_all(&buf).is_err() {
                break;
            }
        }
        let _ = dst.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match src.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    quick_ack(&src);
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
}

/// Makes the kernel acknowledge what `s` receives at once instead of delaying the ACK (up to
/// 40 ms on Linux); it lasts only a few segments, so it is set again after every read. The
/// relay is a TCP endpoint that a wire is not: a server that writes a response in two pieces
/// without TCP_NODELAY (Garage: the head, then the body) has Nagle hold the body's last
/// segment until the head is acknowledged, and a relay that delays that ACK adds a stall the
/// client would not see on a wire with the same delay.
fn quick_ack(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and a c_int option of the size given.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The shaping check: an echo and a sink server on the server host, reached from the first
/// client host through a relay like the servers' (when the profile adds delay). Returns the
/// median round trip of 1 byte (ms) and the rate of a raw transfer (bits/s).
fn check_link(
    cfg: &RemoteConfig,
    host: &str,
    delay: Duration,
    slow: bool,
) -> Result<(f64, f64), BenchError> {
    let h = host.to_string();
    let listener = in_netns(&cfg.server_ns, move || {
        let ip: IpAddr = (h.as_str(), 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| a.ip())
            .ok_or_else(|| std::io::Error::other("resolve"))?;
        TcpListener::bind(SocketAddr::new(ip, 0))
    })?
    .map_err(|e| BenchError::io(format!("check: listen on {host}"), e))?;
    let port = listener
        .local_addr()
        .map_err(|e| BenchError::io("check: local_addr", e))?
        .port();
    // The servers: the first connection echoes, the second counts bytes and answers 1 byte.
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate().take(2) {
            let Ok(mut s) = conn else { return };
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 << 10];
                if i == 0 {
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                } else {
                    let mut len = [0u8; 8];
                    if s.read_exact(&mut len).is_err() {
                        return;
                    }
                    let mut left = u64::from_le_bytes(len);
                    while left > 0 {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => left = left.saturating_sub(n as u64),
                        }
                    }
                    let _ = s.write_all(&[1]);
                }
            });
        }
    });
    let target_port = if delay.is_zero() {
        port
    } else {
        start_relay(&cfg.server_ns, host, port, delay)?
    };
    let h = host.to_string();
    let (rounds, bytes): (usize, u64) = if slow {
        (10, 16 << 20)
    } else {
        (200, 128 << 20)
    };
    let r = in_netns(&cfg.client_ns[0], move || -> std::io::Result<(f64, f64)> {
        let addr = (h.as_str(), target_port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))?;
        let mut e = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        e.set_nodelay(true)?;
        let mut rtts = Vec::with_capacity(rounds);
        let mut b = [0u8; 1];
        for _ in 0..rounds {
            let t = Instant::now();
            e.write_all(&[7])?;
            e.read_exact(&mut b)?;
            rtts.push(t.elapsed().as_secs_f64() * 1e3);
        }
        rtts.sort_by(|a, b| a.total_cmp(b));
        let rtt = rtts[rtts.len() / 2];
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        let chunk = vec![0x5au8; 1 << 20];
        let t = Instant::now();
        s.write_all(&bytes.to_le_bytes())?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        s.read_exact(&mut b)?;
        let rate = bytes as f64 * 8.0 / t.elapsed().as_secs_f64();
        Ok((rtt, rate))
    })?;
    r.map_err(|e| BenchError::io("shaping check: transfer to the server host", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_unknown_ones_are_one_line() {
        assert_eq!(Profile::parse("1gbe").unwrap(), Profile::Gbe1);
        assert_eq!(Profile::parse("ib").unwrap(), Profile::Ib);
        assert_eq!(Profile::parse("wan").unwrap(), Profile::Wan);
        let e = Profile::parse("10gbe").unwrap_err().to_string();
        assert_eq!(
            e,
            "--remote 10gbe: unknown network profile (known: 1gbe, ib, wan)"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn the_check_holds_figures_to_the_profile() {
        let g = Profile::Gbe1;
        assert!(g.check(0.30, 0.93e9).is_ok());
        assert!(g.check(0.10, 0.93e9).is_err(), "no delay applied");
        assert!(g.check(0.30, 3e9).is_err(), "no rate limit applied");
        assert!(g.check(0.30, 0.2e9).is_err(), "far under the rate");
        assert!(g.check(2.0, 0.93e9).is_err(), "far over the delay");
        assert!(Profile::Wan.check(40.5, 95e6).is_ok());
        assert!(Profile::Wan.check(0.3, 95e6).is_err());
        assert!(Profile::Ib.check(0.05, 5e9).is_ok());
        assert!(Profile::Ib.check(0.05, 0.5e9).is_err());
    }

    #[test]
    fn servers_are_found_in_urls_and_rewritten_to_their_relays() {
        let pg = "postgres://tierfs:pw@198.18.0.1:5433/bench";
        let s3 = "s3://tierfs-a/b?endpoint=http://198.18.0.1:3900&region=garage";
        assert_eq!(server_of(pg), Some(("198.18.0.1".into(), 5433)));
        assert_eq!(server_of("postgres://u@db/x"), Some(("db".into(), 5432)));
        assert_eq!(server_of(s3), Some(("198.18.0.1".into(), 3900)));
        assert_eq!(server_of("s3://tierfs-a/b"), None);
        assert_eq!(server_of("sqlite:///x.db"), None);
        assert_eq!(server_of("file:///srv/ost0"), None);
        let map = vec![
            (("198.18.0.1".to_string(), 5433), 40001),
            (("198.18.0.1".to_string(), 3900), 40002),
        ];
        assert_eq!(
            rewrite_url(pg, &map),
            "postgres://tierfs:pw@198.18.0.1:40001/bench"
        );
        assert_eq!(
            rewrite_url(s3, &map),
            "s3://tierfs-a/b?endpoint=http://198.18.0.1:40002&region=garage"
        );
    }

    #[test]
    fn a_missing_tc_is_found_missing() {
        assert!(find_in_path("tc", "/nonexistent:/also/not").is_none());
        assert!(find_in_path("sh", "/nonexistent:/bin:/usr/bin").is_some());
    }
}
