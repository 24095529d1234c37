//! One heatmap in an `egui_plot` plot: the grid becomes a texture shown as a
//! single `PlotImage`, so drawing costs one quad however many cells there are,
//! and the texture is rebuilt only when the visible columns change.
//!
//! Layers run up the y axis (layer `l` spans `y ∈ [l, l + 1)`), so the line
//! for a cutoff `c` sits at `y = c`: below it the layers that keep the prompt.

use egui::{Color32, ColorImage, TextureHandle, TextureOptions, Ui, Vec2b};
use egui_plot::{HLine, LineStyle, Plot, PlotImage, PlotPoint, PlotTransform, PlotUi, Polygon};

use crate::colormap::ValueRange;
use crate::grid::{Grid, PositionIndex};
use crate::theme::SHADE;

/// What a heatmap draws: a grid over an x extent, possibly re-binned to the
/// visible x range.
pub trait GridSource {
    /// The full x extent of the data.
    fn x_extent(&self) -> (f64, f64);
    /// Rows (layers).
    fn rows(&self) -> usize;
    /// A grid covering `[x0, x1)` (inside the extent) with about `cols`
    /// columns; returns the x range it actually covers.
    fn grid(&self, x0: f64, x1: f64, cols: usize) -> (f64, f64, Grid);
    /// Whether [`GridSource::grid`] depends on the requested range (large
    /// sources); fixed grids are built once.
    fn rebins(&self) -> bool;
    /// The hover text at data x and layer `row`.
    fn hover(&self, x: f64, row: usize) -> Option<String>;
}

/// A fixed grid whose column `c` spans `x ∈ [x0 + c, x0 + c + 1)`.
pub struct FixedGrid<'a, F: Fn(usize, usize, f32) -> String> {
    /// The grid.
    pub grid: &'a Grid,
    /// Where column 0 starts.
    pub x0: f64,
    /// Hover text from (row, column, value).
    pub hover: F,
}

impl<F: Fn(usize, usize, f32) -> String> GridSource for FixedGrid<'_, F> {
    fn x_extent(&self) -> (f64, f64) {
        (self.x0, self.x0 + self.grid.cols as f64)
    }
    fn rows(&self) -> usize {
        self.grid.rows
    }
    fn grid(&self, _x0: f64, _x1: f64, _cols: usize) -> (f64, f64, Grid) {
        let (a, b) = self.x_extent();
        (a, b, self.grid.clone())
    }
    fn rebins(&self) -> bool {
        false
    }
    fn hover(&self, x: f64, row: usize) -> Option<String> {
        let c = (x - self.x0).floor();
        if c < 0.0 || c as usize >= self.grid.cols || row >= self.grid.rows {
            return None;
        }
        let c = c as usize;
        Some((self.hover)(row, c, self.grid.get(row, c)))
    }
}

/// The layer × prompt-position map of one trace, re-binned to the screen.
/// Position 0 (BoS) is left out: it is shown apart.
pub struct PositionGrid<'a> {
    /// The cumulative index.
    pub index: &'a PositionIndex,
    /// Token strings (may be empty).
    pub tokens: &'a [String],
}

impl GridSource for PositionGrid<'_> {
    fn x_extent(&self) -> (f64, f64) {
        (1.0, self.index.prompt_len().max(2) as f64)
    }
    fn rows(&self) -> usize {
        self.index.layers()
    }
    fn grid(&self, x0: f64, x1: f64, cols: usize) -> (f64, f64, Grid) {
        // Never more columns than positions: one column per token at most.
        let cols = cols.min((x1 - x0).ceil().max(1.0) as usize);
        (x0, x1, self.index.rebin(x0, x1, cols))
    }
    fn rebins(&self) -> bool {
        true
    }
    fn hover(&self, x: f64, row: usize) -> Option<String> {
        let (a, b) = self.x_extent();
        if x < a || x >= b || row >= self.rows() {
            return None;
        }
        let pos = x.floor() as usize;
        let token = self
            .tokens
            .get(pos)
            .map_or(String::new(), |t| format!(" {t:?}"));
        let d = self.index.density(row, pos as f64, pos as f64 + 1.0);
        Some(format!(
            "layer {row}, position {pos}{token}\nattention per token {d:.3e}"
        ))
    }
}

