//! The figures: median, p99 and worst of samples, printed and appended to the results file
//! that `hack/bench` turns into BENCHMARKS.md's tables.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Each of `samples` in milliseconds.
pub fn ms_each(samples: &[Duration]) -> Vec<f64> {
    samples.iter().map(|d| ms(*d)).collect()
}

/// Median, p99 and worst of `samples` (nearest rank).
pub fn spread(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99), *samples.last().unwrap_or(&f64::NAN))
}

/// Where the figures go: printed, and appended as tab-separated rows to `--results` for
/// `hack/bench` to render (section, system, figure, n, median, p99, worst, unit, note).
#[derive(Clone, Debug, Default)]
pub struct Results {
    file: Option<PathBuf>,
}

impl Results {
    pub fn new(file: Option<PathBuf>) -> Self {
        Results { file }
    }

    /// Latency-like samples: median, p99 and worst.
    pub fn samples(
        &self,
        section: &str,
        system: &str,
        figure: &str,
        samples: &[f64],
        unit: &str,
        note: &str,
    ) {
        if samples.is_empty() {
            self.row(section, system, figure, "0", "-", "-", "-", unit, note);
            return;
        }
        let mut s = samples.to_vec();
        let (median, p99, worst) = spread(&mut s);
        println!(
            "{section:<10} {system:<34} {figure:<34} n={:<4} median {median:>9.1} {unit:<4} p99 {p99:>9.1} worst {worst:>9.1}  {note}",
            s.len()
        );
        self.row(
            section,
            system,
            figure,
            &s.len().to_string(),
            &fmt(median),
            &fmt(p99),
            &fmt(worst),
            unit,
            note,
        );
    }

    /// One figure (a rate, a size).
    pub fn value(
        &self,
        section: &str,
        system: &str,
        figure: &str,
        value: f64,
        unit: &str,
        note: &str,
    ) {
        println!("{section:<10} {system:<34} {figure:<34} {value:>10.2} {unit:<8} {note}");
        self.row(
            section,
            system,
            figure,
            "1",
            &fmt(value),
            "",
            "",
            unit,
            note,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        section: &str,
        system: &str,
        figure: &str,
        n: &str,
        median: &str,
        p99: &str,
        worst: &str,
        unit: &str,
        note: &str,
    ) {
        let Some(file) = &self.file else { return };
        let line = [section, system, figure, n, median, p99, worst, unit, note]
            .map(|f| f.replace(['\t', '\n'], " "))
            .join("\t");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Three significant digits at most, so that a fraction of a millisecond keeps two.
fn fmt(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 1.0 || a == 0.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}
