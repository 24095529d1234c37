//! Float sequences that survive JSON: NaN (and infinities) are written as
//! `null` and read back as NaN, and equality treats NaN as equal to NaN.
//!
//! NaN is meaningful in traces (an entropy where no prefill mass was read, a
//! curvature of a span with fewer than three tokens), but JSON has no NaN.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// True when `a` and `b` are equal or both NaN.
pub fn same_float(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// True when the slices have the same length and [`same_float`] elements.
pub fn same_floats(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_float(*x, *y))
}

/// A sequence of `f32` whose JSON form writes non-finite values as `null`.
#[derive(Debug, Clone, Default)]
pub struct Series(pub Vec<f32>);

impl Series {
    /// A series of `n` NaN values (nothing measured yet).
    pub fn nan(n: usize) -> Self {
        Self(vec![f32::NAN; n])
    }

    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        &self.0
    }
}

impl From<Vec<f32>> for Series {
    fn from(v: Vec<f32>) -> Self {
        Self(v)
    }
}

impl std::ops::Deref for Series {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl std::ops::DerefMut for Series {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

impl PartialEq for Series {
    fn eq(&self, other: &Self) -> bool {
        same_floats(&self.0, &other.0)
    }
}

impl Serialize for Series {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        vec::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Series {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        vec::deserialize(d).map(Series)
    }
}

/// A number read from JSON as a 32-bit float: one too large for `f32` is an
/// error, not an infinity (non-finite values are written as `null`, so an
/// infinity read from a number would not survive being written back).
fn narrow<E: serde::de::Error>(x: f64) -> Result<f32, E> {
    let v = x as f32;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(E::custom(format!("{x} is out of range for a 32-bit float")))
    }
}

/// `#[serde(with = "...")]` helpers for one `f32` that must be finite.
pub mod finite {
    use super::*;

    /// Writes the value as a number.
    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f32(*v)
    }

    /// Reads a number that fits in an `f32`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        narrow(f64::deserialize(d)?)
    }
}

/// `#[serde(with = "...")]` helpers for one `f32` that may be NaN.
pub mod scalar {
    use super::*;

    /// Writes a finite value as a number, anything else as `null`.
    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f32(*v)
        } else {
            s.serialize_none()
        }
    }

    /// Reads a number, or `null` as NaN.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        Option::<f64>::deserialize(d)?.map_or(Ok(f32::NAN), narrow)
    }
}

/// `#[serde(with = "...")]` helpers for a `Vec<f32>` that may hold NaN.
pub mod vec {
    use super::*;
    use serde::ser::SerializeSeq;

    /// Writes finite values as numbers, anything else as `null`.
    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for x in v {
            if x.is_finite() {
                seq.serialize_element(x)?;
            } else {
                seq.serialize_element(&Option::<f32>::None)?;
            }
        }
        seq.end()
    }

    /// Reads numbers, and `null` as NaN.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        let raw = Vec::<Option<f64>>::deserialize(d)?;
        raw.into_iter()
            .map(|x| x.map_or(Ok(f32::NAN), narrow))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_round_trips_as_null() {
        let s = Series(vec![1.5, f32::NAN, -0.25, f32::INFINITY]);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, "[1.5,null,-0.25,null]");
        let back: Series = serde_json::from_str(&json).unwrap();
        assert_eq!(back.0[0], 1.5);
        assert!(back.0[1].is_nan());
        assert!(back.0[3].is_nan());
    }

    #[test]
    fn equality_treats_nan_as_equal_but_not_numbers() {
        assert_eq!(Series(vec![f32::NAN, 1.0]), Series(vec![f32::NAN, 1.0]));
        assert_ne!(Series(vec![f32::NAN, 1.0]), Series(vec![0.0, 1.0]));
        assert_ne!(Series(vec![1.0]), Series(vec![1.0, 1.0]));
    }

    #[test]
    fn numbers_past_the_f32_range_are_refused() {
        let err = serde_json::from_str::<Series>("[1, 1e39]").unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
        assert!(serde_json::from_str::<Series>("[1, -1e300]").is_err());
    }

    #[test]
    fn f32_values_round_trip_exactly() {
        let v: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.7131).sin() / 3.0).collect();
        let json = serde_json::to_string(&Series(v.clone())).unwrap();
        let back: Series = serde_json::from_str(&json).unwrap();
        assert!(
            v.iter()
                .zip(back.iter())
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}
