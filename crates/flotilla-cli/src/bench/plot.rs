//! `--plot FILE.png`: a chart like the papers' figures — median MB/s against the swept
//! parameter (log scale, as Galley's record sizes and GPFS's block sizes), one line per
//! series, min–max bars. Drawn with plotters' bitmap backend and an embedded DejaVu Sans
//! font (no system fonts needed).

use super::report::{summary, Report};
use anyhow::Context;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_err() {
            tracing::warn!("could not register the chart font");
        }
    });
}

/// Draws the report as a PNG.
pub fn draw(report: &Report, path: &Path) -> anyhow::Result<()> {
    register_font();
    let x_name = report.x_axis();
    let x_of = |index: usize| -> Option<f64> {
        match x_name.as_deref() {
            Some(name) => report.points[index].param(name).and_then(|v| v.as_f64()),
            None => Some(index as f64 + 1.0),
        }
    };
    let xs: Vec<Option<f64>> = (0..report.points.len()).map(x_of).collect();
    let (x_min, x_max) =
        xs.iter().flatten().fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    let y_max =
        report.points.iter().map(|p| summary(&p.rates).2 / 1e6).fold(0.0f64, f64::max).max(1e-3) * 1.1;
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).context("draw the chart")?;
    let caption = format!("flotilla bench {}", report.workload);
    let mut builder = ChartBuilder::on(&root);
    builder.caption(caption, (FONT, 24)).margin(16).x_label_area_size(44).y_label_area_size(64);
    let x_label = x_name.clone().unwrap_or_else(|| "point".to_string());
    let (lo, hi) = (x_min.max(1e-9) / 1.5, x_max.max(x_min + 1.0) * 1.5);
    let mut chart =
        builder.build_cartesian_2d((lo..hi).log_scale(), 0f64..y_max).context("draw the chart")?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("MB/s (median; bars: min-max)")
        .label_style((FONT, 13))
        .x_label_formatter(&|x| format_size(*x))
        .draw()
        .context("draw the chart axes")?;
    let mut series: Vec<(String, Vec<usize>)> = Vec::new();
    for (index, point) in report.points.iter().enumerate() {
        let label = report.series_label(point, x_name.as_deref());
        match series.iter_mut().find(|(name, _)| *name == label) {
            Some((_, members)) => members.push(index),
            None => series.push((label, vec![index])),
        }
    }
    for (number, (label, members)) in series.iter().enumerate() {
        let color = Palette99::pick(number).to_rgba();
        let style = color.stroke_width(2);
        // Points off the axis (a hash layout among stripe units): a horizontal line.
        let mut line: Vec<(f64, f64)> = match members.iter().find_map(|i| xs[*i].is_none().then_some(*i)) {
            Some(i) => vec![(lo, report.points[i].median() / 1e6), (hi, report.points[i].median() / 1e6)],
            None => {
                members.iter().filter_map(|i| Some((xs[*i]?, report.points[*i].median() / 1e6))).collect()
            }
        };
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(line.clone(), style))
            .context("draw a series")?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        let on_axis: Vec<usize> = members.iter().copied().filter(|i| xs[*i].is_some()).collect();
        let dots = on_axis.iter().filter_map(|i| {
            Some(Circle::new((xs[*i]?, report.points[*i].median() / 1e6), 3, color.filled()))
        });
        chart.draw_series(dots).context("draw points")?;
        let bars = on_axis.iter().filter_map(|i| {
            let (_, min, max) = summary(&report.points[*i].rates);
            Some(PathElement::new(vec![(xs[*i]?, min / 1e6), (xs[*i]?, max / 1e6)], color))
        });
        chart.draw_series(bars).context("draw error bars")?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

/// The series' legend, framed, at `position`.
fn draw_legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
        .context("draw the legend")?;
    Ok(())
}

fn format_size(value: f64) -> String {
    let trim = |v: f64| {
        let text = format!("{v:.2}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if value >= (1u64 << 20) as f64 {
        format!("{}M", trim(value / (1u64 << 20) as f64))
    } else if value >= 1024.0 {
        format!("{}K", trim(value / 1024.0))
    } else {
        trim(value)
    }
}

/// Fig. 7-10/7-11/7-12 style: MB each disk moved, one series of dots per layout, the mean of
/// each series as a line.
pub fn draw_disk_load(title: &str, series: &[(String, Vec<u64>)], path: &Path) -> anyhow::Result<()> {
    register_font();
    let disks = series.iter().map(|(_, v)| v.len()).max().unwrap_or(1);
    let mb = |b: u64| b as f64 / 1e6;
    let y_max =
        series.iter().flat_map(|(_, v)| v.iter()).map(|b| mb(*b)).fold(0.0f64, f64::max).max(1e-3) * 1.15;
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).context("draw the chart")?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5f64..disks as f64 - 0.5, 0f64..y_max)
        .context("draw the chart")?;
    chart
        .configure_mesh()
        .x_desc("disk")
        .y_desc("MB moved by the disk")
        .label_style((FONT, 13))
        .draw()
        .context("draw the chart axes")?;
    for (number, (label, bytes)) in series.iter().enumerate() {
        let color = Palette99::pick(number).to_rgba();
        let mean = bytes.iter().sum::<u64>() as f64 / bytes.len().max(1) as f64 / 1e6;
        let dots =
            bytes.iter().enumerate().map(|(disk, b)| Circle::new((disk as f64, mb(*b)), 3, color.filled()));
        chart
            .draw_series(dots)
            .context("draw points")?
            .label(label.clone())
            .legend(move |(x, y)| Circle::new((x + 10, y), 3, color.filled()));
        let line = vec![(-0.5, mean), (disks as f64 - 0.5, mean)];
        chart.draw_series(LineSeries::new(line, color.stroke_width(1))).context("draw the mean")?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

/// Fig. 7-13/7-14 style: a dot for each disk (vertical) busy in each iteration (horizontal),
/// its size following the disk's share of the iteration's busiest disk.
pub fn draw_temporal(title: &str, per_step: &[Vec<u64>], path: &Path) -> anyhow::Result<()> {
    register_font();
    let steps = per_step.len().max(1);
    let disks = per_step.iter().map(Vec::len).max().unwrap_or(1);
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).context("draw the chart")?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5f64..steps as f64 - 0.5, -0.5f64..disks as f64 - 0.5)
        .context("draw the chart")?;
    chart
        .configure_mesh()
        .x_desc("iteration")
        .y_desc("disk")
        .label_style((FONT, 13))
        .draw()
        .context("draw the chart axes")?;
    let dots = per_step.iter().enumerate().flat_map(|(step, row)| {
        let busiest = row.iter().copied().max().unwrap_or(0).max(1) as f64;
        row.iter().enumerate().filter(|(_, b)| **b > 0).map(move |(disk, b)| {
            let radius = (1.0 + 4.0 * (*b as f64 / busiest)).round() as i32;
            Circle::new((step as f64, disk as f64), radius, BLUE.filled())
        })
    });
    chart.draw_series(dots).context("draw points")?;
    root.present().with_context(|| format!("write {}", path.display()))?;
    Ok(())
}
