//! MXFP4 against llama.cpp's gguf-py (`fixtures/oracle/mxfp4_reference.py`,
//! whose values equal ggml's own C `dequantize_row_mxfp4` bit for bit):
//! its blocks dequantize to gguf-py's values bit for bit (subnormal and
//! overflowing exponents included), and their products on every level
//! this CPU runs equal the f64 dot of gguf-py's values with the quantized
//! activations. Quantized by lcut (`quantize_mxfp4`, which `lcut synth`
//! writes gpt-oss's experts with), values give gguf-py's blocks byte for
//! byte (`fixtures/oracle/mxfp4_quantize.py`, equal to ggml's C
//! `quantize_row_mxfp4_ref`).

use lcut_kernels::isa::ALL;
use lcut_kernels::quant::{
    Q8Rows, QuantFormat, QuantMatrix, dequantize, matmul, matvec_rows, quantize_mxfp4,
};
use lcut_kernels::testdata::{IsaChecks, Rng, dot_with_q8, le_floats};

const BLOCKS: &[u8] = include_bytes!("../../../fixtures/oracle/mxfp4/blocks.bin");
const VALUES: &[u8] = include_bytes!("../../../fixtures/oracle/mxfp4/values.f32");

const QUANTIZE_INPUT: &[u8] = include_bytes!("../../../fixtures/oracle/mxfp4/quantize_input.f32");
const QUANTIZED: &[u8] = include_bytes!("../../../fixtures/oracle/mxfp4/quantize_blocks.bin");

/// gguf-py's values.
fn reference() -> Vec<f32> {
    le_floats(VALUES)
}

/// lcut's quantizer writes gguf-py's blocks byte for byte: scales from
/// 1e-6 to 1e4, zeros, largest values at and just below a power of two,
/// values halfway between codes (the first code wins), values past the
/// largest code, subnormal values; a length that is not whole blocks, or
/// a buffer of the wrong size, is refused.
#[test]
fn values_quantize_to_gguf_py_blocks() {
    let values = le_floats(QUANTIZE_INPUT);
    let mut got = vec![0u8; QUANTIZED.len()];
    quantize_mxfp4(&values, &mut got).expect("whole blocks");
    for (i, (g, w)) in got.chunks(17).zip(QUANTIZED.chunks(17)).enumerate() {
        assert_eq!(g, w, "block {i}");
    }
    assert!(quantize_mxfp4(&values[..31], &mut got[..17]).is_err());
    assert!(quantize_mxfp4(&values[..32], &mut got[..16]).is_err());
}

#[test]
fn blocks_dequantize_to_gguf_py_values() {
    let format = QuantFormat::Mxfp4;
    assert_eq!(QuantFormat::from_ggml_type(39), Some(format));
    let want = reference();
    assert_eq!(BLOCKS.len() / format.block_bytes() * 32, want.len());
    let mut got = vec![0f32; want.len()];
    dequantize(format, BLOCKS, &mut got).expect("whole blocks");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "value {i}: {g} vs {w}");
    }
    assert!(
        want.iter().any(|v| v.is_infinite()),
        "the edge blocks overflow"
    );
    assert!(
        want.iter()
            .any(|&v| v != 0.0 && v.abs() < f32::MIN_POSITIVE)
    );
}

#[test]
fn products_equal_the_dot_of_gguf_py_values() {
    let mut checks = IsaChecks::new("mxfp4::products_equal_the_dot_of_gguf_py_values");
    // the 32 blocks gguf-py quantized (finite): 4 rows of 256 values
    let (rows, cols) = (4, 256);
    let data = &BLOCKS[..32 * 17];
    let w = &reference()[..rows * cols];
    let m = QuantMatrix::new(QuantFormat::Mxfp4, data, rows, cols).expect("whole blocks");
    let mut rng = Rng::new(50);
    let n = 3;
    let x = rng.normals(n * cols, 1.0);
    let mut q = Q8Rows::new();
    q.quantize(&x, n, cols).expect("whole blocks");
    for isa in ALL {
        if !checks.runs(isa) {
            continue;
        }
        let mut out = vec![0f32; rows * n];
        matvec_rows(isa, &m, &q, 0..rows, &mut out).expect("shapes");
        let mut chunk = vec![0f32; rows * n];
        matmul(isa, &m, &q, &mut chunk, &mut Vec::new()).expect("shapes");
        for r in 0..rows {
            for i in 0..n {
                let (want, mag) = dot_with_q8(&w[r * cols..(r + 1) * cols], &q.row(i));
                for got in [out[r * n + i], chunk[i * rows + r]] {
                    assert!(
                        (f64::from(got) - want).abs() <= 1e-5 * mag + 1e-6,
                        "{} row {r} act {i}: {got} vs {want}",
                        isa.name()
                    );
                }
            }
        }
    }
}
