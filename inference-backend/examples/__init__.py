"""Example Triton model repositories (their config.pbtxt files) and the script that builds
their ONNX graphs (build_repository.py)."""
