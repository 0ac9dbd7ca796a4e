"""The run file: one TOML file describes a training run, read into typed, validated models.

Every field has a docstring saying what it trades off. Unknown fields, wrong types and impossible
values fail at load time with one line naming the field, the value and what is allowed; the
trainer only ever reads the resolved config, which is written to the run directory and saved with
every checkpoint. Two checks cover every section at once instead of each field: `check_numbers`
(no inf or nan, no true/false for a number) and, at the start of a run, `check_against_model`
(the fields that depend on the model, read from its config.json before its weights load).
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from grooves.watch.config import WatchConfig

MatmulForms = Literal["timed_head", "fixed", "timed"]
"""What `ModelConfig.matmul_forms` may be."""
ToolFormats = Literal["smollm2", "template"]
"""What `ModelConfig.tool_format` may be (the names of `policy.tool_format.TOOL_FORMATS`)."""
_DEVICE = re.compile(r"^(cpu|mps|(cuda|xpu)(:\d+)?)$")
TaskOptions = dict[str, str | int | Annotated[float, AllowInfNan(True)] | bool]
"""A task's constructor options. inf/nan pass the union here (one error per member type
otherwise) and are refused, on one line, by `check_numbers`."""


class _Section(BaseModel):
    # inf and nan are refused here, and in every other section by `check_numbers`
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(_Section):
    base_model: str = "smollm2-135m"
    """`smollm2-135m` (the embedded default, provisioned offline), a local directory, or a hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """float32 on CPU (bf16 matmuls are slow there and logprob mismatch grows); bf16 on GPUs."""
    device: str = "cpu"
    """`cpu`, `cuda`, `cuda:N`, `mps`, `xpu` or `xpu:N`; a device torch does not see is refused at start."""
    tool_format: ToolFormats | None = None
    """How tools appear in the prompt: `smollm2`, `template`, or unset to pick from the chat template."""
    backend: Literal["transformers", "vllm"] = "transformers"
    """`vllm` samples on a GPU with vLLM while training stays on transformers+peft."""
    merge_lora_for_sampling: bool = True
    """transformers backend: sample with the adapter folded into a copy of the adapted weights
    (one matmul per layer instead of three: faster decoding on CPU, for one more copy of
    those weights in memory). false: sample through peft's LoRA layers."""
    fused_decode: bool = True
    """transformers backend, Llama/Qwen2 models: decode with the sampler's own forward (q/k/v and
    gate/up as one matmul each, a KV cache written in place; see `policy/decode.py`). false: every
    decode step runs through transformers' forward. Other model types always use the latter."""
    matmul_forms: MatmulForms = "timed_head"
    """CPU sampling. A decode matmul can run as `x W^T` or as `(W x^T)^T`: the same product through
    another BLAS kernel, with other float rounding, and on some CPUs several times faster at a few
    rows. `timed_head`: only the output head's form is chosen, per row count, by timing it once on
    its own weight before it is used; the blocks run `x W^T`. `fixed`: `x W^T` everywhere, nothing
    depends on a timing. `timed`: the blocks' forms too, from their first real decode steps; a
    choice made on a busy machine can differ between two runs of one seed, which then sample other
    tokens and drift apart within a few steps. See docs/speed.md."""
    reuse_freed_memory: bool = True
    """CPU on glibc: keep the big blocks torch frees for reuse instead of unmapping them, so a step's
    40 MB logits tensors are not page-faulted in again every time (see `policy/allocator.py`);
    the process keeps its peak memory between steps. false: glibc's defaults."""
    init_adapter: str | None = None
    """Start training from these adapter weights instead of a fresh LoRA (e.g. an SFT warm start):
    an adapter folder (peft), a checkpoint (`runs/x/checkpoints/step_N`) or a run folder (its
    latest checkpoint). Checked at start: it must have been trained on this `base_model`, and its
    rank, alpha and target modules must equal `[lora]`'s. The optimizer starts fresh."""

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError("not a device; use cpu, cuda, cuda:N, mps, xpu or xpu:N")
        return value


class LoraConfig(_Section):
    rank: int = Field(8, ge=1)
    """Adapter rank. RL moves few directions: ranks 1-16 train as well as full rank for small tasks."""
    alpha: float = Field(16.0, gt=0)
    """Update scale is alpha/rank; keep alpha/rank near 2 when changing rank."""
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], min_length=1)
    """Linear layers that get adapters: attention and MLP (all) learn faster than attention only.
    Each name must match a layer of the model (checked at start, before the weights load)."""


