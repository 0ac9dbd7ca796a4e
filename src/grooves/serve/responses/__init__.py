"""OpenAI's Responses API, `POST /v1/responses`, over the request pipeline the chat route uses.

`routes.responses_router` is the route (what a request is answered with, and how an answered turn
is kept for `previous_response_id`); `fields` is the compatibility table of the request's top-level
fields, `request.ResponsesRequest` the request as the server checks it, `input.as_chat_request` the
request read as the chat request the pipeline prepares, `turn.Turn` one answered request as output
items and a `response` object, and `stream.stream_response` the answer as Responses events.
"""
