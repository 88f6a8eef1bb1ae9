//! `dircache demo`: the main job on a small built-in example. Generates a source-like tree,
//! mounts it through dircache, runs a few metadata-heavy programs on the mount and on the
//! source side by side, shows the live statistics, and unmounts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Build the example tree (DIR/src-tree, mounted at DIR/mnt) here instead of a temporary
    /// directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Leave the example tree behind when done (by default it is removed, also on error).
    #[arg(long)]
    pub keep: bool,
}

/// Removes what the demo created when dropped (after `Mounted` has unmounted), unless kept.
struct Created {
    paths: Vec<PathBuf>,
    keep: bool,
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for p in &self.paths {
            if let Err(e) = std::fs::remove_dir_all(p) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("dircache demo: could not remove {}: {e}", p.display());
                }
            }
        }
    }
}

/// Unmounts (and waits for the daemon to go) when dropped, also on error.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn example_tree(root: &Path) -> anyhow::Result<usize> {
    let mut n = 0;
    for m in 0..8 {
        for d in 0..12 {
            let dir = root.join(format!("src/module{m}/part{d}"));
            std::fs::create_dir_all(&dir)?;
            for f in 0..10 {
                std::fs::write(
                    dir.join(format!("file{f}.c")),
                    format!("int f{m}_{d}_{f};\n"),
                )?;
                std::fs::write(dir.join(format!("file{f}.h")), "#pragma once\n")?;
                n += 2;
            }
        }
    }
    std::fs::create_dir_all(root.join("include/sys"))?;
    std::fs::write(root.join("include/sys/types.h"), "typedef int t;\n")?;
    std::os::unix::fs::symlink("include/sys", root.join("sys"))?;
    Ok(n + 1)
}

fn time_sh(dir: &Path, script: &str, runs: usize) -> anyhow::Result<f64> {
    let mut best = f64::MAX;
    for _ in 0..runs {
        let t = Instant::now();
        let st = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .status()
            .context("running sh")?;
        if !st.success() {
            bail!("`{script}` failed in {}", dir.display());
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

pub fn run(a: DemoArgs) -> anyhow::Result<i32> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!(
            "dircache demo mounts a FUSE file system: run it as root on a machine with /dev/fuse."
        );
        eprintln!("Without FUSE, try the core cache alone: dircache bench lookup --quick");
        return Ok(2);
    }
    let (base, temporary) = match a.dir {
        Some(d) => (d, false),
        None => (
            std::env::temp_dir().join(format!("dircache-demo-{}", std::process::id())),
            true,
        ),
    };
    let src = base.join("src-tree");
    let mnt = base.join("mnt");
    for d in [&src, &mnt] {
        if d.exists() {
            bail!("{} exists already: choose another --dir", d.display());
        }
    }
    // Dropped after `guard` below (declared first): the tree goes once it is unmounted.
    let _created = Created {
        paths: if temporary {
            vec![base.clone()]
        } else {
            vec![src.clone(), mnt.clone()]
        },
        keep: a.keep,
    };
    std::fs::create_dir_all(&src)?;
    std::fs::create_dir_all(&mnt)?;
    let files = example_tree(&src)?;
    println!("example tree: {} ({files} files)", src.display());

    let exe = std::env::current_exe()?;
    let st = Command::new(&exe)
        .arg("mount")
        .arg(&src)
        .arg(&mnt)
        .status()?;
    if !st.success() {
        bail!("dircache mount failed");
    }
    let guard = Mounted(mnt.clone());
    println!("mounted at {}\n", mnt.display());

    let workloads = [
        ("find -name '*.c'", "find . -name '*.c' | wc -l"),
        ("du -s", "du -s ."),
        ("ls -lR", "ls -lR ."),
        (
            "stat of missing files x200",
            "for i in $(seq 200); do stat nothere/x.h 2>/dev/null; done; true",
        ),
        (
            "stat through a symlink",
            "for i in $(seq 200); do stat sys/types.h >/dev/null; done",
        ),
    ];
    println!(
        "{:<30} {:>12} {:>14} {:>8}",
        "workload (best of 5)", "native ms", "dircache ms", "ratio"
    );
    for (name, script) in workloads {
        // One run warms the caches on both sides.
        let _ = time_sh(&src, script, 1)?;
        let _ = time_sh(&mnt, script, 1)?;
        let n = time_sh(&src, script, 5)? * 1e3;
        let d = time_sh(&mnt, script, 5)? * 1e3;
        println!("{name:<30} {n:>12.2} {d:>14.2} {:>8.2}", d / n);
    }
    println!(
        "\nfiles seen through the mount: {}",
        String::from_utf8_lossy(
            &Command::new("sh")
                .arg("-c")
                .arg("find . -type f | wc -l")
                .current_dir(&mnt)
                .output()?
                .stdout
        )
        .trim()
    );
    println!("\n$ dircache stats {}", mnt.display());
    let _ = Command::new(&exe).arg("stats").arg(&mnt).status();
    drop(guard);
    if a.keep {
        println!(
            "\nunmounted. The tree stays in {} (--keep).",
            base.display()
        );
    } else {
        println!("\nunmounted and removed {}.", base.display());
    }
    Ok(0)
}
