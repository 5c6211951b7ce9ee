"""The run config's typed sections: pydantic v2 models with every default and every range.

Unknown keys are errors (``extra="forbid"``), types are strict (``steps: "10"`` is not an int; an int is
fine where a float is expected) and every number has its range. :func:`json_schema` is what
``partitioning config schema`` prints, so editors can complete and check YAML configs.

Example::

    >>> from partitioning.config.schema import OptimizerConfig, TrainConfig
    >>> TrainConfig().steps, OptimizerConfig().name
    (200, 'adamw')
    >>> TrainConfig(steps=0)
    Traceback (most recent call last):
    pydantic_core._pydantic_core.ValidationError: ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from partitioning.errors import did_you_mean
from partitioning.fmt import parse_bytes
from partitioning.rules import Rules
from partitioning.yamlfile import Key, dump_yaml, where


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MeshConfig(Section):
    """``mesh:``: axis names and sizes, axis types, the nodes they span, devices and their memory."""

    shape: dict[StrictStr, StrictInt] = Field(
        default_factory=lambda: {"data": 1, "fsdp": -1}, description="ordered {axis: size}; at most one -1 (the rest)"
    )
    axis_types: Literal["auto", "explicit"] = "auto"
    devices: StrictInt | None = Field(default=None, ge=1, description="devices to use; simulated on the CPU if needed")
    device_memory: StrictInt | StrictStr | None = Field(
        default=None, description="per-device memory budget, e.g. 80GiB (default: what the device reports)"
    )
    host_memory: StrictInt | StrictStr | None = Field(
        default=None, description="per-process host memory for offloaded state, e.g. 1TiB (default: this machine's RAM)"
    )
    unused_axes: list[StrictStr] = Field(
        default_factory=list,
        description="mesh axes no rule uses, kept on purpose (every device along them repeats the same work)",
    )
    nodes: dict[StrictStr, StrictInt] | None = Field(default=None, description="{axis: nodes}: axes that span nodes")

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError("needs at least one axis, e.g. {data: -1}")
        for name, size in v.items():
            if not name:
                raise ValueError("axis names must be non-empty")
            if size < 1 and size != -1:
                raise ValueError(f"axis {name!r}: size must be a positive integer or -1, got {size}")
        if sum(1 for s in v.values() if s == -1) > 1:
            raise ValueError(f"mesh {dict(v)} has more than one -1; at most one axis can take the rest of the devices")
        return v

    @model_validator(mode="after")
    def _unused_axes(self) -> MeshConfig:
        for a in self.unused_axes:
            if a not in self.shape:
                raise ValueError(
                    f"unused_axes: {a!r} is not a mesh axis ({', '.join(self.shape)}){did_you_mean(a, self.shape)}"
                )
        return self

    @field_validator("device_memory", "host_memory")
    @classmethod
    def _memory(cls, v: Any) -> Any:
        if v is not None and parse_bytes(v) < 1:
            raise ValueError("must be at least 1 byte")
        return v

    @property
    def memory_bytes(self) -> int | None:
        return None if self.device_memory is None else parse_bytes(self.device_memory)


class DataConfig(Section):
    """``data:``: text or pre-tokenized arrays to train on (or ``_target_``: any dataset object)."""

    source: Literal["text", "tokens"] | None = Field(
        default=None, description="text (bytes) | tokens (.npy / .bin arrays); null: from the path"
    )
    path: StrictStr | None = Field(default=None, description="a file or folder; null: the embedded corpus")
    eval_path: StrictStr | None = Field(default=None, description="the eval data; null: split off path")
    dtype: Literal["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"] | None = Field(
        default=None, description="tokens of a raw .bin file (a .npy file says its own)"
    )
    eval_fraction: float = Field(default=0.05, gt=0, lt=1)
    seed: StrictInt = Field(default=0, ge=0, description="order of training examples")
    tokenizer: StrictStr | None = Field(
        default=None,
        description="text: a tokenizer.json (or a folder holding one) to tokenize with; null: bytes, or the "
        "checkpoint's tokenizer.json with model.hf",
    )
    cache_dir: StrictStr | None = Field(
        default=None, description="where tokenized data is cached; null: $XDG_CACHE_HOME/partitioning/tokens"
    )
    log_batches: StrictBool = Field(
        default=False, description="debug: a digest of each step's batch in RUN_DIR/batches.N.jsonl"
    )
    format: Literal["text", "chat", "prompt_completion"] = Field(
        default="text",
        description="text | chat (JSONL rows {messages: [{role, content}, ...]}, the checkpoint's chat template) | "
        "prompt_completion (JSONL rows {prompt, completion})",
    )
    train_on_prompt: StrictBool = Field(
        default=False, description="chat / prompt_completion: the loss counts every token, not only the answers"
    )
    packing: StrictBool | None = Field(
        default=None, description="several examples per row, with segment ids; null: true for chat / prompt_completion"
    )
    chat_template: StrictStr | None = Field(
        default=None,
        description="chat: a folder with tokenizer_config.json / chat_template.jinja, or a .jinja file; "
        "null: the tokenizer's folder",
    )
    truncation: Literal["right", "left", "drop"] | None = Field(
        default=None, description="an example over seq_len + 1 tokens: cut its end (right), start (left) or drop it"
    )
    max_truncated_answers: float = Field(
        default=0.1, ge=0, le=1, description="warn when truncation at seq_len cuts more of the answer tokens than this"
    )
    target: dict[str, Any] | None = Field(default=None, exclude=True)  # {_target_: module.fn, ...}


class HfModelConfig(Section):
    """``model: {hf: DIR}``: a Hugging Face checkpoint's model (``config.json``) and how to run it."""

    hf: StrictStr = Field(description="a checkpoint folder (config.json, safetensors) or a config.json file")
    scan_layers: StrictBool = Field(default=True, description="stack the layers and scan over them")
    remat: Literal["auto", "none", "full", "dots", "dots_no_batch", "offload"] = Field(
        default="auto", description="auto: the fastest policy that fits, as for the reference GPT"
    )
    dtype: StrictStr | None = Field(default=None, description="compute dtype; null: float32")
    param_dtype: StrictStr | None = Field(default=None, description="parameter dtype; null: float32")
    lora: dict[str, Any] | None = Field(
        default=None,
        description="LoRA: {rank, alpha (default: rank), targets: [regex over parameter paths], dropout, rslora, "
        "dtype (float32), base_dtype (int8 | nf4: QLoRA's quantized frozen base), base_block (64)}; also name: gpt",
    )
    adapter: StrictStr | None = Field(
        default=None,
        description="a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) for this base: "
        "its config sets the LoRA, training and generate start from its weights",
    )
    capacity_factor: float | None = Field(
        default=None,
        gt=0,
        description="mixture-of-experts checkpoints (Mixtral, Qwen3-MoE): each expert takes at most "
        "ceil(capacity_factor * tokens * top_k / experts) tokens of a sequence, the rest skip it; "
        "null: dropless (no token dropped, logits as transformers')",
    )
    attention: Literal["xla", "cudnn", "auto"] = Field(
        default="xla",
        description="attention kernel: xla (the toolkit's einsums, every option), cudnn "
        "(jax.nn.dot_product_attention's flash kernel: an NVIDIA GPU and a bfloat16 / float16 dtype), "
        "auto (cudnn where it applies)",
    )
    context_parallel: Literal["ring", "all_gather", "auto"] = Field(
        default="auto", description="attention over a `length` the rules split (fsdp_cp): ring | all_gather | auto"
    )


