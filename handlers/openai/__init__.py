"""OpenAI's HTTP API over the handlers' families, as pure functions: a request body in, a checked
call out (parse), and the engine's results in, OpenAI's JSON or Server-Sent Events bytes out
(format). Nothing here talks to TorchServe or the model.

    routes.py          TorchServe's url_path header -> which endpoint (404 for others)
    completions.py     /v1/completions and /v1/chat/completions: parse_completion, parse_chat
    responses.py       their answers, whole and streamed (Server-Sent Events)
    chat_template.py   messages -> prompt text, as transformers' apply_chat_template renders it
    embeddings.py      /v1/embeddings
    models.py          /v1/models
    fields.py          which OpenAI fields are honoured, ignored or refused
    bodies.py          the request bodies as pydantic models; their faults as OpenAIError
    errors.py          OpenAIError and OpenAI's error body for any HandlerError
"""
