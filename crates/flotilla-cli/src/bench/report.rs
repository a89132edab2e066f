//! Results: median, min and max of each point's runs, as a table, CSV, JSON and a chart.

use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::path::Path;

/// One measured point: its parameters (in display order) and its runs.
#[derive(Clone, Debug)]
pub struct PointResult {
    pub params: Vec<(String, Value)>,
    pub rates: Vec<f64>,
    /// Extra per-run figures (name, values), reported as medians.
    pub extras: Vec<(String, Vec<f64>)>,
}

/// Median (upper median for an even count), min and max.
pub fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    (median, sorted.first().copied().unwrap_or(0.0), sorted.last().copied().unwrap_or(0.0))
}

impl PointResult {
    pub fn median(&self) -> f64 {
        summary(&self.rates).0
    }

    pub fn param(&self, name: &str) -> Option<&Value> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    fn to_json(&self) -> Map<String, Value> {
        let (median, min, max) = summary(&self.rates);
        let mut object: Map<String, Value> = self.params.iter().cloned().collect();
        object.insert("median_bytes_per_s".into(), json!(median));
        object.insert("min_bytes_per_s".into(), json!(min));
        object.insert("max_bytes_per_s".into(), json!(max));
        object.insert("runs_bytes_per_s".into(), json!(self.rates));
        for (name, values) in &self.extras {
            object.insert(name.clone(), json!(summary(values).0));
        }
        object
    }
}

