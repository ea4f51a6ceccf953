//! `tierfs`: the one binary (format, mount, umount, df, setstripe, getstripe, project, status,
//! stats, up). Every failure is one line on stderr and a non-zero exit.

mod admin;
mod agent;
mod changelog;
mod check;
mod cli;
mod dump;
mod error;
mod format;
mod helper;
mod hsm;
mod locate;
mod memfs;
mod mount;
mod pcc;
mod session;

use clap::Parser;

use cli::{Cli, Command};
use error::CliError;

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Up(a) => mount::up(a, &cli.log_level),
        Command::Format(a) => format::format(a),
        Command::Mount(a) => mount::mount(a, &cli.log_level),
        Command::Umount(a) => mount::umount(a),
        Command::Df(a) => admin::df(a),
        Command::Setstripe(a) => admin::setstripe(a),
        Command::Getstripe(a) => admin::getstripe(a),
        Command::Project(a) => admin::project(a),
        Command::Status(a) => admin::status(a),
        Command::Stats(a) => admin::stats(a),
        Command::Bench(a) => tierfs_bench::run(a).map_err(|e| CliError::Other(e.to_string())),
        Command::Pcc(c) => pcc::run(c),
        Command::Hsm(c) => hsm::run(c),
        Command::Agent(a) => agent::agent(a),
        Command::Session(c) => session::run(c),
        Command::Changelog(a) => changelog::run(a),
        Command::Dump(a) => dump::dump(a),
        Command::Gc(a) => check::gc(a),
        Command::Fsck(a) => {
            let code = check::fsck(a)?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Load(a) => dump::load(a),
        Command::MountHelper(a) => helper::mount_helper(a, &cli.log_level),
        Command::InstallHelper(a) => helper::install_helper(a),
        Command::Memfs(a) => memfs::memfs(a),
    }
}

/// The first argument (a `--meta` URL, `--meta=URL`, or a mount source) that is a database URL
/// with a password, redacted.
fn password_on_command_line(args: &[std::ffi::OsString]) -> Option<String> {
    args.iter().skip(1).find_map(|a| {
        let a = a.to_str()?;
        let v = a.strip_prefix("--meta=").unwrap_or(a);
        let database = v.starts_with("postgres://") || v.starts_with("postgresql://");
        (database && tierfs_meta::postgres::has_password(v))
            .then(|| tierfs_meta::postgres::redact(v))
    })
}

fn main() {
    // As mount.fuse.tierfs, or `tierfs SOURCE DIR -o ...` from fuse3's mount.fuse: the
    // mount helper.
    let args = helper::rewrite_args(std::env::args_os().collect());
    // mount(8) passes a helper's exit status on: 1 for bad usage, 32 for a failed mount.
    let helper = args.get(1).is_some_and(|a| a == "mount-helper");
    let usage_code = if helper { 1 } else { 2 };
    // A database password on the command line is readable by every user of the machine (ps,
    // /proc/PID/cmdline), and `tierfs mount` would hand it on to the daemon's command line.
    if let Some(bad) = password_on_command_line(&args) {
        eprintln!(
            "tierfs: {bad}: a database password on the command line is visible to every user \
             (ps, /proc); remove it from the URL and use PGPASSWORD or ~/.pgpass (or the mount \
             helper's env_file=)"
        );
        std::process::exit(usage_code);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                std::process::exit(0);
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                std::process::exit(2);
            }
            // One line: clap's first line without its "error: " prefix.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("tierfs: {first} (see tierfs --help)");
            std::process::exit(usage_code);
        }
    };
    if !matches!(
        cli.command,
        Command::Mount(_) | Command::Up(_) | Command::MountHelper(_) | Command::Memfs(_)
    ) {
        // Short-lived commands die quietly on a closed pipe (`tierfs stats M | head`), as
        // other Unix tools do. The daemon keeps Rust's default of ignoring SIGPIPE.
        // SAFETY: setting a signal disposition before any other thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        // Changes a command makes itself (setstripe, project, ...) are recorded in the
        // changelog as made by `tierfs@<host>` (a mount daemon records its client name).
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        tierfs_meta::changelog::set_process_client(&format!("tierfs@{}", host.trim()));
    }
    if let Some(p) = &cli.s3_credentials {
        // The daemon (and anything else this process starts) finds the file through the
        // environment; made absolute because the daemon leaves the working directory.
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var(tierfs_store::credentials::CREDENTIALS_ENV, p) };
    }
    init_logging(&cli.log_level);
    // fsck: 1 means problems found, so its own failures exit 2.
    let fsck = matches!(cli.command, Command::Fsck(_));
    if let Err(e) = run(cli) {
        let msg = e.to_string().replace('\n', " ");
        eprintln!("tierfs: {msg}");
        let code = match e {
            CliError::Usage(_) => 1,
            _ if helper => 32,
            _ if fsck => 2,
            _ => 1,
        };
        std::process::exit(code);
    }
}

#[cfg(test)]
mod tests {
    use super::password_on_command_line;

    fn args(v: &[&str]) -> Vec<std::ffi::OsString> {
        v.iter().map(|s| s.into()).collect()
    }

    #[test]
    fn database_passwords_on_the_command_line_are_found_and_redacted() {
        let found = password_on_command_line(&args(&[
            "tierfs",
            "mount",
            "--meta",
            "postgres://u:pw1@h/db",
            "/mnt",
        ]))
        .unwrap();
        assert!(!found.contains("pw1"), "{found}");
        assert!(
            password_on_command_line(&args(&["tierfs", "df", "--meta=postgresql://u:x@h/db"]))
                .is_some()
        );
        assert!(password_on_command_line(&args(&[
            "tierfs",
            "status",
            "--meta",
            "postgres://u@h/db?password=x"
        ]))
        .is_some());
        // the mount helper's source
        assert!(
            password_on_command_line(&args(&["tierfs", "postgres://u:x@h/db", "/mnt"])).is_some()
        );
        // no password, or not a database URL: nothing to refuse here
        assert!(
            password_on_command_line(&args(&["tierfs", "df", "--meta", "postgres://u@h/db"]))
                .is_none()
        );
        assert!(
            password_on_command_line(&args(&["tierfs", "df", "--meta", "sqlite:///x.db"]))
                .is_none()
        );
        assert!(
            password_on_command_line(&args(&["tierfs", "format", "--target", "file:///x"]))
                .is_none()
        );
    }
}
