//! `dircache bench search`: search queries on a generated tree (~50k files), side by side with
//! GNU find, bfs and fd, interleaved in one run.
//!
//! Queries: `*.c` recursive (find -name), a PATH search (`/chmod`, STOPATFIRST|X_OK over 12
//! directories) and a library search (`/libfoo.so.1` over 6 directories).
//! Systems (each a separate process, so process start-up is included for everyone):
//! `find`, `bfs`, `fd` (`fdfind`), `sh command -v` (PATH only), `dircache` (this binary's
//! `search`, never delegated) - warm, then cold (each run after `echo 3 >
//! /proc/sys/vm/drop_caches`, root only). In-process rows (no process start-up):
//! `dircache-direct-inproc` and `dircache-cache-inproc` (a warm dircache `Cache` over the
//! local backend). Mount rows (root + /dev/fuse): the same queries on a `dircache mount` of
//! the tree: the peers walk the mount, `dircache (delegated)` sends one request to the
//! daemon (when the daemon serves the `search` op; otherwise the row says it searched
//! locally), warm and kernel-cold (drop_caches empties the kernel's caches, not the daemon's).
//! Syscalls: `strace -f -c` in a separate untimed run; FUSE requests: `perf stat -e
//! fuse:fuse_request_send`. A missing peer is skipped with a note.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use super::progress::Progress;
use anyhow::Context;
use dircache_search::{search, CacheSource, DirectSource, Flags, SearchRequest};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rows as JSON: {"query","system","median_s","min_s","max_s","syscalls"}.
    #[arg(long)]
    pub json: bool,
    /// Files in the generated tree.
    #[arg(long, default_value_t = 50_000)]
    pub files: usize,
    /// Timed runs per query and system.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Where to generate the tree (reused when it exists with the same size).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Skip the cold (drop_caches) runs.
    #[arg(long)]
    pub no_cold: bool,
    /// Skip the strace syscall counts.
    #[arg(long)]
    pub no_strace: bool,
}

/// (system, argv) pairs.
type Peers = Vec<(String, Vec<String>)>;

struct Query {
    name: &'static str,
    /// `dircache search` paths and pattern and flags.
    paths: String,
    pattern: String,
    flags: Flags,
    /// Peer command lines (system, argv).
    peers: Vec<(&'static str, Vec<String>)>,
}

#[derive(Default, Clone)]
struct Row {
    query: String,
    system: String,
    times: Vec<f64>,
    syscalls: Option<u64>,
    /// Requests that reached a FUSE daemon (perf tracepoint fuse:fuse_request_send).
    fuse_requests: Option<u64>,
    results: Option<usize>,
}

fn gen_tree(root: &Path, files: usize) -> anyhow::Result<()> {
    let marker = root.join(".generated");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(&files.to_string()) {
        return Ok(());
    }
    if root.exists() {
        std::fs::remove_dir_all(root).with_context(|| format!("removing {}", root.display()))?;
    }
    let tree = root.join("tree");
    // A deterministic tree: directory k (k > 0) lives in directory (k-1)/8 (fan-out 8), about
    // 20 files per directory, a mix of extensions.
    let exts = [".c", ".h", ".o", ".txt", ".rs", ".md", ".c", ".py"];
    let ndirs = (files / 20).max(1);
    let mut paths: Vec<PathBuf> = Vec::with_capacity(ndirs);
    paths.push(tree.clone());
    for k in 1..ndirs {
        let parent = paths[(k - 1) / 8].clone();
        paths.push(parent.join(format!("d{}", (k - 1) % 8)));
    }
    for (k, d) in paths.iter().enumerate() {
        std::fs::create_dir_all(d)?;
        let n = files / ndirs + usize::from(k < files % ndirs);
        for f in 0..n {
            std::fs::write(
                d.join(format!("f{k}_{f}{}", exts[(k + f) % exts.len()])),
                b"",
            )?;
        }
    }
    // PATH: 12 bin directories of 200 entries; chmod executable only in bin9 (a
    // non-executable one in bin3).
    for b in 0..12 {
        let d = root.join("path").join(format!("bin{b}"));
        std::fs::create_dir_all(&d)?;
        for k in 0..200 {
            std::fs::write(d.join(format!("tool{b}_{k}")), b"")?;
        }
    }
    use std::os::unix::fs::PermissionsExt;
    for (b, mode) in [(3, 0o644), (9, 0o755), (11, 0o755)] {
        let p = root.join("path").join(format!("bin{b}")).join("chmod");
        std::fs::write(&p, b"")?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    }
    // Libraries: 6 directories of 300 shared objects; libfoo.so.1 in lib4 and lib5.
    for l in 0..6 {
        let d = root.join("lib").join(format!("lib{l}"));
        std::fs::create_dir_all(&d)?;
        for k in 0..300 {
            std::fs::write(d.join(format!("libx{l}_{k}.so.1")), b"")?;
        }
        if l >= 4 {
            std::fs::write(d.join("libfoo.so.1"), b"")?;
        }
    }
    std::fs::write(&marker, files.to_string())?;
    Ok(())
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", b"3").is_ok()
}

/// Run argv, return (seconds, number of output lines).
/// `argv` run as the same user without any capability (setpriv drops the bounding set).
fn capless(argv: impl Iterator<Item = String>) -> Vec<String> {
    ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"]
        .into_iter()
        .map(String::from)
        .chain(argv)
        .collect()
}

/// Empty the calling thread's effective capability set (the permitted set stays); meant for
/// a thread that ends afterwards.
fn drop_thread_capabilities() {
    use rustix::thread::{capabilities, set_capabilities, CapabilitySet};
    if let Ok(mut c) = capabilities(None) {
        c.effective = CapabilitySet::empty();
        let _ = set_capabilities(None, c);
    }
}

fn time_cmd(argv: &[String]) -> anyhow::Result<(f64, usize)> {
    let t0 = Instant::now();
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("running {}", argv[0]))?;
    let dt = t0.elapsed().as_secs_f64();
    Ok((dt, out.stdout.iter().filter(|&&b| b == b'\n').count()))
}

