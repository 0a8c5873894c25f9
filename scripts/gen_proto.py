#!/usr/bin/env python3
"""Regenerate the committed gRPC stubs from proto/deviceplugin/v1beta1/api.proto.

Why committed stubs: the daemon image and `pip install` need no protoc at run
time. Why a script: the stubs must never drift from the .proto; the test
`tests/test_proto_stubs.py` runs this generator into a temporary directory and
fails when the committed files differ.

Usage: python scripts/gen_proto.py [--out DIR]   (default: plugin/api)
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "deviceplugin" / "v1beta1"


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Run grpc_tools.protoc and make the grpc module import its sibling relatively."""
    from grpc_tools import protoc  # imported lazily: only needed when regenerating

    out_dir.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(PROTO_DIR / "api.proto"),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    grpc_file = out_dir / "api_pb2_grpc.py"
    text = grpc_file.read_text()
    # protoc writes `import api_pb2`, which only works with the directory on sys.path.
    text = re.sub(r"^import api_pb2 as api__pb2$", "from . import api_pb2 as api__pb2", text, flags=re.M)
    grpc_file.write_text(text)
    return [out_dir / n for n in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "plugin" / "api")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
