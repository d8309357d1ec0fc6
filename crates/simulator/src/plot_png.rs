//! The figure as PNG: plotters' bitmap backend into an RGB buffer, text
//! rasterized by ab_glyph (pure Rust, no fontconfig or freetype), encoded
//! with the `png` crate. The font is a TTF file found on the machine
//! (`INFERENCECACHE_PLOT_FONT`, else the usual DejaVu/Liberation paths), read
//! once and registered for the process.

use crate::error::SimError;
use crate::plot::{FIGURE_SIZE, draw_on};
use crate::report::SimReport;
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// Where TTF sans fonts usually are (Debian/Ubuntu, Fedora, Arch, macOS).
const FONT_PATHS: [&str; 6] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// The registered font's path, or why there is none. Every backend needs
/// it: with a glyph renderer compiled in, plotters measures text with the
/// registered font even for SVG.
pub(crate) fn font() -> &'static Result<String, String> {
    static FONT: OnceLock<Result<String, String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates = std::env::var("INFERENCECACHE_PLOT_FONT")
            .into_iter()
            .chain(FONT_PATHS.iter().map(|p| (*p).to_owned()));
        for path in candidates {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            // Registered fonts live for the process: the figure may be drawn
            // more than once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(path);
            }
        }
        Err(format!(
            "no TTF font for the PNG's text: install fonts-dejavu-core or set \
             INFERENCECACHE_PLOT_FONT to a .ttf file (looked in {})",
            FONT_PATHS.join(", ")
        ))
    })
}

/// Writes the figure for `report` to `path` as PNG.
pub(crate) fn write_png(report: &SimReport, path: &Path) -> Result<(), SimError> {
    let out_err = |message: String| SimError::Output {
        path: path.to_owned(),
        message,
    };
    font().as_ref().map_err(|e| out_err(e.clone()))?;
    let (w, h) = FIGURE_SIZE;
    let mut rgb = vec![0u8; (w as usize) * (h as usize) * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, FIGURE_SIZE).into_drawing_area();
        draw_on(report, &root).map_err(out_err)?;
    }
    let file = std::fs::File::create(path).map_err(|e| out_err(e.to_string()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut writer| writer.write_image_data(&rgb))
        .map_err(|e| out_err(e.to_string()))
}
