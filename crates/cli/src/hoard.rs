//! `dircache hoard MNT PATH...`: fetch subtrees of a remote mount for offline use (Coda's
//! hoarding, issue 11 step 4): their metadata (the walk; the mount's bulk subtree calls bring
//! whole listings) and every regular file whole into its container (opened once: the open
//! fetches it).
//!
//! The walk runs in this process as the calling user: the kernel checks every permission on
//! the way, and each open reaches the daemon with the caller's credentials, where the server
//! decides as for any other open. Nothing new runs with the daemon's privileges (the other
//! design, a control-socket request the daemon would execute with the caller's credentials,
//! would add a privileged path walk to the daemon for no gain: the daemon already serves
//! these opens). Files larger than the mount's `whole_file_max` are not fetched whole by an
//! open (ranged reads) and are skipped, as are files that no longer fit in `cache_size`
//! once the files before them are counted.
//!
//! Under `-o open=noopen` the kernel opens files itself and no open reaches the daemon (told
//! apart by the mount's OPEN count: two opens of one file, two OPENs only with `open=rpc`):
//! each file's cached pages are then dropped (`POSIX_FADV_DONTNEED`) and its first byte
//! read, a page-cache miss the daemon answers by fetching the file whole into its container
//! (crates/remote/src/client/noopen.rs), after the kernel checked this caller's read access
//! at the open.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::progress::Progress;
use crate::walk;

#[derive(clap::Args)]
pub struct HoardArgs {
    /// The remote mount.
    pub mnt: PathBuf,
    /// Subtrees (files or directories) below MNT to fetch.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

fn backend_counter(stats: &serde_json::Value, k: &str) -> Option<u64> {
    stats.get("backend")?.get(k)?.as_u64()
}

fn mount_stats(mnt: &Path) -> Result<serde_json::Value> {
    let r = dircache_fuse::stats::query_mount(mnt, &serde_json::json!({"op": "stats"}))?;
    if r.get("ok").and_then(|v| v.as_bool()) != Some(true) {
        bail!("{}: the daemon refused: {r}", mnt.display());
    }
    Ok(r.get("stats").cloned().unwrap_or_default())
}

/// A regular file to fetch.
struct File {
    path: PathBuf,
    size: u64,
}

/// What the walk found: regular files on the mount's device, and what could not be read.
struct Found {
    dev: u64,
    files: Mutex<Vec<File>>,
    errors: Mutex<Vec<String>>,
}

impl Found {
    fn file(&self, path: &Path, md: &std::fs::Metadata) {
        if md.is_file() && md.dev() == self.dev {
            let f = File {
                path: path.to_path_buf(),
                size: md.len(),
            };
            self.files.lock().unwrap_or_else(|e| e.into_inner()).push(f);
        }
    }
}

impl walk::Visitor for Found {
    fn entry(&self, path: &Path, md: &std::fs::Metadata) {
        self.file(path, md);
    }

