"""Type stubs of lcut's Rust extension (the classes ``lcut`` re-exports)."""

import os
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

KEEPS_FREED_BUFFERS: bool
"""Whether importing lcut told glibc's allocator to keep the prefill's
MiB-sized buffers in its heap (as the ``lcut`` binary does: fewer page
faults, 4-15% lower TTFT; up to 256 MiB of freed memory held at the heap's
top). False on other allocators, or with ``LCUT_KEEP_FREED_BUFFERS=0`` set
before the import."""

LAYER_METRICS: List[str]
"""The per-layer metrics of a report, in the order of its CSV columns
(``bos``, ``anchor``, ``prefill``, ``decode``, ``self``, entropies, tail mass,
curvatures, straightening): the columns of ``layer_table()`` after ``layer``."""

PathLike = Union[str, "os.PathLike[str]"]
Prompt = Union[str, Sequence[int]]
F32 = npt.NDArray[np.float32]

def load(
    path: Optional[PathLike] = None,
    dtype: str = "f32",
    lora: Optional[PathLike] = None,
    device: str = "cpu",
) -> "Session":
    """Load a model folder (Hugging Face layout) or a ``.gguf`` file.

    ``dtype``: ``"f32"``, ``"bf16"``, ``"f16"`` or ``"q"`` (a GGUF's matrices
    kept quantized). ``lora``: a PEFT adapter folder merged into the weights.
    ``device``: ``"cpu"`` or ``"cuda[:N]"`` (builds with CUDA). ``path=None``
    loads the small model bundled with lcut's sources.

    Raises ``lcut.NotFoundError`` (a FileNotFoundError) for a missing path,
    ``lcut.InvalidInputError`` (a ValueError) for a bad dtype or device,
    ``lcut.LcutError`` when the model cannot be read.
    """

class ModelConfig:
    """The loaded model's shape; fields by attribute or by ``config["name"]``."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    arch: str
    chat_template: bool
    max_positions: int
    bos_token_id: Optional[int]
    eos_token_ids: List[int]
    dtype: str
    def to_dict(self) -> Dict[str, Any]: ...
    def keys(self) -> List[str]: ...
    def __getitem__(self, key: str) -> Any: ...
    def __contains__(self, key: str) -> bool: ...

class Forward:
    """The result of ``Session.forward``."""

    logits: F32
    """[len(ids) - decode_start, vocab]: logits of positions decode_start .. len(ids) - 1."""
    ids: List[int]
    decode_start: int
    policy: str
    """The policy resolved against the model's depth (``speed:22+bos``)."""
    embeddings: Optional[F32]
    """[len(ids), hidden], or None."""
    layer_out: Optional[F32]
    """[layers, len(ids), hidden]: residual stream after each layer; NaN rows
    for tokens a policy keeps out of a layer. None when not recorded."""
    attention: Optional[F32]
    """[layers, heads, len(ids), len(ids)]: post-softmax attention, or None."""
    lens_logprob: Optional[F32]
    """[layers + 1, len(ids)]: the logit lens (row 0 the embeddings, row l + 1
    the output of layer l): log-probability of the token the last layer ranks
    first at each position. None unless ``lens=True``."""
    sparse_layers: Optional[List[int]]
    """A mixture-of-experts model's sparse layers (the routing arrays' first axis); None for a dense model."""
    router_probs: Optional[F32]
    """[sparse layers, len(ids), num_experts]: the router's probability of each expert
    (NaN where a policy keeps the token out of the layer)."""
    experts: Optional[npt.NDArray[np.int64]]
    """[sparse layers, len(ids), top_k]: the experts each token runs, most probable first
    (-1 where the token is kept out)."""
    expert_weights: Optional[F32]
    """[sparse layers, len(ids), top_k]: their weights in the layer's output (NaN where kept out)."""