/// What is cached between frames for one heatmap.
#[derive(Default)]
pub struct HeatmapCache {
    style: Option<Style>,
    texture: Option<TextureHandle>,
    /// x range and column count of the texture.
    placed: Option<Placed>,
    /// Textures built so far (for tests and the frame-time note).
    pub rebuilds: u64,
    /// Where the plot was drawn last frame.
    pub last_rect: Option<egui::Rect>,
}

impl HeatmapCache {
    /// Size `[columns, rows]` of the texture on screen: what was actually
    /// handed to the GPU, however large the data.
    pub fn texture_size(&self) -> Option<[usize; 2]> {
        self.texture.as_ref().map(TextureHandle::size)
    }

    /// The x range the texture covers.
    pub fn placed(&self) -> Option<(f64, f64)> {
        self.placed.map(|p| (p.x0, p.x1))
    }
}

/// How a heatmap is labelled and which cut lines it shows.
pub struct HeatmapOptions<'a> {
    /// Plot id (unique in the window).
    pub id: &'a str,
    /// x axis title.
    pub x_label: &'a str,
    /// Plot height in points.
    pub height: f32,
    /// Colour range and scale.
    pub range: ValueRange,
    /// Identifies the data: a change rebuilds the texture.
    pub data_key: u64,
    /// Horizontal lines at cut `c` with colour, name and dashing.
    pub cuts: Vec<CutLine>,
    /// Regions `[x0, x1, y0, y1]` (data x, layers) shaded over the map,
    /// with their name (SlimInfer's pruned positions).
    pub shade: Option<(String, Vec<[f64; 4]>)>,
}

/// A horizontal line at cut `c`: the cut, colour, name and whether it is dashed.
pub type CutLine = (usize, Color32, String, bool);

/// What the colours depend on besides the x range.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Style {
    data: u64,
    range: [f32; 2],
    log: bool,
}

/// Where a texture sits on the x axis.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Placed {
    x0: f64,
    x1: f64,
    cols: usize,
}

/// Share of the visible width added on each side when re-binning, so a pan
/// of up to this much reuses the texture.
const MARGIN: f64 = 0.5;

/// The visible part of the extent (the whole extent when the bounds miss it).
fn visible(bounds: [f64; 2], extent: (f64, f64)) -> (f64, f64) {
    let (e0, e1) = extent;
    let (a, b) = (bounds[0].max(e0), bounds[1].min(e1));
    if a < b && a.is_finite() && b.is_finite() {
        (a, b)
    } else {
        (e0, e1)
    }
}

/// Columns per data unit wanted for `width_px` pixels over `(a, b)`: one
/// per pixel, but never more than one per position.
fn density_wanted(a: f64, b: f64, width_px: f32) -> f64 {
    (f64::from(width_px.max(64.0)) / (b - a)).min(1.0)
}

/// The x range and column count to bin for the visible bounds: the visible
/// part of the extent plus [`MARGIN`] on each side, snapped to whole
/// positions, at one column per pixel (at most one per position).
fn wanted(bounds: [f64; 2], extent: (f64, f64), width_px: f32) -> Placed {
    let (a, b) = visible(bounds, extent);
    let margin = MARGIN * (b - a);
    let x0 = (a - margin).max(extent.0).floor().max(extent.0);
    let x1 = (b + margin).min(extent.1).ceil().min(extent.1);
    let cols = ((x1 - x0) * density_wanted(a, b, width_px)).ceil().max(1.0) as usize;
    Placed { x0, x1, cols }
}

/// Whether the texture at `p` still serves the visible bounds: it covers
/// them, and its resolution is within a factor of 1.5 of the wanted one.
fn still_good(p: &Placed, bounds: [f64; 2], extent: (f64, f64), width_px: f32) -> bool {
    let (a, b) = visible(bounds, extent);
    let covered = p.x0 <= a && b <= p.x1;
    let have = p.cols as f64 / (p.x1 - p.x0);
    let ratio = have / density_wanted(a, b, width_px);
    covered && (1.0 / 1.5..=1.5).contains(&ratio)
}

