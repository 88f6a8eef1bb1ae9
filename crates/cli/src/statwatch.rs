//! `dircache stats MNT --watch [SECS]`: one line of rates per interval, like vmstat(8): FUSE
//! requests, core lookups and their hit rate, negative and listing hits, backend calls,
//! invalidations, cached entries and the daemon's memory. Ends when the mount does.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Counters of one sample (totals since the mount began).
struct Sample {
    at: Instant,
    requests: u64,
    hits: u64,
    misses: u64,
    negative_hits: u64,
    readdir_hits: u64,
    backend: u64,
    invalidations: u64,
    entries: u64,
    rss: u64,
}

fn sample(mnt: &Path) -> Result<Sample, dircache_fuse::Error> {
    let resp = dircache_fuse::stats::query_mount(mnt, &serde_json::json!({"op": "stats"}))?;
    if resp.get("ok").and_then(Value::as_bool) != Some(true) {
        return Err(dircache_fuse::Error::Protocol(format!(
            "daemon: {}",
            resp.get("error").and_then(Value::as_str).unwrap_or("error")
        )));
    }
    let s = &resp["stats"];
    let core = &s["core"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let backend = [
        "backend_lookup",
        "backend_walk",
        "backend_getattr",
        "backend_readdir",
        "backend_readlink",
        "backend_mutation",
    ]
    .iter()
    .map(|k| n(&core[*k]))
    .sum();
    Ok(Sample {
        at: Instant::now(),
        requests: n(&s["kernel_requests"]["total"]),
        hits: n(&core["hits"]),
        misses: n(&core["misses"]),
        negative_hits: n(&core["negative_hits"]),
        readdir_hits: n(&core["readdir_hits"]),
        backend,
        invalidations: n(&s["notifier"]["changes"]),
        entries: n(&core["entries"]),
        rss: n(&s["memory"]["rss_bytes"]),
    })
}

const HEADER: &str =
    "    time     req/s  lookup/s   hit%     neg/s  readdir/s  backend/s   inval/s    entries  rss MiB";

/// One line of rates between `a` and `b`.
fn line(a: &Sample, b: &Sample) -> String {
    let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
    let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
    let lookups = (b.hits + b.misses).saturating_sub(a.hits + a.misses);
    let hit = if lookups > 0 {
        format!(
            "{:5.1}",
            100.0 * b.hits.saturating_sub(a.hits) as f64 / lookups as f64
        )
    } else {
        "    -".to_string()
    };
    let now = jiff::Zoned::now().strftime("%H:%M:%S").to_string();
    format!(
        "{now} {:>9.0} {:>9.0} {hit:>6} {:>9.0} {:>10.0} {:>10.0} {:>9.0} {:>10} {:>8.1}",
        rate(a.requests, b.requests),
        lookups as f64 / secs,
        rate(a.negative_hits, b.negative_hits),
        rate(a.readdir_hits, b.readdir_hits),
        rate(a.backend, b.backend),
        rate(a.invalidations, b.invalidations),
        b.entries,
        b.rss as f64 / (1024.0 * 1024.0)
    )
}

/// Hits and misses by kind (the Coda MiniCache paper's Table 2), from `stats`' `core`
/// object: one line of `kind hits/misses`, as `/metrics` names the kinds.
pub fn by_kind(core: &Value) -> String {
    let n = |k: &str| core[k].as_u64().unwrap_or(0);
    let kinds = [
        ("lookup", n("hits"), n("misses")),
        ("access", n("fastpath_hits"), n("pcc_misses")),
        ("attr", n("attr_hits"), n("attr_misses")),
        ("symlink", n("symlink_hits"), n("symlink_misses")),
        ("negative", n("negative_hits"), n("negative_misses")),
        ("listing", n("readdir_hits"), n("readdir_misses")),
        ("walk", n("walk_hits"), n("walk_misses")),
    ];
    let mut out = String::from("  hits/misses by kind:");
    for (k, h, m) in kinds {
        out.push_str(&format!(" {k} {h}/{m}"));
    }
    out
}

/// Prints a line every `every` until the mount ends (or `count` lines were printed).
pub fn run(mnt: &Path, every: f64, count: Option<u64>) -> anyhow::Result<i32> {
    if !(every.is_finite() && (0.05..=86400.0).contains(&every)) {
        eprintln!("dircache stats: --watch takes seconds from 0.05 to 86400, not {every}");
        return Ok(2);
    }
    let mut prev = match sample(mnt) {
        Ok(s) => s,
        Err(e @ dircache_fuse::Error::NotDircache(..)) => {
            eprintln!("dircache: {e}");
            return Ok(2);
        }
        Err(e) => anyhow::bail!("stats: {e}"),
    };
    let mut printed = 0u64;
    loop {
        if count.is_some_and(|c| printed >= c) {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_secs_f64(every));
        let Ok(next) = sample(mnt) else {
            println!("{}: the mount has ended", mnt.display());
            return Ok(0);
        };
        if printed.is_multiple_of(20) {
            println!("{HEADER}");
        }
        println!("{}", line(&prev, &next));
        prev = next;
        printed += 1;
    }
}
