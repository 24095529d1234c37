//! Fused attention on a CUDA device (`cuda/flash_attention.cu`): each
//! query reads only the keys the key planner gives it, with no score matrix
//! and no mask tensor, for bf16 and f16 activations and the head dims the
//! kernel is built for ([`HEAD_DIMS`]). The tile plan and arithmetic are
//! lcut-kernels' `attention::tiled`, whose CPU twin CI tests.
//!
//! [`fused_attention_runs`] and a layer's reads are the rule: a CUDA
//! device, bf16 or f16, a head dim the kernel has, `LCUT_FUSED_ATTENTION`
//! not `0` (the materialised path then runs, for comparison), no probe
//! asking for the attention rows, and every query reading at least one key.
//! Everything else takes the tensor path of `attention`.

use candle_core::{DType, Device, Tensor};
use lcut_kernels::attention::tiled::{HEAD_DIMS, Storage16};
use lcut_kernels::testdata::AttentionCase;

use crate::error::Result;

/// Whether attention of activations of `dtype` on `device` with heads of
/// `head_dim` runs on the fused kernel (where no probe wants its rows and
/// every query reads a key): lcut built with `cuda`, a CUDA device, bf16
/// or f16, a head dim of [`HEAD_DIMS`], and `LCUT_FUSED_ATTENTION` not `0`.
pub fn fused_attention_runs(device: &Device, dtype: DType, head_dim: usize) -> bool {
    // asked by every layer of every pass: the CPU answers before the
    // environment is read or a reason is written
    device.is_cuda() && fused_attention_refusal(device, dtype, head_dim).is_none()
}

/// The environment variable that, set to `0`, turns the fused kernel off.
pub const FUSED_ATTENTION_VAR: &str = "LCUT_FUSED_ATTENTION";

/// Why attention of `dtype` with heads of `head_dim` on `device` does not
/// run on the fused kernel (the materialised path runs instead), or `None`
/// when it does: what a GPU run tells its user.
pub fn fused_attention_refusal(device: &Device, dtype: DType, head_dim: usize) -> Option<String> {
    refusal(
        (cfg!(feature = "cuda"), device.is_cuda()),
        dtype,
        head_dim,
        std::env::var(FUSED_ATTENTION_VAR).is_ok_and(|v| v == "0"),
    )
}

/// [`fused_attention_refusal`] from its facts: lcut built with `cuda`, the
/// device a CUDA one, the activations' dtype, the head dim, the kernel
/// turned off by [`FUSED_ATTENTION_VAR`].
fn refusal(
    (built, on_cuda): (bool, bool),
    dtype: DType,
    head_dim: usize,
    turned_off: bool,
) -> Option<String> {
    if !on_cuda {
        return Some("not a CUDA device".into());
    }
    if !built {
        return Some("lcut was built without its CUDA kernels".into());
    }
    if turned_off {
        return Some(format!("{FUSED_ATTENTION_VAR}=0"));
    }
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Some(format!(
            "{dtype:?} activations (the kernel takes bf16 or f16)"
        ));
    }
    if !HEAD_DIMS.contains(&head_dim) {
        return Some(format!(
            "heads of width {head_dim} (the kernel is built for {HEAD_DIMS:?})"
        ));
    }
    None
}

/// One call's inputs: queries [heads, n, head_dim], keys and values
/// [kv_heads, keys, head_dim] (rows may be strided, as a cache holds
/// them), the reads (`tiled::encode_reads`, u32, on the device), the query
/// heads' sink logits (f32) where the model has them, the score scale and
/// Gemma's soft cap.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(super) struct FusedInputs<'a> {
    pub(super) q: &'a Tensor,
    pub(super) k: &'a Tensor,
    pub(super) v: &'a Tensor,
    pub(super) reads: &'a Tensor,
    pub(super) sinks: Option<&'a Tensor>,
    pub(super) scale: f32,
    pub(super) softcap: Option<f32>,
}

/// The attention output [heads, n, head_dim] and each row's log-sum-exp
/// [heads, n] (f32, the sink included).
pub(super) fn attend_fused(inputs: &FusedInputs<'_>) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    {
        Ok(gpu::attend(inputs)?)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = inputs;
        Err(candle_core::Error::Msg("fused attention needs lcut built with cuda".into()).into())
    }
}

