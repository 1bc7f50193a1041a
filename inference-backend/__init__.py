"""inference-backend"""
