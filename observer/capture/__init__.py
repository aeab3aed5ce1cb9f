"""The capture path: mitmproxy's hooks (``hooks``) -> request reading (``request``) -> the flow
table and finishing (``flows``) -> the per-flow stream callable (``tap``) and its batcher
(``batcher``) -> the backend that parses (``backend``: in-process, or the worker process through
``link``/``worker``/``messages``, both running ``parsing``) -> the facts -> the record.
"""

from observer.capture.hooks import LLMAudit

__all__ = ["LLMAudit"]