/// The launcher: raw device buffers and kernel launches are `unsafe` in
/// cudarc, and this module is where lcut makes them.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu {
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUdevice_attribute, CUfunction_attribute,
    };
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};

    use candle_core::cuda_backend::cudarc::driver::{
        CudaFunction, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, DeviceId, WrapErr};
    use candle_core::op::BackpropOp;
    use candle_core::{DType, Device, Layout, Result, Storage, Tensor, bail};
    use lcut_kernels::attention::tiled::{HEAD_DIMS, ROW_TILE, THREADS, key_splits, shared_bytes};

    use super::FusedInputs;

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/flash_attention.ptx"));
    const MODULE: &str = "lcut_flash_attention";

    pub(super) fn attend(i: &FusedInputs<'_>) -> Result<(Tensor, Tensor)> {
        let Device::Cuda(dev) = i.q.device() else {
            bail!(
                "fused attention runs on a CUDA device, not {:?}",
                i.q.device()
            )
        };
        match i.q.dtype() {
            DType::BF16 => launch::<half::bf16>(dev, i, "bf16"),
            DType::F16 => launch::<half::f16>(dev, i, "f16"),
            d => bail!("fused attention takes bf16 or f16 activations, not {d:?}"),
        }
    }

    /// A kernel of the module, loaded, its shared-memory limit raised, and
    /// the device's multiprocessor count: looked up once per device and
    /// name, since a decode step launches it in every layer.
    #[derive(Clone)]
    struct Loaded {
        func: CudaFunction,
        processors: usize,
    }

    fn kernel(dev: &CudaDevice, name: &str, shared: usize) -> Result<Loaded> {
        static LOADED: OnceLock<Mutex<HashMap<(DeviceId, String), Loaded>>> = OnceLock::new();
        let map = LOADED.get_or_init(Default::default);
        let key = (dev.id(), name.to_string());
        if let Some(l) = map.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Ok(l.clone());
        }
        let func = dev.get_or_load_custom_func(name, MODULE, PTX)?;
        if shared > 0 {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared as i32,
            )
            .w()?;
        }
        let processors = dev
            .cuda_stream()
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .w()? as usize;
        let loaded = Loaded {
            func: (*func).clone(),
            processors,
        };
        map.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, loaded.clone());
        Ok(loaded)
    }

    /// `t` [heads, rows, head_dim] with rows of contiguous values, 16-byte
    /// aligned as the kernel loads them, and its head and row strides.
    fn rows_of(t: &Tensor) -> Result<(Tensor, i64, i64)> {
        let fits = |l: &Layout| {
            let s = l.stride();
            s.len() == 3 && s[2] == 1 && s[0] % 8 == 0 && s[1] % 8 == 0 && l.start_offset() % 8 == 0
        };
        let t = match fits(t.layout()) {
            true => t.clone(),
            false => t.contiguous()?,
        };
        let s = t.layout().stride().to_vec();
        Ok((t, s[0] as i64, s[1] as i64))
    }

    /// A tensor's CUDA buffer from its first element.
    fn view<'a, T: CudaDType>(storage: &'a Storage, layout: &Layout) -> Result<CudaView<'a, T>> {
        let Storage::Cuda(s) = storage else {
            bail!("fused attention: an input is not on the CUDA device")
        };
        Ok(s.as_cuda_slice::<T>()?.slice(layout.start_offset()..))
    }

    fn launch<T: CudaDType + DeviceRepr>(
        dev: &CudaDevice,
        i: &FusedInputs<'_>,
        name: &str,
    ) -> Result<(Tensor, Tensor)> {
        let q = i.q.contiguous()?;
        let (k, k_head, k_row) = rows_of(i.k)?;
        let (v, v_head, v_row) = rows_of(i.v)?;
        let (heads, n, hd) = q.dims3()?;
        let (kv_heads, keys, k_hd) = k.dims3()?;
        if v.dims3()? != (kv_heads, keys, k_hd) || k_hd != hd {
            bail!(
                "fused attention: queries {:?}, keys {:?} and values {:?} do not agree",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        if kv_heads == 0 || heads % kv_heads != 0 || !HEAD_DIMS.contains(&hd) {
            bail!("fused attention: {heads} query heads over {kv_heads} K/V heads of width {hd}");
        }
        if k.dtype() != q.dtype() || v.dtype() != q.dtype() || i.reads.dtype() != DType::U32 {
            bail!("fused attention: queries, keys and values of one 16-bit type, reads as u32");
        }
        let reads = i.reads.contiguous()?;
        let sinks = i
            .sinks
            .map(|s| s.to_dtype(DType::F32)?.contiguous())
            .transpose()?;
        if sinks.as_ref().is_some_and(|s| s.elem_count() != heads) {
            bail!("fused attention: sinks must be one per query head ({heads})");
        }
        let group = heads / kv_heads;
        let row_tiles = (group * n).div_ceil(ROW_TILE);
        let smem = shared_bytes(hd);
        let main = kernel(dev, &format!("lcut_flash_{name}_{hd}"), smem)?;
        let splits = key_splits(row_tiles * kv_heads, keys, hd, main.processors);
        // SAFETY: every element is written by the kernels below before it is read
        let (out, lse) = unsafe {
            (
                dev.alloc::<T>(heads * n * hd)?,
                dev.alloc::<f32>(heads * n)?,
            )
        };
        // the splits' partial outputs, maxima and sums (none for one split)
        let parts = match splits > 1 {
            // SAFETY: as above: each split writes its rows before the merge reads them
            true => Some(unsafe {
                (
                    dev.alloc::<f32>(splits * heads * n * hd)?,
                    dev.alloc::<f32>(splits * heads * n * 2)?,
                )
            }),
            false => None,
        };
        {
            let (qs, ql) = q.storage_and_layout();
            let (ks, kl) = k.storage_and_layout();
            let (vs, vl) = v.storage_and_layout();
            let (rs, rl) = reads.storage_and_layout();
            let sink_storage = sinks.as_ref().map(|s| s.storage_and_layout());
            let (qv, kv, vv) = (
                view::<T>(&qs, ql)?,
                view::<T>(&ks, kl)?,
                view::<T>(&vs, vl)?,
            );
            let rv = view::<u32>(&rs, rl)?;
            // a pointer the kernel never reads stands in for absent sinks and parts
            let sv = match &sink_storage {
                Some((s, l)) => view::<f32>(s, l)?,
                None => lse.slice(0..),
            };
            let (part_o, part_ml) = match &parts {
                Some((o, ml)) => (o.slice(0..), ml.slice(0..)),
                None => (lse.slice(0..), lse.slice(0..)),
            };
            let stream = dev.cuda_stream();
            let cfg = LaunchConfig {
                grid_dim: (row_tiles as u32, kv_heads as u32, splits as u32),
                block_dim: (THREADS as u32, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let (n_i, keys_i, group_i) = (n as i32, keys as i32, group as i32);
            let (scale, softcap) = (i.scale, i.softcap.unwrap_or(0.0));
            let (has_sinks, splits_i) = (i32::from(sinks.is_some()), splits as i32);
            let mut b = stream.launch_builder(&main.func);
            b.arg(&qv);
            b.arg(&kv);
            b.arg(&vv);
            b.arg(&out);
            b.arg(&lse);
            b.arg(&part_o);
            b.arg(&part_ml);
            b.arg(&rv);
            b.arg(&sv);
            b.arg(&n_i);
            b.arg(&keys_i);
            b.arg(&group_i);
            b.arg(&k_head);
            b.arg(&k_row);
            b.arg(&v_head);
            b.arg(&v_row);
            b.arg(&scale);
            b.arg(&softcap);
            b.arg(&has_sinks);
            b.arg(&splits_i);
            // SAFETY: the arguments are the kernel's, in its order and types;
            // the buffers hold what the grid reads and writes
            unsafe { b.launch(cfg) }.w()?;
            if splits > 1 {
                let merge = kernel(dev, &format!("lcut_flash_combine_{name}"), 0)?;
                let cfg = LaunchConfig {
                    grid_dim: ((heads * n) as u32, 1, 1),
                    block_dim: (hd.min(128) as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (hd_i, rows_i) = (hd as i32, (heads * n) as i32);
                let mut b = stream.launch_builder(&merge.func);
                b.arg(&part_o);
                b.arg(&part_ml);
                b.arg(&sv);
                b.arg(&out);
                b.arg(&lse);
                b.arg(&n_i);
                b.arg(&hd_i);
                b.arg(&rows_i);
                b.arg(&splits_i);
                b.arg(&has_sinks);
                // SAFETY: as above, for the merge kernel
                unsafe { b.launch(cfg) }.w()?;
            }
        }
        let wrap = |s: CudaStorage, shape: &[usize]| {
            Tensor::from_storage(Storage::Cuda(s), shape, BackpropOp::none(), false)
        };
        Ok((
            wrap(
                CudaStorage::wrap_cuda_slice(out, dev.clone()),
                &[heads, n, hd],
            ),
            wrap(CudaStorage::wrap_cuda_slice(lse, dev.clone()), &[heads, n]),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_kernel_is_refused_by_name() {
        let runs = |dtype, hd, off| refusal((true, true), dtype, hd, off);
        assert_eq!(runs(DType::BF16, 128, false), None);
        assert_eq!(runs(DType::F16, 256, false), None);
        let said = |r: Option<String>, what: &str| {
            let r = r.expect("refused");
            assert!(r.contains(what), "{r:?} should name {what:?}");
        };
        said(runs(DType::F32, 128, false), "F32");
        said(runs(DType::BF16, 72, false), "width 72");
        said(runs(DType::BF16, 128, true), "LCUT_FUSED_ATTENTION=0");
        said(
            refusal((false, true), DType::BF16, 128, false),
            "without its CUDA kernels",
        );
        said(
            refusal((true, false), DType::BF16, 128, false),
            "not a CUDA device",
        );
        // the CPU never runs it, whatever the dtype
        assert!(!fused_attention_runs(&Device::Cpu, DType::BF16, 128));
    }
}

/// One configuration of [`check_fused_attention`] and how far the fused
/// kernel's output fell from the CPU's exact attention on the same inputs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FusedAttentionCheck {
    /// What ran: visibility, heads, head dim, queries and keys.
    pub case: String,
    /// Largest output difference over the largest |value|.
    pub max_abs: f64,
    /// Largest log-sum-exp difference.
    pub lse_max_abs: f64,
    /// What the CPU twin of the kernel is held to (one unit of the
    /// activations' rounding, relative to the largest value).
    pub bound: f64,
    /// Whether both differences are within their bounds (the log-sum-exp's: 1e-3).
    pub pass: bool,
}

/// The fused kernel on `device` in `dtype` against lcut's exact CPU
/// attention (`attend_chunk`, f32, inputs rounded to `dtype`) on random
/// inputs: every head dim the kernel has, causal prefill chunks over a
/// cache whose rows are strided, windows, a policy's anchors with gaps,
/// grouped heads, the soft cap, sinks and decode steps split over long
/// caches. Empty where the kernel does not run (a CPU, f32).
pub fn check_fused_attention(device: &Device, dtype: DType) -> Result<Vec<FusedAttentionCheck>> {
    use lcut_kernels::testdata::Visibility::{Anchors, Causal, Window};
    let storage = match dtype {
        DType::BF16 => Storage16::Bf16,
        DType::F16 => Storage16::F16,
        _ => return Ok(Vec::new()),
    };
    if !fused_attention_runs(device, dtype, 64) {
        return Ok(Vec::new());
    }
    let mut cases: Vec<AttentionCase> = HEAD_DIMS
        .iter()
        .map(|&hd| AttentionCase::new(Causal, (8, 2), hd, 200, 264))
        .collect();
    cases.extend([
        AttentionCase::new(Window(128), (8, 2), 128, 300, 300),
        AttentionCase::new(Anchors, (8, 2), 128, 150, 400),
        AttentionCase::new(Causal, (4, 4), 64, 100, 100),
        AttentionCase {
            softcap: Some(30.0),
            ..AttentionCase::new(Window(128), (4, 1), 256, 120, 200)
        },
        AttentionCase {
            sinks: true,
            ..AttentionCase::new(Window(128), (8, 2), 64, 130, 200)
        },
        AttentionCase::new(Causal, (32, 8), 128, 1, 40_000),
        AttentionCase {
            sinks: true,
            ..AttentionCase::new(Anchors, (32, 8), 128, 1, 9_000)
        },
        AttentionCase::new(Causal, (8, 1), 256, 1, 3_000),
    ]);
    cases
        .iter()
        .enumerate()
        .map(|(i, c)| check_case(c, (device, dtype), storage, 11 + i as u64))
        .collect()
}

/// One case of [`check_fused_attention`]: random inputs of `storage`
/// through the fused kernel on `device` and through `attend_chunk` on the
/// CPU, the log-sum-exp against the case's f64 reference.
fn check_case(
    c: &AttentionCase,
    (device, dtype): (&Device, DType),
    storage: Storage16,
    seed: u64,
) -> Result<FusedAttentionCheck> {
    use lcut_kernels::attention::tiled::encode_reads;
    use lcut_kernels::attention::{AttentionSpec, KvCache, KvData, KvLayout, attend_chunk};
    use lcut_kernels::testdata::Rng;
    let (heads, kv, hd, n, keys) = (c.heads, c.kv_heads, c.head_dim, c.queries, c.keys);
    // the cache holds 16 rows more than are read, as a reserved cache does
    let capacity = keys + 16;
    let mut rng = Rng::new(seed);
    let mut draw = |len: usize| -> Vec<f32> {
        rng.normals(len, 1.0)
            .into_iter()
            .map(|x| storage.round(x))
            .collect()
    };
    let q = draw(heads * n * hd);
    let k = draw(kv * capacity * hd);
    let v = draw(kv * capacity * hd);
    let sinks: Vec<f32> = (0..heads).map(|h| (h % 5) as f32 * 0.7 - 1.0).collect();
    let spec = AttentionSpec {
        heads,
        scale: 1.0 / (hd as f32).sqrt(),
        softcap: c.softcap,
        sinks: c.sinks.then_some(&sinks[..]),
    };
    let spans = c.query_spans();
    let layout = KvLayout::head_major(kv, hd, capacity, keys);
    let cache = KvCache::new(KvData::F32(&k), KvData::F32(&v), layout)?;
    let mut want = vec![0f32; heads * n * hd];
    attend_chunk(
        lcut_kernels::Isa::detect(),
        &spec,
        &q,
        &cache,
        &spans,
        &mut want,
    )?;
    let (_, want_lse) = c.reference(&spec, (&q, &k, &v), capacity);

    let on_device = |x: &[f32], shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::from_slice(x, shape, device)?.to_dtype(dtype)?)
    };
    let qt = on_device(&q, &[heads, n, hd])?;
    let kt = on_device(&k, &[kv, capacity, hd])?.narrow(1, 0, keys)?;
    let vt = on_device(&v, &[kv, capacity, hd])?.narrow(1, 0, keys)?;
    let reads = encode_reads(&spans)?;
    let reads = Tensor::from_vec(reads.clone(), reads.len(), device)?;
    let sink_t = Tensor::from_slice(&sinks, heads, device)?;
    let (out, lse) = attend_fused(&FusedInputs {
        q: &qt,
        k: &kt,
        v: &vt,
        reads: &reads,
        sinks: c.sinks.then_some(&sink_t),
        scale: spec.scale,
        softcap: c.softcap,
    })?;
    let out = out.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let lse = lse.flatten_all()?.to_vec1::<f32>()?;
    let vmax = v.iter().fold(0f32, |a, x| a.max(x.abs())) as f64;
    let max_abs = out
        .iter()
        .zip(&want)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max)
        / vmax;
    let lse_max_abs = lse
        .iter()
        .zip(&want_lse)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    let bound = storage.unit();
    Ok(FusedAttentionCheck {
        case: format!(
            "{:?} {}/{} heads hd {hd} n {n} keys {keys}{}{}",
            c.kind,
            heads,
            kv,
            c.softcap.map_or(String::new(), |cap| format!(" cap {cap}")),
            if c.sinks { " sinks" } else { "" }
        ),
        max_abs,
        lse_max_abs,
        bound,
        pass: max_abs <= bound && lse_max_abs <= 1e-3,
    })
}
