//! `dircache warm MNT [PATH...]` and `dircache cached MNT [PATH]`: a view of the cache.
//!
//! `warm` walks subtrees of a mount as the calling user (lstat and readdir of every
//! directory, every entry lstat'ed; several directories at once), so that the daemon's cache
//! AND the kernel's dentries and attributes are filled: a later `find` or `du` of that tree
//! sends no FUSE request. On a remote mount the walk's first listing fetches the subtree's
//! metadata in bulk (one round trip; crates/remote/src/prefetch.rs), so the walk mostly costs
//! FUSE requests, not round trips. It stays on the mount's file system (like `find -xdev`).
//! A progress line on stderr (hidden when stderr is not a terminal) and a summary: directories,
//! files, entries the daemon's cache gained, FUSE requests the walk cost, time.
//!
//! `cached` asks the daemon what its cache holds under PATH (`{"op":"cached"}`,
//! crates/fuse/src/cacheview.rs), shown only as far as the caller could list through the mount.
//!
//! PATH is relative to MNT (or an absolute path below MNT).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Args;
use serde_json::{json, Value};

use crate::progress::Progress;
use crate::walk;

#[derive(Args)]
pub struct WarmArgs {
    /// Mount point of a running dircache mount.
    pub mnt: PathBuf,
    /// Subtrees to warm, relative to MNT (default: all of it).
    pub paths: Vec<PathBuf>,
    /// Directories walked at once.
    #[arg(short = 'j', long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub jobs: u16,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CachedArgs {
    /// Mount point of a running dircache mount.
    pub mnt: PathBuf,
    /// Directory to show, relative to MNT (default: its root).
    pub path: Option<PathBuf>,
    /// Machine-readable output (the daemon's answer).
    #[arg(long)]
    pub json: bool,
    /// Directories listed at most (the rest are counted).
    #[arg(long, default_value_t = 200)]
    pub max_dirs: u64,
    /// Negative names shown per directory at most (the rest are counted).
    #[arg(long, default_value_t = 20)]
    pub max_names: u64,
}

/// The daemon of the mount at `mnt` (exit status 2 when there is none).
fn daemon(mnt: &Path) -> Result<dircache_search::proto::Daemon, i32> {
    let cfg = dircache_search::ClientConfig::default();
    dircache_search::proto::daemon_of_mount_root(mnt, &cfg).ok_or_else(|| {
        eprintln!(
            "dircache: {}: not a dircache mount with a control socket",
            mnt.display()
        );
        2
    })
}

/// One request to daemon `d` (a fresh connection: no getxattr of the mount root, so the
/// request itself costs no FUSE request).
fn ask(d: &dircache_search::proto::Daemon, req: &Value) -> anyhow::Result<Value> {
    let cfg = dircache_search::ClientConfig::default();
    let mut s = dircache_search::proto::connect_verified(d, &cfg)
        .map_err(|e| anyhow::anyhow!("{}: {e}", d.socket.display()))?;
    dircache_fuse::stats::write_frame(&mut s, req)?;
    match dircache_fuse::stats::read_frame_max(&mut s, dircache_fuse::stats::MAX_FRAME)? {
        Some(v) => Ok(v),
        None => anyhow::bail!("the daemon closed the connection"),
    }
}