    fn error(&self, path: &Path, e: &std::io::Error) {
        let e = format!("{}: {e}", path.display());
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }
}

/// Regular files below `root` (not following symbolic links, not leaving its file system),
/// in path order; unreadable directories go to `errors`.
fn files_below(root: &Path, dev: u64, files: &mut Vec<File>, errors: &mut Vec<String>) {
    let found = Found {
        dev,
        files: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
    };
    match std::fs::symlink_metadata(root) {
        Ok(md) if md.is_dir() && md.dev() == dev => {
            walk::walk(vec![root.to_path_buf()], dev, 1, &found)
        }
        Ok(md) => found.file(root, &md),
        Err(e) => walk::Visitor::error(&found, root, &e),
    }
    let mut f = found.files.into_inner().unwrap_or_else(|e| e.into_inner());
    // The order of a depth-first walk with each directory's names sorted.
    f.sort_by(|a, b| a.path.cmp(&b.path));
    files.extend(f);
    let mut e = found.errors.into_inner().unwrap_or_else(|e| e.into_inner());
    e.sort();
    errors.extend(e);
}

fn human(b: u64) -> String {
    match b {
        b if b >= 10 << 30 => format!("{} GiB", b >> 30),
        b if b >= 10 << 20 => format!("{} MiB", b >> 20),
        b if b >= 10 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

pub fn run(a: HoardArgs) -> Result<i32> {
    let mnt = a
        .mnt
        .canonicalize()
        .with_context(|| a.mnt.display().to_string())?;
    let before = match mount_stats(&mnt) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dircache hoard: {e:#}");
            return Ok(2);
        }
    };
    let (Some(whole_max), Some(cache_size)) = (
        backend_counter(&before, "containers_whole_file_max"),
        backend_counter(&before, "containers_max_bytes"),
    ) else {
        eprintln!(
            "dircache hoard: {} is not a remote mount with container files",
            mnt.display()
        );
        return Ok(2);
    };
    let dev = std::fs::metadata(&mnt)?.dev();
    let t0 = Instant::now();
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for p in &a.paths {
        let p = match p.canonicalize() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("dircache hoard: {}: {e}", p.display());
                return Ok(2);
            }
        };
        if !p.starts_with(&mnt) {
            eprintln!(
                "dircache hoard: {} is not below {}",
                p.display(),
                mnt.display()
            );
            return Ok(2);
        }
        files_below(&p, dev, &mut files, &mut errors);
    }
    let total: u64 = files
        .iter()
        .filter(|f| f.size <= whole_max)
        .map(|f| f.size)
        .sum();
    if total > cache_size {
        eprintln!(
            "dircache hoard: warning: the files to fetch hold {} ({total} bytes), more than the \
             mount's cache_size {} ({cache_size} bytes): not all of them can be kept",
            human(total),
            human(cache_size)
        );
    }
    // Under `open=noopen` no open reaches the daemon: each file is then read (a page-cache
    // miss) to be fetched.
    let read_needed = files
        .iter()
        .find(|f| f.size > 0 && f.size <= whole_max)
        .is_some_and(|f| !opens_reach_daemon(&mnt, &f.path));
    let bar = Progress::bytes(total);
    let (mut done, mut done_bytes) = (0u64, 0u64);
    let (mut too_large, mut too_large_bytes) = (0u64, 0u64);
    let (mut over, mut over_bytes) = (0u64, 0u64);
    for f in &files {
        if f.size > whole_max {
            too_large += 1;
            too_large_bytes += f.size;
            continue;
        }
        if done_bytes + f.size > cache_size {
            over += 1;
            over_bytes += f.size;
            continue;
        }
        bar.running(
            f.path
                .strip_prefix(&mnt)
                .unwrap_or(&f.path)
                .display()
                .to_string(),
        );
        // The open fetches the whole file into its container (`open=noopen`: the read after
        // it; module docs).
        let opened = std::fs::File::open(&f.path);
        match opened.and_then(|file| {
            if read_needed {
                read_through(&file)
            } else {
                Ok(())
            }
        }) {
            Ok(()) => {
                done += 1;
                done_bytes += f.size;
            }
            Err(e) => errors.push(format!("{}: {e}", f.path.display())),
        }
        bar.inc_by(f.size);
    }
    drop(bar);
    let after = mount_stats(&mnt).unwrap_or_default();
    let delta = |k: &str| {
        backend_counter(&after, k)
            .unwrap_or(0)
            .saturating_sub(backend_counter(&before, k).unwrap_or(0))
    };
    println!(
        "hoarded {done} files ({}) in {:.2} s: {} fetched ({}), the others already cached; \
         {} round trips",
        human(done_bytes),
        t0.elapsed().as_secs_f64(),
        delta("containers_fetches"),
        human(delta("containers_fetched_bytes")),
        delta("round_trips"),
    );
    if too_large > 0 {
        println!(
            "skipped {too_large} files ({}) larger than whole_file_max ({}): read in ranges, \
             not kept",
            human(too_large_bytes),
            human(whole_max)
        );
    }
    if over > 0 {
        println!(
            "skipped {over} files ({}) beyond cache_size ({})",
            human(over_bytes),
            human(cache_size)
        );
    }
    if !errors.is_empty() {
        println!("{} files or directories could not be read:", errors.len());
        for e in errors.iter().take(10) {
            println!("  {e}");
        }
        return Ok(1);
    }
    Ok(0)
}

/// Whether opens of files of the mount at `mnt` reach the daemon (`open=rpc`): two opens of
/// `sample` send two OPEN requests; under `open=noopen` at most the first (answered ENOSYS).
fn opens_reach_daemon(mnt: &Path, sample: &Path) -> bool {
    let opens = || {
        mount_stats(mnt).ok().and_then(|s| {
            s.get("kernel_requests")?
                .get("by_kind")?
                .get("open")
                .map(|v| v.as_u64().unwrap_or(0))
                .or(Some(0))
        })
    };
    let Some(before) = opens() else {
        return true;
    };
    for _ in 0..2 {
        drop(std::fs::File::open(sample));
    }
    opens().is_none_or(|after| after >= before + 2)
}

/// Drop the kernel's cached pages of `file` and read its first byte, so that the daemon sees
/// a READ (under `open=noopen`, where the open itself does not reach it) and fetches the file
/// whole into its container, or finds it valid.
fn read_through(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed)?;
    let mut b = [0u8; 1];
    file.read_at(&mut b, 0)?;
    Ok(())
}
