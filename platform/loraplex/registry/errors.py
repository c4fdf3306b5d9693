"""Errors an adapter upload can fail with; each carries the HTTP status and OpenAI error code.

The HTTP layer maps any `AdapterError` to `{"error": {"message", "type", "code"}}` with
`status`; messages name the problem and the fix because the uploader reads them verbatim.
"""

from __future__ import annotations


class AdapterError(Exception):
    status = 422
    code = "invalid_adapter"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadArchive(AdapterError):
    """Not a readable .tar.gz/.tgz/.zip, or an entry we refuse to extract (400)."""

    status = 400
    code = "bad_archive"


class UploadTooLarge(AdapterError):
    """The upload, or what it would decompress to, is over a size bound (413)."""

    status = 413
    code = "upload_too_large"


class InvalidAdapter(AdapterError):
    """The archive unpacked fine but is not a LoRA adapter this base model can serve (422)."""

    status = 422
    code = "invalid_adapter"


class InvalidName(AdapterError):
    status = 400
    code = "invalid_name"


class AdapterNotFound(AdapterError):
    status = 404
    code = "adapter_not_found"
