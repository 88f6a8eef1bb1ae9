//! Small statistics helpers for the benchmarks: medians, minima, maxima.

use std::collections::BTreeMap;

/// Median of `v` (mean of the two middle values for an even count); 0 for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// Median of counts, rounded to a count.
pub fn median_u64(v: &[u64]) -> u64 {
    let f: Vec<f64> = v.iter().map(|x| *x as f64).collect();
    median(&f).round() as u64
}

/// Per kind, the median over the runs of the count of that kind (a run without it counts
/// 0); kinds whose median is 0 are left out.
pub fn median_by_kind(runs: &[BTreeMap<String, u64>]) -> BTreeMap<String, u64> {
    let mut kinds: Vec<&String> = runs.iter().flat_map(|m| m.keys()).collect();
    kinds.sort();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|k| {
            let v: Vec<u64> = runs
                .iter()
                .map(|m| m.get(k).copied().unwrap_or(0))
                .collect();
            (k.clone(), median_u64(&v))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Round to `d` decimals (for JSON output).
pub fn round(x: f64, d: i32) -> f64 {
    let p = 10f64.powi(d);
    (x * p).round() / p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(min(&[4.0, 1.0]), 1.0);
        assert_eq!(max(&[4.0, 1.0]), 4.0);
        assert_eq!(median_u64(&[3, 1, 2, 10]), 3);
        let run = |kv: &[(&str, u64)]| -> BTreeMap<String, u64> {
            kv.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let by = median_by_kind(&[
            run(&[("LOOKUP", 4), ("GETATTR", 1)]),
            run(&[("LOOKUP", 2)]),
            run(&[("LOOKUP", 6), ("OPEN", 1)]),
        ]);
        assert_eq!(by, run(&[("LOOKUP", 4)]));
    }
}
