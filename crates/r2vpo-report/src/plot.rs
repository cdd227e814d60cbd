//! PNG + SVG charts for every command of the project: line charts with
//! optional shaded bands (mean ± std learning curves, Monte-Carlo quantile
//! bands), dashed reference curves, scatter plots with a `y = x` line,
//! overlaid histograms, and grids of small multiples.
//!
//! Text is drawn with the committed DejaVu Sans (`assets/fonts`), embedded in
//! the binary and registered with plotters as `sans-serif`, so rendering
//! never depends on the fonts of the machine. Every image is written
//! atomically (temporary sibling, then rename), like every other report file.
//!
//! On logarithmic axes, points with a non-positive coordinate cannot be
//! placed and are left out of the drawing (they stay in the CSVs).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::io::{atomic_write_string, ReportError};

static FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

/// Registers the embedded font once; later calls return the first outcome.
fn ensure_font() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the embedded DejaVu Sans font could not be parsed".into())
    }
}

/// Colour-blind-friendly qualitative palette (Tableau 10); series pick a
/// colour by index, wrapping around.
const PALETTE: [RGBColor; 10] = [
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
];

fn colour(index: Option<usize>) -> RGBColor {
    index.map_or(BLACK, |i| PALETTE[i % PALETTE.len()])
}

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LineStyle {
    /// A solid line through the points.
    #[default]
    Solid,
    /// A dashed line through the points (reference or approximate curves).
    Dashed,
    /// Unconnected markers (scatter plots).
    Points,
}

/// One curve (or point cloud) of a [`LineChart`].
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Legend text; an empty label keeps the series out of the legend.
    pub label: String,
    /// `(x, y)` points, drawn in order.
    pub points: Vec<(f64, f64)>,
    /// Optional shaded band `(x, lo, hi)` in the series' colour, drawn
    /// beneath all lines (quantile bands, mean ± std).
    pub band: Option<Vec<(f64, f64, f64)>>,
    /// Line style.
    pub style: LineStyle,
    /// Palette index; `None` draws in black.
    pub color: Option<usize>,
}

impl Series {
    /// A solid line.
    pub fn line(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { label: label.into(), points, ..Self::default() }
    }

    /// A dashed line.
    pub fn dashed(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { label: label.into(), points, style: LineStyle::Dashed, ..Self::default() }
    }

    /// A scatter of markers.
    pub fn points(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { label: label.into(), points, style: LineStyle::Points, ..Self::default() }
    }

    /// Sets the palette colour.
    pub fn with_color(mut self, index: usize) -> Self {
        self.color = Some(index);
        self
    }

    /// Adds a shaded band `(x, lo, hi)`.
    pub fn with_band(mut self, band: Vec<(f64, f64, f64)>) -> Self {
        self.band = Some(band);
        self
    }
}

/// A 2-D chart of lines, bands and points; also the panel type of [`Grid`].
#[derive(Clone, Debug)]
pub struct LineChart {
    /// Caption above the plot.
    pub title: String,
    /// x-axis description.
    pub x_label: String,
    /// y-axis description.
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The curves, drawn in order after all bands.
    pub series: Vec<Series>,
    /// Draw a dashed grey `y = x` reference line across the data range
    /// (for scatter plots of a quantity against its bound).
    pub identity_line: bool,
    /// Image size in pixels when saved on its own.
    pub size: (u32, u32),
}

impl LineChart {
    /// An empty linear-axes chart of 900×600 pixels.
    pub fn new(title: impl Into<String>, x_label: impl Into<String>, y_label: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_x: false,
            log_y: false,
            series: Vec::new(),
            identity_line: false,
            size: (900, 600),
        }
    }

    /// Sets both axes' scales.
    pub fn log_axes(mut self, log_x: bool, log_y: bool) -> Self {
        self.log_x = log_x;
        self.log_y = log_y;
        self
    }

    /// Appends a series.
    pub fn push(&mut self, series: Series) -> &mut Self {
        self.series.push(series);
        self
    }

    /// Writes `stem.png` and `stem.svg` (the stem's extension, if any, is
    /// replaced) and returns both paths.
    pub fn save(&self, stem: &Path) -> Result<Vec<PathBuf>, ReportError> {
        save_both(stem, self.size, self)
    }
}

