"""The header-contract Proxy-Wasm filter: its C sources, its build (`make wasm`), a wasmtime host."""
from pathlib import Path

# What `make wasm` builds; the wheel carries it as package data, so this is its place in either.
HEADER_CONTRACT_WASM = Path(__file__).resolve().parent / "build" / "header_contract.wasm"
