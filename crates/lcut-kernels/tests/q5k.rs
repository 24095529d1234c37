//! Q5_K against llama.cpp's gguf-py (`fixtures/oracle/q5k_reference.py`):
//! its blocks dequantize to gguf-py's values bit for bit, in the file's
//! layout and interleaved, and their products on every level this CPU runs
//! (row products, interleaved products, the chunk product's tile) equal the
//! f64 dot of gguf-py's values with the quantized activations. A row that
//! is not whole blocks, or bytes that are not whole rows, are errors.

use lcut_kernels::KernelError;
use lcut_kernels::isa::ALL;
use lcut_kernels::quant::{
    PackedMatrix, Q8Rows, QuantFormat, QuantMatrix, dequantize, matmul, matvec_rows,
};
use lcut_kernels::testdata::{IsaChecks, Rng, dot_with_q8, le_floats};

const BLOCKS: &[u8] = include_bytes!("../../../fixtures/oracle/q5k/blocks.bin");
const VALUES: &[u8] = include_bytes!("../../../fixtures/oracle/q5k/values.f32");

/// gguf-py's values.
fn reference() -> Vec<f32> {
    le_floats(VALUES)
}

#[test]
fn blocks_dequantize_to_gguf_py_values() {
    let format = QuantFormat::Q5K;
    assert_eq!(QuantFormat::from_ggml_type(13), Some(format));
    assert_eq!((format.name(), format.ggml_type()), ("Q5_K", 13));
    assert_eq!((format.block_len(), format.block_bytes()), (256, 176));
    let want = reference();
    assert_eq!(BLOCKS.len() / format.block_bytes() * 256, want.len());
    let mut got = vec![0f32; want.len()];
    dequantize(format, BLOCKS, &mut got).expect("whole blocks");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "value {i}: {g} vs {w}");
    }
    // the edge block whose every value is 31 under the largest scales
    assert!(want.iter().any(|&v| v != 0.0));
    // the interleaved copy's rows dequantize to the same bits
    let (rows, cols) = (2, 8 * 256);
    let m = QuantMatrix::new(format, BLOCKS, rows, cols).expect("whole blocks");
    let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        packed.view().dequantize_row(r, &mut row).expect("a row");
        let want = &want[r * cols..(r + 1) * cols];
        assert!(
            row.iter()
                .zip(want)
                .all(|(g, w)| g.to_bits() == w.to_bits())
        );
    }
}

#[test]
fn products_equal_the_dot_of_gguf_py_values() {
    let mut checks = IsaChecks::new("q5k::products_equal_the_dot_of_gguf_py_values");
    // the 16 blocks: 4 rows of 1024 values
    let (rows, cols) = (4, 1024);
    let w = reference();
    let m = QuantMatrix::new(QuantFormat::Q5K, BLOCKS, rows, cols).expect("whole blocks");
    let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
    let mut rng = Rng::new(13);
    let n = 5;
    let x = rng.normals(n * cols, 1.0);
    let mut q = Q8Rows::new();
    q.quantize(&x, n, cols).expect("whole blocks");
    for isa in ALL {
        if !checks.runs(isa) {
            continue;
        }
        for view in [m, packed.view()] {
            let mut out = vec![0f32; rows * n];
            matvec_rows(isa, &view, &q, 0..rows, &mut out).expect("shapes");
            let mut chunk = vec![0f32; rows * n];
            matmul(isa, &view, &q, &mut chunk, &mut Vec::new()).expect("shapes");
            for r in 0..rows {
                for i in 0..n {
                    let (want, mag) = dot_with_q8(&w[r * cols..(r + 1) * cols], &q.row(i));
                    for got in [out[r * n + i], chunk[i * rows + r]] {
                        assert!(
                            (f64::from(got) - want).abs() <= 1e-5 * mag + 1e-6,
                            "{} {:?} row {r} act {i}: {got} vs {want}",
                            isa.name(),
                            view.layout()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn partial_blocks_and_truncated_rows_are_errors() {
    let format = QuantFormat::Q5K;
    // a row of 300 values is not whole 256-value blocks
    assert_eq!(
        format.row_bytes(300),
        Err(KernelError::PartialBlock {
            format: "Q5_K",
            cols: 300,
            block: 256
        })
    );
    assert_eq!(format.row_bytes(512), Ok(352));
    assert!(QuantMatrix::new(format, BLOCKS, 4, 1000).is_err());
    // a row one byte short, and one byte over
    let short = &BLOCKS[..4 * 704 - 1];
    assert!(matches!(
        QuantMatrix::new(format, short, 4, 1024),
        Err(KernelError::Length { .. })
    ));
    let mut over = BLOCKS.to_vec();
    over.push(0);
    assert!(QuantMatrix::new(format, &over, 4, 1024).is_err());
    // a partial block to dequantize, or too few values for the blocks
    let mut out = vec![0f32; 256];
    assert!(matches!(
        dequantize(format, &BLOCKS[..175], &mut out),
        Err(KernelError::Length { .. })
    ));
    assert!(dequantize(format, &BLOCKS[..176], &mut out[..255]).is_err());
    assert!(dequantize(format, &BLOCKS[..176], &mut out).is_ok());
    // an interleaved matrix of the wrong length
    assert!(QuantMatrix::interleaved(format, &BLOCKS[..1440], 8, 512).is_err());
}