/// Something drawable on any plotters backend (PNG and SVG share the code).
trait Render {
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

impl Render for LineChart {
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_chart(area, self, 1.0)
    }
}

impl Render for Grid {
    fn render<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let (rows, cols) = self.shape();
        let body = match &self.title {
            Some(t) => root.titled(t, ("sans-serif", 28)).map_err(err)?,
            None => root.clone(),
        };
        for (panel, area) in self.panels.iter().zip(body.split_evenly((rows, cols))) {
            draw_chart(&area, panel, 0.85)?;
        }
        Ok(())
    }
}

/// Small multiples: `panels` laid out row-major in `cols` columns (e.g. the
/// paper's Appendix B figure, one panel per divergence).
#[derive(Clone, Debug)]
pub struct Grid {
    /// Optional overall caption.
    pub title: Option<String>,
    /// Number of columns (≥ 1).
    pub cols: usize,
    /// The panels; each keeps its own axes, scales and legend.
    pub panels: Vec<LineChart>,
    /// Size of one panel in pixels.
    pub panel_size: (u32, u32),
}

impl Grid {
    /// A grid of `cols` columns with 600×420-pixel panels.
    pub fn new(cols: usize, panels: Vec<LineChart>) -> Self {
        Self { title: None, cols: cols.max(1), panels, panel_size: (600, 420) }
    }

    fn shape(&self) -> (usize, usize) {
        let cols = self.cols.max(1);
        (self.panels.len().div_ceil(cols).max(1), cols)
    }

    /// Writes `stem.png` and `stem.svg`.
    pub fn save(&self, stem: &Path) -> Result<Vec<PathBuf>, ReportError> {
        let (rows, cols) = self.shape();
        let title_h = if self.title.is_some() { 50 } else { 0 };
        let size = (self.panel_size.0 * cols as u32, self.panel_size.1 * rows as u32 + title_h);
        save_both(stem, size, self)
    }
}

/// A mean curve and its `(x, lo, hi)` band.
pub type Banded = (Vec<(f64, f64)>, Vec<(f64, f64, f64)>);

/// Mean ± (population) std over several curves at each index that every
/// curve has: the mean curve and its `(x, mean − std, mean + std)` band, for
/// learning curves over seeds. The x of each point is the first curve's.
pub fn mean_std_band(curves: &[Vec<(f64, f64)>]) -> Banded {
    let n = curves.iter().map(Vec::len).min().unwrap_or(0);
    let mut mean = Vec::with_capacity(n);
    let mut band = Vec::with_capacity(n);
    for i in 0..n {
        let x = curves[0][i].0;
        let k = curves.len() as f64;
        let m = curves.iter().map(|c| c[i].1).sum::<f64>() / k;
        let s = (curves.iter().map(|c| (c[i].1 - m).powi(2)).sum::<f64>() / k).sqrt();
        mean.push((x, m));
        band.push((x, m - s, m + s));
    }
    (mean, band)
}

/// One distribution of a [`HistogramChart`].
#[derive(Clone, Debug, Default)]
pub struct HistogramSeries {
    /// Legend text.
    pub label: String,
    /// Raw observations; non-finite values are ignored.
    pub values: Vec<f64>,
    /// Palette index (`None`: by position).
    pub color: Option<usize>,
}

/// Several distributions overlaid as step outlines on shared bins (e.g.
/// importance-ratio histograms by staleness).
#[derive(Clone, Debug)]
pub struct HistogramChart {
    /// Caption.
    pub title: String,
    /// x-axis description.
    pub x_label: String,
    /// y-axis description.
    pub y_label: String,
    /// Number of equal-width bins.
    pub bins: usize,
    /// Bin range; `None` spans all finite values. Values outside are ignored.
    pub range: Option<(f64, f64)>,
    /// Normalise each series to a probability density (area 1) so
    /// differently sized samples compare.
    pub density: bool,
    /// Logarithmic count/density axis (empty bins are then left out).
    pub log_y: bool,
    /// The distributions.
    pub series: Vec<HistogramSeries>,
    /// Image size in pixels.
    pub size: (u32, u32),
}

