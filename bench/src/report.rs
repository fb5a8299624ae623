//! The report: every figure is the median of several runs with their min and max, per Redis persistence mode;
//! printed as a table and written as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

/// Median, min and max of a figure's runs.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Median of the runs (mean of the two middle ones for an even count).
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// Every run, in order.
    pub runs: Vec<f64>,
}

impl Summary {
    /// Summarises `runs` (NaN-free; an empty list gives NaNs).
    pub fn of(runs: &[f64]) -> Self {
        let mut sorted: Vec<f64> = runs.iter().copied().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        let median = match sorted.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Self {
            median,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            runs: runs.to_vec(),
        }
    }
}

/// Percentile `p` (0..=100) of `values` (nearest rank).
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// (scenario, system, metric, unit, mode).
type RowKey = (String, String, String, String, String);

/// One line of the report: a figure of one system in one scenario, per persistence mode.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scenario, e.g. "1 queue layer".
    pub scenario: String,
    /// What was measured, e.g. "batchd (accept)", "BullMQ 6.7.0".
    pub system: String,
    /// The figure, e.g. "drain".
    pub metric: String,
    /// Its unit, e.g. "jobs/s".
    pub unit: String,
    /// Per persistence mode ("off", "aof").
    pub by_mode: BTreeMap<String, Summary>,
    /// Anything a reader must know to read the figure.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// Collects rows; one value per run is added under (scenario, system, metric, mode).
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The rows, in the order first seen.
    pub rows: Vec<Row>,
    /// Raw per-run values, before summarising.
    #[serde(skip)]
    raw: Vec<(RowKey, Vec<f64>)>,
    /// Extra facts per scenario (command breakdowns, sample counts, ...).
    pub details: BTreeMap<String, serde_json::Value>,
}

impl Report {
    /// Adds one run's `value`.
    pub fn add(&mut self, scenario: &str, system: &str, metric: &str, unit: &str, mode: &str, value: f64) {
        let key = (scenario.to_owned(), system.to_owned(), metric.to_owned(), unit.to_owned(), mode.to_owned());
        match self.raw.iter_mut().find(|(k, _)| *k == key) {
            Some((_, values)) => values.push(value),
            None => self.raw.push((key, vec![value])),
        }
    }

    /// The per-run values of a figure, per mode.
    fn runs_of(&self, (scenario, system, metric): (&str, &str, &str)) -> Vec<(String, Vec<f64>)> {
        self.raw
            .iter()
            .filter(|((s, sys, met, _, _), _)| s == scenario && sys == system && met == metric)
            .map(|((.., mode), values)| (mode.clone(), values.clone()))
            .collect()
    }

    /// The first system of `scenario` whose name starts with `prefix` (`BullMQ` → `BullMQ 6.7.0`).
    pub fn system_like(&self, scenario: &str, prefix: &str) -> Option<String> {
        self.raw
            .iter()
            .find(|((s, system, ..), _)| s == scenario && system.starts_with(prefix))
            .map(|((_, system, ..), _)| system.clone())
    }

    /// The systems of `scenario`, in the order first seen.
    pub fn systems(&self, scenario: &str) -> Vec<String> {
        let mut systems: Vec<String> = Vec::new();
        for ((s, system, ..), _) in &self.raw {
            if s == scenario && !systems.contains(system) {
                systems.push(system.clone());
            }
        }
        systems
    }

    /// Adds, per mode, the ratio `numerator ÷ denominator` of each run (runs paired by index) as figure `metric` of
    /// `system` in `scenario`, unit `×`; nothing when either figure is missing.
    pub fn ratio(
        &mut self,
        scenario: &str,
        system: &str,
        metric: &str,
        numerator: (&str, &str, &str),
        denominator: (&str, &str, &str),
    ) {
        let over = self.runs_of(denominator);
        for (mode, values) in self.runs_of(numerator) {
            let Some((_, under)) = over.iter().find(|(other, _)| *other == mode) else { continue };
            for (top, bottom) in values.iter().zip(under) {
                self.add(scenario, system, metric, "×", &mode, top / bottom);
            }
        }
    }

    /// Adds, per mode, the sum of `parts` for each run (runs paired by index) as figure `metric` of `system` in
    /// `scenario`; nothing when a part is missing.
    pub fn sum(&mut self, scenario: &str, system: &str, metric: &str, unit: &str, parts: &[(&str, &str, &str)]) {
        let runs: Vec<Vec<(String, Vec<f64>)>> = parts.iter().map(|part| self.runs_of(*part)).collect();
        let Some(first) = runs.first() else { return };
        for (mode, values) in first {
            let of_mode: Vec<&Vec<f64>> =
                runs.iter().filter_map(|part| part.iter().find(|(other, _)| other == mode).map(|(_, v)| v)).collect();
            if of_mode.len() != parts.len() {
                continue;
            }
            for run in 0..values.len() {
                let total: Option<f64> = of_mode.iter().map(|values| values.get(run).copied()).sum();
                if let Some(total) = total {
                    self.add(scenario, system, metric, unit, mode, total);
                }
            }
        }
    }

