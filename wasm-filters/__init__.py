"""wasm-filters"""
