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
