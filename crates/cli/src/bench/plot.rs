//! `dircache bench ... --plot FILE.svg`: a bench's side-by-side results as horizontal bars of
//! a ratio to a baseline system (native, or for `--ablation` the mount with every optimization
//! on), on a log scale, one group of bars per workload and one colour per system.
//!
//! Drawn with plotters' SVG backend and its built-in text layout estimate: no font files, no
//! fontconfig or freetype (the viewer renders the text). Bars start at 1× (the baseline), so a
//! bar to the right is slower than the baseline and one to the left faster; each bar carries
//! its ratio as text.

use std::fs;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One bar: `value` (a ratio to the baseline) of `series` (a system) in `group` (a workload).
pub struct Bar {
    pub group: String,
    pub series: String,
    pub value: f64,
}

/// What to draw. Groups and series are drawn in the order they first appear in `bars`.
pub struct Chart {
    /// First title line (what is measured).
    pub title: String,
    /// Second and third title lines: the run's parameters (command line, load, date).
    pub subtitle: String,
    /// The value axis' description, e.g. "time / native (log scale)".
    pub axis: String,
    /// The category axis' description, e.g. "workload (cache state)".
    pub groups_axis: String,
    pub bars: Vec<Bar>,
}

/// The run's parameters for a subtitle: the command line as given, the load and the time.
pub fn run_parameters() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let when = jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC");
    format!(
        "dircache {}\nload average {} | {when}",
        args.join(" "),
        super::lookup::loadavg()
    )
}

/// A `--plot` target, opened when the bench starts (so a path that cannot be written fails
/// before minutes of measuring) and written once at the end. Removed if never written.
pub struct PlotFile {
    path: PathBuf,
    file: Option<fs::File>,
}