class RolloutConfig(_Section):
    group_size: int = Field(8, ge=2)
    """Rollouts per scenario. Advantages are relative to the group: 1 gives no signal."""
    groups_per_step: int = Field(4, ge=1)
    """Scenarios per optimizer step. More = less noisy gradient, slower steps."""
    concurrency: int = Field(64, ge=1)
    """Rollouts in flight at once (requests are batched together by the sampler)."""
    temperature: float = Field(1.0, ge=0, le=2)
    """Sampling temperature. Below ~0.7 groups lose diversity and more of them have zero variance.
    The trainer recomputes each turn's logprobs at the temperature that turn was sampled at (a task
    may ask for another), and a greedy turn (0) at 1, the temperature of the logprobs it reports."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling. Below 1 the sampler and trainer distributions differ (off-policy bias)."""
    max_tokens: int = Field(64, ge=1)
    """Per-turn completion budget; also L in the constant of `aggregation = "constant"` (Dr. GRPO)."""
    max_failure_fraction: float = Field(0.5, ge=0, le=1)
    """Stop the run if more than this fraction of a step's rollouts raise."""
    runner: Literal["local", "ray"] = "local"
    """Where rollouts run. local: in this process (asyncio), enough while the policy is the bottleneck.
    ray: in Ray actors that call the policy over HTTP, for environments that need more CPU than one
    process (or more machines); needs `pip install 'grooves[ray]'`."""
    ray_address: str | None = None
    """`ray.init(address=...)` for runner = "ray": unset starts a local Ray; `auto` or `ray://host:10001` joins a cluster."""
    ray_workers: int = Field(2, ge=1)
    """Rollout actors for runner = "ray"; each runs many rollouts at once (asyncio), so a few per machine suffice."""
    server_host: str = "127.0.0.1"
    """Where the policy's HTTP server listens for Ray workers: 127.0.0.1 on one machine; 0.0.0.0 on a
    cluster (workers then call this node's IP)."""


class VllmConfig(_Section):
    """Settings of the vLLM backend (`model.backend = "vllm"`), unused otherwise."""

    gpu_memory_utilization: float = Field(0.3, gt=0, lt=1)
    """Share of the GPU vLLM takes (weights + KV cache); training on the same GPU uses the rest.
    More = larger decode batches, less room for training activations."""
    sleep_level: Literal[0, 1, 2] = 0
    """0: vLLM stays resident. 1: it sleeps through each optimizer step (weights to CPU RAM, KV cache
    freed), for models whose training needs the whole GPU; costs a weight copy each way per step.
    2: weights dropped instead (less CPU RAM, reloaded from disk each step)."""
    enforce_eager: bool = False
    """Skip CUDA-graph capture: starts ~1 min sooner, decodes slower. For short runs and tests."""
    max_model_len: int | None = None
    """Context length vLLM reserves KV cache for; unset: the model's. Lower it to fit more sequences."""


