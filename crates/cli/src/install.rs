//! `dircache install`: the binary, the mount(8) helper, man pages (generated from the clap
//! definitions by clap_mangen) and shell completions (clap_complete) in one command;
//! `dircache completions SHELL` prints one completion script.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap_complete::Shell;

/// The mount(8) helper, installed as SBINDIR/mount.fuse.dircache.
const MOUNT_HELPER: &str = include_str!("../../fuse/scripts/mount.fuse.dircache");
/// The helper's default binary, replaced by the installed path.
const HELPER_BIN_LINE: &str = "bin=${DIRCACHE_BIN:-dircache}";

#[derive(clap::Args)]
pub struct InstallArgs {
    /// Installation prefix: PREFIX/bin/dircache, PREFIX/share/man/man1/dircache*.1, and the
    /// bash, zsh and fish completions under PREFIX/share.
    #[arg(long, default_value = "/usr/local")]
    pub prefix: PathBuf,
    /// Where mount(8) looks for helpers: SBINDIR/mount.fuse.dircache.
    #[arg(long, default_value = "/sbin")]
    pub sbindir: PathBuf,
    /// Stage every file under DESTDIR (for packaging): DESTDIR/PREFIX/..., DESTDIR/SBINDIR/...
    #[arg(long)]
    pub destdir: Option<PathBuf>,
    /// Print what would be installed, and install nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to print a completion script for.
    pub shell: Shell,
}

/// One file to install: where, mode, content.
struct File {
    path: PathBuf,
    mode: u32,
    content: Vec<u8>,
}

/// `dir` under `destdir` (an absolute `dir` is re-rooted there).
fn staged(destdir: Option<&Path>, dir: &Path) -> PathBuf {
    match destdir {
        Some(d) => d.join(dir.strip_prefix("/").unwrap_or(dir)),
        None => dir.to_path_buf(),
    }
}

/// Man pages: `dircache.1` and one per visible subcommand (`dircache-mount.1`,
/// `dircache-bench-apps.1`, ...), as `git help` names them.
fn man_pages(
    cmd: &clap::Command,
    prefix: &str,
    out: &mut Vec<(String, Vec<u8>)>,
) -> anyhow::Result<()> {
    let name = if prefix.is_empty() {
        cmd.get_name().to_string()
    } else {
        format!("{prefix}-{}", cmd.get_name())
    };
    let mut buf = Vec::new();
    let page = cmd
        .clone()
        .name(name.clone())
        .display_name(name.replace('-', " "));
    clap_mangen::Man::new(page)
        .title(name.clone())
        .render(&mut buf)?;
    out.push((format!("{name}.1"), buf));
    // Not the hidden test tooling, nor clap's generated `help` subcommands.
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        man_pages(sub, &name, out)?;
    }
    Ok(())
}

fn completion(cmd: &clap::Command, shell: Shell) -> Vec<u8> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd.clone(), "dircache", &mut buf);
    buf
}

fn plan(a: &InstallArgs, mut cmd: clap::Command) -> anyhow::Result<Vec<File>> {
    if !a.prefix.is_absolute() || !a.sbindir.is_absolute() {
        anyhow::bail!("--prefix and --sbindir must be absolute paths");
    }
    cmd.build();
    let dest = a.destdir.as_deref();
    let bin_dir = a.prefix.join("bin");
    let installed_bin = bin_dir.join("dircache");
    let exe = std::env::current_exe().context("finding this program")?;
    let mut files = vec![File {
        path: staged(dest, &installed_bin),
        mode: 0o755,
        content: std::fs::read(&exe).with_context(|| format!("reading {}", exe.display()))?,
    }];
    if !MOUNT_HELPER.contains(HELPER_BIN_LINE) {
        anyhow::bail!("the mount helper has no `{HELPER_BIN_LINE}` line to point at the binary");
    }
    let helper = MOUNT_HELPER.replace(
        HELPER_BIN_LINE,
        &format!("bin=${{DIRCACHE_BIN:-{}}}", installed_bin.display()),
    );
    files.push(File {
        path: staged(dest, &a.sbindir.join("mount.fuse.dircache")),
        mode: 0o755,
        content: helper.into_bytes(),
    });
    let share = a.prefix.join("share");
    let mut pages = Vec::new();
    man_pages(&cmd, "", &mut pages)?;
    for (name, content) in pages {
        files.push(File {
            path: staged(dest, &share.join("man/man1").join(name)),
            mode: 0o644,
            content,
        });
    }
    for (shell, rel) in [
        (Shell::Bash, "bash-completion/completions/dircache"),
        (Shell::Zsh, "zsh/site-functions/_dircache"),
        (Shell::Fish, "fish/vendor_completions.d/dircache.fish"),
    ] {
        files.push(File {
            path: staged(dest, &share.join(rel)),
            mode: 0o644,
            content: completion(&cmd, shell),
        });
    }
    Ok(files)
}

/// Writes `f` atomically (a temporary file in the same directory, renamed over the old one:
/// a running `dircache` keeps its old binary).
fn write_file(f: &File) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = f.path.parent().context("a file without a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("writing in {}", dir.display()))?;
    tmp.write_all(&f.content)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(f.mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(&f.path)
        .with_context(|| format!("installing {}", f.path.display()))?;
    Ok(())
}

pub fn run(a: InstallArgs, cmd: clap::Command) -> anyhow::Result<i32> {
    let files = match plan(&a, cmd) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("dircache install: {e:#}");
            return Ok(2);
        }
    };
    for f in &files {
        if a.dry_run {
            println!("would install {} ({:o})", f.path.display(), f.mode);
            continue;
        }
        if let Err(e) = write_file(f) {
            eprintln!("dircache install: {e:#}");
            return Ok(1);
        }
        println!("installed {}", f.path.display());
    }
    Ok(0)
}

pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<i32> {
    cmd.build();
    use std::io::Write;
    std::io::stdout().write_all(&completion(&cmd, a.shell))?;
    Ok(0)
}