fn to_image(grid: &Grid, range: &ValueRange) -> ColorImage {
    let (w, h) = (grid.cols.max(1), grid.rows.max(1));
    let colorizer = range.colorizer();
    let mut pixels = Vec::with_capacity(w * h);
    // Image row 0 is the top: the last layer.
    for r in (0..h).rev() {
        for c in 0..w {
            pixels.push(colorizer.color(grid.get(r, c)));
        }
    }
    ColorImage::new([w, h], pixels)
}

/// Builds or reuses the texture for the bounds of the last frame.
fn ensure_texture(
    ctx: &egui::Context,
    cache: &mut HeatmapCache,
    src: &dyn GridSource,
    opts: &HeatmapOptions<'_>,
    bounds: [f64; 2],
    width_px: f32,
) {
    let extent = src.x_extent();
    let style = Style {
        data: opts.data_key,
        range: [opts.range.lo, opts.range.hi],
        log: opts.range.scale == crate::colormap::ColorScale::Log,
    };
    let reuse = cache.texture.is_some()
        && cache.style == Some(style)
        && cache
            .placed
            .is_some_and(|p| !src.rebins() || still_good(&p, bounds, extent, width_px));
    if reuse {
        return;
    }
    let want = if src.rebins() {
        wanted(bounds, extent, width_px)
    } else {
        Placed {
            x0: extent.0,
            x1: extent.1,
            cols: 0,
        }
    };
    let (gx0, gx1, grid) = src.grid(want.x0, want.x1, want.cols);
    let image = to_image(&grid, &opts.range);
    match &mut cache.texture {
        Some(t) if t.size() == image.size => t.set(image, TextureOptions::NEAREST),
        _ => {
            cache.texture =
                Some(ctx.load_texture(opts.id.to_string(), image, TextureOptions::NEAREST));
        }
    }
    cache.style = Some(style);
    cache.placed = Some(Placed {
        x0: gx0,
        x1: gx1,
        cols: grid.cols,
    });
    cache.rebuilds += 1;
}

/// Shows `src` as a heatmap and returns the plot's response. x pans and zooms;
/// layers stay fixed.
pub fn show_heatmap(
    ui: &mut Ui,
    cache: &mut HeatmapCache,
    src: &dyn GridSource,
    opts: &HeatmapOptions<'_>,
) -> egui::Response {
    show_heatmap_with(ui, cache, src, opts, |_| {}).response
}

/// What a heatmap drawn by [`show_heatmap_with`] reports back.
pub struct HeatmapResponse {
    /// The plot's response (hover text attached).
    pub response: egui::Response,
    /// The data point under the pointer, when it is over the plot.
    pub pointer: Option<PlotPoint>,
    /// Data to screen, as drawn.
    pub transform: PlotTransform,
}