impl HistogramChart {
    /// 50 bins over the data range, densities, linear axes, 900×600.
    pub fn new(title: impl Into<String>, x_label: impl Into<String>, y_label: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            bins: 50,
            range: None,
            density: true,
            log_y: false,
            series: Vec::new(),
            size: (900, 600),
        }
    }

    /// The histogram as step curves on a [`LineChart`], for use in a [`Grid`].
    pub fn to_line_chart(&self) -> LineChart {
        let bins = self.bins.max(1);
        let finite = || self.series.iter().flat_map(|s| s.values.iter().copied()).filter(|v| v.is_finite());
        let (lo, hi) = self.range.unwrap_or_else(|| {
            let lo = finite().fold(f64::INFINITY, f64::min);
            let hi = finite().fold(f64::NEG_INFINITY, f64::max);
            if lo.is_finite() {
                (lo, hi)
            } else {
                (0.0, 1.0)
            }
        });
        let hi = if hi > lo { hi } else { lo + 1.0 };
        let width = (hi - lo) / bins as f64;
        let mut chart = LineChart::new(&self.title, &self.x_label, &self.y_label).log_axes(false, self.log_y);
        chart.size = self.size;
        for (k, s) in self.series.iter().enumerate() {
            let mut counts = vec![0usize; bins];
            let mut n = 0usize;
            for v in s.values.iter().copied().filter(|v| v.is_finite() && *v >= lo && *v <= hi) {
                counts[(((v - lo) / width) as usize).min(bins - 1)] += 1;
                n += 1;
            }
            let scale = if self.density && n > 0 { 1.0 / (n as f64 * width) } else { 1.0 };
            let mut pts = vec![(lo, 0.0)];
            for (i, &c) in counts.iter().enumerate() {
                let h = c as f64 * scale;
                pts.push((lo + i as f64 * width, h));
                pts.push((lo + (i + 1) as f64 * width, h));
            }
            pts.push((hi, 0.0));
            chart.push(Series::line(&s.label, pts).with_color(s.color.unwrap_or(k)));
        }
        chart
    }

    /// Writes `stem.png` and `stem.svg`.
    pub fn save(&self, stem: &Path) -> Result<Vec<PathBuf>, ReportError> {
        self.to_line_chart().save(stem)
    }
}

// ------------------------------------------------------------------ drawing

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Renders with `draw` into `stem.png` (bitmap backend, which encodes PNG
/// itself, into a temporary `.png` sibling renamed into place) and
/// `stem.svg` (rendered to a string, written atomically).
fn save_both<R: Render>(stem: &Path, size: (u32, u32), chart: &R) -> Result<Vec<PathBuf>, ReportError> {
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    let plot_err = |path: &Path, message: String| ReportError::Plot { path: path.to_path_buf(), message };
    ensure_font().map_err(|m| plot_err(&png, m))?;
    if let Some(parent) = png.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| ReportError::Io { path: parent.to_path_buf(), source })?;
    }

    let name = png.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // The encoder picks the format from the extension, so the temp ends in .png.
    let tmp = png.with_file_name(format!(".{name}.{}.tmp.png", std::process::id()));
    let drawn = (|| {
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        chart.render(&root)?;
        root.present().map_err(err)
    })();
    if let Err(message) = drawn {
        let _ = std::fs::remove_file(&tmp);
        return Err(ReportError::Plot { path: png, message });
    }
    std::fs::rename(&tmp, &png).map_err(|source| ReportError::Io { path: png.clone(), source })?;

    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
        let drawn =
            root.fill(&WHITE).map_err(err).and_then(|_| chart.render(&root)).and_then(|_| root.present().map_err(err));
        drawn.map_err(|m| plot_err(&svg, m))?;
    }
    atomic_write_string(&svg, &text)?;
    Ok(vec![png, svg])
}

