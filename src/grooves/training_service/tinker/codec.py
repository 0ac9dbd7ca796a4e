"""Tinker's protobuf messages to checked Python values and back (`proto` holds the schema).

`read_turn` reads which model and `seq_id` a request is for (its place in the model's order),
and `read_forward_backward` turns the bytes of a `forward_backward` request into a `FwdBwd`: every
datum's input token ids and its loss inputs as numpy arrays, each checked against the loss it is
for (`core.datum_loss`) and the model's vocabulary before anything runs, so a bad request is one
`BadInput` naming the field (`data[2].loss_fn_inputs.advantages: 3 values, but model_input has 4
tokens`) and changes nothing. `forward_backward_output` and `sample_response` write the answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError

from grooves.core.datum_loss import REQUIRED_INPUTS, DatumLossError, loss_config
from grooves.training_service.tinker import proto

_NUMPY = {proto.DTYPE["float32"]: np.float32, proto.DTYPE["int64"]: np.int64}
_TOKEN_INPUTS = ("target_tokens",)


class BadInput(ValueError):
    """A request the SDK sent that cannot be run: the message names the field and the fix."""


@dataclass
class Datum:
    tokens: np.ndarray
    """[N] int64: the input token ids."""
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    """Loss inputs by name, each [N]: int64 `target_tokens`, float32 the rest."""


@dataclass
class FwdBwd:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    data: list[Datum]

    @property
    def num_tokens(self) -> int:
        return sum(len(d.tokens) for d in self.data)


def read_turn(body: bytes) -> tuple[str, int]:
    """The model id and seq_id of the request in `body`: where it goes in its model's order, read
    before the rest of it is checked."""
    msg = _parse(body)
    return msg.model_id, msg.seq_id


def read_forward_backward(body: bytes, *, vocab_size: int | None = None) -> FwdBwd:
    """The request in `body`, checked; `vocab_size` bounds every token id when given."""
    msg = _parse(body)
    if not msg.data:
        raise BadInput("data: empty; send at least one datum")
    config: dict[str, object] = {e.key: e.value for e in msg.loss_fn_config}
    for entry in msg.loss_fn_config_v2:  # the newer field wins, and carries strings
        kind = entry.value.WhichOneof("value")
        config[entry.key] = entry.value.text if kind == "text" else entry.value.number
    try:
        settings = loss_config(msg.loss_fn, config)
    except DatumLossError as exc:
        raise BadInput(str(exc)) from None
    data = [_datum(d, i, msg.loss_fn, vocab_size) for i, d in enumerate(msg.data)]
    return FwdBwd(msg.model_id, msg.seq_id, msg.loss_fn, settings, msg.forward_only, data)


def _parse(body: bytes):
    msg = proto.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise BadInput(f"the body is not a ForwardBackwardRequest protobuf message ({exc})") from None
    if not msg.model_id:
        raise BadInput("model_id: missing; send the model_id that create_model returned")
    return msg


def _datum(msg, index: int, loss_fn: str, vocab_size: int | None) -> Datum:
    where = f"data[{index}]"
    parts = []
    for j, chunk in enumerate(msg.model_input):
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise BadInput(
                f"{where}.model_input[{j}]: only token-id chunks are supported (no images or audio)"
            )
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").astype(np.int64))
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if len(tokens) == 0:
        raise BadInput(f"{where}.model_input: no tokens")
    _check_ids(tokens, f"{where}.model_input", vocab_size)
    inputs = {e.key: _tensor(e.value, f"{where}.loss_fn_inputs.{e.key}") for e in msg.loss_fn_inputs}
    missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in inputs]
    if missing:
        raise BadInput(f"{where}.loss_fn_inputs: {loss_fn!r} needs {', '.join(missing)}")
    extra = sorted(set(inputs) - set(REQUIRED_INPUTS[loss_fn]))
    if extra:
        raise BadInput(
            f"{where}.loss_fn_inputs: {', '.join(extra)} not read by {loss_fn!r} "
            f"(it reads {', '.join(REQUIRED_INPUTS[loss_fn])}); per-token clip thresholds are not supported"
        )
    for key, value in inputs.items():
        name = f"{where}.loss_fn_inputs.{key}"
        if value.shape != tokens.shape:
            raise BadInput(
                f"{name}: shape {list(value.shape)}, but model_input has {len(tokens)} tokens; "
                "every loss input has one value per input position"
            )
        if key in _TOKEN_INPUTS:
            _check_ids(value, name, vocab_size)
        elif not np.isfinite(value).all():
            at = int(np.flatnonzero(~np.isfinite(value))[0])
            raise BadInput(f"{name}[{at}]: {value[at]} is not a finite number")
        elif key == "logprobs" and (value > 1e-4).any():
            at = int(np.flatnonzero(value > 1e-4)[0])
            raise BadInput(f"{name}[{at}]: {value[at]} is not a log-probability (a logprob is <= 0)")
    return Datum(tokens, inputs)


def _tensor(msg, name: str) -> np.ndarray:
    if msg.WhichOneof("encoding") != "dense":
        raise BadInput(f"{name}: only dense tensors are supported (no sparse, no 2-D top-k targets)")
    dtype = _NUMPY.get(msg.dtype)
    if dtype is None:
        raise BadInput(f"{name}: dtype {msg.dtype} is not float32 or int64")
    values = np.frombuffer(msg.dense, dtype=np.dtype(dtype).newbyteorder("<"))
    shape = list(msg.shape) or [len(values)]
    if len(shape) != 1 or shape[0] != len(values):
        raise BadInput(f"{name}: shape {shape} with {len(values)} values; a 1-D tensor is expected")
    if dtype is np.int64 or name.endswith("target_tokens"):
        return values.astype(np.int64)
    return values.astype(np.float32)


def _check_ids(ids: np.ndarray, name: str, vocab_size: int | None) -> None:
    if vocab_size is None or len(ids) == 0:
        return
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if len(bad):
        at = int(bad[0])
        raise BadInput(
            f"{name}[{at}]: {int(ids[at])} is not a token id of this model (its ids are 0..{vocab_size - 1})"
        )


def forward_backward_output(fields: dict[str, list[np.ndarray]], metrics: dict[str, float]) -> bytes:
    """The `ForwardBackwardOutput` message: per datum, each of `fields` (name -> one [N] float32
    array per datum), as one batched record; `metrics` by "name:reduction"."""
    out = proto.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    count = len(next(iter(fields.values()), []))
    record = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=count)
    for key, arrays in fields.items():
        bt = record.fields.add(key=key).value
        flat = [np.asarray(a, dtype="<f4") for a in arrays]
        bt.dtype = proto.DTYPE["float32"]
        bt.data = b"".join(a.tobytes() for a in flat)
        bt.offsets = np.cumsum([0] + [a.nbytes for a in flat]).astype("<i8").tobytes()
    for key, value in metrics.items():
        out.metrics.add(key=key, value=float(value))
    return out.SerializeToString()


def sample_response(
    sequences: list[tuple[list[int], list[float], str]], prompt_logprobs: list[float] | None
) -> bytes:
    """The `SampleResponse` message: per sample its token ids, logprobs and stop reason ("stop" or
    "length"); `prompt_logprobs` (first one NaN: nothing predicts it) when asked."""
    out = proto.SampleResponse()
    for tokens, logprobs, reason in sequences:
        seq = out.sequences.add(stop_reason=proto.STOP_REASON[reason])
        seq.tokens = np.asarray(tokens, dtype="<i4").tobytes()
        seq.logprobs = np.asarray(logprobs, dtype="<f4").tobytes()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype="<f4").tobytes()
    return out.SerializeToString()
