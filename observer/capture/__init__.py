"""The capture path: mitmproxy's hooks (``hooks``: the addon, ``LLMAudit``) -> request reading
(``request``) -> the flow table and finishing (``flows``) -> the per-flow stream callable
(``tap``) and its batcher (``batcher``) -> the backend that parses (``backend``: in-process, or
the worker process through ``link``/``worker``/``messages``, both running ``parsing``) -> the
facts -> the record.

Nothing is imported here: ``python -m observer.capture.worker`` runs this package's
``__init__`` first, and the worker must reach its own first statements (signal set-up,
parent-death signal) before any slow import.
"""