/// Tick text for logarithmic axes, whose ticks (…, 0.1, 0.2, 0.5, 1, 2, …)
/// need only a few significant digits each: plain decimals in a readable
/// range, else `1e-4` style.
fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if (1e-3..1e5).contains(&a) {
        let s = format!("{v:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        let s = format!("{v:.1e}");
        s.replace(".0e", "e")
    }
}

/// Values within this fraction of a linear axis's span of 0 are labelled 0:
/// plotters builds ticks by floating-point stepping, so the tick at zero of
/// a `-1.1..1.1` axis comes out as `-2.2e-16`.
const ZERO_SNAP: f64 = 1e-9;

/// Tick text on a linear axis spanning `lo..hi`, with the precision the tick
/// spacing needs rather than a fixed one (four decimals printed the ticks of
/// a `1.00009..1.00011` axis as eight times `1.0001`).
///
/// Plotters labels at most 11 ticks (its default), at multiples of a
/// 1-2-5 × 10^k step, so the step is at least span / 12 and its last
/// significant digit sits at or above 10^floor(log10(span / 20)). Printing
/// down to that digit keeps adjacent labels distinct; trailing zeros are
/// trimmed. Axes whose largest magnitude lies in [1e-3, 1e5) get plain
/// decimals, others `1.25e6` style with as many mantissa digits as the step
/// needs.
fn linear_tick_label(v: f64, lo: f64, hi: f64) -> String {
    let span = (hi - lo).abs();
    if !v.is_finite() || !span.is_finite() || span == 0.0 {
        return fmt_tick(v);
    }
    if v.abs() <= span * ZERO_SNAP {
        return "0".into();
    }
    let step_digit = (span / 20.0).log10().floor() as i32;
    let magnitude = lo.abs().max(hi.abs());
    let text = if (1e-3..1e5).contains(&magnitude) {
        let decimals = (-step_digit).max(0) as usize;
        trim_fraction(&format!("{v:.decimals$}")).to_string()
    } else {
        let exponent = v.abs().log10().floor() as i32;
        let digits = (exponent - step_digit).max(0) as usize;
        let text = format!("{v:.digits$e}");
        match text.split_once('e') {
            Some((mantissa, exp)) => format!("{}e{exp}", trim_fraction(mantissa)),
            None => text,
        }
    };
    if text == "-0" {
        "0".into()
    } else {
        text
    }
}

/// `1.2500` → `1.25`, `2.000` → `2`; integers are left alone.
fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

fn visible(c: &LineChart, (x, y): (f64, f64)) -> bool {
    x.is_finite() && y.is_finite() && (!c.log_x || x > 0.0) && (!c.log_y || y > 0.0)
}

/// Spans below this fraction of the values' magnitude are floating-point
/// noise around a constant, not data to zoom into.
const CONSTANT_SPAN: f64 = 1e-9;

