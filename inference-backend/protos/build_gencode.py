"""Regenerate grpc_service_pb2*.py from grpc_service.proto and triton_extensions_pb2.py from
triton_extensions.proto (`make proto`).

Two fix-ups after grpc_tools.protoc:
- the _grpc module's `import grpc_service_pb2` becomes package-relative;
- the messages go into a descriptor pool of their own. tritonclient registers
  the same `inference.*` names in protobuf's default pool, and a client and
  this server (or a test holding both) must live in one process.
"""
from __future__ import annotations

import os
import re
import sys

from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = "grpc_service.proto"
EXTENSIONS = "triton_extensions.proto"     # messages only (no service): served by triton_rpcs.py


def private_pool(pb2: str) -> int:
    with open(pb2) as f:
        text = f.read()
    text, n = re.subn(r"_descriptor_pool\.Default\(\)\.AddSerializedFile\(",
                      "_POOL.AddSerializedFile(", text)
    if n != 1:
        print("generate.py: protoc output changed; cannot move it to a private pool", file=sys.stderr)
        return 1
    text = text.replace("_sym_db = _symbol_database.Default()\n",
                        "_sym_db = _symbol_database.Default()\n"
                        "# Private pool: tritonclient defines the same inference.* names in the default one.\n"
                        "_POOL = _descriptor_pool.DescriptorPool()\n", 1)
    with open(pb2, "w") as f:
        f.write(text)
    return 0


def main() -> int:
    rc = protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"--python_out={HERE}",
                      f"--grpc_python_out={HERE}", os.path.join(HERE, PROTO)])
    rc = rc or protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"--python_out={HERE}", os.path.join(HERE, EXTENSIONS)])
    if rc != 0:
        return rc
    for name in ("grpc_service_pb2.py", "triton_extensions_pb2.py"):
        rc = private_pool(os.path.join(HERE, name))
        if rc:
            return rc
    grpc_mod = os.path.join(HERE, "grpc_service_pb2_grpc.py")
    with open(grpc_mod) as f:
        text = f.read()
    text = re.sub(r"^import grpc_service_pb2 as", "from . import grpc_service_pb2 as", text, flags=re.M)
    with open(grpc_mod, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
