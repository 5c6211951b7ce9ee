"""Published training runs: each row's model, exact layout, hardware and published MFU, with its source.

Every row is one measurement a source published, with the layout it ran
(mesh, rules, per-device batch, remat, attention) read off the source's own
scripts. ``tests/tune/validation.py`` prices each as ``tune`` would and splits
the rows, by id, into a calibration half and a held-out half.

MFU is compared under each source's own FLOP count (:meth:`Row.source_flops`):
the published step time is ``source FLOPs / (chips x peak x published MFU)``.

Sources:

- ``maxtext``: MaxText at commit 632f65147 (2023-12-15): the tables of
  ``MaxText/configs/{v5p,v5e,v4}/README.md`` and the scripts beside them
  (``global_parameter_scale``, ``per_device_batch_size``,
  ``ici_tensor_parallelism``, ``remat_policy``); the model of
  ``MaxText/configs/base.yml`` at that commit (embed 2560, 8 heads of 256, one
  ReLU MLP matrix of 8192, 16 layers, vocabulary 32768, tied) scaled as
  ``pyconfig.get_individual_scales``; slices on ``data`` over the data-centre
  network. FLOPs: ``6 N tokens`` + causal attention (``train.py``).
  ``v5p-N`` and ``v4-N`` count TensorCores (N / 2 chips), ``v5e-N`` chips.
  Attention: MaxText's flash kernel on TPU (``attention: autoselected``).
- ``maxtext-a3``: MaxText at commit efb6d9e4a (2024-04-09) on Google Cloud A3 VMs (8 H100s and 4 x 200 Gb/s
  of GPUDirect-TCPX networking each: an eighth of the h100 profile's InfiniBand per GPU),
  ``MaxText/configs/a3/llama_2_7b/{1,2,4,8,16}vm.sh`` and their README: Llama-2
  7B on 1-16 A3 VMs (8 H100s each): FSDP over the 8 GPUs of a VM, data
  parallel across VMs, 4 sequences of 4,096 per GPU, ``remat_policy:
  minimal_flash``, ``attention: cudnn_flash_te``; FLOPs as ``maxtext_utils.py``
  at that commit (``6 N tokens`` + causal attention).
- ``nvidia-maxtext``: NVIDIA's DGX Cloud benchmarking recipes
  (github.com/NVIDIA/dgxc-benchmarking): ``maxtext/README_70b.md`` and
  ``configure.sh`` at v24.11.1 (commit 35a9aec: Llama-2 70B, sequence 4,096,
  ``save_dot_except_mlpwi``) and at v25.02 (commit 8f5cbb3: Llama-3 70B,
  sequence 8,192, ``save_qkv_proj``): BF16 on 64-2048 H100s, 2 sequences per
  GPU, FSDP over 8 GPUs of a node times up to 16 nodes, data parallel beyond,
  ``attention: cudnn_flash_te``. FLOPs as the README's notes (per token
  ``12 L D^2 (1 + G/H + T/D) + 18 L F D + 6 V D``: the attention square not halved).
- ``megatron``: Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC'21, arXiv:2104.04473,
  Table 1 (GPT, vocabulary 51200, sequence 2048, A100s of Selene: tensor
  parallel inside a node, pipeline stages across nodes, micro-batches of one
  sequence, full recomputation); FLOPs its Eq. 3 (the recomputed forward pass
  counted). Its kernels predate flash attention: the scores are materialized, with one fused kernel for
  scale, mask and softmax.

The repository's own H200 rows (``benchmarks/results/gpu_h200_run1.json``)
are priced from their config by ``tests/tune/measured.py``.
"""

from __future__ import annotations

import dataclasses
import math

MAXTEXT = "MaxText @ 632f65147: MaxText/configs/{hw}/README.md, MaxText/configs/{hw}/{script}.sh"
MAXTEXT_A3 = "MaxText @ efb6d9e4a: MaxText/configs/a3/llama_2_7b/README.md, {n}vm.sh"
NVIDIA = "NVIDIA/dgxc-benchmarking @ {commit}: maxtext/README_70b.md, maxtext/configure.sh"
MEGATRON = "Narayanan et al. 2021 (arXiv:2104.04473), Table 1"


