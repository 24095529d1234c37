//! Colour scales (linear or log) onto a viridis-like palette, and the colour
//! legend drawn beside each heatmap.

use egui::{Color32, Sense, Ui, Vec2};

pub use crate::settings::ColorScale;
use crate::theme::MISSING;

/// Viridis anchors, low to high.
const VIRIDIS: [[u8; 3]; 9] = [
    [0x44, 0x01, 0x54],
    [0x47, 0x2c, 0x7a],
    [0x3b, 0x51, 0x8b],
    [0x2c, 0x71, 0x8e],
    [0x21, 0x90, 0x8d],
    [0x27, 0xad, 0x81],
    [0x5c, 0xc8, 0x63],
    [0xaa, 0xdc, 0x32],
    [0xfd, 0xe7, 0x25],
];

/// The palette colour at `t` in `[0, 1]` (clamped).
pub fn palette(t: f32) -> Color32 {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let x = t * (VIRIDIS.len() - 1) as f32;
    let i = (x.floor() as usize).min(VIRIDIS.len() - 2);
    let f = x - i as f32;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    let mix = |k: usize| (f32::from(a[k]) + (f32::from(b[k]) - f32::from(a[k])) * f).round() as u8;
    Color32::from_rgb(mix(0), mix(1), mix(2))
}

/// A value range under a scale: maps values to `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueRange {
    /// Low end (values at or below get the first colour).
    pub lo: f32,
    /// High end.
    pub hi: f32,
    /// The scale.
    pub scale: ColorScale,
}

/// Smallest share of the maximum a log scale shows apart from zero.
const LOG_DECADES: f32 = 4.0;

impl ValueRange {
    /// The range for finite values in `values` (NaN skipped). The log scale
    /// starts at the smallest positive value, but at most four decades below
    /// the maximum.
    pub fn of(values: impl IntoIterator<Item = f32>, scale: ColorScale) -> Self {
        let mut hi = f32::NEG_INFINITY;
        let mut lo = f32::INFINITY;
        let mut lo_pos = f32::INFINITY;
        for v in values.into_iter().filter(|v| v.is_finite()) {
            hi = hi.max(v);
            lo = lo.min(v);
            if v > 0.0 {
                lo_pos = lo_pos.min(v);
            }
        }
        if !hi.is_finite() {
            return Self {
                lo: 0.0,
                hi: 1.0,
                scale,
            };
        }
        match scale {
            ColorScale::Linear => {
                let lo = lo.min(0.0);
                let hi = if hi > lo { hi } else { lo + 1.0 };
                Self { lo, hi, scale }
            }
            ColorScale::Log => {
                let hi = if hi > 0.0 { hi } else { 1.0 };
                let floor = hi * 10f32.powf(-LOG_DECADES);
                let lo = if lo_pos.is_finite() {
                    lo_pos.max(floor)
                } else {
                    floor
                };
                let lo = if lo < hi { lo } else { hi / 10.0 };
                Self { lo, hi, scale }
            }
        }
    }

    /// `v` mapped to `[0, 1]` (NaN stays NaN).
    pub fn unit(&self, v: f32) -> f32 {
        if v.is_nan() {
            return f32::NAN;
        }
        let t = match self.scale {
            ColorScale::Linear => (v - self.lo) / (self.hi - self.lo),
            ColorScale::Log => {
                let v = v.max(self.lo);
                (v / self.lo).log10() / (self.hi / self.lo).log10()
            }
        };
        t.clamp(0.0, 1.0)
    }

    /// The colour of `v`.
    pub fn color(&self, v: f32) -> Color32 {
        if v.is_nan() {
            MISSING
        } else {
            palette(self.unit(v))
        }
    }

    /// A fast colour mapper for many cells: the scale folded into one
    /// multiply-add (after `ln` for the log scale) and a 256-entry palette.
    pub fn colorizer(&self) -> Colorizer {
        let mut lut = [Color32::BLACK; 256];
        for (i, c) in lut.iter_mut().enumerate() {
            *c = palette(i as f32 / 255.0);
        }
        let (x0, x1) = match self.scale {
            ColorScale::Linear => (self.lo, self.hi),
            ColorScale::Log => (self.lo.ln(), self.hi.ln()),
        };
        let a = 1.0 / (x1 - x0);
        Colorizer {
            lut,
            lo: self.lo,
            log: self.scale == ColorScale::Log,
            a,
            b: -x0 * a,
        }
    }

