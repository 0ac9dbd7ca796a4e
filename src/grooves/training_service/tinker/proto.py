"""The protobuf messages the Tinker SDK sends and reads, described here and parsed with `protobuf`.

The SDK sends `forward_backward` (and `forward`) requests as protobuf, and asks for the results
of `forward_backward` and `sample` as protobuf (`Accept: application/x-protobuf`); every other
route is JSON. The schema below is the wire contract those messages follow: field numbers and
types, which is all that protobuf's binary format carries (message and package names do not
travel). It is built into a descriptor pool of its own at import, so it never clashes with the
SDK's own registration of the same messages when both live in one process (the tests).

Only the fields grooves reads or writes are described; protobuf skips the rest of a message it
parses (an image chunk arrives as a chunk with none of its described fields set, and is refused
by the caller as "not token ids").
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_T = descriptor_pb2.FieldDescriptorProto
_TYPES = {
    "bytes": _T.TYPE_BYTES,
    "string": _T.TYPE_STRING,
    "int32": _T.TYPE_INT32,
    "int64": _T.TYPE_INT64,
    "uint32": _T.TYPE_UINT32,
    "double": _T.TYPE_DOUBLE,
    "bool": _T.TYPE_BOOL,
}
PACKAGE = "grooves_tinker"

# message -> [(number, name, type, repeated, oneof)]; a type not in _TYPES is a message or an enum
_MESSAGES: dict[str, list[tuple[int, str, str, bool, str | None]]] = {
    "Tensor": [
        (1, "dense", "bytes", False, "encoding"),
        (2, "sparse_csr", "SparseCsr", False, "encoding"),
        (3, "dtype", "DType", False, None),
        (4, "shape", "int64", True, None),
    ],
    "SparseCsr": [(1, "values", "bytes", False, None)],
    "EncodedTextChunk": [(1, "tokens", "bytes", False, None)],
    "Chunk": [(1, "encoded_text", "EncodedTextChunk", False, "chunk")],
    "TensorEntry": [(1, "key", "string", False, None), (2, "value", "Tensor", False, None)],
    "Datum": [
        (1, "model_input", "Chunk", True, None),
        (2, "loss_fn_inputs", "TensorEntry", True, None),
    ],
    "LossConfigValue": [(1, "number", "double", False, "value"), (2, "text", "string", False, "value")],
    "NumberEntry": [(1, "key", "string", False, None), (2, "value", "double", False, None)],
    "ConfigEntry": [(1, "key", "string", False, None), (2, "value", "LossConfigValue", False, None)],
    "ForwardBackwardRequest": [
        (1, "model_id", "string", False, None),
        (2, "seq_id", "int32", False, None),
        (3, "data", "Datum", True, None),
        (4, "loss_fn", "string", False, None),
        (5, "loss_fn_config", "NumberEntry", True, None),
        (6, "forward_only", "bool", False, None),
        (7, "loss_fn_config_v2", "ConfigEntry", True, None),
    ],
    "BatchedTensor": [
        (1, "data", "bytes", False, None),
        (2, "offsets", "bytes", False, None),
        (3, "dtype", "DType", False, None),
        (4, "trailing_shape", "int64", True, None),
    ],
    "FieldEntry": [(1, "key", "string", False, None), (2, "value", "BatchedTensor", False, None)],
    "ArrayRecord": [
        (1, "type_tag", "string", False, None),
        (2, "fields", "FieldEntry", True, None),
        (3, "num_datums", "int64", False, None),
    ],
    "ForwardBackwardOutput": [
        (1, "loss_fn_output_type", "string", False, None),
        (2, "loss_fn_outputs", "ArrayRecord", True, None),
        (3, "metrics", "NumberEntry", True, None),
    ],
    "SampledSequence": [
        (1, "stop_reason", "StopReason", False, None),
        (2, "tokens", "bytes", False, None),
        (3, "logprobs", "bytes", False, None),
    ],
    "SampleResponse": [
        (1, "sequences", "SampledSequence", True, None),
        (2, "prompt_logprobs", "bytes", False, None),
    ],
}
_ENUMS = {
    "DType": ["DTYPE_UNSPECIFIED", "DTYPE_FLOAT32", "DTYPE_INT64", "DTYPE_INT32", "DTYPE_BFLOAT16"],
    "StopReason": ["STOP_REASON_STOP", "STOP_REASON_LENGTH"],
}
"""Enum values in wire order (value i is number i)."""
DTYPE = {name.removeprefix("DTYPE_").lower(): i for i, name in enumerate(_ENUMS["DType"])}
STOP_REASON = {"stop": 0, "length": 1}


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="grooves_tinker.proto", package=PACKAGE, syntax="proto3")
    for name, values in _ENUMS.items():
        enum = fd.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    for name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=name)
        oneofs: list[str] = []
        for number, field_name, kind, repeated, oneof in fields:
            f = msg.field.add(name=field_name, number=number)
            f.label = _T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL
            if kind in _TYPES:
                f.type = _TYPES[kind]
            else:
                f.type = _T.TYPE_ENUM if kind in _ENUMS else _T.TYPE_MESSAGE
                f.type_name = f".{PACKAGE}.{kind}"
            if oneof is not None:
                if oneof not in oneofs:
                    oneofs.append(oneof)
                    msg.oneof_decl.add(name=oneof)
                f.oneof_index = oneofs.index(oneof)
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def message(name: str):
    """The generated class of message `name` (e.g. `message("ForwardBackwardRequest")()`)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ForwardBackwardRequest = message("ForwardBackwardRequest")
ForwardBackwardOutput = message("ForwardBackwardOutput")
SampleResponse = message("SampleResponse")