@dataclasses.dataclass(frozen=True)
class Row:
    """One published measurement and the layout it ran."""

    id: str  # stable: the hold-out split names rows by it
    source: str  # maxtext | maxtext-a3 | nvidia-maxtext | megatron
    cite: str
    hardware: str  # profile name
    chips: int
    # model
    embed: int
    heads: int
    head_dim: int
    mlp: int
    layers: int
    vocab: int
    seq: int
    batch: int  # global, sequences
    mesh: tuple[tuple[str, int], ...]  # outermost first
    rules: str  # fsdp_tp | fsdp | megatron (layers over stage + tp)
    kv_heads: int = 0  # 0: as many as heads
    mlp_inputs: int = 1  # input matrices of the MLP: 1 (ReLU / GeLU), 2 (gated)
    tied: bool = True  # the embedding table is also the output projection
    # layout
    nodes: tuple[tuple[str, int], ...] = ()  # axes across nodes (GPUs) / slices (TPUs), {axis: count}
    slice_chips: int = 0  # TPUs: chips per ICI slice (the profile's node_size)
    microbatches: int = 1  # pipeline micro-batches
    remat: str = "full"  # the toolkit's policy keeping no more memory than the source's
    recompute: float | None = None  # the source's policy: share of the forward matmuls recomputed (None: remat's)
    attention: str = "fused"
    network: float = 0.0  # bytes/s per device across nodes, where the source's machines differ from the profile's
    # measured
    mfu: float = 0.0  # published MFU (the source's FLOPs / peak)
    tflops: float = 0.0  # published TFLOP/s per chip, where the source gives it

    @property
    def groups(self) -> int:
        return self.kv_heads or self.heads

    @property
    def params(self) -> int:
        attn = 2 * self.embed * self.heads * self.head_dim + 2 * self.embed * self.groups * self.head_dim
        mlp = (self.mlp_inputs + 1) * self.embed * self.mlp
        tables = self.vocab * self.embed * (1 if self.tied else 2)
        return self.layers * (attn + mlp + 2 * self.embed) + tables + self.embed

    def source_flops(self) -> float:
        """The source's FLOPs of one step, all chips."""
        tokens = self.batch * self.seq
        if self.source in ("maxtext", "maxtext-a3"):
            attention = 12 * self.heads * self.layers * self.head_dim * self.seq * tokens / 2
            return 6 * self.params * tokens + attention
        if self.source == "nvidia-maxtext":
            d, layer = self.embed, self.layers
            attn = 12 * layer * d * d * (1 + self.groups / self.heads + self.seq / d)
            return tokens * (attn + 18 * layer * self.mlp * d + 6 * self.vocab * d)
        h, s, l_, v = self.embed, self.seq, self.layers, self.vocab
        return 96 * self.batch * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))


def _maxtext_scale(scale: int) -> tuple[int, int, int, int]:
    """(embed, heads, mlp, layers) exponents of MaxText's global_parameter_scale (pyconfig.get_individual_scales)."""
    base, rem = divmod(int(math.log2(scale)), 3)
    heads = base + int(rem > 0)
    return base + int(rem > 1), heads, heads, base


def _chips(hw: str, kind: str) -> int:
    n = int(kind.split("-")[1])
    return n // 2 if hw in ("v5p", "v4") else n


def maxtext(hw, script, dims, per_device, tensor, remat, runs) -> list[Row]:
    """Rows of one MaxText TPU script: ``dims`` a global_parameter_scale or (embed, heads, mlp, layers);
    ``runs`` maps ``"<slices>x <hw>-<N>"`` to (TFLOP/s per chip, MFU %)."""
    if isinstance(dims, int):
        e, h, m, lyr = _maxtext_scale(dims)
        dims = (2560 * 2**e, 8 * 2**h, 8192 * 2**m, 16 * 2**lyr)
    embed, heads, mlp, layers = dims
    out = []
    for label, (tflops, mfu) in runs.items():
        slices, kind = label.split("x ")
        per_slice = _chips(hw, kind)
        total = int(slices) * per_slice
        fsdp = per_slice // tensor
        out.append(
            Row(
                f"maxtext-{hw}-{script}-{label.replace(' ', '')}",
                "maxtext",
                MAXTEXT.format(hw=hw, script=script),
                hw,
                total,
                embed=embed,
                heads=heads,
                head_dim=256,
                mlp=mlp,
                layers=layers,
                vocab=32768,
                seq=2048,
                batch=per_device * total,
                mesh=(("data", int(slices)), ("fsdp", fsdp), ("tensor", tensor)),
                rules="fsdp_tp",
                nodes=(("data", int(slices)),) if int(slices) > 1 else (),
                slice_chips=per_slice,
                remat={"minimal": "dots_no_batch", "full": "full"}[remat],
                tflops=tflops,
                mfu=mfu / 100,
            )
        )
    return out


