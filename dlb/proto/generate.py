"""Regenerate (or check) the committed protobuf/gRPC code for ``dlb/proto/*.proto``.

``python -m dlb.proto.generate`` rewrites the ``*_pb2.py`` / ``*_pb2_grpc.py`` files;
``python -m dlb.proto.generate --check`` exits 1 when they differ from what protoc produces now.
The proto's import path is the repository root, so the generated gRPC module imports
``dlb.proto.probe_pb2`` (a package-qualified import that works from any working directory).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent.parent
PROTOS = sorted(PROTO_DIR.glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc into ``out_dir`` (mirrors the package layout); return the generated files."""
    import grpc_tools
    from grpc_tools import protoc  # test extra: only needed by developers, not at runtime

    include = str(Path(grpc_tools.__file__).resolve().parent / "_proto")
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}"]
    args += [str(p.relative_to(ROOT)) for p in PROTOS]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / "dlb" / "proto").glob("*_pb2*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if out of date")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stale = []
        for gen in generate(Path(tmp)):
            target = PROTO_DIR / gen.name
            new = gen.read_text()
            if not target.exists() or target.read_text() != new:
                stale.append(target.name)
                if not args.check:
                    target.write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run: python -m dlb.proto.generate)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
