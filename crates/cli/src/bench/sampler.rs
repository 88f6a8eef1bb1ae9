//! Interleaved sampling: every case gets one sample per round, so slow drifts of the machine
//! (other processes, frequency changes) spread evenly over all the cases compared.

use std::collections::BTreeMap;

use super::progress::Progress;
use super::stats;

/// One sample of a case: a measurement in the case's unit (ns per op, µs per op, ...).
pub type SampleFn<'a> = Box<dyn FnMut() -> anyhow::Result<f64> + 'a>;

#[derive(Default)]
pub struct Sampler<'a> {
    cases: Vec<(String, SampleFn<'a>)>,
    progress: Option<&'a Progress>,
}

impl<'a> Sampler<'a> {
    pub fn new() -> Self {
        Sampler {
            cases: Vec::new(),
            progress: None,
        }
    }

    /// Count each round (warm-up rounds too) as a step of `p`.
    pub fn progress(mut self, p: &'a Progress) -> Self {
        self.progress = Some(p);
        self
    }

    pub fn add(&mut self, key: impl Into<String>, f: impl FnMut() -> anyhow::Result<f64> + 'a) {
        self.cases.push((key.into(), Box::new(f)));
    }

    /// Run `warmup` unrecorded rounds, then `rounds` recorded ones; every case's samples.
    pub fn run(
        mut self,
        warmup: usize,
        rounds: usize,
    ) -> anyhow::Result<BTreeMap<String, Vec<f64>>> {
        let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in 0..warmup + rounds {
            for (key, f) in self.cases.iter_mut() {
                let v = f()?;
                if r >= warmup {
                    out.entry(key.clone()).or_default().push(v);
                }
            }
            if let Some(p) = self.progress {
                p.inc();
            }
        }
        Ok(out)
    }
}

/// Medians of every case.
pub fn medians(s: &BTreeMap<String, Vec<f64>>) -> BTreeMap<String, f64> {
    s.iter()
        .map(|(k, v)| (k.clone(), stats::median(v)))
        .collect()
}
