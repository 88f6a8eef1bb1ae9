//! Smoke test of `dircache bench lookup --quick --json`: every key of issue 2's benchmark is
//! present and every number is positive.

use std::process::Command;

use serde_json::Value;

fn positive(v: &Value, path: &str) {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{path}: not a number: {v}"));
    assert!(
        x.is_finite() && x > 0.0,
        "{path}: not a positive number: {x}"
    );
}

fn keyed(o: &Value, path: &str, keys: &[&str]) {
    for k in keys {
        let v = o
            .get(k)
            .unwrap_or_else(|| panic!("{path}.{k} missing in {o}"));
        positive(v, &format!("{path}.{k}"));
    }
}

#[test]
fn bench_lookup_quick_json_has_every_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_dircache"))
        .args(["bench", "lookup", "--quick", "--json"])
        .output()
        .expect("running dircache");
    assert!(
        out.status.success(),
        "dircache bench lookup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    let depths = ["1", "2", "4", "8", "16"];
    let l = &v["lookup_ns"];
    for k in ["fast", "slow", "kernel_stat"] {
        keyed(&l[k], &format!("lookup_ns.{k}"), &depths);
    }
    for k in ["negative", "deep_negative", "symlink", "dotdot"] {
        positive(&l[k], &format!("lookup_ns.{k}"));
    }
    let sizes = ["10", "100", "1000", "10000"];
    keyed(&v["readdir_us"]["cache"], "readdir_us.cache", &sizes);
    keyed(&v["readdir_us"]["getdents"], "readdir_us.getdents", &sizes);
    let inv = ["100", "1000", "10000"];
    keyed(&v["invalidate_us"]["chmod"], "invalidate_us.chmod", &inv);
    keyed(&v["invalidate_us"]["rename"], "invalidate_us.rename", &inv);
    keyed(
        &v["threads_lookups_per_s"],
        "threads_lookups_per_s",
        &["1", "2"],
    );
    positive(&v["bytes_per_dentry"], "bytes_per_dentry");
}

/// `--only` runs the named sections and reports the others as skipped: no NaN, no verdict on
/// a target whose section did not run, and the JSON lists the skipped sections.
#[test]
fn bench_lookup_only_reports_skipped_sections_as_skipped() {
    let run = |json: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dircache"));
        c.args(["bench", "lookup", "--quick", "--only", "memory"]);
        if json {
            c.arg("--json");
        }
        let out = c.output().expect("running dircache");
        assert!(
            out.status.success(),
            "dircache bench lookup --only memory failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let human = run(false);
    let text = String::from_utf8_lossy(&human.stdout);
    let notes = String::from_utf8_lossy(&human.stderr);
    assert!(!text.contains("NaN"), "NaN in the report:\n{text}");
    for section in [
        "lookup (ns)",
        "readdir (us)",
        "invalidate (us)",
        "throughput",
    ] {
        assert!(
            text.contains(&format!("{section}: skipped (--only)")),
            "{section} not reported as skipped:\n{text}"
        );
    }
    for target in ["8-component fast lookup", "2 threads", "chmod, 10,000"] {
        let line = text
            .lines()
            .find(|l| l.contains(target))
            .unwrap_or_else(|| panic!("no target line for {target}:\n{text}"));
        assert!(line.trim_start().starts_with("SKIP"), "{line}");
    }
    let mem = text
        .lines()
        .find(|l| l.contains("bytes per dentry:"))
        .expect("the memory target");
    assert!(
        mem.contains("PASS") || mem.contains("MISS"),
        "the memory section ran, its target has a verdict: {mem}"
    );
    assert!(
        notes.contains("lookups: skipped (--only)") && !notes.contains("bench lookup: lookups\n"),
        "progress notes claim skipped sections ran:\n{notes}"
    );

    let v: Value = serde_json::from_slice(&run(true).stdout).expect("one JSON object");
    let skipped: Vec<&str> = v["skipped_sections"]
        .as_array()
        .expect("skipped_sections")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(skipped, ["lookups", "readdir", "invalidate", "threads"]);
    assert!(v["lookup_ns"]["fast"]["8"].is_null(), "{}", v["lookup_ns"]);
    positive(&v["bytes_per_dentry"], "bytes_per_dentry");
}

/// An unknown section name is bad input: a clear error and exit status 2.
#[test]
fn bench_lookup_only_rejects_unknown_sections() {
    let out = Command::new(env!("CARGO_BIN_EXE_dircache"))
        .args(["bench", "lookup", "--quick", "--only", "lookup"])
        .output()
        .expect("running dircache");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'lookup'"), "{err}");
}

/// `dircache bench ARGS` with stdout and stderr captured.
fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dircache"))
        .arg("bench")
        .args(args)
        .output()
        .expect("running dircache")
}

