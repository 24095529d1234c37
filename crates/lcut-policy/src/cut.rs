//! The cutoff as written: a layer count, a fraction of depth or a decimal.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;

/// The cutoff as written by a user: a layer count or a fraction of depth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum CutSpec {
    /// Exactly this many lower layers keep the prefill tokens.
    Layers(usize),
    /// This fraction of the depth (in (0, 1]), rounded to the nearest layer.
    Fraction(f64),
}

impl CutSpec {
    /// The cutoff in layers for a model of `num_layers` layers.
    pub fn resolve(&self, num_layers: usize) -> Result<usize, PolicyError> {
        let l_cut = match *self {
            CutSpec::Layers(n) => n,
            CutSpec::Fraction(f) => (f * num_layers as f64).round() as usize,
        };
        if l_cut == 0 || l_cut > num_layers {
            return Err(PolicyError::CutOutOfRange { l_cut, num_layers });
        }
        Ok(l_cut)
    }
}

impl fmt::Display for CutSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CutSpec::Layers(n) => write!(f, "{n}"),
            CutSpec::Fraction(x) => write!(f, "{x}"),
        }
    }
}

pub(crate) fn malformed(text: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::Malformed {
        text: text.to_string(),
        reason: reason.into(),
    }
}

pub(crate) fn parse_cut(text: &str, cut: &str) -> Result<CutSpec, PolicyError> {
    if let Some((num, den)) = cut.split_once('/') {
        let num: f64 = num
            .trim()
            .parse()
            .map_err(|_| malformed(text, format!("numerator {num:?} is not a number")))?;
        let den: f64 = den
            .trim()
            .parse()
            .map_err(|_| malformed(text, format!("denominator {den:?} is not a number")))?;
        if den <= 0.0 || num <= 0.0 || num > den {
            return Err(malformed(text, format!("fraction {cut} is not in (0, 1]")));
        }
        return Ok(CutSpec::Fraction(num / den));
    }
    if let Ok(n) = cut.parse::<usize>() {
        return Ok(CutSpec::Layers(n));
    }
    match cut.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(CutSpec::Fraction(f)),
        Ok(_) => Err(malformed(text, format!("fraction {cut} is not in (0, 1]"))),
        Err(_) => Err(malformed(
            text,
            format!("cutoff {cut:?} is neither a layer count nor a fraction"),
        )),
    }
}
