"""The decode-step model: one Hy3 decoder layer as one GPU of a TP8 deployment sees it, captured as ONE CUDA graph
and replayed over a continuously batched decode (requests finish and new ones join every few steps; KV lengths
grow by one token per step; the plans' update() runs inside the graph from device-side lengths).

Stages, in order (STAGES): ``qkv`` (BF16 projection, torch.mm) -> ``meta`` (positions, cache slots and the KV
lengths from the device-side context lengths) -> ``prologue`` -> ``attention`` (with its plan update) ->
``o_proj`` (BF16 torch.mm) -> ``router`` -> ``topk`` (torch.topk over the FP32 scores, then softmax over the
k selected logits: the renormalised top-k weights) -> ``moe`` (the routed experts plus a shared expert, a small
BF16 torch MLP, added in the MoE's final reduce).

Configurations (CONFIGS):
- ``baseline``: the unfused PyTorch prologue (BF16 Q), FlashInfer 0.7.2's XQA decode (what vLLM runs on Hopper;
  it reads the live cache the prologue wrote and the device-side lengths, so no host plan), the FP32 cuBLAS router
  and a PyTorch MoE (torch._grouped_mm in BF16 on weights dequantized once at load time; sort, gather, two
  grouped GEMMs, SiLU-and-mul, weighted index_add).
- ``hotpaths``: our four ops (attention_prologue -> split_kv_decode plan.update/run -> router_gemm(impl="dispatch")
  -> fused_moe plan.update/run(shared_out=...)), PDL on where an API has the flag.
- ``hotpaths_nopdl``: the same with pdl=False / trigger=False on the prologue and the MoE (the decode kernels chain
  their attention and combine with PDL unconditionally; the router has no flag): the difference is what PDL at
  those stage boundaries saves.
- ``hpc_ops``: HPC-Ops' rope_norm_store_kv_fp8 -> attention_decode_fp8 with its dynamic task map (assigned inside
  the graph) -> gemm_bf16xfp32 -> fuse_moe(shared_output=...).

Why the decode peers are called here directly and not through hotpaths.bench.split_kv_decode_peers.make_<peer>:
those factories are built for one static case: they copy the cache (clean_cache_copy) and Q once at make time and
fix max_seq_len, so in a composed step the attention would read a stale copy and not what the prologue just wrote.
The step needs the live buffers, so its adapters below take them; the bundles are imported through the same
importers (hotpaths.bench._peers_common).

Lengths: LENGTH_TRACES names synthetic mixes (``8k4k``, ``agentic``); any case-grammar string (``64x0.5K``,
``1x128K+31x4K``) also works: its lengths are the prompts and new requests draw from them. ContinuousBatch is the
CPU scheduler (fixed slots = the graph's batch; a finished request's slot is refilled at once).

Without an SM90 GPU, rows come from the stored H200 table data/results/h200/decode_step.csv, labelled
``source=stored:<path>``; when none exists the CLI says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hotpaths.bench._peers_common import import_flashinfer_072 as _import_flashinfer
from hotpaths.bench._peers_common import import_hpc_ops as _import_hpc
from hotpaths.harness.env import REPO_ROOT
from hotpaths.harness.shapes import load_shapes
from hotpaths.reference.common import expand_lengths, parse_cases, parse_int_list

STAGES = ("qkv", "meta", "prologue", "attention", "o_proj", "router", "topk", "moe")
CONFIGS = ("baseline", "hotpaths", "hotpaths_nopdl", "hpc_ops")
DEFAULT_CONFIGS = ("baseline", "hotpaths", "hpc_ops")
PUBLISHED_TPOT = REPO_ROOT / "data" / "reported" / "e2e_hy3_tpot_8xh20_vllm.csv"
STORED_NAME = "decode_step"
K = 1024


# Hy3's sizes come from the ops' shape files (the one place that names them): the prologue's per-GPU heads under
# TP8 and the MoE's whole-model sizes, whose intermediate TP8 splits 8 ways.
TP = 8
_ATTN = load_shapes("attention_prologue")
_MOE = load_shapes("fused_moe", "models")["hy3"]


@dataclass(frozen=True)
class LayerShape:
    """One Hy3 decoder layer on one GPU of TP8 (attention heads and the MoE intermediate split 8 ways, all 192
    experts on every rank: TP8/EP1).

    ``layers`` = 80 is DERIVED, not published: the sources (data/reported, /work/shared/background) give Hy3 as 295B
    total / 21B active parameters, 192 experts top-8, hidden 4096, intermediate 1536, 64 Q / 8 KV heads of 128.
    Experts hold 192 x 3 x 4096 x 1536 = 3.62B parameters per layer, so ~295B / 3.7B = 80 layers; the active count
    agrees (80 x (8 experts 151M + attention 76M + shared expert 19M) + ~1B embeddings = ~21B). Pass layers= to
    use another value."""

    q_heads: int = _ATTN["heads"]["8q1kv"]["q_heads"]
    kv_heads: int = _ATTN["heads"]["8q1kv"]["kv_heads"]
    head_dim: int = _ATTN["head_dim"]
    hidden: int = _MOE["hidden"]
    experts: int = _MOE["experts"]
    topk: int = _MOE["topk"]
    inter: int = _MOE["inter"] // TP          # 1536 / 8 per rank
    shared_inter: int = _MOE["inter"] // TP   # the shared expert's 1536 / 8 per rank
    page_size: int = _ATTN["page_size"]
    layers: int = 80
    eps: float = _ATTN["eps"]

    @property
    def qkv_width(self) -> int:
        return (self.q_heads + 2 * self.kv_heads) * self.head_dim


HY3_TP8 = LayerShape()


# ----------------------------------------------------------------------------------------------------------------
# lengths: synthetic traces and the continuous-batching scheduler (CPU)

@dataclass(frozen=True)
class Trace:
    """A request mix: each class is (weight, prompt_lo, prompt_hi, out_lo, out_hi), lengths in tokens drawn
    uniformly in [lo, hi]."""

    name: str
    classes: tuple
    doc: str


LENGTH_TRACES = {
    "8k4k": Trace("8k4k", ((1.0, 8 * K, 12 * K, 4 * K, 4 * K),),
                  "8K-in/4K-out: prompts 8K-12K, 4096 output tokens each (KV lengths 8K-16K in steady state)"),
    "agentic": Trace("agentic", ((0.55, 2 * K, 8 * K, 64, 512), (0.30, 16 * K, 48 * K, 128, 1 * K),
                                 (0.15, 64 * K, 128 * K, 256, 2 * K)),
                     "agentic mixed-length (synthetic): 55% short tool turns (2K-8K prompt, 64-512 out), 30% "
                     "mid-context turns (16K-48K, 128-1K out), 15% long-context turns (64K-128K, 256-2K out)"),
}


def trace_of(lengths: str, *, out_tokens: int = 4 * K) -> Trace:
    """A Trace by name (LENGTH_TRACES) or from a case-grammar string: its lengths are the prompt pool (each new
    request draws one), every request then decodes out_tokens tokens. Raises ValueError for anything else."""
    if lengths in LENGTH_TRACES:
        return LENGTH_TRACES[lengths]
    try:
        pool = expand_lengths(parse_cases(lengths))
    except ValueError as exc:
        raise ValueError(f"lengths: expected a trace name {sorted(LENGTH_TRACES)} or a case string like "
                         f"'1x128K+31x4K', got {lengths!r} ({exc})") from None
    if min(pool) < 1:
        raise ValueError(f"lengths: every KV length must be >= 1, got {lengths!r}")
    counts: dict[int, int] = {}
    for L in pool:
        counts[L] = counts.get(L, 0) + 1
    classes = tuple((c / len(pool), L, L, out_tokens, out_tokens) for L, c in sorted(counts.items()))
    return Trace(lengths, classes, f"case {lengths}: prompts from its lengths, {out_tokens} output tokens each")


class ContinuousBatch:
    """Fixed decode slots (the graph's batch) under continuous batching: every step each request's KV grows by one
    token; a request that has produced its output tokens leaves and a new one (drawn from the trace) takes its slot
    at once (its prefill is not modelled: it joins with its prompt in the cache). Slots start at a random point of
    their request's life (steady state, so finishes are spread over steps). Deterministic for a seed.

    Attributes: ctx [batch] int (tokens in the cache before this step's token), left [batch] int (output tokens
    still to produce), finished / joined (counts so far), step_index."""

    def __init__(self, trace: Trace, batch: int, *, seed: int = 0):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.trace, self.batch = trace, int(batch)
        self.rng = np.random.default_rng(seed)
        self.ctx = np.zeros(batch, dtype=np.int64)
        self.left = np.zeros(batch, dtype=np.int64)
        self.finished = self.joined = self.step_index = 0
        for r in range(batch):
            p, o = self._draw()
            done = int(self.rng.integers(0, o))  # steady state: somewhere inside its output
            self.ctx[r], self.left[r] = p + done, o - done

    def _draw(self) -> tuple[int, int]:
        w = np.array([c[0] for c in self.trace.classes], dtype=float)
        c = self.trace.classes[int(self.rng.choice(len(w), p=w / w.sum()))]
        return int(self.rng.integers(c[1], c[2] + 1)), int(self.rng.integers(c[3], c[4] + 1))

    @property
    def max_kv_len(self) -> int:
        """An upper bound on any KV length this trace reaches (the step writes token ctx, attends ctx + 1)."""
        return max(c[2] + c[4] for c in self.trace.classes) + 1

    def lengths(self) -> np.ndarray:
        """This step's context lengths (int32 [batch]): the new token goes to position ctx, attention reads ctx+1."""
        return self.ctx.astype(np.int32)

    def advance(self) -> np.ndarray:
        """One decode step: every request gains a token; finished ones leave and new ones join. Returns the next
        step's lengths()."""
        self.ctx += 1
        self.left -= 1
        for r in np.nonzero(self.left <= 0)[0]:
            self.finished += 1
            p, o = self._draw()
            self.ctx[r], self.left[r] = p, o
            self.joined += 1
        self.step_index += 1
        return self.lengths()


# ----------------------------------------------------------------------------------------------------------------
# the stage graph and the two numbers (CPU)

STAGE_IMPLS = {
    "qkv": ("torch.mm BF16", "torch.mm BF16", "torch.mm BF16"),
    "meta": ("positions / slots / kv_lens from device lengths (3 small torch kernels)",) * 3,
    "prologue": ("torch ops: RMSNorm, RoPE, FP8 K/V casts, index_copy_ (BF16 Q)",
                 "hotpaths attention_prologue (FP8 Q + scales, PDL trigger)", "hpc.rope_norm_store_kv_fp8"),
    "attention": ("FlashInfer 0.7.2 XQA (BF16 Q, FP8 KV)", "split_kv_decode plan.update (assign) + run",
                  "hpc.assign_attention_decode_task + attention_decode_fp8"),
    "o_proj": ("torch.mm BF16", "torch.mm BF16", "torch.mm BF16"),
    "router": ("FP32 cuBLAS (router_gemm impl=fp32_cublas)", "router_gemm impl=dispatch (BF16x2 kernel)",
               "hpc.gemm_bf16xfp32"),
    "topk": ("torch.topk + softmax over the k logits",) * 3,
    "moe": ("shared expert (torch) + sort/gather + torch._grouped_mm BF16 x2 + index_add",
            "shared expert (torch) + fused_moe plan.update + run(shared_out=...)",
            "shared expert (torch) + FP8 cast of x + hpc.fuse_moe(shared_output=...)"),
}


def stage_graph():
    """The step's stages and what each configuration runs for them (a DataFrame, in order)."""
    import pandas as pd

    return pd.DataFrame([{"stage": st, "baseline": b, "hotpaths": h, "hpc_ops": c}
                         for st, (b, h, c) in STAGE_IMPLS.items()])


def experts_hit(batch: int, shape: LayerShape = HY3_TP8) -> float:
    """Expected distinct experts a batch routes to (uniform routing): E (1 - (1 - k/E)^batch)."""
    return shape.experts * (1.0 - (1.0 - shape.topk / shape.experts) ** int(batch))


def step_bytes(batch: int, kv_lens, shape: LayerShape = HY3_TP8) -> dict:
    """Bytes one layer's step must move from HBM at least, per stage (weights once, the KV cache once, activations
    ignored: they are KBs at decode sizes). kv_lens: the attended length of each request (ints). Returns
    {stage: bytes, "total": ...}."""
    s = shape
    D = s.head_dim
    b = {"qkv": s.qkv_width * s.hidden * 2, "o_proj": s.hidden * s.q_heads * D * 2,
         "router": s.experts * s.hidden * 4,
         "attention": int(sum(int(x) for x in kv_lens)) * s.kv_heads * D * 2,  # FP8 K and V
         "prologue": int(batch) * s.kv_heads * D * 2,
         "moe": int(experts_hit(batch, s) * 3 * s.hidden * s.inter) + 3 * s.hidden * s.shared_inter * 2}
    b["total"] = sum(b.values())
    return b


def step_flops(batch: int, kv_lens, shape: LayerShape = HY3_TP8) -> int:
    """Multiply-add FLOPs (x2) of one layer's step: projections, router, attention (QK and PV), routed and shared
    experts."""
    s, B = shape, int(batch)
    D = s.head_dim
    mm = B * (s.qkv_width * s.hidden + s.hidden * s.q_heads * D + s.experts * s.hidden
              + s.topk * 3 * s.hidden * s.inter + 3 * s.hidden * s.shared_inter)
    att = sum(int(x) for x in kv_lens) * s.q_heads * D * 2
    return 2 * (mm + att)


# ----------------------------------------------------------------------------------------------------------------
# TPOT arithmetic, the stored table and the published points (CPU)

def tpot_ms(layer_us: float, layers: int = HY3_TP8.layers) -> float:
    """The per-output-token time of the model from one layer's step: layer_us x layers (ms). What it leaves out:
    see NOT_MODELLED."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    return float(layer_us) * int(layers) / 1000.0


NOT_MODELLED = (
    "The model times one layer's kernels on one GPU and multiplies by the layer count. It leaves out the two "
    "all-reduces per layer across the 8 GPUs (TP8: after attention and after the MoE; tens of us per layer at "
    "small batches on H20's NVLink), the layer's two RMSNorms and residual adds (small elementwise kernels), the "
    "embedding, final norm, LM head and sampling, the scheduler and the host "
    "work between steps, and attention for prefill (chunked prefills mixed into decode steps). All of these are the "
    "same for both configurations, so they add to both TPOTs: our TPOT is lower than a served one and our "
    "reduction (baseline - hotpaths) / baseline is LARGER than the end-to-end one would be for the same kernels; "
    "the published figures (vLLM, 8x H20) include them all, and H20 has ~1/3 of the H200's bandwidth, so compare "
    "the trend over batch, not the level.")


def published_tpot():
    """The published Hy3 TPOT (8x H20, vLLM) as a DataFrame (batch_size, baseline_tpot_ms, hpc_tpot_ms,
    improvement_pct), or None when the file is missing."""
    import pandas as pd

    return pd.read_csv(PUBLISHED_TPOT) if PUBLISHED_TPOT.exists() else None


def stored_path(device: str = "h200", name: str = STORED_NAME) -> Path:
    """data/results/<device>/<name>.csv: where the stored step table of a device lives (may not exist)."""
    return REPO_ROOT / "data" / "results" / device / f"{name}.csv"


def stored_rows(device: str = "h200", name: str = STORED_NAME):
    """The stored step table of ``device`` as a DataFrame labelled ``source=stored:<path>``, or None (missing)."""
    import pandas as pd

    p = stored_path(device, name)
    if not p.exists():
        return None
    df = pd.read_csv(p)
    df["source"] = f"stored:{p.relative_to(REPO_ROOT)}"
    return df


def tpot_table(df, *, layers: int = HY3_TP8.layers):
    """Per (lengths, batch): step us and TPOT ms of every configuration, our reduction of hotpaths (and hpc_ops)
    over baseline, and the published reduction at that batch beside it. ``df``: step rows (impl = config, stage
    'step', median_us). Returns a DataFrame (empty when df has no step rows)."""
    import pandas as pd

    steps = df[df["stage"] == "step"] if "stage" in df.columns else df.iloc[0:0]
    pub = published_tpot()
    out = []
    for (lengths, batch), g in steps.groupby(["lengths", "batch"], sort=True):
        us = {r["impl"]: float(r["median_us"]) for _, r in g.iterrows() if pd.notna(r["median_us"])}
        row = {"lengths": lengths, "batch": int(batch), "layers": layers}
        for cfg in CONFIGS:
            if cfg in us:
                row[f"{cfg}_layer_us"] = us[cfg]
                row[f"{cfg}_tpot_ms"] = tpot_ms(us[cfg], layers)
        for cfg in ("hotpaths", "hpc_ops"):
            if cfg in us and "baseline" in us and us["baseline"] > 0:
                row[f"{cfg}_reduction_pct"] = 100.0 * (us["baseline"] - us[cfg]) / us["baseline"]
        if "hotpaths" in us and "hotpaths_nopdl" in us:
            row["pdl_saves_us"] = us["hotpaths_nopdl"] - us["hotpaths"]
        if pub is not None:
            hit = pub[pub["batch_size"] == int(batch)]
            if len(hit):
                row["published_reduction_pct"] = float(hit["improvement_pct"].iloc[0])
                row["published_baseline_tpot_ms"] = float(hit["baseline_tpot_ms"].iloc[0])
                row["published_hpc_tpot_ms"] = float(hit["hpc_tpot_ms"].iloc[0])
        out.append(row)
    return pd.DataFrame(out)


def stage_shares(df):
    """Per (lengths, batch, impl): each stage's time alone and its share of the sum of the stages (%), plus the
    step time and the sum (the gap = what running the stages in one graph saves or costs). DataFrame."""
    import pandas as pd

    if "stage" not in df.columns:
        return pd.DataFrame()
    rows = []
    for (lengths, batch, impl), g in df.groupby(["lengths", "batch", "impl"], sort=True):
        st = g[g["stage"].isin(STAGES)]
        total = float(st["median_us"].sum())
        step = g[g["stage"] == "step"]["median_us"]
        for _, r in st.iterrows():
            rows.append({"lengths": lengths, "batch": int(batch), "impl": impl, "stage": r["stage"],
                         "stage_us": float(r["median_us"]),
                         "share_pct": 100.0 * float(r["median_us"]) / total if total > 0 else None,
                         "sum_of_stages_us": total,
                         "step_us": float(step.iloc[0]) if len(step) else None})
    out = pd.DataFrame(rows)
    if len(out):
        out["stage"] = pd.Categorical(out["stage"], categories=list(STAGES), ordered=True)
        out = out.sort_values(["lengths", "batch", "impl", "stage"]).reset_index(drop=True)
        out["stage"] = out["stage"].astype(str)
    return out


def plot_stage_shares(shares, *, lengths: str | None = None, ax=None):
    """Stacked bars of stage time (us) per (config, batch) for one lengths trace. Returns the axes (None when
    there is nothing to plot)."""
    import matplotlib.pyplot as plt

    if shares is None or len(shares) == 0:
        return None
    if lengths is None:
        lengths = sorted(shares["lengths"].unique())[0]
    s = shares[shares["lengths"] == lengths]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4))
    keys = [(i, b) for i in CONFIGS for b in sorted(s["batch"].unique()) if len(s[(s.impl == i) & (s.batch == b)])]
    x = np.arange(len(keys))
    bottom = np.zeros(len(keys))
    colors = plt.get_cmap("tab10")
    for j, st in enumerate(STAGES):
        h = np.array([float(s[(s.impl == i) & (s.batch == b) & (s.stage == st)]["stage_us"].sum()) for i, b in keys])
        ax.bar(x, h, bottom=bottom, label=st, color=colors(j))
        bottom += h
    ax.set_xticks(x, [f"{i}\nB={b}" for i, b in keys], fontsize=7)
    ax.set_ylabel("us (each stage alone, own graph)")
    ax.set_title(f"decode-step stages per layer, lengths {lengths}")
    ax.legend(fontsize=7, ncol=4)
    return ax


def plot_tpot(tp, *, ax=None):
    """Our TPOT reduction vs batch per lengths trace, with the published reduction (8x H20, vLLM). Axes or None."""
    import matplotlib.pyplot as plt

    if tp is None or len(tp) == 0:
        return None
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for lengths, g in tp.groupby("lengths"):
        if "hotpaths_reduction_pct" in g:
            ax.plot(g["batch"], g["hotpaths_reduction_pct"], "o-", label=f"hotpaths, {lengths} (layer model)")
        if "hpc_ops_reduction_pct" in g and g["hpc_ops_reduction_pct"].notna().any():
            ax.plot(g["batch"], g["hpc_ops_reduction_pct"], "s--", label=f"hpc_ops, {lengths} (layer model)")
    pub = published_tpot()
    if pub is not None:
        ax.plot(pub["batch_size"], pub["improvement_pct"], "k^:", label="published e2e (8x H20, vLLM)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("TPOT reduction vs baseline (%)")
    ax.legend(fontsize=7)
    return ax


# ----------------------------------------------------------------------------------------------------------------
# GPU: the layer's weights, buffers and stages per configuration

_WEIGHTS: dict = {}


def _weights(shape: LayerShape, seed: int, device) -> dict:
    """The layer's random weights (seeded, generated on the device, cached per (shape, seed, device) so every
    configuration and batch of one run uses the same layer): BF16 projections, FP32 router, FP8 experts with
    per-expert scales from their amax, the BF16 shared expert, the QK-norm weights."""
    import torch

    key = (shape, seed, str(device))
    if key in _WEIGHTS:
        return _WEIGHTS[key]
    _WEIGHTS.clear()  # one layer at a time on the device
    s, dev = shape, device
    g = torch.Generator(device=dev).manual_seed(seed)

    def rnd(*sz, std=1.0, dtype=torch.bfloat16):
        return (torch.randn(*sz, generator=g, device=dev) * std).to(dtype)
    H, D, fp8 = s.hidden, s.head_dim, torch.float8_e4m3fn
    w = {"w_qkv": rnd(s.qkv_width, H, std=H ** -0.5), "w_o": rnd(H, s.q_heads * D, std=(s.q_heads * D) ** -0.5),
         "q_norm_w": (1 + rnd(D, std=0.1, dtype=torch.float32)).to(torch.bfloat16),
         "k_norm_w": (1 + rnd(D, std=0.1, dtype=torch.float32)).to(torch.bfloat16),
         "router_w": rnd(s.experts, H, std=H ** -0.5, dtype=torch.float32).contiguous(),
         "sh_w13": rnd(2 * s.shared_inter, H, std=H ** -0.5),
         "sh_w2": rnd(H, s.shared_inter, std=s.shared_inter ** -0.5)}
    for name, rows, cols in (("w13", 2 * s.inter, H), ("w2", H, s.inter)):
        wf = rnd(s.experts, rows, cols, std=cols ** -0.5, dtype=torch.float32)
        sc = (wf.abs().amax(dim=(1, 2)) / 448.0).float()
        w[name + "_scale"] = sc
        w[name] = (wf / sc[:, None, None]).to(fp8)
        del wf
    _WEIGHTS[key] = w
    return w



class StepUnavailable(RuntimeError):
    """A configuration cannot run here; ``str(e)`` is the reason recorded in the table."""


@dataclass
class StepModel:
    """One configuration of the layer for a fixed batch of slots: weights, KV cache, static buffers, stage
    functions and (after capture()) the step's CUDA graph. Build with StepModel.build()."""

    config: str
    batch: int
    shape: LayerShape
    max_kv_len: int
    pdl: bool
    t: dict = field(default_factory=dict)       # tensors by name
    stage_fns: dict = field(default_factory=dict)
    graph: object = None
    events: tuple = ()
    notes: list = field(default_factory=list)
    assign_in_graph: bool = True   # hpc_ops: its task-map assign inside the graph (else before each replay)
    assign_hook: object = None

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def build(cls, config: str, batch: int, lengths0, *, max_kv_len: int, shape: LayerShape = HY3_TP8,
              seed: int = 0, device="cuda") -> "StepModel":
        """Weights (random, seeded), an FP8 KV cache of ``batch`` slots x ceil(max_kv_len / page) pages (slot r
        owns pages r*P .. r*P+P-1: a joining request reuses its slot's pages, so the block table never changes),
        filled with random tokens, and the stage functions of ``config``. lengths0: int32 [batch] initial context
        lengths. Raises ValueError (config, batch), StepUnavailable (a peer missing or failing; the reason)."""
        import torch

        if config not in CONFIGS:
            raise ValueError(f"config must be one of {CONFIGS}, got {config!r}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        m = cls(config, int(batch), shape, int(max_kv_len), pdl=config != "hotpaths_nopdl")
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:  # one spelling of the device for every tensor and generator
            dev = torch.device("cuda", torch.cuda.current_device())
        s, t = shape, m.t
        t.update(_weights(shape, seed, dev))
        g = torch.Generator(device=dev).manual_seed(seed + 1)
        H, D, B = s.hidden, s.head_dim, m.batch
        fp8 = torch.float8_e4m3fn
        t["x"] = torch.randn(B, H, generator=g, device=dev).to(torch.bfloat16)
        t["a1_scale"] = torch.ones(1, device=dev)  # calibrated after the first eager pass (_calibrate)
        t["a2_scale"] = torch.ones(1, device=dev)
        from hotpaths.reference.attention_prologue import make_cos_sin

        t["cos_sin"] = make_cos_sin(m.max_kv_len + 1, D).to(dev)
        ps = s.page_size
        P = -(-(m.max_kv_len + 1) // ps)
        t["k_cache"] = torch.empty(B * P, ps, s.kv_heads, D, dtype=fp8, device=dev)
        t["v_cache"] = torch.empty_like(t["k_cache"])
        for c in (t["k_cache"], t["v_cache"]):  # random tokens in chunks (no full-size fp32 temporary)
            flat = c.view(B * P, -1)
            for i in range(0, B * P, 4096):
                flat[i:i + 4096] = torch.randn(flat[i:i + 4096].shape, generator=g, device=dev).to(fp8)
        t["k_scale"] = torch.tensor([1.0], device=dev)  # cache tokens ~ N(0, 1) in e4m3
        t["v_scale"] = torch.tensor([1.0], device=dev)
        t["block_table"] = torch.arange(B * P, dtype=torch.int32, device=dev).view(B, P)
        # static step buffers
        t["ctx"] = torch.as_tensor(np.asarray(lengths0, dtype=np.int32)).to(dev)
        t["ctx_host"] = torch.empty(B, dtype=torch.int32)
        if dev.type == "cuda":  # pinned: the host-to-device copy of the next lengths is asynchronous
            t["ctx_host"] = t["ctx_host"].pin_memory()
        t["kv_lens"] = t["ctx"] + 1
        t["positions"] = t["ctx"].clone()
        t["slots"] = torch.zeros(B, dtype=torch.int64, device=dev)
        t["qkv"] = torch.empty(B, s.qkv_width, dtype=torch.bfloat16, device=dev)
        t["attn"] = torch.zeros(B, s.q_heads, D, dtype=torch.bfloat16, device=dev)
        t["o"] = torch.empty(B, H, dtype=torch.bfloat16, device=dev)
        t["scores"] = torch.empty(B, s.experts, dtype=torch.float32, device=dev)
        t["topk_ids"] = torch.zeros(B, s.topk, dtype=torch.int32, device=dev)
        t["topk_w"] = torch.zeros(B, s.topk, dtype=torch.float32, device=dev)
        t["shared_out"] = torch.empty(B, H, dtype=torch.bfloat16, device=dev)
        t["out"] = torch.empty(B, H, dtype=torch.bfloat16, device=dev)
        m._meta()
        builder = {"baseline": m._build_baseline, "hotpaths": m._build_hotpaths, "hotpaths_nopdl": m._build_hotpaths,
                   "hpc_ops": m._build_hpc_ops}[config]
        try:
            builder()
            for name in STAGES:  # one eager pass: JIT builds, kernel attributes, checks
                m.stage_fns[name]()
            m._calibrate()
            m.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        except StepUnavailable:
            raise
        except Exception as e:
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise StepUnavailable(f"not available: {config} setup failed: {type(e).__name__}: "
                                  f"{(lines[-1] if lines else '')[:300]}") from None
        return m

    def _calibrate(self) -> None:
        """Static FP8 activation scales of the MoE from this layer's own activations (amax / 448 of the o_proj
        output and of the SiLU-and-mul output over every expert), as an engine calibrates them offline."""
        import torch.nn.functional as F

        t, s = self.t, self.shape
        o = t["o"].float()
        t["a1_scale"].fill_(max(float(o.abs().max()) / 448.0, 1e-12))
        amax = 0.0
        for e in range(s.experts):
            gu = o @ (t["w13"][e].float() * t["w13_scale"][e]).t()
            amax = max(amax, float((F.silu(gu[:, :s.inter]) * gu[:, s.inter:]).abs().max()))
        t["a2_scale"].fill_(max(amax / 448.0, 1e-12))

    def _meta(self) -> None:
        """Positions, cache slots and KV lengths from the device-side context lengths (3 small kernels)."""
        import torch

        t, ps = self.t, self.shape.page_size

        def meta():
            ctx = t["ctx"]
            torch.add(ctx, 1, out=t["kv_lens"])
            t["positions"].copy_(ctx)
            page = torch.gather(t["block_table"], 1, (ctx // ps).long().unsqueeze(1)).squeeze(1)
            torch.add(page.long() * ps, (ctx % ps).long(), out=t["slots"])
        self.stage_fns["meta"] = meta

    def _common(self) -> None:
        import torch
        import torch.nn.functional as F

        t, s = self.t, self.shape
        self.stage_fns["qkv"] = lambda: torch.mm(t["x"], t["w_qkv"].t(), out=t["qkv"])
        self.stage_fns["o_proj"] = lambda: torch.mm(t["attn"].view(self.batch, -1), t["w_o"].t(), out=t["o"])

        def topk():
            vals, ids = torch.topk(t["scores"], s.topk, dim=-1)
            t["topk_w"].copy_(torch.softmax(vals, dim=-1))
            t["topk_ids"].copy_(ids)
        self.stage_fns["topk"] = topk

        def shared():
            gu = torch.mm(t["o"], t["sh_w13"].t())
            act = F.silu(gu[:, :s.shared_inter]) * gu[:, s.shared_inter:]
            torch.mm(act, t["sh_w2"].t(), out=t["shared_out"])
        self.shared = shared

    # -- configurations ------------------------------------------------------------------------------------------
    def _build_hotpaths(self) -> None:
        import torch

        from hotpaths.kernels import attention_prologue as kp
        from hotpaths.kernels import fused_moe as kmoe
        from hotpaths.kernels import router_gemm as kr
        from hotpaths.kernels import split_kv_decode as kd

        t, s, pdl = self.t, self.shape, self.pdl
        self._common()
        t["q"] = torch.empty(self.batch, s.q_heads, s.head_dim, dtype=torch.float8_e4m3fn, device=t["x"].device)
        t["q_scale"] = torch.empty(self.batch, s.q_heads, dtype=torch.float32, device=t["x"].device)

        def prologue():
            kp.attention_prologue(t["qkv"], t["q_norm_w"], t["k_norm_w"], t["cos_sin"], t["positions"], t["slots"],
                                  t["k_cache"], t["v_cache"], eps=s.eps, k_scale=t["k_scale"], v_scale=t["v_scale"],
                                  q_out=t["q"], q_scale_out=t["q_scale"], pdl=pdl, trigger=pdl, check_inputs=False)
        dplan = kd.plan(t["kv_lens"], num_kv_heads=s.kv_heads, q_heads=s.q_heads, head_dim=s.head_dim,
                        kv_dtype=torch.float8_e4m3fn)
        self.notes.append(f"decode variant {dplan.variant} (auto at build), fuse_max {dplan.fuse_max}")

        def attention():
            dplan.update(t["kv_lens"])
            kd.run(dplan, t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["kv_lens"], q_scale=t["q_scale"],
                   k_scale=t["k_scale"], v_scale=t["v_scale"], out=t["attn"], check_inputs=False)
        rw = kr.plan(t["router_w"])
        impl = kr.choose_impl(self.batch, rw.n, rw.k)
        self.notes.append(f"router dispatch -> {impl}")
        router = lambda: kr.router_gemm(t["o"], rw, impl="dispatch", out=t["scores"])  # noqa: E731
        mplan = kmoe.plan(t["topk_ids"], num_experts=s.experts, max_tokens=self.batch, pdl=pdl, scales="pertensor")

        def moe():
            self.shared()
            mplan.update(t["topk_ids"], pdl=pdl)  # the route kernel: this step's routing plan, in the graph
            kmoe.run(mplan, t["o"], t["w13"], t["w2"], t["topk_w"], scales="pertensor", w13_scale=t["w13_scale"],
                     w2_scale=t["w2_scale"], a1_scale=t["a1_scale"], a2_scale=t["a2_scale"],
                     shared_out=t["shared_out"], out=t["out"], stages=("gate_up", "down", "reduce"), pdl=pdl)
        self.stage_fns.update(prologue=prologue, attention=attention, router=router, moe=moe)
        self._keep = (dplan, rw, mplan)

    def _torch_prologue(self, q_out) -> None:
        """The unfused prologue in PyTorch ops: RMSNorm per head (fp32), NeoX RoPE, K/V FP8 casts, two index_copy_
        cache writes; Q written as BF16 (what FlashInfer takes)."""
        import torch

        t, s = self.t, self.shape
        D, Hq, Hk, h = s.head_dim, s.q_heads, s.kv_heads, s.head_dim // 2
        qw, kw = t["q_norm_w"].float(), t["k_norm_w"].float()

        def norm(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * w

        def rope(x, cos, sin):
            a, b = x[..., :h], x[..., h:]
            return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

        def prologue():
            x = t["qkv"].view(self.batch, Hq + 2 * Hk, D)
            c = t["cos_sin"].index_select(0, t["positions"].long())
            cos, sin = c[:, None, :h], c[:, None, h:]
            q = rope(norm(x[:, :Hq].float(), qw), cos, sin)
            k = rope(norm(x[:, Hq:Hq + Hk].float(), kw), cos, sin)
            v = x[:, Hq + Hk:].float()
            q_out.copy_(q)
            k8 = (k / t["k_scale"]).clamp(-448, 448).to(torch.float8_e4m3fn)
            v8 = (v / t["v_scale"]).clamp(-448, 448).to(torch.float8_e4m3fn)
            t["k_cache"].view(torch.uint8).view(-1, Hk, D).index_copy_(0, t["slots"], k8.view(torch.uint8))
            t["v_cache"].view(torch.uint8).view(-1, Hk, D).index_copy_(0, t["slots"], v8.view(torch.uint8))
        return prologue

    def _build_baseline(self) -> None:
        import torch
        import torch.nn.functional as F

        from hotpaths.kernels import router_gemm as kr

        t, s = self.t, self.shape
        self._common()
        dev = t["x"].device
        t["q_bf16"] = torch.empty(self.batch, s.q_heads, s.head_dim, dtype=torch.bfloat16, device=dev)
        prologue = self._torch_prologue(t["q_bf16"])
        try:
            fi = _import_flashinfer()
            from flashinfer.decode import trtllm_batch_decode_with_kv_cache as xqa  # type: ignore
        except Exception as e:
            raise StepUnavailable(f"not available: FlashInfer 0.7.2 XQA: {e}") from None
        ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)  # zeroed: XQA keeps semaphores in it
        bmm1 = float(t["k_scale"].item()) / math.sqrt(s.head_dim)
        bmm2 = float(t["v_scale"].item())
        max_len = self.max_kv_len + 1

        def attention():
            xqa(t["q_bf16"], (t["k_cache"], t["v_cache"]), ws, t["block_table"], t["kv_lens"], max_len,
                bmm1_scale=bmm1, bmm2_scale=bmm2, out=t["attn"], kv_layout="NHD", backend="xqa")
        self.notes.append(f"attention: flashinfer {getattr(fi, '__version__', '?')} xqa")
        rw = kr.plan(t["router_w"])
        router = lambda: kr.router_gemm(t["o"], rw, impl="fp32_cublas", out=t["scores"])  # noqa: E731
        # PyTorch MoE: weights dequantized to BF16 once (load time); per step: sort pairs by expert, gather, two
        # grouped GEMMs, SiLU-and-mul, weighted index_add (+ shared expert)
        if not hasattr(torch, "_grouped_mm"):
            raise StepUnavailable(f"not available: torch {torch.__version__} has no _grouped_mm")
        w13b = (t["w13"].float() * t["w13_scale"][:, None, None]).to(torch.bfloat16)
        w2b = (t["w2"].float() * t["w2_scale"][:, None, None]).to(torch.bfloat16)
        w13t, w2t = w13b.transpose(1, 2), w2b.transpose(1, 2)  # [E, H, 2I], [E, I, H] views (column-major B)
        E, I, kk = s.experts, s.inter, s.topk
        ones = torch.ones(self.batch * kk, dtype=torch.int64, device=dev)

        def moe():
            self.shared()
            ids = t["topk_ids"].view(-1).long()
            order = torch.argsort(ids, stable=True)
            tok = order // kk
            counts = torch.zeros(E, dtype=torch.int64, device=ids.device).scatter_add_(0, ids, ones)  # no host sync
            offs = torch.cumsum(counts, 0).to(torch.int32)
            xs = t["o"].index_select(0, tok)
            gu = torch._grouped_mm(xs, w13t, offs=offs)
            act = F.silu(gu[:, :I]) * gu[:, I:]
            y = torch._grouped_mm(act.contiguous(), w2t, offs=offs)
            y = y.float() * t["topk_w"].view(-1).index_select(0, order)[:, None]
            acc = t["shared_out"].float().index_add_(0, tok, y)
            t["out"].copy_(acc)
        self.notes.append("moe: torch._grouped_mm BF16 on dequantized weights")
        self.stage_fns.update(prologue=prologue, attention=attention, router=router, moe=moe)
        self._keep = (ws, rw, w13b, w2b)

    def _build_hpc_ops(self) -> None:
        import torch

        t, s = self.t, self.shape
        self._common()
        try:
            hpc = _import_hpc()
        except Exception as e:
            raise StepUnavailable(f"not available: HPC-Ops: {e}") from None
        dev = t["x"].device
        qw, kw = t["q_norm_w"].float().contiguous(), t["k_norm_w"].float().contiguous()
        qi = torch.arange(self.batch + 1, dtype=torch.int32, device=dev)
        t["q"] = torch.empty(self.batch, s.q_heads, s.head_dim, dtype=torch.float8_e4m3fn, device=dev)
        hold = {}

        def prologue():
            r = hpc.rope_norm_store_kv_fp8(t["k_cache"], t["v_cache"], t["qkv"], t["cos_sin"], t["kv_lens"], qi,
                                           t["block_table"], False, t["k_scale"], t["v_scale"], 1,
                                           q_norm_weight=qw, k_norm_weight=kw, out_q=t["q"], qk_norm_policy=2)
            qs = r[1]
            hold["q_scale"] = qs.reshape(-1)[: self.batch * s.q_heads].view(self.batch, s.q_heads)
        tm = hpc.get_attention_decode_task_workspace(self.batch, self.max_kv_len + 1, s.kv_heads, min_process_len=64)

        def assign():
            hpc.assign_attention_decode_task(t["kv_lens"], tm, s.kv_heads, 1, True, min_process_len=64)
        self.assign_hook = assign

        def attention():
            if self.assign_in_graph:
                assign()
            hpc.attention_decode_fp8(t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["kv_lens"],
                                     hold["q_scale"], t["k_scale"], t["v_scale"], mtp=0, new_kv_included=True,
                                     splitk=True, task_map=tm, output=t["attn"])
        w_high = t["router_w"].to(torch.bfloat16)  # HPC-Ops rounds for w_high (its own split)
        w_low = ((t["router_w"] - w_high.float()) * 256).to(torch.bfloat16)
        rws = hpc.get_gemm_bf16xfp32_workspace(s.experts)

        def router():
            t["scores"].copy_(hpc.gemm_bf16xfp32(t["o"], w_high, w_low, 1.0 / 256, True, True, rws))
        xq = torch.empty(self.batch, s.hidden, dtype=torch.float8_e4m3fn, device=dev)

        def moe():
            self.shared()
            xq.copy_((t["o"].float() / t["a1_scale"]).clamp(-448, 448))
            hpc.fuse_moe(xq, t["w13"], t["w2"], t["w13_scale"], t["w2_scale"], t["a2_scale"], t["topk_ids"],
                         t["topk_w"], 0, s.experts, shared_output=t["shared_out"], output=t["out"])
        self.stage_fns.update(prologue=prologue, attention=attention, router=router, moe=moe)
        self._keep = (tm, rws, w_high, w_low, xq, qi)

    # -- running -------------------------------------------------------------------------------------------------
    def step(self) -> None:
        """The whole layer, eagerly (the sequence the graph holds)."""
        for name in STAGES:
            self.stage_fns[name]()

    def set_lengths(self, ctx) -> None:
        """Queue the next step's context lengths (int [batch], host) into the graph's device buffer."""
        import torch

        self.t["ctx_host"].copy_(torch.as_tensor(np.asarray(ctx, dtype=np.int32)))
        self.t["ctx"].copy_(self.t["ctx_host"], non_blocking=True)

    def capture(self) -> None:
        """Capture step() once into a CUDA graph whose first and last nodes record timing events. If HPC-Ops'
        task-map assign cannot be captured, it moves out of the graph (run before each replay, untimed; noted)."""
        try:
            self._capture()
        except RuntimeError as e:
            if self.assign_hook is None or not self.assign_in_graph:
                raise
            self.assign_in_graph = False
            self.notes.append(f"hpc assign not capturable ({str(e).splitlines()[0][:120]}): run before each replay, "
                              "not timed")
            self._capture()

    def _capture(self) -> None:
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.step()
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True, external=True)
            end = torch.cuda.Event(enable_timing=True, external=True)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                start.record(stream)
                self.step()
                end.record(stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graph, self.events = g, (start, end)

    def replay(self) -> float:
        """Replay the captured step; returns its GPU time in us (events inside the graph; synchronizes)."""
        if not self.assign_in_graph:
            self.assign_hook()
        self.graph.replay()
        self.events[1].synchronize()
        return self.events[0].elapsed_time(self.events[1]) * 1e3


def run_trajectory(model: StepModel, sched: ContinuousBatch, steps: int, *, cold_l2: bool = True) -> dict:
    """Replay the model's graph for ``steps`` steps of the scheduler (lengths change every step, the graph is never
    re-captured), each after an L2 flush. Returns median/p10/p90 us, the finished/joined counts and the last
    lengths."""
    from hotpaths.harness import bench as hb

    samples = []
    f0, j0 = sched.finished, sched.joined
    for _ in range(steps):
        model.set_lengths(sched.advance())
        if cold_l2:
            hb.flush_l2()
        samples.append(model.replay())
    samples.sort()
    q = lambda p: samples[min(len(samples) - 1, int(p * (len(samples) - 1) + 0.5))]  # noqa: E731
    return {"median_us": statistics.median(samples), "p10_us": q(0.1), "p90_us": q(0.9), "steps": steps,
            "finished": sched.finished - f0, "joined": sched.joined - j0}


def measure(*, batches, lengths: str = "8k4k", configs=DEFAULT_CONFIGS, steps: int = 64, iters: int = 50,
            seed: int = 0, stages: bool = True, pdl_variant: bool = True, layers: int = HY3_TP8.layers,
            log=print) -> list[dict]:
    """The step table on this GPU: per (config, batch): the step (graph replayed over ``steps`` continuous-batching
    steps), each stage alone (bench, own graph, at the final lengths), peak memory. With pdl_variant and
    "hotpaths" in configs, also "hotpaths_nopdl". A configuration that cannot run gets one row with the reason.
    Returns rows (tables.COLUMNS first, then lengths, batch, stage, ...)."""
    import torch

    from hotpaths.harness import bench as hb
    from hotpaths.harness.env import device_tag
    from hotpaths.harness.runs import run_id

    cfgs = list(configs)
    if pdl_variant and "hotpaths" in cfgs and "hotpaths_nopdl" not in cfgs:
        cfgs.insert(cfgs.index("hotpaths") + 1, "hotpaths_nopdl")
    trace = trace_of(lengths)
    dev, rid = device_tag(), run_id()
    rows = []
    for batch in batches:
        for cfg in cfgs:
            sched = ContinuousBatch(trace, batch, seed=seed)
            base = dict(op="decode_step", case=f"{lengths} B={batch}", impl=cfg, dtype="fp8 kv, fp8 experts",
                        device=dev, run_id=rid, lengths=lengths, batch=batch, layers=layers,
                        repro=f"hotpaths step --batch {batch} --lengths {lengths} --config {cfg} --steps {steps}")
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            m = None
            try:
                m = StepModel.build(cfg, batch, sched.lengths(), max_kv_len=sched.max_kv_len, seed=seed)
                resident = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                m.step()
                torch.cuda.synchronize()
                step_extra = torch.cuda.max_memory_allocated() - resident
                m.capture()
                traj = run_trajectory(m, sched, steps)
            except (StepUnavailable, RuntimeError) as e:
                rows.append({**base, "stage": "step", "note": str(e)[:400]})
                log(f"[step] {cfg} B={batch}: {str(e)[:200]}")
                del m
                continue
            rows.append({**base, "stage": "step", "median_us": traj["median_us"], "p10_us": traj["p10_us"],
                         "p90_us": traj["p90_us"], "tpot_ms": tpot_ms(traj["median_us"], layers),
                         "steps": traj["steps"], "finished": traj["finished"], "joined": traj["joined"],
                         "resident_gib": resident / 2**30, "step_transient_mib": step_extra / 2**20,
                         "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                         "note": "; ".join(m.notes) + "; graph replayed with changing lengths, L2 flushed"})
            log(f"[step] {cfg} B={batch} {lengths}: {traj['median_us']:.1f} us/layer "
                f"({traj['finished']} finished, {traj['joined']} joined over {steps} steps)")
            if stages:
                for st in STAGES:
                    tm = hb.bench(m.stage_fns[st], iters=iters)
                    rows.append({**base, "stage": st, **tm.as_row(), "note": tm.method})
            del m
    return rows


# ----------------------------------------------------------------------------------------------------------------
# CLI: hotpaths step

def _rows_or_stored(args) -> tuple[list[dict] | None, str]:
    from hotpaths.reference.common import sm90_skip_reason

    reason = sm90_skip_reason()
    configs = [c.strip() for c in args.config.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        raise ValueError(f"--config: unknown {bad}; expected names from {CONFIGS}")
    batches = parse_int_list(args.batch, "--batch", minimum=1)
    trace_of(args.lengths)  # validates the name / case string before anything runs
    if reason is None:
        rows = measure(batches=batches, lengths=args.lengths, configs=configs, steps=args.steps, iters=args.iters,
                       seed=args.seed, stages=not args.no_stages, layers=args.layers,
                       log=(lambda s: None) if args.json else print)
        return rows, "measured"
    df = stored_rows(args.device_table)
    if df is None:
        return None, (f"no SM90 GPU here ({reason}) and no stored table {stored_path(args.device_table)} yet: "
                      f"run `hotpaths step` on an H200 (or `hotpaths reproduce --only 06`) to make one")
    keep = df[df["batch"].isin(batches) & df["impl"].isin(configs + ["hotpaths_nopdl"])
              & (df["lengths"] == args.lengths)]
    if keep.empty:
        return None, (f"no SM90 GPU here ({reason}); the stored table {stored_path(args.device_table)} has no rows "
                      f"for lengths {args.lengths}, batch {batches}, configs {configs}")
    return keep.to_dict(orient="records"), f"stored H200 rows ({reason})"


def _cmd_step(args) -> int:
    import pandas as pd

    from hotpaths.harness import tables
    from hotpaths.harness.cli import emit_rows

    rows, source = _rows_or_stored(args)
    if rows is None:
        print(f"hotpaths step: {source}")
        return 1
    if emit_rows(rows, args):
        return 0
    df = pd.DataFrame(rows)
    print(f"decode step, one Hy3 layer (TP8 rank), lengths {args.lengths}: {source}")
    tp = tpot_table(df, layers=args.layers)
    if len(tp):
        print(tables.to_markdown(tp))
    sh = stage_shares(df)
    if len(sh):
        print(tables.to_markdown(sh[["lengths", "batch", "impl", "stage", "stage_us", "share_pct"]]))
    print(NOT_MODELLED)
    return 0


CLI_HELP = "decode-step model: one Hy3 layer per GPU (TP8) as one CUDA graph, TPOT estimate"
CLI_DESCRIPTION = """\
Times one Hy3 decoder layer (qkv -> prologue -> decode attention -> o_proj -> router -> top-k -> MoE + shared
expert) as one CUDA graph replayed over continuously batched steps, per configuration, with each stage alone, peak
memory and TPOT = layer x layers. Without an SM90 GPU: the stored H200 table
(data/results/h200/decode_step.csv).""".replace("\n", " ")


def register(subparsers) -> None:
    """``hotpaths step``: the decode-step model (not an op: registered through hotpaths.bench.COMMANDS)."""
    from hotpaths.harness.cli import add_op_command

    p = add_op_command(subparsers, "step", func=_cmd_step, help=CLI_HELP, description=CLI_DESCRIPTION)
    p.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes (decode slots; default 1,8,32)")
    p.add_argument("--lengths", default="8k4k",
                   help=f"a trace name {sorted(LENGTH_TRACES)} or a case string like 1x128K+31x4K (default 8k4k)")
    p.add_argument("--config", default=",".join(DEFAULT_CONFIGS),
                   help=f"comma-separated configurations from {CONFIGS} (hotpaths adds hotpaths_nopdl)")
    p.add_argument("--steps", type=int, default=64, help="continuous-batching steps replayed per config (default 64)")
    p.add_argument("--layers", type=int, default=HY3_TP8.layers,
                   help=f"layers for the TPOT estimate (default {HY3_TP8.layers}, derived: see LayerShape)")
    p.add_argument("--no-stages", action="store_true", help="skip timing each stage alone")
    p.add_argument("--device-table", default="h200", help="stored table used without a GPU (default h200)")
    p.set_defaults(iters=50)
