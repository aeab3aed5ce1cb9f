"""mitmproxy addon script: ``mitmdump -s addons/llm_audit.py --set observer_db=URL``.

The addon itself is ``observer.capture.hooks.LLMAudit`` (the package must be importable: installed,
or on ``PYTHONPATH``); this file only gives mitmproxy an instance to load.
"""

from observer.capture.hooks import LLMAudit

addons = [LLMAudit()]
