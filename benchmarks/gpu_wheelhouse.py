"""A wheelhouse for benchmarks/gpu_check.sh on an air-gapped GPU node (GPU_WHEELS=DIR):
onnxruntime-gpu and the serving path's dependencies, at the versions installed here, for
the node's Python. The node's own python3 is expected to bring numpy, onnx, aiohttp,
uvloop, PyYAML, prometheus-client and the CUDA 13 / cuDNN 9 libraries (nvidia-* wheels), as
CUDA images with PyTorch do.

onnxruntime-gpu's wheel is 256 MB, nearly all of it CUDA kernels for seven GPU generations
(sm_75 ... sm_120). `--sm 90` keeps one generation's: the other kernels' bytes in the
provider library's .nv_fatbin section are zeroed (headers kept, so the CUDA runtime still
picks the entry it needs by its header), and the wheel is re-zipped with LZMA, where the
zeros cost nothing: 70 MB for sm_90 (H100/H200). `--split-mb N` cuts it in parts for links
that carry at most N MB at a time, with the sha256 of the whole; `cat` joins them.

    python -m benchmarks.gpu_wheelhouse DIR [--python-version 3.12] [--sm 90] [--split-mb 48]

A pruned wheel runs only on its SM generation (sm_90a / sm_90 kernels run on H100 and H200).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import os
import struct
import subprocess
import sys
import zipfile

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
# The serving path's dependencies a CUDA + PyTorch image lacks, or has at other versions.
PACKAGES = ("protobuf", "grpcio", "grpcio-health-checking", "grpcio-reflection", "opentelemetry-api",
            "opentelemetry-sdk", "opentelemetry-semantic-conventions", "prometheus-client",
            "orjson", "httptools", "hpack")
ORT_GPU = "onnxruntime-gpu"
CUDA_PROVIDER = "libonnxruntime_providers_cuda.so"


def elf_section(data: bytes, name: str) -> tuple[int, int] | None:
    """(file offset, size) of a section of a 64-bit little-endian ELF file, or None."""
    if data[:4] != b"\x7fELF" or len(data) < 0x40 or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):      # sh_name, sh_offset, sh_size
        base = shoff + i * shentsize
        return struct.unpack_from("<I", data, base)[0], *struct.unpack_from("<QQ", data, base + 0x18)
    try:
        _, strtab, _ = header(shstrndx)
        for i in range(shnum):
            sh_name, offset, size = header(i)
            end = data.index(b"\0", strtab + sh_name)
            if data[strtab + sh_name:end] == name.encode():
                if offset + size > len(data):
                    raise ValueError(f"section {name} runs past the end of the file")
                return offset, size
    except (struct.error, ValueError) as e:
        raise ValueError(f"truncated or malformed ELF file: {e}") from None
    return None


def prune_fatbin(data: bytearray, offset: int, size: int, sm: int) -> dict[str, int]:
    """Zero the payload of every fatbin entry a GPU of generation `sm` cannot use: machine
    code (ELF) for another generation, and PTX newer than `sm` (older PTX is JIT-compiled).
    Entry headers stay, so the layout and the runtime's choice among entries are unchanged.
    Returns bytes kept and zeroed."""
    kept = zeroed = 0
    pos, end = offset, offset + size
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:          # containers are 8-byte aligned, padding between them
            pos += 8
            continue
        entry, last = pos + header_size, pos + header_size + fat_size
        while entry < last:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            usable = (kind == KIND_ELF and arch == sm) or (kind == KIND_PTX and arch <= sm)
            start = entry + entry_header
            if start + payload > last or last > end:      # never write outside the section
                raise ValueError(f"fatbin entry at {entry:#x} runs past its container")
            if usable:
                kept += payload
            else:
                data[start:start + payload] = bytes(payload)
                zeroed += payload
            entry = start + payload
        pos = last
    return {"kept": kept, "zeroed": zeroed}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def prune_wheel(src: str, dst: str, sm: int) -> dict[str, int]:
    """onnxruntime-gpu's wheel with its CUDA provider pruned to `sm`, LZMA-zipped (pip reads
    it; RECORD rewritten with the new hashes)."""
    stats: dict[str, int] = {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_LZMA) as zout:
        record, lines = None, []
        for info in zin.infolist():
            if info.filename.endswith(".dist-info/RECORD"):
                record = info.filename
                continue
            data = zin.read(info)
            if info.filename.endswith(CUDA_PROVIDER):
                buf = bytearray(data)
                section = elf_section(buf, ".nv_fatbin")
                if section is None:
                    raise ValueError(f"{src}: {info.filename} has no .nv_fatbin section")
                stats = prune_fatbin(buf, *section, sm)
                data = bytes(buf)
            lines.append(f"{info.filename},{_record_hash(data)},{len(data)}")
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr, out.compress_type = info.external_attr, zipfile.ZIP_LZMA
            zout.writestr(out, data)
        if not stats:
            raise ValueError(f"{src}: no {CUDA_PROVIDER} in the wheel")
        zout.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
    return stats


def download(dest: str, requirements: list[str], python_version: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp",
                    *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                  "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
                      for a in ("--platform", p)],
                    "-d", dest, *requirements], check=True)


def pinned(name: str) -> str:
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the wheelhouse to write (GPU_WHEELS for gpu_check.sh)")
    ap.add_argument("--python-version", default="3.12", help="the GPU node's Python (default 3.12)")
    ap.add_argument("--sm", type=int, default=90, help="keep CUDA kernels for this SM generation only "
                    "(90: H100/H200; 0 keeps the wheel as it is)")
    ap.add_argument("--ort-version", default="1.31.1", help="onnxruntime-gpu version (1.31: CUDA 13, cuDNN 9)")
    ap.add_argument("--split-mb", type=int, default=0, help="cut the onnxruntime-gpu wheel in parts of this size")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    download(args.dir, [pinned(p) for p in PACKAGES], args.python_version)
    raw = os.path.join(args.dir, ".download")
    download(raw, [f"{ORT_GPU}=={args.ort_version}"], args.python_version)
    (name,) = [n for n in os.listdir(raw) if n.endswith(".whl")]
    wheel = os.path.join(args.dir, name)
    if args.sm:
        stats = prune_wheel(os.path.join(raw, name), wheel, args.sm)
        print(f"{name}: kept {stats['kept'] / 1e6:.1f} MB of sm_{args.sm} kernels, zeroed {stats['zeroed'] / 1e6:.1f} MB; "
              f"{os.path.getsize(os.path.join(raw, name)) / 1e6:.0f} -> {os.path.getsize(wheel) / 1e6:.0f} MB")
    else:
        os.replace(os.path.join(raw, name), wheel)
    for n in os.listdir(raw):
        os.unlink(os.path.join(raw, n))
    os.rmdir(raw)
    if args.split_mb:
        with open(wheel, "rb") as fh:
            whole = fh.read()
        step = args.split_mb * 1_000_000
        parts = [f"{wheel}.part{i + 1}" for i in range(0, (len(whole) + step - 1) // step)]
        for i, part in enumerate(parts):
            with open(part, "wb") as fh:
                fh.write(whole[i * step:(i + 1) * step])
        with open(wheel + ".sha256", "w") as fh:
            fh.write(f"{hashlib.sha256(whole).hexdigest()}  {name}\n")
        os.unlink(wheel)
        print(f"cut in {len(parts)} parts; join: cat {name}.part* > {name} && sha256sum -c {name}.sha256")
    print(f"wheelhouse {args.dir}: {len(os.listdir(args.dir))} files, "
          f"{sum(os.path.getsize(os.path.join(args.dir, n)) for n in os.listdir(args.dir)) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