# An A3 VM (a3-highgpu-8g) reaches other VMs through 4 NICs of 200 Gb/s for its 8 GPUs (GPUDirect-TCPX):
# 100 Gb/s per GPU, an eighth of a DGX H100's InfiniBand (https://cloud.google.com/compute/docs/gpus#a3-series).
A3_NETWORK = 100e9 / 8


def maxtext_a3(runs: dict[int, float]) -> list[Row]:
    """Llama-2 7B on ``n`` A3 VMs: TFLOP/s per chip (MFU against the H100's 989)."""
    return [
        Row(
            f"maxtext-a3-llama2-7b-{n}vm",
            "maxtext-a3",
            MAXTEXT_A3.format(n=n),
            "h100",
            8 * n,
            embed=4096,
            heads=32,
            head_dim=128,
            mlp=11008,
            mlp_inputs=2,
            layers=32,
            vocab=32000,
            tied=False,
            seq=4096,
            batch=4 * 8 * n,
            mesh=(("data", n), ("fsdp", 8)),
            rules="fsdp",
            nodes=(("data", n),) if n > 1 else (),
            remat="dots_no_batch",  # minimal_flash: the projections and the flash output kept
            recompute=0.0,
            network=A3_NETWORK,
            tflops=tflops,
            mfu=tflops / 989,
        )
        for n, tflops in runs.items()
    ]


def nvidia(model: str, commit: str, seq: int, vocab: int, recompute: float, runs: dict[int, float]) -> list[Row]:
    """Llama ``model`` 70B (BF16) on ``n`` H100s: FSDP over 8 GPUs x min(nodes, 16) nodes, data parallel beyond."""
    out = []
    for n, mfu in runs.items():
        nodes = n // 8
        dcn_fsdp = nodes if nodes < 64 else 16  # configure.sh: dcn_FSDP=16 from 64 nodes on
        data = nodes // dcn_fsdp
        out.append(
            Row(
                f"nvidia-maxtext-{model}-70b-{n}",
                "nvidia-maxtext",
                NVIDIA.format(commit=commit),
                "h100",
                n,
                embed=8192,
                heads=64,
                kv_heads=8,
                head_dim=128,
                mlp=28672,
                mlp_inputs=2,
                layers=80,
                vocab=vocab,
                tied=False,
                seq=seq,
                batch=2 * n,
                mesh=(("data", data), ("fsdp", 8 * dcn_fsdp)),
                rules="fsdp",
                nodes=tuple((a, k) for a, k in (("data", data), ("fsdp", dcn_fsdp)) if k > 1),
                remat="full",
                recompute=recompute,
                mfu=mfu / 100,
            )
        )
    return out


def megatron(params_b, heads, hidden, layers, t, p, n, batch, tflops, pct) -> Row:
    """One row of Table 1: tensor t inside a node, p pipeline stages, micro-batches of one sequence."""
    d = n // (t * p)
    return Row(
        f"megatron-{params_b}b-{n}",
        "megatron",
        MEGATRON,
        "a100-80g",
        n,
        embed=hidden,
        heads=heads,
        head_dim=hidden // heads,
        mlp=4 * hidden,
        layers=layers,
        vocab=51200,
        seq=2048,
        batch=batch,
        mesh=(("stage", p), ("data", d), ("tensor", t)),
        rules="megatron",
        microbatches=batch // d if p > 1 else 1,
        remat="full",
        attention="softmax",
        tflops=tflops,
        mfu=pct / 100,
    )


# The share of the forward matmul FLOPs a MaxText policy recomputes, for a gated Llama block of these widths:
# save_dot_except_mlpwi recomputes the MLP's two input matrices; save_qkv_proj everything but q, k and v.
def _share(embed: int, groups_dim: int, mlp: int, keep: str) -> float:
    q_o, kv, mlp_in, mlp_out = 2 * embed * embed, 2 * embed * groups_dim, 2 * embed * mlp, embed * mlp
    total = q_o + kv + mlp_in + mlp_out
    return (mlp_in if keep == "all but wi" else total - embed * embed - kv) / total