/// Everything a benchmark command measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub workload: String,
    pub points: Vec<PointResult>,
    /// Top-level facts: servers' cache, peak RSS, target kind, runs.
    pub facts: Vec<(String, Value)>,
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Report {
    /// Parameter names in first-seen order.
    fn columns(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for point in &self.points {
            for (name, _) in &point.params {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        names
    }

    fn extra_columns(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for point in &self.points {
            for (name, _) in &point.extras {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        names
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let columns = self.columns();
        let extras = self.extra_columns();
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut header: Vec<String> = columns.clone();
        header.extend(["median MB/s", "min MB/s", "max MB/s"].map(String::from));
        header.extend(extras.iter().cloned());
        for point in &self.points {
            let mut row: Vec<String> =
                columns.iter().map(|c| point.param(c).map(text).unwrap_or_default()).collect();
            let (median, min, max) = summary(&point.rates);
            row.extend([median, min, max].map(|v| format!("{:.3}", v / 1e6)));
            for name in &extras {
                let value = point.extras.iter().find(|(n, _)| n == name).map(|(_, v)| summary(v).0);
                row.push(value.map(|v| format!("{v:.3}")).unwrap_or_default());
            }
            rows.push(row);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|i| rows.iter().map(|r| r[i].len()).chain([header[i].len()]).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for (key, value) in &self.facts {
            let _ = writeln!(out, "{key}: {}", text(value));
        }
        for row in [header].iter().chain(rows.iter()) {
            let cells: Vec<String> =
                row.iter().zip(&widths).map(|(cell, width)| format!("{cell:>width$}")).collect();
            let _ = writeln!(out, "{}", cells.join("  "));
        }
        out
    }

    /// One object: a single point's fields at the top level, or `points` for a sweep.
    pub fn json(&self) -> Value {
        let mut object = Map::new();
        object.insert("workload".into(), json!(self.workload));
        for (key, value) in &self.facts {
            object.insert(key.clone(), value.clone());
        }
        if let [point] = self.points.as_slice() {
            object.extend(point.to_json());
        } else {
            let points: Vec<Value> = self.points.iter().map(|p| Value::Object(p.to_json())).collect();
            object.insert("points".into(), Value::Array(points));
        }
        Value::Object(object)
    }

    pub fn csv(&self) -> String {
        let columns = self.columns();
        let extras = self.extra_columns();
        let mut out = String::new();
        let mut header = vec!["workload".to_string()];
        header.extend(columns.iter().cloned());
        header.extend(["median_bytes_per_s", "min_bytes_per_s", "max_bytes_per_s", "runs"].map(String::from));
        header.extend(extras.iter().cloned());
        let _ = writeln!(out, "{}", header.join(","));
        for point in &self.points {
            let (median, min, max) = summary(&point.rates);
            let mut row = vec![self.workload.clone()];
            row.extend(
                columns.iter().map(|c| point.param(c).map(text).unwrap_or_default().replace(',', ";")),
            );
            row.extend([median, min, max].map(|v| format!("{v:.1}")));
            row.push(point.rates.len().to_string());
            for name in &extras {
                let value = point.extras.iter().find(|(n, _)| n == name).map(|(_, v)| summary(v).0);
                row.push(value.map(|v| format!("{v:.4}")).unwrap_or_default());
            }
            let _ = writeln!(out, "{}", row.join(","));
        }
        out
    }

    /// Prints the table or JSON, and writes the CSV and the chart if asked.
    pub fn emit(&self, json: bool, csv: Option<&Path>, plot: Option<&Path>) -> anyhow::Result<()> {
        if json {
            println!("{}", self.json());
        } else {
            print!("{}", self.table());
        }
        if let Some(path) = csv {
            std::fs::write(path, self.csv()).map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))?;
        }
        if let Some(path) = plot {
            super::plot::draw(self, path)?;
        }
        Ok(())
    }

    /// The swept numeric parameter to put on a chart's x axis, if any: one with at least two
    /// numeric values (points without it are drawn as horizontal lines).
    pub fn x_axis(&self) -> Option<String> {
        let preferred =
            ["record_bytes", "transfer_bytes", "stripe_unit_bytes", "servers", "clients_per_server"];
        preferred.iter().map(|name| name.to_string()).find(|name| {
            let values: Vec<&Value> = self.points.iter().filter_map(|p| p.param(name)).collect();
            values.iter().all(|v| v.is_number()) && self.distinct(name).len() > 1
        })
    }

    fn distinct(&self, name: &str) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        for point in &self.points {
            if let Some(value) = point.param(name) {
                let value = text(value);
                if !seen.contains(&value) {
                    seen.push(value);
                }
            }
        }
        seen
    }

    /// Whether `column` is fixed by `x` among the points that have `x` (a size derived from
    /// the swept one, a layout named by its stripe unit, a client count set by a ratio).
    fn follows(&self, column: &str, x: &str) -> bool {
        let with_x: Vec<&PointResult> = self.points.iter().filter(|p| p.param(x).is_some()).collect();
        with_x.iter().all(|p| {
            with_x.iter().filter(|q| q.param(x) == p.param(x)).all(|q| q.param(column) == p.param(column))
        })
    }

    /// Series label of a point: its parameters that vary, other than the x axis and what
    /// follows from it.
    pub fn series_label(&self, point: &PointResult, x: Option<&str>) -> String {
        let on_axis = x.is_some_and(|x| point.param(x).is_some());
        let varying: Vec<String> = self
            .columns()
            .into_iter()
            .filter(|c| Some(c.as_str()) != x && self.distinct(c).len() > 1)
            .filter(|c| !(on_axis && x.is_some_and(|x| self.follows(c, x))))
            .collect();
        let parts: Vec<String> =
            varying.iter().filter_map(|c| point.param(c).map(|v| format!("{c}={}", text(v)))).collect();
        if parts.is_empty() {
            self.workload.clone()
        } else {
            parts.join(" ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(record: u64, mode: &str, rates: &[f64]) -> PointResult {
        PointResult {
            params: vec![("record_bytes".into(), json!(record)), ("interface".into(), json!(mode))],
            rates: rates.to_vec(),
            extras: Vec::new(),
        }
    }

    #[test]
    fn summary_is_median_min_max() {
        assert_eq!(summary(&[3.0, 1.0, 2.0, 5.0, 4.0]), (3.0, 1.0, 5.0));
        assert_eq!(summary(&[]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn json_is_flat_for_one_point_and_a_list_for_a_sweep() {
        let one = Report {
            workload: "galley".into(),
            points: vec![point(64, "strided", &[2e6, 1e6, 3e6])],
            facts: vec![],
        };
        let value = one.json();
        assert_eq!(value["median_bytes_per_s"], json!(2e6));
        assert_eq!(value["min_bytes_per_s"], json!(1e6));
        assert_eq!(value["max_bytes_per_s"], json!(3e6));
        assert_eq!(value["record_bytes"], json!(64));
        let sweep = Report {
            workload: "galley".into(),
            points: vec![
                point(64, "strided", &[1.0]),
                point(128, "strided", &[2.0]),
                point(64, "traditional", &[1.0]),
            ],
            facts: vec![],
        };
        assert_eq!(sweep.json()["points"].as_array().unwrap().len(), 3);
        assert_eq!(sweep.x_axis().as_deref(), Some("record_bytes"));
        assert_eq!(sweep.series_label(&sweep.points[2], Some("record_bytes")), "interface=traditional");
        assert_eq!(sweep.csv().lines().count(), 4);
        assert!(sweep.table().contains("median MB/s"));
    }
}