class OptimizerConfig(Section):
    """``optimizer:``: adamw / adafactor / sgd with warmup and a decay schedule."""

    name: Literal["adamw", "adafactor", "sgd"] = "adamw"
    lr: float = Field(default=3e-3, gt=0)
    warmup_steps: StrictInt = Field(default=20, ge=0)
    schedule: Literal["cosine", "constant", "linear"] = "cosine"
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0)
    b1: float = Field(default=0.9, ge=0, lt=1)
    b2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    momentum: float = Field(default=0.9, ge=0, le=1, description="sgd only")
    clip_norm: float | None = Field(default=1.0, gt=0, description="global-norm clipping; null: off")


Tracker = Literal["jsonl", "tensorboard", "wandb"]


class TrainConfig(Section):
    """``train:``: steps, the global batch, logging, evaluation, the task and its RNG streams."""

    steps: StrictInt = Field(default=200, ge=1)
    batch_size: StrictInt = Field(default=32, ge=1, description="global; divisible by the batch mesh axes")
    seq_len: StrictInt = Field(default=128, ge=1)
    grad_accum: Annotated[StrictInt, Field(ge=1)] | Literal["auto"] = Field(
        default="auto", description="micro-batches per step; auto: the fastest count that fits (1 when it fits)"
    )
    microbatches: Annotated[StrictInt, Field(ge=1)] | Literal["auto"] | None = Field(
        default=None, description="pipeline micro-batches (a `stage` axis); null / auto: the fastest that fits"
    )
    pipeline_repeats: StrictInt = Field(
        default=1, ge=1, description="layer chunks per pipeline stage: 1 GPipe, more the circular schedule"
    )
    log_every: StrictInt = Field(default=10, ge=1)
    eval_every: StrictInt = Field(default=50, ge=0)
    eval_batches: StrictInt = Field(default=4, ge=0, description="0: no eval")
    tracker: list[Tracker] = Field(
        default_factory=lambda: list[Tracker](["jsonl", "tensorboard"]),
        description="where logged metrics go: RUN_DIR/metrics.jsonl, RUN_DIR/tensorboard/, wandb (an extra)",
    )
    seed: StrictInt = Field(default=0, ge=0)
    loss: StrictStr | dict[str, Any] = Field(
        default="next_token", description="next_token | same_token | classification | {_target_: fn}"
    )
    step: dict[str, Any] | None = Field(default=None, description="{_target_: fn}: a whole step(forward, batch)")
    inputs: dict[str, Any] | None = Field(default=None, description="{_target_: fn}: batch -> model args/kwargs")
    rngs: list[StrictStr] = Field(default_factory=lambda: ["dropout"], description="RNG streams for the model")
    on_nonfinite: Literal["stop", "skip_step"] = Field(
        default="stop",
        description="a NaN / inf loss or gradient norm: stop (exit 2, nothing saved) | skip_step (drop that update)",
    )
    trainable: list[StrictStr] | None = Field(
        default=None,
        description="regexes (re.search) over the param paths `plan` prints: only those params train; the others "
        "are frozen (no gradient, no optimizer state, saved once per run). Default: all, or the LoRA adapters",
    )
    measure_defaults: StrictBool | None = Field(
        default=None, description="time the auto defaults' choices at start (cached); null: when the run is long enough"
    )
    max_skipped_steps: StrictInt = Field(
        default=10, ge=0, description="skip_step: more skipped steps in a row stop the run (exit 2): it diverges"
    )
    offload: list[Literal["optimizer", "params"]] = Field(
        default_factory=list, description="state kept in host memory between steps, in its layout: optimizer, params"
    )
    offload_update: Literal["device", "host"] = Field(
        default="device", description="an offloaded optimizer state's update: device (moved in and back) | host"
    )


