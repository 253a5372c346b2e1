"""What to send over gRPC for a REST request: a body its family reads the same way without a Content-Type.

TorchServe 0.12's gRPC request is a map of named byte strings: the handler sees each with an empty
content type and no request headers. Every family reads a body without a content type as its usual
form (Family.request_content_type): an image family the image bytes, a text family plain UTF-8
text, the others JSON. So a request already in that form goes as it is; a text family's JSON
`{"text": ...}` goes as the text itself, a tensor family's .npy file as JSON `{"inputs": [...]}`.
Anything else has no gRPC form (ValueError).
"""

from __future__ import annotations

import io
import json

JSON = "application/json"
NPY = "application/x-npy"


def _media(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def grpc_body(family: str, body: bytes, content_type: str) -> bytes:
    """`body`, sent with `content_type` over REST, as the bytes a model of `family` answers alike over gRPC."""
    from handlers.families import family_class

    cls = family_class(family)
    media = _media(content_type)
    if media == _media(cls.request_content_type) or cls.input_kind == "bytes":  # image families sniff the bytes
        return bytes(body)
    if cls.input_kind == "text" and media == JSON:
        try:
            text = json.loads(bytes(body).decode("utf-8"))["text"]
        except (ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: nested past Python's limit
            raise ValueError(f"{family}: a JSON body goes over gRPC as its \"text\" alone; this one has none ({err})") from None
        if isinstance(text, str):
            return text.encode("utf-8")
    if cls.input_kind == "tensor" and media == NPY:
        import numpy as np

        try:
            array = np.load(io.BytesIO(bytes(body)), allow_pickle=False)
            return json.dumps({"inputs": array.tolist()}).encode("utf-8")
        except (ValueError, OSError, EOFError, TypeError, MemoryError) as err:  # no JSON form: complex, void, a lying header
            raise ValueError(f"{family}: this .npy has no JSON form to send over gRPC ({err})"[:300]) from None
    raise ValueError(f"{family}: a {content_type or 'type-less'} body has no gRPC form (gRPC carries no Content-Type; "
                     f"send {cls.request_content_type})")
