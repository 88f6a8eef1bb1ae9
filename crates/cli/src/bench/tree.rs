//! Generated trees for the benchmarks, in temporary directories removed on drop.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A directory removed (recursively) when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A fresh directory under `$TMPDIR` (or `/tmp`), or under `base` if given.
    pub fn new(tag: &str, base: Option<&Path>) -> Result<TempDir> {
        let base = base
            .map(Path::to_path_buf)
            .unwrap_or_else(std::env::temp_dir);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = base.join(format!("dircache-{tag}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Name of the directory at position `i` (1-based) of the deep chain.
pub fn chain_dir(i: usize) -> String {
    format!("dir{i:02}")
}

/// The path (relative to the tree root) of the regular file reached in `depth` components
/// through the chain: `file.c`, `dir01/file.c`, `dir01/dir02/file.c`, ...
pub fn depth_path(depth: usize) -> String {
    let mut p = String::new();
    for i in 1..depth {
        p.push_str(&chain_dir(i));
        p.push('/');
    }
    p.push_str("file.c");
    p
}

/// Write an empty file.
pub fn touch(p: &Path) -> Result<()> {
    fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
    Ok(())
}

/// A source-like tree: `dirs` top-level modules, each with `subdirs` subdirectories holding
/// `files` files (`.c` and `.h`) plus a Makefile. Returns the relative paths of every file.
pub fn source_tree(
    root: &Path,
    top: &str,
    dirs: usize,
    subdirs: usize,
    files: usize,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let base = root.join(top);
    fs::create_dir_all(&base)?;
    for d in 0..dirs {
        let dn = format!("module{d:02}");
        fs::create_dir_all(base.join(&dn))?;
        let mk = format!("{top}/{dn}/Makefile");
        fs::write(root.join(&mk), format!("obj-y += module{d:02}.o\n"))?;
        out.push(mk);
        for s in 0..subdirs {
            let sn = format!("{dn}/part{s}");
            fs::create_dir_all(base.join(&sn))?;
            for f in 0..files {
                let ext = if f % 3 == 0 { "h" } else { "c" };
                let rel = format!("{top}/{sn}/file{f:03}.{ext}");
                fs::write(
                    root.join(&rel),
                    format!("/* {rel} */\nint f{f}(void) {{ return {f}; }}\n"),
                )?;
                out.push(rel);
            }
        }
    }
    Ok(out)
}

/// A directory `dir` with `n` empty files `e00000.o`, ...
pub fn flat_dir(dir: &Path, n: usize) -> Result<Vec<String>> {
    fs::create_dir_all(dir)?;
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("e{i:05}.o");
        touch(&dir.join(&name))?;
        names.push(name);
    }
    Ok(names)
}

/// A directory `dir` with `n` descendants: `n / 100` subdirectories of 99 files each (or, for
/// `n < 100`, `n` files). Returns the descendants' paths relative to `dir`.
pub fn nested_dir(dir: &Path, n: usize) -> Result<Vec<String>> {
    fs::create_dir_all(dir)?;
    let mut out = Vec::with_capacity(n);
    if n < 100 {
        for i in 0..n {
            let name = format!("f{i:03}");
            touch(&dir.join(&name))?;
            out.push(name);
        }
        return Ok(out);
    }
    for s in 0..n / 100 {
        let sd = format!("s{s:03}");
        fs::create_dir_all(dir.join(&sd))?;
        out.push(sd.clone());
        for f in 0..99 {
            let rel = format!("{sd}/f{f:02}.c");
            touch(&dir.join(&rel))?;
            out.push(rel);
        }
    }
    Ok(out)
}

/// Run `git -C dir ARGS` with a fixed identity and default branch (bench repositories).
pub fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let o = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running git")?;
    if !o.status.success() {
        anyhow::bail!("git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}
