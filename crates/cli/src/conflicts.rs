//! `dircache conflicts MNT`: the conflicts found reintegrating a remote mount's modification
//! log (docs/remote.md, "Disconnected operation"), read from the log directory of MNT's
//! remote tree (`CACHE_DIR/cml-HASH/conflicts`; the mount's source in /proc/self/mountinfo
//! names the tree).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};

#[derive(clap::Args)]
pub struct ConflictsArgs {
    /// Mount point of a remote dircache mount (or its remote source, host:path).
    pub mnt: PathBuf,
    /// The mount's cache_dir, if it was given one [the default cache directory].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// The source of the mount at `mnt` (from /proc/self/mountinfo, octal escapes undone).
fn source_of(mnt: &Path) -> anyhow::Result<String> {
    let mnt = std::fs::canonicalize(mnt).with_context(|| mnt.display().to_string())?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let unescape = |s: &str| -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && i + 3 < b.len() {
                if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    // The last mount at MNT: fields 5 (mount point), then after " - ": type, source.
    let mut found = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let point = left.split(' ').nth(4).map(unescape);
        let mut r = right.split(' ');
        let (kind, source) = (r.next(), r.next().map(unescape));
        if point.as_deref() == mnt.to_str() && kind == Some("fuse.dircache") {
            found = source;
        }
    }
    found.ok_or_else(|| anyhow!("{}: not a dircache mount", mnt.display()))
}

pub fn run(a: ConflictsArgs) -> anyhow::Result<i32> {
    let src = match a.mnt.to_str() {
        Some(s) if crate::remote::is_remote(Path::new(s)) && !a.mnt.exists() => s.to_string(),
        _ => source_of(&a.mnt)?,
    };
    let (remote, _) =
        crate::remote::split(Path::new(&src), &[]).map_err(|e| anyhow!("{src}: {}", e.0))?;
    let remote = remote.ok_or_else(|| anyhow!("{src}: not a remote mount"))?;
    let base = a
        .cache_dir
        .unwrap_or_else(dircache_remote::client::container::default_cache_base);
    let dir = crate::remote::log_dir(&base, &remote.host, &remote.path);
    let lines = dircache_remote::client::cml::Log::conflicts_in(&dir);
    if lines.is_empty() {
        println!("no conflicts ({})", dir.display());
    }
    for l in lines {
        let f: Vec<&str> = l.splitn(4, '\t').collect();
        match f.as_slice() {
            [time, path, kept, why] => {
                println!("{path}: {why}; the local version is {kept} (at {time})")
            }
            _ => println!("{l}"),
        }
    }
    Ok(0)
}