fn strace_count(argv: &[String]) -> Option<u64> {
    let out = std::env::temp_dir().join(format!("dircache-bench-strace-{}", std::process::id()));
    let st = Command::new("strace")
        .args(["-f", "-c", "-o"])
        .arg(&out)
        .arg("--")
        .args(argv)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    if !st.success() && st.code() != Some(1) {
        return None;
    }
    let text = std::fs::read_to_string(&out).ok()?;
    let _ = std::fs::remove_file(&out);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_end().ends_with("total"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn perf_fuse_requests(argv: &[String]) -> Option<u64> {
    let out = Command::new("perf")
        .args(["stat", "-x", ",", "-e", "fuse:fuse_request_send", "--"])
        .args(argv)
        .stdout(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find(|l| l.contains("fuse:fuse_request_send"))?;
    line.split(',').next()?.trim().parse().ok()
}

/// Mount `src` at `mnt` with this binary's `dircache mount` (it returns once the mount is up).
fn mount(me: &str, src: &Path, mnt: &Path) -> bool {
    let _ = std::fs::create_dir_all(mnt);
    let _ = Command::new("umount")
        .arg(mnt)
        .stderr(Stdio::null())
        .status();
    Command::new(me)
        .arg("mount")
        .arg(src)
        .arg(mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let med = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    (med, s[0], s[s.len() - 1])
}

fn s(x: impl Into<String>) -> String {
    x.into()
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let root = a
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("dircache-bench-search-{}", a.files)));
    let t0 = Instant::now();
    gen_tree(&root, a.files)?;
    let root = std::fs::canonicalize(&root)?;
    let tree = root.join("tree").to_string_lossy().to_string();
    if !a.json {
        eprintln!(
            "tree {} ({} files) ready in {:.1}s",
            root.display(),
            a.files,
            t0.elapsed().as_secs_f64()
        );
    }
    let me = std::env::current_exe()?.to_string_lossy().to_string();
    let bins: Vec<String> = (0..12)
        .map(|b| {
            root.join("path")
                .join(format!("bin{b}"))
                .to_string_lossy()
                .to_string()
        })
        .collect();
    let libs: Vec<String> = (0..6)
        .map(|l| {
            root.join("lib")
                .join(format!("lib{l}"))
                .to_string_lossy()
                .to_string()
        })
        .collect();

    let mut notes = Vec::new();
    let has_bfs = have("bfs");
    let has_fd = have("fdfind");
    if !has_bfs {
        notes.push("bfs not installed (apt-get install bfs): skipped".to_string());
    }
    if !has_fd {
        notes.push("fd not installed (apt-get install fd-find): skipped".to_string());
    }
    let mut queries = vec![
        Query {
            name: "find *.c",
            paths: tree.clone(),
            pattern: s("*.c"),
            flags: Flags::INCLUDEROOT,
            peers: vec![
                ("find", vec![s("find"), tree.clone(), s("-name"), s("*.c")]),
                ("bfs", vec![s("bfs"), tree.clone(), s("-name"), s("*.c")]),
                (
                    "fd",
                    vec![s("fdfind"), s("-u"), s("--glob"), s("*.c"), tree.clone()],
                ),
            ],
        },
        Query {
            name: "PATH chmod",
            paths: bins.join(":"),
            pattern: s("/chmod"),
            flags: Flags::INCLUDEROOT | Flags::STOPATFIRST | Flags::X_OK,
            peers: vec![
                (
                    "find",
                    [
                        vec![s("find")],
                        bins.clone(),
                        vec![
                            s("-maxdepth"),
                            s("1"),
                            s("-name"),
                            s("chmod"),
                            s("-perm"),
                            s("/111"),
                            s("-print"),
                            s("-quit"),
                        ],
                    ]
                    .concat(),
                ),
                (
                    "bfs",
                    [
                        vec![s("bfs")],
                        bins.clone(),
                        vec![
                            s("-maxdepth"),
                            s("1"),
                            s("-name"),
                            s("chmod"),
                            s("-perm"),
                            s("/111"),
                            s("-print"),
                            s("-quit"),
                        ],
                    ]
                    .concat(),
                ),
                (
                    "fd",
                    [
                        vec![
                            s("fdfind"),
                            s("-u"),
                            s("--max-depth"),
                            s("1"),
                            s("-t"),
                            s("x"),
                            s("--max-results"),
                            s("1"),
                            s("--glob"),
                            s("chmod"),
                        ],
                        bins.clone(),
                    ]
                    .concat(),
                ),
                (
                    "sh command -v",
                    vec![
                        s("sh"),
                        s("-c"),
                        format!("PATH={}; command -v chmod", bins.join(":")),
                    ],
                ),
            ],
        },
        Query {
            name: "library libfoo.so.1",
            paths: libs.join(":"),
            pattern: s("/libfoo.so.1"),
            flags: Flags::INCLUDEROOT | Flags::STOPATFIRST,
            peers: vec![
                (
                    "find",
                    [
                        vec![s("find")],
                        libs.clone(),
                        vec![
                            s("-maxdepth"),
                            s("1"),
                            s("-name"),
                            s("libfoo.so.1"),
                            s("-print"),
                            s("-quit"),
                        ],
                    ]
                    .concat(),
                ),
                (
                    "bfs",
                    [
                        vec![s("bfs")],
                        libs.clone(),
                        vec![
                            s("-maxdepth"),
                            s("1"),
                            s("-name"),
                            s("libfoo.so.1"),
                            s("-print"),
                            s("-quit"),
                        ],
                    ]
                    .concat(),
                ),
                (
                    "fd",
                    [
                        vec![
                            s("fdfind"),
                            s("-u"),
                            s("--max-depth"),
                            s("1"),
                            s("--max-results"),
                            s("1"),
                            s("--glob"),
                            s("libfoo.so.1"),
                        ],
                        libs.clone(),
                    ]
                    .concat(),
                ),
            ],
        },
    ];
    for q in &mut queries {
        q.peers
            .retain(|(sys, _)| (*sys != "bfs" || has_bfs) && (*sys != "fd" || has_fd));
        let mut argv = vec![
            me.clone(),
            s("search"),
            q.paths.clone(),
            q.pattern.clone(),
            s("--no-delegate"),
        ];
        if q.flags.contains(Flags::INCLUDEROOT) {
            argv.push(s("--root"));
        }
        if q.flags.contains(Flags::STOPATFIRST) {
            argv.push(s("--first"));
        }
        if q.flags.contains(Flags::X_OK) {
            argv.push(s("-x"));
        }
        q.peers.push(("dircache", argv));
    }
    let cold_ok = !a.no_cold && drop_caches();
    if !a.no_cold && !cold_ok {
        notes.push("cold runs need root (drop_caches): skipped".to_string());
    }

    // In-process: a warm dircache Cache over the local backend, rooted at `/`.
    let backend = Arc::new(
        dircache_local::LocalBackend::new(Path::new("/"))
            .map_err(|e| anyhow::anyhow!("local backend: {e}"))?,
    );
    let cache = dircache_core::Cache::new(backend, dircache_core::Config::default())
        .map_err(|e| anyhow::anyhow!("cache: {e}"))?;
    let creds = cache.credentials(dircache_core::Cred::root());

    let mut rows: Vec<Row> = Vec::new();
    let row_idx = |rows: &mut Vec<Row>, q: &str, sys: &str| -> usize {
        if let Some(i) = rows.iter().position(|r| r.query == q && r.system == sys) {
            return i;
        }
        rows.push(Row {
            query: q.into(),
            system: sys.into(),
            ..Default::default()
        });
        rows.len() - 1
    };
    // Rounds: warm (1 untimed + runs), cold (runs), then on the mount the same again.
    let progress = Progress::new("bench search", 0);
    let per_phase = (2 * a.runs + 1 - usize::from(!cold_ok) * a.runs) as u64;
    progress.set_total(2 * per_phase);
    for run in 0..a.runs + 1 {
        let warmup = run == 0;
        progress.running(format!("warm, round {run}/{} (0 = untimed)", a.runs));
        for q in &queries {
            for (sys, argv) in &q.peers {
                let (dt, n) = time_cmd(argv)?;
                let i = row_idx(&mut rows, q.name, sys);
                rows[i].results = Some(n);
                if !warmup {
                    rows[i].times.push(dt);
                }
            }
            // In-process rows.
            let req = SearchRequest::new(q.paths.clone(), q.pattern.clone(), q.flags);
            let t = Instant::now();
            let n = search(&req, Arc::new(DirectSource::new()))?.count();
            let dt = t.elapsed().as_secs_f64();
            let i = row_idx(&mut rows, q.name, "dircache-direct-inproc");
            rows[i].results = Some(n);
            if !warmup {
                rows[i].times.push(dt);
            }
            let t = Instant::now();
            let n = search(
                &req,
                Arc::new(CacheSource::new(cache.clone(), creds.clone())),
            )?
            .count();
            let dt = t.elapsed().as_secs_f64();
            let i = row_idx(&mut rows, q.name, "dircache-cache-inproc");
            rows[i].results = Some(n);
            if !warmup {
                rows[i].times.push(dt);
            }
        }
        progress.inc();
    }
    // Cold phase, after all warm runs (a drop_caches would otherwise make the next system's
    // "warm" run cold): every run preceded by drop_caches.
    if cold_ok {
        for run in 0..a.runs {
            progress.running(format!("cold, round {}/{}", run + 1, a.runs));
            for q in &queries {
                for (sys, argv) in &q.peers {
                    drop_caches();
                    let (dt, _) = time_cmd(argv)?;
                    let i = row_idx(&mut rows, q.name, &format!("{sys} (cold)"));
                    rows[i].times.push(dt);
                }
            }
            progress.inc();
        }
    }
    // Mount phase: the same queries on a dircache mount of the tree: the peers walk the mount
    // (FUSE), `dircache` sends the whole search to the mount's daemon in one request.
    let mnt = root.with_file_name(format!(
        "{}-mnt",
        root.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let mut mount_queries: Vec<(String, Peers)> = Vec::new();
    if mount(&me, &root, &mnt) {
        let rs = root.to_string_lossy().to_string();
        let ms = mnt.to_string_lossy().to_string();
        for q in &queries {
            let probe = SearchRequest::new(q.paths.replace(&rs, &ms), q.pattern.clone(), q.flags);
            // A daemon answers a delegated search only for a caller without CAP_DAC_* (it
            // never applies capabilities), so the mount phase runs every command as uid 0
            // without capabilities (`capless`), and probes from a thread without them.
            let delegated = std::thread::spawn(move || {
                drop_thread_capabilities();
                matches!(dircache_search::proto::delegate(&probe), Ok(Some(_)))
            })
            .join()
            .unwrap_or(false);
            let mut peers = Vec::new();
            for (sys, argv) in &q.peers {
                let argv: Vec<String> = capless(argv.iter().map(|x| x.replace(&rs, &ms)));
                if *sys == "dircache" {
                    let deleg: Vec<String> = argv
                        .iter()
                        .filter(|x| *x != "--no-delegate")
                        .cloned()
                        .collect();
                    let label = if delegated {
                        "dircache (delegated)"
                    } else {
                        "dircache (daemon lacks search op: local)"
                    };
                    peers.push((label.to_string(), deleg));
                    peers.push(("dircache --no-delegate".to_string(), argv));
                } else {
                    peers.push((sys.to_string(), argv));
                }
            }
            mount_queries.push((format!("{} [mount]", q.name), peers));
        }
        for run in 0..a.runs + 1 {
            progress.running(format!(
                "on the mount, round {run}/{} (0 = untimed)",
                a.runs
            ));
            for (qn, peers) in &mount_queries {
                for (sys, argv) in peers {
                    let (dt, n) = time_cmd(argv)?;
                    let i = row_idx(&mut rows, qn, sys);
                    rows[i].results = Some(n);
                    if run > 0 {
                        rows[i].times.push(dt);
                    }
                }
            }
            progress.inc();
        }
        // Kernel cold, daemon warm: drop_caches also makes the kernel forget the inodes it
        // looked up from the daemon, while the daemon's cache keeps its complete listings.
        if cold_ok {
            for run in 0..a.runs {
                progress.running(format!(
                    "on the mount, kernel cold, round {}/{}",
                    run + 1,
                    a.runs
                ));
                for (qn, peers) in &mount_queries {
                    for (sys, argv) in peers {
                        drop_caches();
                        let (dt, _) = time_cmd(argv)?;
                        let i = row_idx(&mut rows, &format!("{qn} kernel-cold"), sys);
                        rows[i].times.push(dt);
                    }
                }
                progress.inc();
            }
        }
        if have("perf") {
            for (qn, peers) in &mount_queries {
                for (sys, argv) in peers {
                    let c = perf_fuse_requests(argv);
                    let i = row_idx(&mut rows, qn, sys);
                    rows[i].fuse_requests = c;
                    if cold_ok {
                        drop_caches();
                        let c = perf_fuse_requests(argv);
                        let i = row_idx(&mut rows, &format!("{qn} kernel-cold"), sys);
                        rows[i].fuse_requests = c;
                    }
                }
            }
        }
    } else {
        notes.push(format!(
            "could not mount {} at {} (needs root and FUSE): no mount rows",
            root.display(),
            mnt.display()
        ));
    }
    if !a.no_strace && have("strace") {
        for q in &queries {
            for (sys, argv) in &q.peers {
                let c = strace_count(argv);
                let i = row_idx(&mut rows, q.name, sys);
                rows[i].syscalls = c;
            }
        }
        for (qn, peers) in &mount_queries {
            for (sys, argv) in peers {
                let c = strace_count(argv);
                let i = row_idx(&mut rows, qn, sys);
                rows[i].syscalls = c;
            }
        }
    } else if !a.no_strace {
        notes.push("strace not installed: no syscall counts".to_string());
    }

    if !mount_queries.is_empty() {
        let _ = Command::new("umount").arg(&mnt).status();
    }
    drop(progress);
    if a.json {
        for r in &rows {
            let (med, min, max) = stats(&r.times);
            println!(
                "{}",
                serde_json::json!({"query": r.query, "system": r.system, "median_s": med, "min_s": min, "max_s": max, "syscalls": r.syscalls, "fuse_requests": r.fuse_requests})
            );
        }
    } else {
        println!(
            "{:<40} {:<26} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8}",
            "query", "system", "median_ms", "min_ms", "max_ms", "syscalls", "fuse_reqs", "results"
        );
        for r in &rows {
            let (med, min, max) = stats(&r.times);
            println!(
                "{:<40} {:<26} {:>10.2} {:>10.2} {:>10.2} {:>9} {:>9} {:>8}",
                r.query,
                r.system,
                med * 1e3,
                min * 1e3,
                max * 1e3,
                r.syscalls
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.fuse_requests
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.results
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
            );
        }
        println!(
            "({} timed runs each, interleaved; fuse_reqs = requests reaching a FUSE daemon; results = lines printed / results returned)",
            a.runs
        );
    }
    for n in notes {
        eprintln!("note: {n}");
    }
    Ok(0)
}