/// Data range of one axis with a margin (5 % linear, a fraction of a decade
/// on log axes). A constant (or constant up to rounding noise) linear series
/// gets ±10 % of its value around it, or ±1 around 0, instead of a range as
/// narrow as its noise.
fn axis_range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    if !lo.is_finite() || !hi.is_finite() {
        return if log { (0.1, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        let (l, h) = (lo.log10(), hi.log10());
        let pad = ((h - l) * 0.04).max(0.05);
        return (10f64.powf(l - pad), 10f64.powf(h + pad));
    }
    if hi - lo <= CONSTANT_SPAN * lo.abs().max(hi.abs()) {
        let mid = lo + (hi - lo) / 2.0;
        let d = if mid == 0.0 { 1.0 } else { mid.abs() * 0.1 };
        lo = mid - d;
        hi = mid + d;
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

fn draw_chart<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &LineChart, scale: f64) -> Result<(), String> {
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for s in &c.series {
        for &p in s.points.iter().filter(|&&p| visible(c, p)) {
            xs.push(p.0);
            ys.push(p.1);
        }
        for &(x, lo, hi) in s.band.iter().flatten() {
            for p in [(x, lo), (x, hi)].into_iter().filter(|&p| visible(c, p)) {
                xs.push(p.0);
                ys.push(p.1);
            }
        }
    }
    // Iterations, updates and steps are counts: label them with integers
    // only (plotters' own ticks for a short range fall at 0.2, 0.4, …).
    let integer_x = !c.log_x && !xs.is_empty() && xs.iter().all(|x| x.fract() == 0.0);
    let (x0, x1) = axis_range(xs.into_iter(), c.log_x);
    let (y0, y1) = axis_range(ys.into_iter(), c.log_y);
    match (c.log_x, c.log_y) {
        (false, false) => draw_in(area, c, scale, x0..x1, y0..y1, (x0, x1, y0, y1), integer_x),
        (true, false) => draw_in(area, c, scale, (x0..x1).log_scale(), y0..y1, (x0, x1, y0, y1), integer_x),
        (false, true) => draw_in(area, c, scale, x0..x1, (y0..y1).log_scale(), (x0, x1, y0, y1), integer_x),
        (true, true) => {
            draw_in(area, c, scale, (x0..x1).log_scale(), (y0..y1).log_scale(), (x0, x1, y0, y1), integer_x)
        }
    }
}

fn draw_in<DB, XS, YS>(
    area: &DrawingArea<DB, Shift>,
    c: &LineChart,
    scale: f64,
    x_spec: XS,
    y_spec: YS,
    (x0, x1, y0, y1): (f64, f64, f64, f64),
    integer_x: bool,
) -> Result<(), String>
where
    DB: DrawingBackend,
    XS: AsRangedCoord<Value = f64>,
    YS: AsRangedCoord<Value = f64>,
    XS::CoordDescType: ValueFormatter<f64>,
    YS::CoordDescType: ValueFormatter<f64>,
{
    let px = |v: f64| (v * scale).round() as i32;
    let mut chart = ChartBuilder::on(area)
        .caption(&c.title, ("sans-serif", px(22.0)))
        .margin(px(12.0))
        .x_label_area_size(px(48.0))
        .y_label_area_size(px(72.0))
        .build_cartesian_2d(x_spec, y_spec)
        .map_err(err)?;
    // At most one tick per unit of an integer axis, so plotters' steps
    // (1, 2, 5 × 10ᵏ) stay whole; a tick between integers gets no label.
    let x_ticks = if integer_x { ((x1 - x0).floor() as usize + 1).clamp(2, 10) } else { 10 };
    chart
        .configure_mesh()
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .x_labels(x_ticks)
        .x_label_formatter(&|v| {
            if c.log_x {
                fmt_tick(*v)
            } else if integer_x && (v - v.round()).abs() > 1e-9 * (x1 - x0).abs().max(1.0) {
                String::new()
            } else if integer_x {
                linear_tick_label(v.round(), x0, x1)
            } else {
                linear_tick_label(*v, x0, x1)
            }
        })
        .y_label_formatter(&|v| if c.log_y { fmt_tick(*v) } else { linear_tick_label(*v, y0, y1) })
        .label_style(("sans-serif", px(14.0)))
        .axis_desc_style(("sans-serif", px(16.0)))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(err)?;

    for s in &c.series {
        let Some(band) = &s.band else { continue };
        let col = colour(s.color);
        let pts: Vec<(f64, f64)> = band
            .iter()
            .filter(|&&(x, lo, hi)| visible(c, (x, lo)) && visible(c, (x, hi)))
            .map(|&(x, lo, _)| (x, lo))
            .collect();
        let top: Vec<(f64, f64)> = band
            .iter()
            .filter(|&&(x, lo, hi)| visible(c, (x, lo)) && visible(c, (x, hi)))
            .rev()
            .map(|&(x, _, hi)| (x, hi))
            .collect();
        if pts.len() >= 2 {
            let poly: Vec<(f64, f64)> = pts.into_iter().chain(top).collect();
            chart.draw_series(std::iter::once(Polygon::new(poly, col.mix(0.18).filled()))).map_err(err)?;
        }
    }

    if c.identity_line {
        let lo = x0.max(y0);
        let hi = x1.min(y1);
        if hi > lo {
            let grey = RGBColor(90, 90, 90).stroke_width(px(1.5).max(1) as u32);
            chart
                .draw_series(DashedLineSeries::new(vec![(lo, lo), (hi, hi)], px(6.0), px(4.0), grey))
                .map_err(err)?
                .label("y = x")
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (8, 0)], grey)
                        + PathElement::new(vec![(13, 0), (21, 0)], grey)
                });
        }
    }

    let width = px(2.0).max(1) as u32;
    for s in &c.series {
        let col = colour(s.color);
        let style = col.stroke_width(width);
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(|&p| visible(c, p)).collect();
        let r = px(3.0).max(2);
        // A line through one point draws nothing (a run evaluated once, at
        // its end): mark the point so the series is seen.
        if let [only] = pts[..] {
            if s.style != LineStyle::Points {
                chart.draw_series(std::iter::once(Circle::new(only, r, col.filled()))).map_err(err)?;
            }
        }
        let anno = match s.style {
            LineStyle::Solid => chart.draw_series(LineSeries::new(pts, style)).map_err(err)?,
            LineStyle::Dashed => chart.draw_series(DashedLineSeries::new(pts, px(8.0), px(5.0), style)).map_err(err)?,
            LineStyle::Points => {
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, r, col.mix(0.75).filled()))).map_err(err)?
            }
        };
        if s.label.is_empty() {
            continue;
        }
        // Two segments per legend mark keep one element type for every style.
        let (a, b, mark) = match s.style {
            LineStyle::Solid => ((0, 11), (11, 22), style),
            LineStyle::Dashed => ((0, 8), (13, 21), style),
            LineStyle::Points => ((8, 14), (8, 14), col.stroke_width(2 * r as u32)),
        };
        anno.label(&s.label).legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(a.0, 0), (a.1, 0)], mark)
                + PathElement::new(vec![(b.0, 0), (b.1, 0)], mark)
        });
    }

    if c.identity_line || c.series.iter().any(|s| !s.label.is_empty()) {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", px(14.0)))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_chart(log: bool) -> LineChart {
        let pts: Vec<(f64, f64)> = (1..30).map(|i| (i as f64 * 0.1, (i as f64 * 0.1).powi(2))).collect();
        let band = pts.iter().map(|&(x, y)| (x, 0.8 * y, 1.2 * y)).collect();
        let mut c = LineChart::new("Test chart", "variance of ratio", "divergence").log_axes(log, log);
        c.push(Series::line("exact curve", pts.clone()).with_band(band));
        c.push(Series::dashed("quadratic approx", pts.iter().map(|&(x, y)| (x, 1.1 * y)).collect()).with_color(3));
        c.push(Series::points("samples", pts.iter().step_by(3).copied().collect()));
        c.identity_line = true;
        c
    }

    #[test]
    fn line_chart_writes_png_and_svg() {
        let dir = tempfile::tempdir().unwrap();
        for log in [false, true] {
            let stem = dir.path().join(format!("sub/chart_{log}"));
            let files = sample_chart(log).save(&stem).unwrap();
            assert_eq!(files.len(), 2);
            let png = std::fs::read(&files[0]).unwrap();
            assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
            let svg = std::fs::read_to_string(&files[1]).unwrap();
            assert!(svg.starts_with("<svg") && svg.contains("exact curve") && svg.contains("quadratic approx"));
        }
        let names: Vec<String> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "temporary files left: {names:?}");
    }

    #[test]
    fn grid_and_histogram_render() {
        let dir = tempfile::tempdir().unwrap();
        let mut g = Grid::new(2, vec![sample_chart(false), sample_chart(true), sample_chart(false)]);
        g.title = Some("Six panels".into());
        let files = g.save(&dir.path().join("grid")).unwrap();
        assert!(files.iter().all(|f| f.exists()));

        let mut h = HistogramChart::new("Ratios by staleness", "ratio", "density");
        h.series.push(HistogramSeries {
            label: "fresh".into(),
            values: (0..500).map(|i| 1.0 + (i as f64 / 500.0 - 0.5) * 0.2).collect(),
            color: None,
        });
        h.series.push(HistogramSeries {
            label: "stale".into(),
            values: (0..500).map(|i| 1.0 + (i as f64 / 500.0 - 0.5)).collect(),
            color: None,
        });
        let files = h.save(&dir.path().join("hist")).unwrap();
        let svg = std::fs::read_to_string(&files[1]).unwrap();
        assert!(svg.contains("stale"));
        // Densities integrate to one.
        let lc = h.to_line_chart();
        let area: f64 = lc.series[0].points.windows(2).map(|w| (w[1].0 - w[0].0) * w[0].1.min(w[1].1)).sum();
        assert!((area - 1.0).abs() < 1e-9, "{area}");
    }

    #[test]
    fn ticks_are_readable() {
        assert_eq!(fmt_tick(0.0), "0");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(fmt_tick(1e-4), "1e-4");
        assert_eq!(fmt_tick(2.0), "2");
    }

    /// The labels plotters would print on a linear axis over the data range
    /// of `values`: its own tick positions (11 labels, the mesh default),
    /// through [`axis_range`] and [`linear_tick_label`].
    fn linear_labels(values: &[f64]) -> Vec<String> {
        use plotters::coord::ranged1d::Ranged;
        use plotters::coord::types::RangedCoordf64;
        let (lo, hi) = axis_range(values.iter().copied(), false);
        assert!(hi > lo, "degenerate range {lo}..{hi}");
        let coord: RangedCoordf64 = (lo..hi).into();
        let ticks = coord.key_points(11usize);
        assert!(ticks.len() >= 2, "{ticks:?}");
        ticks.iter().map(|&v| linear_tick_label(v, lo, hi)).collect()
    }

    #[track_caller]
    fn assert_distinct(labels: &[String]) {
        let mut seen = std::collections::HashSet::new();
        assert!(labels.iter().all(|l| seen.insert(l)), "repeated tick labels: {labels:?}");
    }

    #[test]
    fn constant_zero_axis_labels_zero_not_rounding_noise() {
        for values in [&[0.0, 0.0][..], &[0.0], &[-0.0, 0.0, -0.0]] {
            let labels = linear_labels(values);
            assert!(labels.iter().any(|l| l == "0"), "{labels:?}");
            assert!(labels.iter().all(|l| !l.contains('e')), "{labels:?}");
            assert_distinct(&labels);
        }
        // The tick plotters really produces near zero on a -1.1..1.1 axis.
        assert_eq!(linear_tick_label(-2.220446049250313e-16, -1.1, 1.1), "0");
        assert_eq!(linear_tick_label(-0.0, -1.1, 1.1), "0");
    }

    #[test]
    fn narrow_axis_ticks_are_distinct() {
        let labels = linear_labels(&[1.00009, 1.0001, 1.00011]);
        assert!(labels.len() >= 4, "{labels:?}");
        assert_distinct(&labels);
        assert!(labels.iter().all(|l| l.starts_with("1.000")), "{labels:?}");
        for values in [&[1.0001, 1.0001 + 3e-7][..], &[-5e-4, 5e-4], &[1e6, 1e6 + 40.0], &[0.0, 2.5e-5], &[3.0, 1e7]] {
            assert_distinct(&linear_labels(values));
        }
    }

    #[test]
    fn constant_series_get_a_range_around_their_value() {
        assert_eq!(axis_range([0.0, 0.0].into_iter(), false), (-1.1, 1.1));
        let (lo, hi) = axis_range([1.0001; 8].into_iter(), false);
        assert!(lo < 1.0001 && hi > 1.0001 && hi - lo > 0.1, "{lo}..{hi}");
        // Rounding noise is a constant too, not a range to zoom into.
        let (lo, hi) = axis_range([1.0, 1.0 + f64::EPSILON].into_iter(), false);
        assert!(hi - lo > 0.1, "{lo}..{hi}");
        let (lo, hi) = axis_range([-2.0; 3].into_iter(), false);
        assert!(lo < -2.0 && hi > -2.0 && hi - lo > 0.3, "{lo}..{hi}");
        let labels = linear_labels(&[1.0001; 8]);
        assert_distinct(&labels);
        assert!(labels.iter().any(|l| l == "1"), "{labels:?}");
    }

    #[test]
    fn linear_labels_use_the_precision_of_the_spacing() {
        assert_eq!(linear_tick_label(0.5, 0.0, 1.0), "0.5");
        assert_eq!(linear_tick_label(1.0, 0.0, 1.0), "1");
        assert_eq!(linear_tick_label(100.0, 0.0, 500.0), "100");
        assert_eq!(linear_tick_label(1.000095, 1.000088, 1.000112), "1.000095");
        assert_eq!(linear_tick_label(250_000.0, 0.0, 1e6), "2.5e5");
        assert_eq!(linear_tick_label(1_000_020.0, 1e6, 1e6 + 40.0), "1.00002e6");
        assert_eq!(linear_tick_label(1e-4, 0.0, 5e-4), "1e-4");
        assert_eq!(linear_tick_label(1.5e-4, 0.0, 5e-4), "1.5e-4");
    }

    #[test]
    fn rendered_constant_zero_panel_labels_zero() {
        let dir = tempfile::tempdir().unwrap();
        let mut zero = LineChart::new("constant", "step", "value");
        zero.push(Series::line("zero", (0..20).map(|i| (i as f64, 0.0)).collect()));
        let mut ratio = LineChart::new("mean ratio", "step", "ratio");
        ratio.push(Series::line("ratio", (0..20).map(|i| (i as f64, 1.00009 + i as f64 * 1e-6)).collect()));
        let files = Grid::new(2, vec![zero, ratio]).save(&dir.path().join("panels")).unwrap();
        let svg = std::fs::read_to_string(&files[1]).unwrap();
        // The text of every `<text …>label</text>` element.
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>')?.1.split_once("</text>"))
            .map(|t| t.0.trim())
            .collect();
        assert!(texts.contains(&"0"), "no 0 tick label: {texts:?}");
        assert!(texts.iter().all(|t| !t.contains("e-1")), "rounding noise in tick labels: {texts:?}");
        let ratio_ticks: Vec<String> = texts.iter().filter(|t| t.starts_with("1.000")).map(|t| t.to_string()).collect();
        assert!(ratio_ticks.len() >= 4, "{texts:?}");
        assert_distinct(&ratio_ticks);
    }

    /// Every `<text …>label</text>` of an SVG.
    fn svg_texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>')?.1.split_once("</text>"))
            .map(|t| t.0.trim().to_string())
            .collect()
    }

    #[test]
    fn an_axis_of_counts_is_labelled_with_integers() {
        let dir = tempfile::tempdir().unwrap();
        for n in [2usize, 4, 7, 40] {
            let mut c = LineChart::new("few iterations", "iteration", "loss");
            c.push(Series::line("loss", (0..n).map(|i| (i as f64, 10.0 + 0.37 * i as f64)).collect()));
            let files = c.save(&dir.path().join(format!("n{n}"))).unwrap();
            let svg =
                std::fs::read_to_string(files.iter().find(|f| f.extension().is_some_and(|e| e == "svg")).unwrap())
                    .unwrap();
            let texts = svg_texts(&svg);
            // The y axis (10 and up) never reads 0.2 or 1.5; an x axis of
            // plotters' own ticks did, between the integers.
            let xs: Vec<&String> = texts.iter().filter(|t| t.parse::<u64>().is_ok()).collect();
            assert!(xs.len() >= 2, "n = {n}: {texts:?}");
            assert!(texts.iter().all(|t| !["0.2", "0.4", "1.5", "2.5"].contains(&t.as_str())), "n = {n}: {texts:?}");
        }
    }

    #[test]
    fn a_single_point_line_is_drawn_as_a_mark() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LineChart::new("held-out", "iteration", "avg@k");
        c.push(Series::line("one eval", vec![(6.0, 0.2)]).with_color(0));
        let files = Grid::new(1, vec![c]).save(&dir.path().join("one")).unwrap();
        let svg = files.iter().find(|f| f.extension().is_some_and(|e| e == "svg")).unwrap();
        let svg = std::fs::read_to_string(svg).unwrap();
        assert!(svg.contains("<circle"), "the lone point is not drawn: {svg}");
    }
}
