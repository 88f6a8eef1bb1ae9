//! `dircache bench apps --ablation`: what each optimization is worth through the mount. The
//! mount with every optimization on runs side by side (interleaved rounds) with the same
//! mount with one of them turned off by its mount option: every core switch of
//! `dircache_core::Config` (`crate::coreopts`; a switch that is off by default, such as
//! `verify_path`, is turned on instead), then the mount's own `prefetch`, `lean` and
//! `readdirplus`. Cells: time over the all-on mount's in the same cache state, and the FUSE
//! requests per run.

use dircache_core::Config;

use super::apps::Row;
use super::stats;
use super::stats::median_u64;
use crate::coreopts::{self, SWITCHES};

/// The workloads of the ablation (prefixes of `bench apps` workload names). Not the loops
/// over one path (`stat 8 components`, `stat symlink`): the kernel resolves such a path from
/// its own dentries after the first pass, whatever the core does (9 and 11 requests per run).
pub const WORKLOADS: [&str; 5] = [
    "find -name",
    "du -s",
    "ls -lR",
    "git status",
    "stat missing names",
];

/// Mount-level optimizations (not core switches), turned off the same way; then one pair of
/// core switches that stand in for each other (a miss in a complete directory is answered
/// by completeness without a negative entry, and by a negative entry without completeness).
const MOUNT_OPTS: [&str; 4] = [
    "noprefetch",
    "nolean",
    "noreaddirplus",
    "nonegatives+nocompleteness",
];

/// The all-on mount first, then one variant per optimization, as `bench apps` systems.
pub fn systems() -> Vec<String> {
    let mut v = vec!["dircache".to_string()];
    for s in &SWITCHES {
        v.push(format!("dircache:{}", variant(s)));
    }
    v.extend(MOUNT_OPTS.iter().map(|o| format!("dircache:{o}")));
    v
}

/// The option that flips `s` from its default: `noNAME` for a switch on by default.
fn variant(s: &'static coreopts::Switch) -> String {
    let mut off = Config::default();
    coreopts::apply(&mut off, &[(false, s)]);
    let on_by_default = format!("{off:?}") != format!("{:?}", Config::default());
    if on_by_default {
        format!("no{}", s.name)
    } else {
        s.name.to_string()
    }
}

/// Median FUSE requests per run: perf's count, or the daemon's own counters summed.
fn requests(r: &Row) -> Option<u64> {
    if !r.requests.is_empty() {
        return Some(median_u64(&r.requests));
    }
    if r.kinds.is_empty() {
        return None;
    }
    let sums: Vec<u64> = r.kinds.iter().map(|k| k.values().sum()).collect();
    Some(median_u64(&sums))
}

fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn print_table(rows: &[Row], runs: usize) {
    println!(
        "dircache bench apps --ablation: median of {runs} interleaved runs; each optimization off \
         (-o OPT) against the mount with all on; cell = time / all on's in the same state, \
         FUSE requests (req) and the core's backend lookup+getattr+readdir calls (be) per run \
         (medians); load average at end {}",
        super::lookup::loadavg()
    );
    println!(
        "cold = remounted and the kernel's caches dropped; kcold = the kernel's caches dropped, \
         the daemon's cache kept; warm = nothing dropped"
    );
    let mut workloads: Vec<&str> = Vec::new();
    let mut states: Vec<&str> = Vec::new();
    let mut systems: Vec<&str> = Vec::new();
    for r in rows {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
        if !states.contains(&r.cache) {
            states.push(r.cache);
        }
        if !systems.contains(&r.system) {
            systems.push(r.system);
        }
    }
    let find = |w: &str, sys: &str, st: &str| {
        rows.iter()
            .find(|r| r.workload == w && r.system == sys && r.cache == st)
    };
    for w in workloads {
        let mut head = format!("\n{w:<32}");
        for st in &states {
            head.push_str(&format!(" {st:>34}"));
        }
        println!("{head}");
        for sys in &systems {
            let label = match sys.strip_prefix("dircache:") {
                Some(o) => format!("-o {}", o.replace('+', ",")),
                None => "all on".to_string(),
            };
            let mut line = format!("  {label:<30}");
            for st in &states {
                let cell = match find(w, sys, st) {
                    None => "-".to_string(),
                    Some(r) if r.error.is_some() || r.times.is_empty() => "ERROR".to_string(),
                    Some(r) => {
                        let med = stats::median(&r.times);
                        let time = if *sys == "dircache" {
                            if r.ops > 1 {
                                format!("{:.2} us/op", med / r.ops as f64 * 1e6)
                            } else {
                                format!("{med:.3} s")
                            }
                        } else {
                            match find(w, "dircache", st) {
                                Some(b) if !b.times.is_empty() && stats::median(&b.times) > 0.0 => {
                                    format!("{:.2}x", med / stats::median(&b.times))
                                }
                                _ => "-".to_string(),
                            }
                        };
                        let mut cell = time;
                        if let Some(q) = requests(r) {
                            cell.push_str(&format!(" {:>6} req", fmt_count(q)));
                        }
                        if !r.backend.is_empty() {
                            cell.push_str(&format!(" {:>6} be", fmt_count(median_u64(&r.backend))));
                        }
                        cell
                    }
                };
                line.push_str(&format!(" {cell:>34}"));
            }
            println!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_variant_per_switch_flipping_its_default() {
        let s = systems();
        assert_eq!(s[0], "dircache");
        assert_eq!(s.len(), 1 + SWITCHES.len() + MOUNT_OPTS.len());
        assert!(s.contains(&"dircache:nofastpath".to_string()));
        // Off by default: the ablation turns it on.
        assert!(s.contains(&"dircache:verify_path".to_string()));
        assert_eq!(fmt_count(1234567), "1,234,567");
        assert_eq!(fmt_count(12), "12");
    }
}
