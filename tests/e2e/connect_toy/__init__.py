"""Toy Connect services shaped like Cursor's ``agent.v1.AgentService/Run`` (bidi) and Windsurf's
``exa.api_server_pb.ApiServerService/GetChatMessage`` (server stream), for
``tests/e2e/test_connect_e2e.py``. ``server.py`` serves them (ASGI, run by hypercorn).

The ``*_pb2.py`` and ``*_connect.py`` modules are generated from the ``.proto`` files beside them
(checked in, not edited). To regenerate, from the repository root::

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m grpc_tools.protoc -I tests/e2e/connect_toy \\
        --python_out=tests/e2e/connect_toy --connectrpc_out=tests/e2e/connect_toy \\
        --connectrpc_opt=protobuf=google \\
        tests/e2e/connect_toy/agent_toy.proto tests/e2e/connect_toy/chat_toy.proto

then ``.venv/bin/ruff format tests/e2e/connect_toy`` (``make lint`` checks their format too).
grpcio-tools provides ``grpc_tools.protoc``, protoc-gen-connectrpc the ``--connectrpc_out``
plugin; ``protobuf=google`` makes it import the ``_pb2`` modules.
"""