impl PlotFile {
    pub fn create(path: &Path) -> Result<PlotFile> {
        let file = fs::File::create(path)
            .with_context(|| format!("--plot {}: cannot create the file", path.display()))?;
        Ok(PlotFile {
            path: path.to_path_buf(),
            file: Some(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Render `chart` into the file.
    pub fn write(mut self, chart: &Chart) -> Result<()> {
        let svg = render(chart)?;
        let mut f = self
            .file
            .take()
            .ok_or_else(|| anyhow!("--plot {}: written twice", self.path.display()))?;
        f.write_all(svg.as_bytes())
            .and_then(|()| f.flush())
            .with_context(|| format!("--plot {}: writing", self.path.display()))?;
        Ok(())
    }
}

impl Drop for PlotFile {
    fn drop(&mut self) {
        // Not written (the bench failed): leave no empty file behind.
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Tableau's 10 colours (distinguishable in print and by most colour-blind readers), then 4
/// darker ones for the ablation's 11 variants.
const COLOURS: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 110),
    RGBColor(0, 0, 0),
    RGBColor(120, 180, 120),
    RGBColor(170, 110, 0),
];

/// The category axis: `n` rows of height 1, labelled at their centres.
struct Rows(usize);

impl Ranged for Rows {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let n = self.0.max(1) as f64;
        limit.0 + ((v / n) * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.0 as f64
    }
}

/// Labels come from the chart's own formatter (group names); this one is never shown.
impl ValueFormatter<f64> for Rows {
    fn format(_: &f64) -> String {
        String::new()
    }
}

/// `x` with at most 3 significant decimals and no trailing zeros, then `×`.
fn ratio_label(x: f64) -> String {
    let s = if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}×")
}

fn first_seen(it: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for s in it {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v
}

/// The chart as an SVG document. Bars whose value is not a positive finite number are left
/// out (no ratio: the system failed or has no baseline).
pub fn render(chart: &Chart) -> Result<String> {
    let bars: Vec<&Bar> = chart
        .bars
        .iter()
        .filter(|b| b.value.is_finite() && b.value > 0.0)
        .collect();
    if bars.is_empty() {
        bail!("--plot: no ratio to draw (no baseline system, or every run failed)");
    }
    let groups = first_seen(bars.iter().map(|b| b.group.clone()));
    let series = first_seen(bars.iter().map(|b| b.series.clone()));
    let (ng, ns) = (groups.len(), series.len());

    // Value range: whole decades around 1× and every bar.
    let lo = bars.iter().map(|b| b.value).fold(1.0, f64::min);
    let hi = bars.iter().map(|b| b.value).fold(1.0, f64::max);
    let lo = 10f64.powf(lo.log10().floor()).min(0.5);
    let hi = 10f64.powf(hi.log10().ceil()).max(2.0) * 1.5; // room for the labels

    // Layout in pixels.
    let width: u32 = 1200;
    let bar_px = if ns > 6 { 12u32 } else { 16 };
    let group_px = (ns as u32 * bar_px + 12).max(30);
    let label_chars = groups.iter().map(|g| g.chars().count()).max().unwrap_or(10);
    let label_px = (label_chars as u32 * 8 + 16).clamp(80, 460);
    let legend_per_row = ((width - 40) / 220).max(1) as usize;
    let legend_rows = ns.div_ceil(legend_per_row) as u32;
    let head_px = 84 + legend_rows * 24;
    let height = head_px + ng as u32 * group_px + 70;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| anyhow!("--plot: drawing: {e:?}");
        root.fill(&WHITE).map_err(e)?;
        let (head, body) = root.split_vertically(head_px);
        let centre = Pos::new(HPos::Center, VPos::Top);
        head.draw(&Text::new(
            chart.title.clone(),
            (width as i32 / 2, 8),
            TextStyle::from(("sans-serif", 21).into_font().style(FontStyle::Bold)).pos(centre),
        ))
        .map_err(e)?;
        for (i, line) in chart.subtitle.lines().take(2).enumerate() {
            head.draw(&Text::new(
                line.to_string(),
                (width as i32 / 2, 36 + 18 * i as i32),
                ("sans-serif", 15)
                    .into_font()
                    .color(&RGBColor(70, 70, 70))
                    .pos(centre),
            ))
            .map_err(e)?;
        }
        // Legend: one swatch and name per series, in rows under the title.
        for (i, s) in series.iter().enumerate() {
            let (r, c) = ((i / legend_per_row) as i32, (i % legend_per_row) as i32);
            let x = 20 + c * 220;
            let y = 82 + r * 24;
            let colour = COLOURS[i % COLOURS.len()];
            head.draw(&Rectangle::new([(x, y), (x + 16, y + 14)], colour.filled()))
                .map_err(e)?;
            head.draw(&Text::new(
                s.clone(),
                (x + 22, y + 7),
                TextStyle::from(("sans-serif", 16).into_font())
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(e)?;
        }

        let mut c = ChartBuilder::on(&body)
            .margin_right(30)
            .margin_top(6)
            .x_label_area_size(50)
            .y_label_area_size(label_px)
            .build_cartesian_2d((lo..hi).log_scale(), Rows(ng))
            .map_err(e)?;
        // Light bands on every other group, so a bar is read against its group (under
        // the grid).
        c.draw_series((0..ng).step_by(2).map(|g| {
            let top = (ng - g) as f64;
            Rectangle::new(
                [(lo, top - 1.0), (hi, top)],
                RGBColor(246, 246, 250).filled(),
            )
        }))
        .map_err(e)?;
        c.configure_mesh()
            .disable_y_mesh()
            .x_labels(20)
            .x_desc(chart.axis.clone())
            .y_desc(chart.groups_axis.clone())
            .x_label_formatter(&|v| {
                // 1, 2 and 5 of each decade: the others crowd the decade's top.
                let m = *v / 10f64.powf(v.log10().floor());
                if [1.0, 2.0, 5.0, 10.0].iter().any(|k| (m - k).abs() < 0.01) {
                    ratio_label(*v)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| {
                // Row centres: group 0 at the top.
                let row = (*v - 0.5).round() as usize;
                groups
                    .get(ng.saturating_sub(1 + row))
                    .cloned()
                    .unwrap_or_default()
            })
            .y_labels(ng)
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(205, 205, 205))
            .draw()
            .map_err(e)?;
        let h = 0.84 / ns as f64;
        for (si, s) in series.iter().enumerate() {
            let colour = COLOURS[si % COLOURS.len()];
            let mine: Vec<(usize, f64)> = bars
                .iter()
                .filter(|b| &b.series == s)
                .filter_map(|b| {
                    groups
                        .iter()
                        .position(|g| *g == b.group)
                        .map(|g| (g, b.value))
                })
                .collect();
            let place = |g: usize| {
                let top = (ng - g) as f64 - 0.08 - si as f64 * h;
                (top - h, top)
            };
            c.draw_series(mine.iter().map(|&(g, v)| {
                let (y0, y1) = place(g);
                Rectangle::new([(v.min(1.0), y0), (v.max(1.0), y1)], colour.filled())
            }))
            .map_err(e)?;
            c.draw_series(mine.iter().map(|&(g, v)| {
                let (y0, y1) = place(g);
                let (dx, hp) = if v >= 1.0 {
                    (4, HPos::Left)
                } else {
                    (-4, HPos::Right)
                };
                EmptyElement::at((v, (y0 + y1) / 2.0))
                    + Text::new(
                        ratio_label(v),
                        (dx, 0),
                        TextStyle::from(("sans-serif", 13).into_font())
                            .pos(Pos::new(hp, VPos::Center)),
                    )
            }))
            .map_err(e)?;
        }
        // The baseline.
        c.draw_series(std::iter::once(PathElement::new(
            vec![(1.0, 0.0), (1.0, ng as f64)],
            BLACK.stroke_width(1),
        )))
        .map_err(e)?;
        root.present().map_err(e)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rect_per_bar_plus_frame_legend_and_bands() {
        let mut bars = Vec::new();
        for g in ["find -name (cold)", "du -s (warm)", "ls -lR (cold)"] {
            for (s, v) in [("bindfs", 2.5), ("dircache", 0.4)] {
                bars.push(Bar {
                    group: g.into(),
                    series: s.into(),
                    value: v,
                });
            }
        }
        bars.push(Bar {
            group: "failed".into(),
            series: "dircache".into(),
            value: f64::NAN,
        });
        let svg = render(&Chart {
            title: "t".into(),
            subtitle: "s".into(),
            axis: "time / native".into(),
            groups_axis: "workload".into(),
            bars,
        })
        .unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        // background + 2 legend swatches + 2 bands (groups 0 and 2) + 6 bars
        assert_eq!(svg.matches("<rect").count(), 1 + 2 + 2 + 6, "{svg}");
        for t in [
            "find -name (cold)",
            "bindfs",
            "2.5×",
            "0.4×",
            "time / native",
        ] {
            assert!(svg.contains(t), "{t} missing");
        }
        assert!(!svg.contains("failed"), "a NaN ratio gets no bar nor group");
    }

    #[test]
    fn labels() {
        assert_eq!(ratio_label(1.0), "1×");
        assert_eq!(ratio_label(2.345), "2.35×");
        assert_eq!(ratio_label(12.34), "12.3×");
        assert_eq!(ratio_label(0.05), "0.05×");
        assert_eq!(ratio_label(1500.0), "1500×");
    }
}