class Trace:
    """One prompt's greedy run seen by the diagnostic probe.

    Mass arrays are ``[layers, heads, steps]`` (lcut's files store
    ``[layers, steps, heads]``; the API puts heads first so that ``a[l, h]`` is
    one head's curve over the steps). The five masses sum to 1, with
    ``sink_mass`` where the model has learned sinks (gpt-oss).
    """

    id: str
    policy: str
    prompt_ids: Optional[List[int]]
    tokens: List[str]
    """The text of each prompt token (heatmap position labels)."""
    generated: List[str]
    ids: List[int]
    """Generated token ids, one per decode step."""
    text: str
    prompt_len: int
    decode_start: int
    anchor_len: int
    query_positions: List[int]
    num_layers: int
    num_heads: int
    num_steps: int
    state_split_layers: List[int]
    """Layers without attention rows (Qwen3.5's linear-attention layers): their
    ``prefill_mass`` is the prompt's share of the layer's output (the state
    split), ``decode_mass`` the rest, the other masses 0; empty where every
    layer attends."""
    bos_mass: F32
    anchor_mass: F32
    prefill_mass: F32
    """[layers, heads, steps]: attention on the prompt between the anchors and
    the decode start (what SPEED drops above the cut)."""
    decode_mass: F32
    self_mass: F32
    sink_mass: Optional[F32]
    """[layers, heads, steps]: attention on no key, the learned sink's share of
    each head's softmax (gpt-oss); None for a model without sinks."""
    routing: Optional["Routing"]
    """How a mixture-of-experts model routed each decode step; None for a dense
    model."""
    entropy_heads: F32
    """[layers, heads, steps]: normalised conditional prompt entropy (NaN where
    the prefill mass is 0)."""
    entropy: F32
    """[layers]: normalised prompt entropy, prefill-mass weighted."""
    entropy_head_mean: F32
    curvature: F32
    """[layers + 1]: prompt-span curvature, radians; index 0 = embeddings."""
    curvature_generated: F32
    prompt_attention: F32
    """[layers, bins]: decode attention onto bins of prompt positions."""
    bin_edges: List[int]
    lens_prob: Optional[F32]
    """[layers + 1, steps]: the logit lens, P(step's token) under each hidden
    state's final norm and LM head (row 0 the embeddings, row l + 1 the output
    of layer l). None when the trace has no lens."""
    lens_logprob: Optional[F32]
    lens_rank: Optional[F32]
    """[layers + 1, steps]: rank of the step's token under the lens (1 = first)."""
    lens_top1: Optional[F32]
    lens_kl: Optional[F32]
    """[layers + 1, steps]: KL(final || lens), nats."""
    lens_top_ids: Optional[List[List[int]]]
    lens_formation: Optional[List[int]]
    """Per step, the first hidden state from which every later lens ranks the
    step's token first."""
    def layer_table(self) -> Any:
        """One row per layer (columns ``layer`` + ``LAYER_METRICS``): a pandas
        DataFrame when pandas is installed, else a dict of numpy columns."""
    def attention(self, layer: int, step: int, progress: bool = False) -> F32:
        """[heads, query_positions[step] + 1]: one decode step's attention at
        ``layer`` (re-runs the traced generation up to that step)."""

class Generation:
    """A finished greedy generation (``Session.generate``)."""

    text: str
    ids: List[int]
    prompt_ids: List[int]
    policy: str
    stop: Literal["stop_token", "max_tokens", "cancelled"]
    ttft_s: float
    tpot_s: float
    total_s: float
    kv_bytes: int
    kv_bytes_full: int
    kv_ratio: float
    compare: Optional["Generation"]
    """The other policy's generation (with ``compare=``)."""
    agreement: Optional[npt.NDArray[np.bool_]]
    """[steps]: this generation's token equals the other's."""
    kl: Optional[F32]
    """[steps]: KL(other || this), nats; NaN once the continuations differ."""
    agreement_rate: Optional[float]

class Routing:
    """How a mixture-of-experts model routed one prompt's decode steps. Row ``i``
    of every array is sparse layer ``layers[i]``."""

    num_experts: int
    top_k: int
    layers: List[int]
    """The sparse layers, ascending."""
    num_steps: int
    entropy: F32
    """[sparse layers, steps]: router entropy / ln(num_experts) (0 = one expert, 1 = uniform)."""
    experts: npt.NDArray[np.uint32]
    """[sparse layers, steps, top_k]: the experts each step runs, most probable first."""
    load: F32
    """[sparse layers, num_experts]: each expert's share of the top-k slots (rows sum to 1)."""
    overlap: Optional[F32]
    """[sparse layers, steps]: the share of the full model's top-k experts the policy's
    routing keeps on the same tokens; None for a full-depth trace."""
    policy: Optional[str]
    """The policy ``overlap`` compares with the full model."""

