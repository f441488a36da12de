//! `tern passwd`: manage a password file, as mosquitto_passwd does. New and changed passwords
//! are hashed with argon2id; other users' lines (mosquitto's `$6$` / `$7$` too) and comments
//! are kept as they are. The file is replaced atomically (written beside it, then renamed) and
//! created with mode 0600.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use tern_broker::PasswordFile;

#[derive(Debug, Args)]
pub struct PasswdArgs {
    /// Create the file (replacing one that exists).
    #[arg(short = 'c')]
    pub create: bool,
    /// Take the password from the command line instead of asking (for scripts).
    #[arg(short = 'b', conflicts_with = "delete")]
    pub batch: bool,
    /// Delete the user.
    #[arg(short = 'D')]
    pub delete: bool,
    /// The password file.
    pub file: PathBuf,
    pub username: String,
    /// The password (with -b only).
    pub password: Option<String>,
}

pub fn run(args: PasswdArgs) -> ExitCode {
    match passwd(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn passwd(args: PasswdArgs) -> anyhow::Result<()> {
    if args.password.is_some() && !args.batch {
        bail!("a password on the command line needs -b");
    }
    let mut file = if args.create {
        if args.delete {
            bail!("-c and -D together make no sense");
        }
        PasswordFile::default()
    } else {
        PasswordFile::load(&args.file)?
    };
    if args.delete {
        if !file.remove(&args.username) {
            bail!("user {} is not in {}", args.username, args.file.display());
        }
    } else {
        let password = match (&args.password, args.batch) {
            (Some(p), true) => p.clone(),
            (None, true) => bail!("-b needs a password"),
            _ => ask()?,
        };
        file.set(&args.username, password.as_bytes())?;
    }
    write_atomically(&args.file, &file.to_text())
}

/// Asks twice on the terminal, without echo.
fn ask() -> anyhow::Result<String> {
    let first = rpassword::prompt_password("Password: ").context("cannot read the password")?;
    let second =
        rpassword::prompt_password("Reenter password: ").context("cannot read the password")?;
    if first != second {
        bail!("passwords do not match");
    }
    if first.is_empty() {
        bail!("empty password");
    }
    Ok(first)
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .context("the password file needs a file name")?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut out = options
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    out.write_all(text.as_bytes())
        .and_then(|()| out.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
}