    /// The value at `t` in `[0, 1]` (the inverse of [`ValueRange::unit`]).
    pub fn value_at(&self, t: f32) -> f32 {
        match self.scale {
            ColorScale::Linear => self.lo + t * (self.hi - self.lo),
            ColorScale::Log => self.lo * (self.hi / self.lo).powf(t),
        }
    }
}

/// Maps values to colours like [`ValueRange::color`], quantised to 256 levels.
pub struct Colorizer {
    lut: [Color32; 256],
    lo: f32,
    log: bool,
    a: f32,
    b: f32,
}

impl Colorizer {
    /// The colour of `v` ([`MISSING`](crate::theme::MISSING) for NaN).
    pub fn color(&self, v: f32) -> Color32 {
        if v.is_nan() {
            return MISSING;
        }
        let x = if self.log { v.max(self.lo).ln() } else { v };
        let t = (x * self.a + self.b).clamp(0.0, 1.0);
        self.lut[(t * 255.0 + 0.5) as usize]
    }
}

/// A compact number for legends and tables: 3 significant digits.
pub fn short_number(v: f32) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 0.01 && v.abs() < 1000.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

/// Draws a horizontal colour bar with its low, middle and high values.
pub fn show_legend(ui: &mut Ui, title: &str, range: &ValueRange) {
    ui.horizontal(|ui| {
        ui.label(format!("{title} ({}):", range.scale.label().to_lowercase()));
        ui.label(short_number(range.lo));
        let (rect, _) = ui.allocate_exact_size(Vec2::new(160.0, 12.0), Sense::hover());
        let painter = ui.painter_at(rect);
        let n = 64;
        for i in 0..n {
            let t0 = i as f32 / n as f32;
            let t1 = (i + 1) as f32 / n as f32;
            let r = egui::Rect::from_min_max(
                egui::pos2(rect.left() + t0 * rect.width(), rect.top()),
                egui::pos2(rect.left() + t1 * rect.width(), rect.bottom()),
            );
            painter.rect_filled(r, 0.0, palette((t0 + t1) / 2.0));
        }
        ui.label(short_number(range.hi));
        ui.label(
            egui::RichText::new(format!("(middle {})", short_number(range.value_at(0.5)))).weak(),
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn palette_ends_are_viridis() {
        assert_eq!(palette(0.0), Color32::from_rgb(0x44, 0x01, 0x54));
        assert_eq!(palette(1.0), Color32::from_rgb(0xfd, 0xe7, 0x25));
        assert_eq!(palette(f32::NAN), palette(0.0));
    }

    #[test]
    fn linear_and_log_ranges() {
        let v = [0.0, 0.001, 0.01, 0.1, 1.0, f32::NAN];
        let lin = ValueRange::of(v, ColorScale::Linear);
        assert_eq!((lin.lo, lin.hi), (0.0, 1.0));
        assert!((lin.unit(0.5) - 0.5).abs() < 1e-6);
        let log = ValueRange::of(v, ColorScale::Log);
        assert!((log.lo - 0.001).abs() < 1e-9);
        // 0.01 is one decade of three above the floor.
        assert!((log.unit(0.01) - 1.0 / 3.0).abs() < 1e-5);
        assert_eq!(log.unit(0.0), 0.0);
        assert!(log.unit(f32::NAN).is_nan());
        assert!((log.value_at(log.unit(0.1)) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn the_colorizer_agrees_with_the_exact_mapping() {
        for scale in [ColorScale::Linear, ColorScale::Log] {
            let r = ValueRange::of([1e-4, 0.3, 1.0], scale);
            let c = r.colorizer();
            for v in [0.0, 1e-5, 1e-4, 3e-3, 0.05, 0.3, 0.99, 1.0, 2.0] {
                let (a, b) = (c.color(v), r.color(v));
                let close = |x: u8, y: u8| x.abs_diff(y) <= 3;
                assert!(
                    close(a.r(), b.r()) && close(a.g(), b.g()) && close(a.b(), b.b()),
                    "{scale:?} {v}: {a:?} vs {b:?}"
                );
            }
            assert_eq!(c.color(f32::NAN), MISSING);
        }
    }

    #[test]
    fn log_floor_is_four_decades() {
        let r = ValueRange::of([1e-9, 1.0], ColorScale::Log);
        assert!((r.lo - 1e-4).abs() < 1e-9);
        let empty = ValueRange::of([f32::NAN], ColorScale::Log);
        assert!(empty.hi > empty.lo);
    }
}
