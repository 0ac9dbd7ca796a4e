"""The training service (`grooves serve --train`): trainable models on a shared base, trained by
steps that a user's own loop submits over HTTP (`grooves.remote.TrainableModel`).

`app.create_service_app` builds the app; `core.Service` holds the models and their folder;
`hosted.HostedModel` is one model (the trainer's policy, optimizer and run folder); `routes` are
the training routes; `table` routes chat completions to each tenant's models; `validate` checks a
submitted step against its model; `usage` meters tokens per tenant and model.
"""