/// `rel` (relative to the mount root, or absolute below `mnt`) as a relative path; `None` if
/// it leaves the mount (`..`, an absolute path elsewhere).
fn relative(mnt: &Path, p: &Path) -> Option<PathBuf> {
    let rel = if p.is_absolute() {
        let m = std::fs::canonicalize(mnt).ok()?;
        p.strip_prefix(&m).or_else(|_| p.strip_prefix(mnt)).ok()?
    } else {
        p
    };
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(n) => out.push(n),
            std::path::Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

fn counters(d: &dircache_search::proto::Daemon) -> Option<(u64, u64)> {
    let v = ask(d, &json!({"op": "stats"})).ok()?;
    let s = &v["stats"];
    Some((
        s["kernel_requests"]["total"].as_u64()?,
        s["core"]["entries"].as_u64()?,
    ))
}

/// What `warm` counts of its walk.
#[derive(Default)]
struct Counts {
    dirs: AtomicU64,
    files: AtomicU64,
    symlinks: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    progress: Option<Progress>,
}

impl walk::Visitor for Counts {
    fn entry(&self, _path: &Path, md: &std::fs::Metadata) {
        let n = if md.is_dir() {
            return; // counted once listed
        } else if md.file_type().is_symlink() {
            &self.symlinks
        } else if md.is_file() {
            &self.files
        } else {
            &self.other
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    fn listed(&self, dir: &Path) {
        self.dirs.fetch_add(1, Ordering::Relaxed);
        // A listing the kernel had to ask for marks the directory's atime stale
        // (fuse_readdir_uncached -> fuse_invalidate_atime): stat it after the listing, so a
        // later `find` or `du` finds its attributes valid too.
        if let Err(e) = std::fs::symlink_metadata(dir) {
            self.error(dir, &e);
        }
        if let Some(p) = &self.progress {
            p.running(format!(
                "{} directories, {} files, {} symlinks",
                self.dirs.load(Ordering::Relaxed),
                self.files.load(Ordering::Relaxed),
                self.symlinks.load(Ordering::Relaxed)
            ));
        }
    }

    fn error(&self, p: &Path, e: &std::io::Error) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut f = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(format!("{}: {e}", p.display()));
        }
    }
}

pub fn run_warm(a: WarmArgs) -> anyhow::Result<i32> {
    let d = match daemon(&a.mnt) {
        Ok(d) => d,
        Err(c) => return Ok(c),
    };
    let mut roots = Vec::new();
    let paths = if a.paths.is_empty() {
        vec![PathBuf::new()]
    } else {
        a.paths.clone()
    };
    for p in &paths {
        let Some(rel) = relative(&d.root, p) else {
            eprintln!(
                "dircache warm: {} is not below {}",
                p.display(),
                a.mnt.display()
            );
            return Ok(2);
        };
        roots.push(d.root.join(rel));
    }
    let dev = std::fs::symlink_metadata(&d.root)?.dev();
    let before = counters(&d);
    let start = Instant::now();
    for r in &roots {
        match std::fs::metadata(r) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                eprintln!("dircache warm: {}: not a directory", r.display());
                return Ok(2);
            }
            Err(e) => {
                eprintln!("dircache warm: {}: {e}", r.display());
                return Ok(2);
            }
        }
    }
    let mut counts = Counts {
        progress: Some(Progress::spinner("warming")),
        ..Counts::default()
    };
    walk::walk(roots.clone(), dev, a.jobs.into(), &counts);
    let elapsed = start.elapsed();
    counts.progress = None; // cleared before the summary
    let secs = elapsed.as_secs_f64();
    let after = counters(&d);
    let (requests, entries, cached) = match (before, after) {
        (Some(b), Some(a)) => (
            Some(a.0.saturating_sub(b.0)),
            Some(a.1 as i64 - b.1 as i64),
            Some(a.1),
        ),
        _ => (None, None, None),
    };
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let first_error = counts
        .first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let summary = json!({
        "mnt": d.root.display().to_string(),
        "paths": roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>(),
        "dirs": g(&counts.dirs),
        "files": g(&counts.files),
        "symlinks": g(&counts.symlinks),
        "other": g(&counts.other),
        "errors": g(&counts.errors),
        "first_error": first_error,
        "fuse_requests": requests,
        "entries_added": entries,
        "entries_cached": cached,
        "seconds": secs,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        let opt = |v: Option<i64>| v.map_or("?".to_string(), |n| n.to_string());
        println!(
            "warmed {}: {} directories, {} files, {} symlinks, {} other in {:.2} s; \
             {} FUSE requests; the daemon's cache holds {} entries ({:+})",
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            g(&counts.dirs),
            g(&counts.files),
            g(&counts.symlinks),
            g(&counts.other),
            secs,
            opt(requests.map(|n| n as i64)),
            opt(cached.map(|n| n as i64)),
            entries.unwrap_or(0),
        );
        if let Some(e) = &first_error {
            println!("{} errors (first: {e})", g(&counts.errors));
        }
    }
    Ok(if g(&counts.errors) > 0 { 1 } else { 0 })
}

