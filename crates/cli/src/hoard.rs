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

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

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

/// Regular files below `root` (not following symbolic links, not leaving its file system);
/// unreadable directories are counted in `errors`.
fn walk(root: &Path, dev: u64, files: &mut Vec<File>, errors: &mut Vec<String>) {
    let md = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) => {
            errors.push(format!("{}: {e}", root.display()));
            return;
        }
    };
    if md.dev() != dev {
        return;
    }
    if md.is_file() {
        files.push(File {
            path: root.to_path_buf(),
            size: md.len(),
        });
        return;
    }
    if !md.is_dir() {
        return;
    }
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) => {
            errors.push(format!("{}: {e}", root.display()));
            return;
        }
    };
    let mut names: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    names.sort();
    for p in names {
        walk(&p, dev, files, errors);
    }
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
        walk(&p, dev, &mut files, &mut errors);
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
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        )
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bytes}/{total_bytes} {wide_msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
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
        bar.set_message(
            f.path
                .strip_prefix(&mnt)
                .unwrap_or(&f.path)
                .display()
                .to_string(),
        );
        // The open fetches the whole file into its container.
        match std::fs::File::open(&f.path) {
            Ok(_) => {
                done += 1;
                done_bytes += f.size;
            }
            Err(e) => errors.push(format!("{}: {e}", f.path.display())),
        }
        bar.inc(f.size);
    }
    bar.finish_and_clear();
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