class Report:
    """A diagnostic report (``Session.diagnose``; ``lcut diagnose --out DIR``)."""

    @staticmethod
    def load(path: PathLike) -> "Report":
        """Read ``report.json`` (or the folder holding it)."""
    def save(self, dir: PathLike) -> str:
        """Write ``dir/report.json`` atomically; returns its path."""
    recommended_l_cut: int
    num_layers: int
    votes: Dict[str, Optional[int]]
    """``tail_mass``, ``selective_band``, ``curvature_plateau`` (None = abstains)."""
    tail_mass_dropped: float
    explanation: str
    knee: Optional[int]
    model: Dict[str, Any]
    settings: Dict[str, Any]
    sweep: Optional[Dict[str, Any]]
    prompts: List[str]
    traces: List[Trace]
    state_split_layers: List[int]
    """Layers whose curves come from their state split (see ``Trace``)."""
    curves: Dict[str, F32]
    """Per-layer series keyed by ``LAYER_METRICS`` name."""
    routing: Optional[Dict[str, Any]]
    """Routing over every prompt's decode steps (``num_experts``, ``top_k``,
    ``sparse_layers``, ``tokens``, ``entropy`` [layers], ``load`` [layers,
    num_experts], ``overlap`` [layers] or None, ``policy``); None for a dense model."""
    prefill_by_step: F32
    """[layers, steps]: prefill mass per decode step, mean over prompts and heads."""
    prefill_by_head: F32
    """[layers, heads]: prefill mass per head, mean over prompts and steps."""
    def layer_table(self) -> Any:
        """One row per layer (columns ``layer`` + ``LAYER_METRICS``): a pandas
        DataFrame when pandas is installed, else a dict of numpy columns."""
    def to_dict(self) -> Dict[str, Any]: ...

class Session:
    """A loaded model (``lcut.load``). Long calls release the GIL, show a tqdm
    bar when tqdm is installed and stop on Ctrl-C (KeyboardInterrupt)."""

    config: ModelConfig
    path: str
    device: str
    adapter: Optional[Dict[str, Any]]
    def tokenize(self, text: str, chat: bool = False, system: Optional[str] = None) -> List[int]: ...
    def prepare(self, prompt: Prompt, chat: bool = True, system: Optional[str] = None) -> Dict[str, Any]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_strings(self, ids: Sequence[int]) -> List[str]: ...
    def resolve_policy(self, policy_text: str) -> str: ...
    def forward(
        self,
        ids: Sequence[int],
        policy: str = "full",
        decode_start: Optional[int] = None,
        residuals: bool = True,
        attention: bool = True,
        lens: bool = False,
        routing: bool = True,
    ) -> Forward: ...
    def trace(
        self,
        prompt: Prompt,
        max_new_tokens: int = 16,
        chat: bool = True,
        policy: str = "full",
        system: Optional[str] = None,
        progress: bool = True,
        lens: bool = False,
    ) -> Trace: ...
    def generate(
        self,
        prompt: Prompt,
        policy: str = "speed:3/4+bos",
        max_new_tokens: int = 64,
        compare: Optional[str] = None,
        chat: bool = True,
        system: Optional[str] = None,
        progress: bool = True,
    ) -> Generation: ...
    def diagnose(
        self,
        prompts: Union[None, PathLike, Sequence[Union[str, Mapping[str, str]]]] = None,
        sweep: Union[bool, Sequence[int]] = False,
        out: Optional[PathLike] = None,
        max_new_tokens: int = 16,
        chat: bool = True,
        progress: bool = True,
        lens: bool = False,
    ) -> Report: ...
    @overload
    def eval(self, suite: PathLike, policy: str, max_new_tokens: int = 24, progress: bool = True) -> Dict[str, Any]: ...
    @overload
    def eval(
        self, suite: PathLike, policy: Sequence[str], max_new_tokens: int = 24, progress: bool = True
    ) -> List[Dict[str, Any]]: ...
