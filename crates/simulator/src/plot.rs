//! The over-time figure: hit rate (top) and median TTFT (bottom, log scale)
//! per policy, as SVG, and as PNG next to it (`plot_png.rs`).
//!
//! Text is laid out (and, in the PNG, rasterized) by a pure-Rust glyph
//! renderer with a TTF font found on the machine: no fontconfig or freetype.

use crate::error::SimError;
use crate::report::SimReport;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Size of the figure in pixels.
pub const FIGURE_SIZE: (u32, u32) = (1100, 760);

/// Writes the figure for `report` to `path`: `X.svg` writes the SVG and
/// `X.png` next to it; `X.png` writes only the PNG. Both need a TTF font on
/// the machine (see `plot_png.rs`).
/// Returns the files written.
pub fn write_plot(report: &SimReport, path: &Path) -> Result<Vec<std::path::PathBuf>, SimError> {
    let out_err = |message: String| SimError::Output {
        path: path.to_owned(),
        message,
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg") => {
            let mut svg = String::new();
            draw(report, &mut svg).map_err(out_err)?;
            std::fs::write(path, svg).map_err(|e| out_err(e.to_string()))?;
            let mut written = vec![path.to_owned()];
            let png = path.with_extension("png");
            crate::plot_png::write_png(report, &png)?;
            written.push(png);
            Ok(written)
        }
        Some("png") => {
            crate::plot_png::write_png(report, path)?;
            Ok(vec![path.to_owned()])
        }
        _ => Err(out_err(
            "the plot is written as SVG (+ PNG next to it) or PNG: use a .svg or .png file name"
                .into(),
        )),
    }
}

/// Renders the figure into an SVG string.
pub fn draw(report: &SimReport, svg: &mut String) -> Result<(), String> {
    let root = SVGBackend::with_string(svg, FIGURE_SIZE).into_drawing_area();
    draw_on(report, &root)
}

/// Renders the figure on any plotters drawing area.
pub fn draw_on<DB: DrawingBackend>(
    report: &SimReport,
    root: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    crate::plot_png::font().as_ref().map_err(Clone::clone)?;
    let e = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (top, bottom) = root.split_vertically(380);
    let t_max = (report.trace_seconds / 60.0).max(1e-3);
    let title = format!(
        "{} — {} replicas, {} cache blocks each",
        Path::new(&report.trace).file_name().map_or_else(
            || report.trace.clone(),
            |f| f.to_string_lossy().into_owned()
        ),
        report.settings.replicas,
        report.settings.cache_blocks
    );

    let mut hit = ChartBuilder::on(&top)
        .caption(
            format!("{title}: prompt-token cache hit rate"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..t_max, 0f64..1f64)
        .map_err(|x| e(&x))?;
    hit.configure_mesh()
        .x_desc("trace time (minutes)")
        .y_desc("hit rate")
        .draw()
        .map_err(|x| e(&x))?;
    for (i, p) in report.policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        hit.draw_series(LineSeries::new(
            p.series.iter().map(|s| (s.t_seconds / 60.0, s.hit_rate)),
            color.stroke_width(2),
        ))
        .map_err(|x| e(&x))?
        .label(format!("{} ({:.1}%)", p.policy, 100.0 * p.hit_rate))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    hit.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;

    let ttfts = report
        .policies
        .iter()
        .flat_map(|p| p.series.iter().map(|s| s.ttft_p50_ms));
    let (lo, hi) = ttfts.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = (lo.max(1.0) / 2.0).max(1.0);
    let hi = (hi * 2.0).max(lo * 10.0);
    let mut ttft = ChartBuilder::on(&bottom)
        .caption(
            "median time to first token per minute (log scale)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..t_max, (lo..hi).log_scale())
        .map_err(|x| e(&x))?;
    ttft.configure_mesh()
        .x_desc("trace time (minutes)")
        .y_desc("TTFT p50 (ms)")
        .draw()
        .map_err(|x| e(&x))?;
    for (i, p) in report.policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        ttft.draw_series(LineSeries::new(
            p.series
                .iter()
                .map(|s| (s.t_seconds / 60.0, s.ttft_p50_ms.max(lo))),
            color.stroke_width(2),
        ))
        .map_err(|x| e(&x))?
        .label(format!("{} (p50 {:.0} ms)", p.policy, p.ttft_p50_ms))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    ttft.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
