"""llm-stream-observer: passive observer and compliance logger for LLM inference streams."""

__version__ = "0.1.0"