/// `bench apps --plot`: the SVG is written, has one bar per workload × system that is not the
/// baseline (and nothing else but the background, the legend swatches and the group bands),
/// and names every workload and system. Needs root (mounts, drop_caches).
#[test]
fn bench_apps_plot_draws_a_bar_per_workload_and_system() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svg_path = dir.path().join("apps.svg");
    let svg_arg = svg_path.to_str().expect("utf-8 path");
    let out = bench(&[
        "apps",
        "--quick",
        "--runs",
        "1",
        "--cache",
        "warm",
        "--only",
        "find -name,du -s,stat missing names",
        "--systems",
        "native,bindfs,dircache",
        "--plot",
        svg_arg,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench apps failed: {err}\n{text}");
    assert!(!text.contains("ERROR"), "a run failed:\n{text}\n{err}");
    // stderr is a pipe here: notes, but no progress bar.
    assert!(err.contains("bench apps: find -name"), "{err}");
    assert!(
        !err.contains("ETA"),
        "a progress bar drawn into a pipe: {err}"
    );
    let svg = std::fs::read_to_string(&svg_path).expect("the plot file");
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "not an SVG document: {}",
        &svg[..svg.len().min(200)]
    );
    let groups = [
        "find -name (warm)",
        "du -s (warm)",
        "stat missing names x2000 (warm)",
    ];
    let series = ["bindfs", "dircache"];
    for name in groups.iter().chain(&series) {
        assert!(svg.contains(name), "{name} not in the plot");
    }
    // Background + a legend swatch per series + a band every other group + the bars.
    let rects = svg.matches("<rect").count();
    let bars = groups.len() * series.len();
    assert_eq!(
        rects,
        1 + series.len() + groups.len().div_ceil(2) + bars,
        "expected {bars} bars"
    );
    assert!(svg.contains("time / native"), "axis label");
    assert!(
        svg.contains("--systems native,bindfs,dircache"),
        "parameters in the title"
    );
}

/// `bench apps --ablation` lists every optimization turned off (or, for one off by default,
/// on) through its mount option, with a ratio to the all-on mount, FUSE requests and the
/// core's backend calls per run.
#[test]
fn bench_apps_ablation_lists_every_switch() {
    let out = bench(&[
        "apps",
        "--quick",
        "--runs",
        "1",
        "--ablation",
        "--cache",
        "kcold",
        "--only",
        "stat missing names",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench apps --ablation failed: {err}\n{text}"
    );
    assert!(!text.contains("ERROR"), "a run failed:\n{text}\n{err}");
    let all_on = text
        .lines()
        .find(|l| l.trim_start().starts_with("all on"))
        .unwrap_or_else(|| panic!("no all-on line:\n{text}"));
    assert!(
        all_on.contains("us/op") && all_on.contains("req"),
        "{all_on}"
    );
    for opt in [
        "nofastpath",
        "verify_path",
        "nocompleteness",
        "nonegatives",
        "nodeep_negatives",
        "nosymlink_aliases",
        "nowalk_batch",
        "noprotected_hardlinks",
        "noprefetch",
        "nolean",
        "noreaddirplus",
        "nonegatives,nocompleteness",
    ] {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(opt))
            .unwrap_or_else(|| panic!("-o {opt} not listed:\n{text}"));
        let ratio = line.split_whitespace().nth(2).unwrap_or("");
        assert!(
            ratio.ends_with('x')
                && ratio[..ratio.len() - 1]
                    .parse::<f64>()
                    .is_ok_and(|r| r > 0.0),
            "-o {opt}: no ratio: {line}"
        );
        assert!(
            line.contains(" req ") && line.trim_end().ends_with(" be"),
            "-o {opt}: no request or backend call count: {line}"
        );
    }
}

/// `--plot` to a path that cannot be created fails at once (before any tree is generated or
/// mounted) with an error naming the option and the path.
#[test]
fn bench_plot_to_an_unwritable_path_fails_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("no-such-dir/plot.svg");
    let bad = bad.to_str().expect("utf-8 path");
    for sub in ["apps", "remote"] {
        let out = bench(&[sub, "--quick", "--plot", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "bench {sub} --plot {bad} succeeded");
        assert!(
            err.contains(&format!("--plot {bad}: cannot create the file")),
            "bench {sub}: {err}"
        );
        assert!(
            !err.contains("generating"),
            "bench {sub} started measuring: {err}"
        );
    }
}

/// On a terminal (a pseudo-terminal from util-linux `script`) the bench draws its progress bar
/// on stderr: its name, a count of rounds and an ETA; the report still goes to stdout.
#[test]
fn bench_progress_bar_is_drawn_on_a_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("report.txt");
    let cmd = format!(
        "{} bench lookup --quick --only memory > {}",
        env!("CARGO_BIN_EXE_dircache"),
        report.display()
    );
    let out = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running script(1) (util-linux)");
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "script: {tty}");
    assert!(
        tty.contains("bench lookup") && tty.contains("/1 ETA"),
        "no progress bar on the terminal: {tty:?}"
    );
    let text = std::fs::read_to_string(&report).expect("the report");
    assert!(text.contains("bytes per dentry:"), "{text}");
    assert!(!text.contains("ETA"), "the bar went to stdout: {text}");
}