LLAMA2_70B_WI = _share(8192, 1024, 28672, "all but wi")
LLAMA3_70B_QKV = _share(8192, 1024, 28672, "qkv")

ROWS: list[Row] = [
    *maxtext("v5p", "32b", 32, 8, 4, "minimal", {"1x v5p-128": (328, 71.47), "2x v5p-128": (319, 69.43)}),
    *maxtext("v5p", "64b", 64, 4, 4, "minimal", {"1x v5p-128": (323, 70.31), "2x v5p-128": (309, 67.26)}),
    *maxtext(
        "v5p",
        "128b",
        128,
        2,
        8,
        "minimal",
        {
            "1x v5p-256": (315, 68.68),
            "2x v5p-256": (305, 66.34),
            "1x v5p-512": (316, 68.83),
            "2x v5p-512": (274, 59.66),
        },
    ),
    *maxtext("v5p", "256b", 256, 2, 8, "minimal", {"1x v5p-1024": (308, 67.09), "2x v5p-1024": (289, 62.99)}),
    *maxtext("v5p", "512b", 512, 2, 16, "full", {"1x v5p-1024": (294, 63.99), "2x v5p-1024": (282, 61.45)}),
    *maxtext(
        "v5p",
        "1024b",
        1024,
        2,
        16,
        "full",
        {
            "1x v5p-2048": (254, 55.35),
            "2x v5p-2048": (237, 51.55),
            "1x v5p-4096": (297, 64.80),
            "2x v5p-4096": (279, 60.83),
        },
    ),
    *maxtext(
        "v5e",
        "16b",
        16,
        6,
        1,
        "full",
        {
            "1x v5e-256": (120, 61.10),
            "2x v5e-256": (117, 59.37),
            "4x v5e-256": (117, 59.14),
            "8x v5e-256": (115, 58.27),
            "16x v5e-256": (111, 56.56),
            "32x v5e-256": (108, 54.65),
        },
    ),
    *maxtext(
        "v5e",
        "32b",
        32,
        4,
        1,
        "full",
        {
            "1x v5e-256": (132, 66.86),
            "2x v5e-256": (128, 64.81),
            "4x v5e-256": (126, 64.10),
            "8x v5e-256": (125, 63.67),
            "16x v5e-256": (123, 62.26),
            "32x v5e-256": (119, 60.40),
        },
    ),
    *maxtext(
        "v5e",
        "64b",
        64,
        2,
        1,
        "full",
        {
            "1x v5e-256": (118, 59.90),
            "2x v5e-256": (112, 56.66),
            "4x v5e-256": (110, 55.85),
            "8x v5e-256": (108, 54.96),
            "16x v5e-256": (105, 53.29),
            "32x v5e-256": (99, 50.18),
        },
    ),
    *maxtext(
        "v5e",
        "128b",
        128,
        1,
        16,
        "full",
        {
            "1x v5e-256": (110, 56.06),
            "2x v5e-256": (110, 55.82),
            "4x v5e-256": (108, 54.93),
            "8x v5e-256": (104, 52.93),
            "16x v5e-256": (100, 50.86),
            "32x v5e-256": (91, 46.25),
        },
    ),
    *maxtext(
        "v4",
        "22b",
        (6144, 24, 24576, 48),
        16,
        1,
        "full",
        {"1x v4-128": (156, 56.7), "2x v4-128": (152, 55.2), "4x v4-128": (149, 54.3), "8x v4-128": (146, 53.2)},
    ),
    *maxtext("v4", "52b", (12288, 32, 49152, 32), 10, 1, "full", {"1x v4-384": (154, 56.0), "2x v4-384": (162, 58.9)}),
    *maxtext_a3({1: 492, 2: 422, 4: 407, 8: 409, 16: 375}),
    *nvidia(
        "llama2",
        "35a9aec",
        4096,
        32000,
        LLAMA2_70B_WI,
        {64: 52.59, 128: 52.04, 256: 51.45, 512: 51.90, 1024: 51.95, 2048: 52.09},
    ),
    *nvidia(
        "llama3",
        "8f5cbb3",
        8192,
        128256,
        LLAMA3_70B_QKV,
        {128: 51.20, 256: 51.59, 512: 51.34, 1024: 51.06, 2048: 50.12},
    ),
    megatron(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    megatron(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    megatron(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    megatron(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    megatron(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    megatron(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    megatron(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    megatron(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    megatron(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    megatron(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
]
