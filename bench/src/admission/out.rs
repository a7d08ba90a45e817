//! Where the figures go: every sample to `<log-dir>/admission-<run>-samples.tsv`, the rows to
//! `--results` (section "admission at scale"), the medians (p99) to the table printed at the end.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use super::SECTION;
use crate::Res;
use crate::figures::{Results, spread};

/// Every sample to a file, the rows to `--results`, the medians to the closing table.
pub(super) struct Out {
    results: Results,
    system: String,
    samples: Mutex<std::io::BufWriter<std::fs::File>>,
    /// figure (without the size) -> size label -> "median (p99)"; in the order first seen.
    table: Mutex<Vec<(String, String, String)>>,
}

impl Out {
    /// Starts the samples file `path` (its header line) and an empty table.
    pub(super) fn create(results: Results, system: String, path: &Path) -> Res<Self> {
        let mut samples = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(samples, "size\tfigure\tsample\tvalue")?;
        Ok(Out {
            results,
            system,
            samples: Mutex::new(samples),
            table: Mutex::new(vec![]),
        })
    }

    pub(super) fn samples(&self, size: &str, figure: &str, values: &[f64], unit: &str, note: &str) {
        if let Ok(mut f) = self.samples.lock() {
            for (i, v) in values.iter().enumerate() {
                let _ = writeln!(f, "{size}\t{figure}\t{i}\t{v:.3}");
            }
            let _ = f.flush();
        }
        self.results.samples(
            SECTION,
            &self.system,
            &format!("{figure}, {size}"),
            values,
            unit,
            note,
        );
        let cell = if values.is_empty() {
            "-".to_string()
        } else {
            let mut s = values.to_vec();
            let (median, p99, _) = spread(&mut s);
            format!("{} ({}) {unit}", short(median), short(p99))
        };
        self.cell(figure, size, cell);
    }

    pub(super) fn value(&self, size: &str, figure: &str, value: f64, unit: &str, note: &str) {
        self.results.value(
            SECTION,
            &self.system,
            &format!("{figure}, {size}"),
            value,
            unit,
            note,
        );
        self.cell(figure, size, format!("{} {unit}", short(value)));
    }

    fn cell(&self, figure: &str, size: &str, cell: String) {
        self.table
            .lock()
            .unwrap()
            .push((figure.to_string(), size.to_string(), cell));
    }

    /// Figures down, sizes across: median (p99) of each.
    pub(super) fn print_table(&self) {
        let table = self.table.lock().unwrap();
        let mut sizes: Vec<&str> = vec![];
        let mut figures: Vec<&str> = vec![];
        for (figure, size, _) in table.iter() {
            if !sizes.contains(&size.as_str()) {
                sizes.push(size);
            }
            if !figures.contains(&figure.as_str()) {
                figures.push(figure);
            }
        }
        let cells: HashMap<(&str, &str), &str> = table
            .iter()
            .map(|(f, s, c)| ((f.as_str(), s.as_str()), c.as_str()))
            .collect();
        println!("\n== admission at scale: median (p99), by number of fenced leases ==\n");
        println!("| figure | {} |", sizes.join(" | "));
        println!("|---|{}", "---|".repeat(sizes.len()));
        for figure in figures {
            let row: Vec<&str> = sizes
                .iter()
                .map(|s| cells.get(&(figure, *s)).copied().unwrap_or(""))
                .collect();
            println!("| {figure} | {} |", row.join(" | "));
        }
        println!();
    }
}

fn short(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
