//! Dense arrays stored flat (row-major) with an explicit shape.
//!
//! JSON form: `{"shape": [..], "data": [..]}` with non-finite values as `null`
//! (see [`crate::floats`]). Reading checks that the data fills the shape, so a
//! tensor in memory always has `data.len() == shape.iter().product()`.

use ndarray::{Array, ArrayView, ArrayViewMut, Ix2, Ix3};
use serde::{Deserialize, Serialize};

use crate::error::TraceError;
use crate::floats::same_floats;

/// The form tensors take in JSON, before the shape is checked.
#[derive(Serialize, Deserialize)]
struct RawTensor {
    shape: Vec<usize>,
    #[serde(with = "crate::floats::vec")]
    data: Vec<f32>,
}

fn checked_len(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n))
}

macro_rules! tensor_type {
    ($name:ident, $n:literal, $ix:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Serialize, Deserialize)]
        #[serde(try_from = "RawTensor", into = "RawTensor")]
        pub struct $name {
            shape: [usize; $n],
            data: Vec<f32>,
        }

        impl $name {
            /// A tensor of `shape` from row-major `data`; fails when the
            /// lengths disagree.
            pub fn new(shape: [usize; $n], data: Vec<f32>) -> Result<Self, TraceError> {
                match checked_len(&shape) {
                    Some(n) if n == data.len() => Ok(Self { shape, data }),
                    _ => Err(TraceError::invalid(
                        stringify!($name),
                        format!(
                            "shape {:?} needs {} values, got {}",
                            shape,
                            checked_len(&shape).map_or("too many".to_string(), |n| n.to_string()),
                            data.len()
                        ),
                    )),
                }
            }

            /// A tensor of `shape` filled with `value`.
            pub fn filled(shape: [usize; $n], value: f32) -> Self {
                let n = shape.iter().product();
                Self {
                    shape,
                    data: vec![value; n],
                }
            }

            /// A tensor of zeros.
            pub fn zeros(shape: [usize; $n]) -> Self {
                Self::filled(shape, 0.0)
            }

            /// Copies an ndarray array (any memory layout) into a tensor.
            pub fn from_array(a: &Array<f32, $ix>) -> Self {
                let mut shape = [0usize; $n];
                shape.copy_from_slice(a.shape());
                Self {
                    shape,
                    data: a.iter().copied().collect(),
                }
            }

            /// The shape.
            pub fn shape(&self) -> [usize; $n] {
                self.shape
            }

            /// The row-major values.
            pub fn data(&self) -> &[f32] {
                &self.data
            }

            /// A read-only ndarray view.
            pub fn view(&self) -> ArrayView<'_, f32, $ix> {
                // The constructor and the deserializer both check the length.
                ArrayView::from_shape(self.shape, &self.data)
                    .expect("tensor invariant: data.len() == product of shape")
            }

            /// A mutable ndarray view, for filling the tensor in place.
            pub fn view_mut(&mut self) -> ArrayViewMut<'_, f32, $ix> {
                ArrayViewMut::from_shape(self.shape, &mut self.data)
                    .expect("tensor invariant: data.len() == product of shape")
            }

            /// An owned ndarray copy.
            pub fn to_array(&self) -> Array<f32, $ix> {
                self.view().to_owned()
            }
        }

        impl PartialEq for $name {
            /// Equal shapes and values, with NaN equal to NaN.
            fn eq(&self, other: &Self) -> bool {
                self.shape == other.shape && same_floats(&self.data, &other.data)
            }
        }

        impl TryFrom<RawTensor> for $name {
            type Error = String;
            fn try_from(raw: RawTensor) -> Result<Self, String> {
                let shape: [usize; $n] = raw.shape.as_slice().try_into().map_err(|_| {
                    format!(
                        "field `shape` has {} entries, expected {}",
                        raw.shape.len(),
                        $n
                    )
                })?;
                Self::new(shape, raw.data).map_err(|e| e.to_string())
            }
        }

        impl From<$name> for RawTensor {
            fn from(t: $name) -> Self {
                RawTensor {
                    shape: t.shape.to_vec(),
                    data: t.data,
                }
            }
        }
    };
}

tensor_type!(
    Tensor2,
    2,
    Ix2,
    "A dense 2-D `f32` array (for example layer × prompt bin)."
);
tensor_type!(
    Tensor3,
    3,
    Ix3,
    "A dense 3-D `f32` array (for example layer × decode step × head)."
);

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn view_is_row_major() {
        let t = Tensor3::new([2, 1, 3], vec![0., 1., 2., 3., 4., 5.]).unwrap();
        let v = t.view();
        assert_eq!(v[[0, 0, 2]], 2.0);
        assert_eq!(v[[1, 0, 0]], 3.0);
    }

    #[test]
    fn wrong_length_is_rejected_with_the_shape() {
        let err = Tensor2::new([2, 3], vec![0.0; 5]).unwrap_err().to_string();
        assert!(err.contains("[2, 3]") && err.contains("got 5"), "{err}");
    }

    #[test]
    fn json_with_bad_shape_fails_to_parse() {
        let bad = r#"{"shape":[2,2],"data":[1,2,3]}"#;
        assert!(serde_json::from_str::<Tensor2>(bad).is_err());
        let wrong_rank = r#"{"shape":[4],"data":[1,2,3,4]}"#;
        let err = serde_json::from_str::<Tensor2>(wrong_rank)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected 2"), "{err}");
    }

    #[test]
    fn round_trip_through_json_and_ndarray() {
        let a = array![[1.0f32, f32::NAN], [3.0, 4.0]];
        let t = Tensor2::from_array(&a);
        let back: Tensor2 = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.to_array()[[1, 0]], 3.0);
        let transposed = Tensor2::from_array(&a.t().to_owned());
        assert_eq!(transposed.view()[[0, 1]], 3.0);
    }

    #[test]
    fn view_mut_writes_through() {
        let mut t = Tensor3::zeros([2, 2, 2]);
        t.view_mut()[[1, 1, 0]] = 7.0;
        assert_eq!(t.data()[6], 7.0);
    }
}