class AlgorithmConfig(_Section):
    advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    """grpo: (r - mean)/std; dr_grpo: r - mean (no std, no length bias); rloo: leave-one-out baseline."""
    scale_by_std: bool = True
    """GRPO only. Dividing by std up-weights near-unanimous groups (a known difficulty bias)."""
    std_floor: float = Field(1e-3, gt=0)
    """Floor on the group std, so fractional rewards with float-residue variance can't explode."""
    loss: Literal["ppo", "cispo", "gspo"] = "ppo"
    """ppo: token ratio clipping (DAPO with eps_high > eps_low); cispo: clipped IS weight, every token
    keeps its gradient; gspo: one sequence-level ratio (geometric mean of token ratios)."""
    eps_low: float = Field(0.2, gt=0, lt=1)
    eps_high: float = Field(0.28, gt=0)
    """Clip range [1 - eps_low, 1 + eps_high]. DAPO's clip-higher (0.28 > 0.2) keeps exploration.
    For gspo use ~3e-4 / 4e-4."""
    aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    """token_mean (DAPO): every token weighs the same, divided by the tokens trained this step.
    sequence_mean (GRPO): per-sequence means, biased toward long wrong answers (see Dr. GRPO).
    constant (Dr. GRPO): sum / (groups_per_step x group_size x rollout.max_tokens), one number for
    the whole run: rollouts of dropped zero-variance groups (and failed ones) count, as in the
    paper. max_tokens is a per-turn budget: a multi-turn rollout may hold more sampled tokens than
    it, and each of them weighs the same 1 / constant as a one-turn rollout's."""
    kl_beta: float = Field(0.0, ge=0)
    """Weight of the per-token KL penalty to the base model (adapter disabled), added to the loss
    and aggregated like it. 0, the default, is no penalty (as in DAPO) and skips the reference
    forward; `kl_kind` says which divergence a positive weight penalizes."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """Which per-token estimator, d = lp_ref - lp, is differentiated as the penalty. The choice sets
    which KL the gradient pulls down (Tang & Munos 2025, arXiv 2506.09477; all on-policy, per token):
    k3 = exp(d) - d - 1 (GRPO's, the default): expected gradient that of KL(ref || pi), the
    mass-covering direction, not KL(pi || ref); still a divergence to the base, zero only at it.
    k2 = d^2 / 2: expected gradient exactly that of KL(pi || ref), the penalty as usually written.
    k1 = -d: zero expected gradient, the penalty does nothing but add noise; for comparison only.
    `kl_mean` in the metrics is the k3 estimate of KL(pi || ref) whichever is chosen."""


class OptimConfig(_Section):
    lr: float = Field(5e-5, gt=0)
    """AdamW learning rate. LoRA wants ~1e-5..1e-4, not full fine-tuning's 1e-6."""
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    """Adam's moment decays, each in [0, 1)."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global grad norm. RL gradients spike when a group's advantages are large."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """Tokens per forward/backward (memory bound); a step accumulates micro-batches into one update."""
    share_prefix: bool = True
    """Run a group's shared prompt once per micro-batch and its completions on top of its KV cache
    (same gradient as separate forwards, a fraction of the tokens). The shared part ends before
    the first sampled token of any member, even when completions begin alike. Falls back to `packing`."""
    packing: bool = True
    """Pack several sequences per row (block-diagonal attention) instead of padding to the longest."""
    on_nonfinite: Literal["skip", "stop"] = "skip"
    """A step whose loss or grad norm is inf or NaN is never applied: the adapter and the optimizer
    state stay as they were. skip: one line says so, the step is logged with `nonfinite_skipped = 1`
    and the run goes on with new rollouts. stop: the run ends (`NonFiniteStep`, a one-line message)
    before the step is logged or checkpointed. skip is the default because the weights stay finite
    either way, and a stopped run resumed would sample the same step again (rollouts are seeded by
    step) and fail the same way; stop suits a run watched closely, where such a step should be
    looked at before going on."""

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError("each beta must be in [0, 1), e.g. (0.9, 0.99)")
        return value


class ValidationConfig(_Section):
    every: int = Field(10, ge=0)
    """Validate every K steps (0 = only before the first and after the last step)."""
    scenarios: int = Field(32, ge=1)
    """Held-out scenarios scored per validation."""
    samples: int = Field(1, ge=1)
    """Rollouts per held-out scenario; more gives a steadier success rate for the same scenarios."""
    temperature: float = Field(0.7, ge=0, le=2)


class LoggingConfig(_Section):
    samples_every: int = Field(1, ge=1)
    """Write all trajectories of every K-th step to samples/."""
    checkpoint_every: int = Field(1, ge=1)
    """Checkpoint every K steps; resume loses at most K-1 steps."""
    keep_checkpoints: int = Field(3, ge=1)
    progress: bool = True


class TaskEntry(_Section):
    """One member of a multi-task run (see `grooves.tasks.mixture`)."""

    task: str
    """A built-in task name, `env:<environment>`, or `package.module:object`."""
    weight: float = Field(1.0, gt=0)
    """Relative share of the training groups; each group's task is drawn with probability weight / sum."""
    options: TaskOptions = {}
    """Passed to this task's constructor."""
    name: str | None = None
    """Name in metrics (`task/<name>/...`); default: the `task` value."""


class RunConfig(_Section):
    name: str = "run"
    output_dir: str = "runs/run"
    """Run folder: config, metrics.jsonl, reward curve, samples, checkpoints, report."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seeds Python, numpy and torch; numpy's seeds are 0 .. 2**32 - 1."""
    steps: int = Field(20, ge=1)
    task: str = "capitals"
    """A built-in task name, or `package.module:object` for your own Task."""
    task_options: TaskOptions = {}
    """Passed to the task's constructor (e.g. a data file)."""
    tasks: list[TaskEntry] | None = None
    """Several tasks interleaved by weight instead of `task`, e.g.
    [{task = "capitals", weight = 0.7}, {task = "env:support_desk", weight = 0.3}]: guards
    against forgetting, at the cost of fewer groups per task per step. Logs task/<name>/... metrics."""
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    rollout: RolloutConfig = RolloutConfig()
    vllm: VllmConfig = VllmConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    validation: ValidationConfig = ValidationConfig()
    logging: LoggingConfig = LoggingConfig()
    watch: WatchConfig = WatchConfig()
    """Reward-hacking detectors and inspection pages (see grooves.watch)."""

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty; name the run folder, e.g. runs/my_run")
        return value

    @model_validator(mode="after")
    def _consistent(self):
        if self.algorithm.loss != "gspo" and self.algorithm.eps_high < self.algorithm.eps_low / 2:
            raise ValueError("algorithm.eps_high is far below eps_low; clip-higher wants eps_high >= eps_low")
        if self.tasks is not None:
            if not self.tasks:
                raise ValueError("tasks is empty; list at least one {task = ..., weight = ...} or use `task`")
            if self.task != RunConfig.model_fields["task"].default or self.task_options:
                raise ValueError("set either `task` (with task_options) or `tasks` (with per-task options), not both")
            names = [t.name or t.task for t in self.tasks]
            if len(set(names)) != len(names):
                raise ValueError(f"tasks: names must be unique, got {names}; give a repeated task a `name`")
        return self


class ConfigError(ValueError):
    """A run file that cannot be used; the message is one line per problem, naming the field."""


def _format(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            lines.append(f"{field}: unknown field; check its spelling and section")
        elif not field:  # a check across fields: its message names them
            lines.append(message)
        else:
            lines.append(f"{field}: {message} (got {err.get('input')!r})")
    return "\n".join(lines)


def check_numbers(raw: Any, value: Any, field: str = "") -> list[str]:
    """Problems with the numbers of a validated config `value` read from `raw` (the parsed TOML),
    one line each naming the field: inf or nan anywhere (TOML writes them `inf`, `nan`), and
    true/false where a number is wanted (pydantic would read them as 1 and 0: `steps = true`).

    Applies to every section, the watch's and task options included, so no float field needs its
    own check."""
    if isinstance(raw, bool) and isinstance(value, int | float) and not isinstance(value, bool):
        return [f"{field}: Input should be a number, not {str(raw).lower()} (got {raw!r})"]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{field}: Input should be a finite number (got {value!r})"]
    prefix = f"{field}." if field else ""
    if isinstance(value, BaseModel):
        raw_of = raw.get if isinstance(raw, dict) else (lambda name: getattr(raw, name, None))
        return [p for name in type(value).model_fields for p in check_numbers(raw_of(name), getattr(value, name), prefix + name)]
    if isinstance(value, dict):
        raw = raw if isinstance(raw, dict) else {}
        return [p for key, v in value.items() for p in check_numbers(raw.get(key), v, f"{prefix}{key}")]
    if isinstance(value, list | tuple):
        raw = raw if isinstance(raw, list | tuple) and len(raw) == len(value) else [None] * len(value)
        return [p for i, (r, v) in enumerate(zip(raw, value, strict=True)) for p in check_numbers(r, v, f"{prefix}{i}")]
    return []


def parse_config(data: dict) -> RunConfig:
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc)) from None
    problems = check_numbers(data, config)
    if problems:
        raise ConfigError("\n".join(problems))
    return config


