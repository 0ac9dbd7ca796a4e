"""The Tinker API on the training service: the `tinker` SDK and tinker-cookbook loops train here.

`routes.tinker_router` mounts the routes under `/api/v1/` of `grooves serve --train`;
`server.TinkerService` holds sessions, training models and saved weights; `training.TinkerModel`
is one model (forward/backward and optimizer steps on a `HostedModel`); `sampling.Samplers` are the
sampling clients' sessions; `futures` the request ids the SDK polls; `codec` and `proto` the
protobuf messages. The losses are `grooves.core.datum_loss`. See docs/tinker.md.
"""