/// [`show_heatmap`] with `overlay` drawing more items over the map (under
/// the cut lines), reporting the pointer in data coordinates and the
/// transform.
pub fn show_heatmap_with(
    ui: &mut Ui,
    cache: &mut HeatmapCache,
    src: &dyn GridSource,
    opts: &HeatmapOptions<'_>,
    overlay: impl FnOnce(&mut PlotUi<'_>),
) -> HeatmapResponse {
    let extent = src.x_extent();
    let rows = src.rows();
    let plot = Plot::new(opts.id)
        .height(opts.height)
        .default_x_bounds(extent.0, extent.1)
        .default_y_bounds(0.0, rows as f64)
        .allow_zoom(Vec2b::new(true, false))
        .allow_drag(Vec2b::new(true, false))
        .allow_scroll(Vec2b::new(true, false))
        .allow_boxed_zoom(false)
        .show_grid(false)
        .show_x(false)
        .show_y(false)
        .x_axis_label(opts.x_label)
        .y_axis_label("layer")
        .label_formatter(|_| None);
    let ctx = ui.ctx().clone();
    let result = plot.show(ui, |pui| {
        let b = pui.plot_bounds();
        let width = pui.transform().frame().width();
        ensure_texture(&ctx, cache, src, opts, [b.min()[0], b.max()[0]], width);
        if let (Some(t), Some(p)) = (&cache.texture, cache.placed) {
            let center = PlotPoint::new((p.x0 + p.x1) / 2.0, rows as f64 / 2.0);
            let size = egui::vec2((p.x1 - p.x0) as f32, rows as f32);
            pui.image(PlotImage::new(opts.id.to_string(), t.id(), center, size));
        }
        if let Some((name, rects)) = &opts.shade {
            for r in rects {
                pui.polygon(rect_polygon(name, *r, SHADE));
            }
        }
        overlay(pui);
        for (c, color, name, dashed) in &opts.cuts {
            let style = if *dashed {
                LineStyle::dashed_loose()
            } else {
                LineStyle::Solid
            };
            pui.hline(
                HLine::new(name.clone(), *c as f64)
                    .color(*color)
                    .width(2.0)
                    .style(style),
            );
        }
        pui.pointer_coordinate()
    });
    // The bounds moved since the grid was binned: bin again next frame.
    if src.rebins() {
        let b = result.transform.bounds();
        let width = result.transform.frame().width();
        if cache
            .placed
            .is_some_and(|p| !still_good(&p, [b.min()[0], b.max()[0]], extent, width))
        {
            ctx.request_repaint();
        }
    }
    cache.last_rect = Some(result.response.rect);
    let mut response = result.response;
    if let Some(p) = result.inner
        && response.hovered()
        && p.y >= 0.0
        && let Some(text) = src.hover(p.x, p.y.floor() as usize)
    {
        response = response.on_hover_text_at_pointer(text);
    }
    HeatmapResponse {
        response,
        pointer: result.inner,
        transform: result.transform,
    }
}

/// A filled rectangle `[x0, x1, y0, y1]` as a plot polygon.
pub fn rect_polygon(name: &str, r: [f64; 4], fill: Color32) -> Polygon<'static> {
    let [x0, x1, y0, y1] = r;
    Polygon::new(name, vec![[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
        .fill_color(fill)
        .width(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wanted_covers_the_view_with_margins_inside_the_extent() {
        let e = (1.0, 100_000.0);
        let p = wanted([1000.0, 2000.0], e, 500.0);
        assert_eq!((p.x0, p.x1, p.cols), (500.0, 2500.0, 1000));
        // Outside the extent: the whole extent.
        let p = wanted([-50.0, -10.0], e, 500.0);
        assert_eq!((p.x0, p.x1), e);
        // Zoomed in past one position per pixel: one column per position.
        let p = wanted([1000.0, 1100.0], e, 500.0);
        assert_eq!((p.x0, p.x1, p.cols), (950.0, 1150.0, 200));
    }

    #[test]
    fn small_pans_reuse_the_texture_zooms_do_not() {
        let e = (1.0, 100_000.0);
        let p = wanted([1000.0, 2000.0], e, 500.0);
        assert!(still_good(&p, [1000.0, 2000.0], e, 500.0));
        assert!(still_good(&p, [1400.0, 2400.0], e, 500.0));
        assert!(!still_good(&p, [1600.0, 2600.0], e, 500.0));
        assert!(!still_good(&p, [1200.0, 1700.0], e, 500.0));
        assert!(!still_good(&p, [600.0, 2400.0], e, 500.0));
    }

    #[test]
    fn images_put_the_last_layer_on_top() {
        let g = Grid {
            rows: 2,
            cols: 1,
            values: vec![0.0, 1.0],
        };
        let r = ValueRange::of([0.0, 1.0], crate::colormap::ColorScale::Linear);
        let img = to_image(&g, &r);
        assert_eq!(img.pixels[0], crate::colormap::palette(1.0));
        assert_eq!(img.pixels[1], crate::colormap::palette(0.0));
    }
}