def load_config(path: str | Path, overrides: dict | None = None) -> RunConfig:
    """Read a run file; `overrides` (nested dict) win over the file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such run file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key, value in (overrides or {}).items():
        _set_nested(data, key.split("."), value)
    return parse_config(data)


def parse_overrides(items: list[str]) -> dict:
    """`--set key=value` options as a dict; values are read as TOML (numbers, booleans, lists), else kept as text."""
    overrides: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set optim.lr=1e-4")
        try:
            overrides[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key] = value
    return overrides


def _set_nested(data: dict, keys: list[str], value) -> None:
    for k in keys[:-1]:
        data = data.setdefault(k, {})
    data[keys[-1]] = value


def dump_config(config: RunConfig) -> str:
    """The resolved config as TOML (all fields, defaults included)."""
    import tomli_w

    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))


def check_against_model(config: RunConfig) -> None:
    """The run-file fields that depend on the model, checked before its weights load.

    From the model's config.json alone (and a weightless copy of the model on the `meta` device):
    `rollout.max_tokens` must leave room for a prompt in the model's context, each name in
    `lora.target_modules` must be a layer of the model (peft ignores a misspelt one when another
    matches), and `model.device` must be one torch sees. Raises `ConfigError`, one line per
    problem. A model whose config cannot be read here (a hub id while offline, remote code) is left
    to the loader, which reports its own error.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from grooves.models import ModelError, resolve_model

    problems = [p for p in [_device_problem(config.model.device), _init_adapter_problem(config)] if p]
    try:
        model_config = AutoConfig.from_pretrained(resolve_model(config.model.base_model))
    except ModelError as exc:
        problems.append(f"model.base_model: {str(exc).splitlines()[0]}")
        model_config = None
    except (OSError, ValueError, KeyError):  # not readable here; the loader says why
        model_config = None
    if model_config is not None:
        context = getattr(model_config.get_text_config(), "max_position_embeddings", None)
        if config.model.backend == "vllm" and config.vllm.max_model_len:
            context = min(context or config.vllm.max_model_len, config.vllm.max_model_len)
        if context is not None and config.rollout.max_tokens >= context:
            problems.append(
                f"rollout.max_tokens: {config.rollout.max_tokens} leaves no room for a prompt in the model's "
                f"context of {context} tokens (max_position_embeddings in its config.json); lower it"
            )
        try:
            with torch.device("meta"):  # shapes only: no memory, no weights read
                skeleton = AutoModelForCausalLM.from_config(model_config)
        except (ValueError, KeyError, TypeError, ImportError):  # an architecture transformers cannot build here
            skeleton = None
        if skeleton is not None:
            names = [n for n, _ in skeleton.named_modules()]
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)})
            for target in config.lora.target_modules:
                if not any(n == target or n.endswith("." + target) for n in names):
                    problems.append(f"lora.target_modules: {target!r} is no layer of this model; its linear layers are {', '.join(linear)}")
    if problems:
        raise ConfigError("\n".join(problems))