class CheckpointConfig(Section):
    """``checkpoint:``: where, how often, how many to keep."""

    dir: StrictStr | None = Field(default=None, description="null: RUN_DIR/checkpoints")
    every: StrictInt = Field(default=0, ge=0, description="0: only at the end (and on Ctrl-C / SIGTERM)")
    keep: StrictInt = Field(default=3, ge=0, description="the last N; 0: keep all")
    keep_best: StrictBool = False
    async_: StrictBool = Field(default=True, alias="async")
    on_error: Literal["stop", "continue"] = Field(
        default="stop", description="a save that fails (e.g. a full disk): stop (exit 2) | continue (say so, train on)"
    )
    verify: StrictBool = Field(
        default=True,
        description="refuse a damaged checkpoint on resume: every part there, every byte read matches its crc32c",
    )


class RunConfig(Section):
    """A whole run config, as a JSON Schema (``partitioning config schema``) and for validation."""

    model: dict[str, Any] = Field(
        description="{name: gpt, ...}, {_target_: module.Class, ...} or {hf: checkpoint dir, scan_layers, remat, ...}"
    )
    mesh: MeshConfig = Field(default_factory=MeshConfig)
    rules: Any = Field(
        description="a preset, a rules file, a list of [logical, mesh_axes] or {preset, extra, batch_axes}"
    )
    optimizer_rules: Any = None
    annotations: Any = Field(
        default=None,
        description="logical names by parameter path for models without them: an ordered list of "
        "[path_regex, names] rows (first match wins; names: a logical name or null per dimension), or "
        "{rows: [...], strict: true} (a row matching nothing is an error, not a warning), or a file holding "
        "`annotations:` (what `partitioning annotate --out` writes)",
    )
    on_indivisible: Literal["error", "replicate"] = "error"
    data: DataConfig = Field(default_factory=DataConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    run_dir: StrictStr | None = Field(default=None, description="default: runs/<config file name>")
    base: StrictStr | None = Field(default=None, description="a config this one extends (its keys win)")


SECTIONS: dict[str, type[Section]] = dict(
    mesh=MeshConfig, data=DataConfig, optimizer=OptimizerConfig, train=TrainConfig, checkpoint=CheckpointConfig
)
TOP_KEYS = list(RunConfig.model_fields)
REQUIRED = ["model", "mesh", "rules"]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a run config (for editors)."""
    schema = RunConfig.model_json_schema(by_alias=True)
    schema["title"] = "partitioning run config"
    return schema


class Config:
    """A validated run config. ``raw`` is what the file(s) and ``--set`` said; sections are typed.

    Example::

        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
        >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
        ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
        >>> cfg = pt.load_config(path)
        >>> cfg.model_name, cfg.train.batch_size, cfg.where("train", "steps")
        ('mlp', 8, '.../run.yaml:1: train.steps')
    """

    def __init__(
        self,
        *,
        path: str,
        raw: dict[str, Any],
        lines: dict[Key, Any],
        model_name: str,
        model_options: dict[str, Any],
        model_target: bool,
        mesh: MeshConfig,
        rules: Rules,
        optimizer_rules: Rules | None,
        on_indivisible: str,
        data: DataConfig,
        optimizer: OptimizerConfig,
        train: TrainConfig,
        checkpoint: CheckpointConfig,
        run_dir: str,
        model_hf: Path | None = None,
        annotations: Any = None,
    ):
        self.path, self.raw, self.lines = path, raw, lines
        self.model_hf = model_hf  # model: {hf: ...}: the checkpoint folder (or config.json), found for the config
        self.annotations = annotations  # partitioning.Annotations (rows with their file:line), or None
        self.model_name, self.model_options, self.model_target = model_name, model_options, model_target
        self.mesh, self.rules, self.optimizer_rules, self.on_indivisible = mesh, rules, optimizer_rules, on_indivisible
        self.data, self.optimizer, self.train = data, optimizer, train
        self.checkpoint, self.run_dir = checkpoint, run_dir

    def where(self, *key: Any) -> str:
        """``file:line: dotted.key`` of a key of this config (or the ``--set`` flag that set it)."""
        return where(self.path, self.lines, key)

    def rules_label(self, located: bool = True) -> str:
        """The rule table and where it came from, for titles: ``rules fsdp_tp (--set rules=fsdp_tp)``,
        ``rules fsdp (configs/quickstart.yaml:23)``, ``6 rules (configs/x.yaml:12)``."""
        value = self.raw.get("rules")
        if isinstance(value, str):
            name = f"rules {value}"
        elif isinstance(value, dict) and isinstance(value.get("preset"), str):
            extra = len(value.get("extra") or [])
            name = f"rules {value['preset']}{f' + {extra} extra' if extra else ''}"
        else:
            name = f"{len(self.rules)} rules"
        return f"{name} ({where(self.path, self.lines, ('rules',)).removesuffix(': rules')})" if located else name

    def resolved(self, mesh_sizes: dict[str, int] | None = None, model_options: dict[str, Any] | None = None) -> dict:
        """Every key with its value or default, the rule tables written out, mesh sizes resolved if given."""
        model_head = "_target_" if self.model_target else "hf" if self.model_hf is not None else "name"
        mesh = self.mesh.model_dump(by_alias=True)
        if mesh_sizes is not None:
            mesh["shape"] = dict(mesh_sizes)
        out: dict[str, Any] = {
            "model": {model_head: self.model_name, **(model_options or self.model_options)},
            "mesh": mesh,
            "rules": self.rules.to_config(),  # with its batch_axes and follows, if any
        }
        out["optimizer_rules"] = self.optimizer_rules.to_list() if self.optimizer_rules is not None else None
        if self.annotations is not None:
            out["annotations"] = self.annotations.to_config()
        out["on_indivisible"] = self.on_indivisible
        target = self.data.target
        out["data"] = self.data.model_dump(by_alias=True) if target is None else {**target, "seed": self.data.seed}
        for name in ("optimizer", "train", "checkpoint"):
            out[name] = getattr(self, name).model_dump(by_alias=True)
        out["run_dir"] = self.run_dir
        return out

    def to_yaml(self, mesh_sizes: dict[str, int] | None = None, model_options: dict[str, Any] | None = None) -> str:
        """:meth:`resolved` as YAML: what ``config show`` prints and ``run_dir/config.yaml`` holds."""
        return dump_yaml(self.resolved(mesh_sizes, model_options))


__all__ = [  # noqa: RUF022 (grouped: the config, its sections, the schema)
    *("Config", "RunConfig", "MeshConfig", "DataConfig", "HfModelConfig", "OptimizerConfig", "TrainConfig"),
    *("CheckpointConfig", "SECTIONS", "TOP_KEYS", "REQUIRED", "json_schema"),
]