    /// Records a detail (JSON) under `key`.
    pub fn detail(&mut self, key: &str, value: serde_json::Value) {
        self.details.insert(key.to_owned(), value);
    }

    /// Summarises the raw values into rows.
    pub fn finish(&mut self) {
        self.rows.clear();
        for ((scenario, system, metric, unit, mode), values) in &self.raw {
            let summary = Summary::of(values);
            match self
                .rows
                .iter_mut()
                .find(|row| row.scenario == *scenario && row.system == *system && row.metric == *metric)
            {
                Some(row) => {
                    row.by_mode.insert(mode.clone(), summary);
                }
                None => {
                    let note = self
                        .details
                        .get(&format!("note: {scenario} / {system} / {metric}"))
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_owned();
                    self.rows.push(Row {
                        scenario: scenario.clone(),
                        system: system.clone(),
                        metric: metric.clone(),
                        unit: unit.clone(),
                        by_mode: BTreeMap::from([(mode.clone(), summary)]),
                        note,
                    });
                }
            }
        }
    }

    /// The table as Markdown: one column per persistence mode, "median (min–max)".
    pub fn table(&self, modes: &[&str]) -> String {
        let mut out = String::from("| scenario | system | figure | unit |");
        for mode in modes {
            out.push_str(&format!(" Redis persistence {mode}: median (min–max) |"));
        }
        out.push_str("\n|---|---|---|---|");
        for _ in modes {
            out.push_str("---|");
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&format!("| {} | {} | {} | {} |", row.scenario, row.system, row.metric, row.unit));
            for mode in modes {
                match row.by_mode.get(*mode) {
                    Some(s) => out.push_str(&format!(" {} ({}–{}) |", fmt(s.median), fmt(s.min), fmt(s.max))),
                    None => out.push_str(" – |"),
                }
            }
            out.push('\n');
        }
        out
    }
}

/// A figure with about three significant digits.
pub fn fmt(value: f64) -> String {
    if value.is_nan() {
        return "n/a".to_owned();
    }
    let abs = value.abs();
    if abs >= 1000.0 {
        let rounded = value.round() as i64;
        let digits = rounded.abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if rounded < 0 { format!("-{grouped}") } else { grouped }
    } else if abs >= 100.0 {
        format!("{value:.0}")
    } else if abs >= 10.0 {
        format!("{value:.1}")
    } else if abs >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_percentiles() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Summary::of(&[1.0, 2.0, 3.0, 4.0]).median, 2.5);
        let mut values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut values, 50.0), 50.0);
        assert_eq!(percentile(&mut values, 99.0), 99.0);
        assert_eq!(fmt(12345.6), "12,346");
        assert_eq!(fmt(1.234), "1.23");
    }

    #[test]
    fn ratios_and_sums_pair_runs_by_index() {
        let mut report = Report::default();
        for (a, b) in [(30.0, 10.0), (40.0, 20.0), (90.0, 30.0)] {
            report.add("1", "batchd", "drain", "jobs/s", "off", a);
            report.add("1", "BullMQ 6.7.0", "drain", "jobs/s", "off", b);
        }
        let bullmq = report.system_like("1", "BullMQ").expect("found by prefix");
        report.ratio("ratios", "batchd ÷ BullMQ", "drain", ("1", "batchd", "drain"), ("1", &bullmq, "drain"));
        report.sum("ratios", "both", "drain", "jobs/s", &[("1", "batchd", "drain"), ("1", &bullmq, "drain")]);
        report.ratio("ratios", "none", "drain", ("1", "nobody", "drain"), ("1", &bullmq, "drain"));
        report.finish();
        let row =
            |system: &str| report.rows.iter().find(|row| row.system == system).map(|row| row.by_mode["off"].clone());
        let ratio = row("batchd ÷ BullMQ").expect("a ratio row");
        assert_eq!(ratio.runs, [3.0, 2.0, 3.0], "run by run, not median by median");
        assert_eq!((ratio.median, row("both").expect("a sum row").runs), (3.0, vec![40.0, 60.0, 120.0]));
        assert!(row("none").is_none(), "a missing figure adds no row");
        assert_eq!(report.systems("1"), ["batchd", "BullMQ 6.7.0"]);
    }
}