def _device_problem(device: str) -> str | None:
    import torch

    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    if kind == "mps":
        count = 1 if torch.backends.mps.is_available() else 0
    else:
        backend = getattr(torch, kind, None)
        count = backend.device_count() if backend is not None and backend.is_available() else 0
    if count == 0:
        return f"model.device: {device!r}, but torch sees no {kind} device here; use cpu or install torch for {kind}"
    if index and int(index) >= count:
        return f"model.device: {device!r}, but torch sees {count} {kind} device(s), numbered from 0"
    return None


def resolve_init_adapter(source: str) -> Path:
    """The adapter folder `model.init_adapter` names: an adapter folder, a checkpoint's `adapter/`,
    or a run folder's latest complete checkpoint. Raises `ConfigError` naming the field."""
    path = Path(source).expanduser()
    if (path / "adapter_config.json").is_file():
        return path
    if (path / "adapter" / "adapter_config.json").is_file():
        return path / "adapter"
    steps = sorted(p for p in (path / "checkpoints").glob("step_*") if p.name[5:].isdigit()) if path.is_dir() else []
    for step in reversed(steps):  # `step_N.tmp` folders (unfinished) never match
        if (step / "adapter" / "adapter_config.json").is_file():
            return step / "adapter"
    what = "no such folder" if not path.exists() else "not an adapter folder, a checkpoint or a run folder with checkpoints"
    raise ConfigError(f"model.init_adapter: {source}: {what}; pass e.g. runs/sft/checkpoints/step_000010")


def _init_adapter_problem(config: RunConfig) -> str | None:
    """One line if `model.init_adapter` cannot start this run: not found, another base model, or
    another LoRA shape than `[lora]`."""
    import json

    from grooves.models import ModelError, resolve_model

    source = config.model.init_adapter
    if source is None:
        return None
    try:
        adapter = resolve_init_adapter(source)
        saved = json.loads((adapter / "adapter_config.json").read_text())
    except ConfigError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"model.init_adapter: {source}: unreadable adapter_config.json ({exc})"
    base, theirs = config.model.base_model, str(saved.get("base_model_name_or_path") or "")
    same = theirs == base
    if not same:
        try:
            ours = resolve_model(base)
        except ModelError:
            ours = base
        same = Path(theirs).expanduser().is_dir() and Path(ours).is_dir() and Path(theirs).expanduser().resolve() == Path(ours).resolve()
    if not same:  # a grooves checkpoint also records the run's model.base_model (its config.toml)
        run_file = adapter.parent / "config.toml"
        try:
            same = run_file.is_file() and tomllib.loads(run_file.read_text()).get("model", {}).get("base_model") == base
        except tomllib.TOMLDecodeError:
            same = False
    if not same:
        return (f"model.init_adapter: {source} was trained on base model {theirs or '(unrecorded)'!r}, not "
                f"{base!r} (model.base_model); start from an adapter of {base!r} or set model.base_model to its base")
    lora = config.lora
    shape = (saved.get("r"), saved.get("lora_alpha"), sorted(saved.get("target_modules") or []))
    if shape != (lora.rank, lora.alpha, sorted(lora.target_modules)):
        return (f"model.init_adapter: {source} has LoRA rank {shape[0]}, alpha {shape[1]} on {', '.join(shape[2])}; "
                f"set [lora] rank = {shape[0]}, alpha = {shape[1]}, target_modules = {shape[2]} to continue it")
    return None
