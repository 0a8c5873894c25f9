#!/usr/bin/env python3
"""Regenerate the committed gRPC stubs from the kubelet API .proto files under proto/.

Why committed stubs: the daemon image and `pip install` need no protoc at run
time. Why a script: the stubs must never drift from the .proto; the test
`tests/test_proto_stubs.py` runs this generator into a temporary directory and
fails when the committed files differ.

Stubs (under plugin/api/):
- `api_pb2*`: the device plugin API (proto/deviceplugin/v1beta1/api.proto);
- `pluginregistration/v1/api_pb2*`: the plugin watcher's Registration service;
- `dra/v1/api_pb2*`, `dra/v1beta1/api_pb2*`: the kubelet's DRA plugin service,
  the newest version Kubernetes 1.37 offers and the previous one;
- `drahealth/v1/api_pb2*`, `drahealth/v1alpha1/api_pb2*`: the kubelet's DRA
  health stream (DRAResourceHealth), 1.37's version and 1.36's;
- `podresources/v1/api_pb2*`: the kubelet's pod-resources API (List);
- `nri/v1alpha1/api_pb2*`: containerd's NRI API (github.com/containerd/nri
  v0.8.0), and `ttrpc/request_pb2*`: ttrpc's envelope messages. Both travel over
  ttrpc, not gRPC (plugin/nri speaks it), so they get message modules only: a
  `*_pb2_grpc.py` would offer a transport that cannot reach the runtime.

The DRA and registration files are compiled with their path under proto/ as
the .proto file name (`dra/v1/api.proto`), so the `api.proto` files of
the same name do not collide in protobuf's default descriptor pool.

Usage: python scripts/gen_proto.py [--out DIR]   (default: plugin/api)
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_DIR = PROTO_ROOT / "deviceplugin" / "v1beta1"
#: Kubelet APIs compiled with their path under proto/ (and generated into the same sub-directory).
NESTED_PROTOS = ("pluginregistration/v1/api.proto", "dra/v1/api.proto", "dra/v1beta1/api.proto",
                 "drahealth/v1/api.proto", "drahealth/v1alpha1/api.proto", "podresources/v1/api.proto")
#: Protos spoken over ttrpc (plugin/nri): message modules only, no gRPC stubs.
TTRPC_PROTOS = ("nri/v1alpha1/api.proto", "ttrpc/request.proto")
_INIT_TEXT = '"""Generated stubs; regenerate with scripts/gen_proto.py."""\n'


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # imported lazily: only needed when regenerating

    rc = protoc.main(["protoc", *args])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def _relative_import(grpc_file: pathlib.Path, module: str, alias: str) -> None:
    """protoc writes `import X` / `from pkg import X`, which only works with its directory on sys.path."""
    text = grpc_file.read_text()
    text = re.sub(rf"^(import|from \S+ import) {module} as {alias}$", f"from . import {module} as {alias}",
                  text, flags=re.M)
    grpc_file.write_text(text)


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Run grpc_tools.protoc and make the grpc modules import their siblings relatively."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _protoc([f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
             f"--grpc_python_out={out_dir}", str(PROTO_DIR / "api.proto")])
    _relative_import(out_dir / "api_pb2_grpc.py", "api_pb2", "api__pb2")
    paths = [out_dir / n for n in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")]
    for rel in NESTED_PROTOS:
        _protoc([f"-I{PROTO_ROOT}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                 f"--grpc_python_out={out_dir}", str(PROTO_ROOT / rel)])
        sub = out_dir / pathlib.Path(rel).parent
        # protoc names the module after the file's path: dra/v1/api.proto -> dra_dot_v1_dot_api__pb2.
        _relative_import(sub / "api_pb2_grpc.py", "api_pb2", rel.removesuffix(".proto").replace("/", "_dot_") + "__pb2")
        # Packages for the sub-directories, so `plugin.api.dra.v1` imports.
        for pkg in (sub, sub.parent):
            (pkg / "__init__.py").write_text(_INIT_TEXT)
            paths.append(pkg / "__init__.py")
        paths += [sub / n for n in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")]
    # ttrpc's Status carries google.protobuf.Any details: the well-known types ship with grpc_tools.
    import grpc_tools

    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    for rel in TTRPC_PROTOS:
        _protoc([f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                 str(PROTO_ROOT / rel)])
        sub = out_dir / pathlib.Path(rel).parent
        stem = pathlib.Path(rel).stem
        for pkg in {sub, sub.parent} - {out_dir}:
            (pkg / "__init__.py").write_text(_INIT_TEXT)
            paths.append(pkg / "__init__.py")
        paths += [sub / f"{stem}_pb2.py", sub / f"{stem}_pb2.pyi"]
    return sorted(set(paths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "plugin" / "api")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