pub fn run_cached(a: CachedArgs) -> anyhow::Result<i32> {
    let d = match daemon(&a.mnt) {
        Ok(d) => d,
        Err(c) => return Ok(c),
    };
    let p = a.path.clone().unwrap_or_default();
    let Some(rel) = relative(&d.root, &p) else {
        eprintln!(
            "dircache cached: {} is not below {}",
            p.display(),
            a.mnt.display()
        );
        return Ok(2);
    };
    // Paths sent to the daemon start at the served file system's root (a bind mount of a
    // subdirectory of a dircache mount shows it at its own root).
    let fs_rel = relative(Path::new("/"), &d.fs_root.join(&rel)).unwrap_or(rel.clone());
    let path = fs_rel.to_str().map(str::to_string);
    let Some(path) = path else {
        eprintln!("dircache cached: {}: not UTF-8", p.display());
        return Ok(2);
    };
    let v = ask(
        &d,
        &json!({"op": "cached", "path": path, "max_dirs": a.max_dirs, "max_names": a.max_names}),
    )?;
    if v.get("ok").and_then(Value::as_bool) != Some(true) {
        let e = v.get("error").and_then(Value::as_str).unwrap_or("error");
        if v.get("error")
            .and_then(Value::as_str)
            .is_some_and(|e| e.starts_with("unknown op"))
        {
            anyhow::bail!("the daemon of {} is too old for `cached`", a.mnt.display());
        }
        eprintln!("dircache cached: {}: {e}", d.root.join(&rel).display());
        return Ok(1);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", human(&d.root, &d.fs_root, &v));
    }
    Ok(0)
}

/// The text view: one line per directory, totals last.
fn human(mnt: &Path, fs_root: &Path, v: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let shown = |p: &str| {
        let rel = relative(Path::new("/"), &Path::new("/").join(p)).unwrap_or_default();
        let rel = rel
            .strip_prefix(relative(Path::new("/"), fs_root).unwrap_or_default())
            .map(Path::to_path_buf)
            .unwrap_or(rel);
        mnt.join(rel).display().to_string()
    };
    let n = |x: &Value, k: &str| x.get(k).and_then(Value::as_u64).unwrap_or(0);
    if v.get("cached").and_then(Value::as_bool) == Some(false) {
        let _ = writeln!(
            out,
            "{}: nothing cached",
            shown(v["path"].as_str().unwrap_or(""))
        );
        return out;
    }
    for d in v["dirs"].as_array().into_iter().flatten() {
        let path = shown(d["path"].as_str().unwrap_or(""));
        if d.get("denied").and_then(Value::as_bool) == Some(true) {
            let _ = writeln!(out, "{path}: not shown (you may not list it)");
            continue;
        }
        let _ = write!(
            out,
            "{path}: {}{}, version {}: {} entries ({} dirs, {} files, {} symlinks",
            if d["complete"].as_bool() == Some(true) {
                "complete"
            } else {
                "partial"
            },
            if d["pending"].as_bool() == Some(true) {
                " (snapshot pending)"
            } else {
                ""
            },
            n(d, "version"),
            n(d, "positive"),
            n(d, "dirs"),
            n(d, "files"),
            n(d, "symlinks"),
        );
        if n(d, "other") > 0 {
            let _ = write!(out, ", {} other", n(d, "other"));
        }
        out.push(')');
        let negs: Vec<&str> = d["negatives"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if !negs.is_empty() {
            let _ = write!(
                out,
                "; {} negative: {}",
                negs.len() as u64 + n(d, "more_negatives"),
                negs.join(" ")
            );
            if n(d, "more_negatives") > 0 {
                let _ = write!(out, " …{} more", n(d, "more_negatives"));
            }
        }
        out.push('\n');
    }
    if n(v, "more_dirs") > 0 {
        let _ = writeln!(out, "…{} more directories", n(v, "more_dirs"));
    }
    if v["truncated"].as_bool() == Some(true) {
        let _ = writeln!(
            out,
            "(stopped after visiting the most entries one request may)"
        );
    }
    let t = &v["totals"];
    let _ = writeln!(
        out,
        "total: {} directories ({} complete), {} entries ({} dirs, {} files, {} symlinks), {} negative{}",
        n(t, "dirs"),
        n(t, "complete"),
        n(t, "positive"),
        n(t, "subdirs"),
        n(t, "files"),
        n(t, "symlinks"),
        n(t, "negatives"),
        if n(t, "denied") > 0 {
            format!("; {} directories not shown", n(t, "denied"))
        } else {
            String::new()
        }
    );
    out
}
